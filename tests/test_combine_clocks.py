"""tests/bench/combine_clocks.py on lines written here in the shape the -DTRACE_COMBINE_CLOCKS=1
build prints: grouped by (tokens, splits) among the bench's other lines, medians, the implied clock,
and clear errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "tests" / "bench"))
import combine_clocks  # noqa: E402

SCRIPT = REPO / "tests" / "bench" / "combine_clocks.py"


def test_groups_parts_and_clock():
    text = "\n".join([
        "bench: bench-llama on NVIDIA H200",
        "combine-clocks 1 17 1000 900 1800 600 2150",
        "combine-clocks 1 17 1400 1100 2200 600 2650",
        "  decode at depth 4096: 8 tokens, 1194.9 tok/s",
        "combine-clocks 1 17 1200 1000 2000 600 2400",
        "combine-clocks 4 3 100 100 100 100 400",
    ])
    out = combine_clocks.render(text)
    rows = [line for line in out.splitlines() if line.startswith("| 1 ") or line.startswith("| 4 ")]
    assert rows[0].split(" | ")[:4] == ["| 1", "17", "3", "1200 / 1400"]
    assert "1000 / 1100" in rows[0] and "2000 / 2200" in rows[0] and "600 / 600" in rows[0]
    assert rows[0].split(" | ")[-2:] == ["2400", "2.00 |"]  # 4800 cycles in 2400 ns
    assert rows[1].split(" | ")[:3] == ["| 4", "3", "1"] and rows[1].endswith("1.00 |")


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="no combine-clocks lines"):
        combine_clocks.render("decode at depth 0\n")
    with pytest.raises(ValueError, match="line 2: 6 numbers"):
        combine_clocks.render("x\ncombine-clocks 1 17 1 2 3 4\n")
    with pytest.raises(ValueError, match="line 1: not a combine-clocks line of integers"):
        combine_clocks.render("combine-clocks 1 17 a 2 3 4 5\n")
    empty = tmp_path / "out.txt"
    empty.write_text("nothing\n")
    r = subprocess.run([sys.executable, str(SCRIPT), str(empty)], capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.startswith("combine_clocks: ") and "no combine-clocks lines" in r.stderr
    r = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("usage: python3 tests/bench/combine_clocks.py")
