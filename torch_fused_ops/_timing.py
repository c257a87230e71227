"""Timers shared by the demo and the benchmark: device events on CUDA, perf_counter on CPU; warm-up and medians."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def median_us(fn: Callable[[], object], device: torch.device, *, warmup: int = 5, reps: int = 30,
              min_time_s: float = 0.0) -> float:
    """Median wall time of fn() in microseconds, measured with CUDA events on GPU."""
    for _ in range(warmup):
        fn()
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
    else:
        t_end = time.perf_counter() + min_time_s
        while len(times) < reps or time.perf_counter() < t_end:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30) -> float:
    """Bytes/s of a large device copy, counting bytes read plus bytes written (the memory-floor yardstick)."""
    if device.type == "cpu":
        nbytes = min(nbytes, 1 << 28)
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    us = median_us(lambda: dst.copy_(src), device, warmup=3, reps=10 if device.type == "cpu" else 30)
    return 2 * src.numel() * 4 / (us * 1e-6)
