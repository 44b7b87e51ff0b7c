-- Global -> shared tile copies: emits load_tile<ROWS>(s, g, stride,
-- valid_rows, tid). Expects the kernel to define HEAD_DIM, HEAD_DIM_PADDED,
-- SMEM_ROW and THREADS, and the target's prelude (isa.lua) to define copy16.
-- Given another row width (lib_width.lua), the loader of such rows instead,
-- under that width's names (load_tile_v over HEAD_DIM_V, ...).
local text = import("lib_text")
local M = {}

-- Copy of a tile of rows global -> shared, zero-filling past the valid rows
-- and past the row width. Widths that are multiples of 8 move 16-byte
-- chunks (asynchronously where the arch can); others move single elements.
-- isa is the target's emitter (isa.lua). unroll, if given, overrides its
-- unrolling of the chunk loop: fully unrolled copies inside a kernel's main
-- loop get their addresses hoisted out of it, which costs a register per copy.
-- width (lib_width.lua; default the head dim's): the rows' width.
function M.loader(p, isa, unroll, width)
  width = width or { dim = p.head_dim, name = "HEAD_DIM", padded = "HEAD_DIM_PADDED",
                     row = "SMEM_ROW", load = "load_tile" }
  local names = { load = width.load, dim = width.name, padded = width.padded, row = width.row }
  if width.dim % 8 == 0 then
    names.copy_unroll = unroll or isa.copy_unroll
    return text.fill([[
template <int ROWS>
__device__ __forceinline__ void ${load}(u32 s, const u16* g, i64 stride, int valid_rows, int tid) {
  constexpr int CHUNKS = ${padded} / 8;  // 16-byte chunks per row
  constexpr int TOTAL = ROWS * CHUNKS;
#pragma unroll ${copy_unroll}
  for (int n = 0; n < (TOTAL + THREADS - 1) / THREADS; ++n) {
    const int c = n * THREADS + tid;
    if (TOTAL % THREADS == 0 || c < TOTAL) {
      const int r = c / CHUNKS, k = c % CHUNKS;
      const bool inside = r < valid_rows && k * 8 < ${dim};
      copy16(s + (r * ${row} + k * 8) * 2, inside ? g + r * stride + k * 8 : g, inside ? 16 : 0);
    }
  }
}
]], names)
  end
  return text.fill([[
template <int ROWS>
__device__ __forceinline__ void ${load}(u32 s, const u16* g, i64 stride, int valid_rows, int tid) {
  constexpr int TOTAL = ROWS * ${padded};  // element by element: rows are not 16-byte aligned
#pragma unroll 4
  for (int c = tid; c < TOTAL; c += THREADS) {
    const int r = c / ${padded}, k = c % ${padded};
    const u16 x = (r < valid_rows && k < ${dim}) ? g[r * stride + k] : (u16)0;
    asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(s + (r * ${row} + k) * 2), "h"(x));
  }
}
]], names)
end

return M
