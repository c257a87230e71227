// What the launcher of the fused transposed convolution (launch.cu) hands to the per-precision
// kernel files (instantiations/), and the block geometry both sides agree on.
#pragma once

#include "conv_transpose3d_post_pool/cuda/mma.cuh"

#include <cuda_runtime.h>

#include <cstdint>

namespace fused {
namespace conv_transpose3d_post_pool {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
// Pooled positions per block tile: (2 * MT) x kTileH x kTileW in (d, h, w); each warp computes MT rows of
// kTileW positions (one 16-row mma tile each) for all kBlockN output channels of the block.
constexpr int kTileH = 4;
constexpr int kTileW = 16;
constexpr int kNT = 4;  // 8-column mma tiles per warp
constexpr int kBlockN = 8 * kNT;
// Largest number of k-words staged at once; more input channels are processed in chunks.
constexpr int kMaxChunkWords = 32;

template <int MT>
struct TileShape {
  static constexpr int kTD = kWarps * MT / kTileH;
  // The input halo: pooled q needs inputs q and q + 1 per dim.
  static constexpr int kHD = kTD + 1, kHH = kTileH + 1, kHW = kTileW + 1;
  static constexpr int kHalo = kHD * kHH * kHW;
  // Row pitch of a k-word in shared memory: = 8 (mod 32), so the 4 k-words x 8 rows of an A fragment load hit
  // 32 different banks.
  static constexpr int kPitch = ((kHalo - 8 + 31) / 32) * 32 + 8;
  static constexpr int kPositions = kTD * kTileH * kTileW;
};

// Shared memory of one block: the weight of its kBlockN channels (27 taps), `halos` input halo buffers for one
// chunk, the channels' multipliers and biases, then two tile origins (4 ints each) of a pipelined block.
template <int MT>
constexpr size_t smem_bytes(int chunk_words, int halos) {
  return (static_cast<size_t>(27 * kBlockN + halos * TileShape<MT>::kPitch) * chunk_words + 2 * kBlockN + 8) *
         sizeof(uint32_t);
}

// Whether an instantiation stages the next tile's halo while it computes the current one (two halo buffers): when
// one chunk holds all of Cin (KS below the largest chunk; larger Cin restages per chunk), two blocks of two
// buffers still fit one multiprocessor's shared memory (228 KB, 1 KB of it reserved per block), and not for strict
// float32, whose three-product split already fills the registers (the prefetch made it spill hundreds of bytes).
template <Mode M, int MT, int KS>
constexpr bool kPipelined = M != Mode::kStrict && KS < kMaxChunkWords / 8 &&
                            2 * (smem_bytes<MT>(8 * KS, 2) + 1024) <= 228 * 1024;

// Shared memory per block of the instantiation (M, MT, KS).
template <Mode M, int MT, int KS>
constexpr size_t kKernelSmem = smem_bytes<MT>(8 * KS, kPipelined<M, MT, KS> ? 2 : 1);

// An encoded CUtensorMap (128 opaque bytes, 64-byte aligned as the TMA unit reads it from the kernel's parameters),
// kept opaque here so that this header needs no driver API header.
struct alignas(64) TensorMapBytes {
  uint64_t opaque[16];
};

struct Params {
  // sm_90a kernel, 16-bit training forms: the outputs, selected values and offsets as (w, c, h, d, n) tensors for the
  // whole units' TMA stores (hopper/unit_maps.h), valid where unit_tma.
  TensorMapBytes unit_maps[3];
  const void* x;
  const void* w;
  const void* bias;  // nullptr without a bias
  const void* mult;
  void* out;
  void* sel;         // training form only
  uint8_t* off;      // training form only
  int64_t sx[5];     // input strides (n, c, d, h, w), elements
  int64_t sw[5];     // weight strides (cin, cout, kd, kh, kw)
  int64_t so[5];     // out / selected / offsets strides (n, c, d, h, w)
  int64_t m_stride;  // 0 (one multiplier) or 1
  int64_t n_tiles;
  int N, Cin, Cout, D, H, W, PD, PH, PW;
  int tiles_d, tiles_h, tiles_w;
  int chunk_words;  // k-words staged per chunk, a multiple of 8
  int nchunks;
  float s1, s2;
  bool unit_slopes;       // both slopes in (0, 1]: the epilogue's one-max leaky (kernel.cuh)
  bool x_channels_last;  // only picks the staging loop order (addresses always use the strides)
  bool x_rows16;         // sm_90a kernel: x's w rows load as aligned 16-byte vectors (hopper/stage.cuh)
  bool w_bulk;           // sm_90a kernel: the block's weight rows arrive by bulk copies (hopper/stage.cuh)
  bool out_rows;         // sm_90a kernel: whole output rows store as aligned vectors (hopper/epilogue.cuh)
  bool halves;           // sm_90a kernel: work handed out by half units (hopper/kernel.cuh), set by its launcher
  bool unit_tma;         // sm_90a kernel: unit_maps hold the tensors' maps (hopper/unit_maps.h), set by its launcher
  uint32_t ablate;       // sm_90a kernel: ConvHopperAblation bits (ablation.h), 0 but when measuring
  long long* trace;      // sm_90a kernel, measurement build: event clocks (hopper/trace.cuh), nullptr but when measuring
};

// Launches one precision's kernel (defined in kernel.cuh, instantiated per precision and output form in
// instantiations/). mt: 1 or 2 mma row tiles per warp; train: write selected and offsets. MIXED: a float32
// multiplier and output for a float16/bfloat16 convolution (output.cuh).
template <Mode M, bool MIXED>
void launch_form(const Params& p, int mt, bool train, cudaStream_t stream);

namespace hopper {
// The sm_90a kernel (hopper/kernel.cuh), instantiated per precision and output form in hopper/instantiations/;
// only where hopper_applies (launch.cu). CAST: float32 input, weight and bias rounded to M's 16-bit dtype on load
// (cuda/source.cuh), the mixed inference form only.
template <Mode M, bool MIXED, bool CAST = false>
void launch_hopper_form(const Params& p, bool train, cudaStream_t stream);
}  // namespace hopper

// Benchmark hook: forces the row tiles per warp (1 or 2) when non-zero. Never set by the operators.
int& mt_override();

}  // namespace conv_transpose3d_post_pool
}  // namespace fused
