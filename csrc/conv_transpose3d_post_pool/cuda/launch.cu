// fused::launch_conv_transpose3d_post_pool_cuda (contract in contract.h): the kernel parameters, the tile
// and chunk choice, and the dispatch to the per-precision kernel files.
#include "conv_transpose3d_post_pool/contract.h"

#include "conv_transpose3d_post_pool/cuda/params.cuh"
#include "conv_transpose3d_post_pool/hopper/geometry.cuh"
#include "common/cuda_device.h"

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <cuda_runtime.h>

#include <algorithm>

namespace fused {
namespace conv_transpose3d_post_pool {

int& mt_override() {
  static int value = 0;
  return value;
}

namespace {

void copy_strides(const at::Tensor& t, int64_t (&s)[5]) {
  for (int i = 0; i < 5; ++i) s[i] = t.stride(i);
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Shared memory per block of the instantiation (mode M, mt row tiles, chunk_words k-words) that launch_form runs.
template <Mode M, int MT>
size_t kernel_smem(int chunk_words) {
  switch (chunk_words) {
    case 8:
      return kKernelSmem<M, MT, 1>;
    case 16:
      return kKernelSmem<M, MT, 2>;
    default:
      return kKernelSmem<M, MT, kMaxChunkWords / 8>;
  }
}
template <Mode M>
size_t kernel_smem(int mt, int chunk_words) {
  return mt == 2 ? kernel_smem<M, 2>(chunk_words) : kernel_smem<M, 1>(chunk_words);
}

size_t kernel_smem(Mode mode, int mt, int chunk_words) {
  switch (mode) {
    case Mode::kTF32:
      return kernel_smem<Mode::kTF32>(mt, chunk_words);
    case Mode::kStrict:
      return kernel_smem<Mode::kStrict>(mt, chunk_words);
    case Mode::kBF16:
      return kernel_smem<Mode::kBF16>(mt, chunk_words);
    default:
      return kernel_smem<Mode::kFP16>(mt, chunk_words);
  }
}

// k-words per staged chunk: one float32 channel or a pair of 16-bit channels per k-word, at least one (zero)
// k-step when Cin is 0, in chunks of 8, 16 or kMaxChunkWords k-words (the kernels' compile-time k-steps).
int chunk_words_for(at::ScalarType dtype, int64_t Cin, int64_t* padded_words = nullptr) {
  const int64_t words = std::max<int64_t>(dtype == at::kFloat ? Cin : ceil_div(Cin, 2), 1);
  const int64_t padded = ceil_div(words, 8) * 8;
  if (padded_words != nullptr) *padded_words = padded;
  return padded <= 16 ? static_cast<int>(padded) : kMaxChunkWords;
}

int smem_optin_of(int device) { return static_cast<int>(shared_memory_optin(device)); }

// Whether the sm_90a kernel runs: built for sm_90a (setup.py defines FUSED_SM90A then), a compute capability 9.0
// GPU (sm_90a machine code runs on no other), at most 16 input channels (its resident weights), not strict float32's
// training form (the sm_90a kernel has its inference form only: hopper/strict.cuh), and not switched off. Left to itself
// (kAuto) it runs wherever it can: on an H200 it measured faster than the mma.sync kernel in every form at batch 16
// (7.75 units per multiprocessor; a unit is one pooled plane of 8 x 32 positions) and at batch 1 (0.5 units per
// multiprocessor, the kernel then handing out half units): docs/performance.md,
// benchmarks/conv_transpose3d_post_pool/hopper_forward.py.
bool hopper_applies(Mode mode, bool train, int64_t Cin, int device) {
#if defined(FUSED_SM90A)
  const ConvForwardKernel choice = conv_forward_kernel_choice();
  return choice != ConvForwardKernel::kMmaSync && !(mode == Mode::kStrict && train) && Cin <= 16 && Cin >= 1 &&
         compute_capability_major(device) == 9 && compute_capability_minor(device) == 0;
#else
  (void)mode;
  (void)train;
  (void)Cin;
  (void)device;
  return false;
#endif
}

Mode mode_of(at::ScalarType dtype, bool allow_tf32) {
  return dtype == at::kFloat ? (allow_tf32 ? Mode::kTF32 : Mode::kStrict)
         : dtype == at::kBFloat16 ? Mode::kBF16
                                  : Mode::kFP16;
}

}  // namespace
}  // namespace conv_transpose3d_post_pool

bool conv_transpose3d_post_pool_cuda_rounds_operands(at::ScalarType dtype, const at::Tensor& input) {
  using namespace conv_transpose3d_post_pool;
  if (dtype != at::kBFloat16 && dtype != at::kHalf) return false;
  return hopper_applies(mode_of(dtype, true), false, input.size(1), input.get_device());
}

bool conv_transpose3d_post_pool_cuda_fits(at::ScalarType dtype, int64_t Cin, int device) {
  using namespace conv_transpose3d_post_pool;
  const int cw = chunk_words_for(dtype, Cin);
  // One row tile per warp, the smallest instantiation. float32 asks for both of its modes, so the answer does
  // not depend on the TF32 switch (the training forward's backward is chosen on the same answer).
  const size_t need = dtype == at::kFloat ? std::max(kernel_smem(Mode::kTF32, 1, cw), kernel_smem(Mode::kStrict, 1, cw))
                      : dtype == at::kBFloat16 ? kernel_smem(Mode::kBF16, 1, cw)
                                               : kernel_smem(Mode::kFP16, 1, cw);
  return need <= static_cast<size_t>(smem_optin_of(device));
}

void launch_conv_transpose3d_post_pool_cuda(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                                            const at::Tensor& multiplier, double negative_slope,
                                            double negative_slope2, std::array<int64_t, 3> output_padding,
                                            bool allow_tf32, const at::Tensor& out, const at::Tensor& selected,
                                            const at::Tensor& offsets, std::optional<at::ScalarType> round_to) {
  using namespace conv_transpose3d_post_pool;
  TORCH_INTERNAL_ASSERT(input.dim() == 5 && weight.dim() == 5 && out.dim() == 5);
  TORCH_INTERNAL_ASSERT(input.is_cuda() && weight.device() == input.device() && out.device() == input.device());
  const auto stored = input.scalar_type();
  // The convolution's dtype; `cast`: float32 operands that the kernel rounds to it (source.cuh).
  const auto dtype = round_to.value_or(stored);
  const bool cast = dtype != stored;
  TORCH_INTERNAL_ASSERT(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf);
  TORCH_INTERNAL_ASSERT(!cast || (stored == at::kFloat && dtype != at::kFloat));
  // The mixed form: a float32 multiplier and output for a float16/bfloat16 convolution (output.cuh).
  const bool mixed = dtype != at::kFloat && multiplier.scalar_type() == at::kFloat;
  const auto out_dtype = mixed ? at::kFloat : dtype;
  TORCH_INTERNAL_ASSERT(weight.scalar_type() == stored && out.scalar_type() == out_dtype &&
                        multiplier.scalar_type() == out_dtype);
  const int64_t N = input.size(0), Cin = input.size(1), D = input.size(2), H = input.size(3), W = input.size(4);
  const int64_t Cout = weight.size(1);
  TORCH_INTERNAL_ASSERT(weight.size(0) == Cin && weight.size(2) == 3 && weight.size(3) == 3 && weight.size(4) == 3);
  for (int i = 0; i < 3; ++i) TORCH_INTERNAL_ASSERT(output_padding[i] == 0 || output_padding[i] == 1);
  const int64_t PD = D - 1 + output_padding[0], PH = H - 1 + output_padding[1], PW = W - 1 + output_padding[2];
  TORCH_INTERNAL_ASSERT(out.size(0) == N && out.size(1) == Cout && out.size(2) == PD && out.size(3) == PH &&
                        out.size(4) == PW);
  TORCH_INTERNAL_ASSERT(multiplier.is_contiguous() && (multiplier.numel() == 1 || multiplier.numel() == Cout));
  TORCH_INTERNAL_ASSERT(!bias.defined() || (bias.scalar_type() == stored && bias.is_contiguous() &&
                                            bias.numel() == Cout));
  const bool train = selected.defined();
  TORCH_INTERNAL_ASSERT(train == offsets.defined());
  if (train) {
    TORCH_INTERNAL_ASSERT(selected.scalar_type() == dtype && offsets.scalar_type() == at::kByte);
    TORCH_INTERNAL_ASSERT(selected.strides() == out.strides() && offsets.strides() == out.strides() &&
                          selected.sizes() == out.sizes() && offsets.sizes() == out.sizes());
  }
  if (out.numel() == 0) return;  // N, Cout or a pooled extent is 0
  TORCH_INTERNAL_ASSERT(std::max({D, H, W, Cin, Cout}) < (int64_t(1) << 30));
  TORCH_INTERNAL_ASSERT(weight.numel() < (int64_t(1) << 31) && weight.is_non_overlapping_and_dense());

  Params p{};
  p.x = input.data_ptr();
  p.w = weight.data_ptr();
  p.bias = bias.defined() ? bias.data_ptr() : nullptr;
  p.mult = multiplier.data_ptr();
  p.out = out.data_ptr();
  p.sel = train ? selected.data_ptr() : nullptr;
  p.off = train ? static_cast<uint8_t*>(offsets.data_ptr()) : nullptr;
  copy_strides(input, p.sx);
  copy_strides(weight, p.sw);
  copy_strides(out, p.so);
  p.m_stride = multiplier.numel() == 1 ? 0 : 1;
  p.N = static_cast<int>(N);
  p.Cin = static_cast<int>(Cin);
  p.Cout = static_cast<int>(Cout);
  p.D = static_cast<int>(D);
  p.H = static_cast<int>(H);
  p.W = static_cast<int>(W);
  p.PD = static_cast<int>(PD);
  p.PH = static_cast<int>(PH);
  p.PW = static_cast<int>(PW);
  // The slopes in float32, eager's opmath type; the kernel decides monotonicity on these values.
  p.s1 = static_cast<float>(negative_slope);
  p.s2 = static_cast<float>(negative_slope2);
  p.unit_slopes = p.s1 > 0.f && p.s1 <= 1.f && p.s2 > 0.f && p.s2 <= 1.f;
  p.ablate = conv_hopper_ablation();
  p.trace = reinterpret_cast<long long*>(conv_hopper_trace());
  p.x_channels_last = Cin > 1 && input.stride(1) == 1;

  const Mode mode = mode_of(dtype, allow_tf32);
  int64_t padded = 0;
  p.chunk_words = chunk_words_for(dtype, Cin, &padded);
  p.nchunks = static_cast<int>(ceil_div(padded, p.chunk_words));

  // Two row tiles per warp (256 positions a block) when that still gives every multiprocessor two tiles (faster for
  // every precision at the KernelBench size: benchmarks/conv_transpose3d_post_pool/forward_kernel.py --mts 1,2);
  // small problems take 128-position blocks to spread over more multiprocessors.
  const int device = current_cuda_device();
  const int sms = multiprocessor_count(device);
  const int64_t positions = N * PD * PH * PW;
  int mt = positions >= int64_t(2) * TileShape<2>::kPositions * sms ? 2 : 1;
  if (mt_override() == 1 || mt_override() == 2) mt = mt_override();
  if (train) mt = 1;  // the training kernels hold one row tile per warp (kernel.cuh)
  // GPUs with less shared memory per block than Hopper's and A100's 227 / 163 KB (compute capability 8.6 and 8.9
  // allow 99 KB) take one row tile where two do not fit; the host op sends what fits neither way to the composite
  // (conv_transpose3d_post_pool_cuda_fits), so the check below only guards the contract.
  const int smem_optin = smem_optin_of(device);
  if (mt == 2 && kernel_smem(mode, 2, p.chunk_words) > static_cast<size_t>(smem_optin)) mt = 1;
  TORCH_CHECK(kernel_smem(mode, mt, p.chunk_words) <= static_cast<size_t>(smem_optin),
              "conv_transpose3d_post_pool: the fused CUDA kernel needs ", kernel_smem(mode, mt, p.chunk_words),
              " bytes of shared memory per block for ", Cin, " input channels; this GPU allows ", smem_optin);
  const int tile_d = mt == 2 ? TileShape<2>::kTD : TileShape<1>::kTD;
  p.tiles_d = static_cast<int>(ceil_div(PD, tile_d));
  p.tiles_h = static_cast<int>(ceil_div(PH, kTileH));
  p.tiles_w = static_cast<int>(ceil_div(PW, kTileW));
  p.n_tiles = N * p.tiles_d * p.tiles_h * p.tiles_w;

  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(input.get_device()).stream();
  const bool hopper = hopper_applies(mode, train, Cin, device);
  if (cast) {
    // Only where conv_transpose3d_post_pool_cuda_rounds_operands said so.
    TORCH_INTERNAL_ASSERT(hopper && mixed && !train);
    return mode == Mode::kBF16 ? hopper::launch_hopper_form<Mode::kBF16, true, true>(p, train, stream)
                               : hopper::launch_hopper_form<Mode::kFP16, true, true>(p, train, stream);
  }
  if (hopper) {
    switch (mode) {
      case Mode::kTF32:
        return hopper::launch_hopper_form<Mode::kTF32, false>(p, train, stream);
      case Mode::kStrict:
        return hopper::launch_hopper_form<Mode::kStrict, false>(p, train, stream);
      case Mode::kBF16:
        return mixed ? hopper::launch_hopper_form<Mode::kBF16, true>(p, train, stream)
                     : hopper::launch_hopper_form<Mode::kBF16, false>(p, train, stream);
      case Mode::kFP16:
        return mixed ? hopper::launch_hopper_form<Mode::kFP16, true>(p, train, stream)
                     : hopper::launch_hopper_form<Mode::kFP16, false>(p, train, stream);
      default:
        break;
    }
  }
  switch (mode) {
    case Mode::kTF32:
      launch_form<Mode::kTF32, false>(p, mt, train, stream);
      break;
    case Mode::kStrict:
      launch_form<Mode::kStrict, false>(p, mt, train, stream);
      break;
    case Mode::kBF16:
      if (mixed) {
        launch_form<Mode::kBF16, true>(p, mt, train, stream);
      } else {
        launch_form<Mode::kBF16, false>(p, mt, train, stream);
      }
      break;
    case Mode::kFP16:
      if (mixed) {
        launch_form<Mode::kFP16, true>(p, mt, train, stream);
      } else {
        launch_form<Mode::kFP16, false>(p, mt, train, stream);
      }
      break;
  }
}

}  // namespace fused
