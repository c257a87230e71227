// Branch-free inner loops of the CPU forward and backward for float and double (and bfloat16's mixed form),
// written so the compiler vectorizes them, and compiled for several instruction sets (AVX-512, AVX2, baseline)
// picked at load time by the CPU (GCC/Clang function multiversioning). Only these leaf functions are cloned, so no
// inline code from other headers is ever built for an instruction set the machine may lack.
//
// Each step does exactly what scan_window does (same operations, same tap order, same update rule), so the
// results are bit-identical to the scalar path; -ffp-contract=off keeps the compiler from fusing into FMAs.
#pragma once

#include <cstdint>

namespace fused {
namespace post_pool {
namespace simd {

// Contiguous NCDHW, 2x2x2 window with stride 2 and no padding: one row of OW outputs from the four input rows
// (jd, jh) = (0,0), (0,1), (1,0), (1,1). sel/off may be null (inference).
void row_2x2x2(const float* r0, const float* r1, const float* r2, const float* r3, int64_t OW, float m, float s1,
               float s2, float* out, float* sel, uint8_t* off);
void row_2x2x2(const double* r0, const double* r1, const double* r2, const double* r3, int64_t OW, double m,
               double s1, double s2, double* out, double* sel, uint8_t* off);

// channels_last_3d: folds one window tap into the running max of C channels (x and m hold C values; out, sel and
// off hold the running max, its input value and its tap). sel/off may be null.
void channels_tap(const float* x, const float* m, int64_t C, float s1, float s2, int32_t tap, float* out,
                  float* sel, uint8_t* off8, int32_t* off32);
void channels_tap(const double* x, const double* m, int64_t C, double s1, double s2, int32_t tap, double* out,
                  double* sel, uint8_t* off8, int32_t* off32);

// channels_last_3d, 2x2x2 exact tiling: a row of OW pooled positions (n, od, oh, *) in one call. `x` points at
// input (n, 2od, 2oh, 0, 0); sh and sd are the element strides of H and D (sw is C). out/sel/off point at
// output (n, od, oh, 0, 0). One call per row keeps per-call overhead off small channel counts.
void channels_row_2x2x2(const float* x, int64_t sh, int64_t sd, int64_t OW, int64_t C, const float* m, float s1,
                        float s2, float* out, float* sel, uint8_t* off);
void channels_row_2x2x2(const double* x, int64_t sh, int64_t sd, int64_t OW, int64_t C, const double* m, double s1,
                        double s2, double* out, double* sel, uint8_t* off);

// Backward for the 2x2x2 exact tiling, contiguous: from one row of OW outputs (grad, selected input, tap), writes
// the whole window of each output into the four grad_input rows (the gradient at the chosen tap, zeros elsewhere)
// and each output's multiplier-gradient contribution.
void row_2x2x2_backward(const float* go, const float* sel, const uint8_t* off, int64_t OW, float m, float s1,
                        float s2, float* g0, float* g1, float* g2, float* g3, float* contrib);
void row_2x2x2_backward(const double* go, const double* sel, const uint8_t* off, int64_t OW, double m, double s1,
                        double s2, double* g0, double* g1, double* g2, double* g3, double* contrib);

// Same for channels_last_3d: one pooled position, C channels; gi[t] points at the C gradients of tap t.
// gx is scratch space for C values.
void channels_2x2x2_backward(const float* go, const float* sel, const uint8_t* off, const float* m, int64_t C,
                             float s1, float s2, float* const* gi, float* contrib, float* gx);
void channels_2x2x2_backward(const double* go, const double* sel, const uint8_t* off, const double* m, int64_t C,
                             double s1, double s2, double* const* gi, double* contrib, double* gx);

// The mixed form of a bfloat16 input (float32 multiplier and output): the same kernels on float copies of the
// input, with the first LeakyReLU rounded to bfloat16 as eager rounds it (and, backward, the product's gradient
// before the first LeakyReLU's backward); bit-identical to the scalar path's epilogue_via / grad_input_via.
void row_2x2x2_bf16_mid(const float* r0, const float* r1, const float* r2, const float* r3, int64_t OW, float m,
                        float s1, float s2, float* out, float* sel, uint8_t* off);
void channels_row_2x2x2_bf16_mid(const float* x, int64_t sh, int64_t sd, int64_t OW, int64_t C, const float* m,
                                 float s1, float s2, float* out, float* sel, uint8_t* off);
void channels_tap_bf16_mid(const float* x, const float* m, int64_t C, float s1, float s2, int32_t tap, float* out,
                           float* sel, uint8_t* off8, int32_t* off32);
void row_2x2x2_backward_bf16_mid(const float* go, const float* sel, const uint8_t* off, int64_t OW, float m,
                                 float s1, float s2, float* g0, float* g1, float* g2, float* g3, float* contrib);
void channels_2x2x2_backward_bf16_mid(const float* go, const float* sel, const uint8_t* off, const float* m,
                                      int64_t C, float s1, float s2, float* const* gi, float* contrib, float* gx);

// bfloat16 storage (raw 16 bits) <-> float for n contiguous values. Widening is exact; narrowing rounds to
// nearest even and turns every NaN into 0x7FC0, exactly as c10::BFloat16(float) does, so the half-precision paths
// that compute on float copies stay bit-identical to converting element by element.
void bf16_to_float(const uint16_t* src, float* dst, int64_t n);
void float_to_bf16(const float* src, uint16_t* dst, int64_t n);

}  // namespace simd
}  // namespace post_pool
}  // namespace fused
