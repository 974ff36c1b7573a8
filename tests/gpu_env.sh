# Sourced on the GPU machine, which has no network and its own python3 (a venv holding torch,
# transformers, numpy, safetensors, tokenizers, jinja2, pytest): .venv/bin/python becomes a wrapper
# around it (a symlink would lose that venv) and make is kept from installing requirements.txt.
if [ ! -e .venv/bin/python ] || ! grep -q "exec python3" .venv/bin/python; then
    rm -rf .venv
    mkdir -p .venv/bin
    printf '#!/bin/sh\nexec python3 "$@"\n' >.venv/bin/python
    chmod +x .venv/bin/python
fi
touch .venv/.installed
