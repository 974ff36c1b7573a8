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
# --serve's HTTP library, which every build links and this machine lacks (make would try apt-get,
# and it has no network): the carried build/stage-mhd installed (tests/bench/stage_mhd.sh), or a
# line that says to carry it, before any make fails on it.
if ! echo '#include <microhttpd.h>' | cc -E -x c - >/dev/null 2>&1; then
    if [ -d build/stage-mhd ]; then
        bash tests/bench/stage_mhd.sh install >/dev/null || echo "gpu_env.sh: stage_mhd.sh install failed" >&2
    else
        echo "gpu_env.sh: no libmicrohttpd here and build/stage-mhd not carried: every build will fail;" \
            "run 'bash tests/bench/stage_mhd.sh pack' on the build machine and carry build/stage-mhd" >&2
    fi
fi
