"""fused.conv_transpose3d_post_pool in mixed precision: the mixed form itself (float16/bfloat16 operands with a
float32 multiplier, output float32), and direct calls inside torch.autocast, forward and backward, against eager
PyTorch running the unfused chain under the same autocast. The CPU composite and the fused CUDA kernel on
integer-valued data (exact convolution) match eager bit for bit; on random data the fused kernel's error against a
float64 reference is held to eager autocast's."""
import pytest
import torch
import torch.nn.functional as F

import torch_fused_ops
from conv_testing import HALF, OPS, kb_args, make_ints, make_random, poison, rel, requires_cuda

# torch.autocast's dtypes per device (CPU autocast takes bfloat16 only).
PARAMS = [pytest.param("cpu", torch.bfloat16, id="cpu-bf16")] + [
    pytest.param("cuda", t, id=f"cuda-{str(t).removeprefix('torch.')}", marks=requires_cuda) for t in HALF]


def eager_chain(x, w, b, m, s1=0.2, s2=0.2, op=(1, 1, 1)):
    """The KernelBench chain as eager PyTorch runs it (under whatever autocast is active)."""
    y = F.conv_transpose3d(x, w, b, stride=2, padding=1, output_padding=op)
    return F.max_pool3d(F.leaky_relu(F.leaky_relu(y, s1) * m, s2), 2, 2)


def fused(x, w, b, m, s1=0.2, s2=0.2, op=(1, 1, 1)):
    return torch_fused_ops.conv_transpose3d_post_pool(x, w, b, m, s1, stride=2, padding=1, output_padding=op,
                                                      kernel_size=2, negative_slope2=s2)


@pytest.mark.parametrize("device,dtype", PARAMS)
@pytest.mark.parametrize("op", [(1, 1, 1), (0, 1, 0)])
def test_mixed_form_exact_on_integer_data(device, dtype, op):
    # Small integers: the convolution is exact in every dtype, so the epilogue's roundings alone decide the bits.
    x, w, b, m = make_ints(2, 5, 11, (3, 4, 5), torch.float32, device)
    xh, wh, bh = (t.to(dtype) for t in (x, w, b))
    want = eager_chain(xh, wh, bh, m, 0.3, -0.6, op)
    assert want.dtype == torch.float32
    poison(want.shape, torch.float32, device)
    out = OPS.conv_transpose3d_post_pool(*kb_args(xh, wh, bh, m, 0.3, -0.6, op))
    assert out.dtype == torch.float32
    assert torch.equal(out, want)
    out2, selected, offsets = OPS.conv_transpose3d_post_pool_with_offsets(*kb_args(xh, wh, bh, m, 0.3, -0.6, op))
    assert torch.equal(out2, want) and selected.dtype == dtype and offsets.dtype == torch.uint8


@pytest.mark.parametrize("device,dtype", PARAMS)
def test_direct_call_under_autocast(device, dtype):
    x, w, b, m = make_ints(2, 4, 6, (3, 3, 4), torch.float32, device)
    with torch.autocast(device, dtype=dtype):
        want = eager_chain(x, w, b, m)
        out = fused(x, w, b, m)
    assert out.dtype == want.dtype == torch.float32
    assert torch.equal(out, want)
    # Outside autocast the same float32 call stays float32 throughout.
    assert torch.equal(fused(x, w, b, m), eager_chain(x, w, b, m))


def test_cpu_autocast_matches_eager_bit_for_bit():
    # On CPU the op runs aten's convolution then post_pool's mixed form: the eager chain's arithmetic exactly.
    x, w, b, m = make_random(2, 6, 10, (3, 4, 3), torch.float32, "cpu", mult="mixed")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = eager_chain(x, w, b, m, 0.2, 0.05)
        out = fused(x, w, b, m, 0.2, 0.05)
    assert torch.equal(out, want)


@pytest.mark.parametrize("device,dtype", PARAMS)
def test_gradients_under_autocast(device, dtype):
    # Integer data and dyadic slopes: the convolution and every step of the chain are exact, so each window selects
    # what eager's does (on random data a near-tied window may select another tap in either, which moves a whole
    # window's gradient and makes norms of small problems noisy) and the convolution output's gradient is eager's
    # bit for bit. What is left is the order of the sums in the weight's and input's gradients.
    x, w, b, m = make_ints(2, 5, 11, (3, 4, 5), torch.float32, device)
    g = torch.randint(-2, 3, (2, 11, 3, 4, 5), generator=torch.Generator().manual_seed(3)).float().to(device)

    def grads(fn):
        leaves = [t.detach().requires_grad_() for t in (x, w, b, m)]
        with torch.autocast(device, dtype=dtype):
            out = fn(*leaves, 0.25, 0.5)
        out.backward(g)
        return out.detach(), [t.grad for t in leaves]

    out_e, want = grads(eager_chain)
    out_f, got = grads(fused)
    assert torch.equal(out_f, out_e)
    assert all(t.dtype == torch.float32 for t in got)
    for name, a, e in zip(("input", "weight", "bias", "multiplier"), got, want):
        if device == "cpu" and name != "multiplier":
            # The same aten convolution backward on the same gradient of the convolution's output.
            assert torch.equal(a, e), name
        else:
            err = ((a - e).norm() / e.norm()).item()
            assert err <= (1e-2 if dtype == torch.bfloat16 else 2e-3), f"{name}: relative error {err:.3e}"


@requires_cuda
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("cin", [3, 16, 40])
def test_fused_kernel_accuracy_against_eager_autocast(dtype, cin):
    x, w, b, m = make_random(2, cin, 20, (4, 5, 6), torch.float32, "cuda", mult="mixed")
    with torch.autocast("cuda", dtype=dtype):
        want = eager_chain(x, w, b, m)
        out = fused(x, w, b, m)
    ref = eager_chain(*(t.double().cpu() for t in (x, w, b, m)))
    assert rel(out, ref) <= 1.5 * rel(want, ref) + 2 * torch.finfo(dtype).eps


@pytest.mark.parametrize("device,dtype", PARAMS)
def test_opcheck_mixed_form(device, dtype):
    x, w, b, m = make_random(1, 4, 6, (2, 3, 2), dtype, device)
    m = m.float()
    for t in (x, w, b, m):
        t.requires_grad_()
    for op in (OPS.conv_transpose3d_post_pool.default, OPS.conv_transpose3d_post_pool_with_offsets.default):
        result = torch.library.opcheck(op, kb_args(x, w, b, m, 0.2, 0.2))
        assert all(v == "SUCCESS" for v in result.values()), result
    out, selected, offsets = OPS.conv_transpose3d_post_pool_with_offsets(
        *kb_args(x.detach(), w.detach(), b.detach(), m.detach(), 0.2, 0.2))
    result = torch.library.opcheck(OPS._conv_transpose3d_post_pool_grad_conv.default,
                                   (torch.randn_like(out), selected, offsets, m.detach(), 0.2, None))
    assert all(v == "SUCCESS" for v in result.values()), result
