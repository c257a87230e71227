// The chain's per-element arithmetic (LeakyReLU -> x multiplier -> LeakyReLU, max_pool3d's update rule, and their
// gradients), identical on host and device and shared by every kernel of both ops.
#pragma once

#include <c10/macros/Macros.h>

#include <type_traits>

namespace fused {

// Written exactly as ATen's leaky_relu (`x > 0 ? x : x * slope`) and mul so that float32 results are bit-equal
// to the eager composite; no additions, so no FMA contraction can change a result.
template <typename acc_t>
C10_HOST_DEVICE inline acc_t leaky(acc_t v, acc_t slope) {
  // Both sides computed, then a select: a branch on the sign of random data mispredicts half the time.
  const acc_t scaled = v * slope;
  return v > acc_t(0) ? v : scaled;
}

// The value the first LeakyReLU sees: the input, plus the per-channel bias for the post_pool_bias ops. The add
// is skipped (not "+ 0") without a bias, since -0 + 0 would turn -0 into +0.
template <typename acc_t>
C10_HOST_DEVICE inline acc_t pre_activation(acc_t x, acc_t b, bool has_bias) {
  return has_bias ? x + b : x;
}

// Mixed precision (torch.autocast): a float16/bfloat16 input with a float32 multiplier. Eager autocast rounds the
// first LeakyReLU's result to the input's dtype (mid_t) and runs the multiply, the second LeakyReLU and the pool
// in the promoted dtype; its backward rounds the first LeakyReLU's gradient (grad * multiplier) to mid_t the same
// way. mid_t = acc_t (every same-dtype op) rounds nothing.
template <typename mid_t, typename acc_t>
C10_HOST_DEVICE inline acc_t round_through(acc_t v) {
  if constexpr (std::is_same_v<mid_t, acc_t>) {
    return v;
  } else {
    return static_cast<acc_t>(static_cast<mid_t>(v));
  }
}

template <typename mid_t, typename acc_t>
C10_HOST_DEVICE inline acc_t epilogue_via(acc_t x, acc_t m, acc_t s1, acc_t s2) {
  return leaky(round_through<mid_t>(leaky(x, s1)) * m, s2);
}

template <typename acc_t>
C10_HOST_DEVICE inline acc_t epilogue(acc_t x, acc_t m, acc_t s1, acc_t s2) {
  return epilogue_via<acc_t>(x, m, s1, s2);
}

// max_pool3d's update rule: a strictly larger value or any NaN replaces the running max, so ties keep the first
// tap in window order and the last NaN wins (as ATen's CPU and CUDA kernels do).
template <typename acc_t>
C10_HOST_DEVICE inline bool takes_max(acc_t v, acc_t best) {
  return v > best || v != v;
}

// Gradient of one output w.r.t. the input element it selected, following eager autograd's order of operations
// (leaky_relu_backward, mul backward, leaky_relu_backward) so float32 gradients match bit for bit. mid_t: as
// epilogue_via (the mixed form's product gradient is rounded to the input's dtype before the first LeakyReLU's
// backward, as autograd casts a gradient to its input's dtype).
template <typename mid_t, typename acc_t>
C10_HOST_DEVICE inline acc_t grad_input_via(acc_t g, acc_t x, acc_t m, acc_t s1, acc_t s2) {
  const acc_t y1 = round_through<mid_t>(leaky(x, s1));
  const acc_t y2 = y1 * m;
  const acc_t gy2 = y2 > acc_t(0) ? g : g * s2;
  const acc_t gy1 = round_through<mid_t>(gy2 * m);
  return x > acc_t(0) ? gy1 : gy1 * s1;
}

template <typename acc_t>
C10_HOST_DEVICE inline acc_t grad_input_of(acc_t g, acc_t x, acc_t m, acc_t s1, acc_t s2) {
  return grad_input_via<acc_t>(g, x, m, s1, s2);
}

// Contribution of one output to d(loss)/d(multiplier): grad of the product times the other factor.
template <typename mid_t, typename acc_t>
C10_HOST_DEVICE inline acc_t grad_multiplier_via(acc_t g, acc_t x, acc_t m, acc_t s1, acc_t s2) {
  const acc_t y1 = round_through<mid_t>(leaky(x, s1));
  const acc_t y2 = y1 * m;
  const acc_t gy2 = y2 > acc_t(0) ? g : g * s2;
  return gy2 * y1;
}

template <typename acc_t>
C10_HOST_DEVICE inline acc_t grad_multiplier_of(acc_t g, acc_t x, acc_t m, acc_t s1, acc_t s2) {
  return grad_multiplier_via<acc_t>(g, x, m, s1, s2);
}

}  // namespace fused
