/* A problem's outputs against the fp64 reference (reference/), with the
 * bounds the tests and `flashgen check` use.
 *
 * Forward: ‖O − ref‖/‖ref‖ at most 2× that of the naive computation in the
 * input precision (ref_attention_lowp) + 1e-6, an absolute floor for
 * problems where the naive path is exact (one visible key per row); LSE
 * within 1e-3·max(1, |ref|) and -inf exactly where ref is; O exactly 0 on
 * rows that see no key (with sinks: whose reference lse is the sink and O 0).
 *
 * Sinks' gradient: per head |x − ref| at most 8·eps·Σ_(b,i) e^(σ−lse)·
 * Σ_d |O·dO| + 1e-6, eps the dtype's unit roundoff (2^-11 fp16, 2^-8
 * bf16): D = rowsum(dO∘O) is formed from O rounded to the dtype. That bound
 * is of the size of d_sinks itself (D cancels over d and the terms over
 * rows), so the backward is also held to the same sum formed in fp64 from
 * the forward's own O and lse as the device holds them, which it reads:
 * |x − own| at most 1e-5·Σ_(b,i) e^(σ−lse)·Σ_d |O·dO| + 1e-6 (fp32 sums of
 * d products and of the rows; the GPU's error against it is ~1e-8 of it).
 *
 * Backward: each of dQ, dK, dV at most 3× the naive path's error
 * (ref_attention_backward_lowp) + 1e-6. Where the fp64 gradient is
 * identically 0 although keys are visible (every row sees exactly one key,
 * e.g. Sk = 1 or window 0/0: dS = P∘(dP − D) cancels exactly), the relative
 * error is undefined and the GPU's fp32 dP − D leaves rounding noise: there
 * the error is rms(x − ref) / rms(fp64 dV) (dV does not cancel; its terms
 * are the size of those that do) and the floor 1e-5 (a CPU model of that
 * fp32 noise gives about 2e-7). */
#ifndef FG_HARNESS_COMPARE_H
#define FG_HARNESS_COMPARE_H

#include <stddef.h>

#include "harness/problem.h"

#define FGH_FORWARD_FACTOR 2.0
#define FGH_GRAD_FACTOR 3.0
#define FGH_ABS_FLOOR 1e-6
#define FGH_ZERO_GRAD_FLOOR 1e-5
#define FGH_LSE_TOL 1e-3

typedef struct fgh_forward_check {
    double err;           /* ‖O − ref‖/‖ref‖ */
    double naive_err;     /* the same of the naive input-precision computation */
    double bound;         /* FGH_FORWARD_FACTOR × naive_err + FGH_ABS_FLOOR */
    size_t lse_bad;       /* rows off by more than FGH_LSE_TOL·max(1, |ref|), NaN included */
    double lse_worst;     /* largest |lse − ref| (a NaN sticks) */
    double lse_worst_rel; /* largest |lse − ref| / max(1, |ref|) (a NaN sticks) */
    size_t lse_bad_inf;   /* rows that see no key with an lse other than -inf (no sinks) */
    size_t zero_rows_bad; /* rows that see no key with an O other than 0 */
    int pass;             /* all of it within bounds */
} fgh_forward_check;

/* o (B,Hq,Sq,Dv) and lse (B,Hq,Sq; NULL: not checked) of the problem's host
 * inputs against the reference. 1, or 0 with the message when the reference
 * could not run (invalid problem, out of memory). */
int fgh_check_forward(const fgh_problem *p, const double *o, const float *lse,
                      fgh_forward_check *out);

enum { FGH_DQ = 0, FGH_DK = 1, FGH_DV = 2, FGH_GRADS = 3 };

/* What a backward's gradients are checked against. */
typedef struct fgh_backward_expect {
    size_t n[FGH_GRADS];          /* elements of dQ, dK, dV */
    double *ref[FGH_GRADS];       /* fp64 gradients (B,H,S,D; dV's Dv) */
    int zero[FGH_GRADS];          /* the fp64 gradient is identically 0 */
    double dv_rms;                /* rms of the fp64 dV: the yardstick where zero[] */
    double naive_err[FGH_GRADS];  /* the naive path's error */
    double bound[FGH_GRADS];
} fgh_backward_expect;

/* The fp64 gradients of the problem's host inputs and dO, the naive path's
 * errors and the bounds. 1, or 0 with the message; free it either way. */
int fgh_expect_backward(const fgh_problem *p, fgh_backward_expect *e);
void fgh_expect_free(fgh_backward_expect *e);

/* ‖x − ref‖/‖ref‖; where ref is identically 0, rms(x − ref) / alt_rms (0 if
 * x is 0 too; infinite if alt_rms is 0 and x is not). NaN in x gives NaN. */
double fgh_grad_error(const double *x, const double *ref, size_t n, double alt_rms);

/* err[g] of one run's x[g] (B,H,S,D) against e; 1 when all are within bounds. */
int fgh_check_backward(const fgh_backward_expect *e, double *const x[FGH_GRADS],
                       double err[FGH_GRADS]);

#define FGH_SINKS_OWN_TOL 1e-5

/* The sinks' gradient (spec.sinks) a backward is checked against; each
 * bound is the array's value + FGH_ABS_FLOOR. */
typedef struct fgh_sinks_expect {
    int heads;
    int has_own;       /* own and own_bound were formed */
    double *ref;       /* (Hq) fp64 d_sinks */
    double *bound;     /* (Hq) 8·eps·Σ e^(σ−lse)·Σ_d |O·dO| (fp64 O and lse) */
    double *own;       /* (Hq) −Σ e^(σ−lse)·rowsum(dO∘O) of the forward's O and lse */
    double *own_bound; /* (Hq) FGH_SINKS_OWN_TOL·Σ e^(σ−lse)·Σ_d |O·dO| of those */
} fgh_sinks_expect;

/* Zeroed arrays for heads; 1, or 0 with the message. */
int fgh_sinks_expect_init(fgh_sinks_expect *e, int heads);
/* Adds the problem's terms (its host inputs and dO) to e: the sum over the
 * sequences of a packed call. o (B,Hq,Sq,D) and lse (B,Hq,Sq) are the
 * forward's outputs as read back from the device, for own; NULL: own is not
 * formed (then give NULL to every add). 1, or 0 with the message. */
int fgh_expect_sinks_add(const fgh_problem *p, const double *o, const float *lse,
                         fgh_sinks_expect *e);
/* init and add: the expectation of one problem. Free it either way. */
int fgh_expect_sinks(const fgh_problem *p, const double *o, const float *lse,
                     fgh_sinks_expect *e);
void fgh_sinks_expect_free(fgh_sinks_expect *e);
/* x (Hq) against e: worst[0] the largest |x − ref| / bound, worst[1] that
 * of |x − own| (0 without own; a NaN sticks); 1 when every head is within
 * both bounds. */
int fgh_check_sinks(const fgh_sinks_expect *e, const double *x, double worst[2]);

/* Elements of a and b that differ bit for bit. */
size_t fgh_bits_differ(const double *a, const double *b, size_t n);

#endif
