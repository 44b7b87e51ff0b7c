/* Packed sequences (spec.varlen) on a live GPU against each sequence's fp64
 * reference.
 *
 * Every case packs `batch` sequences of their own lengths (0, 1 and lengths
 * that are no multiple of any tile among them) into (total, H, D) tensors,
 * optionally with rows after the last sequence, and keys a sequence holds
 * but does not see (seqused_k); those rows, which no result may depend on,
 * hold NaN (keys and values; queries and dO after the last sequence:
 * fgh_packed_upload). One fg_forward, then fg_backward once with
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
 * usage: gpu_varlen [--quick] [--shard I/N] [name-filter]
 * --quick runs the cases marked quick (for compute-sanitizer). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "flashgen.h"
#include "harness/compare.h"
#include "harness/packed.h"
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
    int softcap, alibi, sinks; /* the logits' variants (fg_spec's) */
    float cap;
    int alibi_per_batch;       /* slopes (B, Hq): one row per sequence */
    int expr;                  /* 1: a relative bias and a window predicate; 2: a predicate on b */
    int dv;                    /* the value head dim (V, O, dO, dV); 0: d */
} varlen_case;

#define NO_USED {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1}
#define DENSE FG_SPARSE_NONE, 0, 0, 0
#define BR FG_ALIGN_BOTTOM_RIGHT
#define TL FG_ALIGN_TOP_LEFT

static const varlen_case cases[] = {
    {"mixed lengths", FG_FP16, 64, FG_MASK_NONE, BR, -1, -1, 0.f, 2, 2, 6,
     {37, 0, 1, 300, 129, 64}, {37, 0, 1, 300, 129, 64}, NO_USED, 0, 0, DENSE, 0, 0, 0, 0, 0.f, 0, 0, 0},
    {"causal br gqa", FG_BF16, 128, FG_MASK_CAUSAL, BR, -1, -1, 0.f, 4, 2, 4,
     {1, 77, 200, 0}, {150, 77, 333, 5}, NO_USED, 0, 0, DENSE, 1, 0, 0, 0, 0.f, 0, 0, 0},
    {"causal tl", FG_FP16, 96, FG_MASK_CAUSAL, TL, -1, -1, 0.f, 3, 3, 3,
     {190, 65, 17}, {100, 65, 40}, NO_USED, 0, 0, DENSE, 0, 0, 0, 0, 0.f, 0, 0, 0},
    {"window", FG_BF16, 64, FG_MASK_WINDOW, BR, 37, 5, 0.f, 2, 1, 3,
     {250, 1, 90}, {260, 30, 90}, NO_USED, 0, 0, DENSE, 0, 0, 0, 0, 0.f, 0, 0, 0},
    {"dropout causal", FG_FP16, 64, FG_MASK_CAUSAL, TL, -1, -1, 0.1f, 2, 2, 3,
     {130, 47, 256}, {130, 47, 256}, NO_USED, 0, 0, DENSE, 0, 0, 0, 0, 0.f, 0, 0, 0},
    {"seqused and tail", FG_BF16, 64, FG_MASK_CAUSAL, BR, -1, -1, 0.f, 2, 2, 4,
     {50, 0, 120, 33}, {80, 40, 130, 33}, {60, 20, 0, 33}, 7, 19, DENSE, 1, 0, 0, 0, 0.f, 0, 0, 0},
    {"butterfly 64", FG_FP16, 64, FG_MASK_CAUSAL, TL, -1, -1, 0.f, 2, 2, 3,
     {300, 100, 65}, {300, 100, 65}, NO_USED, 0, 0, FG_SPARSE_BUTTERFLY, 64, 64, 2, 0, 0, 0, 0, 0.f, 0, 0, 0},
    {"layout 64x128", FG_BF16, 128, FG_MASK_NONE, BR, -1, -1, 0.f, 2, 2, 2,
     {200, 333}, {256, 129}, NO_USED, 0, 0, FG_SPARSE_LAYOUT, 64, 128, 0, 0, 0, 0, 0, 0.f, 0, 0, 0},
    {"d33 dropout gqa", FG_FP16, 33, FG_MASK_NONE, BR, -1, -1, 0.2f, 6, 2, 5,
     {19, 1, 0, 140, 65}, {23, 70, 9, 140, 2}, NO_USED, 3, 0, DENSE, 0, 0, 0, 0, 0.f, 0, 0, 0},
    {"all empty", FG_BF16, 64, FG_MASK_NONE, BR, -1, -1, 0.f, 2, 1, 3,
     {0, 0, 0}, {0, 0, 0}, NO_USED, 5, 9, DENSE, 1, 0, 0, 0, 0.f, 0, 0, 0},
    /* packed tensors of no rows at all: no queries (dK, dV zero), no keys */
    {.name = "no query rows", .dtype = FG_BF16, .d = 128, .mask = FG_MASK_CAUSAL, .align = BR,
     .window_left = -1, .window_right = -1, .hq = 4, .hkv = 2, .batch = 2, .len_q = {0, 0},
     .len_k = {200, 100}, .used_k = NO_USED, .quick = 1},
    {.name = "no key rows", .dtype = FG_FP16, .d = 64, .mask = FG_MASK_NONE, .align = BR,
     .window_left = -1, .window_right = -1, .hq = 2, .hkv = 2, .batch = 2, .len_q = {100, 50},
     .len_k = {0, 0}, .used_k = NO_USED, .quick = 1},
    {"long among short", FG_BF16, 64, FG_MASK_CAUSAL, BR, -1, -1, 0.f, 2, 2, 9,
     {1000, 3, 1, 7, 12, 2, 30, 5, 9}, {1000, 3, 1, 7, 12, 2, 30, 5, 9}, NO_USED, 0, 0, DENSE, 0, 0, 0, 0, 0.f, 0, 0, 0},
    {"decode", FG_FP16, 128, FG_MASK_CAUSAL, BR, -1, -1, 0.f, 8, 2, 4,
     {1, 1, 1, 1}, {1000, 17, 1, 300}, NO_USED, 0, 0, DENSE, 0, 0, 0, 0, 0.f, 0, 0, 0},
    /* unmasked: the deterministic schedule's key blocks each start at their
     * own share of a sequence's query blocks (lengths unlike per sequence) */
    {"unmasked long gqa", FG_BF16, 128, FG_MASK_NONE, BR, -1, -1, 0.f, 4, 2, 5,
     {700, 1, 0, 300, 129}, {1000, 17, 5, 640, 385}, NO_USED, 0, 0, DENSE, 1, 0, 0, 0, 0.f, 0, 0, 0},
    /* many tiles a thread block, most past their sequence's keys (the
     * fast kernel's blocks walk tiles and skip those); under the causal
     * mask sections of pairs of one sequence (a divisor of 6 key/value heads) */
    {.name = "walk past short sequences causal", .dtype = FG_BF16, .d = 128,
     .mask = FG_MASK_CAUSAL, .align = BR, .window_left = -1, .window_right = -1, .hq = 12, .hkv = 6,
     .batch = 12, .len_q = {2500, 1, 0, 129, 128, 127, 700, 0, 300, 1500, 64, 900},
     .len_k = {2500, 1, 0, 129, 128, 127, 700, 0, 300, 1500, 64, 900}, .used_k = NO_USED,
     .tail_q = 3, .tail_k = 5},
    {.name = "walk past short sequences", .dtype = FG_FP16, .d = 64, .mask = FG_MASK_NONE,
     .align = BR, .window_left = -1, .window_right = -1, .hq = 8, .hkv = 8, .batch = 10,
     .len_q = {1900, 0, 1, 65, 300, 1200, 17, 640, 0, 33},
     .len_k = {2000, 5, 1, 65, 250, 1300, 40, 640, 3, 33}, .used_k = NO_USED, .quick = 1},
    /* more rows after the last sequence than the longest sequence's key blocks cover */
    {"long tail", FG_BF16, 64, FG_MASK_CAUSAL, TL, -1, -1, 0.f, 2, 1, 2,
     {4, 7}, {5, 3}, NO_USED, 3, 300, DENSE, 1, 0, 0, 0, 0.f, 0, 0, 0},
    /* the logits' variants: ALiBi's slope per sequence, sinks with empty
     * sequences and a tail */
    {"all variants causal", FG_FP16, 64, FG_MASK_CAUSAL, BR, -1, -1, 0.f, 4, 2, 4,
     {90, 0, 1, 200}, {120, 5, 30, 200}, NO_USED, 3, 7, DENSE, 1, 1, 1, 1, 2.0f, 1, 0, 0},
    {"sinks window bf16", FG_BF16, 128, FG_MASK_WINDOW, BR, 16, 0, 0.f, 2, 1, 3,
     {150, 1, 64}, {150, 40, 64}, NO_USED, 0, 0, DENSE, 0, 0, 0, 1, 0.f, 0, 0, 0},
    /* expressions: a relative bias over positions within each sequence and a
     * window written as a predicate; a document-like predicate on b */
    {"expr bias window", FG_FP16, 64, FG_MASK_NONE, BR, -1, -1, 0.f, 4, 2, 4,
     {90, 0, 1, 200}, {120, 5, 30, 200}, NO_USED, 3, 7, DENSE, 0, 0, 0, 1, 0.f, 0, 1, 0},
    {"expr predicate on b bf16", FG_BF16, 128, FG_MASK_CAUSAL, BR, -1, -1, 0.f, 2, 1, 3,
     {150, 1, 64}, {150, 40, 64}, NO_USED, 0, 0, DENSE, 1, 0, 0, 0, 0.f, 0, 2, 0},
    /* value head dims unlike the head dim (names hold "dv") */
    {.name = "dv 192/128 causal gqa", .dtype = FG_BF16, .d = 192, .dv = 128,
     .mask = FG_MASK_CAUSAL, .align = BR, .window_left = -1, .window_right = -1, .hq = 4, .hkv = 2,
     .batch = 4, .len_q = {90, 0, 1, 201}, .len_k = {120, 5, 30, 201}, .used_k = NO_USED,
     .tail_q = 3, .tail_k = 7, .quick = 1},
    {.name = "dv 128/64 gqa bf16", .dtype = FG_BF16, .d = 128, .dv = 64, .mask = FG_MASK_NONE,
     .align = BR, .window_left = -1, .window_right = -1, .hq = 4, .hkv = 2, .batch = 4,
     .len_q = {81, 0, 1, 239}, .len_k = {160, 5, 79, 239}, .used_k = NO_USED, .tail_q = 3,
     .tail_k = 7},
    {.name = "dv 64/128 seqused", .dtype = FG_FP16, .d = 64, .dv = 128, .mask = FG_MASK_NONE,
     .align = BR, .window_left = -1, .window_right = -1, .hq = 2, .hkv = 2, .batch = 3,
     .len_q = {77, 130, 1}, .len_k = {100, 130, 9}, .used_k = {60, 130, 9}},
    {.name = "dv 33/65 dropout tl", .dtype = FG_FP16, .d = 33, .dv = 65, .mask = FG_MASK_CAUSAL,
     .align = TL, .window_left = -1, .window_right = -1, .dropout_p = 0.1f, .hq = 3, .hkv = 1,
     .batch = 3, .len_q = {50, 129, 17}, .len_k = {70, 129, 40}, .used_k = NO_USED},
    /* head dims above 128: the Hopper backward's split kernel (names hold "wide") */
    {.name = "wide 256 causal gqa", .dtype = FG_BF16, .d = 256, .mask = FG_MASK_CAUSAL,
     .align = BR, .window_left = -1, .window_right = -1, .hq = 4, .hkv = 2, .batch = 4,
     .len_q = {90, 0, 1, 201}, .len_k = {120, 5, 30, 201}, .used_k = NO_USED, .tail_q = 3,
     .tail_k = 7, .quick = 1},
    {.name = "wide 192 window tl", .dtype = FG_FP16, .d = 192, .mask = FG_MASK_WINDOW, .align = TL,
     .window_left = 37, .window_right = 5, .hq = 2, .hkv = 1, .batch = 3, .len_q = {250, 1, 90},
     .len_k = {260, 30, 90}, .used_k = NO_USED},
};
#define CASE_COUNT ((int)(sizeof cases / sizeof cases[0]))

/* The case packed: its lengths, inputs from rng, the layout, on the device. */
static int packed_make(fg_context *ctx, const varlen_case *c, fgh_rng *rng, fgh_packed *k) {
    fg_spec s = fg_spec_default(c->d, c->dtype);
    s.head_dim_v = c->dv;
    s.mask = c->mask, s.dropout = c->dropout_p > 0.f, s.varlen = 1;
    s.sparsity = c->sparsity, s.sparse_block_q = c->block_q, s.sparse_block_k = c->block_k;
    s.butterfly_factors = c->factors;
    s.softcap = c->softcap, s.alibi = c->alibi, s.sinks = c->sinks;
    if (c->expr == 1) {
        s.score_mod = "s + bias[h, q - k + 512]";
        s.mask_mod = "k <= q + (seqlen_k - seqlen_q) + 3 && k >= q + (seqlen_k - seqlen_q) - 40";
        s.aux_count = 1;
        s.aux[0] = (fg_aux_decl){"bias", FG_AUX_F32, 2};
    } else if (c->expr == 2) {
        s.mask_mod = "b % 2 == 0 || k % 3 != 1";
    }
    fgh_shape sh = {.heads_q = c->hq, .heads_kv = c->hkv, .align = c->align,
                    .window_left = c->window_left, .window_right = c->window_right,
                    .dropout_p = c->dropout_p, .seed = 0x5eed0000u + (uint64_t)c->batch,
                    .offset = 1234, .softcap = c->cap, .alibi_per_batch = c->alibi_per_batch};
    sh.aux_size[0][0] = c->hq, sh.aux_size[0][1] = 1024;
    fgh_lengths lens = {c->batch, c->len_q, c->len_k, c->used_k[0] < 0 ? NULL : c->used_k,
                        c->tail_q, c->tail_k};
    fgh_placement pl = {.order = FGH_BSHD, .pad = 8, .lead = LEAD, .guard = GUARD};
    if (!gpu_ok(fgh_packed_init(k, &s, &sh, &lens, &pl, 1), c->name)) return 0;
    fgh_fill_normal(rng, k->p.host.q, k->p.nq, c->dtype);
    fgh_fill_normal(rng, k->p.host.k, k->p.nk, c->dtype);
    fgh_fill_normal(rng, k->p.host.v, k->p.nv, c->dtype);
    fgh_fill_normal(rng, k->p.host.d_o, k->p.no, c->dtype);
    if (c->expr == 1) fgh_fill_normal(rng, k->p.host.aux[0], k->p.aux_elems[0], FG_FP16);
    if (c->sparsity == FG_SPARSE_LAYOUT) {
        uint8_t *mask = fgh_random_layout(rng, c->hq, k->p.blocks_q, k->p.blocks_k, 0.6);
        if (!gpu_ok(mask != NULL, "layout") || !gpu_ok(fgh_problem_set_layout(&k->p, ctx, mask, c->hq),
                                                       c->name))
            return 0;
    }
    return gpu_ok(fgh_packed_upload(&gpu_dev, k), c->name);
}

/* ---- forward ---- */

static void check_forward(fg_context *ctx, const varlen_case *c, fgh_packed *k, double *worst) {
    fg_forward_args a = fgh_packed_forward_args(k);
    fg_status st = fg_forward(ctx, &k->p.spec, &a);
    CHECK(st == FG_OK, "%s: fg_forward: %s: %s", c->name, fg_status_name(st), fg_context_message(ctx));
    double *o = malloc((k->p.no ? k->p.no : 1) * sizeof *o); /* (1, Hq, total_q, Dv) */
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
    size_t tail = (size_t)c->hq * c->tail_q * k->p.head_dim_v;
    CHECK(w.nonfinite == tail, "%s: %zu elements of o not finite or not written, %zu expected "
          "(the rows after the last sequence)", c->name, w.nonfinite, tail);
    const float *lse = fgh_buffer_at(&k->p.lse, LEAD);
    for (int b = 0; b < c->batch; b++) {
        if (c->len_q[b] == 0) continue;
        fgh_forward_check r;
        if (!gpu_ok(fgh_packed_check_forward(k, b, o, lse, &r), c->name)) continue;
        /* a sequence that sees no key: O = 0 and lse = -inf, counted as rows */
        CHECK(r.err <= r.bound, "%s: sequence %d: O error %.3e exceeds %.3e", c->name, b, r.err,
              r.bound);
        CHECK(r.lse_bad == 0 && r.lse_bad_inf == 0 && r.zero_rows_bad == 0,
              "%s: sequence %d (%d keys seen): %zu lse off (worst %g), %zu lse not -inf, %zu O rows "
              "not 0", c->name, b, k->used[b], r.lse_bad, r.lse_worst, r.lse_bad_inf, r.zero_rows_bad);
        if (r.err / r.bound > *worst) *worst = r.err / r.bound;
    }
    free(o);
}

/* ---- backward ---- */

/* One backward run: gradients into g[0..2] (1, H, total, D; dV's Dv), checked. */
static int run_backward(fg_context *ctx, const varlen_case *c, fgh_packed *k,
                        const fgh_packed_expect *x, int deterministic, double *const g[3],
                        double *worst) {
    fg_backward_args ba = fgh_packed_backward_args(k, deterministic);
    if (!gpu_ok(fgh_problem_poison_grads(&gpu_dev, &k->p), c->name)) return 0;
    fg_status st = fg_backward(ctx, &k->p.spec, &ba);
    CHECK(st == FG_OK, "%s: fg_backward (deterministic %d): %s: %s", c->name, deterministic,
          fg_status_name(st), fg_context_message(ctx));
    if (st || !gpu_ok(fgh_cu(&gpu_dev, gpu_dev.cu->cuCtxSynchronize(), "kernel"), c->name) ||
        !gpu_take(&k->p.d_q, g[0], c->dtype, "dq") || !gpu_take(&k->p.d_k, g[1], c->dtype, "dk") ||
        !gpu_take(&k->p.d_v, g[2], c->dtype, "dv"))
        return 0;
    size_t bad = fgh_packed_unseen_nonzero(k, g);
    CHECK(bad == 0, "%s (deterministic %d): %zu gradient values not 0 in rows no query or key "
          "sees", c->name, deterministic, bad);
    for (int b = 0; b < c->batch; b++) {
        double err[FGH_GRADS];
        int pass;
        if (!x->have[b] || !gpu_ok(fgh_packed_check_backward(k, x, b, g, err, &pass), c->name))
            continue;
        CHECK(pass, "%s (deterministic %d): sequence %d: errors dq %.3e dk %.3e dv %.3e, bounds "
              "%.3e %.3e %.3e", c->name, deterministic, b, err[0], err[1], err[2],
              x->e[b].bound[0], x->e[b].bound[1], x->e[b].bound[2]);
        for (int t = 0; t < 3; t++)
            if (err[t] / x->e[b].bound[t] > *worst) *worst = err[t] / x->e[b].bound[t];
    }
    return 1;
}

static void check_backward(fg_context *ctx, const varlen_case *c, fgh_packed *k, double *worst) {
    size_t n[3] = {k->p.nq, k->p.nk, k->p.nv};
    double *g[2][3];
    int ok = 1;
    for (int r = 0; r < 2; r++)
        for (int t = 0; t < 3; t++) ok &= (g[r][t] = malloc((n[t] ? n[t] : 1) * sizeof(double))) != NULL;
    CHECK(ok, "%s: out of host memory", c->name);
    fgh_packed_expect x;
    if (ok && gpu_ok(fgh_packed_expect_backward(k, &x), c->name)) {
        run_backward(ctx, c, k, &x, 0, g[0], worst);
        if (run_backward(ctx, c, k, &x, 1, g[0], worst) && run_backward(ctx, c, k, &x, 1, g[1], worst)) {
            size_t differ = 0;
            for (int t = 0; t < 3; t++) differ += fgh_bits_differ(g[0][t], g[1][t], n[t]);
            CHECK(differ == 0, "%s: %zu gradient values differ between deterministic runs", c->name,
                  differ);
        }
    }
    if (ok) fgh_packed_expect_free(&x);
    for (int r = 0; r < 2; r++)
        for (int t = 0; t < 3; t++) free(g[r][t]);
}

static void run_case(fg_context *ctx, const varlen_case *c, uint64_t seed) {
    int failed_before = check_failed_count;
    double t0 = fgh_now_s(), worst = 0;
    fgh_rng rng;
    fgh_rng_seed(&rng, seed);
    fgh_packed k;
    if (packed_make(ctx, c, &rng, &k)) {
        check_forward(ctx, c, &k, &worst);
        check_backward(ctx, c, &k, &worst);
    }
    printf("%-20s %s d%-3d dv%-3d H%d/%d seqs %-2d rows %d/%d  worst error/bound %.2f  %5.1fs %s\n",
           c->name, c->dtype == FG_BF16 ? "bf16" : "fp16", c->d, c->dv ? c->dv : c->d, c->hq, c->hkv, c->batch,
           k.total_q, k.total_k, worst, fgh_now_s() - t0,
           check_failed_count == failed_before ? "PASS" : "FAIL");
    fflush(stdout);
    fgh_packed_free(&gpu_dev, &k);
}

/* ---- bad input that only a live GPU can tell ---- */

static void check_bad_arrays(fg_context *ctx) {
    fgh_rng rng;
    fgh_rng_seed(&rng, 7);
    fgh_packed k;
    const varlen_case *c = &cases[0];
    if (packed_make(ctx, c, &rng, &k)) {
        fg_forward_args a = fgh_packed_forward_args(&k);
        a.cu_seqlens_q = (const int32_t *)k.cu_q; /* host memory */
        gpu_expect_refused(ctx, &k.p.spec, a, "cu_seqlens_q on the host", "cu_seqlens_q");
        fg_context *dbg = gpu_debug_context();
        if (dbg) {
            int *cq = fgh_buffer_at(&k.d_cu_q, LEAD);
            fg_forward_args good = fgh_packed_forward_args(&k);
            fg_status st = fg_forward(dbg, &k.p.spec, &good);
            CHECK(st == FG_OK, "debug checks refuse good arrays: %s", fg_context_message(dbg));
            a = fgh_packed_forward_args(&k);
            a.seqlen_q = k.max_q - 1;
            gpu_expect_refused(dbg, &k.p.spec, a, "a sequence past seqlen_q", "more than seqlen_q");
            a = fgh_packed_forward_args(&k);
            a.total_q = k.cu_q[c->batch] - 1;
            gpu_expect_refused(dbg, &k.p.spec, a, "an end past total_q", "past total_q");
            cq[3] = cq[2] - 1; /* decreasing */
            if (gpu_ok(fgh_buffer_push(&gpu_dev, &k.d_cu_q), "arrays"))
                gpu_expect_refused(dbg, &k.p.spec, fgh_packed_forward_args(&k), "decreasing cu_seqlens_q",
                               "cu_seqlens_q: decreases");
            fg_context_destroy(dbg);
        }
    }
    fgh_packed_free(&gpu_dev, &k);
}

static const char *case_name(int i) { return cases[i].name; }
static int case_quick(int i) { return cases[i].quick; }
static void run_numbered(fg_context *ctx, int i) { run_case(ctx, &cases[i], 0x7a51e000u + (uint64_t)i); }

int main(int argc, char **argv) {
    gpu_checks_attach(&check_passed_count, &check_failed_count);
    const gpu_suite suite = {CASE_COUNT, case_name, case_quick, run_numbered, "bad arrays",
                             check_bad_arrays};
    if (!gpu_run_suite(argc, argv, &suite)) return 2;
    return check_summary("gpu_varlen");
}
