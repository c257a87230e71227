"""Graph snapshot tests: fusion_pass.rewrite applied directly to the graph Dynamo produces.

A custom dynamo backend (pass_testing.RewriteBackend) counts call_function nodes before and after
`rewrite(gm.graph)`, then runs the rewritten graph eagerly so its result can be compared with the
original function. No inductor compile happens here, so these are cheap and broadly parametrized."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch_fused_ops
from torch_fused_ops.models import ConvTransposeLeakyMulLeakyPool
from fused_testing import DEVICES, EAGER_TOL, make_input, make_multiplier
from pass_testing import (DTYPES, FUSED, RewriteBackend, _isolated_inductor, categories,  # noqa: F401
                          fused_nodes)

pytestmark = pytest.mark.pass_settings(fuse_conv_transpose="off", fold_conv_bias="off")  # chains only (conftest.py)

C = 4
SHAPE = (2, C, 6, 7, 8)


def chain(x, m, s1=0.2, s2=None, mul="ym", pool=dict(kernel_size=2)):
    s2 = s1 if s2 is None else s2
    y = F.leaky_relu(x, s1)
    if mul == "ym":
        y = y * m
    elif mul == "my":
        y = m * y
    elif mul == "torch.mul(y,m)":
        y = torch.mul(y, m)
    elif mul == "torch.mul(m,y)":
        y = torch.mul(m, y)
    elif mul == "y.mul(m)":
        y = y.mul(m)
    else:
        raise ValueError(mul)
    return F.max_pool3d(F.leaky_relu(y, s2), **pool)


class MulModule(nn.Module):
    """Plain input -> chain, the multiplier held as a Parameter or a buffer, nn.LeakyReLU / nn.MaxPool3d."""

    def __init__(self, m, kind="parameter", upstream=None):
        super().__init__()
        if kind == "parameter":
            self.m = nn.Parameter(m.clone())
        else:
            self.register_buffer("m", m.clone())
        self.up = upstream if upstream is not None else nn.Identity()
        self.act = nn.LeakyReLU(0.2)
        self.pool = nn.MaxPool3d(2)

    def forward(self, x):
        return self.pool(self.act(self.act(self.up(x)) * self.m))


def mult(kind, dtype, device):
    return make_multiplier(kind, C, dtype=dtype, device=device)


# name -> builder(dtype, device) -> (callable, args)
FORMS = {
    "model": lambda dt, dev: (ConvTransposeLeakyMulLeakyPool(C, C, multiplier_shape=(C, 1, 1, 1)).to(dev, dt),
                              (make_input((1, C, 3, 4, 4), dt, dev),)),
    "model_channels_last": lambda dt, dev: (
        ConvTransposeLeakyMulLeakyPool(C, C, multiplier_shape=(C, 1, 1, 1)).to(dev, dt),
        (make_input((1, C, 3, 4, 4), dt, dev, "channels_last"),)),
    "conv3d_buffer": lambda dt, dev: (MulModule(mult("C111", dt, dev), "buffer", nn.Conv3d(C, C, 3, padding=1)).to(dev, dt),
                                      (make_input(SHAPE, dt, dev),)),
    "plain_parameter": lambda dt, dev: (MulModule(mult("1C111", dt, dev), "parameter").to(dev, dt),
                                        (make_input(SHAPE, dt, dev),)),
    "plain_buffer_channels_last": lambda dt, dev: (MulModule(mult("0d", dt, dev), "buffer").to(dev, dt),
                                                   (make_input(SHAPE, dt, dev, "channels_last"),)),
}
for _mul in ["ym", "my", "torch.mul(y,m)", "torch.mul(m,y)", "y.mul(m)"]:
    FORMS[f"functional_{_mul}"] = (lambda mul: lambda dt, dev: (
        lambda x, m: chain(x, m, mul=mul), (make_input(SHAPE, dt, dev), mult("C111", dt, dev))))(_mul)
for _kind in ["0d", "1111", "11111", "C111", "1C111", "0d_negative"]:
    FORMS[f"multiplier_{_kind}"] = (lambda kind: lambda dt, dev: (
        lambda x, m: chain(x, m), (make_input(SHAPE, dt, dev), mult(kind, dt, dev))))(_kind)
FORMS["two_slopes"] = lambda dt, dev: (lambda x, m: chain(x, m, 0.2, 0.05),
                                       (make_input(SHAPE, dt, dev), mult("C111", dt, dev)))
POOLS = {
    "k3s2p1": dict(kernel_size=3, stride=2, padding=1),
    "k231s123": dict(kernel_size=(2, 3, 1), stride=(1, 2, 3)),
    "k3s1p1d2": dict(kernel_size=3, stride=1, padding=1, dilation=2),
    "k2s2ceil": dict(kernel_size=2, stride=2, ceil_mode=True),
    "k2_stride_omitted": dict(kernel_size=2),
    "k2s2_stride_given": dict(kernel_size=2, stride=2),
}
for _name, _pool in POOLS.items():
    FORMS[f"pool_{_name}"] = (lambda pool: lambda dt, dev: (
        lambda x, m: chain(x, m, pool=pool), (make_input(SHAPE, dt, dev), mult("C111", dt, dev))))(_pool)
FORMS["pool_module_k3s2p1_ceil"] = lambda dt, dev: (
    lambda x, m: nn.MaxPool3d(3, 2, 1, ceil_mode=True)(F.leaky_relu(F.leaky_relu(x, 0.1) * m, 0.1)),
    (make_input(SHAPE, dt, dev), mult("C111", dt, dev)))
FORMS["torch.max_pool3d"] = lambda dt, dev: (
    lambda x, m: torch.max_pool3d(F.leaky_relu(F.leaky_relu(x, 0.1) * m, 0.1), [2, 2, 2], [2, 2, 2]),
    (make_input(SHAPE, dt, dev), mult("C111", dt, dev)))
FORMS["inplace_leaky_on_intermediate"] = lambda dt, dev: (
    lambda x, m: F.max_pool3d(F.leaky_relu(F.leaky_relu(x + 1, 0.2, inplace=True) * m, 0.2), 2),
    (make_input(SHAPE, dt, dev), mult("C111", dt, dev)))


def _check_close(out, expected, dtype, msg):
    if dtype == torch.float32:
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5, msg=lambda m: f"{msg}\n{m}")
    else:
        torch.testing.assert_close(out, expected, **EAGER_TOL[dtype], msg=lambda m: f"{msg}\n{m}")


def _capture(fn, args, **compile_kw):
    backend = RewriteBackend()
    out = torch.compile(fn, backend=backend, fullgraph=True, **compile_kw)(*args)
    assert len(backend.records) == 1, f"expected one graph, got {len(backend.records)}"
    return out, backend


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", list(FORMS))
def test_rewrite_matches(form, dtype, device):
    fn, args = FORMS[form](dtype, device)
    with torch.no_grad():
        expected = fn(*[a.clone() for a in args])
        out, backend = _capture(fn, [a.clone() for a in args])
    rec = backend.records[0]
    before, after = categories(rec["before"]), categories(rec["after"])
    assert before == dict(fused=0, leaky=2, mul=1, pool=1), f"unexpected Dynamo graph for {form}: {before}"
    assert rec["ret"] == 1, f"rewrite returned {rec['ret']} for {form}"
    assert after == dict(fused=1, leaky=0, mul=0, pool=0), f"after rewrite: {after}"
    # Nothing else in the graph changed (the conv etc. is still there once).
    others_before = {t: n for t, n in rec["before"].items() if not _is_chain(t)}
    others_after = {t: n for t, n in rec["after"].items() if not _is_chain(t) and t is not FUSED}
    assert others_before == others_after
    _check_close(out, expected, dtype, f"rewritten graph vs eager ({form})")


def _is_chain(t):
    from pass_testing import LEAKY_TARGETS, MUL_TARGETS, POOL_TARGETS
    return t in LEAKY_TARGETS or t in MUL_TARGETS or t in POOL_TARGETS or t == ("method", "mul")


def test_rewrite_two_slopes_and_pool_args_passed_on():
    x, m = make_input(SHAPE), mult("C111", torch.float32, "cpu")
    pool = dict(kernel_size=(2, 3, 1), stride=(1, 2, 3), padding=(1, 1, 0), dilation=(1, 1, 2), ceil_mode=True)
    with torch.no_grad():
        out, backend = _capture(lambda x, m: chain(x, m, 0.2, 0.05, pool=pool), (x, m))
    (node,) = fused_nodes(backend.graphs[0])
    args = list(node.args) + [None] * (9 - len(node.args))
    assert args[2] == pytest.approx(0.2)
    assert args[3] == [2, 3, 1]
    assert list(args[4]) == [1, 2, 3]
    assert list(args[5]) == [1, 1, 0] and list(args[6]) == [1, 1, 2] and args[7] is True
    assert args[8] == pytest.approx(0.05)
    torch.testing.assert_close(out, chain(x, m, 0.2, 0.05, pool=pool), rtol=1e-5, atol=1e-5)


def test_rewrite_symbolic_slopes_dynamic():
    """dynamic=True turns nn.LeakyReLU's slope into a symbolic float: the chain must still be fused."""
    model = ConvTransposeLeakyMulLeakyPool(C, C, multiplier_shape=(C, 1, 1, 1))
    x = make_input((1, C, 3, 4, 4))
    with torch.no_grad():
        out, backend = _capture(model, (x,), dynamic=True)
        expected = model(x)
    rec = backend.records[0]
    assert rec["ret"] == 1
    assert categories(rec["after"]) == dict(fused=1, leaky=0, mul=0, pool=0)
    (node,) = fused_nodes(backend.graphs[0])
    slope = node.args[2]
    assert isinstance(slope, torch.fx.Node) and isinstance(slope.meta.get("example_value"), torch.SymFloat), (
        f"expected a symbolic slope, got {slope!r}")
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_rewrite_multiple_chains_counted():
    x, m = make_input(SHAPE), mult("C111", torch.float32, "cpu")

    def two(x, m):
        return chain(x, m, pool=dict(kernel_size=2)), chain(x + 1, m, 0.1, pool=dict(kernel_size=3, stride=2))

    with torch.no_grad():
        out, backend = _capture(two, (x, m))
    assert backend.records[0]["ret"] == 2
    assert categories(backend.records[0]["after"])["fused"] == 2
    for o, e in zip(out, two(x, m)):
        torch.testing.assert_close(o, e, rtol=1e-5, atol=1e-5)


# ---- negative cases: rewrite returns 0 and the graph is untouched --------------------------------------------

def _neg_intermediate_used(x, m):
    y1 = F.leaky_relu(x, 0.2)
    return F.max_pool3d(F.leaky_relu(y1 * m, 0.2), 2), y1


def _neg_product_used(x, m):
    y2 = F.leaky_relu(x, 0.2) * m
    return F.max_pool3d(F.leaky_relu(y2, 0.2), 2), y2.sum()


def _neg_second_leaky_used(x, m):
    y3 = F.leaky_relu(F.leaky_relu(x, 0.2) * m, 0.2)
    return F.max_pool3d(y3, 2), y3 + 1


def _neg_return_indices(x, m):
    return F.max_pool3d(F.leaky_relu(F.leaky_relu(x, 0.2) * m, 0.2), 2, return_indices=True)


def _neg_inplace_on_input(x, m):
    return F.max_pool3d(F.leaky_relu(F.leaky_relu(x, 0.2, inplace=True) * m, 0.2), 2)


def _neg_scalar_python_float(x, m):
    return F.max_pool3d(F.leaky_relu(F.leaky_relu(x, 0.2) * 1.5, 0.2), 2)


NEGATIVES = {
    "first_leaky_used_elsewhere": (_neg_intermediate_used, "C111", torch.float32),
    "product_used_elsewhere": (_neg_product_used, "C111", torch.float32),
    "second_leaky_used_elsewhere": (_neg_second_leaky_used, "C111", torch.float32),
    "multiplier_varies_along_W": (chain, "W", torch.float32),
    "multiplier_varies_along_batch": (chain, "NC111", torch.float32),
    "multiplier_varies_along_D": (chain, "C11", torch.float32),
    # (A float32 multiplier of a bfloat16 input is autocast's mixed form, which fuses: test_pass_autocast.py.)
    "mixed_dtype_bf16_input_f64_multiplier": (chain, "C111_f64", torch.bfloat16),
    "return_indices": (_neg_return_indices, "C111", torch.float32),
    "inplace_first_leaky_on_graph_input": (_neg_inplace_on_input, "C111", torch.float32),
    "python_float_multiplier": (_neg_scalar_python_float, "C111", torch.float32),
}


def _neg_multiplier(kind, dtype, device):
    n, c, d, h, w = SHAPE
    g = torch.Generator().manual_seed(5)
    if kind == "W":
        return (torch.rand(1, 1, 1, 1, w, generator=g) + 0.5).to(device, dtype)
    if kind == "NC111":
        return (torch.rand(n, c, 1, 1, 1, generator=g) + 0.5).to(device, dtype)
    if kind == "C11":  # (C,1,1) broadcasts along D, not C
        return (torch.rand(d, 1, 1, generator=g) + 0.5).to(device, dtype)
    if kind == "C111_f64":
        return mult("C111", torch.float64, device)
    return mult(kind, dtype, device)


# With partial chains on (the default), a refused step stays in the graph and the safe suffix below it is still
# fused: (fused calls, LeakyReLUs left, multiplies left) per case; None: nothing is fused at all.
PARTIAL_OUTCOME = {
    "first_leaky_used_elsewhere": (1, 1, 0),      # mul -> leaky -> pool, the shared LeakyReLU stays
    "product_used_elsewhere": (1, 1, 1),          # leaky -> pool
    "second_leaky_used_elsewhere": None,          # the pool's input is shared: a lone pool, left alone
    "multiplier_varies_along_W": (1, 1, 1),       # leaky -> pool on the product
    "multiplier_varies_along_batch": (1, 1, 1),
    "multiplier_varies_along_D": (1, 1, 1),
    "mixed_dtype_bf16_input_f64_multiplier": (1, 1, 1),  # leaky -> pool on the float64 product
    "return_indices": None,
    "inplace_first_leaky_on_graph_input": (1, 1, 0),  # the in-place LeakyReLU stays (it mutates the input)
    "python_float_multiplier": (1, 1, 1),
}


@pytest.mark.parametrize("partial", [False, True], ids=["full_chain_only", "partial"])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(NEGATIVES))
def test_rewrite_refuses(case, device, partial):
    from torch_fused_ops import pass_config

    fn, mkind, dtype = NEGATIVES[case]
    x, m = make_input(SHAPE, dtype, device), _neg_multiplier(mkind, dtype, device)
    with torch.no_grad(), pass_config.patch(partial_chains=partial):
        x_eager = x.clone()
        expected = fn(x_eager, m)
        x_comp = x.clone()
        out, backend = _capture(fn, (x_comp, m))
    rec = backend.records[0]
    outcome = PARTIAL_OUTCOME[case] if partial else None
    if outcome is None:
        assert rec["ret"] == 0, f"{case}: rewrite returned {rec['ret']}"
        assert rec["after"] == rec["before"], f"{case}: graph changed"
        assert categories(rec["after"])["fused"] == 0
    else:
        after = categories(rec["after"])
        assert rec["ret"] == outcome[0], f"{case}: rewrite returned {rec['ret']}"
        assert (after["fused"], after["leaky"], after["mul"], after["pool"]) == (*outcome, 0), f"{case}: {after}"
    for o, e in zip(out if isinstance(out, tuple) else (out,), expected if isinstance(expected, tuple) else (expected,)):
        torch.testing.assert_close(o, e, rtol=0, atol=0)
    torch.testing.assert_close(x_comp, x_eager, rtol=0, atol=0)  # in-place effects as in eager


def test_rewrite_on_plain_fx_graph_and_idempotent():
    """rewrite() works on any fx Graph (here from symbolic_trace) and a second run finds nothing more."""
    gm = torch.fx.symbolic_trace(lambda x, m: chain(x, m, 0.3))
    x, m = make_input(SHAPE), mult("C111", torch.float32, "cpu")
    # symbolic_trace graphs carry no example values: the pass cannot prove dtype/shape facts, so must refuse
    assert torch_fused_ops.compile.fusion_pass.rewrite(gm.graph) == 0
    # with shape propagation the values are known and the chain is fused
    from torch.fx.passes.shape_prop import ShapeProp
    ShapeProp(gm).propagate(x, m)
    for n in gm.graph.nodes:
        if "tensor_meta" in n.meta and "val" not in n.meta:
            n.meta["val"] = torch.empty_strided(n.meta["tensor_meta"].shape, n.meta["tensor_meta"].stride,
                                                dtype=n.meta["tensor_meta"].dtype, device="meta")
    assert torch_fused_ops.compile.fusion_pass.rewrite(gm.graph) == 1
    assert torch_fused_ops.compile.fusion_pass.rewrite(gm.graph) == 0
    gm.recompile()
    with torch.no_grad():
        torch.testing.assert_close(gm(x, m), chain(x, m, 0.3), rtol=1e-5, atol=1e-5)
