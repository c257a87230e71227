// Transparent huge pages for large CPU outputs, asked for before their first touch.
//
// A fresh multi-megabyte tensor from PyTorch's CPU allocator is a new mmap: every 4 KiB page faults and is zeroed
// by the kernel when the op first writes it. On the 2-core CI machine that first touch cost more than the
// backward kernel itself ([2, 32, 32, 64, 64] float32: 19.9 ms, 7.1 ms with PyTorch's global
// THP_MEM_ALLOC_ENABLE=1, against a 1.4 ms memory floor). Linux with transparent huge pages in
// "madvise" mode (the common default) backs a range with 2 MiB pages only when asked, so the op asks for its own
// large outputs, which it writes whole. Advice only: a refusal, or a system without THP, changes nothing.
//
// The trade-off is THP's usual one: where no free 2 MiB page is at hand, a system whose THP "defrag" setting
// includes madvise compacts memory inside the fault, a latency spike. The private op fused::_set_cpu_huge_pages
// turns the advice off (the package's settings module calls it from TORCH_FUSED_OPS_CPU_HUGE_PAGES).
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <cstdint>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace fused {

// On by default; one flag for the process (relaxed: it only gates advice).
inline std::atomic<bool> cpu_huge_pages_enabled{true};

inline void set_cpu_huge_pages(bool enabled) {
  cpu_huge_pages_enabled.store(enabled, std::memory_order_relaxed);
}

inline void advise_huge_pages(const at::Tensor& t) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr std::uintptr_t kHugePage = std::uintptr_t(2) << 20;
  if (!cpu_huge_pages_enabled.load(std::memory_order_relaxed) || !t.defined() || !t.device().is_cpu()) return;
  const std::uintptr_t bytes = t.storage().nbytes();
  if (bytes < 2 * kHugePage) return;  // below that, no aligned 2 MiB page is likely to fit inside
  const auto begin = reinterpret_cast<std::uintptr_t>(t.storage().data());
  const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  const std::uintptr_t lo = (begin + page - 1) / page * page, hi = (begin + bytes) / page * page;
  if (hi > lo) (void)madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);
#else
  (void)t;
#endif
}

}  // namespace fused
