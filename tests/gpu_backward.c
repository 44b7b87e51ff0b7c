/* The backward kernels on a live GPU against the fp64 reference.
 *
 * The case matrix is gpu_forward's (gpu_cases.c). Every case: fresh random
 * q, k, v and dO rounded to the dtype, uploaded in (B,S,H,D) or (B,H,S,D)
 * order (optionally with gaps between rows), one fg_forward for o and lse,
 * then fg_backward
 *   - once with the fast schedule (deterministic = 0), the context's workspace;
 *   - 5 times (2 with --quick) with the deterministic schedule: the first with
 *     a workspace of our own of exactly fg_backward_workspace_size bytes
 *     (poisoned before, and a guard after it that must keep its poison), the
 *     others with the context's (workspace NULL).
 * dq, dk and dv are poisoned with NaN before every run. After each run:
 *   - each of dq, dk, dv: relative error ‖x − ref‖/‖ref‖ against
 *     ref_attention_backward_fp64 <= 3 x that of ref_attention_backward_lowp
 *     (the naive computation in the input precision) + 1e-6 (an absolute
 *     floor for cases where the naive path is exact). Where the fp64
 *     gradient is identically 0 although keys are visible (every row sees
 *     exactly one key, e.g. Sk = 1 or window 0/0: dS = P∘(dP − D) cancels
 *     exactly), the relative error is undefined and the GPU's fp32 dP − D
 *     leaves rounding noise: there the error is rms(x − ref) / rms(fp64 dV)
 *     (dV does not cancel; its terms are the size of those that do) and the
 *     floor 1e-5 (a CPU model of that fp32 noise gives about 2e-7);
 *   - every element finite; nothing written outside dq, dk, dv (gaps, and
 *     guards before and after, keep the poison);
 *   - dq rows of queries that see no key, and dk/dv rows of keys that no
 *     query of any head sharing them sees, exactly 0.
 * With sinks, their gradient d_sinks per head within the bounds of
 * harness/compare.h (against fp64, and against the same sum formed from the
 * forward's own O and lse), and bitwise the same in every run.
 * And per case: the deterministic runs bitwise identical to each other;
 * q, k, v, dO and the forward's o and lse unchanged by the backward.
 *
 * Where the backward differs from the forward test:
 *   - the dropout "probe" cases (Q = 0 and one-hot V, made to read the
 *     forward's keep pattern) use random inputs here: the same shapes,
 *     window, p = 0.3 and Philox seeds, so they test the backward's dropout
 *     against the reference's stream like the p = 0.1 cases;
 *   - "no lse" cases pass lse: the backward needs the forward's.
 * No case is reduced or skipped: the fp64 and naive backward references
 * cost about 2.5 x the forward's (five products per visible pair instead of
 * two), and the largest cases (4097 rows or keys) already use one or two
 * heads: on one core the longest takes about 2 s, the whole matrix about 11 s.
 *
 * usage: gpu_backward [--quick] [--shard I/N] [name-filter]
 * --quick runs the cases marked quick (for compute-sanitizer). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "flashgen.h"
#include "harness/compare.h"
#include "harness/problem.h"
#include "harness/random.h"
#include "harness/timing.h"
#include "reference/reference.h"
#include "tests/check.h"
#include "tests/gpu_cases.h"
#include "tests/gpu_common.h"

#define DETERMINISTIC_RUNS 5
#define DETERMINISTIC_RUNS_QUICK 2
/* Poisoned bytes after a workspace of our own. */
#define WORKSPACE_GUARD 4096

static const char *const grad_names[FGH_GRADS] = {"dq", "dk", "dv"};

/* ---- what a case is checked against --------------------------------------------- */

struct expected {
    fgh_backward_expect grads; /* fp64 gradients, the naive path's errors, the bounds */
    fgh_sinks_expect sinks;    /* with sinks: their gradient (formed after the forward) */
    double d_sinks_first[64];  /* the first run's, for the bitwise comparison */
    double *d_aux[FG_MAX_AUX]; /* a score_mod's float tensors: fp64 gradients */
    uint8_t *row_seen;         /* (B, Hq, Sq): the query sees some key */
    uint8_t *key_seen;         /* (B, Hkv, Sk): some query of a head sharing it sees the key */
};

static void expected_free(struct expected *e) {
    fgh_expect_free(&e->grads);
    free(e->row_seen);
    free(e->key_seen);
    fgh_sinks_expect_free(&e->sinks);
    for (int t = 0; t < FG_MAX_AUX; t++) free(e->d_aux[t]);
    memset(e, 0, sizeof *e);
}

/* Which rows see a key and which keys some row sees (mask, sparsity and a
 * mask predicate, which may read the batch row). */
static int visibility(const struct gpu_case *c, const ref_problem *p, struct expected *e) {
    int group = c->hq / c->hkv;
    e->row_seen = calloc((size_t)c->batch * c->hq * c->sq, 1);
    e->key_seen = calloc((size_t)c->batch * c->hkv * c->sk, 1);
    if (!e->row_seen || !e->key_seen) return 0;
    for (int b = 0; b < c->batch; b++)
        for (int h = 0; h < c->hq; h++)
            for (int64_t i = 0; i < c->sq; i++)
                for (int64_t j = 0; j < c->sk; j++)
                    if (ref_visible_in(p, b, h, i, j)) {
                        e->row_seen[((size_t)b * c->hq + h) * c->sq + (size_t)i] = 1;
                        e->key_seen[((size_t)b * c->hkv + h / group) * c->sk + (size_t)j] = 1;
                    }
    return 1;
}

/* A score_mod's float tensors: their fp64 gradients. */
static int expected_aux(const struct gpu_case *c, const fgh_problem *p, struct expected *e) {
    if (!p->spec.score_mod) return 1;
    int any = 0;
    for (int t = 0; t < p->spec.aux_count; t++) {
        if (p->spec.aux[t].type != FG_AUX_F32) continue;
        e->d_aux[t] = malloc((p->aux_elems[t] ? p->aux_elems[t] : 1) * sizeof(double));
        if (!e->d_aux[t]) return 0;
        any = 1;
    }
    if (!any) return 1;
    ref_problem rp = fgh_reference_problem(p);
    int ok = ref_aux_backward_fp64(&rp, p->host.q, p->host.k, p->host.v, p->host.d_o, e->d_aux) == 0;
    CHECK(ok, "%s: ref_aux_backward_fp64 failed", c->name);
    return ok;
}

static int expected_make(const struct gpu_case *c, const fgh_problem *p, struct expected *e) {
    memset(e, 0, sizeof *e);
    ref_problem rp = fgh_reference_problem(p);
    int ok = visibility(c, &rp, e);
    CHECK(ok, "%s: out of host memory", c->name);
    return ok && gpu_ok(fgh_expect_backward(p, &e->grads), c->name) && expected_aux(c, p, e);
}

/* ---- checks of one run -------------------------------------------------------------- */

/* Rows of `rows` x D values that must be exactly 0 where seen[row % period] is 0
 * (period: the rows of one batch, heads x sequence; the visibility does not
 * depend on the batch). */
static size_t nonzero_unseen_rows(const double *x, size_t rows, int d, const uint8_t *seen,
                                  size_t period, size_t *first) {
    size_t bad = 0;
    for (size_t r = 0; r < rows; r++) {
        if (seen[r % period]) continue;
        for (int t = 0; t < d; t++)
            if (x[r * (size_t)d + (size_t)t] != 0.0) {
                if (bad++ == 0) *first = r;
                break;
            }
    }
    return bad;
}

/* Errors against the reference and the exact zeros; worst[] keeps the
 * largest error seen over the runs (a NaN sticks). */
static void check_run(const struct gpu_case *c, const struct expected *e,
                      double *const x[FGH_GRADS], const char *run, double worst[FGH_GRADS]) {
    const fgh_backward_expect *g = &e->grads;
    double err[FGH_GRADS];
    fgh_check_backward(g, x, err);
    for (int t = 0; t < FGH_GRADS; t++) {
        CHECK(err[t] <= g->bound[t], "%s: %s: %s error %.3e exceeds %.3e (naive %.3e%s)",
              c->name, run, grad_names[t], err[t], g->bound[t], g->naive_err[t],
              g->zero[t] ? ", fp64 gradient identically 0: rms over rms(dV)" : "");
        if (!isnan(worst[t]) && !(err[t] <= worst[t])) worst[t] = err[t];
    }
    size_t first = 0, bad, per_batch = (size_t)c->hq * c->sq;
    bad = nonzero_unseen_rows(x[FGH_DQ], (size_t)c->batch * per_batch, c->d, e->row_seen,
                              (size_t)c->batch * per_batch, &first);
    CHECK(bad == 0, "%s: %s: %zu dq rows of queries that see no key are not 0 "
          "(first: b%zu h%zu query %zu)", c->name, run, bad, first / per_batch,
          first % per_batch / (size_t)c->sq, first % (size_t)c->sq);
    per_batch = (size_t)c->hkv * c->sk;
    for (int t = FGH_DK; t <= FGH_DV; t++) {
        const int width = t == FGH_DV && c->dv ? c->dv : c->d; /* dV's rows are Dv wide */
        bad = nonzero_unseen_rows(x[t], (size_t)c->batch * per_batch, width, e->key_seen,
                                  (size_t)c->batch * per_batch, &first);
        CHECK(bad == 0, "%s: %s: %zu %s rows of keys no query sees are not 0 "
              "(first: b%zu kv head %zu key %zu)", c->name, run, bad, grad_names[t],
              first / per_batch, first % per_batch / (size_t)c->sk, first % (size_t)c->sk);
    }
}

/* The sinks' gradient of a run against its expectation (harness/compare.h),
 * and against the first run bit for bit (run_index 0 keeps it). */
static void check_sinks(const struct gpu_case *c, fgh_problem *p, struct expected *e,
                        const char *run, int run_index) {
    double x[64], worst[2];
    if (c->hq > 64 || !gpu_ok(fgh_problem_take_d_sinks(&gpu_dev, p, x), "d_sinks")) {
        CHECK(0, "%s: %s: d_sinks could not be read", c->name, run);
        return;
    }
    CHECK(fgh_check_sinks(&e->sinks, x, worst),
          "%s: %s: d_sinks: error/bound %.3g against fp64, %.3g against the forward's own O, lse",
          c->name, run, worst[0], worst[1]);
    for (int h = 0; h < c->hq; h++) {
        if (run_index == 0) e->d_sinks_first[h] = x[h];
        else
            CHECK(memcmp(&x[h], &e->d_sinks_first[h], sizeof x[h]) == 0,
                  "%s: %s: d_sinks[%d] differs from the first run's", c->name, run, h);
    }
}

/* A score_mod's float tensors' gradients against fp64: ‖x − ref‖/‖ref‖
 * within twice dq's bound (both gather dS over the same elements, here in
 * fp32 atomics) plus 1e-5. */
static void check_aux(const struct gpu_case *c, fgh_problem *p, const struct expected *e,
                      const char *run) {
    for (int t = 0; t < FG_MAX_AUX; t++) {
        if (!e->d_aux[t]) continue;
        size_t n = p->aux_elems[t];
        double *x = malloc((n ? n : 1) * sizeof *x);
        int ok = x && gpu_ok(fgh_problem_take_d_aux(&gpu_dev, p, t, x), "d_aux");
        CHECK(ok, "%s: %s: d_aux[%d] could not be read", c->name, run, t);
        if (ok) {
            double err = fgh_grad_error(x, e->d_aux[t], n, 1.0);
            double bound = 2.0 * e->grads.bound[FGH_DQ] + 1e-5;
            CHECK(err <= bound, "%s: %s: d_aux[%d] (%s): error %.3g over its bound %.3g", c->name,
                  run, t, p->spec.aux[t].name, err, bound);
        }
        free(x);
    }
}

/* With sinks: their gradient's expectation, from the forward's outputs as
 * the device holds them (o, lse pulled into their mirrors). */
static int expected_sinks(const struct gpu_case *c, fgh_problem *p, struct expected *e) {
    double *o = malloc(p->no * sizeof *o); /* (B,Hq,Sq,Dv) */
    int ok = o != NULL;
    CHECK(ok, "%s: out of host memory", c->name);
    ok = ok && gpu_take(&p->o, o, c->dtype, "o") &&
         gpu_ok(fgh_expect_sinks(p, o, (const float *)fgh_buffer_at(&p->lse, LEAD), &e->sinks),
                c->name) &&
         gpu_ok(fgh_buffer_pull(&gpu_dev, &p->o.mem), "o"); /* taking it poisoned the mirror */
    free(o);
    return ok;
}

/* ---- one case ----------------------------------------------------------------------- */

/* Uploads q, k, v and dO; runs the forward for o and lse, and keeps what it
 * wrote in their mirrors. */
static int run_forward(fg_context *ctx, const struct gpu_case *c, fgh_problem *p,
                       fg_backward_args *args) {
    if (!gpu_ok(fgh_problem_upload(&gpu_dev, p), c->name)) return 0;
    /* the backward needs lse: passed even where the forward test's case has none */
    *args = fgh_backward_args(p, 0);
    fg_status st = fg_forward(ctx, &p->spec, &args->forward);
    CHECK(st == FG_OK, "%s: fg_forward: %s: %s", c->name, fg_status_name(st),
          fg_context_message(ctx));
    return st == FG_OK &&
           gpu_ok(fgh_cu(&gpu_dev, gpu_dev.cu->cuCtxSynchronize(), "forward kernel"), c->name) &&
           gpu_ok(fgh_buffer_pull(&gpu_dev, &p->o.mem), "o") &&
           gpu_ok(fgh_buffer_pull(&gpu_dev, &p->lse), "lse");
}

/* The guard after our own workspace still holds the poison. */
static int workspace_guard_intact(const struct gpu_case *c, fgh_buffer *ws) {
    size_t first = 0, end = fgh_buffer_elems(ws);
    if (!gpu_ok(fgh_buffer_pull_range(&gpu_dev, ws, ws->count, end), "workspace guard")) return 0;
    size_t stray = fgh_buffer_unpoisoned(ws, ws->count, end, &first);
    CHECK(stray == 0, "%s: %zu bytes written past the %zu-byte workspace", c->name, stray,
          ws->count);
    return stray == 0;
}

/* Poisons dq, dk, dv, runs one backward and takes them into x[]. */
static int run_backward(fg_context *ctx, const struct gpu_case *c, fgh_problem *p,
                        const fg_backward_args *args, double *const x[FGH_GRADS], const char *run) {
    if (!gpu_ok(fgh_problem_poison_grads(&gpu_dev, p), "poison dq, dk, dv")) return 0;
    fg_status st = fg_backward(ctx, &p->spec, args);
    CHECK(st == FG_OK, "%s: %s: fg_backward: %s: %s", c->name, run, fg_status_name(st),
          fg_context_message(ctx));
    char what[FGH_GRADS][160];
    for (int t = 0; t < FGH_GRADS; t++)
        snprintf(what[t], sizeof what[t], "%s: %s: %s", c->name, run, grad_names[t]);
    return st == FG_OK &&
           gpu_ok(fgh_cu(&gpu_dev, gpu_dev.cu->cuCtxSynchronize(), "backward kernels"), c->name) &&
           gpu_take(&p->d_q, x[FGH_DQ], c->dtype, what[FGH_DQ]) &&
           gpu_take(&p->d_k, x[FGH_DK], c->dtype, what[FGH_DK]) &&
           gpu_take(&p->d_v, x[FGH_DV], c->dtype, what[FGH_DV]);
}

/* The fast run, then the deterministic ones, each checked; the
 * deterministic ones also against the first of them, bit for bit. The first
 * deterministic run uses a workspace of our own, ws. */
static int run_schedules(fg_context *ctx, const struct gpu_case *c, struct expected *e,
                         fgh_problem *p, fg_backward_args *args, fgh_buffer *ws, int det_runs,
                         double worst[FGH_GRADS]) {
    const size_t *n = e->grads.n;
    /* dQ (B,Hq,Sq,D), dK (B,Hkv,Sk,D) and dV (B,Hkv,Sk,Dv): of the first deterministic run, and of the others */
    double *first[FGH_GRADS] = {NULL, NULL, NULL}, *x[FGH_GRADS] = {NULL, NULL, NULL};
    int ok = 1;
    for (int t = 0; t < FGH_GRADS; t++) {
        first[t] = malloc(n[t] * sizeof(double));
        x[t] = malloc(n[t] * sizeof(double));
        ok = ok && first[t] && x[t];
    }
    CHECK(ok, "%s: out of host memory", c->name);

    args->deterministic = 0;
    args->workspace = NULL, args->workspace_bytes = 0;
    ok = ok && run_backward(ctx, c, p, args, x, "fast run");
    if (ok) check_run(c, e, x, "fast run", worst);
    if (ok && p->spec.sinks) check_sinks(c, p, e, "fast run", 0);
    if (ok) check_aux(c, p, e, "fast run");

    args->deterministic = 1;
    if (ok) {
        size_t bytes = 0;
        fg_status st = fg_backward_workspace_size(ctx, &p->spec, args, &bytes);
        CHECK(st == FG_OK && bytes > 0, "%s: fg_backward_workspace_size: %s: %s (%zu bytes)",
              c->name, fg_status_name(st), fg_context_message(ctx), bytes);
        ok = st == FG_OK && bytes > 0 &&
             gpu_ok(fgh_buffer_alloc(&gpu_dev, ws, 1, 0, bytes, WORKSPACE_GUARD), "workspace");
    }
    for (int r = 0; ok && r < det_runs; r++) {
        char run[80];
        snprintf(run, sizeof run, "deterministic run %d/%d%s", r + 1, det_runs,
                 r == 0 ? " (own workspace)" : "");
        args->workspace = r == 0 ? (void *)(uintptr_t)ws->data : NULL;
        args->workspace_bytes = r == 0 ? ws->count : 0;
        double *const *into = r == 0 ? first : x;
        ok = run_backward(ctx, c, p, args, into, run);
        if (!ok) break;
        if (r == 0) workspace_guard_intact(c, ws);
        check_run(c, e, into, run, worst);
        if (p->spec.sinks) check_sinks(c, p, e, run, 1);
        check_aux(c, p, e, run);
        if (r == 0) continue;
        for (int t = 0; t < FGH_GRADS; t++) {
            size_t differ = fgh_bits_differ(x[t], first[t], n[t]);
            CHECK(differ == 0, "%s: %s: %zu of %zu %s elements differ from run 1", c->name, run,
                  differ, n[t], grad_names[t]);
        }
    }
    for (int t = 0; t < FGH_GRADS; t++) {
        free(first[t]);
        free(x[t]);
    }
    return ok;
}

static void print_result(const struct gpu_case *c, const double err[FGH_GRADS],
                         const double bound[FGH_GRADS], double seconds, int pass) {
    printf("%-26s %s d%-3d dv%-3d B%d H%d/%d Sq%-5d Sk%-5d %s dq %.2e/%.2e dk %.2e/%.2e dv %.2e/%.2e "
           "%5.1fs %s\n",
           c->name, c->dtype == FG_BF16 ? "bf16" : "fp16", c->d, c->dv ? c->dv : c->d, c->batch, c->hq, c->hkv, c->sq,
           c->sk, c->order == FGH_BSHD ? "bshd" : "bhsd", err[FGH_DQ], bound[FGH_DQ],
           err[FGH_DK], bound[FGH_DK], err[FGH_DV], bound[FGH_DV], seconds, pass ? "PASS" : "FAIL");
    fflush(stdout);
}

static void run_case(fg_context *ctx, const struct gpu_case *fc, uint64_t seed, int det_runs) {
    int failed_before = check_failed_count;
    double t0 = fgh_now_s();
    /* probe inputs are for the forward's keep-pattern check: random ones here */
    struct gpu_case case_copy = *fc;
    case_copy.probe = 0;
    const struct gpu_case *c = &case_copy;
    fgh_rng rng;
    fgh_rng_seed(&rng, seed);
    fgh_problem p;
    struct expected e = {0};
    fgh_buffer ws = {0};
    fg_backward_args args;
    double worst[FGH_GRADS] = {0.0, 0.0, 0.0}, bound[FGH_GRADS] = {NAN, NAN, NAN};

    int ok = case_problem_make(ctx, c, &rng, 1, &p) && expected_make(c, &p, &e);
    if (ok) memcpy(bound, e.grads.bound, sizeof bound);
    ok = ok && run_forward(ctx, c, &p, &args) && (!p.spec.sinks || expected_sinks(c, &p, &e)) &&
         run_schedules(ctx, c, &e, &p, &args, &ws, det_runs, worst);
    if (ok) {
        gpu_unchanged(&p.q.mem, "q after the backward");
        gpu_unchanged(&p.k.mem, "k after the backward");
        gpu_unchanged(&p.v.mem, "v after the backward");
        gpu_unchanged(&p.d_o.mem, "dO after the backward");
        gpu_unchanged(&p.o.mem, "o after the backward");
        gpu_unchanged(&p.lse, "lse after the backward");
    }
    if (!ok)
        for (int t = 0; t < FGH_GRADS; t++) worst[t] = NAN;
    print_result(c, worst, bound, fgh_now_s() - t0, ok && check_failed_count == failed_before);
    fgh_buffer_free(&gpu_dev, &ws);
    fgh_problem_free(&gpu_dev, &p);
    expected_free(&e);
}

/* ---- tuning --------------------------------------------------------------------------- */

/* Tune the backward of a few cases on this GPU, then run them again: the
 * tuned plans must check as the derived ones do. */
static void tune_and_rerun(fg_context *ctx, int det_runs) {
    static const char *const names[] = {"len 1000x1000", "dropout 0.1 causal tl", "gqa 8/2 d128",
                                        "butterfly 2 causal"};
    for (size_t n = 0; n < sizeof names / sizeof names[0]; n++) {
        const int i = gpu_tune_case(ctx, names[n], FG_PASS_BACKWARD);
        if (i >= 0) run_case(ctx, &gpu_cases[i], case_seed(i) + 1, det_runs);
    }
}

/* ---- main --------------------------------------------------------------------------- */

/* The compile log, counted by family: which backward kernels ran (with a
 * fresh cache, every one compiles) and the calls a family handed to the
 * next (on an H100, bwd_sm90a hands on the calls TMA cannot describe). */
static int compiled_sm90a, compiled_mma_sync, fallbacks;
static void count_compiles(const char *line, void *user) {
    (void)user;
    int sm90a = strstr(line, "compiled fg_bwd_sm90a_") != NULL;
    compiled_sm90a += sm90a;
    compiled_mma_sync += !sm90a && strstr(line, "compiled fg_bwd_") != NULL;
    if (strstr(line, "cannot take this call")) {
        fallbacks++;
        printf("  %s\n", line);
    }
}

int main(int argc, char **argv) {
    gpu_checks_attach(&check_passed_count, &check_failed_count);
    int quick = 0;
    const char *filter = NULL;
    if (!gpu_parse_args(argc, argv, &quick, &filter)) return 2;
    fg_context *ctx = gpu_test_open();
    if (ctx) {
        fg_context_set_compile_log(ctx, count_compiles, NULL);
        build_cases();
        int det_runs = quick ? DETERMINISTIC_RUNS_QUICK : DETERMINISTIC_RUNS;
        printf("per case: error/bound of dq, dk, dv, the worst of 1 fast and %d deterministic "
               "runs\n",
               det_runs);
        double t0 = fgh_now_s();
        int ran = 0;
        for (int i = 0; i < gpu_case_count; i++) {
            if (!case_selected(&gpu_cases[i], quick, filter) || !gpu_in_shard(i)) continue;
            run_case(ctx, &gpu_cases[i], case_seed(i), det_runs);
            ran++;
        }
        if (!quick && (!filter || strcmp(filter, "tune") == 0) && gpu_in_shard(0))
            tune_and_rerun(ctx, det_runs);
        printf("%d cases in %.1f s; backward kernels compiled: %d bwd_sm90a, %d bwd_sm80; %d "
               "fallback reasons\n", ran, fgh_now_s() - t0, compiled_sm90a, compiled_mma_sync,
               fallbacks);
    }
    gpu_test_close(ctx);
    return check_summary("gpu_backward");
}
