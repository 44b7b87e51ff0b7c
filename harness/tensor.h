/* 16-bit tensors on the device in (B,S,H,D) or (B,H,S,D) order, optionally
 * with gaps after each row, inside a poisoned buffer (buffer.h); values move
 * in and out as (B,H,S,D) contiguous host arrays. */
#ifndef FG_HARNESS_TENSOR_H
#define FG_HARNESS_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "flashgen.h"
#include "harness/buffer.h"

enum { FGH_BSHD = 0, FGH_BHSD = 1 };

/* How a problem's tensors lie in device memory. */
typedef struct fgh_placement {
    int order;       /* FGH_BSHD or FGH_BHSD */
    int pad;         /* extra elements after each row: strides with gaps (0: dense) */
    int lead, guard; /* poisoned elements before and after each tensor (0: none) */
} fgh_placement;

typedef struct fgh_tensor {
    fg_tensor t;  /* as the kernel sees it: t.data is mem.data */
    int batch, seq, heads, dim;
    fgh_buffer mem;
} fgh_tensor;

/* What taking an output found. */
typedef struct fgh_written {
    size_t nonfinite;       /* elements not finite, or never written (still NaN) */
    size_t first_nonfinite; /* (B,H,S,D) index of the first */
    size_t stray;           /* elements outside the tensor that lost the poison */
    long long first_stray;  /* offset of the first from the tensor's start */
} fgh_written;

/* fp16 / bf16 storage, round to nearest even. */
uint16_t fgh_to_storage(float x, fg_dtype dt);
float fgh_from_storage(uint16_t x, fg_dtype dt);

/* Strides of a tensor in `order` with `pad` extra elements after each row;
 * data NULL. */
fg_tensor fgh_strides(int order, int pad, int seq, int heads, int dim);
/* Element (b, s, h, d) in the buffer, lead included. */
size_t fgh_tensor_index(const fgh_tensor *x, int b, int s, int h, int d);

/* Allocates the tensor, poisoned; 1, or 0 with the message (free it then too). */
int fgh_tensor_alloc(const fgh_device *d, fgh_tensor *x, const fgh_placement *pl, int batch,
                     int seq, int heads, int dim);
void fgh_tensor_free(const fgh_device *d, fgh_tensor *x);
/* Stores src (B,H,S,D) contiguous into the mirror and uploads the whole
 * buffer: gaps, lead and guard stay poison. */
int fgh_tensor_upload(const fgh_device *d, fgh_tensor *x, const float *src, fg_dtype dt);
/* Downloads an output into dst (B,H,S,D) and counts, in *w, its elements
 * that are not finite and the elements around it that are not poison any
 * more. Leaves the mirror all poison where nothing strayed. */
int fgh_tensor_take(const fgh_device *d, fgh_tensor *x, double *dst, fg_dtype dt, fgh_written *w);

#endif
