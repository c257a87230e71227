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
  static int major[64] = {};  // compute capability major per device ordinal, 0 = not yet asked
  if (device < 0 || device >= 64) return false;
  if (major[device] == 0) {
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&major[device], cudaDevAttrComputeCapabilityMajor, device));
  }
  return major[device] >= 9;
}

// Launches kernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent launch where enabled.
// Only kernels that call wait_for_prior_grid() before their first global memory access may go through here.
template <typename... KernelArgs, typename... Args>
void launch_dependent(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                      Args&&... args) {
  if (!pdl_enabled()) {
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
  __device__ void init() {
    value = -std::numeric_limits<acc_t>::infinity();
    input = scalar_t(0);
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
      best.init();
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
    for (int j = 0; j < VEC; ++j) best[j].init();
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
    const bool monotone = f.s1 > 0 && f.s2 > 0 && std::isfinite(f.s1) && std::isfinite(f.s2);
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
// in the kernel, deterministically: each thread sums its VEC outputs in order, then, where a warp's 32 packs are
// known to share channels (WARP), a fixed xor-butterfly reduces over the warp and one lane writes the result;
// the host sums the partials in a fixed order. No atomics, so the gradient is the same bits run to run.

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
  // In-kernel fold of the partials into the per-channel results (see fold_partials); counters == nullptr leaves
  // the partials to the sum kernels launched after.
  unsigned int* counters;  // [groups + 1], zeroed before the launch
  double* group_sums;      // [operands, groups, C]
  scalar_t* out_m;         // [C] multiplier gradient
  scalar_t* out_b;         // [C] bias gradient (null without a bias)
  int64_t groups;
  int64_t group_blocks;    // channels_last: blocks per group
  int64_t R;               // contiguous: warp partials per (n, c) plane
  int64_t parts;           // contiguous: warp partials in all
};

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

// ---- in-kernel fold of the per-channel partials -----------------------------------------------------------
// The partials used to be summed by one or two small kernels after the main one; on the H200 those took 3-9 us
// per call (latency-bound launches reading ~1 MB), up to a tenth of the whole backward. Instead, blocks are counted
// per group of partials as they finish: the block that completes a group sums that group's partials per channel
// (into double), and the block that completes the last group sums the groups into the results. Every sum runs in
// an order fixed by the shapes alone, whichever block happens to finish last, so the bits do not vary run to run.
// Groups: channels_last, `group_blocks` consecutive blocks' [C] rows; contiguous, one sample's [C, R] warp partials.

// Sums src[base + c * sc + k * sk] over k < K for each channel c < C in a fixed order (lane j of a channel takes
// k = j, j + J, ...; the J lane sums fold by a fixed tree) into dst[c]. Whole block. A 16-bit result goes through
// float, as the sum kernels and .to(dtype) of a float sum round it. The host bounds every group
// (C * K <= kFoldGroupValues), so the offsets from base fit 32 bits.
template <typename in_t, typename out_t>
__device__ void block_channel_sums(const in_t* src, int64_t base, int sc, int sk, int K, int C, double* lanes,
                                   out_t* dst) {
  const int TC = std::min(C, sc == 1 ? kThreads : 32);
  int J = 1;
  while (J * 2 * TC <= kThreads) J *= 2;
  const int t = threadIdx.x, tc = t % TC, j = t / TC;  // j >= J: idle
  const in_t* q = src + base;
  for (int c0 = 0; c0 < C; c0 += TC) {
    const int c = c0 + tc;
    double acc = 0;
    if (j < J && c < C) {
#pragma unroll 4
      for (int k = j; k < K; k += J) acc += static_cast<double>(__ldcg(q + c * sc + k * sk));
    }
    lanes[t] = acc;
    __syncthreads();
    for (int h = J / 2; h > 0; h >>= 1) {
      if (j < h) lanes[t] += lanes[t + h * TC];
      __syncthreads();
    }
    if (j == 0 && c < C) {
      if constexpr (std::is_same_v<out_t, double>) {
        dst[c] = lanes[tc];
      } else {
        dst[c] = static_cast<out_t>(static_cast<float>(lanes[tc]));
      }
    }
    __syncthreads();
  }
}

// Called by every thread of every block once its partials are written (only when folding: the struct's fields come
// by value, so the call passes registers rather than a copy of the arguments in local memory). Not inlined, so that
// its registers do not shape the main kernels' allocation: inlined, ptxas made the bfloat16 channels_last kernel
// spill.
template <typename acc_t, typename scalar_t, bool CL>
__device__ __noinline__ void fold_partials(unsigned int* counters, double* group_sums, const acc_t* contrib,
                                           const acc_t* contrib_bias, scalar_t* out_m, scalar_t* out_b,
                                           int64_t groups, int64_t group_blocks, int64_t R, int64_t parts,
                                           int64_t C) {
  __shared__ double lanes[kThreads];
  __shared__ bool last;
  const int64_t b = blockIdx.x;
  int64_t g_lo, g_hi;
  if constexpr (CL) {
    g_lo = g_hi = b / group_blocks;
  } else {  // this block's warps [8b, w_end) and the samples they lie in
    const int64_t CR = C * R, w_end = std::min<int64_t>(8 * b + kThreads / 32, parts);
    g_lo = 8 * b / CR;
    g_hi = (w_end - 1) / CR;
  }
  const int operands = contrib_bias != nullptr ? 2 : 1;
  __threadfence();  // this thread's partials are visible before the block is counted
  for (int64_t g = g_lo; g <= g_hi; ++g) {
    int64_t target, base;  // blocks in group g; where its partials start
    int sc, sk, K;         // channel and row strides from there, rows
    if constexpr (CL) {
      target = std::min<int64_t>(group_blocks, static_cast<int64_t>(gridDim.x) - g * group_blocks);
      base = g * group_blocks * C, sc = 1, sk = static_cast<int>(C), K = static_cast<int>(target);
    } else {
      const int64_t CR = C * R;
      target = (std::min<int64_t>((g + 1) * CR, parts) - 1) / 8 - g * CR / 8 + 1;
      base = g * CR, sc = static_cast<int>(R), sk = 1, K = static_cast<int>(R);
    }
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counters + g, 1u) == static_cast<unsigned int>(target - 1);
    __syncthreads();
    if (!last) continue;
    __threadfence();  // the group's other blocks' partials
    for (int op = 0; op < operands; ++op) {
      block_channel_sums(op == 0 ? contrib : contrib_bias, base, sc, sk, K, static_cast<int>(C), lanes,
                         group_sums + (op * groups + g) * C);
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counters + groups, 1u) == static_cast<unsigned int>(groups - 1);
    __syncthreads();
    if (!last) continue;
    __threadfence();
    for (int op = 0; op < operands; ++op) {
      block_channel_sums(group_sums + op * groups * C, 0, 1, static_cast<int>(C), static_cast<int>(groups),
                         static_cast<int>(C), lanes, op == 0 ? out_m : out_b);
    }
  }
}

template <typename scalar_t, bool CL>
__device__ __forceinline__ void maybe_fold_partials(const BwdArgs<scalar_t>& a, int64_t C) {
  if (a.counters != nullptr) {
    fold_partials<at::opmath_type<scalar_t>, scalar_t, CL>(a.counters, a.group_sums, a.contrib, a.contrib_bias,
                                                           a.out_m, a.out_b, a.groups, a.group_blocks, a.R,
                                                           a.parts, C);
  }
}

template <typename scalar_t, typename index_t, bool WARP>
__global__ void __launch_bounds__(kThreads, 8) post_pool_backward_tiled2_ncdhw_kernel(
    const BwdArgs<scalar_t> a, index_t total, index_t OWv, index_t OH, index_t ODOH, index_t C, index_t W,
    index_t plane) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int VEC = vec_outputs<scalar_t>();
  const index_t p = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  acc_t cm_sum = 0, cb_sum = 0;
  wait_for_prior_grid();
  allow_dependent_launch();
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
    if constexpr (!WARP) {
      a.contrib[p] = cm_sum;
      if (a.contrib_bias != nullptr) a.contrib_bias[p] = cb_sum;
    }
  }
  if constexpr (WARP) {  // all 32 packs of this warp exist and lie in one channel plane (host-checked)
    cm_sum = warp_sum_from(cm_sum, 1);
    cb_sum = warp_sum_from(cb_sum, 1);
    if ((threadIdx.x & 31) == 0 && p < total) {
      a.contrib[p / 32] = cm_sum;
      if (a.contrib_bias != nullptr) a.contrib_bias[p / 32] = cb_sum;
    }
    maybe_fold_partials<scalar_t, false>(a, static_cast<int64_t>(C));
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
    maybe_fold_partials<scalar_t, true>(a, static_cast<int64_t>(C));
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
// lane t / TC of J, so with R = 1 a block reads TC * J consecutive floats per step (coalesced), and with R > 1
// (TC = 1) consecutive threads read consecutive r. Its J lane sums are then folded by a fixed tree.
constexpr int kSumThreads = 256;
constexpr int64_t kSumPerBlock = 8192;  // partials per block: enough to hide latency, blocks enough to fill the GPU
constexpr int64_t kSumMaxSplits = 256;  // bounds the second pass to one block per channel tile

struct ChannelSumShape {
  int TC, J;                      // channels per block, row lanes per channel (a power of two)
  int64_t tiles, splits, chunk;   // channel tiles, ranges of K, and K per range
};

ChannelSumShape channel_sum_shape(int64_t C, int64_t R, int64_t K, int64_t max_splits) {
  ChannelSumShape s;
  s.TC = R == 1 ? static_cast<int>(std::min<int64_t>(C, kSumThreads)) : 1;
  s.J = 1;
  while (s.J * 2 * s.TC <= kSumThreads) s.J *= 2;
  s.tiles = (C + s.TC - 1) / s.TC;
  s.chunk = std::max<int64_t>(std::max<int64_t>(kSumPerBlock / s.TC, s.J), (K + max_splits - 1) / max_splits);
  s.splits = (K + s.chunk - 1) / s.chunk;
  return s;
}

// grid (tiles, splits, operands); dst is [splits, C] per operand. blockIdx.z picks the multiplier (0) or bias (1)
// partials, so both are reduced in one launch.
template <typename in_t, typename out_t>
__global__ void __launch_bounds__(kSumThreads) channel_partials_sum_kernel(
    const in_t* __restrict__ src0, const in_t* __restrict__ src1, out_t* __restrict__ dst0,
    out_t* __restrict__ dst1, int64_t C, int64_t R, int64_t K, int64_t chunk, int TC, int J) {
  __shared__ double lanes[kSumThreads];
  const in_t* __restrict__ src = blockIdx.z == 0 ? src0 : src1;
  wait_for_prior_grid();
  allow_dependent_launch();
  out_t* __restrict__ dst = blockIdx.z == 0 ? dst0 : dst1;
  const int t = threadIdx.x;
  const int tc = t % TC, j = t / TC;  // j >= J: an idle thread (kSumThreads not a multiple of TC)
  const int64_t c = static_cast<int64_t>(blockIdx.x) * TC + tc;
  double acc = 0;
  if (j < J && c < C) {
    const int64_t k_begin = static_cast<int64_t>(blockIdx.y) * chunk;
    const int64_t k_end = K - k_begin < chunk ? K : k_begin + chunk;
    int64_t k = k_begin + j;
    // (n, r) of k, stepped by J without a division per element.
    int64_t n = k / R, r = k - n * R;
    const int64_t dn = J / R, dr = J % R;
#pragma unroll 4
    for (; k < k_end; k += J) {
      acc += static_cast<double>(src[(n * C + c) * R + r]);
      n += dn;
      r += dr;
      if (r >= R) {
        r -= R;
        ++n;
      }
    }
  }
  lanes[t] = acc;
  __syncthreads();
  for (int s = J / 2; s > 0; s >>= 1) {  // J is uniform, so every thread reaches each barrier
    if (j < s) lanes[t] += lanes[t + s * TC];
    __syncthreads();
  }
  if (j == 0 && c < C) {
    // A 16-bit result goes through float, as .to(dtype) of the float sum would round it; mid-pass sums stay double.
    const double v = lanes[tc];
    if constexpr (std::is_same_v<out_t, double>) {
      dst[static_cast<int64_t>(blockIdx.y) * C + c] = v;
    } else {
      dst[static_cast<int64_t>(blockIdx.y) * C + c] = static_cast<out_t>(static_cast<float>(v));
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

// Per-channel sums ([C], of type `out`: float, or the 16-bit dtype of the gradient it becomes, so that no cast
// kernel follows) of float partials viewed [K / R, C, R], and of bias partials when defined. One launch when one
// range per channel suffices (the contiguous fast path at its usual sizes); otherwise a first launch writes double
// sums per range, [splits, C], and a second folds them.
// The results take the shapes `sizes` and `sizes_bias` (C elements each: the parameter's own shape, so that no
// reshape follows on the host).
std::pair<at::Tensor, at::Tensor> sum_channel_partials(const at::Tensor& part, const at::Tensor& part_bias,
                                                       int64_t C, int64_t R, at::ScalarType out,
                                                       at::IntArrayRef sizes, at::IntArrayRef sizes_bias,
                                                       cudaStream_t stream) {
  const auto opts = part.options().dtype(out);
  const bool two = part_bias.defined();
  const int64_t K = C > 0 && R > 0 ? part.numel() / C : 0;
  if (K == 0) return {at::zeros(sizes, opts), two ? at::zeros(sizes_bias, opts) : at::Tensor()};
  at::Tensor result = at::empty(sizes, opts), result_bias = two ? at::empty(sizes_bias, opts) : at::Tensor();
  const float* s0 = part.const_data_ptr<float>();
  const float* s1 = two ? part_bias.const_data_ptr<float>() : nullptr;
  const ChannelSumShape first = channel_sum_shape(C, R, K, kSumMaxSplits);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out, "fused_post_pool_channel_sum", [&] {
    scalar_t* d0 = result.mutable_data_ptr<scalar_t>();
    scalar_t* d1 = two ? result_bias.mutable_data_ptr<scalar_t>() : nullptr;
    if (first.splits == 1) {
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

// Packs per thread of the channels_last backward (1, 2, 4 or 8). Default: the fastest in
// benchmarks/post_pool_bwd_sweep.py on the H200 (2026-11-29, [16, 32, 32, 64, 64], kernels alone): float32 1 (97.4 us
// against 100.8 / 101.1 / 98.2 for 2 / 4 / 8), 16-bit types 2 (bfloat16 53.9 us against 55.5 / 59.6 / 56.7).
// TORCH_FUSED_OPS_CL_BWD_ITEMS overrides it for the sweep, read once per process; the value changes the order of
// the (float) partial sums, so a given setting always gives the same bits.
int cl_backward_items(size_t element_size) {
  static const int forced = [] {
    const char* e = std::getenv("TORCH_FUSED_OPS_CL_BWD_ITEMS");
    const int v = e != nullptr ? std::atoi(e) : 0;
    return v == 1 || v == 2 || v == 4 || v == 8 ? v : 0;
  }();
  return forced != 0 ? forced : element_size >= 4 ? 1 : 2;
}

// The in-kernel fold's limits: partials per group (summed by the block completing it) and group sums in all
// (summed by the block completing the last group), each ~32 loads per thread at most.
constexpr int64_t kFoldGroupValues = 8192;
constexpr int64_t kFoldFinalValues = 8192;

// TORCH_FUSED_OPS_BWD_FOLD=0 sums the partials with the separate kernels instead (read once per process). The two
// sum in different orders, so the multiplier and bias gradients may differ in their last bits between settings.
bool backward_fold_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("TORCH_FUSED_OPS_BWD_FOLD");
    return !(e != nullptr && std::string(e) == "0");
  }();
  return on;
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
  // contiguous: warp partials when each warp's 32 packs lie in one channel plane. channels_last: block partials
  // when each thread's packs share their channels.
  const bool warp = channels_last ? kThreads % Cv == 0 : plane % 32 == 0;
  const int items = channels_last && warp ? cl_backward_items(sizeof(scalar_t)) : 1;
  const int64_t blocks = (total + kThreads * items - 1) / (kThreads * items);
  const auto acc_opts = go.options().dtype(at::toOpMathType(go.scalar_type())).memory_format(at::MemoryFormat::Contiguous);
  // Partials: contiguous [N, C, R] (R per plane); channels_last [blocks, C] (block partials) or [total, vec].
  const int64_t parts = channels_last ? (warp ? blocks * g.C : total * vec) : (warp ? total / 32 : total);
  BwdArgs<scalar_t> a{go.const_data_ptr<scalar_t>(), sel.const_data_ptr<scalar_t>(), off.const_data_ptr<uint8_t>(),
                      mflat.const_data_ptr<scalar_t>(), bias.defined() ? bias.const_data_ptr<scalar_t>() : nullptr,
                      grad_input.mutable_data_ptr<scalar_t>(), nullptr, nullptr,
                      mflat.numel() != 1, static_cast<acc_t>(s1), static_cast<acc_t>(s2)};
  // The in-kernel fold (fold_partials) takes per-channel multipliers with warp or block partials, in groups small
  // enough for one block to sum quickly; otherwise the sum kernels run after the main one.
  const int64_t R_nc = !channels_last && warp && g.N * g.C > 0 ? parts / (g.N * g.C) : 0;
  int64_t groups = 0;
  if (backward_fold_enabled() && warp && mflat.numel() != 1 && g.C > 0) {
    if (channels_last) {
      // ~sqrt(blocks) blocks per group: the last group's sum and the final one, both on the kernel's tail, then
      // read about the same number of values.
      int64_t gb = 1;
      while (gb * gb < blocks) ++gb;
      a.group_blocks = std::max<int64_t>(1, std::min<int64_t>(gb, kFoldGroupValues / g.C));
      groups = (blocks + a.group_blocks - 1) / a.group_blocks;
    } else if (g.C * R_nc <= kFoldGroupValues) {
      groups = g.N;
    }
    if (groups * g.C > kFoldFinalValues) groups = 0;
  }
  const int operands = bias.defined() ? 2 : 1;
  at::Tensor contrib, contrib_bias, scratch, out_m, out_b;
  if (groups > 0) {
    // One allocation: [operands, groups, C] doubles, the float partials, then the counters (zeroed here).
    const int64_t sums_bytes = operands * groups * g.C * 8, part_bytes = parts * 4;
    scratch = at::empty({sums_bytes + operands * part_bytes + (groups + 1) * 4}, go.options().dtype(at::kByte));
    uint8_t* base = scratch.mutable_data_ptr<uint8_t>();
    a.group_sums = reinterpret_cast<double*>(base);
    a.contrib = reinterpret_cast<acc_t*>(base + sums_bytes);
    a.contrib_bias = bias.defined() ? reinterpret_cast<acc_t*>(base + sums_bytes + part_bytes) : nullptr;
    a.counters = reinterpret_cast<unsigned int*>(base + sums_bytes + operands * part_bytes);
    C10_CUDA_CHECK(cudaMemsetAsync(a.counters, 0, static_cast<size_t>(groups + 1) * 4, stream));
    a.groups = groups;
    a.R = R_nc;
    a.parts = parts;
    out_m = at::empty(multiplier_sizes, go.options());
    a.out_m = out_m.mutable_data_ptr<scalar_t>();
    if (bias.defined()) {
      out_b = at::empty(bias_sizes, go.options());
      a.out_b = out_b.mutable_data_ptr<scalar_t>();
    }
  } else {
    contrib = at::empty({parts}, acc_opts);
    contrib_bias = bias.defined() ? at::empty_like(contrib) : at::Tensor();
    a.contrib = contrib.mutable_data_ptr<acc_t>();
    a.contrib_bias = contrib_bias.defined() ? contrib_bias.mutable_data_ptr<acc_t>() : nullptr;
  }
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
      auto k = warp ? post_pool_backward_tiled2_ncdhw_kernel<scalar_t, index_t, true>
                    : post_pool_backward_tiled2_ncdhw_kernel<scalar_t, index_t, false>;
      launch_dependent(k, grid, dim3(kThreads), 0, stream, a, static_cast<index_t>(total),
                       static_cast<index_t>(g.OW / vec), static_cast<index_t>(g.OH),
                       static_cast<index_t>(g.OD * g.OH), static_cast<index_t>(g.C), static_cast<index_t>(g.W),
                       static_cast<index_t>(g.H * g.W));
    }
  };
  small ? go_launch(int32_t{}) : go_launch(int64_t{});
  if (groups > 0) return std::make_pair(out_m, out_b);
  const int64_t R = channels_last ? 1 : (g.N * g.C > 0 ? contrib.numel() / (g.N * g.C) : 0);
  // Per-channel multiplier gradients come out in the gradient's dtype (no cast kernel after); a one-element
  // multiplier sums them further, so it takes float.
  const at::ScalarType out = mflat.numel() == 1 ? at::kFloat : go.scalar_type();
  const std::vector<int64_t> per_channel{g.C};
  return sum_channel_partials(contrib, contrib_bias, g.C, R, out,
                              mflat.numel() == 1 ? at::IntArrayRef(per_channel) : multiplier_sizes,
                              bias.defined() ? bias_sizes : at::IntArrayRef(per_channel), stream);
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
        if (like.numel() != 1) return per_channel;
        return per_channel.sum().reshape(like.sizes()).to(like.scalar_type()).contiguous();
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
