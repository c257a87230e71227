// What the ops' Autograd kernels share: typed handles to ops by name, whether a call needs a gradient, graph nodes
// on any torch version, and the Autograd kernel of an op whose results raise when differentiated (a backward op).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <initializer_list>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace fused {

// A typed handle to a registered op; callers keep it in a function-local static so that the name is looked up once.
template <typename Sig>
c10::TypedOperatorHandle<Sig> op_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

// Whether autograd records a call with these tensor arguments (null or undefined ones are absent optionals).
inline bool needs_grad(std::initializer_list<const at::Tensor*> ts) {
  if (!at::GradMode::is_enabled()) return false;
  for (const at::Tensor* t : ts) {
    if (t != nullptr && t->defined() && t->requires_grad()) return true;
  }
  return false;
}

// Graph nodes are held by std::shared_ptr on older torch and by c10::intrusive_ptr on newer.
template <typename N, typename... A>
auto make_node(A&&... a) {
  using Ptr = decltype(std::declval<torch::autograd::Edge>().function);
  if constexpr (std::is_same_v<Ptr, std::shared_ptr<torch::autograd::Node>>) {
    return std::make_shared<N>(std::forward<A>(a)...);
  } else {
    return c10::make_intrusive<N>(std::forward<A>(a)...);
  }
}

// For gradients computed while a graph is being built (create_graph=True, or a backward op called on tensors
// that require grad): gives each defined one in `grads` an Error node as grad_fn, whose edges lead to `inputs`,
// so that differentiating it raises `message` instead of treating it as a constant (silent zero second
// derivatives), and autograd.grad with respect to those inputs reaches the node instead of reporting them unused.
inline void raise_on_double_backward(std::string message, const torch::autograd::variable_list& inputs,
                                     const torch::autograd::variable_list& grads) {
  if (!at::GradMode::is_enabled()) return;
  bool any = false;
  for (const at::Tensor& t : inputs) any = any || (t.defined() && t.requires_grad());
  if (!any) return;
  auto node = make_node<torch::autograd::Error>(std::move(message), torch::autograd::collect_next_edges(inputs));
  for (const at::Tensor& g : grads) {
    if (g.defined()) torch::autograd::set_history(g, node);
  }
}

// The Autograd kernel of op `kName`, whose results are gradients of `kFamily`'s op and not differentiable
// themselves: the op runs below autograd, then its results raise "<kName>: double backward is not supported" when
// differentiated, their node's edges leading to the op's tensor arguments. Register `&call`.
template <const char* kName, const char* kFamily, typename Sig>
struct NotDifferentiable;

template <const char* kName, const char* kFamily, typename R, typename... A>
struct NotDifferentiable<kName, kFamily, R(A...)> {
  static R call(A... args) {
    static const auto op = op_handle<R(A...)>(kName);
    R result;
    {
      const c10::impl::ExcludeDispatchKeyGuard below(c10::autograd_dispatch_keyset);
      result = op.call(args...);
    }
    torch::autograd::variable_list inputs;
    (add_tensor(inputs, args), ...);
    torch::autograd::variable_list outputs;
    if constexpr (std::is_same_v<R, at::Tensor>) {
      outputs.push_back(result);
    } else {
      std::apply([&](const auto&... r) { (outputs.push_back(r), ...); }, result);
    }
    raise_on_double_backward(std::string(kName) + ": double backward is not supported (gradients of " + kFamily +
                                 "'s gradients)",
                             inputs, outputs);
    return result;
  }

 private:
  template <typename T>
  static void add_tensor(torch::autograd::variable_list& list, const T& arg) {
    if constexpr (std::is_same_v<std::decay_t<T>, at::Tensor>) list.push_back(arg);
  }
};

}  // namespace fused
