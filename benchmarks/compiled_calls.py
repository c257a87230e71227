"""The compiled Model's host cost with Inductor's generated code calling our operators through torch.ops against
through our typed entry point (torch_fused_ops/compile/extern_calls.py), in one process.

    python benchmarks/compiled_calls.py [--rounds 3] [--device cpu --channels 4,8 --input 2,4,4 --batches 1]

Each variant compiles its own copy of the call (a distinct code object, so Dynamo keeps both), the torch.ops one
with our entries taken out of Inductor's custom code generation registry while it compiles. Per row: *wall* µs of
back-to-back calls (host included: what a loop sees), *host* µs with the device kept busy, *device* µs with the host
hidden; medians over the rounds, the two variants measured alternately. Rows: inference (no_grad) at batch 16 and 1
in TF32 and with bfloat16 weights, and a training step (forward and backward of .sum(), x without grad) in TF32.
On the CPU (float32 for "TF32": the CPU has none) the wall time is the host's, and there is no device column; a small
Model and input (--channels, --input, --batches) keep the kernels' own time from hiding the calls'.
"""
from __future__ import annotations

import argparse
import statistics
import types

import torch

import torch_fused_ops
from torch_fused_ops.models import DEFAULT_INPUT, ConvTransposeLeakyMulLeakyPool
from torch_fused_ops.tools.timing import host_us, median_us

try:
    from torch._inductor.codegen.custom_extern_kernel_codegen import CUSTOM_EXTERN_KERNEL_CODEGEN
except ImportError:
    CUSTOM_EXTERN_KERNEL_CODEGEN = None


def _copy(fn, name):
    """fn with a code object of its own: Dynamo caches compiled code per code object."""
    return types.FunctionType(fn.__code__.replace(co_name=name), fn.__globals__, name, fn.__defaults__,
                              fn.__closure__)


def _compiled(fn, name, ours: bool, first_call):
    """torch.compile(fn) compiled (on first_call) with or without our registry entries."""
    saved = {k: v for k, v in CUSTOM_EXTERN_KERNEL_CODEGEN.items() if k.startswith("torch.ops.fused.")}
    if not ours:
        for k in saved:
            del CUSTOM_EXTERN_KERNEL_CODEGEN[k]
    try:
        compiled = torch.compile(_copy(fn, name))
        first_call(compiled)
    finally:
        CUSTOM_EXTERN_KERNEL_CODEGEN.update(saved)
    return compiled


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--input", default=",".join(map(str, DEFAULT_INPUT)), help="D,H,W of the Model's input")
    ap.add_argument("--channels", default="16,32", help="the Model's input and output channels")
    ap.add_argument("--batches", default="16,1", help="the inference rows' batches (the first: the other rows')")
    args = ap.parse_args()
    if CUSTOM_EXTERN_KERNEL_CODEGEN is None:
        raise SystemExit(f"torch {torch.__version__} has no custom extern kernel codegen registry: nothing to compare")
    device = torch.device(args.device)
    spatial = tuple(int(v) for v in args.input.split(","))
    cuda = device.type == "cuda"
    cin, cout = (int(v) for v in args.channels.split(","))
    batches = [int(v) for v in args.batches.split(",")]
    torch._inductor.config.fx_graph_cache = False
    rows = []
    workloads = [("TF32 inference", torch.float32, b, False) for b in batches]
    workloads += [("bf16 inference", torch.bfloat16, batches[0], False),
                  ("TF32 training step", torch.float32, batches[0], True)]
    for label, dtype, batch, train in workloads:
        torch.manual_seed(0)
        model = ConvTransposeLeakyMulLeakyPool(cin, cout, multiplier_shape=(cout, 1, 1, 1))
        model = model.to(device=device, dtype=dtype)
        model.requires_grad_(train)
        x = torch.randn(batch, model.conv_transpose.in_channels, *spatial, device=device, dtype=dtype)

        def fwd(t):
            return model(t)

        variants = {}
        for ours in (False, True):
            name = f"fwd_{'ours' if ours else 'ops'}_{len(rows)}"
            if train:
                c = _compiled(fwd, name, ours, lambda f: f(x).sum().backward())
                variants[ours] = lambda c=c: c(x).sum().backward()
            else:
                with torch.no_grad():
                    c = _compiled(fwd, name, ours, lambda f: f(x))
                variants[ours] = lambda c=c: c(x)
        grad = torch.enable_grad() if train else torch.no_grad()
        samples = {False: [], True: []}
        with grad:
            for _ in range(args.rounds):
                for ours in (False, True):
                    fn = variants[ours]
                    wall = median_us(fn, device, reps=20, min_time_s=0.2 if not cuda else 0.0)
                    samples[ours].append((wall, host_us(fn, device, n=100) if cuda else wall,
                                          median_us(fn, device, reps=10, hide_host=True) if cuda else float("nan")))
        for ours in (False, True):
            wall, host, dev = (statistics.median(s[i] for s in samples[ours]) for i in range(3))
            rows.append((label, batch, "typed entry point" if ours else "torch.ops", wall, host, dev))
            print(f"  {label} batch {batch} {rows[-1][2]}: wall {wall:.1f} host {host:.1f} device {dev:.1f}",
                  flush=True)
    where = torch.cuda.get_device_name() if cuda else f"CPU ({torch.get_num_threads()} threads)"
    print(f"\n# {where}, torch {torch.__version__}, torch_fused_ops {torch_fused_ops.__version__}; input "
          f"[batch, {cin}, {', '.join(map(str, spatial))}], {cout} output channels; medians of {args.rounds} rounds")
    print("| workload | batch | our ops called through | wall us | host us | device us |")
    print("| --- | ---: | --- | ---: | ---: | ---: |")
    for label, batch, how, wall, host, dev in rows:
        print(f"| {label} | {batch} | {how} | {wall:.1f} | {host:.1f} | {'–' if dev != dev else f'{dev:.1f}'} |")


if __name__ == "__main__":
    main()
