#!/usr/bin/env python3
"""kernel-stalls.py: where a kernel's warps wait, from Nsight Compute's per-instruction page.

Input: the output of
    ncu -i REPORT.ncu-rep --page source --print-source sass --csv
for a report taken with the WarpStateStats and SourceCounters sections (what
scripts/device-forward.sh --stalls writes as stalls-N-sass.csv).  The file holds one table per
profiled kernel ("Kernel Name" line, then a header row starting with "Address").  For each
kernel (a table repeating an earlier one is named, not printed again), prints the stall
reasons' shares of all warp samples, the samples by opcode (predicate and modifiers dropped:
where a loop's time sits by kind of instruction), the instructions holding the most
samples with their leading reasons, and the instructions with the most excess shared-memory
wavefronts and global sectors (bank conflicts, uncoalesced loads).

Usage: kernel-stalls.py CSV [--top N]
"""
import argparse
import csv
import sys


def num(s):
    try:
        return float((s or "0").replace(",", ""))
    except ValueError:
        return 0.0


def read_kernels(path):
    """[(kernel name, [row dict, ...]), ...] in file order."""
    kernels = []
    header = None
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "Kernel Name":
                kernels.append((row[1] if len(row) > 1 else "?", []))
                header = None
            elif row[0] == "Address":
                header = row
                if not kernels:
                    kernels.append(("?", []))
            elif header and kernels:
                kernels[-1][1].append(dict(zip(header, row)))
    return kernels


def reasons(row):
    """The row's stall sample counts by reason (all samples, not the not-issued split)."""
    return {k[len("stall_"):]: num(v) for k, v in row.items()
            if k.startswith("stall_") and "(Not" not in k and num(v) > 0}


def opcode(source):
    """An instruction's opcode without its predicate and modifiers: "@P3 LDS.128 R32, [R40]" -> "LDS"."""
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def report(name, rows, top):
    total = {}
    for r in rows:
        for k, v in reasons(r).items():
            total[k] = total.get(k, 0.0) + v
    samples = sum(total.values())
    print(f"== {name}: {len(rows)} instructions, {samples:.0f} warp samples")
    if not samples:
        print("   no stall samples (was the report taken with the WarpStateStats/SourceCounters sections?)")
        return
    shares = sorted(total.items(), key=lambda kv: -kv[1])
    print("   stall reasons: " + ", ".join(f"{k} {v / samples * 100:.1f}%" for k, v in shares if v / samples >= 0.005))
    key = "Warp Stall Sampling (All Samples)"
    by_op = {}
    for r in rows:
        op = opcode(r.get("Source", ""))
        by_op[op] = by_op.get(op, 0.0) + num(r.get(key))
    ops = [(k, v) for k, v in sorted(by_op.items(), key=lambda kv: -kv[1]) if v / samples >= 0.01]
    print("   samples by opcode: " + ", ".join(f"{k} {v / samples * 100:.1f}%" for k, v in ops[:12]))
    hot = sorted(rows, key=lambda r: -num(r.get(key)))[:top]
    print(f"   the {len(hot)} instructions with the most samples:")
    for r in hot:
        s = num(r.get(key))
        if not s:
            break
        lead = sorted(reasons(r).items(), key=lambda kv: -kv[1])[:2]
        why = ", ".join(f"{k} {v / s * 100:.0f}%" for k, v in lead)
        print(f"   {s / samples * 100:5.1f}%  {r.get('Address', '?')[-6:]:>6}  {r.get('Source', '').strip()[:56]:56}  {why}")
    for col, what in (("L1 Wavefronts Shared Excessive", "excess shared-memory wavefronts"),
                      ("L2 Theoretical Sectors Global Excessive", "excess global sectors")):
        worst = [r for r in sorted(rows, key=lambda r: -num(r.get(col))) if num(r.get(col)) > 0][:3]
        if not worst:
            continue
        all_col = col.replace(" Excessive", "")
        print(f"   {what}:")
        for r in worst:
            ex, tot = num(r.get(col)), num(r.get(all_col))
            share = f" of {tot:.0f} ({ex / tot * 100:.0f}%)" if tot else ""
            print(f"           {r.get('Address', '?')[-6:]:>6}  {r.get('Source', '').strip()[:56]:56}  {ex:.0f}{share}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=8)
    a = ap.parse_args()
    kernels = read_kernels(a.csv)
    if not kernels or not any(rows for _, rows in kernels):
        sys.exit(f"kernel-stalls: no per-instruction table (an \"Address\" header) in {a.csv}")
    seen = []
    for i, (name, rows) in enumerate(kernels):
        if (name, rows) in seen:  # ncu may print a result's table twice
            print(f"== {name}: table {i + 1} repeats an earlier one")
            continue
        seen.append((name, rows))
        report(name, rows, a.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
