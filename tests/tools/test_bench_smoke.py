"""The benchmark (python -m torch_fused_ops.tools.bench) runs end to end on CPU at a tiny size and writes what it
promises (markdown, JSON)."""
import json

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
