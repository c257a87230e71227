// The per-channel sum of the CUDA fast backward's partials (see channel_sum.cuh).
#include "post_pool/cuda/channel_sum.cuh"
#include "post_pool/cuda/launch.cuh"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>

#include <algorithm>
#include <type_traits>

namespace fused {
namespace post_pool {
namespace {

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
// Why one launch: a second pass would be latency-bound like the first, and where two passes are needed they cost
// more than this grid's fold (benchmarks/post_pool/backward_sweep.py, docs/performance.md). The counter is zeroed by
// the main backward kernel, which completes before this grid reads it. All fences are in this small kernel; in the
// main kernel they cost up to a fifth of its time.
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
void launch_channel_sum(bool dependent, const in_t* src0, const in_t* src1, out_t* dst0, out_t* dst1, int64_t C,
                        int64_t R, int64_t K, const ChannelSumShape& s, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(s.tiles), static_cast<unsigned>(s.splits), dst1 != nullptr ? 2u : 1u);
  launch_dependent(dependent, channel_partials_sum_kernel<in_t, out_t>, grid, dim3(kSumThreads), 0, stream, src0, src1, dst0,
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

}  // namespace

ChannelSumPlan plan_channel_sum(int64_t C, int64_t R, int64_t parts, int operands, const at::TensorOptions& opts,
                                bool single_launch_sum, bool dependent_launches) {
  ChannelSumPlan p;
  p.dependent_launches = dependent_launches;
  p.C = C, p.R = R, p.K = C > 0 && R > 0 ? parts / C : 0;
  if (p.K == 0) return p;
  p.first = channel_sum_shape(C, R, p.K, kSumMaxSplits);
  // Only where the sum would otherwise take two passes (per-pack partials, or very large inputs): there the fold
  // kernel is faster than a second pass, while a lone pass beats it (benchmarks/post_pool/backward_sweep.py).
  if (single_launch_sum && p.first.splits > 1) p.fold = fold_sum_shape(p.first, C, p.K);
  if (p.fold) {
    const int64_t mid_bytes = operands * p.fold->splits * C * 8;
    p.scratch = at::empty({mid_bytes + 8}, opts.dtype(at::kByte));
    uint8_t* base = p.scratch.mutable_data_ptr<uint8_t>();
    p.mid = reinterpret_cast<double*>(base);
    p.counter = reinterpret_cast<unsigned int*>(base + mid_bytes);
  }
  return p;
}

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
      launch_dependent(plan.dependent_launches, channel_partials_fold_kernel<scalar_t>, grid, dim3(kSumThreads), 0, stream, s0, s1, plan.mid,
                       d0, d1, plan.counter, C, R, K, f.chunk, f.TC, f.J, last.TC, last.J);
    } else if (first.splits == 1) {
      launch_channel_sum<float, scalar_t>(plan.dependent_launches, s0, s1, d0, d1, C, R, K, first, stream);
    } else {
      at::Tensor mid = at::empty({two ? 2 : 1, first.splits, C}, part.options().dtype(at::kDouble));
      double* m0 = mid.mutable_data_ptr<double>();
      double* m1 = two ? m0 + first.splits * C : nullptr;
      launch_channel_sum<float, double>(plan.dependent_launches, s0, s1, m0, m1, C, R, K, first, stream);
      const ChannelSumShape second = channel_sum_shape(C, 1, first.splits, 1);
      launch_channel_sum<double, scalar_t>(plan.dependent_launches, m0, m1, d0, d1, C, 1, first.splits, second, stream);
    }
  });
  return {result, result_bias};
}

}  // namespace post_pool
}  // namespace fused
