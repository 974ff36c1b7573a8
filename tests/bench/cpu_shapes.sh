#!/usr/bin/env bash
# CPU decode speed on synthesized full-size shapes (Llama-3.2-1B, Mistral-7B, bf16 random weights,
# the tiny test tokenizer), for both matvec stream counts, as run on the GPU machine's 16 cores for
# docs/performance.md (D101, the plan's cpu_streams). Uses the machine's own python3 packages
# (tests/gpu_env.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
lscpu | grep -E "Model name|^CPU\(s\)|Thread|L3" || true
. tests/gpu_env.sh
models=${MODELS:-llama-3.2-1b-instruct mistral-7b-instruct-v0.2}
for m in $models; do
    t0=$(date +%s.%N)
    [ -e "models/$m/model.safetensors" ] || [ -e "models/$m/model.safetensors.index.json" ] ||
        .venv/bin/python -m codegen.synth "models/$m" --dtype bf16 >/dev/null
    cp tests/models/tiny-tokenizer/tokenizer.json "models/$m/" # speed work only: no chat template
    t1=$(date +%s.%N)
    for s in ${STREAMS:-1 4}; do # CPU_STREAMS, or "matvec/paired" for CPU_STREAMS/CPU_PAIRED_STREAMS
        rm -rf build/runtime "build/$m" # the objects do not depend on EXTRA_CFLAGS
        make -s MODEL="models/$m" NVCC= EXTRA_CFLAGS="-DCPU_STREAMS=${s%/*} -DCPU_PAIRED_STREAMS=${s#*/}" >/dev/null
        mkdir -p build/variants && cp "build/$m/ingot" "build/variants/$m.streams${s/\//-}"
    done
    t2=$(date +%s.%N)
    echo "$m: synth $(python3 -c "print(round($t1 - $t0, 1))") s, two builds $(python3 -c "print(round($t2 - $t1, 1))") s"
done
for m in $models; do
    for s in ${STREAMS:-1 4}; do
        echo "== $m, CPU_STREAMS/CPU_PAIRED_STREAMS=$s"
        "build/variants/$m.streams${s/\//-}" --bench --threads "${THREADS:-16}" -n 32
    done
done
