// The launcher's kernel switch (contract.h), in every build so that the Python module can always set it.
#include "conv_transpose3d_post_pool/contract.h"

namespace fused {

ConvForwardKernel& conv_forward_kernel_choice() {
  static ConvForwardKernel choice = ConvForwardKernel::kAuto;
  return choice;
}

bool conv_wgmma_kernel_built() {
#if defined(WITH_CUDA) && defined(FUSED_SM90A)
  return true;
#else
  return false;
#endif
}

}  // namespace fused
