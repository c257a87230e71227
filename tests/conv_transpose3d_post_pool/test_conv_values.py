"""What fused.conv_transpose3d_post_pool computes, against eager PyTorch, on every device: on CPU through its
composite (aten's convolution, then post_pool), on CUDA through the fused kernel wherever it applies (the KernelBench
geometry; float32, bfloat16, float16) and the composite elsewhere (float64).

Two kinds of reference, both eager:
- integer data: every convolution value is a small integer, exact in every precision and summation order, so
  out, selected and offsets must equal eager's float32 chain (F.conv_transpose3d -> F.leaky_relu -> x m ->
  F.leaky_relu -> F.max_pool3d with indices) bit for bit: ties keep the first tap, the last NaN wins;
- random data: float64 eager, within one rounding of the I/O dtype, and for tensor-core precisions within a
  multiple of cuDNN's own error (TF32 1.5x, bfloat16/float16 2x, as issue 17 sets).
Also: no bias with a 0-d multiplier, multiplier shapes, weights updated between calls, and every spelling of the
typed wrapper's int[3] arguments. Non-finite values: test_conv_nonfinite.py; layouts: test_conv_layouts.py.
"""
import math

import pytest
import torch
import torch.nn.functional as F

from conv_testing import (CASES, CONFIGS, DEVICES, HALF, VALUE_CASES, call_case, case_id, check_close, conv64,
                          half_bound, kb_call, make_case, make_ints, make_random, make_tensors, poison, pool_chain,
                          reference64, reference_case, reference_config, rel, same_bits, tol)
from torch_fused_ops import conv_transpose3d_post_pool


@pytest.mark.usefixtures("strict_float32")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64], ids=str)
@pytest.mark.parametrize("case", VALUE_CASES, ids=case_id)
def test_values_match_float64(device, dtype, case):
    n, cin, cout, dhw, op, bias, (s1, s2), mult = case
    x, w, b, m = make_random(n, cin, cout, dhw, dtype, device, bias=bias, mult=mult)
    ref = reference64(x, w, b, m, s1, s2, op)
    poison(ref.shape, dtype, device)
    out = kb_call(x, w, b, m, s1, s2, op)
    assert out.shape == ref.shape and out.dtype == dtype and out.device == x.device
    assert torch.isfinite(out).all()
    check_close(out, ref, dtype, half_bound(x, w, b, m, s1, s2, op) if dtype in HALF else None)


@pytest.mark.usefixtures("strict_float32")
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
    ref_out, ref_sel, ref_off = pool_chain(y, m.float().cpu(), 0.2, 0.3)
    assert ref_out.isnan().any() and (ref_off != 0).any()
    res = kb_call(x, w, b, m, 0.2, 0.3, op, offsets=offsets)
    out = res[0] if offsets else res
    assert same_bits(out, ref_out.to(dtype))
    if offsets:
        sel, off = res[1], res[2]
        assert off.dtype == torch.uint8 and sel.dtype == dtype
        assert sel.stride() == out.stride() == off.stride()
        assert same_bits(sel, ref_sel.to(dtype)) and torch.equal(off.cpu(), ref_off)


@pytest.mark.usefixtures("strict_float32")
@pytest.mark.parametrize("device", DEVICES)
def test_zero_weights_tie_every_window(device):
    # Every convolution value is 0: all 8 taps tie, offset 0 everywhere.
    x, w, _, m = make_random(1, 4, 3, (2, 3, 2), torch.float32, device)
    out, sel, off = kb_call(x, torch.zeros_like(w), None, m, 0.2, 0.2, offsets=True)
    assert not off.any() and not out.any() and not sel.any()


@pytest.mark.usefixtures("strict_float32")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,tf32,factor", [(torch.float32, True, 1.5), (torch.bfloat16, False, 2.0),
                                               (torch.float16, False, 2.0)], ids=["tf32", "bf16", "fp16"])
def test_tensor_core_error_within_cudnn(device, dtype, tf32, factor):
    # Relative L2 error against float64 at most `factor` times the eager chain's (cuDNN's convolution in that
    # precision) on the same inputs; strict float32 separately below.
    x, w, b, m = make_random(2, 16, 32, (6, 8, 7), dtype, device, mult="mixed", seed=5)
    ref = reference64(x, w, b, m, 0.2, 0.2)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=tf32):
        out = kb_call(x, w, b, m, 0.2, 0.2)
        eager = pool_chain(F.conv_transpose3d(x, w, b, 2, 1, 1), m, 0.2, 0.2)[0]
    assert rel(out, ref) <= factor * rel(eager, ref) + 1e-7, (rel(out, ref), rel(eager, ref))


@pytest.mark.usefixtures("strict_float32")
@pytest.mark.parametrize("device", DEVICES)
def test_strict_float32_error(device):
    x, w, b, m = make_random(2, 16, 32, (6, 8, 7), torch.float32, device, seed=6)
    assert rel(kb_call(x, w, b, m, 0.2, 0.2), reference64(x, w, b, m, 0.2, 0.2)) < 1e-6


@pytest.mark.usefixtures("strict_float32")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cin", [3, 16, 40, 64])
def test_strict_float32_error_within_cudnn(device, cin):
    # Strict float32 within 3x the eager chain's float32 error at every Cin (issue 29): the tensor cores' own
    # accumulation truncates, so a long chain of them made the fused kernel's error grow with Cin (17-27x cuDNN's
    # at Cin 33-64) until each k-step's three products got a fresh accumulator and an IEEE add.
    x, w, b, m = make_random(2, cin, 32, (6, 8, 7), torch.float32, device, mult="positive", seed=10 + cin)
    ref = reference64(x, w, b, m, 0.2, 0.2)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        out = kb_call(x, w, b, m, 0.2, 0.2)
        eager = pool_chain(F.conv_transpose3d(x, w, b, 2, 1, 1), m, 0.2, 0.2)[0]
    assert rel(out, ref) <= 3 * rel(eager, ref), (rel(out, ref), rel(eager, ref))


@pytest.mark.usefixtures("strict_float32")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ceil", [False, True], ids=["floor", "ceil"])
@pytest.mark.parametrize("op", [(0, 0, 0), (1, 1, 1), (1, 0, 1), (0, 1, 1)], ids=lambda o: "op" + "".join(map(str, o)))
def test_output_padding_and_ceil_mode(device, ceil, op):
    # ceil_mode with output_padding 0 pools one more (partial) plane: the composite covers it.
    x, w, b, m = make_random(2, 5, 7, (3, 4, 5), torch.float32, device, seed=8)
    ref = reference64(x, w, b, m, 0.2, -0.3, op, ceil)
    out = kb_call(x, w, b, m, 0.2, -0.3, op, ceil=ceil)
    assert out.shape == ref.shape
    torch.testing.assert_close(out.double().cpu(), ref, **tol(torch.float32))


@pytest.mark.usefixtures("strict_float32")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(), (1,), (7, 1, 1, 1), (1, 7, 1, 1, 1), (1, 1, 1, 1, 1)], ids=str)
def test_multiplier_shapes(device, shape):
    x, w, b, _ = make_random(2, 5, 7, (3, 2, 3), torch.float32, device, seed=9)
    numel = math.prod(shape)
    m = (torch.randn(numel, generator=torch.Generator().manual_seed(2)) - 0.3).view(shape).to(device)
    ref = pool_chain(conv64(x, w, b, (1, 1, 1)),
                     m.double().cpu().reshape(-1).expand(7) if numel == 1 else m.double().cpu(),
                     0.2, 0.2)[0]
    torch.testing.assert_close(kb_call(x, w, b, m, 0.2, 0.2).double().cpu(), ref, **tol(torch.float32))


@pytest.mark.usefixtures("strict_float32")
@pytest.mark.parametrize("device", DEVICES)
def test_weight_updates_are_seen(device):
    # Each call uses the weight as it is now: after in-place updates (one bypassing the version counter), for
    # another tensor, for an inference tensor.
    x, w, b, m = make_random(1, 4, 6, (2, 3, 2), torch.float32, device)

    def check(weight):
        torch.testing.assert_close(kb_call(x, weight, b, m, 0.2, 0.2).double().cpu(),
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


@pytest.mark.parametrize("device", DEVICES)
def test_no_bias_and_scalar_multiplier(device):
    case = CASES["kb"]
    x, w, _, _ = make_case(case, torch.float64, device, bias=False)
    m = torch.tensor(-0.7, dtype=torch.float64, device=device)
    torch.testing.assert_close(call_case(x, w, None, m, 0.1, 0.1, case), reference_case(x, w, None, m, 0.1, 0.1, case))


@pytest.mark.parametrize("form", ["int", "list", "tuple", "one"])
def test_wrapper_argument_forms(form):
    # The typed wrapper expands plain ints inline and hands everything else to expand3: every form of an int[3]
    # argument gives eager's result.
    x, w, b, m = make_tensors(torch.float32, "cpu")
    f = {"int": lambda v: v, "list": lambda v: [v] * 3, "tuple": lambda v: (v,) * 3, "one": lambda v: [v]}[form]
    out = conv_transpose3d_post_pool(x, w, b, m, 0.2, f(2), f(1), f(1), 1, f(1), f(2), f(2), f(0), f(1))
    torch.testing.assert_close(out, reference_config(x, w, b, m, CONFIGS["kb"]), rtol=1e-5, atol=1e-5)
