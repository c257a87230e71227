# Shared by scripts/gpu_dev.sh and scripts/gpu_final.sh (sourced): the environment of a device call, the summary
# file and its note(), a content hash of the sources, and the extension build.
#   gpu_setup NAME   OUT (default /tmp/NAME_out; the device tool sets it), T=/tmp/NAME_work, $OUT/summary.txt
#   build_extension  pip install -e . (skipped with SKIP_BUILD=1), its time in the summary; exits on failure

gpu_setup() {
  OUT=${OUT:-/tmp/$1_out}
  T=/tmp/$1_work; mkdir -p "$OUT" "$T"
  export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
  # The system compiler: a g++ that embeds its own static libstdc++ (/opt/gcc on one GPU image) broke the
  # extension's error formatting (README, Troubleshooting).
  if [ -x /usr/bin/g++ ]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++; fi
  summary="$OUT/summary.txt"; : > "$summary"
  note "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l);" \
    "torch $(python3 -c 'import torch; print(torch.__version__)'); triton $(python3 -c 'import triton; print(triton.__version__)');" \
    "sources sha1 $(src_hash)"
}

note() { echo "$*" | tee -a "$summary"; }

# The device's copy of the tree may carry a stale .git, so the sources are identified by their content: compare
# with `bash scripts/gpu_final.sh --hash` here.
src_hash() {
  find csrc torch_fused_ops tests benchmarks scripts -type f \( -name '*.py' -o -name '*.cu' -o -name '*.cpp' \
    -o -name '*.h' -o -name '*.sh' \) -not -path '*/__pycache__/*' | LC_ALL=C sort | xargs cat | sha1sum | cut -c1-12
}

build_extension() {
  local t0=$SECONDS rc=0
  if [ -z "${SKIP_BUILD:-}" ]; then
    python3 -m pip install --no-build-isolation --no-deps -e . > "$T/build.log" 2>&1; rc=$?
  fi
  note "build rc=$rc after $((SECONDS - t0)) s"
  [ "$rc" = 0 ] || { tail -30 "$T/build.log" | tee -a "$summary"; exit 1; }
}
