/* The case matrix of the GPU tests and what a case turns into: see gpu_cases.h. */
#include "tests/gpu_cases.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness/message.h"

/* ---- spec and problem ------------------------------------------------------------ */

/* ---- expressions ------------------------------------------------------------------ */

#define F32(name, rank) {name, FG_AUX_F32, rank}
#define I32(name, rank) {name, FG_AUX_I32, rank}
static const struct case_expr {
    const char *score, *mask;
    int aux_count;
    fg_aux_decl aux[3];
} case_exprs[EXPR_COUNT] = {
    [EXPR_REL_BIAS] = {"s + bias[h, q - k + seqlen_k - 1]", NULL, 1, {F32("bias", 2)}},
    [EXPR_T5] = {"s + table[h, bucket[q - k + seqlen_k - 1]]", NULL, 2,
                 {F32("table", 2), I32("bucket", 1)}},
    [EXPR_ALIBI] = {"s - slopes[h] * abs(q + (seqlen_k - seqlen_q) - k)", NULL, 1,
                    {F32("slopes", 1)}},
    [EXPR_SOFTCAP] = {"3.0 * tanh(s / 3.0)", NULL, 0, {{0}}},
    [EXPR_GAIN] = {"s * gain[h] + where(q % 2 == k % 3, 0.5 * s, max(s, -1.0))", NULL, 1,
                   {F32("gain", 1)}},
    [EXPR_HIDE] = {"where(abs(q - k) % 3 == 1, -inf, s)", NULL, 0, {{0}}},
    [EXPR_DOCS] = {NULL, "docq[q] == dock[k]", 2, {I32("docq", 1), I32("dock", 1)}},
    [EXPR_PREFIX] = {NULL, "k <= q + (seqlen_k - seqlen_q) || k < prefix[b]", 1,
                     {I32("prefix", 1)}},
    [EXPR_WINDOW] = {NULL, "k <= q + (seqlen_k - seqlen_q) && k >= q + (seqlen_k - seqlen_q) - 24",
                     0, {{0}}},
    [EXPR_BIAS_DOCS] = {"s + bias[h, q - k + seqlen_k - 1]", "docq[q] == dock[k]", 3,
                        {F32("bias", 2), I32("docq", 1), I32("dock", 1)}},
    [EXPR_DOCS_BH] = {NULL, "docs[b, q] == docs[b, k] && (h % 2 == 0 || k >= q - 100)", 1,
                      {I32("docs", 2)}},
    [EXPR_FLOORDIV] = {"s + bias[h, floordiv(q - k + seqlen_k - 1, 3)] + "
                       "0.5 * bias[h, int((q + k) * 0.5)]",
                       "floordiv(q, 48) == floordiv(k + seqlen_q - seqlen_k, 48) || "
                       "floordiv(k - q, -5) > 3",
                       1, {F32("bias", 2)}},
};

static void set_case_expr(const struct gpu_case *c, fg_spec *s) {
    const struct case_expr *e = &case_exprs[c->expr];
    if (c->expr == EXPR_NONE) return;
    s->score_mod = e->score;
    s->mask_mod = e->mask;
    s->aux_count = e->aux_count;
    for (int t = 0; t < e->aux_count; t++) s->aux[t] = e->aux[t];
}

/* Each tensor's sizes, by name: the case's heads and lengths */
static void expr_sizes(const struct gpu_case *c, const fg_spec *s, fgh_shape *shape) {
    for (int t = 0; t < s->aux_count; t++) {
        const char *n = s->aux[t].name;
        int64_t *z = shape->aux_size[t];
        if (!strcmp(n, "bias")) z[0] = c->hq, z[1] = c->sq + c->sk - 1;
        else if (!strcmp(n, "table")) z[0] = c->hq, z[1] = 32;
        else if (!strcmp(n, "bucket")) z[0] = c->sq + c->sk - 1;
        else if (!strcmp(n, "slopes") || !strcmp(n, "gain")) z[0] = c->hq;
        else if (!strcmp(n, "docq")) z[0] = c->sq;
        else if (!strcmp(n, "dock")) z[0] = c->sk;
        else if (!strcmp(n, "prefix")) z[0] = c->batch;
        else if (!strcmp(n, "docs")) z[0] = c->batch, z[1] = c->sq > c->sk ? c->sq : c->sk;
    }
}

/* T5's bucket of relative position r = q - k: 16 exact distances, then 16
 * logarithmic ones up to 128, each side of the diagonal its own half */
static int t5_bucket(int r) {
    int half = r > 0 ? 16 : 0, n = r < 0 ? -r : r;
    if (n < 8) return half + n;
    int b = 8 + (int)(log((double)n / 8) / log(128.0 / 8) * 8);
    return half + (b < 15 ? b : 15);
}

/* Document ids of n rows: `docs` runs of random lengths, ascending */
static void fill_docs(fgh_rng *rng, int32_t *ids, int n, int docs) {
    int cut[16];
    for (int i = 0; i < docs - 1; i++) cut[i] = (int)(fgh_rng_unit(rng) * n);
    for (int i = 0; i < n; i++) {
        int id = 0;
        for (int j = 0; j < docs - 1; j++) id += i >= cut[j];
        ids[i] = id;
    }
}

static void expr_fill(const struct gpu_case *c, fgh_rng *rng, fgh_problem *p) {
    for (int t = 0; t < p->spec.aux_count; t++) {
        const char *n = p->spec.aux[t].name;
        float *f = p->host.aux[t];
        int32_t *x = p->host.aux[t];
        size_t m = p->aux_elems[t];
        if (!strcmp(n, "bias") || !strcmp(n, "table")) {
            for (size_t i = 0; i < m; i++) f[i] = fgh_rng_normal(rng);
        } else if (!strcmp(n, "bucket")) {
            for (size_t i = 0; i < m; i++) x[i] = t5_bucket((int)i - (c->sk - 1));
        } else if (!strcmp(n, "slopes")) {
            for (int h = 0; h < c->hq; h++) f[h] = fgh_default_slope(0, h, c->hq);
        } else if (!strcmp(n, "gain")) {
            for (size_t i = 0; i < m; i++) f[i] = 1.0f + 0.5f * fgh_rng_uniform(rng);
        } else if (!strcmp(n, "docq") || !strcmp(n, "dock")) {
            fill_docs(rng, x, (int)m, 5);
        } else if (!strcmp(n, "docs")) {
            const int row = c->sq > c->sk ? c->sq : c->sk;
            for (int b = 0; b < c->batch; b++) fill_docs(rng, x + (size_t)b * row, row, 4 + b);
        } else if (!strcmp(n, "prefix")) {
            for (size_t i = 0; i < m; i++) x[i] = (int)(fgh_rng_unit(rng) * c->sk);
        }
    }
}

fg_spec case_spec(const struct gpu_case *c) {
    fg_spec s = fg_spec_default(c->d, c->dtype);
    s.head_dim_v = c->dv;
    s.mask = c->mask;
    s.dropout = c->dropout_p > 0.f;
    s.sparsity = c->sparsity;
    if (c->sparsity != FG_SPARSE_NONE) {
        s.sparse_block_q = c->block_q;
        s.sparse_block_k = c->block_k;
    }
    s.butterfly_factors = c->factors;
    s.softcap = (c->variants & CASE_SOFTCAP) != 0;
    s.alibi = (c->variants & CASE_ALIBI) != 0;
    s.sinks = (c->variants & CASE_SINKS) != 0;
    set_case_expr(c, &s);
    return s;
}

static fgh_shape case_shape(const struct gpu_case *c) {
    fgh_shape s = {.batch = c->batch, .heads_q = c->hq, .heads_kv = c->hkv, .seqlen_q = c->sq,
                   .seqlen_k = c->sk, .align = c->align, .window_left = -1, .window_right = -1,
                   .scale = c->scale, .dropout_p = c->dropout_p, .seed = c->seed,
                   .offset = c->offset, .position_q = c->pos_q, .position_k = c->pos_k,
                   .softcap = c->softcap, .alibi_per_batch = c->alibi_per_batch};
    if (c->mask == FG_MASK_WINDOW) s.window_left = c->wl, s.window_right = c->wr;
    return s;
}

/* Q = 0 makes every visible key equally likely; V[j][d] = 1 iff d == j mod Dv,
 * so O[i][d] is nonzero iff the one visible key j == d (mod Dv) was kept. */
static void probe_fill(const struct gpu_case *c, fgh_rng *rng, fgh_problem *p) {
    const int dv = p->head_dim_v;
    memset(p->host.q, 0, p->nq * sizeof *p->host.q);
    fgh_fill_normal(rng, p->host.k, p->nk, c->dtype);
    for (size_t row = 0; row < p->nv / (size_t)dv; row++) {
        int j = (int)(row % (size_t)c->sk);
        for (int d = 0; d < dv; d++) p->host.v[row * dv + d] = d == j % dv ? 1.0f : 0.0f;
    }
}

static int add_layout(fg_context *ctx, const struct gpu_case *c, fgh_rng *rng, fgh_problem *p) {
    int heads = c->per_head_layout ? c->hq : 1;
    size_t nbk = (size_t)p->blocks_k, empty = p->blocks_q > 1 ? 1 : 0;
    uint8_t *mask = fgh_random_layout(rng, heads, p->blocks_q, p->blocks_k, 0.5);
    if (mask) memset(mask + empty * nbk, 0, nbk);
    int ok = mask && fgh_problem_set_layout(p, ctx, mask, heads);
    GPU_CHECK(ok, "%s: fg_layout_create: %s", c->name, fgh_message());
    return ok;
}

int case_problem_make(fg_context *ctx, const struct gpu_case *c, fgh_rng *rng, int grads,
                      fgh_problem *p) {
    fg_spec spec = case_spec(c);
    fgh_shape shape = case_shape(c);
    fgh_placement place = {c->order, c->pad, LEAD, GUARD};
    expr_sizes(c, &spec, &shape);
    if (!gpu_ok(fgh_problem_init(p, &spec, &shape, &place, grads), c->name)) return 0;
    expr_fill(c, rng, p);
    if (c->probe) {
        probe_fill(c, rng, p);
    } else {
        fgh_fill_normal(rng, p->host.q, p->nq, c->dtype);
        fgh_fill_normal(rng, p->host.k, p->nk, c->dtype);
        fgh_fill_normal(rng, p->host.v, p->nv, c->dtype);
    }
    if (c->block_mask) {
        if (!gpu_ok(fgh_problem_use_block_mask(p, ctx), c->name)) return 0;
    } else if (c->sparsity == FG_SPARSE_LAYOUT && !add_layout(ctx, c, rng, p)) {
        return 0;
    }
    /* dO after the layout: q, k, v and the layout are those of the forward test */
    if (grads) fgh_fill_normal(rng, p->host.d_o, p->no, c->dtype);
    return 1;
}

/* ---- the case matrix ----------------------------------------------------------- */

struct gpu_case gpu_cases[MAX_CASES];
int gpu_case_count;
static char head_dim_names[2][64][32];

static void add(struct gpu_case c) {
    if (c.batch == 0) c.batch = 1;
    if (c.hkv == 0) c.hkv = c.hq;
    GPU_CHECK(gpu_case_count < MAX_CASES, "more than %d cases: raise MAX_CASES", MAX_CASES);
    if (gpu_case_count < MAX_CASES) gpu_cases[gpu_case_count++] = c;
}

/* Every head dim 8..256 step 8 plus odd ones, fp16; a subset in bf16. */
static void add_head_dim_cases(void) {
    static const int odd[] = {1, 3, 33, 65, 100, 129, 200, 255};
    static const int bf16[] = {8, 33, 64, 100, 128, 256};
    int dims[64], n = 0;
    for (int d = 8; d <= 256; d += 8) dims[n++] = d;
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) dims[n++] = odd[i];
    for (int i = 0; i < n; i++) {
        snprintf(head_dim_names[0][i], sizeof head_dim_names[0][i], "head_dim %d", dims[i]);
        add((struct gpu_case){.name = head_dim_names[0][i], .d = dims[i], .hq = 2, .sq = 67,
                              .sk = 131, .order = i % 2,
                              .quick = dims[i] == 64 || dims[i] == 255});
    }
    for (size_t i = 0; i < sizeof bf16 / sizeof bf16[0]; i++) {
        snprintf(head_dim_names[1][i], sizeof head_dim_names[1][i], "head_dim %d bf16", bf16[i]);
        add((struct gpu_case){.name = head_dim_names[1][i], .dtype = FG_BF16, .d = bf16[i],
                              .hq = 2, .sq = 67, .sk = 131, .order = (int)i % 2});
    }
}

/* Lengths 1, 17, 255, 1000, 4097 on both sides, head dims 64 and 128. The
 * reference is single-threaded: the long ones use one head and stay near
 * 1e9 multiply-adds. */
static const struct gpu_case length_cases[] = {
    {.name = "len 1x1", .d = 64, .hq = 2, .sq = 1, .sk = 1},
    {.name = "len 1x17", .d = 128, .hq = 2, .sq = 1, .sk = 17, .order = FGH_BHSD},
    {.name = "len 17x1", .d = 64, .hq = 2, .sq = 17, .sk = 1},
    {.name = "len 1x4097", .d = 64, .hq = 2, .sq = 1, .sk = 4097},
    {.name = "len 4097x1", .d = 128, .hq = 2, .sq = 4097, .sk = 1, .order = FGH_BHSD},
    {.name = "len 17x255", .d = 128, .hq = 2, .sq = 17, .sk = 255},
    {.name = "len 255x17", .d = 128, .hq = 2, .sq = 255, .sk = 17, .quick = 1},
    {.name = "len 255x255", .d = 64, .batch = 2, .hq = 2, .sq = 255, .sk = 255, .order = FGH_BHSD},
    {.name = "len 1000x1000", .d = 128, .hq = 1, .sq = 1000, .sk = 1000},
    {.name = "len 255x1000", .d = 64, .hq = 2, .sq = 255, .sk = 1000, .order = FGH_BHSD},
    {.name = "len 1000x255", .d = 128, .hq = 2, .sq = 1000, .sk = 255},
    {.name = "len 17x4097", .d = 128, .hq = 2, .sq = 17, .sk = 4097},
    {.name = "len 4097x17", .d = 64, .hq = 2, .sq = 4097, .sk = 17, .order = FGH_BHSD},
    {.name = "len 1000x4097", .d = 64, .hq = 1, .sq = 1000, .sk = 4097},
    {.name = "len 4097x1000", .d = 128, .hq = 1, .sq = 4097, .sk = 1000, .order = FGH_BHSD},
    {.name = "len 4097x2000", .d = 64, .hq = 1, .sq = 4097, .sk = 2000},
    /* causal at d <= 64 and 1025..2048 keys: fwd_sm90a's key tiles of 96 by length */
    {.name = "len 1500x1500 causal d64", .d = 64, .hq = 2, .sq = 1500, .sk = 1500,
     .mask = FG_MASK_CAUSAL},
    {.name = "len 700x2048 causal d40", .d = 40, .hq = 2, .sq = 700, .sk = 2048,
     .mask = FG_MASK_CAUSAL, .order = FGH_BHSD},
    /* scores with a spread of ~8: the running max must keep exp in range */
    {.name = "sharp softmax", .d = 64, .hq = 2, .sq = 300, .sk = 300, .scale = 1.0f},
    {.name = "gapped rows d64", .d = 64, .batch = 2, .hq = 3, .sq = 100, .sk = 150, .pad = 8},
    {.name = "gapped rows d33", .d = 33, .batch = 2, .hq = 2, .sq = 100, .sk = 77, .pad = 3,
     .order = FGH_BHSD, .quick = 1},
    {.name = "gapped rows d1", .d = 1, .hq = 3, .sq = 50, .sk = 70, .pad = 5},
    {.name = "gapped rows d100 bf16", .dtype = FG_BF16, .d = 100, .hq = 2, .sq = 90, .sk = 130,
     .pad = 4, .order = FGH_BHSD},
    {.name = "no lse", .d = 64, .hq = 2, .sq = 100, .sk = 100, .no_lse = 1},
};

static const struct gpu_case gqa_cases[] = {
    {.name = "gqa 8/2 d64", .d = 64, .batch = 2, .hq = 8, .hkv = 2, .sq = 200, .sk = 333, .quick = 1},
    {.name = "gqa 8/2 d128", .d = 128, .batch = 2, .hq = 8, .hkv = 2, .sq = 200, .sk = 333,
     .order = FGH_BHSD},
    {.name = "mqa 8/1 d128", .d = 128, .batch = 2, .hq = 8, .hkv = 1, .sq = 150, .sk = 257},
    {.name = "mqa 8/1 d64", .d = 64, .batch = 2, .hq = 8, .hkv = 1, .sq = 257, .sk = 150,
     .order = FGH_BHSD},
    {.name = "gqa 8/2 causal", .d = 64, .batch = 2, .hq = 8, .hkv = 2, .sq = 200, .sk = 333,
     .mask = FG_MASK_CAUSAL},
    {.name = "mqa 8/1 window", .d = 128, .hq = 8, .hkv = 1, .sq = 300, .sk = 300,
     .order = FGH_BHSD, .mask = FG_MASK_WINDOW, .wl = 40, .wr = 8},
    {.name = "gqa 8/2 bf16", .dtype = FG_BF16, .d = 64, .batch = 2, .hq = 8, .hkv = 2, .sq = 129,
     .sk = 200},
    /* more thread blocks than about 132 SMs hold at once (33 (batch,
     * key/value head) pairs x 8 key blocks of 128): the backward's
     * deterministic turns pass between thread blocks of different waves */
    {.name = "det waves d64", .d = 64, .batch = 3, .hq = 11, .sq = 257, .sk = 1000, .quick = 1},
    {.name = "det waves gqa causal d128", .d = 128, .batch = 3, .hq = 22, .hkv = 11, .sq = 130,
     .sk = 1000, .mask = FG_MASK_CAUSAL, .order = FGH_BHSD},
};

/* Causal, both alignments, Sq < Sk, Sq > Sk (bottom-right masks whole rows)
 * and Sq == Sk, head dims 64 and 128, layouts alternating. */
static void add_causal_cases(void) {
    static const int lens[3][2] = {{100, 300}, {300, 100}, {257, 257}};
    static char names[12][48];
    int n = 0;
    for (int d = 64; d <= 128; d *= 2)
        for (int al = 0; al < 2; al++)
            for (int l = 0; l < 3; l++, n++) {
                snprintf(names[n], sizeof names[n], "causal %s %dx%d d%d", al ? "tl" : "br",
                         lens[l][0], lens[l][1], d);
                add((struct gpu_case){.name = names[n], .d = d, .batch = 2, .hq = 2,
                                      .sq = lens[l][0], .sk = lens[l][1], .order = n % 2,
                                      .mask = FG_MASK_CAUSAL, .align = (fg_causal_align)al,
                                      .quick = n == 1});
            }
    add((struct gpu_case){.name = "causal br 300x100 bf16", .dtype = FG_BF16, .d = 64, .batch = 2,
                          .hq = 2, .sq = 300, .sk = 100, .mask = FG_MASK_CAUSAL, .quick = 1});
    add((struct gpu_case){.name = "causal tl 100x300 bf16", .dtype = FG_BF16, .d = 64, .hq = 2,
                          .sq = 100, .sk = 300, .order = FGH_BHSD, .mask = FG_MASK_CAUSAL,
                          .align = FG_ALIGN_TOP_LEFT});
}

#define WINDOW(nm, dd, q, k, al, l, r)                                                        \
    {.name = nm, .d = dd, .batch = 2, .hq = 2, .sq = q, .sk = k, .mask = FG_MASK_WINDOW,        \
     .align = al, .wl = l, .wr = r}
static const struct gpu_case window_cases[] = {
    WINDOW("window 32/0", 64, 300, 300, FG_ALIGN_BOTTOM_RIGHT, 32, 0),
    WINDOW("window 0/32 tl", 128, 300, 300, FG_ALIGN_TOP_LEFT, 0, 32),
    WINDOW("window -1/16", 64, 200, 500, FG_ALIGN_BOTTOM_RIGHT, -1, 16),
    WINDOW("window 16/-1", 128, 500, 200, FG_ALIGN_BOTTOM_RIGHT, 16, -1),
    WINDOW("window 0/0 tl", 64, 129, 129, FG_ALIGN_TOP_LEFT, 0, 0),
    /* rows i < 150 see no key */
    WINDOW("window 100/50 empty rows", 64, 300, 100, FG_ALIGN_BOTTOM_RIGHT, 100, 50),
    WINDOW("window -1/-1 tl", 128, 100, 300, FG_ALIGN_TOP_LEFT, -1, -1),
    /* rows i > 206 see no key */
    WINDOW("window 7/3 tl empty rows", 64, 500, 200, FG_ALIGN_TOP_LEFT, 7, 3),
    /* sides of INT_MAX, as unbounded (the kernels take them clamped) */
    WINDOW("window max/5", 64, 500, 300, FG_ALIGN_BOTTOM_RIGHT, INT32_MAX, 5),
    WINDOW("window max/max tl", 128, 300, 500, FG_ALIGN_TOP_LEFT, INT32_MAX, INT32_MAX),
    {.name = "window 128/128 long", .d = 64, .hq = 2, .sq = 4097, .sk = 4097,
     .mask = FG_MASK_WINDOW, .wl = 128, .wr = 128, .quick = 1},
    {.name = "window 64/0 tl bf16", .dtype = FG_BF16, .d = 128, .hq = 2, .sq = 300, .sk = 300,
     .order = FGH_BHSD, .mask = FG_MASK_WINDOW, .align = FG_ALIGN_TOP_LEFT, .wl = 64, .wr = 0},
};

/* (a) probe inputs: window [i, i+D-1] so each d sees at most one key;
 * (c) random inputs with p = 0.1 against the reference with the same stream. */
#define PROBE(nm, dt, s, off, q)                                                                \
    {.name = nm, .dtype = dt, .d = 64, .batch = 2, .hq = 3, .sq = 300, .sk = 300,                \
     .mask = FG_MASK_WINDOW, .wl = 0, .wr = 63, .dropout_p = 0.3f, .seed = s, .offset = off,     \
     .probe = 1, .quick = q}
static const struct gpu_case dropout_cases[] = {
    PROBE("dropout keep 1", FG_FP16, 0x1234u, 0, 1),
    PROBE("dropout keep 2", FG_FP16, 0xdeadbeefcafef00dull, 0x100000007ull, 0),
    PROBE("dropout keep 3", FG_FP16, 42, 0xffffffff00000010ull, 0),
    PROBE("dropout keep bf16", FG_BF16, 7, 12345, 0),
    {.name = "dropout 0.1", .d = 64, .batch = 2, .hq = 2, .sq = 200, .sk = 300,
     .dropout_p = 0.1f, .seed = 99, .offset = 5, .quick = 1},
    {.name = "dropout 0.1 causal tl", .d = 128, .hq = 2, .sq = 300, .sk = 300, .order = FGH_BHSD,
     .mask = FG_MASK_CAUSAL, .align = FG_ALIGN_TOP_LEFT, .dropout_p = 0.1f, .seed = 3,
     .offset = 1ull << 40},
    {.name = "dropout 0.1 gqa", .d = 64, .batch = 2, .hq = 4, .hkv = 2, .sq = 150, .sk = 200,
     .dropout_p = 0.1f, .seed = 11, .offset = 77},
    /* the deterministic sm_90a kernel at d = 65..128 without a mask */
    {.name = "dropout 0.1 d128", .d = 128, .batch = 2, .hq = 2, .sq = 200, .sk = 333,
     .dropout_p = 0.1f, .seed = 17, .offset = 9},
    {.name = "dropout 0.1 d96 gqa bf16", .dtype = FG_BF16, .d = 96, .hq = 4, .hkv = 2, .sq = 150,
     .sk = 260, .dropout_p = 0.1f, .seed = 21, .offset = 4},
    /* and under a mask (its consumers' steps' bounds in shared memory) */
    {.name = "dropout 0.1 d128 causal gqa bf16", .dtype = FG_BF16, .d = 128, .hq = 4, .hkv = 2,
     .sq = 211, .sk = 333, .mask = FG_MASK_CAUSAL, .dropout_p = 0.1f, .seed = 29, .offset = 6,
     .quick = 1},
    {.name = "dropout 0.15 d80 window softcap alibi", .d = 80, .batch = 2, .hq = 2, .sq = 177,
     .sk = 250, .mask = FG_MASK_WINDOW, .wl = 60, .wr = 15, .variants = CASE_SOFTCAP | CASE_ALIBI,
     .softcap = 3.0f, .dropout_p = 0.15f, .seed = 37, .offset = 12},
    {.name = "dropout 0.1 window", .d = 64, .hq = 2, .sq = 300, .sk = 400, .mask = FG_MASK_WINDOW,
     .wl = 50, .wr = 10, .dropout_p = 0.1f, .seed = 5, .offset = 9},
    {.name = "dropout 0.1 bf16", .dtype = FG_BF16, .d = 64, .hq = 2, .sq = 200, .sk = 200,
     .order = FGH_BHSD, .dropout_p = 0.1f, .seed = 1, .offset = 2},
    /* above d = 128: the sm_90a backward's split kernel (consumers share the keys) */
    {.name = "dropout 0.1 d256 causal gqa bf16", .dtype = FG_BF16, .d = 256, .hq = 4, .hkv = 2,
     .sq = 190, .sk = 333, .mask = FG_MASK_CAUSAL, .dropout_p = 0.1f, .seed = 13, .offset = 3,
     .quick = 1},
    {.name = "dropout 0.2 d192/128 window", .d = 192, .dv = 128, .batch = 2, .hq = 2, .sq = 131,
     .sk = 257, .mask = FG_MASK_WINDOW, .wl = 70, .wr = 20, .dropout_p = 0.2f, .seed = 23,
     .offset = 8, .quick = 1},
    {.name = "dropout 0.1 d160 bf16", .dtype = FG_BF16, .d = 160, .batch = 2, .hq = 2, .sq = 129,
     .sk = 200, .order = FGH_BHSD, .dropout_p = 0.1f, .seed = 4, .offset = 1},
};

#define LAYOUT(nm, dd, bq, bk, per_head)                                                        \
    .name = nm, .d = dd, .sparsity = FG_SPARSE_LAYOUT, .block_q = bq, .block_k = bk,             \
    .per_head_layout = per_head
#define BUTTERFLY_B(nm, f, dd, bq, bk)                                                          \
    .name = nm, .d = dd, .sparsity = FG_SPARSE_BUTTERFLY, .block_q = bq, .block_k = bk,          \
    .factors = f
#define BUTTERFLY(nm, f) BUTTERFLY_B(nm, f, 64, 64, 64)
static const struct gpu_case sparse_cases[] = {
    {LAYOUT("layout 64 per head", 64, 64, 64, 1), .batch = 2, .hq = 2, .sq = 300, .sk = 300,
     .quick = 1},
    {LAYOUT("layout 64 shared gqa", 64, 64, 64, 0), .hq = 4, .hkv = 2, .sq = 200, .sk = 400,
     .order = FGH_BHSD},
    {LAYOUT("layout 128 per head", 64, 128, 128, 1), .hq = 3, .sq = 300, .sk = 500},
    {LAYOUT("layout 128 shared", 128, 128, 128, 0), .batch = 2, .hq = 2, .sq = 400, .sk = 257,
     .order = FGH_BHSD},
    {LAYOUT("layout 64x128", 64, 64, 128, 1), .hq = 2, .sq = 250, .sk = 600},
    {LAYOUT("layout 64 causal", 64, 64, 64, 1), .hq = 2, .sq = 300, .sk = 300,
     .mask = FG_MASK_CAUSAL},
    {BUTTERFLY("butterfly 0", 0), .hq = 2, .sq = 520, .sk = 520},
    {BUTTERFLY("butterfly 2", 2), .batch = 2, .hq = 2, .sq = 520, .sk = 520, .order = FGH_BHSD},
    {BUTTERFLY("butterfly 3", 3), .hq = 2, .sq = 300, .sk = 520},
    {BUTTERFLY("butterfly 2 causal", 2), .hq = 2, .sq = 520, .sk = 520, .mask = FG_MASK_CAUSAL,
     .quick = 1},
    {BUTTERFLY("butterfly 3 causal tl", 3), .hq = 2, .sq = 520, .sk = 300,
     .mask = FG_MASK_CAUSAL, .align = FG_ALIGN_TOP_LEFT},
    /* blocks of whole sm_90a backward tiles (64 queries x 128 keys) */
    {BUTTERFLY_B("butterfly 2 b128", 2, 128, 128, 128), .hq = 2, .sq = 1100, .sk = 1100},
    {BUTTERFLY_B("butterfly 3 b64x256 causal", 3, 64, 64, 256), .hq = 4, .hkv = 2, .sq = 1000,
     .sk = 1300, .mask = FG_MASK_CAUSAL, .quick = 1},
    {BUTTERFLY_B("butterfly 1 b128x256 window", 1, 96, 128, 256), .hq = 1, .sq = 900, .sk = 700,
     .mask = FG_MASK_WINDOW, .wl = 300, .wr = 100, .order = FGH_BHSD},
    {LAYOUT("layout 128 causal gqa", 128, 128, 128, 1), .batch = 2, .hq = 4, .hkv = 2,
     .sq = 700, .sk = 900, .mask = FG_MASK_CAUSAL, .align = FG_ALIGN_TOP_LEFT, .quick = 1},
    {LAYOUT("layout 64x256 dropout", 72, 64, 256, 0), .hq = 2, .sq = 333, .sk = 1000,
     .dropout_p = 0.1f, .seed = 21, .offset = 5},
};

/* Blocks of a longer call (context parallelism): the mask's diagonal and
 * dropout's draws at the positions, rows that see no key among them. */
static const struct gpu_case block_cases[] = {
    {.name = "block causal tl dropout", .d = 128, .hq = 4, .hkv = 2, .sq = 300, .sk = 300,
     .mask = FG_MASK_CAUSAL, .align = FG_ALIGN_TOP_LEFT, .dropout_p = 0.1f, .seed = 17,
     .offset = 3, .pos_q = 480, .pos_k = 640, .quick = 1},
    {.name = "block causal br", .dtype = FG_BF16, .d = 64, .batch = 2, .hq = 2, .sq = 200,
     .sk = 300, .mask = FG_MASK_CAUSAL, .pos_q = 151, .pos_k = 300},
    {.name = "block window dropout bf16", .dtype = FG_BF16, .d = 128, .hq = 2, .sq = 333,
     .sk = 400, .order = FGH_BHSD, .mask = FG_MASK_WINDOW, .align = FG_ALIGN_TOP_LEFT, .wl = 200,
     .wr = 50, .dropout_p = 0.1f, .seed = 8, .offset = 4, .pos_q = 4096, .pos_k = 3968},
    {.name = "block full dropout gqa", .d = 64, .batch = 2, .hq = 4, .hkv = 1, .sq = 129,
     .sk = 257, .dropout_p = 0.2f, .seed = 5, .offset = 1, .pos_q = 1 << 20, .pos_k = 96},
    {.name = "block dropout keep", .d = 64, .batch = 2, .hq = 3, .sq = 300, .sk = 400,
     .mask = FG_MASK_WINDOW, .align = FG_ALIGN_TOP_LEFT, .wl = 0, .wr = 63, .dropout_p = 0.3f,
     .seed = 0x5eed, .offset = 12, .probe = 1, .pos_q = 160, .pos_k = 96, .quick = 1},
};

/* The logits' variants, each made to bind: caps of 0.5..4 on scores of a few
 * units (scale 1 makes them ~sqrt(d)), ALiBi slopes of 1/16..1/256 over
 * hundreds of keys, sinks of 0.5..3.5 beside row maxima of ~3; with masks
 * (a masked score stays -inf through the cap), rows that see no key, GQA,
 * dropout, sparsity and blocks of a longer call. */
static const struct gpu_case variant_cases[] = {
    {.name = "softcap 2", .d = 64, .batch = 2, .hq = 2, .sq = 177, .sk = 251,
     .variants = CASE_SOFTCAP, .softcap = 2.0f, .quick = 1},
    {.name = "softcap 0.5 scale 1 causal", .d = 128, .hq = 2, .sq = 300, .sk = 300,
     .order = FGH_BHSD, .scale = 1.0f, .mask = FG_MASK_CAUSAL, .variants = CASE_SOFTCAP,
     .softcap = 0.5f},
    {.name = "softcap 4 d256 bf16", .dtype = FG_BF16, .d = 256, .hq = 2, .sq = 133, .sk = 250,
     .scale = 0.3f, .variants = CASE_SOFTCAP, .softcap = 4.0f, .quick = 1},
    {.name = "softcap 3 d33 window", .d = 33, .hq = 3, .sq = 150, .sk = 170,
     .mask = FG_MASK_WINDOW, .wl = 20, .wr = 5, .variants = CASE_SOFTCAP, .softcap = 3.0f},
    {.name = "alibi", .d = 64, .batch = 2, .hq = 4, .sq = 200, .sk = 333, .variants = CASE_ALIBI},
    {.name = "alibi per batch causal tl gqa", .d = 128, .batch = 3, .hq = 4, .hkv = 2,
     .sq = 257, .sk = 300, .mask = FG_MASK_CAUSAL, .align = FG_ALIGN_TOP_LEFT,
     .variants = CASE_ALIBI, .alibi_per_batch = 1, .quick = 1},
    {.name = "alibi d96 bf16 sq>sk", .dtype = FG_BF16, .d = 96, .hq = 2, .sq = 300, .sk = 130,
     .order = FGH_BHSD, .variants = CASE_ALIBI},
    {.name = "sinks", .d = 64, .batch = 2, .hq = 4, .sq = 150, .sk = 230, .variants = CASE_SINKS,
     .quick = 1},
    {.name = "sinks causal br empty rows", .d = 128, .hq = 2, .sq = 300, .sk = 100,
     .mask = FG_MASK_CAUSAL, .variants = CASE_SINKS},
    {.name = "sinks window 8 gqa bf16", .dtype = FG_BF16, .d = 64, .batch = 2, .hq = 8,
     .hkv = 2, .sq = 260, .sk = 260, .mask = FG_MASK_WINDOW, .wl = 8, .wr = 0,
     .variants = CASE_SINKS},
    {.name = "sinks d256", .d = 256, .hq = 2, .sq = 97, .sk = 301, .variants = CASE_SINKS},
    {.name = "all variants causal", .d = 128, .batch = 2, .hq = 4, .hkv = 2, .sq = 233,
     .sk = 233, .mask = FG_MASK_CAUSAL, .variants = CASE_SOFTCAP | CASE_ALIBI | CASE_SINKS,
     .softcap = 1.5f, .quick = 1},
    {.name = "all variants dropout", .d = 64, .batch = 2, .hq = 2, .sq = 200, .sk = 300,
     .dropout_p = 0.1f, .seed = 31, .offset = 6,
     .variants = CASE_SOFTCAP | CASE_ALIBI | CASE_SINKS, .softcap = 2.0f},
    {.name = "softcap sinks layout", .sparsity = FG_SPARSE_LAYOUT, .block_q = 64, .block_k = 64,
     .per_head_layout = 1, .d = 64, .hq = 2, .sq = 300, .sk = 300,
     .variants = CASE_SOFTCAP | CASE_SINKS, .softcap = 1.0f},
    {.name = "alibi softcap block", .d = 64, .hq = 2, .sq = 200, .sk = 300,
     .mask = FG_MASK_CAUSAL, .pos_q = 151, .pos_k = 300, .variants = CASE_ALIBI | CASE_SOFTCAP,
     .softcap = 2.5f},
    {.name = "all variants d256 bf16 causal", .dtype = FG_BF16, .d = 256, .hq = 2, .sq = 190,
     .sk = 190, .mask = FG_MASK_CAUSAL, .variants = CASE_SOFTCAP | CASE_ALIBI | CASE_SINKS,
     .softcap = 1.0f},
    /* d_v > 192 with dropout: the rows' maxima move only by more than 2^8 (scores
     * of ~16 units, ALiBi lowering the far keys, so they do move) */
    {.name = "alibi dropout scale 1 d256", .d = 256, .hq = 2, .sq = 150, .sk = 400,
     .scale = 1.0f, .variants = CASE_ALIBI, .dropout_p = 0.1f, .seed = 41, .offset = 5},
};

/* Score and mask expressions, against the reference's own evaluation of
 * them: forward and backward (the aux tensors' gradients with it), odd
 * lengths, GQA, masks beside them, sinks, dropout; the built-ins written as
 * expressions bind as theirs do. */
static const struct gpu_case expr_cases[] = {
    {.name = "expr rel bias", .d = 64, .batch = 2, .hq = 4, .hkv = 2, .sq = 173, .sk = 251,
     .expr = EXPR_REL_BIAS, .quick = 1},
    {.name = "expr rel bias causal d128 bf16", .dtype = FG_BF16, .d = 128, .hq = 2, .sq = 300,
     .sk = 300, .mask = FG_MASK_CAUSAL, .expr = EXPR_REL_BIAS},
    {.name = "expr t5 d96", .d = 96, .batch = 2, .hq = 3, .sq = 150, .sk = 190,
     .order = FGH_BHSD, .expr = EXPR_T5, .quick = 1},
    {.name = "expr alibi sinks", .d = 64, .hq = 4, .sq = 200, .sk = 333, .expr = EXPR_ALIBI,
     .variants = CASE_SINKS},
    {.name = "expr softcap scale 1 d256", .d = 256, .hq = 2, .sq = 133, .sk = 250,
     .scale = 1.0f, .expr = EXPR_SOFTCAP},
    {.name = "expr gain", .d = 64, .batch = 2, .hq = 2, .sq = 177, .sk = 201, .expr = EXPR_GAIN,
     .quick = 1},
    {.name = "expr hide dropout", .d = 64, .hq = 2, .sq = 160, .sk = 210, .dropout_p = 0.2f,
     .seed = 77, .offset = 3, .expr = EXPR_HIDE},
    {.name = "expr docs", .d = 128, .batch = 2, .hq = 2, .sq = 333, .sk = 333, .expr = EXPR_DOCS,
     .quick = 1},
    {.name = "expr docs causal sinks gqa bf16", .dtype = FG_BF16, .d = 64, .hq = 4, .hkv = 1,
     .sq = 290, .sk = 290, .mask = FG_MASK_CAUSAL, .expr = EXPR_DOCS, .variants = CASE_SINKS},
    {.name = "expr prefix lm", .d = 64, .batch = 3, .hq = 2, .sq = 150, .sk = 231,
     .expr = EXPR_PREFIX},
    {.name = "expr bias docs d256 bf16", .dtype = FG_BF16, .d = 256, .hq = 2, .sq = 200,
     .sk = 260, .mask = FG_MASK_CAUSAL, .expr = EXPR_BIAS_DOCS},
    {.name = "expr window d33", .d = 33, .hq = 2, .sq = 170, .sk = 170, .expr = EXPR_WINDOW},
    {.name = "expr floordiv", .d = 64, .batch = 2, .hq = 2, .sq = 190, .sk = 233,
     .expr = EXPR_FLOORDIV, .quick = 1},
    {.name = "expr bias docs causal d128", .d = 128, .batch = 2, .hq = 2, .sq = 257, .sk = 257,
     .mask = FG_MASK_CAUSAL, .expr = EXPR_BIAS_DOCS, .quick = 1},
    {.name = "expr bias layout", .sparsity = FG_SPARSE_LAYOUT, .block_q = 64, .block_k = 64,
     .d = 64, .hq = 2, .sq = 300, .sk = 300, .expr = EXPR_REL_BIAS},
};

/* Block masks built from the predicate: empty blocks skipped, full ones
 * without the element test, partial ones with it; the reference tests the
 * predicate everywhere. */
#define BLOCK_MASK(label, bq, bk) .name = label, .sparsity = FG_SPARSE_LAYOUT, .block_q = bq, \
                                  .block_k = bk, .block_mask = 1
static const struct gpu_case block_mask_cases[] = {
    {BLOCK_MASK("block mask docs d128", 128, 128), .d = 128, .batch = 2, .hq = 2, .sq = 1000,
     .sk = 1000, .expr = EXPR_DOCS, .quick = 1},
    {BLOCK_MASK("block mask docs causal gqa bf16", 128, 128), .dtype = FG_BF16, .d = 64,
     .hq = 4, .hkv = 2, .sq = 777, .sk = 777, .mask = FG_MASK_CAUSAL, .expr = EXPR_DOCS},
    {BLOCK_MASK("block mask docs 64x128 d96", 64, 128), .d = 96, .hq = 2, .sq = 700, .sk = 900,
     .order = FGH_BHSD, .expr = EXPR_DOCS},
    {BLOCK_MASK("block mask per batch and head", 128, 128), .d = 64, .batch = 2, .hq = 3,
     .sq = 600, .sk = 600, .expr = EXPR_DOCS_BH, .quick = 1},
    {BLOCK_MASK("block mask prefix lm", 128, 128), .d = 64, .batch = 3, .hq = 2, .sq = 300,
     .sk = 500, .expr = EXPR_PREFIX},
    {BLOCK_MASK("block mask bias docs causal d128", 128, 128), .d = 128, .batch = 2, .hq = 2,
     .sq = 513, .sk = 513, .mask = FG_MASK_CAUSAL, .expr = EXPR_BIAS_DOCS, .quick = 1},
    {BLOCK_MASK("block mask window sinks", 64, 64), .d = 64, .hq = 2, .sq = 900, .sk = 900,
     .expr = EXPR_WINDOW, .variants = CASE_SINKS},
};

/* Value head dims unlike the head dim (DeepSeek's 192/128 among them), both
 * narrower and wider, odd ones and odd lengths, causal and not, GQA, both
 * layouts, fp16 and bf16, dropout, a window, sinks and a layout; every name
 * holds "dv". */
static const struct gpu_case dv_cases[] = {
    {.name = "dv 192/128", .d = 192, .dv = 128, .batch = 2, .hq = 2, .sq = 131, .sk = 257,
     .quick = 1},
    {.name = "dv 192/128 causal gqa bf16", .dtype = FG_BF16, .d = 192, .dv = 128, .hq = 4,
     .hkv = 2, .sq = 300, .sk = 300, .order = FGH_BHSD, .mask = FG_MASK_CAUSAL, .quick = 1},
    {.name = "dv 128/64 causal br", .d = 128, .dv = 64, .batch = 2, .hq = 2, .sq = 77,
     .sk = 333, .mask = FG_MASK_CAUSAL},
    {.name = "dv 96/64 mqa bf16", .dtype = FG_BF16, .d = 96, .dv = 64, .hq = 6, .hkv = 1,
     .sq = 201, .sk = 133},
    {.name = "dv 128/64 gqa", .d = 128, .dv = 64, .batch = 2, .hq = 4, .hkv = 2, .sq = 173,
     .sk = 259, .order = FGH_BHSD, .quick = 1},
    {.name = "dv 256/128 causal tl", .d = 256, .dv = 128, .hq = 2, .sq = 257, .sk = 129,
     .order = FGH_BHSD, .mask = FG_MASK_CAUSAL, .align = FG_ALIGN_TOP_LEFT},
    {.name = "dv 64/128", .d = 64, .dv = 128, .batch = 2, .hq = 2, .sq = 199, .sk = 311,
     .quick = 1},
    {.name = "dv 64/128 causal gqa bf16", .dtype = FG_BF16, .d = 64, .dv = 128, .hq = 4,
     .hkv = 1, .sq = 255, .sk = 255, .mask = FG_MASK_CAUSAL},
    {.name = "dv 32/256 bf16", .dtype = FG_BF16, .d = 32, .dv = 256, .hq = 2, .sq = 97,
     .sk = 150},
    {.name = "dv 33/65 odd", .d = 33, .dv = 65, .hq = 3, .sq = 67, .sk = 131, .pad = 3},
    {.name = "dv 72/40 causal gapped", .d = 72, .dv = 40, .batch = 2, .hq = 2, .sq = 143,
     .sk = 143, .pad = 8, .order = FGH_BHSD, .mask = FG_MASK_CAUSAL},
    {.name = "dv 100/3 window", .d = 100, .dv = 3, .hq = 2, .sq = 190, .sk = 230,
     .mask = FG_MASK_WINDOW, .wl = 40, .wr = 7},
    {.name = "dv 192/128 dropout", .d = 192, .dv = 128, .hq = 2, .sq = 160, .sk = 220,
     .dropout_p = 0.1f, .seed = 19, .offset = 4},
    {.name = "dv 128/64 sinks softcap", .d = 128, .dv = 64, .hq = 4, .hkv = 2, .sq = 150,
     .sk = 230, .variants = CASE_SOFTCAP | CASE_SINKS, .softcap = 2.0f},
    {.name = "dv 192/128 layout causal bf16", .dtype = FG_BF16, .d = 192, .dv = 128,
     .sparsity = FG_SPARSE_LAYOUT, .block_q = 128, .block_k = 128, .per_head_layout = 1,
     .hq = 2, .sq = 400, .sk = 400, .mask = FG_MASK_CAUSAL},
    {.name = "dv 128/64 long causal", .d = 128, .dv = 64, .hq = 1, .sq = 1000, .sk = 1000,
     .mask = FG_MASK_CAUSAL},
    /* three boxes of Q and K, at most two of V: 32 query rows a step, dQ
     * once a pair of steps */
    {.name = "dv 160/128 window gapped", .d = 160, .dv = 128, .batch = 2, .hq = 2, .sq = 77,
     .sk = 333, .pad = 8, .mask = FG_MASK_WINDOW, .wl = 60, .wr = 9},
    {.name = "dv 136/64 softcap alibi sinks gqa bf16", .dtype = FG_BF16, .d = 136, .dv = 64,
     .hq = 4, .hkv = 2, .sq = 190, .sk = 161, .order = FGH_BHSD,
     .variants = CASE_SOFTCAP | CASE_ALIBI | CASE_SINKS, .softcap = 3.0f},
    {.name = "dv 192/128 causal tl long", .d = 192, .dv = 128, .hq = 1, .sq = 1000, .sk = 700,
     .mask = FG_MASK_CAUSAL, .align = FG_ALIGN_TOP_LEFT},
};

/* Head dims above 128, where the Hopper backward's consumers share the keys
 * and split the columns: three and four boxes, odd dims, masks of both
 * alignments, GQA, the variants, a layout, a block of a longer call,
 * thread blocks in waves (deterministic turns), more key blocks than SMs,
 * dropout (the mma.sync backward); every name holds "wide". */
static const struct gpu_case wide_cases[] = {
    {.name = "wide 192 causal gqa bf16", .dtype = FG_BF16, .d = 192, .hq = 4, .hkv = 2,
     .sq = 300, .sk = 300, .mask = FG_MASK_CAUSAL, .quick = 1},
    {.name = "wide 256 long causal", .d = 256, .hq = 1, .sq = 1000, .sk = 1000,
     .mask = FG_MASK_CAUSAL, .quick = 1},
    {.name = "wide 136 window gapped", .d = 136, .hq = 2, .sq = 190, .sk = 230, .pad = 8,
     .mask = FG_MASK_WINDOW, .wl = 40, .wr = 7},
    {.name = "wide 200 len 77x333", .d = 200, .batch = 2, .hq = 2, .sq = 77, .sk = 333,
     .order = FGH_BHSD},
    {.name = "wide 248 causal tl", .d = 248, .hq = 2, .sq = 257, .sk = 129, .order = FGH_BHSD,
     .mask = FG_MASK_CAUSAL, .align = FG_ALIGN_TOP_LEFT},
    {.name = "wide 256 softcap alibi sinks bf16", .dtype = FG_BF16, .d = 256, .hq = 4,
     .hkv = 2, .sq = 150, .sk = 230, .variants = CASE_SOFTCAP | CASE_ALIBI | CASE_SINKS,
     .softcap = 2.0f, .quick = 1},
    {.name = "wide 160 rel bias causal", .d = 160, .hq = 2, .sq = 200, .sk = 300,
     .mask = FG_MASK_CAUSAL, .expr = EXPR_REL_BIAS},
    {.name = "wide 192 layout causal", .d = 192, .sparsity = FG_SPARSE_LAYOUT, .block_q = 128,
     .block_k = 128, .per_head_layout = 1, .hq = 2, .sq = 400, .sk = 400,
     .mask = FG_MASK_CAUSAL},
    {.name = "wide 256 block causal", .dtype = FG_BF16, .d = 256, .hq = 2, .sq = 200, .sk = 250,
     .mask = FG_MASK_CAUSAL, .pos_q = 160, .pos_k = 96},
    {.name = "wide 256 det waves", .d = 256, .batch = 3, .hq = 11, .sq = 257, .sk = 1000,
     .quick = 1},
    /* more key blocks than SMs: fast calls take the deterministic schedule unwrapped */
    {.name = "wide 256 keys past the SMs bf16", .dtype = FG_BF16, .d = 256, .hq = 2, .sq = 130,
     .sk = 8600},
    {.name = "wide 208 keys past the SMs gqa dropout", .d = 208, .hq = 4, .hkv = 2, .sq = 70,
     .sk = 8500, .order = FGH_BHSD, .dropout_p = 0.1f, .seed = 5, .offset = 3},
    {.name = "wide 192 dropout", .d = 192, .hq = 2, .sq = 160, .sk = 220, .dropout_p = 0.1f,
     .seed = 23, .offset = 8},
    /* the deterministic kernel with dropout under each of its register splits */
    {.name = "wide 256 layout dropout", .dtype = FG_BF16, .d = 256, .sparsity = FG_SPARSE_LAYOUT,
     .block_q = 128, .block_k = 128, .per_head_layout = 1, .hq = 2, .sq = 300, .sk = 390,
     .dropout_p = 0.1f, .seed = 31, .offset = 5},
    {.name = "wide 256 rel bias dropout", .d = 256, .hq = 2, .sq = 170, .sk = 260,
     .mask = FG_MASK_CAUSAL, .expr = EXPR_REL_BIAS, .dropout_p = 0.1f, .seed = 7, .offset = 2},
};

/* More query blocks than about 132 SMs hold, so the Hopper forward's thread
 * blocks walk several where the tiles leave room for O apart (d <= 128:
 * d 64's derived plan and a window's Bc 64, d 128's Bc 160 over 1025..2048
 * keys): no mask, causal or a window from lists made on the host, causal
 * without them in pairs of blocks M-1-i and i (an odd count's middle one
 * alone); bottom-right causal with Sq > Sk walks blocks that see no key; d
 * 128 under a window takes Bc 128, which does not walk. d 256,
 * 192/128 and dropout run the same text one thread block a query block.
 * The backward's blocks walk key tiles (key block, key/value head, batch)
 * past about 132: the fast kernel's where its plan walks, the
 * deterministic one's under a mask at 80 rows a step (d 65..128), as the
 * last two cases (160 and 144 tiles, the last windowed on both sides). */
static const struct gpu_case walk_cases[] = {
    {.name = "walk d64 bf16", .dtype = FG_BF16, .d = 64, .batch = 2, .hq = 35, .sq = 384,
     .sk = 256, .quick = 1},
    {.name = "walk causal odd d64", .d = 64, .batch = 2, .hq = 34, .hkv = 17, .sq = 500,
     .sk = 500, .mask = FG_MASK_CAUSAL, .order = FGH_BHSD},
    {.name = "walk causal br 600x200 d64 softcap sinks", .d = 64, .batch = 2, .hq = 34,
     .sq = 600, .sk = 200, .mask = FG_MASK_CAUSAL, .variants = CASE_SOFTCAP | CASE_SINKS,
     .softcap = 3.0f, .quick = 1},
    {.name = "walk dropout d64", .d = 64, .batch = 2, .hq = 36, .sq = 300, .sk = 200,
     .dropout_p = 0.1f, .seed = 11, .offset = 3},
    {.name = "walk d256 gqa bf16", .dtype = FG_BF16, .d = 256, .batch = 2, .hq = 34, .hkv = 17,
     .sq = 257, .sk = 100},
    {.name = "walk causal br 300x150 d192/128", .d = 192, .dv = 128, .batch = 2, .hq = 34,
     .sq = 300, .sk = 150, .mask = FG_MASK_CAUSAL},
    {.name = "walk d128 1030 keys bf16", .dtype = FG_BF16, .d = 128, .batch = 2, .hq = 34,
     .hkv = 17, .sq = 129, .sk = 1030, .quick = 1},
    {.name = "walk causal d128 1030 keys", .d = 128, .batch = 2, .hq = 34, .sq = 129,
     .sk = 1030, .mask = FG_MASK_CAUSAL},
    {.name = "walk causal d128 softcap sinks gqa bf16", .dtype = FG_BF16, .d = 128, .batch = 2,
     .hq = 20, .hkv = 10, .sq = 900, .sk = 1001, .mask = FG_MASK_CAUSAL,
     .variants = CASE_SOFTCAP | CASE_SINKS, .softcap = 20.0f, .quick = 1},
    {.name = "walk window 300/40 d96 gqa", .d = 96, .batch = 3, .hq = 24, .hkv = 8, .sq = 700,
     .sk = 650, .mask = FG_MASK_WINDOW, .wl = 300, .wr = 40, .order = FGH_BHSD},
    {.name = "walk window 255/0 d64 bf16", .dtype = FG_BF16, .d = 64, .batch = 2, .hq = 24,
     .sq = 1000, .sk = 1000, .mask = FG_MASK_WINDOW, .wl = 255, .wr = 0, .quick = 1},
    {.name = "walk window 300/77 tl 900x700 d64", .d = 64, .batch = 2, .hq = 30, .sq = 900,
     .sk = 700, .mask = FG_MASK_WINDOW, .align = FG_ALIGN_TOP_LEFT, .wl = 300, .wr = 77},
    {.name = "walk window 2000/100 d64 gqa", .d = 64, .batch = 2, .hq = 16, .hkv = 4,
     .sq = 1500, .sk = 1600, .mask = FG_MASK_WINDOW, .wl = 2000, .wr = 100},
    {.name = "window 1023/0 d128 bf16", .dtype = FG_BF16, .d = 128, .batch = 1, .hq = 6,
     .hkv = 2, .sq = 2300, .sk = 2300, .mask = FG_MASK_WINDOW, .wl = 1023, .wr = 0, .quick = 1},
};

/* Three consumer warpgroups (d <= 64: 192 query rows a block) each take
 * the block's key tiles only up to the last its own rows see: 450 rows
 * leave the last block's second warpgroup 2 rows and its third none; under
 * a causal mask the first stops a tile or two before the diagonal's end,
 * under a window before its right edge; bottom-right with Sq > Sk leaves
 * the top warpgroups no key at all. */
static const struct gpu_case own_tiles_cases[] = {
    {.name = "own tiles causal 450 d64", .d = 64, .hq = 3, .sq = 450, .sk = 450,
     .mask = FG_MASK_CAUSAL, .quick = 1},
    {.name = "own tiles 450x700 d64 bf16", .dtype = FG_BF16, .d = 64, .batch = 2, .hq = 2,
     .sq = 450, .sk = 700},
    {.name = "own tiles window 450 d64 dropout", .d = 64, .hq = 2, .sq = 450, .sk = 450,
     .mask = FG_MASK_WINDOW, .wl = 100, .wr = 30, .dropout_p = 0.1f, .seed = 5, .offset = 1},
    {.name = "own tiles causal br 700x260 d40", .d = 40, .hq = 2, .hkv = 1, .sq = 700, .sk = 260,
     .mask = FG_MASK_CAUSAL, .order = FGH_BHSD, .quick = 1},
};

/* The backward's dK and dV go out through shared memory, by their tensor
 * maps, where the head dims are multiples of 8 (else from registers): rows
 * with gaps, a block's last keys past the end, GQA's key heads, a value
 * head dim of its own. Two consumer warpgroups (d 65..256)
 * under a mask take only their own key tiles in the forward: 300 rows
 * leave the last block's second warpgroup none, bottom-right 400 x 150
 * leaves the top rows no key, a window cuts each warpgroup's own. */
static const struct gpu_case rows_out_cases[] = {
    {.name = "rows out gapped d128 causal bf16", .dtype = FG_BF16, .d = 128, .hq = 2,
     .sq = 170, .sk = 170, .pad = 8, .mask = FG_MASK_CAUSAL, .order = FGH_BHSD, .quick = 1},
    {.name = "rows out gqa 6/2 d64/128 gapped", .d = 64, .dv = 128, .batch = 2, .hq = 6, .hkv = 2,
     .sq = 90, .sk = 200, .pad = 16},
    {.name = "own tiles causal 300 d128", .d = 128, .hq = 3, .hkv = 1, .sq = 300, .sk = 300,
     .mask = FG_MASK_CAUSAL, .quick = 1},
    {.name = "own tiles causal br 400x150 d256 bf16", .dtype = FG_BF16, .d = 256, .hq = 2,
     .sq = 400, .sk = 150, .mask = FG_MASK_CAUSAL, .order = FGH_BHSD},
    {.name = "own tiles window 333 d96 dropout", .d = 96, .hq = 2, .sq = 333, .sk = 333,
     .mask = FG_MASK_WINDOW, .wl = 90, .wr = 20, .dropout_p = 0.1f, .seed = 7, .offset = 2},
};

static void add_table(const struct gpu_case *t, size_t n) {
    for (size_t i = 0; i < n; i++) add(t[i]);
}
#define ADD_TABLE(t) add_table(t, sizeof t / sizeof t[0])

void build_cases(void) {
    if (gpu_case_count) return;
    add_head_dim_cases();
    ADD_TABLE(length_cases);
    ADD_TABLE(expr_cases);
    ADD_TABLE(block_mask_cases);
    ADD_TABLE(gqa_cases);
    add_causal_cases();
    ADD_TABLE(window_cases);
    ADD_TABLE(dropout_cases);
    ADD_TABLE(sparse_cases);
    ADD_TABLE(block_cases);
    ADD_TABLE(variant_cases);
    ADD_TABLE(dv_cases);
    ADD_TABLE(wide_cases);
    ADD_TABLE(walk_cases);
    ADD_TABLE(own_tiles_cases);
    ADD_TABLE(rows_out_cases);
}

int case_selected(const struct gpu_case *c, int quick, const char *filter) {
    return (!quick || c->quick) && (!filter || strstr(c->name, filter));
}

uint64_t case_seed(int i) { return 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1); }

int case_index(const char *name) {
    for (int i = 0; i < gpu_case_count; i++)
        if (strcmp(gpu_cases[i].name, name) == 0) return i;
    return -1;
}
