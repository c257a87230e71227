// The weight-gradient kernel's block geometry, parameters, shared-memory layout and the taps each compute warp
// owns (conv_post_pool_grad_weight.cuh has the kernel; conv_post_pool_grad_weight_stage.cuh its staging).
#pragma once

#include "conv_post_pool_mma.cuh"

#include <cstddef>
#include <cstdint>

namespace fused {
namespace conv_grad {


using conv_pool::Mode;
using conv_pool::ModeTraits;

constexpr int kThreads = 256;
constexpr int kTD = 2, kTH = 4, kTW = 16;  // pooled positions per K tile
constexpr int kPos = kTD * kTH * kTW;
constexpr int kHD = kTD + 1, kHH = kTH + 1, kHW = kTW + 1;  // input halo: q and q + 1 per dim
constexpr int kHaloRows = kHD * kHH;
constexpr int kBM = 16;  // input channels per block (one mma row tile)
constexpr int kNT = 4;   // 8-column mma tiles
constexpr int kBN = 8 * kNT;  // output channels per block
constexpr int kMaxTaps = 4;   // per warp
constexpr int kComputeWarps = 7;

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
  // B (grad_conv) in fragment order: per k-step, per pair of column tiles, 32 lanes x 4 words.
  static constexpr int kGWords = kSteps * 2 * 128;
  // One-hot offset bytes (1 << offset; 0 outside the tensor): per k-step and lane, one byte per element of its 8
  // B words, in word order (two per word for 16-bit types).
  static constexpr int kOneHotBytesPerLane = 8 * kPosPerWord;
  static constexpr int kOneHotWords = kSteps * 32 * kOneHotBytesPerLane / 4;
  // A (the input halo): float32: [ci][halo position], the pitch = 4 (mod 32) so a fragment's 8 rows x 4 k-words hit
  // 32 banks; 16-bit: two copies [w parity shift][ci][halo row][8 position pairs], pairs (2j, 2j + 1) and (2j + 1,
  // 2j + 2), since a k-word of the mma holds two consecutive positions and tap delta_w = 1 starts at an odd one.
  static constexpr int kXPitch = kHalf ? 132 : 260;
  static_assert(kHalf ? kXPitch >= kHaloRows * 8 : kXPitch >= kHaloRows * kHW, "halo must fit its pitch");
  static constexpr int kXWords = (kHalf ? 2 : 1) * kBM * kXPitch;
  // 16-bit: the halo's last column (w = 16) of every (channel, row), for the shift-1 pairs.
  static constexpr int kLastWords = kHalf ? kBM * kHaloRows / 2 : 0;
  static constexpr int kWords = kGWords + kOneHotWords + kXWords + kLastWords;
  static constexpr size_t kBytes = static_cast<size_t>(kWords) * 4;
};

// The taps of each compute warp: up to two phases, with the deltas (bits dd << 2 | dh << 1 | dw) of their taps.
// Phases with more taps take a warp alone (phase 7, with 8 taps, two).
struct WarpTaps {
  int nphase;
  int phase[2];
  int ntap[2];
  int delta[2][kMaxTaps];
};
__host__ __device__ constexpr WarpTaps warp_taps(int w) {
  return w == 0   ? WarpTaps{2, {0, 1}, {1, 2}, {{0, 0, 0, 0}, {0, 1, 0, 0}}}
         : w == 1 ? WarpTaps{2, {2, 4}, {2, 2}, {{0, 2, 0, 0}, {0, 4, 0, 0}}}
         : w == 2 ? WarpTaps{1, {3, 0}, {4, 0}, {{0, 1, 2, 3}, {0, 0, 0, 0}}}
         : w == 3 ? WarpTaps{1, {5, 0}, {4, 0}, {{0, 1, 4, 5}, {0, 0, 0, 0}}}
         : w == 4 ? WarpTaps{1, {6, 0}, {4, 0}, {{0, 2, 4, 6}, {0, 0, 0, 0}}}
         : w == 5 ? WarpTaps{1, {7, 0}, {4, 0}, {{0, 1, 2, 3}, {0, 0, 0, 0}}}
                  : WarpTaps{1, {7, 0}, {4, 0}, {{4, 5, 6, 7}, {0, 0, 0, 0}}};
}

// Tap index kd * 9 + kh * 3 + kw of phase p with input delta d (per dim: bit 0 -> tap 1; bit 1, delta 0 -> tap 2;
// bit 1, delta 1 -> tap 0).
__host__ __device__ constexpr int tap_of(int p, int d) {
  return ((p & 4) ? ((d & 4) ? 0 : 2) : 1) * 9 + ((p & 2) ? ((d & 2) ? 0 : 2) : 1) * 3 +
         ((p & 1) ? ((d & 1) ? 0 : 2) : 1);
}

}  // namespace conv_grad
}  // namespace fused
