# Sourced by the GPU scripts. bench_model NAME [QUANT]: the random-weight bf16 shape of models/NAME
# in build/bench-models/bench-NAME (synthesized once; config and tiny tokenizer copied), or with
# QUANT (q8_0, q4_0, q4_1) its quantized twin in bench-NAME-QUANT (codegen.synth --quant), and its
# binary build/bench-NAME[-QUANT]/ingot.
bench_model() {
    bench_model_dir "$1" "$2" && make -s MODEL="build/bench-models/bench-$1${2:+-$2}" >/dev/null
}
# bench_model_dir NAME [QUANT]: the weights and config only.
bench_model_dir() {
    local d=build/bench-models/bench-$1${2:+-$2}
    mkdir -p "$d"
    [ -e "$d/model.safetensors" ] || [ -e "$d/model.safetensors.index.json" ] || {
        # bf16, whatever the model's own file holds (the default model's config names its GGUF's formats)
        python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c.pop("quantization_config", None)
c["torch_dtype"] = "bfloat16"; json.dump(c, open(sys.argv[2], "w"), indent=2)' "models/$1/config.json" "$d/config.json"
        .venv/bin/python -m codegen.synth "$d" --dtype bf16 ${2:+--quant "$2"} >/dev/null
    }
    cp tests/models/tiny-tokenizer/tokenizer.json "$d/"
}
