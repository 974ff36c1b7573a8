# Sourced by the GPU scripts. bench_model NAME: the random-weight bf16 shape of models/NAME in
# build/bench-models/bench-NAME (synthesized once; config and tiny tokenizer copied), and its
# binary build/bench-NAME/ingot.
bench_model() {
    bench_model_dir "$1" && make -s MODEL="build/bench-models/bench-$1" >/dev/null
}
# bench_model_dir NAME: the weights and config only.
bench_model_dir() {
    local d=build/bench-models/bench-$1
    mkdir -p "$d"
    cp "models/$1/config.json" "$d/"
    sed -i 's/"float16"/"bfloat16"/' "$d/config.json"
    cp tests/models/tiny-tokenizer/tokenizer.json "$d/"
    [ -e "$d/model.safetensors" ] || [ -e "$d/model.safetensors.index.json" ] ||
        .venv/bin/python -m codegen.synth "$d" --dtype bf16 >/dev/null
}
