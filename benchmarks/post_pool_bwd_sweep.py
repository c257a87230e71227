"""Packs per thread of the channels_last backward kernel (TORCH_FUSED_OPS_CL_BWD_ITEMS), swept on CUDA.

    python benchmarks/post_pool_bwd_sweep.py [--items 1,2,4,8] [--shape 16,32,32,64,64]

The setting is read once per process, so each value runs in its own child process. Each child times
fused.post_pool_backward (block timer, median) for float32 and bfloat16, channels_last_3d and contiguous (the
contiguous kernel ignores the setting: it is the same-run control), measures the copy bandwidth, and splits one
call into its kernels with torch.profiler. The floor is the bench's: grad_output, selected and a one-byte offset
read at pooled size, the full-resolution grad_input written. A table comes last.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch

SLOPE = 0.2


def child(shape):
    import torch_fused_ops  # noqa: F401
    from torch_fused_ops._timing import copy_bandwidth, median_us

    dev = torch.device("cuda")
    bw = copy_bandwidth(dev)
    N, C, D, H, W = shape
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for fmt, layout in ((torch.channels_last_3d, "channels_last_3d"), (torch.contiguous_format, "contiguous")):
            torch.manual_seed(0)
            x = torch.randn(shape, device=dev, dtype=dtype).contiguous(memory_format=fmt)
            m = torch.randn(C, 1, 1, 1, device=dev, dtype=dtype)
            _, sel, off = torch.ops.fused.post_pool_with_offsets(x, m, SLOPE, [2, 2, 2])
            g = torch.randn_like(sel)  # the output's layout
            cl = fmt == torch.channels_last_3d

            def call():
                return torch.ops.fused.post_pool_backward(g, sel, off, m, SLOPE, None, list(shape), [2, 2, 2],
                                                          [2, 2, 2], [0, 0, 0], [1, 1, 1], cl)
            us = median_us(call, dev, reps=30)
            es = x.element_size()
            floor = (sel.numel() * (2 * es + 1) + x.numel() * es) / bw * 1e6
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                call()
                torch.cuda.synchronize()
            kernels = {}
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA:
                    # "void fused::(anonymous namespace)::post_pool_...<float, int, 1, true>(...)" -> the kernel's name
                    name = e.name.replace("(anonymous namespace)::", "").split("<")[0].split("(")[0]
                    name = name.removeprefix("void ").split("::")[-1][:48]
                    kernels[name] = kernels.get(name, 0.0) + e.device_time
            rows.append(dict(dtype=str(dtype)[6:], layout=layout, us=us, floor=floor, kernels=kernels))
    print("RESULT " + json.dumps(dict(bw=bw, rows=rows)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", default="1,2,4,8")
    ap.add_argument("--shape", default="16,32,32,64,64")
    ap.add_argument("--child", action="store_true")
    a = ap.parse_args()
    shape = [int(v) for v in a.shape.split(",")]
    if a.child:
        child(shape)
        return
    table = []
    for items in a.items.split(","):
        env = dict(os.environ, TORCH_FUSED_OPS_CL_BWD_ITEMS=items)
        r = subprocess.run([sys.executable, __file__, "--child", "--shape", a.shape], env=env, capture_output=True,
                           text=True)
        line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
        if r.returncode != 0 or not line:
            print(f"items={items}: rc={r.returncode}\n{r.stderr[-2000:]}", flush=True)
            continue
        res = json.loads(line[0][7:])
        for row in res["rows"]:
            ks = "; ".join(f"{k} {v:.1f}" for k, v in sorted(row["kernels"].items(), key=lambda kv: -kv[1]))
            table.append(f"| {items} | {row['dtype']} | {row['layout']} | {row['us']:.1f} | {row['floor']:.1f} | "
                         f"{row['floor'] / row['us']:.0%} | {res['bw'] / 1e9:.0f} | {ks} |")
            print(table[-1], flush=True)
    print(f"\nfused.post_pool_backward, shape {shape}, {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| items | dtype | layout | median us | floor us | % of floor | copy GB/s | kernels (profiler, us) |")
    print("| ---: | --- | --- | ---: | ---: | ---: | ---: | --- |")
    print("\n".join(table))


if __name__ == "__main__":
    main()
