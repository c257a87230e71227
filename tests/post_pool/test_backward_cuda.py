"""The CUDA backward of post_pool: determinism, dependent launches back to back, CUDA-graph capture, and the
private op that takes other launch choices than the shipped constants (for the sweep)."""

import zlib

import pytest
import torch

import torch_fused_ops  # noqa: F401  (import failure must be loud, not a skip)
from fused_testing import (
    GRAD_TOL_LOW,
    POOL_CONFIGS,
    assert_bitwise_equal,
    eager_grads,
    grad_multiplier_tol,
    make_input,
    make_multiplier,
    grad_output_for,
    op_grads,
)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA backward's per-channel reduction")
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_grad_multiplier_is_deterministic_on_cuda(layout):
    # The multiplier gradient sums per-block partials in a fixed order (no atomics): repeated calls agree bit for
    # bit. (The single-launch sum over many partials: test_backward_back_to_back_cuda's C=24 case.)
    x = make_input((4, 16, 32, 64, 64), torch.float32, "cuda", layout, seed=3)
    m = make_multiplier("C111", 16, torch.float32, "cuda")
    cfg = POOL_CONFIGS["k2s2"]
    g = grad_output_for(x, m, cfg, seed=4)
    first = op_grads(x, m, g, cfg)[2]
    for _ in range(3):
        assert_bitwise_equal(op_grads(x, m, g, cfg)[2], first, "grad_multiplier")
    _, _, gm_e = eager_grads(x.double(), m.double(), g.double(), cfg)
    torch.testing.assert_close(first.double(), gm_e, **grad_multiplier_tol(x, g, torch.float32))


def _backward_op(g, sel, off, m, shape, channels_last):
    return torch.ops.fused.post_pool_backward(g, sel, off, m, 0.2, None, list(shape), [2, 2, 2], [2, 2, 2],
                                              [0, 0, 0], [1, 1, 1], channels_last)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA backward's dependent launches")
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channels", [16, "many partials"])
def test_backward_back_to_back_cuda(channels, layout, dtype):
    # The fast backward is a main kernel and one or two per-channel sum kernels, launched as programmatic
    # dependent launches on Hopper: a kernel's blocks may start before the previous grid ends and must wait for it
    # before touching memory. Calls issued back to back without synchronizing reuse each other's freed partial
    # buffers, so a missing wait would show as a gradient that differs from the same call run alone.
    # C=16 gives per-block partials (a one-pass sum). channels_last with C=24 (float32) or 48 (bf16) leaves 3 packs
    # of channels per position, which do not divide a block, so each pack writes its own partials and the sum takes
    # its single-launch form (ranges, then the last block's fold); the contiguous layout keeps block partials there.
    C = 16 if channels == 16 else (24 if dtype == torch.float32 else 48)
    shape = (4, C, 32, 64, 64) if dtype == torch.float32 else (16 if C == 16 else 4, C, 32, 64, 64)
    x = make_input(shape, dtype, "cuda", layout, seed=21)
    m = make_multiplier("C111", C, dtype, "cuda")
    _, sel, off = torch.ops.fused.post_pool_with_offsets(x, m, 0.2, [2, 2, 2])
    cl = layout == "channels_last"
    fmt = torch.channels_last_3d if cl else torch.contiguous_format
    gs = [torch.randn(sel.shape, device="cuda", dtype=dtype, generator=torch.Generator("cuda").manual_seed(i))
          .contiguous(memory_format=fmt) for i in range(8)]
    torch.cuda.synchronize()
    racing = [_backward_op(g, sel, off, m, shape, cl) for g in gs]  # no synchronization between calls
    torch.cuda.synchronize()
    for i, g in enumerate(gs):
        alone = _backward_op(g, sel, off, m, shape, cl)
        torch.cuda.synchronize()
        assert_bitwise_equal(racing[i][0], alone[0], f"grad_input of call {i}")
        assert_bitwise_equal(racing[i][1], alone[1], f"grad_multiplier of call {i}")
    if dtype == torch.float32:  # and each is right (16-bit dtypes: the race check above; eager's ties differ)
        cfg = POOL_CONFIGS["k2s2"]
        assert_bitwise_equal(racing[-1][0], eager_grads(x, m, gs[-1], cfg)[1], "grad_input against eager")
        _, _, gm_e = eager_grads(x.double(), m.double(), gs[-1].double(), cfg)
        torch.testing.assert_close(racing[-1][1].double(), gm_e, **grad_multiplier_tol(x, gs[-1], dtype))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs")
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_backward_in_cuda_graph_cuda(layout):
    # The backward's launches (plain inside a capture, dependent outside it on Hopper; the single-launch sum whose
    # block counter the main kernel zeroes) must capture into a CUDA graph, as torch.compile's
    # mode="reduce-overhead" does for training, and replay to the same bits as a call outside the graph, with new
    # inputs copied into the captured ones.
    # channels_last C=24: per-pack partials and the single-launch sum; contiguous: per-block partials, one pass.
    shape = (4, 24, 32, 64, 64) if layout == "channels_last" else (4, 16, 32, 64, 64)
    cl = layout == "channels_last"
    fmt = torch.channels_last_3d if cl else torch.contiguous_format
    x = make_input(shape, torch.float32, "cuda", layout, seed=41)
    m = make_multiplier("C111", shape[1], torch.float32, "cuda")
    _, sel, off = torch.ops.fused.post_pool_with_offsets(x, m, 0.2, [2, 2, 2])
    gs = [torch.randn(sel.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(i))
          .contiguous(memory_format=fmt) for i in range(3)]
    static_g = gs[0].clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        _backward_op(static_g, sel, off, m, shape, cl)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = _backward_op(static_g, sel, off, m, shape, cl)
    for i, g in enumerate(gs):
        static_g.copy_(g)
        graph.replay()
        torch.cuda.synchronize()
        alone = _backward_op(g, sel, off, m, shape, cl)
        torch.cuda.synchronize()
        assert_bitwise_equal(static_out[0], alone[0], f"grad_input, replay {i}")
        assert_bitwise_equal(static_out[1], alone[1], f"grad_multiplier, replay {i}")


def _tuned_backward(g, sel, off, bias, m, shape, channels_last, cl_items=0, dependent_launches=True,
                    single_launch_sum=True):
    """fused._post_pool_backward_tuned: the CUDA backward with explicit launch choices (the defaults are the
    public ops'); returns (grad_input, grad_bias or None, grad_multiplier)."""
    return torch.ops.fused._post_pool_backward_tuned(g, sel, off, bias, m, 0.2, None, list(shape), [2, 2, 2],
                                                     [2, 2, 2], [0, 0, 0], [1, 1, 1], channels_last, cl_items,
                                                     dependent_launches, single_launch_sum)


# Per-block partials (C=16) and, channels_last with C=24 / 48, per-pack partials summed by the single-launch form.
_SETTINGS_CASES = [(torch.float32, False, (4, 16, 32, 64, 64)), (torch.float32, True, (4, 16, 32, 64, 64)),
                   (torch.bfloat16, False, (16, 16, 32, 64, 64)), (torch.bfloat16, True, (16, 16, 32, 64, 64)),
                   (torch.float32, True, (4, 24, 32, 64, 64)), (torch.bfloat16, True, (4, 48, 32, 64, 64))]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA backward's launch choices")
@pytest.mark.parametrize("dtype,cl,shape", _SETTINGS_CASES, ids=lambda v: str(v).replace(" ", ""))
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_backward_launch_choices_cuda(dtype, cl, shape, bias):
    # Plain launches against dependent ones (the default on Hopper), the two-pass per-channel sum against the
    # single-launch form (the default where one pass does not suffice), through the private tuned op. Dependent
    # launches change no bits; the single-launch sum adds in another order, so its multiplier and bias gradients
    # agree to rounding and its grad_input is the same bits. The public ops use the defaults, bit for bit.
    C = shape[1]
    x = make_input(shape, dtype, "cuda", "channels_last" if cl else "contiguous", seed=31)
    m = make_multiplier("C111", C, dtype, "cuda")
    b = torch.randn(C, device="cuda", dtype=dtype, generator=torch.Generator("cuda").manual_seed(8)) if bias else None
    if bias:
        _, sel, off = torch.ops.fused.post_pool_bias_with_offsets(x, b, m, 0.2, [2, 2, 2])
    else:
        _, sel, off = torch.ops.fused.post_pool_with_offsets(x, m, 0.2, [2, 2, 2])
    g = torch.randn(sel.shape, device="cuda", dtype=dtype, generator=torch.Generator("cuda").manual_seed(5))
    g = g.contiguous(memory_format=torch.channels_last_3d if cl else torch.contiguous_format)
    results = {(pdl, fold): _tuned_backward(g, sel, off, b, m, shape, cl, 0, pdl, fold)
               for pdl in (False, True) for fold in (False, True)}
    if bias:
        public = torch.ops.fused.post_pool_bias_backward(g, sel, off, b, m, 0.2, None, list(shape), [2, 2, 2],
                                                         [2, 2, 2], [0, 0, 0], [1, 1, 1], cl)
    else:
        gi, gm = _backward_op(g, sel, off, m, shape, cl)
        public = (gi, None, gm)
    for k, (p_t, d_t) in enumerate(zip(public, results[True, True])):
        assert (p_t is None) == (d_t is None) == (k == 1 and not bias)
        if p_t is not None:
            assert_bitwise_equal(d_t, p_t, f"tuned defaults against the public op, output {k}")
    for fold in (False, True):
        for k, (p_t, d_t) in enumerate(zip(results[False, fold], results[True, fold])):
            if p_t is not None:
                assert_bitwise_equal(d_t, p_t, f"fold {fold}, output {k}: plain against dependent launches")
    two_pass, folded = results[True, False], results[True, True]
    assert_bitwise_equal(folded[0], two_pass[0], "grad_input")
    for k in (1, 2):  # grad_bias, grad_multiplier
        if folded[k] is None:
            continue
        assert folded[k].shape == two_pass[k].shape and folded[k].dtype == two_pass[k].dtype
        tol = dict(rtol=1e-5, atol=1e-3) if folded[k].dtype == torch.float32 else dict(rtol=1e-2, atol=1e-1)
        torch.testing.assert_close(folded[k].double(), two_pass[k].double(), **tol)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA channels_last backward's packs per thread")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("items", [1, 2, 4, 8])
def test_channels_last_backward_items_cuda(items, dtype):
    # Every number of packs per thread of the channels_last backward gives eager's gradients.
    shape = (3, 16, 6, 10, 14)
    x = make_input(shape, dtype, "cuda", "channels_last", seed=52)
    m = make_multiplier("C111", 16, dtype, "cuda")
    cfg = POOL_CONFIGS["k2s2"]
    g = grad_output_for(x, m, cfg, seed=6)
    _, sel, off = torch.ops.fused.post_pool_with_offsets(x, m, 0.2, [2, 2, 2])
    gx, _, gm = _tuned_backward(g, sel, off, None, m, shape, True, items)
    _, gx_e, gm_e = eager_grads(x.double(), m.double(), g.double(), cfg)
    if dtype == torch.float32:
        assert_bitwise_equal(gx, eager_grads(x, m, g, cfg, 0.2, None)[1], "grad_input")
        torch.testing.assert_close(gm.double(), gm_e, **grad_multiplier_tol(x, g, dtype))
    else:
        tol = GRAD_TOL_LOW[dtype]
        torch.testing.assert_close(gx.double(), gx_e, **tol)
        torch.testing.assert_close(gm.double(), gm_e, rtol=tol["rtol"], atol=tol["atol"] * 10)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the private tuned backward is CUDA only")
def test_tuned_backward_rejects_unsupported_items_cuda():
    x = make_input((1, 16, 2, 2, 2), torch.float32, "cuda", "channels_last", seed=1)
    m = make_multiplier("C111", 16, torch.float32, "cuda")
    _, sel, off = torch.ops.fused.post_pool_with_offsets(x, m, 0.2, [2, 2, 2])
    with pytest.raises(ValueError, match="cl_items must be"):
        _tuned_backward(torch.ones_like(sel), sel, off, None, m, x.shape, True, 3)
