// Event trace of the sm_90a kernel (kernel.cuh) in a measurement build: one thread of a role writes its multiprocessor's
// clock at named points into p.trace[blockIdx.x * kTraceSlots + slot] (first channel block only), so that a
// benchmark (benchmarks/conv_transpose3d_post_pool/trace_call.py) can lay out where a block's time goes: when the
// weights are in, how long each unit's staging takes, how long a consumer waits for it, its products and its
// epilogue. Compiles to nothing outside a measurement build or without a trace buffer.
#pragma once

#include "conv_transpose3d_post_pool/ablation.h"
#include "conv_transpose3d_post_pool/cuda/params.cuh"

namespace fused {
namespace conv_transpose3d_post_pool {
namespace hopper {

constexpr int kTraceSlots = 256;
constexpr int kTraceUnits = 16;  // units per block traced
enum TraceSlot : int {
  kTraceStart = 0,         // the block starts (thread 0)
  kTraceWeights = 1,       // the consumers' weights are staged (first consumer thread)
  kTraceConsumerEnd = 2,   // + consumer warpgroup (0, 1): its last unit done
  kTraceProducerEnd = 4,   // the producer's last unit staged
  kTraceProducer = 8,      // + 3 * unit + (0 waits for its stage, 1 starts staging, 2 staged)
  kTraceConsumer = 64,     // + 12 * unit + (0 waits for the unit, 1 has it, 2 + 2 * mt products done, 3 + 2 * mt stored)
};

__device__ __forceinline__ void trace_mark(const Params& p, int slot) {
  if constexpr (kHopperAblationBuilt) {
    if (p.trace != nullptr && blockIdx.y == 0 && slot < kTraceSlots) {
      p.trace[static_cast<int64_t>(blockIdx.x) * kTraceSlots + slot] = static_cast<long long>(clock64());
    }
  } else {
    (void)p;
    (void)slot;
  }
}

// Unit k's slots, or past the table for units beyond kTraceUnits (not written).
__device__ __forceinline__ int producer_slot(int64_t k, int event) {
  return k < kTraceUnits ? kTraceProducer + 3 * static_cast<int>(k) + event : kTraceSlots;
}
__device__ __forceinline__ int consumer_slot(int64_t k, int event) {
  return k < kTraceUnits ? kTraceConsumer + 12 * static_cast<int>(k) + event : kTraceSlots;
}

}  // namespace hopper
}  // namespace conv_transpose3d_post_pool
}  // namespace fused
