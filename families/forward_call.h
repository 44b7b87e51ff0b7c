/* The launch arguments every family takes from the forward call: tensors and
 * strides, shapes, the softmax scale, the mask's diagonal and window, and
 * the dropout stream. Both launch-argument structs name these fields alike
 * (gen/kernel_params.h), so one macro fills either. */
#ifndef FG_FORWARD_CALL_H
#define FG_FORWARD_CALL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "flashgen.h"

/* The values derived from a call rather than copied. */
typedef struct forward_call_values {
    int32_t diag_offset;      /* key j is on query i's diagonal when j == i + diag_offset */
    float softmax_scale;
    float scale_log2;         /* softmax_scale * log2(e) */
    uint32_t drop_threshold4; /* the 8-bit threshold in every byte: keep iff draw >= it */
    float out_scale;          /* 1/(1-p) for the threshold used; 1 without dropout */
    uint32_t drop_row_counter; /* Philox counter word 1's part from position_q */
    uint32_t drop_key_counter; /* word 0's part from position_k */
    uint32_t philox_keys[20]; /* the dropout stream's round keys */
    float softcap_in;         /* softmax_scale / cap (spec.softcap), else 0 */
    float softcap_out;        /* cap * log2(e) */
    int32_t window_left;      /* the window's sides, -1 unbounded, at most the call's reach */
    int32_t window_right;
} forward_call_values;

void forward_call_values_of(const fg_spec *canonical, const fg_forward_args *a,
                            forward_call_values *out);

/* The call's diagonal: top-left, or bottom-right (Sk - Sq), moved by its
 * positions; as the kernels take it (check_forward_args keeps the sum in
 * range). */
static inline int64_t forward_call_diag(const fg_forward_args *a) {
    return (a->align == FG_ALIGN_TOP_LEFT ? 0 : (int64_t)a->seqlen_k - a->seqlen_q) + a->position_q -
           a->position_k;
}
static inline int32_t forward_call_diag_offset(const fg_forward_args *a) {
    return (int32_t)forward_call_diag(a);
}

/* The farthest a key of a call's tiles can be from a query's diagonal: the
 * lengths (the longest, where sequences are packed or cached) and the
 * diagonal's offset, and a tile (256) past the ends. A window's side at
 * least this wide bounds nothing, so the kernels take it clamped to this,
 * and check_forward_args keeps it within what their 32-bit distances,
 * and a side added to one, can hold. */
static inline int64_t forward_call_reach(const fg_forward_args *a) {
    const int64_t diag = forward_call_diag(a);
    const int64_t below = a->seqlen_q + (diag > 0 ? diag : 0), above = a->seqlen_k + (diag < 0 ? -diag : 0);
    return (below > above ? below : above) + 256;
}

/* Rows of a call's row statistics (lse, D) and of the backward's dQ
 * accumulator: (B, Hq, Sq), or (Hq, total_q) for packed sequences. */
static inline size_t forward_call_rows(const fg_spec *spec, const fg_forward_args *a) {
    return spec->varlen ? (size_t)a->heads_q * (size_t)a->total_q
                        : (size_t)a->batch * a->heads_q * a->seqlen_q;
}

/* A tensor's batch, sequence and head strides into three params fields. */
static inline void tensor_strides(const fg_tensor *t, int64_t *sb, int64_t *ss, int64_t *sh) {
    *sb = t->stride_batch, *ss = t->stride_seq, *sh = t->stride_head;
}

/* The aux tensors' fields: addresses, and per tensor three strides and
 * sizes (check_forward_args keeps the sizes within int32). */
static inline void set_aux_params(const fg_forward_args *a, uint64_t data[8], int64_t stride[24],
                                  int32_t size[24]) {
    for (int t = 0; t < FG_MAX_AUX; t++) {
        data[t] = (uint64_t)(uintptr_t)a->aux[t].data;
        for (int d = 0; d < 3; d++) {
            stride[3 * t + d] = a->aux[t].stride[d];
            size[3 * t + d] = (int32_t)a->aux[t].size[d];
        }
    }
}

/* Set the fields a launch-argument struct `p` takes from forward call `f`
 * with its derived values `lv` and layout shape `l` (family_layout; its lists
 * are each family's own: they differ per pass). */
#define SET_FORWARD_CALL_PARAMS(p, f, lv, l)                                       \
    do {                                                                           \
        (p).q = (uint64_t)(uintptr_t)(f)->q.data;                                  \
        (p).k = (uint64_t)(uintptr_t)(f)->k.data;                                  \
        (p).v = (uint64_t)(uintptr_t)(f)->v.data;                                  \
        (p).o = (uint64_t)(uintptr_t)(f)->o.data;                                  \
        (p).lse = (uint64_t)(uintptr_t)(f)->lse;                                   \
        tensor_strides(&(f)->q, &(p).q_sb, &(p).q_ss, &(p).q_sh);                  \
        tensor_strides(&(f)->k, &(p).k_sb, &(p).k_ss, &(p).k_sh);                  \
        tensor_strides(&(f)->v, &(p).v_sb, &(p).v_ss, &(p).v_sh);                  \
        tensor_strides(&(f)->o, &(p).o_sb, &(p).o_ss, &(p).o_sh);                  \
        (p).seed = (f)->seed, (p).offset = (f)->offset;                            \
        (p).cu_seqlens_q = (uint64_t)(uintptr_t)(f)->cu_seqlens_q;                 \
        (p).cu_seqlens_k = (uint64_t)(uintptr_t)(f)->cu_seqlens_k;                 \
        (p).seqused_k = (uint64_t)(uintptr_t)(f)->seqused_k;                       \
        (p).total_q = (f)->total_q, (p).total_k = (f)->total_k;                    \
        (p).align_bottom_right = (f)->align == FG_ALIGN_BOTTOM_RIGHT;              \
        (p).batch = (f)->batch, (p).heads_q = (f)->heads_q;                        \
        (p).heads_kv = (f)->heads_kv;                                              \
        (p).seqlen_q = (f)->seqlen_q, (p).seqlen_k = (f)->seqlen_k;                \
        (p).diag_offset = (lv).diag_offset;                                        \
        (p).window_left = (lv).window_left, (p).window_right = (lv).window_right;  \
        (p).softmax_scale = (lv).softmax_scale, (p).scale_log2 = (lv).scale_log2;  \
        (p).drop_threshold4 = (lv).drop_threshold4;                                \
        (p).out_scale = (lv).out_scale;                                            \
        (p).drop_row_counter = (lv).drop_row_counter;                              \
        (p).drop_key_counter = (lv).drop_key_counter;                              \
        memcpy((p).philox_keys, (lv).philox_keys, sizeof (p).philox_keys);         \
        (p).layout_batch = (l).batch;                                              \
        (p).layout_heads = (l).heads;                                              \
        (p).layout_blocks_q = (l).blocks_q;                                        \
        (p).layout_blocks_k = (l).blocks_k;                                        \
        (p).alibi_slopes = (uint64_t)(uintptr_t)(f)->alibi_slopes;                 \
        (p).alibi_sb = (f)->alibi_stride_batch;                                    \
        (p).sinks = (uint64_t)(uintptr_t)(f)->sinks;                               \
        (p).softcap_in = (lv).softcap_in, (p).softcap_out = (lv).softcap_out;      \
        set_aux_params((f), (p).aux_data, (p).aux_stride, (p).aux_size);          \
        (p).pos_q = (int32_t)(f)->position_q, (p).pos_k = (int32_t)(f)->position_k; \
    } while (0)

/* The backward's fields of `p` (fg_bwd_params or fg_bwd_tma_params) for
 * family_call `c` of canonical spec `spec`: the gradients' tensors and
 * strides, the forward call's fields, and D and the dQ accumulator at
 * device addresses `delta` and `dq_accum` (the workspace's parts). */
#define SET_BACKWARD_PARAMS(p, spec, c, delta_at, dq_accum_at)                     \
    do {                                                                           \
        const fg_backward_args *ba_ = (c)->backward;                               \
        forward_call_values fv_;                                                   \
        forward_call_values_of(spec, (c)->forward, &fv_);                          \
        SET_FORWARD_CALL_PARAMS(p, (c)->forward, fv_, (c)->layout);                \
        (p).d_o = (uint64_t)(uintptr_t)ba_->d_o.data;                              \
        (p).dq = (uint64_t)(uintptr_t)ba_->d_q.data;                               \
        (p).dk = (uint64_t)(uintptr_t)ba_->d_k.data;                               \
        (p).dv = (uint64_t)(uintptr_t)ba_->d_v.data;                               \
        tensor_strides(&ba_->d_o, &(p).do_sb, &(p).do_ss, &(p).do_sh);             \
        tensor_strides(&ba_->d_q, &(p).dq_sb, &(p).dq_ss, &(p).dq_sh);             \
        tensor_strides(&ba_->d_k, &(p).dk_sb, &(p).dk_ss, &(p).dk_sh);             \
        tensor_strides(&ba_->d_v, &(p).dv_sb, &(p).dv_ss, &(p).dv_sh);             \
        (p).delta = (delta_at);                                                    \
        (p).sequences = (c)->forward->batch + ((spec)->varlen ? 1 : 0);            \
        (p).dq_accum = (dq_accum_at);                                              \
        (p).d_sinks = (uint64_t)(uintptr_t)ba_->d_sinks;                           \
        for (int t_ = 0; t_ < FG_MAX_AUX; t_++)                                    \
            (p).d_aux[t_] = (uint64_t)(uintptr_t)ba_->d_aux[t_];                   \
    } while (0)

/* The forward's fields of `p` (fg_fwd_params or fg_fwd_tma_params) for
 * family_call `c` of canonical spec `spec`, block_m query rows per thread
 * block: the forward call's, the layout's kept key blocks per query block,
 * and num_m_blocks. */
#define SET_FORWARD_PARAMS(p, spec, c, block_m)                                    \
    do {                                                                           \
        forward_call_values fv_;                                                   \
        forward_call_values_of(spec, (c)->forward, &fv_);                          \
        SET_FORWARD_CALL_PARAMS(p, (c)->forward, fv_, (c)->layout);                \
        (p).block_count = (c)->layout.counts;                                      \
        (p).block_index = (c)->layout.indices;                                     \
        (p).num_m_blocks = ((c)->forward->seqlen_q + (block_m) - 1) / (block_m);   \
    } while (0)

#endif
