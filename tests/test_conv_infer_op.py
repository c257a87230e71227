"""fused.conv_transpose3d_post_pool_infer (the triton_op compiled graphs call) and the packed-GEMM kernel behind
its half-precision path, against float64 eager PyTorch.

Without CUDA these run on CPU tensors through the Triton interpreter (TRITON_INTERPRET=1 set before import), as
tests/test_conv_post_pool_triton.py does.
"""
import math
import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs CUDA, or TRITON_INTERPRET=1 set before import to run the Triton interpreter on CPU",
                allow_module_level=True)
pytest.importorskip("triton")

import torch_fused_ops  # noqa: E402,F401
from torch_fused_ops import _conv_post_pool_gemm_triton as gemm  # noqa: E402
from torch_fused_ops import _conv_triton_op  # noqa: E402,F401  (registers the op)

DEVICE = "cpu" if gemm._INTERPRET else "cuda"
OP = torch.ops.fused.conv_transpose3d_post_pool_infer.default


def make(n, cin, cout, dhw, dtype, mult="mixed", seed=0, bias=True):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, cin, *dhw, generator=gen)
    w = torch.randn(cin, cout, 3, 3, 3, generator=gen) / math.sqrt(cin * 8)
    b = torch.randn(cout, generator=gen) * 0.5 if bias else None
    m = torch.randn(cout, generator=gen) + 0.1
    if mult == "mixed":
        # Negative, zero (the exact per-phase path) and infinite multipliers next to positive ones.
        m[0::3] = -m[0::3].abs()
        m[2::5] = 0.0
        if cout > 6:
            m[6] = float("inf")
    return [None if t is None else t.to(dtype).to(DEVICE) for t in (x, w, b, m)]


def reference(x, w, b, m, s1, s2, op):
    y = F.conv_transpose3d(x.double().cpu(), w.double().cpu(), None if b is None else b.double().cpu(), stride=2,
                           padding=1, output_padding=op)
    e = F.leaky_relu(F.leaky_relu(y, s1) * m.double().cpu().view(1, -1, 1, 1, 1), s2)
    return F.max_pool3d(e, 2, 2)


def tol(dtype):
    return dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2 * torch.finfo(dtype).eps, atol=1e-4)


def check(out, ref, dtype):
    assert out.shape == ref.shape and out.dtype == dtype
    assert torch.equal(out.cpu().isnan(), ref.isnan())
    torch.testing.assert_close(out.cpu().double(), ref, equal_nan=True, **tol(dtype))


# (N, Cin, Cout, (D, H, W), output_padding, (s1, s2), multiplier kind)
CASES = [
    (2, 16, 32, (3, 4, 5), (1, 1, 1), (0.2, 0.2), "positive"),
    (2, 16, 32, (3, 4, 5), (1, 1, 1), (0.2, 0.2), "mixed"),
    (1, 5, 7, (4, 3, 5), (0, 1, 0), (0.1, 0.3), "mixed"),
    (2, 20, 40, (2, 3, 4), (1, 0, 1), (-0.3, 0.2), "mixed"),
]


def _id(c):
    return f"N{c[0]}-{c[1]}to{c[2]}-{'x'.join(map(str, c[3]))}-op{''.join(map(str, c[4]))}-s{c[5][0]}_{c[5][1]}-{c[6]}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_gemm_kernel_matches_float64(case, dtype):
    n, cin, cout, dhw, op, (s1, s2), mult = case
    x, w, b, m = make(n, cin, cout, dhw, dtype, mult)
    out = torch.full((n, cout, dhw[0] - 1 + op[0], dhw[1] - 1 + op[1], dhw[2] - 1 + op[2]), float("nan"),
                     device=DEVICE, dtype=dtype)  # poisoned: every element must be written
    gemm.conv_transpose3d_post_pool_gemm(x, w, b, m, s1, s2, op, False, out=out)
    check(out, reference(x, w, b, m, s1, s2, op), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gemm_kernel_with_fewer_channels_per_program(dtype):
    # Output channels split over programs (bnc < Cout): each program's weight block and channel range.
    n, cin, cout, dhw, op, (s1, s2), mult = CASES[1]
    x, w, b, m = make(n, cin, cout, dhw, dtype, mult, seed=9)
    out = gemm.conv_transpose3d_post_pool_gemm(x, w, b, m, s1, s2, op, False, bnc=8)
    check(out, reference(x, w, b, m, s1, s2, op), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("fmt", ["contiguous", "channels_last_3d", "strided"])
def test_op_matches_float64(dtype, fmt):
    x, w, b, m = make(2, 16, 32, (3, 4, 5), dtype, "mixed", seed=3)
    if fmt == "channels_last_3d":
        x = x.contiguous(memory_format=torch.channels_last_3d)
    elif fmt == "strided":
        x = torch.cat([x, x], dim=4)[..., ::2]
    out = OP(x, w, b, m.view(-1, 1, 1, 1), 0.2, 0.2, [1, 1, 1], False)
    check(out, reference(x, w, b, m, 0.2, 0.2, (1, 1, 1)), dtype)
    if fmt == "channels_last_3d":
        assert out.is_contiguous(memory_format=torch.channels_last_3d)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype,tf32", [(torch.float32, False), (torch.float32, True), (torch.bfloat16, False)],
                         ids=["fp32", "tf32", "bf16"])
@pytest.mark.parametrize("slopes", [(0.2, 0.2), (0.0, -0.5)], ids=["monotone", "exact"])
def test_nan_and_inf_propagate(dtype, tf32, slopes):
    # NaN and +-inf inputs through the routed op: at this size every precision takes the phase-split GEMM (the
    # packed GEMM's fix-up launch has its own test below). Results must be what the convolution gives.
    x, w, b, m = make(2, 16, 8, (4, 4, 4), dtype, "positive")
    x = x.clone()
    x[0, 1, 0, 0, 0] = float("nan")
    x[0, 2, 3, 2, 1] = float("inf")
    x[1, 0, 1, 3, 3] = float("-inf")
    ref = reference(x, w, b, m, *slopes, (1, 1, 1))
    assert ref.isnan().any() and ref.isinf().any()
    out = OP(x, w, b, m, *slopes, [1, 1, 1], tf32)
    if tf32:
        assert torch.equal(out.cpu().isnan(), ref.isnan()) and torch.equal(out.cpu().isinf(), ref.isinf())
        torch.testing.assert_close(out.cpu().double(), ref, equal_nan=True, rtol=5e-3, atol=5e-3)
    else:
        check(out, ref, dtype)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype,tf32", [(torch.float32, False), (torch.float32, True), (torch.bfloat16, False)],
                         ids=["fp32", "tf32", "bf16"])
def test_packed_gemm_fixup_launch(dtype, tf32):
    # Infinite inputs meet the packed GEMM's structural zeros (inf * 0 = NaN where the convolution has no such
    # product); the first launch flags those tiles and the fix-up launch recomputes them, each of its programs
    # reading 32 flags. Infinities in the first and last batch elements reach tiles of every channel block, the
    # last ones past the first 32 flags, so both fix-up programs must find their tiles.
    x, w, b, m = make(3, 16, 40, (5, 6, 7), dtype, "positive", seed=4)
    x = x.clone()
    x[0, 2, 0, 1, 1] = float("inf")
    x[1, 0, 2, 3, 3] = float("nan")
    x[2, 5, 4, 5, 6] = float("-inf")
    x[2, 7, 3, 0, 2] = float("inf")
    op = [1, 1, 1]
    ref = reference(x, w, b, m, 0.2, 0.2, op)
    assert ref.isnan().any() and ref.isinf().any()
    out = torch.full(ref.shape, float("nan"), device=DEVICE, dtype=dtype)  # poisoned
    gemm.conv_transpose3d_post_pool_gemm(x, w, b, m, 0.2, 0.2, op, tf32, out=out, bnc=16, bm=32)
    n_tiles = -(-ref[:, 0].numel() // 32) * 3
    assert n_tiles > gemm._FIXUP_TILES
    if tf32:
        assert torch.equal(out.cpu().isnan(), ref.isnan()) and torch.equal(out.cpu().isinf(), ref.isinf())
        torch.testing.assert_close(out.cpu().double(), ref, equal_nan=True, rtol=5e-3, atol=5e-3)
    else:
        check(out, ref, dtype)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_packed_gemm_non_finite_bias(dtype):
    # An infinite or NaN bias breaks the monotone form: +inf bias plus a -inf conv output is NaN in one phase,
    # which max_pool3d propagates, while the bias added to the window's largest output is +inf. Such channels
    # must take the exact selection, as in the phase-split kernel (both kernels share the test of what breaks
    # monotonicity). Multipliers of both signs, infinite inputs of both signs.
    x, w, b, m = make(1, 16, 8, (4, 5, 6), dtype, "positive", seed=9)
    x, b, m = x.clone(), b.clone(), m.clone()
    m[1::2] = -m[1::2]
    b[2], b[3], b[4], b[5] = float("inf"), float("inf"), float("-inf"), float("nan")
    flat = x.view(-1)
    flat[7], flat[300], flat[1000] = float("-inf"), float("inf"), float("-inf")
    op = [1, 1, 1]
    ref = reference(x, w, b, m, 0.2, 0.2, op)
    out = torch.full(ref.shape, float("nan"), device=DEVICE, dtype=dtype)  # poisoned
    gemm.conv_transpose3d_post_pool_gemm(x, w, b, m, 0.2, 0.2, op, False, out=out)
    assert torch.equal(out.cpu().isinf(), ref.isinf())
    check(out, ref, dtype)


@pytest.mark.parametrize("small", [True, False], ids=["few-positions", "many-positions"])
def test_tf32_kernel_choice_by_size(monkeypatch, small):
    # TF32 takes the phase-split GEMM below _SMALL_POSITIONS and the packed GEMM above: both must be right.
    monkeypatch.setattr(_conv_triton_op, "_SMALL_POSITIONS", 1 << 40 if small else 0)
    x, w, b, m = make(2, 16, 32, (3, 4, 5), torch.float32)
    out = OP(x, w, b, m, 0.2, 0.2, [1, 1, 1], True)
    ref = reference(x, w, b, m, 0.2, 0.2, [1, 1, 1])
    assert torch.equal(out.cpu().isnan(), ref.isnan())
    torch.testing.assert_close(out.cpu().double(), ref, rtol=3e-3, atol=3e-3, equal_nan=True)


def test_no_bias_and_scalar_multiplier():
    x, w, _, _ = make(1, 16, 32, (3, 3, 3), torch.bfloat16, bias=False)
    m = torch.tensor([1.5], dtype=torch.bfloat16, device=DEVICE)
    out = OP(x, w, None, m, 0.2, 0.2, [1, 1, 1], False)
    check(out, reference(x, w, None, m.expand(32), 0.2, 0.2, (1, 1, 1)), torch.bfloat16)


def test_host_tf32_rounding():
    # Round to nearest onto 10 mantissa bits, ties away from zero; inf and NaN kept.
    x = torch.tensor([1.0, 1.0 + 2**-11, 1.0 + 2**-11 - 2**-23, -(1.0 + 2**-11), 3.0 + 2**-10 + 2**-12,
                      float("inf"), -float("inf"), float("nan"), 0.0, -0.0])
    r = gemm.round_tf32(x)
    want = torch.tensor([1.0, 1.0 + 2**-10, 1.0, -(1.0 + 2**-10), 3.0 + 2**-9, float("inf"), -float("inf"),
                         float("nan"), 0.0, -0.0])
    torch.testing.assert_close(r, want, equal_nan=True, rtol=0, atol=0)
    y = torch.randn(10000) * 100
    ry = gemm.round_tf32(y)
    assert torch.all(ry.view(torch.int32) & 0x1FFF == 0)
    ulp = torch.ldexp(torch.ones_like(y), torch.frexp(y).exponent - 11)  # spacing of TF32 values at |y|
    assert torch.all((ry - y).abs() <= ulp / 2)


def test_tf32_path_rounds_its_operands():
    # With TF32 the kernel rounds x (in the kernel) and the weight (on the host) to nearest TF32; whatever the
    # dot then does, the result must match float64 of the *rounded* operands closely, and that must be
    # measurably different from the unrounded result (otherwise this test could not tell).
    x, w, b, m = make(2, 16, 32, (3, 4, 5), torch.float32, "positive", seed=5)
    out = OP(x, w, b, m, 0.2, 0.2, [1, 1, 1], True).cpu().double()
    rounded = reference(gemm.round_tf32(x.cpu()), gemm.round_tf32(w.cpu()), b, m, 0.2, 0.2, (1, 1, 1))
    raw = reference(x, w, b, m, 0.2, 0.2, (1, 1, 1))
    if gemm._INTERPRET:
        torch.testing.assert_close(out, rounded, rtol=1e-5, atol=1e-5)  # the interpreter's dot is plain fp32
        assert (rounded - raw).abs().max() > 1e-4
    rel = lambda a, r: ((a - r).norm() / r.norm()).item()  # noqa: E731
    assert rel(out, raw) < 1e-3


def test_fake_matches_real():
    from torch._subclasses.fake_tensor import FakeTensorMode

    for fmt in (torch.contiguous_format, torch.channels_last_3d):
        x, w, b, m = make(2, 16, 32, (3, 4, 5), torch.bfloat16)
        x = x.contiguous(memory_format=fmt)
        real = OP(x, w, b, m, 0.2, 0.2, [1, 0, 1], False)
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fake = OP(mode.from_tensor(x), mode.from_tensor(w), mode.from_tensor(b), mode.from_tensor(m), 0.2, 0.2,
                      [1, 0, 1], False)
        assert fake.shape == real.shape and fake.stride() == real.stride() and fake.dtype == real.dtype


def test_opcheck():
    x, w, b, m = make(1, 16, 32, (2, 3, 4), torch.bfloat16)
    args = (x, w, b, m, 0.2, 0.2, [1, 1, 1], False)
    # Under the interpreter, AOTAutograd's decomposition of a triton_op cannot trace an interpreted kernel
    # (pytorch/pytorch#152868), so only the schema and fake checks run there; on CUDA, all of opcheck.
    utils = ("test_schema", "test_faketensor") if gemm._INTERPRET else None
    kwargs = {} if utils is None else dict(test_utils=utils)
    torch.library.opcheck(OP, args, **kwargs)


def test_outside_the_fused_path_raises():
    x, w, b, m = make(1, 16, 32, (2, 3, 4), torch.float32)
    with pytest.raises(ValueError, match="outside the fused path"):
        OP(x, w[:, :, :2], b, m, 0.2, 0.2, [1, 1, 1], False)
    with pytest.raises(RuntimeError, match="multiplier"):
        OP(x, w, b, m[:5], 0.2, 0.2, [1, 1, 1], False)


@pytest.mark.parametrize("dtype,tf32", [(torch.float32, True), (torch.float32, False), (torch.bfloat16, False)],
                         ids=["tf32", "fp32", "bf16"])
def test_fake_impl_traces_with_symbolic_shapes(dtype, tf32):
    # The op's body is its own fake impl, and under torch.compile(dynamic=True) it runs on symbolic sizes: the
    # host code (shapes, grid, packing) must trace, keep batch and spatial sizes symbolic and give the strides
    # of the real output.
    from torch.fx.experimental.proxy_tensor import make_fx

    x, w, b, m = make(2, 16, 32, (3, 4, 5), dtype)
    gm = make_fx(lambda x, w, b, m: OP(x, w, b, m, 0.2, 0.2, [1, 1, 0], tf32), tracing_mode="symbolic")(x, w, b, m)
    out_node = [n for n in gm.graph.nodes
                if n.op == "call_function" and "conv_transpose3d_post_pool_infer" in str(n.target)]
    assert len(out_node) == 1
    val = out_node[0].meta["val"]
    assert any(isinstance(s, torch.SymInt) for s in val.shape), val.shape  # batch/spatial stayed symbolic
    real = OP(x, w, b, m, 0.2, 0.2, [1, 1, 0], tf32)
    assert [int(s) for s in val.shape] == list(real.shape)
    assert [int(s) for s in val.stride()] == list(real.stride())


@pytest.mark.parametrize("dtype,tf32", [(torch.float32, True), (torch.float32, False), (torch.bfloat16, False)],
                         ids=["tf32", "fp32", "bf16"])
def test_empty_batch(dtype, tf32):
    x, w, b, m = make(2, 16, 32, (3, 4, 5), dtype)
    out = OP(x[:0], w, b, m, 0.2, 0.2, [1, 1, 1], tf32)
    assert out.shape == (0, 32, 3, 4, 5) and out.dtype == dtype
