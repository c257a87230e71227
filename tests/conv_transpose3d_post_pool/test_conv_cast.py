"""fused._conv_transpose3d_post_pool_cast: the fused convolution on float32 operands cast to float16/bfloat16, which
torch.autocast's kernel for the op calls where no gradient is recorded. Its contract is the op on the operands cast
by Tensor.to (bit for bit: the sm_90a kernel rounds them as it loads them, elsewhere the op casts first); eager
autocast's chain is the reference on integer data, where every step is exact. Also: what a call under autocast
launches (no cast kernels), its gradients, opcheck, and compiled graphs under autocast."""
import math

import pytest
import torch

import torch_fused_ops
from conv_testing import HALF, OPS, kb_args, make_ints, poison, requires_cuda
from test_conv_autocast import eager_chain, fused

CAST = OPS._conv_transpose3d_post_pool_cast

PARAMS = [pytest.param("cpu", torch.bfloat16, id="cpu-bf16"), pytest.param("cpu", torch.float16, id="cpu-fp16")] + [
    pytest.param("cuda", t, id=f"cuda-{str(t).removeprefix('torch.')}", marks=requires_cuda) for t in HALF]
# The fused convolution's forward kernel switch (torch_fused_ops._C._conv_forward_kernel): auto, the sm_90a kernel
# forced (which rounds the operands itself at every size), the mma.sync kernel forced (the op casts first).
KERNELS = {"auto": 0, "wgmma": 2, "mma_sync": 1}


def _wgmma_available():
    from torch_fused_ops import _C

    return _C._conv_wgmma_built() and torch.cuda.get_device_capability() == (9, 0)


@pytest.fixture(params=list(KERNELS))
def kernel(request):
    from torch_fused_ops import _C

    if request.param == "wgmma" and not _wgmma_available():
        pytest.skip("the sm_90a kernel needs a build for 9.0a and a compute capability 9.0 GPU")
    prev = _C._conv_forward_kernel(KERNELS[request.param])
    yield request.param
    _C._conv_forward_kernel(prev)


def cast_args(x, w, b, dtype, m, s1=0.2, s2=0.2, op=(1, 1, 1)):
    a = kb_args(x, w, b, m, s1, s2, op)
    return (*a[:3], dtype, *a[3:])


def cast_then_op(x, w, b, dtype, m, s1=0.2, s2=0.2, op=(1, 1, 1)):
    c = lambda t: None if t is None else t.to(dtype)  # noqa: E731
    return OPS.conv_transpose3d_post_pool(*kb_args(c(x), c(w), c(b), m, s1, s2, op))


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride() and bool(
        ((a == b) | (a.isnan() & b.isnan())).all())


def hard_values(shape, dtype, gen, scale=1.0):
    """Random float32 values with what rounding to `dtype` must get right: ties to even, values past float16's
    range (infinity after the cast), float16 subnormals, NaN and infinities."""
    t = torch.randn(shape, generator=gen) * scale
    flat = t.view(-1)
    n = flat.numel()
    idx = torch.randperm(n, generator=gen)
    k = max(n // 50, 1)
    # Halfway between two bfloat16 (and two float16) neighbours of 1: ties.
    flat[idx[:k]] = 1.0 + 2.0 ** -9 if dtype == torch.bfloat16 else 1.0 + 2.0 ** -11
    flat[idx[k:2 * k]] = 7.0e4                     # past float16's max (65504)
    flat[idx[2 * k:3 * k]] = 3.0e-6                # a float16 subnormal
    flat[idx[3 * k:3 * k + 1]] = float("inf")
    flat[idx[3 * k + 1:3 * k + 2]] = float("nan")
    flat[idx[3 * k + 2:3 * k + 3]] = -float("inf")
    return t


# (n, cin, cout, (d, h, w)): W a multiple of 4 (16-byte rows of float32) and not, channel tails, Cout past a block.
SIZES = [(2, 16, 32, (3, 5, 8)), (1, 3, 33, (2, 4, 7)), (2, 12, 7, (3, 3, 12))]


@requires_cuda
@pytest.mark.parametrize("dtype", HALF, ids=["bf16", "fp16"])
@pytest.mark.parametrize("size", SIZES, ids=lambda s: "x".join(map(str, [s[0], s[1], s[2], *s[3]])))
@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "strided"])
@pytest.mark.parametrize("specials", [False, True], ids=["finite", "specials"])
def test_cuda_equals_cast_then_op(kernel, dtype, size, layout, specials):
    n, cin, cout, dhw = size
    gen = torch.Generator().manual_seed(hash((cin, cout, layout, specials)) % 1000)
    if specials:
        x = hard_values((n, cin, *dhw), dtype, gen)
    else:
        x = torch.randn(n, cin, *dhw, generator=gen)
    w = torch.randn(cin, cout, 3, 3, 3, generator=gen) / math.sqrt(cin * 8)
    b = torch.randn(cout, generator=gen)
    m = torch.randn(cout, 1, 1, 1, generator=gen)
    m[::3] = -m[::3].abs()
    x, w, b, m = (t.cuda() for t in (x, w, b, m))
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last_3d)
    elif layout == "strided":  # a view with a w stride of 2
        x = torch.cat([x, x], dim=-1)[..., ::2]
    for bias in (b, None):
        want = cast_then_op(x, w, bias, dtype, m, 0.2, -0.7)
        poison(want.shape, torch.float32, "cuda")
        got = CAST(*cast_args(x, w, bias, dtype, m, 0.2, -0.7))
        assert got.dtype == torch.float32
        assert same(got, want), (got - want).abs().nan_to_num().max()


@requires_cuda
@pytest.mark.parametrize("dtype", HALF, ids=["bf16", "fp16"])
def test_cuda_nonfinite_weights_after_rounding(kernel, dtype):
    # A weight past float16's range is infinite once rounded: the kernel's border fix-up must see the rounded value.
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 8, 3, 4, 8, generator=gen).cuda()
    w = (torch.randn(8, 16, 3, 3, 3, generator=gen) * 0.1).cuda()
    w[2, 3, 0, 0, 0] = 1.0e5
    w[5, 7, 2, 1, 0] = float("nan")
    b = torch.randn(16, generator=gen).cuda()
    m = torch.randn(16, 1, 1, 1, generator=gen).cuda()
    for op in ((1, 1, 1), (0, 0, 0)):
        want = cast_then_op(x, w, b, dtype, m, 0.1, 0.1, op)
        poison(want.shape, torch.float32, "cuda")
        got = CAST(*cast_args(x, w, b, dtype, m, 0.1, 0.1, op))
        assert same(got, want)


@pytest.mark.parametrize("device,dtype", PARAMS)
def test_equals_eager_autocast_on_integer_data(device, dtype):
    # Integer data: the convolution is exact in both dtypes, so eager autocast's chain is the bit-exact reference.
    x, w, b, m = make_ints(2, 6, 9, (3, 4, 8), torch.float32, device)
    with torch.autocast(device, dtype=dtype):
        want = eager_chain(x, w, b, m, 0.25, 0.5)
    got = CAST(*cast_args(x, w, b, dtype, m, 0.25, 0.5))
    assert got.dtype == want.dtype == torch.float32
    assert torch.equal(got, want)


@pytest.mark.parametrize("device,dtype", PARAMS)
def test_zero_dim_multiplier_and_other_dtypes(device, dtype):
    # A 0-dim multiplier (autocast casts it): output in dtype. Operands already in dtype, or float64: cast as .to.
    x, w, b, m = make_ints(1, 3, 5, (2, 3, 4), torch.float32, device)
    m0 = torch.tensor(-1.5, device=device, dtype=dtype)
    got = CAST(*cast_args(x, w, b, dtype, m0))
    assert got.dtype == dtype and torch.equal(got, cast_then_op(x, w, b, dtype, m0))
    for t in (torch.float64, dtype):
        got = CAST(*cast_args(x.to(t), w.to(t), b.to(t), dtype, m))
        assert torch.equal(got, cast_then_op(x, w, b, dtype, m))


@pytest.mark.parametrize("device,dtype", PARAMS)
def test_errors_name_the_op(device, dtype):
    x, w, b, m = make_ints(1, 3, 5, (2, 3, 4), torch.float32, device)
    with pytest.raises((RuntimeError, ValueError), match="conv_transpose3d_post_pool"):
        CAST(*cast_args(x, w[:2], b, dtype, m))
    with pytest.raises((RuntimeError, ValueError), match="conv_transpose3d_post_pool"):
        CAST(*cast_args(x, w, b[:3], dtype, m))


@pytest.mark.parametrize("device,dtype", PARAMS)
def test_gradients_through_the_casts(device, dtype):
    # A call that records a gradient casts with differentiable casts: the same graph as casting by hand.
    x, w, b, m = make_ints(2, 4, 6, (3, 3, 4), torch.float32, device)
    g = torch.randint(-2, 3, (2, 6, 3, 3, 4), generator=torch.Generator().manual_seed(1)).float().to(device)

    def grads(fn):
        leaves = [t.detach().requires_grad_() for t in (x, w, b, m)]
        out = fn(*leaves)
        out.backward(g)
        return out.detach(), [t.grad for t in leaves]

    got_out, got = grads(lambda *a: CAST(*cast_args(a[0], a[1], a[2], dtype, a[3], 0.25, 0.5)))
    want_out, want = grads(lambda *a: cast_then_op(a[0], a[1], a[2], dtype, a[3], 0.25, 0.5))
    assert torch.equal(got_out, want_out)
    for a, e in zip(got, want):
        assert a.dtype == e.dtype == torch.float32
        assert torch.equal(a, e)


@pytest.mark.parametrize("device,dtype", PARAMS)
def test_opcheck(device, dtype):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(1, 4, 2, 3, 4, generator=gen).to(device)
    w = torch.randn(4, 6, 3, 3, 3, generator=gen).to(device) * 0.2
    b = torch.randn(6, generator=gen).to(device)
    m = torch.randn(6, 1, 1, 1, generator=gen).to(device)
    xs = [x, x.contiguous(memory_format=torch.channels_last_3d)]
    for xi in xs:
        for grad in (False, True):
            args = [t.detach().clone().requires_grad_(grad) for t in (xi, w, b, m)]
            result = torch.library.opcheck(CAST.default, cast_args(args[0], args[1], args[2], dtype, args[3]))
            assert all(v == "SUCCESS" for v in result.values()), result


@pytest.mark.parametrize("device,dtype", PARAMS)
def test_autocast_without_grad_calls_the_cast_op(device, dtype):
    # Under autocast, a call that records no gradient reaches the cast op with the float32 operands; one that does
    # keeps the casts in the autograd graph.
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    x, w, b, m = make_ints(1, 3, 5, (2, 3, 4), torch.float32, device)
    with torch.no_grad(), torch.autocast(device, dtype=dtype), Seen() as seen:
        out = fused(x, w, b, m)
    assert "fused._conv_transpose3d_post_pool_cast.default" in seen.ops
    assert not any("_to_copy" in o for o in seen.ops), seen.ops
    with torch.autocast(device, dtype=dtype):
        want = eager_chain(x, w, b, m)
    assert torch.equal(out, want)
    wg = w.clone().requires_grad_()
    with torch.autocast(device, dtype=dtype), Seen() as seen:
        fused(x, wg, b, m)
    assert "fused._conv_transpose3d_post_pool_cast.default" not in seen.ops


@requires_cuda
@pytest.mark.parametrize("dtype", HALF, ids=["bf16", "fp16"])
def test_autocast_call_launches_one_kernel(dtype):
    if not _wgmma_available():
        pytest.skip("the operands are rounded in the kernel by the sm_90a kernel only")
    from torch_fused_ops import _C

    x, w, b, m = make_ints(2, 16, 32, (4, 6, 8), torch.float32, "cuda")
    prev = _C._conv_forward_kernel(2)
    try:
        with torch.no_grad(), torch.autocast("cuda", dtype=dtype):
            fused(x, w, b, m)
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                fused(x, w, b, m)
                torch.cuda.synchronize()
    finally:
        _C._conv_forward_kernel(prev)
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert len(kernels) == 1 and "hopper" in kernels[0], kernels


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_cuda)])
def test_compiled_autocast_inference_has_no_casts(device, monkeypatch):
    from torch._inductor.utils import run_and_get_code
    from torch_fused_ops.compile import pass_config
    from torch_fused_ops.models import ConvTransposeLeakyMulLeakyPool

    monkeypatch.setattr(pass_config, "_current", pass_config.current().replace(fuse_conv_transpose="always"))
    torch.manual_seed(0)
    model = ConvTransposeLeakyMulLeakyPool(in_channels=4, out_channels=6, multiplier_shape=(6, 1, 1, 1)).to(device)
    x = torch.randint(-2, 3, (2, 4, 3, 4, 8), device=device).float()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randint(-1, 2, p.shape) * 0.5)
        with torch.autocast(device, dtype=torch.bfloat16):
            want = model(x)
        torch._dynamo.reset()
        compiled = torch.compile(model)
        with torch.autocast(device, dtype=torch.bfloat16):
            out, codes = run_and_get_code(compiled, x)
    code = "\n".join(codes)
    assert "fused._conv_transpose3d_post_pool_cast" in code
    assert "_to_copy" not in code and "convert_element_type" not in code, code
    assert torch.equal(out, want)
    assert torch_fused_ops.matched_count() > 0
