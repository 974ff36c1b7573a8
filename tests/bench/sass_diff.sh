#!/usr/bin/env bash
# Does a change alter the GPU's machine code? This tree's CUDA step against another revision's,
# compiled here (no GPU needed) for each model, compared function by function:
#   bash tests/bench/sass_diff.sh REV [MODEL ...]     (default models: the three bench shapes,
#                                                      tiny-d2048 and tiny-gqa; "generic": the
#                                                      generic build's bf16 copy)
# A refactor that keeps every kernel's SASS keeps its speed, so this answers before any GPU time is
# spent. Prints, per model, the functions only in REV, only here, and those whose SASS differs
# (addresses and encodings ignored). Needs nvcc and cuobjdump with nvdisasm: the CUDA toolkit's, or
# `pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm` (put their bin/ on the PATH).
# SASS_KEEP=DIR keeps both listings (DIR/before/MODEL.sass, DIR/now/MODEL.sass) to diff by hand.
# SASS_RENAME='OLD=NEW ...' renames REV's functions before they are paired (a kernel whose parameter
# type was renamed: SASS_RENAME='19model_layer_weights=10cuda_layer').
set -uo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 1 ] || { echo "usage: bash tests/bench/sass_diff.sh REV [MODEL ...]" >&2; exit 2; }
rev=$1
shift
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(smollm2-135m-instruct llama-3.2-1b-instruct mistral-7b-instruct-v0.2 tiny-d2048 tiny-gqa)
for tool in nvcc cuobjdump nvdisasm; do
    command -v "$tool" >/dev/null || { echo "sass_diff.sh: $tool not on the PATH" >&2; exit 2; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/base" && git archive "$rev" | tar -x -C "$work/base" || exit 1
ln -s "$(pwd)/.venv" "$work/base/.venv"

# sass TREE OUT MODEL: the model's CUDA step compiled in TREE (its forward_cuda.cu: hand-written in
# runtime/, or generated from the template in older revisions), disassembled into OUT/MODEL.sass
sass() {
    local tree=$1 out=$2 m=$3 gen=$2/gen-$3 src extra=() dir
    mkdir -p "$out"
    if [ "$m" = generic ]; then
        (cd "$tree" && .venv/bin/python -m codegen --generic --out "$gen" >/dev/null) || return 1
        extra=(-DMODEL_WEIGHT_DTYPE_BF16)
    else
        dir=models/$m
        [ -d "$tree/$dir" ] || dir=tests/models/$m
        (cd "$tree" && .venv/bin/python -m codegen "$dir" --out "$gen" >/dev/null) || return 1
    fi
    src=$tree/runtime/forward_cuda.cu
    [ -f "$src" ] || src=$gen/forward_cuda.cu
    nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I"$tree/runtime" -I"$gen" "${extra[@]}" -c "$src" \
        -o "$out/$m.o" && cuobjdump -sass "$out/$m.o" >"$out/$m.sass"
}

status=0
for m in "${models[@]}"; do
    sass "$work/base" "$work/a" "$m" & a=$!
    sass "$(pwd)" "$work/b" "$m" & b=$!
    wait $a && wait $b || { wait; echo "$m: did not compile" >&2; status=1; continue; }
    if [ -n "${SASS_KEEP:-}" ]; then
        mkdir -p "$SASS_KEEP/before" "$SASS_KEEP/now"
        cp "$work/a/$m.sass" "$SASS_KEEP/before/" && cp "$work/b/$m.sass" "$SASS_KEEP/now/"
    fi
    python3 - "$m" "$work/a/$m.sass" "$work/b/$m.sass" <<'PY' || status=1
import os, re, sys

def functions(path):
    out, name, body = {}, None, []
    for line in open(path):
        if line.strip().startswith("Function :"):
            if name:
                out[name] = body
            name, body = line.split(":", 1)[1].strip(), []
        elif name:
            line = re.sub(r"/\*[0-9a-f]{4}\*/|/\* 0x[0-9a-f]+ \*/", "", line).strip()
            if line:
                body.append(line)
    if name:
        out[name] = body
    return out

model, a, b = sys.argv[1], functions(sys.argv[2]), functions(sys.argv[3])
for pair in os.environ.get("SASS_RENAME", "").split():
    old, new = pair.split("=", 1)
    a = {n.replace(old, new): body for n, body in a.items()}
differ = sorted(f for f in set(a) & set(b) if a[f] != b[f])
print(f"{model}: {len(a)} functions before, {len(b)} now; only before {len(set(a) - set(b))}, "
      f"only now {len(set(b) - set(a))}, differing {len(differ)}")
for label, names in (("only before", sorted(set(a) - set(b))), ("only now", sorted(set(b) - set(a))), ("differs", differ)):
    for n in names:
        print(f"  {label}: {n}")
sys.exit(1 if differ or set(a) != set(b) else 0)
PY
done
exit $status
