"""Builds the fused convolution's input-gradient kernel alone (csrc/conv_transpose3d_post_pool/cuda/grad_input/ plus a small
binding), checks it against a float64 reference and times it against cuDNN, in one process.

    python3 benchmarks/conv_transpose3d_post_pool/grad_input_kernel.py [--check] [--time] [--profile] [--sanitize] [--out DIR]

The reference: scatter grad_conv to the full-resolution conv gradient Y (Y[n, co, 2q + offset bits] = grad_conv,
zero elsewhere, size 2 D - 1 + op per dim); grad_input = conv3d(Y, weight, stride 2, padding 1) in float64 (the
input gradient of conv_transpose3d; --check verifies that identity through autograd and the contract's per-tap sum).
--check   random data (relative L2 beside cuDNN's conv3d on Y in the same precision), NaN-poisoned outputs, odd
          sizes, Cin/Cout tails, output_padding combinations, channels_last_3d, batch 0/1, NaN/inf in grad_conv
          and in the weight, determinism (two runs bit-equal).
--time    device time per call at the KernelBench size (CUDA-graph replays, median), beside cuDNN on Y.
--profile one call per precision at the KernelBench size (for ncu).
--sanitize small calls over every code path (for compute-sanitizer).
Environment: GI_NVCC_FLAGS (extra nvcc flags, e.g. -D settings of a variant) and GI_NAME_SUFFIX (its module name).
"""
from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F

from torch_fused_ops.tools import harness
from torch_fused_ops.tools.timing import graph_us, stream_us

# The tree this script is in (its kernel sources), which may be another checkout than the installed package's.
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KB = dict(N=16, Cin=16, Cout=32, D=16, H=32, W=32, op=(1, 1, 1))  # KernelBench level 2 problem 74
MODEL_GFLOP = 2 * 16 * 16 * 32 * 32 * 16 * 32 * 27 / 1e9  # dense-equivalent: 2 * positions * Cin * Cout * 27
PEAK_TFLOPS = {"tf32": 495, "fp32": 495 / 3, "bf16": 990, "fp16": 990}
DTYPES = {"tf32": (torch.float32, True), "fp32": (torch.float32, False), "bf16": (torch.bfloat16, True),
          "fp16": (torch.float16, True)}


def build(verbose=False):
    # GI_NVCC_FLAGS / GI_NAME_SUFFIX: a variant of the kernel (compile-time settings) built as its own module
    return harness.build("conv_transpose3d_post_pool_grad_input", repo=REPO,
                         module_suffix=os.environ.get("GI_NAME_SUFFIX", ""),
                         extra_cuda_cflags=os.environ.get("GI_NVCC_FLAGS", "").split(), verbose=verbose)


# ---------------------------------------------------------------------------------------------------------------
# Data and references
# ---------------------------------------------------------------------------------------------------------------
def pooled(D, H, W, op):
    return D - 1 + op[0], H - 1 + op[1], W - 1 + op[2]


def make(N, Cin, Cout, D, H, W, op, dtype, cl=False, cl_w=False, seed=0, device="cuda"):
    g = torch.Generator(device=device).manual_seed(seed)
    P = pooled(D, H, W, op)
    gc = torch.randn((N, Cout) + P, generator=g, device=device).to(dtype)
    off = torch.randint(0, 8, (N, Cout) + P, generator=g, device=device).to(torch.uint8)
    w = (torch.randn((Cin, Cout, 3, 3, 3), generator=g, device=device) / (3.375 * max(Cout, 1)) ** 0.5).to(dtype)
    if cl:
        gc = gc.contiguous(memory_format=torch.channels_last_3d)
        off = off.contiguous(memory_format=torch.channels_last_3d)
    if cl_w:
        w = w.contiguous(memory_format=torch.channels_last_3d)
    return gc, off, w


def scatter(gc, off, D, H, W, op):
    """The full-resolution conv gradient: Y[n, co, 2q + bits] = grad_conv at the offset's position, zero elsewhere
    (selected with where, so an infinite grad_conv value lands at its phase only)."""
    N, C, PD, PH, PW = gc.shape
    ph = torch.arange(8, device=gc.device, dtype=torch.uint8).view(1, 1, 1, 1, 1, 8)
    y = torch.where(off.unsqueeze(-1) == ph, gc.unsqueeze(-1), torch.zeros((), dtype=gc.dtype, device=gc.device))
    y = y.view(N, C, PD, PH, PW, 2, 2, 2).permute(0, 1, 2, 5, 3, 6, 4, 7).reshape(N, C, 2 * PD, 2 * PH, 2 * PW)
    S = (2 * D - 1 + op[0], 2 * H - 1 + op[1], 2 * W - 1 + op[2])
    pad = (0, S[2] - 2 * PW, 0, S[1] - 2 * PH, 0, S[0] - 2 * PD)
    return F.pad(y, pad)


def reference(gc, off, w, D, H, W, op):
    y = scatter(gc.double(), off, D, H, W, op)
    return F.conv3d(y, w.double(), stride=2, padding=1)


def cudnn_grad(gc, off, w, D, H, W, op, tf32):
    old = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = tf32
    try:
        return F.conv3d(scatter(gc, off, D, H, W, op), w, stride=2, padding=1)
    finally:
        torch.backends.cudnn.allow_tf32 = old


def per_tap_sum(gc, off, w, D, H, W, op):
    """The contract's definition, term by term in float64 (finite data): tap k per dim reads window q = i (k = 1, 2)
    or q = i - 1 (k = 0) where the offset's bit is 0 (k = 1) or 1 (k = 0, 2)."""
    gc, w = gc.double(), w.double()
    N, Cout = gc.shape[:2]
    Cin = w.shape[0]
    P = gc.shape[2:]
    out = torch.zeros((N, Cin, D, H, W), dtype=torch.float64, device=gc.device)
    sizes = (D, H, W)
    for kd in range(3):
        for kh in range(3):
            for kw in range(3):
                ks = (kd, kh, kw)
                bits = [0 if k == 1 else 1 for k in ks]
                phase = (bits[0] * 2 + bits[1]) * 2 + bits[2]
                masked = torch.where(off == phase, gc, torch.zeros((), dtype=gc.dtype, device=gc.device))
                # out[i] += w . masked[i - delta], delta = 1 for tap 0
                src, dst = [], []
                for k, n_in, n_p in zip(ks, sizes, P):
                    delta = 1 if k == 0 else 0
                    lo, hi = delta, min(n_in, n_p + delta)  # i with 0 <= i - delta < P
                    dst.append(slice(lo, max(hi, lo)))
                    src.append(slice(lo - delta, max(hi, lo) - delta))
                part = torch.einsum("ncdhw,ic->nidhw", masked[:, :, src[0], src[1], src[2]], w[:, :, kd, kh, kw])
                out[:, :, dst[0], dst[1], dst[2]] += part
    return out


def rel_l2(a, ref):
    a, ref = a.double(), ref.double()
    den = ref.norm().item()
    return (a - ref).norm().item() / (den if den > 0 else 1.0)


def bits_equal(a, b):
    if a.dtype == torch.float32:
        return torch.equal(a.view(torch.int32), b.view(torch.int32))
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


# ---------------------------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------------------------
BOUND = {"tf32": 3e-3, "fp32": 2e-6, "bf16": 1.5e-2, "fp16": 3e-3}


class Checker:
    def __init__(self, ext):
        self.ext, self.fails, self.n = ext, [], 0

    def expect(self, ok, what):
        self.n += 1
        if not ok:
            self.fails.append(what)
            print("FAIL", what, flush=True)

    def call(self, gc, off, w, D, H, W, op, prec, cl_out=False):
        return self.ext.run(gc, off, w, [D, H, W], list(op), DTYPES[prec][1], cl_out)

    def case(self, prec, shape, op, cl=False, cl_w=False, cl_out=False, seed=1, specials=None, determinism=False):
        dtype, tf32 = DTYPES[prec]
        N, Cin, Cout, D, H, W = shape
        # (specials are written into contiguous tensors, then the layouts are applied)
        gc, off, w = make(N, Cin, Cout, D, H, W, op, dtype, seed=seed)
        if specials == "g":
            gc = gc.clone()
            gc.view(-1)[::97] = float("nan")
            gc.view(-1)[3::89] = float("inf")
            gc.view(-1)[5::113] = float("-inf")
        elif specials == "w":
            w = w.clone()
            w[0, 0, 0, 1, 1] = float("inf")
            w[min(1, Cin - 1), min(1, Cout - 1), 1, 0, 2] = float("nan")
        if cl:
            gc = gc.contiguous(memory_format=torch.channels_last_3d)
            off = off.contiguous(memory_format=torch.channels_last_3d)
        if cl_w:
            w = w.contiguous(memory_format=torch.channels_last_3d)
        tag = (f"{prec} {shape} op={op} cl={cl} cl_w={cl_w} cl_out={cl_out} sp={specials}")
        res = self.call(gc, off, w, D, H, W, op, prec, cl_out)
        ref = reference(gc, off, w, D, H, W, op)
        self.expect(tuple(res.shape) == tuple(ref.shape), tag + " shape")
        if tuple(res.shape) != tuple(ref.shape):
            return None
        if cl_out:
            self.expect(res.is_contiguous(memory_format=torch.channels_last_3d), tag + " layout")
        out = res.double()
        nan_ok = bool((out.isnan() == ref.isnan()).all())
        if not nan_ok:
            cud = cudnn_grad(gc, off, w, D, H, W, op, tf32).double()
            print(f"  {tag}: NaN mismatches vs float64 {int((out.isnan() != ref.isnan()).sum())} of {ref.numel()}"
                  f" (ours NaN {int(out.isnan().sum())}, ref {int(ref.isnan().sum())}, cuDNN {int(cud.isnan().sum())};"
                  f" cuDNN vs ref mismatches {int((cud.isnan() != ref.isnan()).sum())})", flush=True)
        self.expect(nan_ok, tag + " NaN pattern")
        inf = ref.isinf()
        self.expect(bool((out[inf] == ref[inf]).all()), tag + " infinities")
        fin = ref.isfinite()
        self.expect(bool(out[fin].isfinite().all()), tag + " finite where the reference is")
        err = rel_l2(out[fin], ref[fin]) if fin.any() else 0.0
        bound = BOUND[prec]
        if err > bound and specials is None:
            # long sums (large Cout) grow every float32 accumulation's error: allow 1.5x cuDNN's own
            cud = cudnn_grad(gc, off, w, D, H, W, op, tf32).double()
            bound = max(bound, 1.5 * rel_l2(cud, ref))
        self.expect(err <= bound, tag + f" rel_l2 {err:.3g} > {bound:.3g}")
        if determinism:
            again = self.call(gc, off, w, D, H, W, op, prec, cl_out)
            self.expect(bits_equal(res, again), tag + " two runs bit-equal")
        return err


def identity_checks(c):
    """The reference's identity in float64: conv3d(Y, w, 2, 1) is conv_transpose3d's input gradient (autograd) and
    equals the contract's per-tap sum."""
    for shape, op in (((2, 3, 5, 4, 5, 6), (1, 1, 1)), ((1, 4, 3, 3, 4, 5), (0, 1, 0)), ((1, 2, 2, 1, 2, 3), (0, 0, 1))):
        N, Cin, Cout, D, H, W = shape
        gc, off, w = make(N, Cin, Cout, D, H, W, op, torch.float64, seed=7)
        ref = reference(gc, off, w, D, H, W, op)
        x = torch.zeros((N, Cin, D, H, W), dtype=torch.float64, device="cuda", requires_grad=True)
        y = F.conv_transpose3d(x, w, stride=2, padding=1, output_padding=op)
        yg = scatter(gc, off, D, H, W, op)
        c.expect(tuple(y.shape) == tuple(yg.shape), f"identity {shape} {op}: conv size")
        (gx,) = torch.autograd.grad(y, x, yg)
        c.expect(rel_l2(gx, ref) < 1e-12, f"identity {shape} {op}: autograd {rel_l2(gx, ref):.3g}")
        tap = per_tap_sum(gc, off, w, D, H, W, op)
        c.expect(rel_l2(tap, ref) < 1e-12, f"identity {shape} {op}: per-tap sum {rel_l2(tap, ref):.3g}")


def run_checks(ext):
    c = Checker(ext)
    identity_checks(c)
    ops = [(1, 1, 1), (0, 0, 0), (1, 0, 1), (0, 1, 0)]
    for prec in DTYPES:
        for op in ops:
            c.case(prec, (2, 3, 5, 5, 7, 9), op)
        c.case(prec, (2, 16, 32, 6, 10, 18), (1, 1, 1), determinism=True)
        c.case(prec, (1, 16, 32, 9, 17, 9), (0, 1, 1))
        # tails of Cin and Cout, several Cout chunks, several Cin blocks
        for cin, cout in ((1, 3), (3, 1), (17, 33), (33, 17), (64, 64), (40, 100), (16, 32)):
            c.case(prec, (1, cin, cout, 3, 4, 5), (1, 0, 1))
        # layouts
        c.case(prec, (2, 16, 32, 5, 6, 9), (1, 1, 1), cl=True, cl_w=True, cl_out=True)
        c.case(prec, (2, 5, 7, 4, 5, 6), (0, 1, 1), cl=True)
        c.case(prec, (2, 5, 7, 4, 5, 6), (1, 1, 0), cl_w=True, cl_out=True)
        # spatial 1 (and an empty pooled extent: grad_input is the zero gradient's convolution), batch 1
        c.case(prec, (2, 4, 6, 1, 1, 1), (1, 1, 1))
        c.case(prec, (1, 4, 6, 2, 1, 3), (1, 1, 0))
        gc, off, w = make(2, 4, 6, 1, 3, 3, (0, 1, 1), DTYPES[prec][0])
        res = c.call(gc, off, w, 1, 3, 3, (0, 1, 1), prec)
        c.expect(tuple(res.shape) == (2, 4, 1, 3, 3) and bool((res == 0).all()), f"empty pooled extent {prec}")
        gc, off, w = make(0, 4, 6, 3, 3, 3, (1, 1, 1), DTYPES[prec][0])
        res = c.call(gc, off, w, 3, 3, 3, (1, 1, 1), prec)
        c.expect(tuple(res.shape) == (0, 4, 3, 3, 3), f"batch 0 {prec}")
        # non-finite values
        for sp in ("g", "w"):
            c.case(prec, (2, 6, 10, 5, 6, 7), (1, 1, 1), specials=sp)
            c.case(prec, (1, 6, 10, 4, 5, 6), (0, 1, 0), specials=sp, cl=True)
    print(f"checks: {c.n - len(c.fails)} / {c.n} passed", flush=True)
    return c


def accuracy_table(ext):
    """KernelBench size: relative L2 against float64 beside cuDNN's conv3d on Y, per precision."""
    s = KB
    rows = []
    for prec in DTYPES:
        dtype, tf32 = DTYPES[prec]
        gc, off, w = make(s["N"], s["Cin"], s["Cout"], s["D"], s["H"], s["W"], s["op"], dtype, seed=3)
        ref = reference(gc, off, w, s["D"], s["H"], s["W"], s["op"])
        ours = ext.run(gc, off, w, [s["D"], s["H"], s["W"]], list(s["op"]), tf32, False)
        cud = cudnn_grad(gc, off, w, s["D"], s["H"], s["W"], s["op"], tf32)
        again = ext.run(gc, off, w, [s["D"], s["H"], s["W"]], list(s["op"]), tf32, False)
        rows.append(dict(prec=prec, ours=rel_l2(ours, ref), cudnn=rel_l2(cud, ref),
                         nan=int(ours.isnan().sum()), deterministic=bits_equal(ours, again)))
        del ref, cud
    return rows


# ---------------------------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------------------------




def time_all(ext):
    s = KB
    rows = []
    print(f"math: {MODEL_GFLOP:.2f} GFLOP dense-equivalent (2 * N*D*H*W * Cin * Cout * 27; 1/8 of it is non-zero)")
    for prec in DTYPES:
        dtype, tf32 = DTYPES[prec]
        sets = [make(s["N"], s["Cin"], s["Cout"], s["D"], s["H"], s["W"], s["op"], dtype, seed=10 + i)
                for i in range(3)]
        gi = torch.empty((s["N"], s["Cin"], s["D"], s["H"], s["W"]), device="cuda", dtype=dtype)
        k = [0]

        def ours():
            gc, off, w = sets[k[0] % 3]
            k[0] += 1
            ext.run_into(gc, off, w, list(s["op"]), tf32, gi)

        try:
            row = dict(prec=prec, ours_us=graph_us(ours))
        except RuntimeError as e:
            print("graph capture of our launcher failed:", repr(e)[:300], flush=True)
            row = dict(prec=prec, ours_us=stream_us(ours))
        gc, off, w = sets[0]
        y = scatter(gc, off, s["D"], s["H"], s["W"], s["op"])
        old = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = tf32
        try:
            row["cudnn_on_Y_us"] = graph_us(lambda: F.conv3d(y, w, stride=2, padding=1))
        finally:
            torch.backends.cudnn.allow_tf32 = old
        del y
        row["floor_us_at_peak"] = MODEL_GFLOP * 1e3 / PEAK_TFLOPS[prec]
        row["tflops_dense_equiv"] = MODEL_GFLOP * 1e3 / row["ours_us"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def profile_once(ext):
    s = KB
    for prec in DTYPES:
        dtype, tf32 = DTYPES[prec]
        gc, off, w = make(s["N"], s["Cin"], s["Cout"], s["D"], s["H"], s["W"], s["op"], dtype, seed=5)
        ext.run(gc, off, w, [s["D"], s["H"], s["W"]], list(s["op"]), tf32, False)
    torch.cuda.synchronize()


def sanitize_cases(ext):
    c = Checker(ext)
    for prec in DTYPES:
        c.case(prec, (1, 3, 5, 3, 4, 5), (1, 0, 1))
        c.case(prec, (1, 17, 40, 3, 9, 10), (1, 1, 1), cl=True, cl_out=True)
        c.case(prec, (1, 20, 70, 2, 3, 3), (0, 1, 1))
        c.case(prec, (1, 4, 6, 3, 4, 5), (1, 1, 1), specials="w")
    print(f"sanitize cases: {c.n - len(c.fails)} / {c.n} passed", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--sanitize", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()
    ext = build(a.verbose)
    if a.profile:
        profile_once(ext)
        return
    if a.sanitize:
        sanitize_cases(ext)
        return
    report = {}
    if a.check:
        c = run_checks(ext)
        report["checks"] = dict(passed=c.n - len(c.fails), total=c.n, fails=c.fails)
        report["accuracy"] = accuracy_table(ext)
    if a.time:
        report["timing"] = time_all(ext)
    with open(os.path.join(a.out, "conv_grad_input_kernel.json"), "w") as f:
        json.dump(report, f, indent=1)
    if "accuracy" in report:
        print("\nprec  rel_l2 ours / cuDNN (vs float64, KernelBench size)   NaN  deterministic")
        for r in report["accuracy"]:
            print(f"{r['prec']:5} {r['ours']:.3e} / {r['cudnn']:.3e}   {r['nan']}  {r['deterministic']}")
    if "timing" in report:
        print("\nprec  ours_us  cudnn_on_Y_us  floor_us_at_peak  TFLOP/s(dense-equiv)")
        for r in report["timing"]:
            print(f"{r['prec']:5} {r['ours_us']:8.1f} {r['cudnn_on_Y_us']:13.1f} {r['floor_us_at_peak']:16.1f}"
                  f" {r['tflops_dense_equiv']:10.1f}")
    if "checks" in report:
        print(f"\nchecks: {report['checks']['passed']} / {report['checks']['total']} passed")
        for f_ in report["checks"]["fails"][:40]:
            print("  FAIL", f_)


if __name__ == "__main__":
    main()
