// The CUDA backward's fast path: 2x2x2 windows tiling the whole input (float32 and 16-bit types). Each thread
// writes whole window rows as 16-byte stores and reduces its outputs' parameter-gradient contributions to
// partials in a fixed order, which channel_sum.cu then sums per channel.
#include "post_pool/cuda/backward_tiled.cuh"
#include "post_pool/cuda/channel_sum.cuh"
#include "post_pool/cuda/launch.cuh"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>

#include <cstdint>
#include <type_traits>
#include <vector>

namespace fused {
namespace post_pool {
namespace {

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

// out_t: grad_output's and the multiplier's element type (scalar_t, or float in the mixed form; post_pool.h,
// mid_type); selected, grad_input and the bias are scalar_t.
template <typename scalar_t, typename out_t>
struct BwdArgs {
  const out_t* go;
  const scalar_t* sel;
  const uint8_t* off;
  const out_t* mflat;
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
template <typename scalar_t, typename out_t>
__device__ __forceinline__ void reset_sum_counter(const BwdArgs<scalar_t, out_t>& a) {
  if (a.sum_counter != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *a.sum_counter = 0u;
}

template <typename scalar_t, typename out_t, typename acc_t>
__device__ __forceinline__ void grad_pair(const BwdArgs<scalar_t, out_t>& a, out_t go, scalar_t sel, acc_t m,
                                          acc_t b, scalar_t& gx, acc_t& cm, acc_t& cb) {
  using mid_t = mid_type<scalar_t, out_t>;
  const bool has_bias = a.bias != nullptr;
  const acc_t x = pre_activation(static_cast<acc_t>(sel), b, has_bias);
  const acc_t gs = acc_t(0) + static_cast<acc_t>(go);  // as eager accumulates into a zeroed buffer
  const acc_t gxa = grad_input_via<mid_t>(gs, x, m, a.s1, a.s2);
  gx = static_cast<scalar_t>(gxa);
  cm = grad_multiplier_via<mid_t>(gs, x, m, a.s1, a.s2);
  cb = gxa;
}

// Partials of the contiguous backward: one per pack, per warp (its 32 packs lie in one channel plane) or per
// block (its kThreads packs do). Fewer partials make the per-channel sum after the kernel shorter, and that sum
// is a latency-bound launch on the critical path.
enum class Partials { kPack, kWarp, kBlock };

template <typename scalar_t, typename out_t, typename index_t, Partials PART>
__global__ void __launch_bounds__(kThreads) post_pool_backward_tiled2_ncdhw_kernel(
    const BwdArgs<scalar_t, out_t> a, index_t total, index_t OWv, index_t OH, index_t ODOH, index_t C, index_t W,
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
    const auto go = load_pack<out_t, VEC>(a.go + p * VEC);
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
template <typename scalar_t, typename out_t, typename index_t, int ITEMS, bool BLOCK>
__global__ void __launch_bounds__(kThreads) post_pool_backward_tiled2_ndhwc_kernel(
    const BwdArgs<scalar_t, out_t> a, index_t total, index_t Cv, index_t C, index_t OW, index_t OH) {
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
  Pack<out_t, VEC> go[ITEMS];
  Pack<scalar_t, VEC> sel[ITEMS];
  Pack<uint8_t, VEC> off[ITEMS];
#pragma unroll
  for (int it = 0; it < ITEMS; ++it) {
    const index_t p = first + it * kThreads;
    if (p < total) {
      go[it] = load_pack<out_t, VEC>(a.go + p * VEC);
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

// Packs per thread of the channels_last backward (1, 2, 4 or 8); more packs, fewer block partials. The default
// (BackwardTuning::cl_items 0) is the sweep's fastest device time per call: 8 for float32, 2 for 16-bit types. The
// value changes the order of the (float) partial sums, so a given setting always gives the same bits.
int cl_backward_items(const BackwardTuning& tuning, size_t element_size) {
  return tuning.cl_items != 0 ? tuning.cl_items : element_size >= 4 ? 8 : 2;
}

// Launches the backward fast path when geometry and alignment allow; returns the per-channel sums of the
// multiplier and bias partials (bias: undefined without one), or nothing when the general path must run.
template <typename scalar_t, typename out_t>
std::optional<std::pair<at::Tensor, at::Tensor>> launch_backward_tiled2(
    const PoolGeometry& g, bool channels_last, const at::Tensor& go, const at::Tensor& sel, const at::Tensor& off,
    const at::Tensor& mflat, double s1, double s2, const at::Tensor& grad_input, const at::Tensor& bias,
    at::IntArrayRef multiplier_sizes, at::IntArrayRef bias_sizes, const BackwardTuning& tuning,
    cudaStream_t stream) {
  using acc_t = at::opmath_type<scalar_t>;
  if constexpr (!std::is_same_v<acc_t, float>) {
    return std::nullopt;  // double: the general kernels
  } else {
  if (off.scalar_type() != at::kByte) return std::nullopt;
  if (!tiles_2x2x2(g)) return std::nullopt;
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
  const int items = channels_last && warp ? cl_backward_items(tuning, sizeof(scalar_t)) : 1;
  const int64_t blocks = (total + kThreads * items - 1) / (kThreads * items);
  const auto acc_opts = go.options().dtype(at::toOpMathType(go.scalar_type())).memory_format(at::MemoryFormat::Contiguous);
  // Partials: contiguous [N, C, R] (R per plane); channels_last [blocks, C] (block partials) or [total, vec].
  const int64_t parts = channels_last ? (warp ? blocks * g.C : total * vec)
                                      : (nc_block ? total / kThreads : warp ? total / 32 : total);
  at::Tensor contrib = at::empty({parts}, acc_opts);
  at::Tensor contrib_bias = bias.defined() ? at::empty_like(contrib) : at::Tensor();
  // The partials viewed [K / R, C, R] for the per-channel sum (see channel_partials_sum_kernel).
  const int64_t R = channels_last ? 1 : (g.N * g.C > 0 ? parts / (g.N * g.C) : 0);
  const ChannelSumPlan plan = plan_channel_sum(g.C, R, parts, bias.defined() ? 2 : 1, go.options(),
                                               tuning.single_launch_sum, tuning.dependent_launches);
  BwdArgs<scalar_t, out_t> a{go.const_data_ptr<out_t>(), sel.const_data_ptr<scalar_t>(),
                             off.const_data_ptr<uint8_t>(), mflat.const_data_ptr<out_t>(),
                             bias.defined() ? bias.const_data_ptr<scalar_t>() : nullptr,
                             grad_input.mutable_data_ptr<scalar_t>(), contrib.mutable_data_ptr<acc_t>(),
                             contrib_bias.defined() ? contrib_bias.mutable_data_ptr<acc_t>() : nullptr,
                             mflat.numel() != 1, static_cast<acc_t>(s1), static_cast<acc_t>(s2), plan.counter};
  const bool small = g.input_numel() < (int64_t(1) << 31);
  auto go_launch = [&](auto idx) {
    using index_t = decltype(idx);
    if (channels_last) {
      const dim3 grid(static_cast<unsigned>(blocks));
      auto k = !warp       ? post_pool_backward_tiled2_ndhwc_kernel<scalar_t, out_t, index_t, 1, false>
               : items == 1 ? post_pool_backward_tiled2_ndhwc_kernel<scalar_t, out_t, index_t, 1, true>
               : items == 2 ? post_pool_backward_tiled2_ndhwc_kernel<scalar_t, out_t, index_t, 2, true>
               : items == 4 ? post_pool_backward_tiled2_ndhwc_kernel<scalar_t, out_t, index_t, 4, true>
                            : post_pool_backward_tiled2_ndhwc_kernel<scalar_t, out_t, index_t, 8, true>;
      launch_dependent(tuning.dependent_launches, k, grid, dim3(kThreads), 0, stream, a, static_cast<index_t>(total),
                       static_cast<index_t>(Cv), static_cast<index_t>(g.C), static_cast<index_t>(g.OW),
                       static_cast<index_t>(g.OH));
    } else {
      const dim3 grid(static_cast<unsigned>((total + kThreads - 1) / kThreads));
      auto k = nc_block ? post_pool_backward_tiled2_ncdhw_kernel<scalar_t, out_t, index_t, Partials::kBlock>
               : warp   ? post_pool_backward_tiled2_ncdhw_kernel<scalar_t, out_t, index_t, Partials::kWarp>
                        : post_pool_backward_tiled2_ncdhw_kernel<scalar_t, out_t, index_t, Partials::kPack>;
      launch_dependent(tuning.dependent_launches, k, grid, dim3(kThreads), 0, stream, a, static_cast<index_t>(total),
                       static_cast<index_t>(g.OW / vec), static_cast<index_t>(g.OH),
                       static_cast<index_t>(g.OD * g.OH), static_cast<index_t>(g.C), static_cast<index_t>(g.W),
                       static_cast<index_t>(g.H * g.W));
    }
  };
  small ? go_launch(int32_t{}) : go_launch(int64_t{});
  // Per-channel multiplier gradients come out in the gradient's dtype (no cast kernel after); a one-element
  // multiplier sums them further, so it takes float. In the mixed form that dtype (grad_output's) is float, and a
  // bias's gradient (the input's dtype) is cast after, by launch_backward_tiled2_cuda.
  const at::ScalarType out = mflat.numel() == 1 ? at::kFloat : go.scalar_type();
  const std::vector<int64_t> per_channel{g.C};
  const at::IntArrayRef m_sizes = mflat.numel() == 1 ? at::IntArrayRef(per_channel) : multiplier_sizes;
  const at::IntArrayRef b_sizes = bias.defined() ? bias_sizes : at::IntArrayRef(per_channel);
  return sum_channel_partials(plan, contrib, contrib_bias, out, m_sizes, b_sizes, stream);
  }
}

}  // namespace

std::optional<ParamGrads> launch_backward_tiled2_cuda(const BackwardInputs& b, const at::Tensor& grad_input,
                                                      const BackwardTuning& tuning, cudaStream_t stream) {
  std::optional<std::pair<at::Tensor, at::Tensor>> fast;
  const bool channels_last = b.format == at::MemoryFormat::ChannelsLast3d;
  if (is_mixed(b.selected.scalar_type(), b.multiplier_flat.scalar_type())) {
    AT_DISPATCH_REDUCED_FLOATING_TYPES(b.selected.scalar_type(), "fused_post_pool_bwd_fast_mixed", [&] {
      fast = launch_backward_tiled2<scalar_t, float>(b.g, channels_last, b.grad_output, b.selected, b.offsets,
                                                     b.multiplier_flat, b.s1, b.s2, grad_input, b.bias_flat,
                                                     b.multiplier.sizes(),
                                                     b.bias.defined() ? b.bias.sizes() : at::IntArrayRef(), tuning,
                                                     stream);
    });
  } else {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, b.grad_output.scalar_type(), "fused_post_pool_bwd_fast", [&] {
      fast = launch_backward_tiled2<scalar_t, scalar_t>(b.g, channels_last, b.grad_output, b.selected, b.offsets,
                                                        b.multiplier_flat, b.s1, b.s2, grad_input, b.bias_flat,
                                                        b.multiplier.sizes(),
                                                        b.bias.defined() ? b.bias.sizes() : at::IntArrayRef(), tuning,
                                                        stream);
    });
  }
  if (!fast) return std::nullopt;
  // Per-channel sums come back in the parameter's shape and dtype; a one-element multiplier sums them further.
  auto finish = [&](const at::Tensor& per_channel, const at::Tensor& like) {
    if (like.numel() != 1 && per_channel.scalar_type() == like.scalar_type()) return per_channel;
    // A one-element multiplier's float sums (and, beside it, the bias's): summed further and cast here.
    at::Tensor total = like.numel() == 1 ? per_channel.sum() : per_channel;
    return total.reshape(like.sizes()).to(like.scalar_type()).contiguous();
  };
  ParamGrads p;
  if (b.bias.defined()) p.bias = finish(fast->second, b.bias);
  p.multiplier = finish(fast->first, b.multiplier);
  return p;
}

}  // namespace post_pool
}  // namespace fused
