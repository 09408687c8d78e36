#!/usr/bin/env python3
"""scripts/kernel-times.py on a made-up Nsight Compute CSV: the steps split at each embedding
kernel (or at the index-K list's expansion launched just before it), durations in any of ncu's
units (thousands separators included) summed, the busy share against the step times given, the
launch list, each kernel's DRAM bytes and rate against the copy ceiling where the CSV has them,
and a clear error for a file with no table."""
import sys

from scripttest import Checks, run

HEAD = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
        '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"\n')


def row(i, name, unit, value, grid="(8, 1, 1)", metric="gpu__time_duration.sum"):
    return (f'"{i}","1","duet-check-forward","h","{name}","1","7","(128, 1, 1)","{grid}","0","9.0",'
            f'"Command line profiler metrics","{metric}","{unit}","{value}"\n')


def main():
    c = Checks()
    check = c.check

    csv = "==PROF== Connected to process 1\n" + HEAD
    # step one: 3 kernels, 2 + 1.5 + 0.5 = 4 us; step two: 2 kernels, 1,000 ns + 0.003 ms = 4 us
    csv += row(0, "embed_kernel", "us", "2") + row(1, "gemv_tc_kernel", "usecond", "1.5", "(32, 1, 16)")
    csv += row(2, "rmsnorm_kernel", "ns", "500")
    csv += row(3, "embed_kernel", "nsecond", "1,000") + row(4, "gemv_tc_kernel", "ms", "0.003")
    p = run("kernel-times.py", ["--labels", "1,32", "--step-ms", "0.008,0.005", "--launches", "1.2"], csv)
    out = p.stdout
    check(p.returncode == 0, f"exit 0 ({p.returncode}: {p.stderr.strip()[:200]})")
    check("kernels step 1: 3 kernels, 0.004 ms busy of the 0.008 ms step (50%; 1.3 us a kernel left" in out,
          "step one: three kernels, 4 us busy of 8 (50%)")
    check("kernels step 32: 2 kernels, 0.004 ms busy of the 0.005 ms step (80%" in out,
          "step two: two kernels, 4 us busy of 5 (80%), units converted")
    check("grid (32, 1, 16)" in out and "1.5 us" in out, "launches of at least 1.2 us listed with their grid")
    check("rmsnorm_kernel" in out.split("kernels step 32")[0] and
          not any("#2 " in ln and "rmsnorm" in ln for ln in out.splitlines()),
          "the 0.5 us launch in the totals, not in the launch list")
    check("3.0 us  75.0%" in out.split("kernels step 32")[1], "per-kernel totals with their share of the busy time")
    # a step that expands its index-K list first opens at kv_entries_kernel, and its embedding
    # right after does not open another; a step without the list opens at its embedding
    csv = HEAD + row(0, "kv_entries_kernel", "us", "2") + row(1, "embed_kernel", "us", "1")
    csv += row(2, "rmsnorm_kernel", "us", "1") + row(3, "embed_kernel", "us", "3")
    csv += row(4, "kv_entries_kernel", "us", "1") + row(5, "embed_kernel", "us", "1")
    p = run("kernel-times.py", ["--labels", "a,b,c"], csv)
    out = p.stdout
    check(p.returncode == 0 and "kernels step a: 3 kernels, 0.004 ms busy" in out and
          "kernels step b: 1 kernels, 0.003 ms busy" in out and "kernels step c: 2 kernels, 0.002 ms busy" in out,
          "steps open at kv_entries_kernel, or at embed_kernel without one before it")
    # DRAM bytes (read + write, any of ncu's byte units) beside the durations: a kernel's rate and
    # its share of the copy ceiling, summed over its launches and given for each launch
    csv = HEAD + row(0, "embed_kernel", "us", "1")
    csv += row(1, "gemv_ws_kernel", "Mbyte", "30", metric="dram__bytes_read.sum")
    csv += row(1, "gemv_ws_kernel", "byte", "2,000,000", metric="dram__bytes_write.sum")
    csv += row(1, "gemv_ws_kernel", "us", "10")
    csv += row(2, "gemv_ws_kernel", "Kbyte", "16,000", metric="dram__bytes_read.sum")
    csv += row(2, "gemv_ws_kernel", "byte", "0", metric="dram__bytes_write.sum")
    csv += row(2, "gemv_ws_kernel", "us", "6")
    p = run("kernel-times.py", ["--labels", "32", "--copy-gbs", "4000", "--launches", "0"], csv)
    out = p.stdout
    # 32 + 16 MB in 16 us: 3.00 TB/s, 75% of 4,000 GB/s; the first launch 32 MB in 10 us: 80%
    check(p.returncode == 0 and "2 x  (max    10.0 us)      48.0 MB  3.00 TB/s   75%  gemv_ws_kernel" in out,
          "a kernel's DRAM bytes, rate and share of copy summed over its launches")
    check(any("#1 " in ln and "32.0 MB  3.20 TB/s   80%" in ln for ln in out.splitlines()),
          "each launch with its own bytes and rate")
    p = run("kernel-times.py", [], "no table here\n")
    check(p.returncode != 0 and "no CSV header" in p.stderr, "a file without the table: an error that says so")
    p = run("kernel-times.py", [], HEAD + row(0, "embed_kernel", "furlong", "3"))
    check(p.returncode != 0 and "unknown unit" in p.stderr, "an unknown unit: an error that names it")
    return c.done()


if __name__ == "__main__":
    sys.exit(main())
