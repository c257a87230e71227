#!/usr/bin/env bash
# A second source tree measured in the same device call as this one (two trees compared without a second machine
# start): builds the tree at DIR in place (not installed), then runs the sm_90a kernel's bench and its CUDA tests
# against that build. Run it after scripts/gpu.sh in one `run` command, e.g. with DIR an archive of another branch
# unpacked into an untracked folder of this tree (one git does not ignore: the device copies only those):
#
#   git archive BRANCH | (mkdir -p beside && tar -x -C beside)        # here, before the device call
#   bash scripts/gpu.sh tests && bash scripts/gpu_beside.sh beside     # on the device
#
# Outputs in $OUT (give each tree its own OUT=... when measuring two): beside_build.log, beside_bench.txt,
# beside_tests.log. BESIDE_BENCH_ARGS (hopper_forward.py's, default --batches 16), BESIDE_BENCH_TIMEOUT (90),
# BESIDE_TEST_TIMEOUT (150) in seconds; BESIDE_TESTS and BESIDE_TESTS_K pick the tests (default: the fused
# convolution's kernel and cast tests, -k cuda).
set -uo pipefail
DIR=${1:?usage: gpu_beside.sh DIR}
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
cd "$DIR"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a}
if [ -x /usr/bin/g++ ]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++; fi
t0=$SECONDS
if ! python3 setup.py build_ext --inplace > "$OUT/beside_build.log" 2>&1; then
  tail -30 "$OUT/beside_build.log"
  echo "beside: BUILD FAILED after $((SECONDS - t0)) s"
  exit 1
fi
echo "beside: build ok in $((SECONDS - t0)) s; package from $(python3 -c 'import torch_fused_ops; print(torch_fused_ops.__file__)')"
# shellcheck disable=SC2086
timeout "${BESIDE_BENCH_TIMEOUT:-90}" python3 benchmarks/conv_transpose3d_post_pool/hopper_forward.py \
  ${BESIDE_BENCH_ARGS:---batches 16} > "$OUT/beside_bench.txt" 2>&1
echo "beside: bench rc=$?"
TESTS=${BESIDE_TESTS:-"tests/conv_transpose3d_post_pool/test_conv_cuda_kernel.py tests/conv_transpose3d_post_pool/test_conv_cast.py"}
# shellcheck disable=SC2086
timeout "${BESIDE_TEST_TIMEOUT:-150}" python3 -m pytest -q -x --tb=short -p no:cacheprovider $TESTS \
  -k "${BESIDE_TESTS_K:-cuda}" > "$OUT/beside_tests.log" 2>&1
echo "beside: tests rc=$?"
tail -3 "$OUT/beside_tests.log"
tail -12 "$OUT/beside_bench.txt"
