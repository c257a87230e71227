"""What fused.conv_transpose3d_post_pool computes, against eager PyTorch, on every device: on CPU through its
composite (aten's convolution, then post_pool), on CUDA through the fused kernel wherever it applies (the
geometry below; float32, bfloat16, float16) and the composite elsewhere (float64).

Two kinds of reference, both eager:
- integer data: every convolution value is a small integer, exact in every precision and summation order, so
  out, selected and offsets must equal eager's float32 chain (F.conv_transpose3d -> F.leaky_relu -> x m ->
  F.leaky_relu -> F.max_pool3d with indices) bit for bit: ties keep the first tap, the last NaN wins;
- random data: float64 eager, within one rounding of the I/O dtype, and for tensor-core precisions within a
  multiple of cuDNN's own error (TF32 1.5x, bfloat16/float16 2x, as issue 17 sets).
"""
import math

import pytest
import torch
import torch.nn.functional as F

import torch_fused_ops  # noqa: F401  (registers torch.ops.fused)

OPS = torch.ops.fused
HAS_CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU"))]
HALF = (torch.bfloat16, torch.float16)


@pytest.fixture(autouse=True)
def _strict_float32():
    # float32 without TF32 unless a test asks for it: the elementwise float32 tolerances assume float32 math.
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        yield


# ---- inputs, the call, the references ------------------------------------------------------------------------

def make(n, cin, cout, dhw, dtype, device, *, bias=True, mult="mixed", seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, cin, *dhw, generator=gen)
    w = torch.randn(cin, cout, 3, 3, 3, generator=gen) / math.sqrt(max(cin, 1) * 8)
    b = torch.randn(cout, generator=gen) * 0.5 if bias else None
    m = torch.randn(cout, generator=gen) + 0.1
    if mult == "mixed":  # negative, zero and positive channels in one tensor
        m[0::3] = -m[0::3].abs()
        m[1::3] = m[1::3].abs()
        m[2::5] = 0.0
    elif mult == "negative":
        m = -m.abs() - 0.05
    elif mult == "positive":
        m = m.abs() + 0.05
    cast = lambda t: None if t is None else t.to(device=device, dtype=dtype)  # noqa: E731
    return cast(x), cast(w), cast(b), cast(m.view(-1, 1, 1, 1))


def make_ints(n, cin, cout, dhw, dtype, device, *, seed=0):
    """Small integers: |conv value| <= 8 * 2 * Cin + 1, exact in bfloat16 for Cin <= 8."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(-2, 3, (n, cin, *dhw), generator=gen).float()
    w = torch.randint(-1, 2, (cin, cout, 3, 3, 3), generator=gen).float()
    b = torch.randint(-1, 2, (cout,), generator=gen).float()
    m = torch.randint(-2, 3, (cout, 1, 1, 1), generator=gen).float() * 0.5
    return [t.to(device=device, dtype=dtype) for t in (x, w, b, m)]


def args(x, w, b, m, s1, s2, op=(1, 1, 1), ceil=False):
    return (x, w, b, [2, 2, 2], [1, 1, 1], list(op), 1, [1, 1, 1], m, s1, [2, 2, 2], [], [0, 0, 0], [1, 1, 1],
            ceil, None if s2 == s1 else s2)


def call(*a, offsets=False, **kw):
    op = OPS.conv_transpose3d_post_pool_with_offsets if offsets else OPS.conv_transpose3d_post_pool
    return op(*args(*a, **kw))


def chain(y, m, s1, s2, ceil=False):
    """Eager epilogue and pool in y's dtype: (out, selected y, window offset (jd*2 + jh)*2 + jw)."""
    e = F.leaky_relu(F.leaky_relu(y, s1) * m.to(y.dtype).reshape(1, -1, 1, 1, 1), s2)
    out, idx = F.max_pool3d(e, 2, 2, ceil_mode=ceil, return_indices=True)
    sel = y.flatten(2).gather(2, idx.flatten(2)).view_as(out)
    ho, wo = y.shape[3], y.shape[4]
    od, oh, ow = idx // (ho * wo), (idx // wo) % ho, idx % wo
    return out, sel, (((od % 2) * 2 + oh % 2) * 2 + ow % 2).to(torch.uint8)


def conv64(x, w, b, op):
    return F.conv_transpose3d(x.double().cpu(), w.double().cpu(), None if b is None else b.double().cpu(), stride=2,
                              padding=1, output_padding=tuple(op))


def reference64(x, w, b, m, s1, s2, op=(1, 1, 1), ceil=False):
    return chain(conv64(x, w, b, op), m.double().cpu(), s1, s2, ceil)[0]


def tol(dtype):
    if dtype in (torch.float32, torch.float64):
        return dict(rtol=1e-5, atol=1e-5)
    # The convolution value is rounded to the I/O dtype, the output once more (the epilogue runs in float32).
    return dict(rtol=2 * torch.finfo(dtype).eps, atol=1e-4)


def half_bound(x, w, b, m, s1, s2, op=(1, 1, 1), ceil=False):
    """Per output, 4 eps of the dtype times the largest |term sum| of its window, scaled by the epilogue: the
    error a half-precision convolution may add before rounding (aten's CPU convolution rounds partial sums, so
    its error scales with the terms, not with the result)."""
    eps = torch.finfo(x.dtype).eps
    mag = conv64(x.abs(), w.abs(), None if b is None else b.abs(), op)
    scale = m.double().cpu().abs().reshape(1, -1, 1, 1, 1) * max(1.0, abs(s1)) * max(1.0, abs(s2))
    return 4 * eps * F.max_pool3d(mag * scale, 2, 2, ceil_mode=ceil)


def check_close(out, ref, dtype, bound=None):
    """out against the float64 reference: the same NaN and infinities, finite values within tol(dtype) (plus
    `bound`, per element)."""
    out = out.double().cpu()
    assert out.shape == ref.shape
    assert torch.equal(out.isnan(), ref.isnan()), "NaN pattern"
    inf = ref.isinf()
    assert torch.equal(out[inf], ref[inf]), "infinities"
    t = tol(dtype)
    allowed = t["atol"] + t["rtol"] * ref.abs() + (0.0 if bound is None else bound)
    err = (out - ref).abs()
    bad = ref.isfinite() & ~(err <= allowed)
    assert not bad.any(), f"{int(bad.sum())} of {ref.numel()} elements off, e.g. {out[bad][:4]} vs {ref[bad][:4]}"


def rel(a, ref):
    return ((a.double().cpu() - ref).norm() / ref.norm()).item()


def poison(shape, dtype, device):
    """On CUDA, hand the caching allocator a NaN-filled block of the output's size to reuse, so that an element
    the kernel leaves unwritten shows as NaN (the op's outputs come from the same allocator)."""
    if device == "cuda":
        t = torch.full(shape, float("nan"), dtype=dtype, device=device)
        del t


def same_bits(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


# ---- values against float64 --------------------------------------------------------------------------------

# (N, Cin, Cout, (D, H, W), output_padding, bias, (s1, s2), multiplier kind): channel tails, odd sizes
VALUE_CASES = [
    (2, 4, 3, (3, 4, 5), (0, 0, 0), True, (0.2, 0.2), "mixed"),
    (2, 5, 17, (4, 3, 2), (1, 0, 1), False, (-0.5, 0.0), "mixed"),
    (1, 16, 32, (3, 3, 3), (1, 1, 1), True, (0.0, -1.3), "negative"),
    (2, 17, 33, (2, 3, 4), (0, 1, 0), True, (1.7, 0.3), "mixed"),
    (2, 1, 1, (3, 5, 3), (1, 1, 1), True, (0.2, 0.2), "positive"),
    (1, 3, 64, (2, 2, 3), (1, 1, 0), True, (-0.1, 2.0), "mixed"),
    (1, 8, 128, (2, 3, 2), (1, 1, 1), False, (0.2, 0.2), "mixed"),
    (2, 33, 40, (1, 1, 1), (1, 1, 1), True, (0.1, -0.2), "mixed"),
]


def _case_id(c):
    n, cin, cout, dhw, op, bias, slopes, mult = c
    return (f"N{n}-{cin}to{cout}-{'x'.join(map(str, dhw))}-op{''.join(map(str, op))}-{'b' if bias else 'nob'}"
            f"-s{slopes[0]}_{slopes[1]}-{mult}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64], ids=str)
@pytest.mark.parametrize("case", VALUE_CASES, ids=_case_id)
def test_values_match_float64(device, dtype, case):
    n, cin, cout, dhw, op, bias, (s1, s2), mult = case
    x, w, b, m = make(n, cin, cout, dhw, dtype, device, bias=bias, mult=mult)
    ref = reference64(x, w, b, m, s1, s2, op)
    poison(ref.shape, dtype, device)
    out = call(x, w, b, m, s1, s2, op)
    assert out.shape == ref.shape and out.dtype == dtype and out.device == x.device
    assert torch.isfinite(out).all()
    check_close(out, ref, dtype, half_bound(x, w, b, m, s1, s2, op) if dtype in HALF else None)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape,op", [((2, 4, 6, 3, 5, 7), (1, 1, 1)), ((1, 8, 17, 4, 5, 3), (0, 1, 0)),
                                      ((3, 3, 33, 2, 6, 4), (1, 0, 1))], ids=["tail6", "tail17", "tail33"])
@pytest.mark.parametrize("offsets", [False, True], ids=["inference", "training"])
def test_integer_data_bit_exact(device, dtype, shape, op, offsets):
    # Many ties (small integers): the first tap in window order must win; NaN and infinities from the input.
    n, cin, cout, d, h, wd = shape
    x, w, b, m = make_ints(n, cin, cout, (d, h, wd), dtype, device, seed=cout)
    flat = x.view(-1)
    flat[5], flat[97] = float("nan"), float("inf")
    y = conv64(x, w, b, op).float()  # exact: every term and sum is a small integer (or inf/NaN)
    ref_out, ref_sel, ref_off = chain(y, m.float().cpu(), 0.2, 0.3)
    assert ref_out.isnan().any() and (ref_off != 0).any()
    res = call(x, w, b, m, 0.2, 0.3, op, offsets=offsets)
    out = res[0] if offsets else res
    assert same_bits(out, ref_out.to(dtype))
    if offsets:
        sel, off = res[1], res[2]
        assert off.dtype == torch.uint8 and sel.dtype == dtype
        assert sel.stride() == out.stride() == off.stride()
        assert same_bits(sel, ref_sel.to(dtype)) and torch.equal(off.cpu(), ref_off)


@pytest.mark.parametrize("device", DEVICES)
def test_zero_weights_tie_every_window(device):
    # Every convolution value is 0: all 8 taps tie, offset 0 everywhere.
    x, w, _, m = make(1, 4, 3, (2, 3, 2), torch.float32, device)
    out, sel, off = call(x, torch.zeros_like(w), None, m, 0.2, 0.2, offsets=True)
    assert not off.any() and not out.any() and not sel.any()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,tf32,factor", [(torch.float32, True, 1.5), (torch.bfloat16, False, 2.0),
                                               (torch.float16, False, 2.0)], ids=["tf32", "bf16", "fp16"])
def test_tensor_core_error_within_cudnn(device, dtype, tf32, factor):
    # Relative L2 error against float64 at most `factor` times the eager chain's (cuDNN's convolution in that
    # precision) on the same inputs; strict float32 separately below.
    x, w, b, m = make(2, 16, 32, (6, 8, 7), dtype, device, mult="mixed", seed=5)
    ref = reference64(x, w, b, m, 0.2, 0.2)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=tf32):
        out = call(x, w, b, m, 0.2, 0.2)
        eager = chain(F.conv_transpose3d(x, w, b, 2, 1, 1), m, 0.2, 0.2)[0]
    assert rel(out, ref) <= factor * rel(eager, ref) + 1e-7, (rel(out, ref), rel(eager, ref))


@pytest.mark.parametrize("device", DEVICES)
def test_strict_float32_error(device):
    x, w, b, m = make(2, 16, 32, (6, 8, 7), torch.float32, device, seed=6)
    assert rel(call(x, w, b, m, 0.2, 0.2), reference64(x, w, b, m, 0.2, 0.2)) < 1e-6


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ceil", [False, True], ids=["floor", "ceil"])
@pytest.mark.parametrize("op", [(0, 0, 0), (1, 1, 1), (1, 0, 1), (0, 1, 1)], ids=lambda o: "op" + "".join(map(str, o)))
def test_output_padding_and_ceil_mode(device, ceil, op):
    # ceil_mode with output_padding 0 pools one more (partial) plane: the composite covers it.
    x, w, b, m = make(2, 5, 7, (3, 4, 5), torch.float32, device, seed=8)
    ref = reference64(x, w, b, m, 0.2, -0.3, op, ceil)
    out = call(x, w, b, m, 0.2, -0.3, op, ceil=ceil)
    assert out.shape == ref.shape
    torch.testing.assert_close(out.double().cpu(), ref, **tol(torch.float32))


# ---- non-finite values ----------------------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("slopes", [(0.2, 0.2), (0.0, -0.5)], ids=["pos_slopes", "zero_neg_slopes"])
def test_nan_and_inf_propagate(device, dtype, slopes):
    x, w, b, m = make(2, 16, 40, (4, 5, 6), dtype, device, seed=21)
    flat = x.view(-1)
    flat[3], flat[500], flat[901], flat[1500] = float("inf"), float("-inf"), float("nan"), float("-inf")
    w[0, 1, 1, 1, 1] = 0.0  # inf * 0 = NaN, as in the convolution
    ref = reference64(x, w, b, m, *slopes)
    assert ref.isnan().any() and ref.isinf().any() and ref.isfinite().float().mean() > 0.5
    out = call(x, w, b, m, *slopes)
    assert torch.equal(out.cpu().isinf(), ref.isinf())
    check_close(out, ref, dtype, half_bound(x, w, b, m, *slopes) if dtype in HALF else None)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("breaker", ["zero-multiplier", "inf-multiplier", "nan-multiplier", "inf-bias",
                                     "nan-bias"])
def test_channels_that_break_the_monotone_shortcut(device, breaker):
    # Slopes > 0 and finite nonzero multipliers of both signs allow max (or min) before the epilogue; one channel
    # that breaks it (here channel 20 of 40) must still give max_pool3d's values, with infinite inputs present.
    x, w, b, m = make(2, 16, 40, (4, 5, 6), torch.float32, device, mult="positive", seed=13)
    m[0::3] = -m[0::3]
    flat = x.view(-1)
    flat[7], flat[800], flat[1201] = float("inf"), float("-inf"), float("inf")
    target, value = {"zero-multiplier": (m, 0.0), "inf-multiplier": (m, -math.inf), "nan-multiplier": (m, math.nan),
                     "inf-bias": (b, math.inf), "nan-bias": (b, math.nan)}[breaker]
    target.view(-1)[20] = value
    check_close(call(x, w, b, m, 0.2, 0.2), reference64(x, w, b, m, 0.2, 0.2), torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mult", ["positive", "negative"])
def test_all_minus_inf_windows(device, mult):
    # A -inf input with positive weights makes every value of its window -inf (after the epilogue, for either
    # sign of the multiplier: a negative one needs +inf, from negated weights). max_pool3d outputs -inf there and
    # reports the first tap; the input gradient follows eager's.
    x, w, b, m = make(1, 3, 4, (3, 4, 3), torch.float32, device, mult=mult, seed=30)
    w = w.abs() + 0.1
    if mult == "negative":
        w = -w
    x[0, 1, 1, 2, 1] = float("-inf")
    ref = reference64(x, w, b, m, 0.2, 0.2)
    assert (ref[0, :, 1, 2, 1] == float("-inf")).all()
    out, _, off = call(x, w, b, m, 0.2, 0.2, offsets=True)
    assert torch.equal(out.cpu().isinf(), ref.isinf()) and (out[0, :, 1, 2, 1] == float("-inf")).all()
    assert (off[0, :, 1, 2, 1] == 0).all()
    torch.testing.assert_close(out.double().cpu(), ref, **tol(torch.float32))
    if mult == "positive":  # a negative multiplier is where the saved value differs (docs/design.md, -inf windows)
        xr = x.clone().requires_grad_()
        g = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1)).to(device)
        got, = torch.autograd.grad(OPS.conv_transpose3d_post_pool(*args(xr, w, b, m, 0.2, 0.2)), xr, g)
        x64 = x.double().cpu().requires_grad_()
        want, = torch.autograd.grad(reference64(x64, w, b, m, 0.2, 0.2), x64, g.double().cpu())
        torch.testing.assert_close(got.double().cpu(), want, rtol=1e-5, atol=1e-5)


# ---- layouts, shapes, multipliers ------------------------------------------------------------------------------

LAYOUTS = {
    "contig": lambda t: t.contiguous(),
    "cl": lambda t: t.contiguous(memory_format=torch.channels_last_3d),
    "strided": lambda t: torch.cat([t, t], dim=-1)[..., ::2],  # a step on W: neither format, copied first
    "permuted": lambda t: t.permute(0, 1, 4, 3, 2).contiguous().permute(0, 1, 4, 3, 2),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("xl", list(LAYOUTS))
@pytest.mark.parametrize("wl", ["contig", "cl", "strided"])
def test_layouts(device, dtype, xl, wl):
    # Inputs and weights of any layout; the output takes the eager composite's memory format (the
    # convolution's) in every form.
    x, w, b, m = make(2, 6, 9, (3, 4, 5), dtype, device, seed=3)
    x, w = LAYOUTS[xl](x), LAYOUTS[wl](w)
    eager = chain(F.conv_transpose3d(x, w, b, 2, 1, 1), m, 0.2, 0.2)[0]
    ref = reference64(x, w, b, m, 0.2, 0.2)
    for t in (call(x, w, b, m, 0.2, 0.2), *call(x, w, b, m, 0.2, 0.2, offsets=True)):
        assert t.shape == eager.shape and t.stride() == eager.stride(), (t.stride(), eager.stride())
    check_close(call(x, w, b, m, 0.2, 0.2), ref, dtype, half_bound(x, w, b, m, 0.2, 0.2) if dtype in HALF else None)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch(device):
    x, w, b, m = make(0, 4, 6, (3, 3, 3), torch.float32, device)
    want = (0, 6, 3, 3, 3)
    out = call(x, w, b, m, 0.2, 0.2)
    res = call(x, w, b, m, 0.2, 0.2, offsets=True)
    for t in (out, *res):
        assert tuple(t.shape) == want and t.device == x.device
    assert res[2].dtype == torch.uint8 and res[1].dtype == torch.float32
    # Gradients as eager's: an empty input gradient, zeros for weight, bias and multiplier.
    leaves = [t.clone().requires_grad_() for t in (x, w, b, m)]
    grads = torch.autograd.grad(OPS.conv_transpose3d_post_pool(*args(*leaves, 0.2, 0.2)).sum(), leaves)
    for g, leaf in zip(grads, leaves):
        assert g.shape == leaf.shape and not g.any()


@pytest.mark.parametrize("device", DEVICES)
def test_too_small_output_raises(device):
    x, w, b, m = make(2, 4, 6, (1, 3, 3), torch.float32, device)
    with pytest.raises(ValueError, match="too small"):
        call(x, w, b, m, 0.2, 0.2, (0, 1, 1))  # D = 1 with output_padding 0: a convolution output of 1 plane


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(), (1,), (7, 1, 1, 1), (1, 7, 1, 1, 1), (1, 1, 1, 1, 1)], ids=str)
def test_multiplier_shapes(device, shape):
    x, w, b, _ = make(2, 5, 7, (3, 2, 3), torch.float32, device, seed=9)
    numel = math.prod(shape)
    m = (torch.randn(numel, generator=torch.Generator().manual_seed(2)) - 0.3).view(shape).to(device)
    ref = chain(conv64(x, w, b, (1, 1, 1)), m.double().cpu().reshape(-1).expand(7) if numel == 1 else m.double().cpu(),
                0.2, 0.2)[0]
    torch.testing.assert_close(call(x, w, b, m, 0.2, 0.2).double().cpu(), ref, **tol(torch.float32))


@pytest.mark.parametrize("device", DEVICES)
def test_weight_updates_are_seen(device):
    # Each call uses the weight as it is now: after in-place updates (one bypassing the version counter), for
    # another tensor, for an inference tensor.
    x, w, b, m = make(1, 4, 6, (2, 3, 2), torch.float32, device)

    def check(weight):
        torch.testing.assert_close(call(x, weight, b, m, 0.2, 0.2).double().cpu(),
                                   reference64(x, weight.detach(), b, m, 0.2, 0.2), **tol(torch.float32))

    check(w)
    check(w * 1)
    with torch.no_grad():
        w.mul_(-1.5)
    check(w)
    w.data.add_(0.25)
    check(w)
    with torch.inference_mode():
        check(w.clone() * 0.5)


# ---- gradients and the op's contract ---------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", [VALUE_CASES[0], VALUE_CASES[3], VALUE_CASES[4], VALUE_CASES[6]], ids=_case_id)
@pytest.mark.parametrize("fmt", ["contig", "cl"])
def test_gradients_match_float64(device, case, fmt):
    # float32 (strict) against float64 eager autograd, by relative norm: a window whose two largest values lie
    # within float32 rounding of each other may select the other element.
    n, cin, cout, dhw, op, bias, (s1, s2), mult = case
    x, w, b, m = make(n, cin, cout, dhw, torch.float32, device, bias=bias, mult=mult, seed=4)
    x = LAYOUTS[fmt](x)
    leaves = [t.clone().requires_grad_() for t in (x, w, b, m) if t is not None]
    bias_leaf = leaves[2] if bias else None
    out = OPS.conv_transpose3d_post_pool(*args(leaves[0], leaves[1], bias_leaf, leaves[-1], s1, s2, op))
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(device)
    got = torch.autograd.grad(out, leaves, g)
    leaves64 = [t.detach().double().cpu().requires_grad_() for t in leaves]
    ref = reference64(leaves64[0], leaves64[1], leaves64[2] if bias else None, leaves64[-1], s1, s2, op)
    want = torch.autograd.grad(ref, leaves64, g.double().cpu())
    for i, (a, e) in enumerate(zip(got, want)):
        assert a.shape == e.shape and rel(a, e) < 1e-4, f"grad {i}: relative error {rel(a, e):.2e}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("fmt", ["contig", "cl"])
def test_opcheck(device, dtype, fmt):
    x, w, b, m = make(1, 4, 6, (2, 3, 2), dtype, device, seed=11)
    x = LAYOUTS[fmt](x)
    torch.library.opcheck(OPS.conv_transpose3d_post_pool.default, args(x, w, b, m, 0.2, 0.3))
    leaves = [t.requires_grad_() for t in (x, w, b, m)]
    torch.library.opcheck(OPS.conv_transpose3d_post_pool_with_offsets.default, args(*leaves, 0.2, 0.3))


@pytest.mark.parametrize("offsets", [False, True], ids=["inference", "training"])
def test_fake_impl_keeps_sizes_symbolic(offsets):
    # Under torch.compile(dynamic=True) the fake impl runs on symbolic sizes: batch and spatial sizes stay
    # symbolic and the strides are the real outputs'.
    from torch.fx.experimental.proxy_tensor import make_fx

    op = OPS.conv_transpose3d_post_pool_with_offsets if offsets else OPS.conv_transpose3d_post_pool
    x, w, b, m = make(2, 4, 6, (3, 4, 5), torch.float32, "cpu")
    for fmt in ("contig", "cl"):
        xf = LAYOUTS[fmt](x)
        gm = make_fx(lambda *t: op(*args(*t, 0.2, 0.2, (1, 1, 0))), tracing_mode="symbolic")(xf, w, b, m)
        node = next(n for n in gm.graph.nodes if n.op == "call_function" and "conv_transpose3d_post_pool" in
                    str(n.target))
        vals = node.meta["val"] if offsets else [node.meta["val"]]
        real = op(*args(xf, w, b, m, 0.2, 0.2, (1, 1, 0)))
        real = real if offsets else [real]
        for v, r in zip(vals, real):
            assert any(isinstance(s, torch.SymInt) for s in v.shape), v.shape
            assert [int(s) for s in v.shape] == list(r.shape) and [int(s) for s in v.stride()] == list(r.stride())
