"""Shared fixtures: building model binaries with make and synthesizing tiny models.

Binaries are built through the Makefile exactly as a user builds them, so the tests cover the
generator, the build and the runtime together. Tiny models live in build/test-models/<variant>/:
the checked-in config from tests/models/<variant>/, the shared tiny tokenizer and random weights.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPO / "models" / "smollm2-135m-instruct"
# tiny-wide: rows long enough (hidden 2176, FFN 4352, head_dim 128, q_dim != hidden) that the GPU
# matvecs take several steps per row and attention runs with 128-wide heads.
TINY_VARIANTS = ("tiny-llama", "tiny-gqa", "tiny-qwen2", "tiny-llama3", "tiny-wide")
TINY_TOKENIZER = REPO / "tests" / "models" / "tiny-tokenizer"


def make(*args: str) -> None:
    """Runs make in the repo; a failure shows make's own output."""
    r = subprocess.run(["make", "-s", *args], cwd=REPO, capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"make {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}")


def build_model(model_dir: Path, *make_vars: str) -> Path:
    """Generates and builds build/<name>/ingot for model_dir; returns the binary."""
    make(f"MODEL={model_dir}", *make_vars)
    return REPO / "build" / model_dir.name / "ingot"


def tiny_model_dir(variant: str, seed: int = 1, name: str | None = None) -> Path:
    """build/test-models/<name or variant>: config, tokenizer and random bf16 weights (made once)."""
    d = REPO / "build" / "test-models" / (name or variant)
    src = REPO / "tests" / "models" / variant / "config.json"
    if not (d / "model.safetensors").exists() or (d / "config.json").read_bytes() != src.read_bytes():
        d.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, d / "config.json")
        subprocess.run(
            [sys.executable, "-m", "codegen.synth", str(d), "--seed", str(seed), "--tokenizer", str(TINY_TOKENIZER)],
            cwd=REPO, check=True, capture_output=True,
        )
    return d


def run(binary: Path, *args: str, input: bytes | None = None, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([str(binary), *args], input=input, capture_output=True, timeout=600)
    if check and r.returncode != 0:
        raise AssertionError(f"{binary.name} {' '.join(args)} exited {r.returncode}: {r.stderr.decode(errors='replace')}")
    return r


@pytest.fixture(scope="session")
def default_model() -> Path:
    if not (DEFAULT_MODEL / "model.safetensors").exists():
        pytest.skip("default model not fetched: `make test` fetches it (python -m codegen.fetch_default)")
    return DEFAULT_MODEL


@pytest.fixture(scope="session")
def default_binary(default_model: Path) -> Path:
    return build_model(default_model)


@pytest.fixture(scope="session", params=TINY_VARIANTS)
def tiny(request) -> tuple[Path, Path]:
    """(model dir, binary) for each tiny variant."""
    d = tiny_model_dir(request.param)
    return d, build_model(d)
