"""The fused convolution's sm_90a (wgmma) forward kernel against its mma.sync kernel, in one process: agreement,
accuracy against float64 beside cuDNN's, and device time, per precision and form.

    python benchmarks/conv_transpose3d_post_pool/hopper_forward.py [--batches 16,1] \
        [--precisions tf32,bf16,fp16,mixed,autocast,strict] [--split auto|units|halves] [--once [--train]]

Both kernels run through the operator (torch.ops.fused), switched by torch_fused_ops._C._conv_forward_kernel (2: the
sm_90a kernel wherever it can run, 1: mma.sync; the operators' own choice, 0, takes the faster of the two by size). *agree*: the fraction of outputs bit-equal between the kernels (the
summation order differs, so not all are); *rel L2*: against the float64 chain on the same (rounded) operands, cuDNN's
own convolution in the same precision beside it. Device time: CUDA-graph replays, median. *autocast*: the mixed form
on float32 operands through fused._conv_transpose3d_post_pool_cast (what torch.autocast's kernel calls): the sm_90a
kernel rounds them as it loads them, the mma.sync column casts them first (three cast kernels), inference only.
*strict*: float32 with TF32 off (torch.backends.cudnn.allow_tf32 = False, for cuDNN too), inference only: the
three-product split on both kernels (strict float32's training form runs the mma.sync kernel).
--split: how the sm_90a kernel hands out work (torch_fused_ops._C._conv_hopper_split): by units, by half units (one
tile per consumer), or the launcher's choice (halves where there are fewer units than blocks).
--once: two inference calls of the sm_90a kernel per precision at the first batch and nothing else, for Nsight Compute
(`ncu -k regex:hopper --launch-skip 1 --launch-count 1 ...`; stall_ledger.py reads its source page); with --train, the
training form's calls instead (autocast has none).
--ablate: instead, the sm_90a kernel's device time with parts of it left out (torch_fused_ops._C._conv_hopper_ablation:
its outputs are then wrong), per precision and form at the first batch: what each part costs on its own and what the
kernel costs without it. A part whose removal saves little is hidden behind the others. Needs a measurement build,
`TORCH_FUSED_OPS_HOPPER_ABLATION=1 python3 -m pip install --no-build-isolation --no-deps -e .` (the branches cost the
product kernel registers, so it has none).
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import torch_fused_ops
from torch_fused_ops import _C
from torch_fused_ops.tools.timing import graph_us

SLOPE = 0.2
KB = dict(Cin=16, Cout=32, D=16, H=32, W=32)


def chain(y, m):
    return F.max_pool3d(F.leaky_relu(F.leaky_relu(y, SLOPE) * m, SLOPE), 2)


def op(x, w, b, m, train, cast_to=None):
    if cast_to is not None:
        return (torch.ops.fused._conv_transpose3d_post_pool_cast(x, w, b, cast_to, [2, 2, 2], [1, 1, 1], [1, 1, 1], 1,
                                                                  [1, 1, 1], m, SLOPE, [2, 2, 2]),)
    args = (x, w, b, [2, 2, 2], [1, 1, 1], [1, 1, 1], 1, [1, 1, 1], m, SLOPE, [2, 2, 2])
    if train:
        return torch.ops.fused.conv_transpose3d_post_pool_with_offsets(*args)
    return (torch.ops.fused.conv_transpose3d_post_pool(*args),)


def rel_l2(a, ref):
    return ((a.double() - ref).norm() / ref.norm()).item()


DTYPES = {"tf32": torch.float32, "strict": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
          "mixed": torch.bfloat16, "autocast": torch.bfloat16}
# Precisions with an inference form only on the sm_90a kernel (strict float32's training form runs mma.sync).
INFERENCE_ONLY = ("autocast", "strict")


def inputs_cast(precision):
    """The dtype the autocast row's op rounds its float32 operands to (None for the others)."""
    return DTYPES[precision] if precision == "autocast" else None


def case_inputs(batch, precision):
    """x, w, b, m at the KernelBench size: in the precision's dtype (float32 for autocast), m float32 for the mixed
    forms."""
    dt = DTYPES[precision]
    op_dt = torch.float32 if inputs_cast(precision) is not None else dt
    torch.manual_seed(0)
    x = torch.randn(batch, KB["Cin"], KB["D"], KB["H"], KB["W"], device="cuda").to(op_dt)
    w = (torch.randn(KB["Cin"], KB["Cout"], 3, 3, 3, device="cuda") / (KB["Cin"] * 27) ** 0.5).to(op_dt)
    b = torch.randn(KB["Cout"], device="cuda").to(op_dt)
    m = torch.randn(KB["Cout"], 1, 1, 1, device="cuda")
    m = m if precision in ("mixed", "autocast") else m.to(dt)
    return x, w, b, m


def case(batch, precision, train):
    # strict: float32 with TF32 off, for the op and cuDNN alike.
    torch.backends.cudnn.allow_tf32 = precision != "strict"
    cast_to = inputs_cast(precision)
    x, w, b, m = case_inputs(batch, precision)
    outs = {}
    for name, choice in (("wgmma", 2), ("mma.sync", 1)):
        prev = _C._conv_forward_kernel(choice)
        try:
            outs[name] = op(x, w, b, m, train, cast_to)
            us = graph_us(lambda: op(x, w, b, m, train, cast_to))
        finally:
            _C._conv_forward_kernel(prev)
        outs[name + "_us"] = us
    if cast_to is not None:  # the reference and cuDNN on the rounded operands
        x, w, b = (t.to(cast_to) for t in (x, w, b))
    y64 = F.conv_transpose3d(x.double(), w.double(), b.double(), stride=2, padding=1, output_padding=1)
    ref = chain(y64, m.double())
    cudnn = chain(F.conv_transpose3d(x, w, b, stride=2, padding=1, output_padding=1), m)
    new, old = outs["wgmma"], outs["mma.sync"]
    agree = [(a == o).float().mean().item() for a, o in zip(new, old)]
    return dict(batch=batch, precision=precision, form="training" if train else "inference",
                wgmma_us=outs["wgmma_us"], mma_us=outs["mma.sync_us"], agree=agree,
                l2_new=rel_l2(new[0], ref), l2_old=rel_l2(old[0], ref), l2_cudnn=rel_l2(cudnn, ref),
                nan_new=int(new[0].isnan().sum()), finite_ref=bool(ref.isfinite().all()))


# (name, bits): parts left out (csrc/conv_transpose3d_post_pool/ablation.h: 1 epilogue, 2 wgmma, 4 staging).
ABLATIONS = (("whole kernel", 0), ("without the epilogue", 1), ("without the wgmma", 2), ("without the staging", 4),
             ("wgmma only", 1 | 4), ("epilogue only", 2 | 4), ("staging only", 1 | 2), ("skeleton", 7))


def ablate(batch, precisions):
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, batch {batch}: sm_90a kernel, device us "
          "(CUDA-graph replays, median)")
    print("| precision | form | " + " | ".join(name for name, _ in ABLATIONS) + " |")
    print("| --- | --- |" + " ---: |" * len(ABLATIONS))
    prev_kernel = _C._conv_forward_kernel(2)
    try:
        for precision in precisions:
            cast_to = inputs_cast(precision)
            x, w, b, m = case_inputs(batch, precision)
            torch.backends.cudnn.allow_tf32 = precision != "strict"
            for train in (False,) if precision in INFERENCE_ONLY else (False, True):
                row = []
                for _, bits in ABLATIONS:
                    prev = _C._conv_hopper_ablation(bits)
                    try:
                        row.append(graph_us(lambda: op(x, w, b, m, train, cast_to)))
                    finally:
                        _C._conv_hopper_ablation(prev)
                print(f"| {precision} | {'training' if train else 'inference'} | "
                      + " | ".join(f"{v:.1f}" for v in row) + " |", flush=True)
    finally:
        _C._conv_forward_kernel(prev_kernel)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="16,1")
    ap.add_argument("--precisions", default="tf32,bf16,fp16,mixed,autocast,strict")
    ap.add_argument("--once", action="store_true")
    ap.add_argument("--ablate", action="store_true")
    ap.add_argument("--train", action="store_true", help="with --once: the training form")
    ap.add_argument("--split", default="auto", choices=["auto", "units", "halves"])
    args = ap.parse_args()
    _C._conv_hopper_split({"auto": 0, "units": 1, "halves": 2}[args.split])
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    if args.once:
        batch = int(args.batches.split(",")[0])
        _C._conv_forward_kernel(2)
        for precision in args.precisions.split(","):
            torch.backends.cudnn.allow_tf32 = precision != "strict"
            inputs = case_inputs(batch, precision)
            for _ in range(2):
                op(*inputs, args.train, inputs_cast(precision))
        torch.cuda.synchronize()
        return
    if args.ablate:
        return ablate(int(args.batches.split(",")[0]), args.precisions.split(","))
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; sm_90a work split: {args.split}")
    print("| batch | precision | form | wgmma us | mma.sync us | speed-up | bit-equal (out, sel, off) | rel L2 wgmma "
          "| mma.sync | cuDNN |")
    print("| ---: | --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    for batch in (int(v) for v in args.batches.split(",")):
        for precision in args.precisions.split(","):
            for train in (False,) if precision in INFERENCE_ONLY else (False, True):
                r = case(batch, precision, train)
                print(f"| {batch} | {precision} | {r['form']} | {r['wgmma_us']:.1f} | {r['mma_us']:.1f} | "
                      f"{r['mma_us'] / r['wgmma_us']:.2f} | {', '.join(f'{a:.4f}' for a in r['agree'])} | "
                      f"{r['l2_new']:.2e} | {r['l2_old']:.2e} | {r['l2_cudnn']:.2e} |", flush=True)


if __name__ == "__main__":
    main()
