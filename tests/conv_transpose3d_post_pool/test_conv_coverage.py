"""Where the fused convolution's CUDA kernel applies: conv_transpose3d_post_pool_coverage.fused_kernel_applies, the
fusion pass's copy of the C++ op's choice between its fused CUDA kernel and its composite (argument spellings, each
deviation, fake tensors and symbolic sizes: never raising, never guarding), and on CUDA the op's own choice, seen in
the profiler (the composite calls aten's convolution), with its values against eager."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.profiler import ProfilerActivity, profile

import torch_fused_ops  # noqa: F401  (registers torch.ops.fused)
from torch_fused_ops.ops import common
from torch_fused_ops.ops.conv_transpose3d_post_pool_coverage import fused_kernel_applies
from conv_testing import (CONFIGS, COVERAGE_DEFAULTS, FUSED_CONFIGS, OPS, config_args, coverage_tensors, make_tensors,
                          ran_aten_convolution, reference_config, requires_cuda, symbolic_sizes)
from fused_testing import skip_without_cuda_build

HAS_CUDA = torch.cuda.is_available()


def applies(x, w, **changes):
    return fused_kernel_applies(x, w, **{**COVERAGE_DEFAULTS, **changes})


def test_default_geometry_and_its_spellings():
    x, w = coverage_tensors()
    assert applies(x, w)
    for change in [dict(stride=[2, 2, 2], padding=(1, 1, 1), output_padding=[1, 0, 1], dilation=(1,)),
                   dict(output_padding=0), dict(kernel_size=(2, 2, 2), pool_stride=None), dict(pool_stride=[]),
                   dict(pool_stride=()), dict(pool_padding=[0, 0, 0], pool_dilation=(1, 1, 1)),
                   dict(ceil_mode=True)]:  # ceil_mode with output_padding 1: the floor-mode size
        assert applies(x, w, **change), change
    for dtype in (torch.bfloat16, torch.float16):
        assert applies(*coverage_tensors(dtype=dtype))
    for n, cin, cout, dhw in [(0, 4, 6, (2, 3, 2)), (3, 1, 1, (1, 1, 1)), (2, 33, 128, (5, 7, 3))]:
        assert applies(*coverage_tensors(n=n, cin=cin, cout=cout, dhw=dhw))
    skip_without_cuda_build("the layouts' part")  # (everything above ran)
    with FakeTensorMode():
        xc = torch.empty(1, 4, 2, 3, 2, device="cuda").contiguous(memory_format=torch.channels_last_3d)
        xs = torch.empty(1, 4, 2, 3, 4, device="cuda")[..., ::2]
        wc = torch.empty(4, 6, 3, 3, 3, device="cuda").contiguous(memory_format=torch.channels_last_3d)
    assert applies(xc, w) and applies(x, wc) and applies(xs, w)  # any layout (others are copied first)


@pytest.mark.parametrize("change", [
    dict(stride=1), dict(stride=(2, 2, 1)), dict(padding=0), dict(padding=(1, 1, 2)), dict(output_padding=2),
    dict(output_padding=(0, 2, 0)), dict(groups=2), dict(groups=True), dict(dilation=2), dict(dilation=(1, 2, 1)),
    dict(kernel_size=3), dict(kernel_size=(2, 2, 1)), dict(pool_stride=1), dict(pool_stride=(2, 1, 2)),
    dict(pool_padding=1), dict(pool_dilation=2), dict(ceil_mode=True, output_padding=0),
    dict(ceil_mode=True, output_padding=(1, 0, 1)), dict(stride=(2, 2)), dict(stride=None), dict(stride="2"),
    dict(stride=2.0), dict(stride=[True, 2, 2]), dict(ceil_mode=None),
    "cpu", "float64", "weight_dtype", "weight_device", "kernel_2x3x3", "weight_cin", "cin0", "x_4d", "not_tensors",
], ids=str)
def test_each_deviation_is_refused_without_raising(change):
    x, w = coverage_tensors()
    if change == "cpu":
        x, w = coverage_tensors(device="cpu")
    elif change == "float64":
        x, w = coverage_tensors(dtype=torch.float64)
    elif change == "weight_dtype":
        w = coverage_tensors(dtype=torch.float16)[1]
    elif change == "weight_device":
        w = coverage_tensors(device="cpu")[1]
    elif change == "kernel_2x3x3":
        w = coverage_tensors(k=(2, 3, 3))[1]
    elif change == "weight_cin":
        w = coverage_tensors(cin=3)[1]
    elif change == "cin0":  # the convolution output is the bias alone: the composite covers it
        x, w = coverage_tensors(cin=0)
    elif change == "x_4d":
        skip_without_cuda_build("indexing a fake CUDA tensor")
        x = x[0]
    elif change == "not_tensors":
        x, w = None, "weight"
    if isinstance(change, dict):
        assert not applies(x, w, **change)
    else:
        assert not applies(x, w)


@pytest.mark.parametrize("d", range(1, 10))
@pytest.mark.parametrize("op", [0, 1])
@pytest.mark.parametrize("ceil", [False, True])
def test_size_rule_matches_the_pool_formula(d, op, ceil):
    # fused_kernel_applies states "pooled size == D - 1 + output_padding" without D (so that symbolic sizes need
    # no guard); here against max_pool3d's formula (common.pooled_size) on the convolution's output size.
    conv = (d - 1) * 2 - 2 + 3 + op
    pooled = common.pooled_size(conv, 2, 2, 0, 1, ceil)
    if pooled < 1:
        return  # the op rejects the call (output too small) before any kernel choice
    x, w = coverage_tensors(dhw=(d, 2, 3))
    assert applies(x, w, output_padding=[op, 1, 1], ceil_mode=ceil) == (pooled == d - 1 + op)



def test_symbolic_sizes_apply_without_guards():
    # torch.compile(dynamic=True): batch and spatial sizes symbolic (backed, as Dynamo makes them).
    env, (n, d, h, w_) = symbolic_sizes(2, 3, 4, 5)
    with FakeTensorMode(shape_env=env):
        x = torch.empty(n, 4, d, h, w_, device="cuda")
        w = torch.empty(4, 6, 3, 3, 3, device="cuda")
    before = len(env.guards)
    assert applies(x, w) and applies(x, w, output_padding=0) and not applies(x, w, ceil_mode=True, output_padding=0)
    assert len(env.guards) == before


def test_unknown_sizes_mean_not_the_fused_kernel():
    # A channel count or kernel size the shape environment cannot prove (unbacked) is "not this route": no
    # exception, no guard.
    env, (cin, k) = symbolic_sizes(4, 3, unbacked=(0, 1))
    with FakeTensorMode(shape_env=env):
        x = torch.empty(1, cin, 2, 3, 2, device="cuda")
        w_cin = torch.empty(cin, 6, 3, 3, 3, device="cuda")
        w_k = torch.empty(4, 6, k, 3, 3, device="cuda")
        x4 = torch.empty(1, 4, 2, 3, 2, device="cuda")
    before = len(env.guards)
    assert not applies(x, w_cin) and not applies(x4, w_k)
    assert len(env.guards) == before


# ---- the op's own choice ---------------------------------------------------------------------------------------

def _ran_composite(x, w, b, m, a):
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.ops.fused.conv_transpose3d_post_pool(x, w, b, a["stride"], a["padding"], a["output_padding"],
                                                   a["groups"], a["dilation"], m, 0.2, a["kernel_size"],
                                                   a["pool_stride"], a["pool_padding"], a["pool_dilation"],
                                                   a["ceil_mode"], None)
    names = {e.name for e in prof.events()}
    return "aten::convolution" in names or "fused::post_pool" in names


# (label, changes to DEFAULT, input tensors' dtype, channels_last input, weight shape, batch)
MIRROR = [
    ("kb", {}, torch.float32, False, (4, 6, 3, 3, 3), 2),
    ("kb-bf16-cl", {}, torch.bfloat16, True, (4, 6, 3, 3, 3), 2),
    ("kb-fp16-op0", dict(output_padding=0), torch.float16, False, (4, 6, 3, 3, 3), 1),
    ("mixed-op", dict(output_padding=[1, 0, 1]), torch.float32, False, (4, 6, 3, 3, 3), 1),
    ("ceil-op1", dict(ceil_mode=True), torch.float32, False, (4, 6, 3, 3, 3), 1),
    ("ceil-op0", dict(ceil_mode=True, output_padding=0), torch.float32, False, (4, 6, 3, 3, 3), 1),
    ("empty-batch", {}, torch.float32, False, (4, 6, 3, 3, 3), 0),
    ("float64", {}, torch.float64, False, (4, 6, 3, 3, 3), 1),
    ("stride1", dict(stride=1, output_padding=0), torch.float32, False, (4, 6, 3, 3, 3), 1),
    ("padding0", dict(padding=0), torch.float32, False, (4, 6, 3, 3, 3), 1),
    ("kernel2", dict(padding=0, output_padding=0), torch.float32, False, (4, 6, 2, 2, 2), 1),
    ("groups2", dict(groups=2), torch.float32, False, (4, 3, 3, 3, 3), 1),
    ("dilation2", dict(dilation=2), torch.float32, False, (4, 6, 3, 3, 3), 1),
    ("pool3", dict(kernel_size=3), torch.float32, False, (4, 6, 3, 3, 3), 1),
    ("pool-stride1", dict(pool_stride=1), torch.float32, False, (4, 6, 3, 3, 3), 1),
    ("pool-padding1", dict(pool_padding=1), torch.float32, False, (4, 6, 3, 3, 3), 1),
    ("pool-dilation2", dict(pool_dilation=2), torch.float32, False, (4, 6, 3, 3, 3), 1),
]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA,
                                                                                         reason="needs a GPU"))])
@pytest.mark.parametrize("label,changes,dtype,cl,wshape,n", MIRROR, ids=[c[0] for c in MIRROR])
def test_the_op_takes_the_fused_kernel_exactly_where_it_applies(device, label, changes, dtype, cl, wshape, n):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, 3, 4, 5, generator=gen).to(device=device, dtype=dtype)
    if cl:
        x = x.contiguous(memory_format=torch.channels_last_3d)
    w = torch.randn(*wshape, generator=gen).to(device=device, dtype=dtype)
    cout = wshape[1] * changes.get("groups", 1)
    b = torch.randn(cout, generator=gen).to(device=device, dtype=dtype)
    m = torch.randn(cout, 1, 1, 1, generator=gen).to(device=device, dtype=dtype)
    a = {**COVERAGE_DEFAULTS, **changes}
    for key in ("stride", "padding", "output_padding", "dilation", "kernel_size", "pool_stride", "pool_padding",
                "pool_dilation"):
        a[key] = common.expand3(key, a[key])
    want = fused_kernel_applies(x, w, **a)
    assert want == (device == "cuda" and label in ("kb", "kb-bf16-cl", "kb-fp16-op0", "mixed-op", "ceil-op1",
                                                   "empty-batch"))
    assert _ran_composite(x, w, b, m, a) == (not want)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_fused_path_coverage_cuda(dtype, name):
    # The fused kernel runs exactly for its configurations (no aten convolution then); the rest run the
    # composite. Both agree with eager.
    x, w, b, m = make_tensors(dtype, "cuda", cin=16, cout=32, spatial=(3, 4, 5))
    args = config_args(x, w, b, m, CONFIGS[name])
    out = OPS.conv_transpose3d_post_pool(*args)
    ran_conv = ran_aten_convolution(lambda: OPS.conv_transpose3d_post_pool(*args))
    assert ran_conv == (name not in FUSED_CONFIGS or dtype == torch.float64)
    ref = reference_config(*(t.double() for t in (x, w, b, m)), CONFIGS[name]).to(dtype)
    tol = dict(rtol=3e-2, atol=3e-2) if dtype in (torch.bfloat16, torch.float16) else dict(rtol=5e-3, atol=5e-3)
    torch.testing.assert_close(out, ref, **tol)
