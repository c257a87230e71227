#!/usr/bin/env bash
# Where the sm_90a kernel's skeleton (no staging, no wgmma, no epilogue) spends its time, in one device call:
# a measurement build, the kernels one op call launches, then Nsight Compute over one ablated launch (speed of
# light, warp states, launch statistics, the source page summed by stall_ledger.py). Results in $OUT.
#
#   OUT=$OUT bash benchmarks/conv_transpose3d_post_pool/ablation_profile.sh [PRECISION] [BITS]   (tf32 7)
set -uo pipefail
cd "$(dirname "$0")/../.."
P=${1:-tf32} B=${2:-7} HERE=benchmarks/conv_transpose3d_post_pool OUT=${OUT:-/tmp/ablation_out}
mkdir -p "$OUT"
export TORCH_CUDA_ARCH_LIST=9.0a TORCH_FUSED_OPS_HOPPER_ABLATION=1 PYTHONUNBUFFERED=1
if [ -x /usr/bin/g++ ]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++; fi
t0=$SECONDS
python3 -m pip install --no-build-isolation --no-deps -e . > /tmp/ablation_build.log 2>&1
echo "measurement build rc=$? in $((SECONDS - t0)) s" | tee "$OUT/summary.txt"
for bits in "$B" 0; do
  timeout 60 python3 "$HERE/ablated_call.py" "$P" "$bits" --kernels 2>&1 | tee -a "$OUT/summary.txt"
done
timeout 120 ncu --clock-control none -k regex:hopper --launch-skip 3 --launch-count 1 --section SpeedOfLight \
  --section WarpStateStats --section LaunchStats --section SourceCounters -o /tmp/ablation -f \
  python3 "$HERE/ablated_call.py" "$P" "$B" > /tmp/ablation_ncu.log 2>&1
echo "ncu rc=$?" | tee -a "$OUT/summary.txt"
ncu -i /tmp/ablation.ncu-rep --print-details all > "$OUT/ncu_details.txt" 2>&1
ncu -i /tmp/ablation.ncu-rep --page source --print-source sass --csv > /tmp/ablation_source.csv 2>/dev/null
python3 "$HERE/stall_ledger.py" /tmp/ablation_source.csv --top 30 > "$OUT/ledger.txt" 2>&1
grep -E "Duration|Registers|Warp Cycles Per Issued|Issued Ipc" "$OUT/ncu_details.txt" | tee -a "$OUT/summary.txt"
head -50 "$OUT/ledger.txt"
