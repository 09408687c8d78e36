#!/usr/bin/env python3
"""kernel-sass.py: a kernel's machine code, counted or compared, without a GPU.

Input: `cuobjdump -sass` output (text), or a .cubin, which is passed through cuobjdump ($CUOBJDUMP,
else cuobjdump on PATH, else /usr/local/cuda/bin/cuobjdump).  A cubin of one kernel file:

    nvcc -std=c++17 -O3 -D_GNU_SOURCE -I kernels/cuda -I kernels -I common -I BUILD \
         -gencode arch=compute_90a,code=sm_90a -cubin -o X.cubin kernels/cuda/X.cu

(BUILD: a configured build directory, for duet_config.h.)  Where the toolkit has no cuobjdump (a
minimal CUDA install), NVIDIA's wheel holds one:

    pip download --no-deps -d /tmp/cuobjdump nvidia-cuda-cuobjdump
    python3 -m zipfile -e /tmp/cuobjdump/nvidia_cuda_cuobjdump-*.whl /tmp/cuobjdump/x
    chmod +x /tmp/cuobjdump/x/nvidia/cu13/bin/cuobjdump
    export CUOBJDUMP=/tmp/cuobjdump/x/nvidia/cu13/bin/cuobjdump

  kernel-sass.py count SASS [--function SUBSTR]
      for each function (whose name contains SUBSTR): its instruction count, and each loop (a
      backward branch and its target) with its instruction count and most frequent opcodes.
      Where a change's instructions go, before a GPU is at hand.
  kernel-sass.py compare SASS_A SASS_B [--function SUBSTR]
      each function of either file: "same" (the same instructions in the same order),
      "reordered" (the same instructions, scheduled in another order), "registers" (the same
      once register numbers are ignored), or "differs" with the opcodes gained and lost.
      Exit 0 when no function differs: a refactor that leaves the machine code alone.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
from collections import Counter, OrderedDict

INSN = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
FUNC = re.compile(r"^\s*Function\s*:\s*(\S+)")
BRANCH = re.compile(r"\bBRA\b.*?(0x[0-9a-f]+)")


def sass_text(path):
    if not path.endswith(".cubin"):
        with open(path) as f:
            return f.read()
    tool = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
    if not os.path.exists(tool) and not shutil.which(tool):
        sys.exit("kernel-sass: no cuobjdump (set CUOBJDUMP; the wheel nvidia-cuda-cuobjdump holds one, see "
                 "this script's header) to read %s" % path)
    p = subprocess.run([tool, "-sass", path], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("kernel-sass: cuobjdump -sass %s failed: %s" % (path, p.stderr.strip()[:300]))
    return p.stdout


def functions(text):
    """OrderedDict name -> [(address, instruction text without .reuse)]"""
    out = OrderedDict()
    cur = None
    for line in text.splitlines():
        m = FUNC.match(line)
        if m:
            cur = out.setdefault(m.group(1), [])
            continue
        m = INSN.match(line)
        if m and cur is not None:
            cur.append((int(m.group(1), 16), re.sub(r"\.reuse\b", "", m.group(2)).strip()))
    return out


def opcode(insn):
    t = re.sub(r"^@!?U?P[T0-9]+\s+", "", insn)
    return t.split()[0].split(".")[0] if t else ""


def loops(insns):
    """(start, end) address ranges of conditional backward branches, innermost (shortest) first.
    Unconditional ones are left out: they are out-of-line code (a divergent path, a slow case)
    going back into the body, and the trap after the last EXIT."""
    found = set()
    for addr, t in insns:
        m = BRANCH.search(t)
        if m and t.startswith("@") and int(m.group(1), 16) < addr:
            found.add((int(m.group(1), 16), addr))
    return sorted(found, key=lambda r: (r[1] - r[0], r[0]))


def pick(funcs, sub):
    return [(n, i) for n, i in funcs.items() if not sub or sub in n]


def count(a):
    funcs = pick(functions(sass_text(a.sass)), a.function)
    if not funcs:
        sys.exit("kernel-sass: no function%s in %s" % (" matching %r" % a.function if a.function else "", a.sass))
    for name, insns in funcs:
        print("%s: %d instructions" % (name, len(insns)))
        for lo, hi in loops(insns):
            body = [t for addr, t in insns if lo <= addr <= hi]
            top = ", ".join("%s %d" % kv for kv in Counter(opcode(t) for t in body).most_common(a.top))
            print("  loop 0x%04x-0x%04x: %d instructions in its range (%s)" % (lo, hi, len(body), top))
    return 0


def normalize_registers(t):
    return re.sub(r"\b(U?R|U?P)[0-9]+\b", r"\1#", t)


def compare(a):
    fa, fb = functions(sass_text(a.sass)), functions(sass_text(a.other))
    names = [n for n in list(fa) + [n for n in fb if n not in fa] if not a.function or a.function in n]
    if not names:
        sys.exit("kernel-sass: no function to compare")
    tally = Counter()
    for n in names:
        if n not in fa or n not in fb:
            verdict = "only in %s" % ("the first" if n in fa else "the second")
            tally["differs"] += 1
        else:
            ia, ib = [t for _, t in fa[n]], [t for _, t in fb[n]]
            if ia == ib:
                verdict = "same"
            elif Counter(ia) == Counter(ib):
                verdict = "reordered"
            elif Counter(map(normalize_registers, ia)) == Counter(map(normalize_registers, ib)):
                verdict = "registers"
            else:
                ca, cb = Counter(map(opcode, ia)), Counter(map(opcode, ib))
                gained = ", ".join("+%d %s" % (cb[o] - ca[o], o) for o in sorted(cb) if cb[o] > ca[o])
                lost = ", ".join("-%d %s" % (ca[o] - cb[o], o) for o in sorted(ca) if ca[o] > cb[o])
                verdict = "differs: %d -> %d instructions%s" % (
                    len(ia), len(ib), " (" + "; ".join(x for x in (gained, lost) if x) + ")" if gained or lost else "")
            tally[verdict.split(":")[0]] += 1
        if a.all or not verdict.startswith("same"):
            print("%s: %s" % (n, verdict))
    print("%d functions: %s" % (len(names), ", ".join("%d %s" % (tally[k], k) for k in
                                                     ("same", "reordered", "registers", "differs") if tally[k])))
    return 1 if tally["differs"] else 0


def main():
    ap = argparse.ArgumentParser(description="count or compare kernels' machine code")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("count")
    c.add_argument("sass")
    c.add_argument("--function", default="")
    c.add_argument("--top", type=int, default=8)
    d = sub.add_parser("compare")
    d.add_argument("sass")
    d.add_argument("other")
    d.add_argument("--function", default="")
    d.add_argument("--all", action="store_true", help="list the unchanged functions too")
    a = ap.parse_args()
    return count(a) if a.cmd == "count" else compare(a)


if __name__ == "__main__":
    sys.exit(main())
