// CPU launchers of fused::post_pool, post_pool_with_offsets and post_pool_backward, and of their post_pool_bias
// variants (a per-channel bias added before the first LeakyReLU; scalar paths only, as Inductor keeps conv
// biases inside the convolution on CPU and so rarely routes here). The op entry points are op.cpp.
#include "post_pool/post_pool.h"
#include "post_pool/cpu/simd.h"
#include "post_pool/launchers.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <limits>
#include <vector>

namespace fused {
namespace post_pool {
namespace {

constexpr int64_t kGrain = 2048;  // outputs per parallel task: enough to hide the scheduling cost

template <typename scalar_t, typename off_t, typename out_t = scalar_t>
struct ForwardPtrs {
  const scalar_t* x;
  const out_t* m;
  int64_t m_stride;  // 0 for a scalar multiplier, 1 per channel
  out_t* out;
  scalar_t* sel;     // nullptr for inference
  off_t* off;        // nullptr for inference
  const scalar_t* bias = nullptr;  // post_pool_bias ops only
};

// One output at a time, any window; NCDHW. Rows of outputs (n, c, od, oh) are the parallel unit, so index
// arithmetic (int64 division) is paid per row, not per output.
template <int K, typename scalar_t, typename off_t, typename out_t>
void forward_rows(const ForwardPtrs<scalar_t, off_t, out_t>& p, const PoolGeometry& g, double s1d, double s2d) {
  using acc_t = at::opmath_type<scalar_t>;
  using mid_t = mid_type<scalar_t, out_t>;
  const acc_t s1 = static_cast<acc_t>(s1d), s2 = static_cast<acc_t>(s2d);
  const Strides st = input_strides(g);
  const int64_t rows = g.N * g.C * g.OD * g.OH;
  at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / g.OW), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      int64_t nc, od, oh;
      row_coords(r, g, nc, od, oh);
      const acc_t m = static_cast<acc_t>(p.m[(nc % g.C) * p.m_stride]);
      const acc_t b = p.bias == nullptr ? acc_t(0) : static_cast<acc_t>(p.bias[nc % g.C]);
      const scalar_t* plane = p.x + nc * st.c;
      const int64_t obase = r * g.OW;
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        const auto w = scan_window<K, K, K, scalar_t, acc_t, mid_t>(plane, st.d, st.h, st.w, od, oh, ow, g, m, s1,
                                                                    s2, b, p.bias != nullptr);
        p.out[obase + ow] = static_cast<out_t>(w.value);
        if (p.sel != nullptr) {
          p.sel[obase + ow] = w.input;
          p.off[obase + ow] = static_cast<off_t>(w.offset);
        }
      }
    }
  });
}

// channels_last_3d, any dtype, with or without bias: one pooled position (n, od, oh, ow) per step.
template <typename scalar_t, typename off_t, typename out_t>
void forward_channels_last_scalar(const ForwardPtrs<scalar_t, off_t, out_t>& p, const PoolGeometry& g, double s1d,
                                  double s2d) {
  using acc_t = at::opmath_type<scalar_t>;
  using mid_t = mid_type<scalar_t, out_t>;
  const acc_t s1 = static_cast<acc_t>(s1d), s2 = static_cast<acc_t>(s2d);
  const Strides st = input_strides(g);
  const int64_t positions = g.N * g.OD * g.OH * g.OW;
  at::parallel_for(0, positions, std::max<int64_t>(1, kGrain / g.C), [&](int64_t begin, int64_t end) {
    for (int64_t pos = begin; pos < end; ++pos) {
      int64_t n, od, oh, ow;
      position_coords(pos, g, n, od, oh, ow);
      for (int64_t c = 0; c < g.C; ++c) {
        const acc_t m = static_cast<acc_t>(p.m[c * p.m_stride]);
        const acc_t b = p.bias == nullptr ? acc_t(0) : static_cast<acc_t>(p.bias[c]);
        const auto w = scan_window<0, 0, 0, scalar_t, acc_t, mid_t>(p.x + n * st.n + c, st.d, st.h, st.w, od, oh,
                                                                    ow, g, m, s1, s2, b, p.bias != nullptr);
        const int64_t i = pos * g.C + c;
        p.out[i] = static_cast<out_t>(w.value);
        if (p.sel != nullptr) {
          p.sel[i] = w.input;
          p.off[i] = static_cast<off_t>(w.offset);
        }
      }
    }
  });
}

// float16/bfloat16 <-> float for the float kernels: bfloat16 through the vectorized SIMD leaves (bit-identical to
// c10's element conversions), float16 element by element.
template <typename scalar_t>
inline void to_float(const scalar_t* src, float* dst, int64_t n) {
  if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
    simd::bf16_to_float(reinterpret_cast<const uint16_t*>(src), dst, n);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
  }
}

template <typename scalar_t>
inline void from_float(const float* src, scalar_t* dst, int64_t n) {
  if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
    simd::float_to_bf16(src, reinterpret_cast<uint16_t*>(dst), n);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<scalar_t>(src[i]);
  }
}

// The four (d, h) lines of input (or grad_input) under one row of 2x2x2 windows: line (jd, jh) starts at
// p + jd * sd + jh * sh.
template <typename T>
struct Quad {
  T* p;
  int64_t sh, sd;
  T* line(int jd, int jh) const { return p + jd * sd + jh * sh; }
};

// The 2x2x2 fast paths and the channels_last SIMD path run the float/double SIMD kernels for every dtype. They
// compute in acc_t, as the scalar path does: float16/bfloat16 inputs widen exactly, the selected input narrows
// back exactly and the output is rounded once, so results stay bit-identical. Staging gives a kernel acc_t views
// of what it reads and writes: float/double tensors are handed through untouched (no copy); float16/bfloat16 go
// through float buffers, converted on in() and back on store().
template <typename scalar_t>
class Staging {
 public:
  using acc_t = at::opmath_type<scalar_t>;

  const acc_t* in(const scalar_t* src, int64_t n) {
    if constexpr (kPassThrough) {
      return src;
    } else {
      float* buf = take(n);
      to_float(src, buf, n);
      return buf;
    }
  }
  Quad<const acc_t> in(Quad<const scalar_t> src, int64_t n) {
    if constexpr (kPassThrough) {
      return src;
    } else {
      float* buf = take(4 * n);
      for (int q = 0; q < 4; ++q) to_float(src.line(q >> 1, q & 1), buf + q * n, n);
      return {buf, n, 2 * n};
    }
  }
  // As in(), for inputs read one at a time: every call converts into the same buffer, so what it returns is
  // valid only until the next call.
  const acc_t* in_transient(const scalar_t* src, int64_t n) {
    if constexpr (kPassThrough) {
      return src;
    } else {
      if (static_cast<int64_t>(transient_.size()) < n) transient_.resize(n);
      to_float(src, transient_.data(), n);
      return transient_.data();
    }
  }
  acc_t* out(scalar_t* dst, int64_t n) {
    if constexpr (kPassThrough) {
      return dst;
    } else {
      float* buf = take(n);
      pending_.push_back({buf, dst, n});
      return buf;
    }
  }
  Quad<acc_t> out(Quad<scalar_t> dst, int64_t n) {
    if constexpr (kPassThrough) {
      return dst;
    } else {
      float* buf = take(4 * n);
      for (int q = 0; q < 4; ++q) pending_.push_back({buf + q * n, dst.line(q >> 1, q & 1), n});
      return {buf, n, 2 * n};
    }
  }
  // Ends a step: writes back what it staged for output and frees the buffers for the next step.
  void store() {
    if constexpr (!kPassThrough) {
      for (const WriteBack& w : pending_) from_float(w.src, w.dst, w.n);
      pending_.clear();
      used_ = 0;
    }
  }

 private:
  static constexpr bool kPassThrough = std::is_same_v<scalar_t, acc_t>;
  struct WriteBack {
    const float* src;
    scalar_t* dst;
    int64_t n;
  };
  // The k-th take() of every step reuses the k-th buffer: steps stage the same sizes in the same order, so only
  // a task's first step allocates. Each buffer is its own vector, so adding one moves no data that a pointer
  // handed out earlier in the step refers to.
  float* take(int64_t n) {
    if (used_ == bufs_.size()) bufs_.emplace_back();
    std::vector<float>& b = bufs_[used_++];
    if (static_cast<int64_t>(b.size()) < n) b.resize(n);
    return b.data();
  }
  std::vector<std::vector<float>> bufs_;
  size_t used_ = 0;
  std::vector<WriteBack> pending_;
  std::vector<float> transient_;
};

// The mixed form's tensors in out_t (the output forward; grad_output backward) are float already: the kernels
// read and write them in place. Same-dtype ones go through the staging like the input.
template <typename scalar_t, typename out_t>
at::opmath_type<scalar_t>* staged_out(Staging<scalar_t>& stage, out_t* dst, int64_t n) {
  if constexpr (std::is_same_v<out_t, scalar_t>) {
    return stage.out(dst, n);
  } else {
    static_assert(std::is_same_v<out_t, at::opmath_type<scalar_t>>);
    return dst;
  }
}
template <typename scalar_t, typename out_t>
const at::opmath_type<scalar_t>* staged_in(Staging<scalar_t>& stage, const out_t* src, int64_t n) {
  if constexpr (std::is_same_v<out_t, scalar_t>) {
    return stage.in(src, n);
  } else {
    static_assert(std::is_same_v<out_t, at::opmath_type<scalar_t>>);
    return src;
  }
}

// Whether the SIMD kernels take this (input, output) pair: every same-dtype pair, and bfloat16's mixed form
// (float16's mixed form would need a vectorized float16 rounding; it takes the scalar paths).
template <typename scalar_t, typename out_t>
constexpr bool kSimd = std::is_same_v<scalar_t, out_t> ||
                       (std::is_same_v<scalar_t, c10::BFloat16> && std::is_same_v<out_t, float>);
template <typename scalar_t, typename out_t>
constexpr bool kBf16Mid = !std::is_same_v<scalar_t, out_t>;

// Contiguous, 2x2x2 exact tiling: rows of outputs through the vectorized row kernel.
template <typename scalar_t, typename out_t>
void forward_rows_2x2x2(const ForwardPtrs<scalar_t, uint8_t, out_t>& p, const PoolGeometry& g, double s1d,
                        double s2d) {
  using acc_t = at::opmath_type<scalar_t>;
  const acc_t s1 = static_cast<acc_t>(s1d), s2 = static_cast<acc_t>(s2d);
  const Strides st = input_strides(g);
  const int64_t rows = g.N * g.C * g.OD * g.OH;
  at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / g.OW), [&](int64_t begin, int64_t end) {
    Staging<scalar_t> stage;
    for (int64_t r = begin; r < end; ++r) {
      int64_t nc, od, oh;
      row_coords(r, g, nc, od, oh);
      const auto x =
          stage.in(Quad<const scalar_t>{p.x + nc * st.c + (2 * od) * st.d + (2 * oh) * st.h, st.h, st.d}, 2 * g.OW);
      const int64_t o = r * g.OW;
      acc_t* out = staged_out(stage, p.out + o, g.OW);
      acc_t* sel = p.sel == nullptr ? nullptr : stage.out(p.sel + o, g.OW);
      uint8_t* off = p.off == nullptr ? nullptr : p.off + o;
      const acc_t m = static_cast<acc_t>(p.m[(nc % g.C) * p.m_stride]);
      if constexpr (kBf16Mid<scalar_t, out_t>) {
        simd::row_2x2x2_bf16_mid(x.line(0, 0), x.line(0, 1), x.line(1, 0), x.line(1, 1), g.OW, m, s1, s2, out, sel,
                                 off);
      } else {
        simd::row_2x2x2(x.line(0, 0), x.line(0, 1), x.line(1, 0), x.line(1, 1), g.OW, m, s1, s2, out, sel, off);
      }
      stage.store();
    }
  });
}

// channels_last_3d, 2x2x2 exact tiling: a row of pooled positions per call of the vectorized kernel.
template <typename scalar_t, typename out_t>
void forward_channels_last_2x2x2(const ForwardPtrs<scalar_t, uint8_t, out_t>& p, const PoolGeometry& g, double s1d,
                                 double s2d) {
  using acc_t = at::opmath_type<scalar_t>;
  const acc_t s1 = static_cast<acc_t>(s1d), s2 = static_cast<acc_t>(s2d);
  const Strides st = input_strides(g);
  std::vector<acc_t> m(g.C);
  for (int64_t c = 0; c < g.C; ++c) m[c] = static_cast<acc_t>(p.m[c * p.m_stride]);
  const int64_t rows = g.N * g.OD * g.OH;
  const int64_t line = 2 * g.OW * g.C;  // the input elements of one (n, d, h) line that the windows use
  at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / (g.OW * g.C)), [&](int64_t begin, int64_t end) {
    Staging<scalar_t> stage;
    for (int64_t r = begin; r < end; ++r) {
      int64_t n, od, oh;
      row_coords(r, g, n, od, oh);
      const auto x =
          stage.in(Quad<const scalar_t>{p.x + n * st.n + (2 * od) * st.d + (2 * oh) * st.h, st.h, st.d}, line);
      const int64_t o = r * g.OW * g.C;
      acc_t* out = staged_out(stage, p.out + o, g.OW * g.C);
      acc_t* sel = p.sel == nullptr ? nullptr : stage.out(p.sel + o, g.OW * g.C);
      uint8_t* off = p.off == nullptr ? nullptr : p.off + o;
      if constexpr (kBf16Mid<scalar_t, out_t>) {
        simd::channels_row_2x2x2_bf16_mid(x.p, x.sh, x.sd, g.OW, g.C, m.data(), s1, s2, out, sel, off);
      } else {
        simd::channels_row_2x2x2(x.p, x.sh, x.sd, g.OW, g.C, m.data(), s1, s2, out, sel, off);
      }
      stage.store();
    }
  });
}

// channels_last_3d, any window: per pooled position, each in-range tap is folded into the running max of all C
// channels by the vectorized channel kernel, in window order (float16/bfloat16 on float copies of each tap's C
// channels).
template <typename scalar_t, typename off_t, typename out_t>
void forward_channels_last_simd(const ForwardPtrs<scalar_t, off_t, out_t>& p, const PoolGeometry& g, double s1d,
                                double s2d) {
  using acc_t = at::opmath_type<scalar_t>;
  const acc_t s1 = static_cast<acc_t>(s1d), s2 = static_cast<acc_t>(s2d);
  const Strides st = input_strides(g);
  std::vector<acc_t> m(g.C);
  for (int64_t c = 0; c < g.C; ++c) m[c] = static_cast<acc_t>(p.m[c * p.m_stride]);
  const int64_t positions = g.N * g.OD * g.OH * g.OW;
  at::parallel_for(0, positions, std::max<int64_t>(1, kGrain / g.C), [&](int64_t begin, int64_t end) {
    Staging<scalar_t> stage;
    for (int64_t pos = begin; pos < end; ++pos) {
      int64_t n, od, oh, ow;
      position_coords(pos, g, n, od, oh, ow);
      const TapRange t = tap_range(g, od, oh, ow);
      const int64_t o = pos * g.C;
      acc_t* out = staged_out(stage, p.out + o, g.C);
      acc_t* sel = p.sel == nullptr ? nullptr : stage.out(p.sel + o, g.C);
      uint8_t* off8 = nullptr;
      int32_t* off32 = nullptr;
      if (p.off != nullptr) {
        if constexpr (std::is_same_v<off_t, uint8_t>) off8 = p.off + o; else off32 = p.off + o;
      }
      const off_t first = static_cast<off_t>(t.first_offset);
      const scalar_t* xn = p.x + n * st.n;
      // As scan_window: the selection starts at the first in-range tap with the max at -inf, so a window whose
      // every value is -inf keeps that tap's input (none for a window that is all padding).
      const bool has_tap = t.jd0 < t.jd1 && t.jh0 < t.jh1 && t.jw0 < t.jw1;
      const acc_t* x_first =
          sel != nullptr && has_tap
              ? stage.in_transient(xn + (t.d0 + t.jd0 * g.dd) * st.d + (t.h0 + t.jh0 * g.dh) * st.h +
                                       (t.w0 + t.jw0 * g.dw) * st.w,
                                   g.C)
              : nullptr;
      for (int64_t c = 0; c < g.C; ++c) {
        out[c] = -std::numeric_limits<acc_t>::infinity();
        if (sel != nullptr) {
          sel[c] = x_first != nullptr ? x_first[c] : acc_t(0);
          p.off[o + c] = first;
        }
      }
      for (int64_t jd = t.jd0; jd < t.jd1; ++jd) {
        for (int64_t jh = t.jh0; jh < t.jh1; ++jh) {
          for (int64_t jw = t.jw0; jw < t.jw1; ++jw) {
            const scalar_t* x =
                xn + (t.d0 + jd * g.dd) * st.d + (t.h0 + jh * g.dh) * st.h + (t.w0 + jw * g.dw) * st.w;
            const int32_t tap = static_cast<int32_t>((jd * g.kh + jh) * g.kw + jw);
            if constexpr (kBf16Mid<scalar_t, out_t>) {
              simd::channels_tap_bf16_mid(stage.in_transient(x, g.C), m.data(), g.C, s1, s2, tap, out, sel, off8,
                                          off32);
            } else {
              simd::channels_tap(stage.in_transient(x, g.C), m.data(), g.C, s1, s2, tap, out, sel, off8, off32);
            }
          }
        }
      }
      stage.store();
    }
  });
}

template <typename scalar_t, typename off_t, typename out_t>
void forward_dispatch(const ForwardPtrs<scalar_t, off_t, out_t>& p, const PoolGeometry& g, double s1, double s2) {
  const bool k2 = g.exact_tiling && g.kd == 2 && g.kh == 2 && g.kw == 2;
  // The bias ops and float16's mixed form take the scalar paths.
  if (p.bias != nullptr || !kSimd<scalar_t, out_t>) {
    if (g.channels_last) {
      forward_channels_last_scalar(p, g, s1, s2);
    } else if (k2) {
      forward_rows<2>(p, g, s1, s2);
    } else {
      forward_rows<0>(p, g, s1, s2);
    }
    return;
  }
  if constexpr (kSimd<scalar_t, out_t>) {
    if (g.channels_last) {
      if constexpr (std::is_same_v<off_t, uint8_t>) {
        if (k2) {
          forward_channels_last_2x2x2(p, g, s1, s2);
          return;
        }
      }
      forward_channels_last_simd(p, g, s1, s2);
    } else if (k2) {
      if constexpr (std::is_same_v<off_t, uint8_t>) {
        forward_rows_2x2x2(p, g, s1, s2);
      } else {
        forward_rows<2>(p, g, s1, s2);
      }
    } else {
      forward_rows<0>(p, g, s1, s2);
    }
  }
}

template <typename scalar_t, typename out_t>
void forward_typed(const ForwardInputs& f, const ForwardOutputs& o) {
  const PoolGeometry& g = f.g;
  auto run = [&](auto* off_ptr) {
    using off_t = std::remove_pointer_t<decltype(off_ptr)>;
    ForwardPtrs<scalar_t, off_t, out_t> p{f.input.const_data_ptr<scalar_t>(), f.multiplier.const_data_ptr<out_t>(),
                                          f.multiplier.numel() == 1 ? 0 : 1, o.out.mutable_data_ptr<out_t>(),
                                          o.save() ? o.selected.mutable_data_ptr<scalar_t>() : nullptr, off_ptr,
                                          f.bias.defined() ? f.bias.const_data_ptr<scalar_t>() : nullptr};
    forward_dispatch(p, g, f.s1, f.s2);
  };
  if (!o.save()) {
    run(static_cast<uint8_t*>(nullptr));
  } else if (g.offset_dtype() == at::kByte) {
    run(o.offsets.mutable_data_ptr<uint8_t>());
  } else {
    run(o.offsets.mutable_data_ptr<int32_t>());
  }
}

}  // namespace

void launch_forward_cpu(const ForwardInputs& f, const ForwardOutputs& o) {
  if (is_mixed(f.input.scalar_type(), f.multiplier.scalar_type())) {
    AT_DISPATCH_REDUCED_FLOATING_TYPES(f.input.scalar_type(), "fused_post_pool_cpu_mixed", [&] {
      forward_typed<scalar_t, float>(f, o);
    });
    return;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, f.input.scalar_type(), "fused_post_pool_cpu", [&] {
    forward_typed<scalar_t, scalar_t>(f, o);
  });
}

namespace {

// ---- backward -----------------------------------------------------------------------------------------------

template <bool CL, int K, typename scalar_t, typename out_t, typename off_t>
void backward_kernels(const out_t* go, const scalar_t* sel, const off_t* off, const out_t* mflat,
                      int64_t m_stride, const PoolGeometry& g, double s1d, double s2d, scalar_t* gi,
                      at::opmath_type<scalar_t>* contrib, const scalar_t* bias = nullptr,
                      at::opmath_type<scalar_t>* contrib_bias = nullptr) {
  using acc_t = at::opmath_type<scalar_t>;
  using mid_t = mid_type<scalar_t, out_t>;
  const acc_t s1 = static_cast<acc_t>(s1d), s2 = static_cast<acc_t>(s2d);
  const bool has_bias = bias != nullptr;
  // Every input element is written exactly once (a gather), so no zero-fill and no write races.
  at::parallel_for(0, g.input_numel(), kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      int64_t n, c, d, h, w;
      input_coords<CL>(i, g, n, c, d, h, w);
      const acc_t m = static_cast<acc_t>(mflat[c * m_stride]);
      const acc_t b = has_bias ? static_cast<acc_t>(bias[c]) : acc_t(0);
      gi[i] = static_cast<scalar_t>(gather_grad<CL, K, K, K, out_t, scalar_t, acc_t, off_t, mid_t>(
          go, sel, off, g, n, c, d, h, w, m, s1, s2, b, has_bias));
    }
  });
  at::parallel_for(0, g.output_numel(), kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      int64_t n, c, od, oh, ow;
      output_coords<CL>(i, g, n, c, od, oh, ow);
      const acc_t m = static_cast<acc_t>(mflat[c * m_stride]);
      const bool valid = tap_in_bounds(g, od, oh, ow, static_cast<int64_t>(off[i]));
      const acc_t x = pre_activation(static_cast<acc_t>(sel[i]), has_bias ? static_cast<acc_t>(bias[c]) : acc_t(0),
                                     has_bias);
      const acc_t gs = acc_t(0) + static_cast<acc_t>(go[i]);
      contrib[i] = valid ? grad_multiplier_via<mid_t>(gs, x, m, s1, s2) : acc_t(0);
      if (has_bias) {
        acc_t cb = valid ? grad_input_via<mid_t>(gs, x, m, s1, s2) : acc_t(0);
        // Overlapping windows (general K only) need the mixed form's first-selector rule (post_pool.h).
        if constexpr (K == 0 && !std::is_same_v<mid_t, acc_t>) {
          if (valid) {
            cb = selected_bias_grad<CL, out_t, scalar_t, acc_t, off_t, mid_t>(go, sel, off, g, i, n, c, od, oh, ow, m,
                                                                              s1, s2, static_cast<acc_t>(bias[c]));
          }
        }
        contrib_bias[i] = cb;
      }
    }
  });
}

// 2x2x2 exact tiling: per-output window writes through the vectorized helpers; every element inside a window is
// written, elements past the last window are zeroed first.
template <typename scalar_t, typename out_t>
void backward_2x2x2(const out_t* go, const scalar_t* sel, const uint8_t* off, const out_t* mflat,
                    int64_t m_stride, const PoolGeometry& g, double s1d, double s2d, scalar_t* gi,
                    at::opmath_type<scalar_t>* contrib) {
  using acc_t = at::opmath_type<scalar_t>;
  const acc_t s1 = static_cast<acc_t>(s1d), s2 = static_cast<acc_t>(s2d);
  const Strides st = input_strides(g);
  if (!g.channels_last) {
    const int64_t rows = g.N * g.C * g.OD * g.OH;
    at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / g.OW), [&](int64_t begin, int64_t end) {
      Staging<scalar_t> stage;
      for (int64_t r = begin; r < end; ++r) {
        int64_t nc, od, oh;
        row_coords(r, g, nc, od, oh);
        const auto gx =
            stage.out(Quad<scalar_t>{gi + nc * st.c + (2 * od) * st.d + (2 * oh) * st.h, st.h, st.d}, 2 * g.OW);
        const int64_t o = r * g.OW;
        const acc_t m = static_cast<acc_t>(mflat[(nc % g.C) * m_stride]);
        if constexpr (kBf16Mid<scalar_t, out_t>) {
          simd::row_2x2x2_backward_bf16_mid(staged_in(stage, go + o, g.OW), stage.in(sel + o, g.OW), off + o, g.OW,
                                            m, s1, s2, gx.line(0, 0), gx.line(0, 1), gx.line(1, 0), gx.line(1, 1),
                                            contrib + o);
        } else {
          simd::row_2x2x2_backward(staged_in(stage, go + o, g.OW), stage.in(sel + o, g.OW), off + o, g.OW, m, s1,
                                   s2, gx.line(0, 0), gx.line(0, 1), gx.line(1, 0), gx.line(1, 1), contrib + o);
        }
        stage.store();
      }
    });
    return;
  }
  std::vector<acc_t> m(g.C);
  for (int64_t c = 0; c < g.C; ++c) m[c] = static_cast<acc_t>(mflat[c * m_stride]);
  const int64_t positions = g.N * g.OD * g.OH * g.OW;
  at::parallel_for(0, positions, std::max<int64_t>(1, kGrain / g.C), [&](int64_t begin, int64_t end) {
    Staging<scalar_t> stage;
    std::vector<acc_t> scratch(g.C);
    for (int64_t pos = begin; pos < end; ++pos) {
      int64_t n, od, oh, ow;
      position_coords(pos, g, n, od, oh, ow);
      // A window's taps w and w + 1 are adjacent runs of C channels, so each of its (d, h) lines is 2 * C long.
      const auto gx = stage.out(
          Quad<scalar_t>{gi + n * st.n + (2 * od) * st.d + (2 * oh) * st.h + (2 * ow) * st.w, st.h, st.d}, 2 * g.C);
      acc_t* taps[8];
      for (int t = 0; t < 8; ++t) taps[t] = gx.line(t >> 2, (t >> 1) & 1) + (t & 1) * g.C;
      const int64_t o = pos * g.C;
      if constexpr (kBf16Mid<scalar_t, out_t>) {
        simd::channels_2x2x2_backward_bf16_mid(staged_in(stage, go + o, g.C), stage.in(sel + o, g.C), off + o,
                                               m.data(), g.C, s1, s2, taps, contrib + o, scratch.data());
      } else {
        simd::channels_2x2x2_backward(staged_in(stage, go + o, g.C), stage.in(sel + o, g.C), off + o, m.data(), g.C,
                                      s1, s2, taps, contrib + o, scratch.data());
      }
      stage.store();
    }
  });
}

template <typename scalar_t, typename out_t>
void backward_typed(const BackwardInputs& b, const at::Tensor& grad_input, const GradPartials& parts) {
  const PoolGeometry& g = b.g;
  const bool channels_last = b.format == at::MemoryFormat::ChannelsLast3d;
  using acc_t = at::opmath_type<scalar_t>;
  auto run = [&](const auto* off_ptr) {
    const auto args = std::make_tuple(b.grad_output.const_data_ptr<out_t>(), b.selected.const_data_ptr<scalar_t>(),
                                      off_ptr, b.multiplier_flat.const_data_ptr<out_t>(),
                                      b.multiplier_flat.numel() == 1 ? int64_t(0) : int64_t(1));
    auto* gi = grad_input.mutable_data_ptr<scalar_t>();
    auto* ct = parts.multiplier.mutable_data_ptr<acc_t>();
    const scalar_t* bp = b.bias_flat.defined() ? b.bias_flat.const_data_ptr<scalar_t>() : nullptr;
    acc_t* cb = parts.bias.defined() ? parts.bias.mutable_data_ptr<acc_t>() : nullptr;
    const double s1 = b.s1, s2 = b.s2;
    const bool k2 = g.exact_tiling && g.kd == 2 && g.kh == 2 && g.kw == 2;
    // float16's mixed form takes the scalar path (kSimd).
    if constexpr (std::is_same_v<std::remove_cv_t<std::remove_pointer_t<decltype(off_ptr)>>, uint8_t> &&
                  kSimd<scalar_t, out_t>) {
      if (bp == nullptr && k2) {
        if (g.OD * 2 != g.D || g.OH * 2 != g.H || g.OW * 2 != g.W) grad_input.zero_();
        std::apply([&](auto... a) { backward_2x2x2<scalar_t, out_t>(a..., g, s1, s2, gi, ct); }, args);
        return;
      }
    }
    std::apply([&](auto... a) {
      if (channels_last) {
        k2 ? backward_kernels<true, 2>(a..., g, s1, s2, gi, ct, bp, cb)
           : backward_kernels<true, 0>(a..., g, s1, s2, gi, ct, bp, cb);
      } else {
        k2 ? backward_kernels<false, 2>(a..., g, s1, s2, gi, ct, bp, cb)
           : backward_kernels<false, 0>(a..., g, s1, s2, gi, ct, bp, cb);
      }
    }, args);
  };
  if (b.offsets.scalar_type() == at::kByte) {
    run(b.offsets.const_data_ptr<uint8_t>());
  } else {
    run(b.offsets.const_data_ptr<int32_t>());
  }
}

}  // namespace

ParamGrads launch_backward_cpu(const BackwardInputs& b, const at::Tensor& grad_input) {
  const GradPartials parts = alloc_grad_partials(b);
  if (is_mixed(b.selected.scalar_type(), b.multiplier_flat.scalar_type())) {
    AT_DISPATCH_REDUCED_FLOATING_TYPES(b.selected.scalar_type(), "fused_post_pool_bwd_cpu_mixed", [&] {
      backward_typed<scalar_t, float>(b, grad_input, parts);
    });
  } else {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, b.grad_output.scalar_type(), "fused_post_pool_bwd_cpu",
                                    [&] { backward_typed<scalar_t, scalar_t>(b, grad_input, parts); });
  }
  return reduce_grad_partials(parts, b);
}

}  // namespace post_pool
}  // namespace fused
