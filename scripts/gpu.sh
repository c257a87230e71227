#!/usr/bin/env bash
# One device call on the GPU machine: build, tests, benchmark, and optionally Nsight Compute and compute-sanitizer.
#
#   bash scripts/gpu.sh [STEP ...]     STEPs (any of tests bench train loop ncu sass sanitize; default: tests bench) run in that
#                                      order after the build, whatever order they are given in
#   bash scripts/gpu.sh --plan         print the test shards and exit (no GPU needed)
#   bash scripts/gpu.sh --hash         the sources' content hash (the summary's "sources" field), to compare here
#
# Steps:
#   build     always first (SKIP_BUILD=1 skips it): pip install -e . with the system g++ (a g++ that links its own
#             static libstdc++, as /opt/gcc on one GPU image, broke the extension's error messages: README,
#             Troubleshooting); TORCH_CUDA_ARCH_LIST defaults to 9.0a (the H200, with the sm_90a wgmma kernel), which
#             halves the build time.
#   tests     the whole suite as concurrent pytest shards sharing the GPU (nothing in them is timed): the slow
#             torch.compile files whole, each group in its own shard (HEAVY below), and every other
#             file with -k cuda in one more shard (a new test file lands there by itself; -k matches the module
#             name too, so a file named *cuda* runs whole). One shard per GPU when there are several.
#             TESTS="tests/a.py tests/b.py::test_x": only that selection, one pytest process, instead of the shards.
#             TESTS_K="expr": -k for that selection (default none).  TEST_TIMEOUT: per shard, s (default 330).
#   bench     python -m torch_fused_ops.tools.bench $BENCH_ARGS (default: the op at the small and the default size,
#             the Model in fp32, bf16, strict fp32 and under autocast bf16: the tables docs/performance.md keeps).
#             BENCH_TIMEOUT (240).
#   train     python -m torch_fused_ops.tools.bench_train $TRAIN_ARGS (default: every config but autocast fp16, TF32 /
#             TF32 with x requiring grad / bf16 / strict fp32 / autocast bf16, each eager, torch.compile without
#             and with the pass: device, host and loop
#             time per training step, peak memory, largest allocation, floors, the pass-on steps' kernels), its
#             tables appended to bench.md. TRAIN_TIMEOUT (300); 8 compilations, so alone or with TRAIN_ARGS="--configs
#             tf32,tf32-xgrad" beside the bench.
#   loop      python -m torch_fused_ops.tools.bench_loop $LOOP_ARGS (default: every recipe that runs on CUDA, TF32, pass
#             off and on: the training loop with a loss and AdamW, and inference at batch 1 and 16; wall, device and
#             host time per step, issue 28's target checks), its tables appended to bench.md. LOOP_TIMEOUT (240).
#   ncu       Nsight Compute over one launch of each shipped kernel (benchmarks/profile_kernels.py), sections
#             $NCU_ARGS (default SpeedOfLight, Occupancy, LaunchStats, WarpStateStats), kernels matching
#             $NCU_KERNELS (a regex; default every kernel of ours). NCU_TIMEOUT (180).
#             NCU_TRAIN=1: instead, every kernel (or those matching $NCU_KERNELS) of one compiled pass-on training
#             step (python -m torch_fused_ops.tools.bench_train --ncu-step $NCU_TRAIN_CONFIG, default tf32), the
#             compilation and warm-up outside the profiled range (ncu --profile-from-start off).
#   sass      the built library's machine code (cuobjdump -sass) for the kernels whose names match $SASS_KERNELS
#             (a regex; default grad_weight_kernel|grad_input_kernel|conv_transpose3d_post_pool_kernel): per kernel, its
#             static instruction count and opcode mix, then the code itself, in sass.txt (what ncu's instruction
#             counts are made of; this machine has no cuobjdump).
#   sanitize  compute-sanitizer on a pytest selection, once per tool in $SANITIZE_TOOLS (default "memcheck
#             racecheck"; initcheck and synccheck work too), stopping at the first failing test:
#             SANITIZE_TESTS (default: tests/post_pool/test_{forward,autograd,bias,errors,opcheck}.py and
#             tests/conv_transpose3d_post_pool/test_conv_cuda_kernel.py) with -k $SANITIZE_K (default: the CUDA
#             cases, of the fused convolution's kernel file only its non-finite and strict-unsafe-weight cases: the
#             staging barriers that depend on the data, small enough for racecheck).
#             SANITIZE_TIMEOUT: per tool, s (default 200). memcheck runs with PyTorch's caching allocator off, so
#             that an access past a tensor's end leaves its cudaMalloc block and is seen.
#   EXTRA="cmd"   one more command after the tests (e.g. a sweep in benchmarks/), its output in extra.log.
#
# The whole call stops itself before DEADLINE seconds (default 570, under the device tool's 600): each step's
# timeout is cut to what is left, and a step with under 20 s left is skipped and says so in the summary.
# What comes back in $OUT (the device tool returns at most 8 files): summary.txt (every step's result, the test
# totals, the bench tables), tests.log (all shards), bench.md (the train and loop steps' tables too), bench_cuda.json,
# bench_cuda.png, bench_train.json, bench_loop.json, ncu.txt, sass.txt, sanitize.log, extra.log (every step and EXTRA
# at once make 11: three are lost). Everything else (build log, per-shard logs, bench progress) stays in /tmp/gpu_work.
#
# Examples (one 10-minute device call each):
#   bash scripts/gpu.sh                                       the whole suite, then the bench
#   TESTS="tests/post_pool/test_autograd.py tests/post_pool/test_bias.py" TESTS_K=cuda \
#     SANITIZE_TESTS="tests/post_pool/test_autograd.py" bash scripts/gpu.sh tests sanitize
#                                                             a selection, then memcheck + racecheck on part of it
#   bash scripts/gpu.sh train                                 the training-step bench, every config
#   NCU_TRAIN=1 bash scripts/gpu.sh ncu                       Nsight Compute over one pass-on TF32 training step
#   NCU_TRAIN=1 NCU_TRAIN_CONFIG=tf32-xgrad NCU_ARGS="--section SpeedOfLight --metrics \
#     dram__bytes_read.sum,dram__bytes_write.sum" bash scripts/gpu.sh ncu    the same with x's gradient, DRAM bytes
#   TESTS=tests/conv_transpose3d_post_pool/test_train_no_full_resolution.py bash scripts/gpu.sh tests train
#                                                             the step's no-full-resolution check, then the bench
#   bash scripts/gpu.sh tests && bash scripts/gpu_beside.sh beside
#                                                             then another tree (e.g. a branch's archive) in the same
#                                                             call: its sm_90a bench and kernel tests (gpu_beside.sh)
#   bash scripts/gpu_ab.sh . ab/x ab/y                        several trees (branches' archives in untracked folders)
#                                                             built at once, the sm_90a bench in each by turns, one
#                                                             table (gpu_ab.sh); no gpu.sh step before it is needed
set -uo pipefail
cd "$(dirname "$0")/.."

# The slow files, each group one shard, run whole (CPU cases included). Files that do not exist are dropped, so
# retiring a file needs no edit here; a new slow file joins a group (or becomes one) on its line.
HEAVY=(
  "tests/compile/test_pass_conv_route_model.py tests/compile/test_pass_e2e.py tests/compile/test_compile_smoke.py"
  "tests/compile/test_pass_conv_route.py"
)
# Workers per shard when pytest-xdist is installed (the heavy files' time is compilation, on the CPU).
XDIST_HEAVY=3
XDIST_REST=6

# The device's copy of the tree may carry a stale .git, so the sources are identified by their content.
src_hash() {
  find csrc torch_fused_ops tests benchmarks scripts -type f \( -name '*.py' -o -name '*.cu' -o -name '*.cpp' \
    -o -name '*.h' -o -name '*.cuh' -o -name '*.sh' \) -not -path '*/__pycache__/*' | LC_ALL=C sort | xargs cat | sha1sum | cut -c1-12
}

# The shards, one line each: pytest arguments.
shards() {
  local group f kept ignores="" have_xdist=""
  python3 -c "import xdist" 2>/dev/null && have_xdist=1
  for group in "${HEAVY[@]}"; do
    kept=""
    for f in $group; do
      [ -f "$f" ] || continue
      kept="$kept $f"
      ignores="$ignores --ignore=$f"
    done
    [ -n "$kept" ] && echo "${kept# }${have_xdist:+ -n $XDIST_HEAVY}"
  done
  echo "tests${ignores} -k cuda${have_xdist:+ -n $XDIST_REST}"
}

case "${1:-}" in
  --hash) src_hash; exit 0 ;;
  --plan) shards; exit 0 ;;
  -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
esac

STEPS=" ${*:-tests bench} "
for s in $STEPS; do
  case "$s" in tests|bench|train|loop|ncu|sass|sanitize) ;; *) echo "gpu.sh: unknown step '$s' (tests bench train loop ncu sass sanitize)"; exit 2 ;; esac
done
want() { [[ "$STEPS" == *" $1 "* ]]; }

OUT=${OUT:-/tmp/gpu_out}
T=/tmp/gpu_work
mkdir -p "$OUT" "$T"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a}
if [ -x /usr/bin/g++ ]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++; fi
summary="$OUT/summary.txt"
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }
DEADLINE=${DEADLINE:-570}
# A step's time limit: its own, cut to what is left before the deadline (0: skip the step).
budget() {
  local left=$((DEADLINE - SECONDS - 10))
  [ "$left" -lt 20 ] && { echo 0; return; }
  [ "$1" -lt "$left" ] && echo "$1" || echo "$left"
}
skipped() { note "$1: skipped, $((DEADLINE - SECONDS)) s left before the ${DEADLINE} s deadline"; }

ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "$ngpu" -gt 0 ] || ngpu=1
note "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || echo none)" \
  "x$ngpu; torch $(python3 -c 'import torch; print(torch.__version__)');" \
  "triton $(python3 -c 'import triton; print(triton.__version__)' 2>/dev/null || echo none);" \
  "sources $(src_hash); steps:$STEPS"

# ---- build ------------------------------------------------------------------------------------------------
t0=$SECONDS
if [ -z "${SKIP_BUILD:-}" ]; then
  if ! python3 -m pip install --no-build-isolation --no-deps -e . > "$T/build.log" 2>&1; then
    tail -30 "$T/build.log" | tee -a "$summary"
    note "BUILD FAILED after $((SECONDS - t0)) s"
    exit 1
  fi
  note "build: ok in $((SECONDS - t0)) s (TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST, CXX=${CXX:-default});" \
    "libstdc++: $(ldd torch_fused_ops/_C*.so 2>/dev/null | grep -o 'libstdc++[^ ]*' | head -1 || echo 'static (bad)')"
else
  note "build: skipped (SKIP_BUILD)"
fi

# ---- tests ------------------------------------------------------------------------------------------------
rc_all=0
# "N passed, M failed ..." of a pytest log, or its last line when it ended without one (a timeout).
result_line() { grep -E "[0-9]+ (passed|failed|errors?|skipped|deselected).* in [0-9.]+s" "$1" | tail -1 || tail -1 "$1"; }
if want tests; then
  t0=$SECONDS
  lim=$(budget "${TEST_TIMEOUT:-330}")
  : > "$OUT/tests.log"
  if [ "$lim" = 0 ]; then
    skipped tests
  elif [ -n "${TESTS:-}" ]; then
    # shellcheck disable=SC2086
    timeout "$lim" python3 -m pytest $TESTS ${TESTS_K:+-k "$TESTS_K"} -q -p no:cacheprovider -rfE \
      > "$OUT/tests.log" 2>&1
    rc=$?; [ $rc = 0 ] || rc_all=1
    note "tests ($TESTS${TESTS_K:+ -k $TESTS_K}): rc=$rc in $((SECONDS - t0)) s: $(result_line "$OUT/tests.log")"
    grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20 | tee -a "$summary"
  else
    mapfile -t plan < <(shards)
    pids=()
    for i in "${!plan[@]}"; do
      # shellcheck disable=SC2086
      CUDA_VISIBLE_DEVICES=$((i % ngpu)) timeout "$lim" python3 -m pytest ${plan[$i]} -q -p no:cacheprovider -rfE \
        > "$T/shard$((i + 1)).log" 2>&1 &
      pids+=($!)
    done
    passed=0 failed=0 skips=0
    for i in "${!pids[@]}"; do
      wait "${pids[$i]}"; rc=$?
      log="$T/shard$((i + 1)).log"
      [ $rc = 0 ] || rc_all=1
      { echo "==== shard $((i + 1)): pytest ${plan[$i]} (rc=$rc)"; cat "$log"; } >> "$OUT/tests.log"
      line=$(result_line "$log")
      note "shard $((i + 1)) (${plan[$i]:0:100}): rc=$rc: $line"
      grep -E "^(FAILED|ERROR)" "$log" | head -10 | tee -a "$summary"
      p=$(grep -oE "[0-9]+ passed" <<< "$line" | grep -oE "[0-9]+"); passed=$((passed + ${p:-0}))
      p=$(grep -oE "[0-9]+ skipped" <<< "$line" | grep -oE "[0-9]+"); skips=$((skips + ${p:-0}))
      for f in $(grep -oE "[0-9]+ (failed|errors?)" <<< "$line" | grep -oE "[0-9]+"); do failed=$((failed + f)); done
    done
    note "tests: $passed passed, $failed failed or errors, $skips skipped, in $((SECONDS - t0)) s ($([ $rc_all = 0 ] && echo 'every shard rc=0' || echo 'a shard FAILED or timed out'))"
  fi
fi

if [ -n "${EXTRA:-}" ]; then
  t0=$SECONDS
  lim=$(budget "${EXTRA_TIMEOUT:-200}")
  if [ "$lim" = 0 ]; then skipped "extra ($EXTRA)"; else
    OUT="$OUT" timeout "$lim" bash -c "$EXTRA" > "$OUT/extra.log" 2>&1
    note "extra ($EXTRA): rc=$? in $((SECONDS - t0)) s"; tail -40 "$OUT/extra.log" >> "$summary"
  fi
fi

# ---- bench ------------------------------------------------------------------------------------------------
if want bench; then
  t0=$SECONDS
  lim=$(budget "${BENCH_TIMEOUT:-240}")
  if [ "$lim" = 0 ]; then skipped bench; else
    # shellcheck disable=SC2086
    timeout "$lim" python3 -m torch_fused_ops.tools.bench \
      ${BENCH_ARGS:---shapes 1,32,8,16,16;16,32,32,64,64 --model-configs fp32,bf16,fp32-strict,autocast-bf16} --out "$T" \
      > "$OUT/bench.md" 2> "$T/bench.log"
    rc=$?; [ $rc = 0 ] || rc_all=1
    note "bench: rc=$rc in $((SECONDS - t0)) s"
    cat "$OUT/bench.md" >> "$summary"
    tail -5 "$T/bench.log" >> "$summary"
    cp "$T"/bench_cuda.json "$T"/bench_cuda.png "$OUT/" 2>/dev/null
  fi
fi

# ---- the training-step and loop benches --------------------------------------------------------------------
# bench_module STEP MODULE TIMEOUT ARGS...: python -m torch_fused_ops.tools.MODULE ARGS --out $T, its tables into
# bench.md and the summary, its JSON into $OUT (the partial rows when it stopped early).
bench_module() {
  local step=$1 module=$2 lim t0=$SECONDS rc
  lim=$(budget "$3")
  shift 3
  if [ "$lim" = 0 ]; then skipped "$step"; return; fi
  timeout "$lim" python3 -m "torch_fused_ops.tools.$module" "$@" --out "$T" > "$T/$module.md" 2> "$T/$module.log"
  rc=$?; [ $rc = 0 ] || rc_all=1
  note "$step: rc=$rc in $((SECONDS - t0)) s"
  cat "$T/$module.md" >> "$OUT/bench.md"
  cat "$T/$module.md" >> "$summary"
  # The rows measured before a timeout or a failure are in the progress log only.
  if [ $rc = 0 ]; then tail -3 "$T/$module.log" >> "$summary"; else tail -40 "$T/$module.log" >> "$summary"; fi
  cp "$T/$module.json" "$OUT/" 2>/dev/null || cp "$T/$module.partial.json" "$OUT/" 2>/dev/null
}
# shellcheck disable=SC2086
want train && bench_module train bench_train "${TRAIN_TIMEOUT:-300}" ${TRAIN_ARGS:-}
# shellcheck disable=SC2086
want loop && bench_module loop bench_loop "${LOOP_TIMEOUT:-240}" ${LOOP_ARGS:-}

# ---- Nsight Compute ---------------------------------------------------------------------------------------
if want ncu; then
  t0=$SECONDS
  lim=$(budget "${NCU_TIMEOUT:-180}")
  if [ "$lim" = 0 ]; then skipped ncu; else
    if [ -n "${NCU_TRAIN:-}" ]; then
      ncu_range=(--profile-from-start off ${NCU_KERNELS:+-k "regex:$NCU_KERNELS"})
      # Inductor compiles in this process: no pool of compile workers for ncu to attach to.
      ncu_cmd=(env TORCHINDUCTOR_COMPILE_THREADS=1 python3 -m torch_fused_ops.tools.bench_train
               --ncu-step "${NCU_TRAIN_CONFIG:-tf32}")
    else
      ncu_range=(-k "regex:${NCU_KERNELS:-post_pool|channel_partials|grad_}")
      ncu_cmd=(python3 benchmarks/profile_kernels.py)
    fi
    # shellcheck disable=SC2086
    timeout "$lim" ncu --clock-control none "${ncu_range[@]}" \
      ${NCU_ARGS:---section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats} \
      "${ncu_cmd[@]}" > "$OUT/ncu.txt" 2>&1
    rc=$?; [ $rc = 0 ] || rc_all=1
    note "ncu: rc=$rc in $((SECONDS - t0)) s, $(grep -c 'Section: GPU Speed Of Light' "$OUT/ncu.txt") kernels profiled (ncu.txt)"
    grep -E "^  [a-zA-Z_].*\(|Duration|Memory Throughput|Registers Per Thread|Achieved Occupancy" "$OUT/ncu.txt" \
      | head -80 >> "$summary"
  fi
fi

# ---- machine code -----------------------------------------------------------------------------------------
if want sass; then
  lib=$(ls torch_fused_ops/_C*.so 2>/dev/null | head -1)
  if [ -z "$lib" ] || ! command -v cuobjdump > /dev/null; then
    note "sass: skipped (library: ${lib:-none}; cuobjdump: $(command -v cuobjdump || echo none))"
  else
    cuobjdump -sass "$lib" > "$T/sass_all.txt" 2>&1
    python3 - "$T/sass_all.txt" "${SASS_KERNELS:-grad_weight_kernel|grad_input_kernel|conv_transpose3d_post_pool_kernel}" \
      > "$OUT/sass.txt" <<'PY'
import collections, re, sys
text = open(sys.argv[1]).read()
want = re.compile(sys.argv[2])
blocks = [b for b in re.split(r"\n\s*Function : ", text)[1:] if want.search(b.split("\n", 1)[0])]
op = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")
for b in blocks:
    counts = collections.Counter(op.findall(b))
    print(f"{b.split(chr(10), 1)[0].strip()}: {sum(counts.values())} instructions; "
          + ", ".join(f"{k} {v}" for k, v in counts.most_common(30)))
for b in blocks:
    print("\n==== " + b)
PY
    note "sass: rc=$? ($(grep -c ': [0-9]* instructions;' "$OUT/sass.txt") kernels in sass.txt)"
    grep -E ": [0-9]+ instructions;" "$OUT/sass.txt" | cut -c1-400 >> "$summary"
  fi
fi

# ---- compute-sanitizer ------------------------------------------------------------------------------------
if want sanitize; then
  sel=${SANITIZE_TESTS:-tests/post_pool/test_forward.py tests/post_pool/test_autograd.py tests/post_pool/test_bias.py tests/post_pool/test_errors.py tests/post_pool/test_opcheck.py tests/conv_transpose3d_post_pool/test_conv_cuda_kernel.py}
  sanitize_k=${SANITIZE_K:-cuda and not (test_conv_cuda_kernel and not (strict_unsafe or nonfinite))}
  : > "$OUT/sanitize.log"
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck}; do
    t0=$SECONDS
    lim=$(budget "${SANITIZE_TIMEOUT:-200}")
    if [ "$lim" = 0 ]; then skipped "compute-sanitizer $tool"; continue; fi
    envs=(); [ "$tool" = memcheck ] && envs=(PYTORCH_NO_CUDA_MEMORY_CACHING=1)
    echo "==== compute-sanitizer --tool $tool: pytest $sel -k $sanitize_k" >> "$OUT/sanitize.log"
    # shellcheck disable=SC2086
    env "${envs[@]}" timeout "$lim" compute-sanitizer --tool "$tool" --error-exitcode 99 \
      python3 -m pytest $sel -k "$sanitize_k" -x -q -p no:cacheprovider > "$T/sanitize_$tool.log" 2>&1
    rc=$?; [ $rc = 0 ] || rc_all=1
    cat "$T/sanitize_$tool.log" >> "$OUT/sanitize.log"
    what=$([ $rc = 124 ] && echo "TIMED OUT at $(grep -oE '\[ *[0-9]+%\]' "$T/sanitize_$tool.log" | tail -1)" \
           || grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$T/sanitize_$tool.log" | tail -1)
    note "compute-sanitizer $tool: rc=$rc in $((SECONDS - t0)) s: $(result_line "$T/sanitize_$tool.log"); $what"
  done
fi

n=$(find "$OUT" -type f | wc -l)
[ "$n" -le 8 ] || note "WARNING: $n files in $OUT; the device tool returns 8"
note "total: $SECONDS s, $([ $rc_all = 0 ] && echo 'every step rc=0' || echo 'a step FAILED')"
echo "================ summary ================"
cat "$summary"
exit $rc_all
