/* NVRTC compiles of generated kernels, each reported to the compile log. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "runtime/runtime.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

fg_status compile_cubin(fg_context *ctx, fg_kernel *k, const generated *g, void **cubin,
                        size_t *cubin_len) {
    char err[8192], target[16];
    target_name(&k->target, target, sizeof target);
    char *log = NULL;
    nvrtc_resources res;
    double t0 = now_ms();
    int rc = nvrtc_compile_cubin(g->source, g->kernel_name, target, NULL, 0, cubin, cubin_len,
                                 &log, &res, err, sizeof err);
    if (rc != 0) {
        fg_status st = fg_fail(ctx, FG_ERR_COMPILE, "%s\n%s", err, log ? log : "");
        free(log);
        return st;
    }
    free(log);
    k->info.compile_ms = now_ms() - t0;
    k->info.registers = res.registers;
    k->info.spill_bytes = res.spill_stores + res.spill_loads;
    k->info.stack_bytes = res.stack_bytes;
    k->info.smem_static = res.smem_static;
    k->info.from_cache = 0;
    if (ctx->compile_log) {
        char line[512];
        snprintf(line, sizeof line,
                 "flashgen: compiled %s for %s in %.0f ms (%d registers, %d bytes spilled)",
                 g->kernel_name, target, k->info.compile_ms, k->info.registers,
                 k->info.spill_bytes);
        ctx->compile_log(line, ctx->compile_log_user);
    }
    return FG_OK;
}
