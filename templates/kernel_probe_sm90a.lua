-- A probe of the sm_90a building blocks the Hopper kernels stand on, small
-- enough to check every number: one warpgroup loads A (64 x 64) and B
-- (64 x 64) by TMA with 128-byte swizzling, completing on an mbarrier, and
-- computes C = A·B (64 x 64, fp32) with four m64n64k16 wgmmas from shared
-- memory. fg_probe_b_kmajor takes B as (N, K), K contiguous, as S = Q·Kᵀ
-- reads K; fg_probe_b_mnmajor as (K, N), N contiguous, as O = P·V reads V;
-- fg_probe_a_registers reads A into registers instead (from a plain
-- row-major copy in global memory, a_rows), as O = P·V takes P;
-- fg_probe_a_mnmajor takes A as (K, M), M contiguous, as a backward's
-- dQ = dS·K reads dS stored key-major; fg_probe_reduce adds C to what c
-- holds, through shared memory and a bulk reduction, as a backward adds dQ.
-- The descriptors' leading and stride byte offsets are launch arguments, so a
-- test can tell which encoding the hardware reads as intended.
local text = import("lib_text")
local device = import("lib_device")
local sm90a = import("isa_sm90a")

local kernels = [[
// The driver's CUtensorMap: 128 opaque bytes, 64-byte aligned.
struct alignas(64) TensorMap { u64 opaque[16]; };

// A (64 x 16, columns 16k..16k+15) as wgmma takes it from registers, the
// layout of an m16n8k16 A fragment per warp: warp w holds rows 16w..16w+15,
// a lane rows lane/4 and lane/4 + 8 at columns 2(lane%4) and 8 + 2(lane%4),
// two 16-bit values per register.
__device__ __forceinline__ void a_fragment(const u16* a_rows, int k, u32* a) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = 16 * warp + lane / 4, col = 16 * k + 2 * (lane % 4);
  const u32* p = reinterpret_cast<const u32*>(a_rows);
  a[0] = p[(row * 64 + col) / 2];
  a[1] = p[((row + 8) * 64 + col) / 2];
  a[2] = p[(row * 64 + col + 8) / 2];
  a[3] = p[((row + 8) * 64 + col + 8) / 2];
}

template <int TNSP_A, int TNSP_B, bool A_REGISTERS, bool REDUCE>
__device__ __forceinline__ void probe(const TensorMap& a_map, const TensorMap& b_map,
                                      const u16* a_rows, float* c, u32 lead_a, u32 stride_a,
                                      u32 lead_b, u32 stride_b) {
  extern __shared__ unsigned char smem[];
  const u32 a_tile = (smem_addr(smem) + 1023u) & ~1023u;  // 64 x 64, 8 KiB
  const u32 b_tile = a_tile + 8192u;                      // 64 x 64, 8 KiB
  const u32 bar = b_tile + 8192u;
  if (threadIdx.x == 0) {
    mbar_init(bar, 1);
    mbar_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbar_arrive_expect(bar, 16384u);
    tma_load_2d(a_tile, &a_map, bar, 0, 0);
    tma_load_2d(b_tile, &b_map, bar, 0, 0);
  }
  mbar_wait(bar, 0);

  float d[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) d[i] = 0.f;
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    // 16 more along K: 16 more columns of each 128-byte row, or 16 more rows
    // when the operand is MN-major ((K, M) or (K, N)).
    const u64 db = smem_desc_sw128(b_tile + (TNSP_B ? 2048u : 32u) * k, lead_b, stride_b);
    if (A_REGISTERS) {
      u32 a[4];
      a_fragment(a_rows, k, a);
      ${wgmma_rs}<TNSP_B>(d, a, db, 1);
    } else {
      const u64 da = smem_desc_sw128(a_tile + (TNSP_A ? 2048u : 32u) * k, lead_a, stride_a);
      ${wgmma}<TNSP_A, TNSP_B>(d, da, db, 1);
    }
  }
  wgmma_commit();
  wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < 32; ++i) wgmma_hold(d[i]);

  // Accumulator layout: warp w holds rows 16w..16w+15; a lane holds rows
  // lane/4 and lane/4 + 8, columns 8j + 2(lane%4) and the next, for each j.
  // REDUCE: C row-major into the shared memory A and B took (16 KiB), then
  // added to c by one bulk reduction.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* staged = reinterpret_cast<float*>(smem + (a_tile - smem_addr(smem)));
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = 16 * warp + lane / 4 + 8 * h, col = 8 * j + 2 * (lane % 4);
      float* out = REDUCE ? staged : c;
      out[row * 64 + col] = d[4 * j + 2 * h];
      out[row * 64 + col + 1] = d[4 * j + 2 * h + 1];
    }
  if (REDUCE) {
    fence_async_shared();
    __syncthreads();
    if (threadIdx.x == 0) {
      bulk_reduce_add_f32(c, a_tile, 64 * 64 * 4);
      bulk_commit();
      bulk_wait_read();
    }
  }
}

#define FG_PROBE(NAME, TNSP_A, TNSP_B, A_REGISTERS, REDUCE)                                  \
  extern "C" __global__ void __launch_bounds__(128, 1)                                        \
  NAME(const __grid_constant__ TensorMap a_map, const __grid_constant__ TensorMap b_map,      \
       const u16* a_rows, float* c, u32 lead_a, u32 stride_a, u32 lead_b, u32 stride_b) {     \
    probe<TNSP_A, TNSP_B, A_REGISTERS, REDUCE>(a_map, b_map, a_rows, c, lead_a, stride_a,    \
                                               lead_b, stride_b);                             \
  }
FG_PROBE(fg_probe_b_kmajor, 0, 0, false, false)
FG_PROBE(fg_probe_b_mnmajor, 0, 1, false, false)
FG_PROBE(fg_probe_a_registers, 0, 1, true, false)
FG_PROBE(fg_probe_a_mnmajor, 1, 0, false, false)
FG_PROBE(fg_probe_reduce, 0, 0, false, true)
]]

return function(p)
  if p.arch ~= 90 then error("the sm_90a probe is built for sm_90 only") end
  local name, wgmma = sm90a.wgmma(64, p.dtype, false)
  local name_rs, wgmma_rs = sm90a.wgmma(64, p.dtype, true)
  local source = table.concat({
    "// flashgen " .. p.generator_version .. ": sm_90a probe (TMA, mbarrier, wgmma), "
      .. p.dtype .. "\n",
    device.source, sm90a.source, wgmma, wgmma_rs,
    text.fill(kernels, { wgmma = name, wgmma_rs = name_rs }),
  }, "\n")
  return { source = source, name = "fg_probe_sm90a_" .. p.dtype }
end
