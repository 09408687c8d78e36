#!/usr/bin/env bash
# device-variants.sh: kernel variants side by side on one GPU, in one run on the GPU machine.
#
# Two GPU machines used one after the other differ by a few per cent in the same timing, so a
# change is judged against its base in the same run.  A variant is a git revision ("." is the
# working tree) and optional extra nvcc arguments (macros the kernels read).
#
# Here (any machine with nvcc; no GPU needed):
#   scripts/device-variants.sh --prepare NAME=REV[:NVCC_ARG,...] ...
#       e.g. --prepare base=HEAD new=.      or      --prepare a=. b=.:-DSOME_MACRO=3
#       builds duet-check-ops and duet-check-forward of each variant for sm_90 (a build
#       directory each under build-var/build; revisions other than "." exported with git
#       archive under build-var/src) and puts them, stripped, in
#       build-var/bin/NAME, with duet-mkmodel, packed as build-var/variants.tgz (about 4 MB a
#       variant), and the runtime bundle (scripts/make-bundle.sh).
#   A variant NAME=+OTHER:VAR=VALUE[,VAR=VALUE...] runs the binaries of variant OTHER (named
#       before it) with those environment variables set, e.g. a=. b=+a:DUET_CUDA_SIDE=0 (nothing
#       built twice).
#   --prepare --ops-only NAME=REV ...: duet-check-ops alone a variant (half the bytes to carry, so
#       twice the variants a call); the run there then has no slice rows.
# There (on the GPU machine, with build-var/variants.tgz and .bundle copied into the checkout there):
#   bash scripts/device-variants.sh
#
# On the GPU, for each variant: duet-check-ops (every case; a variant with a failing case is
# reported and not timed), duet-check-ops --bench for the matmul and moe groups, then the
# slice fixture's decode step (duet-check-forward --bench --decode-only), the variants
# interleaved and repeated (A B A B) so that drift shows.  Prints one table, a row per case
# and a column per variant (microseconds; the slice rows in ms a step); logs in
# build-var/results (where $OUT is set, there also summary.txt and results-files.tgz).
#
# Options there: --cases SUBSTR (only the matmul cases whose shape contains SUBSTR),
# --batches LIST (default 1,32), --ctx N (default 4096), --reps N (default 2), --no-slice,
# --ops "GROUPS" (the duet-check-ops groups timed; default "matmul moe", "" for none), --prefill
# (the slice's prefill of --ctx tokens too, both matmul modes, rows in ms a call), --checks
# "GROUPS" (only these duet-check-ops groups checked before timing, for a short run whose
# change touches no other operation; default every case), --ncu SHAPE (the first variant's first
# launch of the kernels --ncu-kernel REGEX names (default every kernel) in the matmul case whose
# shape contains SHAPE, under Nsight Compute with every section and cold caches: its details
# page in ncu-details-NAME.txt, where its warps wait in ncu-stalls-NAME.txt (kernel-stalls.py),
# the lines that say most in the summary; --ncu-op GROUP for a case of another group,
# --ncu-variants "NAME ..." for those variants instead of the first, each its own files).
# Exit status 0 when every variant passed its checks.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/scripts/device-lib.sh"
VAR="$ROOT/build-var"
duet_device_results "$VAR/results"
FIX="${DUET_FIXTURES:-/tmp/duet-fixtures}"
cases="" batches=1,32 ctx=4096 reps=2 slice=1 ops="matmul moe" prefill=0 checks="" ncu_case="" ncu_kernel="" ncu_op=matmul ncu_variants=""

usage() {
  echo "usage: scripts/device-variants.sh --prepare [--ops-only] NAME=REV[:NVCC_ARG,...] ...   (here)" >&2
  echo "       scripts/device-variants.sh [--cases SUBSTR] [--batches LIST] [--ctx N] [--reps N] [--no-slice] [--ops GROUPS] [--checks GROUPS] [--prefill] [--ncu SHAPE [--ncu-kernel REGEX] [--ncu-op GROUP] [--ncu-variants "NAME ..."]]   (there)" >&2
  exit 2
}

prepare() {
  local ops_only=0
  if [ "${1:-}" = --ops-only ]; then
    ops_only=1
    shift
  fi
  [ $# -gt 0 ] || usage
  set -e
  rm -rf "$VAR/bin"
  mkdir -p "$VAR/bin" "$VAR/src" "$VAR/build"
  local spec name rest rev args src b what
  for spec in "$@"; do
    name="${spec%%=*}"
    rest="${spec#*=}"
    [ "$name" != "$spec" ] && [[ "$name" =~ ^[A-Za-z0-9_-]+$ ]] || { echo "device-variants: bad variant '$spec' (NAME=REV[:ARGS])" >&2; exit 2; }
    if [ "${rest#+}" != "$rest" ]; then # another variant's binaries, with environment variables
      local other="${rest#+}" envs=""
      envs="${other#*:}"
      other="${other%%:*}"
      [ -x "$VAR/bin/$other/duet-check-ops" ] && [ "$envs" != "${rest#+}" ] ||
        { echo "device-variants: '$spec': no variant '$other' built before it, or no VAR=VALUE" >&2; exit 2; }
      mkdir -p "$VAR/bin/$name"
      echo "$other" >"$VAR/bin/$name/same"
      echo "$envs" | tr ',' '\n' >"$VAR/bin/$name/env"
      echo "$(cat "$VAR/bin/$other/what") with $envs" >"$VAR/bin/$name/what"
      continue
    fi
    rev="${rest%%:*}"
    args=""
    [ "$rest" = "$rev" ] || args="${rest#*:}"
    if [ "$rev" = . ]; then
      src="$ROOT"
    else
      src="$VAR/src/$name"
      rm -rf "$src"
      mkdir -p "$src"
      git -C "$ROOT" archive "$rev" | tar -x -C "$src"
    fi
    b="$VAR/build/$name"
    if [ -f "$b/build.ninja" ] && [ "$(cat "$b/.duet-variant" 2>/dev/null)" != "$rev:$args" ]; then
      rm -rf "$b" # another revision or other arguments: set up afresh
    fi
    if [ ! -f "$b/build.ninja" ]; then
      if [ -n "$args" ]; then
        meson setup "$b" "$src" -Dcuda=enabled -Dtests=false -Dgpu_archs=90 "-Dnvcc_args=$args"
      else
        meson setup "$b" "$src" -Dcuda=enabled -Dtests=false -Dgpu_archs=90
      fi
      echo "$rev:$args" >"$b/.duet-variant"
    fi
    mkdir -p "$VAR/bin/$name"
    if [ "$ops_only" = 1 ]; then
      ninja -C "$b" tools/duet-check-ops
    else
      ninja -C "$b" tools/duet-check-ops tools/duet-check-forward
      strip -o "$VAR/bin/$name/duet-check-forward" "$b/tools/duet-check-forward"
    fi
    strip -o "$VAR/bin/$name/duet-check-ops" "$b/tools/duet-check-ops"
    if [ "$rev" = . ]; then
      what="the working tree at $(git -C "$ROOT" rev-parse --short HEAD)"
      git -C "$ROOT" diff --quiet HEAD -- || what="$what with changes"
    else
      what="$rev ($(git -C "$ROOT" rev-parse --short "$rev"))"
    fi
    echo "$what${args:+, nvcc $args}" >"$VAR/bin/$name/what"
  done
  duet_device_prepare "$ROOT/build-fwd" tools/duet-mkmodel
  cp "$ROOT/build-fwd/tools/duet-mkmodel" "$VAR/bin/duet-mkmodel"
  tar -czf "$VAR/variants.tgz" -C "$VAR" bin
  du -sh "$VAR/variants.tgz" "$ROOT/.bundle"
  exit 0
}

while [ $# -gt 0 ]; do
  case "$1" in
    --prepare) shift; prepare "$@" ;;
    --cases) cases="$2"; shift ;;
    --batches) batches="$2"; shift ;;
    --ctx) ctx="$2"; shift ;;
    --reps) reps="$2"; shift ;;
    --no-slice) slice=0 ;;
    --prefill) prefill=1 ;;
    --ops) ops="$2"; shift ;;
    --checks) checks="$2"; shift ;;
    --ncu) ncu_case="$2"; shift ;;
    --ncu-kernel) ncu_kernel="$2"; shift ;;
    --ncu-op) ncu_op="$2"; shift ;;
    --ncu-variants) ncu_variants="$2"; shift ;;
    *) usage ;;
  esac
  shift
done

if [ -f "$VAR/variants.tgz" ]; then # what this run was given, not what an earlier run left
  rm -rf "$VAR/bin"
  tar -xzf "$VAR/variants.tgz" -C "$VAR" || exit 2
fi
names=()
for d in "$VAR"/bin/*/; do
  { [ -x "$d/duet-check-ops" ] || [ -f "$d/same" ]; } && names+=("$(basename "$d")")
done
# a variant's binaries (another's, for a NAME=+OTHER variant) and its environment (VAR=VALUE lines)
vbin() { if [ -f "$VAR/bin/$1/same" ]; then echo "$VAR/bin/$(cat "$VAR/bin/$1/same")"; else echo "$VAR/bin/$1"; fi; }
venv() { cat "$VAR/bin/$1/env" 2>/dev/null; }
[ ${#names[@]} -gt 0 ] || { echo "device-variants: no variants in $VAR/bin (--prepare here, and copy build-var/bin there)" >&2; exit 2; }
mkdir -p "$RES" "$FIX"
LOG="$RES/device-variants.log"
: >"$LOG"

duet_device_runtime /tmp/duet-variants "$(vbin "${names[0]}")/duet-check-ops" "$VAR/bin/duet-mkmodel" >>"$LOG" 2>&1 || {
  echo "device-variants: the runtime is incomplete (see $LOG)" >&2
  exit 2
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1 | tee -a "$LOG"

# variants prepared with --ops-only have no duet-check-forward: no slice rows for any (the table
# compares like with like)
if [ "$slice" = 1 ]; then
  for v in "${names[@]}"; do
    if [ ! -x "$(vbin "$v")/duet-check-forward" ]; then
      echo "variant $v has no duet-check-forward (prepared with --ops-only): no slice rows" | tee -a "$LOG"
      slice=0
    fi
  done
fi
slice_pid=""
if [ "$slice" = 1 ]; then
  ( "$VAR/bin/duet-mkmodel" --preset slice --out "$FIX/slice" >"$RES/mkmodel-slice.log" 2>&1 ) &
  slice_pid=$!
fi

# whether variant binary folder $1 has check group $2 (a variant built from an older revision
# may lack a group that the others have)
has_group() { "$1/duet-check-ops" --list 2>/dev/null | grep -qx "$2"; }

rc=0
ok=()
for v in "${names[@]}"; do
  bin="$(vbin "$v")"
  echo "== $v: $(cat "$VAR/bin/$v/what" 2>/dev/null)" | tee -a "$LOG"
  if [ -z "$checks" ]; then
    timeout 300 env $(venv "$v") "$bin/duet-check-ops" >"$RES/check-$v.txt" 2>>"$LOG"
    r=$?
  else
    : >"$RES/check-$v.txt"
    r=0 ran=0
    for g in $checks; do
      has_group "$bin" "$g" || { echo "$v: no '$g' group in this build, skipped" | tee -a "$LOG"; continue; }
      ran=$((ran + 1))
      timeout 300 env $(venv "$v") "$bin/duet-check-ops" --op "$g" >>"$RES/check-$v.txt" 2>>"$LOG" || r=$?
    done
  fi
  p=$(grep -c ' ok ' "$RES/check-$v.txt" || true)
  f=$(grep -c ' FAIL' "$RES/check-$v.txt" || true)
  # nothing checked: a group named no case (unless the build has none of the groups named)
  if [ "$p" = 0 ] && [ "$r" = 0 ] && { [ -z "$checks" ] || [ "$ran" -gt 0 ]; }; then r=1; fi
  echo "$v: operation checks${checks:+ of $checks} $p passed, $f failed (exit $r)" | tee -a "$LOG"
  if [ "$r" != 0 ] || [ "$f" != 0 ]; then
    grep ' FAIL' "$RES/check-$v.txt" | cut -c1-160 | head -20 | tee -a "$LOG"
    rc=1
    continue
  fi
  ok+=("$v")
  for op in $ops; do
    has_group "$bin" "$op" || continue # a group newer than this variant: its column stays empty
    DUET_CHECK_CASE="$cases" timeout 300 env $(venv "$v") "$bin/duet-check-ops" --bench --op "$op" \
      >"$RES/bench-$v-$op.txt" 2>>"$LOG"
  done
done

# One row per timed case: "op shape" (the text before the check columns), the time (the first
# field after '|'), a column per variant.  duet-check-ops prints a shape's first 30 characters,
# so two cases can print the same text: the second and later of a variant's file get " #2",
# " #3" (the variants run the same cases in the same order, new ones after).
table() {
  local v
  for v in "${ok[@]}"; do
    for op in $ops; do cat "$RES/bench-$v-$op.txt"; done 2>/dev/null |
      awk -F'|' -v v="$v" 'NF >= 2 { split($2, t, " "); k = $1; sub(/ +[a-z]+ +[^ ]+ +[^ ]+ +(ok|FAIL) *$/, "", k)
                                  if (t[1] !~ /^[0-9.]+$/) next
                                  if (++seen[k] > 1) k = k " #" seen[k]
                                  print v "\t" k "\t" t[1] }'
  done | awk -F'\t' -v order="${ok[*]}" '
    BEGIN { n = split(order, vs, " ") }
    { if (!(($2) in seen)) { seen[$2] = 1; keys[++nk] = $2 } t[$2, $1] = $3 }
    END {
      printf "%-48s", "case (us)"; for (i = 1; i <= n; i++) printf " %10s", vs[i]; printf "\n"
      for (j = 1; j <= nk; j++) {
        printf "%-48s", keys[j]
        for (i = 1; i <= n; i++) printf " %10s", ((keys[j], vs[i]) in t) ? t[keys[j], vs[i]] : "-"
        printf "\n"
      }
    }'
}

slice_rows() {
  local rep v line
  for rep in $(seq 1 "$reps"); do
    for v in "${ok[@]}"; do
      local only=--decode-only
      [ "$prefill" = 1 ] && only=""
      timeout 300 env $(venv "$v") "$(vbin "$v")/duet-check-forward" --model "$FIX/slice" --bench $only --ctx "$ctx" \
        --batches "$batches" >"$RES/slice-$v-$rep.txt" 2>>"$LOG"
      grep '^bench prefill' "$RES/slice-$v-$rep.txt" | while read -r line; do
        mode=$(echo "$line" | sed -E 's/^bench prefill [0-9]+ tokens \(([^ ]+).*/\1/')
        ms=$(echo "$line" | sed -E 's/.*: ([0-9.]+) ms, .*/\1/')
        printf '%s\tprefill %s tokens (%s), pass %s (ms)\t%s\n' "$v" "$ctx" "$mode" "$rep" "$ms"
      done
      grep '^bench decode' "$RES/slice-$v-$rep.txt" | while read -r line; do
        b=$(echo "$line" | sed -E 's/^bench decode batch ([0-9]+) .*/\1/')
        ms=$(echo "$line" | sed -E 's/.*: ([0-9.]+) ms\/step.*/\1/')
        printf '%s\tdecode batch %s ctx %s, pass %s (ms)\t%s\n' "$v" "$b" "$ctx" "$rep" "$ms"
      done
    done
  done | awk -F'\t' -v order="${ok[*]}" '
    BEGIN { n = split(order, vs, " ") }
    { if (!(($2) in seen)) { seen[$2] = 1; keys[++nk] = $2 } t[$2, $1] = $3 }
    END {
      for (j = 1; j <= nk; j++) {
        printf "%-48s", keys[j]
        for (i = 1; i <= n; i++) printf " %10s", ((keys[j], vs[i]) in t) ? t[keys[j], vs[i]] : "-"
        printf "\n"
      }
    }'
}

# the slice fixture first: the block below runs in a subshell (the pipe), which cannot wait for it
[ -n "$slice_pid" ] && [ ${#ok[@]} -gt 0 ] && wait "$slice_pid"
{
  echo "== variants side by side"
  for v in "${names[@]}"; do echo "  $v: $(cat "$VAR/bin/$v/what" 2>/dev/null)"; done
  [ ${#ok[@]} -gt 0 ] && table
  if [ -n "$slice_pid" ] && [ ${#ok[@]} -gt 0 ]; then
    tail -1 "$RES/mkmodel-slice.log"
    slice_rows
  fi
} | tee "$RES/summary.txt"

# one launch of one case under Nsight Compute, on the first variant that passed its checks (or
# on each of --ncu-variants that did)
if [ -n "$ncu_case" ] && [ ${#ok[@]} -gt 0 ]; then
  ncu="$(duet_ncu)"
  [ -n "$ncu_variants" ] || ncu_variants="${ok[0]}"
  for v in $ncu_variants; do
  {
    if [ -z "$ncu" ]; then
      echo "[ncu] no ncu on this machine"
    elif [[ " ${ok[*]} " != *" $v "* ]]; then
      echo "[ncu] variant $v did not pass its checks (or is not one): not profiled"
    else
      kargs=()
      [ -n "$ncu_kernel" ] && kargs=(-k "regex:$ncu_kernel")
      DUET_CHECK_CASE="$ncu_case" timeout 300 env $(venv "$v") "$ncu" "${kargs[@]}" --launch-count 1 --set full \
        --import-source no --cache-control all --clock-control none -f -o "$RES/ncu-$v" \
        "$(vbin "$v")/duet-check-ops" --op "$ncu_op" >>"$LOG" 2>&1
      echo "[ncu: variant $v, $ncu_op case '$ncu_case'${ncu_kernel:+, kernel $ncu_kernel}] exit $?"
      "$ncu" -i "$RES/ncu-$v.ncu-rep" --page details --print-units base >"$RES/ncu-details-$v.txt" 2>&1
      "$ncu" -i "$RES/ncu-$v.ncu-rep" --page source --print-source sass --csv >"$RES/ncu-sass.csv" 2>>"$LOG"
      python3 "$ROOT/scripts/kernel-stalls.py" "$RES/ncu-sass.csv" --top 25 >"$RES/ncu-stalls-$v.txt" 2>&1
      grep -E "^  [^ ].*\(|Duration|DRAM Throughput|L2 Hit Rate|Achieved Occupancy|Registers Per|Dynamic Shared Memory Per|Grid Size|Eligible Warps" \
        "$RES/ncu-details-$v.txt" | head -16
      head -14 "$RES/ncu-stalls-$v.txt"
      rm -f "$RES/ncu-sass.csv"
    fi
  } | tee -a "$RES/summary.txt"
  done
fi
exit $rc
