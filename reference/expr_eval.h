/* An fp64 evaluator of score and mask expressions (gen/expr.h's trees), for
 * the reference attention. It shares the parser's tree and nothing else with
 * the library: values are computed from the tree directly, and derivatives
 * by forward-mode dual numbers, never through expr_derivative, so a mistake
 * in the generated code or in the symbolic derivative cannot hide here.
 *
 * Semantics (the library's contract):
 *   - ints are 32-bit two's complement; + - * and unary - wrap; x % 0 = 0,
 *     INT_MIN % -1 = 0, otherwise C's truncated remainder; '/' divides as
 *     floats; an int meets a float (arithmetic, comparison, where) as a float;
 *     abs, min and max of ints stay ints;
 *   - exp log tanh sqrt floor are C's double functions (log(0) = -inf,
 *     sqrt(-1) = NaN); float min and max are fmin and fmax;
 *   - a read outside an aux tensor (any index outside [0, size)) gives 0;
 *     float elements are float32 widened to double;
 *   - derivatives: floor, comparisons and % contribute 0; where, abs, min and
 *     max take the derivative of the branch taken (abs: x < 0 picks −x;
 *     min: the first argument when a <= b; max: the first when a >= b); an
 *     operation whose operands' derivatives are all 0 has derivative 0 (no
 *     0·inf). */
#ifndef FG_REFERENCE_EXPR_EVAL_H
#define FG_REFERENCE_EXPR_EVAL_H

#include <stdint.h>

#include "gen/expr.h"

/* One auxiliary tensor's host data: the elements are int32_t or float as its
 * expr_aux declaration says; the first `rank` sizes and strides are used. */
typedef struct ref_aux {
    const void *data;
    int64_t size[EXPR_MAX_RANK];
    int64_t stride[EXPR_MAX_RANK]; /* in elements */
} ref_aux;

/* The point an expression is evaluated at: the variables and the tensors. */
typedef struct expr_env {
    double s;
    int32_t b, h, q, k, seqlen_q, seqlen_k;
    const expr_aux *decl; /* aux_count declarations, and their data */
    const ref_aux *aux;
    int aux_count;
} expr_env;

/* The derivative with respect to s, for expr_eval_dual's wrt. */
#define EXPR_WRT_S (-1)

/* 1 when t can be evaluated safely against these tensors: well formed
 * (children before parents, operand counts, known operations), of the kind
 * asked with a root of that kind's type, every read naming a declared tensor
 * with one index per dimension and its element type, and every tensor a
 * valid declaration with sizes >= 0 and data (unless empty). Else 0. */
int expr_eval_ok(const expr_tree *t, expr_kind kind, const expr_aux *decl, const ref_aux *aux,
                 int aux_count);

/* The root's value (a mask's: 1 or 0). t must pass expr_eval_ok. */
double expr_eval(const expr_tree *t, const expr_env *env);

/* The root's value, and in *tangent its derivative with respect to s
 * (wrt = EXPR_WRT_S) or to the value that node wrt reads (a read of a float
 * tensor; any other node gives a derivative of 0). With at, *at gets the
 * element node wrt read as an offset in its tensor's sizes, row-major and
 * contiguous, or -1 when the read fell outside the tensor (or wrt is not a
 * read). t must pass expr_eval_ok. */
double expr_eval_dual(const expr_tree *t, const expr_env *env, int wrt, double *tangent,
                      int64_t *at);

/* The reads of float tensors that t's root depends on, in index order:
 * their node indices in nodes (EXPR_MAX_NODES suffice); returns how many. */
int expr_eval_float_reads(const expr_tree *t, int *nodes);

#endif
