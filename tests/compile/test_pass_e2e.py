"""End-to-end tests of the fusion pass through torch.compile(backend="inductor").

Each compile is checked three ways: the generated code calls fused.post_pool (run_and_get_code),
torch_fused_ops.matched_count() went up by the number of chains, and the output equals eager (float32:
atol=rtol=1e-5; half dtypes: no further from eager than inductor's compilation of the unfused chain).
Inductor compiles C++ on the CPU, so shapes are tiny and several chains share one compile."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch_fused_ops
from torch_fused_ops.models import ConvTransposeLeakyMulLeakyPool
from fused_testing import DEVICES, make_input, make_multiplier, requires_cuda
from pass_testing import (DTYPES, _isolated_inductor, as_tuple, assert_matches_eager, compile_run,  # noqa: F401
                          compile_run_without_pass)

pytestmark = [pytest.mark.slow,
              pytest.mark.pass_settings(fuse_conv_transpose="off", fold_conv_bias="off")]  # chains only (conftest.py)

CIN, COUT = 16, 32
X_SHAPE = (2, CIN, 4, 8, 8)  # conv output (2, 32, 8, 16, 16)


def model_and_input(dtype=torch.float32, device="cpu", layout="contiguous", shape=X_SHAPE):
    torch.manual_seed(0)
    model = ConvTransposeLeakyMulLeakyPool().to(device=device, dtype=dtype)
    return model, make_input(shape, dtype, device, layout, seed=3)


# ---- the unmodified KernelBench model ------------------------------------------------------------------------

MODEL_CASES = [
    pytest.param(torch.float32, "contiguous", False, id="f32-contiguous-nograd"),
    pytest.param(torch.float32, "channels_last", True, id="f32-channels_last-grad"),
    pytest.param(torch.bfloat16, "contiguous", False, id="bf16-contiguous-nograd"),
    pytest.param(torch.float16, "channels_last", False, id="f16-channels_last-nograd"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,layout,grad", MODEL_CASES)
def test_model_fused_end_to_end(dtype, layout, grad, device):
    shape = X_SHAPE if dtype == torch.float32 else (1, CIN, 2, 4, 4)  # CPU half is slow
    model, x = model_and_input(dtype, device, layout, shape)
    with torch.set_grad_enabled(grad):
        expected = model(x)
        out, code, matched = compile_run(model, x)
        nopass = compile_run_without_pass(model, x) if dtype != torch.float32 else None
    assert "post_pool" in code, "generated code does not call fused.post_pool"
    assert matched == 1, f"matched_count increased by {matched}, expected 1"
    assert out.requires_grad == grad
    assert_matches_eager(out.detach(), expected.detach(), nopass, f"Model {dtype} {layout}")


# ---- many forms in one compile -------------------------------------------------------------------------------

C = 4


def many_forms(x, m_c111, m_0d, m_1111, m_1c111):
    """Seven independent chains over one plain input tensor: each multiply spelling, both multiplier
    shapes, two slopes and the MaxPool3d variants. All must be fused."""
    lr = F.leaky_relu
    return (
        F.max_pool3d(lr(lr(x, 0.2) * m_c111, 0.2), 2),                                   # y*m, stride omitted
        F.max_pool3d(lr(m_0d * lr(x, 0.2), 0.2), 2, 2),                                  # m*y, 0-d, stride given
        F.max_pool3d(lr(torch.mul(lr(x, 0.2), m_1111), 0.05), 3, 2, 1),                  # torch.mul, 2 slopes
        F.max_pool3d(lr(lr(x, 0.3).mul(m_1c111), 0.3), (2, 3, 1), (1, 2, 3)),            # .mul, (1,C,1,1,1)
        F.max_pool3d(lr(torch.mul(m_c111, lr(x, 0.1)), 0.1), 3, 1, 1, dilation=2),       # torch.mul(m, y)
        F.max_pool3d(lr(lr(x, 0.2) * m_c111, 0.2), 2, 2, ceil_mode=True),                # ceil_mode
        nn.functional.max_pool3d(nn.LeakyReLU(0.25)(nn.LeakyReLU(0.25)(x) * m_0d), 3, 2, 1, 1, True),
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_forms_fused_end_to_end(dtype, device):
    shape = (2, C, 5, 6, 7) if dtype == torch.float32 else (1, C, 3, 4, 5)
    x = make_input(shape, dtype, device, seed=11)
    ms = [make_multiplier(k, C, dtype, device, seed=12 + i) for i, k in enumerate(["C111", "0d", "1111", "1C111"])]
    with torch.no_grad():
        expected = many_forms(x, *ms)
        out, code, matched = compile_run(many_forms, x, *ms)
        nopass = compile_run_without_pass(many_forms, x, *ms) if dtype != torch.float32 else [None] * len(out)
    assert "post_pool" in code
    assert matched == len(expected), f"{matched} of {len(expected)} chains fused"
    for i, (o, e, n) in enumerate(zip(out, expected, nopass)):
        assert_matches_eager(o, e, n, f"chain {i} ({dtype})")


class ConvBufferChain(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(C, C, 3, padding=1)
        self.register_buffer("scale", make_multiplier("C111", C))
        self.act = nn.LeakyReLU(0.2)
        self.pool = nn.MaxPool3d(2)

    def forward(self, x):
        return self.pool(self.act(self.act(self.conv(x)) * self.scale))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_conv3d_buffer_multiplier(layout, device):
    model = ConvBufferChain().to(device)
    x = make_input((2, C, 4, 6, 6), torch.float32, device, layout, seed=21)
    with torch.no_grad():
        expected = model(x)
        out, code, matched = compile_run(model, x)
    assert "post_pool" in code and matched == 1
    assert_matches_eager(out, expected, msg=f"Conv3d + buffer ({layout})")


# ---- training --------------------------------------------------------------------------------------------------

def _grads(model, x, g, compiled_fn=None):
    model.zero_grad(set_to_none=True)
    if x.requires_grad:
        x.grad = None
    out = (model if compiled_fn is None else compiled_fn)(x)
    (out * g).sum().backward()
    return out.detach(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}, x.grad


@pytest.mark.parametrize("device", DEVICES)
def test_training_gradients_match_eager_and_use_backward_op(device):
    model, x0 = model_and_input(device=device)
    g = torch.randn(2, COUT, 4, 8, 8, generator=torch.Generator().manual_seed(4)).to(device)
    x = x0.clone().requires_grad_()
    out_e, grads_e, gx_e = _grads(model, x, g)

    compiled = torch.compile(model, backend="inductor", fullgraph=True)
    xc = x0.clone().requires_grad_()
    before = torch_fused_ops.matched_count()
    from torch._inductor.utils import run_and_get_code
    (out_c, grads_c, gx_c), codes = run_and_get_code(_grads, model, xc, g, compiled)
    code = "\n".join(codes)
    assert torch_fused_ops.matched_count() - before == 1
    assert "post_pool_backward" in code, "the backward does not use fused.post_pool_backward"
    assert "post_pool_with_offsets" in code or "post_pool" in code
    torch.testing.assert_close(out_c, out_e, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gx_c, gx_e, rtol=1e-5, atol=1e-5)
    assert set(grads_c) == {"conv_transpose.weight", "conv_transpose.bias", "multiplier"}
    for name in ("conv_transpose.weight", "conv_transpose.bias"):
        torch.testing.assert_close(grads_c[name], grads_e[name], rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}\n{m}")
    torch.testing.assert_close(grads_c["multiplier"], grads_e["multiplier"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("input_requires_grad", [False, True], ids=["x_nograd", "x_grad"])
def test_training_frozen_upstream(input_requires_grad, device):
    model, x0 = model_and_input(device=device, shape=(1, CIN, 2, 4, 4))
    model.conv_transpose.requires_grad_(False)
    g = torch.randn(1, COUT, 2, 4, 4, generator=torch.Generator().manual_seed(5)).to(device)
    x = x0.clone().requires_grad_(input_requires_grad)
    out_e, grads_e, gx_e = _grads(model, x, g)
    xc = x0.clone().requires_grad_(input_requires_grad)
    before = torch_fused_ops.matched_count()
    out_c, grads_c, gx_c = _grads(model, xc, g, torch.compile(model, backend="inductor", fullgraph=True))
    assert torch_fused_ops.matched_count() - before == 1
    torch.testing.assert_close(out_c, out_e, rtol=1e-5, atol=1e-5)
    assert set(grads_c) == {"multiplier"}
    torch.testing.assert_close(grads_c["multiplier"], grads_e["multiplier"], rtol=1e-4, atol=1e-4)
    if input_requires_grad:
        torch.testing.assert_close(gx_c, gx_e, rtol=1e-5, atol=1e-5)
    else:
        assert gx_c is None


# ---- shapes ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_dynamic_true(device):
    model, _ = model_and_input(device=device)
    compiled = torch.compile(model, backend="inductor", dynamic=True)
    before = torch_fused_ops.matched_count()
    from torch._inductor.utils import run_and_get_code
    with torch.no_grad():
        # no size-1 dims (specialized even with dynamic=True) and no equal sizes (duck sizing) in the first shape
        for i, shape in enumerate([(2, CIN, 3, 4, 5), (3, CIN, 4, 5, 6), (5, CIN, 2, 3, 7)]):
            x = make_input(shape, device=device, seed=30 + i)
            if i == 0:
                out, codes = run_and_get_code(compiled, x)
                assert "post_pool" in "\n".join(codes)
                # (>= 1: with symbolic slopes Dynamo may restart the analysis once, and the pass then runs again)
                assert torch_fused_ops.matched_count() - before >= 1
                assert torch._inductor.config.pre_grad_custom_pass.last_matched_count == 1
                after_first = torch_fused_ops.matched_count()
            else:
                out = compiled(x)
            assert_matches_eager(out, model(x), msg=f"dynamic shape {shape}")
    assert torch_fused_ops.matched_count() == after_first, "dynamic=True recompiled for a new shape"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mark_dynamic", [False, True], ids=["automatic", "mark_dynamic"])
def test_automatic_dynamic_recompile(mark_dynamic, device):
    model, _ = model_and_input(device=device)
    compiled = torch.compile(model, backend="inductor")
    before = torch_fused_ops.matched_count()
    with torch.no_grad():
        for i, n in enumerate([2, 3, 4]):
            x = make_input((n, CIN, 2, 4, 4), device=device, seed=40 + i)
            if mark_dynamic:
                torch._dynamo.mark_dynamic(x, 0)
            assert_matches_eager(compiled(x), model(x), msg=f"batch {n}")
    matched = torch_fused_ops.matched_count() - before
    # automatic: static graph for batch 2, then one dynamic graph; mark_dynamic: one dynamic graph.
    assert matched == (1 if mark_dynamic else 2), f"matched {matched} graphs"
    assert torch_fused_ops.compile.fusion_pass.PostPoolFusionPass is type(torch._inductor.config.pre_grad_custom_pass)
    assert torch._inductor.config.pre_grad_custom_pass.last_matched_count == 1


# ---- compile modes (CUDA only: max-autotune on CPU takes minutes) ---------------------------------------------

@requires_cuda
@pytest.mark.parametrize("mode", ["max-autotune", "reduce-overhead"])
def test_compile_modes_cuda(mode):
    model, x = model_and_input(device="cuda", shape=(1, CIN, 2, 4, 4))
    with torch.no_grad():
        expected = model(x)
        out, code, matched = compile_run(model, x, mode=mode)
        out = out.clone()
    assert "post_pool" in code and matched == 1
    assert_matches_eager(out, expected, msg=mode)


# ---- negative cases: compiled as without the pass ---------------------------------------------------------------

def _first_leaky_returned(x, m):
    y1 = F.leaky_relu(x, 0.2)
    return F.max_pool3d(F.leaky_relu(y1 * m, 0.2), 2), y1


def _plain(x, m):
    return F.max_pool3d(F.leaky_relu(F.leaky_relu(x, 0.2) * m, 0.2), 2)


def _with_indices(x, m):
    return F.max_pool3d(F.leaky_relu(F.leaky_relu(x, 0.2) * m, 0.2), 2, return_indices=True)


def _inplace_on_input(x, m):
    return F.max_pool3d(F.leaky_relu(F.leaky_relu(x, 0.2, inplace=True) * m, 0.2), 2)


NEG_SHAPE = (2, C, 4, 4, 6)
NEGATIVE_CASES = {
    "intermediate_returned": (_first_leaky_returned, torch.float32, lambda d: make_multiplier("C111", C, device=d)),
    "multiplier_along_W": (_plain, torch.float32,
                           lambda d: torch.linspace(0.5, 1.5, NEG_SHAPE[-1], device=d).view(1, 1, 1, 1, -1)),
    "multiplier_along_batch": (_plain, torch.float32,
                               lambda d: torch.linspace(-1.5, 1.5, 2 * C, device=d).view(2, C, 1, 1, 1)),
    # (bfloat16 * float32 is autocast's mixed form, which fuses: test_pass_autocast.py.)
    "mixed_dtypes_bf16_f64": (_plain, torch.bfloat16,
                              lambda d: make_multiplier("C111", C, dtype=torch.float64, device=d)),
    "return_indices": (_with_indices, torch.float32, lambda d: make_multiplier("C111", C, device=d)),
    "inplace_leaky_on_graph_input": (_inplace_on_input, torch.float32, lambda d: make_multiplier("C111", C, device=d)),
}


# With partial chains on, the refused step stays and the suffix after it is fused (test_pass_graph.py checks which
# nodes remain); only a chain whose pool has nothing safe before it is left whole.
PARTIAL_MATCHES = {"return_indices": 0}


@pytest.mark.parametrize("partial", [False, True], ids=["full_chain_only", "partial"])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(NEGATIVE_CASES))
def test_negative_not_fused(case, device, partial):
    from torch_fused_ops import pass_config

    fn, dtype, make_m = NEGATIVE_CASES[case]
    x, m = make_input(NEG_SHAPE, dtype, device, seed=50), make_m(device)
    with torch.no_grad(), pass_config.patch(partial_chains=partial):
        x_eager, x_comp = x.clone(), x.clone()
        expected = as_tuple(fn(x_eager, m))
        out, code, matched = compile_run(fn, x_comp, m)
    want = PARTIAL_MATCHES.get(case, 1) if partial else 0
    assert matched == want, f"{case}: the pass matched {matched} chain(s)"
    assert ("post_pool" in code) == bool(want), f"{case}: generated code and fused.post_pool"
    for o, e in zip(as_tuple(out), expected):
        if o.dtype in (torch.int64,):
            assert torch.equal(o, e), f"{case}: indices differ"
        elif dtype == torch.float32 and o.dtype == torch.float32:
            torch.testing.assert_close(o, e, rtol=1e-5, atol=1e-5)
        else:  # promoted to float32 from bf16 math: compare with eager's own tolerance
            torch.testing.assert_close(o, e, rtol=1.6e-2, atol=1.6e-2)
    # the user's tensor is mutated exactly as in eager (only the in-place case mutates it)
    torch.testing.assert_close(x_comp, x_eager, rtol=0, atol=0)
    if case == "inplace_leaky_on_graph_input":
        assert not torch.equal(x_comp, x), "eager mutates x; the compiled function must too"
