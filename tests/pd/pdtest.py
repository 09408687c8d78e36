#!/usr/bin/env python3
"""Integration tests of duet-prefill + duet-decode (DESIGN §2, §3; issue acceptance).

Real processes on loopback (NNG over ipc://, UCX over tcp), the CPU backend
(--device cuda[:N]: both workers and the oracle on the GPU, a CUDA build),
duet-driver playing the router, duet-generate as the single-process oracle.

  pdtest.py --build BUILD --model MODEL SCENARIO [options]

Scenarios: exact, abort-storm, mass-abort, kill-prefill, kill-decode,
wait-deadline, two-by-two, bad-input, hicache, decode-rate, device-flag, gpu-stuck
and gpu-stuck-prefill (the GPU only).  Each prints what it checked and ends with
"N passed, N failed"; the exit status is non-zero on any failure.  Standard library only.
"""
import argparse
import concurrent.futures
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import testdirs  # noqa: E402

VOCAB = 129280
DEVICE = "cpu"  # --device: where the workers and duet-generate run the forward


class Cluster:
    """Prefill and decode workers in a temporary directory (removed at the end of a run that
    passed: testdirs); the processes always stopped."""

    def __init__(self, build, model, kv="fp8", ik="fp8", n_prefill=1, n_decode=1, pages=256, slots=64,
                 extra_decode=(), extra_prefill=(), decode_env=None, prefill_env=None):
        self.build, self.model = build, model
        self.dir = testdirs.temp_dir("duet-pd-")
        print(f"     cluster logs in {self.dir}", flush=True)
        self.events = f"ipc://{self.dir}/events.sock"
        self.procs = {}
        self.env = dict(os.environ, UCX_TLS=os.environ.get("UCX_TLS", "tcp,self"), DUET_LOG_LEVEL="info")
        common = ["--model", model, "--kv-dtype", kv, "--index-k-dtype", ik, "--pages", str(pages),
                  "--slots", str(slots), "--events", self.events, "--verify-checksums"]
        if DEVICE != "cpu":
            common += ["--device", DEVICE]
        self.prefill = [f"ipc://{self.dir}/p{i}.sock" for i in range(n_prefill)]
        self.decode = [f"ipc://{self.dir}/d{i}.sock" for i in range(n_decode)]
        for i, url in enumerate(self.prefill):
            self.start(f"p{i}", [f"{build}/prefill/duet-prefill", "--listen", url, "--id", f"p{i}"]
                       + [c for c in common if c != "--verify-checksums"] + list(extra_prefill),
                       env=(prefill_env or {}).get(i))
        for i, url in enumerate(self.decode):
            self.start(f"d{i}", [f"{build}/decode/duet-decode", "--listen", url, "--id", f"d{i}"] + common
                       + list(extra_decode), env=(decode_env or {}).get(i))
        self.pages = pages
        self.slots = slots
        for url in self.prefill + self.decode:
            self.wait_ready(url)

    def start(self, name, argv, env=None):
        log = open(f"{self.dir}/{name}.log", "w")
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                            env=dict(self.env, **env) if env else self.env, start_new_session=True)

    def wait_ready(self, url, timeout=None):
        end = time.time() + (timeout or (120 if DEVICE != "cpu" else 30))  # a GPU worker uploads its weights first
        while time.time() < end:
            if self.state(url, quiet=True) is not None:
                return
            time.sleep(0.1)
        raise RuntimeError(f"{url} did not come up; logs in {self.dir}")

    def state(self, url, quiet=False):
        r = subprocess.run([f"{self.build}/tools/duet-driver", "state", url, "--requests"], capture_output=True,
                           text=True, timeout=20, env=self.env)
        if r.returncode != 0:
            return None
        return json.loads(r.stdout)

    def run(self, requests, concurrency=1, abort_rate=0.0, abort_seed=1, timeout_ms=600000, wait_ms=300000,
            prefill=None, decode=None, extra=()):
        req = f"{self.dir}/req-{time.time_ns()}.jsonl"
        out = req.replace("req-", "out-")
        with open(req, "w") as f:
            for r in requests:
                f.write(json.dumps(r) + "\n")
        argv = [f"{self.build}/tools/duet-driver", "run", "--prefill", ",".join(prefill or self.prefill),
                "--decode", ",".join(decode or self.decode), "--events", self.events, "--requests", req,
                "--out", out, "--concurrency", str(concurrency), "--abort-rate", str(abort_rate),
                "--abort-seed", str(abort_seed), "--timeout-ms", str(timeout_ms), "--wait-ms", str(wait_ms)]
        argv += list(extra)
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_ms / 1000 + 60, env=self.env)
        with open(out + ".stderr", "w") as f:  # the driver's log, beside its results
            f.write(p.stderr)
        results = {}
        if os.path.exists(out):
            for line in open(out):
                o = json.loads(line)
                results[o["rid"]] = o
        return results, p.stderr

    def kill(self, name, sig=signal.SIGKILL):
        p = self.procs[name]
        os.killpg(p.pid, sig)
        p.wait(timeout=30)

    def wait_clean(self, url, timeout=20):
        """Wait until a decode worker holds no pages, slots or quarantine, and no request."""
        end = time.time() + timeout
        st = None
        while time.time() < end:
            st = self.state(url)
            if st and st["pages_free"] == self.pages and st["pages_quarantined"] == 0 and \
                    st["slots_quarantined"] == 0 and not st["requests"]:
                return True, st
            time.sleep(0.2)
        return False, st

    def stop(self):
        for name, p in self.procs.items():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for name, p in self.procs.items():
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    def log(self, name):
        return open(f"{self.dir}/{name}.log").read()


def make_requests(n, seed, lengths=None, max_tokens=12, sampled_share=0.5, prefix="r"):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = lengths[i % len(lengths)] if lengths else rng.randint(1, 2000)
        sampled = rng.random() < sampled_share
        out.append({"rid": f"{prefix}{seed}-{i}", "tokens": [rng.randrange(VOCAB) for _ in range(length)],
                    "max_tokens": max_tokens, "temperature": 0.8 if sampled else 0.0,
                    "top_p": 0.9 if sampled else 1.0, "top_k": 50 if sampled and i % 3 == 0 else 0,
                    "seed": rng.randrange(1 << 31)})
    return out


_REFS = {}


def reference(build, model, r, kv, ik):
    key = (model, kv, ik, DEVICE, json.dumps({k: r[k] for k in ("tokens", "max_tokens", "temperature", "top_p",
                                                                 "top_k", "seed")}))
    if key not in _REFS:
        _REFS[key] = _reference(build, model, r, kv, ik)
    return _REFS[key]


def references(build, model, reqs, kv, ik):
    """duet-generate for every request, several at a time (each is a process of its own)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as ex:
        return list(ex.map(lambda r: reference(build, model, r, kv, ik), reqs))


def _reference(build, model, r, kv, ik):
    with tempfile.NamedTemporaryFile("w", suffix=".ids", delete=False) as f:
        f.write(",".join(map(str, r["tokens"])))
        path = f.name
    argv = [f"{build}/tools/duet-generate", "--model", model, "--prompt-file", path, "--max-tokens",
            str(r["max_tokens"]), "--kv-dtype", kv, "--index-k-dtype", ik, "--stop-at-eos",
            "--temperature", str(r["temperature"]), "--top-p", str(r["top_p"]), "--top-k", str(r["top_k"]),
            "--seed", str(r["seed"])]
    if DEVICE != "cpu":
        argv += ["--device", DEVICE]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    os.unlink(path)
    if p.returncode != 0:
        raise RuntimeError(p.stderr)
    return [int(x) for x in p.stdout.split()]


class Report:
    def __init__(self):
        self.ok = self.bad = 0

    def check(self, cond, what):
        print(("ok   " if cond else "FAIL ") + what, flush=True)
        if cond:
            self.ok += 1
        else:
            self.bad += 1

    def done(self):
        print(f"{self.ok} passed, {self.bad} failed")
        return 1 if self.bad else 0


def compare_all(rep, a, reqs, results, label, only_ok=False):
    mism = 0
    checked = 0
    todo = [r for r in reqs if not only_ok or (results.get(r["rid"]) or {}).get("status") == "ok"]
    references(a.build, a.model, todo, a.kv, a.ik)
    for r in todo:
        got = results.get(r["rid"])
        want = reference(a.build, a.model, r, a.kv, a.ik)
        checked += 1
        if not got or got["status"] != "ok" or got["tokens"] != want:
            mism += 1
            print(f"     {r['rid']} ({len(r['tokens'])} tokens): got {got and got['status']} "
                  f"{got and got['tokens'][:8]} want {want[:8]}", flush=True)
    rep.check(mism == 0, f"{label}: {checked} requests equal to duet-generate bit for bit ({mism} differ)")
    return checked


def sc_exact(a, rep):
    lengths = [1, 2, 15, 16, 17, 127, 128, 129, 255, 256, 257, 300, 511, 600, 1000, 1500, 2000] if a.n > 12 \
        else [1, 16, 129, 257, 700, 2000]
    reqs = make_requests(a.n, a.seed, lengths=lengths if not a.random_lengths else None)
    c = Cluster(a.build, a.model, a.kv, a.ik)
    try:
        for conc in a.concurrency:
            res, err = c.run(reqs, concurrency=conc)
            if len(res) < len(reqs) or any(r["status"] != "ok" for r in res.values()):
                print("     duet-driver said:\n" + "\n".join("       " + l for l in err.splitlines()[-25:]), flush=True)
            compare_all(rep, a, reqs, res, f"kv={a.kv} index-k={a.ik} concurrency {conc}")
        ok, st = c.wait_clean(c.decode[0])
        rep.check(ok, f"decode holds nothing afterwards ({st and st['pages_free']}/{c.pages} pages free)")
    finally:
        c.stop()
    print_staging(c)
    check_draws(c, rep)


def print_staging(c):
    """The workers' staging counters (--device cuda), logged as they exit."""
    for name in ("p0", "d0"):
        for line in c.log(name).splitlines():
            if ": staging " in line or "tokens/s of step time" in line:
                print(f"     {name}: {re.sub(r'^.*? [a-z_]+[.]c:[0-9]+ ', '', line)}", flush=True)


def check_draws(c, rep):
    """Decode's count of the rows it drew (its exit log): on the CPU every row it stepped, on
    the host; on the GPU the sampled ones only (half the requests sample, greedy rows take the
    device argmax), drawn on the GPU, so none on the host and some but not all on the GPU."""
    m = g = None
    for line in c.log("d0").splitlines():
        m = re.search(r"rows drawn on the host: (\d+) of (\d+), in (\d+) of (\d+) steps", line) or m
        g = re.search(r"sampled rows drawn on the GPU: (\d+), in (\d+) steps", line) or g
    if not m:
        rep.check(False, "decode logs the rows it drew on the host")
        return
    drawn, rows, dsteps, steps = map(int, m.groups())
    if DEVICE == "cpu":
        rep.check(drawn == rows > 0 and dsteps == steps,
                  f"decode drew every row on the host ({drawn} of {rows}, {dsteps} of {steps} steps)")
        return
    if not g:
        rep.check(False, "decode logs the rows it drew on the GPU")
        return
    gdrawn = int(g.group(1))
    rep.check(drawn == 0 and 0 < gdrawn < rows,
              f"decode drew only the sampled rows, on the GPU ({gdrawn} of {rows}; {drawn} on the host)")


def sc_decode_rate(a, rep):
    """Decode throughput: `--rate-requests` requests (default 32) of --rate-prompt tokens, each
    generating --rate-tokens tokens (ignore_eos), all at once after one warm-up request."""
    n, plen, ntok = a.rate_requests, a.rate_prompt, a.rate_tokens
    warm = make_requests(1, a.seed + 5, lengths=[plen], max_tokens=4, sampled_share=0.0, prefix="w")
    reqs = make_requests(n, a.seed, lengths=[plen], max_tokens=ntok, sampled_share=0.0, prefix="q")
    for r in reqs:
        r["ignore_eos"] = True
    c = Cluster(a.build, a.model, a.kv, a.ik, slots=max(64, n + 2),
                pages=max(256, n * ((plen + ntok + 255) // 256) + 8))
    try:
        c.run(warm, concurrency=1)
        t0 = time.time()
        res, err = c.run(reqs, concurrency=n)
        wall = time.time() - t0
        done = [r for r in res.values() if r["status"] == "ok" and len(r["tokens"]) == ntok]
        rep.check(len(done) == n, f"decode rate: {len(done)} of {n} requests generated {ntok} tokens")
        print(f"     decode rate: {n} requests x {ntok} tokens (prompt {plen}) at concurrency {n}: wall {wall:.2f} s, "
              f"{n * ntok / wall:.0f} tokens/s end to end (prefill included)", flush=True)
        ok, st = c.wait_clean(c.decode[0])
        rep.check(ok, "decode holds nothing afterwards")
    finally:
        c.stop()
    print_staging(c)


def sc_abort_storm(a, rep):
    reqs = make_requests(64, a.seed, lengths=[5, 40, 200, 300, 700, 1200], max_tokens=16)
    c = Cluster(a.build, a.model, a.kv, a.ik)
    try:
        res, err = c.run(reqs, concurrency=64, abort_rate=0.5, abort_seed=a.seed)
        aborted = [r for r in res.values() if r["abort_stage"] != "none"]
        stages = sorted({r["abort_stage"] for r in aborted})
        rep.check(len(aborted) >= 20 and len(stages) == 4,
                  f"abort storm: {len(aborted)} of 64 aborted, at stages {stages}")
        bad = [r for r in res.values() if r["status"] not in ("ok", "aborted")]
        rep.check(not bad, f"no request failed or timed out ({len(bad)})")
        kept = [r for r in reqs if res[r["rid"]]["abort_stage"] == "none"]
        compare_all(rep, a, kept, res, "requests not aborted")
        ok, st = c.wait_clean(c.decode[0])
        rep.check(ok, f"decode free pages back to {c.pages}, nothing quarantined, no request left "
                      f"(free {st and st['pages_free']}, quarantined {st and st['pages_quarantined']}"
                      f"{'' if ok else ', left: ' + json.dumps(st and st['requests'])})")
        if not ok:
            for rid in [q["rid"] for q in (st and st["requests"]) or []]:
                print("     " + rid + ": " + json.dumps(res.get(rid)))
                for name in ("d0", "p0"):
                    for line in c.log(name).splitlines():
                        if rid in line:
                            print(f"     {name}: {line}")
        pst = c.state(c.prefill[0])
        rep.check(pst and not pst["requests"] and pst["pages_free"] == c.pages, "prefill holds nothing afterwards")
    finally:
        c.stop()


def sc_mass_abort(a, rep):
    first = make_requests(48, a.seed, lengths=[400, 800], max_tokens=64, prefix="m")
    second = make_requests(8, a.seed + 1, lengths=[50, 300], max_tokens=8, prefix="n")
    c = Cluster(a.build, a.model, a.kv, a.ik)
    try:
        # every request of the first wave is aborted at some stage; the second wave arrives meanwhile
        res, err = c.run(first + second, concurrency=56, abort_rate=0.0,
                         extra=["--abort-all-after-ms", "1500", "--abort-only-prefix", "m"])
        aborted = sum(1 for r in res.values() if r["rid"].startswith("m") and r["status"] == "aborted")
        rep.check(aborted > 0, f"mass abort: {aborted} of 48 in-flight requests aborted at once")
        compare_all(rep, a, second, res, "requests arriving during the mass abort")
        ok, st = c.wait_clean(c.decode[0])
        rep.check(ok, "decode holds nothing afterwards")
        c.stop()
        steps = [l for l in c.log("d0").splitlines() if "shutting down" in l]
        print("     decode step times: " + (steps[-1].split("shutting down:")[-1].strip() if steps else "n/a"))
    finally:
        c.stop()


def sc_kill_prefill(a, rep):
    c = Cluster(a.build, a.model, a.kv, a.ik, extra_prefill=["--token-budget", "64"])
    try:
        reqs = make_requests(4, a.seed, lengths=[2000], max_tokens=8, prefix="k")
        import threading
        holder = {}
        t = threading.Thread(target=lambda: holder.update(res=c.run(reqs, concurrency=4, timeout_ms=60000)))
        t.start()
        # wait until decode has them WAITING_FOR_INPUT and prefill is computing, then kill -9 prefill
        end = time.time() + 30
        while time.time() < end:
            st = c.state(c.prefill[0])
            if st and st["requests_per_state"].get("REQUEST_STATE_PREFILLING"):
                break
            time.sleep(0.05)
        # let the data plane announce the transfer to decode (it does so right after the step
        # starts); a prefill worker that dies before announcing anything is the router's case:
        # its heartbeat stops and it tells decode (Abort with prefill_quiesced)
        time.sleep(0.5)
        held = c.state(c.decode[0])
        rep.check(held and held["pages_used"] > 0, f"decode holds the requests' pages before the kill "
                                                   f"({held and held['pages_used']} pages)")
        killed = time.time()
        c.kill("p0")
        ok, st = c.wait_clean(c.decode[0], timeout=30)
        took = time.time() - killed
        t.join(timeout=120)
        res = holder.get("res", ({}, ""))[0]
        failed = [r for r in res.values() if r["status"] in ("aborted", "error")]
        rep.check(len(failed) == 4, f"kill -9 prefill mid-transfer: all 4 requests failed cleanly "
                                    f"({[r['status'] for r in res.values()]})")
        rep.check(ok, f"decode released every page after prefill's death, {took:.1f} s after the kill (bound 15 s)")
        rep.check(took < 15, "within the bound")
        if not ok:
            print("\n".join("     d0: " + l for l in c.log("d0").splitlines()[-25:]))
            print("     state: " + json.dumps(st))
    finally:
        c.stop()


def serve_on_second_decode(c, a, rep, label):
    """After the first decode worker is gone: four requests through the second, exact."""
    more = make_requests(4, a.seed + 7, lengths=[30, 300], max_tokens=8, prefix="h")
    res, err = c.run(more, concurrency=4, decode=[c.decode[1]])
    compare_all(rep, a, more, res, label)


def sc_kill_decode(a, rep):
    c = Cluster(a.build, a.model, a.kv, a.ik, n_decode=2)
    try:
        slow = make_requests(3, a.seed, lengths=[1500], max_tokens=200, prefix="s")
        import threading
        holder = {}
        t = threading.Thread(target=lambda: holder.update(
            res=c.run(slow, concurrency=3, decode=[c.decode[0]], timeout_ms=60000)))
        t.start()
        end = time.time() + 30
        while time.time() < end:
            st = c.state(c.decode[0])
            if st and (st["requests_per_state"].get("REQUEST_STATE_WAITING_FOR_INPUT") or
                       st["requests_per_state"].get("REQUEST_STATE_DECODING")):
                break
            time.sleep(0.05)
        killed = time.time()
        c.kill("d0")
        # prefill must fail those transfers fast and still serve the healthy decode worker
        end = time.time() + 30
        pst = None
        while time.time() < end:
            pst = c.state(c.prefill[0])
            if pst and not pst["requests"]:
                break
            time.sleep(0.1)
        took = time.time() - killed
        t.join(timeout=120)
        rep.check(pst is not None and not pst["requests"] and took < 15,
                  f"prefill dropped the dead decode worker's transfers within {took:.1f} s (bound 15 s)")
        serve_on_second_decode(c, a, rep, "prefill keeps serving the other decode worker")
    finally:
        c.stop()


def sc_wait_deadline(a, rep):
    c = Cluster(a.build, a.model, a.kv, a.ik)
    try:
        reqs = make_requests(3, a.seed, lengths=[20], max_tokens=4, prefix="w")
        t0 = time.time()
        res, err = c.run(reqs, concurrency=3, wait_ms=1000, extra=["--never-prefill", "1"])
        took = time.time() - t0
        st = [r["status"] for r in res.values()]
        rep.check(all(s == "aborted" for s in st) and took < 10,
                  f"a prefill that never sends: WAITING_FOR_INPUT deadline fired ({st}) in {took:.1f} s")
        ok, stt = c.wait_clean(c.decode[0], timeout=10)
        rep.check(ok, "pages released once the router confirmed prefill never had the descriptor")
    finally:
        c.stop()


def ended_alone(c, name, timeout=15):
    """Waits (bounded) for worker `name` to end by itself: its exit status (None if it has not) and its log."""
    try:
        rc = c.procs[name].wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        rc = None
    return rc, c.log(name)


def sc_gpu_stuck(a, rep):
    """GPU only: decode worker d0's third forward finds its GPU held busy 4 s (DUET_TEST_GPU_HOLD) under a
    1.5 s step deadline.  Its wait must time out, its requests end, and the worker exit by itself (its
    supervisor would restart it) instead of failing every later request; prefill and the other decode
    worker go on serving."""
    if DEVICE == "cpu":
        rep.check(True, "gpu-stuck: the CPU backend has no device to hold (skipped)")
        return
    hold = {"DUET_TEST_GPU_HOLD": "3:4000", "DUET_TP_STEP_TIMEOUT_MS": "1500"}
    c = Cluster(a.build, a.model, a.kv, a.ik, n_decode=2, decode_env={0: hold})
    try:
        reqs = make_requests(3, a.seed, lengths=[40], max_tokens=16, prefix="g")
        t0 = time.time()
        res, err = c.run(reqs, concurrency=3, decode=[c.decode[0]], timeout_ms=20000)
        took = time.time() - t0
        st = sorted(r["status"] for r in res.values())
        # the errors reach the router before the worker ends (it flushes its events first): an
        # event lost with the process would leave its request to the router's deadline (20 s)
        rep.check(len(res) == len(reqs) and all(x == "error" for x in st) and took < 10,
                  f"the stuck worker's requests ended with errors ({st}) in {took:.1f} s (bound 10 s)")
        rc, log = ended_alone(c, "d0")
        rep.check(rc not in (None, 0) and "has not finished its queued work within 1500 ms" in log
                  and "the GPU can run nothing more" in log,
                  f"the worker with the stuck GPU ended by itself (exit status {rc}), saying why")
        serve_on_second_decode(c, a, rep, "prefill and the other decode worker keep serving")
    finally:
        c.stop()


def sc_gpu_stuck_prefill(a, rep):
    """GPU only: prefill worker p0's first forward finds its GPU held busy 4 s under a 1.5 s step deadline,
    with its requests' pages reserved on decode.  The requests end with errors, p0 exits by itself, decode
    gives every page of those requests back (none is reused while a put from p0 might land: the abort
    protocol's dead-prefill exit), and the other prefill worker serves on, exactly."""
    if DEVICE == "cpu":
        rep.check(True, "gpu-stuck-prefill: the CPU backend has no device to hold (skipped)")
        return
    hold = {"DUET_TEST_GPU_HOLD": "1:4000", "DUET_TP_STEP_TIMEOUT_MS": "1500"}
    c = Cluster(a.build, a.model, a.kv, a.ik, n_prefill=2, prefill_env={0: hold})
    try:
        reqs = make_requests(3, a.seed, lengths=[700], max_tokens=16, prefix="q")
        t0 = time.time()
        res, err = c.run(reqs, concurrency=3, prefill=[c.prefill[0]], timeout_ms=20000)
        took = time.time() - t0
        st = sorted(r["status"] for r in res.values())
        rep.check(len(res) == len(reqs) and set(st) <= {"error", "aborted"} and took < 10,
                  f"the stuck prefill worker's requests ended ({st}) in {took:.1f} s (bound 10 s)")
        rc, log = ended_alone(c, "p0")
        rep.check(rc not in (None, 0) and "the GPU can run nothing more" in log,
                  f"the prefill worker with the stuck GPU ended by itself (exit status {rc}), saying why")
        ok, stt = c.wait_clean(c.decode[0], timeout=30)
        rep.check(ok, "decode gave back every page of the stuck prefill's requests (free, nothing quarantined)")
        more = make_requests(4, a.seed + 7, lengths=[30, 300], max_tokens=8, prefix="h")
        res, err = c.run(more, concurrency=4, prefill=[c.prefill[1]])
        compare_all(rep, a, more, res, "decode and the other prefill worker keep serving")
    finally:
        c.stop()


def sc_two_by_two(a, rep):
    reqs = make_requests(16, a.seed, lengths=[3, 64, 300, 900], max_tokens=10, prefix="t")
    c = Cluster(a.build, a.model, a.kv, a.ik, n_prefill=2, n_decode=2)
    try:
        res, err = c.run(reqs, concurrency=8)
        compare_all(rep, a, reqs, res, "two prefill x two decode workers")
        logs = [c.log(n) for n in ("p0", "p1", "d0", "d1")]
        for url in c.decode:
            ok, st = c.wait_clean(url)
            rep.check(ok, f"{url.split('/')[-1]} holds nothing afterwards")
    finally:
        c.stop()


def sc_bad_input(a, rep):
    c = Cluster(a.build, a.model, a.kv, a.ik)
    try:
        p = subprocess.run([f"{a.build}/tools/duet-driver", "bad-input", c.prefill[0], c.decode[0]],
                           capture_output=True, text=True, timeout=120, env=c.env)
        for line in p.stdout.splitlines():
            if line.startswith(("ok", "FAIL")):
                rep.check(line.startswith("ok"), line[5:])
        rep.check(p.returncode == 0 and "passed" in p.stdout, "bad-input run completed")
        for name in ("p0", "d0"):
            rep.check(c.procs[name].poll() is None, f"{name} still running after the bad input")
        ok, st = c.wait_clean(c.decode[0])
        rep.check(ok, "decode holds nothing afterwards")
    finally:
        c.stop()


def sc_hicache(a, rep):
    """Multi-turn-like prompts (each turn = the previous prompt + an answer + a new message) and
    conversations sharing a system prompt, through a prefill worker with HiCache on: a device tier of
    4 pages and a host tier of about 7 pages (smaller than the working set), under two write policies.
    Every output equals duet-generate's; the worker reports prefix hits."""
    rng = random.Random(a.seed)
    system = [rng.randrange(VOCAB) for _ in range(300)]
    convs = [system + [rng.randrange(VOCAB) for _ in range(rng.randint(100, 400))] for _ in range(3)]
    reqs = []
    for turn in range(4):
        for c in range(3):
            convs[c] = convs[c] + [rng.randrange(VOCAB) for _ in range(rng.randint(40, 200))]
            sampled = (turn + c) % 2 == 1
            reqs.append({"rid": f"h{c}-{turn}", "tokens": list(convs[c]), "max_tokens": 8,
                         "temperature": 0.8 if sampled else 0.0, "top_p": 0.9 if sampled else 1.0, "top_k": 0,
                         "seed": rng.randrange(1 << 31)})
    want = {r["rid"]: reference(a.build, a.model, r, a.kv, a.ik) for r in reqs}
    for policy in ("write-back", "write-through"):
        c = Cluster(a.build, a.model, a.kv, a.ik, extra_prefill=["--hicache-device-pages", "4", "--hicache-host-gib",
                                                                  "0.00025", "--hicache-policy", policy])
        try:
            res, err = c.run(reqs, concurrency=1)
            bad = [r["rid"] for r in reqs
                   if not res.get(r["rid"]) or res[r["rid"]]["status"] != "ok" or res[r["rid"]]["tokens"] != want[r["rid"]]]
            for rid in bad:
                print(f"     {rid}: got {res.get(rid)} want {want[rid]}", flush=True)
            if bad:
                print("     driver: " + err[-2000:], flush=True)
            rep.check(not bad, f"hicache {policy}: {len(reqs)} multi-turn requests equal to duet-generate "
                               f"({len(bad)} differ)")
            # decode's RequestFinished carries what prefill served from its cache (the data plane's
            # TransferDone brought it), so the count never depends on which message arrives first
            cached = {r["rid"]: res.get(r["rid"], {}).get("cached_tokens", 0) for r in reqs}
            later = [rid for rid in cached if not rid.endswith("-0")]
            rep.check(cached[reqs[0]["rid"]] == 0 and any(cached[rid] > 0 for rid in later) and
                      all(cached[r["rid"]] < len(r["tokens"]) for r in reqs),
                      f"hicache {policy}: decode reports the cached prompt tokens "
                      f"({sum(1 for rid in later if cached[rid] > 0)} of {len(later)} later turns, "
                      f"first turn {cached[reqs[0]['rid']]})")
            ok, st = c.wait_clean(c.decode[0])
            rep.check(ok, f"hicache {policy}: decode holds nothing afterwards")
        finally:
            c.stop()
        stats = [l for l in c.log("p0").splitlines() if "hicache: lookups" in l]
        fields = {}
        if stats:
            words = stats[-1].split("hicache: ", 1)[1].replace("(", "").replace(")", "").split()
            for k, v in zip(words[::2], words[1::2]):
                fields[k] = v
            print(f"     {stats[-1].split('hicache: ', 1)[1]}", flush=True)
        hits = int(fields.get("hits", "0"))
        rep.check(hits > 0, f"hicache {policy}: prefill served {hits} requests from the prefix cache")
        rep.check(int(fields.get("evicted_host_pages", "0")) > 0 or int(fields.get("evicted_device_pages", "0")) > 0,
                  f"hicache {policy}: tiers under pressure (evicted device {fields.get('evicted_device_pages')}, "
                  f"host {fields.get('evicted_host_pages')} pages)")


def sc_device_flag(a, rep):
    """--device: a bad value is a usage error; cuda without the CUDA backend (with or without the
    prefix cache) is refused at start with UNSUPPORTED (before the model loads: nothing listens)."""
    cfg = open(os.path.join(a.build, "duet_config.h")).read()
    has_cuda = "DUET_HAVE_CUDA 1" in cfg
    d = testdirs.temp_dir("duet-pd-dev-")
    cases = [("prefill", ["--device", "gpu"], 2, "CONFIG"),
             ("decode", ["--device", "cuda:x"], 2, "CONFIG"),
             # tensor parallelism: GPUs only, 1 to 8
             ("decode", ["--tp", "2"], 1, "UNSUPPORTED"),
             ("prefill", ["--device", "cuda", "--tp", "9"], 2, "CONFIG"),
             ("decode", ["--device", "cuda", "--tp", "0"], 2, "CONFIG"),
             ("prefill", ["--tp", "two"], 2, "CONFIG")]
    if not has_cuda:
        cases += [("prefill", ["--device", "cuda"], 1, "UNSUPPORTED"), ("decode", ["--device", "cuda:1"], 1, "UNSUPPORTED"),
                  ("prefill", ["--device", "cuda", "--hicache-device-pages", "4"], 1, "UNSUPPORTED")]
    for role, extra, want_rc, want in cases:
        argv = [f"{a.build}/{role}/duet-{role}", "--model", a.model, "--listen", f"ipc://{d}/{role}.sock"] + extra
        p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        first = (p.stderr.splitlines() or [""])[0]
        rep.check(p.returncode == want_rc and want in first,
                  f"duet-{role} {' '.join(extra)}: exit {p.returncode}, \"{first[:110]}\"")
    # duet-generate: --tp without a GPU, or out of range, is a usage error
    for extra in (["--tp", "2"], ["--device", "cuda", "--tp", "9"]):
        argv = [f"{a.build}/tools/duet-generate", "--model", a.model, "--prompt-ids", "1,2,3"] + extra
        p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        first = (p.stderr.splitlines() or [""])[0]
        rep.check(p.returncode == 2 and "--tp" in first, f"duet-generate {' '.join(extra)}: exit {p.returncode}, \"{first[:110]}\"")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("scenario")
    ap.add_argument("--kv", default="fp8")
    ap.add_argument("--ik", default="fp8")
    ap.add_argument("--n", type=int, default=12)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--concurrency", default="1,32")
    ap.add_argument("--random-lengths", action="store_true")
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N]: workers and duet-generate (a CUDA build)")
    ap.add_argument("--rate-requests", type=int, default=32)
    ap.add_argument("--rate-prompt", type=int, default=128)
    ap.add_argument("--rate-tokens", type=int, default=128)
    a = ap.parse_args()
    a.concurrency = [int(x) for x in a.concurrency.split(",")]
    global DEVICE
    DEVICE = a.device
    rep = Report()
    fn = {"exact": sc_exact, "abort-storm": sc_abort_storm, "mass-abort": sc_mass_abort,
          "kill-prefill": sc_kill_prefill, "kill-decode": sc_kill_decode, "wait-deadline": sc_wait_deadline,
          "two-by-two": sc_two_by_two, "bad-input": sc_bad_input, "hicache": sc_hicache,
          "decode-rate": sc_decode_rate, "device-flag": sc_device_flag, "gpu-stuck": sc_gpu_stuck,
          "gpu-stuck-prefill": sc_gpu_stuck_prefill}[a.scenario]
    sys.exit(testdirs.run(fn, a, rep))


if __name__ == "__main__":
    main()
