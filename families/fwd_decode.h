/* fwd_decode: decoding steps over a KV cache (spec.kv_cache), mma.sync, for
 * sm_75 and later (templates/kernel_fwd_decode.lua). A step reads every key
 * of the cache for a few queries, so it is bound by memory: the KV length
 * of each (sequence, KV head) is split over thread blocks, as many as keep
 * the whole GPU reading, and the query heads sharing a KV head are packed
 * into one block's rows (GQA), so K and V are read once per split.
 *
 * Planning: four warps share each key tile (Bc keys, a multiple of 16)
 * through a ring of cp.async stages; Q holds up to max_rows rows (16 per
 * warp). The largest Bc, then the most rows, then the most stages (up to 4)
 * that fit the shared memory twice per SM, else once; after the loop the
 * ring also holds each warp's O for the merge. The split count is the
 * call's (fg_forward_args.num_splits) or the one a cost model of the
 * step's reads takes least time for (kv_cache_splits), over the blocks an
 * SM holds and the rate their reads reach (shape_of). */
#ifndef FG_FWD_DECODE_H
#define FG_FWD_DECODE_H

#include "families/family.h"
#include "families/kv_cache_call.h"

/* The plan's figures, by name in the template:
 *   block_n          Bc: keys per tile
 *   max_rows         query rows one thread block holds at most
 *   stages           K/V tile pairs in the ring
 *   warps, threads   4 and 128
 *   head_dim_padded  head dim rounded up to 16 (Q, K); smem_row its shared
 *                    row (unpadded and swizzled where a multiple of 64)
 *   head_dim_v_padded, smem_row_v   the same of the value head dim (V, O)
 *   smem_bytes       Q, the larger of the ring and the merge, the tiles' pages
 *   blocks_per_sm    resident thread blocks the shared memory allows
 *   min_blocks       the blocks an SM its registers leave room for (the
 *                    kernels' launch bound)
 *   max_splits       DECODE_MAX_SPLITS
 *   combine_threads, combine_warp_splits   the combine kernel's
 *                    (COMBINE_THREADS, COMBINE_WARP_SPLITS)
 *   side             a warp's 16-key sub-tiles of a tile taken side by side
 *                    (2 for wide tiles of 128 keys and 16 rows, else 1) */
#define DECODE_PLAN_FIGURES(X)                                                        \
    X(block_n) X(max_rows) X(stages) X(warps) X(threads) X(head_dim_padded) X(smem_row) \
    X(head_dim_v_padded) X(smem_row_v) X(smem_bytes) X(blocks_per_sm) X(min_blocks)     \
    X(max_splits) X(combine_threads) X(combine_warp_splits) X(side) X(pair_at)

typedef struct fwd_decode_plan {
#define DECODE_PLAN_FIELD(name) int name;
    DECODE_PLAN_FIGURES(DECODE_PLAN_FIELD)
#undef DECODE_PLAN_FIELD
    char why[512];
} fwd_decode_plan;

/* A tiling named explicitly; text "block_n,max_rows,stages". */
typedef struct fwd_decode_tiling {
    int block_n, max_rows, stages;
} fwd_decode_tiling;

extern const kernel_family fwd_decode_family;

#endif
