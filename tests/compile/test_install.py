"""Installing the fusion pass (torch_fused_ops/compile/install.py): switching it on and off, composing it with a
user's pre-grad pass, its cache identity (uuid, the sources it hashes, and Inductor's FX graph cache, in an isolated
subprocess), and TORCH_FUSED_OPS_DISABLE."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch._inductor import config as inductor_config
from torch._inductor.custom_graph_pass import CustomGraphPass

import torch_fused_ops
from torch_fused_ops.compile import fusion_pass
from torch_fused_ops.compile.fusion_pass import PostPoolFusionPass
from torch_fused_ops.models import ConvTransposeLeakyMulLeakyPool
from fused_testing import DEVICES, make_input
from pass_testing import _isolated_inductor, assert_matches_eager, categories, compile_run  # noqa: F401

pytestmark = pytest.mark.pass_settings(fuse_conv_transpose="off", fold_conv_bias="off")  # chains only (conftest.py)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def small_model(device="cpu"):
    torch.manual_seed(0)
    return ConvTransposeLeakyMulLeakyPool(4, 4, multiplier_shape=(4, 1, 1, 1)).to(device), \
        make_input((1, 4, 2, 3, 4), device=device, seed=60)


class CountingPass(CustomGraphPass):
    """A user's pre-grad pass: records each graph it sees (and whether our rewrite already ran on it)."""

    def __init__(self):
        self.calls = 0
        self.saw_fused = []

    def __call__(self, graph):
        from pass_testing import node_counts
        self.calls += 1
        self.saw_fused.append(categories(node_counts(graph))["fused"])

    def uuid(self):
        return "counting-pass-v1"


@pytest.mark.parametrize("device", DEVICES)
def test_fusion_enabled_false_context(device):
    model, x = small_model(device)
    with torch.no_grad():
        expected = model(x)
        with torch_fused_ops.fusion_enabled(False):
            assert not torch_fused_ops.is_enabled()
            out, code, matched = compile_run(model, x)
        assert torch_fused_ops.is_enabled(), "fusion_enabled(False) must restore the enabled state"
    assert matched == 0
    assert "post_pool" not in code
    assert_matches_eager(out, expected, msg="compiled with the pass disabled")
    # and fusion_enabled(True) inside a disabled region turns it on for that region only
    torch_fused_ops.disable()
    try:
        with torch_fused_ops.fusion_enabled(True):
            assert torch_fused_ops.is_enabled()
            with torch.no_grad():
                out, code, matched = compile_run(model, x)
        assert not torch_fused_ops.is_enabled()
    finally:
        torch_fused_ops.enable()
    assert matched == 1 and "post_pool" in code
    assert_matches_eager(out, expected, msg="compiled inside fusion_enabled(True)")


def test_enable_disable_toggle():
    assert torch_fused_ops.is_enabled()
    assert isinstance(inductor_config.pre_grad_custom_pass, PostPoolFusionPass)
    torch_fused_ops.disable()
    assert not torch_fused_ops.is_enabled()
    assert inductor_config.pre_grad_custom_pass is None
    torch_fused_ops.disable()  # idempotent
    assert not torch_fused_ops.is_enabled()
    count = torch_fused_ops.matched_count()
    p = torch_fused_ops.enable()
    assert torch_fused_ops.is_enabled() and inductor_config.pre_grad_custom_pass is p
    assert torch_fused_ops.enable() is p, "enable() twice must not stack a second pass"
    assert p.previous is None
    assert torch_fused_ops.matched_count() == count, "matched_count is a lifetime total, kept across toggles"


def test_user_pass_set_before_enable_is_composed():
    saved = inductor_config.pre_grad_custom_pass
    mine = CountingPass()
    try:
        torch_fused_ops.disable()
        inductor_config.pre_grad_custom_pass = mine
        ours = torch_fused_ops.enable()
        assert inductor_config.pre_grad_custom_pass is ours and ours.previous is mine
        model, x = small_model()
        with torch.no_grad():
            out, code, matched = compile_run(model, x)
            expected = model(x)
        assert mine.calls >= 1, "the user's pass did not run"
        assert matched == 1 and "post_pool" in code, "our pass did not run"
        assert mine.saw_fused[-1] == 1, "the user's pass runs after the rewrite"
        assert_matches_eager(out, expected, msg="composed passes")
        torch_fused_ops.disable()
        assert inductor_config.pre_grad_custom_pass is mine, "disable() must leave the user's pass in place"
    finally:
        inductor_config.pre_grad_custom_pass = saved
        torch_fused_ops.enable()  # re-sync the package's notion of the installed pass


def test_uuid_composed_differs_and_is_stable():
    plain = PostPoolFusionPass()
    composed = PostPoolFusionPass(previous=CountingPass())
    u1, u2 = plain.uuid(), composed.uuid()
    assert u1 and u2 and u1 != u2
    assert plain.uuid() == u1 and PostPoolFusionPass().uuid() == u1, "uuid must be stable"
    assert composed.uuid() == u2 and PostPoolFusionPass(previous=CountingPass()).uuid() == u2

    class OtherPass(CountingPass):
        def uuid(self):
            return "other"

    assert PostPoolFusionPass(previous=OtherPass()).uuid() not in (u1, u2)
    # a previous pass without a uuid makes the composition uncacheable
    assert PostPoolFusionPass(previous=lambda graph: None).uuid() is None
    # the installed pass has the plain identity
    assert inductor_config.pre_grad_custom_pass.uuid() == u1



def test_uuid_hashes_the_modules_the_rewrite_depends_on(monkeypatch):
    # Compiled graphs bake in the pass's rewrite, the conv route's coverage check and the fake impls' strides: the
    # cache key must change with the source of each of those modules.
    import inspect

    hashed = []
    real = inspect.getsource
    monkeypatch.setattr(inspect, "getsource", lambda obj: (hashed.append(getattr(obj, "__name__", "")), real(obj))[1])
    fusion_pass._source_digest.cache_clear()
    try:
        fusion_pass._source_digest()
    finally:
        fusion_pass._source_digest.cache_clear()
    want = {f"torch_fused_ops.{m}" for m in ("compile.fusion_pass", "compile.nodes", "compile.pass_config",
                                             "ops.conv_transpose3d_post_pool_coverage", "ops.post_pool", "ops.common",
                                             "ops.conv_transpose3d_post_pool")}
    assert want <= set(hashed), want - set(hashed)

def _run_python(code, env_extra, timeout=300):
    env = dict(os.environ)
    env.update(env_extra)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"subprocess failed:\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    return proc.stdout


def test_env_var_disables_install():
    _run_python("import torch_fused_ops, torch; assert not torch_fused_ops.is_enabled(); "
                "assert torch._inductor.config.pre_grad_custom_pass is None; "
                "assert torch_fused_ops.matched_count() == 0; "
                "torch_fused_ops.enable(); assert torch_fused_ops.is_enabled()",
                {"TORCH_FUSED_OPS_DISABLE": "1"})
    _run_python("import torch_fused_ops; assert torch_fused_ops.is_enabled()", {"TORCH_FUSED_OPS_DISABLE": "0"})


CACHE_SCRIPT = textwrap.dedent("""
    import json, torch, torch_fused_ops
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code
    from torch_fused_ops.models import ConvTransposeLeakyMulLeakyPool
    torch._inductor.config.fx_graph_cache = True
    torch.manual_seed(0)
    model = ConvTransposeLeakyMulLeakyPool(4, 4, multiplier_shape=(4, 1, 1, 1))
    x = torch.randn(1, 4, 2, 3, 4)
    steps = []

    def step(name):
        torch._dynamo.reset()
        before = dict(counters["inductor"])
        matched = torch_fused_ops.matched_count()
        with torch.no_grad():
            out, codes = run_and_get_code(torch.compile(model, backend="inductor", fullgraph=True), x)
            err = (out - model(x)).abs().max().item()
        d = {k: counters["inductor"][k] - before.get(k, 0)
             for k in ("fxgraph_cache_hit", "fxgraph_cache_miss", "fxgraph_cache_bypass")}
        d.update(name=name, enabled=torch_fused_ops.is_enabled(), err=err,
                 matched=torch_fused_ops.matched_count() - matched,
                 code_has_post_pool=any("post_pool" in c for c in codes))
        steps.append(d)

    step("first")
    step("second")
    torch_fused_ops.disable()
    step("disabled")
    torch_fused_ops.enable()
    step("reenabled")
    print("RESULT" + json.dumps(steps))
""")


@pytest.mark.slow
def test_fx_graph_cache_key_follows_enable_state(tmp_path):
    out = _run_python(CACHE_SCRIPT, {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor_cache"),
                                     "TORCHINDUCTOR_FX_GRAPH_CACHE": "1"})
    line = [ln for ln in out.splitlines() if ln.startswith("RESULT")][-1]
    first, second, disabled, reenabled = json.loads(line[len("RESULT"):])
    msg = json.dumps([first, second, disabled, reenabled], indent=1)
    for s in (first, second, disabled, reenabled):
        assert s["err"] <= 1e-5, msg
        assert s["fxgraph_cache_bypass"] == 0, msg
    assert first["fxgraph_cache_miss"] == 1 and first["fxgraph_cache_hit"] == 0, msg
    assert first["matched"] == 1 and first["code_has_post_pool"], msg
    assert second["fxgraph_cache_hit"] == 1 and second["fxgraph_cache_miss"] == 0, msg
    # disabling changes the cache key: the fused entry must not be served
    assert not disabled["enabled"] and disabled["matched"] == 0, msg
    assert disabled["fxgraph_cache_miss"] == 1 and disabled["fxgraph_cache_hit"] == 0, msg
    assert not disabled["code_has_post_pool"], msg
    # re-enabling gives the first key back
    assert reenabled["enabled"], msg
    assert reenabled["fxgraph_cache_hit"] == 1 and reenabled["fxgraph_cache_miss"] == 0, msg
