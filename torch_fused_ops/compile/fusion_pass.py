"""Inductor graph pass: LeakyReLU -> x multiplier -> LeakyReLU -> MaxPool3d, or a suffix of it, ==> fused.post_pool.

It runs on Inductor's pre-grad graph (``config.pre_grad_custom_pass``): the Torch-level graph Dynamo produced,
before AOTAutograd. Rewriting there, rather than matching decomposed ATen patterns after AOTAutograd, means one
rule covers every dtype, inference and training alike (AOTAutograd then traces fused.post_pool's own autograd, so
the backward uses fused.post_pool_backward and only pooled-size tensors are saved), static and dynamic shapes
(symbolic slopes pass through as SymFloat), and every compile mode. It also matches the ATen spelling (as in
exported programs), so AOTInductor packages use the op too. What it folds and fuses: ``pass_config.PassConfig``.

Partial chains. Walking back from a max_pool3d, the pass takes the longest run of ``leaky(s1) -> mul(m) ->
leaky(s2)`` ending in the pool, each step optional, the missing ones as identities: ``mul -> leaky(s2) -> pool``
is ``post_pool(x, m, 1.0, negative_slope2=s2)``, ``leaky(s) -> pool`` is ``post_pool(x, 1, 1.0,
negative_slope2=s)``, ``leaky(s1) -> mul -> pool`` has s2 = 1.0, ``mul -> pool`` both slopes 1.0. These are the
pieces DDP's graph splitter (DDPOptimizer) leaves when a bucket boundary falls inside the chain (always between
the first LeakyReLU and the multiply, where the multiplier parameter is used), and shapes of models of their own.
- Forward: bit-identical. The op's leaky is ``v > 0 ? v : v * s``, and ``v * 1.0 == v`` for every float: -0.0,
  +-inf, NaN (payload kept), subnormals (built without --use_fast_math: no flush to zero). In half dtypes a
  partial chain, like the full one, rounds once from float32 where eager rounds after each step (a lone
  ``leaky -> pool`` is one step, so bit-exact there too).
- Input gradient: equal to eager's in float32, bit for bit where a window selected the element (eager's factors
  in eager's order, the missing ones exact 1.0s); elsewhere +0.0, where eager's zeros, multiplied by m and the
  slopes, may be -0.0 (as for the full chain).
  Multiplier gradient: the same products summed in another order (per channel over pooled positions, where eager
  reduces the full-resolution product). Measured in float32 on CPU, [2, 8, 6, 10, 10] and [4, 32, 16, 32, 32],
  2x2x2 pool: ``mul -> leaky -> pool`` and ``leaky -> mul -> pool`` differ from eager by at most 3.0e-8 of the sum
  of the terms' magnitudes (a quarter of float32's epsilon); op and eager are as close to float64 (1.8e-8, 1.3e-8).
  With overlapping windows eager sums an element's gradients before multiplying, the op multiplies first; the
  tests require the op to stay within twice eager's own float32 error against float64.
- The unit multiplier is a 0-d ``aten.full([], 1.0)`` node of the input's dtype and device: a constant Inductor
  builds on the device (no host sync, no new graph input), shape-independent (dynamic shapes), and ATen, so
  exported graphs accept it too. It needs no gradient.
Left to Inductor, as not worth it: a lone max_pool3d (nothing to fuse: Inductor lowers the pool itself and reads
its producer inside the window loop) and chains without a pool (elementwise ops Inductor fuses itself).

Only exact rewrites: a step failing a check stays in the graph and the match stops below it (the suffix after it
may still be fused):
- every absorbed intermediate (LeakyReLU outputs, the product) has no other user;
- a multiplier is a tensor of the input's dtype and device varying at most along the channel dim (no type
  promotion, no broadcast that changes the shape);
- the input is 5-D floating point, the pool returns no indices, and its parameters are Python ints;
- an in-place LeakyReLU is absorbed as the first step only when its input is an intermediate nobody else reads
  (not a graph input, not a view, not another in-place op's output).

Conv routes. The convolution feeding a chain (full or partial) can fold its bias into fused.post_pool_bias
(``fold_conv_bias``) or, for conv_transpose3d, join the chain in fused.conv_transpose3d_post_pool, inference and
training graphs alike (``fuse_conv_transpose``, ``conv_in_training``: see PassConfig). Its default, "cuda", takes
that route where the op's fused CUDA kernel computes the call (``coverage.fused_kernel_applies``, decided on
the graph's fake tensors: a size it cannot prove without a guard means "not this route"). A partial chain joins
with the missing steps as identities (unit multiplier, slopes 1.0), as for post_pool.
"""
from __future__ import annotations

import dataclasses
import functools
import glob
import hashlib
import inspect
import os
import sys
import weakref
from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch.fx import Graph, Node

from ..ops import conv_transpose3d_post_pool_coverage as coverage
from . import nodes, pass_config
from .nodes import (_CONV_SIGS, _CONV_TRANSPOSE3D_SIGS, _bind, _input_ok, _ints3, _known, _leaky, _mul_step,
                          _pool, _single_user, _slope, _val)

aten = torch.ops.aten
_FUSED = torch.ops.fused.post_pool.default
_FUSED_BIAS = torch.ops.fused.post_pool_bias.default
_FUSED_CONV = torch.ops.fused.conv_transpose3d_post_pool.default


@dataclasses.dataclass
class _Conv:
    """The conv_transpose3d producing the chain's input, joining fused.conv_transpose3d_post_pool."""
    input: Node
    weight: Node
    bias: Node | None
    stride: list[int]
    padding: list[int]
    output_padding: list[int]
    groups: int
    dilation: list[int]


@dataclasses.dataclass
class Match:
    """One chain the pass rewrites: ``pool(leaky(leaky(x, s1) * multiplier, s2))`` with missing steps filled in."""
    x: Node                      # the chain's input (the convolution's output when `conv` is set)
    multiplier: Node | None      # None: the chain has no multiply; the rewrite builds a unit multiplier
    s1: Any                      # float or a node holding a (symbolic) float; 1.0 where the step is missing
    s2: Any
    pool: tuple                  # kernel_size, stride ([] = kernel_size), padding, dilation, ceil_mode
    dead: list[Node]             # nodes to erase once the fused call replaces the anchor, users first
    anchor: Node                 # the node whose uses move to the fused call
    steps: tuple[str, ...]       # the absorbed steps in graph order, e.g. ("leaky", "mul", "leaky")
    bias: Node | None = None     # a convolution bias folded into fused.post_pool_bias
    conv: _Conv | None = None    # a conv_transpose3d joining the op


def _visible(x: Node) -> bool:
    """Whether a tensor mutated in place would be seen by someone else than the chain."""
    v = _val(x)
    if x.op == "placeholder" or len(x.users) != 1 or not isinstance(v, torch.Tensor) or v._is_view():
        return True
    leaky = _leaky(x)
    return leaky is not None and leaky[2]  # the output of an in-place op aliases that op's input


def _match(pool_node: Node, cfg: pass_config.PassConfig) -> Match | None:
    """The chain ending in `pool_node`, or None where nothing is worth fusing or allowed."""
    p = _pool(pool_node)
    if p is None:
        return None
    y, pool_args, pool_nodes = p
    # Walk back from the pool over [leaky1] [mul] [leaky2], each step optional; an absorbed node must feed only
    # the next step. steps: (node, kind, its chain input, slope or multiplier, in place), in graph order.
    steps: list[tuple[Node, str, Node, Any, bool]] = []
    leaky2 = _leaky(y) if _single_user(y) else None
    if leaky2 is not None and _input_ok(_val(leaky2[0]), _val(y)):
        steps.insert(0, (y, "leaky2", leaky2[0], leaky2[1], leaky2[2]))
        y = leaky2[0]
    mul = _mul_step(y) if _single_user(y) else None
    if mul is not None:
        steps.insert(0, (y, "mul", mul[0], mul[1], False))
        y = mul[0]
    leaky1 = _leaky(y) if steps and _single_user(y) else None
    if leaky1 is not None and _input_ok(_val(leaky1[0]), _val(y)):
        steps.insert(0, (y, "leaky1", leaky1[0], leaky1[1], leaky1[2]))
    # An in-place first step stays in the graph when its input is visible elsewhere (the rest may still fuse).
    while steps and steps[0][4] and _visible(steps[0][2]):
        steps.pop(0)
    kinds = tuple(s[1] for s in steps)
    if not kinds or (not cfg.partial_chains and kinds != ("leaky1", "mul", "leaky2")):
        return None  # a lone pool is left to Inductor
    params = {kind: param for _, kind, _, param, _ in steps}
    s1, s2 = _slope(params.get("leaky1", 1.0)), _slope(params.get("leaky2", 1.0))
    k = _ints3(pool_args["kernel_size"])
    st = _ints3(pool_args["stride"], empty_ok=True)
    pad, dil = _ints3(pool_args["padding"]), _ints3(pool_args["dilation"])
    ceil = pool_args["ceil_mode"]
    if None in (s1, s2, k, st, pad, dil) or not isinstance(ceil, bool):
        return None
    x = steps[0][2]
    match = Match(x=x, multiplier=params.get("mul"), s1=s1, s2=s2, pool=(k, st, pad, dil, ceil),
                  dead=[*pool_nodes, *(s[0] for s in reversed(steps))], anchor=pool_nodes[0],
                  steps=tuple(kind.rstrip("12") for kind in kinds))
    match.conv = _fusable_conv_transpose(match, cfg)
    if match.conv is not None:
        match.dead.append(x)
    else:
        match.bias = _foldable_conv_bias(x, cfg)
    return match


def _fusable_conv_transpose(match: Match, cfg: pass_config.PassConfig) -> _Conv | None:
    """The conv_transpose3d producing the chain's input, if it joins the fused op (see PassConfig)."""
    x = match.x
    if cfg.fuse_conv_transpose == "off" or x.op != "call_function" or x.target not in _CONV_TRANSPOSE3D_SIGS:
        return None
    if len(x.users) != 1:
        return None
    b = _bind(x, _CONV_SIGS[x.target], _CONV_TRANSPOSE3D_SIGS[x.target])
    if b is None or any(n not in b for n in _CONV_SIGS[x.target]):
        return None
    if not isinstance(b["input"], Node) or not isinstance(b["weight"], Node) or b.get("transposed", True) is not True:
        return None
    if b["bias"] is not None and not isinstance(b["bias"], Node):
        return None
    stride, padding, output_padding, dilation = (_ints3(b[n]) for n in ("stride", "padding", "output_padding",
                                                                        "dilation"))
    groups = b["groups"]
    if None in (stride, padding, output_padding, dilation) or type(groups) is not int:
        return None
    xv, wv, conv_out = _val(b["input"]), _val(b["weight"]), _val(x)
    bv = _val(b["bias"]) if b["bias"] is not None else None
    if not all(isinstance(t, torch.Tensor) for t in (xv, wv, conv_out)) or not cfg.fuses_conv_on(xv.device.type):
        return None
    if xv.dim() != 5 or wv.dim() != 5:  # aten.convolution of another rank
        return None
    if any(t is not None and (not isinstance(t, torch.Tensor) or t.dtype != xv.dtype or t.device != xv.device)
           for t in (wv, bv)):
        return None
    # Dynamo traced the convolution's example output under the caller's grad mode, so it requires grad exactly
    # when autograd records it (the grad mode while this pass runs is not the caller's).
    training = conv_out.requires_grad
    if training and not cfg.conv_in_training:
        return None
    if cfg.fuse_conv_transpose == "cuda" and not coverage.fused_kernel_applies(
            xv, wv, stride, padding, output_padding, groups, dilation, *match.pool):
        return None
    return _Conv(b["input"], b["weight"], b["bias"], stride, padding, output_padding, groups, dilation)


def _foldable_conv_bias(x: Node, cfg: pass_config.PassConfig) -> Node | None:
    """The bias node of the convolution producing `x`, if it may move into the fused op (see PassConfig)."""
    if cfg.fold_conv_bias == "off" or x.op != "call_function" or x.target not in _CONV_SIGS:
        return None
    if len(x.users) != 1:
        return None
    names = _CONV_SIGS[x.target]
    b = _bind(x, names, {n: None for n in names[2:]})
    if b is None or not isinstance(b["bias"], Node):
        return None
    xv, bv = _val(x), _val(b["bias"])
    if not isinstance(xv, torch.Tensor) or not isinstance(bv, torch.Tensor) or not cfg.folds_bias_on(xv.device.type):
        return None
    if not torch._C._dispatch_has_kernel_for_dispatch_key("fused::post_pool_bias", xv.device.type.upper()):
        return None  # a build without that device's post_pool_bias kernels
    if bv.dtype != xv.dtype or bv.device != xv.device or bv.dim() != 1 or not _known(bv.shape[0] == xv.shape[1]):
        return None
    return b["bias"]


def _drop_conv_bias(conv: Node) -> None:
    """Rewrites the convolution producing the chain's input to run without its bias (now in the fused op)."""
    assert _CONV_SIGS[conv.target][2] == "bias"
    if len(conv.args) > 2:
        args = list(conv.args)
        args[2] = None
        conv.args = tuple(args)
    else:
        conv.kwargs = {**conv.kwargs, "bias": None}


def _unit_multiplier(graph: Graph, like: Node) -> Node:
    """A 0-d 1.0 of `like`'s dtype and device, built inside the graph (a constant: no input, no host sync, no
    shape). ATen's full, so exported programs' graphs accept it as well as Dynamo's."""
    v = _val(like)
    one = graph.call_function(aten.full.default, ([], 1.0), {"dtype": v.dtype, "device": v.device})
    mode = getattr(v, "fake_mode", None)
    if mode is not None:
        with mode:
            fake = torch.full([], 1.0, dtype=v.dtype, device=v.device)
        for key in ("val", "example_value"):
            if key in like.meta:
                one.meta[key] = fake
    return one


def _emit(graph: Graph, match: Match) -> Node:
    """The fused call replacing `match` (inserted before its anchor)."""
    m = match.multiplier if match.multiplier is not None else _unit_multiplier(graph, match.x)
    s1, s2 = match.s1, match.s2
    second = None if (s2 is s1 or (isinstance(s1, float) and s1 == s2)) else s2
    k, st, pad, dil, ceil = match.pool
    c = match.conv
    if c is not None:
        return graph.call_function(_FUSED_CONV, (c.input, c.weight, c.bias, c.stride, c.padding, c.output_padding,
                                                 c.groups, c.dilation, m, s1, k, st, pad, dil, ceil, second))
    if match.bias is not None:
        _drop_conv_bias(match.x)
        return graph.call_function(_FUSED_BIAS, (match.x, match.bias, m, s1, k, st, pad, dil, ceil, second))
    return graph.call_function(_FUSED, (match.x, m, s1, k, st, pad, dil, ceil, second))


@functools.lru_cache(maxsize=None)
def _source_digest() -> str:
    """Hash of the source of this pass, its config and the fake/autograd code, and of the compiled library's
    identity (name, size, mtime: a rebuild changes it). Read once: uuid() runs for every compilation's cache key
    (and, on torch 2.11, whenever the hook's value is pickled). Nothing here imports the package's __init__."""
    from ..ops import common, conv_transpose3d_post_pool, post_pool

    h = hashlib.sha256()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the package, where _C lives
    for lib in sorted(glob.glob(os.path.join(here, "_C.*"))):
        st = os.stat(lib)
        h.update(f"{os.path.basename(lib)}|{st.st_size}|{st.st_mtime_ns}".encode())
    for mod in (sys.modules[__name__], nodes, pass_config, coverage, post_pool, common, conv_transpose3d_post_pool):
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
        # Compiled code bakes in this pass's output and the fake impls' strides, so the cache key covers their
        # source, the compiled library and the settings; a previous pass without a uuid makes it uncacheable.
        # cuDNN's TF32 flag is not in it: the fused convolution reads it at each call, as aten's convolution does.
        h = hashlib.sha256(f"{_source_digest()}|config={pass_config.current().compute_hash()}".encode())
        if self.previous is not None:
            prev = getattr(self.previous, "uuid", None)
            prev_id = prev() if callable(prev) else None
            if prev_id is None:
                return None
            h.update(repr(prev_id).encode())
        return h.hexdigest()


def rewrite(graph: Graph, config: pass_config.PassConfig | None = None) -> int:
    """Rewrites every match in `graph` in place under `config` (default: pass_config.current()); returns how
    many."""
    cfg = pass_config.current() if config is None else config
    count = 0
    for node in list(graph.nodes):
        if node.graph is not graph or node.op != "call_function":
            continue  # erased by an earlier match
        match = _match(node, cfg)
        if match is None:
            continue
        anchor = match.anchor
        with graph.inserting_before(anchor):
            fused = _emit(graph, match)
        for key in ("val", "example_value", "tensor_meta", "stack_trace", "nn_module_stack"):
            if key in anchor.meta:
                fused.meta[key] = anchor.meta[key]
        anchor.replace_all_uses_with(fused)
        for n in match.dead:
            graph.erase_node(n)
        count += 1
    return count

