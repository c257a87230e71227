// What the CUDA launchers ask of the device on every call, answered without a runtime call after the first: the
// current device, its multiprocessor count, shared-memory opt-in and compute capability, and each kernel's dynamic
// shared-memory limit, raised once per device rather than before every launch.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <mutex>

namespace fused {

constexpr int kMaxCachedDevices = 64;

inline int current_cuda_device() { return static_cast<int>(c10::cuda::current_device()); }

// The device attributes the launchers size their grids and check shared memory by. (ATen's cached device properties
// would do, but its header needs cuSPARSE's, which a build machine with only nvcc lacks.)
struct DeviceFacts {
  int multiprocessors = 0;
  size_t shared_memory_optin = 0;
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
};

inline DeviceFacts query_device_facts(int device) {
  int sms = 0, optin = 0, major = 0, minor = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return DeviceFacts{sms, static_cast<size_t>(optin), major, minor};
}

// Asked of the runtime once per device ordinal (devices past kMaxCachedDevices are asked every time).
inline DeviceFacts device_facts(int device) {
  static DeviceFacts facts[kMaxCachedDevices];
  static std::once_flag asked[kMaxCachedDevices];
  if (device < 0 || device >= kMaxCachedDevices) return query_device_facts(device);
  std::call_once(asked[device], [device] { facts[device] = query_device_facts(device); });
  return facts[device];
}

inline int multiprocessor_count(int device) { return device_facts(device).multiprocessors; }

inline size_t shared_memory_optin(int device) { return device_facts(device).shared_memory_optin; }

inline int compute_capability_major(int device) { return device_facts(device).compute_capability_major; }

inline int compute_capability_minor(int device) { return device_facts(device).compute_capability_minor; }

// One per kernel instantiation (a function-local static beside its launch): the dynamic shared memory each device
// has been told the kernel may use. cudaFuncSetAttribute applies to the function on the current device and does not
// synchronise, but costs a runtime call; after the first launch on a device this is an atomic load.
class DynamicSmemLimit {
 public:
  void raise_to(const void* kernel, size_t smem, int device) {
    const int bytes = static_cast<int>(smem);
    const bool cached = device >= 0 && device < kMaxCachedDevices;
    if (cached && granted_[device].load(std::memory_order_acquire) >= bytes) return;
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    if (!cached) return;
    int prev = granted_[device].load(std::memory_order_relaxed);
    while (prev < bytes && !granted_[device].compare_exchange_weak(prev, bytes, std::memory_order_release)) {
    }
  }

 private:
  std::atomic<int> granted_[kMaxCachedDevices]{};
};

}  // namespace fused
