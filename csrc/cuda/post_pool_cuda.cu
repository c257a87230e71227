// CUDA kernels of fused::post_pool, post_pool_with_offsets and post_pool_backward, and of their post_pool_bias
// variants (a per-channel bias added before the first LeakyReLU, a runtime-uniform branch in the same kernels).
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

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>
#include <limits>
#include <type_traits>

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

// ---- programmatic dependent launch (Hopper and later) ---------------------------------------------------
// The backward is two or three launches per call (main kernel, then one or two per-channel sum passes), and a
// dependent launch in the same stream normally starts only after the previous grid has drained, so each boundary
// leaves the GPU idle for the launch latency. With programmatic stream serialization a kernel's blocks may be
// scheduled while the previous grid still runs; they wait at griddepcontrol.wait, which returns once that grid
// has completed and its memory is visible, so every global access after it is ordered exactly as without the
// attribute. TORCH_FUSED_OPS_PDL=0 turns it off (read once per process); older GPUs launch plainly.
__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel in the stream (if launched with the attribute) be scheduled now; it still waits for this
// grid's completion before touching memory.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

bool pdl_enabled() {
  static const bool env_on = [] {
    const char* e = std::getenv("TORCH_FUSED_OPS_PDL");
    return !(e != nullptr && std::string(e) == "0");
  }();
  if (!env_on) return false;
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  // Compute capability major per device ordinal, 0 = not yet asked (atomic: calls may come from several threads).
  static std::atomic<int> major[64];
  if (device < 0 || device >= 64) return false;
  int cc = major[device].load(std::memory_order_relaxed);
  if (cc == 0) {
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&cc, cudaDevAttrComputeCapabilityMajor, device));
    major[device].store(cc, std::memory_order_relaxed);
  }
  return cc >= 9;
}

// Launches kernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent launch where enabled.
// Only kernels that call wait_for_prior_grid() before their first global memory access may go through here.
// Inside a CUDA-graph capture it launches plainly: dependent launches in captured graphs have not run on our GPU
// machine yet, and graph replay already removes most of the gaps between launches.
template <typename... KernelArgs, typename... Args>
void launch_dependent(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                      Args&&... args) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (!pdl_enabled() || capture != cudaStreamCaptureStatusNone) {
    kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  C10_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename scalar_t, typename off_t, bool CL, int K, bool SAVE>
__global__ void __launch_bounds__(kThreads) post_pool_forward_kernel(
    const scalar_t* __restrict__ x, const scalar_t* __restrict__ mflat, int64_t m_stride, const PoolGeometry g,
    const Strides st, at::opmath_type<scalar_t> s1, at::opmath_type<scalar_t> s2, scalar_t* __restrict__ out,
    scalar_t* __restrict__ sel, off_t* __restrict__ off, const scalar_t* __restrict__ bias) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t total = g.output_numel();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t n, c, od, oh, ow;
    output_coords<CL>(i, g, n, c, od, oh, ow);
    const acc_t m = static_cast<acc_t>(mflat[c * m_stride]);
    const acc_t b = bias != nullptr ? static_cast<acc_t>(bias[c]) : acc_t(0);
    const auto r = scan_window<K, K, K>(x + n * st.n + c * st.c, st.d, st.h, st.w, od, oh, ow, g, m, s1, s2, b,
                                        bias != nullptr);
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
    at::opmath_type<scalar_t> s2, scalar_t* __restrict__ gi, const scalar_t* __restrict__ bias) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t total = g.input_numel();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t n, c, d, h, w;
    input_coords<CL>(i, g, n, c, d, h, w);
    const acc_t m = static_cast<acc_t>(mflat[c * m_stride]);
    const acc_t b = bias != nullptr ? static_cast<acc_t>(bias[c]) : acc_t(0);
    gi[i] = static_cast<scalar_t>(
        gather_grad<CL, K, K, K>(go, sel, off, g, n, c, d, h, w, m, s1, s2, b, bias != nullptr));
  }
}

template <typename scalar_t, typename off_t, bool CL>
__global__ void __launch_bounds__(kThreads) post_pool_grad_multiplier_kernel(
    const scalar_t* __restrict__ go, const scalar_t* __restrict__ sel, const off_t* __restrict__ off,
    const scalar_t* __restrict__ mflat, int64_t m_stride, const PoolGeometry g, at::opmath_type<scalar_t> s1,
    at::opmath_type<scalar_t> s2, at::opmath_type<scalar_t>* __restrict__ contrib,
    const scalar_t* __restrict__ bias, at::opmath_type<scalar_t>* __restrict__ contrib_bias) {
  using acc_t = at::opmath_type<scalar_t>;
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
    contrib[i] = valid ? grad_multiplier_of(gs, x, m, s1, s2) : acc_t(0);
    if (bias != nullptr) contrib_bias[i] = valid ? grad_input_of(gs, x, m, s1, s2) : acc_t(0);
  }
}

// ---- fast path: 2x2x2 windows tiling the whole input (D, H, W = 2*OD, 2*OH, 2*OW) -------------------------
// Each thread loads 16 bytes per window row and produces VEC outputs (contiguous: VEC neighbours along W;
// channels_last: VEC neighbouring channels). 32-bit index arithmetic when the tensor allows it, and no integer
// division beyond two per thread. Same arithmetic and tap order as scan_window.

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

template <typename scalar_t>
constexpr int vec_outputs() {
  return sizeof(scalar_t) >= 8 ? 1 : 8 / static_cast<int>(sizeof(scalar_t));
}

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

template <typename scalar_t, typename acc_t>
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
    const acc_t v = epilogue(pre_activation(static_cast<acc_t>(x), b, has_bias), m, s1, s2);
    const bool t_ = takes_max(v, value);
    value = t_ ? v : value;
    input = t_ ? x : input;
    tap = t_ ? t : tap;
  }
};

template <typename scalar_t, typename index_t, bool SAVE>
__global__ void __launch_bounds__(kThreads) post_pool_forward_tiled2_ncdhw_kernel(
    const scalar_t* __restrict__ x, const scalar_t* __restrict__ mflat, bool per_channel, index_t total,
    index_t OWv, index_t OH, index_t ODOH, index_t C, index_t W, index_t plane, at::opmath_type<scalar_t> s1,
    at::opmath_type<scalar_t> s2, scalar_t* __restrict__ out, scalar_t* __restrict__ sel,
    uint8_t* __restrict__ off, const scalar_t* __restrict__ bias, bool monotone) {
  using acc_t = at::opmath_type<scalar_t>;
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
    Pack<scalar_t, VEC> o, sv;
    if constexpr (!SAVE && std::is_same_v<acc_t, float>) {
      if (monotone && monotone_multiplier(m)) {  // uniform per row: m is one channel's
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
          o.v[j] = static_cast<scalar_t>(epilogue(pre_activation(m > 0 ? hi : lo, b, has_bias), m, s1, s2));
        }
        *reinterpret_cast<Pack<scalar_t, VEC>*>(out + p * VEC) = o;
        continue;
      }
    }
    Pack<uint8_t, VEC> ov;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      Best<scalar_t, acc_t> best;
      best.init(r[0].v[2 * j]);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        best.take(r[q].v[2 * j], m, s1, s2, b, has_bias, static_cast<uint8_t>(2 * q));
        best.take(r[q].v[2 * j + 1], m, s1, s2, b, has_bias, static_cast<uint8_t>(2 * q + 1));
      }
      o.v[j] = static_cast<scalar_t>(best.value);
      sv.v[j] = best.input;
      ov.v[j] = best.tap;
    }
    *reinterpret_cast<Pack<scalar_t, VEC>*>(out + p * VEC) = o;
    if constexpr (SAVE) {
      *reinterpret_cast<Pack<scalar_t, VEC>*>(sel + p * VEC) = sv;
#pragma unroll
      for (int j = 0; j < VEC; ++j) off[p * VEC + j] = ov.v[j];
    }
  }
}

template <typename scalar_t, typename index_t, bool SAVE>
__global__ void __launch_bounds__(kThreads) post_pool_forward_tiled2_ndhwc_kernel(
    const scalar_t* __restrict__ x, const scalar_t* __restrict__ mflat, bool per_channel, index_t total,
    index_t Cv, index_t C, index_t OW, index_t OH, at::opmath_type<scalar_t> s1, at::opmath_type<scalar_t> s2,
    scalar_t* __restrict__ out, scalar_t* __restrict__ sel, uint8_t* __restrict__ off,
    const scalar_t* __restrict__ bias, bool monotone) {
  using acc_t = at::opmath_type<scalar_t>;
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
    Pack<scalar_t, VEC> o, sv;
    if constexpr (!SAVE && std::is_same_v<acc_t, float>) {
      bool all_monotone = monotone;
#pragma unroll
      for (int j = 0; j < VEC; ++j) all_monotone = all_monotone && monotone_multiplier(m[j]);
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
          o.v[j] = static_cast<scalar_t>(epilogue(pre_activation(m[j] > 0 ? hi : lo, bv[j], has_bias), m[j], s1, s2));
        }
        *reinterpret_cast<Pack<scalar_t, VEC>*>(out + p * VEC) = o;
        continue;
      }
    }
    Best<scalar_t, acc_t> best[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) best[j].init(r[0].v[j]);
#pragma unroll
    for (int t = 0; t < 8; ++t) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) best[j].take(r[t].v[j], m[j], s1, s2, bv[j], has_bias, static_cast<uint8_t>(t));
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      o.v[j] = static_cast<scalar_t>(best[j].value);
      sv.v[j] = best[j].input;
    }
    *reinterpret_cast<Pack<scalar_t, VEC>*>(out + p * VEC) = o;
    if constexpr (SAVE) {
      *reinterpret_cast<Pack<scalar_t, VEC>*>(sel + p * VEC) = sv;
#pragma unroll
      for (int j = 0; j < VEC; ++j) off[p * VEC + j] = best[j].tap;
    }
  }
}

// Launches the fast path if the geometry and alignment allow it; returns false otherwise.
template <typename scalar_t, typename off_t, bool SAVE>
bool launch_forward_tiled2(const ForwardInputs& f, const at::Tensor& out, const at::Tensor& sel, const at::Tensor& off,
                           cudaStream_t stream) {
  using acc_t = at::opmath_type<scalar_t>;
  const PoolGeometry& g = f.g;
  if constexpr (!std::is_same_v<off_t, uint8_t>) {
    return false;
  } else {
    if (!(g.exact_tiling && g.kd == 2 && g.kh == 2 && g.kw == 2 && g.D == 2 * g.OD && g.H == 2 * g.OH &&
          g.W == 2 * g.OW)) {
      return false;
    }
    const scalar_t* x = f.input.const_data_ptr<scalar_t>();
    if (reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(out.const_data_ptr()) % 16 != 0 ||
        (SAVE && reinterpret_cast<uintptr_t>(sel.const_data_ptr()) % 16 != 0)) {
      return false;
    }
    const bool per_channel = f.multiplier.numel() != 1;
    const scalar_t* m = f.multiplier.const_data_ptr<scalar_t>();
    const acc_t s1 = static_cast<acc_t>(f.s1), s2 = static_cast<acc_t>(f.s2);
    scalar_t* o = out.mutable_data_ptr<scalar_t>();
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
        post_pool_forward_tiled2_ncdhw_kernel<scalar_t, index_t, SAVE><<<grid, kThreads, 0, stream>>>(
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
        post_pool_forward_tiled2_ndhwc_kernel<scalar_t, index_t, SAVE><<<grid, kThreads, 0, stream>>>(
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

// Exact tiling (2x2x2, stride 2, no padding): each input element lies in at most one window, so one thread per
// output writes its whole window (the chosen tap's gradient, zeros elsewhere) and its multiplier contribution.
// No index search per input element, and the writes of a warp are contiguous runs.
template <typename scalar_t, typename off_t, bool CL>
__global__ void __launch_bounds__(kThreads) post_pool_backward_tiled2_kernel(
    const scalar_t* __restrict__ go, const scalar_t* __restrict__ sel, const off_t* __restrict__ off,
    const scalar_t* __restrict__ mflat, int64_t m_stride, const PoolGeometry g, const Strides st,
    at::opmath_type<scalar_t> s1, at::opmath_type<scalar_t> s2, scalar_t* __restrict__ gi,
    at::opmath_type<scalar_t>* __restrict__ contrib, const scalar_t* __restrict__ bias,
    at::opmath_type<scalar_t>* __restrict__ contrib_bias) {
  using acc_t = at::opmath_type<scalar_t>;
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
    const acc_t gxa = grad_input_of(gsum, x, m, s1, s2);
    const scalar_t gx = static_cast<scalar_t>(gxa);
    contrib[i] = grad_multiplier_of(gsum, x, m, s1, s2);
    if (bias != nullptr) contrib_bias[i] = gxa;
    const int tap = static_cast<int>(off[i]);
    scalar_t* base = gi + n * st.n + c * st.c + (2 * od) * st.d + (2 * oh) * st.h + (2 * ow) * st.w;
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      base[(t >> 2) * st.d + ((t >> 1) & 1) * st.h + (t & 1) * st.w] = t == tap ? gx : scalar_t(0);
    }
  }
}

// ---- backward fast path: 2x2x2 windows tiling the whole input ---------------------------------------------
// One thread per pack of VEC outputs (contiguous: VEC neighbours along W; channels_last: VEC neighbouring
// channels), so every window row it writes is one 16-byte store. The multiplier (and bias) gradient is reduced
// in the kernel, deterministically: each thread sums its VEC outputs in order, then, where the packs of a warp or
// of a whole block are known to share channels, a fixed xor-butterfly reduces over the warp and (per block) the
// warps' sums are added in order; one partial per pack, warp or block is written, and the per-channel sum kernel
// below adds them in a fixed order. No atomics, so the gradient is the same bits run to run.

// Sums v over lanes whose lane index differs only in bits >= `from` (the lanes holding the same channels).
__device__ __forceinline__ float warp_sum_from(float v, int from) {
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) {
    if (o >= from) v += __shfl_xor_sync(0xffffffffu, v, o);
  }
  return v;
}

template <typename scalar_t>
struct BwdArgs {
  const scalar_t* go;
  const scalar_t* sel;
  const uint8_t* off;
  const scalar_t* mflat;
  const scalar_t* bias;
  scalar_t* gi;
  at::opmath_type<scalar_t>* contrib;       // multiplier partials
  at::opmath_type<scalar_t>* contrib_bias;  // bias partials (null without a bias)
  bool per_channel;
  at::opmath_type<scalar_t> s1, s2;
  unsigned int* sum_counter;  // the single-launch sum's block counter, zeroed here (null: the two-pass sum)
};

// Zeroes the per-channel sum's block counter for the kernel that follows this one in the stream (after this
// grid's wait, so a previous call's sum kernel that used the same memory has finished).
template <typename scalar_t>
__device__ __forceinline__ void reset_sum_counter(const BwdArgs<scalar_t>& a) {
  if (a.sum_counter != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *a.sum_counter = 0u;
}

template <typename scalar_t, typename acc_t>
__device__ __forceinline__ void grad_pair(const BwdArgs<scalar_t>& a, scalar_t go, scalar_t sel, acc_t m, acc_t b,
                                          scalar_t& gx, acc_t& cm, acc_t& cb) {
  const bool has_bias = a.bias != nullptr;
  const acc_t x = pre_activation(static_cast<acc_t>(sel), b, has_bias);
  const acc_t gs = acc_t(0) + static_cast<acc_t>(go);  // as eager accumulates into a zeroed buffer
  const acc_t gxa = grad_input_of(gs, x, m, a.s1, a.s2);
  gx = static_cast<scalar_t>(gxa);
  cm = grad_multiplier_of(gs, x, m, a.s1, a.s2);
  cb = gxa;
}

// Partials of the contiguous backward: one per pack, per warp (its 32 packs lie in one channel plane) or per
// block (its kThreads packs do). Fewer partials make the per-channel sum after the kernel shorter, and that sum
// is a latency-bound launch on the critical path.
enum class Partials { kPack, kWarp, kBlock };

template <typename scalar_t, typename index_t, Partials PART>
__global__ void __launch_bounds__(kThreads) post_pool_backward_tiled2_ncdhw_kernel(
    const BwdArgs<scalar_t> a, index_t total, index_t OWv, index_t OH, index_t ODOH, index_t C, index_t W,
    index_t plane) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int VEC = vec_outputs<scalar_t>();
  const index_t p = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  acc_t cm_sum = 0, cb_sum = 0;
  wait_for_prior_grid();
  allow_dependent_launch();
  reset_sum_counter(a);
  if (p < total) {
    const index_t row = p / OWv;  // (n, c, od, oh)
    const index_t owv = p - row * OWv;
    const index_t base = 2 * W * (row + OH * (row / OH)) + 2 * VEC * owv;
    const index_t c = (row / ODOH) % C;
    const acc_t m = static_cast<acc_t>(a.mflat[a.per_channel ? c : 0]);
    const acc_t b = a.bias != nullptr ? static_cast<acc_t>(a.bias[c]) : acc_t(0);
    const auto go = *reinterpret_cast<const Pack<scalar_t, VEC>*>(a.go + p * VEC);
    const auto sel = *reinterpret_cast<const Pack<scalar_t, VEC>*>(a.sel + p * VEC);
    const auto off = *reinterpret_cast<const Pack<uint8_t, VEC>*>(a.off + p * VEC);
    Pack<scalar_t, 2 * VEC> rows[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
#pragma unroll
      for (int k = 0; k < 2 * VEC; ++k) rows[q].v[k] = scalar_t(0);
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      scalar_t gx;
      acc_t cm, cb;
      grad_pair(a, go.v[j], sel.v[j], m, b, gx, cm, cb);
      cm_sum += cm;
      cb_sum += cb;
      const int t = off.v[j];  // tap (jd*2 + jh)*2 + jw: row q = t >> 1, column 2j + (t & 1)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        rows[q].v[2 * j] = (t == 2 * q) ? gx : rows[q].v[2 * j];
        rows[q].v[2 * j + 1] = (t == 2 * q + 1) ? gx : rows[q].v[2 * j + 1];
      }
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      *reinterpret_cast<Pack<scalar_t, 2 * VEC>*>(a.gi + base + (q >> 1) * plane + (q & 1) * W) = rows[q];
    }
    if constexpr (PART == Partials::kPack) {
      a.contrib[p] = cm_sum;
      if (a.contrib_bias != nullptr) a.contrib_bias[p] = cb_sum;
    }
  }
  if constexpr (PART == Partials::kWarp) {  // all 32 packs of this warp exist and lie in one plane (host-checked)
    cm_sum = warp_sum_from(cm_sum, 1);
    cb_sum = warp_sum_from(cb_sum, 1);
    if ((threadIdx.x & 31) == 0 && p < total) {
      a.contrib[p / 32] = cm_sum;
      if (a.contrib_bias != nullptr) a.contrib_bias[p / 32] = cb_sum;
    }
  }
  if constexpr (PART == Partials::kBlock) {  // all kThreads packs exist and lie in one plane (host-checked)
    __shared__ acc_t warp_sums[2][kThreads / 32];
    cm_sum = warp_sum_from(cm_sum, 1);
    cb_sum = warp_sum_from(cb_sum, 1);
    const int warp = threadIdx.x / 32;
    if ((threadIdx.x & 31) == 0) {
      warp_sums[0][warp] = cm_sum;
      warp_sums[1][warp] = cb_sum;
    }
    __syncthreads();
    if (threadIdx.x < 2) {
      acc_t s = 0;
#pragma unroll
      for (int w = 0; w < kThreads / 32; ++w) s += warp_sums[threadIdx.x][w];
      acc_t* dst = threadIdx.x == 0 ? a.contrib : a.contrib_bias;
      if (dst != nullptr) dst[blockIdx.x] = s;
    }
  }
}

// channels_last: each thread takes ITEMS packs, kThreads apart (so a warp's loads and stores stay coalesced),
// loads them all before computing (ITEMS independent loads in flight per thread). With BLOCK (kThreads % Cv == 0,
// host-checked) every pack a thread takes holds the same VEC channels, and the block folds its partials into one
// row of C per block in a fixed order: [blocks, C] partials instead of one row per warp (8x, or 8*ITEMS x, fewer
// to write and to sum). Without BLOCK, ITEMS is 1 and every pack writes its own VEC partials.
template <typename scalar_t, typename index_t, int ITEMS, bool BLOCK>
__global__ void __launch_bounds__(kThreads) post_pool_backward_tiled2_ndhwc_kernel(
    const BwdArgs<scalar_t> a, index_t total, index_t Cv, index_t C, index_t OW, index_t OH) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int VEC = vec_outputs<scalar_t>() * 2;
  static_assert(BLOCK || ITEMS == 1, "per-pack partials take one pack per thread");
  const index_t sw = C, sh = 2 * OW * C, sd = 4 * OH * OW * C;
  const index_t first = static_cast<index_t>(blockIdx.x) * (kThreads * ITEMS) + threadIdx.x;
  acc_t cm_sum[VEC], cb_sum[VEC];
  wait_for_prior_grid();
  allow_dependent_launch();
  reset_sum_counter(a);
#pragma unroll
  for (int j = 0; j < VEC; ++j) cm_sum[j] = cb_sum[j] = acc_t(0);
  Pack<scalar_t, VEC> go[ITEMS], sel[ITEMS];
  Pack<uint8_t, VEC> off[ITEMS];
#pragma unroll
  for (int it = 0; it < ITEMS; ++it) {
    const index_t p = first + it * kThreads;
    if (p < total) {
      go[it] = *reinterpret_cast<const Pack<scalar_t, VEC>*>(a.go + p * VEC);
      sel[it] = *reinterpret_cast<const Pack<scalar_t, VEC>*>(a.sel + p * VEC);
      off[it] = *reinterpret_cast<const Pack<uint8_t, VEC>*>(a.off + p * VEC);
    }
  }
  // The same channels for every item (BLOCK), so their multiplier and bias are loaded once.
  const index_t c = (first % Cv) * VEC;
  acc_t m[VEC], b[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    m[j] = static_cast<acc_t>(a.mflat[a.per_channel ? c + j : 0]);
    b[j] = a.bias != nullptr ? static_cast<acc_t>(a.bias[c + j]) : acc_t(0);
  }
#pragma unroll
  for (int it = 0; it < ITEMS; ++it) {
    const index_t p = first + it * kThreads;
    if (p < total) {
      const index_t pos = p / Cv;  // (n, od, oh, ow)
      const index_t bq = pos / OW;  // (n, od, oh)
      const index_t ow = pos - bq * OW;
      const index_t aq = bq / OH;   // (n, od)
      const index_t base = (4 * OW * (aq * OH + bq) + 2 * ow) * C + c;
      scalar_t gx[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        acc_t cm, cb;
        grad_pair(a, go[it].v[j], sel[it].v[j], m[j], b[j], gx[j], cm, cb);
        cm_sum[j] += cm;
        cb_sum[j] += cb;
      }
#pragma unroll
      for (int t = 0; t < 8; ++t) {
        Pack<scalar_t, VEC> r;
#pragma unroll
        for (int j = 0; j < VEC; ++j) r.v[j] = off[it].v[j] == t ? gx[j] : scalar_t(0);
        *reinterpret_cast<Pack<scalar_t, VEC>*>(a.gi + base + (t >> 2) * sd + ((t >> 1) & 1) * sh + (t & 1) * sw) =
            r;
      }
      if constexpr (!BLOCK) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          a.contrib[p * VEC + j] = cm_sum[j];
          if (a.contrib_bias != nullptr) a.contrib_bias[p * VEC + j] = cb_sum[j];
        }
      }
    }
  }
  if constexpr (BLOCK) {
    // Thread t holds channels (t % Cv) * VEC + j; fold the kThreads / Cv threads of each channel in order.
    __shared__ acc_t red[VEC * kThreads];
    const int cv = static_cast<int>(Cv), rows = kThreads / cv;
    for (int operand = 0; operand < (a.contrib_bias != nullptr ? 2 : 1); ++operand) {
      acc_t* dst = (operand == 0 ? a.contrib : a.contrib_bias) + static_cast<index_t>(blockIdx.x) * C;
#pragma unroll
      for (int j = 0; j < VEC; ++j) red[j * kThreads + threadIdx.x] = operand == 0 ? cm_sum[j] : cb_sum[j];
      __syncthreads();
      for (int ch = threadIdx.x; ch < cv * VEC; ch += kThreads) {
        const int cp = ch / VEC, j = ch - cp * VEC;
        acc_t s = 0;
        for (int r = 0; r < rows; ++r) s += red[j * kThreads + r * cv + cp];
        dst[ch] = s;
      }
      __syncthreads();
    }
  }
}

// ---- per-channel sum of the fast path's partials ---------------------------------------------------------
// The partials are small but strided per channel, and aten's two-axis sum of them cost more than a fifth of the
// whole backward on the H200. This sums them in an order fixed by the shapes alone (no atomics, nothing
// depending on the device), so the gradient is the same bits run to run. It accumulates in double: the sum runs
// over up to N*D*H*W/VEC partials per channel, and double keeps the reduction's rounding far below the
// tolerance the tests allow for float (the adds are few; the kernel is bound by memory latency, not FP64).
//
// The partials are viewed [K / R, C, R]: contiguous [N, C, R], or channels_last [P, C] as R = 1. A block sums
// one range of K (the per-channel count) for TC neighbouring channels: thread t owns channel t % TC and row
// lane t / TC of J, so with R = 1 a block reads TC * J consecutive floats per step (coalesced when TC is wide), and
// with R > 1 (TC = 1) consecutive threads read consecutive r. Its J lane sums are then folded by a fixed tree.
constexpr int kSumThreads = 256;
constexpr int64_t kSumPerBlock = 8192;  // partials per block: enough to hide latency, blocks enough to fill the GPU
constexpr int64_t kSumMaxSplits = 256;  // bounds the second pass to one block per channel tile

struct ChannelSumShape {
  int TC, J;                      // channels per block, row lanes per channel (a power of two)
  int64_t tiles, splits, chunk;   // channel tiles, ranges of K, and K per range
};

// Loads per thread that one pass of channel_range_sums issues together (then adds in order).
constexpr int kSumBatch = 8;

ChannelSumShape channel_sum_shape(int64_t C, int64_t R, int64_t K, int64_t max_splits) {
  ChannelSumShape s;
  s.TC = R == 1 ? static_cast<int>(std::min<int64_t>(C, kSumThreads)) : 1;
  // Few partials per channel (block partials, up to two batches per lane): narrower channel tiles, so that more
  // lanes share a channel and one pass needs a batch or two of loads per thread (a memory latency each), at the
  // price of loads narrower than a 32-byte sector. With more partials the wide tiles and ranges of K stay.
  constexpr int64_t kBatchValues = static_cast<int64_t>(kSumBatch) * kSumThreads;
  if (R == 1 && K <= 2 * kBatchValues) {
    while (s.TC > 1 && K * s.TC > kBatchValues) s.TC /= 2;
  }
  s.J = 1;
  while (s.J * 2 * s.TC <= kSumThreads) s.J *= 2;
  s.tiles = (C + s.TC - 1) / s.TC;
  s.chunk = std::max<int64_t>(std::max<int64_t>(kSumPerBlock / s.TC, s.J), (K + max_splits - 1) / max_splits);
  s.splits = (K + s.chunk - 1) / s.chunk;
  return s;
}

// One block's share: the sums over range `range` of K for channel tile `tile`, left in lanes[threadIdx.x] of the
// threads with j == 0 and c < C (each reads only its own slot, so calls may follow each other without a barrier).
// Every thread of the block calls it. Loads bypass L1: the single-launch sum also reads values that other blocks of
// the same grid wrote.
template <typename in_t>
__device__ __forceinline__ void channel_range_sums(const in_t* __restrict__ src, int64_t C, int64_t R, int64_t K,
                                                   int64_t chunk, int TC, int J, int64_t tile, int64_t range,
                                                   double* lanes, int64_t& c, int& j) {
  const int t = threadIdx.x;
  const int tc = t % TC;
  j = t / TC;  // j >= J: an idle thread (kSumThreads not a multiple of TC)
  c = tile * TC + tc;
  double acc = 0;
  if (j < J && c < C) {
    const int64_t k_begin = range * chunk;
    const int64_t k_end = K - k_begin < chunk ? K : k_begin + chunk;
    int64_t k = k_begin + j;
    // (n, r) of k, stepped by J without a division per element.
    int64_t n = k / R, r = k - n * R;
    const int64_t dn = J / R, dr = J % R;
    // kSumBatch loads issued before their adds (one memory latency per batch, not per load); added in k order.
    while (k < k_end) {
      double v[kSumBatch];
#pragma unroll
      for (int u = 0; u < kSumBatch; ++u) {
        v[u] = k + u * static_cast<int64_t>(J) < k_end ? static_cast<double>(__ldcg(src + (n * C + c) * R + r)) : 0.0;
        n += dn;
        r += dr;
        if (r >= R) {
          r -= R;
          ++n;
        }
      }
#pragma unroll
      for (int u = 0; u < kSumBatch; ++u) {
        if (k < k_end) acc += v[u];
        k += J;
      }
    }
  }
  lanes[t] = acc;
  __syncthreads();
  for (int s = J / 2; s > 0; s >>= 1) {  // J is uniform, so every thread reaches each barrier
    if (j < s) lanes[t] += lanes[t + s * TC];
    __syncthreads();
  }
}

// A 16-bit result goes through float, as .to(dtype) of the float sum would round it; mid-pass sums stay double.
template <typename out_t>
__device__ __forceinline__ out_t sum_result(double v) {
  if constexpr (std::is_same_v<out_t, double>) {
    return v;
  } else {
    return static_cast<out_t>(static_cast<float>(v));
  }
}

// grid (tiles, splits, operands); dst is [splits, C] per operand. blockIdx.z picks the multiplier (0) or bias (1)
// partials, so both are reduced in one launch.
template <typename in_t, typename out_t>
__global__ void __launch_bounds__(kSumThreads) channel_partials_sum_kernel(
    const in_t* __restrict__ src0, const in_t* __restrict__ src1, out_t* __restrict__ dst0,
    out_t* __restrict__ dst1, int64_t C, int64_t R, int64_t K, int64_t chunk, int TC, int J) {
  __shared__ double lanes[kSumThreads];
  wait_for_prior_grid();
  allow_dependent_launch();
  int64_t c;
  int j;
  channel_range_sums(blockIdx.z == 0 ? src0 : src1, C, R, K, chunk, TC, J, blockIdx.x, blockIdx.y, lanes, c, j);
  out_t* __restrict__ dst = blockIdx.z == 0 ? dst0 : dst1;
  if (j == 0 && c < C) dst[static_cast<int64_t>(blockIdx.y) * C + c] = sum_result<out_t>(lanes[threadIdx.x]);
}

// The single-launch form (the default where the sum would otherwise take two passes): the same per-range sums go
// to mid, [operands, splits, C] doubles; the block counted last then sums mid over the ranges, in a fixed order
// whichever block that is, into the results.
// This replaced a second launch that, like the first, was latency-bound: on the H200 the two took 8.0-8.8 us per
// channels_last call (the contiguous layout's single pass 3.1-4.8 us) against main kernels of 46-91 us. The
// counter is zeroed by the main backward kernel, which completes before this grid reads it. All fences here are
// in this small kernel; in the main kernel they cost up to a fifth of its time (docs/notes.md).
template <typename out_t>
__global__ void __launch_bounds__(kSumThreads) channel_partials_fold_kernel(
    const float* __restrict__ src0, const float* __restrict__ src1, double* __restrict__ mid,
    out_t* __restrict__ dst0, out_t* __restrict__ dst1, unsigned int* counter, int64_t C, int64_t R, int64_t K,
    int64_t chunk, int TC, int J, int TC_fold, int J_fold) {
  __shared__ double lanes[kSumThreads];
  __shared__ bool last;
  wait_for_prior_grid();
  allow_dependent_launch();
  int64_t c;
  int j;
  channel_range_sums(blockIdx.z == 0 ? src0 : src1, C, R, K, chunk, TC, J, blockIdx.x, blockIdx.y, lanes, c, j);
  const int64_t splits = gridDim.y;
  if (j == 0 && c < C) mid[(blockIdx.z * splits + blockIdx.y) * C + c] = lanes[threadIdx.x];
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned int blocks = gridDim.x * gridDim.y * gridDim.z;
    last = atomicAdd(counter, 1u) == blocks - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  // mid[z] viewed [splits, C] (R = 1), summed over its one range of all splits, channel tile by tile.
  for (unsigned z = 0; z < gridDim.z; ++z) {
    out_t* dst = z == 0 ? dst0 : dst1;
    for (int64_t tile = 0; tile * TC_fold < C; ++tile) {
      channel_range_sums(mid + z * splits * C, C, 1, splits, splits, TC_fold, J_fold, tile, 0, lanes, c, j);
      if (j == 0 && c < C) dst[c] = sum_result<out_t>(lanes[threadIdx.x]);
    }
  }
}

template <typename in_t, typename out_t>
void launch_channel_sum(const in_t* src0, const in_t* src1, out_t* dst0, out_t* dst1, int64_t C, int64_t R,
                        int64_t K, const ChannelSumShape& s, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(s.tiles), static_cast<unsigned>(s.splits), dst1 != nullptr ? 2u : 1u);
  launch_dependent(channel_partials_sum_kernel<in_t, out_t>, grid, dim3(kSumThreads), 0, stream, src0, src1, dst0,
                   dst1, C, R, K, s.chunk, s.TC, s.J);
}

// The single-launch sum's shape: `first` (the first pass's channel tiles and lanes) with ranges of K chosen so
// that a thread's loads in the first step (its range) and in the last block's fold (over the ranges, with the
// second pass's shape) are about equal, both on the critical path. Fold it only while the last block's share stays
// small (splits * C bounded); otherwise the two-pass form.
constexpr int64_t kFoldMaxValues = 16384;

// The last block's shape: one block, so the widest channel tiles (the narrowing for few partials would only add
// tile steps to its loop); its tiles and lanes do not depend on the splits.
ChannelSumShape fold_last_shape(int64_t C) { return channel_sum_shape(C, 1, 1, 1); }

std::optional<ChannelSumShape> fold_sum_shape(ChannelSumShape s, int64_t C, int64_t K) {
  const ChannelSumShape last = fold_last_shape(C);
  int64_t best_cost = -1;
  for (int64_t sp = 1; sp <= std::min<int64_t>(kSumMaxSplits, K); ++sp) {
    if (sp * C > kFoldMaxValues) break;
    const int64_t chunk = (K + sp - 1) / sp;
    const int64_t cost = (chunk + s.J - 1) / s.J + last.tiles * ((sp + last.J - 1) / last.J);
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      s.chunk = chunk;
    }
  }
  if (best_cost < 0) return std::nullopt;
  s.splits = (K + s.chunk - 1) / s.chunk;
  return s;
}

// TORCH_FUSED_OPS_BWD_FOLD=0 keeps the two-pass sum (read once per process). The two forms add in different orders,
// so the multiplier and bias gradients may differ in their last bits between the settings; each is deterministic.
bool backward_fold_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("TORCH_FUSED_OPS_BWD_FOLD");
    return !(e != nullptr && std::string(e) == "0");
  }();
  return on;
}

// How the per-channel sum of a backward's partials (float, viewed [K / R, C, R]) runs: the shape of its first
// pass, which is all when one range per channel suffices (block partials at the default size, both layouts), and,
// where it would take two passes, the single-launch form's shape and scratch ([operands, splits, C] double sums,
// then the block counter). Made before the main kernel launches, because that kernel zeroes the counter.
struct ChannelSumPlan {
  int64_t C = 0, R = 0, K = 0;
  ChannelSumShape first{};
  std::optional<ChannelSumShape> fold;
  at::Tensor scratch;
  double* mid = nullptr;
  unsigned int* counter = nullptr;
};

ChannelSumPlan plan_channel_sum(int64_t C, int64_t R, int64_t parts, int operands, const at::TensorOptions& opts) {
  ChannelSumPlan p;
  p.C = C, p.R = R, p.K = C > 0 && R > 0 ? parts / C : 0;
  if (p.K == 0) return p;
  p.first = channel_sum_shape(C, R, p.K, kSumMaxSplits);
  // Only where the sum would otherwise take two passes (per-pack partials, or very large inputs): on the H200
  // (docs/notes.md, call 4 of 2026-11-29's last session) the fold kernel took 6.1-7.9 us against 7.7-8.8 us for
  // two passes, but 4.7-5.1 us against 3.1-4.6 us where a single pass sufficed.
  if (backward_fold_enabled() && p.first.splits > 1) p.fold = fold_sum_shape(p.first, C, p.K);
  if (p.fold) {
    const int64_t mid_bytes = operands * p.fold->splits * C * 8;
    p.scratch = at::empty({mid_bytes + 8}, opts.dtype(at::kByte));
    uint8_t* base = p.scratch.mutable_data_ptr<uint8_t>();
    p.mid = reinterpret_cast<double*>(base);
    p.counter = reinterpret_cast<unsigned int*>(base + mid_bytes);
  }
  return p;
}

// Per-channel sums of the partials `part` (and `part_bias` when defined), as planned, in the type `out`: float, or
// the 16-bit dtype of the gradient they become, so that no cast kernel follows. The results take the shapes `sizes`
// and `sizes_bias` (C elements each: the parameter's own shape, so that no reshape follows on the host).
std::pair<at::Tensor, at::Tensor> sum_channel_partials(const ChannelSumPlan& plan, const at::Tensor& part,
                                                       const at::Tensor& part_bias, at::ScalarType out,
                                                       at::IntArrayRef sizes, at::IntArrayRef sizes_bias,
                                                       cudaStream_t stream) {
  const auto opts = part.options().dtype(out);
  const bool two = part_bias.defined();
  const int64_t C = plan.C, R = plan.R, K = plan.K;
  if (K == 0) return {at::zeros(sizes, opts), two ? at::zeros(sizes_bias, opts) : at::Tensor()};
  at::Tensor result = at::empty(sizes, opts), result_bias = two ? at::empty(sizes_bias, opts) : at::Tensor();
  const float* s0 = part.const_data_ptr<float>();
  const float* s1 = two ? part_bias.const_data_ptr<float>() : nullptr;
  const ChannelSumShape& first = plan.first;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out, "fused_post_pool_channel_sum", [&] {
    scalar_t* d0 = result.mutable_data_ptr<scalar_t>();
    scalar_t* d1 = two ? result_bias.mutable_data_ptr<scalar_t>() : nullptr;
    if (plan.fold) {
      const ChannelSumShape& f = *plan.fold;
      const ChannelSumShape last = fold_last_shape(C);
      const dim3 grid(static_cast<unsigned>(f.tiles), static_cast<unsigned>(f.splits), two ? 2u : 1u);
      launch_dependent(channel_partials_fold_kernel<scalar_t>, grid, dim3(kSumThreads), 0, stream, s0, s1, plan.mid,
                       d0, d1, plan.counter, C, R, K, f.chunk, f.TC, f.J, last.TC, last.J);
    } else if (first.splits == 1) {
      launch_channel_sum<float, scalar_t>(s0, s1, d0, d1, C, R, K, first, stream);
    } else {
      at::Tensor mid = at::empty({two ? 2 : 1, first.splits, C}, part.options().dtype(at::kDouble));
      double* m0 = mid.mutable_data_ptr<double>();
      double* m1 = two ? m0 + first.splits * C : nullptr;
      launch_channel_sum<float, double>(s0, s1, m0, m1, C, R, K, first, stream);
      const ChannelSumShape second = channel_sum_shape(C, 1, first.splits, 1);
      launch_channel_sum<double, scalar_t>(m0, m1, d0, d1, C, 1, first.splits, second, stream);
    }
  });
  return {result, result_bias};
}

// Packs per thread of the channels_last backward (1, 2, 4 or 8); more packs, fewer block partials. Default: the
// fastest device time per call in benchmarks/post_pool_bwd_sweep.py on the H200 (2026-11-29, [16, 32, 32, 64, 64],
// with the one-pass sum of block partials): float32 8 (94.7 us against 97.7 / 105.4 / 102.4 for 1 / 2 / 4),
// 16-bit types 2 (bfloat16 51.5 us against 55.8 / 56.4 / 53.6 for 1 / 4 / 8).
// TORCH_FUSED_OPS_CL_BWD_ITEMS overrides it for the sweep, read once per process; the value changes the order of
// the (float) partial sums, so a given setting always gives the same bits.
int cl_backward_items(size_t element_size) {
  static const int forced = [] {
    const char* e = std::getenv("TORCH_FUSED_OPS_CL_BWD_ITEMS");
    const int v = e != nullptr ? std::atoi(e) : 0;
    return v == 1 || v == 2 || v == 4 || v == 8 ? v : 0;
  }();
  return forced != 0 ? forced : element_size >= 4 ? 8 : 2;
}

// Launches the backward fast path when geometry and alignment allow; returns the per-channel sums of the
// multiplier and bias partials (bias: undefined without one), or nothing when the general path must run.
template <typename scalar_t>
std::optional<std::pair<at::Tensor, at::Tensor>> launch_backward_tiled2(
    const PoolGeometry& g, bool channels_last, const at::Tensor& go, const at::Tensor& sel, const at::Tensor& off,
    const at::Tensor& mflat, double s1, double s2, const at::Tensor& grad_input, const at::Tensor& bias,
    at::IntArrayRef multiplier_sizes, at::IntArrayRef bias_sizes, cudaStream_t stream) {
  using acc_t = at::opmath_type<scalar_t>;
  if constexpr (!std::is_same_v<acc_t, float>) {
    return std::nullopt;  // double: the general kernels
  } else {
  if (off.scalar_type() != at::kByte) return std::nullopt;
  if (!(g.exact_tiling && g.kd == 2 && g.kh == 2 && g.kw == 2 && g.D == 2 * g.OD && g.H == 2 * g.OH &&
        g.W == 2 * g.OW)) {
    return std::nullopt;
  }
  for (const at::Tensor* t : {&go, &sel, &grad_input}) {
    if (reinterpret_cast<uintptr_t>(t->const_data_ptr()) % 16 != 0) return std::nullopt;
  }
  constexpr int VEC_NC = vec_outputs<scalar_t>(), VEC_CL = 2 * vec_outputs<scalar_t>();
  const int vec = channels_last ? VEC_CL : VEC_NC;
  if (channels_last ? g.C % vec != 0 : g.OW % vec != 0) return std::nullopt;
  if (reinterpret_cast<uintptr_t>(off.const_data_ptr()) % vec != 0) return std::nullopt;
  const int64_t total = g.output_numel() / vec;
  const int64_t plane = g.OD * g.OH * (g.OW / vec);  // packs per (n, c) plane, contiguous layout
  const int64_t Cv = g.C / vec;
  // contiguous: block partials when each block's packs lie in one channel plane, else warp partials when each
  // warp's do. channels_last: block partials when each thread's packs share their channels.
  const bool warp = channels_last ? kThreads % Cv == 0 : plane % 32 == 0;
  const bool nc_block = !channels_last && plane % kThreads == 0;
  const int items = channels_last && warp ? cl_backward_items(sizeof(scalar_t)) : 1;
  const int64_t blocks = (total + kThreads * items - 1) / (kThreads * items);
  const auto acc_opts = go.options().dtype(at::toOpMathType(go.scalar_type())).memory_format(at::MemoryFormat::Contiguous);
  // Partials: contiguous [N, C, R] (R per plane); channels_last [blocks, C] (block partials) or [total, vec].
  const int64_t parts = channels_last ? (warp ? blocks * g.C : total * vec)
                                      : (nc_block ? total / kThreads : warp ? total / 32 : total);
  at::Tensor contrib = at::empty({parts}, acc_opts);
  at::Tensor contrib_bias = bias.defined() ? at::empty_like(contrib) : at::Tensor();
  // The partials viewed [K / R, C, R] for the per-channel sum (see channel_partials_sum_kernel).
  const int64_t R = channels_last ? 1 : (g.N * g.C > 0 ? parts / (g.N * g.C) : 0);
  const ChannelSumPlan plan = plan_channel_sum(g.C, R, parts, bias.defined() ? 2 : 1, go.options());
  BwdArgs<scalar_t> a{go.const_data_ptr<scalar_t>(), sel.const_data_ptr<scalar_t>(), off.const_data_ptr<uint8_t>(),
                      mflat.const_data_ptr<scalar_t>(), bias.defined() ? bias.const_data_ptr<scalar_t>() : nullptr,
                      grad_input.mutable_data_ptr<scalar_t>(), contrib.mutable_data_ptr<acc_t>(),
                      contrib_bias.defined() ? contrib_bias.mutable_data_ptr<acc_t>() : nullptr,
                      mflat.numel() != 1, static_cast<acc_t>(s1), static_cast<acc_t>(s2), plan.counter};
  const bool small = g.input_numel() < (int64_t(1) << 31);
  auto go_launch = [&](auto idx) {
    using index_t = decltype(idx);
    if (channels_last) {
      const dim3 grid(static_cast<unsigned>(blocks));
      auto k = !warp       ? post_pool_backward_tiled2_ndhwc_kernel<scalar_t, index_t, 1, false>
               : items == 1 ? post_pool_backward_tiled2_ndhwc_kernel<scalar_t, index_t, 1, true>
               : items == 2 ? post_pool_backward_tiled2_ndhwc_kernel<scalar_t, index_t, 2, true>
               : items == 4 ? post_pool_backward_tiled2_ndhwc_kernel<scalar_t, index_t, 4, true>
                            : post_pool_backward_tiled2_ndhwc_kernel<scalar_t, index_t, 8, true>;
      launch_dependent(k, grid, dim3(kThreads), 0, stream, a, static_cast<index_t>(total),
                       static_cast<index_t>(Cv), static_cast<index_t>(g.C), static_cast<index_t>(g.OW),
                       static_cast<index_t>(g.OH));
    } else {
      const dim3 grid(static_cast<unsigned>((total + kThreads - 1) / kThreads));
      auto k = nc_block ? post_pool_backward_tiled2_ncdhw_kernel<scalar_t, index_t, Partials::kBlock>
               : warp   ? post_pool_backward_tiled2_ncdhw_kernel<scalar_t, index_t, Partials::kWarp>
                        : post_pool_backward_tiled2_ncdhw_kernel<scalar_t, index_t, Partials::kPack>;
      launch_dependent(k, grid, dim3(kThreads), 0, stream, a, static_cast<index_t>(total),
                       static_cast<index_t>(g.OW / vec), static_cast<index_t>(g.OH),
                       static_cast<index_t>(g.OD * g.OH), static_cast<index_t>(g.C), static_cast<index_t>(g.W),
                       static_cast<index_t>(g.H * g.W));
    }
  };
  small ? go_launch(int32_t{}) : go_launch(int64_t{});
  // Per-channel multiplier gradients come out in the gradient's dtype (no cast kernel after); a one-element
  // multiplier sums them further, so it takes float.
  const at::ScalarType out = mflat.numel() == 1 ? at::kFloat : go.scalar_type();
  const std::vector<int64_t> per_channel{g.C};
  const at::IntArrayRef m_sizes = mflat.numel() == 1 ? at::IntArrayRef(per_channel) : multiplier_sizes;
  const at::IntArrayRef b_sizes = bias.defined() ? bias_sizes : at::IntArrayRef(per_channel);
  return sum_channel_partials(plan, contrib, contrib_bias, out, m_sizes, b_sizes, stream);
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
  const scalar_t* bp = f.bias.defined() ? f.bias.const_data_ptr<scalar_t>() : nullptr;
  if (launch_forward_tiled2<scalar_t, off_t, SAVE>(f, out, sel, off, stream)) return;
  const bool k2 = g.exact_tiling && g.kd == 2 && g.kh == 2 && g.kw == 2;
  const dim3 grid(static_cast<unsigned>(num_blocks(g.output_numel())));
  if (g.channels_last) {
    if (k2) {
      post_pool_forward_kernel<scalar_t, off_t, true, 2, SAVE><<<grid, kThreads, 0, stream>>>(x, m, ms, g, st, s1, s2, o, sp, op, bp);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    } else {
      post_pool_forward_kernel<scalar_t, off_t, true, 0, SAVE><<<grid, kThreads, 0, stream>>>(x, m, ms, g, st, s1, s2, o, sp, op, bp);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  } else {
    if (k2) {
      post_pool_forward_kernel<scalar_t, off_t, false, 2, SAVE><<<grid, kThreads, 0, stream>>>(x, m, ms, g, st, s1, s2, o, sp, op, bp);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    } else {
      post_pool_forward_kernel<scalar_t, off_t, false, 0, SAVE><<<grid, kThreads, 0, stream>>>(x, m, ms, g, st, s1, s2, o, sp, op, bp);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> forward_cuda(const char* op, bool save, const at::Tensor& input,
                                                            const at::Tensor& multiplier, double negative_slope,
                                                            at::IntArrayRef kernel_size, at::IntArrayRef stride,
                                                            at::IntArrayRef padding, at::IntArrayRef dilation,
                                                            bool ceil_mode, std::optional<double> negative_slope2,
                                                            const std::optional<at::Tensor>& bias = std::nullopt) {
  // The shared checks first: they name a device mismatch between input and multiplier.
  const ForwardInputs f = prepare_forward(op, input, multiplier, kernel_size, stride, padding, dilation, ceil_mode,
                                          negative_slope, negative_slope2, bias);
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

at::Tensor post_pool_bias_cuda(const at::Tensor& input, const at::Tensor& bias, const at::Tensor& multiplier,
                               double negative_slope, at::IntArrayRef kernel_size, at::IntArrayRef stride,
                               at::IntArrayRef padding, at::IntArrayRef dilation, bool ceil_mode,
                               std::optional<double> negative_slope2) {
  return std::get<0>(forward_cuda("fused::post_pool_bias", false, input, multiplier, negative_slope, kernel_size,
                                  stride, padding, dilation, ceil_mode, negative_slope2, bias));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> post_pool_bias_with_offsets_cuda(
    const at::Tensor& input, const at::Tensor& bias, const at::Tensor& multiplier, double negative_slope,
    at::IntArrayRef kernel_size, at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
    bool ceil_mode, std::optional<double> negative_slope2) {
  return forward_cuda("fused::post_pool_bias_with_offsets", true, input, multiplier, negative_slope, kernel_size,
                      stride, padding, dilation, ceil_mode, negative_slope2, bias);
}

template <typename scalar_t, typename off_t, bool CL>
void launch_backward(const PoolGeometry& g, const at::Tensor& go, const at::Tensor& sel, const at::Tensor& off,
                     const at::Tensor& mflat, double s1d, double s2d, const at::Tensor& grad_input,
                     const at::Tensor& contrib, const at::Tensor& bias, const at::Tensor& contrib_bias,
                     cudaStream_t stream) {
  using acc_t = at::opmath_type<scalar_t>;
  const acc_t s1 = static_cast<acc_t>(s1d), s2 = static_cast<acc_t>(s2d);
  const scalar_t* gop = go.const_data_ptr<scalar_t>();
  const scalar_t* sp = sel.const_data_ptr<scalar_t>();
  const off_t* op = off.const_data_ptr<off_t>();
  const scalar_t* mp = mflat.const_data_ptr<scalar_t>();
  const int64_t ms = mflat.numel() == 1 ? 0 : 1;
  scalar_t* gi = grad_input.mutable_data_ptr<scalar_t>();
  const scalar_t* bp = bias.defined() ? bias.const_data_ptr<scalar_t>() : nullptr;
  acc_t* cb = contrib_bias.defined() ? contrib_bias.mutable_data_ptr<acc_t>() : nullptr;
  const dim3 grid_out(static_cast<unsigned>(num_blocks(g.output_numel())));
  if (g.exact_tiling && g.kd == 2 && g.kh == 2 && g.kw == 2) {
    if (g.OD * 2 != g.D || g.OH * 2 != g.H || g.OW * 2 != g.W) {
      grad_input.zero_();  // elements past the last window get no gradient
    }
    post_pool_backward_tiled2_kernel<scalar_t, off_t, CL><<<grid_out, kThreads, 0, stream>>>(
        gop, sp, op, mp, ms, g, input_strides(g), s1, s2, gi, contrib.mutable_data_ptr<acc_t>(), bp, cb);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  const dim3 grid_in(static_cast<unsigned>(num_blocks(g.input_numel())));
  post_pool_grad_input_kernel<scalar_t, off_t, CL, 0><<<grid_in, kThreads, 0, stream>>>(gop, sp, op, mp, ms, g, s1, s2, gi, bp);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  post_pool_grad_multiplier_kernel<scalar_t, off_t, CL><<<grid_out, kThreads, 0, stream>>>(
      gop, sp, op, mp, ms, g, s1, s2, contrib.mutable_data_ptr<acc_t>(), bp, cb);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Shared by post_pool_backward and post_pool_bias_backward; grad_bias is undefined without a bias.
std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_cuda(
    const char* op, const at::Tensor& grad_output, const at::Tensor& selected, const at::Tensor& offsets,
    const at::Tensor* bias, const at::Tensor& multiplier, double negative_slope,
    std::optional<double> negative_slope2, at::IntArrayRef input_size, at::IntArrayRef kernel_size,
    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, bool channels_last) {
  const PoolGeometry g = check_post_pool_backward_args(grad_output, selected, offsets, multiplier, input_size,
                                                       kernel_size, stride, padding, dilation, channels_last);
  if (bias != nullptr) check_bias(op, *bias, g.C, grad_output.scalar_type(), grad_output.device());
  check_slopes(op, grad_output.scalar_type(), negative_slope, negative_slope2);
  TORCH_CHECK_VALUE(grad_output.is_cuda(), op, ": CUDA kernel called with grad_output on device ",
                    grad_output.device());
  const c10::cuda::OptionalCUDAGuard guard(grad_output.device());
  const auto fmt = channels_last ? at::MemoryFormat::ChannelsLast3d : at::MemoryFormat::Contiguous;
  const double s1 = negative_slope, s2 = negative_slope2.value_or(negative_slope);
  at::Tensor grad_input = at::empty(input_size, grad_output.options().memory_format(fmt));
  const auto acc_dtype = at::toOpMathType(grad_output.scalar_type());
  const auto acc_opts = grad_output.options().dtype(acc_dtype).memory_format(fmt);
  // The general kernels' full-size partials, allocated only once the fast path (which needs neither) declines:
  // up front they cost 33.5-67 MB of transient peak per call at the default size.
  at::Tensor contrib, contrib_bias;
  auto alloc_partials = [&] {
    contrib = at::empty(grad_output.sizes(), acc_opts);
    if (bias != nullptr) contrib_bias = at::empty(grad_output.sizes(), acc_opts);
  };
  const at::Tensor bflat = bias != nullptr ? bias->contiguous() : at::Tensor();
  if (!g.empty()) {
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    const at::Tensor go = grad_output.contiguous(fmt), sel = selected.contiguous(fmt), off = offsets.contiguous(fmt);
    const at::Tensor mflat = flat_multiplier(multiplier);
    std::optional<std::pair<at::Tensor, at::Tensor>> fast;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad_output.scalar_type(), "fused_post_pool_bwd_fast", [&] {
      fast = launch_backward_tiled2<scalar_t>(g, channels_last, go, sel, off, mflat, s1, s2, grad_input, bflat,
                                              multiplier.sizes(), bias != nullptr ? bias->sizes() : at::IntArrayRef(),
                                              stream);
    });
    if (fast) {
      // Per-channel sums come back in the parameter's shape and dtype; a one-element multiplier sums them further.
      auto finish = [&](const at::Tensor& per_channel, const at::Tensor& like) {
        if (like.numel() != 1 && per_channel.scalar_type() == like.scalar_type()) return per_channel;
        // A one-element multiplier's float sums (and, beside it, the bias's): summed further and cast here.
        at::Tensor total = like.numel() == 1 ? per_channel.sum() : per_channel;
        return total.reshape(like.sizes()).to(like.scalar_type()).contiguous();
      };
      at::Tensor grad_bias = bias != nullptr ? finish(fast->second, *bias) : at::Tensor();
      return {grad_input, grad_bias, finish(fast->first, multiplier)};
    }
    alloc_partials();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad_output.scalar_type(), "fused_post_pool_bwd_cuda", [&] {
      auto run = [&](auto off_tag) {
        using off_t = decltype(off_tag);
        if (channels_last) {
          launch_backward<scalar_t, off_t, true>(g, go, sel, off, mflat, s1, s2, grad_input, contrib, bflat,
                                                 contrib_bias, stream);
        } else {
          launch_backward<scalar_t, off_t, false>(g, go, sel, off, mflat, s1, s2, grad_input, contrib, bflat,
                                                  contrib_bias, stream);
        }
      };
      if (off.scalar_type() == at::kByte) {
        run(uint8_t{});
      } else {
        run(int32_t{});
      }
    });
  } else {
    alloc_partials();
    if (contrib_bias.defined()) contrib_bias.zero_();
  }
  at::Tensor grad_bias = bias != nullptr ? reduce_grad_multiplier(contrib_bias, *bias) : at::Tensor();
  return {grad_input, grad_bias, reduce_grad_multiplier(contrib, multiplier)};
}

std::tuple<at::Tensor, at::Tensor> post_pool_backward_cuda(
    const at::Tensor& grad_output, const at::Tensor& selected, const at::Tensor& offsets,
    const at::Tensor& multiplier, double negative_slope, std::optional<double> negative_slope2,
    at::IntArrayRef input_size, at::IntArrayRef kernel_size, at::IntArrayRef stride, at::IntArrayRef padding,
    at::IntArrayRef dilation, bool channels_last) {
  auto r = backward_cuda("fused::post_pool_backward", grad_output, selected, offsets, nullptr, multiplier,
                         negative_slope, negative_slope2, input_size, kernel_size, stride, padding, dilation,
                         channels_last);
  return {std::get<0>(r), std::get<2>(r)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> post_pool_bias_backward_cuda(
    const at::Tensor& grad_output, const at::Tensor& selected, const at::Tensor& offsets, const at::Tensor& bias,
    const at::Tensor& multiplier, double negative_slope, std::optional<double> negative_slope2,
    at::IntArrayRef input_size, at::IntArrayRef kernel_size, at::IntArrayRef stride, at::IntArrayRef padding,
    at::IntArrayRef dilation, bool channels_last) {
  return backward_cuda("fused::post_pool_bias_backward", grad_output, selected, offsets, &bias, multiplier,
                       negative_slope, negative_slope2, input_size, kernel_size, stride, padding, dilation,
                       channels_last);
}

}  // namespace
}  // namespace fused

TORCH_LIBRARY_IMPL(fused, CUDA, m) {
  m.impl("post_pool", &fused::post_pool_cuda);
  m.impl("post_pool_with_offsets", &fused::post_pool_with_offsets_cuda);
  m.impl("post_pool_backward", &fused::post_pool_backward_cuda);
  m.impl("post_pool_bias", &fused::post_pool_bias_cuda);
  m.impl("post_pool_bias_with_offsets", &fused::post_pool_bias_with_offsets_cuda);
  m.impl("post_pool_bias_backward", &fused::post_pool_bias_backward_cuda);
}
