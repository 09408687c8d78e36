#!/usr/bin/env python3
"""scripts/kernel-sass.py on made-up cuobjdump -sass text: a function's instructions and its
loops counted (conditional backward branches only), and two files compared function by
function: same, reordered, the same but for register numbers, or differing (exit 1), with
clear errors for an empty selection."""
import os
import subprocess
import sys
import tempfile

from scripttest import SCRIPTS, Checks


def sass(funcs):
    """cuobjdump-like text: funcs is [(name, [instruction, ...])], addresses 0x10 apart"""
    out = ["", "Fatbin elf code:", "================", "arch = sm_90a", ""]
    for name, insns in funcs:
        out.append("\t\tFunction : %s" % name)
        out.append("\t.headerflags\t@\"EF_CUDA_SM90\"")
        for i, t in enumerate(insns):
            out.append("        /*%04x*/                   %s ;                 /* 0x000fe20000000f00 */" % (16 * i, t))
            out.append("                                                                 /* 0x000fc40000000000 */")
        out.append("\t\t..........")
    return "\n".join(out) + "\n"


def run(args, *texts):
    paths = []
    try:
        for t in texts:
            with tempfile.NamedTemporaryFile("w", suffix=".sass", delete=False) as f:
                f.write(t)
                paths.append(f.name)
        cmd = [sys.executable, os.path.join(SCRIPTS, "kernel-sass.py"), args[0]] + paths + args[1:]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    finally:
        for p in paths:
            os.unlink(p)


LOOPY = [
    "MOV R1, c[0x0][0x28]",          # 0x00
    "S2R R0, SR_TID.X",              # 0x10
    "HMMA.16816.F32 R4, R8, R12, RZ",  # 0x20  loop body starts
    "LOP3.LUT R2, R2.reuse, 0xe, RZ, 0xc0, !PT",  # 0x30
    "LOP3.LUT R3, R2, 0x8e, RZ, 0xc0, !PT",  # 0x40
    "@!P0 BRA 0x20",                 # 0x50  back edge: loop 0x20-0x50
    "EXIT",                          # 0x60
    "BRA 0x30",                      # 0x70  out-of-line return: not a loop
    "BRA 0x80",                      # 0x80  the trap: not a loop
]


def main():
    c = Checks()
    check = c.check

    p = run(["count", "--function", "kern"], sass([("_Z4kernv", LOOPY), ("_Z5otherv", ["EXIT"])]))
    out = p.stdout
    check(p.returncode == 0, f"count: exit 0 ({p.returncode}: {p.stderr.strip()[:200]})")
    check("_Z4kernv: 9 instructions" in out and "_Z5otherv" not in out, "the selected function and its size")
    check("loop 0x0020-0x0050: 4 instructions in its range (LOP3 2, HMMA 1, BRA 1)" in out,
          "the loop's range, size and opcodes (.reuse and predicates ignored)")
    check(out.count("loop ") == 1, "unconditional backward branches are not loops")
    p = run(["count", "--function", "nothing"], sass([("_Z4kernv", LOOPY)]))
    check(p.returncode != 0 and "no function" in p.stderr, "count: no function selected is an error")

    base = [("_Z1av", ["IMAD R1, R2, R3, RZ", "FFMA R4, R5, R6, R4", "EXIT"]),
            ("_Z1bv", ["IADD3 R1, R2, 0x1, RZ", "LDS R4, [R1]", "EXIT"]),
            ("_Z1cv", ["MOV R1, 0x1", "STS [R1], R2", "EXIT"]),
            ("_Z1dv", ["FMUL R1, R2, R3", "FADD R4, R1, R5", "EXIT"])]
    same = [("_Z1av", ["IMAD R1, R2.reuse, R3, RZ", "FFMA R4, R5, R6, R4", "EXIT"]),
            ("_Z1bv", ["LDS R4, [R1]", "IADD3 R1, R2, 0x1, RZ", "EXIT"]),
            ("_Z1cv", ["MOV R7, 0x1", "STS [R7], R2", "EXIT"]),
            ("_Z1dv", ["FMUL R1, R2, R3", "FADD R4, R1, R5", "EXIT"])]
    p = run(["compare", "--all"], sass(base), sass(same))
    out = p.stdout
    check(p.returncode == 0, f"compare without a difference: exit 0 ({p.returncode}: {p.stderr.strip()[:200]})")
    check("_Z1av: same" in out and "_Z1dv: same" in out, "identical code (and .reuse flags) is the same")
    check("_Z1bv: reordered" in out, "the same instructions in another order")
    check("_Z1cv: registers" in out, "the same but for register numbers")
    check("4 functions: 2 same, 1 reordered, 1 registers" in out, "the tally")

    changed = [("_Z1av", ["IMAD R1, R2, R3, RZ", "FMUL R7, R5, R6", "FFMA R4, R5, R6, R4", "EXIT"]),
               ("_Z1bv", ["IADD3 R1, R2, 0x1, RZ", "LDS R4, [R1]", "EXIT"]),
               ("_Z1ev", ["EXIT"])]
    p = run(["compare"], sass(base), sass(changed))
    out = p.stdout
    check(p.returncode == 1, f"a difference: exit 1 ({p.returncode})")
    check("_Z1av: differs: 3 -> 4 instructions (+1 FMUL)" in out, "what differs, by opcode")
    check("_Z1bv" not in out, "unchanged functions are not listed without --all")
    check("_Z1cv: only in the first" in out and "_Z1ev: only in the second" in out, "functions in one file only")
    p = run(["compare", "--function", "zzz"], sass(base), sass(base))
    check(p.returncode != 0 and "no function" in p.stderr, "compare: no function selected is an error")
    return c.done()


if __name__ == "__main__":
    sys.exit(main())
