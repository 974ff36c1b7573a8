"""--shard K/N (tests/conftest.py): make test-gpu split into calls shorter than a GPU machine's limit."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO


def collected(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "tests/test_codegen.py", *args],
                          cwd=REPO, capture_output=True, text=True)


def ids(r: subprocess.CompletedProcess) -> list[str]:
    assert r.returncode == 0, r.stdout + r.stderr
    return [line for line in r.stdout.splitlines() if "::" in line]


def test_shards_split_the_tests_in_order():
    """Three shards: consecutive runs of the collected tests, each once, sizes within one."""
    every = ids(collected())
    parts = [ids(collected("--shard", f"{k}/3")) for k in (1, 2, 3)]
    assert sum(parts, []) == every
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_bad_shard_is_one_clear_error():
    for bad in ("0/2", "3/2", "1", "a/b"):
        r = collected("--shard", bad)
        assert r.returncode != 0
        assert f"--shard {bad}: expected K/N with 1 <= K <= N" in r.stderr
