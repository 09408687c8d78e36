#!/usr/bin/env python3
"""Tokenizer speed, duet beside the reference, on the same corpus in one run.

Runs the Rust `tokenizers` package (PyPI) single-threaded: TOKENIZERS_PARALLELISM
is false and each document is encoded by its own Tokenizer.encode() call
(add_special_tokens=False, added tokens recognised), never encode_batch, so
no Rayon thread is used.  Then runs duet-bench-tokenizer on the same corpus
(one encode call per document, single thread), checks that both produced the
same ids (count and FNV-1a hash), and prints both figures side by side.

Throughput is 10^6 bytes of UTF-8 input per second; both sides time one
warm-up pass apart and report the mean and the best of --passes passes.
The Python call overhead per document is part of the reference's figure, as
it is for every Python server that uses it.

Usage: tools/bench_tokenizer_ref.py [--bench build/tools/duet-bench-tokenizer]
           [--tokenizer tokenizer.json] [--corpus file] [--passes N]
Runs under /opt/textenv/bin/python when this Python lacks `tokenizers`; exits
77 when neither has it.
"""
import argparse
import gzip
import json
import os
import platform
import subprocess
import sys
import time

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_docs(path):
    if path.endswith(".jsonl.gz"):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return [json.loads(line)["t"] for line in f if line.strip()]
    with open(path, "rb") as f:
        return [f.read().decode("utf-8", "replace")]


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "tools", "duet-bench-tokenizer"))
    ap.add_argument("--tokenizer", default=os.path.join(ROOT, "data", "tokenizer", "deepseek-v4", "tokenizer.json"))
    ap.add_argument("--corpus", default=os.path.join(ROOT, "tests", "text", "golden", "tokenizer-corpus.jsonl.gz"))
    ap.add_argument("--passes", type=int, default=5)
    a = ap.parse_args()
    try:
        import tokenizers
        from tokenizers import Tokenizer
    except ImportError:
        venv = "/opt/textenv/bin/python"
        if os.path.exists(venv) and os.path.realpath(sys.prefix) != os.path.realpath("/opt/textenv"):
            os.execv(venv, [venv] + sys.argv)
        print("SKIP: the Python package `tokenizers` is missing "
              "(python3 -m venv /opt/textenv && /opt/textenv/bin/pip install tokenizers)")
        return 77

    docs = load_docs(a.corpus)
    nbytes = sum(len(d.encode("utf-8")) for d in docs)
    tok = Tokenizer.from_file(a.tokenizer)
    h, nids = 1469598103934665603, 0
    times = []
    for p in range(a.passes + 1):
        t0 = time.process_time()
        for d in docs:
            ids = tok.encode(d, add_special_tokens=False).ids
            if p == 0:
                nids += len(ids)
                for x in ids:
                    h = ((h ^ x) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
        if p:
            times.append(time.process_time() - t0)
    ref_mean = nbytes / 1e6 / (sum(times) / len(times))
    ref_best = nbytes / 1e6 / min(times)

    out = subprocess.run([a.bench, "--tokenizer", a.tokenizer, "--corpus", a.corpus, "--passes", str(a.passes)],
                         check=True, capture_output=True, text=True).stdout
    res = dict(kv.split("=") for kv in next(l for l in out.splitlines() if l.startswith("RESULT ")).split()[1:])
    same = int(res["ids"]) == nids and res["hash"] == "%016x" % h and int(res["bytes"]) == nbytes

    print(f"tokenizer bench: {len(docs)} documents, {nbytes / 1e6:.2f} MB, {nids} ids; {cpu_name()}; single thread")
    print(f"  {'':26} {'mean MB/s':>10} {'best MB/s':>10}")
    print(f"  {'tokenizers ' + tokenizers.__version__ + ' (Rust)':26} {ref_mean:10.2f} {ref_best:10.2f}")
    print(f"  {'duet':26} {float(res['mean_mbps']):10.2f} {float(res['best_mbps']):10.2f}")
    print(f"  duet / tokenizers: {float(res['mean_mbps']) / ref_mean:.2f}x (mean); ids identical: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
