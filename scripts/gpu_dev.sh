#!/usr/bin/env bash
# Development loop on the H200, one device call: build, the op's CUDA tests, the op-alone benchmark at the
# default size, Nsight Compute counters for each post_pool kernel, and the Triton conv+post_pool check if present.
# Logs to $OUT; a short summary last. (scripts/gpu_check.sh is the full check.)
set -uo pipefail
OUT=${OUT:-/tmp/gpu_dev_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
if [ -x /usr/bin/g++ ]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++; fi
summary="$OUT/summary.txt"; : > "$summary"
note() { echo "$*" | tee -a "$summary"; }
note "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader); torch $(python3 -c 'import torch; print(torch.__version__)')"
t0=$SECONDS
python3 -m pip install --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; note "BUILD FAILED"; exit 1; }
note "build ok in $((SECONDS - t0)) s"
par=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8" || echo "")
t0=$SECONDS
timeout 240 python3 -m pytest tests/test_forward.py tests/test_autograd.py tests/test_bias.py tests/test_opcheck.py tests/test_conv_op.py \
  tests/test_conv_post_pool_triton.py -q -p no:cacheprovider -k 'cuda or triton or conv' $par ${TESTS_EXTRA:-} > "$OUT/pytest.log" 2>&1
note "pytest cuda: rc=$? in $((SECONDS - t0)) s: $(tail -1 "$OUT/pytest.log")"
grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -10 | tee -a "$summary"
if [ -f benchmarks/conv_post_pool_triton_gpu.py ]; then
  timeout 200 python3 benchmarks/conv_post_pool_triton_gpu.py --out "$OUT" > "$OUT/triton.log" 2>&1
  note "triton conv+post_pool: rc=$?"; tail -25 "$OUT/triton.log" >> "$summary"
fi
timeout 90 ncu --clock-control none -k regex:post_pool --metrics \
gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.avg.per_cycle_active,launch__registers_per_thread,launch__grid_size \
  --csv python3 benchmarks/profile_post_pool.py > "$OUT/ncu.csv" 2> "$OUT/ncu.log"
note "ncu: rc=$?"
python3 - "$OUT/ncu.csv" >> "$summary" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: print("no ncu rows"); sys.exit()
h = rows[0]; idx = {k: i for i, k in enumerate(h)}
k = collections.OrderedDict()
for r in rows[1:]:
    key = (r[idx["ID"]], r[idx["Kernel Name"]][:60])
    k.setdefault(key, {})[r[idx["Metric Name"]]] = r[idx["Metric Value"]]
for (i, name), m in k.items():
    print(i, name, " | ".join(f"{a.split('__')[1][:28]}={b}" for a, b in m.items()))
PY
timeout 240 python3 -m torch_fused_ops.bench --shapes "16,32,32,64,64" ${BENCH_EXTRA:-} --out "$OUT" > "$OUT/bench.md" 2> "$OUT/bench.log"
note "bench: rc=$?"; cat "$OUT/bench.md" >> "$summary"
echo "================ summary ================"; cat "$summary"
