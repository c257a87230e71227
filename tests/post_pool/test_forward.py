"""Forward values, dtypes and layouts of fused::post_pool against the eager composite."""

import pytest
import torch
import torch.nn.functional as F

import torch_fused_ops  # noqa: F401  (import failure must be loud, not a skip)
from fused_testing import (
    ALL_DTYPES,
    CHANNELS_LAST,
    DEFAULT_SHAPE,
    DEVICES,
    FULL_DTYPES,
    HALF_DTYPES,
    MEDIUM_SHAPE,
    MULTIPLIER_KINDS,
    assert_bitwise_equal,
    check_against_eager,
    composite,
    make_input,
    make_multiplier,
    offsets_from_indices,
    op_args,
    pool_out_shape,
    pool_params,
    pre_pool,
    EAGER_TOL,
)

# D, H, W = 2*OD, 2*OH, 2*OW with OW and C multiples of 8: takes the CUDA kernels' vectorized 2x2x2 path.
TILED_SHAPE = (2, 8, 4, 6, 16)

ALL_POOLS = ["k2", "k2s2", "k3s2p1", "k231s123", "k3s1p1d2", "k2s2ceil", "k3s2p1ceil", "mixed", "k1", "k2s1"]


def run_op(x, m, cfg, slope=0.2, slope2=None):
    return torch_fused_ops.post_pool(x, m, slope, negative_slope2=slope2, **cfg)


@pytest.mark.parametrize("cfg", pool_params(ALL_POOLS))
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_pool_configs(device, dtype, cfg):
    x = make_input(DEFAULT_SHAPE, dtype, device, seed=11)
    m = make_multiplier("C111", DEFAULT_SHAPE[1], dtype, device)
    out = run_op(x, m, cfg)
    assert out.shape == pool_out_shape(DEFAULT_SHAPE, **cfg)
    check_against_eager(out, x, m, cfg)
    assert out.stride() == composite(x, m, 0.2, **cfg).stride()


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_fast_path_2x2x2_medium(device, dtype, layout):
    x = make_input(MEDIUM_SHAPE, dtype, device, layout, seed=12)
    m = make_multiplier("1C111", MEDIUM_SHAPE[1], dtype, device)
    cfg = dict(kernel_size=2, stride=2)
    out = run_op(x, m, cfg, slope=0.01)
    check_against_eager(out, x, m, cfg, slope=0.01)
    expected = composite(x, m, 0.01, **cfg)
    assert out.stride() == expected.stride()
    assert out.is_contiguous(memory_format=CHANNELS_LAST) == (layout == "channels_last")


SLOPES = [(0.2, None), (0.01, None), (0.0, None), (1.0, None), (1.5, None), (-0.3, None),
          (0.2, 0.05), (0.01, -0.5), (1.5, 0.0), (0.0, 1.0)]


@pytest.mark.parametrize("cfg", pool_params(["k2", "k3s2p1"]))
@pytest.mark.parametrize("slopes", SLOPES, ids=lambda s: f"s1={s[0]},s2={s[1]}")
@pytest.mark.parametrize("dtype", FULL_DTYPES + [torch.float16], ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_slopes(device, dtype, slopes, cfg):
    s1, s2 = slopes
    x = make_input(DEFAULT_SHAPE, dtype, device, seed=13)
    m = make_multiplier("C111", DEFAULT_SHAPE[1], dtype, device)
    out = run_op(x, m, cfg, s1, s2)
    check_against_eager(out, x, m, cfg, s1, s2, msg=f"slopes={slopes}")


def test_negative_slope2_is_used():
    # Guards against an implementation that ignores negative_slope2: with a
    # sign-alternating multiplier the two slopes give visibly different results.
    x = make_input(DEFAULT_SHAPE, seed=14)
    m = make_multiplier("C111", DEFAULT_SHAPE[1])
    a = torch_fused_ops.post_pool(x, m, 0.2, 3, 2, 1, negative_slope2=0.7)
    b = torch_fused_ops.post_pool(x, m, 0.2, 3, 2, 1)
    assert not torch.equal(a, b)
    assert_bitwise_equal(a, composite(x, m, 0.2, 3, 2, 1, negative_slope2=0.7))


@pytest.mark.parametrize("mkind", MULTIPLIER_KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_multiplier_shapes(device, dtype, mkind):
    x = make_input(DEFAULT_SHAPE, dtype, device, seed=15)
    m = make_multiplier(mkind, DEFAULT_SHAPE[1], dtype, device)
    cfg = dict(kernel_size=3, stride=2, padding=1)
    out = run_op(x, m, cfg, 0.1, 0.3)
    check_against_eager(out, x, m, cfg, 0.1, 0.3, msg=f"multiplier {mkind} {tuple(m.shape)}")


@pytest.mark.parametrize("cfg", pool_params(["k2", "k3s2p1", "k3s2p1ceil"]))
@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "strided", "transposed", "permuted", "expanded"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_layouts(device, dtype, layout, cfg):
    x = make_input(DEFAULT_SHAPE, dtype, device, layout, seed=16)
    m = make_multiplier("C111", DEFAULT_SHAPE[1], dtype, device)
    out = run_op(x, m, cfg)
    check_against_eager(out, x, m, cfg, msg=layout)
    expected = composite(x, m, 0.2, **cfg)
    # Every output dim is > 1 here, so eager's strides are unambiguous.
    assert min(expected.shape) > 1
    assert out.stride() == expected.stride(), f"{layout}: strides {out.stride()} != eager {expected.stride()}"
    assert out.is_contiguous() == expected.is_contiguous()
    assert out.is_contiguous(memory_format=CHANNELS_LAST) == expected.is_contiguous(memory_format=CHANNELS_LAST)


@pytest.mark.parametrize("device", DEVICES)
def test_input_is_not_modified(device):
    x = make_input(DEFAULT_SHAPE, torch.float32, device, "channels_last", seed=17)
    m = make_multiplier("C111", DEFAULT_SHAPE[1], torch.float32, device)
    x0, m0 = x.clone(), m.clone()
    run_op(x, m, dict(kernel_size=3, stride=2, padding=1))
    assert_bitwise_equal(x, x0)
    assert_bitwise_equal(m, m0)


@pytest.mark.parametrize("cfg", pool_params(["k3s2p1", "k3s1p1d2", "mixed", "k3s2p1ceil"]))
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_all_negative_with_padding(device, dtype, cfg):
    # Padding must act as -inf: with every pre-pool value negative, a 0 pad
    # value would win border windows.
    x = make_input(DEFAULT_SHAPE, dtype, device, values="negative", seed=18)
    m = make_multiplier("1C111", DEFAULT_SHAPE[1], dtype, device).abs()
    out = run_op(x, m, cfg)
    assert (out < 0).all()
    check_against_eager(out, x, m, cfg)


def _sprinkle(x, value, frac, seed, cluster=True):
    g = torch.Generator().manual_seed(seed)
    flat_mask = torch.rand(x.numel(), generator=g) < frac
    mask = flat_mask.view(x.shape)
    if cluster:
        # Several specials in one 2x2x2 / 3x3x3 window.
        mask[0, 0, 0:2, 0:2, 0:2] = torch.tensor([[[True, False], [False, True]], [[True, True], [False, False]]])
        mask[1, 1, 1:4, 2:5, 3:6] = True
    x = x.clone()
    x[mask.to(x.device)] = value
    return x


@pytest.mark.parametrize("cfg", pool_params(["k2", "k3s2p1", "k2s1", "mixed"]))
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("shape", [DEFAULT_SHAPE, TILED_SHAPE], ids=["odd", "tiled"])
def test_nan_propagation(shape, device, dtype, layout, cfg):
    x = _sprinkle(make_input(shape, dtype, device, layout, seed=19), float("nan"), 0.05, seed=1)
    m = make_multiplier("C111", shape[1], dtype, device)
    out = run_op(x, m, cfg)
    expected = composite(x, m, 0.2, **cfg)
    assert torch.isnan(expected).any()
    assert torch.equal(torch.isnan(out), torch.isnan(expected)), "NaN positions differ from eager"
    if dtype in FULL_DTYPES:
        assert_bitwise_equal(out, expected)
    else:
        torch.testing.assert_close(out, expected, equal_nan=True, **EAGER_TOL[dtype])


@pytest.mark.parametrize("slopes", [(0.2, None), (0.0, None), (0.3, 0.0), (-0.5, 2.0)], ids=str)
@pytest.mark.parametrize("cfg", pool_params(["k2", "k3s2p1"]))
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("shape", [DEFAULT_SHAPE, TILED_SHAPE], ids=["odd", "tiled"])
def test_infinities(shape, device, dtype, layout, cfg, slopes):
    # A zero slope turns -inf into NaN in eager (-inf * 0); the op must too.
    x = make_input(shape, dtype, device, layout, seed=20)
    x = _sprinkle(x, float("inf"), 0.04, seed=2, cluster=False)
    x = _sprinkle(x, float("-inf"), 0.04, seed=3)
    m = make_multiplier("C111", shape[1], dtype, device)
    s1, s2 = slopes
    out = run_op(x, m, cfg, s1, s2)
    expected = composite(x, m, s1, negative_slope2=s2, **cfg)
    assert torch.isinf(expected).any()
    assert torch.equal(torch.isnan(out), torch.isnan(expected)), "NaN positions differ from eager"
    assert torch.equal(torch.isposinf(out), torch.isposinf(expected)), "+inf positions differ from eager"
    assert torch.equal(torch.isneginf(out), torch.isneginf(expected)), "-inf positions differ from eager"
    if dtype in FULL_DTYPES:
        assert_bitwise_equal(out, expected)
    else:
        torch.testing.assert_close(out, expected, equal_nan=True, **EAGER_TOL[dtype])


@pytest.mark.parametrize("cfg", pool_params(["k2", "k3s2p1", "k2s1", "k3s1p1d2"]))
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("shape", [DEFAULT_SHAPE, TILED_SHAPE], ids=["odd", "tiled"])
def test_ties(shape, device, dtype, layout, cfg):
    x = make_input(shape, dtype, device, layout, values="ties", seed=21)
    m = make_multiplier("C111", shape[1], dtype, device)
    out = run_op(x, m, cfg)
    check_against_eager(out, x, m, cfg)


@pytest.mark.parametrize("cfg", pool_params(["k2", "k3s2p1", "k3s2p1ceil"]))
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_no_stale_values_in_output(device, dtype, cfg):
    # The op allocates its output; if it leaves any element unwritten, the
    # NaNs planted in the allocator's cache just before will show up.
    shape = pool_out_shape(DEFAULT_SHAPE, **cfg)
    for _ in range(3):
        poison = torch.full(shape, float("nan"), dtype=dtype, device=device)
        poison_cl = torch.full(shape, float("nan"), dtype=dtype, device=device).contiguous(memory_format=CHANNELS_LAST)
        del poison, poison_cl
    for layout in ("contiguous", "channels_last"):
        x = make_input(DEFAULT_SHAPE, dtype, device, layout, seed=22)
        m = make_multiplier("C111", DEFAULT_SHAPE[1], dtype, device)
        poison = torch.full(shape, float("nan"), dtype=dtype, device=device)
        del poison
        out = run_op(x, m, cfg)
        assert not torch.isnan(out).any(), f"{layout}: unexpected NaN in output"
        check_against_eager(out, x, m, cfg)


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch(device, layout):
    x = make_input((0, 3, 5, 7, 9), torch.float32, device, layout)
    m = make_multiplier("C111", 3, torch.float32, device)
    for cfg in (dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)):
        out = run_op(x, m, cfg)
        expected = composite(x, m, 0.2, **cfg)
        assert out.shape == expected.shape == pool_out_shape(x.shape, **cfg)
        assert out.dtype == x.dtype and out.device == x.device


@pytest.mark.parametrize("device", DEVICES)
def test_empty_channels(device):
    # Eager max_pool3d rejects C=0; the op deliberately returns an empty result,
    # shaped as the output-size formula (checked on a non-empty twin) says.
    cfg = dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)
    twin = composite(make_input((2, 1, 5, 7, 9), device=device), make_multiplier("0d", 1, device=device), 0.2, **cfg)
    x = torch.empty((2, 0, 5, 7, 9), device=device)
    for m in (make_multiplier("0d", 0, device=device), torch.empty((0, 1, 1, 1), device=device)):
        out = run_op(x, m, cfg)
        assert out.shape == (2, 0) + tuple(twin.shape[2:]) == pool_out_shape(x.shape, **cfg)
        assert out.dtype == x.dtype and out.device == x.device


@pytest.mark.parametrize("device", DEVICES)
def test_reference_post_pool_is_the_eager_composite(device):
    x = make_input(DEFAULT_SHAPE, torch.float32, device, seed=23)
    m = make_multiplier("C111", DEFAULT_SHAPE[1], torch.float32, device)
    cfg = dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)
    ref = torch_fused_ops.reference_post_pool(x, m, 0.2, negative_slope2=0.4, **cfg)
    assert_bitwise_equal(ref, composite(x, m, 0.2, negative_slope2=0.4, **cfg))
    ref_default = torch_fused_ops.reference_post_pool(x, m)
    assert_bitwise_equal(ref_default, composite(x, m))


@pytest.mark.parametrize("device", DEVICES)
def test_wrapper_defaults(device):
    # Defaults are negative_slope=0.01, kernel_size=2, stride=kernel.
    x = make_input(DEFAULT_SHAPE, torch.float32, device, seed=24)
    m = make_multiplier("C111", DEFAULT_SHAPE[1], torch.float32, device)
    assert_bitwise_equal(torch_fused_ops.post_pool(x, m), composite(x, m, 0.01, 2))


@pytest.mark.parametrize("cfg", pool_params(["k2", "k3s2p1", "mixed"]))
@pytest.mark.parametrize("device", DEVICES)
def test_raw_op_schema_call(device, cfg):
    x = make_input(DEFAULT_SHAPE, torch.float32, device, seed=25)
    m = make_multiplier("1C111", DEFAULT_SHAPE[1], torch.float32, device)
    k, s, p, d, ceil = op_args(cfg)
    out = torch.ops.fused.post_pool(x, m, 0.2, k, s, p, d, ceil, 0.5)
    assert_bitwise_equal(out, composite(x, m, 0.2, negative_slope2=0.5, **cfg))
    # Schema defaults: stride=[] means stride=kernel, padding 0, dilation 1.
    out = torch.ops.fused.post_pool(x, m, 0.2, [2, 2, 2])
    assert_bitwise_equal(out, composite(x, m, 0.2, 2))


@pytest.mark.parametrize("values", ["randn", "ties"])
@pytest.mark.parametrize("cfg", pool_params(["k2", "k3s2p1", "k231s123", "mixed"]))
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [DEFAULT_SHAPE, TILED_SHAPE], ids=["odd", "tiled"])
def test_post_pool_with_offsets(shape, device, dtype, layout, cfg, values):
    x = make_input(shape, dtype, device, layout, seed=26, values=values)
    m = make_multiplier("C111", shape[1], dtype, device)
    k, s, p, d, ceil = op_args(cfg)
    out, selected, offsets = torch.ops.fused.post_pool_with_offsets(x, m, 0.2, k, s, p, d, ceil, None)
    check_against_eager(out, x, m, cfg)
    assert selected.dtype == dtype
    assert offsets.dtype == torch.uint8
    assert out.shape == selected.shape == offsets.shape
    assert out.stride() == selected.stride() == offsets.stride()

    # The op takes its max in float32 for half inputs, so the window position
    # it picks is the one eager picks when computing in float32.
    compute = torch.float32 if dtype in HALF_DTYPES else dtype
    z = pre_pool(x.to(compute), m.to(compute), 0.2)
    _, idx = F.max_pool3d(z, return_indices=True, **cfg)
    expected_selected = x.contiguous().flatten(2).gather(2, idx.flatten(2)).view(idx.shape)
    assert_bitwise_equal(selected, expected_selected, "selected")
    expected_offsets = offsets_from_indices(idx, x.shape[2:], cfg)
    assert torch.equal(offsets.long(), expected_offsets), "offsets differ from eager's argmax"


@pytest.mark.parametrize("device", DEVICES)
def test_offsets_dtype_large_window(device):
    # kd*kh*kw = 343 > 256 no longer fits uint8.
    x = make_input((1, 2, 8, 7, 9), torch.float32, device, seed=27)
    # Put each channel's largest values on the last depth tap of the first
    # windows so the offsets really exceed 255.
    x[:, :, 6] += 10
    m = make_multiplier("C111", 2, torch.float32, device)
    cfg = dict(kernel_size=7, stride=1)
    out, selected, offsets = torch.ops.fused.post_pool_with_offsets(x, m, 0.2, [7, 7, 7], [1, 1, 1], [0, 0, 0], [1, 1, 1], False, None)
    assert offsets.dtype == torch.int32
    assert_bitwise_equal(out, composite(x, m, 0.2, **cfg))
    _, idx = F.max_pool3d(pre_pool(x, m, 0.2), return_indices=True, **cfg)
    assert torch.equal(offsets.long(), offsets_from_indices(idx, x.shape[2:], cfg))
    assert offsets.max() > 255


try:
    from hypothesis import given, settings, strategies as st
except ImportError:  # pragma: no cover - hypothesis is a test dependency
    given = None


if given is not None:

    @st.composite
    def _pool_problems(draw):
        k = [draw(st.integers(1, 4)) for _ in range(3)]
        d = [draw(st.integers(1, 2)) for _ in range(3)]
        s = [draw(st.integers(1, 3)) for _ in range(3)]
        p = [draw(st.integers(0, ki // 2)) for ki in k]
        ceil = draw(st.booleans())
        # Smallest size with at least one output: effective kernel minus padding.
        sizes = [draw(st.integers(max(1, d[i] * (k[i] - 1) + 1 - 2 * p[i]), 9)) for i in range(3)]
        stride = None if draw(st.booleans()) else s
        cfg = dict(kernel_size=k, stride=stride, padding=p, dilation=d, ceil_mode=ceil)
        slopes = draw(st.sampled_from([(0.2, None), (0.01, 0.5), (-0.3, 1.5), (0.0, None)]))
        layout = draw(st.sampled_from(["contiguous", "channels_last", "strided"]))
        seed = draw(st.integers(0, 2**16))
        return (draw(st.integers(1, 2)), draw(st.integers(1, 4)), *sizes), cfg, slopes, layout, seed

    @settings(max_examples=60, deadline=None, derandomize=True, database=None)
    @given(problem=_pool_problems())
    def test_random_pool_problems_cpu(problem):
        # Random geometry exercises window/padding arithmetic the fixed configs miss.
        shape, cfg, (s1, s2), layout, seed = problem
        x = make_input(shape, torch.float32, "cpu", layout, seed=seed)
        m = make_multiplier("C111", shape[1], torch.float32, "cpu", seed=seed)
        out = run_op(x, m, cfg, s1, s2)
        expected = composite(x, m, s1, negative_slope2=s2, **cfg)
        assert_bitwise_equal(out, expected, f"shape={shape} cfg={cfg}")
        assert out.is_contiguous(memory_format=CHANNELS_LAST) == expected.is_contiguous(memory_format=CHANNELS_LAST)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_special_multipliers_with_positive_slopes(device, dtype, layout):
    # Positive slopes make the epilogue monotone, so the CUDA inference kernels pool the raw input for channels
    # whose multiplier is finite and non-zero; these channels (0, -0, +-inf, NaN) must take the full path and
    # give eager's values, next to ordinary channels, with NaN, +-inf and exact zeros in the input.
    C = 16
    x = make_input((2, C, 6, 8, 8), dtype, device, layout, seed=41)
    x = _sprinkle(x, float("nan"), 0.01, seed=4, cluster=False)
    x = _sprinkle(x, float("inf"), 0.01, seed=5, cluster=False)
    x = _sprinkle(x, float("-inf"), 0.01, seed=6, cluster=False)
    x = _sprinkle(x, 0.0, 0.02, seed=7, cluster=False)
    x = _sprinkle(x, -0.0, 0.02, seed=8, cluster=False)
    specials = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), -0.7, 1.3, 1e-30]
    m = make_multiplier("C111", C, dtype, device).clone()
    for i, v in enumerate(specials):
        m[2 * i] = v
    for s1, s2 in [(0.2, 0.3), (1.0, 0.5)]:
        cfg = dict(kernel_size=2, stride=2)
        out = run_op(x, m, cfg, s1, s2)
        expected = composite(x, m, s1, negative_slope2=s2, **cfg)
        assert torch.equal(torch.isnan(out), torch.isnan(expected)), "NaN positions differ from eager"
        if dtype == torch.float32:
            assert_bitwise_equal(out, expected)  # -0 == +0 here: the sign of a zero may differ (README)
        else:
            torch.testing.assert_close(out, expected, equal_nan=True, **EAGER_TOL[dtype])
