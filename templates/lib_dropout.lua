-- Dropout: Philox4x32-10, counter-based, so the keep decision for
-- (batch b, head h, query i, key j) depends on nothing else:
--   key     (seed_lo, seed_hi ^ offset_hi)
--   counter ((j/32)*4 + (j%8)/2, (i/16)*8 + i%8, b<<16 | h, offset_lo)
--   value   v = ((i/8)%2)*8 + ((j/8)%4)*2 + j%2, the v-th byte of the output
--           (byte v%4 of word v/4, least significant first)
--   keep    value >= threshold (8 bits)
-- with i and j the positions in the call's sequence: its rows and keys plus
-- position_q and position_k (multiples of 16 and 32), which add
-- drop_row_counter and drop_key_counter to the counter's first two words.
-- One call gives the 16 values one tensor-core thread holds in a 32-key
-- stretch of a 16-row tile: rows i and i+8, 8 keys each ((j%8)/2 is the
-- thread's position in its quad). Bytes rather than 16-bit values halve the
-- Philox calls, which dominate the cost of dropout.
-- Emits device (Philox and the keep tests), apply (the mma.sync backward's),
-- draw_tile and apply_packed (the forward's) and transposed (the sm_90a
-- backward's). These take a fragment
-- description (lib_fragment.lua) and rely on its 16-row by 8-column tiles,
-- of which a thread holds two rows 8 apart and two adjacent columns: that is
-- what lets one call serve a thread's 16 values. Expects lib_device's source.
local text = import("lib_text")
local fragment = import("lib_fragment")
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

// Bit 7 of each byte of the result is set iff that byte of w is >= the same
// byte of t4 (the threshold in every byte). The low seven bits compare by a
// subtraction that cannot borrow across bytes; the top bits decide where
// they differ. Three instructions for four decisions (the backward's).
__device__ __forceinline__ u32 keep_bits4(u32 w, u32 t4) {
  const u32 low_ge = (w | 0x80808080u) - (t4 & 0x7F7F7F7Fu);
  return (w & ~t4) | (~(w ^ t4) & low_ge);
}

// The forward's keep masks: 0xFFFF or 0 for each 16-bit half, from two bytes
// of a draw (sel 0x5150: bytes 0 and 1; 0x5352: bytes 2 and 3). prmt makes
// each byte b the fp16 0x3C00 | b, taking 0x3C from bytes 1 and 3 of thr2
// (0x3C00 | threshold in both halves); these values order as the bytes do,
// so one f16x2 comparison decides both. This keeps the comparison off the
// integer ALU, which the Philox rounds load: non-causal d=64 runs 3-4% faster
// on H100 than with the byte comparison above.
__device__ __forceinline__ u32 keep_mask2(u32 draw, u32 sel, u32 thr2) {
  u32 x, m;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(x) : "r"(draw), "r"(thr2), "r"(sel));
  asm("set.ge.u32.f16x2 %0, %1, %2;" : "=r"(m) : "r"(x), "r"(thr2));
  return m;
}
]]

-- Apply the keep decisions to a warp's tile of fp32 probabilities (the
-- backward). f describes the tile's accumulator (lib_fragment.lua). v:
-- params, batch, head (C: the launch arguments' name, the batch and query
-- head indexes), row0 (the tile's first query row, a multiple of 16), key0
-- (its first key, a multiple of 16; of 32 unless keys is 16), keys (how many
-- keys it spans, a Lua number: 16 or a multiple of 32) and drop(index), the
-- code for a dropped element given its subscript (into any array of f's
-- layout).
function M.apply(f, v)
  local groups = math.max(v.keys // 32, 1)
  local per_group = math.min(4, v.keys // 8)
  return text.fill([[
// dropout: one Philox call per (16-row tile, 32-key stretch) of this thread
{
  const u32 c2 = ((u32)${b} << 16) | (u32)${h}, c3 = (u32)${p}.offset;
  const int key0 = ${key0};
#pragma unroll
  ${m_loop} {
    const int i = ${row0} + ${m_row} + ${row_lane};
    const u32 c1 = (((u32)(i >> 4) << 3) | (u32)(i & 7)) + ${p}.drop_row_counter;
#pragma unroll
    for (int grp = 0; grp < ${groups}; ++grp) {
      u32 draw[4];
      philox4x32_10((u32)((key0 + grp * 32) >> 5) * 4u + (u32)${pair} + ${p}.drop_key_counter, c1, c2, c3,
                    ${p}.philox_keys, draw);
#pragma unroll
      for (int w = 0; w < 4; ++w) draw[w] = keep_bits4(draw[w], ${p}.drop_threshold4);
#pragma unroll
      for (int q = 0; q < ${per_group}; ++q) {
        const int ${nt} = grp * 4 + q;
        const int tile = ((key0 >> 3) + ${nt}) & 3;  // 8-key tile within the stretch
#pragma unroll
        ${e_loop} {
          // word (e/2)*2 + tile/2, byte (tile%2)*2 + e%2
          const int wi = ${half} * 2 + (tile >> 1), bit = ((tile & 1) * 2 + ${odd}) * 8 + 7;
          const u32 w = wi == 0 ? draw[0] : wi == 1 ? draw[1] : wi == 2 ? draw[2] : draw[3];
          if (!((w >> bit) & 1u)) { ${drop} }
        }
      }
    }
  }
}
]], { b = v.batch, h = v.head, p = v.params, key0 = v.key0, m_loop = fragment.loop_head(f.m),
      row0 = v.row0, m_row = f.m.row, row_lane = f.row.lane, groups = groups, pair = f.pair,
      per_group = per_group, nt = f.n.var, e_loop = fragment.loop_head(f.e), half = f.e.half,
      odd = f.e.odd, drop = v.drop(f.index(f.m.var, f.n.var, f.e.var)) })
end

-- The forward's form, in two parts. draw_tile: the draws of a whole key
-- tile, ahead of their use; they depend on nothing the iteration computes,
-- so they can run beside other work: the mma.sync kernel draws at the top of
-- the tile's iteration, leaving the compiler free to spread the Philox
-- rounds among the softmax's work (4% faster causal at d=64 on H100 than
-- drawing next to their use). The wgmma kernel draws a stretch at a time
-- (stretches 1, key0 the stretch's first key) as P is packed: no draws are
-- held in registers while its GEMMs run (5-13% faster at d = 64 and 128 on
-- H100 than a tile's draws ahead of its GEMMs).
-- f describes the tile's accumulator; v: params,
-- batch, head, row0, key0 (the tile's first key), stretches (32-key
-- stretches per tile, at least 1) and keep (a u32 [m tiles][stretches][4]
-- array of raw draws).
function M.draw_tile(f, v)
  return text.fill([[
#pragma unroll
${m_loop} {
  const int i = ${row0} + ${m_row} + ${row_lane};
#pragma unroll
  for (int st = 0; st < ${stretches}; ++st)
    philox4x32_10((u32)((${key0}) >> 5) * 4u + (u32)(st * 4 + ${pair}) + ${p}.drop_key_counter,
                  (((u32)(i >> 4) << 3) | (u32)(i & 7)) + ${p}.drop_row_counter,
                  ((u32)${b} << 16) | (u32)${h}, (u32)${p}.offset, ${p}.philox_keys, ${keep}[${mt}][st]);
}
]], { m_loop = fragment.loop_head(f.m), row0 = v.row0, m_row = f.m.row, row_lane = f.row.lane,
      stretches = v.stretches, key0 = v.key0, pair = f.pair, b = v.batch, h = v.head,
      p = v.params, keep = v.keep, mt = f.m.var })
end

-- apply_packed: zero dropped probabilities in the packed 16-bit A fragments
-- of one 16-key step of P·V, with a mask per register. a describes the
-- fragments (lib_fragment.lua, a packed A operand). v: params, key0 (the
-- step's first key, a multiple of 16), stretch (the step's stretch in the
-- tile's keep array, a C expression) and keep. The row sums are taken
-- before dropout: the log-sum-exp is that of the undropped softmax, and
-- 1/(1-p) is applied once to O at the end.
function M.apply_packed(a, v)
  -- a register's row picks the draw words (rows g, g + 8 of the keep
  -- values), its 8-key tile the bytes (0 and 1, or 2 and 3)
  local masks = {}
  for _, reg in ipairs(a.regs) do
    local row = reg.half == 0 and "row_g" or "row_g8"
    local bytes = reg.tile == 0 and "0x5150u" or "0x5352u"
    masks[#masks + 1] = a.array .. reg.index .. " &= keep_mask2(" .. row .. ", " .. bytes .. ", drop_thr2);"
  end
  return text.fill([[
{
  const bool second = ((${key0}) >> 4) & 1;  // keys 16..31 of the stretch
#pragma unroll
  ${m_loop} {
    const u32* keep = ${keep}[${mt}][${stretch}];
    const u32 drop_thr2 = 0x3C003C00u | (${p}.drop_threshold4 & 0x00FF00FFu);
    const u32 row_g = second ? keep[1] : keep[0], row_g8 = second ? keep[3] : keep[2];
${masks}
  }
}
]], { key0 = v.key0, m_loop = fragment.loop_head(a.m), keep = v.keep, mt = a.m.var,
      stretch = v.stretch, p = v.params, masks = text.indent(table.concat(masks, "\n"), 4) })
end

-- The sm_90a backward's form. Its consumers hold Sᵀ with keys along
-- wgmma's M: in a warpgroup's 64 keys by a 64-query block, the thread at
-- lane 4g + t of warp w holds keys 16w + g + 8r and queries 8nt + 2t + c.
-- A Philox call's 16 values then fall on four threads of two warps, 4 each,
-- so drawing where they are used would take 4x the forward's calls. The
-- producer draws instead, a call per 16 values, and hands each consumer
-- thread its decisions as one word (keep_bit: where element (nt, r, c) is).
-- keep_words_t makes 16 of each of four threads' bits, from four calls: for
-- the 32-key stretch at key j0 (global; row_ctr and key_ctr: the call's
-- positions' parts of the counter), quad position q (keys j0 + 8a +
-- 2q + bk), query pair t and half uh (nt = 4uh..4uh+3) of the query block at
-- i0. out[A] holds in byte 2r + bk, bit 4u + 2c + z, the decision of key
-- j0 + 16A + 8r + 2q + bk and query i0 + 32uh + 16u + 8z + 2t + c: bytes bk
-- and 2 + bk of it are the thread's (warp 2 (j0/32 % 2) + A, g = 2q + bk)
-- 16 bits, in keep_bit's order.
M.transposed = [[
__device__ __forceinline__ constexpr int keep_bit(int nt, int r, int c) {
  return 16 * (nt / 4) + 8 * r + 4 * (nt / 2 % 2) + 2 * c + nt % 2;
}

__device__ __forceinline__ void keep_words_t(const u32* keys, u32 threshold4, u32 c2, u32 c3, u32 row_ctr,
                                             u32 key_ctr, int i0, int j0, int q, int t, int uh, u32* out) {
  out[0] = out[1] = 0u;
#pragma unroll
  for (int u = 0; u < 2; ++u)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      u32 draw[4];
      philox4x32_10((u32)(j0 >> 5) * 4u + (u32)q + key_ctr,
                    (((u32)((i0 >> 4) + 2 * uh + u) << 3) | (u32)(2 * t + c)) + row_ctr, c2, c3, keys, draw);
#pragma unroll
      for (int z = 0; z < 2; ++z)
#pragma unroll
        for (int a = 0; a < 2; ++a)  // bits 7, 15, 23, 31 to k, 8 + k, 16 + k, 24 + k
          out[a] |= (keep_bits4(draw[2 * z + a], threshold4) & 0x80808080u) >> (7 - (4 * u + 2 * c + z));
    }
}
]]

return M
