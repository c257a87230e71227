"""Launch choices of the CUDA backward, swept: packs per thread of the channels_last kernel (--items), dependent
launches (--pdl) and the single-launch sum of the per-channel partials where two passes would run otherwise
(--fold). The shipped ops use fixed choices (BackwardTuning in csrc/post_pool/launchers.h: 8 packs for float32 and
2 for 16-bit types, dependent launches on, the single-launch sum on); this times the private op
fused._post_pool_backward_tuned, which takes any of them.

    python benchmarks/post_pool/backward_sweep.py [--items 0,1,2,4,8] [--pdl 0,1] [--fold 0,1] [--shape 16,32,32,64,64]

(items 0: the shipped choice for the dtype.) For each combination it times the backward (block timer, median) for
float32 and bfloat16, channels_last_3d and contiguous (the contiguous kernel ignores the packs: it is the same-run
control), measures the copy bandwidth, and splits one call into its kernels with torch.profiler. The floor is the bench's: grad_output, selected and a one-byte offset
read at pooled size, the full-resolution grad_input written. A table comes last.

"device us" is the same timer with the host hidden (median_us(hide_host=True): a sleep kernel queued before each
block lets the host enqueue it whole), i.e. the device's own time per call; "median us" includes the host where
it is the slower side. Under dependent launches the profiler's time of a dependent kernel includes its blocks'
wait for the kernel before it (they are resident early), so "kernels (profiler)" overstates the sum kernels.
Two more columns say where a call's time goes beyond its kernels:
- "host us": the host's cost of one call, timed while the device is held busy by a sleep kernel (so no call waits
  for the device). Where it exceeds the kernels, back-to-back calls are host-bound.
- "span us": a profiled block of 20 back-to-back calls, first kernel start to last kernel end, per call. Span minus
  the kernels' own time is the device's idle time between kernels (launch gaps, or the host falling behind).
  Under dependent launches (--pdl 1) the profiler stretches it (~200 us per call measured): there it
  is not a measure.
A write-only fill of grad_input's size gives the device's write bandwidth (the backward is 80% writes).
"""
from __future__ import annotations

import argparse
import itertools

import torch

SLOPE = 0.2


def bandwidths(shape):
    """(copy, write-only fill) bandwidth of the device, bytes/s."""
    from torch_fused_ops.tools.timing import copy_bandwidth, median_us

    dev = torch.device("cuda")
    big = torch.empty(shape, device=dev)
    fill_us = median_us(lambda: big.fill_(1.0), dev, reps=30)
    return copy_bandwidth(dev), big.numel() * 4 / (fill_us * 1e-6)


def measure(shape, items, pdl, fold, bw):
    """One combination of launch choices: a row per dtype and layout."""
    import torch_fused_ops  # noqa: F401
    from torch_fused_ops.tools.timing import host_us, median_us
    from torch_fused_ops.tools.bench import floor_bytes

    dev = torch.device("cuda")
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
                return torch.ops.fused._post_pool_backward_tuned(g, sel, off, None, m, SLOPE, None, list(shape),
                                                                 [2, 2, 2], [2, 2, 2], [0, 0, 0], [1, 1, 1], cl,
                                                                 items, pdl, fold)
            us = median_us(call, dev, reps=30)
            dev_us = median_us(call, dev, reps=30, hide_host=True)
            es = x.element_size()
            floor = floor_bytes("backward", x.numel(), sel.numel(), es) / bw * 1e6
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
            rows.append(dict(dtype=str(dtype)[6:], layout=layout, us=us, dev_us=dev_us, floor=floor, kernels=kernels,
                             host=host_us(call, dev), span=span_us(call)))
    return rows


def span_us(call, n=20):
    """Device span per call of n back-to-back calls: first kernel start to last kernel end, over n."""
    call()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            call()
        torch.cuda.synchronize()
    ks = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    if not ks:
        return float("nan")
    return (max(e.time_range.end for e in ks) - min(e.time_range.start for e in ks)) / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", default="0,1,2,4,8", help="packs per thread (0: the shipped choice for the dtype)")
    ap.add_argument("--pdl", default="1", help="dependent launches (1) or plain ones (0)")
    ap.add_argument("--fold", default="1", help="single-launch sum (1) or two passes (0)")
    ap.add_argument("--shape", default="16,32,32,64,64")
    a = ap.parse_args()
    shape = [int(v) for v in a.shape.split(",")]
    bw, fill_bw = bandwidths(shape)
    table = []
    for items, pdl, fold in itertools.product(a.items.split(","), a.pdl.split(","), a.fold.split(",")):
        for row in measure(shape, int(items), pdl == "1", fold == "1", bw):
            ks = "; ".join(f"{k} {v:.1f}" for k, v in sorted(row["kernels"].items(), key=lambda kv: -kv[1]))
            table.append(f"| {items} | {pdl} | {fold} | {row['dtype']} | {row['layout']} | {row['us']:.1f} | "
                         f"{row['floor']:.1f} | {row['floor'] / row['us']:.0%} | {row['dev_us']:.1f} | "
                         f"{row['floor'] / row['dev_us']:.0%} | "
                         f"{sum(row['kernels'].values()):.1f} | {row['span']:.1f} | {row['host']:.1f} | "
                         f"{bw / 1e9:.0f} | {fill_bw / 1e9:.0f} | {ks} |")
            print(table[-1], flush=True)
    print(f"\nfused._post_pool_backward_tuned, shape {shape}, {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| items | pdl | fold | dtype | layout | median us | floor us | % of floor | device us | % of floor "
          "| kernels us | span us | host us | copy GB/s | fill GB/s | kernels (profiler, us) |")
    print("| ---: | ---: | ---: | --- | --- " + "| ---: " * 10 + "| --- |")
    print("\n".join(table))


if __name__ == "__main__":
    main()
