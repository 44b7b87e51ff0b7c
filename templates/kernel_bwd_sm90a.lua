-- The Hopper backward (sm_90a): dQ, dK, dV of O = softmax(Q·Kᵀ·scale)·V. One
-- module of three kernels, as the mma.sync backward's: D = rowsum(dO∘O)
-- (kernel_bwd_rows.lua), the main kernel, and dQ from its fp32 accumulator
-- (kernel_bwd_dq.lua). The main kernel: one thread block per key block
-- (BLOCK_N keys of one key/value head), CONSUMERS + 1 warpgroups:
--   producer   gives its registers up (setmaxnreg); its first thread loads
--              K and V once (TMA), then, step by step (a query block of one
--              query head of the group that sees the keys: lib_sparse's
--              Steps), Q and dO into a ring of STAGES
--              buffers; its threads put the step's lse·log2(e) and D beside
--              them (a value each; in the deterministic kernel the first
--              two warps, two each), with dropout the consumers' keep
--              decisions (lib_dropout's transposed form), and arrive on the
--              stage's "full" barrier;
--   consumers  each owns 64 keys and computes the transposed products with
--              its keys along wgmma's M: Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ from
--              shared memory; Pᵀ = exp2(Sᵀ·scale·log2 e − lse·log2 e) and
--              dSᵀ = Pᵀ∘(dPᵀ − D) in registers (with dropout Pᵀ∘Z and
--              Pᵀ∘(Z∘dPᵀ/(1−p) − D), Z the keep decisions, and dV times
--              1/(1−p) at the end); dV += Pᵀ·dO and
--              dK += dSᵀ·Q with Pᵀ and dSᵀ as A from registers; dSᵀ into
--              shared memory (keys as rows), where after both consumers'
--              halves are in, consumer w computes dQ = dS·K (A read as
--              (K, M)) for its share of the head-dim columns (DQ_BY_ROWS,
--              at 128 rows a step: for its half of the rows) and stages it
--              in shared memory (DQ_T, at 80 rows a step, no multiple
--              of wgmma's 64: dQᵀ = Kᵀ·dSᵀ, 64 columns along M a tile and
--              the rows along N, from a dS tile with queries as rows;
--              DQ_PAIRS, at 32 rows where Q and K are three boxes wide:
--              dQ = dS·K once a pair of steps, query blocks 2u and 2u + 1,
--              over a 64-row dS tile with queries as rows, each consumer
--              96 columns in two products);
--              once the next step's Sᵀ and dPᵀ are
--              issued, one thread adds it to the fp32 accumulator by bulk
--              reductions (TMA), which run while the consumers go on.
-- dK (times the softmax scale) and dV are stored at the end: by their tensor
-- maps from shared memory in the fast kernel of a dense call at head dims
-- that are multiples of 8 (store_boxes), else from registers.
-- Q and K rows are the head dim wide (BOXES boxes of 64 columns), V and dO
-- rows the value head dim (V_BOXES); a stage holds Q's boxes, then dO's.
-- Split (SPLIT, above two boxes of head-dim columns, or where dK and dV of
-- 64 keys per consumer would not fit in its registers): the block has 64
-- keys, which both consumers see; consumer w computes Sᵀ and dPᵀ for queries
-- S_COLS·w.. (m64n32), puts its Pᵀ and dSᵀ into the step's P and dS tiles,
-- and after both halves are in, dV += Pᵀ·dO, dK += dSᵀ·Q and dQ = dS·K for
-- its share of each width's columns (k_col, v_col), every operand from
-- shared memory.
-- Packed sequences (varlen): thread blocks per (key block, key/value head,
-- sequence), the last "sequence" the key rows after the last one (their dK
-- and dV written zero); maps over the packed tensors, which run on into the
-- next sequence, so the rows of K and V past the sequence's keys and of Q
-- and dO past its queries are cleared in shared memory before any GEMM
-- reads them (zero_rows): scores past either end are masked or have P = 0,
-- but 0·inf is NaN. dQ's reductions then add zeros to the rows past the
-- sequence.
-- The deterministic schedule has a main kernel of its own (the call's
-- arguments launch one of the two), with this layout; it orders the
-- reductions:
-- each query block's dQ is added by the key blocks that see it (under a
-- mask a range of them; with sparsity those kept), from the last one down,
-- each once the one after it (next_key_block) has added and its reductions
-- have completed (turns through a counter per query block
-- in global memory). The thread blocks then start with the
-- last key block too, so a turn never waits for one that cannot start.
-- Without a mask or sparsity the turns are ranks in the
-- order the key blocks reach a query block, and where a sequence's key
-- blocks are resident together (p.wrap) each starts at its own share
-- of the query blocks and wraps round (turn_rank).
-- There the consumers hand their staged dQ to the first thread of the
-- producer's third and fourth warps, which take the steps in turn, wait for
-- their turns and issue the reductions: waiting in a consumer would hold its
-- warpgroup's GEMMs up.
local text = import("lib_text")
local device = import("lib_device")
local isa_for = import("isa")
local sm90a = import("isa_sm90a")
local epilogue = import("lib_epilogue")
local fragment = import("lib_fragment")
local mask = import("lib_mask")
local logits = import("lib_logits")
local rows_kernel = import("kernel_bwd_rows")
local dq_kernel = import("kernel_bwd_dq")
local dropout = import("lib_dropout")
local sparse = import("lib_sparse")
local sequence = import("lib_seq")
local width = import("lib_width")

local pieces = [[
// A tile of map (rows from r0, COUNT boxes of 64 columns, box_bytes apart)
// into dst, completing on bar.
template <int COUNT>
__device__ __forceinline__ void load_boxes(const void* map, u32 dst, u32 box_bytes, u32 bar, int r0,
                                           int hh, int b) {
#pragma unroll
  for (int box = 0; box < COUNT; ++box) tma_load_4d(dst + box * box_bytes, map, bar, 64 * box, r0, hh, b);
}

// Xᵀ = A·Bᵀ (64 keys x S_COLS queries) over PADDED columns for a
// warpgroup's 64 rows of A (K or V, rows KV_BOX apart per box) and B (Q or
// dO, Q_BOX per box), both K-major.
template <int PADDED>
__device__ __forceinline__ void gemm_t(float* acc, u32 a_rows, u32 b_rows) {
  const u64 da = smem_desc_sw128(a_rows, 16, 1024), db = smem_desc_sw128(b_rows, 16, 1024);
#pragma unroll
  for (int ks = 0; ks < PADDED / 16; ++ks) {
    const u32 at = 32 * (ks % 4);  // the slice's 32 bytes within its 128-byte rows
    ${wgmma_t}<0, 0>(acc, desc_at(da, (ks / 4) * KV_BOX + at), desc_at(db, (ks / 4) * Q_BOX + at), ks > 0);
  }
}

// Sᵀ = K·Qᵀ of a stage (Q boxes; the queries from row q0) for the
// warpgroup's 64 keys of K at k_rows, issued and committed.
__device__ __forceinline__ void gemm_s(float* acc_s, u32 k_rows, u32 stage, int q0) {
  wgmma_fence();
  gemm_t<HEAD_DIM_PADDED>(acc_s, k_rows, stage + 128 * q0);
  wgmma_commit();
}

// dPᵀ = V·dOᵀ of a stage (dO boxes after Q's; V follows K), after Sᵀ
// unless WITH_S is false (issued already), each issued and committed (Pᵀ
// may be made while dPᵀ is in flight).
template <bool WITH_S>
__device__ __forceinline__ void gemm_sdp(float* acc_s, float* acc_dp, u32 k_rows, u32 stage, int q0) {
  if (WITH_S) gemm_s(acc_s, k_rows, stage, q0);
  else wgmma_fence();
  gemm_t<HEAD_DIM_V_PADDED>(acc_dp, k_rows + BOXES * KV_BOX, stage + BOXES * Q_BOX + 128 * q0);
  wgmma_commit();
}

#if !SPLIT
${gemm_kv}
#if DQ_T
// dQᵀ (DQ_COLS columns x DQ_ROWS queries) = Kᵀ·dSᵀ over the block's keys:
// K read as (K, M) from k_cols, the consumer's box of columns, dSᵀ K-major
// from ds_box, the queries-by-keys tile (a box per 64 keys, DS_BOX apart).
__device__ __forceinline__ void gemm_dq(float* acc, u32 ds_box, u32 k_cols) {
  const u64 da = smem_desc_sw128(k_cols, 16, 1024), db = smem_desc_sw128(ds_box, 16, 1024);
#pragma unroll
  for (int kc = 0; kc < BLOCK_N / 16; ++kc)
    ${wgmma_dq}<1, 0>(acc, desc_at(da, 2048 * kc), desc_at(db, (kc / 4) * DS_BOX + 32 * (kc % 4)), kc > 0);
}
#elif DQ_PAIRS
// dQ (a pair's DQ_UNIT queries x DQ_COLS columns) = dS·K over the block's
// keys, in two products, each staged before the next (their accumulators
// one after the other): dS K-major from the pair's tile (queries as rows, a
// box per 64 keys), K read as (K, N); WIDE: consumer 0 columns 0..63,
// consumer 1 128..191; else 64..95 and 96..127 (the same products in both,
// at other addresses: no branch on the warpgroup).
template <bool WIDE>
__device__ __forceinline__ void gemm_dq(float* acc, u32 ds_tile, u32 k_rows, int wg) {
  const u64 da = smem_desc_sw128(ds_tile, 16, 1024);
  const u64 db = smem_desc_sw128(WIDE ? k_rows + 2 * wg * KV_BOX : k_rows + KV_BOX + 64 * wg, 16, 1024);
#pragma unroll
  for (int kc = 0; kc < BLOCK_N / 16; ++kc) {
    const u64 a = desc_at(da, (kc / 4) * DS_BOX + 32 * (kc % 4)), b = desc_at(db, 2048 * kc);
    if (WIDE)
      ${wgmma_dq}<0, 1>(acc, a, b, kc > 0);
    else
      ${wgmma_dq32}<0, 1>(acc, a, b, kc > 0);
  }
}
#else
// dQ (DQ_ROWS queries x DQ_COLS columns) = dS·K over the block's keys: dS
// read as (K, M) from ds_box, the box of the keys-by-queries tile that holds
// the queries, K as (K, N) from k_cols, the first of the columns in a box.
__device__ __forceinline__ void gemm_dq(float* acc, u32 ds_box, u32 k_cols) {
  const u64 da = smem_desc_sw128(ds_box, 16, 1024), db = smem_desc_sw128(k_cols, 16, 1024);
#pragma unroll
  for (int kc = 0; kc < BLOCK_N / 16; ++kc) ${wgmma_dq}<1, 1>(acc, desc_at(da, 2048 * kc), desc_at(db, 2048 * kc), kc > 0);
}
#endif

// Column c of a consumer's dK, of its dV, and of its dQ; its dQ's first
// row in the step (DQ_BY_ROWS: the consumers take the step's rows by
// halves, each every column; else its columns of every row)
__device__ __forceinline__ int k_col(int, int c) { return c; }
__device__ __forceinline__ int v_col(int, int c) { return c; }
#if DQ_PAIRS
__device__ __forceinline__ int dq_col(int wg, int c) { return wg == 0 ? c : c < 64 ? 128 + c : 32 + c; }
#else
__device__ __forceinline__ int dq_col(int wg, int c) { return (DQ_BY_ROWS ? 0 : wg * DQ_COLS) + c; }
#endif
#else
${gemm_share}
__device__ __forceinline__ int dq_col(int wg, int c) { return k_col(wg, c); }
#endif
__device__ __forceinline__ int dq_first_row(int wg) { return DQ_BY_ROWS ? wg * DQ_ROWS : 0; }
// Whether consumer wg's dQ has column c (c < DQ_COLS): where the consumers'
// columns together pass the head dim's boxes, those past them.
__device__ __forceinline__ bool dq_has(int wg, int c) {
  return (DQ_BY_ROWS ? DQ_COLS : CONSUMERS * DQ_COLS) <= BOXES * 64 || dq_col(wg, c) < BOXES * 64;
}

#if !SPLIT && !DQ_PAIRS
// A consumer's dQ of a step from its dS tile, for rows dq_first_row(wg)..
// and columns dq_col(wg, 0).. (64: box wg; 32: half of box 0). DQ_T: 64
// columns of K's boxes a tile; a consumer with fewer boxes than
// DQ_COLS / 64 computes its last again and keeps it nowhere (a wgmma
// behind a branch on the warpgroup would serialize them all: ptxas C7520).
__device__ __forceinline__ void issue_dq(float* acc_dq, u32 ds_tile, u32 k_at, int wg) {
#if DQ_T
#pragma unroll
  for (int tile = 0; tile < DQ_COLS / 64; ++tile)
    gemm_dq(acc_dq + tile * (DQ_ROWS / 2), ds_tile,
            k_at + (DQ_COLS / 64 * CONSUMERS > BOXES ? min(dq_col(wg, 64 * tile) / 64, BOXES - 1)
                                                     : dq_col(wg, 64 * tile) / 64) * KV_BOX);
#else
  gemm_dq(acc_dq, ds_tile + (dq_first_row(wg) / 64) * DS_BOX,
          k_at + (dq_col(wg, 0) / 64) * KV_BOX + (dq_col(wg, 0) % 64) * 2);
#endif
}
#endif

__device__ __forceinline__ void st_shared_v2_f32(u32 addr, float x0, float x1) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x0), "f"(x1) : "memory");
}
__device__ __forceinline__ void st_shared_f32(u32 addr, float x) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(x) : "memory");
}

// Tiles NT0.. (NTS of them, 8 columns each) of a consumer's dQ, not
// transposed, into its staging box `staged` (rows (queries) warp_row + g +
// 8r, columns 8nt + 2t + c; acc holds tile NT0 first).
// 8-byte stores meet conflicts within a half-warp, whose lanes hold rows g
// = 0..3: one tile's two chunks of those rows, swizzled, fall in one group of
// four of a row's eight; so lanes with t >= 2 store the tile two along
// (nt ^ 2, the other group) and the next such store the complement. The
// split kernels with dropout keep each lane's own tile: their consumers
// spilled with the selects (d = 256 causal).
template <int NT0, int NTS>
__device__ __forceinline__ void stage_dq_cols(const float* acc, u32 staged) {
  static_assert(NT0 % 4 == 0 && NTS % 4 == 0, "tiles in whole boxes of the map");
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const bool h = !(SPLIT && DROPOUT) && t >= 2;
  const int warp_row = ((threadIdx.x / 32) % 4) * 16;
  const u32 dq_rows = staged + (warp_row + g) * 128 + 8 * (t & 1), chunk = (((t >> 1) ^ g) << 4) ^ (h ? 64 : 0);
#pragma unroll
  for (int n = 0; n < NTS; ++n)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int nt = NT0 + n;
      st_shared_v2_f32(dq_rows + (nt / 4) * DQ_MAP_BOX + 1024 * r + (((nt % 4) << 5) ^ chunk),
                       h ? acc[4 * (n ^ 2) + 2 * r] : acc[4 * n + 2 * r],
                       h ? acc[4 * (n ^ 2) + 2 * r + 1] : acc[4 * n + 2 * r + 1]);
    }
}

#if DQ_PAIRS
// One of a pair's two dQ products (WIDE: its 64 columns, else its 32, map
// tiles NT0.. of 8 columns, NTS of them) made and staged; its accumulators
// live only here: the next product starts once this one is staged.
template <bool WIDE, int NT0, int NTS>
__device__ __forceinline__ void pair_dq(u32 ds_tile, u32 k_at, int wg, u32 staged) {
  float acc[4 * NTS];
  wgmma_fence();
  gemm_dq<WIDE>(acc, ds_tile, k_at, wg);
  wgmma_commit();
  wgmma_wait<0>();
  hold<4 * NTS>(acc);
  stage_dq_cols<NT0, NTS>(acc, staged);
}
#endif

// A consumer's dQ of a step into its staging box `staged`, as DQ_COLS / 32
// of the accumulator map's boxes of 32 columns (DQ_ROWS rows of 128 bytes each,
// 16-byte chunk c of row r at c ^ (r % 8)): rows (queries) warp_row + g + 8r,
// columns 8nt + 2t + c (DQ_T: columns warp_row + g + 8r, rows 8nt + 2t + c,
// a float at a time); then made visible to the bulk reductions.
__device__ __forceinline__ void stage_dq(const float* acc_dq, u32 staged) {
#if DQ_T
  // the thread's index, opaque like k_at: offsets made from it before the
  // loop were spilled in the deterministic kernel
  u32 x = threadIdx.x;
  asm volatile("" : "+r"(x));
  const int g = (x % 32) / 4, t = x % 4, warp_row = ((x / 32) % 4) * 16;
  const int chunk = (warp_row % 32) / 4 + g / 4;  // column warp_row + g's 16 bytes
#pragma unroll
  for (int tile = 0; tile < DQ_COLS / 64; ++tile) {  // 64 columns each, two map boxes
    if (tile > 0 && !dq_has((int)(x / 128), 64 * tile)) break;
    const u32 cols = staged + (2 * tile + warp_row / 32) * DQ_MAP_BOX + 4 * (g % 4);
#pragma unroll
    for (int nt = 0; nt < DQ_ROWS / 8; ++nt)
#pragma unroll
      for (int c = 0; c < 2; ++c)
#pragma unroll
        for (int r = 0; r < 2; ++r)  // row 8nt + 2t + c, whose % 8 is 2t + c
          st_shared_f32(cols + (8 * nt + 2 * t + c) * 128 + (((chunk + 2 * r) ^ (2 * t + c)) << 4),
                        acc_dq[tile * (DQ_ROWS / 2) + 4 * nt + 2 * r + c]);
  }
#else
  stage_dq_cols<0, DQ_COLS / 8>(acc_dq, staged);
#endif
  fence_async_shared();
}

// The fast kernel's staging of a consumer's dQ, once the reductions of its
// last one have read the box: its own, issued by its first thread, or
// ORDERED the reduction thread's (taken: that thread's barrier for it),
// the box then given to that thread (given; n counts the dQs given).
template <bool ORDERED>
__device__ __forceinline__ void stage_dq_once_read(const float* acc_dq, u32 staged, int wg, u32 given, u32 taken,
                                                   int& n) {
  if (ORDERED) {
    if (n > 0) mbar_wait(taken, (n - 1) & 1);
  } else {
    if (threadIdx.x % 128 == 0) bulk_wait_read();
    bar_sync(2 + wg, 128);
  }
  stage_dq(acc_dq, staged);
  if (ORDERED) {
    mbar_arrive(given);
    ++n;
  }
}

// The fast schedule's reductions: consumer wg's staged dQ added to the
// accumulator's map rows i0 + dq_first_row(wg).. of head h, columns dq_col(wg, 0)..
// (map), by its first thread once the warpgroup's dQ is in (rows past the
// map's are skipped).
__device__ __forceinline__ void reduce_dq(const void* map, u32 staged, int wg, int i0, int h, int b) {
  bar_sync(2 + wg, 128);
  if (threadIdx.x % 128 == 0) {
#pragma unroll
    for (int half = 0; half < DQ_COLS / 32; ++half)
      if (dq_has(wg, 32 * half))
        tma_reduce_add_4d(map, staged + half * DQ_MAP_BOX, dq_col(wg, 32 * half), i0 + dq_first_row(wg), h, b);
    bulk_commit();
  }
}

// blockIdx.x -> (key block, key/value head, batch or packed sequence). The
// fast schedule takes sections of p.section_heads (head, batch) pairs, in
// each the first key blocks first (under a causal mask they see the most
// query blocks), the section's pairs side by side: blocks started in order
// then go longest first over the section. The deterministic schedule takes
// one pair after another, the last key blocks first.
template <bool FAST>
__device__ __forceinline__ void block_of(const fg_bwd_tma_params& p, u32 bid, int& n_block, int& hk, int& b) {
  const int heads = FAST ? p.section_heads : 1;
  const u32 section_blocks = heads * p.num_n_blocks;
  const int pair0 = bid / section_blocks * heads;
  const int in_section = bid % section_blocks;
  const int pairs = min(heads, p.heads_kv * p.sequences - pair0);
  const int x = in_section / pairs;
  n_block = FAST ? x : p.num_n_blocks - 1 - x;
  const int pair = pair0 + in_section % pairs;
  hk = pair % p.heads_kv;
  b = pair / p.heads_kv;
}

// The deterministic schedule's counters (p.dq_turns) of rows i0.. of head
// h, batch (sequence) b: DQ_PLANES of them, the first's address (a key
// block n takes its turns on the one of plane n % DQ_PLANES).
__device__ __forceinline__ u32* turn_of(const fg_bwd_tma_params& p, int b, int h, int i0) {
  const i64 m_count = (p.seqlen_q + BLOCK_M - 1) / BLOCK_M;
  return (u32*)p.dq_turns + (((i64)(u32)b * p.heads_q + h) * m_count + i0 / BLOCK_M) * DQ_PLANES;
}

__device__ __forceinline__ float ld_shared_f32(u32 addr) {
  float x;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(x) : "r"(addr) : "memory");
  return x;
}
__device__ __forceinline__ void st_shared_u16(u32 addr, u32 x) {
  asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(addr), "h"((unsigned short)x) : "memory");
}
__device__ __forceinline__ u32 ld_shared_u32(u32 addr) {
  u32 x;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(x) : "r"(addr) : "memory");
  return x;
}
]]

-- dK (dV) += Xᵀ·B, not split: Xᵀ packed in registers, NAME of N columns
-- (K_COLS or V_COLS), B (Q or dO) read as (K, N), 16 queries at a time, its
-- boxes Q_BOX apart.
local gemm_kv = [[
// acc += Xᵀ·B (64 keys x ${cols}): Xᵀ packed in registers, B (${b}) read
// as (K, N), 16 queries at a time, its boxes Q_BOX apart.
__device__ __forceinline__ void ${name}(float* acc, const u32* xk, u32 b_rows) {
  const u64 db = smem_desc_sw128(b_rows, Q_BOX, 1024);
#pragma unroll
  for (int kc = 0; kc < BLOCK_M / 16; ++kc) ${wgmma}<1>(acc, xk + 4 * kc, desc_at(db, 2048 * kc), 1);
}
]]

-- Split: a consumer's share of one width's columns (COLS = 32 x boxes of
-- the width): the first min(64, COLS) from column FIRST·wg, the rest (at
-- three boxes 32, at four 64) from column 128 + REST·wg; and the products
-- into it.
local gemm_share = [[
// Column c (0..${cols}-1) of consumer wg's share of ${what}'s columns: ${first}
// from column ${first}·wg${rest_text}.
__device__ __forceinline__ int ${col}(int wg, int c) {
  return c < ${first} ? ${first} * wg + c : 128 + ${rest} * wg + (c - 64);
}

// acc (64 rows x ${cols}) += A·B over 64: A from a 64 x 64 tile of one box
// (TNSP_A 0: K-major, as the P and dS tiles give Pᵀ and dSᵀ; 1: read as
// (K, M), as the dS tile gives dS), B read as (K, N) from b_rows in consumer
// wg's share of ${what}'s columns (boxes box_bytes apart); ADD 0 overwrites acc.
template <int TNSP_A, int ADD>
__device__ __forceinline__ void ${name}(float* acc, u32 a_tile, u32 b_rows, u32 box_bytes, int wg) {
  const u32 first = b_rows + (${first} * wg / 64) * box_bytes + (${first} * wg % 64) * 2;
  const u32 rest = b_rows + ((128 + ${rest} * wg) / 64) * box_bytes + (${rest} * wg % 64) * 2;
  const u64 da0 = smem_desc_sw128(a_tile, 16, 1024), d_first = smem_desc_sw128(first, 16, 1024);
  const u64 d_rest = smem_desc_sw128(rest, 16, 1024);
  (void)d_rest;
#pragma unroll
  for (int kc = 0; kc < 4; ++kc) {
    const u64 da = desc_at(da0, (TNSP_A ? 2048 : 32) * kc);
    ${wgmma_first}<TNSP_A, 1>(acc, da, desc_at(d_first, 2048 * kc), ADD || kc > 0);
${rest_gemm}  }
}
]]
local rest_gemm = "    ${wgmma_rest}<TNSP_A, 1>(acc + ${first} / 2, da, desc_at(d_rest, 2048 * kc), ADD || kc > 0);\n"

-- The query blocks m_first..m_end-1 of sequence seq that may see a key of
-- the key block at n0 (none: m_end == m_first, also where the sequence's
-- queries see no key from n0 on); a range that moves up with n0. Returns
-- the rows' shift: block m holds rows m·BLOCK_M + shift.. (AT_FIRST: the
-- first block starts at the first query that sees the key block, so that
-- where BLOCK_M does not divide BLOCK_N a causal mask's diagonal leaves no
-- step part empty at the top; else 0, the blocks every key block shares).
local query_blocks = [[
template <bool AT_FIRST>
__device__ __forceinline__ int query_blocks(const fg_bwd_tma_params& p, const Seq& seq, int n0, int& m_first,
                                            int& m_end) {
${query_range}
  m_first = i_lo / BLOCK_M;
  const int shift = AT_FIRST ? i_lo - m_first * BLOCK_M : 0;
  m_end = i_lo < i_hi && n0 < seq.seqlen_k ? (i_hi - shift + BLOCK_M - 1) / BLOCK_M : m_first;
  return shift;
}

// K and V of the key block at n0, head hk, into their boxes (barrier kv_bar)
__device__ __forceinline__ void load_kv(const fg_bwd_tma_params& p, u32 k_tile, u32 v_tile, u32 kv_bar,
                                        const Seq& seq, int n0, int hk) {
  mbar_arrive_expect(kv_bar, (BOXES + V_BOXES) * KV_BOX);
  load_boxes<BOXES>(&p.k_map, k_tile, KV_BOX, kv_bar, seq.map_k(n0), hk, seq.map_b());
  load_boxes<V_BOXES>(&p.v_map, v_tile, KV_BOX, kv_bar, seq.map_k(n0), hk, seq.map_b());
}
]]

-- dQ = scale · the accumulator, converted by the last thread block of each
-- (key/value head, sequence) pair to finish, while the accumulator's rows
-- are in L2 (the kernel after the main one reads them from DRAM: 66 µs at
-- 16k tokens, d = 128); convert_range is the call's (dense or packed).
local pair_done = [[
// Whether this thread block is the last of its pair's p.num_n_blocks to be
// done: thread 0 counts it in, once the `count` threads of named barrier
// `id` (thread 0 among them) are past every reduction of the block, and
// the answer comes to all of them.
__device__ __forceinline__ bool last_of_pair(const fg_bwd_tma_params& p, int b, int hk, int id, int count) {
  bool last = false;
  if (threadIdx.x == 0) {
    u32* const done = (u32*)p.dq_done + (i64)b * p.heads_kv + hk;
    u32 before;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;\n" : "=r"(before) : "l"(done) : "memory");
    last = before + 1 == (u32)p.num_n_blocks;
  }
  return bar_sync_or(id, count, last);
}

// dQ of rows i0..i1 - 1 (the sequence's numbering) of key/value head hk's
// query heads, by `threads` threads: four columns of a row a thread, the
// loads of LOADS rows issued before their stores (past L1: other thread
// blocks' reductions wrote them; LOADS as the registers allow, as the L2's
// latency bounds the rate).
template <int LOADS>
__device__ __forceinline__ void convert_dq(const fg_bwd_tma_params& p, const Seq& seq, int hk, int i0, int i1,
                                           int tid, int threads) {
  constexpr int C4 = HEAD_DIM_PADDED / 4;
  const int rows_at_once = threads / C4, col4 = 4 * (tid % C4);
  if (tid >= rows_at_once * C4 || col4 >= HEAD_DIM) return;
  const int group = p.heads_q / p.heads_kv;
  for (int h = hk * group; h < (hk + 1) * group; ++h) {
    const float* acc = (const float*)p.dq_accum + col4;
    u16* const out_h = (u16*)p.dq + h * p.dq_sh;
    for (int i = i0 + tid / C4; i < i1; i += rows_at_once * LOADS) {
      float4 x[LOADS];
#pragma unroll
      for (int u = 0; u < LOADS; ++u)
        if (i + u * rows_at_once < i1)
          x[u] = __ldcg((const float4*)(acc + seq.stat(p, h, i + u * rows_at_once) * HEAD_DIM_PADDED));
#pragma unroll
      for (int u = 0; u < LOADS; ++u) {
        if (i + u * rows_at_once >= i1) break;
        store_dq4(out_h + seq.q_at(p.dq_sb, p.dq_ss, i + u * rows_at_once), col4, x[u], p.softmax_scale);
      }
    }
  }
}

// The pair's dQ: its sequence's query rows${convert_range_text}.
template <int LOADS>
__device__ __forceinline__ void convert_pair(const fg_bwd_tma_params& p, const Seq& seq, int hk, int tid,
                                             int threads) {
${convert_range}
}
]]

-- Dropout's keep decisions, drawn by the fast kernel's producer (lib_dropout's
-- transposed form): BLOCK_N tasks a step (32-key stretch, quad position q,
-- query pair t, half), thread pt task pt; task k makes 16 bits of each of
-- four consumer threads' words (threads 64·stretch + 32a + 8q + 4bk + t,
-- half k % 2) from four Philox calls.
local keep_tasks = [[
__device__ __forceinline__ void draw_keep(const fg_bwd_tma_params& p, int b, int h, int i0, int n0, int k,
                                          u32* keep) {
  keep_words_t(p.philox_keys, p.drop_threshold4, ((u32)b << 16) | (u32)h, (u32)p.offset, p.drop_row_counter,
               p.drop_key_counter, i0, n0 + 32 * (k >> 5), (k >> 3) & 3, (k >> 1) & 3, k & 1, keep);
}

// task k's words into the stage's keep words
__device__ __forceinline__ void store_keep(u32 words, int k, const u32* keep) {
  words += 2 * (k & 1) + 4 * (64 * (k >> 5) + 8 * ((k >> 3) & 3) + ((k >> 1) & 3));
#pragma unroll
  for (int a = 0; a < 2; ++a)
#pragma unroll
    for (int bk = 0; bk < 2; ++bk)
      st_shared_u16(words + 4 * (32 * a + 4 * bk), __byte_perm(keep[a], 0u, bk ? 0x4431u : 0x4420u));
}
]]
-- A consumer thread's keep word, in keep_bit's order. Split, the words are
-- those of 64 keys by the step's 64 queries, as the first consumer's would
-- be unsplit; consumer w's S_COLS = 32 queries are nt 4w..4w+3 of them, the
-- word's half w.
local load_keep = [[
    const u32 keep = ld_shared_u32(stats + s * STATS_BYTES + 8 * BLOCK_M + 4 * (SPLIT ? tid % 128 : tid)) >> (SPLIT ? S_COLS / 2 * wg : 0);]]
-- Pᵀ and dSᵀ of an element (pv: P; acc_dp: dPᵀ, dd: D), and with dropout
-- (Z: keep's bit) Pᵀ∘Z and Pᵀ∘(Z∘dPᵀ/(1−p) − D).
local combine_plain = [[
acc_s[e] = pv;
acc_dp[e] = pv * (acc_dp[e] - dd);]]
local combine_dropout = [[
const u32 m = (u32)((int)(keep << (31 - keep_bit(nt, r, c))) >> 31);  // all ones where kept
acc_s[e] = __uint_as_float(__float_as_uint(pv) & m);
acc_dp[e] = pv * fmaf(acc_dp[e], __uint_as_float(__float_as_uint(p.out_scale) & m), -dd);]]

-- dSᵀ in a pass of its own, where the fast kernel makes Pᵀ and dSᵀ in two
-- (main_kernel's two_pass).
local ds_pass = [[
    wgmma_wait<0>();
    hold<S_COLS / 2>(acc_dp);
#pragma unroll
    for (int nt = 0; nt < S_COLS / 8; ++nt) {
      const float2 d_nt = ${d_pair};  // queries q0 + 8nt + 2t and + 1: loaded first, 40 fewer SASS at d 64
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float dd = c ? d_nt.y : d_nt.x;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int e = 4 * nt + 2 * r + c;
          acc_dp[e] = acc_s[e] * (acc_dp[e] - dd);
        }
      }
    }
]]

-- Where the consumers read their steps' bounds from shared memory
-- (lib_sparse's SharedSteps): m_first and m_end, stored before the
-- warpgroups part.
local bounds_at = [[
  const u32 bounds = dq_free + 8 * SETS * CONSUMERS;  // m_first, m_end
]]
local bounds_store = [[
    st_shared_u32(bounds, m_first);
    st_shared_u32(bounds + 4, m_end);
]]
local consumer_shared_steps = [[
  SharedSteps steps;
  steps.start(bounds, hk * group, group);]]

-- PERSIST: the tile's key block, head, sequence and query blocks, decoded
-- as the first tile's are (these shadow those; carried from one tile to the
-- next, the consumers spilled)
local tile_decode = [[
  int n_block, hk, b;
  block_of<FAST && !ORDERED>(p, tile, n_block, hk, b);
  const int n0 = n_block * BLOCK_N;
  Seq seq;
${seq_of_tile}  int m_first, m_end;
  const int row_shift = query_blocks<FAST && ${rows_at_first}>(p, seq, n0, m_first, m_end);
]]

-- One main kernel per schedule: FAST, the fast one; else the deterministic.
local kernel = [[
extern "C" __global__ void __launch_bounds__(THREADS, 1)
${name}(const __grid_constant__ fg_bwd_tma_params p) {
  constexpr bool FAST = ${fast};
  // the fast kernel's steps in the deterministic schedule's order, their
  // dQ added by the deterministic kernel's reduction thread (not packed,
  // unsplit, without dropout)
  constexpr bool ORDERED = ${ordered};
  // the producer's threads that load lse and D (the deterministic kernel's
  // warps 2 and 3 issue the reductions, warp 2 alone where 3 draws)
  constexpr int STATS_THREADS = FAST && !ORDERED ? (2 * BLOCK_M < 128 ? 2 * BLOCK_M : 128) : 64;
  constexpr int SETS = FAST ? 1 : DQ_SETS;
  // the fast unsplit kernel takes a step's dQ a step late, once the other
  // consumer's half of its dS tile is in: without dropout at 80 or 128 query
  // rows a step, its second consumer starting half a step behind the first
  // (the consumers meet at no barrier, and one's exponentials run beside the
  // other's products); with dropout at 64 rows and d > 64, the consumers
  // starting together (hopper-backward-notes steps 33 and 35: the other
  // kernels measured no faster). Its two dS tiles' barriers are the
  // staging's (unused there): "stored" (both halves in) and "read" (both
  // consumers' dQ of it done)
  constexpr bool LATE = FAST && !SPLIT && !DQ_PAIRS && (DROPOUT ? BLOCK_M == 64 && BOXES > 1 : BLOCK_M > 64);
  constexpr bool LATE_OFFSET = LATE && !DROPOUT;  // consumer 1 half a step behind
  // the fast kernel's dQ product awaited after its staging box, at one box
  // (d <= 64 measured 1-3% faster, d = 128 at 8k 1.6% slower; the
  // deterministic kernel's consumers spill with it at d = 64)
  constexpr bool DQ_BEHIND = FAST && !DQ_PAIRS && BOXES == 1;
  // the fast kernel's blocks walk tiles (p.walk, one block an SM): a
  // tile's first stages are loaded while the last tile's dK and dV are
  // stored, those staged in the dS tiles and dQ's staging so that K and V
  // of the next tile load meanwhile (hopper-backward-notes step 49). The
  // kernel after converts dQ there (p.dq_post): in these blocks ptxas
  // spilled 8-12 bytes at d = 104 and 112
  constexpr bool PERSIST = FAST && ${walk};
  // where dQ comes a step late and is awaited with dV and dK (d = 65..128
  // without dropout), the fast kernel stages it at the next step's start,
  // once that step's Sᵀ is issued, so the product runs beside the staging
  // (hopper-backward-notes step 39; the deterministic kernel keeps its
  // order). Sᵀ issued a step ahead instead would be in flight across the
  // loop's two ends: ptxas serialized every wgmma (C7514)
  constexpr bool STAGE_LATER = LATE_OFFSET && !DQ_BEHIND;
  static_assert(!LATE || SETS * CONSUMERS == 2, "a stored and a read barrier per dS tile");
  static_assert(!PERSIST || (!SPLIT && !DQ_PAIRS && (!${stored_by_boxes} || (BOXES + V_BOXES) * KV_BOX <= 2 * DS_BYTES + DQ_SET_BYTES)),
                "dK and dV staged where dS and dQ are");
  // with dropout and one staging set, the deterministic kernel's fourth
  // warp draws the keep tasks past the load threads' first (the load
  // threads' second draws bound its steps at d <= 128)
  constexpr bool DRAW_WARP = !FAST && DROPOUT && SETS == 1 && BLOCK_N > STATS_THREADS;
  // the deterministic kernel's threads that take the reductions' steps in
  // turn, warps 2 and 3's first: with one staging set, a thread's
  // reductions complete and pass their turn while the other's next step is
  // issued. One where warp 3 draws, for pairs of steps, and packed at 128
  // rows (its producer's 24 registers spilled 8 bytes with two)
  constexpr int REDUCERS = DRAW_WARP || DQ_PAIRS || (${packed} && BLOCK_M == 128) ? 1 : 2;
  static_assert(SETS <= REDUCERS, "a staging set a reduction thread at most");
#if DROPOUT
  constexpr int LOAD_TASKS = DRAW_WARP ? STATS_THREADS : BLOCK_N;  // the tasks the load threads draw
#endif
  extern __shared__ unsigned char smem[];
  // K and V boxes, STAGES x (Q boxes, dO boxes), two dS tiles (BLOCK_N keys
  // x DQ_UNIT queries; split, then two P tiles), dQ's staging (SETS sets of a DQ_BOX per
  // consumer: the fast kernel has one, the deterministic one DQ_SETS, set
  // n % SETS for the n-th dQ), every 1024-byte aligned for the swizzle; STAGES x
  // (lse·log2 e and D per query, with dropout a keep word per consumer
  // thread); the barriers: K and V, per stage "full" and "empty", per
  // staging box dQ "staged" and "free" (deterministic); the steps' bounds; packed,
  // the sequence (Seq: 7 ints).
  const u32 k_tile = (smem_addr(smem) + 1023u) & ~1023u;
  const u32 v_tile = k_tile + BOXES * KV_BOX;
  const u32 stages = v_tile + V_BOXES * KV_BOX;
  const u32 ds_tiles = stages + STAGES * STAGE_BYTES;
  const u32 dq_stage = ds_tiles + (SPLIT ? 4 : 2) * DS_BYTES;
  const u32 stats = dq_stage + SETS * DQ_SET_BYTES;
${stats_base}  const u32 kv_bar = stats + STAGES * STATS_BYTES, full = kv_bar + 8, empty = full + 8 * STAGES;
  const u32 dq_staged = empty + 8 * STAGES, dq_free = dq_staged + 8 * SETS * CONSUMERS;
  // PERSIST: K and V free (the last tile's products done); two slots of a
  // tile's index, taken in turn, each with a barrier for written and one
  // for read by the consumers
  const u32 kv_free = dq_free + 8 * SETS * CONSUMERS, tile_full = kv_free + 8, slot_free = tile_full + 16,
            tile_slot = slot_free + 16;
  // ORDERED (never PERSIST): a consumer's staged dQ given to the reduction
  // thread, and taken (read) by it; LATE keeps dq_staged and dq_free for the dS tiles
  const u32 dq_given = kv_free + 8, dq_taken = dq_given + 8 * CONSUMERS;
${bounds_at}${seq_at}  // the warpgroup, warp-uniform to the compiler in the fast kernels where
  // the consumers own their keys: descriptors made in uniform registers,
  // 1.5-3.5% faster at d 64, 128 and 192/128; the split kernels (d 129..256)
  // measured even or slower so, and the deterministic kernel spills so with
  // dropout over packed sequences (hopper-backward-notes step 69)
  const int tid = threadIdx.x, wg = SPLIT || !FAST ? tid / 128 : __shfl_sync(0xffffffffu, tid / 128, 0);

  const int group = p.heads_q / p.heads_kv;
  const u32 tiles = p.fast_tiles;  // PERSIST (a parameter: made here, ptxas held it in a register)
  int n_block, hk, b;
  block_of<FAST && !ORDERED>(p, blockIdx.x, n_block, hk, b);
  const int n0 = n_block * BLOCK_N;
  Seq seq;
  seq.init(p, b);
${short_return}  // the query blocks that may see a key of this block: those of
  // m_first..m_end - 1 that the sparsity keeps, of each query head of the
  // group; a step each (lib_sparse's Steps)
  // (the fast kernel's 80-row blocks under a mask without sparsity from the
  // first row that sees this key block: 1-3% fewer steps causal)
  int m_first, m_end;
  const int row_shift = query_blocks<FAST && ${rows_at_first}>(p, seq, n0, m_first, m_end);
${wrap_start}
  if (tid == 0) {
    mbar_init(kv_bar, 1);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full + 8 * s, STATS_THREADS + (DRAW_WARP ? 32 : 0));
      mbar_init(empty + 8 * s, CONSUMERS * 128);
    }
    for (int w = 0; w < SETS * CONSUMERS; ++w) {
      mbar_init(dq_staged + 8 * w, LATE ? CONSUMERS * 128 : 128);  // LATE: dS tile w stored
      mbar_init(dq_free + 8 * w, LATE ? CONSUMERS * 128 : 1);      // LATE: dS tile w read
    }
    if (ORDERED) {
      for (int w = 0; w < CONSUMERS; ++w) {
        mbar_init(dq_given + 8 * w, 128);
        mbar_init(dq_taken + 8 * w, 1);
      }
    }
    if (PERSIST) {
      mbar_init(kv_free, 1);
      for (int x = 0; x < 2; ++x) {
        mbar_init(tile_full + 8 * x, 1);
        mbar_init(slot_free + 8 * x, CONSUMERS * 128);
      }
${first_tile}    }
${bounds_store}${seq_store}    mbar_init_fence();
  }
  __syncthreads();
  // a programmatic dependent of the D kernel: its blocks wait here beside
  // that kernel's last ones (D, and the workspace it follows, read below);
  // dQ's conversion after this one may start as this one's last blocks run
  grid_let_next_start();
  grid_wait_prior();

  if (wg == CONSUMERS) {  // the producer
    regs_lower<${producer_registers}>();
${role_bounds}    const int pt = tid - CONSUMERS * 128;
    if (pt < STATS_THREADS) {  // loads
      // st: steps so far, PERSIST over the block's tiles (it: the tiles);
      // K and V of a later tile once its first stages are issued and the
      // last tile's products are done
      int st = 0;
      for (u32 tile = ${producer_first}, it = 0;;) {
${producer_tile_decode}${announce_tile}      const int first = st;
      if (pt == 0 && it == 0) load_kv(p, k_tile, v_tile, kv_bar, seq, n0, hk);
      Steps steps;
      steps.start(p, seq.b, hk * group, group, n0, m_first, m_end${m_start});
      for (; steps.valid(); ++st, steps.advance(p${taken})) {
${load_seq}        const int s = st % STAGES, h = steps.h, i0 = steps.m * BLOCK_M + row_shift;
        const u32 stage = stages + s * STAGE_BYTES;
#if DROPOUT
        // keep tasks pt, pt + STATS_THREADS, ... below LOAD_TASKS (split: of the first BLOCK_N threads), drawn before the stage is free
        constexpr int TASKS = (LOAD_TASKS + STATS_THREADS - 1) / STATS_THREADS;
        u32 keep[TASKS][2];
#pragma unroll
        for (int j = 0; j < TASKS; ++j)
          if (pt + j * STATS_THREADS < LOAD_TASKS) draw_keep(p, b, h, i0, n0, pt + j * STATS_THREADS, keep[j]);
#endif
        // the stage's 2·BLOCK_M floats, STATS_THREADS apart: float k < BLOCK_M
        // the lse·log2 e of row i0 + k (+inf past the rows or where a row
        // saw no key: P = 0 there), float BLOCK_M + k its D; read before
        // the stage is free, so their round trips are not the consumers' wait
        constexpr int STATS_EACH = (2 * BLOCK_M + STATS_THREADS - 1) / STATS_THREADS;
        float x[STATS_EACH];
        // (ORDERED: k % BLOCK_M made each step from an opaque pt, not
        // held through the loop: at 80 rows three such spilled 8 bytes)
        int lane_k = pt;
        if (ORDERED) asm volatile("" : "+r"(lane_k));
#pragma unroll
        for (int j = 0; j < STATS_EACH; ++j) {
          const int k = lane_k + j * STATS_THREADS, i = i0 + k % BLOCK_M;
          const bool lse_row = k < BLOCK_M;
          x[j] = lse_row ? FG_POS_INF : 0.f;
          if (k < 2 * BLOCK_M && i < seq.seqlen_q) {
            const float v = ((const float*)(lse_row ? p.lse : p.delta))[seq.stat(p, h, i)];
            x[j] = !lse_row ? v : v != FG_NEG_INF ? v * 1.4426950408889634f : FG_POS_INF;
          }
        }
        if (PERSIST && pt == 0 && it > 0 && st - first == STAGES) {
          mbar_wait(kv_free, (it - 1) & 1);
          load_kv(p, k_tile, v_tile, kv_bar, seq, n0, hk);
        }
        if (st >= STAGES) mbar_wait(empty + 8 * s, (st / STAGES - 1) & 1);
#pragma unroll
        for (int j = 0; j < STATS_EACH; ++j) {
          const int k = pt + j * STATS_THREADS;
          if (2 * BLOCK_M % STATS_THREADS && k >= 2 * BLOCK_M) break;  // 80 rows
          st_shared_f32(stats + s * STATS_BYTES + 4 * k, x[j]);
        }
#if DROPOUT
#pragma unroll
        for (int j = 0; j < TASKS; ++j)
          if (pt + j * STATS_THREADS < LOAD_TASKS) store_keep(stats + s * STATS_BYTES + 8 * BLOCK_M, pt + j * STATS_THREADS, keep[j]);
#endif
        if (pt == 0) {
          mbar_arrive_expect(full + 8 * s, STAGE_BYTES);
          load_boxes<BOXES>(&p.q_map, stage, Q_BOX, full + 8 * s, seq.map_q(i0), h, seq.map_b());
          load_boxes<V_BOXES>(&p.do_map, stage + BOXES * Q_BOX, Q_BOX, full + 8 * s, seq.map_q(i0), h, seq.map_b());
        } else {
          mbar_arrive(full + 8 * s);
        }
      }
      if (!PERSIST) break;
      if (pt == 0) {
        if (it > 0 && st - first < STAGES + 1) {  // fewer steps than that: K and V still to load
${late_seq}          mbar_wait(kv_free, (it - 1) & 1);
          load_kv(p, k_tile, v_tile, kv_bar, seq, n0, hk);
        }
        // the next tile's index for the load threads (named barrier 8) and
        // the consumers (tile_full), once they have read the slot's last
        const u32 next = tile_with_keys(p, gridDim.x + atomicAdd((u32*)p.tile_next, 1u), tiles);
        if (it >= 1) mbar_wait(slot_free + 8 * ((it + 1) % 2), ((it - 1) / 2) & 1);
        st_shared_u32(tile_slot + 4 * ((it + 1) % 2), next);
${announce_next}      }
      bar_sync(8, STATS_THREADS);
      tile = ld_shared_u32(tile_slot + 4 * ((it + 1) % 2));
      ++it;
      if (tile >= tiles) break;
      }
    } else if ((!FAST || ORDERED) && (pt == 64 || (REDUCERS == 2 && pt == 96))) {  // the reductions
      // The first threads of warps 2 and 3 take the steps in turn (of
      // staging set st % SETS), so one can wait for its step's turn and
      // its reductions' completion while the other's are issued. A query block's
      // turn comes once the next key block that sees it (next_key_block, if
      // within the mask's query blocks next_first..) has added to it; a
      // step's turn is passed on once its reductions have completed, before
      // the thread's next step.
      const u32 staged_at = ORDERED ? dq_given : dq_staged, freed_at = ORDERED ? dq_taken : dq_free;
      Steps steps;
      steps.start(p, seq.b, hk * group, group, n0, m_first, m_end${m_start});
#if DQ_PAIRS
      // a pair's reductions, at its last step: they wait for the turns of
      // the pair's blocks that a step wrote (the other half is zero: adding
      // it needs no turn), and pass them once they have completed
      int staged_n = 0;
#pragma unroll 1
      for (int st = 0; steps.valid(); ++st, steps.advance(p${taken})) {
        const int h = steps.h;
${pair_of_reduce}        if (!pair_end) continue;
        u32 wait_value, pass_high, pass_low = 0;
        {
${turn_values_high}        }
        u32* const turn = turn_of(p, b, h, steps.m * BLOCK_M);  // block m - 1's: turn - DQ_PLANES
        wait_turn(turn, wait_value);
        if (pair_low) {
          {
${turn_values_low}          }
          wait_turn(turn - DQ_PLANES, wait_value);
        }
        const int i0 = (steps.m - steps.m % 2) * BLOCK_M + row_shift;
#pragma unroll
        for (int w = 0; w < CONSUMERS; ++w) {
          mbar_wait(staged_at + 8 * w, staged_n & 1);
#pragma unroll
          for (int half = 0; half < DQ_COLS / 32; ++half)
            tma_reduce_add_4d(&p.dq_map, dq_stage + w * DQ_BOX + half * DQ_MAP_BOX, dq_col(w, 32 * half),
                              seq.map_q(i0), h, seq.map_b());
        }
        bulk_commit();
        bulk_wait_read();
#pragma unroll
        for (int w = 0; w < CONSUMERS; ++w) mbar_arrive(freed_at + 8 * w);
        bulk_wait();
        pass_turn(turn, pass_high);
        if (pair_low) pass_turn(turn - DQ_PLANES, pass_low);
        ++staged_n;
      }
#else
      u32* passed = nullptr;  // the thread's last counter, and what it passes
      u32 pass_value = 0;
#pragma unroll 1
      for (int st = 0; steps.valid(); ++st, steps.advance(p${taken})) {
        if (REDUCERS == 2 && (st ^ pt / 32) & 1) continue;  // warp 2's even steps, warp 3's odd
        const int h = steps.h, i0 = steps.m * BLOCK_M + row_shift, set = st % SETS;
        const u32 staged = staged_at + 8 * CONSUMERS * set, freed = freed_at + 8 * CONSUMERS * set;
        if (passed) {
          bulk_wait();
          pass_turn(passed, pass_value);
        }
        // the key block's index opaque each step: what the turns make of it,
        // held through the steps, spilled the producer's 24 registers
        int n = n_block;
        asm volatile("" : "+r"(n));
        u32 wait_value;
        {
${turn_values}        }
        const int plane = n % DQ_PLANES;  // of the accumulator and of the counters
        u32* const turn = turn_of(p, b, h, i0) + plane;
        // one set for two threads: the staged barriers may be a phase behind
        // step st's, so first the other thread's step st - 1 is read (its
        // boxes freed, which it did once each was staged); and they are not
        // past st's, as st + 1 waits for this thread to free them
        if (SETS < REDUCERS && st > 0) mbar_wait(freed, (st - 1) & 1);
        wait_turn(turn, wait_value);
#pragma unroll
        for (int w = 0; w < CONSUMERS; ++w) {
          mbar_wait(staged + 8 * w, (st / SETS) & 1);
#pragma unroll
          for (int half = 0; half < DQ_COLS / 32; ++half)
            if (dq_has(w, 32 * half))
              tma_reduce_add_4d(&p.dq_map, dq_stage + (CONSUMERS * set + w) * DQ_BOX + half * DQ_MAP_BOX,
                                dq_col(w, 32 * half), seq.map_q(i0) + dq_first_row(w), h,
                                seq.map_b() + plane * PLANE_BATCHES);
        }
        bulk_commit();
        bulk_wait_read();
#pragma unroll
        for (int w = 0; w < CONSUMERS; ++w) mbar_arrive(freed + 8 * w);
        passed = turn;
      }
      bulk_wait();  // the last reductions done
      if (passed) pass_turn(passed, pass_value);
#endif
    }
#if DROPOUT
    else if (DRAW_WARP && pt >= 96) {  // the keep tasks LOAD_TASKS.. a step, 32 apart
      constexpr int DRAWN = DRAW_WARP ? (BLOCK_N - LOAD_TASKS) / 32 : 1;
      const int lane = pt - 96;
      Steps steps;
      steps.start(p, seq.b, hk * group, group, n0, m_first, m_end${m_start});
      for (int st = 0; steps.valid(); ++st, steps.advance(p${taken})) {
        const int s = st % STAGES, h = steps.h, i0 = steps.m * BLOCK_M + row_shift;
        u32 keep[DRAWN][2];
#pragma unroll
        for (int j = 0; j < DRAWN; ++j) draw_keep(p, b, h, i0, n0, LOAD_TASKS + lane + 32 * j, keep[j]);
        if (st >= STAGES) mbar_wait(empty + 8 * s, (st / STAGES - 1) & 1);
#pragma unroll
        for (int j = 0; j < DRAWN; ++j) store_keep(stats + s * STATS_BYTES + 8 * BLOCK_M, LOAD_TASKS + lane + 32 * j, keep[j]);
        mbar_arrive(full + 8 * s);
      }
    }
#endif
    return;
  }

  regs_raise<${consumer_registers}>();
${role_bounds}  const int lane = tid & 31, g = lane >> 2, t = lane & 3;
  // this warp's first row of its warpgroup's 64 (DQ_T: unsigned, or the
  // deterministic kernel spills a register; the others measured 2% slower
  // at d = 64 with that form)
#if DQ_T || DQ_PAIRS
  const int warp_row = (int)((u32)tid / 32 % 4) * 16;
#else
  const int warp_row = ((tid / 32) % 4) * 16;
#endif
  const int key_wg = SPLIT ? 0 : wg * 64;      // this warpgroup's first key in the block
  const int q0 = SPLIT ? wg * S_COLS : 0;      // and first query of its Sᵀ and dPᵀ in a step
  const u32 staged = dq_stage + wg * DQ_BOX;  // dQ's staging, set 0
  // st: steps so far (PERSIST: over the block's tiles, it the tiles, the
  // tile's index in slot it % 2, read where used)
  int st = 0;
  for (u32 it = 0;; ++it) {
  const u32 tile = PERSIST ? ld_shared_u32(tile_slot + 4 * (it % 2)) : blockIdx.x;
  if (PERSIST && tile >= tiles) break;
${consumer_tile_decode}  float acc_dv[V_COLS / 2], acc_dk[K_COLS / 2];
#pragma unroll
  for (int i = 0; i < V_COLS / 2; ++i) acc_dv[i] = 0.f;
#pragma unroll
  for (int i = 0; i < K_COLS / 2; ++i) acc_dk[i] = 0.f;
  // the fast schedule's consumers add their dQ themselves, the step after
  // the staged (STAGE_LATER: held) dQ's map row and head (ORDERED: the
  // reduction thread's steps say it)
  __attribute__((unused)) int dq_row = 0, dq_h = 0;
#if !DQ_PAIRS
  int late_row = 0, late_h = 0;  // LATE: the map row and head of the step whose dQ is due
#endif
  int given = 0;  // ORDERED: dQs given to the reduction thread
  int staged_n = 0;          // DQ_PAIRS: dQs staged (else st)
  bool dq_waiting = false;   // DQ_PAIRS, LATE: the fast kernel's last staged dQ not yet added (else st > 0;
                             // STAGE_LATER: between steps, held in dq_held, not yet staged)
  float dq_held[STAGE_LATER ? DQ_ACC : 1];
  // PERSIST: defined at each tile's start, or ptxas holds it from one tile
  // into the next (a read before any write, under dq_waiting) and the
  // consumers spilled 240 bytes
  if (PERSIST) {
#pragma unroll
    for (int i = 0; i < (STAGE_LATER ? DQ_ACC : 1); ++i) dq_held[i] = 0.f;
  }
  mbar_wait(kv_bar, it & 1);
${clear_kv}
${consumer_steps}
  bool first = true;  // the tile's first step
  for (; steps.valid(); ++st, first = false, steps.advance(p${taken})) {
${step_seq}    const int s = st % STAGES, h = steps.h, i0 = steps.m * BLOCK_M + row_shift;
    const u32 q_rows = stages + s * STAGE_BYTES, do_rows = q_rows + BOXES * Q_BOX;
${stats_at}#if DQ_PAIRS
    // the step's half of its pair's dS tile (query block m: rows 32 (m % 2)..;
    // two tiles, a pair each in turn), whether the pair's dQ is due now,
    // and the half no step of the pair writes (-1: none), cleared
${pair_of}    const int half = steps.m % 2;
    const int unwritten = half == 0 ? (pair_end ? 1 : -1) : (pair_low ? -1 : 0);
    const u32 ds_tile = ds_tiles + (staged_n % 2) * DS_BYTES;
#else
    const u32 ds_tile = ds_tiles + (st % 2) * DS_BYTES;
#endif
    // K's address, opaque to the compiler: it would otherwise hoist every
    // k-step's descriptors of K and V out of the loop and spill them
    u32 k_at = k_tile;
    asm volatile("" : "+r"(k_at));

    // Sᵀ and dPᵀ (64 keys x S_COLS queries from q0): element (row g + 8r,
    // column 8nt + 2t + c) of a warp's 16 rows at [4nt + 2r + c]
    float acc_s[S_COLS / 2], acc_dp[S_COLS / 2];
    mbar_wait(full + 8 * s, (st / STAGES) & 1);
${clear_q}
    if (LATE_OFFSET && wg == 1 && first) bar_sync(1, 256);  // half a step behind consumer 0
    if (STAGE_LATER) {
      gemm_s(acc_s, k_at + key_wg * 128, q_rows, q0);
      if (dq_waiting) stage_dq_once_read<ORDERED>(dq_held, staged, wg, dq_given + 8 * wg, dq_taken + 8 * wg, given);
    }
    gemm_sdp<!STAGE_LATER>(acc_s, acc_dp, k_at + key_wg * 128, q_rows, q0);
    if (FAST && (DQ_PAIRS || LATE ? dq_waiting : !first)) ${reduce_staged}
    dq_waiting = false;
    // Pᵀ and dSᵀ: in one pass once both are in, or, in the fast kernel
    // where dSᵀ needs nothing of the pass but Pᵀ (no dropout, no derivative
    // of a score modifier, no aux gradients), in two: Pᵀ while dPᵀ is in
    // flight (hopper-backward-notes step 13; the deterministic kernel's
    // registers have no room for it), then dSᵀ = Pᵀ∘(dPᵀ − D)
    wgmma_wait<${pending}>();
    hold<S_COLS / 2>(acc_s);
${hold_dp}    // invisible pairs (keys past seqlen_k among them: TMA's zero rows of K
    // would give exp2(-lse)) to -inf, so P = 0 there
${apply_mask}
${load_keep}
${logits_setup}#pragma unroll
    for (int nt = 0; nt < S_COLS / 8; ++nt) {
${row_terms}#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int q = q0 + 8 * nt + 2 * t + c;
        const float lse2 = ${lse_q}${dd};
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int e = 4 * nt + 2 * r + c;
${element}
          const float pv = fast_exp2(a * ${to_log2} - lse2);
${combine}${derivative}
        }
      }
    }
${ds_pass}    // Pᵀ and dSᵀ packed: the A registers of dV += Pᵀ·dO and dK += dSᵀ·Q
    // (split: what goes to the P and dS tiles)
    u32 pk[S_COLS / 4], dsk[S_COLS / 4];
#pragma unroll
    for (int i = 0; i < S_COLS / 4; ++i) {
      pk[i] = pack2(acc_s[2 * i], acc_s[2 * i + 1]);
      dsk[i] = pack2(acc_dp[2 * i], acc_dp[2 * i + 1]);
    }
#if !SPLIT
    wgmma_fence();
    gemm_dv(acc_dv, pk, do_rows);
    gemm_dk(acc_dk, dsk, q_rows);
    wgmma_commit();
#endif
    if (LATE_OFFSET && wg == 0 && first) bar_arrive(1, 256);  // consumer 1 starts now

    // dSᵀ (split: and Pᵀ) into this step's tile (two, alternating: the
    // other warpgroup's GEMMs of two steps ago, which read this one, were
    // waited for before it reached the last step's barrier; LATE: once both
    // consumers' dQ of two steps ago has read it), keys as rows
    // (DQ_T: queries as rows, 8 x 8 pieces stored transposed), swizzled as
    // wgmma reads it: 16-byte chunk c of row r at chunk c ^ (r % 8); then
    // wait for both halves (named barrier 1; LATE: say this one is in).
    if (LATE && st >= 2) mbar_wait(dq_free + 8 * (st % 2), (st / 2 - 1) & 1);
#if DQ_T || DQ_PAIRS
    {
      // lane l: row l % 8 of piece l / 8 of each four (dsk[4i + j]: queries
      // 16i + 8(j / 2).., keys warp_row + 8(j % 2).. of box wg); the thread's
      // index read again, opaque like k_at: kept through the loop, its
      // offsets spilled in the deterministic kernel
      u32 x = threadIdx.x;
      asm volatile("" : "+r"(x));
      const u32 l = x % 32, q = 8 * (l / 16) + l % 8, chunk = (x / 32) % 4 * 2 + (l / 8) % 2;
      const u32 at = ds_tile + (DQ_PAIRS ? (u32)steps.m % 2 * (BLOCK_M * 128) : 0) + (x / 128) * DS_BOX + q * 128 +
                     ((chunk ^ (l % 8)) << 4);  // DQ_PAIRS: the step's half of the pair's rows
#pragma unroll
      for (int i = 0; i < S_COLS / 16; ++i)
        stmatrix_x4_trans(at + 2048 * i, dsk[4 * i], dsk[4 * i + 1], dsk[4 * i + 2], dsk[4 * i + 3]);
    }
#else
    if (${ds_stmatrix} && !SPLIT) {
      // one stmatrix for 16 keys x 16 queries, a quarter of the stores;
      // lane l: row l % 8 of piece l / 8 of each four (dsk[2nt + j]: keys
      // warp_row + 8(j % 2).., queries 8(nt + j / 2)..)
      u32 x = threadIdx.x;
      asm volatile("" : "+r"(x));
      const u32 l = x % 32, row = (x / 128) * 64 + (x / 32) % 4 * 16 + 8 * ((l / 8) % 2) + l % 8;
      const u32 rows_at = ds_tile + row * 128;
#pragma unroll
      for (int nt = 0; nt < S_COLS / 8; nt += 2) {
        const u32 qc = nt + l / 16 + q0 / 8;  // the 8 queries' chunk: box qc / 8, chunk qc % 8
        stmatrix_x4(rows_at + (qc / 8) * DS_BOX + (((qc % 8) ^ (l % 8)) << 4), dsk[2 * nt], dsk[2 * nt + 1],
                    dsk[2 * nt + 2], dsk[2 * nt + 3]);
      }
    } else {
      u32 g16 = g << 4;  // opaque, like k_at: its swizzled offsets are cheaper made than kept
      asm volatile("" : "+r"(g16));
      const u32 ds_rows = ds_tile + (key_wg + warp_row + g) * 128 + 4 * t;
#pragma unroll
      for (int nt = 0; nt < S_COLS / 8; ++nt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {  // row key_wg + warp_row + g + 8r, row % 8 == g
          const int qc = nt + q0 / 8;  // the 8 queries' chunk: box qc / 8, chunk qc % 8
          const u32 at = ds_rows + (qc / 8) * DS_BOX + 1024 * r + (((qc % 8) << 4) ^ g16);
          st_shared_u32(at, dsk[2 * nt + r]);
          if (SPLIT) st_shared_u32(at + 2 * DS_BYTES, pk[2 * nt + r]);
        }
    }
#endif
#if DQ_PAIRS
    if (unwritten >= 0)
      zero_rows(ds_tile + wg * DS_BOX, 1, DS_BOX, BLOCK_M * unwritten, BLOCK_M * (unwritten + 1), tid % 128, 128);
#endif
    fence_async_shared();
    if (LATE) mbar_arrive(dq_staged + 8 * (st % 2));
    else bar_sync(1, 256);

#if SPLIT
    // dV += Pᵀ·dO and dK += dSᵀ·Q over the step's queries, then dQ = dS·K,
    // each for this consumer's share of the columns
    float acc_dq[DQ_ACC];
    wgmma_fence();
    gemm_share_v<0, 1>(acc_dv, ds_tile + 2 * DS_BYTES, do_rows, Q_BOX, wg);
    gemm_share_k<0, 1>(acc_dk, ds_tile, q_rows, Q_BOX, wg);
    wgmma_commit();
    wgmma_fence();
    gemm_share_k<1, 0>(acc_dq, ds_tile, k_at, KV_BOX, wg);
    wgmma_commit();
#elif !DQ_PAIRS  // (a pair's dQ comes below, once dV and dK are in)
    // dQ for rows dq_first_row(wg).. and columns dq_col(wg, 0).. (64: box wg;
    // 32: half of box 0); LATE: the step before's, from its tile once both
    // halves are in, and none at the first step (which leaves here: with
    // the product behind a branch, ptxas serialized every wgmma, C7512)
    if (LATE && first) {
      wgmma_wait<0>();
      hold<V_COLS / 2>(acc_dv);
      hold<K_COLS / 2>(acc_dk);
      mbar_arrive(empty + 8 * s);
      late_row = seq.map_q(i0), late_h = h;
      // STAGE_LATER: dq_held defined on every way into the next step, or
      // its registers stay live through this one (476 bytes spilled)
      if (STAGE_LATER) {
#pragma unroll
        for (int i = 0; i < DQ_ACC; ++i) dq_held[i] = 0.f;
      }
      continue;
    }
    float acc_dq[DQ_ACC];
    if (LATE) mbar_wait(dq_staged + 8 * ((st + 1) % 2), ((st - 1) / 2) & 1);
    wgmma_fence();
    issue_dq(acc_dq, LATE ? ds_tiles + ((st + 1) % 2) * DS_BYTES : ds_tile, k_at, wg);
    wgmma_commit();
#endif
    // dV and dK in: the stage is free (DQ_BEHIND: dQ, the group after
    // theirs, still in flight while the staging box is awaited)
    wgmma_wait<DQ_BEHIND ? 1 : 0>();
    hold<V_COLS / 2>(acc_dv);
    hold<K_COLS / 2>(acc_dk);
#if !DQ_PAIRS
    if (!DQ_BEHIND) hold<DQ_ACC>(acc_dq);
#endif
    mbar_arrive(empty + 8 * s);  // done with this stage's Q, dO, lse and D
#if DQ_PAIRS
    if (!pair_end) continue;
    const int dq_at = seq.map_q((steps.m - half) * BLOCK_M + row_shift), dq_head = h;  // the pair's first row
#else
    // LATE: the step before's dQ, and once its product is in, the tile it read is free
    const int dq_at = LATE ? late_row : seq.map_q(i0), dq_head = LATE ? late_h : h;
    if (LATE && !DQ_BEHIND) {
      late_row = seq.map_q(i0), late_h = h;
      mbar_arrive(dq_free + 8 * ((st + 1) % 2));  // this consumer's dQ is done with that tile
    }
    if (STAGE_LATER) {
#pragma unroll
      for (int i = 0; i < DQ_ACC; ++i) dq_held[i] = acc_dq[i];
      dq_row = dq_at, dq_h = dq_head;
      dq_waiting = true;
      continue;
    }
#endif
    // the staging box, once the reductions of its last dQ (the last one;
    // deterministic: of set n % SETS, SETS ago, n the dQs staged before) have read it
    const int n = DQ_PAIRS ? staged_n : st, set = n % SETS;
    if (ORDERED) {
      if (given > 0) mbar_wait(dq_taken + 8 * wg, (given - 1) & 1);
    } else if (FAST) {
      if (tid % 128 == 0) bulk_wait_read();
      bar_sync(2 + wg, 128);
    } else if (n >= SETS) {
      mbar_wait(dq_free + 8 * (CONSUMERS * set + wg), (n / SETS - 1) & 1);
    }
#if !DQ_PAIRS
    if (DQ_BEHIND) {
      wgmma_wait<0>();
      hold<DQ_ACC>(acc_dq);
      if (LATE) {  // as above
        late_row = seq.map_q(i0), late_h = h;
        mbar_arrive(dq_free + 8 * ((st + 1) % 2));
      }
    }
#endif
#if DQ_PAIRS
    // the pair's dQ, once dV and dK are in (their packed Pᵀ and dSᵀ free),
    // 64 columns then 32, each staged before the next is made
    pair_dq<true, 0, 8>(ds_tile, k_at, wg, staged + CONSUMERS * set * DQ_BOX);
    pair_dq<false, 8, 4>(ds_tile, k_at, wg, staged + CONSUMERS * set * DQ_BOX);
    fence_async_shared();
#else
    stage_dq(acc_dq, staged + CONSUMERS * set * DQ_BOX);
#endif
    if (!FAST) mbar_arrive(dq_staged + 8 * (CONSUMERS * set + wg));
    if (ORDERED) {
      mbar_arrive(dq_given + 8 * wg);
      ++given;
    }
    dq_row = dq_at, dq_h = dq_head;
    ++staged_n;
    dq_waiting = true;
  }
#if !SPLIT && !DQ_PAIRS
  if (LATE && !first) {  // the last step's dQ
    if (dq_waiting) {
      if (STAGE_LATER) stage_dq_once_read<ORDERED>(dq_held, staged, wg, dq_given + 8 * wg, dq_taken + 8 * wg, given);
      ${reduce_staged}
    }
    float acc_dq[DQ_ACC];
    mbar_wait(dq_staged + 8 * ((st + 1) % 2), ((st - 1) / 2) & 1);
    wgmma_fence();
    issue_dq(acc_dq, ds_tiles + ((st + 1) % 2) * DS_BYTES, k_tile, wg);
    wgmma_commit();
    wgmma_wait<0>();
    hold<DQ_ACC>(acc_dq);
    stage_dq_once_read<ORDERED>(acc_dq, staged, wg, dq_given + 8 * wg, dq_taken + 8 * wg, given);
    if (PERSIST) mbar_arrive(dq_free + 8 * ((st + 1) % 2));  // its dS tile read, as the steps' are
    dq_row = late_row, dq_h = late_h;
    dq_waiting = true;
  }
#endif
  if (FAST && (DQ_PAIRS || LATE ? dq_waiting : !first)) ${reduce_staged}
  if (FAST && !ORDERED && tid % 128 == 0) bulk_wait_read();  // the last reductions have read their staging
  if (ORDERED && given > 0) mbar_wait(dq_taken + 8 * wg, (given - 1) & 1);

  // dK = scale · Σ dSᵀ·Q and dV (times 1/(1−p): out_scale): rows (keys)
  // n_out·BLOCK_N + key_wg + warp_row + g + 8r, columns 8dn + 2t, of head
  // hk_out, batch b_out: the block decoded again (from an index the
  // compiler cannot see is the same), as kept they would hold registers
  // through the loop
  u32 slot = tile_slot;  // opaque: held through the steps from the tile's start, it spilled
  asm volatile("" : "+r"(slot));
  u32 bid = PERSIST ? ld_shared_u32(slot + 4 * (it % 2)) : blockIdx.x;
  asm volatile("" : "+r"(bid));
  int n_out, hk_out, b_out;
  block_of<FAST && !ORDERED>(p, bid, n_out, hk_out, b_out);
  Seq seq_out;
${seq_out_of}  if (PERSIST) mbar_arrive(slot_free + 8 * (it % 2));  // the slot read
${store_out}
  // the fast kernel, unless a kernel after it converts dQ (p.dq_post; in
  // the deterministic schedule one always does: with this code at its
  // consumers' end it spilled 4 bytes at d = 64): this block's reductions complete
  // and fenced (not dK's and dV's stores, the last commit where they are
  // stored by boxes), then the block counted in; the pair's last converts
  // its dQ
  if (FAST && !PERSIST && !p.dq_post) {
    if (tid % 128 == 0) {
      if (${stored_by_boxes} && tid == 0) bulk_wait_older();
      else bulk_wait();
      fence_async_global();
    }
    bar_sync(4, CONSUMERS * 128);
    if (last_of_pair(p, b_out, hk_out, 5, CONSUMERS * 128))
      convert_pair<16>(p, seq_out, hk_out, tid, CONSUMERS * 128);
  }
  if (!PERSIST) break;
  mbar_wait(tile_full + 8 * ((it + 1) % 2), (it / 2) & 1);
  }
}
]]

local turn_rank_source = [[
// Without a mask or sparsity the deterministic schedule's turns are ranks:
// query block m (of the sequence's M) is added to by its key blocks in the
// order they reach it, the counter counting the turns taken. With
// p.wrap key block n of N starts at query block ⌊n·M/N⌋ and wraps
// round, so none waits at the start; of those whose start is at most m (k
// of them) the largest n reaches m first, then of the others. Without it
// every block starts at query block 0, the largest n first.
// (32-bit products: p.wrap asks for key blocks times query blocks below
// 2^32.) With planes the rank is among the blocks of n's plane (n %
// DQ_PLANES): those before n in the order k - 1..0, n_count - 1..k.
__device__ __forceinline__ int wrap_start(const fg_bwd_tma_params& p, int n, int m_count, int n_count) {
  return p.wrap ? (int)((u32)n * (u32)m_count / (u32)n_count) : 0;
}
__device__ __forceinline__ int turn_rank(const fg_bwd_tma_params& p, int n, int m, int m_count, int n_count) {
  const int k = p.wrap ? min(n_count, (int)(((u32)(m + 1) * (u32)n_count + m_count - 1) / (u32)m_count))
                           : n_count;
  return n < k ? (k - 1 - n) / DQ_PLANES
               : (k + DQ_PLANES - 1 - n % DQ_PLANES) / DQ_PLANES + (n_count - 1 - n) / DQ_PLANES;
}
]]

-- The deterministic schedule's turns: a query block's turn comes once the
-- next key block that sees it (next_key_block, if within the mask's query
-- blocks next_first..) has added to it, passing its own index + 1; or,
-- without a mask or sparsity, by rank (turn_rank), passing its rank + 1.
local turn_chain = [[
int next = ${n}, next_first, next_end;
do {  // the next key block of ${n}'s plane that sees the query block
  next = next_key_block(p, seq.b, h, ${m}, next);
  next_first = next_end = 0;
  if (next < p.num_n_blocks) query_blocks<false>(p, seq, next * BLOCK_N, next_first, next_end);
} while (next % DQ_PLANES != ${n} % DQ_PLANES && ${m} >= next_first && ${m} < next_end);
wait_value = ${m} >= next_first && ${m} < next_end ? next + 1 : 0;
${pass} = ${n} + 1;
]]
local turn_ranks = [[
const int n_count = (seq.seqlen_k + BLOCK_N - 1) / BLOCK_N;
wait_value = turn_rank(p, ${n}, ${m} - m_first, m_end - m_first, n_count);
${pass} = wait_value + 1;
]]
-- DQ_PAIRS: where step `steps` stands in its pair of query blocks (2u,
-- 2u + 1): pair_end, whether the pair's dQ is due at it (block 2u + 1, or
-- 2u where the key block's next step is not 2u + 1 of the same head).
local pair_of = [[
const bool pair_end = steps.m % 2 == 1 || !steps.continues(${first});
const bool pair_low = steps.m % 2 == 1 && steps.follows(${first});  // block 2u's dS in too
]]
-- The deterministic kernel's first query block of each head (wrap_start).
local wrap_start = [[
  const int m_start = m_first + wrap_start(p, n_block, m_end - m_first, (seq.seqlen_k + BLOCK_N - 1) / BLOCK_N);
]]

-- The ordered deterministic kernel's steps' bounds (and where they start)
-- read back by each role once it has its registers: held from the prologue
-- into the producer's few, ptxas kept them in local memory for both roles.
local role_bounds = [[
  m_first = (int)ld_shared_u32(bounds), m_end = (int)ld_shared_u32(bounds + 4);
]]

-- Packed sequences only: the pieces above that differ from a dense call's.
local packed = {
  short_return = [[
  if (n0 >= seq.rows_k) {  // past its packed sequence's key rows (fast: counted in)
    if (FAST && !p.dq_post && last_of_pair(p, b, hk, 4, THREADS)) convert_pair<8>(p, seq, hk, tid, THREADS);
    return;
  }
]],
  convert_range_text = "; after the last sequence, the rows after it and those before the first",
  convert_range = [[
  if (seq.b < p.batch) {
    convert_dq<LOADS>(p, seq, hk, 0, seq.seqlen_q, tid, threads);
  } else {
    const int first = min(max(((const int*)p.cu_seqlens_q)[0], 0), p.total_q);
    convert_dq<LOADS>(p, seq, hk, 0, p.total_q - seq.q0, tid, threads);
    convert_dq<LOADS>(p, seq, hk, -seq.q0, first - seq.q0, tid, threads);
  }]],
  clear_kv = [[
  if (m_first < m_end && n0 + BLOCK_N > seq.seqlen_k) {  // K and V rows past the sequence's keys
    zero_rows(k_tile, BOXES + V_BOXES, KV_BOX, seq.seqlen_k - n0, BLOCK_N, tid, CONSUMERS * 128);
    fence_async_shared();
    bar_sync(6, CONSUMERS * 128);
  }
]],
  -- the sequence in shared memory (the fast kernel's): kept by thread 0 at
  -- the start; PERSIST, a sequence beside each slot of a tile's index
  -- (announce_tile)
  seq_at = "  const u32 seq_kept = PERSIST ? tile_slot + 8 : dq_free + 8 * SETS * CONSUMERS + 8;  // 32 bytes a slot\n",
  seq_store = "    if (!PERSIST) seq.keep((int*)(smem + (seq_kept - smem_addr(smem))));\n",
  -- (with the group made each tile: held from the start, the causal
  -- 80-row kernels spilled it)
  seq_of_tile = [[
  seq_kept_at(seq, seq_kept + 32 * (it % 2));
  int heads_kv = p.heads_kv;
  asm volatile("" : "+r"(heads_kv));
  const int group = p.heads_q / heads_kv;
]],
  first_tile = [[
      const u32 first = tile_with_keys(p, blockIdx.x, tiles);  // and its sequence
      st_shared_u32(tile_slot, first);
      if (first < tiles) {
        int n_, hk_, b_;
        block_of<true>(p, first, n_, hk_, b_);
        Seq s;
        s.init(p, b_);
        seq_keep_at(s, seq_kept);
      }
]],
  producer_first = "PERSIST ? ld_shared_u32(tile_slot) : blockIdx.x",
  -- the consumers learn of a later tile once the load threads have its
  -- sequence: the first load thread keeps it beside the index (the end at
  -- once); decoded where the next index is taken, the producer spilled
  announce_next = "        if (next >= tiles) mbar_arrive(tile_full + 8 * ((it + 1) % 2));\n",
  announce_tile = [[
      if (it > 0) {
        if (pt == 0) {
          seq_keep_at(seq, seq_kept + 32 * (it % 2));
          mbar_arrive(tile_full + 8 * (it % 2));
        }
        bar_sync(8, STATS_THREADS);  // the load threads read it each step
      }
]],
  seq_out_walk = "  seq_kept_at(seq_out, seq_kept + 32 * (it % 2));\n",
  -- PERSIST: the kept sequence's reads and writes, and the next tile
  walk_source = [[
// the sequence kept at shared address `at`, read where used: its address
// opaque (held through the loops, the addresses spilled), so the loads stay
// after it, and left out where a field is not used
__device__ __forceinline__ void seq_kept_at(Seq& s, u32 at) {
  asm volatile("" : "+r"(at));
  int w[7];
#pragma unroll
  for (int i = 0; i < 7; ++i) asm("ld.shared.u32 %0, [%1];" : "=r"(w[i]) : "r"(at + 4 * i));
  s.kept(w);
}
__device__ __forceinline__ void seq_keep_at(const Seq& s, u32 at) {
  int w[7];
  s.keep(w);
#pragma unroll
  for (int i = 0; i < 7; ++i) st_shared_u32(at + 4 * i, (u32)w[i]);
}
// The first tile from `tile` on whose key block holds keys of its sequence.
// Past them, so is every later tile of its section (a packed call's
// sections hold one sequence's pairs: block_of), so the counter moves past
// the section at once. Of the sequence only its key rows are read.
__device__ u32 tile_with_keys(const fg_bwd_tma_params& p, u32 tile, u32 tiles) {
  const u32 section = (u32)p.section_heads * p.num_n_blocks;
  while (tile < tiles) {
    int n_block, hk, b;
    block_of<true>(p, tile, n_block, hk, b);
    Seq s;
    s.init(p, b);
    if (n_block * BLOCK_N < s.rows_k) break;
    const u32 end = (tile / section + 1) * section;
    if (end > gridDim.x) atomicMax((u32*)p.tile_next, end - gridDim.x);
    tile = gridDim.x + atomicAdd((u32*)p.tile_next, 1u);
  }
  return tile;
}
]],
  -- the sequence again each step: held through the loop, its lengths take
  -- registers the deterministic kernel's consumers do not have. The fast
  -- kernel reads it back from shared memory; decoded from the block index
  -- (divisions, then cu_seqlens' loads) it held up each step's start. The
  -- deterministic one decodes it (read back, its consumers spilled 4 bytes
  -- at 128 rows a step)
  step_seq = [[
    Seq seq;
    seq_kept_at(seq, seq_kept + 32 * (it % 2));
]],
  -- the load threads' sequence and place made each step (held through the
  -- steps, beside the tile's walk, they spilled)
  load_step = [[
  Seq seq;
  seq_kept_at(seq, seq_kept + 32 * (it % 2));
  u32 thread = threadIdx.x;
  asm volatile("" : "+r"(thread));
  const int pt = (int)thread - CONSUMERS * 128;
]],
  step_seq_decoded = [[
    Seq seq;
    {
      u32 bid = blockIdx.x;
      asm volatile("" : "+r"(bid));
      int n_, hk_, b_;
      block_of<FAST && !ORDERED>(p, bid, n_, hk_, b_);
      seq.init(p, b_);
    }
]],
  clear_q = [[
    if (i0 + BLOCK_M > seq.seqlen_q) {  // Q and dO rows past the sequence's queries
      zero_rows(q_rows, BOXES + V_BOXES, Q_BOX, seq.seqlen_q - i0, BLOCK_M, tid, CONSUMERS * 128);
      fence_async_shared();
      bar_sync(6, CONSUMERS * 128);
    }]],
  -- the key rows past the grid's key blocks (after the last sequence, where
  -- they outnumber the longest sequence's) are written zero by the thread
  -- blocks num_n_blocks before them
  out_blocks = "  for (int nb = n_out; nb * BLOCK_N < seq_out.rows_k; nb += p.num_n_blocks) {",
  out_blocks_end = [[
#pragma unroll
  for (int i = 0; i < V_COLS / 2; ++i) acc_dv[i] = 0.f;
#pragma unroll
  for (int i = 0; i < K_COLS / 2; ++i) acc_dk[i] = 0.f;
  }]],
}
local dense = { short_return = "", clear_kv = "", seq_at = "", seq_store = "", step_seq = "", step_seq_decoded = "",
                seq_of_tile = "  seq.init(p, b);\n", first_tile = "      st_shared_u32(tile_slot, blockIdx.x);  // the first tile\n",
                producer_first = "blockIdx.x", seq_out_walk = "  seq_out.init(p, b_out);\n",
                announce_next = "        mbar_arrive(tile_full + 8 * ((it + 1) % 2));\n", announce_tile = "",
                walk_source = "__device__ __forceinline__ u32 tile_with_keys(const fg_bwd_tma_params&, u32 tile, u32) { return tile; }\n",
                convert_range_text = "", convert_range = "  convert_dq<LOADS>(p, seq, hk, 0, seq.seqlen_q, tid, threads);",
                clear_q = "", out_blocks = "  {\n  const int nb = n_out;", out_blocks_end = "  }" }

-- dK and dV from registers, pairs of columns a thread (a packed call's
-- thread block also writes zeros for the key rows its sequence has past
-- the grid's key blocks: out_blocks); store_width: one width's, filled by
-- widths() for dK and for dV.
local store_registers = [[
  if (PERSIST) {  // both consumers past their last product: the next tile's K and V may load
    bar_sync(7, CONSUMERS * 128);
    if (tid == 0) mbar_arrive(kv_free);
  }
${out_blocks}
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int j = nb * BLOCK_N + key_wg + warp_row + g + 8 * r;
    if (j < seq_out.rows_k) {
${store_widths}    }
  }
${out_blocks_end}
]]
local store_width = [[
      {
        u16* out = (u16*)p.${x} + seq_out.k_at(p.${x}_sb, p.${x}_ss, j) + hk_out * p.${x}_sh;
#pragma unroll
        for (int dn = 0; dn < ${cols} / 8; ++dn) {
          const int col = ${col}(wg, dn * 8) + 2 * t;
          const float x0 = ${acc}[4 * dn + 2 * r] * ${scale}, x1 = ${acc}[4 * dn + 2 * r + 1] * ${scale};
${store}
        }
      }
]]
-- A piece for dK, then for dV: their tensors, accumulators, columns, scales
-- and (fields) more of each.
local function widths(piece, fields)
  local out = {}
  for i, w in ipairs({ { x = "dk", acc = "acc_dk", cols = "K_COLS", col = "k_col", scale = "p.softmax_scale" },
                       { x = "dv", acc = "acc_dv", cols = "V_COLS", col = "v_col", scale = "p.out_scale" } }) do
    for k, v in pairs(fields or {}) do w[k] = v[i] end
    out[#out + 1] = text.fill(piece, w)
  end
  return table.concat(out)
end

-- dK and dV of a dense call through shared memory, stored by their tensor
-- maps in boxes of 64 keys x 64 columns, at head dims that are multiples of
-- 8 (the copy engine writes whole 16-byte chunks), in the fast kernel (the
-- deterministic one's consumers spill with it): the stores from registers
-- (4 bytes a thread, half of each 32-byte sector) held the thread block's
-- end behind the store queue, and a bulk copy a row cost a loop over the
-- lanes (hopper-backward-notes steps 31, 32). Packed sequences keep the
-- stores from registers: a box would run on into the next sequence's rows.
-- dK is staged over K and dV over V (free once both consumers are past
-- their last step), swizzled as the copy engine reads them: 16-byte chunk c
-- of a box's row r at chunk c ^ (r % 8).
local stage_width = [[
#pragma unroll
      for (int dn = 0; dn < ${cols} / 8; ++dn) {
        const int col = ${col}(wg, dn * 8);
        st_shared_u32(${row} + (col / 64) * 8192 + ((((col % 64) / 8) ^ g) << 4),
                      pack2(${acc}[4 * dn + 2 * r] * ${scale}, ${acc}[4 * dn + 2 * r + 1] * ${scale}));
      }
]]
local store_boxes = [[
  {
    // box (key box kb, column box cb) at kb * boxes + cb, 8 KB each; PERSIST:
    // where the dS tiles and dQ's staging are, so the next tile's K and V
    // may load once both consumers are here
    const u32 out_k = PERSIST ? ds_tiles : k_tile, out_v = out_k + BOXES * KV_BOX;
    bar_sync(7, CONSUMERS * 128);
    if (PERSIST && tid == 0) mbar_arrive(kv_free);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = key_wg + warp_row + g + 8 * r;  // row % 8 == g
      const u32 k_row = out_k + (row / 64) * BOXES * 8192 + (row % 64) * 128 + 4 * t;
      const u32 v_row = out_v + (row / 64) * V_BOXES * 8192 + (row % 64) * 128 + 4 * t;
${stage_widths}    }
    fence_async_shared();
    bar_sync(7, CONSUMERS * 128);
    // one thread stores every box; keys past seqlen_k and columns past the
    // head dims are not written
    if (tid == 0) {
      for (int kb = 0; kb < BLOCK_N / 64; ++kb) {
        const int key = seq_out.map_k(n_out * BLOCK_N + kb * 64), batch = seq_out.map_b();
        for (int cb = 0; cb < BOXES; ++cb)
          tma_store_4d(&p.dk_map, out_k + (kb * BOXES + cb) * 8192, 64 * cb, key, hk_out, batch);
        for (int cb = 0; cb < V_BOXES; ++cb)
          tma_store_4d(&p.dv_map, out_v + (kb * V_BOXES + cb) * 8192, 64 * cb, key, hk_out, batch);
      }
      bulk_commit();
      bulk_wait_read();
    }
    if (PERSIST) bar_sync(7, CONSUMERS * 128);  // the boxes read: the next tile's dS and dQ may go there
  }
]]

return function(p)
  if p.arch ~= 90 then error("the sm_90a backward is built for sm_90 only") end
  local split = p.split == 1
  -- 128 queries a step: the consumers' dQ by rows, one box of each width,
  -- no dropout (its keep words are laid out for 64)
  local by_rows = p.block_m == 128
  -- 80 queries a step: dQ transposed, each consumer's box of columns by
  -- every query; 32 (three boxes of Q and K): likewise, two boxes on
  -- consumer 0
  local dq_t = p.block_m == 80
  -- 32 (three boxes of Q and K): dQ = dS·K once for a pair of steps (query
  -- blocks 2u and 2u + 1, 64 rows), each consumer 96 columns
  local pairs = p.block_m == 32
  if pairs and (p.dq_sets ~= 1 or p.sparsity ~= "none") then
    error("dQ once a pair of steps takes one staging set and no sparsity (its steps are consecutive query blocks)")
  end
  if not (p.block_m == 64 or by_rows and not split and p.boxes == 1 and p.v_boxes == 1 and not p.dropout
          or p.block_m == 80 and not split and p.boxes == p.consumers and p.v_boxes <= p.consumers and not p.dropout
          or p.block_m == 32 and not split and p.boxes == 3 and p.v_boxes <= 2 and not p.dropout)
      or p.block_n ~= (split and 64 or 64 * p.consumers) then
    error("the sm_90a backward takes 64 queries a step (128 with one box and no dropout, 80 with a box of "
          .. "Q and K per consumer and no dropout, 32 with three boxes of Q and K, two of V, and no dropout) "
          .. "and 64 keys per consumer (split: per block)")
  end
  if not split and p.boxes > p.consumers and p.block_m ~= 32 then
    error("dQ takes one box of head-dim columns per consumer (two at 32 rows a step)")
  end
  if split and p.consumers ~= 2 then error("the split backward takes two consumers") end
  if p.k_cols ~= (split and 32 or 64) * p.boxes or p.v_cols ~= (split and 32 or 64) * p.v_boxes then
    error("dK's and dV's columns are a consumer's share of the boxes")
  end
  p.dq_unit = pairs and 2 * p.block_m or p.block_m
  if p.dq_rows * (by_rows and p.consumers or 1) ~= p.dq_unit then error("a consumer's dQ rows are the step's share") end
  p.dq_cols = (split or by_rows) and p.k_cols or dq_t and 64 or p.k_cols // p.consumers
  p.dq_by_rows = by_rows and 1 or 0
  p.dq_t = dq_t and 1 or 0
  p.dq_pairs = pairs and 1 or 0
  if pairs and p.dq_planes ~= 1 then error("a pair's reductions take one plane's turns") end
  p.plane_batches = p.varlen and "1" or "p.batch"
  p.ds_box = (dq_t or pairs) and "DQ_UNIT" or "BLOCK_N"
  p.ds_box_text = (dq_t or pairs) and "DQ_UNIT queries x 64 keys" or "BLOCK_N keys x 64 queries"
  p.split_flag = split and 1 or 0
  p.keep_bytes = p.dropout and "BLOCK_N * BLOCK_M / 8" or "0"
  p.dropout_flag = p.dropout and 1 or 0
  local name = "fg_bwd_" .. p.target_tag .. "_" .. p.spec_name .. "_m" .. p.block_m .. "n" .. p.block_n
               .. "s" .. p.stages
  local banner = text.fill([[
// ${name}
// Generated by flashgen ${version}: backward attention, TMA + wgmma.
// spec: ${spec_name} (dtype ${dtype}, head dim ${head_dim}, mask ${mask}, dropout ${dropout},
//       sparsity ${sparsity}${value})
// plan: Br=${block_m} Bc=${block_n} (${consumers} consumer warpgroups) stages=${stages}
//       head dim padded to ${head_dim_padded} (${boxes} boxes), shared memory ${smem_bytes} bytes;
//       registers ${producer_registers} (producer), ${consumer_registers} (consumers); deterministic
//       ${det_producer_registers}, ${det_consumer_registers}; target ${target}
]], {
    name = name, version = p.generator_version, spec_name = p.spec_name, dtype = p.dtype,
    head_dim = p.head_dim, value = width.banner(p), mask = p.mask, dropout = p.dropout and "on" or "off",
    sparsity = p.sparsity, block_m = p.block_m, block_n = p.block_n, consumers = p.consumers,
    stages = p.stages, head_dim_padded = p.head_dim_padded, boxes = p.boxes,
    smem_bytes = p.smem_bytes, producer_registers = p.producer_registers,
    consumer_registers = p.consumer_registers, det_producer_registers = p.det_producer_registers,
    det_consumer_registers = p.det_consumer_registers, target = p.target })
  local constants = text.fill([[
#define HEAD_DIM ${head_dim}
#define HEAD_DIM_PADDED ${head_dim_padded}
#define HEAD_DIM_V ${head_dim_v}                         // the value head dim (V, dO, dV)
#define HEAD_DIM_V_PADDED ${head_dim_v_padded}
#define BOXES ${boxes}                                  // Q's and K's boxes of 64 columns
#define V_BOXES ${v_boxes}                                // V's and dO's
#define K_COLS ${k_cols}                               // dK's columns a consumer holds
#define V_COLS ${v_cols}                               // dV's
#define SPLIT ${split_flag}                           // consumers share the keys, split queries and columns
#define S_COLS ${s_cols}                              // queries of a consumer's Sᵀ and dPᵀ
#define BLOCK_M ${block_m}
#define BLOCK_N ${block_n}
#define CONSUMERS ${consumers}
#define STAGES ${stages}
#define DQ_SETS ${dq_sets}                             // dQ's staging sets
#define DROPOUT ${dropout_flag}
#define THREADS ${threads}
#define Q_BOX (BLOCK_M * 128)                          // bytes of one Q or dO box: BLOCK_M rows x 64 columns
#define KV_BOX (BLOCK_N * 128)                         // bytes of one K or V box
#define STAGE_BYTES ((BOXES + V_BOXES) * Q_BOX)       // Q and dO
#define STATS_BYTES (8 * BLOCK_M + ${keep_bytes})  // lse·log2 e and D; keep words
#define DQ_T ${dq_t}                                   // dQ transposed (dQᵀ = Kᵀ·dSᵀ)
#define DQ_PAIRS ${dq_pairs}                               // dQ = dS·K once a pair of steps, over both
#define DQ_PLANES ${dq_planes}                              // the deterministic schedule's dQ accumulators
#define PLANE_BATCHES ${plane_batches}                      // a plane's batch rows in dQ's map
#define DQ_UNIT ${dq_unit}                              // query rows of a dS tile and of dQ's staging
#define DS_BOX (${ds_box} * 128)                         // a box of the dS tile: ${ds_box_text}
#define DS_BYTES (BLOCK_N * 2 * DQ_UNIT)               // dS: BLOCK_N keys x DQ_UNIT queries
#define DQ_BY_ROWS ${dq_by_rows}                         // consumers take dQ's rows by halves, not its columns
#define DQ_ROWS ${dq_rows}                              // dQ's rows per consumer
#define DQ_COLS ${dq_cols}                              // and columns
#define DQ_BOX (DQ_ROWS * DQ_COLS * 4)                 // dQ staged: DQ_ROWS queries x DQ_COLS fp32
#define DQ_SET_BYTES (BOXES * DQ_UNIT * 256)           // a set of dQ's staging: every column of DQ_UNIT rows
#define DQ_ACC (DQ_ROWS * DQ_COLS / 128)               // a consumer thread's dQ accumulators
#define DQ_MAP_BOX (DQ_ROWS * 128)                     // one box of the accumulator's map: 32 columns
#define FG_POS_INF __int_as_float(0x7f800000)
]], p)
  -- the wgmma forms, each once: from shared memory by n, A from registers
  local forms, form_source = {}, {}
  local function form(n, a_in_registers)
    local key = n .. (a_in_registers and "r" or "")
    if not forms[key] then
      local name, code = sm90a.wgmma(n, p.dtype, a_in_registers)
      forms[key] = name
      form_source[#form_source + 1] = code
    end
    return forms[key]
  end
  local wgmma_t = form(p.s_cols)
  -- not split: dK and dV from registers, dQ from shared memory; split, each
  -- width's share as a first piece and the rest
  local kv_pieces = {}
  for _, w in ipairs({ { "k", "K_COLS", p.k_cols, "Q and K", "Q or K" }, { "v", "V_COLS", p.v_cols, "V and dO", "dO" } }) do
    local which, macro, cols, what, b = w[1], w[2], w[3], w[4], w[5]
    if split then
      local first, rest = math.min(64, cols), math.max(cols - 64, 0)
      kv_pieces[#kv_pieces + 1] = text.fill(gemm_share, {
        cols = macro, what = what, first = first, rest = rest, col = which .. "_col", name = "gemm_share_" .. which,
        rest_text = rest > 0 and (", then " .. rest .. " from column 128 + " .. rest .. "·wg") or "",
        wgmma_first = form(first),
        rest_gemm = rest > 0 and text.fill(rest_gemm, { wgmma_rest = form(rest), first = first }) or "" })
    else
      kv_pieces[#kv_pieces + 1] = text.fill(gemm_kv, { cols = macro, b = b, name = "gemm_d" .. which,
                                                       wgmma = form(cols, true) })
    end
  end
  local wgmma_dq = not split and form(dq_t and p.block_m or pairs and 64 or p.dq_cols) or nil
  local wgmma_dq32 = pairs and form(32) or nil
  -- Sᵀ seen as masks see a tile: queries as rows, keys as columns
  local frag_st = fragment.wgmma_m64_transposed({ array = "acc_s", n_tiles = "S_COLS / 8" })
  local row0 = split and "i0 + q0" or "i0"
  local apply_mask = mask.apply(p.mask, frag_st, {
    params = "p", seq = "seq", row0 = row0, key0 = "n0 + key_wg + warp_row", block_row0 = "i0",
    block_key0 = "n0", full = "steps.full()", predicate = logits.mask_predicate(p, { params = "p", seq = "seq", batch = "seq.b", head = "h" }) })
  local per_call = p.varlen and packed or dense
  -- the logits of element e: key n0 + key_wg + warp_row + g + 8r, query
  -- i0 + 8nt + 2t + c
  local logits_setup = ""
  if p.alibi then
    logits_setup = "    const float slope = alibi_slope(p, seq.b, h);\n"
        .. "    const float d0 = (float)(n0 + key_wg + warp_row + g - (" .. row0 .. " + 2 * t + seq.diag_offset));\n"
  end
  local elem_q, elem_k = logits.positions("p", row0 .. " + 8 * nt + 2 * t + c", "n0 + key_wg + warp_row + g + 8 * r")
  local at = { b = "seq.b", h = "h", q = elem_q, k = elem_k, seqlen_q = "seq.seqlen_q", seqlen_k = "seq.seqlen_k" }
  -- a score modifier's terms: the two keys' once per step; a query pair's
  -- (c) at the top of its nt, with the diagonal pair it meets first (nt + 1;
  -- r = 1 meets pair nt, met the nt before): two diagonals live, not all
  -- (held, they spilled at d128)
  local row_terms, terms = "", nil
  if p.score_mod then
    local heads, diag
    _, heads, terms, diag = logits.tile_terms("score", frag_st, {
      params = "p", seq = "seq", batch = "seq.b", head = "h", row0 = row0, key0 = "n0 + key_wg + warp_row",
      slots = { row = "c", key = "r", diag = "(nt - r + 1) * 2 + c" } })
    logits_setup = logits_setup .. text.indent_code(heads.mt .. diag.decl .. diag.fill(0) .. "\n" .. diag.fill(1) .. "\n", 4)
    row_terms = text.indent_code(heads.nt .. "#pragma unroll\nfor (int c = 0; c < 2; ++c) "
                                 .. diag.fill("(nt + 1) * 2 + c") .. "\n", 6)
  end
  local element = (logits.has_derivative(p) and "float dt;\n" or "")
      .. logits.element(p, "acc_s[e]", { params = "p", slope = "slope", d = "d0 + (float)(8 * r - (8 * nt + c))",
                                         at = at, terms = terms }, logits.has_derivative(p) and "dt" or nil)
  local aux_grad = logits.aux_grad(p, "p", "acc_dp[e]", "sv", at)
  -- lse·log2 e and D of the stage's queries: plain loads in the 80-row
  -- kernels (after the stage's wait the compiler may issue them together:
  -- +1-2% at d = 128), ordered ones elsewhere (plain measured 3% slower at
  -- d = 64; hopper-backward-notes step 17)
  local stats_base = (dq_t or pairs) and "  const float* stats_f = (const float*)(smem + (stats - smem_addr(smem)));\n" or ""
  local stats_at = (dq_t or pairs) and "    const float* lse_f = stats_f + s * (STATS_BYTES / 4);\n"
                            .. "    const float* d_f = lse_f + BLOCK_M;\n"
                        or "    const u32 lse_at = stats + s * STATS_BYTES, d_at = lse_at + 4 * BLOCK_M;\n"
  local function stat(which, q)
    return (dq_t or pairs) and which .. "_f[" .. q .. "]" or "ld_shared_f32(" .. which .. "_at + 4 * (" .. q .. "))"
  end
  -- without a mask or sparsity the deterministic turns are ranks, and may
  -- wrap round
  local wrap = p.mask == "none" and p.sparsity == "none" and not p.mask_mod
  -- a deterministic kernel, with dropout where the plan says its load
  -- threads' draws fit (else the call goes to the mma.sync backward)
  local det = not p.dropout or p.det_dropout == 1
  -- the deterministic kernel as the fast one's steps, their dQ added in
  -- turn by the deterministic kernel's reduction thread, where the fast
  -- kernel's code serves (not packed, unsplit, a block's dQ a step, without dropout)
  local ordered = p.det_ordered == 1
  -- the deterministic consumers with dropout under a mask, unsplit and
  -- wider than a box (d = 65..128): their steps' bounds in shared memory
  -- (m_first and m_end held through the loop took the two registers they
  -- lacked: 8 bytes spilled)
  local function main_kernel(fast, ordered)
    local det_order = not fast or ordered  -- the deterministic schedule's steps
    local shared_steps = not fast and p.dropout and not wrap and p.sparsity == "none" and not split
                         and p.boxes + p.v_boxes > 2
    -- each key block's steps from its own share of the query blocks round
    -- (the deterministic schedule's; the call's p.wrap decides at run time)
    local wrapped = wrap and det_order
    local m_start = wrapped and ", m_start" or ""
    local two_pass = fast and not p.dropout and not logits.has_derivative(p) and not p.aux_grad
    local stored_by_boxes = fast and not p.varlen and p.head_dim % 8 == 0 and p.head_dim_v % 8 == 0
    local rows_at_first = not ordered and dq_t and p.mask ~= "none" and p.sparsity == "none" and not p.mask_mod
                          and "true" or "false"
    local walk = fast and not ordered and p.walk == 1
    if walk and not (stored_by_boxes or p.varlen) then
      error("the fast kernel's blocks walk tiles where it stores dK and dV by boxes, or packed")
    end
    return text.fill(kernel, {
      walk = walk and "true" or "false",
      producer_tile_decode = walk and text.fill(tile_decode, { rows_at_first = rows_at_first, seq_of_tile = dense.seq_of_tile }) or "",
      consumer_tile_decode = walk and text.fill(tile_decode, { rows_at_first = rows_at_first, seq_of_tile = per_call.seq_of_tile }) or "",
      announce_tile = walk and per_call.announce_tile or "", announce_next = per_call.announce_next,
      first_tile = walk and per_call.first_tile or "", producer_first = per_call.producer_first,
      load_seq = walk and per_call.load_step and text.indent_code(per_call.load_step, 8) or "",
      late_seq = walk and text.indent_code(per_call.step_seq, 6) or "",
      seq_out_of = walk and per_call.seq_out_walk or "  seq_out.init(p, b_out);\n",
      pending = two_pass and 1 or 0, hold_dp = two_pass and "" or "    hold<S_COLS / 2>(acc_dp);\n",
      dd = two_pass and "" or ", dd = " .. stat("d", "q"),
      ds_pass = two_pass and text.fill(ds_pass, { d_pair = "make_float2(" .. stat("d", "q0 + 8 * nt + 2 * t") .. ", "
                                                              .. stat("d", "q0 + 8 * nt + 2 * t + 1") .. ")" }) or "",
      stats_base = stats_base, stats_at = stats_at, lse_q = stat("lse", "q"),
      wrap_start = wrapped and not ordered and wrap_start or "", m_start = m_start,
      role_bounds = ordered and role_bounds .. (wrap and wrap_start or "") or "",
      taken = wrapped and ", st" or "",
      -- (ORDERED: the reduction thread's, given the staged dQ)
      reduce_staged = ordered and "{}" or "reduce_dq(&p.dq_map, staged, wg, dq_row, dq_h, seq.map_b());",
      bounds_at = (shared_steps or ordered) and bounds_at or "",
      bounds_store = (shared_steps or ordered) and bounds_store or "",
      consumer_steps = shared_steps and consumer_shared_steps
        or "  Steps steps;\n  steps.start(p, seq.b, hk * group, group, n0, m_first, m_end" .. m_start .. ");",
      turn_values = text.indent_code(text.fill(wrap and turn_ranks or turn_chain, { m = "steps.m", n = "n", pass = "pass_value" }), 10),
      turn_values_high = text.indent_code(text.fill(wrap and turn_ranks or turn_chain, { m = "steps.m", n = "n_block", pass = "pass_high" }), 10),
      turn_values_low = text.indent_code(text.fill(wrap and turn_ranks or turn_chain, { m = "steps.m - 1", n = "n_block", pass = "pass_low" }), 12),
      pair_of = pairs and text.indent_code(text.fill(pair_of, { first = wrap and not fast and "m_start" or "" }), 4) or "",
      pair_of_reduce = pairs and text.indent_code(text.fill(pair_of, { first = wrap and not fast and "m_start" or "" }), 8) or "",
      short_return = walk and "" or per_call.short_return, clear_kv = per_call.clear_kv,
      step_seq = fast and per_call.step_seq or per_call.step_seq_decoded,
      seq_at = fast and per_call.seq_at or "", seq_store = fast and per_call.seq_store or "",
      clear_q = per_call.clear_q,
      stored_by_boxes = stored_by_boxes and "true" or "false",
      store_out = stored_by_boxes
        and text.fill(store_boxes, { stage_widths = widths(stage_width, { row = { "k_row", "v_row" } }) })
        or text.fill(store_registers, { out_blocks = per_call.out_blocks, out_blocks_end = per_call.out_blocks_end,
          store_widths = widths(store_width, { store = { text.indent(epilogue.output_store(p), 10),
                                                         text.indent(epilogue.output_store(p, width.v(p)), 10) } }) }),
      load_keep = p.dropout and load_keep or "",
      combine = text.indent(two_pass and "acc_s[e] = pv;" or p.dropout and combine_dropout or combine_plain, 10),
      logits_setup = logits_setup, row_terms = row_terms,
      to_log2 = logits.to_log2(p, "p"),
      element = text.indent(element, 10),
      derivative = (p.aux_grad and "\n          " .. aux_grad or "") .. (logits.has_derivative(p)
        and "\n          acc_dp[e] *= dt;  // dSᵀ with respect to s" or ""),
      name = fast and not ordered and name or name .. "_det", fast = fast and "true" or "false",
      ordered = ordered and "true" or "false", packed = p.varlen and "true" or "false",
      rows_at_first = rows_at_first,
      -- the deterministic kernel's 4-byte stores where it draws dropout's
      -- keep words (slower with stmatrix at d 64) or is packed (its consumers
      -- spilled 4 bytes with it at d 32 and 64)
      ds_stmatrix = (fast or not (p.dropout or p.varlen)) and "true" or "false",
      producer_registers = fast and not ordered and p.producer_registers or p.det_producer_registers,
      consumer_registers = fast and not ordered and p.consumer_registers or p.det_consumer_registers,
      apply_mask = text.indent(apply_mask, 4) })
  end
  local rows = rows_kernel({ name = name, head_dim = p.head_dim, varlen = p.varlen,
                            params = "fg_bwd_tma_params", width = width.v(p), start = "grid_let_next_start();" })
  -- dQ's conversion after the main kernel (p.dq_post: the deterministic
  -- schedule, and fast calls whose pairs' rows are long)
  local dq = dq_kernel({ name = name, head_dim = p.head_dim, head_dim_padded = p.head_dim_padded,
                         varlen = p.varlen, params = "fg_bwd_tma_params", gate = "dq_post",
                         start = "grid_wait_prior();" })
  local isa = isa_for(80)
  local source = table.concat({
    banner, constants, device.source, isa.prelude(p.dtype), sm90a.source, p.params_struct,
    device.to_float(p.dtype), logits.device(p), p.dropout and dropout.device or "",
    p.dropout and dropout.transposed or "",
    table.concat(form_source, "\n"),
    text.fill(pieces, { wgmma_t = wgmma_t, wgmma_dq = wgmma_dq or "", wgmma_dq32 = wgmma_dq32 or "",
                        gemm_kv = split and "" or table.concat(kv_pieces, "\n"),
                        gemm_share = split and table.concat(kv_pieces, "\n") or "" }),
    p.dropout and keep_tasks or "", sequence.source(p), per_call.walk_source, sparse.query_tiles(p),
    p.dropout and p.sparsity == "none" and sparse.shared_steps or "", sparse.next_key_block(p),
    text.fill(query_blocks, { query_range = text.indent(mask.query_range(p.mask, "seq"), 2) }),
    rows.source, dq.source,
    text.fill(pair_done, { convert_range_text = per_call.convert_range_text, convert_range = per_call.convert_range }),
    wrap and turn_rank_source or "", main_kernel(true),
    det and main_kernel(ordered, ordered) or "",
  }, "\n")
  -- D first, then the main kernel of the call's schedule (the other has no
  -- thread blocks), one thread block per (key block, key/value head, batch
  -- or packed sequence and the rows after them) as it decodes blockIdx.x,
  -- in the fast one the last of each (key/value head, sequence) pair
  -- converting its dQ, unless the kernel after it does (p.dq_post)
  local fast = { entry = name, threads = p.threads, smem = p.fast_smem_bytes, programmatic = 1,
                 grid = { { "fast_grid" } } }
  local det_launch = { entry = name .. "_det", threads = p.threads, smem = p.smem_bytes, programmatic = 1,
                       grid = { { "det_n_blocks" }, { "heads_kv" }, { "sequences" } } }
  local launches = det and { rows.launch, fast, det_launch, dq.launch } or { rows.launch, fast, dq.launch }
  if p.sinks then
    local sinks = logits.sinks_kernel({ name = name, params = "fg_bwd_tma_params", varlen = p.varlen })
    source = source .. "\n" .. sinks.source
    launches[#launches + 1] = sinks.launch
  end
  return { source = source, name = name, launches = launches }
end
