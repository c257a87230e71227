"""A batch of 0 through fused.conv_transpose3d_post_pool, its training form and the public wrapper: output
shapes, strides and dtypes as eager's, and eager's gradients (an empty input gradient, zeros for weight, bias and
multiplier)."""
import pytest
import torch

from conv_backward_testing import make, wrapper_call
from conv_testing import (CASES, CONFIGS, DEVICES, OPS, config_args, call_case, kb_args, kb_call, make_case,
                          make_random, make_tensors, reference_case, reference_config)
from torch_fused_ops import conv_transpose3d_post_pool


@pytest.mark.usefixtures("strict_float32")
@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch_outputs_and_gradients(device):
    x, w, b, m = make_random(0, 4, 6, (3, 3, 3), torch.float32, device)
    want = (0, 6, 3, 3, 3)
    out = kb_call(x, w, b, m, 0.2, 0.2)
    res = kb_call(x, w, b, m, 0.2, 0.2, offsets=True)
    for t in (out, *res):
        assert tuple(t.shape) == want and t.device == x.device
    assert res[2].dtype == torch.uint8 and res[1].dtype == torch.float32
    # Gradients as eager's: an empty input gradient, zeros for weight, bias and multiplier.
    leaves = [t.clone().requires_grad_() for t in (x, w, b, m)]
    grads = torch.autograd.grad(OPS.conv_transpose3d_post_pool(*kb_args(*leaves, 0.2, 0.2)).sum(), leaves)
    for g, leaf in zip(grads, leaves):
        assert g.shape == leaf.shape and not g.any()


@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch_shape(device):
    case = CASES["kb"]
    x, w, b, m = make_case(case, torch.float32, device, shape=(0, 3, 4, 5))
    out = call_case(x, w, b, m, 0.2, 0.2, case)
    assert out.shape == reference_case(x, w, b, m, 0.2, 0.2, case).shape and out.numel() == 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("requires_grad", [False, True])
def test_empty_batch_matches_eager(device, requires_grad):
    x, w, b, m = make_tensors(torch.float32, device, n=0)
    leaves = [t.requires_grad_(requires_grad) for t in (x, w, b, m)]
    out = conv_transpose3d_post_pool(*leaves[:3], leaves[3], 0.2, 2, 1, 1)
    ref = reference_config(*leaves, CONFIGS["kb"])
    assert (out.shape, out.stride()) == (ref.shape, ref.stride())
    outs = OPS.conv_transpose3d_post_pool_with_offsets(*config_args(x, w, b, m, CONFIGS["kb"]))
    assert [o.shape for o in outs] == [ref.shape] * 3 and outs[2].dtype == torch.uint8
    if requires_grad:
        got = torch.autograd.grad(out.sum(), leaves)
        want = torch.autograd.grad(ref.sum(), leaves)
        for a, e in zip(got, want):
            torch.testing.assert_close(a, e)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch_gradients(device):
    dtype = torch.float32 if device == "cuda" else torch.float64
    x, w, b, m = make(0, 3, 4, (2, 3, 3), dtype=dtype, device=device)
    leaves = [t.requires_grad_() for t in (x, w, b, m)]
    out = wrapper_call(*leaves)
    grads = torch.autograd.grad(out.sum(), leaves)
    assert [tuple(gr.shape) for gr in grads] == [tuple(t.shape) for t in leaves]
    assert all(bool((gr == 0).all()) for gr in grads)
