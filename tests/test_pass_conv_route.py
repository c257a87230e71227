"""The fused-convolution route's settings (PassConfig.fuse_conv_transpose, conv_inference_op, conv_in_training).

Which op a graph ends up calling is checked on graphs whose example values are fake tensors, CUDA ones included
(fake CUDA tensors need no GPU), so every branch of the route's choice runs here. The numbers are checked on CPU,
where the public op runs its composite (the aten convolution, then post_pool), against eager float64.
"""

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from torch_fused_ops import fusion_pass, pass_config
from pass_testing import RewriteBackend, _isolated_inductor  # noqa: F401

POST_POOL = torch.ops.fused.post_pool.default
PUBLIC = torch.ops.fused.conv_transpose3d_post_pool.default
FULL = torch.ops.aten.full.default
INFER = "fused.conv_transpose3d_post_pool_infer"
CIN, COUT = 4, 6


def full_chain(x, w, b, m):
    y = torch.conv_transpose3d(x, w, b, 2, 1, 1)
    return F.max_pool3d(F.leaky_relu(F.leaky_relu(y, 0.2) * m, 0.3), 2)


def partial_chain(x, w, b, m):  # conv -> leaky -> pool: joins the convolution with a unit multiplier
    return F.max_pool3d(F.leaky_relu(torch.conv_transpose3d(x, w, b, 2, 1, 1), 0.2), 2)


def stride1_chain(x, w, b, m):  # a geometry the fused Triton kernel does not compute
    y = torch.conv_transpose3d(x, w, b, 1, 1)
    return F.max_pool3d(F.leaky_relu(F.leaky_relu(y, 0.2) * m, 0.3), 2)


def _fake_graph(fn, device, training):
    gm = torch.fx.symbolic_trace(fn)
    mode = FakeTensorMode()
    with mode:
        x = torch.empty(2, CIN, 3, 4, 4, device=device)
        w = torch.empty(CIN, COUT, 3, 3, 3, device=device, requires_grad=training)
        b = torch.empty(COUT, device=device, requires_grad=training)
        m = torch.empty(COUT, 1, 1, 1, device=device, requires_grad=training)
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
    "cuda-inference-default": (full_chain, "cuda", False, {}, INFER),
    "cuda-inference-public": (full_chain, "cuda", False, dict(conv_inference_op="public"), "public"),
    "cuda-training-default": (full_chain, "cuda", True, {}, "post_pool"),
    "cuda-training-conv_in_training": (full_chain, "cuda", True, dict(conv_in_training=True), "public"),
    "cuda-training-conv_in_training-triton_op": (full_chain, "cuda", True,
                                                 dict(conv_in_training=True, conv_inference_op="triton_op"),
                                                 "public"),  # the triton_op has no autograd
    "cuda-inference-off": (full_chain, "cuda", False, dict(fuse_conv_transpose="off"), "post_pool"),
    "cuda-inference-partial": (partial_chain, "cuda", False, {}, INFER),
    "cuda-inference-other-geometry": (stride1_chain, "cuda", False, {}, "post_pool"),
    "cuda-inference-other-geometry-always": (stride1_chain, "cuda", False, dict(fuse_conv_transpose="always"),
                                             "public"),
    "cpu-inference-default": (full_chain, "cpu", False, {}, "post_pool"),
    "cpu-inference-always": (full_chain, "cpu", False, dict(fuse_conv_transpose="always"), "public"),
    "cpu-training-always": (full_chain, "cpu", True, dict(fuse_conv_transpose="always"), "post_pool"),
    "cpu-training-always-conv_in_training": (full_chain, "cpu", True,
                                             dict(fuse_conv_transpose="always", conv_in_training=True), "public"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_conv_route_target(case):
    fn, device, training, settings, want = CASES[case]
    fused, convs = _fused_target(_fake_graph(fn, device, training), **settings)
    if want == "post_pool":
        assert fused.target is POST_POOL and len(convs) == 1
        return
    assert not convs, "the convolution should be inside the fused op"
    if want == "public":
        assert fused.target is PUBLIC
        assert fused.args[3:8] == ([2, 2, 2] if fn is full_chain or fn is partial_chain else [1, 1, 1],
                                   [1, 1, 1], [1, 1, 1] if fn is not stride1_chain else [0, 0, 0], 1, [1, 1, 1])
    else:
        assert str(fused.target).startswith(INFER), fused.target
        slopes = (1.0, 0.2) if fn is partial_chain else (0.2, 0.3)
        assert tuple(fused.args[4:6]) == slopes
        if fn is partial_chain:
            assert fused.args[3].target is FULL and fused.args[3].args == ([], 1.0)


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
    settings = dict(fuse_conv_transpose="always", conv_in_training=True, conv_inference_op="public",
                    fold_conv_bias="off")
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
