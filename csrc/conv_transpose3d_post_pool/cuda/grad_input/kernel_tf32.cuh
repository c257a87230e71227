// The input-gradient kernel of the fused convolution for TF32 tensor cores (float32 operands rounded to nearest),
// double buffered; one file per precision so that the instantiations compile in parallel. Its tiling, shifts, taps
// and masks are those of grad_input/kernel.cuh (the single-buffered kernel of the other precisions); here:
//
// - TF32 keeps the phase as a one-hot bit (bits 0..7) in each staged word: TF32 rounding clears the low 13 bits
//   and the tensor cores ignore them, so the word goes to the mma as it is, and a tap's mask is one LOP3 that sets
//   a predicate and one select per word.
// - The work of a block is a sequence of units (tile, chunk of 16 output channels; 8 when Cout needs no more). The
//   staged gradient is double buffered: while a unit's mma run from one buffer, the same threads load the next
//   unit's gradient from global memory in eight pieces, one per shift, each stored to the other buffer two shifts
//   after its loads were issued, so the loads' latency hides behind the mma. One barrier per unit then publishes
//   the next buffer. The weight of up to two chunks stays resident; past that, each unit's chunk is staged into
//   buffer (unit & 1) at the start of the previous unit.
// The 16-bit modes and strict float32 measured slower in this form (benchmarks/conv_transpose3d_post_pool/
// grad_input_kernel.py), so they keep the single-buffered kernel.
#pragma once

#include "conv_transpose3d_post_pool/cuda/grad_input/kernel.cuh"

namespace fused {
namespace conv_transpose3d_post_pool {
namespace grad_input {
namespace double_buffered {

// Halo positions a thread stages: tid + j * kThreads (an immediate offset from the first in every address).
constexpr int kPosPerThread = (kHalo + kThreads - 1) / kThreads;
__device__ __forceinline__ int halo_position(int j) { return static_cast<int>(threadIdx.x) + j * kThreads; }
static_assert(kPosPerThread == 2, "the staging loops assume two halo positions per thread");

// Words of one weight buffer (27 taps x KS k-steps x 32 lanes x 4) and of one gradient buffer.
template <int KS>
constexpr int kWeightWords = 27 * KS * 128;
template <int KS>
constexpr int kGradWords = kPitch * 8 * KS;

// Two weight buffers, then two gradient buffers.
template <int KS>
constexpr size_t smem_bytes() {
  return static_cast<size_t>(2 * kWeightWords<KS> + 2 * kGradWords<KS>) * sizeof(uint32_t);
}

// The shift of the si-th step of a unit (bits dd dh dw): ordered by rising tap count (1, 2, 2, 2, 4, 4, 4, 8), so
// that the pieces loaded last, which have the fewest steps left to hide their latency, see the longest steps.
__host__ __device__ constexpr int shift_at(int si) { return si == 3 ? 3 : si == 4 ? 4 : 7 - si; }

// `a` where its bit `bit` is set, else 0: one LOP3 that sets a predicate and one select (written out in PTX: as
// C++ the compiler builds the mask from shifts, one instruction more per word).
__device__ __forceinline__ uint32_t keep_if_bit(uint32_t a, uint32_t bit) {
  uint32_t m;
  asm("{\n\t.reg .pred q;\n\t.reg .b32 t;\n\tand.b32 t, %1, %2;\n\tsetp.ne.u32 q, t, 0;\n\t"
      "selp.b32 %0, %1, 0, q;\n\t}"
      : "=r"(m)
      : "r"(a), "r"(bit));
  return m;
}

// The staged word of a float32 gradient value and its window offset. Bits 0..7 are cleared first: the rounding of
// a NaN may leave them set, and the tensor cores ignore them (a NaN stays NaN; the one-hot bit changes no value).
__device__ __forceinline__ uint32_t onehot_word(uint32_t bits, uint32_t offset) {
  return (tf32_round(__uint_as_float(bits)) & ~0xffu) | (1u << (offset & 7u));
}

// The dynamic shared memory of the kernel (layout: grad_input_kernel).
extern __shared__ __align__(16) uint32_t smem[];

// Stages the pooled gradient of one unit (tile at (n, d0, h0, w0), chunk `chunk` of 8 * KS k-words) over the
// windows q = i0 - 1 .. i0 + kT - 1 per dim: word (k, halo position) at k * kPitch + position; zero (phase 0)
// outside the pooled extent and past Cout. Each thread keeps its two halo positions (decoded and bounds-checked
// once per unit) and walks their channels with one address step each, through any strides. Piece k (of 8) holds
// k-words k * KS .. k * KS + KS - 1; its loads land in slot k % kDepth, so kDepth pieces can be in flight.
template <int KS>
struct GradStager {
  static constexpr int kDepth = 3;

  const float* gp[kPosPerThread];
  const uint8_t* op[kPosPerThread];
  int avail[kPosPerThread];  // channels of the chunk that exist at the position (0: none, or nothing to stage)
  bool store_ok[kPosPerThread];
  int64_t sc;
  int dst;  // word offset of the destination buffer in smem
  uint32_t lo[kDepth][kPosPerThread][KS], plo[kDepth][kPosPerThread][KS];

  // `active` false: nothing to stage (the block's last unit); loads and stores are then skipped.
  __device__ __forceinline__ void setup(const Params& p, bool active, int n, int d0, int h0, int w0, int chunk,
                                        int buffer) {
    dst = buffer;
    sc = p.sg[1];
    const int c_first = chunk * 8 * KS;
#pragma unroll
    for (int j = 0; j < kPosPerThread; ++j) {
      const int hp = halo_position(j);
      const int hd = hp / (kHH * kHW);
      const int hr = hp - hd * (kHH * kHW);
      const int hh = hr / kHW;
      const int hw = hr - hh * kHW;
      const int qd = d0 - 1 + hd, qh = h0 - 1 + hh, qw = w0 - 1 + hw;
      store_ok[j] = active && hp < kHalo;
      const bool inside =
          store_ok[j] && qd >= 0 && qh >= 0 && qw >= 0 && qd < p.PD && qh < p.PH && qw < p.PW;
      const int64_t at = inside ? static_cast<int64_t>(n) * p.sg[0] + qd * p.sg[2] + qh * p.sg[3] +
                                      qw * p.sg[4] + c_first * sc
                                : 0;
      gp[j] = static_cast<const float*>(p.g) + at;
      op[j] = p.off + at;
      avail[j] = inside ? p.Cout - c_first : 0;
    }
  }

  __device__ __forceinline__ void load(int k) {
    const int s = k % kDepth;
#pragma unroll
    for (int j = 0; j < kPosPerThread; ++j)
#pragma unroll
      for (int w = 0; w < KS; ++w) {
        const int c = k * KS + w;
        lo[s][j][w] = load_if(c < avail[j], gp[j] + c * sc);
        plo[s][j][w] = load_if(c < avail[j], op[j] + c * sc);
      }
  }

  __device__ __forceinline__ void store(int k) {
    const int s = k % kDepth;
#pragma unroll
    for (int j = 0; j < kPosPerThread; ++j) {
      if (!store_ok[j]) continue;
      const int hp = halo_position(j);
#pragma unroll
      for (int w = 0; w < KS; ++w) smem[dst + (k * KS + w) * kPitch + hp] = onehot_word(lo[s][j][w], plo[s][j][w]);
    }
  }

  // All eight pieces at once (the first unit, before any mma).
  __device__ __forceinline__ void all() {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      load(k);
      if (k >= kDepth - 1) store(k - (kDepth - 1));
    }
    finish();
  }

  // The pieces still in flight after the eighth load.
  __device__ __forceinline__ void finish() {
#pragma unroll
    for (int k = 8 - (kDepth - 1); k < 8; ++k) store(k);
  }
};

// acc += the staged chunk's products over the 8 shifts and their taps, while `next` stages the next unit: piece
// si's loads before step si, its stores after step si + kDepth - 1. Everything but the thread's base addresses is a
// compile-time constant once the loops are unrolled, so every shared-memory load has an immediate offset.
template <int KS>
__device__ __forceinline__ void accumulate(float (&acc)[kMT][kNT][4], const uint32_t* __restrict__ sA,
                                           const uint32_t* __restrict__ sB, const int (&a_base)[kMT], int lane,
                                           GradStager<KS>& next) {
#pragma unroll
  for (int si = 0; si < 8; ++si) {
    next.load(si);
    const int s = shift_at(si);
    const int dd = s >> 2, dh = (s >> 1) & 1, dw = s & 1;
    // window q = i - delta
    const int a_off = -((dd * kHH + dh) * kHW + dw);
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      uint32_t a[kMT][4];
#pragma unroll
      for (int i = 0; i < kMT; ++i) {
        const int o = a_base[i] + a_off + ks * 8 * kPitch;
        const int offs[4] = {0, kHW, 4 * kPitch, 4 * kPitch + kHW};
#pragma unroll
        for (int r = 0; r < 4; ++r) a[i][r] = sA[o + offs[r]];
      }
      for_each_shift_tap<KS>(sB, dd, dh, dw, ks, lane, [&](uint32_t ph, const uint32_t (&b)[kNT][2]) {
#pragma unroll
        for (int i = 0; i < kMT; ++i) {
          uint32_t m[4];
#pragma unroll
          for (int r = 0; r < 4; ++r) m[r] = keep_if_bit(a[i][r], 1u << ph);
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) mma<Mode::kTF32>(acc[i][nt], m, b[nt][0], b[nt][1]);
        }
      });
    }
    constexpr int kLag = GradStager<KS>::kDepth - 1;
    if (si >= kLag) next.store(si - kLag);
  }
  next.finish();
}

// KS: k-steps (8 k-words) per staged chunk. Persistent blocks: each walks the tiles blockIdx.x,
// blockIdx.x + gridDim.x, ..., a unit (tile, chunk) at a time. When the weight spans at most two chunks it is
// staged once (chunk c in buffer c); otherwise each unit's chunk is staged into buffer (unit & 1) at the start of
// the previous unit.
template <int KS>
__global__ void __launch_bounds__(kThreads, 2) grad_input_kernel(const Params p) {
  constexpr Mode M = Mode::kTF32;
  constexpr int g_base = 2 * kWeightWords<KS>;
  uint32_t* const sW = smem;           // weight_buffers x kWeightWords
  uint32_t* const sG = smem + g_base;  // 2 x kGradWords
  constexpr int kG = kGradWords<KS>;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int ci0 = blockIdx.y * kBlockN;
  const int nchunks = p.nchunks;
  const bool resident = nchunks <= 2;
  // (int: the launcher checks that the tiles, and so the units, number fewer than 2^31)
  const int64_t my_tiles = (p.n_tiles - blockIdx.x + gridDim.x - 1) / gridDim.x;
  const int64_t n_units = my_tiles * nchunks;

  int a_base[kMT], row_d[kMT], row_h[kMT];
#pragma unroll
  for (int i = 0; i < kMT; ++i) {
    const int mi = warp * kMT + i;
    row_d[i] = mi >> 2;
    row_h[i] = (mi & 3) * 2;
    a_base[i] = ((row_d[i] + 1) * kHH + row_h[i] + 1) * kHW + 1 + g + t * kPitch;
  }

  // The origin of a tile (int: the launcher checks that tile indices stay below 2^31).
  auto tile_of = [&](int tile, int& n, int& d0, int& h0, int& w0) {
    int rem = tile;
    w0 = (rem % p.tiles_w) * kTW;
    rem /= p.tiles_w;
    h0 = (rem % p.tiles_h) * kTH;
    rem /= p.tiles_h;
    d0 = (rem % p.tiles_d) * kTD;
    n = rem / p.tiles_d;
  };

  // The first unit: its weight (or all of it) and its gradient, before any mma.
  GradStager<KS> stager;
  stage_weights<Mode::kTF32, KS>(p, sW, ci0, 0);
  if (resident && nchunks == 2) stage_weights<Mode::kTF32, KS>(p, sW + kWeightWords<KS>, ci0, 1);
  {
    int n, d0, h0, w0;
    tile_of(static_cast<int>(blockIdx.x), n, d0, h0, w0);
    stager.setup(p, n_units > 0, n, d0, h0, w0, 0, g_base);
    stager.all();
  }
  __syncthreads();

  float acc[kMT][kNT][4];
#pragma unroll
  for (int i = 0; i < kMT; ++i)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][nt][j] = 0.f;

  int tile = static_cast<int>(blockIdx.x), c = 0;  // of unit u
  for (int64_t u = 0; u < n_units; ++u) {
    const int buf = static_cast<int>(u & 1);
    const bool has_next = u + 1 < n_units;
    const int c_next = c + 1 < nchunks ? c + 1 : 0;
    const int tile_next = c_next == 0 ? tile + static_cast<int>(gridDim.x) : tile;
    if (!resident && has_next) stage_weights<Mode::kTF32, KS>(p, sW + (buf ^ 1) * kWeightWords<KS>, ci0, c_next);
    {
      int n, d0, h0, w0;
      tile_of(has_next ? tile_next : tile, n, d0, h0, w0);
      stager.setup(p, has_next, n, d0, h0, w0, c_next, g_base + (buf ^ 1) * kG);
    }
    const uint32_t* cur = sG + buf * kG;
    const uint32_t* w_cur = sW + (resident ? c : buf) * kWeightWords<KS>;
    accumulate<KS>(acc, cur, w_cur, a_base, lane, stager);

    if (c == nchunks - 1) {
      // Stores through grad_input's strides, int64 offsets.
      int n, d0, h0, w0;
      tile_of(tile, n, d0, h0, w0);
#pragma unroll
      for (int i = 0; i < kMT; ++i) {
        const int d = d0 + row_d[i];
        const int w = w0 + g;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int h = h0 + row_h[i] + (j >> 1);
          const bool ok = d < p.D && w < p.W && h < p.H;
          const int64_t at = static_cast<int64_t>(n) * p.si[0] + static_cast<int64_t>(d) * p.si[2] +
                             static_cast<int64_t>(h) * p.si[3] + static_cast<int64_t>(w) * p.si[4];
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) {
            const int ci = ci0 + nt * 8 + 2 * t + (j & 1);
            if (ok && ci < p.Cin)
              static_cast<float*>(p.gi)[at + static_cast<int64_t>(ci) * p.si[1]] = acc[i][nt][j];
            acc[i][nt][j] = 0.f;
          }
        }
      }
    }
    // The next unit's gradient (and weight) are in place and every read of this unit's buffers is done.
    __syncthreads();
    tile = tile_next;
    c = c_next;
  }
}

// Blocks per multiprocessor of one instantiation, asked of the runtime once (the grid only sizes the persistent
// loop, so a stale figure on a different second GPU costs speed, never correctness).
template <int KS>
int blocks_per_sm(size_t smem) {
  static std::atomic<int> cache{0};
  int v = cache.load(std::memory_order_relaxed);
  if (v <= 0) {
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, grad_input_kernel<KS>, kThreads, smem));
    v = v > 0 ? v : 1;
    cache.store(v, std::memory_order_relaxed);
  }
  return v;
}

template <int KS>
void launch_one(const Params& p, cudaStream_t stream) {
  const size_t smem = smem_bytes<KS>();
  auto kernel = grad_input_kernel<KS>;
  // Above 48 KB a block needs the opt-in, given once per device.
  static DynamicSmemLimit smem_limit;
  const int device = current_cuda_device();
  smem_limit.raise_to(reinterpret_cast<const void*>(kernel), smem, device);
  const int sms = multiprocessor_count(device);
  const int64_t grid_y = (p.Cin + kBlockN - 1) / kBlockN;
  TORCH_CHECK(grid_y <= 65535,
              "conv_transpose3d_post_pool grad_input: too many input channels for one launch: ", p.Cin);
  const int64_t resident = static_cast<int64_t>(blocks_per_sm<KS>(smem)) * sms;
  int64_t bx = (resident + grid_y - 1) / grid_y;
  bx = bx < p.n_tiles ? bx : p.n_tiles;
  bx = bx > 0 ? bx : 1;
  kernel<<<dim3(static_cast<unsigned>(bx), static_cast<unsigned>(grid_y)), kThreads, smem, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace double_buffered
}  // namespace grad_input
}  // namespace conv_transpose3d_post_pool
}  // namespace fused
