/* flashgen bench --variants: the logits' variants (softcap, ALiBi, sinks,
 * all three) beside the plain kernel on the same shapes, forward and
 * forward+backward (fast schedule), as ratios of the plain kernel's time. */
#include <stdio.h>

#include "cli/cli.h"
#include "harness/timing.h"

enum { PLAIN, SOFTCAP, ALIBI, SINKS, ALL, VARIANTS };
static const char *const variant_names[VARIANTS] = {"plain", "softcap", "alibi", "sinks", "all"};

/* The benchmark's shape (bf16, 16k tokens, hidden 2048) with variant v: a
 * cap of 50 (Gemma 2's), the harness's slopes and sinks; dv the value head
 * dim (0: d). */
static void variant_shape(int d, int dv, int len, int causal, int v, const cli_problem *base,
                          fg_spec *spec, cli_problem *pb) {
    *spec = fg_spec_default(d, FG_BF16);
    spec->head_dim_v = dv;
    spec->mask = causal ? FG_MASK_CAUSAL : FG_MASK_NONE;
    spec->softcap = v == SOFTCAP || v == ALL;
    spec->alibi = v == ALIBI || v == ALL;
    spec->sinks = v == SINKS || v == ALL;
    *pb = *base;
    fgh_shape *s = &pb->shape;
    s->seqlen_q = s->seqlen_k = len;
    s->batch = 16384 / len;
    s->heads_q = s->heads_kv = 2048 / d;
    s->softcap = 50.f, s->alibi_per_batch = 0;
    s->dropout_p = 0.f, s->window_left = s->window_right = -1;
    pb->bhsd = 0;
}

/* Forward and forward+backward ms of one variant; -1 where a call failed
 * (the error printed). */
static void time_variant(fg_context *ctx, const fgh_device *d, const cli_options *o,
                         const fg_spec *spec, const cli_problem *pb, double ms[2]) {
    fgh_problem p;
    ms[0] = ms[1] = -1;
    if (cli_problem_setup(ctx, d, spec, pb, 1, &p) != 0) return;
    fg_forward_args a = fgh_forward_args(&p, 1);
    ms[0] = fgh_time_forward(d, ctx, spec, &a, o->repeats);
    if (ms[0] >= 0) {
        fg_forward(ctx, spec, &a); /* o and lse of these inputs */
        fg_backward_args b = fgh_backward_args(&p, 0);
        double bwd = fgh_time_backward(d, ctx, spec, &b, o->repeats);
        ms[1] = bwd < 0 ? -1 : ms[0] + bwd;
    }
    if (ms[0] < 0 || ms[1] < 0) cli_error("bench: %s", fg_context_message(ctx));
    fgh_problem_free(d, &p);
}

int cli_bench_variants(fg_context *ctx, const fgh_device *d, const cli_options *o, const int *dims,
                       int nd, const int *lens, int nl) {
    const int dv = o->spec.head_dim_v, dw = cli_bench_dim_width(o);
    char value_dim[64] = "";
    if (dv) snprintf(value_dim, sizeof value_dim, ", value head dim %d", dv);
    if (o->csv)
        printf("kind,head_dim,seqlen,batch,heads,causal,variant,fwd_ms,fwd_tflops,fwd_ratio,"
               "all_ms,all_tflops,all_ratio%s\n", dv ? ",head_dim_v" : "");
    else
        printf("%s\nbf16, 16k tokens, hidden 2048%s: each variant's forward and forward+backward "
               "(3.5x the forward's FLOPs)\nbeside the plain kernel's, as plain time / variant "
               "time (softcap 50; ALiBi slopes 2^(-8(h+1)/H); sinks 0.5 + h %% 4)\n"
               "%*s %6s %7s %8s %9s %8s %6s %9s %8s %6s\n",
               fg_context_target(ctx), value_dim, dw, dv ? "d/dv" : "d", "seq", "causal",
               "variant", "fwd ms", "fwd TF", "ratio", "f+b ms", "f+b TF", "ratio");
    fflush(stdout);
    cli_progress progress;
    cli_progress_start(&progress, "bench", nd * nl * 2 * VARIANTS);
    for (int di = 0; di < nd; di++)
        for (int li = 0; li < nl; li++)
            for (int causal = 0; causal < 2; causal++) {
                double plain[2] = {-1, -1};
                for (int v = 0; v < VARIANTS; v++) {
                    char now[64], dim[24], csv_v[16];
                    snprintf(now, sizeof now, "d %s seqlen %d%s %s",
                             cli_bench_dim(o, dims[di], dim, sizeof dim), lens[li],
                             causal ? " causal" : "", variant_names[v]);
                    cli_progress_step(&progress, di + li + causal + v > 0, now);
                    fg_spec spec;
                    cli_problem pb;
                    variant_shape(dims[di], dv, lens[li], causal, v, &o->problem, &spec, &pb);
                    double ms[2];
                    time_variant(ctx, d, o, &spec, &pb, ms);
                    if (v == PLAIN) plain[0] = ms[0], plain[1] = ms[1];
                    const fgh_shape *s = &pb.shape;
                    /* Q·Kᵀ over d, P·V over dv */
                    double f = 2.0 * s->batch * s->heads_q * (double)lens[li] * lens[li] *
                               (dims[di] + (dv ? dv : dims[di])) / (causal ? 2.0 : 1.0);
                    double tf[2], ratio[2];
                    for (int k = 0; k < 2; k++) {
                        tf[k] = ms[k] > 0 ? (k ? 3.5 : 1.0) * f / (ms[k] * 1e-3) / 1e12 : 0;
                        ratio[k] = ms[k] > 0 && plain[k] > 0 ? plain[k] / ms[k] : 0;
                    }
                    cli_progress_hide(&progress);
                    if (o->csv)
                        printf("flashgen_variant,%d,%d,%d,%d,%d,%s,%.4f,%.1f,%.3f,%.4f,%.1f,%.3f%s\n",
                               dims[di], lens[li], s->batch, s->heads_q, causal,
                               variant_names[v], ms[0], tf[0], ratio[0], ms[1], tf[1], ratio[1],
                               cli_bench_csv_v(o, csv_v, sizeof csv_v));
                    else
                        printf("%*s %6d %7s %8s %9.3f %8.1f %6.3f %9.3f %8.1f %6.3f\n", dw, dim,
                               lens[li], causal ? "yes" : "no", variant_names[v], ms[0], tf[0],
                               ratio[0], ms[1], tf[1], ratio[1]);
                    fflush(stdout);
                }
            }
    cli_progress_end(&progress);
    return 0;
}
