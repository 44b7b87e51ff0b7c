/* Tests of the backward references: the fp64 gradients against finite
 * differences of the fp64 forward over every mask, sparsity and dropout
 * kind, GQA against repeated kv heads, the dropout limits, the low-precision
 * path against a step-by-step rewrite and its error against fp64, and
 * invalid problems. */
#include "reference/reference.h"
#include "tests/check.h"
#include "tests/ref_problems.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ------------------------------------------------------------------ */

static uint64_t rng_state = 0x13198a2e03707344ull;

static uint64_t rng_next(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* n values k / 2^frac_bits with |k| <= 2^frac_bits * range */
static float *grid_tensor(size_t n, int frac_bits, int range) {
    float *x = malloc((n ? n : 1) * sizeof *x);
    if (!x)
        abort();
    const int64_t m = (int64_t)range << frac_bits;
    for (size_t t = 0; t < n; t++)
        x[t] = ldexpf((float)((int64_t)(rng_next() % (uint64_t)(2 * m + 1)) - m), -frac_bits);
    return x;
}

/* n uniform values in [-1, 1] rounded to dtype (2: plain float) */
static float *rand_tensor(size_t n, int dtype) {
    float *x = malloc((n ? n : 1) * sizeof *x);
    if (!x)
        abort();
    for (size_t t = 0; t < n; t++) {
        float u = -1.0f + 2.0f * (float)((rng_next() >> 40) * (1.0 / 16777216.0));
        x[t] = dtype == 2 ? u : ref_round(u, dtype);
    }
    return x;
}

static void *xmalloc(size_t bytes) {
    void *x = malloc(bytes ? bytes : 1);
    if (!x)
        abort();
    return x;
}

static double max_abs(const double *a, size_t n) {
    double m = 0;
    for (size_t t = 0; t < n; t++)
        m = fmax(m, fabs(a[t]));
    return m;
}

/* ---- finite differences ------------------------------------------------------- */

/* L = Σ dO∘O, O from the fp64 forward; dL/dx is what the backward returns. */
static double loss(const ref_problem *p, const float *q, const float *k, const float *v,
                   const float *g, double *o) {
    if (ref_attention_fp64(p, q, k, v, o, NULL) != 0)
        return NAN;
    double l = 0;
    for (size_t t = 0; t < o_elems(p); t++)
        l += (double)g[t] * o[t];
    return l;
}

/* The step and the tolerance. Inputs lie on a 2^-10 grid in [-2, 2], so
 * x ± h and x ± 2h with h = 2^-10 are exact floats and L is evaluated at
 * exactly the points the formula assumes. The fourth-order central stencil
 * (8(L(x+h) − L(x−h)) − (L(x+2h) − L(x−2h))) / 12h has truncation error
 * h⁴·|L⁽⁵⁾|/30 ≈ 3e-14·|L⁽⁵⁾| and rounding error about 1.5·ε·|L|/h ≈ 3e-13·|L|
 * (|L| ≲ 30 here); the observed worst error is ~1e-11 (printed below). A
 * tolerance of 1e-8·(1 + |g|) leaves three orders of magnitude for that,
 * while any real mistake (a missed dropout scale, a wrong D_i, a dropped
 * GQA head) moves gradients of size ~0.1..1 by a few percent or more. */
#define FD_H 0x1p-10
#define FD_TOL 1e-8

static double fd_worst; /* worst |fd − analytic| over every element checked */

/* Checks every element of x (one of q, k, v, n long) against grad; returns
 * the number that miss the tolerance (or were perturbed inexactly). */
static int fd_check(const ref_problem *p, float *q, float *k, float *v, const float *g, float *x,
                    size_t n, const double *grad, double *o) {
    static const double steps[4] = {1, -1, 2, -2};
    int bad = 0;
    for (size_t t = 0; t < n; t++) {
        const float x0 = x[t];
        double f[4];
        for (int s = 0; s < 4; s++) {
            x[t] = (float)((double)x0 + steps[s] * FD_H);
            if ((double)x[t] != (double)x0 + steps[s] * FD_H)
                bad++; /* the grid promise broke */
            f[s] = loss(p, q, k, v, g, o);
        }
        x[t] = x0;
        const double fd = (8 * (f[0] - f[1]) - (f[2] - f[3])) / (12 * FD_H);
        const double err = fabs(fd - grad[t]);
        if (!(err <= FD_TOL * (1 + fabs(grad[t]))))
            bad++;
        if (!(err <= fd_worst))
            fd_worst = err;
    }
    return bad;
}

static int sinks_checked;

/* The sinks' gradient against finite differences in each sink (on the grid
 * too), and against −Σ exp(sink − lse)·rowsum(dO∘O) formed from the
 * forward's O and lse. */
static void fd_sinks(const ref_problem *p, const float *q, const float *k, const float *v,
                     const float *g, double *o, const char *what) {
    static const double steps[4] = {1, -1, 2, -2};
    const int H = p->heads_q, D = dv_of(p); /* O's and dO's rows */
    float *sk = xmalloc((size_t)H * sizeof(float));
    double *ds = xmalloc((size_t)H * sizeof(double)), *alt = xmalloc((size_t)H * sizeof(double));
    double *lse = xmalloc(o_elems(p) / (size_t)D * sizeof(double));
    memcpy(sk, p->sinks, (size_t)H * sizeof(float));
    ref_problem ps = *p;
    ps.sinks = sk;
    CHECK(ref_sinks_backward_fp64(&ps, q, k, v, g, ds) == 0, "%s: sinks backward failed", what);
    int bad = 0;
    for (int h = 0; h < H; h++) {
        const float x0 = sk[h];
        double f[4];
        for (int t = 0; t < 4; t++) {
            sk[h] = (float)((double)x0 + steps[t] * FD_H);
            if ((double)sk[h] != (double)x0 + steps[t] * FD_H)
                bad++;
            f[t] = loss(&ps, q, k, v, g, o);
        }
        sk[h] = x0;
        const double fd = (8 * (f[0] - f[1]) - (f[2] - f[3])) / (12 * FD_H);
        const double err = fabs(fd - ds[h]);
        if (!(err <= FD_TOL * (1 + fabs(ds[h]))))
            bad++;
        if (!(err <= fd_worst))
            fd_worst = err;
    }
    CHECK(bad == 0, "%s: %d of %d d_sinks off the FD gradient", what, bad, H);
    /* the same from the forward's outputs */
    CHECK(ref_attention_fp64(&ps, q, k, v, o, lse) == 0, "%s: forward failed", what);
    for (int h = 0; h < H; h++)
        alt[h] = 0;
    for (size_t r = 0; r < o_elems(p) / (size_t)D; r++) {
        double di = 0;
        for (int d = 0; d < D; d++)
            di += o[r * D + d] * (double)g[r * D + d];
        const int h = (int)(r / (size_t)p->seqlen_q % (size_t)H);
        alt[h] -= exp((double)sk[h] - lse[r]) * di;
    }
    double worst = 0;
    for (int h = 0; h < H; h++)
        worst = fmax(worst, fabs(alt[h] - ds[h]) / (1 + fabs(ds[h])));
    CHECK(worst < 1e-13, "%s: d_sinks differs from the forward's formula by %g", what, worst);
    CHECK(max_abs(ds, (size_t)H) > 0.01, "%s: d_sinks vanishes (%g)", what, max_abs(ds, (size_t)H));
    sinks_checked += H;
    free(sk);
    free(ds);
    free(alt);
    free(lse);
}

static int visible_any_col(const ref_problem *p, int hk, int j) {
    int group = p->heads_q / p->heads_kv;
    for (int h = hk * group; h < (hk + 1) * group; h++)
        for (int i = 0; i < p->seqlen_q; i++)
            if (ref_visible(p, h, i, j))
                return 1;
    return 0;
}

static int empty_rows_seen, unseen_keys_seen, dropped_seen, fd_cases, softmax_cases;

/* Analytic fp64 gradients of p against finite differences in every element
 * of q, k and v; rows and keys that nothing connects must get exact zeros. */
static void fd_case(const ref_problem *p, const char *what) {
    size_t nq = q_elems(p), nk = kv_elems(p), no = o_elems(p), nv = v_elems(p);
    float *q = grid_tensor(nq, 10, 2), *k = grid_tensor(nk, 10, 2), *v = grid_tensor(nv, 10, 2);
    float *g = grid_tensor(no, 10, 2);
    double *dq = xmalloc(nq * sizeof(double)), *dk = xmalloc(nk * sizeof(double));
    double *dv = xmalloc(nv * sizeof(double)), *o = xmalloc(no * sizeof(double));
    CHECK(ref_attention_backward_fp64(p, q, k, v, g, dq, dk, dv) == 0, "%s: backward failed", what);
    int bq = fd_check(p, q, k, v, g, q, nq, dq, o);
    int bk = fd_check(p, q, k, v, g, k, nk, dk, o);
    int bv = fd_check(p, q, k, v, g, v, nv, dv, o);
    CHECK(bq == 0 && bk == 0 && bv == 0, "%s: %d dq, %d dk, %d dv elements off the FD gradient",
          what, bq, bk, bv);
    if (p->sinks)
        fd_sinks(p, q, k, v, g, o, what);

    /* exact zeros where no path exists, and dropout really dropped something */
    const int D = p->head_dim, DV = dv_of(p);
    const uint32_t thr = ref_dropout_threshold(p->dropout_p);
    int nonzero = 0, most = 0;
    for (int b = 0; b < p->batch; b++) {
        for (int h = 0; h < p->heads_q; h++)
            for (int i = 0; i < p->seqlen_q; i++) {
                int n = 0;
                for (int j = 0; j < p->seqlen_k; j++) {
                    n += ref_visible(p, h, i, j);
                    dropped_seen += thr && ref_visible(p, h, i, j) &&
                                    !ref_dropout_keep(p->seed, p->offset, b, h, i, j, thr);
                }
                most = n > most ? n : most;
                if (n)
                    continue;
                empty_rows_seen++;
                size_t row = ((size_t)b * p->heads_q + h) * p->seqlen_q + i;
                for (int d = 0; d < D; d++)
                    nonzero += dq[row * D + d] != 0.0;
            }
        for (int hk = 0; hk < p->heads_kv; hk++)
            for (int j = 0; j < p->seqlen_k; j++) {
                if (visible_any_col(p, hk, j))
                    continue;
                unseen_keys_seen++;
                size_t col = ((size_t)b * p->heads_kv + hk) * p->seqlen_k + j;
                for (int d = 0; d < D; d++)
                    nonzero += dk[col * D + d] != 0.0;
                for (int d = 0; d < DV; d++)
                    nonzero += dv[col * DV + d] != 0.0;
            }
    }
    CHECK(nonzero == 0, "%s: %d gradients of unconnected rows/keys are not zero", what, nonzero);
    /* the softmax of one key is constant: dq and dk are then 0 (checked
     * above by FD); with two or more the case must say something */
    CHECK(most > 0 && max_abs(dv, nv) > 0.01, "%s: nothing visible or dv vanishes (%g)", what,
          max_abs(dv, nv));
    if (most >= 2) {
        CHECK(max_abs(dq, nq) > 0.01 && max_abs(dk, nk) > 0.01, "%s: dq/dk vanish (%g %g)", what,
              max_abs(dq, nq), max_abs(dk, nk));
        softmax_cases++;
    }
    fd_cases++;
    free(q);
    free(k);
    free(v);
    free(g);
    free(dq);
    free(dk);
    free(dv);
    free(o);
}

static void test_finite_differences(void) {
    /* (B, Hkv, Sq, Sk, D), Hq = 2; Sq != Sk throughout */
    static const int shapes[][5] = {{1, 2, 3, 5, 4}, {2, 1, 5, 3, 3}, {1, 1, 7, 5, 8},
                                    {2, 2, 5, 7, 5}, {1, 2, 1, 7, 6}, {1, 1, 7, 3, 7},
                                    {2, 1, 3, 1, 4}};
    const int nshapes = (int)(sizeof shapes / sizeof shapes[0]);
    static const char *mask_names[] = {"none", "causal bottom-right", "causal top-left",
                                       "window(1,2) bottom-right", "window(2,0) offset 1"};
    static const char *sparse_names[] = {"dense", "layout 2x2", "butterfly 2x2"};
    uint8_t layout[2 * 4 * 4];
    int c = 0;
    for (int mask = 0; mask < 5; mask++)
        for (int sp = 0; sp < 3; sp++)
            for (int drop = 0; drop < 2; drop++, c++) {
                const int *s = shapes[c % nshapes];
                ref_problem p = base_problem(s[0], 2, s[1], s[2], s[3], s[4]);
                p.scale = 0.35 + 0.1 * (c % 5); /* sharp enough for an uneven softmax */
                switch (mask) {
                case 1:
                    p.mask = REF_MASK_CAUSAL;
                    p.diag_offset = p.seqlen_k - p.seqlen_q;
                    break;
                case 2:
                    p.mask = REF_MASK_CAUSAL;
                    break;
                case 3:
                    p.mask = REF_MASK_WINDOW;
                    p.diag_offset = p.seqlen_k - p.seqlen_q;
                    p.window_left = 1;
                    p.window_right = 2;
                    break;
                case 4:
                    p.mask = REF_MASK_WINDOW;
                    p.diag_offset = 1;
                    p.window_left = 2;
                    p.window_right = 0;
                    break;
                default:
                    break;
                }
                if (sp == 1) {
                    /* per-head layout; head 0's block row 1 is empty */
                    int nbq = (p.seqlen_q + 1) / 2, nbk = (p.seqlen_k + 1) / 2;
                    p.sparsity = REF_SPARSE_LAYOUT;
                    p.block_q = p.block_k = 2;
                    p.layout_heads = 2;
                    for (int h = 0; h < 2; h++)
                        for (int bi = 0; bi < nbq; bi++)
                            for (int bj = 0; bj < nbk; bj++)
                                layout[(h * nbq + bi) * nbk + bj] =
                                    (uint8_t)(!(h == 0 && bi == 1) && (bi + 2 * bj + h) % 3 != 1);
                    p.layout = layout;
                } else if (sp == 2) {
                    p.sparsity = REF_SPARSE_BUTTERFLY;
                    p.block_q = p.block_k = 2;
                    p.butterfly_factors = 1;
                }
                if (drop) {
                    p.dropout_p = 0.3;
                    p.seed = 0x9abcdef012345ull + (uint64_t)c;
                    p.offset = ((uint64_t)c << 32) | 17u;
                }
                char what[160];
                snprintf(what, sizeof what, "case %d: %s, %s, dropout %s, B%d Hkv%d %dx%d D%d", c,
                         mask_names[mask], sparse_names[sp], drop ? "0.3" : "off", s[0], s[1], s[2],
                         s[3], s[4]);
                fd_case(&p, what);
            }

    /* value head dims of their own, narrower and wider than D, odd sizes:
     * (B, Hkv, Sq, Sk, D, Dv), Hq = 2; masks, dropout, GQA, a sink */
    static const int dv_shapes[][6] = {{1, 2, 3, 5, 4, 7}, {2, 1, 5, 3, 6, 2}, {1, 1, 4, 6, 1, 5},
                                       {1, 2, 5, 4, 5, 1}, {2, 1, 3, 7, 3, 8}};
    static const float dv_sinks[2] = {0.5f, -0.25f};
    for (int i = 0; i < (int)(sizeof dv_shapes / sizeof dv_shapes[0]); i++) {
        const int *s = dv_shapes[i];
        ref_problem q = base_problem(s[0], 2, s[1], s[2], s[3], s[4]);
        q.head_dim_v = s[5];
        q.scale = 0.45 + 0.1 * i;
        if (i % 2) {
            q.mask = REF_MASK_CAUSAL;
            q.diag_offset = q.seqlen_k - q.seqlen_q;
        }
        if (i >= 2) {
            q.dropout_p = 0.3;
            q.seed = 0x5eed + (uint64_t)i;
            q.offset = 9;
        }
        if (i == 4) q.sinks = dv_sinks;
        char what[160];
        snprintf(what, sizeof what, "value head dim: B%d Hkv%d %dx%d D%d Dv%d%s%s", s[0], s[1],
                 s[2], s[3], s[4], s[5], i % 2 ? ", causal" : "", i >= 2 ? ", dropout" : "");
        fd_case(&q, what);
    }

    /* keys beyond 64: rows span three 32-column dropout stretches */
    ref_problem p = base_problem(1, 2, 1, 3, 70, 4);
    p.mask = REF_MASK_WINDOW;
    p.diag_offset = 50;
    p.window_left = 45;
    p.window_right = 10;
    p.dropout_p = 0.3;
    p.seed = 77;
    p.offset = 5;
    fd_case(&p, "3x70 window, dropout");

    CHECK(empty_rows_seen > 0, "no case had a query row without visible keys");
    CHECK(unseen_keys_seen > 0, "no case had a key that no query sees");
    CHECK(dropped_seen > 0, "no case dropped a visible element");
    CHECK(softmax_cases >= fd_cases - 6, "only %d of %d cases have a row with two keys",
          softmax_cases, fd_cases);
    printf("finite differences: %d cases (%d with a row of two or more keys), worst "
           "|fd - analytic| %.3g (tolerance %g*(1+|g|)), %d empty rows, %d unseen keys, "
           "%d dropped elements\n",
           fd_cases, softmax_cases, fd_worst, FD_TOL, empty_rows_seen, unseen_keys_seen,
           dropped_seen);
}

/* The scores' variants made to bind (caps of 0.5..2 that the scores pass,
 * sinks on the order of the row maxima, slopes of 0.25..1), with masks that
 * leave rows without keys, dropout, GQA, sparsity and ALiBi slopes per
 * (batch, head) from batch0 != 0 at a stride that is not Hq: dq, dk, dv
 * and d_sinks against finite differences. */
static void test_variants_fd(void) {
    static const float sinks[2] = {1.5f, -0.75f}, head_slopes[2] = {0.5f, 1.0f};
    static float batch_slopes[3 * 3]; /* (batch0 1 + B 2) rows, stride 3 */
    for (int t = 0; t < 9; t++)
        batch_slopes[t] = 0.25f + 0.125f * (float)t;
    uint8_t layout[2 * 4 * 4];
    for (size_t t = 0; t < sizeof layout; t++)
        layout[t] = (uint8_t)(t % 3 != 1);
    static const char *const names[] = {
        "softcap 0.5",           "softcap 1 causal br, empty rows", "softcap 2 window dropout",
        "sinks",                 "sinks causal br gqa, empty rows", "alibi per head causal tl",
        "alibi (B,H) batch0 1",  "all, dropout layout",             "all, butterfly window gqa"};
    const int before = fd_cases, empty_before = empty_rows_seen;
    for (int c = 0; c < 9; c++) {
        ref_problem p = base_problem(c == 6 || c == 7 ? 2 : 1, 2, c == 4 || c == 8 ? 1 : 2, 5, 7,
                                     3 + c % 4);
        p.scale = 0.75;
        switch (c) {
        case 0:
            p.softcap = 0.5;
            break;
        case 1:
            p.seqlen_q = 7, p.seqlen_k = 4;
            p.mask = REF_MASK_CAUSAL, p.diag_offset = 4 - 7;
            p.softcap = 1.0;
            break;
        case 2:
            p.mask = REF_MASK_WINDOW, p.window_left = 2, p.window_right = 1, p.diag_offset = 2;
            p.dropout_p = 0.3, p.seed = 0x5eed, p.offset = 3;
            p.softcap = 2.0;
            break;
        case 3:
            p.sinks = sinks;
            break;
        case 4:
            p.seqlen_q = 7, p.seqlen_k = 5;
            p.mask = REF_MASK_CAUSAL, p.diag_offset = 5 - 7;
            p.sinks = sinks;
            break;
        case 5:
            p.mask = REF_MASK_CAUSAL;
            p.alibi_slopes = head_slopes;
            break;
        case 6:
            p.diag_offset = 2;
            p.batch0 = 1;
            p.alibi_slopes = batch_slopes, p.alibi_stride_batch = 3;
            break;
        case 7:
            p.sparsity = REF_SPARSE_LAYOUT, p.block_q = p.block_k = 2, p.layout = layout;
            p.layout_heads = 2;
            p.dropout_p = 0.3, p.seed = 0xabc, p.offset = 7;
            p.softcap = 1.0, p.sinks = sinks;
            p.alibi_slopes = batch_slopes, p.alibi_stride_batch = 3;
            break;
        default:
            p.sparsity = REF_SPARSE_BUTTERFLY, p.block_q = p.block_k = 2, p.butterfly_factors = 1;
            p.mask = REF_MASK_WINDOW, p.window_left = 3, p.window_right = 2;
            p.softcap = 1.5, p.sinks = sinks, p.alibi_slopes = head_slopes;
            break;
        }
        char what[160];
        snprintf(what, sizeof what, "variants case %d: %s, B%d Hkv%d %dx%d D%d", c, names[c],
                 p.batch, p.heads_kv, p.seqlen_q, p.seqlen_k, p.head_dim);
        fd_case(&p, what);
    }
    CHECK(fd_cases - before == 9 && empty_rows_seen > empty_before,
          "variants: %d cases, %d rows without keys", fd_cases - before,
          empty_rows_seen - empty_before);
    CHECK(sinks_checked >= 8, "only %d sinks checked", sinks_checked);
    printf("finite differences of the variants: %d cases, %d sinks, worst |fd - analytic| over "
           "all cases %.3g\n", fd_cases - before, sinks_checked, fd_worst);
}

/* A sink's gradient only needs sinks; a NULL d_sinks or a problem without
 * sinks is refused, and so are invalid variants. */
static void test_sinks_invalid(void) {
    ref_problem p = base_problem(1, 2, 1, 3, 4, 4);
    float x[2 * 4 * 4] = {0};
    double d[2 * 4 * 4];
    float f[2 * 4 * 4];
    CHECK(ref_sinks_backward_fp64(&p, x, x, x, x, d) == -1, "d_sinks without sinks accepted");
    const float sinks[2] = {0.5f, 1.0f};
    p.sinks = sinks;
    CHECK(ref_sinks_backward_fp64(&p, x, x, x, x, NULL) == -1, "NULL d_sinks accepted");
    CHECK(ref_sinks_backward_fp64(&p, x, x, x, x, d) == 0, "d_sinks refused");
    /* zero inputs: O = mean of V = 0, so D = 0 and the gradient 0 */
    CHECK(d[0] == 0.0 && d[1] == 0.0, "d_sinks of zero inputs %g %g", d[0], d[1]);
    p.softcap = -0.5;
    CHECK(ref_attention_backward_fp64(&p, x, x, x, x, d, d, d) == -1, "negative cap accepted");
    CHECK(ref_attention_backward_lowp(&p, 0, x, x, x, x, f, f, f) == -1,
          "negative cap accepted (lowp)");
    CHECK(ref_sinks_backward_fp64(&p, x, x, x, x, d) == -1, "negative cap accepted (sinks)");
    p.softcap = INFINITY;
    CHECK(ref_attention_backward_fp64(&p, x, x, x, x, d, d, d) == -1, "infinite cap accepted");
}

/* ---- small exact cases ----------------------------------------------------------- */

static void test_single_key(void) {
    /* window (0, 0): o_i = v_i, so dv = dO exactly and dq = dk = 0 exactly
     * (dS = 1·(dP − 1·dP)) */
    ref_problem p = base_problem(2, 2, 2, 6, 6, 5);
    p.mask = REF_MASK_WINDOW;
    p.window_left = p.window_right = 0;
    size_t n = q_elems(&p);
    float *q = rand_tensor(n, 2), *k = rand_tensor(n, 2), *v = rand_tensor(n, 2),
          *g = rand_tensor(n, 2);
    double *dq = xmalloc(n * sizeof(double)), *dk = xmalloc(n * sizeof(double)),
           *dv = xmalloc(n * sizeof(double));
    CHECK(ref_attention_backward_fp64(&p, q, k, v, g, dq, dk, dv) == 0, "backward failed");
    int bad = 0;
    for (size_t t = 0; t < n; t++)
        bad += dq[t] != 0.0 || dk[t] != 0.0 || dv[t] != (double)g[t];
    CHECK(bad == 0, "single key: %d elements wrong", bad);
    free(q);
    free(k);
    free(v);
    free(g);
    free(dq);
    free(dk);
    free(dv);
}

static void test_null_outputs(void) {
    ref_problem p = base_problem(1, 2, 1, 5, 9, 4);
    p.mask = REF_MASK_CAUSAL;
    p.diag_offset = 4;
    p.dropout_p = 0.2;
    p.seed = 3;
    size_t nq = q_elems(&p), nk = kv_elems(&p);
    float *q = rand_tensor(nq, 0), *k = rand_tensor(nk, 0), *v = rand_tensor(nk, 0),
          *g = rand_tensor(nq, 0);
    double *dq = xmalloc(nq * sizeof(double)), *dk = xmalloc(nk * sizeof(double)),
           *dv = xmalloc(nk * sizeof(double)), *x = xmalloc((nq + nk) * sizeof(double));
    float *fq = xmalloc(nq * sizeof(float)), *fk = xmalloc(nk * sizeof(float)),
          *fv = xmalloc(nk * sizeof(float)), *fx = xmalloc((nq + nk) * sizeof(float));
    CHECK(ref_attention_backward_fp64(&p, q, k, v, g, dq, dk, dv) == 0, "backward failed");
    CHECK(ref_attention_backward_fp64(&p, q, k, v, g, x, NULL, NULL) == 0 &&
              memcmp(x, dq, nq * sizeof(double)) == 0,
          "dq alone differs");
    CHECK(ref_attention_backward_fp64(&p, q, k, v, g, NULL, x, NULL) == 0 &&
              memcmp(x, dk, nk * sizeof(double)) == 0,
          "dk alone differs");
    CHECK(ref_attention_backward_fp64(&p, q, k, v, g, NULL, NULL, x) == 0 &&
              memcmp(x, dv, nk * sizeof(double)) == 0,
          "dv alone differs");
    CHECK(ref_attention_backward_lowp(&p, 0, q, k, v, g, fq, fk, fv) == 0, "lowp failed");
    CHECK(ref_attention_backward_lowp(&p, 0, q, k, v, g, fx, NULL, NULL) == 0 &&
              memcmp(fx, fq, nq * sizeof(float)) == 0,
          "lowp dq alone differs");
    CHECK(ref_attention_backward_lowp(&p, 0, q, k, v, g, NULL, fx, NULL) == 0 &&
              memcmp(fx, fk, nk * sizeof(float)) == 0,
          "lowp dk alone differs");
    CHECK(ref_attention_backward_lowp(&p, 0, q, k, v, g, NULL, NULL, fx) == 0 &&
              memcmp(fx, fv, nk * sizeof(float)) == 0,
          "lowp dv alone differs");
    free(q);
    free(k);
    free(v);
    free(g);
    free(dq);
    free(dk);
    free(dv);
    free(x);
    free(fq);
    free(fk);
    free(fv);
    free(fx);
}

/* ---- GQA ------------------------------------------------------------------------- */

static void test_gqa(void) {
    /* Hq = 4 over Hkv = 2 against the same problem with each kv head copied
     * for its two query heads (Hkv = 4): dq the same, dk and dv the sums of
     * the copies' gradients */
    ref_problem g = base_problem(2, 4, 2, 6, 9, 5);
    g.mask = REF_MASK_CAUSAL;
    g.diag_offset = 3;
    g.dropout_p = 0.2;
    g.seed = 0xfeed;
    g.offset = 9;
    uint8_t layout[4 * 2 * 3];
    for (size_t t = 0; t < sizeof layout; t++)
        layout[t] = (uint8_t)(t % 5 != 2);
    g.sparsity = REF_SPARSE_LAYOUT;
    g.block_q = 4;
    g.block_k = 3;
    g.layout = layout;
    g.layout_heads = 4;
    ref_problem f = g;
    f.heads_kv = 4;
    const size_t nq = q_elems(&g), nk = kv_elems(&g), nf = kv_elems(&f), head = (size_t)9 * 5;
    float *q = rand_tensor(nq, 1), *k = rand_tensor(nk, 1), *v = rand_tensor(nk, 1),
          *dout = rand_tensor(nq, 1);
    float *kf = xmalloc(nf * sizeof(float)), *vf = xmalloc(nf * sizeof(float));
    for (int b = 0; b < 2; b++)
        for (int h = 0; h < 4; h++) {
            memcpy(kf + ((size_t)b * 4 + h) * head, k + ((size_t)b * 2 + h / 2) * head,
                   head * sizeof(float));
            memcpy(vf + ((size_t)b * 4 + h) * head, v + ((size_t)b * 2 + h / 2) * head,
                   head * sizeof(float));
        }
    double *dq = xmalloc(nq * sizeof(double)), *dk = xmalloc(nk * sizeof(double)),
           *dv = xmalloc(nk * sizeof(double));
    double *dqf = xmalloc(nq * sizeof(double)), *dkf = xmalloc(nf * sizeof(double)),
           *dvf = xmalloc(nf * sizeof(double));
    CHECK(ref_attention_backward_fp64(&g, q, k, v, dout, dq, dk, dv) == 0, "gqa failed");
    CHECK(ref_attention_backward_fp64(&f, q, kf, vf, dout, dqf, dkf, dvf) == 0, "mha failed");
    CHECK(memcmp(dq, dqf, nq * sizeof(double)) == 0, "GQA dq differs from the repeated heads'");
    double ek = 0, ev = 0;
    for (int b = 0; b < 2; b++)
        for (int hk = 0; hk < 2; hk++)
            for (size_t t = 0; t < head; t++) {
                size_t x = ((size_t)b * 2 + hk) * head + t;
                size_t y0 = ((size_t)b * 4 + 2 * hk) * head + t, y1 = y0 + head;
                ek = fmax(ek, fabs(dk[x] - (dkf[y0] + dkf[y1])));
                ev = fmax(ev, fabs(dv[x] - (dvf[y0] + dvf[y1])));
            }
    /* only the order of the fp64 sums differs */
    CHECK(ek < 1e-14 * max_abs(dk, nk) && ev < 1e-14 * max_abs(dv, nk),
          "GQA dk/dv differ from the sums over repeated heads by %g / %g", ek, ev);
    CHECK(max_abs(dk, nk) > 0.01 && max_abs(dv, nk) > 0.01, "GQA gradients vanish");

    /* low precision: a kv head's gradient is the rounded fp32 sum of its
     * query heads' rounded gradients, which the repeated problem gives per head */
    for (int dtype = 0; dtype < 2; dtype++) {
        float *lq = xmalloc(nq * sizeof(float)), *lk = xmalloc(nk * sizeof(float)),
              *lv = xmalloc(nk * sizeof(float)), *lqf = xmalloc(nq * sizeof(float)),
              *lkf = xmalloc(nf * sizeof(float)), *lvf = xmalloc(nf * sizeof(float));
        CHECK(ref_attention_backward_lowp(&g, dtype, q, k, v, dout, lq, lk, lv) == 0, "gqa lowp");
        CHECK(ref_attention_backward_lowp(&f, dtype, q, kf, vf, dout, lqf, lkf, lvf) == 0,
              "mha lowp");
        int bad = memcmp(lq, lqf, nq * sizeof(float)) != 0;
        for (int b = 0; b < 2; b++)
            for (int hk = 0; hk < 2; hk++)
                for (size_t t = 0; t < head; t++) {
                    size_t x = ((size_t)b * 2 + hk) * head + t;
                    size_t y0 = ((size_t)b * 4 + 2 * hk) * head + t, y1 = y0 + head;
                    bad += lk[x] != ref_round(lkf[y0] + lkf[y1], dtype);
                    bad += lv[x] != ref_round(lvf[y0] + lvf[y1], dtype);
                }
        CHECK(bad == 0, "dtype %d: %d GQA lowp gradients differ from the repeated heads'", dtype,
              bad);
        free(lq);
        free(lk);
        free(lv);
        free(lqf);
        free(lkf);
        free(lvf);
    }
    free(q);
    free(k);
    free(v);
    free(dout);
    free(kf);
    free(vf);
    free(dq);
    free(dk);
    free(dv);
    free(dqf);
    free(dkf);
    free(dvf);
}

/* ---- dropout limits ----------------------------------------------------------- */

static void test_dropout_limits(void) {
    ref_problem p = base_problem(2, 2, 1, 7, 40, 6);
    p.mask = REF_MASK_CAUSAL;
    p.diag_offset = 33;
    const size_t nq = q_elems(&p), nk = kv_elems(&p), n = nq + 2 * nk;
    float *q = rand_tensor(nq, 0), *k = rand_tensor(nk, 0), *v = rand_tensor(nk, 0),
          *g = rand_tensor(nq, 0);
    double *ref = xmalloc(n * sizeof(double)), *x = xmalloc(n * sizeof(double));
    float *lref = xmalloc(n * sizeof(float)), *lx = xmalloc(n * sizeof(float));
    CHECK(ref_attention_backward_fp64(&p, q, k, v, g, ref, ref + nq, ref + nq + nk) == 0,
          "no dropout");
    CHECK(ref_attention_backward_lowp(&p, 1, q, k, v, g, lref, lref + nq, lref + nq + nk) == 0,
          "no dropout lowp");
    CHECK(max_abs(ref, n) > 0.01, "gradients vanish without dropout");

    /* p = 0 with a seed, and a p so small that its threshold rounds to 0:
     * dropout on, nothing dropped, scale 1 */
    const double none[2] = {0.0, 1e-6};
    for (int c = 0; c < 2; c++) {
        p.dropout_p = none[c];
        p.seed = 0x1234;
        p.offset = 99;
        CHECK(ref_attention_backward_fp64(&p, q, k, v, g, x, x + nq, x + nq + nk) == 0, "fp64");
        CHECK(memcmp(x, ref, n * sizeof(double)) == 0, "p=%g: fp64 differs from no dropout",
              none[c]);
        CHECK(ref_attention_backward_lowp(&p, 1, q, k, v, g, lx, lx + nq, lx + nq + nk) == 0,
              "lowp");
        CHECK(memcmp(lx, lref, n * sizeof(float)) == 0, "p=%g: lowp differs from no dropout",
              none[c]);
    }

    /* p at (or rounding to) 1: everything dropped, o = 0 and every gradient 0 */
    const double all[2] = {0.99999999, 1.0};
    for (int c = 0; c < 2; c++) {
        p.dropout_p = all[c];
        for (size_t t = 0; t < n; t++) {
            x[t] = 1;
            lx[t] = 1;
        }
        CHECK(ref_attention_backward_fp64(&p, q, k, v, g, x, x + nq, x + nq + nk) == 0, "fp64");
        CHECK(max_abs(x, n) == 0, "p=%.8g: fp64 gradients not all zero (%g)", all[c],
              max_abs(x, n));
        CHECK(ref_attention_backward_lowp(&p, 0, q, k, v, g, lx, lx + nq, lx + nq + nk) == 0,
              "lowp");
        int nz = 0;
        for (size_t t = 0; t < n; t++)
            nz += lx[t] != 0.0f;
        CHECK(nz == 0, "p=%.8g: %d lowp gradients not zero", all[c], nz);
        CHECK(ref_attention_fp64(&p, q, k, v, x, NULL) == 0 && max_abs(x, nq) == 0,
              "p=%.8g: forward output not zero", all[c]);
    }
    free(q);
    free(k);
    free(v);
    free(g);
    free(ref);
    free(x);
    free(lref);
    free(lx);
}

/* ---- low precision --------------------------------------------------------------- */

/* The low-precision logit of the dtype scaled score x in fp32 (cap, then
 * bias) and, with a cap, 1 − tanh² in *dt. */
static float lowp_logit(const ref_problem *p, int b, int h, int i, int j, float x, float *dt) {
    *dt = 1.0f;
    if (p->softcap > 0) {
        const float cap = (float)p->softcap, th = tanhf(x / cap);
        x = cap * th;
        *dt = 1.0f - th * th;
    }
    if (p->alibi_slopes) {
        int64_t dist = (int64_t)i + p->diag_offset - j;
        x -= p->alibi_slopes[(size_t)(p->batch0 + b) * (size_t)p->alibi_stride_batch + (size_t)h] *
             (float)(dist < 0 ? -dist : dist);
    }
    return x;
}

/* The autograd steps of ref_attention_backward_lowp written out per element
 * with ref_visible and ref_dropout_keep, every sum in key / row / head order.
 * With inputs whose dot products are exact in fp32 (so that the blocked dot
 * products of the reference cannot differ by order) it must agree bit for
 * bit: this pins which tensors get rounded. */
static void naive_lowp_backward(const ref_problem *p, int dtype, const float *q, const float *k,
                                const float *v, const float *g, float *dq, float *dk, float *dv) {
    const int D = p->head_dim, DV = dv_of(p), Sq = p->seqlen_q, Sk = p->seqlen_k;
    const int group = p->heads_q / p->heads_kv;
    const uint32_t thr = ref_dropout_threshold(p->dropout_p);
    const float dscale = (float)ref_dropout_scale(thr), scale = (float)p->scale;
    float *y = xmalloc((size_t)Sq * Sk * sizeof(float)),
          *pd = xmalloc((size_t)Sq * Sk * sizeof(float));
    float *ds = xmalloc((size_t)Sq * Sk * sizeof(float)), *s = xmalloc((size_t)Sk * sizeof(float));
    float *dts = xmalloc((size_t)Sk * sizeof(float));
    float *dpr = xmalloc((size_t)Sk * sizeof(float)); /* dP of one row */
    float *hk_sum = xmalloc((size_t)Sk * (D + DV) * sizeof(float)); /* dK, then dV */
    float *hv_sum = hk_sum + (size_t)Sk * D;
    for (int b = 0; b < p->batch; b++)
        for (int hk = 0; hk < p->heads_kv; hk++) {
            const size_t kvbase = ((size_t)b * p->heads_kv + hk) * Sk;
            for (size_t t = 0; t < (size_t)Sk * (D + DV); t++)
                hk_sum[t] = 0;
            for (int h = hk * group; h < (hk + 1) * group; h++) {
                const size_t qbase = ((size_t)b * p->heads_q + h) * Sq;
                for (int i = 0; i < Sq; i++) {
                    const float *qi = q + (qbase + i) * D, *gi = g + (qbase + i) * DV;
                    float m = -INFINITY, sum = 0, di = 0;
                    int any = 0;
                    for (int j = 0; j < Sk; j++) {
                        y[(size_t)i * Sk + j] = 0;
                        pd[(size_t)i * Sk + j] = 0;
                        ds[(size_t)i * Sk + j] = 0;
                        if (!ref_visible(p, h, i, j))
                            continue;
                        float dot = 0;
                        for (int d = 0; d < D; d++)
                            dot += qi[d] * k[(kvbase + j) * D + d];
                        s[j] = lowp_logit(p, b, h, i, j,
                                          ref_round(ref_round(dot, dtype) * scale, dtype), &dts[j]);
                        m = fmaxf(m, s[j]);
                        any = 1;
                    }
                    if (!any)
                        continue;
                    if (p->sinks)
                        m = fmaxf(m, p->sinks[h]);
                    for (int j = 0; j < Sk; j++)
                        if (ref_visible(p, h, i, j))
                            sum += expf(s[j] - m);
                    if (p->sinks)
                        sum += expf(p->sinks[h] - m);
                    for (int j = 0; j < Sk; j++) {
                        if (!ref_visible(p, h, i, j))
                            continue;
                        float yj = expf(s[j] - m) / sum, pj = ref_round(yj, dtype);
                        float dot = 0;
                        for (int d = 0; d < DV; d++)
                            dot += gi[d] * v[(kvbase + j) * DV + d];
                        float dpd = ref_round(dot, dtype), dpj = dpd;
                        if (thr) {
                            int keep = ref_dropout_keep(p->seed, p->offset, b, h, i, j, thr);
                            pj = keep ? ref_round(pj * dscale, dtype) : 0.0f;
                            dpj = keep ? ref_round(dpd * dscale, dtype) : 0.0f;
                        }
                        y[(size_t)i * Sk + j] = yj;
                        pd[(size_t)i * Sk + j] = pj;
                        dpr[j] = dpj;
                        di += yj * dpj;
                    }
                    for (int j = 0; j < Sk; j++) {
                        if (!ref_visible(p, h, i, j))
                            continue;
                        float gj = y[(size_t)i * Sk + j] * (dpr[j] - di);
                        if (p->softcap > 0)
                            gj *= dts[j];
                        ds[(size_t)i * Sk + j] = ref_round(ref_round(gj, dtype) * scale, dtype);
                    }
                }
                for (int i = 0; i < Sq; i++)
                    for (int d = 0; d < D; d++) {
                        float a = 0;
                        for (int j = 0; j < Sk; j++)
                            if (ref_visible(p, h, i, j))
                                a += ds[(size_t)i * Sk + j] * k[(kvbase + j) * D + d];
                        dq[(qbase + i) * D + d] = ref_round(a, dtype);
                    }
                for (int j = 0; j < Sk; j++) {
                    for (int d = 0; d < D; d++) {
                        float ak = 0;
                        for (int i = 0; i < Sq; i++)
                            if (ref_visible(p, h, i, j))
                                ak += ds[(size_t)i * Sk + j] * q[(qbase + i) * D + d];
                        hk_sum[(size_t)j * D + d] += ref_round(ak, dtype);
                    }
                    for (int d = 0; d < DV; d++) {
                        float av = 0;
                        for (int i = 0; i < Sq; i++)
                            if (ref_visible(p, h, i, j))
                                av += pd[(size_t)i * Sk + j] * g[(qbase + i) * DV + d];
                        hv_sum[(size_t)j * DV + d] += ref_round(av, dtype);
                    }
                }
            }
            for (int j = 0; j < Sk; j++) {
                for (int d = 0; d < D; d++)
                    dk[(kvbase + j) * D + d] = ref_round(hk_sum[(size_t)j * D + d], dtype);
                for (int d = 0; d < DV; d++)
                    dv[(kvbase + j) * DV + d] = ref_round(hv_sum[(size_t)j * DV + d], dtype);
            }
        }
    free(y);
    free(pd);
    free(ds);
    free(s);
    free(dts);
    free(dpr);
    free(hk_sum);
}

static void test_lowp_steps(void) {
    const float sinks[4] = {0.75f, 2.0f, -1.0f, 1.5f};
    float slopes[3 * 4]; /* (batch0 + B, Hq) */
    for (int t = 0; t < 12; t++)
        slopes[t] = 0.1f + 0.05f * (float)t;
    for (int dtype = 0; dtype < 2; dtype++)
        for (int c = 0; c < 7; c++) {
            ref_problem p = base_problem(2, 4, c ? 2 : 4, 19, c == 2 ? 45 : 23, c ? 15 : 16);
            p.scale = 0.3; /* not a power of two: dS·scale rounds again */
            if (c == 5) p.head_dim_v = 9;   /* V, dO and dV narrower than Q and K */
            if (c == 6) p.head_dim_v = 24, p.mask = REF_MASK_CAUSAL, p.diag_offset = 4; /* wider */
            if (c >= 1) {
                p.mask = REF_MASK_CAUSAL;
                p.diag_offset = c == 2 ? 26 : 4;
                p.dropout_p = 0.15;
                p.seed = 5 + (uint64_t)c;
                p.offset = 3;
            }
            if (c == 2) { /* keys span two dropout stretches; butterfly hides some */
                p.sparsity = REF_SPARSE_BUTTERFLY;
                p.block_q = 4;
                p.block_k = 8;
                p.butterfly_factors = 2;
            }
            if (c == 3) { /* every variant, dropout; one slope per head */
                p.softcap = 1.0, p.alibi_slopes = slopes, p.sinks = sinks;
            } else if (c == 4) { /* the cap and slopes per (batch, head) from batch 1 */
                p.mask = REF_MASK_NONE, p.dropout_p = 0;
                p.softcap = 0.75, p.alibi_slopes = slopes, p.alibi_stride_batch = 4, p.batch0 = 1;
            }
            const size_t nq = q_elems(&p), nk = kv_elems(&p), no = o_elems(&p), nv = v_elems(&p);
            /* multiples of 1/64 up to 2: the products in S and dO·Vᵀ and
             * their sums are exact in fp32 */
            float *q = grid_tensor(nq, 6, 2), *k = grid_tensor(nk, 6, 2),
                  *v = grid_tensor(nv, 6, 2), *g = grid_tensor(no, 6, 2);
            float *a = xmalloc((nq + nk + nv) * sizeof(float)),
                  *w = xmalloc((nq + nk + nv) * sizeof(float));
            CHECK(ref_attention_backward_lowp(&p, dtype, q, k, v, g, a, a + nq, a + nq + nk) == 0,
                  "lowp failed");
            naive_lowp_backward(&p, dtype, q, k, v, g, w, w + nq, w + nq + nk);
            int diff[3] = {0, 0, 0}, rep = 1;
            for (size_t t = 0; t < nq + nk + nv; t++) {
                diff[t < nq ? 0 : t < nq + nk ? 1 : 2] += a[t] != w[t];
                rep &= ref_round(a[t], dtype) == a[t];
            }
            CHECK(diff[0] + diff[1] + diff[2] == 0,
                  "dtype %d case %d: %d dq, %d dk, %d dv differ from the naive steps", dtype, c,
                  diff[0], diff[1], diff[2]);
            CHECK(rep, "dtype %d case %d: outputs not representable in dtype", dtype, c);
            free(q);
            free(k);
            free(v);
            free(g);
            free(a);
            free(w);
        }
}

static void test_lowp_error(void) {
    static const char *grad_names[3] = {"dq", "dk", "dv"};
    static const float sinks[2] = {1.0f, 2.5f}, slopes[2] = {0.125f, 0.25f};
    for (int c = 0; c < 3; c++) {
        ref_problem p = base_problem(1, 2, 1, 33, 47, 16);
        if (c) {
            p.mask = REF_MASK_CAUSAL;
            p.diag_offset = 14;
            p.dropout_p = 0.2;
            p.seed = 31;
            p.offset = 4;
        }
        if (c == 2) /* every variant */
            p.softcap = 1.5, p.alibi_slopes = slopes, p.sinks = sinks;
        const size_t nq = q_elems(&p), nk = kv_elems(&p);
        /* bf16 inputs are exact in fp16 too: both dtypes see the same problem */
        float *q = rand_tensor(nq, 1), *k = rand_tensor(nk, 1), *v = rand_tensor(nk, 1),
              *g = rand_tensor(nq, 1);
        for (size_t t = 0; t < nq; t++)
            q[t] = ref_round(3 * q[t], 1); /* an uneven softmax */
        double *r = xmalloc((nq + 2 * nk) * sizeof(double));
        float *l = xmalloc((nq + 2 * nk) * sizeof(float));
        CHECK(ref_attention_backward_fp64(&p, q, k, v, g, r, r + nq, r + nq + nk) == 0, "fp64");
        double e[2][3];
        for (int dtype = 0; dtype < 2; dtype++) {
            CHECK(ref_attention_backward_lowp(&p, dtype, q, k, v, g, l, l + nq, l + nq + nk) == 0,
                  "lowp");
            e[dtype][0] = ref_rel_error_f(l, r, nq);
            e[dtype][1] = ref_rel_error_f(l + nq, r + nq, nk);
            e[dtype][2] = ref_rel_error_f(l + nq + nk, r + nq + nk, nk);
            const double lim = dtype == 0 ? 1e-2 : 5e-2;
            for (int t = 0; t < 3; t++)
                CHECK(e[dtype][t] > 0 && e[dtype][t] < lim, "case %d dtype %d %s: error %g", c,
                      dtype, grad_names[t], e[dtype][t]);
        }
        for (int t = 0; t < 3; t++)
            CHECK(e[1][t] > 2 * e[0][t], "case %d %s: bf16 error %g not above fp16's %g", c,
                  grad_names[t], e[1][t], e[0][t]);
        printf("lowp backward error vs fp64, case %d: fp16 dq %.3g dk %.3g dv %.3g, "
               "bf16 dq %.3g dk %.3g dv %.3g\n",
               c, e[0][0], e[0][1], e[0][2], e[1][0], e[1][1], e[1][2]);
        free(q);
        free(k);
        free(v);
        free(g);
        free(r);
        free(l);
    }
}

/* ---- invalid problems -------------------------------------------------------------- */

static void test_invalid(void) {
    ref_problem good = base_problem(1, 4, 2, 8, 8, 4);
    float x[4 * 8 * 4] = {0};
    double d[4 * 8 * 4];
    float f[4 * 8 * 4];
    CHECK(ref_attention_backward_fp64(&good, x, x, x, x, d, d, d) == 0, "good problem refused");
    CHECK(ref_attention_backward_lowp(&good, 1, x, x, x, x, f, f, f) == 0, "good lowp refused");
    CHECK(ref_attention_backward_fp64(NULL, x, x, x, x, d, d, d) == -1, "NULL problem");
    CHECK(ref_attention_backward_lowp(NULL, 0, x, x, x, x, f, f, f) == -1, "NULL problem lowp");
    CHECK(ref_attention_backward_lowp(&good, 2, x, x, x, x, f, f, f) == -1, "dtype 2");
    CHECK(ref_attention_backward_lowp(&good, -1, x, x, x, x, f, f, f) == -1, "dtype -1");
    for (int c = 0; c < 8; c++) {
        ref_problem p = good;
        switch (c) {
        case 0:
            p.heads_kv = 3; /* 4 % 3 */
            break;
        case 1:
            p.heads_kv = 0;
            break;
        case 2:
            p.head_dim = 0;
            break;
        case 3:
            p.batch = -1;
            break;
        case 4:
            p.mask = 7;
            break;
        case 5: /* layout sparsity without a layout */
            p.sparsity = REF_SPARSE_LAYOUT;
            p.block_q = p.block_k = 4;
            break;
        case 6: /* layout_heads neither 1 nor heads_q */
            p.sparsity = REF_SPARSE_LAYOUT;
            p.block_q = p.block_k = 4;
            p.layout = (const uint8_t *)f;
            p.layout_heads = 2;
            break;
        default:
            p.sparsity = REF_SPARSE_BUTTERFLY; /* zero block sizes */
            break;
        }
        CHECK(ref_attention_backward_fp64(&p, x, x, x, x, d, d, d) == -1, "fp64 case %d accepted",
              c);
        CHECK(ref_attention_backward_lowp(&p, 0, x, x, x, x, f, f, f) == -1,
              "lowp case %d accepted", c);
    }
}

int main(void) {
    test_finite_differences();
    test_variants_fd();
    test_sinks_invalid();
    test_single_key();
    test_null_outputs();
    test_gqa();
    test_dropout_limits();
    test_lowp_steps();
    test_lowp_error();
    test_invalid();
    return check_summary("test_reference_backward");
}
