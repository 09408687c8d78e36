"""What the tests of the project's Python tooling share: run a script of scripts/ on a made-up
input file, and count checks as they print."""
import os
import subprocess
import sys
import tempfile

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts")


def run(script, args, text, suffix=".csv"):
    """scripts/<script> on a file holding text, then args: the completed process."""
    with tempfile.NamedTemporaryFile("w", suffix=suffix, delete=False) as f:
        f.write(text)
        path = f.name
    try:
        return subprocess.run([sys.executable, os.path.join(SCRIPTS, script), path] + args, capture_output=True,
                              text=True, timeout=60)
    finally:
        os.unlink(path)


class Checks:
    """check(cond, what) prints ok/FAIL and counts; done() prints the tally, returns the exit status."""

    def __init__(self):
        self.passed = self.failed = 0

    def check(self, cond, what):
        print(("ok   " if cond else "FAIL ") + what, flush=True)
        self.passed += bool(cond)
        self.failed += not cond

    def done(self):
        print(f"{self.passed} passed, {self.failed} failed")
        return 1 if self.failed else 0
