// CUDA forward launcher of the post_pool ops (inference and training forward, with or without bias): one thread
// per output in the generic kernel (any window, grid-stride, int64 offsets); the 2x2x2 fast path (windows tiling
// the whole input) takes 16 bytes per window row per thread and, for inference, the monotone shortcut. Layout
// (NCDHW / NDHWC) and window are template parameters, so each gets its own kernel rather than a runtime branch.
// The arithmetic is the header code the CPU kernels use (post_pool.h), so both devices compute the same bits.
#include "post_pool/cuda/launch.cuh"
#include "post_pool/launchers.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAStream.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace fused {
namespace post_pool {
namespace {

// out_t: the output's and multiplier's element type (scalar_t, or float in the mixed form; post_pool.h, mid_type).
template <typename scalar_t, typename out_t, typename off_t, bool CL, int K, bool SAVE>
__global__ void __launch_bounds__(kThreads) post_pool_forward_kernel(
    const scalar_t* __restrict__ x, const out_t* __restrict__ mflat, int64_t m_stride, const PoolGeometry g,
    const Strides st, at::opmath_type<scalar_t> s1, at::opmath_type<scalar_t> s2, out_t* __restrict__ out,
    scalar_t* __restrict__ sel, off_t* __restrict__ off, const scalar_t* __restrict__ bias) {
  using acc_t = at::opmath_type<scalar_t>;
  using mid_t = mid_type<scalar_t, out_t>;
  const int64_t total = g.output_numel();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t n, c, od, oh, ow;
    output_coords<CL>(i, g, n, c, od, oh, ow);
    const acc_t m = static_cast<acc_t>(mflat[c * m_stride]);
    const acc_t b = bias != nullptr ? static_cast<acc_t>(bias[c]) : acc_t(0);
    const auto r = scan_window<K, K, K, scalar_t, acc_t, mid_t>(x + n * st.n + c * st.c, st.d, st.h, st.w, od, oh,
                                                                ow, g, m, s1, s2, b, bias != nullptr);
    out[i] = static_cast<out_t>(r.value);
    if constexpr (SAVE) {
      sel[i] = r.input;
      off[i] = static_cast<off_t>(r.offset);
    }
  }
}

// ---- fast path: 2x2x2 windows tiling the whole input (D, H, W = 2*OD, 2*OH, 2*OW) -------------------------
// Each thread loads 16 bytes per window row and produces VEC outputs (contiguous: VEC neighbours along W;
// channels_last: VEC neighbouring channels). 32-bit index arithmetic when the tensor allows it, and no integer
// division beyond two per thread. Same arithmetic and tap order as scan_window.

// NaN-propagating max/min (one instruction on sm_80+): the monotone path below must let a NaN anywhere in the
// window through, as max_pool3d does.
__device__ __forceinline__ float max_nan(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return (a != a || b != b) ? a + b : fmaxf(a, b);
#endif
}
__device__ __forceinline__ float min_nan(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return (a != a || b != b) ? a + b : fminf(a, b);
#endif
}

// Inference shortcut. With both slopes > 0 (finite) and a finite non-zero multiplier m, the epilogue
// leaky2(leaky1(x + b) * m) is non-decreasing in x for m > 0 and non-increasing for m < 0 (every rounded step is
// monotone, and no step can make a NaN from a non-NaN: inf * slope stays inf, finite * m cannot be 0 * inf). So
// the max of the epilogue over a window is the epilogue of the window's max (m > 0) or min (m < 0): one max/min
// per element instead of the whole epilogue and compare-select. The value is the same as the full scan; only
// the sign of a zero result can differ when +0 and -0 tie in one window. Training (SAVE) needs the argmax and
// keeps the full scan. A zero, infinite or NaN m breaks monotonicity (0 * inf = NaN), so such channels use it too.
__device__ __forceinline__ bool monotone_multiplier(float m) { return m != 0.f && isfinite(m); }
// With a bias, x + b must be monotone in x and never NaN for a non-NaN x: true for a finite b only (-inf + inf).
__device__ __forceinline__ bool monotone_channel(float m, float b) { return monotone_multiplier(m) && isfinite(b); }

template <typename scalar_t, typename acc_t, typename mid_t = acc_t>
struct Best {
  acc_t value;
  scalar_t input;
  uint8_t tap;
  // As scan_window: the selection starts at tap 0 (input x0) with the max at -inf, so a window whose every value
  // is -inf keeps tap 0 and its input.
  __device__ void init(scalar_t x0) {
    value = -std::numeric_limits<acc_t>::infinity();
    input = x0;
    tap = 0;
  }
  __device__ void take(scalar_t x, acc_t m, acc_t s1, acc_t s2, acc_t b, bool has_bias, uint8_t t) {
    const acc_t v = epilogue_via<mid_t>(pre_activation(static_cast<acc_t>(x), b, has_bias), m, s1, s2);
    const bool t_ = takes_max(v, value);
    value = t_ ? v : value;
    input = t_ ? x : input;
    tap = t_ ? t : tap;
  }
};

// The mixed form (out_t float) keeps the inference shortcut: rounding the first LeakyReLU through scalar_t is
// non-decreasing, and a value it overflows to inf times the finite non-zero multiplier the shortcut requires is no
// NaN.
template <typename scalar_t, typename out_t, typename index_t, bool SAVE>
__global__ void __launch_bounds__(kThreads) post_pool_forward_tiled2_ncdhw_kernel(
    const scalar_t* __restrict__ x, const out_t* __restrict__ mflat, bool per_channel, index_t total,
    index_t OWv, index_t OH, index_t ODOH, index_t C, index_t W, index_t plane, at::opmath_type<scalar_t> s1,
    at::opmath_type<scalar_t> s2, out_t* __restrict__ out, scalar_t* __restrict__ sel,
    uint8_t* __restrict__ off, const scalar_t* __restrict__ bias, bool monotone) {
  using acc_t = at::opmath_type<scalar_t>;
  using mid_t = mid_type<scalar_t, out_t>;
  constexpr int VEC = vec_outputs<scalar_t>();
  const bool has_bias = bias != nullptr;
  using In = Pack<scalar_t, 2 * VEC>;
  for (index_t p = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < total;
       p += static_cast<index_t>(gridDim.x) * blockDim.x) {
    const index_t row = p / OWv;               // (n, c, od, oh)
    const index_t owv = p - row * OWv;
    const index_t base = 2 * W * (row + OH * (row / OH)) + 2 * VEC * owv;  // (n, c, 2od, 2oh, 2*VEC*owv)
    const index_t c = (row / ODOH) % C;
    const acc_t m = static_cast<acc_t>(mflat[per_channel ? c : 0]);
    const acc_t b = has_bias ? static_cast<acc_t>(bias[c]) : acc_t(0);
    In r[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      r[q] = *reinterpret_cast<const In*>(x + base + (q >> 1) * plane + (q & 1) * W);
    }
    Pack<out_t, VEC> o;
    Pack<scalar_t, VEC> sv;
    if constexpr (!SAVE && std::is_same_v<acc_t, float>) {
      if (monotone && monotone_channel(m, b)) {  // uniform per row: m and b are one channel's
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          acc_t hi = static_cast<acc_t>(r[0].v[2 * j]), lo = hi;
#pragma unroll
          for (int q = 0; q < 4; ++q) {
#pragma unroll
            for (int e = (q == 0); e < 2; ++e) {
              const acc_t v = static_cast<acc_t>(r[q].v[2 * j + e]);
              hi = max_nan(hi, v);
              lo = min_nan(lo, v);
            }
          }
          o.v[j] = static_cast<out_t>(epilogue_via<mid_t>(pre_activation(m > 0 ? hi : lo, b, has_bias), m, s1, s2));
        }
        store_pack(out + p * VEC, o);
        continue;
      }
    }
    Pack<uint8_t, VEC> ov;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      Best<scalar_t, acc_t, mid_t> best;
      best.init(r[0].v[2 * j]);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        best.take(r[q].v[2 * j], m, s1, s2, b, has_bias, static_cast<uint8_t>(2 * q));
        best.take(r[q].v[2 * j + 1], m, s1, s2, b, has_bias, static_cast<uint8_t>(2 * q + 1));
      }
      o.v[j] = static_cast<out_t>(best.value);
      sv.v[j] = best.input;
      ov.v[j] = best.tap;
    }
    store_pack(out + p * VEC, o);
    if constexpr (SAVE) {
      *reinterpret_cast<Pack<scalar_t, VEC>*>(sel + p * VEC) = sv;
#pragma unroll
      for (int j = 0; j < VEC; ++j) off[p * VEC + j] = ov.v[j];
    }
  }
}

template <typename scalar_t, typename out_t, typename index_t, bool SAVE>
__global__ void __launch_bounds__(kThreads) post_pool_forward_tiled2_ndhwc_kernel(
    const scalar_t* __restrict__ x, const out_t* __restrict__ mflat, bool per_channel, index_t total,
    index_t Cv, index_t C, index_t OW, index_t OH, at::opmath_type<scalar_t> s1, at::opmath_type<scalar_t> s2,
    out_t* __restrict__ out, scalar_t* __restrict__ sel, uint8_t* __restrict__ off,
    const scalar_t* __restrict__ bias, bool monotone) {
  using acc_t = at::opmath_type<scalar_t>;
  using mid_t = mid_type<scalar_t, out_t>;
  constexpr int VEC = vec_outputs<scalar_t>() * 2;  // 16 bytes of channels per tap
  using In = Pack<scalar_t, VEC>;
  const index_t sw = C, sh = 2 * OW * C, sd = 4 * OH * OW * C;
  for (index_t p = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < total;
       p += static_cast<index_t>(gridDim.x) * blockDim.x) {
    const index_t pos = p / Cv;                // (n, od, oh, ow)
    const index_t c = (p - pos * Cv) * VEC;
    const index_t b = pos / OW;                // (n, od, oh)
    const index_t ow = pos - b * OW;
    const index_t a = b / OH;                  // (n, od)
    const index_t base = (4 * OW * (a * OH + b) + 2 * ow) * C + c;
    acc_t m[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) m[j] = static_cast<acc_t>(mflat[per_channel ? c + j : 0]);
    const bool has_bias = bias != nullptr;
    acc_t bv[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) bv[j] = has_bias ? static_cast<acc_t>(bias[c + j]) : acc_t(0);
    // All eight taps are loaded before any arithmetic so that each thread has 128 bytes in flight.
    In r[8];
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      r[t] = *reinterpret_cast<const In*>(x + base + (t >> 2) * sd + ((t >> 1) & 1) * sh + (t & 1) * sw);
    }
    Pack<out_t, VEC> o;
    Pack<scalar_t, VEC> sv;
    if constexpr (!SAVE && std::is_same_v<acc_t, float>) {
      bool all_monotone = monotone;
#pragma unroll
      for (int j = 0; j < VEC; ++j) all_monotone = all_monotone && monotone_channel(m[j], bv[j]);
      if (all_monotone) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          acc_t hi = static_cast<acc_t>(r[0].v[j]), lo = hi;
#pragma unroll
          for (int t = 1; t < 8; ++t) {
            const acc_t v = static_cast<acc_t>(r[t].v[j]);
            hi = max_nan(hi, v);
            lo = min_nan(lo, v);
          }
          o.v[j] = static_cast<out_t>(
              epilogue_via<mid_t>(pre_activation(m[j] > 0 ? hi : lo, bv[j], has_bias), m[j], s1, s2));
        }
        store_pack(out + p * VEC, o);
        continue;
      }
    }
    Best<scalar_t, acc_t, mid_t> best[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) best[j].init(r[0].v[j]);
#pragma unroll
    for (int t = 0; t < 8; ++t) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) best[j].take(r[t].v[j], m[j], s1, s2, bv[j], has_bias, static_cast<uint8_t>(t));
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      o.v[j] = static_cast<out_t>(best[j].value);
      sv.v[j] = best[j].input;
    }
    store_pack(out + p * VEC, o);
    if constexpr (SAVE) {
      *reinterpret_cast<Pack<scalar_t, VEC>*>(sel + p * VEC) = sv;
#pragma unroll
      for (int j = 0; j < VEC; ++j) off[p * VEC + j] = best[j].tap;
    }
  }
}

// Launches the fast path if the geometry and alignment allow it; returns false otherwise.
template <typename scalar_t, typename out_t, typename off_t, bool SAVE>
bool launch_forward_tiled2(const ForwardInputs& f, const at::Tensor& out, const at::Tensor& sel, const at::Tensor& off,
                           cudaStream_t stream) {
  using acc_t = at::opmath_type<scalar_t>;
  const PoolGeometry& g = f.g;
  if constexpr (!std::is_same_v<off_t, uint8_t>) {
    return false;
  } else {
    if (!tiles_2x2x2(g)) return false;
    const scalar_t* x = f.input.const_data_ptr<scalar_t>();
    if (reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(out.const_data_ptr()) % 16 != 0 ||
        (SAVE && reinterpret_cast<uintptr_t>(sel.const_data_ptr()) % 16 != 0)) {
      return false;
    }
    const bool per_channel = f.multiplier.numel() != 1;
    const out_t* m = f.multiplier.const_data_ptr<out_t>();
    const acc_t s1 = static_cast<acc_t>(f.s1), s2 = static_cast<acc_t>(f.s2);
    out_t* o = out.mutable_data_ptr<out_t>();
    scalar_t* sp = SAVE ? sel.mutable_data_ptr<scalar_t>() : nullptr;
    uint8_t* op = SAVE ? off.mutable_data_ptr<uint8_t>() : nullptr;
    const scalar_t* bp = f.bias.defined() ? f.bias.const_data_ptr<scalar_t>() : nullptr;
    const bool small = g.input_numel() < (int64_t(1) << 31);
    // Slopes > 0 and finite make the epilogue monotone (see monotone_multiplier); the kernels check m per channel.
    // Decided on the slopes the kernels compute with (acc_t): a double slope of 1e-50 is 0 in float.
    const bool monotone = s1 > acc_t(0) && s2 > acc_t(0) && std::isfinite(static_cast<double>(s1)) &&
                          std::isfinite(static_cast<double>(s2));
    if (!g.channels_last) {
      constexpr int VEC = vec_outputs<scalar_t>();
      if (g.OW % VEC != 0) return false;
      const int64_t total = g.output_numel() / VEC;
      const dim3 grid(static_cast<unsigned>(num_blocks(total)));
      auto go = [&](auto idx) {
        using index_t = decltype(idx);
        post_pool_forward_tiled2_ncdhw_kernel<scalar_t, out_t, index_t, SAVE><<<grid, kThreads, 0, stream>>>(
            x, m, per_channel, static_cast<index_t>(total), static_cast<index_t>(g.OW / VEC),
            static_cast<index_t>(g.OH), static_cast<index_t>(g.OD * g.OH), static_cast<index_t>(g.C),
            static_cast<index_t>(g.W), static_cast<index_t>(g.H * g.W), s1, s2, o, sp, op, bp, monotone);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      };
      small ? go(int32_t{}) : go(int64_t{});
    } else {
      constexpr int VEC = vec_outputs<scalar_t>() * 2;
      if (g.C % VEC != 0) return false;
      const int64_t total = g.output_numel() / VEC;
      const dim3 grid(static_cast<unsigned>(num_blocks(total)));
      auto go = [&](auto idx) {
        using index_t = decltype(idx);
        post_pool_forward_tiled2_ndhwc_kernel<scalar_t, out_t, index_t, SAVE><<<grid, kThreads, 0, stream>>>(
            x, m, per_channel, static_cast<index_t>(total), static_cast<index_t>(g.C / VEC),
            static_cast<index_t>(g.C), static_cast<index_t>(g.OW), static_cast<index_t>(g.OH), s1, s2, o, sp, op, bp,
            monotone);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      };
      small ? go(int32_t{}) : go(int64_t{});
    }
    return true;
  }
}

template <typename scalar_t, typename out_t, typename off_t, bool SAVE>
void launch_forward(const ForwardInputs& f, const at::Tensor& out, const at::Tensor& sel, const at::Tensor& off,
                    cudaStream_t stream) {
  using acc_t = at::opmath_type<scalar_t>;
  const PoolGeometry& g = f.g;
  const Strides st = input_strides(g);
  const scalar_t* x = f.input.const_data_ptr<scalar_t>();
  const out_t* m = f.multiplier.const_data_ptr<out_t>();
  const int64_t ms = f.multiplier.numel() == 1 ? 0 : 1;
  const acc_t s1 = static_cast<acc_t>(f.s1), s2 = static_cast<acc_t>(f.s2);
  out_t* o = out.mutable_data_ptr<out_t>();
  scalar_t* sp = SAVE ? sel.mutable_data_ptr<scalar_t>() : nullptr;
  off_t* op = SAVE ? off.mutable_data_ptr<off_t>() : nullptr;
  const scalar_t* bp = f.bias.defined() ? f.bias.const_data_ptr<scalar_t>() : nullptr;
  if (launch_forward_tiled2<scalar_t, out_t, off_t, SAVE>(f, out, sel, off, stream)) return;
  const bool k2 = g.exact_tiling && g.kd == 2 && g.kh == 2 && g.kw == 2;
  const dim3 grid(static_cast<unsigned>(num_blocks(g.output_numel())));
  if (g.channels_last) {
    if (k2) {
      post_pool_forward_kernel<scalar_t, out_t, off_t, true, 2, SAVE><<<grid, kThreads, 0, stream>>>(x, m, ms, g, st, s1, s2, o, sp, op, bp);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    } else {
      post_pool_forward_kernel<scalar_t, out_t, off_t, true, 0, SAVE><<<grid, kThreads, 0, stream>>>(x, m, ms, g, st, s1, s2, o, sp, op, bp);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  } else {
    if (k2) {
      post_pool_forward_kernel<scalar_t, out_t, off_t, false, 2, SAVE><<<grid, kThreads, 0, stream>>>(x, m, ms, g, st, s1, s2, o, sp, op, bp);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    } else {
      post_pool_forward_kernel<scalar_t, out_t, off_t, false, 0, SAVE><<<grid, kThreads, 0, stream>>>(x, m, ms, g, st, s1, s2, o, sp, op, bp);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  }
}

template <typename scalar_t, typename out_t>
void launch_forward_typed(const ForwardInputs& f, const ForwardOutputs& o, cudaStream_t stream) {
  if (!o.save()) {
    launch_forward<scalar_t, out_t, uint8_t, false>(f, o.out, o.selected, o.offsets, stream);
  } else if (f.g.offset_dtype() == at::kByte) {
    launch_forward<scalar_t, out_t, uint8_t, true>(f, o.out, o.selected, o.offsets, stream);
  } else {
    launch_forward<scalar_t, out_t, int32_t, true>(f, o.out, o.selected, o.offsets, stream);
  }
}

}  // namespace

void launch_forward_cuda(const ForwardInputs& f, const ForwardOutputs& o) {
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (is_mixed(f.input.scalar_type(), f.multiplier.scalar_type())) {
    AT_DISPATCH_REDUCED_FLOATING_TYPES(f.input.scalar_type(), "fused_post_pool_cuda_mixed", [&] {
      launch_forward_typed<scalar_t, float>(f, o, stream);
    });
    return;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, f.input.scalar_type(), "fused_post_pool_cuda", [&] {
    launch_forward_typed<scalar_t, scalar_t>(f, o, stream);
  });
}

}  // namespace post_pool
}  // namespace fused
