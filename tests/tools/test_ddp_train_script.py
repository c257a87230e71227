"""benchmarks/ddp_train.py, the two-GPU DDP benchmark, runs end to end on CPU: two gloo ranks under torchrun, a
tiny size, a few steps. On CPU every variant's parameters must equal the strict reference's (no TF32 there, and the
pass's CPU path is eager's arithmetic), and the pass must fuse on both ranks."""
import json
import os
import subprocess
import sys

import pytest
from fused_testing import free_local_port, requires_gloo

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = [pytest.mark.slow, requires_gloo]


def test_ddp_train_script_on_cpu(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo",
               TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
               PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    env.pop("TORCH_FUSED_OPS_DISABLE", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_local_port()), os.path.join(REPO, "benchmarks", "ddp_train.py"), "--device", "cpu",
           "--small", "--steps", "2", "--reps", "10", "--configs", "tf32", "--out", str(tmp_path)]
    r = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-4000:])
    data = json.loads((tmp_path / "ddp_train.json").read_text())
    assert data["ok"] is True and data["meta"]["world"] == 2
    rows = data["rows"]
    pass_on = [row for row in rows if row["variant"] == "pass-on"]
    assert sorted(row["rank"] for row in pass_on) == [0, 1]
    assert all(row["matched"] >= 1 for row in pass_on)
    assert all(row["matched"] == 0 for row in rows if row["variant"] in ("eager", "pass-off"))
    for row in rows:
        if row["variant"] in ("eager", "pass-off", "pass-on"):
            assert row["rel_distance"] <= 1e-6, row
        if row["variant"] != "reference":
            assert row["step_us"] > 0
    assert "All checks hold." in (tmp_path / "ddp_train.md").read_text()
