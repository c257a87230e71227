import os
import sys
import tempfile

import pytest
import torch

# Test modules import their helpers as `fused_testing`; make that work however
# pytest is invoked (rootdir, import mode).
sys.path.insert(0, os.path.dirname(__file__))

try:
    from hypothesis import configuration as _hypothesis_configuration

    # Keep Hypothesis' example database and caches out of the repository.
    _hypothesis_configuration.set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), "torch_fused_ops_hypothesis"))
except ImportError:  # pragma: no cover
    pass


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: torch.compile smoke tests (tens of seconds)")


@pytest.fixture(autouse=True)
def _deterministic_defaults():
    # Each test draws its own seeded inputs; this only guards against state
    # leaking between tests (a test that changes the default dtype, grad mode).
    torch.manual_seed(0)
    dtype = torch.get_default_dtype()
    grad_enabled = torch.is_grad_enabled()
    yield
    torch.set_default_dtype(dtype)
    torch.set_grad_enabled(grad_enabled)


@pytest.fixture(autouse=True)
def _pass_settings_for_post_pool_tests(request):
    # The test_pass_* files check how the pass rewrites chains into fused.post_pool; the two CUDA-default routes
    # that replace more than the chain have their own files (conv-bias fold: test_pass_bias_fold.py; the fused
    # transposed convolution: test_conv_op.py, test_pass_conv_route.py) and are switched off elsewhere.
    name = request.module.__name__.rpartition(".")[2]
    if not name.startswith("test_pass_"):
        yield
        return
    from torch_fused_ops import pass_config

    changes = {"fuse_conv_transpose": "off"}
    if name != "test_pass_bias_fold":
        changes["fold_conv_bias"] = "off"
    with pass_config.patch(**changes):
        yield
