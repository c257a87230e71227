"""Main demo: the KernelBench Model eagerly and with its epilogue as one fused.post_pool call.

Checks the two agree (float32: bit-identical epilogue; the convolution is shared) and prints timings.
Runs at the KernelBench size on a GPU, and at a smaller size on CPU so it finishes in well under a minute.

    python -m torch_fused_ops.demo [--device cpu|cuda] [--batch N]
"""
from __future__ import annotations

import argparse

import torch

import torch_fused_ops
from torch_fused_ops._timing import median_us
from torch_fused_ops.models import DEFAULT_BATCH, DEFAULT_INPUT, ConvTransposeLeakyMulLeakyPool, fused_forward


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=None, help="default: 16 on GPU, 2 on CPU")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    batch = args.batch or (DEFAULT_BATCH if device.type == "cuda" else 2)

    torch.manual_seed(0)
    model = ConvTransposeLeakyMulLeakyPool().to(device)
    x = torch.randn(batch, 16, *DEFAULT_INPUT, device=device)
    print(f"torch {torch.__version__}, torch_fused_ops {torch_fused_ops.__version__}, device {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
          + f", input {list(x.shape)}, CUDA kernels built: {torch_fused_ops.has_cuda_kernels()}")

    with torch.no_grad():
        ref = model(x)
        out = fused_forward(model, x)
        # Same conv output into both epilogues, to check the fused epilogue alone bit for bit.
        y = model.conv_transpose(x)
        s = model.leaky_relu.negative_slope
        epi_ref = torch_fused_ops.reference_post_pool(y, model.multiplier, s, 2)
        epi_out = torch_fused_ops.post_pool(y, model.multiplier, s, 2)
    bit_exact = torch.equal(epi_ref, epi_out)
    max_diff = (out - ref).abs().max().item()
    print(f"output {list(out.shape)}: epilogue bit-identical to eager: {bit_exact}; "
          f"whole forward max |diff| vs eager: {max_diff:.3g}")
    ok = bit_exact and torch.allclose(out, ref, rtol=1e-4, atol=1e-5)

    reps = 30 if device.type == "cuda" else 5
    with torch.no_grad():
        rows = [
            ("eager Model forward", median_us(lambda: model(x), device, reps=reps)),
            ("Model forward, epilogue fused", median_us(lambda: fused_forward(model, x), device, reps=reps)),
            ("epilogue alone: eager (4 ops)",
             median_us(lambda: torch_fused_ops.reference_post_pool(y, model.multiplier, s, 2), device, reps=reps)),
            ("epilogue alone: fused.post_pool",
             median_us(lambda: torch_fused_ops.post_pool(y, model.multiplier, s, 2), device, reps=reps)),
        ]
    print("\n| what | median us |\n| --- | ---: |")
    for name, us in rows:
        print(f"| {name} | {us:.1f} |")
    print("\nPASS" if ok else "\nFAIL: fused output differs from eager")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
