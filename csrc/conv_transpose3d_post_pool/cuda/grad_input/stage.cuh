// The input gradient's staging: the pooled gradient of a tile (with its phases) and the weight of a block's input
// channels into shared memory, for both grad_input kernels (layout: grad_input/params.cuh).
#pragma once

#include "conv_transpose3d_post_pool/cuda/grad_input/params.cuh"

#include <cstdint>
#include <type_traits>

namespace fused {
namespace conv_transpose3d_post_pool {
namespace grad_input {

// The code a 16-bit mode keeps for phase `ph` (0..7): the f16 with exponent field ph, so the codes are distinct,
// finite and compare equal exactly when the phases are (set.eq.f16x2 below; 0 is the only zero).
__host__ __device__ constexpr uint32_t phase_code16(uint32_t ph) { return ph << 10; }

// Per-half all-ones mask where the f16x2 codes equal `c` in both halves.
__device__ __forceinline__ uint32_t eq_mask16(uint32_t codes, uint32_t c) {
  uint32_t m;
  asm("set.eq.u32.f16x2 %0, %1, %2;" : "=r"(m) : "r"(codes), "r"(c));
  return m;
}

// Loads are written as a select on a plain load so that they compile to predicated loads with no branch around
// them: a batch of them is then in flight at once, and the conversions run after the batch.
template <typename T>
__device__ __forceinline__ uint32_t load_if(bool ok, const T* ptr) {
  return ok ? static_cast<uint32_t>(__ldg(ptr)) : 0u;
}
__device__ __forceinline__ uint32_t load_if(bool ok, const float* ptr) {
  return ok ? __float_as_uint(__ldg(ptr)) : 0u;
}

// A staged A word and its code from raw loads: `lo`/`hi` the element bits (hi: the second 16-bit channel),
// `plo`/`phi` their window offsets.
template <Mode M>
__device__ __forceinline__ void make_word(uint32_t lo, uint32_t hi, uint32_t plo, uint32_t phi, uint32_t& word,
                                          uint32_t& code) {
  static_assert(M != Mode::kTF32, "TF32 stages one-hot words (grad_input/kernel_tf32.cuh)");
  if constexpr (M == Mode::kStrict) {
    word = lo;
    code = plo & 7u;
  } else {
    word = lo | (hi << 16);
    code = phase_code16(plo & 7u) | (phase_code16(phi & 7u) << 16);
  }
}

// The weight of the block's kBlockN input channels for chunk `chunk` in B-fragment order: per tap and k-step,
// 32 lanes x 4 words (column tile 0: k-words t, t + 4 of column g; column tile 1: the same), so that a lane reads
// both tiles' fragments with one 16-byte load. Zero outside Cin / Cout. Returns (strict float32) whether a staged
// word may not take tf32_split_finite.
template <Mode M, int KS>
__device__ bool stage_weights(const Params& p, uint32_t* __restrict__ sB, int ci0, int chunk) {
  constexpr int kBatch = 12;
  constexpr int kTotal = 27 * KS * 128;
  bool unsafe = false;
  for (int base = threadIdx.x; base < kTotal; base += kBatch * kThreads) {
    uint32_t lo[kBatch], hi[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = base + u * kThreads;
      const int q = i & 3, ln = (i >> 2) & 31, r = i >> 7;
      const int ks = r % KS, tap = r / KS;
      const int ci = ci0 + (q >> 1) * 8 + (ln >> 2);
      const int kw = chunk * KS * 8 + ks * 8 + (ln & 3) + 4 * (q & 1);
      const bool ok = i < kTotal && ci < p.Cin;
      const int kd = tap / 9, kh = (tap / 3) % 3, kx = tap % 3;
      // int32 offsets: the launcher checks that the weight has fewer than 2^31 elements.
      const int at = ok ? ci * static_cast<int>(p.sw[0]) + kd * static_cast<int>(p.sw[2]) +
                              kh * static_cast<int>(p.sw[3]) + kx * static_cast<int>(p.sw[4])
                        : 0;
      const int sc = static_cast<int>(p.sw[1]);
      if constexpr (!ModeTraits<M>::kHalf) {
        lo[u] = load_if(ok && kw < p.Cout, static_cast<const float*>(p.w) + at + kw * sc);
        hi[u] = 0u;
      } else {
        const uint16_t* w16 = static_cast<const uint16_t*>(p.w) + at;
        lo[u] = load_if(ok && 2 * kw < p.Cout, w16 + 2 * kw * sc);
        hi[u] = load_if(ok && 2 * kw + 1 < p.Cout, w16 + (2 * kw + 1) * sc);
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      uint32_t v;
      if constexpr (M == Mode::kTF32) {
        v = tf32_round(__uint_as_float(lo[u]));
      } else {
        v = lo[u] | (hi[u] << 16);
      }
      if constexpr (M == Mode::kStrict) unsafe |= !split_safe(v);
      if (base + u * kThreads < kTotal) sB[base + u * kThreads] = v;
    }
  }
  return unsafe;
}

// The pooled gradient of the tile at (n, d0, h0, w0), chunk `chunk` (CW k-words), over the windows q = i0 - 1 ..
// i0 + kT - 1 per dim: word (k, halo position) at k * kPitch + position; zero (phase 0) outside the pooled extent
// and past Cout. kBatch elements per thread are loaded before their stores (each an L2 round trip). Returns
// (strict float32) whether a staged word may not take tf32_split_finite.
template <Mode M, int CW>
__device__ bool stage_grad(const Params& p, uint32_t* __restrict__ sA, uint32_t* __restrict__ sC, int n, int d0,
                           int h0, int w0, int chunk) {
  constexpr int kBatch = 8;
  constexpr int kTotal = CW * kHalo;
  constexpr int kCh = ModeTraits<M>::kHalf ? 2 : 1;  // channels per k-word
  const int64_t nbase = static_cast<int64_t>(n) * p.sg[0];
  bool unsafe = false;
  for (int base = threadIdx.x; base < kTotal; base += kBatch * kThreads) {
    uint32_t lo[kBatch], hi[kBatch], plo[kBatch], phi[kBatch];
    int dst[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = base + u * kThreads;
      int kl, hp;
      if (p.g_channels_last) {
        kl = i % CW;
        hp = i / CW;
      } else {
        kl = i / kHalo;
        hp = i - kl * kHalo;
      }
      const int hd = hp / (kHH * kHW);
      const int hr = hp - hd * (kHH * kHW);
      const int hh = hr / kHW;
      const int hw = hr - hh * kHW;
      const int qd = d0 - 1 + hd, qh = h0 - 1 + hh, qw = w0 - 1 + hw;
      dst[u] = i < kTotal ? kl * kPitch + hp : -1;
      const int c0 = (chunk * CW + kl) * kCh;
      const bool ok = i < kTotal && qd >= 0 && qh >= 0 && qw >= 0 && qd < p.PD && qh < p.PH && qw < p.PW;
      const int64_t e = ok ? nbase + qd * p.sg[2] + qh * p.sg[3] + qw * p.sg[4] + c0 * p.sg[1] : 0;
      const bool ok0 = ok && c0 < p.Cout, ok1 = ok && kCh == 2 && c0 + 1 < p.Cout;
      if constexpr (!ModeTraits<M>::kHalf) {
        lo[u] = load_if(ok0, static_cast<const float*>(p.g) + e);
        hi[u] = 0u;
      } else {
        lo[u] = load_if(ok0, static_cast<const uint16_t*>(p.g) + e);
        hi[u] = load_if(ok1, static_cast<const uint16_t*>(p.g) + e + p.sg[1]);
      }
      plo[u] = load_if(ok0, p.off + e);
      phi[u] = kCh == 2 ? load_if(ok1, p.off + e + p.sg[1]) : 0u;
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      uint32_t word, code;
      make_word<M>(lo[u], hi[u], plo[u], phi[u], word, code);
      if (dst[u] >= 0) {
        if constexpr (M == Mode::kStrict) unsafe |= !split_safe(word);
        sA[dst[u]] = word;
        if constexpr (kSeparateCodes<M>) sC[dst[u]] = code;
      }
    }
  }
  return unsafe;
}

// The same for grad_conv whose channel stride is not 1 (NCDHW and the like): each thread keeps one halo position
// (two for the first kHalo - kThreads threads), decoded and bounds-checked once, and walks the chunk's channels
// with one address step each, kBatch loads in flight before their stores.
template <Mode M, int CW>
__device__ bool stage_grad_planar(const Params& p, uint32_t* __restrict__ sA, uint32_t* __restrict__ sC, int n,
                                  int d0, int h0, int w0, int chunk) {
  constexpr int kBatch = 8;
  constexpr int kPer = (kHalo + kThreads - 1) / kThreads;
  constexpr int kCh = ModeTraits<M>::kHalf ? 2 : 1;  // channels per k-word
  static_assert(CW % kBatch == 0, "whole batches of k-words");
  using elem_t = std::conditional_t<ModeTraits<M>::kHalf, uint16_t, float>;
  bool unsafe = false;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int hp = threadIdx.x + j * kThreads;
    if (hp >= kHalo) break;
    const int hd = hp / (kHH * kHW);
    const int hr = hp - hd * (kHH * kHW);
    const int hh = hr / kHW;
    const int hw = hr - hh * kHW;
    const int qd = d0 - 1 + hd, qh = h0 - 1 + hh, qw = w0 - 1 + hw;
    const bool inside = qd >= 0 && qh >= 0 && qw >= 0 && qd < p.PD && qh < p.PH && qw < p.PW;
    const int c_first = chunk * CW * kCh;
    const int64_t sc = p.sg[1];
    const int64_t at =
        inside ? static_cast<int64_t>(n) * p.sg[0] + qd * p.sg[2] + qh * p.sg[3] + qw * p.sg[4] + c_first * sc : 0;
    const elem_t* gp = static_cast<const elem_t*>(p.g) + at;
    const uint8_t* op = p.off + at;
    // channels of this chunk that exist (0 outside the pooled extent)
    const int avail = inside ? p.Cout - c_first : 0;
#pragma unroll
    for (int kb = 0; kb < CW; kb += kBatch) {
      uint32_t lo[kBatch], hi[kBatch], plo[kBatch], phi[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int c = (kb + u) * kCh;
        lo[u] = load_if(c < avail, gp + c * sc);
        plo[u] = load_if(c < avail, op + c * sc);
        hi[u] = kCh == 2 ? load_if(c + 1 < avail, gp + (c + 1) * sc) : 0u;
        phi[u] = kCh == 2 ? load_if(c + 1 < avail, op + (c + 1) * sc) : 0u;
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        uint32_t word, code;
        make_word<M>(lo[u], hi[u], plo[u], phi[u], word, code);
        if constexpr (M == Mode::kStrict) unsafe |= !split_safe(word);
        sA[(kb + u) * kPitch + hp] = word;
        if constexpr (kSeparateCodes<M>) sC[(kb + u) * kPitch + hp] = code;
      }
    }
  }
  return unsafe;
}

}  // namespace grad_input
}  // namespace conv_transpose3d_post_pool
}  // namespace fused
