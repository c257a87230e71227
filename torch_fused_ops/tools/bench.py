"""Benchmark fused.post_pool against the eager composite and torch.compile of it, and the whole KernelBench Model.

    python -m torch_fused_ops.tools.bench [--device cuda|cpu] [--dtypes float32,bfloat16]
        [--layouts contiguous,channels_last_3d] [--shapes "N,C,D,H,W;..."] [--no-compile] [--no-model] [--reps N]
        [--out DIR] [--model-configs fp32,bf16,fp32-b1,fp32-strict]

Rows: the op alone (forward and backward per shape, dtype and layout) and the Model (eager, compiled without and
with the pass: forward, training step, peak memory), each with its memory floor (columns:
docs/performance.md#how-to-read-the-figures). Inputs rotate among copies so small sizes are not timed out of L2.
Markdown to stdout; JSON and a PNG to DIR.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import sys

import torch

import torch_fused_ops
from torch_fused_ops.tools.timing import copy_bandwidth, median_us
from torch_fused_ops import reference_post_pool

SLOPE = 0.2
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
DEFAULT_SHAPES = {
    "cuda": "1,32,8,16,16;2,32,16,32,32;4,32,32,64,64;16,32,32,64,64",
    "cpu": "1,8,8,16,16;1,32,16,32,32;2,32,32,64,64",
}


def _cache_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 << 20)
    return 64 << 20  # a generous last-level cache


def _copies(nbytes: int, device: torch.device) -> int:
    """How many input sets to rotate through so that together they are at least twice the cache."""
    return max(1, min(8, math.ceil(2 * _cache_bytes(device) / max(nbytes, 1))))


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def floor_bytes(what: str, in_numel: int, out_numel: int, element_size: int) -> int:
    """Bytes a pass of post_pool must move at least. forward: the input read, the pooled output written.
    backward: grad_output, the selected value and a one-byte offset read at pooled size, the full-resolution
    grad_input written."""
    if what == "forward":
        return (in_numel + out_numel) * element_size
    return out_numel * (2 * element_size + 1) + in_numel * element_size


def bench_op(shape, dtype, fmt, device, bw, use_compile, reps):
    torch.manual_seed(0)
    N, C, D, H, W = shape
    es = torch.empty((), dtype=dtype).element_size()
    in_numel = N * C * D * H * W
    out_numel = N * C * (D // 2) * (H // 2) * (W // 2)
    k = _copies(in_numel * es, device)
    xs = [torch.randn(shape, device=device, dtype=dtype).contiguous(memory_format=fmt) for _ in range(k)]
    m = torch.randn(C, 1, 1, 1, device=device, dtype=dtype)
    # The gradient arrives in the layout of the output it belongs to, as autograd hands it over in a model that
    # keeps one layout (max_pool3d's output follows its input's layout). Every implementation gets this tensor.
    g = torch.randn(N, C, D // 2, H // 2, W // 2, device=device, dtype=dtype).contiguous(memory_format=fmt)
    floors = {what: floor_bytes(what, in_numel, out_numel, es) for what in ("forward", "backward")}
    layout = "channels_last_3d" if fmt == torch.channels_last_3d else "contiguous"
    rows = []

    def row(what, impl, fn):
        # us: the device's time per call (host hidden, see median_us(hide_host)), the figure the floor bounds;
        # call_us: back-to-back calls as the host issues them, which is the host's time where it is the slower
        # side (small sizes, or 16-bit tensors on a slow host). The CPU has one figure.
        cuda = device.type == "cuda"
        us = median_us(fn, device, reps=reps, hide_host=cuda)
        call_us = median_us(fn, device, reps=max(5, reps // 2)) if cuda else us
        floor = floors[what] / bw * 1e6
        rows.append(dict(what=what, impl=impl, dtype=str(dtype).replace("torch.", ""), layout=layout,
                         shape=list(shape), input_MB=in_numel * es / 1e6, us=us, call_us=call_us, floor_us=floor,
                         frac_of_floor=floor / us, rotating_copies=k))
        _log(f"  {what:8s} {impl:13s} {rows[-1]['dtype']:8s} {layout:16s} {str(list(shape)):22s} {us:10.1f} us"
             f"  floor {floor:8.1f} us ({floor / us:5.1%})  call {call_us:10.1f} us")

    def rotating(fn):
        state = {"i": 0}

        def call():
            state["i"] += 1
            return fn(state["i"] % k)
        return call

    impls = [("eager", reference_post_pool)]
    if use_compile:
        torch._dynamo.reset()
        impls.append(("torch.compile", torch.compile(reference_post_pool)))
    impls.append(("fused", torch_fused_ops.post_pool))

    with torch.no_grad():
        for name, fn in impls:
            row("forward", name, rotating(lambda i, fn=fn: fn(xs[i], m, SLOPE, 2)))

    # Backward alone: graphs built once, replayed with retain_graph; ours calls the backward op directly.
    kb = 1 if in_numel * es > _cache_bytes(device) else k
    for name, fn in impls:
        if name == "fused":
            saved = [torch.ops.fused.post_pool_with_offsets(xs[i], m, SLOPE, [2, 2, 2]) for i in range(kb)]
            cl = fmt == torch.channels_last_3d

            def bwd(i, saved=saved, cl=cl):
                _, sel, off = saved[i % kb]
                return torch.ops.fused.post_pool_backward(g, sel, off, m, SLOPE, None, list(shape), [2, 2, 2],
                                                          [2, 2, 2], [0, 0, 0], [1, 1, 1], cl)
        else:
            graphs = []
            for i in range(kb):
                xg = xs[i].detach().requires_grad_()
                mg = m.detach().requires_grad_()
                graphs.append((fn(xg, mg, SLOPE, 2), xg, mg))

            def bwd(i, graphs=graphs):
                out, xg, mg = graphs[i % kb]
                return torch.autograd.grad(out, (xg, mg), g, retain_graph=True)
        row("backward", name, rotating(bwd))
        if name != "fused":
            del graphs
    return rows


# Whole-Model configurations (--model-configs): dtype, batch (None: the device's default), TF32 for convolutions,
# torch.compile mode. "fp32-b1-graphs" is batch 1 with CUDA graphs (mode "reduce-overhead"), where the host's
# per-launch work, which dominates batch 1, is replayed by the GPU instead.
MODEL_CONFIGS = {
    "fp32": (torch.float32, None, True, None),
    "bf16": (torch.bfloat16, None, True, None),
    "fp32-b1": (torch.float32, 1, True, None),
    "fp32-b1-graphs": (torch.float32, 1, True, "reduce-overhead"),
    "fp32-graphs": (torch.float32, None, True, "reduce-overhead"),
    "fp32-strict": (torch.float32, None, False, None),
    "autocast-bf16": (torch.float32, None, True, None),
    "autocast-fp16": (torch.float32, None, True, None),
}
# Configurations that run the float32 Model inside torch.autocast with this dtype (mixed precision as most users
# run it).
MODEL_AUTOCAST = {"autocast-bf16": torch.bfloat16, "autocast-fp16": torch.float16}


def bench_model(device, reps, use_compile=True, configs=("fp32",)):
    """The whole KernelBench Model: eager, torch.compile without the pass, with it; forward and training step.
    One block of rows per configuration in `configs` (keys of MODEL_CONFIGS)."""
    rows = []
    for config in configs:
        dtype, batch, tf32, mode = MODEL_CONFIGS[config]
        with torch.backends.cudnn.flags(enabled=torch.backends.cudnn.enabled, allow_tf32=tf32):
            rows += _bench_model_config(device, reps, use_compile, config, dtype, batch,
                                        extra_variant=config == configs[0], mode=mode)
    return rows


def _bench_model_config(device, reps, use_compile, config, dtype, batch, extra_variant, mode=None):
    from torch_fused_ops.models import DEFAULT_BATCH, DEFAULT_INPUT, ConvTransposeLeakyMulLeakyPool

    if batch is None:
        batch = DEFAULT_BATCH if device.type == "cuda" else 1
    torch.manual_seed(0)
    model = ConvTransposeLeakyMulLeakyPool().to(device=device, dtype=dtype)
    x = torch.randn(batch, 16, *DEFAULT_INPUT, device=device, dtype=dtype)
    xg = x.clone().requires_grad_()
    rows = []
    from torch_fused_ops import pass_config

    variants = [("eager", None, None)]
    if use_compile:
        # "pass on" uses the package's default settings; the last row leaves the convolution out of the fused op
        # (fused.post_pool with the conv bias folded in, as on devices where the fused convolution doesn't apply).
        variants += [("torch.compile, pass off", False, None), ("torch.compile, pass on", True, None)]
        if extra_variant:
            variants.append(("torch.compile, pass on, conv not fused", True, "off"))
    for name, use_pass, conv_setting in variants:
        torch._dynamo.reset()
        before = torch_fused_ops.matched_count()
        settings = {} if conv_setting is None else {"fuse_conv_transpose": conv_setting}
        # Caches off so every compiled variant runs the pass (a cache hit would skip it and count no match).
        fresh = [torch._inductor.config.patch(fx_graph_cache=False)]
        if hasattr(torch._functorch.config, "enable_autograd_cache"):
            fresh.append(torch._functorch.config.patch(enable_autograd_cache=False))
        with torch_fused_ops.fusion_enabled(bool(use_pass)), pass_config.patch(**settings), \
                contextlib.ExitStack() as stack:
            for cm in fresh:
                stack.enter_context(cm)
            compiled = model if use_pass is None else torch.compile(model, mode=mode)
            amp = MODEL_AUTOCAST.get(config)

            def fn(t, compiled=compiled, amp=amp):
                if amp is None:
                    return compiled(t)
                with torch.autocast(device.type, dtype=amp):
                    return compiled(t)

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
        rows.append(dict(what="Model", config=config, impl=name, shape=list(x.shape), forward_us=fwd,
                         train_step_us=train, train_peak_MiB=peak, matched=matched))
        _log(f"  Model {config} {name:24s} forward {fwd:9.1f} us  train step {train:9.1f} us  peak {peak:8.1f} MiB  "
             f"matched {matched}")
    return rows


def plot(rows, path) -> str | None:
    """Time vs input size per pass and dtype, with the floor; None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    passes = sorted({r["what"] for r in rows}, key=["forward", "backward"].index)
    dtypes = sorted({r["dtype"] for r in rows})
    fig, axes = plt.subplots(len(passes), len(dtypes), figsize=(5.5 * len(dtypes), 4 * len(passes)), squeeze=False)
    for i, what in enumerate(passes):
        for j, dt in enumerate(dtypes):
            ax = axes[i][j]
            sel = [r for r in rows if r["what"] == what and r["dtype"] == dt]
            for impl in ("eager", "torch.compile", "fused"):
                for layout, style in (("contiguous", "-o"), ("channels_last_3d", "--s")):
                    pts = sorted((r["input_MB"], r["us"]) for r in sel if r["impl"] == impl and r["layout"] == layout)
                    if pts:
                        ax.plot(*zip(*pts), style, label=f"{impl} ({layout})", markersize=4)
            floor = sorted({(r["input_MB"], r["floor_us"]) for r in sel})
            if floor:
                ax.plot(*zip(*floor), "k:", label="memory floor", linewidth=2)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("input size (MB)")
            ax.set_ylabel("median time (us)")
            ax.set_title(f"fused.post_pool {what}, {dt}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--layouts", default="contiguous,channels_last_3d")
    ap.add_argument("--shapes", default=None, help='";"-separated N,C,D,H,W (default: a sweep per device)')
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows")
    ap.add_argument("--no-model", action="store_true", help="skip the whole-Model rows")
    ap.add_argument("--no-op", action="store_true", help="skip the op-alone rows (whole Model only)")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--model-configs", default="fp32",
                    help=f"comma-separated whole-Model configurations: {', '.join(MODEL_CONFIGS)} (default: fp32; "
                         "fp32-strict turns TF32 off)")
    ap.add_argument("--out", default="results")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    shapes = [tuple(int(v) for v in s.split(",")) for s in (args.shapes or DEFAULT_SHAPES[device.type]).split(";")]
    reps = args.reps or (50 if device.type == "cuda" else 5)
    bw = copy_bandwidth(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    _log(f"# device {name}, torch {torch.__version__}, copy bandwidth {bw / 1e9:.0f} GB/s (read+write)")
    rows = []
    for shape in () if args.no_op else shapes:
        for dt in args.dtypes.split(","):
            for lay in args.layouts.split(","):
                fmt = torch.channels_last_3d if lay == "channels_last_3d" else torch.contiguous_format
                # Pass off throughout: "torch.compile" must mean the composite as Inductor compiles it alone,
                # also when a later call (other requires_grad flags) triggers a recompile.
                # donated_buffer off: the backward rows replay one graph with retain_graph=True, which
                # compiled backwards with donated buffers refuse.
                no_donation = (torch._functorch.config.patch(donated_buffer=False)
                               if hasattr(torch._functorch.config, "donated_buffer") else contextlib.nullcontext())
                with torch_fused_ops.fusion_enabled(False), no_donation:
                    rows += bench_op(shape, DTYPES[dt], fmt, device, bw, not args.no_compile, reps)
    configs = tuple(c for c in args.model_configs.split(",") if c)
    unknown = [c for c in configs if c not in MODEL_CONFIGS]
    if unknown:
        ap.error(f"unknown --model-configs {unknown}; choose from {list(MODEL_CONFIGS)}")
    model_rows = [] if args.no_model else bench_model(device, reps, not args.no_compile, configs)
    meta = dict(device=name, torch=torch.__version__, date=datetime.date.today().isoformat(),
                copy_bandwidth_GBps=bw / 1e9,
                command="python -m torch_fused_ops.tools.bench " + " ".join(sys.argv[1:] if argv is None else argv))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"bench_{device.type}.json")
    with open(path, "w") as f:
        json.dump(dict(meta=meta, rows=rows, model_rows=model_rows), f, indent=1)
    png = plot(rows, os.path.join(args.out, f"bench_{device.type}.png")) if rows else None

    print(f"\n{meta['device']}, torch {meta['torch']}, {meta['date']}, copy {meta['copy_bandwidth_GBps']:.0f} GB/s\n")
    if device.type == "cuda":
        print("median us: the device's time per call (the host enqueues ahead of it); call us: back-to-back calls as "
              "the host issues them, host time included where the host is the slower side.\n")
    print("| pass | impl | dtype | layout | shape | median us | floor us | % of floor | call us |")
    print("| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['what']} | {r['impl']} | {r['dtype']} | {r['layout']} | {r['shape']} | {r['us']:.1f} | "
              f"{r['floor_us']:.1f} | {r['frac_of_floor']:.0%} | {r['call_us']:.1f} |")
    if model_rows:
        print("\nWhole Model (training step = forward + backward of .sum(); fp32 configs use TF32 convolutions "
              "unless marked strict)\n")
        print("| config | input | Model | forward us | train step us | train peak MiB | chains fused |")
        print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
        for r in model_rows:
            print(f"| {r['config']} | {r['shape']} | {r['impl']} | {r['forward_us']:.1f} | {r['train_step_us']:.1f} | "
                  f"{r['train_peak_MiB']:.0f} | {r['matched']} |")
    print(f"\n(JSON: {path}; plot: {png or 'not drawn, matplotlib is not installed'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
