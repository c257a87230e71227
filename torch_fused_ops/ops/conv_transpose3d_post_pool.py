"""fused::conv_transpose3d_post_pool[_with_offsets] and its pooled-resolution backward ops: typed wrapper and fake impls.

The op is ``post_pool(conv_transpose3d(input, weight, bias, ...), multiplier, ...)``. Kernels and autograd are C++
(csrc/conv_transpose3d_post_pool/): a fused CUDA kernel at pooled resolution where it applies
(conv_transpose3d_post_pool_coverage), aten's convolution then fused.post_pool elsewhere. The fake impls run the
C++ checks (same exception types and wording) and give the outputs the kernels' exact strides. How it works:
docs/design.md#fused-convolution.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .. import _C
from . import common

try:
    from torch.fx.experimental.symbolic_shapes import has_guarding_hint as _has_hint
except ImportError:  # older torch
    from torch.fx.experimental.symbolic_shapes import has_hint as _has_hint

IntOr3 = int | Sequence[int]
_OP = "fused::conv_transpose3d_post_pool"
# The overload itself: calling it skips the packet's overload resolution on every call.
_CONV_OP = torch.ops.fused.conv_transpose3d_post_pool.default
_has_torch_function = torch._C._has_torch_function_variadic


def conv_transpose3d_post_pool(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    multiplier: Tensor,
    negative_slope: float = 0.01,
    stride: IntOr3 = 1,
    padding: IntOr3 = 0,
    output_padding: IntOr3 = 0,
    groups: int = 1,
    dilation: IntOr3 = 1,
    kernel_size: IntOr3 = 2,
    pool_stride: IntOr3 | None = None,
    pool_padding: IntOr3 = 0,
    pool_dilation: IntOr3 = 1,
    ceil_mode: bool = False,
    negative_slope2: float | None = None,
) -> Tensor:
    """``max_pool3d(leaky_relu(leaky_relu(conv_transpose3d(input, weight, bias, ...), s1) * multiplier, s2))``.

    Convolution arguments as ``torch.nn.functional.conv_transpose3d``; pool arguments as
    ``torch.nn.functional.max_pool3d`` (``pool_stride`` None means ``kernel_size``); multiplier and slopes as
    ``torch_fused_ops.post_pool``. Differentiable in input, weight, bias and multiplier.
    """
    # Outside Dynamo's tracing and without a __torch_function__ override, the C entry point: the same operator
    # through the dispatcher, without torch.ops' per-call schema parsing; None when an argument is not plain
    # (csrc/python_module.cpp), and then the Python path below validates it.
    if not (torch.compiler.is_compiling() or _has_torch_function(input, weight, bias, multiplier)):
        out = _C.conv_transpose3d_post_pool(input, weight, bias, multiplier, negative_slope, stride, padding,
                                            output_padding, groups, dilation, kernel_size, pool_stride, pool_padding,
                                            pool_dilation, ceil_mode, negative_slope2)
        if out is not None:
            return out
    if not (isinstance(input, Tensor) and isinstance(weight, Tensor) and isinstance(multiplier, Tensor)
            and (bias is None or isinstance(bias, Tensor))):  # one expression: this runs on every call
        _check_tensor_types("conv_transpose3d_post_pool", input, weight, bias, multiplier)
    # A plain int expands inline (expand3's own first case, without a call per argument); anything else goes
    # through expand3, which validates it.
    e3 = common.expand3
    args = (
        input, weight, bias,
        [stride] * 3 if type(stride) is int else e3("stride", stride),
        [padding] * 3 if type(padding) is int else e3("padding", padding),
        [output_padding] * 3 if type(output_padding) is int else e3("output_padding", output_padding),
        int(groups),
        [dilation] * 3 if type(dilation) is int else e3("dilation", dilation),
        multiplier, float(negative_slope),
        [kernel_size] * 3 if type(kernel_size) is int else e3("kernel_size", kernel_size),
        [] if pool_stride is None else [pool_stride] * 3 if type(pool_stride) is int else e3("pool_stride",
                                                                                             pool_stride),
        [pool_padding] * 3 if type(pool_padding) is int else e3("pool_padding", pool_padding),
        [pool_dilation] * 3 if type(pool_dilation) is int else e3("pool_dilation", pool_dilation),
        bool(ceil_mode),
        None if negative_slope2 is None else float(negative_slope2),
    )
    return _CONV_OP(*args)


# ---- shared argument handling -----------------------------------------------------------------------------

_DEFAULTS = ((), 0, 1, False, None)  # pool_stride, pool_padding, pool_dilation, ceil_mode, negative_slope2


def _full_args(inputs):
    """The 16 schema arguments, defaults filled in (the dispatcher may drop trailing defaulted ones)."""
    inputs = tuple(inputs)
    return inputs + _DEFAULTS[len(inputs) - 11:] if len(inputs) < 16 else inputs


def _check_tensor_types(op, input, weight, bias, multiplier):
    """A TypeError naming the argument for anything that is not a tensor (None reaches the kernels as an
    undefined tensor, which would otherwise fail later with an unrelated message)."""
    for name, t in (("input", input), ("weight", weight), ("multiplier", multiplier)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: {name} must be a Tensor, got {'None' if t is None else type(t).__name__}")
    if bias is not None and not isinstance(bias, Tensor):
        raise TypeError(f"{op}: bias must be a Tensor or None, got {type(bias).__name__}")


def conv_memory_format(input, weight, bias, stride, padding, output_padding, groups, dilation):
    """The memory format aten's transposed convolution gives its output for these arguments (and so the format
    of the eager composite's result): the format of the backend it selects. cuDNN (CUDA): channels_last_3d when
    the input or the weight is channels_last_3d, except in float64. CPU: the same where oneDNN runs, which depends
    on dtype, sizes and the thread count; contiguous where the native kernel runs (float64, small batch-1 cases).
    Sizes without a hint (unbacked) give contiguous, as torch's own fake convolution does."""
    if not all(_has_hint(v) for t in (input, weight) for v in t.shape):
        return torch.contiguous_format
    backend = torch._C._select_conv_backend(input, weight, bias, list(stride), list(padding), list(dilation), True,
                                            list(output_padding), groups)
    fmt = torch._C._conv_determine_backend_memory_format(input, weight, backend)
    return torch.channels_last_3d if fmt == torch.channels_last_3d else torch.contiguous_format


def _conv_geometry(op, input, weight, bias, stride, padding, output_padding, groups, dilation):
    """Checks the convolution's arguments; returns (conv output size [N, Cout, Do, Ho, Wo], s, p, op, d)."""
    if input.dim() != 5:
        raise ValueError(f"{op}: expected a 5-D input (N, C, D, H, W), got shape {list(input.shape)}")
    if weight.dim() != 5:
        raise ValueError(f"{op}: expected a 5-D weight (C_in, C_out/groups, kD, kH, kW), got {list(weight.shape)}")
    if not input.dtype.is_floating_point:
        raise TypeError(f"{op}: expected a floating-point input, got {input.dtype}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is None:
            continue
        if t.dtype != input.dtype:
            raise TypeError(f"{op}: {name} dtype must equal input dtype, got {name} {t.dtype} and input {input.dtype}")
        if t.device != input.device:
            raise ValueError(f"{op}: {name} must be on the input's device, got {t.device} and {input.device}")
    e3 = common.expand3
    s, p, o, d = (e3(op + ": " + name, v) for name, v in
                  (("stride", stride), ("padding", padding), ("output_padding", output_padding),
                   ("dilation", dilation)))
    if groups < 1:
        raise ValueError(f"{op}: groups must be positive, got {groups}")
    cin = input.shape[1]
    torch._check_value(weight.shape[0] == cin,
                       lambda: f"{op}: weight.shape[0] must equal the input's channels {cin}, got {list(weight.shape)}")
    torch._check_value(cin % groups == 0, lambda: f"{op}: input channels {cin} not divisible by groups {groups}")
    cout = weight.shape[1] * groups
    if bias is not None:
        torch._check_value(bias.dim() == 1 and bias.shape[0] == cout,
                           lambda: f"{op}: bias must be 1-D with {cout} elements, got {list(bias.shape)}")
    for i in range(3):
        if s[i] <= 0 or d[i] <= 0 or p[i] < 0 or o[i] < 0:
            raise ValueError(f"{op}: stride and dilation must be positive, padding and output_padding non-negative")
        if o[i] >= max(s[i], d[i]):
            raise ValueError(f"{op}: output_padding must be smaller than stride or dilation, got {o}, {s}, {d}")
    size = [input.shape[0], cout]
    for i in range(3):
        size.append((input.shape[2 + i] - 1) * s[i] - 2 * p[i] + d[i] * (weight.shape[2 + i] - 1) + o[i] + 1)
    torch._check_value(size[2] > 0 and size[3] > 0 and size[4] > 0,
                       lambda: f"{op}: convolution output size {size[2:]} is not positive")
    return size, s, p, o, d


def _output_meta(op, input, weight, bias, stride, padding, output_padding, groups, dilation, multiplier,
                 kernel_size, pool_stride, pool_padding, pool_dilation, ceil_mode):
    """(pooled shape, memory format, conv output size, pool params), after every check the kernels make."""
    _check_tensor_types(op, input, weight, bias, multiplier)
    ysize, s_, p_, o_, d_ = _conv_geometry(op, input, weight, bias, stride, padding, output_padding, groups, dilation)
    common.check_tensors(op, ysize, input.dtype, input.device, multiplier)
    k, s, p, d = common.pool_params(op, kernel_size, pool_stride, pool_padding, pool_dilation)
    pooled = [common.pooled_size(ysize[2 + i], k[i], s[i], p[i], d[i], ceil_mode) for i in range(3)]
    torch._check_value(all(v >= 1 for v in pooled),  # post_pool's check, on the convolution output's size
                       lambda: f"{op}: output size is too small: input {ysize} gives pooled size "
                       f"{pooled[0]}x{pooled[1]}x{pooled[2]}")
    fmt = conv_memory_format(input, weight, bias, s_, p_, o_, groups, d_)
    return (ysize[0], ysize[1], *pooled), fmt, ysize, (k, s, p, d)


# ---- fake impls ---------------------------------------------------------------------------------------------

def _fake_forward(with_offsets, input, weight, bias, stride, padding, output_padding, groups, dilation,
                  multiplier, negative_slope, kernel_size, pool_stride, pool_padding, pool_dilation, ceil_mode,
                  negative_slope2):
    op = _OP + ("_with_offsets" if with_offsets else "")
    shape, fmt, _, (k, *_) = _output_meta(op, input, weight, bias, stride, padding, output_padding, groups,
                                          dilation, multiplier, kernel_size, pool_stride, pool_padding,
                                          pool_dilation, ceil_mode)
    like = dict(device=input.device, memory_format=fmt)
    out = torch.empty(shape, dtype=common.output_dtype(input.dtype, multiplier.dtype), **like)
    if not with_offsets:
        return out
    return out, torch.empty(shape, dtype=input.dtype, **like), torch.empty(shape, dtype=common.offset_dtype(k),
                                                                           **like)


torch.library.register_fake(_OP, lambda *args: _fake_forward(False, *_full_args(args)))
torch.library.register_fake(_OP + "_with_offsets", lambda *args: _fake_forward(True, *_full_args(args)))


@torch.library.register_fake("fused::_conv_transpose3d_post_pool_cast")
def _fake_cast(input, weight, bias, dtype, *rest):
    """The op on its operands cast to dtype (what its kernels compute, and the layout they give)."""
    operands = [t.to(dtype) if isinstance(t, Tensor) else t for t in (input, weight, bias)]
    return _fake_forward(False, *_full_args((*operands, *rest)))


# Kernels (CPU, CUDA) and autograd are C++: csrc/conv_transpose3d_post_pool/op.cpp and
# csrc/conv_transpose3d_post_pool/autograd.cpp. The checks above mirror csrc/conv_transpose3d_post_pool/checks.cpp.


# ---- the backward ops at pooled resolution (internal) -------------------------------------------------------
# Kernels: csrc/conv_transpose3d_post_pool/backward.cpp, whose checks (same order, types and wording) and output
# strides these fakes mirror.

_GRAD_CONV_OP = "fused::_conv_transpose3d_post_pool_grad_conv"
_GRAD_WEIGHT_OP = "fused::_conv_transpose3d_post_pool_grad_weight"
_GRAD_INPUT_OP = "fused::_conv_transpose3d_post_pool_grad_input"


def _is_dense(t):
    return t.is_contiguous() or t.is_contiguous(memory_format=torch.channels_last_3d)


def _grad_input_format(grad_conv):
    """channels_last_3d only where grad_conv is unambiguously so (a tensor that is both counts as contiguous)."""
    cl = not grad_conv.is_contiguous() and grad_conv.is_contiguous(memory_format=torch.channels_last_3d)
    return torch.channels_last_3d if cl else torch.contiguous_format


def _check_defined(op, name, t):
    if not isinstance(t, Tensor):
        raise TypeError(f"{op}: {name} must be a Tensor, got {'None' if t is None else type(t).__name__}")
    if t.layout != torch.strided:
        raise ValueError(f"{op}: {name} must be a strided (dense) tensor")


def _check_pooled_pair(op, grad_conv, offsets, output_padding):
    _check_defined(op, "grad_conv", grad_conv)
    _check_defined(op, "offsets", offsets)
    if grad_conv.dim() != 5:
        raise ValueError(f"{op}: expected a 5-D grad_conv (N, C_out, PD, PH, PW), got shape {list(grad_conv.shape)}")
    if not grad_conv.dtype.is_floating_point:
        raise TypeError(f"{op}: expected a floating-point grad_conv (float16, bfloat16, float32 or float64), got "
                        f"{grad_conv.dtype}")
    if offsets.dtype != torch.uint8:
        raise TypeError(f"{op}: offsets must be uint8 (2x2x2 windows), got {offsets.dtype}")
    if offsets.shape != grad_conv.shape:
        raise ValueError(f"{op}: offsets {list(offsets.shape)} must have grad_conv's shape {list(grad_conv.shape)}")
    if offsets.device != grad_conv.device:
        raise ValueError(f"{op}: offsets must be on grad_conv's device, got {offsets.device} and {grad_conv.device}")
    o = list(output_padding)
    if len(o) not in (1, 3):
        raise ValueError(f"{op}: output_padding must be a single int or a list of three ints, got {o}")
    o = o * 3 if len(o) == 1 else o
    for i in range(3):
        if o[i] not in (0, 1):
            raise ValueError(f"{op}: output_padding must be 0 or 1 per dim, got {o}")
        torch._check_value(grad_conv.shape[2 + i] + 1 - o[i] >= 1,
                           lambda: f"{op}: grad_conv {list(grad_conv.shape)} with output_padding {o} gives an empty "
                           "input")
    return o


def _check_like_grad_conv(op, name, t, grad_conv):
    _check_defined(op, name, t)
    if t.dim() != 5:
        raise ValueError(f"{op}: expected a 5-D {name}, got shape {list(t.shape)}")
    if t.dtype != grad_conv.dtype:
        raise TypeError(f"{op}: {name} dtype must equal grad_conv dtype, got {name} {t.dtype} and grad_conv "
                        f"{grad_conv.dtype}")
    if t.device != grad_conv.device:
        raise ValueError(f"{op}: {name} must be on grad_conv's device, got {t.device} and {grad_conv.device}")


@torch.library.register_fake(_GRAD_CONV_OP)
def _grad_conv_fake(grad_output, selected, offsets, multiplier, negative_slope, negative_slope2):
    op = _GRAD_CONV_OP
    for name, t in (("grad_output", grad_output), ("selected", selected), ("offsets", offsets),
                    ("multiplier", multiplier)):
        _check_defined(op, name, t)
    if not (grad_output.dim() == 5 and selected.shape == grad_output.shape and offsets.shape == grad_output.shape):
        raise ValueError(f"{op}: grad_output {list(grad_output.shape)}, selected {list(selected.shape)} and offsets "
                         f"{list(offsets.shape)} must be 5-D with equal shapes")
    if selected.dtype != grad_output.dtype and not common.is_mixed(selected.dtype, grad_output.dtype):
        raise TypeError(f"{op}: grad_output and selected must share one dtype (or be float32 and float16/bfloat16: "
                        f"the mixed form), got {grad_output.dtype} and {selected.dtype}")
    if not (selected.device == grad_output.device and offsets.device == grad_output.device):
        raise ValueError(f"{op}: grad_output, selected and offsets must be on one device")
    if offsets.dtype != torch.uint8:
        raise TypeError(f"{op}: offsets must be uint8 (2x2x2 windows), got {offsets.dtype}")
    # The convolution's dtype is selected's; grad_output has the output's (float32 in the mixed form).
    common.check_tensors(op, grad_output.shape, selected.dtype, grad_output.device, multiplier)
    out_dtype = common.output_dtype(selected.dtype, multiplier.dtype)
    if grad_output.dtype != out_dtype:
        raise TypeError(f"{op}: grad_output must be {out_dtype} (the forward output's dtype for a {selected.dtype} "
                        f"convolution and a {multiplier.dtype} multiplier), got {grad_output.dtype}")
    common.check_slopes(op, selected.dtype, negative_slope, negative_slope2)
    like = dict(dtype=selected.dtype, device=grad_output.device)
    if _is_dense(offsets):
        grad_conv = torch.empty_strided(offsets.shape, offsets.stride(), **like)
    else:
        grad_conv = torch.empty(offsets.shape, **like)
    return (grad_conv, torch.empty(grad_output.shape[1], **like),
            torch.empty(multiplier.shape, dtype=multiplier.dtype, device=grad_output.device))


@torch.library.register_fake(_GRAD_WEIGHT_OP)
def _grad_weight_fake(grad_conv, offsets, input, output_padding):
    op = _GRAD_WEIGHT_OP
    o = _check_pooled_pair(op, grad_conv, offsets, output_padding)
    _check_like_grad_conv(op, "input", input, grad_conv)
    torch._check_value(
        input.shape[0] == grad_conv.shape[0]
        and all(input.shape[2 + i] == grad_conv.shape[2 + i] + 1 - o[i] for i in range(3)),
        lambda: f"{op}: input {list(input.shape)} does not fit grad_conv {list(grad_conv.shape)} with output_padding "
        f"{o} (N equal, and D = PD + 1 - output_padding per dim)")
    return torch.empty((input.shape[1], grad_conv.shape[1], 3, 3, 3), dtype=grad_conv.dtype, device=grad_conv.device)


@torch.library.register_fake(_GRAD_INPUT_OP)
def _grad_input_fake(grad_conv, offsets, weight, output_padding):
    op = _GRAD_INPUT_OP
    o = _check_pooled_pair(op, grad_conv, offsets, output_padding)
    _check_like_grad_conv(op, "weight", weight, grad_conv)
    torch._check_value(
        weight.shape[1] == grad_conv.shape[1] and tuple(weight.shape[2:]) == (3, 3, 3),
        lambda: f"{op}: weight must be [C_in, {grad_conv.shape[1]}, 3, 3, 3] for grad_conv {list(grad_conv.shape)}, "
        f"got {list(weight.shape)}")
    n, _, pd, ph, pw = grad_conv.shape
    return torch.empty((n, weight.shape[0], pd + 1 - o[0], ph + 1 - o[1], pw + 1 - o[2]), dtype=grad_conv.dtype,
                       device=grad_conv.device, memory_format=_grad_input_format(grad_conv))

