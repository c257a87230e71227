"""Shared helpers for the torch_fused_ops test suite.

Kept out of conftest.py so that test modules can import them by name
(`from fused_testing import ...`); conftest.py only holds pytest hooks.

Everything here builds expectations from eager PyTorch ops; nothing here
calls the fused op, so a test can never end up comparing the op with itself.
"""

import re

import pytest
import torch
import torch.distributed
import torch.nn.functional as F

HAS_CUDA = torch.cuda.is_available()
CUDA_SKIP_REASON = "CUDA is not available (torch.cuda.is_available() is False)"
requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason=CUDA_SKIP_REASON)
# Fake CUDA tensors need no GPU, but a CUDA build of torch: on a CPU-only build aten ops over them raise or abort the
# process.
CUDA_BUILT = torch.backends.cuda.is_built()


def skip_without_cuda_build(what="this case"):
    """Skips the test where fake CUDA tensors cannot be used (a CPU-only build of torch)."""
    if not CUDA_BUILT:
        pytest.skip(f"{what} needs fake CUDA tensors, which need a CUDA build of torch (this one is CPU-only)")

# The DDP tests' ranks talk over gloo on 127.0.0.1.
requires_gloo = pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                                   reason="needs torch.distributed with gloo")


def free_local_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a test's rendezvous)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=requires_cuda),
]

FULL_DTYPES = [torch.float32, torch.float64]
HALF_DTYPES = [torch.float16, torch.bfloat16]
ALL_DTYPES = FULL_DTYPES + HALF_DTYPES

CHANNELS_LAST = torch.channels_last_3d

# Unit roundoff u = 2**-p: a single round-to-nearest has relative error <= u.
UNIT_ROUNDOFF = {
    torch.float16: 2.0**-11,
    torch.bfloat16: 2.0**-8,
    torch.float32: 2.0**-24,
    torch.float64: 2.0**-53,
}
# Half of the smallest subnormal spacing: the absolute error floor of rounding
# near zero (bf16 shares float32's exponent range, so its floor is negligible).
ABS_ROUNDING_FLOOR = {
    torch.float16: 2.0**-25,
    torch.bfloat16: 2.0**-134,
    torch.float32: 2.0**-150,
    torch.float64: 0.0,
}

# op vs. eager composite in the same low-precision dtype. Eager rounds after
# each of its ~3 arithmetic steps while the op rounds once, so they may differ
# by ~4u relative; the atol covers values near zero.
EAGER_TOL = {
    torch.float16: dict(rtol=2e-3, atol=2e-3),
    torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2),
    torch.float32: dict(rtol=0, atol=0),
    torch.float64: dict(rtol=0, atol=0),
}

# Gradients in low precision (compared against a float64 autograd reference):
# a few roundings plus sums over overlapping windows.
GRAD_TOL_LOW = {
    torch.float16: dict(rtol=4e-3, atol=2e-3),
    torch.bfloat16: dict(rtol=3e-2, atol=1.6e-2),
}

# Pool configurations exercised by the forward/backward tests, all valid for
# the default (5, 7, 9) spatial shape. `nonoverlap` marks configs where every
# input element belongs to at most one window (kernel == stride, no dilation),
# for which grad_input must be bit-identical to eager.
POOL_CONFIGS = {
    "k2": dict(kernel_size=2),  # stride None -> kernel; the 2x2x2 fast path
    "k2s2": dict(kernel_size=2, stride=2),
    "k3s2p1": dict(kernel_size=3, stride=2, padding=1),
    "k231s123": dict(kernel_size=(2, 3, 1), stride=(1, 2, 3)),
    "k3s1p1d2": dict(kernel_size=3, stride=1, padding=1, dilation=2),
    "k2s2ceil": dict(kernel_size=2, stride=2, ceil_mode=True),
    "k3s2p1ceil": dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    # The W dim hits the ceil_mode rule that drops a window starting in padding.
    "mixed": dict(kernel_size=(3, 2, 2), stride=(2, 1, 2), padding=(1, 0, 1),
                  dilation=(1, 2, 1), ceil_mode=True),
    "k1": dict(kernel_size=1),
    "k2s1": dict(kernel_size=2, stride=1),
    "k3s1p1": dict(kernel_size=3, stride=1, padding=1),
    "k231s231": dict(kernel_size=(2, 3, 1), stride=(2, 3, 1)),
}
NONOVERLAP = {"k2", "k2s2", "k2s2ceil", "k1", "k231s231"}

DEFAULT_SHAPE = (2, 3, 5, 7, 9)
MEDIUM_SHAPE = (2, 16, 8, 16, 16)


def pool_params(names):
    return [pytest.param(POOL_CONFIGS[n], id=n) for n in names]


def composite(input, multiplier, negative_slope=0.01, kernel_size=2, stride=None,
              padding=0, dilation=1, ceil_mode=False, negative_slope2=None):
    """The eager composite the fused op must reproduce."""
    s2 = negative_slope if negative_slope2 is None else negative_slope2
    y = F.leaky_relu(F.leaky_relu(input, negative_slope) * multiplier, s2)
    return F.max_pool3d(y, kernel_size, stride, padding, dilation, ceil_mode)


def pre_pool(input, multiplier, negative_slope=0.01, negative_slope2=None, **_):
    s2 = negative_slope if negative_slope2 is None else negative_slope2
    return F.leaky_relu(F.leaky_relu(input, negative_slope) * multiplier, s2)


def triple(v):
    if isinstance(v, int):
        return (v, v, v)
    return tuple(v)


def resolved_pool(kernel_size=2, stride=None, padding=0, dilation=1, ceil_mode=False, **_):
    k = triple(kernel_size)
    s = k if stride is None or (not isinstance(stride, int) and len(stride) == 0) else triple(stride)
    return k, s, triple(padding), triple(dilation), ceil_mode


def pool_out_dim(size, k, s, p, d, ceil_mode):
    # Same formula as ATen's pooling_output_shape.
    num = size + 2 * p - d * (k - 1) - 1 + ((s - 1) if ceil_mode else 0)
    out = num // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def pool_out_shape(shape, **cfg):
    k, s, p, d, ceil = resolved_pool(**cfg)
    n, c = shape[:2]
    return (n, c) + tuple(pool_out_dim(shape[2 + i], k[i], s[i], p[i], d[i], ceil) for i in range(3))


def op_args(cfg):
    """Explicit positional arguments for torch.ops.fused.* (schema form)."""
    k, s, p, d, ceil = resolved_pool(**cfg)
    stride = cfg.get("stride", None)
    stride_arg = [] if stride is None else list(triple(stride))
    return list(k), stride_arg, list(p), list(d), ceil


LAYOUTS = ["contiguous", "channels_last", "strided", "transposed", "permuted", "expanded"]


def make_input(shape=DEFAULT_SHAPE, dtype=torch.float32, device="cpu", layout="contiguous",
               seed=0, values="randn"):
    """Draw an (N, C, D, H, W) input with the requested memory layout.

    Values are drawn on the CPU from a seeded generator so every device sees
    the same numbers. `values`:
      randn    -- standard normal (never zeros);
      ties     -- integers in [-3, 3], so many pool windows tie (and hit 0);
      negative -- all strictly negative, to expose 0 vs. -inf padding.
    """
    g = torch.Generator().manual_seed(seed)

    def draw(*s):
        if values == "randn":
            t = torch.randn(*s, generator=g, dtype=torch.float64)
        elif values == "ties":
            t = torch.randint(-3, 4, s, generator=g).double()
        elif values == "negative":
            t = -(torch.rand(*s, generator=g, dtype=torch.float64) * 2 + 0.1)
        else:
            raise ValueError(values)
        return t.to(dtype=dtype, device=device)

    n, c, d, h, w = shape
    if layout == "contiguous":
        x = draw(n, c, d, h, w)
    elif layout == "channels_last":
        x = draw(n, c, d, h, w).contiguous(memory_format=CHANNELS_LAST)
    elif layout == "strided":
        x = draw(n, c, 2 * d, h + 1, 2 * w)[:, :, ::2, 1:, 1::2]
    elif layout == "transposed":
        x = draw(n, c, w, h, d).transpose(2, 4)
    elif layout == "permuted":
        x = draw(d, n, c, h, w).permute(1, 2, 0, 3, 4)
    elif layout == "expanded":
        x = draw(1, c, d, h, w).expand(n, c, d, h, w)
    else:
        raise ValueError(layout)
    assert x.shape == tuple(shape)
    return x


MULTIPLIER_KINDS = ["0d", "1", "1111", "11111", "C111", "1C111", "C111_strided", "C111_expanded",
                    "0d_negative"]


def make_multiplier(kind, channels, dtype=torch.float32, device="cpu", seed=1):
    """Multipliers of every accepted shape.

    Magnitudes are kept in [0.25, 1.75] and per-channel signs alternate, so
    the second LeakyReLU sees both signs and the order of operations matters.
    """
    g = torch.Generator().manual_seed(seed)

    def mags(n):
        return torch.rand(n, generator=g, dtype=torch.float64) * 1.5 + 0.25

    def per_channel(n):
        signs = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(n)], dtype=torch.float64)
        return mags(n) * signs

    if kind == "0d":
        m = mags(1).reshape(())
    elif kind == "0d_negative":
        m = -mags(1).reshape(())
    elif kind == "1":
        m = mags(1)
    elif kind == "1111":
        m = mags(1).reshape(1, 1, 1, 1)
    elif kind == "11111":
        m = mags(1).reshape(1, 1, 1, 1, 1)
    elif kind == "C111":
        m = per_channel(channels).reshape(channels, 1, 1, 1)
    elif kind == "1C111":
        m = per_channel(channels).reshape(1, channels, 1, 1, 1)
    elif kind == "C111_strided":
        m = per_channel(2 * channels).to(dtype=dtype, device=device)[::2].view(channels, 1, 1, 1)
        assert not m.is_contiguous()
        return m
    elif kind == "C111_expanded":
        m = per_channel(1).to(dtype=dtype, device=device).expand(channels).view(channels, 1, 1, 1)
        return m
    else:
        raise ValueError(kind)
    return m.to(dtype=dtype, device=device)


def assert_bitwise_equal(actual, expected, msg=""):
    assert actual.shape == expected.shape, f"{msg} shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert actual.dtype == expected.dtype, f"{msg} dtype {actual.dtype} != {expected.dtype}"
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True,
                               msg=lambda m: f"{msg}\n{m}" if msg else m)


def check_against_eager(out, x, m, cfg, slope=0.2, slope2=None, msg=""):
    """Full-precision dtypes: bit-identical to eager on the same device.
    Half dtypes: close to eager, correctly rounded w.r.t. a float64 reference
    and, overall, no further from that reference than eager itself."""
    expected = composite(x, m, slope, negative_slope2=slope2, **cfg)
    assert out.shape == expected.shape, f"{msg} shape {tuple(out.shape)} != {tuple(expected.shape)}"
    assert out.dtype == x.dtype
    assert out.device == x.device
    if x.dtype in FULL_DTYPES:
        assert_bitwise_equal(out, expected, msg)
        return
    torch.testing.assert_close(out, expected, equal_nan=True, **EAGER_TOL[x.dtype],
                               msg=lambda mm: f"{msg} (vs eager {x.dtype})\n{mm}")
    ref = composite(x.double(), m.double(), slope, negative_slope2=slope2, **cfg)
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isnan(out), torch.isnan(ref)), f"{msg} NaN positions differ from float64 reference"
    op_err = (out.double() - ref)[finite].abs()
    eager_err = (expected.double() - ref)[finite].abs()
    u = UNIT_ROUNDOFF[x.dtype]
    # One rounding of a value computed in float32 (a few float32 ulps of slack).
    bound = (u + 8 * 2.0**-24) * ref[finite].abs() + ABS_ROUNDING_FLOOR[x.dtype]
    bad = op_err > bound
    if bad.any():
        i = int(torch.nonzero(bad)[0])
        raise AssertionError(
            f"{msg} {int(bad.sum())} elements not correctly rounded from float32 math: e.g. "
            f"op={out.double()[finite][i].item()!r} ref64={ref[finite][i].item()!r} "
            f"err={op_err[i].item():.3e} bound={bound[i].item():.3e}")
    if op_err.numel():
        assert op_err.max() <= eager_err.max() * (1 + 1e-6), (
            f"{msg} op max error {op_err.max().item():.3e} > eager max error {eager_err.max().item():.3e}")
        assert op_err.mean() <= eager_err.mean() * (1 + 1e-6), (
            f"{msg} op mean error {op_err.mean().item():.3e} > eager mean error {eager_err.mean().item():.3e}")


def shape_pattern(shape):
    """Regex matching a shape printed as [1, 2, 3], (1, 2, 3), 1x2x3 ..."""
    return r"[\[\(]?\s*" + r"\s*[,x×]\s*".join(str(s) for s in shape) + r"\s*,?\s*[\]\)]?"


def message_mentions_shape(message, shape):
    return re.search(shape_pattern(shape), message) is not None


def tie_free_input(shape, slopes, multiplier, seed, dtype=torch.float64, eps=1e-6, min_abs=1e-3):
    """A float64 input for gradcheck: no two pre-pool values of a channel are
    within reach of each other under a finite-difference step of `eps` (so no
    pool window can flip its argmax), and no value sits near a LeakyReLU kink."""
    s1, s2 = slopes
    s2 = s1 if s2 is None else s2
    m = multiplier.detach().to(dtype).cpu()
    mb = m.reshape(1, -1, 1, 1, 1) if m.numel() > 1 else m.reshape(())
    for attempt in range(500):
        g = torch.Generator().manual_seed(seed * 1000 + attempt)
        x = torch.randn(*shape, generator=g, dtype=dtype)
        if x.abs().min() < min_abs:
            continue
        z = pre_pool(x, m, s1, s2)
        # |dz/dx| per element: how far one finite-difference step moves it.
        slope = (torch.where(x > 0, 1.0, abs(s1)) * torch.where(z > 0, 1.0, abs(s2)) * mb.abs()).expand_as(z)
        zc = z.transpose(0, 1).reshape(shape[1], -1)
        sc = slope.transpose(0, 1).reshape(shape[1], -1)
        gap = (zc[:, :, None] - zc[:, None, :]).abs()
        reach = 10 * eps * (sc[:, :, None] + sc[:, None, :])
        gap.diagonal(dim1=1, dim2=2).fill_(float("inf"))
        if (gap <= reach).any():
            continue
        return x
    raise RuntimeError("could not draw a tie-free input")


def offsets_from_indices(indices, in_spatial, cfg):
    """Convert eager max_pool3d flat indices into window offsets
    (jd*kh + jh)*kw + jw, as documented for post_pool_with_offsets."""
    k, s, p, d, _ = resolved_pool(**cfg)
    D, H, W = in_spatial
    idx = indices.long()
    iw = idx % W
    ih = (idx // W) % H
    iD = idx // (H * W)
    oD, oH, oW = indices.shape[2:]
    dev = indices.device
    od = torch.arange(oD, device=dev).view(-1, 1, 1)
    oh = torch.arange(oH, device=dev).view(1, -1, 1)
    ow = torch.arange(oW, device=dev).view(1, 1, -1)
    jd = iD - (od * s[0] - p[0])
    jh = ih - (oh * s[1] - p[1])
    jw = iw - (ow * s[2] - p[2])
    assert bool(((jd % d[0]) == 0).all() and ((jh % d[1]) == 0).all() and ((jw % d[2]) == 0).all())
    jd, jh, jw = jd // d[0], jh // d[1], jw // d[2]
    return (jd * k[1] + jh) * k[2] + jw


def eager_grads(x, m, grad_out, cfg, slope=0.2, slope2=None, need_x=True, need_m=True):
    """Gradients of the eager composite (on copies that share x/m's layout)."""
    xe = x.detach().requires_grad_(need_x)
    me = m.detach().requires_grad_(need_m)
    out = composite(xe, me, slope, negative_slope2=slope2, **cfg)
    out.backward(grad_out)
    return out.detach(), (xe.grad if need_x else None), (me.grad if need_m else None)


def grad_multiplier_tol(x, grad_out, dtype):
    # The multiplier gradient is a sum over N*D*H*W outputs per channel, and
    # the op may sum in a different order: scale atol with the sum's size.
    eps = {torch.float32: 1e-6, torch.float64: 1e-13}[dtype]
    scale = max(1.0, float(grad_out.abs().sum()) * max(1.0, float(x.abs().max())) / max(1, x.shape[1]))
    return dict(rtol=1e-4 if dtype == torch.float32 else 1e-10, atol=eps * scale)


# ---- gradients through the op ------------------------------------------------------------------------------

def op_grads(x, m, grad_out, cfg, slope=0.2, slope2=None, need_x=True, need_m=True):
    """post_pool's output and the gradients autograd gives x and m for grad_out."""
    import torch_fused_ops

    xo = x.detach().requires_grad_(need_x)
    mo = m.detach().requires_grad_(need_m)
    out = torch_fused_ops.post_pool(xo, mo, slope, negative_slope2=slope2, **cfg)
    assert out.requires_grad
    out.backward(grad_out)
    return out.detach(), (xo.grad if need_x else None), (mo.grad if need_m else None)


def grad_output_for(x, m, cfg, seed):
    """A random float64-drawn grad_output of the composite's output shape, in x's dtype and device."""
    shape = composite(x.detach(), m.detach(), 0.2, **cfg).shape
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype=x.dtype, device=x.device)


def conv_operands(device="cpu", seed=0):
    """A small fused-convolution problem: input [2, 4, 3, 4, 5], weight 4 -> 6 channels of 3 x 3 x 3 (scaled so
    that outputs stay near 1), bias, per-channel multiplier [6, 1, 1, 1]."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 4, 3, 4, 5, generator=g).to(device)
    w = (torch.randn(4, 6, 3, 3, 3, generator=g) / 6).to(device)
    b = torch.randn(6, generator=g).to(device)
    m = torch.randn(6, 1, 1, 1, generator=g).to(device)
    return x, w, b, m
