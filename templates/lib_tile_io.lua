-- Global -> shared tile copies: emits load_tile<ROWS>(s, g, stride,
-- valid_rows, tid). Expects the kernel to define HEAD_DIM, HEAD_DIM_PADDED,
-- SMEM_ROW and THREADS, and the target's prelude (isa.lua) to define copy16.
local text = import("lib_text")
local M = {}

-- Copy of a tile of rows global -> shared, zero-filling past the valid rows
-- and past the head dim. Head dims that are multiples of 8 move 16-byte
-- chunks (asynchronously where the arch can); others move single elements.
-- isa is the target's emitter (isa.lua). unroll, if given, overrides its
-- unrolling of the chunk loop: fully unrolled copies inside a kernel's main
-- loop get their addresses hoisted out of it, which costs a register per copy.
function M.loader(p, isa, unroll)
  if p.head_dim % 8 == 0 then
    return text.fill([[
template <int ROWS>
__device__ __forceinline__ void load_tile(u32 s, const u16* g, i64 stride, int valid_rows, int tid) {
  constexpr int CHUNKS = HEAD_DIM_PADDED / 8;  // 16-byte chunks per row
  constexpr int TOTAL = ROWS * CHUNKS;
#pragma unroll ${copy_unroll}
  for (int n = 0; n < (TOTAL + THREADS - 1) / THREADS; ++n) {
    const int c = n * THREADS + tid;
    if (TOTAL % THREADS == 0 || c < TOTAL) {
      const int r = c / CHUNKS, k = c % CHUNKS;
      const bool inside = r < valid_rows && k * 8 < HEAD_DIM;
      copy16(s + (r * SMEM_ROW + k * 8) * 2, inside ? g + r * stride + k * 8 : g, inside ? 16 : 0);
    }
  }
}
]], { copy_unroll = unroll or isa.copy_unroll })
  end
  return [[
template <int ROWS>
__device__ __forceinline__ void load_tile(u32 s, const u16* g, i64 stride, int valid_rows, int tid) {
  constexpr int TOTAL = ROWS * HEAD_DIM_PADDED;  // element by element: rows are not 16-byte aligned
#pragma unroll 4
  for (int c = tid; c < TOTAL; c += THREADS) {
    const int r = c / HEAD_DIM_PADDED, k = c % HEAD_DIM_PADDED;
    const u16 x = (r < valid_rows && k < HEAD_DIM) ? g[r * stride + k] : (u16)0;
    asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(s + (r * SMEM_ROW + k) * 2), "h"(x));
  }
}
]]
end

return M
