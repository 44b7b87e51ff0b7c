-- Masks. Query i sees key j when d = j - (i + diag_offset) satisfies
--   causal   d <= 0
--   window   (left < 0 or d >= -left) and (right < 0 or d <= right)
-- and always j < seqlen_k. diag_offset is Sk - Sq (bottom-right alignment) or
-- 0 (top-left). The window sizes are launch arguments; seqlen_q, seqlen_k
-- and diag_offset are read from `seq` (lib_seq's Seq: the thread block's
-- sequence) where a kernel names it, else from the launch arguments.
-- Emits the key range of a query block (key_range, for the forward), the
-- query range of a key block (query_range, for the backward), and the mask
-- of a warp's scores (apply). Expects BLOCK_M, BLOCK_N and FG_NEG_INF; the
-- ranges also expect the launch arguments as p and the block's row0 and
-- rows_valid, or n0.
local text = import("lib_text")
local fragment = import("lib_fragment")
local M = {}

-- Code that sets n_lo, n_hi: the keys any row of this block may see; seq
-- names the lengths' struct ("p" unless given); names, where given, the
-- rows' ({row0 = , rows = }: rows starting at row0, rows of them valid) and
-- the range's ({lo = , hi = }) in place of row0, rows_valid, n_lo, n_hi.
function M.key_range(kind, seq, names)
  local body
  if kind == "none" then
    body = "const int n_lo = 0, n_hi = ${s}.seqlen_k;\n"
  elseif kind == "causal" then
    body = [[
const int n_lo = 0;
const int n_hi = min(${s}.seqlen_k, row0 + rows_valid + ${s}.diag_offset);
]]
  elseif kind == "window" then
    body = [[
const int n_lo = p.window_left < 0 ? 0 : max(0, row0 + ${s}.diag_offset - p.window_left);
const int n_hi = p.window_right < 0 ? ${s}.seqlen_k
               : min(${s}.seqlen_k, row0 + rows_valid - 1 + ${s}.diag_offset + p.window_right + 1);
]]
  else
    error("unknown mask kind '" .. tostring(kind) .. "'")
  end
  for name, default in pairs({ row0 = "row0", rows = "rows_valid", lo = "n_lo", hi = "n_hi" }) do
    local to = ((names or {})[name] or default):gsub("%%", "%%%%")
    body = body:gsub("%f[%w_]" .. default .. "%f[^%w_]", to)
  end
  return text.fill(body, { s = seq or "p" })
end

-- Does the thread block's tile hold any invisible element? ${row0} and
-- ${key0} are its first row and key.
local tile_test = {
  none = "${key0} + BLOCK_N > ${s}.seqlen_k",
  causal = "${key0} + BLOCK_N > ${s}.seqlen_k || ${key0} + BLOCK_N - 1 > ${row0} + ${s}.diag_offset",
  window = "${key0} + BLOCK_N > ${s}.seqlen_k"
        .. " || (${p}.window_right >= 0"
        .. " && ${key0} + BLOCK_N - 1 > ${row0} + ${s}.diag_offset + ${p}.window_right)"
        .. " || (${p}.window_left >= 0"
        .. " && ${key0} < ${row0} + BLOCK_M - 1 + ${s}.diag_offset - ${p}.window_left)",
}

-- Per-row bounds on c where a lane holds few rows (rows met in the m loop:
-- the forwards' accumulators, the mma.sync backward's S), at the top of
-- each m iteration: keys lo <= c < hi of the row at offset ${row} (elem)
-- past the lane's, the sequence's end folded into hi, so an element costs
-- one compare (two under a window) where the tests below cost two
-- (three). The sides come clamped to the call's reach
-- (forward_call_reach), which keeps the sums within int.
local row_bounds = {
  causal = { hi = "min(keys_left, 1 - d0 + (${row}))" },
  window = { hi = "(${p}.window_right < 0 ? keys_left : min(keys_left, ${p}.window_right + 1 - d0 + (${row})))",
             lo = "(${p}.window_left < 0 ? 0 : -${p}.window_left - d0 + (${row}))" },
}

-- Per-element visibility: c is the element's key offset past this lane's
-- first key, d = j - (i + diag_offset).
local element_test = {
  none = "c < keys_left",
  causal = "c < keys_left && d <= 0",
  window = "c < keys_left && (${p}.window_left < 0 || d >= -${p}.window_left)"
        .. " && (${p}.window_right < 0 || d <= ${p}.window_right)",
}

-- Set invisible scores of a warp's tile to -inf. f describes the tile's
-- accumulator (lib_fragment.lua); v: params (the launch arguments' name),
-- row0 and key0 (the warp tile's first query row and key), block_row0 and
-- block_key0 (the thread block's: the tile test is on its BLOCK_M x BLOCK_N
-- tile), seq (the lengths' struct; params unless given), predicate (a mask
-- predicate, lib_logits.mask_predicate's split of it: hides the key where
-- false; tested in every tile but those `full` says it holds throughout),
-- full (C bool: a block mask found the predicate true on the whole tile),
-- eager (the predicate evaluated on every element with no branch: faster,
-- more registers).
function M.apply(kind, f, v)
  if not tile_test[kind] then error("unknown mask kind '" .. tostring(kind) .. "'") end
  local test = text.fill(element_test[kind], { p = v.params })
  local bounds = ""
  if row_bounds[kind] and f.row.slots.loop == f.m then
    -- one bound per row of the m iteration (slot bit 0 and 1), picked by the
    -- element's bit, a constant once the loops unroll
    local slots, parts = f.row.slots, {}
    for _, side in ipairs({ "lo", "hi" }) do
      local at = row_bounds[kind][side]
      if at then
        for b = 0, 1 do
          parts[#parts + 1] = "const int " .. side .. b .. " = "
              .. text.fill(at, { p = v.params, row = slots.elem(f.m.var, b) }) .. ";"
        end
      end
    end
    bounds = table.concat(parts, "\n") .. "\n"
    local function pick(side) return "(" .. slots.bit .. " ? " .. side .. "1 : " .. side .. "0)" end
    test = (row_bounds[kind].lo and "c >= " .. pick("lo") .. " && " or "") .. "c < " .. pick("hi")
  end
  local terms, heads = "", {}
  if v.predicate then
    -- the predicate's terms of the lane's rows, keys and diagonals, once each
    -- (a document id per row and per key, not per element)
    local holds_at
    terms, heads, holds_at = v.predicate(f, v.row0, v.key0)
    local holds = holds_at(v.row0 .. " + " .. f.row.lane .. " + " .. f.row.elem, v.key0 .. " + " .. f.col.lane .. " + c")
    -- A full tile tests it only where the mask's edge brings it here: true
    -- there. eager: on every element, not behind && (its reads are bounds
    -- checked), as a branch per element serializes the loads; else only
    -- where the mask shows the key, in fewer registers.
    test = "(" .. test .. ")" .. (v.eager and " & " or " && ") .. holds
  end
  if bounds ~= "" then heads[f.m.var] = bounds .. (heads[f.m.var] or "") end
  local element = text.fill([[
const int c = ${col};
const int d = d0 + c - (${row});
(void)d;
if (!(${element_test})) ${acc} = FG_NEG_INF;]], {
    col = f.col.elem, row = f.row.elem, element_test = test,
    acc = f.array .. f.index(f.m.var, f.n.var, f.e.var) })
  local s = v.seq or v.params
  local tile = text.fill(tile_test[kind], { p = v.params, s = s, row0 = v.block_row0, key0 = v.block_key0 })
  local predicate_tile = v.full and "!(" .. v.full .. ") || " .. tile or "true"
  return text.fill([[
// mask: ${which} pay for it
// (two registers per tile; every element adds compile-time offsets to them)
if (${tile_test}) {
  const int keys_left = ${s}.seqlen_k - (${key0}) - ${col_lane};
  const int d0 = ${key0} + ${col_lane} - (${row0} + ${row_lane} + ${s}.diag_offset);
  (void)d0;
${terms}${loops}
}
]], { terms = text.indent_code(terms, 2), tile_test = v.predicate and predicate_tile or tile,
      which = v.predicate and "every tile the predicate may not hold on throughout"
              or "only tiles that cross the sequence end or the mask's edge",
      s = s, key0 = v.key0, row0 = v.row0, col_lane = f.col.lane, row_lane = f.row.lane,
      loops = text.indent_code(fragment.loops_with_heads({ f.m, f.n, f.e }, { heads[f.m.var], heads[f.n.var] },
                                                         element), 2) })
end

-- Code that sets i_lo, i_hi: the query rows that may see any key of the
-- thread block's keys n0..n0+BLOCK_N-1 (the backward walks these); seq as
-- in key_range.
function M.query_range(kind, seq)
  local body
  if kind == "none" then
    body = "const int i_lo = 0, i_hi = ${s}.seqlen_q;\n"
  elseif kind == "causal" then
    body = "const int i_lo = max(0, n0 - ${s}.diag_offset), i_hi = ${s}.seqlen_q;\n"
  elseif kind == "window" then
    body = [[
const int i_lo = p.window_right < 0 ? 0 : max(0, n0 - ${s}.diag_offset - p.window_right);
const int i_hi = p.window_left < 0 ? ${s}.seqlen_q
               : min(${s}.seqlen_q, n0 + BLOCK_N - 1 - ${s}.diag_offset + p.window_left + 1);
]]
  else
    error("unknown mask kind '" .. tostring(kind) .. "'")
  end
  return text.fill(body, { s = seq or "p" })
end

return M
