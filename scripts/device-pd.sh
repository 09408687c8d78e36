#!/usr/bin/env bash
# device-pd.sh: duet-prefill and duet-decode on the GPU, checked and timed, in one run on the GPU machine.
#
# Here (any machine with nvcc; no GPU needed):
#   scripts/device-pd.sh --prepare
#       meson setup build-fwd -Dgpu_archs=90 (if needed); ninja the six binaries below;
#       scripts/make-bundle.sh (UCX, NNG, protobuf-c, ... as Debian packages)
# There (on the GPU machine, with the binaries and the bundle copied into the checkout there:
#   build-fwd/prefill/duet-prefill, build-fwd/decode/duet-decode, build-fwd/tools/duet-driver,
#   build-fwd/tools/duet-generate, build-fwd/tools/duet-mkmodel, build-fwd/tools/duet-check-forward
#   and .bundle):
#   bash scripts/device-pd.sh
#   or, when those and the bundle pass the 64 MiB that is copied to the GPU machine,
#   scripts/device-agents.sh --prepare here and copy build-fwd/device-agents.tgz and .bundle
#   instead (unpacked into build-fwd there).
#
# On the GPU: unpacks .bundle and puts on the library path only the sonames the
# image lacks, regenerates the fixtures (tiny-bf16 seed 1 and tiny-fp8-fp4 seed 2 as the build does; the
# slice in the background), then:
#   - staging: duet-check-forward --staging 2000 (the workers' device<->host
#     copies for a 2000-token request, checked byte for byte, against pinned
#     cudaMemcpy measured in the same run), tiny and slice;
#   - tests/pd/pdtest.py --device cuda: `exact` (12 prompts, concurrency 1 and
#     32) with bf16/bf16 and fp8/fp8 caches, and on tiny-fp8-fp4 (fp8 weights, bf16
#     caches), then `abort-storm`: both workers on
#     the one GPU, every output equal to `duet-generate --device cuda`;
#   - pdtest `decode-rate`: 32 requests x 128 tokens on tiny and on the slice.
# Prints one table at the end; logs go to build-fwd/device-pd/ (where $OUT is set, there also
# summary.txt, the bench JSON and device-pd-files.tgz: every file).
# DUET_CUDA_BUILD names another build directory.
#
#   - pdtest `hicache`: the prefix cache on the GPU (device and host tiers, two write
#     policies), every output equal to `duet-generate --device cuda`.
#   - pdtest `gpu-stuck` and `gpu-stuck-prefill`: a decode (prefill) worker whose GPU is held
#     past the step deadline (DUET_TEST_GPU_HOLD) ends its requests and itself; the other workers
#     go on, and decode holds no page of the stuck prefill's requests.
# Options: --prepare, --no-slice, --quick (exact with 4 prompts, no abort-storm),
# --rate-only (staging and decode-rate only), --hicache-only (the hicache scenario only),
# --only LABEL,.. (those runs only, by the labels of the summary: exact-fp8, gpu-stuck-prefill,
# staging-tiny-fp8, rate-tiny, ...).
# Exit status 0 when every check passed.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/scripts/device-lib.sh"
BUILD="${DUET_CUDA_BUILD:-$ROOT/build-fwd}"
duet_device_results "$BUILD/device-pd" "pd-*.json"
FIX="${DUET_FIXTURES:-/tmp/duet-fixtures}"
BINS="prefill/duet-prefill decode/duet-decode tools/duet-driver tools/duet-generate tools/duet-mkmodel tools/duet-check-forward"
# The binaries may also travel as scripts/device-agents.sh's tarball (copied there instead of the six files).
[ -f "$BUILD/device-agents.tgz" ] && [ ! -x "$BUILD/prefill/duet-prefill" ] && tar -xzf "$BUILD/device-agents.tgz" -C "$BUILD"
slice=1 quick=0 checks=1 hicache_only=0 only=""

while [ $# -gt 0 ]; do
  case "$1" in
    --prepare)
      set -e
      duet_device_prepare "$BUILD" $BINS
      (cd "$BUILD" && du -ch $BINS) ; du -sh "$ROOT/.bundle"
      exit 0 ;;
    --no-slice) slice=0 ;;
    --quick) quick=1 ;;
    --rate-only) checks=0 ;;
    --hicache-only) hicache_only=1 slice=0 ;;
    --only) only="$2" slice=0; shift ;;
    *) echo "usage: scripts/device-pd.sh [--prepare] [--no-slice] [--quick] [--rate-only] [--hicache-only] [--only LABEL,..]" >&2; exit 2 ;;
  esac
  shift
done

mkdir -p "$RES" "$FIX"
LOG="$RES/device-pd.log"
SUM="$RES/summary.txt"
: >"$LOG"
: >"$SUM"
say() { echo "$@" | tee -a "$LOG"; }
row() { printf '%-44s %s\n' "$1" "$2" | tee -a "$SUM"; }
T0=$SECONDS

# Libraries: the bundle's where the image lacks them, cuBLAS from the image (scripts/device-lib.sh).
duet_device_runtime /tmp/duet-pd $(for b in $BINS; do echo "$BUILD/$b"; done) >/tmp/duet-pd-runtime.txt 2>&1  # exports: no pipe
rt=$?
tee -a "$LOG" </tmp/duet-pd-runtime.txt
[ "$rt" = 0 ] || { say "device-pd: the runtime is incomplete (scripts/device-pd.sh --prepare, and copy the binaries there)"; exit 2; }
say "== device"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1 | tee -a "$LOG"
nproc | sed 's/^/cpus: /' | tee -a "$LOG"

BIN="$BUILD/tools"
"$BIN/duet-mkmodel" --preset tiny --seed 1 --out "$FIX/tiny-bf16" >>"$LOG" 2>&1
"$BIN/duet-mkmodel" --preset tiny --seed 2 --weights fp8 --experts fp4 --out "$FIX/tiny-fp8-fp4" >>"$LOG" 2>&1
slice_pid=""
if [ "$slice" = 1 ]; then
  ( start=$SECONDS; "$BIN/duet-mkmodel" --preset slice --out "$FIX/slice" >"$RES/mkmodel-slice.log" 2>&1;
    echo "slice fixture: exit $? in $((SECONDS - start)) s" >>"$RES/mkmodel-slice.log" ) &
  slice_pid=$!
fi

fail=0
export PYTHONUNBUFFERED=1 UCX_TLS="${UCX_TLS:-tcp,self}"

# staging copies: name, model, kv, index-k
staging() {
  local name="$1" model="$2" kv="$3" ik="$4" out="$RES/staging-$1.txt"
  case ",${only:-staging-$name}," in *",staging-$name,"*) ;; *) return ;; esac
  say "== staging $name"
  timeout 120 "$BIN/duet-check-forward" --model "$model" --staging 2000 --kv-dtype "$kv" --index-k-dtype "$ik" \
    >"$out" 2>>"$LOG"
  local rc=$?
  cat "$out" >>"$LOG"
  [ "$rc" = 0 ] || fail=1
  row "staging $name: exit $rc" "$(grep '^staging [0-9]' "$out" | sed 's/^staging //')"
  row "  pinned cudaMemcpy" "$(grep '^staging ceilings' "$out" | sed 's/^staging ceilings: pinned cudaMemcpy //')"
  grep '^staging device\|^staging host' "$out" | sed 's/^staging //' | while read -r l; do row "  ${l%%:*}" "${l#*: }"; done
}

# pdtest: label, time limit, model, scenario and its options
pd() {
  local label="$1" limit="$2" model="$3"; shift 3
  local out="$RES/pd-$label.txt"
  case ",${only:-$label}," in *",$label,"*) ;; *) return ;; esac
  if [ $((SECONDS - T0 + limit)) -gt 470 ]; then
    row "pd $label" "skipped: $((SECONDS - T0)) s spent, it may take $limit s"
    return
  fi
  say "== pdtest $label: $*"
  DUET_TEST_KEEP=1 timeout -s INT -k 20 "$limit" python3 "$ROOT/tests/pd/pdtest.py" --build "$BUILD" --model "$model" --device cuda "$@" >"$out" 2>&1
  local rc=$?
  cat "$out" >>"$LOG"
  local dirs
  dirs="$(grep -o '/tmp/duet-pd-[A-Za-z0-9_]*' "$out" | sort -u)"
  for d in $dirs; do  # what the workers said about their device and data plane
    grep -h 'device cuda\|CUDA memory\|serving on' "$d"/p0.log "$d"/d0.log 2>/dev/null | head -6 | cut -c1-240 \
      >>"$RES/workers-$label.txt"
  done
  # workers of a run cut short by its limit: end them by id (their command lines name the cluster's directory)
  for d in $dirs; do
    for p in $(grep -l -- "$d" /proc/[0-9]*/cmdline 2>/dev/null | cut -d/ -f3); do kill -9 "$p" 2>/dev/null; done
  done
  if [ "$rc" != 0 ]; then
    fail=1
    # keep the workers' logs of the failing clusters
    [ -n "$dirs" ] && tar -czf "$RES/logs-$label.tgz" -C /tmp $(for d in $dirs; do basename "$d"; done) 2>/dev/null
  fi
  row "pd $label: exit $rc" "$(tail -1 "$out")"
  grep '^ok\|^FAIL\|decode rate:\|: staging \|tokens/s of step time' "$out" | sed 's/^ */    /' | cut -c1-180 |
    tee -a "$SUM"
}

n=12; [ "$quick" = 1 ] && n=4
if [ "$hicache_only" = 1 ]; then
  pd hicache 200 "$FIX/tiny-bf16" hicache --kv bf16 --ik bf16
else
  staging tiny-fp8 "$FIX/tiny-bf16" fp8 fp8
  if [ "$checks" = 1 ]; then
    pd exact-bf16 150 "$FIX/tiny-bf16" exact --kv bf16 --ik bf16 --n "$n" --concurrency 1,32
    pd exact-fp8 150 "$FIX/tiny-bf16" exact --kv fp8 --ik fp8 --n "$n" --concurrency 1,32
    # fp8 weights: prefill's projections from 128 tokens on take the 64-token tiles
    pd exact-fp8w 150 "$FIX/tiny-fp8-fp4" exact --kv bf16 --ik bf16 --n "$n" --concurrency 1,32
    [ "$quick" = 1 ] || pd abort-storm 150 "$FIX/tiny-bf16" abort-storm --kv fp8 --ik fp8
    [ "$quick" = 1 ] || pd hicache 150 "$FIX/tiny-bf16" hicache --kv fp8 --ik fp8
    [ "$quick" = 1 ] || pd gpu-stuck 120 "$FIX/tiny-bf16" gpu-stuck --kv fp8 --ik fp8
    [ "$quick" = 1 ] || pd gpu-stuck-prefill 120 "$FIX/tiny-bf16" gpu-stuck-prefill --kv fp8 --ik fp8
  fi
  pd rate-tiny 90 "$FIX/tiny-bf16" decode-rate --kv fp8 --ik fp8 --rate-requests 32 --rate-prompt 128 --rate-tokens 128
fi

if [ -n "$slice_pid" ]; then
  wait "$slice_pid"
  cat "$RES/mkmodel-slice.log" >>"$LOG"
  row "slice fixture" "$(tail -1 "$RES/mkmodel-slice.log")"
  if [ $((SECONDS - T0)) -lt 360 ]; then
    staging slice-bf16 "$FIX/slice" bf16 bf16
    pd rate-slice 110 "$FIX/slice" decode-rate --kv bf16 --ik bf16 --rate-requests 32 --rate-prompt 512 --rate-tokens 128
  else
    row "slice runs" "skipped: $((SECONDS - T0)) s spent already"
  fi
fi

echo
echo "== what the workers logged at start (first run)"
cat "$(ls "$RES"/workers-*.txt 2>/dev/null | head -1)" 2>/dev/null | sed 's/^[^ ]* //'
echo
echo "== summary ($((SECONDS - T0)) s; logs: $RES)"
cat "$SUM"
exit $fail
