"""DDP training of the unmodified KernelBench Model, compiled with the pass, against eager DDP and torch.compile
without the pass: routing on every rank, the parameters after N steps, step time per rank, peak memory per rank.

    torchrun --nproc_per_node 2 benchmarks/ddp_train.py [--configs tf32,bf16] [--steps 300] [--batch 16]
                                                        [--input D,H,W] [--variants eager,pass-off,pass-on]
                                                        [--reps N] [--out DIR]
    torchrun --nproc_per_node 2 benchmarks/ddp_train.py --device cpu --small --steps 3   (gloo, CPU only)

Every variant starts from the same parameters (seed 0) and sees, on each rank, the same batches (a stream seeded by
the rank): x and a target of the pooled shape, loss = mean((out - target)^2) in float32, SGD(lr) on every step.
Variants: eager DDP, torch.compile(DDP) with the pass off, with it on; and the reference, eager DDP in float32 with
TF32 off ("strict"). Per config and variant, rank 0 reports (every rank's figures are in the JSON):
  matched     chains the pass fused, per rank (pass on must fuse on every rank)
  rel. dist.  max over the parameters of ||p - p_ref|| / ||p_ref|| after the N steps, p_ref the strict reference's:
              eager's distance is cuDNN's own TF32 / bf16 error on this run, the pass-on run's must stay within
              2x of it (DISTANCE_FACTOR)
  step us     median over blocks of back-to-back training steps (forward, backward with DDP's all-reduce,
              optimizer step) after warm-up, CUDA events per rank (perf_counter on CPU)
  1-GPU us    the same step without DDP on rank 0 alone (the other ranks wait at a barrier)
  peak MiB    torch.cuda.max_memory_allocated() during one step above the memory allocated before it, per rank
NCCL's NVLink multicast (NVLS) is left off (NCCL_NVLS_ENABLE=0 unless set): the GPU machines' KINDS.md says why.
Rank 0 writes DIR/ddp_train.md (the table) and DIR/ddp_train.json (every rank's rows).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

import torch_fused_ops
from torch_fused_ops.tools.bench_train import _fresh_compile
from torch_fused_ops.models import DEFAULT_BATCH, DEFAULT_INPUT, ConvTransposeLeakyMulLeakyPool

CONFIGS = {  # name: (label, parameter dtype, allow_tf32)
    "tf32": ("float32, TF32 convolutions", torch.float32, True),
    "bf16": ("bfloat16", torch.bfloat16, True),
}
REFERENCE = ("float32, TF32 off (reference)", torch.float32, False)
VARIANTS = {  # name: (label, pass on; None: eager)
    "eager": ("eager DDP", None),
    "pass-off": ("torch.compile(DDP), pass off", False),
    "pass-on": ("torch.compile(DDP), pass on", True),
}
SMALL_BATCH, SMALL_INPUT = 1, (4, 8, 8)
LR = 1e-3
DISTANCE_FACTOR = 2.0
BLOCK = 10  # steps per timed block


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def batches(rank: int, steps: int, batch: int, spatial, dtype, device, cin: int, pooled_shape):
    g = torch.Generator().manual_seed(1000 + rank)
    return [(torch.randn(batch, cin, *spatial, generator=g).to(device=device, dtype=dtype),
             torch.randn(pooled_shape, generator=g).to(device=device, dtype=dtype)) for _ in range(steps)]


def train_run(variant: str | None, dtype, tf32: bool, device, data, ddp: bool, time_steps: int) -> dict:
    """Trains one model over `data` (one step per batch), then times `time_steps` more steps on the first batch
    (after the parameters are recorded). variant None: eager."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = ConvTransposeLeakyMulLeakyPool().to(device=device, dtype=dtype)
    net = nn.parallel.DistributedDataParallel(model) if ddp else model
    use_pass = None if variant is None else VARIANTS[variant][1]
    fn = net if use_pass is None else torch.compile(net)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    cuda = device.type == "cuda"

    def step(x, target):
        opt.zero_grad(set_to_none=True)
        loss = (fn(x).float() - target.float()).square().mean()
        loss.backward()
        opt.step()

    before = torch_fused_ops.matched_count()
    # Inductor's caches off (_fresh_compile): a cache hit would skip the pass and count no match.
    with torch.backends.cudnn.flags(enabled=torch.backends.cudnn.enabled, allow_tf32=tf32), _fresh_compile(), \
            torch_fused_ops.fusion_enabled(bool(use_pass)):
        for x, target in data:
            step(x, target)
        matched = torch_fused_ops.matched_count() - before
        params = {k: v.detach().float().cpu().clone() for k, v in model.named_parameters()}
        times = []
        x, target = data[0]
        for _ in range(2):  # warm-up
            step(x, target)
        peak = float("nan")
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
            step(x, target)
            torch.cuda.synchronize(device)
            peak = (torch.cuda.max_memory_allocated(device) - base) / 2**20
        for _ in range(max(1, time_steps // BLOCK)):
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(BLOCK):
                    step(x, target)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e3 / BLOCK)
            else:
                t0 = time.perf_counter()
                for _ in range(BLOCK):
                    step(x, target)
                times.append((time.perf_counter() - t0) * 1e6 / BLOCK)
    return dict(params=params, matched=matched, step_us=statistics.median(times), peak_MiB=peak)


def rel_distance(params: dict, ref: dict) -> float:
    return max(float((params[k] - ref[k]).norm() / ref[k].norm().clamp_min(1e-30)) for k in ref)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--configs", default="tf32,bf16")
    ap.add_argument("--variants", default="eager,pass-off,pass-on")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--reps", type=int, default=50, help="timed steps per variant (blocks of %d)" % BLOCK)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--input", default=None, help="D,H,W")
    ap.add_argument("--small", action="store_true", help=f"batch {SMALL_BATCH}, input {SMALL_INPUT}")
    ap.add_argument("--out", default=".")
    a = ap.parse_args(argv)
    configs = [c for c in a.configs.split(",") if c]
    variants = [v for v in a.variants.split(",") if v]
    for c in configs:
        if c not in CONFIGS:
            ap.error(f"unknown config {c!r}; known: {', '.join(CONFIGS)}")
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v!r}; known: {', '.join(VARIANTS)}")
    batch = a.batch or (SMALL_BATCH if a.small else DEFAULT_BATCH)
    spatial = tuple(int(v) for v in a.input.split(",")) if a.input else (SMALL_INPUT if a.small else DEFAULT_INPUT)

    cuda = a.device == "cuda"
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=600))
    try:
        probe = ConvTransposeLeakyMulLeakyPool()
        cin = probe.conv_transpose.in_channels
        with torch.no_grad():
            pooled_shape = tuple(probe(torch.zeros(batch, cin, *spatial)).shape)
        rows = []
        for c in configs:
            label, dtype, tf32 = CONFIGS[c]
            data = batches(rank, a.steps, batch, spatial, dtype, device, cin, pooled_shape)
            ref_data = [(x.float(), t.float()) for x, t in data]
            _log(f"[rank {rank}] {c}: reference (strict float32 eager DDP)")
            ref = train_run(None, REFERENCE[1], REFERENCE[2], device, ref_data, True, a.reps)
            for v in variants:
                _log(f"[rank {rank}] {c}: {VARIANTS[v][0]}")
                r = train_run(None if v == "eager" else v, dtype, tf32, device, data, True, a.reps)
                rows.append(dict(config=c, config_label=label, variant=v, impl=VARIANTS[v][0], rank=rank, world=world,
                                 matched=r["matched"], rel_distance=rel_distance(r["params"], ref["params"]),
                                 step_us=r["step_us"], peak_MiB=r["peak_MiB"]))
            # One device without DDP, on rank 0 only: the scaling baseline.
            if rank == 0 and "pass-on" in variants:
                single = train_run("pass-on", dtype, tf32, device, data[:1], False, a.reps)
                rows.append(dict(config=c, config_label=label, variant="pass-on-1gpu", impl="torch.compile, pass on, "
                                 "one device, no DDP", rank=0, world=1, matched=single["matched"],
                                 rel_distance=float("nan"), step_us=single["step_us"], peak_MiB=single["peak_MiB"]))
            dist.barrier()
            rows.append(dict(config=c, config_label=label, variant="reference", impl=REFERENCE[0], rank=rank,
                             world=world, matched=ref["matched"], rel_distance=0.0, step_us=ref["step_us"],
                             peak_MiB=ref["peak_MiB"]))
        gathered = [None] * world
        dist.all_gather_object(gathered, rows)
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return 0
    all_rows = [r for part in gathered for r in part]
    ok, md = report(all_rows, configs, variants, a, batch, spatial)
    os.makedirs(a.out, exist_ok=True)
    meta = dict(date=datetime.date.today().isoformat(), torch=torch.__version__, world=world, device=a.device,
                gpu=torch.cuda.get_device_name(device) if cuda else None, steps=a.steps, batch_per_rank=batch,
                input=list(spatial), lr=LR, command=" ".join(sys.argv))
    with open(os.path.join(a.out, "ddp_train.json"), "w") as f:
        json.dump(dict(meta=meta, rows=all_rows, ok=ok), f, indent=1, default=str)
    with open(os.path.join(a.out, "ddp_train.md"), "w") as f:
        f.write(md)
    print(md)
    return 0 if ok else 1


def report(rows, configs, variants, a, batch, spatial) -> tuple[bool, str]:
    """The markdown table (rank 0's times beside every rank's matched counts) and whether the checks hold."""
    ok = True
    lines = [f"DDP, {rows[0]['world']} ranks, {a.device}, batch {batch} per rank, input {list(spatial)}, "
             f"{a.steps} SGD steps (lr {LR}) from the same seeds", "",
             "| config | variant | matched per rank | rel. distance from the reference | step us (rank 0) | "
             "step us (slowest rank) | peak MiB (rank 0) |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for c in configs:
        eager_dist = next(r["rel_distance"] for r in rows if r["config"] == c and r["variant"] == "eager") \
            if "eager" in variants else None
        for v in ["reference", *variants, "pass-on-1gpu"]:
            rs = sorted((r for r in rows if r["config"] == c and r["variant"] == v), key=lambda r: r["rank"])
            if not rs:
                continue
            r0 = rs[0]
            matched = "/".join(str(r["matched"]) for r in rs)
            lines.append(f"| {r0['config_label']} | {r0['impl']} | {matched} | {r0['rel_distance']:.3g} | "
                         f"{r0['step_us']:.1f} | {max(r['step_us'] for r in rs):.1f} | {r0['peak_MiB']:.1f} |")
            if v == "pass-on":
                if not all(r["matched"] >= 1 for r in rs):
                    ok = False
                    lines.append(f"| | **the pass did not fuse on every rank** | | | | | |")
                if eager_dist is not None and not r0["rel_distance"] <= DISTANCE_FACTOR * eager_dist + 1e-6:
                    ok = False
                    lines.append(f"| | **pass-on distance {r0['rel_distance']:.3g} above {DISTANCE_FACTOR} x eager's "
                                 f"{eager_dist:.3g}** | | | | | |")
    lines += ["", "All checks hold." if ok else "A check FAILED (above).", ""]
    return ok, "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
