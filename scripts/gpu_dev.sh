#!/usr/bin/env bash
# Development loop on the H200, one device call. Steps (each can be switched off, so that a call fits the
# device tool's 10-minute limit):
#   build the extension, then benchmarks/conv_t3d_variants.py times the fused-convolution kernels' configs
#                                                                      [SKIP_VARIANTS=1 to skip]
#   (TEST_FILES="a.py b.py": only those test files, instead of the two test steps below)
#   the Triton kernels' tests alone (one process, launches blocking, stop at the first failure)  [SKIP_TESTS=1]
#   the other CUDA tests (pytest-xdist when present)                                               [SKIP_TESTS=1]
#   torch.profiler breakdowns of whole calls (benchmarks/profile_calls.py, args in PROFILE_ARGS)     [PROFILE=1]
#   Nsight Compute counters of every kernel, the convolution kernels included (profile_post_pool.py) [NCU=1]
#   EXTRA: any command (e.g. benchmarks/compiled_kernel_check.py), output in extra.log              [EXTRA=...]
#   the benchmark at the default size with the whole-Model configurations                          [SKIP_BENCH=1]
# TESTS_LAST=1 runs the tests after the benchmark, so that a call cut short still has the figures.
# At most 8 files go to $OUT (the device tool's limit); the rest stay in /tmp.
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
gpu_setup gpu_dev
build_extension
# The variants run after the build, not beside it: host-bound launches time wrong on a busy CPU.
if [ -z "${SKIP_VARIANTS:-}" ]; then
  t0=$SECONDS
  timeout ${VARIANTS_TIMEOUT:-240} python3 benchmarks/conv_t3d_variants.py ${VARIANTS_ARGS:-} > "$OUT/variants.log" 2>&1
  note "variants: rc=$? in $((SECONDS - t0)) s"; sed -n '/^| kernel/,$p' "$OUT/variants.log" >> "$summary"
fi
# EXTRA="python3 some_script.py ...": one more command after the build, its output in $OUT/extra.log.
if [ -n "${EXTRA:-}" ]; then
  t0=$SECONDS
  OUT="$OUT" timeout ${EXTRA_TIMEOUT:-200} bash -c "$EXTRA" > "$OUT/extra.log" 2>&1
  note "extra ($EXTRA): rc=$? in $((SECONDS - t0)) s"; sed -n '/^| path/,$p' "$OUT/extra.log" >> "$summary"
fi
run_tests() {
if [ -n "${TEST_FILES:-}" ]; then
  # A chosen subset only (one process, -x).
  t0=$SECONDS
  timeout ${TEST_TIMEOUT:-200} python3 -m pytest $TEST_FILES -x -q -p no:cacheprovider -k "${TESTS_K:-cuda or conv or op}" \
    > "$OUT/pytest.log" 2>&1
  note "pytest $TEST_FILES: rc=$? in $((SECONDS - t0)) s: $(tail -1 "$OUT/pytest.log")"
  grep -E "^(FAILED|ERROR)|Error" "$OUT/pytest.log" | head -5 | tee -a "$summary"
elif [ -z "${SKIP_TESTS:-}" ]; then
  t0=$SECONDS
  CUDA_LAUNCH_BLOCKING=1 timeout ${TRITON_TEST_TIMEOUT:-240} python3 -m pytest tests/test_conv_post_pool_triton.py \
    tests/test_conv_infer_op.py tests/test_conv_phase_gemm.py -x -q -p no:cacheprovider > "$OUT/pytest_triton.log" 2>&1
  note "pytest triton (serial, -x): rc=$? in $((SECONDS - t0)) s: $(tail -1 "$OUT/pytest_triton.log")"
  grep -E "^(FAILED|ERROR)|Error" "$OUT/pytest_triton.log" | head -5 | tee -a "$summary"
  par=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8" || echo "")
  t0=$SECONDS
  timeout ${TEST_TIMEOUT:-200} python3 -m pytest tests -q -p no:cacheprovider --ignore=tests/test_conv_post_pool_triton.py \
    --ignore=tests/test_conv_infer_op.py --ignore=tests/test_conv_phase_gemm.py -k "${TESTS_K:-cuda or conv}" $par > "$OUT/pytest.log" 2>&1
  note "pytest rest: rc=$? in $((SECONDS - t0)) s: $(tail -1 "$OUT/pytest.log")"
  grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -10 | tee -a "$summary"
fi
}
[ -n "${TESTS_LAST:-}" ] || run_tests
if [ -n "${PROFILE:-}" ]; then
  t0=$SECONDS
  timeout ${PROFILE_TIMEOUT:-240} python3 benchmarks/profile_calls.py ${PROFILE_ARGS:-} > "$OUT/profile.log" 2>&1
  note "profile_calls: rc=$? in $((SECONDS - t0)) s"
fi
if [ -n "${NCU:-}" ]; then
  timeout 120 ncu --clock-control none -k "regex:post_pool|gemm" --metrics \
gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread \
    --csv python3 benchmarks/profile_post_pool.py > "$T/ncu.csv" 2> "$T/ncu.log"
  note "ncu: rc=$?"
  python3 - "$T/ncu.csv" >> "$summary" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: print("no ncu rows"); sys.exit()
h = rows[0]; idx = {k: i for i, k in enumerate(h)}
k = collections.OrderedDict()
for r in rows[1:]:
    key = (r[idx["ID"]], r[idx["Kernel Name"]][:70])
    k.setdefault(key, {})[r[idx["Metric Name"]]] = r[idx["Metric Value"]]
for (i, name), m in k.items():
    print(i, name, " | ".join(f"{a.split('__')[1][:22]}={b}" for a, b in m.items()))
PY
fi
if [ -z "${SKIP_BENCH:-}" ]; then
  t0=$SECONDS
  timeout ${BENCH_TIMEOUT:-300} python3 -m torch_fused_ops.bench --shapes "${BENCH_SHAPES:-16,32,32,64,64}" \
    --model-configs "${MODEL_CONFIGS:-fp32,bf16,fp32-b1,fp32-b1-graphs,fp32-strict}" ${BENCH_EXTRA:-} --out "$T" > "$OUT/bench.md" 2> "$T/bench.log"
  note "bench: rc=$? in $((SECONDS - t0)) s"; cat "$OUT/bench.md" >> "$summary"; cp "$T/bench_cuda.json" "$OUT/" 2>/dev/null
  tail -5 "$T/bench.log" >> "$summary"
fi
[ -z "${TESTS_LAST:-}" ] || run_tests
echo "================ summary ================"; cat "$summary"
