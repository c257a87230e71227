"""Builds torch_fused_ops._C: CPU kernels always, CUDA kernels when torch is a CUDA build and nvcc is found.

A GPU is not needed to compile the CUDA kernels (CI compiles them on a CPU-only machine).
Environment:
  TORCH_CUDA_ARCH_LIST      architectures to build for (default "8.0;9.0")
  TORCH_FUSED_OPS_NO_CUDA=1 build the CPU kernels only
  CUDA_HOME                 toolkit root; found from the real nvcc when unset
"""
import glob
import os
import re
import shutil

from setuptools import setup


def _real_cuda_home():
    """Toolkit root of the nvcc on PATH, seeing through wrapper scripts.

    torch guesses CUDA_HOME as dirname(dirname(which nvcc)); when nvcc is a small shell script that
    execs the real compiler (as on our CI machines), that guess lacks lib64/ and linking fails.
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


if "CUDA_HOME" not in os.environ and "CUDA_PATH" not in os.environ:
    home = _real_cuda_home()
    if home:
        os.environ["CUDA_HOME"] = home
os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "8.0;9.0")

import torch  # noqa: E402  (CUDA_HOME must be set before cpp_extension reads it)
from torch.utils import cpp_extension  # noqa: E402

ROOT = os.path.dirname(os.path.abspath(__file__))
want_cuda = (
    os.environ.get("TORCH_FUSED_OPS_NO_CUDA", "0") != "1"
    and torch.version.cuda is not None
    and cpp_extension.CUDA_HOME is not None
)

sources = sorted(glob.glob(os.path.join("csrc", "*.cpp")))
# -ffp-contract=off: never fuse a*b+c into an FMA, which would change float32 results against eager.
# -fopenmp: at::parallel_for is header code and runs serially without it.
use_openmp = os.environ.get("TORCH_FUSED_OPS_NO_OPENMP", "0") != "1"
# -fno-trapping-math lets the compiler if-convert (and so vectorize) the max/select loops; it changes no result,
# only which floating-point exception flags may be raised.
cxx_flags = ["-O3", "-ffp-contract=off", "-fno-trapping-math"] + (["-fopenmp"] if use_openmp else [])
ext_kwargs = dict(
    include_dirs=[os.path.join(ROOT, "csrc")],
    extra_compile_args={"cxx": cxx_flags},
    extra_link_args=["-fopenmp"] if use_openmp else [],
)
if want_cuda:
    sources += sorted(glob.glob(os.path.join("csrc", "cuda", "*.cu")))
    ext_kwargs["extra_compile_args"]["cxx"].append("-DWITH_CUDA")
    # No --use_fast_math: it flushes denormals and would break bit-exactness with eager PyTorch.
    ext_kwargs["extra_compile_args"]["nvcc"] = ["-O3", "-DWITH_CUDA", "-lineinfo"]
    ext = cpp_extension.CUDAExtension("torch_fused_ops._C", sources, **ext_kwargs)
else:
    ext = cpp_extension.CppExtension("torch_fused_ops._C", sources, **ext_kwargs)

setup(
    ext_modules=[ext],
    cmdclass={"build_ext": cpp_extension.BuildExtension},
)
