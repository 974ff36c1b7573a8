"""tests/bench/compare.py (make compare) and its PNG writer tests/bench/png.py: tables and ratios from
canned runs, the --bench-kernels parser, the PNG's bytes, the whole script against fake binaries
(interleaving, medians, a failing binary), and one real run on the default model with the
specialized binary standing in for both builds."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest

from conftest import REPO, build_generic

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
    medians = {"cpu": {"specialized": bench_json(tok_s=(100.0, 80.0), prompt=200.0),
                       "generic": bench_json(tok_s=(50.0, 64.0), prompt=250.0)},
               "cuda": {"specialized": bench_json("cuda", tok_s=(2000.0, 1500.0), probe=4000.0),
                        "generic": bench_json("cuda", tok_s=(1000.0, 1000.0), probe=4000.0)}}
    rows = compare.main_rows(medians, {"specialized": 1_340_000, "generic": 2_680_000},
                             {"specialized": 12.0, "generic": None})
    text = compare.format_main_table(rows)
    cells = table_cells(text)
    assert cells["metric"] == ["specialized", "generic", "spec/generic"]
    assert cells["cpu: decode tok/s, depth 0"] == ["100.0", "50.0", "2.00"]
    assert cells["cpu: decode tok/s, depth 64"] == ["80.0", "64.0", "1.25"]
    assert cells["cpu: us/token, depth 0"] == ["10000", "20000", "0.50"]
    assert cells["cpu: share of probe, depth 0"][2] == "2.00"
    assert cells["cpu: share of probe, depth 0"][0] == f"{100 * 269030016 * 100 / 1e9 / 40:.1f}%"
    assert cells["cpu: prompt tok/s (128 tokens)"] == ["200.0", "250.0", "0.80"]
    assert cells["cuda: decode tok/s, depth 0"] == ["2000", "1000", "2.00"]
    assert cells["cuda: us/token, depth 64"] == ["666.7", "1000", "0.67"]
    assert cells["binary size, MB"] == ["1.34", "2.68", "0.50"]
    assert cells["build time, s (clean rebuild, serial make)"] == ["12.0", "not measured", "-"]
    assert len(rows) == 2 * (4 * 2 + 2) + 2
    lines = text.splitlines()
    assert len({len(line) for line in lines}) == 1, "columns do not line up"
    assert lines[1].startswith("|:-") and lines[1].endswith("-:|")


# ---------------------------------------------------------------------------------------------
# --bench-kernels tables


def kernel_text(depth: int, stages: list[tuple[str, int, float, float]], reps: int = 20) -> str:
    """model_cuda_kernel_bench's output (templates/forward_cuda.cu.j2), with its format strings."""
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


def test_kernel_table_side_by_side():
    kernels = {"specialized": compare.parse_kernel_tables(kernel_text(0, SPEC_STAGES)),
               "generic": compare.parse_kernel_tables(kernel_text(0, GEN_STAGES))}
    text = compare.format_kernel_tables("cuda", kernels)
    assert text.startswith("kernels at depth 0 on cuda (launched one by one, best of 20), us/token:")
    cells = table_cells(text)
    assert cells["rmsnorm_qkv_rope"] == ["30", "30", "60.0", "120.0", "0.50"]
    assert cells["attention"][-1] == "1.00"
    assert cells["rope apply"] == ["-", "30", "-", "10.0", "-"]  # only the generic build has it
    assert cells["total"] == ["62", "92", "172.5", "264.5", "0.65"]
    assert list(cells)[1:] == ["embed", "rmsnorm_qkv_rope", "attention", "rmsnorm_lm_head_argmax", "rope apply", "total"]


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
    medians = {"cpu": {"specialized": bench_json(tok_s=(100.0, 90.0)), "generic": bench_json(tok_s=(50.0, 45.0))},
               "cuda": {"specialized": bench_json("cuda", tok_s=(2000.0, 1800.0)),
                        "generic": bench_json("cuda", tok_s=(1000.0, 900.0))}}
    path = tmp_path / "c.png"
    png.png_write(path, compare.chart("smollm2-135m-instruct", medians))
    img = read_png(path.read_bytes())
    assert img.shape == (70 + 400, 2 * 560, 3)
    plot = img[70 + 40:]  # below the title, legend and panel titles
    blue, orange = pixels_of(plot, compare.COLORS["specialized"]), pixels_of(plot, compare.COLORS["generic"])
    for half in (slice(0, 560), slice(560, 1120)):  # each panel holds both lines
        b = blue[(blue[:, 1] >= half.start) & (blue[:, 1] < half.stop)]
        o = orange[(orange[:, 1] >= half.start) & (orange[:, 1] < half.stop)]
        assert len(b) > 500 and len(o) > 500
        # twice the tok/s on a y axis from 0: the specialized line is higher (smaller y)
        assert b[:, 0].mean() + 50 < o[:, 0].mean()
        # lines run from the first depth to the last across the plot area
        assert b[:, 1].max() - b[:, 1].min() > 350
    # the legend draws both colours above the panels
    assert len(pixels_of(img[:70], compare.COLORS["specialized"])) > 50
    assert len(pixels_of(img[:70], compare.COLORS["generic"])) > 50


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


def test_compare_with_fake_binaries(fake_model, tmp_path):
    log = tmp_path / "log"
    spec = fake_binary(tmp_path / "spec", "spec", log, (90.0, 200.0, 100.0),
                       kernels=kernel_text(0, SPEC_STAGES).replace("depth 0", "depth DEPTH"))
    gen = fake_binary(tmp_path / "gen", "gen", log, (50.0, 40.0, 60.0))
    out = tmp_path / "out"
    r = run_compare(fake_model, "--specialized", spec, "--generic", gen, "--out", out, "--devices", "cpu,cuda",
                    "--cpu-depths", "0,100", "--gpu-depths", "0,1000,2000", "-n", "4", "--repeats", "3")
    assert r.returncode == 0, r.stderr
    # A B, B A, A B per device, then the per-stage run of each
    per_device = ["spec", "gen", "gen", "spec", "spec", "gen", "spec kernels", "gen kernels"]
    assert log.read_text().splitlines() == per_device * 2
    cells = table_cells(r.stdout)
    assert cells["cpu: decode tok/s, depth 0"] == ["100.0", "50.0", "2.00"]  # medians of (90, 200, 100), (50, 40, 60)
    assert cells["cuda: decode tok/s, depth 1000"] == ["50.0", "25.0", "2.00"]
    assert cells["cuda: us/token, depth 2000"] == ["30000", "60000", "0.50"]
    assert cells["cpu: prompt tok/s (128 tokens)"][2] == "2.00"
    assert "kernels at depth 1000 on cuda" in r.stdout and cells["total"][:2] == ["62", "-"]
    assert (out / "table.md").read_text() == r.stdout[:r.stdout.index("\nwrote ")]
    report = json.loads((out / "compare.json").read_text())
    assert report["devices"]["cuda"]["depths"] == [0, 1000, 2000]
    assert [x["decode"][0]["tok_s"] for x in report["devices"]["cpu"]["runs"]["specialized"]] == [90.0, 200.0, 100.0]
    assert report["builds"]["specialized"]["size_bytes"] == spec.stat().st_size
    assert read_png((out / "compare.png").read_bytes()).shape[1] == 2 * 560


def test_compare_reports_a_failing_binary(fake_model, tmp_path):
    log = tmp_path / "log"
    spec = fake_binary(tmp_path / "spec", "spec", log, (100.0,) * 3)
    gen = fake_binary(tmp_path / "gen", "gen", log, (100.0,) * 3, fail=True)
    r = run_compare(fake_model, "--specialized", spec, "--generic", gen, "--out", tmp_path / "out",
                    "--devices", "cpu", "--depths", "0", "--repeats", "2", "--no-kernels")
    assert r.returncode == 1
    err = [line for line in r.stderr.splitlines() if not line.startswith("compare: cpu run")]
    assert err == [f"compare: generic ({gen}) on cpu exited 1: ingot: ERR_WEIGHTS: model.safetensors: truncated at byte 12"]
    assert not (tmp_path / "out").exists()


def test_compare_missing_generic(fake_model, tmp_path):
    r = run_compare(fake_model, "--specialized", sys.executable, "--generic", tmp_path / "nope", "--devices", "cpu")
    assert r.returncode == 1
    assert r.stderr.strip() == (f"compare: generic: {tmp_path / 'nope'}: no such executable "
                                f"(build it: make MODEL={fake_model} GENERIC=1)")


# ---------------------------------------------------------------------------------------------
# One real run: the default model's specialized and generic binaries, on the CPU


def test_compare_end_to_end(default_binary, default_model, tmp_path):
    out = tmp_path / "out"
    generic = build_generic()
    r = run_compare(default_model, "--specialized", default_binary, "--generic", generic, "--out", out,
                    "--devices", "cpu", "--depths", "0,64", "-n", "4", "--threads", "1", "--ctx", "256",
                    "--repeats", "1", "--no-kernels")
    assert r.returncode == 0, r.stderr
    cells = table_cells((out / "table.md").read_text())
    for d in (0, 64):
        s, g, ratio = cells[f"cpu: decode tok/s, depth {d}"]
        assert float(s) > 0 and float(g) > 0 and float(ratio) > 0
    assert float(cells["binary size, MB"][1]) == round(generic.stat().st_size / 1e6, 2)
    report = json.loads((out / "compare.json").read_text())
    for b in compare.BUILDS:
        (run,) = report["devices"]["cpu"]["runs"][b]
        assert run["threads"] == 1 and [d["depth"] for d in run["decode"]] == [0, 64]
    img = read_png((out / "compare.png").read_bytes())
    assert len(pixels_of(img[110:], compare.COLORS["generic"])) > 100  # drawn last, over the other
