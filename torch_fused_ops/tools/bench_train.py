"""Benchmark a training step of the unmodified KernelBench Model: eager, torch.compile without our pass, with it.

    python -m torch_fused_ops.tools.bench_train [--device cuda|cpu]
        [--configs tf32,tf32-xgrad,bf16,strict,autocast-bf16,autocast-fp16]
        [--variants eager,pass-off,pass-on] [--small] [--batch N] [--input D,H,W] [--reps N] [--out DIR]
    python -m torch_fused_ops.tools.bench_train --ncu-step tf32   (one pass-on step for ncu --profile-from-start off)

A step: grads set to None, the forward, backward of a fixed gradient of the output (no loss, no optimizer). Per
row: device, host and loop time per step, kernel time, peak and largest allocation, memory and math floors (what
each column means: docs/performance.md#how-to-read-the-figures). Tables to stdout and DIR/bench_train.md, rows
merged into DIR/bench_train.json.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import statistics
import sys

import torch

import torch_fused_ops
from torch_fused_ops.tools.timing import copy_bandwidth, host_us, median_us
from torch_fused_ops.tools.bench_conv import PEAK_FLOPS
from torch_fused_ops.models import DEFAULT_BATCH, DEFAULT_INPUT, ConvTransposeLeakyMulLeakyPool

CONFIGS = {  # name: (label, dtype, allow_tf32, x requires grad, PEAK_FLOPS key)
    "tf32": ("TF32, x without grad", torch.float32, True, False, "tf32"),
    "tf32-xgrad": ("TF32, x requiring grad", torch.float32, True, True, "tf32"),
    "bf16": ("bfloat16, x without grad", torch.bfloat16, True, False, "bf16"),
    "strict": ("strict float32 (TF32 off), x without grad", torch.float32, False, False, "strict"),
    "autocast-bf16": ("autocast bfloat16 (float32 model), x without grad", torch.float32, True, False, "bf16"),
    "autocast-fp16": ("autocast float16 (float32 model), x without grad", torch.float32, True, False, "bf16"),
}
# Configurations whose forward runs inside torch.autocast with this dtype (the float32 model, as users run mixed
# precision); the backward runs outside it, as autocast's documentation prescribes.
AUTOCAST = {"autocast-bf16": torch.bfloat16, "autocast-fp16": torch.float16}
VARIANTS = {  # name: (label, pass on; None: eager)
    "eager": ("eager", None),
    "pass-off": ("torch.compile, pass off", False),
    "pass-on": ("torch.compile, pass on", True),
}
SMALL_BATCH, SMALL_INPUT = 1, (4, 8, 8)
# The targets for the pass-on step on an H200 at the KernelBench size: device µs per step, and the TF32
# step's peak memory in MiB.
TARGET_US = {"tf32": 250.0, "tf32-xgrad": 300.0, "bf16": 150.0, "strict": 600.0, "autocast-bf16": 260.0}
TARGET_PEAK_MIB = {"tf32": 300.0, "autocast-bf16": 120.0}
KERNEL_NAME_CHARS = 60


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def floor_bytes(x_numel: int, w_numel: int, pooled_numel: int, es: int, x_grad: bool) -> int:
    """Bytes a training step must move on the fused path as csrc/conv_transpose3d_post_pool/backward_contract.h lays it out (three
    kernels after the forward, grad_conv written once at pooled size; nothing at full resolution), each tensor
    read once by every kernel that needs it (a tensor that stays in L2 between two kernels, as x can, would move
    less: this counts memory traffic as if none did):
      forward         read x and w; write out and the saved selected value (es bytes each) and window offset
                      (1 byte) per pooled output:                              x + w + P (2 es + 1)
      grad_conv       read g, selected, offsets; write grad_conv at pooled size: P (2 es + 1) + P es
      grad_weight     read x, grad_conv, offsets; write grad_weight:           x + P (es + 1) + w
      grad_input      (x requiring grad) read grad_conv, offsets, w; write it: P (es + 1) + w + x
    with x, w the input's and weight's bytes and P the pooled outputs' count; bias and multiplier are negligible.
    """
    x, w, p = x_numel * es, w_numel * es, pooled_numel
    total = (x + w + p * (2 * es + 1)) + (p * (2 * es + 1) + p * es) + (x + p * (es + 1) + w)
    if x_grad:
        total += p * (es + 1) + w + x
    return total


def step_flops(pooled_numel: int, cin: int, x_grad: bool) -> float:
    """Each product (forward, grad_weight, and grad_input when x requires grad) is 27 real taps per input channel
    for every pooled output and output channel: 7.25 GFLOP at the KernelBench size."""
    return (3 if x_grad else 2) * 2.0 * pooled_numel * cin * 27


def _fresh_compile():
    """Inductor's and AOTAutograd's caches off, so that every compiled variant runs the pass (a cache hit skips
    it and counts no match)."""
    stack = contextlib.ExitStack()
    stack.enter_context(torch._inductor.config.patch(fx_graph_cache=False))
    if hasattr(torch._functorch.config, "enable_autograd_cache"):
        stack.enter_context(torch._functorch.config.patch(enable_autograd_cache=False))
    return stack


def make_step(config: str, variant: str, device: torch.device, batch: int, spatial):
    """(step, fwd_bwd, zero_grad, info) for one row: the model, its inputs and (for compiled variants) the
    compiled module, built here; the first call compiles."""
    _, dtype, _, x_grad, _ = CONFIGS[config]
    use_pass = VARIANTS[variant][1]
    torch.manual_seed(0)
    model = ConvTransposeLeakyMulLeakyPool().to(device=device, dtype=dtype)
    x = torch.randn(batch, model.conv_transpose.in_channels, *spatial, device=device, dtype=dtype)
    x.requires_grad_(x_grad)
    compiled = model if use_pass is None else torch.compile(model)
    amp = AUTOCAST.get(config)

    def fn(t):
        if amp is None:
            return compiled(t)
        with torch.autocast(device.type, dtype=amp):
            return compiled(t)

    with torch.no_grad(), torch.autocast(device.type, dtype=amp or torch.bfloat16, enabled=amp is not None):
        pooled = model(x)  # under autocast, the promoted dtype
    g = torch.randn(pooled.shape, device=device, dtype=pooled.dtype)
    params = list(model.parameters())

    def zero_grad():
        for p in params:
            p.grad = None
        if x_grad:
            x.grad = None

    def fwd_bwd():
        fn(x).backward(g)

    def step():
        zero_grad()
        fwd_bwd()

    info = dict(x_numel=x.numel(), w_numel=model.conv_transpose.weight.numel(), pooled_numel=g.numel(),
                es=x.element_size(), cin=x.shape[1], x_grad=x_grad, use_pass=use_pass)
    return step, fwd_bwd, zero_grad, info


def kernels_of(step, device: torch.device, steps: int = 3) -> list[dict]:
    """The CUDA kernels (and memsets/copies) of one step from torch.profiler, per name: device µs and launches
    per step, largest first."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize(device)
    per_name: dict[str, list[float]] = {}
    for evt in prof.events():
        if evt.device_type == DeviceType.CUDA:
            per_name.setdefault(evt.name, []).append(evt.time_range.elapsed_us())
    rows = [dict(name=name, us=sum(ts) / steps, calls=len(ts) / steps) for name, ts in per_name.items()]
    return sorted(rows, key=lambda r: -r["us"])


def _host_us_median(step, device: torch.device, samples: int = 5) -> float:
    est = host_us(step, device, n=2, busy_ms=200.0)
    # Enough steps per sample to average the timer out, under half of what the sleep kernel covers, and few
    # enough that their launches stay within the driver's queue of pending work (past it the host would wait).
    n = int(min(8, max(1, 20_000 / max(est, 1.0))))
    busy_ms = max(20.0, 2 * n * est / 1e3)
    return statistics.median(host_us(step, device, n=n, busy_ms=busy_ms) for _ in range(samples))


def bench_row(config: str, variant: str, device: torch.device, batch: int, spatial, bw: float, reps: int,
              kernels: bool) -> dict:
    label, dtype, tf32, x_grad, peak_key = CONFIGS[config]
    cuda = device.type == "cuda"
    torch._dynamo.reset()
    before = torch_fused_ops.matched_count()
    nan = float("nan")
    with torch.backends.cudnn.flags(enabled=torch.backends.cudnn.enabled, allow_tf32=tf32), _fresh_compile(), \
            torch_fused_ops.fusion_enabled(bool(VARIANTS[variant][1])):
        step, fwd_bwd, zero_grad, info = make_step(config, variant, device, batch, spatial)
        step()  # compiles
        matched = torch_fused_ops.matched_count() - before
        device_us = median_us(step, device, warmup=3, reps=reps, hide_host=cuda)
        host = loop = kernel_sum = peak = largest = nan
        kernel_rows = []
        if cuda:
            host = _host_us_median(step, device)
            loop = median_us(step, device, reps=max(5, reps // 2))
            zero_grad()
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
            fwd_bwd()
            torch.cuda.synchronize(device)
            peak = (torch.cuda.max_memory_allocated(device) - base) / 2**20
            from torch_fused_ops.tools.memory_trace import allocations_during

            allocs = allocations_during(step, device)
            largest = int(allocs[0]["size"]) / 2**20 if allocs else 0.0
            kernel_rows = kernels_of(step, device)
            kernel_sum = sum(k["us"] for k in kernel_rows)
    mem_floor = floor_bytes(info["x_numel"], info["w_numel"], info["pooled_numel"], info["es"], x_grad) / bw * 1e6
    math_floor = step_flops(info["pooled_numel"], info["cin"], x_grad) / PEAK_FLOPS[peak_key] * 1e6 if cuda else nan
    row = dict(what="train_step", config=config, config_label=label, impl=VARIANTS[variant][0], variant=variant,
               batch=batch, input=list(spatial), dtype=str(dtype).replace("torch.", ""), allow_tf32=tf32,
               x_requires_grad=x_grad, device_us=device_us, host_us=host, loop_us=loop, kernel_sum_us=kernel_sum,
               peak_MiB=peak, largest_alloc_MiB=largest, floor_mem_us=mem_floor, floor_math_us=math_floor,
               matched=matched, kernels=kernel_rows if kernels else [])
    _log(f"  {config:10s} {row['impl']:24s} device {device_us:9.1f} us  host {host:8.1f}  loop {loop:9.1f}  "
         f"kernels {kernel_sum:9.1f}  peak {peak:7.1f} MiB  largest {largest:7.1f} MiB  floors {mem_floor:6.1f} / "
         f"{math_floor:6.1f} us  matched {matched}")
    return row


def ncu_step(config: str, device: torch.device, batch: int, spatial) -> None:
    """One pass-on step between cudaProfilerStart and cudaProfilerStop (after compiling and warming up), so that
    `ncu --profile-from-start off` profiles exactly the kernels of one step."""
    _, _, tf32, _, _ = CONFIGS[config]
    torch._dynamo.reset()
    with torch.backends.cudnn.flags(enabled=torch.backends.cudnn.enabled, allow_tf32=tf32), _fresh_compile(), \
            torch_fused_ops.fusion_enabled(True):
        step, _, _, _ = make_step(config, "pass-on", device, batch, spatial)
        for _ in range(3):
            step()
        torch.cuda.synchronize(device)
        torch.cuda.profiler.start()
        with torch.cuda.nvtx.range(f"training step {config}"):
            step()
        torch.cuda.synchronize(device)
        torch.cuda.profiler.stop()


def _fmt(v: float, digits: int = 1) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def tables(rows: list[dict], meta: dict) -> str:
    lines = [f"{meta['device']}, torch {meta['torch']}, {meta['date']}, copy {meta['copy_bandwidth_GBps']:.0f} GB/s; "
             f"batch {meta['batch']}, input {meta['input']}; a step = zero_grad(set_to_none) + forward + "
             "backward of a fixed grad_output, no optimizer", ""]
    if meta["device"] != "cpu":
        lines += ["device us: CUDA events, host hidden (median over blocks); host us: the host's time per step "
                  "(device kept busy); loop us: back-to-back steps; kernel us: profiler, sum of kernel durations; "
                  "peak: above resting memory; largest: the largest single allocation of the step.", ""]
    else:
        lines += ["CPU: wall us is the step's wall time (perf_counter median).", ""]
    first = "device us" if meta["device"] != "cpu" else "wall us"
    lines += [f"| config | Model | {first} | host us | loop us | kernel us | peak MiB | largest alloc MiB | "
              "memory floor us | math floor us | × floor | chains fused |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    last = None
    for r in rows:
        cfg = r["config_label"] if r["config"] != last else ""
        last = r["config"]
        # How far the step is from the higher of its two floors (the math floor is CUDA's only).
        floor = max(f for f in (r["floor_mem_us"], r["floor_math_us"]) if f is not None and not math.isnan(f))
        lines.append(f"| {cfg} | {r['impl']} | {_fmt(r['device_us'])} | {_fmt(r['host_us'])} | {_fmt(r['loop_us'])} "
                     f"| {_fmt(r['kernel_sum_us'])} | {_fmt(r['peak_MiB'], 0)} | {_fmt(r['largest_alloc_MiB'], 0)} "
                     f"| {_fmt(r['floor_mem_us'])} | {_fmt(r['floor_math_us'])} | {r['device_us'] / floor:.1f} "
                     f"| {r['matched']} |")
    at_target_size = (meta["device"] != "cpu" and meta["batch"] == DEFAULT_BATCH
                      and tuple(meta["input"]) == DEFAULT_INPUT)
    checks = []
    for r in rows:
        if at_target_size and r["variant"] == "pass-on" and r["config"] in TARGET_US:
            t = TARGET_US[r["config"]]
            checks.append(f"{r['config']} {r['device_us']:.0f} µs (≤ {t:.0f}: "
                          f"{'met' if r['device_us'] <= t else 'not met'})")
            if r["config"] in TARGET_PEAK_MIB:
                t = TARGET_PEAK_MIB[r["config"]]
                checks.append(f"{r['config']} peak {r['peak_MiB']:.0f} MiB (≤ {t:.0f}: "
                              f"{'met' if r['peak_MiB'] <= t else 'not met'})")
    if checks:
        lines += ["", "Targets, pass on: " + "; ".join(checks)]
    for r in rows:
        if not r["kernels"]:
            continue
        lines += ["", f"Kernels of one step, {r['config_label']}, {r['impl']} (profiler; device µs per step; "
                  f"sum {r['kernel_sum_us']:.1f} µs)", "", "| kernel | µs | % of sum | launches |",
                  "| --- | ---: | ---: | ---: |"]
        for k in r["kernels"]:
            name = k["name"] if len(k["name"]) <= KERNEL_NAME_CHARS else k["name"][:KERNEL_NAME_CHARS - 1] + "…"
            share = k["us"] / r["kernel_sum_us"] if r["kernel_sum_us"] else float("nan")
            lines.append(f"| `{name.replace('|', '/')}` | {k['us']:.1f} | {share:.0%} | {k['calls']:g} |")
    return "\n".join(lines) + "\n"


def _jsonable(v):
    """NaN as null, so the file is strict JSON."""
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_jsonable(x) for x in v]
    return v


def merge_json(path: str, meta: dict, rows: list[dict]) -> None:
    """Rows of this run replace those of the same device, config, Model and size already in the file."""
    def key(r):
        return (r.get("device"), r.get("config"), r.get("impl"), r.get("batch"), tuple(r.get("input") or ()))

    old = []
    if os.path.exists(path):
        with open(path) as f:
            old = json.load(f).get("rows", [])
    new = [_jsonable(dict(r, **{k: meta[k] for k in ("device", "torch", "date", "copy_bandwidth_GBps", "command")}))
           for r in rows]
    keys = {key(r) for r in new}
    with open(path, "w") as f:
        json.dump(dict(meta=_jsonable(meta), rows=[r for r in old if key(r) not in keys] + new), f, indent=1)


def _names(arg: str, table: dict, what: str, ap: argparse.ArgumentParser) -> list[str]:
    names = [v for v in arg.split(",") if v]
    unknown = [v for v in names if v not in table]
    if unknown:
        ap.error(f"unknown {what} {unknown}; choose from {list(table)}")
    return names


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--configs", default=",".join(c for c in CONFIGS if c != "autocast-fp16"),
                    help=f"comma-separated: {', '.join(CONFIGS)} (default: all but autocast-fp16)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated: {', '.join(VARIANTS)}")
    ap.add_argument("--small", action="store_true",
                    help=f"batch {SMALL_BATCH}, input {SMALL_INPUT} (a smoke-test size)")
    ap.add_argument("--batch", type=int, default=None, help=f"default {DEFAULT_BATCH} on CUDA, 1 on CPU")
    ap.add_argument("--input", default=None, help=f"D,H,W of x (default {DEFAULT_INPUT})")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--ncu-step", default=None, metavar="CONFIG",
                    help="run one pass-on step of CONFIG for ncu --profile-from-start off, and nothing else")
    ap.add_argument("--out", default="results")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    batch = args.batch or (SMALL_BATCH if args.small else DEFAULT_BATCH if cuda else 1)
    spatial = tuple(int(v) for v in args.input.split(",")) if args.input else \
        SMALL_INPUT if args.small else DEFAULT_INPUT
    if args.ncu_step:
        _names(args.ncu_step, CONFIGS, "--ncu-step", ap)
        if not cuda:
            ap.error("--ncu-step profiles CUDA kernels: it needs --device cuda")
        ncu_step(args.ncu_step, device, batch, spatial)
        return 0
    configs = _names(args.configs, CONFIGS, "--configs", ap)
    variants = _names(args.variants, VARIANTS, "--variants", ap)
    reps = args.reps or (30 if cuda else 5)
    bw = copy_bandwidth(device)
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    _log(f"# device {name}, torch {torch.__version__}, copy bandwidth {bw / 1e9:.0f} GB/s (read+write); "
         f"batch {batch}, input {list(spatial)}")
    rows = [bench_row(c, v, device, batch, spatial, bw, reps, kernels=(v == "pass-on"))
            for c in configs for v in variants]
    meta = dict(device=name, torch=torch.__version__, date=datetime.date.today().isoformat(),
                copy_bandwidth_GBps=bw / 1e9, batch=batch, input=list(spatial),
                command="python -m torch_fused_ops.tools.bench_train " + " ".join(sys.argv[1:] if argv is None else argv))
    text = tables(rows, meta)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_train.md"), "w") as f:
        f.write(text)
    path = os.path.join(args.out, "bench_train.json")
    merge_json(path, meta, rows)
    print("\n" + text)
    print(f"(markdown: {os.path.join(args.out, 'bench_train.md')}; JSON: {path})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
