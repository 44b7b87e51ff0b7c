-- The backward's NAME_pre kernel: D = rowsum(dO ∘ O) per query row (b, h, i),
-- in fp32, for the main kernel's dS = P ∘ (dP − D). Eight lanes per row;
-- 16-byte loads when rows allow. kernel_bwd_sm80.lua puts it into the
-- backward's module (and kernel_bwd_sm90a.lua into its). Expects HEAD_DIM
-- (or the width's macro), the launch arguments' struct, u128 and to_float
-- (lib_device.lua).
local text = import("lib_text")
local sequence = import("lib_seq")

local THREADS = 256
local ROWS = THREADS // 8  -- rows per thread block: eight lanes per row

-- p: name (the module's NAME), head_dim, varlen (lib_seq.rows: which rows),
-- params (the launch arguments' struct, fg_bwd_params unless named),
-- width (lib_width.lua: O's and dO's rows; default the head dim's) and start
-- (device code each thread runs first: sm_90a's grid_let_next_start, so that
-- the main kernel's blocks may wait beside this one's last). Returns the
-- kernel's source and its launch: one thread block per ROWS rows (b, h, i).
return function(p)
  local rows = sequence.rows(p)
  local dim, name = p.head_dim, "HEAD_DIM"
  if p.width then dim, name = p.width.dim, p.width.name end
  local dot = (dim % 8 == 0 and [[
    for (int c = l8 * 8; c < HEAD_DIM; c += 64) {
      const u128 x = *(const u128*)(o + c), y = *(const u128*)(d + c);
      const u32 xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
      for (int w = 0; w < 4; ++w)
        acc += to_float((u16)(xs[w] & 0xffffu)) * to_float((u16)(ys[w] & 0xffffu)) +
               to_float((u16)(xs[w] >> 16)) * to_float((u16)(ys[w] >> 16));
    }]] or [[
    for (int c = l8; c < HEAD_DIM; c += 8) acc += to_float(o[c]) * to_float(d[c]);]]):gsub("HEAD_DIM", name)
  local source = text.fill([[
extern "C" __global__ void __launch_bounds__(${threads}) ${name}_pre(const ${params} p) {
${start}  const int batch = ${batch}, seqlen = ${seqlen};
  const i64 rows = (i64)batch * p.heads_q * seqlen;  // (b, h, i) in that order
  const i64 row = (i64)blockIdx.x * ${rows} + (threadIdx.x >> 3);
  const int l8 = threadIdx.x & 7;
  float acc = 0.f;
  if (row < rows) {
    const int i = (int)(row % seqlen);
    const i64 bh = row / seqlen;
    const int h = (int)(bh % p.heads_q), b = (int)(bh / p.heads_q);
    const u16* o = (const u16*)p.o + b * p.o_sb + h * p.o_sh + (i64)i * p.o_ss;
    const u16* d = (const u16*)p.d_o + b * p.do_sb + h * p.do_sh + (i64)i * p.do_ss;
${dot}
  }
  acc += __shfl_xor_sync(0xffffffffu, acc, 4);
  acc += __shfl_xor_sync(0xffffffffu, acc, 2);
  acc += __shfl_xor_sync(0xffffffffu, acc, 1);
  if (row < rows && l8 == 0) ((float*)p.delta)[row] = acc;
}
]], { name = p.name, dot = dot, threads = THREADS, rows = ROWS, start = p.start and "  " .. p.start .. "\n" or "",
       params = p.params or "fg_bwd_params", batch = rows.batch, seqlen = rows.seqlen })
  local grid = { table.unpack(rows.fields) }
  grid.per = ROWS
  local launch = { entry = p.name .. "_pre", threads = THREADS, smem = 0, grid = { grid } }
  return { source = source, launch = launch }
end
