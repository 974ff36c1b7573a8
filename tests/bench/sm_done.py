"""When each matvec block ends, by SM, from a build with -DTRACE_SM_DONE=1: each QKV, o_proj, gate/up
and down block prints one line once its warps are done, for some launches of each stage
(runtime/cuda_kernels.cuh),

    sm-done STAGE LAUNCH SM BLOCK NS

Other lines (the bench's) are skipped. An SM ends a launch when its last block does; its lateness
is that end less the launch's median SM end. A row per stage: launches, the tail (the last SM's
lateness, median over launches), and whether the late SMs are the same launch after launch: the
correlation over SMs of their mean lateness in even launches with that in odd ones (near 1: the
same SMs; near 0: anywhere), the share of each launch's latest tenth of SMs that are among the
latest tenth on average, and the SMs latest and earliest on average (µs).

    VARIANTS='-DTRACE_SM_DONE=1' BENCH_FLAGS='--bench-depths 0 -n 16' REPS=1 \\
        bash tests/bench/variants.sh mistral-7b-instruct-v0.2 > out.txt
    python3 tests/bench/sm_done.py out.txt
"""

from __future__ import annotations

import statistics
import sys

from report_file import probe_lines, report_main

STAGES = {1: "QKV", 3: "o_proj", 4: "gate/up", 5: "down"}  # runtime/cuda_kernels.cuh's ST_*


def _pearson(a: list[float], b: list[float]) -> float:
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b))
    va, vb = sum((x - ma) ** 2 for x in a), sum((y - mb) ** 2 for y in b)
    return cov / (va * vb) ** 0.5 if va > 0 and vb > 0 else 0.0


def _stage_row(name: str, launches: dict[int, dict[int, int]]) -> str:
    late: dict[int, dict[int, float]] = {}  # launch -> sm -> µs after the launch's median SM end
    for launch, ends in launches.items():
        mid = statistics.median(ends.values())
        late[launch] = {sm: (t - mid) / 1000 for sm, t in ends.items()}
    sms = sorted(set.intersection(*(set(v) for v in late.values())))
    order = sorted(late)
    mean = {sm: statistics.fmean(late[n][sm] for n in order) for sm in sms}
    even = [statistics.fmean(late[n][sm] for n in order[0::2]) for sm in sms]
    odd = [statistics.fmean(late[n][sm] for n in order[1::2]) for sm in sms] if len(order) > 1 else even
    tenth = max(1, len(sms) // 10)
    usual = set(sorted(sms, key=lambda sm: mean[sm])[-tenth:])
    hits = [len(usual & set(sorted(sms, key=lambda sm: late[n][sm])[-tenth:])) / tenth for n in order]
    tail = statistics.median(max(late[n].values()) for n in order)
    by_mean = sorted(sms, key=lambda sm: mean[sm])
    latest = ", ".join(f"{sm} {mean[sm]:+.2f}" for sm in reversed(by_mean[-4:]))
    earliest = ", ".join(f"{sm} {mean[sm]:+.2f}" for sm in by_mean[:4])
    return (f"| {name} | {len(order)} | {len(sms)} | {tail:.2f} | {_pearson(even, odd):.2f} | "
            f"{100 * statistics.fmean(hits):.0f}% | {latest} | {earliest} |")


def render(text: str) -> str:
    ends: dict[int, dict[int, dict[int, int]]] = {}  # stage -> launch -> sm -> its last block's end
    for stage, launch, sm, _block, t in probe_lines(text, "sm-done", 5):
        per_sm = ends.setdefault(stage, {}).setdefault(launch, {})
        per_sm[sm] = max(per_sm.get(sm, 0), t)
    if not ends:
        raise ValueError("no sm-done lines (a build with -DTRACE_SM_DONE=1 prints them)")
    out = ["SMs' ends after the launch's median SM end, µs",
           "| stage | launches | SMs | tail (median) | even/odd correlation | latest tenth as usual | "
           "latest SMs (mean) | earliest SMs (mean) |",
           "|---|---|---|---|---|---|---|---|"]
    for stage in sorted(ends):
        out.append(_stage_row(STAGES.get(stage, str(stage)), ends[stage]))
    return "\n".join(out)


def main(argv: list[str]) -> int:
    return report_main(argv, "sm_done", "OUTPUT  (of a -DTRACE_SM_DONE=1 build's run)", render)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
