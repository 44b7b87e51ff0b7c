/* flashgen bench: TFLOP/s of the forward (or forward and backward) over the
 * standard shapes, --tuned plans beside the derived ones, the host overhead
 * of a call, compile times, and --philox's cost of dropout's random numbers;
 * --varlen and --kv-cache have files of their own. */
#define _XOPEN_SOURCE 700 /* nftw */

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli.h"
#include "harness/timing.h"

const char *cli_bench_dim(const cli_options *o, int head_dim, char *buf, size_t len) {
    if (o->spec.head_dim_v) snprintf(buf, len, "%d/%d", head_dim, o->spec.head_dim_v);
    else snprintf(buf, len, "%d", head_dim);
    return buf;
}

/* 4 as the tables always were; "256/256" needs 7 */
int cli_bench_dim_width(const cli_options *o) { return o->spec.head_dim_v ? 7 : 4; }

const char *cli_bench_csv_v(const cli_options *o, char *buf, size_t len) {
    if (o->spec.head_dim_v) snprintf(buf, len, ",%d", o->spec.head_dim_v);
    else if (len) buf[0] = '\0';
    return buf;
}

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *f) {
    (void)st, (void)type, (void)f;
    return remove(path) == 0 ? 0 : -1;
}

/* Cold, disk-warm and memory-warm compile times in the cache folder the
 * environment names (a private one, empty at first). */
static void compile_times(const cli_options *o) {
    /* cold: the empty folder; disk: a new context on it; memory: the same
     * context again */
    fg_spec spec = fg_spec_default(128, FG_BF16);
    spec.mask = FG_MASK_CAUSAL;
    fg_kernel_info cold, disk, mem;
    fg_context *ctx;
    if (cli_context_create(&ctx, NULL) != FG_OK) return;
    double t0 = fgh_now_s();
    fg_compile(ctx, &spec, FG_PASS_FORWARD, &cold);
    double ms_cold = (fgh_now_s() - t0) * 1e3;
    fg_context_destroy(ctx);
    if (cli_context_create(&ctx, NULL) != FG_OK) return;
    t0 = fgh_now_s();
    fg_compile(ctx, &spec, FG_PASS_FORWARD, &disk);
    double ms_disk = (fgh_now_s() - t0) * 1e3;
    t0 = fgh_now_s();
    fg_compile(ctx, &spec, FG_PASS_FORWARD, &mem);
    double ms_mem = (fgh_now_s() - t0) * 1e3;
    fg_context_destroy(ctx);
    if (o->csv) printf("compile,%s,%.1f,%.1f,%.3f\n", cold.plan.kernel_name, ms_cold, ms_disk, ms_mem);
    else
        printf("\ncompile %s: cold %.0f ms (NVRTC %.0f ms), warm from disk %.1f ms, warm from memory %.3f ms\n",
               cold.plan.kernel_name, ms_cold, cold.compile_ms, ms_disk, ms_mem);
}

/* compile_times in a private cache folder, removed afterwards. */
static void bench_compile_times(const cli_options *o) {
    char dir[] = "/tmp/flashgen-bench-XXXXXX", saved[1024] = "";
    if (!mkdtemp(dir)) return;
    const char *old = getenv("FLASHGEN_CACHE_DIR");
    int had = old != NULL;
    if (old) snprintf(saved, sizeof saved, "%s", old);
    setenv("FLASHGEN_CACHE_DIR", dir, 1);
    compile_times(o);
    if (had) setenv("FLASHGEN_CACHE_DIR", saved, 1);
    else unsetenv("FLASHGEN_CACHE_DIR");
    nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Host time of a warm fg_forward call against a bare launch of the same
 * problem: the calls only queue work, so host time is what is measured. */
static void bench_host_overhead(fg_context *ctx, const fgh_device *d) {
    fg_spec spec = fg_spec_default(64, FG_FP16);
    cli_problem pb = {.shape = {.batch = 1, .heads_q = 1, .heads_kv = 1, .seqlen_q = 16,
                                .seqlen_k = 16, .window_left = -1, .window_right = -1, .seed = 1},
                      .layout_density = 0.5};
    fgh_problem p;
    if (cli_problem_setup(ctx, d, &spec, &pb, 0, &p) != 0) return;
    fg_forward_args a = fgh_forward_args(&p, 1);
    fg_forward(ctx, &spec, &a);
    d->cu->cuCtxSynchronize();
    const int n = 2000;
    double t0 = fgh_now_s();
    for (int i = 0; i < n; i++) fg_forward(ctx, &spec, &a);
    double per_call = (fgh_now_s() - t0) * 1e6 / n;
    d->cu->cuCtxSynchronize();
    printf("host time per warm fg_forward call (tiny problem, launches queued): %.2f us\n", per_call);
    fgh_problem_free(d, &p);
}

/* --tuned: tune the pass for the shape's bucket, time the tuned plan (the
 * backward: fast schedule), and print it beside the derived plan's ms. args:
 * the pass's fg_forward_args or fg_backward_args. */
static void bench_tuned(fg_context *ctx, const fgh_device *d, const cli_options *o,
                        const fgh_problem *p, fg_pass pass, void *args, double ms) {
    const fg_spec *spec = &p->spec;
    const fgh_shape *s = &p->shape;
    int bwd = pass == FG_PASS_BACKWARD;
    fg_tune_report rep;
    if (fg_tune(ctx, spec, pass, s->seqlen_k, &rep) != FG_OK) {
        cli_error("bench: tune: %s", fg_context_message(ctx));
        return;
    }
    fg_context_set_tuning(ctx, 1);
    double tuned = bwd ? fgh_time_backward(d, ctx, spec, args, o->repeats)
                       : fgh_time_forward(d, ctx, spec, args, o->repeats);
    fg_context_set_tuning(ctx, 0);
    if (tuned < 0) return;
    double tf = (bwd ? 2.5 : 1.0) * fgh_problem_flops(p) / (tuned * 1e-3) / 1e12;
    char plan[48], v[16];
    snprintf(plan, sizeof plan, "%dx%d w%d", rep.chosen.block_m, rep.chosen.block_n,
             rep.chosen.warps);
    cli_progress_hide(NULL);
    if (o->csv)
        printf("%s,%d,%d,%d,%d,%d,%.1f,%.4f,%.1f,%s,%.4f%s\n", bwd ? "flashgen_bwd_tuned" : "flashgen_tuned",
               spec->head_dim, s->seqlen_k, s->batch, s->heads_q, spec->mask == FG_MASK_CAUSAL,
               s->dropout_p, tuned, tf, plan, ms, cli_bench_csv_v(o, v, sizeof v));
    else /* under the row's ms */
        printf("%*s %s %-11s %9.3f %8.1f  (%+.1f%% time vs derived%s)\n",
               36 + cli_bench_dim_width(o), "", bwd ? "tuned backward" : "tuned", plan, tuned, tf,
               100.0 * (tuned - ms) / ms, rep.chosen_is_derived ? ", derived kept" : "");
}

/* One forward+backward row: fast and deterministic backward after the
 * forward a, measured in fwd_ms. FLOPs: 2.5x the forward's for the backward,
 * 3.5x for both. */
static void bench_backward_row(fg_context *ctx, const fgh_device *d, const cli_options *o,
                               const fgh_problem *p, const fg_forward_args *a, double fwd_ms) {
    const fg_spec *spec = &p->spec;
    const fgh_shape *s = &p->shape;
    int D = spec->head_dim;
    fg_forward(ctx, spec, a); /* o and lse of these inputs */
    fg_backward_args b = fgh_backward_args(p, 0);
    b.forward = *a; /* with the dropout offset of that call */
    double fast = fgh_time_backward(d, ctx, spec, &b, o->repeats);
    if (fast >= 0 && o->tuned) bench_tuned(ctx, d, o, p, FG_PASS_BACKWARD, &b, fast);
    b.deterministic = 1;
    double det = fast < 0 ? -1 : fgh_time_backward(d, ctx, spec, &b, o->repeats);
    if (fast < 0 || det < 0) {
        cli_error("bench: %s", fg_context_message(ctx));
        return;
    }
    double f = fgh_problem_flops(p);
    double tf_bwd = 2.5 * f / (fast * 1e-3) / 1e12, tf_det = 2.5 * f / (det * 1e-3) / 1e12;
    double tf_all = 3.5 * f / ((fwd_ms + fast) * 1e-3) / 1e12;
    double tf_all_det = 3.5 * f / ((fwd_ms + det) * 1e-3) / 1e12;
    char dim[24], v[16];
    cli_progress_hide(NULL);
    if (o->csv)
        printf("flashgen_bwd,%d,%d,%d,%d,%d,%.1f,%.4f,%.4f,%.4f,%.1f,%.1f,%.1f,%.1f%s\n", D,
               s->seqlen_q, s->batch, s->heads_q, spec->mask == FG_MASK_CAUSAL, s->dropout_p,
               fwd_ms, fast, det, tf_bwd, tf_det, tf_all, tf_all_det,
               cli_bench_csv_v(o, v, sizeof v));
    else
        printf("%*s %6d %5d %5d %7s %8.1f %9.3f %9.3f %9.3f %8.1f %8.1f %8.1f %8.1f\n",
               cli_bench_dim_width(o), cli_bench_dim(o, D, dim, sizeof dim), s->seqlen_q, s->batch,
               s->heads_q, spec->mask == FG_MASK_CAUSAL ? "yes" : "no", s->dropout_p, fwd_ms,
               fast, det, tf_bwd, tf_det, tf_all, tf_all_det);
}

/* A shape of the benchmark's table: bf16, 16k tokens, hidden 2048, (B,S,H,D);
 * dv the value head dim (0: d). */
static void standard_shape(int d, int dv, int len, int causal, int drop, const cli_problem *base,
                           fg_spec *spec, cli_problem *pb) {
    *spec = fg_spec_default(d, FG_BF16);
    spec->head_dim_v = dv;
    spec->mask = causal ? FG_MASK_CAUSAL : FG_MASK_NONE;
    spec->dropout = drop;
    *pb = *base;
    fgh_shape *s = &pb->shape;
    s->seqlen_q = s->seqlen_k = len;
    s->batch = 16384 / len;
    s->heads_q = s->heads_kv = 2048 / d;
    pb->bhsd = 0, s->dropout_p = drop ? 0.1f : 0.f;
    s->window_left = s->window_right = -1;
}

/* Sets up the problem of a standard shape (with grads, its backward's
 * tensors too) and times its forward call a into *ms, negative when the call
 * failed (the context has the message). 0, or -1 after a setup error was
 * printed. */
static int time_standard(fg_context *ctx, const fgh_device *d, const cli_options *o,
                         const fg_spec *spec, const cli_problem *pb, int grads, fgh_problem *p,
                         fg_forward_args *a, double *ms) {
    if (cli_problem_setup(ctx, d, spec, pb, grads, p) != 0) return -1;
    *a = fgh_forward_args(p, 1);
    *ms = fgh_time_forward(d, ctx, spec, a, o->repeats);
    return 0;
}

/* --philox: the overlap of Philox calls and MMAs, then per shape dropout's
 * measured cost beside the time its Philox calls take alone (its cost if
 * they overlapped nothing). A causal shape counts only its visible draws. */
static void bench_philox(fg_context *ctx, const fgh_device *d, const cli_options *o,
                         const int *dims, int nd, const int *lens, int nl) {
    printf("%s\nPhilox4x32-10 beside the tensor cores: per warp and key tile, the forward's "
           "2d m16n8k16 MMAs and 4 Philox calls per thread, 8 warps per SM\n"
           "%4s %10s %10s %10s %20s %22s\n",
           fg_context_target(ctx), "d", "MMAs ms", "Philox ms", "both ms", "Philox time hidden",
           "Philox calls/clock/SM");
    double calls_per_ms = 0;
    for (int di = 0; di < nd; di++) {
        philox_overlap r;
        char err[512];
        if (philox_overlap_measure(d->cu, d->device, dims[di], &r, err, sizeof err) != 0) {
            cli_error("bench: %s", err);
            return;
        }
        calls_per_ms = r.calls_per_ms;
        printf("%4d %10.3f %10.3f %10.3f %19.0f%% %22.2f\n", dims[di], r.mma_ms, r.rng_ms,
               r.both_ms, 100.0 * (r.mma_ms + r.rng_ms - r.both_ms) / r.rng_ms,
               r.calls_per_clock_sm);
    }
    printf("\nbf16 forward, 16k tokens, hidden 2048, dropout 0.1 against none\n"
           "%4s %6s %7s %10s %10s %7s %10s %7s\n",
           "d", "seq", "causal", "none ms", "drop ms", "cost", "Philox ms", "floor");
    fflush(stdout);
    cli_progress progress;
    cli_progress_start(&progress, "bench", nd * nl * 2);
    for (int di = 0; di < nd; di++)
        for (int li = 0; li < nl; li++)
            for (int causal = 0; causal < 2; causal++) {
                char now[64];
                snprintf(now, sizeof now, "d %d seqlen %d%s", dims[di], lens[li],
                         causal ? " causal" : "");
                cli_progress_step(&progress, di + li + causal > 0, now);
                double ms[2] = {-1, -1};
                fg_spec spec;
                cli_problem pb;
                for (int drop = 0; drop < 2; drop++) {
                    standard_shape(dims[di], 0, lens[li], causal, drop, &o->problem, &spec, &pb);
                    fgh_problem p;
                    fg_forward_args a;
                    if (time_standard(ctx, d, o, &spec, &pb, 0, &p, &a, &ms[drop]) == 0)
                        fgh_problem_free(d, &p);
                }
                if (ms[0] < 0 || ms[1] < 0) {
                    cli_error("bench: %s", fg_context_message(ctx));
                    continue;
                }
                double s = lens[li], visible = causal ? s * (s + 1) / 2 : s * s;
                double philox_ms = pb.shape.batch * pb.shape.heads_q * visible / 16 / calls_per_ms;
                cli_progress_hide(&progress);
                printf("%4d %6d %7s %10.3f %10.3f %+6.1f%% %10.3f %+6.1f%%\n", dims[di], lens[li],
                       causal ? "yes" : "no", ms[0], ms[1], 100.0 * (ms[1] - ms[0]) / ms[0],
                       philox_ms, 100.0 * philox_ms / ms[0]);
                fflush(stdout);
            }
    cli_progress_end(&progress);
}

int cli_bench(const cli_options *o) {
    fg_context *ctx;
    fgh_device d;
    if (cli_open_live(&ctx, &d, "bench") != 0) return 1;
    /* the table times the derived plans; --tuned adds the tuned ones */
    fg_context_set_tuning(ctx, 0);
    static const int dims_all[] = {64, 128, 256}, dims_quick[] = {128};
    static const int lens_all[] = {512, 1024, 2048, 4096, 8192, 16384}, lens_quick[] = {2048, 8192};
    const int *dims = o->quick ? dims_quick : dims_all, *lens = o->quick ? lens_quick : lens_all;
    int nd = o->quick ? 1 : 3, nl = o->quick ? 2 : 6;
    static const int dims_variants[] = {128, 256};
    if (o->variants && o->quick) dims = dims_variants, nd = 2;
    if (o->head_dim_given) dims = &o->spec.head_dim, nd = 1;
    if (o->seqlen_given) lens = &o->problem.shape.seqlen_q, nl = 1;
    if (o->philox || o->variants || o->spec.varlen || o->spec.kv_cache) { /* tables of their own */
        int rc = 0;
        if (o->variants) rc = cli_bench_variants(ctx, &d, o, dims, nd, lens, nl);
        else if (o->spec.varlen) rc = cli_bench_varlen(ctx, &d, o);
        else if (o->spec.kv_cache) rc = cli_bench_decode(ctx, &d, o);
        else bench_philox(ctx, &d, o, dims, nd, lens, nl);
        cli_close_live(ctx, &d);
        return rc;
    }
    int bwd = o->pass == FG_PASS_BACKWARD;
    /* --head-dim-v: the d column shows both dims, the CSV rows end with the value's */
    const int dw = cli_bench_dim_width(o), dv = o->spec.head_dim_v;
    const char *dcol = dv ? "d/dv" : "d", *csv_v = dv ? ",head_dim_v" : "";
    char value_dim[64] = "";
    if (dv) snprintf(value_dim, sizeof value_dim, ", value head dim %d", dv);
    if (bwd) {
        if (o->csv)
            printf("kind,head_dim,seqlen,batch,heads,causal,dropout,fwd_ms,bwd_ms,det_ms,"
                   "bwd_tflops,det_tflops,all_tflops,all_det_tflops%s\n", csv_v);
        else
            printf("%s\nbf16 backward (2.5x forward FLOPs) and forward+backward (3.5x), 16k "
                   "tokens, hidden 2048%s; det = deterministic schedule\n"
                   "%*s %6s %5s %5s %7s %8s %9s %9s %9s %8s %8s %8s %8s\n",
                   fg_context_target(ctx), value_dim, dw, dcol, "seq", "batch", "heads",
                   "causal", "dropout", "fwd ms", "bwd ms", "det ms", "bwd TF", "det TF",
                   "f+b TF", "f+b det");
    } else if (o->csv) {
        printf("kind,head_dim,seqlen,batch,heads,causal,dropout,ms,tflops%s\n", csv_v);
    } else {
        printf("%s\nbf16 forward, 16k tokens, hidden 2048%s\n%*s %6s %5s %5s %7s %8s %9s %8s\n",
               fg_context_target(ctx), value_dim, dw, dcol, "seq", "batch", "heads", "causal",
               "dropout", "ms", "TFLOP/s");
    }
    fflush(stdout);
    cli_progress progress;
    cli_progress_start(&progress, "bench", nd * nl * 4);
    for (int di = 0; di < nd; di++)
        for (int li = 0; li < nl; li++)
            for (int causal = 0; causal < 2; causal++)
                for (int drop = 0; drop < 2; drop++) {
                    char now[64];
                    char dim[24];
                    snprintf(now, sizeof now, "d %s seqlen %d%s%s",
                             cli_bench_dim(o, dims[di], dim, sizeof dim), lens[li],
                             causal ? " causal" : "", drop ? " dropout" : "");
                    cli_progress_step(&progress, di + li + causal + drop > 0, now);
                    fg_spec spec;
                    cli_problem pb;
                    standard_shape(dims[di], dv, lens[li], causal, drop, &o->problem, &spec, &pb);
                    fgh_problem p;
                    fg_forward_args a;
                    double ms;
                    if (time_standard(ctx, &d, o, &spec, &pb, bwd, &p, &a, &ms) != 0) continue;
                    const fgh_shape *s = &p.shape;
                    if (ms >= 0 && bwd) {
                        bench_backward_row(ctx, &d, o, &p, &a, ms);
                    } else if (ms < 0) {
                        cli_error("bench: %s", fg_context_message(ctx));
                    } else {
                        double tf = fgh_problem_flops(&p) / (ms * 1e-3) / 1e12; /* d and dv */
                        char v[16];
                        cli_progress_hide(&progress);
                        if (o->csv)
                            printf("flashgen,%d,%d,%d,%d,%d,%.1f,%.4f,%.1f%s\n", dims[di], lens[li],
                                   s->batch, s->heads_q, causal, s->dropout_p, ms, tf,
                                   cli_bench_csv_v(o, v, sizeof v));
                        else
                            printf("%*s %6d %5d %5d %7s %8.1f %9.3f %8.1f\n", dw, dim, lens[li],
                                   s->batch, s->heads_q, causal ? "yes" : "no", s->dropout_p, ms, tf);
                        if (o->tuned) bench_tuned(ctx, &d, o, &p, FG_PASS_FORWARD, &a, ms);
                    }
                    fflush(stdout);
                    fgh_problem_free(&d, &p);
                }
    cli_progress_end(&progress);
    if (!bwd) bench_host_overhead(ctx, &d);
    cli_close_live(ctx, &d);
    if (!bwd) bench_compile_times(o);
    return 0;
}
