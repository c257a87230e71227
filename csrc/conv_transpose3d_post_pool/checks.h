// Host side of fused::conv_transpose3d_post_pool[_with_offsets], shared by its kernels
// (conv_transpose3d_post_pool.cpp) and its autograd (autograd.cpp): the argument checks
// both devices run, the output memory format, and whether the fused CUDA kernel covers a call.
// torch_fused_ops/ops/conv_transpose3d_post_pool.py mirrors the checks for the fake impls (same exception types and
// wording).
#pragma once

#include "post_pool/post_pool.h"

#include <ATen/core/Tensor.h>
#include <c10/core/MemoryFormat.h>
#include <c10/util/ArrayRef.h>

#include <array>
#include <optional>

namespace fused {

using Int3 = std::array<int64_t, 3>;

// Everything the forward, the composite and the backward need, after every check has passed.
struct ConvTranspose3dPostPoolGeometry {
  std::array<int64_t, 5> conv_size;  // the convolution's output [N, Cout, Do, Ho, Wo] (never materialised on
                                     // the fused path)
  Int3 stride, padding, output_padding, dilation;  // the convolution's, expanded to three dims
  int64_t groups;
  // The memory format of the op's outputs: the one aten's convolution gives its output for these arguments
  // (so the one the eager composite's result has).
  at::MemoryFormat format;
  post_pool::PoolGeometry
      pool;  // post_pool's geometry over conv_size (pool.channels_last == (format == ChannelsLast3d))
  std::array<int64_t, 5> pooled_size() const { return {pool.N, pool.C, pool.OD, pool.OH, pool.OW}; }
};

// Validates the op's arguments; raises TypeError (dtypes, missing tensors) or ValueError (values) naming the
// problem, prefixed by `op`. The pool part is post_pool's own check (check_post_pool_sizes).
ConvTranspose3dPostPoolGeometry check_conv_transpose3d_post_pool_args(
    const char* op, const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef output_padding, int64_t groups,
    at::IntArrayRef dilation, const at::Tensor& multiplier, at::IntArrayRef kernel_size, at::IntArrayRef pool_stride,
    at::IntArrayRef pool_padding, at::IntArrayRef pool_dilation, bool ceil_mode);

// Why the fused CUDA kernel (csrc/conv_transpose3d_post_pool/contract.h) does not compute this call, as a static
// text; nullptr where it does. The first reason in the order of the Python mirror's `Unsupported`
// (torch_fused_ops/ops/conv_transpose3d_post_pool_coverage.py), whose values are these texts: not CUDA, a dtype
// other than float32/bfloat16/float16, groups != 1, no input channels, a kernel other than 3x3x3, stride != 2,
// padding != 1, dilation != 1, output_padding other than 0 or 1, a pool other than kernel 2 / stride 2 /
// padding 0 / dilation 1, a pooled size other than (conv size) / 2 (ceil_mode with output_padding 0). Arguments
// must have passed check_conv_transpose3d_post_pool_args. It runs on every call: no allocation.
const char* fused_kernel_unsupported_reason(const at::Tensor& input, const at::Tensor& weight,
                                            const ConvTranspose3dPostPoolGeometry& g);

// float32 convolutions may use TF32 tensor cores: cuDNN's convolution flag, as aten's convolution reads it.
bool conv_allows_tf32();

}  // namespace fused
