"""Shared helpers of test_conv_backward_ops.py, test_conv_autograd.py and test_conv_empty_batch.py: inputs for the
fused convolution's geometry (kernel 3, stride 2, padding 1, a 2x2x2 pool), the unfused chain's eager autograd, the
three backward ops applied to what the training forward saved, and the public wrapper's call. Expectations come from
eager PyTorch only."""
import torch
import torch.nn.functional as F

import torch_fused_ops  # noqa: F401  (registers the ops)
from torch_fused_ops import conv_transpose3d_post_pool

OPS = torch.ops.fused
GRAD_CONV = OPS._conv_transpose3d_post_pool_grad_conv.default
GRAD_WEIGHT = OPS._conv_transpose3d_post_pool_grad_weight.default
GRAD_INPUT = OPS._conv_transpose3d_post_pool_grad_input.default
TRAINING = OPS.conv_transpose3d_post_pool_with_offsets.default
NAMES = ("input", "weight", "bias", "multiplier")


def expand(op):
    return [op] * 3 if isinstance(op, int) else list(op)


def make(n=2, cin=3, cout=5, spatial=(3, 4, 5), dtype=torch.float64, device="cpu", *, fmt=torch.contiguous_format,
         values="randn", mult="C", bias=True, seed=0):
    """input [n, cin, *spatial], weight [cin, cout, 3, 3, 3], bias [cout], multiplier (C or one element).
    values="ties": small integers, so every convolution output is an exact integer and windows tie."""
    g = torch.Generator().manual_seed(seed)
    if values == "ties":
        x = torch.randint(-2, 3, (n, cin, *spatial), generator=g).double()
        w = torch.randint(-1, 2, (cin, cout, 3, 3, 3), generator=g).double()
        b = torch.randint(-1, 2, (cout,), generator=g).double()
    else:
        x = torch.randn(n, cin, *spatial, generator=g, dtype=torch.float64)
        w = torch.randn(cin, cout, 3, 3, 3, generator=g, dtype=torch.float64) / (cin * 27) ** 0.5
        b = torch.randn(cout, generator=g, dtype=torch.float64)
    signs = torch.tensor([(-1.0) ** i for i in range(cout)], dtype=torch.float64)
    mags = torch.rand(max(cout, 1), generator=g, dtype=torch.float64) * 1.5 + 0.25
    m = {"C": (signs * mags[:cout]).reshape(cout, 1, 1, 1), "1C": (signs * mags[:cout]).reshape(1, cout, 1, 1, 1),
         "one": mags[:1].reshape(()), "one_negative": -mags[:1].reshape(1, 1, 1, 1)}[mult]
    cast = lambda t: t.to(device=device, dtype=dtype)  # noqa: E731
    return cast(x).contiguous(memory_format=fmt), cast(w), cast(b) if bias else None, cast(m)


def chain(x, w, b, m, s1, s2, op):
    """The unfused chain eager PyTorch runs (s2 None: s1)."""
    s2 = s1 if s2 is None else s2
    y = F.conv_transpose3d(x, w, b, 2, 1, tuple(expand(op)))
    return F.max_pool3d(F.leaky_relu(F.leaky_relu(y, s1) * m, s2), 2)


def eager_grads(x, w, b, m, s1, s2, op, grad_out):
    """(out, [grad_input, grad_weight, grad_bias, grad_multiplier]) of the unfused chain (bias None: no entry)."""
    leaves = [t.detach().requires_grad_() for t in (x, w, b, m) if t is not None]
    xl, wl, *rest = leaves
    bl = rest[0] if b is not None else None
    ml = rest[-1]
    out = chain(xl, wl, bl, ml, s1, s2, op)
    return out.detach(), list(torch.autograd.grad(out, leaves, grad_out))


def saved(x, w, b, m, s1, s2, op):
    """What the training forward saves: (out, selected, offsets)."""
    return TRAINING(x, w, b, [2] * 3, [1] * 3, expand(op), 1, [1] * 3, m, s1, [2] * 3, [], [0] * 3, [1] * 3, False,
                    s2)


def op_grads(x, w, b, m, s1, s2, op, grad_out, selected=None, offsets=None):
    """[grad_input, grad_weight, grad_bias, grad_multiplier] from the three ops (bias None: no entry), and
    grad_conv."""
    if selected is None:
        _, selected, offsets = saved(x, w, b, m, s1, s2, op)
    gc, gb, gm = GRAD_CONV(grad_out, selected, offsets, m, s1, s2)
    gw = GRAD_WEIGHT(gc, offsets, x, expand(op))
    gi = GRAD_INPUT(gc, offsets, w, expand(op))
    return [gi, gw] + ([gb] if b is not None else []) + [gm], gc


def rel_l2(a, ref):
    a, ref = a.double(), ref.double()
    den = ref.norm().item()
    return (a - ref).norm().item() / (den if den > 0 else 1.0)


# The public wrapper at the geometry above.
def wrapper_call(x, w, b, m, s1=0.2, s2=0.3, op=1):
    return conv_transpose3d_post_pool(x, w, b, m, s1, 2, 1, op, negative_slope2=s2)
