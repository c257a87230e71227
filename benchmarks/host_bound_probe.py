"""Is a block-timer median the device's time or the host's? For the fused forward and backward at one size.

    python benchmarks/host_bound_probe.py [--shape 16,32,32,64,64] [--reps 30]

For each dtype, layout and call it prints three figures:
- "block us": the bench's timer (torch_fused_ops._timing.median_us): blocks of back-to-back calls between two
  events. Where the host's work per call exceeds the device's, this is the host's time.
- "queued us": the same blocks, each preceded by a sleep kernel long enough for the host to enqueue the whole
  block before the device reaches it (median_us(hide_host=True)), so the device never waits for the host: the
  device's steady-state time per call, launch gaps included.
- "host us": the host's cost of one call while the device is held busy.
- "do_bench us": triton.testing.do_bench (median), the ecosystem's timer: each call timed alone between events,
  after a 256 MB cache-clearing fill (zero_) that also lets the host enqueue the call ahead. A cross-check of
  "queued".
- "clean us": the same single-call timing after a read-only pass over 256 MB instead (a sum), so that the cache
  holds clean lines rather than the fill's dirty ones, which a timed kernel would otherwise write back to memory
  as it evicts them: bytes that belong to the fill, not to the op.
When block > queued by more than noise, the block median is host-bound.
"""
from __future__ import annotations

import argparse
import statistics

import torch

import torch_fused_ops
from torch_fused_ops._timing import copy_bandwidth, host_us, median_us
from torch_fused_ops.bench import floor_bytes

SLOPE = 0.2


def do_bench_us(fn):
    try:
        from triton.testing import do_bench
    except ImportError:
        return float("nan")
    return do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3


def single_us(fn, reps=100):
    """Median of single calls between events, each after a read-only pass over 256 MB (clean cache lines)."""
    buf = torch.empty(256 << 18, device="cuda")  # 256 MB of float
    buf.normal_()
    for _ in range(10):
        fn()
    pairs = []
    for _ in range(reps):
        buf.sum()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        pairs.append((s, e))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in pairs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="16,32,32,64,64")
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args()
    shape = [int(v) for v in a.shape.split(",")]
    dev = torch.device("cuda")
    bw = copy_bandwidth(dev)
    N, C, D, H, W = shape
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for fmt, layout in ((torch.contiguous_format, "contiguous"), (torch.channels_last_3d, "channels_last_3d")):
            torch.manual_seed(0)
            x = torch.randn(shape, device=dev, dtype=dtype).contiguous(memory_format=fmt)
            m = torch.randn(C, 1, 1, 1, device=dev, dtype=dtype)
            _, sel, off = torch.ops.fused.post_pool_with_offsets(x, m, SLOPE, [2, 2, 2])
            g = torch.randn_like(sel)
            cl = fmt == torch.channels_last_3d
            es = x.element_size()
            floors = {what: floor_bytes(what, x.numel(), sel.numel(), es) / bw * 1e6
                      for what in ("forward", "backward")}
            op = torch.ops.fused.post_pool.default

            def fwd_wrapper():
                return torch_fused_ops.post_pool(x, m, SLOPE, 2)

            def fwd_below_autograd():
                with torch._C._AutoDispatchBelowAutograd():
                    return op(x, m, SLOPE, [2], [], [0], [1], False, None)

            def bwd():
                return torch.ops.fused.post_pool_backward(g, sel, off, m, SLOPE, None, list(shape), [2, 2, 2],
                                                          [2, 2, 2], [0, 0, 0], [1, 1, 1], cl)
            with torch.no_grad():
                for what, name, fn in (("forward", "wrapper", fwd_wrapper),
                                       ("forward", "op below autograd", fwd_below_autograd),
                                       ("backward", "op", bwd)):
                    b = median_us(fn, dev, reps=a.reps)
                    q = median_us(fn, dev, reps=a.reps, hide_host=True)
                    h = host_us(fn, dev)
                    d = do_bench_us(fn)
                    c = single_us(fn)
                    f = floors[what]
                    rows.append(f"| {what} | {name} | {str(dtype)[6:]} | {layout} | {b:.1f} | {f / b:.0%} | {q:.1f} | "
                                f"{f / q:.0%} | {d:.1f} | {f / d:.0%} | {c:.1f} | {f / c:.0%} | {h:.1f} |")
                    print(rows[-1], flush=True)
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, shape {shape}, copy {bw / 1e9:.0f} GB/s")
    print("| pass | call | dtype | layout | block us | % floor | queued us | % floor | do_bench us | % floor "
          "| clean us | % floor | host us |")
    print("| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
