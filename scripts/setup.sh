#!/usr/bin/env bash
# Sets up a fresh machine: torch (if absent), the test tools, and an editable build of torch_fused_ops
# (CPU kernels always; CUDA kernels when torch is a CUDA build and nvcc is found, GPU or not).
#   TORCH_SPEC   what to install when torch is missing (default torch==2.14.1: a CUDA 13.0 build, so the CUDA
#                sources compile even on CPU-only machines)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "== installing ${TORCH_SPEC:-torch==2.14.1}"
  "$PY" -m pip install -q "${TORCH_SPEC:-torch==2.14.1}"
fi
"$PY" -c "import torch, sys; v = tuple(int(p) for p in torch.__version__.split('+')[0].split('.')[:2]); sys.exit(0 if v >= (2, 11) else 'torch >= 2.11 is required, found ' + torch.__version__)"
for mod in pytest hypothesis numpy; do
  "$PY" -c "import $mod" 2>/dev/null || "$PY" -m pip install -q "$mod"
done
echo "== building torch_fused_ops (torch $("$PY" -c 'import torch; print(torch.__version__)'))"
# --no-build-isolation: build against the torch installed above instead of downloading another one.
"$PY" -m pip install -q --no-build-isolation --no-deps -e .
"$PY" -c "import torch_fused_ops as t; print('== torch_fused_ops', t.__version__, '| CUDA kernels built:', t.has_cuda_kernels())"
