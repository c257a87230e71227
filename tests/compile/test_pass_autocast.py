"""The Inductor pass under torch.autocast: the unmodified KernelBench Model wrapped in autocast takes the fused path.
Autocast makes the chain convolution (float16/bfloat16) -> LeakyReLU (same) -> x float32 multiplier (promotes) ->
LeakyReLU -> max_pool3d (float32); the pass fuses all of it. On CPU (routes "cuda" and "always") the compiled
result equals eager autocast's bit for bit; on CUDA the fused convolution replaces cuDNN, inference and training,
static and dynamic shapes, with no full-resolution tensor in the compiled code."""
import pytest
import torch

import torch_fused_ops
from fused_testing import HAS_CUDA
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
    return "fused.conv_transpose3d_post_pool" in code and "extern_kernels.convolution(" not in code


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


@requires_cuda
@pytest.mark.parametrize("dtype", HALF)
def test_cuda_autocast_training_takes_fused_conv(dtype):
    torch.manual_seed(0)
    model = ConvTransposeLeakyMulLeakyPool().cuda()
    x = torch.randn(2, 16, 4, 6, 6, device="cuda", requires_grad=True)
    params = [x, *model.parameters()]
    g = torch.randn(2, 32, 4, 6, 6, device="cuda")
    with torch.autocast("cuda", dtype=dtype):
        want_out = model(x)
    want = torch.autograd.grad(want_out, params, g)
    ref_params = [p.detach().double().requires_grad_() for p in params]
    ref_model = ConvTransposeLeakyMulLeakyPool().cuda().double()
    with torch.no_grad():
        for p, q in zip(ref_model.parameters(), ref_params[1:]):
            p.copy_(q)
    ref = torch.autograd.grad(ref_model(ref_params[0]), [ref_params[0], *ref_model.parameters()], g.double())

    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    compiled = torch.compile(model)

    def step():
        with torch.autocast("cuda", dtype=dtype):
            out = compiled(x)
        return torch.autograd.grad(out, params, g)

    got, codes = run_and_get_code(step)
    code = "\n".join(codes)
    assert "conv_transpose3d_post_pool_with_offsets" in code and "extern_kernels.convolution(" not in code
    assert "convolution_backward" not in code
    eps = torch.finfo(dtype).eps
    for name, a, e, r in zip(("input", "weight", "bias", "multiplier"), got, want, ref):
        err = ((a.double() - r).norm() / r.norm()).item()
        err_eager = ((e.double() - r).norm() / r.norm()).item()
        assert err <= 2 * err_eager + 4 * eps, f"{name}: {err:.3e} vs eager autocast {err_eager:.3e}"
