"""Builds the fused convolution's backward kernels alone (csrc/conv_transpose3d_post_pool/cuda/grad_conv.cu and grad_weight/ plus a
small binding), checks them against eager float64 autograd and times them against cuDNN, in one process.

    python3 benchmarks/conv_transpose3d_post_pool/backward_kernels.py [--check] [--time] [--profile] [--out DIR]

--check   grad_conv bit for bit against eager's float32 chain rule; grad_bias / grad_multiplier and grad_weight
          against float64 autograd of conv_transpose3d on the scattered full-resolution gradient, with cuDNN's own
          error beside ours; odd sizes, channel tails, output_padding mixes, channels_last_3d, N = 0, NaN/inf,
          determinism (two calls bit-equal).
--time    device time per call at the KernelBench size (CUDA-graph replays, median of blocks), cuDNN's weight
          gradient on the full-resolution gradient beside it, and both weight gradients' relative L2 error against
          float64 at that size.
--profile one call of each precision (for ncu to wrap); with --small, of a small shape with channel tails and
          edges in every precision instead (for compute-sanitizer's memcheck / racecheck, which are slow).
"""
from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F

from torch_fused_ops.tools import harness
from torch_fused_ops.tools.timing import graph_us

# The tree this script is in (its kernel sources), which may be another checkout than the installed package's.
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KB = dict(N=16, Cin=16, Cout=32, D=16, H=32, W=32, op=(1, 1, 1))


def build():
    return harness.build("conv_transpose3d_post_pool_backward", repo=REPO)


def grad_conv_ref(go, sel, m, s1, s2):
    """Eager's float32 chain rule at the selected tap (leaky_relu_backward, mul, leaky_relu_backward)."""
    g = torch.zeros_like(go) + go
    mm = m.reshape(1, -1, 1, 1, 1).to(go.dtype)
    x = sel
    y1 = torch.where(x > 0, x, x * s1)
    y2 = y1 * mm
    gy2 = torch.where(y2 > 0, g, g * s2)
    gy1 = gy2 * mm
    gx = torch.where(x > 0, gy1, gy1 * s1)
    return gx, gy2 * y1


def scatter_full(gc, off, conv_size):
    """The full-resolution gradient: gc at (2q + offset bits), zero elsewhere, in float64."""
    N, C, PD, PH, PW = gc.shape
    Y = torch.zeros(conv_size, dtype=torch.float64, device=gc.device)
    o = off.long()
    jd, jh, jw = o // 4, (o // 2) % 2, o % 2
    n, c, qd, qh, qw = torch.meshgrid(*[torch.arange(s, device=gc.device) for s in gc.shape], indexing="ij")
    Y[n, c, 2 * qd + jd, 2 * qh + jh, 2 * qw + jw] = gc.double()
    return Y


def weight_grad_of(x, Y, w_shape, op, dtype, tf32):
    """d/dw of (conv_transpose3d(x, w) * Y).sum() (eager; float64 or cuDNN in dtype)."""
    w = torch.zeros(w_shape, dtype=dtype, device=x.device, requires_grad=True)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=tf32):
        y = F.conv_transpose3d(x.to(dtype), w, stride=2, padding=1, output_padding=tuple(op))
        y.backward(Y.to(dtype))
    return w.grad


def rel_l2(a, ref):
    a, ref = a.double(), ref.double()
    return ((a - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def make_case(N, Cin, Cout, D, H, W, op, dtype, cl=False, seed=0, special=False, dev="cuda"):
    g = torch.Generator(device="cpu").manual_seed(seed)
    PD, PH, PW = D - 1 + op[0], H - 1 + op[1], W - 1 + op[2]
    x = torch.randn(N, Cin, D, H, W, generator=g).to(dev, dtype)
    go = torch.randn(N, Cout, PD, PH, PW, generator=g).to(dev, dtype)
    sel = torch.randn(N, Cout, PD, PH, PW, generator=g).to(dev, dtype)
    off = torch.randint(0, 8, (N, Cout, PD, PH, PW), generator=g, dtype=torch.uint8).to(dev)
    m = (torch.randn(Cout, generator=g) + 0.5).to(dev, dtype)
    if special and go.numel() > 8:
        go.view(-1)[:3] = torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=dtype)
        sel.view(-1)[3:5] = torch.tensor([float("nan"), -float("inf")], dtype=dtype)
    if cl:
        x = x.contiguous(memory_format=torch.channels_last_3d)
        go = go.contiguous(memory_format=torch.channels_last_3d)
        sel = sel.contiguous(memory_format=torch.channels_last_3d)
        off = off.contiguous(memory_format=torch.channels_last_3d)
    return x, go, sel, off, m


def check(ext):
    fails = []
    cases = [
        dict(N=2, Cin=16, Cout=32, D=6, H=9, W=18, op=(1, 1, 1)),
        dict(N=1, Cin=5, Cout=7, D=3, H=5, W=20, op=(0, 1, 0)),
        dict(N=3, Cin=19, Cout=33, D=4, H=4, W=5, op=(1, 0, 1)),
        dict(N=1, Cin=1, Cout=1, D=2, H=2, W=2, op=(0, 0, 0)),
        dict(N=0, Cin=4, Cout=8, D=3, H=3, W=3, op=(1, 1, 1)),
        dict(N=2, Cin=32, Cout=64, D=5, H=7, W=33, op=(1, 1, 0)),
    ]
    for dtype, tf32 in ((torch.float32, False), (torch.float32, True), (torch.bfloat16, False), (torch.float16, False)):
        for ci, c in enumerate(cases):
            for cl in (False, True):
                x, go, sel, off, m = make_case(**c, dtype=dtype, cl=cl, seed=ci)
                s1, s2 = 0.2, 0.2 if ci % 2 == 0 else 0.05
                tag = f"{dtype} tf32={tf32} {c} cl={cl}"
                gc, gb, gm = ext.grad_conv(go, sel, off, m, s1, s2)
                gx_ref, gm_contrib = grad_conv_ref(go.float(), sel.float(), m.float(), s1, s2)
                if not torch.equal(gc, gx_ref.to(dtype)):
                    fails.append(f"grad_conv not bit-equal: {tag}")
                gb_ref = gc.double().sum((0, 2, 3, 4))
                gm_ref = gm_contrib.double().sum((0, 2, 3, 4))
                tol = 1e-5 if dtype == torch.float32 else 1e-2
                for name, a, r in (("grad_bias", gb, gb_ref), ("grad_multiplier", gm, gm_ref)):
                    if a.numel() and not torch.allclose(a.double(), r.to(dtype).double(), rtol=tol, atol=tol * 10):
                        fails.append(f"{name} mismatch {tag}: {(a.double() - r).abs().max().item()}")
                conv_size = (c["N"], c["Cout"], 2 * c["D"] - 1 + c["op"][0], 2 * c["H"] - 1 + c["op"][1],
                             2 * c["W"] - 1 + c["op"][2])
                Y = scatter_full(gc, off, conv_size)
                w_shape = (c["Cin"], c["Cout"], 3, 3, 3)
                gw = ext.grad_weight(gc, off, x, c["Cout"], list(c["op"]), tf32)
                gw2 = ext.grad_weight(gc, off, x, c["Cout"], list(c["op"]), tf32)
                if not torch.equal(gw, gw2) and not (gw.isnan().any()):
                    fails.append(f"grad_weight not deterministic {tag}")
                ref = weight_grad_of(x.double(), Y, w_shape, c["op"], torch.double, False)
                own = weight_grad_of(x, Y, w_shape, c["op"], dtype, tf32)
                if gw.isnan().any():
                    fails.append(f"grad_weight has NaN (unwritten?) {tag}")
                    continue
                if c["N"] == 0:
                    if not torch.equal(gw, torch.zeros_like(gw)):
                        fails.append(f"grad_weight of an empty batch is not zero {tag}")
                    continue
                e_ours, e_cudnn = rel_l2(gw, ref), rel_l2(own, ref)
                limit = 1.5 * e_cudnn + (2e-6 if dtype == torch.float32 else 1e-3)
                status = "ok" if e_ours <= limit else "FAIL"
                print(f"grad_weight {status} rel L2 {e_ours:.2e} (cuDNN {e_cudnn:.2e}) {tag}", flush=True)
                if status != "ok":
                    fails.append(f"grad_weight error {e_ours:.2e} > {limit:.2e} {tag}")
        # NaN / inf propagate into grad_conv as eager's chain rule gives them.
        x, go, sel, off, m = make_case(2, 8, 16, 4, 4, 17, (1, 1, 1), dtype, special=True)
        gc, gb, gm = ext.grad_conv(go, sel, off, m, 0.2, 0.2)
        ref, _ = grad_conv_ref(go.float(), sel.float(), m.float(), 0.2, 0.2)
        if not torch.equal(gc.isnan(), ref.to(dtype).isnan()) or not torch.equal(
                torch.nan_to_num(gc.float()), torch.nan_to_num(ref.to(dtype).float())):
            fails.append(f"grad_conv special values differ {dtype}")
    print(f"check: {len(fails)} failures")
    for f in fails[:40]:
        print("  ", f)
    return fails




def time_all(ext, out):
    rows = []
    c = KB
    for dtype, tf32, name in ((torch.float32, True, "TF32"), (torch.bfloat16, False, "bf16"),
                              (torch.float16, False, "fp16"), (torch.float32, False, "strict")):
        x, go, sel, off, m = make_case(c["N"], c["Cin"], c["Cout"], c["D"], c["H"], c["W"], c["op"], dtype)
        gc, gb, gm = ext.grad_conv(go, sel, off, m, 0.2, 0.2)
        gw = torch.empty(c["Cin"], c["Cout"], 3, 3, 3, device="cuda", dtype=dtype)
        t_gc = graph_us(lambda: ext.grad_conv(go, sel, off, m, 0.2, 0.2))
        t_gw = graph_us(lambda: ext.grad_weight_into(gc, off, x, list(c["op"]), tf32, gw))
        conv_size = (c["N"], c["Cout"], 32, 64, 64)
        Y = scatter_full(gc, off, conv_size).to(dtype)
        wt = torch.randn(c["Cin"], c["Cout"], 3, 3, 3, device="cuda", dtype=dtype)

        def cudnn_wgrad():
            torch.ops.aten.convolution_backward(Y, x, wt, None, [2, 2, 2], [1, 1, 1], [1, 1, 1], True, [1, 1, 1], 1,
                                                [False, True, False])
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=tf32):
            t_cd = graph_us(cudnn_wgrad)
        esz = x.element_size()
        gc_bytes = go.numel() * (3 * esz + 1)
        # Accuracy at this size: ours and cuDNN's (on the same full-resolution gradient) against float64.
        w_shape = (c["Cin"], c["Cout"], 3, 3, 3)
        Y64 = scatter_full(gc, off, conv_size)
        ref = weight_grad_of(x.double(), Y64, w_shape, c["op"], torch.double, False)
        e_ours = rel_l2(ext.grad_weight(gc, off, x, c["Cout"], list(c["op"]), tf32), ref)
        e_cudnn = rel_l2(weight_grad_of(x, Y64, w_shape, c["op"], dtype, tf32), ref)
        del Y64, ref
        rows.append(dict(precision=name, grad_conv_us=t_gc, grad_weight_us=t_gw, cudnn_wgrad_full_res_us=t_cd,
                         grad_conv_floor_us=gc_bytes / 4.2e12 * 1e6, dense_gflop=7.25, grad_weight_rel_l2=e_ours,
                         cudnn_wgrad_rel_l2=e_cudnn))
        print(f"{name:7s} grad_conv {t_gc:7.1f} us (floor {gc_bytes / 4.2e12 * 1e6:5.1f})  grad_weight {t_gw:7.1f} us"
              f"  cuDNN wgrad on full-res {t_cd:7.1f} us  grad_weight rel L2 {e_ours:.2e} (cuDNN {e_cudnn:.2e})",
              flush=True)
    if out:
        with open(os.path.join(out, "conv_backward_kernels.json"), "w") as f:
            json.dump(rows, f, indent=1)
    return rows


def profile(ext, small=False):
    c = dict(N=2, Cin=19, Cout=33, D=4, H=5, W=20, op=(1, 0, 1)) if small else dict(KB)
    precisions = ((torch.float32, True), (torch.float32, False), (torch.bfloat16, False))
    if small:
        precisions += ((torch.float16, False),)
    for dtype, tf32 in precisions:
        x, go, sel, off, m = make_case(c["N"], c["Cin"], c["Cout"], c["D"], c["H"], c["W"], c["op"], dtype)
        gc, gb, gm = ext.grad_conv(go, sel, off, m, 0.2, 0.2)
        ext.grad_weight(gc, off, x, c["Cout"], list(c["op"]), tf32)
    torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    ext = build()
    rc = 0
    if a.check:
        rc |= bool(check(ext))
    if a.time:
        time_all(ext, a.out)
    if a.profile:
        profile(ext, a.small)
    return int(rc)


if __name__ == "__main__":
    raise SystemExit(main())
