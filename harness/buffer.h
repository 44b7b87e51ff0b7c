/* Device memory between poisoned zones: `lead` elements before the data and
 * `guard` after it. Everything starts as poison (0xFF bytes: NaN in fp16,
 * bf16 and fp32), on the device and in a host mirror of the whole
 * allocation, so that a kernel writing outside its data, or leaving some of
 * it unwritten, shows. */
#ifndef FG_HARNESS_BUFFER_H
#define FG_HARNESS_BUFFER_H

#include <stddef.h>

#include "harness/device.h"

#define FGH_POISON 0xFF

typedef struct fgh_buffer {
    CUdeviceptr base;          /* the allocation: lead, data, guard */
    CUdeviceptr data;          /* base + lead elements */
    size_t elem_bytes;
    size_t lead, count, guard; /* elements */
    unsigned char *host;       /* mirror of the whole allocation */
} fgh_buffer;

/* Elements of the whole allocation, zones included. */
size_t fgh_buffer_elems(const fgh_buffer *b);
/* Element i of the mirror (the lead counts: the data starts at b->lead). */
void *fgh_buffer_at(const fgh_buffer *b, size_t i);

/* Allocates and poisons it; 1, or 0 with the message. */
int fgh_buffer_alloc(const fgh_device *d, fgh_buffer *b, size_t elem_bytes, size_t lead,
                     size_t count, size_t guard);
void fgh_buffer_free(const fgh_device *d, fgh_buffer *b);
/* Poisons the whole allocation and the mirror. */
int fgh_buffer_poison(const fgh_device *d, fgh_buffer *b);
/* The mirror to the device, and the device to the mirror (whole allocation). */
int fgh_buffer_push(const fgh_device *d, const fgh_buffer *b);
int fgh_buffer_pull(const fgh_device *d, fgh_buffer *b);
/* The device's elements [from, to) to the mirror. */
int fgh_buffer_pull_range(const fgh_device *d, fgh_buffer *b, size_t from, size_t to);

/* A buffer of the n int32 values x between `lead` and `guard` poisoned
 * elements, uploaded: an argument array (cu_seqlens, a block table). */
int fgh_buffer_ints(const fgh_device *d, fgh_buffer *b, const int *x, int n, size_t lead,
                    size_t guard);

/* Elements in [from, to) of the mirror that are not all poison; *first: the
 * first of them (unchanged when none). */
size_t fgh_buffer_unpoisoned(const fgh_buffer *b, size_t from, size_t to, size_t *first);
/* Elements of the lead and guard zones (of everything, when whole) that are
 * not all poison in the mirror. */
size_t fgh_buffer_zones_unpoisoned(const fgh_buffer *b, int whole);
/* Counts the elements of the device allocation that differ from the mirror
 * (an input, or an output pulled before, that nothing may write); *first:
 * the first. 1, or 0 with the message when it could not be read. */
int fgh_buffer_changed(const fgh_device *d, const fgh_buffer *b, size_t *changed, size_t *first);

#endif
