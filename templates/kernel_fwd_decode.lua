-- A decoding step over a KV cache (spec.kv_cache): a few queries per
-- sequence against a long cache, bound by reading K and V. Three kernels,
-- launched in this order:
--   append   copies k_new, v_new into the cache at rows cache_seqlens[b]..
--   decode   one thread block per (split, row block, KV head, sequence):
--            the query rows of every query head sharing the KV head (GQA
--            packing: row i * group + head in group) against the split's
--            share of the sequence's key tiles. Four warps share each tile,
--            fed through a ring of cp.async stages (on wide tiles of 128
--            keys for 16 rows, each warp's two 16-key sub-tiles side by
--            side: SIDE). With fewer than 64 rows
--            the warps also split either the tile's 16-key sub-tiles, their
--            softmax states merged in shared memory at the end in a fixed
--            order, or (the kernel `_columns`, for splits of one tile, whose
--            time that merge would dominate) O's columns, each warp
--            computing every score of its rows. With one split it writes O
--            and lse; else its part, normalised, and its log-sum-exp (base
--            2) into the workspace; in a counted step (given turn
--            counters: kernels `_counted`), blocks after the splits' then
--            add them into O and lse, a query row each. On sm_90 a step of
--            two splits runs them as a cluster of two blocks (a pair),
--            which add their parts from each other's shared memory and
--            write O and lse: no workspace, no combine kernel
--   combine  with splits, uncounted and unpaired, adds the parts
--            (lib_kv_cache)
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
local cluster = import("lib_cluster")
local isa_for = import("isa")


local decode = [[
${visible_keys}${pages}// K and V of the tile's keys n0.. into shared memory, zero past the
// sequence's keys (masked scores must meet finite V); pages: the tile's
// slot (with a block table).
__device__ __forceinline__ void load_kv(u32 sK, u32 sV, const fg_decode_params& p, int b, int hk,
                                        int n0, int keys, const int* pages, int tid) {
${kv_loads}}

// One split's share of the keys for a row block. COLUMNS: the warps that
// share rows split O's columns, not the keys (a kernel of its own, so that
// neither way carries the other's branches or registers); COUNTED: the
// split counts itself done on its rows (a counted step's kernel).
template <bool COLUMNS, bool COUNTED>
__device__ __forceinline__ void decode_rows(const fg_decode_params& p) {
  extern __shared__ u128 smem[];
  // Q [MAX_ROWS][SMEM_ROW], then STAGES x (K, V) [BLOCK_N][SMEM_ROW]${v_rows} (after
  // the loop the warps' states for the merge), and last the pages of STAGES
  // tiles [STAGES][BLOCK_N] int, tile x's in slot x % STAGES; ${layout}
  const u32 sQ = smem_addr(smem);
  const u32 sRing = sQ + MAX_ROWS * SMEM_ROW * 2;
  int* const sPages = reinterpret_cast<int*>(reinterpret_cast<char*>(smem) + PAGES_AT);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  ${lanes}    // MMA fragment row group and column pair

  const step_block at = step_block_of(p);
  const int split = at.split, rb = at.rb, hk = at.hk, b = at.b;
  // warp (wm, wn): rows 16 wm..; sub-tiles wn, wn + warps_n, ... of each tile
  // and all of O's columns, or with COLUMNS every sub-tile and O's column
  // pairs wn, wn + warps_n, ...
  const int warps_n = WARPS / p.warps_m, wm = warp % p.warps_m, wn = warp / p.warps_m;
  const int st_first = COLUMNS ? 0 : wn, st_step = COLUMNS ? 1 : warps_n;
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

  // Q's A fragments, loaded once where they fit beside the rest (the
  // ldmatrix traffic of a 16-key sub-tile is otherwise a third Q's)
  u32 qa[Q_IN_REGS ? HEAD_DIM_PADDED / 16 : 1][4];
  // A split of two tiles, both sent before the loop (short steps), takes
  // them side by side: each warp's sub-tiles of the two in one step, one
  // softmax over their 32 keys. The latency of a sub-tile's products,
  // paid once instead of twice, is most of such a split's math.
  const bool side_by_side = !COLUMNS && STAGES > 2 && tiles == 2 && SIDE == 1;
  if (side_by_side) {
    copy_wait<0>();
    __syncthreads();  // both tiles landed
    if (Q_IN_REGS)${q_to_registers}
    const u32 sKu[2] = { sRing, sRing + STAGE_BYTES };
    const u32 sVu[2] = { sKu[0] + BLOCK_N * SMEM_ROW * 2, sKu[1] + BLOCK_N * SMEM_ROW * 2 };
    const int n0u[2] = { t_begin * BLOCK_N, (t_begin + 1) * BLOCK_N };
${pair_step}  }
  for (int it = 0; it < (side_by_side ? 0 : tiles); ++it) {
    copy_wait<STAGES - 2>();
    __syncthreads();  // tile `it` landed; every warp is done with the stage refilled next
    if (Q_IN_REGS && it == 0)  // Q landed with the first tile${q_to_registers}
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
${tile_parts}${tile_step}    if (page_ahead) put_page(sPages + (it % STAGES) * BLOCK_N, p, entry, tid);
  }

  // the rows' base-2 maxima and sums as the warp saw them
  float m2[2], sum[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    sum[r] = row_sum[0][r];
    sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
    sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
    m2[r] = row_max[0][r] == FG_NEG_INF ? FG_NEG_INF : row_max[0][r] * ${to_log2};
  }
  const i64 all_rows = (i64)p.batch * p.heads_q * p.seqlen_q;
  if (COLUMNS) {  // a warp's rows saw every key: its own maxima and sums
${store_rows}  } else {
    // Every warp's rows as they are (maxima, sums, O) through the ring, now
    // free, MERGE_COLS columns a round; then the block's threads take a row's
    // four columns at a time, add the row's warps (w, w + warps_m, ..., in
    // that order), each weighted by exp2(its maximum - the row's), and write
    // o or the split's part. The loop is not unrolled: a block runs this end
    // once, its instructions fetched as it does (decode-notes v17), so it is
    // kept short.
    float* const sO = reinterpret_cast<float*>(reinterpret_cast<char*>(smem) + MAX_ROWS * SMEM_ROW * 2);
    float* const sM = sO + WARPS * 16 * O_ROW;  // [WARPS][16]
    float* const sL = sM + WARPS * 16;
    // a pair's slots, past the merge's: the block's rows as one split's,
    // normalised O [MAX_ROWS][${v_padded}] then their lse2 [MAX_ROWS]
    static_assert(PAIR_AT == 0 || (PAIR_AT % 16 == 0 && PAIR_AT >= WARPS * 16 * (O_ROW + 2) * 4 &&
                                   PAIR_AT + MAX_ROWS * (${v_padded} + 1) * 4 <= STAGES * STAGE_BYTES),
                  "a pair's slots lie in the ring, past the merge's");
    float* const sPair = sO + PAIR_AT / 4;
    const bool paired = ${paired};
    copy_wait_all();
#pragma unroll
    for (int round = 0; round < MERGE_ROUNDS; ++round) {
      __syncthreads();  // the ring, or the last round's columns, read
      if (round == 0 && t == 0)
#pragma unroll
        for (int r = 0; r < 2; ++r) sM[warp * 16 + g + 8 * r] = m2[r], sL[warp * 16 + g + 8 * r] = sum[r];
#pragma unroll
      for (int dn = 0; dn < MERGE_COLS / 8; ++dn) {
        const int on = round * (MERGE_COLS / 8) + dn;
        if (on < N_TILES_O)
#pragma unroll
          for (int r = 0; r < 2; ++r)
            *(float2*)(sO + (16 * warp + g + 8 * r) * O_ROW + dn * 8 + 2 * t) =
                make_float2(acc_o[0][on][2 * r], acc_o[0][on][2 * r + 1]);
      }
      __syncthreads();
      constexpr int C4 = MERGE_COLS / 4;  // a row's 4-column groups a round
      const int rows_in = min(block_rows, p.rows - row0);  // the block's rows of the call
#pragma unroll 1
      for (int x = tid; x < rows_in * C4; x += THREADS) {
        const int row = x / C4, c = round * MERGE_COLS + 4 * (x % C4), pr = row0 + row, wr = row & 15;
        if (c >= ${v_padded}) continue;
        float m = FG_NEG_INF, l = 0.f;
        for (int w = row >> 4; w < WARPS; w += p.warps_m) m = fmaxf(m, sM[w * 16 + wr]);
        float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int w = row >> 4; w < WARPS; w += p.warps_m) {
          const float mw = sM[w * 16 + wr], weight = mw != FG_NEG_INF ? fast_exp2(mw - m) : 0.f;
          const float4 y = *(const float4*)(sO + (16 * w + wr) * O_ROW + c - round * MERGE_COLS);
          l += weight * sL[w * 16 + wr];
          o.x += weight * y.x, o.y += weight * y.y, o.z += weight * y.z, o.w += weight * y.w;
        }
        const float inv = l > 0.f ? 1.f / l : 0.f;
        const float lse2 = l > 0.f ? m + log2f(l) : FG_NEG_INF;  // base 2
        const int i = pr / p.group, h = hk * p.group + pr % p.group;
        const i64 out_row = ((i64)b * p.heads_q + h) * p.seqlen_q + i;  // lse's (B, Hq, Sq)
        if (p.num_splits == 1) {
          if (c < ${v_dim}) {
            u32* const out = (u32*)((u16*)p.o + b * p.o_sb + (i64)i * p.o_ss + h * p.o_sh + c);
            out[0] = pack2(o.x * inv, o.y * inv);
            out[1] = pack2(o.z * inv, o.w * inv);
          }
          if (c == 0 && p.lse) ((float*)p.lse)[out_row] = lse2 * 0.69314718055994531f;
        } else if (paired) {
          *(float4*)(sPair + row * ${v_padded} + c) = make_float4(o.x * inv, o.y * inv, o.z * inv, o.w * inv);
          if (c == 0) sPair[MAX_ROWS * ${v_padded} + row] = lse2;
        } else {
          const i64 part = split * all_rows + out_row;
          *(float4*)((float*)p.o_part + part * ${v_padded} + c) = make_float4(o.x * inv, o.y * inv, o.z * inv, o.w * inv);
          if (c == 0) ((float*)p.lse_part)[part] = lse2;
        }
      }
    }
${pair_end}  }
  if (COUNTED) count_split(p, b, hk, row0, block_rows);  // its rows' blocks add the parts
}

// A block's work: a split of a row block, or in a counted step's kernel
// past the splits' blocks a query row's combine (lib_kv_cache).
template <bool COLUMNS, bool COUNTED>
__device__ __forceinline__ void decode_block(const fg_decode_params& p) {
  extern __shared__ u128 smem[];
  if (COUNTED) {
    static_assert(THREADS == COMBINE_THREADS && COMBINE_SCRATCH <= SMEM_BYTES,
                  "a block combines with the step's threads in its shared memory");
    const i64 splits = (i64)p.num_splits * p.row_blocks * p.heads_kv * p.batch;
    if (blockIdx.x >= splits) return combine_counted(p, blockIdx.x - splits, reinterpret_cast<char*>(smem));
  }
  decode_rows<COLUMNS, COUNTED>(p);
}

extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) ${name}(const fg_decode_params p) {
  decode_block<false, false>(p);
}
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) ${name}_columns(const fg_decode_params p) {
  decode_block<true, false>(p);
}
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) ${name}_counted(const fg_decode_params p) {
  decode_block<false, true>(p);
}
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) ${name}_columns_counted(const fg_decode_params p) {
  decode_block<true, true>(p);
}
]]

-- A pair's end (sm_90): the row block's two splits, a cluster of two
-- thread blocks, add their rows from each other's slots (lib_cluster).
local pair_end = [[
    if (paired) {
      // The cluster's blocks are the row block's splits 0 and 1 (its ranks:
      // the split is blockIdx.x's fastest part). Once both have their rows
      // in their slots, each adds the two splits' (split 0's first) for half
      // of the rows' column groups and writes o and lse; the second barrier
      // keeps a block's slots until the other has read them.
      cluster_arrive();
      cluster_wait();
      const u32 slots0 = cluster_map(smem_addr(sPair), 0), slots1 = cluster_map(smem_addr(sPair), 1);
      constexpr int C4 = ${v_padded} / 4;
      const int rows_in = min(block_rows, p.rows - row0);
#pragma unroll 1
      for (int x = split * THREADS + tid; x < rows_in * C4; x += 2 * THREADS) {
        const int row = x / C4, c = 4 * (x % C4), pr = row0 + row;
        if (c >= ${v_dim}) continue;
        const u32 at_l = (MAX_ROWS * ${v_padded} + row) * 4, at_o = (row * ${v_padded} + c) * 4;
        const float l0 = ld_cluster_f32(slots0 + at_l), l1 = ld_cluster_f32(slots1 + at_l);
        const float4 y0 = ld_cluster_f4(slots0 + at_o), y1 = ld_cluster_f4(slots1 + at_o);
        const float m = fmaxf(l0, l1);  // finite where either split saw a key
        const float w0 = l0 == FG_NEG_INF ? 0.f : fast_exp2(l0 - m);
        const float w1 = l1 == FG_NEG_INF ? 0.f : fast_exp2(l1 - m);
        const float l = w0 + w1, inv = l > 0.f ? 1.f / l : 0.f;
        const int i = pr / p.group, h = hk * p.group + pr % p.group;
        u32* const out = (u32*)((u16*)p.o + b * p.o_sb + (i64)i * p.o_ss + h * p.o_sh + c);
        out[0] = pack2((w0 * y0.x + w1 * y1.x) * inv, (w0 * y0.y + w1 * y1.y) * inv);
        out[1] = pack2((w0 * y0.z + w1 * y1.z) * inv, (w0 * y0.w + w1 * y1.w) * inv);
        if (c == 0 && p.lse)
          ((float*)p.lse)[((i64)b * p.heads_q + h) * p.seqlen_q + i] =
              l > 0.f ? (m + log2f(l)) * 0.69314718055994531f : FG_NEG_INF;
      }
      cluster_arrive();
      cluster_wait();
    }
]]

-- A warp's step over sub-tile st of U parts side by side (sKu, sVu: their K
-- and V in the ring; n0u: their first keys; two tiles, or a tile's halves):
-- S for 16 rows x 16 U keys, the mask and logits, one softmax update, then
-- O += P·V part by part; st below `sub_tiles`, a part's 16-key sub-tiles.
local sub_tile_step = [[
    for (int st = st_first; st < ${sub_tiles}; st += st_step) {
      // S = Q·Kᵀ for 16 rows x 16 keys of each tile, fp32
      float acc_s[1][2 * ${U}][4];
#pragma unroll
      for (int nt = 0; nt < 2 * ${U}; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_s[0][nt][e] = 0.f;
#pragma unroll
      for (int ks = 0; ks < HEAD_DIM_PADDED / 16; ++ks) {
        u32 a[4];
        if (Q_IN_REGS) {
#pragma unroll
          for (int x = 0; x < 4; ++x) a[x] = qa[Q_IN_REGS ? ks : 0][x];
        } else {
          ldmatrix_x4(a, sQ + ${q_at});
        }
#pragma unroll
        for (int u = 0; u < ${U}; ++u) {
          u32 bk[4];
          ldmatrix_x4(bk, sKu[u] + ${k_at});
          mma_16x8x16(acc_s[0][2 * u], a, bk[0], bk[1]);
          mma_16x8x16(acc_s[0][2 * u + 1], a, bk[2], bk[3]);
        }
      }
      // ${mask_comment}: keys outside each row's [lo, hi)
#pragma unroll
      for (int nt = 0; nt < 2 * ${U}; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = n0u[nt >> 1] + st * 16 + (nt & 1) * 8 + 2 * t + (e & 1);
${logits}          if ((j < lo[e >> 1] || j >= hi[e >> 1])${predicate}) acc_s[0][nt][e] = FG_NEG_INF;
        }
${softmax}
      // O += P·V: P's accumulators are the A fragment of a 16-key step
#pragma unroll
      for (int u = 0; u < ${U}; ++u) {
        u32 a[4];
        a[0] = pack2(acc_s[0][2 * u][0], acc_s[0][2 * u][1]);
        a[1] = pack2(acc_s[0][2 * u][2], acc_s[0][2 * u][3]);
        a[2] = pack2(acc_s[0][2 * u + 1][0], acc_s[0][2 * u + 1][1]);
        a[3] = pack2(acc_s[0][2 * u + 1][2], acc_s[0][2 * u + 1][3]);
#pragma unroll
        for (int dp = 0; dp < N_TILES_O / 2; ++dp) {
          if (COLUMNS && (dp & (warps_n - 1)) != wn) continue;
          u32 bv[4];  // 16 keys x two 8-column tiles of V, transposed on load
          ldmatrix_x4_trans(bv, sVu[u] + ${v_at});
          mma_16x8x16(acc_o[0][2 * dp], a, bv[0], bv[1]);
          mma_16x8x16(acc_o[0][2 * dp + 1], a, bv[2], bv[3]);
        }
      }
    }
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
  local side = p.side
  -- the main loop's parts: the tile, or its SIDE parts of BLOCK_N / SIDE keys
  local part_rows = "BLOCK_N / " .. side .. " * SMEM_ROW * 2"
  local k_parts, v_parts, n_parts = {}, {}, {}
  for u = 0, side - 1 do
    k_parts[#k_parts + 1] = u == 0 and "sK" or ("sK + " .. u .. " * " .. part_rows)
    v_parts[#v_parts + 1] = u == 0 and "sV" or ("sV + " .. u .. " * " .. part_rows)
    n_parts[#n_parts + 1] = u == 0 and "n0" or ("n0 + " .. u .. " * BLOCK_N / " .. side)
  end
  local tile_parts = text.fill([[
    const u32 sKu[${n}] = { ${k} }, sVu[${n}] = { ${v} };
    const int n0u[${n}] = { ${j} };
]], { n = side, k = table.concat(k_parts, ", "), v = table.concat(v_parts, ", "),
      j = table.concat(n_parts, ", ") })
  local qk, vw = width.qk(p), width.v(p)
  local base = "fg_decode_" .. p.target_tag .. "_" .. p.spec_name .. "_n" .. p.block_n .. "r"
               .. p.max_rows .. "s" .. p.stages
  local names = { append = base .. "_append", decode = base, combine = base .. "_combine" }
  local ways = { columns = base .. "_columns", counted_step = base .. "_counted",
                 counted_columns = base .. "_columns_counted", pairs = p.pair_at > 0 }
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
#define MIN_BLOCKS ${min_blocks}  // blocks an SM its registers leave room for (fwd_decode.c)
#define STAGE_BYTES ${stage_bytes}
#define PAGES_AT (SMEM_BYTES - STAGES * BLOCK_N * 4)  // the pages' slots end the shared memory
// O's columns a round of the merge: all where the ring holds every warp's
// rows of them, their maxima and sums, else 64
#define MERGE_COLS (STAGES * STAGE_BYTES >= WARPS * 16 * (${v_padded} + 4 + 2) * 4 || ${v_padded} < 64 ? ${v_padded} : 64)
#define MERGE_ROUNDS ((${v_padded} + MERGE_COLS - 1) / MERGE_COLS)
#define O_ROW (MERGE_COLS + 4)  // O's rows in the merge, fp32
#define N_TILES_O (${v_padded} / 8)
#define Q_IN_REGS (HEAD_DIM_PADDED <= 128)  // Q's fragments kept in registers
// A warp's 16-key sub-tiles of a tile taken side by side, one softmax over
// them: the tile as SIDE parts of BLOCK_N / SIDE keys (fwd_decode.c)
#define SIDE ${side}
// A pair's slots (two splits in a cluster of two, sm_90): bytes into the
// ring, past the merge's; 0: no pairs (fwd_decode.c)
#define PAIR_AT ${pair_at}
]], setmetatable({ stage_bytes = width.same(p) and "(2 * BLOCK_N * SMEM_ROW * 2)"
                                   or "(BLOCK_N * (SMEM_ROW + SMEM_ROW_V) * 2)",
                     v_padded = vw.padded }, { __index = p }))
    .. width.defines(p, p.head_dim_v_padded, p.smem_row_v)
  local frag_o = fragment.mma_m16n8({ array = "acc_o", m_tiles = "1", n_tiles = "N_TILES_O",
                                      n_var = "dn" })
  -- the softmax update of a step over u tiles' sub-tiles (2 u 8-key tiles)
  local function update(u)
    local frag_s = fragment.mma_m16n8({ array = "acc_s", m_tiles = "1", n_tiles = tostring(2 * u) })
    return softmax.update(frag_s, frag_o, { to_log2 = logits.to_log2(p, "p"), row_max = "row_max",
                                            row_sum = "row_sum" })
  end
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
      params = "p", slope = "slope[e >> 1]", d = "(float)j - diag_row[e >> 1]",
      at = at }), 10) .. "\n"
  end
  local predicate = logits.mask_test(p, "p", at)
  local q_at = width.lane_at(qk, "q_lane", nil, "2 * ks")  -- Q's A fragment ks
  -- Q's fragments into registers (qa), once Q has landed
  local q_to_registers = "\n#pragma unroll\n      for (int ks = 0; ks < (Q_IN_REGS ? HEAD_DIM_PADDED / 16 : 0); ++ks)"
                         .. " ldmatrix_x4(qa[ks], sQ + " .. q_at .. ");"
  local function step(u, sub_tiles)
    return text.fill(sub_tile_step, {
      U = u, q_at = q_at, sub_tiles = sub_tiles,
      k_at = width.lane_at(qk, "k_lane", "st * 16", "2 * ks"),
      v_at = width.lane_at(vw, "v_lane", "st * 16", "2 * dp"),
      mask_comment = logits.transformed(p) and "logits, then the mask" or "mask",
      -- | not ||: the predicate's reads on every key, no branch each
      predicate = predicate and (" | !" .. predicate) or "",
      logits = rewrite, softmax = text.indent_code(update(u), 6) })
  end
  local chunk_defines, kv_loads = kv_copies(p)
  local clusters = p.arch >= 90  -- a pair's blocks, a cluster of two
  local prelude = isa.prelude(p.dtype) .. (clusters and "\n" .. cluster.source .. cluster.loads or "")
  local source = table.concat({
    banner, constants, device.source, prelude, p.params_struct, logits.device(p), kv_cache.common(p),
    kv_cache.append(p, names.append, false, "fg_decode_params"),
    kv_cache.combine(p, names.combine, vw.name, vw.padded),
    text.fill(decode, { block_start = kv_cache.block_start({ q_at = width.at(qk, "r", "k"), q_by_rows = true, share32 = true }), name = names.decode,
                        lanes = fragment.lane_decl(frag_o),
                        layout = qk.swizzled and "rows of 128-byte swizzled chunks (lib_width)"
                                 or "rows padded against bank conflicts",
                        q_lane = width.lane(qk, "q_lane", "16 * wm + (lane & 15)", "lane >> 4"),
                        k_lane = width.lane(qk, "k_lane", "(lane & 7) + (lane >> 4) * 8", "(lane >> 3) & 1"),
                        v_lane = width.lane(vw, "v_lane", "(lane & 7) + ((lane >> 3) & 1) * 8", "lane >> 4"),
                        q_to_registers = q_to_registers,
                        tile_step = step(side, "BLOCK_N / " .. 16 * side),
                        pair_step = step(2, "BLOCK_N / 16"), tile_parts = tile_parts,
                        visible_keys = kv_cache.visible_keys(p), pages = kv_cache.pages(chunk_defines),
                        kv_loads = kv_loads, v_dim = vw.name, v_padded = vw.padded,
                        store_rows = kv_cache.store_rows({
                          sum = "    const float l = sum[r];", max2 = "m2[r]", col0 = "0",
                          tiles = "N_TILES_O", take = "((dn >> 1) & (warps_n - 1)) == wn", first = "wn == 0",
                          v_dim = vw.name, v_padded = vw.padded,
                          acc0 = "acc_o[0][dn][2 * r]", acc1 = "acc_o[0][dn][2 * r + 1]" }),
                        v_rows = width.same(p) and "" or " (V's of SMEM_ROW_V)",
                        paired = clusters and "PAIR_AT > 0 && cluster_blocks() == 2" or "false",
                        pair_end = clusters and text.fill(pair_end, { v_dim = vw.name, v_padded = vw.padded }) or "",
                        logits_rows = logits_rows,
                        to_log2 = logits.to_log2(p, "p"),
                        row_init = text.indent(logits.row_init(p, {
                          params = "p", head = "h", max = "row_max[0][r]", sum = "row_sum[0][r]",
                          first_lane = "t == 0",
                          takes = "split == 0 && (wn == 0 || COLUMNS) && pr < p.rows" }), 4) }),
  }, "\n")
  return { source = source, name = names.decode,
           launches = kv_cache.launches(p, names.append, names.decode, names.combine, ways) }
end
