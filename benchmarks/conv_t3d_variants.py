"""Launch configurations of the fused convolution kernels on CUDA, at the KernelBench size, in one run.

    python benchmarks/conv_t3d_variants.py [--quick] [--kernels ref,t1,gemm,phase,shipped]

For each kernel (phase-exact `_conv_post_pool_triton`, packed-GEMM `_conv_post_pool_gemm_triton`, phase-split
GEMM `_conv_post_pool_phase_gemm_triton`) and each
config: kernel time (block timer, packed weight and output preallocated), relative L2 error against a float64
reference, and whether it compiled. cuDNN's transposed convolution alone and the eager composite are timed in
the same run, with cuDNN's own TF32 error, so the rows can be read against them. A table comes last.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import traceback

import torch
import torch.nn.functional as F

# Run it after the extension is built, not beside the build: host-bound launches time wrong on a busy CPU.
from torch_fused_ops import _conv_post_pool_gemm_triton as gemm
from torch_fused_ops import _conv_post_pool_phase_gemm_triton as phase
from torch_fused_ops import _conv_post_pool_triton as exact
from torch_fused_ops._timing import median_us

if os.environ.get("VARIANTS_ONCE") == "1":
    # Under Nsight Compute: one launch per config, no timing loop (ncu serialises and replays every launch).
    def median_us(fn, device, **_):  # noqa: F811
        fn()
        return float("nan")

S1 = 0.2


def reference(x, w, b, m, op):
    y = F.conv_transpose3d(x.double(), w.double(), b.double(), stride=2, padding=1, output_padding=op)
    e = F.leaky_relu(F.leaky_relu(y, S1) * m.double().view(1, -1, 1, 1, 1), S1)
    return F.max_pool3d(e, 2, 2)


def rel_err(o, r):
    return ((o.double() - r).norm() / r.norm()).item()


def composite(x, w, b, m, op):
    y = F.conv_transpose3d(x, w, b, stride=2, padding=1, output_padding=op)
    return F.max_pool3d(F.leaky_relu(F.leaky_relu(y, S1) * m.view(1, -1, 1, 1, 1), S1), 2, 2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--dhw", default="16,32,32",
                    help="input D,H,W (pooled output: D,H,W with output_padding 1); e.g. 16,31,31 for a pooled "
                         "width that is not a multiple of 16")
    ap.add_argument("--kernels", default="ref,t1,gemm,phase,shipped",
                    help="comma list: ref (cuDNN, eager), t1 (phase-exact, with its launcher), t1k (phase-exact "
                         "kernel alone, exact and monotone), gemm (packed; gemm1: first config only), "
                         "phase (phase-split), "
                         "shipped (the inference launcher)")
    args = ap.parse_args()
    kernels = set(args.kernels.split(","))
    torch.manual_seed(0)
    dev = "cuda"
    n = args.batch
    op = [1, 1, 1]
    dhw = [int(v) for v in args.dhw.split(",")]
    x32 = torch.randn(n, 16, *dhw, device=dev)
    w32 = torch.randn(16, 32, 3, 3, 3, device=dev) / math.sqrt(16 * 27) * 2
    b32 = torch.randn(32, device=dev) * 0.1
    m32 = torch.randn(32, device=dev)
    ref = reference(x32, w32, b32, m32, op)
    rows = []

    def add(name, dtype, us, err, note=""):
        rows.append((name, dtype, us, err, note))
        print(f"{name:58s} {dtype:6s} {us:9.1f} us  err {err:.2e} {note}", flush=True)

    def timed(name, tag, fn, out):
        # One row: poison the output, run once for the error, then time; a failed compile or launch is a row too.
        try:
            out.fill_(float("nan"))
            o = fn()
            add(name, tag, median_us(fn, torch.device(dev)), rel_err(o, ref))
        except Exception as e:  # noqa: BLE001
            msg = str(e).strip().splitlines()
            add(name, tag, float("nan"), float("nan"), "FAIL " + (msg[-1] if msg else "")[:100])
            if "--verbose" in sys.argv:
                traceback.print_exc()

    # cuDNN and eager, same run.
    for dt, tf32 in ((torch.float32, True), (torch.float32, False), (torch.bfloat16, False)) if "ref" in kernels else ():
        torch.backends.cudnn.allow_tf32 = tf32
        xs, ws, bs, ms = (t.to(dt) for t in (x32, w32, b32, m32))
        tag = "tf32" if (dt == torch.float32 and tf32) else ("fp32" if dt == torch.float32 else "bf16")
        conv_us = median_us(lambda: F.conv_transpose3d(xs, ws, bs, stride=2, padding=1, output_padding=op),
                            torch.device(dev))
        add("cuDNN conv_transpose3d alone", tag, conv_us, float("nan"))
        eager_us = median_us(lambda: composite(xs, ws, bs, ms, op), torch.device(dev))
        add("eager composite (conv + chain)", tag, eager_us, rel_err(composite(xs, ws, bs, ms, op), ref))
    torch.backends.cudnn.allow_tf32 = True

    # Phase-exact kernel, as the launcher calls it.
    for dt, tf32 in ((torch.float32, True), (torch.float32, False), (torch.bfloat16, False)) if "t1" in kernels else ():
        xs, ws, bs, ms = (t.to(dt) for t in (x32, w32, b32, m32))
        tag = "tf32" if (dt == torch.float32 and tf32) else ("fp32" if dt == torch.float32 else "bf16")
        try:
            fn = lambda: exact.conv_transpose3d_post_pool_triton(xs, ws, bs, ms, S1, S1, op, tf32, False)  # noqa: E731
            o = fn()
            add("phase-exact t1 (incl. weight pack, launcher)", tag, median_us(fn, torch.device(dev)), rel_err(o, ref))
        except Exception as e:  # noqa: BLE001
            add("phase-exact t1", tag, float("nan"), float("nan"), "FAIL " + str(e)[:80])

    # Phase-exact kernel alone (weight packed beforehand), exact and monotone form: the monotone form's inference
    # candidate (offline, Triton 3.8: bf16 132 registers exact, 203 monotone; TF32 216 / 252).
    for dt, tf32 in ((torch.float32, True), (torch.bfloat16, False)) if "t1k" in kernels else ():
        xs, ws, bs, ms = (t.to(dt) for t in (x32, w32, b32, m32))
        tag = "tf32" if dt == torch.float32 else "bf16"
        wp = exact._pack_weight(ws, 16, 32, dt, tf32)
        for mono in (False, True):
            fn = lambda mono=mono: exact.conv_transpose3d_post_pool_triton(  # noqa: E731
                xs, ws, bs, ms, S1, S1, op, tf32, False, mono=mono, w_packed=wp)
            timed(f"phase-exact t1 kernel (weight packed){' monotone' if mono else ''}", tag, fn,
                  torch.empty(1, device=dev))  # the launcher allocates its output: nothing to poison here

    # Packed-GEMM kernel: (BM, BK, warps, stages, weight stored K-major, round A to TF32[, output channels per
    # program]). The shipped config first (_conv_triton_op._CONFIGS), then the runners-up of earlier
    # sweeps. Dropped after losing there: 8 or 16 channels per program (TF32 170-256 us, bf16 112-171 us against
    # 141 / 115-153 us), a persistent variant (bf16 225-249 us; TF32 out of shared memory; the phase-split
    # GEMM's persistent variant likewise: TF32 246 against 190 us, bf16 182-298 against 108-112 us) and Triton's
    # tf32x3 for strict float32 (532-579 us; the phase-split kernel's three-TF32 split: 303 us).
    K, R = True, False
    configs = {
        "tf32": [(64, 32, 4, 3, K, True), (64, 16, 4, 3, K, True), (64, 16, 4, 4, K, True), (128, 16, 8, 3, K, True)],
        "bf16": [(64, 64, 4, 3, R, False), (128, 64, 8, 3, R, False), (64, 32, 4, 3, K, False),
                 (64, 64, 4, 3, K, False)],
        "fp32": [],
    }
    # Offline sm_90 compiles (benchmarks/triton_resources.py, Triton 3.8): TF32 BM64 4 warps 32 channels 190
    # registers, 16 channels 146; bf16 BM64 212 / 168; none spills. ck < 16 failed to compile on Triton 3.6 (K >= 16
    # per dot).
    # Phase-split GEMM: (BM, channels per K chunk, warps, stages, output channels per program, K-major weight,
    # precision override, the training forward's selected/offsets outputs, monotone form). The monotone form (one
    # max per phase, the epilogue once) is what the inference launcher asks for (except strict float32); offline
    # (Triton 3.8) it takes TF32 from 192 to 255 registers with an 88-byte spill, bf16 from 221 to 241.
    M = True
    phase_configs = {
        "tf32": [(64, 16, 4, 1, 32, K, None, False, False), (64, 16, 4, 1, 32, K, None, False, M),
                 (64, 16, 4, 1, 16, K, None, False, M), (64, 16, 8, 1, 32, K, None, False, M),
                 (64, 16, 4, 1, 32, K, None, True, False)],
        "bf16": [(64, 16, 4, 1, 32, K, None, False, False), (64, 16, 4, 1, 32, K, None, False, M),
                 (64, 16, 4, 1, 32, R, None, False, M), (64, 16, 8, 1, 32, K, None, False, M),
                 (64, 16, 4, 1, 16, R, None, False, M)],
        # "3xtf32": our own three-TF32 split, which keeps infinities exact. Triton's own "tf32x3" dot (infinite
        # inputs become NaN) on the finite inputs plus a TF32 dot for the others measured the same (301.5 against
        # 302.8 us) and was removed.
        "fp32": [(64, 16, 4, 1, 32, K, "3xtf32", False, False), (64, 16, 4, 1, 32, K, "3xtf32", False, M),
                 (64, 16, 8, 1, 32, K, "3xtf32", False, M), (64, 16, 4, 1, 16, K, "3xtf32", False, M)],
    }
    if args.quick:
        configs = {k: v[:2] for k, v in configs.items()}
        phase_configs = {k: v[:2] for k, v in phase_configs.items()}
    for dt, tf32 in ((torch.float32, True), (torch.bfloat16, False), (torch.float32, False)):
        xs, ws, bs, ms = (t.to(dt) for t in (x32, w32, b32, m32))
        tag = "tf32" if (dt == torch.float32 and tf32) else ("fp32" if dt == torch.float32 else "bf16")
        out = torch.empty(n, 32, *dhw, device=dev, dtype=dt)
        # "gemm1": only the first config of each dtype (the shipped one), for a same-run comparison.
        gemm_rows = configs[tag] if "gemm" in kernels else configs[tag][:1] if "gemm1" in kernels else ()
        for bm, bk, nw, ns, kmajor, round_a in gemm_rows:
            wp = gemm.pack_weight(ws, 16, 32, dt, tf32 and round_a, kmajor)
            name = f"gemm bm{bm} bk{bk} w{nw} s{ns}{' kmajor' if kmajor else ''}{' rna' if round_a else ''}"
            timed(name, tag, lambda: gemm.conv_transpose3d_post_pool_gemm(
                xs, ws, bs, ms, S1, S1, op, tf32, out=out, w_packed=wp, bm=bm, bk=bk, num_warps=nw, num_stages=ns,
                round_a=round_a, w_kmajor=kmajor), out)
        for bm, ck, nw, ns, bnc, kmajor, precision, offs, mono in phase_configs[tag] if "phase" in kernels else ():
            wp = phase.pack_weight(ws, 16, bnc, dt, tf32, kmajor, split3=precision == "3xtf32")
            name = (f"phase-split bm{bm} ck{ck} w{nw} s{ns} cout/program {bnc}{' kmajor' if kmajor else ''}"
                    f"{f' {precision}' if precision else ''}{' +offsets' if offs else ''}{' monotone' if mono else ''}")
            sel = torch.empty_like(out) if offs else None
            offsets = torch.empty(out.shape, device=dev, dtype=torch.uint8) if offs else None
            timed(name, tag, lambda: phase.launch(
                xs, wp, bs, ms, S1, S1, out, op, tf32=tf32, kmajor=kmajor, cin_p=16, bnc=bnc, bm=bm, ck=ck,
                num_warps=nw, num_stages=ns, selected=sel, offsets=offsets, precision=precision, mono=mono), out)
        if "shipped" not in kernels:
            continue
        # What ships: the inference launcher (packing and kernel choice included), eager.
        from torch_fused_ops import _conv_triton_op

        fn = lambda: _conv_triton_op.launch(xs, ws, bs, ms, S1, S1, op, tf32)  # noqa: E731
        try:
            o = fn()
            add("shipped inference launch (incl. packing)", tag, median_us(fn, torch.device(dev)), rel_err(o, ref))
        except Exception as e:  # noqa: BLE001
            add("shipped inference launch", tag, float("nan"), float("nan"), "FAIL " + str(e)[:80])

    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, batch {n}, input D,H,W {dhw}\n")
    print("| kernel / config | dtype | median us | rel. L2 error vs float64 | note |")
    print("| --- | --- | ---: | ---: | --- |")
    for name, dt, us, err, note in rows:
        print(f"| {name} | {dt} | {us:.1f} | {err:.2e} | {note} |")


if __name__ == "__main__":
    main()
