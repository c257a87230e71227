import os
import sys
import tempfile

import pytest
import torch

# Test modules in every folder import the shared helpers as `fused_testing`; make that work however pytest is
# invoked (rootdir, import mode). A folder's own helpers (pass_testing, conv_backward_testing, ...) sit next to its
# tests, where pytest's default (prepend) import mode finds them.
sys.path.insert(0, os.path.dirname(__file__))

try:
    from hypothesis import configuration as _hypothesis_configuration

    # Keep Hypothesis' example database and caches out of the repository.
    _hypothesis_configuration.set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), "torch_fused_ops_hypothesis"))
except ImportError:  # pragma: no cover
    pass


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: torch.compile smoke tests (tens of seconds)")
    config.addinivalue_line("markers", "pass_settings(**changes): the pass_config changes a compile test runs under "
                                       "(tests/compile/conftest.py applies them)")


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
