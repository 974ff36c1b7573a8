"""Writes tests/data/ggml_k_quants.npz: rows of 256 weights and ggml's own Q4_K, Q5_K and Q6_K
blocks of them, which tests/test_quantize.py compares codegen/kquants.py's bytes with.

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.16 -d /tmp
    .venv/bin/python tests/ggml_k_fixture.py /tmp/llama_cpp_python-0.3.16.tar.gz

The sdist is llama-cpp-python 0.3.16 (PyPI), sha256
34ed0f9bd9431af045bb63d9324ae620ad0536653740e9bb163a2e1fcb973be6; another file is refused. From it
vendor/llama.cpp/ggml/{include,src} is extracted into a temporary directory, and ggml-quants.c is
compiled with tests/ggml_k_ref.c (a filter around quantize_row_q{4,5,6}_K_ref) by gcc -O2 with no
-march, as llama.cpp builds ggml-base (no FMA, so no contraction; -ffp-contract=off says so), and
-DNDEBUG as a release build. The rows go through it once per format.

The rows (ROWS in all, each one super-block): random ones of the spreads real weights have, with
their values rounded to bf16 as a checkpoint's are; rows whose sub-blocks differ in scale by up to
10^4 (a sub-block's 6-bit scale rounding to 0 keeps the scale search's levels); and the edge cases:
zeros, constants of either sign, one outlier among zeros or small values, only negative or only
positive values, tiny and subnormal magnitudes, large ones, exact halves of a step, one sub-block
of zeros. Deterministic: the same sdist gives the same file.
"""

import hashlib
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

SDIST_SHA256 = "34ed0f9bd9431af045bb63d9324ae620ad0536653740e9bb163a2e1fcb973be6"
GGML = "llama_cpp_python-0.3.16/vendor/llama.cpp/ggml/"
OUT = Path(__file__).resolve().parent / "data" / "ggml_k_quants.npz"
FORMATS = {"Q4_K": "q4_K", "Q5_K": "q5_K", "Q6_K": "q6_K"}  # our name: the filter's argument


def bf16(x):
    """float32 -> float32 rounded to bf16 (nearest even), as a bf16 checkpoint holds weights."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def fixture_rows(rng) -> np.ndarray:
    """(rows, 256) float32: random rows, then rows of mixed sub-block scales, then edge cases."""
    rows = []
    for std in (1e-3, 0.02, 0.05, 1.0, 30.0):
        rows += list(bf16(rng.standard_normal((24, 256)) * std))
    rows += list(bf16(rng.standard_t(3, (16, 256)) * 0.02))  # heavy tails, as real weights have
    rows += list(bf16(rng.uniform(-0.1, 0.3, (8, 256))))
    for _ in range(32):  # sub-blocks of 16 scaled 10^0 .. 10^-4: small ones' scales round to 0
        rows.append(bf16(rng.standard_normal(256) * np.repeat(10.0 ** rng.uniform(-4, 0, 16), 16) * 0.05))
    edge = [np.zeros(256), np.full(256, 0.25), np.full(256, -0.25), np.full(256, 3e-3)]
    one = np.zeros(256)
    one[77] = 0.5
    edge.append(one)
    small = rng.standard_normal(256) * 1e-3
    small[200] = 0.8
    edge.append(small)
    edge.append(-np.abs(rng.standard_normal(256)) * 0.05)
    edge.append(np.abs(rng.standard_normal(256)) * 0.05)
    edge.append(rng.standard_normal(256) * 1e-8)
    edge.append(rng.standard_normal(256) * 1e-30)
    edge.append(rng.standard_normal(256) * 1e-40)  # subnormal: a scale overflows to infinity
    edge.append(rng.standard_normal(256) * 3e3)
    edge.append(np.arange(256) - 127.5)
    edge.append((np.arange(256) % 32 - 16) * 0.5)  # exact halves of a step
    edge.append(np.tile(np.linspace(-1, 1, 32), 8))
    sub0 = rng.standard_normal(256) * 0.05
    sub0[64:96] = 0  # one sub-block of zeros
    edge.append(sub0)
    signs = np.where(np.arange(256) % 2, 1.0, -1.0) * 0.01
    edge.append(signs)
    edge.append(np.where(rng.random(256) < 0.9, 0.0, rng.standard_normal(256)))  # sparse
    rows += edge
    return np.array(rows, dtype=np.float32)


def main(argv) -> int:
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    sdist = Path(argv[1])
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        print(f"ggml_k_fixture: {sdist}: sha256 {digest}, expected {SDIST_SHA256} (llama-cpp-python 0.3.16)",
              file=sys.stderr)
        return 1
    x = fixture_rows(np.random.default_rng(59))
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith((GGML + "include/", GGML + "src/"))]
        tar.extractall(tmp, members=members, filter="data")
        ggml = Path(tmp) / GGML
        exe = Path(tmp) / "ggml_k_ref"
        subprocess.run(["gcc", "-O2", "-std=c11", "-ffp-contract=off", "-DNDEBUG", f"-I{ggml / 'include'}",
                        f"-I{ggml / 'src'}", f"-I{ggml / 'src' / 'ggml-cpu'}", str(ggml / "src" / "ggml-quants.c"),
                        str(Path(__file__).resolve().parent / "ggml_k_ref.c"), "-o", str(exe), "-lm"], check=True)
        blocks = {}
        for fmt, arg in FORMATS.items():
            r = subprocess.run([str(exe), arg], input=x.tobytes(), capture_output=True, check=True)
            blocks[fmt] = np.frombuffer(r.stdout, np.uint8).reshape(len(x), -1)
    OUT.parent.mkdir(exist_ok=True)
    np.savez_compressed(OUT, rows=x, **blocks)
    print(f"ggml_k_fixture: {OUT}: {len(x)} rows, {OUT.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
