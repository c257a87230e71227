"""Where a kernel's warps wait, per SASS instruction: Nsight Compute's source page (PC sampling) summed by opcode
and by stall reason, and the instructions holding most samples.

    ncu --clock-control none -k regex:hopper --launch-skip 1 --launch-count 1 --section SourceCounters \\
        --section WarpStateStats -o prof python benchmarks/conv_transpose3d_post_pool/hopper_forward.py --once \\
        --precisions bf16
    ncu -i prof.ncu-rep --page source --print-source sass --csv > source.csv
    python benchmarks/conv_transpose3d_post_pool/stall_ledger.py source.csv [--top 40]

A sample is one warp seen at one instruction; its reason says why that warp did not issue. The kernel's roles show
by their instructions: the producer's global loads (LDG) and shared stores (STS), the consumers' wgmma (HGMMA) and
their waits (WARPGROUP.DEPBAR / WARPSYNC), mbarrier waits (SYNCS), the epilogue's float math and global stores (STG).
"""
from __future__ import annotations

import argparse
import csv
import io
import re
import sys
from collections import defaultdict


def read_rows(path):
    text = open(path, encoding="utf-8", errors="replace").read()
    # ncu prints "==PROF==" lines and a kernel header before the table: start at the header row.
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"') and "Source" in l), None)
    if start is None:
        sys.exit(f"no CSV table with a Source column in {path}:\n" + "\n".join(lines[:20]))
    return list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))


def number(v):
    try:
        return float(str(v).replace(",", ""))
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    rows = read_rows(args.csv)
    cols = list(rows[0].keys())
    print("columns:", ", ".join(cols))
    total_col = next((c for c in cols if c.startswith("Warp Stall Sampling (All")), None)
    if total_col is None:
        sys.exit("no 'Warp Stall Sampling (All Samples)' column: collect with --section SourceCounters")
    # Per-reason columns of the all-samples kind, where ncu prints them ("stall_<reason>" style names).
    reason_cols = [c for c in cols if re.match(r"^(smsp__pcsamp_warps_issue_stalled_|stall_)", c)
                   and "not_issued" not in c]
    total = sum(number(r[total_col]) for r in rows) or 1.0
    by_op = defaultdict(float)
    for r in rows:
        src = r.get("Source", "")
        op = re.sub(r"^@!?U?P\w+\s+", "", src.strip()).split(" ")[0] if src.strip() else "?"
        by_op[op] += number(r[total_col])
    print(f"\n{int(total)} samples; by opcode (share of all samples):")
    for op, v in sorted(by_op.items(), key=lambda kv: -kv[1])[:25]:
        print(f"  {op:28s} {v / total:7.1%}")
    if reason_cols:
        print("\nby reason:")
        sums = {c: sum(number(r[c]) for r in rows) for c in reason_cols}
        for c, v in sorted(sums.items(), key=lambda kv: -kv[1])[:15]:
            print(f"  {c:60s} {v / total:7.1%}")
    print(f"\ntop {args.top} instructions:")
    addr_col = next((c for c in cols if c.lower().startswith("address")), None)
    ranked = sorted(rows, key=lambda r: -number(r[total_col]))[:args.top]
    for r in ranked:
        reasons = sorted(((number(r[c]), c) for c in reason_cols), reverse=True)[:2]
        why = ", ".join(f"{c.split('stalled_')[-1]} {v:.0f}" for v, c in reasons if v)
        print(f"  {number(r[total_col]) / total:6.1%}  {r.get(addr_col, '') if addr_col else ''}  "
              f"{r.get('Source', '').strip()[:70]:70s}  {why}")


if __name__ == "__main__":
    main()
