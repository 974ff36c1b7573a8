"""The probe builds' report scripts (PERFORMANCE.md, seventeenth session) on lines written here in the
shapes those builds print, among the bench's own lines: tests/bench/combine_clocks.py (the decode
combine's clock64 parts, -DTRACE_COMBINE_CLOCKS=1), tests/bench/qkv_pairs.py (QKV's pairs warp by
warp, -DTRACE_QKV_PAIRS=1) and tests/bench/sm_done.py (the matvec blocks' ends by SM,
-DTRACE_SM_DONE=1); and their clear errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "tests" / "bench"))
import combine_clocks  # noqa: E402
import qkv_pairs  # noqa: E402
import sm_done  # noqa: E402


def test_combine_clocks_groups_parts_and_clock():
    text = "\n".join([
        "bench: bench-llama on NVIDIA H200",
        "combine-clocks 1 17 1000 900 1800 600 2150",
        "combine-clocks 1 17 1400 1100 2200 600 2650",
        "  decode at depth 4096: 8 tokens, 1194.9 tok/s",
        "combine-clocks 1 17 1200 1000 2000 600 2400",
        "combine-clocks 4 3 100 100 100 100 400",
    ])
    rows = [line for line in combine_clocks.render(text).splitlines() if line.startswith(("| 1 ", "| 4 "))]
    assert rows[0].split(" | ")[:4] == ["| 1", "17", "3", "1200 / 1400"]
    assert "1000 / 1100" in rows[0] and "2000 / 2200" in rows[0] and "600 / 600" in rows[0]
    assert rows[0].split(" | ")[-2:] == ["2400", "2.00 |"]  # 4800 cycles in 2400 ns
    assert rows[1].split(" | ")[:3] == ["| 4", "3", "1"] and rows[1].endswith("1.00 |")


def test_qkv_pairs_by_pairs_and_by_sm():
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


def test_sm_done_tells_the_same_late_sms_from_any():
    lines = ["  decode at depth 0: 16 tokens, 282.5 tok/s"]
    for launch in range(4):
        for sm in range(10):
            # gate/up (4): SM 7 ends 2 µs after the rest every launch, the others 0-90 ns apart
            late = 2000 if sm == 7 else 10 * ((sm * 7 + launch * 3) % 10)
            lines.append(f"sm-done 4 {200 + launch} {sm} {sm} {1_000_000 * launch + 50_000 + late}")
            lines.append(f"sm-done 4 {200 + launch} {sm} {sm + 10} {1_000_000 * launch + 49_000}")  # its earlier block
            # down (5): the late SM moves launch by launch
            lines.append(f"sm-done 5 {200 + launch} {sm} {sm} {1_000_000 * launch + (1500 if sm == launch else 0)}")
    out = sm_done.render("\n".join(lines)).splitlines()
    gate_up = out[3].split(" | ")
    assert gate_up[:5] == ["| gate/up", "4", "10", "1.95", "1.00"]
    assert gate_up[5] == "100%" and gate_up[6].startswith("7 +1.9")
    down = out[4].split(" | ")
    assert down[:4] == ["| down", "4", "10", "1.50"] and float(down[4]) < 0.5 and down[5] == "25%"  # one launch in four


@pytest.mark.parametrize("module,bad", [
    (combine_clocks, {"x\ncombine-clocks 1 17 1 2 3 4\n": "line 2: 6 fields, a combine-clocks line has 7",
                      "combine-clocks 1 17 a 2 3 4 5\n": "line 1: a combine-clocks line holds integers"}),
    (qkv_pairs, {"x\nqkv-pairs a0 0 0 2 5000 4000\n": "line 2: 6 fields",
                 "qkv-pairs zz 0 0 2 5000 4000 0\n": "line 1: a qkv-pairs line holds a hex id, then integers"}),
    (sm_done, {"x\nsm-done 4 200 1 1\n": "line 2: 4 fields",
               "sm-done 4 200 x 1 5\n": "line 1: a sm-done line holds integers"}),
])
def test_errors_name_the_problem(module, bad, tmp_path):
    name = module.__name__
    with pytest.raises(ValueError, match=f"no {name.replace('_', '-')} lines"):
        module.render("decode at depth 0\n")
    for text, message in bad.items():
        with pytest.raises(ValueError, match=message):
            module.render(text)
    script = REPO / "tests" / "bench" / f"{name}.py"
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith(f"usage: python3 tests/bench/{name}.py")
    none = tmp_path / "out.txt"
    none.write_text("nothing\n")
    r = subprocess.run([sys.executable, str(script), str(none)], capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.startswith(f"{name}: ") and "lines (a build with" in r.stderr
