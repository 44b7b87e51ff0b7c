-- Device code every kernel shares: source (fixed-width types, FG_NEG_INF,
-- shared-memory addressing, ldmatrix and the fast exp2) and to_float(dtype).
-- The launch-argument structs come from the host (gen/kernel_params.h) as the
-- params_struct parameter. Expects nothing; every other piece of device code
-- expects its source.
local M = {}

M.source = [[
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;
typedef long long i64;
struct alignas(16) u128 { u32 x, y, z, w; };

#define FG_NEG_INF (-__int_as_float(0x7f800000))

__device__ __forceinline__ u32 smem_addr(const void* p) {
  u32 r;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }\n" : "=r"(r) : "l"(p));
  return r;
}

// Four 8x8 b16 matrices; lanes 8m..8m+7 give the row addresses of matrix m.
__device__ __forceinline__ void ldmatrix_x4(u32* r, u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32* r, u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// 2^x; exp2(-inf) = 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
]]

-- 16-bit storage value -> fp32.
function M.to_float(dtype)
  if dtype == "bf16" then
    return "__device__ __forceinline__ float to_float(u16 x) { return __uint_as_float((u32)x << 16); }\n"
  end
  return [[
__device__ __forceinline__ float to_float(u16 x) {
  float f;
  asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(x));
  return f;
}
]]
end

return M
