#!/usr/bin/env bash
# One model's build with other plan decisions or kernel flags against its plain build, on the GPU
# machine, in one run:
# the variants compiled in parallel (build/var<i>-<model>/), then every binary benchmarked in turn,
# REPS rounds (default 2), so that run-to-run drift hits all of them alike:
#   VARIANTS='mlp_fused=0|-DA=1' BENCH_FLAGS='--bench-depths 0 -n 64' bash tests/bench/variants.sh MODEL...
# A word FIELD=N sets a plan decision (make PLAN=, codegen/plan.py); one starting with - goes to nvcc.
# MODEL: a name under models/, benchmarked as its random-weight bf16 shape (bench_model.sh).
# PROMPTS='9 24 65': instead, each round times prompts of those lengths at depth 0 (--bench-prompt,
# decode left out), a column each in the table.
# TRACE=1: every variant (no plain build) built with -DINGOT_TRACE and its decode step at depth
# TRACE_DEPTH (default 0) traced block by block (tests/bench/step_trace.py), one after another.
# Without it, the rounds end in a table a model (tests/bench/variants_summary.py): each variant's
# tok/s over the rounds and the change of its mean against the plain build's.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/gpu_env.sh
. tests/bench/bench_model.sh
[ $# -ge 1 ] || { echo "usage: VARIANTS='mlp_fused=0|-DA=1' bash tests/bench/variants.sh MODEL..." >&2; exit 2; }
IFS='|' read -ra variants <<<"${VARIANTS:-}"
trace=${TRACE:-0}
# bench BINARY MODEL_DIR: one round's run of a binary
bench() {
    if [ -z "${PROMPTS:-}" ]; then
        timeout 300 "$1" -m "$2" --device cuda --bench -n 128 ${BENCH_FLAGS:-}
        return
    fi
    local n
    for n in $PROMPTS; do
        timeout 300 "$1" -m "$2" --device cuda --bench -n 2 --bench-depths 0 --bench-prompt "$n" ${BENCH_FLAGS:-} | grep -v "decode at"
    done
}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for m in "$@"; do
    d=build/bench-models/bench-$m
    # the sources generated once before the parallel builds, which share them (a trace builds no plain binary)
    if [ "$trace" = 1 ]; then bench_model_dir "$m" && make -s MODEL="$d" generate >/dev/null || exit 1; else bench_model "$m" || exit 1; fi
    for i in "${!variants[@]}"; do
        rm -rf "build/var$i-$m" "generated/var$i-$m"
        plan=() nvcc=()
        for w in ${variants[$i]}; do case $w in -*) nvcc+=("$w") ;; *) plan+=("$w") ;; esac; done
        [ "$trace" = 1 ] && nvcc=(-DINGOT_TRACE "${nvcc[@]}")
        make -s MODEL="$d" OUT="build/var$i-$m" GEN="generated/var$i-$m" PLAN="${plan[*]}" EXTRA_NVCCFLAGS="${nvcc[*]}" >/dev/null &
    done
    wait
    if [ "$trace" = 1 ]; then
        for i in "${!variants[@]}"; do
            echo "== trace: $m, ${variants[$i]}, depth ${TRACE_DEPTH:-0}"
            INGOT_TRACE_FILE="/tmp/trace-var$i-$m.bin" timeout 300 "build/var$i-$m/ingot" -m "$d" --device cuda --bench -n 8 \
                --bench-depths "${TRACE_DEPTH:-0}" | grep "decode at"
            .venv/bin/python tests/bench/step_trace.py "/tmp/trace-var$i-$m.bin" --config "$d/config.json"
        done
        continue
    fi
    for r in $(seq "${REPS:-2}"); do
        echo "== $m, plain, round $r"
        bench "build/bench-$m/ingot" "$d"
        for i in "${!variants[@]}"; do
            echo "== $m, ${variants[$i]}, round $r"
            bench "build/var$i-$m/ingot" "$d" || echo "variants.sh: ${variants[$i]} failed"
        done
    done 2>&1 | tee -a "$log"
done
if [ "$trace" != 1 ]; then
    echo
    .venv/bin/python tests/bench/variants_summary.py "$log"
fi
