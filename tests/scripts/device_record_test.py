#!/usr/bin/env python3
"""scripts/device-record.sh with stand-ins for the two scripts it runs (a copy of it in a made-up
checkout whose scripts/device-forward.sh and device-agents.sh write what the real ones write): the
arguments it passes, the summary of both in order with their exit statuses, the files it leaves in
$OUT, a script past its deadline reported and the exit status 1, a script that fails, one script
alone, --prepare, and clear errors for bad arguments."""
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

from scripttest import SCRIPTS, Checks

FORWARD = """#!/usr/bin/env bash
echo "forward args: $*"
echo "operation checks: 480 passed, 0 failed (exit 0)" > "$OUT/summary.txt"
echo kernels > "$OUT/k.txt"
tar -czf "$OUT/device-forward-files.tgz" -C "$OUT" k.txt
exit "${FORWARD_RC:-0}"
"""

AGENTS = """#!/usr/bin/env bash
echo "agents args: $*"
[ "$1" != --prepare ] || exit 0
echo '{"verdict": "CLEAN"}' > "$OUT/agents-bf16.json"
echo "a run's table"
echo "== summary (3 s; device test)"
echo "agents kv bf16 / index-K bf16        exit 0 in 1 s"
echo "  verdict                            CLEAN"
[ "${AGENTS_SLEEP:-0}" = 0 ] || exec sleep "$AGENTS_SLEEP"
exit 0
"""


def main():
    c = Checks()
    check = c.check
    root = tempfile.mkdtemp(prefix="duet-record-test.")
    try:
        os.makedirs(os.path.join(root, "scripts"))
        tmp = os.path.join(root, "tmp")
        os.makedirs(tmp)
        shutil.copy(os.path.join(SCRIPTS, "device-record.sh"), os.path.join(root, "scripts"))
        for name, text in (("device-forward.sh", FORWARD), ("device-agents.sh", AGENTS)):
            with open(os.path.join(root, "scripts", name), "w") as f:
                f.write(text)

        def record(args, out=None, **env):
            e = dict(os.environ)
            e.pop("OUT", None)
            e["TMPDIR"] = tmp
            if out:
                e["OUT"] = out
            e.update(env)
            return subprocess.run(["bash", os.path.join(root, "scripts", "device-record.sh")] + args, env=e,
                                  capture_output=True, text=True, timeout=60)

        out = os.path.join(root, "out")
        os.makedirs(out)
        p = record([], out)
        check(p.returncode == 0, f"both scripts exit 0: exit 0 ({p.returncode})")
        check("--kernels --kernel-batches 32 --kernel-ctx 32768" in p.stdout,
              "the forward runs with the per-kernel profile at batch 32, 32k")
        log = open(os.path.join(out, "agents.log")).read() if os.path.exists(os.path.join(out, "agents.log")) else ""
        check("agents args: --encodings bf16 fp8" in log, "the agents runs on both encodings")
        s = open(os.path.join(out, "summary.txt")).read() if os.path.exists(os.path.join(out, "summary.txt")) else ""
        i_f, i_a = s.find("== forward: exit 0"), s.find("== agents: exit 0")
        check(0 <= i_f < i_a, "summary: the forward's, then the agents', each under its exit status")
        check("operation checks: 480 passed" in s and "verdict                            CLEAN" in s,
              "summary: both scripts' own summaries")
        check("a run's table" not in s, "summary: the agents' summary block only, not its whole log")
        files = sorted(os.listdir(out))
        want = ["agents-files.tgz", "agents.log", "device-forward-files.tgz", "forward.log", "summary.txt"]
        check(files == want, f"$OUT: {', '.join(want)} ({', '.join(files)})")
        if "agents-files.tgz" in files:
            with tarfile.open(os.path.join(out, "agents-files.tgz")) as t:
                names = [os.path.basename(n) for n in t.getnames()]
            check("agents-bf16.json" in names, "agents-files.tgz holds the agents runs' files")
        check(os.listdir(tmp) == [], "its working folder removed at the end")

        out2 = os.path.join(root, "out2")
        os.makedirs(out2)
        p = record(["--agents-limit", "1", "--encodings", "bf16"], out2, AGENTS_SLEEP="5")
        s = open(os.path.join(out2, "summary.txt")).read()
        check(p.returncode == 1, f"a script past its deadline: exit 1 ({p.returncode})")
        check("== agents: exit 124 (past its 1 s limit)" in s, "summary: the agents past their 1 s limit")
        check("== forward: exit 0" in s, "summary: the forward's run still reported")

        p = record(["--forward-only"], None, FORWARD_RC="3")
        check(p.returncode == 1, f"a failing forward: exit 1 ({p.returncode})")
        check("== forward: exit 3" in p.stdout and "== agents" not in p.stdout,
              "--forward-only: the forward alone, its exit status in the summary")

        p = record(["--agents-only", "--no-kernels"])
        check(p.returncode == 0 and "== forward" not in p.stdout and "== agents: exit 0" in p.stdout,
              "--agents-only: the agents alone, without $OUT (the summary on stdout)")

        # --prepare: the agents' pack alone (it holds the forward's binaries), a stale forward pack
        # removed so that the forward script cannot take it over the new one
        bdir = os.path.join(root, "bfwd")
        os.makedirs(bdir)
        stale = os.path.join(bdir, "device-forward.tgz")
        open(stale, "w").close()
        p = record(["--prepare"], None, DUET_CUDA_BUILD=bdir)
        check(p.returncode == 0 and "agents args: --prepare" in p.stdout and "forward args" not in p.stdout,
              f"--prepare: device-agents.sh --prepare alone ({p.returncode})")
        check(not os.path.exists(stale), "--prepare: a device-forward.tgz left from before removed")

        for args, what in ((["--forward-limit", "0"], "is not a count of seconds"),
                           (["--agents-limit", "x"], "is not a count of seconds"),
                           (["--forward-only", "--agents-only"], "leave nothing to run"),
                           (["--bogus"], "usage:"), (["--prepare", "extra"], "usage:")):
            p = record(args)
            check(p.returncode == 2 and what in p.stderr, f"{' '.join(args)}: exit 2, '{what}'")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return c.done()


if __name__ == "__main__":
    sys.exit(main())
