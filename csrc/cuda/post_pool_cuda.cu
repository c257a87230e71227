// CUDA kernels of fused::post_pool, post_pool_with_offsets and post_pool_backward.
//
// One thread per output (forward) or per input element (backward), grid-stride, int64 offsets throughout.
// Layout (NCDHW / NDHWC) and the 2x2x2 exact-tiling window are template parameters, so each layout and the fast
// path get their own kernel rather than a runtime branch. The arithmetic is the same header code the CPU kernels
// use (post_pool.h), so both devices compute the same bits.
#include "post_pool.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cuda_runtime.h>

namespace fused {
namespace {

constexpr int kThreads = 256;

// Enough blocks to fill the GPU several times over; the grid-stride loops cover the rest.
int64_t num_blocks(int64_t work) {
  int device = 0, sms = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t wanted = (work + kThreads - 1) / kThreads;
  return std::max<int64_t>(1, std::min<int64_t>(wanted, static_cast<int64_t>(sms) * 32));
}

template <typename scalar_t, typename off_t, bool CL, int K, bool SAVE>
__global__ void __launch_bounds__(kThreads) post_pool_forward_kernel(
    const scalar_t* __restrict__ x, const scalar_t* __restrict__ mflat, int64_t m_stride, const PoolGeometry g,
    const Strides st, at::opmath_type<scalar_t> s1, at::opmath_type<scalar_t> s2, scalar_t* __restrict__ out,
    scalar_t* __restrict__ sel, off_t* __restrict__ off) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t total = g.output_numel();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t n, c, od, oh, ow;
    output_coords<CL>(i, g, n, c, od, oh, ow);
    const acc_t m = static_cast<acc_t>(mflat[c * m_stride]);
    const auto r = scan_window<K, K, K>(x + n * st.n + c * st.c, st.d, st.h, st.w, od, oh, ow, g, m, s1, s2);
    out[i] = static_cast<scalar_t>(r.value);
    if constexpr (SAVE) {
      sel[i] = r.input;
      off[i] = static_cast<off_t>(r.offset);
    }
  }
}

template <typename scalar_t, typename off_t, bool CL, int K>
__global__ void __launch_bounds__(kThreads) post_pool_grad_input_kernel(
    const scalar_t* __restrict__ go, const scalar_t* __restrict__ sel, const off_t* __restrict__ off,
    const scalar_t* __restrict__ mflat, int64_t m_stride, const PoolGeometry g, at::opmath_type<scalar_t> s1,
    at::opmath_type<scalar_t> s2, scalar_t* __restrict__ gi) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t total = g.input_numel();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t n, c, d, h, w;
    input_coords<CL>(i, g, n, c, d, h, w);
    const acc_t m = static_cast<acc_t>(mflat[c * m_stride]);
    gi[i] = static_cast<scalar_t>(gather_grad<CL, K, K, K>(go, sel, off, g, n, c, d, h, w, m, s1, s2));
  }
}

template <typename scalar_t, typename off_t, bool CL>
__global__ void __launch_bounds__(kThreads) post_pool_grad_multiplier_kernel(
    const scalar_t* __restrict__ go, const scalar_t* __restrict__ sel, const off_t* __restrict__ off,
    const scalar_t* __restrict__ mflat, int64_t m_stride, const PoolGeometry g, at::opmath_type<scalar_t> s1,
    at::opmath_type<scalar_t> s2, at::opmath_type<scalar_t>* __restrict__ contrib) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t total = g.output_numel();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t n, c, od, oh, ow;
    output_coords<CL>(i, g, n, c, od, oh, ow);
    const acc_t m = static_cast<acc_t>(mflat[c * m_stride]);
    contrib[i] = tap_in_bounds(g, od, oh, ow, static_cast<int64_t>(off[i]))
                     ? grad_multiplier_of(static_cast<acc_t>(go[i]), static_cast<acc_t>(sel[i]), m, s1, s2)
                     : acc_t(0);
  }
}

// Exact tiling (2x2x2, stride 2, no padding): each input element lies in at most one window, so one thread per
// output writes its whole window (the chosen tap's gradient, zeros elsewhere) and its multiplier contribution.
// No index search per input element, and the writes of a warp are contiguous runs.
template <typename scalar_t, typename off_t, bool CL>
__global__ void __launch_bounds__(kThreads) post_pool_backward_tiled2_kernel(
    const scalar_t* __restrict__ go, const scalar_t* __restrict__ sel, const off_t* __restrict__ off,
    const scalar_t* __restrict__ mflat, int64_t m_stride, const PoolGeometry g, const Strides st,
    at::opmath_type<scalar_t> s1, at::opmath_type<scalar_t> s2, scalar_t* __restrict__ gi,
    at::opmath_type<scalar_t>* __restrict__ contrib) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t total = g.output_numel();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t n, c, od, oh, ow;
    output_coords<CL>(i, g, n, c, od, oh, ow);
    const acc_t m = static_cast<acc_t>(mflat[c * m_stride]);
    const acc_t x = static_cast<acc_t>(sel[i]);
    // 0 + g, as eager accumulates into a zeroed buffer (turns -0 into +0).
    const acc_t gsum = acc_t(0) + static_cast<acc_t>(go[i]);
    const scalar_t gx = static_cast<scalar_t>(grad_input_of(gsum, x, m, s1, s2));
    contrib[i] = grad_multiplier_of(gsum, x, m, s1, s2);
    const int tap = static_cast<int>(off[i]);
    scalar_t* base = gi + n * st.n + c * st.c + (2 * od) * st.d + (2 * oh) * st.h + (2 * ow) * st.w;
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      base[(t >> 2) * st.d + ((t >> 1) & 1) * st.h + (t & 1) * st.w] = t == tap ? gx : scalar_t(0);
    }
  }
}

template <typename scalar_t, typename off_t, bool SAVE>
void launch_forward(const ForwardInputs& f, const at::Tensor& out, const at::Tensor& sel, const at::Tensor& off,
                    cudaStream_t stream) {
  using acc_t = at::opmath_type<scalar_t>;
  const PoolGeometry& g = f.g;
  const Strides st = input_strides(g);
  const scalar_t* x = f.input.const_data_ptr<scalar_t>();
  const scalar_t* m = f.multiplier.const_data_ptr<scalar_t>();
  const int64_t ms = f.multiplier.numel() == 1 ? 0 : 1;
  const acc_t s1 = static_cast<acc_t>(f.s1), s2 = static_cast<acc_t>(f.s2);
  scalar_t* o = out.mutable_data_ptr<scalar_t>();
  scalar_t* sp = SAVE ? sel.mutable_data_ptr<scalar_t>() : nullptr;
  off_t* op = SAVE ? off.mutable_data_ptr<off_t>() : nullptr;
  const bool k2 = g.exact_tiling && g.kd == 2 && g.kh == 2 && g.kw == 2;
  const dim3 grid(static_cast<unsigned>(num_blocks(g.output_numel())));
  if (g.channels_last) {
    if (k2) {
      post_pool_forward_kernel<scalar_t, off_t, true, 2, SAVE><<<grid, kThreads, 0, stream>>>(x, m, ms, g, st, s1, s2, o, sp, op);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    } else {
      post_pool_forward_kernel<scalar_t, off_t, true, 0, SAVE><<<grid, kThreads, 0, stream>>>(x, m, ms, g, st, s1, s2, o, sp, op);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  } else {
    if (k2) {
      post_pool_forward_kernel<scalar_t, off_t, false, 2, SAVE><<<grid, kThreads, 0, stream>>>(x, m, ms, g, st, s1, s2, o, sp, op);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    } else {
      post_pool_forward_kernel<scalar_t, off_t, false, 0, SAVE><<<grid, kThreads, 0, stream>>>(x, m, ms, g, st, s1, s2, o, sp, op);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> forward_cuda(const char* op, bool save, const at::Tensor& input,
                                                            const at::Tensor& multiplier, double negative_slope,
                                                            at::IntArrayRef kernel_size, at::IntArrayRef stride,
                                                            at::IntArrayRef padding, at::IntArrayRef dilation,
                                                            bool ceil_mode, std::optional<double> negative_slope2) {
  // The shared checks first: they name a device mismatch between input and multiplier.
  const ForwardInputs f = prepare_forward(op, input, multiplier, kernel_size, stride, padding, dilation, ceil_mode,
                                          negative_slope, negative_slope2);
  TORCH_CHECK_VALUE(input.is_cuda(), op, ": CUDA kernel called with input on device ", input.device());
  const PoolGeometry& g = f.g;
  const c10::cuda::OptionalCUDAGuard guard(input.device());
  const auto opts = input.options().memory_format(f.format);
  at::Tensor out = at::empty({g.N, g.C, g.OD, g.OH, g.OW}, opts);
  at::Tensor sel, off;
  if (save) {
    sel = at::empty_like(out);
    off = at::empty_like(out, out.options().dtype(g.offset_dtype()));
  }
  if (g.empty()) return {out, sel, off};
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), "fused_post_pool_cuda", [&] {
    if (!save) {
      launch_forward<scalar_t, uint8_t, false>(f, out, sel, off, stream);
    } else if (g.offset_dtype() == at::kByte) {
      launch_forward<scalar_t, uint8_t, true>(f, out, sel, off, stream);
    } else {
      launch_forward<scalar_t, int32_t, true>(f, out, sel, off, stream);
    }
  });
  return {out, sel, off};
}

at::Tensor post_pool_cuda(const at::Tensor& input, const at::Tensor& multiplier, double negative_slope,
                          at::IntArrayRef kernel_size, at::IntArrayRef stride, at::IntArrayRef padding,
                          at::IntArrayRef dilation, bool ceil_mode, std::optional<double> negative_slope2) {
  return std::get<0>(forward_cuda("fused::post_pool", false, input, multiplier, negative_slope, kernel_size, stride,
                                  padding, dilation, ceil_mode, negative_slope2));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> post_pool_with_offsets_cuda(
    const at::Tensor& input, const at::Tensor& multiplier, double negative_slope, at::IntArrayRef kernel_size,
    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, bool ceil_mode,
    std::optional<double> negative_slope2) {
  return forward_cuda("fused::post_pool_with_offsets", true, input, multiplier, negative_slope, kernel_size, stride,
                      padding, dilation, ceil_mode, negative_slope2);
}

template <typename scalar_t, typename off_t, bool CL>
void launch_backward(const PoolGeometry& g, const at::Tensor& go, const at::Tensor& sel, const at::Tensor& off,
                     const at::Tensor& mflat, double s1d, double s2d, const at::Tensor& grad_input,
                     const at::Tensor& contrib, cudaStream_t stream) {
  using acc_t = at::opmath_type<scalar_t>;
  const acc_t s1 = static_cast<acc_t>(s1d), s2 = static_cast<acc_t>(s2d);
  const scalar_t* gop = go.const_data_ptr<scalar_t>();
  const scalar_t* sp = sel.const_data_ptr<scalar_t>();
  const off_t* op = off.const_data_ptr<off_t>();
  const scalar_t* mp = mflat.const_data_ptr<scalar_t>();
  const int64_t ms = mflat.numel() == 1 ? 0 : 1;
  scalar_t* gi = grad_input.mutable_data_ptr<scalar_t>();
  const dim3 grid_out(static_cast<unsigned>(num_blocks(g.output_numel())));
  if (g.exact_tiling && g.kd == 2 && g.kh == 2 && g.kw == 2) {
    if (g.OD * 2 != g.D || g.OH * 2 != g.H || g.OW * 2 != g.W) {
      grad_input.zero_();  // elements past the last window get no gradient
    }
    post_pool_backward_tiled2_kernel<scalar_t, off_t, CL><<<grid_out, kThreads, 0, stream>>>(
        gop, sp, op, mp, ms, g, input_strides(g), s1, s2, gi, contrib.mutable_data_ptr<acc_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  const dim3 grid_in(static_cast<unsigned>(num_blocks(g.input_numel())));
  post_pool_grad_input_kernel<scalar_t, off_t, CL, 0><<<grid_in, kThreads, 0, stream>>>(gop, sp, op, mp, ms, g, s1, s2, gi);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  post_pool_grad_multiplier_kernel<scalar_t, off_t, CL><<<grid_out, kThreads, 0, stream>>>(
      gop, sp, op, mp, ms, g, s1, s2, contrib.mutable_data_ptr<acc_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

std::tuple<at::Tensor, at::Tensor> post_pool_backward_cuda(
    const at::Tensor& grad_output, const at::Tensor& selected, const at::Tensor& offsets,
    const at::Tensor& multiplier, double negative_slope, std::optional<double> negative_slope2,
    at::IntArrayRef input_size, at::IntArrayRef kernel_size, at::IntArrayRef stride, at::IntArrayRef padding,
    at::IntArrayRef dilation, bool channels_last) {
  const PoolGeometry g = check_post_pool_backward_args(grad_output, selected, offsets, multiplier, input_size,
                                                       kernel_size, stride, padding, dilation, channels_last);
  TORCH_CHECK_VALUE(grad_output.is_cuda(), "fused::post_pool_backward: CUDA kernel called with grad_output on device ",
                    grad_output.device());
  const c10::cuda::OptionalCUDAGuard guard(grad_output.device());
  const auto fmt = channels_last ? at::MemoryFormat::ChannelsLast3d : at::MemoryFormat::Contiguous;
  const double s1 = negative_slope, s2 = negative_slope2.value_or(negative_slope);
  at::Tensor grad_input = at::empty(input_size, grad_output.options().memory_format(fmt));
  const auto acc_dtype = at::toOpMathType(grad_output.scalar_type());
  at::Tensor contrib = at::empty(grad_output.sizes(), grad_output.options().dtype(acc_dtype).memory_format(fmt));
  if (!g.empty()) {
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    const at::Tensor go = grad_output.contiguous(fmt), sel = selected.contiguous(fmt), off = offsets.contiguous(fmt);
    const at::Tensor mflat = flat_multiplier(multiplier);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad_output.scalar_type(), "fused_post_pool_bwd_cuda", [&] {
      auto run = [&](auto off_tag) {
        using off_t = decltype(off_tag);
        if (channels_last) {
          launch_backward<scalar_t, off_t, true>(g, go, sel, off, mflat, s1, s2, grad_input, contrib, stream);
        } else {
          launch_backward<scalar_t, off_t, false>(g, go, sel, off, mflat, s1, s2, grad_input, contrib, stream);
        }
      };
      if (off.scalar_type() == at::kByte) {
        run(uint8_t{});
      } else {
        run(int32_t{});
      }
    });
  }
  return {grad_input, reduce_grad_multiplier(contrib, multiplier)};
}

}  // namespace
}  // namespace fused

TORCH_LIBRARY_IMPL(fused, CUDA, m) {
  m.impl("post_pool", &fused::post_pool_cuda);
  m.impl("post_pool_with_offsets", &fused::post_pool_with_offsets_cuda);
  m.impl("post_pool_backward", &fused::post_pool_backward_cuda);
}
