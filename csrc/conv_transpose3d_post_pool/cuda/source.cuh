// Where a kernel instantiation reads its convolution operands (input, weight, bias) from: tensors of the mode's I/O
// dtype, or, with CAST, float32 tensors that the kernel rounds to that 16-bit dtype as it loads them, the value
// `t.to(dtype)` would hold (round to nearest even; infinities and NaN kept, overflow to infinity). CAST is
// torch.autocast's casts done inside the kernel (fused::_conv_transpose3d_post_pool_cast), so the casts need no
// kernels and no full copies of their own.
#pragma once

#include "conv_transpose3d_post_pool/cuda/mma.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace fused {
namespace conv_transpose3d_post_pool {

template <Mode M, bool CAST>
struct Source {
  using io_t = typename ModeTraits<M>::io_t;
  static_assert(!CAST || ModeTraits<M>::kHalf, "only 16-bit modes round float32 operands");
  // Bytes of one stored element.
  static constexpr int kElemBytes = CAST ? 4 : static_cast<int>(sizeof(io_t));

  // The 16-bit pattern of element `at` in the I/O dtype (16-bit modes only).
  __device__ static __forceinline__ uint32_t bits16(const void* base, int64_t at) {
    if constexpr (CAST) {
      return bits_of(from_float<io_t>(__ldg(static_cast<const float*>(base) + at)));
    } else {
      return __ldg(static_cast<const unsigned short*>(base) + at);
    }
  }
  // Element `at` as a float, after rounding to the I/O dtype.
  __device__ static __forceinline__ float value(const void* base, int64_t at) {
    if constexpr (CAST) {
      return round_to_io<io_t>(static_cast<const float*>(base)[at]);
    } else {
      return to_float(static_cast<const io_t*>(base)[at]);
    }
  }
  // Two float32 values rounded to the I/O dtype, packed as a k-word (lo: the first).
  __device__ static __forceinline__ uint32_t pack2(float lo, float hi) {
    return bits_of(from_float<io_t>(lo)) | (bits_of(from_float<io_t>(hi)) << 16);
  }

 private:
  __device__ static __forceinline__ uint32_t bits_of(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }
  __device__ static __forceinline__ uint32_t bits_of(__half v) { return __half_as_ushort(v); }
};

}  // namespace conv_transpose3d_post_pool
}  // namespace fused
