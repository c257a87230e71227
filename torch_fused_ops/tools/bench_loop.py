"""Benchmark the loops a user writes around the unmodified KernelBench Model: training steps with a loss and AdamW,
and inference calls, by each recipe of torch_fused_ops.tools.recipes, with our pass off and on.

    python -m torch_fused_ops.tools.bench_loop [--device cuda|cpu] [--configs tf32,bf16] [--recipes ...]
        [--inference-recipes ...] [--inference-batches 1,16] [--small] [--batch N] [--steps N] [--out DIR]

Per row: wall µs per step over back-to-back steps with one synchronisation at the end (what the user sees), the
device's own µs per step (the host hidden), the host's µs per step (device kept busy), peak memory above resting,
and what compiled during the timed steps (recompilations, graph breaks, CUDA-graph skips: all should be 0).
Inference rows add the fused convolution kernel's device time per call. The targets of issue 28 are checked at the
end. Tables to stdout and DIR/bench_loop.md, rows to DIR/bench_loop.json.
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
import time

import torch

import torch_fused_ops
from torch_fused_ops.models import DEFAULT_BATCH, DEFAULT_INPUT, ConvTransposeLeakyMulLeakyPool
from torch_fused_ops.tools import recipes
from torch_fused_ops.tools.bench_train import (_fmt, _fresh_compile, _host_us_median, _jsonable, _log, _names,
                                               kernels_of)
from torch_fused_ops.tools.timing import host_us, median_us

CONFIGS = {  # name: (label, parameter and input dtype, TF32 allowed, autocast dtype)
    "tf32": ("float32, TF32 on", torch.float32, True, None),
    "bf16": ("bfloat16 weights and input", torch.bfloat16, True, None),
    "autocast-bf16": ("float32 model under torch.autocast(bfloat16)", torch.float32, True, torch.bfloat16),
}
SMALL_BATCH, SMALL_INPUT = 2, (4, 8, 8)
# The fused convolution's kernels, by name in the profiler: the inference rows' yardstick.
FUSED_KERNEL = "conv_transpose3d_post_pool_kernel"
# Issue 28's targets on an H200 at the KernelBench size, TF32.
TARGETS = dict(graph_wall_over_device=1.15, graph_off_over_on=5.0, no_capture_wall_over_device=1.5,
               infer_b1_wall_over_kernel=1.5, reduce_overhead_over_default=1.05, eager_call_host_us=12.0)
NO_CAPTURE = ("compile", "compile+opt", "reduce-overhead", "graphed", "compiled-autograd",
              "compiled-autograd+cudagraphs")


def wall_us(step, device: torch.device, steps: int, blocks: int = 3) -> float:
    """Median over `blocks` of (wall time of `steps` back-to-back steps, one synchronisation at the end) / steps."""
    times = []
    for _ in range(blocks):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        _sync(device)
        times.append((time.perf_counter() - t0) / steps * 1e6)
    return statistics.median(times)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _compile_counts() -> dict:
    """Counters that grow when something compiles, breaks a graph or skips a CUDA graph."""
    from torch._dynamo.utils import counters

    return {"frames compiled": counters["stats"]["unique_graphs"],
            "graph breaks": sum(counters["graph_break"].values()),
            "cudagraph skips": counters["inductor"]["cudagraph_skips"],
            "compiled-autograd captures": counters["compiled_autograd"]["captures"]}


def _model_and_data(config: str, device: torch.device, batch: int, spatial, train: bool):
    dtype = CONFIGS[config][1]
    torch.manual_seed(0)
    model = ConvTransposeLeakyMulLeakyPool().to(device=device, dtype=dtype)
    x = torch.randn(batch, model.conv_transpose.in_channels, *spatial, device=device, dtype=dtype)
    with torch.no_grad():
        target = torch.randn_like(model(x))
    if not train:
        model.requires_grad_(False)
    return model, x, target


@contextlib.contextmanager
def recipe_loop(kind: str, recipe: str, config: str, use_pass: bool, device: torch.device, batch: int, spatial):
    """The recipe built on the Model under the config's settings, the pass off or on, the compile caches off (a
    cache hit would skip the pass); closed on exit. Callers reset Dynamo first."""
    with torch.backends.cudnn.flags(enabled=torch.backends.cudnn.enabled, allow_tf32=CONFIGS[config][2]), \
            _fresh_compile(), torch_fused_ops.fusion_enabled(use_pass):
        model, x, target = _model_and_data(config, device, batch, spatial, kind == "train")
        amp = CONFIGS[config][3]
        loop = recipes.training(recipe, model, x, target, autocast=amp) if kind == "train" else \
            recipes.inference(recipe, model, x, autocast=amp)
        with contextlib.closing(loop):
            yield loop


def measure(kind: str, recipe: str, config: str, use_pass: bool, device: torch.device, batch: int, spatial,
            steps: int) -> dict:
    """One row: build the recipe with the pass off or on, warm up, then time it."""
    cuda = device.type == "cuda"
    torch._dynamo.reset()
    nan = float("nan")
    row = dict(what=kind, recipe=recipe, config=config, config_label=CONFIGS[config][0], use_pass=use_pass,
               batch=batch, input=list(spatial))
    before = torch_fused_ops.matched_count()
    at_start = _compile_counts()
    with recipe_loop(kind, recipe, config, use_pass, device, batch, spatial) as loop:
        for _ in range(5):
            loop.step()
        _sync(device)
        row["matched"] = torch_fused_ops.matched_count() - before
        counts = _compile_counts()
        row["while_compiling"] = {k: counts[k] - at_start[k] for k in counts}
        row["wall_us"] = wall_us(loop.step, device, steps)
        row["device_us"] = median_us(loop.step, device, warmup=2, reps=10, hide_host=True) if cuda else nan
        row["host_us"] = _host_us_median(loop.step, device) if cuda else nan
        after = _compile_counts()
        # Whatever compiled during the timed steps happens on every step in a user's loop too.
        row["during_timed_steps"] = {k: after[k] - counts[k] for k in counts}
        row["peak_MiB"] = nan
        row["fused_kernel_us"] = nan
        if cuda:
            _sync(device)
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
            loop.step()
            _sync(device)
            row["peak_MiB"] = (torch.cuda.max_memory_allocated(device) - base) / 2**20
            kernels = kernels_of(loop.step, device)
            row["kernel_sum_us"] = sum(k["us"] for k in kernels)
            row["fused_kernel_us"] = sum(k["us"] for k in kernels if FUSED_KERNEL in k["name"]) or nan
            row["kernels"] = kernels[:8]
            row["host_ops"] = host_ops_of(loop.step, device)
    off_pass = "on" if use_pass else "off"
    _log(f"  {kind:5s} {config:5s} b{batch:<3d} {recipe:30s} pass {off_pass:3s} wall {row['wall_us']:9.1f} us  "
         f"device {row['device_us']:9.1f}  host {row['host_us']:9.1f}  peak {row['peak_MiB']:7.1f} MiB  "
         f"fused kernel {row['fused_kernel_us']:7.1f}  matched {row['matched']}  timed-step compiles "
         f"{row['during_timed_steps']}")
    return row


def host_ops_of(step, device: torch.device, steps: int = 5, top: int = 10) -> list[dict]:
    """Where a step's host time goes: the profiler's CPU events with the most self time, µs per step."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
        _sync(device)
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:top]
    return [dict(name=e.key, us=e.self_cpu_time_total / steps, calls=e.count / steps) for e in events]


def eager_call_host_us(device: torch.device, batch: int, spatial) -> tuple[float, float]:
    """Host µs of one eager torch_fused_ops.conv_transpose3d_post_pool call at inference (device kept busy), and of
    one torch.relu on 32 floats in the same way: the host's speed at one aten op, for scale."""
    model, x, _ = _model_and_data("tf32", device, batch, spatial, train=False)
    conv, m = model.conv_transpose, model.multiplier
    small = torch.randn(32, device=device)

    def call():
        return torch_fused_ops.conv_transpose3d_post_pool(x, conv.weight, conv.bias, m, 0.2, 2, 1, 1)

    out = []
    with torch.no_grad():
        for fn in (call, lambda: torch.relu(small)):
            for _ in range(10):
                fn()
            out.append(statistics.median(host_us(fn, device, n=200, busy_ms=50.0) for _ in range(7)))
    return out[0], out[1]


def _find(rows, **want):
    for r in rows:
        if all(r.get(k) == v for k, v in want.items()):
            return r
    return None


def tables(rows: list[dict], meta: dict, kernels: bool = False) -> str:
    lines = [f"{meta['device']}, torch {meta['torch']}, {meta['date']}; input {meta['input']}", "",
             "wall: back-to-back steps, one sync at the end (what a user's loop sees); device: the host hidden; "
             "host: the host's time per step with the device kept busy; compiles: frames compiled, graph breaks, "
             "CUDA-graph skips and compiled-autograd compiles during the timed steps.", ""]
    for kind, title in (("train", "Training step (zero_grad, forward, MSE loss, backward, AdamW)"),
                        ("infer", "Inference call (torch.no_grad())")):
        kind_rows = [r for r in rows if r["what"] == kind]
        if not kind_rows:
            continue
        lines += [f"### {title}", "",
                  "| config | batch | recipe | pass | wall us | device us | host us | wall / device | "
                  "off / on (wall) | peak MiB | fused kernel us | compiles |",
                  "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
        for r in kind_rows:
            off = _find(rows, what=kind, recipe=r["recipe"], config=r["config"], batch=r["batch"], use_pass=False)
            ratio = off["wall_us"] / r["wall_us"] if r["use_pass"] and off else float("nan")
            compiles = ", ".join(f"{v} {k}" for k, v in r["during_timed_steps"].items() if v) or "none"
            lines.append(f"| {r['config_label']} | {r['batch']} | {r['recipe']} | {'on' if r['use_pass'] else 'off'} "
                         f"| {_fmt(r['wall_us'])} | {_fmt(r['device_us'])} | {_fmt(r['host_us'])} "
                         f"| {_fmt(r['wall_us'] / r['device_us'], 2)} | {_fmt(ratio, 2)} | {_fmt(r['peak_MiB'], 0)} "
                         f"| {_fmt(r['fused_kernel_us'])} | {compiles} |")
        lines.append("")
    if meta.get("eager_call_host_us") is not None:
        lines += [f"Host time of one eager `torch_fused_ops.conv_transpose3d_post_pool` call (inference, batch "
                  f"{meta['batch']}, device kept busy): {meta['eager_call_host_us']:.1f} µs; of one `torch.relu` on "
                  f"32 floats, the same way: {meta['relu_host_us']:.1f} µs", ""]
    checks = target_checks(rows, meta)
    if checks:
        lines += ["Targets (TF32, pass on unless said):", ""] + [f"- {c}" for c in checks]
    for r in rows if kernels else []:
        lines += ["", f"Largest kernels per step: {r['what']} {r['config']} batch {r['batch']} {r['recipe']} pass "
                  f"{'on' if r['use_pass'] else 'off'} (sum of all {_fmt(r.get('kernel_sum_us'))} µs)", ""]
        lines += [f"- {k['us']:.1f} µs × {k['calls']:g}: `{k['name'][:90]}`" for k in r.get("kernels", [])]
        lines += ["", "Host: most self time per step (profiler, CPU events; the profiler adds its own)", ""]
        lines += [f"- {k['us']:.1f} µs × {k['calls']:g}: `{k['name'][:90]}`" for k in r.get("host_ops", [])]
        lines += ["", f"While compiling: {r['while_compiling']}"]
    return "\n".join(lines) + "\n"


def target_checks(rows: list[dict], meta: dict) -> list[str]:
    out = []

    def check(name, value, target, below=True):
        if value is None or math.isnan(value):
            return
        ok = value <= target if below else value >= target
        out.append(f"{name}: {value:.2f} ({'≤' if below else '≥'} {target}: {'met' if ok else 'not met'})")

    b = meta["batch"]
    on = _find(rows, what="train", recipe="cuda-graph", config="tf32", batch=b, use_pass=True)
    off = _find(rows, what="train", recipe="cuda-graph", config="tf32", batch=b, use_pass=False)
    if on:
        check("whole-step CUDA graph, wall / device", on["wall_us"] / on["device_us"], TARGETS["graph_wall_over_device"])
    if on and off:
        check("whole-step CUDA graph, wall pass off / pass on", off["wall_us"] / on["wall_us"],
              TARGETS["graph_off_over_on"], below=False)
    free = [r for r in rows if r["what"] == "train" and r["config"] == "tf32" and r["use_pass"] and r["batch"] == b
            and r["recipe"] in NO_CAPTURE]
    if free:
        best = min(free, key=lambda r: r["wall_us"])
        check(f"best recipe without manual capture ({best['recipe']}), wall / device",
              best["wall_us"] / best["device_us"], TARGETS["no_capture_wall_over_device"])
    b1 = [r for r in rows if r["what"] == "infer" and r["config"] == "tf32" and r["use_pass"] and r["batch"] == 1]
    if b1:
        best = min(b1, key=lambda r: r["wall_us"])
        check(f"inference batch 1, best recipe ({best['recipe']}), wall / fused kernel",
              best["wall_us"] / best["fused_kernel_us"], TARGETS["infer_b1_wall_over_kernel"])
    de = _find(rows, what="infer", recipe="compile", config="tf32", batch=DEFAULT_BATCH, use_pass=True)
    for recipe in ("reduce-overhead", "reduce-overhead+static"):
        ro = _find(rows, what="infer", recipe=recipe, config="tf32", batch=DEFAULT_BATCH, use_pass=True)
        if ro and de:
            check(f"inference batch {DEFAULT_BATCH}, {recipe} / default (wall)", ro["wall_us"] / de["wall_us"],
                  TARGETS["reduce_overhead_over_default"])
    if meta.get("eager_call_host_us") is not None:
        check("host µs of one eager fused call", meta["eager_call_host_us"], TARGETS["eager_call_host_us"])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--configs", default="tf32", help=f"comma-separated: {', '.join(CONFIGS)}")
    ap.add_argument("--recipes", default=None, help=f"training recipes (default: all that run on the device): "
                                                   f"{', '.join(recipes.TRAINING)}")
    ap.add_argument("--inference-recipes", default=None, help=f"{', '.join(recipes.INFERENCE)}")
    ap.add_argument("--inference-batches", default=f"1,{DEFAULT_BATCH}")
    ap.add_argument("--passes", default="off,on", help="off, on or both")
    ap.add_argument("--small", action="store_true", help=f"batch {SMALL_BATCH}, input {SMALL_INPUT}")
    ap.add_argument("--batch", type=int, default=None, help=f"training batch (default {DEFAULT_BATCH})")
    ap.add_argument("--input", default=None, help=f"D,H,W of x (default {DEFAULT_INPUT})")
    ap.add_argument("--steps", type=int, default=50, help="steps per timed block")
    ap.add_argument("--kernels", action="store_true", help="list each row's largest kernels (profiler)")
    ap.add_argument("--out", default="results")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    runs_here = (lambda r: cuda or r not in recipes.NEEDS_CUDA)
    train = _names(args.recipes, recipes.TRAINING, "recipe", ap) if args.recipes is not None else \
        [r for r in recipes.TRAINING if runs_here(r)]
    infer = _names(args.inference_recipes, recipes.INFERENCE, "inference recipe", ap) \
        if args.inference_recipes is not None else [r for r in recipes.INFERENCE if runs_here(r)]
    if not cuda and any(r in recipes.NEEDS_CUDA for r in train + infer):
        ap.error(f"recipes {sorted(recipes.NEEDS_CUDA)} need CUDA")
    configs = _names(args.configs, CONFIGS, "config", ap)
    passes = [{"off": False, "on": True}[p] for p in _names(args.passes, {"off": 0, "on": 1}, "pass", ap)]
    batch = args.batch or (SMALL_BATCH if args.small else DEFAULT_BATCH)
    spatial = tuple(int(v) for v in args.input.split(",")) if args.input else \
        SMALL_INPUT if args.small else DEFAULT_INPUT
    infer_batches = [int(v) for v in args.inference_batches.split(",") if v]
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    _log(f"# device {name}, torch {torch.__version__}; batch {batch}, input {list(spatial)}")
    os.makedirs(args.out, exist_ok=True)
    rows = []

    def add(row):
        rows.append(row)
        # Each row as it comes, so that a run cut short still leaves what it measured.
        with open(os.path.join(args.out, "bench_loop.partial.json"), "w") as f:
            json.dump(_jsonable(rows), f, indent=1)

    for config in configs:
        for recipe in train:
            for p in passes:
                add(measure("train", recipe, config, p, device, batch, spatial, args.steps))
        for b in infer_batches:
            for recipe in infer:
                for p in passes:
                    add(measure("infer", recipe, config, p, device, b, spatial, args.steps))
    eager_us, relu_us = eager_call_host_us(device, batch, spatial) if cuda else (None, None)
    meta = dict(device=name, torch=torch.__version__, date=datetime.date.today().isoformat(), batch=batch,
                input=list(spatial), eager_call_host_us=eager_us, relu_host_us=relu_us,
                command="python -m torch_fused_ops.tools.bench_loop " + " ".join(sys.argv[1:] if argv is None
                                                                                 else argv))
    text = tables(rows, meta, kernels=args.kernels)
    with open(os.path.join(args.out, "bench_loop.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "bench_loop.json"), "w") as f:
        json.dump(_jsonable(dict(meta=meta, rows=rows)), f, indent=1)
    print("\n" + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
