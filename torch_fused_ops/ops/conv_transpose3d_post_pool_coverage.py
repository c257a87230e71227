"""Which calls of fused::conv_transpose3d_post_pool the fused CUDA kernel computes, and why not, for code that has
no real tensors: the fusion pass decides its route on the fake tensors and symbolic sizes of a graph being compiled.

``unsupported_reasons`` mirrors ``fused_kernel_unsupported_reason`` in csrc/conv_transpose3d_post_pool/checks.cpp
(the op's choice between its fused kernel and its composite: the first reason, as a static ``Unsupported`` text,
in this order) plus the argument checks the op has made before (``PYTHON_ONLY``). Keep them in step: tests compare
the texts and their order with the C++ source, and on CUDA the op's choice with ``fused_kernel_applies``.
It never raises and never adds a guard: a size it cannot prove without a guard is a reason, worded as such.
"""
from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

import torch

from .common import dtype_name as _dtype
from .common import known_true as _known

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class Unsupported(enum.Enum):
    """Why the fused kernel does not compute a call; each value is the C++ function's text for it, in its order."""

    NOT_TENSORS = "input and weight are not both tensors"
    NOT_CUDA = "the input is not a CUDA tensor"
    DTYPE = "the input's dtype is not float32, bfloat16 or float16"
    LAYOUT = "the input or the weight is not strided"
    RANK = "the input or the weight is not 5-D"
    WEIGHT_LIKE = "the weight's dtype or device is not the input's"
    WEIGHT_CIN = "weight.shape[0] is not the input's channel count"
    GROUPS = "groups is not 1"
    NO_CHANNELS = "the input has no channels"
    KERNEL = "the weight's kernel is not 3x3x3"
    STRIDE = "stride is not 2"
    PADDING = "padding is not 1"
    DILATION = "dilation is not 1"
    OUTPUT_PADDING = "output_padding is not 0 or 1"
    POOL_KERNEL = "kernel_size is not 2"
    POOL_STRIDE = "pool_stride is not 2"
    POOL_PADDING = "pool_padding is not 0"
    POOL_DILATION = "pool_dilation is not 1"
    CEIL_MODE_TYPE = "ceil_mode is not a bool"
    CEIL_MODE = "ceil_mode adds a pooled plane the fused kernel does not write"
    UNREADABLE = "an argument cannot be read"


# Checks the C++ op makes before it asks fused_kernel_unsupported_reason (its arguments' types and checks).
PYTHON_ONLY = frozenset({Unsupported.NOT_TENSORS, Unsupported.LAYOUT, Unsupported.RANK, Unsupported.WEIGHT_LIKE,
                         Unsupported.WEIGHT_CIN, Unsupported.CEIL_MODE_TYPE, Unsupported.UNREADABLE})


class Reason(str):
    """One reason, a sentence naming the argument, its value and what the kernel needs; ``kind`` says which."""

    kind: Unsupported

    def __new__(cls, kind: Unsupported, text: str) -> Reason:
        self = super().__new__(cls, text)
        self.kind = kind
        return self

    def __reduce__(self):
        return Reason, (self.kind, str(self))


def _unproven(fails: Any) -> str:
    """'' when a failed check is certain (`fails` proven); else the wording for a size not provable either way."""
    return "" if _known(fails) else ", which cannot be proven without a guard"


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


def _shown(v: Any) -> str:
    """An argument as a reason names it: three ints where it reads as such, else its repr and why not."""
    three = _ints3(v)
    return str(three) if three is not None else f"{v!r} (not an int or 1 or 3 ints)"


def unsupported_reasons(input: Any, weight: Any, stride: Any, padding: Any, output_padding: Any, groups: Any,
                        dilation: Any, kernel_size: Any, pool_stride: Any, pool_padding: Any, pool_dilation: Any,
                        ceil_mode: Any) -> list[Reason]:
    """Every reason the fused CUDA kernel does not compute ``conv_transpose3d_post_pool`` with these arguments
    (empty: it does; else the op runs its composite, aten's convolution then fused.post_pool), in ``Unsupported``
    order. Arguments as the op takes them (an int or three per parameter, pool_stride None or [] for omitted).
    The kernel's coverage: a CUDA float32/bfloat16/float16 input, a weight [Cin >= 1, Cout, 3, 3, 3] of its dtype
    and device; stride 2, padding 1, dilation 1, groups 1, output_padding 0 or 1 per dim; a pool of kernel 2,
    stride 2, padding 0, dilation 1, with ceil_mode only where it gives the floor-mode size (output_padding 1).
    Any batch, channel count, spatial size and memory format."""
    out: list[Reason] = []
    try:
        if _tensor_reasons(out, input, weight):
            _channel_reasons(out, input, weight, groups)
        else:
            _groups_reason(out, groups)
        _geometry_reasons(out, stride, padding, output_padding, dilation, kernel_size, pool_stride, pool_padding,
                          pool_dilation, ceil_mode)
    except Exception as e:  # an argument of an unexpected kind: a reason, never an error for the caller
        out.append(Reason(Unsupported.UNREADABLE, f"an argument cannot be read ({type(e).__name__}: {e}); the "
                                                  "fused kernel needs arguments as the op takes them"))
    return out


def fused_kernel_applies(input: Any, weight: Any, stride: Any, padding: Any, output_padding: Any, groups: Any,
                         dilation: Any, kernel_size: Any, pool_stride: Any, pool_padding: Any, pool_dilation: Any,
                         ceil_mode: Any) -> bool:
    """Whether the fused CUDA kernel computes this call: no ``unsupported_reasons``."""
    return not unsupported_reasons(input, weight, stride, padding, output_padding, groups, dilation, kernel_size,
                                   pool_stride, pool_padding, pool_dilation, ceil_mode)


def _tensor_reasons(out: list[Reason], input: Any, weight: Any) -> bool:
    """Device, dtype and what the op's own checks establish; whether the tensors' sizes can be read further."""
    if not isinstance(input, torch.Tensor) or not isinstance(weight, torch.Tensor):
        out.append(Reason(Unsupported.NOT_TENSORS, f"input and weight are {type(input).__name__} and "
                                                   f"{type(weight).__name__}; the op needs two tensors"))
        return False
    if input.device.type != "cuda":
        out.append(Reason(Unsupported.NOT_CUDA, f"input is on {input.device.type}; the fused kernel needs CUDA"))
    if input.dtype not in _DTYPES:
        out.append(Reason(Unsupported.DTYPE, f"input dtype is {_dtype(input)}; the fused kernel needs float32, "
                                             "bfloat16 or float16"))
    if input.layout != torch.strided or weight.layout != torch.strided:
        out.append(Reason(Unsupported.LAYOUT, f"input and weight layouts are {input.layout} and {weight.layout}; "
                                              "the fused kernel needs strided tensors"))
    if input.dim() != 5 or weight.dim() != 5:
        out.append(Reason(Unsupported.RANK, f"input is {input.dim()}-D and weight {weight.dim()}-D; the op needs "
                                            "5-D tensors"))
        return False
    if weight.dtype != input.dtype or weight.device != input.device:
        out.append(Reason(Unsupported.WEIGHT_LIKE, f"weight is {_dtype(weight)} on {weight.device}, input "
                                                   f"{_dtype(input)} on {input.device}; the op needs them alike"))
    cin, w0 = input.shape[1], weight.shape[0]
    if not _known(w0 == cin):
        out.append(Reason(Unsupported.WEIGHT_CIN, f"weight.shape[0] is {w0} and the input has {cin} channels"
                                                  f"{_unproven(w0 != cin)}; the op needs them equal"))
    return True


def _groups_reason(out: list[Reason], groups: Any) -> None:
    if isinstance(groups, bool) or type(groups) is not int or groups != 1:
        out.append(Reason(Unsupported.GROUPS, f"groups is {groups!r}; the fused kernel needs 1"))


def _channel_reasons(out: list[Reason], input: torch.Tensor, weight: torch.Tensor, groups: Any) -> None:
    """Groups, the channel count and the weight's kernel. Cin == 0 makes the convolution output its bias alone;
    the composite covers it."""
    _groups_reason(out, groups)
    cin = input.shape[1]
    if not _known(cin != 0):
        out.append(Reason(Unsupported.NO_CHANNELS, f"the input has {cin} channels{_unproven(cin == 0)}; the fused "
                                                   "kernel needs at least 1"))
    k = list(weight.shape[2:])
    if not all(_known(e == 3) for e in k):
        fails = any(_known(e != 3) for e in k)
        out.append(Reason(Unsupported.KERNEL, f"the weight's kernel is {k}{_unproven(fails)}; the fused kernel "
                                              "needs 3x3x3"))


def _geometry_reasons(out: list[Reason], stride: Any, padding: Any, output_padding: Any, dilation: Any,
                      kernel_size: Any, pool_stride: Any, pool_padding: Any, pool_dilation: Any,
                      ceil_mode: Any) -> None:
    """The convolution's and the pool's parameters (plain Python values: nothing symbolic to prove)."""
    for kind, name, value, want in ((Unsupported.STRIDE, "stride", stride, 2),
                                    (Unsupported.PADDING, "padding", padding, 1),
                                    (Unsupported.DILATION, "dilation", dilation, 1)):
        if _ints3(value) != [want] * 3:
            out.append(Reason(kind, f"{name} is {_shown(value)}; the fused kernel needs {want}"))
    out_pad = _ints3(output_padding)
    if out_pad is None or any(o not in (0, 1) for o in out_pad):
        out.append(Reason(Unsupported.OUTPUT_PADDING, f"output_padding is {_shown(output_padding)}; the fused "
                                                      "kernel needs 0 or 1"))
    if _ints3(kernel_size) != [2] * 3:
        out.append(Reason(Unsupported.POOL_KERNEL, f"kernel_size is {_shown(kernel_size)}; the fused kernel needs 2"))
    omitted = pool_stride is None or (isinstance(pool_stride, Sequence) and len(pool_stride) == 0)
    if not omitted and _ints3(pool_stride) != [2] * 3:
        out.append(Reason(Unsupported.POOL_STRIDE, f"pool_stride is {_shown(pool_stride)}; the fused kernel needs "
                                                   "2 (or omitted)"))
    for kind, name, value, want in ((Unsupported.POOL_PADDING, "pool_padding", pool_padding, 0),
                                    (Unsupported.POOL_DILATION, "pool_dilation", pool_dilation, 1)):
        if _ints3(value) != [want] * 3:
            out.append(Reason(kind, f"{name} is {_shown(value)}; the fused kernel needs {want}"))
    _ceil_reason(out, ceil_mode, out_pad)


# The reasons that make the kernel's geometry, which the ceil_mode rule assumes.
_GEOMETRY = frozenset({Unsupported.KERNEL, Unsupported.STRIDE, Unsupported.PADDING, Unsupported.DILATION,
                       Unsupported.OUTPUT_PADDING, Unsupported.POOL_KERNEL, Unsupported.POOL_STRIDE,
                       Unsupported.POOL_PADDING, Unsupported.POOL_DILATION})


def _ceil_reason(out: list[Reason], ceil_mode: Any, out_pad: list[int] | None) -> None:
    """The kernel writes D - 1 + output_padding pooled planes per dim. With its geometry the convolution output
    is L = 2D - 1 + output_padding: floor mode pools (L - 2) // 2 + 1 = D - 1 + output_padding for every D, ceil
    mode D, the same only where output_padding is 1 (asked only with that geometry, as the C++ asks it last).
    Stated without D, so symbolic sizes need no guard (test_conv_coverage.py checks it against the pool formula)."""
    if not isinstance(ceil_mode, (bool, int)):
        out.append(Reason(Unsupported.CEIL_MODE_TYPE, f"ceil_mode is {ceil_mode!r}; the op needs a bool"))
    elif ceil_mode and not any(r.kind in _GEOMETRY for r in out) and not all(o == 1 for o in out_pad):
        out.append(Reason(Unsupported.CEIL_MODE, f"ceil_mode is {ceil_mode!r} with output_padding {out_pad}, "
                                                 "which pools one plane more than the fused kernel writes; it "
                                                 "needs output_padding 1 there"))
