"""Benchmark fused.post_pool against the eager composite and torch.compile of the composite.

    python -m torch_fused_ops.bench [--device cuda|cpu] [--dtypes float32,bfloat16] [--shape N,C,D,H,W]
                                    [--no-compile] [--out DIR]

Each row: median time (device events on CUDA), the memory floor (bytes that must move / copy bandwidth
measured in the same run) and the fraction of the floor reached. Prints a markdown table; writes JSON.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import torch

import torch_fused_ops
from torch_fused_ops._timing import copy_bandwidth, median_us
from torch_fused_ops.ops import reference_post_pool

SLOPE = 0.2


def _dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
            "float64": torch.float64}[name]


def bench_case(shape, dtype, fmt, device, bw, use_compile, reps):
    torch.manual_seed(0)
    N, C, D, H, W = shape
    x = torch.randn(shape, device=device, dtype=dtype).contiguous(memory_format=fmt)
    m = torch.randn(C, 1, 1, 1, device=device, dtype=dtype)
    es = x.element_size()
    out_numel = N * C * (D // 2) * (H // 2) * (W // 2)
    fwd_bytes = x.numel() * es + out_numel * es
    # Training: forward also writes selected value + 1-byte offset; backward reads grad, selected, offsets and
    # writes the full-resolution grad_input.
    train_fwd_bytes = x.numel() * es + out_numel * (2 * es + 1)
    bwd_bytes = out_numel * (2 * es + 1) + x.numel() * es
    rows = []

    def row(what, impl, us, nbytes):
        floor = nbytes / bw * 1e6
        rows.append(dict(what=what, impl=impl, dtype=str(dtype).replace("torch.", ""),
                         layout="channels_last_3d" if fmt == torch.channels_last_3d else "contiguous",
                         shape=list(shape), us=us, floor_us=floor, frac_of_floor=floor / us))
        print(f"  {what:9s} {impl:14s} {rows[-1]['dtype']:9s} {rows[-1]['layout']:17s} {us:10.1f} us"
              f"  floor {floor:8.1f} us  ({floor / us:5.1%})", file=sys.stderr, flush=True)

    with torch.no_grad():
        row("forward", "eager", median_us(lambda: reference_post_pool(x, m, SLOPE, 2), device, reps=reps), fwd_bytes)
        if use_compile:
            # torch.compile of the composite *without* our pass (with it, the composite would become our op).
            torch._dynamo.reset()
            with torch_fused_ops.fusion_enabled(False):
                comp = torch.compile(reference_post_pool)
                row("forward", "torch.compile", median_us(lambda: comp(x, m, SLOPE, 2), device, reps=reps),
                    fwd_bytes)
        row("forward", "fused", median_us(lambda: torch_fused_ops.post_pool(x, m, SLOPE, 2), device, reps=reps),
            fwd_bytes)

    # Training step of the op alone: forward that keeps what backward needs, then backward.
    xg = x.detach().requires_grad_()
    mg = m.detach().requires_grad_()
    g = torch.randn(N, C, D // 2, H // 2, W // 2, device=device, dtype=dtype)

    def train(fn):
        def step():
            out = fn(xg, mg, SLOPE, 2)
            torch.autograd.grad(out, (xg, mg), g)
        return step

    row("fwd+bwd", "eager", median_us(train(reference_post_pool), device, reps=reps),
        train_fwd_bytes + bwd_bytes)
    if use_compile:
        torch._dynamo.reset()
        with torch_fused_ops.fusion_enabled(False):
            comp_t = torch.compile(reference_post_pool)
            row("fwd+bwd", "torch.compile", median_us(train(comp_t), device, reps=reps),
                train_fwd_bytes + bwd_bytes)
    row("fwd+bwd", "fused", median_us(train(torch_fused_ops.post_pool), device, reps=reps),
        train_fwd_bytes + bwd_bytes)
    return rows


def bench_model(device, reps, use_compile=True):
    """The whole KernelBench Model: eager, torch.compile without the pass, with it; forward and training step."""
    from torch_fused_ops.models import DEFAULT_BATCH, DEFAULT_INPUT, ConvTransposeLeakyMulLeakyPool

    batch = DEFAULT_BATCH if device.type == "cuda" else 1
    torch.manual_seed(0)
    model = ConvTransposeLeakyMulLeakyPool().to(device)
    x = torch.randn(batch, 16, *DEFAULT_INPUT, device=device)
    xg = x.clone().requires_grad_()
    rows = []
    variants = [("eager", None)]
    if use_compile:
        variants += [("torch.compile, pass off", False), ("torch.compile, pass on", True)]
    for name, use_pass in variants:
        torch._dynamo.reset()
        before = torch_fused_ops.matched_count()
        with torch_fused_ops.fusion_enabled(bool(use_pass)):
            fn = model if use_pass is None else torch.compile(model)
            with torch.no_grad():
                fwd = median_us(lambda: fn(x), device, reps=reps)

            def step():
                fn(xg).sum().backward()

            step()
            if device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                step()
                torch.cuda.synchronize()
                peak = (torch.cuda.max_memory_allocated() - base) / 2**20
            else:
                peak = float("nan")
            train = median_us(step, device, reps=max(3, reps // 3))
        matched = torch_fused_ops.matched_count() - before
        rows.append(dict(what="Model", impl=name, shape=list(x.shape), forward_us=fwd, train_step_us=train,
                         train_peak_MiB=peak, matched=matched))
        print(f"  Model {name:24s} forward {fwd:9.1f} us  train step {train:9.1f} us  peak {peak:8.1f} MiB  "
              f"matched {matched}", file=sys.stderr, flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--layouts", default="contiguous,channels_last_3d")
    ap.add_argument("--shape", default=None, help="default 16,32,32,64,64 on GPU, 2,32,32,64,64 on CPU")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--out", default="results")
    ap.add_argument("--no-model", action="store_true", help="skip the whole-Model rows")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    shape = tuple(int(v) for v in (args.shape or ("16,32,32,64,64" if device.type == "cuda" else "2,32,32,64,64")).split(","))
    reps = args.reps or (50 if device.type == "cuda" else 5)
    bw = copy_bandwidth(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"# device {name}, torch {torch.__version__}, copy bandwidth {bw / 1e9:.0f} GB/s (read+write)",
          file=sys.stderr)
    rows = []
    for dt in args.dtypes.split(","):
        for lay in args.layouts.split(","):
            fmt = torch.channels_last_3d if lay == "channels_last_3d" else torch.contiguous_format
            rows += bench_case(shape, _dtype(dt), fmt, device, bw, not args.no_compile, reps)
    model_rows = [] if args.no_model else bench_model(device, reps, not args.no_compile)
    meta = dict(device=name, torch=torch.__version__, date=datetime.date.today().isoformat(),
                copy_bandwidth_GBps=bw / 1e9, command="python -m torch_fused_ops.bench " + " ".join(argv or sys.argv[1:]))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"bench_{device.type}.json")
    with open(path, "w") as f:
        json.dump(dict(meta=meta, rows=rows, model_rows=model_rows), f, indent=1)
    print(f"\n{meta['device']}, torch {meta['torch']}, {meta['date']}, copy {meta['copy_bandwidth_GBps']:.0f} GB/s, "
          f"shape {list(shape)}\n")
    print("| pass | impl | dtype | layout | median us | floor us | % of floor |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['what']} | {r['impl']} | {r['dtype']} | {r['layout']} | {r['us']:.1f} | {r['floor_us']:.1f} | "
              f"{r['frac_of_floor']:.0%} |")
    if model_rows:
        print(f"\nWhole Model, input {model_rows[0]['shape']}, float32 (training step = forward + backward of .sum())\n")
        print("| Model | forward us | train step us | train peak MiB | chains fused |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for r in model_rows:
            print(f"| {r['impl']} | {r['forward_us']:.1f} | {r['train_step_us']:.1f} | {r['train_peak_MiB']:.0f} | "
                  f"{r['matched']} |")
    print(f"\n(JSON: {path})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
