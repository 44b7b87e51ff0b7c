-- Device code every kernel shares: source (fixed-width types, FG_NEG_INF,
-- shared-memory addressing, ldmatrix and the fast exp2), the launch
-- argument structs forward_params and backward_params, and to_float(dtype).
-- Expects nothing; every other piece of device code expects its source.
local M = {}

M.source = [[
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;
typedef long long i64;
struct alignas(16) u128 { u32 x, y, z, w; };

#define FG_NEG_INF (-__int_as_float(0x7f800000))

__device__ __forceinline__ u32 smem_addr(const void* p) {
  u32 r;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }\n" : "=r"(r) : "l"(p));
  return r;
}

// Four 8x8 b16 matrices; lanes 8m..8m+7 give the row addresses of matrix m.
__device__ __forceinline__ void ldmatrix_x4(u32* r, u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32* r, u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// 2^x; exp2(-inf) = 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
]]

-- The launch arguments; the runtime's fg_fwd_params has the same layout.
M.forward_params = [[
struct fg_fwd_params {
  u64 q, k, v, o, lse;              // device addresses
  u64 block_count, block_index;     // layout sparsity: kept key blocks per query block
  i64 q_sb, q_ss, q_sh;             // strides in elements: batch, sequence, head
  i64 k_sb, k_ss, k_sh;
  i64 v_sb, v_ss, v_sh;
  i64 o_sb, o_ss, o_sh;
  u64 seed, offset;                 // dropout stream
  int batch, heads_q, heads_kv, seqlen_q, seqlen_k;
  int diag_offset;                  // key i + diag_offset is on query i's diagonal
  int window_left, window_right;    // -1: unbounded
  float scale_log2;                 // softmax scale * log2(e)
  float softmax_scale;
  u32 drop_threshold4;              // dropout: the 8-bit threshold in every byte
  float out_scale;                  // 1/(1-p) with dropout, else 1
  int layout_heads, layout_blocks_q, layout_blocks_k;
  int num_m_blocks;                 // ceil(seqlen_q / BLOCK_M)
  u32 philox_keys[20];              // dropout: round keys of (seed, offset), see dropout.lua
};
]]

-- The backward's launch arguments (runtime/kernel_params.h, same order).
M.backward_params = [[
struct fg_bwd_params {
  u64 q, k, v, o, d_o, dq, dk, dv;  // device addresses
  u64 lse, delta, dq_accum;         // fp32 (B,Hq,Sq), (B,Hq,Sq), (slices,B,Hq,Sq,HEAD_DIM_PADDED)
  u64 query_count, query_index;     // layout sparsity: query blocks that keep each key block
  i64 q_sb, q_ss, q_sh;             // strides in elements: batch, sequence, head
  i64 k_sb, k_ss, k_sh;
  i64 v_sb, v_ss, v_sh;
  i64 o_sb, o_ss, o_sh;
  i64 do_sb, do_ss, do_sh;
  i64 dq_sb, dq_ss, dq_sh;
  i64 dk_sb, dk_ss, dk_sh;
  i64 dv_sb, dv_ss, dv_sh;
  i64 dq_slice;                     // elements per dq_accum slice
  u64 seed, offset;                 // dropout stream
  int batch, heads_q, heads_kv, seqlen_q, seqlen_k;
  int diag_offset;
  int window_left, window_right;
  float scale_log2;
  float softmax_scale;
  u32 drop_threshold4;
  float out_scale;
  int layout_heads, layout_blocks_q, layout_blocks_k;
  int num_n_blocks;                 // ceil(seqlen_k / BLOCK_N)
  int n_groups;                     // thread blocks per (batch, kv head)
  int dq_slices;                    // dq_accum slices the last kernel sums
  u32 philox_keys[20];
};
]]

-- 16-bit storage value -> fp32.
function M.to_float(dtype)
  if dtype == "bf16" then
    return "__device__ __forceinline__ float to_float(u16 x) { return __uint_as_float((u32)x << 16); }\n"
  end
  return [[
__device__ __forceinline__ float to_float(u16 x) {
  float f;
  asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(x));
  return f;
}
]]
end

return M
