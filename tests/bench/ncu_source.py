"""Nsight Compute's source page as where one kernel's warps wait: stall samples by reason, before and
after its grid-dependency wait, and by region of code between landmark instructions.

    ncu --kernel-name regex:^attention_kernel --launch-skip 60 --launch-count 4 --section SourceCounters \\
        --warp-sampling-interval 0 -o R build/bench-M/ingot -m DIR --device cuda --bench --bench-depths 0 -n 8
    ncu --import R.ncu-rep --page source --print-source sass --csv > R.csv
    python3 tests/bench/ncu_source.py R.csv

Several profiled launches of the kernel add up, instruction by instruction (the same code). The
landmarks are the grid-dependency wait (ACQBULK: griddepcontrol.wait), block barriers, the first mma
or wgmma (HGMMA) of each run of them, wgmma's fences and waits (WARPGROUP.ARRIVE, WARPGROUP.DEPBAR),
exponentials, cp.async waits, global stores and exits; a region's samples are
those of the instructions after the previous landmark, up to and including this one. Only executed
landmarks are listed. Its reading of the 1B decode attention at depth 0 (the blocks without positions
took 84% of the stall samples) is behind docs/performance.md's short-context rows (D55).
"""

from __future__ import annotations

import csv
import io
import sys
from dataclasses import dataclass

from report_file import report_main

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
LANDMARKS = ("ACQBULK", "BAR.SYNC", "HMMA", "HGMMA", "WARPGROUP", "MUFU.EX2", "DEPBAR", "STG", "EXIT")


@dataclass
class Source:
    kernel: str
    launches: int
    code: list[str]  # SASS text, by instruction
    executed: list[float]
    samples: list[float]
    reasons: dict[str, list[float]]  # stall reason (without "stall_") -> samples by instruction


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def parse(text: str) -> Source:
    """The launches of the CSV summed by instruction. ValueError when it has no launch, when its
    launches are not one kernel's code, or when it lacks the sampling columns."""
    rows = list(csv.reader(io.StringIO(text)))
    launches: list[tuple[str, list[list[str]]]] = []
    for row in rows:
        if row and row[0] == "Kernel Name":
            launches.append((row[1] if len(row) > 1 else "?", []))
        elif launches and row:
            launches[-1][1].append(row)
    if not launches or not launches[0][1]:
        raise ValueError("no profiled launch (a 'Kernel Name' row and its table): not ncu's --page source --csv")
    header = launches[0][1][0]
    col = {name: i for i, name in enumerate(header)}
    for need in ("Source", SAMPLES, EXECUTED):
        if need not in col:
            raise ValueError(f"no '{need}' column: profile with --section SourceCounters")
    reason_cols = [c for c in header if c.startswith("stall_") and not c.endswith("(Not Issued)")]
    n = len(launches[0][1]) - 1
    src = Source(launches[0][0], len(launches), [r[col["Source"]].strip() for r in launches[0][1][1:]],
                 [0.0] * n, [0.0] * n, {c[len("stall_"):]: [0.0] * n for c in reason_cols})
    for name, table in launches:
        if table[0] != header or len(table) - 1 != n or [r[col["Source"]].strip() for r in table[1:]] != src.code:
            raise ValueError(f"launches of different code ({src.kernel} and {name}): profile one kernel")
        for i, r in enumerate(table[1:]):
            src.executed[i] += _number(r[col[EXECUTED]])
            src.samples[i] += _number(r[col[SAMPLES]])
            for c in reason_cols:
                src.reasons[c[len("stall_"):]][i] += _number(r[col[c]])
    return src


def _opcode(sass: str) -> str:
    words = [w for w in sass.split() if not w.startswith("@")]
    return words[0] if words else ""


def render(text: str) -> str:
    src = parse(text)
    total = sum(src.samples)
    if total == 0:
        raise ValueError("no stall samples: profile with --section SourceCounters")
    waits = [i for i, s in enumerate(src.code) if _opcode(s).startswith("ACQBULK") and src.executed[i] > 0]
    after = waits[0] + 1 if waits else None
    out = [f"{src.kernel[:100]}: {src.launches} launch(es), {total:.0f} stall samples, {len(src.code)} instructions", ""]

    cols = ["reason", "all"] + (["after the wait"] if after is not None else [])
    out += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    tail = sum(src.samples[after:]) if after is not None else 0.0
    for reason, by_ins in sorted(src.reasons.items(), key=lambda kv: -sum(kv[1])):
        s = sum(by_ins)
        if s == 0:
            continue
        cells = [reason, f"{100 * s / total:.1f}%"]
        if after is not None:
            cells.append(f"{100 * sum(by_ins[after:]) / tail:.1f}%" if tail else "-")
        out.append("| " + " | ".join(cells) + " |")

    def row(label: str, executed: str, start: int, end: int) -> str:
        seg = sum(src.samples[start:end])
        share = f"{100 * seg / total:.1f}%"
        if after is not None:
            share += f" | {100 * seg / tail:.1f}%" if start >= after and tail else " | -"
        return f"| {label} | {executed} | {seg:.0f} | {share} |"

    cols = ["region up to", "executed", "samples", "share"] + (["share after the wait"] if after is not None else [])
    out += ["", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    start, previous = 0, ""
    for i, sass in enumerate(src.code):
        op = _opcode(sass)
        if src.executed[i] == 0 or not op.startswith(LANDMARKS):
            continue
        if op.startswith(("HMMA", "HGMMA")) and previous[:4] == op[:4]:
            continue  # a run of mma or wgmma (other instructions between them) is one landmark, its first
        out.append(row(f"{i}: {sass[:60]}", f"{src.executed[i]:.0f}", start, i + 1))
        start, previous = i + 1, op
    if start < len(src.code):
        out.append(row("(the rest)", "-", start, len(src.code)))
    return "\n".join(out)


def main(argv: list[str]) -> int:
    return report_main(argv, "ncu_source", "SOURCE.csv  (ncu --import R --page source --print-source sass --csv)", render)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
