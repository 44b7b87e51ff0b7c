/* fp64 reference attention and the naive low-precision yardstick, forward
 * and backward. All walk one query row at a time: scores for the row,
 * softmax, then P·V accumulated over keys with the head dimension innermost,
 * so the memory beyond the inputs and outputs is one row of scores plus a few
 * D vectors (and, for the low-precision backward, one head's dK and dV).
 *
 * The scores' variants (softcap, ALiBi, sinks) enter where the row's scaled
 * scores become its logits: t = cap·tanh(s/cap) − slope·|i + off − j| on the
 * visible keys, and the sink as one more logit in the row's max and sum that
 * no value goes with. A plain problem takes exactly the path it took before
 * the variants.
 *
 * User expressions (expr_eval.h) enter at the same two places: the mask
 * predicate beside sparsity, per key, and the score modifier where the
 * variants would be, its dt/ds from dual numbers kept for the backward as the
 * cap's is. A problem without them takes the path it took before. */
#include "reference/reference.h"

#include <math.h>
#include <stdlib.h>

/* ---- visibility ------------------------------------------------------- */

static int mask_allows(const ref_problem *p, int64_t i, int64_t j) {
    int64_t d = j - (i + p->diag_offset);
    switch (p->mask) {
    case REF_MASK_NONE:
        return 1;
    case REF_MASK_CAUSAL:
        return d <= 0;
    case REF_MASK_WINDOW:
        return (p->window_left < 0 || d >= -(int64_t)p->window_left) &&
               (p->window_right < 0 || d <= (int64_t)p->window_right);
    default:
        return 0;
    }
}

static int sparsity_allows(const ref_problem *p, int h, int64_t i, int64_t j) {
    if (p->sparsity == REF_SPARSE_NONE)
        return 1;
    if (p->block_q <= 0 || p->block_k <= 0 || i < 0 || j < 0)
        return 0;
    int64_t bi = i / p->block_q, bj = j / p->block_k;
    if (p->sparsity == REF_SPARSE_LAYOUT) {
        if (!p->layout)
            return 0;
        int64_t nbq = p->layout_blocks_q ? p->layout_blocks_q
                                         : ((int64_t)p->seqlen_q + p->block_q - 1) / p->block_q;
        int64_t nbk = p->layout_blocks_k ? p->layout_blocks_k
                                         : ((int64_t)p->seqlen_k + p->block_k - 1) / p->block_k;
        if (bi >= nbq || bj >= nbk)
            return 0;
        int64_t lh = p->layout_heads == 1 ? 0 : h;
        if (lh < 0 || lh >= p->layout_heads)
            return 0;
        return p->layout[(lh * nbq + bi) * nbk + bj] != 0;
    }
    if (p->sparsity == REF_SPARSE_BUTTERFLY) {
        uint64_t x = (uint64_t)(bi ^ bj);
        if (x == 0)
            return 1;
        if (x & (x - 1))
            return 0; /* more than one bit differs */
        int lg = 0;
        while (x >>= 1)
            lg++;
        return lg < p->butterfly_factors;
    }
    return 0;
}

/* two's complement without relying on the implementation's conversion: the
 * expressions' ints are 32-bit */
static int32_t int32_of(int64_t x) {
    const uint32_t u = (uint32_t)x;
    return u <= (uint32_t)INT32_MAX ? (int32_t)u : (int32_t)(u - 0x80000000u) + INT32_MIN;
}

/* The variables of row i of batch b, head h; k and s are set per key. */
static expr_env row_env(const ref_problem *p, int b, int h, int64_t i) {
    expr_env e;
    e.s = 0.0;
    e.b = int32_of((int64_t)p->batch0 + b);
    e.h = h;
    e.q = int32_of(i + p->position_q);
    e.k = 0;
    e.seqlen_q = p->seqlen_q;
    e.seqlen_k = p->seqlen_k;
    e.decl = p->aux_decl;
    e.aux = p->aux;
    e.aux_count = p->aux_count;
    return e;
}

/* the mask predicate at key j of the row env stands for */
static int predicate_allows(const ref_problem *p, const expr_env *row, int64_t j) {
    if (!p->mask_mod)
        return 1;
    expr_env e = *row;
    e.k = int32_of(j + p->position_k);
    return expr_eval(p->mask_mod, &e) != 0.0;
}

/* t (when not NULL) can be evaluated against the problem's tensors */
static int expr_ok(const ref_problem *p, const expr_tree *t, expr_kind kind) {
    return !t || expr_eval_ok(t, kind, p->aux_decl, p->aux, p->aux_count);
}

int ref_visible_in(const ref_problem *p, int b, int h, int64_t i, int64_t j) {
    if (!mask_allows(p, i, j) || !sparsity_allows(p, h, i, j))
        return 0;
    if (!p->mask_mod)
        return 1;
    if (!expr_ok(p, p->mask_mod, EXPR_MASK))
        return 0;
    const expr_env row = row_env(p, b, h, i);
    return predicate_allows(p, &row, j);
}

int ref_visible(const ref_problem *p, int h, int64_t i, int64_t j) {
    return ref_visible_in(p, 0, h, i, j);
}

/* The keys [*lo, *hi] of row i that the mask allows, clipped to [0, Sk);
 * empty when *lo > *hi. Sparsity is checked per key on top of this. */
static void mask_range(const ref_problem *p, int64_t i, int64_t *lo, int64_t *hi) {
    int64_t a = 0, b = (int64_t)p->seqlen_k - 1, diag = i + p->diag_offset;
    if (p->mask == REF_MASK_CAUSAL) {
        if (diag < b)
            b = diag;
    } else if (p->mask == REF_MASK_WINDOW) {
        if (p->window_left >= 0 && diag - p->window_left > a)
            a = diag - p->window_left;
        if (p->window_right >= 0 && diag + p->window_right < b)
            b = diag + p->window_right;
    } else if (p->mask != REF_MASK_NONE) {
        b = -1;
    }
    *lo = a;
    *hi = b;
}

/* Shapes that the loops can walk safely; anything else is refused with -1
 * rather than read out of bounds. */
static int problem_ok(const ref_problem *p) {
    if (!p || p->batch < 0 || p->heads_q < 0 || p->heads_kv <= 0 || p->seqlen_q < 0 ||
        p->seqlen_k < 0 || p->head_dim <= 0 || p->head_dim_v < 0 ||
        p->heads_q % p->heads_kv != 0)
        return 0;
    if (p->mask != REF_MASK_NONE && p->mask != REF_MASK_CAUSAL && p->mask != REF_MASK_WINDOW)
        return 0;
    if (!(p->softcap >= 0.0 && isfinite(p->softcap)) || p->alibi_stride_batch < 0)
        return 0;
    if (!expr_ok(p, p->score_mod, EXPR_SCORE) || !expr_ok(p, p->mask_mod, EXPR_MASK))
        return 0;
    /* a score modifier replaces the cap and the bias: written in it instead */
    if (p->score_mod && (p->softcap > 0.0 || p->alibi_slopes))
        return 0;
    if (p->sparsity == REF_SPARSE_NONE)
        return 1;
    if (p->block_q <= 0 || p->block_k <= 0)
        return 0;
    if (p->sparsity == REF_SPARSE_LAYOUT)
        return p->layout && (p->layout_heads == 1 || p->layout_heads == p->heads_q);
    return p->sparsity == REF_SPARSE_BUTTERFLY;
}

/* ---- shared row helpers ----------------------------------------------------- */

/* Dropout decisions for one row, with the four Philox calls of the current
 * 32-column stretch cached: one call serves eight columns of the row (and
 * eight of its partner row i ^ 8), as in the kernels.
 * The layout is ref_dropout_keep's (the tests hold the two together). */
typedef struct drop_row {
    uint64_t seed, offset;
    uint32_t thr, ctr_i, ctr_bh;
    int lower; /* row i is in the lower half of its 16-row tile */
    int64_t position_k;
    int64_t stretch;
    uint32_t out[4][4];
} drop_row;

static void drop_row_init(drop_row *r, const ref_problem *p, uint32_t thr, int b, int h,
                          int64_t i) {
    r->seed = p->seed;
    r->offset = p->offset;
    r->thr = thr;
    i += p->position_q;
    r->ctr_i = (uint32_t)((i / 16) * 8 + i % 8);
    r->lower = (int)((i / 8) % 2);
    r->position_k = p->position_k;
    r->ctr_bh = ((uint32_t)(p->batch0 + b) << 16) | ((uint32_t)h & 0xffffu);
    r->stretch = -1;
}

static int drop_row_keep(drop_row *r, int64_t j) {
    j += r->position_k;
    int64_t stretch = j / 32;
    if (stretch != r->stretch) {
        const uint32_t key[2] = {(uint32_t)(r->seed & 0xffffffffu),
                                 (uint32_t)((r->seed >> 32) ^ (r->offset >> 32))};
        for (uint32_t t = 0; t < 4; t++) {
            const uint32_t ctr[4] = {(uint32_t)stretch * 4u + t, r->ctr_i, r->ctr_bh,
                                     (uint32_t)(r->offset & 0xffffffffu)};
            ref_philox4x32_10(ctr, key, r->out[t]);
        }
        r->stretch = stretch;
    }
    int v = r->lower * 8 + (int)(((j / 8) % 4) * 2 + j % 2);
    uint32_t x = (r->out[(j % 8) / 2][v / 4] >> (8 * (v % 4))) & 0xffu;
    return x >= r->thr;
}

/* ---- the scores' variants of one row ------------------------------------------ */

typedef struct row_var {
    double cap;   /* > 0: t = cap·tanh(s/cap); 0: none */
    int alibi;    /* the bias −slope·|diag − j| */
    double slope;
    int64_t diag; /* i + diag_offset: the key at distance 0 */
    int sinks;
    double sink;  /* the row's sink logit */
    expr_env env; /* the expressions' variables at the row */
} row_var;

static row_var row_var_init(const ref_problem *p, int b, int h, int64_t i) {
    row_var r;
    r.cap = p->softcap;
    r.alibi = p->alibi_slopes != NULL;
    r.slope = r.alibi
                  ? (double)p->alibi_slopes[(int64_t)(p->batch0 + b) * p->alibi_stride_batch + h]
                  : 0.0;
    r.diag = i + p->diag_offset;
    r.sinks = p->sinks != NULL;
    r.sink = r.sinks ? (double)p->sinks[h] : -INFINITY;
    r.env = row_env(p, b, h, i);
    return r;
}

/* What is checked per key on top of mask_range: sparsity, the mask predicate. */
static int key_allows(const ref_problem *p, const row_var *rv, int h, int64_t i, int64_t j) {
    return sparsity_allows(p, h, i, j) && predicate_allows(p, &rv->env, j);
}

/* The score modifier's t at key j of the row for the scaled score s, and
 * dt/ds into *dt when dt is not NULL. */
static double score_logit(const ref_problem *p, const row_var *rv, int64_t j, double s,
                          double *dt) {
    expr_env e = rv->env;
    e.k = int32_of(j + p->position_k);
    e.s = s;
    return dt ? expr_eval_dual(p->score_mod, &e, EXPR_WRT_S, dt, NULL)
              : expr_eval(p->score_mod, &e);
}

/* |diag − j| as a double (exact below 2^53) */
static double key_distance(const row_var *r, int64_t j) {
    int64_t d = r->diag - j;
    return (double)(d < 0 ? -d : d);
}

/* ---- fp64 ----------------------------------------------------------------- */

/* Independent partial sums keep the dot products off the add latency, and
 * four keys share each load of q. */
static double dot_qd_kf(const double *q, const float *k, int n) {
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int d = 0;
    for (; d + 8 <= n; d += 8)
        for (int t = 0; t < 8; t++)
            acc[t] += q[d + t] * (double)k[d + t];
    for (int t = 0; d < n; d++, t++)
        acc[t] += q[d] * (double)k[d];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

static void dot4_qd_kf(const double *q, const float *k, int n, double out[4]) {
    const float *k0 = k, *k1 = k + n, *k2 = k + 2 * n, *k3 = k + 3 * n;
    double a0 = 0, a1 = 0, a2 = 0, a3 = 0, b0 = 0, b1 = 0, b2 = 0, b3 = 0;
    int d = 0;
    for (; d + 2 <= n; d += 2) {
        const double x = q[d], y = q[d + 1];
        a0 += x * (double)k0[d];
        b0 += y * (double)k0[d + 1];
        a1 += x * (double)k1[d];
        b1 += y * (double)k1[d + 1];
        a2 += x * (double)k2[d];
        b2 += y * (double)k2[d + 1];
        a3 += x * (double)k3[d];
        b3 += y * (double)k3[d + 1];
    }
    if (d < n) {
        a0 += q[d] * (double)k0[d];
        a1 += q[d] * (double)k1[d];
        a2 += q[d] * (double)k2[d];
        a3 += q[d] * (double)k3[d];
    }
    out[0] = a0 + b0;
    out[1] = a1 + b1;
    out[2] = a2 + b2;
    out[3] = a3 + b3;
}

/* The softmax numerators of row i of query head h over the keys [lo, hi]
 * that the mask allows: the logits become exp(t - max) in s[lo..hi], keys
 * that sparsity hides stay -inf. The max and the sum take the sink too, when
 * the row has one. Returns 0 when no key is visible, else 1 with the max in
 * *m and the sum of the exponentials in *sum. With a cap and dts, dts[j]
 * gets dt/ds = 1 − tanh²(s/cap) (as 1/cosh², exact where tanh saturates),
 * or the score modifier's dt/ds; with ss, ss[j] gets the scaled score s
 * (what the modifier saw). A modifier's t = -inf hides the key as sparsity
 * does. The forward and the backward share it so that both see the same P. */
static int row_exp_fp64(const ref_problem *p, const row_var *rv, int h, int64_t i, int64_t lo,
                        int64_t hi, const double *qd, const float *kh, double *s, double *dts,
                        double *ss, double *m, double *sum) {
    const int D = p->head_dim;
    /* raw scores; -inf marks keys that sparsity or the predicate hides */
    int64_t j = lo;
    if (p->sparsity == REF_SPARSE_NONE && !p->mask_mod)
        for (; j + 3 <= hi; j += 4)
            dot4_qd_kf(qd, kh + (size_t)j * D, D, s + j);
    for (; j <= hi; j++)
        s[j] = key_allows(p, rv, h, i, j) ? dot_qd_kf(qd, kh + (size_t)j * D, D) : -INFINITY;
    double mx = -INFINITY;
    int any = 0;
    for (j = lo; j <= hi; j++) {
        if (s[j] == -INFINITY)
            continue; /* hidden keys never reach the cap: tanh(-inf) would be finite */
        s[j] *= p->scale;
        if (rv->cap > 0.0) {
            const double u = s[j] / rv->cap;
            s[j] = rv->cap * tanh(u);
            if (dts) {
                const double c = cosh(u);
                dts[j] = 1.0 / (c * c);
            }
        }
        if (rv->alibi)
            s[j] -= rv->slope * key_distance(rv, j);
        if (p->score_mod) {
            if (ss)
                ss[j] = s[j];
            s[j] = score_logit(p, rv, j, s[j], dts ? dts + j : NULL);
            if (s[j] == -INFINITY)
                continue;
        }
        if (!any || s[j] > mx)
            mx = s[j];
        any = 1;
    }
    if (!any)
        return 0;
    if (rv->sinks && rv->sink > mx)
        mx = rv->sink;
    /* exp(s - m) / sum equals exp(s - lse) but keeps full precision when the
     * scores are large */
    double total = 0.0;
    for (j = lo; j <= hi; j++) {
        if (s[j] == -INFINITY)
            continue;
        s[j] = exp(s[j] - mx);
        total += s[j];
    }
    if (rv->sinks)
        total += exp(rv->sink - mx);
    *m = mx;
    *sum = total;
    return 1;
}

/* The width of v, o, dO and dV rows. */
static int head_dim_v(const ref_problem *p) { return p->head_dim_v ? p->head_dim_v : p->head_dim; }

int ref_attention_fp64(const ref_problem *p, const float *q, const float *k, const float *v,
                       double *o, double *lse) {
    if (!problem_ok(p))
        return -1;
    const int B = p->batch, Hq = p->heads_q, Hkv = p->heads_kv, D = p->head_dim;
    const int DV = head_dim_v(p);
    const int64_t Sq = p->seqlen_q, Sk = p->seqlen_k;
    const int group = Hq / Hkv;
    const uint32_t thr = p->dropout_p > 0 ? ref_dropout_threshold(p->dropout_p) : 0;
    const double dscale = ref_dropout_scale(thr);

    double *s = malloc(sizeof(double) * (size_t)(Sk > 0 ? Sk : 1));
    double *qd = malloc(sizeof(double) * ((size_t)D + (size_t)DV));
    double *restrict acc = qd ? qd + D : NULL;
    if (!s || !qd) {
        free(s);
        free(qd);
        return -1;
    }

    for (int b = 0; b < B; b++) {
        for (int h = 0; h < Hq; h++) {
            const int hk = h / group;
            const float *kh = k + ((size_t)b * Hkv + hk) * (size_t)Sk * D;
            const float *vh = v + ((size_t)b * Hkv + hk) * (size_t)Sk * DV;
            for (int64_t i = 0; i < Sq; i++) {
                const size_t row = ((size_t)b * Hq + h) * (size_t)Sq + (size_t)i;
                const float *qi = q + row * D;
                for (int d = 0; d < D; d++)
                    qd[d] = (double)qi[d];
                for (int d = 0; d < DV; d++)
                    acc[d] = 0.0;
                int64_t lo, hi, j;
                mask_range(p, i, &lo, &hi);
                const row_var rv = row_var_init(p, b, h, i);
                /* a row that sees no key: o = 0, and the lse of the sink alone */
                double m = 0.0, sum = 0.0, l = rv.sinks ? rv.sink : -INFINITY;
                if (row_exp_fp64(p, &rv, h, i, lo, hi, qd, kh, s, NULL, NULL, &m, &sum)) {
                    l = m + log(sum);
                    const double inv = 1.0 / sum;
                    drop_row dr;
                    if (thr)
                        drop_row_init(&dr, p, thr, b, h, i);
                    /* s becomes the weights: hidden and dropped keys weigh 0 */
                    for (j = lo; j <= hi; j++) {
                        if (s[j] == -INFINITY)
                            s[j] = 0.0;
                        else if (thr && !drop_row_keep(&dr, j))
                            s[j] = 0.0;
                        else
                            s[j] *= thr ? inv * dscale : inv;
                    }
                    /* four keys per pass over the accumulator */
                    for (j = lo; j + 3 <= hi; j += 4) {
                        const double p0 = s[j], p1 = s[j + 1], p2 = s[j + 2], p3 = s[j + 3];
                        const float *v0 = vh + (size_t)j * DV, *v1 = v0 + DV, *v2 = v1 + DV,
                                    *v3 = v2 + DV;
                        for (int d = 0; d < DV; d++)
                            acc[d] += (p0 * (double)v0[d] + p1 * (double)v1[d]) +
                                      (p2 * (double)v2[d] + p3 * (double)v3[d]);
                    }
                    for (; j <= hi; j++) {
                        const float *vj = vh + (size_t)j * DV;
                        for (int d = 0; d < DV; d++)
                            acc[d] += s[j] * (double)vj[d];
                    }
                }
                if (o)
                    for (int d = 0; d < DV; d++)
                        o[row * DV + d] = acc[d];
                if (lse)
                    lse[row] = l;
            }
        }
    }
    free(s);
    free(qd);
    return 0;
}

/* ---- naive low precision ---------------------------------------------------- */

static float dot_f32(const float *q, const float *k, int n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int d = 0;
    for (; d + 8 <= n; d += 8)
        for (int t = 0; t < 8; t++)
            acc[t] += q[d + t] * k[d + t];
    for (int t = 0; d < n; d++, t++)
        acc[t] += q[d] * k[d];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

static void dot4_f32(const float *q, const float *k, int n, float out[4]) {
    const float *k0 = k, *k1 = k + n, *k2 = k + 2 * n, *k3 = k + 3 * n;
    float a0 = 0, a1 = 0, a2 = 0, a3 = 0, b0 = 0, b1 = 0, b2 = 0, b3 = 0;
    int d = 0;
    for (; d + 2 <= n; d += 2) {
        const float x = q[d], y = q[d + 1];
        a0 += x * k0[d];
        b0 += y * k0[d + 1];
        a1 += x * k1[d];
        b1 += y * k1[d + 1];
        a2 += x * k2[d];
        b2 += y * k2[d + 1];
        a3 += x * k3[d];
        b3 += y * k3[d + 1];
    }
    if (d < n) {
        a0 += q[d] * k0[d];
        a1 += q[d] * k1[d];
        a2 += q[d] * k2[d];
        a3 += q[d] * k3[d];
    }
    out[0] = a0 + b0;
    out[1] = a1 + b1;
    out[2] = a2 + b2;
    out[3] = a3 + b3;
}

/* row_exp_fp64 in the input precision: S = Q·Kᵀ accumulated in fp32 and
 * rounded to dtype, S * scale rounded again; the variants then in fp32 on
 * that dtype value (u = x/cap, th = tanh(u), t = cap·th, then t − slope·dist),
 * not rounded again; then exp(t - max) and their sum (in key order, the
 * sink's term last) in fp32. Hidden keys stay -inf. With a cap and dts,
 * dts[j] = 1 − th² in fp32, as tanh's autograd forms it. A score modifier
 * takes the place of the variants: t in fp64 at that fp32 value, rounded to
 * fp32, dts[j] its dt/ds rounded; t = -inf (after rounding) hides the key. */
static int row_exp_f32(const ref_problem *p, const row_var *rv, int dtype, int h, int64_t i,
                       int64_t lo, int64_t hi, const float *qi, const float *kh, float *s,
                       float *dts, float *sum) {
    const int D = p->head_dim;
    const float scale = (float)p->scale; /* a scalar operand stays in fp32 */
    const float cap = (float)rv->cap, slope = (float)rv->slope, sink = (float)rv->sink;
    int64_t j = lo;
    if (p->sparsity == REF_SPARSE_NONE && !p->mask_mod)
        for (; j + 3 <= hi; j += 4)
            dot4_f32(qi, kh + (size_t)j * D, D, s + j);
    for (; j <= hi; j++)
        s[j] = key_allows(p, rv, h, i, j) ? dot_f32(qi, kh + (size_t)j * D, D) : -INFINITY;
    float m = -INFINITY;
    int any = 0;
    for (j = lo; j <= hi; j++) {
        if (s[j] == -INFINITY)
            continue;
        /* S in dtype, then S * scale in dtype */
        s[j] = ref_round(ref_round(s[j], dtype) * scale, dtype);
        if (rv->cap > 0.0) {
            const float th = tanhf(s[j] / cap);
            s[j] = cap * th;
            if (dts)
                dts[j] = 1.0f - th * th;
        }
        if (rv->alibi)
            s[j] -= slope * (float)key_distance(rv, j);
        if (p->score_mod) {
            double dt;
            s[j] = (float)score_logit(p, rv, j, (double)s[j], dts ? &dt : NULL);
            if (dts)
                dts[j] = (float)dt;
            if (s[j] == -INFINITY)
                continue;
        }
        if (!any || s[j] > m)
            m = s[j];
        any = 1;
    }
    if (!any)
        return 0;
    if (rv->sinks && sink > m)
        m = sink;
    float total = 0.0f;
    for (j = lo; j <= hi; j++) {
        if (s[j] == -INFINITY)
            continue;
        s[j] = expf(s[j] - m);
        total += s[j];
    }
    if (rv->sinks)
        total += expf(sink - m);
    *sum = total;
    return 1;
}

/* Mirrors `softmax((Q @ Kᵀ) * scale + mask, dim=-1, dtype=float32).to(dtype)`,
 * then dropout on P in dtype, then `P @ V`: every tensor a framework would
 * materialize in the input dtype is rounded to it. P·V sums keys in order.
 * The variants act on `x = ((Q @ Kᵀ) * scale).float()`: the cap and the
 * bias in fp32 (an fp32 bias tensor promotes the logits to fp32), and the
 * sinks, fp32 parameters, as one more column of the fp32 softmax that is
 * dropped after it. */
int ref_attention_lowp(const ref_problem *p, int dtype, const float *q, const float *k,
                       const float *v, float *o) {
    if (!problem_ok(p) || (dtype != 0 && dtype != 1))
        return -1;
    const int B = p->batch, Hq = p->heads_q, Hkv = p->heads_kv, D = p->head_dim;
    const int DV = head_dim_v(p);
    const int64_t Sq = p->seqlen_q, Sk = p->seqlen_k;
    const int group = Hq / Hkv;
    const uint32_t thr = p->dropout_p > 0 ? ref_dropout_threshold(p->dropout_p) : 0;
    const float dscale = (float)ref_dropout_scale(thr);

    float *s = malloc(sizeof(float) * (size_t)(Sk > 0 ? Sk : 1));
    float *restrict acc = malloc(sizeof(float) * (size_t)DV);
    if (!s || !acc) {
        free(s);
        free(acc);
        return -1;
    }

    for (int b = 0; b < B; b++) {
        for (int h = 0; h < Hq; h++) {
            const int hk = h / group;
            const float *kh = k + ((size_t)b * Hkv + hk) * (size_t)Sk * D;
            const float *vh = v + ((size_t)b * Hkv + hk) * (size_t)Sk * DV;
            for (int64_t i = 0; i < Sq; i++) {
                const size_t row = ((size_t)b * Hq + h) * (size_t)Sq + (size_t)i;
                const float *qi = q + row * D;
                for (int d = 0; d < DV; d++)
                    acc[d] = 0.0f;
                int64_t lo, hi, j;
                mask_range(p, i, &lo, &hi);
                const row_var rv = row_var_init(p, b, h, i);
                float sum = 0.0f;
                if (row_exp_f32(p, &rv, dtype, h, i, lo, hi, qi, kh, s, NULL, &sum)) {
                    drop_row dr;
                    if (thr)
                        drop_row_init(&dr, p, thr, b, h, i);
                    for (j = lo; j <= hi; j++) {
                        if (s[j] == -INFINITY) {
                            s[j] = 0.0f; /* adding +0 never changes acc (never -0) */
                            continue;
                        }
                        float pj = ref_round(s[j] / sum, dtype);
                        if (thr)
                            pj = drop_row_keep(&dr, j) ? ref_round(pj * dscale, dtype) : 0.0f;
                        s[j] = pj;
                    }
                    /* four keys per pass over acc, each acc[d] still summed in
                     * key order */
                    for (j = lo; j + 3 <= hi; j += 4) {
                        const float p0 = s[j], p1 = s[j + 1], p2 = s[j + 2], p3 = s[j + 3];
                        const float *v0 = vh + (size_t)j * DV, *v1 = v0 + DV, *v2 = v1 + DV,
                                    *v3 = v2 + DV;
                        for (int d = 0; d < DV; d++) {
                            float a = acc[d];
                            a += p0 * v0[d];
                            a += p1 * v1[d];
                            a += p2 * v2[d];
                            a += p3 * v3[d];
                            acc[d] = a;
                        }
                    }
                    for (; j <= hi; j++) {
                        const float *vj = vh + (size_t)j * DV;
                        for (int d = 0; d < DV; d++)
                            acc[d] += s[j] * vj[d];
                    }
                }
                if (o)
                    for (int d = 0; d < DV; d++)
                        o[row * DV + d] = ref_round(acc[d], dtype);
            }
        }
    }
    free(s);
    free(acc);
    return 0;
}

/* ---- backward --------------------------------------------------------------- */

/* Row by row as the forward: P is recomputed with row_exp_fp64, dV and dK
 * gather each row's contributions in place (summed over the query heads of a
 * kv group) and dQ of the row is complete when the row is. With d_sinks the
 * sinks' gradient gathers −P_sink·D per row, b-major then i, per head; with
 * d_aux the float tensors' gradients gather dS·∂t/∂x per read x, key by key. */
static int backward_fp64(const ref_problem *p, const float *q, const float *k, const float *v,
                         const float *d_o, double *dq, double *dk, double *dv, double *d_sinks,
                         double *const *d_aux) {
    if (!problem_ok(p) || (d_sinks && !p->sinks))
        return -1;
    const int B = p->batch, Hq = p->heads_q, Hkv = p->heads_kv, D = p->head_dim;
    const int DV = head_dim_v(p);
    const int64_t Sq = p->seqlen_q, Sk = p->seqlen_k;
    const int group = Hq / Hkv;
    const uint32_t thr = p->dropout_p > 0 ? ref_dropout_threshold(p->dropout_p) : 0;
    const double dscale = ref_dropout_scale(thr);
    const size_t nk = (size_t)(Sk > 0 ? Sk : 1), nkv = (size_t)B * Hkv * (size_t)Sk;
    /* the reads whose tensors' gradients are asked for */
    int reads[EXPR_MAX_NODES], nreads = 0;
    if (d_aux && p->score_mod) {
        int all[EXPR_MAX_NODES], n = expr_eval_float_reads(p->score_mod, all);
        for (int r = 0; r < n; r++)
            if (d_aux[p->score_mod->nodes[all[r]].aux])
                reads[nreads++] = all[r];
    }
    const int dt_used = p->softcap > 0.0 || p->score_mod, ds_needed = dq || dk || nreads;

    double *s = malloc(sizeof(double) * 4 * nk);
    double *qd = malloc(sizeof(double) * (2 * (size_t)D + (size_t)DV));
    if (!s || !qd) {
        free(s);
        free(qd);
        return -1;
    }
    /* q's and dQ's rows (qd, acc) are D wide, dO's (gd) DV */
    double *restrict dp = s + nk, *restrict dts = s + 2 * nk, *restrict ss = s + 3 * nk;
    double *restrict acc = qd + D, *restrict gd = qd + 2 * D;
    for (size_t t = 0; dk && t < nkv * D; t++)
        dk[t] = 0.0;
    for (size_t t = 0; dv && t < nkv * DV; t++)
        dv[t] = 0.0;
    for (int h = 0; d_sinks && h < Hq; h++)
        d_sinks[h] = 0.0;
    for (int a = 0; d_aux && a < p->aux_count; a++) {
        if (!d_aux[a] || p->aux_decl[a].elem != EXPR_FLOAT)
            continue;
        size_t n = 1;
        for (int d = 0; d < p->aux_decl[a].rank; d++)
            n *= (size_t)p->aux[a].size[d];
        for (size_t t = 0; t < n; t++)
            d_aux[a][t] = 0.0;
    }

    for (int b = 0; b < B; b++) {
        for (int h = 0; h < Hq; h++) {
            const size_t kvrow = ((size_t)b * Hkv + (size_t)(h / group)) * (size_t)Sk;
            const size_t koff = kvrow * D, voff = kvrow * DV;
            const float *kh = k + koff, *vh = v + voff;
            double *dkh = dk ? dk + koff : NULL, *dvh = dv ? dv + voff : NULL;
            for (int64_t i = 0; i < Sq; i++) {
                const size_t row = ((size_t)b * Hq + h) * (size_t)Sq + (size_t)i;
                const float *qi = q + row * D, *gi = d_o + row * DV;
                for (int d = 0; d < D; d++) {
                    qd[d] = (double)qi[d];
                    acc[d] = 0.0;
                }
                for (int d = 0; d < DV; d++)
                    gd[d] = (double)gi[d];
                int64_t lo, hi, j;
                mask_range(p, i, &lo, &hi);
                const row_var rv = row_var_init(p, b, h, i);
                double m = 0.0, sum = 0.0;
                /* a row with no visible key has o = 0 whatever its inputs:
                 * it contributes nothing (to d_sinks neither: D = 0) */
                if (row_exp_fp64(p, &rv, h, i, lo, hi, qd, kh, s, dt_used ? dts : NULL,
                                 nreads ? ss : NULL, &m, &sum)) {
                    const double inv = 1.0 / sum;
                    drop_row dr;
                    if (thr)
                        drop_row_init(&dr, p, thr, b, h, i);
                    /* s becomes P and dp dP = (dO·Vᵀ)∘Z·dscale, with the
                     * keep mask Z of the forward; di = Σ P·dP = dO·O; dV
                     * gets Pdᵀ·dO with Pd = P∘Z·dscale */
                    double di = 0.0;
                    for (j = lo; j <= hi; j++) {
                        if (s[j] == -INFINITY)
                            continue;
                        const double pj = s[j] * inv;
                        const float *vj = vh + (size_t)j * DV;
                        s[j] = pj;
                        dp[j] = 0.0;
                        if (thr && !drop_row_keep(&dr, j))
                            continue; /* dropped: Pd = 0 and dP = 0 */
                        dp[j] = dot_qd_kf(gd, vj, DV) * dscale;
                        di += pj * dp[j];
                        if (dvh) {
                            const double pd = pj * dscale;
                            double *dvj = dvh + (size_t)j * DV;
                            for (int d = 0; d < DV; d++)
                                dvj[d] += pd * gd[d];
                        }
                    }
                    /* the sink's probability exp(sink − lse) times −D */
                    if (d_sinks)
                        d_sinks[h] -= exp(rv.sink - m) * inv * di;
                    /* dS = P∘(dP − di) (w.r.t. the logits; times dt/ds with
                     * a cap or a score modifier, the bias adds nothing);
                     * dQ = scale·dS·K, dK += scale·dSᵀ·Q; each read x of a
                     * float tensor gathers dS·∂t/∂x */
                    for (j = lo; ds_needed && j <= hi; j++) {
                        if (s[j] == -INFINITY)
                            continue;
                        double ds = s[j] * (dp[j] - di);
                        for (int r = 0; r < nreads; r++) {
                            expr_env e = rv.env;
                            e.k = int32_of(j + p->position_k);
                            e.s = ss[j];
                            double dt;
                            int64_t at;
                            expr_eval_dual(p->score_mod, &e, reads[r], &dt, &at);
                            if (at >= 0)
                                d_aux[p->score_mod->nodes[reads[r]].aux][at] += ds * dt;
                        }
                        if (dt_used)
                            ds *= dts[j];
                        const float *kj = kh + (size_t)j * D;
                        for (int d = 0; d < D; d++)
                            acc[d] += ds * (double)kj[d];
                        if (dkh) {
                            const double sds = p->scale * ds;
                            double *dkj = dkh + (size_t)j * D;
                            for (int d = 0; d < D; d++)
                                dkj[d] += sds * qd[d];
                        }
                    }
                }
                if (dq)
                    for (int d = 0; d < D; d++)
                        dq[row * D + d] = p->scale * acc[d];
            }
        }
    }
    free(s);
    free(qd);
    return 0;
}

int ref_attention_backward_fp64(const ref_problem *p, const float *q, const float *k,
                                const float *v, const float *d_o, double *dq, double *dk,
                                double *dv) {
    return backward_fp64(p, q, k, v, d_o, dq, dk, dv, NULL, NULL);
}

int ref_sinks_backward_fp64(const ref_problem *p, const float *q, const float *k, const float *v,
                            const float *d_o, double *d_sinks) {
    if (!d_sinks)
        return -1;
    return backward_fp64(p, q, k, v, d_o, NULL, NULL, NULL, d_sinks, NULL);
}

int ref_aux_backward_fp64(const ref_problem *p, const float *q, const float *k, const float *v,
                          const float *d_o, double *const d_aux[]) {
    if (!d_aux)
        return -1;
    return backward_fp64(p, q, k, v, d_o, NULL, NULL, NULL, NULL, d_aux);
}

/* Autograd through ref_attention_lowp's graph, one tensor at a time:
 *   dPd = dO @ Vᵀ                  fp32 accumulation, rounded to dtype
 *   dV  = Pdᵀ @ dO                 fp32 accumulation over rows in order, rounded
 *   dP  = dPd * Z * dscale         in fp32, rounded (dropout's backward)
 *   dX  = y * (dP − Σ y·dP)        softmax backward in fp32 from its fp32 output
 *                                  y (P = y rounded), rounded: the gradient of
 *                                  its dtype input S * scale
 *         with a cap: y * (dP − Σ y·dP) * (1 − th²) in fp32 (the logits are
 *         fp32 then: the softmax's gradient is not rounded, tanh's backward
 *         from its output th), rounded as the gradient of S * scale; ALiBi's
 *         bias and the sinks' column change y only (the sinks' own gradient
 *         is ref_sinks_backward_fp64's); a score modifier's dt/ds takes the
 *         place of 1 − th²
 *   dS  = dX * scale               rounded
 *   dQ  = dS @ K, dK = dSᵀ @ Q     fp32 accumulation (keys / rows in order), rounded
 * With GQA the framework repeats K and V per query head, so a kv head's dK
 * and dV are the fp32 sum of its query heads' rounded gradients, rounded. */
int ref_attention_backward_lowp(const ref_problem *p, int dtype, const float *q, const float *k,
                                const float *v, const float *d_o, float *dq, float *dk, float *dv) {
    if (!problem_ok(p) || (dtype != 0 && dtype != 1))
        return -1;
    const int B = p->batch, Hq = p->heads_q, Hkv = p->heads_kv, D = p->head_dim;
    const int DV = head_dim_v(p);
    const int64_t Sq = p->seqlen_q, Sk = p->seqlen_k;
    const int group = Hq / Hkv;
    const uint32_t thr = p->dropout_p > 0 ? ref_dropout_threshold(p->dropout_p) : 0;
    const float dscale = (float)ref_dropout_scale(thr);
    const float scale = (float)p->scale;
    /* a kv head's K and dK (head elements), V and dV (head_v) */
    const size_t nk = (size_t)(Sk > 0 ? Sk : 1), head = (size_t)Sk * D, head_v = (size_t)Sk * DV;

    const int dt_used = p->softcap > 0.0 || p->score_mod;
    float *s = malloc(sizeof(float) * 3 * nk);
    float *acc = malloc(sizeof(float) * (size_t)D);
    float *gh = malloc(sizeof(float) * (head + head_v > 0 ? head + head_v : 1)); /* one query head's dK, dV */
    if (!s || !acc || !gh) {
        free(s);
        free(acc);
        free(gh);
        return -1;
    }
    float *restrict dp = s + nk, *restrict dts = s + 2 * nk;
    float *restrict dkh = gh, *restrict dvh = gh + head;

    for (int b = 0; b < B; b++) {
        for (int hk = 0; hk < Hkv; hk++) {
            const size_t koff = ((size_t)b * Hkv + hk) * head, voff = ((size_t)b * Hkv + hk) * head_v;
            const float *kh = k + koff, *vh = v + voff;
            float *dkg = dk ? dk + koff : NULL, *dvg = dv ? dv + voff : NULL;
            for (size_t t = 0; dkg && t < head; t++)
                dkg[t] = 0.0f;
            for (size_t t = 0; dvg && t < head_v; t++)
                dvg[t] = 0.0f;
            for (int h = hk * group; h < (hk + 1) * group; h++) {
                for (size_t t = 0; t < head + head_v; t++)
                    gh[t] = 0.0f;
                for (int64_t i = 0; i < Sq; i++) {
                    const size_t row = ((size_t)b * Hq + h) * (size_t)Sq + (size_t)i;
                    const float *qi = q + row * D, *gi = d_o + row * DV;
                    for (int d = 0; d < D; d++)
                        acc[d] = 0.0f;
                    int64_t lo, hi, j;
                    mask_range(p, i, &lo, &hi);
                    const row_var rv = row_var_init(p, b, h, i);
                    float sum = 0.0f;
                    if (row_exp_f32(p, &rv, dtype, h, i, lo, hi, qi, kh, s, dt_used ? dts : NULL,
                                    &sum)) {
                        drop_row dr;
                        if (thr)
                            drop_row_init(&dr, p, thr, b, h, i);
                        float di = 0.0f;
                        for (j = lo; j <= hi; j++) {
                            if (s[j] == -INFINITY)
                                continue;
                            const float y = s[j] / sum;
                            const float *vj = vh + (size_t)j * DV;
                            float pd = ref_round(y, dtype), dpj;
                            if (thr && !drop_row_keep(&dr, j)) {
                                pd = 0.0f;
                                dpj = 0.0f;
                            } else {
                                dpj = ref_round(dot_f32(gi, vj, DV), dtype);
                                if (thr) {
                                    pd = ref_round(pd * dscale, dtype);
                                    dpj = ref_round(dpj * dscale, dtype);
                                }
                            }
                            s[j] = y;
                            dp[j] = dpj;
                            di += y * dpj;
                            float *dvj = dvh + (size_t)j * DV;
                            for (int d = 0; d < DV; d++)
                                dvj[d] += pd * gi[d];
                        }
                        for (j = lo; j <= hi; j++) {
                            if (s[j] == -INFINITY)
                                continue;
                            float g = s[j] * (dp[j] - di);
                            if (dt_used)
                                g *= dts[j];
                            const float dx = ref_round(g, dtype);
                            const float ds = ref_round(dx * scale, dtype);
                            const float *kj = kh + (size_t)j * D;
                            float *dkj = dkh + (size_t)j * D;
                            for (int d = 0; d < D; d++) {
                                acc[d] += ds * kj[d];
                                dkj[d] += ds * qi[d];
                            }
                        }
                    }
                    if (dq)
                        for (int d = 0; d < D; d++)
                            dq[row * D + d] = ref_round(acc[d], dtype);
                }
                for (size_t t = 0; dkg && t < head; t++)
                    dkg[t] += ref_round(dkh[t], dtype);
                for (size_t t = 0; dvg && t < head_v; t++)
                    dvg[t] += ref_round(dvh[t], dtype);
            }
            for (size_t t = 0; dkg && t < head; t++)
                dkg[t] = ref_round(dkg[t], dtype);
            for (size_t t = 0; dvg && t < head_v; t++)
                dvg[t] = ref_round(dvg[t], dtype);
        }
    }
    free(s);
    free(acc);
    free(gh);
    return 0;
}

/* ---- error ----------------------------------------------------------------- */

static double rel_from_sums(double num, double den) {
    if (isnan(num))
        return NAN;
    if (den == 0.0)
        return num == 0.0 ? 0.0 : INFINITY;
    return sqrt(num / den);
}

double ref_rel_error(const double *a, const double *b, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t t = 0; t < n; t++) {
        double e = a[t] - b[t];
        num += e * e;
        den += b[t] * b[t];
    }
    return rel_from_sums(num, den);
}

double ref_rel_error_f(const float *a, const double *b, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t t = 0; t < n; t++) {
        double e = (double)a[t] - b[t];
        num += e * e;
        den += b[t] * b[t];
    }
    return rel_from_sums(num, den);
}
