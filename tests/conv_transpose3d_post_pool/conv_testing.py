"""Shared helpers of the fused convolution's op tests (fused.conv_transpose3d_post_pool and its training form
fused.conv_transpose3d_post_pool_with_offsets): inputs, calls and eager references. Expectations come from eager
PyTorch (F.conv_transpose3d, leaky_relu, max_pool3d), never from the op itself.

Three sets of helpers, one per way of describing the call:
- the KernelBench geometry (conv stride 2, padding 1, kernel 3; a 2x2x2 pool), where the CUDA fused kernel applies:
  make_random / make_ints, kb_args / kb_call, float64 references (conv64, pool_chain, reference64) and the
  tolerances that go with them;
- geometry cases (CASES: conv stride, padding, output_padding, kernel, pool kernel, pool stride, groups), the
  composite's geometries too: make_case, case_args / call_case, reference_case;
- pool configurations (CONFIGS: conv stride, padding, output_padding, pool kernel, pool stride, ceil_mode) with
  kernel 3: make_tensors, config_args, reference_config, FUSED_CONFIGS (those the fused kernel takes).
"""
import math

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_fused_ops  # noqa: F401  (registers torch.ops.fused)
from torch_fused_ops import conv_transpose3d_post_pool

OPS = torch.ops.fused
CL = torch.channels_last_3d
HAS_CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU"))]
requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU")
HALF = (torch.bfloat16, torch.float16)


# ---- the KernelBench geometry ----------------------------------------------------------------------------------

def make_random(n, cin, cout, dhw, dtype, device, *, bias=True, mult="mixed", seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, cin, *dhw, generator=gen)
    w = torch.randn(cin, cout, 3, 3, 3, generator=gen) / math.sqrt(max(cin, 1) * 8)
    b = torch.randn(cout, generator=gen) * 0.5 if bias else None
    m = torch.randn(cout, generator=gen) + 0.1
    if mult == "mixed":  # negative, zero and positive channels in one tensor
        m[0::3] = -m[0::3].abs()
        m[1::3] = m[1::3].abs()
        m[2::5] = 0.0
    elif mult == "negative":
        m = -m.abs() - 0.05
    elif mult == "positive":
        m = m.abs() + 0.05
    cast = lambda t: None if t is None else t.to(device=device, dtype=dtype)  # noqa: E731
    return cast(x), cast(w), cast(b), cast(m.view(-1, 1, 1, 1))


def make_ints(n, cin, cout, dhw, dtype, device, *, seed=0):
    """Small integers: |conv value| <= 8 * 2 * Cin + 1, exact in bfloat16 for Cin <= 8."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(-2, 3, (n, cin, *dhw), generator=gen).float()
    w = torch.randint(-1, 2, (cin, cout, 3, 3, 3), generator=gen).float()
    b = torch.randint(-1, 2, (cout,), generator=gen).float()
    m = torch.randint(-2, 3, (cout, 1, 1, 1), generator=gen).float() * 0.5
    return [t.to(device=device, dtype=dtype) for t in (x, w, b, m)]


def kb_args(x, w, b, m, s1, s2, op=(1, 1, 1), ceil=False):
    return (x, w, b, [2, 2, 2], [1, 1, 1], list(op), 1, [1, 1, 1], m, s1, [2, 2, 2], [], [0, 0, 0], [1, 1, 1],
            ceil, None if s2 == s1 else s2)


def kb_call(*a, offsets=False, **kw):
    op = OPS.conv_transpose3d_post_pool_with_offsets if offsets else OPS.conv_transpose3d_post_pool
    return op(*kb_args(*a, **kw))


def pool_chain(y, m, s1, s2, ceil=False):
    """Eager epilogue and pool in y's dtype: (out, selected y, window offset (jd*2 + jh)*2 + jw)."""
    e = F.leaky_relu(F.leaky_relu(y, s1) * m.to(y.dtype).reshape(1, -1, 1, 1, 1), s2)
    out, idx = F.max_pool3d(e, 2, 2, ceil_mode=ceil, return_indices=True)
    sel = y.flatten(2).gather(2, idx.flatten(2)).view_as(out)
    ho, wo = y.shape[3], y.shape[4]
    od, oh, ow = idx // (ho * wo), (idx // wo) % ho, idx % wo
    return out, sel, (((od % 2) * 2 + oh % 2) * 2 + ow % 2).to(torch.uint8)


def conv64(x, w, b, op):
    return F.conv_transpose3d(x.double().cpu(), w.double().cpu(), None if b is None else b.double().cpu(), stride=2,
                              padding=1, output_padding=tuple(op))


def reference64(x, w, b, m, s1, s2, op=(1, 1, 1), ceil=False):
    return pool_chain(conv64(x, w, b, op), m.double().cpu(), s1, s2, ceil)[0]


def tol(dtype):
    if dtype in (torch.float32, torch.float64):
        return dict(rtol=1e-5, atol=1e-5)
    # The convolution value is rounded to the I/O dtype, the output once more (the epilogue runs in float32).
    return dict(rtol=2 * torch.finfo(dtype).eps, atol=1e-4)


def half_bound(x, w, b, m, s1, s2, op=(1, 1, 1), ceil=False):
    """Per output, 4 eps of the dtype times the largest |term sum| of its window, scaled by the epilogue: the
    error a half-precision convolution may add before rounding (aten's CPU convolution rounds partial sums, so
    its error scales with the terms, not with the result)."""
    eps = torch.finfo(x.dtype).eps
    mag = conv64(x.abs(), w.abs(), None if b is None else b.abs(), op)
    scale = m.double().cpu().abs().reshape(1, -1, 1, 1, 1) * max(1.0, abs(s1)) * max(1.0, abs(s2))
    return 4 * eps * F.max_pool3d(mag * scale, 2, 2, ceil_mode=ceil)


def check_close(out, ref, dtype, bound=None):
    """out against the float64 reference: the same NaN and infinities, finite values within tol(dtype) (plus
    `bound`, per element)."""
    out = out.double().cpu()
    assert out.shape == ref.shape
    assert torch.equal(out.isnan(), ref.isnan()), "NaN pattern"
    inf = ref.isinf()
    assert torch.equal(out[inf], ref[inf]), "infinities"
    t = tol(dtype)
    allowed = t["atol"] + t["rtol"] * ref.abs() + (0.0 if bound is None else bound)
    err = (out - ref).abs()
    bad = ref.isfinite() & ~(err <= allowed)
    assert not bad.any(), f"{int(bad.sum())} of {ref.numel()} elements off, e.g. {out[bad][:4]} vs {ref[bad][:4]}"


def rel(a, ref):
    return ((a.double().cpu() - ref).norm() / ref.norm()).item()


def poison(shape, dtype, device):
    """On CUDA, hand the caching allocator a NaN-filled block of the output's size to reuse, so that an element
    the kernel leaves unwritten shows as NaN (the op's outputs come from the same allocator)."""
    if device == "cuda":
        t = torch.full(shape, float("nan"), dtype=dtype, device=device)
        del t


def same_bits(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


# (N, Cin, Cout, (D, H, W), output_padding, bias, (s1, s2), multiplier kind): channel tails, odd sizes
VALUE_CASES = [
    (2, 4, 3, (3, 4, 5), (0, 0, 0), True, (0.2, 0.2), "mixed"),
    (2, 5, 17, (4, 3, 2), (1, 0, 1), False, (-0.5, 0.0), "mixed"),
    (1, 16, 32, (3, 3, 3), (1, 1, 1), True, (0.0, -1.3), "negative"),
    (2, 17, 33, (2, 3, 4), (0, 1, 0), True, (1.7, 0.3), "mixed"),
    (2, 1, 1, (3, 5, 3), (1, 1, 1), True, (0.2, 0.2), "positive"),
    (1, 3, 64, (2, 2, 3), (1, 1, 0), True, (-0.1, 2.0), "mixed"),
    (1, 8, 128, (2, 3, 2), (1, 1, 1), False, (0.2, 0.2), "mixed"),
    (2, 33, 40, (1, 1, 1), (1, 1, 1), True, (0.1, -0.2), "mixed"),
]


def case_id(c):
    n, cin, cout, dhw, op, bias, slopes, mult = c
    return (f"N{n}-{cin}to{cout}-{'x'.join(map(str, dhw))}-op{''.join(map(str, op))}-{'b' if bias else 'nob'}"
            f"-s{slopes[0]}_{slopes[1]}-{mult}")


LAYOUTS = {
    "contig": lambda t: t.contiguous(),
    "cl": lambda t: t.contiguous(memory_format=torch.channels_last_3d),
    "strided": lambda t: torch.cat([t, t], dim=-1)[..., ::2],  # a step on W: neither format, copied first
    "permuted": lambda t: t.permute(0, 1, 4, 3, 2).contiguous().permute(0, 1, 4, 3, 2),
}


# ---- geometry cases -------------------------------------------------------------------------------------------

# (conv stride, padding, output_padding, kernel, pool kernel, pool stride, groups): the KernelBench case (the
# CUDA fused path), then cases only the composite path covers.
CASES = {
    "kb": (2, 1, 1, 3, 2, None, 1),
    "kb_op0": (2, 1, 0, 3, 2, None, 1),
    "kb_mixed_op": (2, 1, (1, 0, 1), 3, 2, None, 1),
    "s1k2": (1, 0, 0, 2, 2, 1, 1),
    "pool3": (2, 1, 1, 3, 3, 2, 1),
    "groups2": (2, 1, 1, 3, 2, None, 2),
}


def reference_case(x, w, b, m, s1, s2, case):
    stride, pad, op, _k, pk, ps, groups = case
    y = F.conv_transpose3d(x, w, b, stride, pad, op, groups)
    return F.max_pool3d(F.leaky_relu(F.leaky_relu(y, s1) * m, s2), pk, ps)


def make_case(case, dtype, device, *, cin=4, cout=6, shape=(2, 3, 4, 5), bias=True, fmt=torch.contiguous_format,
              seed=0):
    g = torch.Generator().manual_seed(seed)
    _s, _p, _o, k, _pk, _ps, groups = case
    x = torch.randn(shape[0], cin, *shape[1:], generator=g, dtype=torch.float64)
    w = torch.randn(cin, cout // groups, k, k, k, generator=g, dtype=torch.float64) / (cin * k) ** 0.5
    b = torch.randn(cout, generator=g, dtype=torch.float64) if bias else None
    m = torch.randn(cout, 1, 1, 1, generator=g, dtype=torch.float64)
    cast = lambda t: None if t is None else t.to(device=device, dtype=dtype)  # noqa: E731
    return cast(x).contiguous(memory_format=fmt), cast(w), cast(b), cast(m)


def call_case(x, w, b, m, s1, s2, case):
    stride, pad, op, _k, pk, ps, groups = case
    return conv_transpose3d_post_pool(x, w, b, m, s1, stride, pad, op, groups, 1, pk, ps, 0, 1, False,
                                      None if s2 == s1 else s2)


def case_args(x, w, b, m, case):
    stride, pad, op, _k, pk, ps, groups = case
    e = lambda v: [v] * 3 if isinstance(v, int) else list(v)  # noqa: E731
    return (x, w, b, e(stride), e(pad), e(op), groups, [1, 1, 1], m, 0.2, e(pk), [] if ps is None else e(ps),
            [0, 0, 0], [1, 1, 1], False, None)


# ---- pool configurations --------------------------------------------------------------------------------------

def make_tensors(dtype, device, *, n=2, cin=3, cout=5, spatial=(3, 4, 5), k=3, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, cin, *spatial, generator=g, dtype=torch.float64)
    w = torch.randn(cin, cout, k, k, k, generator=g, dtype=torch.float64) / (cin * k) ** 0.5
    b = torch.randn(cout, generator=g, dtype=torch.float64) if bias else None
    m = torch.randn(cout, 1, 1, 1, generator=g, dtype=torch.float64)
    cast = lambda t: None if t is None else t.to(device=device, dtype=dtype)  # noqa: E731
    return cast(x), cast(w), cast(b), cast(m)


# (conv stride, padding, output_padding, pool kernel, pool stride, ceil_mode): the fused kernel's configurations
# first, then composite-only ones.
CONFIGS = {
    "kb": (2, 1, 1, 2, None, False),
    "kb_op0": (2, 1, 0, 2, None, False),
    "kb_mixed_op": (2, 1, [1, 0, 1], 2, None, False),
    "kb_ceil_even": (2, 1, 1, 2, 2, True),   # ceil_mode with an even convolution output: the same windows
    "kb_ceil_odd": (2, 1, 0, 2, 2, True),    # ceil_mode adds a partial window: composite
    "pool3": (2, 1, 1, 3, 2, False),
    "s1": (1, 0, 0, 2, None, False),
}


FUSED_CONFIGS = {"kb", "kb_op0", "kb_mixed_op", "kb_ceil_even"}


def e3(v):
    return [v] * 3 if isinstance(v, int) else list(v)


def config_args(x, w, b, m, cfg, s1=0.2, s2=None):
    stride, pad, op, pk, ps, ceil = cfg
    return (x, w, b, e3(stride), e3(pad), e3(op), 1, [1, 1, 1], m, s1, e3(pk), [] if ps is None else e3(ps),
            [0, 0, 0], [1, 1, 1], ceil, s2)


def reference_config(x, w, b, m, cfg, s1=0.2, s2=None):
    stride, pad, op, pk, ps, ceil = cfg
    y = F.conv_transpose3d(x, w, b, stride, pad, op)
    return F.max_pool3d(F.leaky_relu(F.leaky_relu(y, s1) * m, s1 if s2 is None else s2), pk, ps, 0, 1, ceil)


def ran_aten_convolution(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return any(e.name == "aten::convolution" for e in prof.events())


# ---- the coverage check's arguments ------------------------------------------------------------------------------

# The fused kernel's geometry, as conv_transpose3d_post_pool_coverage's functions take it after input and weight.
COVERAGE_DEFAULTS = dict(stride=2, padding=1, output_padding=1, groups=1, dilation=1, kernel_size=2, pool_stride=2,
                         pool_padding=0, pool_dilation=1, ceil_mode=False)


def coverage_tensors(device="cuda", dtype=torch.float32, cin=4, cout=6, k=(3, 3, 3), dhw=(2, 3, 2), n=1, mode=None):
    """Input and weight: fake tensors by default (fake CUDA ones need no GPU), real ones when `mode` is False."""
    def build():
        return (torch.empty(n, cin, *dhw, device=device, dtype=dtype),
                torch.empty(cin, cout, *k, device=device, dtype=dtype))
    if mode is False:
        return build()
    with mode or FakeTensorMode():
        return build()


def symbolic_sizes(*values, unbacked=()):
    """A ShapeEnv and one SymInt per value: backed with that hint (as Dynamo makes them), or unbacked where listed."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()
    out = []
    for i, v in enumerate(values):
        if i in unbacked:
            out.append(env.create_unbacked_symint())
        else:
            out.append(env.create_symintnode(env.create_symbol(v, ConstantSource(f"s{i}")), hint=v))
    return env, out
