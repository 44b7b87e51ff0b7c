-- The Hopper forward (sm_90a): O = softmax(Q·Kᵀ·scale)·V and the row
-- log-sum-exp over query blocks of (head, batch), the last ones first. A
-- thread block walks units of them (lib_sparse.forward_block): its own, and
-- where the plan walks (p.walk: fewer thread blocks launched than units),
-- every p.blocks-th after it, so a block's copies go out while the one
-- before it finishes and no thread block starts again. CONSUMERS + 1
-- warpgroups:
--   producer   gives its registers up (setmaxnreg); a warp's first lane
--              issues the bulk tensor copies (TMA, 128-byte swizzled boxes
--              of 64 columns): Q once a query block, then K and V, key tile
--              by key tile, through a ring of STAGES buffers that runs on
--              from block to block; K and V each have a "full" mbarrier
--              (bytes arrived) and an "empty" one (every consumer thread is
--              done with it), so K's half is refilled once S is computed;
--   consumers  take the registers; each owns 64 query rows. For key tile j
--              a consumer issues S_j = Q·K_jᵀ (wgmma from shared memory) and
--              O += P_{j-1}·V_{j-1} (wgmma with P in registers, V read
--              transposed) together, masks S_j and runs its online softmax
--              (base 2) while O's wgmmas run, then rescales O and packs P_j
--              (dropout applied) into the A registers of the next P·V;
--              dropout's draws are made a 32-key stretch at a time as P
--              is packed, so none are held while the GEMMs run. With three
--              consumers, or under a mask, each stops at the last key tile
--              its own rows see (rows past the end see none; a causal
--              diagonal cuts the first's short), then only takes its turns
--              and frees stages.
-- Head dims: QK steps over ceil(d/16) 16-wide slices of the boxes; O holds
-- whole boxes (V_COLS columns, TMA fills columns past d with zeros) and
-- stores the first d, by TMA where d is a multiple of 8. A value head dim of
-- its own (lib_width) gives V and O their own boxes (V_BOXES): a stage holds
-- K's boxes then V's, and O is staged for its store in Q's shared memory,
-- which holds the more boxes of the two (O_BOXES), or where the plan walks
-- in V_BOXES of its own, so the next block's Q comes in while O is stored.
-- Rows and keys past
-- the ends are zeros from TMA too, masked like any key past seqlen_k.
-- Over a KV cache (kv_cache: chunked prefill, many queries a step) an
-- append kernel first copies the call's new rows into the cache
-- (lib_kv_cache); two warps of the producer then read K and V through maps
-- over the cache, over pages a lane a run of gcd(page, Bc) rows (a multiple
-- of 8: whole 1024-byte swizzle periods, never across a page), and each
-- sequence's keys end where its cached and new rows do (lib_seq); the V
-- rows past them are cleared as below.
-- Packed sequences (varlen) are read through maps over the packed tensors,
-- which run on into the next sequence: its keys are masked like any past
-- seqlen_k, its values cleared before P·V reads them (zero_rows), and O
-- rows of a warpgroup that reaches past the sequence are stored directly.
local text = import("lib_text")
local device = import("lib_device")
local fragment = import("lib_fragment")
local mask = import("lib_mask")
local softmax = import("lib_softmax")
local logits = import("lib_logits")
local dropout = import("lib_dropout")
local sparse = import("lib_sparse")
local sequence = import("lib_seq")
local epilogue = import("lib_epilogue")
local width = import("lib_width")
local kv_cache = import("lib_kv_cache")
local isa_for = import("isa")
local sm90a = import("isa_sm90a")

local pieces = [[
// K or V (map) of the key tile at map row n0 into a stage's half: BOXES
// boxes, one barrier (a walking producer keeps the loop rolled: unrolled,
// its few registers spilled).
__device__ __forceinline__ void load_tile(const void* map, u32 dst, u32 bar, int n0, int hk, int b) {
  mbar_arrive_expect(bar, BOXES * KV_BOX);
${box_unroll}
  for (int box = 0; box < BOXES; ++box) tma_load_4d(dst + box * KV_BOX, map, bar, 64 * box, n0, hk, b);
}
${load_tile_v}
// The consumers take turns at issuing their wgmmas, in warpgroup order: a
// warpgroup waits on named barrier 1 + wg (its own 128 threads and the 128
// arrivals of the one before it), issues, and lets the next one go. So one
// warpgroup's softmax runs while the other's GEMMs do, instead of both
// waiting on GEMMs issued together.
__device__ __forceinline__ void turn_wait(int wg) {
#if TURNS
  asm volatile("bar.sync %0, 256;\n" ::"r"(1 + wg) : "memory");
#endif
}
__device__ __forceinline__ void turn_pass(int wg) {
#if TURNS
  asm volatile("bar.arrive %0, 256;\n" ::"r"(1 + (wg + 1) % CONSUMERS) : "memory");
#endif
}

// An address the compiler cannot see through: where a thread block walks,
// Q's descriptors made from it once a query block, not once and kept through
// the walk (they spilled); elsewhere Q's address is used as it is (1% faster
// at d 128 causal).
__device__ __forceinline__ u32 opaque(u32 x) {
  asm volatile("" : "+r"(x));
  return x;
}

// Where Q and K are two boxes wide (d 65..128) a tile's descriptors are
// built once and moved on by desc_at for each slice: 2-3% faster at d 128.
// d 64 and 256 measured 1-6% slower that way, so they build each slice's.
// At three boxes (d 129..192) this and the warp-uniform warpgroup index
// below are taken without dropout only: 2.5% faster at 192/128; with
// dropout 8-10% slower there (both) and 10% at d 160 causal (the index
// alone) (hopper-notes steps 19, 44, 45).
#define UNIFORM_AT_THREE ${uniform_at_three}
#define DESC_ONCE (BOXES == 2 || (BOXES == 3 && UNIFORM_AT_THREE))

// Where Q and K are two boxes wide (d 65..128) a step waits for the next K
// and this V while O's products run, off the path from one issue of the
// products to the next: 1-3% faster at d 96 and 128. Elsewhere it waits at
// the step's top: d 64 measured 1% slower the other way, d 256 2-3% and
// 192/128 with dropout 3-6% (hopper-notes step 24).
#define WAIT_BESIDE_O (BOXES == 2)

// S = Q·Kᵀ (64 x BLOCK_N) for a warpgroup's 64 rows: 16-wide slices of the
// head dim, four per box. Issued, not waited for.
__device__ __forceinline__ void s_gemm(float* sc, u32 q_rows, u32 k_tile) {
  const u64 dq0 = smem_desc_sw128(q_rows, 16, 1024), dk0 = smem_desc_sw128(k_tile, 16, 1024);
#pragma unroll
  for (int ks = 0; ks < HEAD_DIM_PADDED / 16; ++ks) {
    const u32 at = 32 * (ks % 4);  // the slice's 32 bytes within its 128-byte rows
    const u32 q_at = (ks / 4) * Q_BOX + at, k_at = (ks / 4) * KV_BOX + at;
    const u64 dq = DESC_ONCE ? desc_at(dq0, q_at) : smem_desc_sw128(q_rows + q_at, 16, 1024);
    const u64 dk = DESC_ONCE ? desc_at(dk0, k_at) : smem_desc_sw128(k_tile + k_at, 16, 1024);
    ${wgmma_s}<0, 0>(sc, dq, dk, ks > 0);
  }
}

// O += P·V (64 x V_COLS), 16 keys at a time; V is read MN-major, its boxes
// KV_BOX apart. Issued, not waited for.
__device__ __forceinline__ void pv_gemm(float* o, const u32* pk, u32 v_tile) {
  const u64 dv0 = smem_desc_sw128(v_tile, KV_BOX, 1024);
#pragma unroll
  for (int kc = 0; kc < BLOCK_N / 16; ++kc) {
    const u64 dv = DESC_ONCE ? desc_at(dv0, 2048 * kc) : smem_desc_sw128(v_tile + 2048 * kc, KV_BOX, 1024);
    ${wgmma_o}<1>(o, pk + 4 * kc, dv, 1);
  }
}
]]

-- K or V of a key tile from a KV cache: the producer warp's lane l loads
-- keys l * rows .. from row `row` of `unit` (a page of the pool, or the
-- sequence), rows per load gcd(page, Bc) or the whole tile's
local load_cache_tile = [[
// K or V (map) of a key tile from the cache into a stage's half: NBOXES
// boxes a load; lane l's load of `rows` keys at row l * rows of the tile
// comes from row `row` of `unit` (a page, or the sequence), one barrier.
template <int NBOXES>
__device__ __forceinline__ void load_cache_tile(const void* map, u32 dst, u32 bar, int lane,
                                                int rows, int unit, int row, int hk) {
  if (lane == 0) mbar_arrive_expect(bar, NBOXES * KV_BOX);
  __syncwarp();
  if (lane * rows < BLOCK_N)
#pragma unroll
    for (int box = 0; box < NBOXES; ++box)
      tma_load_4d(dst + box * KV_BOX + lane * rows * 128, map, bar, 64 * box, row, hk, unit);
}
]]

-- V where its boxes are not K's (a value head dim of its own)
local load_tile_v = [[
__device__ __forceinline__ void load_tile_v(const void* map, u32 dst, u32 bar, int n0, int hk, int b) {
  mbar_arrive_expect(bar, V_BOXES * KV_BOX);
${box_unroll}
  for (int box = 0; box < V_BOXES; ++box) tma_load_4d(dst + box * KV_BOX, map, bar, 64 * box, n0, hk, b);
}
]]

local kernel = [[
extern "C" __global__ void __launch_bounds__(THREADS, 1)
${name}(const __grid_constant__ fg_fwd_tma_params p) {
  extern __shared__ unsigned char smem[];
  // Q boxes (and where the thread block walks, O's), then STAGES x (K
  // boxes, V boxes), then the barriers: Q "full" and "empty" (its shared
  // memory free again), and per stage K and V "full" (bytes arrived) and
  // "empty" (every consumer thread is done with it): K is released as soon
  // as S is computed, V only after P·V. Swizzled boxes start 1024-byte
  // aligned. The ring's stages and phases run on from one query block to
  // the next.
  const u32 q_tile = (smem_addr(smem) + 1023u) & ~1023u;
  const u32 o_tile = ${o_tile};  // where O is staged for its store: Q's, or its own
  const u32 stages = o_tile + ${o_boxes} * Q_BOX;
  const u32 q_bar = stages + STAGES * STAGE_BYTES, q_empty = q_bar + 8, k_full = q_empty + 8;
  const u32 v_full = k_full + 8 * STAGES, k_empty = v_full + 8 * STAGES;
  const u32 v_empty = k_empty + 8 * STAGES;
  // the warpgroup, warp-uniform to the compiler where Q and K are one or
  // two boxes wide (d <= 128), or three without dropout: its descriptors
  // are made in uniform registers, 1-3% faster at d <= 128; d 256 measured
  // slower so (hopper-notes steps 17, 19)
  const int tid = threadIdx.x,
            wg = BOXES <= 2 || (BOXES == 3 && UNIFORM_AT_THREE) ? __shfl_sync(0xffffffffu, tid / 128, 0) : tid / 128;

  if (tid == 0) {
    mbar_init(q_bar, 1);
    mbar_init(q_empty, CONSUMERS * 128);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(k_full + 8 * s, 1);
      mbar_init(v_full + 8 * s, 1);
      mbar_init(k_empty + 8 * s, CONSUMERS * 128);
      mbar_init(v_empty + 8 * s, CONSUMERS * 128);
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (wg == CONSUMERS) {  // the producer
#if CONSUMERS > 1
    regs_lower<PRODUCER_REGISTERS>();
#endif
${producer}
    return;
  }

#if CONSUMERS > 1  // one consumer and the producer keep the registers they started with
  regs_raise<CONSUMER_REGISTERS>();
#endif
  const int lane = tid & 31;
  ${lanes}  // accumulator row group and column pair
  const int warp_row = wg * 64 + ((tid / 32) % 4) * 16;  // this warp's first row in the block
  const u32 q_rows = q_tile + wg * 64 * 128;             // this warpgroup's rows in each Q box
  float acc_o[V_COLS / 2], row_max[2], row_sum[2], row_alpha[2];
  u32 pk[BLOCK_N / 4];  // P of the last key tile, as the A registers of O += P·V
${drop_keep}
  int ring = 0;  // key tiles taken so far
${walk}
#pragma unroll
    for (int i = 0; i < V_COLS / 2; ++i) acc_o[i] = 0.f;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
${row_init}
    }

    // a key tile's scores: mask, online softmax (O's factors kept for later);
    // then P packed into the A registers, 16 keys per four, dropout applied
    auto softmax_tile = [&](float* acc_s, int n0, bool full) {
      (void)full;
${logits}${apply_mask}
${softmax}
    };
    // K of the warpgroup's next key tile (if any) and V of this one (ring place r)
    auto wait_next = [&](int r, bool next) {
      if (next) mbar_wait(k_full + 8 * ((r + 1) % STAGES), ((r + 1) / STAGES) & 1);
      mbar_wait(v_full + 8 * (r % STAGES), (r / STAGES) & 1);
    };
    auto pack_tile = [&](const float* acc_s, int n0) {
      (void)n0;
#pragma unroll
      for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
        if (kk % 2 == 0) {  // a 32-key stretch's draws (or a 16-key tile's)
${drop_draw}
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) pk[4 * kk + i] = pack2(acc_s[8 * kk + 2 * i], acc_s[8 * kk + 2 * i + 1]);
${apply_dropout}
      }
    };

    // Q's copies, or for a block without keys the producer's word that Q's
    // shared memory is free for O
    mbar_wait(q_bar, walk & 1);
    if (any) {
      // every warpgroup takes as many turns (a turn per key tile, and one for
      // the last P·V); the last one's first pass is given up front, its last
      // one not at all
      if (wg == CONSUMERS - 1) turn_pass(wg);
      const u32 q_at = ${q_at};
${wg_tiles}      // ring: the key tile's place in the ring's run (stage and phase)
      int it = first;
${last_n0_decl}      ${own_open}{  // key tile 0: S alone, O is still zero
        const int n0 = tiles.at(it) * BLOCK_N, s = ring % STAGES;
        mbar_wait(k_full + 8 * s, (ring / STAGES) & 1);
        float acc_s[BLOCK_N / 2];
        turn_wait(wg);
        wgmma_fence();
        s_gemm(acc_s, q_at, stages + s * STAGE_BYTES);
        wgmma_commit();
        turn_pass(wg);
        wgmma_wait<0>();
        mbar_arrive(k_empty + 8 * s);  // this thread is done with K_0
        if (WAIT_BESIDE_O) wait_next(ring, tiles.next(it + 1) < wg_tiles);
        hold<BLOCK_N / 2>(acc_s);
        softmax_tile(acc_s, n0, tiles.full(it));
        pack_tile(acc_s, n0);
${last_n0_set}
        // Tile j: S_j = Q·K_jᵀ and O += P_{j-1}·V_{j-1} are issued together; the
        // softmax of S_j runs while O's wgmmas do, and O is rescaled after them.
        for (it = tiles.next(it + 1); it < wg_tiles; it = tiles.next(it + 1)) {
          const int n0 = tiles.at(it) * BLOCK_N, last_stage = ring % STAGES, s = ++ring % STAGES;
          if (!WAIT_BESIDE_O) wait_next(ring - 1, true);
${clear_v}
          float acc_s[BLOCK_N / 2];
          turn_wait(wg);
          wgmma_fence();
          s_gemm(acc_s, q_at, stages + s * STAGE_BYTES);
          wgmma_commit();
          pv_gemm(acc_o, pk, stages + last_stage * STAGE_BYTES + BOXES * KV_BOX);
          wgmma_commit();
          turn_pass(wg);
          wgmma_wait<1>();  // S_j is in; O's wgmmas may still run
          mbar_arrive(k_empty + 8 * s);  // done with K_j
          if (WAIT_BESIDE_O) wait_next(ring, tiles.next(it + 1) < wg_tiles);
          hold<BLOCK_N / 2>(acc_s);
          softmax_tile(acc_s, n0, tiles.full(it));
          wgmma_wait<0>();
          hold<V_COLS / 2>(acc_o);
          mbar_arrive(v_empty + 8 * last_stage);  // done with V_{j-1}
          pack_tile(acc_s, n0);
${rescale}
${last_n0_set_j}
        }
        mbar_arrive(q_empty);  // the last S is in: Q is free
        const int last_stage = ring % STAGES;
        mbar_wait(v_full + 8 * last_stage, (ring / STAGES) & 1);
${clear_v_last}
        turn_wait(wg);
        wgmma_fence();
        pv_gemm(acc_o, pk, stages + last_stage * STAGE_BYTES + BOXES * KV_BOX);
        wgmma_commit();
        if (${last_pass}) turn_pass(wg);
        wgmma_wait<0>();
        hold<V_COLS / 2>(acc_o);
        mbar_arrive(v_empty + 8 * last_stage);  // done with the last V
        ++ring;
      }${past_tiles}
    }

    // O /= rowsum (times 1/(1-p) with dropout); lse = m·scale + ln(rowsum).
    // A row that saw no key gets zeros and lse = -inf.
    if (owned) {
${by_tma}#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float l = row_sum[r];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const bool empty = row_max[r] == FG_NEG_INF || !(l > 0.f);
        const float inv = empty ? 0.f : p.out_scale / l;
        const int row = warp_row + g + 8 * r, i = row0 + row;  // row % 8 == g
${store_row}
        if (t == 0 && p.lse && i < seq.seqlen_q)
          ((float*)p.lse)[seq.stat(p, h, i)] = empty ? FG_NEG_INF : ${lse};
      }
${store_block}
    }
    if (!any) mbar_arrive(q_empty);
  }
${tail_wait}}
]]

-- The producer's copies: a warp's, or over a KV cache two warps', K's and V's.
-- Q's shared memory is refilled once the consumers are done with the last
-- query block's Q (q_empty: where the thread block walks, its last S is in;
-- O has shared memory of its own); for a block without keys the producer
-- only says so (q_bar), so the consumers never run a block ahead.
local load_q = [[
auto load_q = [&]() {
  if (walk > 0) mbar_wait(q_empty, (walk - 1) & 1);
  if (!issuer) return;
  if (!any) {
    mbar_arrive(q_bar);
    return;
  }
  mbar_arrive_expect(q_bar, BOXES * Q_BOX);
  for (int box = 0; box < BOXES; ++box)
    tma_load_4d(q_tile + box * Q_BOX, &p.q_map, q_bar, 64 * box, seq.map_q(row0), h, seq.map_b());
};]]
local producer = {
  -- a whole warp walks (its state warp-uniform: in uniform registers, not
  -- the producer's few), its first lane issues the copies: Q first, then
  -- the key tiles
  dense = [[
if (tid / 32 == CONSUMERS * 4) {
  const bool issuer = tid % 32 == 0;
  int ring = 0;  // key tiles copied so far
${walk}
${load_q}
    int j = 0;
    for (int it = first; it < tiles.count; it = tiles.next(it + 1), ++j) {
      if (j == 0) load_q();
      const int r = ring + j, s = r % STAGES, n0 = tiles.at(it) * BLOCK_N;
      const u32 stage = stages + s * STAGE_BYTES;
      if (r >= STAGES) mbar_wait(k_empty + 8 * s, (r / STAGES - 1) & 1);
      if (issuer) load_tile(&p.k_map, stage, k_full + 8 * s, seq.map_k(n0), hk, seq.map_b());
      if (r >= STAGES) mbar_wait(v_empty + 8 * s, (r / STAGES - 1) & 1);
      if (issuer) ${v_load}(&p.v_map, stage + BOXES * KV_BOX, v_full + 8 * s, seq.map_k(n0), hk, seq.map_b());
    }
    if (j == 0) load_q();  // a block without key tiles
    ring += j;
  }
}]],
  cached = [[
if (tid / 32 - CONSUMERS * 4 < 2) {  // its first warp: Q and K; its second: V
  const int lane = tid & 31, is_v = tid / 32 - CONSUMERS * 4;
  const bool issuer = lane == 0 && !is_v;  // Q's
  if (p.seqlen_new > 0) prior_wait();  // the new rows in the cache, in every block
  int ring = 0;  // key tiles copied so far
${walk}
${load_q}
    if (!is_v) load_q();
    // a tile's loads: a lane a run of rows within a page, or lane 0 the
    // sequence's rows; the next tile's pages are looked up while this
    // tile's loads wait
    const int rows = p.kv_box_rows;
    auto locate = [&](int it, int& unit, int& row) {
      unit = row = 0;  // past the keys: read, masked, V cleared
      if (it >= tiles.count || lane * rows >= BLOCK_N) return;
      const int key = tiles.at(it) * BLOCK_N + lane * rows;
      if (key < seq.seqlen_k) cache_at(p, b, key, unit, row);
    };
    const u32 empty = is_v ? v_empty : k_empty, full = is_v ? v_full : k_full;
    int unit, row, j = 0;
    locate(first, unit, row);
    for (int it = first; it < tiles.count; ++j) {
      const int r = ring + j, s = r % STAGES, it_next = tiles.next(it + 1);
      const u32 stage = stages + s * STAGE_BYTES;
      int unit_next, row_next;
      locate(it_next, unit_next, row_next);
      if (r >= STAGES) mbar_wait(empty + 8 * s, (r / STAGES - 1) & 1);
      if (is_v)
        load_cache_tile<${v_boxes}>(&p.v_map, stage + BOXES * KV_BOX, full + 8 * s, lane, rows, unit, row, hk);
      else
        load_cache_tile<BOXES>(&p.k_map, stage, full + 8 * s, lane, rows, unit, row, hk);
      it = it_next, unit = unit_next, row = row_next;
    }
    ring += j;
  }
}]],
}

-- A thread block's walk over query blocks (lib_sparse.forward_block): its
-- unit, then every p.blocks-th, or its own list's units where the call has
-- lists (p.walk_lists: p.blocks + 1 offsets, then the lists); the copies
-- and the consumers walk alike. A plan that does not walk has a thread
-- block a query block.
local walk_head = {
  [[
for (int walk = 0;; ++walk) {
  const int walk_part = walk % p.unit_blocks;
  int walk_unit = blockIdx.x + walk / p.unit_blocks * p.blocks;
  if (p.walk_lists) {
    const u16* lists = (const u16*)p.walk_lists;
    const int at = lists[blockIdx.x] + walk;
    walk_unit = at < lists[blockIdx.x + 1] ? lists[p.blocks + 1 + at] : p.units;
  }
  if (walk_unit >= p.units) break;]],
  [[
{  // the thread block's query block
  const int walk = 0, walk_unit = blockIdx.x, walk_part = 0;]] }
local walk = [[
${head}
${block}
  const int first = owned ? tiles.next(0) : tiles.count;
  const bool any = first < tiles.count;  // else no copy is issued or awaited
  (void)walk_part, (void)hk;]]

-- O's stores, a row at a time and then for the block. By TMA where the
-- head dim is a multiple of 8: the copy engine writes whole 16-byte chunks,
-- so a row must end on one. O is staged in o_tile, swizzled as the copy
-- engine reads it: Q's boxes (its S GEMMs are done with them), or where the
-- thread block walks, shared memory of its own, so the next block's Q comes
-- in while O is stored. o_rows: row warp_row + g, column 2t of O's first
-- box; o_swizzle: g, that row's swizzle; where the thread block walks, made
-- from a thread index opaque to the compiler, which would otherwise make
-- them once and keep them through the walk.
local store_by_tma = {
  row = [[
#pragma unroll
for (int dn = 0; dn < V_COLS / 8; ++dn)  // 16-byte chunk c of row r at chunk c ^ (r % 8)
  st_shared_u32(o_rows + (dn / 8) * Q_BOX + 1024 * r + (((dn % 8) ^ o_swizzle) << 4),
                pack2(acc_o[4 * dn + 2 * r] * inv, acc_o[4 * dn + 2 * r + 1] * inv));]],
  block = [[
// one thread stores the warpgroup's rows box by box; rows past seqlen_q and
// columns past the head dim are not written
fence_async_shared();
asm volatile("bar.sync %0, 128;\n" ::"r"(4 + wg) : "memory");  // named barriers 4..6 (turns: 1..3; clear_v: 8..10)
if (tid % 128 == 0 && by_tma) {
  for (int box = 0; box < ${v_boxes}; ++box)
    tma_store_4d(&p.o_map, o_tile + wg * 64 * 128 + box * Q_BOX, 64 * box, seq.map_q(row0 + wg * 64), h, seq.map_b());
  bulk_commit();
${wait_read}}]],
}
local store_direct = {
  row = [[
if (i < seq.seqlen_q) {
  u16* out = (u16*)p.o + seq.q_at(p.o_sb, p.o_ss, i) + h * p.o_sh;
#pragma unroll
  for (int dn = 0; dn < V_COLS / 8; ++dn) {
    const int col = dn * 8 + 2 * t;
    const float x0 = acc_o[4 * dn + 2 * r] * inv, x1 = acc_o[4 * dn + 2 * r + 1] * inv;
${output_store}
  }
}]],
  block = "",
}

-- Packed sequences and KV caches: V rows past the sequence's keys hold the
-- next sequence's values, or unused rows and pages, not TMA's zeros. P is 0
-- there, but 0·inf is NaN, so the consumers clear them before P·V reads the
-- tile; one tile per thread block at most reaches past seqlen_k. Each
-- warpgroup then arrives at the others' named barrier 8 + w and waits at
-- its own: a warpgroup past its own key tiles (own_bound) comes here from
-- another place in the code, and threads waiting at one aligned barrier
-- from different instructions is undefined (synccheck: divergent threads).
local clear_v = [[
if (last_n0 + BLOCK_N > seq.seqlen_k) {
  zero_rows(stages + last_stage * STAGE_BYTES + BOXES * KV_BOX, ${v_boxes}, KV_BOX, seq.seqlen_k - last_n0,
            BLOCK_N, tid, CONSUMERS * 128);
  fence_async_shared();  // before the wgmmas (async proxy) read them
#pragma unroll
  for (int w = 0; w < CONSUMERS; ++w)
    if (w != wg) asm volatile("bar.arrive %0, %1;\n" ::"r"(8 + w), "n"(CONSUMERS * 128) : "memory");
  asm volatile("bar.sync %0, %1;\n" ::"r"(8 + wg), "n"(CONSUMERS * 128) : "memory");
}]]

-- Where each consumer warpgroup takes the block's key tiles only up to the
-- last its own rows see (three consumers, or two under a mask: two without
-- one keep the plain loop, where only the last block's rows gain and the
-- text measured 1-3% slower with dropout), a warpgroup with none takes the first
-- S's turn, and past its own it takes a turn a tile (the one the others
-- issue that S and the last P·V in) and releases the tile's stage, clearing
-- V's rows past the keys with the others where they do.
local own_bound = [[
// this warpgroup's key tiles: the block's up to the last its rows may see
// (none where they are past the end; under a causal mask, fewer above the
// diagonal); the rest it only releases and passes turns for
const int wg_row0 = row0 + wg * 64, wg_rows = min(64, rows_valid - wg * 64);
${key_range}(void)wg_n_lo, (void)wg_row0;
// warp-uniform to the compiler (else a register more in the loop)
const int wg_tiles = __shfl_sync(0xffffffffu, wg_rows > 0 ? tiles.before((wg_n_hi + BLOCK_N - 1) / BLOCK_N) : 0, 0);
]]
local past_tiles = [[
 else {  // no key tile of its own: Q is free; the turn of the first S
  mbar_arrive(q_empty);
  turn_wait(wg);
  turn_pass(wg);
}
for (; it < tiles.count; it = tiles.next(it + 1)) {
  const int last_n0 = tiles.at(it) * BLOCK_N, last_stage = ring % STAGES, phase = (ring++ / STAGES) & 1;
  (void)last_n0;
  mbar_wait(k_full + 8 * last_stage, phase);
  mbar_arrive(k_empty + 8 * last_stage);
  mbar_wait(v_full + 8 * last_stage, phase);
${clear_v}
  turn_wait(wg);
  if (wg != CONSUMERS - 1 || tiles.next(it + 1) < tiles.count) turn_pass(wg);
  mbar_arrive(v_empty + 8 * last_stage);
}]]

return function(p)
  if p.arch ~= 90 then error("the sm_90a forward is built for sm_90 only") end
  if p.block_m ~= 64 * p.consumers then error("block_m must be 64 * consumers") end
  if p.v_cols ~= 64 * p.v_boxes or p.head_dim_v_padded > p.v_cols then
    error("v_cols must be the value boxes' columns and hold the padded value head dim")
  end
  if p.o_boxes ~= math.max(p.boxes, p.v_boxes) then
    error("o_boxes must be the more boxes of Q's and O's")
  end
  if p.dropout and p.block_n % 32 ~= 0 and p.block_n ~= 16 then
    error("dropout draws 32-key stretches: block_n must be 16 or a multiple of 32")
  end
  local name = "fg_fwd_" .. p.target_tag .. "_" .. p.spec_name .. "_m" .. p.block_m .. "n" .. p.block_n
               .. "s" .. p.stages .. (p.turns == 1 and "t" or "")
  local banner = text.fill([[
// ${name}
// Generated by flashgen ${version}: forward attention, TMA + wgmma.
// spec: ${spec_name} (dtype ${dtype}, head dim ${head_dim}${v_banner}, mask ${mask}, dropout ${dropout},
//       sparsity ${sparsity})
// plan: Br=${block_m} (${consumers} consumer warpgroups) Bc=${block_n} stages=${stages}
//       head dim padded to ${head_dim_padded} (${boxes} boxes), shared memory ${smem_bytes} bytes;
//       registers ${producer_registers} (producer), ${consumer_registers} (consumers); target ${target}
]], {
    name = name, version = p.generator_version, spec_name = p.spec_name, dtype = p.dtype,
    head_dim = p.head_dim, v_banner = width.banner(p), mask = p.mask,
    dropout = p.dropout and "on" or "off",
    sparsity = p.sparsity, block_m = p.block_m, consumers = p.consumers, block_n = p.block_n,
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
#define TURNS ${turns}
#define STAGES ${stages}
#define THREADS ${threads}
#define PRODUCER_REGISTERS ${producer_registers}
#define CONSUMER_REGISTERS ${consumer_registers}
#define Q_BOX (BLOCK_M * 128)                 // bytes of one Q box: BLOCK_M rows x 64 columns
#define KV_BOX (BLOCK_N * 128)                // bytes of one K or V box
]], p) .. (width.same(p) and "#define STAGE_BYTES (2 * BOXES * KV_BOX)      // K then V\n" or
           text.fill([[
#define HEAD_DIM_V ${head_dim_v}
#define HEAD_DIM_V_PADDED ${head_dim_v_padded}
#define V_BOXES ${v_boxes}                     // V's and O's
#define O_BOXES ${o_boxes}                     // Q's shared memory, where O is staged
#define STAGE_BYTES ((BOXES + V_BOXES) * KV_BOX)  // K then V
]], p))
  local wgmma_s = { sm90a.wgmma(p.block_n, p.dtype, false) }
  local wgmma_o = { sm90a.wgmma(p.v_cols, p.dtype, true) }
  -- the register tiles: S (and P) and O as wgmma accumulators, P packed into
  -- the A registers of P·V
  local frag_s = fragment.wgmma_m64({ array = "acc_s", n_tiles = "BLOCK_N / 8" })
  local frag_o = fragment.wgmma_m64({ array = "acc_o", n_tiles = "V_COLS / 8", n_var = "dn" })
  local frag_p = fragment.wgmma_a({ array = "pk", k_var = "kk" })
  -- max_slack: a warp skips O's rescale in the tiles where none of its rows'
  -- maxima moves by 2^8. Kept where O is four boxes wide (d_v 193..256:
  -- -5% at d 256), and three without dropout (d_v 129..192: -1 to -5%; with
  -- dropout up to +7%); at d 64 and 128 the branch costs more than it saves
  -- (up to +9% with dropout, hopper-notes steps 28, 29 and 31)
  local skip = p.v_boxes > 3 or (p.v_boxes == 3 and not p.dropout)
  local rows = { to_log2 = logits.to_log2(p, "p"), row_max = "row_max", row_sum = "row_sum",
                 alpha = "row_alpha", max_slack = skip and 8 or nil }
  -- the predicate on every element where O leaves the registers for its
  -- loads (up to two boxes: at d256 it spilled at Bc 64, the branch did not)
  local apply_mask = mask.apply(p.mask, frag_s, {
    params = "p", seq = "seq", row0 = "row0 + warp_row", key0 = "n0", block_row0 = "row0",
    block_key0 = "n0", eager = p.v_boxes <= 2, full = "full", predicate = logits.mask_predicate(p, { params = "p", seq = "seq", batch = "b", head = "h" }) })
  local drop_draw = p.dropout and dropout.draw_tile(frag_s, {
    params = "p", batch = "b", head = "h", row0 = "row0 + warp_row", key0 = "n0 + kk * 16",
    stretches = "1", keep = "drop_keep" }) or ""
  local apply_dropout = p.dropout and dropout.apply_packed(frag_p, {
    params = "p", key0 = "n0 + kk * 16", stretch = "0", keep = "drop_keep" }) or ""
  -- O by TMA where the map clips the rows past the sequence: a dense map ends
  -- at seqlen_q, a packed one only where the tensor does, so there a
  -- warpgroup whose rows reach past its sequence stores them directly
  local direct_row = text.fill(store_direct.row, {
    output_store = text.indent(epilogue.output_store(p, width.v(p)), 4) })
  local store = { row = direct_row, block = "", by_tma = "" }
  -- V's and O's boxes, and Q's shared memory: the head dim's where the
  -- widths are one (the text of a kernel with a single head dim)
  local box_unroll = p.walk == 1 and "#pragma unroll 1" or "#pragma unroll"
  local boxes = width.same(p) and { v = "BOXES", q = "BOXES", load = "load_tile" }
                or { v = "V_BOXES", q = "O_BOXES", load = "load_tile_v" }
  if width.v(p).dim % 8 == 0 then
    store = { row = store_by_tma.row, block = text.fill(store_by_tma.block, { v_boxes = boxes.v,
              wait_read = p.walk == 1 and "" or "  bulk_wait_read();  // the shared memory stays until the copies have read it\n" }),
              by_tma = "const bool by_tma = row0 + wg * 64 < seq.seqlen_q;\n" }
    local offsets = p.walk == 1 and [[
u32 o_lane = threadIdx.x;
asm volatile("" : "+r"(o_lane));
const u32 o_swizzle = o_lane % 32 / 4;
const u32 o_rows = o_tile + (o_lane / 128 * 64 + o_lane / 32 % 4 * 16 + o_swizzle) * 128 + 4 * (o_lane % 4);
]] or "const u32 o_swizzle = g, o_rows = o_tile + (warp_row + g) * 128 + 4 * t;\n"
    if p.varlen then
      store.row = "if (by_tma) {\n" .. text.indent(store_by_tma.row, 2) .. "\n} else {\n"
                  .. text.indent(direct_row, 2) .. "\n}"
      store.by_tma = "const bool by_tma = row0 + wg * 64 + 64 <= seq.seqlen_q;\n"
    end
    store.by_tma = store.by_tma .. offsets
    if p.walk == 1 then  -- the last block's store has read O's shared memory
      store.by_tma = store.by_tma .. "if (tid % 128 == 0) bulk_wait_read();\n"
        .. "asm volatile(\"bar.sync %0, 128;\\n\" ::\"r\"(4 + wg) : \"memory\");\n"
    end
  end
  -- V rows past a sequence's keys that are not TMA's zeros
  local ends = p.varlen or p.kv_cache
  local own_tiles = p.consumers >= 3 or p.mask ~= "none"
  -- sections of heads under a causal mask only, where blocks differ in
  -- length (elsewhere the plain order measured 3% faster at d = 128); there
  -- a unit may be a pair of query blocks whose keys add up alike
  local causal = p.mask == "causal"
  local walk_text = text.fill(walk, { head = walk_head[p.walk == 1 and 1 or 2], block = text.indent(
    sparse.forward_block(p, causal, { unit = "walk_unit", part = "walk_part", pairs = causal and p.walk == 1 }), 2) })
  local body = text.fill(kernel, {
    name = name,
    lanes = fragment.lane_decl(frag_s),
    walk = text.indent(walk_text, 2),
    drop_keep = p.dropout and "  u32 drop_keep[1][1][4];  // a stretch's dropout draws" or "",
    drop_draw = text.indent(drop_draw, 10),
    apply_mask = text.indent(apply_mask, 6),
    -- a score modifier's terms per diagonal where O leaves registers for
    -- them (up to two boxes: at d256 they spilled at Bc 64)
    logits = text.indent_code(logits.transform(p, frag_s, {
      params = "p", seq = "seq", row0 = "row0 + warp_row", key0 = "n0", batch = "b", head = "h",
      per_element = p.v_boxes > 2 }), 6),
    row_init = text.indent(logits.row_init(p, {
      params = "p", head = "h", max = "row_max[r]", sum = "row_sum[r]", first_lane = "t == 0" }), 6),
    lse = logits.lse(p, "p", "row_max[r]", "l"),
    softmax = text.indent_code(softmax.update(frag_s, frag_o, rows), 6),
    rescale = text.indent_code(softmax.rescale(frag_o, rows), 10),
    apply_dropout = text.indent(apply_dropout, 8),
    store_row = text.indent(store.row, 8),
    store_block = text.indent(store.block, 6),
    by_tma = text.indent(store.by_tma, 6),
    clear_v = ends and text.indent(text.fill(clear_v, { v_boxes = boxes.v }), 10) or "",
    q_boxes = boxes.q,
    q_at = p.walk == 1 and "opaque(q_rows)" or "q_rows",
    o_tile = p.walk == 1 and "q_tile + " .. boxes.q .. " * Q_BOX" or "q_tile",
    o_boxes = p.walk == 1 and boxes.v or boxes.q,
    tail_wait = p.walk == 1 and "  if (tid % 128 == 0) bulk_wait_read();  // O's last store has read it\n" or "",
    producer = text.indent(text.fill(p.kv_cache and producer.cached or producer.dense,
                                     { v_load = boxes.load, v_boxes = boxes.v,
                                       walk = text.indent(walk_text, 2), load_q = text.indent(load_q, 4) }), 4),
    last_n0_decl = ends and "      int last_n0 = 0;  // the key tile of P (and of V at last_stage)\n" or "",
    last_n0_set = ends and "        last_n0 = n0;" or "",
    last_n0_set_j = ends and "          last_n0 = n0;" or "",
    clear_v_last = ends and text.indent(text.fill(clear_v, { v_boxes = boxes.v }), 8) or "",
    own_open = own_tiles and "if (it < wg_tiles) " or "",
    last_pass = own_tiles and "wg != CONSUMERS - 1 || it < tiles.count" or "wg != CONSUMERS - 1",
    past_tiles = own_tiles and text.indent(text.fill(past_tiles, {
      clear_v = ends and text.indent(text.fill(clear_v, { v_boxes = boxes.v }), 2) or "" }), 6):gsub("^%s+", " ") or "",
    wg_tiles = text.indent(own_tiles and text.fill(own_bound, { key_range = mask.key_range(p.mask, "seq", {
      row0 = "wg_row0", rows = "wg_rows", lo = "wg_n_lo", hi = "wg_n_hi" }) })
      or "const int wg_tiles = tiles.count;  // every key tile of the block\n", 6),
  })
  local source = table.concat({
    banner, constants, device.source, (isa_for(80).prelude(p.dtype)), sm90a.source,
    wgmma_s[2], wgmma_o[2], p.params_struct, logits.device(p), p.dropout and dropout.device or "",
    p.kv_cache and kv_cache.common(p) .. "\n" .. sequence.source(p) or sequence.source(p),
    sparse.key_tiles(p),
    text.fill(pieces, { wgmma_s = wgmma_s[1], wgmma_o = wgmma_o[1], box_unroll = box_unroll,
                        uniform_at_three = p.dropout and 0 or 1,
                        load_tile_v = width.same(p) and "" or text.fill(load_tile_v, { box_unroll = box_unroll }) }),
    p.kv_cache and table.concat({ load_cache_tile, kv_cache.append(p, name .. "_append", false, "fg_fwd_tma_params"),
                                  body }, "\n") or body,
  }, "\n")
  -- p.blocks thread blocks, each walking units (lib_sparse.forward_block);
  -- over a KV cache after the append kernel, as its programmatic dependent
  -- (the producer waits for it before reading the cache)
  local forward = { entry = name, threads = p.threads, smem = p.smem_bytes,
                    grid = { { "blocks" } } }
  if not p.kv_cache then return { source = source, name = name, launches = { forward } } end
  forward.programmatic = 1
  return { source = source, name = name, launches = { kv_cache.append_launch(p, name .. "_append"), forward } }
end
