// fused::launch_conv_transpose3d_post_pool_grad_weight_cuda (contract in backward_contract.h): the kernel parameters,
// the grid, the partials' workspace and the fixed-order sum (kernels in grad_weight/kernel.cuh).
#include "conv_transpose3d_post_pool/backward_contract.h"

#include "conv_transpose3d_post_pool/cuda/grad_weight/kernel.cuh"
#include "common/cuda_device.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>

namespace fused {
namespace conv_transpose3d_post_pool {
namespace grad_weight {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <Mode M>
int blocks_per_sm() {
  static std::atomic<int> cache{0};
  int v = cache.load(std::memory_order_relaxed);
  if (v <= 0) {
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, grad_weight_kernel<M>, kThreads,
                                                                 Smem<M>::kBytes));
    v = v > 0 ? v : 1;
    cache.store(v, std::memory_order_relaxed);
  }
  return v;
}

template <Mode M>
void launch(WeightGradParams& p, int ci_tiles, int co_tiles, const at::Tensor& grad_weight, cudaStream_t stream) {
  using io_t = typename ModeTraits<M>::io_t;
  constexpr size_t smem = Smem<M>::kBytes;
  const int device = current_cuda_device();
  const int sms = multiprocessor_count(device);
  const size_t smem_optin = shared_memory_optin(device);
  TORCH_CHECK(smem_optin >= smem,
              "conv_transpose3d_post_pool backward: the fused weight-gradient kernel needs ", smem,
              " bytes of shared memory per block; this GPU allows ", smem_optin);
  static DynamicSmemLimit smem_limit;
  smem_limit.raise_to(reinterpret_cast<const void*>(grad_weight_kernel<M>), smem, device);
  const int64_t channel_tiles = static_cast<int64_t>(ci_tiles) * co_tiles;
  TORCH_CHECK(ci_tiles <= 65535 && co_tiles <= 65535,
              "conv_transpose3d_post_pool backward: too many channels for one launch");
  const int64_t resident = static_cast<int64_t>(blocks_per_sm<M>()) * sms;
  // At least kMinTilesPerBlock tiles per block: each block's partial is as large as 1.5 tiles of its inputs, so
  // small problems would otherwise spend more memory on partials than on the gradient itself.
  constexpr int64_t kMinTilesPerBlock = 2;
  int64_t bx = std::min<int64_t>(ceil_div(resident, channel_tiles), ceil_div(p.n_tiles, kMinTilesPerBlock));
  bx = std::max<int64_t>(bx, 1);
  const int64_t per_block = channel_tiles * 27 * kBM * kBN;
  at::Tensor ws = at::empty({bx * per_block}, grad_weight.options().dtype(at::kFloat));
  p.ws = ws.data_ptr<float>();
  grad_weight_kernel<M><<<dim3(static_cast<unsigned>(bx), static_cast<unsigned>(ci_tiles),
                               static_cast<unsigned>(co_tiles)),
                          kThreads, smem, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const int64_t blocks = ceil_div(per_block, 32);
  TORCH_CHECK(blocks < (int64_t(1) << 31), "conv_transpose3d_post_pool backward: weight too large");
  grad_weight_reduce_kernel<io_t><<<static_cast<unsigned>(blocks), dim3(32, kReduceGroups), 0, stream>>>(
      ws.data_ptr<float>(), bx, ci_tiles, co_tiles, p.Cin, p.Cout, static_cast<io_t*>(grad_weight.data_ptr()),
      grad_weight.stride(0), grad_weight.stride(1), grad_weight.stride(2), grad_weight.stride(3),
      grad_weight.stride(4));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace
}  // namespace grad_weight
}  // namespace conv_transpose3d_post_pool

bool conv_transpose3d_post_pool_grad_weight_cuda_fits(const at::Tensor& grad_conv) {
  using namespace conv_transpose3d_post_pool::grad_weight;
  // The float32 modes share one layout, as do the 16-bit ones.
  const size_t smem = grad_conv.scalar_type() == at::kFloat ? Smem<Mode::kTF32>::kBytes : Smem<Mode::kBF16>::kBytes;
  return shared_memory_optin(current_cuda_device()) >= smem;
}

void launch_conv_transpose3d_post_pool_grad_weight_cuda(const at::Tensor& grad_conv, const at::Tensor& offsets,
                                            const at::Tensor& input, std::array<int64_t, 3> output_padding,
                                            bool allow_tf32, const at::Tensor& grad_weight) {
  using namespace conv_transpose3d_post_pool::grad_weight;
  TORCH_INTERNAL_ASSERT(grad_conv.dim() == 5 && input.dim() == 5 && grad_weight.dim() == 5);
  TORCH_INTERNAL_ASSERT(grad_conv.is_cuda() && input.device() == grad_conv.device() &&
                        grad_weight.device() == grad_conv.device());
  const auto dtype = input.scalar_type();
  TORCH_INTERNAL_ASSERT(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf);
  TORCH_INTERNAL_ASSERT(grad_conv.scalar_type() == dtype && grad_weight.scalar_type() == dtype &&
                        offsets.scalar_type() == at::kByte);
  TORCH_INTERNAL_ASSERT(offsets.sizes() == grad_conv.sizes() && offsets.strides() == grad_conv.strides());
  const int64_t N = input.size(0), Cin = input.size(1), D = input.size(2), H = input.size(3), W = input.size(4);
  const int64_t Cout = grad_conv.size(1);
  for (int i = 0; i < 3; ++i) TORCH_INTERNAL_ASSERT(output_padding[i] == 0 || output_padding[i] == 1);
  const int64_t PD = D - 1 + output_padding[0], PH = H - 1 + output_padding[1], PW = W - 1 + output_padding[2];
  TORCH_INTERNAL_ASSERT(grad_conv.size(0) == N && grad_conv.size(2) == PD && grad_conv.size(3) == PH &&
                        grad_conv.size(4) == PW);
  TORCH_INTERNAL_ASSERT(grad_weight.size(0) == Cin && grad_weight.size(1) == Cout && grad_weight.size(2) == 3 &&
                        grad_weight.size(3) == 3 && grad_weight.size(4) == 3);
  if (grad_weight.numel() == 0) return;
  if (grad_conv.numel() == 0) {
    grad_weight.zero_();
    return;
  }
  TORCH_INTERNAL_ASSERT(std::max({D, H, W, Cin, Cout}) < (int64_t(1) << 30));

  // The kernel stages from contiguous tensors (its address arithmetic is per-thread bases plus fixed steps);
  // other layouts are copied first.
  const at::Tensor gc = grad_conv.contiguous(), off = offsets.contiguous(), x = input.contiguous();
  WeightGradParams p{};
  p.gc = gc.data_ptr();
  p.off = static_cast<const uint8_t*>(off.data_ptr());
  p.x = x.data_ptr();
  p.N = static_cast<int>(N);
  p.Cin = static_cast<int>(Cin);
  p.Cout = static_cast<int>(Cout);
  p.D = static_cast<int>(D);
  p.H = static_cast<int>(H);
  p.W = static_cast<int>(W);
  p.PD = static_cast<int>(PD);
  p.PH = static_cast<int>(PH);
  p.PW = static_cast<int>(PW);
  p.tiles_d = static_cast<int>(ceil_div(PD, kTD));
  p.tiles_h = static_cast<int>(ceil_div(PH, kTH));
  p.tiles_w = static_cast<int>(ceil_div(PW, kTW));
  p.n_tiles = N * p.tiles_d * p.tiles_h * p.tiles_w;
  const int ci_tiles = static_cast<int>(ceil_div(Cin, kBM)), co_tiles = static_cast<int>(ceil_div(Cout, kBN));

  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(input.get_device()).stream();
  if (dtype == at::kFloat) {
    if (allow_tf32) {
      launch<Mode::kTF32>(p, ci_tiles, co_tiles, grad_weight, stream);
    } else {
      launch<Mode::kStrict>(p, ci_tiles, co_tiles, grad_weight, stream);
    }
  } else if (dtype == at::kBFloat16) {
    launch<Mode::kBF16>(p, ci_tiles, co_tiles, grad_weight, stream);
  } else {
    launch<Mode::kFP16>(p, ci_tiles, co_tiles, grad_weight, stream);
  }
}

}  // namespace fused
