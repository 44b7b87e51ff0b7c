/* fwd_mla_sm90a: decoding steps over a latent cache on sm_90 with warpgroup
 * MMAs (templates/kernel_fwd_mla_sm90a.lua), where fwd_mla's mma.sync is
 * bound by the tensor cores at many query rows (heads x queries per KV
 * head). A thread block takes 64 query rows and two warpgroups; a
 * step is two 32-key tiles: each warpgroup computes the scores of one
 * (wgmma, Q and K from shared memory), the two exchange the rows' maxima
 * and P through shared memory, and each adds both tiles' P·V to its half of
 * O's columns (V read from the K tiles). The next step's tiles are in
 * flight meanwhile (cp.async into the 128-byte swizzled layout the wgmma
 * descriptors read, so any page size serves). The key length is split over
 * thread blocks as the decode family's (kv_cache_call.h). It serves every
 * call whose widths it takes, few query rows as well: at 16 heads it reads
 * the cache faster than fwd_mla's 32-row blocks (docs/decode-notes.md).
 *
 * Planning: one tiling (64 rows, tiles of 32 keys, four tile slots: the
 * step computed and the next); the head dim a multiple of 64 (the
 * swizzled boxes' width) and the value head dim of 128 (each warpgroup's
 * half of O whole boxes). */
#ifndef FG_FWD_MLA_SM90A_H
#define FG_FWD_MLA_SM90A_H

#include "families/family.h"
#include "families/kv_cache_call.h"

/* The plan's figures, by name in the template:
 *   block_n            keys per tile (32: one warpgroup's scores of a step)
 *   rows               query rows a thread block holds (64)
 *   stages             tile slots (4: a step's two and the next step's)
 *   warps, threads     8 and 256
 *   boxes              64-column boxes of a head-dim row
 *   half_boxes         boxes of a warpgroup's half of O's columns
 *   smem_bytes         Q, the slots, P and the rows' maxima
 *   max_splits         DECODE_MAX_SPLITS */
#define MLA_SM90A_PLAN_FIGURES(X)                                                      \
    X(block_n) X(rows) X(stages) X(warps) X(threads) X(boxes) X(half_boxes) X(smem_bytes) \
    X(max_splits)

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
