-- Benchmark kernels (flashgen bench --philox): does the dropout's Philox work
-- overlap the tensor-core work on this GPU? Three kernels run the same loop:
-- fg_philox_mma only the MMAs, fg_philox_rng only the Philox calls, and
-- fg_philox_both both in the same warps. Each round holds the mix of one key
-- tile of the forward kernel per warp (two 16-row tiles, 64 keys, head dim d):
-- 2d m16n8k16 MMAs (S = Q·Kᵀ and O += P·V) and 4 Philox calls per thread.
-- If the two kinds of work overlapped, "both" would take about as long as the
-- longer of the two alone; if they compete, as long as their sum.
local text = import("lib_text")
local device = import("lib_device")
local dropout = import("lib_dropout")
local isa_for = import("isa")

local kernels = [[
#define MMAS_PER_ROUND ${mmas}
#define CALLS_PER_ROUND 4

struct PhiloxKeys { u32 k[20]; };

// MODE: 1 MMAs, 2 Philox calls, 3 both. The results feed a store that never
// happens (the test cannot be decided at compile time), so nothing is elided.
template <int MODE>
__device__ __forceinline__ void philox_bench(const PhiloxKeys& keys, float* sink, int rounds) {
  float acc[16][4];
#pragma unroll
  for (int j = 0; j < 16; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  const u32 a[4] = {threadIdx.x, threadIdx.x ^ 1u, threadIdx.x ^ 2u, threadIdx.x ^ 3u};
  u32 x = 0;
  for (int r = 0; r < rounds; ++r) {
    if (MODE & 1) {
#pragma unroll
      for (int m = 0; m < MMAS_PER_ROUND; ++m) mma_16x8x16(acc[m % 16], a, (u32)m, (u32)r);
    }
    if (MODE & 2) {
#pragma unroll
      for (int c = 0; c < CALLS_PER_ROUND; ++c) {
        u32 out[4];
        philox4x32_10((u32)(r * CALLS_PER_ROUND + c), threadIdx.x, blockIdx.x, 0u, keys.k, out);
        x ^= out[0] ^ out[1] ^ out[2] ^ out[3];
      }
    }
  }
  float s = __uint_as_float(x & 0x007FFFFFu);
#pragma unroll
  for (int j = 0; j < 16; ++j) s += acc[j][0] + acc[j][1] + acc[j][2] + acc[j][3];
  if (s == -1.f) sink[threadIdx.x] = s;
}

extern "C" __global__ void __launch_bounds__(256)
fg_philox_mma(const PhiloxKeys keys, float* sink, int rounds) {
  philox_bench<1>(keys, sink, rounds);
}
extern "C" __global__ void __launch_bounds__(256)
fg_philox_rng(const PhiloxKeys keys, float* sink, int rounds) {
  philox_bench<2>(keys, sink, rounds);
}
extern "C" __global__ void __launch_bounds__(256)
fg_philox_both(const PhiloxKeys keys, float* sink, int rounds) {
  philox_bench<3>(keys, sink, rounds);
}
]]

return function(p)
  if p.arch < 80 then error("the Philox benchmark needs sm_80 or later (m16n8k16 MMAs)") end
  local isa = isa_for(p.arch)
  local source = table.concat({
    "// flashgen " .. p.generator_version .. ": Philox and tensor-core overlap benchmark, head dim "
      .. p.head_dim .. ", sm_" .. p.arch .. "\n",
    device.source, isa.prelude("bf16"), dropout.device,
    text.fill(kernels, { mmas = 2 * p.head_dim }),
  }, "\n")
  return { source = source, name = "fg_philox_bench_d" .. p.head_dim }
end
