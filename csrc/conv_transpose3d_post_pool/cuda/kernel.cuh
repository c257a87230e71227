// The fused kernel of fused::conv_transpose3d_post_pool: transposed convolution (kernel 3, stride 2, padding 1)
// -> leaky -> x multiplier -> leaky -> 2x2x2 max pool, as an implicit GEMM at pooled resolution.
//
// Per dim, conv output o = 2i - 1 + k, so pool window q holds outputs 2q ("phase" 0: tap 1 of input q) and
// 2q + 1 (phase 1: tap 2 of input q and tap 0 of input q + 1). A pooled output thus has 8 phases
// p = (ed * 2 + eh) * 2 + ew, which is also its window offset and max_pool3d's scan order, and the phases use
// each of the 27 taps once. For each phase a warp computes [rows x 32 channels] += x[q + delta] x w[tap] on the
// tensor cores from shared memory, then folds it into the pooled result held in registers: the full epilogue
// and max_pool3d's selection (training form, or a multiplier/slope that is not monotone), or only a NaN-
// propagating max of the conv value (monotone form: both slopes > 0 and every multiplier of the block finite
// and non-zero, so leaky(leaky(y, s1) * m, s2) is monotone in y; the epilogue is then applied once per output).
// Only pooled tensors reach global memory.
//
// Blocks are persistent: each stages the weight of its 32 output channels once (when Cin fits one chunk) and
// walks the tiles blockIdx.x, blockIdx.x + gridDim.x, ...; per tile it computes the 8 phases from the staged input
// halo. Where one chunk holds Cin (kPipelined), the next tile's halo is loaded into a second buffer slice by slice
// during the current tile's phases; otherwise each tile stages its halo first. Two blocks per multiprocessor.
#pragma once

#include "conv_transpose3d_post_pool/cuda/stage.cuh"
#include "common/cuda_device.h"
#include "common/epilogue.h"

#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>

#include <atomic>

namespace fused {
namespace conv_transpose3d_post_pool {

// One k-step of strict float32 (strict_products, mma.cuh): B split once, each row tile's A split where it is used
// (registers: every row tile's fresh accumulator at once made the two-row-tile forms spill up to 2 KB).
template <Mode M, int MT, bool SAFE>
__device__ __forceinline__ void strict_step(float (&acc)[MT][kNT][4], const uint32_t (&a)[MT][4],
                                            const uint32_t (&b)[kNT][2]) {
  uint32_t bh[kNT][2], bl[kNT][2], bc[kNT][2];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int r = 0; r < 2; ++r) tf32_split_as<SAFE>(b[nt][r], bh[nt][r], bl[nt][r], bc[nt][r]);
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    uint32_t ah[4], al[4], ac[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) tf32_split_as<SAFE>(a[i][r], ah[r], al[r], ac[r]);
    strict_products<M, kNT>(acc[i], ah, al, ac, bh, bl, bc);
  }
}

// acc += the phase's products over the staged chunk. Everything but the thread's base addresses is a
// compile-time constant once the phase loop is unrolled, so every shared-memory load has an immediate offset.
// SAFE (strict float32): every staged word of both operands is below 2^127 in magnitude, so the splits skip
// their finiteness handling (tf32_split_finite; the products are bit for bit those of tf32_split).
template <Mode M, int MT, int KS, bool SAFE>
__device__ __forceinline__ void phase_product(float (&acc)[MT][kNT][4], const uint32_t* __restrict__ sA,
                                              const uint32_t* __restrict__ sB, const int (&a_base)[MT], int ph,
                                              int lane) {
  using TS = TileShape<MT>;
  const int ed = ph >> 2, eh = (ph >> 1) & 1, ew = ph & 1;
#pragma unroll
  for (int td = 0; td <= ed; ++td) {
#pragma unroll
    for (int th = 0; th <= eh; ++th) {
#pragma unroll
      for (int tw = 0; tw <= ew; ++tw) {
        const int tap = phase_tap(ed, eh, ew, td, th, tw);
        const int a_off = (td * TS::kHH + th) * TS::kHW + tw;
        const uint32_t* b_ptr = sB + tap * KS * 256 + lane * 4;
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
          uint32_t a[MT][4];
#pragma unroll
          for (int i = 0; i < MT; ++i) {
            const uint32_t* ap = sA + a_base[i] + a_off + ks * 8 * TS::kPitch;
            a[i][0] = ap[0];
            a[i][1] = ap[8];
            a[i][2] = ap[4 * TS::kPitch];
            a[i][3] = ap[4 * TS::kPitch + 8];
          }
          const uint4 b01 = *reinterpret_cast<const uint4*>(b_ptr + ks * 256);
          const uint4 b23 = *reinterpret_cast<const uint4*>(b_ptr + ks * 256 + 128);
          const uint32_t b[kNT][2] = {{b01.x, b01.y}, {b01.z, b01.w}, {b23.x, b23.y}, {b23.z, b23.w}};
          if constexpr (M == Mode::kStrict) {
            strict_step<M, MT, SAFE>(acc, a, b);
          } else {
#pragma unroll
            for (int i = 0; i < MT; ++i) {
#pragma unroll
              for (int nt = 0; nt < kNT; ++nt) mma<M>(acc[i][nt], a[i], b[nt][0], b[nt][1]);
            }
          }
        }
      }
    }
  }
}

// Folds phase ph's conv values into the pooled result: the exact epilogue and max_pool3d's selection (value,
// and in the training form the selected conv value and the window offset, one byte per value).
// UNIT: both slopes in (0, 1] (the launcher's p.unit_slopes), so each leaky takes the one-max form.
template <Mode M, int MT, bool TRAIN, bool UNIT, bool MIXED>
__device__ __forceinline__ void fold_phase(const float (&acc)[MT][kNT][4], float (&best)[MT][kNT][4],
                                           float (&sel)[TRAIN ? MT : 1][kNT][4],
                                           uint32_t (&offs)[TRAIN ? MT : 1][kNT], const float* sMult,
                                           const float* sBias, int t, int ph, float s1, float s2) {
  using io_t = typename ModeTraits<M>::io_t;
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
    const float2 m2 = *reinterpret_cast<const float2*>(sMult + nt * 8 + 2 * t);
    const float2 b2 = *reinterpret_cast<const float2*>(sBias + nt * 8 + 2 * t);
#pragma unroll
    for (int i = 0; i < MT; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float m = (j & 1) ? m2.y : m2.x;
        float y = acc[i][nt][j] + ((j & 1) ? b2.y : b2.x);
        if constexpr (ModeTraits<M>::kHalf) y = round_to_io<io_t>(y);
        using Out = OutputTraits<M, MIXED>;
        const float e =
            UNIT ? leaky_unit_slope(Out::mid(leaky_unit_slope(y, s1)) * m, s2) : Out::epilogue(y, m, s1, s2);
        // max_pool3d starts from phase 0 whatever its value (an all -inf window reports offset 0).
        const bool take = ph == 0 || takes_max(e, best[i][nt][j]);
        best[i][nt][j] = take ? e : best[i][nt][j];
        if constexpr (TRAIN) {
          sel[i][nt][j] = take ? y : sel[i][nt][j];
          const uint32_t shift = 8u * j;
          const uint32_t cur = ph == 0 ? 0u : offs[i][nt];
          offs[i][nt] = take ? (cur & ~(0xffu << shift)) | (static_cast<uint32_t>(ph) << shift) : cur;
        }
      }
    }
  }
}

// KS: k-steps (8 k-words) per staged chunk. MIXED: output.cuh.
template <Mode M, int MT, bool TRAIN, int KS, bool MIXED>
__global__ void __launch_bounds__(kThreads, 2) conv_transpose3d_post_pool_kernel(const Params p) {
  using io_t = typename ModeTraits<M>::io_t;
  using Out = OutputTraits<M, MIXED>;
  constexpr bool kHalf = ModeTraits<M>::kHalf;
  using TS = TileShape<MT>;
  constexpr int kChunkWords = 8 * KS;
  // Pipelined: two halo buffers, the current tile's and the next one's (filled slice by slice during the phases).
  constexpr bool kPipe = kPipelined<M, MT, KS>;
  constexpr int kHalos = kPipe ? 2 : 1;
  constexpr int kHaloWords = TS::kPitch * kChunkWords;
  // Only the largest chunk size can take several chunks (the launcher's chunk choice), so the others leave the
  // per-chunk staging out of the phase loop; strict float32 keeps it at every size (without it, its register
  // allocation spilled several times more).
  constexpr bool kMayChunk = KS == kMaxChunkWords / 8 || M == Mode::kStrict;
  extern __shared__ __align__(16) uint32_t smem[];
  uint32_t* sB = smem;
  uint32_t* const sHalo = smem + 27 * kChunkWords * kBlockN;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int co0 = blockIdx.y * kBlockN;
  const bool has_bias = p.bias != nullptr;

  // The block's channel parameters in shared memory (read per phase by the exact form, which keeps them out of
  // the registers the accumulators need); the monotone form needs only this thread's signs, as a bit mask.
  float* sMult = reinterpret_cast<float*>(sHalo + kHalos * kHaloWords);
  float* sBias = sMult + kBlockN;
  // Pipelined: the origin of the tile each halo buffer is being filled for. Block-uniform, so it lives in shared
  // memory (read per slice) instead of four registers per thread over the whole tile.
  TileOrigin* sOrigin = reinterpret_cast<TileOrigin*>(sBias + kBlockN);
  bool breaks_monotone = false;
  if (tid < kBlockN) {
    const int co = co0 + tid;
    const bool ok = co < p.Cout;
    const float m = ok ? Out::multiplier(p, co) : 1.f;
    // Without a bias, -0: adding it leaves every value as it is (-0 included), so the epilogue always adds
    // instead of predicating the add (which the compiler turns into an add and a select per value).
    const float b = ok && has_bias ? to_float(static_cast<const io_t*>(p.bias)[co]) : -0.f;
    const float inf = __int_as_float(0x7f800000);
    breaks_monotone = ok && (m == 0.f || !(fabsf(m) < inf) || !(fabsf(b) < inf));
    sMult[tid] = m;
    sBias[tid] = b;
  }
  const bool any_breaks = __syncthreads_or(breaks_monotone);
  // Block-uniform: the monotone form only where it is exact for every channel of the block.
  const bool exact = TRAIN || !(p.s1 > 0.f && p.s2 > 0.f) || any_breaks;

  // The weight, staged once when one chunk holds all of Cin (else per chunk below; this pass only looks for
  // non-finite weights).
  bool w_nonfinite = false, w_unsafe = false;
  for (int c = 0; c < p.nchunks; ++c) {
    if (c > 0) __syncthreads();
    w_nonfinite |= stage_weights<M>(p, sB, co0, c, KS, sMult, !exact, w_unsafe);
  }
  const bool fix_edges = __syncthreads_or(w_nonfinite);
  // Strict float32: whether every weight word of the block may take the simpler split (block-uniform).
  bool w_safe = false;
  if constexpr (M == Mode::kStrict) w_safe = !__syncthreads_or(w_unsafe);

  int a_base[MT];
  int row_d[MT], row_h[MT];
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    const int mi = warp * MT + i;
    row_d[i] = mi / kTileH;
    row_h[i] = mi % kTileH;
    a_base[i] = (row_d[i] * TS::kHH + row_h[i]) * TS::kHW + g + t * TS::kPitch;
  }

  using HI = HaloItems<MT, KS>;
  // Pipelined: the first tile's halo is staged here; each tile's loop then stages the next one.
  bool next_unsafe = false;
  if constexpr (kPipe) {
    // The batched staging loops (several loads in flight per thread): one slice at a time would pay a memory
    // round trip per slice, all of it exposed for a block with a single tile (small batches).
    if (blockIdx.x < p.n_tiles) {
      const TileOrigin o = tile_origin(p, blockIdx.x, TS::kTD);
      if (p.x_channels_last) {
        next_unsafe = stage_input<M, MT>(p, sHalo, o.n, o.qd0, o.qh0, o.qw0, 0, kChunkWords);
      } else {
        next_unsafe = stage_input_rows<M, MT>(p, sHalo, o.n, o.qd0, o.qh0, o.qw0, 0, kChunkWords);
      }
    }
  }
  int buf = 0;

  for (int64_t tile = blockIdx.x; tile < p.n_tiles; tile += gridDim.x) {
    const uint32_t* sA = sHalo + buf * kHaloWords;
    uint32_t* const sNext = sHalo + (buf ^ 1) * kHaloWords;
    const int64_t next_tile = tile + gridDim.x;
    const bool has_next = kPipe && next_tile < p.n_tiles;
    // Published by the barrier below (warps still finishing the previous tile read the other entry).
    if (kPipe && has_next && threadIdx.x == 0) sOrigin[buf ^ 1] = tile_origin(p, next_tile, TS::kTD);

    // Strict float32: both operands of the staged chunk may take the simpler split (block-uniform).
    bool safe = false;
    if constexpr (kPipe) {
      // The halo of this tile is complete (every thread's stores of it are done) and the other buffer is free
      // (every warp finished the previous tile).
      if constexpr (M == Mode::kStrict) {
        // The barrier first: `w_safe && !__syncthreads_or(...)` would skip it when the weights are unsafe.
        const bool x_unsafe = __syncthreads_or(next_unsafe);
        safe = w_safe && !x_unsafe;
      } else {
        __syncthreads();
      }
      next_unsafe = false;
    } else if (p.nchunks == 1) {
      const TileOrigin o = tile_origin(p, tile, TS::kTD);
      __syncthreads();  // the previous tile's reads of sA are done
      bool x_unsafe;
      if (p.x_channels_last) {
        x_unsafe = stage_input<M, MT>(p, sHalo, o.n, o.qd0, o.qh0, o.qw0, 0, kChunkWords);
      } else {
        x_unsafe = stage_input_rows<M, MT>(p, sHalo, o.n, o.qd0, o.qh0, o.qw0, 0, kChunkWords);
      }
      if constexpr (M == Mode::kStrict) {
        // The barrier first (as above): without it the phases would read a half-staged halo.
        const bool any_unsafe = __syncthreads_or(x_unsafe);
        safe = w_safe && !any_unsafe;
      } else {
        (void)x_unsafe;
        __syncthreads();
      }
    }

    float best[MT][kNT][4];
    float sel[TRAIN ? MT : 1][kNT][4];
    uint32_t offs[TRAIN ? MT : 1][kNT];
    (void)sel;
    (void)offs;

    // The next tile's halo in 8 slices, one per phase: slice ph's loads are issued before phase ph's math and
    // stored after phase ph + 1's, so two slices are in flight and each load has more than a phase to arrive.
    HaloSlice<M, MT, KS> slices[2];
    (void)slices;
#pragma unroll
    for (int ph = 0; ph < 8; ++ph) {
      if constexpr (kPipe) {
        if (has_next) {
          const TileOrigin next = sOrigin[buf ^ 1];
          load_halo_slice<M, MT, KS>(p, next, slice_begin<HI>(ph), slice_begin<HI>(ph + 1), slices[ph & 1]);
        }
      }
      float acc[MT][kNT][4];
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][nt][j] = 0.f;

      for (int c = 0; c < (kMayChunk ? p.nchunks : 1); ++c) {
        if (kMayChunk && p.nchunks > 1) {
          __syncthreads();
          bool unsafe = false;
          stage_weights<M>(p, sB, co0, c, KS, sMult, !exact, unsafe);
          const TileOrigin o = tile_origin(p, tile, TS::kTD);
          unsafe |= stage_input<M, MT>(p, sHalo, o.n, o.qd0, o.qh0, o.qw0, c, kChunkWords);
          if constexpr (M == Mode::kStrict) {
            safe = !__syncthreads_or(unsafe);
          } else {
            __syncthreads();
          }
        }
        if constexpr (M == Mode::kStrict) {
          if (safe) {
            phase_product<M, MT, KS, true>(acc, sA, sB, a_base, ph, lane);
          } else {
            phase_product<M, MT, KS, false>(acc, sA, sB, a_base, ph, lane);
          }
        } else {
          phase_product<M, MT, KS, false>(acc, sA, sB, a_base, ph, lane);
        }
      }
      if constexpr (kPipe) {
        if (has_next && ph > 0) {
          next_unsafe |= store_halo_slice<M, MT, KS>(p, sNext, slice_begin<HI>(ph - 1), slice_begin<HI>(ph),
                                                     slices[(ph - 1) & 1]);
        }
      }

      if (exact) {
        if (p.unit_slopes) {
          fold_phase<M, MT, TRAIN, true, MIXED>(acc, best, sel, offs, sMult, sBias, t, ph, p.s1, p.s2);
        } else {
          fold_phase<M, MT, TRAIN, false, MIXED>(acc, best, sel, offs, sMult, sBias, t, ph, p.s1, p.s2);
        }
      } else {
        // The extreme conv value: the largest for a positive multiplier, the smallest (the weights were staged
        // negated, so again the largest) for a negative one.
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
            for (int j = 0; j < 4; ++j)
              best[i][nt][j] = ph == 0 ? acc[i][nt][j] : max_nan(best[i][nt][j], acc[i][nt][j]);
      }
    }
    if constexpr (kPipe) {
      if (has_next) next_unsafe |= store_halo_slice<M, MT, KS>(p, sNext, slice_begin<HI>(7), HI::kItems, slices[1]);
    }

    // Stores: int64 offsets; out, selected and offsets share strides.
    // Decoded here rather than held in registers over the phases.
    const TileOrigin o = tile_origin(p, tile, TS::kTD);
    const int n = o.n, qd0 = o.qd0, qh0 = o.qh0, qw0 = o.qw0;
    const int64_t col0 = static_cast<int64_t>(co0 + 2 * t) * p.so[1];
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      const int qd = qd0 + row_d[i], qh = qh0 + row_h[i];
      if (qd >= p.PD || qh >= p.PH) continue;
      const int64_t row = n * p.so[0] + qd * p.so[2] + qh * p.so[3] + (qw0 + g) * p.so[4] + col0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (qw0 + g + 8 * (j >> 1) >= p.PW) continue;
        const int64_t at = row + (j >> 1) * 8 * p.so[4] + (j & 1) * p.so[1];
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          const int cc = j & 1;
          const int col = nt * 8 + 2 * t + cc;
          if (co0 + col >= p.Cout) continue;
          const int64_t o = at + nt * 8 * p.so[1];
          float v = best[i][nt][j];
          if (!exact) {
            const float m = sMult[col];
            float y = (m < 0.f ? -v : v) + sBias[col];
            if constexpr (kHalf) y = round_to_io<io_t>(y);
            v = Out::epilogue(y, m, p.s1, p.s2);
          }
          Out::store(p, o, v);
          if constexpr (TRAIN) {
            static_cast<io_t*>(p.sel)[o] = from_float<io_t>(sel[i][nt][j]);
            p.off[o] = static_cast<uint8_t>((offs[i][nt] >> (8 * j)) & 0xffu);
          }
        }
      }
    }
    if (fix_edges) {
      __syncthreads();  // orders the stores above before the overwrites
      fix_missing_neighbours<M, TRAIN, MIXED>(p, n, qd0, qh0, qw0, TS::kTD, co0);
    }
    if constexpr (kPipe) buf ^= 1;
  }
}

// Blocks per multiprocessor of one instantiation at one chunk size, asked of the runtime once (the grid only
// sizes the persistent loop, so a stale figure on a different second GPU costs speed, never correctness).
template <Mode M, int MT, bool TRAIN, int KS, bool MIXED>
int blocks_per_sm(size_t smem) {
  static std::atomic<int> cache{0};
  int v = cache.load(std::memory_order_relaxed);
  if (v <= 0) {
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &v, conv_transpose3d_post_pool_kernel<M, MT, TRAIN, KS, MIXED>, kThreads, smem));
    v = v > 0 ? v : 1;
    cache.store(v, std::memory_order_relaxed);
  }
  return v;
}

template <Mode M, int MT, bool TRAIN, int KS, bool MIXED>
void launch_one(const Params& p, cudaStream_t stream) {
  const size_t smem = kKernelSmem<M, MT, KS>;
  auto kernel = conv_transpose3d_post_pool_kernel<M, MT, TRAIN, KS, MIXED>;
  // Above 48 KB a block needs the opt-in, given once per device.
  static DynamicSmemLimit smem_limit;
  const int device = current_cuda_device();
  smem_limit.raise_to(reinterpret_cast<const void*>(kernel), smem, device);
  const int sms = multiprocessor_count(device);
  const int64_t n_chunks_n = (p.Cout + kBlockN - 1) / kBlockN;
  const int64_t resident = static_cast<int64_t>(blocks_per_sm<M, MT, TRAIN, KS, MIXED>(smem)) * sms;
  int64_t bx = (resident + n_chunks_n - 1) / n_chunks_n;
  bx = bx < p.n_tiles ? bx : p.n_tiles;
  bx = bx > 0 ? bx : 1;
  TORCH_CHECK(n_chunks_n <= 65535, "conv_transpose3d_post_pool: too many output channels for one launch: ", p.Cout);
  kernel<<<dim3(static_cast<unsigned>(bx), static_cast<unsigned>(n_chunks_n)), kThreads, smem, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <Mode M, int MT, bool TRAIN, bool MIXED>
void launch_ks(const Params& p, cudaStream_t stream) {
  switch (p.chunk_words) {
    case 8:
      return launch_one<M, MT, TRAIN, 1, MIXED>(p, stream);
    case 16:
      return launch_one<M, MT, TRAIN, 2, MIXED>(p, stream);
    default:
      TORCH_INTERNAL_ASSERT(p.chunk_words == kMaxChunkWords);
      return launch_one<M, MT, TRAIN, kMaxChunkWords / 8, MIXED>(p, stream);
  }
}

// The training form keeps the selected values and offsets in registers too: one row tile per warp keeps it
// within two blocks per multiprocessor.
template <Mode M, bool MIXED>
void launch_form(const Params& p, int mt, bool train, cudaStream_t stream) {
  if (train) return launch_ks<M, 1, true, MIXED>(p, stream);
  return mt == 2 ? launch_ks<M, 2, false, MIXED>(p, stream) : launch_ks<M, 1, false, MIXED>(p, stream);
}

}  // namespace conv_transpose3d_post_pool
}  // namespace fused
