"""tests/bench/compare.py (make compare) and its PNG writer tests/bench/png.py: tables and the three
ratios (plan effect, constants effect, total) from canned runs, the --bench-kernels parser, the PNG's
bytes, the whole script against three fake binaries (rotated interleaving, medians, a failing binary),
the make compare recipe, and one real run on the default model with its three real builds
(specialized, specialized with the generic plan, generic)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest

from conftest import REPO, build_generic, make

sys.path.insert(0, str(REPO / "tests" / "bench"))
import compare  # noqa: E402
import png  # noqa: E402

COMPARE = REPO / "tests" / "bench" / "compare.py"


def bench_json(device="cpu", tok_s=(100.0, 80.0), prompt=200.0, probe=40.0, threads=2, depths=(0, 64)):
    """What `ingot --bench --json` prints (runtime/main.c run_bench), with chosen speeds."""
    wb, kvb = 269030016, 23040
    decode = []
    for d, t in zip(depths, tok_s):
        gbs = (wb + kvb * d) * t / 1e9
        decode.append({"depth": d, "tokens": 64, "tok_s": t, "us_per_token": 1e6 / t, "gb_s": gbs,
                       "share_of_probe": gbs / probe})
    return {"model": "smollm2-135m-instruct", "device": device, "device_name": "NVIDIA H200" if device == "cuda" else "cpu",
            "threads": threads if device == "cpu" else 0, "weight_bytes_per_token": wb, "kv_bytes_per_position": kvb,
            "probe_gb_s": probe, "prompt_tokens": 128, "prompt_tok_s": prompt, "decode": decode}


# the main table's columns after "metric": the three builds' medians, then the two effects and the total
MAIN_HEADER = ["specialized", "generic-plan", "generic", "plan (spec/gen-plan)", "constants (gen-plan/generic)",
               "total (spec/generic)"]


def table_cells(text: str) -> dict[str, list[str]]:
    """A Markdown table's rows by their first cell."""
    rows = {}
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("|:"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    return rows


# ---------------------------------------------------------------------------------------------
# Medians, rows, tables


def test_median_of_runs():
    runs = [bench_json(tok_s=(90.0, 10.0), prompt=300.0), bench_json(tok_s=(200.0, 30.0), prompt=100.0),
            bench_json(tok_s=(100.0, 20.0), prompt=200.0)]
    m = compare.median_result(runs)
    assert [d["tok_s"] for d in m["decode"]] == [100.0, 20.0]
    assert m["decode"][1]["us_per_token"] == pytest.approx(1e6 / 20.0)
    assert m["prompt_tok_s"] == 200.0 and m["threads"] == 2 and m["prompt_tokens"] == 128


def test_main_table_values_and_ratios():
    # plan effect 2.00 and constants effect 1.25 at depth 0 (total 2.50); at depth 64 the plan costs
    # (0.80) and the constants win (1.60)
    medians = {"cpu": {"specialized": bench_json(tok_s=(100.0, 64.0), prompt=200.0),
                       "generic-plan": bench_json(tok_s=(50.0, 80.0), prompt=250.0),
                       "generic": bench_json(tok_s=(40.0, 50.0), prompt=125.0)},
               "cuda": {"specialized": bench_json("cuda", tok_s=(2000.0, 1500.0), probe=4000.0),
                        "generic-plan": bench_json("cuda", tok_s=(1600.0, 1500.0), probe=4000.0),
                        "generic": bench_json("cuda", tok_s=(1000.0, 1000.0), probe=4000.0)}}
    rows = compare.main_rows(medians, {"specialized": 1_340_000, "generic-plan": 1_608_000, "generic": 2_680_000},
                             {"specialized": 12.0, "generic-plan": 15.0, "generic": None})
    text = compare.format_main_table(rows)
    cells = table_cells(text)
    assert cells["metric"] == MAIN_HEADER
    assert cells["cpu: decode tok/s, depth 0"] == ["100.0", "50.0", "40.0", "2.00", "1.25", "2.50"]
    assert cells["cpu: decode tok/s, depth 64"] == ["64.0", "80.0", "50.0", "0.80", "1.60", "1.28"]
    assert cells["cpu: us/token, depth 0"] == ["10000", "20000", "25000", "0.50", "0.80", "0.40"]
    assert cells["cpu: share of probe, depth 0"][3:] == ["2.00", "1.25", "2.50"]
    assert cells["cpu: share of probe, depth 0"][0] == f"{100 * 269030016 * 100 / 1e9 / 40:.1f}%"
    assert cells["cpu: prompt tok/s (128 tokens)"] == ["200.0", "250.0", "125.0", "0.80", "2.00", "1.60"]
    assert cells["cuda: decode tok/s, depth 0"] == ["2000", "1600", "1000", "1.25", "1.60", "2.00"]
    assert cells["cuda: us/token, depth 64"] == ["666.7", "666.7", "1000", "1.00", "0.67", "0.67"]
    assert cells["binary size, MB"] == ["1.34", "1.61", "2.68", "0.83", "0.60", "0.50"]
    assert cells["build time, s (clean rebuild, serial make)"] == ["12.0", "15.0", "not measured", "0.80", "-", "-"]
    assert len(rows) == 2 * (4 * 2 + 2) + 2
    # the two effects multiply to the total, row by row
    for _, _, values in rows[:-1]:
        plan, constants, total = compare.effects(values)
        assert plan * constants == pytest.approx(total)
    lines = text.splitlines()
    assert len({len(line) for line in lines}) == 1, "columns do not line up"
    assert lines[1].startswith("|:-") and lines[1].endswith("-:|") and lines[1].count("-:|") == 6


def test_run_order_rotates():
    orders = [compare.run_order(r) for r in range(6)]
    assert orders[:3] == [("specialized", "generic-plan", "generic"), ("generic-plan", "generic", "specialized"),
                          ("generic", "specialized", "generic-plan")]
    assert orders[3:] == orders[:3]
    # in every three repeats each build once in each position, so a steady drift favours none
    for b in compare.BUILDS:
        assert sorted(o.index(b) for o in orders[:3]) == [0, 1, 2]
        assert sum(3 * r + o.index(b) for r, o in enumerate(orders[:3])) == 12


def test_rebuild_plans():
    plans = compare.rebuild_plans("m")
    assert list(plans) == list(compare.BUILDS)
    assert plans["specialized"] == ([], [REPO / "build" / "m", REPO / "generated" / "m"])
    assert plans["generic-plan"] == (["PLAN=generic", "GEN=generated/m-generic-plan", "OUT=build/m-generic-plan"],
                                     [REPO / "build" / "m-generic-plan", REPO / "generated" / "m-generic-plan"])
    assert plans["generic"] == (["GENERIC=1"], [REPO / "build" / "generic", REPO / "generated" / "generic"])


def test_make_compare_builds_the_three(default_model):
    """make -n compare: the generic-plan build (its own GEN and OUT) and the generic one before compare.py."""
    r = subprocess.run(["make", "-n", "compare", f"MODEL={default_model}"], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    name = default_model.name
    mid = [i for i, line in enumerate(lines) if "make" in line and "PLAN=generic" in line
           and f"GEN=generated/{name}-generic-plan" in line and f"OUT=build/{name}-generic-plan" in line]
    gen = [i for i, line in enumerate(lines) if "make" in line and "GENERIC=1" in line]
    run = [i for i, line in enumerate(lines) if "tests/bench/compare.py" in line and "--rebuild" in line]
    assert mid and gen and run, r.stdout
    assert mid[0] < run[0] and gen[0] < run[0]


# ---------------------------------------------------------------------------------------------
# --bench-kernels tables


def kernel_text(depth: int, stages: list[tuple[str, int, float, float]], reps: int = 20) -> str:
    """model_cuda_kernel_bench's output (runtime/cuda_kernel_bench.cuh), with its format strings."""
    out = f"kernels at depth {depth} (launched one by one, best of {reps}):\n"
    out += "  %-24s %8s %12s %10s %8s\n" % ("stage", "launches", "us/token", "MB/token", "GB/s")
    total = 0.0
    for name, calls, us, mb in stages:
        out += "  %-24s %8d %12.1f %10.2f %8.0f\n" % (name, calls, us, mb, mb * 1e6 / (us * 1e3))
        total += us
    out += "  %-24s %8d %12.1f\n" % ("total", sum(s[1] for s in stages), total)
    return out


SPEC_STAGES = [("embed", 1, 2.0, 0.0), ("rmsnorm_qkv_rope", 30, 60.0, 26.5), ("attention", 30, 90.5, 1.4),
               ("rmsnorm_lm_head_argmax", 1, 20.0, 56.6)]
GEN_STAGES = [("embed", 1, 4.0, 0.0), ("rmsnorm_qkv_rope", 30, 120.0, 26.5), ("attention", 30, 90.5, 1.4),
              ("rope apply", 30, 10.0, 0.0), ("rmsnorm_lm_head_argmax", 1, 40.0, 56.6)]


def test_parse_kernel_tables():
    text = kernel_text(0, SPEC_STAGES) + kernel_text(4096, SPEC_STAGES) + '{"model": "x"}\n'
    t = compare.parse_kernel_tables(text)
    assert sorted(t) == [0, 4096]
    assert t[0]["note"] == "(launched one by one, best of 20)"
    st = t[4096]["stages"]
    assert [s["stage"] for s in st] == [s[0] for s in SPEC_STAGES]
    assert st[1] == {"stage": "rmsnorm_qkv_rope", "launches": 30, "us_per_token": 60.0, "mb_per_token": 26.5,
                     "gb_s": 442.0}
    assert t[0]["total"] == {"launches": 62, "us_per_token": 172.5}
    # a stage name with a space, read from the right
    assert compare.parse_kernel_tables(kernel_text(7, GEN_STAGES))[7]["stages"][3]["stage"] == "rope apply"
    assert compare.parse_kernel_tables("bench: no tables here\n") == {}


def test_parse_kernel_tables_refuses_garbage():
    text = kernel_text(0, SPEC_STAGES).replace("   60.0 ", "   six  ")
    with pytest.raises(compare.CompareError, match="rmsnorm_qkv_rope"):
        compare.parse_kernel_tables(text)


PLAN_STAGES = [("embed", 1, 2.0, 0.0), ("rmsnorm_qkv_rope", 30, 80.0, 26.5), ("attention", 30, 181.0, 1.4),
               ("qkv split", 30, 5.0, 0.0), ("rmsnorm_lm_head_argmax", 1, 20.0, 56.6)]


def test_kernel_table_side_by_side():
    kernels = {"specialized": compare.parse_kernel_tables(kernel_text(0, SPEC_STAGES)),
               "generic-plan": compare.parse_kernel_tables(kernel_text(0, PLAN_STAGES)),
               "generic": compare.parse_kernel_tables(kernel_text(0, GEN_STAGES))}
    text = compare.format_kernel_tables("cuda", kernels)
    assert text.startswith("kernels at depth 0 on cuda (launched one by one, best of 20), us/token:")
    cells = table_cells(text)
    assert cells["stage"] == ["launches spec", "launches gen-plan", "launches generic", "spec us", "gen-plan us",
                              "generic us", "plan (spec/gen-plan)", "constants (gen-plan/generic)",
                              "total (spec/generic)"]
    assert cells["rmsnorm_qkv_rope"] == ["30", "30", "30", "60.0", "80.0", "120.0", "0.75", "0.67", "0.50"]
    assert cells["attention"][-3:] == ["0.50", "2.00", "1.00"]  # the plan's choice here, the constants' there
    assert cells["qkv split"] == ["-", "30", "-", "-", "5.0", "-", "-", "-", "-"]  # only the generic-plan build
    assert cells["rope apply"] == ["-", "-", "30", "-", "-", "10.0", "-", "-", "-"]  # only the generic build
    assert cells["total"] == ["62", "92", "92", "172.5", "288.0", "264.5", "0.60", "1.09", "0.65"]
    # the specialized build's order, then what the generic-plan build adds, then the generic build's
    assert list(cells)[1:] == ["embed", "rmsnorm_qkv_rope", "attention", "rmsnorm_lm_head_argmax", "qkv split",
                               "rope apply", "total"]
    lines = text.splitlines()[1:-1]
    assert len({len(line) for line in lines}) == 1, "columns do not line up"


def test_kernel_table_one_build_without_tables():
    """Only the specialized build prints tables (the CPU path prints none, a GPU build does): its
    columns filled, the others "-", no ratio."""
    kernels = {"specialized": compare.parse_kernel_tables(kernel_text(0, SPEC_STAGES))}
    cells = table_cells(compare.format_kernel_tables("cuda", kernels))
    assert cells["total"] == ["62", "-", "-", "172.5", "-", "-", "-", "-", "-"]


# ---------------------------------------------------------------------------------------------
# PNG


def read_png(data: bytes) -> np.ndarray:
    """Decodes an 8-bit RGB, non-interlaced PNG with filter-0 rows, checking every chunk's CRC."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, []
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        (crc,) = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])
        assert crc == zlib.crc32(kind + body), f"bad CRC in {kind}"
        chunks.append((kind, body))
        pos += 12 + n
    assert pos == len(data)
    kinds = [k for k, _ in chunks]
    assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND" and b"IDAT" in kinds
    w, h, depth, ctype, comp, filt, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, ctype, comp, filt, interlace) == (8, 2, 0, 0, 0)
    raw = zlib.decompress(b"".join(b for k, b in chunks if k == b"IDAT"))
    assert len(raw) == h * (1 + 3 * w)
    rows = np.frombuffer(raw, np.uint8).reshape(h, 1 + 3 * w)
    assert not rows[:, 0].any(), "rows with a filter other than 0"
    return rows[:, 1:].reshape(h, w, 3)


def test_png_round_trip():
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)
    assert np.array_equal(read_png(png.png_encode(img)), img)


def pixels_of(img, color):
    return np.argwhere(np.all(img == np.array(color, np.uint8), axis=2))  # (n, 2): y, x


def test_chart_png(tmp_path):
    medians = {"cpu": {"specialized": bench_json(tok_s=(150.0, 135.0)), "generic-plan": bench_json(tok_s=(100.0, 90.0)),
                       "generic": bench_json(tok_s=(50.0, 45.0))},
               "cuda": {"specialized": bench_json("cuda", tok_s=(3000.0, 2700.0)),
                        "generic-plan": bench_json("cuda", tok_s=(2000.0, 1800.0)),
                        "generic": bench_json("cuda", tok_s=(1000.0, 900.0))}}
    path = tmp_path / "c.png"
    png.png_write(path, compare.chart("smollm2-135m-instruct", medians))
    img = read_png(path.read_bytes())
    assert img.shape == (70 + 400, 2 * 560, 3)
    assert len(set(compare.COLORS.values())) == 3
    plot = img[70 + 40:]  # below the title, legend and panel titles
    px = {b: pixels_of(plot, compare.COLORS[b]) for b in compare.BUILDS}
    for half in (slice(0, 560), slice(560, 1120)):  # each panel holds the three lines
        mine = {b: p[(p[:, 1] >= half.start) & (p[:, 1] < half.stop)] for b, p in px.items()}
        assert all(len(p) > 500 for p in mine.values())
        # 3x, 2x, 1x the tok/s on a y axis from 0: specialized highest (smallest y), then generic-plan, then generic
        ys = [mine[b][:, 0].mean() for b in compare.BUILDS]
        assert ys[0] + 50 < ys[1] and ys[1] + 50 < ys[2]
        # lines run from the first depth to the last across the plot area
        for p in mine.values():
            assert p[:, 1].max() - p[:, 1].min() > 350
    # the legend draws the three colours above the panels
    for b in compare.BUILDS:
        assert len(pixels_of(img[:70], compare.COLORS[b])) > 50, b


def test_font_and_ticks():
    m = png.text_mask("1.", scale=2)
    assert m.shape == (18, 24)
    assert m[:14, :10].any() and not m[:, 10:12].any()  # the glyph, then the blank column
    assert np.array_equal(png.text_mask("~"), png.text_mask("?"))  # unknown characters print as '?'
    assert all(len(rows.split()) in (7, 9) and all(len(r) == 5 for r in rows.split())
               for rows in png._FONT_ROWS.values())
    assert png.nice_ticks(0, 1024) == [0, 500, 1000, 1500]
    assert png.nice_ticks(0, 2100) == [0, 500, 1000, 1500, 2000, 2500]
    assert [png.tick_label(v) for v in (0, 500, 20000, 32768, 0.25)] == ["0", "500", "20k", "32768", "0.25"]


# ---------------------------------------------------------------------------------------------
# The whole script against fake binaries


FAKE = """#!{python}
import json, sys
args = sys.argv[1:]
with open({log!r}, "a") as f:
    f.write({label!r} + (" kernels" if "--bench-kernels" in args else "") + "\\n")
if {fail!r}:
    sys.stderr.write("ingot: ERR_WEIGHTS: model.safetensors: truncated at byte 12\\n")
    sys.exit(1)
n = sum(1 for line in open({log!r}) if line == {label!r} + "\\n")
device = args[args.index("--device") + 1]
depths = [int(d) for d in args[args.index("--bench-depths") + 1].split(",")]
speed = {speeds!r}[(n - 1) % 3]
if "--bench-kernels" in args:
    for d in depths:
        sys.stdout.write({kernels!r}.replace("DEPTH", str(d)))
decode = [dict(depth=d, tokens=4, tok_s=speed / (1 + d / 1000), us_per_token=1e6 * (1 + d / 1000) / speed,
               gb_s=speed / 10, share_of_probe=speed / 1000) for d in depths]
print(json.dumps(dict(model="m", device=device, device_name="cpu" if device == "cpu" else "Fake GPU", threads=1,
                      weight_bytes_per_token=1000, kv_bytes_per_position=10, probe_gb_s=20.0, prompt_tokens=128,
                      prompt_tok_s=speed * 2, decode=decode)))
"""


def fake_binary(path, label, log, speeds, kernels="", fail=False):
    path.write_text(FAKE.format(python=sys.executable, label=label, log=str(log), speeds=list(speeds),
                                kernels=kernels, fail=fail))
    path.chmod(0o755)
    return path


@pytest.fixture
def fake_model(tmp_path):
    """A model directory holding only the default model's config.json: all the fake binaries need."""
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_bytes((REPO / "models" / "smollm2-135m-instruct" / "config.json").read_bytes())
    return d


def run_compare(*args):
    return subprocess.run([sys.executable, str(COMPARE), *map(str, args)], capture_output=True, text=True, timeout=300)


def fake_three(tmp_path, log, spec_kernels="", plan_kernels="", gen_kernels="", fail=None):
    """Three fake binaries: the specialized one at (90, 200, 100) tok/s in its 1st, 2nd, 3rd run
    (median 100), generic-plan at (80, 30, 40) (median 40), generic at (50, 40, 60) (median 50): a
    plan effect of 2.50 and a constants effect of 0.80, different enough that a swapped column or
    ratio shows."""
    return {b: fake_binary(tmp_path / label, label, log, speeds, kernels=k, fail=fail == b)
            for b, label, speeds, k in (("specialized", "spec", (90.0, 200.0, 100.0), spec_kernels),
                                        ("generic-plan", "plan", (80.0, 30.0, 40.0), plan_kernels),
                                        ("generic", "gen", (50.0, 40.0, 60.0), gen_kernels))}


def test_compare_with_fake_binaries(fake_model, tmp_path):
    log = tmp_path / "log"
    depth_k = lambda stages: kernel_text(0, stages).replace("depth 0", "depth DEPTH")  # noqa: E731
    bins = fake_three(tmp_path, log, spec_kernels=depth_k(SPEC_STAGES), plan_kernels=depth_k(PLAN_STAGES))
    out = tmp_path / "out"
    r = run_compare(fake_model, "--specialized", bins["specialized"], "--generic-plan", bins["generic-plan"],
                    "--generic", bins["generic"], "--out", out, "--devices", "cpu,cuda",
                    "--cpu-depths", "0,100", "--gpu-depths", "0,1000,2000", "-n", "4", "--repeats", "3")
    assert r.returncode == 0, r.stderr
    # A B C, B C A, C A B per device, then the per-stage run of each
    per_device = ["spec", "plan", "gen", "plan", "gen", "spec", "gen", "spec", "plan",
                  "spec kernels", "plan kernels", "gen kernels"]
    assert log.read_text().splitlines() == per_device * 2
    cells = table_cells(r.stdout)
    assert cells["metric"] == MAIN_HEADER
    # medians of (90, 200, 100), (80, 30, 40), (50, 40, 60)
    assert cells["cpu: decode tok/s, depth 0"] == ["100.0", "40.0", "50.0", "2.50", "0.80", "2.00"]
    assert cells["cuda: decode tok/s, depth 1000"] == ["50.0", "20.0", "25.0", "2.50", "0.80", "2.00"]
    assert cells["cuda: us/token, depth 2000"] == ["30000", "75000", "60000", "0.40", "1.25", "0.50"]
    assert cells["cpu: prompt tok/s (128 tokens)"][3:] == ["2.50", "0.80", "2.00"]
    # the generic fake prints no per-stage tables: its columns "-"
    assert "kernels at depth 1000 on cuda" in r.stdout
    assert cells["total"] == ["62", "92", "-", "172.5", "288.0", "-", "0.60", "-", "-"]
    assert cells["qkv split"][:3] == ["-", "30", "-"]
    text = (out / "table.md").read_text()
    assert text == r.stdout[:r.stdout.index("\nwrote ")]
    assert f"- generic-plan (specialized, the generic build's plan): {bins['generic-plan']}" in text
    report = json.loads((out / "compare.json").read_text())
    assert report["devices"]["cuda"]["depths"] == [0, 1000, 2000]
    runs = report["devices"]["cpu"]["runs"]
    assert [x["decode"][0]["tok_s"] for x in runs["specialized"]] == [90.0, 200.0, 100.0]
    assert [x["decode"][0]["tok_s"] for x in runs["generic-plan"]] == [80.0, 30.0, 40.0]
    assert {b: report["builds"][b]["size_bytes"] for b in compare.BUILDS} == \
        {b: bins[b].stat().st_size for b in compare.BUILDS}
    assert set(report["devices"]["cpu"]["kernels"]) == {"specialized", "generic-plan"}
    row = next(t for t in report["table"] if t["metric"] == "cpu: decode tok/s, depth 0")
    assert row["specialized"] == 100.0 and row["generic-plan"] == 40.0 and row["generic"] == 50.0
    assert (row["plan_effect"], row["constants_effect"], row["total"]) == pytest.approx((2.5, 0.8, 2.0))
    img = read_png((out / "compare.png").read_bytes())
    assert img.shape[1] == 2 * 560
    assert all(len(pixels_of(img[110:], compare.COLORS[b])) > 100 for b in compare.BUILDS)


def test_compare_reports_a_failing_binary(fake_model, tmp_path):
    log = tmp_path / "log"
    bins = fake_three(tmp_path, log, fail="generic-plan")
    r = run_compare(fake_model, "--specialized", bins["specialized"], "--generic-plan", bins["generic-plan"],
                    "--generic", bins["generic"], "--out", tmp_path / "out",
                    "--devices", "cpu", "--depths", "0", "--repeats", "2", "--no-kernels")
    assert r.returncode == 1
    err = [line for line in r.stderr.splitlines() if not line.startswith("compare: cpu run")]
    assert err == [f"compare: generic-plan ({bins['generic-plan']}) on cpu exited 1: "
                   "ingot: ERR_WEIGHTS: model.safetensors: truncated at byte 12"]
    assert log.read_text().splitlines() == ["spec", "plan"]
    assert not (tmp_path / "out").exists()


def test_compare_missing_binaries(fake_model, tmp_path):
    r = run_compare(fake_model, "--specialized", sys.executable, "--generic-plan", sys.executable,
                    "--generic", tmp_path / "nope", "--devices", "cpu")
    assert r.returncode == 1
    assert r.stderr.strip() == (f"compare: generic: {tmp_path / 'nope'}: no such executable "
                                f"(build it: make MODEL={fake_model} GENERIC=1)")
    # the generic-plan binary's default path, and how to build it
    r = run_compare(fake_model, "--specialized", sys.executable, "--generic", sys.executable, "--devices", "cpu")
    assert r.returncode == 1
    assert r.stderr.strip() == (f"compare: generic-plan: {REPO / 'build' / 'model-generic-plan' / 'ingot'}: no such "
                                f"executable (build it: make MODEL={fake_model} PLAN=generic "
                                f"GEN=generated/model-generic-plan OUT=build/model-generic-plan)")


def test_compare_rebuild_takes_default_paths_only(fake_model, tmp_path):
    r = run_compare(fake_model, "--generic-plan", sys.executable, "--rebuild", "--devices", "cpu")
    assert r.returncode == 1
    assert r.stderr.strip() == ("compare: --rebuild times the binaries at their default paths; "
                                "leave out --specialized/--generic-plan/--generic")


# ---------------------------------------------------------------------------------------------
# One real run: the default model's three builds, on the CPU


def build_generic_plan(model_dir):
    """What make compare builds besides the other two: the specialized sources with the generic
    build's plan (make PLAN=generic), in their own GEN and OUT; returns the binary."""
    name = model_dir.name
    make(f"MODEL={model_dir}", "PLAN=generic", f"GEN=generated/{name}-generic-plan", f"OUT=build/{name}-generic-plan")
    return REPO / "build" / f"{name}-generic-plan" / "ingot"


def test_compare_end_to_end(default_binary, default_model, tmp_path):
    out = tmp_path / "out"
    generic = build_generic()
    middle = build_generic_plan(default_model)
    name = default_model.name
    # the middle build: the same constants as the specialized one, the generic build's plan
    spec_gen, mid_gen = REPO / "generated" / name, REPO / "generated" / f"{name}-generic-plan"

    def defines(path):  # the comments name the regenerate command, PLAN= included
        return [line for line in path.read_text().splitlines() if line.startswith("#define")]

    assert defines(mid_gen / "model_config.h") == defines(spec_gen / "model_config.h")
    assert defines(mid_gen / "model_plan.h") != defines(spec_gen / "model_plan.h")
    assert len({default_binary, middle, generic}) == 3
    # the middle binary from its default path (no --generic-plan)
    r = run_compare(default_model, "--specialized", default_binary, "--generic", generic, "--out", out,
                    "--devices", "cpu", "--depths", "0,64", "-n", "4", "--threads", "1", "--ctx", "256",
                    "--repeats", "1", "--no-kernels")
    assert r.returncode == 0, r.stderr
    cells = table_cells((out / "table.md").read_text())
    for d in (0, 64):
        row = cells[f"cpu: decode tok/s, depth {d}"]
        assert len(row) == 6 and all(float(c) > 0 for c in row)
    assert [float(c) for c in cells["binary size, MB"][:3]] == \
        [round(b.stat().st_size / 1e6, 2) for b in (default_binary, middle, generic)]
    report = json.loads((out / "compare.json").read_text())
    assert report["builds"]["generic-plan"]["binary"] == str(middle)
    for b in compare.BUILDS:
        (run,) = report["devices"]["cpu"]["runs"][b]
        assert run["threads"] == 1 and [d["depth"] for d in run["decode"]] == [0, 64]
    for row in report["table"]:
        if row["total"] is not None:
            assert row["plan_effect"] * row["constants_effect"] == pytest.approx(row["total"])
    img = read_png((out / "compare.png").read_bytes())
    for b in compare.BUILDS:
        assert len(pixels_of(img[110:], compare.COLORS[b])) > 100, b
