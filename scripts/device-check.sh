#!/usr/bin/env bash
# device-check.sh: check and time every CUDA operation on a GPU machine, in one run.
#
# Here (any machine with nvcc and the CUDA libraries; no GPU needed):
#   scripts/device-check.sh --prepare
#       meson setup build-cuda -Dcuda=enabled -Dtests=false; ninja duet-check-ops;
#       scripts/make-bundle.sh (the runtime libraries the GPU image lacks, into .bundle/)
# On the GPU machine, with build-cuda and .bundle copied into the checkout there (both
# folders are git-ignored, so they must be copied along with the tree):
#   bash scripts/device-check.sh
# (only build-cuda/tools/duet-check-ops is read there: copy that path alone if the
# tree and build-cuda together approach the 64 MiB that is copied to the GPU machine)
#
# On the GPU it sets up the runtime (scripts/device-lib.sh: duet_device_runtime), checks
# that the copied binary loads and holds sm_90a code, measures the ceilings
# once (device copy, bf16 and fp8 GEMMs, fp32 FMA, pinned host copies), then
# runs duet-check-ops once per operation (a crash or hang in one cannot hide the
# others) with --bench: each case is checked against the CPU reference, then
# timed.  The full table goes to build-cuda/device-check/check-ops.txt (where $OUT,
# the folder whose contents come back from the GPU machine, is set: copied there,
# with device-check-files.tgz); stdout ends with a compact table and the summary.
#
# Options: --check-only (no timings), --op NAME (one operation), --seed N (other inputs), --prepare.
# Exit status: 0 every case passed, 1 otherwise.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/scripts/device-lib.sh"
BUILD="${DUET_CUDA_BUILD:-$ROOT/build-cuda}"
BIN="$BUILD/tools/duet-check-ops"
duet_device_results "$BUILD/device-check" "check-ops.txt"
PER_OP_TIMEOUT="${DUET_CHECK_TIMEOUT:-150}"
BUDGET="${DUET_CHECK_BUDGET:-420}"  # seconds for the whole run (a run on the GPU machine may take at most 480)

bench=1
only=""
seed=()
while [ $# -gt 0 ]; do
  case "$1" in
    --prepare)
      set -e
      [ -f "$BUILD/build.ninja" ] || meson setup "$BUILD" "$ROOT" -Dcuda=enabled -Dtests=false
      ninja -C "$BUILD" tools/duet-check-ops
      "$ROOT/scripts/make-bundle.sh"
      echo "device-check: ready to copy to the GPU machine: $(du -sh "$BUILD" | cut -f1) build-cuda, $(du -sh "$ROOT/.bundle" | cut -f1) .bundle (limit 64 MiB with the tree)"
      exit 0 ;;
    --check-only) bench=0 ;;
    --op) only="$2"; shift ;;
    --seed) seed=(--seed "$2"); shift ;;
    *) echo "usage: scripts/device-check.sh [--prepare] [--check-only] [--op NAME] [--seed N]" >&2; exit 2 ;;
  esac
  shift
done

mkdir -p "$RES"
LOG="$RES/device-check.log"
TABLE="$RES/check-ops.txt"
: >"$LOG"
: >"$TABLE"
say() { echo "$@" | tee -a "$LOG"; }

[ -x "$BIN" ] || { say "device-check: $BIN is missing: run scripts/device-check.sh --prepare here and copy build-cuda there"; exit 2; }

# Libraries: the bundle's where the image lacks them, cuBLAS from the image (scripts/device-lib.sh).
duet_device_runtime /tmp/duet-check "$BIN" >/tmp/duet-check-runtime.txt 2>&1  # not in a pipe: it exports
rt=$?
tee -a "$LOG" </tmp/duet-check-runtime.txt
[ "$rt" = 0 ] || { say "device-check: the runtime is incomplete"; exit 2; }

say "== device"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv 2>&1 | tee -a "$LOG"
say "== binary"
if command -v cuobjdump >/dev/null; then
  say "embedded GPU code: $(cuobjdump --list-elf "$BIN" 2>/dev/null | grep -o 'sm_[0-9]*a\?' | sort | uniq -c | tr '\n' ' ')"
fi

ops="$("$BIN" --list)"
[ -n "$only" ] && ops="$only"
mode=()
if [ "$bench" = 1 ]; then
  say "== ceilings"
  if ! "$BIN" --ceilings-out "$RES/ceilings.txt" "${seed[@]}" 2>>"$LOG" | tee -a "$LOG" "$TABLE"; then
    say "device-check: measuring the ceilings failed"; exit 2
  fi
  mode=(--bench --ceilings-in "$RES/ceilings.txt")
else
  "$BIN" --info "${seed[@]}" 2>>"$LOG" | tee -a "$LOG" "$TABLE"
fi
"$BIN" --print-header "${mode[@]:0:1}" >>"$TABLE"

crashed=()
for op in $ops; do
  if [ $SECONDS -ge "$BUDGET" ]; then
    crashed+=("$op(skipped: budget)"); echo "$op  -- SKIPPED: ${BUDGET}s budget spent" >>"$TABLE"; continue
  fi
  start=$SECONDS
  timeout "$PER_OP_TIMEOUT" "$BIN" --op "$op" "${mode[@]}" "${seed[@]}" --no-header >>"$TABLE" 2>>"$LOG"
  rc=$?
  last="$(tail -1 "$LOG")"
  echo "op $op: exit $rc in $((SECONDS - start)) s" >>"$LOG"
  case $rc in
    0|1) ;;
    124|137) crashed+=("$op(timeout)"); echo "$op  -- TIMED OUT after ${PER_OP_TIMEOUT}s" >>"$TABLE" ;;
    *) crashed+=("$op(exit $rc)"); echo "$op  -- ERROR exit $rc: $last" >>"$TABLE" ;;
  esac
done

pass=$(grep -c ' ok ' "$TABLE" || true)
fail=$(grep -c ' FAIL' "$TABLE" || true)
echo
echo "== compact table (full: $TABLE)"
# op, shape, error, result, then time_us, copy%, roof% and bound when timed
if [ "$bench" = 1 ]; then
  grep -v '^ceilings\|^device' "$TABLE" | cut --output-delimiter=' ' -c1-44,52-60,71-74,78-86,97-102,113-124
else
  grep -v '^device' "$TABLE" | cut --output-delimiter=' ' -c1-44,52-60,71-74
fi
echo
grep '^device\|^ceilings' "$TABLE" | cut -c1-400
if [ "$fail" -gt 0 ]; then
  echo "== failures"
  grep ' FAIL' "$TABLE" | cut -c1-300
fi
echo "device-check: $pass passed, $fail failed${crashed[*]:+, crashed: ${crashed[*]}}"
[ "$fail" -eq 0 ] && [ ${#crashed[@]} -eq 0 ]
