/* flashgen demo: with a GPU, compile, check and time a problem; without
 * one, plan and compile a set of specs for every named target. Either way
 * it ends by saying where the kernels were cached. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "harness/timing.h"
#include "runtime/tools.h"

/* Where the kernels went, from the last one's report: the cache folder
 * holding its entry (<folder>/<target>/<key>.fgc), or why none was saved. */
static void say_cache(const fg_kernel_info *last) {
    const char *off = getenv("FLASHGEN_CACHE");
    char root[sizeof last->cache_path];
    snprintf(root, sizeof root, "%s", last->cache_path);
    for (int up = 0; up < 2; up++) {
        char *slash = strrchr(root, '/');
        if (slash) *slash = '\0';
    }
    if (last->from_cache == 3)
        printf("\nkernels came from a bundle (%s); the kernel cache was not used\n", root);
    else if (!last->cache_path[0])
        printf("\nkernel cache: %s; the kernels were compiled in memory\n",
               off && strcmp(off, "off") == 0 ? "off (FLASHGEN_CACHE=off)"
                                              : "not used (see the warning above)");
    else if (access(last->cache_path, F_OK) != 0)
        printf("\nkernel cache: %s could not be written (see the warning above); the kernels "
               "were compiled in memory\n", root);
    else
        printf("\nkernel cache: %s ('flashgen cache list' shows its entries, 'flashgen cache "
               "clear' removes them; FLASHGEN_CACHE_DIR moves it)\n", root);
}

static int demo_offline(const cli_options *o) {
    if (o->given) {
        cli_error("demo: without a GPU (%s) the demo plans and compiles a fixed set of specs, so "
                  "it takes no options; plan and compile take them with --target",
                  fg_last_message());
        return 1;
    }
    printf("No CUDA device (%s).\nPlanning and compiling for every named target instead.\n\n",
           fg_last_message());
    static const int dims[] = {64, 128, 256, 72};
    int rc = 0;
    fg_kernel_info last;
    memset(&last, 0, sizeof last);
    cli_progress progress; /* cold, the compiles take minutes */
    cli_progress_start(&progress, "demo", tools_target_count() * 8);
    for (int t = 0; t < tools_target_count(); t++) {
        fg_context *ctx;
        if (cli_context_create(&ctx, tools_target_name(t)) != FG_OK) {
            cli_error("%s", fg_last_message());
            return 1;
        }
        cli_progress_hide(&progress);
        printf("== %s\n", fg_context_target(ctx));
        printf("  %-58s %5s %5s %5s %7s %5s %6s %8s\n", "kernel", "Br", "Bc", "warps", "smem",
               "regs", "spill", "compile");
        for (int i = 0; i < 4; i++)
            for (int causal = 0; causal < 2; causal++) {
                /* bf16 where the target has it, else fp16 */
                fg_spec s = fg_spec_default(dims[i], FG_BF16);
                s.mask = causal ? FG_MASK_CAUSAL : FG_MASK_NONE;
                s.dropout = causal;
                if (tools_check_spec(ctx, &s, FG_PASS_FORWARD) == FG_ERR_UNSUPPORTED)
                    s.dtype = FG_FP16;
                fg_kernel_info info;
                char now[64];
                snprintf(now, sizeof now, "%s d %d%s", tools_target_name(t), dims[i],
                         causal ? " causal dropout" : "");
                cli_progress_step(&progress, t + i + causal > 0, now);
                fg_status st = fg_compile(ctx, &s, FG_PASS_FORWARD, &info);
                cli_progress_hide(&progress);
                if (st != FG_OK) {
                    printf("  FAILED: %s\n", fg_context_message(ctx));
                    rc = 1;
                    continue;
                }
                char took[32];
                printf("  %-58s %5d %5d %5d %7d %5d %6d %8s\n", info.plan.kernel_name,
                       info.plan.block_m, info.plan.block_n, info.plan.warps, info.plan.smem_bytes,
                       info.registers, info.spill_bytes, cli_compile_time(&info, took, sizeof took));
                rc |= info.spill_bytes != 0;
                last = info;
            }
        fg_context_destroy(ctx);
    }
    cli_progress_end(&progress);
    if (last.plan.kernel_name[0]) say_cache(&last);
    return rc;
}

int cli_demo(const cli_options *o) {
    fg_context *ctx;
    if (cli_context_create(&ctx, NULL) != FG_OK) return demo_offline(o);
    fg_context_destroy(ctx);
    fgh_device d;
    if (cli_open_live(&ctx, &d, "demo") != 0) return 1;
    /* the demo's problem: cli_parse's defaults for demo, changed by options */
    const fg_spec *spec = &o->spec;
    const cli_problem *pb = &o->problem;
    printf("%s\n", fg_context_target(ctx));
    fflush(stdout);
    cli_progress progress; /* a cold compile, the check, the timing */
    cli_progress_start(&progress, "demo", 3);
    cli_progress_step(&progress, 0, "compile");
    fg_kernel_info info;
    if (fg_compile(ctx, spec, FG_PASS_FORWARD, &info) != FG_OK) {
        cli_error("demo: %s", fg_context_message(ctx));
        cli_close_live(ctx, &d);
        return 1;
    }
    cli_progress_hide(&progress);
    char took[32];
    printf("kernel %s: Br=%d Bc=%d warps=%d, %d registers, %d spill bytes, compile %s\n",
           info.plan.kernel_name, info.plan.block_m, info.plan.block_n, info.plan.warps,
           info.registers, info.spill_bytes, cli_compile_time(&info, took, sizeof took));
    fflush(stdout);
    cli_progress_step(&progress, 1, "check against the fp64 reference");
    int rc = cli_check_problem(ctx, &d, spec, pb, FG_PASS_FORWARD, 0);
    fflush(stdout);
    cli_progress_step(&progress, 1, "time");
    fgh_problem p;
    if (cli_problem_setup(ctx, &d, spec, pb, 0, &p) == 0) {
        fg_forward_args a = fgh_forward_args(&p, 1);
        double ms = fgh_time_forward(&d, ctx, spec, &a, o->repeats);
        cli_progress_end(&progress);
        char dv[24] = ""; /* FLOPs: Q·Kᵀ over d, P·V over the value head dim */
        if (spec->head_dim_v) snprintf(dv, sizeof dv, "/%d", spec->head_dim_v);
        printf("speed: batch %d, heads %d, seqlen %d, d %d%s: %.3f ms, %.1f TFLOP/s\n",
               pb->shape.batch, pb->shape.heads_q, pb->shape.seqlen_q, spec->head_dim, dv, ms,
               fgh_problem_flops(&p) / (ms * 1e-3) / 1e12);
        fgh_problem_free(&d, &p);
    }
    cli_progress_end(&progress);
    say_cache(&info);
    cli_close_live(ctx, &d);
    return rc;
}
