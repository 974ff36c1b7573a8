#!/usr/bin/env bash
# GPU checks and decode benchmarks in one call on the GPU machine:
#   bash tests/bench/gpu.sh [test|bench|all|compare|trace]   (default all: test and bench)
# test: make test-gpu (GPU against CPU and transformers on the tiny models, memcheck; the default
# model's checks too when its weights are staged). bench: --bench on random-weight shapes of
# SmolLM2-135M, Llama-3.2-1B and Mistral-7B (bf16), synthesized there, into build/bench-models/.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/gpu_env.sh
what=${1:-all}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader
if [ "$what" = test ] || [ "$what" = all ]; then
    make -s test-gpu 2>&1 | tail -25
fi
. tests/bench/bench_model.sh
if [ "$what" = bench ] || [ "$what" = all ]; then
    for m in ${BENCH_MODELS:-smollm2-135m-instruct llama-3.2-1b-instruct mistral-7b-instruct-v0.2}; do
        d=build/bench-models/bench-$m
        bench_model "$m" || exit 1
        timeout 300 "build/bench-$m/ingot" -m "$d" --device cuda --bench -n 128 ${BENCH_FLAGS:-}
        # the same model built with other plan decisions or nvcc flags, in the same run:
        # VARIANTS="mlp_fused=0|-DX=1" (a word FIELD=N sets a plan decision, one starting with - goes to nvcc)
        IFS='|' read -ra variants <<<"${VARIANTS:-}"
        for v in "${variants[@]}"; do
            plan=() nvcc=()
            for w in $v; do case $w in -*) nvcc+=("$w") ;; *) plan+=("$w") ;; esac; done
            rm -f "build/bench-$m/forward_cuda.o"
            make -s MODEL="$d" PLAN="${plan[*]}" EXTRA_NVCCFLAGS="${nvcc[*]}" >/dev/null || exit 1
            echo "== variant: $v"
            timeout 300 "build/bench-$m/ingot" -m "$d" --device cuda --bench -n 128 ${BENCH_FLAGS:-}
            rm -f "build/bench-$m/forward_cuda.o"
        done
        make -s MODEL="$d" >/dev/null || exit 1
    done
fi
# trace: each model built with -DINGOT_TRACE, one decode step at depth TRACE_DEPTH (default 0) timed
# block by block (tests/bench/step_trace.py), then built again without it.
if [ "$what" = trace ]; then
    for m in ${BENCH_MODELS:-smollm2-135m-instruct llama-3.2-1b-instruct mistral-7b-instruct-v0.2}; do
        d=build/bench-models/bench-$m
        bench_model "$m" || exit 1
        rm -f "build/bench-$m/forward_cuda.o"
        make -s MODEL="$d" EXTRA_NVCCFLAGS="-DINGOT_TRACE ${EXTRA_NVCCFLAGS:-}" >/dev/null || exit 1
        echo "== trace: $m at depth ${TRACE_DEPTH:-0}"
        INGOT_TRACE_FILE=/tmp/trace-$m.bin timeout 300 "build/bench-$m/ingot" -m "$d" --device cuda --bench -n 8 \
            --bench-depths "${TRACE_DEPTH:-0}" | grep "decode at"
        .venv/bin/python tests/bench/step_trace.py /tmp/trace-$m.bin --config "$d/config.json"
        rm -f "build/bench-$m/forward_cuda.o"
        make -s MODEL="$d" >/dev/null || exit 1
    done
fi
# compare: the specialized and the generic build on the GPU, each shape (tests/bench/compare.py),
# tables and charts in build/compare/bench-<model>/; COMPARE_FLAGS adds to compare.py's flags.
if [ "$what" = compare ]; then
    make -s GENERIC=1 >/dev/null || exit 1
    for m in ${BENCH_MODELS:-smollm2-135m-instruct llama-3.2-1b-instruct mistral-7b-instruct-v0.2}; do
        bench_model "$m" || exit 1
        # the middle build: the specialized binary with the generic plan (make compare's)
        make -s MODEL="build/bench-models/bench-$m" PLAN=generic GEN="generated/bench-$m-generic-plan" \
            OUT="build/bench-$m-generic-plan" >/dev/null || exit 1
        .venv/bin/python tests/bench/compare.py "build/bench-models/bench-$m" --devices cuda ${COMPARE_FLAGS:-}
    done
fi
