#!/usr/bin/env bash
# One device call for kernel exploration: the fused-convolution launch configurations (benchmarks/
# conv_t3d_variants.py, pure Python, so it runs while the extension builds in the background), then
# torch.profiler breakdowns of whole calls (benchmarks/profile_calls.py) and Nsight Compute counters of the
# packed-GEMM kernel. Logs go to $OUT (at most 8 files come back).
set -uo pipefail
OUT=${OUT:-/tmp/gpu_explore_out}
T=/tmp/gpu_explore_work; mkdir -p "$OUT" "$T"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
if [ -x /usr/bin/g++ ]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++; fi
summary="$OUT/summary.txt"; : > "$summary"
note() { echo "$*" | tee -a "$summary"; }
note "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader); torch $(python3 -c 'import torch; print(torch.__version__)'); triton $(python3 -c 'import triton; print(triton.__version__)')"
t0=$SECONDS
( python3 -m pip install --no-build-isolation --no-deps -e . > "$T/build.log" 2>&1; echo $? > "$T/build.rc" ) &
timeout ${VARIANTS_TIMEOUT:-300} python3 benchmarks/conv_t3d_variants.py ${VARIANTS_ARGS:-} > "$OUT/variants.log" 2>&1
note "variants (batch 16): rc=$? in $((SECONDS - t0)) s"
sed -n '/^| kernel/,$p' "$OUT/variants.log" >> "$summary"
t0=$SECONDS
timeout 90 python3 benchmarks/conv_t3d_variants.py --quick --batch 1 > "$OUT/variants_b1.log" 2>&1
note "variants (batch 1, quick): rc=$? in $((SECONDS - t0)) s"
sed -n '/^| kernel/,$p' "$OUT/variants_b1.log" >> "$summary"
wait
note "build rc=$(cat $T/build.rc 2>/dev/null)"; [ "$(cat $T/build.rc 2>/dev/null)" = 0 ] || tail -20 "$T/build.log" >> "$summary"
t0=$SECONDS
timeout ${PROFILE_TIMEOUT:-150} python3 benchmarks/profile_calls.py > "$OUT/profile.log" 2>&1
note "profile_calls: rc=$? in $((SECONDS - t0)) s"
t0=$SECONDS
timeout 120 ncu --clock-control none -k regex:gemm --metrics \
gpu__time_duration.sum,dram__bytes_read.sum,lts__t_bytes.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__shared_mem_per_block_dynamic,sm__throughput.avg.pct_of_peak_sustained_elapsed \
  --csv env VARIANTS_ONCE=1 python3 benchmarks/conv_t3d_variants.py --quick > "$T/ncu.csv" 2> "$T/ncu.log"
note "ncu: rc=$? in $((SECONDS - t0)) s"
python3 - "$T/ncu.csv" >> "$summary" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: print("no ncu rows"); sys.exit()
h = rows[0]; idx = {k: i for i, k in enumerate(h)}
k = collections.OrderedDict()
for r in rows[1:]:
    key = (r[idx["ID"]], r[idx["Kernel Name"]][:40])
    k.setdefault(key, {})[r[idx["Metric Name"]]] = r[idx["Metric Value"]]
for (i, name), m in list(k.items())[-12:]:
    print(i, name, " | ".join(f"{a.split('__')[1][:24]}={b}" for a, b in m.items()))
PY
echo "================ summary ================"; cat "$summary"
