"""The built sm_90a kernels hold every product their source issues (CPU only: it reads the library's machine code).

ptxas (CUDA 13.0) merges register-A wgmma that ignore their accumulator (scale-d 0), read the same A registers and
write the same registers, whatever their B descriptors: benchmarks/conv_transpose3d_post_pool/ptxas_wgmma_merge.cu
shows it in 30 lines (8 such products stored as 2). It puts a placeholder `HGMMA.64x8x16.F16 RZ, gdesc[URZ], RZ` in
place of each dropped group and the sums come out wrong, silently: a kernel that meets it would fail its GPU tests,
but here it shows without a GPU. Strict float32's tile issues 27 x KS entries of three register-A products each
(hopper/strict.cuh), the form most exposed to it.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest


def _cuobjdump() -> str | None:
    exe = shutil.which("cuobjdump")
    if exe is not None:
        return exe
    try:
        import triton  # torch's CUDA wheels bring it, with a cuobjdump of their own
    except ImportError:
        return None
    exe = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    return exe if os.path.exists(exe) else None


def hopper_kernels_sass(exe: str, path: str) -> dict[str, str]:
    """Machine code of each sm_90a instantiation of the fused convolution's wgmma kernel in the binary at `path`, by
    mangled name."""
    res = subprocess.run([exe, "-sass", "-arch", "sm_90a", path], capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        # A library built without CUDA has no device code at all; any other failure is the tool's, not a skip.
        assert "does not contain device code" in res.stderr, f"cuobjdump failed on {path}: {res.stderr.strip()}"
        return {}
    kernels: dict[str, list[str]] = {}
    name = None
    for line in res.stdout.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            name = m.group(1)
            kernels[name] = []
        elif name is not None:
            kernels[name].append(line)
    return {k: "\n".join(v) for k, v in kernels.items() if "conv_transpose3d_post_pool_hopper_kernel" in k}


@pytest.fixture(scope="module")
def hopper_sass() -> dict[str, str]:
    from torch_fused_ops import _C

    exe = _cuobjdump()
    if exe is None:
        pytest.skip("no cuobjdump (neither on PATH nor in triton's package)")
    hopper = hopper_kernels_sass(exe, _C.__file__)
    if not hopper:
        pytest.skip("the library holds no sm_90a code of the wgmma kernel (built without CUDA or without 9.0a)")
    return hopper


def test_no_placeholder_wgmma(hopper_sass):
    merged = [k for k, sass in hopper_sass.items() if "gdesc[URZ]" in sass]
    assert not merged, f"ptxas replaced wgmma by placeholders (products merged away) in {merged}"


def test_strict_issues_every_product(hopper_sass):
    # Mode 1 is strict float32 (cuda/mma.cuh's Mode); Li<KS>E its k-steps.
    strict = {k: v for k, v in hopper_sass.items() if "ModeE1E" in k}
    assert strict, "no strict float32 instantiation in the sm_90a code"
    for name, sass in strict.items():
        ks = int(re.search(r"ModeE1ELi(\d)E", name).group(1))
        count = sass.count("HGMMA.64x32x8.F32.TF32")
        assert count == 27 * ks * 3, f"{name}: {count} TF32 products, the source issues {27 * ks * 3}"
