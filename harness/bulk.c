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

static const char *copy_source =
    "struct __attribute__((aligned(16))) chunk { unsigned int w[4]; };\n"
    "extern \"C\" __global__ void fgh_copy(const chunk *__restrict__ src, chunk *__restrict__ dst,\n"
    "                                      unsigned long long n) {\n"
    "    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;\n"
    "    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "         i < n; i += stride)\n"
    "        dst[i] = src[i];\n"
    "}\n";

#define COPY_THREADS 512
#define COPY_REPEATS 5

typedef struct copy_launch {
    const fgh_device *d;
    CUfunction f;
    unsigned blocks;
    void **params;
} copy_launch;

static int launch_copy(void *user) {
    const copy_launch *c = user;
    return c->d->cu->cuLaunchKernel(c->f, c->blocks, 1, 1, COPY_THREADS, 1, 1, 0, NULL, c->params,
                                    NULL) == CUDA_SUCCESS;
}

/* The copy kernel of the device's arch, loaded into *module. */
static int copy_kernel(const fgh_device *d, CUmodule *module, CUfunction *f) {
    int major = 0, minor = 0;
    d->cu->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d->device);
    d->cu->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d->device);
    char target[16], err[512];
    snprintf(target, sizeof target, "sm_%d%d", major, minor);
    void *cubin = NULL;
    size_t len = 0;
    char *log = NULL;
    int rc = nvrtc_compile_cubin(copy_source, "fgh_copy.cu", target, NULL, 0, &cubin, &len, &log,
                                 NULL, err, sizeof err);
    free(log);
    if (rc != 0) return fgh_fail("the copy kernel: %s", err);
    int ok = fgh_cu(d, d->cu->cuModuleLoadData(module, cubin), "the copy kernel");
    free(cubin);
    if (ok && !fgh_cu(d, d->cu->cuModuleGetFunction(f, *module, "fgh_copy"), "the copy kernel")) {
        d->cu->cuModuleUnload(*module);
        ok = 0;
    }
    return ok;
}

int fgh_copy_bandwidth(const fgh_device *d, size_t bytes, double *bytes_per_s) {
    CUmodule module;
    CUfunction f;
    if (!copy_kernel(d, &module, &f)) return 0;
    int sms = 0;
    d->cu->cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d->device);
    CUdeviceptr src = 0, dst = 0;
    unsigned long long chunks = bytes / 16;
    void *params[] = {&src, &dst, &chunks};
    copy_launch c = {d, f, (unsigned)(sms > 0 ? sms : 1) * 4, params}; /* 4 blocks of 512 per SM */
    int ok = fgh_bulk_alloc(d, &src, chunks * 16) && fgh_bulk_alloc(d, &dst, chunks * 16) &&
             fgh_cu(d, d->cu->cuMemsetD8(src, 0x3c, chunks * 16), "cuMemsetD8");
    double ms = ok ? fgh_time_calls(d, launch_copy, &c, COPY_REPEATS) : -1;
    if (ok && ms <= 0) ok = fgh_fail("the copy kernel failed to run");
    if (ok) *bytes_per_s = 2.0 * (double)(chunks * 16) / (ms * 1e-3);
    fgh_bulk_free(d, &src);
    fgh_bulk_free(d, &dst);
    d->cu->cuModuleUnload(module);
    return ok;
}
