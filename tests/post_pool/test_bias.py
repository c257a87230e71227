"""fused.post_pool_bias*: post_pool of input + bias (per channel). Compared with the eager composite
max_pool3d(leaky(leaky(x + b) * m)) computed in the test, on CPU always and CUDA when present."""

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_fused_ops  # noqa: F401
from fused_testing import HALF_DTYPES, HAS_CUDA, make_input, make_multiplier

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU"))]

OPS = torch.ops.fused
CFGS = {
    "k2": dict(kernel_size=2),
    "k3s2p1": dict(kernel_size=3, stride=2, padding=1),
    "k231s123ceil": dict(kernel_size=(2, 3, 1), stride=(1, 2, 3), ceil_mode=True),
}
# (2, 8, 4, 6, 16) takes the CUDA kernels' vectorized 2x2x2 path; (2, 3, 5, 7, 9) the general one.
SHAPES = [(2, 3, 5, 7, 9), (2, 8, 4, 6, 16)]


def _args(cfg):
    k = cfg["kernel_size"]
    k = [k] * 3 if isinstance(k, int) else list(k)
    s = cfg.get("stride", k)
    s = [s] * 3 if isinstance(s, int) else list(s)
    p = cfg.get("padding", 0)
    p = [p] * 3 if isinstance(p, int) else list(p)
    return k, s, p, [1, 1, 1], cfg.get("ceil_mode", False)


def composite(x, b, m, s1, s2, cfg):
    y = F.leaky_relu(F.leaky_relu(x + b.view(1, -1, 1, 1, 1), s1) * m, s2)
    return F.max_pool3d(y, **cfg)


def call(x, b, m, s1, s2, cfg, op=OPS.post_pool_bias):
    k, s, p, d, ceil = _args(cfg)
    return op(x, b, m, s1, k, s, p, d, ceil, s2)


@pytest.mark.parametrize("shape", SHAPES, ids=["odd", "tiled"])
@pytest.mark.parametrize("cfg_name", list(CFGS))
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_forward_bitwise(device, dtype, layout, cfg_name, shape):
    x = make_input(shape, dtype, device, layout, seed=3)
    x[0, 0, 0, 0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=dtype)
    b = torch.randn(shape[1], dtype=dtype, device=device)
    m = make_multiplier("C111", shape[1], dtype, device)
    out = call(x, b, m, 0.2, -0.3, CFGS[cfg_name])
    ref = composite(x, b, m, 0.2, -0.3, CFGS[cfg_name])
    assert out.stride() == ref.stride()
    torch.testing.assert_close(out, ref, rtol=0, atol=0, equal_nan=True)
    out2, sel, off = call(x, b, m, 0.2, -0.3, CFGS[cfg_name], OPS.post_pool_bias_with_offsets)
    torch.testing.assert_close(out2, ref, rtol=0, atol=0, equal_nan=True)
    assert sel.dtype == dtype and off.dtype == torch.uint8 and sel.stride() == out2.stride()


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("device", DEVICES)
def test_forward_low_precision(device, dtype, layout):
    # Computed in float32 and rounded once: compare with the float64 composite of the same values.
    shape = SHAPES[1]
    x = make_input(shape, dtype, device, layout, seed=4)
    b = torch.randn(shape[1], dtype=dtype, device=device)
    m = make_multiplier("C111", shape[1], dtype, device)
    out = call(x, b, m, 0.2, None, CFGS["k2"])
    ref = composite(x.double(), b.double(), m.double(), 0.2, 0.2, CFGS["k2"])
    torch.testing.assert_close(out.double(), ref, rtol=2e-2 if dtype == torch.bfloat16 else 2e-3, atol=1e-3)


@pytest.mark.parametrize("cfg_name", list(CFGS))
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("device", DEVICES)
def test_grads_match_eager(device, layout, cfg_name):
    shape = SHAPES[0] if cfg_name != "k2" else SHAPES[1]
    x = make_input(shape, torch.float32, device, layout, seed=5).requires_grad_()
    b = torch.randn(shape[1], device=device, requires_grad=True)
    m = make_multiplier("C111", shape[1], torch.float32, device).requires_grad_()
    cfg = CFGS[cfg_name]
    out = call(x, b, m, 0.1, 0.3, cfg)
    ref = composite(x, b, m, 0.1, 0.3, cfg)
    g = torch.randn_like(ref)
    got = torch.autograd.grad(out, (x, b, m), g)
    want = torch.autograd.grad(ref, (x, b, m), g)
    assert got[1].shape == b.shape and got[2].shape == m.shape
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[1], want[1], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got[2], want[2], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mkind", ["0d", "C111"])
@pytest.mark.parametrize("dtype", [torch.float32, *HALF_DTYPES], ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("device", DEVICES)
def test_grads_keep_parameter_dtypes(device, layout, dtype, mkind):
    # Every gradient comes back in its parameter's dtype and shape, whichever multiplier shape: a one-element
    # multiplier's gradient is summed in float by the CUDA kernels, and the bias's beside it must still be cast back.
    shape = SHAPES[1]  # the vectorized 2x2x2 path
    x = make_input(shape, dtype, device, layout, seed=9).requires_grad_()
    b = torch.randn(shape[1], generator=torch.Generator().manual_seed(3)).to(dtype=dtype, device=device)
    b.requires_grad_()
    m = make_multiplier(mkind, shape[1], dtype, device).requires_grad_()
    cfg = CFGS["k2"]
    out = call(x, b, m, 0.1, 0.3, cfg)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(4)).to(dtype=dtype, device=device)
    got = torch.autograd.grad(out, (x, b, m), g)
    for grad, param, name in zip(got, (x, b, m), ("input", "bias", "multiplier")):
        assert grad.dtype == param.dtype and grad.shape == param.shape, (name, grad.dtype, grad.shape)
    xd, bd, md = (t.detach().double().requires_grad_() for t in (x, b, m))
    want = torch.autograd.grad(composite(xd, bd, md, 0.1, 0.3, cfg), (xd, bd, md), g.double())
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=3e-2, atol=0.3)
    torch.testing.assert_close(got[1].double(), want[1], **tol)
    torch.testing.assert_close(got[2].double(), want[2], **tol)


@pytest.mark.parametrize("cfg_name", ["k2", "k3s2p1"])
@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck(device, cfg_name):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(1, 2, 4, 5, 6, dtype=torch.float64, generator=g).to(device).requires_grad_()
    b = torch.randn(2, dtype=torch.float64, generator=g).to(device).requires_grad_()
    m = torch.randn(2, 1, 1, 1, dtype=torch.float64, generator=g).to(device).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, bb, c: call(a, bb, c, 0.3, -0.2, CFGS[cfg_name]), (x, b, m))


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("device", DEVICES)
def test_training_saves_no_full_resolution_tensor(device, layout):
    shape = SHAPES[1]
    x = make_input(shape, torch.float32, device, layout, seed=8).requires_grad_()
    b = torch.randn(shape[1], device=device, requires_grad=True)
    m = make_multiplier("C111", shape[1], torch.float32, device).requires_grad_()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        call(x, b, m, 0.2, None, CFGS["k2"])
    assert saved and max(saved) < x.numel()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device, dtype, layout):
    shape = SHAPES[0]
    x = make_input(shape, dtype, device, layout, seed=9)
    b = torch.randn(shape[1], dtype=dtype, device=device)
    m = make_multiplier("C111", shape[1], dtype, device)
    k, s, p, d, ceil = _args(CFGS["k3s2p1"])
    args = (x.requires_grad_(), b.requires_grad_(), m.requires_grad_(), 0.2, k, s, p, d, ceil, 0.1)
    for op in (OPS.post_pool_bias.default, OPS.post_pool_bias_with_offsets.default):
        result = torch.library.opcheck(op, args)
        assert all(v == "SUCCESS" for v in result.values()), result
    out, sel, off = OPS.post_pool_bias_with_offsets(x.detach(), b.detach(), m.detach(), 0.2, k, s, p, d, ceil, 0.1)
    bargs = (torch.randn_like(out), sel, off, b.detach(), m.detach(), 0.2, 0.1, list(shape), k, s, p, d,
             layout == "channels_last")
    result = torch.library.opcheck(OPS.post_pool_bias_backward.default, bargs)
    assert all(v == "SUCCESS" for v in result.values()), result


@pytest.mark.parametrize("bad", ["shape", "dtype", "2d"])
@pytest.mark.parametrize("device", DEVICES)
def test_bad_bias_raises_real_and_fake(device, bad):
    x = make_input(SHAPES[0], torch.float32, device, seed=10)
    m = make_multiplier("C111", SHAPES[0][1], torch.float32, device)
    b = {"shape": torch.randn(SHAPES[0][1] + 1), "dtype": torch.randn(SHAPES[0][1], dtype=torch.float64),
         "2d": torch.randn(1, SHAPES[0][1])}[bad].to(device)
    with pytest.raises((ValueError, TypeError), match="bias"):
        call(x, b, m, 0.2, None, CFGS["k2"])
    with FakeTensorMode() as mode:
        fx, fb, fm = (mode.from_tensor(t) for t in (x, b, m))
        with pytest.raises((ValueError, TypeError), match="bias"):
            call(fx, fb, fm, 0.2, None, CFGS["k2"])


def test_ops_registered_and_tagged():
    for name in ("post_pool_bias", "post_pool_bias_with_offsets", "post_pool_bias_backward"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"fused::{name}", "CPU")
        assert torch.Tag.pt2_compliant_tag in getattr(OPS, name).default.tags


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA,
                                                                                       reason="needs a GPU"))])
@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last_3d])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_non_finite_bias_with_infinite_inputs(device, fmt, sign):
    # A non-finite bias breaks the inference kernels' monotone shortcut: -inf + inf is NaN in the full
    # computation, which a max over the raw inputs would miss. Every channel holds one such case.
    torch.manual_seed(0)
    C = 16
    x = torch.randn(2, C, 4, 4, 8, device=device)
    x[:, :, 0, 0, 0] = -float("inf")
    x[:, :, 1, 1, 3] = float("inf")
    bias = torch.tensor([float("inf"), -float("inf"), float("nan"), 1.5] * (C // 4), device=device)
    m = sign * (torch.rand(C, 1, 1, 1, device=device) + 0.5)
    x = x.contiguous(memory_format=fmt)
    out = torch.ops.fused.post_pool_bias(x, bias, m, 0.2, [2, 2, 2])
    y = x + bias.view(1, C, 1, 1, 1)
    ref = F.max_pool3d(F.leaky_relu(F.leaky_relu(y, 0.2) * m, 0.2), 2)
    torch.testing.assert_close(out, ref, equal_nan=True, rtol=0, atol=0)
