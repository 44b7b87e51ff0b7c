/* Benchmark memory and the copy bandwidth: see bulk.h. */
#include "harness/bulk.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "harness/message.h"
#include "harness/tensor.h"
#include "harness/timing.h"

#define RANDOM_BLOCK ((size_t)1 << 24) /* values drawn on the host, then repeated */

int fgh_bulk_alloc(const fgh_device *d, CUdeviceptr *p, size_t bytes) {
    *p = 0;
    char what[64];
    snprintf(what, sizeof what, "cuMemAlloc of %.2f GiB", (double)bytes / (1u << 30));
    if (fgh_cu(d, d->cu->cuMemAlloc(p, bytes ? bytes : 16), what)) return 1;
    *p = 0;
    return 0;
}

void fgh_bulk_free(const fgh_device *d, CUdeviceptr *p) {
    if (*p) d->cu->cuMemFree(*p);
    *p = 0;
}

int fgh_bulk_random(const fgh_device *d, CUdeviceptr p, size_t n, fg_dtype dt, fgh_rng *r) {
    size_t block = n < RANDOM_BLOCK ? n : RANDOM_BLOCK;
    uint16_t *host = malloc((block ? block : 1) * sizeof *host);
    if (!host) return fgh_fail("out of host memory (%zu values)", block);
    for (size_t i = 0; i < block; i++) host[i] = fgh_to_storage(fgh_rng_uniform(r), dt);
    int ok = 1;
    for (size_t at = 0; ok && at < n; at += block) {
        size_t count = n - at < block ? n - at : block;
        ok = fgh_cu(d, d->cu->cuMemcpyHtoD(p + at * sizeof *host, host, count * sizeof *host), "upload");
    }
    free(host);
    return ok;
}

int fgh_bulk_ints(const fgh_device *d, CUdeviceptr *p, const int *x, size_t n) {
    if (!fgh_bulk_alloc(d, p, n * sizeof(int32_t))) return 0;
    return n == 0 || fgh_cu(d, d->cu->cuMemcpyHtoD(*p, x, n * sizeof(int32_t)), "upload");
}

/* ---- the copy ---- */

#define COPY_REPEATS 5

typedef struct copy_call {
    const fgh_device *d;
    CUdeviceptr src, dst;
    size_t bytes;
} copy_call;

static int copy_once(void *user) {
    const copy_call *c = user;
    return c->d->cu->cuMemcpyDtoD(c->dst, c->src, c->bytes) == CUDA_SUCCESS;
}

int fgh_copy_bandwidth(const fgh_device *d, size_t bytes, double *bytes_per_s) {
    copy_call c = {d, 0, 0, bytes};
    int ok = fgh_bulk_alloc(d, &c.src, bytes) && fgh_bulk_alloc(d, &c.dst, bytes) &&
             fgh_cu(d, d->cu->cuMemsetD8(c.src, 0x3c, bytes), "cuMemsetD8");
    double ms = ok ? fgh_time_calls(d, copy_once, &c, COPY_REPEATS) : -1;
    if (ok && ms <= 0) ok = fgh_fail("cuMemcpyDtoD failed");
    if (ok) *bytes_per_s = 2.0 * (double)bytes / (ms * 1e-3);
    fgh_bulk_free(d, &c.src);
    fgh_bulk_free(d, &c.dst);
    return ok;
}
