"""NaN and infinities through fused.conv_transpose3d_post_pool, as eager's chain propagates them: in the input
and weights (inf * 0 = NaN, as in the convolution), channels whose multiplier or bias breaks the kernel's monotone
shortcut, and windows that are -inf throughout (their offsets and input gradient too). Against eager float64."""
import math

import pytest
import torch

from conv_testing import (CASES, DEVICES, HALF, OPS, call_case, check_close, half_bound, kb_args, kb_call,
                          make_case, make_random, reference64, reference_case, tol)


@pytest.mark.usefixtures("strict_float32")
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("slopes", [(0.2, 0.2), (0.0, -0.5)], ids=["pos_slopes", "zero_neg_slopes"])
def test_nan_and_inf_propagate(device, dtype, slopes):
    x, w, b, m = make_random(2, 16, 40, (4, 5, 6), dtype, device, seed=21)
    flat = x.view(-1)
    flat[3], flat[500], flat[901], flat[1500] = float("inf"), float("-inf"), float("nan"), float("-inf")
    w[0, 1, 1, 1, 1] = 0.0  # inf * 0 = NaN, as in the convolution
    ref = reference64(x, w, b, m, *slopes)
    assert ref.isnan().any() and ref.isinf().any() and ref.isfinite().float().mean() > 0.5
    out = kb_call(x, w, b, m, *slopes)
    assert torch.equal(out.cpu().isinf(), ref.isinf())
    check_close(out, ref, dtype, half_bound(x, w, b, m, *slopes) if dtype in HALF else None)


@pytest.mark.usefixtures("strict_float32")
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("breaker", ["zero-multiplier", "inf-multiplier", "nan-multiplier", "inf-bias",
                                     "nan-bias"])
def test_channels_that_break_the_monotone_shortcut(device, breaker):
    # Slopes > 0 and finite nonzero multipliers of both signs allow max (or min) before the epilogue; one channel
    # that breaks it (here channel 20 of 40) must still give max_pool3d's values, with infinite inputs present.
    x, w, b, m = make_random(2, 16, 40, (4, 5, 6), torch.float32, device, mult="positive", seed=13)
    m[0::3] = -m[0::3]
    flat = x.view(-1)
    flat[7], flat[800], flat[1201] = float("inf"), float("-inf"), float("inf")
    target, value = {"zero-multiplier": (m, 0.0), "inf-multiplier": (m, -math.inf), "nan-multiplier": (m, math.nan),
                     "inf-bias": (b, math.inf), "nan-bias": (b, math.nan)}[breaker]
    target.view(-1)[20] = value
    check_close(kb_call(x, w, b, m, 0.2, 0.2), reference64(x, w, b, m, 0.2, 0.2), torch.float32)


@pytest.mark.usefixtures("strict_float32")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mult", ["positive", "negative"])
def test_all_minus_inf_windows(device, mult):
    # A -inf input with positive weights makes every value of its window -inf (after the epilogue, for either
    # sign of the multiplier: a negative one needs +inf, from negated weights). max_pool3d outputs -inf there and
    # reports the first tap; the input gradient follows eager's.
    x, w, b, m = make_random(1, 3, 4, (3, 4, 3), torch.float32, device, mult=mult, seed=30)
    w = w.abs() + 0.1
    if mult == "negative":
        w = -w
    x[0, 1, 1, 2, 1] = float("-inf")
    ref = reference64(x, w, b, m, 0.2, 0.2)
    assert (ref[0, :, 1, 2, 1] == float("-inf")).all()
    out, _, off = kb_call(x, w, b, m, 0.2, 0.2, offsets=True)
    assert torch.equal(out.cpu().isinf(), ref.isinf()) and (out[0, :, 1, 2, 1] == float("-inf")).all()
    assert (off[0, :, 1, 2, 1] == 0).all()
    torch.testing.assert_close(out.double().cpu(), ref, **tol(torch.float32))
    if mult == "positive":  # a negative multiplier is where the saved value differs (docs/design.md, -inf windows)
        xr = x.clone().requires_grad_()
        g = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1)).to(device)
        got, = torch.autograd.grad(OPS.conv_transpose3d_post_pool(*kb_args(xr, w, b, m, 0.2, 0.2)), xr, g)
        x64 = x.double().cpu().requires_grad_()
        want, = torch.autograd.grad(reference64(x64, w, b, m, 0.2, 0.2), x64, g.double().cpu())
        torch.testing.assert_close(got.double().cpu(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_nan_and_inf_propagate_float64(device):
    case = CASES["kb"]
    x, w, b, m = make_case(case, torch.float64, device, shape=(1, 4, 4, 4))
    x[0, 0, 1, 1, 1] = float("nan")
    x[0, 1, 2, 2, 2] = float("inf")
    torch.testing.assert_close(call_case(x, w, b, m, 0.2, 0.2, case), reference_case(x, w, b, m, 0.2, 0.2, case),
                               equal_nan=True)
