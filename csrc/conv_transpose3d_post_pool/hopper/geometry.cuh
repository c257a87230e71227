// Geometry of the fused convolution's sm_90a kernel (kernel.cuh beside this file).
//
// Formulation: per dim, pooled window q takes input q (shift 0: phase 0 through tap 1, phase 1 through tap 2) and
// input q + 1 (shift 1: phase 1 through tap 0). So input shift s = (sd, sh, sw) feeds the phases e >= s (every
// dim), 2^(zero shifts) of them, and the 8 shifts feed the 27 (phase, tap) pairs once each. Per shift one GEMM:
// M = 64 pooled positions (A: the input at those positions shifted by s, from the staged halo), N = 32 output
// channels x the phases fed by s (B: their taps' weights side by side), K = the input channels. Every product is a
// real tap: 7.25 GFLOP at the KernelBench size, no structural zeros. A thread's accumulators hold all 8 phases of its
// (position, channel) pairs, so the pool's max is in registers.
//
// A unit of work is one pooled d plane of kTH x kTW positions of one batch element: its input is two planes (d and
// d + 1) of (kTH + 1) x (kTW + 1) positions, staged by the producer warpgroup into a ring of kStages stages; each
// consumer warpgroup takes every other unit of its block and computes its kTW / 8 m64 tiles (8 rows x 8 columns
// of pooled positions each) one at a time: 8 shifts x the k-steps of wgmma, then the epilogue from registers.
#pragma once

#include "conv_transpose3d_post_pool/cuda/mma.cuh"

#include <cstddef>
#include <cstdint>

namespace fused {
namespace conv_transpose3d_post_pool {
namespace hopper {

constexpr int kTH = 8;   // pooled rows of a unit
constexpr int kTW = 32;  // pooled columns of a unit
constexpr int kHaloH = kTH + 1, kHaloW = kTW + 1;
constexpr int kSlice = kHaloH * kHaloW;  // staged positions per input plane
constexpr int kMTiles = kTW / 8;         // m64 tiles per unit (8 rows x 8 columns each)
constexpr int kConsumers = 2;            // consumer warpgroups; warpgroup 0 is the producer
constexpr int kThreads = 128 * (1 + kConsumers);
constexpr int kCoBlock = 32;             // output channels per block
constexpr int kCols = 27 * kCoBlock;     // B columns over all shifts
constexpr int kSmemBudget = 227 * 1024;  // sm_90's opt-in per block

// The accumulators: 8 slots of 16 registers per thread, slot j holding phase slot_phase(j): three segments, each a
// chain of phases in decreasing subset order (7 3 1 0 | 6 2 | 5 4), so that the phases a shift feeds in a segment
// are a prefix of it and the wgmma can stay in flight together (generate.py says why).
__host__ __device__ constexpr int slot_phase(int j) {
  // {7, 3, 1, 0, 6, 2, 5, 4} as 4-bit fields (no array: a run-time index would put it in local memory).
  return static_cast<int>((0x45260137u >> (4 * j)) & 0xfu);
}
__host__ __device__ constexpr int phase_slot(int ph) {
  for (int j = 0; j < 8; ++j) {
    if (slot_phase(j) == ph) return j;
  }
  return -1;
}

// The wgmma of one k-step, in issue order: input shift (sd * 4 + sh * 2 + sw), first slot, slots (wgmma_runs.cuh
// has one instruction per shape). The runs of shift 0 (the first three) feed every slot once, so they initialise the
// accumulators at k-step 0.
struct Run {
  int shift, slot0, slots;
};
constexpr int kRuns = 16;
__host__ __device__ constexpr Run run(int i) {
  // {0, 0, 4}, {0, 4, 2}, {0, 6, 2}, {1, 0, 3}, {1, 6, 1}, {2, 0, 2}, {2, 4, 2}, {3, 0, 2}, {4, 0, 1}, {4, 4, 1},
  // {4, 6, 2}, {5, 0, 1}, {5, 6, 1}, {6, 0, 1}, {6, 4, 1}, {7, 0, 1} as 4-bit fields per column of the table (no
  // array, as above).
  const unsigned long long shifts = 0x7665544432211000ull, slot0s = 0x0406064004060640ull,
                           slots = 0x1111121122213224ull;
  return Run{static_cast<int>((shifts >> (4 * i)) & 0xf), static_cast<int>((slot0s >> (4 * i)) & 0xf),
             static_cast<int>((slots >> (4 * i)) & 0xf)};
}
// B's columns of run i (32 per slot) and the columns of the runs before it.
__host__ __device__ constexpr int run_cols(int i) { return kCoBlock * run(i).slots; }
__host__ __device__ constexpr int run_col0(int i) {
  int c = 0;
  for (int k = 0; k < i; ++k) c += run_cols(k);
  return c;
}
static_assert(run_col0(kRuns) == kCols, "the runs hold the 27 (phase, tap) pairs once each");
static_assert(run(1).slot0 == 4 && run(3).slots == 3 && run(15).shift == 7 && run(10).slot0 == 6 &&
                  slot_phase(0) == 7 && slot_phase(4) == 6 && slot_phase(7) == 4,
              "the packed tables");
static_assert(run(0).shift == 0 && run(1).shift == 0 && run(2).shift == 0 && run(3).shift == 1 &&
                  run(0).slots + run(1).slots + run(2).slots == 8,
              "shift 0's runs come first and cover every slot");

// A whole unit's rows per consumer (store_unit_rows, epilogue.cuh), laid out as the unit's TMA stores read them
// (unit_maps.h: tensors seen as (w, c, h, d, n)): per 16-bit tensor (the outputs, then the selected values)
// [kTH pooled rows][32 channels][kTW columns], 64 bytes a channel's row, its 16-byte chunks placed as
// CU_TENSOR_MAP_SWIZZLE_64B places them (unit_swizzle64: the 8 channels of a transposing stmatrix's matrix then meet
// 32 distinct banks); then the offsets, a byte each, [kTH][32][kTW], as CU_TENSOR_MAP_SWIZZLE_32B places them. The
// swizzles act on address bits 7-8, so the rows start on kUnitAlign.
constexpr int kUnitRowBytes = kTW * 2;                     // one channel's row of a 16-bit tensor
constexpr int kUnitPlaneBytes = kCoBlock * kUnitRowBytes;  // one pooled row of every channel
constexpr int kUnitTensorBytes = kTH * kUnitPlaneBytes;
constexpr int kUnitOffPlaneBytes = kCoBlock * kTW;         // the same of offsets
constexpr int kUnitBytes = 2 * kUnitTensorBytes + kTH * kUnitOffPlaneBytes;
constexpr int kUnitAlign = 1024;
static_assert(kUnitRowBytes == 64 && kTW == 32, "a 16-bit row is one 64-byte swizzle span, an offset row one 32-byte");

// The shared address where CU_TENSOR_MAP_SWIZZLE_64B / _32B put the 16 bytes at unswizzled address `addr`: the chunk
// index (bits 4-5, or bit 4) XOR bits 7-8 (or bit 7).
__host__ __device__ constexpr uint32_t unit_swizzle64(uint32_t addr) { return addr ^ (((addr >> 7) & 3u) << 4); }
__host__ __device__ constexpr uint32_t unit_swizzle32(uint32_t addr) { return addr ^ (((addr >> 7) & 1u) << 4); }

// The output rows per consumer warp through which form (TRAIN, MIXED) of precision m stores whole tiles
// (epilogue.cuh): the 16-bit training forms two tiles' outputs, the same of selected values, then 32 channels x 16
// columns x 2 rows of offset bytes (store_pair_rows2); the 16-bit inference forms two tiles' outputs (store_out_rows2,
// [2 rows][32 channels][2 halves][16 bytes]); the TF32 training form one tile's float32 values, then its offset bytes
// (store_rows32); the mixed training form one tile's float32 outputs, its 16-bit selected values and its offset bytes
// (store_rows_mixed). The others store element by element and hold none: shared memory a form does not use only takes
// from the L1 cache, which shares the multiprocessor's 256 KB with it (the driver sizes the split to the block's
// shared memory).
__host__ __device__ constexpr int out_rows_bytes(Mode m, bool train, bool mixed) {
  if (mixed) return train ? 2 * kCoBlock * 8 * 4 + 3 * kCoBlock * 16 : 0;
  if (m == Mode::kStrict) return 0;
  if (m == Mode::kTF32) return train ? 5 * kCoBlock * 16 : 0;
  return train ? 5 * kCoBlock * 32 : 2 * kCoBlock * 32;
}

// Operand sizes for precision M with KS k-steps (8 TF32 or 16 16-bit channels each). Both operands are K-major
// without swizzling: a "chunk" is 16 bytes of consecutive channels (4 float32 or 8 16-bit) of one row (position or
// column), and a core matrix is 8 rows of one chunk, 128 contiguous bytes. UNIT: the consumers' unit rows too (the
// 16-bit training forms' store_unit_rows); the inference forms go without them, whose shared memory is then smaller and
// leaves the L1 cache more room (the cast form reads its float32 operands through it: 41 -> 51 us with them, H100).
//
// OUT_ROWS: the output rows per consumer warp of the instantiation's form (out_rows_bytes); by default the largest of
// M's forms, as sizes are checked against (epilogue.cuh).
template <Mode M, int KS, bool UNIT = false, int OUT_ROWS = out_rows_bytes(M, true, false)>
struct Layout {
  static constexpr int kChunkElems = ModeTraits<M>::kHalf ? 8 : 4;
  static constexpr int kChunks = 2 * KS;  // a k-step is two chunks
  // A: per plane, chunk-major: [chunk][position][16 bytes].
  static constexpr int kChunkBytes = kSlice * 16;
  static constexpr int kPlaneBytes = kChunks * kChunkBytes;
  static constexpr int kStageBytes = 2 * kPlaneBytes;
  // B: per run, [chunk][column][16 bytes]; strict float32 holds two copies, the weights' TF32 high parts, then
  // their low parts (strict.cuh).
  static constexpr int kBCopyBytes = kCols * kChunks * 16;
  static constexpr int kBBytes = (M == Mode::kStrict ? 2 : 1) * kBCopyBytes;
  static constexpr int kParamBytes = 3 * kCoBlock * 4;  // multipliers, biases, the selection's biases
  static constexpr int kTapTableBytes = 27 * 8;         // stage_weights_tf32's per-tap B offsets
  static constexpr int kOutRowsBytes = OUT_ROWS;
  // The consumers' unit rows (kUnitBytes each).
  static_assert(!UNIT || ModeTraits<M>::kHalf, "unit rows hold 16-bit values");
  static constexpr int kUnitScratchBytes = UNIT ? kConsumers * kUnitBytes + kUnitAlign : 0;  // + the alignment
  static constexpr int kOutScratchBytes = 4 * kConsumers * kOutRowsBytes;
  // + up to 8 stages' mbarriers, and the weights' two (landed, raw_free)
  static constexpr int kFixed =
      kBBytes + kOutScratchBytes + kUnitScratchBytes + kParamBytes + kTapTableBytes + 2 * 8 * 8 + 2 * 8;
  static constexpr int kStages = (kSmemBudget - kFixed) / kStageBytes >= 4 ? 4 : (kSmemBudget - kFixed) / kStageBytes;
  static_assert(kStages >= 2, "the instantiation does not fit two stages");
  static constexpr size_t kSmem =
      static_cast<size_t>(kBBytes) + kStages * kStageBytes + kOutScratchBytes + kUnitScratchBytes + kParamBytes +
      2 * 8 * (kStages + 1) + kTapTableBytes;
};

}  // namespace hopper
}  // namespace conv_transpose3d_post_pool
}  // namespace fused
