#!/usr/bin/env bash
# device-agents.sh: `duet bench agents --scenario agents-80x4` through duet-router, with
# duet-prefill and duet-decode --device cuda as two processes on the one GPU (or, with
# --prefill-gpus 0 --decode-gpus 1, each on its own GPU group), for index-K bf16 and fp8
# (KV bf16).
#
# Here (any machine with nvcc; no GPU needed):
#   scripts/device-agents.sh --prepare
#       meson setup build-fwd -Dgpu_archs=90 (if needed); ninja the binaries below;
#       scripts/make-bundle.sh; packs the binaries into build-fwd/device-agents.tgz
#   scripts/device-agents.sh --dry-run
#       the same steps here with --device cpu and a small load (6 sessions x 2 turns): the
#       tarball, the bundle's redis-server, the duet script, the summary
# There (on the GPU machine, with build-fwd/device-agents.tgz and .bundle copied into the checkout there):
#   bash scripts/device-agents.sh --encodings bf16
#   (and --encodings fp8 in a second run: see the time note below)
#
# On the GPU: unpacks the binaries and .bundle, puts on the library path only the sonames the
# image lacks, runs redis-server from the bundle (Debian's, unpacked with dpkg -x), regenerates
# the tiny-bf16 fixture (seed 1, as the build does), measures the staging copies against
# pinned cudaMemcpy (duet-check-forward --staging 2000), then for each index-K encoding:
#   DUET_NO_BUILD=1 ./duet bench agents --device cuda --scenario agents-80x4 --kv-dtype bf16 ...
# (redis-server, duet-router, duet-prefill and duet-decode --device cuda, the bench with its
# references from duet-generate --device cuda).  Prints each run's table, the workers' staging
# and decode exit lines, and a summary last; $OUT gets agents-IK.json, agents-IK.png, the log
# and logs.tgz (elsewhere build-fwd/device-agents/).
#
# Options: --prepare, --dry-run, --encodings "bf16 fp8", --timeout S (the bench's per-request
# deadline, default 100), --run-limit S (one encoding's run, default 420), --cpu-exact (the
# workers in CPU-exact mode, DUET_CUDA_EXACT=1, and the references from the CPU engine:
# the GPU cluster's outputs compared with duet-generate --device cpu token for token),
# -- BENCH FLAGS (instead of --scenario agents-80x4).
#
# Time on the H200: on 2026-11-29 each run's load took about 175 s and its 310-odd references
# (duet-generate --device cuda, about 2.3 s each, 8 at a time) about 90 s, so the two encodings
# did not fit one 10-minute run on the GPU machine; on 2026-11-30 a run took about 80 s in all
# (the load 2 s, the references about 70 s); on 2026-12-03 both encodings in one call took 162 s
# (--encodings "bf16 fp8").
# Exit status 0 when every run was clean.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/scripts/device-lib.sh"
BUILD="${DUET_CUDA_BUILD:-$ROOT/build-fwd}"
TGZ="$BUILD/device-agents.tgz"
BINS="prefill/duet-prefill decode/duet-decode router/duet-router tools/duet-bench-agents tools/duet-generate
      tools/duet-driver tools/duet-mkmodel tools/duet-check-forward tools/duet-bench-xfer tools/duet-check-ops"
dry=0 encodings="bf16 fp8" req_timeout=100 load=() groups=() cpu_exact=0
run_limit=420     # s, one encoding's run: cluster start, the load, the references, the stop
total_limit=560   # s, the whole script: no run starts that could not end within it

while [ $# -gt 0 ]; do
  case "$1" in
    --prepare)
      set -e
      duet_device_prepare "$BUILD" $BINS
      tar -czf "$TGZ" -C "$BUILD" $BINS
      (cd "$BUILD" && du -ch $BINS | tail -1) ; du -h "$TGZ"; du -sh "$ROOT/.bundle"
      exit 0 ;;
    --dry-run) dry=1 ;;
    --encodings) encodings="$2"; shift ;;
    --timeout) req_timeout="$2"; shift ;;
    --run-limit) run_limit="$2"; shift ;;
    --prefill-gpus|--decode-gpus) groups+=("$1" "$2"); shift ;;
    --cpu-exact) cpu_exact=1 ;;
    --) shift; load=("$@"); break ;;
    *) echo "usage: scripts/device-agents.sh [--prepare] [--dry-run] [--encodings \"bf16 fp8\"] [--timeout S] [--run-limit S] [--prefill-gpus LIST --decode-gpus LIST] [--cpu-exact] [-- bench flags]" >&2
       exit 2 ;;
  esac
  shift
done

jobs=8  # reference processes at once (duet-generate --device cuda: 8 at a time, as tests/pd/pdtest.py)
if [ "$dry" = 1 ]; then
  DEVICE=cpu
  jobs=2
  [ ${#load[@]} -gt 0 ] || load=(--concurrency 6 --sessions 6 --turns 2 --tools 1 --max-tokens 8)
  WORK="$(mktemp -d "${TMPDIR:-/tmp}/duet-agents-dry.XXXXXX")"
else
  DEVICE=cuda
  [ ${#load[@]} -gt 0 ] || load=(--scenario agents-80x4)
  WORK=/tmp/duet-agents
fi
if [ "$cpu_exact" = 1 ]; then
  # the workers in CPU-exact mode (DUET_CUDA_EXACT=1, inherited through ./duet), their outputs
  # compared with references from the CPU engine (duet-generate --device cpu, after ./duet's
  # own --reference-device, so it wins), 16 at a time
  export DUET_CUDA_EXACT=1
  load+=(--reference-device cpu)
  [ "$dry" = 1 ] || jobs=16
fi
RES="${OUT:-$BUILD/device-agents}"
mkdir -p "$RES" "$WORK"
LOG="$RES/device-agents.log"
SUM="$WORK/summary.txt"
: >"$LOG"
: >"$SUM"
say() { echo "$@" | tee -a "$LOG"; }
row() { printf '%-36s %s\n' "$1" "$2" | tee -a "$SUM" >>"$LOG"; }
T0=$SECONDS

# ---- binaries: the tarball, unpacked in the layout of a build directory
W="$WORK/build"
mkdir -p "$W"
[ -f "$TGZ" ] || { say "device-agents: $TGZ is missing: run scripts/device-agents.sh --prepare and copy it there"; exit 2; }
tar -xzf "$TGZ" -C "$W" || { say "device-agents: cannot unpack $TGZ"; exit 2; }

# ---- libraries and programs: the bundle's where the image lacks them (scripts/device-lib.sh)
PROGS="$WORK/bin"
duet_device_runtime "$WORK" $(for b in $BINS; do echo "$W/$b"; done) >"$WORK/runtime.txt" 2>&1  # not in a pipe: it exports
rt=$?
tee -a "$LOG" <"$WORK/runtime.txt"
[ "$rt" = 0 ] || { say "device-agents: the runtime is incomplete"; exit 2; }

# gnuplot for the bench's --plot: where the image has none, a stand-in that draws the bench's
# plot script (points of end-to-end latency and TTFT by request start, failures, chaos lines)
# with matplotlib
if [ "${DUET_AGENTS_PLOT_STANDIN:-0}" = 1 ] || ! command -v gnuplot >/dev/null 2>&1; then
  cat >"$PROGS/gnuplot" <<'PY'
#!/usr/bin/env python3
"""Stand-in for `gnuplot SCRIPT` on the subset duet-bench-agents writes (tools/bench_agents_check.c)."""
import re, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

src = open(sys.argv[1]).read()
get = lambda key: (re.search(r"^set %s '([^']*)'" % key, src, re.M) or [None, ""])[1]
fig, ax = plt.subplots(figsize=(12, 6.4), dpi=100)
for x, label in zip(re.findall(r"^set arrow from ([-0-9.e+]+),", src, re.M),
                    re.findall(r"^set label '([^']*)'", src, re.M)):
    ax.axvline(float(x), color="red", linestyle="--", linewidth=1)
    ax.text(float(x), 0.95, " " + label, color="red", transform=ax.get_xaxis_transform())
plot = next(l for l in src.splitlines() if l.startswith("plot "))
for path, col, failed, title in re.findall(r"'([^']*)' using 1:(\d) with points pt \d+ ps [0-9.]+( lc rgb 'red')? title '([^']*)'", plot):
    xs, ys = [], []
    for line in open(path):
        f = line.split()
        if len(f) >= int(col):
            xs.append(float(f[0]))
            ys.append(float(f[int(col) - 1]))
    ax.scatter(xs, ys, s=30 if failed else 6, marker="x" if failed else "o", color="red" if failed else None, label=title)
ax.set_title(get("title"))
ax.set_xlabel(get("xlabel"))
ax.set_ylabel(get("ylabel"))
ax.grid(True)
ax.legend(loc="upper left")
fig.savefig(get("output"))
PY
  chmod +x "$PROGS/gnuplot"
  say "== gnuplot: not in the image; plots drawn by the matplotlib stand-in"
fi

if [ "$dry" = 0 ]; then
  say "== device"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1 | tee -a "$LOG"
fi
say "cpus: $(nproc); $(uname -r)"

FIX="$WORK/fixtures"
mkdir -p "$FIX"
"$W/tools/duet-mkmodel" --preset tiny --seed 1 --out "$FIX/tiny-bf16" >>"$LOG" 2>&1 ||
  { say "device-agents: duet-mkmodel failed"; exit 2; }

# ---- staging copies against pinned cudaMemcpy, the encodings of the runs
if [ "$dry" = 0 ]; then
  for ik in $encodings; do
    out="$WORK/staging-$ik.txt"
    timeout 120 "$W/tools/duet-check-forward" --model "$FIX/tiny-bf16" --staging 2000 --kv-dtype bf16 \
      --index-k-dtype "$ik" >"$out" 2>>"$LOG"
    rc=$?
    cat "$out" >>"$LOG"
    row "staging bf16/$ik (check-forward): exit $rc" "$(grep '^staging [0-9]' "$out" | sed 's/^staging //' | cut -c1-120)"
    row "  pinned cudaMemcpy" "$(grep '^staging ceilings' "$out" | sed 's/^staging ceilings: pinned cudaMemcpy //')"
    grep '^staging device\|^staging host' "$out" | sed 's/^staging //' | while read -r l; do row "  ${l%%:*}" "${l#*: }"; done
  done
fi

# ---- the runs: both workers on the one GPU, or each on its GPU group (--prefill-gpus/--decode-gpus)
where=(--device "$DEVICE")
[ ${#groups[@]} -gt 0 ] && [ "$dry" = 0 ] && where=("${groups[@]}")
fail=0
export PYTHONUNBUFFERED=1
for ik in $encodings; do
  limit=$run_limit
  left=$((total_limit - (SECONDS - T0)))
  if [ "$left" -lt 60 ]; then
    row "agents kv bf16 / index-K $ik" "skipped: $((SECONDS - T0)) s spent"
    fail=1
    continue
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  say "== duet bench agents ${where[*]}, KV bf16, index-K $ik (at most $limit s)"
  run_tmp="$WORK/run-$ik"
  mkdir -p "$run_tmp"
  start=$SECONDS
  # TMPDIR: the cluster's run directory (pid files, logs) lands there, so a run cut short is ended
  # by pid and its logs kept.  At the limit, timeout sends SIGTERM to the whole group: the bench
  # stops its references and still reports; the workers write their exit lines.
  TMPDIR="$run_tmp" DUET_NO_BUILD=1 DUET_BUILD_DIR="$W" DUET_CACHE_DIR="$WORK/cache" \
    timeout -k 20 "$limit" "$ROOT/duet" bench agents "${where[@]}" --model "$FIX/tiny-bf16" \
      --kv-dtype bf16 --index-k-dtype "$ik" --keep-logs "$WORK/logs-$ik" --progress off --timeout "$req_timeout" \
      --json "$RES/agents-$ik.json" --plot "$RES/agents-$ik.png" --jobs "$jobs" "${load[@]}" \
      >"$WORK/bench-$ik.txt" 2>"$WORK/bench-$ik.err"
  rc=$?
  took=$((SECONDS - start))
  cat "$WORK/bench-$ik.err" "$WORK/bench-$ik.txt" >>"$LOG"
  pids="$(cat "$run_tmp"/duet-up.*/*.pid 2>/dev/null)"
  if [ -n "$pids" ]; then  # a run cut short: stop what is left of its cluster, keep its logs
    for p in $pids; do kill -TERM "$p" 2>/dev/null; done
    sleep 5
    for p in $pids; do kill -9 "$p" 2>/dev/null; done
    [ -d "$WORK/logs-$ik" ] || { mkdir -p "$WORK/logs-$ik"; cp "$run_tmp"/duet-up.*/*.log "$WORK/logs-$ik"/ 2>/dev/null; }
  fi
  [ "$rc" = 0 ] || fail=1
  row "agents kv bf16 / index-K $ik" "exit $rc in $took s"
  if [ -f "$RES/agents-$ik.json" ]; then
    python3 - "$RES/agents-$ik.json" >>"$SUM" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
r, c, l, t, w = j["requests"], j["correctness"], j["latency_s"], j["throughput"], j["workers"]
ms = lambda k: "%.1f / %.1f / %.1f" % tuple(1e3 * l[k][p] for p in ("p50", "p99", "max"))
print("  %-34s %s" % ("verdict", "CLEAN" if j["clean"] else "NOT CLEAN: " + "; ".join(j["problems"])))
print("  %-34s %.1f s; sent %d, completed %d, timed out %d, failed %d, 504 %d" % (
    "load", j["duration_s"], r["sent"], r["completed"], r["timed_out"], r["failed"], r["past_deadline_504"]))
print("  %-34s %s: %d / %d equal, %d corrupted, %d without a reference (%d run, %.1f s)" % (
    "comparison", c["mode"], c["equal"], c["compared"], c["corrupted"], c["reference_failed"],
    c["references_run"], c["reference_s"]))
print("  %-34s %d pages, %d slots leaked; router holds %s; settled %s" % (
    "workers after the load", w.get("leaked_pages", -1), w.get("leaked_slots", -1),
    w.get("router_requests", "?"), w.get("settled")))
print("  %-34s %s" % ("TTFT p50 / p99 / max ms", ms("ttft")))
print("  %-34s %s" % ("ITL p50 / p99 / max ms", ms("itl")))
print("  %-34s %s" % ("e2e p50 / p99 / max ms", ms("e2e")))
print("  %-34s %.1f tokens/s, %.2f req/s, goodput %.2f req/s" % (
    "throughput", t["output_tokens_per_s"], t["requests_per_s"], t["goodput_requests_per_s"]))
print("  %-34s first turn %.0f (mean), largest %d" % ("prompt tokens", j["prompt_tokens"]["first_turn_mean"],
                                                       j["prompt_tokens"]["max"]))
PY
  fi
  # what the workers said at start (device) and at exit (staging counters, decode rate)
  for n in prefill-0 decode-0; do
    grep -h 'device cuda\|CUDA memory\|data plane\|staging device\|shutting down\|drawn on the' "$WORK/logs-$ik/$n.log" 2>/dev/null |
      sed 's/^[^ ]* [^ ]* //' | cut -c1-260 | sed "s/^/  $n: /" >>"$SUM"
  done
done

# ---- what comes back: the JSON and PNG of each run (already in $RES), this log, the rest as one tarball
(cd "$WORK" && tar -czf "$RES/logs.tgz" --ignore-failed-read bench-*.txt bench-*.err logs-* staging-*.txt summary.txt \
  2>/dev/null)
for ik in $encodings; do
  echo
  echo "== duet bench agents, KV bf16, index-K $ik"
  cat "$WORK/bench-$ik.txt" 2>/dev/null
  grep -h 'duet-bench-agents:.*\(references\|plot\|gnuplot\)' "$WORK/bench-$ik.err" 2>/dev/null | tail -3
done
cat "$SUM" >>"$LOG"
echo
echo "== summary ($((SECONDS - T0)) s; device $DEVICE; results in $RES)"
cat "$SUM"
[ "$dry" = 1 ] && rm -rf "$WORK"
exit $fail
