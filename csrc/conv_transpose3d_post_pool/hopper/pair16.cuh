// Two values of a 16-bit I/O dtype (bfloat16 or float16) in one 32-bit register, for the sm_90a kernel's 16-bit
// training epilogue (epilogue.cuh): one instruction rounds, compares or takes the max of two outputs' phases.
// Element 0 is the low half, element 1 the high half.
#pragma once

#include "conv_transpose3d_post_pool/cuda/mma.cuh"

#include <cstdint>

namespace fused {
namespace conv_transpose3d_post_pool {
namespace hopper {

template <Mode M>
struct Pair16 {
  static_assert(M == Mode::kBF16 || M == Mode::kFP16, "a 16-bit I/O dtype");
  static constexpr bool kBF16 = M == Mode::kBF16;

  // Both floats rounded to the dtype (to nearest even, as from_float), x0 in the low half.
  __device__ static __forceinline__ uint32_t round(float x0, float x1) {
    uint32_t d;
    if constexpr (kBF16) {
      asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(x1), "f"(x0));
    } else {
      asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(x1), "f"(x0));
    }
    return d;
  }
  // Per half, the larger of the two, NaN if either is (max_pool3d lets a NaN win).
  __device__ static __forceinline__ uint32_t max_nan(uint32_t a, uint32_t b) {
    uint32_t d;
    if constexpr (kBF16) {
      asm("max.NaN.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    } else {
      asm("max.NaN.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    }
    return d;
  }
  // Per half, 0xffff where a == b as floats (-0 == +0; a NaN equals nothing), else 0.
  __device__ static __forceinline__ uint32_t eq_mask(uint32_t a, uint32_t b) {
    uint32_t d;
    if constexpr (kBF16) {
      asm("set.eq.u32.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    } else {
      asm("set.eq.u32.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    }
    return d;
  }
  // The value of 16 bits of the dtype (the low 16 of `bits`) as a float, exactly.
  __device__ static __forceinline__ float to_float(uint32_t bits) {
    if constexpr (kBF16) {
      return __uint_as_float(bits << 16);
    } else {
      return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
    }
  }
  __device__ static __forceinline__ float half(uint32_t pair, int h) {
    if constexpr (kBF16) {
      return __uint_as_float(h == 0 ? pair << 16 : pair & 0xffff0000u);
    } else {
      return to_float(h == 0 ? pair : pair >> 16);
    }
  }
};

}  // namespace hopper
}  // namespace conv_transpose3d_post_pool
}  // namespace fused
