#!/usr/bin/env bash
# tests/fuzz/run.sh — build pagedserve's libFuzzer harnesses and run each for a bounded time.
#
#   tests/fuzz/run.sh [SECONDS] [TARGET ...]   fuzz each target SECONDS (default 20), one at
#                                              a time; all targets when none is named
#   tests/fuzz/run.sh --build-only             build the harnesses and the seed generator
#
# Every harness is compiled straight from the project's sources with
# clang -fsanitize=fuzzer,address,undefined (no CMake build needed) into $FUZZ_BUILD_DIR
# (default build-fuzz/). Per target:
#   1. replay: every committed input in tests/fuzz/corpus/TARGET is run once; an input that
#      crashes there is a regression (or a known, still unfixed finding) and is reported;
#   2. fuzz: libFuzzer runs for SECONDS from the committed inputs that pass, the GGUF seeds
#      written by gen_seeds, and what earlier runs found (build-fuzz/corpus/TARGET, never
#      committed), with tests/fuzz/TARGET.dict when present.
# Exit status: 0 when no harness crashed, 1 on any crash (artifacts are listed), 2 on a
# build or usage error. See tests/fuzz/README.md.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
FUZZ_DIR="$ROOT/tests/fuzz"
BUILD=${FUZZ_BUILD_DIR:-$ROOT/build-fuzz}
CC=${FUZZ_CC:-clang}
ALL_TARGETS=(fuzz_request fuzz_gguf fuzz_tokenizer fuzz_bpe fuzz_stop fuzz_sse fuzz_schema)

build_only=0
seconds=20
if [ "${1:-}" = "--build-only" ]; then
  build_only=1
  shift
elif [ $# -gt 0 ] && [[ "$1" =~ ^[0-9]+$ ]]; then
  seconds=$1
  shift
fi
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${ALL_TARGETS[@]}")
for t in "${targets[@]}"; do
  case " ${ALL_TARGETS[*]} " in
    *" $t "*) ;;
    *) echo "run.sh: unknown target '$t' (known: ${ALL_TARGETS[*]})" >&2; exit 2 ;;
  esac
done

# ---- toolchain: clang, its libFuzzer runtime, jansson --------------------------------------
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
install_missing() {
  command -v dpkg-query >/dev/null 2>&1 || return 0 # not Debian: the build says what is missing
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "Installing missing Debian packages: ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
  fi
}

if ! command -v "$CC" >/dev/null 2>&1; then
  [ "$CC" = clang ] || { echo "run.sh: $CC not found" >&2; exit 2; }
  install_missing clang
fi
install_missing pkg-config libjansson-dev

mkdir -p "$BUILD/bin" "$BUILD/obj" "$BUILD/logs"
# libFuzzer's runtime ships apart from the compiler on Debian (libclang-rt-N-dev).
probe="$BUILD/obj/probe.c"
printf '#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' >"$probe"
if ! "$CC" -fsanitize=fuzzer,address,undefined "$probe" -o "$BUILD/obj/probe" 2>/dev/null; then
  major=$("$CC" -dumpversion | cut -d. -f1)
  install_missing "libclang-rt-$major-dev"
  "$CC" -fsanitize=fuzzer,address,undefined "$probe" -o "$BUILD/obj/probe" || {
    echo "run.sh: $CC cannot link -fsanitize=fuzzer (libclang-rt-$major-dev installed?)" >&2
    exit 2
  }
fi

# ---- build ---------------------------------------------------------------------------------
# The project's own flags (-march=native, C11 + _GNU_SOURCE), plus the sanitizers. Project
# sources are not built with -Werror: clang warns where the project's gcc does not.
CFLAGS=(-std=c11 -D_GNU_SOURCE -g -O1 -march=native -fno-omit-frame-pointer -ffp-contract=off
        -fno-sanitize-recover=undefined -I"$ROOT" -I"$FUZZ_DIR" -Wall -Wextra
        -Wno-string-concatenation)
JANSSON=($(pkg-config --cflags --libs jansson))

COMMON=(tests/fuzz/fuzz_util.c tools/mkmodel_vocab.c model/gguf.c model/gguf_blocks.c
        model/gguf_write.c model/tokenizer.c model/tokenizer_bpe.c model/unicode_class.c
        model/unicode_classes.c model/model_error.c compute/pool.c) # gguf.c decodes on the pool
# Every api/*.c and the grammars under them (model/json_*.c, model/regex_*.c), globbed so that a new
# one cannot be missed.
API=($(cd "$ROOT" && echo api/*.c model/json_*.c model/regex_*.c) model/sampler.c)
# Loading weights packs them for the product kernels (every model/matmul*.c, globbed so
# that a new kernel file cannot be missed; they run on the compute pool).
WEIGHTS=(model/weights.c $(cd "$ROOT" && echo model/matmul*.c) compute/quant_i8.c)
sources_of() {
  case "$1" in
    fuzz_request|fuzz_sse|fuzz_schema) echo "${COMMON[*]} ${API[*]}" ;;
    fuzz_gguf) echo "${COMMON[*]} ${WEIGHTS[*]}" ;;
    fuzz_tokenizer|fuzz_bpe) echo "${COMMON[*]}" ;;
    fuzz_stop) echo "${COMMON[*]} scheduler/stop_text.c" ;;
  esac
}

# One object per source (shared by every harness that needs it), rebuilt every run:
# a few seconds, and no stale object can hide a change in a header.
compile() { # src obj
  "$CC" "${CFLAGS[@]}" -fsanitize=fuzzer-no-link,address,undefined -c "$ROOT/$1" -o "$2" \
    2>"$2.log" || { cat "$2.log" >&2; echo "run.sh: compiling $1 failed" >&2; exit 2; }
}
declare -A built=()
objects_of() { # target -> object paths (compiling what is not built yet)
  local objs=()
  for src in $(sources_of "$1"); do
    local obj="$BUILD/obj/$(echo "$src" | tr / _).o"
    if [ -z "${built[$src]:-}" ]; then
      compile "$src" "$obj"
      built[$src]=1
    fi
    objs+=("$obj")
  done
  echo "${objs[*]}"
}

for t in "${targets[@]}"; do
  echo "building $t"
  objs=$(objects_of "$t")
  # the harness itself: warnings are errors here
  "$CC" "${CFLAGS[@]}" -Werror -fsanitize=fuzzer,address,undefined "$FUZZ_DIR/$t.c" $objs \
    "${JANSSON[@]}" -lm -pthread -o "$BUILD/bin/$t" || { echo "run.sh: building $t failed" >&2; exit 2; }
done
echo "building gen_seeds"
"$CC" "${CFLAGS[@]}" -Werror -fsanitize=address,undefined "$FUZZ_DIR/gen_seeds.c" \
  $(for s in "${COMMON[@]}" "${WEIGHTS[@]}"; do echo "$ROOT/$s"; done) -lm -pthread \
  -o "$BUILD/bin/gen_seeds" 2>"$BUILD/logs/gen_seeds.build.log" || {
  cat "$BUILD/logs/gen_seeds.build.log" >&2; echo "run.sh: building gen_seeds failed" >&2; exit 2; }
rm -rf "$BUILD/seeds"
mkdir -p "$BUILD/seeds/fuzz_gguf"
"$BUILD/bin/gen_seeds" "$BUILD/seeds/fuzz_gguf"

[ $build_only = 1 ] && { echo "built into $BUILD/bin"; exit 0; }

# ---- run -----------------------------------------------------------------------------------
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
status=0
summary=()
for t in "${targets[@]}"; do
  bin="$BUILD/bin/$t"
  log="$BUILD/logs/$t.log"
  replay_log="$BUILD/logs/$t.replay.log"
  work="$BUILD/corpus/$t"
  passing="$BUILD/passing/$t"
  crashes="$BUILD/crashes/$t"
  rm -rf "$passing"
  mkdir -p "$work" "$passing" "$crashes"
  : >"$log"
  : >"$replay_log"

  # 1. replay the committed corpus, one input at a time
  replay_failed=()
  if [ -d "$FUZZ_DIR/corpus/$t" ]; then
    for f in "$FUZZ_DIR/corpus/$t"/*; do
      [ -f "$f" ] || continue
      if "$bin" "$f" >>"$replay_log" 2>&1; then
        cp "$f" "$passing/"
      else
        replay_failed+=("$f")
      fi
    done
  fi

  # 2. fuzz
  dict=()
  [ -f "$FUZZ_DIR/$t.dict" ] && dict=(-dict="$FUZZ_DIR/$t.dict")
  seeds=("$passing")
  [ -d "$BUILD/seeds/$t" ] && seeds+=("$BUILD/seeds/$t")
  echo "fuzzing $t for ${seconds}s (log: $log)"
  set +e
  "$bin" -max_total_time="$seconds" -timeout=25 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$crashes/" "${dict[@]}" "$work" "${seeds[@]}" >>"$log" 2>&1
  rc=$?
  set -e
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -1 | awk '{print $2}')
  line="$t: ${execs:-?} executions in ${seconds}s, corpus $(ls "$work" | wc -l) inputs"
  if [ ${#replay_failed[@]} -gt 0 ]; then
    status=1
    line+=$'\n'"  committed inputs that crash (log: $replay_log): ${replay_failed[*]}"
  fi
  if [ $rc -ne 0 ]; then
    status=1
    line+=$'\n'"  CRASH (exit $rc): $(ls -t "$crashes" 2>/dev/null | head -1 | sed "s|^|$crashes/|")"
    line+=$'\n'"$(grep -E 'ERROR: |SUMMARY: |FUZZ CHECK FAILED|runtime error' "$log" | head -5 | sed 's/^/    /')"
  fi
  summary+=("$line")
done

echo
echo "==== fuzz summary ===="
printf '%s\n' "${summary[@]}"
[ $status = 0 ] && echo "no crashes" || echo "CRASHES FOUND: see the logs in $BUILD/logs"
exit $status
