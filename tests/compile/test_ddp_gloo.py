"""torch.compile(DDP(model)) on CPU, two gloo ranks on 127.0.0.1: the graphs DDP's splitter cuts inside the chain
are fused, and training gives eager DDP's parameters.

The ranks are child processes (tests/compile/ddp_gloo_worker.py) started with a deadline; they exit by themselves, and
the test kills them (by pid) only when the deadline passes.
"""
import json
import os
import subprocess
import sys
import time

import pytest
import torch
from fused_testing import free_local_port, requires_gloo

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)  # fused_testing, which pass_testing imports
REPO = os.path.dirname(TESTS)
DEADLINE_S = 420

pytestmark = [pytest.mark.slow, requires_gloo]


def _run_ranks(tmp_path, world=2):
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", MASTER_ADDR="127.0.0.1",
               TORCHINDUCTOR_FX_GRAPH_CACHE="0", TORCHINDUCTOR_AUTOGRAD_CACHE="0",
               TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
               PYTHONPATH=os.pathsep.join([REPO, HERE, TESTS, os.environ.get("PYTHONPATH", "")]))
    env.pop("TORCH_FUSED_OPS_DISABLE", None)
    port = free_local_port()
    outs = [tmp_path / f"rank{r}.json" for r in range(world)]
    logs = [open(tmp_path / f"rank{r}.log", "w") for r in range(world)]
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "ddp_gloo_worker.py"), str(r), str(world),
                               str(port), str(outs[r])], env=env, cwd=REPO, stdout=logs[r], stderr=subprocess.STDOUT)
             for r in range(world)]
    start = time.monotonic()
    try:
        for p in procs:
            p.wait(timeout=max(1.0, DEADLINE_S - (time.monotonic() - start)))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in logs:
            f.close()
    elapsed = time.monotonic() - start
    for r, p in enumerate(procs):
        log = (tmp_path / f"rank{r}.log").read_text()[-4000:]
        assert p.returncode == 0, f"rank {r} exited with {p.returncode} after {elapsed:.0f} s:\n{log}"
    return [json.loads(o.read_text()) for o in outs], elapsed


def test_ddp_split_chain_is_fused_on_both_ranks_and_trains_like_eager(tmp_path):
    results, elapsed = _run_ranks(tmp_path)
    print(f"two gloo ranks: {elapsed:.1f} s")
    for res in results:
        rank, records = res["rank"], res["records"]
        assert res["ddp_optimizer"], "DDPOptimizer is off: the graph would not be split"
        # The splitter cut each stage between its first LeakyReLU and its multiply: pieces holding a pool hold
        # `mul -> leaky -> pool`, the others `conv -> leaky` (nothing to fuse there).
        with_pool = [r for r in records if r["before"]["pool"]]
        assert len(records) >= 4 and len(with_pool) == 2, f"rank {rank}: {records}"
        for r in with_pool:
            assert r["before"] == dict(fused=0, leaky=1, mul=1, pool=1), f"rank {rank}: not split inside: {r}"
            assert r["matched"] == 1 and r["after"] == dict(fused=1, leaky=0, mul=0, pool=0), f"rank {rank}: {r}"
        assert res["matched_total"] == 2
        eager, compiled = res["params"]["eager"], res["params"]["compiled"]
        assert eager.keys() == compiled.keys()
        for name in eager:
            torch.testing.assert_close(torch.tensor(compiled[name], dtype=torch.float64),
                                       torch.tensor(eager[name], dtype=torch.float64), rtol=1e-12, atol=1e-12,
                                       msg=lambda m, name=name: f"rank {rank} parameter {name}: {m}")
    # DDP keeps the replicas equal
    assert results[0]["params"]["compiled"] == results[1]["params"]["compiled"]
