"""The kernel harnesses (torch_fused_ops/tools/harness.py), on CPU: every harness names a binding and kernel sources
that exist in the tree (what harness.build compiles, e.g. for test_conv_cuda_kernel.py's
TORCH_FUSED_OPS_CONV_KERNEL_DEV=1), and real_cuda_home, which setup.py uses too, sees through an nvcc wrapper
script. Building needs a GPU machine and is not done here."""
import glob
import os
import stat

from torch_fused_ops.tools import harness


def test_every_harness_names_existing_sources():
    assert harness.HARNESSES
    for name, (binding, patterns) in harness.HARNESSES.items():
        assert os.path.isfile(os.path.join(harness.REPO, binding)), (name, binding)
        for pattern in patterns:
            assert glob.glob(os.path.join(harness.REPO, pattern)), (name, pattern)


def test_real_cuda_home_sees_through_an_nvcc_wrapper(tmp_path, monkeypatch):
    bin_dir = tmp_path / "wrapper" / "bin"
    bin_dir.mkdir(parents=True)
    nvcc = bin_dir / "nvcc"
    nvcc.write_text('#!/bin/sh\nexec "/opt/cuda-real/bin/nvcc" "$@"\n')
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(bin_dir))
    assert harness.real_cuda_home() == "/opt/cuda-real"
    nvcc.write_bytes(b"\x7fELF")  # the compiler itself: its own toolkit root
    assert harness.real_cuda_home() == str(tmp_path / "wrapper")
