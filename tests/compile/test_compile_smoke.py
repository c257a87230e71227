"""torch.compile smoke tests: the op traces with fullgraph=True (no graph break),
runs under inductor forward and backward, and with dynamic shapes.

Inductor compiles C++ on the CPU, so shapes are tiny and the number of
compilations is kept to a handful (~tens of seconds in total)."""

import pytest
import torch

import torch_fused_ops  # noqa: F401  (import failure must be loud, not a skip)
from fused_testing import assert_bitwise_equal, composite, make_input, make_multiplier

pytestmark = pytest.mark.slow

CFG = dict(kernel_size=3, stride=2, padding=1)


def fused_block(x, m):
    # Surrounding pointwise ops give inductor something to fuse around the
    # extern kernel; adding 1 and scaling by 2 are exact in float32.
    return torch_fused_ops.post_pool(x + 1.0, m, 0.2, negative_slope2=0.1, **CFG) * 2.0


def eager_block(x, m):
    return composite(x + 1.0, m, 0.2, negative_slope2=0.1, **CFG) * 2.0


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_compile_inference():
    x = make_input((1, 2, 5, 6, 7), torch.float32, "cpu", seed=71)
    m = make_multiplier("C111", 2)
    compiled = torch.compile(fused_block, fullgraph=True, backend="inductor")
    with torch.no_grad():
        out = compiled(x, m)
    assert_bitwise_equal(out, eager_block(x, m))


def test_compile_backward():
    x = make_input((1, 2, 5, 6, 7), torch.float32, "cpu", "channels_last", seed=72)
    m = make_multiplier("C111", 2)
    g = torch.randn(eager_block(x, m).shape, generator=torch.Generator().manual_seed(73))

    xe, me = x.detach().requires_grad_(), m.detach().requires_grad_()
    eager_block(xe, me).backward(g)

    xc, mc = x.detach().requires_grad_(), m.detach().requires_grad_()
    compiled = torch.compile(fused_block, fullgraph=True, backend="inductor")
    out = compiled(xc, mc)
    assert out.requires_grad
    out.backward(g)
    torch.testing.assert_close(out.detach(), eager_block(x, m), rtol=0, atol=0)
    torch.testing.assert_close(xc.grad, xe.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(mc.grad, me.grad, rtol=1e-4, atol=1e-5)


def test_compile_dynamic_shapes():
    compiled = torch.compile(fused_block, fullgraph=True, backend="inductor", dynamic=True)
    m = make_multiplier("C111", 2)
    for i, shape in enumerate([(1, 2, 5, 6, 7), (2, 2, 7, 5, 9), (1, 2, 4, 4, 4)]):
        x = make_input(shape, torch.float32, "cpu", seed=74 + i)
        with torch.no_grad():
            out = compiled(x, m)
        assert_bitwise_equal(out, eager_block(x, m), f"shape {shape}")
