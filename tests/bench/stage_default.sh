#!/usr/bin/env bash
# The default model's weights on the GPU machine, whose calls carry at most 64 MiB and which has no
# network: its GGUF (94 MB) goes in three parts of at most 32 MiB, one call each, back to back (a
# machine idle for 30 s is handed back, and its files with it), with the gguf package for the import.
# Thirds rather than halves leave each call room for other cargo (the server's wheels, fuzzers).
#   here:   bash tests/bench/stage_default.sh split
#           calls: carry ["downloads/gguf.part.aa", "build/stage"], then ["downloads/gguf.part.ab"],
#                  then ["downloads/gguf.part.ac"], the last one running
#                  bash tests/bench/stage_default.sh join && make -s test-gpu
#   there:  bash tests/bench/stage_default.sh join
# join puts the parts together, checks the GGUF's sha256 (codegen/fetch_default.py's) and converts
# it into models/smollm2-135m-instruct as `make run` does here. Everything it writes is git-ignored
# (downloads/, build/, models/*/model.safetensors), so no part travels with the working tree.
set -euo pipefail
cd "$(dirname "$0")/../.."
gguf=downloads/SmolLM2-135M-Instruct.Q4_1.gguf
case "${1:-}" in
split)
    [ -e "$gguf" ] || .venv/bin/python -m codegen.fetch_default
    rm -f downloads/gguf.part.*
    split -b 32m "$gguf" downloads/gguf.part.
    [ "$(ls downloads/gguf.part.* | wc -l)" = 3 ] || { echo "stage_default.sh: the GGUF did not split in three parts" >&2; exit 1; }
    rm -rf build/stage && mkdir -p build/stage
    cp -r "$(.venv/bin/python -c 'import gguf, os; print(os.path.dirname(gguf.__file__))')" build/stage/
    rm -rf build/stage/gguf/__pycache__
    echo "stage_default.sh: carry [\"downloads/gguf.part.aa\", \"build/stage\"], then [\"downloads/gguf.part.ab\"], then [\"downloads/gguf.part.ac\"]"
    ;;
join)
    for p in downloads/gguf.part.aa downloads/gguf.part.ab downloads/gguf.part.ac build/stage/gguf; do
        [ -e "$p" ] || { echo "stage_default.sh: $p is not here: carry it (this script's header)" >&2; exit 1; }
    done
    cat downloads/gguf.part.aa downloads/gguf.part.ab downloads/gguf.part.ac >"$gguf"
    PYTHONPATH=build/stage python3 - "$gguf" <<'EOF'
import sys
from pathlib import Path
from codegen.fetch_default import GGUF_SHA256, sha256
got = sha256(Path(sys.argv[1]))
if got != GGUF_SHA256:
    sys.exit(f"stage_default.sh: {sys.argv[1]}: sha256 {got}, expected {GGUF_SHA256}")
EOF
    PYTHONPATH=build/stage python3 -m codegen.gguf_import "$gguf" models/smollm2-135m-instruct
    ;;
*)
    echo "usage: bash tests/bench/stage_default.sh split|join" >&2
    exit 2
    ;;
esac
