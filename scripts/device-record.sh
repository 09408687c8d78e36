#!/usr/bin/env bash
# device-record.sh: the GPU path's run of record in one call of the GPU machine:
# scripts/device-forward.sh (every duet-check-ops case, the forward against the CPU on the four
# paths and in CPU-exact mode, batch invariance, the slice's timings at 4k and 32k, and with
# --kernels each kernel's time and DRAM rate in a batch-32 step at 32k), then
# scripts/device-agents.sh (agents-80x4 through duet-router with duet-prefill and duet-decode
# --device cuda as two processes, index-K bf16 and fp8).
#
# Here (any machine with nvcc; no GPU needed):
#   scripts/device-record.sh --prepare
#       device-agents.sh --prepare: build-fwd/device-agents.tgz (which holds device-forward.sh's
#       four binaries too; a build-fwd/device-forward.tgz left from before is removed, as that
#       script would take it first) and .bundle, about 32 MB to carry beside the checkout
# There (with those two copied into the checkout there):
#   bash scripts/device-record.sh
#
# Each script runs under its own deadline (--forward-limit S, default 300; --agents-limit S,
# default 200: both fit one 10-minute call, the forward taking about 215 s and the two agents
# runs about 160 s on an H100), its files in a folder of its own (the two would overwrite each
# other's in one).  Where $OUT is set, $OUT gets summary.txt (the forward's summary, then the
# agents runs' summary, each under its exit status), forward.log, agents.log, the forward's
# device-forward-files.tgz and agents-files.tgz (the agents runs' JSON, plots and logs).
# Options there: --forward-limit S, --agents-limit S, --encodings "LIST" (default "bf16 fp8"),
# --no-kernels (the forward without the per-kernel profile), --forward-only, --agents-only.
# Exit status 0 when both scripts exited 0.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

usage() {
  echo "usage: scripts/device-record.sh --prepare   (here)" >&2
  echo "       scripts/device-record.sh [--forward-limit S] [--agents-limit S] [--encodings \"LIST\"] [--no-kernels] [--forward-only | --agents-only]   (there)" >&2
  exit 2
}

if [ "${1:-}" = --prepare ]; then
  [ $# -eq 1 ] || usage
  rm -f "${DUET_CUDA_BUILD:-$ROOT/build-fwd}/device-forward.tgz"
  bash "$ROOT/scripts/device-agents.sh" --prepare
  exit $?
fi

flimit=300 alimit=200 enc="bf16 fp8" kernels=1 do_fwd=1 do_agents=1
seconds() { [[ "$1" =~ ^[1-9][0-9]{0,4}$ ]] || { echo "device-record: '$1' is not a count of seconds" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
  case "$1" in
    --forward-limit) [ $# -ge 2 ] || usage; seconds "$2"; flimit="$2"; shift ;;
    --agents-limit) [ $# -ge 2 ] || usage; seconds "$2"; alimit="$2"; shift ;;
    --encodings) [ $# -ge 2 ] || usage; enc="$2"; shift ;;
    --no-kernels) kernels=0 ;;
    --forward-only) do_agents=0 ;;
    --agents-only) do_fwd=0 ;;
    *) usage ;;
  esac
  shift
done
[ "$do_fwd" = 1 ] || [ "$do_agents" = 1 ] || { echo "device-record: --forward-only and --agents-only leave nothing to run" >&2; exit 2; }

WORK="$(mktemp -d "${TMPDIR:-/tmp}/duet-record.XXXXXX")" || exit 1
FOUT="$WORK/forward" AOUT="$WORK/agents"
mkdir -p "$FOUT" "$AOUT"
SUM="$WORK/summary.txt"
: >"$SUM"
T0=$SECONDS
frc=- arc=-

if [ "$do_fwd" = 1 ]; then
  fargs=()
  [ "$kernels" = 1 ] && fargs=(--kernels --kernel-batches 32 --kernel-ctx 32768)
  echo "== device-forward.sh ${fargs[*]} (limit ${flimit} s)"
  OUT="$FOUT" timeout --kill-after=10 "$flimit" bash "$ROOT/scripts/device-forward.sh" "${fargs[@]}" \
    >"$WORK/forward.log" 2>&1
  frc=$?
  {
    echo "== forward: exit $frc$([ "$frc" = 124 ] || [ "$frc" = 137 ] && echo " (past its ${flimit} s limit)")"
    if [ -f "$FOUT/summary.txt" ]; then
      cat "$FOUT/summary.txt"
    else
      echo "(no summary; the log's last lines)"
      tail -20 "$WORK/forward.log"
    fi
  } >>"$SUM"
fi

if [ "$do_agents" = 1 ]; then
  echo "== device-agents.sh --encodings \"$enc\" (limit ${alimit} s)"
  OUT="$AOUT" timeout --kill-after=10 "$alimit" bash "$ROOT/scripts/device-agents.sh" --encodings "$enc" \
    >"$WORK/agents.log" 2>&1
  arc=$?
  {
    echo "== agents: exit $arc$([ "$arc" = 124 ] || [ "$arc" = 137 ] && echo " (past its ${alimit} s limit)")"
    if grep -q '^== summary' "$WORK/agents.log"; then
      sed -n '/^== summary/,$p' "$WORK/agents.log"
    else
      echo "(no summary; the log's last lines)"
      tail -20 "$WORK/agents.log"
    fi
  } >>"$SUM"
fi

echo "== device-record: $((SECONDS - T0)) s"
cat "$SUM"
if [ -n "${OUT:-}" ]; then
  cp "$SUM" "$OUT/summary.txt"
  [ -f "$WORK/forward.log" ] && cp "$WORK/forward.log" "$OUT/"
  [ -f "$WORK/agents.log" ] && cp "$WORK/agents.log" "$OUT/"
  for f in "$FOUT"/*-files.tgz; do
    [ -f "$f" ] && cp "$f" "$OUT/"
  done
  if [ -n "$(ls -A "$AOUT")" ]; then
    tar -czf "$OUT/agents-files.tgz" -C "$AOUT" . 2>/dev/null
  fi
fi
rm -rf "$WORK"
[ "$frc" = 0 ] || [ "$frc" = - ] || exit 1
[ "$arc" = 0 ] || [ "$arc" = - ] || exit 1
exit 0
