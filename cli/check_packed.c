/* flashgen check --varlen: a packed batch on the live GPU, each sequence
 * against its own fp64 reference (harness/packed.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "harness/message.h"
#include "harness/packed.h"

/* The sequences' lengths: those listed, or drawn from 0..the maxima (one
 * draw for queries and keys when the maxima are equal). */
static void lengths_of(const cli_problem *pb, int *len_q, int *len_k) {
    const fgh_shape *s = &pb->shape;
    if (pb->length_count) {
        memcpy(len_q, pb->len_q, (size_t)s->batch * sizeof *len_q);
        memcpy(len_k, pb->len_k, (size_t)s->batch * sizeof *len_k);
        return;
    }
    fgh_rng rng;
    cli_lengths_rng(pb, &rng);
    fgh_random_lengths(&rng, len_q, s->batch, 0, s->seqlen_q);
    if (s->seqlen_k == s->seqlen_q) memcpy(len_k, len_q, (size_t)s->batch * sizeof *len_k);
    else fgh_random_lengths(&rng, len_k, s->batch, 0, s->seqlen_k);
}

static void describe(fg_context *ctx, const fgh_packed *k) {
    enum { SHOWN = 16 };
    printf("check %s: %d packed sequences, %d/%d rows; queries/keys:", fg_context_target(ctx),
           k->batch, k->total_q, k->total_k);
    for (int b = 0; b < k->batch && b < SHOWN; b++)
        printf(" %d/%d", k->cu_q[b + 1] - k->cu_q[b], k->cu_k[b + 1] - k->cu_k[b]);
    printf("%s\n", k->batch > SHOWN ? " ..." : "");
}

/* The forward: each sequence's O and lse. 1 when all pass. */
static int check_forward(fg_context *ctx, const fgh_device *d, fgh_packed *k) {
    const fg_spec *spec = &k->p.spec;
    fg_forward_args a = fgh_packed_forward_args(k);
    double *o = malloc((k->p.no ? k->p.no : 1) * sizeof *o); /* (1, Hq, total_q, Dv) */
    fgh_written w;
    int ok = cli_check_ran(ctx, d, fg_forward(ctx, spec, &a), "kernel failed") &&
             (o || cli_check_failed("out of memory"));
    ok = ok && ((fgh_tensor_take(d, &k->p.o, o, spec->dtype, &w) && fgh_buffer_pull(d, &k->p.lse)) ||
                cli_check_failed(fgh_message()));
    const float *lse = fgh_buffer_at(&k->p.lse, k->p.lse.lead); /* (Hq, total_q) */
    cli_sequences seqs = {.worst_sequence = -1};
    for (int b = 0; ok && b < k->batch; b++) {
        fgh_forward_check r;
        char label[96];
        if (!fgh_packed_check_forward(k, b, o, lse, &r)) {
            ok = cli_check_failed(fgh_message());
            break;
        }
        snprintf(label, sizeof label, "sequence %d (%d/%d rows)", b, k->cu_q[b + 1] - k->cu_q[b],
                 k->used[b]);
        cli_sequence_result(&seqs, b, label, &r, spec->dtype);
    }
    free(o);
    return ok && cli_sequences_end(&seqs, spec->dtype);
}

/* The sinks' gradient of the call, with the forward's O and lse read back
 * (the backward reads them). 1, or 0 after the error was printed. */
static int expect_sinks(const fgh_device *d, fgh_packed *k, fgh_sinks_expect *e) {
    double *o = malloc((k->p.no ? k->p.no : 1) * sizeof *o); /* (1, Hq, total_q, Dv) */
    fgh_written w;
    int ok = (o || cli_check_failed("out of memory")) &&
             ((fgh_tensor_take(d, &k->p.o, o, k->p.spec.dtype, &w) &&
               fgh_buffer_pull(d, &k->p.lse) &&
               fgh_packed_expect_sinks(k, o, fgh_buffer_at(&k->p.lse, k->p.lse.lead), e)) ||
              cli_check_failed(fgh_message()));
    free(o);
    return ok;
}

/* The backward: each sequence's dQ, dK and dV, zeros in the rows no query
 * or key sees, and with the deterministic schedule two runs bit for bit.
 * 1 when all pass. */
static int check_backward(fg_context *ctx, const fgh_device *d, fgh_packed *k, int deterministic) {
    static const char *const names[FGH_GRADS] = {"dQ", "dK", "dV"};
    const char *schedule = deterministic ? "(deterministic)" : "(fast)";
    fg_backward_args b = fgh_packed_backward_args(k, deterministic);
    double *runs[2][FGH_GRADS] = {{NULL}};
    double *d_sinks[2] = {NULL, NULL}; /* spec.sinks: per run (Hq), the whole call's */
    size_t differ;
    fgh_packed_expect x;
    fgh_sinks_expect se;
    memset(&x, 0, sizeof x);
    memset(&se, 0, sizeof se);
    const int sinks = k->p.spec.sinks;
    int ok = (!sinks || cli_sinks_alloc(&k->p, d_sinks)) &&
             cli_backward_runs(ctx, d, &k->p, &b, runs, sinks ? d_sinks : NULL, &differ) &&
             (fgh_packed_expect_backward(k, &x) || cli_check_failed(fgh_message())) &&
             (!sinks || expect_sinks(d, k, &se));
    int failed = 0, worst_seq[FGH_GRADS] = {-1, -1, -1};
    double worst[FGH_GRADS] = {0, 0, 0}, worst_err[FGH_GRADS] = {0, 0, 0};
    for (int s = 0; ok && s < k->batch; s++) {
        double err[FGH_GRADS];
        int pass;
        if (!fgh_packed_check_backward(k, &x, s, runs[0], err, &pass)) {
            ok = cli_check_failed(fgh_message());
            break;
        }
        if (!x.have[s]) continue;
        const double *bound = x.e[s].bound;
        if (!pass) {
            failed++;
            printf("check backward %s sequence %d: |dQ-ref|/|ref| = %.3g, dK %.3g, dV %.3g (bounds "
                   "%.3g, %.3g, %.3g): FAIL\n", schedule, s, err[0], err[1], err[2], bound[0],
                   bound[1], bound[2]);
        }
        for (int g = 0; g < FGH_GRADS; g++)
            if (worst_seq[g] < 0 || !(err[g] / bound[g] <= worst[g]))
                worst[g] = err[g] / bound[g], worst_err[g] = err[g], worst_seq[g] = s;
    }
    if (ok) {
        size_t unseen = fgh_packed_unseen_nonzero(k, runs[0]);
        for (int g = 0; g < FGH_GRADS; g++)
            if (worst_seq[g] < 0)
                printf("check backward %s %s: no sequence has both queries and keys\n", schedule,
                       names[g]);
            else
                printf("check backward %s %s: worst sequence %d: |%s-ref|/|ref| = %.3g (naive %.3g, "
                       "bound %.3g)\n", schedule, names[g], worst_seq[g], names[g], worst_err[g],
                       x.e[worst_seq[g]].naive_err[g], x.e[worst_seq[g]].bound[g]);
        printf("check backward: %zu gradient values not 0 in rows no query or key sees\n", unseen);
        int sinks_pass = !sinks || cli_sinks_result(schedule, &se, d_sinks[0]);
        if (deterministic)
            printf("check backward: two deterministic runs %s\n",
                   differ == 0 ? "bitwise identical" : "DIFFER");
        ok = failed == 0 && unseen == 0 && differ == 0 && sinks_pass;
        printf("check backward: %s\n", ok ? "PASS" : "FAIL");
    }
    fgh_packed_expect_free(&x);
    fgh_sinks_expect_free(&se);
    cli_free_runs(runs);
    free(d_sinks[0]), free(d_sinks[1]);
    return ok;
}

int cli_check_packed(fg_context *ctx, const fgh_device *d, const cli_options *o) {
    const cli_problem *pb = &o->problem;
    const int n = pb->shape.batch, grads = o->pass == FG_PASS_BACKWARD;
    int *len_q = malloc((size_t)n * sizeof *len_q), *len_k = malloc((size_t)n * sizeof *len_k);
    fgh_packed k;
    memset(&k, 0, sizeof k);
    int ok = (len_q && len_k) || cli_check_failed("out of memory");
    if (ok) {
        lengths_of(pb, len_q, len_k);
        fgh_lengths lens = {n, len_q, len_k, NULL, 0, 0};
        fgh_placement pl = {pb->bhsd ? FGH_BHSD : FGH_BSHD, 0, 0, 0};
        ok = fgh_packed_init(&k, &o->spec, &pb->shape, &lens, &pl, grads) ||
             cli_check_failed(fgh_message());
    }
    ok = ok && cli_problem_fill(ctx, &o->spec, pb, grads, &k.p) == 0 &&
         (fgh_packed_upload(d, &k) || cli_check_failed(fgh_message()));
    if (ok) {
        describe(ctx, &k);
        ok = check_forward(ctx, d, &k);
        if (grads) ok &= check_backward(ctx, d, &k, o->deterministic);
    }
    fgh_packed_free(d, &k);
    free(len_q), free(len_k);
    return ok ? 0 : 1;
}
