-- Masks. Query i sees key j when d = j - (i + diag_offset) satisfies
--   causal   d <= 0
--   window   (left < 0 or d >= -left) and (right < 0 or d <= right)
-- and always j < seqlen_k. diag_offset is Sk - Sq (bottom-right alignment) or
-- 0 (top-left); it is a launch argument, as are the window sizes.
local text = import("lib_text")
local M = {}

-- Code that sets n_lo, n_hi: the keys any row of this block may see.
function M.key_range(kind)
  if kind == "none" then
    return "const int n_lo = 0, n_hi = p.seqlen_k;\n"
  elseif kind == "causal" then
    return [[
const int n_lo = 0;
const int n_hi = min(p.seqlen_k, row0 + rows_valid + p.diag_offset);
]]
  elseif kind == "window" then
    return [[
const int n_lo = p.window_left < 0 ? 0 : max(0, row0 + p.diag_offset - p.window_left);
const int n_hi = p.window_right < 0 ? p.seqlen_k
               : min(p.seqlen_k, row0 + rows_valid - 1 + p.diag_offset + p.window_right + 1);
]]
  end
  error("unknown mask kind '" .. tostring(kind) .. "'")
end

-- Does tile n0 hold any invisible element for this block's rows?
local tile_test = {
  none = "n0 + BLOCK_N > p.seqlen_k",
  causal = "n0 + BLOCK_N > p.seqlen_k || n0 + BLOCK_N - 1 > row0 + p.diag_offset",
  window = "n0 + BLOCK_N > p.seqlen_k"
        .. " || (p.window_right >= 0 && n0 + BLOCK_N - 1 > row0 + p.diag_offset + p.window_right)"
        .. " || (p.window_left >= 0 && n0 < row0 + BLOCK_M - 1 + p.diag_offset - p.window_left)",
}

-- Per-element visibility: c is the element's key offset past this thread's
-- first key (j = n0 + 2t + c), d = j - (i + diag_offset).
local element_test = {
  none = "c < keys_left",
  causal = "c < keys_left && d <= 0",
  window = "c < keys_left && (p.window_left < 0 || d >= -p.window_left)"
        .. " && (p.window_right < 0 || d <= p.window_right)",
}

-- Set invisible scores of a warp's tile to -inf. v names the tile: acc (the
-- fp32 accumulator array [m_tiles][n_tiles][4]), key0 (this warp's first key)
-- and row0 (its first query row). The tile test is on the thread block's
-- tile: rows row0..row0+BLOCK_M-1 and keys n0..n0+BLOCK_N-1.
function M.apply(kind, v)
  if not tile_test[kind] then error("unknown mask kind '" .. tostring(kind) .. "'") end
  return text.fill([[
// mask: only tiles that cross the sequence end or the mask's edge pay for it
// (two registers per tile; every element adds compile-time offsets to them)
if (${tile_test}) {
  const int keys_left = p.seqlen_k - (${key0}) - 2 * t;
  const int d0 = ${key0} + 2 * t - (${row0} + g + p.diag_offset);
  (void)d0;
#pragma unroll
  for (int mt = 0; mt < ${m_tiles}; ++mt)
#pragma unroll
    for (int nt = 0; nt < ${n_tiles}; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = nt * 8 + (e & 1);
        const int d = d0 + c - (mt * 16 + 8 * (e >> 1));
        (void)d;
        if (!(${element_test})) ${acc}[mt][nt][e] = FG_NEG_INF;
      }
}
]], { tile_test = tile_test[kind], element_test = element_test[kind], key0 = v.key0,
      row0 = v.row0, m_tiles = v.m_tiles, n_tiles = v.n_tiles, acc = v.acc })
end

-- Code that sets i_lo, i_hi: the query rows that may see any key of the
-- thread block's keys n0..n0+BLOCK_N-1 (the backward walks these).
function M.query_range(kind)
  if kind == "none" then
    return "const int i_lo = 0, i_hi = p.seqlen_q;\n"
  elseif kind == "causal" then
    return "const int i_lo = max(0, n0 - p.diag_offset), i_hi = p.seqlen_q;\n"
  elseif kind == "window" then
    return [[
const int i_lo = p.window_right < 0 ? 0 : max(0, n0 - p.diag_offset - p.window_right);
const int i_hi = p.window_left < 0 ? p.seqlen_q
               : min(p.seqlen_q, n0 + BLOCK_N - 1 - p.diag_offset + p.window_left + 1);
]]
  end
  error("unknown mask kind '" .. tostring(kind) .. "'")
end

return M
