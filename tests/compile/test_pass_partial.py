"""The pass on partial chains ending in the pool (mul -> leaky -> pool, leaky -> pool, leaky -> mul -> pool, ...).

Graph level (fusion_pass.rewrite on Dynamo's graph, run eagerly): each form is fused into one fused.post_pool with
the missing steps as identities, the forward bit-identical to eager in float32 (special values included), the
input gradient bit-identical and the multiplier gradient within a bound of eager's; unsafe steps stay in the
graph. End to end (torch.compile, inductor): every dtype, training, dynamic shapes, the conv routes.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch_fused_ops
from torch_fused_ops.compile import fusion_pass, pass_config
from fused_testing import DEVICES, EAGER_TOL, assert_bitwise_equal, make_input, make_multiplier
from pass_testing import (DTYPES, FUSED, RewriteBackend, _isolated_inductor, categories,  # noqa: F401
                          compile_run, fused_nodes)

pytestmark = pytest.mark.pass_settings(fuse_conv_transpose="off", fold_conv_bias="off")  # chains only (conftest.py)

C = 4
SHAPE = (2, C, 6, 7, 8)
FULL = torch.ops.aten.full.default


def f_mul_leaky(x, m):
    return F.max_pool3d(F.leaky_relu(x * m, 0.3), 2)


def f_leaky(x, m):
    return F.max_pool3d(F.leaky_relu(x, 0.3), 2)


def f_leaky_mul(x, m):
    return F.max_pool3d(F.leaky_relu(x, 0.3) * m, 2)


def f_mul(x, m):
    return F.max_pool3d(m * x, kernel_size=3, stride=2, padding=1)


def f_leaky_leaky(x, m):
    return F.max_pool3d(F.leaky_relu(F.leaky_relu(x, 0.2), -0.5), 2, ceil_mode=True)


# Forms whose pool windows overlap (an input element can be selected by two windows).
OVERLAPPING = {"mul"}

# form -> (function, (s1, s2) the fused call must carry, whether it uses the graph's multiplier)
FORMS = {
    "mul_leaky": (f_mul_leaky, (1.0, 0.3), True),
    "leaky": (f_leaky, (1.0, 0.3), False),
    "leaky_mul": (f_leaky_mul, (0.3, 1.0), True),
    "mul": (f_mul, (1.0, None), True),
    "leaky_leaky": (f_leaky_leaky, (0.2, -0.5), False),
}


def _capture(fn, args, **kw):
    backend = RewriteBackend()
    out = torch.compile(fn, backend=backend, fullgraph=True, **kw)(*args)
    assert len(backend.records) == 1
    return out, backend


def assert_same_bits(actual, expected, msg=""):
    """Equal bit patterns: -0.0 is not +0.0, and NaNs must carry the same sign and payload."""
    assert_bitwise_equal(actual, expected, msg)
    ints = {torch.float64: torch.int64, torch.float32: torch.int32, torch.bfloat16: torch.int16,
            torch.float16: torch.int16}[actual.dtype]
    a, e = actual.contiguous().view(ints), expected.contiguous().view(ints)
    assert torch.equal(a, e), f"{msg}: {(a != e).sum().item()} elements differ in their bits"


def special_input(shape, dtype, device, seed=0):
    """Random values with -0.0, +0.0, +-inf, NaN and subnormals sprinkled in (float32/float64 only)."""
    x = make_input(shape, dtype, device, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    tiny = torch.finfo(dtype).tiny
    specials = torch.tensor([-0.0, 0.0, float("inf"), -float("inf"), float("nan"), tiny / 4, -tiny / 8, tiny / 1024,
                             -tiny / 3], dtype=dtype)
    flat = x.view(-1)
    idx = torch.randperm(flat.numel(), generator=g)[: flat.numel() // 5]
    flat[idx] = specials[torch.randint(len(specials), (len(idx),), generator=g)].to(device)
    # Whole channels of specials, so that -0.0, subnormals and -inf are the maxima of some windows.
    x[0, 0] = -0.0
    x[0, 1] = -tiny / 4 * torch.rand(x[0, 1].shape, generator=g, dtype=dtype).to(device)
    x[0, 2] = -float("inf")
    return x


# ---- graph level: matched ------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("form", list(FORMS))
def test_partial_form_fused_bit_exact(form, dtype, device):
    fn, (s1, s2), uses_m = FORMS[form]
    x = special_input(SHAPE, dtype, device)
    m = make_multiplier("C111", C, dtype=dtype, device=device) * torch.tensor([1, -1, 1, 1], dtype=dtype,
                                                                              device=device).view(C, 1, 1, 1)
    with torch.no_grad():
        out, backend = _capture(fn, (x, m))
        expected = fn(x, m)
    rec = backend.records[0]
    assert rec["ret"] == 1
    after = categories(rec["after"])
    assert (after["fused"], after["leaky"], after["mul"], after["pool"]) == (1, 0, 0, 0), after
    (node,) = fused_nodes(backend.graphs[0])
    assert node.args[2] == s1 and node.args[8] == s2, node.args
    mult = node.args[1]
    if uses_m:
        assert mult.op == "placeholder"
    else:  # the unit multiplier: a 0-d constant of the input's dtype and device, built in the graph
        assert mult.target is FULL and mult.args == ([], 1.0), mult.format_node()
        assert mult.kwargs["dtype"] == dtype and torch.device(mult.kwargs["device"]).type == torch.device(device).type
        assert tuple(mult.meta["example_value"].shape) == ()
    assert_same_bits(out, expected, msg=form)
    outs = [out[0, c] for c in range(3)]
    assert out.isnan().any() and (outs[0] == 0).all() and outs[2].isinf().all(), "specials should reach the output"
    assert ((outs[1] != 0) & (outs[1].abs() < torch.finfo(dtype).tiny)).any(), "subnormals should reach the output"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_lone_leaky_is_bit_exact_in_every_dtype(dtype, device):
    # One step, one rounding: the fused op computes leaky in float32 and rounds once, as eager's kernel does.
    x = make_input(SHAPE, dtype, device, seed=4)
    with torch.no_grad():
        out, backend = _capture(f_leaky, (x, None))
    assert backend.records[0]["ret"] == 1
    assert_same_bits(out, f_leaky(x, None))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", list(FORMS))
def test_partial_form_gradients_match_eager(form, device):
    fn, _, uses_m = FORMS[form]
    x0 = make_input(SHAPE, torch.float32, device, seed=7)
    m0 = make_multiplier("C111", C, dtype=torch.float32, device=device)
    grads = []
    for compiled in (False, True):
        x, m = x0.clone().requires_grad_(), m0.clone().requires_grad_()
        out = _capture(fn, (x, m))[0] if compiled else fn(x, m)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(device)
        grads.append(torch.autograd.grad(out, (x, m) if uses_m else (x,), g))
    want, got = grads
    # Equal values; not always equal bits: the gradient of an element no window selected is +0.0 from the op,
    # while eager multiplies the zeros max_pool3d's backward scatters by m and the slopes (-0.0 where negative).
    if form in OVERLAPPING and torch.device(device).type == "cuda":
        # Overlapping windows: eager's CUDA max_pool3d backward adds the windows' gradients with atomics, in no
        # fixed order, while ours adds them in window order, so an element two windows selected may differ by
        # the last bit.
        torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-7, msg="input gradient")
    else:
        assert_bitwise_equal(got[0], want[0], msg="input gradient")
        nonzero = want[0] != 0
        assert nonzero.any()
        assert_same_bits(got[0][nonzero], want[0][nonzero], msg="input gradient, selected elements")
    if uses_m:
        # Same products, another summation order: no further from the float64 gradient than eager's float32 one
        # (within a factor 2), or than one float32 rounding of its largest entry.
        x, m = x0.double().requires_grad_(), m0.double().requires_grad_()
        out = fn(x, m)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).double().to(device)
        ref = torch.autograd.grad(out, (m,), g)[0]
        err_fused = (got[1].double() - ref).abs().max().item()
        err_eager = (want[1].double() - ref).abs().max().item()
        floor = torch.finfo(torch.float32).eps * ref.abs().max().item()
        assert err_fused <= 2 * max(err_eager, floor), (form, err_fused, err_eager, floor)


# ---- graph level: refused ------------------------------------------------------------------------------------

def r_product_used(x, m):
    y = x * m
    return F.max_pool3d(F.leaky_relu(y, 0.3), 2), y.sum()


def r_leaky_used(x, m):
    y = F.leaky_relu(x, 0.3)
    return F.max_pool3d(y, 2), y.mean()


def r_leaky_mul_product_used(x, m):
    y = F.leaky_relu(x, 0.3) * m
    return F.max_pool3d(y, 2), y + 1


def r_lone_pool(x, m):
    return F.max_pool3d(x, 2)


def r_inplace_on_input(x, m):
    return F.max_pool3d(F.leaky_relu(x, 0.3, inplace=True), 2)


def r_inplace_on_view(x, m):
    y = x + 1
    v = y[:, :2]
    return F.max_pool3d(F.leaky_relu(v, 0.3, inplace=True), 2), y


def r_mul_varies_along_w(x, m):
    return F.max_pool3d(x * m, 2)


def r_mul_promotes(x, m):
    return F.max_pool3d(F.leaky_relu(x * m.double(), 0.3), 2)


def r_pool_4d(x, m):
    return F.max_pool3d(F.leaky_relu(x[0], 0.3), 2)


# case -> (function, multiplier kind, (fused, leaky, mul) left after the rewrite)
REFUSED = {
    "product_used_elsewhere": (r_product_used, "C111", (1, 0, 1)),  # leaky -> pool fused, the product stays
    "lone_leaky_used_elsewhere": (r_leaky_used, "C111", (0, 1, 0)),  # only a pool would be left
    "leaky_mul_product_used": (r_leaky_mul_product_used, "C111", (0, 1, 1)),
    "lone_pool": (r_lone_pool, "C111", (0, 0, 0)),
    "inplace_leaky_on_graph_input": (r_inplace_on_input, "C111", (0, 1, 0)),
    "inplace_leaky_on_view": (r_inplace_on_view, "C111", (0, 1, 0)),
    "multiplier_varies_along_W": (r_mul_varies_along_w, "W", (0, 0, 1)),
    "multiplier_promotes_dtype": (r_mul_promotes, "C111", (1, 0, 1)),  # leaky -> pool on the float64 product
    "unbatched_4d_pool": (r_pool_4d, "C111", (0, 1, 0)),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_partial_form_refused_where_unsafe(case):
    fn, mkind, left = REFUSED[case]
    x = make_input(SHAPE, torch.float32, "cpu", seed=9)
    m = (torch.rand(1, 1, 1, 1, SHAPE[-1]) + 0.5) if mkind == "W" else make_multiplier("C111", C)
    x_eager, x_comp = x.clone(), x.clone()
    with torch.no_grad():
        expected = fn(x_eager, m)
        out, backend = _capture(fn, (x_comp, m))
    rec = backend.records[0]
    after = categories(rec["after"])
    assert rec["ret"] == left[0] and (after["fused"], after["leaky"], after["mul"]) == left, (case, after)
    if left[0] == 0:
        assert rec["after"] == rec["before"]
    for o, e in zip(out if isinstance(out, tuple) else (out,), expected if isinstance(expected, tuple) else (expected,)):
        torch.testing.assert_close(o, e, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(x_comp, x_eager, rtol=0, atol=0)  # in-place effects as in eager


def test_partial_chains_off_fuses_only_the_full_chain():
    x, m = make_input(SHAPE), make_multiplier("C111", C)
    with torch.no_grad(), pass_config.patch(partial_chains=False):
        for fn, *_ in FORMS.values():
            torch._dynamo.reset()
            assert _capture(fn, (x, m))[1].records[0]["ret"] == 0


def test_module_form_and_export_spelling():
    class Tail(nn.Module):  # what DDP's splitter leaves after a bucket boundary at the multiply
        def __init__(self):
            super().__init__()
            self.m = nn.Parameter(torch.rand(C, 1, 1, 1) + 0.5)
            self.act = nn.LeakyReLU(0.2)
            self.pool = nn.MaxPool3d(2)

        def forward(self, x):
            return self.pool(self.act(x * self.m)), self.pool(nn.functional.leaky_relu(x + 1, 0.1))

    mod, x = Tail(), make_input(SHAPE, seed=11)
    with torch.no_grad():
        out, backend = _capture(mod, (x,))
        expected = mod(x)
    assert backend.records[0]["ret"] == 2
    for o, e in zip(out, expected):
        assert_bitwise_equal(o, e)
    for decompose in (False, True):
        ep = torch.export.export(mod, (x,))
        ep = ep.run_decompositions() if decompose else ep
        assert fusion_pass.rewrite(ep.graph_module.graph) == 2
        ep.graph_module.recompile()
        targets = [n.target for n in ep.graph_module.graph.nodes if n.op == "call_function"]
        assert targets.count(FUSED) == 2 and FULL in targets
        with torch.no_grad():
            for o, e in zip(ep.module()(x), expected):
                assert_bitwise_equal(o, e)


# ---- end to end ---------------------------------------------------------------------------------------------

def chains(x, m):
    """Three partial forms in one graph (one Inductor compile for all)."""
    return f_mul_leaky(x, m), f_leaky(x + 1, m), f_leaky_mul(x * 2, m)


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_e2e_partial_forms(dtype, device):
    x, m = make_input(SHAPE, dtype, device, seed=13), make_multiplier("C111", C, dtype=dtype, device=device)
    with torch.no_grad():
        out, code, matched = compile_run(chains, x, m)
        expected = chains(x, m)
    assert matched == 3 and "post_pool" in code
    for o, e in zip(out, expected):
        if dtype == torch.float32:
            assert_bitwise_equal(o, e)
        else:
            torch.testing.assert_close(o, e, **EAGER_TOL[dtype])


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_e2e_partial_forms_training(device):
    x0, m0 = make_input(SHAPE, device=device, seed=17), make_multiplier("C111", C, device=device)
    results = []
    for compiled in (False, True):
        x, m = x0.clone().requires_grad_(), m0.clone().requires_grad_()
        if compiled:
            out, _, matched = compile_run(chains, x, m)
            assert matched == 3
        else:
            out = chains(x, m)
        loss = sum((o * (i + 1)).sum() for i, o in enumerate(out))
        results.append([*out, *torch.autograd.grad(loss, (x, m))])
    for name, a, e in zip(("out0", "out1", "out2", "grad x"), results[1], results[0]):
        assert_bitwise_equal(a, e, msg=name)
    torch.testing.assert_close(results[1][-1], results[0][-1], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_e2e_partial_forms_dynamic_shapes():
    torch._dynamo.reset()
    before = torch_fused_ops.matched_count()
    compiled = torch.compile(chains, dynamic=True, fullgraph=True)
    # The second shape keeps SHAPE's parity in D, H and W: torch 2.11's max_pool3d meta guards on it (div_rtn,
    # "(D - 2) % 2 == 0"), so a change of parity recompiles there with the pass or without it.
    for shape in [SHAPE, (3, C, 8, 9, 6)]:
        x, m = make_input(shape, seed=19), make_multiplier("C111", C)
        with torch.no_grad():
            for o, e in zip(compiled(x, m), chains(x, m)):
                assert_bitwise_equal(o, e)
    assert torch_fused_ops.matched_count() - before == 3  # one compilation served both shapes


class ConvLeakyPool(nn.Module):
    """conv_transpose3d -> leaky -> pool: the partial form joins the convolution on its route."""

    def __init__(self):
        super().__init__()
        self.conv = nn.ConvTranspose3d(4, 6, 3, stride=2, padding=1, output_padding=1)

    def forward(self, x):
        return F.max_pool3d(F.leaky_relu(self.conv(x), 0.2), 2)


@pytest.mark.slow
@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_e2e_partial_form_joins_conv_and_bias_routes(grad):
    torch.manual_seed(0)
    model = ConvLeakyPool().double()
    x = torch.randn(2, 4, 3, 4, 4, dtype=torch.float64, requires_grad=grad)
    for settings, op in ((dict(fuse_conv_transpose="always", conv_in_training=True), "conv_transpose3d_post_pool"),
                         (dict(fold_conv_bias="always"), "post_pool_bias")):
        with pass_config.patch(**settings), torch.set_grad_enabled(grad):
            out, code, matched = compile_run(model, x)
            ref = model(x)
        assert matched == 1 and op in code, settings
        torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
        if grad:
            params = (x, model.conv.weight, model.conv.bias)
            for a, e in zip(torch.autograd.grad(out.sum(), params), torch.autograd.grad(ref.sum(), params)):
                torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12)


class ConvPartial(nn.Module):
    """The KernelBench convolution feeding a partial chain: `mul -> leaky -> pool` or `leaky -> pool`."""

    def __init__(self, form):
        super().__init__()
        self.form = form
        self.conv = nn.ConvTranspose3d(16, 32, 3, stride=2, padding=1, output_padding=1)
        self.m = nn.Parameter(torch.rand(32, 1, 1, 1) + 0.5)

    def forward(self, x):
        y = self.conv(x)
        y = y * self.m if self.form == "mul_leaky" else y
        return F.max_pool3d(F.leaky_relu(y, 0.2), 2)


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("form", ["mul_leaky", "leaky"])
def test_cuda_partial_forms_join_the_fused_convolution(form):
    # CUDA inference: the partial chain joins the convolution in fused.conv_transpose3d_post_pool (strict float32:
    # the isolated inductor fixture turns TF32 off), compared with eager float64.
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    model = ConvPartial(form).cuda()
    x = torch.randn(2, 16, 4, 6, 6, device="cuda")
    with torch.no_grad(), pass_config.patch(fuse_conv_transpose="cuda"):
        ref = model.double()(x.double()).float()
        model.float()
        torch._dynamo.reset()
        before = torch_fused_ops.matched_count()
        out, code = run_and_get_code(torch.compile(model), x)
    code = "\n".join(code)
    assert torch_fused_ops.matched_count() - before == 1
    assert "extern_kernels.convolution(" not in code and "conv_transpose3d_post_pool" in code
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("conv_in_training", [False, True])
def test_cuda_partial_form_training_routes(conv_in_training):
    # Training: the fused op by default (conv_in_training); cuDNN's convolution + fused.post_pool(_bias) without
    # it. Gradients against eager's (TF32 off), by relative norm: the fused op's convolution rounds differently
    # from cuDNN's, and a near-tied window may then select another element.
    torch.manual_seed(0)
    model = ConvPartial("mul_leaky").cuda()
    x = torch.randn(2, 16, 4, 6, 6, device="cuda", requires_grad=True)
    params = [x, model.conv.weight, model.conv.bias, model.m]
    ref = model(x)
    want = torch.autograd.grad(ref.sum(), params)
    with pass_config.patch(fuse_conv_transpose="cuda", fold_conv_bias="cuda", conv_in_training=conv_in_training):
        out, code, matched = compile_run(model, x)
    assert matched == 1
    assert ("conv_transpose3d_post_pool" in code) == conv_in_training
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    for name, a, e in zip(("input", "weight", "bias", "multiplier"), torch.autograd.grad(out.sum(), params), want):
        rel = ((a - e).norm() / e.norm()).item()
        assert rel < (1e-3 if conv_in_training else 1e-5), f"grad {name}: relative error {rel:.2e}"


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_unit_multiplier_needs_no_host_sync():
    # The unit multiplier is built on the device inside the compiled graph: a call after the compiling one runs
    # with CUDA's sync debug mode set to raise on any synchronising operation.
    torch._dynamo.reset()
    x = make_input(SHAPE, device="cuda", seed=23)
    compiled = torch.compile(f_leaky, fullgraph=True)
    before = torch_fused_ops.matched_count()
    with torch.no_grad():
        compiled(x, None)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = compiled(x, None)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert_bitwise_equal(out, f_leaky(x, None))
    assert torch_fused_ops.matched_count() - before == 1
