#!/usr/bin/env bash
# device-multi.sh: the checks of a node with several GPUs, in one run on the GPU machine (docs/CUDA.md,
# "Tensor parallelism"; docs/DATAPLANE.md, "Device memory"):
#
#   machine  nvidia-smi, the GPUs' topology (nvidia-smi topo -m), which NCCL and UCX
#   tp       tensor parallelism is exact: duet-generate --device cuda --tp 2 against --tp 1 on
#            the tiny fixture, prompts' logits (--dump-logits) compared byte for byte and
#            greedy tokens compared, for bf16 and fp8 caches; duet-check-forward --tp 2 (the
#            group against the CPU engine within the stated tolerance, batch invariance bit
#            for bit)
#   xfer     duet-bench-xfer --gpu 0,1: page transfers from a pool on GPU 0 to a pool on GPU 1,
#            straight between device memory (when UCX has CUDA) and through pinned staging,
#            beside the GPU-to-GPU copy and pinned host<->device copy measured in the same run
#   pd       PD across groups of different sizes, exact against duet-generate --device cuda
#            (one GPU): a short `duet bench agents` with prefill TP 2 on GPUs 0,1 and decode on
#            GPU 1, then prefill on GPU 0 and decode TP 2 on GPUs 0,1
#
# Here:   scripts/device-agents.sh --prepare   (the same tarball: build-fwd/device-agents.tgz)
# There (a machine with two H200s of one host, with build-fwd/device-agents.tgz and .bundle
# copied into the checkout there):
#   bash scripts/device-multi.sh
# With UCX built with CUDA (scripts/make-ucx-cuda.sh, in .bundle) the workers of the pd step send
# GPU to GPU when run as  UCX_TLS=tcp,self,cuda_copy,cuda_ipc UCX_PROTO_ENABLE=y bash scripts/device-multi.sh
# Options: --steps "machine tp xfer pd" (default all), --tp N (default 2); environment TP_ENCODINGS
# ("bf16 fp8"), TP_LENS (prompt lengths), PD_CONFIGS ("0,1/1 0/0,1": prefill GPUs/decode GPUs).
# Logs in build-fwd/device-multi (where $OUT is set, there also the bench JSON and
# device-multi-files.tgz); the summary is printed last.  Exit 0 when
# every check passed.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/scripts/device-lib.sh"
BUILD="${DUET_CUDA_BUILD:-$ROOT/build-fwd}"
TGZ="$BUILD/device-agents.tgz"
steps="machine tp xfer pd" TP=2
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="$2"; shift ;;
    --tp) TP="$2"; shift ;;
    *) echo "usage: scripts/device-multi.sh [--steps \"machine tp xfer pd\"] [--tp N]" >&2; exit 2 ;;
  esac
  shift
done
WORK=/tmp/duet-multi
duet_device_results "$BUILD/device-multi" "*.json"
mkdir -p "$RES" "$WORK"
LOG="$RES/device-multi.log"
SUM="$WORK/summary.txt"
: >"$LOG"
: >"$SUM"
say() { echo "$@" | tee -a "$LOG"; }
row() { printf '%-44s %s\n' "$1" "$2" | tee -a "$SUM" >>"$LOG"; }
has() { case " $steps " in *" $1 "*) return 0 ;; esac; return 1; }
fail=0
T0=$SECONDS

W="$WORK/build"
mkdir -p "$W"
[ -f "$TGZ" ] || { say "device-multi: $TGZ is missing: run scripts/device-agents.sh --prepare and copy it there"; exit 2; }
tar -xzf "$TGZ" -C "$W" || { say "device-multi: cannot unpack $TGZ"; exit 2; }
BINS="prefill/duet-prefill decode/duet-decode router/duet-router tools/duet-bench-agents tools/duet-generate
      tools/duet-driver tools/duet-mkmodel tools/duet-check-forward tools/duet-bench-xfer"
duet_device_runtime "$WORK" $(for b in $BINS; do echo "$W/$b"; done) >"$WORK/runtime.txt" 2>&1  # exports: no pipe
rt=$?
tee -a "$LOG" <"$WORK/runtime.txt"
[ "$rt" = 0 ] || { say "device-multi: the runtime is incomplete"; exit 2; }
NGPU="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')"
FIX="$WORK/fixtures"
mkdir -p "$FIX"
"$W/tools/duet-mkmodel" --preset tiny --seed 1 --out "$FIX/tiny-bf16" >>"$LOG" 2>&1 || { say "duet-mkmodel failed"; exit 2; }

# ---- machine
if has machine; then
  say "== machine"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv 2>&1 | tee -a "$LOG"
  nvidia-smi topo -m 2>&1 | tee -a "$LOG"
  row "GPUs" "$NGPU; cpus $(nproc)"
  row "UCX" "$(ucx_info -v 2>/dev/null | head -2 | tr '\n' ' ' | cut -c1-120)"
  row "UCX CUDA transports" "$(ucx_info -d 2>/dev/null | awk '/Transport: cuda/ {print $3}' | sort -u | tr '\n' ' ')"
fi
[ "$NGPU" -ge "$TP" ] || { row "device-multi" "needs $TP GPUs, $NGPU present"; cat "$SUM"; exit 2; }

# ---- tp: a group's output is one GPU's, bit for bit
if has tp; then
  say "== tensor parallelism: --tp $TP against --tp 1"
  lens="${TP_LENS:-5 37 140 300 700 1100}"
  for enc in ${TP_ENCODINGS:-bf16 fp8}; do
    same_logits=0 same_tokens=0 n=0 nl=0
    for len in $lens; do
      n=$((n + 1))
      ids="$(python3 -c "import random; r=random.Random($len); print(','.join(str(r.randrange(100, 120000)) for _ in range($len)))")"
      for t in 1 "$TP"; do
        [ "$len" -le 300 ] &&  # every prompt row's logits: 300 x 129280 floats at most
          "$W/tools/duet-generate" --model "$FIX/tiny-bf16" --device cuda --tp "$t" --kv-dtype "$enc" \
            --index-k-dtype "$enc" --prompt-ids "$ids" --dump-logits "$WORK/logits-$enc-$len-$t.bin" >>"$LOG" 2>&1
        timeout 300 "$W/tools/duet-generate" --model "$FIX/tiny-bf16" --device cuda --tp "$t" --kv-dtype "$enc" \
          --index-k-dtype "$enc" --prompt-ids "$ids" --max-tokens 96 >"$WORK/tokens-$enc-$len-$t.txt" 2>>"$LOG"
      done
      if [ "$len" -le 300 ]; then
        nl=$((nl + 1))
        cmp -s "$WORK/logits-$enc-$len-1.bin" "$WORK/logits-$enc-$len-$TP.bin" && [ -s "$WORK/logits-$enc-$len-1.bin" ] &&
          same_logits=$((same_logits + 1))
        rm -f "$WORK/logits-$enc-$len-"*.bin
      fi
      cmp -s "$WORK/tokens-$enc-$len-1.txt" "$WORK/tokens-$enc-$len-$TP.txt" && [ -s "$WORK/tokens-$enc-$len-1.txt" ] &&
        same_tokens=$((same_tokens + 1))
    done
    row "tp $TP vs 1, $enc caches: prompt logits" "$same_logits / $nl byte-identical"
    row "tp $TP vs 1, $enc caches: 96 greedy tokens" "$same_tokens / $n identical"
    [ "$same_logits" = "$nl" ] && [ "$same_tokens" = "$n" ] || fail=1
  done
  out="$WORK/check-forward-tp.txt"
  timeout 400 "$W/tools/duet-check-forward" --model "$FIX/tiny-bf16" --tp "$TP" --prompts 8 --tokens 64 >"$out" 2>>"$LOG"
  rc=$?
  cat "$out" >>"$LOG"
  row "check-forward --tp $TP (vs CPU, invariance)" "exit $rc: $(grep '^forward:\|^invariance:' "$out" | tr '\n' ' ' | cut -c1-240)"
  [ "$rc" = 0 ] || fail=1
fi

# ---- xfer: GPU 0 -> GPU 1
if has xfer; then
  say "== duet-bench-xfer --gpu 0,1"
  out="$WORK/xfer.txt"
  timeout 150 "$W/tools/duet-bench-xfer" --gpu 0,1 --no-perftest --staging-path am >"$out" 2>>"$LOG"
  rc=$?
  cat "$out" | tee -a "$LOG"
  row "bench xfer --gpu 0,1" "exit $rc"
  [ "$rc" = 0 ] || fail=1
fi

# ---- pd: groups of different sizes, exact against one GPU
if has pd; then
  for cfg in ${PD_CONFIGS:-0,1/1 0/0,1}; do  # prefill GPUs/decode GPUs
    set -- ${cfg/\// }
    name="prefill $1 / decode $2"
    say "== duet bench agents, $name"
    run_tmp="$WORK/pd-${1//,/}-${2//,/}"  # no commas: the router's worker lists are comma-separated
    mkdir -p "$run_tmp"
    start=$SECONDS
    TMPDIR="$run_tmp" DUET_NO_BUILD=1 DUET_BUILD_DIR="$W" DUET_CACHE_DIR="$WORK/cache" \
      timeout -k 20 200 "$ROOT/duet" bench agents --prefill-gpus "$1" --decode-gpus "$2" --model "$FIX/tiny-bf16" \
        --kv-dtype bf16 --index-k-dtype bf16 --keep-logs "$run_tmp/logs" --progress off --timeout 60 \
        --json "$RES/pd-${1//,/}-${2//,/}.json" --jobs 8 --concurrency 16 --sessions 16 --turns 2 --max-tokens 32 \
        >"$run_tmp/bench.txt" 2>"$run_tmp/bench.err"
    rc=$?
    cat "$run_tmp/bench.err" "$run_tmp/bench.txt" >>"$LOG"
    pids="$(cat "$run_tmp"/duet-up.*/*.pid 2>/dev/null)"
    for p in $pids; do kill -9 "$p" 2>/dev/null; done
    verdict="$(python3 -c "import json,sys; j=json.load(open(sys.argv[1])); c=j['correctness']; print(('CLEAN' if j['clean'] else 'NOT CLEAN: '+'; '.join(j['problems']))+', %d/%d equal, %d corrupted' % (c['equal'], c['compared'], c['corrupted']))" "$RES/pd-${1//,/}-${2//,/}.json" 2>/dev/null)"
    row "pd $name" "exit $rc in $((SECONDS - start)) s: ${verdict:-no result}"
    for n in prefill-0 decode-0; do
      grep -h 'device cuda\|CUDA memory\|data plane\|tensor-parallel\|broken' "$run_tmp/logs/$n.log" 2>/dev/null | sed 's/^[^ ]* [^ ]* //' |
        cut -c1-220 | head -3 | sed "s/^/  $n: /" >>"$SUM"
    done
    [ "$rc" = 0 ] || fail=1
  done
fi

(cd "$WORK" && tar -czf "$RES/multi-logs.tgz" --ignore-failed-read *.txt pd-*/logs 2>/dev/null)
cat "$SUM" >>"$LOG"
echo
echo "== summary ($((SECONDS - T0)) s)"
cat "$SUM"
exit $fail
