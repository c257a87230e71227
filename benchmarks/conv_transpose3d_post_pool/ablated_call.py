"""One precision's sm_90a forward kernel with parts left out (a measurement build: TORCH_FUSED_OPS_HOPPER_ABLATION=1),
for Nsight Compute to wrap, and with --kernels the device kernels one op call launches (the profiler's list: whether
the op runs anything besides the kernel).

    python benchmarks/conv_transpose3d_post_pool/ablated_call.py PRECISION BITS [--kernels]

PRECISION: tf32, bf16, fp16, mixed, autocast (hopper_forward.py's inputs at batch 16); BITS: ablation.h's parts (1
epilogue, 2 wgmma, 4 staging; 7 the skeleton). Three warm-up calls, then the calls to profile.
See ablation_profile.sh beside this file for the Nsight Compute run.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hopper_forward as h  # noqa: E402

from torch_fused_ops import _C  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("precision")
    ap.add_argument("bits", type=int)
    ap.add_argument("--kernels", action="store_true")
    args = ap.parse_args()
    _C._conv_forward_kernel(2)
    _C._conv_hopper_ablation(args.bits)
    inputs = h.case_inputs(16, args.precision)
    cast = h.inputs_cast(args.precision)
    for _ in range(3):
        h.op(*inputs, False, cast)
    torch.cuda.synchronize()
    if not args.kernels:
        h.op(*inputs, False, cast)
        torch.cuda.synchronize()
        return
    calls = 5
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            h.op(*inputs, False, cast)
        torch.cuda.synchronize()
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", 0)
        if us:
            print(f"{args.precision} bits={args.bits} {e.key[:90]}: {e.count / calls:g} per call, "
                  f"{us / e.count:.1f} us each")


if __name__ == "__main__":
    main()
