"""The memory format of fused.conv_transpose3d_post_pool's outputs. Eager's composite takes its convolution's
(cuDNN gives channels_last_3d when the input or the weight is channels_last_3d; on CPU it depends on whether oneDNN
runs): the op, its training form and their fake impls must have the same strides for inputs and weights of any
layout, for sizes of 1 that make several stride patterns valid, and with an empty batch. On CUDA the C++ op applies
aten's rule directly (conv_memory_format), with cuDNN on and off."""
import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from conv_testing import (CASES, CL, CONFIGS, DEVICES, HALF, LAYOUTS, OPS, case_args, check_close, config_args,
                          half_bound, kb_call, make_case, make_random, make_tensors, pool_chain, reference64,
                          reference_case, reference_config, requires_cuda)


@pytest.mark.usefixtures("strict_float32")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("xl", list(LAYOUTS))
@pytest.mark.parametrize("wl", ["contig", "cl", "strided"])
def test_layouts(device, dtype, xl, wl):
    # Inputs and weights of any layout; the output takes the eager composite's memory format (the
    # convolution's) in every form.
    x, w, b, m = make_random(2, 6, 9, (3, 4, 5), dtype, device, seed=3)
    x, w = LAYOUTS[xl](x), LAYOUTS[wl](w)
    eager = pool_chain(F.conv_transpose3d(x, w, b, 2, 1, 1), m, 0.2, 0.2)[0]
    ref = reference64(x, w, b, m, 0.2, 0.2)
    for t in (kb_call(x, w, b, m, 0.2, 0.2), *kb_call(x, w, b, m, 0.2, 0.2, offsets=True)):
        assert t.shape == eager.shape and t.stride() == eager.stride(), (t.stride(), eager.stride())
    check_close(kb_call(x, w, b, m, 0.2, 0.2), ref, dtype, half_bound(x, w, b, m, 0.2, 0.2) if dtype in HALF else None)


@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last_3d], ids=["contig", "cl"])
def test_fake_matches_real_strides(fmt):
    case = CASES["kb"]
    x, w, b, m = make_case(case, torch.float32, "cpu", fmt=fmt)
    real = OPS.conv_transpose3d_post_pool_with_offsets(*case_args(x, w, b, m, case))
    with FakeTensorMode() as mode:
        fake = OPS.conv_transpose3d_post_pool_with_offsets(
            *case_args(*(mode.from_tensor(t) for t in (x, w, b, m)), case))
    for r, f in zip(real, fake):
        assert (r.shape, r.stride(), r.dtype) == (f.shape, f.stride(), f.dtype)


# Input and weight layouts of the test below (its strided one: a transposed copy).
XW_LAYOUTS = {
    "contig": lambda t: t,
    "cl": lambda t: t.contiguous(memory_format=torch.channels_last_3d),
    "strided": lambda t: t.transpose(3, 4).contiguous().transpose(3, 4),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("batch", [0, 1, 2, 16])
@pytest.mark.parametrize("xl,wl", [("contig", "contig"), ("contig", "cl"), ("cl", "contig"), ("cl", "cl"),
                                   ("strided", "cl"), ("cl", "strided")])
@pytest.mark.parametrize("name", ["kb", "s1k2"])
def test_output_layout_follows_the_convolution(device, dtype, batch, xl, wl, name):
    # Eager conv_transpose3d picks its output's memory format from the backend it runs: cuDNN gives
    # channels_last_3d when the input *or* the weight is channels_last_3d (not in float64); on CPU it depends on
    # whether oneDNN runs (dtype, sizes, threads). The op, its training form and their fake impls follow the same
    # rule, so they have the eager composite's strides.
    case = CASES[name]
    x, w, b, m = make_case(case, dtype, device, shape=(batch, 3, 4, 5))
    x, w = XW_LAYOUTS[xl](x), XW_LAYOUTS[wl](w)
    ref = reference_case(x, w, b, m, 0.2, 0.2, case)
    args = case_args(x, w, b, m, case)
    outs = [OPS.conv_transpose3d_post_pool(*args), *OPS.conv_transpose3d_post_pool_with_offsets(*args)]
    with FakeTensorMode() as mode:
        fargs = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        fakes = [OPS.conv_transpose3d_post_pool(*fargs), *OPS.conv_transpose3d_post_pool_with_offsets(*fargs)]
    for o in outs + fakes:
        assert (o.shape, o.stride()) == (ref.shape, ref.stride())
    if batch:
        torch.testing.assert_close(outs[0], ref, **({} if dtype != torch.bfloat16 else dict(rtol=2e-2, atol=2e-2)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [dict(cout=1), dict(spatial=(1, 1, 1)), dict(n=1, cin=1, cout=1, spatial=(1, 2, 1))],
                         ids=["cout1", "pooled1", "all_ones"])
@pytest.mark.parametrize("fmt", ["contig", "cl_x", "cl_w"])
def test_degenerate_layouts_match_fake(device, shape, fmt):
    # Sizes of 1 make several stride patterns valid for one layout: real and fake outputs must still agree.
    x, w, b, m = make_tensors(torch.float32, device, **shape)
    if fmt == "cl_x":
        x = x.contiguous(memory_format=CL)
    if fmt == "cl_w":
        w = w.contiguous(memory_format=CL)
    args = config_args(x, w, b, m, CONFIGS["kb"])
    real = [OPS.conv_transpose3d_post_pool(*args), *OPS.conv_transpose3d_post_pool_with_offsets(*args)]
    with FakeTensorMode() as mode:
        fargs = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        fake = [OPS.conv_transpose3d_post_pool(*fargs), *OPS.conv_transpose3d_post_pool_with_offsets(*fargs)]
    for r, f in zip(real, fake):
        assert (r.shape, r.stride(), r.dtype) == (f.shape, f.stride(), f.dtype)
    ref = reference_config(x, w, b, m, CONFIGS["kb"])
    torch.testing.assert_close(real[0], ref, rtol=1e-5, atol=1e-5)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("layouts", [("contig", "contig"), ("cl", "contig"), ("contig", "cl"), ("cl", "cl")],
                         ids="-".join)
@pytest.mark.parametrize("cudnn", [True, False], ids=["cudnn", "no_cudnn"])
@pytest.mark.parametrize("n", [2, 0], ids=["n2", "n0"])
def test_cuda_output_format_matches_aten(dtype, layouts, cudnn, n):
    # On CUDA the C++ op applies aten's memory-format rule directly where it is certain (instead of running
    # aten's backend selection on every call): its outputs must have the strides aten's selection gives (the
    # fake impl's) and, with a non-empty batch, those of eager's own result.
    from torch_fused_ops.ops.conv_transpose3d_post_pool import conv_memory_format

    x, w, b, m = make_tensors(dtype, "cuda", n=n, cin=16, cout=32)
    x = x.contiguous(memory_format=CL) if layouts[0] == "cl" else x
    w = w.contiguous(memory_format=CL) if layouts[1] == "cl" else w
    args = config_args(x, w, b, m, CONFIGS["kb"])
    with torch.backends.cudnn.flags(enabled=cudnn):
        outs = [OPS.conv_transpose3d_post_pool(*args), *OPS.conv_transpose3d_post_pool_with_offsets(*args)]
        fmt = conv_memory_format(x, w, b, [2] * 3, [1] * 3, [1] * 3, 1, [1] * 3)
        ref = reference_config(x, w, b, m, CONFIGS["kb"])
    for o in outs:
        assert o.stride() == torch.empty(o.shape, device="cuda", memory_format=fmt).stride()
        if n:
            assert o.stride() == ref.stride()
