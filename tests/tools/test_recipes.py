"""Every recipe of torch_fused_ops.tools.recipes works with the pass on, at a small size: the chain is fused, the
steady-state steps compile nothing, break no graph, skip no CUDA graph and never synchronise with the device, and
a captured or cudagraph'd loop gives the same parameters (and outputs) as its uncaptured counterpart — bit-exact,
since the same kernels run in the same order."""
import contextlib
import re

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

import torch_fused_ops
from fused_testing import HAS_CUDA
from torch_fused_ops.models import ConvTransposeLeakyMulLeakyPool
from torch_fused_ops.tools import recipes
from torch_fused_ops.tools.bench_train import _fresh_compile

STEPS = 6


def _cases(table):
    return [pytest.param(r, d, marks=pytest.mark.skipif(d == "cuda" and not HAS_CUDA, reason="needs a GPU"))
            for d in ("cpu", "cuda") for r in table if d == "cuda" or r not in recipes.NEEDS_CUDA]


def _setup(device, train=True, batch=2):
    torch.manual_seed(0)
    model = ConvTransposeLeakyMulLeakyPool(in_channels=4, out_channels=8, multiplier_shape=(8, 1, 1, 1)).to(device)
    x = torch.randn(batch, 4, 3, 5, 6, device=device)
    with torch.no_grad():
        target = torch.randn_like(model(x))
    if not train:
        model.requires_grad_(False)
    return model, x, target


@contextlib.contextmanager
def _fresh():
    """Strict float32 (the same kernels in every loop compared), a fresh Dynamo, the pass on, and the compile caches
    off (a cache hit skips the pass, so its match count would not move)."""
    torch._dynamo.reset()
    counters.clear()
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False), torch_fused_ops.fusion_enabled(True), \
            _fresh_compile():
        yield


def _steady_steps(loop, device, steps):
    """Runs `steps` steps after the warm-up ones, checking that none compiles, breaks a graph, skips a CUDA graph
    or synchronises with the device."""
    before = (counters["stats"]["unique_graphs"], sum(counters["graph_break"].values()),
              counters["inductor"]["cudagraph_skips"], counters["compiled_autograd"]["captures"])
    sync = torch.cuda.set_sync_debug_mode("error") if device == "cuda" else None
    try:
        for _ in range(steps):
            loop.step()
    finally:
        if device == "cuda":
            torch.cuda.set_sync_debug_mode(0)
    after = (counters["stats"]["unique_graphs"], sum(counters["graph_break"].values()),
             counters["inductor"]["cudagraph_skips"], counters["compiled_autograd"]["captures"])
    assert after == before, f"(frames, graph breaks, cudagraph skips, compiled-autograd captures): {before} -> {after}"
    del sync


def _check_graph_breaks(recipe):
    """The model compiles into whole graphs: no graph break at all where only the model is compiled, and none
    caused by our ops anywhere (compiled autograd's whole-step function breaks where PyTorch does: at
    Optimizer.zero_grad, at Tensor.backward() and inside the optimizer's step)."""
    reasons = dict(counters["graph_break"])
    if recipe in ("compile", "cuda-graph", "graphed"):
        assert not reasons, reasons
    # Ours: our package's files or the fused op namespace (not any path that merely contains "fused": a reason names
    # the file of the function it could not inline, and a checkout or environment can sit in such a folder).
    ours = re.compile(r"torch_fused_ops[/\\.]|\bfused(::|\.)")
    assert not [r for r in reasons if ours.search(r)], reasons


def _train(recipe, device):
    """Parameters after STEPS steps of `recipe` (the cuda-graph recipe's warm-up steps count among them)."""
    with _fresh():
        model, x, target = _setup(device)
        before = torch_fused_ops.matched_count()
        with contextlib.closing(recipes.training(recipe, model, x, target)) as loop:
            warm = recipes.CAPTURE_WARMUP if recipe == "cuda-graph" else 2
            if recipe != "cuda-graph":
                for _ in range(warm):
                    loop.step()
            _steady_steps(loop, device, STEPS - warm)
        assert torch_fused_ops.matched_count() > before, "the pass fused nothing"
        _check_graph_breaks(recipe)
        if device == "cuda":
            torch.cuda.synchronize()
        return [p.detach().clone() for p in model.parameters()]


def _uncaptured(recipe, device):
    """The loop each recipe must equal: the same compiled functions and optimizer, stepped without capture (the
    default compile mode)."""
    with _fresh():
        model, x, target = _setup(device)
        # As each recipe builds it: capturable (foreach by default), or fused for graphed (an explicit fused=False
        # would pick the single-tensor kernels, rounding differently).
        kind = dict(fused=True) if recipe == "graphed" else dict(capturable=True)
        opt = torch.optim.AdamW(model.parameters(), lr=recipes.LR, **kind)
        if recipe in ("cuda-graph", "graphed"):
            compiled = torch.compile(model)
            loss_of, opt_step = (lambda: F.mse_loss(compiled(x), target)), opt.step
        else:  # reduce-overhead: the loss compiled with the model, the optimizer step compiled
            compiled_loss = torch.compile(lambda x, t: F.mse_loss(model(x), t))
            loss_of, opt_step = (lambda: compiled_loss(x, target)), torch.compile(opt.step)
        for _ in range(STEPS):
            opt.zero_grad(set_to_none=True)
            loss_of().backward()
            opt_step()
        return [p.detach().clone() for p in model.parameters()]


@pytest.mark.slow
@pytest.mark.parametrize("recipe,device", _cases(recipes.TRAINING))
def test_training_recipe(recipe, device):
    got = _train(recipe, device)
    if recipe in ("cuda-graph", "graphed", "reduce-overhead", "reduce-overhead+static"):
        for g, w in zip(got, _uncaptured(recipe, device)):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
    else:
        # Against the plain compiled loop: the same fused kernels, but the loss's backward and the optimizer may
        # be compiled into different kernels (compiled autograd, a compiled optimizer step), so within rounding.
        with _fresh():
            model, x, target = _setup(device)
            with contextlib.closing(recipes.training("compile", model, x, target)) as loop:
                for _ in range(STEPS):
                    loop.step()
            want = [p.detach().clone() for p in model.parameters()]
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    ref = _setup(device)[0]
    assert any(not torch.equal(g, r) for g, r in zip(got, ref.parameters())), "the parameters did not move"


@pytest.mark.slow
@pytest.mark.parametrize("recipe,device", _cases(recipes.INFERENCE))
@pytest.mark.parametrize("batch", [1, 3])
def test_inference_recipe(recipe, device, batch):
    with _fresh():
        model, x, _ = _setup(device, train=False, batch=batch)
        with torch.no_grad():
            want = torch.compile(model)(x).clone()
            eager = model(x)
        torch._dynamo.reset()
        before = torch_fused_ops.matched_count()
        with contextlib.closing(recipes.inference(recipe, model, x)) as loop:
            for _ in range(2):
                loop.step()
            _steady_steps(loop, device, 3)
            got = loop.step().clone()
        assert torch_fused_ops.matched_count() > before, "the pass fused nothing"
    assert not got.requires_grad
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(got, eager, rtol=1e-5, atol=1e-5)


def test_unknown_recipe_and_device():
    model, x, target = _setup("cpu")
    with pytest.raises(ValueError, match="unknown training recipe 'nope'"):
        recipes.training("nope", model, x, target)
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        recipes.training("cuda-graph", model, x, target)
    with pytest.raises(ValueError, match="unknown inference recipe"):
        recipes.inference("nope", model, x)


def _autocast_cases():
    return [pytest.param("cpu", "compile", id="cpu-compile"),
            pytest.param("cuda", "cuda-graph", id="cuda-cuda-graph",
                         marks=pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU"))]


@pytest.mark.slow
@pytest.mark.parametrize("device,recipe", _autocast_cases())
def test_recipes_under_autocast(device, recipe):
    # A float32 model under torch.autocast(bfloat16), as mixed precision is usually run: the training loop's
    # steady steps compile nothing, the parameters stay float32 and move, and a captured loop equals its uncaptured
    # counterpart bit for bit; inference gives eager autocast's dtype.
    def run(recipe_name):
        with _fresh():
            model, x, target = _setup(device)
            with contextlib.closing(recipes.training(recipe_name, model, x, target, autocast=torch.bfloat16)) as loop:
                warm = recipes.CAPTURE_WARMUP if recipe_name == "cuda-graph" else 2
                for _ in range(0 if recipe_name == "cuda-graph" else warm):
                    loop.step()
                _steady_steps(loop, device, STEPS - warm)
            return [p.detach().clone() for p in model.parameters()]

    got = run(recipe)
    ref = _setup(device)[0]
    assert all(p.dtype == torch.float32 for p in got)
    assert any(not torch.equal(g, r) for g, r in zip(got, ref.parameters())), "the parameters did not move"
    if recipe == "cuda-graph":
        with _fresh():
            model, x, target = _setup(device)
            opt = torch.optim.AdamW(model.parameters(), lr=recipes.LR, capturable=True)
            compiled = torch.compile(model)
            with torch.autocast(device, dtype=torch.bfloat16, cache_enabled=False):
                for _ in range(STEPS):
                    opt.zero_grad(set_to_none=True)
                    F.mse_loss(compiled(x), target).backward()
                    opt.step()
            want = [p.detach().clone() for p in model.parameters()]
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
    with _fresh():
        model, x, _ = _setup(device, train=False)
        with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16):
            eager = model(x)
        with contextlib.closing(recipes.inference("compile", model, x, autocast=torch.bfloat16)) as loop:
            out = loop.step()
    assert out.dtype == eager.dtype == torch.float32  # the multiply by the float32 multiplier promotes
    torch.testing.assert_close(out, eager, rtol=2e-2, atol=2e-2)
