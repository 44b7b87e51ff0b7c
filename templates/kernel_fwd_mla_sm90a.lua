-- A decoding step over a latent cache on sm_90a (fwd_mla_sm90a): the
-- computation of kernel_fwd_mla.lua with warpgroup MMAs, for calls of many
-- query rows a KV head. Two kernels, launched in this order:
--   append   copies k_new into the cache and zeroes a split call's turn
--            counters (lib_kv_cache)
--   mla      one thread block per (split, row block, KV head, sequence):
--            ROWS = 64 query rows (GQA packing, row i * group + head in
--            group) against the split's share of the key tiles. Two
--            warpgroups, both over all 64 rows. A step is two tiles of
--            BLOCK_N = 32 keys: warpgroup w computes the scores of tile
--            2 step + w (wgmma, Q and K from shared memory), the two share
--            their rows' maxima, each writes its P into a shared box, and
--            each adds P·V of both tiles to its half of O's columns (its
--            own P from registers, the other's from the box; V the K
--            tiles' first columns, read MN-major). The tiles of the next
--            step are copied meanwhile (cp.async, every thread) into the
--            other two of four slots, 128-byte swizzled as the wgmma
--            descriptors read them, from pages of any size.
-- With one split it writes O and lse; else its part, and the last split
-- merges them (lib_kv_cache).
local text = import("lib_text")
local device = import("lib_device")
local kv_cache = import("lib_kv_cache")
local isa_for = import("isa")
local sm90a = import("isa_sm90a")

local mla = [[
${visible_keys}// Key j's block table entry (0 without a table or past `keys`), read a step
// before its copies.
__device__ __forceinline__ int page_entry(const fg_decode_params& p, int b, int j, int keys) {
  if (!p.block_table || j >= keys) return 0;
  const int at = p.page_shift >= 0 ? j >> p.page_shift : j / p.page_size;
  return ((const int*)p.block_table)[(i64)b * p.block_table_stride + at];
}

// Key j's row of the cache, given its page's entry.
__device__ __forceinline__ const u16* key_row(const fg_decode_params& p, int b, int hk, int j, int entry) {
  i64 unit = b, row = j;
  if (p.block_table) {
    unit = min(max(entry, 0), p.num_pages - 1);
    row = p.page_shift >= 0 ? j & (p.page_size - 1) : j % p.page_size;
  }
  return (const u16*)p.k + unit * p.k_sb + row * p.k_ss + hk * p.k_sh;
}

// A tile's row tid / 8 into a slot: this thread's chunk tid % 8 of each
// 64-column box (swizzled: XOR the row's index within its eight), zeros
// where the key is not in.
__device__ __forceinline__ void load_row(u32 slot, const u16* src, bool in, int tid) {
  const int r = tid >> 3, c = tid & 7;
  const u32 dst = slot + r * 128 + ((c ^ (r & 7)) << 4);
#pragma unroll
  for (int box = 0; box < BOXES; ++box) copy16(dst + box * K_BOX, src + box * 64 + c * 8, in ? 16 : 0);
}

// Keeps the compiler from moving accumulators across the asynchronous MMAs.
template <int COUNT> __device__ __forceinline__ void hold(float* x) {
#pragma unroll
  for (int i = 0; i < COUNT; ++i) wgmma_hold(x[i]);
}

// Descriptors advance by 16-byte units in their low bits (shared addresses
// stay below 2^18, so the field never carries).
// S = Q·Kᵀ (64 x BLOCK_N) for the block's rows and a tile (dq, dk: their
// first boxes): 16-wide slices of the head dim, four per box. Issued, not
// waited for.
__device__ __forceinline__ void s_gemm(float* sc, u64 dq, u64 dk) {
#pragma unroll
  for (int ks = 0; ks < HEAD_DIM / 16; ++ks) {
    const u32 at = 2 * (ks % 4);  // the slice's 32 bytes within its 128-byte rows
    ${wgmma_s}<0, 0>(sc, dq + (ks / 4) * (Q_BOX / 16) + at, dk + (ks / 4) * (K_BOX / 16) + at, ks > 0);
  }
}

// O += P·V (64 x HALF) over a tile's keys, 16 at a time (dv: V's first
// columns, MN-major, boxes K_BOX apart); P from registers (pk) or from
// P's box (dp: the tile's first key). Issued, not waited for.
__device__ __forceinline__ void pv_registers(float* o, const u32* pk, u64 dv) {
#pragma unroll
  for (int kc = 0; kc < BLOCK_N / 16; ++kc) ${wgmma_rs}<1>(o, pk + 4 * kc, dv + kc * 128, 1);
}
__device__ __forceinline__ void pv_shared(float* o, u64 dp, u64 dv) {
#pragma unroll
  for (int kc = 0; kc < BLOCK_N / 16; ++kc) ${wgmma_ss}<0, 1>(o, dp + kc * 2, dv + kc * 128, 1);
}

extern "C" __global__ void __launch_bounds__(THREADS, 1) ${name}(const fg_decode_params p) {
  extern __shared__ u128 smem[];
  // Q [BOXES][ROWS x 128 bytes], STAGES slots of K [BOXES][BLOCK_N x 128
  // bytes] (tile x in slot x % STAGES), P [ROWS x 128 bytes] (a step's two
  // tiles' keys), all 128-byte swizzled from 1024-byte boundaries; then the
  // rows' maxima of both warpgroups, float [2][ROWS]
  const u32 base = smem_addr(smem);
  const u32 sQ = (base + 1023u) & ~1023u, sRing = sQ + BOXES * Q_BOX;
  const u32 sP = sRing + STAGES * SLOT_BYTES;
  float* const sStat = reinterpret_cast<float*>(reinterpret_cast<char*>(smem) + (sP + ROWS * 128 - base));
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = tid >> 7;
  const int g = lane >> 2, t = lane & 3;  // accumulator row group and column pair
  const int wm = warp & 3;                // the warp's 16 rows of the 64

  int x = blockIdx.x;
  const int split = x % p.num_splits;
  x /= p.num_splits;
  const int rb = x % p.row_blocks;
  x /= p.row_blocks;
  const int hk = x % p.heads_kv, b = x / p.heads_kv;
  const int block_rows = ROWS, row0 = rb * ROWS;
${block_start}
  // step j's tiles 2j, 2j + 1 in their slots, row tid / 8 of each (zeros
  // past the split's tiles); entry: the rows' pages
  const int steps = (tiles + 1) / 2;
  auto key_of = [&](int tile) { return (t_begin + tile) * BLOCK_N + (tid >> 3); };
  auto entries = [&](int j, int* entry) {
#pragma unroll
    for (int u = 0; u < 2; ++u) entry[u] = 2 * j + u < tiles ? page_entry(p, b, key_of(2 * j + u), keys) : 0;
  };
  auto load_step = [&](int j, const int* entry) {
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int tile = 2 * j + u, key = key_of(tile);
      const bool in = tile < tiles && key < keys;
      load_row(sRing + (tile % STAGES) * SLOT_BYTES, in ? key_row(p, b, hk, key, entry[u]) : (const u16*)p.k,
               in, tid);
    }
    copy_commit();
  };
  {
    int entry[2][2];
    entries(0, entry[0]);
    entries(1, entry[1]);
    load_step(0, entry[0]);  // with Q's copies
    if (steps > 1) load_step(1, entry[1]);
    else copy_commit();
  }

  float acc_o[HALF / 2];  // O's rows (g, g + 8) x this warpgroup's half of the columns
#pragma unroll
  for (int i = 0; i < HALF / 2; ++i) acc_o[i] = 0.f;
  float row_max[2] = {FG_NEG_INF, FG_NEG_INF}, row_sum[2] = {0.f, 0.f};  // row_sum: own keys'
  u32 pk[BLOCK_N / 4];  // P of this warpgroup's tile, as the A registers of P·V
  const u64 dq = smem_desc_sw128(sQ, 16, 1024);
  const u64 dp = smem_desc_sw128(sP + 64 * (1 - wg), 16, 1024);  // the other warpgroup's keys
  copy_wait<1>();
  fence_async_shared();  // the copies' writes, seen by the wgmmas
  __syncthreads();

  for (int j = 0; j < steps; ++j) {
    const int own = 2 * j + wg;
    const u32 k_own = sRing + (own % STAGES) * SLOT_BYTES;
    const u32 k_other = sRing + ((2 * j + 1 - wg) % STAGES) * SLOT_BYTES;
    int ahead[2];  // the pages of step j + 2's rows, read now, used after P·V
    entries(j + 2, ahead);

    float acc_s[BLOCK_N / 2];
    wgmma_fence();
    s_gemm(acc_s, dq, smem_desc_sw128(k_own, 16, 1024));
    wgmma_commit();
    wgmma_wait<0>();
    hold<BLOCK_N / 2>(acc_s);

    // the mask: keys outside each row's [lo, hi), and all of a tile past the
    // split's (none to test where the warp's rows see the whole tile); the
    // rows' maxima over this tile, then over both
    const int n0 = (t_begin + own) * BLOCK_N;
    const bool whole = __all_sync(0xffffffffu, own < tiles && n0 >= max(lo[0], lo[1]) &&
                                                   n0 + BLOCK_N <= min(hi[0], hi[1]));
    float mx[2] = {FG_NEG_INF, FG_NEG_INF};
#pragma unroll
    for (int i = 0; i < BLOCK_N / 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = n0 + 8 * i + 2 * t + (e & 1);
        float s = acc_s[4 * i + e];
        if (!whole && (own >= tiles || key < lo[e >> 1] || key >= hi[e >> 1])) s = FG_NEG_INF;
        acc_s[4 * i + e] = s;
        mx[e >> 1] = fmaxf(mx[e >> 1], s);
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      if (t == 0) sStat[wg * ROWS + 16 * wm + g + 8 * r] = mx[r];
    }
    __syncthreads();  // both warpgroups' maxima
    float alpha[2], base2[2], sum[2] = {0.f, 0.f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = 16 * wm + g + 8 * r;
      const float m = fmaxf(row_max[r], fmaxf(sStat[row], sStat[ROWS + row]));
      base2[r] = m == FG_NEG_INF ? 0.f : m * ${to_log2};
      alpha[r] = row_max[r] == m ? 1.f : row_max[r] == FG_NEG_INF ? 0.f : fast_exp2(row_max[r] * ${to_log2} - base2[r]);
      row_max[r] = m;
    }
    // P = 2^(s·scale·log2 e - max): into the A registers and P's box (this
    // warpgroup's 32 keys of its rows, chunks 4 wg..); O and the sums rescaled
#pragma unroll
    for (int i = 0; i < BLOCK_N / 8; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float s = acc_s[4 * i + e];
        const float pe = s == FG_NEG_INF ? 0.f : fast_exp2(s * ${to_log2} - base2[e >> 1]);
        acc_s[4 * i + e] = pe;
        sum[e >> 1] += pe;
      }
      pk[2 * i] = pack2(acc_s[4 * i], acc_s[4 * i + 1]);          // row g
      pk[2 * i + 1] = pack2(acc_s[4 * i + 2], acc_s[4 * i + 3]);  // row g + 8
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = 16 * wm + g + 8 * r;
        st_shared_u32(sP + row * 128 + (((4 * wg + i) ^ (row & 7)) << 4) + 4 * t, pk[2 * i + r]);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) row_sum[r] = row_sum[r] * alpha[r] + sum[r];
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f))  // a row's maximum moved
#pragma unroll
      for (int i = 0; i < HALF / 2; ++i) acc_o[i] *= alpha[(i >> 1) & 1];
    fence_async_shared();
    __syncthreads();  // both warpgroups' P

    wgmma_fence();
    pv_registers(acc_o, pk, smem_desc_sw128(k_own + wg * HALF_BOXES * K_BOX, K_BOX, 1024));
    pv_shared(acc_o, dp, smem_desc_sw128(k_other + wg * HALF_BOXES * K_BOX, K_BOX, 1024));
    wgmma_commit();
    wgmma_wait<0>();
    hold<HALF / 2>(acc_o);
    copy_wait<0>();  // step j + 1's tiles (this thread's copies)
    fence_async_shared();
    __syncthreads();  // every thread done with step j's slots and P; step j + 1's in
    if (j + 2 < steps) load_step(j + 2, ahead);
  }

  // the rows' sums: this warpgroup's keys, then both
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 1);
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 2);
    if (t == 0) sStat[wg * ROWS + 16 * wm + g + 8 * r] = row_sum[r];
  }
  __syncthreads();
  const i64 all_rows = (i64)p.batch * p.heads_q * p.seqlen_q;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = 16 * wm + g + 8 * r, pr = row0 + row;
    if (pr >= p.rows) continue;
    const float l = sStat[row] + sStat[ROWS + row];
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const float lse2 = l > 0.f ? row_max[r] * ${to_log2} + log2f(l) : FG_NEG_INF;  // base 2
    const int i = pr / p.group, h = hk * p.group + pr % p.group;
    const i64 out_row = ((i64)b * p.heads_q + h) * p.seqlen_q + i;  // lse's (B, Hq, Sq)
    if (p.num_splits == 1) {
      u16* out = (u16*)p.o + b * p.o_sb + (i64)i * p.o_ss + h * p.o_sh + wg * HALF + 2 * t;
#pragma unroll
      for (int dn = 0; dn < HALF / 8; ++dn)
        *(u32*)(out + dn * 8) = pack2(acc_o[4 * dn + 2 * r] * inv, acc_o[4 * dn + 2 * r + 1] * inv);
      if (wg == 0 && t == 0 && p.lse) ((float*)p.lse)[out_row] = lse2 * 0.69314718055994531f;
    } else {
      const i64 part = split * all_rows + out_row;
      float* o = (float*)p.o_part + part * HEAD_DIM_V + wg * HALF + 2 * t;
#pragma unroll
      for (int dn = 0; dn < HALF / 8; ++dn)
        *(float2*)(o + dn * 8) = make_float2(acc_o[4 * dn + 2 * r] * inv, acc_o[4 * dn + 2 * r + 1] * inv);
      if (wg == 0 && t == 0) ((float*)p.lse_part)[part] = lse2;
    }
  }
  if (p.num_splits == 1) return;

  float* const sM = sStat;  // the merge's [ROWS] maxima and [ROWS] sums
  float* const sL = sStat + ROWS;
${merge}}
]]

return function(p)
  if not p.latent then error("kernel_fwd_mla_sm90a takes a latent cache (spec.kv_cache FG_KV_LATENT)") end
  if p.head_dim % 64 ~= 0 or p.head_dim_v % 128 ~= 0 then
    error("kernel_fwd_mla_sm90a: the head dim must be a multiple of 64, the value head dim of 128")
  end
  if p.rows ~= 64 or p.block_n ~= 32 or p.stages ~= 4 or p.warps ~= 8 then
    error("kernel_fwd_mla_sm90a takes 64 rows, tiles of 32 keys, four slots and eight warps")
  end
  local base = "fg_mla_" .. p.target_tag .. "_" .. p.spec_name .. "_wg"
  local names = { append = base .. "_append", mla = base }
  local banner = text.fill([[
// ${name}
// Generated by flashgen ${version}: decoding step over a latent cache, wgmma.
// spec: ${spec_name} (dtype ${dtype}, head dim ${head_dim}, value head dim ${head_dim_v} (K's
//       first columns), mask ${mask})
// plan: rows=${rows} Bc=${block_n} (a warpgroup's tile of a step) slots=${stages} warps=${warps}
//       shared memory ${smem_bytes} bytes; target ${target}
]], {
    name = base, version = p.generator_version, spec_name = p.spec_name, dtype = p.dtype,
    head_dim = p.head_dim, head_dim_v = p.head_dim_v, mask = p.mask, block_n = p.block_n,
    rows = p.rows, stages = p.stages, warps = p.warps, smem_bytes = p.smem_bytes,
    target = p.target })
  local constants = text.fill([[
#define HEAD_DIM ${head_dim}
#define HEAD_DIM_PADDED ${head_dim}
#define HEAD_DIM_V ${head_dim_v}
#define BOXES ${boxes}
#define HALF_BOXES ${half_boxes}
#define HALF (HALF_BOXES * 64)     // a warpgroup's O columns
#define BLOCK_N ${block_n}
#define ROWS ${rows}
#define Q_BOX (ROWS * 128)         // bytes of one Q box: ROWS rows x 64 columns
#define K_BOX (BLOCK_N * 128)      // ... of one K box
#define SLOT_BYTES (BOXES * K_BOX)
#define MAX_SPLITS ${max_splits}
#define STAGES ${stages}
#define WARPS ${warps}
#define THREADS ${threads}
]], p)
  local wgmma_s = { sm90a.wgmma(p.block_n, p.dtype, false) }
  local wgmma_rs = { sm90a.wgmma(p.half_boxes * 64, p.dtype, true) }
  local wgmma_ss = { sm90a.wgmma(p.half_boxes * 64, p.dtype, false) }
  local source = table.concat({
    banner, constants, device.source, (isa_for(80).prelude(p.dtype)), sm90a.source,
    wgmma_s[2], wgmma_rs[2], wgmma_ss[2], p.params_struct, kv_cache.common,
    kv_cache.append(p, names.append, true),
    text.fill(mla, { block_start = kv_cache.block_start(
                       "(k >> 3) * Q_BOX + r * 128 + (((k & 7) ^ (r & 7)) << 4)", false), name = names.mla,
                     visible_keys = kv_cache.visible_keys(p), to_log2 = "p.scale_log2", wgmma_s = wgmma_s[1],
                     wgmma_rs = wgmma_rs[1], wgmma_ss = wgmma_ss[1],
                     merge = kv_cache.merge("HEAD_DIM_V", "HEAD_DIM_V") }),
  }, "\n")
  local launches = {
    -- one thread per 16-byte chunk of each item (none: not launched)
    { entry = names.append, threads = p.threads, smem = 0,
      grid = { { "append_items", scale = p.head_dim // 8, per = p.threads } } },
    { entry = names.mla, threads = p.threads, smem = p.smem_bytes,
      grid = { { "num_splits" }, { "row_blocks" }, { "heads_kv" }, { "batch" } } },
  }
  return { source = source, name = names.mla, launches = launches }
end
