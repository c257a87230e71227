"""The post_pool ops' Python face: the typed wrapper post_pool, the eager reference, and the fake (meta) impls.

Ops (schemas in csrc/ops.cpp; kernels in csrc/post_pool/):
  fused::post_pool, fused::post_pool_bias        inference forward (the bias one adds a per-channel bias first)
  fused::post_pool[_bias]_with_offsets          training forward: also the selected input and window offset
  fused::post_pool[_bias]_backward              gradients from those pooled-size tensors
Private, no fake impl: fused::_post_pool_backward_tuned (CUDA launch choices), fused::_set_cpu_huge_pages.
Autograd is C++ (csrc/post_pool/autograd.cpp): a call needing gradients runs the training forward, which saves
pooled-size tensors only; double backward raises. Nothing here runs on an eager training step but the wrapper.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import _C
from . import common

IntOr3 = int | Sequence[int]
_ops = torch.ops.fused
_POST_POOL_OP = torch.ops.fused.post_pool.default
_has_torch_function = torch._C._has_torch_function_variadic


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
        multiplier: same device; the input's dtype, or float32 for a float16/bfloat16 input (the mixed
            precision of ``torch.autocast``: the output is float32 and the first LeakyReLU is rounded to the
            input's dtype, as eager computes it); one element (any rank) or C elements on the channel dim,
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
    # The C entry point where the arguments are plain (as in conv_transpose3d_post_pool.py).
    if not (torch.compiler.is_compiling() or _has_torch_function(input, multiplier)):
        out = _C.post_pool(input, multiplier, negative_slope, kernel_size, stride, padding, dilation, ceil_mode,
                           negative_slope2)
        if out is not None:
            return out
    op = "fused::post_pool"
    # None reaches the kernel as an undefined tensor, which would fail later with an unrelated message.
    if not (isinstance(input, Tensor) and isinstance(multiplier, Tensor)):
        name, t = ("input", input) if not isinstance(input, Tensor) else ("multiplier", multiplier)
        raise TypeError(f"{op}: {name} must be a Tensor, got {'None' if t is None else type(t).__name__}")
    args = (
        input, multiplier, float(negative_slope), common.expand3(f"{op}: kernel_size", kernel_size),
        [] if stride is None else common.expand3(f"{op}: stride", stride, allow_empty_as=[]),
        common.expand3(f"{op}: padding", padding), common.expand3(f"{op}: dilation", dilation),
        bool(ceil_mode), None if negative_slope2 is None else float(negative_slope2),
    )
    return _POST_POOL_OP(*args)


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
    return torch.empty(shape, dtype=common.output_dtype(input.dtype, multiplier.dtype), device=input.device,
                       memory_format=fmt)


@torch.library.register_fake("fused::post_pool_with_offsets")
def _post_pool_with_offsets_fake(input, multiplier, negative_slope, kernel_size, stride=(), padding=0, dilation=1,
                                 ceil_mode=False, negative_slope2=None):
    shape, fmt = common.output_shape("fused::post_pool_with_offsets", input, multiplier, kernel_size, stride,
                                        padding, dilation, ceil_mode)
    common.check_slopes("fused::post_pool_with_offsets", input.dtype, negative_slope, negative_slope2)
    out = torch.empty(shape, dtype=common.output_dtype(input.dtype, multiplier.dtype), device=input.device,
                      memory_format=fmt)
    selected = torch.empty(shape, dtype=input.dtype, device=input.device, memory_format=fmt)
    offsets = torch.empty(shape, dtype=common.offset_dtype(kernel_size), device=input.device, memory_format=fmt)
    return out, selected, offsets


@torch.library.register_fake("fused::post_pool_backward")
def _post_pool_backward_fake(grad_output, selected, offsets, multiplier, negative_slope, negative_slope2,
                             input_size, kernel_size, stride, padding, dilation, channels_last):
    op = "fused::post_pool_backward"
    # The input's dtype is selected's; grad_output has the output's (float32 in the mixed form).
    common.check_tensors(op, input_size, selected.dtype, grad_output.device, multiplier)
    out_dtype = common.output_dtype(selected.dtype, multiplier.dtype)
    if grad_output.dtype != out_dtype:
        raise TypeError(f"{op}: grad_output must be {out_dtype} (the forward output's dtype for a {selected.dtype} "
                        f"input and a {multiplier.dtype} multiplier), got {grad_output.dtype}")
    common.pool_params(op, kernel_size, stride, padding, dilation)
    common.check_slopes(op, selected.dtype, negative_slope, negative_slope2)
    torch._check_value(
        grad_output.dim() == 5 and selected.shape == grad_output.shape and offsets.shape == grad_output.shape,
        lambda: f"{op}: grad_output, selected and offsets must be 5-D with equal shapes",
    )
    fmt = torch.channels_last_3d if channels_last else torch.contiguous_format
    grad_input = torch.empty(input_size, dtype=selected.dtype, device=grad_output.device, memory_format=fmt)
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
    common.check_bias("fused::post_pool_bias_backward", bias, input_size[1], selected.dtype,
                         grad_output.device)
    grad_input, grad_multiplier = _post_pool_backward_fake(
        grad_output, selected, offsets, multiplier, negative_slope, negative_slope2, input_size, kernel_size, stride,
        padding, dilation, channels_last)
    return grad_input, torch.empty(bias.shape, dtype=bias.dtype, device=bias.device), grad_multiplier
