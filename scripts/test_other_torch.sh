#!/usr/bin/env bash
# The test suite once more, against another torch in a virtual environment of its own, from a copy of this tree (so
# that the extension built against that torch does not replace this tree's). Default: torch 2.13.0, the CPU-only
# build pip finds on the CI machine's disk: a release between the oldest we support (2.11, the GPU machine's) and the
# one scripts/setup.sh installs (2.14.1), and a CPU-only build, where the CUDA sources are not compiled and fake CUDA
# tensors cannot be used (the tests that need them skip and say so).
#   OTHER_TORCH_SPEC      what pip installs (default torch==2.13.0)
#   OTHER_TORCH_DIR       the copy and its environment (default /tmp/other_torch_check)
#   OTHER_TORCH_OPTIONAL  1: where pip cannot install OTHER_TORCH_SPEC (a release not on this machine's disk and no
#                         network), say so in a NOT RUN line and exit 0 instead of failing; a failing test still fails
set -euo pipefail
cd "$(dirname "$0")/.."
SPEC=${OTHER_TORCH_SPEC:-torch==2.13.0}
DIR=${OTHER_TORCH_DIR:-/tmp/other_torch_check}
rm -rf "$DIR"
mkdir -p "$DIR/tree"
# The tracked files as they are in the working tree (untracked and ignored ones, builds included, stay behind).
git ls-files -z | xargs -0 cp --parents -t "$DIR/tree"
python3 -m venv "$DIR/venv"
echo "== installing $SPEC into $DIR/venv"
if ! "$DIR/venv/bin/python" -m pip install -q "$SPEC" numpy pytest hypothesis setuptools wheel ninja; then
  if [ "${OTHER_TORCH_OPTIONAL:-0}" = 1 ]; then
    echo "== NOT RUN: the suite against $SPEC (pip could not install it here)"
    exit 0
  fi
  exit 1
fi
cd "$DIR/tree"
PYTHON="$DIR/venv/bin/python" bash scripts/test.sh "$@"
