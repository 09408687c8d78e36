#!/usr/bin/env python3
"""kernel-times.py: one forward call's kernels, from an Nsight Compute CSV.

Input: the output of
    ncu --profile-from-start off --metrics gpu__time_duration.sum[,dram__bytes_read.sum,dram__bytes_write.sum] \
        --csv --print-units base \
        --print-kernel-base function --cache-control none --clock-control none \
        duet-check-forward --bench --decode-only --batches B1,B2,...
(duet-check-forward profiles one decode step a batch size, in the order of --batches).
Each step starts at its embedding kernel (embed_kernel), or at the index-K entry list's
expansion (kv_entries_kernel) launched just before it.  For each step, prints the kernel
count, the sum of the kernels' durations (the device's busy time: the step's time less this
is the gaps between kernels, launch latency and host work), and the kernels by total time.
Where the CSV has the DRAM byte counts, each kernel also gets the bytes it moved to and from
DRAM, their rate, and (with --copy-gbs, the device copy ceiling of the same run) that rate as
a share of the ceiling: the measure of a memory-bound kernel without launch latency in it.

Usage: kernel-times.py CSV [--labels 1,32] [--top N] [--step-ms 2.08,6.49] [--launches MIN_US]
                       [--copy-gbs 4236]
"""
import argparse
import csv
import sys
from collections import OrderedDict


def read_rows(path):
    with open(path, newline="") as f:
        lines = f.readlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        sys.exit("kernel-times: no CSV header (\"ID\",...) in %s" % path)
    # a launch's metrics are rows of the same ID, in launch order
    launches = OrderedDict()
    for r in csv.DictReader(lines[start:]):
        name = r.get("Metric Name")
        if name not in ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum"):
            continue
        unit = (r.get("Metric Unit") or "").strip()
        v = float(r["Metric Value"].replace(",", ""))
        key = (r.get("ID"), r["Kernel Name"])
        d = launches.setdefault(key, {"name": r["Kernel Name"], "grid": r.get("Grid Size", ""),
                                      "block": r.get("Block Size", ""), "us": None, "bytes": None})
        if name == "gpu__time_duration.sum":
            scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}.get(unit or "ns")
            if scale is None:
                sys.exit("kernel-times: unknown unit %r" % unit)
            d["us"] = v * scale
        else:
            scale = {"": 1.0, "byte": 1.0, "bytes": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}.get(unit)
            if scale is None:
                sys.exit("kernel-times: unknown unit %r" % unit)
            d["bytes"] = (d["bytes"] or 0.0) + v * scale
    return [(d["name"], d["us"], d["grid"], d["block"], d["bytes"]) for d in launches.values() if d["us"] is not None]


def rate(nbytes, us, copy_gbs):
    """' 12.3 MB 3.21 TB/s 76%' for bytes moved in us microseconds, or '' without bytes"""
    if nbytes is None or us <= 0:
        return ""
    gbs = nbytes / (us * 1e3)
    s = "  %8.1f MB %5.2f TB/s" % (nbytes / 1e6, gbs / 1e3)
    if copy_gbs > 0:
        s += " %4.0f%%" % (100.0 * gbs / copy_gbs)
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--labels", default="")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--step-ms", default="", help="the steps' measured times, for the busy share")
    ap.add_argument("--launches", type=float, default=-1.0,
                    help="also list each launch of at least this many us, in order (grid, block)")
    ap.add_argument("--copy-gbs", type=float, default=0.0,
                    help="the device copy ceiling (GB/s, bytes read + written) for the DRAM rate's share")
    a = ap.parse_args()
    rows = read_rows(a.csv)
    steps = []
    prev = ""
    for name, us, grid, block, nb in rows:
        # a step opens at kv_entries_kernel (when it has an index-K list), else at embed_kernel
        if (not steps or name.startswith("kv_entries_kernel")
                or (name.startswith("embed_kernel") and not prev.startswith("kv_entries_kernel"))):
            steps.append([])
        steps[-1].append((name, us, grid, block, nb))
        prev = name
    labels = a.labels.split(",") if a.labels else [str(i) for i in range(len(steps))]
    step_ms = [float(x) for x in a.step_ms.split(",")] if a.step_ms else []
    for i, st in enumerate(steps):
        busy = sum(x[1] for x in st)
        lab = labels[i] if i < len(labels) else str(i)
        line = "kernels step %s: %d kernels, %.3f ms busy" % (lab, len(st), busy / 1e3)
        if i < len(step_ms) and step_ms[i] > 0:
            line += " of the %.3f ms step (%.0f%%; %.1f us a kernel left between them)" % (
                step_ms[i], 100.0 * busy / 1e3 / step_ms[i], (step_ms[i] * 1e3 - busy) / len(st))
        print(line)
        agg = OrderedDict()
        for name, us, _, _, nb in st:
            n, t, mx, b = agg.get(name, (0, 0.0, 0.0, None))
            agg[name] = (n + 1, t + us, max(mx, us), None if nb is None else (b or 0.0) + nb)
        short = [x[1] for x in st if x[1] < 5.0]
        print("  %d of them under 5 us (%.3f ms together)" % (len(short), sum(short) / 1e3))
        for name, (n, t, mx, b) in sorted(agg.items(), key=lambda kv: -kv[1][1])[: a.top]:
            print("  %8.1f us %5.1f%%  %4d x  (max %7.1f us)%s  %s" % (t, 100.0 * t / busy, n, mx,
                                                                    rate(b, t, a.copy_gbs), name[:80]))
        if a.launches >= 0:
            for k, (name, us, grid, block, nb) in enumerate(st):
                if us >= a.launches:
                    print("  #%-4d %8.1f us  grid %-14s block %-12s%s %s" % (k, us, grid, block,
                                                                         rate(nb, us, a.copy_gbs), name[:60]))


if __name__ == "__main__":
    main()
