#!/usr/bin/env python3
"""scripts/kernel-stalls.py on a made-up Nsight Compute source page: stall reasons summed over a
kernel's instructions into shares (the not-issued columns left out), the samples by opcode, the
instructions with the most samples and their leading reasons, the worst excess wavefronts and sectors, a repeated
table named once, and a clear error for a file with no per-instruction table."""
import sys

from scripttest import Checks, run

COLS = ["Address", "Source", "Warp Stall Sampling (All Samples)", "L1 Wavefronts Shared Excessive",
        "L1 Wavefronts Shared", "L2 Theoretical Sectors Global Excessive", "L2 Theoretical Sectors Global",
        "stall_barrier", "stall_wait", "stall_long_sb", "stall_barrier (Not Issued)"]


def table(name, rows):
    out = f'"Kernel Name","{name}",\n' + ",".join(f'"{c}"' for c in COLS) + "\n"
    for r in rows:
        out += ",".join(f'"{v}"' for v in r) + "\n"
    return out


def main():
    c = Checks()
    check = c.check

    # kernel A: 100 samples, barrier 60 (at the branch), wait 30, long_sb 10; 1,000 of them
    # not-issued barrier samples that must not count
    a = [["0x10", "BAR.SYNC 0x0", "5", "0", "0", "0", "0", "0", "5", "0", "1000"],
         ["0x20", "@P0 BRA 0x40", "60", "0", "0", "0", "0", "60", "0", "0", "0"],
         ["0x30", "LDGSTS.E [R1], desc[UR4][R2.64]", "35", "900", "1,000", "80", "100", "0", "25", "10", "0"]]
    b = [["0x10", "HMMA.16816.F32 R4, R8, R12, R4", "8", "0", "0", "0", "0", "0", "8", "0", "0"]]
    text = table("kern_a(int)", a) + table("kern_a(int)", a) + table("kern_b", b)
    p = run("kernel-stalls.py", ["--top", "2"], text)
    out = p.stdout
    check(p.returncode == 0, f"exit 0 ({p.returncode}: {p.stderr.strip()[:200]})")
    check("kern_a(int): 3 instructions, 100 warp samples" in out, "samples summed over the instructions")
    check("stall reasons: barrier 60.0%, wait 30.0%, long_sb 10.0%" in out,
          "shares of all samples, largest first, not-issued columns left out")
    first = out.split("kern_b")[0]
    listed = first.split("most samples")[1]
    check(listed.index("BRA 0x40") < listed.index("LDGSTS"), "instructions by samples, the most first")
    check("BAR.SYNC" not in first.split("most samples")[1].split("excess")[0], "only the top 2 listed")
    check("wait 71%, long_sb 29%" in first, "an instruction's leading reasons as its share")
    check("samples by opcode: BRA 60.0%, LDGSTS 35.0%, BAR 5.0%" in first,
          "samples by opcode, the predicate and modifiers dropped, largest first")
    check("900 of 1000 (90%)" in first and "80 of 100 (80%)" in first,
          "excess wavefronts and sectors against their totals (thousands separators read)")
    check("table 2 repeats an earlier one" in out and out.count("3 instructions") == 1, "a repeated table named once")
    check("kern_b: 1 instructions, 8 warp samples" in out and "wait 100.0%" in out, "a second kernel on its own")
    p = run("kernel-stalls.py", [], "no table here\n")
    check(p.returncode != 0 and "no per-instruction table" in p.stderr, "a file without the table: an error that says so")
    return c.done()


if __name__ == "__main__":
    sys.exit(main())
