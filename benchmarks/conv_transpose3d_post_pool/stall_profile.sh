#!/usr/bin/env bash
# Where the sm_90a kernel's warps wait, on the installed (product) build: Nsight Compute over one launch (speed of
# light, warp states, launch statistics, the source page summed by stall_ledger.py, and the page itself gzipped).
# Results in $OUT/stall_<tag>*.
#
#   OUT=$OUT bash benchmarks/conv_transpose3d_post_pool/stall_profile.sh [PRECISION] [--train]   (tf32, inference)
set -uo pipefail
cd "$(dirname "$0")/../.."
# An in-place build (setup.py build_ext --inplace) is imported from this tree; an installed one from anywhere.
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
P=${1:-tf32} FORM=${2:-} HERE=benchmarks/conv_transpose3d_post_pool OUT=${OUT:-/tmp/stall_out}
TAG="$P${FORM:+_train}"
mkdir -p "$OUT"
timeout 150 ncu --clock-control none -k regex:hopper --launch-skip 1 --launch-count 1 --section SpeedOfLight \
  --section WarpStateStats --section LaunchStats --section Occupancy --section SourceCounters -o "/tmp/stall_$TAG" -f \
  python3 "$HERE/hopper_forward.py" --once --batches 16 --precisions "$P" $FORM > "/tmp/stall_${TAG}_ncu.log" 2>&1
echo "ncu ($TAG) rc=$?"
ncu -i "/tmp/stall_$TAG.ncu-rep" --print-details all > "$OUT/stall_${TAG}_details.txt" 2>&1
ncu -i "/tmp/stall_$TAG.ncu-rep" --page source --print-source sass --csv > "/tmp/stall_${TAG}_source.csv" 2>/dev/null
python3 "$HERE/stall_ledger.py" "/tmp/stall_${TAG}_source.csv" --top 40 > "$OUT/stall_${TAG}_ledger.txt" 2>&1
gzip -c "/tmp/stall_${TAG}_source.csv" > "$OUT/stall_${TAG}_source.csv.gz"  # every instruction, to read by address
grep -E "Duration|Registers Per|Warp Cycles Per Issued|Issued Ipc|Throughput" "$OUT/stall_${TAG}_details.txt" | head -12
head -40 "$OUT/stall_${TAG}_ledger.txt"
