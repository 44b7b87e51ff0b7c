/* A decoding step's call shape, shared by the families that take one
 * (fwd_decode, fwd_mla): the split count, the split workspace's parts and
 * the launch arguments (fg_decode_params), from the figures of the
 * family's plan and its row blocks. */
#ifndef FG_KV_CACHE_CALL_H
#define FG_KV_CACHE_CALL_H

#include <stddef.h>

#include "families/family.h"
#include "gen/kernel_params.h"

#define DECODE_MAX_SPLITS 128

/* What the shared code reads of a family's plan and the call's rows. */
typedef struct kv_cache_shape {
    int block_n;           /* keys per tile */
    int wave_per_sm;       /* thread blocks per SM that make a full wave of splits */
    int head_dim_v_padded; /* the split parts' O columns */
    int warps_m;           /* warps along a row block's rows */
    int row_blocks;        /* row blocks per (sequence, KV head) */
} kv_cache_shape;

/* The split count of a call (num_splits as given, else chosen): without
 * num_splits one split when the blocks already fill the GPU (80%), else the
 * fewest splits whose last wave is at least 95% as full as the best count's
 * (at most one per key tile, DECODE_MAX_SPLITS). */
int kv_cache_splits(const kv_cache_shape *shape, const fg_forward_args *a, const fg_profile *prof);

/* The workspace a call needs (0 with one split). */
size_t kv_cache_workspace(const kv_cache_shape *shape, const fg_forward_args *a,
                          const fg_profile *prof);

/* The launch arguments of a call into out (ws: the workspace's address). */
void kv_cache_arguments(const kv_cache_shape *shape, const fg_spec *spec, const family_call *call,
                        const fg_profile *prof, uint64_t ws, family_args *out);

#endif
