#!/usr/bin/env python3
"""End-to-end tests of duet-router (DESIGN §2, §3, §10; issue acceptance).

Real processes on loopback: redis-server on a free port (no persistence),
duet-prefill and duet-decode on the tiny fixture (NNG over ipc://, UCX over
tcp), duet-router on 127.0.0.1 with a free port.  Clients: curl, Python's
http.client, and the OpenAI Python SDK where it is installed.

  routertest.py --build BUILD --model MODEL SCENARIO

Scenarios: api, errors, disconnect, limits, no-workers, redis-restart,
router-restart, openai, tools, affinity, two-routers.  Each prints what it checked and ends with
"N passed, N failed"; exit 1 on any failure, 77 when a scenario cannot run
here (no redis-server, no openai package).  Standard library only (the
openai scenario re-runs itself under /opt/routerenv when that has the SDK).
"""
import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import testdirs  # noqa: E402

SKIP = 77


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Cluster:
    """redis-server, prefill, decode and the router in a temporary directory (removed at the end
    of a run that passed: testdirs); the processes always stopped."""

    def __init__(self, build, model, redis=True, workers=True, router_args=(), decode_args=(), prefill_args=(),
                 decode_bin=None, pages=256):
        self.build, self.model = build, model
        self.dir = testdirs.temp_dir("duet-router-")
        self.events = f"ipc://{self.dir}/events.sock"
        self.procs = {}
        self.pages = pages
        self.env = dict(os.environ, UCX_TLS=os.environ.get("UCX_TLS", "tcp,self"),
                        DUET_LOG_LEVEL=os.environ.get("DUET_LOG_LEVEL", "info"))
        self.prefill_url = f"ipc://{self.dir}/p0.sock"
        self.decode_url = f"ipc://{self.dir}/d0.sock"
        self.redis_port = free_port() if redis else None
        self.router_args = list(router_args)
        try:
            if redis:
                self.start_redis()
            if workers:
                common = ["--model", model, "--pages", str(pages), "--events", self.events]
                self.start("p0", [f"{build}/prefill/duet-prefill", "--listen", self.prefill_url, "--id", "p0"]
                           + common + list(prefill_args))
                self.start("d0", [decode_bin or f"{build}/decode/duet-decode", "--listen", self.decode_url,
                                  "--id", "d0"] + common + list(decode_args))
            self.start_router(wait_ready=workers)
        except Exception:
            self.stop()
            raise

    def start(self, name, argv):
        log = open(f"{self.dir}/{name}.log", "a")
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                            start_new_session=True)

    def start_redis(self):
        self.start("redis", ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"])
        end = time.time() + 10
        while time.time() < end:
            try:
                socket.create_connection(("127.0.0.1", self.redis_port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def start_router(self, wait_ready=True, name="router", events=None, router_id="router-test"):
        """Start a router; returns its HTTP port (also self.port for the first, "router").  Another name
        starts another router on the same workers and Redis (give it its own events URL and id)."""
        pf = f"{self.dir}/{name}.port"
        if os.path.exists(pf):
            os.unlink(pf)
        argv = [f"{self.build}/router/duet-router", "--model", self.model, "--events", events or self.events,
                "--listen", "127.0.0.1:0", "--port-file", pf, "--id", router_id]
        if "p0" in self.procs:
            argv += ["--prefill", self.prefill_url, "--decode", self.decode_url]
        if self.redis_port:
            argv += ["--redis", f"127.0.0.1:{self.redis_port}"]
        self.start(name, argv + self.router_args)
        end = time.time() + 30
        while time.time() < end and not os.path.exists(pf):
            if self.procs[name].poll() is not None:
                raise RuntimeError(f"duet-router exited: {self.log(name)[-2000:]}")
            time.sleep(0.05)
        port = int(open(pf).read())
        if name == "router":
            self.port = port
        if wait_ready:
            self.wait_ready(port=port)
        return port

    def wait_ready(self, timeout=60, port=None):
        end = time.time() + timeout
        while time.time() < end:
            st, _, _ = self.get("/ready", port=port)
            if st == 200:
                return
            time.sleep(0.1)
        raise RuntimeError(f"router not ready; logs in {self.dir}")

    # ---- HTTP (port: another router's; default the first) ----
    def request(self, method, path, body=None, headers=None, timeout=120, port=None):
        c = http.client.HTTPConnection("127.0.0.1", port or self.port, timeout=timeout)
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        raw = r.read()
        c.close()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, raw

    def get(self, path, port=None):
        try:
            return self.request("GET", path, timeout=5, port=port)
        except OSError:
            return None, {}, b""

    def post(self, path, body, headers=None, port=None):
        st, h, raw = self.request("POST", path, body, headers, port=port)
        try:
            j = json.loads(raw)
        except ValueError:
            j = None
        return st, h, j, raw

    def stream(self, path, body, headers=None, port=None):
        """POST with stream; returns (status, headers, [events], done)."""
        st, h, raw = self.request("POST", path, body, headers, port=port)
        events, done = [], False
        for block in raw.decode().split("\n\n"):
            if not block.strip():
                continue
            assert block.startswith("data: "), block
            payload = block[6:]
            if payload == "[DONE]":
                done = True
            else:
                events.append(json.loads(payload))
        return st, h, events, done

    def curl(self, *args):
        p = subprocess.run(["curl", "-s", "-S", "-w", "\n%{http_code}", *args], capture_output=True, text=True,
                           timeout=120)
        body, _, code = p.stdout.rpartition("\n")
        return int(code or 0), body

    # ---- workers ----
    def state(self, url=None):
        r = subprocess.run([f"{self.build}/tools/duet-driver", "state", url or self.decode_url, "--requests"],
                           capture_output=True, text=True, timeout=20, env=self.env)
        return json.loads(r.stdout) if r.returncode == 0 else None

    def clean(self, st):
        return st and st["pages_free"] == self.pages and st["pages_quarantined"] == 0 and not st["requests"]

    def wait_clean(self, timeout=10, url=None):
        """Seconds until decode holds nothing, or None."""
        t0 = time.time()
        st = None
        while time.time() - t0 < timeout:
            st = self.state(url)
            if self.clean(st):
                return time.time() - t0
            time.sleep(0.02)
        return None

    def wait_busy(self, timeout=20):
        end = time.time() + timeout
        while time.time() < end:
            st = self.state()
            if st and st["pages_used"] > 0 and st["requests"]:
                return st
            time.sleep(0.02)
        return None

    def metric(self, name):
        _, _, raw = self.get("/metrics")
        total = 0.0
        for line in raw.decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def kill(self, name, sig=signal.SIGKILL):
        p = self.procs.pop(name)
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass
        p.wait(timeout=30)

    def stop(self):
        routers = sorted(n for n in self.procs if n.startswith("router"))
        for name in routers + [n for n in self.procs if not n.startswith("router") and n != "redis"] + ["redis"]:
            p = self.procs.get(name)
            if p and p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        self.procs = {}

    def log(self, name):
        try:
            return open(f"{self.dir}/{name}.log").read()
        except OSError:
            return ""


class Report:
    def __init__(self):
        self.ok = self.bad = 0

    def check(self, cond, what):
        print(("ok   " if cond else "FAIL ") + what, flush=True)
        if cond:
            self.ok += 1
        else:
            self.bad += 1
        return cond

    def done(self):
        print(f"{self.ok} passed, {self.bad} failed")
        return 1 if self.bad else 0


CHAT = "/v1/chat/completions"
COMP = "/v1/completions"


def chat_body(text="Hello!", **kw):
    b = {"model": "tiny-bf16", "messages": [{"role": "user", "content": text}], "max_tokens": 8}
    b.update(kw)
    return b


def joined_chat(events):
    text, reasoning, fin, usage = "", "", None, None
    for e in events:
        if e.get("usage"):
            usage = e["usage"]
        for c in e.get("choices") or []:
            d = c.get("delta", {})
            text += d.get("content") or ""
            reasoning += d.get("reasoning_content") or ""
            fin = c.get("finish_reason") or fin
    return text, reasoning, fin, usage


def joined_text(events):
    text, fin, usage = "", None, None
    for e in events:
        if e.get("usage"):
            usage = e["usage"]
        for c in e.get("choices") or []:
            text += c.get("text") or ""
            fin = c.get("finish_reason") or fin
    return text, fin, usage


# ---------------------------------------------------------------------------- scenarios

def sc_api(a, rep):
    c = Cluster(a.build, a.model)
    try:
        st, h, j, _ = c.post(CHAT, chat_body(seed=11, temperature=0.8), headers={"x-request-id": "client-42"})
        rep.check(st == 200 and j["object"] == "chat.completion", f"chat, not streamed: {st}")
        rep.check(h.get("x-request-id") == "client-42", "x-request-id echoed")
        rep.check(j["choices"][0]["message"]["role"] == "assistant" and isinstance(j["choices"][0]["message"]["content"], str),
                  "chat message shape")
        u = j["usage"]
        rep.check(u["completion_tokens"] == 8 and j["choices"][0]["finish_reason"] == "length",
                  f"usage counts the 8 tokens asked for, finish length ({u}, {j['choices'][0]['finish_reason']})")
        rep.check(u["prompt_tokens"] > 3 and u["total_tokens"] == u["prompt_tokens"] + 8, "usage: prompt and total")
        st2, h2, j2, _ = c.post(CHAT, chat_body(seed=11, temperature=0.8))
        rep.check(j2["choices"][0]["message"]["content"] == j["choices"][0]["message"]["content"],
                  "same seed, same text")
        rep.check(h2.get("x-request-id") == h2.get("x-duet-rid") and len(h2.get("x-request-id", "")) == 36,
                  "x-request-id assigned when the client sends none")
        st, h, ev, done = c.stream(CHAT, chat_body(seed=11, temperature=0.8, stream=True,
                                                   stream_options={"include_usage": True}))
        text, _, fin, usage = joined_chat(ev)
        rep.check(st == 200 and done and h.get("content-type", "").startswith("text/event-stream"),
                  "chat streamed: SSE ending with data: [DONE]")
        rep.check(ev[0]["choices"][0]["delta"].get("role") == "assistant", "first chunk carries the role")
        rep.check(text == j["choices"][0]["message"]["content"], "streamed text equals the non-streamed text")
        rep.check(fin == "length" and usage and usage["completion_tokens"] == 8 and ev[-1]["choices"] == [],
                  "include_usage: a last chunk with usage and no choices")
        rep.check(all("usage" in e for e in ev), "include_usage: usage null on the other chunks")
        # curl
        code, body = c.curl(f"http://127.0.0.1:{c.port}{CHAT}", "-d", json.dumps(chat_body(max_tokens=4)))
        rep.check(code == 200 and json.loads(body)["usage"]["completion_tokens"] == 4, "curl: chat")
        code, body = c.curl("-N", f"http://127.0.0.1:{c.port}{CHAT}", "-d", json.dumps(chat_body(max_tokens=3, stream=True)))
        rep.check(code == 200 and body.rstrip().endswith("data: [DONE]"), "curl: chat streamed")
        # completions
        st, h, j, _ = c.post(COMP, {"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0})
        rep.check(st == 200 and j["object"] == "text_completion" and j["usage"]["completion_tokens"] == 12,
                  f"completion, not streamed: {st}")
        greedy = j["choices"][0]["text"]
        st, h, ev, done = c.stream(COMP, {"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0,
                                          "stream": True})
        t2, fin, _ = joined_text(ev)
        rep.check(done and t2 == greedy and fin == "length", "completion streamed equals not streamed")
        st, _, j, _ = c.post(COMP, {"prompt": [0, 100, 200, 300], "max_tokens": 3})
        rep.check(st == 200 and j["usage"]["prompt_tokens"] == 4, "completion from token ids counts them")
        st, _, j, _ = c.post(COMP, {"prompt": "x"})
        rep.check(st == 200 and j["usage"]["completion_tokens"] == 16, "completions default max_tokens 16")
        # stop strings: cut greedy output inside its middle
        cut = None
        for i in range(len(greedy) // 3, len(greedy) - 2):
            s = greedy[i:i + 2]
            if "\ufffd" not in s and s.strip() and greedy.find(s) == i:
                cut = s
                break
        if rep.check(cut is not None, f"a stop string found in the greedy output {greedy!r}"):
            for stream in (False, True):
                body = {"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0, "stop": [cut],
                        "stream": stream}
                if stream:
                    body["stream_options"] = {"include_usage": True}
                    st, _, ev, _ = c.stream(COMP, body)
                    text, fin, usage = joined_text(ev)
                else:
                    st, _, j, _ = c.post(COMP, body)
                    text, fin, usage = j["choices"][0]["text"], j["choices"][0]["finish_reason"], j["usage"]
                rep.check(text == greedy[:greedy.find(cut)] and fin == "stop",
                          f"stop string {cut!r} ({'streamed' if stream else 'not streamed'}): text cut before it, "
                          f"finish stop")
                rep.check(usage["completion_tokens"] < 12, f"usage counts tokens up to the stop ({usage['completion_tokens']})")
            rep.check(c.wait_clean(2) is not None, "decode holds nothing after the stop-string stop")
        # stop token ids
        st, _, j, _ = c.post(COMP, {"prompt": [0, 100, 200], "max_tokens": 1})
        # thinking mode: all output before </think> is reasoning
        st, _, j, _ = c.post(CHAT, chat_body(thinking=True, max_tokens=6))
        m = j["choices"][0]["message"]
        rep.check(st == 200 and "reasoning_content" in m and (m["reasoning_content"] or m["content"]),
                  "thinking mode: reasoning_content in the message")
        st, _, ev, done = c.stream(CHAT, chat_body(reasoning_effort="high", max_tokens=6, stream=True))
        rep.check(st == 200 and done, "reasoning_effort accepted, streamed")
        # tools accepted; the random model makes no call, so 'required' warns
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
        st, _, j, _ = c.post(CHAT, chat_body(tools=tools, tool_choice="auto"))
        rep.check(st == 200 and j["choices"][0]["finish_reason"] in ("length", "stop", "tool_calls"), "tools: auto")
        st, _, j, _ = c.post(CHAT, chat_body(tools=tools, tool_choice="required", max_tokens=3))
        rep.check(st == 200 and any(w["code"] == "TOOL_CHOICE_UNMET" for w in j.get("warnings", [])),
                  "tools: required without a call gives a TOOL_CHOICE_UNMET warning")
        # routes
        st, _, raw = c.get("/v1/models")
        rep.check(st == 200 and json.loads(raw)["data"][0]["id"] == "tiny-bf16", "GET /v1/models")
        st, _, raw = c.get("/v1/models/tiny-bf16")
        rep.check(st == 200, "GET /v1/models/{id}")
        st, _, raw = c.get("/health")
        rep.check(st == 200 and json.loads(raw)["status"] == "ok", "GET /health")
        st, _, raw = c.get("/ready")
        j = json.loads(raw)
        rep.check(st == 200 and j["prefill_workers"] == 1 and j["decode_workers"] == 1 and j["redis"] == "up",
                  "GET /ready: one prefill, one decode, Redis up")
        st, _, raw = c.get("/v1/workers")
        ws = json.loads(raw)["data"]
        rep.check(st == 200 and sorted(w["id"] for w in ws) == ["d0", "p0"] and all(w["healthy"] for w in ws),
                  "GET /v1/workers lists both workers, healthy")
        st, _, raw = c.get("/metrics")
        m = raw.decode()
        for name in ("duet_router_responses_total", "duet_router_time_to_first_token_seconds_bucket",
                     "duet_router_inter_token_latency_seconds_bucket", "duet_router_e2e_request_latency_seconds_bucket",
                     "duet_router_queue_time_seconds_bucket", "duet_router_aborts_total", "duet_router_dsml_errors_total",
                     "duet_router_requests{", "duet_router_oldest_waiting_for_input_seconds", "duet_router_workers{",
                     "duet_worker_pages{", "duet_router_ctl_listener_restarts_total",
                     "duet_router_ctl_timeouts_rescued_total", "duet_router_ctl_client_redials_total",
                     "duet_router_ctl_dialer_revivals_total"):
            rep.check(name in m, f"/metrics has {name}")
        rep.check(c.metric("duet_router_aborts_total{reason=\"stop_string\"}") >= 2, "stop-string stops counted")
        # Redis records
        keys = subprocess.run(["redis-cli", "-p", str(c.redis_port), "--scan", "--pattern", "duet:*"],
                              capture_output=True, text=True).stdout.split()
        rep.check(any(k.startswith("duet:req:") for k in keys) and "duet:worker:d0" in keys and
                  any(k.startswith("duet:router:") for k in keys), "Redis: request, worker and router records")
        rid = h2["x-duet-rid"]
        rec = subprocess.run(["redis-cli", "-p", str(c.redis_port), "hgetall", f"duet:req:{rid}"], capture_output=True,
                             text=True).stdout.split()
        rec = dict(zip(rec[::2], rec[1::2]))
        rep.check(rec.get("state") == "finished" and rec.get("decode") == "d0" and rec.get("prefill") == "p0" and
                  rec.get("seed", "").isdigit(), f"Redis request record: state, workers, seed ({rec})")
        # session affinity
        st, _, j, _ = c.post(CHAT, chat_body(session_id="conv-1", max_tokens=2))
        sess = subprocess.run(["redis-cli", "-p", str(c.redis_port), "get", "duet:session:conv-1"],
                              capture_output=True, text=True).stdout.strip()
        rep.check(st == 200 and sess == "p0", "session affinity recorded in Redis")
        rep.check(c.wait_clean(5) is not None, "decode holds nothing afterwards")
    finally:
        c.stop()


def sc_errors(a, rep):
    c = Cluster(a.build, a.model, router_args=["--max-body-bytes", "65536"])
    try:
        cases = [
            (COMP, b"{", 400, None, "invalid JSON"),
            (COMP, b"[1]", 400, None, "a body that is not an object"),
            (COMP, {"prompt": "x", "temperature": 3}, 400, "temperature", "temperature out of range"),
            (COMP, {"prompt": "x", "temperature": "hot"}, 400, "temperature", "temperature of the wrong type"),
            (COMP, {"prompt": "x", "top_p": 0}, 400, "top_p", "top_p 0"),
            (COMP, {"prompt": "x", "min_p": 1.5}, 400, "min_p", "min_p out of range"),
            (COMP, {"prompt": "x", "top_k": -2}, 400, "top_k", "top_k below -1"),
            (COMP, {"prompt": "x", "n": 2}, 400, "n", "n = 2"),
            (COMP, {"prompt": "x", "max_tokens": 0}, 400, "max_tokens", "max_tokens 0"),
            (COMP, {"prompt": "x", "seed": 1.5}, 400, "seed", "seed not an integer"),
            (COMP, {"prompt": "x", "stop": ["a", ""]}, 400, "stop[1]", "an empty stop string"),
            (COMP, {"prompt": "x", "stop": 5}, 400, "stop", "stop of the wrong type"),
            (COMP, {"prompt": "x", "stop_token_ids": [-1]}, 400, "stop_token_ids[0]", "a negative stop token id"),
            (COMP, {"prompt": "x", "stream": "yes"}, 400, "stream", "stream not a boolean"),
            (COMP, {"prompt": "x", "echo": True}, 400, "echo", "echo (not supported)"),
            (COMP, {"prompt": [1, -5]}, 400, "prompt[1]", "a prompt id out of range"),
            (COMP, {}, 400, "prompt", "no prompt"),
            (COMP, {"prompt": "x", "presence_penalty": 0.5}, 400, "presence_penalty", "presence_penalty (not supported)"),
            (CHAT, {"max_tokens": 3}, 400, "messages", "no messages"),
            (CHAT, {"messages": []}, 400, "messages", "empty messages"),
            (CHAT, {"messages": [{"role": "bogus", "content": "x"}]}, 400, "messages[0].role", "an unknown role"),
            (CHAT, {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content", "content of the wrong type"),
            (CHAT, {"messages": [{"role": "tool", "content": "x"}]}, 400, "messages[0]", "a tool result without a call"),
            (CHAT, {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, 400,
             "tools[0].function", "a tool without a function"),
            (CHAT, {"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}, 400, "tool_choice",
             "tool_choice required without tools"),
            (CHAT, {"messages": [{"role": "user", "content": "x"}],
                    "tools": [{"type": "function", "function": {"name": "f"}}],
                    "tool_choice": {"type": "function", "function": {"name": "g"}}}, 400,
             "tool_choice.function.name", "tool_choice naming an unknown tool"),
            (CHAT, {"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "extreme"}, 400,
             "reasoning_effort", "an unknown reasoning effort"),
            (CHAT, {"messages": [{"role": "user", "content": "x"}], "logprobs": True}, 400, "logprobs",
             "logprobs (not supported)"),
            (CHAT, {"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": 1}}, 400,
             "stream_options.include_usage", "include_usage not a boolean"),
            (CHAT, {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}, 400,
             "messages", "a conversation ending with an assistant message"),
            (CHAT, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2000000}, 400, "max_tokens",
             "max_tokens over the model's context"),
        ]
        for path, body, status, param, what in cases:
            st, h, j, raw = c.post(path, body, headers={"x-request-id": "bad-1"})
            e = (j or {}).get("error", {})
            ok = st == status and e.get("param") == param and e.get("type") and e.get("message")
            rep.check(ok, f"{status} for {what} (param {param!r}; got {st} {e.get('param')!r}: {e.get('message')})")
        rep.check(h.get("x-request-id") == "bad-1", "x-request-id echoed on errors")
        st, _, j, _ = c.post(COMP, {"prompt": "x", "model": "gpt-4"})
        rep.check(st == 404 and j["error"]["code"] == "model_not_found" and j["error"]["param"] == "model",
                  "404 model_not_found for another model")
        st, _, raw = c.get("/v1/nothing")
        rep.check(st == 404 and json.loads(raw)["error"]["code"] == "not_found", "404 for an unknown route")
        st, _, raw = c.get("/v1/models/other")
        rep.check(st == 404, "404 for an unknown model id")
        st, _, _ = c.request("DELETE", "/v1/models")
        rep.check(st == 405, "405 for a wrong method")
        st, _, j, _ = c.post("/v1/requests/no-such-request/abort", b"")
        rep.check(st == 404, "404 aborting an unknown request")
        big = {"prompt": "x" * 70000}
        st, _, j, _ = c.post(COMP, big)
        rep.check(st == 413 and j["error"]["code"] == "request_too_large", "413 for a body over the limit")
        code, body = c.curl("-H", "Transfer-Encoding: chunked", "-H", "Content-Type: application/json",
                            f"http://127.0.0.1:{c.port}{COMP}", "--data-binary", json.dumps(big))
        rep.check(code == 413, f"413 for a chunked body over the limit ({code})")
        st, _, j, _ = c.post(COMP, {"prompt": "fine", "max_tokens": 2})
        rep.check(st == 200, "the router still serves after the bad input")
        rep.check(c.procs["router"].poll() is None, "the router is still running")
        rep.check(c.metric('duet_router_responses_total{endpoint="completions",status="400"}') >= 15,
                  "400s counted in /metrics")
    finally:
        c.stop()


def open_stream(c, body, port=None):
    conn = http.client.HTTPConnection("127.0.0.1", port or c.port, timeout=60)
    conn.request("POST", CHAT, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    return conn, r


def sc_disconnect(a, rep):
    c = Cluster(a.build, a.model)
    try:
        long = chat_body(max_tokens=3000, ignore_eos=True)
        # streamed: read a few chunks, then drop the connection
        for round_ in range(3):
            conn, r = open_stream(c, dict(long, stream=True))
            got = 0
            while got < 5:
                line = r.readline()
                if line.startswith(b"data: "):
                    got += 1
            busy = c.state()
            rep.check(busy and busy["pages_used"] > 0, f"round {round_}: decode holds the request mid-stream "
                      f"({busy and busy['pages_used']} pages)")
            t0 = time.time()
            conn.sock.shutdown(socket.SHUT_RDWR)
            conn.close()
            dt = c.wait_clean(5)
            rep.check(dt is not None and dt < 1.0, f"round {round_}: streamed client gone: decode's pages back in "
                      f"{dt if dt is None else round(dt * 1000)} ms (< 1000)")
        # the router's own account: the Abort went to decode within 100 ms of the client going away
        # (decode answers between two of its steps)
        import re
        ms = re.findall(r"Abort sent to decode \S+ ([0-9.]+) ms after the abort began, answered after ([0-9.]+) ms",
                        c.log("router"))
        sent = [float(a) for a, b in ms]
        rep.check(len(sent) >= 3 and max(sent) < 100,
                  f"Abort sent to decode within 100 ms of the disconnect (sent after {sent} ms, answered after "
                  f"{[float(b) for a, b in ms]} ms)")
        # not streamed: the router notices while it waits
        conn = http.client.HTTPConnection("127.0.0.1", c.port, timeout=60)
        conn.request("POST", CHAT, body=json.dumps(long), headers={"Content-Type": "application/json"})
        rep.check(c.wait_busy() is not None, "non-streamed request decoding")
        time.sleep(0.3)
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
        dt = c.wait_clean(5)
        rep.check(dt is not None and dt < 1.0, f"non-streamed client gone: pages back in "
                  f"{dt if dt is None else round(dt * 1000)} ms (< 1000)")
        # gone while prefill computes a long prompt: prefill answers the Abort when its step ends,
        # then decode is told (with prefill_quiesced when no put was issued); pages come back then
        conn = http.client.HTTPConnection("127.0.0.1", c.port, timeout=60)
        conn.request("POST", CHAT, body=json.dumps(chat_body("lorem ipsum " * 300, max_tokens=50, stream=True)),
                     headers={"Content-Type": "application/json"})
        busy = c.wait_busy()
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
        dt = c.wait_clean(30)
        rep.check(busy is not None and dt is not None, f"client gone during prefill: pages back once prefill's "
                  f"step ended ({dt if dt is None else round(dt * 1000)} ms)")
        rep.check(c.metric('duet_router_aborts_total{reason="CLIENT_DISCONNECT"}') >= 4,
                  "client disconnects counted in duet_router_aborts_total")
        ps = c.state(c.prefill_url)
        rep.check(ps and not ps["requests"], "prefill holds nothing")
        # admin abort: the client gets finish_reason abort
        conn, r = open_stream(c, dict(long, stream=True))
        rid = r.getheader("x-duet-rid")
        while not r.readline().startswith(b"data: "):
            pass
        st, _, j, _ = c.post(f"/v1/requests/{rid}/abort", b"")
        rest = r.read().decode()
        conn.close()
        rep.check(st == 200 and j["aborted"], "POST /v1/requests/{id}/abort")
        rep.check('"finish_reason":"abort"' in rest and rest.rstrip().endswith("data: [DONE]"),
                  "the aborted stream ends with finish_reason abort and [DONE]")
        rep.check(c.wait_clean(2) is not None, "decode holds nothing after the admin abort")
        # the router still serves
        st, _, j, _ = c.post(CHAT, chat_body(max_tokens=2))
        rep.check(st == 200, "the router serves after the disconnects")
    finally:
        c.stop()


def sc_limits(a, rep):
    c = Cluster(a.build, a.model, router_args=["--max-inflight", "1", "--queue-size", "0",
                                               "--request-timeout-ms", "1500"])
    try:
        conn, r = open_stream(c, chat_body(max_tokens=3000, ignore_eos=True, stream=True))
        rep.check(r.status == 200, "first request takes the only slot")
        st, _, j, _ = c.post(CHAT, chat_body(max_tokens=2))
        rep.check(st == 429 and j["error"]["type"] == "rate_limit_error", f"429 when the queue is full ({st})")
        rest = r.read().decode()
        conn.close()
        rep.check('"timeout_error"' in rest and rest.rstrip().endswith("data: [DONE]"),
                  "a stream past its deadline ends with a timeout error event and [DONE]")
        rep.check(c.wait_clean(3) is not None, "decode holds nothing after the timeout")
        # the router frees the only slot when the timed-out request's abort has ended on both workers
        end = time.time() + 5
        while time.time() < end and sum(c.metric(f'duet_router_requests{{state="{s}"}}') for s in
                                        ("queued", "reserving", "prefilling", "running", "aborting")) > 0:
            time.sleep(0.05)
        st, _, j, _ = c.post(CHAT, chat_body(max_tokens=3000, ignore_eos=True))
        rep.check(st == 504 and j["error"]["code"] == "timeout", f"504 for a request past its deadline ({st})")
        rep.check(c.wait_clean(3) is not None, "decode holds nothing after the 504")
        rep.check(c.metric('duet_router_aborts_total{reason="TIMEOUT"}') >= 2, "timeouts counted")
    finally:
        c.stop()


def sc_no_workers(a, rep):
    c = Cluster(a.build, a.model, workers=False)
    try:
        st, _, j, _ = c.post(CHAT, chat_body())
        rep.check(st == 503 and j["error"]["code"] == "no_workers", f"503 without workers ({st})")
        st, _, raw = c.get("/ready")
        rep.check(st == 503, "/ready is 503 without workers")
        st, _, raw = c.get("/health")
        rep.check(st == 200, "/health is 200 without workers")
    finally:
        c.stop()
    # configured workers that do not exist
    c = Cluster(a.build, a.model, workers=False,
                router_args=["--prefill", "ipc:///nonexistent/p.sock", "--decode", "ipc:///nonexistent/d.sock"])
    try:
        time.sleep(1.5)
        st, _, j, _ = c.post(CHAT, chat_body())
        rep.check(st == 503, f"503 when the configured workers never answer ({st})")
    finally:
        c.stop()
    # a decode worker that dies: the router stops using it
    c = Cluster(a.build, a.model, router_args=["--worker-timeout-ms", "1500"])
    try:
        c.kill("d0")
        time.sleep(2.5)
        st, _, j, _ = c.post(CHAT, chat_body())
        rep.check(st == 503, f"503 once the only decode worker is gone ({st})")
        st, _, raw = c.get("/ready")
        rep.check(st == 503 and json.loads(raw)["decode_workers"] == 0, "/ready reports no decode worker")
    finally:
        c.stop()


def sc_redis_restart(a, rep):
    if not shutil.which("redis-server"):
        print("redis-server is not installed")
        sys.exit(SKIP)
    c = Cluster(a.build, a.model)
    try:
        conn, r = open_stream(c, chat_body(max_tokens=60, ignore_eos=True, stream=True))
        rep.check(r.status == 200, "a request in flight")
        c.kill("redis")
        time.sleep(0.3)
        st, _, j, _ = c.post(CHAT, chat_body(max_tokens=2))
        rep.check(st == 503 and j["error"]["code"] == "redis_unavailable", f"Redis down: new requests get 503 ({st})")
        st, _, raw = c.get("/ready")
        rep.check(st == 503 and json.loads(raw)["redis"] == "down", "/ready says Redis is down")
        rest = r.read().decode()
        conn.close()
        text, _, fin, _ = joined_chat([json.loads(b[6:]) for b in rest.split("\n\n") if b.startswith("data: {")])
        rep.check(fin == "length" and rest.rstrip().endswith("data: [DONE]"),
                  "Redis down: the request in flight finishes normally")
        c.start_redis()
        t0 = time.time()
        ok = False
        while time.time() - t0 < 10:
            st, _, j, _ = c.post(CHAT, chat_body(max_tokens=2))
            if st == 200:
                ok = True
                break
            time.sleep(0.2)
        rep.check(ok, f"Redis back: requests served again after {time.time() - t0:.1f} s, no restart")
        st, _, raw = c.get("/ready")
        rep.check(st == 200, "/ready again")
        rep.check(c.wait_clean(3) is not None, "decode holds nothing afterwards")
    finally:
        c.stop()


def sc_worker_restart(a, rep):
    """A decode worker killed and started again at once under the same id and URL: the router
    sees the new process (its incarnation) and fails what the old one held, well before the
    worker-silence timeout; new requests then work."""
    c = Cluster(a.build, a.model)
    try:
        conns = [open_stream(c, chat_body(max_tokens=3000, ignore_eos=True, stream=True)) for _ in range(2)]
        busy = c.wait_busy()
        rep.check(busy and len(busy["requests"]) == 2, "two requests decoding")
        c.kill("d0")
        c.start("d0", [f"{a.build}/decode/duet-decode", "--listen", c.decode_url, "--id", "d0", "--model", a.model,
                       "--pages", str(c.pages), "--events", c.events])
        t0 = time.time()
        ended = []
        for conn, r in conns:
            try:
                body = r.read().decode(errors="replace")  # the stream ends: an error event, then [DONE]
            except Exception as e:  # noqa: BLE001 - a dropped connection also ends it
                body = str(e)
            ended.append((time.time() - t0, "error" in body))
            conn.close()
        took = max(t for t, _ in ended)
        rep.check(all(err for _, err in ended), "both streams end with an error event")
        rep.check(took < 8, f"they end {took:.1f} s after the restart (the silence timeout is 10 s)")
        end = time.time() + 30
        st = None
        while time.time() < end:
            st, _, j, _ = c.post(CHAT, chat_body(max_tokens=4))
            if st == 200:
                break
            time.sleep(0.3)
        rep.check(st == 200, "a new request works on the restarted worker")
        end = time.time() + 15
        held = None
        while time.time() < end:
            held = sum(c.metric(f'duet_router_requests{{state="{s}"}}')
                       for s in ("queued", "reserving", "prefilling", "running", "aborting"))
            if held == 0:
                break
            time.sleep(0.2)
        rep.check(held == 0, f"the router holds no request afterwards ({held})")
        rep.check(c.wait_clean() is not None, "the restarted decode worker holds nothing")
    finally:
        c.stop()


def sc_router_restart(a, rep):
    c = Cluster(a.build, a.model)
    try:
        conns = []
        for _ in range(2):
            conns.append(open_stream(c, chat_body(max_tokens=3000, ignore_eos=True, stream=True)))
        busy = c.wait_busy()
        rep.check(busy and len(busy["requests"]) == 2, "two requests decoding")
        c.kill("router")
        for conn, r in conns:
            conn.close()
        t0 = time.time()
        c.start_router()
        dt = c.wait_clean(15)
        rep.check(dt is not None, f"router kill -9 and restart: its requests aborted, pages back "
                  f"({dt if dt is None else round(time.time() - t0, 2)} s after the restart)")
        rep.check("this router before a restart" in c.log("router"), "the restarted router found its orphans")
        st, _, j, _ = c.post(CHAT, chat_body(max_tokens=3))
        rep.check(st == 200, "new requests work after the restart")
        keys = subprocess.run(["redis-cli", "-p", str(c.redis_port), "--scan", "--pattern", "duet:req:*"],
                              capture_output=True, text=True).stdout.split()
        states = [subprocess.run(["redis-cli", "-p", str(c.redis_port), "hget", k, "state"], capture_output=True,
                                 text=True).stdout.strip() for k in keys]
        rep.check(states and all(s in ("finished", "aborted") for s in states),
                  f"every request record ended ({sorted(set(states))})")
        # a clean shutdown aborts what is in flight (ROUTER_SHUTDOWN)
        conn, r = open_stream(c, chat_body(max_tokens=3000, ignore_eos=True, stream=True))
        c.wait_busy()
        c.kill("router", signal.SIGTERM)
        conn.close()
        rep.check(c.wait_clean(5) is not None, "router SIGTERM: requests in flight aborted, pages back")
    finally:
        c.stop()


def workers_list(raw):
    """The workers of a GET /v1/workers body (an empty list when it is not that JSON)."""
    try:
        j = json.loads(raw)
    except ValueError:
        return []
    w = j.get("data") if isinstance(j, dict) else None
    return [x for x in w if isinstance(x, dict)] if isinstance(w, list) else []


def sc_affinity(a, rep):
    """Two prefill workers: every turn of a conversation goes to the one holding its prefix."""
    hic = ["--hicache-device-pages", "32", "--hicache-host-gib", "0.01"]
    c = Cluster(a.build, a.model, prefill_args=hic)
    try:
        p1 = f"ipc://{c.dir}/p1.sock"
        c.start("p1", [f"{a.build}/prefill/duet-prefill", "--listen", p1, "--id", "p1", "--model", a.model,
                       "--pages", str(c.pages), "--events", c.events] + hic)
        c.kill("router", signal.SIGTERM)
        c.router_args += ["--prefill", p1]
        c.start_router()
        end = time.time() + 30
        while time.time() < end:  # listed is not enough: a worker not yet healthy is routed around
            st, _, raw = c.get("/v1/workers")
            if st == 200 and any(w.get("id") == "p1" and w.get("healthy") for w in workers_list(raw)):
                break
            time.sleep(0.2)
        redis = ["redis-cli", "-p", str(c.redis_port)]
        # an earlier turn (through this or another router) left the conversation on p1, which the
        # shortest-queue tie-break would not pick for a new conversation (p0 comes first)
        subprocess.run(redis + ["set", "duet:session:conv-A", "p1"], capture_output=True)
        owners = []
        for turn in range(4):
            st, _, j, _ = c.post(CHAT, chat_body("turn %d of a long conversation" % turn, session_id="conv-A",
                                                 max_tokens=2))
            owners.append(subprocess.run(redis + ["get", "duet:session:conv-A"], capture_output=True,
                                         text=True).stdout.strip())
            rep.check(st == 200, f"turn {turn}: {st}")
        rep.check(set(owners) == {"p1"}, f"the conversation stays on the prefill worker holding it ({owners})")
        keys = subprocess.run(redis + ["--scan", "--pattern", "duet:req:*"], capture_output=True,
                              text=True).stdout.split()
        used = {subprocess.run(redis + ["hget", k, "prefill"], capture_output=True, text=True).stdout.strip()
                for k in keys}
        rep.check(used == {"p1"}, f"every turn was prefilled there (workers used: {sorted(used)})")
        st, _, j, _ = c.post(CHAT, chat_body("a new conversation", session_id="conv-B", max_tokens=2))
        b = subprocess.run(redis + ["get", "duet:session:conv-B"], capture_output=True, text=True).stdout.strip()
        rep.check(st == 200 and b in ("p0", "p1"), f"a new conversation is recorded on the worker chosen ({b})")
        # with HiCache on p1, a later turn resends the conversation: its prefix is served from the cache
        system = "You are a careful agent. " + " ".join("rule %d: check the facts twice." % i for i in range(120))
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": "first question"}]
        body = {"messages": msgs, "max_tokens": 8, "temperature": 0, "session_id": "conv-A", "return_token_ids": True}
        st, _, j1, _ = c.post(CHAT, body)
        msgs2 = msgs + [{"role": "assistant", "content": j1["choices"][0]["message"]["content"] or "ok"},
                        {"role": "user", "content": "second question"}]
        outs = []
        for i in range(2):
            st, _, j2, _ = c.post(CHAT, dict(body, messages=msgs2))
            outs.append(j2 if st == 200 else {})
        cached = [o.get("usage", {}).get("prompt_tokens_details", {}).get("cached_tokens", 0) for o in outs]
        rep.check(st == 200 and cached[0] > 0 and cached[1] >= cached[0],
                  f"HiCache: the next turn's prefix came from the cache (cached_tokens {cached} of "
                  f"{outs[0].get('usage', {}).get('prompt_tokens')})")
        rep.check(outs[0].get("choices", [{}])[0].get("token_ids") == outs[1].get("choices", [{}])[0].get("token_ids")
                  and outs[0]["choices"][0]["token_ids"], "HiCache: the same turn twice gives the same tokens")
        end = time.time() + 10
        hits = 0
        while time.time() < end and hits < 2:
            hits = c.metric('duet_worker_prefix_cache_hits_total{worker="p1"}') or 0
            time.sleep(0.3)
        rep.check(hits >= 2, f"HiCache: hits in /metrics ({hits})")
    finally:
        c.stop()


def sc_openai(a, rep):
    try:
        import openai  # noqa: F401
    except ImportError:
        venv = "/opt/routerenv/bin/python"
        if os.path.exists(venv) and sys.executable != venv and not os.environ.get("DUET_ROUTERTEST_REEXEC"):
            os.environ["DUET_ROUTERTEST_REEXEC"] = "1"
            os.execv(venv, [venv] + sys.argv)
        print("the openai package is not installed (pip install openai)")
        sys.exit(SKIP)
    import openai
    c = Cluster(a.build, a.model)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{c.port}/v1", api_key="none", max_retries=0)
        models = client.models.list()
        rep.check([m.id for m in models.data] == ["tiny-bf16"], "SDK: models.list")
        r = client.chat.completions.create(model="tiny-bf16", messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=6, seed=3, temperature=0.5)
        rep.check(r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 6, "SDK: chat")
        s = client.chat.completions.create(model="tiny-bf16", messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=6, seed=3, temperature=0.5, stream=True,
                                           stream_options={"include_usage": True})
        text, fin, usage = "", None, None
        for ch in s:
            if ch.usage:
                usage = ch.usage
            for cc in ch.choices:
                text += cc.delta.content or ""
                fin = cc.finish_reason or fin
        rep.check(text == r.choices[0].message.content and fin == "length" and usage.completion_tokens == 6,
                  "SDK: chat streamed equals not streamed, usage chunk")
        r = client.completions.create(model="tiny-bf16", prompt="Once upon a time", max_tokens=5, temperature=0)
        rep.check(r.usage.completion_tokens == 5 and isinstance(r.choices[0].text, str), "SDK: completions")
        s = client.completions.create(model="tiny-bf16", prompt="Once upon a time", max_tokens=5, temperature=0,
                                      stream=True)
        rep.check("".join(ch.choices[0].text for ch in s if ch.choices) == r.choices[0].text,
                  "SDK: completions streamed")
        try:
            client.chat.completions.create(model="tiny-bf16", messages=[{"role": "user", "content": "Hi"}],
                                           temperature=9)
            rep.check(False, "SDK: 400 raises BadRequestError")
        except openai.BadRequestError as e:
            rep.check(e.status_code == 400 and e.body and e.body.get("param") == "temperature",
                      "SDK: 400 raises BadRequestError naming the field")
        try:
            client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "Hi"}])
            rep.check(False, "SDK: 404 raises NotFoundError")
        except openai.NotFoundError as e:
            rep.check(e.status_code == 404, "SDK: unknown model raises NotFoundError")
        # a stream closed by the client mid-way
        s = client.chat.completions.create(model="tiny-bf16", messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=3000, stream=True, extra_body={"ignore_eos": True})
        n = 0
        for ch in s:
            n += 1
            if n == 4:
                break
        s.close()
        dt = c.wait_clean(5)
        rep.check(dt is not None and dt < 1.0, f"SDK: stream closed mid-way, decode's pages back in "
                  f"{dt if dt is None else round(dt * 1000)} ms")
    finally:
        c.stop()


def sc_tools(a, rep):
    """A tool call, through a scripted decode worker that speaks the real protocol and
    emits a chosen token sequence: a DSML tool call the router must parse."""
    scripted = f"{a.build}/tests/router/duet-scripted-decode"
    if not os.path.exists(scripted):
        print("the scripted decode worker is not built")
        sys.exit(SKIP)
    call = ("Let me check.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
            "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
            "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
            "</｜DSML｜invoke>\n</｜DSML｜tool_calls>")
    bad = ("<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
           "<｜DSML｜parameter name=\"days\" string=\"false\">three</｜DSML｜parameter>\n"
           "</｜DSML｜invoke>\n</｜DSML｜tool_calls>")
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                             "required": ["city"]}}}]
    c = None
    try:
        script = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
        testdirs.track(script.name)
        # what follows the forced opening of a call: for a named tool (seed 3), the invoke is open
        # already; for 'required' (seed 4), the block is
        named_rest = ("<｜DSML｜parameter name=\"city\" string=\"true\">Rome</｜DSML｜parameter>\n"
                      "</｜DSML｜invoke>\n</｜DSML｜tool_calls>")
        required_rest = ("<｜DSML｜invoke name=\"get_weather\">\n"
                         "<｜DSML｜parameter name=\"city\" string=\"true\">Oslo</｜DSML｜parameter>\n"
                         "</｜DSML｜invoke>\n</｜DSML｜tool_calls>")
        json.dump({"outputs": {"call": call, "bad": bad, "named_rest": named_rest,
                               "required_rest": required_rest}}, script)
        script.close()
        c = Cluster(a.build, a.model, decode_bin=scripted, decode_args=["--script", script.name])
        # the scripted worker picks its output by the request's seed: 1 the call, 2 the malformed block
        body = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": tools,
                "max_tokens": 200, "seed": 1}
        st, _, j, raw = c.post(CHAT, body)
        ch = j["choices"][0] if st == 200 else {}
        calls = ch.get("message", {}).get("tool_calls") or []
        rep.check(st == 200 and ch.get("finish_reason") == "tool_calls", f"finish_reason tool_calls ({raw[:300]})")
        rep.check(len(calls) == 1 and calls[0]["function"]["name"] == "get_weather" and
                  json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris", "days": 3} and
                  calls[0]["id"].startswith("call_") and calls[0]["type"] == "function",
                  "tool_calls parsed from the DSML block")
        rep.check(ch.get("message", {}).get("content") == "Let me check.", "content before the block kept")
        st, _, ev, done = c.stream(CHAT, dict(body, stream=True))
        deltas = [cc["delta"] for e in ev for cc in e.get("choices", [])]
        scalls = [t for d in deltas for t in d.get("tool_calls", [])]
        fin = [cc["finish_reason"] for e in ev for cc in e.get("choices", []) if cc["finish_reason"]]
        rep.check(done and len(scalls) == 1 and scalls[0]["function"]["name"] == "get_weather" and
                  scalls[0]["id"] == calls[0]["id"] and fin == ["tool_calls"],
                  "streamed: one tool_calls delta, same id, finish tool_calls")
        # malformed: counted, returned as content with a warning
        before = c.metric("duet_router_dsml_errors_total")
        body["seed"] = 2
        st, _, j, raw = c.post(CHAT, body)
        ch = j["choices"][0] if st == 200 else {}
        rep.check(st == 200 and not ch["message"].get("tool_calls") and "three" in (ch["message"]["content"] or "")
                  and ch["finish_reason"] == "stop", "malformed DSML: plain content, no tool call")
        rep.check(any(w["code"] == "DSML_BAD_JSON" for w in j.get("warnings", [])), "malformed DSML: a warning")
        rep.check(c.metric("duet_router_dsml_errors_total") == before + 1, "malformed DSML counted in /metrics")
        # tool_choice named: the reply is made to open that tool's invoke; the model writes the rest
        body = {"messages": [{"role": "user", "content": "Weather in Rome?"}], "tools": tools, "max_tokens": 200,
                "seed": 3, "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                "return_token_ids": True}
        st, _, j, raw = c.post(CHAT, body)
        ch = j["choices"][0] if st == 200 else {}
        calls = ch.get("message", {}).get("tool_calls") or []
        rep.check(st == 200 and ch.get("finish_reason") == "tool_calls" and len(calls) == 1 and
                  calls[0]["function"]["name"] == "get_weather" and
                  json.loads(calls[0]["function"]["arguments"]) == {"city": "Rome"} and not j.get("warnings"),
                  f"tool_choice named: the forced invoke completed into a call ({raw[:300]})")
        pids = j.get("prompt_token_ids") or []
        rep.check(st == 200 and len(pids) == j["usage"]["prompt_tokens"] and
                  len(ch.get("token_ids") or []) == j["usage"]["completion_tokens"],
                  "return_token_ids: prompt and output ids match the usage counts")
        st2, _, j2, _ = c.post(CHAT, dict(body, tool_choice="auto", seed=5))
        rep.check(st2 == 200 and len(j2.get("prompt_token_ids") or []) < len(pids),
                  "tool_choice named: the forced opening ends the prompt")
        # tool_choice required in thinking mode: reasoning is closed, a block opened; streamed
        body = {"messages": [{"role": "user", "content": "Weather in Oslo?"}], "tools": tools, "max_tokens": 200,
                "seed": 4, "tool_choice": "required", "thinking": True, "stream": True}
        st, _, ev, done = c.stream(CHAT, body)
        deltas = [cc["delta"] for e in ev for cc in e.get("choices", [])]
        scalls = [t for d in deltas for t in d.get("tool_calls", [])]
        fin = [cc["finish_reason"] for e in ev for cc in e.get("choices", []) if cc["finish_reason"]]
        rep.check(done and len(scalls) == 1 and json.loads(scalls[0]["function"]["arguments"]) == {"city": "Oslo"}
                  and fin == ["tool_calls"], "tool_choice required (thinking, streamed): one call, finish tool_calls")
        # a forced call the model does not complete: plain content and a warning, never a broken call
        body = {"messages": [{"role": "user", "content": "x"}], "tools": tools, "max_tokens": 200, "seed": 2,
                "tool_choice": "required"}
        st, _, j, raw = c.post(CHAT, body)
        ch = j["choices"][0] if st == 200 else {}
        rep.check(st == 200 and not ch.get("message", {}).get("tool_calls") and
                  any(w["code"] == "TOOL_CHOICE_UNMET" for w in j.get("warnings", [])),
                  "tool_choice required, malformed continuation: no call, TOOL_CHOICE_UNMET")
        # OpenAI SDK, when present
        try:
            import openai
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{c.port}/v1", api_key="none", max_retries=0)
            r = client.chat.completions.create(model="tiny-bf16", messages=[
                {"role": "user", "content": "Weather in Paris?"}], tools=tools, seed=1)
            tc = r.choices[0].message.tool_calls
            rep.check(tc and tc[0].function.name == "get_weather" and r.choices[0].finish_reason == "tool_calls",
                      "SDK: tool_calls")
        except ImportError:
            pass
    finally:
        if c:
            c.stop()


def redis_states(c):
    """Every request record's state in Redis."""
    keys = subprocess.run(["redis-cli", "-p", str(c.redis_port), "--scan", "--pattern", "duet:req:*"],
                          capture_output=True, text=True).stdout.split()
    return {k: subprocess.run(["redis-cli", "-p", str(c.redis_port), "hget", k, "state"], capture_output=True,
                              text=True).stdout.strip() for k in keys}


def sc_two_routers(a, rep):
    """Two routers (own --events, own --id, one Redis) share one prefill and one decode worker.

    The workers' --events is router A's; every Reserve and Prefill names its router's event socket, so
    router B's requests stream through B.  Then: a client gone on B aborts on the workers; router A
    killed with -9 mid-request: B keeps serving and takes A's requests over once A's Redis liveness
    key expires (DESIGN §10: a router that dies is detected by the others), so decode's pages return."""
    import threading
    if not shutil.which("redis-cli"):
        print("redis-cli is not installed")
        sys.exit(SKIP)
    c = Cluster(a.build, a.model)
    try:
        A = c.port
        # a request of A in flight while B starts: B's first orphan sweep must leave it alone
        conn0, r0 = open_stream(c, chat_body("Before B", max_tokens=120, ignore_eos=True, stream=True,
                                             stream_options={"include_usage": True}))
        rep.check(r0.status == 200, "router A: a request in flight")
        B = c.start_router(name="router-b", events=f"ipc://{c.dir}/events-b.sock", router_id="router-b")
        rest = r0.read().decode()
        conn0.close()
        _, _, fin, usage = joined_chat([json.loads(b[6:]) for b in rest.split("\n\n") if b.startswith("data: {")])
        rep.check(fin == "length" and usage and usage["completion_tokens"] == 120 and "orphaned" not in c.log("router-b"),
                  f"router B's start (and its first orphan sweep) left A's request in flight alone ({fin}, {usage})")

        # 16 requests through each router at once, half streamed; greedy, so the same prompt gives the same
        # text through either router (no token of one request reached the other's client)
        results = {}

        def one(router, port, i):
            mt = 4 + i % 9
            body = chat_body(f"Request number {i}: say something about {i * 7}.", max_tokens=mt, temperature=0,
                             ignore_eos=True)
            try:
                if i % 2:
                    st, _, ev, done = c.stream(CHAT, dict(body, stream=True, stream_options={"include_usage": True}),
                                               port=port)
                    text, _, fin, usage = joined_chat(ev)
                    ok = st == 200 and done
                else:
                    st, _, j, _ = c.post(CHAT, body, port=port)
                    ok = st == 200
                    text = j["choices"][0]["message"]["content"] if ok else None
                    fin = j["choices"][0]["finish_reason"] if ok else None
                    usage = j.get("usage") if ok else None
                results[(router, i)] = (ok, text, fin, usage, mt)
            except Exception as e:  # a failure is reported below, not raised in a thread
                results[(router, i)] = (False, repr(e), None, None, mt)

        threads = [threading.Thread(target=one, args=(r, p, i)) for i in range(16) for r, p in (("A", A), ("B", B))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=180)
        bad = [k for k, (ok, _, fin, u, mt) in results.items()
               if not ok or fin != "length" or not u or u["completion_tokens"] != mt
               or u["total_tokens"] != u["prompt_tokens"] + mt]
        rep.check(len(results) == 32 and not bad,
                  f"32 concurrent requests, 16 through each router, half streamed: all complete with the usage "
                  f"asked for (failed: {sorted(bad)[:6]} {[results[k] for k in sorted(bad)[:2]]})")
        same = [i for i in range(16) if results.get(("A", i), (0,))[1:2] == results.get(("B", i), (1,))[1:2]
                and results[("A", i)][3]["prompt_tokens"] == results[("B", i)][3]["prompt_tokens"]]
        rep.check(len(same) == 16, f"greedy: each prompt gives the same text and prompt_tokens through A and B "
                  f"({len(same)} of 16)")
        rep.check(c.wait_clean(5) is not None, "decode holds nothing afterwards")
        for w in ("p0", "d0"):
            rep.check(f"event socket ipc://{c.dir}/events-b.sock: opened" in c.log(w),
                      f"{w} opened an event socket for router B (its --events is A's)")
        rep.check(c.metric("duet_router_tokens_total") > 0 and
                  "duet_router_tokens_total" in c.get("/metrics", port=B)[2].decode(), "both routers count tokens")

        # a client gone on B: its request is aborted on the workers, pages back
        long = chat_body(max_tokens=3000, ignore_eos=True, stream=True)
        conn, r = open_stream(c, long, port=B)
        got = 0
        while got < 5:
            if r.readline().startswith(b"data: "):
                got += 1
        busy = c.state()
        rep.check(busy and busy["pages_used"] > 0, "router B: decode holds its request mid-stream")
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
        dt = c.wait_clean(5)
        rep.check(dt is not None and dt < 1.0, f"router B's client gone: decode's pages back in "
                  f"{dt if dt is None else round(dt * 1000)} ms (< 1000)")
        rep.check("CLIENT_DISCONNECT" in c.get("/metrics", port=B)[2].decode(), "router B counted the abort")

        # kill -9 of router A with two requests decoding; B has one in flight and keeps serving
        conns = [open_stream(c, chat_body(f"A's request {k}", max_tokens=3000, ignore_eos=True, stream=True))
                 for k in range(2)]
        connb, rb = open_stream(c, chat_body("B's request", max_tokens=150, ignore_eos=True, stream=True,
                                             stream_options={"include_usage": True}), port=B)
        end = time.time() + 20
        st = None
        while time.time() < end:
            st = c.state()
            if st and len(st["requests"]) >= 3:
                break
            time.sleep(0.05)
        rep.check(st and len(st["requests"]) == 3, f"three requests on decode (two of A, one of B): "
                  f"{st and len(st['requests'])}")
        c.kill("router")
        t_kill = time.time()
        for cn, _ in conns:
            cn.close()
        st = c.state()
        rep.check(st and len(st["requests"]) == 3, f"right after the kill, A's requests are still on decode "
                  f"({st and len(st['requests'])} requests)")
        rest = rb.read().decode()
        connb.close()
        _, _, fin, usage = joined_chat([json.loads(b[6:]) for b in rest.split("\n\n") if b.startswith("data: {")])
        rep.check(fin == "length" and usage and usage["completion_tokens"] == 150 and rest.rstrip().endswith("[DONE]"),
                  f"router A gone: B's request in flight completes ({fin}, {usage})")
        st_, _, j, _ = c.post(CHAT, chat_body(max_tokens=5, ignore_eos=True), port=B)
        rep.check(st_ == 200 and j["usage"]["completion_tokens"] == 5, "router A gone: B serves new requests")
        dt = c.wait_clean(25)
        rep.check(dt is not None, f"A's requests aborted by router B's orphan take-over, decode's pages back "
                  f"{'never' if dt is None else round(time.time() - t_kill, 1)} s after the kill (bound 25 s: "
                  f"A's liveness key expires within 5 s, B sweeps every 5 s)")
        logb = c.log("router-b")
        rep.check(logb.count("of router router-test (gone): aborting it") >= 2,
                  "router B's log names A's two requests as orphans it aborted")
        ps = c.state(c.prefill_url)
        rep.check(ps and not ps["requests"], "prefill holds nothing")
        states = redis_states(c)
        rep.check(states and all(v in ("finished", "aborted") for v in states.values()),
                  f"every request record in Redis ended ({sorted(set(states.values()))}, {len(states)} records)")
        st_, _, j, _ = c.post(CHAT, chat_body(max_tokens=3), port=B)
        rep.check(st_ == 200, "router B still serves")
    finally:
        c.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("scenario")
    a = ap.parse_args()
    if not shutil.which("redis-server") or not shutil.which("curl"):
        print("redis-server or curl is not installed")
        sys.exit(SKIP)
    rep = Report()
    fn = {"api": sc_api, "errors": sc_errors, "disconnect": sc_disconnect, "limits": sc_limits,
          "no-workers": sc_no_workers, "redis-restart": sc_redis_restart, "router-restart": sc_router_restart, "worker-restart": sc_worker_restart,
          "openai": sc_openai, "tools": sc_tools, "affinity": sc_affinity,
          "two-routers": sc_two_routers}[a.scenario]
    sys.exit(testdirs.run(fn, a, rep))


if __name__ == "__main__":
    main()
