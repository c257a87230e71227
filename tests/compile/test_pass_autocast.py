"""The Inductor pass under torch.autocast: the unmodified KernelBench Model wrapped in autocast takes the fused path.
Autocast makes the chain convolution (float16/bfloat16) -> LeakyReLU (same) -> x float32 multiplier (promotes) ->
LeakyReLU -> max_pool3d (float32); the pass fuses all of it. On CPU (routes "cuda" and "always") the compiled
result equals eager autocast's bit for bit; on CUDA the fused convolution replaces cuDNN, inference and training,
static and dynamic shapes, with no full-resolution tensor in the compiled code."""
import pytest
import torch

import torch_fused_ops
from fused_testing import HAS_CUDA
from pass_testing import _isolated_inductor  # noqa: F401  (autouse: no compile caches, fresh dynamo state)
from torch_fused_ops.compile import fusion_pass, pass_config
from torch_fused_ops.models import ConvTransposeLeakyMulLeakyPool

requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU")
HALF = [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float16, id="fp16")]


def _compiled(model, x, dtype, device, dynamic=None):
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    compiled = torch.compile(model, dynamic=dynamic)
    with torch.autocast(device, dtype=dtype):
        out, code = run_and_get_code(compiled, x)
    return out, "\n".join(code)


def _route(monkeypatch, setting):
    monkeypatch.setattr(pass_config, "_current", pass_config.current().replace(fuse_conv_transpose=setting))


@pytest.mark.parametrize("route", ["cuda", "always"])
def test_cpu_autocast_model_fused_and_exact(monkeypatch, route):
    _route(monkeypatch, route)
    torch.manual_seed(0)
    model = ConvTransposeLeakyMulLeakyPool(in_channels=4, out_channels=6, multiplier_shape=(6, 1, 1, 1))
    x = torch.randn(2, 4, 3, 4, 5)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = model(x)
    with torch.no_grad(), fusion_pass.recording() as rec:
        out, code = _compiled(model, x, torch.bfloat16, "cpu")
    assert out.dtype == want.dtype == torch.float32
    assert torch.equal(out, want)
    fused = [d for graph in rec.graphs for d in graph if d.kind == "fused"]
    assert len(fused) == 1, rec.graphs
    # Every step of the chain is in the one fused call, the promoting multiply included.
    assert {"leaky_relu", "mul", "max_pool3d"} <= set(fused[0].steps)
    if route == "always":
        assert "conv_transpose3d_post_pool" in code and "fused.post_pool(" not in code
    else:
        assert "fused.post_pool" in code


def test_cpu_autocast_training_gradients(monkeypatch):
    _route(monkeypatch, "always")
    torch.manual_seed(0)
    model = ConvTransposeLeakyMulLeakyPool(in_channels=4, out_channels=6, multiplier_shape=(6, 1, 1, 1))
    x = torch.randn(2, 4, 3, 4, 5, requires_grad=True)
    params = [x, *model.parameters()]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = torch.autograd.grad(model(x).square().sum(), params)
    torch._dynamo.reset()
    compiled = torch.compile(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = torch.autograd.grad(compiled(x).square().sum(), params)
    assert torch_fused_ops.matched_count() > 0
    for a, e in zip(got, want):
        assert a.dtype == e.dtype == torch.float32
        torch.testing.assert_close(a, e, rtol=1e-2, atol=1e-3)


def _fused_conv_only(code):
    # Inference under autocast calls the cast form (the operands' casts inside the fused op), training the op itself.
    return (("fused._conv_transpose3d_post_pool_cast" in code and "_to_copy" not in code)
            or "fused.conv_transpose3d_post_pool" in code) and "extern_kernels.convolution(" not in code


@requires_cuda
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("dynamic", [False, True])
def test_cuda_autocast_inference_takes_fused_conv(dtype, dynamic):
    torch.manual_seed(0)
    model = ConvTransposeLeakyMulLeakyPool().cuda()
    x = torch.randn(2, 16, 4, 6, 6, device="cuda")
    with torch.no_grad():
        with torch.autocast("cuda", dtype=dtype):
            want = model(x)
        ref = model.double()(x.double())
        model.float()
        out, code = _compiled(model, x, dtype, "cuda", dynamic=dynamic)
    assert out.dtype == want.dtype == torch.float32
    assert _fused_conv_only(code)

    def rel(a):
        return ((a.double() - ref).norm() / ref.norm()).item()

    assert rel(out) <= 1.5 * rel(want) + 2 * torch.finfo(dtype).eps


def _integer_model(cin=16, cout=32):
    """The Model with integer-valued parameters: with inputs in {-1, 0, 1} every convolution output is an integer
    of at most 8 * 16 + 1, exact in float16 and bfloat16, so the compiled graph's fused convolution selects in every
    window what eager's does (random data can select another tap in near-tied windows, in either)."""
    model = ConvTransposeLeakyMulLeakyPool(cin, cout, multiplier_shape=(cout, 1, 1, 1))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in (model.conv_transpose.weight, model.conv_transpose.bias):
            p.copy_(torch.randint(-1, 2, p.shape, generator=gen))
        model.multiplier.copy_(torch.randint(-2, 3, model.multiplier.shape, generator=gen) * 0.5)
    return model


@requires_cuda
@pytest.mark.parametrize("dtype", HALF)
def test_cuda_autocast_training_takes_fused_conv(dtype):
    model = _integer_model().cuda()
    gen = torch.Generator().manual_seed(2)
    x = torch.randint(-1, 2, (2, 16, 4, 6, 6), generator=gen).float().cuda().requires_grad_()
    params = [x, *model.parameters()]
    g = torch.randint(-2, 3, (2, 32, 4, 6, 6), generator=gen).float().cuda()
    with torch.autocast("cuda", dtype=dtype):
        want_out = model(x)
    want = torch.autograd.grad(want_out, params, g)

    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    compiled = torch.compile(model)

    def step():
        with torch.autocast("cuda", dtype=dtype):
            out = compiled(x)
        return out.detach(), torch.autograd.grad(out, params, g)

    (out, got), codes = run_and_get_code(step)
    code = "\n".join(codes)
    assert "conv_transpose3d_post_pool_with_offsets" in code and "extern_kernels.convolution(" not in code
    assert "convolution_backward" not in code
    assert torch.equal(out, want_out)
    # The convolution output's gradient is eager's bit for bit; the weight's and input's sum it in another order.
    for name, a, e in zip(("input", "weight", "bias", "multiplier"), got, want):
        assert a.dtype == torch.float32
        err = ((a - e).norm() / e.norm()).item()
        assert err <= (1e-2 if dtype == torch.bfloat16 else 2e-3), f"{name}: relative error {err:.3e}"
