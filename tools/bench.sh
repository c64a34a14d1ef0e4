#!/usr/bin/env bash
# bench.sh — what `make bench` runs: pagedserve's serving benchmarks on this machine.
#
# 1. makes the 110M-parameter benchmark model once (random weights; the Llama vocabulary
#    from ../shared when present), 2. measures the machine's sgemm GFLOP/s and memory
#    bandwidth when `bench matmul` / `bench membw` exist, 3. starts pagedserve on a free
#    loopback port and runs the `bench serve` workloads against it (a second server without
#    the prefix cache, a third with a small KV cache for the capacity workload), 4. writes
#    build/bench/: one JSON per run, results.md (ending with `bench targets`' table of issue
#    7's targets), results.tsv and, with gnuplot, PNG plots.
# Every server it starts is stopped on exit, whatever happens (trap).
#
# Environment (all optional):
#   BUILD=build                build directory holding bin/ (pagedserve, bench, mkmodel)
#   SHARED=../shared           shared data folder (for the Llama vocabulary)
#   BENCH_OUT=$BUILD/bench     where results go (emptied of old results first)
#   BENCH_MODEL=$BUILD/bench-model-110m.gguf
#   BENCH_WORKLOADS="chat decode prefix capacity"
#   BENCH_KV_MB=1024           KV cache of the main servers
#   BENCH_CAPACITY_KV_MB=288   KV cache of the capacity server (the issue's budget: 8192 F16 tokens)
#   BENCH_MAX_SECONDS=1800     bound on each `bench serve` invocation
#   BENCH_QUICK=1              small smoke run (fewer levels and requests)
#   BENCH_NO_INSTALL=1         never apt-get install gnuplot
#   BENCH_WEIGHT_TYPE=f32      the servers' --weight-type (f32, f16, bf16, int8 or q4; bench serve is told too)
#   BENCH_KV_DTYPE=f16         the servers' --kv-dtype (f16, f32 or q8; bench serve is told too)
#   BENCH_SERVER_FLAGS="..."   extra pagedserve flags for every server
#   BENCH_PEER_SERVER=PATH     a llama.cpp llama-server binary: after pagedserve, the same
#                              workloads against it (2 threads, flash attention, 2048 tokens a
#                              slot; capacity in the same KV budget) into $BENCH_OUT/peer, and
#                              results.md checks the targets against it too
#   BENCH_PEER_MODEL=FILE      the GGUF it serves (BENCH_MODEL; for int8 runs, a Q8_0 file from
#                              llama-quantize); BENCH_KV_DTYPE=q8 gives it -ctk/-ctv q8_0
#   BENCH_PEER_DIR=DIR         instead: JSON of `bench serve` run against the peer on this
#                              machine earlier (same file names) for results.md's check
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$ROOT/build}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
SHARED=${SHARED:-$ROOT/../shared}
BIN=$BUILD/bin
OUT=${BENCH_OUT:-$BUILD/bench}
MODEL=${BENCH_MODEL:-$BUILD/bench-model-110m.gguf}
WORKLOADS=${BENCH_WORKLOADS:-chat decode prefix capacity}
KV_MB=${BENCH_KV_MB:-1024}
CAP_KV_MB=${BENCH_CAPACITY_KV_MB:-288}
MAX_SECONDS=${BENCH_MAX_SECONDS:-1800}
QUICK=${BENCH_QUICK:-0}
WEIGHT_TYPE=${BENCH_WEIGHT_TYPE:-f32}
case $WEIGHT_TYPE in f32|f16|bf16|int8|q4) ;; *) echo "bench.sh: BENCH_WEIGHT_TYPE must be f32, f16, bf16, int8 or q4" >&2; exit 2 ;; esac
KV_DTYPE=${BENCH_KV_DTYPE:-f16}
case $KV_DTYPE in f16|f32|q8) ;; *) echo "bench.sh: BENCH_KV_DTYPE must be f16, f32 or q8" >&2; exit 2 ;; esac
read -r -a SERVER_FLAGS <<< "--weight-type $WEIGHT_TYPE --kv-dtype $KV_DTYPE ${BENCH_SERVER_FLAGS:-}"
MAX_SEQS=64

log() { printf '== %s\n' "$*" >&2; }
die() { printf 'bench.sh: %s\n' "$*" >&2; exit 1; }

# ---- preconditions --------------------------------------------------------------------
for b in pagedserve bench mkmodel; do
    [ -x "$BIN/$b" ] || die "$BIN/$b is missing: build first (make build)"
done
"$BIN/bench" serve --help >/dev/null 2>&1 ||
    die "'$BIN/bench serve' does not exist: this build's bench lacks the serve subcommand"
mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/*.txt "$OUT"/*.png "$OUT"/*.tsv "$OUT"/*.md "$OUT"/*.log \
      "$OUT"/*.gp

# ---- the model ------------------------------------------------------------------------
if [ -f "$MODEL" ]; then
    log "model: reusing $MODEL"
else
    vocab=()
    spm=$SHARED/models/vocab/ggml-vocab-llama-spm.gguf
    if [ -f "$spm" ]; then vocab=(--vocab-from "$spm"); else vocab=(--vocab 32000); fi
    log "model: making $MODEL (134M parameters, f32, 512 MiB)"
    "$BIN/mkmodel" -o "$MODEL.tmp" --dim 768 --layers 12 --heads 12 --kv-heads 12 --ffn 2048 \
        --type f32 "${vocab[@]}"
    mv "$MODEL.tmp" "$MODEL"
fi

# ---- gnuplot (optional) -----------------------------------------------------------------
have_gnuplot() { command -v gnuplot >/dev/null 2>&1; }
if ! have_gnuplot && [ "${BENCH_NO_INSTALL:-0}" != 1 ] && command -v dpkg-query >/dev/null 2>&1; then
    if ! dpkg-query -W -f='${Status}\n' gnuplot-nox 2>/dev/null | grep -q 'install ok installed'; then
        SUDO=""
        [ "$(id -u)" = 0 ] || SUDO=sudo
        log "installing gnuplot-nox for the plots (BENCH_NO_INSTALL=1 to skip)"
        { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
              $SUDO apt-get install -y -qq --no-install-recommends gnuplot-nox; } \
            > "$OUT/apt-gnuplot.log" 2>&1 ||
            log "could not install gnuplot-nox (see $OUT/apt-gnuplot.log): no plots"
    fi
fi

# ---- machine peaks (optional) ---------------------------------------------------------
GFLOPS=0
GFLOPS32=0
GFLOPS_SERVED=0
GBPS=0
if "$BIN/bench" matmul --help >/dev/null 2>&1; then
    log "machine: bench matmul (GFLOP/s at 256 rows: the best of pagedserve's kernel and OpenBLAS)"
    "$BIN/bench" matmul --rows 256 --min-time 0.2 > "$OUT/machine-matmul.txt" 2>&1 || true
    # Shape lines say "in N -> out M"; row lines are "R | matmul-us GFLOP/s W-GB/s |
    # slices-us sgemm-MT-us -": the rate is the fastest of the three on any shape.
    best_rate() {
        awk -F'|' -v rows="$2" '/ in [0-9]+ -> out / { split($0, w, " "); for (i = 1; i < length(w); i++) {
                 if (w[i] == "in") inp = w[i + 1]; if (w[i] == "out") outp = w[i + 1] + 0 } }
             $1 + 0 == rows { split($2, a, " "); split($3, b, " ");
                 t = a[1]; if (b[1] + 0 > 0 && b[1] < t) t = b[1]; if (b[2] + 0 > 0 && b[2] < t) t = b[2];
                 g = 2 * rows * inp * outp / t / 1000; if (g > best) best = g }
             END { printf "%.1f", best + 0 }' "$1"
    }
    GFLOPS=$(best_rate "$OUT/machine-matmul.txt" 256)
    # For reading decode numbers: the same at 32 rows (one decode step of 32 sequences).
    "$BIN/bench" matmul --rows 32 --min-time 0.2 > "$OUT/machine-matmul-32.txt" 2>&1 || true
    GFLOPS32=$(best_rate "$OUT/machine-matmul-32.txt" 32)
    # BF16, int8 and Q4 products do 2x, 4x and ~2-2.5x the multiply-adds per cycle (int8 on AVX2
    # ~1.6x): their own peak, reported beside the F32 roofline that every ratio divides by
    # (the issue's yardstick).
    if [ "$WEIGHT_TYPE" = bf16 ] || [ "$WEIGHT_TYPE" = int8 ] || [ "$WEIGHT_TYPE" = q4 ]; then
        "$BIN/bench" matmul --type "$WEIGHT_TYPE" --rows 256 --min-time 0.2 \
            > "$OUT/machine-matmul-$WEIGHT_TYPE.txt" 2>&1 || true
        GFLOPS_SERVED=$(best_rate "$OUT/machine-matmul-$WEIGHT_TYPE.txt" 256)
    fi
else
    log "machine: no 'bench matmul' in this build: no compute roofline"
fi
if "$BIN/bench" membw --help >/dev/null 2>&1; then
    log "machine: bench membw"
    "$BIN/bench" membw --min-time 0.2 > "$OUT/machine-membw.txt" 2>&1 || true
    GBPS=$(awk '/^read/ { for (i = 1; i < NF; i++) if ($(i + 1) == "GB/s") v = $i }
                END { printf "%.1f", v + 0 }' "$OUT/machine-membw.txt")
else
    log "machine: no 'bench membw' in this build: no bandwidth roofline"
fi
log "machine: sgemm ${GFLOPS} GFLOP/s, memory read ${GBPS} GB/s (0 = not measured)"

# ---- servers --------------------------------------------------------------------------
SERVER_PID=""
PORT=""
stop_server() {
    [ -n "$SERVER_PID" ] || return 0
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=""
}
trap stop_server EXIT
trap 'exit 130' INT TERM

# GET path on the server; prints the status code (000 when nothing answered).
http_status() {
    local code=000
    if exec 3<>"/dev/tcp/127.0.0.1/$PORT" 2>/dev/null; then
        printf 'GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' "$1" >&3
        IFS=' ' read -r -t 5 _ code _ <&3 || true
        exec 3<&-
    fi
    echo "${code:-000}"
}

# wait_ready LOG PATH: until GET PATH on $PORT answers 200 (with PORT empty, first read it
# from the "listening on" line of LOG, as pagedserve logs it). 1 if the server exits (its
# log is printed), 2 after 120 s.
wait_ready() {
    local logf=$1 path=$2
    for _ in $(seq 600); do
        kill -0 "$SERVER_PID" 2>/dev/null || { cat "$logf" >&2; return 1; }
        if [ -z "$PORT" ]; then
            PORT=$(grep -o 'listening on http://127\.0\.0\.1:[0-9]*' "$logf" | head -1 | grep -o '[0-9]*$' || true)
        fi
        if [ -n "$PORT" ] && [ "$(http_status "$path")" = 200 ]; then
            return 0
        fi
        sleep 0.2
    done
    return 2
}

# start_server NAME FLAGS...: --port 0 lets the kernel pick a free port; the log says which.
start_server() {
    local name=$1
    shift
    local logf=$OUT/server-$name.log
    "$BIN/pagedserve" -m "$MODEL" --host 127.0.0.1 --port 0 --max-seqs "$MAX_SEQS" \
        --log-level info "${SERVER_FLAGS[@]}" "$@" > "$logf" 2>&1 &
    SERVER_PID=$!
    PORT=""
    local rc=0
    wait_ready "$logf" /ready || rc=$?
    [ "$rc" = 1 ] && die "pagedserve ($name) exited"
    [ "$rc" = 2 ] && die "pagedserve ($name) not ready after 120 s (log: $logf)"
    log "server $name: pid $SERVER_PID, port $PORT, flags: $*"
}

# run NAME LABEL KV_MB ARGS...: one bench serve invocation into $RUN_OUT; a failed request
# is reported, not fatal.
RUN_OUT=$OUT
run() {
    local name=$1 label=$2 kv=$3
    shift 3
    log "bench serve $name ($label)"
    local rc=0
    "$BIN/bench" serve --port "$PORT" --gguf "$MODEL" --kv-cache-mb "$kv" \
        --gflops "$GFLOPS" --gbps "$GBPS" --max-seconds "$MAX_SECONDS" --label "$label" \
        --weight-type "$WEIGHT_TYPE" --kv-dtype "$KV_DTYPE" \
        --json "$RUN_OUT/$name.json" --markdown "$RUN_OUT/results-body.md" --tsv "$RUN_OUT/results.tsv" \
        "$@" | tee "$RUN_OUT/$name.txt" || rc=$?
    [ "$rc" = 0 ] || [ "$rc" = 3 ] || die "bench serve $name failed (exit $rc)"
    [ "$rc" = 0 ] || log "WARNING: $name: some requests failed or the run was cut short"
}

wants() { case " $WORKLOADS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

if [ "$QUICK" = 1 ]; then
    CHAT=(-c "1,8" -n 8); DECODE=(-c 8 --max-tokens 64); PREFIX=(-c 4 -n 8)
    CAPACITY=(-c "4,8" --max-tokens 128)
else
    CHAT=(); DECODE=(); PREFIX=(); CAPACITY=()
fi
rm -f "$OUT/results-body.md"

if wants chat || wants decode || wants prefix; then
    start_server main --kv-cache-mb "$KV_MB"
    wants chat && run chat "kv ${KV_MB} MiB, prefix cache on" "$KV_MB" --workload chat "${CHAT[@]}"
    wants decode && run decode "kv ${KV_MB} MiB" "$KV_MB" --workload decode "${DECODE[@]}"
    wants prefix && run prefix-cache "prefix cache on" "$KV_MB" --workload prefix "${PREFIX[@]}"
    stop_server
fi
if wants prefix; then
    start_server no-prefix-cache --kv-cache-mb "$KV_MB" --no-prefix-cache
    run prefix-nocache "prefix cache off" "$KV_MB" --workload prefix "${PREFIX[@]}"
    stop_server
fi
if wants capacity; then
    start_server capacity --kv-cache-mb "$CAP_KV_MB"
    run capacity "kv ${CAP_KV_MB} MiB" "$CAP_KV_MB" --workload capacity "${CAPACITY[@]}"
    stop_server
fi

# ---- the peer (optional): llama.cpp's llama-server, same workloads, same machine --------
PEER_DIR=${BENCH_PEER_DIR:-}
# start_peer NAME FLAGS...: on a free loopback port, ready when /health answers 200. A peer
# that exits or never gets ready is reported and skipped (returns 1): pagedserve's results stand.
start_peer() {
    local name=$1 p
    shift
    for p in $(seq 18600 18700); do
        (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || break
    done
    PORT=$p
    "$BENCH_PEER_SERVER" -m "$PEER_MODEL" --host 127.0.0.1 --port "$PORT" -t 2 -tb 2 -fa on \
        --metrics "${PEER_KV[@]}" "$@" > "$RUN_OUT/server-$name.log" 2>&1 &
    SERVER_PID=$!
    local rc=0
    wait_ready "$RUN_OUT/server-$name.log" /health || rc=$?
    case $rc in
    0) log "peer $name: pid $SERVER_PID, port $PORT, flags: $*"; return 0 ;;
    1) log "WARNING: the peer ($name) exited: no peer results for it"; SERVER_PID="" ;;
    *) log "WARNING: the peer ($name) not ready after 120 s (log: $RUN_OUT/server-$name.log): skipped"
       stop_server ;;
    esac
    return 1
}
if [ -n "${BENCH_PEER_SERVER:-}" ]; then
    [ -x "$BENCH_PEER_SERVER" ] || die "BENCH_PEER_SERVER=$BENCH_PEER_SERVER is not an executable"
    PEER_MODEL=${BENCH_PEER_MODEL:-$MODEL}
    PEER_KV=()
    [ "$KV_DTYPE" = q8 ] && PEER_KV=(-ctk q8_0 -ctv q8_0)
    PEER_DIR=$OUT/peer
    RUN_OUT=$PEER_DIR
    mkdir -p "$RUN_OUT"
    rm -f "$RUN_OUT"/*
    # -np 32 -c 65536: 2048 tokens a slot, pagedserve's context.
    if { wants chat || wants decode || wants prefix; } && start_peer main -np 32 -c 65536; then
        wants chat && run chat "llama-server" "$KV_MB" --workload chat "${CHAT[@]}"
        wants decode && run decode "llama-server" "$KV_MB" --workload decode "${DECODE[@]}"
        wants prefix && run prefix-cache "llama-server, its prompt cache" "$KV_MB" --workload prefix "${PREFIX[@]}"
        stop_server
    fi
    # Capacity in the same KV budget as pagedserve's (its bytes per token): it does not
    # preempt, so it gets as many slots as fit a whole 512 + 512-token request each (more
    # slots fail requests with "Context size has been exceeded").
    bpt=$(grep -o '[0-9]* bytes/token' "$OUT/capacity.txt" 2>/dev/null | head -1 | cut -d' ' -f1 || true)
    if wants capacity && [ -n "$bpt" ]; then
        tokens=$(( CAP_KV_MB * 1048576 / bpt / 256 * 256 ))
        if start_peer capacity --kv-unified -c "$tokens" -np $(( tokens / 1040 )); then
            run capacity "llama-server, $tokens tokens" "$CAP_KV_MB" --workload capacity -c 16 "${CAPACITY[@]}"
            stop_server
        fi
    fi
    RUN_OUT=$OUT
fi

# "main 128 (auto), capacity 64 (--max-prefill-chunk)": what each server's startup log says.
prefill_chunks() {
    local f name chunk out=""
    for f in "$OUT"/server-*.log; do
        [ -f "$f" ] || continue
        name=$(basename "$f" .log)
        chunk=$(grep -o -m1 'prefill chunk [0-9]* ([^:)]*' "$f" | sed 's/prefill chunk //; s/$/)/')
        out="$out${out:+, }${name#server-} ${chunk:-?}"
    done
    echo "${out:-none}"
}

# ---- results.md -----------------------------------------------------------------------
{
    echo "# pagedserve serving benchmarks"
    echo
    echo "- date: $(date -u +%Y-%m-%dT%H:%MZ), host: $(uname -n), $(nproc) cores:" \
         "$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ *//')"
    echo "- model: $MODEL ($(stat -c %s "$MODEL" | awk '{printf "%.0f MiB", $1 / 1048576}');" \
         "geometry and parameter counts in each JSON's \"model\")"
    echo "- commit: $(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo unknown);" \
         "server flags (besides each run's): ${SERVER_FLAGS[*]}"
    echo "- prefill chunk (rows a decoding step may carry) per server: $(prefill_chunks)"
    echo "- machine peaks: products ${GFLOPS} GFLOP/s (the faster of pagedserve's kernel and" \
         "OpenBLAS, 256 rows; ${GFLOPS32} at 32 rows), memory read ${GBPS} GB/s (0 = not measured)"
    [ "$GFLOPS_SERVED" = 0 ] || echo "- $WEIGHT_TYPE products (the served weight type): ${GFLOPS_SERVED} GFLOP/s" \
         "at 256 rows; the roofline columns still divide by the F32 peak above"
    echo "- how to read: docs/benchmarks-howto.md"
    cat "$OUT/results-body.md"
    echo
    echo "## Targets (issue 7)"
    echo
    TARGET_ARGS=()
    [ -n "$PEER_DIR" ] && TARGET_ARGS=(--peer "$PEER_DIR")
    # Ceilings and floors at the served weights' product peak (int8's or BF16's own, else F32's).
    positive() { awk -v g="$1" 'BEGIN { exit !(g + 0 > 0) }'; }
    PEAK=$GFLOPS_SERVED
    positive "$PEAK" || PEAK=$GFLOPS
    positive "$PEAK" && TARGET_ARGS+=(--gflops "$PEAK")
    "$BIN/bench" targets "$OUT" "${TARGET_ARGS[@]}" || true # exit 3: some target missed or not run
    if [ -f "$OUT/peer/results-body.md" ] && [ -n "${BENCH_PEER_SERVER:-}" ]; then
        echo
        echo "## The peer: $BENCH_PEER_SERVER serving $PEER_MODEL"
        cat "$OUT/peer/results-body.md"
    fi
} > "$OUT/results.md"
rm -f "$OUT/results-body.md" "$OUT/peer/results-body.md"

# ---- plots ----------------------------------------------------------------------------
# The gnuplot commands for one workload run at several concurrencies (chat, capacity):
# output tok/s and TTFT p50/p99 against concurrency, the peer's levels beside them when it
# ran. TTFT on a log scale: p50 and p99, ours and the peer's, lie orders of magnitude apart.
plot_commands() { # workload
    local w=$1 tsv=$OUT/$1.tsv peer=$OUT/peer/$1.tsv thr ttft
    grep "^$w	" "$OUT/results.tsv" > "$tsv" || return 1
    thr="\"$tsv\" using 3:7 with linespoints lw 2 title \"pagedserve\""
    ttft="\"$tsv\" using 3:9 with linespoints lw 2 title \"pagedserve p50\","
    ttft+=" \"$tsv\" using 3:11 with linespoints lw 2 title \"pagedserve p99\""
    if [ -n "${BENCH_PEER_SERVER:-}" ] && grep "^$w	" "$OUT/peer/results.tsv" > "$peer" 2>/dev/null; then
        thr+=", \"$peer\" using 3:7 with linespoints lw 2 dt 2 title \"the peer\""
        ttft+=", \"$peer\" using 3:9 with linespoints lw 2 dt 2 title \"the peer p50\","
        ttft+=" \"$peer\" using 3:11 with linespoints lw 2 dt 2 title \"the peer p99\""
    fi
    cat <<EOF
set output "$OUT/$w-throughput.png"
set title "$w: output tokens/s against concurrency"
set ylabel "output tokens / s"
unset logscale y
plot $thr
set output "$OUT/$w-ttft.png"
set title "$w: time to first token against concurrency"
set ylabel "TTFT (ms, log scale)"
set logscale y 10
plot $ttft
EOF
}

if have_gnuplot; then
    plotted=""
    {
        cat <<EOF
set terminal png size 900,540
set datafile separator "\t"
set datafile missing "nan"
set grid
set key left top
set xlabel "concurrent clients"
set logscale x 2
EOF
        for w in chat capacity; do
            if plot_commands "$w"; then plotted+=" $OUT/$w-throughput.png $OUT/$w-ttft.png"; fi
        done
    } > "$OUT/plots.gp"
    if [ -n "$plotted" ] && gnuplot "$OUT/plots.gp"; then log "plots:$plotted"; fi
else
    log "no gnuplot: no plots"
fi

log "results: $OUT/results.md (tables), $OUT/*.json (every number), $OUT/results.tsv"
cat "$OUT/results.md"
