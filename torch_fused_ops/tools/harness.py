"""Building kernels alone, outside the extension: the CUDA toolkit's root and the kernel harnesses' builds.

A harness is a small pybind11 binding (in ``benchmarks/<op>/``) compiled with one kernel's sources from ``csrc/``,
so that a kernel can be checked, timed and profiled without rebuilding the whole library. It needs the source
tree (an editable install or a checkout). setup.py loads this file by path for ``real_cuda_home``, so it imports
nothing from the package and nothing heavy at module level.
"""
from __future__ import annotations

import glob
import os
import re
import shutil

# The source tree: torch_fused_ops/tools/harness.py -> the repository root.
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_CONV_BENCH = "benchmarks/conv_transpose3d_post_pool"
_CONV_CUDA = "csrc/conv_transpose3d_post_pool/cuda"

# name -> (binding, kernel sources as glob patterns), relative to the repository root
HARNESSES = {
    "conv_transpose3d_post_pool_forward": (
        f"{_CONV_BENCH}/forward_kernel_binding.cpp",
        [f"{_CONV_CUDA}/launch.cu", f"{_CONV_CUDA}/instantiations/*.cu"]),
    "conv_transpose3d_post_pool_backward": (
        f"{_CONV_BENCH}/backward_kernels_binding.cpp",
        [f"{_CONV_CUDA}/grad_conv.cu", f"{_CONV_CUDA}/grad_weight/*.cu"]),
    "conv_transpose3d_post_pool_grad_input": (
        f"{_CONV_BENCH}/grad_input_kernel_binding.cpp",
        [f"{_CONV_CUDA}/grad_input/*.cu", f"{_CONV_CUDA}/grad_input/instantiations/*.cu"]),
}


def real_cuda_home() -> str | None:
    """Toolkit root of the nvcc on PATH, seeing through wrapper scripts.

    torch guesses CUDA_HOME as dirname(dirname(which nvcc)); when nvcc is a small shell script that execs the real
    compiler (as on our CI machines), that guess lacks lib64/ and linking fails.
    """
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    nvcc = os.path.realpath(nvcc)
    try:
        with open(nvcc, "rb") as f:
            head = f.read(4096)
    except OSError:
        head = b""
    if head.startswith(b"#!"):
        m = re.search(rb"exec\s+\"?([^\s\"]+/bin/nvcc)", head)
        if m:
            nvcc = os.path.realpath(m.group(1).decode())
    return os.path.dirname(os.path.dirname(nvcc))


def set_cuda_home() -> None:
    """Sets CUDA_HOME from the real nvcc unless CUDA_HOME or CUDA_PATH is already set."""
    if "CUDA_HOME" not in os.environ and "CUDA_PATH" not in os.environ:
        home = real_cuda_home()
        if home:
            os.environ["CUDA_HOME"] = home


def _nvidia_includes() -> list[str]:
    """cusparse/cublas headers of torch's nvidia package, where the toolkit lacks them (ATen's CUDAContext.h
    includes them)."""
    try:
        import nvidia
    except ImportError:
        return []
    return [inc for p in nvidia.__path__ for inc in [os.path.join(p, "cu13", "include")] if os.path.isdir(inc)]


def build(name: str, *, repo: str = REPO, module_suffix: str = "", extra_cuda_cflags: list[str] | None = None,
          verbose: bool = False):
    """Compiles and loads harness `name` (a key of HARNESSES) from the tree at `repo` (default: this package's
    source tree; another checkout gives before/after builds) for TORCH_CUDA_ARCH_LIST (default 9.0)."""
    binding, patterns = HARNESSES[name]
    binding = os.path.join(repo, binding)
    if not os.path.isfile(binding):
        raise FileNotFoundError(f"the {name} harness needs the source tree (benchmarks/ and csrc/): {binding} is "
                                "missing; use an editable install or run from a checkout")
    set_cuda_home()
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    from torch.utils import cpp_extension

    cpp_extension.CUDA_HOME = os.environ.get("CUDA_HOME", cpp_extension.CUDA_HOME)
    sources = [binding] + [s for pattern in patterns for s in sorted(glob.glob(os.path.join(repo, pattern)))]
    return cpp_extension.load(name=name + "_harness" + module_suffix, sources=sources,
                              extra_include_paths=[os.path.join(repo, "csrc")] + _nvidia_includes(), extra_cflags=["-O3"],
                              extra_cuda_cflags=["-O3", "-lineinfo", "-Xptxas=-v"] + (extra_cuda_cflags or []),
                              verbose=verbose)
