"""torch.export of the model and of a module calling fused.post_pool directly, and an AOTInductor package."""

import pytest
import torch
from torch import nn

import torch_fused_ops
from torch_fused_ops.models import ConvTransposeLeakyMulLeakyPool
from fused_testing import composite, make_input, make_multiplier
from pass_testing import FUSED, _isolated_inductor, assert_matches_eager  # noqa: F401

pytestmark = pytest.mark.pass_settings(fuse_conv_transpose="off", fold_conv_bias="off")  # chains only (conftest.py)


def tiny_model():
    torch.manual_seed(0)
    return ConvTransposeLeakyMulLeakyPool(4, 4, multiplier_shape=(4, 1, 1, 1)).eval(), \
        make_input((1, 4, 2, 3, 4), seed=80)


def test_export_model_runs():
    model, x = tiny_model()
    ep = torch.export.export(model, (x,))
    with torch.no_grad():
        assert_matches_eager(ep.module()(x), model(x), msg="exported model")


@pytest.mark.slow
def test_aoti_package_matches_eager(tmp_path):
    model, x = tiny_model()
    ep = torch.export.export(model, (x,))
    before = torch_fused_ops.matched_count()
    path = torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp_path / "model.pt2"))
    loaded = torch._inductor.aoti_load_package(path)
    with torch.no_grad():
        out = loaded(x)
        assert_matches_eager(out, model(x), msg="AOTInductor package")
    matched = torch_fused_ops.matched_count() - before
    print("matched in AOTI compile:", matched)
    # AOTInductor runs pre-grad passes on the exported ATen graph in torch 2.14 (checked here); older releases
    # are only required to produce correct results.
    if tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 14):
        assert matched >= 1, "AOTInductor did not route the exported chain to fused.post_pool"


class DirectOp(nn.Module):
    def __init__(self):
        super().__init__()
        self.m = nn.Parameter(make_multiplier("C111", 3))

    def forward(self, x):
        return torch.ops.fused.post_pool(x, self.m, 0.2, [3, 3, 3], [2, 2, 2], 1, 1, False, 0.1)


def test_export_direct_op_keeps_fused_node():
    mod = DirectOp()
    x = make_input((2, 3, 5, 6, 7), seed=81)
    ep = torch.export.export(mod, (x,))
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert FUSED in targets, f"fused.post_pool not in the exported graph: {targets}"
    with torch.no_grad():
        out = ep.module()(x)
        expected = composite(x, mod.m, 0.2, kernel_size=3, stride=2, padding=1, negative_slope2=0.1)
    assert_matches_eager(out, expected, msg="exported direct op")


@pytest.mark.parametrize("decompose", [False, True], ids=["as_exported", "run_decompositions"])
def test_rewrite_matches_exported_aten_graph(decompose):
    """fusion_pass documents that it matches the ATen spelling of the chain as in exported programs (so that
    AOTInductor packages use the fused op). torch.export keeps aten.max_pool3d.default; run_decompositions()
    turns it into getitem(aten.max_pool3d_with_indices(...), 0). Both spellings must be fused."""
    model, x = tiny_model()
    ep = torch.export.export(model, (x,))
    if decompose:
        ep = ep.run_decompositions()
    gm = ep.graph_module
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    n = torch_fused_ops.compile.fusion_pass.rewrite(gm.graph)
    assert n == 1, f"rewrite returned {n} on the exported graph {targets}"
    assert FUSED in [nd.target for nd in gm.graph.nodes if nd.op == "call_function"]
    gm.recompile()
    with torch.no_grad():
        ep_out = ep.module()(x)
        assert_matches_eager(ep_out, model(x), msg="rewritten exported program")


CONV_TARGET = torch.ops.fused.conv_transpose3d_post_pool.default


def conv_model():
    torch.manual_seed(0)
    return ConvTransposeLeakyMulLeakyPool(4, 6, multiplier_shape=(6, 1, 1, 1)).eval(), \
        make_input((2, 4, 2, 3, 4), seed=82)


@pytest.mark.parametrize("decompose", [False, True], ids=["as_exported", "run_decompositions"])
@pytest.mark.parametrize("setting,want", [("always", "conv"), ("cuda", "post_pool")])
def test_conv_route_matches_exported_aten_graph(decompose, setting, want):
    # The exported spellings of the convolution (aten.conv_transpose3d.input; aten.convolution with
    # transposed=True after run_decompositions) join the chain like Dynamo's torch.conv_transpose3d. The graph is
    # on CPU: "cuda" leaves the convolution alone there, "always" routes it (the op runs its composite).
    from torch_fused_ops import pass_config

    model, x = conv_model()
    ep = torch.export.export(model, (x,))
    if decompose:
        ep = ep.run_decompositions()
    gm = ep.graph_module
    with pass_config.patch(fuse_conv_transpose=setting, fold_conv_bias="off"):
        assert torch_fused_ops.compile.fusion_pass.rewrite(gm.graph) == 1
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    convs = [t for t in targets if "conv" in str(t) and "post_pool" not in str(t)]
    if want == "conv":
        assert CONV_TARGET in targets and not convs, targets
    else:
        assert FUSED in targets and len(convs) == 1, targets
    gm.recompile()
    with torch.no_grad():
        assert_matches_eager(ep.module()(x), model(x), msg="rewritten exported program")


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a GPU"))])
def test_aoti_package_with_the_conv_route(tmp_path, device):
    # An AOTInductor package whose graph calls fused.conv_transpose3d_post_pool computes what eager does: on CUDA
    # through the default setting (the fused kernel), on CPU routed with "always" (the op's composite).
    from torch_fused_ops import pass_config

    model, x = conv_model()
    model, x = model.to(device), x.to(device)
    ep = torch.export.export(model, (x,))
    setting = "cuda" if device == "cuda" else "always"
    with pass_config.patch(fuse_conv_transpose=setting, fold_conv_bias="off"):
        before = torch_fused_ops.matched_count()
        path = torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp_path / "conv.pt2"))
        matched = torch_fused_ops.matched_count() - before
    loaded = torch._inductor.aoti_load_package(path)
    with torch.no_grad():  # (float32 without TF32: the isolated-inductor fixture)
        assert_matches_eager(loaded(x), model(x), msg=f"AOTInductor package, conv route, {device}")
    if tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 14):
        assert matched >= 1, "AOTInductor did not route the exported chain"
