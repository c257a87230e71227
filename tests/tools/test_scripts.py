"""The repository's shell entry points: scripts/demo.sh reaches the benchmark, and scripts/gpu.sh parses, rejects
unknown steps and plans its test shards so that every test file runs exactly once."""


def test_main_command_reaches_the_bench():
    # The README's main command runs the benchmark with "bench" as its first argument (set-up skipped here: the
    # test suite runs on a machine already set up).
    import os
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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


def test_ab_script_needs_a_tree():
    # scripts/gpu_ab.sh (several trees benched against each other on the GPU machine) refuses to run without one.
    import os
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run(["bash", os.path.join(root, "scripts", "gpu_ab.sh")], capture_output=True, text=True, cwd=root)
    assert r.returncode == 2 and "usage: gpu_ab.sh" in r.stdout
