"""Inductor graph pass: LeakyReLU -> x multiplier -> LeakyReLU -> MaxPool3d  ==>  fused.post_pool.

It runs on Inductor's pre-grad graph (``config.pre_grad_custom_pass``): the Torch-level graph Dynamo produced,
before AOTAutograd. Rewriting there, rather than matching decomposed ATen patterns after AOTAutograd, means one
rule covers every dtype (no per-dtype convert_element_type variants), inference and training alike (AOTAutograd
then traces fused.post_pool's own autograd, so the backward graph uses fused.post_pool_backward and only
pooled-size tensors are saved), static and dynamic shapes (symbolic slopes pass through as SymFloat), and
every compile mode. It also matches the ATen spelling of the chain (as in exported programs), so AOTInductor
packages built from an ExportedProgram use the fused op too.

The rewrite applies only where it computes exactly what the original graph would:
- every intermediate (both LeakyReLUs and the product) has no other user;
- the multiplier is a tensor of the input's dtype and device that varies at most along the channel dim;
- the input is 5-D floating point, the pool returns no indices, and the pool parameters are Python ints;
- an in-place first LeakyReLU is fused only when its input is an intermediate nobody else reads.
Anything else is left untouched, so the graph compiles as it would without this package.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import operator
import sys
import weakref
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch.fx import Graph, Node

aten = torch.ops.aten
_FUSED = torch.ops.fused.post_pool.default
_FUSED_BIAS = torch.ops.fused.post_pool_bias.default
_FUSED_CONV = torch.ops.fused.conv_transpose3d_post_pool.default

# Fold the bias of a convolution that feeds the chain into fused.post_pool_bias: "off", "cuda" (inputs on CUDA
# only, where Inductor would otherwise peel the bias off into a separate full-resolution add) or "always".
# "cuda" by default: on the H200 it makes the compiled Model's forward faster than without the pass (see
# docs/performance.md); on CPU Inductor keeps the bias inside the mkldnn convolution, so folding would not help.
FOLD_CONV_BIAS = "cuda"

# Route conv_transpose3d -> chain to fused.conv_transpose3d_post_pool (one Triton kernel that never writes the
# full-resolution convolution output) where its fused path applies: "off"; "cuda": CUDA inference graphs only
# (on the H200 the fused op's forward is 1.7x faster, but its training step slower than cuDNN's convolution +
# post_pool_bias; on CPU the op would only run the same convolution and post_pool); "always": every graph
# (tests: the op's composite path on CPU).
FUSE_CONV_TRANSPOSE = "cuda"

# Convolutions whose bias can be folded: (bias position, parameter names).
_CONV_SIGS = {
    torch.conv_transpose3d: ("input", "weight", "bias", "stride", "padding", "output_padding", "groups", "dilation"),
    torch.conv3d: ("input", "weight", "bias", "stride", "padding", "dilation", "groups"),
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


def _single_user(node: Node) -> bool:
    return len(node.users) == 1


def _leaky(node: Any) -> tuple[Node, Any, bool] | None:
    """(input, slope, in_place) if `node` is a LeakyReLU call."""
    if not isinstance(node, Node) or node.op != "call_function" or node.target not in _LEAKY_SIGS:
        return None
    names, defaults, inplace = _LEAKY_SIGS[node.target]
    b = _bind(node, names, defaults)
    if b is None:
        return None
    inp = b[names[0]]
    slope = b["negative_slope"]
    inplace = inplace or b.get("inplace", False) is True
    if b.get("inplace", False) not in (True, False):
        return None
    return (inp, slope, inplace) if isinstance(inp, Node) else None


def _mul_operands(node: Any) -> tuple[Any, Any] | None:
    if not isinstance(node, Node):
        return None
    if node.op == "call_function" and node.target in _MUL_TARGETS and len(node.args) == 2 and not node.kwargs:
        return node.args[0], node.args[1]
    if node.op == "call_method" and node.target == "mul" and len(node.args) == 2 and not node.kwargs:
        return node.args[0], node.args[1]
    return None


def _pool(node: Node) -> tuple[Node, dict[str, Any], list[Node]] | None:
    """(pool input, pool parameters, nodes to erase) if `node` produces max_pool3d's values without indices."""
    if node.op != "call_function":
        return None
    if node.target in _POOL_SIGS:
        b = _bind(node, _POOL_PARAMS, _POOL_SIGS[node.target])
        if b is None or b.get("return_indices", False) is not False:
            return None
        return b["input"], b, [node]
    # ATen spelling: getitem(max_pool3d_with_indices(...), 0) with the indices unused.
    if node.target is operator.getitem and node.args[1] == 0:
        src = node.args[0]
        if (isinstance(src, Node) and src.op == "call_function" and src.target is _ATEN_POOL_WITH_INDICES
                and _single_user(src)):
            b = _bind(src, _POOL_PARAMS[:6], {"stride": (), "padding": 0, "dilation": 1, "ceil_mode": False})
            if b is None:
                return None
            return b["input"], b, [node, src]
    return None


def _int3(v: Any, *, empty_ok: bool = False) -> list[int] | None:
    if v is None:
        return [] if empty_ok else None
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return [v, v, v]
    if isinstance(v, (list, tuple)) and all(isinstance(e, int) and not isinstance(e, bool) for e in v):
        if len(v) == 0 and empty_ok:
            return []
        if len(v) == 1:
            return [v[0]] * 3
        if len(v) == 3:
            return list(v)
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


def _multiplier_ok(x: Any, m: Any, out: Any) -> bool:
    """m broadcasts against x varying at most along C, with x's dtype and device, and changes no shape."""
    if not isinstance(x, torch.Tensor) or not isinstance(m, torch.Tensor) or not isinstance(out, torch.Tensor):
        return False
    if x.dim() != 5 or not x.dtype.is_floating_point or m.dtype != x.dtype or out.dtype != x.dtype:
        return False
    if m.device != x.device or m.dim() > 5:
        return False
    if _known(m.numel() == 1):
        return True
    for i, size in enumerate(m.shape):
        if _known(size == 1):
            continue
        if 5 - m.dim() + i != 1 or not _known(size == x.shape[1]):
            return False
    return True


def _match(pool_node: Node) -> tuple[list, list[Node], Node] | None:
    """Arguments for fused.post_pool, nodes to erase (users first), and the node whose uses move to it."""
    p = _pool(pool_node)
    if p is None:
        return None
    y3, pool_args, pool_nodes = p
    leaky2 = _leaky(y3)
    if leaky2 is None or not _single_user(y3):
        return None
    y2, s2, _ = leaky2
    ops = _mul_operands(y2)
    if ops is None or not _single_user(y2):
        return None
    for y1, m in (ops, ops[::-1]):
        leaky1 = _leaky(y1)
        if leaky1 is not None and _single_user(y1) and isinstance(m, Node) and m is not y1:
            break
    else:
        return None
    x, s1, inplace1 = leaky1
    if inplace1 and (x.op == "placeholder" or len(x.users) != 1):
        return None  # the in-place LeakyReLU mutates a tensor someone else can see
    if not _multiplier_ok(_val(x), _val(m), _val(y3)):
        return None
    s1, s2 = _slope(s1), _slope(s2)
    k = _int3(pool_args["kernel_size"])
    st = _int3(pool_args["stride"], empty_ok=True)
    pad = _int3(pool_args["padding"])
    dil = _int3(pool_args["dilation"])
    ceil = pool_args["ceil_mode"]
    if None in (s1, s2, k, st, pad, dil) or not isinstance(ceil, bool):
        return None
    second = None if (s2 is s1 or (isinstance(s1, float) and s1 == s2)) else s2
    conv = _fusable_conv_transpose(x, m, k, st, pad, dil, ceil)
    if conv is not None:
        return [*conv, m, s1, k, st, pad, dil, ceil, second], [*pool_nodes, y3, y2, y1, x], pool_nodes[0]
    bias = _foldable_conv_bias(x)
    if bias is not None:
        return [x, bias, m, s1, k, st, pad, dil, ceil, second], [*pool_nodes, y3, y2, y1], pool_nodes[0]
    args = [x, m, s1, k, st, pad, dil, ceil, second]
    return args, [*pool_nodes, y3, y2, y1], pool_nodes[0]


def _fusable_conv_transpose(x: Node, m: Node, k, st, pad, dil, ceil) -> list | None:
    """fused.conv_transpose3d_post_pool's convolution arguments, if the conv producing `x` can join the op."""
    if FUSE_CONV_TRANSPOSE not in ("cuda", "always") or x.op != "call_function" or x.target is not torch.conv_transpose3d:
        return None
    if len(x.users) != 1:
        return None
    names = _CONV_SIGS[x.target]
    b = _bind(x, names, {"bias": None, "stride": 1, "padding": 0, "output_padding": 0, "groups": 1, "dilation": 1})
    if b is None or not isinstance(b["input"], Node) or not isinstance(b["weight"], Node):
        return None
    if b["bias"] is not None and not isinstance(b["bias"], Node):
        return None
    stride, padding, output_padding, dilation = (_int3(b[n]) for n in ("stride", "padding", "output_padding",
                                                                       "dilation"))
    groups = b["groups"]
    if None in (stride, padding, output_padding, dilation) or not isinstance(groups, int) or isinstance(groups, bool):
        return None
    xv, wv = _val(b["input"]), _val(b["weight"])
    bv = _val(b["bias"]) if b["bias"] is not None else None
    if not isinstance(xv, torch.Tensor) or not isinstance(wv, torch.Tensor):
        return None
    if b["bias"] is not None and not isinstance(bv, torch.Tensor):
        return None
    if FUSE_CONV_TRANSPOSE == "cuda":
        if xv.device.type != "cuda":
            return None
        # A graph that will be differentiated keeps the convolution separate (see above). Dynamo traced the
        # convolution's example output under the caller's grad mode, so it requires grad exactly when autograd
        # records it (the grad mode while this pass runs is not the caller's). Either route computes the same.
        conv_out = _val(x)
        if not isinstance(conv_out, torch.Tensor) or conv_out.requires_grad:
            return None
        from . import _conv_post_pool_triton as tri

        if not tri.fused_path_applies(xv, wv, stride, padding, output_padding, groups, dilation, k,
                                      st if st else k, pad, dil, ceil):
            return None
    if wv.dtype != xv.dtype or wv.device != xv.device or (bv is not None and (bv.dtype != xv.dtype or
                                                                              bv.device != xv.device)):
        return None
    return [b["input"], b["weight"], b["bias"], stride, padding, output_padding, groups, dilation]


def _inductor_visible_conv(args: list) -> tuple[Any, list]:
    """The "cuda" conv route (an inference graph on the fused path, as _fusable_conv_transpose checked) as a call
    of fused.conv_transpose3d_post_pool_infer, the triton_op that Inductor traces into and launches itself
    (see _conv_triton_op); the public op where the slopes are not plain numbers.

    TF32 is decided here, from torch.backends.cudnn.allow_tf32 at compile time: a compiled graph keeps the choice
    it was compiled with (the pass's uuid includes the flag, so cached graphs follow it).
    """
    (x, w, b, _stride, _padding, output_padding, _groups, _dilation, m, s1, _k, _st, _pad, _dil, _ceil,
     s2) = args
    s2 = s1 if s2 is None else s2
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (s1, s2)):
        return _FUSED_CONV, args
    from . import _conv_triton_op  # registers the op; imports Triton

    return (torch.ops.fused.conv_transpose3d_post_pool_infer.default,
            [x, w, b, m, float(s1), float(s2), list(output_padding), bool(torch.backends.cudnn.allow_tf32)])


def _foldable_conv_bias(x: Node) -> Node | None:
    """The bias node of the convolution producing `x`, if it may move into the fused op (see FOLD_CONV_BIAS)."""
    if FOLD_CONV_BIAS not in ("cuda", "always") or x.op != "call_function" or x.target not in _CONV_SIGS:
        return None
    if len(x.users) != 1:
        return None
    names = _CONV_SIGS[x.target]
    b = _bind(x, names, {n: None for n in names[2:]})
    if b is None or not isinstance(b["bias"], Node):
        return None
    xv, bv = _val(x), _val(b["bias"])
    if not isinstance(xv, torch.Tensor) or not isinstance(bv, torch.Tensor):
        return None
    if FOLD_CONV_BIAS == "cuda" and xv.device.type != "cuda":
        return None
    if not torch._C._dispatch_has_kernel_for_dispatch_key("fused::post_pool_bias", xv.device.type.upper()):
        return None  # e.g. CUDA before its post_pool_bias kernels are in (docs/patches/post_pool_bias_cuda.patch)
    if bv.dtype != xv.dtype or bv.device != xv.device or bv.dim() != 1 or not _known(bv.shape[0] == xv.shape[1]):
        return None
    return b["bias"]


def _drop_conv_bias(conv: Node) -> None:
    """Rewrites the convolution producing the chain's input to run without its bias (now in the fused op)."""
    names = _CONV_SIGS[conv.target]
    if len(conv.args) > 2:
        args = list(conv.args)
        args[2] = None
        conv.args = tuple(args)
    else:
        kwargs = dict(conv.kwargs)
        kwargs["bias"] = None
        conv.kwargs = kwargs
    assert names[2] == "bias"


@functools.lru_cache(maxsize=None)
def _source_digest() -> str:
    """Hash of the package version and the source of this pass and of the fake/autograd code. Read once: uuid()
    runs for every compilation's cache key (and, on torch 2.11, whenever the hook's value is pickled)."""
    from . import __version__, _geometry, conv_ops, ops

    h = hashlib.sha256(__version__.encode())
    for mod in (sys.modules[__name__], ops, _geometry, conv_ops):
        h.update(inspect.getsource(mod).encode())
    try:  # the Triton kernels and their launchers (the conv route's fake strides and code come from them)
        from . import (_conv_post_pool_gemm_triton, _conv_post_pool_phase_gemm_triton, _conv_post_pool_triton,
                       _conv_triton_op)
    except ImportError:  # no Triton: the conv route cannot take the fused path
        return h.hexdigest()
    for mod in (_conv_post_pool_triton, _conv_post_pool_gemm_triton, _conv_post_pool_phase_gemm_triton,
                _conv_triton_op):
        h.update(inspect.getsource(mod).encode())
    return h.hexdigest()


# Match counters live outside the pass objects: some torch releases pickle the hook's value into Inductor's
# cache key, and counters that change after every compilation would then make every lookup miss.
_COUNTS: "weakref.WeakKeyDictionary[PostPoolFusionPass, list[int]]" = weakref.WeakKeyDictionary()


class PostPoolFusionPass(CustomGraphPass):
    """Pre-grad pass rewriting the epilogue chain to fused.post_pool; composes with a previously set pass."""

    total_matched = 0  # matches by every instance since import: what torch_fused_ops.matched_count() reports

    def __init__(self, previous: Any = None):
        self.previous = previous

    @property
    def matched_count(self) -> int:
        """Matches over the life of this pass object."""
        return _COUNTS.get(self, [0, 0])[0]

    @property
    def last_matched_count(self) -> int:
        """Matches in the most recent graph."""
        return _COUNTS.get(self, [0, 0])[1]

    def __call__(self, graph: Graph) -> None:
        n = rewrite(graph)
        counts = _COUNTS.setdefault(self, [0, 0])
        counts[0] += n
        counts[1] = n
        PostPoolFusionPass.total_matched += n
        if self.previous is not None:
            self.previous(graph)

    # What a pickle (or a cache key built from one) sees: what the pass does, not how often it ran.
    def __getstate__(self) -> dict:
        return {"previous": self.previous, "uuid": self.uuid()}

    def __setstate__(self, state: dict) -> None:
        self.previous = state["previous"]

    def uuid(self) -> Any:
        # Compiled code bakes in this pass's output and the fake impls' strides, so the cache key covers
        # their source and the package version; a previous pass without a uuid makes the whole thing uncacheable.
        h = hashlib.sha256(
            f"{_source_digest()}|fold_conv_bias={FOLD_CONV_BIAS}|fuse_conv_transpose={FUSE_CONV_TRANSPOSE}"
            f"|cudnn_tf32={torch.backends.cudnn.allow_tf32}".encode())
        if self.previous is not None:
            prev = getattr(self.previous, "uuid", None)
            prev_id = prev() if callable(prev) else None
            if prev_id is None:
                return None
            h.update(repr(prev_id).encode())
        return h.hexdigest()


def rewrite(graph: Graph) -> int:
    """Rewrites every match in `graph` in place; returns how many."""
    count = 0
    for node in list(graph.nodes):
        if node.graph is not graph or node.op != "call_function":
            continue  # erased by an earlier match
        m = _match(node)
        if m is None:
            continue
        args, dead, anchor = m
        with_bias = len(args) == 10
        if with_bias:
            _drop_conv_bias(args[0])
        target = _FUSED_CONV if len(args) == 16 else _FUSED_BIAS if with_bias else _FUSED
        if target is _FUSED_CONV and FUSE_CONV_TRANSPOSE == "cuda":
            target, args = _inductor_visible_conv(args)
        with graph.inserting_before(anchor):
            fused = graph.call_function(target, tuple(args))
        for key in ("val", "example_value", "tensor_meta", "stack_trace", "nn_module_stack"):
            if key in anchor.meta:
                fused.meta[key] = anchor.meta[key]
        anchor.replace_all_uses_with(fused)
        for n in dead:
            graph.erase_node(n)
        count += 1
    return count
