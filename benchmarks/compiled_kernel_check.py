"""Why does the fused convolution kernel take longer inside the compiled Model than launched eagerly? (CUDA only.)

    python benchmarks/compiled_kernel_check.py [--out DIR]

For bf16, TF32 and strict float32 at the KernelBench size, the same kernel reached three ways:
1. eager: ``_conv_triton_op.launch`` (weight packing included), Triton's own launcher;
2. the op alone under torch.compile (``fused.conv_transpose3d_post_pool_infer``), Inductor's launcher;
3. the compiled Model with the pass.
Device time per call of every kernel (torch.profiler) and the block-timer time of the whole call. Then, for every
cubin Triton built in this process (a fresh cache dir), its registers, spills and shared memory (Triton's
cuobjdump) and the argument attributes of its TTGIR signature (divisibility, constants), so an eager compile and
an Inductor compile of the same kernel can be compared. Inductor's generated wrapper code goes to DIR.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

if "TRITON_CACHE_DIR" not in os.environ:  # a fresh cache: every kernel this process uses gets compiled here
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton_check_")

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import torch_fused_ops  # noqa: E402
from torch_fused_ops import _conv_triton_op  # noqa: E402
from torch_fused_ops._timing import median_us  # noqa: E402
from torch_fused_ops.models import DEFAULT_BATCH, DEFAULT_INPUT, ConvTransposeLeakyMulLeakyPool  # noqa: E402

CALLS = 10


def kernel_times(fn):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
    events = prof.key_averages()
    attr = "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
    ks = [(getattr(e, attr) / CALLS, e.count / CALLS, e.key) for e in events
          if e.device_type == torch.autograd.DeviceType.CUDA and getattr(e, attr) > 0]
    return sorted(ks, reverse=True)


def show(title, fn, rows):
    us = median_us(fn, torch.device("cuda"), reps=20)
    ks = kernel_times(fn)
    main = ks[0] if ks else (float("nan"), 0, "-")
    rows.append((title, us, main[0], sum(k[0] for k in ks), main[2][:50]))
    print(f"\n== {title}: {us:.1f} us per call")
    for t, c, k in ks[:6]:
        print(f"   {t:8.1f} us/call x{c:.1f} {k[:100]}")


def cubin_report():
    cache = os.environ["TRITON_CACHE_DIR"]
    from triton_resources import _cuobjdump  # this script's folder is on sys.path when run as a script

    cuobjdump = _cuobjdump()
    print(f"\n== cubins in {cache}")
    for cubin in sorted(glob.glob(os.path.join(cache, "*", "*.cubin"))):
        name = os.path.basename(cubin)[:-6]
        if "conv_t3d" not in name:
            continue
        meta = {}
        js = cubin[:-6] + ".json"
        if os.path.exists(js):
            meta = json.load(open(js))
        res = subprocess.run([cuobjdump, "--dump-resource-usage", cubin], capture_output=True, text=True).stdout
        m = re.search(r"REG:(\d+).*?STACK:(\d+).*?SHARED:(\d+).*?LOCAL:(\d+)", res)
        regs = m.groups() if m else ("?",) * 4
        ttgir = cubin[:-6] + ".ttgir"
        sig = ""
        if os.path.exists(ttgir):
            for line in open(ttgir):
                if "tt.func" in line:
                    # Argument types and divisibility facts; constexprs and ints specialised to 1 are not arguments.
                    found = re.findall(r"%(\w+): ([^{]+?)\s*(\{[^}]*\})?\s*loc\(", line)
                    sig = " ".join(f"{a}:{t}{'/16' if 'divisibility = 16' in d else ''}" for a, t, d in found)
                    break
        print(f"{name} dir={os.path.basename(os.path.dirname(cubin))[:10]} regs={regs[0]} stack={regs[1]} "
              f"shared={meta.get('shared', regs[2])} local={regs[3]} warps={meta.get('num_warps')} "
              f"stages={meta.get('num_stages')}")
        print(f"   args: {sig}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--precisions", default="bf16,tf32,strict")
    args = ap.parse_args()
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    rows = []
    code_file = open(os.path.join(args.out, "inductor_code.txt"), "w")
    for name in args.precisions.split(","):
        dtype = torch.bfloat16 if name == "bf16" else torch.float32
        tf32 = name == "tf32"
        torch.backends.cudnn.allow_tf32 = tf32
        torch._dynamo.reset()
        model = ConvTransposeLeakyMulLeakyPool().cuda().to(dtype)
        x = torch.randn(DEFAULT_BATCH, 16, *DEFAULT_INPUT, device="cuda", dtype=dtype)
        w, b = model.conv_transpose.weight.detach(), model.conv_transpose.bias.detach()
        m = model.multiplier.detach().reshape(-1).contiguous()
        with torch.no_grad():
            show(f"{name}: eager launch", lambda: _conv_triton_op.launch(x, w, b, m, 0.2, 0.2, [1, 1, 1], tf32), rows)
            op = torch.ops.fused.conv_transpose3d_post_pool_infer
            f = torch.compile(lambda x, w, b, m: op(x, w, b, m, 0.2, 0.2, [1, 1, 1], tf32))
            _, code = run_and_get_code(f, x, w, b, m)
            code_file.write(f"#### {name}: op alone\n" + "\n".join(code) + "\n")
            show(f"{name}: compiled op alone", lambda: f(x, w, b, m), rows)
            torch._dynamo.reset()
            with torch_fused_ops.fusion_enabled(True):
                cm = torch.compile(model)
                _, code = run_and_get_code(cm, x)
                code_file.write(f"#### {name}: Model\n" + "\n".join(code) + "\n")
                show(f"{name}: compiled Model", lambda: cm(x), rows)
    code_file.close()
    torch.backends.cudnn.allow_tf32 = True
    cubin_report()
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}\n")
    print("| path | call us | main kernel us | all kernels us | main kernel |")
    print("| --- | ---: | ---: | ---: | --- |")
    for r in rows:
        print(f"| {r[0]} | {r[1]:.1f} | {r[2]:.1f} | {r[3]:.1f} | {r[4]} |")


if __name__ == "__main__":
    sys.exit(main())
