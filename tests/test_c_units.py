"""Runs every C unit test program (tests/test_*.c) and checks its closing 'N passed, M failed'."""

import re
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, make

C_TESTS = sorted(p.stem for p in (REPO / "tests").glob("test_*.c"))
# test_cpu_kernels with cpu_kernels.h's AVX-512 paths on SIMDe's portable intrinsics (any x86),
# built where Debian's libsimde-dev is (tests/cpu_kernels_simde.c)
SIMDE = Path("/usr/include/simde/x86/avx512.h").exists()


# test_cpu_kernels with AVX-512 turned off: the AVX2 paths, where this CPU has AVX2 + FMA + F16C
CPU_FLAGS = set(Path("/proc/cpuinfo").read_text().split()) if Path("/proc/cpuinfo").exists() else set()


@pytest.mark.parametrize("name", [*C_TESTS, pytest.param("test_cpu_kernels_avx512_sim", marks=pytest.mark.skipif(
    not SIMDE, reason="SIMDe headers absent (apt-get install libsimde-dev)")), pytest.param("test_cpu_kernels_avx2", marks=pytest.mark.skipif(
        not {"avx2", "fma", "f16c"} <= CPU_FLAGS, reason="this CPU has no AVX2 + FMA + F16C"))])
def test_c_unit(name):
    make(f"build/tests/{name}")
    r = subprocess.run([str(REPO / "build" / "tests" / name)], capture_output=True, text=True, timeout=600)
    last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    m = re.fullmatch(r"(\d+) passed, (\d+) failed", last)
    assert m, f"{name}: no closing 'N passed, M failed' line:\n{r.stdout}\n{r.stderr}"
    assert r.returncode == 0 and m.group(2) == "0", f"{name}:\n{r.stdout}\n{r.stderr}"
    assert int(m.group(1)) > 0, f"{name} ran no checks"


@pytest.mark.skipif(not {"avx2", "fma", "f16c"} <= CPU_FLAGS, reason="this CPU has no AVX2 + FMA + F16C: cpu_gemm.h has no GEMM for it")
def test_cpu_gemm_bench_builds_and_checks_its_sums(tmp_path):
    """tests/bench/cpu_gemm.c (the CPU prompt's GEMM alone, for choosing its batch on a machine)
    compiles as its header says and, on small shapes, checks every timed sum against dot_bf16."""
    exe = tmp_path / "cpu_gemm"
    subprocess.run(["gcc", "-O2", "-march=native", "-fopenmp", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror", "-Iruntime",
                    "tests/bench/cpu_gemm.c", "runtime/probe.c", "runtime/errors.c", "-o", str(exe)], cwd=REPO, check=True)
    r = subprocess.run([str(exe), "1", "96", "160", "32"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert len([line for line in r.stdout.splitlines() if line.startswith("down_proj")]) == 4, r.stdout


@pytest.mark.skipif("avx512f" not in CPU_FLAGS, reason="this CPU has no AVX-512: tests/bench/cpu_dpbf16.c is written for it")
def test_cpu_dpbf16_bench_builds_and_bounds_its_sums(tmp_path):
    """tests/bench/cpu_dpbf16.c (bf16 inputs through vdpbf16ps or its twin of two FMAs a pair, for
    the CPU prompt's numerics decision) compiles as its header says and, on small shapes, keeps every
    sum within its bound of a double sum (it exits 1 naming the one that is not)."""
    exe = tmp_path / "cpu_dpbf16"
    subprocess.run(["gcc", "-O2", "-march=native", "-fopenmp", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror", "-Iruntime",
                    "tests/bench/cpu_dpbf16.c", "runtime/probe.c", "runtime/errors.c", "-o", str(exe), "-lm"], cwd=REPO, check=True)
    r = subprocess.run([str(exe), "1", "96", "160", "32"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines() if line.startswith("down_proj")]
    assert len(rows) == 2 and all(float(row[-2]) > 0 for row in rows), r.stdout  # the twin's error: x rounded to bf16
