"""Inductor pre-grad pass: LeakyReLU -> x multiplier -> LeakyReLU -> MaxPool3d, or a suffix of it, and the
convolution feeding it ==> fused.post_pool, fused.post_pool_bias or fused.conv_transpose3d_post_pool.

Contract: only exact rewrites (a step failing a check stays in the graph, and the suffix after it may still fuse),
no new guards, the same rule for every dtype, inference and training, static and dynamic shapes. Every decision
(each fused chain, refused step and route, with its reason) goes to this module's logger (a child of
``torch_fused_ops``) at DEBUG and to each active ``recording()`` (``torch_fused_ops.explain``). Settings:
``pass_config.PassConfig``; what it matches, its routes and numerics: docs/design.md#the-inductor-pass.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import glob
import hashlib
import importlib
import inspect
import logging
import os
import re
import sys
import weakref
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch.fx import Graph, Node

from ..ops import conv_transpose3d_post_pool_coverage as coverage
from . import nodes, pass_config
from .nodes import (_CONV_SIGS, _CONV_TRANSPOSE3D_SIGS, _bind, _describe, _input_problem, _ints3, _is_leaky,
                    _is_mul, _known, _leaky, _mul_step, _named, _other_users, _pool, _slope, _val)

aten = torch.ops.aten
log = logging.getLogger(__name__)
_FUSED = torch.ops.fused.post_pool.default
_FUSED_BIAS = torch.ops.fused.post_pool_bias.default
_FUSED_CONV = torch.ops.fused.conv_transpose3d_post_pool.default
_OP_NAMES = {_FUSED: "fused.post_pool", _FUSED_BIAS: "fused.post_pool_bias",
             _FUSED_CONV: "fused.conv_transpose3d_post_pool"}
_LABELS = {"leaky1": "leaky_relu", "mul": "mul", "leaky2": "leaky_relu"}


@dataclasses.dataclass(frozen=True)
class Decision:
    """One decision of the pass, as logged and as a ``recording()`` collects it."""

    kind: str                      # "fused", "refused" (a step, or a whole chain, left in the graph) or "route"
    node: str                      # the graph node it is about: the refused one, or the pool ending the chain
    what: str                      # the op the chain became, the refused step ("mul", "bias fold"...), the route
    reasons: tuple[str, ...] = ()  # why (coverage refusals are conv_transpose3d_post_pool_coverage.Reason)
    chain: str = ""                # the pool ending the chain it belongs to
    steps: tuple[str, ...] = ()    # "fused": the absorbed steps in graph order
    where: str = ""                # "file:line in function: code" from the node's stack trace, "" without one

    def __str__(self) -> str:
        why = f": {'; '.join(self.reasons)}" if self.reasons else ""
        at = f" at {self.where}" if self.where else ""
        if self.kind == "fused":
            return f"fused {' -> '.join(self.steps)} into {self.what} (chain ending at {self.chain}){at}{why}"
        if self.kind == "route":
            return f"route of the chain ending at {self.chain}: {self.what}{why}"
        whose = f" (chain ending at {self.chain})" if self.chain != self.node else ""
        return f"refused {self.label}{whose}{at}{why}"

    @property
    def label(self) -> str:
        """The refused step and its node ("conv_transpose3d y"), the node alone where its name says what it is."""
        return self.node if self.node.startswith(self.what) else f"{self.what} {self.node}"


class Recording:
    """The decisions of the pass while this recording is active, one list per graph the pass ran on."""

    def __init__(self) -> None:
        self.graphs: list[list[Decision]] = []


_recordings: list[Recording] = []


@contextlib.contextmanager
def recording() -> Iterator[Recording]:
    """Context manager: collect every decision of the pass (any thread, any pass object) while it holds."""
    rec = Recording()
    _recordings.append(rec)
    try:
        yield rec
    finally:
        _recordings.remove(rec)


def _listening() -> bool:
    """Whether a decision goes anywhere: reasons and source locations are built only then (every compilation runs
    the pass)."""
    return bool(_recordings) or log.isEnabledFor(logging.DEBUG)


def _report(decision: Decision) -> None:
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s", decision)
    for rec in _recordings:
        if not rec.graphs:  # _match called outside rewrite()
            rec.graphs.append([])
        rec.graphs[-1].append(decision)


_FRAME = re.compile(r'\s*File "(.+)", line (\d+), in (.+)')


def _where(node: Node) -> str:
    """The user code that made `node` (its stack trace's innermost frame), "" where the graph has no trace."""
    lines = (node.meta.get("stack_trace") or "").rstrip().splitlines()
    for i in range(len(lines) - 1, -1, -1):
        m = _FRAME.match(lines[i])
        if m:
            path = os.path.relpath(m[1])
            path = m[1] if path.startswith("..") else path
            code = lines[i + 1].strip() if i + 1 < len(lines) else ""
            return f"{path}:{m[2]} in {m[3]}" + (f": {code}" if code else "")
    return ""


def _refuse(node: Node, what: str, reasons: Any, chain: Node) -> None:
    """Reports a step, or the chain ending at `chain`, left in the graph; returns None (what the caller does)."""
    if not _listening():
        return
    reasons = (reasons,) if isinstance(reasons, str) else tuple(reasons)
    _report(Decision("refused", node.name, what, reasons, chain.name, where=_where(node)))


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
    route: tuple[str, ...] = ()  # why the chain takes its route (fused convolution, bias folded, post_pool)


class _Step(NamedTuple):
    node: Node     # the absorbed node
    kind: str      # "leaky1", "mul" or "leaky2"
    input: Node    # its chain input
    param: Any     # slope or multiplier
    in_place: bool


def _visible(x: Node) -> str | None:
    """Why a tensor mutated in place would be seen by someone else than the chain; None if it would not."""
    v = _val(x)
    if x.op == "placeholder":
        return "is a graph input"
    if len(x.users) != 1:
        return "has other users"
    if not isinstance(v, torch.Tensor) or v._is_view():
        return "is a view (or has no example tensor)"
    leaky = _leaky(x)
    # The output of an in-place op aliases that op's input.
    return "is the output of another in-place LeakyReLU" if leaky is not None and leaky[2] else None


def _leaky_step(y: Node, kind: str, consumer: Node, chain: Node) -> _Step | None:
    """`y` as the chain's `kind` step feeding `consumer`, if it is a LeakyReLU the chain may absorb."""
    if not _is_leaky(y):
        return None
    why = _other_users(y, consumer)
    leaky = _leaky(y) if why is None else None
    if why is None and leaky is None:
        why = "its arguments cannot be read"
    if why is None:
        why = _input_problem(_val(leaky[0]), _val(y))
    if why is not None:
        return _refuse(y, "leaky_relu", why, chain)
    return _Step(y, kind, leaky[0], leaky[1], leaky[2])


def _mul_step_at(y: Node, consumer: Node, chain: Node) -> _Step | None:
    """`y` as the chain's multiply feeding `consumer`, if it is a product the chain may absorb."""
    if not _is_mul(y):
        return None
    mul = _other_users(y, consumer) or _mul_step(y)
    if isinstance(mul, str):
        return _refuse(y, "mul", mul, chain)
    return None if mul is None else _Step(y, "mul", mul[0], mul[1], False)


def _walk(y: Node, consumer: Node, chain: Node) -> list[_Step]:
    """The steps before the pool, in graph order: walking back over [leaky1] [mul] [leaky2], each optional, an
    absorbed node feeding only the next step. Each step refused on the way is reported."""
    steps: list[_Step] = []
    for kind in ("leaky2", "mul", "leaky1"):
        if kind == "leaky1" and not steps:
            break
        step = _mul_step_at(y, consumer, chain) if kind == "mul" else _leaky_step(y, kind, consumer, chain)
        if step is not None:
            steps.insert(0, step)
            y, consumer = step.input, step.node
    # An in-place first step stays in the graph when its input is visible elsewhere (the rest may still fuse).
    while steps and steps[0].in_place:
        why = _visible(steps[0].input)
        if why is None:
            break
        _refuse(steps[0].node, _LABELS[steps[0].kind], f"it works in place on {steps[0].input.name}, which {why}",
                chain)
        steps.pop(0)
    return steps


def _chain_problem(steps: list[_Step], pool_input: Node, cfg: pass_config.PassConfig) -> str | None:
    """Why the steps found do not make a chain to fuse; None if they do."""
    kinds = tuple(s.kind for s in steps)
    if not kinds:  # a lone pool is left to Inductor
        return (f"nothing to fuse before the pool: its input {_named(pool_input)} is no LeakyReLU or multiply the "
                "chain may absorb (left to Inductor)")
    if not cfg.partial_chains and kinds != ("leaky1", "mul", "leaky2"):
        return f"partial chain ({', '.join(_LABELS[k] for k in kinds)}) with PassConfig.partial_chains=False"
    return None


def _pool_params(steps: list[_Step], pool_args: dict[str, Any]) -> tuple | str:
    """(s1, s2, (kernel_size, stride, padding, dilation, ceil_mode)), or why they cannot be passed on."""
    params = {s.kind: s.param for s in steps}
    slopes = []
    for kind in ("leaky1", "leaky2"):
        slopes.append(_slope(params.get(kind, 1.0)))
        if slopes[-1] is None:
            return f"a LeakyReLU's negative_slope is {params[kind]!r}, not a number or a symbolic float"
    pool = [_ints3(pool_args["kernel_size"]), _ints3(pool_args["stride"], empty_ok=True)]
    pool += [_ints3(pool_args["padding"]), _ints3(pool_args["dilation"])]
    for name, v in zip(("kernel_size", "stride", "padding", "dilation"), pool):
        if v is None:
            return f"the pool's {name} is {pool_args[name]!r}, not an int or 1 or 3 Python ints"
    if not isinstance(pool_args["ceil_mode"], bool):
        return f"the pool's ceil_mode is {pool_args['ceil_mode']!r}, not a Python bool"
    return slopes[0], slopes[1], (*pool, pool_args["ceil_mode"])


def _match(pool_node: Node, cfg: pass_config.PassConfig) -> Match | None:
    """The chain ending in `pool_node`, or None where nothing is worth fusing or allowed (reported with why)."""
    p = _pool(pool_node)
    if isinstance(p, str):
        return _refuse(pool_node, "max_pool3d", p, pool_node)
    if p is None:
        return None
    y, pool_args, pool_nodes = p
    steps = _walk(y, pool_nodes[-1], pool_node)
    why = _chain_problem(steps, y, cfg)
    params = _pool_params(steps, pool_args) if why is None else why
    if isinstance(params, str):
        return _refuse(pool_node, "max_pool3d", params, pool_node)
    s1, s2, pool = params
    x = steps[0].input
    match = Match(x=x, multiplier={s.kind: s.param for s in steps}.get("mul"), s1=s1, s2=s2, pool=pool,
                  dead=[*pool_nodes, *(s.node for s in reversed(steps))], anchor=pool_nodes[0],
                  steps=tuple(s.kind.rstrip("12") for s in steps))
    _choose_route(match, cfg)
    return match


def _choose_route(match: Match, cfg: pass_config.PassConfig) -> None:
    """Joins the convolution producing the chain's input, or folds its bias, or neither; reports each refusal and
    the route with why."""
    x, chain = match.x, match.anchor
    match.conv, conv_why = _fusable_conv_transpose(match, cfg)
    if match.conv is not None:
        match.dead.append(x)
        match.route = conv_why
        return
    if conv_why:
        _refuse(x, "conv_transpose3d", conv_why, chain)
    match.bias, bias_why = _foldable_conv_bias(x, cfg)
    not_joined = (f"conv_transpose3d not joined ({'; '.join(conv_why)})",) if conv_why else ()
    if match.bias is not None:
        match.route = (*not_joined, *bias_why)
        return
    if bias_why:
        _refuse(x, "bias fold", bias_why, chain)
    not_folded = (f"bias not folded ({'; '.join(bias_why)})",) if bias_why else ()
    match.route = (*not_joined, *not_folded) or (f"its input {_named(x)} is no convolution",)


def _conv_transpose_call(x: Node) -> tuple[_Conv, tuple] | str | None:
    """The conv_transpose3d call producing x as a _Conv with its example values (input, weight, bias, output); why
    not where x is a transposed convolution the fused op cannot take; None where it is none."""
    b = _bind(x, _CONV_SIGS[x.target], _CONV_TRANSPOSE3D_SIGS[x.target])
    if b is None or any(n not in b for n in _CONV_SIGS[x.target]):
        return "its arguments cannot be read"
    if b.get("transposed", True) is not True:
        return None  # a forward convolution (aten.convolution): only its bias may fold
    if not isinstance(b["input"], Node) or not isinstance(b["weight"], Node):
        return "its input or weight is not a graph tensor"
    if b["bias"] is not None and not isinstance(b["bias"], Node):
        return f"its bias is {_describe(b['bias'])}, not a graph tensor"
    ints = {n: _ints3(b[n]) for n in ("stride", "padding", "output_padding", "dilation")}
    for name, v in ints.items():
        if v is None:
            return f"its {name} is {b[name]!r}, not an int or 1 or 3 Python ints"
    if type(b["groups"]) is not int:
        return f"its groups is {b['groups']!r}, not a Python int"
    values = (_val(b["input"]), _val(b["weight"]), _val(b["bias"]) if b["bias"] is not None else None, _val(x))
    if not all(isinstance(t, torch.Tensor) for t in values[:2] + values[3:]):
        return "its tensors have no example values"
    conv = _Conv(b["input"], b["weight"], b["bias"], ints["stride"], ints["padding"], ints["output_padding"],
                 b["groups"], ints["dilation"])
    return conv, values


def _fusable_conv_transpose(match: Match, cfg: pass_config.PassConfig) -> tuple[_Conv | None, tuple[str, ...]]:
    """The conv_transpose3d producing the chain's input if it joins the fused op (see PassConfig), and why it
    does or does not (nothing to say where the input is not a transposed convolution)."""
    x = match.x
    if x.op != "call_function" or x.target not in _CONV_TRANSPOSE3D_SIGS:
        return None, ()
    call = _conv_transpose_call(x)
    if call is None or isinstance(call, str):
        return None, (call,) if call else ()
    if cfg.fuse_conv_transpose == "off":
        return None, ("fused convolution off (PassConfig.fuse_conv_transpose='off')",)
    if len(x.users) != 1:
        return None, (f"its output has {len(x.users)} users ({', '.join(u.name for u in x.users)})",)
    conv, (xv, wv, bv, conv_out) = call
    if xv.dim() != 5 or wv.dim() != 5:  # aten.convolution of another rank
        return None, (f"it is not a 3-D convolution (input {xv.dim()}-D, weight {wv.dim()}-D)",)
    if any(t is not None and (not isinstance(t, torch.Tensor) or t.dtype != xv.dtype or t.device != xv.device)
           for t in (wv, bv)):
        return None, ("its weight or bias differs from its input in dtype or device",)
    # Its output's dtype differs from its input's only where torch.autocast cast the call (float32 operands, a
    # float16/bfloat16 result): the fused op's autocast kernel casts the same operands to the same dtype there.
    if conv_out.dtype != xv.dtype and not (xv.dtype == torch.float32 and
                                           conv_out.dtype in (torch.float16, torch.bfloat16)):
        return None, (f"it computes {nodes._dtype(conv_out)} from {nodes._dtype(xv)} operands, not as torch.autocast "
                      "casts a float32 convolution",)
    reasons: list[str] = []
    # Dynamo traced the convolution's example output under the caller's grad mode, so it requires grad exactly
    # when autograd records it (the grad mode while this pass runs is not the caller's).
    if conv_out.requires_grad and not cfg.conv_in_training:
        reasons.append("a training graph, with PassConfig.conv_in_training=False")
    if cfg.fuse_conv_transpose == "cuda":  # every coverage reason, "not CUDA" included, for the log and explain
        reasons += coverage.unsupported_reasons(xv, wv, conv.stride, conv.padding, conv.output_padding,
                                                conv.groups, conv.dilation, *match.pool)
    if reasons:
        return None, tuple(reasons)
    how = "the fused kernel computes the call" if cfg.fuse_conv_transpose == "cuda" else "on every device"
    return conv, (f"conv_transpose3d joined: {how} (PassConfig.fuse_conv_transpose={cfg.fuse_conv_transpose!r})",)


def _foldable_conv_bias(x: Node, cfg: pass_config.PassConfig) -> tuple[Node | None, tuple[str, ...]]:
    """The bias node of the convolution producing `x` if it may move into the fused op (see PassConfig), and why
    it does or does not (nothing to say where x is not a convolution)."""
    if x.op != "call_function" or x.target not in _CONV_SIGS:
        return None, ()
    if cfg.fold_conv_bias == "off":
        return None, ("bias fold off (PassConfig.fold_conv_bias='off')",)
    if len(x.users) != 1:
        return None, (f"the convolution's output has {len(x.users)} users",)
    names = _CONV_SIGS[x.target]
    b = _bind(x, names, {n: None for n in names[2:]})
    if b is None or not isinstance(b["bias"], Node):
        return None, ("the convolution has no bias" if b is not None and b["bias"] is None
                      else "the convolution's bias is not a graph tensor",)
    xv, bv = _val(x), _val(b["bias"])
    if not isinstance(xv, torch.Tensor) or not isinstance(bv, torch.Tensor):
        return None, ("the convolution has no example values",)
    device = xv.device.type
    if not cfg.folds_bias_on(device):
        return None, (f"the input is on {device}; PassConfig.fold_conv_bias={cfg.fold_conv_bias!r} folds CUDA "
                      "inputs only",)
    if not torch._C._dispatch_has_kernel_for_dispatch_key("fused::post_pool_bias", device.upper()):
        return None, (f"this build has no post_pool_bias kernel for {device}",)
    if bv.dtype != xv.dtype or bv.device != xv.device or bv.dim() != 1 or not _known(bv.shape[0] == xv.shape[1]):
        return None, (f"the bias ({nodes._dtype(bv)}, {list(bv.shape)}, {bv.device}) is not a 1-D tensor of the "
                      f"convolution output's dtype, device and {xv.shape[1]} channels",)
    return b["bias"], (f"bias folded into fused.post_pool_bias (PassConfig.fold_conv_bias={cfg.fold_conv_bias!r})",)


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
    # The modules by name: the ops package re-exports functions under the names of its op modules.
    ops = [importlib.import_module(f"..ops.{m}", __package__) for m in ("post_pool", "common",
                                                                        "conv_transpose3d_post_pool")]
    h = hashlib.sha256()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the package, where _C lives
    for lib in sorted(glob.glob(os.path.join(here, "_C.*"))):
        st = os.stat(lib)
        h.update(f"{os.path.basename(lib)}|{st.st_size}|{st.st_mtime_ns}".encode())
    for mod in (sys.modules[__name__], nodes, pass_config, coverage, *ops):
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
    many. Each decision is reported (the module's logger, ``recording()``)."""
    cfg = pass_config.current() if config is None else config
    for rec in _recordings:
        rec.graphs.append([])
    count = 0
    for node in list(graph.nodes):
        if node.graph is not graph or node.op != "call_function":
            continue  # erased by an earlier match
        match = _match(node, cfg)
        if match is None:
            continue
        anchor = match.anchor
        where = _where(anchor) if _listening() else ""
        with graph.inserting_before(anchor):
            fused = _emit(graph, match)
        for key in ("val", "example_value", "tensor_meta", "stack_trace", "nn_module_stack"):
            if key in anchor.meta:
                fused.meta[key] = anchor.meta[key]
        anchor.replace_all_uses_with(fused)
        for n in match.dead:
            graph.erase_node(n)
        count += 1
        _report_fused(match, fused, where)
    log.debug("fusion pass: %d chain(s) fused in a graph of %d nodes", count, len(graph.nodes))
    return count


def _report_fused(match: Match, fused: Node, where: str) -> None:
    """Reports the route `match` took and the fused call it became."""
    if not _listening():
        return
    op = _OP_NAMES[fused.target]
    route = "fused convolution" if match.conv else "bias folded" if match.bias is not None else "post_pool"
    _report(Decision("route", fused.name, route, match.route, match.anchor.name))
    first = ("conv_transpose3d",) if match.conv else ("bias",) if match.bias is not None else ()
    steps = (*first, *("leaky_relu" if k == "leaky" else k for k in match.steps), "max_pool3d")
    _report(Decision("fused", fused.name, op, (), match.anchor.name, steps, where))
