"""Which calls of fused::conv_transpose3d_post_pool the fused CUDA kernel computes, for code that has no real
tensors: the fusion pass decides its route on the fake tensors and symbolic sizes of a graph being compiled.

``fused_kernel_applies`` mirrors ``fused_kernel_applies`` in csrc/conv_transpose3d_post_pool/checks.cpp (the C++
op's own choice between the fused kernel and the composite), plus the few argument checks that function may assume
have already passed. Keep the two in step: tests/test_conv_semantics.py checks on CUDA that the op takes the
fused kernel exactly where this says so.

It never raises and never adds a guard to a graph being compiled: an argument it cannot read, or a size whose
value it cannot prove without a guard, means "not the fused kernel".
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _known(expr: Any) -> bool:
    """True only when `expr` holds for every value a compiled graph can see (a plain bool, or a symbolic
    comparison the shape environment proves without a new guard)."""
    if isinstance(expr, bool):
        return expr
    try:
        from torch.fx.experimental.symbolic_shapes import statically_known_true

        return bool(statically_known_true(expr))
    except Exception:
        return False


def _ints3(v: Any) -> list[int] | None:
    """An int or a 1-/3-sequence of Python ints as three ints; None for anything else (symbolic, bool, ...)."""
    if isinstance(v, bool):
        return None
    if type(v) is int:
        return [v, v, v]
    if isinstance(v, Sequence) and not isinstance(v, str) and len(v) in (1, 3):
        if all(type(e) is int for e in v):
            return [v[0]] * 3 if len(v) == 1 else list(v)
    return None


def fused_kernel_applies(input: Any, weight: Any, stride: Any, padding: Any, output_padding: Any, groups: Any,
                         dilation: Any, kernel_size: Any, pool_stride: Any, pool_padding: Any, pool_dilation: Any,
                         ceil_mode: Any) -> bool:
    """Whether ``conv_transpose3d_post_pool`` with these arguments runs the fused CUDA kernel (else the op runs
    its composite: aten's convolution, then fused.post_pool).

    The kernel's coverage: a CUDA float32/bfloat16/float16 input and a weight of its dtype and device,
    [Cin >= 1, Cout, 3, 3, 3]; convolution stride 2, padding 1, dilation 1, groups 1, output_padding 0 or 1 per
    dim; a pool of kernel 2, stride 2 (or omitted: None / []), padding 0, dilation 1, with ceil_mode only where it
    gives the floor-mode size. Arguments as the op takes them (an int or three per parameter); any batch, channel
    count, spatial size and memory format.
    """
    try:
        return _applies(input, weight, stride, padding, output_padding, groups, dilation, kernel_size, pool_stride,
                        pool_padding, pool_dilation, ceil_mode)
    except Exception:  # an argument of an unexpected kind: not the fused kernel, and no error from the caller
        return False


def _applies(input, weight, stride, padding, output_padding, groups, dilation, kernel_size, pool_stride,
             pool_padding, pool_dilation, ceil_mode) -> bool:
    if not isinstance(input, torch.Tensor) or not isinstance(weight, torch.Tensor):
        return False
    if input.device.type != "cuda" or input.dtype not in _DTYPES or input.layout != torch.strided:
        return False
    # What check_conv_post_pool_args has established before the C++ predicate runs.
    if input.dim() != 5 or weight.dim() != 5 or weight.dtype != input.dtype or weight.device != input.device:
        return False
    if weight.layout != torch.strided or not _known(weight.shape[0] == input.shape[1]):
        return False
    # The C++ predicate. Cin == 0 makes the convolution output its bias alone; the composite covers it.
    if isinstance(groups, bool) or type(groups) is not int or groups != 1 or not _known(weight.shape[0] != 0):
        return False
    if not all(_known(k == 3) for k in weight.shape[2:]):
        return False
    if (_ints3(stride), _ints3(padding), _ints3(dilation)) != ([2] * 3, [1] * 3, [1] * 3):
        return False
    out_pad = _ints3(output_padding)
    if out_pad is None or any(o not in (0, 1) for o in out_pad):
        return False
    omitted = pool_stride is None or (isinstance(pool_stride, Sequence) and len(pool_stride) == 0)
    if _ints3(kernel_size) != [2] * 3 or (not omitted and _ints3(pool_stride) != [2] * 3):
        return False
    if _ints3(pool_padding) != [0] * 3 or _ints3(pool_dilation) != [1] * 3:
        return False
    if not isinstance(ceil_mode, (bool, int)):
        return False
    # The kernel writes D - 1 + output_padding pooled planes per dim (the C++ compares the pool's size with that).
    # With this geometry the convolution output is L = 2D - 1 + output_padding: floor mode pools (L - 2) // 2 + 1
    # = D - 1 + output_padding for every D, and ceil mode gives D, the same size only where output_padding is 1.
    # Stated without D, so symbolic sizes need no guard (tests/test_conv_semantics.py checks this against the pool
    # formula).
    return not ceil_mode or all(o == 1 for o in out_pad)
