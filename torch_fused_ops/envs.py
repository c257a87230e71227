"""Every user-facing environment variable of torch_fused_ops, declared once: its name, meaning and default.

Read an attribute of this module to get a variable's current value, parsed (``envs.TORCH_FUSED_OPS_DISABLE``).
Values are read from ``os.environ`` on each access, not cached here: a module that must decide once per process
(the install at import, a kernel-config choice made at import) reads the attribute once and keeps the result,
and says so. No other package module reads ``os.environ`` for these names.

Run time:

``TORCH_FUSED_OPS_DISABLE`` (default unset, i.e. off)
    Any value other than empty or ``0`` set before ``import torch_fused_ops`` skips installing the Inductor
    pass (``torch_fused_ops.enable()`` still installs it later). Read once, at import.
``TORCH_FUSED_OPS_CPU_HUGE_PAGES`` (default ``1``)
    ``0`` stops the CPU kernels from asking Linux for transparent huge pages (``madvise``) on their own large
    outputs (where memory is fragmented, a huge-page fault can stall while the kernel compacts memory). Any
    other value keeps the advice on. Read once per process.

Build time only (read by setup.py while compiling the extension; they change nothing at run time):

``TORCH_CUDA_ARCH_LIST``
    CUDA architectures to compile for (setup.py defaults it to ``8.0;9.0``).
``TORCH_FUSED_OPS_NO_CUDA``
    ``1`` builds the CPU kernels only, even with a CUDA build of torch.
``TORCH_FUSED_OPS_NO_OPENMP``
    ``1`` builds the CPU kernels without OpenMP.
``CUDA_HOME`` (or ``CUDA_PATH``)
    The CUDA toolkit to build with (setup.py looks for ``nvcc`` when neither is set).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any


def _set_and_not_zero(name: str) -> bool:
    return os.environ.get(name, "0") not in ("", "0")


def _not_zero(name: str) -> bool:
    return os.environ.get(name) != "0"


# name -> parser of its current value. Adding a variable means adding it here and to the docstring above.
environment_variables: dict[str, Callable[[], Any]] = {
    "TORCH_FUSED_OPS_DISABLE": lambda: _set_and_not_zero("TORCH_FUSED_OPS_DISABLE"),
    "TORCH_FUSED_OPS_CPU_HUGE_PAGES": lambda: _not_zero("TORCH_FUSED_OPS_CPU_HUGE_PAGES"),
}

# Read by setup.py only; listed so that a check for undeclared variables can tell them from run-time ones.
BUILD_TIME_VARIABLES = ("TORCH_CUDA_ARCH_LIST", "TORCH_FUSED_OPS_NO_CUDA", "TORCH_FUSED_OPS_NO_OPENMP", "CUDA_HOME",
                        "CUDA_PATH")

if TYPE_CHECKING:  # the attributes this module provides
    TORCH_FUSED_OPS_DISABLE: bool
    TORCH_FUSED_OPS_CPU_HUGE_PAGES: bool


def __getattr__(name: str) -> Any:
    if name in environment_variables:
        return environment_variables[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(environment_variables))
