"""fused.conv_transpose3d_post_pool's autograd end to end, through the public wrapper and the op: gradients
against eager autograd of the unfused chain (float64; float32 against float64 by relative norm; every geometry case),
gradcheck, which gradients are computed, what training saves, double backward. On CUDA (float32/bf16/fp16, the
fused geometry) the backward runs the ops at pooled resolution (their own tests: test_conv_backward_ops.py); on CPU
aten's convolution backward. Empty batches: test_conv_empty_batch.py."""
import pytest
import torch

from conv_backward_testing import chain, make, wrapper_call
from conv_testing import (CASES, CONFIGS, DEVICES, HAS_CUDA, LAYOUTS, OPS, VALUE_CASES, call_case, case_id,
                          config_args, kb_args, make_case, make_random, make_tensors, reference64, reference_case,
                          reference_config, rel)
from torch_fused_ops import conv_transpose3d_post_pool
from torch_fused_ops.models import ConvTransposeLeakyMulLeakyPool


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last_3d], ids=["contig", "cl"])
@pytest.mark.parametrize("op", [1, 0, (0, 1, 1)], ids=str)
def test_gradients_match_eager_float64(device, fmt, op):
    x, w, b, m = make(2, 3, 5, (3, 4, 3), device=device, fmt=fmt)
    leaves = [t.requires_grad_() for t in (x, w, b, m)]
    out = wrapper_call(*leaves, op=op)
    ref = chain(*leaves, 0.2, 0.3, op)
    g = torch.randn_like(ref)
    for name, a, e in zip(("input", "weight", "bias", "multiplier"), torch.autograd.grad(out, leaves, g),
                          torch.autograd.grad(ref, leaves, g)):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-10, msg=lambda s: f"grad {name}: {s}")


def test_gradcheck_float64_cpu():
    x, w, b, m = make(1, 2, 2, (2, 2, 2), seed=3)
    leaves = [t.requires_grad_() for t in (x, w, b, m)]
    assert torch.autograd.gradcheck(lambda *a: wrapper_call(*a), leaves, eps=1e-6, atol=1e-5)


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
        out = wrapper_call(tensors["input"], tensors["weight"], tensors["bias"], tensors["multiplier"])
        ref = chain(*(tensors[k] for k in ("input", "weight", "bias", "multiplier")), 0.2, 0.3, 1)
        g = torch.randn_like(ref)
        got = torch.autograd.grad(out, [tensors[k] for k in want], g)
        exp = torch.autograd.grad(ref, [tensors[k] for k in want], g)
    tol = dict(rtol=1e-10, atol=1e-10) if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-4)
    for a, e in zip(got, exp):
        torch.testing.assert_close(a, e, **tol)
    # Unwanted leaves get no gradient.
    out = wrapper_call(tensors["input"], tensors["weight"], tensors["bias"], tensors["multiplier"])
    out.backward(g)
    for k, t in tensors.items():
        if t is not None and k not in want:
            assert t.grad is None


@pytest.mark.parametrize("device", DEVICES)
def test_double_backward_raises(device):
    dtype = torch.float32 if device == "cuda" else torch.float64
    x, w, b, m = make(dtype=dtype, device=device)
    leaves = [t.requires_grad_() for t in (x, w, b, m)]
    out = wrapper_call(*leaves)
    grads = torch.autograd.grad(out.sum(), leaves, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        torch.autograd.grad(sum(gr.sum() for gr in grads), leaves)


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
        got = torch.autograd.grad(wrapper_call(*leaves, s2=0.2), leaves, g.to(dtype))
        eager = torch.autograd.grad(chain(*leaves, 0.2, 0.2, 1), leaves, g.to(dtype))
    floor = {torch.float32: 1e-5, torch.bfloat16: 2e-3, torch.float16: 5e-4}[dtype]
    for name, a, e, r in zip(("input", "weight", "bias", "multiplier"), got, eager, want):
        err = ((a.double() - r).norm() / r.norm()).item()
        base = ((e.double() - r).norm() / r.norm()).item()
        assert err <= 1.5 * base + floor, f"grad {name}: {err:.3e} vs eager {base:.3e}"


@pytest.mark.usefixtures("strict_float32")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", [VALUE_CASES[0], VALUE_CASES[3], VALUE_CASES[4], VALUE_CASES[6]], ids=case_id)
@pytest.mark.parametrize("fmt", ["contig", "cl"])
def test_gradients_match_float64(device, case, fmt):
    # float32 (strict) against float64 eager autograd, by relative norm: a window whose two largest values lie
    # within float32 rounding of each other may select the other element.
    n, cin, cout, dhw, op, bias, (s1, s2), mult = case
    x, w, b, m = make_random(n, cin, cout, dhw, torch.float32, device, bias=bias, mult=mult, seed=4)
    x = LAYOUTS[fmt](x)
    leaves = [t.clone().requires_grad_() for t in (x, w, b, m) if t is not None]
    bias_leaf = leaves[2] if bias else None
    out = OPS.conv_transpose3d_post_pool(*kb_args(leaves[0], leaves[1], bias_leaf, leaves[-1], s1, s2, op))
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(device)
    got = torch.autograd.grad(out, leaves, g)
    leaves64 = [t.detach().double().cpu().requires_grad_() for t in leaves]
    ref = reference64(leaves64[0], leaves64[1], leaves64[2] if bias else None, leaves64[-1], s1, s2, op)
    want = torch.autograd.grad(ref, leaves64, g.double().cpu())
    for i, (a, e) in enumerate(zip(got, want)):
        assert a.shape == e.shape and rel(a, e) < 1e-4, f"grad {i}: relative error {rel(a, e):.2e}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last_3d], ids=["contig", "cl"])
def test_forward_and_grads_float64(device, name, fmt):
    case = CASES[name]
    x, w, b, m = make_case(case, torch.float64, device, fmt=fmt)
    leaves = [t.requires_grad_() for t in (x, w, b, m)]
    out = call_case(x, w, b, m, 0.2, 0.3, case)
    ref = reference_case(x, w, b, m, 0.2, 0.3, case)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    assert out.stride() == ref.stride()  # the eager composite's layout (the convolution's memory-format rule)
    g = torch.randn_like(ref)
    got = torch.autograd.grad(out, leaves, g)
    want = torch.autograd.grad(ref, leaves, g)
    for name_, a, e in zip(("input", "weight", "bias", "multiplier"), got, want):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-10, msg=lambda s: f"grad {name_}: {s}")


@pytest.mark.parametrize("device", DEVICES)
def test_float32_close_to_float64_reference(device):
    case = CASES["kb"]
    x, w, b, m = make_case(case, torch.float32, device, cin=16, cout=32, shape=(2, 4, 6, 5))
    leaves64 = [t.double().requires_grad_() for t in (x, w, b, m)]
    ref = reference_case(*leaves64, 0.2, 0.2, case)
    leaves = [t.requires_grad_() for t in (x, w, b, m)]
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        out = call_case(*leaves, 0.2, 0.2, case)
        g = torch.randn_like(out)
        got = torch.autograd.grad(out, leaves, g)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    want = torch.autograd.grad(ref, leaves64, g.double())
    for a, e in zip(got, want):
        torch.testing.assert_close(a.double(), e, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["kb", "kb_op0", "pool3", "s1"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_gradcheck_float64(device, name, bias):
    cfg = CONFIGS[name]
    x, w, b, m = make_tensors(torch.float64, device, n=1, cin=2, cout=3, spatial=(2, 3, 2), bias=bias)
    leaves = [t.requires_grad_() for t in (x, w, b, m) if t is not None]

    def fn(*ts):
        xx, ww, *rest = ts
        bb = rest[0] if bias else None
        return conv_transpose3d_post_pool(xx, ww, bb, rest[-1], 0.2, cfg[0], cfg[1], cfg[2], 1, 1, cfg[3], cfg[4],
                                          0, 1, cfg[5], 0.3)

    assert torch.autograd.gradcheck(fn, leaves, eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("wants", ["x", "w", "b", "m", "xw", "all"])
def test_gradients_of_any_subset_match_eager(device, wants):
    # The backward's output mask follows needs_input_grad: each subset of inputs gets eager's gradients.
    x, w, b, m = make_tensors(torch.float64, device)
    named = dict(x=x, w=w, b=b, m=m)
    chosen = "xwbm" if wants == "all" else wants
    for k in chosen:
        named[k].requires_grad_()
    cfg = CONFIGS["kb"]
    out = OPS.conv_transpose3d_post_pool(*config_args(x, w, b, m, cfg))
    ref = reference_config(x, w, b, m, cfg)
    g = torch.randn_like(ref)
    leaves = [named[k] for k in chosen]
    got = torch.autograd.grad(out, leaves, g)
    want = torch.autograd.grad(ref, leaves, g)
    for k, a, e in zip(chosen, got, want):
        assert a.shape == e.shape
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-10, msg=lambda s: f"grad {k}: {s}")


@pytest.mark.parametrize("device", DEVICES)
def test_training_saves_only_small_tensors(device):
    # Between forward and backward: input, weight, multiplier and pooled-size tensors, never the convolution
    # output (8x the pooled size here).
    x, w, b, m = make_tensors(torch.float32, device, n=2, cin=3, cout=4, spatial=(4, 4, 4))
    for t in (x, w, b, m):
        t.requires_grad_()
    sizes = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: (sizes.append(t.numel()), t)[1], lambda t: t):
        out = conv_transpose3d_post_pool(x, w, b, m, 0.2, 2, 1, 1)
    assert sizes, "nothing was saved through autograd"
    assert max(sizes) <= max(x.numel(), w.numel(), out.numel()), sizes
    out.sum().backward()
    assert all(t.grad is not None for t in (x, w, b, m))


@pytest.mark.parametrize("device", DEVICES)
def test_double_backward_raises_after_first_order_matches(device):
    x, w, b, m = make_tensors(torch.float64, device)
    leaves = [t.requires_grad_() for t in (x, w, b, m)]
    out = conv_transpose3d_post_pool(x, w, b, m, 0.2, 2, 1, 1)
    ref = reference_config(x, w, b, m, CONFIGS["kb"])
    got = torch.autograd.grad(out.sum(), leaves, create_graph=True)
    want = torch.autograd.grad(ref.sum(), leaves)
    for a, e in zip(got, want):  # first-order gradients are right under create_graph too
        torch.testing.assert_close(a, e)
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        torch.autograd.grad(got[0].sum(), leaves[0])


@pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_training_path_gradients_cuda(dtype):
    # The op's training path on CUDA (the fused forward with offsets, then post_pool_backward and cuDNN's
    # convolution backward) against eager autograd. With TF32 or bf16 the two convolutions round differently, so
    # a few near-tied windows pick another element; gradients are compared by relative norm.
    torch.manual_seed(0)
    model = ConvTransposeLeakyMulLeakyPool().cuda().to(dtype)
    conv = model.conv_transpose
    x = torch.randn(2, 16, 4, 6, 6, device="cuda", dtype=dtype, requires_grad=True)
    out = conv_transpose3d_post_pool(x, conv.weight, conv.bias, model.multiplier, 0.2, 2, 1, 1)
    ref = model(x)
    params = [x, conv.weight, conv.bias, model.multiplier]
    got = torch.autograd.grad(out.float().sum(), params)
    want = torch.autograd.grad(ref.float().sum(), params)
    for name, a, e in zip(("input", "weight", "bias", "multiplier"), got, want):
        rel = ((a.float() - e.float()).norm() / e.float().norm()).item()
        assert rel < (5e-2 if dtype == torch.bfloat16 else 1e-2), f"grad {name}: relative error {rel:.2e}"
