/* fwd_mla_sm90a: decoding steps over a latent cache on sm_90 with warpgroup
 * MMAs (templates/kernel_fwd_mla_sm90a.lua), where fwd_mla's mma.sync is
 * bound by the tensor cores at many query rows (heads x queries per KV
 * head). A thread block takes 64 query rows, key tiles of 64 in two slots,
 * and two warpgroups, each with half of O's columns: the S warpgroup
 * computes a tile's scores (wgmma, Q and K from shared memory) and its
 * softmax and writes P into the slot's last box, past V's columns; the V
 * warpgroup copies the tiles in (into the 128-byte swizzled layout the wgmma
 * descriptors read: bulk tensor copies through a map of the cache where its
 * pages hold a multiple of 8 rows or it has none, else cp.async, so any page
 * size serves) and adds P·V to its half while the S warpgroup goes on to the
 * next tile. The key length is split over thread blocks as the decode
 * family's (kv_cache_call.h). It serves every call whose widths it takes.
 * Calls of at most 16 query rows a KV head (16 heads, one query) take a
 * second kernel instead, of 16 rows a block, whose products are transposed
 * (Sᵀ = K·Qᵀ, Oᵀ += Vᵀ·Pᵀ: the keys and O's columns along the MMAs' 64
 * rows), so that its MMAs hold no empty rows and a block reads its tiles at
 * the memory's pace (docs/decode-notes.md).
 *
 * Planning: one tiling (64 rows, tiles of 64 keys, two slots); the head dim
 * a multiple of 64 (the swizzled boxes' width) with a box past the value
 * head dim (P's), which is a multiple of 128 (each warpgroup's half of O
 * whole boxes). */
#ifndef FG_FWD_MLA_SM90A_H
#define FG_FWD_MLA_SM90A_H

#include "families/family.h"
#include "families/kv_cache_call.h"

/* The plan's figures, by name in the template:
 *   block_n            keys per tile (64: P's rows fill a box)
 *   rows               query rows a thread block holds (64)
 *   stages             tile slots (2)
 *   warps, threads     8 and 256
 *   boxes              64-column boxes of a head-dim row
 *   half_boxes         boxes of a warpgroup's half of O's columns
 *   smem_bytes         Q, the slots, the rows' factors and sums, the barriers
 *   narrow             query rows of the narrow kernel's blocks (16)
 *   narrow_smem_bytes  its Q, slots, P, the rows' maxima and sums, barriers
 *   max_splits         DECODE_MAX_SPLITS
 *   combine_threads, combine_warp_splits   the combine kernel's
 *                      (COMBINE_THREADS, COMBINE_WARP_SPLITS) */
#define MLA_SM90A_PLAN_FIGURES(X)                                                      \
    X(block_n) X(rows) X(stages) X(warps) X(threads) X(boxes) X(half_boxes) X(smem_bytes) \
    X(narrow) X(narrow_smem_bytes) X(max_splits) X(combine_threads) X(combine_warp_splits)

typedef struct fwd_mla_sm90a_plan {
#define MLA_SM90A_PLAN_FIELD(name) int name;
    MLA_SM90A_PLAN_FIGURES(MLA_SM90A_PLAN_FIELD)
#undef MLA_SM90A_PLAN_FIELD
    char why[512];
} fwd_mla_sm90a_plan;

/* The one tiling, as text "64" (the rows). */
typedef struct fwd_mla_sm90a_tiling {
    int rows;
} fwd_mla_sm90a_tiling;

extern const kernel_family fwd_mla_sm90a_family;

#endif
