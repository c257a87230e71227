// The weight gradient of the fused transposed convolution at pooled resolution (contract in
// conv_post_pool_backward.h), as masked GEMMs on the tensor cores.
//
// Tap (kd, kh, kw) is used by exactly one phase p of every pool window q, reading input q + delta (per dim: tap 1 is
// phase bit 0 with delta 0, tap 2 phase bit 1 with delta 0, tap 0 phase bit 1 with delta 1). So
//   grad_weight[ci, co, tap] = sum_q x[q + delta(tap), ci] * G_p(tap)[q, co],  G_p[q, co] = grad_conv[q, co] if
//   offset[q, co] == p else 0,
// a GEMM per tap with M = 16 input channels, N = 32 output channels and K = the pooled positions. A block stages a
// tile of 2 x 4 x 16 pooled positions (grad_conv and its offsets) and the input halo (3 x 5 x 17 positions); each of
// 7 warps owns up to 4 taps grouped by phase, so one masked B fragment serves all the warp's taps of that phase.
// The mask is built per fragment word from one-hot offset bytes kept beside grad_conv in fragment order.
//
// Blocks are persistent over the K tiles and keep their taps' accumulators in registers; each writes one partial
// [27, 16, 32] per (block, channel tile), which grad_weight_reduce_kernel sums in block order: deterministic.
#pragma once

#include "conv_post_pool_grad_weight_params.cuh"
#include "conv_post_pool_grad_weight_stage.cuh"

#include <c10/cuda/CUDAException.h>

#include <cstdint>

namespace fused {
namespace conv_grad {

// Byte-wise masks (0xff where the element's offset is phase P) of this lane's one-hot bytes.
template <int P, int NW>
__device__ __forceinline__ void phase_masks(const uint32_t (&hot)[NW], uint32_t (&bm)[NW]) {
#pragma unroll
  for (int i = 0; i < NW; ++i) bm[i] = ((hot[i] >> P) & 0x01010101u) * 0xffu;
}

// Word mask of B word J (J = nt * 2 + hi) from the byte masks.
template <bool HALF, int J, int NW>
__device__ __forceinline__ uint32_t word_mask(const uint32_t (&bm)[NW]) {
  constexpr int j = J;
  if constexpr (!HALF) {
    return __byte_perm(bm[j >> 2], 0u, (j & 3) * 0x1111u);
  } else {
    const int e0 = (2 * j) & 3, e1 = e0 + 1;
    return __byte_perm(bm[j >> 1], 0u, e0 | (e0 << 4) | (e1 << 8) | (e1 << 12));
  }
}

// acc[tap] += A(delta) x G_P masked, over one k-step, for the warp's taps of phase slot PI.
template <Mode M, int WARP, int PI, int TAP0>
__device__ __forceinline__ void phase_step(float (&acc)[kMaxTaps][kNT][4], const uint32_t (&b)[kNT][2],
                                           const uint32_t (&hot)[Smem<M>::kOneHotBytesPerLane / 4],
                                           const uint32_t* __restrict__ sX, int a_base, int step) {
  using S = Smem<M>;
  constexpr WarpTaps WT = warp_taps(WARP);
  constexpr int P = WT.phase[PI];
  constexpr int NW = S::kOneHotBytesPerLane / 4;
  uint32_t bm[NW];
  phase_masks<P, NW>(hot, bm);
  uint32_t bq[kNT][2];
  bq[0][0] = b[0][0] & word_mask<S::kHalf, 0>(bm);
  bq[0][1] = b[0][1] & word_mask<S::kHalf, 1>(bm);
  bq[1][0] = b[1][0] & word_mask<S::kHalf, 2>(bm);
  bq[1][1] = b[1][1] & word_mask<S::kHalf, 3>(bm);
  bq[2][0] = b[2][0] & word_mask<S::kHalf, 4>(bm);
  bq[2][1] = b[2][1] & word_mask<S::kHalf, 5>(bm);
  bq[3][0] = b[3][0] & word_mask<S::kHalf, 6>(bm);
  bq[3][1] = b[3][1] & word_mask<S::kHalf, 7>(bm);
  static_assert(kNT == 4, "the masks above name each column tile");
  // Strict float32: hi/lo/cross of the masked B words (a masked-out word is 0: every part 0).
  uint32_t bh[kNT][2], bl[kNT][2], bc[kNT][2];
  if constexpr (M == Mode::kStrict) {
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int r = 0; r < 2; ++r) conv_pool::tf32_split(bq[nt][r], bh[nt][r], bl[nt][r], bc[nt][r]);
  }
  // k-step -> the tile row (d, h) and the first w of its positions.
  int d, h, w0;
  if constexpr (S::kHalf) {
    d = step / kTH;
    h = step % kTH;
    w0 = 0;
  } else {
    d = (step >> 1) / kTH;
    h = (step >> 1) % kTH;
    w0 = (step & 1) * 8;
  }
  constexpr int kTaps = WT.ntap[PI];
#pragma unroll
  for (int k = 0; k < kTaps; ++k) {
    const int dl = WT.delta[PI][k];
    const int dd = dl >> 2, dh = (dl >> 1) & 1, dw = dl & 1;
    int off;
    if constexpr (S::kHalf) {
      off = (dw * kBM) * S::kXPitch + ((d + dd) * kHH + h + dh) * (kTW / 2);
    } else {
      off = ((d + dd) * kHH + h + dh) * kHW + w0 + dw;
    }
    const uint32_t* ap = sX + a_base + off;
    uint32_t a[4] = {ap[0], ap[8 * S::kXPitch], ap[4], ap[8 * S::kXPitch + 4]};
    float(&c)[kNT][4] = acc[TAP0 + k];
    if constexpr (M == Mode::kStrict) {
      uint32_t ah[4], al[4], ac[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) conv_pool::tf32_split(a[r], ah[r], al[r], ac[r]);
      // Each accumulator takes its three products in the same order (small ones first), but the column tiles
      // are interleaved so that consecutive mma are independent (a dependent mma waits for the previous one).
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) conv_pool::mma<M>(c[nt], al, bc[nt][0], bc[nt][1]);
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) conv_pool::mma<M>(c[nt], ac, bl[nt][0], bl[nt][1]);
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) conv_pool::mma<M>(c[nt], ah, bh[nt][0], bh[nt][1]);
    } else {
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) conv_pool::mma<M>(c[nt], a, bq[nt][0], bq[nt][1]);
    }
  }
}

// One K tile for compute warp WARP.
template <Mode M, int WARP>
__device__ __forceinline__ void warp_tile(float (&acc)[kMaxTaps][kNT][4], const uint32_t* __restrict__ sG,
                                          const uint8_t* __restrict__ sOH, const uint32_t* __restrict__ sX,
                                          int lane) {
  using S = Smem<M>;
  constexpr WarpTaps WT = warp_taps(WARP);
  constexpr int NW = S::kOneHotBytesPerLane / 4;
  const int g = lane >> 2, t = lane & 3;
  const int a_base = g * S::kXPitch + t;
#pragma unroll 1
  for (int s = 0; s < S::kSteps; ++s) {
    const uint4 b01 = *reinterpret_cast<const uint4*>(sG + (s * 2) * 128 + lane * 4);
    const uint4 b23 = *reinterpret_cast<const uint4*>(sG + (s * 2 + 1) * 128 + lane * 4);
    const uint32_t b[kNT][2] = {{b01.x, b01.y}, {b01.z, b01.w}, {b23.x, b23.y}, {b23.z, b23.w}};
    uint32_t hot[NW];
    const uint32_t* hp = reinterpret_cast<const uint32_t*>(sOH) + (s * 32 + lane) * NW;
    if constexpr (NW == 2) {
      const uint2 h2 = *reinterpret_cast<const uint2*>(hp);
      hot[0] = h2.x;
      hot[1] = h2.y;
    } else {
      const uint4 h4 = *reinterpret_cast<const uint4*>(hp);
      hot[0] = h4.x;
      hot[1] = h4.y;
      hot[2] = h4.z;
      hot[3] = h4.w;
    }
    phase_step<M, WARP, 0, 0>(acc, b, hot, sX, a_base, s);
    if constexpr (WT.nphase > 1) phase_step<M, WARP, 1, WT.ntap[0]>(acc, b, hot, sX, a_base, s);
  }
}

// The compute warps' taps as runtime values, slot k (0..3) in nibble k, in the slot order of warp_taps (the first
// phase's taps, then the second's): phase, input delta, and the number of slots. Must agree with warp_taps.
struct WarpSlots {
  uint32_t phases, deltas;
  int ntap;
};
__host__ __device__ constexpr WarpSlots warp_slots(int w) {
  return WarpSlots{
      w == 0 ? 0x0110u : w == 1 ? 0x4422u : w == 2 ? 0x3333u : w == 3 ? 0x5555u : w == 4 ? 0x6666u : 0x7777u,
      w == 0 ? 0x0100u : w == 1 ? 0x4020u : w == 2 ? 0x3210u : w == 3 ? 0x5410u : w == 4 ? 0x6420u
      : w == 5 ? 0x3210u : 0x7654u,
      w == 0 ? 3 : 4};
}
__host__ __device__ constexpr bool slots_agree(int w) {
  const WarpTaps wt = warp_taps(w);
  const WarpSlots ws = warp_slots(w);
  int k = 0;
  for (int pi = 0; pi < wt.nphase; ++pi) {
    for (int j = 0; j < wt.ntap[pi]; ++j, ++k) {
      if (static_cast<int>((ws.phases >> (4 * k)) & 7u) != wt.phase[pi]) return false;
      if (static_cast<int>((ws.deltas >> (4 * k)) & 7u) != wt.delta[pi][j]) return false;
    }
  }
  return k == ws.ntap;
}
static_assert(slots_agree(0) && slots_agree(1) && slots_agree(2) && slots_agree(3) && slots_agree(4) &&
                  slots_agree(5) && slots_agree(6),
              "warp_slots must list warp_taps' taps in slot order");

// One K tile for any compute warp, its taps read at run time: one copy of the code for all warps. Strict float32
// takes this form: its seven specialised copies (three products and two operand splits per tap) did not fit the
// instruction cache, and the warps stalled on instruction fetch (ncu: 65% of stall cycles).
template <Mode M>
__device__ __forceinline__ void warp_tile_shared(float (&acc)[kMaxTaps][kNT][4], const uint32_t* __restrict__ sG,
                                                 const uint8_t* __restrict__ sOH, const uint32_t* __restrict__ sX,
                                                 int lane, int warp) {
  using S = Smem<M>;
  constexpr int NW = S::kOneHotBytesPerLane / 4;
  const int g = lane >> 2, t = lane & 3;
  const int a_base = g * S::kXPitch + t;
  const WarpSlots ws = warp_slots(warp);
  const uint32_t phases = ws.phases, deltas = ws.deltas;
  const int ntap = ws.ntap;
  int aoff[kMaxTaps];
#pragma unroll
  for (int k = 0; k < kMaxTaps; ++k) {
    const int dl = (deltas >> (4 * k)) & 7, dd = dl >> 2, dh = (dl >> 1) & 1, dw = dl & 1;
    aoff[k] = S::kHalf ? (dw * kBM) * S::kXPitch + (dd * kHH + dh) * (kTW / 2) : (dd * kHH + dh) * kHW + dw;
  }
#pragma unroll 1
  for (int s = 0; s < S::kSteps; ++s) {
    const uint4 b01 = *reinterpret_cast<const uint4*>(sG + (s * 2) * 128 + lane * 4);
    const uint4 b23 = *reinterpret_cast<const uint4*>(sG + (s * 2 + 1) * 128 + lane * 4);
    const uint32_t b[kNT][2] = {{b01.x, b01.y}, {b01.z, b01.w}, {b23.x, b23.y}, {b23.z, b23.w}};
    uint32_t hot[NW];
    const uint32_t* hp = reinterpret_cast<const uint32_t*>(sOH) + (s * 32 + lane) * NW;
#pragma unroll
    for (int i = 0; i < NW; ++i) hot[i] = hp[i];
    int row;
    if constexpr (S::kHalf) {
      row = ((s / kTH) * kHH + s % kTH) * (kTW / 2);
    } else {
      row = (((s >> 1) / kTH) * kHH + (s >> 1) % kTH) * kHW + (s & 1) * 8;
    }
#pragma unroll
    for (int k = 0; k < kMaxTaps; ++k) {
      if (k >= ntap) break;
      const int P = (phases >> (4 * k)) & 7;
      uint32_t bm[NW];
#pragma unroll
      for (int i = 0; i < NW; ++i) bm[i] = ((hot[i] >> P) & 0x01010101u) * 0xffu;
      uint32_t bq[kNT][2] = {{b[0][0] & word_mask<S::kHalf, 0>(bm), b[0][1] & word_mask<S::kHalf, 1>(bm)},
                             {b[1][0] & word_mask<S::kHalf, 2>(bm), b[1][1] & word_mask<S::kHalf, 3>(bm)},
                             {b[2][0] & word_mask<S::kHalf, 4>(bm), b[2][1] & word_mask<S::kHalf, 5>(bm)},
                             {b[3][0] & word_mask<S::kHalf, 6>(bm), b[3][1] & word_mask<S::kHalf, 7>(bm)}};
      const uint32_t* ap = sX + a_base + row + aoff[k];
      uint32_t a[4] = {ap[0], ap[8 * S::kXPitch], ap[4], ap[8 * S::kXPitch + 4]};
      float(&c)[kNT][4] = acc[k];
      if constexpr (M == Mode::kStrict) {
        uint32_t bh[kNT][2], bl[kNT][2], bc[kNT][2], ah[4], al[4], ac[4];
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int r = 0; r < 2; ++r) conv_pool::tf32_split(bq[nt][r], bh[nt][r], bl[nt][r], bc[nt][r]);
#pragma unroll
        for (int r = 0; r < 4; ++r) conv_pool::tf32_split(a[r], ah[r], al[r], ac[r]);
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) conv_pool::mma<M>(c[nt], al, bc[nt][0], bc[nt][1]);
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) conv_pool::mma<M>(c[nt], ac, bl[nt][0], bl[nt][1]);
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) conv_pool::mma<M>(c[nt], ah, bh[nt][0], bh[nt][1]);
      } else {
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) conv_pool::mma<M>(c[nt], a, bq[nt][0], bq[nt][1]);
      }
    }
  }
}

// Writes compute warp WARP's accumulators to the block's partial [27, kBM, kBN].
template <int WARP>
__device__ __forceinline__ void store_partial(const float (&acc)[kMaxTaps][kNT][4], float* __restrict__ part,
                                              int lane) {
  constexpr WarpTaps WT = warp_taps(WARP);
  const int g = lane >> 2, t = lane & 3;
  constexpr int kPhases = WT.nphase;
  constexpr int kTaps0 = WT.ntap[0];
#pragma unroll
  for (int pi = 0; pi < kPhases; ++pi) {
#pragma unroll
    for (int k = 0; k < kMaxTaps; ++k) {
      if (k >= WT.ntap[pi]) break;
      const int slot = (pi == 0 ? 0 : kTaps0) + k;
      const int tap = tap_of(WT.phase[pi], WT.delta[pi][k]);
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int m = g + 8 * (j >> 1), col = nt * 8 + 2 * t + (j & 1);
          part[(tap * kBM + m) * kBN + col] = acc[slot][nt][j];
        }
      }
    }
  }
}

// One block per multiprocessor (the registers hold the accumulators and the next tile's loads).
template <Mode M>
__global__ void __launch_bounds__(kThreads, 1) grad_weight_kernel(const WeightGradParams p) {
  using S = Smem<M>;
  extern __shared__ __align__(16) uint32_t smem[];
  uint32_t* sG = smem;
  uint8_t* sOH = reinterpret_cast<uint8_t*>(smem + S::kGWords);
  uint32_t* sX = smem + S::kGWords + S::kOneHotWords;
  uint16_t* sLast = reinterpret_cast<uint16_t*>(sX + S::kXWords);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int ci0 = blockIdx.y * kBM, co0 = blockIdx.z * kBN;

  float acc[kMaxTaps][kNT][4];
#pragma unroll
  for (int i = 0; i < kMaxTaps; ++i)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][nt][j] = 0.f;

  // Software pipeline: the next tile's global loads are in flight while this tile is computed.
  TileRegs<M> regs;
  if (blockIdx.x < p.n_tiles) load_tile<M>(p, tile_origin(p, blockIdx.x), ci0, co0, regs);
  for (int64_t tile = blockIdx.x; tile < p.n_tiles; tile += gridDim.x) {
    __syncthreads();  // the previous tile's reads of shared memory are done
    store_tile<M>(regs, sG, sOH, sX, sLast);
    __syncthreads();
    if constexpr (S::kHalf) {
      build_shifted_pairs<M>(sX, sLast);
      __syncthreads();
    }
    const int64_t next = tile + gridDim.x;
    if (next < p.n_tiles) load_tile<M>(p, tile_origin(p, next), ci0, co0, regs);
    if constexpr (M == Mode::kStrict) {
      if (warp < kComputeWarps) warp_tile_shared<M>(acc, sG, sOH, sX, lane, warp);
    } else switch (warp) {
      case 0: warp_tile<M, 0>(acc, sG, sOH, sX, lane); break;
      case 1: warp_tile<M, 1>(acc, sG, sOH, sX, lane); break;
      case 2: warp_tile<M, 2>(acc, sG, sOH, sX, lane); break;
      case 3: warp_tile<M, 3>(acc, sG, sOH, sX, lane); break;
      case 4: warp_tile<M, 4>(acc, sG, sOH, sX, lane); break;
      case 5: warp_tile<M, 5>(acc, sG, sOH, sX, lane); break;
      case 6: warp_tile<M, 6>(acc, sG, sOH, sX, lane); break;
      default: break;  // the eighth warp only stages
    }
  }

  const int64_t part_index =
      (static_cast<int64_t>(blockIdx.x) * gridDim.y + blockIdx.y) * gridDim.z + blockIdx.z;
  float* part = p.ws + part_index * (27 * kBM * kBN);
  switch (warp) {
    case 0: store_partial<0>(acc, part, lane); break;
    case 1: store_partial<1>(acc, part, lane); break;
    case 2: store_partial<2>(acc, part, lane); break;
    case 3: store_partial<3>(acc, part, lane); break;
    case 4: store_partial<4>(acc, part, lane); break;
    case 5: store_partial<5>(acc, part, lane); break;
    case 6: store_partial<6>(acc, part, lane); break;
    default: break;
  }
}

// grad_weight[ci, co, tap] = sum over blocks of the partials, in the dtype, through its strides. A block sums 32
// consecutive outputs; its kGroups rows of threads each add every kGroups-th block's partial in block order, then
// the first row adds the groups' sums in group order: a fixed order, and kGroups loads in flight per output.
constexpr int kReduceGroups = 8;
template <typename io_t>
__global__ void __launch_bounds__(32 * kReduceGroups) grad_weight_reduce_kernel(
    const float* __restrict__ ws, int64_t blocks, int ci_tiles, int co_tiles, int Cin, int Cout,
    io_t* __restrict__ gw, int64_t s0, int64_t s1, int64_t s2, int64_t s3, int64_t s4) {
  const int64_t per_block = static_cast<int64_t>(ci_tiles) * co_tiles * 27 * kBM * kBN;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float s = 0.f;
  if (i < per_block) {
    for (int64_t b = threadIdx.y; b < blocks; b += kReduceGroups) s += ws[b * per_block + i];
  }
  __shared__ float sums[kReduceGroups][32];
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || i >= per_block) return;
  float total = 0.f;
#pragma unroll
  for (int g = 0; g < kReduceGroups; ++g) total += sums[g][threadIdx.x];
  const int col = static_cast<int>(i % kBN);
  const int m = static_cast<int>((i / kBN) % kBM);
  const int tap = static_cast<int>((i / (kBN * kBM)) % 27);
  const int64_t tile = i / (27 * kBM * kBN);
  const int cot = static_cast<int>(tile % co_tiles), cit = static_cast<int>(tile / co_tiles);
  const int ci = cit * kBM + m, co = cot * kBN + col;
  if (ci >= Cin || co >= Cout) return;
  gw[ci * s0 + co * s1 + (tap / 9) * s2 + ((tap / 3) % 3) * s3 + (tap % 3) * s4] = conv_pool::from_float<io_t>(total);
}

}  // namespace conv_grad
}  // namespace fused
