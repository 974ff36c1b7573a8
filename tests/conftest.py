"""Shared fixtures: building model binaries with make and synthesizing tiny models.

Binaries are built through the Makefile exactly as a user builds them, so the tests cover the
generator, the build and the runtime together. Tiny models live in build/test-models/<variant>/:
the checked-in config from tests/models/<variant>/, the shared tiny tokenizer and random weights.

Every test that runs a binary runs both builds of the same sources (BUILDS): the specialized one,
generated for its model (build/<name>/ingot), and the generic one (build/generic/ingot, made once
for all models), which is told the model with -m. A Binary holds either, with its model.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPO / "models" / "smollm2-135m-instruct"
# tiny-wide: rows long enough (hidden 2176, FFN 4352, head_dim 128, q_dim != hidden) that the GPU
# matvecs take several steps per row and attention runs with 128-wide heads. tiny-group3: the
# attention of SmolLM2 and Llama-3.2-1B (64-wide heads, 8 lanes a key on the GPU) with SmolLM2's
# three query heads per KV head, tied embeddings.
TINY_VARIANTS = ("tiny-llama", "tiny-gqa", "tiny-qwen2", "tiny-llama3", "tiny-wide", "tiny-group3")
TINY_TOKENIZER = REPO / "tests" / "models" / "tiny-tokenizer"
BUILDS = ("specialized", "generic")
# One more generic binary, without CUDA and with four weight streams per CPU thread forced, for the
# tests of both (a generic build costs more than a specialized one: three weight dtypes).
GENERIC_CPU_STREAMS4 = "build/generic-cpu-streams4"


def make(*args: str) -> None:
    """Runs make in the repo, a job per core (a build compiles its CPU and CUDA sources side by
    side); a failure shows make's own output."""
    r = subprocess.run(["make", "-s", f"-j{os.cpu_count() or 1}", *args], cwd=REPO, capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"make {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}")


def build_model(model_dir: Path, *make_vars: str) -> Path:
    """Generates and builds build/<name>/ingot for model_dir; returns the binary."""
    make(f"MODEL={model_dir}", *make_vars)
    return REPO / "build" / model_dir.name / "ingot"


def build_generic(*make_vars: str, out: str | None = None) -> Path:
    """Builds the generic binary, build/generic/ingot (or in out, for a variant built with other
    make_vars); returns it."""
    make("GENERIC=1", *make_vars, *([f"OUT={out}"] if out else []))
    return REPO / (out or "build/generic") / "ingot"


@dataclass(frozen=True)
class Binary:
    """A built ingot and the model directory it runs: the specialized binary runs its own model
    unless told otherwise, the generic one is always given it with -m (a later -m overrides)."""
    path: Path
    model_dir: Path
    generic: bool

    @property
    def build(self) -> str:
        return "generic" if self.generic else "specialized"

    def argv(self, *args: str) -> list[str]:
        return [str(self.path), *(["-m", str(self.model_dir)] if self.generic else []), *args]


def binary_for(model_dir: Path, build: str, *make_vars: str, out: str | None = None) -> Binary:
    """The build ("specialized" or "generic") of model_dir. make_vars (EXTRA_CFLAGS=..., NVCC=)
    need a build of their own: for the generic one, give out (build/generic-<what>)."""
    if build == "generic":
        assert not make_vars or out, "a generic build with other make variables needs its own out"
        return Binary(build_generic(*make_vars, out=out), model_dir, True)
    return Binary(build_model(model_dir, *make_vars), model_dir, False)


def split_flags(flags: str) -> tuple[list[str], list[str]]:
    """A test build's flags, "field=N ... -DX=V ...", as (plan settings for codegen --set / make
    PLAN, nvcc flags): a plan decision is set through the generator, anything else is an nvcc flag."""
    words = flags.split()
    return [w for w in words if not w.startswith("-")], [w for w in words if w.startswith("-")]


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


def run(binary: Path | Binary, *args: str, input: bytes | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Runs an ingot binary with --check-weights always: a test model whose weights are not finite
    fails loudly instead of passing on garbage."""
    argv = binary.argv(*args) if isinstance(binary, Binary) else [str(binary), *args]
    if Path(argv[0]).name == "ingot":
        argv.insert(1, "--check-weights")
    r = subprocess.run(argv, input=input, capture_output=True, timeout=600)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {r.returncode}: {r.stderr.decode(errors='replace')}")
    return r


@pytest.fixture(scope="session")
def default_model() -> Path:
    if not (DEFAULT_MODEL / "model.safetensors").exists():
        pytest.skip("default model not fetched: `make test` fetches it (python -m codegen.fetch_default)")
    return DEFAULT_MODEL


@pytest.fixture(scope="session")
def default_binary(default_model: Path) -> Path:
    return build_model(default_model)


@pytest.fixture(scope="session", params=BUILDS)
def default_build(request, default_model: Path) -> Binary:
    """The default model's binary, each build."""
    return binary_for(default_model, request.param)


@pytest.fixture(scope="session", params=[(v, b) for v in TINY_VARIANTS for b in BUILDS], ids=lambda p: f"{p[0]}-{p[1]}")
def tiny(request) -> tuple[Path, Binary]:
    """(model dir, binary) for each tiny variant and each build."""
    variant, build = request.param
    d = tiny_model_dir(variant)
    return d, binary_for(d, build)


def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="K/N",
                     help="run the K-th of N runs of consecutive collected tests (1-based): make test-gpu in calls "
                          "shorter than a GPU machine's limit, PYTEST_ARGS='--shard 1/2' then '--shard 2/2'")


def shard_of(shard: str, n_items: int) -> range:
    """The indices of the collected tests that --shard K/N keeps: the K-th of N runs of consecutive
    tests (neighbours share their builds), sizes differing by at most one."""
    try:
        k, n = (int(v) for v in shard.split("/"))
    except ValueError:
        k = n = 0
    if not 1 <= k <= n:
        raise pytest.UsageError(f"--shard {shard}: expected K/N with 1 <= K <= N, e.g. 1/2")
    return range((k - 1) * n_items // n, k * n_items // n)


def pytest_collection_modifyitems(config, items):
    shard = config.getoption("--shard")
    if not shard:
        return
    keep = shard_of(shard, len(items))
    config.hook.pytest_deselected(items=[it for i, it in enumerate(items) if i not in keep])
    items[:] = [items[i] for i in keep]
