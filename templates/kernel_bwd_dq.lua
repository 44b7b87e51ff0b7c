-- The backward's NAME_post kernel: dQ = scale · Σ slices of the fp32
-- accumulator the main kernel added to, summed in a fixed order and stored in
-- the input dtype, and store_dq4, which stores four of a row's columns so.
-- kernel_bwd_sm80.lua and kernel_bwd_sm90a.lua put them into the backward's
-- module.
-- Expects HEAD_DIM, HEAD_DIM_PADDED, the launch arguments' struct (with the
-- fields of fg_bwd_params) and pack2 (the target's prelude).
local text = import("lib_text")
local epilogue = import("lib_epilogue")
local sequence = import("lib_seq")

local kernel = [[
// Columns col4..col4 + 3 of a dQ row, x · scale in the input dtype, at out.
__device__ __forceinline__ void store_dq4(u16* out, int col4, float4 x, float scale) {
  const float xs[4] = {x.x * scale, x.y * scale, x.z * scale, x.w * scale};
#pragma unroll
  for (int pair = 0; pair < 2; ++pair) {
    const int col = col4 + 2 * pair;
    const float x0 = xs[2 * pair], x1 = xs[2 * pair + 1];
${output_store}
  }
}

extern "C" __global__ void __launch_bounds__(${threads}) ${name}_post(const ${params} p) {
${start}  // ROWS consecutive rows (b, h, i) a warp, four columns a lane (PASSES of
  // 32 fours where a row has more): the rows' place worked out once a warp
  // (divisions by the call's sizes: before, a thread's for each four
  // columns) and their loads in flight together, as one a thread left the
  // kernel short of the memory's rate
  constexpr int ROWS = ${rows}, C4 = HEAD_DIM_PADDED / 4, PASSES = (C4 + 31) / 32;
  const int batch = ${batch}, seqlen = ${seqlen}, lane = threadIdx.x % 32;
  const i64 rows = (i64)batch * p.heads_q * seqlen;
  const i64 row0 = ((i64)blockIdx.x * (${threads} / 32) + threadIdx.x / 32) * ROWS;
  if (row0 >= rows) return;
  int i = (int)(row0 % seqlen);
  const i64 bh = row0 / seqlen;
  int h = (int)(bh % p.heads_q), b = (int)(bh / p.heads_q);
  const float* const acc = (const float*)p.dq_accum + row0 * HEAD_DIM_PADDED;
  float4 x[ROWS][PASSES];
#pragma unroll
  for (int u = 0; u < ROWS; ++u)
#pragma unroll
    for (int c = 0; c < PASSES; ++c)
      if (row0 + u < rows && 4 * (lane + 32 * c) < HEAD_DIM)
        x[u][c] = *(const float4*)(acc + u * HEAD_DIM_PADDED + 4 * (lane + 32 * c));  // 16-byte aligned
  for (int s = 1; s < p.dq_slices; ++s)  // a fixed order: deterministic
#pragma unroll
    for (int u = 0; u < ROWS; ++u)
#pragma unroll
      for (int c = 0; c < PASSES; ++c)
        if (row0 + u < rows && 4 * (lane + 32 * c) < HEAD_DIM) {
          const float4 a = *(const float4*)(acc + s * p.dq_slice + u * HEAD_DIM_PADDED + 4 * (lane + 32 * c));
          x[u][c].x += a.x, x[u][c].y += a.y, x[u][c].z += a.z, x[u][c].w += a.w;
        }
#pragma unroll
  for (int u = 0; u < ROWS; ++u) {
    if (row0 + u >= rows) break;
    u16* const out = (u16*)p.dq + b * p.dq_sb + h * p.dq_sh + (i64)i * p.dq_ss;
#pragma unroll
    for (int c = 0; c < PASSES; ++c)
      if (4 * (lane + 32 * c) < HEAD_DIM)
        store_dq4(out, 4 * (lane + 32 * c), x[u][c], p.softmax_scale);
    if (++i == seqlen) {  // the next (batch, head)
      i = 0;
      if (++h == p.heads_q) h = 0, ++b;
    }
  }
}
]]

local THREADS = 256
local ROWS = 8  -- rows a warp

-- p: name (the module's NAME), head_dim, head_dim_padded, varlen
-- (lib_seq.rows: which rows; packed, those after the last sequence, which
-- nothing added to, get zeros), params (the launch arguments' struct,
-- fg_bwd_params unless named) and gate (a field of them, 0 or 1, the grid
-- multiplied by it; none unless named) and start (device code each thread
-- runs first: sm_90a's grid_wait_prior, the launch then a programmatic
-- dependent of the main kernel). Returns the kernel's source and its launch:
-- a warp per ROWS rows (the padded head dim is a multiple of 16, and every
-- slice starts 16-byte aligned, as its float4 loads ask).
return function(p)
  local rows = sequence.rows(p)
  local source = text.fill(kernel, { name = p.name, threads = THREADS, rows = ROWS,
                                     params = p.params or "fg_bwd_params",
                                     start = p.start and "  " .. p.start .. "\n" or "",
                                     batch = rows.batch, seqlen = rows.seqlen,
                                     output_store = text.indent(epilogue.output_store(p), 4) })
  local grid = { table.unpack(rows.fields) }
  grid.scale, grid.per = 1, THREADS // 32 * ROWS
  local launch = { entry = p.name .. "_post", threads = THREADS, smem = 0, programmatic = p.start and 1 or 0,
                   grid = { grid, p.gate and { p.gate } } }
  return { source = source, launch = launch }
end
