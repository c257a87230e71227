"""Where a block of the sm_90a forward kernel spends its time, from the kernel's own clock (hopper/trace.cuh): one op
call in a measurement build (TORCH_FUSED_OPS_HOPPER_ABLATION=1) with a trace buffer, then per unit of a block, the
mean over blocks of when its producer waits, stages and hands it over, and when its consumer gets it, finishes each
m64 tile's products and stores. Times in microseconds from the block's start, at the SM clock given (--ghz, default
1.98: the H200's under load, as Nsight Compute reports it).

    python benchmarks/conv_transpose3d_post_pool/trace_call.py [--precisions tf32,bf16] [--train] [--bits 0]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hopper_forward as h  # noqa: E402

from torch_fused_ops import _C  # noqa: E402

SLOTS = 256          # hopper/trace.cuh kTraceSlots
UNITS = 16           # kTraceUnits
PRODUCER, CONSUMER = 8, 64
M_TILES = 4


def traced_call(precision, train, bits, blocks):
    inputs = h.case_inputs(16, precision)
    cast = h.inputs_cast(precision)
    for _ in range(3):
        h.op(*inputs, train, cast)
    buf = torch.full((blocks, SLOTS), -1, dtype=torch.int64, device="cuda")
    torch.cuda.synchronize()
    prev_bits = _C._conv_hopper_ablation(bits)
    _C._conv_hopper_trace(buf.data_ptr())
    try:
        h.op(*inputs, train, cast)
        torch.cuda.synchronize()
    finally:
        _C._conv_hopper_trace(0)
        _C._conv_hopper_ablation(prev_bits)
    return buf.cpu()


def mean_at(t, slot, ghz):
    """Mean over the blocks that wrote the slot of its time from the block's start, in us; None if none did."""
    col, start = t[:, slot], t[:, 0]
    ok = (col >= 0) & (start >= 0)
    if not ok.any():
        return None
    return ((col[ok] - start[ok]).double().mean() / (ghz * 1e3)).item()


def fmt(v):
    return "" if v is None else f"{v:.2f}"


def report(t, ghz, title):
    print(f"\n### {title} (blocks traced: {int((t[:, 0] >= 0).sum())})\n")
    print(f"weights staged at {fmt(mean_at(t, 1, ghz))} us; consumers done at {fmt(mean_at(t, 2, ghz))} / "
          f"{fmt(mean_at(t, 3, ghz))}; producer done at {fmt(mean_at(t, 4, ghz))}\n")
    head = ["unit", "P waits", "P stages", "P staged", "C waits", "C has it"]
    for mt in range(M_TILES):
        head += [f"mma{mt}", f"epi{mt}"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---:|" * len(head))
    sums = {"stage": [], "p_wait": [], "c_wait": [], "mma": [], "epi": []}
    for k in range(UNITS):
        row = [mean_at(t, PRODUCER + 3 * k + e, ghz) for e in range(3)]
        row += [mean_at(t, CONSUMER + 12 * k + e, ghz) for e in range(2 + 2 * M_TILES)]
        if all(v is None for v in row):
            continue
        print(f"| {k} | " + " | ".join(fmt(v) for v in row) + " |")
        if None not in row:
            sums["p_wait"].append(row[1] - row[0])
            sums["stage"].append(row[2] - row[1])
            sums["c_wait"].append(row[4] - row[3])
            prev = row[4]
            for mt in range(M_TILES):
                sums["mma"].append(row[5 + 2 * mt] - prev)
                sums["epi"].append(row[6 + 2 * mt] - row[5 + 2 * mt])
                prev = row[6 + 2 * mt]
    print()
    for k, v in sums.items():
        if v:
            print(f"mean {k}: {sum(v) / len(v):.2f} us (x{len(v)})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--precisions", default="tf32,bf16")
    ap.add_argument("--train", action="store_true")
    ap.add_argument("--bits", type=int, default=0)
    ap.add_argument("--ghz", type=float, default=1.98)
    args = ap.parse_args()
    _C._conv_forward_kernel(2)
    blocks = torch.cuda.get_device_properties(0).multi_processor_count
    for precision in args.precisions.split(","):
        for train in ([False, True] if args.train else [False]):
            t = traced_call(precision, train, args.bits, blocks)
            report(t, args.ghz, f"{precision} {'training' if train else 'inference'} bits={args.bits}")


if __name__ == "__main__":
    main()
