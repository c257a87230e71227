#!/usr/bin/env bash
# The whole CUDA test suite in one device call, then the benchmark. The suite no longer fits the 10-minute call
# when run serially (the Triton files compile hundreds of kernel variants, one CPU core at a time), so it runs as
# four concurrent pytest processes sharing the GPU (correctness tests only: nothing here is timed), one per
# visible GPU when there are several. The benchmark runs after them, alone on an idle machine.
#   SKIP_BENCH=1            tests only
#   BENCH_ARGS="..."        arguments of python -m torch_fused_ops.bench (default: the default size, the
#                           Model configs fp32,bf16,fp32-strict)
#   TEST_TIMEOUT=s          per shard (default 330)
#   SKIP_BUILD=1            the extension is already built (a dry run of the script)
#   EXTRA="cmd"             one more command after the tests, its output's tail in the summary
# Logs: $OUT/shard{1..4}.log, $OUT/bench.md (+ bench.log, bench_cuda.json), $OUT/summary.txt (the device tool returns at most 8 files).
set -uo pipefail
source "$(dirname "$0")/gpu_common.sh"
if [ "${1:-}" = "--hash" ]; then src_hash; exit 0; fi
gpu_setup gpu_final
build_extension

ngpu=$(nvidia-smi -L | wc -l)
triton_files="tests/test_conv_post_pool_triton.py tests/test_conv_phase_gemm.py tests/test_conv_infer_op.py"
compiled_files="tests/test_conv_op.py tests/test_conv_mutation_analysis.py tests/test_pass_e2e.py tests/test_compile_smoke.py"
ignores=""
for f in $triton_files $compiled_files; do ignores="$ignores --ignore=$f"; done
# pytest-xdist, when present, splits the Triton files too (their time is kernel compilation, on the CPU).
xd() { python3 -c "import xdist" 2>/dev/null && echo "-n $1" || echo ""; }
shards=(
  "tests/test_conv_post_pool_triton.py $(xd 3)"
  "tests/test_conv_phase_gemm.py tests/test_conv_infer_op.py $(xd 3)"
  "$compiled_files"
  "tests $ignores -k cuda $(xd 6)"
)
if [ -z "${SKIP_TESTS:-}" ]; then
  t0=$SECONDS
  pids=()
  for i in "${!shards[@]}"; do
    n=$((i + 1))
    CUDA_VISIBLE_DEVICES=$((i % ngpu)) timeout ${TEST_TIMEOUT:-330} python3 -m pytest ${shards[$i]} -q \
      -p no:cacheprovider -rfE > "$OUT/shard$n.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"; rc=$?
    n=$((i + 1))
    note "shard $n (${shards[$i]:0:90}): rc=$rc: $(tail -1 "$OUT/shard$n.log")"
    grep -E "^(FAILED|ERROR)" "$OUT/shard$n.log" | head -8 | tee -a "$summary"
  done
  note "tests took $((SECONDS - t0)) s"
fi
# EXTRA="python3 some_script.py ...": one command between the tests and the benchmark; its output is appended to
# the summary (the device tool returns at most 8 files, and the shards and the bench take seven).
if [ -n "${EXTRA:-}" ]; then
  t0=$SECONDS
  OUT="$OUT" timeout ${EXTRA_TIMEOUT:-200} bash -c "$EXTRA" > "$T/extra.log" 2>&1
  note "extra ($EXTRA): rc=$? in $((SECONDS - t0)) s"; tail -40 "$T/extra.log" >> "$summary"
fi
if [ -z "${SKIP_BENCH:-}" ]; then
  t0=$SECONDS
  timeout ${BENCH_TIMEOUT:-240} python3 -m torch_fused_ops.bench ${BENCH_ARGS:---shapes 16,32,32,64,64 --model-configs fp32,bf16,fp32-strict} \
    --out "$T" > "$OUT/bench.md" 2> "$OUT/bench.log"  # the log holds every row as it is measured
  note "bench: rc=$? in $((SECONDS - t0)) s"; cat "$OUT/bench.md" >> "$summary"; cp "$T/bench_cuda.json" "$OUT/" 2>/dev/null
  tail -5 "$OUT/bench.log" >> "$summary"
fi
echo "================ summary ================"; cat "$summary"
