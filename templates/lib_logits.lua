-- The logits: what happens to a score between Q·Kᵀ and the softmax's exp2,
-- and back in the backward. With s = scale·q·k, the spec's variants make
--   t = cap·tanh(s/cap)                (softcap; the cap first)
--       − slope(b,h)·|j − (i + off)|   (alibi; off the mask's diagonal offset)
-- and sinks add exp(sink(h)) to each row's denominator only, as a key with
-- no value. The accumulator holds a score in units of 1/K in base 2,
-- t·log2(e) = a·K: K is scale·log2(e) for raw scores (a = q·k, the scale
-- folded into the softmax's exp2 as before) and cap·log2(e) with softcap
-- (a = tanh(s/cap)); ALiBi subtracts its bias in the same units. So the
-- softmax and the backward's P = exp2(a·K − lse·log2 e) read one factor K
-- (to_log2) whatever the variants, and the cap costs one multiply and a
-- tanh per score. Every family calls these hooks, so a variant is written
-- once:
--   transform   rewrites a fragment of raw scores in place (none if plain)
--   rewrite     one score in place (the decoding step: a slope per row)
--   element     one score held in a C variable, masked or not, with the
--               derivative ∂t/∂s the backward's dS needs
--   row_init    a row's running max and sum before its first key: the sink
--   lse         a row's log-sum-exp from its max and sum
--   sinks_kernel  the backward's gradient of the sinks
-- A score modifier (p.score_mod) takes the place of both: t is the
-- generated fg_score_mod of s (gen/expr_emit.c, emitted from the parsed
-- tree), the accumulator holds t itself (K = log2 e), and the backward
-- multiplies dS by fg_score_mod_ds and, with p.aux_grad, adds dS·∂t/∂read
-- into the float tensors' gradients. A mask predicate (p.mask_mod) hides
-- keys beside the mask (mask_test). Both see the element's indices as a
-- table v.at = { b, h, q, k, seqlen_q, seqlen_k } of C expressions.
-- Masks write -inf after the transform; the backward's derivative of a
-- masked score is 0 (its P is 0 too). No user text reaches the source:
-- expressions arrive as code printed from their trees.
local text = import("lib_text")
local fragment = import("lib_fragment")
local M = {}

local LOG2E = "1.4426950408889634f"
local LN2 = "0.6931471805599453f"

-- Whether the scores are rewritten before the softmax.
function M.transformed(p)
  return p.softcap or p.alibi or p.score_mod
end

-- K: the factor that takes an accumulator element to base 2 (params: the
-- launch arguments' name).
function M.to_log2(p, params)
  if p.score_mod then return LOG2E end
  return params .. (p.softcap and ".softcap_out" or ".scale_log2")
end

-- The arguments the generated functions take after the launch arguments.
local function index_args(at)
  return table.concat({ at.b, at.h, at.q, at.k, at.seqlen_q, at.seqlen_k }, ", ")
end

-- A C bool: the mask predicate at the element (p.mask_mod), or nil.
function M.mask_test(p, params, at)
  if not p.mask_mod then return nil end
  return "fg_mask_mod(" .. params .. ", " .. index_args(at) .. ")"
end

-- An expression split over a fragment's tile (what: "mask" or "score";
-- gen/expr_emit.c's split), its terms computed once per row, key and
-- diagonal the lane holds (lib_fragment's slots and diag). Returns the C
-- lines that fill <what>_diag before the tile's loops; heads, C lines by
-- loop variable, that fill <what>_row and <what>_key with the two rows
-- (keys) of one iteration of their loop at its top (two live at a time);
-- args, the C arguments that pass an element's terms to fg_<what>_mod_at;
-- and diag, { decl = C, fill = function(slot C) giving the C statement },
-- for a kernel that fills the diagonals itself as its loop meets them.
-- f: the fragment; v: params, seq, batch, head, row0 and key0 (C: the warp
-- tile's first row and key), slots (optional: the C slots of an element,
-- { row = , key = , diag = }, where a kernel's own loop walks the fragment
-- with other variables).
function M.tile_terms(what, f, v)
  local lengths = v.seq .. ".seqlen_q, " .. v.seq .. ".seqlen_k"
  local head = v.params .. ", " .. v.batch .. ", " .. v.head
  local row0, key0 = v.row0 .. " + " .. f.row.lane, v.key0 .. " + " .. f.col.lane
  local function q(row) return "(" .. row .. ") + " .. v.params .. ".pos_q" end
  local function k(key) return "(" .. key .. ") + " .. v.params .. ".pos_k" end
  local heads = {}
  local function side(name, slots, index)
    local var = slots.loop.var
    heads[var] = (heads[var] or "") .. text.fill([[
fg_${w}_${name} ${w}_${name}[2];
#pragma unroll
for (int i = 0; i < 2; ++i) ${w}_${name}[i] = fg_${w}_mod_${name}(${head}, ${index}, ${lengths});
]], { w = what, name = name, head = head, lengths = lengths, index = index(slots.elem(var, "i")) })
  end
  side("row", f.row.slots, function(elem) return q(row0 .. " + " .. elem) end)
  side("key", f.col.slots, function(elem) return k(key0 .. " + " .. elem) end)
  local diag = {
    decl = "fg_" .. what .. "_diag " .. what .. "_diag[" .. f.diag.count .. "];  // each from one pair on its diagonal\n",
    fill = function(slot)
      return what .. "_diag[" .. slot .. "] = fg_" .. what .. "_mod_diag(" .. head .. ", "
          .. q(row0 .. " + " .. f.diag.elem("(" .. slot .. ")")) .. ", " .. k(key0) .. ", " .. lengths .. ");"
    end,
  }
  local tile = diag.decl .. "#pragma unroll\nfor (int i = 0; i < " .. f.diag.count .. "; ++i) " .. diag.fill("i") .. "\n"
  local at = v.slots or { row = f.row.slots.bit, key = f.col.slots.bit, diag = f.diag.at }
  local args = what .. "_row[" .. at.row .. "], " .. what .. "_key[" .. at.key .. "], " .. what .. "_diag[" .. at.diag .. "]"
  return tile, heads, args, diag
end

-- lib_mask.apply's predicate for a tile (nil without a mask predicate): a
-- function of the fragment and the warp tile's first row and key (C) that
-- returns tile_terms' lines and heads and a function of an element's row
-- and key (C, within the sequence) giving its C bool. v: params, seq,
-- batch, head.
function M.mask_predicate(p, v)
  if not p.mask_mod then return nil end
  return function(f, row0, key0)
    local tile, heads, args = M.tile_terms("mask", f, { params = v.params, seq = v.seq, batch = v.batch,
                                                        head = v.head, row0 = row0, key0 = key0 })
    return tile, heads, function(row, key)
      local q, k = M.positions(v.params, row, key)
      return "fg_mask_mod_at(" .. v.params .. ", " .. v.batch .. ", " .. v.head .. ", " .. q .. ", " .. k
          .. ", " .. v.seq .. ".seqlen_q, " .. v.seq .. ".seqlen_k, " .. args .. ")"
    end
  end
end

-- The element's query and key as the expressions see them: the tile's
-- indices within the sequence plus the call's positions.
function M.positions(params, q, k)
  return "(" .. q .. ") + " .. params .. ".pos_q", "(" .. k .. ") + " .. params .. ".pos_k"
end

-- Device code: the expressions' tensor reads and functions, tanh on the
-- special-function unit and a head's ALiBi slope
-- in the accumulator's units. Expects lib_device's source.
function M.device(p)
  local parts = {}
  if p.score_mod or p.mask_mod then
    parts[#parts + 1] = [[
// ---- expressions (these lines up to the end mark stand alone) ----
// The expressions' tensors: element (i0, i1, i2) of tensor t (rank indices
// used), 0 outside it; gradients are contiguous over the tensor's sizes.
template <class T, class P>
__device__ __forceinline__ T fg_aux_read(const P& p, int t, int rank, int i0, int i1, int i2) {
  const int* size = p.aux_size + 3 * t;
  const i64* stride = p.aux_stride + 3 * t;
  if ((unsigned)i0 >= (unsigned)size[0] || (rank > 1 && (unsigned)i1 >= (unsigned)size[1]) ||
      (rank > 2 && (unsigned)i2 >= (unsigned)size[2]))
    return T(0);
  // 32-bit offsets: the runtime refuses a tensor whose elements span more
  int at = i0 * (int)stride[0];
  if (rank > 1) at += i1 * (int)stride[1];
  if (rank > 2) at += i2 * (int)stride[2];
  return __ldg((const T*)p.aux_data[t] + at);
}
template <class P>
__device__ __forceinline__ void fg_aux_add(const P& p, int t, int rank, int i0, int i1, int i2, float v) {
  const int* size = p.aux_size + 3 * t;
  if ((unsigned)i0 >= (unsigned)size[0] || (rank > 1 && (unsigned)i1 >= (unsigned)size[1]) ||
      (rank > 2 && (unsigned)i2 >= (unsigned)size[2]) || v == 0.f)
    return;
  int at = i0;
  if (rank > 1) at = at * size[1] + i1;
  if (rank > 2) at = at * size[2] + i2;
  atomicAdd((float*)p.d_aux[t] + at, v);
}
// x % y truncated, 0 where C leaves it undefined (y = 0, INT_MIN % -1)
__device__ __forceinline__ int fg_imod(int x, int y) {
  return (y == 0 || y == -1) ? 0 : x % y;
}
// x / y rounded down (Python's //), 0 for y = 0; INT_MIN / -1 wraps to INT_MIN
__device__ __forceinline__ int fg_ifloordiv(int x, int y) {
  if (y == 0) return 0;
  if (y == -1) return (int)(0u - (unsigned)x);
  const int q = x / y;
  return q - (q * y != x && (x < 0) != (y < 0));
}
// x toward zero as an int; NaN 0, past int32 its nearest end
__device__ __forceinline__ int fg_ftoi(float x) {
  if (x != x) return 0;
  return x >= 2147483648.f ? 2147483647 : x <= -2147483648.f ? -2147483647 - 1 : (int)x;
}
]]
    parts[#parts + 1] = p.expressions .. "// ---- end of expressions ----\n"
  end
  if p.softcap then
    parts[#parts + 1] = [[
// tanh(x), max relative error 2^-11 (PTX ISA tanh.approx.f32)
__device__ __forceinline__ float fast_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
]]
  end
  if p.alibi then
    parts[#parts + 1] = text.fill([[
// slope(b, h)·log2(e) / K: ALiBi's slope of batch row (or sequence) b, head
// h, in the accumulator's units
template <class P> __device__ __forceinline__ float alibi_slope(const P& p, int b, int h) {
  return ((const float*)p.alibi_slopes)[(i64)b * p.alibi_sb + h] * ${log2e} / ${k};
}
]], { log2e = LOG2E, k = M.to_log2(p, "p") })
  end
  return table.concat(parts, "\n")
end

-- C lines setting `out` (a declared float) to the rewritten score of raw x
-- (a C expression) and, with deriv (a C lvalue), ∂t/∂s into it; v: params,
-- d (C float: the key's offset from the diagonal, j − (i + off), formed in
-- float from a per-tile base and per-element constants: an int-to-float
-- conversion per score would take the special-function unit's rate), slope
-- (C: alibi_slope's value), terms (C: tile_terms' arguments of the element,
-- where the tile's terms are computed; the score's value only).
local function element_lines(p, x, v, out, deriv)
  local lines = {}
  if p.score_mod then
    -- sv: the scaled score, which the backward's aux gradients read again
    local args = v.params .. ", sv, " .. index_args(v.at)
    lines[1] = "const float sv = " .. x .. " * " .. v.params .. ".softmax_scale;"
    if v.keep then lines[#lines + 1] = v.keep .. " = sv;" end
    lines[#lines + 1] = v.terms and (out .. " = fg_score_mod_at(" .. args .. ", " .. v.terms .. ");")
        or (out .. " = fg_score_mod(" .. args .. ");")
    if deriv then lines[#lines + 1] = deriv .. " = fg_score_mod_ds(" .. args .. ");" end
    return table.concat(lines, "\n")
  end
  if p.softcap then
    lines[#lines + 1] = out .. " = fast_tanh(" .. x .. " * " .. v.params .. ".softcap_in);"
    if deriv then lines[#lines + 1] = deriv .. " = fmaf(-" .. out .. ", " .. out .. ", 1.f);" end
  else
    lines[#lines + 1] = out .. " = " .. x .. ";"
  end
  if p.alibi then
    lines[#lines + 1] = out .. " = fmaf(-" .. v.slope .. ", fabsf(" .. v.d .. "), " .. out .. ");"
  end
  return table.concat(lines, "\n")
end

-- The indices of a fragment's element (lib_fragment's f) as the
-- expressions see them; v as transform's.
function M.tile_at(p, f, v)
  local q, k = M.positions(v.params, v.row0 .. " + " .. f.row.lane .. " + " .. f.row.elem,
                          v.key0 .. " + " .. f.col.lane .. " + " .. f.col.elem)
  return { b = v.batch, h = v.head, q = q, k = k, seqlen_q = v.seq .. ".seqlen_q",
           seqlen_k = v.seq .. ".seqlen_k" }
end

-- The backward's gradients of the float tensors a score modifier reads
-- ("" without): ds, dL/dt of the element (a C float, 0 where hidden), sv
-- the scaled score element() or keep held (C), at its indices.
function M.aux_grad(p, params, ds, sv, at)
  if not p.aux_grad then return "" end
  return "if (" .. ds .. " != 0.f) fg_score_mod_grad(" .. ds .. ", " .. params .. ", " .. sv .. ", "
      .. index_args(at) .. ");"
end

-- The slope's declaration for a tile (lines; "" without ALiBi). v: params,
-- batch and head (C).
function M.tile_setup(p, v)
  if not p.alibi then return "" end
  return "const float slope = alibi_slope(" .. v.params .. ", " .. v.batch .. ", " .. v.head .. ");"
end

-- Rewrite a warp's tile of raw scores in place ("" when plain). f describes
-- the accumulator (lib_fragment.lua); v: params, seq (the lengths' struct,
-- for the diagonal), row0 and key0 (the warp tile's first query row and
-- key), batch and head (C, ALiBi's slope and the expressions' b and h),
-- deriv (an array shaped as f's, to hold ∂t/∂s; the backward's, with
-- softcap or a score modifier), keep (an array shaped as f's, to hold the
-- scaled score for aux_grad), per_element (a score modifier computed whole
-- per element, not from its terms per row, key and diagonal: fewer
-- registers live, more loads).
function M.transform(p, f, v)
  if not M.transformed(p) then return "" end
  local at_elem = f.index(f.m.var, f.n.var, f.e.var)
  local acc = f.array .. at_elem
  -- a score modifier's terms once per row, key and diagonal of the lane
  -- (a relative bias read once per diagonal); its derivative per element
  local terms, heads, terms_args = "", {}, nil
  if p.score_mod and not v.per_element then
    terms, heads, terms_args = M.tile_terms("score", f, v)
  end
  local body = M.rewrite(p, acc, {
    params = v.params, slope = "slope", d = "d0 + (float)(" .. f.col.elem .. " - (" .. f.row.elem .. "))",
    at = M.tile_at(p, f, v), keep = v.keep and (v.keep .. at_elem), terms = terms_args },
    v.deriv and (v.deriv .. at_elem))
  local setup = M.tile_setup(p, v) .. terms
  if p.alibi then
    setup = setup .. text.fill([[

const float d0 = (float)(${key0} + ${col_lane} - (${row0} + ${row_lane} + ${s}.diag_offset));]], {
      key0 = v.key0, col_lane = f.col.lane, row0 = v.row0, row_lane = f.row.lane, s = v.seq })
  end
  local loops = fragment.loops_with_heads({ f.m, f.n, f.e }, { heads[f.m.var], heads[f.n.var] }, body)
  return "// logits: t = " .. M.formula(p) .. ", in units of 1/K\n{\n"
      .. text.indent_code(setup .. "\n" .. loops, 2) .. "\n}\n"
end

-- One unmasked score x (a C lvalue) rewritten in place, and where the
-- variants bend the scores (has_derivative)
-- and deriv (a C lvalue) ∂t/∂s into deriv. v as element's.
function M.rewrite(p, x, v, deriv)
  return "{\n  float a;\n" .. text.indent(element_lines(p, x, v, "a", M.has_derivative(p) and deriv or nil), 2)
      .. "\n  " .. x .. " = a;\n}"
end

-- One score: lines that declare `a`, raw x rewritten (x itself when plain),
-- and where they bend the scores and with deriv (a declared C float) set
-- deriv to ∂t/∂s; a
-- masked x (-inf) stays -inf, its derivative 0. v: params, d (C), slope (C;
-- with ALiBi).
function M.element(p, x, v, deriv)
  if not M.transformed(p) then return "const float a = " .. x .. ";" end
  local lines = "float a;\n" .. element_lines(p, x, v, "a", M.has_derivative(p) and deriv or nil)
  -- tanh(-inf) is -1: a masked score must stay -inf (and its derivative 0)
  local guard = "if (" .. x .. " == FG_NEG_INF) {\n  a = FG_NEG_INF;"
  if deriv and M.has_derivative(p) then guard = guard .. "\n  " .. deriv .. " = 0.f;" end
  return lines .. "\n" .. guard .. "\n}"
end

-- Whether dS needs ∂t/∂s (the cap and a score modifier bend the scores;
-- ALiBi only shifts them).
function M.has_derivative(p)
  return p.softcap or p.score_mod
end

-- The formula as a comment says it.
function M.formula(p)
  if p.score_mod then return "score_mod(s, b, h, q, k)" end
  local t = p.softcap and "cap·tanh(s/cap)" or "s"
  if p.alibi then t = t .. " − slope·|j − (i + off)|" end
  return t
end

-- A row's running max and sum before its first key: -inf and 0, or with
-- sinks the sink (in the accumulator's units) and 1 on the row's first lane
-- (the lanes' sums are added at the end). v: params, head (C), max and sum
-- (C lvalues), first_lane (C: whether this lane counts the sink), takes
-- (C, optional: whether this row's state takes the sink at all; a row split
-- over several states takes it in one).
function M.row_init(p, v)
  if not p.sinks then
    return v.max .. " = FG_NEG_INF;\n" .. v.sum .. " = 0.f;"
  end
  local units = p.score_mod and ""
      or p.softcap and (" * " .. LOG2E .. " / " .. M.to_log2(p, v.params))
      or (" / " .. v.params .. ".softmax_scale")
  local sink = "((const float*)" .. v.params .. ".sinks)[" .. v.head .. "]" .. units
  if v.takes then
    return text.fill([[
${max} = ${takes} ? ${sink} : FG_NEG_INF;  // the sink: a key with no value
${sum} = ${takes} && ${first_lane} ? 1.f : 0.f;]], {
      max = v.max, sum = v.sum, sink = sink, takes = v.takes, first_lane = v.first_lane })
  end
  return text.fill([[
${max} = ${sink};  // the sink: a key with no value
${sum} = ${first_lane} ? 1.f : 0.f;]], { max = v.max, sum = v.sum, sink = sink, first_lane = v.first_lane })
end

-- The natural-log lse of a row from its max (accumulator units) and sum.
function M.lse(p, params, max, sum)
  if p.score_mod then return max .. " + logf(" .. sum .. ")" end
  local to_ln = p.softcap and (M.to_log2(p, params) .. " * " .. LN2) or (params .. ".softmax_scale")
  return max .. " * " .. to_ln .. " + logf(" .. sum .. ")"
end

-- The backward's NAME_sinks kernel (p.sinks): dσ_h = −Σ e^(σ_h − lse)·D over
-- head h's rows, one thread block per head, summed in a fixed order. v: name
-- (the module's), params (struct), varlen.
function M.sinks_kernel(v)
  local rows = v.varlen
      and "const int batch = 1, seqlen = min(max(((const int*)p.cu_seqlens_q)[p.batch], 0), p.total_q);\n"
          .. "  const i64 first = (i64)h * p.total_q, stride = 0;  // (Hq, total_q)"
      or "const int batch = p.batch, seqlen = p.seqlen_q;\n"
          .. "  const i64 first = (i64)h * p.seqlen_q, stride = (i64)p.heads_q * p.seqlen_q;  // (B, Hq, Sq)"
  local source = text.fill([[
// dσ_h = −Σ_(b,i) e^(σ_h − lse)·D: each thread a fixed share of head h's
// rows, then a fixed tree (the same bits every run): each warp's by shuffles,
// then the 8 warps' sums in order (32 bytes of static shared memory: a
// module's compile report counts its kernels' largest beside the main one's)
extern "C" __global__ void __launch_bounds__(256) ${name}_sinks(const ${params} p) {
  __shared__ float part[8];
  const int h = blockIdx.x;
  if (!p.d_sinks) return;
  ${rows}
  const float sink = ((const float*)p.sinks)[h];
  float acc = 0.f;
  for (int b = 0; b < batch; ++b)
    for (int i = threadIdx.x; i < seqlen; i += 256) {
      const i64 row = first + b * stride + i;
      acc -= expf(sink - ((const float*)p.lse)[row]) * ((const float*)p.delta)[row];
    }
  for (int n = 16; n > 0; n >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, n);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = part[0];
    for (int w = 1; w < 8; ++w) sum += part[w];
    ((float*)p.d_sinks)[h] = sum;
  }
}
]], { name = v.name, params = v.params, rows = rows })
  local launch = { entry = v.name .. "_sinks", threads = 256, smem = 0, grid = { { "heads_q" } } }
  return { source = source, launch = launch }
end

return M
