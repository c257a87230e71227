"""GPU benchmark of the Triton ConvTranspose3d -> LeakyReLU -> x multiplier -> LeakyReLU -> MaxPool3d kernel.

KernelBench level 2 problem 74 at its default size (x [16, 16, 16, 32, 32], ConvTranspose3d(16, 32, 3, stride=2,
padding=1, output_padding=1) with bias, multiplier randn(32), slopes 0.2) and at batch 1:

* accuracy against a float64 reference of the same fp32 inputs: ours with TF32, ours strict fp32 (ieee), ours
  bf16, and cuDNN's TF32 conv followed by the eager chain (what the PyTorch model does by default);
* time per call (CUDA events, median over --reps calls, inputs rotated so they are not L2 resident): the eager
  model, ours tf32 / ieee / bf16, ours tf32 returning the pool offsets too.

Needs only torch, triton and the kernel module, which is loaded from its file so the package's compiled
extension does not have to be built:

    python benchmarks/conv_post_pool_triton_gpu.py [--out DIR]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

KERNEL_FILE = Path(__file__).resolve().parents[1] / "torch_fused_ops" / "_conv_post_pool_triton.py"

CIN, COUT, D, H, W = 16, 32, 16, 32, 32
OUTPUT_PADDING = 1
SLOPE1 = SLOPE2 = 0.2


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=None, help="directory to write conv_post_pool_triton_gpu.json into")
    p.add_argument("--batches", default="16,1", help="comma-separated batch sizes (default: 16,1)")
    p.add_argument("--reps", type=int, default=100, help="timed calls per variant (median reported; at least 50)")
    p.add_argument("--warmup", type=int, default=10, help="untimed calls per variant after autotuning")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",") if b.strip()]
    args.reps = max(args.reps, 50)
    return args


def load_kernel_module():
    # By file, not `import torch_fused_ops._conv_post_pool_triton`: the package __init__ loads the C++ extension.
    spec = importlib.util.spec_from_file_location("_conv_post_pool_triton", KERNEL_FILE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def make_model_params(seed, device):
    torch.manual_seed(seed)
    conv = torch.nn.ConvTranspose3d(CIN, COUT, 3, stride=2, padding=1, output_padding=OUTPUT_PADDING)
    multiplier = torch.randn(COUT, 1, 1, 1)
    return (conv.weight.detach().to(device), conv.bias.detach().to(device), multiplier.to(device))


def eager_chain(x, weight, bias, multiplier):
    y = F.conv_transpose3d(x, weight, bias, stride=2, padding=1, output_padding=OUTPUT_PADDING)
    y = F.leaky_relu(y, SLOPE1)
    y = y * multiplier
    y = F.leaky_relu(y, SLOPE2)
    return F.max_pool3d(y, kernel_size=2)


def reference64(x, weight, bias, multiplier):
    args = (x.double(), weight.double(), bias.double(), multiplier.double())
    try:
        return eager_chain(*args)
    except RuntimeError:  # a float64 conv the GPU backend does not offer: do it on the CPU
        return eager_chain(*(a.cpu() for a in args)).to(x.device)


def errors(a, ref):
    diff = a.double() - ref
    return {
        "rel_l2": (torch.linalg.vector_norm(diff) / torch.linalg.vector_norm(ref)).item(),
        "max_abs": diff.abs().max().item(),
        "nonfinite": int((~torch.isfinite(a)).sum().item()),
    }


def time_fn(fn, inputs, reps, warmup):
    """Median milliseconds of one call, cycling through ``inputs`` so successive calls read cold input."""
    for i in range(warmup):
        fn(inputs[i % len(inputs)])
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        fn(inputs[i % len(inputs)])
        ends[i].record()
    torch.cuda.synchronize()
    times = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    return statistics.median(times), min(times)


def config_str(cfg):
    if cfg is None:
        return "-"
    kw = ",".join(f"{k}={v}" for k, v in cfg.kwargs.items())
    return f"{kw},num_warps={cfg.num_warps},num_stages={cfg.num_stages}"


def run_batch(cpt, batch, args, device):
    weight, bias, multiplier = make_model_params(args.seed, device)
    m1d = multiplier.reshape(-1)
    weight_bf, bias_bf, m1d_bf = weight.bfloat16(), bias.bfloat16(), m1d.bfloat16()

    gen = torch.Generator(device=device).manual_seed(args.seed + batch)
    x_bytes = batch * CIN * D * H * W * 4
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 * 2**20) or 50 * 2**20
    n_inputs = int(min(256, max(4, math.ceil(3 * l2 / x_bytes))))
    xs = [torch.randn(batch, CIN, D, H, W, device=device, generator=gen) for _ in range(n_inputs)]
    xs_bf = [x.bfloat16() for x in xs]

    def ours(allow_tf32, with_offsets=False, bf16=False):
        if bf16:
            return lambda x: cpt.conv_transpose3d_post_pool_triton(x, weight_bf, bias_bf, m1d_bf, SLOPE1, SLOPE2,
                                                                   OUTPUT_PADDING, allow_tf32, with_offsets)
        return lambda x: cpt.conv_transpose3d_post_pool_triton(x, weight, bias, m1d, SLOPE1, SLOPE2, OUTPUT_PADDING,
                                                               allow_tf32, with_offsets)

    def eager(x):
        return eager_chain(x, weight, bias, multiplier)

    def eager_bf16(x):
        return eager_chain(x, weight_bf, bias_bf, multiplier.bfloat16())

    # --- accuracy (the first call of each of ours also autotunes) ---
    x0 = xs[0]
    ref = reference64(x0, weight, bias, multiplier)
    ref_bf_inputs = reference64(xs_bf[0], weight_bf, bias_bf, multiplier.bfloat16())
    acc = {}
    cudnn_tf32 = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = True
        acc["eager cuDNN tf32"] = errors(eager(x0), ref)
        torch.backends.cudnn.allow_tf32 = False
        acc["eager cuDNN fp32"] = errors(eager(x0), ref)
    finally:
        torch.backends.cudnn.allow_tf32 = cudnn_tf32
    configs = {}
    acc["ours tf32"] = errors(ours(True)(x0), ref)
    configs["ours tf32"] = config_str(cpt.last_config())
    acc["ours ieee"] = errors(ours(False)(x0), ref)
    configs["ours ieee"] = config_str(cpt.last_config())
    out_bf = ours(False, bf16=True)(xs_bf[0])
    configs["ours bf16"] = config_str(cpt.last_config())
    acc["ours bf16"] = errors(out_bf, ref)
    acc["ours bf16 (vs fp64 of the bf16-rounded inputs)"] = errors(out_bf, ref_bf_inputs)
    acc["eager bf16"] = errors(eager_bf16(xs_bf[0]), ref)
    out_o, _, offsets = ours(True, with_offsets=True)(x0)
    configs["ours tf32 +offsets"] = config_str(cpt.last_config())
    acc["ours tf32 +offsets"] = errors(out_o, ref)
    acc["ours tf32 +offsets"]["offsets_in_range"] = bool(int(offsets.max()) <= 7)
    del ref, ref_bf_inputs, out_bf, out_o, offsets

    print(f"\n## batch {batch}: x {[batch, CIN, D, H, W]}, {n_inputs} rotated inputs")
    for name, e in acc.items():
        extra = "" if "offsets_in_range" not in e else f"  offsets_in_range={e['offsets_in_range']}"
        print(f"  accuracy {name:<50s} rel_l2={e['rel_l2']:.3e}  max_abs={e['max_abs']:.3e}  "
              f"nonfinite={e['nonfinite']}{extra}")
    for name, c in configs.items():
        print(f"  autotuned config {name:<20s} {c}")

    # --- timing ---
    variants = [
        ("eager (cuDNN tf32 default)", eager, xs),
        ("eager bf16", eager_bf16, xs_bf),
        ("ours tf32", ours(True), xs),
        ("ours ieee", ours(False), xs),
        ("ours bf16", ours(False, bf16=True), xs_bf),
        ("ours tf32 +offsets", ours(True, with_offsets=True), xs),
    ]
    timings = {}
    torch.backends.cudnn.benchmark = True
    for name, fn, inputs in variants:
        med, best = time_fn(fn, inputs, args.reps, args.warmup)
        timings[name] = {"median_ms": med, "min_ms": best}
        print(f"  time {name:<28s} median {med * 1e3:9.1f} us   min {best * 1e3:9.1f} us", flush=True)
    return {"batch": batch, "n_inputs": n_inputs, "accuracy": acc, "configs": configs, "timings": timings}


def markdown(results):
    acc_key = {"eager (cuDNN tf32 default)": "eager cuDNN tf32"}
    lines = ["| batch | variant | median us | min us | speedup vs eager | rel_l2 vs fp64 | max_abs vs fp64 |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    for r in results:
        base = r["timings"]["eager (cuDNN tf32 default)"]["median_ms"]
        for name, t in r["timings"].items():
            e = r["accuracy"].get(acc_key.get(name, name))
            rel = f"{e['rel_l2']:.2e}" if e else "-"
            mx = f"{e['max_abs']:.2e}" if e else "-"
            lines.append(f"| {r['batch']} | {name} | {t['median_ms'] * 1e3:.1f} | {t['min_ms'] * 1e3:.1f} | "
                         f"{base / t['median_ms']:.2f}x | {rel} | {mx} |")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("conv_post_pool_triton_gpu: needs a CUDA device", file=sys.stderr)
        return 2
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("conv_post_pool_triton_gpu: unset TRITON_INTERPRET to benchmark the compiled kernel", file=sys.stderr)
        return 2
    cpt = load_kernel_module()
    import triton

    device = torch.device("cuda")
    env = {
        "device": torch.cuda.get_device_name(device), "torch": torch.__version__, "triton": triton.__version__,
        "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(), "python": platform.python_version(),
        "configs": [config_str(c) for c in cpt._CONFIGS],
    }
    print(" ".join(f"{k}={v}" for k, v in env.items() if k != "configs"))
    print("autotune candidates:", "; ".join(env["configs"]))
    results = [run_batch(cpt, b, args, device) for b in args.batches]

    table = markdown(results)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / "conv_post_pool_triton_gpu.json"
        path.write_text(json.dumps({"env": env, "results": results, "table": table}, indent=2))
        print(f"\nwrote {path}")
    print()
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
