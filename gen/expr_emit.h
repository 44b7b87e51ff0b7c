/* CUDA from expression trees (gen/expr.h): the device functions a spec's
 * score modifier and mask predicate compile to. Only the tree reaches the
 * output: variables and functions are printed from fixed tables, numbers
 * from their values, tensors by their index, so no text a user wrote is
 * ever compiled.
 *
 * The functions, each __forceinline__ and templated on the launch
 * arguments' struct P (lib_logits.lua defines fg_aux_read, fg_aux_add,
 * fg_imod, fg_ifloordiv and fg_ftoi, which they call):
 *   float fg_score_mod(const P& p, float s, int b, int h, int q, int k,
 *                      int seqlen_q, int seqlen_k)      t
 *   float fg_score_mod_ds(same)                         ∂t/∂s
 *   void  fg_score_mod_grad(float dt, const P& p, float s, int b, ...)
 *         adds dt·∂t/∂read into p.d_aux at each float tensor read's indices
 *   bool  fg_mask_mod(const P& p, int b, int h, int q, int k, int seqlen_q,
 *                     int seqlen_k)
 * and each split for tiles, where a thread holds a few rows, keys and
 * diagonals (W is score or mask; the costly terms of q alone, of k alone
 * and of q - k alone, computed once each):
 *   fg_W_row  fg_W_mod_row(const P& p, int b, int h, int q, int seqlen_q, int seqlen_k)
 *   fg_W_key  fg_W_mod_key(const P& p, int b, int h, int k, int seqlen_q, int seqlen_k)
 *   fg_W_diag fg_W_mod_diag(const P& p, int b, int h, int q, int k, int seqlen_q,
 *                           int seqlen_k)      any q, k of the diagonal
 *   float fg_score_mod_at(p, s, b, h, q, k, seqlen_q, seqlen_k, row, key, diag)
 *   bool  fg_mask_mod_at(p, b, h, q, k, seqlen_q, seqlen_k, row, key, diag)
 *         the value from the terms
 * Ints are 32-bit and wrap (computed as unsigned), '/' divides floats,
 * x % 0 and floordiv(x, 0) are 0, int() of a float goes toward zero,
 * where() evaluates both branches (reads outside a tensor give 0, so either
 * branch is safe). */
#ifndef FG_EXPR_EMIT_H
#define FG_EXPR_EMIT_H

#include <stddef.h>

#include "gen/expr.h"

typedef struct expr_source {
    char *text;     /* the device functions (malloc'ed; NULL when there is no expression) */
    int score_mod;  /* fg_score_mod and fg_score_mod_ds are defined */
    int aux_grad;   /* fg_score_mod_grad is defined: the score reads float tensors */
    int mask_mod;   /* fg_mask_mod is defined */
} expr_source;

/* The functions of a score tree and a mask tree (either NULL). Returns 0, or
 * -1 with err (out of memory, a malformed tree, a derivative too large). */
int expr_emit(const expr_tree *score, const expr_tree *mask, const expr_aux *aux,
              expr_source *out, char *err, size_t err_len);

void expr_source_free(expr_source *s);

#endif
