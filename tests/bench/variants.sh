#!/usr/bin/env bash
# One model's build with other kernel flags against its plain build, on the GPU machine, in one run:
# the variants compiled in parallel (build/var<i>-<model>/), then every binary benchmarked in turn,
# REPS rounds (default 2), so that run-to-run drift hits all of them alike:
#   VARIANTS='-DA=1|-DB=2' BENCH_FLAGS='--bench-depths 0 -n 64' bash tests/bench/variants.sh MODEL...
# MODEL: a name under models/, benchmarked as its random-weight bf16 shape (bench_model.sh).
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/gpu_env.sh
. tests/bench/bench_model.sh
[ $# -ge 1 ] || { echo "usage: VARIANTS='-DA=1|-DB=2' bash tests/bench/variants.sh MODEL..." >&2; exit 2; }
IFS='|' read -ra variants <<<"${VARIANTS:-}"
for m in "$@"; do
    d=build/bench-models/bench-$m
    bench_model "$m" || exit 1
    for i in "${!variants[@]}"; do
        rm -rf "build/var$i-$m"
        make -s MODEL="$d" OUT="build/var$i-$m" EXTRA_NVCCFLAGS="${variants[$i]}" >/dev/null &
    done
    wait
    for r in $(seq "${REPS:-2}"); do
        echo "== $m, plain, round $r"
        timeout 300 "build/bench-$m/ingot" -m "$d" --device cuda --bench -n 128 ${BENCH_FLAGS:-}
        for i in "${!variants[@]}"; do
            echo "== $m, ${variants[$i]}, round $r"
            timeout 300 "build/var$i-$m/ingot" -m "$d" --device cuda --bench -n 128 ${BENCH_FLAGS:-} ||
                echo "variants.sh: ${variants[$i]} failed"
        done
    done
done
