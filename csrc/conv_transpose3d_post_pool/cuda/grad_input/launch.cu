// fused::launch_conv_transpose3d_post_pool_grad_input_cuda (contract in backward_contract.h): the kernel parameters,
// the chunk choice and the dispatch to the per-precision kernels (grad_input/instantiations/; TF32 has its own
// double-buffered kernel there, the others share grad_input/kernel.cuh's).
#include "conv_transpose3d_post_pool/backward_contract.h"

#include "conv_transpose3d_post_pool/cuda/grad_input/kernel.cuh"

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <cuda_runtime.h>

#include <algorithm>

namespace fused {
namespace conv_transpose3d_post_pool {
namespace grad_input {
namespace {

void copy_strides(const at::Tensor& t, int64_t (&s)[5]) {
  for (int i = 0; i < 5; ++i) s[i] = t.stride(i);
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// k-words per staged chunk: one float32 channel or a pair of 16-bit channels per k-word, at least one (zero) k-step
// when Cout is 0, in chunks of 8 or 16 (two blocks per multiprocessor, TF32's double buffers included).
int chunk_words_for(at::ScalarType dtype, int64_t Cout, int64_t* padded_words = nullptr) {
  const int64_t words = std::max<int64_t>(dtype == at::kFloat ? Cout : ceil_div(Cout, 2), 1);
  const int64_t padded = ceil_div(words, 8) * 8;
  if (padded_words != nullptr) *padded_words = padded;
  return padded <= 8 ? 8 : 16;
}

}  // namespace

// Instantiated in the per-precision files.
extern template void launch_mode<Mode::kStrict>(const Params&, int, cudaStream_t);
extern template void launch_mode<Mode::kBF16>(const Params&, int, cudaStream_t);
extern template void launch_mode<Mode::kFP16>(const Params&, int, cudaStream_t);

}  // namespace grad_input
}  // namespace conv_transpose3d_post_pool

bool conv_transpose3d_post_pool_grad_input_cuda_fits(at::ScalarType dtype, int64_t Cout, int device) {
  using namespace conv_transpose3d_post_pool;
  using namespace conv_transpose3d_post_pool::grad_input;
  const int cw = chunk_words_for(dtype, Cout);
  const size_t strict = smem_words<Mode::kStrict>(cw) * sizeof(uint32_t);
  // float32 asks for both of its kernels, so the answer does not depend on the TF32 switch.
  const size_t need = dtype == at::kFloat     ? std::max(tf32_smem_bytes(cw), strict)
                      : dtype == at::kBFloat16 ? smem_words<Mode::kBF16>(cw) * sizeof(uint32_t)
                                               : smem_words<Mode::kFP16>(cw) * sizeof(uint32_t);
  return need <= shared_memory_optin(device);
}

void launch_conv_transpose3d_post_pool_grad_input_cuda(const at::Tensor& grad_conv, const at::Tensor& offsets,
                                           const at::Tensor& weight, std::array<int64_t, 3> output_padding,
                                           bool allow_tf32, const at::Tensor& grad_input) {
  using namespace conv_transpose3d_post_pool;
  using namespace conv_transpose3d_post_pool::grad_input;
  TORCH_INTERNAL_ASSERT(grad_conv.dim() == 5 && offsets.dim() == 5 && weight.dim() == 5 && grad_input.dim() == 5);
  TORCH_INTERNAL_ASSERT(grad_conv.is_cuda() && offsets.device() == grad_conv.device() &&
                        weight.device() == grad_conv.device() && grad_input.device() == grad_conv.device());
  const auto dtype = grad_conv.scalar_type();
  TORCH_INTERNAL_ASSERT(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf);
  TORCH_INTERNAL_ASSERT(weight.scalar_type() == dtype && grad_input.scalar_type() == dtype &&
                        offsets.scalar_type() == at::kByte);
  const int64_t N = grad_input.size(0), Cin = grad_input.size(1), D = grad_input.size(2), H = grad_input.size(3),
                W = grad_input.size(4);
  const int64_t Cout = weight.size(1);
  TORCH_INTERNAL_ASSERT(weight.size(0) == Cin && weight.size(2) == 3 && weight.size(3) == 3 && weight.size(4) == 3);
  for (int i = 0; i < 3; ++i) TORCH_INTERNAL_ASSERT(output_padding[i] == 0 || output_padding[i] == 1);
  const int64_t PD = D - 1 + output_padding[0], PH = H - 1 + output_padding[1], PW = W - 1 + output_padding[2];
  TORCH_INTERNAL_ASSERT(grad_conv.size(0) == N && grad_conv.size(1) == Cout && grad_conv.size(2) == PD &&
                        grad_conv.size(3) == PH && grad_conv.size(4) == PW);
  TORCH_INTERNAL_ASSERT(offsets.sizes() == grad_conv.sizes() && offsets.strides() == grad_conv.strides());
  if (grad_input.numel() == 0) return;
  // Cout 0 or an empty pooled extent: the staged gradient is all zeros and the kernel writes what the
  // convolution of a zero gradient gives (zeros, NaN beside a non-finite weight).
  TORCH_INTERNAL_ASSERT(std::max({D, H, W, Cin, Cout}) < (int64_t(1) << 30));
  TORCH_INTERNAL_ASSERT(weight.numel() < (int64_t(1) << 31) && weight.is_non_overlapping_and_dense());

  Params p{};
  p.g = grad_conv.data_ptr();
  p.off = static_cast<const uint8_t*>(offsets.data_ptr());
  p.w = weight.data_ptr();
  p.gi = grad_input.data_ptr();
  copy_strides(grad_conv, p.sg);
  copy_strides(weight, p.sw);
  copy_strides(grad_input, p.si);
  p.N = static_cast<int>(N);
  p.Cin = static_cast<int>(Cin);
  p.Cout = static_cast<int>(Cout);
  p.D = static_cast<int>(D);
  p.H = static_cast<int>(H);
  p.W = static_cast<int>(W);
  p.PD = static_cast<int>(PD);
  p.PH = static_cast<int>(PH);
  p.PW = static_cast<int>(PW);
  p.g_channels_last = Cout > 1 && grad_conv.stride(1) == 1;
  p.tiles_d = static_cast<int>(ceil_div(D, kTD));
  p.tiles_h = static_cast<int>(ceil_div(H, kTH));
  p.tiles_w = static_cast<int>(ceil_div(W, kTW));
  p.n_tiles = N * p.tiles_d * p.tiles_h * p.tiles_w;

  const Mode mode = dtype == at::kFloat ? (allow_tf32 ? Mode::kTF32 : Mode::kStrict)
                    : dtype == at::kBFloat16 ? Mode::kBF16
                                             : Mode::kFP16;
  int64_t padded = 0;
  const int chunk_words = chunk_words_for(dtype, Cout, &padded);
  p.nchunks = static_cast<int>(ceil_div(padded, chunk_words));

  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(grad_conv.get_device()).stream();
  switch (mode) {
    case Mode::kTF32:
      launch_tf32(p, chunk_words, stream);
      break;
    case Mode::kStrict:
      launch_mode<Mode::kStrict>(p, chunk_words, stream);
      break;
    case Mode::kBF16:
      launch_mode<Mode::kBF16>(p, chunk_words, stream);
      break;
    case Mode::kFP16:
      launch_mode<Mode::kFP16>(p, chunk_words, stream);
      break;
  }
}

}  // namespace fused
