"""The CUDA caching allocator's allocations while a function runs, from its memory history (CUDA only).

Every tensor a kernel reads or writes, compiled (Inductor's wrapper allocates its buffers through the caching
allocator) or eager, was allocated there; a function that never allocates a block of some size therefore never
touches a fresh tensor that large. (Tensors that existed before the call are not seen: the caller owns those.)
"""
from __future__ import annotations

from collections.abc import Callable

import torch


def _trace(device: torch.device) -> list[dict]:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    traces = torch.cuda.memory._snapshot()["device_traces"]
    return traces[idx] if idx < len(traces) else []


def allocations_during(fn: Callable[[], object], device: torch.device) -> list[dict]:
    """The 'alloc' entries of the allocator's history (dicts with 'size' in bytes, 'frames', ...) made while fn()
    runs and the device finishes it, largest first. Recording is switched off again afterwards."""
    torch.cuda.synchronize(device)
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python", device=device)
    try:
        # The history may still hold earlier recordings: only what comes after this length belongs to fn.
        before = len(_trace(device))
        fn()
        torch.cuda.synchronize(device)
        entries = _trace(device)[before:]
    finally:
        torch.cuda.memory._record_memory_history(enabled=None, device=device)
    allocs = [e for e in entries if e.get("action") == "alloc"]
    return sorted(allocs, key=lambda e: -int(e["size"]))


def describe(alloc: dict, frames: int = 4) -> str:
    """One allocation as 'SIZE bytes at file:line (name) <- ...', its first Python frames in the history's order."""
    where = " <- ".join(f"{f.get('filename', '?').rsplit('/', 1)[-1]}:{f.get('line', '?')} ({f.get('name', '?')})"
                        for f in alloc.get("frames", [])[:frames])
    return f"{int(alloc['size'])} bytes at {where or 'no Python frame'}"
