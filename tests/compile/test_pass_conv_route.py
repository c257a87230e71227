"""The fused-convolution route (PassConfig.fuse_conv_transpose, conv_in_training): which graphs call
fused.conv_transpose3d_post_pool, with which arguments, and what they compute.

Which op a graph ends up calling is checked on graphs whose example values are fake tensors, CUDA ones included
(fake CUDA tensors need no GPU), symbolic sizes too, so every branch of the route's choice runs here. The numbers
are checked on CPU, where the op runs its composite (the aten convolution, then post_pool), against eager
float64, and on CUDA (compiled graphs calling the fused kernel) against eager float64 and cuDNN.
"""

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from torch_fused_ops.compile import fusion_pass, pass_config
from fused_testing import skip_without_cuda_build
from pass_testing import RewriteBackend, _isolated_inductor  # noqa: F401

pytestmark = pytest.mark.pass_settings(fuse_conv_transpose="off", fold_conv_bias="off")  # chains only (conftest.py)

POST_POOL = torch.ops.fused.post_pool.default
PUBLIC = torch.ops.fused.conv_transpose3d_post_pool.default
FULL = torch.ops.aten.full.default
CIN, COUT = 4, 6
HAS_CUDA = torch.cuda.is_available()


def full_chain(x, w, b, m):
    y = torch.conv_transpose3d(x, w, b, 2, 1, 1)
    return F.max_pool3d(F.leaky_relu(F.leaky_relu(y, 0.2) * m, 0.3), 2)


def partial_chain(x, w, b, m):  # conv -> leaky -> pool: joins the convolution with a unit multiplier
    return F.max_pool3d(F.leaky_relu(torch.conv_transpose3d(x, w, b, 2, 1, 1), 0.2), 2)


def stride1_chain(x, w, b, m):  # a geometry the fused kernel does not compute
    y = torch.conv_transpose3d(x, w, b, 1, 1)
    return F.max_pool3d(F.leaky_relu(F.leaky_relu(y, 0.2) * m, 0.3), 2)


def ceil_chain(x, w, b, m):  # ceil_mode: the floor-mode size (covered) where output_padding is 1
    y = torch.conv_transpose3d(x, w, b, 2, 1, 1)
    return F.max_pool3d(F.leaky_relu(F.leaky_relu(y, 0.2) * m, 0.3), 2, ceil_mode=True)


def ceil_op0_chain(x, w, b, m):  # ceil_mode with output_padding 0: one pooled plane more than the kernel writes
    y = torch.conv_transpose3d(x, w, b, 2, 1, 0)
    return F.max_pool3d(F.leaky_relu(F.leaky_relu(y, 0.2) * m, 0.3), 2, ceil_mode=True)


def _symbolic_sizes(*values):
    """SymInts with these hints (backed, as Dynamo's dynamic sizes are) and their shape environment."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()
    syms = [env.create_symintnode(env.create_symbol(v, ConstantSource(f"s{i}")), hint=v)
            for i, v in enumerate(values)]
    return env, syms


def _fake_graph(fn, device, training, dtype=torch.float32, symbolic=False):
    if device == "cuda":
        skip_without_cuda_build("a fake CUDA graph")  # (aten's convolution over them aborts a CPU-only build)
    gm = torch.fx.symbolic_trace(fn)
    env, size = None, (2, CIN, 3, 4, 4)
    if symbolic:  # batch and spatial sizes symbolic, as under torch.compile(dynamic=True)
        env, (n, d, h, w_) = _symbolic_sizes(2, 3, 4, 5)
        size = (n, CIN, d, h, w_)
    mode = FakeTensorMode(shape_env=env)
    with mode:
        x = torch.empty(*size, device=device, dtype=dtype)
        w = torch.empty(CIN, COUT, 3, 3, 3, device=device, dtype=dtype, requires_grad=training)
        b = torch.empty(COUT, device=device, dtype=dtype, requires_grad=training)
        m = torch.empty(COUT, 1, 1, 1, device=device, dtype=dtype, requires_grad=training)
    _Record(gm).run(x, w, b, m)  # (FakeTensorProp would drop requires_grad, which tells training graphs apart)
    return gm


class _Record(torch.fx.Interpreter):
    def run_node(self, n):
        n.meta["val"] = super().run_node(n)
        return n.meta["val"]


def _fused_target(gm, **settings):
    cfg = pass_config.PassConfig(fold_conv_bias="off").replace(**settings)
    assert fusion_pass.rewrite(gm.graph, cfg) == 1
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is not FULL]
    fused = [n for n in calls if "fused" in str(n.target)]
    assert len(fused) == 1, [str(n.target) for n in calls]
    convs = [n for n in calls if n.target is torch.conv_transpose3d]
    return fused[0], convs


# (chain, device, training, settings) -> the op the graph calls ("post_pool": the convolution stays separate)
CASES = {
    "cuda-inference-default": (full_chain, "cuda", False, {}, "public"),
    "cuda-training-default": (full_chain, "cuda", True, {}, "public"),
    "cuda-training-no-conv_in_training": (full_chain, "cuda", True, dict(conv_in_training=False), "post_pool"),
    "cuda-inference-no-conv_in_training": (full_chain, "cuda", False, dict(conv_in_training=False), "public"),
    "cuda-inference-off": (full_chain, "cuda", False, dict(fuse_conv_transpose="off"), "post_pool"),
    "cuda-training-off": (full_chain, "cuda", True, dict(fuse_conv_transpose="off"), "post_pool"),
    "cuda-inference-partial": (partial_chain, "cuda", False, {}, "public"),
    "cuda-training-partial": (partial_chain, "cuda", True, {}, "public"),
    "cuda-inference-other-geometry": (stride1_chain, "cuda", False, {}, "post_pool"),
    "cuda-inference-other-geometry-always": (stride1_chain, "cuda", False, dict(fuse_conv_transpose="always"),
                                             "public"),
    "cuda-inference-ceil": (ceil_chain, "cuda", False, {}, "public"),
    "cuda-inference-ceil-op0": (ceil_op0_chain, "cuda", False, {}, "post_pool"),
    "cpu-inference-default": (full_chain, "cpu", False, {}, "post_pool"),
    "cpu-training-default": (full_chain, "cpu", True, {}, "post_pool"),
    "cpu-inference-always": (full_chain, "cpu", False, dict(fuse_conv_transpose="always"), "public"),
    "cpu-training-always": (full_chain, "cpu", True, dict(fuse_conv_transpose="always"), "public"),
    "cpu-training-always-no-conv_in_training": (full_chain, "cpu", True,
                                                dict(fuse_conv_transpose="always", conv_in_training=False),
                                                "post_pool"),
}
GEOMETRY = {full_chain: ([2] * 3, [1] * 3, [1] * 3), partial_chain: ([2] * 3, [1] * 3, [1] * 3),
            stride1_chain: ([1] * 3, [1] * 3, [0] * 3), ceil_chain: ([2] * 3, [1] * 3, [1] * 3),
            ceil_op0_chain: ([2] * 3, [1] * 3, [0] * 3)}


def _check_target(gm, fn, want, **settings):
    fused, convs = _fused_target(gm, **settings)
    if want == "post_pool":
        assert fused.target is POST_POOL and len(convs) == 1
        return
    assert not convs, "the convolution should be inside the fused op"
    assert fused.target is PUBLIC, fused.target
    stride, padding, output_padding = GEOMETRY[fn]
    assert fused.args[3:8] == (stride, padding, output_padding, 1, [1, 1, 1])
    m, s1, s2 = fused.args[8], fused.args[9], fused.args[15]
    if fn is partial_chain:  # leaky(0.2) -> pool: unit multiplier, s1 = 1.0, s2 = 0.2
        assert m.target is FULL and m.args == ([], 1.0) and (s1, s2) == (1.0, 0.2)
    else:
        assert m.op == "placeholder" and (s1, s2) == (0.2, 0.3)
    assert fused.args[14] is (fn in (ceil_chain, ceil_op0_chain))


@pytest.mark.parametrize("case", list(CASES))
def test_conv_route_target(case):
    fn, device, training, settings, want = CASES[case]
    _check_target(_fake_graph(fn, device, training), fn, want, **settings)


@pytest.mark.parametrize("dtype,want", [(torch.float32, "public"), (torch.bfloat16, "public"),
                                        (torch.float16, "public"), (torch.float64, "post_pool")], ids=str)
def test_conv_route_dtypes_on_cuda(dtype, want):
    # float64 has no fused kernel: under "cuda" it keeps aten's convolution (and the bias fold, when on).
    _check_target(_fake_graph(full_chain, "cuda", False, dtype=dtype), full_chain, want)


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_conv_route_symbolic_sizes_need_no_guard(training):
    # torch.compile(dynamic=True): batch and spatial sizes are symbols. The route's check must still take the
    # fused path, and must not constrain the symbols (a guard would specialise the compiled graph).
    gm = _fake_graph(full_chain, "cuda", training, symbolic=True)
    x = next(n for n in gm.graph.nodes if n.op == "placeholder").meta["val"]
    env = x.shape[0].node.shape_env
    guards_before = len(env.guards)
    _check_target(gm, full_chain, "public")
    assert len(env.guards) == guards_before


def _capture(fn, args):
    backend = RewriteBackend()
    out = torch.compile(fn, backend=backend, fullgraph=True)(*args)
    assert len(backend.records) == 1
    return out, backend


@pytest.mark.parametrize("fn", [full_chain, partial_chain], ids=["full", "partial"])
@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_conv_route_numbers_on_cpu(fn, training):
    torch.manual_seed(0)
    args = [torch.randn(2, CIN, 3, 4, 4, dtype=torch.float64), torch.randn(CIN, COUT, 3, 3, 3, dtype=torch.float64),
            torch.randn(COUT, dtype=torch.float64), torch.rand(COUT, 1, 1, 1, dtype=torch.float64) + 0.5]
    args = [a.requires_grad_(training) for a in args]
    settings = dict(fuse_conv_transpose="always", fold_conv_bias="off")
    with pass_config.patch(**settings), torch.set_grad_enabled(training):
        out, backend = _capture(fn, args)
        ref = fn(*args)
    targets = [n.target for n in backend.graphs[0].graph.nodes if n.op == "call_function"]
    assert PUBLIC in targets and torch.conv_transpose3d not in targets, targets
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    if training:
        wanted = args if fn is full_chain else args[:3]
        for name, a, e in zip("xwbm", torch.autograd.grad(out.sum(), wanted), torch.autograd.grad(ref.sum(), wanted)):
            torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12, msg=lambda m, name=name: f"grad {name}: {m}")


# ---- compiled graphs on CUDA: the fused kernel inside Inductor's code ----------------------------------------
# The file's fixture (pass_testing._isolated_inductor) turns TF32 off, so float32 is the strict form here.

class _ConvChain(torch.nn.Module):
    """The KernelBench chain at a small size; `form` "leaky" keeps only conv -> leaky -> pool (partial)."""

    def __init__(self, cin=16, cout=32, form="full"):
        super().__init__()
        self.form = form
        self.conv = torch.nn.ConvTranspose3d(cin, cout, 3, stride=2, padding=1, output_padding=1)
        self.m = torch.nn.Parameter(torch.randn(cout, 1, 1, 1))

    def forward(self, x):
        y = self.conv(x)
        if self.form == "leaky":
            return F.max_pool3d(F.leaky_relu(y, 0.2), 2)
        return F.max_pool3d(F.leaky_relu(F.leaky_relu(y, 0.2) * self.m, 0.2), 2)


@pytest.fixture
def conv_route():
    # The package default for the whole test (conftest switches the route off in test_pass_* files), so that a
    # recompilation inside the test takes it too.
    with pass_config.patch(fuse_conv_transpose="cuda"):
        yield


def _compile(model, *inputs, **kw):
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    compiled = torch.compile(model, **kw)
    out, code = run_and_get_code(compiled, *inputs)
    return compiled, out, "\n".join(code)


def _rel(a, ref):
    return ((a.double() - ref).norm() / ref.norm()).item()


def _calls_fused_op(code):
    return "conv_transpose3d_post_pool" in code and "extern_kernels.convolution(" not in code


@pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("form", ["full", "leaky"])
def test_cuda_inference_graph_calls_the_fused_op(dtype, form, conv_route):
    torch.manual_seed(0)
    model = _ConvChain(form=form).cuda()
    x = torch.randn(2, 16, 4, 6, 5, device="cuda")
    with torch.no_grad():
        ref = model.double()(x.double())
        model.to(dtype)
        eager = model(x.to(dtype))
        _, out, code = _compile(model, x.to(dtype))
    assert _calls_fused_op(code), code
    assert out.dtype == dtype and out.shape == ref.shape and out.stride() == eager.stride()
    if dtype == torch.float32:  # strict float32
        torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    else:  # no worse than twice the eager chain's own error (cuDNN in this dtype, rounded after every op)
        assert _rel(out, ref) <= 2 * _rel(eager, ref) + 1e-6, (_rel(out, ref), _rel(eager, ref))


@pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU")
def test_cuda_inference_graph_with_dynamic_shapes(conv_route):
    torch.manual_seed(0)
    model = _ConvChain().cuda()
    shapes = [(2, 16, 3, 4, 4), (3, 16, 4, 5, 3), (4, 16, 2, 3, 5)]  # no size 1 (Dynamo specialises those)
    xs = [torch.randn(*s, device="cuda") for s in shapes]
    with torch.no_grad():
        compiled, out, code = _compile(model, xs[0], dynamic=True)
        assert _calls_fused_op(code)
        outs = [out] + [compiled(x) for x in xs[1:]]
        for x, o in zip(xs, outs):
            ref = model.double()(x.double())
            model.float()
            torch.testing.assert_close(o.double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU")
@pytest.mark.parametrize("form", ["full", "leaky"])
def test_cuda_training_graph_calls_the_fused_op(form, conv_route):
    # Training graphs take the route too: the forward runs the op's training form (pooled-size saves), the
    # backward post_pool_backward and aten's convolution backward. Gradients against eager float64 by relative
    # norm: a window whose two largest values lie within float32 rounding may select the other element.
    torch.manual_seed(0)
    model = _ConvChain(form=form).cuda()
    x = torch.randn(2, 16, 4, 6, 5, device="cuda", requires_grad=True)
    params = [x, model.conv.weight, model.conv.bias] + ([model.m] if form == "full" else [])
    _, out, code = _compile(model, x)
    assert _calls_fused_op(code), code
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, params, g)
    model.double()
    params64 = [x.detach().double().requires_grad_()] + [p for p in params[1:]]
    ref = model(params64[0])
    want = torch.autograd.grad(ref, params64, g.double())
    model.float()
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    for name, a, e in zip(("input", "weight", "bias", "multiplier"), got, want):
        assert _rel(a, e) < 1e-4, f"grad {name}: relative error {_rel(a, e):.2e}"


@pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU")
def test_cuda_reduce_overhead_uses_cuda_graphs(conv_route):
    # mode="reduce-overhead": the graph with the fused op is captured and replayed as a CUDA graph (the op never
    # synchronises, allocates nothing outside the caching allocator); replays give the first call's numbers.
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = _ConvChain().cuda()
    x = torch.randn(2, 16, 4, 6, 5, device="cuda")
    counters.clear()
    with torch.no_grad():
        compiled, first, code = _compile(model, x, mode="reduce-overhead")
        first = first.clone()
        replays = [compiled(x).clone() for _ in range(3)]
        ref = model.double()(x.double())
    assert _calls_fused_op(code)
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
    torch.testing.assert_close(first.double(), ref, rtol=1e-5, atol=1e-5)
    for r in replays:
        assert torch.equal(r, first)
