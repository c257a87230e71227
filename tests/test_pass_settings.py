"""The pass's settings (pass_config.PassConfig: hash, uuid, patch), the deprecated module-level switches, and the
settings module for environment variables (envs.py)."""

import ast
import dataclasses
import glob
import os
import warnings

import pytest
import torch

import torch_fused_ops
from torch_fused_ops import envs, fusion_pass, pass_config
from torch_fused_ops.compile.pass_config import PassConfig

PKG = os.path.dirname(torch_fused_ops.__file__)


def test_defaults_are_the_tuned_behaviour():
    assert PassConfig() == PassConfig(fold_conv_bias="cuda", fuse_conv_transpose="cuda", conv_in_training=True,
                                      partial_chains=True)
    assert [f.name for f in dataclasses.fields(PassConfig)] == ["fold_conv_bias", "fuse_conv_transpose",
                                                                "conv_in_training", "partial_chains"]


@pytest.mark.parametrize("field,bad,exc", [("fold_conv_bias", "gpu", ValueError),
                                           ("fuse_conv_transpose", True, ValueError),
                                           ("conv_in_training", 1, TypeError),
                                           ("partial_chains", "yes", TypeError)])
def test_invalid_values_raise_naming_the_field(field, bad, exc):
    with pytest.raises(exc, match=f"PassConfig.{field}"):
        PassConfig(**{field: bad})
    with pytest.raises(exc, match=f"PassConfig.{field}"), pass_config.patch(**{field: bad}):
        pass


CHANGES = [dict(fold_conv_bias="off"), dict(fold_conv_bias="always"), dict(fuse_conv_transpose="off"),
           dict(fuse_conv_transpose="always"), dict(conv_in_training=False),
           dict(partial_chains=False)]


def test_compute_hash_and_uuid_follow_every_field():
    base = PassConfig()
    assert base.compute_hash() == PassConfig().compute_hash()
    hashes = {PassConfig(**c).compute_hash() for c in CHANGES}
    assert len(hashes) == len(CHANGES) and base.compute_hash() not in hashes
    p = fusion_pass.PostPoolFusionPass()
    with pass_config.patch(base):
        uuid0 = p.uuid()
    uuids = set()
    for c in CHANGES:
        with pass_config.patch(base, **c):
            uuids.add(p.uuid())
    assert len(uuids) == len(CHANGES) and uuid0 not in uuids
    with pass_config.patch(base):
        assert p.uuid() == uuid0


def test_patch_restores_also_on_error_and_nests():
    before = pass_config.current()
    with pytest.raises(RuntimeError):
        with pass_config.patch(fuse_conv_transpose="off") as cfg:
            assert pass_config.current() is cfg and cfg.fuse_conv_transpose == "off"
            with pass_config.patch(conv_in_training=False):
                assert pass_config.current() == cfg.replace(conv_in_training=False)
            assert pass_config.current() is cfg
            raise RuntimeError
    assert pass_config.current() is before
    with pass_config.patch(PassConfig(fold_conv_bias="off"), partial_chains=False) as cfg:
        assert cfg == PassConfig(fold_conv_bias="off", partial_chains=False)
    assert pass_config.current() is before
    with pytest.raises(TypeError):
        pass_config.set_current({"fold_conv_bias": "off"})


def test_rewrite_reads_the_config_it_is_given():
    import torch.nn.functional as F

    def f(x):
        return F.max_pool3d(F.leaky_relu(x, 0.1), 2)

    x = torch.randn(1, 2, 4, 4, 4)
    for partial, want in ((False, 0), (True, 1)):
        gm = torch.fx.symbolic_trace(f)
        from torch.fx.passes.shape_prop import ShapeProp
        ShapeProp(gm).propagate(x)
        for n in gm.graph.nodes:
            if "tensor_meta" in n.meta:
                tm = n.meta["tensor_meta"]
                n.meta["val"] = torch.empty_strided(tm.shape, tm.stride, dtype=tm.dtype)
        assert fusion_pass.rewrite(gm.graph, PassConfig(partial_chains=partial)) == want


def test_legacy_module_switches_read_and_write_the_config(monkeypatch):
    before = pass_config.current()
    assert fusion_pass.FOLD_CONV_BIAS == before.fold_conv_bias
    assert fusion_pass.FUSE_CONV_TRANSPOSE == before.fuse_conv_transpose
    with pass_config.patch(PassConfig(conv_in_training=False)):
        with pytest.warns(DeprecationWarning, match="pass_config.patch"):
            monkeypatch.setattr(fusion_pass, "FUSE_CONV_TRANSPOSE", "always")
        # the strings send training graphs to the fused op too
        assert pass_config.current() == PassConfig(fuse_conv_transpose="always", conv_in_training=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            monkeypatch.setattr(fusion_pass, "FOLD_CONV_BIAS", "off")
            assert pass_config.current().fold_conv_bias == "off"
            monkeypatch.undo()
        assert pass_config.current() == PassConfig()
    with pass_config.patch(PassConfig()), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        fusion_pass.FUSE_CONV_TRANSPOSE = "off"
        assert pass_config.current() == PassConfig(fuse_conv_transpose="off")
    assert pass_config.current() is before


# ---- envs.py ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,values", [
    ("TORCH_FUSED_OPS_DISABLE", {None: False, "": False, "0": False, "1": True, "yes": True}),
    ("TORCH_FUSED_OPS_CPU_HUGE_PAGES", {None: True, "0": False, "1": True, "": True}),
])
def test_envs_parse_each_variable_as_documented(monkeypatch, name, values):
    assert name in envs.environment_variables and f"``{name}``" in envs.__doc__
    for raw, want in values.items():
        if raw is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, raw)
        assert getattr(envs, name) is want, (name, raw)


def test_envs_lists_build_time_variables_and_rejects_unknown_names():
    for name in envs.BUILD_TIME_VARIABLES:
        assert name in envs.__doc__
    with open(os.path.join(os.path.dirname(PKG), "setup.py")) as f:
        setup_src = f.read()
    for name in ("TORCH_CUDA_ARCH_LIST", "TORCH_FUSED_OPS_NO_CUDA", "TORCH_FUSED_OPS_NO_OPENMP", "CUDA_HOME"):
        assert name in setup_src and name in envs.BUILD_TIME_VARIABLES
    with pytest.raises(AttributeError):
        envs.TORCH_FUSED_OPS_NOT_A_SETTING  # noqa: B018
    assert set(envs.environment_variables) <= set(dir(envs))


def test_library_modules_do_not_import_the_package_back():
    # __init__ imports them; importing __init__ (or a name defined there) back would be a cycle. The benches and
    # the demo are entry points that use the public package, so they are not checked.
    submodules = {os.path.basename(p).split(".")[0] for p in glob.glob(os.path.join(PKG, "*.py"))} | {"_C"}
    offenders = []
    for path in sorted(glob.glob(os.path.join(PKG, "*.py"))):
        name = os.path.basename(path)[:-3]
        if name in ("__init__", "bench", "bench_conv", "bench_train", "demo"):
            continue
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module is None:
                offenders += [f"{name}: from . import {a.name}" for a in node.names if a.name not in submodules]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "torch_fused_ops":
                offenders.append(f"{name}: from torch_fused_ops import ...")
            elif isinstance(node, ast.Import) and any(a.name == "torch_fused_ops" for a in node.names):
                offenders.append(f"{name}: import torch_fused_ops")
    assert not offenders, offenders


def test_package_does_not_import_triton():
    # The fused convolution is C++/CUDA: no module of the package imports Triton (Inductor's own Triton kernels
    # are Inductor's business).
    offenders = []
    for path in sorted(glob.glob(os.path.join(PKG, "*.py"))):
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{os.path.basename(path)}: {n}" for n in names if n.split(".")[0] == "triton"]
    assert not offenders, offenders


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
    want = {f"torch_fused_ops.{m}" for m in ("fusion_pass", "_pass_nodes", "pass_config", "_conv_coverage", "ops",
                                             "_geometry", "conv_ops")}
    assert want <= set(hashed), want - set(hashed)
