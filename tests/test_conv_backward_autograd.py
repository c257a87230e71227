"""fused.conv_transpose3d_post_pool's autograd end to end (the public wrapper): gradients against eager float64,
gradcheck, which gradients are computed, double backward. On CUDA (float32/bf16/fp16, the fused geometry) the
backward runs the ops at pooled resolution; on CPU aten's convolution backward."""
import pytest
import torch

from conv_backward_testing import chain, make
from fused_testing import HAS_CUDA
from torch_fused_ops import conv_transpose3d_post_pool

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU"))]


def _call(x, w, b, m, s1=0.2, s2=0.3, op=1):
    return conv_transpose3d_post_pool(x, w, b, m, s1, 2, 1, op, negative_slope2=s2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last_3d], ids=["contig", "cl"])
@pytest.mark.parametrize("op", [1, 0, (0, 1, 1)], ids=str)
def test_gradients_match_eager_float64(device, fmt, op):
    x, w, b, m = make(2, 3, 5, (3, 4, 3), device=device, fmt=fmt)
    leaves = [t.requires_grad_() for t in (x, w, b, m)]
    out = _call(*leaves, op=op)
    ref = chain(*leaves, 0.2, 0.3, op)
    g = torch.randn_like(ref)
    for name, a, e in zip(("input", "weight", "bias", "multiplier"), torch.autograd.grad(out, leaves, g),
                          torch.autograd.grad(ref, leaves, g)):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-10, msg=lambda s: f"grad {name}: {s}")


def test_gradcheck_float64_cpu():
    x, w, b, m = make(1, 2, 2, (2, 2, 2), seed=3)
    leaves = [t.requires_grad_() for t in (x, w, b, m)]
    assert torch.autograd.gradcheck(lambda *a: _call(*a), leaves, eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("wanted", ["input", "weight", "multiplier", "bias", "no_bias"])
def test_needs_input_grad_combinations(device, wanted):
    dtype = torch.float32 if device == "cuda" else torch.float64
    x, w, b, m = make(2, 3, 4, (2, 3, 3), dtype=dtype, device=device, bias=wanted != "no_bias")
    tensors = dict(input=x, weight=w, bias=b, multiplier=m)
    want = ["input", "weight", "multiplier"] if wanted == "no_bias" else [wanted]
    for k in want:
        tensors[k].requires_grad_()
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        out = _call(tensors["input"], tensors["weight"], tensors["bias"], tensors["multiplier"])
        ref = chain(*(tensors[k] for k in ("input", "weight", "bias", "multiplier")), 0.2, 0.3, 1)
        g = torch.randn_like(ref)
        got = torch.autograd.grad(out, [tensors[k] for k in want], g)
        exp = torch.autograd.grad(ref, [tensors[k] for k in want], g)
    tol = dict(rtol=1e-10, atol=1e-10) if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-4)
    for a, e in zip(got, exp):
        torch.testing.assert_close(a, e, **tol)
    # Unwanted leaves get no gradient.
    out = _call(tensors["input"], tensors["weight"], tensors["bias"], tensors["multiplier"])
    out.backward(g)
    for k, t in tensors.items():
        if t is not None and k not in want:
            assert t.grad is None


@pytest.mark.parametrize("device", DEVICES)
def test_double_backward_raises(device):
    dtype = torch.float32 if device == "cuda" else torch.float64
    x, w, b, m = make(dtype=dtype, device=device)
    leaves = [t.requires_grad_() for t in (x, w, b, m)]
    out = _call(*leaves)
    grads = torch.autograd.grad(out.sum(), leaves, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        torch.autograd.grad(sum(gr.sum() for gr in grads), leaves)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch_gradients(device):
    dtype = torch.float32 if device == "cuda" else torch.float64
    x, w, b, m = make(0, 3, 4, (2, 3, 3), dtype=dtype, device=device)
    leaves = [t.requires_grad_() for t in (x, w, b, m)]
    out = _call(*leaves)
    grads = torch.autograd.grad(out.sum(), leaves)
    assert [tuple(gr.shape) for gr in grads] == [tuple(t.shape) for t in leaves]
    assert all(bool((gr == 0).all()) for gr in grads)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU")
@pytest.mark.parametrize("dtype,tf32", [(torch.float32, False), (torch.float32, True), (torch.bfloat16, True),
                                        (torch.float16, True)], ids=["strict", "tf32", "bf16", "fp16"])
@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last_3d], ids=["contig", "cl"])
def test_cuda_training_close_to_float64(dtype, tf32, fmt):
    # The fused forward and the pooled-resolution backward against float64, no further than eager autograd of the
    # chain in the same dtype (cuDNN), within 1.5x plus a floor. Near-tied windows may select differently in
    # either, so the comparison is by relative L2 norm.
    # The float64 reference takes the same (rounded) inputs as the op: otherwise a conv value within the inputs'
    # rounding of zero changes sign between the two, and with it the leaky slopes' derivative of that window
    # (seen in float16: one window moved a channel's bias gradient by 0.8), which measures the rounding of the
    # inputs rather than the kernels.
    x, w, b, m = make(2, 16, 32, (4, 6, 5), device="cuda", fmt=fmt)
    leaves = [t.detach().to(dtype).requires_grad_() for t in (x, w, b, m)]
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    ref64 = chain(*leaves64, 0.2, 0.2, 1)
    g = torch.randn_like(ref64).to(dtype).double()
    want = torch.autograd.grad(ref64, leaves64, g)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=tf32):
        got = torch.autograd.grad(_call(*leaves, s2=0.2), leaves, g.to(dtype))
        eager = torch.autograd.grad(chain(*leaves, 0.2, 0.2, 1), leaves, g.to(dtype))
    floor = {torch.float32: 1e-5, torch.bfloat16: 2e-3, torch.float16: 5e-4}[dtype]
    for name, a, e, r in zip(("input", "weight", "bias", "multiplier"), got, eager, want):
        err = ((a.double() - r).norm() / r.norm()).item()
        base = ((e.double() - r).norm() / r.norm()).item()
        assert err <= 1.5 * base + floor, f"grad {name}: {err:.3e} vs eager {base:.3e}"
