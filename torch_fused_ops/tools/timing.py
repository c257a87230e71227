"""Timers shared by the demo, the benchmarks and the kernel harnesses: device events on CUDA, perf_counter on CPU;
warm-up and medians."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


_SLEEP_CYCLES_PER_US: dict[int, float] = {}


def _sleep_cycles_per_us(device: torch.device) -> float:
    """Clock cycles of torch.cuda._sleep per microsecond on this device, measured once."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SLEEP_CYCLES_PER_US:
        cycles = 2_000_000
        torch.cuda._sleep(cycles)  # first launch out of the way
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        _SLEEP_CYCLES_PER_US[idx] = cycles / max(start.elapsed_time(end) * 1e3, 1.0)
    return _SLEEP_CYCLES_PER_US[idx]


def host_us(fn: Callable[[], object], device: torch.device, n: int = 50, busy_ms: float = 50.0) -> float:
    """The host's time for one fn() call on CUDA, measured while a sleep kernel holds the device busy (busy_ms),
    so that no call waits for the device: what a call costs the host, whatever its kernels cost."""
    torch.cuda.synchronize(device)
    torch.cuda._sleep(int(_sleep_cycles_per_us(device) * busy_ms * 1e3))
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize(device)
    return t


def median_us(fn: Callable[[], object], device: torch.device, *, warmup: int = 5, reps: int = 30,
              min_time_s: float = 0.0, block: int | None = None, hide_host: bool = False) -> float:
    """Median time of one fn() call in microseconds: CUDA events on GPU, perf_counter on CPU.

    On CUDA each sample times a block of back-to-back calls (`block`, default: enough for ~2 ms, at most 20) and
    divides by its length: the steady-state cost of a call, the host's launch work overlapping the device's.
    hide_host=True measures the device's own time instead: a sleep kernel before each block lets the host enqueue
    the whole block first, so the device never waits for it (launch gaps still count), as
    triton.testing.do_bench's cache flush does. That is the figure a memory floor bounds
    (docs/performance.md#how-to-read-the-figures).
    """
    for _ in range(warmup):
        fn()
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        if block is None:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            one = max(start.elapsed_time(end) * 1e3, 1.0)
            block = int(min(20, max(1, 2000 // one)))
        sleep_cycles = 0
        if hide_host:
            # The host's time to enqueue one block, measured while the device is busy; the sleep covers twice it.
            host_block_us = block * host_us(fn, device, n=block, busy_ms=20.0)
            sleep_cycles = int(_sleep_cycles_per_us(device) * max(200.0, 2 * host_block_us))
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if sleep_cycles:
                torch.cuda._sleep(sleep_cycles)
            start.record()
            for _ in range(block):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / block)
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


def graph_us(fn: Callable[[], object], calls: int = 20, blocks: int = 7) -> float:
    """Device time per call of `fn` (CUDA): `calls` back-to-back calls captured in one CUDA graph after a warm-up on a
    side stream, median over `blocks` replays. Raises where `fn` cannot be captured (see stream_us)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(blocks):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return statistics.median(times)


def stream_us(fn: Callable[[], object], calls: int = 50, blocks: int = 7) -> float:
    """Time per call of `fn` (CUDA) over `calls` back-to-back calls on the stream, median over `blocks`: the device
    time where the host keeps ahead, for functions a CUDA graph cannot capture."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(blocks):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return statistics.median(times)
