/* Launch arguments of the forward kernel. templates/lib_device.lua emits
 * the same struct; keep the two in the same order (8-byte fields first). */
#ifndef FG_KERNEL_PARAMS_H
#define FG_KERNEL_PARAMS_H

#include <stdint.h>

typedef struct fg_fwd_params {
    uint64_t q, k, v, o, lse;
    uint64_t block_count, block_index;
    int64_t q_sb, q_ss, q_sh;
    int64_t k_sb, k_ss, k_sh;
    int64_t v_sb, v_ss, v_sh;
    int64_t o_sb, o_ss, o_sh;
    uint64_t seed, offset;
    int32_t batch, heads_q, heads_kv, seqlen_q, seqlen_k;
    int32_t diag_offset;
    int32_t window_left, window_right;
    float scale_log2;
    float softmax_scale;
    uint32_t drop_threshold4;
    float out_scale;
    int32_t layout_heads, layout_blocks_q, layout_blocks_k;
    int32_t num_m_blocks;
    uint32_t philox_keys[20]; /* round keys (k0, k1) x 10 of the dropout stream */
} fg_fwd_params;

_Static_assert(sizeof(fg_fwd_params) == 312, "fg_fwd_params layout changed: update the template");

/* Launch arguments of the three backward kernels (templates/lib_device.lua,
 * backward_params: same order). */
typedef struct fg_bwd_params {
    uint64_t q, k, v, o, d_o, dq, dk, dv;
    uint64_t lse, delta, dq_accum;
    uint64_t query_count, query_index;
    int64_t q_sb, q_ss, q_sh;
    int64_t k_sb, k_ss, k_sh;
    int64_t v_sb, v_ss, v_sh;
    int64_t o_sb, o_ss, o_sh;
    int64_t do_sb, do_ss, do_sh;
    int64_t dq_sb, dq_ss, dq_sh;
    int64_t dk_sb, dk_ss, dk_sh;
    int64_t dv_sb, dv_ss, dv_sh;
    int64_t dq_slice;
    uint64_t seed, offset;
    int32_t batch, heads_q, heads_kv, seqlen_q, seqlen_k;
    int32_t diag_offset;
    int32_t window_left, window_right;
    float scale_log2;
    float softmax_scale;
    uint32_t drop_threshold4;
    float out_scale;
    int32_t layout_heads, layout_blocks_q, layout_blocks_k;
    int32_t num_n_blocks;
    int32_t n_groups;
    int32_t dq_slices;
    uint32_t philox_keys[20];
} fg_bwd_params;

_Static_assert(sizeof(fg_bwd_params) == 472, "fg_bwd_params layout changed: update the template");

#endif
