#!/bin/bash
# One device session for the input-gradient kernel: build, checks and timing, ncu, compute-sanitizer; logs to $OUT.
# Each step gets what is left of a ${BUDGET:-285} s deadline. BASELINE_DIR (optional): a tree holding an earlier
# version of the harness and kernel files (benchmarks/ and csrc/ as here, module name changed); it is built beside
# this one and timed after it, for before/after figures from the same machine.
cd "$(dirname "$0")/../.."
export TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16
S=benchmarks/conv_transpose3d_post_pool/grad_input_kernel.py
left() { echo $(( ${BUDGET:-285} - SECONDS )); }
step() { local r; r=$(left); if [ "$r" -gt 15 ]; then timeout "$r" "$@"; else echo "skipped (no time): $*"; fi; }
B="import os; from torch_fused_ops.tools import harness; harness.build('conv_transpose3d_post_pool_grad_input', repo=os.getcwd(), verbose=True)"
if [ -n "$BASELINE_DIR" ]; then
  (cd "$BASELINE_DIR" && TORCH_EXTENSIONS_DIR=/tmp/ext_baseline step python3 -c "$B" > "$OUT/baseline_build.log" 2>&1) &
fi
step python3 -c "$B" > "$OUT/build.log" 2>&1
echo "build rc=$? at ${SECONDS}s"; grep -E "registers|spill|error" "$OUT/build.log" | tail -24
wait
step python3 $S --check --time --out "$OUT" > "$OUT/check.log" 2>&1
echo "check rc=$? at ${SECONDS}s"; grep -E "^  |FAIL" "$OUT/check.log" | head -20; tail -22 "$OUT/check.log"
if [ -n "$BASELINE_DIR" ]; then
  mkdir -p "$OUT/baseline"
  (cd "$BASELINE_DIR" && TORCH_EXTENSIONS_DIR=/tmp/ext_baseline step python3 $S --time --out "$OUT/baseline" \
    > "$OUT/baseline_time.log" 2>&1)
  echo "baseline rc=$? at ${SECONDS}s"; grep -E "registers|spill" "$OUT/baseline_build.log" | tail -8
  tail -6 "$OUT/baseline_time.log"
fi
step ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section ComputeWorkloadAnalysis -k regex:grad_input python3 $S --profile > "$OUT/ncu.log" 2>&1
echo "ncu rc=$? at ${SECONDS}s"
grep -E "grad_input_kernel|Duration|Compute \(SM\) Th|Memory Th|Registers Per|Achieved Occ|Executed Ipc A|No Eligible" \
  "$OUT/ncu.log" | head -40
step compute-sanitizer --tool memcheck python3 $S --sanitize > "$OUT/memcheck.log" 2>&1
echo "memcheck rc=$? at ${SECONDS}s"; tail -3 "$OUT/memcheck.log"
step compute-sanitizer --tool racecheck python3 $S --sanitize > "$OUT/racecheck.log" 2>&1
echo "racecheck rc=$? at ${SECONDS}s"; tail -3 "$OUT/racecheck.log"
