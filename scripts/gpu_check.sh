#!/usr/bin/env bash
# Everything the H200 check needs, in one device call: build, full test suite (CUDA included), compute-sanitizer
# memcheck on the CUDA tests, then the benchmark. Logs go to $OUT; a short summary is printed last.
#   device run: bash scripts/gpu_check.sh [quick]
set -uo pipefail
OUT=${OUT:-/tmp/gpu_check_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}   # the H200 only: halves the build time there
# The H200 image sets CXX=/opt/gcc/bin/g++, which links libstdc++ statically into the extension; that private
# copy crashed (SIGSEGV in ostream) whenever a kernel formatted an error message. The system g++ links it
# dynamically, sharing torch's.
if [ -x /usr/bin/g++ ]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++; fi
summary="$OUT/summary.txt"
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > /tmp/gpu.txt 2>&1
note "gpu: $(cat /tmp/gpu.txt)"
note "torch: $(python3 -c 'import torch; print(torch.__version__, torch.version.cuda)'), CXX=${CXX:-unset}"

t0=$SECONDS
T=/tmp/gpu_check_work; mkdir -p "$T"   # logs that need not come back (the device tool returns at most 8 files)
if ! python3 -m pip install --no-build-isolation --no-deps -e . > "$T/build.log" 2>&1; then
  tail -40 "$T/build.log"; note "BUILD FAILED"; exit 1
fi
note "build: ok in $((SECONDS - t0)) s; libstdc++: $(ldd torch_fused_ops/_C*.so | grep -o 'libstdc++[^ ]*' || echo 'static (bad)')"

t0=$SECONDS
# pytest-xdist spreads the suite (mostly compile time) over the machine's cores when it is installed.
par=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8" || echo "")
timeout ${TEST_TIMEOUT:-240} python3 -m pytest tests -q -p no:cacheprovider -rfE $par > "$OUT/pytest.log" 2>&1
rc_tests=$?
note "pytest (all, CUDA included): rc=$rc_tests in $((SECONDS - t0)) s: $(tail -1 "$OUT/pytest.log")"
grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -20 | tee -a "$summary"

if [ "${1:-}" != "quick" ]; then
  timeout ${BENCH_TIMEOUT:-200} python3 -m torch_fused_ops.bench ${BENCH_SHAPES:+--shapes "$BENCH_SHAPES"} --out "$OUT" \
    > "$OUT/bench.md" 2> "$T/bench.log"
  note "bench: rc=$?"
  [ -n "${SKIP_DEMO:-}" ] || timeout 90 python3 -m torch_fused_ops.demo > "$OUT/demo.log" 2>&1
  cat "$OUT/bench.md" >> "$summary"
  grep -E "matched|diff|bit-identical|PASS|FAIL|^\|" "$OUT/demo.log" >> "$summary"
fi

t0=$SECONDS
# The op's own CUDA tests under compute-sanitizer (forward, autograd, errors, opcheck, bias), last and time-boxed
# so that a short device budget still gets the results above; the summary says how far it got.
timeout ${MEMCHECK_TIMEOUT:-150} compute-sanitizer --tool memcheck --error-exitcode 99 \
  python3 -m pytest tests/test_forward.py tests/test_autograd.py tests/test_errors.py tests/test_opcheck.py tests/test_bias.py \
  -q -p no:cacheprovider -k "cuda" -x > "$OUT/memcheck.log" 2>&1
rc_mem=$?
note "compute-sanitizer memcheck on CUDA tests: rc=$rc_mem in $((SECONDS - t0)) s: $(grep -E 'ERROR SUMMARY|passed|failed' "$OUT/memcheck.log" | tail -2 | tr '\n' ' ') $(grep -c PASSED "$OUT/memcheck.log" 2>/dev/null) $(tail -c 300 "$OUT/memcheck.log" | tr '\n' ' ' | grep -o '\[ *[0-9]*%\]' | tail -1)"
echo "================ summary ================"
cat "$summary"
[ $rc_tests -eq 0 ] && [ $rc_mem -eq 0 ]
