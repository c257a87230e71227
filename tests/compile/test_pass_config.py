"""The pass's settings, pass_config.PassConfig (torch_fused_ops/compile/pass_config.py): its defaults, validation,
hash and its place in the pass's uuid, patch() and current(), and rewrite() reading the config it is given."""

import dataclasses

import pytest
import torch

from torch_fused_ops.compile import fusion_pass, pass_config
from torch_fused_ops.compile.pass_config import PassConfig

pytestmark = pytest.mark.pass_settings(fuse_conv_transpose="off", fold_conv_bias="off")  # chains only (conftest.py)


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


# The package's settings (an empty mark replaces the file's), as beside the fused convolution's op tests.
@pytest.mark.pass_settings()
def test_uuid_depends_on_fuse_conv_transpose():
    with pass_config.patch(fuse_conv_transpose="off"):
        off = fusion_pass.PostPoolFusionPass().uuid()
    with pass_config.patch(fuse_conv_transpose="cuda"):
        assert fusion_pass.PostPoolFusionPass().uuid() != off


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
