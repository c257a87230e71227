// The input gradient's block geometry, shared-memory layout and kernel parameters, shared by the single-
// buffered kernel (grad_input/kernel.cuh) and TF32's double-buffered one (grad_input/kernel_tf32.cuh).
#pragma once

#include "conv_transpose3d_post_pool/cuda/mma.cuh"

#include <cstddef>
#include <cstdint>

namespace fused {
namespace conv_transpose3d_post_pool {
namespace grad_input {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
// Input positions per block tile: kTD x kTH x kTW in (d, h, w). An mma row tile is 2 h-rows x 8 w (rows g at h,
// rows g + 8 at h + 1); each warp holds kMT row tiles, the 8 warps 16 (4 in d x 4 pairs of h rows).
constexpr int kMT = 2;
constexpr int kTD = 4, kTH = 8, kTW = 8;
// The halo: input i needs windows i - 1 and i per dim.
constexpr int kHD = kTD + 1, kHH = kTH + 1, kHW = kTW + 1;
constexpr int kHalo = kHD * kHH * kHW;
// Row pitch of a k-word: = 8 (mod 32), so the 4 k-words x 8 rows of a fragment load hit 32 different banks.
constexpr int kPitch = ((kHalo - 8 + 31) / 32) * 32 + 8;
constexpr int kNT = 2;  // 8-column mma tiles per warp
constexpr int kBlockN = 8 * kNT;
static_assert(kWarps * kMT == (kTD * kTH / 2), "one row tile per (d, h pair) of the block tile");
static_assert(kTW == 8, "a row tile holds 8 w positions per h row");

// These modes keep a second word per staged word: the phase (strict float32) or the two phases as f16 values
// (16-bit modes, compared by one f16x2 set.eq). (TF32, which keeps the phase inside the staged word, has its own
// double-buffered kernel: grad_input/kernel_tf32.cuh.)
template <Mode M>
constexpr bool kSeparateCodes = true;

template <Mode M>
constexpr size_t smem_words(int chunk_words) {
  return static_cast<size_t>(27 * kBlockN + (kSeparateCodes<M> ? 2 : 1) * kPitch) * chunk_words;
}

struct Params {
  const void* g;       // grad_conv [N, Cout, PD, PH, PW]
  const uint8_t* off;  // offsets, the same strides
  const void* w;       // weight [Cin, Cout, 3, 3, 3]
  void* gi;            // grad_input [N, Cin, D, H, W]
  int64_t sg[5];
  int64_t sw[5];
  int64_t si[5];
  int64_t n_tiles;
  int N, Cin, Cout, D, H, W, PD, PH, PW;
  int tiles_d, tiles_h, tiles_w;
  int nchunks;
  bool g_channels_last;  // only picks the staging loop order (addresses always use the strides)
};

}  // namespace grad_input
}  // namespace conv_transpose3d_post_pool
}  // namespace fused
