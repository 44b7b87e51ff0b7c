/* Outputs against the fp64 reference: see compare.h. */
#include "harness/compare.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness/message.h"

/* Keeps the largest x seen in *worst; a NaN sticks. */
static void keep_worst(double *worst, double x) {
    if (!isnan(*worst) && !(x <= *worst)) *worst = x;
}

/* A reference row that sees no key: lse -inf, or with sinks the sink's lse
 * exactly and O exactly 0 (a row whose keys all underflow beside the sink
 * counts too: O is 0 there as well). */
static int empty_row(const fgh_problem *p, size_t r, const double *ref, double ref_lse) {
    if (isinf(ref_lse) && ref_lse < 0) return 1;
    if (!p->spec.sinks || !p->host.sinks || p->shape.seqlen_q <= 0 || p->shape.heads_q <= 0)
        return 0;
    int h = (int)(r / (size_t)p->shape.seqlen_q % (size_t)p->shape.heads_q), d = p->head_dim_v;
    if (ref_lse != (double)p->host.sinks[h]) return 0;
    for (int t = 0; t < d; t++)
        if (ref[r * (size_t)d + (size_t)t] != 0.0) return 0;
    return 1;
}

/* LSE against the fp64 one, and O exactly 0 on rows with no visible key. */
static void compare_rows(const fgh_problem *p, const double *o, const float *lse,
                         const double *ref, const double *ref_lse, fgh_forward_check *c) {
    int d = p->head_dim_v;
    for (size_t r = 0; r < p->rows; r++) {
        if (empty_row(p, r, ref, ref_lse[r])) {
            for (int t = 0; t < d; t++)
                if (o[r * (size_t)d + (size_t)t] != 0.0) {
                    c->zero_rows_bad++;
                    break;
                }
        }
        if (isinf(ref_lse[r]) && ref_lse[r] < 0) {
            if (lse && !(isinf(lse[r]) && lse[r] < 0)) c->lse_bad_inf++;
            continue;
        }
        if (!lse) continue;
        double err = fabs((double)lse[r] - ref_lse[r]), scale = fmax(1.0, fabs(ref_lse[r]));
        if (!(err <= FGH_LSE_TOL * scale)) c->lse_bad++;
        keep_worst(&c->lse_worst, err);
        keep_worst(&c->lse_worst_rel, err / scale);
    }
}

int fgh_check_forward(const fgh_problem *p, const double *o, const float *lse,
                      fgh_forward_check *out) {
    memset(out, 0, sizeof *out);
    out->err = out->naive_err = out->bound = out->lse_worst = out->lse_worst_rel = NAN;
    double *ref = malloc((p->no ? p->no : 1) * sizeof(double));
    double *ref_lse = malloc((p->rows ? p->rows : 1) * sizeof(double));
    float *naive = malloc((p->no ? p->no : 1) * sizeof(float));
    int ok = ref && ref_lse && naive;
    if (!ok) fgh_fail("out of host memory (the reference of %zu elements)", p->no);
    ref_problem rp = fgh_reference_problem(p);
    fg_dtype dt = p->spec.dtype;
    if (ok && (ref_attention_fp64(&rp, p->host.q, p->host.k, p->host.v, ref, ref_lse) != 0 ||
               ref_attention_lowp(&rp, (int)dt, p->host.q, p->host.k, p->host.v, naive) != 0))
        ok = fgh_fail("the reference refused the problem, or ran out of memory");
    if (ok) {
        out->err = ref_rel_error(o, ref, p->no);
        out->naive_err = ref_rel_error_f(naive, ref, p->no);
        out->bound = FGH_FORWARD_FACTOR * out->naive_err + FGH_ABS_FLOOR;
        out->lse_worst = out->lse_worst_rel = 0.0;
        compare_rows(p, o, lse, ref, ref_lse, out);
        out->pass = out->err <= out->bound && out->lse_bad == 0 && out->lse_bad_inf == 0 &&
                    out->zero_rows_bad == 0;
    }
    free(ref), free(ref_lse), free(naive);
    return ok;
}

double fgh_grad_error(const double *x, const double *ref, size_t n, double alt_rms) {
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

/* The rms of the fp64 dV (the yardstick of gradients that are identically
 * 0), and per gradient whether it is, the naive path's error and the bound. */
static void set_bounds(fgh_backward_expect *e, float *const naive[FGH_GRADS], double *scratch) {
    double ss = 0.0;
    for (size_t t = 0; t < e->n[FGH_DV]; t++) ss += e->ref[FGH_DV][t] * e->ref[FGH_DV][t];
    e->dv_rms = sqrt(ss / (double)e->n[FGH_DV]);
    for (int g = 0; g < FGH_GRADS; g++) {
        e->zero[g] = 1;
        for (size_t t = 0; t < e->n[g] && e->zero[g]; t++) e->zero[g] = e->ref[g][t] == 0.0;
        for (size_t t = 0; t < e->n[g]; t++) scratch[t] = (double)naive[g][t];
        e->naive_err[g] = fgh_grad_error(scratch, e->ref[g], e->n[g], e->dv_rms);
        e->bound[g] = FGH_GRAD_FACTOR * e->naive_err[g] +
                      (e->zero[g] ? FGH_ZERO_GRAD_FLOOR : FGH_ABS_FLOOR);
    }
}

int fgh_expect_backward(const fgh_problem *p, fgh_backward_expect *e) {
    memset(e, 0, sizeof *e);
    e->n[FGH_DQ] = p->nq;
    e->n[FGH_DK] = p->nk;
    e->n[FGH_DV] = p->nv;
    size_t most = p->nq > p->nk ? p->nq : p->nk;
    if (p->nv > most) most = p->nv;
    float *naive[FGH_GRADS] = {NULL, NULL, NULL};
    double *scratch = malloc((most ? most : 1) * sizeof(double));
    int ok = scratch != NULL;
    for (int g = 0; g < FGH_GRADS; g++) {
        e->ref[g] = malloc((e->n[g] ? e->n[g] : 1) * sizeof(double));
        naive[g] = malloc((e->n[g] ? e->n[g] : 1) * sizeof(float));
        ok = ok && e->ref[g] && naive[g];
    }
    if (!ok) fgh_fail("out of host memory (the reference gradients)");
    ref_problem rp = fgh_reference_problem(p);
    const float *q = p->host.q, *k = p->host.k, *v = p->host.v, *d_o = p->host.d_o;
    if (ok && (ref_attention_backward_fp64(&rp, q, k, v, d_o, e->ref[FGH_DQ], e->ref[FGH_DK],
                                           e->ref[FGH_DV]) != 0 ||
               ref_attention_backward_lowp(&rp, (int)p->spec.dtype, q, k, v, d_o, naive[FGH_DQ],
                                           naive[FGH_DK], naive[FGH_DV]) != 0))
        ok = fgh_fail("the reference refused the problem, or ran out of memory");
    if (ok) set_bounds(e, naive, scratch);
    for (int g = 0; g < FGH_GRADS; g++) free(naive[g]);
    free(scratch);
    return ok;
}

void fgh_expect_free(fgh_backward_expect *e) {
    for (int g = 0; g < FGH_GRADS; g++) free(e->ref[g]);
    memset(e, 0, sizeof *e);
}

int fgh_check_backward(const fgh_backward_expect *e, double *const x[FGH_GRADS],
                       double err[FGH_GRADS]) {
    int pass = 1;
    for (int g = 0; g < FGH_GRADS; g++) {
        err[g] = fgh_grad_error(x[g], e->ref[g], e->n[g], e->dv_rms);
        pass &= err[g] <= e->bound[g];
    }
    return pass;
}

int fgh_sinks_expect_init(fgh_sinks_expect *e, int heads) {
    memset(e, 0, sizeof *e);
    e->heads = heads > 0 ? heads : 0;
    e->has_own = 1; /* until an add without the outputs */
    const size_t n = (size_t)(e->heads ? e->heads : 1);
    e->ref = calloc(n, sizeof *e->ref), e->bound = calloc(n, sizeof *e->bound);
    e->own = calloc(n, sizeof *e->own), e->own_bound = calloc(n, sizeof *e->own_bound);
    return (e->ref && e->bound && e->own && e->own_bound) ||
           fgh_fail("out of host memory (%d sinks)", heads);
}

/* −Σ e^(σ−lse)·rowsum(dO∘O) per head into sum, and Σ e^(σ−lse)·Σ_d |O·dO|
 * times `factor` into size, over the problem's rows of o and lse. */
static void sinks_terms(const fgh_problem *p, const double *o, const double *lse_d,
                        const float *lse_f, double factor, double *sum, double *size) {
    const int hq = p->shape.heads_q, d = p->head_dim_v, sq = p->shape.seqlen_q;
    for (size_t r = 0; sq > 0 && hq > 0 && r < p->rows; r++) {
        const int h = (int)(r / (size_t)sq % (size_t)hq);
        const double lse = lse_d ? lse_d[r] : (double)lse_f[r];
        const double ps = exp((double)p->host.sinks[h] - lse);
        double dot = 0.0, mag = 0.0;
        const double *oi = o + r * (size_t)d;
        const float *gi = p->host.d_o + r * (size_t)d;
        for (int t = 0; t < d; t++) {
            const double x = oi[t] * (double)gi[t];
            dot += x;
            mag += fabs(x);
        }
        if (sum) sum[h] -= ps * dot;
        size[h] += factor * ps * mag;
    }
}

int fgh_expect_sinks_add(const fgh_problem *p, const double *o, const float *lse,
                         fgh_sinks_expect *e) {
    const int hq = p->shape.heads_q;
    if (!p->spec.sinks || !p->host.sinks || !p->host.d_o || hq != e->heads)
        return fgh_fail("the sinks' gradient needs spec.sinks, gradients and %d heads", e->heads);
    double *ro = malloc((p->no ? p->no : 1) * sizeof *ro); /* the fp64 O and lse */
    double *rl = malloc((p->rows ? p->rows : 1) * sizeof *rl);
    double *g = malloc((size_t)(hq ? hq : 1) * sizeof *g);
    int ok = (ro && rl && g) || fgh_fail("out of host memory (the sinks' reference)");
    ref_problem rp = fgh_reference_problem(p);
    if (ok && (ref_attention_fp64(&rp, p->host.q, p->host.k, p->host.v, ro, rl) != 0 ||
               ref_sinks_backward_fp64(&rp, p->host.q, p->host.k, p->host.v, p->host.d_o, g) != 0))
        ok = fgh_fail("the reference refused the problem, or ran out of memory");
    if (ok) {
        const double eps = p->spec.dtype == FG_BF16 ? 0x1p-8 : 0x1p-11;
        for (int h = 0; h < hq; h++) e->ref[h] += g[h];
        sinks_terms(p, ro, rl, NULL, 8.0 * eps, NULL, e->bound);
        if (o && lse)
            sinks_terms(p, o, NULL, lse, FGH_SINKS_OWN_TOL, e->own, e->own_bound);
        else
            e->has_own = 0;
    }
    free(ro), free(rl), free(g);
    return ok;
}

int fgh_expect_sinks(const fgh_problem *p, const double *o, const float *lse,
                     fgh_sinks_expect *e) {
    return fgh_sinks_expect_init(e, p->shape.heads_q) && fgh_expect_sinks_add(p, o, lse, e);
}

void fgh_sinks_expect_free(fgh_sinks_expect *e) {
    free(e->ref), free(e->bound), free(e->own), free(e->own_bound);
    memset(e, 0, sizeof *e);
}

int fgh_check_sinks(const fgh_sinks_expect *e, const double *x, double worst[2]) {
    int pass = 1;
    worst[0] = worst[1] = 0.0;
    for (int h = 0; h < e->heads; h++) {
        double ratio = fabs(x[h] - e->ref[h]) / (e->bound[h] + FGH_ABS_FLOOR);
        pass &= ratio <= 1.0;
        keep_worst(&worst[0], ratio);
        if (!e->has_own) continue;
        ratio = fabs(x[h] - e->own[h]) / (e->own_bound[h] + FGH_ABS_FLOOR);
        pass &= ratio <= 1.0;
        keep_worst(&worst[1], ratio);
    }
    return pass;
}

size_t fgh_bits_differ(const double *a, const double *b, size_t n) {
    size_t k = 0;
    for (size_t t = 0; t < n; t++) k += memcmp(&a[t], &b[t], sizeof a[t]) != 0;
    return k;
}
