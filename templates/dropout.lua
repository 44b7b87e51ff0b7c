-- Dropout: Philox4x32-10, counter-based, so the keep decision for
-- (batch b, head h, query i, key j) depends on nothing else:
--   key     (seed_lo, seed_hi ^ offset_hi)
--   counter ((j/32)*4 + (j%8)/2, i, b<<16 | h, offset_lo)
--   value   v = ((j/8)%4)*2 + j%2, the v-th 16-bit half of the output
--   keep    value >= threshold
-- One call gives the 8 values one tensor-core thread holds in a row across a
-- 32-key stretch ((j%8)/2 is the thread's position in its quad).
local text = import("text")
local M = {}

M.device = [[
__device__ __forceinline__ void philox4x32_10(u32 c0, u32 c1, u32 c2, u32 c3, u32 k0, u32 k1,
                                              u32* out) {
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    if (round > 0) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
    const u32 lo0 = 0xD2511F53u * c0, hi0 = __umulhi(0xD2511F53u, c0);
    const u32 lo1 = 0xCD9E8D57u * c2, hi1 = __umulhi(0xCD9E8D57u, c2);
    const u32 n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
  }
  out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

// The v-th 16-bit value of a Philox output (v in 0..7).
__device__ __forceinline__ u32 philox_u16(const u32* r, int v) {
  const u32 w = (v >> 1) == 0 ? r[0] : (v >> 1) == 1 ? r[1] : (v >> 1) == 2 ? r[2] : r[3];
  return (v & 1) ? (w >> 16) : (w & 0xffffu);
}
]]

-- Draw this tile's keep decisions into bits, one per accumulator element
-- (bit ((mt*2 + r)*N_TILES_S + nt)*2 + e). Emitted right after the Q·Kᵀ MMAs
-- with no branch between, so the scheduler can overlap the Philox integer
-- work with the tensor cores.
function M.draw(plan)
  local groups = math.max(plan.block_n // 32, 1)
  local per_group = math.min(4, plan.block_n // 8)
  return text.fill([[
// dropout: one Philox call per (row, 32-key stretch) of this thread
u32 keep[KEEP_WORDS];
#pragma unroll
for (int w = 0; w < KEEP_WORDS; ++w) keep[w] = 0u;
{
  const u32 key0 = (u32)p.seed, key1 = (u32)(p.seed >> 32) ^ (u32)(p.offset >> 32);
  const u32 c2 = ((u32)b << 16) | (u32)h, c3 = (u32)p.offset;
#pragma unroll
  for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = row0 + warp_row + mt * 16 + g + 8 * r;
#pragma unroll
      for (int grp = 0; grp < ${groups}; ++grp) {
        u32 draw[4];
        philox4x32_10((u32)((n0 + grp * 32) >> 5) * 4u + (u32)t, (u32)i, c2, c3, key0, key1, draw);
#pragma unroll
        for (int q = 0; q < ${per_group}; ++q) {
          const int nt = grp * 4 + q;
          const int v = (((n0 >> 3) + nt) & 3) * 2;
          const int bit = ((mt * 2 + r) * N_TILES_S + nt) * 2;
          keep[bit >> 5] |= (u32)(philox_u16(draw, v) >= p.drop_threshold) << (bit & 31);
          keep[bit >> 5] |= (u32)(philox_u16(draw, v + 1) >= p.drop_threshold) << ((bit + 1) & 31);
        }
      }
    }
}
]], { groups = groups, per_group = per_group })
end

-- Zero the dropped probabilities (after the row sums: the log-sum-exp is
-- that of the undropped softmax; 1/(1-p) is applied once to O at the end).
M.apply = [[
// dropout: zero the dropped probabilities
#pragma unroll
for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int nt = 0; nt < N_TILES_S; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int bit = ((mt * 2 + r) * N_TILES_S + nt) * 2 + e;
        if (!((keep[bit >> 5] >> (bit & 31)) & 1u)) acc_s[mt][nt][2 * r + e] = 0.f;
      }
]]

return M
