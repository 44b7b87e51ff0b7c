-- Forward attention: O = softmax(Q·Kᵀ·scale)·V and the row log-sum-exp,
-- one thread block per (query block, head, batch), K/V streamed through
-- shared memory, S and O in registers, one online-softmax rescale per key tile.
-- The same kernel serves sm_75, through isa_sm75's pairs of m16n8k8 MMAs.
local text = import("lib_text")
local device = import("lib_device")
local fragment = import("lib_fragment")
local mask = import("lib_mask")
local softmax = import("lib_softmax")
local logits = import("lib_logits")
local dropout = import("lib_dropout")
local sparse = import("lib_sparse")
local sequence = import("lib_seq")
local tile_io = import("lib_tile_io")
local epilogue = import("lib_epilogue")
local width = import("lib_width")
local isa_for = import("isa")

local kernel = [[
extern "C" __global__ void __launch_bounds__(THREADS, 1) ${name}(const fg_fwd_params p) {
  extern __shared__ u128 smem[];
  u16* const smem16 = reinterpret_cast<u16*>(smem);
  // shared-memory addresses: Q [BLOCK_M][SMEM_ROW], K and V [BLOCK_N][SMEM_ROW]${v_rows}
  const u32 sQ = smem_addr(smem16);
  const u32 sK = sQ + BLOCK_M * SMEM_ROW * 2;
  const u32 sV = sK + BLOCK_N * SMEM_ROW * 2;
  (void)smem16;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  ${lanes}    // MMA fragment row group and column pair
  const int warp_row = warp * M_TILES * 16; // first row of this warp in the block
  // This lane's ldmatrix row address in each operand; the unrolled loops add
  // compile-time offsets. Q and K: rows of 16-bit values along the head dim;
  // V is read transposed (keys along rows).
  const u32 q_frag = sQ + ((warp_row + (lane & 15)) * SMEM_ROW + (lane >> 4) * 8) * 2;
  const u32 k_frag = sK + (((lane & 7) + (lane >> 4) * 8) * SMEM_ROW + ((lane >> 3) & 1) * 8) * 2;
  const u32 v_frag = sV + (((lane & 7) + ((lane >> 3) & 1) * 8) * ${v_row} + (lane >> 4) * 8) * 2;

${block}
  const u16* gQ = (const u16*)p.q + seq.q_at(p.q_sb, p.q_ss, row0) + h * p.q_sh;
  const u16* gK = (const u16*)p.k + seq.k_at(p.k_sb, p.k_ss, 0) + hk * p.k_sh;
  const u16* gV = (const u16*)p.v + seq.k_at(p.v_sb, p.v_ss, 0) + hk * p.v_sh;

  int it = tiles.next(0);

  // Q (BLOCK_M x d) and the first K tile in flight
  load_tile<BLOCK_M>(sQ, gQ, p.q_ss, rows_valid, tid);
  if (it < tiles.count) {
    const int n0 = tiles.at(it) * BLOCK_N;
    load_tile<BLOCK_N>(sK, gK + (i64)n0 * p.k_ss, p.k_ss, seq.seqlen_k - n0, tid);
  }
  copy_commit();

  float acc_o[M_TILES][N_TILES_O][4];       // O rows (g, g+8) x columns (2t, 2t+1) per 8-column tile
  float row_max[M_TILES][2], row_sum[M_TILES][2];
#pragma unroll
  for (int mt = 0; mt < M_TILES; ++mt) {
#pragma unroll
    for (int dn = 0; dn < N_TILES_O; ++dn)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_o[mt][dn][e] = 0.f;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
${row_init}
    }
  }

  while (it < tiles.count) {
    const int n0 = tiles.at(it) * BLOCK_N;
    copy_wait_all();
    __syncthreads();  // K tile (and Q) landed; V of the last tile is no longer read
    ${v_load}<BLOCK_N>(sV, gV + (i64)n0 * p.v_ss, p.v_ss, seq.seqlen_k - n0, tid);
    copy_commit();
${drop_draw}
    // S = Q·Kᵀ (BLOCK_M x BLOCK_N), fp32
    float acc_s[M_TILES][N_TILES_S][4];
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
      for (int nt = 0; nt < N_TILES_S; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_s[mt][nt][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < HEAD_DIM_PADDED / 16; ++ks) {
      u32 a[M_TILES][4];
#pragma unroll
      for (int mt = 0; mt < M_TILES; ++mt)
        ldmatrix_x4(a[mt], q_frag + (mt * 16 * SMEM_ROW + ks * 16) * 2);
#pragma unroll
      for (int np = 0; np < N_TILES_S / 2; ++np) {
        u32 bk[4];  // two 8-key tiles x 16 dims
        ldmatrix_x4(bk, k_frag + (np * 16 * SMEM_ROW + ks * 16) * 2);
#pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt) {
          mma_16x8x16(acc_s[mt][2 * np], a[mt], bk[0], bk[1]);
          mma_16x8x16(acc_s[mt][2 * np + 1], a[mt], bk[2], bk[3]);
        }
      }
    }

${logits}${apply_mask}
${softmax}
    const int next = tiles.next(it + 1);
    copy_wait_all();
    __syncthreads();  // V tile landed; every warp is done with this K tile
    if (next < tiles.count) {
      const int n1 = tiles.at(next) * BLOCK_N;
      load_tile<BLOCK_N>(sK, gK + (i64)n1 * p.k_ss, p.k_ss, seq.seqlen_k - n1, tid);
    }
    copy_commit();

    // O += P·V: P's accumulator fragments are already the A fragments of the
    // next MMA (two 8-key tiles make one 16-key step)
#pragma unroll
    for (int kk = 0; kk < N_TILES_S / 2; ++kk) {
      u32 a[M_TILES][4];
#pragma unroll
      for (int mt = 0; mt < M_TILES; ++mt) {
        a[mt][0] = pack2(acc_s[mt][2 * kk][0], acc_s[mt][2 * kk][1]);
        a[mt][1] = pack2(acc_s[mt][2 * kk][2], acc_s[mt][2 * kk][3]);
        a[mt][2] = pack2(acc_s[mt][2 * kk + 1][0], acc_s[mt][2 * kk + 1][1]);
        a[mt][3] = pack2(acc_s[mt][2 * kk + 1][2], acc_s[mt][2 * kk + 1][3]);
      }
${apply_dropout}
#pragma unroll
      for (int dp = 0; dp < N_TILES_O / 2; ++dp) {
        u32 bv[4];  // 16 keys x two 8-column tiles of V, transposed on load
        ldmatrix_x4_trans(bv, v_frag + (kk * 16 * ${v_row} + dp * 16) * 2);
#pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt) {
          mma_16x8x16(acc_o[mt][2 * dp], a[mt], bv[0], bv[1]);
          mma_16x8x16(acc_o[mt][2 * dp + 1], a[mt], bv[2], bv[3]);
        }
      }
    }
    it = next;
  }

  // O /= rowsum (times 1/(1-p) with dropout); lse = m·scale + ln(rowsum).
  // A row that saw no key writes zeros and lse = -inf.
#pragma unroll
  for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = row_sum[mt][r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const bool empty = row_max[mt][r] == FG_NEG_INF || !(l > 0.f);
      const float inv = empty ? 0.f : p.out_scale / l;
      const int i = row0 + warp_row + mt * 16 + g + 8 * r;
      if (i < seq.seqlen_q) {
        u16* out = (u16*)p.o + seq.q_at(p.o_sb, p.o_ss, i) + h * p.o_sh;
#pragma unroll
        for (int dn = 0; dn < N_TILES_O; ++dn) {
          const int col = dn * 8 + 2 * t;
          const float x0 = acc_o[mt][dn][2 * r] * inv, x1 = acc_o[mt][dn][2 * r + 1] * inv;
${output_store}
        }
        if (t == 0 && p.lse)
          ((float*)p.lse)[seq.stat(p, h, i)] =
              empty ? FG_NEG_INF : ${lse};
      }
    }
}
]]

return function(p)
  local isa = isa_for(p.arch)
  local name = "fg_fwd_" .. p.target_tag .. "_" .. p.spec_name .. "_m" .. p.block_m .. "n" .. p.block_n
               .. "w" .. p.warps
  local banner = text.fill([[
// ${name}
// Generated by flashgen ${version}: forward attention.
// spec: ${spec_name} (dtype ${dtype}, head dim ${head_dim}${value}, mask ${mask}, dropout ${dropout},
//       sparsity ${sparsity})
// plan: Br=${block_m} Bc=${block_n} warps=${warps} row tiles/warp=${m_tiles} stages=${stages}
//       head dim padded to ${head_dim_padded}, shared memory ${smem_bytes} bytes; target ${target}
]], {
    name = name, version = p.generator_version, spec_name = p.spec_name, dtype = p.dtype,
    head_dim = p.head_dim, value = width.banner(p), mask = p.mask, dropout = p.dropout and "on" or "off",
    sparsity = p.sparsity, block_m = p.block_m, block_n = p.block_n, warps = p.warps,
    m_tiles = p.m_tiles, stages = p.stages, head_dim_padded = p.head_dim_padded,
    smem_bytes = p.smem_bytes, target = p.target })
  if p.block_m ~= 16 * p.m_tiles * p.warps then error("block_m must be 16 * m_tiles * warps") end
  -- Q and K rows are the head dim wide, V and O rows the value head dim
  local vw = width.v(p)
  local constants = text.fill([[
#define HEAD_DIM ${head_dim}
#define HEAD_DIM_PADDED ${head_dim_padded}
#define SMEM_ROW ${smem_row}
#define BLOCK_M ${block_m}
#define BLOCK_N ${block_n}
#define M_TILES ${m_tiles}
#define THREADS ${threads}
#define N_TILES_S (BLOCK_N / 8)
#define N_TILES_O (${v_padded} / 8)
#define STRETCHES (BLOCK_N >= 32 ? BLOCK_N / 32 : 1)  // 32-key dropout stretches per key tile
${value_defines}]], { head_dim = p.head_dim, head_dim_padded = p.head_dim_padded,
                    smem_row = p.smem_row, block_m = p.block_m, block_n = p.block_n,
                    m_tiles = p.m_tiles, threads = p.threads, v_padded = vw.padded,
                    value_defines = width.defines(p, p.head_dim_v_padded, p.smem_row_v) })
  -- the register tiles: S (and P) and O as m16n8 accumulators, and P packed
  -- into the A operands of P·V
  local frag_s = fragment.mma_m16n8({ array = "acc_s", m_tiles = "M_TILES", n_tiles = "N_TILES_S" })
  local frag_o = fragment.mma_m16n8({ array = "acc_o", m_tiles = "M_TILES", n_tiles = "N_TILES_O",
                                      n_var = "dn" })
  local frag_p = fragment.mma_m16n8k16_a({ array = "a", m_tiles = "M_TILES" })
  local apply_mask = mask.apply(p.mask, frag_s, {
    params = "p", seq = "seq", row0 = "row0 + warp_row", key0 = "n0", block_row0 = "row0",
    block_key0 = "n0", full = "tiles.full(it)", predicate = logits.mask_predicate(p, { params = "p", seq = "seq", batch = "b", head = "h" }) })
  local update = softmax.update(frag_s, frag_o, { to_log2 = logits.to_log2(p, "p"), row_max = "row_max",
                                                 row_sum = "row_sum" })
  -- dropout: the draws of the key tile, then a mask on the packed P of each
  -- 16-key step of P·V
  local drop_draw = p.dropout and "u32 drop_keep[M_TILES][STRETCHES][4];\n" .. dropout.draw_tile(frag_s, {
    params = "p", batch = "b", head = "h", row0 = "row0 + warp_row", key0 = "n0",
    stretches = "STRETCHES", keep = "drop_keep" }) or ""
  local apply_dropout = p.dropout and dropout.apply_packed(frag_p, {
    params = "p", key0 = "n0 + kk * 16", stretch = "(kk * 16) / 32", keep = "drop_keep" }) or ""
  local body = text.fill(kernel, {
    name = name, v_row = vw.row, v_load = vw.load,
    v_rows = width.same(p) and "" or " (V's of SMEM_ROW_V)",
    lanes = fragment.lane_decl(frag_s),
    block = text.indent(sparse.forward_block(p), 2),
    apply_mask = text.indent(apply_mask, 4),
    logits = text.indent_code(logits.transform(p, frag_s, {
      params = "p", seq = "seq", row0 = "row0 + warp_row", key0 = "n0", batch = "b", head = "h" }), 4),
    row_init = text.indent(logits.row_init(p, {
      params = "p", head = "h", max = "row_max[mt][r]", sum = "row_sum[mt][r]", first_lane = "t == 0" }), 6),
    lse = logits.lse(p, "p", "row_max[mt][r]", "l"),
    softmax = text.indent_code(update, 4),
    drop_draw = text.indent(drop_draw, 4),
    apply_dropout = text.indent(apply_dropout, 6),
    output_store = text.indent(epilogue.output_store(p, vw), 10),
  })
  local pieces = {
    banner, constants, device.source, isa.prelude(p.dtype), p.params_struct, logits.device(p),
    p.dropout and dropout.device or "", sequence.source(p), sparse.key_tiles(p),
    tile_io.loader(p, isa),
  }
  if not width.same(p) then pieces[#pieces + 1] = tile_io.loader(p, isa, nil, vw) end
  pieces[#pieces + 1] = body
  local source = table.concat(pieces, "\n")
  -- one thread block per (query block, head, batch), as the kernel decodes blockIdx.x
  local launches = {
    { entry = name, threads = p.threads, smem = p.smem_bytes,
      grid = { { "num_m_blocks" }, { "heads_q" }, { "batch" } } },
  }
  return { source = source, name = name, launches = launches }
end
