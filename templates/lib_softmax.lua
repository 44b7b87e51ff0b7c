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
-- done. Expects fast_exp2 and FG_NEG_INF (lib_device.lua).
local text = import("lib_text")
local fragment = import("lib_fragment")
local M = {}

local row_update = [[
float mx = ${m};
${max_loop}
${max_shuffles}
// a row that has seen no key yet keeps m = -inf; exponentiate against 0
const float base = mx == FG_NEG_INF ? 0.f : mx * ${to_log2};
const float alpha = fast_exp2(${m} * ${to_log2} - base);
${m} = mx;
float sum = 0.f;
${exp_loop}
${l} = ${l} * alpha + sum;
${rescale_loop}]]

local exp_pair = [[
const float e0 = fast_exp2(fmaf(${x0}, ${to_log2}, -base));
const float e1 = fast_exp2(fmaf(${x1}, ${to_log2}, -base));
${x0} = e0;
${x1} = e1;
sum += e0 + e1;]]

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
  local body = text.fill(row_update, {
    m = v.row_max .. s.row_index, l = v.row_sum .. s.row_index, to_log2 = v.to_log2,
    max_loop = fragment.loops({ s.n }, "mx = fmaxf(mx, fmaxf(" .. x0 .. ", " .. x1 .. "));"),
    max_shuffles = table.concat(shuffles, "\n"),
    exp_loop = fragment.loops({ s.n }, text.fill(exp_pair, { x0 = x0, x1 = x1, to_log2 = v.to_log2 })),
    rescale_loop = v.alpha and (v.alpha .. s.row_index .. " = alpha;") or rescale_loop(o, "alpha"),
  })
  return "// online softmax in base 2: m = rowmax(S), P = exp2(S·scale·log2e − m'),\n"
      .. "// O and the row sum rescaled once per tile by exp2(m_old − m_new)\n"
      .. fragment.loops({ s.m, s.r }, body)
end

-- O *= alpha per row, the factors update kept in v.alpha.
function M.rescale(o, v)
  return fragment.loops({ o.m, o.r }, rescale_loop(o, v.alpha .. o.row_index))
end

return M
