#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the whole test suite; CUDA tests run when a GPU is present, else skip.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=${PYTHON:-python3}
"$PY" -m pytest tests -q "$@"
# Without a GPU the Triton kernels' tests run on Triton's CPU interpreter, which must be chosen before the kernel
# modules are imported: a second pytest process (in the first one those files report themselves skipped).
if [ "$("$PY" -c 'import torch; print(torch.cuda.is_available())')" = "False" ]; then
  TRITON_INTERPRET=1 "$PY" -m pytest tests/test_conv_post_pool_triton.py tests/test_conv_infer_op.py tests/test_conv_phase_gemm.py \
    -q "$@"
fi
