// The output side of one kernel instantiation: the dtype the multiplier and the pooled output hold, and where the
// epilogue rounds. Same-dtype instantiations keep both in the mode's I/O dtype and round nothing inside the
// epilogue. MIXED is torch.autocast's chain: a float16/bfloat16 convolution whose output meets a float32
// multiplier, so eager rounds the first LeakyReLU to the I/O dtype and runs the rest in float32.
#pragma once

#include "conv_transpose3d_post_pool/cuda/params.cuh"
#include "common/epilogue.h"

#include <type_traits>

namespace fused {
namespace conv_transpose3d_post_pool {

// leaky(v, s) for a slope in (0, 1]: v * s then lies between 0 and v with v's sign (zeros keep theirs), so the larger
// of v and v * s is the same float as `v > 0 ? v : v * s` for every v, infinities included, and a NaN stays a
// NaN: one max instead of a compare and a select on the epilogue's busiest pipe.
__device__ __forceinline__ float leaky_unit_slope(float v, float s) { return fmaxf(v, v * s); }

template <Mode M, bool MIXED>
struct OutputTraits {
  using io_t = typename ModeTraits<M>::io_t;
  using out_t = std::conditional_t<MIXED, float, io_t>;
  static_assert(!MIXED || ModeTraits<M>::kHalf, "the mixed form takes a float16/bfloat16 convolution");

  __device__ static __forceinline__ float multiplier(const Params& p, int co) {
    return to_float(static_cast<const out_t*>(p.mult)[co * p.m_stride]);
  }
  // The first LeakyReLU's result as the next step sees it.
  __device__ static __forceinline__ float mid(float v) {
    if constexpr (MIXED) {
      return round_to_io<io_t>(v);
    } else {
      return v;
    }
  }
  __device__ static __forceinline__ float epilogue(float y, float m, float s1, float s2) {
    return leaky(mid(leaky(y, s1)) * m, s2);
  }
  __device__ static __forceinline__ void store(const Params& p, int64_t o, float v) {
    static_cast<out_t*>(p.out)[o] = from_float<out_t>(v);
  }
};

}  // namespace conv_transpose3d_post_pool
}  // namespace fused
