#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the main demo: the KernelBench Model eagerly and through fused.post_pool.
#   bash scripts/demo.sh [--device cpu|cuda] [--batch N] [--no-compile]    the demo
#   bash scripts/demo.sh bench [bench options]                             the benchmark instead
#                                                                          (python -m torch_fused_ops.tools.bench)
#   SKIP_SETUP=1   the machine is already set up (skip the install and build)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${SKIP_SETUP:-}" ] || bash scripts/setup.sh
if [ "${1:-}" = "bench" ]; then
  shift
  exec "${PYTHON:-python3}" -m torch_fused_ops.tools.bench "$@"
fi
exec "${PYTHON:-python3}" -m torch_fused_ops.tools.demo "$@"
