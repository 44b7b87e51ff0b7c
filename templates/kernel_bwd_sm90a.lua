-- The Hopper backward (sm_90a): dQ, dK, dV of O = softmax(Q·Kᵀ·scale)·V. One
-- module of three kernels, as the mma.sync backward's: D = rowsum(dO∘O)
-- (kernel_bwd_rows.lua), the main kernel, and dQ from its fp32 accumulator
-- (kernel_bwd_dq.lua). The main kernel: one thread block per key block
-- (BLOCK_N keys of one key/value head), CONSUMERS + 1 warpgroups:
--   producer   gives its registers up (setmaxnreg); its first thread loads
--              K and V once (TMA), then, step by step (a query block of one
--              query head of the group), Q and dO into a ring of STAGES
--              buffers; every producer thread puts one value of the step's
--              lse·log2(e) or D beside them, and arrives on the stage's
--              "full" barrier;
--   consumers  each owns 64 keys and computes the transposed products with
--              its keys along wgmma's M: Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ from
--              shared memory; Pᵀ = exp2(Sᵀ·scale·log2 e − lse·log2 e) and
--              dSᵀ = Pᵀ∘(dPᵀ − D) in registers; dV += Pᵀ·dO and
--              dK += dSᵀ·Q with Pᵀ and dSᵀ as A from registers; dSᵀ into
--              shared memory (keys as rows), where after both consumers'
--              halves are in, consumer w computes dQ = dS·K (A read as
--              (K, M)) for its share of the head-dim columns and stages it
--              in shared memory; once the next step's Sᵀ and dPᵀ are
--              issued, one thread adds it to the fp32 accumulator by bulk
--              reductions (TMA), which run while the consumers go on.
-- dK (times the softmax scale) and dV are stored at the end of the key block.
-- The fast schedule gives each key block a thread block; the deterministic
-- one gives a thread block several in turn (families/backward_schedule.h),
-- K and V reloaded for each, and an accumulator slice of its own, to which
-- its reductions are then added in order.
local text = import("lib_text")
local device = import("lib_device")
local isa_for = import("isa")
local sm90a = import("isa_sm90a")
local epilogue = import("lib_epilogue")
local fragment = import("lib_fragment")
local mask = import("lib_mask")
local rows_kernel = import("kernel_bwd_rows")
local dq_kernel = import("kernel_bwd_dq")

local pieces = [[
// A tile of map (rows from r0, BOXES boxes of 64 columns, box_bytes apart)
// into dst, completing on bar.
__device__ __forceinline__ void load_boxes(const void* map, u32 dst, u32 box_bytes, u32 bar, int r0,
                                           int hh, int b) {
#pragma unroll
  for (int box = 0; box < BOXES; ++box) tma_load_4d(dst + box * box_bytes, map, bar, 64 * box, r0, hh, b);
}

// Xᵀ = A·Bᵀ (64 keys x BLOCK_M queries) for a warpgroup's 64 rows of A (K or
// V, rows KV_BOX apart per box) and B (Q or dO, Q_BOX per box), both K-major.
__device__ __forceinline__ void gemm_t(float* acc, u32 a_rows, u32 b_rows) {
#pragma unroll
  for (int ks = 0; ks < HEAD_DIM_PADDED / 16; ++ks) {
    const u32 at = 32 * (ks % 4);  // the slice's 32 bytes within its 128-byte rows
    const u64 da = smem_desc_sw128(a_rows + (ks / 4) * KV_BOX + at, 16, 1024);
    const u64 db = smem_desc_sw128(b_rows + (ks / 4) * Q_BOX + at, 16, 1024);
    ${wgmma_t}<0, 0>(acc, da, db, ks > 0);
  }
}

// Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ of a stage (Q boxes, then dO boxes) for the
// warpgroup's 64 keys of K at k_rows (V follows K), issued and committed.
__device__ __forceinline__ void gemm_sdp(float* acc_s, float* acc_dp, u32 k_rows, u32 stage) {
  wgmma_fence();
  gemm_t(acc_s, k_rows, stage);
  gemm_t(acc_dp, k_rows + BOXES * KV_BOX, stage + BOXES * Q_BOX);
  wgmma_commit();
}

// acc += Xᵀ·B (64 keys x V_COLS): Xᵀ packed in registers, B (Q or dO) read
// as (K, N), 16 queries at a time, its boxes Q_BOX apart.
__device__ __forceinline__ void gemm_kv(float* acc, const u32* xk, u32 b_rows) {
#pragma unroll
  for (int kc = 0; kc < BLOCK_M / 16; ++kc) {
    const u64 db = smem_desc_sw128(b_rows + 2048 * kc, Q_BOX, 1024);
    ${wgmma_kv}<1>(acc, xk + 4 * kc, db, 1);
  }
}

// dQ (BLOCK_M queries x DQ_COLS columns) = dS·K over the block's keys: dS
// read as (K, M) from the keys-by-queries tile, K as (K, N) from k_cols,
// the first of the columns in a box.
__device__ __forceinline__ void gemm_dq(float* acc, u32 ds_tile, u32 k_cols) {
#pragma unroll
  for (int kc = 0; kc < BLOCK_N / 16; ++kc) {
    const u64 da = smem_desc_sw128(ds_tile + 2048 * kc, 16, 1024);
    const u64 db = smem_desc_sw128(k_cols + 2048 * kc, 16, 1024);
    ${wgmma_dq}<1, 1>(acc, da, db, kc > 0);
  }
}

template <int COUNT> __device__ __forceinline__ void hold(float* x) {
#pragma unroll
  for (int i = 0; i < COUNT; ++i) wgmma_hold(x[i]);
}

// Named barrier `id` over `count` threads.
__device__ __forceinline__ void bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

__device__ __forceinline__ void st_shared_v2_f32(u32 addr, float x0, float x1) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x0), "f"(x1) : "memory");
}

// Consumer wg's dQ of a step into its staging box `staged`, once the last
// step's reductions have read it (`complete`: once all reductions before
// have completed), as DQ_COLS / 32 of the accumulator map's
// boxes of 32 columns (64 rows of 128 bytes each, 16-byte chunk c of row r
// at c ^ (r % 8)): rows (queries) warp_row + g + 8r, columns 8nt + 2t + c.
__device__ __forceinline__ void stage_dq(const float* acc_dq, u32 staged, int wg, bool complete) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int warp_row = ((threadIdx.x / 32) % 4) * 16;
  const u32 dq_rows = staged + (warp_row + g) * 128 + 8 * (t & 1), chunk = ((t >> 1) ^ g) << 4;
  if (threadIdx.x % 128 == 0) {
    if (complete) bulk_wait();
    else bulk_wait_read();
  }
  bar_sync(2 + wg, 128);
#pragma unroll
  for (int nt = 0; nt < DQ_COLS / 8; ++nt)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      st_shared_v2_f32(dq_rows + (nt / 4) * DQ_MAP_BOX + 1024 * r + (((nt % 4) << 5) ^ chunk),
                       acc_dq[4 * nt + 2 * r], acc_dq[4 * nt + 2 * r + 1]);
}

// ... then added to the accumulator's slice `slice`, rows i0.. of head h,
// columns wg·DQ_COLS.. (map), by one thread's bulk reductions (rows past the
// map's are skipped).
__device__ __forceinline__ void reduce_dq(const void* map, u32 staged, int wg, int i0, int h, int b,
                                          int slice) {
  fence_async_shared();
  bar_sync(2 + wg, 128);
  if (threadIdx.x % 128 == 0) {
#pragma unroll
    for (int half = 0; half < DQ_COLS / 32; ++half)
      tma_reduce_add_5d(map, staged + half * DQ_MAP_BOX, wg * DQ_COLS + 32 * half, i0, h, b, slice);
    bulk_commit();
  }
}

__device__ __forceinline__ void st_shared_f32(u32 addr, float x) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(x) : "memory");
}
__device__ __forceinline__ float ld_shared_f32(u32 addr) {
  float x;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(x) : "r"(addr) : "memory");
  return x;
}
]]

-- The key blocks of a thread block and the query blocks of each.
local schedule = [[
// Thread block `group`'s key block of round r: in rounds of n_groups key
// blocks, the group-th, counted from the round's end every other round
// (under a causal mask each group then gets long and short key blocks
// alike); the fast schedule has one round.
__device__ __forceinline__ int key_block(const fg_bwd_tma_params& p, int group, int r) {
  return r * p.n_groups + (r % 2 == 0 ? group : p.n_groups - 1 - group);
}

// Key block nb's keys n0.. and the query blocks that may see one of them:
// m_first.. of each of the `heads` query heads of its group, m_blocks of
// them; steps (query head, query block) in all.
struct QueryBlocks {
  int n0, m_first, m_blocks, steps;
  __device__ QueryBlocks(const fg_bwd_tma_params& p, int nb, int heads) {
    n0 = nb * BLOCK_N;
${query_range}
    m_first = i_lo / BLOCK_M;
    m_blocks = i_lo < i_hi ? (i_hi + BLOCK_M - 1) / BLOCK_M - m_first : 0;
    steps = heads * m_blocks;
  }
};
]]

local kernel = [[
extern "C" __global__ void __launch_bounds__(THREADS, 1)
${name}(const __grid_constant__ fg_bwd_tma_params p) {
  extern __shared__ unsigned char smem[];
  // K and V boxes, STAGES x (Q boxes, dO boxes), two dS tiles (BLOCK_N keys
  // x BLOCK_M queries, one box), dQ's staging (DQ_BOX per consumer), every
  // 1024-byte aligned for the swizzle; STAGES x (lse·log2 e and D per
  // query); the barriers: K and V "full" and "empty", per stage "full" and
  // "empty".
  const u32 k_tile = (smem_addr(smem) + 1023u) & ~1023u;
  const u32 v_tile = k_tile + BOXES * KV_BOX;
  const u32 stages = v_tile + BOXES * KV_BOX;
  const u32 ds_tiles = stages + STAGES * STAGE_BYTES;
  const u32 dq_stage = ds_tiles + 2 * DS_BYTES;
  const u32 stats = dq_stage + CONSUMERS * DQ_BOX;
  const u32 kv_full = stats + STAGES * STATS_BYTES, kv_empty = kv_full + 8;
  const u32 full = kv_empty + 8, empty = full + 8 * STAGES;
  const int tid = threadIdx.x, wg = tid / 128;

  // blockIdx.x: (group of key blocks, key/value head, batch)
  const int group = blockIdx.x % p.n_groups;
  const int hk = (blockIdx.x / p.n_groups) % p.heads_kv;
  const int b = blockIdx.x / (p.n_groups * p.heads_kv);
  const int heads = p.heads_q / p.heads_kv;  // query heads per key/value head

  if (tid == 0) {
    mbar_init(kv_full, 1);
    mbar_init(kv_empty, CONSUMERS * 128);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full + 8 * s, 128);  // every producer thread
      mbar_init(empty + 8 * s, CONSUMERS * 128);
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (wg == CONSUMERS) {  // the producer
    regs_lower<PRODUCER_REGISTERS>();
    const int pt = tid - CONSUMERS * 128;
    int gst = 0;  // steps of the key blocks before: the ring's turn
    for (int kb = 0; key_block(p, group, kb) < p.num_n_blocks; ++kb) {
      const QueryBlocks qb(p, key_block(p, group, kb), heads);
      if (pt == 0) {  // K and V, once the consumers are done with the last key block's
        if (kb > 0) mbar_wait(kv_empty, (kb - 1) & 1);
        mbar_arrive_expect(kv_full, 2 * BOXES * KV_BOX);
        load_boxes(&p.k_map, k_tile, KV_BOX, kv_full, qb.n0, hk, b);
        load_boxes(&p.v_map, v_tile, KV_BOX, kv_full, qb.n0, hk, b);
      }
      // the steps as the consumers take them, without their divisions (the
      // producer's 24 registers would spill)
      const int i_first = qb.m_first * BLOCK_M, i_end = i_first + qb.m_blocks * BLOCK_M;
#pragma unroll 1
      for (int h = hk * heads; h < (hk + 1) * heads; ++h)
#pragma unroll 1
      for (int i0 = i_first; i0 < i_end; i0 += BLOCK_M, ++gst) {
        const int s = gst % STAGES;
        const u32 stage = stages + s * STAGE_BYTES;
        if (gst >= STAGES) mbar_wait(empty + 8 * s, (gst / STAGES - 1) & 1);
        // threads 0..BLOCK_M-1: lse·log2 e (+inf past the rows or where a row
        // saw no key: P = 0 there); the next BLOCK_M: D
        const int i = i0 + pt % BLOCK_M;
        const i64 row = ((i64)b * p.heads_q + h) * p.seqlen_q + i;
        float x = pt < BLOCK_M ? FG_POS_INF : 0.f;
        if (i < p.seqlen_q) {
          if (pt < BLOCK_M) {
            const float lse = ((const float*)p.lse)[row];
            if (lse != FG_NEG_INF) x = lse * 1.4426950408889634f;
          } else {
            x = ((const float*)p.delta)[row];
          }
        }
        st_shared_f32(stats + s * STATS_BYTES + 4 * pt, x);
        if (pt == 0) {
          mbar_arrive_expect(full + 8 * s, 2 * BOXES * Q_BOX);
          load_boxes(&p.q_map, stage, Q_BOX, full + 8 * s, i0, h, b);
          load_boxes(&p.do_map, stage + BOXES * Q_BOX, Q_BOX, full + 8 * s, i0, h, b);
        } else {
          mbar_arrive(full + 8 * s);
        }
      }
    }
    return;
  }

  regs_raise<CONSUMER_REGISTERS>();
  const int lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int warp_row = ((tid / 32) % 4) * 16;  // this warp's first row of its warpgroup's 64
  const int key_wg = wg * 64;                  // this warpgroup's first key in the block
  // the step whose dQ is staged, added once the next step's Sᵀ and dPᵀ
  // are issued, to this thread block's slice of the accumulator
  const u32 staged = dq_stage + wg * DQ_BOX;
  // A thread block that walks several key blocks adds to the same rows of
  // its slice once per key block, and the order of those additions must not
  // vary: a key block's first dQ is staged (and later added) only once all
  // reductions of the key block before have completed. Within a key block
  // no two reductions meet.
  const int slice = group % p.dq_slices;
  const bool ordered = p.n_groups < p.num_n_blocks;
  int dq_i0 = 0, dq_h = 0;
  int gst = 0;  // steps of the key blocks before: the ring's and the dS tiles' turn
  for (int kb = 0; key_block(p, group, kb) < p.num_n_blocks; ++kb) {
    const QueryBlocks qb(p, key_block(p, group, kb), heads);
    const int n0 = qb.n0;
    float acc_dv[V_COLS / 2], acc_dk[V_COLS / 2];
#pragma unroll
    for (int i = 0; i < V_COLS / 2; ++i) acc_dv[i] = acc_dk[i] = 0.f;
    mbar_wait(kv_full, kb & 1);

    for (int st = 0; st < qb.steps; ++st, ++gst) {
      const int s = gst % STAGES, h = hk * heads + st / qb.m_blocks;
      const int i0 = (qb.m_first + st % qb.m_blocks) * BLOCK_M;
      const u32 q_rows = stages + s * STAGE_BYTES, do_rows = q_rows + BOXES * Q_BOX;
      const u32 lse_at = stats + s * STATS_BYTES, d_at = lse_at + 4 * BLOCK_M;
      const u32 ds_tile = ds_tiles + (gst % 2) * DS_BYTES;
      // K's address, opaque to the compiler: it would otherwise hoist every
      // k-step's descriptors of K and V out of the loop and spill them
      u32 k_at = k_tile;
      asm volatile("" : "+r"(k_at));

      // Sᵀ and dPᵀ (64 keys x BLOCK_M queries): element (row g + 8r, column
      // 8nt + 2t + c) of a warp's 16 rows at [4nt + 2r + c]
      float acc_s[BLOCK_M / 2], acc_dp[BLOCK_M / 2];
      mbar_wait(full + 8 * s, (gst / STAGES) & 1);
      gemm_sdp(acc_s, acc_dp, k_at + key_wg * 128, q_rows);
      if (gst > 0) reduce_dq(&p.dq_map, staged, wg, dq_i0, dq_h, b, slice);
      wgmma_wait<0>();
      hold<BLOCK_M / 2>(acc_s);
      hold<BLOCK_M / 2>(acc_dp);
      // invisible pairs (keys past seqlen_k among them: TMA's zero rows of K
      // would give exp2(-lse)) to -inf, so P = 0 there
${apply_mask}
#pragma unroll
      for (int nt = 0; nt < BLOCK_M / 8; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int q = 8 * nt + 2 * t + c;
          const float lse2 = ld_shared_f32(lse_at + 4 * q), dd = ld_shared_f32(d_at + 4 * q);
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int e = 4 * nt + 2 * r + c;
            const float pv = fast_exp2(acc_s[e] * p.scale_log2 - lse2);
            acc_s[e] = pv;
            acc_dp[e] = pv * (acc_dp[e] - dd);
          }
        }
      // Pᵀ and dSᵀ as the A registers of dV += Pᵀ·dO and dK += dSᵀ·Q
      u32 pk[BLOCK_M / 4], dsk[BLOCK_M / 4];
#pragma unroll
      for (int i = 0; i < BLOCK_M / 4; ++i) {
        pk[i] = pack2(acc_s[2 * i], acc_s[2 * i + 1]);
        dsk[i] = pack2(acc_dp[2 * i], acc_dp[2 * i + 1]);
      }
      wgmma_fence();
      gemm_kv(acc_dv, pk, do_rows);
      gemm_kv(acc_dk, dsk, q_rows);
      wgmma_commit();

      // dSᵀ into this step's dS tile (two, alternating: the other warpgroup's
      // dQ of two steps ago, which read this one, was waited for before it
      // reached the last step's barrier), keys as rows, swizzled as wgmma
      // reads it: 16-byte chunk c of row r at chunk c ^ (r % 8); then wait
      // for both halves (named barrier 1).
      u32 g16 = g << 4;  // opaque, like k_at: its swizzled offsets are cheaper made than kept
      asm volatile("" : "+r"(g16));
      const u32 ds_rows = ds_tile + (key_wg + warp_row + g) * 128 + 4 * t;
#pragma unroll
      for (int nt = 0; nt < BLOCK_M / 8; ++nt)
#pragma unroll
        for (int r = 0; r < 2; ++r)  // row key_wg + warp_row + g + 8r, row % 8 == g
          st_shared_u32(ds_rows + 1024 * r + ((nt << 4) ^ g16), dsk[2 * nt + r]);
      fence_async_shared();
      bar_sync(1, 256);

      // dQ for columns wg·DQ_COLS.. (64: box wg; 32: half of box 0)
      float acc_dq[DQ_COLS / 2];
      wgmma_fence();
      gemm_dq(acc_dq, ds_tile, k_at + (wg * DQ_COLS / 64) * KV_BOX + (wg * DQ_COLS % 64) * 2);
      wgmma_commit();
      wgmma_wait<0>();
      hold<V_COLS / 2>(acc_dv);
      hold<V_COLS / 2>(acc_dk);
      hold<DQ_COLS / 2>(acc_dq);
      mbar_arrive(empty + 8 * s);  // done with this stage's Q, dO, lse and D
      stage_dq(acc_dq, staged, wg, ordered && st == 0);
      dq_i0 = i0, dq_h = h;
    }
    mbar_arrive(kv_empty);  // done with K and V

    // dK = scale · Σ dSᵀ·Q and dV: rows (keys) n0 + key_wg + warp_row + g + 8r,
    // columns 8dn + 2t
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int j = n0 + key_wg + warp_row + g + 8 * r;
      if (j < p.seqlen_k) {
#pragma unroll
        for (int which = 0; which < 2; ++which) {
          u16* out = which == 0 ? (u16*)p.dk + b * p.dk_sb + hk * p.dk_sh + (i64)j * p.dk_ss
                                : (u16*)p.dv + b * p.dv_sb + hk * p.dv_sh + (i64)j * p.dv_ss;
          const float* acc = which == 0 ? acc_dk : acc_dv;
          const float f = which == 0 ? p.softmax_scale : 1.f;
#pragma unroll
          for (int dn = 0; dn < V_COLS / 8; ++dn) {
            const int col = dn * 8 + 2 * t;
            const float x0 = acc[4 * dn + 2 * r] * f, x1 = acc[4 * dn + 2 * r + 1] * f;
${output_store}
          }
        }
      }
    }
  }
  if (gst > 0) reduce_dq(&p.dq_map, staged, wg, dq_i0, dq_h, b, slice);
  if (tid % 128 == 0) bulk_wait();  // the last reductions done
}
]]

return function(p)
  if p.arch ~= 90 then error("the sm_90a backward is built for sm_90 only") end
  if p.block_m ~= 64 or p.block_n ~= 64 * p.consumers then
    error("the sm_90a backward takes 64 queries a step and 64 keys per consumer")
  end
  if p.boxes > p.consumers then error("dQ takes one box of head-dim columns per consumer") end
  p.dq_cols = p.v_cols // p.consumers
  local name = "fg_bwd_" .. p.target_tag .. "_" .. p.spec_name .. "_m" .. p.block_m .. "n" .. p.block_n
               .. "s" .. p.stages
  local banner = text.fill([[
// ${name}
// Generated by flashgen ${version}: backward attention, TMA + wgmma.
// spec: ${spec_name} (dtype ${dtype}, head dim ${head_dim}, mask ${mask}, dropout ${dropout},
//       sparsity ${sparsity})
// plan: Br=${block_m} Bc=${block_n} (${consumers} consumer warpgroups) stages=${stages}
//       head dim padded to ${head_dim_padded} (${boxes} boxes), shared memory ${smem_bytes} bytes;
//       registers ${producer_registers} (producer), ${consumer_registers} (consumers); target ${target}
]], {
    name = name, version = p.generator_version, spec_name = p.spec_name, dtype = p.dtype,
    head_dim = p.head_dim, mask = p.mask, dropout = p.dropout and "on" or "off",
    sparsity = p.sparsity, block_m = p.block_m, block_n = p.block_n, consumers = p.consumers,
    stages = p.stages, head_dim_padded = p.head_dim_padded, boxes = p.boxes,
    smem_bytes = p.smem_bytes, producer_registers = p.producer_registers,
    consumer_registers = p.consumer_registers, target = p.target })
  local constants = text.fill([[
#define HEAD_DIM ${head_dim}
#define HEAD_DIM_PADDED ${head_dim_padded}
#define BOXES ${boxes}
#define V_COLS ${v_cols}
#define BLOCK_M ${block_m}
#define BLOCK_N ${block_n}
#define CONSUMERS ${consumers}
#define STAGES ${stages}
#define THREADS ${threads}
#define PRODUCER_REGISTERS ${producer_registers}
#define CONSUMER_REGISTERS ${consumer_registers}
#define Q_BOX (BLOCK_M * 128)                          // bytes of one Q or dO box: BLOCK_M rows x 64 columns
#define KV_BOX (BLOCK_N * 128)                         // bytes of one K or V box
#define STAGE_BYTES (2 * BOXES * Q_BOX)                // Q and dO
#define STATS_BYTES (8 * BLOCK_M)                      // lse·log2 e and D
#define DS_BYTES (BLOCK_N * 128)                       // dS: BLOCK_N keys x 64 queries
#define DQ_COLS ${dq_cols}                              // dQ's columns per consumer
#define DQ_BOX (BLOCK_M * DQ_COLS * 4)                 // dQ staged: BLOCK_M queries x DQ_COLS fp32
#define DQ_MAP_BOX (BLOCK_M * 128)                     // one box of the accumulator's map: 32 columns
#define FG_POS_INF __int_as_float(0x7f800000)
]], p)
  local wgmma_t = { sm90a.wgmma(p.block_m, p.dtype, false) }
  local wgmma_kv = { sm90a.wgmma(p.v_cols, p.dtype, true) }
  local wgmma_dq = p.dq_cols == p.block_m and wgmma_t or { sm90a.wgmma(p.dq_cols, p.dtype, false) }
  -- Sᵀ seen as masks see a tile: queries as rows, keys as columns
  local frag_st = fragment.wgmma_m64_transposed({ array = "acc_s", n_tiles = "BLOCK_M / 8" })
  local apply_mask = mask.apply(p.mask, frag_st, {
    params = "p", row0 = "i0", key0 = "n0 + key_wg + warp_row", block_row0 = "i0",
    block_key0 = "n0" })
  local body = text.fill(kernel, {
    name = name, output_store = text.indent(epilogue.output_store(p), 12),
    apply_mask = text.indent(apply_mask, 6) })
  local key_blocks = text.fill(schedule, { query_range = text.indent(mask.query_range(p.mask), 4) })
  local rows = rows_kernel({ name = name, head_dim = p.head_dim, params = "fg_bwd_tma_params" })
  local dq = dq_kernel({ name = name, head_dim = p.head_dim, head_dim_padded = p.head_dim_padded,
                         params = "fg_bwd_tma_params" })
  local isa = isa_for(80)
  local source = table.concat({
    banner, constants, device.source, isa.prelude(p.dtype), sm90a.source, p.params_struct,
    device.to_float(p.dtype), wgmma_t[2], wgmma_kv[2], wgmma_dq == wgmma_t and "" or wgmma_dq[2],
    text.fill(pieces, { wgmma_t = wgmma_t[1], wgmma_kv = wgmma_kv[1], wgmma_dq = wgmma_dq[1] }),
    key_blocks, rows.source, dq.source, body,
  }, "\n")
  -- D first, then the main kernel, one thread block per (group of key blocks,
  -- key/value head, batch) as it decodes blockIdx.x; then dQ
  local main = { entry = name, threads = p.threads, smem = p.smem_bytes,
                 grid = { { "n_groups" }, { "heads_kv" }, { "batch" } } }
  return { source = source, name = name, launches = { rows.launch, main, dq.launch } }
end
