"""The Triton conv_transpose3d -> LeakyReLU -> x multiplier -> LeakyReLU -> MaxPool3d kernel against float64 eager.

On a machine without CUDA these run through the Triton interpreter on CPU tensors, which Triton only selects
when TRITON_INTERPRET=1 is set before the kernel module is imported:

    TRITON_INTERPRET=1 python3 -m pytest tests/test_conv_post_pool_triton.py -q

Every expected value comes from F.conv_transpose3d / F.leaky_relu / F.max_pool3d in float64 on CPU.
"""
import math
import os

import pytest
import torch
import torch.nn.functional as F
from fused_testing import launch_recorder

if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs CUDA, or TRITON_INTERPRET=1 set before import to run the Triton interpreter on CPU",
                allow_module_level=True)
pytest.importorskip("triton")

from torch_fused_ops import _conv_post_pool_triton as cpt  # noqa: E402

DEVICE = "cpu" if cpt._INTERPRET else "cuda"
HALF_DTYPES = (torch.float16, torch.bfloat16)


# ----------------------------------------------------------------------------------------------------------
# Inputs and the float64 reference
# ----------------------------------------------------------------------------------------------------------
def make_multiplier(cout, kind, gen):
    m = torch.randn(cout, generator=gen) + 0.1
    if kind == "mixed":
        # Negative, zero and positive channels in one tensor.
        m[0::3] = -m[0::3].abs()
        m[1::3] = m[1::3].abs()
        m[2::5] = 0.0
    elif kind == "negative":
        m = -m.abs() - 0.05
    elif kind == "positive":
        m = m.abs() + 0.05
    return m


def make_case(n, cin, cout, dhw, dtype=torch.float32, bias=True, mult="mixed", seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, cin, *dhw, generator=gen)
    w = torch.randn(cin, cout, 3, 3, 3, generator=gen) / math.sqrt(max(cin, 1) * 8)
    b = torch.randn(cout, generator=gen) * 0.5 if bias else None
    m = make_multiplier(cout, mult, gen)

    def dev(t):
        return None if t is None else t.to(dtype).to(DEVICE)

    return dev(x), dev(w), dev(b), dev(m)


def epilogue64(y, m, s1, s2):
    return F.leaky_relu(F.leaky_relu(y, s1) * m.double().cpu().view(1, -1, 1, 1, 1), s2)


def reference(x, w, b, m, s1, s2, op):
    """(y, e, out) in float64 on CPU from the (already rounded) inputs."""
    y = F.conv_transpose3d(x.double().cpu(), w.double().cpu(), None if b is None else b.double().cpu(), stride=2,
                           padding=1, output_padding=op)
    e = epilogue64(y, m, s1, s2)
    return y, e, F.max_pool3d(e, 2, 2)


def tolerances(dtype):
    if dtype == torch.float32:
        return dict(rtol=1e-5, atol=1e-5)
    # y is rounded to the I/O dtype once (1 ulp at worst, since fp32 and float64 sums can straddle a rounding
    # boundary) and out once more (half an ulp); the epilogue scales both errors with the value itself.
    return dict(rtol=2 * torch.finfo(dtype).eps, atol=1e-4)


def run(x, w, b, m, s1, s2, op, with_offsets=False, allow_tf32=False):
    return cpt.conv_transpose3d_post_pool_triton(x, w, b, m, s1, s2, op, allow_tf32, with_offsets)


def windows(t, pooled_shape):
    """[N, C, Do, Ho, Wo] -> [N, C, Dp, Hp, Wp, 8], last dim in window offset order pd*4 + ph*2 + pw."""
    dp, hp, wp = pooled_shape
    n, c = t.shape[:2]
    t = t[:, :, : 2 * dp, : 2 * hp, : 2 * wp]
    return t.reshape(n, c, dp, 2, hp, 2, wp, 2).permute(0, 1, 2, 4, 6, 3, 5, 7).reshape(n, c, dp, hp, wp, 8)


def reference_offsets(e):
    """max_pool3d's own choice (CPU float64) as a window offset."""
    _, idx = F.max_pool3d(e, 2, 2, return_indices=True)
    ho, wo = e.shape[3:]
    dp, hp, wp = idx.shape[2:]
    d, h, w = idx // (ho * wo), (idx // wo) % ho, idx % wo
    qd = torch.arange(dp).view(-1, 1, 1)
    qh = torch.arange(hp).view(1, -1, 1)
    qw = torch.arange(wp).view(1, 1, -1)
    return (d - 2 * qd) * 4 + (h - 2 * qh) * 2 + (w - 2 * qw)


def check_offsets(out, selected, offsets, y64, e64, m, s1, s2, dtype):
    pooled = out.shape[2:]
    assert offsets.dtype == torch.uint8 and selected.dtype == dtype
    assert selected.shape == out.shape == offsets.shape
    assert selected.stride() == out.stride() == offsets.stride()
    off = offsets.cpu().long()
    assert int(off.min()) >= 0 and int(off.max()) <= 7

    # The reported conv value is the float64 conv output at the reported window element.
    y_at = torch.gather(windows(y64, pooled), -1, off.unsqueeze(-1)).squeeze(-1)
    sel_tol = tolerances(dtype) if dtype == torch.float32 else dict(rtol=torch.finfo(dtype).eps, atol=1e-4)
    torch.testing.assert_close(selected.cpu().double(), y_at, equal_nan=True, **sel_tol)

    # out is the epilogue of that value (fp32 epilogue, one rounding).
    ys = selected.cpu().float()
    v = torch.where(ys > 0, ys, ys * s1) * m.cpu().float().view(1, -1, 1, 1, 1)
    e_sel = torch.where(v > 0, v, v * s2).to(dtype)
    torch.testing.assert_close(out.cpu(), e_sel, equal_nan=True)

    # Where max_pool3d's winner is clear, the offset is its index. Decided exactly as well: NaN windows (the
    # last NaN wins) and channels with a zero multiplier (every element is +-0, a tie, so the first is kept).
    ew = windows(e64, pooled)
    top2 = ew.nan_to_num(nan=0.0).topk(2, dim=-1).values
    margin = 1e-3 if dtype == torch.float32 else 4 * torch.finfo(dtype).eps * top2[..., 0].abs() + 1e-3
    clear = (top2[..., 0] - top2[..., 1]) > margin
    has_nan = ew.isnan().any(-1)
    zero_channel = (m.cpu() == 0).view(1, -1, 1, 1, 1).expand_as(clear)
    clear = (clear & ~has_nan) | has_nan | (zero_channel & ~has_nan)
    assert clear.float().mean() > 0.3, "too few decided windows for the offset check to mean anything"
    ref_off = reference_offsets(e64)
    assert torch.equal(off[clear], ref_off[clear])


# ----------------------------------------------------------------------------------------------------------
# Values
# ----------------------------------------------------------------------------------------------------------
# (N, Cin, Cout, (D, H, W), output_padding, bias, (s1, s2), multiplier kind)
FP32_CASES = [
    (2, 4, 3, (3, 4, 5), (0, 0, 0), True, (0.2, 0.2), "mixed"),
    (2, 4, 3, (3, 4, 5), (1, 1, 1), True, (0.2, 0.2), "mixed"),
    (2, 5, 17, (4, 3, 2), (1, 0, 1), False, (-0.5, 0.0), "mixed"),
    (1, 16, 32, (3, 3, 3), (1, 1, 1), True, (0.0, -1.3), "negative"),
    (2, 17, 33, (2, 3, 4), (0, 1, 0), True, (1.7, 0.3), "mixed"),
    (2, 7, 5, (1, 1, 1), (1, 1, 1), True, (0.1, -0.2), "mixed"),
    (2, 3, 8, (1, 5, 6), (1, 0, 0), False, (0.2, 0.2), "positive"),
    (1, 16, 32, (5, 6, 7), (1, 1, 1), True, (0.2, 0.2), "mixed"),
    (1, 8, 128, (2, 2, 3), (1, 1, 0), True, (-0.1, 2.0), "mixed"),
]


def _case_id(case):
    n, cin, cout, dhw, op, bias, slopes, mult = case
    dims, ops = "x".join(map(str, dhw)), "".join(map(str, op))
    return f"N{n}-{cin}to{cout}-{dims}-op{ops}-{'b' if bias else 'nob'}-s{slopes[0]}_{slopes[1]}-{mult}"


@pytest.mark.parametrize("case", FP32_CASES, ids=_case_id)
def test_fp32_matches_float64(case):
    n, cin, cout, dhw, op, bias, (s1, s2), mult = case
    x, w, b, m = make_case(n, cin, cout, dhw, bias=bias, mult=mult)
    _, _, ref = reference(x, w, b, m, s1, s2, op)
    out = run(x, w, b, m, s1, s2, op)
    assert out.shape == ref.shape and out.dtype == torch.float32 and out.device == x.device
    assert out.is_contiguous()
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.cpu().double(), ref, **tolerances(torch.float32))


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize("case", [FP32_CASES[1], FP32_CASES[2], FP32_CASES[4], FP32_CASES[7]], ids=_case_id)
def test_half_matches_float64(dtype, case):
    n, cin, cout, dhw, op, bias, (s1, s2), mult = case
    x, w, b, m = make_case(n, cin, cout, dhw, dtype=dtype, bias=bias, mult=mult)
    _, _, ref = reference(x, w, b, m, s1, s2, op)
    out = run(x, w, b, m, s1, s2, op)
    assert out.dtype == dtype and out.shape == ref.shape
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.cpu().double(), ref, **tolerances(dtype))


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
def test_half_epilogue_sees_rounded_conv_output(dtype):
    # The tolerance above cannot tell whether y was rounded to the I/O dtype before the epilogue (the spec: as a
    # real conv output would be). Simulating that rounding in the reference should then match almost bit for bit;
    # only fp32-vs-float64 sums straddling a rounding boundary may differ.
    x, w, b, m = make_case(2, 16, 32, (3, 4, 3), dtype=dtype)
    s1, s2 = 0.3, -0.7
    y64, _, _ = reference(x, w, b, m, s1, s2, (1, 1, 1))
    ref = F.max_pool3d(epilogue64(y64.to(dtype).double(), m, s1, s2), 2, 2).to(dtype)
    out = run(x, w, b, m, s1, s2, (1, 1, 1)).cpu()
    assert (out == ref).double().mean() > 0.98


def test_tf32_flag():
    # TF32 only loosens the fp32 dot; the result must still be the same function within TF32 accuracy.
    x, w, b, m = make_case(2, 16, 32, (3, 4, 3))
    _, _, ref = reference(x, w, b, m, 0.2, 0.2, (1, 1, 1))
    out = run(x, w, b, m, 0.2, 0.2, (1, 1, 1), allow_tf32=True)
    torch.testing.assert_close(out.cpu().double(), ref, rtol=1e-2, atol=1e-2)


def test_chunked_cin_and_tiled_cout(monkeypatch):
    # Shrinking the chunk limits sends Cin=33 through 3 runtime K chunks and Cout=40 over 4 column programs.
    monkeypatch.setattr(cpt, "_MAX_BK", 16)
    monkeypatch.setattr(cpt, "_MAX_BN", 16)
    x, w, b, m = make_case(2, 33, 40, (2, 3, 3))
    y64, e64, ref = reference(x, w, b, m, -0.3, 0.7, (1, 0, 1))
    out, selected, offsets = run(x, w, b, m, -0.3, 0.7, (1, 0, 1), with_offsets=True)
    torch.testing.assert_close(out.cpu().double(), ref, **tolerances(torch.float32))
    check_offsets(out, selected, offsets, y64, e64, m, -0.3, 0.7, torch.float32)


def test_every_config():
    x, w, b, m = make_case(2, 5, 17, (3, 4, 5))
    _, _, ref = reference(x, w, b, m, 0.2, -0.4, (1, 1, 1))
    configs = list(cpt._CONFIGS)
    assert configs
    for cfg in configs:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(cpt, "_fixed_config", lambda precision, cfg=cfg: cfg)
            out = run(x, w, b, m, 0.2, -0.4, (1, 1, 1))
            assert cpt.last_config() is cfg
        torch.testing.assert_close(out.cpu().double(), ref, **tolerances(torch.float32),
                                   msg=lambda s, cfg=cfg: f"{cfg}: {s}")


def _check_fp32(x, w, b, m, op=(1, 1, 1), s1=0.2, s2=0.2):
    out = run(x, w, b, m, s1, s2, op)
    _, _, ref = reference(x, w.detach(), None if b is None else b.detach(), m, s1, s2, op)
    torch.testing.assert_close(out.cpu().double(), ref, **tolerances(torch.float32))
    return out


def test_weight_updates_are_seen():
    # Each call must use the weight as it is now: after an in-place update (also one that bypasses the version
    # counter), for another tensor, and for an inference tensor.
    x, w, b, m = make_case(1, 4, 6, (2, 3, 2))
    _check_fp32(x, w, b, m)
    _check_fp32(x, w * 1, b, m)
    with torch.no_grad():
        w.mul_(-1.5)
    _check_fp32(x, w, b, m)
    w.data.add_(0.25)
    _check_fp32(x, w, b, m)
    with torch.inference_mode():
        w_inf = w.clone() * 0.5
        _check_fp32(x, w_inf, b, m)


def test_parameters_requiring_grad():
    x, w, b, m = make_case(2, 5, 7, (2, 2, 3))
    out = _check_fp32(x, w.clone().requires_grad_(), b.clone().requires_grad_(), m)
    assert not out.requires_grad

# ----------------------------------------------------------------------------------------------------------
# Layouts
# ----------------------------------------------------------------------------------------------------------
def test_channels_last_input_gives_channels_last_output():
    x, w, b, m = make_case(2, 6, 9, (3, 4, 5))
    x = x.contiguous(memory_format=torch.channels_last_3d)
    assert not x.is_contiguous()
    _, _, ref = reference(x, w, b, m, 0.2, 0.2, (1, 1, 1))
    out, selected, offsets = run(x, w, b, m, 0.2, 0.2, (1, 1, 1), with_offsets=True)
    for t in (out, selected, offsets):
        assert t.is_contiguous(memory_format=torch.channels_last_3d) and not t.is_contiguous()
    torch.testing.assert_close(out.cpu().double(), ref, **tolerances(torch.float32))


def test_output_layout_matches_the_fake_impl_for_strided_channels_last_views():
    # A channels_last view with a step on W is neither contiguous nor channels_last-contiguous; the op's fake
    # impl reports _geometry.output_memory_format for it, and the kernel's real outputs must have those strides.
    from torch_fused_ops import _geometry

    x, w, b, m = make_case(2, 6, 9, (3, 4, 10))
    x = x.contiguous(memory_format=torch.channels_last_3d)[..., ::2]
    fmt = _geometry.output_memory_format(x)
    assert fmt == torch.channels_last_3d
    _, _, ref = reference(x, w, b, m, 0.2, 0.2, (1, 1, 1))
    for t in run(x, w, b, m, 0.2, 0.2, (1, 1, 1), with_offsets=True):
        assert t.is_contiguous(memory_format=fmt)
    torch.testing.assert_close(run(x, w, b, m, 0.2, 0.2, (1, 1, 1)).cpu().double(), ref,
                               **tolerances(torch.float32))


@pytest.mark.parametrize("kind", ["strided_w", "permuted"])
def test_non_contiguous_input(kind):
    gen = torch.Generator().manual_seed(3)
    n, cin, d, h, wd = 2, 5, 3, 4, 3
    # The views are taken on the device: moving a CPU view there would make it contiguous.
    if kind == "strided_w":
        x = torch.randn(n, cin, d, h, 2 * wd, generator=gen).to(DEVICE)[..., ::2]
    else:
        x = torch.randn(h, n, wd, d, cin, generator=gen).to(DEVICE).permute(1, 4, 3, 0, 2)
    assert x.shape == (n, cin, d, h, wd) and not x.is_contiguous()
    assert not x.is_contiguous(memory_format=torch.channels_last_3d)
    _, w, b, m = make_case(1, cin, 7, (1, 1, 1))
    _, _, ref = reference(x, w, b, m, 0.2, -0.1, (0, 1, 1))
    out = run(x, w, b, m, 0.2, -0.1, (0, 1, 1))
    assert out.is_contiguous() and out.shape == ref.shape
    torch.testing.assert_close(out.cpu().double(), ref, **tolerances(torch.float32))


# ----------------------------------------------------------------------------------------------------------
# Empty shapes
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("with_offsets", [False, True])
@pytest.mark.parametrize("shape, op", [((0, 4, 3, 3, 3), (1, 1, 1)), ((2, 4, 1, 3, 3), (0, 1, 1))],
                         ids=["N0", "D1_op0"])
def test_empty_outputs_do_not_launch(monkeypatch, shape, op, with_offsets):
    class NoLaunch:
        def __getitem__(self, grid):
            raise AssertionError("kernel launched for an empty output")

    monkeypatch.setattr(cpt, "_kernel", NoLaunch())
    x = torch.randn(shape).to(DEVICE)
    _, w, b, m = make_case(1, 4, 6, (1, 1, 1))
    # max_pool3d refuses an empty output, so the expected shape comes from the conv output and the pool formula.
    y = F.conv_transpose3d(x.double().cpu(), w.double().cpu(), b.double().cpu(), stride=2, padding=1,
                           output_padding=op)
    expected = (*y.shape[:2], *((s - 2) // 2 + 1 for s in y.shape[2:]))
    assert 0 in expected
    res = run(x, w, b, m, 0.2, 0.2, op, with_offsets=with_offsets)
    outs = res if with_offsets else (res,)
    for t in outs:
        assert tuple(t.shape) == expected
    if with_offsets:
        assert outs[2].dtype == torch.uint8 and outs[1].dtype == torch.float32


# ----------------------------------------------------------------------------------------------------------
# Non-finite inputs
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("slopes", [(0.2, 0.2), (0.0, -0.5)], ids=["pos_slopes", "zero_neg_slopes"])
def test_nan_and_inf_propagate(dtype, slopes):
    s1, s2 = slopes
    x, w, b, m = make_case(2, 4, 5, (4, 4, 4), dtype=dtype)
    x = x.clone()
    x[0, 1, 0, 0, 0] = float("nan")
    x[0, 2, 3, 2, 1] = float("inf")
    x[1, 0, 1, 3, 3] = float("-inf")
    x[1, 3, 2, 0, 2] = float("nan")
    y64, e64, ref = reference(x, w, b, m, s1, s2, (1, 1, 1))
    assert ref.isnan().any() and (~torch.isfinite(ref)).sum() < ref.numel() // 2
    out, selected, offsets = run(x, w, b, m, s1, s2, (1, 1, 1), with_offsets=True)
    torch.testing.assert_close(out.cpu().double(), ref, equal_nan=True, **tolerances(dtype))
    assert torch.equal(out.cpu().isnan(), ref.isnan())
    check_offsets(out, selected, offsets, y64, e64, m, s1, s2, dtype)


# ----------------------------------------------------------------------------------------------------------
# The monotone form (mono=True: a sweep candidate, one max per phase and the epilogue once)
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("breaker", ["none", "zero-multiplier", "nan-multiplier", "inf-bias"])
def test_monotone_form(monkeypatch, dtype, breaker):
    # Cout 40 over three channel blocks of 16; finite nonzero multipliers of both signs, NaN and +-inf inputs.
    # With a breaker in the middle block, that block also runs the exact selection; all must match float64
    # max_pool3d and the exact form.
    monkeypatch.setattr(cpt, "_MAX_BN", 16)
    x, w, b, m = make_case(2, 16, 40, (4, 5, 6), dtype=torch.float32, mult="positive", seed=21)
    m[0::3] = -m[0::3]
    flat = x.view(-1)
    flat[3], flat[500], flat[901], flat[1500] = float("inf"), float("-inf"), float("nan"), float("-inf")
    if breaker == "zero-multiplier":
        m[20] = 0.0
    elif breaker == "nan-multiplier":
        m[20] = float("nan")
    elif breaker == "inf-bias":
        b[20] = float("inf")
    x, w, b, m = (t.to(dtype) for t in (x, w, b, m))
    op = (1, 1, 1)
    _, _, ref = reference(x, w, b, m, 0.2, 0.2, op)
    out = cpt.conv_transpose3d_post_pool_triton(x, w, b, m, 0.2, 0.2, op, False, False, mono=True)
    exact = cpt.conv_transpose3d_post_pool_triton(x, w, b, m, 0.2, 0.2, op, False, False)
    assert torch.equal(out.cpu().isnan(), ref.isnan())
    torch.testing.assert_close(out.cpu().double(), ref, equal_nan=True, **tolerances(dtype))
    # Bitwise on the interpreter and in bf16; on the H200 the phase-split kernel's two float32 forms differed at
    # rounding level (see tests/test_conv_phase_gemm.py).
    same = dict(rtol=0, atol=0) if cpt._INTERPRET or dtype != torch.float32 else tolerances(dtype)
    torch.testing.assert_close(out, exact, equal_nan=True, **same)


@pytest.mark.parametrize("s1,s2,offsets,want", [(0.2, 0.2, False, True), (0.0, 0.2, False, False),
                                                 (0.2, -0.1, False, False), (0.2, 0.2, True, False),
                                                 # decided on the float32 slopes the kernels compute with: 1e-50
                                                 # and 1e-46 are 0 there, 1e-45 the smallest subnormal; an
                                                 # infinite slope makes 0 * inf = NaN
                                                 (1e-50, 0.2, False, False), (0.2, 1e-46, False, False),
                                                 (1e-45, 0.2, False, True), (math.inf, 0.2, False, False),
                                                 (0.2, math.inf, False, False), (3.4028234663852886e38, 0.2, False,
                                                                                 True)])
def test_monotone_form_only_where_exact(s1, s2, offsets, want):
    record, seen = launch_recorder()
    x, w, b, m = make_case(1, 4, 5, (2, 3, 2))
    cpt.conv_transpose3d_post_pool_triton(x, w, b, m, s1, s2, (1, 1, 1), False, offsets, kernel_wrapper=record,
                                          mono=True)
    assert seen["MONO"] is want


# ----------------------------------------------------------------------------------------------------------
# with_offsets
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, *HALF_DTYPES], ids=str)
@pytest.mark.parametrize("case", [FP32_CASES[1], FP32_CASES[2], FP32_CASES[4]], ids=_case_id)
def test_offsets_and_selected(dtype, case):
    n, cin, cout, dhw, op, bias, (s1, s2), mult = case
    x, w, b, m = make_case(n, cin, cout, dhw, dtype=dtype, bias=bias, mult=mult, seed=7)
    y64, e64, ref = reference(x, w, b, m, s1, s2, op)
    out, selected, offsets = run(x, w, b, m, s1, s2, op, with_offsets=True)
    torch.testing.assert_close(out.cpu().double(), ref, **tolerances(dtype))
    check_offsets(out, selected, offsets, y64, e64, m, s1, s2, dtype)


def test_ties_keep_first_element():
    # Zero weights and bias make every conv output 0: all 8 window elements tie, and max_pool3d keeps the first.
    x, w, _, m = make_case(1, 4, 3, (2, 3, 2))
    w = torch.zeros_like(w)
    out, selected, offsets = run(x, w, None, m, 0.2, 0.2, (1, 1, 1), with_offsets=True)
    assert torch.equal(offsets.cpu(), torch.zeros_like(offsets.cpu()))
    assert torch.equal(out.cpu(), torch.zeros_like(out.cpu())) and torch.equal(selected.cpu(), out.cpu())


# ----------------------------------------------------------------------------------------------------------
# Dispatch predicate and argument checks
# ----------------------------------------------------------------------------------------------------------
def _default_args():
    x = torch.randn(1, 4, 2, 2, 2).to(DEVICE)
    w = torch.randn(4, 6, 3, 3, 3).to(DEVICE)
    return dict(x=x, weight=w, stride=2, padding=1, output_padding=1, groups=1, dilation=1, pool_kernel=2,
                pool_stride=2, pool_padding=0, pool_dilation=1, ceil_mode=False)


def test_fused_path_applies_default_and_spellings():
    assert cpt.fused_path_applies(**_default_args())
    for change in [dict(stride=(2, 2, 2), padding=[1, 1, 1], output_padding=(1, 0, 1), dilation=(1, 1, 1)),
                   dict(output_padding=0), dict(pool_kernel=(2, 2, 2), pool_stride=None),
                   dict(pool_stride=[]), dict(pool_padding=(0, 0, 0), pool_dilation=[1, 1, 1])]:
        assert cpt.fused_path_applies(**{**_default_args(), **change}), change
    for dtype in HALF_DTYPES:
        args = _default_args()
        args["x"], args["weight"] = args["x"].to(dtype), args["weight"].to(dtype)
        assert cpt.fused_path_applies(**args)


@pytest.mark.parametrize("change", [
    dict(stride=1), dict(stride=(2, 2, 1)), dict(padding=0), dict(padding=(1, 1, 2)), dict(output_padding=2),
    dict(output_padding=(0, 2, 0)), dict(groups=2), dict(dilation=2), dict(pool_kernel=3), dict(pool_kernel=(2, 2, 1)),
    dict(pool_stride=1), dict(pool_stride=(2, 1, 2)), dict(pool_padding=1), dict(pool_dilation=2), dict(ceil_mode=True),
    "x_4d", "x_float64", "weight_dtype", "kernel_2x3x3", "weight_cin",
], ids=str)
def test_fused_path_applies_rejects_each_deviation(change):
    args = _default_args()
    if change == "x_4d":
        args["x"] = args["x"][0]
    elif change == "x_float64":
        args["x"], args["weight"] = args["x"].double(), args["weight"].double()
    elif change == "weight_dtype":
        args["weight"] = args["weight"].half()
    elif change == "kernel_2x3x3":
        args["weight"] = args["weight"][:, :, :2]
    elif change == "weight_cin":
        args["weight"] = args["weight"][:3]
    else:
        args.update(change)
    assert not cpt.fused_path_applies(**args)


def test_bad_arguments_raise():
    x, w, b, m = make_case(1, 4, 6, (2, 2, 2))
    with pytest.raises(ValueError, match="weight"):
        run(x, w[:3], b, m, 0.2, 0.2, 1)
    with pytest.raises(TypeError, match="dtype"):
        run(x, w, b, m.double(), 0.2, 0.2, 1)
    with pytest.raises(ValueError, match="output_padding"):
        run(x, w, b, m, 0.2, 0.2, 2)
    with pytest.raises(ValueError, match="multiplier"):
        run(x, w, b, m[:5], 0.2, 0.2, 1)


# ----------------------------------------------------------------------------------------------------------
# Edge values: windows whose every value is -inf, underflowing slopes, slopes beyond float32
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", ["overflow", "inf"])
def test_minus_inf_windows_select_phase_zero(dtype, kind):
    # Positive weights and inputs make every conv output large (1e30) or +inf; a multiplier of -1e10 (-1) turns
    # every phase's epilogue into -inf in float32. max_pool3d then keeps the window's first element: offset 0 and
    # the selected conv output is phase 0's (not 0, which would send the backward to the wrong point).
    gen = torch.Generator().manual_seed(3)
    x = torch.rand(2, 4, 3, 3, 3, generator=gen) + 0.5
    x[0, :, 1] = math.inf if kind == "inf" else 1e30
    x[1] = math.inf if kind == "inf" else 1e30
    w = torch.rand(4, 6, 3, 3, 3, generator=gen) + 0.1
    b = torch.rand(6, generator=gen)
    m = torch.tensor([-1e10 if kind == "overflow" else -1.0, 0.5] * 3)
    x, w, b, m = (t.to(dtype).to(DEVICE) for t in (x, w, b, m))
    op = (1, 1, 1)
    out, selected, offsets = run(x, w, b, m, 0.2, 0.2, op, with_offsets=True)
    y64 = F.conv_transpose3d(x.double().cpu(), w.double().cpu(), b.double().cpu(), stride=2, padding=1,
                             output_padding=op)
    # The epilogue as the kernel computes it: float32 on the conv output rounded to the I/O dtype.
    y = y64.to(dtype).float()
    e = F.leaky_relu(F.leaky_relu(y, 0.2) * m.cpu().float().view(1, -1, 1, 1, 1), 0.2)
    ew = windows(e, out.shape[2:])
    all_minus_inf = (ew == -math.inf).all(-1)
    assert all_minus_inf.sum() >= 8, "the case must hold windows whose every value is -inf"
    off = offsets.cpu().long()
    assert torch.equal(off[all_minus_inf], torch.zeros_like(off[all_minus_inf]))
    assert (out.cpu()[all_minus_inf] == -math.inf).all()
    y0 = windows(y64, out.shape[2:])[..., 0]
    sel_tol = tolerances(dtype) if dtype == torch.float32 else dict(rtol=torch.finfo(dtype).eps, atol=1e-4)
    torch.testing.assert_close(selected.cpu().double()[all_minus_inf], y0[all_minus_inf], **sel_tol)
    # Every output against max_pool3d of that float32 epilogue (float64 would not overflow to -inf).
    torch.testing.assert_close(out.cpu().float(), F.max_pool3d(e, 2).to(dtype).float(), **tolerances(dtype))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("slopes", [(1e-50, 0.2), (0.2, 1e-50), (1e-46, 1e-46), (math.inf, 0.2), (1e-45, 0.3)],
                         ids=str)
@pytest.mark.parametrize("dtype,tf32", [(torch.float32, True), (torch.float32, False), (torch.bfloat16, False)],
                         ids=["tf32", "fp32", "bf16"])
def test_inference_kernels_decide_monotone_form_on_float32_slopes(dtype, tf32, slopes):
    # A slope that underflows to 0 in float32 (1e-50) is > 0 as a double; -inf * 0 is NaN in eager float32, which
    # a monotone shortcut would skip. Every inference kernel (the op's routes and the phase-exact kernel's
    # monotone form) must give eager float32's NaNs. Positive weights carry a -inf input to -inf conv outputs.
    from torch_fused_ops import _conv_triton_op

    s1, s2 = slopes
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 4, 3, 4, 3, generator=gen)
    x[0, 1, 1, 2, 1] = -math.inf
    x[1, 2, 0, 0, 0] = -math.inf
    x[1, :, 1:3, 2:4, 1:3] = 0.0  # exact zero conv outputs around pooled (1, 2, 1): 0 * inf = NaN there
    w = torch.rand(4, 6, 3, 3, 3, generator=gen) * 0.3 + 0.05
    m = torch.tensor([1.5, -0.5, 0.75, -2.0, 1.0, 0.25])
    x, w, m = (t.to(dtype).to(DEVICE) for t in (x, w, m))
    op = [1, 1, 1]
    y = F.conv_transpose3d(x.double().cpu(), w.double().cpu(), None, stride=2, padding=1, output_padding=op)
    y = y.to(dtype).float()  # what the epilogue sees
    ref = F.max_pool3d(F.leaky_relu(F.leaky_relu(y, s1) * m.cpu().float().view(1, -1, 1, 1, 1), s2), 2)
    assert ref.isnan().any() == (_f32(s1) == 0 or _f32(s2) == 0 or math.isinf(s1))
    outs = {"op": _conv_triton_op.launch(x, w, None, m, s1, s2, op, tf32),
            "exact-mono": cpt.conv_transpose3d_post_pool_triton(x, w, None, m, s1, s2, op, tf32, False, mono=True)}
    tol = dict(rtol=2e-3, atol=1e-3) if tf32 else tolerances(dtype)
    for name, out in outs.items():
        assert torch.equal(out.cpu().isnan(), ref.isnan()), f"{name}: NaN positions differ from eager float32"
        torch.testing.assert_close(out.cpu().float(), ref.to(dtype).float(), equal_nan=True, **tol)


def _f32(v):
    return torch.tensor(v, dtype=torch.float32).item()


@pytest.mark.parametrize("slope", [1e39, -3.5e38], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_slopes_beyond_float_raise(dtype, slope):
    # As eager leaky_relu: a finite slope beyond float's range raises RuntimeError for these dtypes.
    from torch_fused_ops import _conv_triton_op

    x, w, b, m = make_case(1, 4, 5, (2, 3, 2), dtype=dtype)
    with pytest.raises(RuntimeError, match="value cannot be converted to type float without overflow"):
        F.leaky_relu(x, slope)
    for s1, s2 in ((slope, 0.2), (0.2, slope)):
        with pytest.raises(RuntimeError, match="value cannot be converted to type float without overflow"):
            run(x, w, b, m, s1, s2, (1, 1, 1), with_offsets=True)
        with pytest.raises(RuntimeError, match="value cannot be converted to type float without overflow"):
            _conv_triton_op.launch(x, w, b, m, s1, s2, [1, 1, 1], False)
