#!/usr/bin/env python3
"""Router overhead: the same small requests through duet-router and straight to the workers.

  bench_route.py --build BUILD [--model DIR] [-n N] [--concurrency 1,8] [--json FILE]

Starts a cluster the way tests/router/routertest.py does (redis-server on a
free port without persistence, one duet-prefill, one duet-decode, duet-router
on 127.0.0.1) on the tiny fixture, then for each concurrency C runs N requests
closed-loop (C clients, each sends its next request when the last one is
answered), every request a 4-token prompt with max_tokens 1 (greedy), so that
model time is small and the same in both paths:

  router  HTTP POST /v1/completions (prompt as token ids, not streamed) on a
          fresh connection per request; latency = send to full response.
  direct  build/tools/duet-driver run (Reserve -> Prefill -> events, the
          router's own protocol) with the same token ids, after the router
          cluster is stopped, against a fresh prefill/decode pair started
          the same way whose events go to the driver (no router, no Redis).
          The driver reports no per-request times, so each row is one
          `duet-driver run --concurrency C` over all N requests, timed from
          spawn to exit minus the median wall time of an empty run (process
          start, connecting, binding the events socket):
            req/s     N / (wall - empty);
            latency   C * (wall - empty) / N, the mean time a request holds
                      one of the C slots (Little's law); the driver gives no
                      distribution, so its p50 and p99 are this mean.
  Router overhead = router latency (p50, p99) - direct mean latency.

Standard library only.
"""
import argparse
import concurrent.futures
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "router"))
import routertest  # noqa: E402  (the Cluster helper)

PROMPT = [0, 100, 200, 300]  # BOS and three ordinary ids of the tiny fixture's vocabulary


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def closed_loop(n, conc, one):
    """Run one(i) for i < n with conc workers; returns (latencies in s, wall s)."""
    lat = [None] * n
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(conc) as ex:
        it = iter(range(n))

        def worker():
            for i in it:
                lat[i] = one(i)

        futs = [ex.submit(worker) for _ in range(conc)]
        for f in futs:
            f.result()
    return lat, time.perf_counter() - t0


def router_one(port):
    body = json.dumps({"prompt": PROMPT, "max_tokens": 1, "temperature": 0, "stream": False}).encode()

    def one(i):
        t = time.perf_counter()
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        raw = r.read()
        c.close()
        dt = time.perf_counter() - t
        if r.status != 200:
            raise RuntimeError(f"router answered {r.status}: {raw[:300]!r}")
        j = json.loads(raw)
        if j["usage"]["completion_tokens"] != 1:
            raise RuntimeError(f"unexpected usage {j['usage']}")
        return dt
    return one


class Driver:
    def __init__(self, cl, tmp):
        self.cl, self.tmp = cl, tmp
        self.bin = f"{cl.build}/tools/duet-driver"
        self.seq = 0

    def write(self, rids):
        self.seq += 1
        path = f"{self.tmp}/req{self.seq}.jsonl"
        with open(path, "w") as f:
            for rid in rids:
                f.write(json.dumps({"rid": rid, "tokens": PROMPT, "max_tokens": 1, "temperature": 0}) + "\n")
        return path

    def run(self, rids, conc=1):
        """Wall seconds of one `duet-driver run`; checks every request finished ok."""
        req = self.write(rids)
        out = f"{req}.out"
        argv = [self.bin, "run", "--prefill", self.cl.prefill_url, "--decode", self.cl.decode_url,
                "--events", self.cl.events, "--requests", req, "--out", out, "--concurrency", str(conc)]
        t = time.perf_counter()
        p = subprocess.run(argv, capture_output=True, text=True, env=self.cl.env, timeout=300)
        dt = time.perf_counter() - t
        if p.returncode != 0:
            raise RuntimeError(f"duet-driver run failed ({p.returncode}): {p.stderr[-1000:]}")
        lines = [json.loads(x) for x in open(out) if x.strip()]
        bad = [x for x in lines if x.get("status") != "ok"]
        if len(lines) != len(rids) or bad:
            raise RuntimeError(f"duet-driver: {len(lines)} results for {len(rids)} requests, not ok: {bad[:3]}")
        return dt


def start_direct_workers(cl, model):
    cl.events = f"ipc://{cl.dir}/events-direct.sock"
    cl.prefill_url = f"ipc://{cl.dir}/p1.sock"
    cl.decode_url = f"ipc://{cl.dir}/d1.sock"
    common = ["--model", model, "--pages", str(cl.pages), "--events", cl.events]
    cl.start("p0", [f"{cl.build}/prefill/duet-prefill", "--listen", cl.prefill_url, "--id", "p1"] + common)
    cl.start("d0", [f"{cl.build}/decode/duet-decode", "--listen", cl.decode_url, "--id", "d1"] + common)
    end = time.time() + 120
    while time.time() < end:
        if cl.state(cl.prefill_url) and cl.state(cl.decode_url):
            return
        time.sleep(0.2)
    raise RuntimeError(f"workers did not come up; logs in {cl.dir}")


def summary(lat_s):
    ms = [x * 1000 for x in lat_s]
    return {"p50_ms": pct(ms, 50), "p99_ms": pct(ms, 99), "mean_ms": statistics.fmean(ms)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--model", help="model directory (default: BUILD/tests/engine/tiny-bf16)")
    ap.add_argument("-n", "--requests", type=int, default=200, help="requests per measurement (default 200)")
    ap.add_argument("--concurrency", default="1,8", help="comma-separated client counts (default 1,8)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    model = os.path.abspath(a.model or f"{build}/tests/engine/tiny-bf16")
    concs = [int(x) for x in a.concurrency.split(",") if x]
    if not os.path.isdir(model):
        sys.exit(f"bench_route: no model at {model} (build the tests: ninja -C {build})")
    for b in ("router/duet-router", "prefill/duet-prefill", "decode/duet-decode", "tools/duet-driver"):
        if not os.access(f"{build}/{b}", os.X_OK):
            sys.exit(f"bench_route: {build}/{b} is missing")

    os.environ.setdefault("DUET_LOG_LEVEL", "warn")
    cl = routertest.Cluster(build, model)
    results = {"model": model, "requests": a.requests, "prompt_tokens": len(PROMPT), "max_tokens": 1,
               "method": {"router": "HTTP POST /v1/completions, new connection per request, non-streamed",
                          "direct": "one duet-driver run --concurrency C over all requests (fresh workers, no router), "
                                    "wall minus the median empty-run wall; req/s = N / that, latency = "
                                    "C * that / N (a mean: the driver reports no distribution)"},
               "runs": []}
    try:
        tmp = tempfile.mkdtemp(prefix="duet-bench-route-", dir=cl.dir)
        rone = router_one(cl.port)
        closed_loop(a.warmup, 1, rone)
        runs = {}
        for conc in concs:
            lat, wall = closed_loop(a.requests, conc, rone)
            runs[conc] = {"concurrency": conc, "router": dict(summary(lat), rps=a.requests / wall)}
        # direct: a fresh pair of workers whose events go to the driver (no router, no Redis)
        cl.stop()
        start_direct_workers(cl, model)
        drv = Driver(cl, tmp)
        drv.run([f"w{i}" for i in range(a.warmup)])
        walls = {conc: drv.run([f"b{conc}-{i}" for i in range(a.requests)], conc) for conc in concs}
        # the empty runs last: a client that leaves during the handshake stops libnng 1.5.2's ipc
        # listener until the worker restarts it, and a timed run dialing meanwhile would have its
        # connection reset (docs/PROTOCOL.md, "The event channel, and libnng 1.5.2")
        empty = statistics.median(drv.run([]) for _ in range(5))
        results["driver_empty_run_ms"] = empty * 1000
        for conc in concs:
            r = runs[conc]
            dwall = walls[conc] - empty
            mean = conc * dwall / a.requests * 1000
            r["direct"] = {"p50_ms": mean, "p99_ms": mean, "mean_ms": mean, "rps": a.requests / dwall}
            r["overhead_p50_ms"] = r["router"]["p50_ms"] - mean
            r["overhead_p99_ms"] = r["router"]["p99_ms"] - mean
            results["runs"].append(r)
    finally:
        cl.stop()

    print(f"router overhead: {a.requests} requests per row, prompt {len(PROMPT)} ids, max_tokens 1; "
          f"empty driver run {results['driver_empty_run_ms']:.1f} ms (subtracted)")
    hdr = f"{'conc':>4}  {'path':<7} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8} {'req/s':>8}"
    print(hdr)
    print("-" * len(hdr))
    for r in results["runs"]:
        for path in ("router", "direct"):
            s = r[path]
            print(f"{r['concurrency']:>4}  {path:<7} {s['p50_ms']:>8.2f} {s['p99_ms']:>8.2f} {s['mean_ms']:>8.2f} "
                  f"{s['rps']:>8.1f}")
        print(f"{r['concurrency']:>4}  {'added':<7} {r['overhead_p50_ms']:>8.2f} {r['overhead_p99_ms']:>8.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
