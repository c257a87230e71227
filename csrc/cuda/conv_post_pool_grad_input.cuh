// The input gradient of the fused transposed convolution (contract: conv_post_pool_backward.h) as an implicit GEMM
// on the tensor cores: M = input positions, N = input channels, K = output channels, over the 27 taps.
//
// Per dim, input i feeds conv outputs 2i - 1 + k: tap 1 -> window q = i (phase bit 0), tap 2 -> q = i (bit 1),
// tap 0 -> q = i - 1 (bit 1). So the taps group by their window shift delta = i - q (0 or 1 per dim): shift delta
// serves 2 taps per dim with delta 0 and 1 per dim with delta 1 (8 + 3 * 4 + 3 * 2 + 1 = 27), and a pooled gradient
// value reaches tap t only when its saved window offset is t's phase. A block stages the pooled gradient of its
// tile with a one-window halo on the low side (and, per word, the phases), plus the weight of its 16 input
// channels; per shift a warp loads each A fragment once and, for each tap of that shift, masks it by phase
// (one test and one select per word) before the mma. Masked-out words are zeros that still multiply the
// weight, as a convolution over the scattered full-resolution gradient (zero-padded) multiplies its zeros: an
// infinite or NaN weight makes NaN wherever that convolution would.
//
// The work of a block is a sequence of units (tile, chunk of output channels). The staged gradient is double
// buffered: while a unit's mma run from one buffer, the same threads load the next unit's gradient from global
// memory in eight pieces, one per shift, each stored to the other buffer one or two shifts after its loads were
// issued, so the loads' latency hides behind the mma. One barrier per unit then publishes the next buffer. This
// kernel serves TF32, bf16 and fp16; strict float32 keeps a single-buffered kernel
// (conv_post_pool_grad_input_fp32.cu), whose three-product hot loop needs the registers the staging would hold.
#pragma once

#include "conv_post_pool_mma.cuh"

#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

namespace fused {
namespace conv_pool {
namespace grad_input {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
// Input positions per block tile: kTD x kTH x kTW in (d, h, w). An mma row tile is 2 h-rows x 8 w (rows g at h,
// rows g + 8 at h + 1); each warp holds kMT row tiles, the 8 warps 16 (4 in d x 4 pairs of h rows).
constexpr int kMT = 2;
constexpr int kTD = 4, kTH = 8, kTW = 8;
// The halo: input i needs windows i - 1 and i per dim.
constexpr int kHD = kTD + 1, kHH = kTH + 1, kHW = kTW + 1;
constexpr int kHalo = kHD * kHH * kHW;
// Row pitch of a k-word: = 8 (mod 32), so the 4 k-words x 8 rows of a fragment load hit 32 different banks.
constexpr int kPitch = ((kHalo - 8 + 31) / 32) * 32 + 8;
constexpr int kNT = 2;  // 8-column mma tiles per warp
constexpr int kBlockN = 8 * kNT;
// Halo positions a thread stages: tid + j * kThreads (an immediate offset from the first in every address).
constexpr int kPosPerThread = (kHalo + kThreads - 1) / kThreads;
__device__ __forceinline__ int halo_position(int j) { return static_cast<int>(threadIdx.x) + j * kThreads; }
static_assert(kWarps * kMT == (kTD * kTH / 2), "one row tile per (d, h pair) of the block tile");
static_assert(kTW == 8, "a row tile holds 8 w positions per h row");
static_assert(kPosPerThread == 2, "the staging loops assume two halo positions per thread");

// TF32 keeps the phase as a one-hot bit (bits 0..7) in each staged word: TF32 rounding clears the low 13 bits
// and the tensor cores ignore them, so the word goes to the mma as it is. The 16-bit modes keep a 16-bit code per
// staged word (its two phases; code16_to_f16x2 turns it into f16 values compared by one f16x2 set.eq). Strict
// float32 (its own kernel) keeps a code word per staged word.
template <Mode M>
constexpr bool kSeparateCodes = M != Mode::kTF32;

// Words of one weight buffer (27 taps x KS k-steps x 32 lanes x 4) and of one gradient buffer (values, then the
// codes where kept separately).
template <int KS>
constexpr int kWeightWords = 27 * KS * 128;
// (16-bit modes keep their two phases per k-word as one 16-bit code: half a word)
template <Mode M, int KS>
constexpr int kGradWords = (M == Mode::kTF32 ? 2 : 3) * kPitch * 8 * KS / 2;

// Weight buffers, then two gradient buffers. Two weight buffers hold all of the weight when it spans at most two
// chunks, else the current and the next chunk's; the 16-bit modes' 16-word chunks (taken only when one chunk holds
// all of Cout) keep one, so that two blocks still fit a multiprocessor.
template <Mode M, int KS>
constexpr int kWeightBuffers = ModeTraits<M>::kHalf && KS == 2 ? 1 : 2;
template <Mode M, int KS>
constexpr size_t smem_bytes() {
  return static_cast<size_t>(kWeightBuffers<M, KS> * kWeightWords<KS> + 2 * kGradWords<M, KS>) * sizeof(uint32_t);
}

// The shift of the si-th step of a unit (bits dd dh dw): ordered by rising tap count (1, 2, 2, 2, 4, 4, 4, 8), so
// that the pieces loaded last, which have the fewest steps left to hide their latency, see the longest steps.
__host__ __device__ constexpr int shift_at(int si) { return si == 3 ? 3 : si == 4 ? 4 : 7 - si; }

struct Params {
  const void* g;       // grad_conv [N, Cout, PD, PH, PW]
  const uint8_t* off;  // offsets, the same strides
  const void* w;       // weight [Cin, Cout, 3, 3, 3]
  void* gi;            // grad_input [N, Cin, D, H, W]
  int64_t sg[5];
  int64_t sw[5];
  int64_t si[5];
  int64_t n_tiles;
  int N, Cin, Cout, D, H, W, PD, PH, PW;
  int tiles_d, tiles_h, tiles_w;
  int nchunks;
};

// The code a 16-bit mode keeps for phase `ph` (0..7): the f16 with exponent field ph, so the codes are distinct,
// finite and compare equal exactly when the phases are (set.eq.f16x2 below; 0 is the only zero).
__host__ __device__ constexpr uint32_t phase_code16(uint32_t ph) { return ph << 10; }

// The f16x2 codes (phase_code16 per half) from a staged 16-bit code holding the phases << 2 in its two bytes:
// byte 0 to bits 8..15, byte 1 to bits 24..31.
__device__ __forceinline__ uint32_t code16_to_f16x2(uint32_t code16) { return __byte_perm(code16, 0u, 0x1404); }

// Per-half all-ones mask where the f16x2 codes equal `c` in both halves.
__device__ __forceinline__ uint32_t eq_mask16(uint32_t codes, uint32_t c) {
  uint32_t m;
  asm("set.eq.u32.f16x2 %0, %1, %2;" : "=r"(m) : "r"(codes), "r"(c));
  return m;
}

// `a` where its bit `bit` is set, else 0: one LOP3 that sets a predicate and one select (written out in PTX: as
// C++ the compiler builds the mask from shifts, one instruction more per word).
__device__ __forceinline__ uint32_t keep_if_bit(uint32_t a, uint32_t bit) {
  uint32_t m;
  asm("{\n\t.reg .pred q;\n\t.reg .b32 t;\n\tand.b32 t, %1, %2;\n\tsetp.ne.u32 q, t, 0;\n\t"
      "selp.b32 %0, %1, 0, q;\n\t}"
      : "=r"(m)
      : "r"(a), "r"(bit));
  return m;
}

// The dynamic shared memory of the kernel (layout: grad_input_kernel).
extern __shared__ __align__(16) uint32_t smem[];

// Loads are written as a select on a plain load so that they compile to predicated loads with no branch around
// them: a batch of them is then in flight at once, and the conversions run after the batch.
template <typename T>
__device__ __forceinline__ uint32_t load_if(bool ok, const T* ptr) {
  return ok ? static_cast<uint32_t>(__ldg(ptr)) : 0u;
}
__device__ __forceinline__ uint32_t load_if(bool ok, const float* ptr) {
  return ok ? __float_as_uint(__ldg(ptr)) : 0u;
}

// A staged A word and its code from raw loads: `lo`/`hi` the element bits (hi: the second 16-bit channel),
// `plo`/`phi` their window offsets.
template <Mode M>
__device__ __forceinline__ void make_word(uint32_t lo, uint32_t hi, uint32_t plo, uint32_t phi, uint32_t& word,
                                          uint32_t& code) {
  if constexpr (M == Mode::kTF32) {
    // Bits 0..7 are cleared first: the rounding of a NaN may leave them set, and the tensor cores ignore them
    // (a NaN stays NaN; the one-hot phase bit changes no value).
    word = (tf32_round(__uint_as_float(lo)) & ~0xffu) | (1u << (plo & 7u));
    code = 0u;
  } else if constexpr (M == Mode::kStrict) {
    word = lo;
    code = plo & 7u;
  } else {
    word = lo | (hi << 16);
    code = phase_code16(plo & 7u) | (phase_code16(phi & 7u) << 16);
  }
}

// The weight of the block's kBlockN input channels for chunk `chunk` in B-fragment order: per tap and k-step,
// 32 lanes x 4 words (column tile 0: k-words t, t + 4 of column g; column tile 1: the same), so that a lane reads
// both tiles' fragments with one 16-byte load. Zero outside Cin / Cout. Returns (strict float32) whether a staged
// word may not take tf32_split_finite.
template <Mode M, int KS>
__device__ bool stage_weights(const Params& p, uint32_t* __restrict__ sB, int ci0, int chunk) {
  constexpr int kBatch = 12;
  constexpr int kTotal = 27 * KS * 128;
  bool unsafe = false;
  for (int base = threadIdx.x; base < kTotal; base += kBatch * kThreads) {
    uint32_t lo[kBatch], hi[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = base + u * kThreads;
      const int q = i & 3, ln = (i >> 2) & 31, r = i >> 7;
      const int ks = r % KS, tap = r / KS;
      const int ci = ci0 + (q >> 1) * 8 + (ln >> 2);
      const int kw = chunk * KS * 8 + ks * 8 + (ln & 3) + 4 * (q & 1);
      const bool ok = i < kTotal && ci < p.Cin;
      const int kd = tap / 9, kh = (tap / 3) % 3, kx = tap % 3;
      // int32 offsets: the launcher checks that the weight has fewer than 2^31 elements.
      const int at = ok ? ci * static_cast<int>(p.sw[0]) + kd * static_cast<int>(p.sw[2]) +
                              kh * static_cast<int>(p.sw[3]) + kx * static_cast<int>(p.sw[4])
                        : 0;
      const int sc = static_cast<int>(p.sw[1]);
      if constexpr (!ModeTraits<M>::kHalf) {
        lo[u] = load_if(ok && kw < p.Cout, static_cast<const float*>(p.w) + at + kw * sc);
        hi[u] = 0u;
      } else {
        const uint16_t* w16 = static_cast<const uint16_t*>(p.w) + at;
        lo[u] = load_if(ok && 2 * kw < p.Cout, w16 + 2 * kw * sc);
        hi[u] = load_if(ok && 2 * kw + 1 < p.Cout, w16 + (2 * kw + 1) * sc);
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      uint32_t v;
      if constexpr (M == Mode::kTF32) {
        v = tf32_round(__uint_as_float(lo[u]));
      } else {
        v = lo[u] | (hi[u] << 16);
      }
      if constexpr (M == Mode::kStrict) unsafe |= !split_safe(v);
      if (base + u * kThreads < kTotal) sB[base + u * kThreads] = v;
    }
  }
  return unsafe;
}

// Stages the pooled gradient of one unit (tile at (n, d0, h0, w0), chunk `chunk` of 8 * KS k-words) over the
// windows q = i0 - 1 .. i0 + kT - 1 per dim: word (k, halo position) at k * kPitch + position; zero (phase 0)
// outside the pooled extent and past Cout. Each thread keeps its two halo positions (decoded and bounds-checked
// once per unit) and walks their channels with one address step each, through any strides. Piece k (of 8) holds
// k-words k * KS .. k * KS + KS - 1; its loads land in slot k % kDepth, so kDepth pieces can be in flight (two for
// the 16-bit modes' 16-word chunks, whose pieces take eight loads per position).
template <Mode M, int KS>
struct GradStager {
  static constexpr int kDepth = ModeTraits<M>::kHalf && KS == 2 ? 2 : 3;
  static constexpr int kCh = ModeTraits<M>::kHalf ? 2 : 1;  // channels per k-word
  using elem_t = std::conditional_t<ModeTraits<M>::kHalf, uint16_t, float>;

  const elem_t* gp[kPosPerThread];
  const uint8_t* op[kPosPerThread];
  int avail[kPosPerThread];  // channels of the chunk that exist at the position (0: none, or nothing to stage)
  bool store_ok[kPosPerThread];
  int64_t sc;
  int dst;  // word offset of the destination buffer in smem
  uint32_t lo[kDepth][kPosPerThread][KS], hi[kDepth][kPosPerThread][KS], plo[kDepth][kPosPerThread][KS],
      phi[kDepth][kPosPerThread][KS];

  // `active` false: nothing to stage (the block's last unit); loads and stores are then skipped.
  __device__ __forceinline__ void setup(const Params& p, bool active, int n, int d0, int h0, int w0, int chunk,
                                        int buffer) {
    dst = buffer;
    sc = p.sg[1];
    const int c_first = chunk * 8 * KS * kCh;
#pragma unroll
    for (int j = 0; j < kPosPerThread; ++j) {
      const int hp = halo_position(j);
      const int hd = hp / (kHH * kHW);
      const int hr = hp - hd * (kHH * kHW);
      const int hh = hr / kHW;
      const int hw = hr - hh * kHW;
      const int qd = d0 - 1 + hd, qh = h0 - 1 + hh, qw = w0 - 1 + hw;
      store_ok[j] = active && hp < kHalo;
      const bool inside =
          store_ok[j] && qd >= 0 && qh >= 0 && qw >= 0 && qd < p.PD && qh < p.PH && qw < p.PW;
      const int64_t at = inside ? static_cast<int64_t>(n) * p.sg[0] + qd * p.sg[2] + qh * p.sg[3] +
                                      qw * p.sg[4] + c_first * sc
                                : 0;
      gp[j] = static_cast<const elem_t*>(p.g) + at;
      op[j] = p.off + at;
      avail[j] = inside ? p.Cout - c_first : 0;
    }
  }

  __device__ __forceinline__ void load(int k) {
    const int s = k % kDepth;
#pragma unroll
    for (int j = 0; j < kPosPerThread; ++j)
#pragma unroll
      for (int w = 0; w < KS; ++w) {
        const int c = (k * KS + w) * kCh;
        lo[s][j][w] = load_if(c < avail[j], gp[j] + c * sc);
        plo[s][j][w] = load_if(c < avail[j], op[j] + c * sc);
        hi[s][j][w] = kCh == 2 ? load_if(c + 1 < avail[j], gp[j] + (c + 1) * sc) : 0u;
        phi[s][j][w] = kCh == 2 ? load_if(c + 1 < avail[j], op[j] + (c + 1) * sc) : 0u;
      }
  }

  __device__ __forceinline__ void store(int k) {
    const int s = k % kDepth;
#pragma unroll
    for (int j = 0; j < kPosPerThread; ++j) {
      if (!store_ok[j]) continue;
      const int hp = halo_position(j);
#pragma unroll
      for (int w = 0; w < KS; ++w) {
        uint32_t word, code;
        make_word<M>(lo[s][j][w], hi[s][j][w], plo[s][j][w], phi[s][j][w], word, code);
        const int at = dst + (k * KS + w) * kPitch + hp;
        smem[at] = word;
        if constexpr (ModeTraits<M>::kHalf) {
          // bytes (phase lo << 2, phase hi << 2): code16_to_f16x2 makes the f16x2 codes of make_word from them
          (void)code;
          reinterpret_cast<uint16_t*>(smem + dst + kPitch * 8 * KS)[(k * KS + w) * kPitch + hp] =
              static_cast<uint16_t>(((plo[s][j][w] & 7u) << 2) | ((phi[s][j][w] & 7u) << 10));
        }
      }
    }
  }

  // All eight pieces at once (the first unit, before any mma).
  __device__ __forceinline__ void all() {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      load(k);
      if (k >= kDepth - 1) store(k - (kDepth - 1));
    }
    finish();
  }

  // The pieces still in flight after the eighth load.
  __device__ __forceinline__ void finish() {
#pragma unroll
    for (int k = 8 - (kDepth - 1); k < 8; ++k) store(k);
  }
};

// acc += the staged chunk's products over the 8 shifts and their taps, while `next` stages the next unit: piece
// si's loads before step si, its stores after step si + kDepth - 1. Everything but the thread's base addresses is a
// compile-time constant once the loops are unrolled, so every shared-memory load has an immediate offset.
template <Mode M, int KS>
__device__ __forceinline__ void accumulate(float (&acc)[kMT][kNT][4], const uint32_t* __restrict__ sA,
                                           const uint32_t* __restrict__ sC, const uint32_t* __restrict__ sB,
                                           const int (&a_base)[kMT], int lane, GradStager<M, KS>& next) {
#pragma unroll
  for (int si = 0; si < 8; ++si) {
    next.load(si);
    const int s = shift_at(si);
    const int dd = s >> 2, dh = (s >> 1) & 1, dw = s & 1;
    // window q = i - delta
    const int a_off = -((dd * kHH + dh) * kHW + dw);
    // The 16-bit modes keep a code per word: their k-steps run one at a time to stay in registers.
    constexpr int kUnrollK = M == Mode::kTF32 ? KS : 1;
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
          if constexpr (ModeTraits<M>::kHalf) {
            code[i][r] = code16_to_f16x2(reinterpret_cast<const uint16_t*>(sC)[o + offs[r]]);
          }
        }
      }
#pragma unroll
      for (int bd = dd; bd <= 1; ++bd) {
#pragma unroll
        for (int bh = dh; bh <= 1; ++bh) {
#pragma unroll
          for (int bw = dw; bw <= 1; ++bw) {
            const int kd = dd ? 0 : (bd ? 2 : 1);
            const int kh = dh ? 0 : (bh ? 2 : 1);
            const int kx = dw ? 0 : (bw ? 2 : 1);
            const int tap = (kd * 3 + kh) * 3 + kx;
            const uint32_t ph = static_cast<uint32_t>((bd * 2 + bh) * 2 + bw);
            const uint4 bv = *reinterpret_cast<const uint4*>(sB + ((tap * KS + ks) * 32 + lane) * 4);
            const uint32_t b[kNT][2] = {{bv.x, bv.y}, {bv.z, bv.w}};
#pragma unroll
            for (int i = 0; i < kMT; ++i) {
              uint32_t m[4];
#pragma unroll
              for (int r = 0; r < 4; ++r) {
                if constexpr (M == Mode::kTF32) {
                  m[r] = keep_if_bit(a[i][r], 1u << ph);
                } else {
                  const uint32_t c16 = phase_code16(ph);
                  m[r] = a[i][r] & eq_mask16(code[i][r], c16 | (c16 << 16));
                }
              }
#pragma unroll
              for (int nt = 0; nt < kNT; ++nt) mma<M>(acc[i][nt], m, b[nt][0], b[nt][1]);
            }
          }
        }
      }
    }
    constexpr int kLag = GradStager<M, KS>::kDepth - 1;
    if (si >= kLag) next.store(si - kLag);
  }
  next.finish();
}

// KS: k-steps (8 k-words) per staged chunk. Persistent blocks: each walks the tiles blockIdx.x,
// blockIdx.x + gridDim.x, ..., a unit (tile, chunk) at a time. When the weight spans at most two chunks it is
// staged once (chunk c in buffer c); otherwise each unit's chunk is staged into buffer (unit & 1) at the start of
// the previous unit.
template <Mode M, int KS>
__global__ void __launch_bounds__(kThreads, 2) grad_input_kernel(const Params p) {
  static_assert(M != Mode::kStrict, "strict float32 has its own kernel (conv_post_pool_grad_input_fp32.cu)");
  using io_t = typename ModeTraits<M>::io_t;
  constexpr int g_base = kWeightBuffers<M, KS> * kWeightWords<KS>;
  uint32_t* const sW = smem;           // weight_buffers x kWeightWords
  uint32_t* const sG = smem + g_base;  // 2 x kGradWords: values, then codes
  constexpr int kG = kGradWords<M, KS>;
  constexpr int kCodes = kPitch * 8 * KS;               // offset of the codes in a gradient buffer

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int ci0 = blockIdx.y * kBlockN;
  const int nchunks = p.nchunks;
  const bool resident = nchunks <= 2;
  // (int: the launcher checks that the tiles, and so the units, number fewer than 2^31)
  const int64_t my_tiles = (p.n_tiles - blockIdx.x + gridDim.x - 1) / gridDim.x;
  const int64_t n_units = my_tiles * nchunks;

  int a_base[kMT], row_d[kMT], row_h[kMT];
#pragma unroll
  for (int i = 0; i < kMT; ++i) {
    const int mi = warp * kMT + i;
    row_d[i] = mi >> 2;
    row_h[i] = (mi & 3) * 2;
    a_base[i] = ((row_d[i] + 1) * kHH + row_h[i] + 1) * kHW + 1 + g + t * kPitch;
  }

  // The origin of a tile (int: the launcher checks that tile indices stay below 2^31).
  auto tile_of = [&](int tile, int& n, int& d0, int& h0, int& w0) {
    int rem = tile;
    w0 = (rem % p.tiles_w) * kTW;
    rem /= p.tiles_w;
    h0 = (rem % p.tiles_h) * kTH;
    rem /= p.tiles_h;
    d0 = (rem % p.tiles_d) * kTD;
    n = rem / p.tiles_d;
  };

  // The first unit: its weight (or all of it) and its gradient, before any mma.
  GradStager<M, KS> stager;
  stage_weights<M, KS>(p, sW, ci0, 0);
  if (resident && nchunks == 2) stage_weights<M, KS>(p, sW + kWeightWords<KS>, ci0, 1);
  {
    int n, d0, h0, w0;
    tile_of(static_cast<int>(blockIdx.x), n, d0, h0, w0);
    stager.setup(p, n_units > 0, n, d0, h0, w0, 0, g_base);
    stager.all();
  }
  __syncthreads();

  float acc[kMT][kNT][4];
#pragma unroll
  for (int i = 0; i < kMT; ++i)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][nt][j] = 0.f;

  int tile = static_cast<int>(blockIdx.x), c = 0;  // of unit u
  for (int64_t u = 0; u < n_units; ++u) {
    const int buf = static_cast<int>(u & 1);
    const bool has_next = u + 1 < n_units;
    const int c_next = c + 1 < nchunks ? c + 1 : 0;
    const int tile_next = c_next == 0 ? tile + static_cast<int>(gridDim.x) : tile;
    if (!resident && has_next) stage_weights<M, KS>(p, sW + (buf ^ 1) * kWeightWords<KS>, ci0, c_next);
    {
      int n, d0, h0, w0;
      tile_of(has_next ? tile_next : tile, n, d0, h0, w0);
      stager.setup(p, has_next, n, d0, h0, w0, c_next, g_base + (buf ^ 1) * kG);
    }
    const uint32_t* cur = sG + buf * kG;
    const uint32_t* w_cur = sW + (resident ? c : buf) * kWeightWords<KS>;
    accumulate<M, KS>(acc, cur, cur + kCodes, w_cur, a_base, lane, stager);

    if (c == nchunks - 1) {
      // Stores through grad_input's strides, int64 offsets.
      int n, d0, h0, w0;
      tile_of(tile, n, d0, h0, w0);
#pragma unroll
      for (int i = 0; i < kMT; ++i) {
        const int d = d0 + row_d[i];
        const int w = w0 + g;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int h = h0 + row_h[i] + (j >> 1);
          const bool ok = d < p.D && w < p.W && h < p.H;
          const int64_t at = static_cast<int64_t>(n) * p.si[0] + static_cast<int64_t>(d) * p.si[2] +
                             static_cast<int64_t>(h) * p.si[3] + static_cast<int64_t>(w) * p.si[4];
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) {
            const int ci = ci0 + nt * 8 + 2 * t + (j & 1);
            if (ok && ci < p.Cin)
              static_cast<io_t*>(p.gi)[at + static_cast<int64_t>(ci) * p.si[1]] = from_float<io_t>(acc[i][nt][j]);
            acc[i][nt][j] = 0.f;
          }
        }
      }
    }
    // The next unit's gradient (and weight) are in place and every read of this unit's buffers is done.
    __syncthreads();
    tile = tile_next;
    c = c_next;
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
  TORCH_INTERNAL_ASSERT((kWeightBuffers<M, KS> == 2 || p.nchunks == 1));
  const size_t smem = smem_bytes<M, KS>();
  auto kernel = grad_input_kernel<M, KS>;
  // Above 48 KB a block needs the opt-in (per device, so set on every launch; it does not synchronise).
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  int device = 0, sms = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t grid_y = (p.Cin + kBlockN - 1) / kBlockN;
  TORCH_CHECK(grid_y <= 65535, "conv_post_pool grad_input: too many input channels for one launch: ", p.Cin);
  const int64_t resident = static_cast<int64_t>(blocks_per_sm<M, KS>(smem)) * sms;
  int64_t bx = (resident + grid_y - 1) / grid_y;
  bx = bx < p.n_tiles ? bx : p.n_tiles;
  bx = bx > 0 ? bx : 1;
  kernel<<<dim3(static_cast<unsigned>(bx), static_cast<unsigned>(grid_y)), kThreads, smem, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Dispatch on the chunk size (k-words: 8 or 16); instantiated per precision in
// conv_post_pool_grad_input_{tf32,bf16,fp16}.cu so that they compile in parallel.
template <Mode M>
void launch_mode(const Params& p, int chunk_words, cudaStream_t stream) {
  static_assert(M != Mode::kStrict, "strict float32 takes launch_strict");
  if (chunk_words == 16) return launch_one<M, 2>(p, stream);
  TORCH_INTERNAL_ASSERT(chunk_words == 8, "chunk of ", chunk_words, " k-words");
  return launch_one<M, 1>(p, stream);
}

// Strict float32 (conv_post_pool_grad_input_fp32.cu: the single-buffered kernel; chunks of 8 or 16 k-words).
void launch_strict(const Params& p, int chunk_words, cudaStream_t stream);

}  // namespace grad_input
}  // namespace conv_pool
}  // namespace fused
