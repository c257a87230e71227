"""torch_fused_ops.explain and the decisions the fusion pass reports: a model that fuses, models refused for each
reason the coverage check can give and for the pass's own reasons, the torch_fused_ops logger, and what explain
leaves as it found it. Each test compares explain with what the pass did, seen apart from explain
(matched_count, or the graph fusion_pass.rewrite returns through pass_testing.RewriteBackend)."""
import logging

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

import torch_fused_ops
from torch_fused_ops import pass_config
from torch_fused_ops.compile import fusion_pass
from torch_fused_ops.models import ConvTransposeLeakyMulLeakyPool
from torch_fused_ops.ops.conv_transpose3d_post_pool_coverage import PYTHON_ONLY, Unsupported
from fused_testing import skip_without_cuda_build
from pass_testing import FUSED, RewriteBackend, _isolated_inductor, categories  # noqa: F401

U = Unsupported
HAS_CUDA = torch.cuda.is_available()
FUSED_CONV = torch.ops.fused.conv_transpose3d_post_pool.default
FUSED_BIAS = torch.ops.fused.post_pool_bias.default
KB_STEPS = ("leaky_relu", "mul", "leaky_relu", "max_pool3d")


def kb(device="cpu", requires_grad=False, dtype=torch.float32):
    """The KernelBench model, unmodified, at small sizes, and an input."""
    torch.manual_seed(0)
    model = ConvTransposeLeakyMulLeakyPool(4, 8, multiplier_shape=(8, 1, 1, 1)).to(device=device, dtype=dtype)
    x = torch.randn(2, 4, 3, 4, 5, device=device, dtype=dtype, requires_grad=requires_grad)
    return model, x


def rewritten(fn, *args):
    """What the pass does to `fn`'s graphs, seen without explain: node counts before and after, and the targets."""
    backend = RewriteBackend()
    torch.compile(fn, backend=backend)(*args)
    targets = [n.target for gm in backend.graphs for n in gm.graph.nodes if n.op == "call_function"]
    return backend.records, targets


def kinds(decision):
    return {getattr(r, "kind", None) for r in decision.reasons}


def refused(chain, what):
    (d,) = [d for d in chain.refused if d.what == what]
    return d


# ---- a model that fuses ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_kernelbench_model_fuses_and_says_where(training, capsys):
    model, x = kb(requires_grad=training)
    before = torch_fused_ops.matched_count()
    ex = torch_fused_ops.explain(model, x)
    assert capsys.readouterr().out.strip() == str(ex).strip()  # printed by default
    assert ex.graphs == 1 and ex.matched == 1 == torch_fused_ops.matched_count() - before
    (chain,) = ex.chains
    assert chain.op == "fused.post_pool" and chain.steps == KB_STEPS and not ex.left_alone
    assert chain.route == "post_pool" and "models.py" in chain.where and "self.max_pool(x)" in chain.where
    # On CPU the convolution stays aten's (the fused kernel is CUDA's) and its bias stays in it.
    assert kinds(refused(chain, "conv_transpose3d")) == {U.NOT_CUDA}
    assert "folds CUDA inputs only" in refused(chain, "bias fold").reasons[0]
    assert "fused.post_pool <- leaky_relu -> mul -> leaky_relu -> max_pool3d" in str(ex)
    _, targets = rewritten(model, x)
    assert targets.count(FUSED) == 1 and FUSED_CONV not in targets and FUSED_BIAS not in targets


def test_kernelbench_model_routes_as_configured(capsys):
    model, x = kb()
    with pass_config.patch(fuse_conv_transpose="always"):
        ex = torch_fused_ops.explain(model, x, verbose=False)
        _, targets = rewritten(model, x)
    assert capsys.readouterr().out == ""
    (chain,) = ex.fused
    assert chain.op == "fused.conv_transpose3d_post_pool" and chain.steps == ("conv_transpose3d", *KB_STEPS)
    assert chain.route == "fused convolution" and "'always'" in chain.route_reasons[0] and not chain.refused
    assert targets.count(FUSED_CONV) == 1 and FUSED not in targets
    with pass_config.patch(fold_conv_bias="always"):
        ex = torch_fused_ops.explain(model, x, verbose=False)
        _, targets = rewritten(model, x)
    (chain,) = ex.fused
    assert chain.op == "fused.post_pool_bias" and chain.steps == ("bias", *KB_STEPS) and chain.route == "bias folded"
    assert "conv_transpose3d not joined (input is on cpu" in chain.route_reasons[0]
    assert targets.count(FUSED_BIAS) == 1


@pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU")
@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_kernelbench_model_takes_the_fused_convolution_on_cuda(training):
    model, x = kb("cuda", requires_grad=training)
    ex = torch_fused_ops.explain(model, x, verbose=False)
    (chain,) = ex.chains
    assert chain.op == "fused.conv_transpose3d_post_pool" and chain.route == "fused convolution"
    assert "the fused kernel computes the call" in chain.route_reasons[0] and ex.matched == 1
    _, targets = rewritten(model, x)
    assert targets.count(FUSED_CONV) == 1


# ---- refused for each reason the coverage check can give ---------------------------------------------------------

# One chain per geometry: (the coverage reasons besides "not CUDA", conv_transpose3d kwargs, max_pool3d kwargs,
# weight kernel, input channels, dtype). The reasons only the Python mirror gives (PYTHON_ONLY) are arguments no
# valid graph passes the pass with (their unit tests: test_coverage_reasons.py); no input channels is one aten's
# convolution refuses in eager, so it is checked on a graph of fake tensors only.
KERNEL_CONV = dict(stride=2, padding=1, output_padding=1)
NO_CHANNELS = ({U.NO_CHANNELS}, KERNEL_CONV, dict(kernel_size=2), 3, 0, torch.float32)
GEOMETRIES = [
    (set(), KERNEL_CONV, dict(kernel_size=2), 3, 4, torch.float32),
    ({U.DTYPE}, KERNEL_CONV, dict(kernel_size=2), 3, 4, torch.float64),
    ({U.GROUPS}, dict(KERNEL_CONV, groups=2), dict(kernel_size=2), 3, 4, torch.float32),
    ({U.KERNEL}, KERNEL_CONV, dict(kernel_size=2), 2, 4, torch.float32),
    ({U.STRIDE}, dict(stride=1, padding=1), dict(kernel_size=2), 3, 4, torch.float32),
    ({U.PADDING}, dict(stride=2, padding=0, output_padding=1), dict(kernel_size=2), 3, 4, torch.float32),
    ({U.DILATION}, dict(KERNEL_CONV, dilation=2), dict(kernel_size=2), 3, 4, torch.float32),
    ({U.DILATION, U.OUTPUT_PADDING}, dict(stride=2, padding=1, output_padding=2, dilation=3), dict(kernel_size=2),
     3, 4, torch.float32),
    ({U.POOL_KERNEL}, KERNEL_CONV, dict(kernel_size=3), 3, 4, torch.float32),
    ({U.POOL_STRIDE}, KERNEL_CONV, dict(kernel_size=2, stride=1), 3, 4, torch.float32),
    ({U.POOL_PADDING}, KERNEL_CONV, dict(kernel_size=2, padding=1), 3, 4, torch.float32),
    ({U.POOL_DILATION}, KERNEL_CONV, dict(kernel_size=2, dilation=2), 3, 4, torch.float32),
    ({U.CEIL_MODE}, dict(stride=2, padding=1, output_padding=0), dict(kernel_size=2, ceil_mode=True), 3, 4,
     torch.float32),
]
CONV_KWARGS = [g[1] for g in GEOMETRIES]
POOL_KWARGS = [g[2] for g in GEOMETRIES]


def geometry_chains(*tensors):
    outs = []
    for i in range(len(CONV_KWARGS)):
        x, w, b, m = tensors[4 * i:4 * i + 4]
        y = F.conv_transpose3d(x, w, b, **CONV_KWARGS[i])
        outs.append(F.max_pool3d(F.leaky_relu(F.leaky_relu(y, 0.2) * m, 0.3), **POOL_KWARGS[i]))
    return outs


def geometry_tensors(device):
    gen = torch.Generator().manual_seed(0)
    out = []
    for _, conv, _, k, cin, dtype in GEOMETRIES:
        groups = conv.get("groups", 1)
        t = [torch.randn(2, cin, 3, 4, 3, generator=gen), torch.randn(cin, 8 // groups, k, k, k, generator=gen),
             torch.randn(8, generator=gen), torch.randn(8, 1, 1, 1, generator=gen)]
        out += [v.to(device=device, dtype=dtype) for v in t]
    return out


def test_the_geometries_cover_every_reason_the_cpp_check_gives():
    assert set().union(*(g[0] for g in GEOMETRIES + [NO_CHANNELS])) | {U.NOT_CUDA} == set(Unsupported) - PYTHON_ONLY


class _FakeRun(torch.fx.Interpreter):
    """Example values as Dynamo leaves them, from fake tensors; the convolution's from its size formula (aten's
    refuses no input channels, which the fused op's coverage check must still name)."""

    def run_node(self, n):
        if n.op == "call_function" and n.target is torch.conv_transpose3d:
            x, w = (self.env[a] for a in n.args[:2])
            s, p, o, d = (n.kwargs.get(k, dflt) for k, dflt in (("stride", 1), ("padding", 0),
                                                                 ("output_padding", 0), ("dilation", 1)))
            size = [(x.shape[2 + i] - 1) * s - 2 * p + d * (w.shape[2 + i] - 1) + o + 1 for i in range(3)]
            groups = n.kwargs.get("groups", 1)
            n.meta["val"] = x.new_empty(x.shape[0], w.shape[1] * groups, *size)
        else:
            n.meta["val"] = super().run_node(n)
        return n.meta["val"]


def fake_chain(geometry, device):
    """The geometry's chain traced with fake tensors on `device` (fake CUDA tensors need no GPU, but a CUDA build of
    torch)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    if device == "cuda":
        skip_without_cuda_build("a fake CUDA chain")

    _, conv_kw, pool_kw, k, cin, dtype = geometry

    def chain(x, w, b, m):
        y = torch.conv_transpose3d(x, w, b, **conv_kw)
        return F.max_pool3d(F.leaky_relu(F.leaky_relu(y, 0.2) * m, 0.3), **pool_kw)

    gm = torch.fx.symbolic_trace(chain)
    groups = conv_kw.get("groups", 1)
    with FakeTensorMode() as mode:
        args = [torch.empty(2, cin, 3, 4, 3), torch.empty(cin, 8 // groups, k, k, k), torch.empty(8),
                torch.empty(8, 1, 1, 1)]
        args = [a.to(device=device, dtype=dtype) for a in args]
    with mode:
        _FakeRun(gm).run(*args)
    return gm


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("geometry", GEOMETRIES + [NO_CHANNELS], ids=lambda g: "-".join(sorted(k.name for k in g[0]))
                         or "kernel")
def test_each_coverage_reason_is_recorded_on_fake_tensors(geometry, device):
    gm = fake_chain(geometry, device)
    with fusion_pass.recording() as rec:
        matched = fusion_pass.rewrite(gm.graph)
    want = geometry[0] | ({U.NOT_CUDA} if device == "cpu" else set())
    targets = [n.target for n in gm.graph.nodes]
    assert matched == 1 and (FUSED_CONV in targets) == (not want)
    (graph,) = rec.graphs
    conv = [d for d in graph if d.what == "conv_transpose3d"]
    assert [kinds(d) for d in conv] == ([want] if want else [])
    (route,) = [d for d in graph if d.kind == "route"]
    # A convolution left out keeps its bias in the fused op where the fold applies (CUDA, the default config, a build
    # with the CUDA kernels).
    folds = device == "cuda" and torch_fused_ops.has_cuda_kernels()
    refused_route = "bias folded" if folds else "post_pool"
    assert route.what == (refused_route if want else "fused convolution")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA,
                                                                                         reason="needs a GPU"))])
def test_each_coverage_reason_is_reported_for_its_chain(device):
    tensors = geometry_tensors(device)
    ex = torch_fused_ops.explain(geometry_chains, *tensors, verbose=False)
    records, targets = rewritten(geometry_chains, *tensors)
    kernel = device == "cuda"
    # A convolution left out keeps its bias in the fused op where the fold applies (CUDA with the CUDA kernels).
    folds = kernel and torch_fused_ops.has_cuda_kernels()
    rest, rest_op, rest_route = (FUSED_BIAS, "fused.post_pool_bias", "bias folded") if folds else \
        (FUSED, "fused.post_pool", "post_pool")
    # What the pass did: each chain fused; on CUDA the kernel's geometry joins the convolution.
    assert ex.matched == len(GEOMETRIES) == len(ex.fused) == sum(r["ret"] for r in records)
    assert targets.count(FUSED_CONV) == int(kernel) and targets.count(rest) == len(GEOMETRIES) - int(kernel)
    assert [c.op for c in ex.chains] == ["fused.conv_transpose3d_post_pool" if kernel and not g[0] else
                                         rest_op for g in GEOMETRIES]
    for (want, *_), chain in zip(GEOMETRIES[kernel:], ex.chains[kernel:]):
        conv = refused(chain, "conv_transpose3d")
        assert kinds(conv) == want | ({U.NOT_CUDA} if device == "cpu" else set()), (want, conv)
        text = str(ex)
        assert all(r in text for r in conv.reasons)
        assert chain.route == rest_route and "conv_transpose3d not joined" in chain.route_reasons[0]


# ---- the pass's own refusals ------------------------------------------------------------------------------------

def pass_refusals(x1, m64, x2, m, x3, x4, x5, m_depth):
    # A promoting multiply: left in the graph; the LeakyReLU after it still fuses with the pool.
    a = F.max_pool3d(F.leaky_relu(F.leaky_relu(x1, 0.2) * m64, 0.3), 2)
    # The first LeakyReLU's output has another user: the rest fuses.
    h = F.leaky_relu(x2, 0.2)
    b = F.max_pool3d(F.leaky_relu(h * m, 0.3), 2)
    # The pool returns indices: left alone.
    c, _ = F.max_pool3d(F.leaky_relu(x3, 0.2), 2, return_indices=True)
    # An in-place LeakyReLU on a graph input: left in the graph; the rest fuses.
    d = F.max_pool3d(F.leaky_relu(F.leaky_relu_(x4, 0.2) * m, 0.3), 2)
    # A multiplier varying along depth: left in the graph.
    e = F.max_pool3d(F.leaky_relu(F.leaky_relu(x5, 0.2) * m_depth, 0.3), 2)
    # A lone pool: left to Inductor.
    f = F.max_pool3d(x5, 2)
    return a, b, h.sum(), c, d, e, f


def pass_refusal_inputs():
    def x():
        return torch.randn(2, 4, 4, 4, 4)
    return (x(), torch.randn(4, 1, 1, 1, dtype=torch.float64), x(), torch.randn(4, 1, 1, 1), x(), x(), x(),
            torch.randn(1, 1, 4, 1, 1))


def test_the_pass_refusals_are_reported_with_their_reasons():
    args = pass_refusal_inputs()
    ex = torch_fused_ops.explain(pass_refusals, *[a.clone() for a in args], verbose=False)
    records, _ = rewritten(pass_refusals, *[a.clone() for a in args])
    a, b, c, d, e, f = ex.chains
    assert refused(a, "mul").reasons == ("the multiply promotes float32 * float64 (of the promoting products only "
                                         "a float32 multiplier of a float16/bfloat16 input fuses)",)
    assert a.steps == ("leaky_relu", "max_pool3d")
    assert refused(b, "leaky_relu").reasons[0].startswith("its output has other users (")
    assert b.steps == ("mul", "leaky_relu", "max_pool3d") and b.op == "fused.post_pool"
    assert c.op is None and c.reasons == ("the pool returns indices",)
    assert refused(d, "leaky_relu").reasons == ("it works in place on l_x4_, which is a graph input",)  # Dynamo's name
    assert d.steps == ("mul", "leaky_relu", "max_pool3d")
    assert refused(e, "mul").reasons == ("the multiplier [1, 1, 4, 1, 1] broadcasts along the input's dim 2 (size 4), "
                                         "not only along its channels",)
    assert f.op is None
    assert f.reasons[0].startswith("nothing to fuse before the pool: its input l_x5_ (a graph input) is no")
    # What the pass did: the steps explain says it absorbed are the ones gone from the graph.
    (record,) = records
    assert ex.matched == record["ret"] == 4
    absorbed = {"leaky": 0, "mul": 0, "pool": 0}
    for chain in ex.fused:
        for step in chain.steps:
            absorbed[{"leaky_relu": "leaky", "mul": "mul", "max_pool3d": "pool"}[step]] += 1
    before, after = categories(record["before"]), categories(record["after"])
    assert {k: before[k] - after[k] for k in absorbed} == absorbed and after["fused"] == 4
    text = str(ex)
    assert "2 left alone" in text and "left alone: the chain ending at" in text


def test_settings_and_graph_structure_refusals_are_recorded():
    def partial(x, m):
        return F.max_pool3d(F.leaky_relu(x * m, 0.3), 2)

    def conv_used_twice(x, w, b, m):
        y = F.conv_transpose3d(x, w, b, 2, 1, 1)
        return F.max_pool3d(F.leaky_relu(F.leaky_relu(y, 0.2) * m, 0.3), 2), y.mean()

    x, m = torch.randn(2, 4, 4, 4, 4), torch.randn(4, 1, 1, 1)
    with pass_config.patch(partial_chains=False), fusion_pass.recording() as rec:
        records, _ = rewritten(partial, x, m)
    (graph,) = rec.graphs
    assert records[0]["ret"] == 0 and [d.kind for d in graph] == ["refused"]
    assert graph[0].reasons == ("partial chain (mul, leaky_relu) with PassConfig.partial_chains=False",)
    args = (torch.randn(2, 4, 3, 3, 3), torch.randn(4, 8, 3, 3, 3), torch.randn(8), torch.randn(8, 1, 1, 1))
    with pass_config.patch(fuse_conv_transpose="always", fold_conv_bias="off"), fusion_pass.recording() as rec:
        records, targets = rewritten(conv_used_twice, *args)
    (graph,) = rec.graphs
    conv = [d for d in graph if d.what == "conv_transpose3d"]
    assert conv[0].reasons[0].startswith("its output has 2 users")
    assert [d.reasons for d in graph if d.what == "bias fold"] == [("bias fold off (PassConfig.fold_conv_bias='off')",)]
    assert FUSED_CONV not in targets and targets.count(FUSED) == 1


def test_training_graphs_keep_the_convolution_where_configured():
    model, x = kb(requires_grad=True)
    with pass_config.patch(fuse_conv_transpose="always", conv_in_training=False):
        ex = torch_fused_ops.explain(model, x, verbose=False)
        _, targets = rewritten(model, x)
    (chain,) = ex.chains
    assert refused(chain, "conv_transpose3d").reasons == ("a training graph, with PassConfig.conv_in_training=False",)
    assert chain.op == "fused.post_pool" and FUSED_CONV not in targets and targets.count(FUSED) == 1


# ---- the logger ---------------------------------------------------------------------------------------------------

def test_the_package_logger_gets_debug_records_of_matches_refusals_and_routes(caplog):
    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger("torch_fused_ops").handlers)

    def f(x, m):
        return F.max_pool3d(F.leaky_relu(F.leaky_relu(x, 0.2) * m, 0.3), 2), F.max_pool3d(x, 2, return_indices=True)

    x, m = torch.randn(2, 4, 4, 4, 4), torch.randn(4, 1, 1, 1)
    with caplog.at_level(logging.INFO, logger="torch_fused_ops"):
        rewritten(f, x, m)
    assert not [r for r in caplog.records if r.name.startswith("torch_fused_ops")]  # DEBUG only
    with caplog.at_level(logging.DEBUG, logger="torch_fused_ops"):
        rewritten(f, x, m)
    ours = [r for r in caplog.records if r.name.startswith("torch_fused_ops.")]
    assert ours and {r.levelno for r in ours} == {logging.DEBUG}
    assert {r.name for r in ours} == {"torch_fused_ops.compile.fusion_pass"}
    msgs = [r.getMessage() for r in ours]
    fused = [s for s in msgs if s.startswith(f"fused {' -> '.join(KB_STEPS)} into fused.post_pool")]
    assert len(fused) == 1 and "test_explain.py" in fused[0] and " in f: " in fused[0]
    assert any(s.startswith("refused max_pool3d") and s.endswith("the pool returns indices") for s in msgs)
    route = "post_pool: its input l_x_ (a graph input) is no convolution"
    assert any(s.startswith("route of the chain ending at") and s.endswith(route) for s in msgs)


# ---- what explain leaves as it found it ---------------------------------------------------------------------------

def test_explain_restores_every_setting_and_leaves_compiled_code_alone(monkeypatch, tmp_path):
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    model, x = kb()
    users = torch.compile(model)
    users(x)
    unique_graphs = counters["stats"]["unique_graphs"]
    torch_fused_ops.disable()
    hook, config = inductor_config.pre_grad_custom_pass, pass_config.current()
    with inductor_config.patch(fx_graph_cache=True), functorch_config.patch(enable_autograd_cache=True):
        # Twice: with the caches on, a second compilation would be served from them and skip the pass.
        for _ in range(2):
            ex = torch_fused_ops.explain(model, x, verbose=False)
            assert ex.graphs == 1 and ex.matched == 1 and ex.fused[0].steps == KB_STEPS
            assert not ex.pass_was_enabled and "The pass is disabled" in str(ex)
        assert inductor_config.fx_graph_cache is True and functorch_config.enable_autograd_cache is True
    assert not torch_fused_ops.is_enabled() and inductor_config.pre_grad_custom_pass is hook
    assert pass_config.current() is config
    before = counters["stats"]["unique_graphs"]
    assert before == unique_graphs + 2
    users(x)  # the caller's compiled model is served as before, without compiling again
    assert counters["stats"]["unique_graphs"] == before
    torch_fused_ops.enable()
    ex = torch_fused_ops.explain(users, x, verbose=False)  # a compiled model is explained as its module
    assert ex.pass_was_enabled and ex.matched == 1 and "disabled" not in str(ex)


def test_explain_says_when_there_is_no_pool():
    ex = torch_fused_ops.explain(lambda x: F.leaky_relu(x, 0.2) * 2, torch.randn(2, 4, 4, 4, 4), verbose=False)
    assert ex.graphs == 1 and not ex.chains and ex.matched == 0
    assert "No max_pool3d in the compiled graph(s)" in str(ex)


def test_explain_takes_keyword_inputs():
    def f(x, *, m):
        return F.max_pool3d(F.leaky_relu(x * m, 0.2), 2)

    ex = torch_fused_ops.explain(f, torch.randn(2, 4, 4, 4, 4), m=torch.randn(4, 1, 1, 1), verbose=False)
    assert [c.steps for c in ex.fused] == [("mul", "leaky_relu", "max_pool3d")] and ex.matched == 1


def test_explain_refuses_what_it_cannot_call():
    was = torch_fused_ops.is_enabled()
    with pytest.raises(TypeError, match="expected an nn.Module or a function, got int"):
        torch_fused_ops.explain(3)
    assert torch_fused_ops.is_enabled() == was
