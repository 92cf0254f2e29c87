"""Top SASS instructions by sampled warp stalls from `ncu -i REPORT --page source --print-source sass --csv`.

`python scripts/ncu_sass_top.py SASS.csv [N]`: prints the N instructions with the most stall samples (all
samples), their share, the stall samples summed per opcode and per loop (a backward branch's range, with the
warp instructions it executed); what Nsight Compute's source page shows, as text for a log.
"""

from __future__ import annotations

import csv
import re
import sys
from collections import Counter


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        sys.exit("usage: ncu_sass_top.py SASS.csv [N]")
    n = int(argv[1]) if len(argv) > 1 else 40
    with open(argv[0], newline="") as f:
        lines = [ln for ln in f if ln.strip() and not ln.startswith("==")]
    # the page starts with a "Kernel Name" line; the table's header is the first line naming "Source"
    head = next((i for i, ln in enumerate(lines) if '"Source"' in ln), None)
    rows = list(csv.DictReader(lines[head:])) if head is not None else []
    cols = list(rows[0]) if rows else []
    src = next((c for c in cols if c and c.strip().lower() == "source"), None)
    samp = next((c for c in cols if c and "Warp Stall Sampling (All" in c), None)
    if not (rows and src and samp):
        sys.exit(f"ncu_sass_top: {argv[0]} is not a source-page CSV with stall samples "
                 "(ncu -i REPORT --page source --print-source sass --csv)")
    addr = next((c for c in cols if c.strip().lower() == "address"), None)

    def num(v):
        try:
            return float(str(v).replace(",", ""))
        except ValueError:
            return 0.0

    total = sum(num(r[samp]) for r in rows) or 1.0
    print(f"{len(rows)} instructions, {total:.0f} stall samples; columns: {cols}")
    for r in sorted(rows, key=lambda r: -num(r[samp]))[:n]:
        print(f"{num(r[samp]) / total * 100:5.1f} %  {r.get(addr, '') if addr else ''}  {r[src].strip()[:110]}")
    per_op = Counter()
    for r in rows:
        op = re.sub(r"^@!?U?P\w+\s+", "", r[src].strip()).split(" ")[0].split(".")[0]
        per_op[op] += num(r[samp])
    print("per opcode:", ", ".join(f"{op} {v / total * 100:.1f} %" for op, v in per_op.most_common(15)))
    if addr:  # per loop: the instructions from a backward branch's target to the branch (outermost loops first)
        at = [int(str(r[addr]), 16) for r in rows]
        loops = []
        for i, r in enumerate(rows):
            m = re.search(r"BRA\s+(?:`\(\.\w+\)\s*)?(0x[0-9a-f]+)", r[src])
            if m:
                target = int(m.group(1), 16)
                target += at[0] if target < at[0] else 0  # an offset from the function's start, or an address
                if target < at[i]:
                    loops.append((target, at[i]))
        inst = next((c for c in cols if c.strip() == "Instructions Executed"), None)
        for lo, hi in sorted(loops):
            body = [r for a, r in zip(at, rows) if lo <= a <= hi]
            executed = sum(num(r[inst]) for r in body) if inst else 0
            share = sum(num(r[samp]) for r in body) / total * 100
            print(f"loop {lo:#x}-{hi:#x}: {len(body)} instructions, {share:.1f} % of stall samples, "
                  f"{executed:.0f} warp instructions executed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
