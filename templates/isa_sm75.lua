-- sm_75 (T4): mma.sync m16n8k8 (a k16 step is two of them on the same
-- fragments), ldmatrix, and synchronous 16-byte copies (no cp.async). fp16
-- only: Turing's tensor cores have no bf16.
local M = { name = "sm75", async_copy = false, supports_bf16 = false,
            copy_unroll = "1" }  -- copies pass through registers: one at a time

function M.prelude(dtype)
  if dtype ~= "fp16" then error("sm_75 has no bf16 tensor cores", 2) end
  return [[
// C(16x8) += A(16x16) * B(16x8) as two m16n8k8 steps: the k16 A fragment is
// {a0,a1} for k 0..7 and {a2,a3} for k 8..15, the B fragment {b0} and {b1}.
__device__ __forceinline__ void mma_16x8x16(float* c, const u32* a, u32 b0, u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 "
               "{%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(b0));
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 "
               "{%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[2]), "r"(a[3]), "r"(b1));
}

__device__ __forceinline__ u32 pack2(float x, float y) {
  u32 r;
  asm("{ .reg .f16 lo, hi;\n"
      "  cvt.rn.f16.f32 lo, %1;\n"
      "  cvt.rn.f16.f32 hi, %2;\n"
      "  mov.b32 %0, {lo, hi}; }\n" : "=r"(r) : "f"(x), "f"(y));
  return r;
}

// Synchronous 16-byte copy through registers; src_bytes 0 writes zeros.
__device__ __forceinline__ void copy16(u32 dst, const void* src, int src_bytes) {
  u32 x = 0, y = 0, z = 0, w = 0;
  if (src_bytes) asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                              : "=r"(x), "=r"(y), "=r"(z), "=r"(w) : "l"(src));
  asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"r"(dst), "r"(x), "r"(y), "r"(z), "r"(w));
}
__device__ __forceinline__ void copy16_read_once(u32 dst, const void* src, int src_bytes) {
  copy16(dst, src, src_bytes);
}
__device__ __forceinline__ void copy_commit() {}
__device__ __forceinline__ void copy_wait_all() {}
template <int N> __device__ __forceinline__ void copy_wait() {}
]]
end

return M
