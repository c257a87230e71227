// See cpu/simd.h. This file includes no torch headers on purpose: everything in it may be compiled
// for AVX-512 or AVX2, and only the exported leaf functions are dispatched on the running CPU.
#include "post_pool/cpu/simd.h"

#include <cstring>
#include <limits>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FUSED_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define FUSED_CLONES
#endif

namespace fused {
namespace post_pool {
namespace simd {
namespace {

// A float rounded to bfloat16 and widened back, as c10::BFloat16(float) rounds (to nearest even; every NaN becomes
// 0x7FC0): the mixed form's first LeakyReLU (csrc/common/epilogue.h, round_through), branch-free so that it
// vectorizes with the loops around it.
inline float round_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  const uint32_t rounded = (bits + (((bits >> 16) & 1u) + 0x7FFFu)) & 0xFFFF0000u;
  const uint32_t out = f != f ? 0x7FC00000u : rounded;
  float r;
  std::memcpy(&r, &out, sizeof(r));
  return r;
}

// RB: the mixed form of a bfloat16 input (float32 multiplier and output), whose first LeakyReLU is rounded to
// bfloat16; only with T = float.
template <typename T, bool RB>
inline T mid(T v) {
  if constexpr (RB) {
    return round_bf16(v);
  } else {
    return v;
  }
}

template <typename T, bool RB = false>
inline T epilogue(T x, T m, T s1, T s2) {
  const T a = x * s1;
  const T y1 = mid<T, RB>(x > T(0) ? x : a);
  const T y2 = y1 * m;
  const T b = y2 * s2;
  return y2 > T(0) ? y2 : b;
}

template <typename T, bool SAVE, bool RB = false>
inline void row_body(const T* __restrict r0, const T* __restrict r1, const T* __restrict r2, const T* __restrict r3,
                     int64_t OW, T m, T s1, T s2, T* __restrict out, T* __restrict sel, uint8_t* __restrict off) {
  for (int64_t ow = 0; ow < OW; ++ow) {
    // As scan_window: the selection starts at tap 0 with the max at -inf (an all -inf window keeps tap 0).
    T best = -std::numeric_limits<T>::infinity();
    T bx = r0[2 * ow];
    int32_t bo = 0;
#define FUSED_STEP(ROW, JW, TAP)                         \
  {                                                      \
    const T x = ROW[2 * ow + JW];                        \
    const T v = epilogue<T, RB>(x, m, s1, s2);           \
    const bool take = (v > best) | (v != v);             \
    best = take ? v : best;                              \
    if (SAVE) {                                          \
      bx = take ? x : bx;                                \
      bo = take ? TAP : bo;                              \
    }                                                    \
  }
    FUSED_STEP(r0, 0, 0)
    FUSED_STEP(r0, 1, 1)
    FUSED_STEP(r1, 0, 2)
    FUSED_STEP(r1, 1, 3)
    FUSED_STEP(r2, 0, 4)
    FUSED_STEP(r2, 1, 5)
    FUSED_STEP(r3, 0, 6)
    FUSED_STEP(r3, 1, 7)
#undef FUSED_STEP
    out[ow] = best;
    if (SAVE) {
      sel[ow] = bx;
      off[ow] = static_cast<uint8_t>(bo);
    }
  }
}

template <typename T, bool SAVE, typename Off, bool RB = false>
inline void channels_body(const T* __restrict x, const T* __restrict m, int64_t C, T s1, T s2, int32_t tap,
                          T* __restrict out, T* __restrict sel, Off* __restrict off) {
  for (int64_t c = 0; c < C; ++c) {
    const T xv = x[c];
    const T v = epilogue<T, RB>(xv, m[c], s1, s2);
    const T best = out[c];
    const bool take = (v > best) | (v != v);
    out[c] = take ? v : best;
    if (SAVE) {
      sel[c] = take ? xv : sel[c];
      off[c] = take ? static_cast<Off>(tap) : off[c];
    }
  }
}

template <typename T, bool SAVE, bool RB = false>
inline void channels_row_body(const T* __restrict x, int64_t sh, int64_t sd, int64_t OW, int64_t C,
                              const T* __restrict m, T s1, T s2, T* __restrict out, T* __restrict sel,
                              uint8_t* __restrict off) {
  for (int64_t ow = 0; ow < OW; ++ow) {
    const T* p = x + 2 * ow * C;
    T* o = out + ow * C;
    T* sv = SAVE ? sel + ow * C : nullptr;
    uint8_t* ov = SAVE ? off + ow * C : nullptr;
    for (int64_t c = 0; c < C; ++c) {
      T best = -std::numeric_limits<T>::infinity();
      T bx = p[c];  // tap 0 until a tap beats -inf, as scan_window
      int32_t bo = 0;
      const T mc = m[c];
#define FUSED_TAP(OFFSET, TAP)                          \
  {                                                     \
    const T xv = p[(OFFSET) + c];                       \
    const T v = epilogue<T, RB>(xv, mc, s1, s2);        \
    const bool take = (v > best) | (v != v);            \
    best = take ? v : best;                             \
    if (SAVE) {                                         \
      bx = take ? xv : bx;                              \
      bo = take ? TAP : bo;                             \
    }                                                   \
  }
      FUSED_TAP(0, 0)
      FUSED_TAP(C, 1)
      FUSED_TAP(sh, 2)
      FUSED_TAP(sh + C, 3)
      FUSED_TAP(sd, 4)
      FUSED_TAP(sd + C, 5)
      FUSED_TAP(sd + sh, 6)
      FUSED_TAP(sd + sh + C, 7)
#undef FUSED_TAP
      o[c] = best;
      if (SAVE) {
        sv[c] = bx;
        ov[c] = static_cast<uint8_t>(bo);
      }
    }
  }
}

// Inference shortcut (as in the CUDA kernels): with both slopes > 0 and finite, and a finite non-zero
// multiplier, the epilogue is monotone (non-decreasing for m > 0, non-increasing for m < 0; no step can turn a
// non-NaN into NaN), so the window's max of the epilogue is the epilogue of its max (or min) input. Values equal
// the full scan; only the sign of a zero result can differ when +0 and -0 tie in a window. A NaN anywhere in the
// window makes the output NaN, as max_pool3d does.
template <typename T>
inline bool monotone_slopes(T s1, T s2) {
  const T inf = std::numeric_limits<T>::infinity();
  return s1 > T(0) && s2 > T(0) && s1 < inf && s2 < inf;
}

template <typename T>
inline bool monotone_multiplier(T m) {
  const T inf = std::numeric_limits<T>::infinity();
  return m != T(0) && m > -inf && m < inf;  // false for NaN too
}

template <typename T, bool UP, bool RB = false>
inline void row_monotone_body(const T* __restrict r0, const T* __restrict r1, const T* __restrict r2,
                              const T* __restrict r3, int64_t OW, T m, T s1, T s2, T* __restrict out) {
  const T qnan = std::numeric_limits<T>::quiet_NaN();
  for (int64_t ow = 0; ow < OW; ++ow) {
    const T v[8] = {r0[2 * ow], r0[2 * ow + 1], r1[2 * ow], r1[2 * ow + 1],
                    r2[2 * ow], r2[2 * ow + 1], r3[2 * ow], r3[2 * ow + 1]};
    T pick = v[0];
    bool nan = v[0] != v[0];
    for (int t = 1; t < 8; ++t) {
      pick = (UP ? v[t] > pick : v[t] < pick) ? v[t] : pick;
      nan = nan | (v[t] != v[t]);
    }
    const T e = epilogue<T, RB>(pick, m, s1, s2);
    out[ow] = nan ? qnan : e;
  }
}

template <typename T, bool RB = false>
inline void channels_row_monotone_body(const T* __restrict x, int64_t sh, int64_t sd, int64_t OW, int64_t C,
                                       const T* __restrict m, T s1, T s2, T* __restrict out) {
  const T qnan = std::numeric_limits<T>::quiet_NaN();
  for (int64_t ow = 0; ow < OW; ++ow) {
    const T* p = x + 2 * ow * C;
    T* o = out + ow * C;
    for (int64_t c = 0; c < C; ++c) {
      const T v[8] = {p[c], p[C + c], p[sh + c], p[sh + C + c], p[sd + c], p[sd + C + c], p[sd + sh + c],
                      p[sd + sh + C + c]};
      T hi = v[0], lo = v[0];
      bool nan = v[0] != v[0];
      for (int t = 1; t < 8; ++t) {
        hi = v[t] > hi ? v[t] : hi;
        lo = v[t] < lo ? v[t] : lo;
        nan = nan | (v[t] != v[t]);
      }
      const T mc = m[c];
      const T e = epilogue<T, RB>(mc > T(0) ? hi : lo, mc, s1, s2);
      o[c] = nan ? qnan : e;
    }
  }
}

template <typename T>
inline bool all_monotone(const T* m, int64_t C, T s1, T s2) {
  if (!monotone_slopes(s1, s2)) return false;
  bool ok = true;
  for (int64_t c = 0; c < C; ++c) ok = ok & monotone_multiplier(m[c]);
  return ok;
}

// The chain rule as eager autograd applies it (leaky_relu_backward, mul backward, leaky_relu_backward), from
// the gradient accumulated into zeros (0 + g, which turns -0 into +0 as eager's scatter does).
template <typename T, bool RB = false>
inline void chain(T g, T x, T m, T s1, T s2, T& gx, T& gm) {
  const T gsum = T(0) + g;
  const T a = x * s1;
  const T y1 = mid<T, RB>(x > T(0) ? x : a);
  const T y2 = y1 * m;
  const T b = gsum * s2;
  const T gy2 = y2 > T(0) ? gsum : b;
  const T gy1 = mid<T, RB>(gy2 * m);
  const T c = gy1 * s1;
  gx = x > T(0) ? gy1 : c;
  gm = gy2 * y1;
}

template <typename T, bool RB = false>
inline void row_backward_body(const T* __restrict go, const T* __restrict sel, const uint8_t* __restrict off,
                              int64_t OW, T m, T s1, T s2, T* __restrict g0, T* __restrict g1, T* __restrict g2,
                              T* __restrict g3, T* __restrict contrib) {
  // Two passes per chunk of the row, as in channels_backward_body: the gradients first, then each window line's
  // pair of columns as one select per element. One pass writing all eight taps per output did not vectorize and
  // took twice the channels_last kernel's time on the same bytes.
  constexpr int64_t kChunk = 64;
  T gx[kChunk];
  T* const lines[4] = {g0, g1, g2, g3};
  for (int64_t base = 0; base < OW; base += kChunk) {
    const int64_t n = OW - base < kChunk ? OW - base : kChunk;
    for (int64_t i = 0; i < n; ++i) {
      T gm;
      chain<T, RB>(go[base + i], sel[base + i], m, s1, s2, gx[i], gm);
      contrib[base + i] = gm;
    }
    for (int q = 0; q < 4; ++q) {
      T* __restrict dst = lines[q] + 2 * base;
      const int32_t t0 = 2 * q, t1 = 2 * q + 1;
      for (int64_t i = 0; i < n; ++i) {
        const int32_t t = off[base + i];
        dst[2 * i] = t == t0 ? gx[i] : T(0);
        dst[2 * i + 1] = t == t1 ? gx[i] : T(0);
      }
    }
  }
}

template <typename T, bool RB = false>
inline void channels_backward_body(const T* __restrict go, const T* __restrict sel, const uint8_t* __restrict off,
                                   const T* __restrict m, int64_t C, T s1, T s2, T* const* gi,
                                   T* __restrict contrib, T* __restrict gx) {
  for (int64_t c = 0; c < C; ++c) {
    T g, gm;
    chain<T, RB>(go[c], sel[c], m[c], s1, s2, g, gm);
    gx[c] = g;
    contrib[c] = gm;
  }
  for (int32_t t = 0; t < 8; ++t) {
    T* __restrict dst = gi[t];
    for (int64_t c = 0; c < C; ++c) {
      dst[c] = off[c] == t ? gx[c] : T(0);
    }
  }
}

// The per-call choice of body (saving the selection or not, monotone shortcut, offset width), shared by the
// float and double entry points below. always_inline: each target clone must get its own copy; plain inline was
// not inlined here, and the AVX-512 clones of row_2x2x2/channels_row_2x2x2 then ran default-target bodies (no
// zmm instruction left in them, checked with objdump).
#if defined(__GNUC__) || defined(__clang__)
#define FUSED_DISPATCH __attribute__((always_inline)) inline
#else
#define FUSED_DISPATCH inline
#endif

template <typename T, bool RB = false>
FUSED_DISPATCH void row_2x2x2_impl(const T* r0, const T* r1, const T* r2, const T* r3, int64_t OW, T m, T s1, T s2,
                                   T* out, T* sel, uint8_t* off) {
  if (sel != nullptr) {
    row_body<T, true, RB>(r0, r1, r2, r3, OW, m, s1, s2, out, sel, off);
  } else if (monotone_slopes(s1, s2) && monotone_multiplier(m)) {
    if (m > T(0)) {
      row_monotone_body<T, true, RB>(r0, r1, r2, r3, OW, m, s1, s2, out);
    } else {
      row_monotone_body<T, false, RB>(r0, r1, r2, r3, OW, m, s1, s2, out);
    }
  } else {
    row_body<T, false, RB>(r0, r1, r2, r3, OW, m, s1, s2, out, sel, off);
  }
}

template <typename T, bool RB = false>
FUSED_DISPATCH void channels_row_2x2x2_impl(const T* x, int64_t sh, int64_t sd, int64_t OW, int64_t C, const T* m,
                                            T s1, T s2, T* out, T* sel, uint8_t* off) {
  if (sel != nullptr) {
    channels_row_body<T, true, RB>(x, sh, sd, OW, C, m, s1, s2, out, sel, off);
  } else if (all_monotone(m, C, s1, s2)) {
    channels_row_monotone_body<T, RB>(x, sh, sd, OW, C, m, s1, s2, out);
  } else {
    channels_row_body<T, false, RB>(x, sh, sd, OW, C, m, s1, s2, out, sel, off);
  }
}

template <typename T, bool RB = false>
FUSED_DISPATCH void channels_tap_impl(const T* x, const T* m, int64_t C, T s1, T s2, int32_t tap, T* out, T* sel,
                                      uint8_t* off8, int32_t* off32) {
  if (sel == nullptr) {
    channels_body<T, false, uint8_t, RB>(x, m, C, s1, s2, tap, out, sel, off8);
  } else if (off8 != nullptr) {
    channels_body<T, true, uint8_t, RB>(x, m, C, s1, s2, tap, out, sel, off8);
  } else {
    channels_body<T, true, int32_t, RB>(x, m, C, s1, s2, tap, out, sel, off32);
  }
}

}  // namespace

FUSED_CLONES void channels_row_2x2x2(const float* x, int64_t sh, int64_t sd, int64_t OW, int64_t C, const float* m,
                                     float s1, float s2, float* out, float* sel, uint8_t* off) {
  channels_row_2x2x2_impl(x, sh, sd, OW, C, m, s1, s2, out, sel, off);
}

FUSED_CLONES void channels_row_2x2x2(const double* x, int64_t sh, int64_t sd, int64_t OW, int64_t C,
                                     const double* m, double s1, double s2, double* out, double* sel,
                                     uint8_t* off) {
  channels_row_2x2x2_impl(x, sh, sd, OW, C, m, s1, s2, out, sel, off);
}

FUSED_CLONES void row_2x2x2_backward(const float* go, const float* sel, const uint8_t* off, int64_t OW, float m,
                                     float s1, float s2, float* g0, float* g1, float* g2, float* g3,
                                     float* contrib) {
  row_backward_body(go, sel, off, OW, m, s1, s2, g0, g1, g2, g3, contrib);
}

FUSED_CLONES void row_2x2x2_backward(const double* go, const double* sel, const uint8_t* off, int64_t OW, double m,
                                     double s1, double s2, double* g0, double* g1, double* g2, double* g3,
                                     double* contrib) {
  row_backward_body(go, sel, off, OW, m, s1, s2, g0, g1, g2, g3, contrib);
}

FUSED_CLONES void channels_2x2x2_backward(const float* go, const float* sel, const uint8_t* off, const float* m,
                                          int64_t C, float s1, float s2, float* const* gi, float* contrib,
                                          float* gx) {
  channels_backward_body(go, sel, off, m, C, s1, s2, gi, contrib, gx);
}

FUSED_CLONES void channels_2x2x2_backward(const double* go, const double* sel, const uint8_t* off, const double* m,
                                          int64_t C, double s1, double s2, double* const* gi, double* contrib,
                                          double* gx) {
  channels_backward_body(go, sel, off, m, C, s1, s2, gi, contrib, gx);
}

FUSED_CLONES void row_2x2x2(const float* r0, const float* r1, const float* r2, const float* r3, int64_t OW, float m,
                            float s1, float s2, float* out, float* sel, uint8_t* off) {
  row_2x2x2_impl(r0, r1, r2, r3, OW, m, s1, s2, out, sel, off);
}

FUSED_CLONES void row_2x2x2(const double* r0, const double* r1, const double* r2, const double* r3, int64_t OW,
                            double m, double s1, double s2, double* out, double* sel, uint8_t* off) {
  row_2x2x2_impl(r0, r1, r2, r3, OW, m, s1, s2, out, sel, off);
}

FUSED_CLONES void channels_tap(const float* x, const float* m, int64_t C, float s1, float s2, int32_t tap,
                               float* out, float* sel, uint8_t* off8, int32_t* off32) {
  channels_tap_impl(x, m, C, s1, s2, tap, out, sel, off8, off32);
}

FUSED_CLONES void channels_tap(const double* x, const double* m, int64_t C, double s1, double s2, int32_t tap,
                               double* out, double* sel, uint8_t* off8, int32_t* off32) {
  channels_tap_impl(x, m, C, s1, s2, tap, out, sel, off8, off32);
}

FUSED_CLONES void row_2x2x2_bf16_mid(const float* r0, const float* r1, const float* r2, const float* r3, int64_t OW,
                                     float m, float s1, float s2, float* out, float* sel, uint8_t* off) {
  row_2x2x2_impl<float, true>(r0, r1, r2, r3, OW, m, s1, s2, out, sel, off);
}

FUSED_CLONES void channels_row_2x2x2_bf16_mid(const float* x, int64_t sh, int64_t sd, int64_t OW, int64_t C,
                                              const float* m, float s1, float s2, float* out, float* sel,
                                              uint8_t* off) {
  channels_row_2x2x2_impl<float, true>(x, sh, sd, OW, C, m, s1, s2, out, sel, off);
}

FUSED_CLONES void channels_tap_bf16_mid(const float* x, const float* m, int64_t C, float s1, float s2, int32_t tap,
                                        float* out, float* sel, uint8_t* off8, int32_t* off32) {
  channels_tap_impl<float, true>(x, m, C, s1, s2, tap, out, sel, off8, off32);
}

FUSED_CLONES void row_2x2x2_backward_bf16_mid(const float* go, const float* sel, const uint8_t* off, int64_t OW,
                                              float m, float s1, float s2, float* g0, float* g1, float* g2,
                                              float* g3, float* contrib) {
  row_backward_body<float, true>(go, sel, off, OW, m, s1, s2, g0, g1, g2, g3, contrib);
}

FUSED_CLONES void channels_2x2x2_backward_bf16_mid(const float* go, const float* sel, const uint8_t* off,
                                                   const float* m, int64_t C, float s1, float s2, float* const* gi,
                                                   float* contrib, float* gx) {
  channels_backward_body<float, true>(go, sel, off, m, C, s1, s2, gi, contrib, gx);
}

FUSED_CLONES void bf16_to_float(const uint16_t* __restrict src, float* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(src[i]) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    dst[i] = f;
  }
}

FUSED_CLONES void float_to_bf16(const float* __restrict src, uint16_t* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float f = src[i];
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof(bits));
    const uint32_t rounded = (bits + (((bits >> 16) & 1u) + 0x7FFFu)) >> 16;
    dst[i] = static_cast<uint16_t>(f != f ? 0x7FC0u : rounded);
  }
}

}  // namespace simd
}  // namespace post_pool
}  // namespace fused
