"""The fused transposed-convolution CUDA kernel (csrc/conv_transpose3d_post_pool/cuda/), through the operators
fused::conv_transpose3d_post_pool and fused::conv_transpose3d_post_pool_with_offsets.

Two kinds of reference, both eager:
- integer data: every convolution value is a small integer, exact in float32/TF32/bf16/fp16 and in any summation
  order, so the kernel must reproduce eager's float32 chain (conv -> leaky -> x m -> leaky -> max_pool3d with
  indices) bit for bit: out, selected and offsets (ties keep the first tap, the last NaN wins, all -inf windows
  report offset 0). Half precision rounds the conv value to the I/O dtype and runs the epilogue in float32.
- random data: relative L2 error against float64, bounded by cuDNN's own error for that precision.
"""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# TORCH_FUSED_OPS_CONV_KERNEL_DEV=1 runs these tests on the kernel alone, built by the packaged harness
# (torch_fused_ops.tools.harness: the binding in benchmarks/conv_transpose3d_post_pool/ with the kernel's sources from
# csrc/, for kernel work without rebuilding the extension); otherwise through the operators.
_DEV = os.environ.get("TORCH_FUSED_OPS_CONV_KERNEL_DEV", "0") == "1"
_dev_ext = None
if torch.cuda.is_available():
    if _DEV:
        from torch_fused_ops.tools import harness

        _dev_ext = harness.build("conv_transpose3d_post_pool_forward")
    else:
        import torch_fused_ops  # noqa: F401  (registers torch.ops.fused.*)

# Every test runs on each forward kernel: the launcher's own choice (auto) and the sm_90a wgmma kernel forced
# wherever it can run (csrc/conv_transpose3d_post_pool/hopper/; auto takes it wherever it can run too, so on an
# H200 the two parameters cover the same kernel and the mma.sync kernel is compared against explicitly).
KERNELS = {"auto": 0, "wgmma": 2}


def _wgmma_available() -> bool:
    from torch_fused_ops import _C

    return _dev_ext is None and _C._conv_wgmma_built() and torch.cuda.get_device_capability() == (9, 0)


@pytest.fixture(autouse=True, params=list(KERNELS))
def forward_kernel(request):
    if request.param == "wgmma" and not _wgmma_available():
        pytest.skip("the sm_90a kernel needs a build for 9.0a and a compute capability 9.0 GPU")
    if _dev_ext is not None:
        yield request.param
        return
    from torch_fused_ops import _C

    prev = _C._conv_forward_kernel(KERNELS[request.param])
    yield request.param
    _C._conv_forward_kernel(prev)


PRECS = {"tf32": (torch.float32, True), "fp32": (torch.float32, False), "bf16": (torch.bfloat16, True),
         "fp16": (torch.float16, True)}


@pytest.fixture
def tf32_setting():
    old = torch.backends.cudnn.allow_tf32
    yield lambda v: setattr(torch.backends.cudnn, "allow_tf32", v)
    torch.backends.cudnn.allow_tf32 = old


def fused(x, w, b, m, s1, s2, op, train):
    if _dev_ext is not None:
        cl = x.is_contiguous(memory_format=torch.channels_last_3d) and not x.is_contiguous()
        return tuple(_dev_ext.run(x, w, b, m, s1, s2, list(op), torch.backends.cudnn.allow_tf32, train, cl, 0))
    args = (x, w, b, [2, 2, 2], [1, 1, 1], list(op), 1, [1, 1, 1], m, s1, [2, 2, 2], [], [0, 0, 0], [1, 1, 1],
            False, s2)
    if train:
        return torch.ops.fused.conv_transpose3d_post_pool_with_offsets(*args)
    return (torch.ops.fused.conv_transpose3d_post_pool(*args),)


def wgmma_and_mma_sync(x, w, b, m, train, split):
    """fused(...) run by the sm_90a kernel with work split `split` (_C._conv_hopper_split: 1 units, 2 halves), then by
    the mma.sync kernel: the two results, each a tuple as fused returns it."""
    from torch_fused_ops import _C

    outs = []
    for choice, split_choice in ((2, split), (1, 0)):
        prev, prev_split = _C._conv_forward_kernel(choice), _C._conv_hopper_split(split_choice)
        try:
            outs.append(fused(x, w, b, m, 0.2, 0.3, (1, 1, 1), train))
        finally:
            _C._conv_forward_kernel(prev)
            _C._conv_hopper_split(prev_split)
    return outs


def conv64(x, w, b, op):
    return F.conv_transpose3d(x.double(), w.double(), None if b is None else b.double(), stride=2, padding=1,
                              output_padding=tuple(op))


def pool_chain(y, m, s1, s2):
    e = F.leaky_relu(F.leaky_relu(y, s1) * m.to(y.dtype).reshape(1, -1, 1, 1, 1), s2)
    out, idx = F.max_pool3d(e, 2, 2, return_indices=True)
    sel = y.flatten(2).gather(2, idx.flatten(2)).view_as(out)
    OH, OW = y.shape[3], y.shape[4]
    od, oh, ow = idx // (OH * OW), (idx // OW) % OH, idx % OW
    return out, sel, (((od % 2) * 2 + oh % 2) * 2 + ow % 2).to(torch.uint8)


def same(a, b):
    a, b = a.double(), b.double()
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


def make(shape, dtype, ints, cl=False, bias=True, mult="chan", seed=0):
    N, Cin, Cout, D, H, W = shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    if ints:
        x = torch.randint(-3, 4, (N, Cin, D, H, W), generator=g, device="cuda").to(dtype)
        w = torch.randint(-2, 3, (Cin, Cout, 3, 3, 3), generator=g, device="cuda").to(dtype)
        b = torch.randint(-2, 3, (Cout,), generator=g, device="cuda").to(dtype) if bias else None
        m = torch.randint(-2, 3, (Cout,), generator=g, device="cuda").to(dtype) * 0.5
    else:
        x = torch.randn((N, Cin, D, H, W), generator=g, device="cuda").to(dtype)
        w = (torch.randn((Cin, Cout, 3, 3, 3), generator=g, device="cuda") / (27 * max(Cin, 1)) ** 0.5).to(dtype)
        b = (torch.randn((Cout,), generator=g, device="cuda") * 0.1).to(dtype) if bias else None
        m = torch.randn((Cout,), generator=g, device="cuda").to(dtype)
    # tiny / huge: |m| outside the sm_90a kernel's 16-bit training selection's range (hopper/epilogue.cuh,
    # pair_scale_ok), both signs: the kernel must take its exact selection there.
    sign = torch.where(torch.arange(Cout, device="cuda") % 2 == 0, 1.0, -1.0).to(dtype)
    m = {"chan": m, "pos": m.abs() + 0.5, "neg": -(m.abs() + 0.5), "one": m[:1],
         "tiny": (m.abs() + 0.5) * sign * 2.0 ** -30, "huge": (m.abs() + 0.5) * sign * 2.0 ** 30}[mult]
    m = m.reshape(-1, 1, 1, 1).contiguous()
    if cl:
        x = x.contiguous(memory_format=torch.channels_last_3d)
        w = w.contiguous(memory_format=torch.channels_last_3d)
    return x, w, b, m


def check_exact(prec, shape, op, tf32_setting, s1=0.1, s2=0.2, train=True, cl=False, mult="chan", bias=True,
                neg_inf=False, seed=0, x_scale=1.0):
    dtype, tf32 = PRECS[prec]
    tf32_setting(tf32)
    x, w, b, m = make(shape, dtype, True, cl=cl, bias=bias, mult=mult, seed=seed)
    if x_scale != 1.0:  # a power of two: the convolution values stay exact
        x, b = x * x_scale, None if b is None else b * x_scale
    if neg_inf:
        w, x = w.abs() + 1, x.clone()
        x.view(-1)[::7] = float("-inf")
        b = None if b is None else b.abs()
    res = fused(x, w, b, m, s1, s2, op, train)
    y = conv64(x, w, b, op).to(dtype).float()
    ref_out, ref_sel, ref_off = pool_chain(y, m.float(), s1, s2)
    assert res[0].shape == ref_out.shape and res[0].dtype == dtype
    assert same(res[0], ref_out.to(dtype))
    if cl:
        assert res[0].is_contiguous(memory_format=torch.channels_last_3d)
    if train:
        assert same(res[1], ref_sel.to(dtype))
        assert torch.equal(res[2], ref_off)


@pytest.mark.parametrize("prec", list(PRECS))
@pytest.mark.parametrize("op", [(1, 1, 1), (0, 0, 0), (1, 0, 1), (0, 1, 0)])
@pytest.mark.parametrize("train", [True, False])
def test_exact_output_padding(prec, op, train, tf32_setting):
    check_exact(prec, (2, 3, 5, 5, 7, 9), op, tf32_setting, train=train)


@pytest.mark.parametrize("prec", list(PRECS))
@pytest.mark.parametrize("train", [True, False])
def test_exact_channels_last(prec, train, tf32_setting):
    check_exact(prec, (2, 3, 5, 5, 7, 9), (1, 0, 1), tf32_setting, train=train, cl=True)


@pytest.mark.parametrize("prec", list(PRECS))
@pytest.mark.parametrize("s1,s2", [(-0.5, 0.3), (0.0, 0.0), (1e-50, 0.2), (0.2, 1.5), (1.0, 1.0), (1.5, 0.25)])
def test_exact_slopes(prec, s1, s2, tf32_setting):
    # 1e-50 is 0.0 in float32: the kernel must not take the monotone form for it.
    check_exact(prec, (2, 3, 5, 5, 7, 9), (1, 1, 1), tf32_setting, s1=s1, s2=s2, train=False)
    check_exact(prec, (2, 3, 5, 5, 7, 9), (1, 1, 1), tf32_setting, s1=s1, s2=s2, train=True)


@pytest.mark.parametrize("prec", list(PRECS))
@pytest.mark.parametrize("mult", ["pos", "neg"])
def test_exact_merged_activations(prec, mult, tf32_setting):
    # A first slope of 2^-149 (the smallest subnormal) makes the activation merge neighbouring negative integers
    # (-3 and -4 times a multiplier of 0.5 both round to -2^-148; -1 to -0, which ties with 0's +0), so the first
    # maximum of the activated window is not the first maximum of the convolution value: the training form's
    # monotone shortcut must notice and select as max_pool3d does.
    check_exact(prec, (2, 3, 5, 5, 7, 9), (1, 1, 1), tf32_setting, s1=1.4e-45, s2=1.0, train=True, mult=mult)
    check_exact(prec, (2, 3, 5, 5, 7, 9), (1, 1, 1), tf32_setting, s1=1.4e-45, s2=1.0, train=False, mult=mult)


@pytest.mark.parametrize("prec", list(PRECS))
@pytest.mark.parametrize("mult,bias", [("neg", True), ("pos", False), ("one", True), ("one", False)])
@pytest.mark.parametrize("train", [True, False])
def test_exact_multipliers(prec, mult, bias, train, tf32_setting):
    check_exact(prec, (2, 3, 5, 5, 7, 9), (1, 1, 1), tf32_setting, mult=mult, bias=bias, train=train)


@pytest.mark.parametrize("prec", ["tf32", "fp32", "bf16"])
@pytest.mark.parametrize("mult", ["tiny", "huge"])
@pytest.mark.parametrize("train", [True, False])
def test_exact_extreme_multipliers(prec, mult, train, tf32_setting):
    check_exact(prec, (2, 3, 5, 5, 7, 9), (1, 1, 1), tf32_setting, mult=mult, train=train)


@pytest.mark.parametrize("prec", ["tf32", "fp32", "bf16"])
@pytest.mark.parametrize("x_scale", [2.0 ** -45, 2.0 ** 98])
@pytest.mark.parametrize("mult", ["pos", "neg", "chan"])
def test_exact_value_scales(prec, x_scale, mult, tf32_setting):
    # Convolution values near bfloat16's extremes, outside the 16-bit training selection's range (hopper/epilogue.cuh,
    # kPairMinY / kPairMaxY) for some outputs and inside it for others.
    check_exact(prec, (2, 3, 5, 5, 7, 9), (1, 1, 1), tf32_setting, mult=mult, train=True, x_scale=x_scale)


@pytest.mark.parametrize("prec", list(PRECS))
@pytest.mark.parametrize("train,mult", [(True, "chan"), (False, "pos"), (False, "chan")])
def test_exact_minus_inf_windows(prec, train, mult, tf32_setting):
    check_exact(prec, (2, 3, 5, 5, 7, 9), (1, 1, 1), tf32_setting, train=train, mult=mult, neg_inf=True)


@pytest.mark.parametrize("prec", list(PRECS))
@pytest.mark.parametrize("cin,cout", [(1, 3), (3, 1), (17, 33), (33, 17), (64, 64), (128, 128), (16, 32)])
def test_exact_channel_tails(prec, cin, cout, tf32_setting):
    check_exact(prec, (1, cin, cout, 3, 4, 5), (1, 0, 1), tf32_setting, train=cin % 2 == 1)


@pytest.mark.parametrize("prec", list(PRECS))
@pytest.mark.parametrize("shape,op", [((2, 4, 6, 1, 1, 1), (1, 1, 1)), ((1, 4, 6, 2, 1, 3), (1, 1, 0)),
                                      ((1, 16, 32, 9, 9, 17), (1, 1, 1)), ((3, 16, 32, 9, 33, 17), (0, 1, 1))])
def test_exact_spatial_sizes(prec, shape, op, tf32_setting):
    check_exact(prec, shape, op, tf32_setting, train=True)
    check_exact(prec, shape, op, tf32_setting, train=False, mult="pos")


@pytest.mark.parametrize("prec", list(PRECS))
def test_empty(prec, tf32_setting):
    dtype, tf32 = PRECS[prec]
    tf32_setting(tf32)
    x, w, b, m = make((0, 4, 6, 3, 3, 3), dtype, False)
    for train in (False, True):
        res = fused(x, w, b, m, 0.1, 0.1, (1, 1, 1), train)
        assert res[0].shape == (0, 6, 3, 3, 3)


@pytest.mark.parametrize("prec", list(PRECS))
@pytest.mark.parametrize("train", [False, True])
def test_random_accuracy_against_cudnn(prec, train, tf32_setting):
    # KernelBench level 2 problem 74's size at batch 2.
    dtype, tf32 = PRECS[prec]
    tf32_setting(tf32)
    x, w, b, m = make((2, 16, 32, 16, 32, 32), dtype, False, seed=3)
    s1, s2, op = 0.01, 0.01, (1, 1, 1)
    ref_out, _, ref_off = pool_chain(conv64(x, w, b, op), m.double(), s1, s2)
    res = fused(x, w, b, m, s1, s2, op, train)
    err = ((res[0].double() - ref_out).norm() / ref_out.norm()).item()
    y = F.conv_transpose3d(x, w, b, stride=2, padding=1, output_padding=op)
    cud = pool_chain(y, m, s1, s2)[0]
    cud_err = ((cud.double() - ref_out).norm() / ref_out.norm()).item()
    bound = {"tf32": 1.5 * cud_err, "fp32": 1e-6, "bf16": 2 * cud_err, "fp16": 2 * cud_err}[prec]
    assert err <= bound, (err, cud_err)
    if train:
        assert bool((res[2] <= 7).all())
        agree = (res[2] == ref_off).double().mean().item()
        assert agree > (0.97 if dtype == torch.float32 else 0.8)


@pytest.mark.parametrize("prec", list(PRECS))
@pytest.mark.parametrize("where", ["x", "w"])
@pytest.mark.parametrize("train", [False, True])
def test_nonfinite_propagate_as_the_convolution(prec, where, train, tf32_setting):
    dtype, tf32 = PRECS[prec]
    tf32_setting(tf32)
    x, w, b, m = make((2, 6, 10, 5, 6, 7), dtype, False, mult="pos", seed=4)
    if where == "x":
        x = x.clone()
        x.view(-1)[::101] = float("nan")
        x.view(-1)[3::211] = float("inf")
        x.view(-1)[5::307] = float("-inf")
    else:
        # k = 0 taps meet the missing neighbour of the last window (output_padding 1): the convolution has no
        # term there, so an infinite weight must not turn those outputs into NaN.
        w = w.clone()
        w[0, 0, 0, 1, 1] = float("inf")
        w[1, 1, 1, 0, 2] = float("nan")
    res = fused(x, w, b, m, 0.01, 0.01, (1, 1, 1), train)
    ref = pool_chain(conv64(x, w, b, (1, 1, 1)), m.double(), 0.01, 0.01)[0]
    out = res[0].double()
    assert torch.equal(out.isnan(), ref.isnan())
    assert torch.equal(out[ref.isinf()], ref[ref.isinf()])
    fin = ref.isfinite()
    tol = {"tf32": 3e-3, "fp32": 1e-6, "bf16": 2e-2, "fp16": 4e-3}[prec]
    assert ((out[fin] - ref[fin]).norm() / ref[fin].norm()).item() <= tol


@pytest.mark.parametrize("train", [True, False])
def test_strict_unsafe_weight_block_stages_before_it_computes(train, tf32_setting):
    """Strict float32 with a weight the exact split cannot take (|w| >= 2^127, finite) switches the block to the
    general split, which must still give eager's values: with integer data every channel whose convolution does not
    involve the large weight equals eager's float32 chain bit for bit. This path also decides, at the barrier after
    staging, whether the tile takes the simpler split: without that barrier warps read a half-staged halo, which
    compute-sanitizer racecheck on this test shows every time and a plain run only when the timing goes wrong."""
    tf32_setting(False)
    x, w, b, m = make((4, 16, 32, 8, 16, 16), torch.float32, True, seed=7)
    w = w.clone()
    w[0, 0, 1, 1, 1] = 2.0 ** 127
    x = x.clone()
    x[:, 0] = x[:, 0].clamp(-1, 1)  # keeps channel 0's sums finite
    res = fused(x, w, b, m, 0.1, 0.2, (1, 1, 1), train)
    y = conv64(x, w, b, (1, 1, 1)).float()
    ref_out, ref_sel, ref_off = pool_chain(y, m.float(), 0.1, 0.2)
    assert same(res[0][:, 1:], ref_out[:, 1:])
    assert bool(res[0][:, :1].isfinite().all())
    if train:
        assert same(res[1][:, 1:], ref_sel[:, 1:])
        assert torch.equal(res[2][:, 1:], ref_off[:, 1:])


def test_cuda_graph_replay_and_no_sync(tf32_setting):
    tf32_setting(True)
    x, w, b, m = make((2, 16, 32, 8, 16, 16), torch.float32, False, seed=5)
    expected = fused(x, w, b, m, 0.01, 0.01, (1, 1, 1), True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        again = fused(x, w, b, m, 0.01, 0.01, (1, 1, 1), True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fused(x, w, b, m, 0.01, 0.01, (1, 1, 1), False)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        captured = fused(x, w, b, m, 0.01, 0.01, (1, 1, 1), False)[0]
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(fused(x, w, b, m, 0.01, 0.01, (1, 1, 1), False)[0], captured)
    for a, e in zip(again, expected):
        assert torch.equal(a, e) or same(a, e)


@pytest.mark.parametrize("batch", [1, 16])
def test_which_kernel_runs(forward_kernel, batch, tf32_setting):
    """The switch picks the kernel it names: wgmma forced runs the sm_90a kernel at any size; auto runs it at the
    KernelBench size, batch 16 and batch 1 (there by half units), strict float32's inference form included; strict
    float32's training form runs mma.sync."""
    if not _wgmma_available():
        pytest.skip("the sm_90a kernel needs a build for 9.0a and a compute capability 9.0 GPU")
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(batch, 16, 16, 32, 32, device="cuda", generator=g)
    w = torch.randn(16, 32, 3, 3, 3, device="cuda", generator=g)
    m = torch.randn(32, 1, 1, 1, device="cuda", generator=g)

    def kernels(allow_tf32, train=False):
        tf32_setting(allow_tf32)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fused(x, w, None, m, 0.2, 0.2, (1, 1, 1), train)
            torch.cuda.synchronize()
        return [e.name for e in prof.events() if "conv_transpose3d_post_pool" in e.name]

    for allow_tf32 in (True, False):
        names = kernels(allow_tf32)
        assert names, "no fused kernel ran"
        assert all("hopper" in n for n in names), names
    strict_train = kernels(False, train=True)
    assert strict_train and not any("hopper" in n for n in strict_train), "strict training has no wgmma form"


@pytest.mark.parametrize("prec", ["tf32", "bf16", "fp16", "mixed", "strict"])
@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("cin,cout,shape,op", [(16, 32, (2, 6, 9, 37), (1, 0, 1)), (3, 5, (1, 4, 17, 8), (0, 1, 1)),
                                               (9, 33, (3, 3, 8, 40), (1, 1, 0)), (5, 40, (2, 5, 7, 24), (1, 1, 1)),
                                               (16, 64, (2, 4, 16, 32), (1, 1, 1))])
def test_wgmma_equals_mma_sync(forward_kernel, prec, train, cin, cout, shape, op, tf32_setting):
    """The two kernels sum each phase's taps in the same order (shift by shift, k-steps within; strict float32: the
    same three products per k-step into a fresh accumulator, then IEEE adds), so on random data they agree bit for
    bit: outputs, selected values and offsets, with NaN where both have NaN. The last shape's pooled planes are whole
    units (16 x 32) and its channel blocks full, so the TF32 training and 16-bit forms (not the mixed ones) store
    whole tiles through shared memory's rows."""
    if forward_kernel != "wgmma":
        pytest.skip("compares the kernels once, under the wgmma parameter")
    if prec == "strict" and train:
        pytest.skip("strict float32's training form runs the mma.sync kernel under either choice")
    from torch_fused_ops import _C

    tf32_setting(prec != "strict")
    dt = torch.float32 if prec in ("tf32", "strict") else (torch.float16 if prec == "fp16" else torch.bfloat16)
    g = torch.Generator(device="cuda").manual_seed(cin * 100 + cout)
    n, d, h, w_ = shape
    x = torch.randn(n, cin, d, h, w_, device="cuda", generator=g).to(dt)
    x[0, 0, 1, 2, 3] = float("inf")
    w = (torch.randn(cin, cout, 3, 3, 3, device="cuda", generator=g) / (cin * 27) ** 0.5).to(dt)
    b = torch.randn(cout, device="cuda", generator=g).to(dt)
    m = torch.randn(cout, 1, 1, 1, device="cuda", generator=g)
    m = m if prec == "mixed" else m.to(dt)
    outs = []
    for choice in (2, 1):
        prev = _C._conv_forward_kernel(choice)
        try:
            outs.append(fused(x, w, b, m, 0.2, 0.2, op, train))
        finally:
            _C._conv_forward_kernel(prev)
    for a, ref in zip(*outs):
        torch.testing.assert_close(a, ref, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("prec", ["tf32", "bf16", "fp16"])
@pytest.mark.parametrize("bias", [False, True])
def test_wgmma_zero_signs(forward_kernel, prec, bias, tf32_setting):
    """Integer data with many exact zero sums (and sums cancelling the bias), multipliers of both signs: the training
    form's outputs and selected values equal the mma.sync kernel's bit for bit, a zero's sign included (the sm_90a
    training forms accumulate -S for negative multipliers; y is rounded from S + b and its sign flipped after)."""
    if forward_kernel != "wgmma":
        pytest.skip("compares the kernels once, under the wgmma parameter")
    from torch_fused_ops import _C

    tf32_setting(prec == "tf32")
    dt = {"tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[prec]
    g = torch.Generator(device="cuda").manual_seed(11)
    x = torch.randint(-1, 2, (2, 16, 4, 9, 16), device="cuda", generator=g).to(dt)
    x[0] = 0
    w = torch.randint(-1, 2, (16, 40, 3, 3, 3), device="cuda", generator=g).to(dt)
    b = torch.randint(-2, 3, (40,), device="cuda", generator=g).to(dt) if bias else None
    m = torch.tensor([-1.0, 0.5, -0.25, 2.0] * 10, device="cuda").view(40, 1, 1, 1).to(dt)
    outs = []
    for choice in (2, 1):
        prev = _C._conv_forward_kernel(choice)
        try:
            outs.append(fused(x, w, b, m, 0.2, 0.3, (1, 1, 1), True))
        finally:
            _C._conv_forward_kernel(prev)
    ibits = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
    for a, ref in zip(*outs):
        if a.dtype in ibits:
            assert torch.equal(a.view(ibits[a.dtype]), ref.view(ibits[ref.dtype]))
        else:
            assert torch.equal(a, ref)
    assert (outs[1][1] == 0).any() and (outs[1][1].view(ibits[dt]) == 0).any(), "no +0 selected: the test is void"


@pytest.mark.parametrize("prec", ["tf32", "bf16", "mixed", "strict"])
@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("split", ["units", "halves"])
@pytest.mark.parametrize("shape", [(1, 4, 9, 33), (3, 10, 20, 70)], ids=["few_units", "many_units"])
def test_wgmma_work_split(forward_kernel, prec, train, split, shape, tf32_setting):
    """The sm_90a kernel hands out work by units (a consumer computes a unit's 4 tiles) or by half units (both
    consumers on each, one tile each; auto's choice with fewer units than blocks): either way, with few units per
    block or many (the stage ring wrapping), the mma.sync kernel's outputs, selected values and offsets bit for bit,
    with an infinite input and an infinite weight (whose far-edge outputs are recomputed per stored tile). Strict
    float32: the block holding the infinite weight (channels 32..39) recomputes all its outputs from global memory in
    float32 (no split there), so it matches the mma.sync kernel's non-finite outputs exactly and its finite ones to
    float32 rounding; the other block bit for bit."""
    if forward_kernel != "wgmma":
        pytest.skip("compares the kernels once, under the wgmma parameter")
    if prec == "strict" and train:
        pytest.skip("strict float32's training form runs the mma.sync kernel under either choice")
    tf32_setting(prec != "strict")
    dt = torch.float32 if prec in ("tf32", "strict") else torch.bfloat16
    cin, cout = 5, 40
    n, d, h, w_ = shape
    g = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(n, cin, d, h, w_, device="cuda", generator=g).to(dt)
    x[0, 1, 2, 3, 4] = float("inf")
    w = (torch.randn(cin, cout, 3, 3, 3, device="cuda", generator=g) / (cin * 27) ** 0.5).to(dt)
    w[3, 35, 2, 1, 2] = float("-inf")
    b = torch.randn(cout, device="cuda", generator=g).to(dt)
    m = torch.randn(cout, 1, 1, 1, device="cuda", generator=g)
    m = m if prec == "mixed" else m.to(dt)
    outs = wgmma_and_mma_sync(x, w, b, m, train, {"units": 1, "halves": 2}[split])
    for a, ref in zip(*outs):
        if prec == "strict":
            torch.testing.assert_close(a[:, :32], ref[:, :32], rtol=0, atol=0, equal_nan=True)
            assert torch.equal(a[:, 32:].isnan(), ref[:, 32:].isnan())
            torch.testing.assert_close(a[:, 32:], ref[:, 32:], rtol=1e-5, atol=1e-6, equal_nan=True)
        else:
            torch.testing.assert_close(a, ref, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("prec", ["tf32", "bf16", "fp16", "mixed"])
@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("shape", [(2, 3, 16, 40), (1, 2, 8, 48), (2, 3, 16, 32)],
                         ids=["pooled_w40", "pooled_w48", "pooled_w32"])
@pytest.mark.parametrize("inf_weight", [False, True])
def test_wgmma_whole_tile_rows(forward_kernel, prec, train, shape, inf_weight, tf32_setting):
    """Split by units (a consumer takes a unit's 4 tiles in order), rows aligned and every channel block full, so the
    whole-tile row stores run: the 16-bit forms store an item's tiles two by two where both are whole (the first unit
    of each row of units), one alone where only it is (pooled W 40: the second unit's first tile), and element by
    element past the edge; W 48 pairs the second unit's first two tiles and leaves the rest. Each against the
    mma.sync kernel bit for bit, with an infinite and a NaN input. With pooled W 32 (rows 32 apart) the 16-bit forms
    store whole units through the TMA unit, except in a block that recomputes its far edge (an infinite
    weight: channel block 32..63 here), whose rewrites must follow its stores. The mixed training form (bf16
    operands, a float32 multiplier) stores float32 outputs, 16-bit selected values and offsets through its rows."""
    if forward_kernel != "wgmma":
        pytest.skip("compares the kernels once, under the wgmma parameter")
    tf32_setting(True)
    dt = {"tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "mixed": torch.bfloat16}[prec]
    cin, cout = 16, 64
    n, d, h, w_ = shape
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(n, cin, d, h, w_, device="cuda", generator=g)
    x[0, 1, 1, 3, 4] = float("inf")
    x[-1, 2, 0, 5, w_ - 3] = float("nan")
    x = x.to(dt)
    w = (torch.randn(cin, cout, 3, 3, 3, device="cuda", generator=g) / (cin * 27) ** 0.5).to(dt)
    if inf_weight:
        w[3, 35, 2, 1, 2] = float("-inf")
    b = torch.randn(cout, device="cuda", generator=g).to(dt)
    m = torch.randn(cout, 1, 1, 1, device="cuda", generator=g)
    m = m if prec == "mixed" else m.to(dt)
    outs = wgmma_and_mma_sync(x, w, b, m, train, 1)
    assert outs[0][0].shape[-2:] == (h, w_), "the pooled plane is not the one the docstring describes"
    for a, ref in zip(*outs):
        torch.testing.assert_close(a, ref, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("prec", ["bf16", "fp16"])
@pytest.mark.parametrize("train", [False, True])
def test_wgmma_units_in_turn(forward_kernel, prec, train, tf32_setting):
    """Enough units that each consumer takes several (640 units of pooled 8 x 32 for at most 132 blocks of one
    channel block), pooled W 32 and H 36: each consumer stores whole units through its unit rows and the TMA unit
    (the 16-bit training forms), then reuses those rows for its next unit once the TMA unit has read them, and
    between them meets the partial units of rows 32..35 (element by element). Against the mma.sync kernel bit for
    bit, with an infinite and a NaN input."""
    if forward_kernel != "wgmma":
        pytest.skip("compares the kernels once, under the wgmma parameter")
    tf32_setting(True)
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[prec]
    n, cin, cout, d, h, w_ = 8, 16, 32, 16, 36, 32
    g = torch.Generator(device="cuda").manual_seed(11)
    x = torch.randn(n, cin, d, h, w_, device="cuda", generator=g)
    x[3, 1, 5, 9, 4] = float("inf")
    x[6, 2, 11, 33, 30] = float("nan")
    x = x.to(dt)
    w = (torch.randn(cin, cout, 3, 3, 3, device="cuda", generator=g) / (cin * 27) ** 0.5).to(dt)
    b = torch.randn(cout, device="cuda", generator=g).to(dt)
    m = torch.randn(cout, 1, 1, 1, device="cuda", generator=g).to(dt)
    outs = wgmma_and_mma_sync(x, w, b, m, train, 1)
    assert outs[0][0].shape == (n, cout, d, h, w_), "the pooled shape is not the one the docstring describes"
    for a, ref in zip(*outs):
        torch.testing.assert_close(a, ref, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("prec", ["tf32", "bf16", "mixed"])
@pytest.mark.parametrize("train", [False, True])
def test_wgmma_weight_layouts(forward_kernel, prec, train, tf32_setting):
    """The sm_90a kernel copies a contiguous, 16-byte aligned weight's rows whole (Cout x 27 elements a multiple of
    16 bytes; here 40 channels: a second channel block of 8) and gathers any other weight element by element: the
    same weight values as a contiguous tensor, a channel slice of a wider one and a contiguous view 4 bytes off
    alignment give the mma.sync kernel's outputs, selected values and offsets bit for bit, negative multipliers
    and a non-finite weight included."""
    if forward_kernel != "wgmma":
        pytest.skip("compares the kernels once, under the wgmma parameter")
    from torch_fused_ops import _C

    tf32_setting(True)
    dt = torch.float32 if prec == "tf32" else torch.bfloat16
    cin, cout = 7, 40
    g = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(2, cin, 4, 9, 33, device="cuda", generator=g).to(dt)
    w0 = (torch.randn(cin, cout, 3, 3, 3, device="cuda", generator=g) / (cin * 27) ** 0.5).to(dt)
    w0[2, 37, 1, 0, 2] = float("inf")
    b = torch.randn(cout, device="cuda", generator=g).to(dt)
    m = torch.randn(cout, 1, 1, 1, device="cuda", generator=g)
    m = m if prec == "mixed" else m.to(dt)
    wide = torch.zeros(cin, cout + 3, 3, 3, 3, device="cuda", dtype=dt)
    wide[:, :cout] = w0
    flat = torch.zeros(w0.numel() + 8, device="cuda", dtype=dt)
    off = 4 // w0.element_size()
    flat[off:off + w0.numel()] = w0.flatten()
    layouts = {"contiguous": w0.contiguous(), "channel slice": wide[:, :cout],
               "misaligned": flat[off:off + w0.numel()].view(w0.shape)}
    assert layouts["misaligned"].data_ptr() % 16 != 0 and not layouts["channel slice"].is_contiguous()
    prev = _C._conv_forward_kernel(1)
    try:
        ref = fused(x, w0, b, m, 0.2, 0.3, (1, 1, 1), train)
    finally:
        _C._conv_forward_kernel(prev)
    for name, w in layouts.items():
        prev = _C._conv_forward_kernel(2)
        try:
            got = fused(x, w, b, m, 0.2, 0.3, (1, 1, 1), train)
        finally:
            _C._conv_forward_kernel(prev)
        for a, r in zip(got, ref):
            torch.testing.assert_close(a, r, rtol=0, atol=0, equal_nan=True, msg=lambda s: f"{name}: {s}")
