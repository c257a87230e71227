"""torch_fused_ops: fused PyTorch operators for torch.compile.

``import torch_fused_ops`` loads the C++/CUDA library (registering ``torch.ops.fused.*``), the Python
fake/autograd registrations, and installs the Inductor pass that rewrites LeakyReLU -> x multiplier ->
LeakyReLU -> MaxPool3d chains in torch.compile graphs to ``fused.post_pool`` (set TORCH_FUSED_OPS_DISABLE=1
before import to skip that; see :func:`enable`, :func:`disable`, :func:`fusion_enabled`; what the pass folds
and fuses: :mod:`torch_fused_ops.compile.pass_config`; environment variables: :mod:`torch_fused_ops.envs`).
"""
from __future__ import annotations

import logging

import torch

# The package's logger (the fusion pass logs its decisions on a child at DEBUG); silent unless the application
# configures logging.
logging.getLogger(__name__).addHandler(logging.NullHandler())

try:
    from . import _C  # noqa: F401  (loading the library runs its TORCH_LIBRARY registrations)
except ImportError as e:  # pragma: no cover - depends on the build
    raise ImportError(
        "torch_fused_ops: the compiled library torch_fused_ops._C failed to load. It must be built against the "
        f"installed torch ({torch.__version__}); rebuild with `pip install --no-build-isolation -e .`. "
        f"Original error: {e}"
    ) from e

__version__ = "0.1.0"

from .ops import conv_transpose3d_post_pool, post_pool, reference_post_pool  # noqa: E402
from .compile.install import disable, enable, fusion_enabled, install, is_enabled, matched_count  # noqa: E402
from . import envs  # noqa: E402
from .compile import pass_config  # noqa: E402
from .compile.pass_config import PassConfig  # noqa: E402
from .compile.explain import explain  # noqa: E402

# The CPU kernels' huge-page advice, from the environment, once per process.
torch.ops.fused._set_cpu_huge_pages(envs.TORCH_FUSED_OPS_CPU_HUGE_PAGES)

# Inductor's generated code calls our operators through their typed entry point (compile/extern_calls.py).
from .compile import extern_calls as _extern_calls  # noqa: E402

_extern_calls.install()

__all__ = [
    "post_pool", "reference_post_pool", "conv_transpose3d_post_pool", "has_cuda_kernels", "enable", "disable", "is_enabled", "fusion_enabled",
    "matched_count", "PassConfig", "pass_config", "envs", "explain", "__version__",
]


def has_cuda_kernels() -> bool:
    """Whether this build of the library registered CUDA kernels (it does whenever torch is a CUDA build)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key("fused::post_pool", "CUDA")


install()
