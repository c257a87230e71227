// Staging of the fused transposed convolution's operands into shared memory (kernel.cuh), and
// the scalar path that recomputes a conv value exactly where the tensor-core tile cannot.
#pragma once

#include "conv_transpose3d_post_pool/cuda/output.cuh"
#include "conv_transpose3d_post_pool/cuda/params.cuh"
#include "conv_transpose3d_post_pool/cuda/source.cuh"
#include "conv_transpose3d_post_pool/cuda/tiles.cuh"
#include "common/epilogue.h"

#include <cstdint>

namespace fused {
namespace conv_transpose3d_post_pool {

__device__ __forceinline__ bool finite_bits16(uint32_t bits, bool bf16) {
  return bf16 ? ((bits >> 7) & 0xffu) != 0xffu : ((bits >> 10) & 0x1fu) != 0x1fu;
}

// Tap index kd * 9 + kh * 3 + kw of the weight used by phase bits (ed, eh, ew) with neighbour offsets
// (td, th, tw): per dim, phase 0 uses tap 1 of neighbour 0; phase 1 uses tap 2 of neighbour 0 and tap 0 of
// neighbour 1 (conv output 2q + e = 2i - 1 + k).
__device__ __forceinline__ int phase_tap(int ed, int eh, int ew, int td, int th, int tw) {
  const int kd = ed ? (td ? 0 : 2) : 1;
  const int kh = eh ? (th ? 0 : 2) : 1;
  const int kw = ew ? (tw ? 0 : 2) : 1;
  return kd * 9 + kh * 3 + kw;
}

// One k-word (chunk-relative `kw`) of tensor `base` with channel stride `sc`, as the mma wants it; returns
// false when a real element is not finite.
template <Mode M, typename Index>
__device__ __forceinline__ uint32_t load_word(const void* base, Index at, Index sc, int kw, int C,
                                              bool& nonfinite) {
  if constexpr (!ModeTraits<M>::kHalf) {
    if (kw >= C) return 0u;
    const float v = static_cast<const float*>(base)[at + kw * sc];
    nonfinite |= !(fabsf(v) < __int_as_float(0x7f800000));
    return M == Mode::kTF32 ? tf32_round(v) : __float_as_uint(v);
  } else {
    const uint16_t* p16 = static_cast<const uint16_t*>(base);
    const int c0 = 2 * kw;
    uint32_t lo = 0u, hi = 0u;
    if (c0 < C) lo = p16[at + c0 * sc];
    if (c0 + 1 < C) hi = p16[at + (c0 + 1) * sc];
    nonfinite |= !finite_bits16(lo, M == Mode::kBF16) || !finite_bits16(hi, M == Mode::kBF16);
    return lo | (hi << 16);
  }
}

// The weight of the block's kBlockN output channels for chunk `chunk`, in B-fragment order: for each tap, k-step
// (8 k-words) and pair of 8-column tiles, 32 lanes x 4 words (tile 0: k-words t, t+4; tile 1: same) so that a
// lane reads its fragments of two column tiles with one 16-byte load. Zero outside Cin / Cout. `negate` (the
// monotone form) stores -w for channels with a negative multiplier, so that the pool's running max of the
// products is the extreme the epilogue needs (negation is exact, NaN and infinities included). Loads are issued
// kBatch at a time before their stores. Returns whether this thread saw a non-finite weight; `unsafe` is set
// (strict float32 only) when a staged word may not take tf32_split_finite.
template <Mode M>
__device__ bool stage_weights(const Params& p, uint32_t* __restrict__ sB, int co0, int chunk, int ksteps,
                              const float* __restrict__ sMult, bool negate, bool& unsafe) {
  constexpr int kBatch = 16;
  const int total = 27 * ksteps * 8 * kBlockN;
  bool nonfinite = false;
  for (int base = threadIdx.x; base < total; base += kBatch * kThreads) {
    uint32_t v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = base + u * kThreads;
      v[u] = 0u;
      const int q = i & 3, ln = (i >> 2) & 31, rest = i >> 7;
      const int ntp = rest & 1, r2 = rest >> 1;
      const int ks = r2 % ksteps, tap = r2 / ksteps;
      const int col = (ntp * 2 + (q >> 1)) * 8 + (ln >> 2);
      const int co = co0 + col;
      if (i < total && co < p.Cout) {
        const int kw = chunk * ksteps * 8 + ks * 8 + (ln & 3) + 4 * (q & 1);
        const int kd = tap / 9, kh = (tap / 3) % 3, kx = tap % 3;
        // int32 offsets: the launcher checks that the weight has fewer than 2^31 elements.
        const int at = co * static_cast<int>(p.sw[1]) + kd * static_cast<int>(p.sw[2]) +
                       kh * static_cast<int>(p.sw[3]) + kx * static_cast<int>(p.sw[4]);
        uint32_t word = load_word<M>(p.w, at, static_cast<int>(p.sw[0]), kw, p.Cin, nonfinite);
        if (negate && sMult[col] < 0.f) word ^= ModeTraits<M>::kHalf ? 0x80008000u : 0x80000000u;
        if constexpr (M == Mode::kStrict) unsafe |= !split_safe(word);
        v[u] = word;
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (base + u * kThreads < total) sB[base + u * kThreads] = v[u];
    }
  }
  return nonfinite;
}

// The input halo of the tile at (n, qd0, qh0, qw0), chunk `chunk`: word (k, position) at k * kPitch + position,
// positions (hd, hh, hw) row-major over kHD x kHH x kHW; zero outside the input (the convolution's missing
// neighbour q + 1 of the last window with output_padding 1, and the tile's overhang). kBatch loads per thread
// are issued before their stores (each is an L2 round trip). Returns (strict float32 only) whether a staged
// word may not take tf32_split_finite.
template <Mode M, int MT>
__device__ bool stage_input(const Params& p, uint32_t* __restrict__ sA, int n, int qd0, int qh0, int qw0,
                            int chunk, int cw) {
  using TS = TileShape<MT>;
  constexpr int kBatch = 8;
  const int total = cw * TS::kHalo;
  const int64_t nbase = static_cast<int64_t>(n) * p.sx[0];
  bool unused = false;
  bool unsafe_words = false;
  for (int base = threadIdx.x; base < total; base += kBatch * kThreads) {
    uint32_t v[kBatch];
    int dst[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = base + u * kThreads;
      v[u] = 0u;
      dst[u] = -1;
      if (i < total) {
        int kl, hp;
        if (p.x_channels_last) {
          kl = i % cw;
          hp = i / cw;
        } else {
          kl = i / TS::kHalo;
          hp = i - kl * TS::kHalo;
        }
        const int hd = hp / (TS::kHH * TS::kHW);
        const int hr = hp - hd * (TS::kHH * TS::kHW);
        const int hh = hr / TS::kHW;
        const int hw = hr - hh * TS::kHW;
        const int d = qd0 + hd, h = qh0 + hh, w = qw0 + hw;
        dst[u] = kl * TS::kPitch + hp;
        if (d < p.D && h < p.H && w < p.W) {
          const int64_t at = nbase + d * p.sx[2] + h * p.sx[3] + w * p.sx[4];
          v[u] = load_word<M>(p.x, at, p.sx[1], chunk * cw + kl, p.Cin, unused);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if constexpr (M == Mode::kStrict) unsafe_words |= !split_safe(v[u]);
      if (dst[u] >= 0) sA[dst[u]] = v[u];
    }
  }
  return unsafe_words;
}

// The same for an input whose w stride is not 1 in channels (NCDHW and the like): rows (k, hd, hh) of the halo,
// 16 threads per row for its first kTileW positions (consecutive w: coalesced), then one pass for the last
// column. Per element only the row decode and one address; the generic loop above pays two divisions more.
// Returns what stage_input returns.
template <Mode M, int MT>
__device__ bool stage_input_rows(const Params& p, uint32_t* __restrict__ sA, int n, int qd0, int qh0, int qw0,
                                 int chunk, int cw) {
  using TS = TileShape<MT>;
  constexpr int kBatch = 8;
  constexpr int kRowsPerWord = TS::kHD * TS::kHH;
  const int rows = cw * kRowsPerWord;
  const int64_t tile = static_cast<int64_t>(n) * p.sx[0] + qd0 * p.sx[2] + qh0 * p.sx[3] + qw0 * p.sx[4];
  bool unused = false;
  bool unsafe_words = false;
  const int lw = threadIdx.x & 15;
  const bool w_ok = qw0 + lw < p.W;
  for (int r0 = threadIdx.x >> 4; r0 < rows; r0 += 16 * kBatch) {
    uint32_t v[kBatch];
    int dst[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int r = r0 + 16 * u;
      const int kl = r / kRowsPerWord, rr = r - kl * kRowsPerWord;
      const int hd = rr / TS::kHH, hh = rr - hd * TS::kHH;
      dst[u] = r < rows ? kl * TS::kPitch + rr * TS::kHW + lw : -1;
      v[u] = r < rows && w_ok && qd0 + hd < p.D && qh0 + hh < p.H
                 ? load_word<M>(p.x, tile + hd * p.sx[2] + hh * p.sx[3] + lw * p.sx[4], p.sx[1], chunk * cw + kl,
                                p.Cin, unused)
                 : 0u;
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if constexpr (M == Mode::kStrict) unsafe_words |= !split_safe(v[u]);
      if (dst[u] >= 0) sA[dst[u]] = v[u];
    }
  }
  const bool last_ok = qw0 + kTileW < p.W;
  for (int r = threadIdx.x; r < rows; r += kThreads) {
    const int kl = r / kRowsPerWord, rr = r - kl * kRowsPerWord;
    const int hd = rr / TS::kHH, hh = rr - hd * TS::kHH;
    const uint32_t word =
        last_ok && qd0 + hd < p.D && qh0 + hh < p.H
            ? load_word<M>(p.x, tile + hd * p.sx[2] + hh * p.sx[3] + kTileW * p.sx[4], p.sx[1], chunk * cw + kl,
                           p.Cin, unused)
            : 0u;
    if constexpr (M == Mode::kStrict) unsafe_words |= !split_safe(word);
    sA[kl * TS::kPitch + rr * TS::kHW + kTileW] = word;
  }
  return unsafe_words;
}

// Tile `tile` of the grid (tiles.cuh).
__device__ __forceinline__ TileOrigin tile_origin(const Params& p, int64_t tile, int tile_d) {
  return decode_tile(tile, p.n_tiles, p.tiles_d, p.tiles_h, p.tiles_w, tile_d, kTileH, kTileW);
}

// The halo words of one chunk that one thread stages, numbered as "items" so that a tile's staging can be split
// into slices issued while the previous tile computes. Thread tid owns halo positions tid + kThreads * j (j <
// kPositions) and stages all k-words of each: item k is k-word k % kWords of its position k / kWords. Per slice a
// thread decodes its position once and steps through channels by their stride, and the shared-memory index is the
// position plus a constant per k-word (an immediate offset), so an item costs a few instructions beyond its load.
// Consecutive threads hold consecutive positions: coalesced in w for NCDHW-like inputs; for channels_last a
// thread's k-words are consecutive in memory (served from L1 after the first).
template <int MT, int KS>
struct HaloItems {
  using TS = TileShape<MT>;
  static constexpr int kWords = 8 * KS;
  static constexpr int kPositions = (TS::kHalo + kThreads - 1) / kThreads;
  static constexpr int kItems = kPositions * kWords;
  // Items per slice when a tile's staging is spread over its 8 phases.
  static constexpr int kPerSlice = (kItems + 7) / 8;  // at least the largest slice_begin difference
};

// First item of slice `ph` of 8 (slice 8 = the end).
template <typename HI>
__device__ __forceinline__ constexpr int slice_begin(int ph) { return ph * HI::kItems / 8; }

// threadIdx.x read where it is used: what is computed from it cannot be hoisted out of the tile loop, where it
// would occupy registers (or spill) for the whole loop to save a few integer instructions per item.
__device__ __forceinline__ int tid_here() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
}

// Element offset in x of halo position hp of the tile at `o` (k-word 0), or -1 where it lies outside the input
// (its words are zero: the convolution's missing neighbour q + 1, the tile's overhang).
template <int MT>
__device__ __forceinline__ int64_t halo_base(const Params& p, const TileOrigin& o, int hp) {
  using TS = TileShape<MT>;
  const int hd = hp / (TS::kHH * TS::kHW);
  const int hr = hp - hd * (TS::kHH * TS::kHW);
  const int hh = hr / TS::kHW;
  const int hw = hr - hh * TS::kHW;
  const int d = o.qd0 + hd, h = o.qh0 + hh, w = o.qw0 + hw;
  if (d >= p.D || h >= p.H || w >= p.W) return -1;
  return static_cast<int64_t>(o.n) * p.sx[0] + d * p.sx[2] + h * p.sx[3] + w * p.sx[4];
}

// The raw bits of k-word `kl` at element offset `at` (halo_base): one float32, or the two 16-bit channels of the
// word; zero past Cin. Only loads: the conversion to the mma's word (word_of_raw) waits for them.
template <Mode M>
constexpr int kRawPerWord = ModeTraits<M>::kHalf ? 2 : 1;

template <Mode M>
__device__ __forceinline__ void halo_word_raw(const Params& p, int64_t at, int kl, uint32_t (&raw)[kRawPerWord<M>]) {
#pragma unroll
  for (int r = 0; r < kRawPerWord<M>; ++r) raw[r] = 0u;
  if constexpr (!ModeTraits<M>::kHalf) {
    if (kl < p.Cin) raw[0] = __float_as_uint(ld_pinned_f32(static_cast<const float*>(p.x) + (at + kl * p.sx[1])));
  } else {
    const uint16_t* p16 = static_cast<const uint16_t*>(p.x) + (at + 2 * kl * p.sx[1]);
    if (2 * kl < p.Cin) raw[0] = ld_pinned_u16(p16);
    if (2 * kl + 1 < p.Cin) raw[1] = ld_pinned_u16(p16 + p.sx[1]);
  }
}

// The staged word of raw bits, as load_word makes it.
template <Mode M>
__device__ __forceinline__ uint32_t word_of_raw(const uint32_t (&raw)[kRawPerWord<M>]) {
  if constexpr (ModeTraits<M>::kHalf) {
    return raw[0] | (raw[1] << 16);
  } else {
    return M == Mode::kTF32 ? tf32_round(__uint_as_float(raw[0])) : raw[0];
  }
}
template <Mode M>
__device__ __forceinline__ uint32_t word_of_raw(uint32_t raw) {
  static_assert(!ModeTraits<M>::kHalf, "a 16-bit word has two raw halves");
  return M == Mode::kTF32 ? tf32_round(__uint_as_float(raw)) : raw;
}

// Items [k0, k0 + kPerSlice) of this thread, loaded into registers: the loads are issued here and stored later, so
// their latency overlaps whatever runs in between. One register per item: float32 keeps the raw bits (converted
// at the store); a 16-bit pair is packed at the load, which waits for it, since two raw halves per item made
// those instantiations spill.
template <Mode M, int MT, int KS>
struct HaloSlice {
  uint32_t v[HaloItems<MT, KS>::kPerSlice];
};

template <Mode M, int MT, int KS>
__device__ __forceinline__ void load_halo_slice(const Params& p, const TileOrigin& o, int k0, int k_end,
                                                HaloSlice<M, MT, KS>& s) {
  using HI = HaloItems<MT, KS>;
  const int tid = tid_here();
#pragma unroll
  for (int u = 0; u < HI::kPerSlice; ++u) {
    const int k = k0 + u, hp = tid + kThreads * (k / HI::kWords);
    uint32_t raw[kRawPerWord<M>] = {};
    if (k < k_end && hp < TileShape<MT>::kHalo) {
      const int64_t at = halo_base<MT>(p, o, hp);  // the same for the slice's items of one position
      if (at >= 0) halo_word_raw<M>(p, at, k % HI::kWords, raw);
    }
    s.v[u] = ModeTraits<M>::kHalf ? word_of_raw<M>(raw) : raw[0];
  }
}

// Stores a slice's words; returns (strict float32 only) whether a word may not take tf32_split_finite.
template <Mode M, int MT, int KS>
__device__ __forceinline__ bool store_halo_slice(const Params& p, uint32_t* __restrict__ sA, int k0, int k_end,
                                                 const HaloSlice<M, MT, KS>& s) {
  using TS = TileShape<MT>;
  using HI = HaloItems<MT, KS>;
  (void)p;
  const int tid = tid_here();
  bool unsafe = false;
#pragma unroll
  for (int u = 0; u < HI::kPerSlice; ++u) {
    const int k = k0 + u, hp = tid + kThreads * (k / HI::kWords);
    if (k < k_end && hp < TS::kHalo) {
      uint32_t word = s.v[u];
      if constexpr (!ModeTraits<M>::kHalf) word = word_of_raw<M>(s.v[u]);
      if constexpr (M == Mode::kStrict) unsafe |= !split_safe(word);
      // Volatile, like the loads, so that it stays after the phase's math (it waits for its load).
      const uint32_t* at = sA + (k % HI::kWords) * TS::kPitch + hp;
      asm volatile("st.shared.u32 [%0], %1;" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(at))), "r"(word)
                   : "memory");
    }
  }
  return unsafe;
}

// A scalar operand as the tensor cores would see it (TF32-rounded for kTF32; CAST: source.cuh).
template <Mode M, bool CAST = false>
__device__ __forceinline__ float operand(const void* base, int64_t at) {
  if constexpr (!ModeTraits<M>::kHalf) {
    const float v = static_cast<const float*>(base)[at];
    return M == Mode::kTF32 ? __uint_as_float(tf32_round(v)) : v;
  } else {
    return Source<M, CAST>::value(base, at);
  }
}

// Conv output (before bias) of phase `ph` at pooled (n, qd, qh, qw), channel co, from global memory with only
// the in-range neighbours.
template <Mode M, bool CAST = false>
__device__ float scalar_phase_value(const Params& p, int n, int qd, int qh, int qw, int co, int ph) {
  const int ed = ph >> 2, eh = (ph >> 1) & 1, ew = ph & 1;
  float s = 0.f;
  for (int td = 0; td <= ed; ++td) {
    for (int th = 0; th <= eh; ++th) {
      for (int tw = 0; tw <= ew; ++tw) {
        const int d = qd + td, h = qh + th, w = qw + tw;
        if (d >= p.D || h >= p.H || w >= p.W) continue;
        const int tap = phase_tap(ed, eh, ew, td, th, tw);
        const int64_t xat = n * p.sx[0] + d * p.sx[2] + h * p.sx[3] + w * p.sx[4];
        const int64_t wat = co * p.sw[1] + (tap / 9) * p.sw[2] + ((tap / 3) % 3) * p.sw[3] + (tap % 3) * p.sw[4];
        for (int c = 0; c < p.Cin; ++c) {
          s = fmaf(operand<M, CAST>(p.x, xat + c * p.sx[1]), operand<M, CAST>(p.w, wat + c * p.sw[0]), s);
        }
      }
    }
  }
  return s;
}

// Pooled output (n, co, qd, qh, qw) (and in the training form its selected value and offset) recomputed from global
// memory with the exact epilogue and selection: the fix-up of both fused kernels where a non-finite weight met a
// missing neighbour's zero.
template <Mode M, bool TRAIN, bool MIXED, bool CAST = false>
__device__ void recompute_exact_output(const Params& p, int n, int qd, int qh, int qw, int co) {
  using io_t = typename ModeTraits<M>::io_t;
  using Out = OutputTraits<M, MIXED>;
  const float m = Out::multiplier(p, co);
  const bool has_bias = p.bias != nullptr;
  const float b = has_bias ? Source<M, CAST>::value(p.bias, co) : 0.f;
  float best = 0.f, sel = 0.f;
  int off = 0;
  for (int ph = 0; ph < 8; ++ph) {
    float y = pre_activation(scalar_phase_value<M, CAST>(p, n, qd, qh, qw, co, ph), b, has_bias);
    if constexpr (ModeTraits<M>::kHalf) y = round_to_io<io_t>(y);
    const float e = Out::epilogue(y, m, p.s1, p.s2);
    if (ph == 0 || takes_max(e, best)) {
      best = e;
      sel = y;
      off = ph;
    }
  }
  const int64_t o = n * p.so[0] + co * p.so[1] + qd * p.so[2] + qh * p.so[3] + qw * p.so[4];
  Out::store(p, o, best);
  if constexpr (TRAIN) {
    static_cast<io_t*>(p.sel)[o] = from_float<io_t>(sel);
    p.off[o] = static_cast<uint8_t>(off);
  }
}

// The tile multiplies a missing neighbour's zero (q + 1 past the input, last window with output_padding 1) by
// its weight, which is NaN for an infinite or NaN weight where the convolution has no term at all. Blocks that
// saw such a weight recompute those pooled outputs here, one thread per (position, channel), with the exact
// selection (the monotone form would give the same value up to a zero's sign).
template <Mode M, bool TRAIN, bool MIXED>
__device__ void fix_missing_neighbours(const Params& p, int n, int qd0, int qh0, int qw0, int td_tile, int co0) {
  const int count = td_tile * kTileH * kTileW * kBlockN;
  for (int i = threadIdx.x; i < count; i += kThreads) {
    const int co = co0 + i % kBlockN;
    int r = i / kBlockN;
    const int qw = qw0 + r % kTileW;
    r /= kTileW;
    const int qh = qh0 + r % kTileH;
    const int qd = qd0 + r / kTileH;
    if (co >= p.Cout || qd >= p.PD || qh >= p.PH || qw >= p.PW) continue;
    if (qd + 1 < p.D && qh + 1 < p.H && qw + 1 < p.W) continue;
    recompute_exact_output<M, TRAIN, MIXED>(p, n, qd, qh, qw, co);
  }
}

}  // namespace conv_transpose3d_post_pool
}  // namespace fused
