"""Where the host time of a compiled-Model call goes (CUDA): the per-call cost when the device is not the limit.

    python benchmarks/host_profile.py [--batch 1] [--calls 300] [--passes on,off] [--out DIR]

For each setting of the pass: compile the KernelBench Model (inference, no_grad), warm up, then time `calls`
back-to-back calls on the host clock (the launches are asynchronous, so at batch 1, where the device work is
~20 us, this is the host's cost per call), then run the same loop under cProfile and print the functions with
the most own time and the most cumulative time. Output also goes to DIR/host_profile.txt ($OUT on the device).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import time

import torch

import torch_fused_ops
from torch_fused_ops.models import DEFAULT_INPUT, ConvTransposeLeakyMulLeakyPool


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--passes", default="on,off")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    log = open(os.path.join(a.out, "host_profile.txt"), "w")

    def say(msg=""):
        print(msg, flush=True)
        log.write(msg + "\n")
        log.flush()

    say(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, batch {a.batch}, {a.calls} calls")
    torch.manual_seed(0)
    model = ConvTransposeLeakyMulLeakyPool().cuda()
    x = torch.randn(a.batch, 16, *DEFAULT_INPUT, device="cuda")
    for p in a.passes.split(","):
        torch._dynamo.reset()
        with torch_fused_ops.fusion_enabled(p == "on"), torch.no_grad():
            fn = torch.compile(model)
            for _ in range(20):
                fn(x)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(a.calls):
                fn(x)
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            say(f"\n== pass {p}: host {1e6 * (t1 - t0) / a.calls:.1f} us per call (issuing), "
                f"{1e6 * (t2 - t0) / a.calls:.1f} us per call with the device's tail")
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(a.calls):
                fn(x)
            prof.disable()
            torch.cuda.synchronize()
            for key in ("tottime", "cumulative"):
                buf = io.StringIO()
                pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(22)
                say(f"-- by {key} (cProfile inflates Python-heavy paths; read the ranking, not the totals)")
                say("\n".join(ln for ln in buf.getvalue().splitlines() if ln.strip())[:6000])
    torch._dynamo.reset()


if __name__ == "__main__":
    main()
