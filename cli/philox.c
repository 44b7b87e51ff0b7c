/* flashgen bench --philox, the device part: time the MMAs of the forward's
 * key tiles alone, its Philox calls alone, and both in the same warps
 * (templates/kernel_bench_philox.lua), one block of 8 warps per SM as the
 * forward runs at d=64. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "runtime/tools.h"

#define PHILOX_THREADS 256
#define PHILOX_CALLS_PER_ROUND 4 /* per thread, as in the template */
#define PHILOX_LAUNCHES 5

/* Mean ms of PHILOX_LAUNCHES launches after one warm-up, or -1. */
static double time_kernel(const cuda_driver *cu, CUfunction f, int blocks, void **params) {
    CUevent e0, e1;
    float ms = -1.f;
    if (cu->cuEventCreate(&e0, 0) || cu->cuEventCreate(&e1, 0)) return -1;
    if (cu->cuLaunchKernel(f, (unsigned)blocks, 1, 1, PHILOX_THREADS, 1, 1, 0, NULL, params,
                           NULL) == CUDA_SUCCESS) {
        cu->cuEventRecord(e0, NULL);
        for (int i = 0; i < PHILOX_LAUNCHES; i++)
            cu->cuLaunchKernel(f, (unsigned)blocks, 1, 1, PHILOX_THREADS, 1, 1, 0, NULL, params,
                               NULL);
        cu->cuEventRecord(e1, NULL);
        if (cu->cuEventSynchronize(e1) || cu->cuEventElapsedTime(&ms, e0, e1)) ms = -1.f;
    }
    cu->cuEventDestroy(e0), cu->cuEventDestroy(e1);
    return ms < 0 ? -1 : ms / PHILOX_LAUNCHES;
}

int philox_overlap_measure(const cuda_driver *cu, CUdevice dev, int head_dim, philox_overlap *out,
                           char *err, size_t err_len) {
    int major = 0, minor = 0, sms = 0, khz = 0;
    cu->cuDeviceGetAttribute(&khz, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, dev);
    cu->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
    cu->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
    cu->cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
    void *cubin = NULL;
    size_t cubin_len = 0;
    if (tools_philox_bench_cubin(major * 10 + minor, head_dim, &cubin, &cubin_len, err, err_len) != 0)
        return -1;

    CUmodule module;
    CUdeviceptr sink = 0;
    if (cu->cuModuleLoadData(&module, cubin) != CUDA_SUCCESS) {
        free(cubin);
        snprintf(err, err_len, "cannot load the Philox benchmark module");
        return -1;
    }
    free(cubin);
    CUfunction f[3];
    static const char *const names[3] = {"fg_philox_mma", "fg_philox_rng", "fg_philox_both"};
    uint32_t keys[20];
    for (int i = 0; i < 20; i++) keys[i] = 0x9E3779B9u * (uint32_t)(i + 1);
    /* about a millisecond for the MMAs alone on an H100 at d=64 */
    int rounds = 64000 / head_dim;
    void *params[] = {keys, &sink, &rounds};
    double ms[3] = {-1, -1, -1};
    int rc = cu->cuMemAlloc(&sink, PHILOX_THREADS * sizeof(float)) == CUDA_SUCCESS ? 0 : -1;
    for (int i = 0; i < 3 && rc == 0; i++) {
        if (cu->cuModuleGetFunction(&f[i], module, names[i]) != CUDA_SUCCESS ||
            (ms[i] = time_kernel(cu, f[i], sms, params)) < 0)
            rc = -1;
    }
    if (rc != 0) snprintf(err, err_len, "the Philox benchmark kernels failed to run");
    if (sink) cu->cuMemFree(sink);
    cu->cuModuleUnload(module);
    if (rc != 0) return -1;
    out->mma_ms = ms[0], out->rng_ms = ms[1], out->both_ms = ms[2];
    out->calls_per_ms = (double)sms * PHILOX_THREADS * rounds * PHILOX_CALLS_PER_ROUND / ms[1];
    out->calls_per_clock_sm = out->calls_per_ms / ((double)khz * sms);
    return 0;
}
