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
 * usage: gpu_backward [--quick] [name-filter]
 * --quick runs the cases marked quick (for compute-sanitizer). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "flashgen.h"
#include "reference/reference.h"
#include "tests/check.h"
#include "tests/gpu_cases.h"
#include "tests/gpu_common.h"

#define ABS_FLOOR 1e-6
#define ZERO_GRAD_FLOOR 1e-5
#define BOUND_FACTOR 3.0
#define DETERMINISTIC_RUNS 5
#define DETERMINISTIC_RUNS_QUICK 2
/* Poisoned bytes after a workspace of our own. */
#define WORKSPACE_GUARD 4096

enum { DQ = 0, DK = 1, DV = 2, GRADS = 3 };
static const char *const grad_names[GRADS] = {"dq", "dk", "dv"};

/* ---- what a case is checked against --------------------------------------------- */

struct expected {
    size_t n[GRADS];          /* elements of dq, dk, dv */
    double *ref[GRADS];       /* fp64 gradients, (B,H,S,D) */
    int zero[GRADS];          /* the fp64 gradient is identically 0 */
    double dv_rms;            /* rms of the fp64 dV: the yardstick where zero[] */
    double low_err[GRADS];    /* the naive path's error */
    double bound[GRADS];
    uint8_t *row_seen;        /* (Hq, Sq): the query sees some key */
    uint8_t *key_seen;        /* (Hkv, Sk): some query of a head sharing it sees the key */
};

static void expected_free(struct expected *e) {
    for (int g = 0; g < GRADS; g++) free(e->ref[g]);
    free(e->row_seen);
    free(e->key_seen);
    memset(e, 0, sizeof *e);
}

/* ‖x − ref‖/‖ref‖; where ref is identically 0, rms(x − ref) / alt_rms (0 if
 * x is 0 too; infinite if alt_rms is 0 and x is not). NaN in x gives NaN. */
static double grad_error(const double *x, const double *ref, size_t n, double alt_rms) {
    double num = 0.0, den = 0.0;
    for (size_t t = 0; t < n; t++) {
        double e = x[t] - ref[t];
        num += e * e;
        den += ref[t] * ref[t];
    }
    if (den > 0.0) return sqrt(num / den);
    if (num == 0.0) return 0.0;
    return alt_rms > 0.0 ? sqrt(num / (double)n) / alt_rms : isnan(num) ? NAN : INFINITY;
}

/* Which rows see a key and which keys some row sees (mask and sparsity). */
static int visibility(const struct gpu_case *c, const ref_problem *p, struct expected *e) {
    int group = c->hq / c->hkv;
    e->row_seen = calloc((size_t)c->hq * c->sq, 1);
    e->key_seen = calloc((size_t)c->hkv * c->sk, 1);
    if (!e->row_seen || !e->key_seen) return 0;
    for (int h = 0; h < c->hq; h++)
        for (int64_t i = 0; i < c->sq; i++)
            for (int64_t j = 0; j < c->sk; j++)
                if (ref_visible(p, h, i, j)) {
                    e->row_seen[(size_t)h * c->sq + (size_t)i] = 1;
                    e->key_seen[(size_t)(h / group) * c->sk + (size_t)j] = 1;
                }
    return 1;
}

/* The fp64 gradients, the naive path's errors against them and the bounds. */
static int expected_make(const struct gpu_case *c, const ref_problem *p, const struct inputs *in,
                         struct expected *e) {
    memset(e, 0, sizeof *e);
    e->n[DQ] = in->nq;
    e->n[DK] = e->n[DV] = in->nk;
    float *low[GRADS] = {NULL, NULL, NULL};
    double *lowd = malloc(in->nq > in->nk ? in->nq * sizeof(double) : in->nk * sizeof(double));
    int ok = lowd != NULL;
    for (int g = 0; g < GRADS; g++) {
        e->ref[g] = malloc(e->n[g] * sizeof(double));
        low[g] = malloc(e->n[g] * sizeof(float));
        ok = ok && e->ref[g] && low[g];
    }
    ok = ok && visibility(c, p, e);
    CHECK(ok, "%s: out of host memory", c->name);
    if (ok) {
        ok = ref_attention_backward_fp64(p, in->q, in->k, in->v, in->d_o, e->ref[DQ], e->ref[DK],
                                         e->ref[DV]) == 0 &&
             ref_attention_backward_lowp(p, c->dtype, in->q, in->k, in->v, in->d_o, low[DQ],
                                         low[DK], low[DV]) == 0;
        CHECK(ok, "%s: reference failed (invalid problem or out of memory)", c->name);
    }
    if (ok) {
        double ss = 0.0;
        for (size_t t = 0; t < e->n[DV]; t++) ss += e->ref[DV][t] * e->ref[DV][t];
        e->dv_rms = sqrt(ss / (double)e->n[DV]);
        for (int g = 0; g < GRADS; g++) {
            e->zero[g] = 1;
            for (size_t t = 0; t < e->n[g] && e->zero[g]; t++) e->zero[g] = e->ref[g][t] == 0.0;
            for (size_t t = 0; t < e->n[g]; t++) lowd[t] = (double)low[g][t];
            e->low_err[g] = grad_error(lowd, e->ref[g], e->n[g], e->dv_rms);
            e->bound[g] = BOUND_FACTOR * e->low_err[g] + (e->zero[g] ? ZERO_GRAD_FLOOR : ABS_FLOOR);
        }
    }
    for (int g = 0; g < GRADS; g++) free(low[g]);
    free(lowd);
    return ok;
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
static void check_run(const struct gpu_case *c, const struct expected *e, double *const x[GRADS],
                      const char *run, double worst[GRADS]) {
    for (int g = 0; g < GRADS; g++) {
        double err = grad_error(x[g], e->ref[g], e->n[g], e->dv_rms);
        CHECK(err <= e->bound[g], "%s: %s: %s error %.3e exceeds %.3e (naive %.3e%s)",
              c->name, run, grad_names[g], err, e->bound[g], e->low_err[g],
              e->zero[g] ? ", fp64 gradient identically 0: rms over rms(dV)" : "");
        if (!isnan(worst[g]) && !(err <= worst[g])) worst[g] = err;
    }
    size_t first = 0, bad, per_batch = (size_t)c->hq * c->sq;
    bad = nonzero_unseen_rows(x[DQ], (size_t)c->batch * per_batch, c->d, e->row_seen, per_batch,
                              &first);
    CHECK(bad == 0, "%s: %s: %zu dq rows of queries that see no key are not 0 "
          "(first: b%zu h%zu query %zu)", c->name, run, bad, first / per_batch,
          first % per_batch / (size_t)c->sq, first % (size_t)c->sq);
    per_batch = (size_t)c->hkv * c->sk;
    for (int g = DK; g <= DV; g++) {
        bad = nonzero_unseen_rows(x[g], (size_t)c->batch * per_batch, c->d, e->key_seen, per_batch,
                                  &first);
        CHECK(bad == 0, "%s: %s: %zu %s rows of keys no query sees are not 0 "
              "(first: b%zu kv head %zu key %zu)", c->name, run, bad, grad_names[g],
              first / per_batch, first % per_batch / (size_t)c->sk, first % (size_t)c->sk);
    }
}

/* Elements that differ bit for bit. */
static size_t bits_differ(const double *a, const double *b, size_t n) {
    size_t k = 0;
    for (size_t t = 0; t < n; t++) k += memcmp(&a[t], &b[t], sizeof a[t]) != 0;
    return k;
}

/* ---- one case ----------------------------------------------------------------------- */

struct device_case {
    struct dev_tensor q, k, v, o, d_o, dq, dk, dv;
    CUdeviceptr lse;
    size_t lse_floats;   /* LEAD + rows + GUARD */
    float *lse_host;     /* lse as the forward left it */
    CUdeviceptr ws;      /* a workspace of our own, WORKSPACE_GUARD poisoned bytes after it */
    size_t ws_bytes;
};

static void device_case_free(struct device_case *g) {
    struct dev_tensor *t[] = {&g->q, &g->k, &g->v, &g->o, &g->d_o, &g->dq, &g->dk, &g->dv};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) dev_tensor_free(t[i]);
    if (g->lse) gpu_cu->cuMemFree(g->lse);
    if (g->ws) gpu_cu->cuMemFree(g->ws);
    free(g->lse_host);
    memset(g, 0, sizeof *g);
}

/* Allocates and uploads q, k, v, dO; runs the forward for o and lse, and
 * keeps a copy of what it wrote. */
static int run_forward(fg_context *ctx, const struct gpu_case *c, const struct inputs *in,
                       const fg_layout *layout, struct device_case *g, fg_backward_args *args) {
    size_t rows = (size_t)c->batch * c->hq * c->sq;
    g->lse_floats = LEAD + rows + GUARD;
    g->lse_host = malloc(g->lse_floats * sizeof(float));
    CHECK(g->lse_host != NULL, "out of host memory");
    int ok = g->lse_host && case_tensor_alloc(&g->q, c, c->sq, c->hq) &&
             case_tensor_alloc(&g->k, c, c->sk, c->hkv) &&
             case_tensor_alloc(&g->v, c, c->sk, c->hkv) &&
             case_tensor_alloc(&g->o, c, c->sq, c->hq) &&
             case_tensor_alloc(&g->d_o, c, c->sq, c->hq) &&
             case_tensor_alloc(&g->dq, c, c->sq, c->hq) &&
             case_tensor_alloc(&g->dk, c, c->sk, c->hkv) &&
             case_tensor_alloc(&g->dv, c, c->sk, c->hkv) &&
             cu_ok(gpu_cu->cuMemAlloc(&g->lse, g->lse_floats * sizeof(float)), "cuMemAlloc lse") &&
             dev_tensor_upload(&g->q, in->q, c->dtype) &&
             dev_tensor_upload(&g->k, in->k, c->dtype) &&
             dev_tensor_upload(&g->v, in->v, c->dtype) &&
             dev_tensor_upload(&g->d_o, in->d_o, c->dtype) &&
             dev_tensor_poison(&g->o, "poison o") &&
             cu_ok(gpu_cu->cuMemsetD8(g->lse, 0xFF, g->lse_floats * sizeof(float)), "poison lse");
    if (!ok) return 0;
    memset(args, 0, sizeof *args);
    /* the backward needs lse: passed even where the forward test's case has none */
    float *lse = (float *)(uintptr_t)(g->lse + LEAD * sizeof(float));
    args->forward = case_forward_args(c, g->q.t, g->k.t, g->v.t, g->o.t, lse, layout);
    args->d_o = g->d_o.t, args->d_q = g->dq.t, args->d_k = g->dk.t, args->d_v = g->dv.t;
    fg_spec spec = case_spec(c);
    fg_status st = fg_forward(ctx, &spec, &args->forward);
    CHECK(st == FG_OK, "%s: fg_forward: %s: %s", c->name, fg_status_name(st),
          fg_context_message(ctx));
    return st == FG_OK && cu_ok(gpu_cu->cuCtxSynchronize(), "forward kernel") &&
           dev_tensor_pull(&g->o, "download o") &&
           cu_ok(gpu_cu->cuMemcpyDtoH(g->lse_host, g->lse, g->lse_floats * sizeof(float)),
                 "download lse");
}

/* The guard after our own workspace still holds the poison. */
static int workspace_guard_intact(const struct gpu_case *c, const struct device_case *g) {
    unsigned char guard[WORKSPACE_GUARD];
    if (!cu_ok(gpu_cu->cuMemcpyDtoH(guard, g->ws + g->ws_bytes, sizeof guard),
               "download workspace guard"))
        return 0;
    size_t stray = 0;
    for (size_t t = 0; t < sizeof guard; t++) stray += guard[t] != 0xFF;
    CHECK(stray == 0, "%s: %zu bytes written past the %zu-byte workspace", c->name, stray,
          g->ws_bytes);
    return stray == 0;
}

/* Poisons dq, dk, dv, runs one backward and downloads them into x[]. */
static int run_backward(fg_context *ctx, const struct gpu_case *c, struct device_case *g,
                        const fg_backward_args *args, double *const x[GRADS], const char *run) {
    if (!dev_tensor_poison(&g->dq, "poison dq") || !dev_tensor_poison(&g->dk, "poison dk") ||
        !dev_tensor_poison(&g->dv, "poison dv"))
        return 0;
    fg_spec spec = case_spec(c);
    fg_status st = fg_backward(ctx, &spec, args);
    CHECK(st == FG_OK, "%s: %s: fg_backward: %s: %s", c->name, run, fg_status_name(st),
          fg_context_message(ctx));
    char what[GRADS][160];
    for (int t = 0; t < GRADS; t++)
        snprintf(what[t], sizeof what[t], "%s: %s: %s", c->name, run, grad_names[t]);
    return st == FG_OK && cu_ok(gpu_cu->cuCtxSynchronize(), "backward kernels") &&
           dev_tensor_take(&g->dq, x[DQ], c->dtype, what[DQ]) &&
           dev_tensor_take(&g->dk, x[DK], c->dtype, what[DK]) &&
           dev_tensor_take(&g->dv, x[DV], c->dtype, what[DV]);
}

/* The fast run, then the deterministic ones, each checked; the
 * deterministic ones also against the first of them, bit for bit. */
static int run_schedules(fg_context *ctx, const struct gpu_case *c, const struct expected *e,
                         struct device_case *g, fg_backward_args *args, int det_runs,
                         double worst[GRADS]) {
    double *first[GRADS] = {NULL, NULL, NULL}, *x[GRADS] = {NULL, NULL, NULL};
    int ok = 1;
    for (int t = 0; t < GRADS; t++) {
        first[t] = malloc(e->n[t] * sizeof(double));
        x[t] = malloc(e->n[t] * sizeof(double));
        ok = ok && first[t] && x[t];
    }
    CHECK(ok, "%s: out of host memory", c->name);

    args->deterministic = 0;
    args->workspace = NULL, args->workspace_bytes = 0;
    ok = ok && run_backward(ctx, c, g, args, x, "fast run");
    if (ok) check_run(c, e, x, "fast run", worst);

    args->deterministic = 1;
    if (ok) {
        fg_spec spec = case_spec(c);
        fg_status st = fg_backward_workspace_size(ctx, &spec, args, &g->ws_bytes);
        CHECK(st == FG_OK && g->ws_bytes > 0, "%s: fg_backward_workspace_size: %s: %s (%zu bytes)",
              c->name, fg_status_name(st), fg_context_message(ctx), g->ws_bytes);
        size_t alloc = g->ws_bytes + WORKSPACE_GUARD;
        ok = st == FG_OK && g->ws_bytes > 0 &&
             cu_ok(gpu_cu->cuMemAlloc(&g->ws, alloc), "cuMemAlloc workspace") &&
             cu_ok(gpu_cu->cuMemsetD8(g->ws, 0xFF, alloc), "poison workspace");
    }
    for (int r = 0; ok && r < det_runs; r++) {
        char run[80];
        snprintf(run, sizeof run, "deterministic run %d/%d%s", r + 1, det_runs,
                 r == 0 ? " (own workspace)" : "");
        args->workspace = r == 0 ? (void *)(uintptr_t)g->ws : NULL;
        args->workspace_bytes = r == 0 ? g->ws_bytes : 0;
        double *const *into = r == 0 ? first : x;
        ok = run_backward(ctx, c, g, args, into, run);
        if (!ok) break;
        if (r == 0) workspace_guard_intact(c, g);
        check_run(c, e, into, run, worst);
        if (r == 0) continue;
        for (int t = 0; t < GRADS; t++) {
            size_t differ = bits_differ(x[t], first[t], e->n[t]);
            CHECK(differ == 0, "%s: %s: %zu of %zu %s elements differ from run 1", c->name, run,
                  differ, e->n[t], grad_names[t]);
        }
    }
    for (int t = 0; t < GRADS; t++) {
        free(first[t]);
        free(x[t]);
    }
    return ok;
}

static void print_result(const struct gpu_case *c, const double err[GRADS],
                         const double bound[GRADS], double seconds, int pass) {
    printf("%-26s %s d%-3d B%d H%d/%d Sq%-5d Sk%-5d %s dq %.2e/%.2e dk %.2e/%.2e dv %.2e/%.2e "
           "%5.1fs %s\n",
           c->name, c->dtype == FG_BF16 ? "bf16" : "fp16", c->d, c->batch, c->hq, c->hkv, c->sq,
           c->sk, c->order == ORDER_BSHD ? "bshd" : "bhsd", err[DQ], bound[DQ], err[DK],
           bound[DK], err[DV], bound[DV], seconds, pass ? "PASS" : "FAIL");
    fflush(stdout);
}

static void run_case(fg_context *ctx, const struct gpu_case *fc, uint64_t seed, int det_runs) {
    int failed_before = check_failed_count;
    double t0 = now_s();
    /* probe inputs are for the forward's keep-pattern check: random ones here */
    struct gpu_case case_copy = *fc;
    case_copy.probe = 0;
    const struct gpu_case *c = &case_copy;
    rng_seed(seed);
    struct inputs in = {0};
    struct expected e = {0};
    struct device_case g = {0};
    fg_backward_args args;
    uint8_t *mask = NULL;
    fg_layout *layout = NULL;
    double worst[GRADS] = {0.0, 0.0, 0.0}, bound[GRADS] = {NAN, NAN, NAN};

    int ok = inputs_make(c, &in);
    if (ok && c->sparsity == FG_SPARSE_LAYOUT) {
        fg_status st = FG_ERR_OUT_OF_MEMORY;
        if ((mask = random_layout(c)))
            st = fg_layout_create(ctx, mask, layout_heads(c), blocks_q(c), blocks_k(c), &layout);
        CHECK(st == FG_OK, "%s: fg_layout_create: %s", c->name, fg_context_message(ctx));
        ok = st == FG_OK;
    }
    /* dO after the layout: q, k, v and the layout are those of the forward test */
    ok = ok && inputs_add_d_o(c, &in);
    ref_problem p = case_problem(c, mask);
    ok = ok && expected_make(c, &p, &in, &e);
    if (ok) memcpy(bound, e.bound, sizeof bound);
    ok = ok && run_forward(ctx, c, &in, layout, &g, &args) &&
         run_schedules(ctx, c, &e, &g, &args, det_runs, worst);
    if (ok) {
        dev_tensor_unchanged(&g.q, "q after the backward");
        dev_tensor_unchanged(&g.k, "k after the backward");
        dev_tensor_unchanged(&g.v, "v after the backward");
        dev_tensor_unchanged(&g.d_o, "dO after the backward");
        dev_tensor_unchanged(&g.o, "o after the backward");
        float *now = malloc(g.lse_floats * sizeof(float));
        CHECK(now != NULL, "out of host memory");
        if (now && cu_ok(gpu_cu->cuMemcpyDtoH(now, g.lse, g.lse_floats * sizeof(float)),
                         "download lse"))
            CHECK(memcmp(now, g.lse_host, g.lse_floats * sizeof(float)) == 0,
                  "%s: lse changed by the backward", c->name);
        free(now);
    }
    if (!ok)
        for (int t = 0; t < GRADS; t++) worst[t] = NAN;
    print_result(c, worst, bound, now_s() - t0, ok && check_failed_count == failed_before);
    device_case_free(&g);
    fg_layout_destroy(layout);
    free(mask);
    expected_free(&e);
    inputs_free(&in);
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

int main(int argc, char **argv) {
    gpu_checks_attach(&check_passed_count, &check_failed_count);
    int quick = 0;
    const char *filter = NULL;
    if (!gpu_parse_args(argc, argv, &quick, &filter)) return 2;
    CUdevice dev = 0;
    CUcontext cuctx = NULL;
    fg_context *ctx = gpu_test_open(&dev, &cuctx);
    if (ctx) {
        build_cases();
        int det_runs = quick ? DETERMINISTIC_RUNS_QUICK : DETERMINISTIC_RUNS;
        printf("per case: error/bound of dq, dk, dv, the worst of 1 fast and %d deterministic "
               "runs\n",
               det_runs);
        double t0 = now_s();
        int ran = 0;
        for (int i = 0; i < gpu_case_count; i++) {
            if (!case_selected(&gpu_cases[i], quick, filter)) continue;
            run_case(ctx, &gpu_cases[i], case_seed(i), det_runs);
            ran++;
        }
        if (!quick && (!filter || strcmp(filter, "tune") == 0)) tune_and_rerun(ctx, det_runs);
        printf("%d cases in %.1f s\n", ran, now_s() - t0);
    }
    gpu_test_close(ctx, dev, cuctx);
    return check_summary("gpu_backward");
}
