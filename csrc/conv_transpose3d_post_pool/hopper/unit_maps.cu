// Host side of unit_maps.h: cuTensorMapEncodeTiled, reached through the runtime's driver entry point (no link
// against the driver library).
#include "conv_transpose3d_post_pool/hopper/unit_maps.h"

#include "conv_transpose3d_post_pool/hopper/geometry.cuh"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

namespace fused {
namespace conv_transpose3d_post_pool {
namespace hopper {
namespace {

static_assert(sizeof(TensorMapBytes) == sizeof(CUtensorMap) && alignof(TensorMapBytes) >= 64,
              "TensorMapBytes holds a CUtensorMap");

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found) ==
            cudaSuccess &&
        found == cudaDriverEntryPointSuccess) {
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
    } else {
      (void)cudaGetLastError();  // leaves no error behind for the next launch's check
    }
  });
  return fn;
}

// One tensor's map: elements of `bytes` at `base`, dims (w, c, h, d, n), the box one unit's.
bool encode(TensorMapBytes& out, const void* base, int bytes, const Params& p, CUtensorMapSwizzle swizzle) {
  const cuuint64_t dims[5] = {static_cast<cuuint64_t>(p.PW), static_cast<cuuint64_t>(p.Cout),
                              static_cast<cuuint64_t>(p.PH), static_cast<cuuint64_t>(p.PD), static_cast<cuuint64_t>(p.N)};
  // Strides of dims 1..4 in bytes (dim 0, w, is contiguous).
  const int64_t strides[4] = {p.so[1] * bytes, p.so[3] * bytes, p.so[2] * bytes, p.so[0] * bytes};
  cuuint64_t strides_u[4];
  for (int i = 0; i < 4; ++i) {
    if (strides[i] <= 0 || strides[i] % 16 != 0 || strides[i] >= (int64_t{1} << 40)) return false;
    strides_u[i] = static_cast<cuuint64_t>(strides[i]);
  }
  for (cuuint64_t d : dims) {
    if (d == 0 || d > (cuuint64_t{1} << 32)) return false;
  }
  const cuuint32_t box[5] = {kTW, kCoBlock, kTH, 1, 1};
  const cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
  const CUtensorMapDataType type = bytes == 2 ? CU_TENSOR_MAP_DATA_TYPE_UINT16 : CU_TENSOR_MAP_DATA_TYPE_UINT8;
  const CUresult r = encoder()(reinterpret_cast<CUtensorMap*>(&out), type, 5, const_cast<void*>(base), dims,
                               strides_u, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                               CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

bool encode_unit_maps(Params& p) {
  if (p.out == nullptr || p.sel == nullptr || p.off == nullptr || encoder() == nullptr) return false;
  if (p.so[4] != 1 || p.so[3] != kTW || !aligned16(p.out) || !aligned16(p.sel) || !aligned16(p.off)) return false;
  return encode(p.unit_maps[0], p.out, 2, p, CU_TENSOR_MAP_SWIZZLE_64B) &&
         encode(p.unit_maps[1], p.sel, 2, p, CU_TENSOR_MAP_SWIZZLE_64B) &&
         encode(p.unit_maps[2], p.off, 1, p, CU_TENSOR_MAP_SWIZZLE_32B);
}

}  // namespace hopper
}  // namespace conv_transpose3d_post_pool
}  // namespace fused
