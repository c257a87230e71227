// The sm_90a kernel's epilogue (kernel.cuh): from one m64 tile's accumulators (all 8 phases of each of the thread's
// (position, channel) pairs) to the pooled outputs, with the mma.sync kernel's arithmetic and max_pool3d's rules.
#pragma once

#include "conv_transpose3d_post_pool/cuda/output.cuh"
#include "conv_transpose3d_post_pool/cuda/stage.cuh"
#include "conv_transpose3d_post_pool/cuda/tiles.cuh"
#include "conv_transpose3d_post_pool/hopper/geometry.cuh"
#include "conv_transpose3d_post_pool/hopper/pair16.cuh"
#include "common/epilogue.h"

namespace fused {
namespace conv_transpose3d_post_pool {
namespace hopper {

// Everything the epilogue reads per block: the block's multipliers and biases (shared memory), its first channel,
// and the block-uniform form.
struct EpilogueArgs {
  const float* mult;
  const float* bias;
  // The training forms' bias as y = acc * acc_sign + sel_bias adds it: the bias, with +0 for a -0 bias where the
  // weights were staged negated (`negated`: there acc is -S; kernel.cuh says why).
  const float* sel_bias;
  int co0;
  bool exact;     // else the monotone form
  bool monotone;  // every channel's activation is monotone (positive slopes, finite non-zero multipliers, finite biases)
  // The weights were staged negated for negative multipliers: the inference forms' monotone form, and the training
  // forms' monotone selection (monotone_training_values; select_pair, with pair_scale_ok); the accumulators then hold
  // -y - bias there.
  bool negated;
};

// The sign an accumulator of channel c carries (-1 where the weights were staged negated, else 1): y = acc * s + b
// exactly (one rounding of an exact product).
__device__ __forceinline__ float acc_sign(const EpilogueArgs& a, float m) { return a.negated && m < 0.f ? -1.f : 1.f; }

// LeakyReLU, x multiplier, LeakyReLU of a convolution value y (already rounded to the I/O dtype), as the mma.sync
// kernel computes it; UNIT: both slopes in (0, 1] (p.unit_slopes), one max per LeakyReLU.
template <Mode M, bool MIXED, bool UNIT>
__device__ __forceinline__ float activate(const Params& p, float y, float m) {
  using Out = OutputTraits<M, MIXED>;
  if constexpr (UNIT) {
    return leaky_unit_slope(Out::mid(leaky_unit_slope(y, p.s1)) * m, p.s2);
  } else {
    return Out::epilogue(y, m, p.s1, p.s2);
  }
}

// Accumulator register r (0..15) of a slot (geometry.cuh: slot j holds phase slot_phase(j)): column chunk r / 4 (8
// channels), row half (r / 2) % 2 (rows g, g + 8 of the warp's 16), channel pair r % 2: channel 8 * (r / 4) + 2 * t +
// r % 2; rows are the tile's pooled rows 2 * warp + half at column g.
__device__ __forceinline__ int acc_channel(int r, int t) { return 8 * (r >> 2) + 2 * t + (r & 1); }

// The monotone form's 16 pooled values of the thread: the max over the phases first (the weights were staged negated
// for negative multipliers), then one epilogue. No control flow inside, so the 16 chains interleave.
template <Mode M, bool MIXED, bool UNIT>
__device__ __forceinline__ void monotone_values(const Params& p, const float (&acc)[8][16], int t,
                                                const EpilogueArgs& a, float (&best)[16]) {
  using io_t = typename ModeTraits<M>::io_t;
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    const int c = acc_channel(r, t);
    const float m = a.mult[c], b = a.bias[c];
    float v = acc[0][r];
#pragma unroll
    for (int j = 1; j < 8; ++j) v = max_nan(v, acc[j][r]);
    float y = (m < 0.f ? -v : v) + b;
    if constexpr (ModeTraits<M>::kHalf) y = round_to_io<io_t>(y);
    best[r] = activate<M, MIXED, UNIT>(p, y, m);
  }
}

// The exact form: every phase's epilogue, then max_pool3d's selection in phase order (and in the training form the
// selected value and its offset).
template <Mode M, bool TRAIN, bool MIXED, bool UNIT>
__device__ __forceinline__ void exact_values(const Params& p, const float (&acc)[8][16], int t, const EpilogueArgs& a,
                                             float (&best)[16], float (&sel)[16], uint32_t (&off)[16]) {
  using io_t = typename ModeTraits<M>::io_t;
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    const int c = acc_channel(r, t);
    const float m = a.mult[c], b = a.bias[c], s = acc_sign(a, m), bs = a.sel_bias[c];
    best[r] = 0.f;
    sel[r] = 0.f;
    off[r] = 0;
#pragma unroll
    for (int ph = 0; ph < 8; ++ph) {
      // (The inference forms' exact form and the mixed forms are never the negated ones.)
      float y = TRAIN && !MIXED ? fmaf(acc[phase_slot(ph)][r], s, bs) : acc[phase_slot(ph)][r] + b;
      if constexpr (ModeTraits<M>::kHalf) y = round_to_io<io_t>(y);
      const float e = activate<M, MIXED, UNIT>(p, y, m);
      // max_pool3d starts from phase 0 whatever its value (an all -inf window reports offset 0).
      const bool take = ph == 0 || takes_max(e, best[r]);
      best[r] = take ? e : best[r];
      if constexpr (TRAIN) {
        sel[r] = take ? y : sel[r];
        off[r] = take ? static_cast<uint32_t>(ph) : off[r];
      }
    }
  }
}

// The float32-output training form where every channel's activation f is monotone (a.monotone) and the weights were
// staged negated for negative multipliers (a.negated): then g(v) = f(y), y = v * sign + sel_bias (the bias added
// and rounded as the exact form does), is non-decreasing in the accumulator v itself, so max_pool3d's first strict
// maximum over the activated phases is the first maximum of v — unless an earlier phase's smaller v activates to
// the same float (the bias's rounding and f's can merge neighbouring values). With `second` the largest v before
// the first maximum, that cannot happen when g(second) < g(max): two activations and no bias adds per output
// instead of eight of each. Returns false where it cannot tell (such a merge, or a NaN, which the running max
// carries to the end): the caller then takes exact_values for the warp.
template <Mode M, bool MIXED, bool UNIT>
__device__ __forceinline__ bool monotone_training_values(const Params& p, const float (&acc)[8][16], int t,
                                                         const EpilogueArgs& a, float (&best)[16], float (&sel)[16],
                                                         uint32_t (&off)[16]) {
  static_assert(!ModeTraits<M>::kHalf, "the 16-bit training forms select from PhasePairs (select_pair)");
  bool ok = true;
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    const int c = acc_channel(r, t);
    const float m = a.mult[c], bs = a.sel_bias[c], s = acc_sign(a, m);
    float top = acc[phase_slot(0)][r], second = -__int_as_float(0x7f800000);
    uint32_t at = 0;
#pragma unroll
    for (int ph = 1; ph < 8; ++ph) {
      const float v = acc[phase_slot(ph)][r];
      const bool up = v > top;
      second = up ? top : second;
      at = up ? static_cast<uint32_t>(ph) : at;
      top = max_nan(top, v);
    }
    const float y_top = fmaf(top, s, bs);
    const float e = activate<M, MIXED, UNIT>(p, y_top, m);
    const float e_second = activate<M, MIXED, UNIT>(p, fmaf(second, s, bs), m);
    ok = ok && e == e && (at == 0 || e_second < e);
    best[r] = e;
    sel[r] = y_top;
    off[r] = at;
  }
  return ok;
}

// Whether tile mt of the unit lies wholly inside the output with all of the block's channels present.
__device__ __forceinline__ bool tile_is_whole(const Params& p, const TileOrigin& u, int mt, const EpilogueArgs& a) {
  return u.qh0 + kTH <= p.PH && u.qw0 + 8 * (mt + 1) <= p.PW && a.co0 + kCoBlock <= p.Cout;
}

// The stores of one m64 tile's pooled outputs: put(o, r) stores the thread's output r (and in the training form its
// selected value and offset) at element offset o.
template <typename Put>
__device__ __forceinline__ void store_outputs(const Params& p, const TileOrigin& u, int mt, int warp, int g, int t,
                                              const EpilogueArgs& a, const Put& put) {
  // A tile wholly inside the output with all of the block's channels present (tile-uniform, so no divergence) stores
  // without guards, each address one 64-bit add from the row's: the guarded form below, with a 64-bit product and a
  // branch per output, took ~18 instructions a store.
  const bool whole = tile_is_whole(p, u, mt, a);
  const int64_t so1 = p.so[1];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int qh = u.qh0 + 2 * warp + half, qw = u.qw0 + 8 * mt + g;
    const bool inside = qh < p.PH && qw < p.PW;
    const int64_t row = static_cast<int64_t>(u.n) * p.so[0] + static_cast<int64_t>(u.qd0) * p.so[2] +
                        static_cast<int64_t>(qh) * p.so[3] + static_cast<int64_t>(qw) * p.so[4];
    if (whole) {
      const int64_t o0 = row + static_cast<int64_t>(a.co0 + 2 * t) * so1;
#pragma unroll
      for (int r4 = 0; r4 < 4; ++r4) {
#pragma unroll
        for (int pair = 0; pair < 2; ++pair) {
          const int r = r4 * 4 + half * 2 + pair;
          put(o0 + (8 * r4 + pair) * so1, r);
        }
      }
      continue;
    }
#pragma unroll
    for (int r4 = 0; r4 < 4; ++r4) {
#pragma unroll
      for (int pair = 0; pair < 2; ++pair) {
        const int r = r4 * 4 + half * 2 + pair;
        const int c = acc_channel(r, t);
        if (inside && a.co0 + c < p.Cout) {
          put(row + static_cast<int64_t>(a.co0 + c) * so1, r);
        }
      }
    }
  }
}

// One m64 tile's pooled values from its accumulators (best; in the training form also sel and off) in the
// block-uniform form, chosen once per tile (not per output), so that the 16 outputs' dependent chains have no
// branches between them and interleave.
template <Mode M, bool TRAIN, bool MIXED>
__device__ __forceinline__ void select_phases(const Params& p, const float (&acc)[8][16], int t, const EpilogueArgs& a,
                                              float (&best)[16], float (&sel)[16], uint32_t (&off)[16]) {
  if (!TRAIN && !a.exact) {
    if (p.unit_slopes) {
      monotone_values<M, MIXED, true>(p, acc, t, a, best);
    } else {
      monotone_values<M, MIXED, false>(p, acc, t, a, best);
    }
  } else if (p.unit_slopes) {
    // a.monotone is block-uniform, so the whole warp takes the vote or none of it does. Not in the mixed form: its
    // first LeakyReLU is rounded to 16 bits, which merges neighbouring values often enough that the vote failed for
    // most warps (mixed training measured 153 us against 94 without the shortcut).
    // (The 16-bit training forms select from PhasePairs instead: store_pairs.)
    bool done = false;
    if constexpr (TRAIN && !MIXED && !ModeTraits<M>::kHalf) {
      done = a.monotone &&
             __all_sync(0xffffffffu, monotone_training_values<M, MIXED, true>(p, acc, t, a, best, sel, off));
    }
    if (!done) exact_values<M, TRAIN, MIXED, true>(p, acc, t, a, best, sel, off);
  } else {
    exact_values<M, TRAIN, MIXED, false>(p, acc, t, a, best, sel, off);
  }
}

// A whole 16-bit inference tile's outputs through the warp's rows in shared memory (L::kOutRowsBytes: [2 rows][32
// channels][8 columns] of the output dtype), where p.out_rows16: each thread puts its 16 outputs there at
// compile-time offsets, then lane l stores channel l's 8 columns of each of the warp's 2 rows as one 16-byte vector —
// 2 global stores a thread where the scalar form takes 16, each with its 64-bit address. Measured (H200, KernelBench
// size, one call): bf16 36.1 -> 32.2 us, fp16 36.1 -> 32.6; the same for the mixed form's float32 rows (4 vectors a
// thread) made it slower, 35.4 -> 43.7 (autocast 41.5 -> 50.4), so those keep the scalar stores.
template <typename T>
__device__ __forceinline__ void store_out_rows(const Params& p, const float (&best)[16], uint8_t* rows,
                                               const TileOrigin& u, int mt, int warp, int g, int t,
                                               const EpilogueArgs& a) {
  constexpr int kVecs = 8 * static_cast<int>(sizeof(T)) / 16;  // 16-byte vectors per row of 8 columns
  static_assert(kVecs == 1, "16-bit rows");
  T* const r_out = reinterpret_cast<T*>(rows);
  __syncwarp();  // the warp's reads of the previous tile's rows are done
#pragma unroll
  for (int r = 0; r < 16; ++r) r_out[(((r >> 1) & 1) * kCoBlock + acc_channel(r, t)) * 8 + g] = from_float<T>(best[r]);
  __syncwarp();
  const int lane = threadIdx.x & 31;
  const int64_t col = static_cast<int64_t>(u.n) * p.so[0] + static_cast<int64_t>(a.co0 + lane) * p.so[1] +
                      static_cast<int64_t>(u.qd0) * p.so[2] + (u.qw0 + 8 * mt);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = half * kCoBlock + lane;
    uint4* const dst =
        reinterpret_cast<uint4*>(static_cast<T*>(p.out) + col + static_cast<int64_t>(u.qh0 + 2 * warp + half) * p.so[3]);
#pragma unroll
    for (int v = 0; v < kVecs; ++v) dst[v] = reinterpret_cast<const uint4*>(r_out)[row * kVecs + v];
  }
}

// One m64 tile's pooled outputs from its accumulators, then their stores (rows: the warp's rows for
// store_out_rows in the 16-bit-output inference forms, else unused).
template <Mode M, bool TRAIN, bool MIXED>
__device__ __forceinline__ void store_tile(const Params& p, const float (&acc)[8][16], const TileOrigin& u, int mt,
                                           int warp, int g, int t, const EpilogueArgs& a, uint8_t* rows) {
  using io_t = typename ModeTraits<M>::io_t;
  using Out = OutputTraits<M, MIXED>;
  float best[16], sel[16];
  uint32_t off[16];
  select_phases<M, TRAIN, MIXED>(p, acc, t, a, best, sel, off);
  if constexpr (!TRAIN && ModeTraits<M>::kHalf && !MIXED) {
    if (p.out_rows16 && tile_is_whole(p, u, mt, a)) {
      store_out_rows<typename Out::out_t>(p, best, rows, u, mt, warp, g, t, a);
      return;
    }
  } else {
    (void)rows;
  }
  store_outputs(p, u, mt, warp, g, t, a, [&](int64_t o, int r) {
    Out::store(p, o, best[r]);
    if constexpr (TRAIN) {
      static_cast<io_t*>(p.sel)[o] = from_float<io_t>(sel[r]);
      p.off[o] = static_cast<uint8_t>(off[r]);
    }
  });
}

// The 16-bit training forms' phases as their selection compares them (the pipelined consumer loop, kernel.cuh): per
// pair of the thread's outputs (r = 2 pr and 2 pr + 1: channels c and c + 1 of one row) and phase, the two values
// y = acc * sign + sel_bias rounded to the I/O dtype, sign-flipped (-y) where the weights were staged negated, in one
// register: rounding y itself and flipping its sign bit keeps a zero's and a NaN's sign as the reference's y has them
// (rounding -y directly gave +0 where y is +0, so the selected value read -0).
// They hold everything the selection and its exact fallback need (y is rounded before the epilogue), so the
// accumulators are free once these 64 registers are made: the next tile's products go out before the selection.
// The sign bits of a pair's halves whose weights were staged negated (acc_sign -1): y's sign flipped there.
__device__ __forceinline__ uint32_t pair_flip(const EpilogueArgs& a, float m0, float m1) {
  return a.negated ? (m0 < 0.f ? 0x8000u : 0u) | (m1 < 0.f ? 0x80000000u : 0u) : 0u;
}

template <Mode M>
struct PhasePairs {
  uint32_t v[8][8];  // [pair][phase]
};

template <Mode M>
__device__ __forceinline__ void pair_phases(const float (&acc)[8][16], int t, const EpilogueArgs& a,
                                            PhasePairs<M>& o) {
#pragma unroll
  for (int pr = 0; pr < 8; ++pr) {
    const int c = acc_channel(2 * pr, t);
    const float b0 = a.sel_bias[c], b1 = a.sel_bias[c + 1];
    const float m0 = a.mult[c], m1 = a.mult[c + 1], s0 = acc_sign(a, m0), s1 = acc_sign(a, m1);
    const uint32_t flip = pair_flip(a, m0, m1);
#pragma unroll
    for (int ph = 0; ph < 8; ++ph) {
      o.v[pr][ph] =
          Pair16<M>::round(fmaf(acc[phase_slot(ph)][2 * pr], s0, b0), fmaf(acc[phase_slot(ph)][2 * pr + 1], s1, b1)) ^
          flip;
    }
  }
}

// The 16-bit training selection's safe range (select_pair): multipliers and slopes whose products keep every float32
// step of the activation normal and finite for the y it accepts.
constexpr float kPairMinY = 0x1p-40f, kPairMaxY = 0x1p100f;
constexpr float kPairMinScale = 0x1p-24f, kPairMaxScale = 0x1p24f;
__host__ __device__ __forceinline__ bool pair_scale_ok(float s) { return s >= kPairMinScale && s <= kPairMaxScale; }

// One pair's pooled outputs from its phases: best (the activated maximum, both rounded to the I/O dtype), sel (the
// selected phase's y, as the dtype's bits) and off (its phase), element h of each in half h. Returns false where it
// cannot tell (the caller then takes exact_pair for the warp).
//
// Where every channel's activation f is monotone and the weights were staged negated for negative multipliers
// (a.negated: the block's monotone form, unit slopes, and every |multiplier| and slope within pair_scale_ok), f is
// non-decreasing in v, so max_pool3d's first strict maximum over the activated phases is the first phase holding the
// largest v — unless an earlier phase's smaller v activates to the same float. It cannot here: y has 8 (bfloat16)
// or 11 (float16) significant bits, so two of its values differ by at least 2^-8 of their size, and f's float32
// steps (y * slope, times the multiplier, times the slope) round at 2^-24 of theirs and cannot merge them while every
// step stays normal and finite — which |y| in [kPairMinY, kPairMaxY] ensures with those scales (2^-112 and 2^124 at
// the extremes; the next value below the maximum, which any merge would have to reach, lies within 2^-7 of it).
// Refused, outside that range: a zero maximum (-0 and +0 tie, and the selected value's sign is the first phase's),
// infinities, NaN.
template <Mode M, bool UNIT>
__device__ __forceinline__ bool select_pair(const Params& p, const uint32_t (&v)[8], float m0, float m1,
                                            uint32_t flip, uint32_t& best, uint32_t& sel, uint32_t& off) {
  using P = Pair16<M>;
  uint32_t top = v[0];
#pragma unroll
  for (int ph = 1; ph < 8; ++ph) top = P::max_nan(top, v[ph]);
  // The first phase equal to the maximum, per half: phases in reverse, each equal one overwriting.
  uint32_t at = 0;
#pragma unroll
  for (int ph = 7; ph >= 0; --ph) {
    const uint32_t eq = P::eq_mask(top, v[ph]);
    at = (eq & (0x10001u * static_cast<uint32_t>(ph))) | (~eq & at);
  }
  sel = top ^ flip;
  const float y0 = P::half(sel, 0), y1 = P::half(sel, 1);
  best = P::round(activate<M, false, UNIT>(p, y0, m0), activate<M, false, UNIT>(p, y1, m1));
  off = at;
  return fabsf(y0) >= kPairMinY && fabsf(y0) <= kPairMaxY && fabsf(y1) >= kPairMinY && fabsf(y1) <= kPairMaxY;
}

// The exact selection of one pair (exact_values' rules), from its phases.
template <Mode M, bool UNIT>
__device__ __forceinline__ void exact_pair(const Params& p, const uint32_t (&v)[8], float m0, float m1,
                                           uint32_t flip, uint32_t& best, uint32_t& sel, uint32_t& off) {
  using P = Pair16<M>;
  float e[2] = {0.f, 0.f};
  uint32_t s[2] = {0u, 0u}, o[2] = {0u, 0u};
#pragma unroll
  for (int ph = 0; ph < 8; ++ph) {
    const uint32_t y = v[ph] ^ flip;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float x = activate<M, false, UNIT>(p, P::half(y, h), h == 0 ? m0 : m1);
      const bool take = ph == 0 || takes_max(x, e[h]);
      e[h] = take ? x : e[h];
      s[h] = take ? (y >> (16 * h)) & 0xffffu : s[h];
      o[h] = take ? static_cast<uint32_t>(ph) : o[h];
    }
  }
  best = P::round(e[0], e[1]);
  sel = s[0] | s[1] << 16;
  off = o[0] | o[1] << 16;
}

// The selection of one pair in the block-uniform form: the monotone one, voted on by the warp, else the exact one.
template <Mode M>
__device__ __forceinline__ void pool_pair(const Params& p, const uint32_t (&v)[8], int c, const EpilogueArgs& a,
                                          uint32_t& best, uint32_t& sel, uint32_t& off) {
  const float m0 = a.mult[c], m1 = a.mult[c + 1];
  const uint32_t flip = pair_flip(a, m0, m1);
  if (p.unit_slopes) {
    // a.negated is block-uniform, so the whole warp takes the vote or none of it does.
    const bool done = a.negated && __all_sync(0xffffffffu, select_pair<M, true>(p, v, m0, m1, flip, best, sel, off));
    if (!done) exact_pair<M, true>(p, v, m0, m1, flip, best, sel, off);
  } else {
    exact_pair<M, false>(p, v, m0, m1, flip, best, sel, off);
  }
}

// A 16-bit training tile's selection, pair by pair (each pair's phases dead after it), then its stores. (Through the
// warp's rows in shared memory, as store_out_rows, its 48 scalar stores became 6 vector ones, and bf16 training
// measured 79.8 -> 82.6 us, fp16 77.4 -> 82.5: not kept.)
template <Mode M>
__device__ __forceinline__ void store_pairs(const Params& p, const PhasePairs<M>& in, const TileOrigin& u, int mt,
                                            int warp, int g, int t, const EpilogueArgs& a) {
  uint32_t best[8], sel[8], off[8];
#pragma unroll
  for (int pr = 0; pr < 8; ++pr) pool_pair<M>(p, in.v[pr], acc_channel(2 * pr, t), a, best[pr], sel[pr], off[pr]);
  store_outputs(p, u, mt, warp, g, t, a, [&](int64_t at, int r) {
    const int sh = 16 * (r & 1);
    static_cast<uint16_t*>(p.out)[at] = static_cast<uint16_t>(best[r >> 1] >> sh);
    static_cast<uint16_t*>(p.sel)[at] = static_cast<uint16_t>(sel[r >> 1] >> sh);
    p.off[at] = static_cast<uint8_t>(off[r >> 1] >> sh);
  });
}

// Pooled outputs of the unit's columns [col0, col0 + cols) (the tiles this warpgroup stored; another block or consumer
// may store the rest of the unit later) recomputed exactly from global memory, one thread per (position, channel) of
// the warpgroup (ctid 0..127), after the warpgroup's stores (the caller's barrier). EDGES_ONLY: only those on the
// input's far edge. Two uses: where the block saw an infinite or NaN weight, the tensor cores multiplied it by the zero
// staged for a missing neighbour (q + 1 past the input), NaN where the convolution has no term, so the far edge is
// redone (fix_unit_edges); strict float32's blocks whose weights have a non-finite high part redo every output
// (kernel.cuh).
template <Mode M, bool TRAIN, bool MIXED, bool CAST, bool EDGES_ONLY>
__device__ void recompute_unit(const Params& p, const TileOrigin& u, int co0, int ctid, int col0, int cols) {
  for (int i = ctid; i < kTH * cols * kCoBlock; i += 128) {
    const int co = co0 + i % kCoBlock;
    const int qw = u.qw0 + col0 + (i / kCoBlock) % cols;
    const int qh = u.qh0 + i / (kCoBlock * cols);
    if (co >= p.Cout || qh >= p.PH || qw >= p.PW) continue;
    if (EDGES_ONLY && u.qd0 + 1 < p.D && qh + 1 < p.H && qw + 1 < p.W) continue;
    recompute_exact_output<M, TRAIN, MIXED, CAST>(p, u.n, u.qd0, qh, qw, co);
  }
}

template <Mode M, bool TRAIN, bool MIXED, bool CAST>
__device__ __forceinline__ void fix_unit_edges(const Params& p, const TileOrigin& u, int co0, int ctid, int col0,
                                               int cols) {
  recompute_unit<M, TRAIN, MIXED, CAST, true>(p, u, co0, ctid, col0, cols);
}

}  // namespace hopper
}  // namespace conv_transpose3d_post_pool
}  // namespace fused
