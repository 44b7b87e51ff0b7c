-- Masks. Query i sees key j when d = j - (i + diag_offset) satisfies
--   causal   d <= 0
--   window   (left < 0 or d >= -left) and (right < 0 or d <= right)
-- and always j < seqlen_k. diag_offset is Sk - Sq (bottom-right alignment) or
-- 0 (top-left); it is a launch argument, as are the window sizes.
local text = import("text")
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

function M.apply(kind)
  if not tile_test[kind] then error("unknown mask kind '" .. tostring(kind) .. "'") end
  return text.fill([[
// mask: only tiles that cross the sequence end or the mask's edge pay for it
// (two registers per tile; every element adds compile-time offsets to them)
if (${tile_test}) {
  const int keys_left = p.seqlen_k - n0 - 2 * t;
  const int d0 = n0 + 2 * t - (row0 + warp_row + g + p.diag_offset);
  (void)d0;
#pragma unroll
  for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
    for (int nt = 0; nt < N_TILES_S; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = nt * 8 + (e & 1);
        const int d = d0 + c - (mt * 16 + 8 * (e >> 1));
        (void)d;
        if (!(${element_test})) acc_s[mt][nt][e] = FG_NEG_INF;
      }
}
]], { tile_test = tile_test[kind], element_test = element_test[kind] })
end

return M
