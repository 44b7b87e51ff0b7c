/* fwd_mla: decoding steps over a latent cache (spec.kv_cache FG_KV_LATENT,
 * multi-head latent attention), mma.sync, sm_75 and later
 * (templates/kernel_fwd_mla.lua). Each cached token is one row of the head
 * dim (DeepSeek's 576), read as the key, whose first value-head-dim
 * columns (512) are also its value; 16..128 query heads share it, so a
 * thread block takes 32 or 64 query rows and its eight warps split each key
 * tile's scores (16 keys a warp) and O's columns between the warps of a
 * row group, which exchange the rows' maxima and P through shared memory.
 * The key length is split over thread blocks as the decode family's
 * (kv_cache_call.h).
 *
 * Planning: 32 rows (four warps a row group, tiles of 64 keys) where two
 * stages fit, else 64 (two warps, 32 keys); the most stages (up to 4) of K
 * tiles that fit beside Q and P, twice per SM where they can, else once. */
#ifndef FG_FWD_MLA_H
#define FG_FWD_MLA_H

#include "families/family.h"
#include "families/kv_cache_call.h"

/* The plan's figures, by name in the template:
 *   block_n            Bc: keys per tile (16 per warp of a row group's)
 *   rows               query rows a thread block holds (32 or 64: 16 per row group)
 *   stages             K tiles in the ring
 *   warps, threads     8 and 256
 *   head_dim_padded    head dim rounded up to 16; smem_row its padded row
 *   head_dim_v_padded  the value head dim (a multiple of 32)
 *   p_row              elements per row of P in shared memory (padded)
 *   smem_bytes         Q, the ring, P, the row statistics, the tiles' pages
 *   blocks_per_sm      resident thread blocks the shared memory allows
 *   max_splits         DECODE_MAX_SPLITS
 *   combine_threads, combine_warp_splits   the combine kernel's
 *                      (COMBINE_THREADS, COMBINE_WARP_SPLITS) */
#define MLA_PLAN_FIGURES(X)                                                            \
    X(block_n) X(rows) X(stages) X(warps) X(threads) X(head_dim_padded) X(smem_row)     \
    X(head_dim_v_padded) X(p_row) X(smem_bytes) X(blocks_per_sm) X(max_splits)          \
    X(combine_threads) X(combine_warp_splits)

typedef struct fwd_mla_plan {
#define MLA_PLAN_FIELD(name) int name;
    MLA_PLAN_FIGURES(MLA_PLAN_FIELD)
#undef MLA_PLAN_FIELD
    char why[512];
} fwd_mla_plan;

/* A tiling named explicitly; text "rows,stages". */
typedef struct fwd_mla_tiling {
    int rows, stages;
} fwd_mla_tiling;

extern const kernel_family fwd_mla_family;

#endif
