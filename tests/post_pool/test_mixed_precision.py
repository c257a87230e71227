"""post_pool's mixed form: a float16/bfloat16 input with a float32 multiplier, the chain torch.autocast computes
(leaky_relu in the input's dtype, the promoting multiply, the rest in float32). Forward values, the training
form's saved tensors and the gradients against eager PyTorch running the same chain; dtypes, errors, opcheck."""
import pytest
import torch
import torch.nn.functional as F

import torch_fused_ops
from fused_testing import (CHANNELS_LAST, DEVICES, HALF_DTYPES, POOL_CONFIGS, assert_bitwise_equal, make_input,
                           make_multiplier, op_args)

OPS = torch.ops.fused
HALF = [pytest.param(t, id=str(t).removeprefix("torch.")) for t in HALF_DTYPES]
CONFIGS = [pytest.param(POOL_CONFIGS[k], id=k) for k in ("k2", "k3s2p1", "mixed", "k2s1")]
SHAPE = (2, 5, 6, 7, 9)


def eager(x, m, cfg, s1=0.2, s2=None, bias=None):
    """The chain as eager PyTorch runs it on these dtypes (x * m promotes to float32)."""
    if bias is not None:
        # post_pool_bias adds the bias in float32 before the first LeakyReLU, whose result is rounded to x's dtype.
        y = F.leaky_relu(x.float() + bias.float().view(1, -1, 1, 1, 1), s1).to(x.dtype)
    else:
        y = F.leaky_relu(x, s1)
    return F.max_pool3d(F.leaky_relu(y * m, s1 if s2 is None else s2), **cfg)


def _with_specials(x):
    """NaN, +-inf and exact ties (a repeated value) at fixed positions."""
    x = x.clone()
    flat = x.view(-1) if x.is_contiguous() else None
    if flat is None:
        return x
    flat[3] = float("nan")
    flat[17] = float("inf")
    flat[40] = float("-inf")
    flat[60:64] = flat[59]
    return x


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "transposed"])
# Positive slopes take the kernels' monotone shortcut (inference), a negative one the full scan.
@pytest.mark.parametrize("s2", [-0.7, 0.1])
def test_forward_matches_eager_bit_for_bit(device, dtype, cfg, layout, s2):
    x = make_input(SHAPE, dtype, device, layout, seed=3)
    if layout == "contiguous":
        x = _with_specials(x)
    m = make_multiplier("C111", SHAPE[1], torch.float32, device)
    want = eager(x, m, cfg, 0.2, s2)
    out = torch_fused_ops.post_pool(x, m, 0.2, negative_slope2=s2, **cfg)
    assert out.dtype == torch.float32
    assert_bitwise_equal(out, want)
    if layout == "channels_last":
        assert out.is_contiguous(memory_format=CHANNELS_LAST)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("cfg", CONFIGS)
def test_training_form_saves_input_dtype(device, dtype, cfg):
    x = make_input(SHAPE, dtype, device, "contiguous", seed=4, values="ties") / 4
    m = make_multiplier("1C111", SHAPE[1], torch.float32, device)
    out, selected, offsets = OPS.post_pool_with_offsets(x, m, 0.3, *op_args(cfg), None)
    assert (out.dtype, selected.dtype) == (torch.float32, dtype)
    assert_bitwise_equal(out, eager(x, m, cfg, 0.3))
    # The saved input value gives the output again through the eager chain at that one element.
    again = F.leaky_relu(F.leaky_relu(selected, 0.3) * m, 0.3)
    finite = out.isfinite() & (out != float("-inf"))
    assert torch.equal(again[finite], out[finite])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_gradients_match_eager(device, dtype, cfg, layout):
    x = make_input(SHAPE, dtype, device, layout, seed=5)
    m = make_multiplier("C111", SHAPE[1], torch.float32, device)
    g = torch.Generator().manual_seed(9)
    out_shape = eager(x, m, cfg).shape
    grad_out = torch.randn(out_shape, generator=g).to(device)

    xe, me = x.detach().requires_grad_(), m.detach().requires_grad_()
    eager(xe, me, cfg, 0.2, 0.1).backward(grad_out)
    xo, mo = x.detach().requires_grad_(), m.detach().requires_grad_()
    out = torch_fused_ops.post_pool(xo, mo, 0.2, negative_slope2=0.1, **cfg)
    out.backward(grad_out)
    assert xo.grad.dtype == dtype and mo.grad.dtype == torch.float32
    # The input's gradient follows eager's order of operations (the product's gradient rounded to the input's
    # dtype before the first LeakyReLU's backward); the multiplier's is a float32 sum in another order.
    assert_bitwise_equal(xo.grad, xe.grad)
    scale = float(grad_out.abs().sum()) * float(x.float().abs().max()) / SHAPE[1]
    torch.testing.assert_close(mo.grad, me.grad, rtol=1e-4, atol=1e-6 * max(1.0, scale))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF)
def test_bias_form(device, dtype):
    cfg = dict(kernel_size=2)
    x = make_input(SHAPE, dtype, device, "contiguous", seed=6)
    m = make_multiplier("C111", SHAPE[1], torch.float32, device)
    b = (torch.randn(SHAPE[1], generator=torch.Generator().manual_seed(2)) * 0.5).to(dtype=dtype, device=device)
    out = OPS.post_pool_bias(x, b, m, 0.2, [2, 2, 2])
    assert_bitwise_equal(out, eager(x, m, cfg, bias=b))
    out2, selected, _ = OPS.post_pool_bias_with_offsets(x, b, m, 0.2, [2, 2, 2])
    assert_bitwise_equal(out2, out)
    assert selected.dtype == dtype


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[1]])  # exact tiling, overlapping windows
def test_bias_form_gradients(device, dtype, cfg):
    # With overlapping windows an element several outputs selected gets the bias gradient of its summed gradient
    # (the rounding of grad * multiplier is per element in eager), which the kernels give to its first selector.
    x = make_input(SHAPE, dtype, device, "contiguous", seed=8)
    m = make_multiplier("C111", SHAPE[1], torch.float32, device)
    b = (torch.randn(SHAPE[1], generator=torch.Generator().manual_seed(4)) * 0.5).to(dtype=dtype, device=device)
    g = torch.randn(eager(x, m, cfg, bias=b).shape, generator=torch.Generator().manual_seed(5)).to(device)
    leaves_e = [t.detach().requires_grad_() for t in (x, b, m)]
    eager(leaves_e[0], leaves_e[2], cfg, bias=leaves_e[1]).backward(g)
    leaves = [t.detach().requires_grad_() for t in (x, b, m)]
    OPS.post_pool_bias(leaves[0], leaves[1], leaves[2], 0.2, *op_args(cfg), None).backward(g)
    assert_bitwise_equal(leaves[0].grad, leaves_e[0].grad)
    # The bias gradient is a float sum rounded to the input's dtype: on CPU in eager's order (bit-equal), on CUDA
    # in another (one rounding apart at most).
    if device == "cpu":
        assert_bitwise_equal(leaves[1].grad, leaves_e[1].grad)
    else:
        torch.testing.assert_close(leaves[1].grad, leaves_e[1].grad, rtol=torch.finfo(dtype).eps, atol=1e-6)
    torch.testing.assert_close(leaves[2].grad, leaves_e[2].grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch(device):
    x = torch.randn(0, 3, 4, 4, 4, dtype=torch.bfloat16, device=device)
    m = torch.randn(3, 1, 1, 1, device=device)
    out = torch_fused_ops.post_pool(x, m, 0.2)
    assert out.shape == (0, 3, 2, 2, 2) and out.dtype == torch.float32


@pytest.mark.parametrize("device", DEVICES)
def test_other_promotions_raise(device):
    x = torch.randn(1, 2, 4, 4, 4, device=device)
    with pytest.raises(TypeError, match="multiplier dtype must equal input dtype"):
        torch_fused_ops.post_pool(x.bfloat16(), torch.randn(2, 1, 1, 1, dtype=torch.float64, device=device), 0.2)
    with pytest.raises(TypeError, match="multiplier dtype must equal input dtype"):
        torch_fused_ops.post_pool(x, torch.randn(2, 1, 1, 1, device=device).bfloat16(), 0.2)
    xb, m = x.bfloat16(), torch.randn(2, 1, 1, 1, device=device)
    out, selected, offsets = OPS.post_pool_with_offsets(xb, m, 0.2, [2, 2, 2])
    with pytest.raises(TypeError, match="grad_output must be"):
        OPS.post_pool_backward(out.bfloat16(), selected, offsets, m, 0.2, None, list(x.shape), [2, 2, 2], [2, 2, 2],
                               [0, 0, 0], [1, 1, 1], False)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF)
def test_opcheck(device, dtype):
    x = make_input((2, 3, 5, 6, 4), dtype, device, "contiguous", seed=7).requires_grad_()
    m = make_multiplier("C111", 3, torch.float32, device).requires_grad_()
    for op, args in ((OPS.post_pool.default, (x, m, 0.2, [2, 2, 2])),
                     (OPS.post_pool_with_offsets.default, (x, m, 0.2, [3, 3, 3], [2, 2, 2], [1, 1, 1]))):
        result = torch.library.opcheck(op, args)
        assert all(v == "SUCCESS" for v in result.values()), result
    out, selected, offsets = OPS.post_pool_with_offsets(x.detach(), m.detach(), 0.2, [2, 2, 2])
    result = torch.library.opcheck(OPS.post_pool_backward.default,
                                   (torch.randn_like(out), selected, offsets, m.detach(), 0.2, None, list(x.shape),
                                    [2, 2, 2], [2, 2, 2], [0, 0, 0], [1, 1, 1], False))
    assert all(v == "SUCCESS" for v in result.values()), result
