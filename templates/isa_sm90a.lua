-- sm_90a (H100, H200): the instructions of the Hopper kernels, each checked on
-- the GPU (test_sm90a) by the probe (kernel_probe_sm90a.lua), the forward
-- (kernel_fwd_sm90a.lua) or the backward: mbarriers that count arrivals and
-- transferred bytes, bulk tensor copies (TMA) that complete on them, warpgroup
-- MMAs (wgmma) reading shared memory through matrix descriptors or A from
-- registers, bulk stores and reductions from shared memory, named barriers,
-- cluster barriers and stores into a cluster's other blocks (lib_cluster),
-- setmaxnreg, and the waits of programmatic dependent launches.
-- Only an sm_90a compile accepts wgmma and setmaxnreg.
--
-- source: the device functions (expects lib_device's source).
-- wgmma(n, dtype, a_in_registers): the name and device code of one
--   m64n<n>k16 instruction with fp32 accumulators: n/2 floats per thread.
local text = import("lib_text")
local cluster = import("lib_cluster")
local M = {}

M.source = [[
// ---- mbarriers: one 8-byte word in shared memory ----
__device__ __forceinline__ void mbar_init(u32 bar, u32 arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}
// Barrier initialisations visible to the async proxy (the copy engine).
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival that also announces `bytes` to be transferred in this phase.
__device__ __forceinline__ void mbar_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// Wait until the phase of parity `phase` has completed.
__device__ __forceinline__ void mbar_wait(u32 bar, u32 phase) {
  asm volatile("{\n.reg .pred done;\nFG_WAIT_%=:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
               "@!done bra FG_WAIT_%=;\n}\n" ::"r"(bar), "r"(phase) : "memory");
}

// ---- bulk tensor copies: a box of a tensor map into shared memory ----
// The map is a __grid_constant__ parameter (or lives in global memory);
// coordinates are in elements, innermost first.
__device__ __forceinline__ void tma_load_2d(u32 dst, const void* map, u32 bar, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
               "[%0], [%1, {%3, %4}], [%2];\n"
               ::"r"(dst), "l"(map), "r"(bar), "r"(c0), "r"(c1) : "memory");
}

__device__ __forceinline__ void tma_load_4d(u32 dst, const void* map, u32 bar, int c0, int c1,
                                            int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes "
               "[%0], [%1, {%3, %4, %5, %6}], [%2];\n"
               ::"r"(dst), "l"(map), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3) : "memory");
}

// The same with an L2 policy (read_once_policy, isa_sm80).
__device__ __forceinline__ void tma_load_4d_policy(u32 dst, const void* map, u32 bar, int c0, int c1,
                                                   int c2, int c3, u64 policy) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
               "[%0], [%1, {%3, %4, %5, %6}], [%2], %7;\n"
               ::"r"(dst), "l"(map), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "l"(policy) : "memory");
}

// The map's 128 bytes fetched ahead of its first copy (else the copy engine
// fetches them when that copy is issued).
__device__ __forceinline__ void prefetch_map(const void* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}

// ---- bulk copies out of shared memory ----
// The shared memory must be written before and made visible to the copy
// engine (fence_async_shared); after bulk_commit, bulk_wait_read says the
// copies have read it (it may be reused or the thread block may end).
// A box into a tensor map: rows and columns past the map's dimensions are
// not written (at the granularity of 16 bytes along the inner dimension).
__device__ __forceinline__ void tma_store_4d(const void* map, u32 src, int c0, int c1, int c2,
                                             int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n"
               ::"l"(map), "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3) : "memory");
}
// A box of fp32 values added element by element into a tensor map's tensor
// (elements past its dimensions are skipped).
__device__ __forceinline__ void tma_reduce_add_4d(const void* map, u32 src, int c0, int c1, int c2,
                                                  int c3) {
  asm volatile("cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group"
               " [%0, {%2, %3, %4, %5}], [%1];\n"
               ::"l"(map), "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3) : "memory");
}
// `bytes` (a multiple of 16, both addresses 16-byte aligned) of fp32 values
// added element by element to global memory.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, u32 src, u32 bytes) {
  asm volatile("{\n.reg .u64 g;\ncvta.to.global.u64 g, %0;\n"
               "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [g], [%1], %2;\n}\n"
               ::"l"(dst), "r"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// ... and bulk_wait that they are complete (bulk_wait_older: all but the
// last commit's).
__device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_older() { asm volatile("cp.async.bulk.wait_group 1;\n" ::: "memory"); }
// This thread's completed bulk copies into global memory ordered before
// its later accesses (a release, or a barrier another thread's release follows).
__device__ __forceinline__ void fence_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}
// Turns taken through a counter in global memory, between thread blocks
// whose bulk copies must meet in a fixed order: wait_turn spins until the
// counter holds `value`, then lets this thread's bulk copies follow;
// pass_turn, after bulk_wait (this thread's copies complete), sets it.
__device__ __forceinline__ void wait_turn(const u32* counter, u32 value) {
  u32 x;
  do asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(x) : "l"(counter) : "memory");
  while (x != value);
  fence_async_global();
}
__device__ __forceinline__ void pass_turn(u32* counter, u32 value) {
  fence_async_global();
  asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(counter), "r"(value) : "memory");
}
// Programmatic dependent launches: the stream's next kernel, launched as
// one, may start once every block of this one has let it (or ended), and
// waits for this one to end, its writes seen, before reading them (a
// kernel launched in stream order returns from the wait at once).
__device__ __forceinline__ void grid_let_next_start() { asm volatile("griddepcontrol.launch_dependents;\n"); }
__device__ __forceinline__ void grid_wait_prior() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
// Shared memory written by threads, made visible to the async proxy.
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void st_shared_u32(u32 addr, u32 x) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(x) : "memory");
}

]] .. cluster.source .. [[
// Rows first..rows-1 of a tile of `boxes` boxes (box_bytes apart, rows of
// 128 bytes) set to zero by `threads` threads, this one `tid`. Whole rows,
// so a swizzle of the 16-byte chunks within rows keeps them zero; the
// caller fences (fence_async_shared) before wgmmas read them.
__device__ __forceinline__ void zero_rows(u32 tile, int boxes, u32 box_bytes, int first, int rows, int tid,
                                          int threads) {
  const int chunks = (rows - first) * 8;  // per box
  for (int c = tid; c < boxes * chunks; c += threads) {
    const u32 at = tile + (c / chunks) * box_bytes + first * 128 + (c % chunks) * 16;
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(at), "r"(0) : "memory");
  }
}

// ---- warpgroup MMA ----
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int PENDING> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(PENDING) : "memory");
}
// Keeps the compiler from moving accumulator registers across the
// asynchronous MMAs that read and write them.
__device__ __forceinline__ void wgmma_hold(float& x) { asm volatile("" : "+f"(x)::"memory"); }
template <int COUNT> __device__ __forceinline__ void hold(float* x) {
#pragma unroll
  for (int i = 0; i < COUNT; ++i) wgmma_hold(x[i]);
}

// Named barrier `id` over `count` threads: wait there, or arrive and go on.
__device__ __forceinline__ void bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
// ... or wait there, and learn whether any of them had `x` set.
__device__ __forceinline__ bool bar_sync_or(int id, int count, bool x) {
  u32 any;
  asm volatile("{\n.reg .pred q, r;\nsetp.ne.u32 q, %1, 0;\nbar.red.or.pred r, %2, %3, q;\n"
               "selp.u32 %0, 1, 0, r;\n}\n"
               : "=r"(any) : "r"((u32)x), "r"(id), "r"(count) : "memory");
  return any != 0;
}

// Register budgets of warp-specialized kernels: a warpgroup gives registers
// up or takes them. Needs a register cap at entry (__launch_bounds__(n, 1)).
template <int REGS> __device__ __forceinline__ void regs_lower() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
template <int REGS> __device__ __forceinline__ void regs_raise() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}

// Matrix descriptor of a tile in shared memory laid out with 128-byte
// swizzling (the layout the copy engine writes with CU_TENSOR_MAP_SWIZZLE_128B):
// start address, leading and stride byte offsets (all in 16-byte units), and
// the swizzle mode in the top two bits. The tile must start 1024-byte aligned.
__device__ __forceinline__ u64 smem_desc_sw128(u32 addr, u32 leading, u32 stride) {
  return (u64)((addr & 0x3FFFF) >> 4) | ((u64)((leading & 0x3FFFF) >> 4) << 16) |
         ((u64)((stride & 0x3FFFF) >> 4) << 32) | ((u64)1 << 62);
}

// Four 8 x 8 pieces of 16-bit values stored transposed: x[j] holds row
// lane / 4, columns 2(lane % 4) and + 1 of piece j (an mma fragment's
// layout), which land in column lane / 4 of rows 2(lane % 4) and + 1 of the
// stored piece; lane l gives the address of the 16 bytes of row l % 8 of
// piece l / 8.
__device__ __forceinline__ void stmatrix_x4_trans(u32 addr, u32 x0, u32 x1, u32 x2, u32 x3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(x0),
               "r"(x1), "r"(x2), "r"(x3)
               : "memory");
}

// Four 8 x 8 pieces of 16-bit values: x[j] holds row lane / 4, columns
// 2(lane % 4) and + 1 of piece j (an mma fragment's layout), stored as they
// are; lane l gives the address of the 16 bytes of row l % 8 of piece l / 8.
__device__ __forceinline__ void stmatrix_x4(u32 addr, u32 x0, u32 x1, u32 x2, u32 x3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(x0), "r"(x1),
               "r"(x2), "r"(x3)
               : "memory");
}

// desc's start address moved on by `bytes` (a multiple of 16): the field is
// bits 0..13 in 16-byte units and shared addresses stay below 256 KB, so
// the sum never carries out of it: one 32-bit add, rather than a descriptor
// built again for each k-step's slice.
__device__ __forceinline__ u64 desc_at(u64 desc, u32 bytes) {
  return (desc & 0xFFFFFFFF00000000ull) | (u32)((u32)desc + (bytes >> 4));
}
]]

-- wgmma.mma_async m64n<n>k16, fp32 accumulators d[n/2]. A from shared memory
-- (descriptor) or, with a_in_registers, four registers of 16-bit pairs; B
-- from shared memory. scale_d 0 overwrites d, 1 adds to it. tnsp_b 1 reads B
-- as (K, N) with N contiguous (MN-major), 0 as (N, K) with K contiguous;
-- likewise tnsp_a for A from shared memory.
function M.wgmma(n, dtype, a_in_registers)
  assert(n % 8 == 0 and n >= 8 and n <= 256, "wgmma: n must be a multiple of 8 in 8..256")
  local ty = dtype == "bf16" and "bf16" or "f16"
  local count = n // 2
  local d, outs = {}, {}
  for i = 0, count - 1 do
    d[#d + 1] = "%" .. i
    outs[#outs + 1] = ('"+f"(d[%d])'):format(i)
  end
  local name = ("wgmma_m64n%dk16_%s%s"):format(n, ty, a_in_registers and "_rs" or "_ss")
  local a_operand, a_inputs, a_param, next_operand, imm
  if a_in_registers then
    a_operand = ("{%%%d, %%%d, %%%d, %%%d}"):format(count, count + 1, count + 2, count + 3)
    a_inputs = '"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3])'
    a_param = "const u32* a"
    next_operand = count + 4
    imm = ("1, 1, %%%d"):format(next_operand + 2)  -- scale-a, scale-b, tnsp-b
  else
    a_operand = "%" .. count
    a_inputs = '"l"(desc_a)'
    a_param = "u64 desc_a"
    next_operand = count + 1
    imm = ("1, 1, %%%d, %%%d"):format(next_operand + 2, next_operand + 3)
  end
  local b_operand, scale_operand = next_operand, next_operand + 1
  local immediates = a_in_registers and '"n"(TNSP_B)' or '"n"(TNSP_A), "n"(TNSP_B)'
  local template = a_in_registers and "template <int TNSP_B>" or "template <int TNSP_A, int TNSP_B>"
  local code = text.fill([[
${template}
__device__ __forceinline__ void ${name}(float* d, ${a_param}, u64 desc_b, int scale_d) {
  asm volatile("{\n.reg .pred keep;\nsetp.ne.b32 keep, %${scale}, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n${n}k16.f32.${ty}.${ty} "
               "{${d}}, ${a}, %${b}, keep, ${imm};\n}\n"
               : ${outs}
               : ${a_inputs}, "l"(desc_b), "r"(scale_d), ${immediates});
}
]], {template = template, name = name, a_param = a_param, scale = scale_operand, n = n, ty = ty,
     d = table.concat(d, ", "), a = a_operand, b = b_operand, imm = imm,
     outs = table.concat(outs, ", "), a_inputs = a_inputs, immediates = immediates})
  return name, code
end

return M
