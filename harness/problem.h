/* One attention problem: a spec, its launch arguments, host inputs and the
 * device tensors of a forward (q, k, v, o, lse) and, with gradients, of a
 * backward (dO, dQ, dK, dV), the block layout of a layout-sparse spec, and
 * the values of the scores' variants (ALiBi's slopes, the sinks and, with
 * gradients, the sinks' gradient). */
#ifndef FG_HARNESS_PROBLEM_H
#define FG_HARNESS_PROBLEM_H

#include <stddef.h>
#include <stdint.h>

#include "flashgen.h"
#include "gen/expr.h"
#include "harness/buffer.h"
#include "harness/device.h"
#include "harness/tensor.h"
#include "reference/reference.h"

/* The launch side of a problem. */
typedef struct fgh_shape {
    int batch, heads_q, heads_kv, seqlen_q, seqlen_k;
    fg_causal_align align;
    int window_left, window_right; /* -1 unbounded; anything else needs FG_MASK_WINDOW */
    float scale;                   /* 0: 1/sqrt(d) */
    float dropout_p;
    uint64_t seed, offset;         /* dropout's Philox stream */
    int batch0;                    /* dropout's batch index of batch 0: a packed call's
                                      sequence b checked as a problem of its own has b */
    int64_t position_q, position_k; /* a block of a longer call (fg_forward_args') */
    float softcap;                 /* the cap, with spec.softcap */
    int alibi_per_batch;           /* with spec.alibi: slopes (B, Hq) rather than (Hq) */
    int64_t aux_size[FG_MAX_AUX][3]; /* spec.aux: each tensor's sizes (its rank's first) */
} fgh_shape;

/* D is spec.head_dim (q, k, dQ, dK), Dv the value head dim (v, o, dO, dV:
 * spec.head_dim_v, or D where that is 0). */
typedef struct fgh_problem {
    fg_spec spec;
    fgh_shape shape;
    fgh_placement place;
    int grads;           /* with dO, dQ, dK, dV */
    int head_dim_v;      /* Dv */
    size_t nq, nk, rows; /* elements of q (dQ) and k (dK); rows of lse */
    size_t no, nv;       /* elements of o (dO) and v (dV): nq and nk where Dv = D */
    struct {
        float *q, *k, *v; /* (B,H,S,D), v (B,H,S,Dv), rounded to the dtype: the caller fills them */
        float *d_o;       /* like o, (B,Hq,Sq,Dv); with grads */
        /* spec.alibi: (alibi_rows, Hq), row b the slopes of batch b; spec.sinks:
           (Hq). Filled with defaults that bind (fgh_problem_init); the caller
           may overwrite them before the upload. */
        float *alibi_slopes, *sinks;
        /* spec.aux: tensor t, contiguous over shape.aux_size[t], float or
           int32 as declared; zero-filled: the caller fills them */
        void *aux[FG_MAX_AUX];
    } host;
    size_t aux_elems[FG_MAX_AUX]; /* elements of each aux tensor */
    expr_tree *exprs;             /* spec.score_mod's tree, then mask_mod's (2 trees) */
    expr_aux expr_decl[FG_MAX_AUX];
    ref_aux aux_ref[FG_MAX_AUX];  /* host.aux as the reference reads them */
    int alibi_rows;       /* rows of host.alibi_slopes: B per batch, else 1 */
    uint8_t *layout_mask; /* FG_SPARSE_LAYOUT: (layout_heads, blocks_q, blocks_k) 0/1 */
    int layout_heads, blocks_q, blocks_k; /* blocks: of any sparse spec */
    fg_layout *layout;
    fg_context *block_mask_ctx; /* fgh_problem_use_block_mask's: the upload builds it */
    fgh_tensor q, o, d_o, d_q; /* (B,Sq,Hq,D) or (B,Hq,Sq,D), as place.order says (o, d_o: Dv) */
    fgh_tensor k, v, d_k, d_v; /* (B,Sk,Hkv,D) or (B,Hkv,Sk,D) (v, d_v: Dv) */
    fgh_buffer lse;            /* (B,Hq,Sq) fp32, between zones as the tensors */
    fgh_buffer alibi_slopes;   /* spec.alibi: host.alibi_slopes on the device */
    fgh_buffer sinks;          /* spec.sinks: host.sinks on the device */
    fgh_buffer d_sinks;        /* spec.sinks with grads: (Hq) fp32, poisoned */
    fgh_buffer aux[FG_MAX_AUX];   /* host.aux on the device */
    fgh_buffer d_aux[FG_MAX_AUX]; /* with grads and a score_mod: float tensors' gradients */
} fgh_problem;

/* The default variant values: ALiBi's geometric slopes 2^(-8(h+1)/Hq),
 * times 1 + b/4 in batch row b when per batch, and sinks 0.5 + (h % 4):
 * logits of the scores' size, so that both bind. */
float fgh_default_slope(int b, int h, int heads_q);
float fgh_default_sink(int h);

/* Sizes and host inputs (not filled; the variants' values filled with the
 * defaults). 1, or 0 with the message; free the problem either way. */
int fgh_problem_init(fgh_problem *p, const fg_spec *spec, const fgh_shape *shape,
                     const fgh_placement *place, int grads);
/* spec.alibi per batch: host.alibi_slopes made (rows, Hq), filled with the
 * defaults, for a call whose batch is not shape.batch (a packed call's
 * sequences). Before the upload; 1, or 0 with the message. */
int fgh_problem_alibi_rows(fgh_problem *p, int rows);
/* Takes mask (malloc'ed, freed with the problem) as the problem's layout,
 * `heads` of 1 or heads_q, and creates its fg_layout. 0 with the context's
 * message on failure. */
int fgh_problem_set_layout(fgh_problem *p, fg_context *ctx, uint8_t *mask, int heads);
/* A block mask for a layout spec with a mask predicate: the upload builds
 * the layout from the predicate (fg_block_mask_create) once the aux tensors
 * are on the device; the reference keeps every block (the predicate alone
 * decides). 1, or 0 with the message. */
int fgh_problem_use_block_mask(fgh_problem *p, fg_context *ctx);
/* Allocates the device tensors (outputs poisoned) and uploads the inputs
 * (and builds the block mask, fgh_problem_use_block_mask). */
int fgh_problem_upload(const fgh_device *d, fgh_problem *p);
/* Poisons dQ, dK, dV and d_sinks again, before a backward. */
int fgh_problem_poison_grads(const fgh_device *d, fgh_problem *p);
/* Downloads dQ, dK and dV into x[0..2] (B,H,S,D; dV's Dv) and what each showed into w[0..2]. */
int fgh_problem_take_grads(const fgh_device *d, fgh_problem *p, double *const x[3],
                           fgh_written w[3]);
/* Downloads d_sinks (spec.sinks with grads) into out (Hq); a value the
 * backward did not write stays NaN (the poison). 1, or 0 with the message. */
int fgh_problem_take_d_sinks(const fgh_device *d, fgh_problem *p, double *out);
/* Downloads aux tensor t's gradient (spec.score_mod, a float tensor, with
 * grads) into out (its elements); a value not written stays NaN. 1, or 0
 * with the message. */
int fgh_problem_take_d_aux(const fgh_device *d, fgh_problem *p, int t, double *out);
void fgh_problem_free(const fgh_device *d, fgh_problem *p);

/* The forward call on the device tensors; lse NULL unless with_lse. The
 * variants' values are the spec's: the cap, the device slopes (stride Hq
 * per batch, else 0) and sinks, and none without them. */
fg_forward_args fgh_forward_args(const fgh_problem *p, int with_lse);
/* The backward of the forward call with lse; d_sinks with spec.sinks. */
fg_backward_args fgh_backward_args(const fgh_problem *p, int deterministic);
/* The same problem for reference/ (the layout, slopes and sinks stay the
 * problem's host arrays). ALiBi's row of batch b is batch0 + b: a problem
 * with batch0 != 0 and slopes per batch borrows its call's slopes. */
ref_problem fgh_reference_problem(const fgh_problem *p);
/* 2·B·Hq·Sq·Sk·(D + Dv), halved for causal: the FLOPs of a forward. */
double fgh_problem_flops(const fgh_problem *p);

#endif
