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
${start}  // ROWS consecutive rows (b, h, i) a warp, in pieces of W columns: a lane
  // takes pieces lane, lane + 32, ... of the rows' ROWS·PIECES, their loads
  // in flight together, and where W = 8 stores each as one 16 bytes (four
  // bytes a store left the kernel 7% longer). The rows' place is worked out
  // once a warp (divisions by the call's sizes) and moved on from there
  constexpr int ROWS = ${rows}, W = ${piece}, PIECES = HEAD_DIM_PADDED / W;
  constexpr int ITEMS = (ROWS * PIECES + 31) / 32;
  const int batch = ${batch}, seqlen = ${seqlen}, lane = threadIdx.x % 32;
  const i64 rows = (i64)batch * p.heads_q * seqlen;
  const i64 row0 = ((i64)blockIdx.x * (${threads} / 32) + threadIdx.x / 32) * ROWS;
  if (row0 >= rows) return;
  const float* const acc = (const float*)p.dq_accum + row0 * HEAD_DIM_PADDED;
  float4 x[ITEMS][W / 4];
  bool on[ITEMS];
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int item = lane + 32 * k, u = item / PIECES, c = item % PIECES;
    on[k] = item < ROWS * PIECES && row0 + u < rows && W * c < HEAD_DIM;
#pragma unroll
    for (int q = 0; q < W / 4; ++q)
      if (on[k]) x[k][q] = *(const float4*)(acc + u * HEAD_DIM_PADDED + W * c + 4 * q);  // 16-byte aligned
  }
  for (int s = 1; s < p.dq_slices; ++s)  // a fixed order: deterministic
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int item = lane + 32 * k, u = item / PIECES, c = item % PIECES;
#pragma unroll
      for (int q = 0; q < W / 4; ++q)
        if (on[k]) {
          const float4 a = *(const float4*)(acc + s * p.dq_slice + u * HEAD_DIM_PADDED + W * c + 4 * q);
          x[k][q].x += a.x, x[k][q].y += a.y, x[k][q].z += a.z, x[k][q].w += a.w;
        }
    }
  // 16-byte stores where dQ's start and strides allow them
  const bool wide = W == 8 && ((p.dq & 15) | ((u64)(p.dq_sb | p.dq_sh | p.dq_ss) & 7)) == 0;
  (void)wide;
  const int i0 = (int)(row0 % seqlen);
  const i64 bh0 = row0 / seqlen;
  const int h0 = (int)(bh0 % p.heads_q), b0 = (int)(bh0 / p.heads_q);
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    if (!on[k]) continue;
    const int item = lane + 32 * k, u = item / PIECES, c = item % PIECES;
    int i = i0 + u, h = h0, b = b0;
    while (i >= seqlen) {  // into the next (batch, head)
      i -= seqlen;
      if (++h == p.heads_q) h = 0, ++b;
    }
    u16* const out = (u16*)p.dq + b * p.dq_sb + h * p.dq_sh + (i64)i * p.dq_ss;
${store}
  }
}
]]

local THREADS = 256
-- a lane's piece of a row: 8 columns (one 16-byte store) where the head dim
-- is a multiple of 8, else 4
local STORE8 = [[
    if (wide) {
      const float sc = p.softmax_scale;
      // as PTX: the compiler, seeing both branches store the same words,
      // merged them into the narrow stores
      asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(out + W * c),
                   "r"(pack2(x[k][0].x * sc, x[k][0].y * sc)), "r"(pack2(x[k][0].z * sc, x[k][0].w * sc)),
                   "r"(pack2(x[k][1].x * sc, x[k][1].y * sc)), "r"(pack2(x[k][1].z * sc, x[k][1].w * sc))
                   : "memory");
    } else {
      store_dq4(out, W * c, x[k][0], p.softmax_scale);
      store_dq4(out, W * c + 4, x[k][1], p.softmax_scale);
    }]]
local STORE4 = "    store_dq4(out, W * c, x[k][0], p.softmax_scale);"
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
                                     piece = p.head_dim % 8 == 0 and 8 or 4,
                                     store = p.head_dim % 8 == 0 and STORE8 or STORE4,
                                     batch = rows.batch, seqlen = rows.seqlen,
                                     output_store = text.indent(epilogue.output_store(p), 4) })
  local grid = { table.unpack(rows.fields) }
  grid.scale, grid.per = 1, THREADS // 32 * ROWS
  local launch = { entry = p.name .. "_post", threads = THREADS, smem = 0, programmatic = p.start and 1 or 0,
                   grid = { grid, p.gate and { p.gate } } }
  return { source = source, launch = launch }
end
