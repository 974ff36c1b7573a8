"""tests/bench/variants.sh's output as one markdown table a model: each variant's decode and prompt
tok/s at each depth over its rounds (min-max), and the change of its mean against the plain build's.
Prompts of other lengths than --bench's 128 tokens (variants.sh's PROMPTS) are columns of their own,
"prompt(N) depth"; with --bench-kernels, so is each prompt batch size's time as its graph, "batch(N)
us depth" (lower is faster: its change against plain is negative then).

    python3 tests/bench/variants_summary.py OUTPUT.txt

variants.sh prints this itself after its rounds; the script reads a saved output again.
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict

from report_file import report_main

RUN = re.compile(r"^== (\S+), (.*), round (\d+)$")
DECODE = re.compile(r"decode at depth (\d+): \d+ tokens, ([\d.]+) tok/s.*= ([\d.]+)% of probe")
PROMPT = re.compile(r"prompt(?: at depth (\d+))?: (\d+) tokens, ([\d.]+) tok/s")
BENCH_PROMPT = 128  # --bench's prompt tokens unless --bench-prompt says otherwise
PROBE = re.compile(r"read bandwidth probe: ([\d.]+) GB/s")
BATCH = re.compile(r"^a prefill batch of (\d+) tokens at depth (\d+) ")  # --bench-kernels' table head ...
GRAPH = re.compile(r"^  as its graph: ([\d.]+) us/batch")  # ... and its last line
PLAIN = "plain"


def parse(text: str) -> dict[str, dict[str, dict[tuple[str, int], list[float]]]]:
    """{model: {variant: {(kind, depth): [tok/s a round]}}}, kind "decode", "share" (% of the
    probe), "prompt" (128 tokens), "prompt(N)" (N tokens), "batch(N) us" (a prompt batch of N as
    its graph, µs) or "probe" (GB/s, depth 0), in the order the output has them."""
    runs: dict[str, dict[str, dict[tuple[str, int], list[float]]]] = {}
    cur = None
    batch = None  # the --bench-kernels batch table being read: (tokens, depth)
    for line in text.splitlines():
        m = RUN.match(line)
        if m:
            cur = runs.setdefault(m.group(1), {}).setdefault(m.group(2), defaultdict(list))
            continue
        if cur is None:
            continue
        if m := BATCH.match(line):
            batch = int(m.group(1)), int(m.group(2))
        elif (m := GRAPH.match(line)) and batch:
            cur[f"batch({batch[0]}) us", batch[1]].append(float(m.group(1)))
            batch = None
        elif m := DECODE.search(line):
            cur["decode", int(m.group(1))].append(float(m.group(2)))
            cur["share", int(m.group(1))].append(float(m.group(3)))
        elif m := PROMPT.search(line):
            tokens = int(m.group(2))
            kind = "prompt" if tokens == BENCH_PROMPT else f"prompt({tokens})"
            cur[kind, int(m.group(1) or 0)].append(float(m.group(3)))
        elif m := PROBE.search(line):
            cur["probe", 0].append(float(m.group(1)))
    return runs


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def cell(xs: list[float], base: list[float] | None) -> str:
    """min-max over the rounds (one value when they agree to the digit), and against base's mean."""
    digits = 0 if max(xs) >= 10000 else 1
    lo, hi = f"{min(xs):.{digits}f}", f"{max(xs):.{digits}f}"
    text = lo if lo == hi else f"{lo}-{hi}"
    if base:
        text += f" ({mean(xs) / mean(base) * 100 - 100:+.1f}%)"
    return text


def table(model: str, variants: dict[str, dict[tuple[str, int], list[float]]]) -> str:
    if PLAIN not in variants:
        raise ValueError(f"{model}: no plain build in the output")
    keys = [k for k in variants[PLAIN] if k[0] == "decode" or k[0].startswith(("prompt", "batch("))]
    head = ["variant"] + [f"{kind} {depth}" for kind, depth in keys] + ["probe GB/s"]
    rows = [f"**{model}**", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, res in variants.items():
        base = None if name == PLAIN else variants[PLAIN]
        cells = [cell(res[k], base and base[k]) if res.get(k) else "-" for k in keys]
        probe = cell(res["probe", 0], None) if res.get(("probe", 0)) else "-"
        label = "plain" if name == PLAIN else f"`{name}`"
        rows.append("| " + " | ".join([label] + cells + [probe]) + " |")
    return "\n".join(rows)


def render(text: str) -> str:
    runs = parse(text)
    if not runs:
        raise ValueError("no variants.sh rounds in it")
    return "\n\n".join(table(m, v) for m, v in runs.items())


def main(argv: list[str]) -> int:
    return report_main(argv, "variants_summary", "OUTPUT.txt", render)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
