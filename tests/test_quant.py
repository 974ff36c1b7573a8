"""runtime/quant.c against the gguf package: the block table, the refusals, the dequantizer bit for
bit, and the dot products of every kernel path against an exact sum.

Data, for every type (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K):
  (a) random valid blocks: random bytes with the fp16 scale fields replaced by random finite fp16
      (any exponent, subnormals included);
  (b) the real tensors of the default model's GGUF (downloads/SmolLM2-135M-Instruct.Q4_1.gguf:
      Q4_1, Q8_0 and F32; `make test` fetches it first, skipped with a message when absent);
  (c) blocks made by gguf.quants.quantize from Gaussian weights where the package quantizes the type
      (Q8_0, Q4_0, Q4_1), else random blocks with scales of a trained model's size (Q4_K, Q5_K, Q6_K).

The dequantizer must give the gguf package's bits (compared as uint32, so -0.0 and NaN payloads
count). It is the same scalar code in every build; the scalar and the native build are checked.

The dot products run on every path: scalar, avx2, avx512 (AVX-512BW, no VNNI), avx512vnni (the
real instructions, where the CPU has them) and avx512-simde (the AVX-512 kernels on SIMDe's portable
intrinsics, where its headers are installed). The block formats take their input quantized to 16
bits (quant.h): every path must give quant_dot_ref's bits (the driver checks quant_dot, quant_dot_x4
and the pre-quantized quant_dot_q / quant_dot_x4_q against it and fails otherwise), and the
quantizer must give the rule's x16, dx and dx * S, computed here in NumPy (test_input_*). Dense
types keep fp32 inputs.

Each path is also compared with the exact sum, in float64, of the dequantized fp32 weights w times
the fp32 x. Tolerance: |got - exact| <= gamma(k) * S + E, with
  S        = sum_i (|w_i - o_i| + |o_i|) * |x_i|, o_i the block offset the kernel sums separately
             (Q4_1's m, Q4_K/Q5_K's dmin * min, else 0), so S bounds every partial sum's terms;
  gamma(k) = k u / (1 - k u), u = 2^-24 (fp32), k = n + 18;
  E        = (1 + 2^-20) * sum_i |w_i| dx_b(i) / 2 (block formats; 0 for dense), dx_b the scale of
             x_i's block of 32.
Derivation. The input the block formats multiply is xh_i = dx * x16_i with x16_i = x_i * inv + r_i,
|r_i| <= 1/2, inv and dx each correctly rounded (32767 / amax, amax / 32767), so
dx * inv = 1 + e with |e| <= 2u + u^2 and xh_i - x_i = e x_i + dx r_i: the rounding to 16 bits costs
at most |w_i| dx / 2 a weight (E; the 2^-20 covers w_i being the fp32-rounded weight), and e adds
under 2.01 u |w_i x_i| (two more roundings in k). The rest is the classic bound for a sum of
products evaluated in any order where no term passes through more than k roundings (Higham,
Accuracy and Stability, 3.1), with S over xh instead of x within a factor (1 + 2^-15) that the
spare roundings of k absorb: the paths sum block results in 8 lanes (n / 256 roundings a lane),
round c * dx, the integer sum's conversion and the fused multiply-add (3), the offset's dx * S and
its multiply-add (2), and reduce the lanes (3); the weights' own rounding on dequantization adds 1;
n + 18 is far above. A wrong nibble, scale or sign moves the result by O(S), thousands of times the
tolerance; the test also checks that the tolerance does reject such an error.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

from codegen import fetch_default
from conftest import REPO, make

SMOL_GGUF = fetch_default.DOWNLOADS / fetch_default.GGUF_PATH.name
TYPES = (T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q4_K, T.Q5_K, T.Q6_K)
QUANT_TYPES = (T.Q8_0, T.Q4_0, T.Q4_1, T.Q4_K, T.Q5_K, T.Q6_K)
# The fp16 fields of each block: byte offsets (ggml-common.h's block_*).
FP16_FIELDS = {T.Q8_0: (0,), T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}
# The offset fields (zeroing d leaves only the offsets): Q4_1's d, Q4_K/Q5_K's d.
OFFSET_TYPES = (T.Q4_1, T.Q4_K, T.Q5_K)
U = 2.0**-24


def cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


FLAGS = cpu_flags()
SIMDE = Path("/usr/include/simde/x86/avx512.h").exists()
PATHS = {
    # path: (binary, why it cannot run here or None)
    "scalar": ("quant_cli_scalar", None),
    "avx2": ("quant_cli_avx2", None if {"avx2", "fma", "f16c"} <= FLAGS else "this CPU has no AVX2+FMA+F16C"),
    "avx512": ("quant_cli_avx512", None if {"avx512f", "avx512bw"} <= FLAGS else "this CPU has no AVX-512BW"),
    "avx512vnni": ("quant_cli_avx512vnni", None if {"avx512f", "avx512bw", "avx512_vnni"} <= FLAGS else "this CPU has no AVX512-VNNI"),
    "avx512-simde": ("quant_cli_avx512_sim", None if SIMDE else "SIMDe headers absent (apt-get install libsimde-dev)"),
}


def cli(path: str) -> Path:
    """The driver built for path, checked to have compiled that path (quant_dot_isa)."""
    binary, why = PATHS[path]
    if why:
        pytest.skip(f"{path}: {why}")
    make(f"build/tests/{binary}")
    exe = REPO / "build" / "tests" / binary
    isa = run(exe, "info").stdout.split("\n")[0]
    assert isa == path.removesuffix("-simde"), f"{binary} was compiled for {isa!r}, expected {path!r}"
    return exe


def run(binary: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True, timeout=300)


# ---------------------------------------------------------------------------------------------
# Data

def random_f16(rng, shape) -> np.ndarray:
    """Random finite fp16 bit patterns (any sign, exponent 0..30, any mantissa)."""
    bits = rng.integers(0, 1 << 16, size=shape, dtype=np.uint16)
    exp31 = (bits & 0x7C00) == 0x7C00
    bits[exp31] &= np.uint16(0xFBFF)  # clear one exponent bit: finite
    return bits


def random_blocks(rng, qtype, rows: int, n: int, scale_bits=None) -> np.ndarray:
    """rows x n weights of qtype as random valid blocks (uint8, rows x row_bytes)."""
    block, size = GGML_QUANT_SIZES[qtype]
    nb = rows * n // block
    if qtype == T.F32:
        return rng.standard_normal(rows * n).astype(np.float32).view(np.uint8).reshape(rows, -1)
    if qtype in (T.F16, T.BF16):
        if qtype == T.F16:
            data = random_f16(rng, rows * n)
        else:  # finite, 2^-60 .. 2^60 (the every-bit-pattern test covers the rest)
            f = rng.standard_normal(rows * n) * 2.0 ** rng.integers(-60, 60, rows * n)
            data = (f.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        return data.view(np.uint8).reshape(rows, -1)
    blocks = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
    for off in FP16_FIELDS[qtype]:
        bits = random_f16(rng, nb) if scale_bits is None else scale_bits(nb)
        blocks[:, off:off + 2] = bits.reshape(nb, 1).view(np.uint8).reshape(nb, 2)
    return blocks.reshape(rows, -1)


def trained_scale_bits(rng):
    """fp16 scales of the size a trained model's blocks have (|N(0, 1)| * 2^-9 .. 2^-5), positive."""
    def draw(nb):
        return (np.abs(rng.standard_normal(nb)) * 2.0 ** rng.uniform(-9, -5, nb) + 1e-5).astype(np.float16).view(np.uint16)
    return draw


def made_blocks(rng, qtype, rows: int, n: int) -> tuple[np.ndarray, str]:
    """(c): gguf.quants.quantize of Gaussian weights, or, where it cannot quantize the type, random
    blocks with trained-size scales. Returns the blocks and which it was."""
    w = (rng.standard_normal((rows, n)) * 0.02).astype(np.float32)
    try:
        return quantize(w, qtype), "quantized"
    except NotImplementedError:
        return random_blocks(rng, qtype, rows, n, trained_scale_bits(rng)), "random (no quantizer in gguf)"


@functools.lru_cache(maxsize=1)
def smol_tensors():
    if not SMOL_GGUF.exists():
        pytest.skip(f"{SMOL_GGUF} absent: `make` fetches it (codegen/fetch_default.py)")
    return GGUFReader(str(SMOL_GGUF)).tensors


@functools.lru_cache(maxsize=None)
def smol_rows(qtype, max_rows: int = 8):
    """Rows of every tensor of qtype in the default GGUF, grouped by row length: {n: uint8 rows}."""
    groups: dict[int, list[np.ndarray]] = {}
    for t in smol_tensors():
        if t.tensor_type != qtype:
            continue
        data = np.asarray(t.data).view(np.uint8)
        n = int(t.shape[0])
        data = data.reshape(-1, GGML_QUANT_SIZES[qtype][1] * n // GGML_QUANT_SIZES[qtype][0])
        pick = np.unique(np.linspace(0, data.shape[0] - 1, min(max_rows, data.shape[0])).astype(int))
        groups.setdefault(n, []).append(data[pick])
    assert groups, f"no {qtype.name} tensor in {SMOL_GGUF.name}"
    return {n: np.concatenate(v) for n, v in groups.items()}


# ---------------------------------------------------------------------------------------------
# Checks

def check_dequant(binary: Path, tmp: Path, qtype, n: int, rows: np.ndarray):
    src, dst = tmp / "w.bin", tmp / "y.bin"
    np.ascontiguousarray(rows).tofile(src)
    r = run(binary, "dequant", int(qtype), n, src, dst)
    assert r.returncode == 0, r.stderr
    got = np.fromfile(dst, dtype=np.float32).reshape(rows.shape[0], n)
    want = dequantize(rows, qtype).reshape(rows.shape[0], n).astype(np.float32, copy=False)
    same = got.view(np.uint32) == want.view(np.uint32)
    if not same.all():
        r_, c_ = np.argwhere(~same)[0]
        raise AssertionError(f"{qtype.name} n={n}: {int((~same).sum())} of {same.size} weights differ; first at row "
                             f"{r_} weight {c_}: {got[r_, c_]!r} ({got.view(np.uint32)[r_, c_]:#010x}), gguf "
                             f"{want[r_, c_]!r} ({want.view(np.uint32)[r_, c_]:#010x})")


def x16_rule(x: np.ndarray):
    """quant.h's input quantization, in NumPy: x16 (int16, n), dx and dx * S (float32, n / 32)."""
    xb = x.astype(np.float32).reshape(-1, 32)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        amax = np.abs(xb).max(axis=1)  # NaN-propagating
        bad = ~np.isfinite(amax)
        small = ~bad & (amax < np.float32(2.0**-100))
        ok = ~bad & ~small
        safe = np.where(ok, amax, np.float32(1))
        inv = np.float32(32767) / safe
        dx = np.where(ok, safe / np.float32(32767), np.float32(0)).astype(np.float32)
        dx[bad] = np.float32("nan")
        # the exact product in float64 (two floats' product is exact there), rounded half to even
        x16 = np.where(ok[:, None], np.rint(xb.astype(np.float64) * inv.astype(np.float64)[:, None]), 0).astype(np.int16)
    with np.errstate(over="ignore"):  # FLT_MAX blocks: dx * S overflows to inf, in C too
        s = (dx * x16.astype(np.int32).sum(axis=1).astype(np.float32)).astype(np.float32)
    return x16.reshape(-1), dx, s


def input_rounding(qtype, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """E of the module docstring: (1 + 2^-20) * sum_i |w_i| dx_b(i) / 2 per row (0 for dense types)."""
    if GGML_QUANT_SIZES[qtype][0] == 1:
        return np.zeros(w.shape[0])
    _, dx, _ = x16_rule(x)
    return (1 + 2.0**-20) * 0.5 * (np.abs(w) @ np.repeat(dx.astype(np.float64), 32))


def offsets(qtype, rows: np.ndarray, n: int) -> np.ndarray:
    """The per-weight offset o_i the kernels sum apart from d * q (zero for types without)."""
    if qtype not in OFFSET_TYPES:
        return np.zeros((rows.shape[0], n))
    _, size = GGML_QUANT_SIZES[qtype]
    blocks = rows.reshape(-1, size).copy()
    blocks[:, 0:2] = 0  # d = 0 leaves m (Q4_1) or -dmin * min (Q4_K, Q5_K)
    return dequantize(blocks.reshape(rows.shape), qtype).reshape(rows.shape[0], n).astype(np.float64)


def check_dot(binary: Path, tmp: Path, qtype, n: int, rows: np.ndarray, rng, x=None) -> float:
    """Checks quant_dot_ref and quant_dot of each row against the exact sum (x: the input, or
    Gaussian); returns the largest error as a share of the tolerance."""
    if x is None:
        x = rng.standard_normal(n).astype(np.float32)
    src, xf, dst = tmp / "w.bin", tmp / "x.bin", tmp / "d.bin"
    np.ascontiguousarray(rows).tofile(src)
    x.tofile(xf)
    r = run(binary, "dot", int(qtype), n, src, xf, dst)
    assert r.returncode == 0, r.stderr
    got = np.fromfile(dst, dtype=np.float32).reshape(-1, 2).astype(np.float64)
    w = dequantize(rows, qtype).reshape(rows.shape[0], n).astype(np.float64)
    x64 = x.astype(np.float64)
    exact = w @ x64
    o = offsets(qtype, rows, n)
    s = (np.abs(w - o) + np.abs(o)) @ np.abs(x64)
    k = n + 18
    tol = k * U / (1 - k * U) * s + input_rounding(qtype, w, x)
    for col, what in ((0, "quant_dot_ref"), (1, "quant_dot")):
        err = np.abs(got[:, col] - exact)
        bad = np.flatnonzero(err > tol)
        assert bad.size == 0, (f"{qtype.name} n={n} {what} row {bad[0]}: {got[bad[0], col]!r}, exact {exact[bad[0]]!r}, "
                               f"error {err[bad[0]]:.3g} > tolerance {tol[bad[0]]:.3g}")
    # The tolerance can fail: it is under 0.1% of S, and it rejects, on most rows, a kernel that
    # reads each block's two halves swapped (a nibble-order bug; a row whose blocks are nearly
    # constant, all offset, hardly changes).
    assert (tol < 1e-3 * s).all()
    if GGML_QUANT_SIZES[qtype][0] > 1:  # the block formats: quant_dot is quant_dot_ref, bit for bit
        assert (got[:, 0].astype(np.float32).view(np.uint32) == got[:, 1].astype(np.float32).view(np.uint32)).all()
    block = GGML_QUANT_SIZES[qtype][0]
    if block > 1:
        xs = x64.reshape(-1, 2, block // 2)[:, ::-1].reshape(n)
        wrong = w @ xs
        assert (np.abs(wrong - exact) > tol).mean() > 0.5, f"{qtype.name}: the tolerance would accept swapped halves"
    return float((np.abs(got - exact[:, None]) / np.maximum(tol[:, None], 1e-300)).max())


# ---------------------------------------------------------------------------------------------
# Tests

def test_table_matches_gguf():
    make("build/tests/quant_cli")
    r = run(REPO / "build/tests/quant_cli", "info")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")
    assert lines[0] in ("avx512vnni", "avx512", "avx2", "scalar")
    got = {int(t): (name, int(b), int(s)) for t, name, b, s in (l.split() for l in lines[1:] if l)}
    want = {int(t): (t.name, *GGML_QUANT_SIZES[t]) for t in TYPES}
    assert got == want


@pytest.mark.parametrize("qtype,n,expect", [
    (T.Q4_K, 300, "a row of 300 weights of type Q4_K: expected a positive multiple of its block of 256"),
    (T.Q8_0, 48, "a row of 48 weights of type Q8_0: expected a positive multiple of its block of 32"),
    (T.Q4_0, 0, "a row of 0 weights of type Q4_0"),
    (T.Q5_0, 64, "ggml type 6 (Q5_0) is not supported"),
    (T.IQ2_XXS, 256, "ggml type 16 (IQ2_XXS) is not supported"),
    (99, 256, "ggml type 99 (not a GGUF type) is not supported"),
])
def test_row_bytes_refuses(qtype, n, expect):
    make("build/tests/quant_cli")
    r = run(REPO / "build/tests/quant_cli", "rowbytes", int(qtype), n)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith("quantized weights: ") and expect in r.stderr, r.stderr


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_row_bytes(qtype):
    make("build/tests/quant_cli")
    block, size = GGML_QUANT_SIZES[qtype]
    for blocks in (1, 3, 2304 // block if block < 2304 else 9):
        r = run(REPO / "build/tests/quant_cli", "rowbytes", int(qtype), blocks * block)
        assert r.returncode == 0 and int(r.stdout) == blocks * size, r.stderr


@pytest.mark.parametrize("path", ["scalar", "native"])
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dequant_random_blocks(qtype, path, tmp_path):
    binary = cli("scalar") if path == "scalar" else (make("build/tests/quant_cli") or REPO / "build/tests/quant_cli")
    rng = np.random.default_rng(59 + int(qtype))
    n = 4 * max(256, GGML_QUANT_SIZES[qtype][0])
    check_dequant(binary, tmp_path, qtype, n, random_blocks(rng, qtype, 64, n))


def test_dequant_f16_bf16_every_bit_pattern(tmp_path):
    """Every one of the 65536 halves and bfloat16s, NaNs and infinities included."""
    binary = cli("scalar")
    allbits = np.arange(1 << 16, dtype=np.uint16).view(np.uint8).reshape(64, -1)
    for qtype in (T.F16, T.BF16):
        check_dequant(binary, tmp_path, qtype, 1024, allbits)


@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
def test_dequant_made_blocks(qtype, tmp_path):
    rng = np.random.default_rng(590 + int(qtype))
    rows, _ = made_blocks(rng, qtype, 32, 2048)
    check_dequant(cli("scalar"), tmp_path, qtype, 2048, rows)


@pytest.mark.parametrize("qtype", (T.Q4_1, T.Q8_0, T.F32), ids=lambda t: t.name)
def test_dequant_smollm2_tensors(qtype, tmp_path):
    for n, rows in smol_rows(qtype).items():
        check_dequant(cli("scalar"), tmp_path, qtype, n, rows)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dot_random_blocks(qtype, path, tmp_path):
    binary = cli(path)
    rng = np.random.default_rng(5900 + int(qtype))
    # Row lengths: one block (the shortest), three (an odd count: the kernels take two a step),
    # 4, 5, 6 and 7 blocks (a last group up to 4 and past it: with 1, 2 (576) and 3, every count a
    # last group can have, each its own copy of the kernel), SmolLM2's 576 and 1536 where the block
    # divides them, 4096.
    block = GGML_QUANT_SIZES[qtype][0]
    for n in sorted({block * (2 if block == 1 else 1), 3 * block,
                     *(m for m in (128, 160, 192, 224, 576, 1536) if m % block == 0), 4096}):
        check_dot(binary, tmp_path, qtype, n, random_blocks(rng, qtype, 16, n), rng)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
def test_dot_made_blocks(qtype, path, tmp_path):
    binary = cli(path)
    rng = np.random.default_rng(59000 + int(qtype))
    rows, _ = made_blocks(rng, qtype, 32, 4096)
    share = check_dot(binary, tmp_path, qtype, 4096, rows, rng)
    assert share <= 1.0


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("qtype", (T.Q4_1, T.Q8_0, T.F32), ids=lambda t: t.name)
def test_dot_smollm2_tensors(qtype, path, tmp_path):
    binary = cli(path)
    rng = np.random.default_rng(7)
    for n, rows in smol_rows(qtype).items():
        check_dot(binary, tmp_path, qtype, n, rows, rng)


def special_x(rng, n: int) -> np.ndarray:
    """Gaussian x (n, a multiple of 32 * 12) whose blocks of 32 include every case of the rule: a NaN,
    +inf, -inf, all zeros, tiny (below 2^-100), exactly 2^-100, just below it, subnormals only, a
    block reaching FLT_MAX, one whose x * inv lands on halves (ties to even), a single nonzero."""
    x = rng.standard_normal(n).astype(np.float32)
    b = x.reshape(-1, 32)
    b[0, 5] = np.nan
    b[1, 0] = np.inf
    b[2, 31] = -np.inf
    b[3] = 0
    b[4] = rng.standard_normal(32) * 2.0**-110
    b[5] = rng.standard_normal(32) * 2.0**-102
    b[5, 7] = -(2.0**-100)
    b[6] = 0
    b[6, 3] = np.nextafter(np.float32(2.0**-100), np.float32(0))
    b[7] = (rng.integers(-100, 100, 32) * 2.0**-140).astype(np.float32)  # subnormals
    b[8, 9] = np.finfo(np.float32).max
    b[9] = (rng.integers(-32767, 32767, 32) + 0.5) / 32767 * 0.75  # amax 0.75ish: many near-ties
    b[9, 0] = 0.75
    b[10] = 0
    b[10, 17] = -3.0
    return x


@pytest.mark.parametrize("path", PATHS)
def test_input_rule(path, tmp_path):
    """quant_input's x16, dx and dx * S against the rule computed in NumPy, bit for bit."""
    binary = cli(path)
    rng = np.random.default_rng(1659)
    for n in (32, 96, 576, 32 * 12 * 4):
        x = special_x(rng, n) if n % (32 * 12) == 0 else rng.standard_normal(n).astype(np.float32) * 3
        xf, out = tmp_path / "x.bin", tmp_path / "q.bin"
        x.tofile(xf)
        r = run(binary, "input", n, xf, out)
        assert r.returncode == 0, r.stderr
        raw = np.fromfile(out, dtype=np.uint8)
        nb = n // 32
        x16 = raw[: 2 * n].view(np.int16)
        dx = raw[2 * n: 2 * n + 4 * nb].view(np.float32)
        s = raw[2 * n + 4 * nb: 2 * n + 8 * nb].view(np.float32)
        lo = raw[2 * n + 8 * nb: 3 * n + 8 * nb]
        hi = raw[3 * n + 8 * nb: 4 * n + 8 * nb].view(np.int8)
        sums = raw[4 * n + 8 * nb:].view(np.int32)
        want16, wdx, ws = x16_rule(x)
        assert (x16 == want16).all(), f"n={n}: x16 differs at {np.flatnonzero(x16 != want16)[:8]}"
        # the same x16 as bytes (x16 = 256 hi + lo) and the blocks' integer sums, S and the sum of hi
        assert (hi.astype(np.int32) * 256 + lo == want16).all(), f"n={n}: lo, hi differ from x16"
        w16 = want16.astype(np.int32).reshape(nb, 32)
        assert (sums[:nb] == w16.sum(axis=1)).all(), f"n={n}: S differs"
        assert (sums[nb:] == (w16 >> 8).sum(axis=1)).all(), f"n={n}: the sums of hi differ"
        for got, want, what in ((dx, wdx, "dx"), (s, ws, "dx * S")):
            same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
            assert same.all(), f"n={n} {what}: block {np.flatnonzero(~same)[0]}: {got[~same][0]!r}, rule {want[~same][0]!r}"
        assert np.abs(x16.astype(np.int32)).max() <= 32767


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
def test_dot_special_blocks(qtype, path, tmp_path):
    """x with NaN, infinite, zero, tiny and huge blocks: the driver holds every path to the twin's bits
    (NaN counting as NaN); a NaN or infinity in x makes the product NaN; tiny blocks count as zero."""
    binary = cli(path)
    rng = np.random.default_rng(6590 + int(qtype))
    n = 32 * 12 * (8 if GGML_QUANT_SIZES[qtype][0] == 256 else 1)  # the K formats' rows: whole super-blocks
    rows = made_blocks(rng, qtype, 8, n)[0]
    x = special_x(rng, n)
    src, xf, dst = tmp_path / "w.bin", tmp_path / "x.bin", tmp_path / "d.bin"
    np.ascontiguousarray(rows).tofile(src)
    x.tofile(xf)
    r = run(binary, "dot", int(qtype), n, src, xf, dst)
    assert r.returncode == 0, r.stderr
    got = np.fromfile(dst, dtype=np.float32).reshape(-1, 2)
    assert np.isnan(got).all(), f"{qtype.name}: a NaN or infinite input must give NaN, got {got[~np.isnan(got)][:4]}"
    # Without the NaN and infinite blocks: finite, within the tolerance, tiny blocks as zero
    xb = x.reshape(-1, 32).copy()
    xb[:3] = 0
    xb[8] = rng.standard_normal(32)  # FLT_MAX times a weight overflows fp32 in any method
    x2 = xb.reshape(-1)
    share = check_dot(binary, tmp_path, qtype, n, rows, rng, x2)
    assert share <= 1.0
