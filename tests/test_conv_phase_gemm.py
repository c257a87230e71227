"""The phase-split GEMM kernel (``_conv_post_pool_phase_gemm_triton``) against float64 eager PyTorch: values,
the selected conv output and window offsets of the training forward, non-finite inputs, every launch option.

Without CUDA these run on CPU tensors through the Triton interpreter (TRITON_INTERPRET=1 set before import), as
tests/test_conv_post_pool_triton.py does; there every float32 dot is exact float32, so the TF32 and three-TF32
error checks run on CUDA only.
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

from torch_fused_ops import _conv_post_pool_gemm_triton as gemm  # noqa: E402
from torch_fused_ops import _conv_post_pool_phase_gemm_triton as phase  # noqa: E402

DEVICE = "cpu" if gemm._INTERPRET else "cuda"
BM = 16 if gemm._INTERPRET else 64


def make(n, cin, cout, dhw, dtype, seed=0, specials=False):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, cin, *dhw, generator=gen)
    w = torch.randn(cin, cout, 3, 3, 3, generator=gen) / math.sqrt(cin * 8)
    b = torch.randn(cout, generator=gen) * 0.5
    m = torch.randn(cout, generator=gen) + 0.1
    m[0::3] = -m[0::3].abs()
    if specials:
        # Infinite and NaN inputs, a zero weight meeting an infinity (NaN, as in the convolution), and
        # multipliers that break monotonicity: the kernel's selection is exact, so all must match.
        flat = x.view(-1)
        idx = torch.randperm(flat.numel(), generator=gen)[:6]
        flat[idx[:2]] = float("inf")
        flat[idx[2:4]] = float("-inf")
        flat[idx[4]] = float("nan")
        w[0, 1, 1, 1, 1] = 0.0
        m[1] = 0.0
        if cout > 4:
            m[4] = float("inf")
    return [t.to(dtype).to(DEVICE) for t in (x, w, b, m)]


def conv_ref(x, w, b, op):
    return F.conv_transpose3d(x.double().cpu(), w.double().cpu(), b.double().cpu(), stride=2, padding=1,
                              output_padding=op)


def epilogue_ref(y, m, s1, s2):
    return F.leaky_relu(F.leaky_relu(y, s1) * m.double().cpu().view(1, -1, 1, 1, 1), s2)


def run(x, w, b, m, op, s1=0.2, s2=0.2, *, bnc=32, ck=16, kmajor=True, precision=None, tf32=False, offsets=False,
        out_format=torch.contiguous_format, mono=True, kernel_wrapper=None):
    n, cin, d, h, wd = x.shape
    cout = w.shape[1]
    cin_p = max(16, 1 << (cin - 1).bit_length())
    shape = (n, cout, d - 1 + op[0], h - 1 + op[1], wd - 1 + op[2])
    # Poisoned outputs: every element must be written.
    out = torch.full(shape, float("nan"), device=DEVICE, dtype=x.dtype).to(memory_format=out_format)
    sel = torch.full_like(out, float("nan")) if offsets else None
    off = torch.full(shape, 99, device=DEVICE, dtype=torch.uint8).to(memory_format=out_format) if offsets else None
    wp = phase.pack_weight(w, cin_p, bnc, x.dtype, tf32, kmajor, split3=precision == "3xtf32")
    phase.launch(x, wp, b, m.contiguous(), s1, s2, out, op, tf32=tf32, kmajor=kmajor, cin_p=cin_p, bnc=bnc, bm=BM,
                 ck=ck, num_warps=4, num_stages=1, selected=sel, offsets=off, precision=precision, mono=mono,
                 kernel_wrapper=kernel_wrapper)
    return out, sel, off


def tol(dtype):
    return dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2 * torch.finfo(dtype).eps, atol=1e-4)


def test_phase_taps_cover_every_tap_once():
    taps = phase.phase_taps()
    assert [len(t) for t in taps] == [1, 2, 2, 4, 2, 4, 4, 8]
    assert sorted(t for ts in taps for t in ts) == list(range(27))
    assert taps[0] == [13]  # phase 0: the centre tap of neighbour 0 in every dim


# (N, Cin, Cout, (D, H, W), output_padding, bnc)
CASES = [
    (2, 16, 32, (3, 4, 5), (1, 1, 1), 32),
    (1, 5, 20, (4, 3, 5), (0, 1, 0), 16),  # padded Cin, a partial output-channel block
    (1, 20, 40, (2, 3, 4), (1, 0, 1), 16),  # two Cin chunks, three blocks
]


@pytest.mark.parametrize("kmajor", [True, False], ids=["kmajor", "nmajor"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[1]}to{c[2]}-{'x'.join(map(str, c[3]))}-bnc{c[5]}")
def test_matches_float64(case, dtype, kmajor):
    n, cin, cout, dhw, op, bnc = case
    x, w, b, m = make(n, cin, cout, dhw, dtype)
    out, _, _ = run(x, w, b, m, list(op), bnc=bnc, kmajor=kmajor)
    if dtype != torch.float32:
        # A half-precision conv rounds its output before the epilogue, as the kernel does.
        y = conv_ref(x, w, b, list(op)).to(dtype).double()
    else:
        y = conv_ref(x, w, b, list(op))
    ref = F.max_pool3d(epilogue_ref(y, m, 0.2, 0.2), 2, 2)
    torch.testing.assert_close(out.cpu().double(), ref, **tol(dtype))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("precision", [None, "3xtf32"], ids=["ieee", "3xtf32"])
@pytest.mark.parametrize("slopes", [(0.2, 0.2), (0.0, -0.5)], ids=["monotone", "negative-slope"])
def test_offsets_and_non_finite_inputs(precision, slopes):
    s1, s2 = slopes
    x, w, b, m = make(2, 16, 32, (4, 5, 6), torch.float32, seed=3, specials=True)
    op = [1, 1, 1]
    out, sel, off = run(x, w, b, m, op, s1, s2, precision=precision, offsets=True)
    y = conv_ref(x, w, b, op)
    e = epilogue_ref(y, m, s1, s2)
    ref, idx = F.max_pool3d(e, 2, 2, return_indices=True)
    assert torch.equal(out.cpu().isnan(), ref.isnan())
    torch.testing.assert_close(out.cpu().double(), ref, equal_nan=True, **tol(torch.float32))
    # The window offset max_pool3d picked (pd*4 + ph*2 + pw) and the conv output there.
    ho, wo = e.shape[3], e.shape[4]
    want = ((idx // (ho * wo)) % 2) * 4 + ((idx // wo) % ho % 2) * 2 + (idx % wo) % 2
    assert torch.equal(off.cpu().long(), want)
    y_sel = y.flatten(2).gather(2, idx.flatten(2)).view_as(ref)
    torch.testing.assert_close(sel.cpu().double(), y_sel, equal_nan=True, **tol(torch.float32))


def _ref_pool(x, w, b, m, op, dtype, s1=0.2, s2=0.2):
    y = conv_ref(x, w, b, op)
    if dtype != torch.float32:
        y = y.to(dtype).double()  # a half-precision conv rounds its output before the epilogue
    return F.max_pool3d(epilogue_ref(y, m, s1, s2), 2, 2)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("data", ["random", "ties", "non-finite"])
def test_monotone_form_matches_exact_form(dtype, data):
    # Slopes > 0 and finite nonzero multipliers of both signs: the kernel takes the monotone form (one max per
    # phase). It must give max_pool3d's values, NaN and infinities included, and the exact form's values.
    x, w, b, m = make(2, 16, 40, (4, 5, 6), torch.float32, seed=11)
    if data == "ties":
        # Small integers: many phases of a window share the largest conv output.
        gen = torch.Generator().manual_seed(12)
        x = torch.randint(-2, 3, x.shape, generator=gen).float().to(DEVICE)
        w = torch.randint(-1, 2, w.shape, generator=gen).float().to(DEVICE)
        b = torch.randint(-1, 2, b.shape, generator=gen).float().to(DEVICE)
    elif data == "non-finite":
        flat = x.view(-1)
        flat[3], flat[500], flat[901], flat[1500] = float("inf"), float("-inf"), float("nan"), float("-inf")
    x, w, b, m = (t.to(dtype) for t in (x, w, b, m))
    assert bool((m != 0).all() and m.isfinite().all() and (m < 0).any() and (m > 0).any())
    op = [1, 1, 1]
    out, _, _ = run(x, w, b, m, op, bnc=16)
    exact, _, _ = run(x, w, b, m, op, bnc=16, mono=False)
    ref = _ref_pool(x, w, b, m, op, dtype)
    assert torch.equal(out.cpu().isnan(), ref.isnan())
    torch.testing.assert_close(out.cpu().double(), ref, equal_nan=True, **tol(dtype))
    # Against the exact form: bitwise on the interpreter and in bf16. On the H200 (2026-11-29) float32 differed at
    # rounding level (6532 of 9600 elements, at most 1.7e-6 absolute): the two compiled kernels' plain-float32
    # dots evidently accumulate in different orders. Not investigated further; both match float64 above.
    same = dict(rtol=0, atol=0) if gemm._INTERPRET or dtype != torch.float32 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, exact, equal_nan=True, **same)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("breaker", ["zero-multiplier", "inf-multiplier", "nan-multiplier", "inf-bias"])
def test_monotone_form_falls_back_per_channel_block(breaker):
    # One channel of the middle block (of three) breaks monotonicity: that block takes the exact form, the
    # others keep the monotone one; all must match max_pool3d, with infinite conv outputs present.
    x, w, b, m = make(2, 16, 40, (4, 5, 6), torch.float32, seed=13)
    flat = x.view(-1)
    flat[7], flat[800], flat[1201] = float("inf"), float("-inf"), float("inf")
    if breaker == "zero-multiplier":
        m[20] = 0.0
    elif breaker == "inf-multiplier":
        m[20] = float("-inf")
    elif breaker == "nan-multiplier":
        m[20] = float("nan")
    else:
        b[20] = float("inf")
    op = [1, 1, 1]
    out, _, _ = run(x, w, b, m, op, bnc=16)
    ref = _ref_pool(x, w, b, m, op, torch.float32)
    assert torch.equal(out.cpu().isnan(), ref.isnan())
    torch.testing.assert_close(out.cpu().double(), ref, equal_nan=True, **tol(torch.float32))


@pytest.mark.parametrize("s1,s2,offsets,want", [(0.2, 0.2, False, True), (0.0, 0.2, False, False),
                                                 (0.2, -0.1, False, False), (0.2, 0.2, True, False)])
def test_monotone_form_only_where_exact(s1, s2, offsets, want):
    # The launcher asks for the monotone form only with both slopes > 0 and no selection outputs.
    record, seen = launch_recorder()
    x, w, b, m = make(1, 16, 32, (2, 3, 4), torch.float32, seed=2)
    run(x, w, b, m, [1, 1, 1], s1, s2, offsets=offsets, kernel_wrapper=record)
    assert seen["MONO"] is want


@pytest.mark.parametrize("fmt", ["channels_last_3d", "strided"])
def test_input_and_output_layouts(fmt):
    x, w, b, m = make(2, 16, 32, (3, 4, 6), torch.float32, seed=5)
    op = [1, 0, 1]
    if fmt == "channels_last_3d":
        x_in, out_format = x.to(memory_format=torch.channels_last_3d), torch.channels_last_3d
    else:
        x_in, out_format = torch.stack([x, x], dim=-1)[..., 0], torch.contiguous_format
    out, _, _ = run(x_in, w, b, m, op, out_format=out_format)
    ref = F.max_pool3d(epilogue_ref(conv_ref(x, w, b, op), m, 0.2, 0.2), 2, 2)
    torch.testing.assert_close(out.cpu().double(), ref, **tol(torch.float32))


@pytest.mark.skipif(gemm._INTERPRET, reason="the interpreter computes every float32 dot exactly")
def test_tensor_core_float32_errors():
    # Large enough for the error to be statistical: TF32 (rounded operands) at cuDNN's TF32 level, three TF32
    # products at float32's level.
    x, w, b, m = make(2, 16, 32, (16, 16, 16), torch.float32, seed=7)
    op = [1, 1, 1]
    ref = F.max_pool3d(epilogue_ref(conv_ref(x, w, b, op), m, 0.2, 0.2), 2, 2)

    def rel(o):
        return ((o.cpu().double() - ref).norm() / ref.norm()).item()

    assert rel(run(x, w, b, m, op, tf32=True, precision="tf32")[0]) < 5e-4
    assert rel(run(x, w, b, m, op, precision="3xtf32")[0]) < 1e-6
