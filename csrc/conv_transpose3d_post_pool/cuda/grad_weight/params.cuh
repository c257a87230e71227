// The weight-gradient kernel's block geometry, parameters, shared-memory layout and the taps each compute warp
// owns (grad_weight/kernel.cuh has the kernel; grad_weight/stage.cuh its staging).
#pragma once

#include "conv_transpose3d_post_pool/cuda/mma.cuh"

#include <cstddef>
#include <cstdint>

namespace fused {
namespace conv_transpose3d_post_pool {
namespace grad_weight {


using conv_transpose3d_post_pool::Mode;
using conv_transpose3d_post_pool::ModeTraits;

constexpr int kThreads = 256;  // 8 warps: each stages part of every tile and computes its taps (warp_taps)
constexpr int kComputeWarps = kThreads / 32;
constexpr int kTD = 2, kTH = 4, kTW = 16;  // pooled positions per K tile
constexpr int kPos = kTD * kTH * kTW;
constexpr int kHD = kTD + 1, kHH = kTH + 1, kHW = kTW + 1;  // input halo: q and q + 1 per dim
constexpr int kHaloRows = kHD * kHH;
constexpr int kBM = 16;  // input channels per block (one mma row tile)
constexpr int kNT = 4;   // 8-column mma tiles
constexpr int kBN = 8 * kNT;  // output channels per block
constexpr int kMaxTaps = 4;   // per warp

struct WeightGradParams {
  const void* gc;         // grad_conv, contiguous
  const uint8_t* off;     // offsets, contiguous
  const void* x;          // input, contiguous
  float* ws;              // partials [gridDim.x, ci tiles, co tiles, 27, kBM, kBN]
  int64_t n_tiles;
  int N, Cin, Cout, D, H, W, PD, PH, PW;
  int tiles_d, tiles_h, tiles_w;
};

// Shared-memory layout of one K tile, in 32-bit words.
template <Mode M>
struct Smem {
  static constexpr bool kHalf = ModeTraits<M>::kHalf;
  static constexpr int kPosPerWord = kHalf ? 2 : 1;  // positions per k-word (the GEMM's K is positions)
  static constexpr int kSteps = kPos / (8 * kPosPerWord);
  // B of one phase: grad_conv where the element's offset is that phase, zero elsewhere, in fragment order (per
  // k-step, per pair of column tiles, 32 lanes x 4 words). Staging scatters each element into its phase's copy
  // and clears its slot in the copy the previous tile used, so the compute warps read masked B with plain loads.
  static constexpr int kPhaseWords = kSteps * 2 * 128;
  static constexpr int kBWords = 8 * kPhaseWords;
  // A (the input halo): float32: [ci][halo position], the pitch = 4 (mod 32) so a fragment's 8 rows x 4 k-words hit
  // 32 banks; 16-bit: two copies [w parity shift][ci][halo row][8 position pairs], pairs (2j, 2j + 1) and (2j + 1,
  // 2j + 2), since a k-word of the mma holds two consecutive positions and tap delta_w = 1 starts at an odd one.
  static constexpr int kXPitch = kHalf ? 132 : 260;
  static_assert(kHalf ? kXPitch >= kHaloRows * 8 : kXPitch >= kHaloRows * kHW, "halo must fit its pitch");
  static constexpr int kXWords = (kHalf ? 2 : 1) * kBM * kXPitch;
  // 16-bit: the halo's last column (w = 16) of every (channel, row), for the shift-1 pairs.
  static constexpr int kLastWords = kHalf ? kBM * kHaloRows / 2 : 0;
  static constexpr int kWords = kBWords + kXWords + kLastWords;
  static constexpr size_t kBytes = static_cast<size_t>(kWords) * 4;
};

// The taps of each compute warp: up to four, as input deltas (bits dd << 2 | dh << 1 | dw), slot k in nibble k;
// slots below `split` belong to phase0, the others to phase1. A warp's taps share its phases' B fragments: one
// 16-byte load pair per phase and k-step. Phase 7 (8 taps) takes two warps; phase 0 (1 tap) joins phase 1 (2). The
// order spreads the four-tap warps over the four schedulers (warp % 4).
struct WarpTaps {
  int phase0, phase1;
  int ntap, split;
  uint32_t deltas;
};
__host__ __device__ constexpr WarpTaps warp_taps(int w) {
  return w == 0   ? WarpTaps{7, 7, 4, 4, 0x3210u}
         : w == 1 ? WarpTaps{3, 3, 4, 4, 0x3210u}
         : w == 2 ? WarpTaps{5, 5, 4, 4, 0x5410u}
         : w == 3 ? WarpTaps{6, 6, 4, 4, 0x6420u}
         : w == 4 ? WarpTaps{1, 0, 3, 2, 0x010u}
         : w == 5 ? WarpTaps{7, 7, 4, 4, 0x7654u}
         : w == 6 ? WarpTaps{2, 2, 2, 2, 0x20u}
                  : WarpTaps{4, 4, 2, 2, 0x40u};
}
__host__ __device__ constexpr int slot_phase(const WarpTaps& wt, int k) { return k < wt.split ? wt.phase0 : wt.phase1; }

// Tap index kd * 9 + kh * 3 + kw of phase p with input delta d (per dim: bit 0 -> tap 1; bit 1, delta 0 -> tap 2;
// bit 1, delta 1 -> tap 0).
__host__ __device__ constexpr int tap_of(int p, int d) {
  return ((p & 4) ? ((d & 4) ? 0 : 2) : 1) * 9 + ((p & 2) ? ((d & 2) ? 0 : 2) : 1) * 3 +
         ((p & 1) ? ((d & 1) ? 0 : 2) : 1);
}

// Every tap is owned by exactly one (warp, slot), with a delta its phase uses (a subset of the phase's bits).
__host__ __device__ constexpr bool taps_covered() {
  int seen[27] = {};
  for (int w = 0; w < kComputeWarps; ++w) {
    const WarpTaps wt = warp_taps(w);
    // the shapes warp_tile is instantiated for (the kernel's switch)
    const bool shape = (wt.ntap == 4 && wt.split == 4) || (wt.ntap == 2 && wt.split == 2) ||
                       (wt.ntap == 3 && wt.split == 2);
    if (!shape || (wt.split == wt.ntap && wt.phase1 != wt.phase0)) return false;
    for (int k = 0; k < wt.ntap; ++k) {
      const int d = static_cast<int>((wt.deltas >> (4 * k)) & 15u), ph = slot_phase(wt, k);
      if (d > 7 || (d & ~ph) != 0) return false;
      ++seen[tap_of(ph, d)];
    }
  }
  for (int t = 0; t < 27; ++t)
    if (seen[t] != 1) return false;
  return true;
}
static_assert(taps_covered(), "warp_taps must give every tap to exactly one warp slot");

}  // namespace grad_weight
}  // namespace conv_transpose3d_post_pool
}  // namespace fused
