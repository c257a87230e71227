"""The training-step benchmark runs end to end on CPU at a tiny size, writes what it promises (markdown, JSON
merged across runs), and its floors are the documented formulas."""
import json
import math

from torch_fused_ops.tools import bench_train


def test_bench_train_cpu_tiny(tmp_path, capsys):
    out = str(tmp_path)
    assert bench_train.main(["--device", "cpu", "--small", "--variants", "eager", "--reps", "1", "--out", out]) == 0
    first = capsys.readouterr().out
    # A second run (one compiled row) merges into the same JSON and replaces nothing of the first.
    assert bench_train.main(["--device", "cpu", "--small", "--configs", "tf32", "--variants", "pass-on",
                             "--reps", "1", "--out", out]) == 0
    second = capsys.readouterr().out

    for label in ("TF32, x without grad", "TF32, x requiring grad", "bfloat16, x without grad",
                  "strict float32 (TF32 off), x without grad", "autocast bfloat16 (float32 model), x without grad"):
        assert f"| {label} | eager |" in first
    assert "| torch.compile, pass on |" in second and "| config | Model | wall us |" in second
    assert (tmp_path / "bench_train.md").read_text().strip() in second

    data = json.loads((tmp_path / "bench_train.json").read_text())
    rows = data["rows"]
    assert [(r["config"], r["impl"]) for r in rows] == [
        ("tf32", "eager"), ("tf32-xgrad", "eager"), ("bf16", "eager"), ("strict", "eager"),
        ("autocast-bf16", "eager"), ("tf32", "torch.compile, pass on")]
    for r in rows:
        assert r["batch"] == 1 and r["input"] == [4, 8, 8] and r["device"] == "cpu"
        assert math.isfinite(r["device_us"]) and r["device_us"] > 0
        assert math.isfinite(r["floor_mem_us"]) and r["floor_mem_us"] > 0
        assert r["host_us"] is None and r["peak_MiB"] is None  # CUDA-only columns: null, not NaN
    assert rows[-1]["matched"] >= 1  # the pass rewrote the chain (fused.post_pool on CPU)
    assert all(r["matched"] == 0 for r in rows[:-1])
    xgrad = next(r for r in rows if r["config"] == "tf32-xgrad")
    assert xgrad["floor_mem_us"] > rows[0]["floor_mem_us"]


def test_floors_at_the_kernelbench_size():
    x, w, p = 16 * 16 * 16 * 32 * 32, 16 * 32 * 27, 16 * 32 * 16 * 32 * 32
    # float32 without x's gradient: x twice, w twice, out + selected + offsets written and read back, grad_conv
    # written and read with the offsets once more.
    assert bench_train.floor_bytes(x, w, p, 4, False) == 2 * 4 * x + 2 * 4 * w + 2 * 9 * p + 4 * p + 5 * p
    assert bench_train.floor_bytes(x, w, p, 4, True) - bench_train.floor_bytes(x, w, p, 4, False) == \
        5 * p + 4 * w + 4 * x
    assert abs(bench_train.floor_bytes(x, w, p, 4, False) / 1e6 - 260.2) < 0.1
    # One product is the 7.25 GFLOP of the convolution.
    assert abs(bench_train.step_flops(p, 16, False) / 2 - 7.248e9) < 1e6
    assert bench_train.step_flops(p, 16, True) == 1.5 * bench_train.step_flops(p, 16, False)
