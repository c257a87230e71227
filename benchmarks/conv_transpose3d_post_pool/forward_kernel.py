"""Builds the fused transposed-convolution CUDA kernel alone (csrc/conv_transpose3d_post_pool/cuda/ plus a small binding),
checks it against eager float64 and times it against cuDNN's convolution and the Triton op, in one process.

    python3 benchmarks/conv_transpose3d_post_pool/forward_kernel.py [--check] [--time] [--profile] [--out DIR]

--check   correctness: random data against float64 (relative L2 beside cuDNN's), integer data (exact conv values,
          so out/selected/offsets must equal eager's float32 chain bit for bit), NaN/inf, -inf windows, tails,
          output_padding combinations, channels_last_3d, batch 0/1, both slopes, negative multipliers.
--time    device time per call (CUDA-graph replays, median of blocks) at the KernelBench size.
--profile one call of each timed configuration (for ncu / compute-sanitizer to wrap).
Only the kernel's own sources are built, so half-finished edits elsewhere in the tree cannot break a run.
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


def build(verbose=False):
    return harness.build("conv_transpose3d_post_pool_forward", repo=REPO, verbose=verbose)


# ---------------------------------------------------------------------------------------------------------------
# References
# ---------------------------------------------------------------------------------------------------------------
def conv64(x, w, b, op):
    return F.conv_transpose3d(x.double(), w.double(), None if b is None else b.double(), stride=2, padding=1,
                              output_padding=tuple(op))


def pool_chain(y, m, s1, s2):
    """Eager epilogue and max_pool3d with indices on y (any dtype): (out, selected conv value, window offset)."""
    e = F.leaky_relu(F.leaky_relu(y, s1) * m.to(y.dtype).reshape(1, -1, 1, 1, 1), s2)
    out, idx = F.max_pool3d(e, 2, 2, return_indices=True)
    sel = y.flatten(2).gather(2, idx.flatten(2)).view_as(out)
    OH, OW = y.shape[3], y.shape[4]
    od, oh, ow = idx // (OH * OW), (idx // OW) % OH, idx % OW
    return out, sel, (((od % 2) * 2 + oh % 2) * 2 + ow % 2).to(torch.uint8)


def cudnn_chain(x, w, b, m, s1, s2, op, tf32):
    old = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = tf32
    try:
        y = F.conv_transpose3d(x, w, b, stride=2, padding=1, output_padding=tuple(op))
    finally:
        torch.backends.cudnn.allow_tf32 = old
    return pool_chain(y, m, s1, s2)[0]


def rel_l2(a, ref):
    a, ref = a.double(), ref.double()
    return ((a - ref).norm() / ref.norm()).item()


def same_bits(a, b):
    """Equal values (0 == -0), NaN where the other has NaN."""
    a, b = a.double(), b.double()
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


# ---------------------------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------------------------
DTYPES = {"tf32": (torch.float32, True), "fp32": (torch.float32, False), "bf16": (torch.bfloat16, True),
          "fp16": (torch.float16, True)}


def make(N, Cin, Cout, D, H, W, dtype, ints=False, cl_x=False, cl_w=False, bias=True, mult="chan", seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    if ints:
        x = torch.randint(-3, 4, (N, Cin, D, H, W), generator=g, device="cuda").to(dtype)
        w = torch.randint(-2, 3, (Cin, Cout, 3, 3, 3), generator=g, device="cuda").to(dtype)
        b = torch.randint(-2, 3, (Cout,), generator=g, device="cuda").to(dtype) if bias else None
        m = torch.randint(-2, 3, (Cout,), generator=g, device="cuda").to(dtype) * 0.5
    else:
        x = torch.randn((N, Cin, D, H, W), generator=g, device="cuda").to(dtype)
        w = (torch.randn((Cin, Cout, 3, 3, 3), generator=g, device="cuda") / (27 * max(Cin, 1)) ** 0.5).to(dtype)
        b = torch.randn((Cout,), generator=g, device="cuda").to(dtype) * 0.1 if bias else None
        m = torch.randn((Cout,), generator=g, device="cuda").to(dtype)
    if mult == "one":
        m = m[:1].reshape(1, 1, 1, 1)
    elif mult == "pos":
        m = m.abs() + 0.5
    elif mult == "neg":
        m = -(m.abs() + 0.5)
    if mult != "one":
        m = m.reshape(Cout, 1, 1, 1)
    if cl_x:
        x = x.contiguous(memory_format=torch.channels_last_3d)
    if cl_w:
        w = w.contiguous(memory_format=torch.channels_last_3d)
    return x, w, b, m.contiguous()


class Checker:
    def __init__(self, ext):
        self.ext, self.fails, self.n = ext, [], 0

    def expect(self, ok, what):
        self.n += 1
        if not ok:
            self.fails.append(what)
            print("FAIL", what, flush=True)

    def call(self, x, w, b, m, s1, s2, op, prec, train, cl_out=False, mt=0):
        return self.ext.run(x, w, b, m, s1, s2, list(op), DTYPES[prec][1], train, cl_out, mt)

    def exact_case(self, prec, shape, op, s1=0.1, s2=0.2, train=True, cl=False, mult="chan", bias=True, mt=0,
                   neg_inf=False, seed=0):
        """Integer data: conv values are exact in every summation order, so the kernel must reproduce the float32
        (or io-dtype-rounded) eager chain exactly: out, selected and offsets."""
        dtype = DTYPES[prec][0]
        N, Cin, Cout, D, H, W = shape
        x, w, b, m = make(N, Cin, Cout, D, H, W, dtype, ints=True, cl_x=cl, cl_w=cl, bias=bias, mult=mult,
                          seed=seed)
        if neg_inf:
            # -inf inputs with positive weights: every phase of the windows over them is -inf.
            w = w.abs() + 1
            x = x.clone()
            x.view(-1)[:: 7] = float("-inf")
            if b is not None:
                b = b.abs()
        res = self.call(x, w, b, m, s1, s2, op, prec, train, cl_out=cl, mt=mt)
        y = conv64(x, w, b, op).to(dtype).float()  # exact: small integers
        ref_out, ref_sel, ref_off = pool_chain(y, m.float(), s1, s2)
        tag = f"exact {prec} {shape} op={op} s=({s1},{s2}) train={train} cl={cl} mult={mult} bias={bias} mt={mt}"
        if neg_inf:
            tag += " -inf"
        self.expect(tuple(res[0].shape) == tuple(ref_out.shape), tag + " shape")
        if tuple(res[0].shape) != tuple(ref_out.shape):
            return
        self.expect(same_bits(res[0].float(), ref_out.to(dtype).float()), tag + " out")
        if cl:
            self.expect(res[0].is_contiguous(memory_format=torch.channels_last_3d), tag + " out layout")
        if train:
            self.expect(same_bits(res[1].float(), ref_sel.to(dtype).float()), tag + " selected")
            self.expect(bool((res[2] == ref_off).all()), tag + " offsets")

    def random_case(self, prec, shape, op, s1=0.01, s2=0.01, train=False, cl=False, mult="chan", mt=0, seed=1,
                    specials=None):
        dtype, tf32 = DTYPES[prec]
        N, Cin, Cout, D, H, W = shape
        x, w, b, m = make(N, Cin, Cout, D, H, W, dtype, cl_x=cl, cl_w=cl, mult=mult, seed=seed)
        if specials == "x":
            x = x.clone()
            x.view(-1)[:: 101] = float("nan")
            x.view(-1)[3:: 211] = float("inf")
            x.view(-1)[5:: 307] = float("-inf")
        elif specials == "w":
            # an infinite weight on a k=0 tap: the missing neighbour of the last window (output_padding 1) meets it
            w = w.clone()
            w[0, 0, 0, 1, 1] = float("inf")
            w[min(1, Cin - 1), min(1, Cout - 1), 1, 0, 2] = float("nan")
        res = self.call(x, w, b, m, s1, s2, op, prec, train, cl_out=cl, mt=mt)
        y64 = conv64(x, w, b, op)
        ref_out, ref_sel, ref_off = pool_chain(y64, m.double(), s1, s2)
        out = res[0].double()
        tag = f"random {prec} {shape} op={op} s=({s1},{s2}) train={train} cl={cl} mult={mult} mt={mt} sp={specials}"
        fin = ref_out.isfinite()
        self.expect(bool((out.isnan() == ref_out.isnan()).all()), tag + " NaN pattern")
        self.expect(bool((out[ref_out.isinf()] == ref_out[ref_out.isinf()]).all()), tag + " infinities")
        err = rel_l2(out[fin], ref_out[fin]) if fin.any() else 0.0
        bound = {"tf32": 3e-3, "fp32": 1e-6, "bf16": 2e-2, "fp16": 4e-3}[prec]
        self.expect(err <= bound, tag + f" rel_l2 {err:.3g} > {bound}")
        if train:
            sel = res[1].double()
            self.expect(bool((sel.isnan() == ref_sel.isnan()).all()) or specials is not None, tag + " sel NaN")
            agree = (res[2] == ref_off).double().mean().item()
            # (half precision rounds the conv values, which creates ties the float64 reference does not have)
            floor = 0.97 if dtype == torch.float32 else 0.8
            self.expect(agree > floor or specials is not None, tag + f" offsets agree {agree:.4f}")
            self.expect(bool((res[2] <= 7).all()), tag + " offsets written")
        return err


def run_checks(ext):
    c = Checker(ext)
    small = (2, 3, 5, 5, 7, 9)
    ops = [(1, 1, 1), (0, 0, 0), (1, 0, 1), (0, 1, 0)]
    for prec in DTYPES:
        for op in ops:
            for train in (True, False):
                c.exact_case(prec, small, op, train=train)
        c.exact_case(prec, small, (1, 1, 1), cl=True)
        c.exact_case(prec, small, (0, 1, 1), cl=True, train=False)
        c.exact_case(prec, small, (1, 1, 1), s1=-0.5, s2=0.3)
        c.exact_case(prec, small, (1, 1, 1), s1=0.0, s2=0.0, train=False)
        # the epilogue's one-max leaky: slopes at the ends of (0, 1], and beyond it
        c.exact_case(prec, small, (1, 1, 1), s1=1.0, s2=1.0)
        c.exact_case(prec, small, (1, 1, 1), s1=1.5, s2=0.25)
        c.exact_case(prec, small, (1, 1, 1), s1=0.25, s2=3.0, neg_inf=True)
        c.exact_case(prec, small, (1, 1, 1), s1=1e-50, s2=0.2, train=False)  # 0.0f: not monotone
        c.exact_case(prec, small, (1, 1, 1), train=False, mult="neg")
        c.exact_case(prec, small, (1, 1, 1), train=False, mult="pos", bias=False)
        c.exact_case(prec, small, (1, 1, 1), train=False, mult="one")
        c.exact_case(prec, small, (1, 1, 1), train=True, mult="one", bias=False)
        c.exact_case(prec, small, (1, 1, 1), neg_inf=True)
        c.exact_case(prec, small, (1, 1, 1), neg_inf=True, train=False, mult="pos")
        for mt in (1, 2):
            c.exact_case(prec, (1, 16, 32, 9, 9, 17), (1, 1, 1), mt=mt, train=mt == 1)
        # tails of Cin and Cout, several chunks (Cin 64 / 128)
        for cin, cout in ((1, 3), (3, 1), (17, 33), (33, 17), (64, 64), (128, 128), (16, 32)):
            c.exact_case(prec, (1, cin, cout, 3, 4, 5), (1, 0, 1), train=cin % 2 == 1)
        # spatial 1, non-square, batch 0 and 1
        c.exact_case(prec, (2, 4, 6, 1, 1, 1), (1, 1, 1))
        c.exact_case(prec, (1, 4, 6, 2, 1, 3), (1, 1, 0), train=False)
        res = c.call(*make(0, 4, 6, 3, 3, 3, DTYPES[prec][0])[:4], 0.1, 0.1, (1, 1, 1), prec, True)
        c.expect(tuple(res[0].shape) == (0, 6, 3, 3, 3), f"batch 0 {prec}")
        res = c.call(*make(2, 4, 6, 1, 3, 3, DTYPES[prec][0])[:4], 0.1, 0.1, (0, 1, 1), prec, True)
        c.expect(tuple(res[0].shape) == (2, 6, 0, 3, 3), f"empty pooled extent {prec}")
        # random data, specials
        for train in (False, True):
            c.random_case(prec, (2, 16, 32, 6, 10, 18), (1, 1, 1), train=train)
            c.random_case(prec, (2, 5, 7, 4, 5, 6), (1, 0, 1), train=train, s1=0.3, s2=-0.2)
        for sp in ("x", "w"):
            c.random_case(prec, (2, 6, 10, 5, 6, 7), (1, 1, 1), specials=sp, train=True)
            c.random_case(prec, (2, 6, 10, 5, 6, 7), (1, 1, 1), specials=sp, train=False, mult="pos")
            c.random_case(prec, (2, 6, 10, 5, 6, 7), (1, 1, 1), specials=sp, train=True, s1=1.0, s2=0.5)
    print(f"checks: {c.n - len(c.fails)} / {c.n} passed", flush=True)
    return c


def accuracy_table(ext):
    """KernelBench size: relative L2 against float64 beside cuDNN's, per precision."""
    rows = []
    s = KB
    for prec in DTYPES:
        dtype, tf32 = DTYPES[prec]
        x, w, b, m = make(s["N"], s["Cin"], s["Cout"], s["D"], s["H"], s["W"], dtype, seed=3)
        ref = pool_chain(conv64(x, w, b, s["op"]), m.double(), 0.01, 0.01)[0]
        ours = ext.run(x, w, b, m, 0.01, 0.01, list(s["op"]), tf32, False, False, 0)[0]
        ours_t = ext.run(x, w, b, m, 0.01, 0.01, list(s["op"]), tf32, True, False, 0)
        ref_off = pool_chain(conv64(x, w, b, s["op"]), m.double(), 0.01, 0.01)[2]
        cud = cudnn_chain(x, w, b, m, 0.01, 0.01, s["op"], tf32)
        rows.append(dict(prec=prec, ours=rel_l2(ours, ref), ours_train=rel_l2(ours_t[0], ref), cudnn=rel_l2(cud, ref),
                         offsets_agree=(ours_t[2] == ref_off).double().mean().item()))
    return rows


# ---------------------------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------------------------




def configs():
    s = KB
    out = []
    for prec, train, N in (("tf32", False, 16), ("bf16", False, 16), ("fp16", False, 16), ("fp32", False, 16),
                           ("tf32", True, 16), ("bf16", True, 16), ("tf32", False, 1)):
        out.append((prec, train, N, s))
    return out


def time_all(ext, mts=(0,)):
    rows = []
    for prec, train, N, s in configs():
        dtype, tf32 = DTYPES[prec]
        sets = [make(N, s["Cin"], s["Cout"], s["D"], s["H"], s["W"], dtype, seed=10 + i) for i in range(4)]
        shape = (N, s["Cout"]) + tuple(v - 1 + o for v, o in zip((s["D"], s["H"], s["W"]), s["op"]))
        out = torch.empty(shape, device="cuda", dtype=dtype)
        sel = torch.empty_like(out) if train else None
        off = torch.empty(shape, device="cuda", dtype=torch.uint8) if train else None
        row = dict(prec=prec, train=train, N=N)
        for mt in mts:
            k = [0]

            def ours():
                x, w, b, m = sets[k[0] % 4]
                k[0] += 1
                ext.run_into(x, w, b, m.reshape(-1), 0.01, 0.01, list(s["op"]), tf32, out, sel, off, mt)

            try:
                row[f"ours_mt{mt}"] = graph_us(ours)
            except RuntimeError as e:
                print("graph capture of our launcher failed:", repr(e)[:300], flush=True)
                row[f"ours_mt{mt}"] = stream_us(ours)

        def cudnn():
            x, w, b, m = sets[0]
            F.conv_transpose3d(x, w, b, stride=2, padding=1, output_padding=s["op"])

        old = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = tf32
        row["cudnn_conv"] = graph_us(cudnn)
        torch.backends.cudnn.allow_tf32 = old
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def profile_once(ext):
    s = KB
    for prec, train, N, _ in configs():
        dtype, tf32 = DTYPES[prec]
        x, w, b, m = make(N, s["Cin"], s["Cout"], s["D"], s["H"], s["W"], dtype, seed=5)
        ext.run(x, w, b, m, 0.01, 0.01, list(s["op"]), tf32, train, False, 0)
    torch.cuda.synchronize()


def sanitize_cases(ext):
    """A few small calls covering every code path (precisions, both forms, chunked Cin, tails, the missing-neighbour
    fix-up) for compute-sanitizer to run."""
    c = Checker(ext)
    for prec in DTYPES:
        c.exact_case(prec, (1, 3, 5, 3, 4, 5), (1, 0, 1), train=True)
        c.exact_case(prec, (1, 3, 5, 3, 4, 5), (1, 1, 1), train=False, mult="pos", cl=True)
        c.exact_case(prec, (1, 70, 40, 2, 3, 3), (1, 1, 1), train=True)
        c.random_case(prec, (1, 4, 6, 3, 4, 5), (1, 1, 1), specials="w", train=True)
        c.random_case(prec, (2, 6, 10, 5, 6, 7), (1, 1, 1), specials="w", train=True, seed=2)
    c.exact_case("tf32", (1, 16, 32, 9, 9, 17), (1, 1, 1), mt=2, train=False)
    print(f"sanitize cases: {c.n - len(c.fails)} / {c.n} passed", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--sanitize", action="store_true")
    ap.add_argument("--mts", default="0")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()
    ext = build(a.verbose)
    report = {}
    if a.profile:
        profile_once(ext)
        return
    if a.sanitize:
        sanitize_cases(ext)
        return
    if a.check:
        c = run_checks(ext)
        report["checks"] = dict(passed=c.n - len(c.fails), total=c.n, fails=c.fails)
        report["accuracy"] = accuracy_table(ext)
    if a.time:
        report["timing"] = time_all(ext, tuple(int(v) for v in a.mts.split(",")))
    with open(os.path.join(a.out, "forward_kernel.json"), "w") as f:
        json.dump(report, f, indent=1)
    if "accuracy" in report:
        print("\nprec  rel_l2 ours / ours train / cuDNN   offsets agree (train, vs float64)")
        for r in report["accuracy"]:
            print(f"{r['prec']:5} {r['ours']:.3e} / {r['ours_train']:.3e} / {r['cudnn']:.3e}   "
                  f"{r['offsets_agree']:.5f}")
    if "timing" in report:
        print("\nprec  train N   " + "  ".join(k for k in report["timing"][0] if k not in ("prec", "train", "N")))
        for r in report["timing"]:
            vals = "  ".join(f"{v:9.1f}" for k, v in r.items() if k not in ("prec", "train", "N"))
            print(f"{r['prec']:5} {int(r['train'])}     {r['N']:2}  {vals}")
    if "checks" in report:
        print(f"\nchecks: {report['checks']['passed']} / {report['checks']['total']} passed")
        for f_ in report["checks"]["fails"][:30]:
            print("  FAIL", f_)


if __name__ == "__main__":
    main()
