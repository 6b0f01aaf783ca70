"""Where do a kernel's warps stall, and in which loop? A summary of ncu's per-instruction
source counters, one block per kernel of a report.

Collect on the GPU box (bench/one_call.py makes one call of a shape, warm-ups outside the
profiled range):

    ncu --profile-from-start off --clock-control none --section SourceCounters \\
        --section WarpStateStats --import-source no -o rep \\
        python bench/one_call.py ...
    ncu --import rep.ncu-rep --page source --csv --print-source sass > src.csv

then, anywhere, from the repo root (stdlib only):

    python -m tools.ncu_source_summary src.csv [--top 8]

Per kernel: warp-stall samples by reason; the instructions grouped by how often each ran (a
loop body shows up as one execution count: ``ex=67584, 484 instructions`` is a key-block loop
of 484 instructions run 67,584 times per warp-sum), with their share of the samples; and the
instructions with the most samples of the main stall reasons. This is how docs/perf-notes.md v13 found
the packed-Q copy (a 100-instruction loop, ~5 % of the samples) and the ping-pong barrier wait.
"""

from __future__ import annotations

import argparse
import collections
import csv
import sys

REASONS = ("stall_barrier", "stall_long_sb", "stall_wait", "stall_dispatch", "stall_mio",
           "stall_short_sb", "stall_math", "stall_selected", "stall_not_selected")


def kernels(path: str):
    """[(kernel name, header, rows)] from ``ncu --page source --csv`` output."""
    out, name, cur = [], None, None
    for row in csv.reader(open(path, newline="")):
        if not row:
            continue
        if row[0] == "Kernel Name" and len(row) > 1:
            name = row[1]
        elif row[0] == "Address":
            cur = (name or f"kernel {len(out)}", row, [])
            out.append(cur)
        elif cur is not None and len(row) >= len(cur[1]) - 2:
            cur[2].append(row)
    return out


def _num(cell: str) -> float:
    try:
        return float(cell.replace(",", "") or 0)
    except ValueError:
        return 0.0


def summarise(name: str, header: list[str], rows: list[list[str]], top: int) -> str:
    col = {c: i for i, c in enumerate(header)}
    samples = col["Warp Stall Sampling (All Samples)"]
    executed = col["Instructions Executed"]
    lines = [f"== {name}"]
    total = sum(_num(r[samples]) for r in rows) or 1.0
    by_reason = {k: sum(_num(r[col[k]]) for r in rows) for k in REASONS if k in col}
    lines.append(f"   samples {total:.0f}, instructions {sum(_num(r[executed]) for r in rows):,.0f}")
    lines.append("   " + ", ".join(f"{k[6:]} {100 * v / total:.1f}%"
                                   for k, v in sorted(by_reason.items(), key=lambda kv: -kv[1])))
    groups = collections.defaultdict(lambda: [0, 0.0])
    for r in rows:
        e = _num(r[executed])
        if e:
            groups[e][0] += 1
            groups[e][1] += _num(r[samples])
    lines.append("   by execution count (ex, instructions, share of samples):")
    for e, (n, s) in sorted(groups.items(), key=lambda kv: -kv[0] * kv[1][0])[:top]:
        lines.append(f"     ex={e:10,.0f}  {n:5d} instr  {100 * s / total:5.1f}%")
    for k in ("stall_barrier", "stall_long_sb", "stall_wait", "stall_mio", "stall_dispatch"):
        if k not in col:
            continue
        lines.append(f"   top {k[6:]}:")
        hot = sorted(rows, key=lambda r: -_num(r[col[k]]))[:top]
        for r in hot:
            lines.append(f"     {_num(r[col[k]]):6.0f}  {r[0][-5:]}  {r[1].strip()[:60]}  "
                         f"ex={_num(r[executed]):,.0f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    ap.add_argument("--top", type=int, default=8)
    a = ap.parse_args(argv)
    found = kernels(a.csv)
    if not found:
        print(f"error: no per-instruction table in {a.csv}", file=sys.stderr)
        return 2
    print("\n\n".join(summarise(n, h, r, a.top) for n, h, r in found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
