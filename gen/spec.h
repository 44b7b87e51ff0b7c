/* Specs: what a kernel is specialized on, canonicalized so that equivalent
 * requests share one kernel. */
#ifndef FG_SPEC_H
#define FG_SPEC_H

#include <stddef.h>

#include "flashgen.h"
#include "gen/expr.h"

/* Validate and canonicalize: fields that do not apply are zeroed, flags are
 * 0/1. Returns 0, or -1 with err naming the field and the reason. */
int spec_canonicalize(const fg_spec *in, fg_spec *out, char *err, size_t err_len);

/* Short name of a canonical spec: "bf16_d128_causal_drop_bfly3_b64x64", with a value head
 * dim unlike the head dim "bf16_d192v128_causal". */
void spec_name(const fg_spec *spec, char *buf, size_t len);

/* Whether an expression field holds one: NULL and "" are none. */
int spec_has_expr(const char *text);

/* The spec's aux declarations in the parser's form (out: spec->aux_count
 * entries). Returns 0, or -1 with err. */
int spec_expr_aux(const fg_spec *spec, expr_aux *out, char *err, size_t err_len);

/* Parse the spec's score_mod into score and mask_mod into mask (each only
 * when the spec has it). Returns 0, or -1 with err naming the field and the
 * column. */
int spec_expr_trees(const fg_spec *spec, expr_tree *score, expr_tree *mask, char *err,
                    size_t err_len);

/* The tensor reads of the spec's expressions (expr_read_shape) and their
 * calls of exp, log, tanh and sqrt (expr_math_calls), score and mask
 * summed; all 0 without expressions or when they do not parse. */
void spec_expr_reads(const fg_spec *spec, int *both, int *k_only, int *calls);

/* Head dim rounded up to the tensor-core k step (16). */
int spec_head_dim_padded(const fg_spec *spec);

/* The value head dim (V, O, dO, dV rows): head_dim_v, or head_dim where the
 * spec has 0; and rounded up to 16. */
int spec_head_dim_v(const fg_spec *spec);
int spec_head_dim_v_padded(const fg_spec *spec);

const char *spec_dtype_name(fg_dtype dtype);
const char *spec_mask_name(fg_mask mask);

#endif
