"""``torch_fused_ops.explain``: the answer to "why is my model not faster?". It compiles a model once with the
fusion pass and reports what the pass decided: which chains became which fused op, which steps and chains were
left alone and why, and the route each fused chain took (fused convolution, bias folded, post_pool)."""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import torch

from . import install, pass_config
from .fusion_pass import Decision, recording


@dataclasses.dataclass(frozen=True)
class Chain:
    """What the pass decided for one max_pool3d of a compiled graph and the steps before it."""

    graph: int                     # which compiled graph (0-based; Dynamo makes one per graph break)
    pool: str                      # the pool's node name in that graph
    op: str | None                 # the fused op the chain became; None: left alone
    steps: tuple[str, ...]         # the steps absorbed into it, in graph order
    where: str                     # the pool's source location, "" where the graph has no stack traces
    route: str                     # "fused convolution", "bias folded" or "post_pool"; "" when left alone
    route_reasons: tuple[str, ...]
    refused: tuple[Decision, ...]  # steps left in the graph, and for a chain left alone the pool itself

    @property
    def reasons(self) -> tuple[str, ...]:
        """Why a chain left alone was: the refusal of its pool (empty for a fused chain)."""
        return tuple(r for d in self.refused if d.node == self.pool for r in d.reasons)

    def __str__(self) -> str:
        head = (f"{self.op} <- {' -> '.join(self.steps)}" if self.op else f"left alone: the chain ending at "
                f"{self.pool}: {'; '.join(self.reasons)}")
        lines = [head] + ([f"    at {self.where}"] if self.where else [])
        steps = [d for d in self.refused if d.node != self.pool]
        if self.op:
            # The route's reasons, less the refusals listed below (the convolution's, its bias's).
            listed = tuple(_ROUTE_PREFIX[d.what] for d in steps if d.what in _ROUTE_PREFIX)
            why = [r for r in self.route_reasons if not r.startswith(listed)] if listed else self.route_reasons
            lines.append(f"    route {self.route}" + (f": {'; '.join(why)}" if why else " (see below)"))
        lines += ["    left in the graph:"] if steps else []
        for d in steps:
            at = f" at {d.where.split(': ', 1)[0]}" if d.where else ""  # the chain's code is shown above
            lines.append(f"      {d.label}{at}: {'; '.join(d.reasons)}")
        return "\n".join(lines)


# How the route of a chain names the refusals of its convolution's routes (fusion_pass._choose_route).
_ROUTE_PREFIX = {"conv_transpose3d": "conv_transpose3d not joined (", "bias fold": "bias not folded ("}


@dataclasses.dataclass(frozen=True)
class Explanation:
    """What one compilation did with a model's chains; ``str()`` is the readable report."""

    chains: tuple[Chain, ...]
    graphs: int                     # graphs the pass ran on
    matched: int                    # rewrites the pass itself counted (matched_count's increase): len(fused)
    pass_was_enabled: bool          # False: explain enabled the pass for its compilation only
    config: pass_config.PassConfig  # the settings it compiled under

    @property
    def fused(self) -> tuple[Chain, ...]:
        return tuple(c for c in self.chains if c.op is not None)

    @property
    def left_alone(self) -> tuple[Chain, ...]:
        return tuple(c for c in self.chains if c.op is None)

    @property
    def refused(self) -> tuple[Decision, ...]:
        """Every refusal, of steps and of whole chains."""
        return tuple(d for c in self.chains for d in c.refused)

    def __str__(self) -> str:
        lines = [f"torch_fused_ops.explain: {self.graphs} graph(s) compiled with the fusion pass; "
                 f"{len(self.fused)} chain(s) fused, {len(self.left_alone)} left alone."]
        if not self.pass_was_enabled:
            lines.append("The pass is disabled (torch_fused_ops.disable() or TORCH_FUSED_OPS_DISABLE=1): explain "
                         "enabled it for this compilation; torch.compile fuses nothing while it is off.")
        if self.config != pass_config.PassConfig():
            lines.append(f"Settings: {self.config}.")
        if self.graphs == 0:
            lines.append("No graph reached the pass: Dynamo compiled nothing (the function ran eagerly; is "
                         "torch._dynamo.config.cache_size_limit reached for this code?).")
        elif not self.chains:
            lines.append("No max_pool3d in the compiled graph(s): the pass fuses chains ending in a MaxPool3d.")
        if self.matched != len(self.fused):
            lines.append(f"Note: the pass counted {self.matched} rewrite(s) meanwhile (another compilation ran?).")
        for c in self.chains:
            graph = f"[graph {c.graph}] " if self.graphs > 1 else ""
            lines += ["", graph + str(c)]
        return "\n".join(lines)


def explain(model_or_fn: Any, *example_inputs: Any, verbose: bool = True, dynamic: bool | None = None,
            **example_kwargs: Any) -> Explanation:
    """Compiles `model_or_fn` once (torch.compile, Inductor, the pass on: enabled for this call if disabled, which
    the report says), runs it once on the example inputs under the caller's grad mode, and returns what the pass
    decided; prints it unless verbose=False. Inductor's FX-graph and AOT-autograd caches are off for the call (a
    hit skips the pass), and a backend of its own keeps Dynamo from serving code compiled earlier: one more
    torch.compile of the same code, which Dynamo's cache_size_limit counts; the caller's compiled functions stay
    as they were, and a torch.compile'd model or function is explained as what it wraps. Every setting is
    restored. Decisions of compilations running meanwhile in other threads are collected too. `verbose` and
    `dynamic` (torch.compile's) are not passed on to the model."""
    if not callable(model_or_fn):
        raise TypeError(f"torch_fused_ops.explain: expected an nn.Module or a function, got "
                        f"{type(model_or_fn).__name__}")
    target = _uncompiled(model_or_fn)
    was_enabled, before = install.is_enabled(), install.matched_count()
    with _without_compile_caches(), install.fusion_enabled(True), recording() as rec:
        torch.compile(target, backend=_Inductor(), dynamic=dynamic)(*example_inputs, **example_kwargs)
    result = Explanation(_chains(rec.graphs), len(rec.graphs), install.matched_count() - before, was_enabled,
                         pass_config.current())
    if verbose:
        print(result)
    return result


class _Inductor:
    """Inductor as torch.compile's default backend runs it, one object per call: Dynamo keys compiled code on the
    backend, so code compiled before (with or without the pass) is not served instead of this compilation."""

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, example_inputs)


def _uncompiled(fn: Any) -> Any:
    """The module or function under a torch.compile wrapper (compiling the wrapper would run its backend)."""
    if isinstance(fn, torch._dynamo.eval_frame.OptimizedModule):
        return fn._orig_mod
    return getattr(fn, "_torchdynamo_orig_callable", fn)


@contextlib.contextmanager
def _without_compile_caches() -> Iterator[None]:
    """Inductor's FX-graph caches and the AOT-autograd caches off (those that this torch has), restored after."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    with contextlib.ExitStack() as stack:
        for config, names in ((inductor_config, ("fx_graph_cache", "fx_graph_remote_cache")),
                              (functorch_config, ("enable_autograd_cache", "enable_remote_autograd_cache"))):
            present = {n: False for n in names if hasattr(config, n)}
            stack.enter_context(config.patch(present))
        yield


def _chains(graphs: list[list[Decision]]) -> tuple[Chain, ...]:
    """The decisions of each graph grouped by the pool ending their chain, in graph order."""
    chains = []
    for g, decisions in enumerate(graphs):
        by_pool: dict[str, list[Decision]] = {}
        for d in decisions:
            by_pool.setdefault(d.chain, []).append(d)
        chains += [_chain(g, pool, ds) for pool, ds in by_pool.items()]
    return tuple(chains)


def _chain(graph: int, pool: str, decisions: list[Decision]) -> Chain:
    fused = next((d for d in decisions if d.kind == "fused"), None)
    route = next((d for d in decisions if d.kind == "route"), None)
    refused = tuple(d for d in decisions if d.kind == "refused")
    where = fused.where if fused else next((d.where for d in refused if d.node == pool), "")
    return Chain(graph, pool, fused.what if fused else None, fused.steps if fused else (), where,
                 route.what if route else "", route.reasons if route else (), refused)
