"""The quantized weight formats through the decode step's matvec core: tests/cuda_format_test.cu runs
matvec_residual_body<W> (o_proj and down's body) for each of GGUF's Q8_0, Q4_0, Q4_1, Q4_K, Q5_K and
Q6_K on random GGUF blocks, repacked by the upload's kernel, and this checks the result against the
`gguf` package's dequantizer and NumPy in float64; and W::to_f32 (the embedding's lookup) against
that dequantizer bit for bit.

The matvec takes its inputs as 16-bit integers a block of 32 (stage_xq, cuda_weights.cuh's
xq_chunk): x16 = rint(x * (32767 / amax)) and dx = amax / 32767 in fp32, reproduced here in NumPy
(the product rounded once, ties to even: float64's product of two floats is exact). Its integer
sums are exact and each chunk's is scaled once, (d dx) s, so against float64 on the quantized inputs
dx * x16 the GPU differs only by fp32 roundings and summation order: RTOL_DOT of
sum_k |w_k xq_k| + |x0|, the bound tests/test_gpu_stages.py derives for every matvec. Against the
fp32 inputs themselves each input moves by at most dx / 2 more: the second bound adds
sum_k |w_k| dx_k / 2. A weight read from the wrong block, a nibble swapped, a chunk dropped or an
input's integer off by one in a block is far above the first. The inputs come in blocks of
magnitudes 1e-3 to 10, the first block zero.

Compiling needs nvcc (CI has it); running needs a GPU (skipped elsewhere)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, make
from test_gpu import gpu_present

RTOL_DOT = 2e-5
NVCC = subprocess.run(["bash", "-c", "command -v nvcc || ls /usr/local/cuda/bin/nvcc"], capture_output=True, text=True).stdout.split()
OUT = REPO / "build" / "format-test"


def build_format_test():
    """build/format-test/cuda_format_test against the Mistral-7B shape's plan (the matvec's constants)"""
    if not NVCC:
        pytest.skip("no nvcc here: the CUDA sources are compiled where the toolkit is")
    make("build/runtime/probe_cuda.o", "build/runtime/errors.o")
    gen = OUT / "gen"
    r = subprocess.run([sys.executable, "-m", "codegen", "models/mistral-7b-instruct-v0.2", "--out", str(gen)], cwd=REPO,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    binary = OUT / "cuda_format_test"
    cmd = [NVCC[0], "-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-Iruntime", f"-I{gen}", "-Xcompiler",
           "-Wall,-Wextra", "-Werror", "all-warnings", "tests/cuda_format_test.cu", "build/runtime/probe_cuda.o",
           "build/runtime/errors.o", "-o", str(binary)]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    return binary


@pytest.fixture(scope="module")
def format_test():
    return build_format_test()


def test_format_test_compiles(format_test):
    assert format_test.exists()


@pytest.mark.skipif(not gpu_present(), reason="no CUDA GPU here (nvidia-smi finds none): the program compiles, it runs on the GPU machine")
@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"])
@pytest.mark.parametrize("rows,K", [(300, 4096), (64, 14336), (97, 256), (33, 768)])
def test_quantized_matvec_matches_gguf_dequantizer(format_test, fmt, rows, K, tmp_path):
    pytest.importorskip("gguf", reason="the gguf package is not installed here (the GPU machine's venv has no network to get it): "
                        "run the program there and check its files here")
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    r = subprocess.run([str(format_test), "check", fmt, str(tmp_path), "59", str(rows), str(K)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    from gguf.constants import GGML_QUANT_SIZES
    block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[fmt]]
    blocks = np.fromfile(tmp_path / "weights.bin", dtype=np.uint8).reshape(rows, K // block * block_bytes)
    w32 = dequantize(blocks, GGMLQuantizationType[fmt]).astype(np.float32)
    deq = np.fromfile(tmp_path / "dequant.bin", dtype=np.float32).reshape(rows, K)
    wrong = np.flatnonzero(w32.view(np.uint32) != deq.view(np.uint32))
    assert wrong.size == 0, (f"{fmt} to_f32 {rows} x {K}: {wrong.size} weights differ from gguf's bits; first at "
                             f"{divmod(int(wrong[0]), K)}: gpu {deq.flat[wrong[0]]!r}, gguf {w32.flat[wrong[0]]!r}")
    w = w32.astype(np.float64)
    x32 = np.fromfile(tmp_path / "in.bin", dtype=np.float32)
    x0 = np.fromfile(tmp_path / "x0.bin", dtype=np.float32).astype(np.float64)
    got = np.fromfile(tmp_path / "out.bin", dtype=np.float32).astype(np.float64)
    xq, dx = quantize_x16(x32)
    x_in = x32.astype(np.float64)
    for name, want, bound in (
            ("the 16-bit inputs", x0 + w @ xq, RTOL_DOT * (np.abs(w) @ np.abs(xq) + np.abs(x0))),
            ("the fp32 inputs", x0 + w @ x_in, RTOL_DOT * (np.abs(w) @ np.abs(x_in) + np.abs(x0)) + np.abs(w) @ np.repeat(dx, 32) / 2)):
        diff = np.abs(got - want)
        worst = int(np.argmax(diff / bound))
        assert (diff <= bound).all(), (f"{fmt} matvec {rows} x {K} against {name}: {int((diff > bound).sum())} rows past the bound; "
                                       f"worst row {worst}: gpu {got[worst]!r}, reference {want[worst]!r}, "
                                       f"|diff| {diff[worst]:.3g} > {bound[worst]:.3g}")


def quantize_x16(x: np.ndarray):
    """stage_xq's inputs in NumPy: (dx * x16 in float64, dx a block) for x (fp32, blocks of 32)"""
    b = x.reshape(-1, 32)
    amax = np.abs(b).max(axis=1)
    assert np.isfinite(amax).all()
    ok = amax >= np.float32(2.0 ** -100)
    with np.errstate(divide="ignore"):
        inv = np.where(ok, np.float32(32767.0) / amax, np.float32(0.0)).astype(np.float32)
    dx = np.where(ok, amax / np.float32(32767.0), np.float32(0.0)).astype(np.float32)
    x16 = np.rint(b.astype(np.float64) * inv.astype(np.float64)[:, None])
    assert np.abs(x16).max() <= 32767
    return (x16 * dx.astype(np.float64)[:, None]).reshape(-1), dx.astype(np.float64)
