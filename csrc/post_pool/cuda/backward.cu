// CUDA backward launcher of the post_pool ops: the 2x2x2 fast path (backward_tiled.cu) where it
// applies, else the general kernels here: for exact tilings one thread per output writes its whole window, for
// any other window one thread per input element gathers from the outputs whose windows cover it
// (post_pool.h's gather_grad, the code the CPU kernels run), and one per output writes its contributions to the
// parameter gradients, which the shared host code reduces.
#include "post_pool/cuda/backward_tiled.cuh"
#include "post_pool/cuda/launch.cuh"
#include "post_pool/launchers.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <type_traits>

namespace fused {
namespace post_pool {
namespace {

// out_t: grad_output's and the multiplier's element type (scalar_t, or float in the mixed form; post_pool.h,
// mid_type). grad_input, selected and the bias are scalar_t.
template <typename scalar_t, typename out_t, typename off_t, bool CL, int K>
__global__ void __launch_bounds__(kThreads) post_pool_grad_input_kernel(
    const out_t* __restrict__ go, const scalar_t* __restrict__ sel, const off_t* __restrict__ off,
    const out_t* __restrict__ mflat, int64_t m_stride, const PoolGeometry g, at::opmath_type<scalar_t> s1,
    at::opmath_type<scalar_t> s2, scalar_t* __restrict__ gi, const scalar_t* __restrict__ bias) {
  using acc_t = at::opmath_type<scalar_t>;
  using mid_t = mid_type<scalar_t, out_t>;
  const int64_t total = g.input_numel();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t n, c, d, h, w;
    input_coords<CL>(i, g, n, c, d, h, w);
    const acc_t m = static_cast<acc_t>(mflat[c * m_stride]);
    const acc_t b = bias != nullptr ? static_cast<acc_t>(bias[c]) : acc_t(0);
    gi[i] = static_cast<scalar_t>(gather_grad<CL, K, K, K, out_t, scalar_t, acc_t, off_t, mid_t>(
        go, sel, off, g, n, c, d, h, w, m, s1, s2, b, bias != nullptr));
  }
}

template <typename scalar_t, typename out_t, typename off_t, bool CL>
__global__ void __launch_bounds__(kThreads) post_pool_grad_multiplier_kernel(
    const out_t* __restrict__ go, const scalar_t* __restrict__ sel, const off_t* __restrict__ off,
    const out_t* __restrict__ mflat, int64_t m_stride, const PoolGeometry g, at::opmath_type<scalar_t> s1,
    at::opmath_type<scalar_t> s2, at::opmath_type<scalar_t>* __restrict__ contrib,
    const scalar_t* __restrict__ bias, at::opmath_type<scalar_t>* __restrict__ contrib_bias) {
  using acc_t = at::opmath_type<scalar_t>;
  using mid_t = mid_type<scalar_t, out_t>;
  const int64_t total = g.output_numel();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t n, c, od, oh, ow;
    output_coords<CL>(i, g, n, c, od, oh, ow);
    const acc_t m = static_cast<acc_t>(mflat[c * m_stride]);
    const bool valid = tap_in_bounds(g, od, oh, ow, static_cast<int64_t>(off[i]));
    const acc_t x = pre_activation(static_cast<acc_t>(sel[i]),
                                   bias != nullptr ? static_cast<acc_t>(bias[c]) : acc_t(0), bias != nullptr);
    const acc_t gs = acc_t(0) + static_cast<acc_t>(go[i]);
    contrib[i] = valid ? grad_multiplier_via<mid_t>(gs, x, m, s1, s2) : acc_t(0);
    if (bias != nullptr) {
      acc_t cb = valid ? grad_input_via<mid_t>(gs, x, m, s1, s2) : acc_t(0);
      // Overlapping windows need the mixed form's first-selector rule (post_pool.h). Only this, the general
      // windows' kernel, sees overlaps: exact tilings take post_pool_backward_tiled2_kernel.
      if constexpr (!std::is_same_v<mid_t, acc_t>) {
        if (valid) {
          cb = selected_bias_grad<CL, out_t, scalar_t, acc_t, off_t, mid_t>(go, sel, off, g, i, n, c, od, oh, ow, m,
                                                                            s1, s2, static_cast<acc_t>(bias[c]));
        }
      }
      contrib_bias[i] = cb;
    }
  }
}

// Exact tiling (2x2x2, stride 2, no padding): each input element lies in at most one window, so one thread per
// output writes its whole window (the chosen tap's gradient, zeros elsewhere) and its multiplier contribution.
// No index search per input element, and the writes of a warp are contiguous runs.
template <typename scalar_t, typename out_t, typename off_t, bool CL>
__global__ void __launch_bounds__(kThreads) post_pool_backward_tiled2_kernel(
    const out_t* __restrict__ go, const scalar_t* __restrict__ sel, const off_t* __restrict__ off,
    const out_t* __restrict__ mflat, int64_t m_stride, const PoolGeometry g, const Strides st,
    at::opmath_type<scalar_t> s1, at::opmath_type<scalar_t> s2, scalar_t* __restrict__ gi,
    at::opmath_type<scalar_t>* __restrict__ contrib, const scalar_t* __restrict__ bias,
    at::opmath_type<scalar_t>* __restrict__ contrib_bias) {
  using acc_t = at::opmath_type<scalar_t>;
  using mid_t = mid_type<scalar_t, out_t>;
  const int64_t total = g.output_numel();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t n, c, od, oh, ow;
    output_coords<CL>(i, g, n, c, od, oh, ow);
    const acc_t m = static_cast<acc_t>(mflat[c * m_stride]);
    const acc_t x = pre_activation(static_cast<acc_t>(sel[i]),
                                   bias != nullptr ? static_cast<acc_t>(bias[c]) : acc_t(0), bias != nullptr);
    // 0 + g, as eager accumulates into a zeroed buffer (turns -0 into +0).
    const acc_t gsum = acc_t(0) + static_cast<acc_t>(go[i]);
    const acc_t gxa = grad_input_via<mid_t>(gsum, x, m, s1, s2);
    const scalar_t gx = static_cast<scalar_t>(gxa);
    contrib[i] = grad_multiplier_via<mid_t>(gsum, x, m, s1, s2);
    if (bias != nullptr) contrib_bias[i] = gxa;
    const int tap = static_cast<int>(off[i]);
    scalar_t* base = gi + n * st.n + c * st.c + (2 * od) * st.d + (2 * oh) * st.h + (2 * ow) * st.w;
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      base[(t >> 2) * st.d + ((t >> 1) & 1) * st.h + (t & 1) * st.w] = t == tap ? gx : scalar_t(0);
    }
  }
}

template <typename scalar_t, typename out_t, typename off_t, bool CL>
void launch_backward(const PoolGeometry& g, const at::Tensor& go, const at::Tensor& sel, const at::Tensor& off,
                     const at::Tensor& mflat, double s1d, double s2d, const at::Tensor& grad_input,
                     const at::Tensor& contrib, const at::Tensor& bias, const at::Tensor& contrib_bias,
                     cudaStream_t stream) {
  using acc_t = at::opmath_type<scalar_t>;
  const acc_t s1 = static_cast<acc_t>(s1d), s2 = static_cast<acc_t>(s2d);
  const out_t* gop = go.const_data_ptr<out_t>();
  const scalar_t* sp = sel.const_data_ptr<scalar_t>();
  const off_t* op = off.const_data_ptr<off_t>();
  const out_t* mp = mflat.const_data_ptr<out_t>();
  const int64_t ms = mflat.numel() == 1 ? 0 : 1;
  scalar_t* gi = grad_input.mutable_data_ptr<scalar_t>();
  const scalar_t* bp = bias.defined() ? bias.const_data_ptr<scalar_t>() : nullptr;
  acc_t* cb = contrib_bias.defined() ? contrib_bias.mutable_data_ptr<acc_t>() : nullptr;
  const dim3 grid_out(static_cast<unsigned>(num_blocks(g.output_numel())));
  if (g.exact_tiling && g.kd == 2 && g.kh == 2 && g.kw == 2) {
    if (g.OD * 2 != g.D || g.OH * 2 != g.H || g.OW * 2 != g.W) {
      grad_input.zero_();  // elements past the last window get no gradient
    }
    post_pool_backward_tiled2_kernel<scalar_t, out_t, off_t, CL><<<grid_out, kThreads, 0, stream>>>(
        gop, sp, op, mp, ms, g, input_strides(g), s1, s2, gi, contrib.mutable_data_ptr<acc_t>(), bp, cb);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  const dim3 grid_in(static_cast<unsigned>(num_blocks(g.input_numel())));
  post_pool_grad_input_kernel<scalar_t, out_t, off_t, CL, 0><<<grid_in, kThreads, 0, stream>>>(gop, sp, op, mp, ms, g, s1, s2, gi, bp);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  post_pool_grad_multiplier_kernel<scalar_t, out_t, off_t, CL><<<grid_out, kThreads, 0, stream>>>(
      gop, sp, op, mp, ms, g, s1, s2, contrib.mutable_data_ptr<acc_t>(), bp, cb);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename scalar_t, typename out_t>
void launch_backward_typed(const BackwardInputs& b, const at::Tensor& grad_input, const GradPartials& parts,
                           cudaStream_t stream) {
  auto run = [&](auto off_tag) {
    using off_t = decltype(off_tag);
    if (b.format == at::MemoryFormat::ChannelsLast3d) {
      launch_backward<scalar_t, out_t, off_t, true>(b.g, b.grad_output, b.selected, b.offsets, b.multiplier_flat,
                                                    b.s1, b.s2, grad_input, parts.multiplier, b.bias_flat,
                                                    parts.bias, stream);
    } else {
      launch_backward<scalar_t, out_t, off_t, false>(b.g, b.grad_output, b.selected, b.offsets, b.multiplier_flat,
                                                     b.s1, b.s2, grad_input, parts.multiplier, b.bias_flat,
                                                     parts.bias, stream);
    }
  };
  if (b.offsets.scalar_type() == at::kByte) {
    run(uint8_t{});
  } else {
    run(int32_t{});
  }
}

}  // namespace

ParamGrads launch_backward_cuda(const BackwardInputs& b, const at::Tensor& grad_input, const BackwardTuning& tuning) {
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (auto fast = launch_backward_tiled2_cuda(b, grad_input, tuning, stream)) return *fast;
  // The general kernels' full-size partials, allocated only once the fast path (which needs neither) declines:
  // up front they would cost 33.5-67 MB of transient peak per call at the default size.
  const GradPartials parts = alloc_grad_partials(b);
  if (is_mixed(b.selected.scalar_type(), b.multiplier_flat.scalar_type())) {
    AT_DISPATCH_REDUCED_FLOATING_TYPES(b.selected.scalar_type(), "fused_post_pool_bwd_cuda_mixed", [&] {
      launch_backward_typed<scalar_t, float>(b, grad_input, parts, stream);
    });
  } else {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, b.grad_output.scalar_type(), "fused_post_pool_bwd_cuda",
                                    [&] { launch_backward_typed<scalar_t, scalar_t>(b, grad_input, parts, stream); });
  }
  return reduce_grad_partials(parts, b);
}

}  // namespace post_pool
}  // namespace fused
