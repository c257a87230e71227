"""Builds torch_fused_ops._C: CPU kernels always, CUDA kernels when torch is a CUDA build and nvcc is found.

A GPU is not needed to compile the CUDA kernels (CI compiles them on a CPU-only machine).
Environment:
  TORCH_CUDA_ARCH_LIST      architectures to build for (default "8.0;9.0a"; 9.0a adds the Hopper kernel's
                            wgmma machine code, which runs on compute capability 9.0 only, and the sm_90 code)
  TORCH_FUSED_OPS_NO_CUDA=1 build the CPU kernels only
  TORCH_FUSED_OPS_HOPPER_ABLATION=1  a measurement build: the sm_90a kernel can leave parts out
                            (torch_fused_ops._C._conv_hopper_ablation; never for use)
  CUDA_HOME                 toolkit root; found from the real nvcc when unset
"""
import glob
import importlib.util
import os

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))


def _load_harness_module():
    """torch_fused_ops/tools/harness.py, loaded by path: the package itself cannot be imported before it is built."""
    spec = importlib.util.spec_from_file_location("_harness", os.path.join(ROOT, "torch_fused_ops", "tools",
                                                                           "harness.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# CUDA_HOME from the real nvcc, also when the nvcc on PATH is a wrapper script (torch's guess then lacks lib64/).
_load_harness_module().set_cuda_home()
os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "8.0;9.0a")

import torch  # noqa: E402  (CUDA_HOME must be set before cpp_extension reads it)
from torch.utils import cpp_extension  # noqa: E402

want_cuda = (
    os.environ.get("TORCH_FUSED_OPS_NO_CUDA", "0") != "1"
    and torch.version.cuda is not None
    and cpp_extension.CUDA_HOME is not None
)

sources = sorted(glob.glob(os.path.join("csrc", "**", "*.cpp"), recursive=True))
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
    sources += sorted(glob.glob(os.path.join("csrc", "**", "*.cu"), recursive=True))
    ext_kwargs["extra_compile_args"]["cxx"].append("-DWITH_CUDA")
    # No --use_fast_math: it flushes denormals and would break bit-exactness with eager PyTorch.
    ext_kwargs["extra_compile_args"]["nvcc"] = ["-O3", "-DWITH_CUDA", "-lineinfo"]
    # The launcher runs the sm_90a kernel (csrc/conv_transpose3d_post_pool/hopper/) only when it was compiled.
    if any(a.strip().lower().startswith("9.0a") for a in os.environ["TORCH_CUDA_ARCH_LIST"].replace(",", ";").split(";")):
        ext_kwargs["extra_compile_args"]["nvcc"].append("-DFUSED_SM90A")
        ext_kwargs["extra_compile_args"]["cxx"].append("-DFUSED_SM90A")
    # The ablation switch's branches cost the sm_90a kernel registers (spills in its training forms): a separate
    # measurement build holds them (benchmarks/conv_transpose3d_post_pool/hopper_forward.py --ablate).
    if os.environ.get("TORCH_FUSED_OPS_HOPPER_ABLATION", "0") == "1":
        ext_kwargs["extra_compile_args"]["nvcc"].append("-DFUSED_HOPPER_ABLATION")
        ext_kwargs["extra_compile_args"]["cxx"].append("-DFUSED_HOPPER_ABLATION")
    ext = cpp_extension.CUDAExtension("torch_fused_ops._C", sources, **ext_kwargs)
else:
    ext = cpp_extension.CppExtension("torch_fused_ops._C", sources, **ext_kwargs)

setup(
    ext_modules=[ext],
    cmdclass={"build_ext": cpp_extension.BuildExtension},
)
