"""Nsight Compute's text report (ncu's default output, the sections tests/bench/ncu.sh asks for) as
one line per profiled launch: what bounds each kernel, at a glance.

    python3 tests/bench/ncu_table.py REPORT.txt

Columns: the kernel (template arguments kept), grid x block, registers a thread, achieved
occupancy, duration (µs, at ncu's locked clock, so compare kernels with each other, not with
--bench), DRAM and L2 throughput and issue slots busy (% of peak), and the memory throughput in GB/s.
A metric a report lacks prints as '-'.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field

from report_file import report_main

HEADER = re.compile(r"^  (?:void )?([A-Za-z_]\w*(?:<[^>(]*>)?)\(.*\) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\), Context")
NOTES = {"OPT", "INF", "WRN", "Metric Name"}
TIME_UNITS = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}
RATE_UNITS = {"byte/s": 1e-9, "Kbyte/s": 1e-6, "Mbyte/s": 1e-3, "Gbyte/s": 1.0, "Tbyte/s": 1e3}


@dataclass
class Launch:
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    metrics: dict[tuple[str, str], str] = field(default_factory=dict)

    def number(self, name: str, unit: str) -> float | None:
        v = self.metrics.get((name, unit))
        if v is None:
            return None
        try:
            return float(v.replace(",", ""))
        except ValueError:
            return None

    def scaled(self, name: str, units: dict[str, float]) -> float | None:
        """The metric in whichever of units the report gave it, times that unit's scale."""
        for unit, scale in units.items():
            v = self.number(name, unit)
            if v is not None:
                return v * scale
        return None

    def duration_us(self) -> float | None:
        return self.scaled("Duration", TIME_UNITS)

    def memory_gbs(self) -> float | None:
        return self.scaled("Memory Throughput", RATE_UNITS)


def parse(text: str) -> list[Launch]:
    """The launches of a report, in order, each with its (metric name, unit) -> value."""
    launches: list[Launch] = []
    for line in text.splitlines():
        h = HEADER.match(line)
        if h:
            n = [int(x) for x in h.groups()[1:]]
            launches.append(Launch(h.group(1), (n[0], n[1], n[2]), (n[3], n[4], n[5])))
            continue
        # a metric: four spaces, its name, then its unit (if any) and value, apart by 2+ spaces
        if not launches or not line.startswith("    ") or line.startswith("     "):
            continue
        parts = re.split(r"\s{2,}", line.strip())
        if len(parts) not in (2, 3) or parts[0] in NOTES or parts[0].startswith("-"):
            continue
        name, unit, value = (parts[0], "", parts[1]) if len(parts) == 2 else parts
        launches[-1].metrics.setdefault((name, unit), value)
    return launches


def fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table(launches: list[Launch]) -> str:
    head = f"{'kernel':<40} {'grid x block':>22} {'regs':>5} {'occ%':>5} {'us':>8} {'dram%':>6} {'l2%':>6} {'issue%':>6} {'GB/s':>7}"
    rows = [head, "-" * len(head)]
    total = 0.0
    for x in launches:
        grid = "x".join(str(g) for g in x.grid if g > 1) or "1"
        shape = f"{grid} x {x.block[0] * x.block[1] * x.block[2]}"
        us = x.duration_us()
        total += us or 0.0
        rows.append(f"{x.kernel[:40]:<40} {shape:>22} {fmt(x.number('Registers Per Thread', 'register/thread'), '.0f'):>5} "
                    f"{fmt(x.number('Achieved Occupancy', '%'), '.1f'):>5} {fmt(us, '.2f'):>8} "
                    f"{fmt(x.number('DRAM Throughput', '%'), '.1f'):>6} {fmt(x.number('L2 Cache Throughput', '%'), '.1f'):>6} "
                    f"{fmt(x.number('Issue Slots Busy', '%'), '.1f'):>6} {fmt(x.memory_gbs(), '.0f'):>7}")
    rows.append(f"{len(launches)} launches, {total:.2f} us in all (one after another, at ncu's clock)")
    return "\n".join(rows)


def render(text: str) -> str:
    launches = parse(text)
    if not launches:
        raise ValueError("no profiled launch in it (is it ncu's text report?)")
    return table(launches)


def main(argv: list[str]) -> int:
    return report_main(argv, "ncu_table", "REPORT.txt", render)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
