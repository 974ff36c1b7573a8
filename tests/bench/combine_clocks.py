"""The decode combine's own clock, from a build with -DTRACE_COMBINE_CLOCKS=1: its combining blocks'
thread 0 prints one line a combine (runtime/cuda_kernels.cuh),

    combine-clocks TOKENS N_ACTIVE C01 C12 C23 C34 NS

cycles from the block knowing it is last to the splits' (max, sum) in shared memory (C01), to the
weights (C12), to the outputs written (C23), to the count signalled (C34), and the nanoseconds of the
whole by %globaltimer. Other lines (the bench's) are skipped. A row per (tokens, splits): how many
combines, the median and 90th percentile of each part in cycles, the median whole in ns, and the
median clock the cycles imply (GHz), to tell a slow chain from a slow clock.

    VARIANTS='-DTRACE_COMBINE_CLOCKS=1' BENCH_FLAGS='--bench-depths 4096 -n 8' REPS=1 \\
        bash tests/bench/variants.sh llama-3.2-1b-instruct > out.txt
    python3 tests/bench/combine_clocks.py out.txt
"""

from __future__ import annotations

import statistics
import sys

from report_file import probe_lines, report_main

PARTS = ["to (max, sum)", "weights", "outputs", "signal"]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def render(text: str) -> str:
    groups: dict[tuple[int, int], list[list[int]]] = {}
    for values in probe_lines(text, "combine-clocks", 7):
        groups.setdefault((values[0], values[1]), []).append(list(values[2:]))
    if not groups:
        raise ValueError("no combine-clocks lines (a build with -DTRACE_COMBINE_CLOCKS=1 prints them)")
    cols = ["tokens", "splits", "combines"] + [f"{p} med / p90" for p in PARTS] + ["whole ns med", "GHz med"]
    out = ["cycles of the combining block's thread 0, part by part",
           "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for (tokens, splits), rows in sorted(groups.items()):
        cells = [str(tokens), str(splits), str(len(rows))]
        for k in range(len(PARTS)):
            part = [r[k] for r in rows]
            cells.append(f"{statistics.median(part):.0f} / {_percentile(part, 0.9):.0f}")
        cells.append(f"{statistics.median(r[4] for r in rows):.0f}")
        ghz = [sum(r[:4]) / r[4] for r in rows if r[4] > 0]
        cells.append(f"{statistics.median(ghz):.2f}" if ghz else "-")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    return report_main(argv, "combine_clocks", "OUTPUT  (of a -DTRACE_COMBINE_CLOCKS=1 build's run)", render)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
