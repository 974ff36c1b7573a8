#!/usr/bin/env bash
# This tree against another revision on the GPU, same random-weight models, same run, the two
# binaries alternating (REPS rounds), so that a change is measured against what it changes:
#   git archive -o .stage/base.tar REV        (here: .git does not travel to the GPU machine)
#   bash tests/bench/ab.sh .stage/base.tar     (there, carrying .stage/base.tar)
# BENCH_MODELS and BENCH_FLAGS as in gpu.sh; REPS (default 2).
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/gpu_env.sh
. tests/bench/bench_model.sh
[ -f "${1:-}" ] || { echo "usage: bash tests/bench/ab.sh BASE.tar (git archive -o BASE.tar REV)" >&2; exit 2; }
base=/tmp/ab-base
rm -rf "$base" && mkdir -p "$base" && tar -xf "$1" -C "$base" || exit 1
here=$(pwd)
for m in ${BENCH_MODELS:-smollm2-135m-instruct llama-3.2-1b-instruct mistral-7b-instruct-v0.2}; do
    bench_model "$m" || exit 1
    d=$here/build/bench-models/bench-$m
    (cd "$base" && . tests/gpu_env.sh && make -s MODEL="$d" >/dev/null) || exit 1
    for r in $(seq "${REPS:-2}"); do
        for side in this base; do
            bin=build/bench-$m/ingot
            [ "$side" = base ] && bin=$base/build/bench-$m/ingot
            echo "== $m, $side, round $r"
            timeout 300 "$bin" -m "$d" --device cuda --bench -n 128 ${BENCH_FLAGS:-}
        done
    done
done
