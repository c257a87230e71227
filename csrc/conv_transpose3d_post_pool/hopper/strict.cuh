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
// A tile's products are 27 x KS entries, one per (phase, tap, k-step), each three m64 x n32 x k8 wgmma into a
// 16-register part, kStrictDepth entries in flight: an entry's wgmma go out, then the oldest entry's part is waited for
// and added to its phase's sum; a phase's completed sum is folded into the pool at once (StrictPool), so a consumer
// holds one phase's sum instead of a tile's 128 accumulators. Run slot by slot over all 8 phases at once (128
// accumulators, two parts), the consumers spilled and the tile took 163.7 us at the KernelBench size (H200).
#pragma once

#include "conv_transpose3d_post_pool/hopper/epilogue.cuh"
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

template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if defined(FUSED_WGMMA_ENABLED)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
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

// Entry e of a tile (e < 27 * KS): phases 0 .. 7 in order, each phase's taps shift by shift (the shifts s within the
// phase's bits, ascending), k-steps inner: the mma.sync kernel's order of every sum and of the pool's selection.
struct StrictEntry {
  int phase, shift, ks;
  int run;          // the run (geometry.cuh) whose B columns hold the (phase, shift) tap
  bool phase_last;  // the phase's sum is complete after this entry
};
template <int KS>
__host__ __device__ constexpr StrictEntry strict_entry(int e) {
  int n = 0;
  for (int ph = 0; ph < 8; ++ph) {
    for (int s = 0; s < 8; ++s) {
      if ((s & ph) != s) continue;
      for (int ks = 0; ks < KS; ++ks) {
        if (n++ != e) continue;
        const int slot = phase_slot(ph);
        int r = 0;
        while (!(run(r).shift == s && slot >= run(r).slot0 && slot < run(r).slot0 + run(r).slots)) ++r;
        return StrictEntry{ph, s, ks, r, s == ph && ks == KS - 1};
      }
    }
  }
  return StrictEntry{-1, -1, -1, -1, false};
}
static_assert(strict_entry<2>(0).phase == 0 && strict_entry<2>(1).phase_last && strict_entry<2>(2).phase == 1 &&
                  strict_entry<2>(4).shift == 1 && strict_entry<2>(53).phase == 7 && strict_entry<2>(53).shift == 7 &&
                  strict_entry<2>(53).phase_last && strict_entry<2>(54).phase == -1 && strict_entry<1>(26).phase == 7,
              "27 taps per k-step, phase by phase");

// Entry E's three wgmma into part: B at bh16 (high parts) and bl16 (low parts), 16-byte units.
template <int KS, int E>
__device__ __forceinline__ void strict_issue(float (&part)[16], const SplitA& a, uint32_t bh16, uint32_t bl16) {
  using L = Layout<Mode::kStrict, KS>;
  constexpr StrictEntry en = strict_entry<KS>(E);
  constexpr uint32_t b_off = run_col0(en.run) * L::kChunks + 2 * en.ks * run_cols(en.run) +
                             (phase_slot(en.phase) - run(en.run).slot0) * kCoBlock;
  constexpr uint32_t kLbo = run_cols(en.run) * 16;
  wgmma_rs_n32(part, a.lo, smem_desc16<kLbo, 128>(bh16 + b_off), 0);
  wgmma_rs_n32(part, a.cross, smem_desc16<kLbo, 128>(bl16 + b_off), 1);
  wgmma_rs_n32(part, a.hi, smem_desc16<kLbo, 128>(bh16 + b_off), 1);
}

// The pool over the phases as their sums complete, in phase order: max_pool3d's selection (the first maximum, the last
// NaN) over every phase's epilogue (epilogue.cuh's exact form), or in the monotone form over the sums themselves,
// whose one epilogue strict_tile applies at the end (the first maximum of the sums where monotone_values takes their
// max_nan: the same value but for the sign of a zero tied with another zero). The block-uniform form is a select, not
// a branch: a branch between in-flight wgmma makes ptxas serialise them all, and two copies of the tile's code (one
// per form) left it too few registers for them (ptxas 13.0).
struct StrictPool {
  float best[16];
  const Params* p;
  const EpilogueArgs* a;
  int t;
  __device__ __forceinline__ void fold(int ph, const float (&sum)[16]) {
    using Out = OutputTraits<Mode::kStrict, false>;
    const bool exact = a->exact;
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      const int c = acc_channel(r, t);
      const float e = Out::epilogue(sum[r] + a->bias[c], a->mult[c], p->s1, p->s2);
      const float v = exact ? e : sum[r];
      best[r] = ph == 0 || takes_max(v, best[r]) ? v : best[r];
    }
  }
};

// Retires entry D: its part added to its phase's sum; the phase folded into the pool once its sum is complete.
template <int KS, int K, int D, typename Pool>
__device__ __forceinline__ void strict_retire(float (&sum)[16], float (&part)[K][16], Pool& pool) {
  constexpr StrictEntry en = strict_entry<KS>(D);
  pin16(part[D % K]);
#pragma unroll
  for (int r = 0; r < 16; ++r) sum[r] += part[D % K][r];
  if constexpr (en.phase_last) {
    pool.fold(en.phase, sum);
#pragma unroll
    for (int r = 0; r < 16; ++r) sum[r] = 0.f;  // the next phase's sum starts from +0, as the mma.sync kernel's
  }
}

// Entry E: its A fragment loaded and split, its products issued; then, with K entries in flight, the oldest retired.
template <int KS, int K, int E, typename Pool>
__device__ __forceinline__ void strict_step(float (&sum)[16], float (&part)[K][16], SplitA (&a)[K], Pool& pool,
                                            const uint8_t* a_thread, uint32_t bh16, uint32_t bl16) {
  constexpr StrictEntry en = strict_entry<KS>(E);
  load_split<KS, en.shift, en.ks>(a[E % K], a_thread);
  pin_split(a[E % K]);
  wgmma_fence();
  strict_issue<KS, E>(part[E % K], a[E % K], bh16, bl16);
  wgmma_commit();
  if constexpr (E >= K - 1) {
    wgmma_wait<K - 1>();
    strict_retire<KS, K, E - (K - 1)>(sum, part, pool);
  }
}

template <int KS, int K, typename Pool, int... E>
__device__ __forceinline__ void strict_steps(float (&sum)[16], float (&part)[K][16], SplitA (&a)[K], Pool& pool,
                                             const uint8_t* a_thread, uint32_t bh16, uint32_t bl16,
                                             std::integer_sequence<int, E...>) {
  (strict_step<KS, K, E>(sum, part, a, pool, a_thread, bh16, bl16), ...);
}
template <int KS, int K, int FIRST, typename Pool, int... D>
__device__ __forceinline__ void strict_drain(float (&sum)[16], float (&part)[K][16], Pool& pool,
                                             std::integer_sequence<int, D...>) {
  (strict_retire<KS, K, FIRST + D>(sum, part, pool), ...);
}

// Entries in flight per consumer: each holds 16 registers of its part and 12 of its split A fragment. With 4 the
// consumers spilled 120-420 bytes at 208 registers (ptxas 13.0).
constexpr int kStrictDepth = 3;

// The tile's pooled values (before the monotone form's epilogue) into pool.best. a_thread: the thread's first A word
// of the tile in the stage (load_split); bh16, bl16: B's copies in 16-byte units.
template <int KS, typename Pool>
__device__ __forceinline__ void strict_tile_pool(Pool& pool, const uint8_t* a_thread, uint32_t bh16, uint32_t bl16) {
  constexpr int kEntries = 27 * KS, K = kStrictDepth;
  // Opaque bases: left visible, the compiler computes the tile's B descriptors once, outside the consumer's tile
  // loop, and spills them.
  asm volatile("" : "+r"(bh16), "+r"(bl16));
  float sum[16], part[K][16];
  SplitA a[K];
#pragma unroll
  for (int r = 0; r < 16; ++r) sum[r] = 0.f;
  strict_steps<KS, K>(sum, part, a, pool, a_thread, bh16, bl16, std::make_integer_sequence<int, kEntries>{});
  wgmma_wait<0>();
  strict_drain<KS, K, kEntries - (K - 1)>(sum, part, pool, std::make_integer_sequence<int, K - 1>{});
}

// One tile of strict float32: products, pool and stores.
template <int KS>
__device__ __forceinline__ void strict_tile(const Params& p, const uint8_t* a_thread, uint32_t bh16, uint32_t bl16,
                                            const TileOrigin& u, int mt, int warp, int g, int t,
                                            const EpilogueArgs& a) {
  using Out = OutputTraits<Mode::kStrict, false>;
  StrictPool pool{{}, &p, &a, t};
  strict_tile_pool<KS>(pool, a_thread, bh16, bl16);
  if (!a.exact) {
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      const int c = acc_channel(r, t);
      const float m = a.mult[c];
      pool.best[r] = Out::epilogue((m < 0.f ? -pool.best[r] : pool.best[r]) + a.bias[c], m, p.s1, p.s2);
    }
  }
  store_outputs(p, u, mt, warp, g, t, a, [&](int64_t o, int r) { Out::store(p, o, pool.best[r]); });
}

}  // namespace hopper
}  // namespace conv_transpose3d_post_pool
}  // namespace fused
