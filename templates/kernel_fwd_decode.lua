-- A decoding step over a KV cache (spec.kv_cache): a few queries per
-- sequence against a long cache, bound by reading K and V. Two kernels,
-- launched in this order:
--   append   copies k_new, v_new into the cache at rows cache_seqlens[b]..,
--            and zeroes the turn counters of a split call
--   decode   one thread block per (split, row block, KV head, sequence):
--            the query rows of every query head sharing the KV head (GQA
--            packing: row i * group + head in group) against the split's
--            share of the sequence's key tiles. Four warps share each tile,
--            fed through a ring of cp.async stages; with fewer than 64 rows
--            the warps also split the tile's 16-key sub-tiles, and their
--            softmax states are merged in shared memory at the end, in a
--            fixed order. With one split it writes O and lse; else its part,
--            normalised, and its log-sum-exp (base 2) into the workspace, and
--            the last split of the row block to finish merges the parts
-- Keys are read through the cache's rows (cache_at): a page of the pool and
-- a row in it, or the sequence's own rows. Q and K rows are the head dim
-- wide, V and O rows the value head dim (lib_width).
local text = import("lib_text")
local device = import("lib_device")
local fragment = import("lib_fragment")
local softmax = import("lib_softmax")
local logits = import("lib_logits")
local width = import("lib_width")
local kv_cache = import("lib_kv_cache")
local isa_for = import("isa")


local decode = [[
${visible_keys}${pages}// K and V of the tile's keys n0.. into shared memory, zero past the
// sequence's keys (masked scores must meet finite V); pages: the tile's
// slot (with a block table).
__device__ __forceinline__ void load_kv(u32 sK, u32 sV, const fg_decode_params& p, int b, int hk,
                                        int n0, int keys, const int* pages, int tid) {
${kv_loads}}

extern "C" __global__ void __launch_bounds__(THREADS, 1) ${name}(const fg_decode_params p) {
  extern __shared__ u128 smem[];
  // Q [MAX_ROWS][SMEM_ROW], then STAGES x (K, V) [BLOCK_N][SMEM_ROW]${v_rows} (after
  // the loop the warps' states for the merge), and last the pages of STAGES
  // tiles [STAGES][BLOCK_N] int, tile x's in slot x % STAGES; ${layout}
  const u32 sQ = smem_addr(smem);
  const u32 sRing = sQ + MAX_ROWS * SMEM_ROW * 2;
  int* const sPages = reinterpret_cast<int*>(reinterpret_cast<char*>(smem) + PAGES_AT);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  ${lanes}    // MMA fragment row group and column pair

  int x = blockIdx.x;
  const int split = x % p.num_splits;
  x /= p.num_splits;
  const int rb = x % p.row_blocks;
  x /= p.row_blocks;
  const int hk = x % p.heads_kv, b = x / p.heads_kv;
  // warp (wm, wn): rows 16 wm.., sub-tiles wn, wn + warps_n, ... of each tile
  const int warps_n = WARPS / p.warps_m, wm = warp % p.warps_m, wn = warp / p.warps_m;
  const int block_rows = 16 * p.warps_m, row0 = rb * block_rows;
${block_start}#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < tiles) {
      const u32 sK = sRing + s * STAGE_BYTES;
      load_kv(sK, sK + BLOCK_N * SMEM_ROW * 2, p, b, hk, (t_begin + s) * BLOCK_N, keys,
              sPages + s * BLOCK_N, tid);
    }
    copy_commit();
  }

  // ldmatrix lanes: Q's rows 16 wm.., K's and V's of a 16-key sub-tile
  ${q_lane}
  ${k_lane}
  ${v_lane}

  float acc_o[1][N_TILES_O][4];       // O rows (g, g+8) x columns (2t, 2t+1) per 8-column tile
  float row_max[1][2], row_sum[1][2];
#pragma unroll
  for (int dn = 0; dn < N_TILES_O; ++dn)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_o[0][dn][e] = 0.f;
${logits_rows}#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int pr = row0 + 16 * wm + g + 8 * r;
    const int h = hk * p.group + (pr < p.rows ? pr % p.group : 0);
    (void)h;
${row_init}
  }

  for (int it = 0; it < tiles; ++it) {
    copy_wait<STAGES - 2>();
    __syncthreads();  // tile `it` landed; every warp is done with the stage refilled next
    const int next = it + STAGES - 1;  // the tile refilling the stage computed last
    if (next < tiles) {
      const u32 sK = sRing + (next % STAGES) * STAGE_BYTES;
      load_kv(sK, sK + BLOCK_N * SMEM_ROW * 2, p, b, hk, (t_begin + next) * BLOCK_N, keys,
              sPages + (next % STAGES) * BLOCK_N, tid);
    }
    copy_commit();
    // tile it + STAGES's pages: read now, kept after the math in tile it's
    // slot (its copies are issued), seen after the next barrier
    const bool page_ahead = p.block_table && it + STAGES < tiles;
    const int entry = page_ahead ? fetch_page(p, b, (t_begin + it + STAGES) * BLOCK_N, keys, tid) : 0;
    const u32 sK = sRing + (it % STAGES) * STAGE_BYTES, sV = sK + BLOCK_N * SMEM_ROW * 2;
    const int n0 = (t_begin + it) * BLOCK_N;
    for (int st = wn; st < BLOCK_N / 16; st += warps_n) {
      // S = Q·Kᵀ for 16 rows x 16 keys, fp32
      float acc_s[1][2][4];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_s[0][nt][e] = 0.f;
#pragma unroll
      for (int ks = 0; ks < HEAD_DIM_PADDED / 16; ++ks) {
        u32 a[4], bk[4];
        ldmatrix_x4(a, sQ + ${q_at});
        ldmatrix_x4(bk, sK + ${k_at});
        mma_16x8x16(acc_s[0][0], a, bk[0], bk[1]);
        mma_16x8x16(acc_s[0][1], a, bk[2], bk[3]);
      }
      // ${mask_comment}: keys outside each row's [lo, hi)
      const int key0 = n0 + st * 16 + 2 * t;
${key0f}#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = key0 + nt * 8 + (e & 1);
${logits}          if ((j < lo[e >> 1] || j >= hi[e >> 1])${predicate}) acc_s[0][nt][e] = FG_NEG_INF;
        }
${softmax}
      // O += P·V: P's accumulators are the A fragment of the 16-key step
      u32 a[4];
      a[0] = pack2(acc_s[0][0][0], acc_s[0][0][1]);
      a[1] = pack2(acc_s[0][0][2], acc_s[0][0][3]);
      a[2] = pack2(acc_s[0][1][0], acc_s[0][1][1]);
      a[3] = pack2(acc_s[0][1][2], acc_s[0][1][3]);
#pragma unroll
      for (int dp = 0; dp < N_TILES_O / 2; ++dp) {
        u32 bv[4];  // 16 keys x two 8-column tiles of V, transposed on load
        ldmatrix_x4_trans(bv, sV + ${v_at});
        mma_16x8x16(acc_o[0][2 * dp], a, bv[0], bv[1]);
        mma_16x8x16(acc_o[0][2 * dp + 1], a, bv[2], bv[3]);
      }
    }
    if (page_ahead) put_page(sPages + (it % STAGES) * BLOCK_N, p, entry, tid);
  }

  // merge the warps that shared rows (w, w + warps_m, ...) in the ring, now
  // free: their base-2 maxima m·scale·log2e and row sums, then their O
  // rescaled to the rows' maximum, each warp's in its own 16 rows, added in
  // warp order
  copy_wait_all();
  __syncthreads();
  float* const sO = reinterpret_cast<float*>(reinterpret_cast<char*>(smem) + MAX_ROWS * SMEM_ROW * 2);
  float* const sM = sO + WARPS * 16 * O_ROW;  // [WARPS][16]
  float* const sL = sM + WARPS * 16;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = row_sum[0][r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (t == 0) {
      sM[warp * 16 + g + 8 * r] = row_max[0][r] == FG_NEG_INF ? FG_NEG_INF : row_max[0][r] * ${to_log2};
      sL[warp * 16 + g + 8 * r] = l;
    }
  }
  __syncthreads();
  float scale[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float m = FG_NEG_INF;
    for (int w = wm; w < WARPS; w += p.warps_m) m = fmaxf(m, sM[w * 16 + g + 8 * r]);
    const float mine = sM[warp * 16 + g + 8 * r];
    scale[r] = mine == FG_NEG_INF ? 0.f : fast_exp2(mine - m);
  }
  const i64 all_rows = (i64)p.batch * p.heads_q * p.seqlen_q;
#pragma unroll
  for (int round = 0; round < MERGE_ROUNDS; ++round) {  // O's columns MERGE_COLS at a time
    if (round > 0) __syncthreads();  // the last round's columns read
#pragma unroll
    for (int r = 0; r < 2; ++r)
      if (row0 + 16 * wm + g + 8 * r < p.rows)
#pragma unroll
        for (int dn = 0; dn < MERGE_COLS / 8; ++dn) {
          const int on = round * (MERGE_COLS / 8) + dn;
          if (on < N_TILES_O)
            *(float2*)(sO + (16 * warp + g + 8 * r) * O_ROW + dn * 8 + 2 * t) =
                make_float2(scale[r] * acc_o[0][on][2 * r], scale[r] * acc_o[0][on][2 * r + 1]);
        }
    __syncthreads();
    for (int e = tid; e < block_rows * (MERGE_COLS / 2); e += THREADS) {
      const int row = e / (MERGE_COLS / 2), c = e % (MERGE_COLS / 2) * 2, pr = row0 + row;
      const int col = round * MERGE_COLS + c;
      if (pr >= p.rows || col >= ${v_dim}) continue;
      const int rr = row % 16, first = row / 16;  // its warps: first, first + warps_m, ...
      float m = FG_NEG_INF, l = 0.f;
      for (int w = first; w < WARPS; w += p.warps_m) m = fmaxf(m, sM[w * 16 + rr]);
      for (int w = first; w < WARPS; w += p.warps_m)
        if (sM[w * 16 + rr] != FG_NEG_INF) l += fast_exp2(sM[w * 16 + rr] - m) * sL[w * 16 + rr];
      float x0 = 0.f, x1 = 0.f;
      for (int w = first; w < WARPS; w += p.warps_m) {
        const float2 x = *(const float2*)(sO + (16 * w + rr) * O_ROW + c);
        x0 += x.x;
        x1 += x.y;
      }
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const float lse2 = l > 0.f ? m + log2f(l) : FG_NEG_INF;  // base 2
      const int i = pr / p.group, h = hk * p.group + pr % p.group;
      const i64 out_row = ((i64)b * p.heads_q + h) * p.seqlen_q + i;  // lse's (B, Hq, Sq)
      if (p.num_splits == 1) {
        u16* out = (u16*)p.o + b * p.o_sb + (i64)i * p.o_ss + h * p.o_sh;
        *(u32*)(out + col) = pack2(x0 * inv, x1 * inv);
        if (col == 0 && p.lse) ((float*)p.lse)[out_row] = lse2 * 0.69314718055994531f;
      } else {
        const i64 part = split * all_rows + out_row;
        *(float2*)((float*)p.o_part + part * ${v_padded} + col) = make_float2(x0 * inv, x1 * inv);
        if (col == 0) ((float*)p.lse_part)[part] = lse2;
      }
    }
  }
  if (p.num_splits == 1) return;

${merge}}
]]

-- load_kv's copies of a tile's K and V rows: one loop over both where they
-- are one width, else a loop over each
local function kv_copies(p)
  if width.same(p) then return kv_cache.tile_copies(width.qk(p), { "k", "v" }, "KV") end
  local dk, lk = kv_cache.tile_copies(width.qk(p), { "k" }, "K")
  local dv, lv = kv_cache.tile_copies(width.v(p), { "v" }, "V")
  return dk .. dv, lk .. lv
end

return function(p)
  local isa = isa_for(p.arch)
  local qk, vw = width.qk(p), width.v(p)
  local base = "fg_decode_" .. p.target_tag .. "_" .. p.spec_name .. "_n" .. p.block_n .. "r"
               .. p.max_rows .. "s" .. p.stages
  local names = { append = base .. "_append", decode = base }
  if p.warps ~= 4 then error("the decoding kernels take 4 warps") end
  local banner = text.fill([[
// ${name}
// Generated by flashgen ${version}: decoding step over a KV cache.
// spec: ${spec_name} (dtype ${dtype}, head dim ${head_dim}${value}, mask ${mask})
// plan: Bc=${block_n} rows<=${max_rows} stages=${stages} warps=${warps}
//       head dim padded to ${head_dim_padded}, shared memory ${smem_bytes} bytes; target ${target}
]], {
    name = base, version = p.generator_version, spec_name = p.spec_name, dtype = p.dtype,
    head_dim = p.head_dim, value = width.banner(p), mask = p.mask, block_n = p.block_n,
    max_rows = p.max_rows,
    stages = p.stages, warps = p.warps, head_dim_padded = p.head_dim_padded,
    smem_bytes = p.smem_bytes, target = p.target })
  local constants = text.fill([[
#define HEAD_DIM ${head_dim}
#define HEAD_DIM_PADDED ${head_dim_padded}
#define SMEM_ROW ${smem_row}
#define BLOCK_N ${block_n}
#define SMEM_BYTES ${smem_bytes}
#define MAX_SPLITS ${max_splits}
#define MAX_ROWS ${max_rows}
#define STAGES ${stages}
#define WARPS ${warps}
#define THREADS ${threads}
#define STAGE_BYTES ${stage_bytes}
#define PAGES_AT (SMEM_BYTES - STAGES * BLOCK_N * 4)  // the pages' slots end the shared memory
#define MERGE_COLS (${v_padded} < 64 ? ${v_padded} : 64)  // O's columns a round of the merge
#define MERGE_ROUNDS ((${v_padded} + MERGE_COLS - 1) / MERGE_COLS)
#define O_ROW (MERGE_COLS + 4)  // O's rows in the merge, fp32
#define N_TILES_O (${v_padded} / 8)
]], setmetatable({ stage_bytes = width.same(p) and "(2 * BLOCK_N * SMEM_ROW * 2)"
                                   or "(BLOCK_N * (SMEM_ROW + SMEM_ROW_V) * 2)",
                     v_padded = vw.padded }, { __index = p }))
    .. width.defines(p, p.head_dim_v_padded, p.smem_row_v)
  local frag_s = fragment.mma_m16n8({ array = "acc_s", m_tiles = "1", n_tiles = "2" })
  local frag_o = fragment.mma_m16n8({ array = "acc_o", m_tiles = "1", n_tiles = "N_TILES_O",
                                      n_var = "dn" })
  local update = softmax.update(frag_s, frag_o, { to_log2 = logits.to_log2(p, "p"), row_max = "row_max",
                                                 row_sum = "row_sum" })
  -- the logits: each of a thread's two rows has its own query and head
  -- (GQA packing), so its own slope and diagonal; the sink enters a row's
  -- first split, in its first warp
  local logits_rows, rewrite = "", ""
  if p.alibi then
    logits_rows = [[
  float slope[2];
  float diag_row[2];  // the row's query + diag: key j is at j - diag_row from its diagonal
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int pr = row0 + 16 * wm + g + 8 * r;
    slope[r] = pr < p.rows ? alibi_slope(p, b, hk * p.group + pr % p.group) : 0.f;
    diag_row[r] = (float)(pr / p.group + diag);
  }
]]
  end
  -- the expressions' indices of element e: its row's query and head, key j
  local at
  if p.score_mod or p.mask_mod then
    logits_rows = logits_rows .. [[
  int row_q[2], row_h[2];  // each row's query and head, as the expressions see them
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int pr = min(row0 + 16 * wm + g + 8 * r, p.rows - 1);
    row_q[r] = pr / p.group;
    row_h[r] = hk * p.group + pr % p.group;
  }
]]
    local q, k = logits.positions("p", "row_q[e >> 1]", "j")
    at = { b = "b", h = "row_h[e >> 1]", q = q, k = k, seqlen_q = "p.seqlen_q", seqlen_k = "keys" }
  end
  if logits.transformed(p) then
    rewrite = text.indent(logits.rewrite(p, "acc_s[0][nt][e]", {
      params = "p", slope = "slope[e >> 1]", d = "key0f + (float)(nt * 8 + (e & 1)) - diag_row[e >> 1]",
      at = at }), 10) .. "\n"
  end
  local predicate = logits.mask_test(p, "p", at)
  local chunk_defines, kv_loads = kv_copies(p)
  local source = table.concat({
    banner, constants, device.source, isa.prelude(p.dtype), p.params_struct, logits.device(p), kv_cache.common(p),
    kv_cache.append(p, names.append, false, true),
    text.fill(decode, { block_start = kv_cache.block_start(width.at(qk, "r", "k")), name = names.decode,
                        lanes = fragment.lane_decl(frag_s),
                        layout = qk.swizzled and "rows of 128-byte swizzled chunks (lib_width)"
                                 or "rows padded against bank conflicts",
                        q_lane = width.lane(qk, "q_lane", "16 * wm + (lane & 15)", "lane >> 4"),
                        k_lane = width.lane(qk, "k_lane", "(lane & 7) + (lane >> 4) * 8", "(lane >> 3) & 1"),
                        v_lane = width.lane(vw, "v_lane", "(lane & 7) + ((lane >> 3) & 1) * 8", "lane >> 4"),
                        q_at = width.lane_at(qk, "q_lane", nil, "2 * ks"),
                        k_at = width.lane_at(qk, "k_lane", "st * 16", "2 * ks"),
                        v_at = width.lane_at(vw, "v_lane", "st * 16", "2 * dp"),
                        visible_keys = kv_cache.visible_keys(p), pages = kv_cache.pages(chunk_defines),
                        merge = kv_cache.merge(vw.name, vw.padded), kv_loads = kv_loads,
                        v_dim = vw.name, v_padded = vw.padded,
                        v_rows = width.same(p) and "" or " (V's of SMEM_ROW_V)",
                        softmax = text.indent_code(update, 6),
                        -- | not ||: the predicate's reads on every key, no branch each
                        predicate = predicate and (" | !" .. predicate) or "",
                        logits_rows = logits_rows, logits = rewrite,
                        key0f = p.alibi and "      const float key0f = (float)key0;\n" or "",
                        mask_comment = logits.transformed(p) and "logits, then the mask" or "mask",
                        to_log2 = logits.to_log2(p, "p"),
                        row_init = text.indent(logits.row_init(p, {
                          params = "p", head = "h", max = "row_max[0][r]", sum = "row_sum[0][r]",
                          first_lane = "t == 0", takes = "split == 0 && wn == 0 && pr < p.rows" }), 4) }),
  }, "\n")
  return { source = source, name = names.decode, launches = kv_cache.launches(p, names.append, names.decode) }
end
