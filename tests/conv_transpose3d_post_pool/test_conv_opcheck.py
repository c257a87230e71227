"""torch.library.opcheck on fused.conv_transpose3d_post_pool and its training form _with_offsets (schema, fake
impl, autograd registration, AOT dispatch): geometry cases, pool configurations with and without bias, input and
weight layouts, float64 (the composite on CUDA too), float32 and bfloat16, and on CUDA the fused kernel's path. And
the fake impl under symbolic sizes, as torch.compile(dynamic=True) runs it."""
import pytest
import torch

from conv_testing import (CASES, CL, CONFIGS, DEVICES, LAYOUTS, OPS, case_args, config_args, kb_args, make_case,
                          make_random, make_tensors, ran_aten_convolution, requires_cuda)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["kb", "pool3"])
@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last_3d], ids=["contig", "cl"])
def test_opcheck_float64_geometries(device, name, fmt):
    case = CASES[name]
    x, w, b, m = make_case(case, torch.float64, device, fmt=fmt)
    torch.library.opcheck(OPS.conv_transpose3d_post_pool.default, case_args(x, w, b, m, case))
    leaves = [t.requires_grad_() for t in (x, w, b, m)]
    torch.library.opcheck(OPS.conv_transpose3d_post_pool_with_offsets.default, case_args(*leaves, case))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["kb", "kb_ceil_odd", "pool3"])
@pytest.mark.parametrize("layouts", [("contig", "contig"), ("contig", "cl"), ("cl", "cl")], ids="-".join)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_opcheck_float64_with_and_without_bias(device, name, layouts, bias):
    x, w, b, m = make_tensors(torch.float64, device, bias=bias)
    x = x.contiguous(memory_format=CL) if layouts[0] == "cl" else x
    w = w.contiguous(memory_format=CL) if layouts[1] == "cl" else w
    args = config_args(x, w, b, m, CONFIGS[name], 0.2, 0.3)
    torch.library.opcheck(OPS.conv_transpose3d_post_pool.default, args)
    torch.library.opcheck(OPS.conv_transpose3d_post_pool_with_offsets.default, args)
    leaves = [t.requires_grad_() for t in (x, w, b, m) if t is not None]
    assert leaves
    torch.library.opcheck(OPS.conv_transpose3d_post_pool.default, args)
    torch.library.opcheck(OPS.conv_transpose3d_post_pool_with_offsets.default, args)


@pytest.mark.usefixtures("strict_float32")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("fmt", ["contig", "cl"])
def test_opcheck_float32_and_bfloat16(device, dtype, fmt):
    x, w, b, m = make_random(1, 4, 6, (2, 3, 2), dtype, device, seed=11)
    x = LAYOUTS[fmt](x)
    torch.library.opcheck(OPS.conv_transpose3d_post_pool.default, kb_args(x, w, b, m, 0.2, 0.3))
    leaves = [t.requires_grad_() for t in (x, w, b, m)]
    torch.library.opcheck(OPS.conv_transpose3d_post_pool_with_offsets.default, kb_args(*leaves, 0.2, 0.3))


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layouts", [("contig", "contig"), ("cl", "contig"), ("contig", "cl")], ids="-".join)
def test_opcheck_fused_path_cuda(dtype, layouts):
    # float64 (test_opcheck) takes the composite on CUDA; these dtypes take the fused kernel.
    x, w, b, m = make_tensors(dtype, "cuda", cin=16, cout=32)
    x = x.contiguous(memory_format=CL) if layouts[0] == "cl" else x
    w = w.contiguous(memory_format=CL) if layouts[1] == "cl" else w
    args = config_args(x, w, b, m, CONFIGS["kb"])
    assert not ran_aten_convolution(lambda: OPS.conv_transpose3d_post_pool(*args))
    for t in (x, w, b, m):
        t.requires_grad_()
    torch.library.opcheck(OPS.conv_transpose3d_post_pool.default, args)
    torch.library.opcheck(OPS.conv_transpose3d_post_pool_with_offsets.default, args)


@pytest.mark.usefixtures("strict_float32")
@pytest.mark.parametrize("offsets", [False, True], ids=["inference", "training"])
def test_fake_impl_keeps_sizes_symbolic(offsets):
    # Under torch.compile(dynamic=True) the fake impl runs on symbolic sizes: batch and spatial sizes stay
    # symbolic and the strides are the real outputs'.
    from torch.fx.experimental.proxy_tensor import make_fx

    op = OPS.conv_transpose3d_post_pool_with_offsets if offsets else OPS.conv_transpose3d_post_pool
    x, w, b, m = make_random(2, 4, 6, (3, 4, 5), torch.float32, "cpu")
    for fmt in ("contig", "cl"):
        xf = LAYOUTS[fmt](x)
        gm = make_fx(lambda *t: op(*kb_args(*t, 0.2, 0.2, (1, 1, 0))), tracing_mode="symbolic")(xf, w, b, m)
        node = next(n for n in gm.graph.nodes if n.op == "call_function" and "conv_transpose3d_post_pool" in
                    str(n.target))
        vals = node.meta["val"] if offsets else [node.meta["val"]]
        real = op(*kb_args(xf, w, b, m, 0.2, 0.2, (1, 1, 0)))
        real = real if offsets else [real]
        for v, r in zip(vals, real):
            assert any(isinstance(s, torch.SymInt) for s in v.shape), v.shape
            assert [int(s) for s in v.shape] == list(r.shape) and [int(s) for s in v.stride()] == list(r.stride())
