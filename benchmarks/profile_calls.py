"""Where the time of a whole call goes, on CUDA: torch.profiler over a few back-to-back calls of

1. fused.post_pool_backward alone (float32, default size, contiguous and channels_last_3d);
2. the compiled KernelBench Model's forward with the pass (no_grad): float32 with TF32, bfloat16, batch 1 (TF32),
   strict float32 (``--forwards`` picks among them);
3. the compiled Model's training step with the pass (float32, TF32).

For each: the per-call wall time (block timer), then the device kernels with their time per call, and the
host-side ops with the most self CPU time. It answers "the kernel takes X in ncu but the call takes Y".

    python benchmarks/profile_calls.py [--forwards tf32,bf16,tf32-b1,strict]
"""
from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

import torch_fused_ops
from torch_fused_ops._timing import median_us
from torch_fused_ops.models import DEFAULT_BATCH, DEFAULT_INPUT, ConvTransposeLeakyMulLeakyPool

CALLS = 10


def report(title, fn):
    dev = torch.device("cuda")
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    us = median_us(fn, dev, reps=20)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
    print(f"\n=== {title}: {us:.1f} us per call (block timer)")
    events = prof.key_averages()
    dev_attr = "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
    kernels = [e for e in events if getattr(e, dev_attr, 0) > 0 and e.device_type == torch.autograd.DeviceType.CUDA]
    kernels.sort(key=lambda e: -getattr(e, dev_attr))
    total = sum(getattr(e, dev_attr) for e in kernels) / CALLS
    print(f"device kernels: {total:.1f} us per call in total")
    for e in kernels[:12]:
        print(f"  {getattr(e, dev_attr) / CALLS:8.1f} us/call  x{e.count / CALLS:4.1f}  {e.key[:110]}")
    cpu = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU]
    cpu.sort(key=lambda e: -e.self_cpu_time_total)
    print("host (self CPU time per call):")
    for e in cpu[:10]:
        print(f"  {e.self_cpu_time_total / CALLS:8.1f} us/call  x{e.count / CALLS:4.1f}  {e.key[:110]}")


# Forward configurations: (dtype, batch, TF32 allowed).
FORWARDS = {"tf32": (torch.float32, DEFAULT_BATCH, True), "bf16": (torch.bfloat16, DEFAULT_BATCH, False),
            "tf32-b1": (torch.float32, 1, True), "strict": (torch.float32, DEFAULT_BATCH, False)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--forwards", default=",".join(FORWARDS), help="comma list of " + ", ".join(FORWARDS))
    args = ap.parse_args()
    torch.manual_seed(0)
    ops = torch.ops.fused
    shape = (16, 32, 32, 64, 64)
    for fmt, cl in ((torch.contiguous_format, False), (torch.channels_last_3d, True)):
        x = torch.randn(shape, device="cuda").contiguous(memory_format=fmt)
        m = torch.randn(32, 1, 1, 1, device="cuda")
        out, sel, off = ops.post_pool_with_offsets(x, m, 0.2, [2, 2, 2], [2, 2, 2], [0, 0, 0], [1, 1, 1], False, None)
        g = torch.randn_like(out)
        report(f"post_pool_backward float32 {'channels_last_3d' if cl else 'contiguous'}",
               lambda: ops.post_pool_backward(g, sel, off, m, 0.2, None, list(shape), [2, 2, 2], [2, 2, 2], [0, 0, 0],
                                              [1, 1, 1], cl))
        del x, out, sel, off, g

    tf32_before = torch.backends.cudnn.allow_tf32
    for name in args.forwards.split(","):
        dtype, batch, tf32 = FORWARDS[name]
        # The pass reads the TF32 switch when the graph is compiled.
        torch.backends.cudnn.allow_tf32 = tf32
        torch._dynamo.reset()
        model = ConvTransposeLeakyMulLeakyPool().cuda().to(dtype)
        xin = torch.randn(batch, 16, *DEFAULT_INPUT, device="cuda", dtype=dtype)
        with torch_fused_ops.fusion_enabled(True), torch.no_grad():
            cm = torch.compile(model)
            cm(xin)
            report(f"compiled Model forward, pass on ({name}, batch {batch}, no_grad)", lambda: cm(xin))
    torch.backends.cudnn.allow_tf32 = tf32_before

    model = ConvTransposeLeakyMulLeakyPool().cuda()
    xin = torch.randn(DEFAULT_BATCH, 16, *DEFAULT_INPUT, device="cuda")
    torch._dynamo.reset()
    with torch_fused_ops.fusion_enabled(True):
        cm = torch.compile(model)
        xg = xin.clone().requires_grad_()

        def step():
            cm(xg).sum().backward()

        report("compiled Model training step, pass on (TF32)", step)


if __name__ == "__main__":
    main()
