"""The fused convolution's backward ops at pooled resolution (fused._conv_transpose3d_post_pool_grad_conv,
_grad_weight, _grad_input) against eager autograd of the unfused chain; their layouts, fakes, opcheck and errors.
CPU runs the aten composite; CUDA (float32/bf16/fp16) the kernels of csrc/conv_transpose3d_post_pool/backward_contract.h."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_fused_ops  # noqa: F401  (registers the ops and their fakes)
from conv_backward_testing import (GRAD_CONV, GRAD_INPUT, GRAD_WEIGHT, NAMES, eager_grads, expand, make, op_grads,
                                   rel_l2, saved)
from fused_testing import HAS_CUDA

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU"))]
CL = torch.channels_last_3d
TOL64 = dict(rtol=1e-10, atol=1e-10)

# (n, cin, cout, spatial, output_padding): odd sizes, output_padding mixes, channel counts off any tile size.
SHAPES = {
    "small": (2, 3, 5, (3, 4, 5), 1),
    "op0": (1, 4, 3, (4, 3, 3), 0),
    "mixed_op": (2, 2, 7, (3, 5, 2), (1, 0, 1)),
    "tails": (3, 17, 33, (2, 3, 2), (0, 1, 1)),
    "one_position": (1, 1, 1, (1, 1, 1), 1),
}


def _check_against_eager(x, w, b, m, s1, s2, op, fmt_grad=None, seed=1, equal_nan=False):
    out, sel, off = saved(x, w, b, m, s1, s2, op)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    g = g.to(device=x.device, dtype=x.dtype)
    if fmt_grad is not None:
        g = fmt_grad(g)
    ref_out, want = eager_grads(x, w, b, m, s1, s2, op, g)
    torch.testing.assert_close(out, ref_out, equal_nan=True, **TOL64)
    got, _ = op_grads(x, w, b, m, s1, s2, op, g, sel, off)
    names = [n for n in NAMES if n != "bias" or b is not None]
    for name, a, e in zip(names, got, want):
        assert a.shape == e.shape, name
        torch.testing.assert_close(a, e, equal_nan=equal_nan, **TOL64, msg=lambda s: f"grad {name}: {s}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("fmt", [torch.contiguous_format, CL], ids=["contig", "cl"])
def test_float64_matches_eager(device, shape, fmt):
    n, cin, cout, spatial, op = SHAPES[shape]
    x, w, b, m = make(n, cin, cout, spatial, device=device, fmt=fmt)
    _check_against_eager(x, w, b, m, 0.2, 0.3, op)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mult", ["C", "1C", "one", "one_negative"])
def test_multiplier_shapes(device, mult):
    x, w, b, m = make(device=device, mult=mult)
    _check_against_eager(x, w, b, m, 0.1, None, (0, 1, 1))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("grad_layout", ["strided", "expanded", "cl"])
def test_non_contiguous_grad_output(device, grad_layout):
    fmt = {"strided": lambda g: g.transpose(2, 4).contiguous().transpose(2, 4),
           "expanded": lambda g: g[:1].expand_as(g), "cl": lambda g: g.contiguous(memory_format=CL)}[grad_layout]
    x, w, b, m = make(device=device)
    _check_against_eager(x, w, b, m, 0.2, 0.2, 1, fmt_grad=fmt)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("slopes", [(0.2, 0.3), (-0.5, 2.0), (0.0, 1.0)], ids=str)
def test_ties(device, slopes):
    # Integer data: every convolution output exact, many windows tie; gradients land where eager's do.
    x, w, b, m = make(2, 3, 4, (3, 3, 4), device=device, values="ties")
    _check_against_eager(x, w, b, m, *slopes, (1, 0, 1))


@pytest.mark.parametrize("device", DEVICES)
def test_nan_and_inf_routed_as_eager(device):
    x, w, b, m = make(1, 2, 3, (3, 3, 3), device=device)
    x[0, 0, 1, 1, 1] = float("nan")
    x[0, 1, 0, 2, 0] = float("inf")
    x[0, 1, 2, 0, 2] = -float("inf")
    _check_against_eager(x, w, b, m, 0.2, 0.3, 1, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
def test_no_bias_selected_includes_nothing_extra(device):
    x, w, _, m = make(device=device, bias=False)
    _check_against_eager(x, w, None, m, 0.2, 0.3, 1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("empty", ["batch", "cout", "cin"])
def test_empty(device, empty):
    # An empty sum gives zeros (grad_input with C_out = 0, grad_weight with N = 0), an empty shape an empty tensor.
    n = 0 if empty == "batch" else 2
    x, w, b, m = make(n, 3, 4, (2, 3, 2), device=device, mult="one" if empty == "cout" else "C")
    out, sel, off = saved(x, w, b, m, 0.2, 0.2, 1)
    # aten's convolution rejects C_in = 0 and C_out = 0; the backward ops take them.
    if empty == "cin":
        x, w = x[:, :0], w[:0]
    if empty == "cout":
        out, sel, off, w = out[:, :0], sel[:, :0], off[:, :0], w[:, :0]
    cout = out.shape[1]
    g = torch.zeros_like(out)
    gc, gb, gm = GRAD_CONV(g, sel, off, m, 0.2, None)
    gw = GRAD_WEIGHT(gc, off, x, [1, 1, 1])
    gi = GRAD_INPUT(gc, off, w, [1, 1, 1])
    assert gc.shape == out.shape and gb.shape == (cout,) and gm.shape == m.shape
    assert gw.shape == w.shape and gi.shape == x.shape
    for t in (gb, gm, gw, gi):
        assert t.numel() == 0 or bool((t == 0).all())


def test_grad_conv_is_the_scalar_formula():
    # grad_conv = grad_input_of(0 + g, selected, m, s1, s2) in float, rounded once; grad_bias its sum.
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x, w, b, m = make(dtype=dtype)
        out, sel, off = saved(x, w, b, m, 0.2, 0.3, 1)
        g = torch.randn(out.shape, dtype=torch.float64).to(dtype)
        g[0, 0, 0, 0, 0] = -0.0
        gc, gb, _ = GRAD_CONV(g, sel, off, m, 0.2, 0.3)
        xs, gf, mf = sel.float(), g.float() + 0, m.float().reshape(1, -1, 1, 1, 1)
        y1 = torch.where(xs > 0, xs, xs * 0.2)
        gy2 = torch.where(y1 * mf > 0, gf, gf * 0.3)
        gy1 = gy2 * mf
        want = torch.where(xs > 0, gy1, gy1 * 0.2).to(dtype)
        assert torch.equal(gc, want) and gc.stride() == off.stride()
        torch.testing.assert_close(gb, gc.float().sum((0, 2, 3, 4)).to(dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", [torch.contiguous_format, CL], ids=["contig", "cl"])
@pytest.mark.parametrize("cout", [1, 4])
def test_layouts_and_fakes_match(device, fmt, cout):
    x, w, b, m = make(2, 3, cout, (2, 3, 4), device=device, fmt=fmt)
    w = w.contiguous(memory_format=fmt)
    out, sel, off = saved(x, w, b, m, 0.2, 0.2, (1, 0, 1))
    g = torch.randn_like(out)
    args = [(GRAD_CONV, (g, sel, off, m, 0.2, None))]
    gc = GRAD_CONV(*args[0][1])[0]
    args += [(GRAD_WEIGHT, (gc, off, x, [1, 0, 1])), (GRAD_INPUT, (gc, off, w, [1, 0, 1]))]
    for fn, a in args:
        real = fn(*a)
        real = real if isinstance(real, tuple) else (real,)
        with FakeTensorMode(allow_non_fake_inputs=False) as mode:
            fake = fn(*[mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in a])
        fake = fake if isinstance(fake, tuple) else (fake,)
        for r, f in zip(real, fake):
            assert (r.shape, r.stride(), r.dtype, r.device) == (f.shape, f.stride(), f.dtype, f.device), fn
    # Documented layouts: grad_conv in offsets' strides, grad_weight contiguous, grad_input in grad_conv's format.
    assert gc.stride() == off.stride()
    assert args[1][0](*args[1][1]).is_contiguous()
    gi = GRAD_INPUT(*args[2][1])
    want_cl = not gc.is_contiguous() and gc.is_contiguous(memory_format=CL)
    assert gi.is_contiguous(memory_format=CL if want_cl else torch.contiguous_format)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", [torch.contiguous_format, CL], ids=["contig", "cl"])
def test_opcheck(device, fmt):
    x, w, b, m = make(1, 2, 3, (2, 2, 3), device=device, fmt=fmt)
    out, sel, off = saved(x, w, b, m, 0.2, 0.3, (1, 0, 1))
    g = torch.randn_like(out)
    gc = GRAD_CONV(g, sel, off, m, 0.2, 0.3)[0]
    for fn, args in ((GRAD_CONV, (g, sel, off, m, 0.2, 0.3)), (GRAD_CONV, (g, sel, off, m.reshape(-1)[:1], 0.2, None)),
                     (GRAD_WEIGHT, (gc, off, x, [1, 0, 1])), (GRAD_INPUT, (gc, off, w, [1, 0, 1]))):
        result = torch.library.opcheck(fn, args)
        assert all(v == "SUCCESS" for v in result.values()), (fn, result)


def test_differentiating_the_ops_raises():
    x, w, b, m = make()
    out, sel, off = saved(x, w, b, m, 0.2, 0.2, 1)
    g = torch.randn_like(out).requires_grad_()
    gc, _, _ = GRAD_CONV(g, sel, off, m, 0.2, None)
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        gc.sum().backward()
    wl = w.detach().requires_grad_()
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        GRAD_INPUT(gc.detach(), off, wl, [1, 1, 1]).sum().backward()


def _error_cases():
    x, w, b, m = make(dtype=torch.float32)
    out, sel, off = saved(x, w, b, m, 0.2, 0.2, 1)
    g = torch.randn_like(out)
    gc = GRAD_CONV(g, sel, off, m, 0.2, None)[0]
    return [
        ("conv-offsets-dtype", GRAD_CONV, (g, sel, off.int(), m, 0.2, None), TypeError, "offsets must be uint8"),
        ("conv-selected-dtype", GRAD_CONV, (g, sel.double(), off, m, 0.2, None), TypeError, "one dtype"),
        ("conv-int-grad", GRAD_CONV, (g.int(), sel.int(), off, m.int(), 0.2, None), TypeError, "floating-point"),
        ("conv-mult-dtype", GRAD_CONV, (g, sel, off, m.double(), 0.2, None), TypeError, "multiplier dtype"),
        ("conv-shapes", GRAD_CONV, (g, sel[:, :2], off, m, 0.2, None), ValueError, "equal shapes"),
        ("conv-mult-shape", GRAD_CONV, (g, sel, off, m[:2], 0.2, None), ValueError, "multiplier of shape"),
        ("conv-4d", GRAD_CONV, (g[0], sel[0], off[0], m, 0.2, None), ValueError, "5-D"),
        ("conv-slope", GRAD_CONV, (g, sel, off, m, 1e300, None), RuntimeError, "negative_slope"),
        ("weight-offsets-dtype", GRAD_WEIGHT, (gc, off.float(), x, [1, 1, 1]), TypeError, "offsets must be uint8"),
        ("weight-input-dtype", GRAD_WEIGHT, (gc, off, x.double(), [1, 1, 1]), TypeError, "input dtype"),
        ("weight-input-size", GRAD_WEIGHT, (gc, off, x[:, :, 1:], [1, 1, 1]), ValueError, "does not fit"),
        ("weight-op-size", GRAD_WEIGHT, (gc, off, x, [0, 1, 1]), ValueError, "does not fit"),
        ("weight-op-value", GRAD_WEIGHT, (gc, off, x, [2, 1, 1]), ValueError, "0 or 1"),
        ("weight-offsets-shape", GRAD_WEIGHT, (gc, off[:1], x, [1, 1, 1]), ValueError, "grad_conv's shape"),
        ("input-weight-dtype", GRAD_INPUT, (gc, off, w.double(), [1, 1, 1]), TypeError, "weight dtype"),
        ("input-weight-cout", GRAD_INPUT, (gc, off, w[:, :2], [1, 1, 1]), ValueError, "weight must be"),
        ("input-weight-kernel", GRAD_INPUT, (gc, off, w[..., :2], [1, 1, 1]), ValueError, "weight must be"),
        ("input-grad-int", GRAD_INPUT, (gc.int(), off, w.int(), [1, 1, 1]), TypeError, "floating-point"),
        ("input-weight-4d", GRAD_INPUT, (gc, off, w[0], [1, 1, 1]), ValueError, "5-D weight"),
    ]


@pytest.mark.parametrize("case", range(19))
def test_errors_raise_documented_types(case):
    name, fn, args, exc, pattern = _error_cases()[case]
    with pytest.raises(exc, match=pattern):
        fn(*args)
    # The fake impl raises the same (compiled code fails like eager code).
    with FakeTensorMode() as mode:
        fargs = [mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in args]
        with pytest.raises(exc, match=pattern):
            fn(*fargs)


def test_none_tensor_raises_type_error():
    x, w, b, m = make()
    out, sel, off = saved(x, w, b, m, 0.2, 0.2, 1)
    with pytest.raises(TypeError, match="multiplier must be a Tensor"):
        GRAD_CONV(out, sel, off, None, 0.2, None)


# ---- CUDA: the kernels against float64, within 1.5x of cuDNN's own error --------------------------------------

def _cudnn_error(gc, off, x, w, op, which):
    """Relative L2 error of aten's convolution_backward in gc's dtype on the same sparse gradient (the error a
    cuDNN backward makes on this input), against float64."""
    def full(t):
        n, c, pd, ph, pw = t.shape
        o = expand(op)
        y = torch.zeros(n, c, 2 * pd + 1 - o[0], 2 * ph + 1 - o[1], 2 * pw + 1 - o[2], dtype=t.dtype, device=t.device)
        win = y[:, :, :2 * pd, :2 * ph, :2 * pw].unflatten(4, (pw, 2)).unflatten(3, (ph, 2)).unflatten(2, (pd, 2))
        hit = off.long().unsqueeze(-1) == torch.arange(8, device=t.device)
        src = torch.where(hit, t.unsqueeze(-1), torch.zeros((), dtype=t.dtype, device=t.device))
        win.copy_(src.unflatten(-1, (2, 2, 2)).permute(0, 1, 2, 5, 3, 6, 4, 7))
        return y

    def run(t, xx, ww):
        mask = [which == 0, which == 1, False]
        r = torch.ops.aten.convolution_backward(full(t), xx, ww, None, [2] * 3, [1] * 3, [1] * 3, True, expand(op), 1,
                                                mask)
        return r[which]

    return rel_l2(run(gc, x, w), run(gc.double(), x.double(), w.double()))


CUDA_DTYPES = [("float32-strict", torch.float32, False), ("float32-tf32", torch.float32, True),
               ("bfloat16", torch.bfloat16, True), ("float16", torch.float16, True)]


@pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU")
@pytest.mark.parametrize("name,dtype,tf32", CUDA_DTYPES, ids=[c[0] for c in CUDA_DTYPES])
@pytest.mark.parametrize("fmt", [torch.contiguous_format, CL], ids=["contig", "cl"])
@pytest.mark.parametrize("shape", ["kb_small", "tails"])
def test_cuda_kernels_close_to_float64(name, dtype, tf32, fmt, shape):
    n, cin, cout, spatial, op = {"kb_small": (2, 16, 32, (4, 6, 5), 1), "tails": (3, 17, 33, (3, 2, 5), (0, 1, 1))}[shape]
    x, w, b, m = make(n, cin, cout, spatial, dtype=dtype, device="cuda", fmt=fmt)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=tf32):
        out, sel, off = saved(x, w, b, m, 0.2, 0.2, op)
        g = torch.randn_like(out)
        (gi, gw, gb, gm), gc = op_grads(x, w, b, m, 0.2, 0.2, op, g, sel, off)
        # The same selection in float64 (the composite): only the backward's arithmetic differs.
        (ri, rw, rb, rm), rc = op_grads(x.double(), w.double(), b.double(), m.double(), 0.2, 0.2, op, g.double(),
                                        sel.double(), off)
        # grad_conv is the elementwise formula in float, rounded once: the CPU composite's bits.
        cpu = [t.cpu() for t in (g, sel, off, m)]
        assert torch.equal(gc.cpu(), GRAD_CONV(*cpu, 0.2, 0.2)[0])
        floor = {torch.float32: 1e-6 if not tf32 else 1e-5, torch.bfloat16: 1e-3, torch.float16: 2e-4}[dtype]
        for label, a, r, which in (("input", gi, ri, 0), ("weight", gw, rw, 1)):
            bound = 1.5 * _cudnn_error(gc, off, x, w, op, which) + floor
            err = rel_l2(a, r)
            assert err <= bound, f"grad {label}: relative L2 {err:.3e} > {bound:.3e}"
        sum_tol = {torch.float32: 1e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}[dtype]
        for label, a, r in (("bias", gb, rb), ("multiplier", gm, rm)):
            assert rel_l2(a, r) <= sum_tol, label
    assert gi.shape == x.shape and gw.shape == w.shape


@pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cuda_kernels_deterministic(dtype):
    x, w, b, m = make(2, 16, 32, (4, 6, 5), dtype=dtype, device="cuda")
    out, sel, off = saved(x, w, b, m, 0.2, 0.2, 1)
    g = torch.randn_like(out)
    first, gc1 = op_grads(x, w, b, m, 0.2, 0.2, 1, g, sel, off)
    second, gc2 = op_grads(x, w, b, m, 0.2, 0.2, 1, g, sel, off)
    for a, c in zip(first + [gc1], second + [gc2]):
        assert torch.equal(a, c)
