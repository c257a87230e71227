"""The fused-convolution Triton kernels compiled for sm_90 (the H200) without a GPU, as Inductor launches them.

Inductor's generated wrapper declares Python float arguments as fp64, where Triton's own launcher uses fp32. A
kernel that computes with its slope arguments as they arrive then runs its epilogue in double precision: on the
H200 that made the compiled Model's kernel 1.45x slower than the same kernel launched eagerly (2026-11-29,
benchmarks/compiled_kernel_check.py). These compiles check the SASS for double-precision arithmetic.
"""
import importlib.util
import os
import shutil

import pytest

triton = pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("the interpreter replaces compiled kernels", allow_module_level=True)

from torch_fused_ops import _conv_post_pool_gemm_triton as gemm  # noqa: E402
from torch_fused_ops import _conv_post_pool_phase_gemm_triton as phase  # noqa: E402
from torch_fused_ops import _conv_post_pool_triton as exact  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "triton_resources", os.path.join(os.path.dirname(__file__), "..", "benchmarks", "triton_resources.py"))
resources_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(resources_mod)
if not os.path.exists(resources_mod._cuobjdump()) and not shutil.which("cuobjdump"):
    pytest.skip("no cuobjdump (Triton's NVIDIA backend ships one)", allow_module_level=True)

COMMON = dict(CIN_P=16, HAS_BIAS=True, USE_ASM=True, SOFT_BF16=False)
KERNELS = {
    "phase-split bf16": (phase._conv_t3d_pool_phase_gemm_kernel, "bfloat16", 4, 1, dict(
        CK=16, BNC=32, WITH_OFFSETS=False, IS_FP32=False, IS_HALF=True, PRECISION="ieee", ROUND_A=False,
        W_KMAJOR=True, SPLIT3=False, BM=64, MONO=True)),
    "phase-split 3xtf32 with offsets": (phase._conv_t3d_pool_phase_gemm_kernel, "float32", 4, 1, dict(
        CK=16, BNC=32, WITH_OFFSETS=True, IS_FP32=True, IS_HALF=False, PRECISION="tf32", ROUND_A=False,
        W_KMAJOR=True, SPLIT3=True, BM=64, MONO=False)),
    "packed tf32": (gemm._conv_t3d_pool_gemm_kernel, "float32", 4, 3, dict(
        BNC=32, MONO=True, IS_FP32=True, IS_HALF=False, PRECISION="tf32", ROUND_A=True, W_KMAJOR=True, BM=64,
        BK=32, FIXUP=False, FIXUP_TILES=32)),
    "packed tf32 fix-up launch": (gemm._conv_t3d_pool_gemm_kernel, "float32", 4, 3, dict(
        BNC=32, MONO=True, IS_FP32=True, IS_HALF=False, PRECISION="tf32", ROUND_A=True, W_KMAJOR=True, BM=64,
        BK=32, FIXUP=True, FIXUP_TILES=32)),
    "phase-exact tf32 with offsets": (exact._conv_t3d_post_pool_kernel, "float32", 4, 1, dict(
        COUT_P=32, BK=16, BN=32, WITH_OFFSETS=True, IS_FP32=True, IS_HALF=False, PRECISION="tf32",
        ROUND_TF32=True, BM=64, MONO=False)),
    "phase-exact bf16 monotone": (exact._conv_t3d_post_pool_kernel, "bfloat16", 4, 1, dict(
        COUT_P=32, BK=16, BN=32, WITH_OFFSETS=False, IS_FP32=False, IS_HALF=True, PRECISION="ieee",
        ROUND_TF32=False, BM=64, MONO=True)),
}


@pytest.mark.parametrize("name", list(KERNELS))
def test_no_double_precision_math_with_fp64_slopes(name):
    fn, dtype, nw, ns, consts = KERNELS[name]
    fp64 = resources_mod.resources(fn, dtype, {**COMMON, **consts}, nw, ns, scalar="fp64")
    assert fp64["fp64_math"] == 0, f"{name}: {fp64['fp64_math']} double-precision instructions with fp64 slopes"
    # The same compile with fp32 slopes (Triton's own launcher): the check itself must see the kernel's math.
    fp32 = resources_mod.resources(fn, dtype, {**COMMON, **consts}, nw, ns, scalar="fp32")
    assert fp32["fp64_math"] == 0 and fp32["registers"] > 0
