-- A decoding step over a latent cache on sm_90a (fwd_mla_sm90a): the
-- computation of kernel_fwd_mla.lua with warpgroup MMAs. Three kernels,
-- launched in this order:
--   append   copies k_new into the cache (lib_kv_cache)
--   mla      one thread block per (split, row block, KV head, sequence):
--            ROWS = 64 query rows (GQA packing, row i * group + head in
--            group) against the split's share of the key tiles (BLOCK_N =
--            64 keys), held in a ring of two slots. Two warpgroups, each
--            over all 64 rows and half of O's columns:
--              the S warpgroup, per tile: S = Q·Kᵀ (wgmma, Q and K from
--              shared memory), the mask and the online softmax (the rows'
--              maxima and sums are its own), P into the slot's last box
--              (past V's columns, free once S has read it) and the rows'
--              factors of O into shared memory, then its half of O += P·V
--              with P from registers;
--              the V warpgroup: the copies (bulk tensor copies through
--              the cache's map, p.kv_map, where the host made one: a
--              contiguous cache or pages of a multiple of 8 rows; else
--              cp.async from pages of any size; both into the 128-byte
--              swizzled layout the wgmma descriptors read, a tile's slot
--              refilled once both are done with it), and per tile its
--              half of O, rescaled, += P·V with P from the slot.
--            So the V warpgroup's P·V of one tile runs while the S
--            warpgroup computes the next one's S and softmax.
--   narrow   in place of mla where a KV head has at most 16 query rows
--            (heads x queries): the same step with the products transposed
--            (Sᵀ = K·Qᵀ, Oᵀ += Vᵀ·Pᵀ: keys and O's columns along the MMAs'
--            64 rows, the query rows along their 16 columns), one
--            warpgroup for the MMAs and the softmax, the other the copies.
--            A call of two splits launches it in clusters of two, a row
--            block's two splits each: the second hands its accumulators to
--            the first through the first's shared memory, which adds them
--            and writes O as one split does (no parts, no combine kernel).
-- With one split it writes O and lse; else its part, and the combine kernel
-- adds the parts (lib_kv_cache).
local text = import("lib_text")
local device = import("lib_device")
local kv_cache = import("lib_kv_cache")
local isa_for = import("isa")
local sm90a = import("isa_sm90a")

-- The copies of the cache's tiles, the second warpgroup's in both kernels:
-- the helpers (entries, load_tile, landed: cp.async; locate, bulk_tile:
-- bulk copies) and the first tiles' copies with Q's.
local copies = [[
    // The copies, by the second warpgroup (u: its thread), into the ring's
    // slots, a slot refilled once the warpgroups that read it are done.
    // Without a map (cp.async), each tile's copies are awaited (and fenced
    // for the wgmmas) before the full barrier is arrived at, a tile after
    // they are issued: thread u copies rows u / 8 + 16 q of a tile, chunk
    // u % 8 of each box (a warp's copy reads four whole 128-byte rows), its
    // pages read a tile ahead.
    const int u = tid - 128, c = u & 7;
    auto key_of = [&](int j, int q) { return (t_begin + j) * BLOCK_N + (u >> 3) + 16 * q; };
    int entry[BLOCK_N / 16];
    auto entries = [&](int j) {
#pragma unroll
      for (int q = 0; q < BLOCK_N / 16; ++q) entry[q] = j < tiles ? page_entry(p, b, key_of(j, q), keys) : 0;
    };
    auto load_tile = [&](int j) {
#pragma unroll
      for (int q = 0; q < BLOCK_N / 16; ++q) {
        const int key = key_of(j, q), r = (u >> 3) + 16 * q;
        const bool in = key < keys;
        load_row(sRing + (j % STAGES) * K_BOX, in ? key_row(p, b, hk, key, entry[q]) : (const u16*)p.k, in, r, c);
      }
      copy_commit();
    };
    auto landed = [&](int j) {  // tile j's copies (the only ones in flight)
      copy_wait_all();
      fence_async_shared();
      mbar_arrive(full + 8 * (j % STAGES));
    };
    // With the map, lane l of the first warp copies keys l * rows .. of a
    // tile (a run within one page, or the sequence's rows), the full
    // barrier counting the bytes; the next tile's runs are looked up as
    // each tile's copies are issued.
    const int rows = p.kv_box_rows;
    const bool copier = bulk && warp == 4;
    const u64 read_once = read_once_policy();  // the cache's tiles are read once a block
    int unit = 0, row = 0;
    auto locate = [&](int j) {
      const int key = (t_begin + j) * BLOCK_N + lane * rows;
      unit = row = 0;  // past the keys: any rows, V's cleared (clear_past_keys)
      if (j < tiles && lane * rows < BLOCK_N && key < keys) cache_at(p, b, key, unit, row);
    };
    auto bulk_tile = [&](int j) {
      const u32 bar = full + 8 * (j % STAGES), dst = sRing + (j % STAGES) * K_BOX + lane * rows * 128;
      if (lane == 0) mbar_arrive_expect(bar, BOXES * K_BOX);
      __syncwarp();
      if (lane * rows < BLOCK_N)
#pragma unroll
        for (int box = 0; box < BOXES; ++box)
          tma_load_4d_policy(dst + box * RING_BOX, &p.kv_map, bar, 64 * box, row, hk, unit, read_once);
      locate(j + 1);
    };
    if (bulk) {
      if (copier) {
        locate(0);
        for (int j = 0; j < STAGES && j < tiles; ++j) bulk_tile(j);
      }
      copy_commit();  // this warpgroup's copies of Q
      copy_wait_all();
      fence_async_shared();
      mbar_arrive(q_in);
    } else {
      entries(0);
      load_tile(0);  // with Q's copies
      entries(1);
      if (tiles > 1) load_tile(1);
      if (tiles > 1) copy_wait<1>();
      else copy_wait_all();
      fence_async_shared();
      mbar_arrive(full);
    }
]]

local mla = [[
${visible_keys}// A bool known when compiling, for a lambda that takes both ways.
template <bool B> struct known { static constexpr bool value = B; };

// Key j's block table entry (0 without a table or past `keys`), read a step
// before its copies.
__device__ __forceinline__ int page_entry(const fg_decode_tma_params& p, int b, int j, int keys) {
  if (!p.block_table || j >= keys) return 0;
  const int at = p.page_shift >= 0 ? j >> p.page_shift : j / p.page_size;
  return ((const int*)p.block_table)[(i64)b * p.block_table_stride + at];
}

// Key j's row of the cache, given its page's entry.
__device__ __forceinline__ const u16* key_row(const fg_decode_tma_params& p, int b, int hk, int j, int entry) {
  i64 unit = b, row = j;
  if (p.block_table) {
    unit = min(max(entry, 0), p.num_pages - 1);
    row = p.page_shift >= 0 ? j & (p.page_size - 1) : j % p.page_size;
  }
  return (const u16*)p.k + unit * p.k_sb + row * p.k_ss + hk * p.k_sh;
}

// Row r of a tile into its slot (slot: its first box): chunk c of each
// 64-column box, swizzled (the chunk's index XOR the row's within its
// eight), zeros where the key is not in.
__device__ __forceinline__ void load_row(u32 slot, const u16* src, bool in, int r, int c) {
#pragma unroll
  for (int box = 0; box < BOXES; ++box)
    copy16_read_once(slot + box * RING_BOX + r * 128 + ((c ^ (r & 7)) << 4), src + box * 64 + c * 8, in ? 16 : 0);
}

// The last tile's rows past the keys (first: the keys' count in it) of a
// slot that bulk copies filled: they hold what the pages hold, and P is 0
// there, but 0 · NaN is not, so V's rows are cleared (S's are masked), by
// the warpgroup of the MMAs (tid < 128; cleared: once a block).
__device__ __forceinline__ void clear_past_keys(u32 slot, int first, int tid, u32 cleared) {
  zero_rows(slot, HEAD_DIM_V / 64, RING_BOX, first, BLOCK_N, tid, 128);
  fence_async_shared();
  mbar_arrive(cleared);
  mbar_wait(cleared, 0);
}

// The warpgroup of the MMAs: its copies of Q, and with bulk copies the
// other warpgroup's (q_in), landed and seen by the wgmmas.
__device__ __forceinline__ void q_landed(bool bulk, u32 q_in) {
  copy_commit();
  copy_wait_all();
  fence_async_shared();
  if (bulk) mbar_wait(q_in, 0);
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
    ${wgmma_s}<0, 0>(sc, dq + (ks / 4) * (Q_BOX / 16) + at, dk + (ks / 4) * (RING_BOX / 16) + at, ks > 0);
  }
}

// O += P·V (64 x HALF) over a tile's keys, 16 at a time (dv: V's first
// columns, MN-major, boxes RING_BOX apart); P from registers (pk) or from
// its box (dp). Issued, not waited for.
__device__ __forceinline__ void pv_registers(float* o, const u32* pk, u64 dv) {
#pragma unroll
  for (int kc = 0; kc < BLOCK_N / 16; ++kc) ${wgmma_rs}<1>(o, pk + 4 * kc, dv + kc * 128, 1);
}
__device__ __forceinline__ void pv_shared(float* o, u64 dp, u64 dv) {
#pragma unroll
  for (int kc = 0; kc < BLOCK_N / 16; ++kc) ${wgmma_ss}<0, 1>(o, dp + kc * 2, dv + kc * 128, 1);
}

extern "C" __global__ void __launch_bounds__(THREADS, 1) ${name}(const __grid_constant__ fg_decode_tma_params p) {
  extern __shared__ u128 smem[];
  // Q [BOXES][ROWS x 128 bytes]; the ring [BOXES][STAGES slots][BLOCK_N x 128
  // bytes] (tile x in slot x % STAGES; after a tile's S its last box, past
  // V's, holds its P); all 128-byte swizzled from 1024-byte boundaries. Then
  // float [STAGES][ROWS] the rows' factors of O per slot and [ROWS] their sums;
  // the barriers per slot: full (its tile's copies landed), ready (P and
  // the factors written) and empty (the S warpgroup done with the slot, and
  // with bulk copies the V warpgroup too);
  // with bulk copies, q_in (the V warpgroup's copies of Q landed) and
  // cleared (the rows past the keys cleared, once a block).
  const u32 base = smem_addr(smem);
  const u32 sQ = (base + 1023u) & ~1023u, sRing = sQ + BOXES * Q_BOX;
  const u32 sStats = sRing + BOXES * RING_BOX;
  float* const sScale = reinterpret_cast<float*>(reinterpret_cast<char*>(smem) + (sStats - base));
  const u32 full = sStats + (STAGES + 1) * ROWS * 4, ready = full + 8 * STAGES, empty = ready + 8 * STAGES;
  const u32 q_in = empty + 8 * STAGES, cleared = q_in + 8;
  const bool bulk = p.kv_box_rows > 0;
  // the warpgroup, warp-uniform to the compiler: its descriptors in uniform registers
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
  const int g = lane >> 2, t = lane & 3;  // accumulator row group and column pair
  const int wm = warp & 3;                // the warp's 16 rows of the 64

  const step_block at = step_block_of(p);
  const int split = at.split, rb = at.rb, hk = at.hk, b = at.b;
  const int block_rows = ROWS, row0 = rb * ROWS;
  if (bulk && tid == 128) prefetch_map(&p.kv_map);  // while the key count and first pages load
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full + 8 * s, bulk ? 1 : 128);  // the copying thread, or the V warpgroup's
      mbar_init(ready + 8 * s, 128);
      mbar_init(empty + 8 * s, bulk ? 256 : 128);  // and the V warpgroup, for the copying warp
    }
    mbar_init(q_in, 128);
    mbar_init(cleared, 128);
    mbar_init_fence();
  }
${block_start}
  __syncthreads();  // the barriers initialised

  float acc_o[HALF / 2];  // O's rows (g, g + 8) x this warpgroup's half of the columns
#pragma unroll
  for (int i = 0; i < HALF / 2; ++i) acc_o[i] = 0.f;
  float row_max[2] = {FG_NEG_INF, FG_NEG_INF}, row_sum[2] = {0.f, 0.f};
  // where each warpgroup's V columns start in a slot, and its P's box
  const u64 dv_first = smem_desc_sw128(sRing + wg * HALF_BOXES * RING_BOX, RING_BOX, 1024);
  const u64 dp_first = smem_desc_sw128(sRing + (BOXES - 1) * RING_BOX, 16, 1024);

  if (wg == 0) {
    // the S warpgroup: per tile, S = Q·Kᵀ, the mask and online softmax (its
    // rows' maxima and sums its own), P into the slot's last box and the
    // rows' factors for the other warpgroup, then its half of O += P·V
    u32 pk[BLOCK_N / 4];  // P, as the A registers of P·V
    const u64 dq = smem_desc_sw128(sQ, 16, 1024), dk_first = smem_desc_sw128(sRing, 16, 1024);
    q_landed(bulk, q_in);
    for (int j = 0; j < tiles; ++j) {
      const int s = j % STAGES, n0 = (t_begin + j) * BLOCK_N;
      mbar_wait(full + 8 * s, (j / STAGES) & 1);
      if (bulk && n0 + BLOCK_N > keys) clear_past_keys(sRing + s * K_BOX, keys - n0, tid, cleared);
      float acc_s[BLOCK_N / 2];
      wgmma_fence();
      s_gemm(acc_s, dq, dk_first + s * (K_BOX / 16));
      wgmma_commit();
      wgmma_wait<0>();
      hold<BLOCK_N / 2>(acc_s);

      // the mask: keys outside each row's [lo, hi). A warp whose rows see
      // the whole tile takes a way of its own, with no test and no -inf to
      // guard the exponentials against (240 instructions a warp, not 400)
      const bool whole = __all_sync(0xffffffffu, n0 >= max(lo[0], lo[1]) && n0 + BLOCK_N <= min(hi[0], hi[1]));
      float alpha[2], sum[2] = {0.f, 0.f};
      const u32 p_box = sRing + (BOXES - 1) * RING_BOX + s * K_BOX;  // P's: the slot's last box
      auto softmax = [&](auto whole_tile) {
        constexpr bool WHOLE = decltype(whole_tile)::value;
        float mx[2] = {row_max[0], row_max[1]};
#pragma unroll
        for (int i = 0; i < BLOCK_N / 8; ++i)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = n0 + 8 * i + 2 * t + (e & 1);
            float v = acc_s[4 * i + e];
            if (!WHOLE && (key < lo[e >> 1] || key >= hi[e >> 1])) v = FG_NEG_INF;
            acc_s[4 * i + e] = v;
            mx[e >> 1] = fmaxf(mx[e >> 1], v);
          }
        float base2[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
          // the maximum moves only where a score passes it by more than 2^8 (as
          // lib_softmax's max_slack): P < 256, and most tiles skip O's rescale
          const bool moved = mx[r] * ${to_log2} > row_max[r] * ${to_log2} + 8.f;
          const float m_new = moved ? mx[r] : row_max[r];
          base2[r] = m_new == FG_NEG_INF ? 0.f : m_new * ${to_log2};
          alpha[r] = moved ? fast_exp2(row_max[r] * ${to_log2} - base2[r]) : 1.f;
          row_max[r] = m_new;
          if (t == 0) sScale[s * ROWS + 16 * wm + g + 8 * r] = alpha[r];
        }
        // P = 2^(s·scale·log2 e - max) into the A registers and the slot's
        // last box (S is done with it)
#pragma unroll
        for (int i = 0; i < BLOCK_N / 8; ++i) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float v = acc_s[4 * i + e];
            const float x = fast_exp2(v * ${to_log2} - base2[e >> 1]);
            const float pe = WHOLE || v != FG_NEG_INF ? x : 0.f;
            acc_s[4 * i + e] = pe;
            sum[e >> 1] += pe;
          }
          pk[2 * i] = pack2(acc_s[4 * i], acc_s[4 * i + 1]);          // row g
          pk[2 * i + 1] = pack2(acc_s[4 * i + 2], acc_s[4 * i + 3]);  // row g + 8
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int row = 16 * wm + g + 8 * r;
            st_shared_u32(p_box + row * 128 + ((i ^ (row & 7)) << 4) + 4 * t, pk[2 * i + r]);
          }
        }
      };
      if (whole) softmax(known<true>());
      else softmax(known<false>());
      fence_async_shared();
      mbar_arrive(ready + 8 * s);
#pragma unroll
      for (int r = 0; r < 2; ++r) row_sum[r] = row_sum[r] * alpha[r] + sum[r];
      if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f))  // a row's maximum moved
#pragma unroll
        for (int i = 0; i < HALF / 2; ++i) acc_o[i] *= alpha[(i >> 1) & 1];
      wgmma_fence();
      pv_registers(acc_o, pk, dv_first + s * (K_BOX / 16));
      wgmma_commit();
      wgmma_wait<0>();
      hold<HALF / 2>(acc_o);
      mbar_arrive(empty + 8 * s);  // done with the slot
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 1);
      row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 2);
      if (t == 0) sScale[STAGES * ROWS + 16 * wm + g + 8 * r] = row_sum[r];
    }
  } else {
    // the V warpgroup: the copies, and per tile its half of O, rescaled,
    // += P·V with P from the slot's last box; a slot refilled once the S
    // warpgroup is done with it.
${copies}    for (int j = 0; j < tiles; ++j) {
      const int s = j % STAGES;
      if (!bulk) entries(j + STAGES);
      mbar_wait(ready + 8 * s, (j / STAGES) & 1);
      float alpha[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) alpha[h] = sScale[s * ROWS + 16 * wm + g + 8 * h];
      if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f))
#pragma unroll
        for (int i = 0; i < HALF / 2; ++i) acc_o[i] *= alpha[(i >> 1) & 1];
      wgmma_fence();
      pv_shared(acc_o, dp_first + s * (K_BOX / 16), dv_first + s * (K_BOX / 16));
      wgmma_commit();
      if (!bulk && j + 1 < tiles) landed(j + 1);  // while P·V runs
      wgmma_wait<0>();
      hold<HALF / 2>(acc_o);
      if (bulk) mbar_arrive(empty + 8 * s);  // this thread's reads of the slot and the factors done
      if (j + STAGES < tiles && (copier || !bulk)) {
        mbar_wait(empty + 8 * s, (j / STAGES) & 1);  // the S warpgroup (bulk: both) done with the slot
        if (bulk) bulk_tile(j + STAGES);
        else load_tile(j + STAGES);
      }
    }
  }
  __syncthreads();  // the rows' sums
  const i64 all_rows = (i64)p.batch * p.heads_q * p.seqlen_q;
  // (one split: O's rows staged in the ring, free now, then written out whole)
${store_rows}  __syncthreads();  // the staged rows
${staged_out}}
]]

-- The kernel for calls of at most NARROW query rows a KV head: the 64-row
-- kernel's MMAs would leave most of their rows empty, so the products are
-- taken transposed, keys (and O's columns) along the MMAs' 64 rows and the
-- block's NARROW query rows along their columns: a quarter of the tensor
-- work a tile, so that a block reads its tiles as fast as the memory gives
-- them. One warpgroup does the MMAs and the softmax, the second the copies.
local narrow = [[
// Sᵀ = K·Qᵀ (BLOCK_N keys x NARROW rows) for a tile and the block's rows
// (dk, dq: their first boxes, both K-major as they lie). Issued, not waited
// for.
__device__ __forceinline__ void st_gemm(float* st, u64 dk, u64 dq) {
#pragma unroll
  for (int ks = 0; ks < HEAD_DIM / 16; ++ks) {
    const u32 at = 2 * (ks % 4);
    ${wgmma_n}<0, 0>(st, dk + (ks / 4) * (RING_BOX / 16) + at, dq + (ks / 4) * (NARROW_Q_BOX / 16) + at, ks > 0);
  }
}

// Oᵀ += Vᵀ·Pᵀ (HEAD_DIM_V x NARROW): 64 of O's columns an MMA, Vᵀ read as A
// from the slot's box of them (MN-major), Pᵀ as B from P's rows of keys
// (dp, K-major), 16 keys at a time. Issued, not waited for.
__device__ __forceinline__ void pv_transposed(float* ot, u64 dv, u64 dp) {
#pragma unroll
  for (int m = 0; m < HEAD_DIM_V / 64; ++m)
#pragma unroll
    for (int kc = 0; kc < BLOCK_N / 16; ++kc)
      ${wgmma_n}<1, 0>(ot + (NARROW / 2) * m, dv + m * (RING_BOX / 16) + kc * 128, dp + kc * 2, 1);
}

// The accumulators' columns a thread holds: rows 8 (r / 2) + 2 t + r % 2
// of the block's NARROW (NARROW 16).
__device__ __forceinline__ int row_at(int r, int t) { return 8 * (r >> 1) + 2 * t + (r & 1); }

extern "C" __global__ void __launch_bounds__(THREADS, 1) ${name}(const __grid_constant__ fg_decode_tma_params p) {
  extern __shared__ u128 smem[];
  // Q [BOXES][NARROW x 128 bytes]; the ring as the 64-row kernel's; P
  // [NARROW x 128 bytes] (a row's keys as its columns); all 128-byte
  // swizzled from 1024-byte boundaries. Then float [4][NARROW] the warps'
  // maxima of the rows over a tile, [4][NARROW] their sums at the end; the
  // barriers per slot: full (its tile's copies landed) and empty (the MMA
  // warpgroup done with it); q_in (the copying warpgroup's copies of Q
  // landed) and cleared (the rows past the keys cleared, once a block).
  // Then i64 [NARROW][2] the rows' places in lse (B, Hq, Sq; -1 past the
  // call's rows) and in o (elements from p.o); last, where a pair merges,
  // float [128][PAIR_FLOATS]: the second block's MMA threads' accumulators,
  // maxima and sums, a thread's each.
  const u32 base = smem_addr(smem);
  const u32 sQ = (base + 1023u) & ~1023u, sRing = sQ + BOXES * NARROW_Q_BOX, sP = sRing + BOXES * RING_BOX;
  const u32 sStats = sP + NARROW * 128;
  float* const sMax = reinterpret_cast<float*>(reinterpret_cast<char*>(smem) + (sStats - base));
  float* const sSum = sMax + 4 * NARROW;
  const u32 full = sStats + 8 * NARROW * 4, empty = full + 8 * STAGES, q_in = empty + 8 * STAGES;
  const u32 cleared = q_in + 8, sPlaces = (cleared + 8 + 15u) & ~15u, sPair = sPlaces + NARROW * 16;
  i64* const row_place = reinterpret_cast<i64*>(reinterpret_cast<char*>(smem) + (sPlaces - base));
  const float* const pair_in = reinterpret_cast<const float*>(reinterpret_cast<char*>(smem) + (sPair - base));
  const bool bulk = p.kv_box_rows > 0;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = tid >> 7;
  const int g = lane >> 2, t = lane & 3;  // the accumulators' row group and column pair

  const step_block at = step_block_of(p);
  const int split = at.split, rb = at.rb, hk = at.hk, b = at.b;
  const int block_rows = NARROW, row0 = rb * NARROW;
  // in a pair (clusters of two: splits 0 and 1 of a row block), whether
  // this block is the second, which hands its work to the first; the
  // arrivals that say both blocks run (waited for before the hand-over)
  const bool paired = cluster_blocks() == 2, second = paired && cluster_rank() == 1;
  if (bulk && tid == 128) prefetch_map(&p.kv_map);  // while the key count and first pages load
  if (paired) cluster_arrive();
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full + 8 * s, bulk ? 1 : 128);  // the copying thread, or warpgroup
      mbar_init(empty + 8 * s, 128);
    }
    mbar_init(q_in, 128);
    mbar_init(cleared, 128);
    mbar_init_fence();
  }
  if (tid < NARROW) {  // the rows' places, ready for the end (no divisions on its path)
    const int pr = row0 + tid;
    i64 lse_at = -1, o_at = 0;
    if (pr < p.rows) {
      const int i = pr / p.group, h = hk * p.group + pr % p.group;
      lse_at = ((i64)b * p.heads_q + h) * p.seqlen_q + i;
      o_at = b * p.o_sb + (i64)i * p.o_ss + h * p.o_sh;
    }
    row_place[2 * tid] = lse_at;
    row_place[2 * tid + 1] = o_at;
  }
${block_start}
  __syncthreads();  // the barriers initialised, the rows' places written

  // Oᵀ: 64 of O's columns (64 m + 16 warp + g, + 8) by the thread's rows,
  // acc_o[8 m + 4 i + e] at column + 8 (e / 2) of row_at(2 i + e % 2)
  float acc_o[HEAD_DIM_V / 8];
#pragma unroll
  for (int i = 0; i < HEAD_DIM_V / 8; ++i) acc_o[i] = 0.f;
  // the rows' maxima, and this thread's share of their sums (its keys')
  float row_max[4] = {FG_NEG_INF, FG_NEG_INF, FG_NEG_INF, FG_NEG_INF}, row_sum[4] = {0.f, 0.f, 0.f, 0.f};
  // lane l stores row l % 8 of the transposed piece l / 8 (stmatrix): rows
  // 8 (piece / 2).. of the block, keys or columns 16 warp + 8 (piece % 2)..
  const int q_row = 8 * (lane >> 4) + (lane & 7), chunk = 2 * warp + ((lane >> 3) & 1);
  if (wg == 0) {
    // the thread's rows' keys (rows past the call's see those of its last:
    // never written, and so every tile the call's rows see whole stays so)
    int lo[4], hi[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) visible_keys(p, min(row0 + row_at(r, t), p.rows - 1) / p.group, diag, keys, lo[r], hi[r]);
    const u64 dq = smem_desc_sw128(sQ, 16, 1024), dk_first = smem_desc_sw128(sRing, 16, 1024);
    const u64 dv_first = smem_desc_sw128(sRing, RING_BOX, 1024), dp = smem_desc_sw128(sP, 16, 1024);
    const u32 p_at = sP + q_row * 128 + ((chunk ^ (q_row & 7)) << 4);
    q_landed(bulk, q_in);
    for (int j = 0; j < tiles; ++j) {
      const int s = j % STAGES, n0 = (t_begin + j) * BLOCK_N;
      mbar_wait(full + 8 * s, (j / STAGES) & 1);
      if (bulk && n0 + BLOCK_N > keys) clear_past_keys(sRing + s * K_BOX, keys - n0, tid, cleared);
      // Sᵀ: acc_s[4 i + e] key 16 warp + g + 8 (e / 2) of the tile, row row_at(2 i + e % 2)
      float acc_s[NARROW / 2];
      wgmma_fence();
      st_gemm(acc_s, dk_first + s * (K_BOX / 16), dq);
      wgmma_commit();
      wgmma_wait<0>();
      hold<NARROW / 2>(acc_s);

      // the mask (none to test where the warp's rows see the whole tile),
      // the tile's maxima of the rows: the thread's keys, its column's
      // lanes, then the warps' through shared memory
      bool all_in = true;
#pragma unroll
      for (int r = 0; r < 4; ++r) all_in = all_in && n0 >= lo[r] && n0 + BLOCK_N <= hi[r];
      const bool whole = __all_sync(0xffffffffu, all_in);
      float mx[4] = {FG_NEG_INF, FG_NEG_INF, FG_NEG_INF, FG_NEG_INF};
#pragma unroll
      for (int e = 0; e < NARROW / 2; ++e) {
        const int key = n0 + 16 * warp + g + 8 * ((e >> 1) & 1), r = 2 * (e >> 2) + (e & 1);
        float v = acc_s[e];
        if (!whole && (key < lo[r] || key >= hi[r])) v = FG_NEG_INF;
        acc_s[e] = v;
        mx[r] = fmaxf(mx[r], v);
      }
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        for (int lanes = 4; lanes < 32; lanes *= 2) mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], lanes));
        if (g == 0) sMax[NARROW * warp + row_at(r, t)] = mx[r];
      }
      bar_sync(1, 128);  // the warps' maxima (and the last tile's P·V done by all)
      float alpha[4], base2[4], sum[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        float m = row_max[r];
#pragma unroll
        for (int w = 0; w < 4; ++w) m = fmaxf(m, sMax[NARROW * w + row_at(r, t)]);
        base2[r] = m == FG_NEG_INF ? 0.f : m * ${to_log2};
        alpha[r] = row_max[r] == m ? 1.f : row_max[r] == FG_NEG_INF ? 0.f : fast_exp2(row_max[r] * ${to_log2} - base2[r]);
        row_max[r] = m;
      }
      // P = 2^(s·scale·log2 e - max), its pieces stored transposed into
      // P's rows (keys along them), which the next MMAs read as Pᵀ
#pragma unroll
      for (int e = 0; e < NARROW / 2; ++e) {
        const int r = 2 * (e >> 2) + (e & 1);
        const float v = acc_s[e];
        const float pe = v == FG_NEG_INF ? 0.f : fast_exp2(v * ${to_log2} - base2[r]);
        acc_s[e] = pe;
        sum[r] += pe;
      }
      stmatrix_x4_trans(p_at, pack2(acc_s[0], acc_s[1]), pack2(acc_s[2], acc_s[3]), pack2(acc_s[4], acc_s[5]),
                        pack2(acc_s[6], acc_s[7]));
      fence_async_shared();
#pragma unroll
      for (int r = 0; r < 4; ++r) row_sum[r] = row_sum[r] * alpha[r] + sum[r];
      if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f || alpha[2] != 1.f || alpha[3] != 1.f))
#pragma unroll
        for (int i = 0; i < HEAD_DIM_V / 8; ++i) acc_o[i] *= alpha[2 * ((i >> 2) & 1) + (i & 1)];
      bar_sync(1, 128);  // P whole
      wgmma_fence();
      pv_transposed(acc_o, dv_first + s * (K_BOX / 16), dp);
      wgmma_commit();
      wgmma_wait<0>();
      hold<HEAD_DIM_V / 8>(acc_o);
      mbar_arrive(empty + 8 * s);  // done with the slot
    }
    if (paired) {
      // the second block's thread stores its accumulators, maxima and share
      // of the sums into the first's sPair; the first's same thread (the
      // same rows and columns) rescales both to the larger maxima and adds
      cluster_wait();  // both blocks run
      if (second) {
        const u32 to = cluster_map(sPair, 0) + tid * (PAIR_FLOATS * 4);
#pragma unroll
        for (int i = 0; i < HEAD_DIM_V / 8; i += 4) st_cluster_f4(to + 4 * i, acc_o[i], acc_o[i + 1], acc_o[i + 2], acc_o[i + 3]);
        st_cluster_f4(to + HEAD_DIM_V / 2, row_max[0], row_max[1], row_max[2], row_max[3]);
        st_cluster_f4(to + HEAD_DIM_V / 2 + 16, row_sum[0], row_sum[1], row_sum[2], row_sum[3]);
      }
      cluster_arrive();
      cluster_wait();
      if (second) return;
      const float* in = pair_in + tid * PAIR_FLOATS;
      float mine[4], theirs[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float their_max = in[HEAD_DIM_V / 8 + r], m = fmaxf(row_max[r], their_max);
        const float base2 = m == FG_NEG_INF ? 0.f : m * ${to_log2};
        mine[r] = row_max[r] == FG_NEG_INF ? 0.f : fast_exp2(row_max[r] * ${to_log2} - base2);
        theirs[r] = their_max == FG_NEG_INF ? 0.f : fast_exp2(their_max * ${to_log2} - base2);
        row_sum[r] = row_sum[r] * mine[r] + in[HEAD_DIM_V / 8 + 4 + r] * theirs[r];
        row_max[r] = m;
      }
#pragma unroll
      for (int i = 0; i < HEAD_DIM_V / 8; ++i) {
        const int r = 2 * ((i >> 2) & 1) + (i & 1);
        acc_o[i] = acc_o[i] * mine[r] + in[i] * theirs[r];
      }
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      for (int lanes = 4; lanes < 32; lanes *= 2) row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], lanes);
      if (g == 0) sSum[NARROW * warp + row_at(r, t)] = row_sum[r];
    }
  } else {
${copies}
    for (int j = 0; j < tiles; ++j) {
      const int s = j % STAGES;
      if (!bulk) {
        entries(j + STAGES);
        if (j + 1 < tiles) landed(j + 1);
      }
      if (j + STAGES < tiles && (copier || !bulk)) {
        mbar_wait(empty + 8 * s, (j / STAGES) & 1);  // the MMA warpgroup done with the slot
        if (bulk) bulk_tile(j + STAGES);
        else load_tile(j + STAGES);
      }
    }
    if (paired) {  // (every thread of the cluster takes part in both barriers)
      cluster_wait();
      cluster_arrive();
      cluster_wait();
      if (second) return;
    }
  }
  __syncthreads();  // the rows' sums; the ring free
  const bool writes_o = p.num_splits == 1 || paired;  // this block writes O (else a part)
  if (wg == 0) {
    // O's rows divided by their sums: where the block writes O, its pieces
    // stored transposed into the ring as staged_out reads it, else the
    // split's part
    const i64 all_rows = (i64)p.batch * p.heads_q * p.seqlen_q;
    float inv[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      float l = 0.f;
#pragma unroll
      for (int w = 0; w < 4; ++w) l += sSum[NARROW * w + row_at(r, t)];
      inv[r] = l > 0.f ? 1.f / l : 0.f;
      const float lse2 = l > 0.f ? row_max[r] * p.scale_log2 + log2f(l) : FG_NEG_INF;  // base 2
      const i64 out_row = row_place[2 * row_at(r, t)];  // lse's (B, Hq, Sq)
      if (out_row < 0) continue;
      if (writes_o) {
        if (warp == 0 && g == 0 && p.lse) ((float*)p.lse)[out_row] = lse2 * 0.69314718055994531f;
      } else {
        const i64 part = split * all_rows + out_row;
        float* o = (float*)p.o_part + part * HEAD_DIM_V + 16 * warp + g;
#pragma unroll
        for (int m = 0; m < HEAD_DIM_V / 64; ++m)
#pragma unroll
          for (int e = 0; e < 2; ++e) o[64 * m + 8 * e] = acc_o[8 * m + 4 * (r >> 1) + 2 * e + (r & 1)] * inv[r];
        if (warp == 0 && g == 0) ((float*)p.lse_part)[part] = lse2;
      }
    }
    if (writes_o) {
      const u32 o_at = sRing + q_row * (HEAD_DIM_V * 2);
#pragma unroll
      for (int m = 0; m < HEAD_DIM_V / 64; ++m) {
        const float* a = acc_o + 8 * m;
        stmatrix_x4_trans(o_at + (((8 * m + chunk) ^ (q_row & 7)) << 4), pack2(a[0] * inv[0], a[1] * inv[1]),
                          pack2(a[2] * inv[0], a[3] * inv[1]), pack2(a[4] * inv[2], a[5] * inv[3]),
                          pack2(a[6] * inv[2], a[7] * inv[3]));
      }
    }
  }
  __syncthreads();  // the staged rows
${staged_out}}
]]

return function(p)
  if not p.latent then error("kernel_fwd_mla_sm90a takes a latent cache (spec.kv_cache FG_KV_LATENT)") end
  if p.head_dim % 64 ~= 0 or p.head_dim_v % 128 ~= 0 or p.head_dim <= p.head_dim_v then
    error("kernel_fwd_mla_sm90a: the head dim must be a multiple of 64 past the value head dim, "
          .. "a multiple of 128")
  end
  if p.rows ~= 64 or p.narrow ~= 16 or p.block_n ~= 64 or p.stages ~= 2 or p.warps ~= 8 then
    error("kernel_fwd_mla_sm90a takes 64 rows (16 narrow), tiles of 64 keys, two slots and eight warps")
  end
  local base = "fg_mla_" .. p.target_tag .. "_" .. p.spec_name .. "_wg"
  local names = { append = base .. "_append", mla = base, narrow = base .. "_narrow", combine = base .. "_combine" }
  local banner = text.fill([[
// ${name}
// Generated by flashgen ${version}: decoding step over a latent cache, wgmma.
// spec: ${spec_name} (dtype ${dtype}, head dim ${head_dim}, value head dim ${head_dim_v} (K's
//       first columns), mask ${mask})
// plan: rows=${rows} Bc=${block_n} slots=${stages} warps=${warps} (an S and a V warpgroup)
//       shared memory ${smem_bytes} bytes; for at most ${narrow} rows ${narrow_smem_bytes}
//       (transposed products); target ${target}
]], {
    name = base, version = p.generator_version, spec_name = p.spec_name, dtype = p.dtype,
    head_dim = p.head_dim, head_dim_v = p.head_dim_v, mask = p.mask, block_n = p.block_n,
    rows = p.rows, stages = p.stages, warps = p.warps, smem_bytes = p.smem_bytes,
    narrow = p.narrow, narrow_smem_bytes = p.narrow_smem_bytes, target = p.target })
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
#define NARROW ${narrow}               // the rows of the narrow kernel's blocks
#define NARROW_Q_BOX (NARROW * 128)  // ... and of its Q boxes
#define PAIR_FLOATS (HEAD_DIM_V / 8 + 8)  // what a thread of a pair's second block hands over
#define K_BOX (BLOCK_N * 128)      // ... of one K box of a slot
#define RING_BOX (STAGES * K_BOX)  // ... of one box of every slot
#define MAX_SPLITS ${max_splits}
#define STAGES ${stages}
#define WARPS ${warps}
#define THREADS ${threads}
]], p)
  local wgmma_s = { sm90a.wgmma(p.block_n, p.dtype, false) }
  local wgmma_rs = { sm90a.wgmma(p.half_boxes * 64, p.dtype, true) }
  local wgmma_ss = { sm90a.wgmma(p.half_boxes * 64, p.dtype, false) }
  if wgmma_ss[1] == wgmma_s[1] then wgmma_ss[2] = "" end  -- half of O as wide as a tile: one instruction
  local wgmma_n = { sm90a.wgmma(p.narrow, p.dtype, false) }
  local q_at = "(k >> 3) * %s + r * 128 + (((k & 7) ^ (r & 7)) << 4)"
  local source = table.concat({
    banner, constants, device.source, (isa_for(80).prelude(p.dtype)), sm90a.source,
    wgmma_s[2], wgmma_rs[2], wgmma_ss[2], wgmma_n[2], p.params_struct, kv_cache.common(p),
    kv_cache.append(p, names.append, true, "fg_decode_tma_params"),
    text.fill(mla, { block_start = kv_cache.block_start({ q_at = q_at:format("Q_BOX"), pages = false, q_by_rows = true }), name = names.mla,
                     visible_keys = kv_cache.visible_keys(p), to_log2 = "p.scale_log2", wgmma_s = wgmma_s[1],
                     wgmma_rs = wgmma_rs[1], wgmma_ss = wgmma_ss[1], copies = copies,
                     -- lse from the S warpgroup (its rows' maxima)
                     store_rows = kv_cache.store_rows({
                       sum = "    const float l = sScale[STAGES * ROWS + row];", col0 = "wg * HALF",
                       tiles = "HALF / 8", first = "wg == 0", v_dim = "HEAD_DIM_V", v_padded = "HEAD_DIM_V",
                       acc0 = "acc_o[4 * dn + 2 * r]", acc1 = "acc_o[4 * dn + 2 * r + 1]", stage = "sRing" }),
                     staged_out = kv_cache.staged_out("sRing", "HEAD_DIM_V") }),
    text.fill(narrow, { block_start = kv_cache.block_start({ q_at = q_at:format("NARROW_Q_BOX"), pages = false,
                                                             own_rows = false, q_by_rows = true }),
                        name = names.narrow, to_log2 = "p.scale_log2", wgmma_n = wgmma_n[1], copies = copies,
                        staged_out = kv_cache.staged_out("sRing", "HEAD_DIM_V", "writes_o", "row_place[2 * row + 1]") }),
    kv_cache.combine(p, names.combine, "HEAD_DIM_V", "HEAD_DIM_V", "fg_decode_tma_params"),
  }, "\n")
  -- a call launches one of the step's three launches (the others' blocks 0):
  -- the 64-row kernel, the narrow one, or the narrow one in pairs
  local function step(entry, blocks, smem, cluster)
    return { entry = entry, threads = p.threads, smem = smem, programmatic = 1, grid = { { blocks } },
             cluster = cluster }
  end
  return { source = source, name = names.mla,
           launches = { kv_cache.append_launch(p, names.append), step(names.mla, "key_blocks", p.smem_bytes),
                        step(names.narrow, "narrow_blocks", p.narrow_smem_bytes),
                        step(names.narrow, "pair_blocks", p.narrow_smem_bytes, 2),
                        kv_cache.combine_launch(p, names.combine) } }
end
