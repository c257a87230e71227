"""torch.library.opcheck on the three fused ops: schema, autograd registration,
fake tensor kernels and AOT dispatch (with dynamic shapes)."""

import pytest
import torch

import torch_fused_ops  # noqa: F401  (import failure must be loud, not a skip)
from fused_testing import CHANNELS_LAST, DEVICES, make_input, make_multiplier, op_args, resolved_pool

SHAPE = (2, 3, 5, 6, 7)
CONFIGS = [
    pytest.param(dict(kernel_size=3, stride=2, padding=1), id="k3s2p1"),
    pytest.param(dict(kernel_size=2, stride=2), id="k2s2"),
]


def _inputs(device, dtype, layout, mkind, requires_grad):
    x = make_input(SHAPE, dtype, device, layout, seed=51)
    m = make_multiplier(mkind, SHAPE[1], dtype, device)
    return x.requires_grad_(requires_grad), m.requires_grad_(requires_grad)


def _assert_all_success(result):
    assert isinstance(result, dict) and result, result
    failed = {k: v for k, v in result.items() if v != "SUCCESS"}
    assert not failed, failed



def _matrix():
    # Full dtype x layout x pool product with a per-channel multiplier, plus a
    # 0-d multiplier once per pool config.
    cases = []
    for dtype in (torch.float32, torch.float16):
        for layout in ("contiguous", "channels_last"):
            for cfg in CONFIGS:
                cases.append(pytest.param(dtype, layout, cfg.values[0], "C111",
                                          id=f"{str(dtype)[6:]}-{layout}-{cfg.id}-C111"))
    for cfg in CONFIGS:
        cases.append(pytest.param(torch.float32, "contiguous", cfg.values[0], "0d", id=f"float32-contiguous-{cfg.id}-0d"))
    return cases


MATRIX = _matrix()


@pytest.mark.parametrize("dtype,layout,cfg,mkind", MATRIX)
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_post_pool(device, dtype, layout, cfg, mkind):
    x, m = _inputs(device, dtype, layout, mkind, requires_grad=True)
    k, s, p, d, ceil = op_args(cfg)
    _assert_all_success(torch.library.opcheck(torch.ops.fused.post_pool.default, (x, m, 0.2, k, s, p, d, ceil, 0.3)))


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_post_pool_with_offsets(device, dtype, layout, cfg):
    x, m = _inputs(device, dtype, layout, "C111", requires_grad=False)
    k, s, p, d, ceil = op_args(cfg)
    _assert_all_success(torch.library.opcheck(
        torch.ops.fused.post_pool_with_offsets.default, (x, m, 0.2, k, s, p, d, ceil, None)))


@pytest.mark.parametrize("dtype,layout,cfg,mkind", MATRIX)
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_post_pool_backward(device, dtype, layout, cfg, mkind):
    x, m = _inputs(device, dtype, layout, mkind, requires_grad=False)
    k, s_arg, p, d, ceil = op_args(cfg)
    _, s, _, _, _ = resolved_pool(**cfg)
    out, selected, offsets = torch.ops.fused.post_pool_with_offsets(x, m, 0.2, k, s_arg, p, d, ceil, 0.3)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(52)).to(dtype=dtype, device=device)
    if layout == "channels_last":
        g = g.contiguous(memory_format=CHANNELS_LAST)
    args = (g, selected, offsets, m, 0.2, 0.3, list(x.shape), k, list(s), p, d, layout == "channels_last")
    _assert_all_success(torch.library.opcheck(torch.ops.fused.post_pool_backward.default, args))
