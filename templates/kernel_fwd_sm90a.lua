-- The Hopper forward in progress (docs/hopper-notes.md, step 4): d = 128,
-- no mask. Three warpgroups per 128 query rows. A producer gives up its
-- registers (setmaxnreg) and has one thread issue TMA copies (128-byte
-- swizzled boxes of 64 columns): Q once, then K and V in blocks of 128 keys
-- through a ring of three stages, each with a "full" mbarrier (bytes
-- arrived) and an "empty" one (every consumer thread is done with it). Two
-- consumer warpgroups of 64 rows each take the registers: for block j each
-- issues S_j = Q·K_jᵀ (wgmma from shared memory) and O += P_{j-1}·V_{j-1}
-- (wgmma with P in registers, V transposed from shared memory) together,
-- runs the online softmax of S_j (base 2) while O's wgmmas run, then
-- rescales O and converts P_j in place to the A registers. Not yet a
-- family: test_sm90a checks and times it.
local text = import("lib_text")
local device = import("lib_device")
local isa_for = import("isa")
local sm90a = import("isa_sm90a")

local kernel = [[
struct alignas(64) TensorMap { u64 opaque[16]; };

struct ForwardArgs {
  u16* o;           // (B, Sq, Hq, 128), strides in elements
  float* lse;       // (B, Hq, Sq)
  i64 o_batch, o_seq, o_head;
  int seqlen_q, seqlen_k, heads_q, group;  // group: query heads per key/value head
  float scale_log2;                        // softmax scale · log2(e)
};

#define BLOCK_M 128
#define BLOCK_N 128
#define Q_BYTES (2 * 128 * 128)     // two boxes of 128 rows x 64 columns
#define KV_BYTES (2 * 128 * 128)    // two boxes of 128 rows x 64 columns
#define STAGE_BYTES (2 * KV_BYTES)  // K then V
#define STAGES 3
#define CONSUMER_THREADS 256

// K and V of keys key0..key0+127 into a stage: four boxes, one barrier.
__device__ __forceinline__ void load_kv(const void* k_map, const void* v_map, u32 stage, u32 bar,
                                        int key0, int hk, int b) {
  mbar_arrive_expect(bar, STAGE_BYTES);
  for (int box = 0; box < 2; ++box) {
    tma_load_4d(stage + box * (KV_BYTES / 2), k_map, bar, 64 * box, key0, hk, b);
    tma_load_4d(stage + KV_BYTES + box * (KV_BYTES / 2), v_map, bar, 64 * box, key0, hk, b);
  }
}

__device__ __forceinline__ void hold64(float* x) {
#pragma unroll
  for (int i = 0; i < 64; ++i) wgmma_hold(x[i]);
}

// S = Q·Kᵀ (64 x 128) for a warpgroup's 64 rows: the head dim in two boxes of
// four 16-wide steps. Issued, not waited for.
__device__ __forceinline__ void s_gemm(float* sc, u32 q_rows, u32 k_tile) {
#pragma unroll
  for (int box = 0; box < 2; ++box)
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const u64 dq = smem_desc_sw128(q_rows + box * (Q_BYTES / 2) + 32 * k, 16, 1024);
      const u64 dk = smem_desc_sw128(k_tile + box * (KV_BYTES / 2) + 32 * k, 16, 1024);
      ${wgmma_ss}<0, 0>(sc, dq, dk, box | k);
    }
}

// O += P·V, 16 keys at a time, V transposed from shared memory. Issued, not
// waited for.
__device__ __forceinline__ void pv_gemm(float* o, const u32* p, u32 v_tile) {
#pragma unroll
  for (int kc = 0; kc < 8; ++kc) {
    const u64 dv = smem_desc_sw128(v_tile + 2048 * kc, KV_BYTES / 2, 1024);
    ${wgmma_rs}<1>(o, p + 4 * kc, dv, 1);
  }
}

// Online softmax of block j for the thread's two rows (lane/4 and lane/4 + 8),
// in base 2: sc becomes P (unnormalised), m and l move on, alpha is the factor
// O must be rescaled by. Keys past the end (zeros from TMA) are masked.
__device__ __forceinline__ void softmax_block(float* sc, int j, const ForwardArgs& a, float* m,
                                              float* l, float* alpha, int lane) {
  const int key0 = j * BLOCK_N + 2 * (lane % 4);
  if (j * BLOCK_N + BLOCK_N > a.seqlen_k) {
#pragma unroll
    for (int n = 0; n < 16; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        if (key0 + 8 * n + (c & 1) >= a.seqlen_k) sc[4 * n + c] = FG_NEG_INF;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = FG_NEG_INF;
#pragma unroll
    for (int n = 0; n < 16; ++n) mx = fmaxf(mx, fmaxf(sc[4 * n + 2 * r], sc[4 * n + 2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m[r], mx * a.scale_log2);
    const float base = m_new == FG_NEG_INF ? 0.f : m_new;
    alpha[r] = fast_exp2(m[r] - base);
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < 16; ++n)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float& x = sc[4 * n + 2 * r + c];
        x = fast_exp2(x * a.scale_log2 - base);
        sum += x;
      }
    l[r] = l[r] * alpha[r] + sum;
    m[r] = m_new;
  }
}

__device__ __forceinline__ void rescale(float* o, const float* alpha) {
#pragma unroll
  for (int n = 0; n < 16; ++n)
#pragma unroll
    for (int c = 0; c < 4; ++c) o[4 * n + c] *= alpha[c >> 1];
}

// P's accumulator layout is the A-register layout: 16 keys per four registers.
__device__ __forceinline__ void pack_p(const float* sc, u32* p) {
#pragma unroll
  for (int i = 0; i < 32; ++i) p[i] = pack2(sc[2 * i], sc[2 * i + 1]);
}

extern "C" __global__ void __launch_bounds__(384, 1)
fg_fwd_sm90a_${dtype}_d128(const __grid_constant__ TensorMap q_map,
                          const __grid_constant__ TensorMap k_map,
                          const __grid_constant__ TensorMap v_map, const ForwardArgs a) {
  extern __shared__ unsigned char smem[];
  const u32 q_tile = (smem_addr(smem) + 1023u) & ~1023u;
  const u32 stages = q_tile + Q_BYTES;
  // barriers: q, full[2], empty[2]
  const u32 q_bar = stages + STAGES * STAGE_BYTES, full_bar = q_bar + 8;
  const u32 empty_bar = full_bar + 8 * STAGES;
  const int tid = threadIdx.x, group = tid / 128;
  const int m_block = blockIdx.x, h = blockIdx.y, b = blockIdx.z, hk = h / a.group;
  const int n_blocks = (a.seqlen_k + BLOCK_N - 1) / BLOCK_N;

  if (tid == 0) {
    mbar_init(q_bar, 1);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full_bar + 8 * s, 1);
      mbar_init(empty_bar + 8 * s, CONSUMER_THREADS);
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (group == 0) {  // the producer
    regs_lower<24>();
    if (tid == 0) {
      mbar_arrive_expect(q_bar, Q_BYTES);
      for (int box = 0; box < 2; ++box)
        tma_load_4d(q_tile + box * (Q_BYTES / 2), &q_map, q_bar, 64 * box, m_block * BLOCK_M, h, b);
      for (int j = 0; j < n_blocks; ++j) {
        const int s = j % STAGES;
        if (j >= STAGES) mbar_wait(empty_bar + 8 * s, (j / STAGES - 1) & 1);
        load_kv(&k_map, &v_map, stages + s * STAGE_BYTES, full_bar + 8 * s, j * BLOCK_N, hk, b);
      }
    }
    return;
  }

  regs_raise<240>();
  const int ct = tid - 128, warp = ct / 32, lane = tid % 32;  // warp 0..7 of the consumers
  const u32 q_rows = q_tile + (group - 1) * 64 * 128;         // this warpgroup's 64 rows
  float o[64], m[2] = {FG_NEG_INF, FG_NEG_INF}, l[2] = {0.f, 0.f}, alpha[2];
  u32 p[32];  // P of the previous block, as the A registers of O += P·V
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;
  mbar_wait(q_bar, 0);

  // Block 0: S, then its softmax; O starts at zero.
  mbar_wait(full_bar, 0);
  {
    float sc[64];
    wgmma_fence();
    s_gemm(sc, q_rows, stages);
    wgmma_commit();
    wgmma_wait<0>();
    hold64(sc);
    softmax_block(sc, 0, a, m, l, alpha, lane);
    pack_p(sc, p);
  }
  // Block j: S_j = Q·K_jᵀ and O += P_{j-1}·V_{j-1} are issued together; the
  // softmax of S_j runs while O's wgmmas do. O is rescaled once they are done.
  for (int j = 1; j < n_blocks; ++j) {
    const int s = j % STAGES, sp = (j - 1) % STAGES;
    const u32 previous = stages + sp * STAGE_BYTES;
    mbar_wait(full_bar + 8 * s, (j / STAGES) & 1);
    float sc[64];
    wgmma_fence();
    s_gemm(sc, q_rows, stages + s * STAGE_BYTES);
    wgmma_commit();
    pv_gemm(o, p, previous + KV_BYTES);
    wgmma_commit();
    wgmma_wait<1>();
    hold64(sc);
    softmax_block(sc, j, a, m, l, alpha, lane);
    wgmma_wait<0>();
    hold64(o);
    mbar_arrive(empty_bar + 8 * sp);  // this thread is done with block j - 1
    rescale(o, alpha);
    pack_p(sc, p);
  }
  wgmma_fence();
  pv_gemm(o, p, stages + ((n_blocks - 1) % STAGES) * STAGE_BYTES + KV_BYTES);
  wgmma_commit();
  wgmma_wait<0>();
  hold64(o);

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int row = m_block * BLOCK_M + 16 * warp + lane / 4 + 8 * r;
    if (row >= a.seqlen_q) continue;
    const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
    u16* out = a.o + b * a.o_batch + row * a.o_seq + h * a.o_head + 2 * (lane % 4);
#pragma unroll
    for (int n = 0; n < 16; ++n)
      *reinterpret_cast<u32*>(out + 8 * n) = pack2(o[4 * n + 2 * r] * inv, o[4 * n + 2 * r + 1] * inv);
    if (a.lse && lane % 4 == 0)
      a.lse[((i64)b * a.heads_q + h) * a.seqlen_q + row] =
          l[r] > 0.f ? (m[r] + __log2f(l[r])) * 0.69314718056f : FG_NEG_INF;
  }
}
]]

return function(p)
  if p.arch ~= 90 then error("the sm_90a forward is built for sm_90 only") end
  local ss = { sm90a.wgmma(128, p.dtype, false) }
  local rs = { sm90a.wgmma(128, p.dtype, true) }
  local source = table.concat({
    "// flashgen " .. p.generator_version .. ": sm_90a forward (TMA + wgmma), " .. p.dtype
      .. ", d = 128\n",
    device.source, (isa_for(80).prelude(p.dtype)), sm90a.source, ss[2], rs[2],
    text.fill(kernel, { dtype = p.dtype, wgmma_ss = ss[1], wgmma_rs = rs[1] }),
  }, "\n")
  return { source = source, name = "fg_fwd_sm90a_" .. p.dtype .. "_d128" }
end
