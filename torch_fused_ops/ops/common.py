"""Argument checks and output geometry for the fake (meta) impls, and the symbolic-size helpers the coverage check
and the pass share.

Mirrors csrc/post_pool/checks.cpp (the checks the real kernels run) so that tracing under torch.compile or
torch.export raises the same exception types with the same wording as eager calls. Works on symbolic sizes.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch._prims_common import suggest_memory_format
from torch.fx.experimental.symbolic_shapes import statically_known_true

IntOr3 = int | Sequence[int]


def expand3(name: str, value: IntOr3, *, allow_empty_as: Sequence[int] | None = None) -> list[int]:
    """int[3] argument as three ints: one value expands to all dims, as in max_pool3d."""
    if isinstance(value, int):
        return [value] * 3
    if type(value) is list and len(value) == 3:  # the common case, kept cheap: this runs on every call
        return value
    value = list(value)
    if not value and allow_empty_as is not None:
        return list(allow_empty_as)
    if len(value) not in (1, 3):
        raise ValueError(f"{name} must be a single int or a list of three ints, got {value}")
    return value * 3 if len(value) == 1 else value


def pool_params(op: str, kernel_size: IntOr3, stride: IntOr3, padding: IntOr3, dilation: IntOr3):
    k = expand3(f"{op}: kernel_size", kernel_size)
    s = expand3(f"{op}: stride", stride, allow_empty_as=k)
    p = expand3(f"{op}: padding", padding)
    d = expand3(f"{op}: dilation", dilation)
    # max_pool3d converts each pool parameter to int before any other check and raises RuntimeError on overflow.
    for name, v in (("kernel_size", k), ("stride", s), ("padding", p), ("dilation", d)):
        if any(not _INT32_MIN <= x <= _INT32_MAX for x in v):
            raise RuntimeError(f"{op}: {name} {'x'.join(map(str, v))}: value cannot be converted to type int without "
                               "overflow")
    for i in range(3):
        kx = "x".join(map(str, k)) if (k[i] <= 0 or p[i] > k[i] // 2) else ""  # built only for an error message
        if k[i] <= 0:
            raise ValueError(f"{op}: kernel_size must be positive, got {kx}")
        if s[i] <= 0:
            raise ValueError(f"{op}: stride must be positive, got {'x'.join(map(str, s))}")
        if d[i] <= 0:
            raise ValueError(f"{op}: dilation must be positive, got {'x'.join(map(str, d))}")
        if p[i] < 0:
            raise ValueError(f"{op}: padding must be non-negative, got {'x'.join(map(str, p))}")
        if p[i] > k[i] // 2:
            raise ValueError(
                f"{op}: padding must be at most half of kernel_size, got padding {'x'.join(map(str, p))} "
                f"for kernel_size {kx}"
            )
    if k[0] * k[1] * k[2] > _INT32_MAX:
        raise ValueError(f"{op}: kernel_size {'x'.join(map(str, k))} has more than 2**31 - 1 taps per window, which "
                         "the window offsets (int32) cannot address")
    return k, s, p, d


_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_FLOAT_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max


def check_slopes(op: str, dtype: torch.dtype, negative_slope: float, negative_slope2: float | None = None) -> None:
    """Slopes as eager leaky_relu accepts them (mirrors check_slopes in csrc/post_pool/checks.cpp): for a float32,
    bfloat16 or float16 input a finite slope beyond float's range raises RuntimeError; float64 takes any."""
    if dtype == torch.float64:
        return
    for name, v in (("negative_slope", negative_slope), ("negative_slope2", negative_slope2)):
        if v is not None and math.isfinite(v) and abs(v) > _FLOAT_MAX:
            raise RuntimeError(f"{op}: {name} {v} for a {dtype} input: value cannot be converted to type float "
                               "without overflow")


def is_mixed(input_dtype: torch.dtype, multiplier_dtype: torch.dtype) -> bool:
    """The mixed form torch.autocast's chain computes (mirrors is_mixed in csrc/post_pool/post_pool.h): a float16 or
    bfloat16 input with a float32 multiplier; the output is float32, the first LeakyReLU rounded to the input's
    dtype."""
    return input_dtype in (torch.float16, torch.bfloat16) and multiplier_dtype == torch.float32


def output_dtype(input_dtype: torch.dtype, multiplier_dtype: torch.dtype) -> torch.dtype:
    """The forward output's dtype for an input and multiplier that passed the checks."""
    return multiplier_dtype if is_mixed(input_dtype, multiplier_dtype) else input_dtype


def check_tensors(op: str, sizes: Sequence, dtype: torch.dtype, device: torch.device, multiplier: torch.Tensor):
    if len(sizes) != 5:
        raise ValueError(f"{op}: expected a 5-D input (N, C, D, H, W), got {len(sizes)}-D input of shape {list(sizes)}")
    if not dtype.is_floating_point:
        raise TypeError(f"{op}: expected a floating-point input (float16, bfloat16, float32 or float64), got {dtype}")
    if multiplier.dtype != dtype and not is_mixed(dtype, multiplier.dtype):
        raise TypeError(
            f"{op}: multiplier dtype must equal input dtype, or be float32 for a float16/bfloat16 input (the mixed "
            f"precision torch.autocast computes), got multiplier {multiplier.dtype} and input {dtype}"
        )
    if multiplier.dtype != dtype and multiplier.dim() == 0:
        raise TypeError(f"{op}: a 0-dim {multiplier.dtype} multiplier does not promote a {dtype} input (eager keeps "
                        "the input's dtype); give it the input's dtype or a shape such as (1,)")
    if multiplier.device != device:
        raise ValueError(
            f"{op}: multiplier must be on the input's device, got multiplier on {multiplier.device} and input on {device}"
        )
    C = sizes[1]
    mshape = list(multiplier.shape)
    ok = len(mshape) <= 5
    if ok and multiplier.numel() != 1:
        for i, sz in enumerate(mshape):
            if sz == 1:
                continue
            if 5 - len(mshape) + i != 1 or sz != C:
                ok = False
    if not ok:
        raise ValueError(
            f"{op}: multiplier of shape {mshape} must broadcast against input of shape {list(sizes)} varying at most "
            f"along the channel dim: one element, or C={C} elements shaped (C, 1, 1, 1) or (1, C, 1, 1, 1)"
        )
    torch._check_value(
        sizes[2] > 0 and sizes[3] > 0 and sizes[4] > 0,
        lambda: f"{op}: expected non-empty spatial dims (D, H, W), got input of shape {list(sizes)}",
    )


def pooled_size(size, k: int, s: int, p: int, d: int, ceil_mode: bool):
    """max_pool3d's output-size formula (ATen pooling_output_shape)."""
    out = (size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out = out - 1
    return out


def output_shape(op: str, input: torch.Tensor, multiplier: torch.Tensor, kernel_size, stride, padding, dilation,
                 ceil_mode: bool):
    """Checks the forward's arguments; returns (output shape, output memory format)."""
    check_tensors(op, input.shape, input.dtype, input.device, multiplier)
    k, s, p, d = pool_params(op, kernel_size, stride, padding, dilation)
    N, C, D, H, W = input.shape
    od, oh, ow = (pooled_size(n, k[i], s[i], p[i], d[i], ceil_mode) for i, n in enumerate((D, H, W)))
    torch._check_value(
        od >= 1 and oh >= 1 and ow >= 1,
        lambda: f"{op}: output size is too small: input {list(input.shape)} gives pooled size {od}x{oh}x{ow}",
    )
    return (N, C, od, oh, ow), output_memory_format(input)


def output_memory_format(input: torch.Tensor) -> torch.memory_format:
    """The memory format max_pool3d gives its output (and the layout our kernels read)."""
    fmt = suggest_memory_format(input)
    return torch.channels_last_3d if fmt == torch.channels_last_3d else torch.contiguous_format


def offset_dtype(kernel_size) -> torch.dtype:
    """One byte per window offset unless the window has more than 256 taps."""
    k = expand3("kernel_size", kernel_size)
    return torch.uint8 if k[0] * k[1] * k[2] <= 256 else torch.int32


def check_bias(op: str, bias: torch.Tensor, C, dtype: torch.dtype, device: torch.device) -> None:
    """The per-channel bias of the post_pool_bias ops (mirrors check_bias in csrc/post_pool/checks.cpp)."""
    if bias.dtype != dtype:
        raise TypeError(f"{op}: bias dtype must equal input dtype, got bias {bias.dtype} and input {dtype}")
    if bias.device != device:
        raise ValueError(f"{op}: bias must be on the input's device, got bias on {bias.device} and input on {device}")
    if bias.dim() != 1 or bias.shape[0] != C:
        raise ValueError(f"{op}: bias must be 1-D with C={C} elements, got shape {list(bias.shape)}")


def known_true(expr: Any) -> bool:
    """True only when `expr` holds for every value a compiled graph can see: a plain bool, or a symbolic comparison
    the shape environment proves without adding a guard."""
    if isinstance(expr, bool):
        return expr
    try:
        return bool(statically_known_true(expr))
    except Exception:  # a comparison the shape environment cannot evaluate: not proven
        return False


def dtype_name(t: torch.Tensor) -> str:
    """A tensor's dtype as reasons and messages write it: "float32"."""
    return str(t.dtype).removeprefix("torch.")
