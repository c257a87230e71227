"""Main demo: the unmodified KernelBench Model, eagerly and under torch.compile without and with our pass.

Shows that the pass matched (the compiled graph calls fused.post_pool), checks every variant against eager,
and prints timings. Runs at the KernelBench size (batch 16) on a GPU and at batch 1 on CPU, where it finishes
in well under a minute.

    python -m torch_fused_ops.tools.demo [--device cpu|cuda] [--batch N] [--no-compile]
"""
from __future__ import annotations

import argparse
import sys

import torch

import torch_fused_ops
from torch_fused_ops.tools.timing import median_us
from torch_fused_ops.models import DEFAULT_BATCH, DEFAULT_INPUT, ConvTransposeLeakyMulLeakyPool, fused_forward


def _compiled(model, x, use_pass: bool):
    """torch.compile(model) with the pass on or off; returns (fn, output, matches, code mentions post_pool)."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()  # Dynamo's cache does not key on Inductor's pass, so start clean
    before = torch_fused_ops.matched_count()
    with torch_fused_ops.fusion_enabled(use_pass):
        fn = torch.compile(model)
        with torch.no_grad():
            out, code = run_and_get_code(fn, x)
    return fn, out, torch_fused_ops.matched_count() - before, any("post_pool" in c for c in code)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=None, help="default: 16 on GPU, 1 on CPU")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    batch = args.batch or (DEFAULT_BATCH if device.type == "cuda" else 1)

    torch.manual_seed(0)
    model = ConvTransposeLeakyMulLeakyPool().to(device)
    x = torch.randn(batch, 16, *DEFAULT_INPUT, device=device)
    print(f"torch {torch.__version__}, torch_fused_ops {torch_fused_ops.__version__}, device {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
          + f", input {list(x.shape)}, CUDA kernels built: {torch_fused_ops.has_cuda_kernels()}", flush=True)

    ok = True
    with torch.no_grad():
        ref = model(x)
        y = model.conv_transpose(x)  # the same conv output into both epilogues: bit-exact check of the op
        s = model.leaky_relu.negative_slope
        epi_exact = torch.equal(torch_fused_ops.reference_post_pool(y, model.multiplier, s, 2),
                                torch_fused_ops.post_pool(y, model.multiplier, s, 2))
    print(f"fused.post_pool on the conv output: bit-identical to the eager epilogue: {epi_exact}")
    ok &= epi_exact

    reps = 30 if device.type == "cuda" else 5
    rows = []
    with torch.no_grad():
        rows.append(("eager Model", median_us(lambda: model(x), device, reps=reps)))
        out = fused_forward(model, x)
        ok &= _report("conv + fused.post_pool called by hand", out, ref)
        rows.append(("conv + fused.post_pool called by hand", median_us(lambda: fused_forward(model, x), device,
                                                                         reps=reps)))
    if not args.no_compile:
        for use_pass in (False, True):
            name = f"torch.compile(Model), pass {'on' if use_pass else 'off'}"
            fn, out, matches, in_code = _compiled(model, x, use_pass)
            # A compilation served from Inductor's cache does not run the pass again (matches 0), but its code
            # is the code the pass produced: the generated code is what tells.
            cached = " (served from Inductor's cache)" if use_pass and in_code and matches == 0 else ""
            print(f"{name}: pass matched {matches} chain(s){cached}; generated code calls a fused op: {in_code}")
            # On CUDA the pass also replaces the convolution (fused.conv_transpose3d_post_pool, TF32 like cuDNN's
            # by default): its rounding differs from cuDNN's, so the comparison allows TF32-sized differences.
            tf32 = device.type == "cuda" and x.dtype == torch.float32 and torch.backends.cudnn.allow_tf32
            ok &= _report(name, out, ref, tol=5e-3 if (use_pass and tf32) else 1e-4)
            ok &= in_code if use_pass else (matches == 0 and not in_code)
            with torch.no_grad():
                rows.append((name, median_us(lambda: fn(x), device, reps=reps)))
    print("\n| forward | median us |\n| --- | ---: |")
    for name, us in rows:
        print(f"| {name} | {us:.1f} |")
    print("\nPASS" if ok else "\nFAIL")
    return 0 if ok else 1


def _report(name: str, out: torch.Tensor, ref: torch.Tensor, tol: float = 1e-4) -> bool:
    # Where the convolution is the same as eager's, what differs is the epilogue, exact in float32 for ours, while
    # Inductor's own epilogue may round differently. TF32 convs make small differences larger on GPU.
    diff = (out - ref).abs().max().item()
    good = out.shape == ref.shape and torch.allclose(out, ref, rtol=tol, atol=tol)
    print(f"{name}: max |diff| vs eager {diff:.3g} -> {'ok' if good else 'MISMATCH'}", flush=True)
    return good


if __name__ == "__main__":
    sys.exit(main())
