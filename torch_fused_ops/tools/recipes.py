"""The loops a user writes around an unmodified model, one builder per recipe, for the loop benchmark and its tests.

A training step is ``zero_grad(set_to_none=True)``, the forward, ``F.mse_loss`` against a fixed target,
``backward()`` and ``AdamW.step()``; an inference call is the forward under ``torch.no_grad()``. Each builder
returns a `Loop` whose ``step()`` runs one of them the way the recipe says (the README shows the same code), and
whose ``close()`` restores what the recipe switched on. What each recipe costs and when to use it:
docs/performance.md#training-loops.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

LR = 1e-3
# Warm-up steps before a capture: the compiled model compiles on the first, AdamW creates its state on it, and
# the later ones let cuDNN/Inductor settle their choices (PyTorch's whole-network capture example uses three).
CAPTURE_WARMUP = 3

TRAINING = {
    "compile": "torch.compile(model); eager AdamW",
    "compile+opt": "torch.compile(model); torch.compile(optimizer.step)",
    "reduce-overhead": "model and loss in one torch.compile(mode='reduce-overhead') function; capturable AdamW, its "
                       "step compiled with mode='reduce-overhead'",
    "reduce-overhead+static": "the same, x and target fixed buffers marked torch._dynamo.mark_static_address (a loop "
                              "that copies each batch into them)",
    "cuda-graph": "forward, loss, backward and capturable AdamW captured once in torch.cuda.graph around "
                  "torch.compile(model), replayed",
    "graphed": "torch.cuda.make_graphed_callables(torch.compile(model), (x,)): the model's forward and backward each "
               "replayed as a CUDA graph, the loss eager, fused AdamW (no capture written by hand)",
    "compiled-autograd": "the whole step in one torch.compile'd function, compiled autograd on",
    "compiled-autograd+cudagraphs": "the same with mode='reduce-overhead'",
}
INFERENCE = {
    "compile": "torch.compile(model) under torch.no_grad()",
    "reduce-overhead": "torch.compile(model, mode='reduce-overhead') under torch.no_grad()",
    "reduce-overhead+static": "the same, x a fixed buffer marked torch._dynamo.mark_static_address",
    "cuda-graph": "torch.compile(model) captured once in torch.cuda.graph, replayed",
}
NEEDS_CUDA = {"reduce-overhead", "reduce-overhead+static", "cuda-graph", "graphed", "compiled-autograd+cudagraphs"}


@dataclass
class Loop:
    """One recipe, built: ``step()`` runs a training step (or an inference call); ``close()`` ends the recipe."""

    step: Callable[[], object]
    model: nn.Module
    optimizer: torch.optim.Optimizer | None = None
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def close(self) -> None:
        self._stack.close()


def _plain_step(fn, optimizer, x, target, opt_step=None):
    def step():
        optimizer.zero_grad(set_to_none=True)
        F.mse_loss(fn(x), target).backward()
        (opt_step or optimizer.step)()
    return step


def _capture(run: Callable[[], object], before_capture: Callable[[], None] | None = None) -> Callable[[], None]:
    """Warm `run` up on a side stream, capture it once in a CUDA graph, return the graph's replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(CAPTURE_WARMUP):
            run()
    torch.cuda.current_stream().wait_stream(side)
    if before_capture is not None:
        before_capture()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return graph.replay


def _under_autocast(loop: Loop, device: torch.device, dtype: torch.dtype | None) -> None:
    """The rest of the loop's life under torch.autocast(dtype), as a user's loop body would be. Its cast cache is
    off: a captured graph must cast the weights AdamW updates, not reuse casts made before the capture."""
    if dtype is not None:
        loop._stack.enter_context(torch.autocast(device.type, dtype=dtype, cache_enabled=False))


def training(recipe: str, model: nn.Module, x: torch.Tensor, target: torch.Tensor,
             autocast: torch.dtype | None = None) -> Loop:
    """`model` (on its device, parameters requiring grad) trained on (x, target) with AdamW by `recipe`, under
    ``torch.autocast(dtype=autocast)`` when given.

    The cuda-graph recipe runs CAPTURE_WARMUP real steps while it builds; graphed runs the model's forward and
    backward CAPTURE_WARMUP times without touching the parameters or their gradients; the others run nothing."""
    if recipe not in TRAINING:
        raise ValueError(f"unknown training recipe {recipe!r}; choose from {list(TRAINING)}")
    if recipe in NEEDS_CUDA and x.device.type != "cuda":
        raise ValueError(f"the {recipe} recipe needs CUDA tensors (CUDA graphs), got {x.device}")
    params = list(model.parameters())
    loop = Loop(step=lambda: None, model=model)
    _under_autocast(loop, x.device, autocast)
    if recipe == "compile":
        loop.optimizer = torch.optim.AdamW(params, lr=LR)
        loop.step = _plain_step(torch.compile(model), loop.optimizer, x, target)
    elif recipe == "compile+opt":
        loop.optimizer = torch.optim.AdamW(params, lr=LR)
        loop.step = _plain_step(torch.compile(model), loop.optimizer, x, target,
                                opt_step=torch.compile(loop.optimizer.step))
    elif recipe.startswith("reduce-overhead"):
        loop.optimizer = opt = torch.optim.AdamW(params, lr=LR, capturable=True)
        if recipe.endswith("+static"):
            # Inputs at fixed addresses: cudagraph trees read them in place instead of copying them in.
            torch._dynamo.mark_static_address(x)
            torch._dynamo.mark_static_address(target)

        @torch.compile(mode="reduce-overhead")
        def loss_of(x, target):
            return F.mse_loss(model(x), target)
        opt_step = torch.compile(opt.step, mode="reduce-overhead")

        def step():
            # A new iteration for cudagraph trees: the previous step's outputs may be overwritten.
            torch.compiler.cudagraph_mark_step_begin()
            opt.zero_grad(set_to_none=True)
            loss_of(x, target).backward()
            opt_step()
        loop.step = step
    elif recipe == "cuda-graph":
        loop.optimizer = opt = torch.optim.AdamW(params, lr=LR, capturable=True)
        compiled = torch.compile(model)

        def run():
            F.mse_loss(compiled(x), target).backward()
            opt.step()

        def warm_step():
            opt.zero_grad(set_to_none=True)
            run()
        # Gradients set to None before the capture: the captured backward then writes them (into the graph's
        # memory) instead of accumulating, and every replay overwrites them.
        loop.step = _capture(warm_step, before_capture=lambda: opt.zero_grad(set_to_none=True))
    elif recipe == "graphed":
        # PyTorch's own partial capture: the compiled model's forward and backward become two CUDA graphs behind an
        # autograd function (its warm-up compiles them on a side stream). What is left on the host per step is the
        # loss, the autograd engine's walk and one fused optimizer launch, cheaper than the step's device time.
        loop.optimizer = opt = torch.optim.AdamW(params, lr=LR, fused=True)
        graphed = torch.cuda.make_graphed_callables(torch.compile(model), (x,), num_warmup_iters=CAPTURE_WARMUP)
        loop.step = _plain_step(graphed, opt, x, target)
    else:  # compiled autograd, the whole step compiled
        loop._stack.enter_context(torch._dynamo.config.patch(compiled_autograd=True))
        loop.optimizer = opt = torch.optim.AdamW(params, lr=LR, capturable=recipe.endswith("cudagraphs"))
        mode = "reduce-overhead" if recipe.endswith("cudagraphs") else None

        @torch.compile(mode=mode)
        def whole_step():
            opt.zero_grad(set_to_none=True)
            F.mse_loss(model(x), target).backward()
            opt.step()

        def step():
            if mode is not None:
                torch.compiler.cudagraph_mark_step_begin()
            whole_step()
        loop.step = step
    return loop


def inference(recipe: str, model: nn.Module, x: torch.Tensor, autocast: torch.dtype | None = None) -> Loop:
    """`model`'s forward on x under torch.no_grad() (and ``torch.autocast(dtype=autocast)`` when given) by `recipe`;
    ``step()`` returns the output (the cuda-graph and reduce-overhead recipes' outputs are overwritten by the next
    call)."""
    if recipe not in INFERENCE:
        raise ValueError(f"unknown inference recipe {recipe!r}; choose from {list(INFERENCE)}")
    if recipe in NEEDS_CUDA and x.device.type != "cuda":
        raise ValueError(f"the {recipe} recipe needs CUDA tensors (CUDA graphs), got {x.device}")
    loop = Loop(step=lambda: None, model=model)
    loop._stack.enter_context(torch.no_grad())
    _under_autocast(loop, x.device, autocast)
    if recipe == "compile":
        compiled = torch.compile(model)
        loop.step = lambda: compiled(x)
    elif recipe.startswith("reduce-overhead"):
        if recipe.endswith("+static"):
            torch._dynamo.mark_static_address(x)
        compiled = torch.compile(model, mode="reduce-overhead")

        def step():
            torch.compiler.cudagraph_mark_step_begin()
            return compiled(x)
        loop.step = step
    else:
        compiled = torch.compile(model)
        out = []
        replay = _capture(lambda: out.append(compiled(x)))
        static_out = out[-1]  # the captured call's output, which every replay rewrites
        out.clear()

        def step():
            replay()
            return static_out
        loop.step = step
    return loop
