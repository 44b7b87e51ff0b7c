-- sm_80 and later (A100, RTX 3090, L4, H100): mma.sync m16n8k16 with fp32
-- accumulation, ldmatrix, and cp.async global->shared copies that complete in
-- the background while the tensor cores work.
local M = { name = "sm80", async_copy = true, supports_bf16 = true,
            copy_unroll = "" }  -- async copies: issue them all

function M.prelude(dtype)
  local ab = dtype == "bf16" and "bf16.bf16" or "f16.f16"
  local cvt = dtype == "bf16" and "cvt.rn.bf16x2.f32" or "cvt.rn.f16x2.f32"
  return ([[
// C(16x8, fp32) += A(16x16, row) * B(16x8, col); fragments as in the PTX ISA.
__device__ __forceinline__ void mma_16x8x16(float* c, const u32* a, u32 b0, u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.AB.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> one register of two 16-bit values (x in the low half).
__device__ __forceinline__ u32 pack2(float x, float y) {
  u32 r;
  asm("CVT %0, %2, %1;\n" : "=r"(r) : "f"(x), "f"(y));
  return r;
}

// 16-byte global->shared copy; src_bytes 0 writes zeros and reads nothing.
__device__ __forceinline__ void copy16(u32 dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
// An L2 policy for data read once (a cache streamed through): its lines
// are the first replaced, so they do not push out what is read again.
__device__ __forceinline__ u64 read_once_policy() {
  u64 policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
// copy16 of data read once.
__device__ __forceinline__ void copy16_read_once(u32 dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes), "l"(read_once_policy()));
}
__device__ __forceinline__ void copy_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void copy_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }
// Wait until at most N committed groups are still in flight.
template <int N> __device__ __forceinline__ void copy_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
]]):gsub("AB", ab):gsub("CVT", cvt), nil
end

return M
