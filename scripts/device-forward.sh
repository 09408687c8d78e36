#!/usr/bin/env bash
# device-forward.sh: the engine on the GPU, checked and timed, in one run on the GPU machine.
#
# Here (any machine with nvcc; no GPU needed):
#   scripts/device-forward.sh --prepare
#       meson setup build-fwd -Dgpu_archs=90 (if needed); ninja duet-check-forward duet-check-ops
#       duet-mkmodel duet-generate; scripts/make-bundle.sh; packs the four into
#       build-fwd/device-forward.tgz (about 7 MB instead of 33)
# There (on the GPU machine, with the packed binaries and the bundle, build-fwd/device-forward.tgz
# and .bundle, copied into the checkout there):
#   bash scripts/device-forward.sh
# (Copying build-fwd/tools/duet-check-forward, -ops, -mkmodel and -generate themselves works too, and
# so does build-fwd/device-agents.tgz alone, which holds the four: taken when device-forward.tgz is
# not there.)
#
# On the GPU: unpacks .bundle (as device-check.sh), regenerates the fixtures
# with duet-mkmodel the way the build does (tiny-bf16 seed 1, tiny-fp8-fp4
# seed 2; the slice fixture in the background), runs the operation checks
# (duet-check-ops, every group), then duet-check-forward:
#   - tiny-bf16, KV bf16 / index-K bf16: 20 prompts x 256 greedy tokens, GPU
#     batch vs CPU (logits nmse, first greedy difference), plus the GPU
#     batch-invariance check (alone vs batched, chunked vs single-shot);
#   - tiny-bf16 with fp8 KV and fp8 index-K; tiny-fp8-fp4 with bf16 and fp8 caches;
#   - the same four in CPU-exact mode (--exact: every logit the CPU's bits), and duet-generate
#     with DUET_CUDA_EXACT=1 against the CPU over 256 tokens;
#   - the slice fixture: prefill tokens/s at 4k, decode step time at batch 1,
#     32 and 128 with a 4k context, and prefill and decode at those batches
#     (--batches) with a 32k context, each against its roofline;
#   - with --ops-bench, duet-check-ops --bench for the matmul, MoE and weight-read groups
#     (--ops-bench-ops LIST: those groups instead, e.g. 'index_score').
# Prints one table at the end; full logs go to build-fwd/device-forward/ (where $OUT is set,
# there also summary.txt, check-ops.txt, the kernel CSVs and device-forward-files.tgz: every file).
# DUET_CUDA_BUILD names another build directory.
#
# Options: --prepare, --quick (4 prompts x 32 tokens), --no-bench, --no-ops, --ops-only LIST
# (duet-check-ops for the groups LIST names, e.g. 'exact rope'), --exact-bench (the slice's decode
# steps at batch 1 and 32, context 4096, a second time in CPU-exact mode: its cost at V4-Flash widths),
# --ops-bench, --batches LIST (default 1,32,128), --long-ctx N (default 32768; 0: none),
# --prompts N, --tokens N, --phases (the slice at 4k, batches 1 and 32, again with the
# forward call's GPU time split by phase: duet-check-forward --phases), --kernels (one decode step
# at each of the batches --kernel-batches LIST names, default 1,32, and each context --kernel-ctx LIST
# names, default 4096 (the first also the context of --stalls), under Nsight Compute: every kernel's
# duration and DRAM bytes, their sum against the step's time, each kernel's DRAM rate against the
# copy ceiling, scripts/kernel-times.py), --moe-host (time the slice a second time with
# DUET_MOE_HOST=1: the per-expert MoE path with routing on the host), --stalls SPEC[,SPEC...] (each
# SPEC REGEX:SKIP:COUNT: the launches SKIP .. SKIP+COUNT-1 of the kernels whose function name matches
# REGEX, counted over one decode step at batch 1 then one at batch 32 (4k context), under Nsight
# Compute with the throughput, occupancy, warp-state, scheduler and instruction sections; the details
# go to the summary, the per-SASS-instruction stall samples to stalls-N-sass.csv, summed by
# scripts/kernel-stalls.py into the summary too), --stalls-prefill (the --stalls launches counted over
# the slice's timed batch-invariant prefill of 4096 tokens instead: duet-check-forward
# --profile-prefill; for the 64-token tiles and the grouped experts), --stalls-name-base BASE (what
# REGEX matches: Nsight's function (the default: the name alone) or demangled (with its template
# arguments as Nsight prints them, e.g. 'gemv_wide_kernel<.*\(bool\)1>' for the grouped launches only)).
# Exit status 0 when every check passed.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/scripts/device-lib.sh"
BUILD="${DUET_CUDA_BUILD:-$ROOT/build-fwd}"   # sm_90 only: four binaries of ~6 MB travel
BIN="$BUILD/tools"
duet_device_results "$BUILD/device-forward" "kernels-slice-*.csv check-ops.txt"
TGZ="$BUILD/device-forward.tgz"
TOOLS="tools/duet-check-forward tools/duet-check-ops tools/duet-mkmodel tools/duet-generate"
FIX="${DUET_FIXTURES:-/tmp/duet-fixtures}"
prompts=20 tokens=256 bench=1 ops=1 ops_only="" exact_bench=0 moe_host=0 phases=0 kernels=0 ops_bench=0 batches=1,32,128 kernel_batches=1,32 kernel_ctx=4096 long_ctx=32768 stalls="" stalls_prefill=0 stalls_base=function ops_bench_list="matmul moe reads"

while [ $# -gt 0 ]; do
  case "$1" in
    --prepare)
      set -e
      duet_device_prepare "$BUILD" $TOOLS
      tar -czf "$TGZ" -C "$BUILD" $TOOLS
      du -sh "$TGZ" "$ROOT/.bundle"
      exit 0 ;;
    --quick) prompts=4 tokens=32 ;;
    --no-bench) bench=0 ;;
    --no-ops) ops=0 ;;
    --ops-only) ops_only="$2"; shift ;;
    --exact-bench) exact_bench=1 ;;
    --moe-host) moe_host=1 ;;
    --phases) phases=1 ;;
    --kernels) kernels=1 ;;
    --stalls) stalls="$2"; shift ;;
    --stalls-prefill) stalls_prefill=1 ;;
    --stalls-name-base) stalls_base="$2"; shift ;;
    --ops-bench) ops_bench=1 ;;
    --ops-bench-ops) ops_bench=1; ops_bench_list="$2"; shift ;;
    --batches) batches="$2"; shift ;;
    --kernel-batches) kernel_batches="$2"; shift ;;
    --kernel-ctx) kernel_ctx="$2"; shift ;;
    --long-ctx) long_ctx="$2"; shift ;;
    --prompts) prompts="$2"; shift ;;
    --tokens) tokens="$2"; shift ;;
    *) echo "usage: scripts/device-forward.sh [--prepare] [--quick] [--no-bench] [--no-ops] [--ops-only LIST] [--exact-bench] [--ops-bench] [--ops-bench-ops LIST] [--moe-host] [--phases] [--kernels] [--stalls SPECS] [--stalls-prefill] [--stalls-name-base BASE] [--batches LIST] [--kernel-batches LIST] [--kernel-ctx LIST] [--long-ctx N] [--prompts N] [--tokens N]" >&2; exit 2 ;;
  esac
  shift
done
# the slice's timings, phases, kernels and stalls all run on the slice fixture, which --no-bench skips
if [ "$bench" = 0 ] && { [ "$kernels" = 1 ] || [ -n "$stalls" ] || [ "$phases" = 1 ] || [ "$moe_host" = 1 ] || [ "$exact_bench" = 1 ]; }; then
  echo "scripts/device-forward.sh: --kernels, --stalls, --phases and --moe-host need the slice bench; drop --no-bench (--batches and --long-ctx 0 shorten it)" >&2
  exit 2
fi

mkdir -p "$RES" "$FIX"
ATGZ="$BUILD/device-agents.tgz"
if [ -f "$TGZ" ]; then # the binaries this run was given packed, over any an earlier run left
  tar -xzf "$TGZ" -C "$BUILD" || { echo "device-forward: cannot unpack $TGZ" >&2; exit 2; }
elif [ -f "$ATGZ" ]; then # or those of the agents runs' pack, which holds the same four
  tar -xzf "$ATGZ" -C "$BUILD" $TOOLS || { echo "device-forward: cannot unpack $TOOLS from $ATGZ" >&2; exit 2; }
fi
LOG="$RES/device-forward.log"
SUM="$RES/summary.txt"
: >"$LOG"
: >"$SUM"
say() { echo "$@" | tee -a "$LOG"; }

# Libraries: the bundle's where the image lacks them, cuBLAS from the image (scripts/device-lib.sh).
duet_device_runtime /tmp/duet-forward "$BIN/duet-check-forward" "$BIN/duet-mkmodel" >/tmp/duet-forward-runtime.txt 2>&1
rt=$?  # (not in a pipe: it exports)
tee -a "$LOG" </tmp/duet-forward-runtime.txt
[ "$rt" = 0 ] || { say "device-forward: the runtime is incomplete (scripts/device-forward.sh --prepare, and copy the binaries there)"; exit 2; }
say "== device"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1 | tee -a "$LOG"

# Fixtures, as tests/engine/meson.build makes them; the slice in the background.
"$BIN/duet-mkmodel" --preset tiny --seed 1 --out "$FIX/tiny-bf16" >>"$LOG" 2>&1
"$BIN/duet-mkmodel" --preset tiny --seed 2 --weights fp8 --experts fp4 --out "$FIX/tiny-fp8-fp4" >>"$LOG" 2>&1
slice_pid=""
if [ "$bench" = 1 ]; then
  ( start=$SECONDS; "$BIN/duet-mkmodel" --preset slice --out "$FIX/slice" >"$RES/mkmodel-slice.log" 2>&1;
    echo "slice fixture: exit $? in $((SECONDS - start)) s" >>"$RES/mkmodel-slice.log" ) &
  slice_pid=$!
fi

fail=0
if [ "$ops" = 1 ] && [ -x "$BIN/duet-check-ops" ]; then
  say "== operation checks"
  if [ -n "$ops_only" ]; then
    rc=0; first=1
    for op in $ops_only; do
      if [ "$first" = 1 ]; then hdr=(); first=0; else hdr=(--no-header); fi
      timeout 300 "$BIN/duet-check-ops" "${hdr[@]}" --op "$op" >>"$RES/check-ops.txt" 2>>"$LOG" || rc=$?
    done
  else
    timeout 300 "$BIN/duet-check-ops" >"$RES/check-ops.txt" 2>>"$LOG"  # about 130 s; 150 cut a slower host short
    rc=$?
  fi
  p=$(grep -c ' ok ' "$RES/check-ops.txt" || true); f=$(grep -c ' FAIL' "$RES/check-ops.txt" || true)
  echo "operation checks: $p passed, $f failed (exit $rc)" | tee -a "$LOG" "$SUM"
  grep ' FAIL' "$RES/check-ops.txt" | cut -c1-200 | tee -a "$SUM"
  [ "$rc" = 0 ] || fail=1
fi
if [ "$ops_bench" = 1 ] && [ -x "$BIN/duet-check-ops" ]; then
  say "== operation timings ($ops_bench_list)"
  for op in $ops_bench_list; do
    timeout 200 "$BIN/duet-check-ops" --bench --op "$op" >"$RES/bench-ops-$op.txt" 2>>"$LOG"
    echo "[ops bench $op] exit $?" | tee -a "$SUM"
    cat "$RES/bench-ops-$op.txt" >>"$SUM"
  done
fi

# slice_bench OUT LABEL PATTERN TIMEOUT [VAR=VALUE...] -- ARGS: one duet-check-forward run on
# the slice, its output into the log and the lines matching PATTERN into the summary
slice_bench() {
  local out="$1" label="$2" pat="$3" limit="$4"
  shift 4
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  timeout "$limit" env "${envs[@]}" "$BIN/duet-check-forward" --model "$FIX/slice" --bench "$@" \
    >"$RES/$out" 2>>"$LOG"
  local rc=$?
  cat "$RES/$out" >>"$LOG"
  { echo "[$label] exit $rc"; grep "$pat" "$RES/$out"; } | tee -a "$SUM"
  [ "$rc" = 0 ] || fail=1
}

# name, model, kv, index-k, tolerance [, more duet-check-forward options]
run_check() {
  local name="$1" model="$2" kv="$3" ik="$4" tol="$5"
  shift 5
  say "== forward $name"
  timeout 150 "$BIN/duet-check-forward" --model "$model" --prompts "$prompts" --tokens "$tokens" \
    --kv-dtype "$kv" --index-k-dtype "$ik" --tol "$tol" "$@" >"$RES/forward-$name.txt" 2>>"$LOG"
  local rc=$?
  cat "$RES/forward-$name.txt" >>"$LOG"
  { echo "[$name] exit $rc"; grep '^forward:\|^greedy:\|^bits:\|^invariance' "$RES/forward-$name.txt"; } | tee -a "$SUM"
  [ "$rc" = 0 ] || fail=1
}
run_check bf16 "$FIX/tiny-bf16" bf16 bf16 1e-4
run_check fp8kv "$FIX/tiny-bf16" fp8 fp8 1e-3
run_check fp8w-bf16kv "$FIX/tiny-fp8-fp4" bf16 bf16 1e-4
run_check fp8w-fp8kv "$FIX/tiny-fp8-fp4" fp8 fp8 1e-3
# CPU-exact mode (duet_cuda_set_exact): every logit the CPU's bits, so every prompt's greedy tokens
run_check exact-bf16 "$FIX/tiny-bf16" bf16 bf16 1e-4 --exact
run_check exact-fp8kv "$FIX/tiny-bf16" fp8 fp8 1e-3 --exact
run_check exact-fp8w-bf16kv "$FIX/tiny-fp8-fp4" bf16 bf16 1e-4 --exact
run_check exact-fp8w-fp8kv "$FIX/tiny-fp8-fp4" fp8 fp8 1e-3 --exact

# duet-generate --device cuda against the CPU: the same greedy tokens on a short prompt
if [ -x "$BIN/duet-generate" ]; then
  say "== duet-generate --device cuda"
  g_cpu="$(timeout 60 "$BIN/duet-generate" --model "$FIX/tiny-bf16" --prompt-ids 5,6,7,8,9,10,11 --max-tokens 32 2>>"$LOG")"
  g_gpu="$(timeout 60 "$BIN/duet-generate" --model "$FIX/tiny-bf16" --prompt-ids 5,6,7,8,9,10,11 --max-tokens 32 --device cuda 2>>"$LOG")"
  if [ -n "$g_cpu" ] && [ "$g_cpu" = "$g_gpu" ]; then r=same; else r=DIFFERENT; fail=1; fi
  echo "duet-generate tiny-bf16, 32 tokens: cpu and cuda outputs $r" | tee -a "$SUM"
  echo "cpu:  $g_cpu" >>"$LOG"; echo "cuda: $g_gpu" >>"$LOG"
  # the same in CPU-exact mode, 256 tokens
  g_cpu="$(timeout 60 "$BIN/duet-generate" --model "$FIX/tiny-bf16" --prompt-ids 5,6,7,8,9,10,11 --max-tokens 256 2>>"$LOG")"
  g_gpu="$(DUET_CUDA_EXACT=1 timeout 60 "$BIN/duet-generate" --model "$FIX/tiny-bf16" --prompt-ids 5,6,7,8,9,10,11 --max-tokens 256 --device cuda 2>>"$LOG")"
  if [ -n "$g_cpu" ] && [ "$g_cpu" = "$g_gpu" ]; then r=same; else r=DIFFERENT; fail=1; fi
  echo "duet-generate tiny-bf16, 256 tokens, DUET_CUDA_EXACT=1: cpu and cuda outputs $r" | tee -a "$SUM"
  echo "cpu:  $g_cpu" >>"$LOG"; echo "cuda exact: $g_gpu" >>"$LOG"
fi

if [ -n "$slice_pid" ]; then
  say "== slice timings"
  wait "$slice_pid"
  cat "$RES/mkmodel-slice.log" >>"$LOG"
  tail -1 "$RES/mkmodel-slice.log" | tee -a "$SUM"
  slice_bench bench-slice.txt "slice bench" '^ceilings\|^bench' 240 -- --ctx 4096 --batches "$batches"
  if [ "$long_ctx" -gt 0 ]; then
    slice_bench bench-slice-long.txt "slice bench, context $long_ctx" '^ceilings\|^bench' 300 -- \
      --ctx "$long_ctx" --batches "$batches"
  fi
  if [ "$exact_bench" = 1 ]; then
    slice_bench bench-slice-exact.txt "slice bench, CPU-exact mode" '^ceilings\|^bench' 400 -- \
      --ctx 4096 --batches 1,32 --decode-only --exact
  fi
  if [ "$phases" = 1 ]; then
    slice_bench bench-slice-phases.txt "slice bench by phase, with an event at each phase" '^bench\|^phases' 240 -- \
      --ctx 4096 --batches 1,32 --phases
  fi
  ncu="$(duet_ncu)"
  if [ -z "$ncu" ] && { [ "$kernels" = 1 ] || [ -n "$stalls" ]; }; then
    echo "[slice kernels, stalls] no ncu on this machine" | tee -a "$SUM"
  fi
  if [ "$kernels" = 1 ] && [ -n "$ncu" ]; then
    IFS=, read -ra kctxs <<<"$kernel_ctx"
    for kc in "${kctxs[@]}"; do
      csv="$RES/kernels-slice-ctx$kc.csv"
      timeout 300 "$ncu" --profile-from-start off --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
        --csv --print-units base \
        --print-kernel-base function --cache-control none --clock-control none \
        "$BIN/duet-check-forward" --model "$FIX/slice" --bench --decode-only --ctx "$kc" --batches "$kernel_batches" \
        >"$csv" 2>>"$LOG"
      rc=$?
      # the step times (and the copy ceiling) from the slice bench of the same context, where one ran
      bench_out="$RES/bench-slice-ctx$kc.none"
      [ "$kc" = 4096 ] && bench_out="$RES/bench-slice.txt"
      [ "$kc" = "$long_ctx" ] && [ "$kc" != 4096 ] && bench_out="$RES/bench-slice-long.txt"
      steps=""
      IFS=, read -ra kbs <<<"$kernel_batches"
      for kb in "${kbs[@]}"; do
        st="$(grep "^bench decode batch $kb at" "$bench_out" 2>/dev/null | awk '{for(i=1;i<=NF;i++) if($i=="ms/step,") print $(i-1)}' | head -1)"
        steps="${steps:+$steps,}${st:-0}"
      done
      { echo "[slice kernels, ncu, context $kc] exit $rc (step times from the slice bench: $steps ms)"
        copy="$(sed -n 's/^ceilings: copy \([0-9.]*\) GB\/s.*/\1/p' "$bench_out" 2>/dev/null | head -1)"
        python3 "$ROOT/scripts/kernel-times.py" "$csv" --labels "$kernel_batches" --step-ms "$steps" --top 30 --launches 0 \
          --copy-gbs "${copy:-0}"; } \
        | tee -a "$SUM"
      [ "$rc" = 0 ] || fail=1
    done
  fi
  if [ -n "$stalls" ] && [ -n "$ncu" ]; then
    i=0
    stalls_run=--decode-only # the last decode step's launches, or the timed prefill's
    [ "$stalls_prefill" = 1 ] && stalls_run=--profile-prefill
    IFS=, read -ra specs <<<"$stalls"
    for spec in "${specs[@]}"; do
      IFS=: read -r re skip count <<<"$spec"
      rep="$RES/stalls-$i"
      timeout 300 "$ncu" --profile-from-start off --kernel-name-base "$stalls_base" -k "regex:$re" --launch-skip "${skip:-0}" --launch-count "${count:-1}" \
        --cache-control none --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
        --section MemoryWorkloadAnalysis --section InstructionStats --section SourceCounters -f -o "$rep" \
        "$BIN/duet-check-forward" --model "$FIX/slice" --bench $stalls_run --ctx "${kernel_ctx%%,*}" --batches 1,32 \
        >>"$LOG" 2>&1
      rc=$?
      { echo "[stalls $spec] exit $rc"
        "$ncu" -i "$rep.ncu-rep" --page details --print-units base 2>&1; } | tee -a "$SUM"
      "$ncu" -i "$rep.ncu-rep" --page source --print-source sass --csv >"$rep-sass.csv" 2>>"$LOG"
      python3 "$ROOT/scripts/kernel-stalls.py" "$rep-sass.csv" 2>&1 | tee -a "$SUM"
      [ "$rc" = 0 ] || fail=1
      i=$((i + 1))
    done
  fi
  if [ "$moe_host" = 1 ]; then
    # the older MoE path (routing on the host, one launch set per expert) in the same run
    slice_bench bench-slice-moe-host.txt "slice bench, DUET_MOE_HOST=1" '^ceilings\|^bench' 240 DUET_MOE_HOST=1 -- \
      --ctx 4096 --batches 1,32
  fi
fi

echo
echo "== summary (logs: $RES)"
cat "$SUM"
exit $fail
