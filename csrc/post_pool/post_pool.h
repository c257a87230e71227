// Shared by the CPU and CUDA kernels of the post_pool ops: the pool geometry, the argument checks that both devices
// run, and the walk over pool windows (host+device).
#pragma once

#include "common/arguments.h"
#include "common/epilogue.h"

#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <c10/macros/Macros.h>
#include <c10/util/ArrayRef.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <limits>
#include <type_traits>

namespace fused {
namespace post_pool {

// Everything a kernel needs to walk the pool windows. Sizes are int64 so that offsets never overflow.
struct PoolGeometry {
  int64_t N, C, D, H, W;     // input
  int64_t OD, OH, OW;        // output
  int64_t kd, kh, kw;        // window taps
  int64_t sd, sh, sw;        // stride
  int64_t pd, ph, pw;        // padding (-inf outside the input)
  int64_t dd, dh, dw;        // dilation
  bool channels_last;        // kernels read/write NDHWC order; otherwise NCDHW
  // Every window lies inside the input with k == stride, pad 0, dilation 1: no bounds checks, each input
  // element belongs to at most one window.
  bool exact_tiling;

  C10_HOST_DEVICE int64_t window_volume() const { return kd * kh * kw; }
  C10_HOST_DEVICE int64_t output_numel() const { return N * C * OD * OH * OW; }
  C10_HOST_DEVICE int64_t input_numel() const { return N * C * D * H * W; }
  C10_HOST_DEVICE bool empty() const { return N == 0 || C == 0; }
  // Offsets fit one byte unless the window has more than 256 taps.
  at::ScalarType offset_dtype() const { return window_volume() <= 256 ? at::kByte : at::kInt; }
};

// Validates everything the forward ops accept and computes the geometry; raises c10::Error subclasses that
// surface in Python as TypeError / ValueError / RuntimeError with a message naming the problem. `op` prefixes
// the message. `stride` may be empty (means kernel_size).
PoolGeometry check_post_pool_args(
    const char* op,
    const at::Tensor& input,
    const at::Tensor& multiplier,
    at::IntArrayRef kernel_size,
    at::IntArrayRef stride,
    at::IntArrayRef padding,
    at::IntArrayRef dilation,
    bool ceil_mode);

// Same checks for a tensor that does not exist yet (a convolution's output that a fused op never writes), given
// its sizes, dtype, device and the layout the kernels will use.
PoolGeometry check_post_pool_sizes(const char* op, at::IntArrayRef sizes, at::ScalarType dtype, at::Device device,
                                   const at::Tensor& multiplier, at::IntArrayRef kernel_size, at::IntArrayRef stride,
                                   at::IntArrayRef padding, at::IntArrayRef dilation, bool ceil_mode,
                                   bool channels_last);

// The saved tensors a pooled backward starts from: grad_output, selected and offsets 5-D with one shape,
// grad_output and selected of one dtype, all three on one device; raises ValueError / TypeError prefixed by `op`.
void check_saved_pooled(const char* op, const at::Tensor& grad_output, const at::Tensor& selected,
                        const at::Tensor& offsets);

// Same, for the backward op, whose geometry comes from the saved forward outputs.
PoolGeometry check_post_pool_backward_args(
    const at::Tensor& grad_output,
    const at::Tensor& selected,
    const at::Tensor& offsets,
    const at::Tensor& multiplier,
    at::IntArrayRef input_size,
    at::IntArrayRef kernel_size,
    at::IntArrayRef stride,
    at::IntArrayRef padding,
    at::IntArrayRef dilation,
    bool channels_last);

// Mixed precision (torch.autocast's chain): a float16/bfloat16 input with a float32 multiplier. The output (and
// grad_output) take the multiplier's dtype; selected, grad_input and a bias keep the input's; the first
// LeakyReLU is rounded to the input's dtype (epilogue.h, epilogue_via). Every other pair of dtypes must match.
inline bool is_mixed(at::ScalarType input, at::ScalarType multiplier) {
  return (input == at::kHalf || input == at::kBFloat16) && multiplier == at::kFloat;
}
// The output's dtype for an input and multiplier that passed the checks.
inline at::ScalarType output_dtype(at::ScalarType input, at::ScalarType multiplier) {
  return is_mixed(input, multiplier) ? multiplier : input;
}

// The kernels' types: scalar_t the input's (selected, grad_input, a bias), out_t the output's (the multiplier,
// grad_output): scalar_t, or float in the mixed form, whose first LeakyReLU is rounded through scalar_t (mid_t,
// epilogue_via); mid_t = acc_t (no rounding) when the types match.
template <typename scalar_t, typename out_t>
using mid_type = std::conditional_t<std::is_same_v<scalar_t, out_t>, at::opmath_type<scalar_t>, scalar_t>;

// The memory format the output takes: the one max_pool3d would give for this input.
at::MemoryFormat output_memory_format(const at::Tensor& input);

// Multiplier flattened to 1 or C contiguous elements.
at::Tensor flat_multiplier(const at::Tensor& multiplier);

// What both forward launchers start from: checked geometry, the input in the layout the kernels read (no copy
// for contiguous or channels_last_3d inputs), the flattened multiplier, and the two slopes.
struct ForwardInputs {
  PoolGeometry g;
  at::MemoryFormat format;
  at::Tensor input;
  at::Tensor multiplier;
  at::Tensor bias;  // undefined unless the op is a post_pool_bias one; else C contiguous elements
  double s1, s2;
};
ForwardInputs prepare_forward(const char* op, const at::Tensor& input, const at::Tensor& multiplier,
                              at::IntArrayRef kernel_size, at::IntArrayRef stride, at::IntArrayRef padding,
                              at::IntArrayRef dilation, bool ceil_mode, double negative_slope,
                              std::optional<double> negative_slope2,
                              const std::optional<at::Tensor>& bias = std::nullopt);

// The slopes as eager leaky_relu accepts them: for a float32, bfloat16 or float16 input, a finite slope beyond
// float's range raises RuntimeError (eager's words); float64 takes any slope. s2 may be absent (defaults to s1).
void check_slopes(const char* op, at::ScalarType dtype, double s1, std::optional<double> s2);

// The per-channel bias of the post_pool_bias ops: 1-D with C elements, the input's dtype and device.
void check_bias(const char* op, const at::Tensor& bias, int64_t C, at::ScalarType dtype, at::Device device);

// d(loss)/d(multiplier) in the multiplier's shape and dtype from per-output contributions.
at::Tensor reduce_grad_multiplier(const at::Tensor& contrib, const at::Tensor& multiplier);

C10_HOST_DEVICE inline int64_t div_up_nonneg(int64_t a, int64_t b) {
  return a <= 0 ? 0 : (a + b - 1) / b;
}

// First tap index j with start + j*dil >= 0 (the tap max_pool3d starts from), and one past the last tap inside
// [0, size).
C10_HOST_DEVICE inline int64_t first_tap(int64_t start, int64_t dil) {
  return start < 0 ? div_up_nonneg(-start, dil) : 0;
}
C10_HOST_DEVICE inline int64_t end_tap(int64_t start, int64_t dil, int64_t k, int64_t size) {
  const int64_t e = div_up_nonneg(size - start, dil);
  return e < k ? e : k;
}

// The in-range taps of the window of output (od, oh, ow): tap j of a dim covers input start + j*dilation.
struct TapRange {
  int64_t d0, h0, w0;     // window start (may lie in the padding)
  int64_t jd0, jd1, jh0, jh1, jw0, jw1;  // [first, end) in-range taps per dim
  int64_t first_offset;   // offset max_pool3d reports when nothing beats -inf
};
C10_HOST_DEVICE inline TapRange tap_range(const PoolGeometry& g, int64_t od, int64_t oh, int64_t ow) {
  TapRange t;
  t.d0 = od * g.sd - g.pd;
  t.h0 = oh * g.sh - g.ph;
  t.w0 = ow * g.sw - g.pw;
  t.jd0 = first_tap(t.d0, g.dd);
  t.jd1 = end_tap(t.d0, g.dd, g.kd, g.D);
  t.jh0 = first_tap(t.h0, g.dh);
  t.jh1 = end_tap(t.h0, g.dh, g.kh, g.H);
  t.jw0 = first_tap(t.w0, g.dw);
  t.jw1 = end_tap(t.w0, g.dw, g.kw, g.W);
  t.first_offset = (t.jd0 * g.kh + t.jh0) * g.kw + t.jw0;
  return t;
}

// (outer, od, oh) of output row `r` = (outer*OD + od)*OH + oh, where outer is n*C + c for NCDHW rows or n for
// channels-last rows.
C10_HOST_DEVICE inline void row_coords(int64_t r, const PoolGeometry& g, int64_t& outer, int64_t& od, int64_t& oh) {
  oh = r % g.OH;
  r /= g.OH;
  od = r % g.OD;
  outer = r / g.OD;
}

// (n, od, oh, ow) of pooled position `pos` = ((n*OD + od)*OH + oh)*OW + ow.
C10_HOST_DEVICE inline void position_coords(int64_t pos, const PoolGeometry& g, int64_t& n, int64_t& od,
                                            int64_t& oh, int64_t& ow) {
  ow = pos % g.OW;
  pos /= g.OW;
  oh = pos % g.OH;
  pos /= g.OH;
  od = pos % g.OD;
  n = pos / g.OD;
}

// Result of scanning one pool window.
template <typename scalar_t, typename acc_t>
struct WindowMax {
  acc_t value;      // max of the epilogue over the window (-inf if no tap is inside the input)
  scalar_t input;   // raw input at the chosen tap (0 if none)
  int32_t offset;   // (jd*kh + jh)*kw + jw of the chosen tap
};

// Scans one window. `plane` points at element (n, c, 0, 0, 0); sD/sH/sW are element strides. KD/KH/KW > 0 fix
// the window at compile time and promise every tap is inside the input (exact tiling); 0 means runtime sizes
// with bounds checks. mid_t: the mixed-precision rounding (epilogue_via).
template <int KD, int KH, int KW, typename scalar_t, typename acc_t, typename mid_t = acc_t>
C10_HOST_DEVICE inline WindowMax<scalar_t, acc_t> scan_window(
    const scalar_t* __restrict__ plane,
    int64_t sD, int64_t sH, int64_t sW,
    int64_t od, int64_t oh, int64_t ow,
    const PoolGeometry& g,
    acc_t m, acc_t s1, acc_t s2, acc_t b = acc_t(0), bool has_bias = false) {
  WindowMax<scalar_t, acc_t> r;
  r.value = -std::numeric_limits<acc_t>::infinity();
  r.input = scalar_t(0);
  // The selection starts at the window's first in-range tap with the running max at -inf, as max_pool3d's index
  // does: when every tap's value is -inf (finite inputs can overflow to it), nothing replaces it, and the saved
  // input must be that tap's, or the backward would differentiate at a value no tap holds.
  if constexpr (KD > 0) {
    const scalar_t* p = plane + (od * KD) * sD + (oh * KH) * sH + (ow * KW) * sW;
    r.offset = 0;
    r.input = p[0];
#pragma unroll
    for (int jd = 0; jd < KD; ++jd) {
#pragma unroll
      for (int jh = 0; jh < KH; ++jh) {
#pragma unroll
        for (int jw = 0; jw < KW; ++jw) {
          const scalar_t xv = p[jd * sD + jh * sH + jw * sW];
          const acc_t v = epilogue_via<mid_t>(pre_activation(static_cast<acc_t>(xv), b, has_bias), m, s1, s2);
          // Selects, not a branch: on random data the branch mispredicts about half the time.
          const bool take = takes_max(v, r.value);
          r.value = take ? v : r.value;
          r.input = take ? xv : r.input;
          r.offset = take ? (jd * KH + jh) * KW + jw : r.offset;
        }
      }
    }
  } else {
    const TapRange t = tap_range(g, od, oh, ow);
    // max_pool3d reports the first in-range tap even when the window is all padding (then no input is saved).
    r.offset = static_cast<int32_t>(t.first_offset);
    if (t.jd0 < t.jd1 && t.jh0 < t.jh1 && t.jw0 < t.jw1) {
      r.input = plane[(t.d0 + t.jd0 * g.dd) * sD + (t.h0 + t.jh0 * g.dh) * sH + (t.w0 + t.jw0 * g.dw) * sW];
    }
    for (int64_t jd = t.jd0; jd < t.jd1; ++jd) {
      const scalar_t* pd_ = plane + (t.d0 + jd * g.dd) * sD;
      for (int64_t jh = t.jh0; jh < t.jh1; ++jh) {
        const scalar_t* ph_ = pd_ + (t.h0 + jh * g.dh) * sH;
        for (int64_t jw = t.jw0; jw < t.jw1; ++jw) {
          const scalar_t xv = ph_[(t.w0 + jw * g.dw) * sW];
          const acc_t v = epilogue_via<mid_t>(pre_activation(static_cast<acc_t>(xv), b, has_bias), m, s1, s2);
          const bool take = takes_max(v, r.value);
          r.value = take ? v : r.value;
          r.input = take ? xv : r.input;
          r.offset = take ? static_cast<int32_t>((jd * g.kh + jh) * g.kw + jw) : r.offset;
        }
      }
    }
  }
  return r;
}

// Element strides of the input for the geometry's layout.
struct Strides {
  int64_t n, c, d, h, w;
};
inline Strides input_strides(const PoolGeometry& g) {
  if (g.channels_last) {
    return {g.D * g.H * g.W * g.C, 1, g.H * g.W * g.C, g.W * g.C, g.C};
  }
  return {g.C * g.D * g.H * g.W, g.D * g.H * g.W, g.H * g.W, g.W, 1};
}

// Position (n, c, od, oh, ow) of output element `i` in memory order.
template <bool CL>
C10_HOST_DEVICE inline void output_coords(int64_t i, const PoolGeometry& g,
                                          int64_t& n, int64_t& c, int64_t& od, int64_t& oh, int64_t& ow) {
  if constexpr (CL) {
    c = i % g.C; i /= g.C;
    ow = i % g.OW; i /= g.OW;
    oh = i % g.OH; i /= g.OH;
    od = i % g.OD; n = i / g.OD;
  } else {
    ow = i % g.OW; i /= g.OW;
    oh = i % g.OH; i /= g.OH;
    od = i % g.OD; i /= g.OD;
    c = i % g.C; n = i / g.C;
  }
}

// Same for input element `i`.
template <bool CL>
C10_HOST_DEVICE inline void input_coords(int64_t i, const PoolGeometry& g,
                                         int64_t& n, int64_t& c, int64_t& d, int64_t& h, int64_t& w) {
  if constexpr (CL) {
    c = i % g.C; i /= g.C;
    w = i % g.W; i /= g.W;
    h = i % g.H; i /= g.H;
    d = i % g.D; n = i / g.D;
  } else {
    w = i % g.W; i /= g.W;
    h = i % g.H; i /= g.H;
    d = i % g.D; i /= g.D;
    c = i % g.C; n = i / g.C;
  }
}

template <bool CL>
C10_HOST_DEVICE inline int64_t output_index(const PoolGeometry& g, int64_t n, int64_t c, int64_t od, int64_t oh,
                                            int64_t ow) {
  if constexpr (CL) {
    return (((n * g.OD + od) * g.OH + oh) * g.OW + ow) * g.C + c;
  } else {
    return (((n * g.C + c) * g.OD + od) * g.OH + oh) * g.OW + ow;
  }
}

// The outputs o in [lo, hi] (empty when lo > hi) whose window covers input index x of one dim: those with
// o*s - p <= x <= o*s - p + (k-1)*dil, within [0, O).
struct OutputSpan {
  int64_t lo, hi;
};
C10_HOST_DEVICE inline OutputSpan covering_outputs(int64_t x, int64_t p, int64_t k, int64_t s, int64_t dil,
                                                   int64_t O) {
  const int64_t a = x + p - (k - 1) * dil;  // o*s >= a
  const int64_t lo = a > 0 ? (a + s - 1) / s : 0;
  const int64_t hi = (x + p) / s;           // x + p >= 0
  return {lo, hi < O - 1 ? hi : O - 1};
}

// Gradient reaching input element (n, c, d, h, w): sums grad_output over the outputs whose window selected it,
// in increasing output order (the order eager max_pool3d_backward accumulates in), then applies the chain rule
// once with the input value saved by the forward. KD/KH/KW > 0: exact tiling, one candidate window. go_t is the
// output's dtype (the input's, or float32 in the mixed form, whose mid_t rounding is grad_input_via's).
template <bool CL, int KD, int KH, int KW, typename go_t, typename scalar_t, typename acc_t, typename off_t,
          typename mid_t = acc_t>
C10_HOST_DEVICE inline acc_t gather_grad(
    const go_t* __restrict__ grad_out,
    const scalar_t* __restrict__ selected,
    const off_t* __restrict__ offsets,
    const PoolGeometry& g,
    int64_t n, int64_t c, int64_t d, int64_t h, int64_t w,
    acc_t m, acc_t s1, acc_t s2, acc_t b = acc_t(0), bool has_bias = false) {
  acc_t sum = acc_t(0);
  acc_t xsel = acc_t(0);
  bool hit = false;
  if constexpr (KD > 0) {
    const int64_t od = d / KD, oh = h / KH, ow = w / KW;
    if (od < g.OD && oh < g.OH && ow < g.OW) {
      const int64_t o = output_index<CL>(g, n, c, od, oh, ow);
      const int64_t want = ((d - od * KD) * KH + (h - oh * KH)) * KW + (w - ow * KW);
      if (static_cast<int64_t>(offsets[o]) == want) {
        sum = acc_t(0) + static_cast<acc_t>(grad_out[o]);  // as eager: accumulate into zeros (-0 -> +0)
        xsel = static_cast<acc_t>(selected[o]);
        hit = true;
      }
    }
  } else {
    // The outputs whose window covers (d, h, w), per dim an interval of output indices, visited in increasing
    // output order. The loops run over those intervals rather than over the window's taps, so the work per
    // element is bounded by the outputs, not by the kernel size (a kernel of 2**30 taps per dim is legal).
    const OutputSpan sd_ = covering_outputs(d, g.pd, g.kd, g.sd, g.dd, g.OD);
    const OutputSpan sh_ = covering_outputs(h, g.ph, g.kh, g.sh, g.dh, g.OH);
    const OutputSpan sw_ = covering_outputs(w, g.pw, g.kw, g.sw, g.dw, g.OW);
    for (int64_t od = sd_.lo; od <= sd_.hi; ++od) {
      const int64_t rd = d + g.pd - od * g.sd;
      if (rd % g.dd != 0) continue;
      const int64_t jd = rd / g.dd;
      for (int64_t oh = sh_.lo; oh <= sh_.hi; ++oh) {
        const int64_t rh = h + g.ph - oh * g.sh;
        if (rh % g.dh != 0) continue;
        const int64_t jh = rh / g.dh;
        for (int64_t ow = sw_.lo; ow <= sw_.hi; ++ow) {
          const int64_t rw = w + g.pw - ow * g.sw;
          if (rw % g.dw != 0) continue;
          const int64_t jw = rw / g.dw;
          const int64_t o = output_index<CL>(g, n, c, od, oh, ow);
          if (static_cast<int64_t>(offsets[o]) == (jd * g.kh + jh) * g.kw + jw) {
            sum += static_cast<acc_t>(grad_out[o]);
            xsel = static_cast<acc_t>(selected[o]);
            hit = true;
          }
        }
      }
    }
  }
  return hit ? grad_input_via<mid_t>(sum, pre_activation(xsel, b, has_bias), m, s1, s2) : acc_t(0);
}

// The input element (d, h, w) of tap `off` of the window of output (od, oh, ow); it may lie in the padding.
C10_HOST_DEVICE inline void tap_coords(const PoolGeometry& g, int64_t od, int64_t oh, int64_t ow, int64_t off,
                                       int64_t& d, int64_t& h, int64_t& w) {
  d = od * g.sd - g.pd + (off / (g.kw * g.kh)) * g.dd;
  h = oh * g.sh - g.ph + ((off / g.kw) % g.kh) * g.dh;
  w = ow * g.sw - g.pw + (off % g.kw) * g.dw;
}

// True when the tap recorded for an output lies inside the input (it does not for windows that are all padding,
// where max_pool3d still reports an index).
C10_HOST_DEVICE inline bool tap_in_bounds(const PoolGeometry& g, int64_t od, int64_t oh, int64_t ow, int64_t off) {
  int64_t d, h, w;
  tap_coords(g, od, oh, ow, off, d, h, w);
  return d >= 0 && d < g.D && h >= 0 && h < g.H && w >= 0 && w < g.W;
}

// Whether output (od, oh, ow) of plane (n, c), whose saved tap is input (d, h, w), is the first output (in
// gather_grad's order) whose saved tap is that input.
template <bool CL, typename off_t>
C10_HOST_DEVICE inline bool first_selector(const off_t* __restrict__ off, const PoolGeometry& g, int64_t n, int64_t c,
                                           int64_t od, int64_t oh, int64_t ow, int64_t d, int64_t h, int64_t w) {
  const OutputSpan sd_ = covering_outputs(d, g.pd, g.kd, g.sd, g.dd, g.OD);
  const OutputSpan sh_ = covering_outputs(h, g.ph, g.kh, g.sh, g.dh, g.OH);
  const OutputSpan sw_ = covering_outputs(w, g.pw, g.kw, g.sw, g.dw, g.OW);
  for (int64_t od2 = sd_.lo; od2 <= sd_.hi; ++od2) {
    const int64_t rd = d + g.pd - od2 * g.sd;
    if (rd % g.dd != 0) continue;
    for (int64_t oh2 = sh_.lo; oh2 <= sh_.hi; ++oh2) {
      const int64_t rh = h + g.ph - oh2 * g.sh;
      if (rh % g.dh != 0) continue;
      for (int64_t ow2 = sw_.lo; ow2 <= sw_.hi; ++ow2) {
        const int64_t rw = w + g.pw - ow2 * g.sw;
        if (rw % g.dw != 0) continue;
        if (od2 == od && oh2 == oh && ow2 == ow) return true;
        const int64_t tap = ((rd / g.dd) * g.kh + rh / g.dh) * g.kw + rw / g.dw;
        if (static_cast<int64_t>(off[output_index<CL>(g, n, c, od2, oh2, ow2)]) == tap) return false;
      }
    }
  }
  return true;
}

// The mixed form's bias-gradient contribution of output i = (n, c, od, oh, ow) of a general window, whose saved tap
// is inside the input. The mixed form rounds grad * multiplier to the input's dtype (grad_input_via), which is not
// linear: an input element that several overlapping windows selected has the bias gradient of its summed grads,
// not the sum of each output's. The first output that selected it takes that whole gradient (gather_grad's, before
// the cast to the input's dtype), the others none, so the sum over outputs is eager's.
template <bool CL, typename go_t, typename scalar_t, typename acc_t, typename off_t, typename mid_t>
C10_HOST_DEVICE inline acc_t selected_bias_grad(const go_t* __restrict__ go, const scalar_t* __restrict__ sel,
                                                const off_t* __restrict__ off, const PoolGeometry& g, int64_t i,
                                                int64_t n, int64_t c, int64_t od, int64_t oh, int64_t ow, acc_t m,
                                                acc_t s1, acc_t s2, acc_t b) {
  int64_t d, h, w;
  tap_coords(g, od, oh, ow, static_cast<int64_t>(off[i]), d, h, w);
  return first_selector<CL>(off, g, n, c, od, oh, ow, d, h, w)
             ? gather_grad<CL, 0, 0, 0, go_t, scalar_t, acc_t, off_t, mid_t>(go, sel, off, g, n, c, d, h, w, m, s1,
                                                                            s2, b, true)
             : acc_t(0);
}

}  // namespace post_pool
}  // namespace fused
