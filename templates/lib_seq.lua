-- The sequence a thread block works on. A dense call's batch entries all
-- have the call's lengths and sit stride_batch apart. With packed sequences
-- (spec varlen), sequence b holds query rows cu_seqlens_q[b] ..
-- cu_seqlens_q[b+1]-1 of the packed tensors and key rows cu_seqlens_k[b] ..
-- cu_seqlens_k[b+1]-1, of which its queries see the first seqused_k[b] (all
-- without seqused_k), with the diagonal aligned per sequence; b == batch is
-- the key rows after the last sequence, which no query sees. Bounds are
-- clamped to the packed tensors, so no cu_seqlens a caller passes makes a
-- kernel touch memory outside them.
-- Over a KV cache (spec kv_cache, the forward only) the keys are sequence
-- b's cached ones and the call's new ones (lib_kv_cache's sequence_keys,
-- which the kernel defines first), the diagonal aligned per sequence; the
-- maps are dense, a paged cache's read by the kernel's own loads.
-- Emits `struct Seq`, set by init(p, b) from either pass's launch arguments:
--   b            the sequence (dropout's counter, a layout's blocks)
--   seqlen_q     its query rows; seqlen_k the keys they see; rows_k the key
--                rows it holds (dK and dV are written for all, zero past
--                seqlen_k); diag_offset: key j is on query i's diagonal when
--                j == i + diag_offset. lib_mask reads these three by name.
--   q_at(sb, ss, i), k_at(sb, ss, j)  element offset of query row i (key
--                row j) in a tensor of batch and sequence strides sb, ss
--   stat(p, h, i)  index of (head h, query row i) in the row statistics
--                (lse, D) and the dQ accumulator's rows
--   map_q(i), map_k(j), map_b  a tensor map's sequence and batch coordinates
--                of query row i (key row j): dense maps are (D, S, H, B),
--                packed ones (D, total, H, 1)
--   keep(s), kept(s)  (packed only) the struct written to and read back
--                from 7 ints
local M = {}

local text = import("lib_text")

local dense = [[
struct Seq {
  int b, seqlen_q, seqlen_k, rows_k, diag_offset;
  template <class P> __device__ void init(const P& p, int b_) {
    b = b_; seqlen_q = p.seqlen_q; ${lengths}
  }
  __device__ i64 q_at(i64 sb, i64 ss, int i) const { return b * sb + (i64)i * ss; }
  __device__ i64 k_at(i64 sb, i64 ss, int j) const { return b * sb + (i64)j * ss; }
  template <class P> __device__ i64 stat(const P& p, int h, int i) const {
    return ((i64)b * p.heads_q + h) * p.seqlen_q + i;
  }
  __device__ int map_q(int i) const { return i; }
  __device__ int map_k(int j) const { return j; }
  __device__ int map_b() const { return b; }
};
]]

local lengths = {
  dense = "seqlen_k = rows_k = p.seqlen_k; diag_offset = p.diag_offset;",
  cached = "seqlen_k = rows_k = sequence_keys(p, b);\n"
           .. "    diag_offset = p.align_bottom_right ? seqlen_k - seqlen_q : 0;",
}

local packed = [[
struct Seq {
  int b, seqlen_q, seqlen_k, rows_k, diag_offset, q0, k0;
  template <class P> __device__ void init(const P& p, int b_) {
    const int* cu_q = (const int*)p.cu_seqlens_q;
    const int* cu_k = (const int*)p.cu_seqlens_k;
    b = b_;
    const bool tail = b >= p.batch;  // the rows after the last sequence
    q0 = min(max(cu_q[min(b, p.batch)], 0), p.total_q);
    k0 = min(max(cu_k[min(b, p.batch)], 0), p.total_k);
    seqlen_q = tail ? 0 : min(max(cu_q[b + 1], q0), p.total_q) - q0;
    rows_k = (tail ? p.total_k : min(max(cu_k[b + 1], k0), p.total_k)) - k0;
    seqlen_k = tail ? 0 : p.seqused_k ? min(max(((const int*)p.seqused_k)[b], 0), rows_k) : rows_k;
    diag_offset = p.align_bottom_right ? seqlen_k - seqlen_q : 0;
  }
  __device__ i64 q_at(i64 sb, i64 ss, int i) const { (void)sb; return (i64)(q0 + i) * ss; }
  __device__ i64 k_at(i64 sb, i64 ss, int j) const { (void)sb; return (i64)(k0 + j) * ss; }
  template <class P> __device__ i64 stat(const P& p, int h, int i) const {
    return (i64)h * p.total_q + q0 + i;
  }
  __device__ int map_q(int i) const { return q0 + i; }
  __device__ int map_k(int j) const { return k0 + j; }
  __device__ int map_b() const { return 0; }
  // kept in 7 ints (shared memory) and read back, where a loop would
  // otherwise hold it in registers or work it out again
  __device__ void keep(int* s) const {
    s[0] = b; s[1] = seqlen_q; s[2] = seqlen_k; s[3] = rows_k; s[4] = diag_offset; s[5] = q0; s[6] = k0;
  }
  __device__ void kept(const int* s) {
    b = s[0]; seqlen_q = s[1]; seqlen_k = s[2]; rows_k = s[3]; diag_offset = s[4]; q0 = s[5]; k0 = s[6];
  }
};
]]

function M.source(p)
  if p.varlen then return packed end
  return text.fill(dense, { lengths = p.kv_cache and lengths.cached or lengths.dense })
end

-- The rows of the backward's row statistics and dQ accumulator, as its row
-- kernels walk them: (batch, heads_q, seqlen_q), or (1, heads_q, total_q)
-- packed. batch and seqlen are C expressions over the launch arguments p,
-- fields the launch-argument fields whose product counts the rows.
function M.rows(p)
  if p.varlen then return { batch = "1", seqlen = "p.total_q", fields = { "heads_q", "total_q" } } end
  return { batch = "p.batch", seqlen = "p.seqlen_q", fields = { "batch", "heads_q", "seqlen_q" } }
end

return M
