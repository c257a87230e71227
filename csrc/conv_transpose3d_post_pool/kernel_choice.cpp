// The launcher's kernel switch (contract.h), in every build so that the Python module can always set it.
#include "conv_transpose3d_post_pool/contract.h"

namespace fused {

ConvForwardKernel& conv_forward_kernel_choice() {
  static ConvForwardKernel choice = ConvForwardKernel::kAuto;
  return choice;
}

ConvHopperSplit& conv_hopper_split_choice() {
  static ConvHopperSplit choice = ConvHopperSplit::kAuto;
  return choice;
}

uint32_t& conv_hopper_ablation() {
  static uint32_t bits = 0;
  return bits;
}

uint64_t& conv_hopper_trace() {
  static uint64_t address = 0;
  return address;
}

bool conv_wgmma_kernel_built() {
#if defined(WITH_CUDA) && defined(FUSED_SM90A)
  return true;
#else
  return false;
#endif
}

}  // namespace fused
