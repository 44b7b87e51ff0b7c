-- The forward's online softmax, in base 2: per key tile, each row's running
-- maximum m and sum l are updated, the scores become P = exp2(S·to_log2
-- − m') in place, and O and l are rescaled once by exp2(m_old − m_new).
-- Emits update(s, o, v): C lines with no final newline, pragmas at column 0
-- (insert with lib_text's indent_code). s and o describe the score and
-- output accumulators (lib_fragment.lua; they must share their rows). v:
-- to_log2 (C: what takes a score to base 2, lib_logits.to_log2), row_max and row_sum
-- (the per-row state arrays, subscripted by s.row_index). With v.alpha (a
-- per-row array like them) the rescale factors are kept there instead and
-- O is left alone, for rescale(o, v) to apply once O's pending MMAs are
-- done. With v.max_slack (a number, in log2 units; with v.alpha) a row's
-- maximum moves only where a score passes it by more than 2^max_slack: P
-- then stays below 2^max_slack, and in the tiles where no maximum moves
-- alpha is exactly 1 and rescale skips O. O / l and the log-sum-exp are
-- unchanged.
-- Expects fast_exp2 and FG_NEG_INF (lib_device.lua).
local text = import("lib_text")
local fragment = import("lib_fragment")
local M = {}

local row_update = [[
float mx = ${m};
${max_loop}
${max_shuffles}
${move}
float sum = 0.f;
${exp_loop}
${l} = ${l} * alpha + sum;
${rescale_loop}]]

-- m' = the row's new maximum, base = m'·to_log2, alpha = exp2(m·to_log2 − base)
local move_always = [[
// a row that has seen no key yet keeps m = -inf; exponentiate against 0
const float base = mx == FG_NEG_INF ? 0.f : mx * ${to_log2};
const float alpha = fast_exp2(${m} * ${to_log2} - base);
${m} = mx;]]

local move_past_slack = [[
// m moves only where a score passes it by more than 2^${slack}: else alpha = 1
const bool moved = mx * ${to_log2} > ${m} * ${to_log2} + ${slack}.f;
const float m_new = moved ? mx : ${m};
const float base = m_new == FG_NEG_INF ? 0.f : m_new * ${to_log2};
const float alpha = moved ? fast_exp2(${m} * ${to_log2} - base) : 1.f;
${m} = m_new;]]

local exp_pair = [[
const float e0 = fast_exp2(fmaf(${x0}, ${to_log2}, -base));
const float e1 = fast_exp2(fmaf(${x1}, ${to_log2}, -base));
${x0} = e0;
${x1} = e1;
sum += e0 + e1;]]

-- O's row times alpha
local function rescale_loop(o, alpha)
  local y0, y1 = o.array .. o.row_elems[1], o.array .. o.row_elems[2]
  return fragment.loops({ o.n }, y0 .. " *= " .. alpha .. ";\n" .. y1 .. " *= " .. alpha .. ";")
end

function M.update(s, o, v)
  if s.row_index ~= o.row_index or s.m.var ~= o.m.var or s.r.var ~= o.r.var then
    error("softmax: the score and output fragments must share their rows", 2)
  end
  local x0, x1 = s.array .. s.row_elems[1], s.array .. s.row_elems[2]
  local shuffles = {}
  for _, lanes in ipairs(s.row_lanes) do
    shuffles[#shuffles + 1] = "mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, " .. lanes .. "));"
  end
  local m = v.row_max .. s.row_index
  if v.max_slack and (math.type(v.max_slack) ~= "integer" or v.max_slack < 1 or v.max_slack > 16) then
    error("softmax: max_slack must be an integer in 1..16 (P < 2^max_slack)", 2)
  end
  if v.max_slack and not v.alpha then
    error("softmax: max_slack needs alpha (rescale skips O, once per warp)", 2)
  end
  local move = v.max_slack
      and text.fill(move_past_slack, { m = m, to_log2 = v.to_log2, slack = tostring(v.max_slack) })
      or text.fill(move_always, { m = m, to_log2 = v.to_log2 })
  local body = text.fill(row_update, {
    m = m, l = v.row_sum .. s.row_index, to_log2 = v.to_log2, move = move,
    max_loop = fragment.loops({ s.n }, "mx = fmaxf(mx, fmaxf(" .. x0 .. ", " .. x1 .. "));"),
    max_shuffles = table.concat(shuffles, "\n"),
    exp_loop = fragment.loops({ s.n }, text.fill(exp_pair, { x0 = x0, x1 = x1, to_log2 = v.to_log2 })),
    rescale_loop = v.alpha and (v.alpha .. s.row_index .. " = alpha;") or rescale_loop(o, "alpha"),
  })
  return "// online softmax in base 2: m = rowmax(S), P = exp2(S·scale·log2e − m'),\n"
      .. "// O and the row sum rescaled once per tile by exp2(m_old − m_new)\n"
      .. fragment.loops({ s.m, s.r }, body)
end

-- O *= alpha per row, the factors update kept in v.alpha. With max_slack
-- a warp skips it where none of its rows' factors differs from 1 (every
-- lane calls it): one warp-uniform branch, which leaves the code before it
-- (P's packing, say) in the exponentials' shadow, where a branch per row
-- split it off.
function M.rescale(o, v)
  local alpha = v.alpha .. o.row_index
  local loops = fragment.loops({ o.m, o.r }, rescale_loop(o, alpha))
  if not v.max_slack then return loops end
  return "bool moved = false;\n"
      .. fragment.loops({ o.m, o.r }, "moved |= " .. alpha .. " != 1.f;") .. "\n"
      .. "if (__any_sync(0xffffffffu, moved)) {\n" .. loops .. "\n}"
end

return M
