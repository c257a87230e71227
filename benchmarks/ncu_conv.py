"""Nsight Compute evidence for the fused convolution kernels that ship, at the KernelBench size (CUDA only).

    python benchmarks/ncu_conv.py --profile OUT_DIR     # runs ncu on itself, then prints the summary table
    (python benchmarks/ncu_conv.py --launch             # what ncu runs: one launch of each shipped path)

Each shipped inference path (``_conv_triton_op.launch``: bf16 and strict float32 on the phase-split GEMM, TF32
on the packed GEMM, TF32 forced onto the phase-split GEMM for comparison) launches once; the first call compiles,
so no warm-up launch is profiled. ncu collects the Speed-of-light, occupancy, launch, warp-state and compute
sections (``--clock-control none``, as METHOD.md asks); the summary gives per kernel: time, SM and DRAM
throughput, tensor-pipe activity, achieved against theoretical occupancy, registers, the block limit that
registers impose, issue-slot use and the largest warp stall reasons (cycles per issued instruction).
"""
from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys

SECTIONS = ["SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "ComputeWorkloadAnalysis"]
PATHS = ["bf16", "tf32", "tf32-phase-split", "strict"]


def launch_all():
    import torch

    import torch_fused_ops  # noqa: F401
    from torch_fused_ops import _conv_triton_op
    from torch_fused_ops.models import DEFAULT_BATCH, DEFAULT_INPUT

    torch.manual_seed(0)
    x32 = torch.randn(DEFAULT_BATCH, 16, *DEFAULT_INPUT, device="cuda")
    w32 = torch.randn(16, 32, 3, 3, 3, device="cuda") * 0.1
    b32 = torch.randn(32, device="cuda") * 0.1
    m32 = torch.randn(32, device="cuda")
    for name in PATHS:
        dtype = torch.bfloat16 if name == "bf16" else torch.float32
        tf32 = name.startswith("tf32")
        x, w, b, m = (t.to(dtype) for t in (x32, w32, b32, m32))
        saved = _conv_triton_op._SMALL_POSITIONS
        if name == "tf32-phase-split":
            _conv_triton_op._SMALL_POSITIONS = 1 << 40
        torch.cuda.nvtx.range_push(name)
        _conv_triton_op.launch(x, w, b, m, 0.2, 0.2, [1, 1, 1], tf32)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        _conv_triton_op._SMALL_POSITIONS = saved


def _num(v):
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return float("nan")


def summarise(csv_path):
    with open(csv_path) as f:
        rows = [r for r in csv.reader(f) if len(r) > 5]
    if len(rows) < 3:
        print("no ncu rows")
        return
    head, units, data = rows[0], rows[1], rows[2:]
    col = {h: i for i, h in enumerate(head)}

    def get(r, name):
        return _num(r[col[name]]) if name in col else float("nan")

    stall_cols = [h for h in head if h.startswith("smsp__average_warps_issue_stalled_")
                  and h.endswith("_per_issue_active.ratio")]
    print("| kernel | us | SM % | DRAM % | tensor pipe % | occupancy achieved / theoretical % | registers | "
          "blocks/SM by registers | issue slots % | top stalls (cycles per issued instruction) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for i, r in enumerate(data):
        name = r[col.get("Kernel Name", 0)][:40]
        unit = units[col["gpu__time_duration.sum"]] if "gpu__time_duration.sum" in col else "ns"
        dur = get(r, "gpu__time_duration.sum") * {"ns": 1e-3, "nsecond": 1e-3, "ms": 1e3, "msecond": 1e3}.get(unit, 1.0)
        stalls = sorted(((get(r, h), h[len("smsp__average_warps_issue_stalled_"):-len("_per_issue_active.ratio")])
                         for h in stall_cols), reverse=True)
        stalls = [s for s in stalls if s[1] != "selected"][:4]
        print(f"| {i} {name} | {dur:.1f} | {get(r, 'sm__throughput.avg.pct_of_peak_sustained_elapsed'):.1f} | "
              f"{get(r, 'gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed'):.1f} | "
              f"{get(r, 'sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active'):.1f} | "
              f"{get(r, 'sm__warps_active.avg.pct_of_peak_sustained_active'):.1f} / "
              f"{get(r, 'sm__maximum_warps_per_active_cycle_pct'):.1f} | "
              f"{get(r, 'launch__registers_per_thread'):.0f} | {get(r, 'launch__occupancy_limit_registers'):.0f} | "
              f"{get(r, 'sm__issue_active.avg.pct_of_peak_sustained_elapsed'):.1f} | "
              + ", ".join(f"{n} {v:.2f}" for v, n in stalls) + " |")
    print(f"\nkernels in order: {', '.join(PATHS)} (the TF32 packed GEMM adds its fix-up launch)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launch", action="store_true")
    ap.add_argument("--profile", metavar="OUT_DIR")
    args = ap.parse_args()
    if args.launch:
        return launch_all()
    out = args.profile or os.environ.get("OUT", "/tmp")
    csv_path = os.path.join(out, "ncu_conv.csv")
    cmd = ["ncu", "--clock-control", "none", "-k", "regex:conv_t3d", "--page", "raw", "--csv"]
    for s in SECTIONS:
        cmd += ["--section", s]
    cmd += [sys.executable, os.path.abspath(__file__), "--launch"]
    with open(csv_path, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.PIPE, text=True, check=False)
    if rc.returncode:
        print(rc.stderr[-2000:])
    # ncu prints its own log lines (==PROF==) before the CSV
    with open(csv_path) as f:
        lines = [ln for ln in f if not ln.startswith("==")]
    with open(csv_path, "w") as f:
        f.writelines(lines)
    summarise(csv_path)
    return rc.returncode


if __name__ == "__main__":
    sys.exit(main())
