"""tests/bench/qkv_pairs.py on lines written here in the shape the -DTRACE_QKV_PAIRS=1 build prints:
pairs' times by pairs a warp, a second pair's time by how many of its SM's blocks took one, the
bench's lines skipped, and clear errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "tests" / "bench"))
import qkv_pairs  # noqa: E402

SCRIPT = REPO / "tests" / "bench" / "qkv_pairs.py"


def test_tables_by_pairs_and_by_sm():
    text = "\n".join([
        "  decode at depth 0: 8 tokens, 281.5 tok/s",
        # layer a0: SM 0 holds two blocks with a second pair, SM 1 one, SM 2 none
        "qkv-pairs a0 0 0 2 5000 4000 0",
        "qkv-pairs a0 0 132 2 6000 5000 0",
        "qkv-pairs a0 1 1 2 5500 3000 0",
        "qkv-pairs a0 1 133 1 5200 0 0",
        "qkv-pairs a0 2 2 1 5800 0 0",
        # another layer: SM 0 with one block with a second pair
        "qkv-pairs b0 0 0 2 5000 2000 0",
    ])
    out = qkv_pairs.render(text).splitlines()
    assert out[0] == "6 blocks over 2 layers; µs, median / p90"
    assert out[3] == "| 1 | 2 | 5.50 / 5.80 | - | - |"
    assert out[4] == "| 2 | 4 | 5.25 / 6.00 | 3.50 / 5.00 | - |"
    assert out[-2] == "| 1 | 2 | 2.50 / 3.00 |"  # SM 1 in a0, SM 0 in b0
    assert out[-1] == "| 2 | 2 | 4.50 / 5.00 |"  # SM 0 in a0


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="no qkv-pairs lines"):
        qkv_pairs.render("decode at depth 0\n")
    with pytest.raises(ValueError, match="line 2: 6 fields"):
        qkv_pairs.render("x\nqkv-pairs a0 0 0 2 5000 4000\n")
    with pytest.raises(ValueError, match="line 1: not a qkv-pairs line"):
        qkv_pairs.render("qkv-pairs zz 0 0 2 5000 4000 0\n")
    r = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("usage: python3 tests/bench/qkv_pairs.py")
    missing = tmp_path / "none.txt"
    r = subprocess.run([sys.executable, str(SCRIPT), str(missing)], capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.startswith("qkv_pairs: ")
