"""Benchmark fused.conv_transpose3d_post_pool against eager PyTorch, torch.compile of the chain (pass off) and cuDNN's
transposed convolution alone.

    python -m torch_fused_ops.tools.bench_conv [--device cuda|cpu] [--batches 16,1] [--precisions tf32,bf16,...]
        [--reps N] [--out DIR]

Precisions: tf32, bf16, fp16, strict (float32, TF32 off), tf32-train (the training forward). Per row: device,
call and host time per call, memory and math floors, relative L2 error against float64 beside cuDNN's (columns:
docs/performance.md#how-to-read-the-figures).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import torch
import torch.nn.functional as F

import torch_fused_ops
from torch_fused_ops.tools.timing import copy_bandwidth, host_us, median_us

SLOPE = 0.2
CIN, COUT = 16, 32
SPATIAL = (16, 32, 32)
# Dense tensor-core peaks of an H100/H200 SXM (NVIDIA's datasheet, without sparsity), in FLOP/s. Strict float32
# runs three TF32 products per multiply-add on the fused path; its floor is given at the TF32 peak over three.
PEAK_FLOPS = {"tf32": 494.7e12, "tf32-train": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12, "strict": 494.7e12 / 3}
PRECISIONS = {  # dtype, allow_tf32, with_offsets
    "tf32": (torch.float32, True, False),
    "bf16": (torch.bfloat16, True, False),
    "fp16": (torch.float16, True, False),
    "strict": (torch.float32, False, False),
    "tf32-train": (torch.float32, True, True),
}


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def composite(x, w, b, m):
    """The KernelBench chain as eager PyTorch writes it."""
    y = F.conv_transpose3d(x, w, b, stride=2, padding=1, output_padding=1)
    return F.max_pool3d(F.leaky_relu(F.leaky_relu(y, SLOPE) * m, SLOPE), 2)


def fused(x, w, b, m):
    return torch_fused_ops.conv_transpose3d_post_pool(x, w, b, m, SLOPE, stride=2, padding=1, output_padding=1)


def fused_with_offsets(x, w, b, m):
    return torch.ops.fused.conv_transpose3d_post_pool_with_offsets(
        x, w, b, [2, 2, 2], [1, 1, 1], [1, 1, 1], 1, [1, 1, 1], m, SLOPE, [2, 2, 2])


def conv_alone(x, w, b, m):
    return F.conv_transpose3d(x, w, b, stride=2, padding=1, output_padding=1)


def rel_l2(out, ref) -> float:
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-300))


def bench_precision(device, batch, precision, bw, reps, use_compile):
    dtype, tf32, with_offsets = PRECISIONS[precision]
    torch.manual_seed(0)
    x = torch.randn(batch, CIN, *SPATIAL, device=device, dtype=dtype)
    w = (torch.randn(CIN, COUT, 3, 3, 3, device=device) * 0.1).to(dtype)
    b = torch.randn(COUT, device=device, dtype=dtype)
    m = torch.randn(COUT, 1, 1, 1, device=device, dtype=dtype)
    es = x.element_size()
    pooled = batch * COUT * SPATIAL[0] * SPATIAL[1] * SPATIAL[2]
    full = pooled * 8
    out_bytes = pooled * es * (2 if with_offsets else 1) + (pooled if with_offsets else 0)
    floor_mem_us = (x.numel() + w.numel() + b.numel()) * es / bw * 1e6 + out_bytes / bw * 1e6
    flops = 2.0 * pooled * CIN * 27  # every output channel of every pooled window: 27 real taps per input channel
    floor_math_us = flops / PEAK_FLOPS[precision] * 1e6 if device.type == "cuda" else float("nan")
    with torch.no_grad():
        ref = composite(x.double(), w.double(), b.double(), m.double())
    impls = [("eager", composite), ("cuDNN conv alone", conv_alone)]
    if use_compile:
        torch._dynamo.reset()
        impls.append(("torch.compile", torch.compile(composite)))
    impls.append(("fused", fused_with_offsets if with_offsets else fused))
    rows = []
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=tf32), torch.no_grad(), \
            torch_fused_ops.fusion_enabled(False):
        for name, fn in impls:
            call = lambda fn=fn: fn(x, w, b, m)  # noqa: E731
            res = call()
            out = res[0] if isinstance(res, tuple) else res
            err = rel_l2(out, ref) if name != "cuDNN conv alone" else float("nan")
            cuda = device.type == "cuda"
            us = median_us(call, device, reps=reps, hide_host=cuda)
            call_us = median_us(call, device, reps=max(5, reps // 2)) if cuda else us
            h_us = host_us(call, device, n=20) if cuda else float("nan")
            # The floor of the conv alone is its own traffic: the full-resolution output written.
            mem_us = ((x.numel() + w.numel()) * es + full * es) / bw * 1e6 if name == "cuDNN conv alone" \
                else floor_mem_us
            rows.append(dict(what="conv_transpose3d_post_pool", precision=precision, impl=name, batch=batch,
                             shape=list(x.shape), us=us, call_us=call_us, host_us=h_us, floor_mem_us=mem_us,
                             floor_math_us=floor_math_us, rel_l2=err))
            _log(f"  {precision:10s} b{batch:<3d} {name:17s} {us:9.1f} us  call {call_us:9.1f}  host {h_us:7.1f}  "
                 f"mem floor {mem_us:6.1f}  math floor {floor_math_us:6.1f}  rel L2 {err:.2e}")
    # cuDNN's own error on this precision, for the accuracy targets (the conv alone, then our epilogue in float64).
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=tf32), torch.no_grad():
        y = conv_alone(x, w, b, m).double()
        cudnn_ref = F.max_pool3d(F.leaky_relu(F.leaky_relu(y, SLOPE) * m.double(), SLOPE), 2)
    for r in rows:
        r["cudnn_rel_l2"] = rel_l2(cudnn_ref, ref)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batches", default=None, help="comma-separated batch sizes (default: 16,1 on CUDA, 1 on CPU)")
    ap.add_argument("--precisions", default=None, help=f"comma-separated: {', '.join(PRECISIONS)}")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--out", default="results")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    batches = [int(v) for v in (args.batches or ("16,1" if cuda else "1")).split(",")]
    precisions = (args.precisions or (",".join(PRECISIONS) if cuda else "strict")).split(",")
    unknown = [p for p in precisions if p not in PRECISIONS]
    if unknown:
        ap.error(f"unknown --precisions {unknown}; choose from {list(PRECISIONS)}")
    reps = args.reps or (30 if cuda else 3)
    bw = copy_bandwidth(device)
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    _log(f"# device {name}, torch {torch.__version__}, copy bandwidth {bw / 1e9:.0f} GB/s (read+write)")
    rows = []
    for batch in batches:
        for p in precisions:
            if batch != 16 and p not in ("tf32",) and cuda:
                continue  # batch 1 is a launch-latency row: one precision shows it
            rows += bench_precision(device, batch, p, bw, reps, not args.no_compile)
    meta = dict(device=name, torch=torch.__version__, date=datetime.date.today().isoformat(),
                copy_bandwidth_GBps=bw / 1e9,
                command="python -m torch_fused_ops.tools.bench_conv " + " ".join(sys.argv[1:] if argv is None else argv))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"bench_conv_{device.type}.json")
    with open(path, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    print(f"\n{meta['device']}, torch {meta['torch']}, {meta['date']}, copy {meta['copy_bandwidth_GBps']:.0f} GB/s\n")
    print("| precision | batch | impl | median us | call us | host us | memory floor us | math floor us | "
          "rel L2 vs fp64 | cuDNN's rel L2 |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['precision']} | {r['batch']} | {r['impl']} | {r['us']:.1f} | {r['call_us']:.1f} | "
              f"{r['host_us']:.1f} | {r['floor_mem_us']:.1f} | {r['floor_math_us']:.1f} | {r['rel_l2']:.2e} | "
              f"{r['cudnn_rel_l2']:.2e} |")
    print(f"\n(JSON: {path})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
