"""Reading the FX nodes of a pre-grad or exported graph for the fusion pass: which call a node is (LeakyReLU,
multiply, max_pool3d, convolution, in any of the spellings Dynamo and torch.export produce), its arguments by
parameter name, its example value, and the checks on those values that keep a rewrite exact."""
from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx import Node

from ..ops.common import expand3

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


def _known(expr: Any) -> bool:
    """True only when `expr` holds for every value the compiled graph can see (no new guards)."""
    try:
        from torch.fx.experimental.symbolic_shapes import statically_known_true

        return bool(statically_known_true(expr))
    except Exception:  # pragma: no cover - very old torch
        return bool(expr) if isinstance(expr, bool) else False


def _single_user(node: Any) -> bool:
    return isinstance(node, Node) and len(node.users) == 1


def _leaky(node: Any) -> tuple[Node, Any, bool] | None:
    """(input, slope, in_place) if `node` is a LeakyReLU call."""
    if not isinstance(node, Node) or node.op != "call_function" or node.target not in _LEAKY_SIGS:
        return None
    names, defaults, inplace = _LEAKY_SIGS[node.target]
    b = _bind(node, names, defaults)
    if b is None or b.get("inplace", False) not in (True, False):
        return None
    inp = b[names[0]]
    inplace = inplace or b.get("inplace", False) is True
    return (inp, b["negative_slope"], inplace) if isinstance(inp, Node) else None


def _mul_operands(node: Any) -> tuple[Any, Any] | None:
    if not isinstance(node, Node) or len(node.args) != 2 or node.kwargs:
        return None
    if (node.op == "call_function" and node.target in _MUL_TARGETS) or (node.op == "call_method"
                                                                        and node.target == "mul"):
        return node.args[0], node.args[1]
    return None


def _pool(node: Node) -> tuple[Node, dict[str, Any], list[Node]] | None:
    """(pool input, pool parameters, nodes to erase) if `node` produces max_pool3d's values without indices."""
    if node.op != "call_function":
        return None
    if node.target in _POOL_SIGS:
        b = _bind(node, _POOL_PARAMS, _POOL_SIGS[node.target])
        if b is None or b.get("return_indices", False) is not False or not isinstance(b["input"], Node):
            return None
        return b["input"], b, [node]
    # ATen spelling: getitem(max_pool3d_with_indices(...), 0) with the indices unused.
    if node.target is operator.getitem and node.args[1] == 0:
        src = node.args[0]
        if (isinstance(src, Node) and src.op == "call_function" and src.target is _ATEN_POOL_WITH_INDICES
                and _single_user(src)):
            b = _bind(src, _POOL_PARAMS[:6], {"stride": (), "padding": 0, "dilation": 1, "ceil_mode": False})
            if b is None or not isinstance(b["input"], Node):
                return None
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


def _input_ok(x: Any, out: Any) -> bool:
    """A 5-D floating-point tensor whose step keeps its dtype."""
    return (isinstance(x, torch.Tensor) and isinstance(out, torch.Tensor) and x.dim() == 5
            and x.dtype.is_floating_point and out.dtype == x.dtype)


def _multiplier_ok(x: Any, m: Any, out: Any) -> bool:
    """m broadcasts against x varying at most along C, with x's dtype and device, and changes no shape."""
    if not _input_ok(x, out) or not isinstance(m, torch.Tensor):
        return False
    if m.dtype != x.dtype or m.device != x.device or m.dim() > 5:
        return False
    if _known(m.numel() == 1):
        return True
    for i, size in enumerate(m.shape):
        if _known(size == 1):
            continue
        if 5 - m.dim() + i != 1 or not _known(size == x.shape[1]):
            return False
    return True


def _mul_step(node: Node) -> tuple[Node, Node] | None:
    """(chain input, multiplier) of a product the chain may absorb; the chain operand a LeakyReLU if either is."""
    ops = _mul_operands(node)
    if ops is None:
        return None
    orders = sorted((ops, ops[::-1]), key=lambda o: _leaky(o[0]) is None)
    for x, m in orders:
        if isinstance(x, Node) and isinstance(m, Node) and x is not m and _multiplier_ok(_val(x), _val(m),
                                                                                         _val(node)):
            return x, m
    return None
