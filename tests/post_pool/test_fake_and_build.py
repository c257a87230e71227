"""Fake/meta kernels agree with the real CPU kernels on metadata, and the built
library registers what it should (CPU always, CUDA in CUDA builds of torch)."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_fused_ops  # noqa: F401  (import failure must be loud, not a skip)
from fused_testing import CHANNELS_LAST, make_input, make_multiplier, op_args, resolved_pool

OPS = ["post_pool", "post_pool_with_offsets", "post_pool_backward"]
# Registration is checked for these too (their metadata tests live in test_bias.py, beside this file).
REGISTERED = OPS + ["post_pool_bias", "post_pool_bias_with_offsets", "post_pool_bias_backward"]


@pytest.mark.parametrize("op", REGISTERED)
def test_cpu_kernel_registered(op):
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"fused::{op}", "CPU")


@pytest.mark.skipif(torch.version.cuda is None, reason="torch is not a CUDA build, so no CUDA kernel is expected")
@pytest.mark.parametrize("op", REGISTERED)
def test_cuda_kernel_registered(op):
    # A CUDA build of torch must get CUDA kernels even on a machine without a
    # GPU: a CPU-only build of the extension would silently fail later.
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"fused::{op}", "CUDA")


@pytest.mark.parametrize("op", OPS)
def test_pt2_compliant_tag(op):
    assert torch.Tag.pt2_compliant_tag in getattr(torch.ops.fused, op).default.tags


def test_wrapper_is_exported():
    assert callable(torch_fused_ops.post_pool)
    assert callable(torch_fused_ops.reference_post_pool)


META_CASES = [
    pytest.param((2, 3, 5, 7, 9), "contiguous", dict(kernel_size=2), id="k2-contig"),
    pytest.param((2, 3, 5, 7, 9), "channels_last", dict(kernel_size=2), id="k2-cl"),
    pytest.param((2, 3, 5, 7, 9), "channels_last", dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
                 id="k3s2p1ceil-cl"),
    pytest.param((2, 3, 5, 7, 9), "contiguous", dict(kernel_size=2, stride=2, ceil_mode=True), id="k2ceil-contig"),
    pytest.param((2, 3, 5, 7, 9), "channels_last",
                 dict(kernel_size=(3, 2, 2), stride=(2, 1, 2), padding=(1, 0, 1), dilation=(1, 2, 1), ceil_mode=True),
                 id="mixed-cl"),
    pytest.param((2, 3, 5, 7, 9), "strided", dict(kernel_size=3, stride=2, padding=1), id="k3s2p1-strided"),
    pytest.param((2, 16, 8, 16, 16), "channels_last", dict(kernel_size=2, stride=2), id="medium-cl"),
    pytest.param((0, 3, 5, 7, 9), "contiguous", dict(kernel_size=2), id="N0"),
]


def _same_meta(fake, real, what):
    assert fake.shape == real.shape, f"{what}: shape {tuple(fake.shape)} != {tuple(real.shape)}"
    assert fake.dtype == real.dtype, f"{what}: dtype {fake.dtype} != {real.dtype}"
    assert fake.device == real.device, f"{what}: device {fake.device} != {real.device}"
    if real.numel() > 0:
        assert fake.stride() == real.stride(), f"{what}: strides {fake.stride()} != {real.stride()}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape,layout,cfg", META_CASES)
def test_fake_matches_real(shape, layout, cfg, dtype):
    x = make_input(shape, dtype, "cpu", layout, seed=61)
    m = make_multiplier("C111", shape[1], dtype, "cpu")
    k, s_arg, p, d, ceil = op_args(cfg)
    _, s, _, _, _ = resolved_pool(**cfg)
    cl = layout == "channels_last"

    real = torch.ops.fused.post_pool(x, m, 0.2, k, s_arg, p, d, ceil, None)
    real3 = torch.ops.fused.post_pool_with_offsets(x, m, 0.2, k, s_arg, p, d, ceil, None)
    g = torch.randn(real.shape, dtype=dtype)
    if cl:
        g = g.contiguous(memory_format=CHANNELS_LAST)
    real_bw = torch.ops.fused.post_pool_backward(g, real3[1], real3[2], m, 0.2, None, list(x.shape), k, list(s), p, d, cl)
    if cl and real.numel() > 0:
        assert real.is_contiguous(memory_format=CHANNELS_LAST)
        assert real_bw[0].is_contiguous(memory_format=CHANNELS_LAST)

    with FakeTensorMode() as mode:
        fx, fm, fg = mode.from_tensor(x), mode.from_tensor(m), mode.from_tensor(g)
        fsel, foff = mode.from_tensor(real3[1]), mode.from_tensor(real3[2])
        fake = torch.ops.fused.post_pool(fx, fm, 0.2, k, s_arg, p, d, ceil, None)
        fake3 = torch.ops.fused.post_pool_with_offsets(fx, fm, 0.2, k, s_arg, p, d, ceil, None)
        fake_bw = torch.ops.fused.post_pool_backward(fg, fsel, foff, fm, 0.2, None, list(x.shape), k, list(s), p, d, cl)
        fake_wrapper = torch_fused_ops.post_pool(fx, fm, 0.2, **cfg)

    _same_meta(fake, real, "post_pool")
    _same_meta(fake_wrapper, real, "wrapper")
    for name, f, r in zip(("out", "selected", "offsets"), fake3, real3):
        _same_meta(f, r, f"post_pool_with_offsets.{name}")
    for name, f, r in zip(("grad_input", "grad_multiplier"), fake_bw, real_bw):
        _same_meta(f, r, f"post_pool_backward.{name}")


def test_fake_output_for_empty_channels():
    x = torch.empty((2, 0, 5, 7, 9))
    m = torch.ones(())
    real = torch.ops.fused.post_pool(x, m, 0.2, [3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1], True, None)
    with FakeTensorMode() as mode:
        fake = torch.ops.fused.post_pool(mode.from_tensor(x), mode.from_tensor(m), 0.2, [3, 3, 3], [2, 2, 2],
                                         [1, 1, 1], [1, 1, 1], True, None)
    assert real.shape == fake.shape == (2, 0, 3, 4, 5)


def test_meta_device_tensors():
    # Meta tensors (used by e.g. deferred init) go through the same shape logic.
    x = make_input((2, 3, 5, 7, 9), torch.float32, "cpu", "channels_last").to("meta")
    m = torch.empty((3, 1, 1, 1), device="meta")
    out = torch.ops.fused.post_pool(x, m, 0.2, [3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1], True, None)
    assert out.device.type == "meta"
    assert out.shape == (2, 3, 3, 4, 5)
    assert out.is_contiguous(memory_format=CHANNELS_LAST)


def test_fake_with_symbolic_shapes():
    # What torch.compile(dynamic=True) does: all five input sizes symbolic.
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    x = make_input((2, 3, 9, 11, 13), torch.float32, "cpu", "channels_last")
    m = make_multiplier("C111", 3)
    real = torch.ops.fused.post_pool(x, m, 0.2, [3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1], True, None)
    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * 5)
        fx = mode.from_tensor(x, source=ConstantSource("x"), symbolic_context=ctx)
        assert all(isinstance(sz, torch.SymInt) for sz in fx.shape)
        fake = torch.ops.fused.post_pool(fx, mode.from_tensor(m), 0.2, [3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1],
                                         True, None)
        # int() evaluates each symbolic size at the hint (the real size).
        fake_shape = tuple(int(sz) for sz in fake.shape)
        fake_stride = tuple(int(st) for st in fake.stride())
    assert fake_shape == tuple(real.shape)
    assert fake_stride == real.stride()
