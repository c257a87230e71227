// The fused convolution's forward on Hopper's asynchronous tensor cores (sm_90a): same contract and arithmetic as
// the mma.sync kernel (cuda/kernel.cuh), formulation and geometry in geometry.cuh.
//
// Roles: warpgroup 0 produces (stages each unit's input into the stage ring, signalling `full`), warpgroups 1 and 2
// consume alternate units of the block (wgmma from the stage and the block's resident weights, then the epilogue,
// releasing the stage through `empty` as soon as the unit's last products are done). The consumers stage the block's
// weights while the producer stages its first units. Blocks are persistent: block b takes units b, b + gridDim.x, ...
// of its 32 output channels (blockIdx.y). With p.halves (fewer units than blocks), the block's items are half units
// instead (item i: unit i / 2, tiles 2 (i % 2) and 2 (i % 2) + 1), and both consumers take every item, one tile each.
#pragma once

#include "conv_transpose3d_post_pool/ablation.h"
#include "conv_transpose3d_post_pool/contract.h"
#include "conv_transpose3d_post_pool/hopper/epilogue.cuh"
#include "conv_transpose3d_post_pool/hopper/stage.cuh"
#include "conv_transpose3d_post_pool/hopper/strict.cuh"
#include "conv_transpose3d_post_pool/hopper/trace.cuh"
#include "conv_transpose3d_post_pool/hopper/unit_maps.h"
#include "conv_transpose3d_post_pool/hopper/wgmma_runs.cuh"
#include "common/cuda_device.h"

#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>

#include <utility>

namespace fused {
namespace conv_transpose3d_post_pool {
namespace hopper {

// The launch's registers per thread (__launch_bounds__(kThreads, 1): 64 K / 384, rounded down to a multiple of 8).
// setmaxnreg moves registers between the roles within the block's 384 x 168: a consumer's increase waits until the
// pool has them, so a split asking for more than the decreases free never starts.
constexpr int kLaunchRegs = 168;
__host__ __device__ constexpr bool fits_launch(int producer_regs, int consumer_regs) {
  return 128 * producer_regs + 128 * kConsumers * consumer_regs <= kThreads * kLaunchRegs;
}

// Registers per thread of each role in the training form: 128 x 88 + 256 x 208 fill the launch's 384 x 168 (the
// producer holds a batch of 16-byte loads in flight; the consumers' 128 accumulators and the training epilogue use
// ~205). The inference form's consumers fit the launch's 168 (SASS: 166), so there no registers move and the
// producer keeps 168: a whole unit's loads in one batch (stage_unit's WIDE).
constexpr int kProducerRegs = 88;
constexpr int kConsumerRegs = 208;
static_assert(fits_launch(kProducerRegs, kConsumerRegs), "the roles' registers exceed the launch's");

// The 16-bit training forms (not mixed) select by pairs: each tile's phases rounded into PhasePairs, then
// store_pairs (epilogue.cuh), in the consumer loop as every other form but strict float32 (without turns: kTurns).
// docs/performance.md measures this against a loop that pipelined their tiles (the next tile's products issued
// before the previous tile's selection and stores, registers 56 / 224).
template <Mode M, bool TRAIN, bool MIXED>
constexpr bool kPairs = TRAIN && ModeTraits<M>::kHalf && !MIXED;
// Whether the consumers take turns at the tensor cores (the consumer loop): not in the 16-bit training forms, whose
// epilogue costs ~3x their products, so that falling into step costs little and the handshake (its barrier stalls:
// 13 % of the bf16 training form's warp samples, Nsight Compute on an H100) nothing.
template <Mode M, bool TRAIN, bool MIXED>
constexpr bool kTurns = !kPairs<M, TRAIN, MIXED>;
// Whether whole units store through the consumer's unit rows and the TMA unit (store_unit_rows): the 16-bit
// training forms (not mixed, whose outputs are float32); the 16-bit inference forms measured no faster with it (H100:
// bf16 29.9 -> 31.0 us, with the unit rows in every 16-bit form's shared memory).
template <Mode M, bool TRAIN, bool MIXED>
constexpr bool kUnitBulk = kPairs<M, TRAIN, MIXED>;
// Whether the roles split on a warp-uniform warpgroup index (sync.cuh): on the H200 the 16-bit inference forms
// measured ~2 us faster with it (bf16 33.4 -> 31.4), TF32 inference ~0.7 us slower (44.3 -> 45.0); on the H100 the
// 16-bit training forms ~2 us slower (bf16 100.4 -> 102.7), the mixed training form ~1 us.
template <Mode M, bool TRAIN>
constexpr bool kUniformRoles = ModeTraits<M>::kHalf && !TRAIN;
// Whether the roles move registers (release_registers / claim_registers): the training forms, and strict float32,
// whose consumers hold two 16-register parts and two split A fragments beside the 128 accumulators (strict.cuh),
// with the training forms' kProducerRegs / kConsumerRegs.
template <Mode M, bool TRAIN>
constexpr bool kMovesRegisters = TRAIN || M == Mode::kStrict;

// Whether a measurement build leaves `part` out (ablation.h); false, at compile time, in every other build.
__device__ __forceinline__ bool ablated(const Params& p, uint32_t part) {
  if constexpr (kHopperAblationBuilt) {
    return (p.ablate & part) != 0;
  } else {
    (void)p;
    (void)part;
    return false;
  }
}

// The work items of the launch (per channel block): units, or with p.halves half units (item i: unit i / 2).
__host__ __device__ __forceinline__ int64_t work_items(const Params& p) { return p.halves ? 2 * p.n_tiles : p.n_tiles; }
__device__ __forceinline__ int64_t item_unit(const Params& p, int64_t item) { return p.halves ? item >> 1 : item; }
// The trace's slots for consumer c's item k (trace.cuh): one per consumer and item.
__device__ __forceinline__ int64_t traced_item(const Params& p, int64_t k, int c) {
  return p.halves ? 2 * k + c : k;
}

__device__ __forceinline__ TileOrigin unit_origin(const Params& p, int64_t unit) {
  return decode_tile(unit, p.n_tiles, p.tiles_d, p.tiles_h, p.tiles_w, 1, kTH, kTW);
}

// The products of one m64 tile: every run's wgmma for every k-step, into the slots' accumulators. a16: the tile's
// first A row in the stage, b16: B, both shared addresses in 16-byte units (smem_desc16); every other offset is a
// compile-time constant. Shift 0's runs at k-step 0 overwrite (together they feed every slot once).
template <Mode M, int KS, int R, int KSTEP>
__device__ __forceinline__ void issue_run(float (&acc)[8][16], uint32_t a16, uint32_t b16) {
  using L = Layout<M, KS>;
  constexpr Run r = run(R);
  constexpr int sd = r.shift >> 2, sh = (r.shift >> 1) & 1, sw = r.shift & 1;
  constexpr uint32_t a_off = (sd * L::kPlaneBytes + 2 * KSTEP * L::kChunkBytes + (sh * kHaloW + sw) * 16) / 16;
  constexpr uint32_t b_off = run_col0(R) * L::kChunks + 2 * KSTEP * run_cols(R);
  wgmma_run<M, r.slot0, r.slots>(acc, smem_desc16<L::kChunkBytes, kHaloW * 16>(a16 + a_off),
                                 smem_desc16<run_cols(R) * 16, 128>(b16 + b_off), (r.shift == 0 && KSTEP == 0) ? 0 : 1);
}

// The order a tile's wgmma are issued in: entry e = run * KS + k-step. Each accumulator segment (geometry.cuh) keeps
// its runs in order, k-steps inner (so every phase sums shift by shift, k-steps inner, as the mma.sync kernel does),
// and the segments interleave: the long segment (phases 7 3 1 0, fed by every shift) alternates with the two short
// ones, so that an instruction never waits on the one just before it. A tile's wgmma are one dependent chain per
// segment; issued segment after segment, a tile took ~1.4 us of tensor-pipe latency against ~0.5 of throughput.
template <int KS>
__host__ __device__ constexpr int issue_entry(int i) {
  int order[kRuns * KS] = {};
  int na = 0, nb = 0;
  int a[kRuns * KS] = {}, b[kRuns * KS] = {};
  for (int r = 0; r < kRuns; ++r) {
    for (int ks = 0; ks < KS; ++ks) {
      if (run(r).slot0 == 0) {
        a[na++] = r * KS + ks;
      } else {
        b[nb++] = r * KS + ks;
      }
    }
  }
  int ia = 0, ib = 0;
  for (int n = 0; n < kRuns * KS; ++n) {
    const bool take_a = ia < na && (n % 2 == 0 || ib >= nb);
    order[n] = take_a ? a[ia++] : b[ib++];
  }
  return order[i];
}

template <Mode M, int KS, int... I>
__device__ __forceinline__ void issue_entries(float (&acc)[8][16], uint32_t a16, uint32_t b16,
                                              std::integer_sequence<int, I...>) {
  (issue_run<M, KS, issue_entry<KS>(I) / KS, issue_entry<KS>(I) % KS>(acc, a16, b16), ...);
}

// a_stage, b: shared addresses (16-byte aligned); mt: the tile (8 pooled columns each).
// (Strict float32 has its own, strict_tile_products: its consumer loop never reaches this.)
template <Mode M, int KS>
__device__ __forceinline__ void tile_products(float (&acc)[8][16], uint32_t a_stage, uint32_t b, int mt) {
  if constexpr (M != Mode::kStrict) {
    issue_entries<M, KS>(acc, (a_stage >> 4) + 8 * mt, b >> 4, std::make_integer_sequence<int, kRuns * KS>{});
  }
}

template <Mode M, int KS, bool TRAIN, bool MIXED, bool CAST>
__global__ void __launch_bounds__(kThreads, 1) conv_transpose3d_post_pool_hopper_kernel(const __grid_constant__ Params p) {
#if defined(FUSED_WGMMA_ENABLED)
  using L = Layout<M, KS, kUnitBulk<M, TRAIN, MIXED>, out_rows_bytes(M, TRAIN, MIXED)>;
  static_assert(L::kStages == Layout<M, KS>::kStages, "the unit rows leave the stage ring as RawWeights sees it");
  using Out = OutputTraits<M, MIXED>;
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* const sB = smem;
  uint8_t* const sStages = smem + L::kBBytes;
  uint8_t* const sOutRows = sStages + L::kStages * L::kStageBytes;  // the consumer warps' output rows (epilogue.cuh)
  // The consumers' unit rows (store_unit_rows), from the first kUnitAlign boundary of their share.
  uint8_t* const sUnitShare = sOutRows + L::kOutScratchBytes;
  uint8_t* const sUnit = sUnitShare + ((kUnitAlign - smem_addr(sUnitShare) % kUnitAlign) % kUnitAlign);
  float* const sMult = reinterpret_cast<float*>(sUnitShare + L::kUnitScratchBytes);
  float* const sBias = sMult + kCoBlock;
  float* const sSelBias = sBias + kCoBlock;  // EpilogueArgs::sel_bias
  uint64_t* const full = reinterpret_cast<uint64_t*>(sSelBias + kCoBlock);
  uint64_t* const empty = full + L::kStages;
  uint64_t* const landed = empty + L::kStages;  // the weights' bulk copies (stage_weights_bulk)
  uint64_t* const raw_free = landed + 1;         // the consumers are done with the raw weights
  int* const tap_table = reinterpret_cast<int*>(raw_free + 1);

  const int tid = threadIdx.x;
  const int co0 = blockIdx.y * kCoBlock;
  if (tid == 0) trace_mark(p, kTraceStart);
  bool breaks_monotone = false, outside_pairs = false;
  if (tid < kCoBlock) {
    const int co = co0 + tid;
    const bool ok = co < p.Cout;
    const float m = ok ? Out::multiplier(p, co) : 1.f;
    // Without a bias, -0: adding it leaves every value as it is (-0 included).
    const float b = ok && p.bias != nullptr ? Source<M, CAST>::value(p.bias, co) : -0.f;
    const float inf = __int_as_float(0x7f800000);
    breaks_monotone = ok && (m == 0.f || !(fabsf(m) < inf) || !(fabsf(b) < inf));
    outside_pairs = ok && !pair_scale_ok(fabsf(m));
    sMult[tid] = m;
    sBias[tid] = b;
  }
  if (tid == 0) {
    for (int s = 0; s < L::kStages; ++s) {
      mbar_init(&full[s], 128);
      mbar_init(&empty[s], p.halves ? 256 : 128);  // with halves, both consumers read every stage
    }
    mbar_init(landed, 1);
    mbar_init(raw_free, 128 * kConsumers);
    mbar_init_fence();
  }
  const bool any_breaks = __syncthreads_or(breaks_monotone);
  // Block-uniform: the monotone form only where it is exact for every channel of the block.
  const bool monotone = p.s1 > 0.f && p.s2 > 0.f && !any_breaks;
  const bool exact = TRAIN || !monotone;
  // The weights staged negated for negative multipliers: the inference forms' monotone form, and the training forms'
  // monotone selection (unit slopes; not the mixed form, whose selection is always exact; in the 16-bit forms only
  // with multipliers and slopes in select_pair's range).
  bool negate = TRAIN ? !MIXED && monotone && p.unit_slopes : !exact;
  if constexpr (kPairs<M, TRAIN, MIXED>) {
    negate = __syncthreads_or(outside_pairs) == 0 && negate && pair_scale_ok(p.s1) && pair_scale_ok(p.s2);
  }

  // The producer starts staging at once; the consumers stage the weights meanwhile, then meet (named barrier 3).
  // The role split: read through the shuffle in the 16-bit inference forms, a plain division in the others
  // (kUniformRoles).
  const int wg = kUniformRoles<M, TRAIN> ? warpgroup_index_uniform() : tid / 128;
  if (wg == 0) {
    if constexpr (kMovesRegisters<M, TRAIN>) {
      release_registers<kProducerRegs>();
    }
    const int64_t items = work_items(p);
    for (int64_t k = 0;; ++k) {
      const int64_t item = blockIdx.x + k * gridDim.x;
      if (item >= items) break;
      const int64_t unit = item_unit(p, item);
      const int stage = static_cast<int>(k % L::kStages);
      const uint32_t round = static_cast<uint32_t>(k / L::kStages);
      if (tid == 0) trace_mark(p, producer_slot(k, 0));
      if (round > 0) mbar_wait(&empty[stage], (round - 1) & 1u);
      // The ring's last stages held the raw weights until the consumers built B from them.
      if constexpr (!CAST && M != Mode::kStrict) {
        if (p.w_bulk && k == RawWeights<M, KS>::kFirstStage) mbar_wait(raw_free, 0);
      }
      if (tid == 0) trace_mark(p, producer_slot(k, 1));
      if (!ablated(p, kAblateStaging)) {
        stage_unit<M, KS, CAST, !kMovesRegisters<M, TRAIN>>(p, sStages + stage * L::kStageBytes, unit_origin(p, unit),
                                                            tid);
      }
      if (tid == 0) trace_mark(p, producer_slot(k, 2));
      mbar_arrive(&full[stage]);
    }
    if (tid == 0) trace_mark(p, kTraceProducerEnd);
    return;
  }

  bool w_nonfinite;
  if constexpr (!CAST && M != Mode::kStrict) {
    w_nonfinite = p.w_bulk ? stage_weights_bulk<M, KS>(p, sB, sStages + RawWeights<M, KS>::kFirstStage * L::kStageBytes,
                                                       landed, tap_table, co0, sMult, negate, tid - 128)
                           : stage_weights<M, KS, CAST>(p, sB, tap_table, co0, sMult, negate, tid - 128);
  } else {
    w_nonfinite = stage_weights<M, KS, CAST>(p, sB, tap_table, co0, sMult, negate, tid - 128);
  }
  // The training forms' bias for y = acc * acc_sign + sel_bias (read after the consumers' barrier below): the bias,
  // but +0 for -0 where the weights were staged negated. There acc is -S, or +0 where the sum S is +0 (the
  // accumulators start from +0), and -0 + -0 would make y -0 where S + b is +0.
  if (TRAIN && !MIXED && tid - 128 < kCoBlock) {
    const int c = tid - 128;
    sSelBias[c] = negate && sMult[c] < 0.f ? sBias[c] + 0.f : sBias[c];
  }
  // Every consumer thread frees the raw weights after its own reads of them (release), rather than one thread after
  // a barrier: the producer's wait then orders each reader's loads before its stores directly (compute-sanitizer's
  // racecheck reported the one-thread form once a producer reached the raw weights' stages).
  if (p.w_bulk) mbar_arrive(raw_free);
  const bool fix_edges = consumers_sync_or(w_nonfinite);
  if constexpr (kMovesRegisters<M, TRAIN>) {
    claim_registers<kConsumerRegs>();
  }
  const int c = wg - 1, ctid = tid - 128 * wg;
  if (tid == 128) trace_mark(p, kTraceWeights);
  const int warp = ctid >> 5, lane = ctid & 31, g = lane >> 2, t = lane & 3;
  const EpilogueArgs args{sMult, sBias, sSelBias, co0, exact, monotone, negate};
  const uint32_t b_addr = smem_addr(sB);
  float acc[8][16];
#pragma unroll
  for (int ph = 0; ph < 8; ++ph)
#pragma unroll
    for (int r = 0; r < 16; ++r) acc[ph][r] = 0.f;

  if constexpr (M == Mode::kStrict) {
    // Strict float32 (inference only): each consumer takes its items' tiles in turn, no turns at the tensor cores
    // (its own products keep one entry in flight while it adds the other: strict.cuh). A block whose weights have a
    // non-finite high part (w_nonfinite, block-uniform through fix_edges) recomputes its outputs from global memory
    // instead, exactly (recompute_unit): the split needs cross(B) there, which B's two copies do not hold.
    static_assert(!TRAIN && !MIXED && !CAST, "strict float32: the inference form");
    const int64_t items = work_items(p);
    const int item_tiles = p.halves ? 1 : kMTiles;
    const uint32_t bh16 = b_addr >> 4, bl16 = (b_addr + L::kBCopyBytes) >> 4;
    for (int64_t k = p.halves ? 0 : c;; k += p.halves ? 1 : kConsumers) {
      const int64_t item = blockIdx.x + k * gridDim.x;
      if (item >= items) break;
      const int mt0 = p.halves ? static_cast<int>(item & 1) * 2 + c : 0;
      const int64_t tk = traced_item(p, k, c);
      const int stage = static_cast<int>(k % L::kStages);
      const TileOrigin u = unit_origin(p, item_unit(p, item));
      if (ctid == 0) trace_mark(p, consumer_slot(tk, 0));
      mbar_wait(&full[stage], static_cast<uint32_t>(k / L::kStages) & 1u);
      if (ctid == 0) trace_mark(p, consumer_slot(tk, 1));
      if (fix_edges) {
        mbar_arrive(&empty[stage]);
        recompute_unit<M, false, false, false, false>(p, u, co0, ctid, 8 * mt0, 8 * item_tiles);
        continue;
      }
      // The thread's first A word of tile 0: its warp's first halo row, column g, k-word t (strict.cuh).
      const uint8_t* const a_thread = sStages + stage * L::kStageBytes + ((2 * warp) * kHaloW + g) * 16 + 4 * t;
#pragma unroll 1
      for (int i = 0; i < item_tiles; ++i) {
        const int mt = mt0 + i;
        if (!ablated(p, kAblateMma)) strict_tile_products<KS>(acc, a_thread + 8 * mt * 16, bh16, bl16);
        pin_all(acc);
        if (ctid == 0) trace_mark(p, consumer_slot(tk, 2 + 2 * i));
        if (i == item_tiles - 1) mbar_arrive(&empty[stage]);
        if (!ablated(p, kAblateEpilogue)) store_tile<M, false, false>(p, acc, u, mt, warp, g, t, args, nullptr);
        if (ctid == 0) trace_mark(p, consumer_slot(tk, 3 + 2 * i));
      }
    }
    if (ctid == 0) trace_mark(p, kTraceConsumerEnd + c);
    return;
  }

  // The consumers' turns at the tensor cores, tile by tile: consumer 0 issues its j-th tile's wgmma after consumer 1
  // has issued its (j-1)-th, consumer 1 its j-th after consumer 0's j-th, so that the tensor cores take the two
  // consumers' tiles alternately and each one's epilogue runs while the other's products do; left to themselves the
  // consumers fall into step, both multiplying, then both in their epilogues. Consumer 0 takes the odd unit out.
  // With halves both consumers take every item, consumer c its tile 2 (item % 2) + c.
  // (32-bit: the launcher keeps a block's items far below 2^29.)
  const int64_t items = work_items(p);
  uint8_t* const rows = sOutRows + (4 * c + warp) * L::kOutRowsBytes;  // this warp's (store_out_rows, store_rows32)
  uint8_t* const unit_rows = sUnit + c * kUnitBytes;                    // this consumer's (store_unit_rows)
  // The launch's share of unit_bulk below: the tensors' maps encoded (the rows kTW apart, addresses and strides the
  // TMA unit takes: unit_maps.h), and no far-edge fix rewriting outputs after the stores.
  const bool unit_rows_ok = kUnitBulk<M, TRAIN, MIXED> && !CAST && p.unit_tma && !p.halves && !fix_edges;
  const int block_items = static_cast<int>((items - blockIdx.x + gridDim.x - 1) / gridDim.x);
  const int item_tiles = p.halves ? 1 : kMTiles;  // this consumer's tiles of one item
  const int tiles0 = p.halves ? block_items : (block_items + 1) / 2 * kMTiles;
  const int tiles1 = p.halves ? block_items : block_items / 2 * kMTiles;
  int j = 0;  // this consumer's tiles so far
  for (int64_t k = p.halves ? 0 : c;; k += p.halves ? 1 : kConsumers) {
    const int64_t item = blockIdx.x + k * gridDim.x;
    if (item >= items) break;
    const int64_t unit = item_unit(p, item);
    const int mt0 = p.halves ? static_cast<int>(item & 1) * 2 + c : 0;
    const int64_t tk = traced_item(p, k, c);
    const int stage = static_cast<int>(k % L::kStages);
    if (ctid == 0) trace_mark(p, consumer_slot(tk, 0));
    mbar_wait(&full[stage], static_cast<uint32_t>(k / L::kStages) & 1u);
    if (ctid == 0) trace_mark(p, consumer_slot(tk, 1));
    const uint32_t a_stage = smem_addr(sStages + stage * L::kStageBytes);
    const TileOrigin u = unit_origin(p, unit);
    // The item's tiles as one whole unit through the TMA unit: this consumer takes all of its tiles, the last one (and
    // so every one) whole.
    const bool unit_bulk = unit_rows_ok && tile_is_whole(p, u, kMTiles - 1, args);
#pragma unroll 1
    for (int i = 0; i < item_tiles; ++i) {
      const int mt = mt0 + i;
      pin_all(acc);
      if (kTurns<M, TRAIN, MIXED> && (c == 1 || (j > 0 && j - 1 < tiles1))) turn_wait(c);
      if (!ablated(p, kAblateMma)) {
        wgmma_fence();
        tile_products<M, KS>(acc, a_stage, b_addr, mt);
        wgmma_commit();
      }
      if (kTurns<M, TRAIN, MIXED> && (c == 0 ? j < tiles1 : j + 1 < tiles0)) turn_pass(1 - c);
      ++j;
      if (!ablated(p, kAblateMma)) wgmma_wait_all();
      pin_all(acc);
      if (ctid == 0) trace_mark(p, consumer_slot(tk, 2 + 2 * i));
      if (i == item_tiles - 1) mbar_arrive(&empty[stage]);
      if (!ablated(p, kAblateEpilogue)) {
        if constexpr (kPairs<M, TRAIN, MIXED>) {
          // The 16-bit training forms: the phases rounded into pairs, then the pairs' selection and stores.
          PhasePairs<M> phases;
          pair_phases<M>(acc, t, args, phases);
          store_pairs<M>(p, phases, u, mt, warp, g, t, args, rows, unit_bulk ? unit_rows : nullptr);
        } else {
          store_tile<M, TRAIN, MIXED>(p, acc, u, mt, warp, g, t, args, rows);
        }
      }
      if (ctid == 0) trace_mark(p, consumer_slot(tk, 3 + 2 * i));
    }
    if (fix_edges) {
      warpgroup_sync(c);  // orders the warpgroup's stores above before the overwrites
      fix_unit_edges<M, TRAIN, MIXED, CAST>(p, u, co0, ctid, 8 * mt0, 8 * item_tiles);
    }
  }
  // The rows stay in use until the engine has read them (the block's shared memory goes to the next block).
  if constexpr (kUnitBulk<M, TRAIN, MIXED>) bulk_wait_read();
  if (ctid == 0) trace_mark(p, kTraceConsumerEnd + c);
#else
  (void)p;
#endif
}

template <Mode M, int KS, bool TRAIN, bool MIXED, bool CAST>
void launch_hopper_one(const Params& p0, cudaStream_t stream) {
  using L = Layout<M, KS, kUnitBulk<M, TRAIN, MIXED>, out_rows_bytes(M, TRAIN, MIXED)>;
  auto kernel = conv_transpose3d_post_pool_hopper_kernel<M, KS, TRAIN, MIXED, CAST>;
  static DynamicSmemLimit smem_limit;
  const int device = current_cuda_device();
  smem_limit.raise_to(reinterpret_cast<const void*>(kernel), L::kSmem, device);
  Params p = p0;
  const int64_t co_blocks = (p.Cout + kCoBlock - 1) / kCoBlock;
  TORCH_CHECK(co_blocks <= 65535, "conv_transpose3d_post_pool: too many output channels for one launch: ", p.Cout);
  // One block per multiprocessor (its shared memory), spread over the channel blocks. With fewer units than blocks
  // (batch 1 at the KernelBench size: 64 units for 132 multiprocessors), work goes out by half units, one m64 tile
  // to each consumer: twice the blocks busy and both consumers of each, where a unit per block left half the
  // multiprocessors idle and one consumer doing 4 tiles in a row.
  const int64_t bx_full = (multiprocessor_count(device) + co_blocks - 1) / co_blocks;
  const ConvHopperSplit split = conv_hopper_split_choice();
  p.halves = split == ConvHopperSplit::kHalves || (split == ConvHopperSplit::kAuto && p.n_tiles < bx_full);
  if constexpr (kUnitBulk<M, TRAIN, MIXED> && !CAST) {
    p.unit_tma = !p.halves && encode_unit_maps(p);
  } else {
    p.unit_tma = false;
  }
  const int64_t items = work_items(p);
  int64_t bx = bx_full < items ? bx_full : items;
  bx = bx > 0 ? bx : 1;
  kernel<<<dim3(static_cast<unsigned>(bx), static_cast<unsigned>(co_blocks)), kThreads, L::kSmem, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The Hopper kernel's grid of units (a unit: one pooled plane of kTH x kTW positions) in Params' tile fields, then
// the instantiation for the input channels: 8 TF32 channels per k-step, 16 for 16-bit types. CAST (float32 operands
// rounded on load, source.cuh) has the inference form only.
template <Mode M, bool MIXED, bool CAST>
void launch_hopper_form(const Params& p0, bool train, cudaStream_t stream) {
  Params p = p0;
  // 16-byte row loads: unit w stride, every other stride and the base a multiple of a vector, rows of whole vectors.
  const int e = 16 / Source<M, CAST>::kElemBytes;
  p.x_rows16 = p.sx[4] == 1 && p.sx[0] % e == 0 && p.sx[1] % e == 0 && p.sx[2] % e == 0 && p.sx[3] % e == 0 &&
               p.W % e == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0;
  // The block's weight rows by bulk copies: the weight contiguous ([Cin][Cout][3][3][3]) and every block's rows
  // 16-byte aligned (a block's first channel is a multiple of 32, so its rows start on 16 bytes when the weight does
  // and Cout x 27 elements are whole 16 bytes).
  const int64_t ew = Source<M, CAST>::kElemBytes;
  // Not strict float32, which builds B's two copies from gathered loads (stage_weights_tf32).
  p.w_bulk = !CAST && M != Mode::kStrict && p.sw[4] == 1 && p.sw[3] == 3 && p.sw[2] == 9 && p.sw[1] == 27 &&
             p.sw[0] == 27 * int64_t{p.Cout} && (27 * int64_t{p.Cout} * ew) % 16 == 0 &&
             reinterpret_cast<uintptr_t>(p.w) % 16 == 0;
  // The whole-tile output rows as aligned vectors (epilogue.cuh, store_out_rows and store_rows32): unit w stride,
  // every other stride a multiple of 8 elements, out and the training form's selected values on 16 bytes, its
  // offsets on 8.
  p.out_rows = p.so[4] == 1 && p.so[0] % 8 == 0 && p.so[1] % 8 == 0 && p.so[2] % 8 == 0 && p.so[3] % 8 == 0 &&
                 reinterpret_cast<uintptr_t>(p.out) % 16 == 0 &&
                 (p.sel == nullptr || (reinterpret_cast<uintptr_t>(p.sel) % 16 == 0 &&
                                       reinterpret_cast<uintptr_t>(p.off) % 8 == 0));
  p.tiles_d = p.PD;
  p.tiles_h = (p.PH + kTH - 1) / kTH;
  p.tiles_w = (p.PW + kTW - 1) / kTW;
  p.n_tiles = static_cast<int64_t>(p.N) * p.tiles_d * p.tiles_h * p.tiles_w;
  if constexpr (CAST) {
    TORCH_INTERNAL_ASSERT(!train, "the sm_90a kernel rounds float32 operands in its inference form only");
    return launch_hopper_one<M, 1, false, MIXED, true>(p, stream);
  } else if constexpr (ModeTraits<M>::kHalf) {
    if (train) return launch_hopper_one<M, 1, true, MIXED, false>(p, stream);
    return launch_hopper_one<M, 1, false, MIXED, false>(p, stream);
  } else if constexpr (M == Mode::kStrict) {
    TORCH_INTERNAL_ASSERT(!train, "the sm_90a kernel has the inference form of strict float32 only");
    if (p.Cin <= 8) return launch_hopper_one<M, 1, false, false, false>(p, stream);
    return launch_hopper_one<M, 2, false, false, false>(p, stream);
  } else {
    if (p.Cin <= 8) {
      if (train) return launch_hopper_one<M, 1, true, MIXED, false>(p, stream);
      return launch_hopper_one<M, 1, false, MIXED, false>(p, stream);
    }
    if (train) return launch_hopper_one<M, 2, true, MIXED, false>(p, stream);
    return launch_hopper_one<M, 2, false, MIXED, false>(p, stream);
  }
}

}  // namespace hopper
}  // namespace conv_transpose3d_post_pool
}  // namespace fused
