"""Inductor's generated code calls our operators through torch_fused_ops.compile.extern_calls (a typed C entry point,
csrc/compiled_calls.cpp) instead of torch.ops: the generated line names the call, the results, gradients and errors
are torch.ops', arguments that are not plain and __torch_function__ modes go to torch.ops, and the C++ wrapper, the
environment switch and code cached without a call keep working."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch._inductor.utils import run_and_get_code
from torch.overrides import TorchFunctionMode

import torch_fused_ops
from torch_fused_ops.compile import extern_calls
from torch_fused_ops.models import ConvTransposeLeakyMulLeakyPool
from fused_testing import HAS_CUDA, conv_operands

pytestmark = pytest.mark.slow

try:
    from torch._inductor.codegen.custom_extern_kernel_codegen import CUSTOM_EXTERN_KERNEL_CODEGEN
except ImportError:  # a torch without the registry: generated code calls torch.ops
    CUSTOM_EXTERN_KERNEL_CODEGEN = None
needs_registry = pytest.mark.skipif(CUSTOM_EXTERN_KERNEL_CODEGEN is None,
                                    reason="this torch has no custom extern kernel codegen registry")
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU"))]
# A call of ours in generated code, and torch.ops' call of one of our operators (not the metadata asserts' strings).
OUR_CALL = re.compile(r"= _fused_calls\.\w+\(")
OPS_CALL = re.compile(r"= torch\.ops\.fused\.\w+\.default\(")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False):
        yield
    torch._dynamo.reset()


def test_every_operator_has_a_call():
    # Every operator but _set_cpu_huge_pages (no tensor returned, never in a graph).
    want = {"post_pool_default", "post_pool_with_offsets_default", "post_pool_backward_default",
            "post_pool_bias_default", "post_pool_bias_with_offsets_default", "post_pool_bias_backward_default",
            "_post_pool_backward_tuned_default", "conv_transpose3d_post_pool_default",
            "conv_transpose3d_post_pool_with_offsets_default", "_conv_transpose3d_post_pool_cast_default",
            "_conv_transpose3d_post_pool_grad_conv_default", "_conv_transpose3d_post_pool_grad_weight_default",
            "_conv_transpose3d_post_pool_grad_input_default"}
    assert set(extern_calls._calls) == want
    for name in want:
        assert getattr(extern_calls, name) is extern_calls._calls[name]


def _inputs(device):
    """The convolution's operands, and a post_pool input y for its 6 channels."""
    y = torch.randn(2, 6, 6, 8, 10, generator=torch.Generator().manual_seed(6)).to(device)
    return (*conv_operands(device, seed=5), y)


def _equal(got, want):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
def test_calls_equal_torch_ops(device):
    x, w, b, m, y = _inputs(device)
    conv = (x, w, b, [2] * 3, [1] * 3, [1] * 3, 1, [1] * 3, m, 0.2, [2] * 3, [], [0] * 3, [1] * 3, False, None)
    pool = (y, m, 0.2, [2] * 3, [], 0, 1, False, 0.3)  # int[3] given as one int, as a schema default is written
    for name, args in (("conv_transpose3d_post_pool", conv), ("conv_transpose3d_post_pool_with_offsets", conv),
                       ("_conv_transpose3d_post_pool_cast", conv[:3] + (torch.bfloat16,) + conv[3:]),  # a dtype
                       ("post_pool", pool), ("post_pool_with_offsets", pool),
                       ("post_pool_bias", (y, b) + pool[1:]), ("post_pool_bias_with_offsets", (y, b) + pool[1:])):
        op = getattr(torch.ops.fused, name).default
        _equal(getattr(extern_calls, f"{name}_default")(*args), op(*args))
    # The backward operators, from the forward's saved tensors (int lists and a SymInt list of plain ints).
    out, sel, off = torch.ops.fused.post_pool_with_offsets.default(*pool)
    go = torch.randn_like(out)
    back = (go, sel, off, m, 0.2, 0.3, list(y.shape), [2] * 3, [2] * 3, [0] * 3, [1] * 3, False)
    _equal(extern_calls.post_pool_backward_default(*back), torch.ops.fused.post_pool_backward.default(*back))
    out, sel, off = torch.ops.fused.conv_transpose3d_post_pool_with_offsets.default(*conv)
    grads = (torch.randn_like(out), sel, off, m, 0.2, None)
    _equal(extern_calls._conv_transpose3d_post_pool_grad_conv_default(*grads),
           torch.ops.fused._conv_transpose3d_post_pool_grad_conv.default(*grads))


def test_arguments_not_plain_go_to_torch_ops():
    x, w, b, m, y = _inputs("cpu")
    base = (y, m, 0.2, [2] * 3, [], [0] * 3, [1] * 3, False, None)
    want = torch.ops.fused.post_pool.default(*base)
    call = extern_calls.post_pool_default
    assert torch_fused_ops._C._call_compiled_op(call.op_id, *base) is not None
    for i, value in ((2, np.float64(0.2)), (3, (np.int64(2),) * 3), (5, (0, 0, 0)), (7, np.bool_(False))):
        args = list(base)
        args[i] = value
        _equal(call(*args), want)  # torch.ops' path where the C entry point returns None
    for i, value in ((0, y.as_subclass(torch.Tensor)), (1, torch.nn.Parameter(m))):
        args = list(base)
        args[i] = value
        assert torch_fused_ops._C._call_compiled_op(call.op_id, *args) is not None
    assert torch_fused_ops._C._call_compiled_op(call.op_id, *base[:-1]) is None  # not every argument
    assert torch_fused_ops._C._call_compiled_op(call.op_id, *base, None) is None
    assert torch_fused_ops._C._call_compiled_op(10**6, *base) is None  # no such operator

    class Sub(torch.Tensor):
        pass

    args = list(base)
    args[0] = y.as_subclass(Sub)
    assert torch_fused_ops._C._call_compiled_op(call.op_id, *args) is None
    assert isinstance(call(*args), Sub)  # torch.ops honours the subclass's __torch_function__


def test_torch_function_modes_see_the_operator():
    x, w, b, m, y = _inputs("cpu")
    seen = []

    class Record(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    args = (y, m, 0.2, [2] * 3, [], [0] * 3, [1] * 3, False, None)
    with Record():
        out = extern_calls.post_pool_default(*args)
    assert torch.ops.fused.post_pool.default in seen
    _equal(out, torch.ops.fused.post_pool.default(*args))


def test_errors_are_torch_ops():
    x, w, b, m, y = _inputs("cpu")
    for args in ((y[0], m, 0.2, [2] * 3, [], [0] * 3, [1] * 3, False, None),  # 4-D input
                 (y, m, 0.2, [2] * 3, [], [5] * 3, [1] * 3, False, None)):  # padding above half the window
        with pytest.raises(Exception) as want:
            torch.ops.fused.post_pool.default(*args)
        with pytest.raises(want.type) as got:
            extern_calls.post_pool_default(*args)
        assert str(got.value) == str(want.value)


def test_cached_code_naming_an_operator_without_a_call():
    # Code generated by another build may name an operator this one registers no call for: torch.ops' overload.
    assert extern_calls.__getattr__("post_pool_default") is torch.ops.fused.post_pool.default
    with pytest.raises(AttributeError):
        extern_calls.__getattr__("no_such_operator_default")


def _model(device, seed=3):
    torch.manual_seed(seed)
    return ConvTransposeLeakyMulLeakyPool(3, 4, multiplier_shape=(4, 1, 1, 1)).to(device)


def _generated(fn, *args):
    out, codes = run_and_get_code(fn, *args)
    return out, "\n".join(codes)


@needs_registry
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dynamic", [False, True])
def test_generated_code_calls_ours(device, dynamic, monkeypatch):
    model = _model(device)
    x = torch.randn(2, 3, 3, 4, 5, device=device)
    compiled = torch.compile(model, dynamic=dynamic)

    def step(x):
        xg = x.detach().requires_grad_()
        out = compiled(xg)
        out.backward(torch.ones_like(out))
        return out.detach(), xg.grad, *(p.grad for p in model.parameters())

    with torch.no_grad():
        out, code = _generated(compiled, x)
    assert OUR_CALL.search(code) and not OPS_CALL.search(code), code
    model.zero_grad(set_to_none=True)
    got, code = _generated(step, x)
    assert len(OUR_CALL.findall(code)) >= 2 and not OPS_CALL.search(code), code  # forward and backward graphs

    # Against the same graphs calling torch.ops (the registry's entries taken out): bit for bit.
    for key in [k for k in CUSTOM_EXTERN_KERNEL_CODEGEN if k.startswith("torch.ops.fused.")]:
        monkeypatch.delitem(CUSTOM_EXTERN_KERNEL_CODEGEN, key)
    torch._dynamo.reset()
    compiled = torch.compile(model, dynamic=dynamic)
    with torch.no_grad():
        want, code = _generated(compiled, x)
    assert OPS_CALL.search(code) and not OUR_CALL.search(code), code
    _equal(out, want)
    model.zero_grad(set_to_none=True)
    want = step(x)
    for a, b in zip(got, want):
        _equal(a, b)


@needs_registry
def test_cpp_wrapper_keeps_its_own_calls():
    model = _model("cpu").eval()
    x = torch.randn(1, 3, 3, 4, 5)
    with torch._inductor.config.patch(cpp_wrapper=True), torch.no_grad():
        out, code = _generated(torch.compile(model), x)
        assert "_fused_calls" not in code
        torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-6)


def test_environment_switch_off():
    script = (
        "import torch, torch_fused_ops\n"
        "from torch._inductor.utils import run_and_get_code\n"
        "from torch_fused_ops.compile import extern_calls\n"
        "from torch_fused_ops.models import ConvTransposeLeakyMulLeakyPool as M\n"
        "torch._inductor.config.fx_graph_cache = False\n"
        "assert extern_calls.install() is False\n"
        "m = M(3, 4, multiplier_shape=(4, 1, 1, 1)).eval()\n"
        "with torch.no_grad():\n"
        "    _, codes = run_and_get_code(torch.compile(m), torch.randn(1, 3, 3, 4, 5))\n"
        "code = '\\n'.join(codes)\n"
        "assert '_fused_calls' not in code and 'torch.ops.fused.post_pool.default(' in code, code\n"
        "print('ok')\n"
    )
    env = dict(os.environ, TORCH_FUSED_OPS_COMPILED_CALLS="0")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


@needs_registry
def test_subgraphs_call_ours():
    # torch.cond's branches are generated by subgraph wrappers; the import reaches the module all the same.
    m = torch.randn(4, 1, 1, 1)

    def f(x, p):
        return torch.cond(p, lambda t: torch_fused_ops.post_pool(t, m, 0.2, 2) * 2,
                          lambda t: torch_fused_ops.post_pool(t, m, 0.1, 2), (x,))

    x = torch.randn(1, 4, 4, 4, 4)
    compiled = torch.compile(f, fullgraph=True)
    with torch.no_grad():
        out, code = _generated(compiled, x, torch.tensor(True))
        assert len(OUR_CALL.findall(code)) == 2 and not OPS_CALL.search(code), code
        _equal(out, torch_fused_ops.post_pool(x, m, 0.2, 2) * 2)
        _equal(compiled(x, torch.tensor(False)), torch_fused_ops.post_pool(x, m, 0.1, 2))
