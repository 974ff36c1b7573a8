#!/usr/bin/env bash
# The fuzz targets on the GPU machine's spare CPU cores (16 there, 2 here), beside a device call's
# own work. The machine has no clang: the targets are built here and carried with the shared
# libraries they link (libmicrohttpd, gnutls, libomp), the fuzz model and the corpora grown so far.
#   here:   bash tests/fuzz/device.sh pack              -> build/fuzz-device.tar.xz (about 6 MB): carry it
#   there:  bash tests/fuzz/device.sh start SECONDS TARGET...   one worker per name (names may repeat,
#                                                               e.g. fuzz_server twice), in the background
#           ... the call's own work ...
#           bash tests/fuzz/device.sh collect $OUT/fuzz.tar.xz  waits for the workers; packs the grown
#                                                               corpora, crashes, logs and a summary
#   here:   tar xJf FILES_AT/fuzz.tar.xz -C build/   (corpora into build/fuzz/corpus, crashes beside)
# The targets were built with this checkout's absolute path in them (the tokenizer, the fuzz model):
# there that path is made a link to the repository. Each worker runs as `make fuzz` runs a target.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
F=$root/build/fuzz
case "${1:-}" in
pack)
    targets=$(ls tests/fuzz/fuzz_*.c | xargs -n1 basename | sed 's/\.c$//')
    make -s $(for t in $targets; do echo "build/fuzz/$t"; done) || exit 1
    stage=$(mktemp -d)
    mkdir -p "$stage/fuzz/bin" "$stage/fuzz/lib"
    for t in $targets; do cp "build/fuzz/$t" "$stage/fuzz/bin/"; done
    for l in $(for t in $targets; do ldd "build/fuzz/$t" | awk '/=>/ {print $3}'; done | sort -u |
               grep -v -e '/libc\.so' -e 'ld-linux' -e '/libm\.so'); do cp -L "$l" "$stage/fuzz/lib/"; done
    cp -r build/fuzz/tiny-llama "$stage/fuzz/"
    mkdir -p "$stage/fuzz/corpus" && cp -r build/fuzz/corpus/. "$stage/fuzz/corpus/" 2>/dev/null
    echo "$root" >"$stage/fuzz/built-at"
    tar cJf build/fuzz-device.tar.xz -C "$stage" fuzz && rm -rf "$stage"
    echo "device.sh: carry [\"build/fuzz-device.tar.xz\"]; there: bash tests/fuzz/device.sh start SECONDS TARGET..."
    ;;
start)
    [ $# -ge 3 ] || { echo "usage: bash tests/fuzz/device.sh start SECONDS TARGET..." >&2; exit 2; }
    secs=$2
    shift 2
    if [ ! -x "$F/bin/fuzz_json" ]; then
        [ -e build/fuzz-device.tar.xz ] || { echo "device.sh: build/fuzz-device.tar.xz is not here: carry it" >&2; exit 1; }
        mkdir -p build && tar xJf build/fuzz-device.tar.xz -C build || exit 1
    fi
    built=$(cat "$F/built-at")
    if [ "$built" != "$root" ]; then
        [ -e "$built" ] && [ ! -L "$built" ] && { echo "device.sh: $built (where the targets were built) exists here and is not a link" >&2; exit 1; }
        mkdir -p "$(dirname "$built")" && ln -sfn "$root" "$built" || { echo "device.sh: cannot link $built to $root" >&2; exit 1; }
    fi
    mkdir -p "$F/log"
    i=0
    for t in "$@"; do
        i=$((i + 1))
        [ -x "$F/bin/$t" ] || { echo "device.sh: no target $t" >&2; exit 1; }
        mkdir -p "$F/corpus/$t"
        extra=""
        [ "$t" = fuzz_cli ] && extra="-detect_leaks=0 -timeout=60"
        LD_LIBRARY_PATH=$F/lib setsid nohup "$F/bin/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
            -max_len=65536 -print_final_stats=1 -close_fd_mask=3 $extra -artifact_prefix="$F/crash-$t-" \
            "$F/corpus/$t" "$root/tests/fuzz/corpus/$t" >"$F/log/$t.$(date +%s).$i.log" 2>&1 &
    done
    sleep 5
    echo "device.sh: $(pgrep -fc "$F/bin/") workers running"
    ;;
collect)
    [ $# -ge 2 ] || { echo "usage: bash tests/fuzz/device.sh collect DEST.tar.xz" >&2; exit 2; }
    for _ in $(seq 900); do pgrep -f "$F/bin/" >/dev/null || break; sleep 1; done
    pkill -f "$F/bin/"
    for l in "$F"/log/*.log; do
        echo "$(basename "$l") $(grep -E '^Done [0-9]+ runs in [0-9]+ second' "$l" | tail -1) $(grep -cE 'ERROR|SUMMARY' "$l") error lines"
    done | tee "$F/summary.txt"
    ls "$F"/crash-* 2>/dev/null
    (cd build && tar cJf "$2" fuzz/corpus fuzz/summary.txt fuzz/log $(ls fuzz/crash-* 2>/dev/null))
    ;;
*)
    echo "usage: bash tests/fuzz/device.sh pack | start SECONDS TARGET... | collect DEST.tar.xz" >&2
    exit 2
    ;;
esac
