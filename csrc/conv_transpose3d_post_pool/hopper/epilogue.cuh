// The sm_90a kernel's epilogue (kernel.cuh): from one m64 tile's accumulators (all 8 phases of each of the thread's
// (position, channel) pairs) to the pooled outputs, with the mma.sync kernel's arithmetic and max_pool3d's rules.
#pragma once

#include "conv_transpose3d_post_pool/cuda/output.cuh"
#include "conv_transpose3d_post_pool/cuda/stage.cuh"
#include "conv_transpose3d_post_pool/cuda/tiles.cuh"
#include "conv_transpose3d_post_pool/hopper/geometry.cuh"
#include "common/epilogue.h"

namespace fused {
namespace conv_transpose3d_post_pool {
namespace hopper {

// Everything the epilogue reads per block: the block's multipliers and biases (shared memory), its first channel,
// and the block-uniform form.
struct EpilogueArgs {
  const float* mult;
  const float* bias;
  int co0;
  bool exact;  // else the monotone form: the weights were staged negated for negative multipliers
};

// Accumulator register r (0..15) of a slot (geometry.cuh: slot j holds phase slot_phase(j)): column chunk r / 4 (8 channels), row half (r / 2) % 2 (rows g, g + 8
// of the warp's 16), channel pair r % 2: channel 8 * (r / 4) + 2 * t + r % 2; rows are the tile's pooled rows
// 2 * warp + half at column g.
template <Mode M, bool TRAIN, bool MIXED>
__device__ __forceinline__ void store_tile(const Params& p, const float (&acc)[8][16], const TileOrigin& u, int mt,
                                           int warp, int g, int t, const EpilogueArgs& a) {
  using io_t = typename ModeTraits<M>::io_t;
  using Out = OutputTraits<M, MIXED>;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int qh = u.qh0 + 2 * warp + half, qw = u.qw0 + 8 * mt + g;
    const bool inside = qh < p.PH && qw < p.PW;
    const int64_t row = static_cast<int64_t>(u.n) * p.so[0] + static_cast<int64_t>(u.qd0) * p.so[2] +
                        static_cast<int64_t>(qh) * p.so[3] + static_cast<int64_t>(qw) * p.so[4];
#pragma unroll
    for (int r4 = 0; r4 < 4; ++r4) {
#pragma unroll
      for (int pair = 0; pair < 2; ++pair) {
        const int r = r4 * 4 + half * 2 + pair;
        const int c = 8 * r4 + 2 * t + pair;
        const float m = a.mult[c], b = a.bias[c];
        float best, sel = 0.f;
        uint32_t off = 0;
        if (!a.exact) {
          float v = acc[0][r];
#pragma unroll
          for (int j = 1; j < 8; ++j) v = max_nan(v, acc[j][r]);
          float y = (m < 0.f ? -v : v) + b;
          if constexpr (ModeTraits<M>::kHalf) y = round_to_io<io_t>(y);
          best = Out::epilogue(y, m, p.s1, p.s2);
        } else {
          best = 0.f;
#pragma unroll
          for (int ph = 0; ph < 8; ++ph) {
            float y = acc[phase_slot(ph)][r] + b;
            if constexpr (ModeTraits<M>::kHalf) y = round_to_io<io_t>(y);
            const float e = p.unit_slopes ? leaky_unit_slope(Out::mid(leaky_unit_slope(y, p.s1)) * m, p.s2)
                                          : Out::epilogue(y, m, p.s1, p.s2);
            // max_pool3d starts from phase 0 whatever its value (an all -inf window reports offset 0).
            const bool take = ph == 0 || takes_max(e, best);
            best = take ? e : best;
            if constexpr (TRAIN) {
              sel = take ? y : sel;
              off = take ? static_cast<uint32_t>(ph) : off;
            }
          }
        }
        if (inside && a.co0 + c < p.Cout) {
          const int64_t o = row + static_cast<int64_t>(a.co0 + c) * p.so[1];
          Out::store(p, o, best);
          if constexpr (TRAIN) {
            static_cast<io_t*>(p.sel)[o] = from_float<io_t>(sel);
            p.off[o] = static_cast<uint8_t>(off);
          }
        }
      }
    }
  }
}

// Where the block saw an infinite or NaN weight: the tensor cores multiplied it by the zero staged for a missing
// neighbour (q + 1 past the input), NaN where the convolution has no term. The unit's pooled outputs on the input's
// far edge are recomputed exactly from global memory, one thread per (position, channel) of the warpgroup (ctid
// 0..127), after the warpgroup's stores (the caller's barrier).
template <Mode M, bool TRAIN, bool MIXED, bool CAST>
__device__ void fix_unit_edges(const Params& p, const TileOrigin& u, int co0, int ctid) {
  for (int i = ctid; i < kTH * kTW * kCoBlock; i += 128) {
    const int co = co0 + i % kCoBlock;
    const int qw = u.qw0 + (i / kCoBlock) % kTW;
    const int qh = u.qh0 + i / (kCoBlock * kTW);
    if (co >= p.Cout || qh >= p.PH || qw >= p.PW) continue;
    if (u.qd0 + 1 < p.D && qh + 1 < p.H && qw + 1 < p.W) continue;
    recompute_exact_output<M, TRAIN, MIXED, CAST>(p, u.n, u.qd0, qh, qw, co);
  }
}

}  // namespace hopper
}  // namespace conv_transpose3d_post_pool
}  // namespace fused
