// Parts of the sm_90a forward kernel (hopper/kernel.cuh) to leave out, for measuring where its time goes
// (benchmarks/conv_transpose3d_post_pool/hopper_forward.py --ablate, through torch_fused_ops._C._conv_hopper_ablation).
// The kernel's outputs are then wrong: never set by the operators, whose value is 0. Only a measurement build
// (TORCH_FUSED_OPS_HOPPER_ABLATION=1, defining FUSED_HOPPER_ABLATION) compiles the kernel's branches: they cost it
// registers.
#pragma once

#include <cstdint>

namespace fused {

enum ConvHopperAblation : uint32_t {
  kAblateEpilogue = 1,  // consumers skip the epilogue and its stores
  kAblateMma = 2,       // consumers skip the wgmma (the epilogue reads stale accumulators)
  kAblateStaging = 4,   // the producer skips the input's loads and stores (the stages keep stale data)
};

// The bits the launcher copies into each launch's Params (kernel_choice.cpp).
uint32_t& conv_hopper_ablation();

// A measurement build's event trace (hopper/trace.cuh): the device address of a buffer of int64 the kernel writes
// its clock at named points into (kTraceSlots per block of the first channel block), 0 for none. The launcher copies
// it into each launch's Params.
uint64_t& conv_hopper_trace();

// Whether this build's kernel reads them.
constexpr bool kHopperAblationBuilt =
#if defined(FUSED_HOPPER_ABLATION)
    true;
#else
    false;
#endif

}  // namespace fused
