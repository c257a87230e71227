// Staging of the weight-gradient kernel's K tiles (grad_weight/kernel.cuh): each thread's global loads of
// one tile into registers, then their stores to shared memory in fragment order.
#pragma once

#include "conv_transpose3d_post_pool/cuda/grad_weight/params.cuh"
#include "conv_transpose3d_post_pool/cuda/tiles.cuh"

#include <cstdint>

namespace fused {
namespace conv_transpose3d_post_pool {
namespace grad_weight {

// The K tile's position (tiles.cuh).
__device__ __forceinline__ TileOrigin tile_origin(const WeightGradParams& p, int64_t tile) {
  return decode_tile(tile, p.n_tiles, p.tiles_d, p.tiles_h, p.tiles_w, kTD, kTH, kTW);
}

// Staging of one tile by one thread. Every tensor is contiguous (the launcher makes it
// so), and the element -> thread mapping is fixed, so addresses and shared-memory slots are a per-thread base plus
// compile-time steps. grad_conv/offsets: element u (< 16) of thread (warp wid, lane) is tile row u >> 3 (d),
// (u >> 1) & 3 (h), and
//   float32: w = (u & 1) * 8 + lane % 8, channel ((wid >> 2) * 2 + lane / 16) * 8 + (wid & 3) * 2 + lane / 8 % 2;
//   16-bit:  w = lane % 16, channel (wid >> 2) * 16 + (u & 1) * 8 + (wid & 3) * 2 + lane / 16;
// so that a warp's 32 scattered stores of one u hit 32 distinct banks (16 words, two halves each, for 16-bit).
// float32 input halo: halo position tid (< 255), input channels u < 16; 16-bit input halo: halo row tid / 8 % 16
// (< 15) and position pair tid % 8 of channels tid / 128 + 2u (u < 8), plus the last halo column (w = 16) of
// (channel, row) = (tid / 15, tid % 15) for tid < 240.
constexpr int kGradPer = kPos * kBN / kThreads;  // 16
static_assert(kGradPer == 16 && kThreads == 256, "the element mapping above");
template <Mode M>
struct TileRegs {
  static constexpr int kX = ModeTraits<M>::kHalf ? 17 : 16;
  uint32_t g[kGradPer];    // grad_conv bits
  uint32_t off[kGradPer];  // offsets; 8 (no phase) outside the tensor
  uint32_t x[kX];          // input bits (16-bit: 8 pairs as 16 halves, then the last column)
};

template <Mode M>
__device__ __forceinline__ void load_tile(const WeightGradParams& p, const TileOrigin& o, int ci0, int co0,
                                          TileRegs<M>& r) {
  constexpr bool kHalf = ModeTraits<M>::kHalf;
  const int tid = threadIdx.x;
  {
    const int lane = tid & 31, wid = tid >> 5;
    const int kp = kHalf ? (lane & 15) : (lane & 7);
    const int co = kHalf ? (wid >> 2) * 16 + (wid & 3) * 2 + (lane >> 4)
                         : ((wid >> 2) * 2 + (lane >> 4)) * 8 + (wid & 3) * 2 + ((lane >> 3) & 1);
    const int64_t phw = static_cast<int64_t>(p.PH) * p.PW;
    const int64_t plane = phw * p.PD;
    const int64_t at = (static_cast<int64_t>(o.n) * p.Cout + co0 + co) * plane + o.qd0 * phw +
                       static_cast<int64_t>(o.qh0) * p.PW + o.qw0 + kp;
    // Element u = 2 * row + j: tile row (d, h) = (row / kTH, row % kTH); j picks w + 8 (float32) or channel + 8
    // (16-bit). Validity per row and per j, combined per element.
    bool j_ok[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      j_ok[j] = kHalf ? o.qw0 + kp < p.PW && co0 + co + 8 * j < p.Cout
                      : o.qw0 + 8 * j + kp < p.PW && co0 + co < p.Cout;
    }
    const int64_t jstep = kHalf ? 8 * plane : 8;
    static_assert(kGradPer == 2 * kTD * kTH, "two elements per tile row");
#pragma unroll
    for (int row = 0; row < kTD * kTH; ++row) {
      const int d = row / kTH, h = row % kTH;
      const bool row_ok = o.qd0 + d < p.PD && o.qh0 + h < p.PH;
      const int64_t e0 = at + d * phw + static_cast<int64_t>(h) * p.PW;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int u = 2 * row + j;
        const bool ok = row_ok && j_ok[j];
        const int64_t e = e0 + j * jstep;
        if constexpr (kHalf) {
          r.g[u] = ok ? ld_pinned_u16(static_cast<const uint16_t*>(p.gc) + e) : 0u;
        } else {
          r.g[u] = ok ? ld_pinned_u32(static_cast<const float*>(p.gc) + e) : 0u;
        }
        r.off[u] = ok ? ld_pinned_u8(p.off + e) : 8u;
      }
    }
  }
  const int64_t plane = static_cast<int64_t>(p.D) * p.H * p.W;
  if constexpr (!kHalf) {
    const int hd = tid / (kHH * kHW), hh = (tid / kHW) % kHH, hw = tid % kHW;
    const int d = o.qd0 + hd, h = o.qh0 + hh, w = o.qw0 + hw;
    const bool pos_ok = tid < kHaloRows * kHW && d < p.D && h < p.H && w < p.W;
    const int nci = p.Cin - ci0;
    const float* xp = static_cast<const float*>(p.x) + (static_cast<int64_t>(o.n) * p.Cin + ci0) * plane +
                      (static_cast<int64_t>(d) * p.H + h) * p.W + w;
#pragma unroll
    for (int u = 0; u < 16; ++u) {
      r.x[u] = pos_ok && u < nci ? ld_pinned_u32(xp) : 0u;
      xp += plane;
    }
  } else {
    const uint16_t* x16 = static_cast<const uint16_t*>(p.x);
    {
      const int row = (tid / 8) % 16, j = tid % 8, c0 = tid / 128;
      const int d = o.qd0 + row / kHH, h = o.qh0 + row % kHH, w = o.qw0 + 2 * j;
      const bool row_ok = row < kHaloRows && d < p.D && h < p.H;
      const int nci = p.Cin - ci0 - c0;
      const bool w0_ok = row_ok && w < p.W, w1_ok = row_ok && w + 1 < p.W;
      const uint16_t* xp = x16 + (static_cast<int64_t>(o.n) * p.Cin + ci0 + c0) * plane +
                           (static_cast<int64_t>(d) * p.H + h) * p.W + w;
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        r.x[2 * u] = w0_ok && 2 * u < nci ? ld_pinned_u16(xp) : 0u;
        r.x[2 * u + 1] = w1_ok && 2 * u < nci ? ld_pinned_u16(xp + 1) : 0u;
        xp += 2 * plane;
      }
    }
    {
      const int ci = tid / kHaloRows, row = tid % kHaloRows;
      const int d = o.qd0 + row / kHH, h = o.qh0 + row % kHH, w = o.qw0 + kTW;
      const bool ok = tid < kBM * kHaloRows && ci0 + ci < p.Cin && d < p.D && h < p.H && w < p.W;
      r.x[16] = ok ? ld_pinned_u16(x16 + (static_cast<int64_t>(o.n) * p.Cin + ci0 + ci) * plane +
                            (static_cast<int64_t>(d) * p.H + h) * p.W + w)
                   : 0u;
    }
  }
}

// Stores a loaded tile: each grad_conv element into the B copy of its phase (offset; an element with no phase is a
// zero, stored in copy 0), in fragment order, after clearing the slot in the copy it took in the previous tile
// (`prev`: that copy's byte offset, updated; the same thread owns the slot in every tile). The input halo as A words
// (float32 operands TF32-rounded for the TF32 mode). The 16-bit halo's odd-shift copy is built afterwards from the
// stored pairs (build_shifted_pairs), after a barrier.
template <Mode M>
__device__ __forceinline__ void store_tile(const TileRegs<M>& r, uint32_t (&prev)[kGradPer],
                                           uint32_t* __restrict__ sB, uint32_t* __restrict__ sX,
                                           uint16_t* __restrict__ sLast) {
  using S = Smem<M>;
  const int tid = threadIdx.x;
  {
    const int lane = tid & 31, wid = tid >> 5;
    // `prev` and the phase offsets are byte offsets of a phase's copy (kPhaseWords * 4 = 1 << kPhaseShift).
    constexpr int kPhaseShift = S::kHalf ? 13 : 14;
    static_assert(S::kPhaseWords * 4 == 1 << kPhaseShift, "phase copies of 2^kPhaseShift bytes");
    if constexpr (S::kHalf) {
      // half index 2 * word + (position parity) of word k-step * 256 + (nt >> 1) * 128 + (g * 4 + t) * 4 +
      // (nt & 1) * 2 + hi, k-word kw = t + 4 hi = lane / 2 % 8, g = (wid & 3) * 2 + lane / 16, nt = (wid >> 2) * 2 +
      // (u & 1), k-step u >> 1
      const int kw = (lane >> 1) & 7, g = (wid & 3) * 2 + (lane >> 4);
      const int slot = ((wid >> 2) * 128 + (g * 4 + (kw & 3)) * 4 + (kw >> 2)) * 2 + (lane & 1);
      char* sb = reinterpret_cast<char*>(sB) + 2 * slot;
#pragma unroll
      for (int u = 0; u < kGradPer; ++u) {
        const int at = 2 * ((u >> 1) * 512 + (u & 1) * 4);
        const uint32_t ph = (r.off[u] & 7u) << kPhaseShift;
        *reinterpret_cast<uint16_t*>(sb + prev[u] + at) = 0;
        *reinterpret_cast<uint16_t*>(sb + ph + at) = static_cast<uint16_t>(r.off[u] < 8u ? r.g[u] : 0u);
        prev[u] = ph;
      }
    } else {
      // word k-step * 256 + (nt >> 1) * 128 + (g * 4 + t) * 4 + (nt & 1) * 2 + hi with k = t + 4 hi = lane % 8,
      // g = (wid & 3) * 2 + lane / 8 % 2, nt = (wid >> 2) * 2 + lane / 16, k-step u
      const int kp = lane & 7;
      const int slot = (wid >> 2) * 128 + (((wid & 3) * 2 + ((lane >> 3) & 1)) * 4 + (kp & 3)) * 4 +
                       (lane >> 4) * 2 + (kp >> 2);
      char* sb = reinterpret_cast<char*>(sB) + 4 * slot;
#pragma unroll
      for (int u = 0; u < kGradPer; ++u) {
        const int at = 4 * (u * 256);
        const uint32_t ph = (r.off[u] & 7u) << kPhaseShift;
        const uint32_t v = r.off[u] < 8u ? r.g[u] : 0u;
        *reinterpret_cast<uint32_t*>(sb + prev[u] + at) = 0u;
        *reinterpret_cast<uint32_t*>(sb + ph + at) =
            M == Mode::kTF32 ? conv_transpose3d_post_pool::tf32_round(__uint_as_float(v)) : v;
        prev[u] = ph;
      }
    }
  }
  if constexpr (!S::kHalf) {
    if (tid < kHaloRows * kHW) {
#pragma unroll
      for (int u = 0; u < 16; ++u) {
        sX[u * S::kXPitch + tid] =
            M == Mode::kTF32 ? conv_transpose3d_post_pool::tf32_round(__uint_as_float(r.x[u])) : r.x[u];
      }
    }
  } else {
    const int row = (tid / 8) % 16, j = tid % 8, c0 = tid / 128;
    if (row < kHaloRows) {
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        sX[(c0 + 2 * u) * S::kXPitch + row * (kTW / 2) + j] = r.x[2 * u] | (r.x[2 * u + 1] << 16);
      }
    }
    if (tid < kBM * kHaloRows) sLast[tid] = static_cast<uint16_t>(r.x[16]);
  }
}

// 16-bit halo: the shift-1 copy, pairs (x[2j + 1], x[2j + 2]), from the stored shift-0 pairs and the last column.
template <Mode M>
__device__ __forceinline__ void build_shifted_pairs(uint32_t* __restrict__ sX, const uint16_t* __restrict__ sLast) {
  using S = Smem<M>;
  constexpr int kPairs = kTW / 2;
  constexpr int kTotal = kBM * kHaloRows * kPairs;
  for (int i = threadIdx.x; i < kTotal; i += kThreads) {
    const int j = i % kPairs, row = (i / kPairs) % kHaloRows, ci = i / (kPairs * kHaloRows);
    const uint32_t* src = sX + ci * S::kXPitch + row * kPairs;
    const uint32_t next = j + 1 < kPairs ? src[j + 1] : static_cast<uint32_t>(sLast[ci * kHaloRows + row]);
    sX[(kBM + ci) * S::kXPitch + row * kPairs + j] = __byte_perm(src[j], next, 0x5432);
  }
}

}  // namespace grad_weight
}  // namespace conv_transpose3d_post_pool
}  // namespace fused
