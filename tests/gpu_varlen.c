/* Packed sequences (spec.varlen) on a live GPU against each sequence's fp64
 * reference.
 *
 * Every case packs `batch` sequences of their own lengths (0, 1 and lengths
 * that are no multiple of any tile among them) into (total, H, D) tensors,
 * optionally with rows after the last sequence, and keys a sequence holds
 * but does not see (seqused_k); those rows, which no result may depend on,
 * hold NaN (keys and values; queries and dO after the last sequence). One
 * fg_forward, then fg_backward once with
 * the fast schedule and twice with the deterministic one. Each sequence is
 * then checked as a problem of its own (one batch, its lengths, dropout's
 * batch index b, a layout's blocks those of the call) with the bounds of
 * harness/compare.h:
 *   - O and lse of its rows (O exactly 0 and lse -inf where it sees no key);
 *   - dQ, dK and dV of its rows;
 * and the packed tensors as a whole:
 *   - dQ rows after the last sequence, dK and dV rows no query sees (past
 *     seqused_k, of sequences without queries, after the last sequence)
 *     exactly 0; every gradient element written and finite;
 *   - nothing written outside the tensors and lse (guard zones), nor into
 *     O's rows outside the sequences (they keep their poison);
 *   - the deterministic runs bitwise identical.
 * Sequences of one key, whose dQ and dK are exactly 0 in fp64 (dS = P∘(dP −
 * D) cancels), come without dropout only: with dropout O = s·V is rounded to
 * the dtype, and D = rowsum(dO∘O) taken from it leaves dS at that rounding's
 * size, beyond the zero-gradient floor of compare.h (which models fp32
 * rounding alone). The dense suite's one-key cases have no dropout either.
 * Then the checks that only a live GPU can make: cu_seqlens in host memory
 * is refused, and with FLASHGEN_DEBUG=1 so are decreasing cu_seqlens,
 * sequences longer than the maxima, ends past the tensors and seqused_k
 * past a sequence's keys, each naming the argument.
 *
 * usage: gpu_varlen [--quick] [name-filter]
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
#include "tests/gpu_common.h"

#define MAX_SEQS 16

typedef struct varlen_case {
    const char *name;
    fg_dtype dtype;
    int d;
    fg_mask mask;
    fg_causal_align align;
    int window_left, window_right;
    float dropout_p;
    int hq, hkv;
    int batch;
    int len_q[MAX_SEQS], len_k[MAX_SEQS]; /* rows of each sequence */
    int used_k[MAX_SEQS];                 /* seqused_k; all -1: none given */
    int tail_q, tail_k;                   /* rows after the last sequence */
    fg_sparsity sparsity;
    int block_q, block_k, factors;
    int quick;
} varlen_case;

#define NO_USED {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1}
#define DENSE FG_SPARSE_NONE, 0, 0, 0
#define BR FG_ALIGN_BOTTOM_RIGHT
#define TL FG_ALIGN_TOP_LEFT

static const varlen_case cases[] = {
    {"mixed lengths", FG_FP16, 64, FG_MASK_NONE, BR, -1, -1, 0.f, 2, 2, 6,
     {37, 0, 1, 300, 129, 64}, {37, 0, 1, 300, 129, 64}, NO_USED, 0, 0, DENSE, 0},
    {"causal br gqa", FG_BF16, 128, FG_MASK_CAUSAL, BR, -1, -1, 0.f, 4, 2, 4,
     {1, 77, 200, 0}, {150, 77, 333, 5}, NO_USED, 0, 0, DENSE, 1},
    {"causal tl", FG_FP16, 96, FG_MASK_CAUSAL, TL, -1, -1, 0.f, 3, 3, 3,
     {190, 65, 17}, {100, 65, 40}, NO_USED, 0, 0, DENSE, 0},
    {"window", FG_BF16, 64, FG_MASK_WINDOW, BR, 37, 5, 0.f, 2, 1, 3,
     {250, 1, 90}, {260, 30, 90}, NO_USED, 0, 0, DENSE, 0},
    {"dropout causal", FG_FP16, 64, FG_MASK_CAUSAL, TL, -1, -1, 0.1f, 2, 2, 3,
     {130, 47, 256}, {130, 47, 256}, NO_USED, 0, 0, DENSE, 0},
    {"seqused and tail", FG_BF16, 64, FG_MASK_CAUSAL, BR, -1, -1, 0.f, 2, 2, 4,
     {50, 0, 120, 33}, {80, 40, 130, 33}, {60, 20, 0, 33}, 7, 19, DENSE, 1},
    {"butterfly 64", FG_FP16, 64, FG_MASK_CAUSAL, TL, -1, -1, 0.f, 2, 2, 3,
     {300, 100, 65}, {300, 100, 65}, NO_USED, 0, 0, FG_SPARSE_BUTTERFLY, 64, 64, 2, 0},
    {"layout 64x128", FG_BF16, 128, FG_MASK_NONE, BR, -1, -1, 0.f, 2, 2, 2,
     {200, 333}, {256, 129}, NO_USED, 0, 0, FG_SPARSE_LAYOUT, 64, 128, 0, 0},
    {"d33 dropout gqa", FG_FP16, 33, FG_MASK_NONE, BR, -1, -1, 0.2f, 6, 2, 5,
     {19, 1, 0, 140, 65}, {23, 70, 9, 140, 2}, NO_USED, 3, 0, DENSE, 0},
    {"all empty", FG_BF16, 64, FG_MASK_NONE, BR, -1, -1, 0.f, 2, 1, 3,
     {0, 0, 0}, {0, 0, 0}, NO_USED, 5, 9, DENSE, 1},
    {"long among short", FG_BF16, 64, FG_MASK_CAUSAL, BR, -1, -1, 0.f, 2, 2, 9,
     {1000, 3, 1, 7, 12, 2, 30, 5, 9}, {1000, 3, 1, 7, 12, 2, 30, 5, 9}, NO_USED, 0, 0, DENSE, 0},
    {"decode", FG_FP16, 128, FG_MASK_CAUSAL, BR, -1, -1, 0.f, 8, 2, 4,
     {1, 1, 1, 1}, {1000, 17, 1, 300}, NO_USED, 0, 0, DENSE, 0},
    /* more rows after the last sequence than the longest sequence's key blocks cover */
    {"long tail", FG_BF16, 64, FG_MASK_CAUSAL, TL, -1, -1, 0.f, 2, 1, 2,
     {4, 7}, {5, 3}, NO_USED, 3, 300, DENSE, 1},
};
#define CASE_COUNT ((int)(sizeof cases / sizeof cases[0]))

static int max_of(const int *x, int n) {
    int m = 0;
    for (int i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

/* The packed call: its problem (one batch of total rows holds the packed
 * tensors), the arrays on the device, and where each sequence starts. */
typedef struct packed {
    const varlen_case *c;
    fg_spec spec;
    fgh_problem p;
    int cu_q[MAX_SEQS + 1], cu_k[MAX_SEQS + 1], used[MAX_SEQS];
    int total_q, total_k, max_q, max_k;
    fgh_buffer d_cu_q, d_cu_k, d_used;
} packed;

/* Rows [r0, r1) of every head of a (1, H, total, D) array set to NaN. */
static void poison_rows(float *x, int heads, int total, int r0, int r1, int d) {
    for (int h = 0; h < heads; h++)
        for (size_t i = ((size_t)h * total + r0) * d; i < ((size_t)h * total + r1) * d; i++)
            x[i] = NAN;
}

static int packed_make(fg_context *ctx, const varlen_case *c, fgh_rng *rng, packed *k) {
    memset(k, 0, sizeof *k);
    k->c = c;
    for (int b = 0; b < c->batch; b++) {
        k->cu_q[b + 1] = k->cu_q[b] + c->len_q[b];
        k->cu_k[b + 1] = k->cu_k[b] + c->len_k[b];
        k->used[b] = c->used_k[0] < 0 ? c->len_k[b] : c->used_k[b];
    }
    k->total_q = k->cu_q[c->batch] + c->tail_q;
    k->total_k = k->cu_k[c->batch] + c->tail_k;
    k->max_q = max_of(c->len_q, c->batch);
    k->max_k = max_of(c->len_k, c->batch);
    fg_spec s = fg_spec_default(c->d, c->dtype);
    s.mask = c->mask, s.dropout = c->dropout_p > 0.f, s.varlen = 1;
    s.sparsity = c->sparsity, s.sparse_block_q = c->block_q, s.sparse_block_k = c->block_k;
    s.butterfly_factors = c->factors;
    k->spec = s;
    fgh_shape sh = {.batch = 1, .heads_q = c->hq, .heads_kv = c->hkv, .seqlen_q = k->total_q,
                    .seqlen_k = k->total_k, .align = c->align, .window_left = c->window_left,
                    .window_right = c->window_right, .dropout_p = c->dropout_p,
                    .seed = 0x5eed0000u + (uint64_t)c->batch, .offset = 1234};
    fgh_placement pl = {.order = FGH_BSHD, .pad = 8, .lead = LEAD, .guard = GUARD};
    if (!gpu_ok(fgh_problem_init(&k->p, &s, &sh, &pl, 1), c->name)) return 0;
    fgh_fill_normal(rng, k->p.host.q, k->p.nq, c->dtype);
    fgh_fill_normal(rng, k->p.host.k, k->p.nk, c->dtype);
    fgh_fill_normal(rng, k->p.host.v, k->p.nk, c->dtype);
    fgh_fill_normal(rng, k->p.host.d_o, k->p.nq, c->dtype);
    for (int b = 0; b <= c->batch; b++) { /* keys no query sees */
        int r0 = b < c->batch ? k->cu_k[b] + k->used[b] : k->cu_k[c->batch];
        int r1 = b < c->batch ? k->cu_k[b + 1] : k->total_k;
        poison_rows(k->p.host.k, c->hkv, k->total_k, r0, r1, c->d);
        poison_rows(k->p.host.v, c->hkv, k->total_k, r0, r1, c->d);
    }
    poison_rows(k->p.host.q, c->hq, k->total_q, k->cu_q[c->batch], k->total_q, c->d);
    poison_rows(k->p.host.d_o, c->hq, k->total_q, k->cu_q[c->batch], k->total_q, c->d);
    if (c->sparsity != FG_SPARSE_NONE) { /* blocks of the longest sequences */
        k->p.blocks_q = (k->max_q + c->block_q - 1) / c->block_q;
        k->p.blocks_k = (k->max_k + c->block_k - 1) / c->block_k;
    }
    if (c->sparsity == FG_SPARSE_LAYOUT) {
        uint8_t *mask = fgh_random_layout(rng, c->hq, k->p.blocks_q, k->p.blocks_k, 0.6);
        if (!gpu_ok(mask != NULL, "layout") || !gpu_ok(fgh_problem_set_layout(&k->p, ctx, mask, c->hq),
                                                       c->name))
            return 0;
    }
    return gpu_ok(fgh_problem_upload(&gpu_dev, &k->p), c->name) &&
           gpu_upload_ints(&k->d_cu_q, k->cu_q, c->batch + 1) &&
           gpu_upload_ints(&k->d_cu_k, k->cu_k, c->batch + 1) &&
           (c->used_k[0] < 0 || gpu_upload_ints(&k->d_used, k->used, c->batch));
}

static void packed_free(packed *k) {
    fgh_problem_free(&gpu_dev, &k->p);
    fgh_buffer_free(&gpu_dev, &k->d_cu_q);
    fgh_buffer_free(&gpu_dev, &k->d_cu_k);
    fgh_buffer_free(&gpu_dev, &k->d_used);
}

static fg_forward_args packed_forward_args(const packed *k) {
    fg_forward_args a = fgh_forward_args(&k->p, 1);
    a.batch = k->c->batch;
    a.seqlen_q = k->max_q, a.seqlen_k = k->max_k;
    a.cu_seqlens_q = (const int32_t *)(uintptr_t)k->d_cu_q.data;
    a.cu_seqlens_k = (const int32_t *)(uintptr_t)k->d_cu_k.data;
    a.seqused_k = k->d_used.data ? (const int32_t *)(uintptr_t)k->d_used.data : NULL;
    a.total_q = k->total_q, a.total_k = k->total_k;
    return a;
}

/* Rows [r0, r0 + n) of every head of a packed (1, H, total, D) array into
 * dst (1, H, n, D). */
static void rows_of(double *dst, const double *src, int heads, int total, int r0, int n, int d) {
    for (int h = 0; h < heads; h++)
        memcpy(dst + (size_t)h * n * d, src + ((size_t)h * total + r0) * d, (size_t)n * d * sizeof *dst);
}
static void rows_of_f(float *dst, const float *src, int heads, int total, int r0, int n, int d) {
    for (int h = 0; h < heads; h++)
        memcpy(dst + (size_t)h * n * d, src + ((size_t)h * total + r0) * d, (size_t)n * d * sizeof *dst);
}

/* Sequence b as a problem of its own on the host: its rows of the packed
 * inputs, its lengths, dropout's batch index b, the call's layout. */
static int sequence_problem(const packed *k, int b, fgh_problem *sp) {
    const varlen_case *c = k->c;
    fg_spec s = k->spec;
    s.varlen = 0;
    fgh_shape sh = k->p.shape;
    sh.seqlen_q = c->len_q[b], sh.seqlen_k = k->used[b], sh.batch0 = b;
    fgh_placement pl = {0};
    if (!gpu_ok(fgh_problem_init(sp, &s, &sh, &pl, 1), c->name)) return 0;
    rows_of_f(sp->host.q, k->p.host.q, c->hq, k->total_q, k->cu_q[b], c->len_q[b], c->d);
    rows_of_f(sp->host.d_o, k->p.host.d_o, c->hq, k->total_q, k->cu_q[b], c->len_q[b], c->d);
    rows_of_f(sp->host.k, k->p.host.k, c->hkv, k->total_k, k->cu_k[b], k->used[b], c->d);
    rows_of_f(sp->host.v, k->p.host.v, c->hkv, k->total_k, k->cu_k[b], k->used[b], c->d);
    sp->layout_mask = k->p.layout_mask; /* borrowed: dropped before the free */
    sp->layout_heads = k->p.layout_heads;
    sp->blocks_q = k->p.blocks_q, sp->blocks_k = k->p.blocks_k;
    return 1;
}

static void sequence_free(fgh_problem *sp) {
    sp->layout_mask = NULL;
    fgh_problem_free(&gpu_dev, sp);
}

/* Elements of rows [r0, r1) of every head of a (1, H, total, D) array that
 * are not 0. */
static size_t nonzero_rows(const double *x, int heads, int total, int r0, int r1, int d) {
    size_t n = 0;
    for (int h = 0; h < heads; h++)
        for (size_t i = ((size_t)h * total + r0) * d; i < ((size_t)h * total + r1) * d; i++)
            n += x[i] != 0.0;
    return n;
}

/* ---- forward ---- */

static void check_forward(fg_context *ctx, packed *k, double *worst) {
    const varlen_case *c = k->c;
    fg_forward_args a = packed_forward_args(k);
    fg_status st = fg_forward(ctx, &k->spec, &a);
    CHECK(st == FG_OK, "%s: fg_forward: %s: %s", c->name, fg_status_name(st), fg_context_message(ctx));
    double *o = malloc((k->p.nq ? k->p.nq : 1) * sizeof *o);
    fgh_written w;
    if (st || !o || !gpu_ok(fgh_cu(&gpu_dev, gpu_dev.cu->cuCtxSynchronize(), "kernel"), c->name) ||
        !gpu_ok(fgh_tensor_take(&gpu_dev, &k->p.o, o, c->dtype, &w), c->name) ||
        !gpu_ok(fgh_buffer_pull(&gpu_dev, &k->p.lse), "lse")) {
        free(o);
        return;
    }
    CHECK(w.stray == 0, "%s: %zu elements written outside o", c->name, w.stray);
    CHECK(fgh_buffer_zones_unpoisoned(&k->p.lse, 0) == 0, "%s: floats written outside lse", c->name);
    /* O rows after the last sequence are not the call's: never written */
    size_t tail = (size_t)c->hq * c->tail_q * c->d;
    CHECK(w.nonfinite == tail, "%s: %zu elements of o not finite or not written, %zu expected "
          "(the rows after the last sequence)", c->name, w.nonfinite, tail);
    const float *lse = fgh_buffer_at(&k->p.lse, LEAD);
    for (int b = 0; b < c->batch; b++) {
        int n = c->len_q[b];
        if (n == 0) continue;
        fgh_problem sp;
        double *ob = malloc((size_t)c->hq * n * c->d * sizeof *ob);
        float *lb = malloc((size_t)c->hq * n * sizeof *lb);
        if (!ob || !lb || !sequence_problem(k, b, &sp)) {
            free(ob), free(lb);
            CHECK(0, "%s: out of host memory", c->name);
            continue;
        }
        rows_of(ob, o, c->hq, k->total_q, k->cu_q[b], n, c->d);
        rows_of_f(lb, lse, c->hq, k->total_q, k->cu_q[b], n, 1);
        if (k->used[b] == 0) { /* no key: O = 0, lse = -inf */
            size_t bad = nonzero_rows(ob, c->hq, n, 0, n, c->d), bad_lse = 0;
            for (int i = 0; i < c->hq * n; i++) bad_lse += lb[i] != -INFINITY;
            CHECK(bad == 0 && bad_lse == 0, "%s: sequence %d sees no key: %zu O values not 0, %zu "
                  "lse not -inf", c->name, b, bad, bad_lse);
        } else {
            fgh_forward_check r;
            if (gpu_ok(fgh_check_forward(&sp, ob, lb, &r), c->name)) {
                CHECK(r.err <= r.bound, "%s: sequence %d: O error %.3e exceeds %.3e", c->name, b,
                      r.err, r.bound);
                CHECK(r.lse_bad == 0 && r.lse_bad_inf == 0 && r.zero_rows_bad == 0,
                      "%s: sequence %d: %zu lse off (worst %g), %zu lse not -inf, %zu O rows not 0",
                      c->name, b, r.lse_bad, r.lse_worst, r.lse_bad_inf, r.zero_rows_bad);
                if (r.err / r.bound > *worst) *worst = r.err / r.bound;
            }
        }
        free(ob), free(lb);
        sequence_free(&sp);
    }
    free(o);
}

/* ---- backward ---- */

typedef struct expectations {
    int have[MAX_SEQS];
    fgh_backward_expect e[MAX_SEQS];
} expectations;

static void expect_all(const packed *k, expectations *x) {
    memset(x, 0, sizeof *x);
    for (int b = 0; b < k->c->batch; b++) {
        if (k->c->len_q[b] == 0 || k->used[b] == 0) continue;
        fgh_problem sp;
        if (!sequence_problem(k, b, &sp)) continue;
        x->have[b] = gpu_ok(fgh_expect_backward(&sp, &x->e[b]), k->c->name);
        sequence_free(&sp);
    }
}

static void expect_free_all(expectations *x) {
    for (int b = 0; b < MAX_SEQS; b++)
        if (x->have[b]) fgh_expect_free(&x->e[b]);
}

/* One backward run: gradients into g[0..2] (1, H, total, D), checked. */
static int run_backward(fg_context *ctx, packed *k, const expectations *x, int deterministic,
                        double *const g[3], double *worst) {
    const varlen_case *c = k->c;
    fg_backward_args ba = fgh_backward_args(&k->p, deterministic);
    ba.forward = packed_forward_args(k);
    if (!gpu_ok(fgh_problem_poison_grads(&gpu_dev, &k->p), c->name)) return 0;
    fg_status st = fg_backward(ctx, &k->spec, &ba);
    CHECK(st == FG_OK, "%s: fg_backward (deterministic %d): %s: %s", c->name, deterministic,
          fg_status_name(st), fg_context_message(ctx));
    if (st || !gpu_ok(fgh_cu(&gpu_dev, gpu_dev.cu->cuCtxSynchronize(), "kernel"), c->name) ||
        !gpu_take(&k->p.d_q, g[0], c->dtype, "dq") || !gpu_take(&k->p.d_k, g[1], c->dtype, "dk") ||
        !gpu_take(&k->p.d_v, g[2], c->dtype, "dv"))
        return 0;
    /* rows outside what the sequences see: exactly 0 */
    size_t bad = nonzero_rows(g[0], c->hq, k->total_q, k->cu_q[c->batch], k->total_q, c->d);
    for (int t = 1; t < 3; t++) {
        bad += nonzero_rows(g[t], c->hkv, k->total_k, k->cu_k[c->batch], k->total_k, c->d);
        for (int b = 0; b < c->batch; b++) {
            int from = c->len_q[b] == 0 ? 0 : k->used[b];
            bad += nonzero_rows(g[t], c->hkv, k->total_k, k->cu_k[b] + from, k->cu_k[b + 1], c->d);
        }
    }
    for (int b = 0; b < c->batch; b++)
        if (k->used[b] == 0)
            bad += nonzero_rows(g[0], c->hq, k->total_q, k->cu_q[b], k->cu_q[b + 1], c->d);
    CHECK(bad == 0, "%s (deterministic %d): %zu gradient values not 0 in rows no query or key "
          "sees", c->name, deterministic, bad);
    for (int b = 0; b < c->batch; b++) {
        if (!x->have[b]) continue;
        const int nq = c->len_q[b], nk = k->used[b];
        double *s[3] = {malloc((size_t)c->hq * nq * c->d * sizeof(double)),
                        malloc((size_t)c->hkv * nk * c->d * sizeof(double)),
                        malloc((size_t)c->hkv * nk * c->d * sizeof(double))};
        if (s[0] && s[1] && s[2]) {
            rows_of(s[0], g[0], c->hq, k->total_q, k->cu_q[b], nq, c->d);
            rows_of(s[1], g[1], c->hkv, k->total_k, k->cu_k[b], nk, c->d);
            rows_of(s[2], g[2], c->hkv, k->total_k, k->cu_k[b], nk, c->d);
            double err[FGH_GRADS];
            int pass = fgh_check_backward(&x->e[b], s, err);
            CHECK(pass, "%s (deterministic %d): sequence %d: errors dq %.3e dk %.3e dv %.3e, bounds "
                  "%.3e %.3e %.3e", c->name, deterministic, b, err[0], err[1], err[2],
                  x->e[b].bound[0], x->e[b].bound[1], x->e[b].bound[2]);
            for (int t = 0; t < 3; t++)
                if (err[t] / x->e[b].bound[t] > *worst) *worst = err[t] / x->e[b].bound[t];
        } else {
            CHECK(0, "%s: out of host memory", c->name);
        }
        free(s[0]), free(s[1]), free(s[2]);
    }
    return 1;
}

static void check_backward(fg_context *ctx, packed *k, double *worst) {
    const varlen_case *c = k->c;
    expectations *x = malloc(sizeof *x);
    size_t n[3] = {k->p.nq, k->p.nk, k->p.nk};
    double *g[2][3];
    int ok = x != NULL;
    for (int r = 0; r < 2; r++)
        for (int t = 0; t < 3; t++) ok &= (g[r][t] = malloc((n[t] ? n[t] : 1) * sizeof(double))) != NULL;
    CHECK(ok, "%s: out of host memory", c->name);
    if (ok) {
        expect_all(k, x);
        run_backward(ctx, k, x, 0, g[0], worst);
        if (run_backward(ctx, k, x, 1, g[0], worst) && run_backward(ctx, k, x, 1, g[1], worst)) {
            size_t differ = 0;
            for (int t = 0; t < 3; t++) differ += fgh_bits_differ(g[0][t], g[1][t], n[t]);
            CHECK(differ == 0, "%s: %zu gradient values differ between deterministic runs", c->name,
                  differ);
        }
        expect_free_all(x);
    }
    free(x);
    for (int r = 0; r < 2; r++)
        for (int t = 0; t < 3; t++) free(g[r][t]);
}

static void run_case(fg_context *ctx, const varlen_case *c, uint64_t seed) {
    int failed_before = check_failed_count;
    double t0 = fgh_now_s(), worst = 0;
    fgh_rng rng;
    fgh_rng_seed(&rng, seed);
    packed k;
    if (packed_make(ctx, c, &rng, &k)) {
        check_forward(ctx, &k, &worst);
        check_backward(ctx, &k, &worst);
    }
    printf("%-20s %s d%-3d H%d/%d seqs %-2d rows %d/%d  worst error/bound %.2f  %5.1fs %s\n",
           c->name, c->dtype == FG_BF16 ? "bf16" : "fp16", c->d, c->hq, c->hkv, c->batch,
           k.total_q, k.total_k, worst, fgh_now_s() - t0,
           check_failed_count == failed_before ? "PASS" : "FAIL");
    fflush(stdout);
    packed_free(&k);
}

/* ---- bad input that only a live GPU can tell ---- */

/* fg_forward of case 0 with one change; CHECKs the refusal names `arg`. */
static void expect_refused(fg_context *ctx, packed *k, fg_forward_args a, const char *what,
                           const char *arg) {
    fg_status st = fg_forward(ctx, &k->spec, &a);
    const char *msg = fg_context_message(ctx);
    CHECK(st == FG_ERR_INVALID_ARGUMENT && strstr(msg, arg) != NULL,
          "%s: %s (%s), expected a refusal naming %s", what, fg_status_name(st), msg, arg);
}

static void check_bad_arrays(fg_context *ctx) {
    fgh_rng rng;
    fgh_rng_seed(&rng, 7);
    packed k;
    const varlen_case *c = &cases[0];
    if (packed_make(ctx, c, &rng, &k)) {
        fg_forward_args a = packed_forward_args(&k);
        a.cu_seqlens_q = (const int32_t *)k.cu_q; /* host memory */
        expect_refused(ctx, &k, a, "cu_seqlens_q on the host", "cu_seqlens_q");
        setenv("FLASHGEN_DEBUG", "1", 1);
        fg_context *dbg = NULL;
        CHECK(fg_context_create(&dbg, NULL) == FG_OK, "debug context: %s", fg_last_message());
        unsetenv("FLASHGEN_DEBUG");
        if (dbg) {
            int *cq = fgh_buffer_at(&k.d_cu_q, LEAD);
            fg_forward_args good = packed_forward_args(&k);
            fg_status st = fg_forward(dbg, &k.spec, &good);
            CHECK(st == FG_OK, "debug checks refuse good arrays: %s", fg_context_message(dbg));
            a = packed_forward_args(&k);
            a.seqlen_q = k.max_q - 1;
            expect_refused(dbg, &k, a, "a sequence past seqlen_q", "more than seqlen_q");
            a = packed_forward_args(&k);
            a.total_q = k.cu_q[c->batch] - 1;
            expect_refused(dbg, &k, a, "an end past total_q", "past total_q");
            cq[3] = cq[2] - 1; /* decreasing */
            if (gpu_ok(fgh_buffer_push(&gpu_dev, &k.d_cu_q), "arrays"))
                expect_refused(dbg, &k, packed_forward_args(&k), "decreasing cu_seqlens_q",
                               "cu_seqlens_q: decreases");
            fg_context_destroy(dbg);
        }
    }
    packed_free(&k);
}

int main(int argc, char **argv) {
    gpu_checks_attach(&check_passed_count, &check_failed_count);
    int quick = 0;
    const char *filter = NULL;
    if (!gpu_parse_args(argc, argv, &quick, &filter)) return 2;
    fg_context *ctx = gpu_test_open();
    if (ctx) {
        double t0 = fgh_now_s();
        int ran = 0;
        for (int i = 0; i < CASE_COUNT; i++) {
            if ((quick && !cases[i].quick) || (filter && !strstr(cases[i].name, filter))) continue;
            run_case(ctx, &cases[i], 0x7a51e000u + (uint64_t)i);
            ran++;
        }
        /* not under compute-sanitizer (--quick): the host array's refusal is
           a failed driver query, which it reports */
        if (!quick && (!filter || strstr("bad arrays", filter))) check_bad_arrays(ctx);
        printf("%d cases in %.1f s\n", ran, fgh_now_s() - t0);
    }
    gpu_test_close(ctx);
    return check_summary("gpu_varlen");
}
