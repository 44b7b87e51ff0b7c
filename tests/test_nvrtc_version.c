/* The generated kernels compile with a given NVRTC, offline: a
 * representative set (forward and backward; fp16 and bf16; head dims 64,
 * 72, 128, 256; causal, window, dropout, block-sparse) for t4, a100 and
 * h100, each with zero spills and shared memory within the target's limit.
 * ctest runs it with NVRTC 12 from NVIDIA's pip wheel (.ci/setup installs
 * it in .nvrtc12); it is skipped when that file is absent.
 *
 *   test_nvrtc_version /path/libnvrtc.so.12 12
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "flashgen.h"
#include "gen/profile.h"
#include "runtime/cuda_libs.h"
#include "tests/check.h"
#include "tests/workers.h"

typedef struct version_spec {
    fg_dtype dtype; /* fp16 stands in for bf16 on t4, which has none */
    int head_dim;
    fg_mask mask;
    int dropout;
    fg_sparsity sparsity;
} version_spec;

static const version_spec specs[] = {
    {FG_FP16, 64, FG_MASK_NONE, 0, FG_SPARSE_NONE},
    {FG_BF16, 64, FG_MASK_CAUSAL, 1, FG_SPARSE_NONE},
    {FG_BF16, 128, FG_MASK_CAUSAL, 0, FG_SPARSE_NONE},
    {FG_FP16, 128, FG_MASK_WINDOW, 1, FG_SPARSE_NONE},
    {FG_BF16, 256, FG_MASK_NONE, 1, FG_SPARSE_NONE},
    {FG_FP16, 256, FG_MASK_CAUSAL, 0, FG_SPARSE_NONE},
    {FG_BF16, 72, FG_MASK_CAUSAL, 1, FG_SPARSE_NONE},
    {FG_FP16, 72, FG_MASK_WINDOW, 0, FG_SPARSE_NONE},
    {FG_BF16, 64, FG_MASK_CAUSAL, 0, FG_SPARSE_LAYOUT},
    {FG_FP16, 128, FG_MASK_NONE, 1, FG_SPARSE_BUTTERFLY},
};
#define SPEC_COUNT ((int)(sizeof specs / sizeof specs[0]))
static const char *const targets[] = {"t4", "a100", "h100"};
#define TARGET_COUNT ((int)(sizeof targets / sizeof targets[0]))

/* Compile every (target, spec, pass) whose index % workers == worker,
 * printing a line each; returns the number of failures. */
static int compile_share(int worker, int workers) {
    int failures = 0, n = 0;
    for (int t = 0; t < TARGET_COUNT; t++) {
        fg_context *ctx;
        if (fg_context_create(&ctx, targets[t]) != FG_OK) {
            printf("%s: %s\n", targets[t], fg_last_message());
            return 1;
        }
        const fg_profile *prof = profile_named(targets[t]);
        for (int i = 0; i < 2 * SPEC_COUNT; i++, n++) {
            if (n % workers != worker) continue;
            const version_spec *v = &specs[i % SPEC_COUNT];
            fg_pass pass = i < SPEC_COUNT ? FG_PASS_FORWARD : FG_PASS_BACKWARD;
            fg_spec s = fg_spec_default(v->head_dim, prof->arch < 80 ? FG_FP16 : v->dtype);
            s.mask = v->mask, s.dropout = v->dropout, s.sparsity = v->sparsity;
            s.sparse_block_q = s.sparse_block_k = 64;
            s.butterfly_factors = 2;
            fg_kernel_info info;
            fg_status st = fg_compile(ctx, &s, pass, &info);
            int ok = st == FG_OK && info.from_cache == 0 && info.spill_bytes == 0 &&
                     info.stack_bytes == 0 &&
                     info.plan.smem_bytes + info.smem_static <= prof->smem_per_block &&
                     info.registers > 0 && info.registers <= 255;
            if (st == FG_OK)
                printf("%-5s %-60s regs %3d spill %3d smem %6d %6.0f ms %s\n", targets[t],
                       info.plan.kernel_name, info.registers, info.spill_bytes,
                       info.plan.smem_bytes, info.compile_ms, ok ? "ok" : "FAIL");
            else
                printf("%-5s %s %s d=%d: FAIL: %s\n", targets[t],
                       pass == FG_PASS_FORWARD ? "forward" : "backward",
                       s.dtype == FG_BF16 ? "bf16" : "fp16", s.head_dim, fg_context_message(ctx));
            fflush(stdout);
            failures += !ok;
        }
        fg_context_destroy(ctx);
    }
    return failures;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: test_nvrtc_version LIBNVRTC MAJOR\n");
        return 2;
    }
    if (access(argv[1], R_OK) != 0) {
        char why[1200];
        snprintf(why, sizeof why, "%s is absent (.ci/setup installs NVRTC %s there)", argv[1],
                 argv[2]);
        check_skip(why);
    }
    /* Before anything loads NVRTC; no cache, so every kernel is compiled. */
    setenv("FLASHGEN_NVRTC", argv[1], 1);
    setenv("FLASHGEN_CACHE", "off", 1);
    char err[4096];
    int major = 0, minor = 0;
    CHECK(nvrtc_lib_load(err, sizeof err) == 0, "%s", err);
    nvrtc_lib_version(&major, &minor);
    CHECK(major == atoi(argv[2]), "%s is NVRTC %d.%d, not %s", argv[1], major, minor, argv[2]);
    printf("NVRTC %d.%d from %s\n", major, minor, argv[1]);
    fflush(stdout);

    check_in_workers(compile_share, 2);
    return check_summary("test_nvrtc_version");
}
