-- The pieces a decoding step's kernels share (kernel_fwd_decode,
-- kernel_fwd_mla, kernel_fwd_mla_sm90a): the cache's rows and pages, the
-- append kernel, the keys a row sees, and the combine kernel that adds a
-- split call's parts. Their text reads the kernel's launch arguments p
-- (fg_decode_params, or a struct that starts with its fields).
local text = import("lib_text")
local width = import("lib_width")
local M = {}

local common = [[
// Key j of sequence b lives in row `row` of `unit`: a page of the pool
// (clamped to it) or the sequence itself. Pages of a power of two rows
// shift (page_shift >= 0) instead of dividing.
template <class P>
__device__ __forceinline__ void cache_at(const P& p, int b, int j, int& unit, int& row) {
  if (p.block_table) {
    const int* table = (const int*)p.block_table;
    const int at = p.page_shift >= 0 ? j >> p.page_shift : j / p.page_size;
    row = j - at * p.page_size;
    unit = min(max(table[(i64)b * p.block_table_stride + at], 0), p.num_pages - 1);
  } else {
    unit = b;
    row = j;
  }
}

// A kernel launched as a programmatic dependent of the call's previous one
// (sm_90) starts while that one runs: it waits for it (the step for the
// append kernel's new rows, the combine kernel for the step's parts) before
// reading what it wrote. Launched in stream order, or before sm_90, there is
// nothing to wait for. The step lets the combine kernel start at once
// (combine_may_start): its blocks then wait beside the step's last ones
// rather than launch after them.
__device__ __forceinline__ void prior_wait() {${wait}}
__device__ __forceinline__ void prefetch_l2(const void* x) { asm volatile("prefetch.global.L2 [%0];" :: "l"(x)); }
// x through a register the compiler cannot trace back to the parameters,
// so that they are read where x is made, not again later
template <class T> __device__ __forceinline__ T* held(T* x) {
  asm volatile("mov.b64 %0, %0;" : "+l"(x));
  return x;
}
__device__ __forceinline__ void combine_may_start() {${start}}

// A step's thread block: its split, row block, KV head and sequence, from
// blockIdx.x in the grid's order (num_splits x row_blocks x Hkv x B, the
// split fastest).
struct step_block {
  int split, rb, hk, b;
};
template <class P> __device__ __forceinline__ step_block step_block_of(const P& p) {
  int x = blockIdx.x;
  step_block s;
  s.split = x % p.num_splits;
  x /= p.num_splits;
  s.rb = x % p.row_blocks;
  x /= p.row_blocks;
  s.hk = x % p.heads_kv;
  s.b = x / p.heads_kv;
  return s;
}

// The tiles ahead of split s of n sharing `tiles` evenly: in 32 bits where
// the product fits (a 64-bit division is a long subroutine on the path to
// the block's first copies).
__device__ __forceinline__ int split_share32(int tiles, int s, int n) {
  const i64 x = (i64)tiles * s;
  return x <= 0x7fffffff ? (int)((unsigned)x / (unsigned)n) : (int)(x / n);
}

// The keys sequence b holds before the call's new ones, and with them.
template <class P> __device__ __forceinline__ int cached_keys(const P& p, int b) {
  return p.cache_seqlens ? min(max(((const int*)p.cache_seqlens)[b], 0), p.seqlen_k) : p.seqlen_k;
}
template <class P> __device__ __forceinline__ int sequence_keys(const P& p, int b) {
  return min(cached_keys(p, b) + p.seqlen_new, p.seqlen_k);
}
]]
-- The pieces every step's kernel text starts with (after its parameters).
function M.common(p)
  local sm90 = p.arch >= 90
  return text.fill(common, { wait = sm90 and ' asm volatile("griddepcontrol.wait;\\n" ::: "memory"); ' or "",
                             start = sm90 and ' asm volatile("griddepcontrol.launch_dependents;\\n"); ' or "" })
end

-- The append kernel (latent: the cache is K alone, whose first Dv columns
-- are V; no v_new).
local append = [[
// Before the step's kernel, one thread per 16-byte chunk of a new row:
// k_new, v_new (B, seqlen_new, Hkv, D|Dv) into the cache rows after each
// sequence's cached keys.
extern "C" __global__ void __launch_bounds__(THREADS) ${name}(const ${params} p) {
  constexpr int CHUNKS = ${chunks};
${launch_dependents}  const i64 x = (i64)blockIdx.x * THREADS + threadIdx.x, item = x / CHUNKS;
  const int chunk = x % CHUNKS;
  if (item >= (i64)p.batch * p.seqlen_new * p.heads_kv) return;
  const int hk = item % p.heads_kv, i = item / p.heads_kv % p.seqlen_new;
  const int b = item / p.heads_kv / p.seqlen_new;
  const int j = cached_keys(p, b) + i;
  if (j >= p.seqlen_k) return;
  int unit, row;
  cache_at(p, b, j, unit, row);
  const u128* kn = (const u128*)((const u16*)p.k_new + b * p.kn_sb + i * p.kn_ss + hk * p.kn_sh);
  const u128* vn = (const u128*)((const u16*)p.v_new + b * p.vn_sb + i * p.vn_ss + hk * p.vn_sh);
  u128* k = (u128*)((u16*)p.k + unit * p.k_sb + (i64)row * p.k_ss + hk * p.k_sh);
  u128* v = (u128*)((u16*)p.v + unit * p.v_sb + (i64)row * p.v_ss + hk * p.v_sh);
${copies}
}
]]

-- params: the name of the launch arguments' struct (fg_decode_params, or
-- the Hopper forward's fg_fwd_tma_params).
function M.append(p, name, latent, params)
  local chunks, copies
  if latent then
    chunks, copies = "HEAD_DIM / 8", "  k[chunk] = kn[chunk];"
  elseif p.head_dim_v == nil or p.head_dim_v == p.head_dim then
    chunks, copies = "HEAD_DIM / 8", "  k[chunk] = kn[chunk];\n  v[chunk] = vn[chunk];"
  else
    chunks = "(HEAD_DIM > HEAD_DIM_V ? HEAD_DIM : HEAD_DIM_V) / 8"
    copies = "  if (chunk < HEAD_DIM / 8) k[chunk] = kn[chunk];\n"
             .. "  if (chunk < HEAD_DIM_V / 8) v[chunk] = vn[chunk];"
  end
  local body = text.fill(append, { name = name, chunks = chunks, copies = copies,
    params = params,
    launch_dependents = p.arch >= 90
      and '  asm volatile("griddepcontrol.launch_dependents;\\n");  // the step starts now\n' or "" })
  if latent then  -- no V of its own: neither its new rows nor its cache
    body = body:gsub("  const u128%* vn = [^\n]*\n", ""):gsub("  u128%* v = [^\n]*\n", "")
    body = body:gsub("v_new %(B, seqlen_new, Hkv, D|Dv%)", "(no v_new: V is K's first columns)")
  end
  return body
end

-- visible_keys' body for a mask kind
M.visible = {
  none = "  lo = 0;\n  hi = keys;",
  causal = "  lo = 0;\n  hi = max(0, min(keys, i + diag + 1));",
  window = [[
  lo = p.window_left < 0 ? 0 : max(0, i + diag - p.window_left);
  hi = p.window_right < 0 ? keys : min(keys, i + diag + p.window_right + 1);
  hi = max(hi, lo);]],
}

-- visible_keys(): the keys row i sees, for the mask kind.
function M.visible_keys(p)
  if not M.visible[p.mask] then error("unknown mask kind '" .. tostring(p.mask) .. "'") end
  return text.fill([[
// Keys i's row sees: [lo, hi) of the sequence's `keys` (lib_mask's rule).
template <class P>
__device__ __forceinline__ void visible_keys(const P& p, int i, int diag, int keys, int& lo, int& hi) {
${visible}
}

]], { visible = M.visible[p.mask] })
end

-- fetch_page() and put_page() after their comment, with `between` (the
-- kernel's copy constants) between the two.
function M.pages(between)
  return [[
// The pages of a tile's keys: one block table entry per key, read by the
// first BLOCK_N threads (one key each, fetch_page) a tile before the ring
// needs it and kept in shared memory (put_page), where every thread's
// copies find their rows' pages. So a thread makes at most one global read
// of the table per tile, whatever its rows, and never waits on it before
// the tile's math.
]] .. between .. "\n" .. [[
// Key n0 + tid's table entry as stored (0 past the keys: never used).
__device__ __forceinline__ int fetch_page(const fg_decode_params& p, int b, int n0, int keys, int tid) {
  const int j = n0 + tid;
  if (tid >= BLOCK_N || j >= keys) return 0;
  const int at = p.page_shift >= 0 ? j >> p.page_shift : j / p.page_size;
  return ((const int*)p.block_table)[(i64)b * p.block_table_stride + at];
}

// The entry clamped to the pool into the tile's slot of pages.
__device__ __forceinline__ void put_page(int* pages, const fg_decode_params& p, int entry, int tid) {
  if (tid < BLOCK_N) pages[tid] = min(max(entry, 0), p.num_pages - 1);
}

]]
end

-- A step's thread block's start: its Q rows in flight, the sequence's keys
-- and diagonal, the tiles of the block's split (t_begin, tiles), the
-- thread's two rows' visible keys (lo, hi), and the pages of the first
-- STAGES tiles. Names the kernel defines: p, b, hk, split, row0,
-- block_rows, tid, wm, g, sQ, sPages (with pages). Options (o, a table,
-- all optional): q_at, the byte offset from sQ of row r's 16-byte chunk k
-- (default: rows of SMEM_ROW elements); pages = false: no pages read (the
-- kernel reads its own); own_rows = false: no lo, hi (the kernel's threads
-- hold other rows, and find their keys; wm and g not needed); q_by_rows:
-- the key count's load first, then Q's copies a row to THREADS / block_rows
-- threads (THREADS a multiple of block_rows); share32: the splits' shares
-- divided in 32 bits where they fit (the latent kernels keep 64: their
-- registers' schedule ran slower with it).
local block_start = [[
  combine_may_start();
${q_copies}  const int diag = p.align_bottom_right ? keys - p.seqlen_q : 0;

  // the block's keys: bounds grow with the query, so its first and last
  // query bound them; its tiles split evenly between the splits
  int n_lo, n_hi, unused;
  visible_keys(p, row0 / p.group, diag, keys, n_lo, unused);
  visible_keys(p, (min(row0 + block_rows, p.rows) - 1) / p.group, diag, keys, unused, n_hi);
  const int t_lo = n_lo / BLOCK_N, t_count = n_hi > n_lo ? (n_hi - 1) / BLOCK_N + 1 - t_lo : 0;
  const int t_begin = t_lo + ${share_begin};
  const int tiles = t_lo + ${share_end} - t_begin;
${thread_rows}
  if (p.seqlen_new > 0) prior_wait();  // the new rows, before any tile's copies
]]
-- Q's copies: a chunk a thread in turn, then the key count's load
local q_chunks = [[
  // Q rows of the block in flight first (they need no key count)
  {
    constexpr int CHUNKS = HEAD_DIM_PADDED / 8;
    for (int c = tid; c < block_rows * CHUNKS; c += THREADS) {
      const int r = c / CHUNKS, k = c % CHUNKS, pr = row0 + r;
      const bool inside = pr < p.rows && k * 8 < HEAD_DIM;
      const int i = inside ? pr / p.group : 0, h = hk * p.group + (inside ? pr % p.group : 0);
      const u16* gq = (const u16*)p.q + b * p.q_sb + (i64)i * p.q_ss + h * p.q_sh + k * 8;
      copy16(sQ + ${q_at}, gq, inside ? 16 : 0);
    }
  }
  const int keys = sequence_keys(p, b);
]]
-- ... or the key count's load first, then Q's copies a row to THREADS /
-- block_rows threads (one division a thread, not a chunk: the copies go out
-- sooner, and the key count arrives while they do)
local q_rows = [[
  const int keys = sequence_keys(p, b);
  // Q rows of the block in flight, before the tiles' copies (they need the
  // key count)
  {
    constexpr int CHUNKS = HEAD_DIM_PADDED / 8;
    const int per_row = THREADS / block_rows, r = tid / per_row, pr = row0 + r;
    const bool row_in = pr < p.rows;
    const int i = row_in ? pr / p.group : 0, h = hk * p.group + (row_in ? pr % p.group : 0);
    const u16* gq = (const u16*)p.q + b * p.q_sb + (i64)i * p.q_ss + h * p.q_sh;
    for (int k = tid % per_row; k < CHUNKS; k += per_row)
      copy16(sQ + ${q_at}, gq + k * 8, row_in && k * 8 < HEAD_DIM ? 16 : 0);
  }
]]
local thread_rows = [[

  // this thread's two rows (g, g + 8 of its warp's 16) and their keys
  int lo[2], hi[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int pr = row0 + 16 * wm + g + 8 * r;
    lo[r] = hi[r] = 0;
    if (pr < p.rows) visible_keys(p, pr / p.group, diag, keys, lo[r], hi[r]);
  }]]
local first_pages = [[

  // the pages of the first STAGES tiles, then the first STAGES - 1 tiles
  if (p.block_table) {
    int entry[STAGES];
#pragma unroll
    for (int s = 0; s < STAGES; ++s)
      entry[s] = s < tiles ? fetch_page(p, b, (t_begin + s) * BLOCK_N, keys, tid) : 0;
#pragma unroll
    for (int s = 0; s < STAGES; ++s) put_page(sPages + s * BLOCK_N, p, entry[s], tid);
    __syncthreads();
  }
]]
local function share(share32, split)
  return share32 and ("split_share32(t_count, " .. split .. ", p.num_splits)")
         or ("(int)((i64)t_count * (" .. split .. ") / p.num_splits)")
end
function M.block_start(o)
  o = o or {}
  local q = text.fill(o.q_by_rows and q_rows or q_chunks, { q_at = o.q_at or "(r * SMEM_ROW + k * 8) * 2" })
  return text.fill(block_start, { q_copies = q, thread_rows = o.own_rows == false and "" or thread_rows,
                                  share_begin = share(o.share32, "split"), share_end = share(o.share32, "split + 1") })
         .. (o.pages == false and "" or first_pages)
end

-- The append kernel's launch: a thread per 16-byte chunk of an item (with
-- none it is not launched).
function M.append_launch(p, append)
  return { entry = append, threads = p.threads, smem = 0,
           grid = { { "append_items", scale = math.max(p.head_dim, p.head_dim_v) // 8, per = p.threads } } }
end
-- A step's launches: the append kernel, the step's kernel, a thread block
-- per (split, row block, KV head, sequence) as it decodes blockIdx.x, and
-- the combine kernel, a thread block per query row or per four (none with
-- one split).
-- With `ways` (fwd_decode), the step's four kernels instead, of which a
-- call launches one: step, ways.columns, ways.counted_step and
-- ways.counted_columns over key_blocks, column_blocks, counted_key_blocks
-- and counted_column_blocks; with ways.pairs, a fifth way: step over
-- pair_blocks in clusters of two (a row block's two splits, which add
-- their rows themselves).
function M.launches(p, append, step, combine, ways)
  local programmatic = p.arch >= 90 and 1 or 0
  local function step_launch(entry, grid)
    return { entry = entry, threads = p.threads, smem = p.smem_bytes, programmatic = programmatic,
             grid = grid }
  end
  local list = { M.append_launch(p, append) }
  if ways then
    list[#list + 1] = step_launch(step, { { "key_blocks" } })
    list[#list + 1] = step_launch(ways.columns, { { "column_blocks" } })
    list[#list + 1] = step_launch(ways.counted_step, { { "counted_key_blocks" } })
    list[#list + 1] = step_launch(ways.counted_columns, { { "counted_column_blocks" } })
    if ways.pairs then
      local pairs = step_launch(step, { { "pair_blocks" } })
      pairs.cluster = 2
      list[#list + 1] = pairs
    end
  else
    list[#list + 1] = step_launch(step, { { "num_splits" }, { "row_blocks" }, { "heads_kv" }, { "batch" } })
  end
  list[#list + 1] = M.combine_launch(p, combine)
  return list
end

-- The combine kernel's launch: a thread block per query row of a split
-- call, or per COMBINE_THREADS / 32 of them (combine_blocks).
function M.combine_launch(p, combine)
  return { entry = combine, threads = p.combine_threads, smem = 0, programmatic = p.arch >= 90 and 1 or 0,
           grid = { { "combine_blocks" } } }
end

-- A step's output of a thread's two rows of O (16 wm + g + 8 r of the
-- block) at columns col0 + 8 dn + 2 t, dn < tiles: divided by their sum to
-- o (its first v_dim columns) with one split, else to the split's part,
-- and the log-sum-exp by the thread of t 0 where `first` holds. sum:
-- statements that define the row's sum l; max2: the row's maximum in base
-- 2 (default: its score maximum row_max[r] times p.scale_log2); take: the
-- tiles dn the thread writes (default all); acc0, acc1: the accumulators
-- of the row's columns 2 t and 2 t + 1 of tile dn;
-- v_padded: the parts' row width. Names the kernel defines: p, b, hk,
-- split, row0, wm, g, t, row_max, all_rows.
local store_rows = [[
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = 16 * wm + g + 8 * r, pr = row0 + row;
    if (pr >= p.rows) continue;
${sum}
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const float lse2 = l > 0.f ? ${max2} + log2f(l) : FG_NEG_INF;  // base 2
    const int i = pr / p.group, h = hk * p.group + pr % p.group;
    const i64 out_row = ((i64)b * p.heads_q + h) * p.seqlen_q + i;  // lse's (B, Hq, Sq)
    if (p.num_splits == 1) {
${one_split}
      if (${first} && t == 0 && p.lse) ((float*)p.lse)[out_row] = lse2 * 0.69314718055994531f;
    } else {
      const i64 part = split * all_rows + out_row;
      float* o = (float*)p.o_part + part * ${v_padded} + ${col0} + 2 * t;
#pragma unroll
      for (int dn = 0; dn < ${tiles}; ++dn)
        if (${take}) *(float2*)(o + dn * 8) = make_float2(${acc0} * inv, ${acc1} * inv);
      if (${first} && t == 0) ((float*)p.lse_part)[part] = lse2;
    }
  }
]]
-- O's columns straight to o
local one_split_direct = [[
      u16* out = (u16*)p.o + b * p.o_sb + (i64)i * p.o_ss + h * p.o_sh + ${col0} + 2 * t;
#pragma unroll
      for (int dn = 0; dn < ${tiles}; ++dn)
        if ((${take}) && ${col0} + dn * 8 + 2 * t < ${v_dim})
          *(u32*)(out + dn * 8) = pack2(${acc0} * inv, ${acc1} * inv);]]
-- O's columns into the staged rows (staged_out's layout)
local one_split_staged = [[
#pragma unroll
      for (int dn = 0; dn < ${tiles}; ++dn) {
        const int chunk = (${col0}) / 8 + dn;
        st_shared_u32(${stage} + row * (${v_dim} * 2) + ((chunk ^ (row & 7)) << 4) + 4 * t,
                      pack2(${acc0} * inv, ${acc1} * inv));
      }]]
-- stage: where one split's O goes: nil, straight to o; else a u32 shared
-- address of the block's rows, which staged_out then writes to o (every
-- tile of the thread's: take does not apply, and the columns are v_dim).
function M.store_rows(x)
  local fields = setmetatable({ max2 = x.max2 or "row_max[r] * p.scale_log2", take = x.take or "true" },
                              { __index = x })
  fields.one_split = text.fill(x.stage and one_split_staged or one_split_direct, fields)
  return text.fill(store_rows, fields)
end

-- After store_rows with a stage, and a barrier: the block's rows of O from
-- the stage (rows of v_dim elements, a row's 16-byte chunk c at c ^ (row &
-- 7), so that a warp's stores of 8 rows meet no bank twice; v_dim a
-- multiple of 64) to o, a thread a 16-byte chunk, consecutive threads along
-- a row: whole sectors, where the accumulators' layout would write 16 bytes
-- of 8 rows an instruction. Names as store_rows'. whole: where the block
-- writes O (default: a one-split call); row_o: where its row `row` starts
-- in o, elements from p.o (default: worked out from the row's query and
-- head).
function M.staged_out(stage, v_dim, whole, row_o)
  return text.fill([[
  if (${whole}) {
    constexpr int CHUNKS = ${v_dim} / 8;  // a row's
    const int rows = min(block_rows, p.rows - row0);
    for (int c = tid; c < rows * CHUNKS; c += THREADS) {
      const int row = c / CHUNKS, k = c % CHUNKS;
${place}      u128 x;
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(x.x), "=r"(x.y), "=r"(x.z), "=r"(x.w)
                   : "r"(${stage} + row * (CHUNKS * 16) + ((k ^ (row & 7)) << 4)));
      *(u128*)((u16*)p.o + ${row_o} + k * 8) = x;
    }
  }
]], { stage = stage, v_dim = v_dim, whole = whole or "p.num_splits == 1",
       place = row_o and "" or "      const int pr = row0 + row, i = pr / p.group, h = hk * p.group + pr % p.group;\n",
       row_o = row_o or "b * p.o_sb + (i64)i * p.o_ss + h * p.o_sh" })
end

-- A split call's end: combine_row, which adds a query row's parts into o
-- and lse with the threads of a block; the combine kernel, a block per row;
-- and the same work in blocks of a counted step's kernel (count_split,
-- combine_counted: one launch).
-- p: the plan's figures (combine_threads, combine_warp_splits: the
-- families' COMBINE_THREADS and COMBINE_WARP_SPLITS, by which they size the
-- combine kernel's grid); v_dim, v_padded: the value width's macros (O's
-- columns, a part's row); params: the kernel's launch arguments' struct
-- (default fg_decode_params); the kernel's source defines MAX_SPLITS. A
-- step's kernel whose blocks combine has COMBINE_THREADS threads.
function M.combine(p, name, v_dim, v_padded, params)
  return text.fill([[
#define COMBINE_THREADS ${threads}
#define COMBINE_C4 (${v_padded} / 4)                 // a part's row in 4-column groups
#define COMBINE_CW (COMBINE_C4 < COMBINE_THREADS ? COMBINE_C4 : COMBINE_THREADS)  // groups a round
#define COMBINE_SG (COMBINE_THREADS / COMBINE_CW)      // split groups: 1 where C4 >= threads
#define COMBINE_WARP_SPLITS ${warp_splits}             // a warp a row up to these splits

// Query row `row` (b, h, i) of a split call: every split's part (O divided
// by its sum, lse2 its log-sum-exp in base 2) added into o and lse by
// THREADS_C threads: the block's COMBINE_THREADS, or one warp (32). They
// first turn the splits' lse2 into weights exp2(lse2 - m) (m their maximum)
// in sW, with their sum l; thread (sg, c) then adds columns 4c.. of splits
// sg, sg + SG, ... in order, MERGE_LOADS of them loaded at once (a round
// trip to L2 each batch; the first batch's loads are issued before the
// weights are known). The SG split groups meet in sY in group order, and
// the maxima and sums are taken in a fixed order (sR: a float a warp), so
// the sums are the same on every run of a call, whatever MERGE_LOADS. Loads
// stop at the last split: a call of few splits runs few instructions, and
// the registers leave room for many rows at once. PRIOR: the parts are the
// previous kernel's (prior_wait, once the row's indices are worked out).
template <int THREADS_C>
__device__ __forceinline__ void combine_sync() {
  if (THREADS_C == 32) __syncwarp(); else __syncthreads();
}
template <int MERGE_LOADS, bool PRIOR, int THREADS_C, class P>
__device__ __forceinline__ void combine_row(const P& p, i64 row, float* sW, float* sR, float4* sY) {
  constexpr int WARPS_C = THREADS_C / 32;
  // a warp's row: a lane a column group, every split (SG 1)
  constexpr int C4 = COMBINE_C4, CW = C4 < THREADS_C ? C4 : THREADS_C;
  constexpr int SG = THREADS_C == 32 ? 1 : THREADS_C / CW;
  static_assert(THREADS_C != 32 || (C4 <= 32 && MERGE_LOADS >= COMBINE_WARP_SPLITS), "a warp's row in one batch");
  const int tid = threadIdx.x % THREADS_C, cw = tid % CW, sg = tid / CW;
  const i64 all_rows = (i64)p.batch * p.heads_q * p.seqlen_q;  // (B, Hq, Sq)
  const int i = row % p.seqlen_q, h = row / p.seqlen_q % p.heads_q, b = row / p.seqlen_q / p.heads_q;
  const int splits = p.num_splits;
  const i64 part_stride = all_rows * ${v_padded};            // floats from one split's part to the next
  // the addresses in registers before the wait (held, not read again from
  // the parameters): a parameter's first read misses the constant cache, a
  // round trip to L2 that would follow the wait
  const float* const parts = held((const float*)p.o_part + row * ${v_padded});  // split 0's of the row
  const float* const lse = held((const float*)p.lse_part + row);
  u16* const out = held((u16*)p.o + b * p.o_sb + (i64)i * p.o_ss + h * p.o_sh);
  float* const lse_out = held((float*)p.lse);
  const bool first_round_mine = sg < SG && 4 * cw < ${v_dim};
  const float* first_part = parts + 4 * cw;
  if (PRIOR) {
    // the lines read first, into L2 while the step runs (its stores then
    // update them there): the reads after the wait find them, and their
    // pages' translations, at hand
    if (first_round_mine && sg < splits) prefetch_l2(first_part + sg * part_stride);
    if (tid < splits) prefetch_l2(lse + tid * all_rows);
    prior_wait();  // the step's parts written
  }
  float4 z[MERGE_LOADS];
#pragma unroll
  for (int n = 0; n < MERGE_LOADS; ++n)
    if (first_round_mine && sg + n * SG < splits) z[n] = __ldcg((const float4*)(first_part + (sg + n * SG) * part_stride));
  // the weights: m over the block (warps, then the warps' maxima in order), then l
  float m = FG_NEG_INF;
  for (int s = tid; s < splits; s += THREADS_C) {
    const float x = __ldcg(lse + s * all_rows);
    sW[s] = x;
    m = fmaxf(m, x);
  }
#pragma unroll
  for (int d = 16; d > 0; d /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, d));
  if (tid % 32 == 0) sR[tid / 32] = m;
  combine_sync<THREADS_C>();
  m = sR[0];
#pragma unroll
  for (int w = 1; w < WARPS_C; ++w) m = fmaxf(m, sR[w]);
  float l = 0.f;
  for (int s = tid; s < splits; s += THREADS_C) {  // the thread's own entries of sW
    const float w = sW[s] == FG_NEG_INF ? 0.f : fast_exp2(sW[s] - m);  // m finite where lse2 is
    sW[s] = w;
    l += w;
  }
#pragma unroll
  for (int d = 16; d > 0; d /= 2) l += __shfl_xor_sync(0xffffffffu, l, d);
  combine_sync<THREADS_C>();  // every warp has read sR's maxima
  if (tid % 32 == 0) sR[tid / 32] = l;
  combine_sync<THREADS_C>();
  l = 0.f;
#pragma unroll
  for (int w = 0; w < WARPS_C; ++w) l += sR[w];
  const float inv = l > 0.f ? 1.f / l : 0.f;
  for (int c0 = 0; c0 < C4; c0 += CW) {  // one round where SG > 1
    const int c = c0 + cw;
    const bool mine = sg < SG && 4 * c < ${v_dim};
    float4 y = make_float4(0.f, 0.f, 0.f, 0.f);
    const float* part = parts + 4 * c;
    if (THREADS_C == 32 && mine) {
      // every split's part is in (z[s]): the block's split groups' sums
      // (splits g, g + COMBINE_SG, ...), then the groups in order, as a
      // block's threads add them, so either way gives the same bits
#pragma unroll
      for (int g = 0; g < COMBINE_SG; ++g) {
        float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int s = g; s < MERGE_LOADS; s += COMBINE_SG)
          if (s < splits) {
            const float w = sW[s];
            x.x += w * z[s].x, x.y += w * z[s].y, x.z += w * z[s].z, x.w += w * z[s].w;
          }
        if (g == 0) y = x;
        else y.x += x.x, y.y += x.y, y.z += x.z, y.w += x.w;
      }
    }
    for (int s0 = sg; THREADS_C > 32 && mine && s0 < splits; s0 += SG * MERGE_LOADS) {
      if (c0 > 0 || s0 > sg) {  // the first batch of the first round is in
#pragma unroll
        for (int n = 0; n < MERGE_LOADS; ++n)
          if (s0 + n * SG < splits) z[n] = __ldcg((const float4*)(part + (s0 + n * SG) * part_stride));
      }
#pragma unroll
      for (int n = 0; n < MERGE_LOADS; ++n)
        if (s0 + n * SG < splits) {  // a split without keys: weight 0, its part 0
          const float w = sW[s0 + n * SG];
          y.x += w * z[n].x, y.y += w * z[n].y, y.z += w * z[n].z, y.w += w * z[n].w;
        }
    }
    if (SG > 1) {  // the split groups' sums, in group order, by group 0
      if (mine) sY[sg * CW + cw] = y;
      combine_sync<THREADS_C>();
      if (!mine || sg > 0) continue;
#pragma unroll
      for (int q = 1; q < SG; ++q) {
        const float4 x = sY[q * CW + cw];
        y.x += x.x, y.y += x.y, y.z += x.z, y.w += x.w;
      }
    } else if (!mine) {
      continue;
    }
    *(u32*)(out + 4 * c) = pack2(y.x * inv, y.y * inv);
    *(u32*)(out + 4 * c + 2) = pack2(y.z * inv, y.w * inv);
    if (c == 0 && lse_out) lse_out[row] = l > 0.f ? (m + log2f(l)) * 0.69314718055994531f : FG_NEG_INF;
  }
}

// The combine kernel, after the step's (its programmatic dependent on
// sm_90): a thread block per query row, or where p.combine_row_warps (rows
// of at most 128 columns, at most COMBINE_WARP_SPLITS splits) a warp per
// row, COMBINE_THREADS / 32 rows a block (every split's loads at once, and
// no barrier across the block: the rows' round trips overlap, and a step of
// many rows needs a quarter of the blocks). Rows of at most 256
// columns (plain decoding: few rows, up to 128 splits) load 16 splits a
// group at once; wider ones (latent caches: many rows of 512, few splits)
// 8, in 64 registers, so that 8 blocks fit an SM.
extern "C" __global__ void __launch_bounds__(COMBINE_THREADS, ${v_padded} / 4 < COMBINE_THREADS ? 5 : 8)
${name}(const ${params} p) {
  static_assert(MAX_SPLITS / (COMBINE_THREADS / 32) >= COMBINE_WARP_SPLITS, "a warp's weights fit its share of sW");
  __shared__ float sW[MAX_SPLITS];                           // split s's weight exp2(lse2 - m)
  __shared__ float sR[COMBINE_THREADS / 32];                 // the warps' maxima, then sums
  __shared__ float4 sY[COMBINE_SG * COMBINE_CW];
  if (COMBINE_C4 <= 32 && p.combine_row_warps) {
    const int w = threadIdx.x / 32;
    const i64 row = (i64)blockIdx.x * (COMBINE_THREADS / 32) + w;
    if (row >= (i64)p.batch * p.heads_q * p.seqlen_q) return;
    // (wider rows never come here: the block's way, so that the warp's is not built for them)
    combine_row<COMBINE_WARP_SPLITS, true, (COMBINE_C4 <= 32 ? 32 : COMBINE_THREADS)>(
        p, row, sW + w * (MAX_SPLITS / (COMBINE_THREADS / 32)), sR + w, sY);  // (a warp's row: no sY)
  } else {
    combine_row<(COMBINE_SG > 1 ? 16 : 8), true, COMBINE_THREADS>(p, blockIdx.x, sW, sR, sY);
  }
}

// A counted step (given turn counters, p.split_counters) is one kernel:
// after the splits' thread blocks come a query row's each, which waits for
// the row's splits and adds their parts. A split's block, its parts stored,
// counts itself on each of its rows (count_split); a row's block waits for
// its count to reach the splits, sets it back to 0 for the next call and
// adds the parts (combine_counted). The fences make the parts visible
// before their count, and the count before their reads. There are fewer
// rows' blocks than SMs (kv_cache_call.c), so whatever the order blocks
// start in, one SM at least runs splits' blocks, which wait for nothing:
// every split ends. scratch: COMBINE_SCRATCH bytes of shared memory
// (16-byte aligned).
#define COMBINE_SCRATCH (4 * MAX_SPLITS + 16 + 16 * COMBINE_SG * COMBINE_CW)
template <class P>
__device__ __forceinline__ void count_split(const P& p, int b, int hk, int row0, int block_rows) {
  __threadfence();
  __syncthreads();  // every thread's parts stored and fenced
  for (int r = threadIdx.x; r < block_rows && row0 + r < p.rows; r += blockDim.x) {
    const int pr = row0 + r, i = pr / p.group, h = hk * p.group + pr % p.group;
    atomicAdd((int*)p.split_counters + ((i64)b * p.heads_q + h) * p.seqlen_q + i, 1);
  }
}
template <class P> __device__ __forceinline__ void combine_counted(const P& p, i64 row, char* scratch) {
  static_assert(MAX_SPLITS % 4 == 0 && COMBINE_THREADS <= 128, "the scratch's float4s stay 16-byte aligned");
  float* const sW = (float*)scratch;
  float* const sR = sW + MAX_SPLITS;  // 4 floats: a warp's each
  float4* const sY = (float4*)(sR + 4);
  if (threadIdx.x == 0) {
    int* const count = (int*)p.split_counters + row;
    int done;
    while (true) {
      asm volatile("ld.acquire.gpu.b32 %0, [%1];" : "=r"(done) : "l"(count) : "memory");
      if (done >= p.num_splits) break;
      __nanosleep(100);
    }
    *count = 0;  // every split has counted: none reads it again in this call
    __threadfence();
  }
  __syncthreads();
  combine_row<8, false, COMBINE_THREADS>(p, row, sW, sR, sY);  // (16 loads at once: 70 more registers in the step kernel)
}
]], { name = name, v_dim = v_dim, v_padded = v_padded, threads = p.combine_threads,
       warp_splits = p.combine_warp_splits, params = params or "fg_decode_params" })
end

-- The copies of a tile's rows of the named tensors (k, v) into shared
-- memory (s<K>, s<V>), zero past the sequence's keys: the defines of their
-- chunks (prefix_CHUNKS, prefix_PER_THREAD) and the loop; w: lib_width's
-- description of the rows. The loop reads the names load_kv takes: p, b,
-- hk, n0, keys, pages, tid. Over a contiguous cache a tile's rows are
-- found from one base a tensor, its 64-bit products taken once a tile, not
-- once a chunk (they were most of a lone block's instructions a tile:
-- decode-notes, "v22").
local loop = [[
  if (p.block_table) {
${heads}#pragma unroll
    for (int n = 0; n < ${per_thread}; ++n) {
      const int c = n * THREADS + tid, r = c / ${chunks}, k = c % ${chunks}, j = n0 + r;
      if ((BLOCK_N * ${chunks}) % THREADS == 0 || c < BLOCK_N * ${chunks}) {
        const bool inside = j < keys && k * 8 < ${dim};
        i64 unit = pages[r], row = p.page_shift >= 0 ? j & (p.page_size - 1) : j % p.page_size;
        if (!inside) unit = row = 0;
${paged_sources}        const u32 at = ${at};
${copies}      }
    }
  } else {
${bases}#pragma unroll
    for (int n = 0; n < ${per_thread}; ++n) {
      const int c = n * THREADS + tid, r = c / ${chunks}, k = c % ${chunks}, j = n0 + r;
      if ((BLOCK_N * ${chunks}) % THREADS == 0 || c < BLOCK_N * ${chunks}) {
        const bool inside = j < keys && k * 8 < ${dim};  // else the tile's first row, read for none
${sources}        const u32 at = ${at};
${copies}      }
    }
  }
]]
local define = "#define ${chunks} (${padded} / 8)\n"
               .. "#define ${per_thread} ((BLOCK_N * ${chunks} + THREADS - 1) / THREADS)\n"
local function head(x)  -- the KV head's columns
  return text.fill("    const u16* const ${x}_head = (const u16*)p.${x} + hk * p.${x}_sh;\n", { x = x })
end
local function paged_source(x)
  return text.fill("        const u16* g${x} = ${x}_head + unit * p.${x}_sb + row * p.${x}_ss + k * 8;\n",
                   { x = x })
end
local function base(x)  -- the tile's first row of sequence b
  return text.fill("    const u16* const ${x}_tile = (const u16*)p.${x} + b * p.${x}_sb + (i64)n0 * p.${x}_ss"
                   .. " + hk * p.${x}_sh;\n", { x = x })
end
local function source(x)
  return text.fill("        const u16* g${x} = ${x}_tile + (inside ? r * p.${x}_ss + k * 8 : 0);\n", { x = x })
end
local function copy(x)
  return text.fill("        copy16_read_once(s${X} + at, g${x}, inside ? 16 : 0);\n", { x = x, X = x:upper() })
end
function M.tile_copies(w, names, prefix)
  local vars = { chunks = prefix .. "_CHUNKS", per_thread = prefix .. "_PER_THREAD", dim = w.name,
                 padded = w.padded, at = width.at(w, "r", "k"), sources = "", paged_sources = "",
                 heads = "", bases = "", copies = "" }
  for _, x in ipairs(names) do
    vars.heads = vars.heads .. head(x)
    vars.paged_sources = vars.paged_sources .. paged_source(x)
    vars.bases = vars.bases .. base(x)
    vars.sources = vars.sources .. source(x)
    vars.copies = vars.copies .. copy(x)
  end
  return text.fill(define, vars), text.fill(loop, vars)
end

return M
