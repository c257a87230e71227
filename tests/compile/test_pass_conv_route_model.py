"""The Inductor pass routing the whole KernelBench Model to fused.conv_transpose3d_post_pool, under the package's
own settings (no pass_settings mark; TF32 as configured): on CPU with the route forced ("always"; "cuda" leaves CPU
graphs to fused.post_pool), on CUDA by default for inference (float32, bfloat16, strict float32, dynamic shapes)
and training graphs. Compiled values and gradients against the eager Model. The route's choice graph by graph, under
the chain-only settings: test_pass_conv_route.py."""
import pytest
import torch

from fused_testing import HAS_CUDA
from torch_fused_ops.compile import pass_config
from torch_fused_ops.models import ConvTransposeLeakyMulLeakyPool


def _compile_code(model, x):
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    out, code = run_and_get_code(torch.compile(model), x)
    return out, "\n".join(code)


def _route(monkeypatch, setting):
    # The conv route's device gate for this test; monkeypatch restores the package's settings afterwards.
    monkeypatch.setattr(pass_config, "_current", pass_config.current().replace(fuse_conv_transpose=setting))


def test_pass_routes_model_to_conv_op(monkeypatch):
    _route(monkeypatch, "always")
    torch.manual_seed(0)
    model = ConvTransposeLeakyMulLeakyPool().double()
    x = torch.randn(2, 16, 3, 4, 4, dtype=torch.float64, requires_grad=True)
    ref = model(x)
    out, code = _compile_code(model, x)
    # The forward convolution is inside the fused op (the backward graph, when compiled, calls convolution_backward).
    assert "conv_transpose3d_post_pool" in code
    assert "aten.convolution.default" not in code and "extern_kernels.convolution(" not in code
    torch.testing.assert_close(out, ref)
    params = [x, model.conv_transpose.weight, model.conv_transpose.bias, model.multiplier]
    got = torch.autograd.grad(out.sum(), params)
    want = torch.autograd.grad(ref.sum(), params)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e)


def test_pass_cuda_mode_leaves_cpu_graphs_to_post_pool(monkeypatch):
    _route(monkeypatch, "cuda")
    model = ConvTransposeLeakyMulLeakyPool()
    with torch.no_grad():
        _, code = _compile_code(model, torch.randn(1, 16, 3, 4, 4))
    assert "conv_transpose3d_post_pool" not in code and "fused.post_pool" in code


def _routed_to_fused_conv(code):
    # The compiled graph calls the C++ op (an extern call), and no aten convolution is left in it.
    return "fused.conv_transpose3d_post_pool" in code and "extern_kernels.convolution(" not in code


@pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pass_routes_cuda_inference_to_conv_op(dtype):
    torch.manual_seed(0)
    model = ConvTransposeLeakyMulLeakyPool().cuda().to(dtype)
    x = torch.randn(2, 16, 4, 6, 6, device="cuda", dtype=dtype)
    with torch.no_grad():
        ref = model(x)
        out, code = _compile_code(model, x)
    assert _routed_to_fused_conv(code)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=2e-3, atol=2e-3)  # TF32 default
    torch.testing.assert_close(out, ref, **tol)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU")
def test_pass_cuda_inference_route_strict_float32(monkeypatch):
    # TF32 off: the fused kernel's float32-accurate mode (three TF32 products), close to float64.
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    torch.manual_seed(0)
    model = ConvTransposeLeakyMulLeakyPool().cuda()
    x = torch.randn(2, 16, 4, 6, 6, device="cuda")
    with torch.no_grad():
        ref = model.double()(x.double()).float()
        model.float()
        out, code = _compile_code(model, x)
    assert _routed_to_fused_conv(code)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU")
def test_pass_cuda_inference_route_with_dynamic_shapes():
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = ConvTransposeLeakyMulLeakyPool().cuda()
    compiled = torch.compile(model, dynamic=True)
    codes = []
    for shape in [(2, 16, 3, 4, 4), (1, 16, 4, 5, 3)]:
        x = torch.randn(*shape, device="cuda")
        with torch.no_grad():
            out, code = run_and_get_code(compiled, x)
            ref = model(x)
        codes.append("\n".join(code))
        torch.testing.assert_close(out, ref, rtol=2e-3, atol=2e-3)
    # The first call compiles the dynamic graph (the second reuses it, so it generates no code).
    assert _routed_to_fused_conv(codes[0])


@pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU")
def test_pass_routes_cuda_training_to_conv_op():
    # Training graphs take the fused convolution too: its forward saves pooled-size tensors only.
    torch.manual_seed(0)
    model = ConvTransposeLeakyMulLeakyPool().cuda()
    x = torch.randn(2, 16, 4, 6, 6, device="cuda", requires_grad=True)
    ref = model(x)
    out, code = _compile_code(model, x)
    assert "conv_transpose3d_post_pool" in code
    torch.testing.assert_close(out, ref, rtol=2e-3, atol=2e-3)


def test_pass_conv_route_with_dynamic_shapes(monkeypatch):
    # The fake impl works on symbolic sizes: one dynamic compilation serves two input shapes.
    _route(monkeypatch, "always")
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = ConvTransposeLeakyMulLeakyPool()
    compiled = torch.compile(model, dynamic=True)
    for shape in [(2, 16, 3, 4, 4), (1, 16, 4, 5, 3)]:
        x = torch.randn(*shape)
        with torch.no_grad():
            out, code = run_and_get_code(compiled, x)
            ref = model(x)
        assert "conv_transpose3d_post_pool" in "\n".join(code)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
