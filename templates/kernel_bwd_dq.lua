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
${start}  // four columns of a row (b, h, i) a thread: 16-byte loads, and few threads,
  // as a thread's index arithmetic costs more than its loads
  const int batch = ${batch}, seqlen = ${seqlen};
  const i64 rows = (i64)batch * p.heads_q * seqlen;
  const i64 idx = (i64)blockIdx.x * ${threads} + threadIdx.x;
  const i64 row = idx / (HEAD_DIM_PADDED / 4);
  const int col4 = (int)(idx % (HEAD_DIM_PADDED / 4)) * 4;
  if (row >= rows || col4 >= HEAD_DIM) return;
  const float* acc = (const float*)p.dq_accum + row * HEAD_DIM_PADDED + col4;  // 16-byte aligned
  float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s = 0; s < p.dq_slices; ++s) {  // a fixed order: deterministic
    const float4 a = *(const float4*)(acc + s * p.dq_slice);
    x.x += a.x, x.y += a.y, x.z += a.z, x.w += a.w;
  }
  const int i = (int)(row % seqlen);
  const i64 bh = row / seqlen;
  const int h = (int)(bh % p.heads_q), b = (int)(bh / p.heads_q);
  store_dq4((u16*)p.dq + b * p.dq_sb + h * p.dq_sh + (i64)i * p.dq_ss, col4, x, p.softmax_scale);
}
]]

local THREADS = 256

-- p: name (the module's NAME), head_dim, head_dim_padded, varlen
-- (lib_seq.rows: which rows; packed, those after the last sequence, which
-- nothing added to, get zeros), params (the launch arguments' struct,
-- fg_bwd_params unless named) and gate (a field of them, 0 or 1, the grid
-- multiplied by it; none unless named) and start (device code each thread
-- runs first: sm_90a's grid_wait_prior, the launch then a programmatic
-- dependent of the main kernel). Returns the kernel's source and its launch:
-- a thread per four columns of every row (the padded head dim is a multiple
-- of 16, and every slice starts 256-byte aligned).
return function(p)
  local rows = sequence.rows(p)
  local source = text.fill(kernel, { name = p.name, threads = THREADS,
                                     params = p.params or "fg_bwd_params",
                                     start = p.start and "  " .. p.start .. "\n" or "",
                                     batch = rows.batch, seqlen = rows.seqlen,
                                     output_store = text.indent(epilogue.output_store(p), 4) })
  local grid = { table.unpack(rows.fields) }
  grid.scale, grid.per = p.head_dim_padded // 4, THREADS
  local launch = { entry = p.name .. "_post", threads = THREADS, smem = 0, programmatic = p.start and 1 or 0,
                   grid = { grid, p.gate and { p.gate } } }
  return { source = source, launch = launch }
end
