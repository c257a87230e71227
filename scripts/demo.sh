#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the main demo: the KernelBench Model eagerly and through fused.post_pool.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${PYTHON:-python3}" -m torch_fused_ops.demo "$@"
