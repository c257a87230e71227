#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the whole test suite; CUDA tests run when a GPU is present, else skip.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=${PYTHON:-python3}
"$PY" -m pytest tests -q "$@"
