// Development binding of the fused convolution's backward kernels alone
// (benchmarks/conv_transpose3d_post_pool/backward_kernels.py): allocates the outputs as the operators do (poisoned, so
// unwritten elements show) and calls the launchers.
#include "conv_transpose3d_post_pool/backward_contract.h"

#include <torch/extension.h>

#include <vector>

namespace {

std::vector<at::Tensor> grad_conv(const at::Tensor& go, const at::Tensor& sel, const at::Tensor& off,
                                  const at::Tensor& mult, double s1, double s2) {
  auto gc = at::full_like(sel, NAN);
  auto gb = at::full({sel.size(1)}, NAN, sel.options());
  auto gm = at::full(mult.sizes(), NAN, mult.options());
  fused::launch_conv_transpose3d_post_pool_grad_conv_cuda(go, sel, off, mult.reshape(-1), s1, s2, gc, gb, gm);
  return {gc, gb, gm};
}

at::Tensor grad_weight(const at::Tensor& gc, const at::Tensor& off, const at::Tensor& x, int64_t cout,
                       std::vector<int64_t> op, bool tf32) {
  auto gw = at::full({x.size(1), cout, 3, 3, 3}, NAN, x.options());
  fused::launch_conv_transpose3d_post_pool_grad_weight_cuda(gc, off, x, {op[0], op[1], op[2]}, tf32, gw);
  return gw;
}

void grad_weight_into(const at::Tensor& gc, const at::Tensor& off, const at::Tensor& x, std::vector<int64_t> op,
                      bool tf32, const at::Tensor& gw) {
  fused::launch_conv_transpose3d_post_pool_grad_weight_cuda(gc, off, x, {op[0], op[1], op[2]}, tf32, gw);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("grad_conv", &grad_conv);
  m.def("grad_weight", &grad_weight);
  m.def("grad_weight_into", &grad_weight_into);
}
