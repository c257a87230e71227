// Device helpers shared by the fused convolution's forward and weight-gradient kernels: the decoding of a
// persistent block's tile index, and global loads kept in program order.
#pragma once

#include <cstdint>

namespace fused {

// The pooled tile a block computes: batch index and its first pooled (d, h, w).
struct alignas(16) TileOrigin {
  int n, qd0, qh0, qw0;
};

// Tile `tile` of a grid of tiles_d x tiles_h x tiles_w tiles per batch element (w fastest), tiles of
// ext_d x ext_h x ext_w pooled positions. 32-bit division where the tile count allows it (a 64-bit division is a
// long software routine, paid per tile).
__device__ __forceinline__ TileOrigin decode_tile(int64_t tile, int64_t n_tiles, int tiles_d, int tiles_h,
                                                  int tiles_w, int ext_d, int ext_h, int ext_w) {
  TileOrigin o;
  if (n_tiles <= INT32_MAX) {
    uint32_t rem = static_cast<uint32_t>(tile);
    const uint32_t tw = static_cast<uint32_t>(tiles_w), th = static_cast<uint32_t>(tiles_h);
    const uint32_t td = static_cast<uint32_t>(tiles_d);
    uint32_t q = rem / tw;
    o.qw0 = static_cast<int>(rem - q * tw) * ext_w;
    rem = q;
    q = rem / th;
    o.qh0 = static_cast<int>(rem - q * th) * ext_h;
    rem = q;
    q = rem / td;
    o.qd0 = static_cast<int>(rem - q * td) * ext_d;
    o.n = static_cast<int>(q);
  } else {
    int64_t rem = tile;
    o.qw0 = static_cast<int>(rem % tiles_w) * ext_w;
    rem /= tiles_w;
    o.qh0 = static_cast<int>(rem % tiles_h) * ext_h;
    rem /= tiles_h;
    o.qd0 = static_cast<int>(rem % tiles_d) * ext_d;
    o.n = static_cast<int>(rem / tiles_d);
  }
  return o;
}

// Loads whose issue order the compiler keeps (volatile asm is not moved across the mma asm, which is volatile
// too): a prefetch issued before a tile's or a phase's products stays there, its latency hidden behind them,
// instead of being hoisted or sunk to its use.
__device__ __forceinline__ float ld_pinned_f32(const void* ptr) {
  float v;
  asm volatile("ld.global.nc.f32 %0, [%1];" : "=f"(v) : "l"(ptr));
  return v;
}
__device__ __forceinline__ uint32_t ld_pinned_u32(const void* ptr) {
  uint32_t v;
  asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(ptr));
  return v;
}
__device__ __forceinline__ uint32_t ld_pinned_u16(const void* ptr) {
  uint16_t v;
  asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(v) : "l"(ptr));
  return v;
}
__device__ __forceinline__ uint32_t ld_pinned_u8(const void* ptr) {
  uint16_t v;
  asm volatile("ld.global.nc.u8 %0, [%1];" : "=h"(v) : "l"(ptr));
  return v;
}

}  // namespace fused
