// The weight gradient of the fused transposed convolution at pooled resolution (contract in
// backward_contract.h), as masked GEMMs on the tensor cores.
//
// Tap (kd, kh, kw) is used by exactly one phase p of every pool window q, reading input q + delta (per dim: tap 1 is
// phase bit 0 with delta 0, tap 2 phase bit 1 with delta 0, tap 0 phase bit 1 with delta 1). So
//   grad_weight[ci, co, tap] = sum_q x[q + delta(tap), ci] * G_p(tap)[q, co],  G_p[q, co] = grad_conv[q, co] if
//   offset[q, co] == p else 0,
// a GEMM per tap with M = 16 input channels, N = 32 output channels and K = the pooled positions. A block stages a
// tile of 2 x 4 x 16 pooled positions and the input halo (3 x 5 x 17 positions). grad_conv is scattered into eight
// B copies in fragment order, one per phase, each element into its own phase's copy (the others hold zero there):
// G_p is then read with plain loads, and no warp builds a mask. Each of 8 warps owns up to 4 taps of one phase
// (one warp: of two), so one B fragment serves several taps.
//
// Blocks are persistent over the K tiles and keep their taps' accumulators in registers; each writes one partial
// [27, 16, 32] per (block, channel tile), which grad_weight_reduce_kernel sums in block order: deterministic.
#pragma once

#include "conv_transpose3d_post_pool/cuda/grad_weight/params.cuh"
#include "conv_transpose3d_post_pool/cuda/grad_weight/stage.cuh"

#include <c10/cuda/CUDAException.h>

#include <cstdint>

namespace fused {
namespace conv_transpose3d_post_pool {
namespace grad_weight {

// One K tile for a compute warp with NTAP taps, slots below SPLIT of one phase and the rest of another: per k-step
// and phase, one 16-byte load per column-tile pair of the phase's masked B (pb0 / pb1: the phase's copy plus this
// lane's words), then per tap its A fragment (pa[k]: this lane's first A word at the tap's delta) and kNT mma.
// TF32 and 16-bit unroll the k-steps (the A offsets become immediates and the loads run ahead of the mma); strict
// float32, with three products and two operand splits per tap, keeps one k-step per iteration so that its code
// stays small.
template <Mode M, int NTAP, int SPLIT>
__device__ __forceinline__ void warp_tile(float (&acc)[kMaxTaps][kNT][4], const uint32_t* __restrict__ pb0,
                                          const uint32_t* __restrict__ pb1, const uint32_t* const (&pa)[kMaxTaps]) {
  using S = Smem<M>;
  constexpr int kUnroll = M == Mode::kStrict ? 1 : S::kSteps;
#pragma unroll kUnroll
  for (int s = 0; s < S::kSteps; ++s) {
    uint32_t b[2][kNT][2];
#pragma unroll
    for (int ph = 0; ph < (SPLIT < NTAP ? 2 : 1); ++ph) {
      const uint32_t* pb = ph == 0 ? pb0 : pb1;
      const uint4 b01 = *reinterpret_cast<const uint4*>(pb + s * 256);
      const uint4 b23 = *reinterpret_cast<const uint4*>(pb + s * 256 + 128);
      b[ph][0][0] = b01.x;
      b[ph][0][1] = b01.y;
      b[ph][1][0] = b01.z;
      b[ph][1][1] = b01.w;
      b[ph][2][0] = b23.x;
      b[ph][2][1] = b23.y;
      b[ph][3][0] = b23.z;
      b[ph][3][1] = b23.w;
      static_assert(kNT == 4, "the B words above name each column tile");
    }
    // k-step -> the tile row (d, h) and the first w of its positions, as an offset into the halo
    int row;
    if constexpr (S::kHalf) {
      row = ((s / kTH) * kHH + s % kTH) * (kTW / 2);
    } else {
      row = (((s >> 1) / kTH) * kHH + (s >> 1) % kTH) * kHW + (s & 1) * 8;
    }
    // Strict float32: hi/lo/cross of the masked B words once per k-step (a masked-out word is 0: every part 0).
    uint32_t bh[2][kNT][2], bl[2][kNT][2], bc[2][kNT][2];
    if constexpr (M == Mode::kStrict) {
#pragma unroll
      for (int ph = 0; ph < (SPLIT < NTAP ? 2 : 1); ++ph)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int r = 0; r < 2; ++r)
            conv_transpose3d_post_pool::tf32_split(b[ph][nt][r], bh[ph][nt][r], bl[ph][nt][r], bc[ph][nt][r]);
    }
    (void)bh;
    (void)bl;
    (void)bc;
#pragma unroll
    for (int k = 0; k < NTAP; ++k) {
      const uint32_t* ap = pa[k] + row;
      uint32_t a[4] = {ap[0], ap[8 * S::kXPitch], ap[4], ap[8 * S::kXPitch + 4]};
      float(&c)[kNT][4] = acc[k];
      const int ph = k < SPLIT ? 0 : 1;
      if constexpr (M == Mode::kStrict) {
        uint32_t ah[4], al[4], ac[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) conv_transpose3d_post_pool::tf32_split(a[r], ah[r], al[r], ac[r]);
        // Each accumulator takes its three products in the same order (small ones first), but the column tiles
        // are interleaved so that consecutive mma are independent (a dependent mma waits for the previous one).
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) conv_transpose3d_post_pool::mma<M>(c[nt], al, bc[ph][nt][0], bc[ph][nt][1]);
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) conv_transpose3d_post_pool::mma<M>(c[nt], ac, bl[ph][nt][0], bl[ph][nt][1]);
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) conv_transpose3d_post_pool::mma<M>(c[nt], ah, bh[ph][nt][0], bh[ph][nt][1]);
      } else {
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) conv_transpose3d_post_pool::mma<M>(c[nt], a, b[ph][nt][0], b[ph][nt][1]);
      }
    }
  }
}

// Writes a compute warp's accumulators to the block's partial [27, kBM, kBN].
__device__ __forceinline__ void store_partial(const float (&acc)[kMaxTaps][kNT][4], const WarpTaps& wt,
                                              float* __restrict__ part, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int k = 0; k < kMaxTaps; ++k) {
    if (k >= wt.ntap) break;
    const int tap = tap_of(slot_phase(wt, k), static_cast<int>((wt.deltas >> (4 * k)) & 7u));
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int m = g + 8 * (j >> 1), col = nt * 8 + 2 * t + (j & 1);
        part[(tap * kBM + m) * kBN + col] = acc[k][nt][j];
      }
    }
  }
}

// One block per multiprocessor (the phase copies of B take most of shared memory).
template <Mode M>
__global__ void __launch_bounds__(kThreads, 1) grad_weight_kernel(const WeightGradParams p) {
  using S = Smem<M>;
  extern __shared__ __align__(16) uint32_t smem[];
  uint32_t* sB = smem;
  uint32_t* sX = smem + S::kBWords;
  uint16_t* sLast = reinterpret_cast<uint16_t*>(sX + S::kXWords);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int ci0 = blockIdx.y * kBM, co0 = blockIdx.z * kBN;

  // Every phase copy starts zero; staging then keeps all but each element's own phase zero.
  for (int i = tid; i < S::kBWords / 4; i += kThreads) reinterpret_cast<uint4*>(sB)[i] = make_uint4(0u, 0u, 0u, 0u);

  const WarpTaps wt = warp_taps(warp);
  const uint32_t* pb0 = sB + wt.phase0 * S::kPhaseWords + lane * 4;
  const uint32_t* pb1 = sB + wt.phase1 * S::kPhaseWords + lane * 4;
  const uint32_t* pa[kMaxTaps];
  {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int k = 0; k < kMaxTaps; ++k) {
      const int dl = static_cast<int>((wt.deltas >> (4 * k)) & 7u), dd = dl >> 2, dh = (dl >> 1) & 1, dw = dl & 1;
      const int off = S::kHalf ? (dw * kBM) * S::kXPitch + (dd * kHH + dh) * (kTW / 2) : (dd * kHH + dh) * kHW + dw;
      pa[k] = sX + g * S::kXPitch + t + off;
    }
  }

  float acc[kMaxTaps][kNT][4];
#pragma unroll
  for (int i = 0; i < kMaxTaps; ++i)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][nt][j] = 0.f;

  // Software pipeline: the next tile's global loads are in flight while this tile is computed.
  TileRegs<M> regs;
  uint32_t prev[kGradPer];
#pragma unroll
  for (int u = 0; u < kGradPer; ++u) prev[u] = 0u;  // clearing a zero slot of copy 0 is harmless
  if (blockIdx.x < p.n_tiles) load_tile<M>(p, tile_origin(p, blockIdx.x), ci0, co0, regs);
  for (int64_t tile = blockIdx.x; tile < p.n_tiles; tile += gridDim.x) {
    __syncthreads();  // the previous tile's reads of shared memory are done (and the copies' first zeroing)
    store_tile<M>(regs, prev, sB, sX, sLast);
    __syncthreads();
    if constexpr (S::kHalf) {
      build_shifted_pairs<M>(sX, sLast);
      __syncthreads();
    }
    const int64_t next = tile + gridDim.x;
    if (next < p.n_tiles) load_tile<M>(p, tile_origin(p, next), ci0, co0, regs);
    switch (wt.ntap) {  // the shapes taps_covered admits
      case 4: warp_tile<M, 4, 4>(acc, pb0, pb1, pa); break;
      case 3: warp_tile<M, 3, 2>(acc, pb0, pb1, pa); break;
      default: warp_tile<M, 2, 2>(acc, pb0, pb1, pa); break;
    }
  }

  const int64_t part_index =
      (static_cast<int64_t>(blockIdx.x) * gridDim.y + blockIdx.y) * gridDim.z + blockIdx.z;
  store_partial(acc, wt, p.ws + part_index * (27 * kBM * kBN), lane);
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
  gw[ci * s0 + co * s1 + (tap / 9) * s2 + ((tap / 3) % 3) * s3 + (tap % 3) * s4] =
      conv_transpose3d_post_pool::from_float<io_t>(total);
}

}  // namespace grad_weight
}  // namespace conv_transpose3d_post_pool
}  // namespace fused
