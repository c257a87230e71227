// ptxas merging register-A wgmma (CUDA 13.0, sm_90a): eight entries, each three m64n32k8 TF32 wgmma with A from
// the same registers into one of two alternating 16-register parts, the first of each entry with scale-d 0 (its
// accumulator ignored), and every entry with its own B descriptor. The PTX holds all 24 wgmma; ptxas keeps 6 and puts
// a placeholder `HGMMA.64x8x16.F16 RZ, gdesc[URZ], RZ` in place of each dropped entry, then stores one entry's sums to
// four slots. Not seen with -Xptxas -O0, nor when each entry has its own part registers, nor when the part starts
// from zeroed registers with scale-d 1. tests/conv_transpose3d_post_pool/test_hopper_sass.py checks that the built
// kernels hold none of it. A strict float32 split without finiteness tests (tf32_split_finite) met it in the kernel.
// Self-contained on purpose (no project or torch headers, one nvcc line), so that it can go to a compiler bug report
// as it is: its wgmma wrapper repeats hopper/strict.cuh's wgmma_rs_n32.
//
//   nvcc -c ptxas_wgmma_merge.cu -o /tmp/m.o -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17
//   cuobjdump -sass /tmp/m.o | grep -c 'F32.TF32'     # 24 expected; 6 with CUDA 13.0's ptxas
//   cuobjdump -sass /tmp/m.o | grep -c 'gdesc\[URZ\]'  # 0 expected; 6 with CUDA 13.0's ptxas
#include <cstdint>
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void mma(float (&d)[16], const uint32_t (&a)[4], uint64_t desc, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d)
      : "memory");
}
// TF32 rounding of a finite float's bits (cuda/mma.cuh's tf32_round_finite).
__device__ __forceinline__ uint32_t rnd(uint32_t b) { return (b + 0x1000u) & 0xffffe000u; }
struct S { uint32_t hi[4], lo[4]; };
// Entry E: lo x B_hi (scale-d 0) + hi x B_lo + hi x B_hi into part[E % 2], each entry's B 32 columns further on;
// then the previous entry's part added to its slot.
template <int E>
__device__ __forceinline__ void step(float (&acc)[8][16], float (&part)[2][16], const S& a, uint32_t b16) {
  wg_fence();
  mma(part[E & 1], a.lo, (uint64_t)(b16 + E * 32 + (64u << 16)) | (8ull << 32), 0);
  mma(part[E & 1], a.hi, (uint64_t)(b16 + 4096 + E * 32 + (64u << 16)) | (8ull << 32), 1);
  mma(part[E & 1], a.hi, (uint64_t)(b16 + E * 32 + (64u << 16)) | (8ull << 32), 1);
  wg_commit();
  if constexpr (E > 0) {
    wg_wait<1>();
    for (int r = 0; r < 16; ++r) asm volatile("" : "+f"(part[(E - 1) & 1][r])::"memory");
    for (int r = 0; r < 16; ++r) acc[(E - 1)][r] += part[(E - 1) & 1][r];
  }
}
__global__ void __launch_bounds__(128, 1) k(float* out, const uint32_t* in) {
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t* w = reinterpret_cast<const uint32_t*>(smem);
  uint32_t b16 = static_cast<uint32_t>(__cvta_generic_to_shared(smem)) >> 4;
  asm volatile("" : "+r"(b16));
  S a;
  for (int i = 0; i < 4; ++i) {
    const uint32_t word = w[threadIdx.x * 4 + i];
    a.hi[i] = rnd(word);
    a.lo[i] = rnd(__float_as_uint(__uint_as_float(word) - __uint_as_float(a.hi[i])));
  }
  for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a.hi[i]), "+r"(a.lo[i])::"memory");
  float acc[8][16];
  for (int j = 0; j < 8; ++j) for (int r = 0; r < 16; ++r) acc[j][r] = 0.f;
  float part[2][16];
  step<0>(acc, part, a, b16); step<1>(acc, part, a, b16); step<2>(acc, part, a, b16); step<3>(acc, part, a, b16);
  step<4>(acc, part, a, b16); step<5>(acc, part, a, b16); step<6>(acc, part, a, b16); step<7>(acc, part, a, b16);
  wg_wait<0>();
  for (int r = 0; r < 16; ++r) acc[7][r] += part[1][r];
  for (int j = 0; j < 8; ++j) for (int r = 0; r < 16; ++r) out[(j * 16 + r) * 128 + threadIdx.x] = acc[j][r];
}
