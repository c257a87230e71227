"""Python face of the fused ops: typed wrappers, fake (meta) impls and autograd.

Ops (schemas in csrc/ops.cpp):
  fused::post_pool               inference forward
  fused::post_pool_with_offsets  training forward: also the selected input value and window offset per output
  fused::post_pool_backward      gradients of input and multiplier from those pooled-size tensors
  fused::post_pool_bias*         the same three with a per-channel bias added to the input first (the Inductor
                                 pass can fold a convolution's bias into them)
Private ops (no fake impl, not for graphs):
  fused::_post_pool_backward_tuned  the CUDA backward with launch choices other than the shipped ones (the sweep
                                    benchmarks/post_pool/backward_sweep.py and the tests comparing the forms)
  fused::_set_cpu_huge_pages        whether the CPU kernels advise huge pages (the settings module calls it)

Autograd: post_pool_with_offsets has a registered backward (post_pool_backward). post_pool's Autograd kernel
routes calls that need gradients to post_pool_with_offsets, so training keeps only pooled-size tensors alive
(never the full-resolution input) and compiled graphs still show fused.post_pool in inference and export.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from . import common

IntOr3 = int | Sequence[int]
_ops = torch.ops.fused


def post_pool(
    input: Tensor,
    multiplier: Tensor,
    negative_slope: float = 0.01,
    kernel_size: IntOr3 = 2,
    stride: IntOr3 | None = None,
    padding: IntOr3 = 0,
    dilation: IntOr3 = 1,
    ceil_mode: bool = False,
    negative_slope2: float | None = None,
) -> Tensor:
    """``max_pool3d(leaky_relu(leaky_relu(input, s1) * multiplier, s2))`` in one pass.

    Args:
        input: (N, C, D, H, W) tensor, float16/bfloat16/float32/float64, CPU or CUDA. Contiguous and
            channels_last_3d inputs are read in place; other strides are copied first.
        multiplier: same dtype and device; one element (any rank) or C elements on the channel dim,
            e.g. (C, 1, 1, 1) or (1, C, 1, 1, 1).
        negative_slope: slope s1 of the first LeakyReLU (any float).
        kernel_size, stride, padding, dilation, ceil_mode: as ``torch.nn.functional.max_pool3d``
            (stride None means kernel_size).
        negative_slope2: slope s2 of the second LeakyReLU; defaults to ``negative_slope``.

    Returns:
        The pooled tensor, in the memory format max_pool3d would give. Arithmetic is float32 (float64 for
        double inputs) rounded once to the input dtype; float32 results equal the eager composite bit for bit.
        Differentiable in input and multiplier.
    """
    op = "fused::post_pool"
    # None reaches the kernel as an undefined tensor, which would fail later with an unrelated message.
    if not (isinstance(input, Tensor) and isinstance(multiplier, Tensor)):
        name, t = ("input", input) if not isinstance(input, Tensor) else ("multiplier", multiplier)
        raise TypeError(f"{op}: {name} must be a Tensor, got {'None' if t is None else type(t).__name__}")
    return _ops.post_pool(
        input, multiplier, float(negative_slope), common.expand3(f"{op}: kernel_size", kernel_size),
        [] if stride is None else common.expand3(f"{op}: stride", stride, allow_empty_as=[]),
        common.expand3(f"{op}: padding", padding), common.expand3(f"{op}: dilation", dilation),
        bool(ceil_mode), None if negative_slope2 is None else float(negative_slope2),
    )


def reference_post_pool(
    input: Tensor,
    multiplier: Tensor,
    negative_slope: float = 0.01,
    kernel_size: IntOr3 = 2,
    stride: IntOr3 | None = None,
    padding: IntOr3 = 0,
    dilation: IntOr3 = 1,
    ceil_mode: bool = False,
    negative_slope2: float | None = None,
) -> Tensor:
    """The eager composite fused.post_pool computes, op by op: the ground truth for tests and benchmarks."""
    s2 = negative_slope if negative_slope2 is None else negative_slope2
    y = F.leaky_relu(F.leaky_relu(input, negative_slope) * multiplier, s2)
    return F.max_pool3d(y, kernel_size, stride, padding, dilation, ceil_mode)


# ---- fake impls ---------------------------------------------------------------------------------------------

@torch.library.register_fake("fused::post_pool")
def _post_pool_fake(input, multiplier, negative_slope, kernel_size, stride=(), padding=0, dilation=1,
                    ceil_mode=False, negative_slope2=None):
    shape, fmt = common.output_shape("fused::post_pool", input, multiplier, kernel_size, stride, padding,
                                        dilation, ceil_mode)
    common.check_slopes("fused::post_pool", input.dtype, negative_slope, negative_slope2)
    return torch.empty(shape, dtype=input.dtype, device=input.device, memory_format=fmt)


@torch.library.register_fake("fused::post_pool_with_offsets")
def _post_pool_with_offsets_fake(input, multiplier, negative_slope, kernel_size, stride=(), padding=0, dilation=1,
                                 ceil_mode=False, negative_slope2=None):
    shape, fmt = common.output_shape("fused::post_pool_with_offsets", input, multiplier, kernel_size, stride,
                                        padding, dilation, ceil_mode)
    common.check_slopes("fused::post_pool_with_offsets", input.dtype, negative_slope, negative_slope2)
    out = torch.empty(shape, dtype=input.dtype, device=input.device, memory_format=fmt)
    selected = torch.empty(shape, dtype=input.dtype, device=input.device, memory_format=fmt)
    offsets = torch.empty(shape, dtype=common.offset_dtype(kernel_size), device=input.device, memory_format=fmt)
    return out, selected, offsets


@torch.library.register_fake("fused::post_pool_backward")
def _post_pool_backward_fake(grad_output, selected, offsets, multiplier, negative_slope, negative_slope2,
                             input_size, kernel_size, stride, padding, dilation, channels_last):
    op = "fused::post_pool_backward"
    common.check_tensors(op, input_size, grad_output.dtype, grad_output.device, multiplier)
    common.pool_params(op, kernel_size, stride, padding, dilation)
    common.check_slopes(op, grad_output.dtype, negative_slope, negative_slope2)
    torch._check_value(
        grad_output.dim() == 5 and selected.shape == grad_output.shape and offsets.shape == grad_output.shape,
        lambda: f"{op}: grad_output, selected and offsets must be 5-D with equal shapes",
    )
    fmt = torch.channels_last_3d if channels_last else torch.contiguous_format
    grad_input = torch.empty(input_size, dtype=grad_output.dtype, device=grad_output.device, memory_format=fmt)
    grad_multiplier = torch.empty(multiplier.shape, dtype=multiplier.dtype, device=multiplier.device)
    return grad_input, grad_multiplier


@torch.library.register_fake("fused::post_pool_bias")
def _post_pool_bias_fake(input, bias, multiplier, negative_slope, kernel_size, stride=(), padding=0, dilation=1,
                         ceil_mode=False, negative_slope2=None):
    shape, fmt = common.output_shape("fused::post_pool_bias", input, multiplier, kernel_size, stride, padding,
                                        dilation, ceil_mode)
    common.check_slopes("fused::post_pool_bias", input.dtype, negative_slope, negative_slope2)
    common.check_bias("fused::post_pool_bias", bias, input.shape[1], input.dtype, input.device)
    return torch.empty(shape, dtype=input.dtype, device=input.device, memory_format=fmt)


@torch.library.register_fake("fused::post_pool_bias_with_offsets")
def _post_pool_bias_with_offsets_fake(input, bias, multiplier, negative_slope, kernel_size, stride=(), padding=0,
                                      dilation=1, ceil_mode=False, negative_slope2=None):
    common.check_bias("fused::post_pool_bias_with_offsets", bias, input.shape[1], input.dtype, input.device)
    return _post_pool_with_offsets_fake(input, multiplier, negative_slope, kernel_size, stride, padding, dilation,
                                        ceil_mode, negative_slope2)


@torch.library.register_fake("fused::post_pool_bias_backward")
def _post_pool_bias_backward_fake(grad_output, selected, offsets, bias, multiplier, negative_slope, negative_slope2,
                                  input_size, kernel_size, stride, padding, dilation, channels_last):
    common.check_bias("fused::post_pool_bias_backward", bias, input_size[1], grad_output.dtype,
                         grad_output.device)
    grad_input, grad_multiplier = _post_pool_backward_fake(
        grad_output, selected, offsets, multiplier, negative_slope, negative_slope2, input_size, kernel_size, stride,
        padding, dilation, channels_last)
    return grad_input, torch.empty(bias.shape, dtype=bias.dtype, device=bias.device), grad_multiplier


# ---- autograd -----------------------------------------------------------------------------------------------

def _setup_context(ctx, inputs, output):
    input, multiplier, negative_slope, kernel_size, stride, padding, dilation, _ceil_mode, negative_slope2 = inputs
    _out, selected, offsets = output
    ctx.mark_non_differentiable(selected, offsets)
    ctx.save_for_backward(selected, offsets, multiplier)
    k, s, p, d = common.pool_params("fused::post_pool", kernel_size, stride, padding, dilation)
    ctx.pool = (k, s, p, d)
    ctx.slopes = (negative_slope, negative_slope2)
    ctx.input_size = list(input.shape)
    ctx.channels_last = common.output_memory_format(input) == torch.channels_last_3d


def _backward(ctx, grad_out, _grad_selected, _grad_offsets):
    selected, offsets, multiplier = ctx.saved_tensors
    k, s, p, d = ctx.pool
    grad_input, grad_multiplier = _ops.post_pool_backward(
        grad_out, selected, offsets, multiplier, ctx.slopes[0], ctx.slopes[1], ctx.input_size, k, s, p, d,
        ctx.channels_last,
    )
    return (
        grad_input if ctx.needs_input_grad[0] else None,
        grad_multiplier if ctx.needs_input_grad[1] else None,
        None, None, None, None, None, None, None,
    )


torch.library.register_autograd("fused::post_pool_with_offsets", _backward, setup_context=_setup_context)


def _setup_context_bias(ctx, inputs, output):
    input, bias, multiplier, negative_slope, kernel_size, stride, padding, dilation, _ceil, negative_slope2 = inputs
    _out, selected, offsets = output
    ctx.mark_non_differentiable(selected, offsets)
    ctx.save_for_backward(selected, offsets, bias, multiplier)
    ctx.pool = common.pool_params("fused::post_pool_bias", kernel_size, stride, padding, dilation)
    ctx.slopes = (negative_slope, negative_slope2)
    ctx.input_size = list(input.shape)
    ctx.channels_last = common.output_memory_format(input) == torch.channels_last_3d


def _backward_bias(ctx, grad_out, _grad_selected, _grad_offsets):
    selected, offsets, bias, multiplier = ctx.saved_tensors
    k, s, p, d = ctx.pool
    grad_input, grad_bias, grad_multiplier = _ops.post_pool_bias_backward(
        grad_out, selected, offsets, bias, multiplier, ctx.slopes[0], ctx.slopes[1], ctx.input_size, k, s, p, d,
        ctx.channels_last,
    )
    needs = ctx.needs_input_grad
    return (
        grad_input if needs[0] else None,
        grad_bias if needs[1] else None,
        grad_multiplier if needs[2] else None,
        None, None, None, None, None, None, None,
    )


torch.library.register_autograd("fused::post_pool_bias_with_offsets", _backward_bias,
                                setup_context=_setup_context_bias)

# post_pool's and post_pool_bias's own Autograd kernels (csrc/post_pool/autograd.cpp) run the training forward
# above when a gradient is needed, the inference kernel otherwise. They are C++ because they run on every call.


# The backward ops are not differentiable. Without an autograd formula, autograd would treat them as constants
# when a graph is built through them (create_graph=True) and return zero second derivatives in silence; raise
# instead.
def _no_double_backward(op):
    def backward(ctx, *grads):
        raise RuntimeError(f"{op}: double backward is not supported (gradients of fused.post_pool's gradients)")

    torch.library.register_autograd(op, backward, setup_context=lambda ctx, inputs, output: None)


for _op in ("fused::post_pool_backward", "fused::post_pool_bias_backward"):
    _no_double_backward(_op)
