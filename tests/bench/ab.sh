#!/usr/bin/env bash
# This tree against other revisions on the GPU, same random-weight models, same run, the binaries
# alternating (REPS rounds), so that a change is measured against what it changes:
#   git archive -o .stage/base.tar REV         (here: .git does not travel to the GPU machine)
#   bash tests/bench/ab.sh .stage/base.tar [.stage/other.tar ...]   (there, carrying .stage)
# Each side is named after its archive. BENCH_MODELS and BENCH_FLAGS as in gpu.sh, a model NAME:QUANT
# (q8_0, q4_0, q4_1: bench_model_dir's quantized twin) beside the bf16 ones; REPS (default 2).
# TESTS=1 also runs the GPU tests (make test-gpu's pytest, without its default-model build, whose
# checks skip unless that model is staged) in every side, beside the builds (about 3 minutes),
# TESTS=this in this tree only, and prints its summary (the log: /tmp/ab-tests-SIDE.log), so one
# call can check prepared branches before it measures them; a failure stops the script before the
# benchmarks (BENCH_ON_FAIL=1: it measures anyway).
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
make -s venv >/dev/null || exit 1
models=()
for m in ${BENCH_MODELS:-smollm2-135m-instruct llama-3.2-1b-instruct mistral-7b-instruct-v0.2}; do
    q=
    [[ $m == *:* ]] && q=${m#*:}
    bench_model_dir "${m%%:*}" "$q" || exit 1
    models+=("${m%%:*}${q:+-$q}") # as bench_model_dir names it: bench-NAME[-QUANT]
done
# Every side's builds (and with TESTS=1 its `make test-gpu`, in a copy of its tree so that it races
# no build) at once: nvcc compiles one file on one core. The benchmarks wait for all of them.
tested() { [ "${TESTS:-0}" = 1 ] || { [ "${TESTS:-0}" = this ] && [ "$1" = this ]; }; }
if tested this; then
    rm -rf /tmp/ab-this && mkdir -p /tmp/ab-this &&
        tar --exclude=./build --exclude=./.stage -cf - . | tar -xf - -C /tmp/ab-this || exit 1
fi
jobs=()
for side in "${sides[@]}"; do
    dir=$here
    [ "$side" = this ] || dir=/tmp/ab-$side
    (cd "$dir" && . tests/gpu_env.sh && for m in "${models[@]}"; do
        make -s MODEL="$here/build/bench-models/bench-$m" >/dev/null || exit 1
    done) &
    jobs+=($!)
    if tested "$side"; then
        tdir=$dir
        [ "$side" = this ] && tdir=/tmp/ab-this
        (cd "$tdir" && . tests/gpu_env.sh && .venv/bin/python -m pytest -q -s tests/test_gpu.py \
            tests/test_gpu_stages.py ${PYTEST_ARGS:-} >"/tmp/ab-tests-$side.log" 2>&1) &
        jobs+=($!)
    fi
done
failed=0
for j in "${jobs[@]}"; do wait "$j" || failed=1; done
for side in "${sides[@]}"; do
    tested "$side" && echo "== GPU tests, $side: $(tail -1 "/tmp/ab-tests-$side.log")"
done
if [ "$failed" != 0 ]; then
    echo "ab.sh: a build or a test failed" >&2
    for side in "${sides[@]}"; do grep -E "FAILED|Error" "/tmp/ab-tests-$side.log" 2>/dev/null | head -20; done
    # BENCH_ON_FAIL=1: measure anyway (a device call is dear; the numbers of code that fails a test
    # are not for landing). A build that failed has no binary to run: its rounds print an error.
    [ "${BENCH_ON_FAIL:-0}" = 1 ] || exit 1
    echo "ab.sh: BENCH_ON_FAIL=1: benchmarking anyway" >&2
fi
# the tensor cores' rate a plain GEMM reaches in this run: the prompt's TFLOP/s over it is its share
python3 tests/bench/gemm_probe.py || echo "ab.sh: no GEMM probe (above): prompt shares cannot be given" >&2
for m in "${models[@]}"; do
    d=$here/build/bench-models/bench-$m
    for r in $(seq "${REPS:-2}"); do
        for side in "${sides[@]}"; do
            bin=build/bench-$m/ingot
            [ "$side" = this ] || bin=/tmp/ab-$side/build/bench-$m/ingot
            echo "== $m, $side, round $r"
            timeout 300 "$bin" -m "$d" --device cuda --bench -n 128 ${BENCH_FLAGS:-}
        done
    done
done
