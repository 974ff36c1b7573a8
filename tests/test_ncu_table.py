"""tests/bench/ncu_table.py on a real Nsight Compute report (a 1B prefill batch's kernels,
trimmed to three launches): every column from its metric, units converted, and a clear error for
a file that is no report."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "tests" / "bench"))
import ncu_table  # noqa: E402

REPORT = REPO / "tests" / "fixtures" / "ncu" / "prefill-1b.txt"
SCRIPT = REPO / "tests" / "bench" / "ncu_table.py"


def test_parse_reads_each_launch_and_its_metrics():
    launches = ncu_table.parse(REPORT.read_text())
    assert [x.kernel for x in launches] == ["prefill_rmsnorm_qkv_rope_kernel<16>", "prefill_attention_kernel",
                                            "prefill_o_proj_residual_kernel<16>"]
    qkv, att, o = launches
    assert qkv.grid == (192, 1, 1) and qkv.block == (256, 1, 1) and att.grid == (8, 33, 16) and o.grid == (128, 4, 1)
    assert qkv.duration_us() == 18.46 and o.duration_us() == 11.10
    assert qkv.number("Registers Per Thread", "register/thread") == 103
    assert qkv.number("DRAM Throughput", "%") == 14.36 and qkv.number("Issue Slots Busy", "%") == 25.44
    # the Speed Of Light "Memory Throughput" is a %; the memory workload's is a rate, kept apart
    assert qkv.number("Memory Throughput", "%") is not None and qkv.memory_gbs() == 690.27
    assert qkv.number("Elapsed Cycles", "cycle") == 25186  # thousands separators dropped
    assert qkv.number("No Such Metric", "%") is None


def test_units_convert():
    x = ncu_table.Launch("k", (1, 1, 1), (32, 1, 1), {("Duration", "ms"): "1.5", ("Memory Throughput", "Tbyte/s"): "1.25"})
    assert x.duration_us() == 1500.0 and x.memory_gbs() == 1250.0


def test_script_prints_a_row_a_launch_and_refuses_other_files(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), str(REPORT)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2 + 3 + 1
    assert lines[2].split()[:6] == ["prefill_rmsnorm_qkv_rope_kernel<16>", "192", "x", "256", "103", "14.9"]
    assert lines[-1].startswith("3 launches, 50.94 us")
    other = tmp_path / "other.txt"
    other.write_text("hello\n")
    r = subprocess.run([sys.executable, str(SCRIPT), str(other)], capture_output=True, text=True)
    assert r.returncode == 1 and "no profiled launch" in r.stderr
