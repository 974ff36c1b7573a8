"""tests/bench/ncu_source.py on a small source page written here in the shape ncu prints (two launches
of one kernel, a few columns): launches summed by instruction, stall reasons before and after the
grid-dependency wait, regions between landmarks (a run of mma as one), and clear errors."""

from __future__ import annotations

import csv
import io
import subprocess
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "tests" / "bench"))
import ncu_source  # noqa: E402

SCRIPT = REPO / "tests" / "bench" / "ncu_source.py"
HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)",
          "Instructions Executed", "stall_barrier", "stall_long_sb", "stall_no_inst", "stall_barrier (Not Issued)"]
# (SASS, samples, executed, barrier, long_sb, no_inst) of one launch
CODE = [
    ("LDC R1, c[0x0][0x28]", 4, 8, 0, 0, 4),
    ("@!P0 EXIT", 2, 8, 0, 2, 0),
    ("ACQBULK", 1, 8, 0, 0, 1),
    ("BAR.SYNC.DEFER_BLOCKING 0x0", 3, 8, 3, 0, 0),
    ("HMMA.16816.F32 R4, R8, R12, RZ", 5, 2, 0, 5, 0),
    ("IMAD R2, R3, R4, RZ", 1, 2, 0, 0, 1),
    ("HMMA.16816.F32 R4, R8, R14, R4", 2, 2, 0, 2, 0),
    ("STG.E desc[UR8][R2.64], R13", 6, 8, 6, 0, 0),
    ("EXIT", 0, 8, 0, 0, 0),
    ("BRA 0x70", 0, 0, 0, 0, 0),
]


def source_page(launches=2, code=CODE, header=HEADER) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, quoting=csv.QUOTE_ALL)
    for k in range(launches):
        w.writerow(["Kernel Name", "attention_kernel(const float *, int)"])
        w.writerow(header)
        for i, (sass, samples, executed, barrier, long_sb, no_inst) in enumerate(code):
            w.writerow([f"0x{16 * i:x}", f"      {sass}", samples, 0, f"{executed:,}", barrier, long_sb, no_inst, 9])
    return buf.getvalue()


def test_parse_sums_the_launches_by_instruction():
    src = ncu_source.parse(source_page())
    assert src.launches == 2 and src.kernel.startswith("attention_kernel")
    assert src.code[4] == "HMMA.16816.F32 R4, R8, R12, RZ"
    assert src.samples == [8, 4, 2, 6, 10, 2, 4, 12, 0, 0] and src.executed[0] == 16
    assert set(src.reasons) == {"barrier", "long_sb", "no_inst"}  # not the "(Not Issued)" column
    assert src.reasons["no_inst"] == [8, 0, 2, 0, 0, 2, 0, 0, 0, 0]


def test_render_splits_reasons_at_the_wait_and_code_at_landmarks():
    lines = ncu_source.render(source_page()).splitlines()
    assert lines[0].startswith("attention_kernel") and "2 launch(es), 48 stall samples, 10 instructions" in lines[0]
    # after the wait: 34 samples, barrier 18, long_sb 14, no_inst 2 (the IMAD's)
    assert "| barrier | 37.5% | 52.9% |" in lines and "| long_sb | 37.5% | 41.2% |" in lines
    assert "| no_inst | 25.0% | 5.9% |" in lines
    regions = [ln for ln in lines if ln.startswith("| ") and ":" in ln.split("|")[1]]
    assert [r.split("|")[1].strip().split(":")[0] for r in regions] == ["1", "2", "3", "4", "7", "8"]
    # both mma and the IMAD between them are one region (up to the first mma, then on to the store)
    assert regions[3] == "| 4: HMMA.16816.F32 R4, R8, R12, RZ | 4 | 10 | 20.8% | 29.4% |"
    assert regions[4] == "| 7: STG.E desc[UR8][R2.64], R13 | 16 | 18 | 37.5% | 52.9% |"
    assert regions[0].endswith("| 12 | 25.0% | - |")  # before the wait
    assert lines[-1] == "| (the rest) | - | 0 | 0.0% | 0.0% |"


def test_script_prints_and_refuses_other_files(tmp_path):
    page = tmp_path / "att.csv"
    page.write_text(source_page())
    r = subprocess.run([sys.executable, str(SCRIPT), str(page)], capture_output=True, text=True)
    assert r.returncode == 0 and "| region up to |" in r.stdout
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    r = subprocess.run([sys.executable, str(SCRIPT), str(other)], capture_output=True, text=True)
    assert r.returncode == 1 and "no profiled launch" in r.stderr and r.stderr.count("\n") == 1
    r = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("usage:")


@pytest.mark.parametrize("page, why", [
    (source_page(header=[h for h in HEADER if h != "Instructions Executed"] + ["x"]), "no 'Instructions Executed' column"),
    (source_page(1) + source_page(1, CODE[:-1]), "launches of different code"),
    (source_page(code=[(s, 0, e, 0, 0, 0) for s, _, e, *_ in CODE]), "no stall samples"),
])
def test_render_refuses_what_it_cannot_read(page, why):
    with pytest.raises(ValueError, match=why):
        ncu_source.render(page)
