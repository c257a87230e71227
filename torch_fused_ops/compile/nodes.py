"""Reading the FX nodes of a pre-grad or exported graph for the fusion pass: which call a node is (LeakyReLU,
multiply, max_pool3d, convolution, in any of the spellings Dynamo and torch.export produce), its arguments by
parameter name, its example value, and the checks on those values that keep a rewrite exact (each saying why it
fails, for the pass's log)."""
from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx import Node

from ..ops import common
from ..ops.common import dtype_name as _dtype
from ..ops.common import expand3
from ..ops.common import known_true as _known

aten = torch.ops.aten

# Convolutions whose bias can be folded, by their parameter names (bias third in each), in Dynamo's spelling and
# in the ATen spelling of exported programs (as exported, and after run_decompositions: aten.convolution).
_CONV_TRANSPOSE3D_PARAMS = ("input", "weight", "bias", "stride", "padding", "output_padding", "groups", "dilation")
_CONV3D_PARAMS = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
_CONV_SIGS = {
    torch.conv_transpose3d: _CONV_TRANSPOSE3D_PARAMS,
    aten.conv_transpose3d.input: _CONV_TRANSPOSE3D_PARAMS,
    torch.conv3d: _CONV3D_PARAMS,
    aten.conv3d.default: _CONV3D_PARAMS,
    aten.convolution.default: ("input", "weight", "bias", "stride", "padding", "dilation", "transposed",
                               "output_padding", "groups"),
}
# Those that may be a 3-D transposed convolution (aten.convolution when its `transposed` is True and the weight
# 5-D), with their defaults.
_CONV_TRANSPOSE3D_DEFAULTS = {"bias": None, "stride": 1, "padding": 0, "output_padding": 0, "groups": 1,
                              "dilation": 1}
_CONV_TRANSPOSE3D_SIGS = {
    torch.conv_transpose3d: _CONV_TRANSPOSE3D_DEFAULTS,
    aten.conv_transpose3d.input: _CONV_TRANSPOSE3D_DEFAULTS,
    aten.convolution.default: {},
}

# (target, positional parameter names, defaults, in place?)
_LEAKY_SIGS: dict[Any, tuple[tuple[str, ...], dict[str, Any], bool]] = {
    F.leaky_relu: (("input", "negative_slope", "inplace"), {"negative_slope": 0.01, "inplace": False}, False),
    torch._C._nn.leaky_relu: (("input", "negative_slope"), {"negative_slope": 0.01}, False),
    aten.leaky_relu.default: (("self", "negative_slope"), {"negative_slope": 0.01}, False),
    F.leaky_relu_: (("input", "negative_slope"), {"negative_slope": 0.01}, True),
    torch._C._nn.leaky_relu_: (("input", "negative_slope"), {"negative_slope": 0.01}, True),
}
_MUL_TARGETS = {operator.mul, torch.mul, torch.Tensor.mul, aten.mul.Tensor}
_POOL_PARAMS = ("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices")
_POOL_SIGS: dict[Any, dict[str, Any]] = {
    F.max_pool3d: {"stride": None, "padding": 0, "dilation": 1, "ceil_mode": False, "return_indices": False},
    torch.max_pool3d: {"stride": (), "padding": 0, "dilation": 1, "ceil_mode": False},
    aten.max_pool3d.default: {"stride": (), "padding": 0, "dilation": 1, "ceil_mode": False},  # torch.export
}
_ATEN_POOL_WITH_INDICES = aten.max_pool3d_with_indices.default


def _bind(node: Node, names: Sequence[str], defaults: dict[str, Any]) -> dict[str, Any] | None:
    """Arguments of a call by parameter name, or None when the call has arguments we do not know."""
    if len(node.args) > len(names):
        return None
    bound = dict(defaults)
    bound.update(zip(names, node.args))
    for k, v in node.kwargs.items():
        if k not in names:
            return None
        bound[k] = v
    return bound if all(n in bound for n in names[:1]) else None


def _val(x: Any) -> Any:
    """The example value of a node (fake tensor or symbolic scalar), or the constant itself."""
    if isinstance(x, Node):
        return x.meta.get("val", x.meta.get("example_value"))
    return x


def _single_user(node: Any) -> bool:
    return isinstance(node, Node) and len(node.users) == 1


def _other_users(node: Node, consumer: Node) -> str | None:
    """Why `node` may not be absorbed into `consumer`'s step: the users it has besides it; None if none."""
    others = [u.name for u in node.users if u is not consumer]
    return f"its output has other users ({', '.join(others)})" if others else None


def _describe(x: Any) -> str:
    """What a node is, for a reason: "a graph input", "conv_transpose3d", "method mul", ..."""
    if not isinstance(x, Node):
        return f"the constant {x!r}"
    if x.op == "placeholder":
        return "a graph input"
    if x.op == "call_function":
        return getattr(x.target, "__name__", None) or str(x.target)
    return f"{x.op.removeprefix('call_')} {x.target}"


def _named(x: Node) -> str:
    """A node as a reason names it: its name, and what it is where the name does not say."""
    what = _describe(x)
    return x.name if x.name.startswith(what.split(".")[0]) else f"{x.name} ({what})"


def _is_leaky(node: Any) -> bool:
    return isinstance(node, Node) and node.op == "call_function" and node.target in _LEAKY_SIGS


def _is_mul(node: Any) -> bool:
    return isinstance(node, Node) and ((node.op == "call_function" and node.target in _MUL_TARGETS)
                                       or (node.op == "call_method" and node.target == "mul"))


def _leaky(node: Any) -> tuple[Node, Any, bool] | None:
    """(input, slope, in_place) if `node` is a LeakyReLU call whose arguments we can read."""
    if not _is_leaky(node):
        return None
    names, defaults, inplace = _LEAKY_SIGS[node.target]
    b = _bind(node, names, defaults)
    if b is None or b.get("inplace", False) not in (True, False):
        return None
    inp = b[names[0]]
    inplace = inplace or b.get("inplace", False) is True
    return (inp, b["negative_slope"], inplace) if isinstance(inp, Node) else None


def _mul_operands(node: Any) -> tuple[Any, Any] | None:
    if not _is_mul(node) or len(node.args) != 2 or node.kwargs:
        return None
    return node.args[0], node.args[1]


def _pool(node: Node) -> tuple[Node, dict[str, Any], list[Node]] | str | None:
    """(pool input, pool parameters, nodes to erase) if `node` produces max_pool3d's values without indices; why
    not if it is a max_pool3d the pass cannot take; None if it is none."""
    if node.op != "call_function":
        return None
    if node.target in _POOL_SIGS:
        b = _bind(node, _POOL_PARAMS, _POOL_SIGS[node.target])
        if b is None:
            return "its arguments cannot be read"
        if b.get("return_indices", False) is not False:
            return "the pool returns indices"
        return (b["input"], b, [node]) if isinstance(b["input"], Node) else "its input is not a graph tensor"
    # ATen spelling: getitem(max_pool3d_with_indices(...), 0) with the indices unused.
    if node.target is operator.getitem and node.args[1] == 0:
        src = node.args[0]
        if isinstance(src, Node) and src.op == "call_function" and src.target is _ATEN_POOL_WITH_INDICES:
            if not _single_user(src):
                return "the pool's indices are used"
            b = _bind(src, _POOL_PARAMS[:6], {"stride": (), "padding": 0, "dilation": 1, "ceil_mode": False})
            if b is None or not isinstance(b["input"], Node):
                return "its arguments cannot be read"
            return b["input"], b, [node, src]
    return None


def _ints3(v: Any, *, empty_ok: bool = False) -> list[int] | None:
    """An int or a 1-/3-sequence of Python ints as three ints (expand3's rule); None for anything else (a
    symbolic int, a bool, another length), which the matcher refuses rather than raise on."""
    if v is None:
        return [] if empty_ok else None
    if isinstance(v, (list, tuple)):
        if not all(type(e) is int for e in v):
            return None
    elif type(v) is not int:
        return None
    try:
        return list(expand3("pool/conv parameter", v, allow_empty_as=[] if empty_ok else None))
    except ValueError:
        return None


def _slope(v: Any) -> Any:
    """A slope we can pass on: a Python number, or a node holding a (symbolic) float."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, Node) and isinstance(_val(v), (float, torch.SymFloat)):
        return v
    return None


def _input_problem(x: Any, out: Any, out_dtype: torch.dtype | None = None) -> str | None:
    """Why a step's input is not a 5-D floating-point tensor whose step gives `out_dtype` (default: keeps x's
    dtype); None if it is."""
    if not isinstance(x, torch.Tensor) or not isinstance(out, torch.Tensor):
        return "its input or output has no example tensor"
    if x.dim() != 5:
        return f"its input is {x.dim()}-D; the fused ops take 5-D tensors"
    if not x.dtype.is_floating_point:
        return f"its input is {_dtype(x)}, not floating point"
    if out.dtype != (x.dtype if out_dtype is None else out_dtype):
        return f"it changes the dtype ({_dtype(x)} -> {_dtype(out)})"
    return None


def _multiplier_problem(x: Any, m: Any, out: Any) -> str | None:
    """Why m does not broadcast against x varying at most along C, with x's dtype and device, changing no shape;
    None if it does."""
    if not isinstance(m, torch.Tensor):
        return f"the multiplier is {type(m).__name__}, not a tensor"
    # torch.autocast's chain: a float16/bfloat16 activation times a float32 parameter promotes to float32, which
    # the fused ops compute (their mixed form); any other promotion stays in the graph.
    # (A 0-dim multiplier promotes nothing: that product keeps x's dtype, so its dtypes differ and it stays.)
    mixed = isinstance(x, torch.Tensor) and common.is_mixed(x.dtype, m.dtype) and m.dim() > 0
    if isinstance(x, torch.Tensor) and m.dtype != x.dtype and not mixed:
        return (f"the multiply promotes {_dtype(x)} * {_dtype(m)} (of the promoting products only a float32 "
                "multiplier of a float16/bfloat16 input fuses)")
    why = _input_problem(x, out, m.dtype if mixed else None)
    if why is not None:
        return why
    if m.device != x.device:
        return f"the multiplier is on {m.device}, the input on {x.device}"
    if m.dim() > 5:
        return f"the multiplier is {m.dim()}-D, more than the input"
    if _known(m.numel() == 1):
        return None
    for i, size in enumerate(m.shape):
        if _known(size == 1):
            continue
        dim, channels = 5 - m.dim() + i, x.shape[1]
        if dim != 1:
            unproven = "" if _known(size != 1) else ", not provably 1 without a guard"
            return (f"the multiplier {list(m.shape)} broadcasts along the input's dim {dim} (size {size}{unproven}), "
                    "not only along its channels")
        if not _known(size == channels):
            unproven = "" if _known(size != channels) else ", not provably equal without a guard"
            return f"the multiplier {list(m.shape)} has {size} channels where the input has {channels}{unproven}"
    return None


def _mul_step(node: Node) -> tuple[Node, Node] | str | None:
    """(chain input, multiplier) of a product the chain may absorb, the chain operand a LeakyReLU if either is; why
    not if `node` is a product it may not absorb (the reason for the preferred operand order); None if none."""
    ops = _mul_operands(node)
    if ops is None:
        return "its arguments cannot be read" if _is_mul(node) else None
    orders = sorted((ops, ops[::-1]), key=lambda o: _leaky(o[0]) is None)
    reasons = []
    for x, m in orders:
        if not isinstance(x, Node) or not isinstance(m, Node):
            reasons.append(f"the multiplier is {_describe(m if isinstance(x, Node) else x)}, not a graph tensor")
        elif x is m:
            reasons.append("it squares its input")
        else:
            why = _multiplier_problem(_val(x), _val(m), _val(node))
            if why is None:
                return x, m
            reasons.append(why)
    return reasons[0]
