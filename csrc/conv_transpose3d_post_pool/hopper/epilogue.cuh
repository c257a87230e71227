// The sm_90a kernel's epilogue (kernel.cuh): from one m64 tile's accumulators (all 8 phases of each of the thread's
// (position, channel) pairs) to the pooled outputs, with the mma.sync kernel's arithmetic and max_pool3d's rules.
#pragma once

#include "conv_transpose3d_post_pool/cuda/output.cuh"
#include "conv_transpose3d_post_pool/cuda/stage.cuh"
#include "conv_transpose3d_post_pool/cuda/tiles.cuh"
#include "conv_transpose3d_post_pool/hopper/geometry.cuh"
#include "common/epilogue.h"

namespace fused {
namespace conv_transpose3d_post_pool {
namespace hopper {

// Everything the epilogue reads per block: the block's multipliers and biases (shared memory), its first channel,
// and the block-uniform form.
struct EpilogueArgs {
  const float* mult;
  const float* bias;
  int co0;
  bool exact;     // else the monotone form: the weights were staged negated for negative multipliers
  bool monotone;  // every channel's activation is monotone (positive slopes, finite non-zero multipliers, finite biases)
};

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
    const float m = a.mult[c], b = a.bias[c];
    best[r] = 0.f;
    sel[r] = 0.f;
    off[r] = 0;
#pragma unroll
    for (int ph = 0; ph < 8; ++ph) {
      float y = acc[phase_slot(ph)][r] + b;
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

// The training form where every channel's activation f is monotone (a.monotone): f is non-decreasing in
// v = y for a positive multiplier and in v = -y for a negative one, so max_pool3d's first strict maximum over the
// activated phases is the first maximum of v — unless an earlier phase's smaller v activates to the same float
// (f's roundings can merge neighbouring values). With `second` the largest v before the first maximum, that cannot
// happen when f(second) < f(max): two activations per output instead of eight. Returns false where it cannot tell
// (such a merge, or a NaN): the caller then takes exact_values for the warp.
template <Mode M, bool MIXED, bool UNIT>
__device__ __forceinline__ bool monotone_training_values(const Params& p, const float (&acc)[8][16], int t,
                                                         const EpilogueArgs& a, float (&best)[16], float (&sel)[16],
                                                         uint32_t (&off)[16]) {
  using io_t = typename ModeTraits<M>::io_t;
  bool ok = true;
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    const int c = acc_channel(r, t);
    const float m = a.mult[c], b = a.bias[c];
    const uint32_t flip = m < 0.f ? 0x80000000u : 0u;
    float top = 0.f, second = -__int_as_float(0x7f800000);
    uint32_t at = 0;
    bool nan = false;
#pragma unroll
    for (int ph = 0; ph < 8; ++ph) {
      float y = acc[phase_slot(ph)][r] + b;
      if constexpr (ModeTraits<M>::kHalf) y = round_to_io<io_t>(y);
      const float v = __uint_as_float(__float_as_uint(y) ^ flip);
      nan |= v != v;
      if (ph == 0) {
        top = v;
      } else {
        const bool up = v > top;
        second = up ? top : second;
        top = up ? v : top;
        at = up ? static_cast<uint32_t>(ph) : at;
      }
    }
    const float y_top = __uint_as_float(__float_as_uint(top) ^ flip);
    const float e = activate<M, MIXED, UNIT>(p, y_top, m);
    const float e_second = activate<M, MIXED, UNIT>(p, __uint_as_float(__float_as_uint(second) ^ flip), m);
    ok = ok && !nan && (at == 0 || e_second < e);
    best[r] = e;
    sel[r] = y_top;
    off[r] = at;
  }
  return ok;
}

// The stores of one m64 tile's pooled outputs: put(o, r) stores the thread's output r (and in the training form its
// selected value and offset) at element offset o.
template <typename Put>
__device__ __forceinline__ void store_outputs(const Params& p, const TileOrigin& u, int mt, int warp, int g, int t,
                                              const EpilogueArgs& a, const Put& put) {
  // A tile wholly inside the output with all of the block's channels present (tile-uniform, so no divergence) stores
  // without guards, each address one 64-bit add from the row's: the guarded form below, with a 64-bit product and a
  // branch per output, took ~18 instructions a store.
  const bool whole = u.qh0 + kTH <= p.PH && u.qw0 + 8 * (mt + 1) <= p.PW && a.co0 + kCoBlock <= p.Cout;
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
    const bool done = TRAIN && !MIXED && a.monotone &&
                      __all_sync(0xffffffffu, monotone_training_values<M, MIXED, true>(p, acc, t, a, best, sel, off));
    if (!done) exact_values<M, TRAIN, MIXED, true>(p, acc, t, a, best, sel, off);
  } else {
    exact_values<M, TRAIN, MIXED, false>(p, acc, t, a, best, sel, off);
  }
}

// One m64 tile's pooled outputs from its accumulators, then their stores.
template <Mode M, bool TRAIN, bool MIXED>
__device__ __forceinline__ void store_tile(const Params& p, const float (&acc)[8][16], const TileOrigin& u, int mt,
                                           int warp, int g, int t, const EpilogueArgs& a) {
  using io_t = typename ModeTraits<M>::io_t;
  using Out = OutputTraits<M, MIXED>;
  float best[16], sel[16];
  uint32_t off[16];
  select_phases<M, TRAIN, MIXED>(p, acc, t, a, best, sel, off);
  store_outputs(p, u, mt, warp, g, t, a, [&](int64_t o, int r) {
    Out::store(p, o, best[r]);
    if constexpr (TRAIN) {
      static_cast<io_t*>(p.sel)[o] = from_float<io_t>(sel[r]);
      p.off[o] = static_cast<uint8_t>(off[r]);
    }
  });
}

// A training tile's outputs between its selection and its stores, in the pipelined consumer loop (kernel.cuh): 34
// registers, which the consumer holds while the next tile's 128 accumulators are in flight. off: the offsets, 4 bits
// each (output r at bits 4 (r % 8) of off[r / 8]).
struct PooledTile {
  float best[16], sel[16];
  uint32_t off[2];
};

template <Mode M, bool MIXED>
__device__ __forceinline__ void pool_tile(const Params& p, const float (&acc)[8][16], int t, const EpilogueArgs& a,
                                          PooledTile& o) {
  uint32_t off[16];
  select_phases<M, true, MIXED>(p, acc, t, a, o.best, o.sel, off);
  o.off[0] = o.off[1] = 0;
#pragma unroll
  for (int r = 0; r < 16; ++r) o.off[r >> 3] |= off[r] << (4 * (r & 7));
}

template <Mode M, bool MIXED>
__device__ __forceinline__ void store_pooled(const Params& p, const PooledTile& o, const TileOrigin& u, int mt,
                                             int warp, int g, int t, const EpilogueArgs& a) {
  using io_t = typename ModeTraits<M>::io_t;
  using Out = OutputTraits<M, MIXED>;
  store_outputs(p, u, mt, warp, g, t, a, [&](int64_t at, int r) {
    Out::store(p, at, o.best[r]);
    static_cast<io_t*>(p.sel)[at] = from_float<io_t>(o.sel[r]);
    p.off[at] = static_cast<uint8_t>((o.off[r >> 3] >> (4 * (r & 7))) & 0xfu);
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
