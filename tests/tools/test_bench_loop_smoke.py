"""The loop benchmark runs end to end on CPU at a tiny size and writes what it promises; its target checks read the
rows they name."""
import json
import math

import pytest

from torch_fused_ops.tools import bench_loop


@pytest.mark.slow
def test_bench_loop_cpu_tiny(tmp_path, capsys):
    out = str(tmp_path)
    assert bench_loop.main(["--device", "cpu", "--small", "--steps", "1", "--recipes", "compile",
                            "--inference-recipes", "compile", "--inference-batches", "1", "--out", out]) == 0
    text = capsys.readouterr().out
    assert "### Training step" in text and "### Inference call" in text
    assert (tmp_path / "bench_loop.md").read_text().strip() in text
    rows = json.loads((tmp_path / "bench_loop.json").read_text())["rows"]
    assert [(r["what"], r["recipe"], r["use_pass"]) for r in rows] == [
        ("train", "compile", False), ("train", "compile", True), ("infer", "compile", False),
        ("infer", "compile", True)]
    for r in rows:
        assert r["wall_us"] > 0 and r["device_us"] is None  # the device column is CUDA's only
        assert r["matched"] == (1 if r["use_pass"] else 0)
        assert all(v == 0 for v in r["during_timed_steps"].values())


def test_recipes_that_need_cuda_are_refused_on_cpu(capsys):
    with pytest.raises(SystemExit):
        bench_loop.main(["--device", "cpu", "--recipes", "cuda-graph"])
    assert "need CUDA" in capsys.readouterr().err


def _row(what, recipe, use_pass, wall, device, batch=16, kernel=math.nan):
    return dict(what=what, recipe=recipe, config="tf32", use_pass=use_pass, batch=batch, wall_us=wall,
                device_us=device, fused_kernel_us=kernel)


def test_target_checks():
    rows = [_row("train", "cuda-graph", True, 410.0, 400.0), _row("train", "cuda-graph", False, 2200.0, 2190.0),
            _row("train", "compile", True, 1400.0, 400.0), _row("train", "reduce-overhead", True, 900.0, 360.0),
            _row("infer", "cuda-graph", True, 30.0, 29.0, batch=1, kernel=27.0),
            _row("infer", "compile", True, 65.0, 28.0, batch=1, kernel=27.0),
            _row("infer", "compile", True, 110.0, 108.0), _row("infer", "reduce-overhead", True, 120.0, 118.0)]
    checks = bench_loop.target_checks(rows, dict(batch=16, eager_call_host_us=14.0))
    assert checks == [
        "whole-step CUDA graph, wall / device: 1.02 (≤ 1.15: met)",
        "whole-step CUDA graph, wall pass off / pass on: 5.37 (≥ 5.0: met)",
        "best recipe without manual capture (reduce-overhead), wall / device: 2.50 (≤ 1.5: not met)",
        "inference batch 1, best recipe (cuda-graph), wall / fused kernel: 1.11 (≤ 1.5: met)",
        "inference batch 16, reduce-overhead / default (wall): 1.09 (≤ 1.05: not met)",
        "host µs of one eager fused call: 14.00 (≤ 12.0: not met)",
    ]
