"""Probe (not part of the engine): where a kernel's warps wait, per SASS instruction, from Nsight
Compute's source page. Collect and export first, e.g.

    ncu --clock-control none -k regex:matvec --launch-skip 3 --launch-count 1 \\
        --section SourceCounters --section WarpStateStats -o prof \\
        python bench/probes/matvec_ab.py --ncu Q6_K:8192x8192
    ncu --import prof.ncu-rep --page source --print-source sass --csv > sass.csv
    python bench/probes/ncu_sass_stalls.py sass.csv [--top 30] [--json PATH]

Prints the columns ncu wrote, the stall samples and executed instructions of each backward
branch's body (the loops) against the whole kernel, and the instructions with the most samples
(with their stall reasons where ncu gives them as columns).
"""
import argparse
import csv
import json
import re
import sys

_TARGET = re.compile(r"(\.L_x_\d+)")


def _num(s: str) -> float:
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return 0.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    with open(a.csv, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]  # ncu prefixes notes without quotes
    # the page opens with the kernel's name ("Kernel Name","..."); the table's header is the
    # first line naming the Source column
    head = next((i for i, ln in enumerate(lines) if '"Source"' in ln), None)
    if head is None:
        print("no Source column in the export", file=sys.stderr)
        return 1
    rows = list(csv.DictReader(lines[head:]))
    if not rows:
        print("no rows", file=sys.stderr)
        return 1
    cols = list(rows[0].keys())
    print("columns:", cols)
    src = next(c for c in cols if c.lower() == "source")
    samp = next((c for c in cols if "Sampling" in c and "All" in c), None) or next(
        c for c in cols if "Sampling" in c)
    exe = next((c for c in cols if c.startswith("Instructions Executed")), None)
    reasons = [c for c in cols if c.startswith("stall_") or "Stall" in c and c != samp
               and "Sampling" not in c]
    total = sum(_num(r[samp]) for r in rows) or 1.0
    total_exe = sum(_num(r[exe]) for r in rows) if exe else 0.0
    labels = {}
    for i, r in enumerate(rows):
        m = re.match(r"\s*(\.L_x_\d+):", r[src])
        if m:
            labels[m.group(1)] = i
    loops = []
    for i, r in enumerate(rows):
        if r[src].strip().split(" ")[0].startswith(("BRA", "@")) and "BRA" in r[src]:
            t = _TARGET.search(r[src])
            if t and t.group(1) in labels and labels[t.group(1)] <= i:
                body = rows[labels[t.group(1)]:i + 1]
                loops.append({"label": t.group(1), "n_insns": len(body),
                              "sample_share": round(sum(_num(b[samp]) for b in body) / total, 3),
                              "executed_share": round(sum(_num(b[exe]) for b in body)
                                                      / total_exe, 3) if exe else None})
    print(f"samples {total:.0f}; executed {total_exe:.0f}")
    for lp in loops:
        print(f"loop {lp['label']}: {lp['n_insns']} instructions, {lp['sample_share']:.1%} of "
              f"samples, executed {lp['executed_share']}")
    top = sorted(range(len(rows)), key=lambda i: -_num(rows[i][samp]))[:a.top]
    out = []
    for i in sorted(top):
        r = rows[i]
        why = {c: _num(r[c]) for c in reasons if _num(r[c]) > 0}
        why = dict(sorted(why.items(), key=lambda kv: -kv[1])[:3])
        out.append({"index": i, "source": r[src].strip(), "samples": _num(r[samp]),
                    "executed": _num(r[exe]) if exe else None, "reasons": why})
        print(f"{i:5d} {_num(r[samp]) / total:6.1%} {r[src].strip()[:70]:70} {why}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"columns": cols, "samples": total, "executed": total_exe,
                       "loops": loops, "top": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
