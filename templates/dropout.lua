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
// keys: the 10 round keys (k0, k1) pairs, computed once on the host from
// (seed, offset): the key schedule is the same for every element.
__device__ __forceinline__ void philox4x32_10(u32 c0, u32 c1, u32 c2, u32 c3, const u32* keys,
                                              u32* out) {
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    const u32 lo0 = 0xD2511F53u * c0, hi0 = __umulhi(0xD2511F53u, c0);
    const u32 lo1 = 0xCD9E8D57u * c2, hi1 = __umulhi(0xCD9E8D57u, c2);
    const u32 n0 = hi1 ^ c1 ^ keys[2 * round], n2 = hi0 ^ c3 ^ keys[2 * round + 1];
    c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
  }
  out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

// Whether the v-th 16-bit value of a Philox output (v in 0..7) is below the
// threshold. With the value in the top half of a word and thr_hi = threshold
// << 16 it is one compare: an odd value is already there, whatever the low
// half holds. (Selects, not r[v >> 1]: v is not always known at compile time,
// and an indexed array would go to local memory.)
__device__ __forceinline__ bool philox_dropped(const u32* r, int v, u32 thr_hi) {
  const u32 w = (v >> 1) == 0 ? r[0] : (v >> 1) == 1 ? r[1] : (v >> 1) == 2 ? r[2] : r[3];
  return ((v & 1) ? w : w << 16) < thr_hi;
}
]]

-- Apply the keep decisions to a warp's tile of probabilities. v names the
-- tile: m_tiles, row0 (its first query row), key0 (its first key, a multiple
-- of 16; of 32 unless keys is 16), keys (how many keys it spans, a Lua
-- number: 16 or a multiple of 32), nt0 (the accumulator index of its first
-- 8-key tile, default 0) and drop, the code run for a dropped element (mt,
-- nt, e in scope). The forward zeroes P after the row sums (the log-sum-exp
-- is that of the undropped softmax; 1/(1-p) is applied once to O at the end).
-- Measured on an H100 at d=128: drawing the keep bits next to Q·Kᵀ and
-- packing them cost more than this (shift and mask work per element, and
-- register pressure that forced smaller tiles).
function M.apply(v)
  local groups = math.max(v.keys // 32, 1)
  local per_group = math.min(4, v.keys // 8)
  return text.fill([[
// dropout: one Philox call per (row, 32-key stretch) of this thread
{
  const u32 c2 = ((u32)b << 16) | (u32)h, c3 = (u32)p.offset;
  const int key0 = ${key0};
#pragma unroll
  for (int mt = 0; mt < ${m_tiles}; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = ${row0} + mt * 16 + g + 8 * r;
#pragma unroll
      for (int grp = 0; grp < ${groups}; ++grp) {
        u32 draw[4];
        philox4x32_10((u32)((key0 + grp * 32) >> 5) * 4u + (u32)t, (u32)i, c2, c3, p.philox_keys, draw);
#pragma unroll
        for (int q = 0; q < ${per_group}; ++q) {
          const int nt = ${nt0} + grp * 4 + q;
          const int v = (((key0 >> 3) + grp * 4 + q) & 3) * 2;
#pragma unroll
          for (int e = 2 * r; e < 2 * r + 2; ++e)
            if (philox_dropped(draw, v + (e & 1), p.drop_threshold_hi)) { ${drop} }
        }
      }
    }
}
]], { groups = groups, per_group = per_group, key0 = v.key0, m_tiles = v.m_tiles, row0 = v.row0,
      nt0 = v.nt0 or "0", drop = v.drop })
end

return M
