-- Which key tiles a query block visits. key_tiles(p) emits `struct KeyTiles`
-- with count, at(it) (the key tile of iteration it), next(it) (the first
-- iteration >= it whose tile lies in [t_lo, t_hi), the mask's range),
-- full(it) (whether a block mask found the mask predicate true on every
-- element of the tile's sparse block: its element test can be skipped) and
-- before(tile) (the iterations ahead of key tile `tile`, where the tiles
-- come in order: dense; else all of them);
-- query_tiles(p) emits the backward's transpose, `struct QueryTiles`, and
-- `struct Steps`, a key block's (query head, query tile) steps;
-- next_key_block(p) the key block that follows one for a query tile.
-- KeyTiles takes either forward launch-argument struct (fg_fwd_params,
-- fg_fwd_tma_params), QueryTiles and Steps either backward's.
local text = import("lib_text")
local mask = import("lib_mask")
local M = {}

-- Shared by the sparse kinds: skip listed tiles outside the mask's range.
-- A layout's list set of batch row b, head h (one shared where the layout
-- has a single batch row or head); an entry's FG_FULL_BLOCK bit marks a
-- block the mask predicate holds on throughout (a block mask's lists).
M.full_block = "#define FG_FULL_BLOCK 0x40000000\n"
local layout_common = M.full_block .. [[
template <class P> __device__ __forceinline__ i64 layout_set(const P& p, int b, int h) {
  return (i64)(p.layout_batch == 1 ? 0 : b) * p.layout_heads + (p.layout_heads == 1 ? 0 : h);
}
]]

local filtered_next = [[
  __device__ int next(int it) const {
    while (it < count) { const int tile = at(it); if (tile >= t_lo && tile < t_hi) break; ++it; }
    return it;
  }
]]

local dense = [[
// dense: every key tile in the mask's range
struct KeyTiles {
  int count, t_lo;
  template <class P> __device__ void init(const P& p, int b, int h, int row0, int lo, int hi) {
    (void)p; (void)b; (void)h; (void)row0; t_lo = lo; count = hi - lo;
  }
  __device__ int at(int it) const { return t_lo + it; }
  __device__ int next(int it) const { return it; }
  __device__ bool full(int it) const { (void)it; return false; }
  __device__ int before(int tile) const { return min(count, max(0, tile - t_lo)); }
};
]]

local layout = [[
// runtime layout: the kept key blocks of this query block, listed by the runtime
struct KeyTiles {
  int count, t_lo, t_hi;
  const int* blocks;
  template <class P> __device__ void init(const P& p, int b, int h, int row0, int lo, int hi) {
    const i64 list = layout_set(p, b, h) * p.layout_blocks_q + row0 / SPARSE_BLOCK_Q;
    count = ((const int*)p.block_count)[list] * TILES_PER_BLOCK;
    blocks = (const int*)p.block_index + list * p.layout_blocks_k;
    t_lo = lo; t_hi = hi;
  }
  __device__ int at(int it) const {
    return (blocks[it / TILES_PER_BLOCK] & ~FG_FULL_BLOCK) * TILES_PER_BLOCK + it % TILES_PER_BLOCK;
  }
  __device__ bool full(int it) const { return blocks[it / TILES_PER_BLOCK] & FG_FULL_BLOCK; }
  __device__ int before(int tile) const { (void)tile; return count; }
]] .. filtered_next .. "};\n"

local butterfly = [[
// butterfly: key block qb ^ x for x in {0} U {2^k : k < BUTTERFLY_FACTORS}, no table
struct KeyTiles {
  int count, t_lo, t_hi, qb;
  template <class P> __device__ void init(const P& p, int b, int h, int row0, int lo, int hi) {
    (void)p; (void)b; (void)h;
    qb = row0 / SPARSE_BLOCK_Q;
    count = (1 + BUTTERFLY_FACTORS) * TILES_PER_BLOCK;
    t_lo = lo; t_hi = hi;
  }
  __device__ int at(int it) const {
    const int k = it / TILES_PER_BLOCK;
    const int block = k == 0 ? qb : (qb ^ (1 << (k - 1)));
    return block * TILES_PER_BLOCK + it % TILES_PER_BLOCK;
  }
  __device__ bool full(int it) const { (void)it; return false; }
  __device__ int before(int tile) const { (void)tile; return count; }
]] .. filtered_next .. "};\n"

function M.key_tiles(p)
  if p.sparsity == "none" then return dense end
  local consts = text.fill([[
#define SPARSE_BLOCK_Q ${bq}
#define TILES_PER_BLOCK ${tpb}
#define BUTTERFLY_FACTORS ${factors}
]], { bq = p.sparse_block_q, tpb = p.sparse_block_k // p.block_n, factors = p.butterfly_factors })
  if p.sparse_block_k % p.block_n ~= 0 or p.sparse_block_q % p.block_m ~= 0 then
    error("tiles " .. p.block_m .. "x" .. p.block_n .. " do not divide sparse blocks "
          .. p.sparse_block_q .. "x" .. p.sparse_block_k)
  end
  if p.sparsity == "layout" then return consts .. layout_common .. layout end
  if p.sparsity == "butterfly" then return consts .. butterfly end
  error("unknown sparsity '" .. tostring(p.sparsity) .. "'")
end

-- The forward's query block: a thread block's blockIdx.x, or (`walk`) the
-- query block a thread block that walks several has reached -> (query
-- block m_block, head h, batch b), the last query blocks first (under a
-- causal mask they have the most keys), seq its sequence (lib_seq's Seq),
-- hk its key/value head, row0 and rows_valid its rows, and `tiles`, the
-- key tiles it visits within the mask's range [t_lo, t_hi). Expects the
-- launch arguments as p, BLOCK_M, BLOCK_N and lib_seq's source. With
-- `sections`, the heads (of all batches) come in sections of
-- p.section_heads, and within a section the query blocks of its heads go
-- side by side, the last ones first: thread blocks started in order then
-- go longest first over as many heads as the launch arguments chose (as
-- many as keep K and V in L2).
-- A walk names its unit and the unit's part (`walk.unit`, `walk.part`): a
-- unit is a query block, or where p.unit_blocks is 2 (`walk.pairs`: causal
-- calls) the pair of blocks M-1-i then i of a head, whose keys together
-- are as many for every i (the middle block of an odd count alone), so
-- units walked in turn keep thread blocks evenly loaded. A step of the walk
-- that has no block of its own (a pair's missing half, rows past a packed
-- sequence's) has `owned` false: it reads and writes nothing. Without a
-- walk such a thread block returns.
function M.forward_block(p, sections, walk)
  local index = walk and walk.unit or "blockIdx.x"
  local pairs = walk and walk.pairs
  local units = pairs and "p.units_per_head" or "p.num_m_blocks"
  -- the query block of a unit whose place among its head's is i
  local function m_block(i)
    return pairs and text.fill([[
// a pair of blocks of one head: M-1-i, then i (none where they are one)
const int pair = ${i};
const int m_block = ${part} == 0 ? p.num_m_blocks - 1 - pair : pair;
const bool own_half = ${part} == 0 || pair != p.num_m_blocks - 1 - pair;]], { i = i, part = walk.part })
      or "const int m_block = p.num_m_blocks - 1 - " .. i .. ";"
  end
  local order = sections and text.fill([[
// block -> (query block, head, batch): sections of p.section_heads heads,
// in each the last query blocks first, the section's heads side by side
const int section_blocks = p.section_heads * ${units};
const int head0 = ${index} / section_blocks * p.section_heads;
const int in_section = ${index} % section_blocks;
const int section_heads = min(p.section_heads, p.heads_q * p.batch - head0);
${m_block}
const int bh = head0 + in_section % section_heads;
const int h = bh % p.heads_q, b = bh / p.heads_q;]], { index = index, units = units,
                                                      m_block = m_block("in_section / section_heads") })
    or text.fill([[
// block -> (query block, head, batch); the last query blocks first, as
// under a causal mask they have the most keys
int bid = ${index};
${m_block}
bid /= ${units};
const int h = bid % p.heads_q, b = bid / p.heads_q;]], { index = index, units = units,
                                                        m_block = m_block("bid % " .. units) })
  local owned = walk and table.concat({ pairs and "own_half" or "true",
    p.varlen and "row0 < seq.seqlen_q" or nil }, " && ")
  return order .. text.fill([[

Seq seq;
seq.init(p, b);
const int hk = h / (p.heads_q / p.heads_kv);  // GQA: shared key/value head
const int row0 = m_block * BLOCK_M;
${short_return}const int rows_valid = min(BLOCK_M, seq.seqlen_q - row0);
(void)rows_valid;
// keys this block may see, as a range of key tiles
${key_range}const int t_lo = n_lo / BLOCK_N;
const int t_hi = n_hi > n_lo ? (n_hi + BLOCK_N - 1) / BLOCK_N : t_lo;
KeyTiles tiles;
tiles.init(p, b, h, row0, t_lo, t_hi);]], {
    key_range = mask.key_range(p.mask, "seq"),
    short_return = owned and "const bool owned = " .. owned .. ";  // a block of its own\n"
                   or p.varlen and "if (row0 >= seq.seqlen_q) return;  // past its packed sequence's rows\n"
                   or "" })
end

-- The backward's view, transposed: which query tiles (BLOCK_M rows) a key
-- block visits. `struct QueryTiles` has the same interface as KeyTiles, with
-- the range [t_lo, t_hi) coming from the mask's query range.
local query_dense = [[
struct QueryTiles {
  int count, t_lo;
  template <class P> __device__ void init(const P& p, int b, int h, int n0, int lo, int hi) {
    (void)p; (void)b; (void)h; (void)n0; t_lo = lo; count = hi - lo;
  }
  __device__ int at(int it) const { return t_lo + it; }
  __device__ int next(int it) const { return it; }
  __device__ bool full(int it) const { (void)it; return false; }
};
]]

local query_layout = [[
// runtime layout: the query blocks that keep this key block, listed by the runtime
struct QueryTiles {
  int count, t_lo, t_hi;
  const int* blocks;
  template <class P> __device__ void init(const P& p, int b, int h, int n0, int lo, int hi) {
    const i64 list = layout_set(p, b, h) * p.layout_blocks_k + n0 / SPARSE_BLOCK_K;
    count = ((const int*)p.query_count)[list] * Q_TILES_PER_BLOCK;
    blocks = (const int*)p.query_index + list * p.layout_blocks_q;
    t_lo = lo; t_hi = hi;
  }
  __device__ int at(int it) const {
    return (blocks[it / Q_TILES_PER_BLOCK] & ~FG_FULL_BLOCK) * Q_TILES_PER_BLOCK + it % Q_TILES_PER_BLOCK;
  }
  __device__ bool full(int it) const { return blocks[it / Q_TILES_PER_BLOCK] & FG_FULL_BLOCK; }
]] .. filtered_next .. "};\n"

local query_butterfly = [[
// butterfly: the pattern is symmetric, so key block kb is seen by query
// blocks kb ^ x for x in {0} U {2^k : k < BUTTERFLY_FACTORS}
struct QueryTiles {
  int count, t_lo, t_hi, kb;
  template <class P> __device__ void init(const P& p, int b, int h, int n0, int lo, int hi) {
    (void)p; (void)b; (void)h;
    kb = n0 / SPARSE_BLOCK_K;
    count = (1 + BUTTERFLY_FACTORS) * Q_TILES_PER_BLOCK;
    t_lo = lo; t_hi = hi;
  }
  __device__ int at(int it) const {
    const int k = it / Q_TILES_PER_BLOCK;
    const int block = k == 0 ? kb : (kb ^ (1 << (k - 1)));
    return block * Q_TILES_PER_BLOCK + it % Q_TILES_PER_BLOCK;
  }
  __device__ bool full(int it) const { (void)it; return false; }
]] .. filtered_next .. "};\n"

-- (query head, query tile) steps of one key block: the heads that share
-- its key/value head in turn, each through the query tiles that see the keys.
local steps = [[
struct Steps {
  QueryTiles tiles;  // its range [t_lo, t_hi) is the mask's, the same for every head
  int b, h, h_end, it, m, n0;
  template <class P> __device__ void start(const P& p, int b_, int h_first, int heads, int n0_, int lo, int hi) {
    b = b_; h = h_first; h_end = h_first + heads; n0 = n0_;
    tiles.init(p, b, h, n0, lo, hi);
    it = tiles.next(0);
    settle(p);
  }
  template <class P> __device__ void settle(const P& p) {
    while (it >= tiles.count && ++h < h_end) {
      tiles.init(p, b, h, n0, tiles.t_lo, tiles.t_hi);
      it = tiles.next(0);
    }
    m = h < h_end ? tiles.at(it) : 0;
  }
  __device__ bool valid() const { return h < h_end; }
  __device__ bool full() const { return tiles.full(it); }
  template <class P> __device__ void advance(const P& p) { it = tiles.next(it + 1); settle(p); }
};
]]

local function query_tiles(p)
  if p.sparsity == "none" then return query_dense end
  if p.sparse_block_k % p.block_n ~= 0 or p.sparse_block_q % p.block_m ~= 0 then
    error("tiles " .. p.block_m .. "x" .. p.block_n .. " do not divide sparse blocks "
          .. p.sparse_block_q .. "x" .. p.sparse_block_k)
  end
  local consts = text.fill([[
#define SPARSE_BLOCK_K ${bk}
#define Q_TILES_PER_BLOCK ${tpb}
#define BUTTERFLY_FACTORS ${factors}
]], { bk = p.sparse_block_k, tpb = p.sparse_block_q // p.block_m, factors = p.butterfly_factors })
  if p.sparsity == "layout" then return consts .. layout_common .. query_layout end
  if p.sparsity == "butterfly" then return consts .. query_butterfly end
  error("unknown sparsity '" .. tostring(p.sparsity) .. "'")
end

-- Dense, the same steps with fewer registers. A head's steps may start at
-- query tile `first` of lo..hi - 1 and wrap round past hi - 1 to lo; its
-- steps are then counted by the caller (advance(p, steps taken)), which
-- costs no register of its own.
local steps_dense = [[
struct Steps {
  int h, h_end, m, t_lo, t_hi;
  template <class P> __device__ void start(const P& p, int b, int h_first, int heads, int n0, int lo, int hi,
                                           int first = -1) {
    (void)p; (void)b; (void)n0;
    h_end = h_first + heads; h = lo < hi ? h_first : h_end; t_lo = lo; t_hi = hi;
    m = first < lo ? lo : first;
  }
  __device__ bool valid() const { return h < h_end; }
  __device__ bool full() const { return false; }
  // whether the head's next step is query tile m + 1 (first: the tile its
  // steps start at, where they wrap round)
  __device__ bool continues(int first = -1) const { return m + 1 < t_hi && m + 1 != first; }
  // and whether its previous step was query tile m - 1
  __device__ bool follows(int first = -1) const { return m > t_lo && m != first; }
  template <class P> __device__ void advance(const P& p) {
    (void)p;
    if (++m == t_hi) m = t_lo, ++h;
  }
  template <class P> __device__ void advance(const P& p, int taken) {
    (void)p;
    if (++m == t_hi) m = t_lo;
    if (taken % (t_hi - t_lo) == 0) ++h;
  }
};
]]

function M.query_tiles(p)
  return query_tiles(p) .. (p.sparsity == "none" and steps_dense or steps)
end

-- Dense steps whose bounds lo, hi wait in shared memory (two ints at `at`,
-- stored before the loop), read at the start and where a head's steps end:
-- for a loop whose registers have no room for two that change once a block.
-- Expects ld_shared_u32.
M.shared_steps = [[
struct SharedSteps {
  int h, h_end, m;
  u32 at;
  __device__ void start(u32 at_, int h_first, int heads) {
    at = at_;
    const int lo = (int)ld_shared_u32(at), hi = (int)ld_shared_u32(at + 4);
    h_end = h_first + heads; h = lo < hi ? h_first : h_end; m = lo;
  }
  __device__ bool valid() const { return h < h_end; }
  __device__ bool full() const { return false; }
  template <class P> __device__ void advance(const P& p) {
    (void)p;
    if (++m == (int)ld_shared_u32(at + 4)) m = (int)ld_shared_u32(at), ++h;
  }
};
]]

-- next_key_block(p, b, h, m, n): of the key blocks (BLOCK_N keys) after n,
-- the first that the sparsity keeps for query tile m (BLOCK_M rows) of batch
-- row b, head h;
-- p.num_n_blocks or more where none. Masks are left to the caller: the key
-- blocks a mask lets a query tile see are a range. Expects query_tiles(p).
local next_dense = [[
template <class P> __device__ int next_key_block(const P& p, int b, int h, int m, int n) {
  (void)p; (void)b; (void)h; (void)m;
  return n + 1;
}
]]

local next_layout = [[
template <class P> __device__ int next_key_block(const P& p, int b, int h, int m, int n) {
  if ((n + 1) % K_TILES_PER_BLOCK) return n + 1;  // within n's sparse block
  const i64 list = layout_set(p, b, h) * p.layout_blocks_q + m / Q_TILES_PER_BLOCK;
  const int count = ((const int*)p.block_count)[list], kb = n / K_TILES_PER_BLOCK;
  const int* blocks = (const int*)p.block_index + list * p.layout_blocks_k;  // ascending
  for (int i = 0; i < count; ++i) {
    const int block = blocks[i] & ~FG_FULL_BLOCK;
    if (block > kb) return block * K_TILES_PER_BLOCK;
  }
  return p.num_n_blocks;
}
]]

local next_butterfly = [[
template <class P> __device__ int next_key_block(const P& p, int b, int h, int m, int n) {
  (void)b; (void)h;
  if ((n + 1) % K_TILES_PER_BLOCK) return n + 1;  // within n's sparse block
  const int qb = m / Q_TILES_PER_BLOCK, kb = n / K_TILES_PER_BLOCK;
  int next = p.num_n_blocks;  // none
  for (int k = -1; k < BUTTERFLY_FACTORS; ++k) {  // qb, then qb ^ 2^k
    const int block = k < 0 ? qb : qb ^ (1 << k);
    if (block > kb && (i64)block * K_TILES_PER_BLOCK < next) next = block * K_TILES_PER_BLOCK;
  }
  return next;
}
]]

function M.next_key_block(p)
  if p.sparsity == "none" then return next_dense end
  local consts = text.fill("#define K_TILES_PER_BLOCK ${tpb}\n", { tpb = p.sparse_block_k // p.block_n })
  if p.sparsity == "layout" then return consts .. next_layout end
  if p.sparsity == "butterfly" then return consts .. next_butterfly end
  error("unknown sparsity '" .. tostring(p.sparsity) .. "'")
end

return M
