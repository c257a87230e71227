// The contract between fused::conv_transpose3d_post_pool's host code (csrc/conv_transpose3d_post_pool/:
// checks, allocation, composite fallback, registration) and its fused CUDA kernel
// (csrc/conv_transpose3d_post_pool/cuda/).
#pragma once

#include "conv_transpose3d_post_pool/ablation.h"

#include <ATen/core/Tensor.h>

#include <array>
#include <optional>

namespace fused {

// Launches the fused kernel for
//   max_pool3d(leaky(leaky(conv_transpose3d(input, weight, bias), s1) * multiplier, s2), kernel 2, stride 2)
// with convolution kernel 3, stride 2, padding 1, groups 1, dilation 1, output_padding 0 or 1 per dim.
// Preconditions (the caller checks them; the launcher only TORCH_INTERNAL_ASSERTs):
//   - every tensor on the current CUDA device (the caller holds the device guard), one dtype for input, weight,
//     bias, multiplier, out and selected: float32, bfloat16 or float16; or the mixed form (torch.autocast's
//     chain): bfloat16/float16 input, weight, bias and selected with a float32 multiplier and out;
//   - input [N, Cin, D, H, W], contiguous or channels_last_3d; weight [Cin, Cout, 3, 3, 3], contiguous or
//     channels_last_3d (read in place: no host-side packing);
//   - bias undefined, or 1-D contiguous with Cout elements; multiplier contiguous with 1 or Cout elements;
//   - out [N, Cout, PD, PH, PW] with P* = D* - 1 + output_padding[*], contiguous or channels_last_3d; selected
//     (same dtype) and offsets (uint8) undefined for inference, else allocated like out in the same memory format;
//   - N, Cin, Cout may be 0 (the launcher returns at once) and need not be multiples of anything.
// selected receives the convolution output (bias included) at the tap the pool chose, offsets its window offset
// (jd*2 + jh)*2 + jw, with max_pool3d's rules: ties keep the first tap, the last NaN wins, a window whose every
// value is -inf reports its first tap.
// allow_tf32: float32 on TF32 tensor cores (operands rounded to nearest, as cuDNN); false keeps float32 accuracy.
// round_to (bfloat16 or float16; only where conv_transpose3d_post_pool_cuda_rounds_operands): input, weight and bias
// are float32 and the kernel computes with them rounded to that dtype, as if they had been cast first (the mixed
// inference form only: a float32 multiplier and out, no selected/offsets).
// Never synchronises with the device; launches on the current stream. Only where
// conv_transpose3d_post_pool_cuda_fits.
void launch_conv_transpose3d_post_pool_cuda(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                                            const at::Tensor& multiplier, double negative_slope,
                                            double negative_slope2, std::array<int64_t, 3> output_padding,
                                            bool allow_tf32, const at::Tensor& out, const at::Tensor& selected,
                                            const at::Tensor& offsets,
                                            std::optional<at::ScalarType> round_to = std::nullopt);

// Whether launch_conv_transpose3d_post_pool_cuda takes round_to = dtype for float32 input [N, Cin, D, H, W] with a
// float32 multiplier, inference form, on the input's device: where the sm_90a kernel runs (its mixed form rounds the
// operands as it stages them; it depends on the device, the input channels and the kernel switch only). Elsewhere
// the caller casts.
bool conv_transpose3d_post_pool_cuda_rounds_operands(at::ScalarType dtype, const at::Tensor& input);

// Whether the kernel's shared memory for this dtype and input channel count fits CUDA device `device` (compute
// capability 8.6 / 8.9 allow 99 KB per block: float32 with more than 16 input channels, 16-bit with more than 32,
// do not). Independent of the TF32 switch.
bool conv_transpose3d_post_pool_cuda_fits(at::ScalarType dtype, int64_t Cin, int device);

// Which fused forward kernel the launcher runs, for tests and benchmarks that compare them (never set by the
// operators): kAuto the sm_90a (wgmma) kernel where the GPU, the build and the arguments allow it and it measured
// faster (launch.cu), else the mma.sync one; kMmaSync always the mma.sync kernel; kWgmma the sm_90a kernel wherever
// it can run, whatever the size.
enum class ConvForwardKernel : int { kAuto = 0, kMmaSync = 1, kWgmma = 2 };
ConvForwardKernel& conv_forward_kernel_choice();

// How the sm_90a kernel hands out work, for benchmarks that compare the two (never set by the operators): kAuto
// halves where there are fewer units than blocks (hopper/kernel.cuh, launch_hopper_one), kUnits a unit per consumer
// at a time, kHalves half a unit per block at a time, one m64 tile per consumer.
enum class ConvHopperSplit : int { kAuto = 0, kUnits = 1, kHalves = 2 };
ConvHopperSplit& conv_hopper_split_choice();

// Whether this build holds the sm_90a kernel (TORCH_CUDA_ARCH_LIST named 9.0a).
bool conv_wgmma_kernel_built();

}  // namespace fused
