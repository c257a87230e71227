// Hopper's asynchronous machinery for the fused convolution's sm_90a kernel (kernel.cuh beside this file):
// shared-memory matrix descriptors, the wgmma fences, mbarriers and the proxy fence. Everything here compiles to
// nothing outside an sm_90a device pass (FUSED_WGMMA_ENABLED), where the launcher never runs the kernel.
#pragma once

#include "conv_transpose3d_post_pool/cuda/mma.cuh"

#include <cstdint>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FUSED_WGMMA_ENABLED 1
#endif

namespace fused {
namespace conv_transpose3d_post_pool {
namespace hopper {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// A shared-memory matrix descriptor without swizzling: `addr` is the first core matrix (8 rows of 16 bytes,
// contiguous), `lbo` the byte distance to the next core matrix along K, `sbo` along M or N. All three are
// multiples of 16 bytes below 256 KB.
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr >> 4) & 0x3fffu) | (static_cast<uint64_t>((lbo >> 4) & 0x3fffu) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3fffu) << 32);
}

// The same descriptor from an address already in 16-byte units (below 2^14, so that adding to it never carries into
// the stride fields) and compile-time strides: the issue path then spends one add per operand on it, where
// smem_desc's shifts and masks took ~6 instructions per operand before each wgmma.
template <uint32_t kLbo, uint32_t kSbo>
__device__ __forceinline__ uint64_t smem_desc16(uint32_t addr16) {
  static_assert(kLbo % 16 == 0 && kSbo % 16 == 0 && kLbo < (1u << 18) && kSbo < (1u << 18), "strides in 16-byte units");
  return static_cast<uint64_t>(addr16 + ((kLbo >> 4) << 16)) | (static_cast<uint64_t>(kSbo >> 4) << 32);
}

// Orders this warpgroup's register accesses before the wgmma that follow.
__device__ __forceinline__ void wgmma_fence() {
#if defined(FUSED_WGMMA_ENABLED)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if defined(FUSED_WGMMA_ENABLED)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most N of this warpgroup's committed groups are pending (the older ones complete: their
// accumulators written, their operands read).
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if defined(FUSED_WGMMA_ENABLED)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
__device__ __forceinline__ void wgmma_wait_all() { wgmma_wait<0>(); }

// This thread's warpgroup (0: the producer), read through a shuffle from lane 0 so that ptxas sees it warp-uniform:
// what derives from it (a stage's address, a tile's descriptors) can then live in uniform registers.
__device__ __forceinline__ int warpgroup_index_uniform() {
  return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
}

// Pins a register the wgmma write: the compiler may not move a read of it across this point (after the wait) or a
// write of it past it (before the fence).
__device__ __forceinline__ void pin(float& r) { asm volatile("" : "+f"(r)::"memory"); }
// Pins every accumulator of a consumer (8 slots of 16).
__device__ __forceinline__ void pin_all(float (&acc)[8][16]) {
#pragma unroll
  for (int ph = 0; ph < 8; ++ph)
#pragma unroll
    for (int r = 0; r < 16; ++r) pin(acc[ph][r]);
}

// Generic-proxy stores to shared memory made visible to the async proxy (the tensor cores' operand reads).
__device__ __forceinline__ void fence_proxy_async() {
#if defined(FUSED_WGMMA_ENABLED)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
#if defined(FUSED_WGMMA_ENABLED)
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
#if defined(FUSED_WGMMA_ENABLED)
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
#endif
}
// Makes this thread's mbarrier initialisations visible to the bulk copy engine, which completes on them.
__device__ __forceinline__ void mbar_init_fence() {
#if defined(FUSED_WGMMA_ENABLED)
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
// Arrives on the barrier and expects `bytes` of bulk copies to complete on it in this phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#if defined(FUSED_WGMMA_ENABLED)
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
#endif
}
// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to shared memory by the bulk copy engine,
// completing on `bar`.
__device__ __forceinline__ void bulk_copy_to_shared(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#if defined(FUSED_WGMMA_ENABLED)
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
#endif
}
// A box of a tensor (its map in the kernel's parameters, a __grid_constant__'s address) from shared memory at `src`
// to global memory at coordinates (c0 .. c4), by the TMA unit, in this thread's bulk group (committed by
// bulk_commit); what lies outside the tensor is not written. The TMA unit reads shared memory through the async proxy:
// the generic writes it reads need fence_proxy_async (by the writing threads) first.
__device__ __forceinline__ void tma_store_5d(const void* map, uint32_t src, int c0, int c1, int c2, int c3, int c4) {
#if defined(FUSED_WGMMA_ENABLED)
  asm volatile("cp.async.bulk.tensor.5d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5, %6}], [%1];\n" ::"l"(map),
               "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
               : "memory");
#endif
}
__device__ __forceinline__ void bulk_commit() {
#if defined(FUSED_WGMMA_ENABLED)
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
// Waits until this thread's committed stores to global memory (tma_store_5d) have read their shared memory (their
// writes may still be on the way; the kernel's end completes them).
__device__ __forceinline__ void bulk_wait_read() {
#if defined(FUSED_WGMMA_ENABLED)
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
#endif
}
// Waits for the completion of the barrier's phase of this parity.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
#if defined(FUSED_WGMMA_ENABLED)
  asm volatile(
      "{\n.reg .pred done;\nwait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
#endif
}

// Moves registers between warpgroups (the kernel starts at its __launch_bounds__ cap): the producer gives up what
// its loads do not need, the consumers take it for their accumulators. Each warpgroup's role is one branch.
template <int kRegs>
__device__ __forceinline__ void release_registers() {
#if defined(FUSED_WGMMA_ENABLED)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
template <int kRegs>
__device__ __forceinline__ void claim_registers() {
#if defined(FUSED_WGMMA_ENABLED)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

// A barrier of the consumer warpgroups' 256 threads (named barrier 3) that also returns whether `pred` held for any
// of them.
__device__ __forceinline__ bool consumers_sync_or(bool pred) {
  uint32_t any;
  asm volatile(
      "{\n.reg .pred p, q;\nsetp.ne.u32 p, %1, 0;\nbar.red.or.pred q, 3, 256, p;\nselp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(any)
      : "r"(static_cast<uint32_t>(pred))
      : "memory");
  return any != 0;
}

// A barrier of the consumer warpgroups' 256 threads (named barrier 3).
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 3, 256;\n" ::: "memory"); }

// The consumer warpgroups' turns at the tensor cores (named barriers 4 and 5, 256 threads): one warpgroup arrives
// (without waiting) when it has issued a tile's wgmma, the other waits there before issuing its own.
constexpr int kTurnBarrier0 = 4;
__device__ __forceinline__ void turn_wait(int c) {
  asm volatile("bar.sync %0, 256;\n" ::"r"(kTurnBarrier0 + c) : "memory");
}
__device__ __forceinline__ void turn_pass(int to) {
  asm volatile("bar.arrive %0, 256;\n" ::"r"(kTurnBarrier0 + to) : "memory");
}

// A barrier of the 128 threads of one warpgroup (named barrier 1 + wg; 0 is __syncthreads').
__device__ __forceinline__ void warpgroup_sync(int wg) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(wg + 1) : "memory");
}

}  // namespace hopper
}  // namespace conv_transpose3d_post_pool
}  // namespace fused
