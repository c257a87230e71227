// The input gradient of the fused transposed convolution (contract: backward_contract.h) as an implicit GEMM
// on the tensor cores: M = input positions, N = input channels, K = output channels, over the 27 taps.
//
// Per dim, input i feeds conv outputs 2i - 1 + k: tap 1 -> window q = i (phase bit 0), tap 2 -> q = i (bit 1),
// tap 0 -> q = i - 1 (bit 1). So the taps group by their window shift delta = i - q (0 or 1 per dim): shift delta
// serves 2 taps per dim with delta 0 and 1 per dim with delta 1 (8 + 3 * 4 + 3 * 2 + 1 = 27), and a pooled gradient
// value reaches tap t only when its saved window offset is t's phase. A block stages the pooled gradient of its
// tile with a one-window halo on the low side (and, per word, the phases), plus the weight of its 16 input
// channels; per shift a warp loads each A fragment once and, for each tap of that shift, masks it by phase
// (one compare and one select per word) before the mma. Masked-out words are zeros that still multiply the
// weight, as a convolution over the scattered full-resolution gradient (zero-padded) multiplies its zeros: an
// infinite or NaN weight makes NaN wherever that convolution would.
//
// This header holds the single-buffered kernel of strict float32, bf16 and fp16 (a block stages a chunk,
// synchronises, runs its mma) and the tap decoding TF32's double-buffered kernel (grad_input/kernel_tf32.cuh)
// shares; the geometry and parameters are in grad_input/params.cuh, the staging in
// grad_input/stage.cuh.
#pragma once

#include "conv_transpose3d_post_pool/cuda/grad_input/stage.cuh"
#include "common/cuda_device.h"

#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>
#include <cuda_runtime.h>

#include <atomic>

namespace fused {
namespace conv_transpose3d_post_pool {
namespace grad_input {

// Tap of the window neighbour (bd, bh, bw) at shift (dd, dh, dw) (each bd >= dd), and the phase of that
// neighbour's window that reaches it: per dim, shift 1 takes tap 0 of window i - 1; shift 0 takes tap 1 of window i
// (phase bit 0) and tap 2 (phase bit 1).
__device__ __forceinline__ constexpr int shift_tap(int dd, int dh, int dw, int bd, int bh, int bw) {
  return ((dd ? 0 : (bd ? 2 : 1)) * 3 + (dh ? 0 : (bh ? 2 : 1))) * 3 + (dw ? 0 : (bw ? 2 : 1));
}
__device__ __forceinline__ constexpr uint32_t shift_phase(int bd, int bh, int bw) {
  return static_cast<uint32_t>((bd * 2 + bh) * 2 + bw);
}

// The lane's B fragments of both column tiles for `tap` and k-step `ks` (stage_weights' order): one 16-byte load.
template <int KS>
__device__ __forceinline__ void load_b(const uint32_t* __restrict__ sB, int tap, int ks, int lane,
                                       uint32_t (&b)[kNT][2]) {
  const uint4 bv = *reinterpret_cast<const uint4*>(sB + ((tap * KS + ks) * 32 + lane) * 4);
  b[0][0] = bv.x;
  b[0][1] = bv.y;
  b[1][0] = bv.z;
  b[1][1] = bv.w;
}

// Calls f(ph, b) for every tap of shift (dd, dh, dw) (window neighbours bd >= dd per dim, in (d, h, w) order): ph
// the window phase that reaches the tap, b the tap's B fragments at k-step ks. Both grad_input kernels walk a
// shift's taps through it.
template <int KS, typename F>
__device__ __forceinline__ void for_each_shift_tap(const uint32_t* __restrict__ sB, int dd, int dh, int dw, int ks,
                                                   int lane, F&& f) {
#pragma unroll
  for (int bd = dd; bd <= 1; ++bd) {
#pragma unroll
    for (int bh = dh; bh <= 1; ++bh) {
#pragma unroll
      for (int bw = dw; bw <= 1; ++bw) {
        uint32_t b[kNT][2];
        load_b<KS>(sB, shift_tap(dd, dh, dw, bd, bh, bw), ks, lane, b);
        f(shift_phase(bd, bh, bw), b);
      }
    }
  }
}

// acc += the staged chunk's products over the 8 shifts and their taps. Everything but the thread's base
// addresses is a compile-time constant once the loops are unrolled, so every shared-memory load has an immediate
// offset. SAFE (strict float32): every staged word of both operands is below 2^127 in magnitude, so the splits
// skip their finiteness handling.
template <Mode M, int KS, bool SAFE>
__device__ __forceinline__ void accumulate(float (&acc)[kMT][kNT][4], const uint32_t* __restrict__ sA,
                                           const uint32_t* __restrict__ sC, const uint32_t* __restrict__ sB,
                                           const int (&a_base)[kMT], int lane) {
#pragma unroll
  for (int s = 0; s < 8; ++s) {
    const int dd = s >> 2, dh = (s >> 1) & 1, dw = s & 1;
    // window q = i - delta
    const int a_off = -((dd * kHH + dh) * kHW + dw);
    // Strict float32 keeps three parts of every operand: its k-steps run one at a time to stay in registers.
    constexpr int kUnrollK = M == Mode::kStrict ? 1 : KS;
#pragma unroll kUnrollK
    for (int ks = 0; ks < KS; ++ks) {
      uint32_t a[kMT][4], code[kMT][4];
#pragma unroll
      for (int i = 0; i < kMT; ++i) {
        const int o = a_base[i] + a_off + ks * 8 * kPitch;
        const int offs[4] = {0, kHW, 4 * kPitch, 4 * kPitch + kHW};
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          a[i][r] = sA[o + offs[r]];
          code[i][r] = sC[o + offs[r]];
        }
      }
      // Strict float32: split the A words once per shift; the taps select among the parts.
      uint32_t ah[kMT][4], al[kMT][4], ac[kMT][4];
      if constexpr (M == Mode::kStrict) {
#pragma unroll
        for (int i = 0; i < kMT; ++i)
#pragma unroll
          for (int r = 0; r < 4; ++r) tf32_split_as<SAFE>(a[i][r], ah[i][r], al[i][r], ac[i][r]);
      }
      (void)ah;
      (void)al;
      (void)ac;
      for_each_shift_tap<KS>(sB, dd, dh, dw, ks, lane, [&](uint32_t ph, const uint32_t (&b)[kNT][2]) {
        if constexpr (M == Mode::kStrict) {
          uint32_t bh_[kNT][2], bl_[kNT][2], bc_[kNT][2];
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
            for (int r = 0; r < 2; ++r) tf32_split_as<SAFE>(b[nt][r], bh_[nt][r], bl_[nt][r], bc_[nt][r]);
#pragma unroll
          for (int i = 0; i < kMT; ++i) {
            uint32_t mh[4], ml[4], mc[4];
#pragma unroll
            for (int r = 0; r < 4; ++r) {
              const bool take = code[i][r] == ph;
              mh[r] = take ? ah[i][r] : 0u;
              ml[r] = take ? al[i][r] : 0u;
              mc[r] = take ? ac[i][r] : 0u;
            }
            strict_products<M, kNT>(acc[i], mh, ml, mc, bh_, bl_, bc_);
          }
        } else {
#pragma unroll
          for (int i = 0; i < kMT; ++i) {
            uint32_t m[4];
#pragma unroll
            for (int r = 0; r < 4; ++r) {
              const uint32_t c16 = phase_code16(ph);
              m[r] = a[i][r] & eq_mask16(code[i][r], c16 | (c16 << 16));
            }
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt) mma<M>(acc[i][nt], m, b[nt][0], b[nt][1]);
          }
        }
      });
    }
  }
}

// KS: k-steps (8 k-words) per staged chunk. Persistent blocks: each stages its weight once (when one chunk holds
// all of Cout) and walks the tiles blockIdx.x, blockIdx.x + gridDim.x, ...
template <Mode M, int KS>
__global__ void __launch_bounds__(kThreads, 2) grad_input_kernel(const Params p) {
  using io_t = typename ModeTraits<M>::io_t;
  constexpr int kCW = 8 * KS;
  extern __shared__ __align__(16) uint32_t smem[];
  uint32_t* sB = smem;
  uint32_t* sA = sB + 27 * kCW * kBlockN;
  uint32_t* sC = sA + kCW * kPitch;  // used when kSeparateCodes<M>

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int ci0 = blockIdx.y * kBlockN;

  bool w_unsafe = false;
  if (p.nchunks == 1) w_unsafe = stage_weights<M, KS>(p, sB, ci0, 0);
  // Strict float32: whether every weight word may take the simpler split (block-uniform; also a barrier).
  bool w_safe = false;
  if constexpr (M == Mode::kStrict) w_safe = !__syncthreads_or(w_unsafe);
  (void)w_safe;

  int a_base[kMT], row_d[kMT], row_h[kMT];
#pragma unroll
  for (int i = 0; i < kMT; ++i) {
    const int mi = warp * kMT + i;
    row_d[i] = mi >> 2;
    row_h[i] = (mi & 3) * 2;
    a_base[i] = ((row_d[i] + 1) * kHH + row_h[i] + 1) * kHW + 1 + g + t * kPitch;
  }

  for (int64_t tile = blockIdx.x; tile < p.n_tiles; tile += gridDim.x) {
    int64_t rem = tile;
    const int w0 = static_cast<int>(rem % p.tiles_w) * kTW;
    rem /= p.tiles_w;
    const int h0 = static_cast<int>(rem % p.tiles_h) * kTH;
    rem /= p.tiles_h;
    const int d0 = static_cast<int>(rem % p.tiles_d) * kTD;
    const int n = static_cast<int>(rem / p.tiles_d);

    float acc[kMT][kNT][4];
#pragma unroll
    for (int i = 0; i < kMT; ++i)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][nt][j] = 0.f;

    for (int c = 0; c < p.nchunks; ++c) {
      __syncthreads();  // the previous chunk's (or tile's) reads of shared memory are done
      bool unsafe = false;
      if (p.nchunks > 1) unsafe = stage_weights<M, KS>(p, sB, ci0, c);
      if (p.g_channels_last) {
        unsafe |= stage_grad<M, kCW>(p, sA, sC, n, d0, h0, w0, c);
      } else {
        unsafe |= stage_grad_planar<M, kCW>(p, sA, sC, n, d0, h0, w0, c);
      }
      if constexpr (M == Mode::kStrict) {
        const bool safe = !__syncthreads_or(unsafe) && (p.nchunks > 1 || w_safe);
        if (safe) {
          accumulate<M, KS, true>(acc, sA, sC, sB, a_base, lane);
        } else {
          accumulate<M, KS, false>(acc, sA, sC, sB, a_base, lane);
        }
      } else {
        (void)unsafe;
        __syncthreads();
        accumulate<M, KS, false>(acc, sA, sC, sB, a_base, lane);
      }
    }

    // Stores through grad_input's strides, int64 offsets.
#pragma unroll
    for (int i = 0; i < kMT; ++i) {
      const int d = d0 + row_d[i];
      const int w = w0 + g;
      if (d >= p.D || w >= p.W) continue;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int h = h0 + row_h[i] + (j >> 1);
        if (h >= p.H) continue;
        const int64_t at = static_cast<int64_t>(n) * p.si[0] + static_cast<int64_t>(d) * p.si[2] +
                           static_cast<int64_t>(h) * p.si[3] + static_cast<int64_t>(w) * p.si[4];
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          const int ci = ci0 + nt * 8 + 2 * t + (j & 1);
          if (ci >= p.Cin) continue;
          static_cast<io_t*>(p.gi)[at + static_cast<int64_t>(ci) * p.si[1]] = from_float<io_t>(acc[i][nt][j]);
        }
      }
    }
  }
}

// Blocks per multiprocessor of one instantiation, asked of the runtime once (the grid only sizes the persistent
// loop, so a stale figure on a different second GPU costs speed, never correctness).
template <Mode M, int KS>
int blocks_per_sm(size_t smem) {
  static std::atomic<int> cache{0};
  int v = cache.load(std::memory_order_relaxed);
  if (v <= 0) {
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, grad_input_kernel<M, KS>, kThreads, smem));
    v = v > 0 ? v : 1;
    cache.store(v, std::memory_order_relaxed);
  }
  return v;
}

template <Mode M, int KS>
void launch_one(const Params& p, cudaStream_t stream) {
  const size_t smem = smem_words<M>(8 * KS) * sizeof(uint32_t);
  auto kernel = grad_input_kernel<M, KS>;
  // Above 48 KB a block needs the opt-in, given once per device.
  static DynamicSmemLimit smem_limit;
  const int device = current_cuda_device();
  smem_limit.raise_to(reinterpret_cast<const void*>(kernel), smem, device);
  const int sms = multiprocessor_count(device);
  const int64_t grid_y = (p.Cin + kBlockN - 1) / kBlockN;
  TORCH_CHECK(grid_y <= 65535,
              "conv_transpose3d_post_pool grad_input: too many input channels for one launch: ", p.Cin);
  const int64_t resident = static_cast<int64_t>(blocks_per_sm<M, KS>(smem)) * sms;
  int64_t bx = (resident + grid_y - 1) / grid_y;
  bx = bx < p.n_tiles ? bx : p.n_tiles;
  bx = bx > 0 ? bx : 1;
  kernel<<<dim3(static_cast<unsigned>(bx), static_cast<unsigned>(grid_y)), kThreads, smem, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Dispatch on the chunk size (k-words: 8 or 16); instantiated per precision in
// grad_input/instantiations/ so that they compile in parallel.
template <Mode M>
void launch_mode(const Params& p, int chunk_words, cudaStream_t stream) {
  static_assert(M != Mode::kTF32, "TF32 takes launch_tf32");
  switch (chunk_words) {
    case 8:
      return launch_one<M, 1>(p, stream);
    case 16:
      return launch_one<M, 2>(p, stream);
    default:
      TORCH_INTERNAL_ASSERT(false, "chunk of ", chunk_words, " k-words");
  }
}

// TF32 (grad_input/kernel_tf32.cuh: the double-buffered kernel; chunks of 8 or 16 k-words).
void launch_tf32(const Params& p, int chunk_words, cudaStream_t stream);
// Shared memory per block of the TF32 kernel at a chunk of 8 or 16 k-words.
size_t tf32_smem_bytes(int chunk_words);

}  // namespace grad_input
}  // namespace conv_transpose3d_post_pool
}  // namespace fused
