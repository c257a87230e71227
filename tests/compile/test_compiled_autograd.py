"""Compiled autograd (``torch._dynamo.config.compiled_autograd``) traces the fused ops' C++ autograd nodes into its
backward graph: gradients under it equal eager autograd's, for post_pool and for the fused convolution (its
composite on CPU, its pooled-resolution backward kernels on CUDA).

What PyTorch asks of a C++ ``torch::autograd::Function`` there: no ``mark_non_differentiable`` (its node's
``compiled_args`` asserts none was used: selected and offsets leave the node's forward outside it),
``is_traceable`` to be traced rather than run behind ``torch._dynamo.disable``, and a backward that calls only ops
with fake impls.
"""
import pytest
import torch
import torch.nn.functional as F
from torch._dynamo import compiled_autograd
from torch._dynamo.utils import counters

import torch_fused_ops
from fused_testing import HAS_CUDA

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU"))]


def loss(x, w, b, m):
    y = torch_fused_ops.conv_transpose3d_post_pool(x, w, b, m, 0.2, stride=2, padding=1, output_padding=1,
                                                   kernel_size=2)
    z = torch_fused_ops.post_pool(F.conv_transpose3d(x, w, b, stride=2, padding=1, output_padding=1), m, 0.3,
                                  kernel_size=2)
    # No Python-float factor: torch 2.11's Inductor, compiling compiled autograd's backward on CUDA, passed the float
    # a `z * 1.5` saves to `.item()` (aten._local_scalar_dense on a float), which is not about our ops.
    return (y * y).sum() + (z * z).sum()


def step(x, w, b, m):
    out = loss(x, w, b, m)
    out.backward()
    return out


def leaves(device, dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 3, 4, 5, generator=g, dtype=torch.float64)
    w = torch.randn(4, 6, 3, 3, 3, generator=g, dtype=torch.float64) / 6
    b = torch.randn(6, generator=g, dtype=torch.float64)
    m = torch.randn(6, 1, 1, 1, generator=g, dtype=torch.float64)
    return [t.to(device=device, dtype=dtype).requires_grad_() for t in (x, w, b, m)]


def compiled_autograd_grads(params, eager_forward):
    """The leaves' gradients from a backward run by compiled autograd (Inductor), after an eager forward (the fused
    ops' own C++ nodes in the autograd graph) or a compiled one (AOTAutograd's node around them)."""
    torch._dynamo.reset()
    counters.clear()
    if eager_forward:
        out = loss(*params)
        enable = getattr(compiled_autograd, "_enable", None) or compiled_autograd.enable  # renamed across releases
        with enable(torch.compile(backend="inductor")):
            out.backward()
    else:
        with torch._dynamo.config.patch(compiled_autograd=True):
            torch.compile(step)(*params)
    assert counters["compiled_autograd"]["captures"] >= 1
    return [p.grad for p in params]


@pytest.mark.parametrize("eager_forward", [True, False], ids=["eager-forward", "compiled-forward"])
@pytest.mark.parametrize("device", DEVICES)
def test_compiled_autograd_matches_eager(device, eager_forward):
    # float64 on CPU (the composite; the same ops in the same order: equal), float32 on CUDA (the fused kernels).
    dtype = torch.float64 if device == "cpu" else torch.float32
    params = leaves(device, dtype)
    step(*params)
    want = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    got = compiled_autograd_grads(params, eager_forward)
    tol = dict(rtol=0, atol=0) if device == "cpu" else dict(rtol=1e-5, atol=1e-6)
    for name, g, ref in zip(("input", "weight", "bias", "multiplier"), got, want):
        torch.testing.assert_close(g, ref, **tol, msg=name)
