#!/usr/bin/env python3
"""Specialized against generic: one model, two builds, the same weights and the same prompts.

    make compare MODEL=<dir>        builds both binaries, then runs this with --rebuild
    .venv/bin/python tests/bench/compare.py MODEL_DIR [--specialized BIN] [--generic BIN] [options]

The specialized binary (build/<name>/ingot) is generated for this model; the generic one
(build/generic/ingot) runs any model directory given with -m. Both get -m MODEL_DIR, so they map the
same weights, and both run `--bench --json` (the same built-in prompt, the same depths, the same
number of decoded tokens, the same --threads) on the CPU always and on the GPU when `nvidia-smi -L`
lists one. Runs alternate between the builds, in the order A B, B A, A B, ... (drift and which
build runs first cancel out), and every number reported is the median of --repeats runs. Before the
first run the weights are read once so neither build pays for a cold page cache.

Build time (--rebuild): make has already built both binaries and everything they share
(build/runtime/, .venv); then, one build at a time, what belongs to that binary alone is deleted
(specialized: build/<name>/ and generated/<name>/, so code generation is timed too; generic:
build/generic/ and generated/generic/) and a serial `make -s MODEL=<dir>` (plus GENERIC=1) is timed
until it returns. Without --rebuild, build times are reported as not measured.

Where a binary prints per-stage timings (--bench-kernels, "kernels at depth N" tables), one more run
per build collects them and a side-by-side table with the ratio is printed before the main table.

Output: the tables on stdout, and in --out (default build/compare/<name>/): table.md (the same
tables), compare.json (every run's JSON, the medians, the sizes and build times) and compare.png
(decode tok/s against context depth, both builds, one panel per device). Ratios are
specialized / generic: above 1 means the specialized build has more of it (tok/s, GB/s, size,
seconds), so for us/token and build time below 1 is better for the specialized build.

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
BUILDS = ("specialized", "generic")
COLORS = {"specialized": (31, 119, 180), "generic": (255, 127, 14)}  # blue, orange
MARKERS = {"specialized": "square", "generic": "disc"}
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
              build_s: dict[str, float | None]) -> list[tuple[str, str, float | None, float | None]]:
    """(metric, format, specialized, generic) rows: per device decode tok/s, us/token, GB/s and share of
    the in-run probe at each depth, prompt tok/s and the probe itself; then binary size and build
    time. medians: {device: {build: median_result}}."""
    rows = []
    for dev, by_build in medians.items():
        s, g = by_build["specialized"], by_build["generic"]
        where = dev
        for field, name, fmt in (("tok_s", "decode tok/s", "rate"), ("us_per_token", "us/token", "rate"),
                                 ("gb_s", "effective GB/s", "gbs"), ("share_of_probe", "share of probe", "pct")):
            for ds, dg in zip(s["decode"], g["decode"]):
                rows.append((f"{where}: {name}, depth {ds['depth']}", fmt, ds[field], dg[field]))
        rows.append((f"{where}: prompt tok/s ({s['prompt_tokens']} tokens)", "rate", s["prompt_tok_s"],
                     g["prompt_tok_s"]))
        rows.append((f"{where}: read probe GB/s (in-run peak)", "gbs", s["probe_gb_s"], g["probe_gb_s"]))
    rows.append(("binary size, MB", "mb", sizes["specialized"] / 1e6, sizes["generic"] / 1e6))
    rows.append(("build time, s (clean rebuild, serial make)", "s", build_s["specialized"], build_s["generic"]))
    return rows


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
    cells = [[name, fmt_value(s, fmt), fmt_value(g, fmt), fmt_ratio(ratio(s, g))] for name, fmt, s, g in rows]
    return markdown_table(["metric", "specialized", "generic", "spec/generic"], cells)


def format_kernel_tables(device: str, kernels: dict[str, dict[int, dict]]) -> str:
    """Per depth: each stage's launches and us/token for both builds side by side, with the ratio.
    Stages are matched by name: the specialized build's order, then any the generic build adds."""
    s_tabs, g_tabs = kernels.get("specialized", {}), kernels.get("generic", {})
    out = []
    for depth in sorted(set(s_tabs) | set(g_tabs)):
        s, g = s_tabs.get(depth), g_tabs.get(depth)
        by_s = {st["stage"]: st for st in (s["stages"] if s else [])}
        by_g = {st["stage"]: st for st in (g["stages"] if g else [])}
        names = list(by_s) + [n for n in by_g if n not in by_s]
        rows = []
        for name in names + ["total"]:
            a = (s or {}).get("total") if name == "total" else by_s.get(name)
            b = (g or {}).get("total") if name == "total" else by_g.get(name)
            rows.append([name,
                         str(a["launches"]) if a else "-", str(b["launches"]) if b else "-",
                         f"{a['us_per_token']:.1f}" if a else "-", f"{b['us_per_token']:.1f}" if b else "-",
                         fmt_ratio(ratio(a and a["us_per_token"], b and b["us_per_token"]))])
        note = (s or g)["note"]
        out.append(f"kernels at depth {depth} on {device} {note}, us/token:\n")
        out.append(markdown_table(["stage", "launches spec", "launches generic", "spec us", "generic us",
                                   "spec/generic"], rows))
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
    p.add_argument("--threads", type=int, help="CPU threads for both (default: the binaries' own, physical cores)")
    p.add_argument("--ctx", type=int, help="context length passed to both (default: the binaries' own, the model's)")
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
                "generic": (a.generic or REPO / "build" / "generic" / "ingot").resolve()}
    out_dir = (a.out or REPO / "build" / "compare" / name).resolve()

    build_s: dict[str, float | None] = {b: None for b in BUILDS}
    if a.rebuild:
        if a.specialized or a.generic:
            raise CompareError("--rebuild times the binaries at their default paths; leave out --specialized/--generic")
        plans = {"specialized": ([], [REPO / "build" / name, REPO / "generated" / name]),
                 "generic": (["GENERIC=1"], [REPO / "build" / "generic", REPO / "generated" / "generic"])}
        for b in BUILDS:
            make_vars, clean = plans[b]
            print(f"compare: timing a clean rebuild of {b} ({binaries[b]})", file=sys.stderr)
            build_s[b] = rebuild(b, model_dir, make_vars, clean, binaries[b])
    for b in BUILDS:
        if not (binaries[b].is_file() and os.access(binaries[b], os.X_OK)):
            raise CompareError(f"{b}: {binaries[b]}: no such executable (build it: make MODEL={model_dir}"
                               f"{' GENERIC=1' if b == 'generic' else ''})")
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
            for b in (BUILDS if r % 2 == 0 else BUILDS[::-1]):
                print(f"compare: {dev} run {r + 1}/{a.repeats}: {b}", file=sys.stderr)
                result, _ = run_bench(b, binaries[b], model_dir, dev, depths, a.tokens, a.threads, a.ctx, False,
                                      a.timeout)
                runs[dev][b].append(result)
        medians[dev] = {b: median_result(runs[dev][b]) for b in BUILDS}
        s, g = medians[dev]["specialized"], medians[dev]["generic"]
        if s["weight_bytes_per_token"] != g["weight_bytes_per_token"]:
            print(f"compare: warning: {dev}: the builds count different weight bytes per token "
                  f"({s['weight_bytes_per_token']} and {g['weight_bytes_per_token']}): their GB/s differ by that too",
                  file=sys.stderr)
        if not a.no_kernels:
            kernels[dev] = {}
            for b in BUILDS:
                print(f"compare: {dev} per-stage timings: {b}", file=sys.stderr)
                _, tables = run_bench(b, binaries[b], model_dir, dev, depths, min(a.tokens, 4), a.threads, a.ctx,
                                      True, a.timeout)
                if tables:
                    kernels[dev][b] = tables

    text = f"# {name}: specialized against generic\n\n"
    text += (f"- specialized: {binaries['specialized']}\n- generic: {binaries['generic']}\n"
             f"- devices: {'; '.join(device_label(medians[dev]['specialized']) for dev in devices)}\n"
             f"- median of {a.repeats} interleaved runs per build and device, {a.tokens} decoded tokens per depth; "
             f"ratio = specialized / generic\n\n")
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
        "order": "interleaved: A B, B A, A B, ...; medians of each number",
        "build_timing": ("clean rebuild of build/<name>/ + generated/<name>/ (specialized) and build/generic/ "
                         "(generic), serial make -s, shared objects already built") if a.rebuild else None,
        "builds": {b: {"binary": str(binaries[b]), "size_bytes": sizes[b], "build_s": build_s[b]} for b in BUILDS},
        "devices": {dev: {"depths": depths_by_device[dev], "runs": runs[dev], "median": medians[dev],
                          "kernels": {b: {str(k): v for k, v in t.items()} for b, t in kernels.get(dev, {}).items()}}
                    for dev in devices},
        "table": [{"metric": n, "specialized": s, "generic": g, "ratio": ratio(s, g)} for n, _, s, g in rows],
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
