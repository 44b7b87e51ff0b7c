/* flashgen check: one problem on the live GPU against the fp64 reference;
 * with --varlen a packed batch (cli/check_packed.c), with --kv-cache a
 * decoding step (cli/check_paged.c), each sequence against its own. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "harness/compare.h"
#include "harness/message.h"

int cli_check_failed(const char *why) {
    cli_error("check: %s", why);
    return 0;
}

int cli_check_ran(fg_context *ctx, const fgh_device *d, fg_status st, const char *kernel) {
    if (st != FG_OK) return cli_check_failed(fg_context_message(ctx));
    return d->cu->cuCtxSynchronize() == CUDA_SUCCESS || cli_check_failed(kernel);
}

void cli_print_forward(const char *label, const fgh_forward_check *r, fg_dtype dtype) {
    cli_progress_hide(NULL); /* demo's, shown while the check ran */
    printf("check %s: |O-ref|/|ref| = %.3g (naive %s: %.3g, bound %.3g), lse max err %.2g%s%s: %s\n",
           label, r->err, dtype ? "bf16" : "fp16", r->naive_err, r->bound, r->lse_worst_rel,
           r->lse_bad_inf ? ", lse -inf mismatch" : "",
           r->zero_rows_bad ? ", O not 0 where no key is visible" : "", r->pass ? "PASS" : "FAIL");
}

void cli_sequence_result(cli_sequences *s, int b, const char *label, const fgh_forward_check *r,
                         fg_dtype dtype) {
    double ratio = r->err / r->bound;
    s->count++;
    if (!r->pass) {
        s->failed++;
        cli_print_forward(label, r, dtype);
    }
    if (s->worst_sequence < 0 || !(ratio <= s->worst)) { /* a NaN is the worst */
        s->worst = ratio, s->worst_sequence = b, s->worst_check = *r;
        snprintf(s->worst_label, sizeof s->worst_label, "%s, the worst", label);
    }
}

int cli_sequences_end(const cli_sequences *s, fg_dtype dtype) {
    if (s->worst_sequence >= 0 && s->worst_check.pass) /* a failing one is printed already */
        cli_print_forward(s->worst_label, &s->worst_check, dtype);
    printf("check forward: %d of %d sequences within bounds: %s\n", s->count - s->failed, s->count,
           s->failed ? "FAIL" : "PASS");
    return s->failed == 0;
}

int cli_backward_runs(fg_context *ctx, const fgh_device *d, fgh_problem *p,
                      const fg_backward_args *b, double *runs[2][FGH_GRADS], double *d_sinks[2],
                      size_t *differ) {
    const size_t n[FGH_GRADS] = {p->nq, p->nk, p->nv}; /* dV: the value head dim's */
    const int count = 1 + b->deterministic;
    int ok = 1;
    memset(runs, 0, 2 * sizeof runs[0]);
    *differ = 0;
    for (int r = 0; r < count; r++)
        for (int g = 0; g < FGH_GRADS; g++)
            ok &= (runs[r][g] = malloc((n[g] ? n[g] : 1) * sizeof(double))) != NULL;
    if (!ok) return cli_check_failed("out of memory");
    for (int run = 0; ok && run < count; run++) {
        fgh_written w[FGH_GRADS];
        ok = (fgh_problem_poison_grads(d, p) || cli_check_failed(fgh_message())) &&
             cli_check_ran(ctx, d, fg_backward(ctx, &p->spec, b), "backward kernel failed") &&
             (fgh_problem_take_grads(d, p, runs[run], w) || cli_check_failed(fgh_message())) &&
             (!d_sinks || fgh_problem_take_d_sinks(d, p, d_sinks[run]) ||
              cli_check_failed(fgh_message()));
    }
    for (int g = 0; ok && count == 2 && g < FGH_GRADS; g++)
        *differ += fgh_bits_differ(runs[0][g], runs[1][g], n[g]);
    if (ok && count == 2 && d_sinks)
        *differ += fgh_bits_differ(d_sinks[0], d_sinks[1], (size_t)p->shape.heads_q);
    return ok;
}

void cli_free_runs(double *runs[2][FGH_GRADS]) {
    for (int r = 0; r < 2; r++)
        for (int g = 0; g < FGH_GRADS; g++) free(runs[r][g]);
}

int cli_sinks_alloc(const fgh_problem *p, double *d_sinks[2]) {
    const size_t n = (size_t)(p->shape.heads_q > 0 ? p->shape.heads_q : 1);
    d_sinks[0] = malloc(n * sizeof(double));
    d_sinks[1] = malloc(n * sizeof(double));
    return (d_sinks[0] && d_sinks[1]) || cli_check_failed("out of memory");
}

int cli_sinks_result(const char *schedule, const fgh_sinks_expect *e, const double *x) {
    double worst[2];
    int pass = fgh_check_sinks(e, x, worst);
    printf("check backward %s: d_sinks of %d heads: max |x-ref|/bound = %.3g, against the "
           "forward's own O and lse %.3g: %s\n", schedule, e->heads, worst[0], worst[1],
           pass ? "PASS" : "FAIL");
    for (int h = 0; !pass && h < e->heads; h++)
        printf("  head %d: d_sinks %.9g, fp64 %.9g (bound %.3g), of the forward's outputs %.9g "
               "(bound %.3g)\n", h, x[h], e->ref[h], e->bound[h] + FGH_ABS_FLOOR, e->own[h],
               e->own_bound[h] + FGH_ABS_FLOOR);
    return pass;
}

/* The backward of a problem whose forward ran (o and lse its outputs read
 * back): fg_backward, and dQ, dK, dV against the fp64 gradients, and with
 * sinks d_sinks. The deterministic schedule runs twice and the runs must
 * match bit for bit. 1 when it passed. */
static int check_backward(fg_context *ctx, const fgh_device *d, fgh_problem *p, int deterministic,
                          const double *o, const float *lse) {
    static const char *const names[FGH_GRADS] = {"dQ", "dK", "dV"};
    const char *schedule = deterministic ? "(deterministic)" : "(fast)";
    double *runs[2][FGH_GRADS] = {{NULL}}; /* per run: dQ (B,Hq,Sq,D), dK (B,Hkv,Sk,D), dV Dv */
    double *d_sinks[2] = {NULL, NULL}; /* spec.sinks: per run (Hq) */
    size_t differ;
    fg_backward_args b = fgh_backward_args(p, deterministic);
    int sinks = p->spec.sinks;
    int ok = (!sinks || cli_sinks_alloc(p, d_sinks)) &&
             cli_backward_runs(ctx, d, p, &b, runs, sinks ? d_sinks : NULL, &differ);
    fgh_backward_expect e;
    fgh_sinks_expect se;
    memset(&e, 0, sizeof e);
    memset(&se, 0, sizeof se);
    ok = ok && (fgh_expect_backward(p, &e) || cli_check_failed(fgh_message())) &&
         (!sinks || fgh_expect_sinks(p, o, lse, &se) || cli_check_failed(fgh_message()));
    if (ok) {
        double err[FGH_GRADS];
        ok = fgh_check_backward(&e, runs[0], err) && differ == 0;
        for (int g = 0; g < FGH_GRADS; g++)
            printf("check backward %s: |%s-ref|/|ref| = %.3g (naive %.3g, bound %.3g)\n",
                   schedule, names[g], err[g], e.naive_err[g], e.bound[g]);
        if (sinks) ok &= cli_sinks_result(schedule, &se, d_sinks[0]);
        if (deterministic)
            printf("check backward: two deterministic runs %s\n",
                   differ == 0 ? "bitwise identical" : "DIFFER");
        printf("check backward: %s\n", ok ? "PASS" : "FAIL");
    }
    fgh_expect_free(&e);
    fgh_sinks_expect_free(&se);
    cli_free_runs(runs);
    free(d_sinks[0]), free(d_sinks[1]);
    return ok;
}

int cli_check_problem(fg_context *ctx, const fgh_device *d, const fg_spec *spec,
                      const cli_problem *pb, fg_pass pass, int deterministic) {
    fgh_problem p;
    if (cli_problem_setup(ctx, d, spec, pb, pass == FG_PASS_BACKWARD, &p) != 0) return 1;
    fg_forward_args a = fgh_forward_args(&p, 1);
    double *o = malloc((p.no ? p.no : 1) * sizeof *o); /* o (B,Hq,Sq,Dv) */
    fgh_written w;
    fgh_forward_check r;
    int ok = cli_check_ran(ctx, d, fg_forward(ctx, spec, &a), "kernel failed") &&
             (o || cli_check_failed("out of memory"));
    ok = ok && ((fgh_tensor_take(d, &p.o, o, spec->dtype, &w) && fgh_buffer_pull(d, &p.lse) &&
                 fgh_check_forward(&p, o, fgh_buffer_at(&p.lse, p.lse.lead), &r)) ||
                cli_check_failed(fgh_message()));
    if (ok) {
        cli_print_forward(fg_context_target(ctx), &r, spec->dtype);
        ok = r.pass;
        if (pass == FG_PASS_BACKWARD)
            ok &= check_backward(ctx, d, &p, deterministic, o, fgh_buffer_at(&p.lse, p.lse.lead));
    }
    free(o);
    fgh_problem_free(d, &p);
    return ok ? 0 : 1;
}

int cli_check(const cli_options *o) {
    fg_context *ctx;
    fgh_device d;
    if (cli_open_live(&ctx, &d, "check") != 0) return 1;
    int rc = 1;
    if (tools_check_spec(ctx, &o->spec, o->pass) != FG_OK) /* this GPU cannot run it */
        cli_spec_error(o, "this GPU", fg_context_message(ctx));
    else if (o->spec.varlen)
        rc = cli_check_packed(ctx, &d, o);
    else if (o->spec.kv_cache)
        rc = cli_check_paged(ctx, &d, o);
    else
        rc = cli_check_problem(ctx, &d, &o->spec, &o->problem, o->pass, o->deterministic);
    cli_close_live(ctx, &d);
    return rc;
}
