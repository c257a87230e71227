"""The benchmark runs end to end on CPU at a tiny size and writes what it promises (markdown, JSON)."""
import json

import pytest
import torch

from torch_fused_ops.tools import bench


def test_bench_cpu_tiny(tmp_path, capsys):
    rc = bench.main(["--device", "cpu", "--dtypes", "float32", "--layouts", "contiguous,channels_last_3d",
                     "--shapes", "1,4,4,8,8", "--no-compile", "--model-configs", "fp32,bf16", "--reps", "1",
                     "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "bench_cpu.json").read_text())
    rows = data["rows"]
    assert {(r["what"], r["impl"], r["layout"]) for r in rows} == {
        (w, i, l) for w in ("forward", "backward") for i in ("eager", "fused")
        for l in ("contiguous", "channels_last_3d")}
    assert all(r["us"] > 0 and r["call_us"] > 0 and r["floor_us"] > 0 for r in rows)
    assert [(r["config"], r["impl"]) for r in data["model_rows"]] == [("fp32", "eager"), ("bf16", "eager")]
    out = capsys.readouterr().out
    assert "| forward | fused | float32 | contiguous | [1, 4, 4, 8, 8] |" in out and "| bf16 |" in out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA timer's queued form")
def test_median_us_hide_host_measures_the_device_cuda():
    # A host-heavy call (a hundred tiny launches, ~1-2 us of device work each, several us of host work each): the
    # plain block timer measures the host, the queued form (hide_host) the device. The sleep it queues must cover
    # the host's enqueueing, or the two would agree. (Blocks stay well under the driver's queue of pending
    # launches, past which the host would wait for the device.) A device-heavy call gives the same figure both
    # ways.
    from torch_fused_ops.tools.timing import median_us

    dev = torch.device("cuda")
    t = torch.ones(16, device=dev)

    def host_heavy():
        for _ in range(100):
            t.add_(0)

    # The suite's shards share the GPU, so another process's kernels can land inside one measurement: each figure
    # is the best of three (contention only ever adds time).
    def best(fn, **kw):
        return min(median_us(fn, dev, **kw) for _ in range(3))

    plain = best(host_heavy, reps=5, block=3)
    queued = best(host_heavy, reps=5, block=3, hide_host=True)
    assert queued < 0.8 * plain, (queued, plain)
    big = torch.empty(1 << 27, device=dev)
    plain_big = best(lambda: big.fill_(1.0), reps=10)
    queued_big = best(lambda: big.fill_(1.0), reps=10, hide_host=True)
    assert abs(queued_big - plain_big) < 0.1 * plain_big, (queued_big, plain_big)


def test_main_command_reaches_the_bench():
    # The README's main command runs the benchmark with "bench" as its first argument (set-up skipped here: the
    # test suite runs on a machine already set up).
    import os
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run(["bash", os.path.join(root, "scripts", "demo.sh"), "bench", "--help"], capture_output=True,
                       text=True, env=dict(os.environ, SKIP_SETUP="1"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "python -m torch_fused_ops.tools.bench" in r.stdout and "--model-configs" in r.stdout


def test_gpu_script_plan_and_options():
    # The GPU entry script parses, rejects unknown steps, and its shard plan runs every test file exactly once:
    # the files of the heavy shards whole, and each of them ignored by the "-k cuda" shard that takes the rest.
    import glob
    import os
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = os.path.join(root, "scripts", "gpu.sh")
    for sh in glob.glob(os.path.join(root, "scripts", "*.sh")):
        r = subprocess.run(["bash", "-n", sh], capture_output=True, text=True)
        assert r.returncode == 0, (sh, r.stderr)
    plan = subprocess.run(["bash", script, "--plan"], capture_output=True, text=True, cwd=root)
    assert plan.returncode == 0, plan.stderr
    *heavy, rest = [line.split() for line in plan.stdout.splitlines()]
    assert rest[0] == "tests" and rest[rest.index("-k") + 1] == "cuda"
    whole = [a for shard in heavy for a in shard if a.endswith(".py")]
    assert whole and len(whole) == len(set(whole))
    assert all(os.path.isfile(os.path.join(root, f)) for f in whole)
    assert sorted(a.split("=", 1)[1] for a in rest if a.startswith("--ignore=")) == sorted(whole)
    bad = subprocess.run(["bash", script, "no-such-step"], capture_output=True, text=True, cwd=root)
    assert bad.returncode == 2 and "unknown step" in bad.stdout
    usage = subprocess.run(["bash", script, "--help"], capture_output=True, text=True, cwd=root).stdout
    for option in ("TESTS=", "BENCH_ARGS", "SANITIZE_TESTS", "SANITIZE_TOOLS", "NCU_KERNELS", "DEADLINE"):
        assert option in usage, option
