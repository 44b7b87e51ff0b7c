-- Thread block clusters (sm_90 and later): a block's rank and its
-- cluster's blocks, the cluster's barrier, and reads and writes of another
-- block's shared memory. source: the device functions (expects lib_device's
-- source); the Hopper kernels take it with isa_sm90a's, the decoding step
-- (kernel_fwd_decode) alone on sm_90. loads: reads through cluster_map's
-- addresses.
local M = {}

M.source = [[
// ---- thread block clusters ----
// The block's rank in its cluster and the cluster's blocks.
__device__ __forceinline__ u32 cluster_rank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ u32 cluster_blocks() {
  u32 n;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(n));
  return n;
}
// A barrier of every thread of the cluster's blocks, in two halves: arrive
// releases the thread's writes (those into other blocks' shared memory
// too), wait returns once all have arrived, their writes visible.
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory"); }
// The address in block `rank`'s shared memory of `addr` in this block's.
__device__ __forceinline__ u32 cluster_map(u32 addr, u32 rank) {
  u32 r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
// Four floats into another block's shared memory (an address of cluster_map).
__device__ __forceinline__ void st_cluster_f4(u32 addr, float a, float b, float c, float d) {
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(a), "f"(b), "f"(c), "f"(d)
               : "memory");
}

]]

M.loads = [[
// A float, and four, from another block's shared memory (an address of
// cluster_map; this block's own too).
__device__ __forceinline__ float ld_cluster_f32(u32 addr) {
  float x;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(x) : "r"(addr) : "memory");
  return x;
}
__device__ __forceinline__ float4 ld_cluster_f4(u32 addr) {
  float4 x;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(x.x), "=f"(x.y), "=f"(x.z), "=f"(x.w) : "r"(addr) : "memory");
  return x;
}

]]

return M
