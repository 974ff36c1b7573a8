#!/usr/bin/env bash
# --serve's HTTP library for a build machine with no network and no libmicrohttpd (the GPU machine):
# the Makefile needs GNU libmicrohttpd's header and static library, and gnutls to link against.
#   here:  bash tests/bench/stage_mhd.sh pack     -> build/stage-mhd (about 7 MB): carry it
#   there: bash tests/bench/stage_mhd.sh install  (root) before make: the header and library into
#          /usr/local, gnutls the machine's own where it has one (the carried copy, and the libraries
#          it needs, otherwise). Does nothing where the header is already found.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=build/stage-mhd
lib=/usr/lib/$(gcc -dumpmachine)
case "${1:-}" in
pack)
    [ -e /usr/include/microhttpd.h ] && [ -e "$lib/libmicrohttpd.a" ] ||
        { echo "stage_mhd.sh: libmicrohttpd-dev is not installed here (apt-get install libmicrohttpd-dev)" >&2; exit 1; }
    rm -rf "$out" && mkdir -p "$out/lib"
    cp /usr/include/microhttpd.h "$lib/libmicrohttpd.a" "$out/"
    # gnutls and what it links, never the C library or the loader
    for l in $(ldd "$lib/libgnutls.so.30" | awk '/=>/ {print $3}' | grep -v -e '/libc\.so' -e '/ld-linux') "$lib/libgnutls.so.30"; do
        cp -L "$l" "$out/lib/"
    done
    echo "stage_mhd.sh: carry [\"$out\"], then run: bash tests/bench/stage_mhd.sh install"
    ;;
install)
    echo '#include <microhttpd.h>' | cc -E -x c - >/dev/null 2>&1 && exit 0
    [ -e "$out/microhttpd.h" ] || { echo "stage_mhd.sh: $out is not here: carry it (this script's header)" >&2; exit 1; }
    cp "$out/microhttpd.h" /usr/local/include/
    cp "$out/libmicrohttpd.a" /usr/local/lib/
    own=$(ls /usr/lib/x86_64-linux-gnu/libgnutls.so.30 /lib/x86_64-linux-gnu/libgnutls.so.30 2>/dev/null | head -1 || true)
    if [ -n "$own" ]; then
        ln -sf "$own" /usr/local/lib/libgnutls.so
    else
        cp "$out"/lib/* /usr/local/lib/ && ln -sf libgnutls.so.30 /usr/local/lib/libgnutls.so
    fi
    ldconfig 2>/dev/null || true
    echo "stage_mhd.sh: libmicrohttpd staged (gnutls: ${own:-carried})"
    ;;
*)
    echo "usage: bash tests/bench/stage_mhd.sh pack | install" >&2
    exit 2
    ;;
esac
