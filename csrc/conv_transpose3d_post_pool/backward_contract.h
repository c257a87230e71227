// The contract between the host side of the fused convolution's backward (backward.cpp: checks, allocation, the
// composite fallback, registration) and its CUDA kernels (cuda/grad_conv.cu, cuda/grad_weight/, cuda/grad_input/).
//
// The backward of max_pool3d(leaky(leaky(conv_transpose3d(x, w, b), s1) * m, s2), 2, 2) needs the convolution
// output's gradient only at the tap each pooled output selected (saved by the training forward as `selected` and
// its window offset): one value per pooled output, at one of the window's 8 phases. Every kernel here works from
// that pooled-resolution gradient ("grad_conv") and the offsets; none reads or writes a full-resolution tensor.
//
// Shapes: pooled tensors [N, Cout, PD, PH, PW]; input [N, Cin, D, H, W] with P* = D* - 1 + output_padding[*];
// weight [Cin, Cout, 3, 3, 3] (convolution kernel 3, stride 2, padding 1, dilation 1, groups 1, the 2x2x2 pool of
// fused_kernel_unsupported_reason). Window offset = (jd * 2 + jh) * 2 + jw: the conv output at
// (2 qd + jd, 2 qh + jh, 2 qw + jw).
// Preconditions (the caller checks; the launchers only TORCH_INTERNAL_ASSERT): every tensor on the current CUDA
// device (the caller holds the device guard); one dtype (float32, bfloat16 or float16) for every floating tensor;
// offsets uint8. Each launcher runs on the current stream, never synchronises with the device, and returns at once
// when there is nothing to compute (its outputs then hold what an empty sum gives: zeros).
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>

namespace fused {

// grad_conv[n, co, q] = grad_input_of(0 + grad_out, selected, m[co], s1, s2) (post_pool.h, float arithmetic), stored
// in the dtype: the value post_pool_backward writes at the selected tap (`selected` already holds the bias).
// When defined, the per-channel sums, in float with a fixed order (the same bits run after run), then the dtype:
//   grad_bias [Cout] = sum over (n, q) of grad_conv as stored;
//   grad_multiplier (multiplier's numel, 1 or Cout, contiguous) = sum over (n, q) [and co when numel is 1] of
//   grad_multiplier_of(0 + grad_out, selected, m[co], s1, s2).
// grad_out, selected, offsets and grad_conv: the same sizes and the same strides, contiguous or channels_last_3d.
// multiplier: contiguous, 1 or Cout elements.
void launch_conv_transpose3d_post_pool_grad_conv_cuda(const at::Tensor& grad_out, const at::Tensor& selected,
                                          const at::Tensor& offsets, const at::Tensor& multiplier, double s1,
                                          double s2, const at::Tensor& grad_conv, const at::Tensor& grad_bias,
                                          const at::Tensor& grad_multiplier);

// grad_weight[ci, co, kd, kh, kw] = sum over (n, q) whose offset is the phase that uses tap (kd, kh, kw) of
// input[n, ci, q + delta(tap)] * grad_conv[n, co, q] (missing neighbours q + 1 past the input are zero), on tensor
// cores as the forward (allow_tf32: TF32 operands rounded to nearest; false: float32 from three TF32 products;
// bf16/fp16 operands), float accumulation in a fixed order, stored in the dtype. Per dim, tap k of input i feeds conv
// output 2 i - 1 + k: tap 1 is phase 0 of window i, tap 2 phase 1 of window i, tap 0 phase 1 of window i - 1.
// grad_conv and offsets: the same strides (contiguous or channels_last_3d); input contiguous or channels_last_3d;
// grad_weight [Cin, Cout, 3, 3, 3], any strides (written through them).
// Whether the current device has the shared memory per block the grad_weight kernel needs for grad_conv's dtype
// (float32: ~148 KB, more than GPUs of compute capability 8.6/8.9 allow); where not, the composite runs.
bool conv_transpose3d_post_pool_grad_weight_cuda_fits(const at::Tensor& grad_conv);
void launch_conv_transpose3d_post_pool_grad_weight_cuda(const at::Tensor& grad_conv, const at::Tensor& offsets,
                                            const at::Tensor& input, std::array<int64_t, 3> output_padding,
                                            bool allow_tf32, const at::Tensor& grad_weight);

// grad_input[n, ci, i] = sum over the taps (kd, kh, kw) and co of weight[ci, co, tap] * grad_conv[n, co, q] over
// the windows q = i (taps 1 and 2 per dim) and q = i - 1 (tap 0) inside the pooled extent whose offset is the
// tap's phase; tensor cores and accumulation as grad_weight's; stored in the dtype. grad_conv and offsets as above;
// weight contiguous or channels_last_3d; grad_input [N, Cin, D, H, W], contiguous or channels_last_3d (written
// through its strides).
void launch_conv_transpose3d_post_pool_grad_input_cuda(const at::Tensor& grad_conv, const at::Tensor& offsets,
                                           const at::Tensor& weight, std::array<int64_t, 3> output_padding,
                                           bool allow_tf32, const at::Tensor& grad_input);

// Whether grad_input's kernel for this dtype and output channel count fits the shared memory per block of CUDA
// device `device` (compute capability 8.6 / 8.9 allow 99 KB); else its op takes the composite. Independent of the
// TF32 switch.
bool conv_transpose3d_post_pool_grad_input_cuda_fits(at::ScalarType dtype, int64_t Cout, int device);

}  // namespace fused
