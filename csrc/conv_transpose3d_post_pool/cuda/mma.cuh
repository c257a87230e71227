// Operand handling and tensor-core instructions of the fused transposed convolution (kernel.cuh).
//
// Both operands live in shared memory as 32-bit "k-words": one float32 channel (TF32 and strict float32) or a
// pair of 16-bit channels (2c, 2c+1) packed low/high (bf16, fp16). With that unit the fragments of
// mma.m16n8k8 (tf32) and mma.m16n8k16 (bf16/fp16) have the same shape: A is 4 words per thread (rows g, g+8 of
// the 16, k-words t, t+4 of the 8), B is 2 words (k-words t, t+4 of column g), C is 4 floats (rows g, g+8,
// columns 2t, 2t+1), with g = lane / 4 and t = lane % 4. So one main loop serves every precision; only the
// instruction and the word conversion differ.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace fused {
namespace conv_transpose3d_post_pool {

// Precision of one kernel instantiation.
enum class Mode : int {
  kTF32 = 0,    // float32 operands rounded to TF32 (nearest, ties away, as cuDNN), one product
  kStrict = 1,  // float32 from three TF32 products, infinities kept exact
  kBF16 = 2,
  kFP16 = 3,
};

template <Mode M>
struct ModeTraits;
template <>
struct ModeTraits<Mode::kTF32> {
  using io_t = float;
  static constexpr bool kHalf = false;
};
template <>
struct ModeTraits<Mode::kStrict> {
  using io_t = float;
  static constexpr bool kHalf = false;
};
template <>
struct ModeTraits<Mode::kBF16> {
  using io_t = __nv_bfloat16;
  static constexpr bool kHalf = true;
};
template <>
struct ModeTraits<Mode::kFP16> {
  using io_t = __half;
  static constexpr bool kHalf = true;
};

__device__ __forceinline__ uint32_t tf32_round(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

// x = hi + lo with hi = TF32(x) and lo = TF32(x - hi), and `cross`: hi where finite, else 0, for the products
// with the other operand's lo. For a non-finite x, lo = 0 (inf - inf would be NaN) and cross = 0 (inf times the
// other operand's lo, which is 0 for a TF32-exact value, would be NaN): only hi x hi sees the infinity, so an
// exact infinite product stays exact.
__device__ __forceinline__ void tf32_split(uint32_t word, uint32_t& hi, uint32_t& lo, uint32_t& cross) {
  const float x = __uint_as_float(word);
  hi = tf32_round(x);
  const float h = __uint_as_float(hi);
  const bool finite = fabsf(h) < __int_as_float(0x7f800000);
  lo = finite ? tf32_round(x - h) : 0u;
  cross = finite ? hi : 0u;
}

// TF32 rounding (nearest, ties away) of a finite float given by its bits: add half a TF32 ulp to the magnitude
// bits and clear the 13 bits TF32 drops (a carry into the exponent is the correct rounding up). This is what
// cvt.rna.tf32.f32 computes for finite values, without its test for infinities and NaN.
__device__ __forceinline__ uint32_t tf32_round_finite(uint32_t bits) { return (bits + 0x1000u) & 0xffffe000u; }

// tf32_split of a value known to be below 2^127 in magnitude (so hi is finite and cross is hi): the same hi and
// lo, bit for bit, from integer rounding and no finiteness test or selects.
__device__ __forceinline__ void tf32_split_finite(uint32_t word, uint32_t& hi, uint32_t& lo) {
  hi = tf32_round_finite(word);
  lo = tf32_round_finite(__float_as_uint(__uint_as_float(word) - __uint_as_float(hi)));
}

// Whether a strict-float32 operand word may take tf32_split_finite (false for NaN, infinities and |x| >= 2^127,
// where TF32 rounding could overflow).
__device__ __forceinline__ bool split_safe(uint32_t word) { return fabsf(__uint_as_float(word)) < 0x1p127f; }

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

// The value a convolution in the I/O dtype would have stored (the epilogue of the eager chain sees that).
template <typename T>
__device__ __forceinline__ float round_to_io(float v) { return to_float(from_float<T>(v)); }

// A value of the I/O dtype (given by its bits) as float, for the scalar path.
template <Mode M>
__device__ __forceinline__ float bits_to_float(uint16_t bits) {
  if constexpr (M == Mode::kBF16) {
    return __uint_as_float(static_cast<uint32_t>(bits) << 16);
  } else {
    return __half2float(__ushort_as_half(bits));
  }
}

// NaN-propagating max (max_pool3d lets any NaN win).
__device__ __forceinline__ float max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// D += A * B on one 16x8 tile; `a` 4 words, `b0/b1` the two B words.
template <Mode M>
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (M == Mode::kTF32 || M == Mode::kStrict) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else if constexpr (M == Mode::kBF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// A strict-float32 operand word's split (tf32_split): SAFE, every word below 2^127 in magnitude (split_safe), takes
// tf32_split_finite with cross = hi, bit for bit the same parts.
template <bool SAFE>
__device__ __forceinline__ void tf32_split_as(uint32_t word, uint32_t& hi, uint32_t& lo, uint32_t& cross) {
  if constexpr (SAFE) {
    tf32_split_finite(word, hi, lo);
    cross = hi;
  } else {
    tf32_split(word, hi, lo, cross);
  }
}

// acc += A x B over one k-step of one row tile in strict float32, from both operands' splits: three TF32 products
// (small first; lo x lo, ~2^-22 relative, is dropped) into a fresh accumulator, then added with IEEE float adds. The
// tensor cores' own accumulation is not rounded to nearest (it truncates): chained over every k-step and tap of a
// long sum, that alone made the error grow with the sum's length, to several times cuDNN float32's. The NT column
// tiles interleave so that consecutive mma are independent.
template <Mode M, int NT>
__device__ __forceinline__ void strict_products(float (&acc)[NT][4], const uint32_t (&ah)[4], const uint32_t (&al)[4],
                                                const uint32_t (&ac)[4], const uint32_t (&bh)[NT][2],
                                                const uint32_t (&bl)[NT][2], const uint32_t (&bc)[NT][2]) {
  float part[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int j = 0; j < 4; ++j) part[nt][j] = 0.f;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) mma<M>(part[nt], al, bc[nt][0], bc[nt][1]);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) mma<M>(part[nt], ac, bl[nt][0], bl[nt][1]);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) mma<M>(part[nt], ah, bh[nt][0], bh[nt][1]);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[nt][j] += part[nt][j];
}

}  // namespace conv_transpose3d_post_pool
}  // namespace fused
