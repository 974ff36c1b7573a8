"""QKV's pairs warp by warp, from a build with -DTRACE_QKV_PAIRS=1: at one decode position each QKV
block's first warp prints one line a layer (runtime/cuda_kernels.cuh),

    qkv-pairs LAYER SM BLOCK PAIRS D1 D2 D3

its layer (an id), SM, block, how many pairs it took, and the ns from its input staged to its first
pair's end (D1), then from each pair's end to the next's (D2, D3; 0 past its pairs). Other lines (the
bench's) are skipped. Two tables: the pairs' times by how many pairs the warp took, and a second
pair's time by how many of its SM's blocks took one too (does a pair go faster when its SM, and
the GPU, have less to do?).

    VARIANTS='-DTRACE_QKV_PAIRS=1' BENCH_FLAGS='--bench-depths 0 -n 8' REPS=1 \\
        bash tests/bench/variants.sh mistral-7b-instruct-v0.2 > out.txt
    python3 tests/bench/qkv_pairs.py out.txt
"""

from __future__ import annotations

import statistics
import sys

from report_file import probe_lines, report_main


def _percentile(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _cell(values: list[int]) -> str:
    return f"{statistics.median(values) / 1000:.2f} / {_percentile(values, 0.9) / 1000:.2f}" if values else "-"


def render(text: str) -> str:
    rows = probe_lines(text, "qkv-pairs", 7, hex_first=True)  # (layer, sm, block, pairs, d1, d2, d3)
    if not rows:
        raise ValueError("no qkv-pairs lines (a build with -DTRACE_QKV_PAIRS=1 prints them)")
    out = [f"{len(rows)} blocks over {len({r[0] for r in rows})} layers; µs, median / p90",
           "| pairs a warp | blocks | staged to the first pair's end | the second pair | the third |", "|---|---|---|---|---|"]
    for n in sorted({r[3] for r in rows}):
        some = [r for r in rows if r[3] == n]
        out.append(f"| {n} | {len(some)} | {_cell([r[4] for r in some])} | {_cell([r[5] for r in some if n > 1])} | "
                   f"{_cell([r[6] for r in some if n > 2])} |")
    second: dict[tuple[int, int], int] = {}  # (layer, sm) -> its blocks with a second pair
    for r in rows:
        if r[3] > 1:
            second[(r[0], r[1])] = second.get((r[0], r[1]), 0) + 1
    if second:
        out += ["", "| the SM's blocks with a second pair | blocks | the second pair |", "|---|---|---|"]
        for k in sorted(set(second.values())):
            times = [r[5] for r in rows if r[3] > 1 and second[(r[0], r[1])] == k]
            out.append(f"| {k} | {len(times)} | {_cell(times)} |")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    return report_main(argv, "qkv_pairs", "OUTPUT  (of a -DTRACE_QKV_PAIRS=1 build's run)", render)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
