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

/* LSE against the fp64 one, and O exactly 0 on rows with no visible key. */
static void compare_rows(const fgh_problem *p, const double *o, const float *lse,
                         const double *ref_lse, fgh_forward_check *c) {
    int d = p->spec.head_dim;
    for (size_t r = 0; r < p->rows; r++) {
        if (isinf(ref_lse[r]) && ref_lse[r] < 0) {
            for (int t = 0; t < d; t++)
                if (o[r * (size_t)d + (size_t)t] != 0.0) {
                    c->zero_rows_bad++;
                    break;
                }
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
    double *ref = malloc((p->nq ? p->nq : 1) * sizeof(double));
    double *ref_lse = malloc((p->rows ? p->rows : 1) * sizeof(double));
    float *naive = malloc((p->nq ? p->nq : 1) * sizeof(float));
    int ok = ref && ref_lse && naive;
    if (!ok) fgh_fail("out of host memory (the reference of %zu elements)", p->nq);
    ref_problem rp = fgh_reference_problem(p);
    fg_dtype dt = p->spec.dtype;
    if (ok && (ref_attention_fp64(&rp, p->host.q, p->host.k, p->host.v, ref, ref_lse) != 0 ||
               ref_attention_lowp(&rp, (int)dt, p->host.q, p->host.k, p->host.v, naive) != 0))
        ok = fgh_fail("the reference refused the problem, or ran out of memory");
    if (ok) {
        out->err = ref_rel_error(o, ref, p->nq);
        out->naive_err = ref_rel_error_f(naive, ref, p->nq);
        out->bound = FGH_FORWARD_FACTOR * out->naive_err + FGH_ABS_FLOOR;
        out->lse_worst = out->lse_worst_rel = 0.0;
        compare_rows(p, o, lse, ref_lse, out);
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
    e->n[FGH_DK] = e->n[FGH_DV] = p->nk;
    size_t most = p->nq > p->nk ? p->nq : p->nk;
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

size_t fgh_bits_differ(const double *a, const double *b, size_t n) {
    size_t k = 0;
    for (size_t t = 0; t < n; t++) k += memcmp(&a[t], &b[t], sizeof a[t]) != 0;
    return k;
}
