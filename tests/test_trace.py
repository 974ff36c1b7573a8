"""tests/bench/step_trace.py, which reads the GPU step's block trace, on a trace written here: three
layers, known stamps, the table's numbers checked against them (the GPU side writes the same
format from model_cuda_free in a -DINGOT_TRACE build)."""

import struct
import sys

import numpy as np
import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "tests" / "bench"))
import step_trace  # noqa: E402


def write_trace(path, n_layers, blocks):
    """Every stage of every layer starts 10 us after the previous one's start; its block b starts
    at +0.1*b us, is ready at +1 + 0.1*b, waits until +2, is staged at +2.5, is done at +5 + 0.3*b us.
    A stage without blocks (blocks[st] == 0) is not launched."""
    t, recs = 1_000_000, {st: [] for st in range(7)}
    for _ in range(n_layers):
        for st in range(1, 6):
            if not blocks[st]:
                continue
            for b in range(blocks[st]):
                recs[st].append([t + 100 * b, t + 2000, t + 2500, t + 5000 + 300 * b, t + 1000 + 100 * b])
            t += 10_000
    recs[6] = [[t, t + 2000, t + 2500, t + 9000, t + 1000]]
    counts = [len(recs[st]) for st in range(7)]
    with open(path, "wb") as f:
        f.write(struct.pack("iii", n_layers, 7, 5) + np.array(counts, np.uint32).tobytes())
        for st in range(7):
            if recs[st]:
                f.write(np.array(recs[st], np.uint64).tobytes())


def test_trace_summary(tmp_path):
    blocks = {1: 4, 2: 2, 3: 4, 4: 4, 5: 4}
    path = tmp_path / "t.bin"
    write_trace(path, 3, blocks)
    n_layers, recs = step_trace.read(path)
    assert n_layers == 3 and [len(r) for r in recs] == [0, 12, 6, 12, 12, 12, 1]
    rows, span = step_trace.summarize(n_layers, recs)
    # o_proj after attention: attention's last block (of 2) is done at +5.3 us after its start, o_proj
    # starts 10 us after attention did, so at +4.7 after attention's end; its 4 blocks at +0.1 steps.
    start_min, start_med, start_max, waited_min, waited_max, staged_med, _, done_med, _, done_max, n = rows[3][:11]
    ready_med, ready_max = rows[3][11:]
    assert n == 4
    assert np.allclose([start_min, start_med, start_max], [4.7, 4.85, 5.0])
    assert np.allclose([waited_min, waited_max, staged_med], [6.7, 6.7, 7.2])
    assert np.allclose([done_med, done_max], [9.7 + 0.45, 9.7 + 0.9])
    assert np.allclose([ready_med, ready_max], [5.7 + 0.15, 5.7 + 0.3])
    # 3 layers of 5 stages 10 us apart, the LM head's last stamp 9 us after its start
    assert np.isclose(span, 150 + 9)


def test_trace_summary_without_attention(tmp_path):
    """A trace with no attention records (attention not traced): o_proj follows QKV, and its times
    are after QKV's last block; a trace without QKV's records is refused."""
    path = tmp_path / "t.bin"
    write_trace(path, 3, {1: 4, 2: 0, 3: 4, 4: 4, 5: 4})
    rows, _ = step_trace.summarize(*step_trace.read(path))
    assert 2 not in rows and sorted(rows) == [1, 3, 4, 5, 6]
    # QKV's last block (of 4) is done at +5.9 us after its start, o_proj starts 10 us after QKV did
    assert np.allclose(rows[3][:3], [4.1, 4.25, 4.4])
    write_trace(path, 3, {1: 0, 2: 2, 3: 4, 4: 4, 5: 4})
    with pytest.raises(SystemExit, match="no records of qkv"):
        step_trace.summarize(*step_trace.read(path))
