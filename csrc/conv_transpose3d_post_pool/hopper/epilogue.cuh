// The sm_90a kernel's epilogue (kernel.cuh): from one m64 tile's accumulators (all 8 phases of each of the thread's
// (position, channel) pairs) to the pooled outputs, with the mma.sync kernel's arithmetic and max_pool3d's rules.
#pragma once

#include "conv_transpose3d_post_pool/cuda/output.cuh"
#include "conv_transpose3d_post_pool/cuda/stage.cuh"
#include "conv_transpose3d_post_pool/cuda/tiles.cuh"
#include "conv_transpose3d_post_pool/hopper/geometry.cuh"
#include "conv_transpose3d_post_pool/hopper/pair16.cuh"
#include "conv_transpose3d_post_pool/hopper/sync.cuh"
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

// Four 8 x 8 matrices of 16-bit elements from the accumulator layout (register j: matrix j's row g, columns 2 t and
// 2 t + 1) into shared memory transposed: lane l gives the address where column l % 8 of matrix l / 8 goes, its
// 8 rows as 16 contiguous bytes.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

// A whole 16-bit inference tile's outputs through the warp's rows in shared memory (L::kOutRowsBytes: [2 rows][32
// channels][8 columns] of the output dtype), where p.out_rows: each thread rounds its outputs in pairs (channels c,
// c + 1 of one row: the accumulator layout's columns) and two transposing stmatrix put them where each channel's 8
// columns lie together, then lane l stores channel l's 8 columns of each of the warp's 2 rows as one 16-byte vector —
// 2 global stores a thread where the scalar form takes 16, each with its 64-bit address. Measured (H200, KernelBench
// size, one call, the rows written by 16 scalar shared stores): bf16 36.1 -> 32.2 us, fp16 36.1 -> 32.6; the same
// for the mixed form's float32 rows (4 vectors a thread, half sectors) made it slower, 35.4 -> 43.7 (autocast
// 41.5 -> 50.4), so those keep the scalar stores.
template <Mode M>
__device__ __forceinline__ void store_out_rows(const Params& p, const float (&best)[16], uint8_t* rows,
                                               const TileOrigin& u, int mt, int warp, const EpilogueArgs& a) {
  using T = typename ModeTraits<M>::io_t;
  constexpr int kRowBytes = kCoBlock * 16;  // one pooled row's 32 channels of 8 columns
  static_assert(out_rows_bytes(M, false, false) >= 2 * kRowBytes, "the warp's rows");
  uint32_t pk[8];
#pragma unroll
  for (int pr = 0; pr < 8; ++pr) pk[pr] = Pair16<M>::round(best[2 * pr], best[2 * pr + 1]);
  const int lane = threadIdx.x & 31;
  const uint32_t base = smem_addr(rows) + 16 * lane;
  __syncwarp();  // the warp's reads of the previous tile's rows are done
#pragma unroll
  for (int h = 0; h < 2; ++h) stmatrix_x4_trans(base + h * kRowBytes, pk[h], pk[2 + h], pk[4 + h], pk[6 + h]);
  __syncwarp();
  const int64_t col = static_cast<int64_t>(u.n) * p.so[0] + static_cast<int64_t>(a.co0 + lane) * p.so[1] +
                      static_cast<int64_t>(u.qd0) * p.so[2] + (u.qw0 + 8 * mt);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    *reinterpret_cast<uint4*>(static_cast<T*>(p.out) + col + static_cast<int64_t>(u.qh0 + 2 * warp + h) * p.so[3]) =
        reinterpret_cast<const uint4*>(rows)[h * kCoBlock + lane];
  }
}

// Where channel ch's half q (q: the even or the odd tile of a pair) lies in the paired rows (store_pair_rows2): the
// halves swap every 4 channels, so that the 8 rows of a transposing stmatrix (8 channels, 32 bytes apart) and a
// lane's reads of the offsets (one channel a lane) meet 32 distinct banks.
__device__ __forceinline__ int pair_half(int ch, int q) { return q ^ ((ch >> 2) & 1); }

// One tensor's paired rows ([2 rows][32 channels][2 halves][16 bytes] at r) out to dst: lane l stores half l % 2 of
// channel rows 16 i + l / 2 (i = 0..3), so lanes 2 m and 2 m + 1 write one whole 32-byte sector and a quarter warp
// reads 128 contiguous bytes. base: the pair's first column's element offset in the warp's (n, d) plane.
__device__ __forceinline__ void store_paired16(const Params& p, uint16_t* dst, const uint4* r, int64_t base,
                                               const TileOrigin& u, int warp, const EpilogueArgs& a) {
  const int lane = threadIdx.x & 31, lq = lane & 1;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int ch = 16 * (i & 1) + (lane >> 1), h = i >> 1;
    const int64_t e = base + static_cast<int64_t>(a.co0 + ch) * p.so[1] +
                      static_cast<int64_t>(u.qh0 + 2 * warp + h) * p.so[3] + 8 * lq;
    *reinterpret_cast<uint4*>(dst + e) = r[2 * (32 * h + ch) + pair_half(ch, lq)];
  }
}

// Two whole 16-bit inference tiles (an item's tiles 2 k and 2 k + 1) stored together through the warp's rows, as
// store_pair_rows2 stores the training forms': each channel row's 16 columns go out as one whole 32-byte sector where
// store_out_rows stores half sectors. The even tile's stmatrix put its halves in place and return; the odd tile's put
// theirs, then every lane stores 4 vectors.
template <Mode M>
__device__ __forceinline__ void store_out_rows2(const Params& p, const float (&best)[16], uint8_t* rows,
                                                const TileOrigin& u, int mt, int warp, const EpilogueArgs& a) {
  constexpr int kRowBytes = kCoBlock * 32;  // one pooled row's 32 channels of 16 columns
  static_assert(out_rows_bytes(M, false, false) >= 2 * kRowBytes, "the warp's paired rows");
  uint32_t pk[8];
#pragma unroll
  for (int pr = 0; pr < 8; ++pr) pk[pr] = Pair16<M>::round(best[2 * pr], best[2 * pr + 1]);
  const int lane = threadIdx.x & 31, q = mt & 1;
  const uint32_t at = smem_addr(rows) + 32 * lane + 16 * pair_half(lane, q);
  __syncwarp();  // the warp's reads of the previous pair's rows are done
#pragma unroll
  for (int h = 0; h < 2; ++h) stmatrix_x4_trans(at + h * kRowBytes, pk[h], pk[2 + h], pk[4 + h], pk[6 + h]);
  if (q == 0) return;
  __syncwarp();
  const int64_t base = static_cast<int64_t>(u.n) * p.so[0] + static_cast<int64_t>(u.qd0) * p.so[2] +
                       (u.qw0 + 8 * (mt - 1));
  store_paired16(p, static_cast<uint16_t*>(p.out), reinterpret_cast<const uint4*>(rows), base, u, warp, a);
}

// One channel's offsets read back from a transposed byte-pair matrix (16 bytes: 8 columns, each column's row 0 byte
// then its row 1 byte) as row h's 8 column bytes.
__device__ __forceinline__ uint2 offset_row(const uint4& o, int h) {
  const uint32_t s = h == 0 ? 0x6420u : 0x7531u;  // row h's byte of each column
  return make_uint2(__byte_perm(o.x, o.y, s), __byte_perm(o.z, o.w, s));
}

// The TF32 forms' float32 rows (store_rows32): the thread's 16 values into [2 rows][32 channels][8 columns], 32
// bytes a channel's row, logical row R (= 32 x row + channel) at row R ^ ((R >> 2) & 1): with that swap the warp's 32
// stores of one register meet 32 distinct banks (rows 2 t + e of the four t fall in four different groups of 8 banks).
__device__ __forceinline__ void put_rows32(uint8_t* rows, const float (&v)[16], int g, int t) {
  float* const w = reinterpret_cast<float*>(rows);
  const int swap = (t >> 1) & 1;
  float* const w0 = w + 8 * (2 * t + swap) + g;        // the thread's channel 8 j + 2 t, row 0
  float* const w1 = w + 8 * (2 * t + (1 ^ swap)) + g;  // channel 8 j + 2 t + 1
#pragma unroll
  for (int r = 0; r < 16; ++r) (r & 1 ? w1 : w0)[8 * (32 * ((r >> 1) & 1) + 8 * (r >> 2))] = v[r];
}

// Lane l's share of the float32 rows: logical rows 16 i + l / 2 (i = 0..3), the half l % 2 of each (16 bytes), so
// that lanes 2 k and 2 k + 1 store a channel row's whole 32 bytes (a full sector) and a quarter warp reads 128
// contiguous bytes.
__device__ __forceinline__ void get_rows32(const uint8_t* rows, int lane, uint4 (&q)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int row = 16 * i + (lane >> 1);
    q[i] = reinterpret_cast<const uint4*>(rows)[2 * (row ^ ((row >> 2) & 1)) + (lane & 1)];
  }
}

// A whole TF32 training tile's stores through the warp's rows in shared memory (L::kOutRowsBytes), where p.out_rows:
// its outputs, then its selected values through the same 2 KB, and its offsets as byte pairs by a transposing
// stmatrix; 4 vector stores a lane and tensor (whole sectors) where the scalar form takes 16 a thread, each with its
// 64-bit address. Not the inference form: its outputs alone through the rows measured 45.0 -> 46.8 us (H100).
__device__ __forceinline__ void store_rows32(const Params& p, const float (&best)[16], const float (&sel)[16],
                                             const uint32_t (&off)[16], uint8_t* rows, const TileOrigin& u, int mt,
                                             int warp, int g, int t, const EpilogueArgs& a) {
  constexpr int kValueBytes = 2 * kCoBlock * 8 * 4;
  static_assert(out_rows_bytes(Mode::kTF32, true, false) >= kValueBytes + kCoBlock * 16, "the warp's rows");
  const int lane = threadIdx.x & 31;
  uint4 qo[4], qs[4];
  __syncwarp();  // the warp's reads of the previous tile's rows are done
  put_rows32(rows, best, g, t);
  // Chunk j's offsets as byte pairs: element e (channel 8 j + 2 t + e) holds row 0's in its low byte and row 1's in
  // its high byte (output r = 4 j + 2 row + e), so the transposed matrix holds each channel's 8 columns x 2 rows.
  uint32_t ob[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) ob[j] = off[4 * j] | off[4 * j + 2] << 8 | off[4 * j + 1] << 16 | off[4 * j + 3] << 24;
  stmatrix_x4_trans(smem_addr(rows + kValueBytes) + 16 * lane, ob[0], ob[1], ob[2], ob[3]);
  __syncwarp();
  get_rows32(rows, lane, qo);
  const uint4 qf = reinterpret_cast<const uint4*>(rows + kValueBytes)[lane];
  __syncwarp();
  put_rows32(rows, sel, g, t);
  __syncwarp();
  get_rows32(rows, lane, qs);
  const int64_t col = static_cast<int64_t>(u.n) * p.so[0] + static_cast<int64_t>(u.qd0) * p.so[2] +
                      (u.qw0 + 8 * mt + 4 * (lane & 1));
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t e = col + static_cast<int64_t>(a.co0 + 16 * (i & 1) + (lane >> 1)) * p.so[1] +
                      static_cast<int64_t>(u.qh0 + 2 * warp + (i >> 1)) * p.so[3];
    *reinterpret_cast<uint4*>(static_cast<float*>(p.out) + e) = qo[i];
    *reinterpret_cast<uint4*>(static_cast<float*>(p.sel) + e) = qs[i];
  }
  const int64_t col_off = static_cast<int64_t>(u.n) * p.so[0] + static_cast<int64_t>(a.co0 + lane) * p.so[1] +
                          static_cast<int64_t>(u.qd0) * p.so[2] + (u.qw0 + 8 * mt);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    *reinterpret_cast<uint2*>(p.off + col_off + static_cast<int64_t>(u.qh0 + 2 * warp + h) * p.so[3]) =
        offset_row(qf, h);
  }
}

// A 16-bit training tile's pairs (select_tile_pairs: register 2 j + h holds channels 8 j + 2 t and + 1 of the warp's
// row h at column g) into rows by transposing stmatrix, each channel's 8 columns of a row together: row h of the
// outputs at best_at + h * row_stride, of the selected values at sel_at + h * row_stride (this lane's addresses).
__device__ __forceinline__ void put_pair_values(uint32_t best_at, uint32_t sel_at, uint32_t row_stride,
                                                const uint32_t (&best)[8], const uint32_t (&sel)[8]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    stmatrix_x4_trans(best_at + h * row_stride, best[h], best[2 + h], best[4 + h], best[6 + h]);
    stmatrix_x4_trans(sel_at + h * row_stride, sel[h], sel[2 + h], sel[4 + h], sel[6 + h]);
  }
}

// The tile's offsets as byte pairs for one transposing stmatrix: chunk j's register, element e (channel 8 j + 2 t + e)
// holding row 0's offset in its low byte and row 1's in its high byte, so that the transposed matrix holds each
// channel's 8 columns x 2 rows.
__device__ __forceinline__ void offset_pairs(const uint32_t (&off)[8], uint32_t (&ob)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) ob[j] = off[2 * j] | off[2 * j + 1] << 8;
}

// A whole unit's 16-bit training tiles stored through the consumer's unit rows (kUnitBytes, laid out as geometry.cuh
// says) and out by the TMA unit: each tile's transposing stmatrix puts the warp's 2 rows x 8 columns of every channel
// in place (outputs and selected values; a tile's offsets go through the warp's rows as store_pair_rows transposes
// them, then into the unit rows), and after the unit's last tile three threads hand one tensor each to the TMA unit
// (one `cp.async.bulk.tensor` of the unit's 32 channels x kTH rows x kTW columns, unit_maps.h). So the consumer makes
// no global stores per tile: none computes an address or holds registers until the memory system takes them
// (long-scoreboard stalls on the stores' operands took 20 % of the bf16 training form's samples: Nsight Compute on an
// H100). For whole units where p.unit_tma (kernel.cuh); every thread of the warpgroup calls it for each of the unit's
// tiles in order. `unit`: the consumer's rows, kUnitAlign-aligned.
template <Mode M>
__device__ __forceinline__ void store_unit_rows(const Params& p, const uint32_t (&best)[8], const uint32_t (&sel)[8],
                                                const uint32_t (&off)[8], uint8_t* unit, uint8_t* rows,
                                                const TileOrigin& u, int mt, int warp, const EpilogueArgs& a) {
  const int lane = threadIdx.x & 31;
  const int wg = static_cast<int>(threadIdx.x) / 128 - 1;  // the consumer
  const uint32_t base = smem_addr(unit);
  // Lane l gives the address of channel l's 8 columns of this tile in each of the warp's rows (rows kUnitPlaneBytes
  // apart, which leaves the swizzle's bits as they are).
  const uint32_t at = unit_swizzle64(base + 2 * warp * kUnitPlaneBytes + lane * kUnitRowBytes + 16 * mt);
  if (mt == 0) {
    bulk_wait_read();    // this thread's stores of the previous unit have read the rows
    warpgroup_sync(wg);  // every thread's have (a warp's rows go out through other warps' threads)
  }
  put_pair_values(at, at + kUnitTensorBytes, kUnitPlaneBytes, best, sel);
  // This tile's offsets through the warp's rows, as store_pair_rows stores them.
  uint32_t ob[4];
  offset_pairs(off, ob);
  __syncwarp();  // the warp's reads of the previous tile's offsets are done
  stmatrix_x4_trans(smem_addr(rows) + 16 * lane, ob[0], ob[1], ob[2], ob[3]);
  __syncwarp();
  const uint4 o = reinterpret_cast<const uint4*>(rows)[lane];
  // Channel lane's offset rows: 8 columns of each of the warp's 2 rows.
  const uint32_t off_base = base + 2 * kUnitTensorBytes;
  const uint32_t off_at = unit_swizzle32(off_base + 2 * warp * kUnitOffPlaneBytes + lane * kTW + 8 * mt) - base;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    *reinterpret_cast<uint2*>(unit + off_at + h * kUnitOffPlaneBytes) = offset_row(o, h);
  }
  if (mt != kMTiles - 1) return;
  fence_proxy_async();  // this thread's share of the unit rows' writes, visible to the TMA unit's reads
  warpgroup_sync(wg);   // the unit's rows, every warp's, in place
  if (lane == 0 && warp < 3) {  // tensor `warp`: the outputs, the selected values, the offsets
    tma_store_5d(&p.unit_maps[warp], base + warp * kUnitTensorBytes, u.qw0, a.co0, u.qh0, u.qd0, u.n);
    bulk_commit();
  }
}

// The mixed training form's whole tile through the warp's rows (L::kOutRowsBytes), where p.out_rows: its float32
// outputs as store_rows32 stores them (lanes 2k and 2k + 1 a channel row's whole 32-byte sector), its selected values
// (the 16-bit y) by two transposing stmatrix as store_out_rows stores 16-bit outputs, its offsets as byte pairs by
// one; 8 vector stores a lane where the scalar form takes 48 a thread, each with its 64-bit address.
template <Mode M>
__device__ __forceinline__ void store_rows_mixed(const Params& p, const float (&best)[16], const float (&sel)[16],
                                                 const uint32_t (&off)[16], uint8_t* rows, const TileOrigin& u,
                                                 int mt, int warp, int g, int t, const EpilogueArgs& a) {
  using T = typename ModeTraits<M>::io_t;
  constexpr int kValueBytes = 2 * kCoBlock * 8 * 4;  // [2 rows][32 channels][8 columns] of float32
  constexpr int kSelRowBytes = kCoBlock * 16;        // one row's 32 channels of 8 16-bit columns
  constexpr int kOffAt = kValueBytes + 2 * kSelRowBytes;
  static_assert(out_rows_bytes(M, true, true) >= kOffAt + kCoBlock * 16, "the warp's rows");
  const int lane = threadIdx.x & 31;
  uint32_t pk[8];
#pragma unroll
  for (int pr = 0; pr < 8; ++pr) pk[pr] = Pair16<M>::round(sel[2 * pr], sel[2 * pr + 1]);  // exact: y is 16-bit
  uint32_t ob[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) ob[j] = off[4 * j] | off[4 * j + 2] << 8 | off[4 * j + 1] << 16 | off[4 * j + 3] << 24;
  __syncwarp();  // the warp's reads of the previous tile's rows are done
  put_rows32(rows, best, g, t);
  const uint32_t sel_at = smem_addr(rows + kValueBytes) + 16 * lane;
#pragma unroll
  for (int h = 0; h < 2; ++h) stmatrix_x4_trans(sel_at + h * kSelRowBytes, pk[h], pk[2 + h], pk[4 + h], pk[6 + h]);
  stmatrix_x4_trans(smem_addr(rows + kOffAt) + 16 * lane, ob[0], ob[1], ob[2], ob[3]);
  __syncwarp();
  uint4 qo[4];
  get_rows32(rows, lane, qo);
  const uint4* const qs = reinterpret_cast<const uint4*>(rows + kValueBytes);
  const uint4 qf = reinterpret_cast<const uint4*>(rows + kOffAt)[lane];
  const int64_t col = static_cast<int64_t>(u.n) * p.so[0] + static_cast<int64_t>(u.qd0) * p.so[2] +
                      (u.qw0 + 8 * mt + 4 * (lane & 1));
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t e = col + static_cast<int64_t>(a.co0 + 16 * (i & 1) + (lane >> 1)) * p.so[1] +
                      static_cast<int64_t>(u.qh0 + 2 * warp + (i >> 1)) * p.so[3];
    *reinterpret_cast<uint4*>(static_cast<float*>(p.out) + e) = qo[i];
  }
  const int64_t col_ch = static_cast<int64_t>(u.n) * p.so[0] + static_cast<int64_t>(a.co0 + lane) * p.so[1] +
                         static_cast<int64_t>(u.qd0) * p.so[2] + (u.qw0 + 8 * mt);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t e = col_ch + static_cast<int64_t>(u.qh0 + 2 * warp + h) * p.so[3];
    *reinterpret_cast<uint4*>(static_cast<T*>(p.sel) + e) = qs[h * kCoBlock + lane];
    *reinterpret_cast<uint2*>(p.off + e) = offset_row(qf, h);
  }
}

// One m64 tile's pooled outputs from its accumulators, then their stores (rows: the warp's rows for
// store_out_rows in the 16-bit-output inference forms, store_rows32 in the TF32 training form and store_rows_mixed in
// the mixed one, else unused).
template <Mode M, bool TRAIN, bool MIXED>
__device__ __forceinline__ void store_tile(const Params& p, const float (&acc)[8][16], const TileOrigin& u, int mt,
                                           int warp, int g, int t, const EpilogueArgs& a, uint8_t* rows) {
  using io_t = typename ModeTraits<M>::io_t;
  using Out = OutputTraits<M, MIXED>;
  float best[16], sel[16];
  uint32_t off[16];
  select_phases<M, TRAIN, MIXED>(p, acc, t, a, best, sel, off);
  if constexpr (!TRAIN && ModeTraits<M>::kHalf && !MIXED) {
    static_assert(kMTiles % 2 == 0, "an item's tiles pair up");
    if (p.out_rows && !p.halves && tile_is_whole(p, u, mt | 1, a)) {  // as store_pairs pairs them
      store_out_rows2<M>(p, best, rows, u, mt, warp, a);
      return;
    }
    if (p.out_rows && tile_is_whole(p, u, mt, a)) {
      store_out_rows<M>(p, best, rows, u, mt, warp, a);
      return;
    }
  } else if constexpr (M == Mode::kTF32 && TRAIN) {
    if (p.out_rows && tile_is_whole(p, u, mt, a)) {
      store_rows32(p, best, sel, off, rows, u, mt, warp, g, t, a);
      return;
    }
  } else if constexpr (TRAIN && MIXED) {
    if (p.out_rows && tile_is_whole(p, u, mt, a)) {
      store_rows_mixed<M>(p, best, sel, off, rows, u, mt, warp, g, t, a);
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

// The 16-bit training forms' phases as their selection compares them (kernel.cuh, kPairs): per
// pair of the thread's outputs (r = 2 pr and 2 pr + 1: channels c and c + 1 of one row) and phase, the two values
// y = acc * sign + sel_bias rounded to the I/O dtype, sign-flipped (-y) where the weights were staged negated, in one
// register: rounding y itself and flipping its sign bit keeps a zero's and a NaN's sign as the reference's y has them
// (rounding -y directly gave +0 where y is +0, so the selected value read -0).
// They hold everything the selection and its exact fallback need (y is rounded before the epilogue), so the
// accumulators are free once these 64 registers are made.
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
// cannot tell (select_tile_pairs then takes exact_pair for the warp's pair).
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

// A 16-bit training tile's 8 pairs selected: best, sel and off of pair pr (elements h: its channels c, c + 1). In the
// block-uniform monotone form (unit slopes, weights staged negated) every pair takes select_pair, then the warp ORs
// the pairs it could not tell and those take exact_pair, all lanes together (a warp-uniform mask, so no lane
// diverges); the rest, every pair exact. The 8 select_pair have no branch or vote between them, so their chains
// interleave, where a vote per pair held each warp to one pair's ~46 dependent instructions at a time (SASS; Nsight
// Compute's samples on an H100).
template <Mode M>
__device__ __forceinline__ void select_tile_pairs(const Params& p, const PhasePairs<M>& in, int t,
                                                  const EpilogueArgs& a, uint32_t (&best)[8], uint32_t (&sel)[8],
                                                  uint32_t (&off)[8]) {
  // a.negated and p.unit_slopes are block-uniform, so the whole warp takes the monotone form or none of it does.
  uint32_t redo = 0xffu;  // the pairs that take exact_pair
  if (p.unit_slopes && a.negated) {
    uint32_t mine = 0u;
#pragma unroll
    for (int pr = 0; pr < 8; ++pr) {
      const int c = acc_channel(2 * pr, t);
      const float m0 = a.mult[c], m1 = a.mult[c + 1];
      const bool told = select_pair<M, true>(p, in.v[pr], m0, m1, pair_flip(a, m0, m1), best[pr], sel[pr], off[pr]);
      mine |= told ? 0u : 1u << pr;
    }
    redo = __reduce_or_sync(0xffffffffu, mine);
  }
  if (redo == 0u) return;
#pragma unroll
  for (int pr = 0; pr < 8; ++pr) {
    if (!((redo >> pr) & 1u)) continue;
    const int c = acc_channel(2 * pr, t);
    const float m0 = a.mult[c], m1 = a.mult[c + 1];
    const uint32_t flip = pair_flip(a, m0, m1);
    if (p.unit_slopes) {
      exact_pair<M, true>(p, in.v[pr], m0, m1, flip, best[pr], sel[pr], off[pr]);
    } else {
      exact_pair<M, false>(p, in.v[pr], m0, m1, flip, best[pr], sel[pr], off[pr]);
    }
  }
}

// A whole 16-bit training tile's stores through the warp's rows in shared memory (L::kOutRowsBytes), where
// p.out_rows: the pairs' columns are channels and their rows positions, so one transposing stmatrix puts 4 of a
// thread's pairs where each channel's 8 columns lie together — [2 rows][32 channels][8 columns] of outputs, the same
// of selected values, and [32 channels][8 columns][2 rows] of offsets (bytes, each 16-bit element holding both
// rows'); then lane l stores channel l's columns of each row as one vector per tensor. 5 stmatrix, 5 shared loads
// and 6 global stores a thread where the scalar form takes 48 global stores, each with its 64-bit address and a
// shift or mask.
template <Mode M>
__device__ __forceinline__ void store_pair_rows(const Params& p, const uint32_t (&best)[8], const uint32_t (&sel)[8],
                                                const uint32_t (&off)[8], uint8_t* rows, const TileOrigin& u, int mt,
                                                int warp, const EpilogueArgs& a) {
  constexpr int kRowBytes = kCoBlock * 16;  // one pooled row's 32 channels of 8 columns
  static_assert(out_rows_bytes(M, true, false) >= 5 * kRowBytes, "the warp's rows: outputs, selected values, offsets");
  const int lane = threadIdx.x & 31;
  const uint32_t base = smem_addr(rows) + 16 * lane;
  uint32_t ob[4];
  offset_pairs(off, ob);
  __syncwarp();  // the warp's reads of the previous tile's rows are done
  put_pair_values(base, base + 2 * kRowBytes, kRowBytes, best, sel);
  stmatrix_x4_trans(base + 4 * kRowBytes, ob[0], ob[1], ob[2], ob[3]);
  __syncwarp();
  const uint4* const r = reinterpret_cast<const uint4*>(rows) + lane;
  const uint4 o = r[4 * kCoBlock];
  const int64_t col = static_cast<int64_t>(u.n) * p.so[0] + static_cast<int64_t>(a.co0 + lane) * p.so[1] +
                      static_cast<int64_t>(u.qd0) * p.so[2] + (u.qw0 + 8 * mt);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t e = col + static_cast<int64_t>(u.qh0 + 2 * warp + h) * p.so[3];
    *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.out) + e) = r[h * kCoBlock];
    *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.sel) + e) = r[(2 + h) * kCoBlock];
    *reinterpret_cast<uint2*>(p.off + e) = offset_row(o, h);
  }
}

// Two whole 16-bit training tiles (an item's tiles 2 k and 2 k + 1: columns 16 k .. 16 k + 15 of the warp's two rows)
// stored together through the warp's rows, so that each channel row's 16 columns go out as one whole 32-byte sector
// (lanes 2 m and 2 m + 1 a sector's halves) where store_pair_rows stores half sectors, one lane a channel: the even
// tile's stmatrix put its halves in place and return; the odd tile's put theirs, then every lane stores 4 vectors a
// tensor of outputs and selected values and 4 of offsets. Rows: [2 rows][32 channels][2 halves][16 bytes] of outputs,
// the same of selected values, [32 channels][2 halves][16 bytes] of offset byte pairs (store_pair_rows' layout per
// half).
template <Mode M>
__device__ __forceinline__ void store_pair_rows2(const Params& p, const uint32_t (&best)[8], const uint32_t (&sel)[8],
                                                 const uint32_t (&off)[8], uint8_t* rows, const TileOrigin& u, int mt,
                                                 int warp, const EpilogueArgs& a) {
  constexpr int kRowBytes = kCoBlock * 32;  // one pooled row's 32 channels of 16 columns
  static_assert(out_rows_bytes(M, true, false) >= 5 * kRowBytes, "the warp's paired rows");
  const int lane = threadIdx.x & 31, q = mt & 1;
  const uint32_t at = smem_addr(rows) + 32 * lane + 16 * pair_half(lane, q);
  uint32_t ob[4];
  offset_pairs(off, ob);
  __syncwarp();  // the warp's reads of the previous pair's rows are done
  put_pair_values(at, at + 2 * kRowBytes, kRowBytes, best, sel);
  stmatrix_x4_trans(at + 4 * kRowBytes, ob[0], ob[1], ob[2], ob[3]);
  if (q == 0) return;
  __syncwarp();
  const int64_t base = static_cast<int64_t>(u.n) * p.so[0] + static_cast<int64_t>(u.qd0) * p.so[2] +
                       (u.qw0 + 8 * (mt - 1));
  const uint4* const r = reinterpret_cast<const uint4*>(rows);
  store_paired16(p, static_cast<uint16_t*>(p.out), r, base, u, warp, a);
  store_paired16(p, static_cast<uint16_t*>(p.sel), r + 2 * kRowBytes / 16, base, u, warp, a);
  const uint4* const ro = r + 4 * kRowBytes / 16 + 2 * lane;
  const uint4 o0 = ro[pair_half(lane, 0)], o1 = ro[pair_half(lane, 1)];
  const int64_t col_off = base + static_cast<int64_t>(a.co0 + lane) * p.so[1];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t e = col_off + static_cast<int64_t>(u.qh0 + 2 * warp + h) * p.so[3];
    *reinterpret_cast<uint2*>(p.off + e) = offset_row(o0, h);
    *reinterpret_cast<uint2*>(p.off + e + 8) = offset_row(o1, h);
  }
}

// A 16-bit training tile's selection (select_tile_pairs), then its stores: a whole unit's tiles through the consumer's
// unit rows and the TMA unit (store_unit_rows, where unit is given), two whole tiles together through the warp's
// rows (store_pair_rows2), a whole tile alone through them (store_pair_rows), others element by element.
template <Mode M>
__device__ __forceinline__ void store_pairs(const Params& p, const PhasePairs<M>& in, const TileOrigin& u, int mt,
                                            int warp, int g, int t, const EpilogueArgs& a, uint8_t* rows,
                                            uint8_t* unit) {
  uint32_t best[8], sel[8], off[8];
  select_tile_pairs<M>(p, in, t, a, best, sel, off);
  if (unit) {
    store_unit_rows<M>(p, best, sel, off, unit, rows, u, mt, warp, a);
    return;
  }
  // Paired where this consumer takes the item's 4 tiles in order (not halves) and both tiles of the pair are whole
  // (tile_is_whole is monotone in mt: the odd one's decides).
  static_assert(kMTiles % 2 == 0, "an item's tiles pair up");
  if (p.out_rows && !p.halves && tile_is_whole(p, u, mt | 1, a)) {
    store_pair_rows2<M>(p, best, sel, off, rows, u, mt, warp, a);
    return;
  }
  if (p.out_rows && tile_is_whole(p, u, mt, a)) {
    store_pair_rows<M>(p, best, sel, off, rows, u, mt, warp, a);
    return;
  }
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
