#!/usr/bin/env bash
# This tree against other revisions on the GPU, same random-weight models, same run, the binaries
# alternating (REPS rounds), so that a change is measured against what it changes:
#   git archive -o .stage/base.tar REV         (here: .git does not travel to the GPU machine)
#   bash tests/bench/ab.sh .stage/base.tar [.stage/other.tar ...]   (there, carrying .stage)
# Each side is named after its archive. BENCH_MODELS and BENCH_FLAGS as in gpu.sh; REPS (default 2).
# TESTS=1 first runs `make test-gpu` in every side (about 2 minutes each) and prints its summary, so
# one call can check prepared branches before it measures them.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/gpu_env.sh
. tests/bench/bench_model.sh
[ $# -ge 1 ] || { echo "usage: bash tests/bench/ab.sh BASE.tar [OTHER.tar ...] (git archive -o BASE.tar REV)" >&2; exit 2; }
here=$(pwd)
sides=(this)
for t in "$@"; do
    [ -f "$t" ] || { echo "ab.sh: $t: no such archive" >&2; exit 2; }
    name=$(basename "$t" .tar)
    rm -rf "/tmp/ab-$name" && mkdir -p "/tmp/ab-$name" && tar -xf "$t" -C "/tmp/ab-$name" || exit 1
    sides+=("$name")
done
if [ "${TESTS:-0}" = 1 ]; then
    for side in "${sides[@]}"; do
        dir=$here
        [ "$side" = this ] || dir=/tmp/ab-$side
        echo "== make test-gpu, $side: $( (cd "$dir" && . tests/gpu_env.sh && make -s test-gpu 2>&1) | tail -1)"
    done
fi
for m in ${BENCH_MODELS:-smollm2-135m-instruct llama-3.2-1b-instruct mistral-7b-instruct-v0.2}; do
    bench_model "$m" || exit 1
    d=$here/build/bench-models/bench-$m
    for side in "${sides[@]:1}"; do
        (cd "/tmp/ab-$side" && . tests/gpu_env.sh && make -s MODEL="$d" >/dev/null) || exit 1
    done
    for r in $(seq "${REPS:-2}"); do
        for side in "${sides[@]}"; do
            bin=build/bench-$m/ingot
            [ "$side" = this ] || bin=/tmp/ab-$side/build/bench-$m/ingot
            echo "== $m, $side, round $r"
            timeout 300 "$bin" -m "$d" --device cuda --bench -n 128 ${BENCH_FLAGS:-}
        done
    done
done
