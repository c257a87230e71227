"""Edge values of fused.post_pool against eager PyTorch: windows whose every value is -inf (finite inputs that
overflow included), slopes at and beyond float32's limits (subnormal, underflowing to 0, infinite, too large to
convert), and pool parameters at and beyond int32's limits.

Every path is reached: the CPU scalar scan and its SIMD bodies (2x2x2 rows and channels, the channels_last tap
loop), the CUDA generic and tiled kernels, with and without bias, contiguous and channels_last_3d. The reference
is eager PyTorch in the op's arithmetic dtype (float32 for 16-bit inputs, which the op computes in and rounds
once), with autograd for the gradients.
"""
import contextlib
import math
import time

import pytest
import torch
import torch.nn.functional as F

import torch_fused_ops  # noqa: F401  (import failure must be loud, not a skip)
from fused_testing import (
    CHANNELS_LAST,
    DEVICES,
    NONOVERLAP,
    POOL_CONFIGS,
    assert_bitwise_equal,
    op_args,
    offsets_from_indices,
)

ops = torch.ops.fused
FLOAT_MAX = torch.finfo(torch.float32).max
OVERFLOW_FLOAT = "value cannot be converted to type float without overflow"
OVERFLOW_INT = "value cannot be converted to type int without overflow"

# 2x2x2 exact tiling with OW and C multiples of the CUDA fast paths' packs (both layouts, every dtype), so the
# tiled kernels run; the other configs run the generic scans (padding, dilation, ceil mode, other windows).
TILED_SHAPE = (2, 16, 4, 6, 16)
GENERIC_SHAPE = (2, 6, 5, 7, 9)
WINDOWS = [("k2", TILED_SHAPE), ("k2s2", GENERIC_SHAPE), ("k231s231", GENERIC_SHAPE), ("k3s2p1", GENERIC_SHAPE),
           ("k3s1p1d2", GENERIC_SHAPE), ("mixed", GENERIC_SHAPE), ("k2s1", GENERIC_SHAPE)]


def acc_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def prepool(x, m, s1, s2, b=None):
    y = x if b is None else x + b.view(1, -1, 1, 1, 1)
    return F.leaky_relu(F.leaky_relu(y, s1) * m.view(1, -1, 1, 1, 1), s2)


# ---- -inf windows ----------------------------------------------------------------------------------------------

# Per dtype: an input value and a negative multiplier whose epilogue is -inf (x * m overflows for finite x; +inf
# times a negative multiplier). Even channels take the negative multiplier, odd ones a positive one (where the
# same input gives +inf or a large finite value).
POISONS = {
    "overflow": {torch.float32: (3e38, -2.0), torch.bfloat16: (3e38, -2.0), torch.float64: (1e308, -10.0)},
    "inf": {dt: (math.inf, -1.5) for dt in (torch.float32, torch.float64, torch.bfloat16, torch.float16)},
}


def poisoned_input(shape, dtype, device, layout, value, seed=0):
    """Random normal input where channels 0, 4, 8, ... are all `value` (so every window's values are -inf under a
    negative multiplier) and the other channels hold `value` at about 60% of their elements (windows all -inf,
    mixed, or finite)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    mask = torch.rand(shape, generator=g) < 0.6
    mask[:, 0::4] = True
    x = torch.where(mask, torch.tensor(value, dtype=torch.float64), x).to(dtype)
    if layout == "channels_last":
        x = x.contiguous(memory_format=CHANNELS_LAST)
    return x.to(device)


def poison_multiplier(C, dtype, device, m_neg):
    m = torch.tensor([m_neg if c % 2 == 0 else 1.5 for c in range(C)], dtype=torch.float64)
    return m.to(dtype).reshape(C, 1, 1, 1).to(device)


def eager_selection(x, m, cfg, s1, s2, b=None):
    """Eager max_pool3d on the eager pre-pool values in the op's arithmetic dtype: (pooled, indices).

    On a contiguous copy: eager's channels_last CPU kernel reports, for a window whose every value is -inf, an
    index that drops the window's D start (torch 2.14: index 0 for output (0, 0, 1, 0, 0) of a 2x2x2 pool), while
    its contiguous CPU kernel reports the window's first in-range element."""
    a = acc_dtype(x.dtype)
    x = x.contiguous()
    y = prepool(x.to(a), m.to(a), s1, s2, None if b is None else b.to(a))
    return F.max_pool3d(y, cfg["kernel_size"], cfg.get("stride"), cfg.get("padding", 0), cfg.get("dilation", 1),
                        cfg.get("ceil_mode", False), return_indices=True)


def gather(t, idx):
    """t's (N, C) planes gathered at max_pool3d's flat indices."""
    n, c = t.shape[:2]
    return t.contiguous().reshape(n, c, -1).gather(2, idx.reshape(n, c, -1)).reshape(idx.shape)


def eager_param_grads(x, m, g, cfg, s1, s2, b=None):
    """Gradients of m (and b) through eager autograd of the epilogue at the inputs eager max_pool3d selected:
    eager's own multiplier gradient, less its 0 * inf = NaN from unselected infinite inputs (a documented
    difference, README: Autograd)."""
    a = acc_dtype(x.dtype)
    _, idx = eager_selection(x, m, cfg, s1, s2, b)
    xs = gather(x.contiguous().to(a), idx)
    me = m.to(a).detach().requires_grad_(True)
    be = None if b is None else b.to(a).detach().requires_grad_(True)
    prepool(xs, me, s1, s2, be).backward(g.to(a))
    return me.grad, (None if b is None else be.grad)


def eager_input_grad(x, m, g, cfg, s1, s2, b=None):
    a = acc_dtype(x.dtype)
    xe = x.contiguous().to(a).detach().requires_grad_(True)  # contiguous: see eager_selection
    y = prepool(xe, m.to(a), s1, s2, None if b is None else b.to(a))
    F.max_pool3d(y, cfg["kernel_size"], cfg.get("stride"), cfg.get("padding", 0), cfg.get("dilation", 1),
                 cfg.get("ceil_mode", False)).backward(g.to(a))
    return xe.grad


def poison_cases():
    for kind, per_dtype in POISONS.items():
        for dtype in per_dtype:
            yield pytest.param(kind, dtype, id=f"{kind}-{str(dtype)[6:]}")


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("window,shape", [pytest.param(w, s, id=w) for w, s in WINDOWS])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("kind,dtype", list(poison_cases()))
@pytest.mark.parametrize("device", DEVICES)
def test_minus_inf_windows_select_the_first_tap(device, kind, dtype, layout, window, shape, bias):
    # A window whose every value is -inf selects its first in-range tap, as max_pool3d's index does: the training
    # forward saves that tap's raw input and offset, and the gradients are eager's.
    value, m_neg = POISONS[kind][dtype]
    cfg = POOL_CONFIGS[window]
    s1, s2 = 0.2, 0.2
    x = poisoned_input(shape, dtype, device, layout, value)
    C = shape[1]
    m = poison_multiplier(C, dtype, device, m_neg)
    b = (torch.linspace(-0.5, 0.5, C, dtype=torch.float64).to(dtype).to(device)) if bias else None
    k, s, p, d, ceil = op_args(cfg)
    if bias:
        out, sel, off = ops.post_pool_bias_with_offsets(x, b, m, s1, k, s, p, d, ceil, s2)
    else:
        out, sel, off = ops.post_pool_with_offsets(x, m, s1, k, s, p, d, ceil, s2)
    ref, idx = eager_selection(x.cpu(), m.cpu(), cfg, s1, s2, None if b is None else b.cpu())
    assert (ref == -math.inf).any(), "the case must hold windows whose every value is -inf"
    assert_bitwise_equal(out.cpu(), ref.to(dtype), "output")
    assert_bitwise_equal(off.cpu().long(), offsets_from_indices(idx, shape[2:], cfg), "offsets")
    assert_bitwise_equal(sel.cpu(), gather(x.cpu(), idx), "selected (raw input at the chosen tap)")

    # Gradients through the public autograd path.
    # Small grad_output so that sums of contributions near 1e38 (1e308) stay finite whatever their order.
    g = (torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 1e-3).to(dtype)
    g = g.contiguous(memory_format=CHANNELS_LAST if layout == "channels_last" else torch.contiguous_format).to(device)
    xo = x.detach().requires_grad_(True)
    mo = m.detach().requires_grad_(True)
    bo = None if b is None else b.detach().requires_grad_(True)
    if bias:
        ops.post_pool_bias(xo, bo, mo, s1, k, s, p, d, ceil, s2).backward(g)
    else:
        torch_fused_ops.post_pool(xo, mo, s1, negative_slope2=s2, **cfg).backward(g)
    gx_e = eager_input_grad(x.cpu(), m.cpu(), g.cpu(), cfg, s1, s2, None if b is None else b.cpu())
    gm_e, gb_e = eager_param_grads(x.cpu(), m.cpu(), g.cpu(), cfg, s1, s2, None if b is None else b.cpu())
    if window in NONOVERLAP:
        assert_bitwise_equal(xo.grad.cpu(), gx_e.to(dtype), "grad_input")
    else:
        torch.testing.assert_close(xo.grad.cpu(), gx_e.to(dtype), rtol=1e-6, atol=0)
    # Sums over outputs of contributions up to ~1e38 of both signs, in another order than eager's: an absolute
    # tolerance from the sum of their magnitudes (infinite inputs: infinities and NaNs must agree exactly).
    _, idx = eager_selection(x.cpu(), m.cpu(), cfg, s1, s2, None if b is None else b.cpu())
    magnitude = float((gather(x.cpu().double(), idx).abs() * g.cpu().double().abs()).sum())
    eps = {torch.float32: 1e-6, torch.float64: 1e-14}.get(dtype, 1e-2)
    tol = dict(rtol=eps, atol=eps * magnitude if math.isfinite(magnitude) else 0.0, equal_nan=True)
    torch.testing.assert_close(mo.grad.cpu().double(), gm_e.reshape(m.shape).double(), **tol)
    if bias:
        # grad_bias sums grad_output times slope factors (|m| <= 10): finite whatever the inputs.
        scale = 10 * float(g.cpu().double().abs().sum())
        torch.testing.assert_close(bo.grad.cpu().double(), gb_e.double(), rtol=eps, atol=eps * scale)


@pytest.mark.parametrize("dtype,x_value,m_value", [
    (torch.float32, 3e38, -2.0), (torch.float64, 1e308, -10.0), (torch.float32, math.inf, -1.0),
    (torch.float64, math.inf, -1.0), (torch.bfloat16, 3e38, -2.0), (torch.float16, math.inf, -1.0)], ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_issue_reproducers_single_element(device, dtype, x_value, m_value):
    # One element, kernel 1: the -inf window's gradients (float32 3e38 * -2: x.grad -0.4, m.grad 6e37).
    x = torch.full((1, 1, 1, 1, 1), x_value, dtype=dtype, device=device, requires_grad=True)
    m = torch.tensor(m_value, dtype=dtype, device=device, requires_grad=True)
    out = torch_fused_ops.post_pool(x, m, 0.2, 1)
    out.sum().backward()
    xe = x.detach().to(acc_dtype(dtype)).requires_grad_(True)
    me = m.detach().to(acc_dtype(dtype)).requires_grad_(True)
    ref = F.max_pool3d(prepool(xe, me, 0.2, 0.2), 1)
    ref.sum().backward()
    assert ref.item() == -math.inf
    assert_bitwise_equal(out.detach().cpu(), ref.detach().cpu().to(dtype), "output")
    assert_bitwise_equal(x.grad.cpu(), xe.grad.cpu().to(dtype), "x.grad")
    assert_bitwise_equal(m.grad.cpu(), me.grad.cpu().to(dtype), "m.grad")
    if dtype == torch.float32 and x_value == 3e38:
        assert x.grad.item() == pytest.approx(-0.4) and m.grad.item() == pytest.approx(6e37)


# ---- slopes at and beyond float32's limits ---------------------------------------------------------------------

# (s1, s2) that eager leaky_relu accepts for every dtype: the float32 limits, subnormal, underflowing to 0 (1e-50
# and 1e-46 round to 0; 1e-45 to the smallest subnormal), infinite, negative, NaN.
SLOPES_OK = [(1e-50, 1e-50), (1e-50, 0.2), (0.2, 1e-50), (1e-46, 0.3), (1e-45, 1e-45), (1e-40, 2e-39),
             (FLOAT_MAX, 0.2), (0.2, -FLOAT_MAX), (math.inf, 0.2), (0.2, -math.inf), (1e-38, 1.0),
             (-1e-50, 0.5), (math.nan, 0.2)]


def slope_input(shape, dtype, device, layout, seed=5):
    """Random normal with zeros, +-inf and values near float's limits sprinkled in (0 * inf and -inf * 0 are NaN
    for some slopes, which a monotone shortcut would skip)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    flat = x.view(-1)
    n = flat.numel()
    picks = torch.randperm(n, generator=g)
    specials = [0.0, -0.0, math.inf, -math.inf, 1e38, -1e38, 1e-40, -1e-40]
    for i, v in enumerate(specials):
        flat[picks[i * n // 40:(i + 1) * n // 40]] = v
    x = x.to(dtype)
    if layout == "channels_last":
        x = x.contiguous(memory_format=CHANNELS_LAST)
    return x.to(device)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("slopes", SLOPES_OK, ids=str)
@pytest.mark.parametrize("mkind", ["positive", "mixed"])
@pytest.mark.parametrize("window,shape", [pytest.param("k2", TILED_SHAPE, id="k2"),
                                          pytest.param("k3s2p1", GENERIC_SHAPE, id="k3s2p1")])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_extreme_slopes_match_eager(device, dtype, layout, window, shape, mkind, slopes):
    # Inference (where the 2x2x2 kernels may take the monotone shortcut, which must be decided on the float
    # values the kernel computes with) and the training forward, against eager in the op's arithmetic dtype.
    s1, s2 = slopes
    cfg = POOL_CONFIGS[window]
    x = slope_input(shape, dtype, device, layout)
    C = shape[1]
    mags = torch.linspace(0.5, 1.5, C, dtype=torch.float64)
    if mkind == "mixed":
        mags = mags * torch.tensor([1.0 if c % 2 == 0 else -1.0 for c in range(C)], dtype=torch.float64)
    m = mags.to(dtype).reshape(C, 1, 1, 1).to(device)
    ref, idx = eager_selection(x.cpu(), m.cpu(), cfg, s1, s2)
    ref = ref.to(dtype)
    out = torch_fused_ops.post_pool(x, m, s1, negative_slope2=s2, **cfg)
    # Equal values, NaNs in the same places (a +0/-0 tie may keep either zero under the monotone shortcut).
    assert_bitwise_equal(out.cpu(), ref, "inference output")
    k, s, p, d, ceil = op_args(cfg)
    out_t, sel, off = ops.post_pool_with_offsets(x, m, s1, k, s, p, d, ceil, s2)
    assert_bitwise_equal(out_t.cpu(), ref, "training output")
    # The selection is eager's wherever it is defined without NaN ties (the last NaN wins in both).
    want = offsets_from_indices(idx, shape[2:], cfg)
    assert_bitwise_equal(off.cpu().long(), want, "offsets")
    assert_bitwise_equal(sel.cpu(), gather(x.cpu(), idx), "selected")


@pytest.mark.parametrize("slopes", [(1e-50, 1e-50), (1e-45, 0.2), (1e-40, -2e-39), (FLOAT_MAX, 0.5)], ids=str)
@pytest.mark.parametrize("window,shape", [pytest.param("k2", TILED_SHAPE, id="k2"),
                                          pytest.param("k3s1p1", GENERIC_SHAPE, id="k3s1p1")])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("device", DEVICES)
def test_extreme_slopes_gradients(device, layout, window, shape, slopes):
    # float32 gradients with underflowing, subnormal and huge slopes against eager autograd (finite inputs).
    s1, s2 = slopes
    cfg = POOL_CONFIGS[window]
    g = torch.Generator().manual_seed(9)
    x = torch.randn(shape, generator=g)
    if layout == "channels_last":
        x = x.contiguous(memory_format=CHANNELS_LAST)
    x = x.to(device)
    m = torch.linspace(-1.5, 1.5, shape[1]).reshape(-1, 1, 1, 1).to(device)
    xo, mo = x.detach().requires_grad_(True), m.detach().requires_grad_(True)
    out = torch_fused_ops.post_pool(xo, mo, s1, negative_slope2=s2, **cfg)
    go = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(device)
    out.backward(go)
    xe, me = x.detach().cpu().requires_grad_(True), m.detach().cpu().requires_grad_(True)
    ref = F.max_pool3d(prepool(xe, me, s1, s2), cfg["kernel_size"], cfg.get("stride"), cfg.get("padding", 0))
    ref.backward(go.cpu())
    assert_bitwise_equal(out.detach().cpu(), ref.detach(), "output")
    if window in NONOVERLAP:
        assert_bitwise_equal(xo.grad.cpu(), xe.grad, "grad_input")
    else:
        torch.testing.assert_close(xo.grad.cpu(), xe.grad, rtol=1e-5, atol=1e-30)
    # The multiplier's gradient from the selected inputs (a huge slope makes unselected ones infinite, where
    # eager's own gradient turns NaN: the documented difference).
    gm_e, _ = eager_param_grads(x.cpu(), m.cpu(), go.cpu(), cfg, s1, s2)
    scale = float(xe.detach().abs().amax()) * max(1.0, abs(s1)) * max(1.0, abs(s2)) * float(go.abs().sum())
    torch.testing.assert_close(mo.grad.cpu(), gm_e, rtol=1e-5, atol=1e-6 * scale, equal_nan=True)


@pytest.mark.parametrize("slope", [1e39, -1e39, 3.5e38, 3.4028235e38, -3.5e38, 1e300], ids=str)
@pytest.mark.parametrize("which", ["negative_slope", "negative_slope2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64], ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_slopes_beyond_float_raise_as_eager(device, dtype, which, slope):
    # Eager leaky_relu raises RuntimeError for a finite slope beyond float's range on float32/bfloat16/float16
    # inputs and accepts it for float64: so does every op, in the kernels and in the fake impls.
    x = torch.randn(1, 2, 2, 2, 2, dtype=dtype, device=device)
    m = torch.tensor([1.5, -0.5], dtype=dtype, device=device).reshape(2, 1, 1, 1)
    b = torch.zeros(2, dtype=dtype, device=device)
    s1, s2 = (slope, 0.2) if which == "negative_slope" else (0.2, slope)
    try:
        prepool(x, m, s1, s2)
        eager_error = None
    except RuntimeError as e:
        eager_error = str(e)
    assert (eager_error is None) == (dtype == torch.float64)
    calls = {
        "post_pool": lambda: ops.post_pool(x, m, s1, [2], [], [0], [1], False, s2),
        "post_pool_with_offsets": lambda: ops.post_pool_with_offsets(x, m, s1, [2], [], [0], [1], False, s2),
        "post_pool_bias": lambda: ops.post_pool_bias(x, b, m, s1, [2], [], [0], [1], False, s2),
        "post_pool_bias_with_offsets": lambda: ops.post_pool_bias_with_offsets(x, b, m, s1, [2], [], [0], [1], False,
                                                                               s2),
    }
    g = torch.ones(1, 2, 1, 1, 1, dtype=dtype, device=device)
    off = torch.zeros(1, 2, 1, 1, 1, dtype=torch.uint8, device=device)
    calls["post_pool_backward"] = lambda: ops.post_pool_backward(g, g, off, m, s1, s2, [1, 2, 2, 2, 2], [2, 2, 2],
                                                                 [2, 2, 2], [0, 0, 0], [1, 1, 1], False)
    calls["post_pool_bias_backward"] = lambda: ops.post_pool_bias_backward(
        g, g, off, b, m, s1, s2, [1, 2, 2, 2, 2], [2, 2, 2], [2, 2, 2], [0, 0, 0], [1, 1, 1], False)
    from torch._subclasses.fake_tensor import FakeTensorMode
    for mode in ("real", "fake"):
        for name, call in calls.items():
            with FakeTensorMode(allow_non_fake_inputs=True) if mode == "fake" else contextlib.nullcontext():
                if eager_error is None:
                    call()  # float64: accepted, as eager accepts it
                    continue
                with pytest.raises(RuntimeError, match=OVERFLOW_FLOAT) as e:
                    call()
            assert which in str(e.value), f"{mode} {name}: the message must name the slope: {e.value}"


# ---- pool parameters at and beyond int32's limits -------------------------------------------------------------

BEYOND_INT32 = [
    dict(kernel_size=2**31, padding=2**30),
    dict(kernel_size=(1, 1, 2**40)),
    dict(kernel_size=2**62),
    dict(kernel_size=2, stride=2**62),
    dict(kernel_size=2, stride=2**31),
    dict(kernel_size=2, dilation=(1, 2**31, 1)),
    dict(kernel_size=(2, 2, 2), padding=(0, 0, -2**40)),
    dict(kernel_size=-2**31 - 1),
]


@pytest.mark.parametrize("cfg", BEYOND_INT32, ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_pool_parameters_beyond_int32_raise_as_max_pool3d(device, cfg):
    x = torch.randn(1, 2, 4, 4, 4, device=device)
    m = torch.tensor(1.5, device=device)
    # Eager raises a RuntimeError on every device; its CUDA kernel, and its CPU path before torch 2.13, say "integer
    # out of range" on some torch versions, so only torch 2.13+'s CPU message is matched exactly. Ours always says
    # OVERFLOW_INT.
    if device != "cpu":
        eager_message = None
    elif torch.__version__ >= "2.13":
        eager_message = OVERFLOW_INT
    else:
        eager_message = f"{OVERFLOW_INT}|integer out of range"
    with pytest.raises(RuntimeError, match=eager_message):
        F.max_pool3d(x, **cfg)
    with pytest.raises(RuntimeError, match=OVERFLOW_INT):
        torch_fused_ops.post_pool(x, m, 0.2, **cfg)
    with pytest.raises(RuntimeError, match=OVERFLOW_INT):
        torch_fused_ops.post_pool(x.requires_grad_(), m, 0.2, **cfg)
    k, s, p, d, ceil = _schema_args(cfg)
    with pytest.raises(RuntimeError, match=OVERFLOW_INT):
        ops.post_pool_bias(x.detach(), torch.zeros(2, device=device), m, 0.2, k, s, p, d, ceil, None)
    g = torch.ones(1, 2, 1, 1, 1, device=device)
    with pytest.raises(RuntimeError, match=OVERFLOW_INT):
        ops.post_pool_backward(g, g, torch.zeros_like(g, dtype=torch.int32), m, 0.2, None, [1, 2, 4, 4, 4], k,
                               s or k, p, d, False)
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode(allow_non_fake_inputs=True):
        with pytest.raises(RuntimeError, match=OVERFLOW_INT):
            ops.post_pool(x.detach(), m, 0.2, k, s, p, d, ceil, None)
        with pytest.raises(RuntimeError, match=OVERFLOW_INT):
            ops.post_pool_with_offsets(x.detach(), m, 0.2, k, s, p, d, ceil, None)


def _schema_args(cfg):
    def three(v):
        return [v] * 3 if isinstance(v, int) else list(v)
    k = three(cfg["kernel_size"])
    s = three(cfg["stride"]) if "stride" in cfg else []
    return k, s, three(cfg.get("padding", 0)), three(cfg.get("dilation", 1)), False


# Legal pools at int32's limits: windows of up to 2**31 - 1 taps that mostly lie in the padding.
AT_INT32 = [
    dict(kernel_size=(1, 1, 2**31 - 1), padding=(0, 0, 2**30 - 1)),
    dict(kernel_size=(1, 1, 2**24), padding=(0, 0, 2**23)),
    dict(kernel_size=(3, 1, 2**24 + 1), stride=(1, 1, 3), padding=(1, 0, 2**24 // 2)),
    dict(kernel_size=(1, 2**20, 1), stride=(1, 2**31 - 1, 1), padding=(0, 2**19, 0)),
    dict(kernel_size=(1, 1, 2**22), stride=(1, 1, 2**21), padding=(0, 0, 2**21), ceil_mode=True),
]


@pytest.mark.parametrize("cfg", AT_INT32, ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_huge_legal_kernels_match_eager_in_bounded_time(device, cfg):
    # Forward and backward work per element is bounded by the outputs whose windows cover it, not by the kernel's
    # size: before, the backward visited every tap per input element (a kernel of 2**24 took 2.7 s for 60
    # elements; 2**31 would take hours).
    # Small, since eager's reference is slow on huge windows (8 s for 360 outputs of kernel 2**31 - 1).
    shape = (1, 3, 1, 2, 3) if max(cfg["kernel_size"]) > 2**30 else (2, 3, 3, 4, 5)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(4)).to(device)
    m = torch.tensor([1.5, -0.5, 0.75]).reshape(3, 1, 1, 1).to(device)
    ref_x = x.detach().cpu().requires_grad_(True)
    ref_m = m.detach().cpu().requires_grad_(True)
    ref = F.max_pool3d(prepool(ref_x, ref_m, 0.2, 0.2), **cfg)
    xo, mo = x.detach().requires_grad_(True), m.detach().requires_grad_(True)
    start = time.perf_counter()
    out = torch_fused_ops.post_pool(xo, mo, 0.2, **cfg)
    go = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(device)
    out.backward(go)
    if device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    assert elapsed < 20.0, f"forward + backward took {elapsed:.1f} s"
    ref.backward(go.cpu())
    assert_bitwise_equal(out.detach().cpu(), ref.detach(), "output")
    torch.testing.assert_close(xo.grad.cpu(), ref_x.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(mo.grad.cpu(), ref_m.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_window_of_more_than_int32_taps_raises_clearly(device):
    # max_pool3d accepts a window of 2**40 taps (its indices address the input); our window offsets are int32,
    # so the op raises a ValueError that says so, in the kernels and the fake impl alike.
    x = torch.randn(1, 1, 2, 2, 2, device=device)
    m = torch.tensor(1.5, device=device)
    cfg = dict(kernel_size=(2**20, 2**20, 1), padding=(2**19, 2**19, 0))
    F.max_pool3d(x, **cfg)  # legal for eager
    with pytest.raises(ValueError, match="more than 2\\*\\*31 - 1 taps"):
        torch_fused_ops.post_pool(x, m, 0.2, **cfg)
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode(allow_non_fake_inputs=True):
        with pytest.raises(ValueError, match="more than 2\\*\\*31 - 1 taps"):
            ops.post_pool(x, m, 0.2, [2**20, 2**20, 1], [], [2**19, 2**19, 0], [1], False, None)
