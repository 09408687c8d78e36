#!/usr/bin/env bash
# Bounded-time fuzzing of one target with libFuzzer.
#
#   tests/fuzz/run_fuzz.sh TARGET SECONDS
#
# Builds tests/fuzz/fuzz_TARGET.c with clang -fsanitize=fuzzer,address,undefined
# into build-fuzz/ (or $DUET_FUZZ_DIR), against every source of common/ and
# common/text/, common/net/msg.c and the protocol's code (protoc-c from
# proto/duet.proto) compiled with the same instrumentation (a static archive: the
# link takes only what the target uses; a source that does not compile is
# skipped with a warning).  Then runs it for SECONDS on a working copy of the
# stored corpus tests/fuzz/corpus/TARGET (new inputs found stay in the working
# copy for the next run; the stored corpus is never written).  Crashes are
# written to build-fuzz/TARGET/artifacts/; the exit status is non-zero when
# there is one.  Replay an artifact with the plain build:
#   build/tests/fuzz/fuzz_TARGET build-fuzz/TARGET/artifacts/crash-...
set -euo pipefail

die() { echo "run_fuzz: $*" >&2; exit 2; }

[ $# -eq 2 ] || die "usage: $0 TARGET SECONDS"
TARGET=$1
SECONDS_MAX=$2
case "$SECONDS_MAX" in ''|*[!0-9]*) die "SECONDS must be a whole number" ;; esac

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SRC="$ROOT/tests/fuzz/fuzz_$TARGET.c"
[ -f "$SRC" ] || die "no target $TARGET (no $SRC)"
CORPUS="$ROOT/tests/fuzz/corpus/$TARGET"
[ -d "$CORPUS" ] || die "no stored corpus $CORPUS"

CC="${DUET_FUZZ_CC:-clang}"
command -v "$CC" >/dev/null || die "$CC is missing: install the Debian package clang (apt-get install clang)"

OUT="${DUET_FUZZ_DIR:-$ROOT/build-fuzz}"
WORK="$OUT/$TARGET"
OBJ="$OUT/obj"
mkdir -p "$OBJ" "$WORK/corpus" "$WORK/artifacts"

CFLAGS=(-std=c11 -D_GNU_SOURCE -DDUET_FUZZ_LIBFUZZER -g -O1 -fno-omit-frame-pointer
        -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
        -I"$ROOT/common" -I"$ROOT/common/text" -I"$ROOT/common/net" -I"$OUT/proto")
[ -f "$ROOT/build/duet_config.h" ] && CFLAGS+=(-I"$ROOT/build")

# The control-plane messages (common/net/msg.c, for the msg target) need the protocol's C code,
# generated here from proto/duet.proto as the build does.
command -v protoc-c >/dev/null || die "protoc-c is missing: install the Debian package protobuf-c-compiler (./duet deps)"
mkdir -p "$OUT/proto"
if [ ! -f "$OUT/proto/duet.pb-c.c" ] || [ "$ROOT/proto/duet.proto" -nt "$OUT/proto/duet.pb-c.c" ]; then
  protoc-c --proto_path="$ROOT/proto" --c_out="$OUT/proto" "$ROOT/proto/duet.proto"
fi

LIBS=()
for pc in jansson libxxhash libpcre2-8 libprotobuf-c; do
  if pkg-config --exists "$pc" 2>/dev/null; then
    read -r -a more <<<"$(pkg-config --libs "$pc")"
    LIBS+=("${more[@]}")
  fi
done
LIBS+=(-lm -lpthread)

# The library: every source of common/ and common/text/, the messages and their generated
# protocol code, rebuilt when newer.
objs=()
for c in "$ROOT"/common/*.c "$ROOT"/common/text/*.c "$ROOT"/common/net/msg.c "$OUT/proto/duet.pb-c.c"; do
  [ -f "$c" ] || continue
  rel="${c#"$ROOT"/}"
  rel="${rel#"$OUT"/}"
  o="$OBJ/${rel//\//_}.o"
  if [ ! -f "$o" ] || [ "$c" -nt "$o" ] || [ -n "$(find "$(dirname "$c")" -maxdepth 1 -name '*.h' -newer "$o" -print -quit)" ]; then
    if ! "$CC" "${CFLAGS[@]}" -c "$c" -o "$o" 2>"$o.log"; then
      echo "run_fuzz: warning: $rel does not compile, left out (see $o.log)" >&2
      rm -f "$o"
      continue
    fi
  fi
  objs+=("$o")
done
rm -f "$OBJ/libduet_fuzz.a"
ar rcs "$OBJ/libduet_fuzz.a" "${objs[@]}"

BIN="$WORK/fuzz_$TARGET"
"$CC" "${CFLAGS[@]}" -fsanitize=fuzzer "$SRC" "$ROOT/tests/fuzz/fuzz_main.c" "$OBJ/libduet_fuzz.a" \
  "${LIBS[@]}" -o "$BIN"

cp -n "$CORPUS"/* "$WORK/corpus/" 2>/dev/null || true
echo "run_fuzz: $TARGET for ${SECONDS_MAX}s on $(ls "$WORK/corpus" | wc -l) inputs ($WORK)"

before=$(ls "$WORK/artifacts" | wc -l)
set +e
"$BIN" -max_total_time="$SECONDS_MAX" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$WORK/artifacts/" "$WORK/corpus" 2>"$WORK/fuzz.log"
rc=$?
set -e
tail -n 15 "$WORK/fuzz.log"
after=$(ls "$WORK/artifacts" | wc -l)
if [ "$rc" -ne 0 ] || [ "$after" -gt "$before" ]; then
  echo "run_fuzz: $TARGET FAILED (exit $rc); artifacts in $WORK/artifacts, log in $WORK/fuzz.log" >&2
  exit 1
fi
echo "run_fuzz: $TARGET found nothing in ${SECONDS_MAX}s"
