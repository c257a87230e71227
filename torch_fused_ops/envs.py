"""Every environment variable torch_fused_ops reads, declared once: name, default, meaning, parser.

Read an attribute of this module to get a variable's current value, parsed (``envs.TORCH_FUSED_OPS_DISABLE``).
Values come from ``os.environ`` on each access, not cached here: a module that must decide once per process reads
the attribute once and keeps the result, and says so. No other package module reads ``os.environ`` for these names.
The variables and their meanings are listed at the end of this docstring, generated from the entries below.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any


@dataclasses.dataclass(frozen=True)
class Variable:
    default: str
    description: str
    parse: Callable[[str], Any] | None = None  # None: read by setup.py only, at build time


def _set_and_not_zero(name: str) -> bool:
    return os.environ.get(name, "0") not in ("", "0")


def _not_zero(name: str) -> bool:
    return os.environ.get(name) != "0"


# Run time: the package reads these.
environment_variables: dict[str, Variable] = {
    "TORCH_FUSED_OPS_DISABLE": Variable(
        "unset (off)",
        "Any value other than empty or ``0`` set before ``import torch_fused_ops`` skips installing the Inductor "
        "pass (``torch_fused_ops.enable()`` still installs it later). Read once, at import.",
        _set_and_not_zero),
    "TORCH_FUSED_OPS_COMPILED_CALLS": Variable(
        "``1``",
        "``0`` leaves the code Inductor generates calling our operators through ``torch.ops``; otherwise it calls "
        "them through a typed entry point that skips torch.ops' per-call argument parsing "
        "(``torch_fused_ops/compile/extern_calls.py``). Read once, at import.",
        _not_zero),
    "TORCH_FUSED_OPS_CPU_HUGE_PAGES": Variable(
        "``1``",
        "``0`` stops the CPU kernels from asking Linux for transparent huge pages (``madvise``) on their own large "
        "outputs (where memory is fragmented, a huge-page fault can stall while the kernel compacts memory). Any "
        "other value keeps the advice on. Read once per process, at import.",
        _not_zero),
}

# Build time: setup.py reads these while compiling the extension; they change nothing at run time.
build_time_variables: dict[str, Variable] = {
    "TORCH_CUDA_ARCH_LIST": Variable("``8.0;9.0``", "CUDA architectures to compile for."),
    "TORCH_FUSED_OPS_NO_CUDA": Variable("unset", "``1`` builds the CPU kernels only, even with a CUDA build of torch."),
    "TORCH_FUSED_OPS_NO_OPENMP": Variable(
        "unset", "``1`` builds the CPU kernels without OpenMP (they then run on one thread)."),
    "TORCH_FUSED_OPS_HOPPER_ABLATION": Variable(
        "unset", "``1`` makes a measurement build whose sm_90a convolution kernel can leave its parts out "
                 "(``torch_fused_ops._C._conv_hopper_ablation``; its outputs are then wrong). Not for use."),
    "CUDA_HOME": Variable("found from the real ``nvcc``",
                          "The CUDA toolkit to build with; without it setup.py follows the ``nvcc`` on PATH, also "
                          "through a wrapper script (torch_fused_ops/tools/harness.py)."),
    "CUDA_PATH": Variable("unset", "Read as CUDA_HOME when CUDA_HOME is unset."),
}
BUILD_TIME_VARIABLES = tuple(build_time_variables)

if TYPE_CHECKING:  # the attributes this module provides
    TORCH_FUSED_OPS_DISABLE: bool
    TORCH_FUSED_OPS_COMPILED_CALLS: bool
    TORCH_FUSED_OPS_CPU_HUGE_PAGES: bool


def _describe(title: str, variables: dict[str, Variable]) -> str:
    lines = [f"\n{title}\n"]
    for name, v in variables.items():
        lines.append(f"``{name}`` (default {v.default})\n    {v.description}\n")
    return "".join(lines)


__doc__ += _describe("Run time:", environment_variables) + _describe("Build time (setup.py):", build_time_variables)


def __getattr__(name: str) -> Any:
    if name in environment_variables:
        return environment_variables[name].parse(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(environment_variables))
