"""The CPU kernels ask Linux for transparent huge pages on their large outputs (csrc/common/cpu_huge_pages.h).

The kernel records the advice as the "hg" flag of the output's memory mapping in /proc/self/smaps, whatever the
system's THP mode, so this checks the request itself; the speed-up is in docs/performance.md (CPU, night).
The private op fused._set_cpu_huge_pages(False) turns the advice off (the package's settings module calls it from
TORCH_FUSED_OPS_CPU_HUGE_PAGES). Each check runs in a fresh child process: the flags belong to the mapping, and a
mapping advised by an earlier allocation in the same process (heap reuse) would keep them.
"""
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not os.path.exists("/proc/self/smaps")
    or not os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"),
    reason="Linux with transparent huge pages and /proc/self/smaps")

_CHILD = r"""
import sys, torch, torch_fused_ops
if sys.argv[1] == "off":
    torch.ops.fused._set_cpu_huge_pages(False)

def vm_flags(addr):
    # The VmFlags of the mapping that holds addr (/proc/self/smaps: a header line per mapping, then fields).
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= addr < hi
            elif inside and line.startswith("VmFlags:"):
                return line.split()[1:]
    return None

shape = (2, 32, 16, 32, 64)  # a 16.8 MB float32 grad_input, a 2.1 MB output (below the 4 MB threshold)
x = torch.randn(shape)
m = torch.randn(32, 1, 1, 1)
out, sel, off = torch.ops.fused.post_pool_with_offsets(x, m, 0.2, [2, 2, 2])
g = torch.randn_like(out)
gi, gm = torch.ops.fused.post_pool_backward(g, sel, off, m, 0.2, None, list(shape), [2, 2, 2], [2, 2, 2],
                                            [0, 0, 0], [1, 1, 1], False)
mid = gi.data_ptr() + gi.numel() * gi.element_size() // 2
print("gi", " ".join(vm_flags(mid) or ["?"]))
print("out", " ".join(vm_flags(out.data_ptr()) or ["?"]))
"""


def _child(advice):
    env = dict(os.environ)
    env.pop("TORCH_FUSED_OPS_CPU_HUGE_PAGES", None)  # the settings module may read it; these checks call the op
    r = subprocess.run([sys.executable, "-c", _CHILD, advice], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    flags = dict(line.split(" ", 1) for line in r.stdout.strip().splitlines())
    return {k: v.split() for k, v in flags.items()}


def test_large_cpu_output_is_advised_huge_pages():
    flags = _child("on")
    assert flags["gi"] != ["?"], "no mapping found for grad_input"
    assert "hg" in flags["gi"], f"grad_input's mapping lacks MADV_HUGEPAGE: {flags['gi']}"


def test_huge_page_advice_can_be_turned_off():
    flags = _child("off")
    assert flags["gi"] != ["?"], "no mapping found for grad_input"
    assert "hg" not in flags["gi"], f"fused._set_cpu_huge_pages(False) still advised: {flags['gi']}"
