#!/usr/bin/env python3
"""duet-bench-agents end to end (suite 'bench', docs/BENCH.md).

Starts redis-server, duet-prefill, duet-decode (bf16 caches) and duet-router on loopback
with the tiny fixture, then runs duet-bench-agents against them:

  short   4 sessions at once, 2 turns, 8 tokens out, 30% of requests dropped by the client:
          exit 0, 0 corrupted, 0 leaked, 0 timed out, >0 completed, drops exercised
  corrupt the same load with one reference altered on purpose (--test-corrupt-reference):
          the detector reports it and the bench exits 1
  nul     against a stand-in server (no cluster) whose replies hold U+0000 ("\\u0000", valid
          JSON a token may decode to): every request completes, and the next turn sends the
          reply back with the character in it
  usage   a bad flag exits 2

  benchtest.py --build BUILD --model MODEL
Standard library only; every wait is bounded; exit 77 when redis-server is missing.
"""
import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Cluster:
    def __init__(self, build, model, dtypes=("bf16", "bf16")):
        self.dir = tempfile.mkdtemp(prefix="duet-bench-")
        self.procs = {}
        env = dict(os.environ, UCX_TLS=os.environ.get("UCX_TLS", "tcp,self"),
                   DUET_LOG_LEVEL=os.environ.get("DUET_LOG_LEVEL", "info"))
        self.env = env
        events = f"ipc://{self.dir}/events.sock"
        self.decode_url = f"ipc://{self.dir}/d0.sock"
        prefill_url = f"ipc://{self.dir}/p0.sock"
        rport, self.port = free_port(), free_port()
        kv, ik = dtypes
        common = ["--model", model, "--events", events, "--kv-dtype", kv, "--index-k-dtype", ik, "--pages", "512"]
        try:
            self.start("redis", ["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                                 "--appendonly", "no"])
            self.start("p0", [f"{build}/prefill/duet-prefill", "--listen", prefill_url, "--id", "p0"] + common)
            self.start("d0", [f"{build}/decode/duet-decode", "--listen", self.decode_url, "--id", "d0"] + common)
            self.start("router", [f"{build}/router/duet-router", "--model", model, "--events", events,
                                  "--listen", f"127.0.0.1:{self.port}", "--prefill", prefill_url,
                                  "--decode", self.decode_url, "--redis", f"127.0.0.1:{rport}", "--id", "router-bench",
                                  "--wait-ms", "120000"])
            self.url = f"http://127.0.0.1:{self.port}"
            end = time.time() + 90
            while time.time() < end:
                try:
                    import urllib.request
                    if urllib.request.urlopen(self.url + "/ready", timeout=2).status == 200:
                        return
                except Exception:
                    pass
                for n, p in self.procs.items():
                    if p.poll() is not None:
                        raise RuntimeError(f"{n} exited; logs in {self.dir}")
                time.sleep(0.2)
            raise RuntimeError(f"the router was not ready after 90 s; logs in {self.dir}")
        except Exception:
            self.stop()
            raise

    def start(self, name, argv):
        log = open(f"{self.dir}/{name}.log", "a")
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                            start_new_session=True)

    def stop(self):
        for name in ("router", "p0", "d0", "redis"):
            p = self.procs.get(name)
            if p and p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait(timeout=10)
        self.procs = {}


class Report:
    def __init__(self):
        self.ok = self.bad = 0

    def check(self, cond, what):
        print(("ok   " if cond else "FAIL ") + what, flush=True)
        self.ok += bool(cond)
        self.bad += not cond
        return cond


def bench(a, c, tmp, name, extra, timeout=240):
    out = os.path.join(tmp, name + ".json")
    argv = [f"{a.build}/tools/duet-bench-agents", "--url", c.url, "--model", a.model, "--worker", c.decode_url,
            "--cache-dir", os.path.join(tmp, "refs"), "--json", out, "--progress", "off", "--settle", "20"] + extra
    print("$ " + " ".join(argv), flush=True)
    t0 = time.time()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    print(r.stdout + r.stderr[-3000:], flush=True)
    print(f"({name}: exit {r.returncode} after {time.time() - t0:.1f} s)", flush=True)
    j = None
    if os.path.exists(out):
        with open(out) as f:
            j = json.load(f)
    return r.returncode, j

class NulServer:
    """A stand-in for the router: each chat completion streams a reply whose text holds U+0000
    and records the requests; GET /v1/workers lists no workers."""

    REPLY = "ok\u0000done"

    def __init__(self):
        self.requests = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def send_json(self, code, obj):
                b = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(b)))
                self.end_headers()
                self.wfile.write(b)

            def do_GET(self):
                self.send_json(200, {"object": "list", "data": []} if self.path == "/v1/workers"
                               else {"error": {"message": "not here"}})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                outer.requests.append(body)
                n = 10 * len(body.get("messages", []))  # prompt ids that grow turn to turn
                events = [
                    {"id": "c", "object": "chat.completion.chunk", "prompt_token_ids": list(range(n)),
                     "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "token_ids": []}]},
                    {"id": "c", "object": "chat.completion.chunk",
                     "choices": [{"index": 0, "delta": {"content": NulServer.REPLY}, "token_ids": [7, 0, 8]}]},
                    {"id": "c", "object": "chat.completion.chunk",
                     "choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "token_ids": []}]},
                ]
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for e in events:
                    self.wfile.write(b"data: " + json.dumps(e).encode() + b"\n\n")
                self.wfile.write(b"data: [DONE]\n\n")

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}"
        self.th = threading.Thread(target=self.srv.serve_forever, daemon=True)
        self.th.start()

    def stop(self):
        self.srv.shutdown()
        self.srv.server_close()


def nul_case(a, rep, tmp):
    srv = NulServer()
    try:
        out = os.path.join(tmp, "nul.json")
        argv = [f"{a.build}/tools/duet-bench-agents", "--url", srv.url, "--compare", "none", "--json", out,
                "--progress", "off", "--settle", "2", "--concurrency", "1", "--sessions", "2", "--turns", "2",
                "--tools", "1", "--max-tokens", "8", "--timeout", "20"]
        print("$ " + " ".join(argv), flush=True)
        r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        print(r.stdout + r.stderr[-2000:], flush=True)
        j = json.load(open(out)) if os.path.exists(out) else None
        rep.check(j is not None and j["requests"]["completed"] == 4 and j["requests"]["failed"] == 0,
                  f"nul: replies holding U+0000 parsed, 4 of 4 requests completed "
                  f"({j and j['requests']}, failures {j and j.get('failures')})")
        # the second turn of each session carries the first turn's reply (besides the load's own
        # tool-call history) as the stand-in sent it
        back = [m.get("content") for q in srv.requests for m in q.get("messages", []) if m.get("role") == "assistant"
                and not m.get("tool_calls")]
        rep.check(back == [NulServer.REPLY] * 2,
                  f"nul: each session's second turn sent its reply back whole, U+0000 included ({back!r})")
    finally:
        srv.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--model", required=True)
    a = ap.parse_args()
    if not shutil.which("redis-server"):
        print("redis-server is not installed")
        return 77
    rep = Report()
    tmp = tempfile.mkdtemp(prefix="duet-benchtest-")
    c = Cluster(a.build, a.model)
    try:
        load = ["--concurrency", "4", "--sessions", "6", "--turns", "2", "--max-tokens", "8", "--tools", "2",
                "--context", "400", "--timeout", "120", "--seed", "7"]
        rc, j = bench(a, c, tmp, "short", load + ["--disconnect-fraction", "0.3"])
        if rep.check(j is not None, "short: the JSON report was written"):
            q = j["requests"]
            rep.check(rc == 0 and j["clean"], f"short: exit 0, clean (exit {rc}, problems {j['problems']})")
            rep.check(q["completed"] > 0, f"short: {q['completed']} requests completed")
            rep.check(j["correctness"]["corrupted"] == 0 and j["correctness"]["compared"] == q["completed"],
                      f"short: 0 corrupted, every completed request compared ({j['correctness']['compared']})")
            rep.check(j["workers"]["leaked_pages"] == 0 and j["workers"]["leaked_slots"] == 0 and
                      j["workers"]["settled"], f"short: 0 pages or slots leaked ({j['workers']})")
            rep.check(q["timed_out"] == 0 and q["failed"] == 0, "short: 0 timed out, 0 failed")
            rep.check(q["aborted_by_client"] > 0, f"short: client drops exercised ({j['disconnects']})")
            rep.check(j["correctness"]["mode"] == "exact (CPU backend)", "short: comparison mode stated")
            rep.check(j["latency_s"]["ttft"]["n"] > 0 and j["throughput"]["output_tokens_per_s"] > 0,
                      "short: latency and throughput reported")
        rc, j = bench(a, c, tmp, "corrupt", load[:3] + ["2"] + load[4:] + ["--test-corrupt-reference", "1"])
        rep.check(rc == 1 and j is not None and j["correctness"]["corrupted"] >= 1 and not j["clean"],
                  f"corrupt: an altered reference is reported as corrupted, exit 1 (exit {rc}, "
                  f"corrupted {j and j['correctness']['corrupted']})")
        rep.check(j is not None and j["correctness"]["references_cached"] > 0,
                  "corrupt: the references of the first run came from the cache")
        nul_case(a, rep, tmp)
        r = subprocess.run([f"{a.build}/tools/duet-bench-agents", "--url", c.url, "--concurrency", "999"],
                           capture_output=True, text=True, timeout=30)
        rep.check(r.returncode == 2, f"usage: --concurrency 999 exits 2 ({r.returncode}: {r.stderr.strip()})")
    finally:
        c.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        if rep.bad == 0:
            shutil.rmtree(c.dir, ignore_errors=True)
        else:
            print(f"cluster logs kept in {c.dir}")
    print(f"{rep.ok} passed, {rep.bad} failed")
    return 1 if rep.bad else 0


if __name__ == "__main__":
    sys.exit(main())
