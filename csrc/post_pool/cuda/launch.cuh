// Launch helpers shared by the CUDA kernels of the post_pool ops: block size and grid, programmatic dependent
// launches, and the packed loads/stores of the 2x2x2 fast paths.
#pragma once

#include "common/cuda_device.h"
#include "post_pool/post_pool.h"

#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace fused {
namespace post_pool {

constexpr int kThreads = 256;

// Enough blocks to fill the GPU several times over; the grid-stride loops cover the rest.
inline int64_t num_blocks(int64_t work) {
  const int sms = multiprocessor_count(current_cuda_device());
  const int64_t wanted = (work + kThreads - 1) / kThreads;
  return std::max<int64_t>(1, std::min<int64_t>(wanted, static_cast<int64_t>(sms) * 32));
}

// ---- programmatic dependent launch (Hopper and later) ---------------------------------------------------
// The backward is two or three launches per call (main kernel, then one or two per-channel sum passes), and a
// dependent launch in the same stream normally starts only after the previous grid has drained, so each boundary
// leaves the GPU idle for the launch latency. With programmatic stream serialization a kernel's blocks may be
// scheduled while the previous grid still runs; they wait at griddepcontrol.wait, which returns once that grid
// has completed and its memory is visible, so every global access after it is ordered exactly as without the
// attribute. Used on every GPU that has it (BackwardTuning::dependent_launches); older GPUs launch plainly.
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

// Whether the current device can launch dependently (compute capability 9.0 or later).
inline bool dependent_launch_supported() { return compute_capability_major(current_cuda_device()) >= 9; }

// Launches kernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent launch when `dependent`
// and the device supports it. Only kernels that call wait_for_prior_grid() before their first global memory
// access may go through here. Inside a CUDA-graph capture it launches plainly: dependent launches in captured
// graphs have not run on our GPU machine yet, and graph replay already removes most of the gaps between launches.
template <typename... KernelArgs, typename... Args>
void launch_dependent(bool dependent, void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem,
                      cudaStream_t stream, Args&&... args) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (!dependent || !dependent_launch_supported() || capture != cudaStreamCaptureStatusNone) {
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

// ---- the 2x2x2 fast paths' packs ------------------------------------------------------------------------
// Each thread loads or stores 16 bytes per window row: VEC outputs (contiguous: VEC neighbours along W;
// channels_last: VEC neighbouring channels).
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

template <typename scalar_t>
constexpr int vec_outputs() {
  return sizeof(scalar_t) >= 8 ? 1 : 8 / static_cast<int>(sizeof(scalar_t));
}

// N elements at p as 16-byte (or smaller) packs: a Pack wider than 16 bytes (the mixed form's float outputs
// beside 16-bit inputs) would promise an alignment the host checks do not. A single access for packs of 16 bytes
// or less, as every same-dtype pack is.
template <typename T, int N>
constexpr int piece_elems() {
  return N * sizeof(T) > 16 ? 16 / static_cast<int>(sizeof(T)) : N;
}
template <typename T, int N>
__device__ __forceinline__ Pack<T, N> load_pack(const T* p) {
  constexpr int P = piece_elems<T, N>();
  if constexpr (P == N) {
    return *reinterpret_cast<const Pack<T, N>*>(p);
  } else {
    static_assert(N % P == 0, "pieces must tile the pack");
    Pack<T, N> r;
#pragma unroll
    for (int k = 0; k < N / P; ++k) {
      const Pack<T, P> q = *reinterpret_cast<const Pack<T, P>*>(p + k * P);
#pragma unroll
      for (int e = 0; e < P; ++e) r.v[k * P + e] = q.v[e];
    }
    return r;
  }
}
template <typename T, int N>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, N>& v) {
  constexpr int P = piece_elems<T, N>();
  if constexpr (P == N) {
    *reinterpret_cast<Pack<T, N>*>(p) = v;
  } else {
    static_assert(N % P == 0, "pieces must tile the pack");
#pragma unroll
    for (int k = 0; k < N / P; ++k) {
      Pack<T, P> q;
#pragma unroll
      for (int e = 0; e < P; ++e) q.v[e] = v.v[k * P + e];
      *reinterpret_cast<Pack<T, P>*>(p + k * P) = q;
    }
  }
}

// The fast paths' geometry: 2x2x2 windows tiling the whole input (D, H, W = 2*OD, 2*OH, 2*OW).
inline bool tiles_2x2x2(const PoolGeometry& g) {
  return g.exact_tiling && g.kd == 2 && g.kh == 2 && g.kw == 2 && g.D == 2 * g.OD && g.H == 2 * g.OH &&
         g.W == 2 * g.OW;
}

}  // namespace post_pool
}  // namespace fused
