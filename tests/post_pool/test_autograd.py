"""Gradients of torch_fused_ops.post_pool against eager autograd of the composite,
gradcheck, requires_grad plumbing and what the forward keeps alive for backward."""

import zlib

import pytest
import torch

import torch_fused_ops  # noqa: F401  (import failure must be loud, not a skip)
from fused_testing import (
    CHANNELS_LAST,
    DEFAULT_SHAPE,
    DEVICES,
    GRAD_TOL_LOW,
    HALF_DTYPES,
    NONOVERLAP,
    POOL_CONFIGS,
    assert_bitwise_equal,
    composite,
    eager_grads,
    grad_multiplier_tol,
    make_input,
    make_multiplier,
    grad_output_for,
    op_grads,
    op_args,
    resolved_pool,
    tie_free_input,
)

GRAD_POOLS = ["k2s2", "k231s231", "k2s2ceil", "k3s1p1", "k3s2p1", "k3s1p1d2", "k3s2p1ceil", "mixed"]


def check_grads(x, m, cfg, name, slope=0.2, slope2=None, seed=0):
    g = grad_output_for(x, m, cfg, seed)
    _, gx_e, gm_e = eager_grads(x, m, g, cfg, slope, slope2)
    _, gx, gm = op_grads(x, m, g, cfg, slope, slope2)
    assert gx.shape == x.shape and gx.dtype == x.dtype
    assert gm.shape == m.shape and gm.dtype == m.dtype
    if name in NONOVERLAP:
        # Each input element receives at most one output's gradient, so there
        # is no summation order to differ in.
        assert_bitwise_equal(gx, gx_e, f"grad_input ({name})")
    elif x.dtype == torch.float32:
        torch.testing.assert_close(gx, gx_e, rtol=1e-5, atol=1e-6)
    else:
        torch.testing.assert_close(gx, gx_e, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(gm, gm_e, **grad_multiplier_tol(x, g, x.dtype))


@pytest.mark.parametrize("cfg_name", GRAD_POOLS)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_grads_match_eager(device, dtype, layout, cfg_name):
    x = make_input(DEFAULT_SHAPE, dtype, device, layout, seed=31)
    m = make_multiplier("C111", DEFAULT_SHAPE[1], dtype, device)
    check_grads(x, m, POOL_CONFIGS[cfg_name], cfg_name, seed=1)


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("device", DEVICES)
def test_grads_fast_path_medium(device, layout):
    x = make_input((2, 16, 8, 16, 16), torch.float32, device, layout, seed=32)
    m = make_multiplier("1C111", 16, torch.float32, device)
    check_grads(x, m, POOL_CONFIGS["k2s2"], "k2s2", slope=0.01, seed=2)


@pytest.mark.parametrize("mkind", ["0d", "0d_negative", "1", "C111", "1C111", "C111_strided"])
@pytest.mark.parametrize("cfg_name", ["k2s2", "k3s2p1"])
@pytest.mark.parametrize("device", DEVICES)
def test_grads_multiplier_shapes(device, cfg_name, mkind):
    x = make_input(DEFAULT_SHAPE, torch.float32, device, seed=33)
    m = make_multiplier(mkind, DEFAULT_SHAPE[1], torch.float32, device)
    check_grads(x, m, POOL_CONFIGS[cfg_name], cfg_name, slope=0.1, slope2=-0.4, seed=3)


@pytest.mark.parametrize("slopes", [(0.2, None), (-0.3, 1.5), (0.0, 0.5), (1.0, None)], ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_grads_slopes(device, slopes):
    x = make_input(DEFAULT_SHAPE, torch.float32, device, seed=34)
    m = make_multiplier("C111", DEFAULT_SHAPE[1], torch.float32, device)
    check_grads(x, m, POOL_CONFIGS["k3s2p1"], "k3s2p1", *slopes, seed=4)


@pytest.mark.parametrize("layout", ["strided", "transposed", "permuted", "expanded"])
@pytest.mark.parametrize("device", DEVICES)
def test_grads_noncontiguous_input(device, layout):
    x = make_input(DEFAULT_SHAPE, torch.float32, device, layout, seed=35)
    assert x._base is not None and x.storage_offset() >= 0
    m = make_multiplier("C111", DEFAULT_SHAPE[1], torch.float32, device)
    cfg = POOL_CONFIGS["k3s2p1"]
    g = grad_output_for(x, m, cfg, 5)
    # Gradients must flow back to the viewed base tensor as users see them
    # (for the expanded view, summed over the broadcast batch).
    leaf_e = x._base.detach().clone().requires_grad_()
    leaf_o = x._base.detach().clone().requires_grad_()
    view_e = leaf_e.as_strided(x.size(), x.stride(), x.storage_offset())
    view_o = leaf_o.as_strided(x.size(), x.stride(), x.storage_offset())
    assert view_o.stride() == x.stride()
    composite(view_e, m, 0.2, **cfg).backward(g)
    torch_fused_ops.post_pool(view_o, m, 0.2, **cfg).backward(g)
    torch.testing.assert_close(leaf_o.grad, leaf_e.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cfg_name", ["k2s2", "k3s1p1", "k3s2p1ceil", "k3s1p1d2"])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("device", DEVICES)
def test_grads_with_ties(device, layout, cfg_name):
    # Integer inputs make many windows tie (and hit exactly 0, where the
    # LeakyReLU derivative is the slope); gradients must go where eager sends them.
    x = make_input(DEFAULT_SHAPE, torch.float32, device, layout, seed=36, values="ties")
    m = make_multiplier("C111", DEFAULT_SHAPE[1], torch.float32, device)
    check_grads(x, m, POOL_CONFIGS[cfg_name], cfg_name, seed=6)


@pytest.mark.parametrize("cfg_name", ["k2s2", "k3s2p1", "mixed"])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_grads_low_precision(device, dtype, layout, cfg_name):
    # Eager in half precision may break ties differently (it rounds before the
    # max), so compare against float64 autograd on the same (exact) values.
    cfg = POOL_CONFIGS[cfg_name]
    x = make_input(DEFAULT_SHAPE, dtype, device, layout, seed=37)
    m = make_multiplier("C111", DEFAULT_SHAPE[1], dtype, device)
    g = grad_output_for(x, m, cfg, 7)
    _, gx_ref, gm_ref = eager_grads(x.double(), m.double(), g.double(), cfg)
    _, gx, gm = op_grads(x, m, g, cfg)
    assert gx.dtype == dtype and gm.dtype == dtype and gm.shape == m.shape
    torch.testing.assert_close(gx.double(), gx_ref, **GRAD_TOL_LOW[dtype])
    # A sum over ~100 terms per channel.
    tol = GRAD_TOL_LOW[dtype]
    torch.testing.assert_close(gm.double(), gm_ref, rtol=tol["rtol"], atol=tol["atol"] * 10)


GRADCHECK_CASES = [
    pytest.param("k2s2", (0.2, None), "0d", id="k2s2-0d"),
    pytest.param("k3s2p1", (0.2, None), "C111", id="k3s2p1-C111"),
    pytest.param("k3s2p1", (-0.3, 1.5), "1C111", id="k3s2p1-neg-1C111"),
    pytest.param("k231s123", (0.01, 0.3), "C111", id="k231s123-C111"),
    pytest.param("k3s1p1d2", (1.5, None), "0d_negative", id="k3s1p1d2-0dneg"),
    pytest.param("mixed", (0.05, -0.5), "C111", id="mixed-C111"),
]


@pytest.mark.parametrize("cfg_name,slopes,mkind", GRADCHECK_CASES)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck(device, layout, cfg_name, slopes, mkind):
    cfg = POOL_CONFIGS[cfg_name]
    shape = (1, 2, 4, 5, 6)
    m = make_multiplier(mkind, shape[1], torch.float64, device)
    x = tie_free_input(shape, slopes, m, seed=zlib.crc32(f"{cfg_name}{mkind}".encode()) % 1000).to(device)
    if layout == "channels_last":
        x = x.contiguous(memory_format=CHANNELS_LAST)
    x.requires_grad_()
    m.requires_grad_()
    s1, s2 = slopes

    def f(x_, m_):
        return torch_fused_ops.post_pool(x_, m_, s1, negative_slope2=s2, **cfg)

    assert torch.autograd.gradcheck(f, (x, m), eps=1e-6, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_only_multiplier_requires_grad(device):
    cfg = POOL_CONFIGS["k3s2p1"]
    x = make_input(DEFAULT_SHAPE, torch.float32, device, seed=38)
    m = make_multiplier("C111", DEFAULT_SHAPE[1], torch.float32, device)
    g = grad_output_for(x, m, cfg, 8)
    _, _, gm_e = eager_grads(x, m, g, cfg, need_x=False)
    xo = x.detach()
    mo = m.detach().requires_grad_()
    out = torch_fused_ops.post_pool(xo, mo, 0.2, **cfg)
    assert out.requires_grad
    out.backward(g)
    assert xo.grad is None
    torch.testing.assert_close(mo.grad, gm_e, **grad_multiplier_tol(x, g, torch.float32))


@pytest.mark.parametrize("device", DEVICES)
def test_only_input_requires_grad(device):
    cfg = POOL_CONFIGS["k3s2p1"]
    x = make_input(DEFAULT_SHAPE, torch.float32, device, seed=39)
    m = make_multiplier("C111", DEFAULT_SHAPE[1], torch.float32, device)
    g = grad_output_for(x, m, cfg, 9)
    _, gx_e, _ = eager_grads(x, m, g, cfg, need_m=False)
    xo = x.detach().requires_grad_()
    mo = m.detach()
    out = torch_fused_ops.post_pool(xo, mo, 0.2, **cfg)
    out.backward(g)
    assert mo.grad is None
    torch.testing.assert_close(xo.grad, gx_e, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_no_grad_and_inference_mode(device):
    x = make_input(DEFAULT_SHAPE, torch.float32, device, seed=40).requires_grad_()
    m = make_multiplier("C111", DEFAULT_SHAPE[1], torch.float32, device).requires_grad_()
    with torch.no_grad():
        out = torch_fused_ops.post_pool(x, m, 0.2, 2)
    assert not out.requires_grad and out.grad_fn is None
    with torch.inference_mode():
        out2 = torch_fused_ops.post_pool(x, m, 0.2, 2)
    assert not out2.requires_grad
    expected = composite(x.detach(), m.detach(), 0.2, 2)
    assert_bitwise_equal(out, expected)
    assert_bitwise_equal(out2, expected)
    # Inputs that do not require grad give an output that does not either.
    out3 = torch_fused_ops.post_pool(x.detach(), m.detach(), 0.2, 2)
    assert not out3.requires_grad


@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch_backward(device):
    x = torch.empty((0, 3, 5, 7, 9), device=device, requires_grad=True)
    m = make_multiplier("C111", 3, torch.float32, device).requires_grad_()
    out = torch_fused_ops.post_pool(x, m, 0.2, 3, 2, 1)
    out.sum().backward()
    assert x.grad.shape == x.shape
    assert m.grad.shape == m.shape
    assert torch.equal(m.grad, torch.zeros_like(m))


def _saved_tensor_shapes_via_hooks(fn):
    shapes = []

    def pack(t):
        shapes.append((tuple(t.shape), t.numel(), t.dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, shapes


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("cfg_name", ["k2s2", "k3s2p1"])
@pytest.mark.parametrize("device", DEVICES)
def test_training_forward_saves_only_pooled_tensors(device, cfg_name, layout):
    # The point of the fused op is not to keep the full-resolution activation
    # alive for backward: only pooled-size tensors (and the multiplier) may be saved.
    cfg = POOL_CONFIGS[cfg_name]
    x = make_input((2, 3, 8, 10, 12), torch.float32, device, layout, seed=41).requires_grad_()
    m = make_multiplier("C111", 3, torch.float32, device).requires_grad_()
    out, saved = _saved_tensor_shapes_via_hooks(lambda: torch_fused_ops.post_pool(x, m, 0.2, **cfg))
    assert saved, "no saved tensors were seen by saved_tensors_hooks (backward state kept outside autograd?)"
    assert out.numel() < x.numel()
    for shape, numel, dtype in saved:
        assert numel <= max(out.numel(), m.numel()), (
            f"forward saved a tensor of shape {shape} ({dtype}); input is {tuple(x.shape)}, output {tuple(out.shape)}")
    assert any(shape == tuple(out.shape) for shape, _, _ in saved)

    # Also inspect the graph directly: nothing reachable from out.grad_fn within
    # a couple of hops may hold an input-sized tensor.
    seen, frontier, found = set(), [out.grad_fn], []
    for _ in range(3):
        nxt = []
        for node in frontier:
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            for name in dir(node):
                if name.startswith("_saved_"):
                    val = getattr(node, name)
                    vals = val if isinstance(val, (tuple, list)) else [val]
                    found += [v for v in vals if isinstance(v, torch.Tensor)]
            if hasattr(node, "saved_tensors"):
                try:
                    found += [t for t in node.saved_tensors if isinstance(t, torch.Tensor)]
                except RuntimeError:
                    pass  # only raised once the buffers were freed, which cannot have happened yet
            nxt += [f for f, _ in node.next_functions]
        frontier = nxt
    for t in found:
        assert t.numel() != x.numel(), f"graph holds a full-resolution tensor of shape {tuple(t.shape)}"

    out.backward(torch.ones_like(out))
    assert x.grad is not None and m.grad is not None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available (torch.cuda.is_available() is False)")
def test_training_forward_memory_cuda():
    # Allocator-level check: a training forward may only allocate pooled-size buffers.
    x = make_input((2, 16, 16, 32, 32), torch.float32, "cuda", seed=42).requires_grad_()
    m = make_multiplier("C111", 16, torch.float32, "cuda").requires_grad_()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    out = torch_fused_ops.post_pool(x, m, 0.2, 2)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - before
    assert held < x.numel() * x.element_size() // 2, (
        f"training forward keeps {held} bytes alive; input is {x.numel() * x.element_size()} bytes, "
        f"output {out.numel() * out.element_size()} bytes")


@pytest.mark.parametrize("cfg_name", ["k2s2", "k3s2p1", "mixed"])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_backward_op_direct(device, dtype, layout, cfg_name):
    cfg = POOL_CONFIGS[cfg_name]
    x = make_input(DEFAULT_SHAPE, dtype, device, layout, seed=43)
    m = make_multiplier("C111", DEFAULT_SHAPE[1], dtype, device)
    k, s_arg, p, d, ceil = op_args(cfg)
    _, s, _, _, _ = resolved_pool(**cfg)
    out, selected, offsets = torch.ops.fused.post_pool_with_offsets(x, m, 0.2, k, s_arg, p, d, ceil, 0.6)
    g = grad_output_for(x, m, cfg, 10)
    channels_last = layout == "channels_last"
    gx, gm = torch.ops.fused.post_pool_backward(
        g, selected, offsets, m, 0.2, 0.6, list(x.shape), k, list(s), p, d, channels_last)
    assert gx.shape == x.shape and gx.dtype == dtype
    assert gm.shape == m.shape and gm.dtype == dtype
    if channels_last:
        assert gx.is_contiguous(memory_format=CHANNELS_LAST)
    else:
        assert gx.is_contiguous()
    if dtype == torch.float32:
        _, gx_e, gm_e = eager_grads(x, m, g, cfg, 0.2, 0.6)
        torch.testing.assert_close(gx, gx_e, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(gm, gm_e, **grad_multiplier_tol(x, g, dtype))
    else:
        _, gx_e, gm_e = eager_grads(x.double(), m.double(), g.double(), cfg, 0.2, 0.6)
        torch.testing.assert_close(gx.double(), gx_e, **GRAD_TOL_LOW[dtype])
        tol = GRAD_TOL_LOW[dtype]
        torch.testing.assert_close(gm.double(), gm_e, rtol=tol["rtol"], atol=tol["atol"] * 10)


@pytest.mark.parametrize("cfg_name", ["k2s2", "k3s2p1", "mixed"])
@pytest.mark.parametrize("device", DEVICES)
def test_raw_op_autograd(device, cfg_name):
    # torch.compile and other libraries call torch.ops.fused.post_pool directly,
    # not the Python wrapper, so the op itself must be differentiable.
    cfg = POOL_CONFIGS[cfg_name]
    x = make_input(DEFAULT_SHAPE, torch.float32, device, "channels_last", seed=44)
    m = make_multiplier("1C111", DEFAULT_SHAPE[1], torch.float32, device)
    g = grad_output_for(x, m, cfg, 11)
    _, gx_e, gm_e = eager_grads(x, m, g, cfg, 0.2, 0.6)
    xo, mo = x.detach().requires_grad_(), m.detach().requires_grad_()
    k, s, p, d, ceil = op_args(cfg)
    out = torch.ops.fused.post_pool(xo, mo, 0.2, k, s, p, d, ceil, 0.6)
    assert out.requires_grad
    out.backward(g)
    torch.testing.assert_close(xo.grad, gx_e, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(mo.grad, gm_e, **grad_multiplier_tol(x, g, torch.float32))


def test_multiplier_grad_ignores_unselected_nonfinite_inputs():
    # Documented difference from eager: eager's multiplier gradient turns NaN when an element no window
    # selected is inf (0 * inf in the product rule); ours depends on selected elements only.
    torch.manual_seed(0)
    x = torch.randn(1, 2, 5, 4, 4)  # D=5: the last plane lies outside every 2x2x2 window
    m = torch.randn(2, 1, 1, 1)
    grads = []
    for fill in (0.5, float("inf"), float("nan")):
        xi = x.clone()
        xi[0, 0, 4, 0, 0] = fill
        xi.requires_grad_()
        mi = m.clone().requires_grad_()
        out = torch_fused_ops.post_pool(xi, mi, 0.2, 2)
        gx, gm = torch.autograd.grad(out, (xi, mi), torch.ones_like(out))
        assert torch.isfinite(gm).all() and torch.isfinite(gx).all()
        grads.append((gx, gm))
    for gx, gm in grads[1:]:
        torch.testing.assert_close(gm, grads[0][1], rtol=0, atol=0)
        torch.testing.assert_close(gx, grads[0][0], rtol=0, atol=0)


# Shapes that take each branch of the CUDA backward fast path: contiguous with a pooled plane that is a multiple
# of 256 packs (per-block partials: 1x4x8x32x64), of 32 packs (per-warp) or neither; channels_last with
# 256 % (C / VEC) == 0 (per-block partials) or not (C = 12), with whole blocks and with a last block part-filled
# (3x16x6x10x14: several blocks and a tail at any packs-per-thread setting); an odd width that leaves the fast
# path; and a pooled row of 101 outputs, which the CPU kernel takes in chunks of 64. All against eager autograd.
BACKWARD_PATH_SHAPES = [(2, 8, 8, 16, 16), (2, 6, 4, 6, 12), (1, 12, 4, 6, 8), (2, 32, 4, 4, 8), (1, 4, 4, 6, 10),
                        (3, 16, 6, 10, 14), (1, 4, 2, 4, 202), (1, 4, 8, 32, 64)]


@pytest.mark.parametrize("shape", BACKWARD_PATH_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("device", DEVICES)
def test_grads_2x2x2_backward_paths(device, layout, dtype, shape):
    x = make_input(shape, dtype, device, layout, seed=51)
    m = make_multiplier("C111", shape[1], dtype, device)
    cfg = POOL_CONFIGS["k2s2"]
    g = grad_output_for(x, m, cfg, seed=5)
    _, gx, gm = op_grads(x, m, g, cfg)
    if dtype == torch.float32:
        _, gx_e, gm_e = eager_grads(x, m, g, cfg, 0.2, None)
        assert_bitwise_equal(gx, gx_e, "grad_input")  # one output per input element: nothing to reorder
        torch.testing.assert_close(gm, gm_e, **grad_multiplier_tol(x, g, dtype))
    else:
        # As test_grads_low_precision: eager bf16 rounds before the max and may pick another tap, so the
        # reference is float64 autograd on the same values.
        _, gx_e, gm_e = eager_grads(x.double(), m.double(), g.double(), cfg)
        tol = GRAD_TOL_LOW[dtype]
        torch.testing.assert_close(gx.double(), gx_e, **tol)
        torch.testing.assert_close(gm.double(), gm_e, rtol=tol["rtol"], atol=tol["atol"] * 10)


@pytest.mark.parametrize("with_bias", [False, True])
def test_double_backward_raises(with_bias):
    # Second derivatives are not implemented: building a graph through the backward and differentiating it
    # again must raise, not return zeros.
    torch.manual_seed(0)
    x = torch.randn(1, 2, 4, 4, 4, dtype=torch.float64, requires_grad=True)
    m = torch.randn(2, 1, 1, 1, dtype=torch.float64, requires_grad=True)
    if with_bias:
        b = torch.randn(2, dtype=torch.float64, requires_grad=True)
        out = torch.ops.fused.post_pool_bias(x, b, m, 0.2, [2, 2, 2])
    else:
        out = torch_fused_ops.post_pool(x, m, 0.2, 2)
    gx, = torch.autograd.grad(out.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        gx.sum().backward()
