// Staging of the sm_90a kernel's operands (kernel.cuh): the weights once per block by every thread, and each unit's
// input planes by the producer warpgroup. Both go through registers: TF32 operands are rounded to nearest (ties
// away, as cuDNN) on the way, which the tensor cores would otherwise truncate, float32 operands of a CAST
// instantiation are rounded to its 16-bit dtype (cuda/source.cuh), and 16-bit channels of one position are gathered
// into 16 bytes from their separate planes.
#pragma once

#include "conv_transpose3d_post_pool/cuda/params.cuh"
#include "conv_transpose3d_post_pool/cuda/source.cuh"
#include "conv_transpose3d_post_pool/cuda/stage.cuh"
#include "conv_transpose3d_post_pool/hopper/geometry.cuh"
#include "conv_transpose3d_post_pool/hopper/sync.cuh"

#include <cstdint>
#include <type_traits>

namespace fused {
namespace conv_transpose3d_post_pool {
namespace hopper {

// A float32 input element as staged: rounded to TF32, or as it is for strict float32 (whose consumers split it into
// TF32 parts in registers: strict.cuh).
template <Mode M>
__device__ __forceinline__ uint32_t staged_word(float v) {
  return M == Mode::kStrict ? __float_as_uint(v) : tf32_round(v);
}

// Element `c` (< kChunkElems) of a chunk as the staged word's bits: float32 as staged_word, or one 16-bit half
// (CAST: rounded from float32, source.cuh).
template <Mode M, bool CAST>
__device__ __forceinline__ uint32_t staged_bits(const void* base, int64_t at) {
  if constexpr (ModeTraits<M>::kHalf) {
    return Source<M, CAST>::bits16(base, at);
  } else {
    return staged_word<M>(__ldg(static_cast<const float*>(base) + at));
  }
}

// 16 bytes of chunk elements (channels c0 .. c0 + kChunkElems - 1, zero past Cin or where `valid` is false) of the
// tensor at element offset `at` with channel stride `sc`. Sets `nonfinite` for a real non-finite element.
template <Mode M, bool CAST>
__device__ __forceinline__ uint4 load_chunk(const void* base, int64_t at, int64_t sc, int c0, int C, bool valid,
                                            bool& nonfinite) {
  constexpr int kElems = ModeTraits<M>::kHalf ? 8 : 4;
  uint32_t e[kElems];
  // Every element loaded, a missing one from element 0 (the launcher runs this kernel for non-empty tensors only)
  // and zeroed after: predicated loads were issued one or two at a time, each waited for by its check before the
  // next (a round trip per element).
#pragma unroll
  for (int i = 0; i < kElems; ++i) {
    const bool ok = valid && c0 + i < C;
    const uint32_t bits = staged_bits<M, CAST>(base, ok ? at + (c0 + i) * sc : 0);
    e[i] = ok ? bits : 0u;
  }
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (ModeTraits<M>::kHalf) {
      w[i] = e[2 * i] | (e[2 * i + 1] << 16);
      nonfinite |= !finite_bits16(e[2 * i], M == Mode::kBF16) || !finite_bits16(e[2 * i + 1], M == Mode::kBF16);
    } else {
      w[i] = e[i];
      nonfinite |= !(fabsf(__uint_as_float(e[i])) < __int_as_float(0x7f800000));
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Every block reads the same weights: in the same order, all multiprocessors would ask the same few L2 slices for
// the same lines at once, so each block starts its walk over the n items elsewhere. (Most of the weights' staging
// time was the loads' serialisation, fixed below; this spread was not measured on its own.)
__device__ __forceinline__ int weight_rotation(int n) {
  return n > 0 ? static_cast<int>((blockIdx.x * 37u) % static_cast<unsigned>(n)) : 0;
}
// Item i (< n, or past n: returned as is) of a walk that starts at item rot.
__device__ __forceinline__ int rotated(int i, int rot, int n) {
  if (i >= n) return i;
  const int r = i + rot;
  return r >= n ? r - n : r;
}

// The block's B for output channels co0 .. co0 + 31: per run (geometry.cuh), [chunk][column][16 bytes], column
// 32 * j + c holding, for channel co0 + c, the tap through which the run's shift feeds the phase of its j-th slot;
// zero past Cin and Cout. `negate` (the monotone form) stores -w for channels with a negative multiplier, as the
// mma.sync kernel does. Staged by the consumer warpgroups (ctid: 0 .. kStagers - 1), each thread with the loads of
// all its chunks in flight before any store (a chunk's elements lie Cout x 27 apart: scalar loads, so one L2 round
// trip in all); returns whether this thread saw a non-finite weight. Fenced for the tensor cores' reads.
template <Mode M, int KS, bool CAST>
__device__ bool stage_weights_gather(const Params& p, uint8_t* sB, int co0, const float* sMult, bool negate,
                                     int ctid) {
  using L = Layout<M, KS>;
  constexpr int kStagers = 128 * kConsumers;
  constexpr int kItems = kCols * L::kChunks;
  // A thread's chunks: 7 (16-bit, one k-step) or 14 (TF32, two k-steps).
  constexpr int kBatch = (kItems + kStagers - 1) / kStagers;
  bool nonfinite = false;
  const uint32_t flip = ModeTraits<M>::kHalf ? 0x80008000u : 0x80000000u;
  const int rot = weight_rotation(kItems);
  for (int base = ctid; base < kItems; base += kBatch * kStagers) {
    uint4 v[kBatch];
    int cols[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int i = rotated(base + b * kStagers, rot, kItems);
      int ri = 0;
#pragma unroll
      for (int k = 1; k < kRuns; ++k) ri = i >= run_col0(k) * L::kChunks ? k : ri;
      const Run r = run(ri);
      const int local = i - run_col0(ri) * L::kChunks;
      const int n = run_cols(ri);
      const int chunk = local / n, col = local - chunk * n;
      const int ph = slot_phase(r.slot0 + col / kCoBlock), c = col % kCoBlock, co = co0 + c;
      const int s = r.shift;
      const int tap = phase_tap(ph >> 2, (ph >> 1) & 1, ph & 1, s >> 2, (s >> 1) & 1, s & 1);
      const int64_t at = static_cast<int64_t>(co) * p.sw[1] + (tap / 9) * p.sw[2] + ((tap / 3) % 3) * p.sw[3] +
                         (tap % 3) * p.sw[4];
      cols[b] = c;
      v[b] = load_chunk<M, CAST>(p.w, at, p.sw[0], chunk * L::kChunkElems, p.Cin,
                                 base + b * kStagers < kItems && co < p.Cout, nonfinite);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (base + b * kStagers >= kItems) continue;
      const int i = rotated(base + b * kStagers, rot, kItems);
      uint4 w = v[b];
      if (negate && sMult[cols[b]] < 0.f) {
        w.x ^= flip;
        w.y ^= flip;
        w.z ^= flip;
        w.w ^= flip;
      }
      *reinterpret_cast<uint4*>(sB + static_cast<size_t>(i) * 16) = w;
    }
  }
  fence_proxy_async();
  return nonfinite;
}

// Where tap `tap` (kd * 9 + kh * 3 + kw) of every channel lies in B: per dim, tap 1 feeds phase 0 from shift 0,
// tap 2 phase 1 from shift 0, tap 0 phase 1 from shift 1; the (shift, phase) pair is one slot of one run. Returns
// the byte offset of the tap's column for channel 0 in chunk 0; `chunk_stride`: the bytes between its chunks.
template <Mode M, int KS>
__device__ __forceinline__ int tap_offset(int tap, int& chunk_stride) {
  using L = Layout<M, KS>;
  const int kd = tap / 9, kh = (tap / 3) % 3, kw = tap % 3;
  const int ph = ((kd != 1) << 2) | ((kh != 1) << 1) | (kw != 1);
  const int s = ((kd == 0) << 2) | ((kh == 0) << 1) | (kw == 0);
  const int slot = phase_slot(ph);
  int offset = 0;
  chunk_stride = 0;
#pragma unroll
  for (int i = 0; i < kRuns; ++i) {
    const Run r = run(i);
    if (r.shift == s && slot >= r.slot0 && slot < r.slot0 + r.slots) {
      offset = (run_col0(i) * L::kChunks + (slot - r.slot0) * kCoBlock) * 16;
      chunk_stride = run_cols(i) * 16;
    }
  }
  return offset;
}

// The TF32 form of stage_weights: the block's weights read in address order and each element stored at its place in
// B through a per-tap table of B offsets (tap_table: 27 x 2 ints of shared memory), B zeroed first. A thread takes
// (channel, tap) pairs r = ctid, ctid + 256, ... of the block's 32 x 27 and loads that pair for every input channel
// at once: for a fixed input channel consecutive threads read consecutive floats of a contiguous weight, so each
// L2 sector is read once, and the pair's B place is computed once. The chunk-at-a-time gather
// (stage_weights_gather) reads one 32-byte sector per 4-byte element, the 8 taps of a sector for 8 different chunks
// at different times; beside TF32's 208 KB of shared memory the L1 keeps ~47 KB, less than the 55 KB of weights, so
// those sectors come from L2 again and again (the kernel's fixed cost measured 24.9 us in TF32 against 13.3 in bf16,
// whose 28 KB of weights stay in L1).
//
// Strict float32 (M = kStrict) stores each weight's split (tf32_split): its TF32 high part in B's first copy, its low
// part in the second (geometry.cuh); a high part that is not finite (an infinite or NaN weight, or one that rounds
// to infinity) counts as non-finite, and the block then computes without the tensor cores (kernel.cuh).
template <Mode M, int KS>
__device__ bool stage_weights_tf32(const Params& p, uint8_t* sB, int* tap_table, int co0, const float* sMult,
                                   bool negate, int ctid) {
  static_assert(M == Mode::kTF32 || M == Mode::kStrict, "float32 weights");
  using L = Layout<M, KS>;
  constexpr int kStagers = 128 * kConsumers;
  constexpr int kCapacity = L::kChunks * 4;  // input channels B holds (the launcher keeps Cin within it)
  // Zero for the channels past Cout (the real channels' places are all written below).
  for (int i = ctid; i < L::kBBytes / 16; i += kStagers) reinterpret_cast<uint4*>(sB)[i] = make_uint4(0u, 0u, 0u, 0u);
  if (ctid < 27) {
    int stride;
    tap_table[2 * ctid] = tap_offset<M, KS>(ctid, stride);
    tap_table[2 * ctid + 1] = stride;
  }
  consumers_sync();
  const float* w = static_cast<const float*>(p.w);
  const int real = (p.Cout - co0 < kCoBlock ? p.Cout - co0 : kCoBlock) * 27;  // pairs of real channels
  bool nonfinite = false;
  const int rot = weight_rotation(real);
  for (int i = ctid; i < real; i += kStagers) {
    const int r = rotated(i, rot, real);
    const int c = r / 27, tap = r - c * 27;
    const int64_t at = static_cast<int64_t>(co0 + c) * p.sw[1] + (tap / 9) * p.sw[2] + ((tap / 3) % 3) * p.sw[3] +
                       (tap % 3) * p.sw[4];
    // Every channel's load issued before any is used: a channel past Cin reads the pair's first (always there) and is
    // zeroed after, since predicated loads were issued one or two at a time, each waited for before the next.
    float raw[kCapacity];
#pragma unroll
    for (int ci = 0; ci < kCapacity; ++ci) raw[ci] = __ldg(w + (ci < p.Cin ? at + ci * p.sw[0] : at));
    const uint32_t flip = negate && sMult[c] < 0.f ? 0x80000000u : 0u;
    uint8_t* const dst = sB + tap_table[2 * tap] + c * 16;
    const int stride = tap_table[2 * tap + 1];
    // Every input channel B holds, those past Cin too (their zero negated with the rest: B then holds exactly what
    // the gather stores, bit for bit, -0 included), one 16-byte chunk of 4 channels per store.
#pragma unroll
    for (int k = 0; k < kCapacity / 4; ++k) {
      uint32_t v[4], lo[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int ci = 4 * k + e;
        if constexpr (M == Mode::kStrict) {
          uint32_t hi, l, cross;
          tf32_split(__float_as_uint(raw[ci]), hi, l, cross);
          v[e] = ci < p.Cin ? hi : 0u;
          lo[e] = ci < p.Cin ? l : 0u;
        } else {
          v[e] = ci < p.Cin ? tf32_round(raw[ci]) : 0u;
          lo[e] = 0u;
        }
        nonfinite |= !(fabsf(__uint_as_float(v[e])) < __int_as_float(0x7f800000));
      }
      *reinterpret_cast<uint4*>(dst + k * stride) = make_uint4(v[0] ^ flip, v[1] ^ flip, v[2] ^ flip, v[3] ^ flip);
      if constexpr (M == Mode::kStrict) {
        *reinterpret_cast<uint4*>(dst + L::kBCopyBytes + k * stride) =
            make_uint4(lo[0] ^ flip, lo[1] ^ flip, lo[2] ^ flip, lo[3] ^ flip);
      }
    }
  }
  fence_proxy_async();
  return nonfinite;
}

// Where the bulk path (stage_weights_bulk) lands the block's raw weights: one row per input channel (the block's
// 32 channels x 27 taps in the weight's own order and dtype), in the stage ring's last stages, which the producer
// fills only after the consumers have read them (its first unit there waits on the consumers' `raw_free`).
template <Mode M, int KS>
struct RawWeights {
  using L = Layout<M, KS>;
  static constexpr int kRowBytes = kCoBlock * 27 * static_cast<int>(sizeof(typename ModeTraits<M>::io_t));
  static constexpr int kBytes = L::kChunks * L::kChunkElems * kRowBytes;  // B's input channels, every row
  static constexpr int kStages = (kBytes + L::kStageBytes - 1) / L::kStageBytes;
  static constexpr int kFirstStage = L::kStages - kStages;
  static_assert(kFirstStage >= 2, "the raw weights would take a stage of the first two units");
};

// stage_weights_tf32's B (the gather's layout, bit for bit) from rows copied whole, for a contiguous weight whose
// rows are 16-byte aligned (p.w_bulk; not the CAST forms, whose float32 rows would take the second unit's stage):
// one thread sends one bulk copy per input channel, each block starting at another row (all blocks read the same
// weights; in the same order they would ask the same L2 slices for the same lines at once), and every thread then
// builds its (channel, tap) pairs' chunks from shared memory through the per-tap table of B offsets. The element
// loads this replaces took several round trips per thread (ptxas placed each value's rounding and check between
// later loads); the trace had the consumers waiting ~9 us (TF32) / ~10 (bf16) for their weights.
template <Mode M, int KS>
__device__ bool stage_weights_bulk(const Params& p, uint8_t* sB, uint8_t* raw, uint64_t* landed, int* tap_table,
                                   int co0, const float* sMult, bool negate, int ctid) {
  using L = Layout<M, KS>;
  using R = RawWeights<M, KS>;
  using raw_t = std::conditional_t<ModeTraits<M>::kHalf, unsigned short, float>;
  constexpr int kE = static_cast<int>(sizeof(raw_t));
  constexpr int kStagers = 128 * kConsumers;
  constexpr int kElems = L::kChunkElems;
  const int cols = p.Cout - co0 < kCoBlock ? p.Cout - co0 : kCoBlock;
  if (ctid == 0) {
    const uint32_t row = static_cast<uint32_t>(cols) * 27 * kE;
    mbar_arrive_expect_tx(landed, row * static_cast<uint32_t>(p.Cin));
    const uint8_t* src = static_cast<const uint8_t*>(p.w) + static_cast<int64_t>(co0) * 27 * kE;
    const int first = static_cast<int>(blockIdx.x % static_cast<unsigned>(p.Cin));
    for (int k = 0; k < p.Cin; ++k) {
      const int ci = k + first < p.Cin ? k + first : k + first - p.Cin;
      bulk_copy_to_shared(raw + ci * R::kRowBytes, src + ci * p.sw[0] * kE, row, landed);
    }
  }
  // The places of channels past Cout stay zero (every real pair writes all of its chunks, zeros past Cin included).
  if (cols < kCoBlock) {
    for (int i = ctid; i < L::kBBytes / 16; i += kStagers) reinterpret_cast<uint4*>(sB)[i] = make_uint4(0u, 0u, 0u, 0u);
  }
  if (ctid < 27) {
    int stride;
    tap_table[2 * ctid] = tap_offset<M, KS>(ctid, stride);
    tap_table[2 * ctid + 1] = stride;
  }
  consumers_sync();
  mbar_wait(landed, 0);
  const raw_t* const rw = reinterpret_cast<const raw_t*>(raw);
  const uint32_t flip_word = ModeTraits<M>::kHalf ? 0x80008000u : 0x80000000u;
  bool nonfinite = false;
  for (int r = ctid; r < cols * 27; r += kStagers) {
    const int c = r / 27, tap = r - c * 27;
    uint8_t* const dst = sB + tap_table[2 * tap] + c * 16;
    const int stride = tap_table[2 * tap + 1];
    const uint32_t flip = negate && sMult[c] < 0.f ? flip_word : 0u;
#pragma unroll
    for (int k = 0; k < L::kChunks; ++k) {
      uint32_t e[kElems];
#pragma unroll
      for (int i = 0; i < kElems; ++i) {
        const int ci = k * kElems + i;
        // Consecutive threads read consecutive elements of one row: no bank conflicts.
        const raw_t v = rw[(ci < p.Cin ? ci : 0) * (kCoBlock * 27) + r];
        uint32_t bits;
        if constexpr (ModeTraits<M>::kHalf) {
          bits = v;
        } else {
          bits = tf32_round(v);
        }
        e[i] = ci < p.Cin ? bits : 0u;
      }
      uint32_t w[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if constexpr (ModeTraits<M>::kHalf) {
          w[i] = e[2 * i] | (e[2 * i + 1] << 16);
          nonfinite |= !finite_bits16(e[2 * i], M == Mode::kBF16) || !finite_bits16(e[2 * i + 1], M == Mode::kBF16);
        } else {
          w[i] = e[i];
          nonfinite |= !(fabsf(__uint_as_float(e[i])) < __int_as_float(0x7f800000));
        }
      }
      *reinterpret_cast<uint4*>(dst + k * stride) = make_uint4(w[0] ^ flip, w[1] ^ flip, w[2] ^ flip, w[3] ^ flip);
    }
  }
  fence_proxy_async();
  return nonfinite;
}

// The block's B (stage_weights_gather's layout) staged by the consumer warpgroups (ctid 0 .. 255): TF32 in address
// order, 16-bit by the gather (their weights stay in L1). Returns whether this thread saw a non-finite weight.
template <Mode M, int KS, bool CAST>
__device__ bool stage_weights(const Params& p, uint8_t* sB, int* tap_table, int co0, const float* sMult, bool negate,
                              int ctid) {
  if constexpr (!ModeTraits<M>::kHalf) {
    return stage_weights_tf32<M, KS>(p, sB, tap_table, co0, sMult, negate, ctid);
  } else {
    (void)tap_table;
    return stage_weights_gather<M, KS, CAST>(p, sB, co0, sMult, negate, ctid);
  }
}

// Scalar staging of one unit (any strides and alignment): items (plane, chunk, position), kBatch chunks' loads
// issued before their stores.
template <Mode M, int KS, bool CAST>
__device__ void stage_unit_scalar(const Params& p, uint8_t* stage, const TileOrigin& u, int ptid) {
  using L = Layout<M, KS>;
  constexpr int kItems = 2 * L::kChunks * kSlice;
  constexpr int kBatch = ModeTraits<M>::kHalf ? 2 : 4;
  const int64_t nbase = static_cast<int64_t>(u.n) * p.sx[0];
  bool unused = false;
  for (int base = ptid; base < kItems; base += 128 * kBatch) {
    uint4 v[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int i = base + 128 * b;
      const int pos = i % kSlice, r = i / kSlice;
      const int chunk = r % L::kChunks, plane = r / L::kChunks;
      const int hh = pos / kHaloW, ww = pos - hh * kHaloW;
      const int d = u.qd0 + plane, h = u.qh0 + hh, w = u.qw0 + ww;
      const bool valid = i < kItems && d < p.D && h < p.H && w < p.W;
      const int64_t at = valid ? nbase + d * p.sx[2] + h * p.sx[3] + w * p.sx[4] : 0;
      v[b] = load_chunk<M, CAST>(p.x, at, p.sx[1], chunk * L::kChunkElems, p.Cin, valid, unused);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int i = base + 128 * b;
      if (i < kItems) *reinterpret_cast<uint4*>(stage + static_cast<size_t>(i) * 16) = v[b];
    }
  }
}

// The row stagings' last halo column (position kTW of each row, past the 16-byte blocks): one chunk per (plane,
// chunk, row), by scalar loads.
template <Mode M, int KS, bool CAST>
__device__ __forceinline__ void stage_last_column(const Params& p, uint8_t* stage, const TileOrigin& u, int ptid) {
  using L = Layout<M, KS>;
  constexpr int kTail = 2 * L::kChunks * kHaloH;
  const int64_t nbase = static_cast<int64_t>(u.n) * p.sx[0];
  bool unused = false;
  for (int i = ptid; i < kTail; i += 128) {
    const int hh = i % kHaloH, r2 = i / kHaloH;
    const int chunk = r2 % L::kChunks, plane = r2 / L::kChunks;
    const int d = u.qd0 + plane, h = u.qh0 + hh, w = u.qw0 + kTW;
    const bool valid = d < p.D && h < p.H && w < p.W;
    const int64_t at = valid ? nbase + d * p.sx[2] + h * p.sx[3] + w : 0;
    const uint4 v = load_chunk<M, CAST>(p.x, at, p.sx[1], chunk * L::kChunkElems, p.Cin, valid, unused);
    *reinterpret_cast<uint4*>(stage + (static_cast<size_t>(r2) * kSlice + hh * kHaloW + kTW) * 16) = v;
  }
}

// Vector staging where x's w rows are 16-byte aligned with unit stride (p.x_rows16): a block is kChunkElems
// channels x kChunkElems consecutive positions of one row, loaded as one 16-byte vector per channel and stored as
// one 16-byte chunk per position (the transpose is only register naming for float32, byte permutes for 16-bit).
// Consecutive threads take consecutive blocks of a row (coalesced). The halo's last column (position kTW of each
// row) is staged by scalar loads.
template <Mode M, int KS, bool WIDE>
__device__ void stage_unit_rows(const Params& p, uint8_t* stage, const TileOrigin& u, int ptid) {
  using L = Layout<M, KS>;
  constexpr int E = L::kChunkElems;       // channels per chunk = positions per block
  constexpr int kRowBlocks = kTW / E;     // blocks per row
  constexpr int kBlocks = 2 * L::kChunks * kHaloH * kRowBlocks;
  // WIDE (the producer keeps the launch's registers): every block of the thread in one batch of loads, one round
  // trip per unit; else batches that fit its 88 registers.
  constexpr int kBatch = WIDE ? (kBlocks + 127) / 128 : ModeTraits<M>::kHalf ? 1 : 2;
  const int64_t nbase = static_cast<int64_t>(u.n) * p.sx[0];
  for (int base = ptid; base < kBlocks; base += 128 * kBatch) {
    uint4 v[kBatch][E];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int i = base + 128 * b;
      const int wb = i % kRowBlocks, r = i / kRowBlocks;
      const int hh = r % kHaloH, r2 = r / kHaloH;
      const int chunk = r2 % L::kChunks, plane = r2 / L::kChunks;
      const int d = u.qd0 + plane, h = u.qh0 + hh, w = u.qw0 + wb * E;
      // W is a multiple of E here, so a block is wholly inside or wholly past the row's end.
      const bool valid = i < kBlocks && d < p.D && h < p.H && w < p.W;
      const int64_t at = nbase + d * p.sx[2] + h * p.sx[3] + w;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const int c = chunk * E + e;
        v[b][e] = valid && c < p.Cin
                      ? __ldg(reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(p.x) +
                                                             (at + c * p.sx[1]) * (ModeTraits<M>::kHalf ? 2 : 4)))
                      : make_uint4(0u, 0u, 0u, 0u);
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int i = base + 128 * b;
      if (i >= kBlocks) continue;
      const int wb = i % kRowBlocks, r = i / kRowBlocks;
      const int hh = r % kHaloH, r2 = r / kHaloH;
      // Stage index of the block's first position: (plane, chunk) row r2, position hh * kHaloW + wb * E.
      uint8_t* dst = stage + (static_cast<size_t>(r2) * kSlice + hh * kHaloW + wb * E) * 16;
      const uint32_t* w32[E];
#pragma unroll
      for (int e = 0; e < E; ++e) w32[e] = reinterpret_cast<const uint32_t*>(&v[b][e]);
#pragma unroll
      for (int q = 0; q < E; ++q) {
        uint4 o;
        if constexpr (ModeTraits<M>::kHalf) {
          // Position q of channel e is half q % 2 of word q / 2 of vector e; the chunk packs channels (2k, 2k + 1).
          const int sel = (q & 1) ? 0x7632 : 0x5410;
          o.x = __byte_perm(w32[0][q >> 1], w32[1][q >> 1], sel);
          o.y = __byte_perm(w32[2][q >> 1], w32[3][q >> 1], sel);
          o.z = __byte_perm(w32[4][q >> 1], w32[5][q >> 1], sel);
          o.w = __byte_perm(w32[6][q >> 1], w32[7][q >> 1], sel);
        } else {
          o.x = staged_word<M>(__uint_as_float(w32[0][q]));
          o.y = staged_word<M>(__uint_as_float(w32[1][q]));
          o.z = staged_word<M>(__uint_as_float(w32[2][q]));
          o.w = staged_word<M>(__uint_as_float(w32[3][q]));
        }
        *reinterpret_cast<uint4*>(dst + q * 16) = o;
      }
    }
  }
  stage_last_column<M, KS, false>(p, stage, u, ptid);
}

// stage_unit_rows for float32 x rounded to the 16-bit mode (CAST), where x's w rows are 16-byte aligned with unit
// stride (p.x_rows16): a block is the chunk's 8 channels x 4 consecutive positions of one row, one 16-byte vector
// of 4 floats per channel, stored as 4 chunks of 8 rounded channels. The last column by scalar loads.
template <Mode M, int KS>
__device__ void stage_unit_rows_cast(const Params& p, uint8_t* stage, const TileOrigin& u, int ptid) {
  using L = Layout<M, KS>;
  using S = Source<M, true>;
  constexpr int E = L::kChunkElems;  // channels per chunk
  constexpr int V = 4;               // positions per vector
  constexpr int kRowBlocks = kTW / V;
  constexpr int kBlocks = 2 * L::kChunks * kHaloH * kRowBlocks;
  const int64_t nbase = static_cast<int64_t>(u.n) * p.sx[0];
  for (int i = ptid; i < kBlocks; i += 128) {
    const int wb = i % kRowBlocks, r = i / kRowBlocks;
    const int hh = r % kHaloH, r2 = r / kHaloH;
    const int chunk = r2 % L::kChunks, plane = r2 / L::kChunks;
    const int d = u.qd0 + plane, h = u.qh0 + hh, w = u.qw0 + wb * V;
    // W is a multiple of V here, so a block is wholly inside or wholly past the row's end.
    const bool valid = d < p.D && h < p.H && w < p.W;
    const int64_t at = nbase + d * p.sx[2] + h * p.sx[3] + w;
    float4 v[E];
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int c = chunk * E + e;
      v[e] = valid && c < p.Cin ? __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(p.x) + at +
                                                                        c * p.sx[1]))
                                : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    uint8_t* dst = stage + (static_cast<size_t>(r2) * kSlice + hh * kHaloW + wb * V) * 16;
    const float* f[E];
#pragma unroll
    for (int e = 0; e < E; ++e) f[e] = reinterpret_cast<const float*>(&v[e]);
#pragma unroll
    for (int q = 0; q < V; ++q) {
      const uint4 o = make_uint4(S::pack2(f[0][q], f[1][q]), S::pack2(f[2][q], f[3][q]), S::pack2(f[4][q], f[5][q]),
                                 S::pack2(f[6][q], f[7][q]));
      *reinterpret_cast<uint4*>(dst + q * 16) = o;
    }
  }
  stage_last_column<M, KS, true>(p, stage, u, ptid);
}

// One unit's input into a stage: planes d and d + 1 of rows qh0 .. qh0 + kTH and columns qw0 .. qw0 + kTW, as
// [plane][chunk][position][16 bytes], zero outside the input. ptid: the producer thread (0..127); WIDE: it has the
// launch's 168 registers (kernel.cuh). Fenced for the tensor cores' reads.
template <Mode M, int KS, bool CAST, bool WIDE>
__device__ void stage_unit(const Params& p, uint8_t* stage, const TileOrigin& u, int ptid) {
  if (p.x_rows16) {
    if constexpr (CAST) {
      stage_unit_rows_cast<M, KS>(p, stage, u, ptid);
    } else {
      stage_unit_rows<M, KS, WIDE>(p, stage, u, ptid);
    }
  } else {
    stage_unit_scalar<M, KS, CAST>(p, stage, u, ptid);
  }
  fence_proxy_async();
}

}  // namespace hopper
}  // namespace conv_transpose3d_post_pool
}  // namespace fused
