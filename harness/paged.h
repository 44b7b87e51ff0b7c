/* A decoding step over a KV cache (spec.kv_cache): a batch of sequences
 * with their own cached lengths in a cache of seqlen_k rows per sequence,
 * contiguous (B, seqlen_k, Hkv, D|Dv) or a pool of pages handed out in a
 * shuffled order through a block table, optionally new rows the step
 * appends; each sequence checked as a problem of its own (its queries, its
 * cached keys then its new rows) against its fp64 reference with the bounds
 * of compare.h.
 *
 * Cache rows no sequence holds are NaN, and so are block table entries past
 * each sequence's keys (they point outside the pool): a kernel that reads
 * either shows. */
#ifndef FG_HARNESS_PAGED_H
#define FG_HARNESS_PAGED_H

#include <stddef.h>

#include "harness/compare.h"
#include "harness/problem.h"
#include "harness/random.h"

typedef struct fgh_paged {
    /* q, o and lse of the step, and in host.k, host.v (B, Hkv, seqlen_k, D|Dv)
       the keys each sequence sees: its cached ones, then its new rows; with
       no pages, p's k and v on the device are the cache */
    fgh_problem p;
    int *cached;                /* (batch): keys in the cache before the step */
    int seqlen_new;             /* rows each sequence appends */
    int page_size;              /* 0: a contiguous cache */
    int pages_per_seq, num_pages;
    int *table;                 /* (batch, pages_per_seq): the block table */
    fgh_buffer pool_k, pool_v;  /* (num_pages, page_size, Hkv, D), (..., Dv) */
    fgh_buffer d_table, d_cached;
    fgh_tensor k_new, v_new;    /* (B, seqlen_new, Hkv, D), (..., Dv) */
} fgh_paged;

/* Sizes and host inputs (not filled: the caller fills k->p.host). shape
 * gives batch, heads, the queries per sequence (seqlen_q), the rows a
 * sequence may hold (seqlen_k), mask alignment, window and scale. 1, or 0
 * with the message; free it either way. */
int fgh_paged_init(fgh_paged *k, const fg_spec *spec, const fgh_shape *shape, const int *cached,
                   int seqlen_new, int page_size, const fgh_placement *place);
/* The step's tensors, the cache as the step finds it (pages shuffled by
 * rng), the new rows and the arrays on the device. */
int fgh_paged_upload(const fgh_device *d, fgh_paged *k, fgh_rng *rng);
void fgh_paged_free(const fgh_device *d, fgh_paged *k);

/* The step with `splits` (0: chosen by the library). */
fg_forward_args fgh_paged_forward_args(const fgh_paged *k, int splits);

/* Keys sequence b sees: its cached ones and the new rows. */
int fgh_paged_keys(const fgh_paged *k, int b);

/* Sequence b's O (of (B, Hq, Sq, Dv)) and lse (of (B, Hq, Sq)) against its
 * own reference (fgh_check_forward: a sequence that sees no key must give O
 * exactly 0 and lse -inf). 1, or 0 with the message. */
int fgh_paged_check_forward(const fgh_paged *k, int b, const double *o, const float *lse,
                            fgh_forward_check *r);

/* Reads the cache back: *differ counts the appended values that are not
 * the new rows bit for bit. 1, or 0 with the message. */
int fgh_paged_appended(const fgh_device *d, fgh_paged *k, size_t *differ);

/* A block table (batch, pages_per_seq) of pages of page_size rows handed
 * out in a shuffled order: sequence b holds ceil(keys[b] / page_size)
 * pages, and its entries past them point outside the pool (num_pages +
 * 1000 + i). The pool has those pages and `spare` more that no sequence
 * holds: its size is returned, or -1 with the message. */
int fgh_page_table(fgh_rng *rng, int batch, const int *keys, int page_size, int pages_per_seq,
                   int spare, int *table);

#endif
