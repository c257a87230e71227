// Strict float32 (TF32 off) on the sm_90a kernel (kernel.cuh): the mma.sync kernel's three-product split
// (cuda/mma.cuh, strict_products) on wgmma, with the same products in the same order, so both kernels give the same
// bits. Per k-step of each (phase, tap) pair: part = lo(A) x cross(B) + cross(A) x lo(B) + hi(A) x hi(B) into a fresh
// accumulator, then added to the phase's running sum with IEEE float adds (the tensor cores' own accumulation
// truncates; chained over a whole sum it made the error grow with Cin).
//
// B's two copies (the weights' high and low parts, stage.cuh) are resident; a block whose weights have a non-finite
// high part (where cross(B) would differ from hi(B)) does not come here (kernel.cuh). A is split in registers: the
// stage holds the input's float32 words, each thread loads its wgmma A fragment (m64 x k8, 4 words: rows g and g + 8
// of its warp's 16, k-words t and t + 4, as mma.sync's m16n8k8) and splits it with tf32_split, so an infinite input
// stays exact as in the mma.sync kernel.
//
// A tile's products are 27 x KS entries, one per (slot, k-step), each three m64 x n32 x k8 wgmma into one of two
// 16-register parts: the entry's wgmma go out, then the previous entry's part is waited for and added, so the tensor
// cores always hold one entry while the warpgroup adds the other. Each (shift, k-step) loads and splits its A
// fragment once, for every slot of the shift's runs (they are consecutive in the run table): 129 us at the
// KernelBench size on the H200 against 163 for a fragment per run, measured in one run.
//
// With a fragment per (run, k-step), Nsight Compute put it at issue active 43 %, stalls on long scoreboard and fixed
// latency, a split ~17 SASS instructions a word (its finiteness tests and selects); taken phase by phase instead (one
// phase's sum in registers, no spills) it ran 260 us: 54 splits a tile and every phase's epilogue.
#pragma once

#include "conv_transpose3d_post_pool/hopper/geometry.cuh"
#include "conv_transpose3d_post_pool/hopper/sync.cuh"

#include <cstdint>
#include <utility>

namespace fused {
namespace conv_transpose3d_post_pool {
namespace hopper {

// part = A x B (scale_d = 0) or part + A x B (1): one m64 x n32 x k8 TF32 wgmma with A from registers.
__device__ __forceinline__ void wgmma_rs_n32(float (&d)[16], const uint32_t (&a)[4], uint64_t b_desc, int scale_d) {
#if defined(FUSED_WGMMA_ENABLED)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d)
      : "memory");
#else
  (void)d;
  (void)a;
  (void)b_desc;
  (void)scale_d;
#endif
}

__device__ __forceinline__ void pin16(float (&r)[16]) {
#pragma unroll
  for (int i = 0; i < 16; ++i) pin(r[i]);
}

// One A fragment's split (tf32_split per word).
struct SplitA {
  uint32_t hi[4], lo[4], cross[4];
};

// Keeps the split's arithmetic before the fence that follows (the compiler may otherwise sink it past the fence, and
// ptxas then injects another fence before the wgmma that read it).
__device__ __forceinline__ void pin_split(SplitA& a) {
#pragma unroll
  for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a.hi[i]), "+r"(a.lo[i]), "+r"(a.cross[i])::"memory");
}

// Entry e of a tile (e < 27 * KS): runs in order, k-steps inner, the run's slots innermost. Each slot then adds its
// parts shift by shift, k-steps inner: the mma.sync kernel's order (geometry.cuh).
struct StrictEntry {
  int run, ks, slot;
  bool opens_group;  // the first entry of its (shift, k-step): loads and splits its A fragment
  int frag;          // which of the two fragments it reads: (shift * KS + ks) % 2
};
template <int KS>
__host__ __device__ constexpr StrictEntry strict_entry(int e) {
  int n = 0;
  for (int r = 0; r < kRuns; ++r) {
    const bool first_of_shift = r == 0 || run(r - 1).shift != run(r).shift;
    for (int ks = 0; ks < KS; ++ks) {
      for (int j = 0; j < run(r).slots; ++j) {
        if (n == e) return StrictEntry{r, ks, run(r).slot0 + j, first_of_shift && j == 0, (run(r).shift * KS + ks) % 2};
        ++n;
      }
    }
  }
  return StrictEntry{-1, -1, -1, false, -1};
}
// A fragment is loaded while the entry before is in flight (strict_step), and a wgmma's A registers must hold until
// it completes: so an entry that loads must read the other fragment than the entry before it (with the runs of a
// shift consecutive and shifts ascending by one, a new (shift, k-step) always lands in the other fragment).
template <int KS>
__host__ __device__ constexpr bool loads_avoid_in_flight() {
  for (int e = 1; e < 27 * KS; ++e) {
    if (strict_entry<KS>(e).opens_group && strict_entry<KS>(e).frag == strict_entry<KS>(e - 1).frag) return false;
  }
  return true;
}
static_assert(loads_avoid_in_flight<1>() && loads_avoid_in_flight<2>(), "a fragment loaded under its own reader");
template <int KS>
__host__ __device__ constexpr int strict_loads() {
  int n = 0;
  for (int e = 0; e < 27 * KS; ++e) n += strict_entry<KS>(e).opens_group ? 1 : 0;
  return n;
}
static_assert(strict_entry<2>(0).slot == 0 && strict_entry<2>(4).ks == 1 && strict_entry<2>(8).run == 1 &&
                  !strict_entry<2>(8).opens_group && strict_entry<2>(16).opens_group &&
                  strict_entry<2>(19).opens_group && !strict_entry<2>(20).opens_group &&
                  strict_entry<2>(53).run == kRuns - 1 && strict_entry<2>(54).run == -1 && strict_loads<2>() == 16 &&
                  strict_loads<1>() == 8,
              "27 entries per k-step, a fragment per (shift, k-step)");

// The thread's A words for (shift S, k-step KSTEP) of a tile: `a` is the thread's first word of the tile in the stage
// (its warp's first row, column g of the tile, k-word t), the rest compile-time offsets: rows g + 8 are the next halo
// row, k-words t + 4 the next chunk.
template <int KS, int S, int KSTEP>
__device__ __forceinline__ void load_split(SplitA& out, const uint8_t* a) {
  using L = Layout<Mode::kStrict, KS>;
  constexpr int sd = S >> 2, sh = (S >> 1) & 1, sw = S & 1;
  constexpr int off = sd * L::kPlaneBytes + 2 * KSTEP * L::kChunkBytes + (sh * kHaloW + sw) * 16;
  constexpr int offs[4] = {off, off + kHaloW * 16, off + L::kChunkBytes, off + L::kChunkBytes + kHaloW * 16};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t word = *reinterpret_cast<const uint32_t*>(a + offs[i]);
    tf32_split(word, out.hi[i], out.lo[i], out.cross[i]);
  }
}

// Entry E's three wgmma into part: B at bh16 (high parts) and bl16 (low parts), 16-byte units.
template <int KS, int E>
__device__ __forceinline__ void strict_issue(float (&part)[16], const SplitA& a, uint32_t bh16, uint32_t bl16) {
  using L = Layout<Mode::kStrict, KS>;
  constexpr StrictEntry en = strict_entry<KS>(E);
  constexpr uint32_t b_off = run_col0(en.run) * L::kChunks + 2 * en.ks * run_cols(en.run) +
                             (en.slot - run(en.run).slot0) * kCoBlock;
  constexpr uint32_t kLbo = run_cols(en.run) * 16;
  wgmma_rs_n32(part, a.lo, smem_desc16<kLbo, 128>(bh16 + b_off), 0);
  wgmma_rs_n32(part, a.cross, smem_desc16<kLbo, 128>(bl16 + b_off), 1);
  wgmma_rs_n32(part, a.hi, smem_desc16<kLbo, 128>(bh16 + b_off), 1);
}

template <int KS, int E>
__device__ __forceinline__ void strict_step(float (&acc)[8][16], float (&part)[2][16], SplitA (&a)[2],
                                            const uint8_t* a_thread, uint32_t bh16, uint32_t bl16) {
  constexpr StrictEntry en = strict_entry<KS>(E);
  if constexpr (en.opens_group) load_split<KS, run(en.run).shift, en.ks>(a[en.frag], a_thread);
  pin_split(a[en.frag]);
  wgmma_fence();
  strict_issue<KS, E>(part[E & 1], a[en.frag], bh16, bl16);
  wgmma_commit();
  if constexpr (E > 0) {
    // The previous entry's part, while this entry's products run.
    constexpr StrictEntry prev = strict_entry<KS>(E - 1);
    wgmma_wait<1>();
    pin16(part[(E - 1) & 1]);
#pragma unroll
    for (int r = 0; r < 16; ++r) acc[prev.slot][r] += part[(E - 1) & 1][r];
  }
}

template <int KS, int... E>
__device__ __forceinline__ void strict_steps(float (&acc)[8][16], float (&part)[2][16], SplitA (&a)[2],
                                             const uint8_t* a_thread, uint32_t bh16, uint32_t bl16,
                                             std::integer_sequence<int, E...>) {
  (strict_step<KS, E>(acc, part, a, a_thread, bh16, bl16), ...);
}

// The tile's sums into acc (every slot, from +0 as the mma.sync kernel's accumulators). a_thread: the thread's first
// A word of the tile in the stage (load_split); bh16, bl16: B's copies in 16-byte units.
template <int KS>
__device__ __forceinline__ void strict_tile_products(float (&acc)[8][16], const uint8_t* a_thread, uint32_t bh16,
                                                     uint32_t bl16) {
  constexpr int kEntries = 27 * KS;
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int r = 0; r < 16; ++r) acc[j][r] = 0.f;
  // Opaque bases: left visible, the compiler computes the tile's 108 B descriptors once, outside the consumer's tile
  // loop, and spills them.
  asm volatile("" : "+r"(bh16), "+r"(bl16));
  float part[2][16];
  SplitA a[2];
  strict_steps<KS>(acc, part, a, a_thread, bh16, bl16, std::make_integer_sequence<int, kEntries>{});
  constexpr StrictEntry last = strict_entry<KS>(kEntries - 1);
  wgmma_wait<0>();
  pin16(part[(kEntries - 1) & 1]);
#pragma unroll
  for (int r = 0; r < 16; ++r) acc[last.slot][r] += part[(kEntries - 1) & 1][r];
}

}  // namespace hopper
}  // namespace conv_transpose3d_post_pool
}  // namespace fused
