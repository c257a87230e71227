#!/usr/bin/env bash
# Source trees measured against each other in one device call: every tree built in place at once (the builds share
# the machine's cores, ~3 minutes for two or three), then the sm_90a kernel's bench in each, the trees taking turns
# for several rounds so that a drift of the machine shows in every tree alike, and one table of the sm_90a column
# per tree and round. What each tree is: an untracked folder of this tree (the device copies only those git does
# not ignore) holding another branch, or '.' for this tree itself:
#
#   git archive BRANCH | (mkdir -p ab/x && tar -x -C ab/x)      # here, before the device call, one folder a tree
#   bash scripts/gpu_ab.sh . ab/x [ab/y ...]                     # on the device
#
# A tree given as DIR:trace is built as a measurement build (TORCH_FUSED_OPS_HOPPER_ABLATION=1) and runs
# trace_call.py (inference, then training) instead of the bench: the kernel's own clock at its hand-offs.
# AB_BENCH_ARGS: hopper_forward.py's (default --batches 16). AB_ROUNDS: bench rounds (default 2).
# AB_TESTS: a pytest selection run in every product tree after the benches (or only in the trees AB_TEST_TREES names,
# space-separated as given above), -k $AB_TESTS_K (default cuda), at most AB_TEST_TIMEOUT seconds each (default 150);
# each tree's log in $OUT/ab_tests_<n>.log.
# Output: $OUT/ab.txt (the builds' results, each tree's tables, the summary table, the tests' last lines); build
# logs in /tmp/ab_build_*.log.
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: gpu_ab.sh DIR[:trace] ..."; exit 2; }
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
ROOT=$PWD
REPORT=$OUT/ab.txt
BENCH=benchmarks/conv_transpose3d_post_pool/hopper_forward.py
TRACE=benchmarks/conv_transpose3d_post_pool/trace_call.py
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a}
if [ -x /usr/bin/g++ ]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++; fi
: > "$REPORT"

# Tree n: its folder and whether it is a measurement build.
dirs=() traces=()
for arg in "$@"; do
  dirs+=("${arg%:trace}")
  if [ "${arg%:trace}" != "$arg" ]; then traces+=(1); else traces+=(0); fi
done

t0=$SECONDS
for n in "${!dirs[@]}"; do
  (
    cd "$ROOT/${dirs[$n]}" || exit 1
    if [ "${traces[$n]}" = 1 ]; then export TORCH_FUSED_OPS_HOPPER_ABLATION=1; fi
    python3 setup.py build_ext --inplace > "/tmp/ab_build_$n.log" 2>&1
    rc=$?
    echo "build ${dirs[$n]}: rc=$rc in $((SECONDS - t0)) s" >> "$REPORT"
    [ $rc = 0 ] || tail -20 "/tmp/ab_build_$n.log" >> "$REPORT"
  ) &
done
wait

# In tree n: python with that tree's package first on the path.
in_tree() {
  local n=$1
  shift
  (cd "$ROOT/${dirs[$n]}" && PYTHONPATH=$PWD "$@")
}

for round in $(seq 1 "${AB_ROUNDS:-2}"); do
  for n in "${!dirs[@]}"; do
    [ "${traces[$n]}" = 0 ] || continue
    # shellcheck disable=SC2086
    in_tree "$n" timeout 90 python3 "$BENCH" ${AB_BENCH_ARGS:---batches 16} > "/tmp/ab_bench_${n}_$round.txt" 2>&1
    echo "## ${dirs[$n]}, round $round (rc=$?)" >> "$REPORT"
    cat "/tmp/ab_bench_${n}_$round.txt" >> "$REPORT"
  done
done
for n in "${!dirs[@]}"; do
  [ "${traces[$n]}" = 1 ] || continue
  echo "## ${dirs[$n]}: trace" >> "$REPORT"
  in_tree "$n" timeout 90 python3 "$TRACE" --precisions tf32,bf16 >> "$REPORT" 2>&1
  in_tree "$n" timeout 90 python3 "$TRACE" --precisions tf32,bf16 --train >> "$REPORT" 2>&1
done

# The summary: per (batch, precision, form) the sm_90a column of every product tree and round.
python3 - "$REPORT" "${#dirs[@]}" "${AB_ROUNDS:-2}" "${dirs[@]}" "${traces[@]}" <<'EOF' | tee -a "$REPORT"
import sys

report, count, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dirs, traces = sys.argv[4:4 + count], sys.argv[4 + count:4 + 2 * count]
cols, rows = [], {}
for n, d in enumerate(dirs):
    if traces[n] == "1":
        continue
    for r in range(1, rounds + 1):
        col = f"{d} #{r}"
        cols.append(col)
        try:
            lines = open(f"/tmp/ab_bench_{n}_{r}.txt").read().splitlines()
        except OSError:
            continue
        for line in lines:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) > 4 and cells[0].isdigit():
                rows.setdefault(tuple(cells[:3]), {})[col] = cells[3]
print("\n## sm_90a us by tree and round\n")
print("| batch | precision | form | " + " | ".join(cols) + " |")
print("| ---: | --- | --- |" + " ---: |" * len(cols))
for key, vals in rows.items():
    print("| " + " | ".join(key) + " | " + " | ".join(vals.get(c, "") for c in cols) + " |")
EOF

if [ -n "${AB_TESTS:-}" ]; then
  for n in "${!dirs[@]}"; do
    [ "${traces[$n]}" = 0 ] || continue
    if [ -n "${AB_TEST_TREES:-}" ] && [[ " $AB_TEST_TREES " != *" ${dirs[$n]} "* ]]; then continue; fi
    # shellcheck disable=SC2086
    in_tree "$n" timeout "${AB_TEST_TIMEOUT:-150}" python3 -m pytest -q -x --tb=short -p no:cacheprovider $AB_TESTS \
      -k "${AB_TESTS_K:-cuda}" > "/tmp/ab_tests_$n.log" 2>&1
    echo "tests in ${dirs[$n]}: rc=$? $(tail -1 "/tmp/ab_tests_$n.log")" | tee -a "$REPORT"
    cp "/tmp/ab_tests_$n.log" "$OUT/ab_tests_$n.log"
  done
fi
