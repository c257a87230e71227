"""Do CUDA graphs apply to the compiled Model once the pass has rewritten it? (CUDA only.)

    python benchmarks/cudagraph_probe.py

On the H200 (2026-11-29) the batch-1 forward with mode="reduce-overhead" took 115.6 us with the pass against
88.2 us without it, while the pass-on graph's kernels take about 19 us: CUDA graphs evidently did not apply.
Inductor says why only through its "cudagraphs" log. Here each variant (pass off / on; inference under no_grad /
training step) compiles with ``triton.cudagraph_or_error``, which turns a skip into an exception carrying the
reason, then the variant is timed again with skips allowed, with Inductor's skip counter.
"""
from __future__ import annotations

import torch
from torch._dynamo.utils import counters

import torch_fused_ops
from torch_fused_ops._timing import median_us
from torch_fused_ops.models import DEFAULT_INPUT, ConvTransposeLeakyMulLeakyPool


def main():
    torch.manual_seed(0)
    model = ConvTransposeLeakyMulLeakyPool().cuda()
    x = torch.randn(1, 16, *DEFAULT_INPUT, device="cuda")
    xg = x.clone().requires_grad_()
    dev = torch.device("cuda")
    for use_pass in (False, True):
        for what in ("inference", "training"):
            def call(fn):
                # Each call is a new step: without this, a training step's backward reads forward outputs that the
                # next replay has overwritten, and CUDA graphs raise.
                torch.compiler.cudagraph_mark_step_begin()
                if what == "inference":
                    with torch.no_grad():
                        return fn(x)
                fn(xg).sum().backward()

            label = f"pass {'on' if use_pass else 'off'}, {what}"
            with torch_fused_ops.fusion_enabled(use_pass):
                torch._dynamo.reset()
                try:
                    with torch._inductor.config.patch({"triton.cudagraph_or_error": True, "fx_graph_cache": False}):
                        fn = torch.compile(model, mode="reduce-overhead")
                        for _ in range(3):
                            call(fn)
                    print(f"{label}: CUDA graphs applied")
                except Exception as e:  # noqa: BLE001
                    # Dynamo wraps the backend's error and appends hints: keep the lines that name the reason.
                    lines = [ln for ln in str(e).splitlines() if "cudagraph" in ln.lower() or "due to" in ln]
                    print(f"{label}: SKIPPED: {' | '.join(lines)[:600] if lines else str(e)[:600]}")
                torch._dynamo.reset()
                skips = counters["inductor"]["cudagraph_skips"]
                try:
                    with torch._inductor.config.patch({"fx_graph_cache": False}):
                        fn = torch.compile(model, mode="reduce-overhead")
                        us = median_us(lambda fn=fn: call(fn), dev, reps=20)
                    print(f"    {us:.1f} us per call, cudagraph skips counted: "
                          f"{counters['inductor']['cudagraph_skips'] - skips}")
                except Exception as e:  # noqa: BLE001  (one variant failing must not hide the others)
                    print(f"    timing failed: {str(e).splitlines()[0][:300]}")


if __name__ == "__main__":
    main()
