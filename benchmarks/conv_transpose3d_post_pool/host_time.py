"""Host time per eager call of torch_fused_ops.conv_transpose3d_post_pool on CUDA.

Each figure is the host's time for one call while a sleep kernel holds the device busy, so no call waits for the
device (torch_fused_ops.tools.timing.host_us): what the Python wrapper, the dispatcher, the C++ checks, the
allocations and the launch cost the host, whatever the kernel costs. Rows: KernelBench size (input
[N, 16, 16, 32, 32], weight [16, 32, 3, 3, 3]) at batch 16 and 1, float32 and bfloat16, inference and
(separately) with gradients enabled; "wrapper" goes through the wrapper's C entry point, "raw op" through
torch.ops; the wrapper with Python's garbage collector paused; eager's own conv_transpose3d and one torch.relu
for scale.

    python benchmarks/conv_transpose3d_post_pool/host_time.py [--reps 7] [--calls 200] [--json out.json]
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics

import torch
import torch.nn.functional as F

import torch_fused_ops
from torch_fused_ops.tools.timing import host_us


def _inputs(batch, dtype, requires_grad=False):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(batch, 16, 16, 32, 32, device="cuda", dtype=dtype, generator=g)
    w = torch.randn(16, 32, 3, 3, 3, device="cuda", dtype=dtype, generator=g) * 0.1
    b = torch.randn(32, device="cuda", dtype=dtype, generator=g)
    m = torch.randn(32, 1, 1, 1, device="cuda", dtype=dtype, generator=g)
    for t in (w, b, m):
        t.requires_grad_(requires_grad)
    return x, w, b, m


def rows(reps, calls):
    dev = torch.device("cuda")
    out = []
    for batch in (16, 1):
        for dtype in (torch.float32, torch.bfloat16):
            x, w, b, m = _inputs(batch, dtype)
            small = torch.randn(32, device="cuda", dtype=dtype)
            raw_args = (x, w, b, [2, 2, 2], [1, 1, 1], [1, 1, 1], 1, [1, 1, 1], m, 0.2, [2, 2, 2], [], [0, 0, 0],
                        [1, 1, 1], False, None)
            cases = {
                "wrapper": lambda: torch_fused_ops.conv_transpose3d_post_pool(x, w, b, m, 0.2, 2, 1, 1),
                "raw op": lambda: torch.ops.fused.conv_transpose3d_post_pool.default(*raw_args),
                "eager conv_transpose3d alone": lambda: F.conv_transpose3d(x, w, b, 2, 1, 1),
                # One small aten op: the host's speed at the dispatcher, one allocation and one launch, for scale
                # (this host's speed differs between device calls more than anything the op changes).
                "torch.relu of 32 elements": lambda: torch.relu(small),
            }
            xg, wg, bg, mg = _inputs(batch, dtype, requires_grad=True)
            cases["wrapper, training forward"] = lambda: torch_fused_ops.conv_transpose3d_post_pool(
                xg, wg, bg, mg, 0.2, 2, 1, 1)
            # The wrapper again with Python's cyclic garbage collector paused: a gap between this row and
            # "wrapper" is collection work triggered by the objects each call allocates, not the op's own cost.
            cases["wrapper, gc paused"] = cases["wrapper"]
            for name, fn in cases.items():
                with torch.no_grad() if "training" not in name else torch.enable_grad():
                    for _ in range(10):
                        fn()
                    gc_was_enabled = gc.isenabled()
                    if "gc paused" in name:
                        gc.collect()
                        gc.disable()
                    try:
                        # Each sample: `calls` back-to-back calls behind one sleep long enough to cover them all.
                        samples = [host_us(fn, dev, n=calls, busy_ms=max(20.0, calls * 0.2)) for _ in range(reps)]
                    finally:
                        if gc_was_enabled:
                            gc.enable()
                torch.cuda.synchronize()
                out.append(dict(batch=batch, dtype=str(dtype).replace("torch.", ""), case=name,
                                host_us_median=statistics.median(samples), host_us_min=min(samples)))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--json")
    a = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    res = rows(a.reps, a.calls)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print("| batch | dtype | call | host us / call (median) | min |")
    print("| ---: | --- | --- | ---: | ---: |")
    for r in res:
        print(f"| {r['batch']} | {r['dtype']} | {r['case']} | {r['host_us_median']:.1f} | {r['host_us_min']:.1f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
