/* Device tensors: see tensor.h. */
#include "harness/tensor.h"

#include <math.h>
#include <string.h>

#include "reference/reference.h"

uint16_t fgh_to_storage(float x, fg_dtype dt) {
    return dt == FG_BF16 ? ref_float_to_bf16(x) : ref_float_to_half(x);
}

float fgh_from_storage(uint16_t x, fg_dtype dt) {
    return dt == FG_BF16 ? ref_bf16_to_float(x) : ref_half_to_float(x);
}

fg_tensor fgh_strides(int order, int pad, int seq, int heads, int dim) {
    if (pad == 0) return order == FGH_BSHD ? fg_tensor_bshd(NULL, seq, heads, dim)
                                           : fg_tensor_bhsd(NULL, seq, heads, dim);
    fg_tensor t = {NULL, 0, 0, 0, 1};
    if (order == FGH_BSHD) {
        t.stride_seq = (int64_t)heads * dim + pad;
        t.stride_head = dim;
        t.stride_batch = t.stride_seq * seq;
    } else {
        t.stride_seq = dim + pad;
        t.stride_head = t.stride_seq * seq;
        t.stride_batch = t.stride_head * heads;
    }
    return t;
}

size_t fgh_tensor_index(const fgh_tensor *x, int b, int s, int h, int d) {
    return (size_t)((int64_t)x->mem.lead + b * x->t.stride_batch + s * x->t.stride_seq +
                    h * x->t.stride_head + d);
}

int fgh_tensor_alloc(const fgh_device *d, fgh_tensor *x, const fgh_placement *pl, int batch,
                     int seq, int heads, int dim) {
    memset(x, 0, sizeof *x);
    x->t = fgh_strides(pl->order, pl->pad, seq, heads, dim);
    x->batch = batch, x->seq = seq, x->heads = heads, x->dim = dim;
    /* the extent: one past the last element, from the first */
    size_t extent = 0;
    if (batch > 0 && seq > 0 && heads > 0 && dim > 0)
        extent = fgh_tensor_index(x, batch - 1, seq - 1, heads - 1, dim - 1) + 1;
    int ok = fgh_buffer_alloc(d, &x->mem, sizeof(uint16_t), (size_t)pl->lead, extent,
                              (size_t)pl->guard);
    x->t.data = (void *)(uintptr_t)x->mem.data;
    return ok;
}

void fgh_tensor_free(const fgh_device *d, fgh_tensor *x) {
    fgh_buffer_free(d, &x->mem);
    memset(x, 0, sizeof *x);
}

/* The mirror's elements of row (b, h, s). */
static uint16_t *row_at(const fgh_tensor *x, int b, int h, int s) {
    return fgh_buffer_at(&x->mem, fgh_tensor_index(x, b, s, h, 0));
}

int fgh_tensor_upload(const fgh_device *d, fgh_tensor *x, const float *src, fg_dtype dt) {
    for (int b = 0; b < x->batch; b++)
        for (int h = 0; h < x->heads; h++)
            for (int s = 0; s < x->seq; s++, src += x->dim) {
                uint16_t *row = row_at(x, b, h, s);
                for (int e = 0; e < x->dim; e++) row[e] = fgh_to_storage(src[e], dt);
            }
    return fgh_buffer_push(d, &x->mem);
}

int fgh_tensor_take(const fgh_device *d, fgh_tensor *x, double *dst, fg_dtype dt, fgh_written *w) {
    memset(w, 0, sizeof *w);
    if (!fgh_buffer_pull(d, &x->mem)) return 0;
    size_t n = 0;
    for (int b = 0; b < x->batch; b++)
        for (int h = 0; h < x->heads; h++)
            for (int s = 0; s < x->seq; s++) {
                uint16_t *row = row_at(x, b, h, s);
                for (int e = 0; e < x->dim; e++, n++) {
                    dst[n] = fgh_from_storage(row[e], dt);
                    if (!isfinite(dst[n]) && w->nonfinite++ == 0) w->first_nonfinite = n;
                }
                /* poisoned again: what is left must be untouched */
                memset(row, FGH_POISON, (size_t)x->dim * sizeof *row);
            }
    size_t first = 0;
    w->stray = fgh_buffer_unpoisoned(&x->mem, 0, fgh_buffer_elems(&x->mem), &first);
    w->first_stray = (long long)first - (long long)x->mem.lead;
    return 1;
}
