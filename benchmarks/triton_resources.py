"""Registers, spills, shared memory and matrix instructions of the fused-convolution Triton kernels, compiled
for sm_90 (the H200) on a machine without a GPU.

    python benchmarks/triton_resources.py

Triton compiles to a cubin for a named target without a device; `cuobjdump` (shipped in Triton's NVIDIA backend)
reads its resource usage and SASS. Launch configs that spill, lose their wgmma (HGMMA) instructions or need too
much shared memory can be ruled out before spending device time. Triton here may be newer than on the device
(3.8 here, 3.6 on the H200), so treat the figures as indicative. tests/test_triton_sm90_compile.py uses
resources() to check that no kernel computes in double precision.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from torch_fused_ops import _conv_post_pool_gemm_triton as gemm
from torch_fused_ops import _conv_post_pool_phase_gemm_triton as phase

_POINTERS = ("x_ptr", "w_ptr", "b_ptr", "m_ptr", "out_ptr")


def _cuobjdump() -> str:
    found = shutil.which("cuobjdump")
    if found:
        return found
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def resources(fn, dtype: str, constexprs: dict, num_warps: int, num_stages: int, scalar: str = "fp32") -> dict:
    """Compiles ``fn`` as a launch on a contiguous KernelBench-size input would: Triton turns the innermost strides
    (1) into constants and marks pointers and the other ints divisible by 16. Without that, the compiler cannot
    see that neighbouring rows are neighbouring addresses, and the figures change a lot (the phase-split kernel:
    255 registers and 2.9 KB of spills instead of 190 registers, no spills). ``scalar``: the type of the float
    arguments (Triton's launcher passes Python floats as fp32, Inductor's wrapper as fp64)."""
    ptr = {"float32": "*fp32", "bfloat16": "*bf16", "float16": "*fp16"}[dtype]
    constexprs = {k: v for k, v in constexprs.items() if k in fn.arg_names}
    constexprs.update({k: 1 for k in ("sxw", "sow") if k in fn.arg_names})
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            sig[name] = "constexpr"
            continue
        if name in _POINTERS or name == "sel_ptr":
            sig[name] = ptr
        elif name == "flag_ptr":
            sig[name] = "*i32"
        elif name == "off_ptr":
            sig[name] = "*u8"
        elif name in ("s1", "s2"):
            sig[name] = scalar
            continue
        else:
            sig[name] = "i32"
        attrs[(i,)] = [["tt.divisibility", 16]]
    kernel = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs),
                            target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps, num_stages=num_stages))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        usage = subprocess.run([_cuobjdump(), "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([_cuobjdump(), "--dump-sass", f.name], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    return dict(registers=int(m.group(1)), spill_stack_bytes=int(m.group(2)), shared_bytes=kernel.metadata.shared,
                wgmma=sass.count("HGMMA"), mma_sync=sass.count("HMMA"),
                fp64_math=len(re.findall(r"\bD(?:ADD|MUL|FMA|SETP|MNMX)\b", sass)))


def main():
    rows = []

    def row(name, fn, dtype, consts, nw, ns):
        try:
            r = resources(fn, dtype, consts, nw, ns)
        except Exception as e:  # noqa: BLE001
            r = {"error": str(e).strip().splitlines()[-1][:120]}
        rows.append((name, r))
        print(name, r, flush=True)

    # The packed GEMM (what ships for TF32 at larger sizes).
    for dtype, tf32, kmajor, bm, bk, nw, ns, bnc in [
        ("bfloat16", False, False, 64, 64, 4, 3, 32),
        ("bfloat16", False, False, 128, 64, 8, 3, 32),
        ("float32", True, True, 64, 32, 4, 3, 32),
        ("float32", True, True, 64, 16, 4, 3, 32),
    ]:
        consts = dict(CIN_P=16, BNC=bnc, HAS_BIAS=True, MONO=True, IS_FP32=dtype == "float32",
                      IS_HALF=dtype != "float32", PRECISION="tf32" if tf32 else "ieee", ROUND_A=tf32, USE_ASM=True,
                      SOFT_BF16=False, W_KMAJOR=kmajor, BM=bm, BK=bk, FIXUP=False,
                      FIXUP_TILES=32)
        name = (f"packed {dtype}{' tf32' if tf32 else ''}{' kmajor' if kmajor else ''} BM{bm} BK{bk} {nw}w {ns}s "
                f"Cout/prog {bnc}")
        row(name, gemm._conv_t3d_pool_gemm_kernel, dtype, consts, nw, ns)
    # The phase-split GEMM (what ships for bf16, strict float32 and small TF32 sizes).
    for dtype, precision, bnc, nw, ns, mono in [
        ("float32", "tf32", 32, 4, 1, False), ("float32", "tf32", 32, 4, 1, True), ("float32", "tf32", 16, 4, 1, True),
        ("bfloat16", "ieee", 32, 4, 1, False), ("bfloat16", "ieee", 32, 4, 1, True), ("bfloat16", "ieee", 32, 8, 1, True),
        ("float32", "3xtf32", 32, 4, 1, False), ("float32", "3xtf32", 32, 4, 1, True),
    ]:
        split3 = precision == "3xtf32"
        consts = dict(CIN_P=16, CK=16, BNC=bnc, HAS_BIAS=True, WITH_OFFSETS=False, IS_FP32=dtype == "float32",
                      IS_HALF=dtype != "float32", PRECISION="tf32" if split3 else precision,
                      ROUND_A=precision == "tf32", USE_ASM=True, SOFT_BF16=False, W_KMAJOR=True, SPLIT3=split3, BM=64,
                      MONO=mono)
        name = f"phase-split {dtype} {precision} BM64 {nw}w {ns}s Cout/prog {bnc}{' monotone' if mono else ''}"
        row(name, phase._conv_t3d_pool_phase_gemm_kernel, dtype, consts, nw, ns)
    # The phase-exact kernel (the training forward; with the monotone form, an inference candidate).
    from torch_fused_ops import _conv_post_pool_triton as exact

    for dtype, tf32, nw, mono, offs in [
        ("float32", True, 4, False, True), ("float32", True, 4, False, False), ("float32", True, 4, True, False),
        ("bfloat16", False, 4, False, False), ("bfloat16", False, 4, True, False),
    ]:
        consts = dict(CIN_P=16, COUT_P=32, BK=16, BN=32, HAS_BIAS=True, WITH_OFFSETS=offs,
                      IS_FP32=dtype == "float32", IS_HALF=dtype != "float32", PRECISION="tf32" if tf32 else "ieee",
                      SOFT_BF16=False, ROUND_TF32=tf32, USE_ASM=True, BM=64, MONO=mono)
        name = (f"phase-exact {dtype}{' tf32' if tf32 else ''} BM64 {nw}w Cout/prog 32"
                f"{' +offsets' if offs else ''}{' monotone' if mono else ''}")
        row(name, exact._conv_t3d_post_pool_kernel, dtype, consts, nw, 1)
    print(f"\nTriton {triton.__version__}, target sm_90\n")
    print("| kernel / config | registers | spill stack bytes | shared KB | wgmma (HGMMA) | mma.sync (HMMA) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, r in rows:
        if "error" in r:
            print(f"| {name} | failed: {r['error']} | | | | |")
        else:
            print(f"| {name} | {r['registers']} | {r['spill_stack_bytes']} | {r['shared_bytes'] / 1024:.0f} | "
                  f"{r['wgmma']} | {r['mma_sync']} |")


if __name__ == "__main__":
    main()
