/* fp64 reference attention and the CPU twin of the kernels' dropout stream.
 * Used by the tests, the `flashgen check` command and the benchmark's checks. */
#ifndef FG_REFERENCE_H
#define FG_REFERENCE_H

#include <stddef.h>
#include <stdint.h>

#include "reference/expr_eval.h"
#include "reference/halfconv.h"

/* ---- dropout: Philox4x32-10, counter-based ----
 * key     k0 = seed & 0xffffffff, k1 = (seed >> 32) ^ (offset >> 32)
 * counter c0 = (j / 32) * 4 + (j % 8) / 2, c1 = (i / 16) * 8 + i % 8,
 *         c2 = (b << 16) | h, c3 = offset & 0xffffffff
 * value   v = ((i / 8) % 2) * 8 + ((j / 8) % 4) * 2 + j % 2;
 *         r = (out[v / 4] >> (8 * (v % 4))) & 0xff
 * keep    r >= threshold, threshold = min(256, round(p * 256))
 * scale   kept values are multiplied by 256 / (256 - threshold) (0 if all drop).
 * One Philox call serves the 16 elements that one tensor-core thread holds
 * in a 32-column stretch of a 16-row tile (rows i and i + 8). Requires
 * b < 65536 and h < 65536. */
void ref_philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]);
uint32_t ref_dropout_threshold(double p);
double ref_dropout_scale(uint32_t threshold);
int ref_dropout_keep(uint64_t seed, uint64_t offset, int b, int h, int64_t i, int64_t j,
                     uint32_t threshold);

/* ---- the problem ---- */
enum { REF_MASK_NONE = 0, REF_MASK_CAUSAL = 1, REF_MASK_WINDOW = 2 };
enum { REF_SPARSE_NONE = 0, REF_SPARSE_LAYOUT = 1, REF_SPARSE_BUTTERFLY = 2 };

typedef struct ref_problem {
    int batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim;
    int head_dim_v;        /* Dv, the width of v, o, dO and dV rows; 0: head_dim */
    double scale;          /* softmax scale */
    int mask;              /* REF_MASK_* */
    int64_t diag_offset;   /* key j is "on the diagonal" of query i when j == i + diag_offset:
                              Sk - Sq for bottom-right alignment, 0 for top-left */
    int window_left;       /* window: visible iff i+off-left <= j <= i+off+right; -1 unbounded */
    int window_right;      /* causal is left = -1, right = 0 */
    double dropout_p;      /* 0 disables */
    uint64_t seed, offset;
    int sparsity;          /* REF_SPARSE_* */
    int block_q, block_k;  /* sparse block sizes */
    const uint8_t *layout; /* (layout_heads, ceil(Sq/block_q), ceil(Sk/block_k)) 0/1 */
    int layout_heads;      /* 1 or heads_q */
    int layout_blocks_q;   /* the layout's blocks per row and column: 0 for those of */
    int layout_blocks_k;   /* seqlen_q and seqlen_k (a packed sequence's are its call's) */
    int butterfly_factors;
    int batch0;            /* dropout's batch index of batch 0: sequence b of a packed
                              call is a problem of one batch with batch0 = b */
    int64_t position_q;    /* dropout's position of query row 0 and of key 0: a block */
    int64_t position_k;    /* of a longer call (the mask's shift is in diag_offset) */
    /* Variants of the scores (fg_spec's softcap, alibi, sinks): with
     * s = scale·q·k, a visible key's logit is
     *   t = softcap·tanh(s/softcap) − slope·|i + diag_offset − j|
     * (the cap first, each term only when on), and a row's softmax
     * denominator gains exp(sinks[h]); its lse includes it, and a row with
     * no visible key then has o = 0 and lse = sinks[h]. */
    double softcap;              /* > 0: the cap; 0: none */
    const float *alibi_slopes;   /* NULL: none; the slope of batch b, head h is
                                    alibi_slopes[(batch0 + b) * alibi_stride_batch + h] */
    int64_t alibi_stride_batch;  /* 0: one slope per head */
    const float *sinks;          /* NULL: none; (heads_q) sink logits */
    /* User expressions (gen/expr.h's trees, evaluated by expr_eval.h in
     * fp64): at a key that the mask, sparsity and the mask predicate leave
     * visible, t = score_mod(s, b, h, q, k, seqlen_q, seqlen_k) is the logit,
     * with b = batch0 + b, q = i + position_q, k = j + position_k and the
     * problem's lengths; t = -inf hides the key as the mask does (P = 0, no
     * gradient). The mask predicate hides key j from query i where false.
     * A score modifier is refused (-1) beside softcap or ALiBi; sinks and
     * dropout combine with it. Its backward scales dS by dt/ds from dual
     * numbers through the tree. */
    const expr_tree *score_mod;  /* NULL: none; kind EXPR_SCORE */
    const expr_tree *mask_mod;   /* NULL: none; kind EXPR_MASK */
    const expr_aux *aux_decl;    /* the aux_count tensors the expressions read */
    const ref_aux *aux;
    int aux_count;
} ref_problem;

/* 1 if query i of batch b may attend key j for query head h: the mask,
 * sparsity and the mask predicate (not dropout, nor a score modifier's
 * -inf). A mask predicate that cannot be evaluated (malformed, or its
 * tensors) hides every key. */
int ref_visible_in(const ref_problem *p, int b, int h, int64_t i, int64_t j);

/* ref_visible_in of batch 0: every batch's unless a mask predicate reads b. */
int ref_visible(const ref_problem *p, int h, int64_t i, int64_t j);

/* Inputs in (B, H, S, D) contiguous float arrays (values already rounded to
 * the input dtype; v (B, Hkv, Sk, Dv)). Outputs: o (B, Hq, Sq, Dv) and lse
 * (B, Hq, Sq); either
 * may be NULL. A row with no visible key gives o = 0 and lse = -inf (the
 * sink, with sinks). The log-sum-exp is that of the logits t (the scaled
 * scores, with the variants on) before dropout, the sink's term included.
 * Returns 0, or -1 for an invalid problem (shapes, kinds, a missing layout)
 * or when memory ran out. */
int ref_attention_fp64(const ref_problem *p, const float *q, const float *k, const float *v,
                       double *o, double *lse);

/* The same computation done naively in the input precision (dtype 0 fp16,
 * 1 bf16), as a framework's math path would: S = Q·Kᵀ with fp32 accumulation
 * rounded to dtype, S·scale rounded to dtype, softmax in fp32 rounded to
 * dtype, O = P·V with fp32 accumulation rounded to dtype. The variants act
 * on the dtype S·scale in fp32 and are not rounded again (an fp32 bias
 * promotes the logits to fp32): u = x/cap, t = cap·tanhf(u), then
 * t − slope·dist; the sink, an fp32 parameter, is one more logit of the
 * fp32 softmax (its term summed after the keys') whose column is dropped.
 * A score modifier is evaluated in fp64 at s = that fp32 value and its t
 * rounded to fp32 (the mask predicate as in fp64).
 * Its error against fp64 is the yardstick. */
int ref_attention_lowp(const ref_problem *p, int dtype, const float *q, const float *k,
                       const float *v, float *o);

/* ---- backward ----
 * Gradients of O = dropout(softmax(t, masked))·V, t the logits of
 * scale·Q·Kᵀ (the variants on), given d_o = dL/dO
 * (B, Hq, Sq, Dv): dq (B, Hq, Sq, D), dk (B, Hkv, Sk, D) and dv
 * (B, Hkv, Sk, Dv); any output
 * may be NULL. With GQA / MQA, dk and dv of a kv head sum over the query
 * heads that share it. Dropout keeps exactly the elements the forward keeps
 * (same seed, offset, b, h, i, j), so these are the gradients of
 * ref_attention_fp64's output. A row with no visible key contributes nothing.
 * In fp64 with P the softmax over visible keys, Z the keep mask, s the
 * dropout scale: dV = (P∘Z·s)ᵀ·dO, dP = (dO·Vᵀ)∘Z·s, D_i = Σ_j P·dP
 * (= rowsum(dO∘O)), dS = P∘(dP − D) (w.r.t. t; times 1 − tanh²(s/softcap)
 * with a cap, ALiBi's bias changing nothing; times dt/ds with a score
 * modifier), dQ = scale·dS·K,
 * dK = scale·dSᵀ·Q. With sinks P excludes the sink's share, and D is still
 * rowsum(dO∘O).
 * Returns 0, or -1 for an invalid problem or when memory ran out. */
int ref_attention_backward_fp64(const ref_problem *p, const float *q, const float *k,
                                const float *v, const float *d_o, double *dq, double *dk,
                                double *dv);

/* The gradient of the sink logits (p->sinks, required): d_sinks (heads_q),
 * d_sinks[h] = −Σ_(b,i) exp(sinks[h] − lse_(b,h,i))·D_(b,h,i) with
 * D = rowsum(dO∘O) of the forward in fp64 (dropout included). Returns 0,
 * or -1 as the backward. */
int ref_sinks_backward_fp64(const ref_problem *p, const float *q, const float *k, const float *v,
                            const float *d_o, double *d_sinks);

/* The gradients of the float aux tensors that p->score_mod reads: for each
 * i < aux_count with d_aux[i] not NULL (int tensors' are skipped),
 * d_aux[i] (contiguous, row-major over aux i's sizes) gets
 * Σ dL/dt·∂t/∂x over every visible (b, h, i, j) and every read x of tensor
 * i in the score modifier, at the element that read names (reads outside
 * add nothing); dL/dt is the backward's dS w.r.t. the logits, ∂t/∂x comes
 * from dual numbers through the tree. No score modifier: zeros. Returns 0,
 * or -1 as the backward. */
int ref_aux_backward_fp64(const ref_problem *p, const float *q, const float *k, const float *v,
                          const float *d_o, double *const d_aux[]);

/* The same as a framework's autograd computes it through ref_attention_lowp's
 * graph in the input precision (dtype 0 fp16, 1 bf16): dO·Vᵀ, Pdᵀ·dO, dS·K
 * and dSᵀ·Q accumulate in fp32 and are rounded to dtype; dropout's backward,
 * the softmax backward (in fp32, from the unrounded fp32 softmax) and the
 * ·scale of dS are each rounded to dtype; with GQA dk and dv are the sum of
 * the per-query-head gradients, rounded. A score modifier's dt/ds (fp64
 * dual numbers at the forward's fp32 s, rounded to fp32) scales the fp32
 * softmax backward as the cap's 1 − th² does. Its error against fp64 is the
 * yardstick for the GPU backward. */
int ref_attention_backward_lowp(const ref_problem *p, int dtype, const float *q, const float *k,
                                const float *v, const float *d_o, float *dq, float *dk, float *dv);

/* ‖a − b‖₂ / ‖b‖₂ over n values (0 if both are zero). NaN in a gives NaN. */
double ref_rel_error(const double *a, const double *b, size_t n);
double ref_rel_error_f(const float *a, const double *b, size_t n);

#endif
