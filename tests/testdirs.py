"""The temporary directories and files of a test run (cluster logs, sockets, request files):
removed at its end when every check passed, unless DUET_TEST_KEEP=1 (scripts that read the
workers' logs afterwards); kept and named when a check failed or the run broke off."""
import os
import shutil
import tempfile

_PATHS = []


def temp_dir(prefix):
    d = tempfile.mkdtemp(prefix=prefix)
    _PATHS.append(d)
    return d


def track(path):
    _PATHS.append(path)
    return path


def keep_or_remove(passed):
    if passed and os.environ.get("DUET_TEST_KEEP") != "1":
        for p in _PATHS:
            if os.path.isdir(p):
                shutil.rmtree(p, ignore_errors=True)
            elif os.path.exists(p):
                os.unlink(p)
    elif _PATHS:
        print("     logs kept in " + " ".join(_PATHS), flush=True)


def run(fn, a, rep):
    """fn(a, rep), then the run's paths removed or kept by its outcome; rep.done()'s status."""
    passed = False
    try:
        fn(a, rep)
        passed = rep.bad == 0
    finally:
        keep_or_remove(passed)
    return rep.done()
