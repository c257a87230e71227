// fused::launch_conv_transpose3d_post_pool_grad_conv_cuda (contract in backward_contract.h): the convolution output's
// gradient at each pooled output's selected tap, and the per-channel sums that give the bias and multiplier
// gradients. Memory-bound, one pass over the pooled tensors.
//
// Sums are deterministic: each block reduces its elements in a fixed order (per thread in index order, then a fixed
// xor butterfly over the warp, then the warps in order) to one partial per channel it covers; aten's sum over the
// partials (a fixed-order reduction) finishes them. No atomics.
#include "conv_transpose3d_post_pool/backward_contract.h"

#include "common/epilogue.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <type_traits>

namespace fused {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Pooled positions per block and plane in the contiguous layout (a plane is one (n, c)).
constexpr int64_t kPlaneChunk = 4096;
// Positions per block in the channels-last layout.
constexpr int64_t kRowChunk = 512;

// scalar_t: the convolution's dtype (selected, grad_conv, grad_bias); out_t: the output's (grad_output, the
// multiplier, grad_multiplier), float32 in the mixed form, whose first LeakyReLU rounds through scalar_t.
template <typename scalar_t, typename out_t>
struct GradConvArgs {
  using mid_t = std::conditional_t<std::is_same_v<scalar_t, out_t>, float, scalar_t>;
  const out_t* go;
  const scalar_t* sel;
  scalar_t* gc;
  const out_t* mult;
  float* part_bias;  // [parts, C]
  float* part_mult;  // [parts, C]
  int64_t m_stride;  // 0 (one multiplier) or 1
  float s1, s2;
};

// One element: the gradient stored at the selected tap and its two sum contributions.
template <typename mid_t, typename scalar_t, typename out_t>
__device__ __forceinline__ void grad_element(const out_t* __restrict__ go, const scalar_t* __restrict__ sel,
                                             scalar_t* __restrict__ gc, int64_t i, float m, float s1, float s2,
                                             float& cb, float& cm) {
  const float x = static_cast<float>(sel[i]);
  const float g = 0.f + static_cast<float>(go[i]);  // as eager accumulates into a zeroed buffer
  const scalar_t gx = static_cast<scalar_t>(grad_input_via<mid_t>(g, x, m, s1, s2));
  gc[i] = gx;
  cb += static_cast<float>(gx);
  cm += grad_multiplier_via<mid_t>(g, x, m, s1, s2);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Contiguous [N, C, P]: block = (plane n * C + c, chunk of its positions); one partial per block for the plane's
// channel.
template <typename scalar_t, typename out_t>
__global__ void __launch_bounds__(kThreads) grad_conv_planes_kernel(const GradConvArgs<scalar_t, out_t> a, int64_t P,
                                                                    int64_t C, int64_t chunks) {
  const int64_t plane = static_cast<int64_t>(blockIdx.x) / chunks;
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) - plane * chunks;
  const int64_t c = plane % C;
  const float m = static_cast<float>(a.mult[c * a.m_stride]);
  const int64_t lo = chunk * kPlaneChunk;
  const int64_t hi = lo + kPlaneChunk < P ? lo + kPlaneChunk : P;
  float cb = 0.f, cm = 0.f;
  // Unrolled so that several elements' loads are in flight at once (the pointers do not alias).
#pragma unroll 8
  for (int64_t q = lo + threadIdx.x; q < hi; q += kThreads) {
    grad_element<typename GradConvArgs<scalar_t, out_t>::mid_t>(a.go, a.sel, a.gc, plane * P + q, m, a.s1, a.s2, cb,
                                                                cm);
  }
  __shared__ float sums[2][kWarps];
  cb = warp_sum(cb);
  cm = warp_sum(cm);
  const int warp = threadIdx.x / 32;
  if ((threadIdx.x & 31) == 0) {
    sums[0][warp] = cb;
    sums[1][warp] = cm;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float tb = 0.f, tm = 0.f;
    for (int w = 0; w < kWarps; ++w) {
      tb += sums[0][w];
      tm += sums[1][w];
    }
    const int64_t part = (plane / C) * chunks + chunk;
    a.part_bias[part * C + c] = tb;
    a.part_mult[part * C + c] = tm;
  }
}

// Channels-last [N * P, C]: block (chunk of positions, group of 32 channels); lane = channel, warps take the
// chunk's positions round robin; one partial per block and channel.
template <typename scalar_t, typename out_t>
__global__ void __launch_bounds__(kThreads) grad_conv_rows_kernel(const GradConvArgs<scalar_t, out_t> a, int64_t rows,
                                                                  int64_t C) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int64_t c = static_cast<int64_t>(blockIdx.y) * 32 + lane;
  const bool ok = c < C;
  const float m = ok ? static_cast<float>(a.mult[c * a.m_stride]) : 0.f;
  const int64_t lo = static_cast<int64_t>(blockIdx.x) * kRowChunk;
  const int64_t hi = lo + kRowChunk < rows ? lo + kRowChunk : rows;
  float cb = 0.f, cm = 0.f;
  if (ok) {
#pragma unroll 8
    for (int64_t r = lo + warp; r < hi; r += kWarps) {
      grad_element<typename GradConvArgs<scalar_t, out_t>::mid_t>(a.go, a.sel, a.gc, r * C + c, m, a.s1, a.s2, cb,
                                                                  cm);
    }
  }
  __shared__ float sums[2][kWarps][32];
  sums[0][warp][lane] = cb;
  sums[1][warp][lane] = cm;
  __syncthreads();
  if (warp == 0 && ok) {
    float tb = 0.f, tm = 0.f;
    for (int w = 0; w < kWarps; ++w) {
      tb += sums[0][w][lane];
      tm += sums[1][w][lane];
    }
    a.part_bias[blockIdx.x * C + c] = tb;
    a.part_mult[blockIdx.x * C + c] = tm;
  }
}

// The bias and multiplier gradients from the partials [parts, C], each in part order (deterministic), written in
// the dtype: one thread per channel, or one block-wide fixed-order sum for a single multiplier.
template <typename scalar_t, typename out_t>
__global__ void __launch_bounds__(kThreads) channel_sums_kernel(const float* __restrict__ part_bias,
                                                                const float* __restrict__ part_mult, int64_t parts,
                                                                int64_t C, scalar_t* __restrict__ grad_bias,
                                                                out_t* __restrict__ grad_mult, bool one_mult) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c < C) {
    float b = 0.f, m = 0.f;
    for (int64_t k = 0; k < parts; ++k) {
      b += part_bias[k * C + c];
      m += part_mult[k * C + c];
    }
    if (grad_bias != nullptr) grad_bias[c] = static_cast<scalar_t>(b);
    if (grad_mult != nullptr && !one_mult) grad_mult[c] = static_cast<out_t>(m);
  }
  if (one_mult && grad_mult != nullptr && blockIdx.x == 0) {
    // Channels in order, partials in order.
    __shared__ float sums[kThreads];
    float m = 0.f;
    for (int64_t cc = threadIdx.x; cc < C; cc += kThreads) {
      float t = 0.f;
      for (int64_t k = 0; k < parts; ++k) t += part_mult[k * C + cc];
      m += t;
    }
    sums[threadIdx.x] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
      float t = 0.f;
      for (int w = 0; w < kThreads; ++w) t += sums[w];
      grad_mult[0] = static_cast<out_t>(t);
    }
  }
}

// The kernels of one (convolution dtype, output dtype) pair on the checked, allocated tensors.
template <typename scalar_t, typename out_t>
void launch_grad_conv(const at::Tensor& grad_out, const at::Tensor& selected, const at::Tensor& multiplier,
                      double s1, double s2, const at::Tensor& grad_conv, const at::Tensor& grad_bias,
                      const at::Tensor& grad_multiplier, const at::Tensor& part_bias, const at::Tensor& part_mult,
                      int64_t chunks, int64_t parts, bool channels_last, cudaStream_t stream) {
  const int64_t N = grad_out.size(0), C = grad_out.size(1);
  const int64_t P = grad_out.size(2) * grad_out.size(3) * grad_out.size(4);
  GradConvArgs<scalar_t, out_t> a{grad_out.const_data_ptr<out_t>(),
                                  selected.const_data_ptr<scalar_t>(),
                                  grad_conv.data_ptr<scalar_t>(),
                                  multiplier.const_data_ptr<out_t>(),
                                  part_bias.data_ptr<float>(),
                                  part_mult.data_ptr<float>(),
                                  multiplier.numel() == 1 ? 0 : 1,
                                  static_cast<float>(s1),
                                  static_cast<float>(s2)};
  if (channels_last) {
    TORCH_CHECK(chunks < (int64_t(1) << 31) && (C + 31) / 32 <= 65535,
                "conv_transpose3d_post_pool backward: pooled tensor too large");
    grad_conv_rows_kernel<scalar_t, out_t>
        <<<dim3(static_cast<unsigned>(chunks), static_cast<unsigned>((C + 31) / 32)), kThreads, 0, stream>>>(
            a, N * P, C);
  } else {
    TORCH_CHECK(N * C * chunks < (int64_t(1) << 31), "conv_transpose3d_post_pool backward: pooled tensor too large");
    grad_conv_planes_kernel<scalar_t, out_t>
        <<<static_cast<unsigned>(N * C * chunks), kThreads, 0, stream>>>(a, P, C, chunks);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (grad_bias.defined() || grad_multiplier.defined()) {
    channel_sums_kernel<scalar_t, out_t><<<static_cast<unsigned>((C + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        part_bias.data_ptr<float>(), part_mult.data_ptr<float>(), parts, C,
        grad_bias.defined() ? grad_bias.data_ptr<scalar_t>() : nullptr,
        grad_multiplier.defined() ? grad_multiplier.data_ptr<out_t>() : nullptr, multiplier.numel() == 1);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

}  // namespace

void launch_conv_transpose3d_post_pool_grad_conv_cuda(const at::Tensor& grad_out, const at::Tensor& selected,
                                          const at::Tensor& offsets, const at::Tensor& multiplier, double s1,
                                          double s2, const at::Tensor& grad_conv, const at::Tensor& grad_bias,
                                          const at::Tensor& grad_multiplier) {
  TORCH_INTERNAL_ASSERT(grad_out.dim() == 5 && grad_out.is_cuda());
  TORCH_INTERNAL_ASSERT(grad_out.sizes() == selected.sizes() && grad_out.sizes() == grad_conv.sizes() &&
                        grad_out.sizes() == offsets.sizes());
  TORCH_INTERNAL_ASSERT(grad_out.strides() == selected.strides() && grad_out.strides() == grad_conv.strides() &&
                        grad_out.strides() == offsets.strides());
  // The convolution's dtype is selected's; grad_output and the multiplier have the output's (float32 in the mixed
  // form, a float16/bfloat16 convolution).
  const auto dtype = selected.scalar_type();
  TORCH_INTERNAL_ASSERT(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf);
  const bool mixed = dtype != at::kFloat && grad_out.scalar_type() == at::kFloat;
  TORCH_INTERNAL_ASSERT(grad_conv.scalar_type() == dtype &&
                        grad_out.scalar_type() == (mixed ? at::kFloat : dtype) &&
                        multiplier.scalar_type() == grad_out.scalar_type());
  const int64_t N = grad_out.size(0), C = grad_out.size(1);
  const int64_t P = grad_out.size(2) * grad_out.size(3) * grad_out.size(4);
  TORCH_INTERNAL_ASSERT(multiplier.is_contiguous() && (multiplier.numel() == 1 || multiplier.numel() == C));
  const bool channels_last = C > 1 && grad_out.stride(1) == 1;
  TORCH_INTERNAL_ASSERT(channels_last || grad_out.is_contiguous());
  if (grad_out.numel() == 0) {
    if (grad_bias.defined()) grad_bias.zero_();
    if (grad_multiplier.defined()) grad_multiplier.zero_();
    return;
  }
  const auto fopts = grad_out.options().dtype(at::kFloat);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(grad_out.get_device()).stream();
  const int64_t chunks = channels_last ? (N * P + kRowChunk - 1) / kRowChunk : (P + kPlaneChunk - 1) / kPlaneChunk;
  const int64_t parts = channels_last ? chunks : N * chunks;
  const at::Tensor part_bias = at::empty({parts, C}, fopts);
  const at::Tensor part_mult = at::empty({parts, C}, fopts);
  TORCH_INTERNAL_ASSERT(!grad_bias.defined() || (grad_bias.is_contiguous() && grad_bias.numel() == C));
  TORCH_INTERNAL_ASSERT(!grad_multiplier.defined() ||
                        (grad_multiplier.is_contiguous() && grad_multiplier.numel() == multiplier.numel()));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, dtype, "conv_post_pool_grad_conv", [&] {
    if constexpr (std::is_same_v<scalar_t, float> || std::is_same_v<scalar_t, double>) {
      launch_grad_conv<scalar_t, scalar_t>(grad_out, selected, multiplier, s1, s2, grad_conv, grad_bias,
                                           grad_multiplier, part_bias, part_mult, chunks, parts, channels_last, stream);
    } else if (mixed) {
      launch_grad_conv<scalar_t, float>(grad_out, selected, multiplier, s1, s2, grad_conv, grad_bias,
                                        grad_multiplier, part_bias, part_mult, chunks, parts, channels_last, stream);
    } else {
      launch_grad_conv<scalar_t, scalar_t>(grad_out, selected, multiplier, s1, s2, grad_conv, grad_bias,
                                           grad_multiplier, part_bias, part_mult, chunks, parts, channels_last, stream);
    }
  });
}

}  // namespace fused
