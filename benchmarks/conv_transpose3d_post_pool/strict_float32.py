"""The fused convolution in strict float32 (TF32 off): its error against float64 beside cuDNN float32's, input
channel by input channel, and its device time at the KernelBench size beside cuDNN's convolution and the eager chain.

    python benchmarks/conv_transpose3d_post_pool/strict_float32.py [--cins 1,2,3,...] [--no-time]

Error: relative L2 of the pooled output against the float64 chain on the same float32 operands (random input,
weights scaled by 1/sqrt(fan-in), positive multipliers, batch 2, input 8 x 12 x 10), for the fused op and for the
eager chain with cuDNN's float32 convolution; *ratio* is ours over cuDNN's (issue 29: at most 3 at every Cin 1-64).
Time: CUDA-graph replays, median µs, batch 16 at the KernelBench size.
"""
from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F

import torch_fused_ops  # noqa: F401  (registers the ops)
from torch_fused_ops.tools.timing import graph_us

SLOPE = 0.2
CINS = (1, 2, 3, 4, 8, 12, 16, 17, 24, 32, 33, 40, 48, 56, 64)


def chain(y, m):
    return F.max_pool3d(F.leaky_relu(F.leaky_relu(y, SLOPE) * m, SLOPE), 2)


def op(x, w, b, m):
    return torch.ops.fused.conv_transpose3d_post_pool(x, w, b, [2, 2, 2], [1, 1, 1], [1, 1, 1], 1, [1, 1, 1], m,
                                                      SLOPE, [2, 2, 2])


def eager(x, w, b, m):
    return chain(F.conv_transpose3d(x, w, b, stride=2, padding=1, output_padding=1), m)


def operands(n, cin, dhw, seed, device="cuda"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, cin, *dhw, generator=g)
    w = torch.randn(cin, 32, 3, 3, 3, generator=g) / math.sqrt(cin * 8)
    b = torch.randn(32, generator=g) * 0.5
    m = torch.rand(32, 1, 1, 1, generator=g) + 0.5
    return [t.to(device) for t in (x, w, b, m)]


def rel_l2(a, ref):
    return ((a.double().cpu() - ref).norm() / ref.norm()).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cins", default=",".join(map(str, CINS)))
    ap.add_argument("--no-time", action="store_true")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, strict float32 (TF32 off)")
    print("\n| Cin | rel L2 fused | rel L2 cuDNN float32 | ratio |\n| ---: | ---: | ---: | ---: |")
    worst = 0.0
    for cin in (int(c) for c in args.cins.split(",")):
        x, w, b, m = operands(2, cin, (8, 12, 10), seed=cin)
        ref = chain(F.conv_transpose3d(x.double().cpu(), w.double().cpu(), b.double().cpu(), stride=2, padding=1,
                                       output_padding=1), m.double().cpu())
        ours, theirs = rel_l2(op(x, w, b, m), ref), rel_l2(eager(x, w, b, m), ref)
        worst = max(worst, ours / theirs)
        print(f"| {cin} | {ours:.2e} | {theirs:.2e} | {ours / theirs:.2f} |", flush=True)
    print(f"\nworst ratio: {worst:.2f} (target <= 3)")
    if args.no_time:
        return
    x, w, b, m = operands(16, 16, (16, 32, 32), seed=0)
    rows = [("fused op, strict float32", graph_us(lambda: op(x, w, b, m))),
            ("cuDNN conv_transpose3d alone, float32", graph_us(
                lambda: F.conv_transpose3d(x, w, b, stride=2, padding=1, output_padding=1))),
            ("eager chain, float32", graph_us(lambda: eager(x, w, b, m)))]
    print("\n| batch 16, KernelBench size | device us |\n| --- | ---: |")
    for name, us in rows:
        print(f"| {name} | {us:.1f} |")


if __name__ == "__main__":
    main()
