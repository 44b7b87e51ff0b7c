/* A packed batch (spec.varlen): sequences of their own lengths one after the
 * other along the sequence dimension of (total, H, D) tensors, and each
 * sequence checked as a problem of its own (one batch, its lengths,
 * dropout's batch index b, the call's layout blocks) against its fp64
 * reference with the bounds of compare.h. */
#ifndef FG_HARNESS_PACKED_H
#define FG_HARNESS_PACKED_H

#include <stddef.h>

#include "harness/compare.h"
#include "harness/problem.h"

/* The sequences of a packed call. */
typedef struct fgh_lengths {
    int batch;
    const int *len_q, *len_k; /* (batch): rows of each sequence */
    const int *used_k;        /* (batch): keys each sees (seqused_k), or NULL: all */
    int tail_q, tail_k;       /* rows after the last sequence */
} fgh_lengths;

typedef struct fgh_packed {
    /* one batch of total_q query and total_k key rows holds the packed
       tensors: host inputs (1, H, total, D; v and dO Dv), lse (1, Hq, total_q) */
    fgh_problem p;
    int batch;
    int *cu_q, *cu_k;             /* (batch + 1): first row of each sequence, then the end */
    int *used;                    /* (batch): keys each sequence sees */
    int has_used;                 /* seqused_k is passed */
    int total_q, total_k;         /* rows of the packed tensors */
    int max_q, max_k;             /* the longest sequence's rows */
    fgh_buffer d_cu_q, d_cu_k, d_used;
} fgh_packed;

/* Sizes and host inputs (not filled: the caller fills k->p.host and, for
 * FG_SPARSE_LAYOUT, sets a layout of k->p.blocks_q x blocks_k, the blocks of
 * the longest sequences). shape gives heads, mask alignment, window, scale,
 * dropout and the variants' (ALiBi's slopes per batch are one row per
 * sequence); its batch and lengths are the packing's. 1, or 0 with the
 * message; free it either way. */
int fgh_packed_init(fgh_packed *k, const fg_spec *spec, const fgh_shape *shape,
                    const fgh_lengths *lengths, const fgh_placement *place, int grads);
/* The problem's tensors and the arrays on the device. The rows of the host
 * inputs that no result may depend on are NaN first: keys and values past
 * what each sequence sees and after the last sequence, queries and dO after
 * the last sequence. */
int fgh_packed_upload(const fgh_device *d, fgh_packed *k);
void fgh_packed_free(const fgh_device *d, fgh_packed *k);

fg_forward_args fgh_packed_forward_args(const fgh_packed *k);
fg_backward_args fgh_packed_backward_args(const fgh_packed *k, int deterministic);

/* Sequence b's rows of the packed O (1, Hq, total_q, Dv) and lse (Hq,
 * total_q) against its own reference (fgh_check_forward: a sequence that
 * sees no key must give O exactly 0 and lse -inf). 1, or 0 with the message. */
int fgh_packed_check_forward(const fgh_packed *k, int b, const double *o, const float *lse,
                             fgh_forward_check *r);

/* The fp64 gradients of each sequence that has queries and keys. */
typedef struct fgh_packed_expect {
    int batch;
    int *have;               /* (batch): sequence b's gradients are checked */
    fgh_backward_expect *e;  /* (batch) */
} fgh_packed_expect;

/* 1, or 0 with the message; free it either way. */
int fgh_packed_expect_backward(const fgh_packed *k, fgh_packed_expect *x);
void fgh_packed_expect_free(fgh_packed_expect *x);

/* With spec.sinks: the sinks' gradient of the packed call, the sum of each
 * sequence's, and its bounds (compare.h); o (1, Hq, total_q, Dv) and lse
 * (Hq, total_q), the forward's outputs read back, or NULL (see
 * fgh_expect_sinks_add). 1, or 0 with the message; free it with
 * fgh_sinks_expect_free either way. */
int fgh_packed_expect_sinks(const fgh_packed *k, const double *o, const float *lse,
                            fgh_sinks_expect *e);

/* Gradient values of g (dQ, dK, dV: (1, H, total, D or Dv)) that are not 0 in
 * rows no query or key sees: dQ rows after the last sequence and of
 * sequences that see no key; dK and dV rows past seqused_k, of sequences
 * without queries, and after the last sequence. */
size_t fgh_packed_unseen_nonzero(const fgh_packed *k, double *const g[FGH_GRADS]);

/* Sequence b's rows of g against x: err[] and *pass (1, with nothing
 * checked, for a sequence x has no gradients of). 1, or 0 with the message. */
int fgh_packed_check_backward(const fgh_packed *k, const fgh_packed_expect *x, int b,
                              double *const g[FGH_GRADS], double err[FGH_GRADS], int *pass);

#endif
