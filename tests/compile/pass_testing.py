"""Shared helpers for the tests of the Inductor fusion pass (tests/compile/).

The expected values always come from eager PyTorch (the unfused chain); the node
categories below are spelled out here rather than taken from fusion_pass, so a
test never checks the pass against its own tables.
"""

import collections
import contextlib
import operator

import pytest
import torch
import torch.nn.functional as F
from torch._inductor.utils import run_and_get_code

import torch_fused_ops
from torch_fused_ops.compile import fusion_pass
from fused_testing import EAGER_TOL, HAS_CUDA, CUDA_SKIP_REASON, DEVICES  # noqa: F401  (re-exported)

aten = torch.ops.aten
FUSED = torch.ops.fused.post_pool.default

LEAKY_TARGETS = {F.leaky_relu, F.leaky_relu_, torch._C._nn.leaky_relu, torch._C._nn.leaky_relu_,
                 aten.leaky_relu.default, aten.leaky_relu_.default}
MUL_TARGETS = {operator.mul, torch.mul, torch.Tensor.mul, aten.mul.Tensor, operator.imul}
POOL_TARGETS = {F.max_pool3d, torch.max_pool3d, F.max_pool3d_with_indices,
                aten.max_pool3d_with_indices.default}

DTYPES = [pytest.param(torch.float32, id="f32"), pytest.param(torch.bfloat16, id="bf16"),
          pytest.param(torch.float16, id="f16")]


def node_counts(graph):
    """{target: count} of the call_function nodes, plus ('method', name) for call_method nodes."""
    c = collections.Counter()
    for n in graph.nodes:
        if n.op == "call_function":
            c[n.target] += 1
        elif n.op == "call_method":
            c[("method", n.target)] += 1
    return c


def categories(counts):
    return dict(
        fused=counts.get(FUSED, 0),
        leaky=sum(counts.get(t, 0) for t in LEAKY_TARGETS),
        mul=sum(counts.get(t, 0) for t in MUL_TARGETS) + counts.get(("method", "mul"), 0),
        pool=sum(counts.get(t, 0) for t in POOL_TARGETS),
    )


class RewriteBackend:
    """A dynamo backend that runs fusion_pass.rewrite on each graph it receives and records
    the node counts before/after and the return value; the (rewritten) graph then runs eagerly."""

    def __init__(self, rewrite=True):
        self.do_rewrite = rewrite
        self.records = []
        self.graphs = []

    def __call__(self, gm, example_inputs):
        before = node_counts(gm.graph)
        ret = fusion_pass.rewrite(gm.graph) if self.do_rewrite else None
        gm.graph.lint()
        gm.recompile()
        after = node_counts(gm.graph)
        self.records.append(dict(before=before, after=after, ret=ret))
        self.graphs.append(gm)
        return gm.forward


def fused_nodes(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is FUSED]


@contextlib.contextmanager
def isolated_inductor():
    """Fresh dynamo state, no on-disk caches (on torch >= 2.12 a cache hit skips the pre-grad pass, so
    matched_count would depend on what earlier runs left in the cache dir), no TF32 in convs, and the
    pass state restored afterwards."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    saved_pass = inductor_config.pre_grad_custom_pass
    tf32 = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch._dynamo.reset()
    try:
        with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False):
            yield
    finally:
        torch._dynamo.reset()
        inductor_config.pre_grad_custom_pass = saved_pass
        if torch_fused_ops.is_enabled():
            # enable() with our pass already on the hook re-points matched_count() at that pass object
            # (a test may have replaced the hook's object, e.g. by composing a user pass).
            torch_fused_ops.enable()
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32


@pytest.fixture(autouse=True)
def _isolated_inductor():
    with isolated_inductor():
        assert torch_fused_ops.is_enabled(), "the pass should be installed by `import torch_fused_ops`"
        yield


def compile_run(fn, *args, dynamic=None, mode=None, fullgraph=True):
    """Compile `fn` with inductor (fresh dynamo state) and run it once through run_and_get_code.
    Returns (output, all generated code joined, matched_count increase)."""
    torch._dynamo.reset()
    before = torch_fused_ops.matched_count()
    compiled = torch.compile(fn, backend="inductor", fullgraph=fullgraph, dynamic=dynamic, mode=mode)
    out, codes = run_and_get_code(compiled, *args)
    return out, "\n".join(codes), torch_fused_ops.matched_count() - before


def compile_run_without_pass(fn, *args, **kw):
    with torch_fused_ops.fusion_enabled(False):
        out, code, matched = compile_run(fn, *args, **kw)
    assert matched == 0 and "post_pool" not in code
    return out


def max_err(a, b):
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def assert_matches_eager(out, expected, nopass=None, msg=""):
    """float32: within 1e-5 of eager. Half dtypes: within the op-vs-eager tolerance, and no further
    from eager than inductor's own compilation of the unfused chain (`nopass`) is."""
    assert out.shape == expected.shape, f"{msg}: shape {tuple(out.shape)} != {tuple(expected.shape)}"
    assert out.dtype == expected.dtype, f"{msg}: dtype {out.dtype} != {expected.dtype}"
    if expected.dtype in (torch.float32, torch.float64):
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5, msg=lambda m: f"{msg}\n{m}")
        return
    torch.testing.assert_close(out, expected, **EAGER_TOL[expected.dtype], msg=lambda m: f"{msg}\n{m}")
    if nopass is not None:
        e_pass, e_nopass = max_err(out, expected), max_err(nopass, expected)
        assert e_pass <= e_nopass * (1 + 1e-6), (
            f"{msg}: compiled-with-pass differs from eager by {e_pass:.3e}, more than compiled-without-pass "
            f"({e_nopass:.3e})")


def as_tuple(x):
    return x if isinstance(x, tuple) else (x,)
