// What the ops' Autograd kernels share: typed handles to ops by name, graph nodes on any torch version, and
// gradients that raise when differentiated again.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <memory>
#include <string>
#include <type_traits>
#include <utility>

namespace fused {

// A typed handle to a registered op; callers keep it in a function-local static so that the name is looked up once.
template <typename Sig>
c10::TypedOperatorHandle<Sig> op_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
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

}  // namespace fused
