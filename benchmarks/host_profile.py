"""Where a recipe's host time goes: cProfile over steady-state steps of one recipe of torch_fused_ops.tools.recipes
(the Python functions with the most own and cumulative time, per step), for the loops the bench finds host-bound.

    python benchmarks/host_profile.py [--kind train|infer] [--recipe compiled-autograd] [--pass on|off]
        [--config tf32] [--batch 16] [--steps 20] [--top 25]

Also the host µs of one eager fused-convolution call broken into its parts (--eager-call): the wrapper, its C entry
point alone, torch.ops' path, an output allocation, and one small aten op, for scale.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics

import torch

import torch_fused_ops
from torch_fused_ops.models import DEFAULT_BATCH, DEFAULT_INPUT
from torch_fused_ops.tools.bench_loop import CONFIGS, _model_and_data, _sync, recipe_loop
from torch_fused_ops.tools.timing import host_us


def profile_recipe(kind, recipe, config, use_pass, device, batch, steps, top):
    torch._dynamo.reset()
    with recipe_loop(kind, recipe, config, use_pass, device, batch, DEFAULT_INPUT) as loop:
        for _ in range(5):
            loop.step()
        _sync(device)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(steps):
            loop.step()
        _sync(device)
        prof.disable()
    for order in ("tottime", "cumtime"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(order).print_stats(top)
        print(f"## {kind} {recipe}, pass {'on' if use_pass else 'off'}, {config}, batch {batch}: by {order} "
              f"(seconds over {steps} steps)")
        print(buf.getvalue().split("\n", 4)[-1])


def eager_call_parts(device, batch):
    """Host µs per call (device kept busy, median of 7) of the pieces of one eager fused call."""
    from torch_fused_ops import _C

    model, x, _ = _model_and_data("tf32", device, batch, DEFAULT_INPUT, train=False)
    w, b, m = model.conv_transpose.weight, model.conv_transpose.bias, model.multiplier
    args = (x, w, b, [2] * 3, [1] * 3, [1] * 3, 1, [1] * 3, m, 0.2, [2] * 3, [], [0] * 3, [1] * 3, False, None)
    plain = (x, w, b, m, 0.2, 2, 1, 1, 1, 1, 2, None, 0, 1, False, None)  # the wrapper's order
    out = torch_fused_ops.conv_transpose3d_post_pool(x, w, b, m, 0.2, 2, 1, 1)
    small = torch.randn(32, device=device)
    cases = {
        "wrapper": lambda: torch_fused_ops.conv_transpose3d_post_pool(x, w, b, m, 0.2, 2, 1, 1),
        "C entry point alone": lambda: _C.conv_transpose3d_post_pool(*plain),
        "torch.ops path": lambda: torch.ops.fused.conv_transpose3d_post_pool.default(*args),
        "torch.empty of the output": lambda: torch.empty(out.shape, device=device),
        "torch.relu of 32 floats (one aten op)": lambda: torch.relu(small),
        "torch.compiler.is_compiling()": torch.compiler.is_compiling,
    }
    for grad_mode, ctx in (("no_grad", torch.no_grad), ("inference_mode", torch.inference_mode)):
        with ctx():
            for name, fn in cases.items():
                for _ in range(20):
                    fn()
                us = statistics.median(host_us(fn, device, n=200, busy_ms=40.0) for _ in range(7))
                print(f"| {grad_mode} | {name} | {us:.2f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kind", default="train", choices=["train", "infer"])
    ap.add_argument("--recipe", default="compiled-autograd")
    ap.add_argument("--pass", dest="use_pass", default="on", choices=["on", "off"])
    ap.add_argument("--config", default="tf32", choices=list(CONFIGS))
    ap.add_argument("--batch", type=int, default=DEFAULT_BATCH)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--eager-call", action="store_true", help="only the eager call's parts")
    args = ap.parse_args()
    device = torch.device("cuda")
    if args.eager_call:
        print("| grad mode | call | host µs |\n| --- | --- | ---: |")
        eager_call_parts(device, args.batch)
        return
    profile_recipe(args.kind, args.recipe, args.config, args.use_pass == "on", device, args.batch, args.steps,
                   args.top)


if __name__ == "__main__":
    main()
