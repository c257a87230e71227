"""Where the host time of the compiled Model's forward goes under torch.autocast, piece by piece.

    python benchmarks/autocast_host.py [--batch 16] [--dtype bf16|fp16]

The compiled forward under autocast is bound by the host (docs/performance.md, Mixed precision). This prints the
host µs per call (device kept busy; median of 7) and device µs (host hidden) of: the autocast context alone, the
compiled float32 forward, the compiled forward with bfloat16 weights (one fused kernel, no casts), the compiled
forward under autocast with the context entered per call and entered once around the loop, and the fused op's
eager paths (the wrapper, torch.ops, under autocast); then the kernels one autocast call launches (profiler).
"""
from __future__ import annotations

import argparse
import contextlib
import statistics

import torch

import torch_fused_ops
from torch_fused_ops.models import DEFAULT_INPUT, ConvTransposeLeakyMulLeakyPool
from torch_fused_ops.tools.timing import host_us, median_us

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _host(fn, device):
    for _ in range(20):
        fn()
    return statistics.median(host_us(fn, device, n=200, busy_ms=60.0) for _ in range(7))


def _profile(name, fn, calls=200, top=22):
    """cProfile's own time per function over `calls` calls, then the profiler's host-side ops for 20 calls."""
    import cProfile
    import io
    import pstats
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    print(f"## cProfile, {name}: {calls} calls, by own time")
    print(buf.getvalue().split("\n", 4)[-1])
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
    print(f"## profiler host ops, {name}: 20 calls")
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=top))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    ap.add_argument("--profile", action="store_true",
                    help="also cProfile and the profiler's host ops of the compiled call, context per call and around")
    args = ap.parse_args()
    device = torch.device("cuda")
    amp = DTYPES[args.dtype]
    torch.manual_seed(0)
    model = ConvTransposeLeakyMulLeakyPool().to(device).requires_grad_(False)
    x = torch.randn(args.batch, model.conv_transpose.in_channels, *DEFAULT_INPUT, device=device)
    low = ConvTransposeLeakyMulLeakyPool().to(device=device, dtype=amp).requires_grad_(False)
    x_low = x.to(amp)
    conv = model.conv_transpose
    rows = []

    def add(name, fn, device_time=True):
        h = _host(fn, device)
        d = median_us(fn, device, reps=30, hide_host=True) if device_time else float("nan")
        rows.append((name, h, d))
        print(f"  {name}: host {h:.1f} us, device {d:.1f} us", flush=True)

    def ctx():
        return torch.autocast("cuda", dtype=amp)

    def enter_exit():
        with ctx():
            pass

    with torch.no_grad(), torch_fused_ops.fusion_enabled(True):
        add("torch.autocast enter + exit", enter_exit, device_time=False)
        fp32 = torch.compile(model)
        add("compiled forward, float32 (TF32)", lambda: fp32(x))
        torch._dynamo.reset()
        lowc = torch.compile(low)
        add(f"compiled forward, {args.dtype} weights", lambda: lowc(x_low))
        torch._dynamo.reset()
        mixed = torch.compile(model)

        def per_call():
            with ctx():
                return mixed(x)
        add(f"compiled forward under autocast {args.dtype}, context per call", per_call)
        reused = ctx()

        def per_call_reused():
            with reused:
                return mixed(x)
        add(f"compiled forward under autocast {args.dtype}, one autocast object entered per call", per_call_reused)

        def per_call_nocache():
            with torch.autocast("cuda", dtype=amp, cache_enabled=False):
                return mixed(x)
        add(f"compiled forward under autocast {args.dtype}, context per call, cache_enabled=False", per_call_nocache)
        with ctx():
            add(f"compiled forward under autocast {args.dtype}, context around the loop", lambda: mixed(x))
            if args.profile:
                _profile("context around the loop", lambda: mixed(x))
        if args.profile:
            _profile("context per call", per_call)
            w, b, m = conv.weight, conv.bias, model.multiplier
            add("eager fused op under autocast (autocast kernel + casts)",
                lambda: torch_fused_ops.conv_transpose3d_post_pool(x, w, b, m, 0.2, 2, 1, 1))
        wl, bl = conv.weight.to(amp), conv.bias.to(amp)
        add(f"eager fused op, {args.dtype} operands, wrapper",
            lambda: torch_fused_ops.conv_transpose3d_post_pool(x_low, wl, bl, model.multiplier, 0.2, 2, 1, 1))
        op_args = (x_low, wl, bl, [2] * 3, [1] * 3, [1] * 3, 1, [1] * 3, model.multiplier, 0.2, [2] * 3, [],
                   [0] * 3, [1] * 3, False, None)
        add(f"eager fused op, {args.dtype} operands, torch.ops",
            lambda: torch.ops.fused.conv_transpose3d_post_pool.default(*op_args))
        add(f"x.to({args.dtype})", lambda: x.to(amp))
        small = torch.randn(32, device=device)
        add("torch.relu of 32 floats (one aten op)", lambda: torch.relu(small), device_time=False)

        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                per_call()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))

    print("\n| piece | host us | device us |\n| --- | ---: | ---: |")
    for name, h, d in rows:
        print(f"| {name} | {h:.1f} | {'–' if d != d else f'{d:.1f}'} |")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
