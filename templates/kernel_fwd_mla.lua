-- A decoding step over a latent cache (spec.kv_cache FG_KV_LATENT,
-- multi-head latent attention): each cached token is one row of HEAD_DIM
-- columns, read as the key, whose first HEAD_DIM_V columns are also its
-- value (DeepSeek's 576 and 512), and many query heads (16..128) share it.
-- Three kernels, launched in this order:
--   append   copies k_new into the cache at rows cache_seqlens[b]..
--   mla      one thread block per (split, row block, KV head, sequence): ROWS
--            (32 or 64) query rows (GQA packing, as the decode family's: row
--            i * group + head in group) against the split's share of the
--            key tiles, fed through a ring of cp.async stages. Eight warps,
--            WARPS_N (4 or 2) on each 16 rows: warp (wm, wn) computes the
--            scores of rows 16 wm.. with keys 16 wn.. of each tile (BLOCK_N
--            = 16 WARPS_N keys), the warps of a row group share its row
--            maxima and the tile's P through shared memory, and each keeps O
--            for its share of the value columns (COLS), read from the same
--            K tile. With one split it writes O and lse; else its part
--   combine  with splits, adds the parts into O and lse (lib_kv_cache)
local text = import("lib_text")
local device = import("lib_device")
local width = import("lib_width")
local kv_cache = import("lib_kv_cache")
local isa_for = import("isa")

local mla = [[
${visible_keys}${pages}// K of the tile's keys n0.. into shared memory, zero past the sequence's
// keys (masked scores must meet finite V); pages: the tile's slot (with a
// block table).
__device__ __forceinline__ void load_k(u32 sK, const fg_decode_params& p, int b, int hk, int n0,
                                       int keys, const int* pages, int tid) {
${k_loads}}

extern "C" __global__ void __launch_bounds__(THREADS, 1) ${name}(const fg_decode_params p) {
  extern __shared__ u128 smem[];
  // Q [ROWS][SMEM_ROW], STAGES x K [BLOCK_N][SMEM_ROW], P [ROWS][P_ROW], the
  // row statistics float [WARPS_N][ROWS], and last the pages of STAGES
  // tiles [STAGES][BLOCK_N] int, tile x's in slot x % STAGES
  const u32 sQ = smem_addr(smem), sRing = sQ + ROWS * SMEM_ROW * 2;
  const u32 sP = sRing + STAGES * STAGE_BYTES;
  u32* const sP_rows = reinterpret_cast<u32*>(reinterpret_cast<char*>(smem) + (sP - sQ));
  float* const sStat = reinterpret_cast<float*>(reinterpret_cast<char*>(smem) + STAT_AT);
  int* const sPages = reinterpret_cast<int*>(reinterpret_cast<char*>(smem) + PAGES_AT);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;  // MMA fragment row group and column pair
  // warp (wm, wn): a row group's warps on different schedulers; a warp whose
  // 16 rows are past the call's (16 query heads: all but the first group's)
  // skips the math and meets only the barriers
  const int wn = warp % WARPS_N, wm = warp / WARPS_N;

  const step_block at = step_block_of(p);
  const int split = at.split, rb = at.rb, hk = at.hk, b = at.b;
  const int block_rows = ROWS, row0 = rb * ROWS;
  const bool busy = row0 + 16 * wm < p.rows;
${block_start}#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < tiles)
      load_k(sRing + s * STAGE_BYTES, p, b, hk, (t_begin + s) * BLOCK_N, keys, sPages + s * BLOCK_N, tid);
    copy_commit();
  }

  const u32 q_frag = sQ + ((16 * wm + (lane & 15)) * SMEM_ROW + (lane >> 4) * 8) * 2;
  const u32 p_frag = sP + ((16 * wm + (lane & 15)) * P_ROW + (lane >> 4) * 8) * 2;
  const int k_lane = ((lane & 7) + (lane >> 4) * 8) * SMEM_ROW + ((lane >> 3) & 1) * 8;
  const int v_lane = ((lane & 7) + ((lane >> 3) & 1) * 8) * SMEM_ROW + (lane >> 4) * 8;

  float acc_o[O_TILES][4];  // O rows (g, g+8) x columns (2t, 2t+1) of the warp's share
#pragma unroll
  for (int dn = 0; dn < O_TILES; ++dn)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_o[dn][e] = 0.f;
  float row_max[2] = {FG_NEG_INF, FG_NEG_INF}, row_sum[2] = {0.f, 0.f};  // row_sum: own keys'

  for (int it = 0; it < tiles; ++it) {
    copy_wait<STAGES - 2>();
    __syncthreads();  // tile `it` landed; every warp is done with the stage refilled next and P
    const int next = it + STAGES - 1;  // the tile refilling the stage computed last
    if (next < tiles)
      load_k(sRing + (next % STAGES) * STAGE_BYTES, p, b, hk, (t_begin + next) * BLOCK_N, keys,
             sPages + (next % STAGES) * BLOCK_N, tid);
    copy_commit();
    const bool page_ahead = p.block_table && it + STAGES < tiles;
    const int entry = page_ahead ? fetch_page(p, b, (t_begin + it + STAGES) * BLOCK_N, keys, tid) : 0;
    const u32 sK = sRing + (it % STAGES) * STAGE_BYTES;
    const int n0 = (t_begin + it) * BLOCK_N;

    // S = Q·Kᵀ for 16 rows x the warp's 16 keys, fp32, the head dim's steps
    // in two chains
    float acc_s[2][2][4];
    if (busy) {
#pragma unroll
      for (int c = 0; c < 2; ++c)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc_s[c][nt][e] = 0.f;
#pragma unroll 2
      for (int ks = 0; ks < HEAD_DIM_PADDED / 16; ks += 2)
#pragma unroll
        for (int c = 0; c < 2; ++c)
          if (ks + c < HEAD_DIM_PADDED / 16) {
            u32 a[4], bk[4];
            ldmatrix_x4(a, q_frag + (ks + c) * 32);
            ldmatrix_x4(bk, sK + (k_lane + wn * 16 * SMEM_ROW + (ks + c) * 16) * 2);
            mma_16x8x16(acc_s[c][0], a, bk[0], bk[1]);
            mma_16x8x16(acc_s[c][1], a, bk[2], bk[3]);
          }
      // the mask: keys outside each row's [lo, hi); the rows' maxima over the
      // warp's keys, then over the row group's warps
      const int key0 = n0 + wn * 16 + 2 * t;
      float mx[2] = {FG_NEG_INF, FG_NEG_INF};
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = key0 + nt * 8 + (e & 1);
          float s = acc_s[0][nt][e] + acc_s[1][nt][e];
          if (j < lo[e >> 1] || j >= hi[e >> 1]) s = FG_NEG_INF;
          acc_s[0][nt][e] = s;
          mx[e >> 1] = fmaxf(mx[e >> 1], s);
        }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        if (t == 0) sStat[wn * ROWS + 16 * wm + g + 8 * r] = mx[r];
      }
    }
    __syncthreads();  // both warps' maxima of the rows
    if (busy) {
      float alpha[2], base[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = 16 * wm + g + 8 * r;
        float m = row_max[r];
#pragma unroll
        for (int w = 0; w < WARPS_N; ++w) m = fmaxf(m, sStat[w * ROWS + row]);
        base[r] = m == FG_NEG_INF ? 0.f : m * ${to_log2};
        alpha[r] = row_max[r] == FG_NEG_INF ? 0.f : fast_exp2(row_max[r] * ${to_log2} - base[r]);
        row_max[r] = m;
      }
      // P = 2^(s·scale·log2 e - max) into shared memory; O and the sums rescaled
      float sum[2] = {0.f, 0.f};
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float s = acc_s[0][nt][e];
          const float pe = s == FG_NEG_INF ? 0.f : fast_exp2(s * ${to_log2} - base[e >> 1]);
          acc_s[0][nt][e] = pe;
          sum[e >> 1] += pe;
        }
        u32* const at = sP_rows + (16 * wm + g) * (P_ROW / 2) + wn * 8 + nt * 4 + t;
        at[0] = pack2(acc_s[0][nt][0], acc_s[0][nt][1]);
        at[8 * (P_ROW / 2)] = pack2(acc_s[0][nt][2], acc_s[0][nt][3]);
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) row_sum[r] = row_sum[r] * alpha[r] + sum[r];
#pragma unroll
      for (int dn = 0; dn < O_TILES; ++dn)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_o[dn][e] *= alpha[e >> 1];
    }
    if (page_ahead) put_page(sPages + (it % STAGES) * BLOCK_N, p, entry, tid);
    __syncthreads();  // the tile's P
    if (busy) {
      // O += P·V: the tile's keys, V the K tile's columns of the warp's share
#pragma unroll
      for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
        u32 a[4];
        ldmatrix_x4(a, p_frag + kk * 32);
#pragma unroll
        for (int dp = 0; dp < O_TILES / 2; ++dp) {
          u32 bv[4];  // 16 keys x two 8-column tiles of V, transposed on load
          ldmatrix_x4_trans(bv, sK + (v_lane + kk * 16 * SMEM_ROW + wn * COLS + dp * 16) * 2);
          mma_16x8x16(acc_o[2 * dp], a, bv[0], bv[1]);
          mma_16x8x16(acc_o[2 * dp + 1], a, bv[2], bv[3]);
        }
      }
    }
  }

  // the rows' sums: the warp's keys, then the row group's warps
  copy_wait_all();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 1);
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 2);
  }
  __syncthreads();  // every warp past its last reads of sStat
#pragma unroll
  for (int r = 0; r < 2; ++r)
    if (t == 0) sStat[wn * ROWS + 16 * wm + g + 8 * r] = row_sum[r];
  __syncthreads();
  const i64 all_rows = (i64)p.batch * p.heads_q * p.seqlen_q;
${store_rows}}
]]

return function(p)
  local isa = isa_for(p.arch)
  if not p.latent then error("kernel_fwd_mla takes a latent cache (spec.kv_cache FG_KV_LATENT)") end
  if p.warps ~= 8 then error("the latent decoding kernel takes 8 warps") end
  local base = "fg_mla_" .. p.target_tag .. "_" .. p.spec_name .. "_n" .. p.block_n .. "s" .. p.stages
  local names = { append = base .. "_append", mla = base, combine = base .. "_combine" }
  local banner = text.fill([[
// ${name}
// Generated by flashgen ${version}: decoding step over a latent cache.
// spec: ${spec_name} (dtype ${dtype}, head dim ${head_dim}, value head dim ${head_dim_v} (K's
//       first columns), mask ${mask})
// plan: Bc=${block_n} rows=${rows} stages=${stages} warps=${warps}
//       shared memory ${smem_bytes} bytes; target ${target}
]], {
    name = base, version = p.generator_version, spec_name = p.spec_name, dtype = p.dtype,
    head_dim = p.head_dim, head_dim_v = p.head_dim_v, mask = p.mask, block_n = p.block_n,
    rows = p.rows, stages = p.stages, warps = p.warps, smem_bytes = p.smem_bytes,
    target = p.target })
  local constants = text.fill([[
#define HEAD_DIM ${head_dim}
#define HEAD_DIM_PADDED ${head_dim_padded}
#define SMEM_ROW ${smem_row}
#define HEAD_DIM_V ${head_dim_v}
#define HEAD_DIM_V_PADDED ${head_dim_v_padded}
#define BLOCK_N ${block_n}
#define ROWS ${rows}
#define WARPS_M (ROWS / 16)
#define WARPS_N (WARPS / WARPS_M)
#define COLS (HEAD_DIM_V_PADDED / WARPS_N)  // a warp's O columns
#define O_TILES (COLS / 8)
#define P_ROW ${p_row}
#define SMEM_BYTES ${smem_bytes}
#define MAX_SPLITS ${max_splits}
#define STAGES ${stages}
#define WARPS ${warps}
#define THREADS ${threads}
#define STAGE_BYTES (BLOCK_N * SMEM_ROW * 2)
#define STAT_AT (ROWS * SMEM_ROW * 2 + STAGES * STAGE_BYTES + ROWS * P_ROW * 2)
#define PAGES_AT (SMEM_BYTES - STAGES * BLOCK_N * 4)  // the pages' slots end the shared memory
]], p)
  local k_defines, k_loads = kv_cache.tile_copies(width.qk(p), { "k" }, "K")
  local source = table.concat({
    banner, constants, device.source, isa.prelude(p.dtype), p.params_struct, kv_cache.common(p),
    kv_cache.append(p, names.append, true, "fg_decode_params"),
    text.fill(mla, { block_start = kv_cache.block_start(), name = names.mla, visible_keys = kv_cache.visible_keys(p),
                     pages = kv_cache.pages(k_defines), k_loads = k_loads,
                     to_log2 = "p.scale_log2",
                     store_rows = kv_cache.store_rows({
                       sum = "    float l = 0.f;\n#pragma unroll\n"
                             .. "    for (int w = 0; w < WARPS_N; ++w) l += sStat[w * ROWS + row];",
                       col0 = "wn * COLS", tiles = "O_TILES", first = "wn == 0",
                       v_dim = "HEAD_DIM_V", v_padded = "HEAD_DIM_V_PADDED",
                       acc0 = "acc_o[dn][2 * r]", acc1 = "acc_o[dn][2 * r + 1]" }) }),
    kv_cache.combine(p, names.combine, "HEAD_DIM_V", "HEAD_DIM_V_PADDED"),
  }, "\n")
  return { source = source, name = names.mla,
           launches = kv_cache.launches(p, names.append, names.mla, names.combine) }
end
