/* Launch arguments: the structs the host fills and the kernels read, defined
 * once here. Each list below makes the C struct the runtime fills and, through
 * kernel_params_source, the CUDA struct the templates compile in, followed by
 * static_asserts that its size and every field's offset are the host's, so
 * the two sides can never drift apart unseen.
 *
 * A list calls F(type, name) for a field and A(type, name, count) for an
 * array; types are the device's names (u64, i64, int, u32, float, and tmap:
 * a TMA tensor map, 128 opaque bytes aligned to 64, which the kernel reads
 * in place as a __grid_constant__ parameter). */
#ifndef FG_KERNEL_PARAMS_H
#define FG_KERNEL_PARAMS_H

#include <stddef.h>
#include <stdint.h>

typedef uint64_t kp_u64;
typedef int64_t kp_i64;
typedef int32_t kp_int;
typedef uint32_t kp_u32;
typedef float kp_float;
typedef struct kp_tmap {
    _Alignas(64) uint64_t opaque[16];
} kp_tmap;

/* Fields both passes take from the forward call, in both structs' order:
 * strides in elements (batch, sequence, head); diag_offset puts key
 * i + diag_offset on query i's diagonal; window sizes -1 for unbounded;
 * scale_log2 = softmax scale * log2(e); drop_threshold4 is the dropout's
 * 8-bit threshold in every byte; out_scale 1/(1-p) with dropout, else 1;
 * philox_keys the round keys (k0, k1) x 10 of the dropout stream;
 * drop_row_counter and drop_key_counter what the call's positions
 * (position_q, position_k) add to Philox counter words 1 and 0; with
 * packed sequences (spec.varlen) cu_seqlens_q, cu_seqlens_k and seqused_k
 * (int32 arrays, 0 when absent), total_q and total_k the packed tensors'
 * rows, align_bottom_right whether each sequence's diagonal is bottom-right
 * aligned (seqlen_q and seqlen_k are then the longest sequence's); the
 * variants' values (lib_logits.lua): softcap_in = scale / cap and
 * softcap_out = cap * log2(e), alibi_slopes fp32 (B?, Hq) with alibi_sb
 * between batch rows, sinks fp32 (Hq) (addresses 0 when absent); the
 * expressions' tensors (fg_forward_args.aux): aux_data, and per tensor t
 * aux_size[3t..3t+2] and aux_stride[3t..3t+2] in elements; pos_q and pos_k
 * the call's position_q and position_k, which the expressions add to q and
 * k. */
#define FORWARD_CALL_STRIDES(F) \
    F(i64, q_sb) F(i64, q_ss) F(i64, q_sh) \
    F(i64, k_sb) F(i64, k_ss) F(i64, k_sh) \
    F(i64, v_sb) F(i64, v_ss) F(i64, v_sh) \
    F(i64, o_sb) F(i64, o_ss) F(i64, o_sh)
#define FORWARD_CALL_VALUES(F) \
    F(u64, seed) F(u64, offset) \
    F(u64, cu_seqlens_q) F(u64, cu_seqlens_k) F(u64, seqused_k) \
    F(int, total_q) F(int, total_k) F(int, align_bottom_right) \
    F(int, batch) F(int, heads_q) F(int, heads_kv) F(int, seqlen_q) F(int, seqlen_k) \
    F(int, diag_offset) F(int, window_left) F(int, window_right) \
    F(float, scale_log2) F(float, softmax_scale) F(u32, drop_threshold4) F(float, out_scale) \
    F(u32, drop_row_counter) F(u32, drop_key_counter) \
    F(int, layout_batch) F(int, layout_heads) F(int, layout_blocks_q) F(int, layout_blocks_k) \
    F(u64, alibi_slopes) F(i64, alibi_sb) F(u64, sinks) \
    F(float, softcap_in) F(float, softcap_out)
#define FORWARD_CALL_AUX(F, A) \
    A(u64, aux_data, 8) A(i64, aux_stride, 24) A(int, aux_size, 24) F(int, pos_q) F(int, pos_k)

/* A call over a KV cache (spec.kv_cache), in every family that takes one:
 * cache_seqlens and block_table int32 arrays (0 when absent); k_new and
 * v_new with their strides, seqlen_new rows each (0 when none), which the
 * append kernel copies into the cache before the step's kernel reads it, a
 * thread per 16-byte chunk of a new row (append_items: B x seqlen_new x
 * Hkv); page_shift log2(page_size) for a power of two, else -1. */
#define KV_CACHE_PARAMS(F) \
    F(u64, k_new) F(u64, v_new) F(u64, cache_seqlens) F(u64, block_table) \
    F(i64, kn_sb) F(i64, kn_ss) F(i64, kn_sh) \
    F(i64, vn_sb) F(i64, vn_ss) F(i64, vn_sh) \
    F(int, seqlen_new) F(int, block_table_stride) F(int, page_size) F(int, page_shift) \
    F(int, num_pages) F(int, append_items)

/* The forward: device addresses; block_count and block_index list a layout's
 * kept key blocks per query block; num_m_blocks = ceil(seqlen_q / BLOCK_M). */
#define FWD_PARAMS(F, A) \
    F(u64, q) F(u64, k) F(u64, v) F(u64, o) F(u64, lse) \
    F(u64, block_count) F(u64, block_index) \
    FORWARD_CALL_STRIDES(F) FORWARD_CALL_VALUES(F) FORWARD_CALL_AUX(F, A) \
    F(int, num_m_blocks) \
    A(u32, philox_keys, 20)

/* The sm_90a forward: the forward's fields after the tensor maps of q, k
 * and v, which the producer's bulk copies read, and of o, which the
 * consumers' bulk stores write (the maps come first, so they are 64-byte
 * aligned in the parameter space); section_heads, the
 * heads whose query blocks are ordered together (lib_sparse.forward_block);
 * units, the query blocks (unit_blocks 1) or pairs of them (2) the thread
 * blocks walk, units_per_head of a head, and blocks, the thread blocks
 * launched (units, or fewer that each walk every blocks-th unit, or
 * where walk_lists is not 0 the units of their own list there:
 * sm90a_walk_lists' form, blocks + 1 offsets then the lists);
 * over a KV cache (spec.kv_cache) the cache's fields, k_map and v_map then
 * reading the cache (B, capacity, Hkv, D) or its pages (P, page, Hkv, D),
 * kv_box_rows rows a box (Bc, or with pages gcd(page size, Bc), a multiple
 * of 8). */
#define FWD_TMA_PARAMS(F, A) \
    F(tmap, q_map) F(tmap, k_map) F(tmap, v_map) F(tmap, o_map) \
    FWD_PARAMS(F, A) \
    F(int, section_heads) F(int, units) F(int, unit_blocks) F(int, units_per_head) F(int, blocks) \
    F(u64, walk_lists) \
    KV_CACHE_PARAMS(F) F(int, kv_box_rows)

/* The backward's three kernels: lse and delta are fp32 (B,Hq,Sq), dq_accum
 * fp32 (slices, B, Hq, Sq, head dim padded) with dq_slice elements per slice;
 * query_count and query_index list, per key block, the query blocks of a
 * layout that keep it; num_n_blocks = ceil(seqlen_k / BLOCK_N); n_groups
 * thread blocks per (batch, kv head); dq_slices the slices the last kernel
 * sums; sequences, the main kernel's batch extent: batch, and with packed
 * sequences one more, the key rows after the last sequence (dK, dV written
 * zero); d_sinks, the sinks' gradient fp32 (Hq) (0: none); d_aux, the
 * float aux tensors' gradients (fg_backward_args.d_aux; 0: none). With packed
 * sequences lse, delta and the accumulator's rows are (Hq, total_q). */
#define BWD_PARAMS(F, A) \
    F(u64, q) F(u64, k) F(u64, v) F(u64, o) F(u64, d_o) F(u64, dq) F(u64, dk) F(u64, dv) \
    F(u64, lse) F(u64, delta) F(u64, dq_accum) \
    F(u64, query_count) F(u64, query_index) \
    FORWARD_CALL_STRIDES(F) \
    F(i64, do_sb) F(i64, do_ss) F(i64, do_sh) \
    F(i64, dq_sb) F(i64, dq_ss) F(i64, dq_sh) \
    F(i64, dk_sb) F(i64, dk_ss) F(i64, dk_sh) \
    F(i64, dv_sb) F(i64, dv_ss) F(i64, dv_sh) \
    F(i64, dq_slice) \
    FORWARD_CALL_VALUES(F) FORWARD_CALL_AUX(F, A) \
    F(int, num_n_blocks) F(int, n_groups) F(int, dq_slices) F(int, sequences) \
    F(u64, d_sinks) A(u64, d_aux, 8) \
    A(u32, philox_keys, 20)

/* The sm_90a backward: the backward's fields after the tensor maps of q,
 * k, v and dO, which the producer's bulk copies read, of dq_accum
 * (one slice), which the bulk reductions add into, and of dk and dv, which
 * the fast kernel stores by boxes of 64 keys (where its plan does: head
 * dims that are multiples of 8, no packed sequences); dq_turns, the
 * deterministic schedule's counters (u32 (B, Hq, query blocks),
 * zeroed; 0 in the fast schedule), whose order follows a layout's kept
 * key blocks per query block (block_count, block_index, the forward's lists);
 * dq_done, u32 (sequences, Hkv), zeroed: the fast kernel's thread blocks
 * of each (key/value head, sequence) pair done, the last of which converts
 * the pair's dQ (0 where dq_post);
 * fast_n_blocks and det_n_blocks, the key
 * blocks of the fast and of the deterministic main kernel, num_n_blocks
 * for the call's schedule and 0 for the other (which is not launched);
 * section_heads, the (key/value head, sequence) pairs whose key blocks the
 * fast kernel orders together (1 in the deterministic schedule); wrap,
 * 1 where the key blocks start at their own query blocks and wrap round
 * in the deterministic schedule (no mask or sparsity, a sequence's key
 * blocks resident together);
 * dq_post, 1 where a kernel after the main one converts dQ (the
 * deterministic schedule, and fast calls the family leaves to it), else 0;
 * fast_tiles, the fast kernel's tiles (key block, key/value head,
 * sequence: fast_n_blocks x Hkv x sequences); fast_grid,
 * its thread blocks (0 in the deterministic schedule): one per tile, or
 * where its plan walks tiles one an SM at most, each taking the next tile
 * from tile_next (u32, zeroed; 0 where not walked) once its first is
 * done. */
#define BWD_TMA_PARAMS(F, A) \
    F(tmap, q_map) F(tmap, k_map) F(tmap, v_map) F(tmap, do_map) F(tmap, dq_map) \
    F(tmap, dk_map) F(tmap, dv_map) \
    BWD_PARAMS(F, A) \
    F(u64, dq_turns) F(u64, dq_done) F(u64, block_count) F(u64, block_index) \
    F(u64, tile_next) \
    F(int, fast_n_blocks) F(int, det_n_blocks) F(int, section_heads) F(int, wrap) \
    F(int, dq_post) F(u32, fast_tiles) F(int, fast_grid)

/* The decoding step (spec.kv_cache): the forward's tensors and values, the
 * cache's (KV_CACHE_PARAMS), and the split: lse_part fp32 (num_splits, B,
 * Hq, Sq) and o_part fp32 (num_splits, B, Hq, Sq, value head dim padded),
 * the workspace's parts, which the combine kernel adds into o and lse, a
 * thread block per query row, or with combine_row_warps a warp per row and
 * four rows a block (combine_blocks: its thread blocks, 0 with one split),
 * or, in the counted kernels, thread blocks after the splits', a query row
 * each (split_counters: int32 (B, Hq, Sq), the splits done, 0 between
 * calls; combine_blocks 0).
 * group = Hq / Hkv; rows = Sq x group, the query rows of one KV head, taken
 * 16 x warps_m at a time by row_blocks thread blocks per split; the thread
 * blocks of the step's ways, of which a call launches one (the others 0):
 * key_blocks, column_blocks (warps that share rows split the keys, or O's
 * columns), the splits' (num_splits x row_blocks x Hkv x B), and
 * counted_key_blocks, counted_column_blocks, the same ways with the
 * combining blocks after them; pair_blocks, the step's kernel in clusters
 * of two where a call's two splits add their rows themselves (fwd_decode
 * on sm_90, and the latent kernel below; combine_blocks and the parts then
 * 0). */
#define DECODE_PARAMS(F, A) \
    F(u64, q) F(u64, k) F(u64, v) F(u64, o) F(u64, lse) \
    F(u64, lse_part) F(u64, o_part) F(u64, split_counters) \
    FORWARD_CALL_STRIDES(F) \
    FORWARD_CALL_VALUES(F) FORWARD_CALL_AUX(F, A) \
    KV_CACHE_PARAMS(F) \
    F(int, group) F(int, rows) F(int, warps_m) F(int, row_blocks) F(int, num_splits) \
    F(int, combine_blocks) F(int, combine_row_warps) F(int, key_blocks) F(int, column_blocks) \
    F(int, counted_key_blocks) F(int, counted_column_blocks) F(int, pair_blocks) \
    A(u32, philox_keys, 20)

/* The latent step on sm_90a (fwd_mla_sm90a): the decoding step's fields,
 * then kv_box_rows, the rows of each bulk copy of the cache (64 a tile over
 * a contiguous cache, the rows a page and a tile share over pages of a
 * multiple of 8 rows; 0: no map, the kernel copies with cp.async), and
 * kv_map, the cache (B, capacity, Hkv, D) or its pages (P, page, Hkv, D)
 * read in 128-byte swizzled boxes of 64 columns by kv_box_rows rows;
 * narrow_blocks, the thread blocks of its kernel for calls of at most 16
 * query rows a KV head, launched instead of the 64-row one (key_blocks
 * then 0), or in pairs (pair_blocks, where a call has two splits: its
 * blocks add their halves and write o; narrow_blocks, key_blocks and
 * combine_blocks then 0). */
#define DECODE_TMA_PARAMS(F, A) \
    DECODE_PARAMS(F, A) \
    F(int, kv_box_rows) F(int, narrow_blocks) F(tmap, kv_map)

/* The block mask's build (spec.mask_mod over a layout's blocks): states
 * u8 (layout_batch, layout_heads, blocks_q, blocks_k), 0 empty, 1 partial,
 * 2 full, then the lists a layout holds (block_count, block_index per query
 * block; query_count, query_index per key block) with FG_FULL_BLOCK on the
 * full blocks' entries; the call's lengths, positions and aux tensors, which
 * the predicate reads. */
#define BLOCK_MASK_PARAMS(F, A) \
    F(u64, states) F(u64, block_count) F(u64, block_index) F(u64, query_count) \
    F(u64, query_index) \
    F(int, batch) F(int, heads_q) F(int, seqlen_q) F(int, seqlen_k) \
    F(int, layout_batch) F(int, layout_heads) F(int, layout_blocks_q) F(int, layout_blocks_k) \
    F(int, layout_lists) F(int, layout_key_lists) \
    FORWARD_CALL_AUX(F, A)

#define KP_C_FIELD(type, name) kp_##type name;
#define KP_C_ARRAY(type, name, count) kp_##type name[count];
typedef struct fg_fwd_params {
    FWD_PARAMS(KP_C_FIELD, KP_C_ARRAY)
} fg_fwd_params;
typedef struct fg_fwd_tma_params {
    FWD_TMA_PARAMS(KP_C_FIELD, KP_C_ARRAY)
} fg_fwd_tma_params;
typedef struct fg_bwd_params {
    BWD_PARAMS(KP_C_FIELD, KP_C_ARRAY)
} fg_bwd_params;
typedef struct fg_bwd_tma_params {
    BWD_TMA_PARAMS(KP_C_FIELD, KP_C_ARRAY)
} fg_bwd_tma_params;
typedef struct fg_decode_params {
    DECODE_PARAMS(KP_C_FIELD, KP_C_ARRAY)
} fg_decode_params;
typedef struct fg_decode_tma_params {
    DECODE_TMA_PARAMS(KP_C_FIELD, KP_C_ARRAY)
} fg_decode_tma_params;
typedef struct fg_block_mask_params {
    BLOCK_MASK_PARAMS(KP_C_FIELD, KP_C_ARRAY)
} fg_block_mask_params;
#undef KP_C_FIELD
#undef KP_C_ARRAY

/* A struct's fields, for emitting it and for finding a field by name (the
 * launch grids templates describe name the fields they multiply). */
typedef struct param_field {
    const char *type; /* device type name */
    const char *name;
    size_t offset, count;
} param_field;

typedef struct params_layout {
    const char *name; /* "fg_fwd_params" */
    size_t size;
    const param_field *fields;
    int field_count;
} params_layout;

extern const params_layout fwd_params_layout, fwd_tma_params_layout, bwd_params_layout,
    bwd_tma_params_layout, decode_params_layout, decode_tma_params_layout,
    block_mask_params_layout;

/* The field called name, or NULL. */
const param_field *params_field(const params_layout *l, const char *name);

/* The CUDA definition of the struct with its size and offset checks
 * (malloc'ed; NULL when out of memory). */
char *kernel_params_source(const params_layout *l);

#endif
