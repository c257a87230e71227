"""fused.conv_transpose3d_post_pool: values and gradients against eager PyTorch (float64 reference), fake impl,
opcheck, argument errors, and the Inductor pass routing the whole Model to it."""
import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_fused_ops
from torch_fused_ops import conv_transpose3d_post_pool, fusion_pass, pass_config
from torch_fused_ops.models import ConvTransposeLeakyMulLeakyPool
from fused_testing import HAS_CUDA

OPS = torch.ops.fused
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU"))]

# (conv stride, padding, output_padding, kernel, pool kernel, pool stride, groups): the KernelBench case (the
# CUDA fused path), then cases only the composite path covers.
CASES = {
    "kb": (2, 1, 1, 3, 2, None, 1),
    "kb_op0": (2, 1, 0, 3, 2, None, 1),
    "kb_mixed_op": (2, 1, (1, 0, 1), 3, 2, None, 1),
    "s1k2": (1, 0, 0, 2, 2, 1, 1),
    "pool3": (2, 1, 1, 3, 3, 2, 1),
    "groups2": (2, 1, 1, 3, 2, None, 2),
}


def reference(x, w, b, m, s1, s2, case):
    stride, pad, op, _k, pk, ps, groups = case
    y = F.conv_transpose3d(x, w, b, stride, pad, op, groups)
    return F.max_pool3d(F.leaky_relu(F.leaky_relu(y, s1) * m, s2), pk, ps)


def make(case, dtype, device, *, cin=4, cout=6, shape=(2, 3, 4, 5), bias=True, fmt=torch.contiguous_format,
         seed=0):
    g = torch.Generator().manual_seed(seed)
    _s, _p, _o, k, _pk, _ps, groups = case
    x = torch.randn(shape[0], cin, *shape[1:], generator=g, dtype=torch.float64)
    w = torch.randn(cin, cout // groups, k, k, k, generator=g, dtype=torch.float64) / (cin * k) ** 0.5
    b = torch.randn(cout, generator=g, dtype=torch.float64) if bias else None
    m = torch.randn(cout, 1, 1, 1, generator=g, dtype=torch.float64)
    cast = lambda t: None if t is None else t.to(device=device, dtype=dtype)  # noqa: E731
    return cast(x).contiguous(memory_format=fmt), cast(w), cast(b), cast(m)


def call(x, w, b, m, s1, s2, case):
    stride, pad, op, _k, pk, ps, groups = case
    return conv_transpose3d_post_pool(x, w, b, m, s1, stride, pad, op, groups, 1, pk, ps, 0, 1, False,
                                      None if s2 == s1 else s2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last_3d], ids=["contig", "cl"])
def test_forward_and_grads_float64(device, name, fmt):
    case = CASES[name]
    x, w, b, m = make(case, torch.float64, device, fmt=fmt)
    leaves = [t.requires_grad_() for t in (x, w, b, m)]
    out = call(x, w, b, m, 0.2, 0.3, case)
    ref = reference(x, w, b, m, 0.2, 0.3, case)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    assert out.stride() == ref.stride()  # the eager composite's layout (the convolution's memory-format rule)
    g = torch.randn_like(ref)
    got = torch.autograd.grad(out, leaves, g)
    want = torch.autograd.grad(ref, leaves, g)
    for name_, a, e in zip(("input", "weight", "bias", "multiplier"), got, want):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-10, msg=lambda s: f"grad {name_}: {s}")


@pytest.mark.parametrize("device", DEVICES)
def test_float32_close_to_float64_reference(device):
    case = CASES["kb"]
    x, w, b, m = make(case, torch.float32, device, cin=16, cout=32, shape=(2, 4, 6, 5))
    leaves64 = [t.double().requires_grad_() for t in (x, w, b, m)]
    ref = reference(*leaves64, 0.2, 0.2, case)
    leaves = [t.requires_grad_() for t in (x, w, b, m)]
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        out = call(*leaves, 0.2, 0.2, case)
        g = torch.randn_like(out)
        got = torch.autograd.grad(out, leaves, g)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    want = torch.autograd.grad(ref, leaves64, g.double())
    for a, e in zip(got, want):
        torch.testing.assert_close(a.double(), e, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_no_bias_and_scalar_multiplier(device):
    case = CASES["kb"]
    x, w, _, _ = make(case, torch.float64, device, bias=False)
    m = torch.tensor(-0.7, dtype=torch.float64, device=device)
    torch.testing.assert_close(call(x, w, None, m, 0.1, 0.1, case), reference(x, w, None, m, 0.1, 0.1, case))


@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch(device):
    case = CASES["kb"]
    x, w, b, m = make(case, torch.float32, device, shape=(0, 3, 4, 5))
    out = call(x, w, b, m, 0.2, 0.2, case)
    assert out.shape == reference(x, w, b, m, 0.2, 0.2, case).shape and out.numel() == 0


@pytest.mark.parametrize("device", DEVICES)
def test_nan_and_inf_propagate(device):
    case = CASES["kb"]
    x, w, b, m = make(case, torch.float64, device, shape=(1, 4, 4, 4))
    x[0, 0, 1, 1, 1] = float("nan")
    x[0, 1, 2, 2, 2] = float("inf")
    torch.testing.assert_close(call(x, w, b, m, 0.2, 0.2, case), reference(x, w, b, m, 0.2, 0.2, case),
                               equal_nan=True)


def _args(x, w, b, m, case):
    stride, pad, op, _k, pk, ps, groups = case
    e = lambda v: [v] * 3 if isinstance(v, int) else list(v)  # noqa: E731
    return (x, w, b, e(stride), e(pad), e(op), groups, [1, 1, 1], m, 0.2, e(pk), [] if ps is None else e(ps),
            [0, 0, 0], [1, 1, 1], False, None)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["kb", "pool3"])
@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last_3d], ids=["contig", "cl"])
def test_opcheck(device, name, fmt):
    case = CASES[name]
    x, w, b, m = make(case, torch.float64, device, fmt=fmt)
    torch.library.opcheck(OPS.conv_transpose3d_post_pool.default, _args(x, w, b, m, case))
    leaves = [t.requires_grad_() for t in (x, w, b, m)]
    torch.library.opcheck(OPS.conv_transpose3d_post_pool_with_offsets.default, _args(*leaves, case))


@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last_3d], ids=["contig", "cl"])
def test_fake_matches_real_strides(fmt):
    case = CASES["kb"]
    x, w, b, m = make(case, torch.float32, "cpu", fmt=fmt)
    real = OPS.conv_transpose3d_post_pool_with_offsets(*_args(x, w, b, m, case))
    with FakeTensorMode() as mode:
        fake = OPS.conv_transpose3d_post_pool_with_offsets(
            *_args(*(mode.from_tensor(t) for t in (x, w, b, m)), case))
    for r, f in zip(real, fake):
        assert (r.shape, r.stride(), r.dtype) == (f.shape, f.stride(), f.dtype)


def test_errors_are_clear():
    case = CASES["kb"]
    x, w, b, m = make(case, torch.float32, "cpu")
    with pytest.raises(ValueError, match="weight.shape\\[0\\]"):
        call(x, w[:3], b, m, 0.2, 0.2, case)
    with pytest.raises(TypeError, match="weight dtype"):
        call(x, w.double(), b, m, 0.2, 0.2, case)
    with pytest.raises(ValueError, match="bias must be 1-D"):
        call(x, w, b[:2], m, 0.2, 0.2, case)
    with pytest.raises(ValueError, match="multiplier"):
        call(x, w, b, m[:2], 0.2, 0.2, case)
    with pytest.raises(ValueError, match="5-D"):
        call(x[0], w, b, m, 0.2, 0.2, case)


def test_non_tensor_arguments_raise_type_error_naming_them():
    case = CASES["kb"]
    x, w, b, m = make(case, torch.float32, "cpu")
    for i, name in ((0, "input"), (1, "weight"), (3, "multiplier")):
        for bad in (None, 2.0, x.numpy()):
            args = [x, w, b, m]
            args[i] = bad
            with pytest.raises(TypeError, match=f"{name} must be a Tensor"):
                call(*args, 0.2, 0.2, case)
    with pytest.raises(TypeError, match="bias must be a Tensor or None"):
        call(x, w, 3, m, 0.2, 0.2, case)
    # The op itself (None reaches the kernel as an undefined tensor), for both forms.
    for op in (OPS.conv_transpose3d_post_pool, OPS.conv_transpose3d_post_pool_with_offsets):
        for i, name in ((0, "input"), (1, "weight"), (8, "multiplier")):
            args = list(_args(x, w, b, m, case))
            args[i] = None
            with pytest.raises(TypeError, match=f"{name} must be a Tensor"):
                op(*args)


LAYOUTS = {
    "contig": lambda t: t,
    "cl": lambda t: t.contiguous(memory_format=torch.channels_last_3d),
    "strided": lambda t: t.transpose(3, 4).contiguous().transpose(3, 4),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("batch", [0, 1, 2, 16])
@pytest.mark.parametrize("xl,wl", [("contig", "contig"), ("contig", "cl"), ("cl", "contig"), ("cl", "cl"),
                                   ("strided", "cl"), ("cl", "strided")])
@pytest.mark.parametrize("name", ["kb", "s1k2"])
def test_output_layout_follows_the_convolution(device, dtype, batch, xl, wl, name):
    # Eager conv_transpose3d picks its output's memory format from the backend it runs: cuDNN gives
    # channels_last_3d when the input *or* the weight is channels_last_3d (not in float64); on CPU it depends on
    # whether oneDNN runs (dtype, sizes, threads). The op, its training form and their fake impls follow the same
    # rule, so they have the eager composite's strides.
    case = CASES[name]
    x, w, b, m = make(case, dtype, device, shape=(batch, 3, 4, 5))
    x, w = LAYOUTS[xl](x), LAYOUTS[wl](w)
    ref = reference(x, w, b, m, 0.2, 0.2, case)
    args = _args(x, w, b, m, case)
    outs = [OPS.conv_transpose3d_post_pool(*args), *OPS.conv_transpose3d_post_pool_with_offsets(*args)]
    with FakeTensorMode() as mode:
        fargs = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        fakes = [OPS.conv_transpose3d_post_pool(*fargs), *OPS.conv_transpose3d_post_pool_with_offsets(*fargs)]
    for o in outs + fakes:
        assert (o.shape, o.stride()) == (ref.shape, ref.stride())
    if batch:
        torch.testing.assert_close(outs[0], ref, **({} if dtype != torch.bfloat16 else dict(rtol=2e-2, atol=2e-2)))


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


def test_uuid_depends_on_setting():
    with pass_config.patch(fuse_conv_transpose="off"):
        off = fusion_pass.PostPoolFusionPass().uuid()
    with pass_config.patch(fuse_conv_transpose="cuda"):
        assert fusion_pass.PostPoolFusionPass().uuid() != off


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


@pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_training_path_gradients(dtype):
    # The op's training path on CUDA (the fused forward with offsets, then post_pool_backward and cuDNN's
    # convolution backward) against eager autograd. With TF32 or bf16 the two convolutions round differently, so
    # a few near-tied windows pick another element; gradients are compared by relative norm.
    torch.manual_seed(0)
    model = ConvTransposeLeakyMulLeakyPool().cuda().to(dtype)
    conv = model.conv_transpose
    x = torch.randn(2, 16, 4, 6, 6, device="cuda", dtype=dtype, requires_grad=True)
    out = conv_transpose3d_post_pool(x, conv.weight, conv.bias, model.multiplier, 0.2, 2, 1, 1)
    ref = model(x)
    params = [x, conv.weight, conv.bias, model.multiplier]
    got = torch.autograd.grad(out.float().sum(), params)
    want = torch.autograd.grad(ref.float().sum(), params)
    for name, a, e in zip(("input", "weight", "bias", "multiplier"), got, want):
        rel = ((a.float() - e.float()).norm() / e.float().norm()).item()
        assert rel < (5e-2 if dtype == torch.bfloat16 else 1e-2), f"grad {name}: relative error {rel:.2e}"


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
