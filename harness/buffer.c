/* Device memory between poisoned zones: see buffer.h. */
#include "harness/buffer.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness/message.h"

size_t fgh_buffer_elems(const fgh_buffer *b) { return b->lead + b->count + b->guard; }

static size_t buffer_bytes(const fgh_buffer *b) { return fgh_buffer_elems(b) * b->elem_bytes; }

void *fgh_buffer_at(const fgh_buffer *b, size_t i) { return b->host + i * b->elem_bytes; }

int fgh_buffer_alloc(const fgh_device *d, fgh_buffer *b, size_t elem_bytes, size_t lead,
                     size_t count, size_t guard) {
    memset(b, 0, sizeof *b);
    b->elem_bytes = elem_bytes;
    b->lead = lead, b->count = count, b->guard = guard;
    size_t bytes = buffer_bytes(b);
    /* never 0 bytes: an empty tensor is the library's to refuse, not cuMemAlloc's */
    b->host = malloc(bytes ? bytes : 1);
    if (!b->host) return fgh_fail("out of host memory (%zu bytes)", bytes);
    if (!fgh_cu(d, d->cu->cuMemAlloc(&b->base, bytes ? bytes : 16), "cuMemAlloc")) {
        b->base = 0;
        return 0;
    }
    b->data = b->base + lead * elem_bytes;
    return fgh_buffer_poison(d, b);
}

void fgh_buffer_free(const fgh_device *d, fgh_buffer *b) {
    if (b->base) d->cu->cuMemFree(b->base);
    free(b->host);
    memset(b, 0, sizeof *b);
}

int fgh_buffer_poison(const fgh_device *d, fgh_buffer *b) {
    size_t bytes = buffer_bytes(b);
    memset(b->host, FGH_POISON, bytes);
    return bytes == 0 || fgh_cu(d, d->cu->cuMemsetD8(b->base, FGH_POISON, bytes), "poison");
}

int fgh_buffer_ints(const fgh_device *d, fgh_buffer *b, const int *x, int n, size_t lead,
                    size_t guard) {
    if (!fgh_buffer_alloc(d, b, sizeof(int32_t), lead, (size_t)n, guard)) return 0;
    memcpy(fgh_buffer_at(b, lead), x, (size_t)n * sizeof(int32_t));
    return fgh_buffer_push(d, b);
}

int fgh_buffer_push(const fgh_device *d, const fgh_buffer *b) {
    return fgh_cu(d, d->cu->cuMemcpyHtoD(b->base, b->host, buffer_bytes(b)), "upload");
}

int fgh_buffer_pull(const fgh_device *d, fgh_buffer *b) {
    return fgh_buffer_pull_range(d, b, 0, fgh_buffer_elems(b));
}

int fgh_buffer_pull_range(const fgh_device *d, fgh_buffer *b, size_t from, size_t to) {
    size_t at = from * b->elem_bytes, bytes = (to - from) * b->elem_bytes;
    return fgh_cu(d, d->cu->cuMemcpyDtoH(b->host + at, b->base + at, bytes), "download");
}

static int poisoned(const unsigned char *e, size_t bytes) {
    for (size_t k = 0; k < bytes; k++)
        if (e[k] != FGH_POISON) return 0;
    return 1;
}

size_t fgh_buffer_unpoisoned(const fgh_buffer *b, size_t from, size_t to, size_t *first) {
    size_t n = 0;
    for (size_t i = from; i < to; i++)
        if (!poisoned(fgh_buffer_at(b, i), b->elem_bytes) && n++ == 0) *first = i;
    return n;
}

size_t fgh_buffer_zones_unpoisoned(const fgh_buffer *b, int whole) {
    size_t first, end = fgh_buffer_elems(b);
    if (whole) return fgh_buffer_unpoisoned(b, 0, end, &first);
    return fgh_buffer_unpoisoned(b, 0, b->lead, &first) +
           fgh_buffer_unpoisoned(b, b->lead + b->count, end, &first);
}

int fgh_buffer_changed(const fgh_device *d, const fgh_buffer *b, size_t *changed, size_t *first) {
    size_t bytes = buffer_bytes(b);
    unsigned char *now = malloc(bytes ? bytes : 1);
    if (!now) return fgh_fail("out of host memory (%zu bytes)", bytes);
    int ok = fgh_cu(d, d->cu->cuMemcpyDtoH(now, b->base, bytes), "download");
    *changed = 0;
    for (size_t i = 0; ok && i < fgh_buffer_elems(b); i++)
        if (memcmp(now + i * b->elem_bytes, fgh_buffer_at(b, i), b->elem_bytes) != 0 &&
            (*changed)++ == 0)
            *first = i;
    free(now);
    return ok;
}
