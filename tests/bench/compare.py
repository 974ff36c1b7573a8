#!/usr/bin/env python3
"""Specialized against generic, split in two effects: one model, three builds, the same weights and prompts.

    make compare MODEL=<dir>        builds the three binaries, then runs this with --rebuild
    .venv/bin/python tests/bench/compare.py MODEL_DIR [--specialized BIN] [--generic-plan BIN] [--generic BIN]
                                    [options]

The builds:
- specialized (build/<name>/ingot): generated for this model, with its own plan (codegen/plan.py make_plan);
- generic-plan (build/<name>-generic-plan/ingot): the same specialized sources, dimensions as literals,
  but every plan decision as the generic build takes it (`make MODEL=<dir> PLAN=generic
  GEN=generated/<name>-generic-plan OUT=build/<name>-generic-plan`; codegen --set generic);
- generic (build/generic/ingot): runs any model directory given with -m, dimensions read at run time,
  the generic plan (make_generic_plan).
So specialized / generic-plan is the effect of the per-model plan choices alone (same constants), and
generic-plan / generic the effect of the compile-time constants alone (same plan, same algorithm);
their product is the total, specialized / generic.

All three get -m MODEL_DIR, so they map the same weights, and all run `--bench --json` (the same
built-in prompt, the same depths, the same number of decoded tokens, the same --threads) on the CPU
always and on the GPU when `nvidia-smi -L` lists one. Runs alternate between the builds, the order
rotated each repeat: A B C, B C A, C A B, A B C, ... (in every three repeats each build runs once in
each position, so neither running first nor a steady drift favours one), and every number reported is
the median of --repeats runs. Before the
first run the weights are read once so no build pays for a cold page cache.

Build time (--rebuild): make has already built the three binaries and everything they share
(build/runtime/, .venv); then, one build at a time, what belongs to that binary alone is deleted
(specialized: build/<name>/ and generated/<name>/, so code generation is timed too; generic-plan:
build/<name>-generic-plan/ and generated/<name>-generic-plan/; generic: build/generic/ and
generated/generic/) and a serial `make -s MODEL=<dir>` (plus PLAN=generic GEN=... OUT=..., or
GENERIC=1) is timed until it returns. Without --rebuild, build times are reported as not measured.

Where a binary prints per-stage timings (--bench-kernels, "kernels at depth N" tables), one more run
per build collects them and a side-by-side table with the three ratios is printed before the main
table ("-" where a build has no such stage or no tables).

Output: the tables on stdout, and in --out (default build/compare/<name>/): table.md (the same
tables), compare.json (every run's JSON, the medians, the sizes and build times) and compare.png
(decode tok/s against context depth, the three builds, one panel per device). The ratios, each
column named after its quotient:
    plan (spec/gen-plan)            specialized / generic-plan: the per-model plan choices
    constants (gen-plan/generic)    generic-plan / generic: the compile-time constants
    total (spec/generic)            specialized / generic: both
Above 1 means the first build has more of it (tok/s, GB/s, size, seconds), so for us/token and build
time below 1 is better for the first build.

A binary that fails ends this script: its one-line error is printed and the exit status is 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import png  # noqa: E402  (tests/bench/png.py, next to this file)

REPO = Path(__file__).resolve().parents[2]
BUILDS = ("specialized", "generic-plan", "generic")
# blue, green, orange
COLORS = {"specialized": (31, 119, 180), "generic-plan": (44, 160, 44), "generic": (255, 127, 14)}
MARKERS = {"specialized": "square", "generic-plan": "square", "generic": "disc"}
# The ratio columns: (header, numerator build, denominator build, what it measures)
EFFECTS = (("plan (spec/gen-plan)", "specialized", "generic-plan", "the per-model plan choices"),
           ("constants (gen-plan/generic)", "generic-plan", "generic", "the compile-time constants"),
           ("total (spec/generic)", "specialized", "generic", "both"))
SHORT = {"specialized": "spec", "generic-plan": "gen-plan", "generic": "generic"}
DEFAULT_DEPTHS = {"cpu": "0,256,1024", "cuda": "0,4096,16384,32768"}
DECODE_FIELDS = ("tok_s", "us_per_token", "gb_s", "share_of_probe")


class CompareError(Exception):
    """One line saying what failed; main prints it and exits 1."""


# ---------------------------------------------------------------------------------------------
# Running the binaries


def gpu_present() -> bool:
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and any(line.startswith("GPU ") for line in r.stdout.splitlines())


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no output)"


def run_bench(label: str, binary: Path, model_dir: Path, device: str, depths: list[int], n_tokens: int,
              threads: int | None, ctx: int | None, kernels: bool, timeout: float) -> tuple[dict, dict]:
    """One `ingot --bench --json` run: (its JSON object, its kernel tables by depth, {} when none)."""
    cmd = [str(binary), "-m", str(model_dir), "--bench", "--json", "--device", device,
           "--bench-depths", ",".join(map(str, depths)), "-n", str(n_tokens)]
    if threads:
        cmd += ["--threads", str(threads)]
    if ctx:
        cmd += ["--ctx", str(ctx)]
    if kernels:
        cmd.append("--bench-kernels")
    where = f"{label} ({binary}) on {device}"
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise CompareError(f"{where}: no result after {timeout:.0f} s: {' '.join(cmd)}") from None
    except OSError as e:
        raise CompareError(f"{where}: cannot run: {e}") from None
    if r.returncode != 0:
        raise CompareError(f"{where} exited {r.returncode}: {last_line(r.stderr or r.stdout)}")
    json_lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    if not json_lines:
        raise CompareError(f"{where}: no JSON line in its output: {last_line(r.stdout + r.stderr)}")
    try:
        result = json.loads(json_lines[-1])
    except json.JSONDecodeError as e:
        raise CompareError(f"{where}: malformed JSON ({e}): {json_lines[-1][:200]}") from None
    got = [d["depth"] for d in result.get("decode", [])]
    if got != depths:
        raise CompareError(f"{where}: decoded at depths {got}, asked for {depths}: {last_line(r.stderr)}")
    return result, parse_kernel_tables(r.stdout)


_KERNEL_HEAD = re.compile(r"^kernels at depth (\d+)(.*):\s*$")


def parse_kernel_tables(text: str) -> dict[int, dict]:
    """The "kernels at depth N (...)" tables of --bench-kernels, by depth:
    {"note": "(launched one by one, best of 20)", "stages": [{"stage", "launches", "us_per_token",
    "mb_per_token", "gb_s"}], "total": {"launches", "us_per_token"}}. Stage names may hold spaces:
    the numbers are read from the right."""
    tables: dict[int, dict] = {}
    current = None
    for line in text.splitlines():
        m = _KERNEL_HEAD.match(line)
        if m:
            current = {"note": m.group(2).strip(), "stages": [], "total": None}
            tables[int(m.group(1))] = current
            continue
        if current is None or not line.startswith(" "):
            current = None
            continue
        parts = line.split()
        if parts[:2] == ["stage", "launches"]:
            continue
        try:
            if parts[0] == "total" and len(parts) == 3:
                current["total"] = {"launches": int(parts[1]), "us_per_token": float(parts[2])}
                current = None
            elif len(parts) >= 5:
                launches, us, mb, gbs = int(parts[-4]), float(parts[-3]), float(parts[-2]), float(parts[-1])
                current["stages"].append({"stage": " ".join(parts[:-4]), "launches": launches,
                                          "us_per_token": us, "mb_per_token": mb, "gb_s": gbs})
            else:
                raise ValueError
        except ValueError:
            raise CompareError(f"kernel table: cannot read the line {line.strip()!r}") from None
    return tables


def warm_page_cache(model_dir: Path) -> None:
    """Reads the weights once, so the first run is not the only one loading them from disk."""
    for f in sorted(model_dir.glob("*.safetensors")):
        with open(f, "rb") as fh:
            while fh.read(64 << 20):
                pass


def rebuild(label: str, model_dir: Path, make_vars: list[str], clean: list[Path], binary: Path) -> float:
    """Deletes what belongs to this binary alone and times a serial `make -s` that rebuilds it:
    seconds."""
    for p in clean:
        shutil.rmtree(p, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    cmd = ["make", "-s", f"MODEL={model_dir}", *make_vars]
    t0 = time.monotonic()
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - t0
    if r.returncode != 0:
        raise CompareError(f"{label}: `{' '.join(cmd)}` failed: {last_line(r.stderr or r.stdout)}")
    if not binary.is_file():
        raise CompareError(f"{label}: `{' '.join(cmd)}` did not write {binary}")
    return seconds


# ---------------------------------------------------------------------------------------------
# Medians and tables


def median_result(runs: list[dict]) -> dict:
    """The median of each number over repeated runs of one build on one device."""
    out = {k: runs[0][k] for k in ("model", "device", "device_name", "threads", "weight_bytes_per_token",
                                    "kv_bytes_per_position", "prompt_tokens")}
    out["probe_gb_s"] = statistics.median(r["probe_gb_s"] for r in runs)
    out["prompt_tok_s"] = statistics.median(r["prompt_tok_s"] for r in runs)
    out["decode"] = []
    for i, d in enumerate(runs[0]["decode"]):
        row = {"depth": d["depth"], "tokens": d["tokens"]}
        for f in DECODE_FIELDS:
            row[f] = statistics.median(r["decode"][i][f] for r in runs)
        out["decode"].append(row)
    return out


def ratio(a, b) -> float | None:
    if a is None or b is None or not b:
        return None
    return a / b


def device_label(m: dict) -> str:
    if m["device"] == "cpu":
        return f"cpu, {m['threads']} thread{'s' if m['threads'] != 1 else ''}"
    return f"{m['device']}, {m['device_name']}"


def main_rows(medians: dict[str, dict[str, dict]], sizes: dict[str, int],
              build_s: dict[str, float | None]) -> list[tuple[str, str, dict[str, float | None]]]:
    """(metric, format, {build: value}) rows, one value per build in BUILDS: per device decode tok/s,
    us/token, GB/s and share of the in-run probe at each depth, prompt tok/s and the probe itself; then
    binary size and build time. medians: {device: {build: median_result}}."""
    rows = []
    for dev, by_build in medians.items():
        ms = [by_build[b] for b in BUILDS]
        for field, name, fmt in (("tok_s", "decode tok/s", "rate"), ("us_per_token", "us/token", "rate"),
                                 ("gb_s", "effective GB/s", "gbs"), ("share_of_probe", "share of probe", "pct")):
            for i, d in enumerate(ms[0]["decode"]):
                rows.append((f"{dev}: {name}, depth {d['depth']}", fmt,
                             {b: m["decode"][i][field] for b, m in zip(BUILDS, ms)}))
        rows.append((f"{dev}: prompt tok/s ({ms[0]['prompt_tokens']} tokens)", "rate",
                     {b: m["prompt_tok_s"] for b, m in zip(BUILDS, ms)}))
        rows.append((f"{dev}: read probe GB/s (in-run peak)", "gbs", {b: m["probe_gb_s"] for b, m in zip(BUILDS, ms)}))
    rows.append(("binary size, MB", "mb", {b: sizes[b] / 1e6 for b in BUILDS}))
    rows.append(("build time, s (clean rebuild, serial make)", "s", dict(build_s)))
    return rows


def effects(values: dict[str, float | None]) -> list[float | None]:
    """The EFFECTS ratios of one row's values: plan, constants, total."""
    return [ratio(values.get(num), values.get(den)) for _, num, den, _ in EFFECTS]


def fmt_value(v: float | None, fmt: str) -> str:
    if v is None:
        return "not measured"
    if fmt == "pct":
        return f"{100 * v:.1f}%"
    if fmt == "rate":
        return f"{v:.0f}" if v >= 1000 else f"{v:.1f}"
    if fmt == "mb":
        return f"{v:.2f}"
    return f"{v:.1f}"


def fmt_ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}"


def markdown_table(header: list[str], rows: list[list[str]], left_cols: int = 1) -> str:
    """A Markdown table whose columns line up in a terminal; the first left_cols columns left-aligned,
    the rest right-aligned."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells):
        return "| " + " | ".join(c.ljust(w) if i < left_cols else c.rjust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths))) + " |"

    sep = "|" + "|".join("-" * (w + 1) + ":" if i >= left_cols else ":" + "-" * (w + 1)
                         for i, w in enumerate(widths)) + "|"
    return "\n".join([line(header), sep, *(line(r) for r in rows)]) + "\n"


def format_main_table(rows) -> str:
    cells = [[name, *(fmt_value(v[b], fmt) for b in BUILDS), *(fmt_ratio(r) for r in effects(v))]
             for name, fmt, v in rows]
    return markdown_table(["metric", *BUILDS, *(e[0] for e in EFFECTS)], cells)


def format_kernel_tables(device: str, kernels: dict[str, dict[int, dict]]) -> str:
    """Per depth: each stage's launches and us/token for the three builds side by side, with the
    EFFECTS ratios of us/token. Stages are matched by name: the specialized build's order, then any
    the generic-plan build adds, then any the generic build adds; "-" where a build lacks one."""
    tabs = {b: kernels.get(b, {}) for b in BUILDS}
    out = []
    for depth in sorted(set().union(*tabs.values())):
        t = {b: tabs[b].get(depth) for b in BUILDS}
        by = {b: {st["stage"]: st for st in (t[b]["stages"] if t[b] else [])} for b in BUILDS}
        names = []
        for b in BUILDS:
            names += [n for n in by[b] if n not in names]
        rows = []
        for name in names + ["total"]:
            got = {b: ((t[b] or {}).get("total") if name == "total" else by[b].get(name)) for b in BUILDS}
            us = {b: got[b] and got[b]["us_per_token"] for b in BUILDS}
            rows.append([name,
                         *(str(got[b]["launches"]) if got[b] else "-" for b in BUILDS),
                         *(f"{got[b]['us_per_token']:.1f}" if got[b] else "-" for b in BUILDS),
                         *(fmt_ratio(r) for r in effects(us))])
        note = next(t[b] for b in BUILDS if t[b])["note"]
        out.append(f"kernels at depth {depth} on {device} {note}, us/token:\n")
        out.append(markdown_table(["stage", *(f"launches {SHORT[b]}" for b in BUILDS),
                                   *(f"{SHORT[b]} us" for b in BUILDS), *(e[0] for e in EFFECTS)], rows))
        out.append("\n")
    return "".join(out)


def chart(model: str, medians: dict[str, dict[str, dict]]):
    panels = []
    for dev, by_build in medians.items():
        data = {b: [(d["depth"], d["tok_s"]) for d in by_build[b]["decode"]] for b in BUILDS}
        panels.append((device_label(by_build["specialized"]), data))
    series = [(b, COLORS[b], MARKERS[b]) for b in BUILDS]
    return png.line_chart(f"{model}: decode tok/s against context depth", panels, series,
                          "context depth (tokens)", "decode tok/s")


# ---------------------------------------------------------------------------------------------


def rebuild_plans(name: str) -> dict[str, tuple[list[str], list[Path]]]:
    """For --rebuild, each build's make variables (beside MODEL=) and what belongs to it alone (deleted
    before the timed make): the Makefile's own GEN/OUT for specialized and generic, the compare
    target's for generic-plan."""
    return {"specialized": ([], [REPO / "build" / name, REPO / "generated" / name]),
            "generic-plan": (["PLAN=generic", f"GEN=generated/{name}-generic-plan", f"OUT=build/{name}-generic-plan"],
                             [REPO / "build" / f"{name}-generic-plan", REPO / "generated" / f"{name}-generic-plan"]),
            "generic": (["GENERIC=1"], [REPO / "build" / "generic", REPO / "generated" / "generic"])}


def run_order(repeat: int) -> tuple[str, ...]:
    """The builds' order in repeat number `repeat` (from 0): BUILDS rotated left by repeat, so over
    every len(BUILDS) repeats each build runs once in each position."""
    k = repeat % len(BUILDS)
    return BUILDS[k:] + BUILDS[:k]


def parse_depths(text: str) -> list[int]:
    try:
        depths = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text}: expected comma-separated non-negative integers") from None
    if not depths or min(depths) < 0:
        raise argparse.ArgumentTypeError(f"{text}: expected comma-separated non-negative integers")
    return depths


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", type=Path, help="Hugging Face model directory (or a name under models/)")
    p.add_argument("--specialized", type=Path, help="the specialized binary (default build/<name>/ingot)")
    p.add_argument("--generic-plan", type=Path,
                   help="the specialized binary built with the generic build's plan, make PLAN=generic "
                        "(default build/<name>-generic-plan/ingot)")
    p.add_argument("--generic", type=Path, help="the generic binary (default build/generic/ingot)")
    p.add_argument("--out", type=Path,
                   help="where table.md, compare.json, compare.png go (default build/compare/<name>)")
    p.add_argument("--devices", default="auto",
                   help="auto (cpu, and cuda when nvidia-smi lists a GPU), cpu, cuda or cpu,cuda")
    p.add_argument("--depths", type=parse_depths, help="context depths on every device (overrides the two below)")
    p.add_argument("--cpu-depths", type=parse_depths, default=parse_depths(DEFAULT_DEPTHS["cpu"]),
                   help=f"context depths on the CPU (default {DEFAULT_DEPTHS['cpu']})")
    p.add_argument("--gpu-depths", type=parse_depths, default=parse_depths(DEFAULT_DEPTHS["cuda"]),
                   help=f"context depths on the GPU (default {DEFAULT_DEPTHS['cuda']})")
    p.add_argument("-n", "--tokens", type=int, default=64, help="decoded tokens per depth (default 64)")
    p.add_argument("--threads", type=int, help="CPU threads for all three (default: the binaries' own, physical cores)")
    p.add_argument("--ctx", type=int, help="context length passed to all three (default: the binaries' own, the model's)")
    p.add_argument("--repeats", type=int, default=3, help="runs per build and device; medians are reported (default 3)")
    p.add_argument("--no-kernels", action="store_true", help="skip the per-stage (--bench-kernels) run")
    p.add_argument("--rebuild", action="store_true",
                   help="time a clean rebuild of each binary's own objects first (default binary paths only)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds one run may take (default 1800)")
    a = p.parse_args(argv)
    if a.repeats < 1 or a.tokens < 1:
        p.error("--repeats and --tokens must be at least 1")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    model_dir = a.model if (a.model.exists() or "/" in str(a.model)) else REPO / "models" / a.model
    model_dir = model_dir.resolve()
    name = model_dir.name
    config = model_dir / "config.json"
    if not config.is_file():
        raise CompareError(f"{model_dir}: no config.json, expected a Hugging Face model directory")
    binaries = {"specialized": (a.specialized or REPO / "build" / name / "ingot").resolve(),
                "generic-plan": (a.generic_plan or REPO / "build" / f"{name}-generic-plan" / "ingot").resolve(),
                "generic": (a.generic or REPO / "build" / "generic" / "ingot").resolve()}
    out_dir = (a.out or REPO / "build" / "compare" / name).resolve()

    build_s: dict[str, float | None] = {b: None for b in BUILDS}
    if a.rebuild:
        if a.specialized or a.generic_plan or a.generic:
            raise CompareError("--rebuild times the binaries at their default paths; "
                               "leave out --specialized/--generic-plan/--generic")
        plans = rebuild_plans(name)
        for b in BUILDS:
            make_vars, clean = plans[b]
            print(f"compare: timing a clean rebuild of {b} ({binaries[b]})", file=sys.stderr)
            build_s[b] = rebuild(b, model_dir, make_vars, clean, binaries[b])
    for b in BUILDS:
        if not (binaries[b].is_file() and os.access(binaries[b], os.X_OK)):
            raise CompareError(f"{b}: {binaries[b]}: no such executable (build it: make MODEL={model_dir}"
                               f"{''.join(' ' + v for v in rebuild_plans(name)[b][0])})")
    sizes = {b: binaries[b].stat().st_size for b in BUILDS}

    if a.devices == "auto":
        devices = ["cpu"] + (["cuda"] if gpu_present() else [])
    else:
        devices = a.devices.split(",")
        if not devices or any(d not in ("cpu", "cuda") for d in devices):
            raise CompareError(f"--devices {a.devices}: expected auto, cpu, cuda or cpu,cuda")
    ctx = a.ctx or json.loads(config.read_text())["max_position_embeddings"]

    warm_page_cache(model_dir)
    runs: dict[str, dict[str, list[dict]]] = {}
    medians: dict[str, dict[str, dict]] = {}
    kernels: dict[str, dict[str, dict]] = {}
    depths_by_device = {}
    for dev in devices:
        asked = a.depths or (a.cpu_depths if dev == "cpu" else a.gpu_depths)
        depths = [d for d in asked if d + a.tokens + 1 <= ctx]
        if depths != asked:
            print(f"compare: {dev}: depths {sorted(set(asked) - set(depths))} left out: with {a.tokens} decoded "
                  f"tokens they exceed the context of {ctx} (--ctx)", file=sys.stderr)
        if not depths:
            raise CompareError(f"{dev}: no depth fits the context of {ctx} tokens")
        depths_by_device[dev] = depths
        runs[dev] = {b: [] for b in BUILDS}
        for r in range(a.repeats):
            for b in run_order(r):
                print(f"compare: {dev} run {r + 1}/{a.repeats}: {b}", file=sys.stderr)
                result, _ = run_bench(b, binaries[b], model_dir, dev, depths, a.tokens, a.threads, a.ctx, False,
                                      a.timeout)
                runs[dev][b].append(result)
        medians[dev] = {b: median_result(runs[dev][b]) for b in BUILDS}
        wb = {b: medians[dev][b]["weight_bytes_per_token"] for b in BUILDS}
        if len(set(wb.values())) > 1:
            print(f"compare: warning: {dev}: the builds count different weight bytes per token "
                  f"({', '.join(f'{b} {v}' for b, v in wb.items())}): their GB/s differ by that too", file=sys.stderr)
        if not a.no_kernels:
            kernels[dev] = {}
            for b in BUILDS:
                print(f"compare: {dev} per-stage timings: {b}", file=sys.stderr)
                _, tables = run_bench(b, binaries[b], model_dir, dev, depths, min(a.tokens, 4), a.threads, a.ctx,
                                      True, a.timeout)
                if tables:
                    kernels[dev][b] = tables

    text = f"# {name}: specialized against generic, the plan's and the constants' effects apart\n\n"
    text += (f"- specialized (own plan): {binaries['specialized']}\n"
             f"- generic-plan (specialized, the generic build's plan): {binaries['generic-plan']}\n"
             f"- generic (dimensions at run time, generic plan): {binaries['generic']}\n"
             f"- devices: {'; '.join(device_label(medians[dev]['specialized']) for dev in devices)}\n"
             f"- median of {a.repeats} interleaved runs per build and device (order rotated each repeat), "
             f"{a.tokens} decoded tokens per depth\n"
             + "".join(f"- {head}: {num} / {den}, {what}\n" for head, num, den, what in EFFECTS) + "\n")
    for dev in devices:
        if kernels.get(dev):
            text += format_kernel_tables(dev, kernels[dev])
    rows = main_rows(medians, sizes, build_s)
    text += format_main_table(rows)
    print(text, end="")

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "table.md").write_text(text)
    report = {
        "model": name, "model_dir": str(model_dir), "repeats": a.repeats, "tokens": a.tokens,
        "order": "interleaved, rotated each repeat: A B C, B C A, C A B, ...; medians of each number",
        "build_timing": ("clean rebuild of build/<name>/ + generated/<name>/ (specialized), build/<name>-generic-plan/ "
                         "+ generated/<name>-generic-plan/ (generic-plan) and build/generic/ + generated/generic/ "
                         "(generic), serial make -s, shared objects already built") if a.rebuild else None,
        "effects": {head: {"numerator": num, "denominator": den, "measures": what} for head, num, den, what in EFFECTS},
        "builds": {b: {"binary": str(binaries[b]), "size_bytes": sizes[b], "build_s": build_s[b]} for b in BUILDS},
        "devices": {dev: {"depths": depths_by_device[dev], "runs": runs[dev], "median": medians[dev],
                          "kernels": {b: {str(k): v for k, v in t.items()} for b, t in kernels.get(dev, {}).items()}}
                    for dev in devices},
        "table": [{"metric": n, **v, "plan_effect": pe, "constants_effect": ce, "total": tot}
                  for n, _, v in rows for pe, ce, tot in [effects(v)]],
    }
    (out_dir / "compare.json").write_text(json.dumps(report, indent=1) + "\n")
    png.png_write(out_dir / "compare.png", chart(name, medians))
    print(f"\nwrote {out_dir}/table.md, compare.json, compare.png")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except CompareError as e:
        print(f"compare: {e}", file=sys.stderr)
        sys.exit(1)
