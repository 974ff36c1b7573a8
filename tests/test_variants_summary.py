"""tests/bench/variants_summary.py on a real variants.sh output (SmolLM2 shape, plain against
-DMV_PAIR_UNROLL=4, a knob now the plan's pair_unroll, two rounds; docs/performance.md, D45): every
round's numbers found, the table's
ranges and changes against the plain build, and clear errors for other files."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "tests" / "bench"))
import variants_summary  # noqa: E402

OUTPUT = REPO / "tests" / "fixtures" / "variants" / "smollm2-unroll.txt"
SCRIPT = REPO / "tests" / "bench" / "variants_summary.py"
MODEL = "smollm2-135m-instruct"


def test_parse_collects_each_round():
    runs = variants_summary.parse(OUTPUT.read_text())
    assert list(runs) == [MODEL]
    plain, unroll = runs[MODEL]["plain"], runs[MODEL]["-DMV_PAIR_UNROLL=4"]
    assert plain["decode", 0] == [3026.8, 3026.4] and unroll["decode", 4096] == [2014.7, 2014.9]
    assert plain["share", 0] == [18.0, 18.2] and plain["prompt", 4096] == [10423.0, 10416.7]
    assert unroll["probe", 0] == [4488.1, 4517.0]


def test_table_gives_ranges_and_changes_against_plain():
    table = variants_summary.table(MODEL, variants_summary.parse(OUTPUT.read_text())[MODEL])
    lines = table.splitlines()
    assert lines[1] == "| variant | prompt 0 | prompt 4096 | decode 0 | decode 4096 | probe GB/s |"
    assert lines[3] == "| plain | 19020-19105 | 10417-10423 | 3026.4-3026.8 | 2015.5-2016.3 | 4494.4-4524.4 |"
    # decode 0: (3020.2 + 3024.4) / 2 against (3026.8 + 3026.4) / 2 = -0.1%
    assert lines[4].startswith("| `-DMV_PAIR_UNROLL=4` | 19010-19070 (-0.1%) |") and "3020.2-3024.4 (-0.1%)" in lines[4]


def test_a_variant_without_plain_is_refused():
    runs = variants_summary.parse(OUTPUT.read_text().replace(", plain,", ", -DX=1,"))
    with pytest.raises(ValueError, match="no plain build"):
        variants_summary.table(MODEL, runs[MODEL])


def test_script_prints_the_table_and_refuses_other_files(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), str(OUTPUT)], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith(f"**{MODEL}**\n| variant |")
    other = tmp_path / "other.txt"
    other.write_text("nothing to see\n")
    r = subprocess.run([sys.executable, str(SCRIPT), str(other)], capture_output=True, text=True)
    assert r.returncode == 1 and "no variants.sh rounds in it" in r.stderr
    r = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "missing.txt")], capture_output=True, text=True)
    assert r.returncode == 1 and "missing.txt" in r.stderr


# PROMPTS='3 9' as variants.sh prints it (1B numbers of docs/performance.md's D96, one round; each
# run's "bench:" line left out)
def prompts_output(variant: str, probes: tuple[float, float], tok_s: tuple[float, float]) -> str:
    runs = [f"  read bandwidth probe: {p} GB/s\n  prompt: {n} tokens, {t} tok/s\n" for p, n, t in zip(probes, (3, 9), tok_s)]
    return f"== llama-3.2-1b-instruct, {variant}, round 1\n" + "".join(runs)


PROMPTS_OUTPUT = (prompts_output("plain", (4530.7, 4528.1), (2637.4, 5243.9)) +
                  prompts_output("-DPREFILL_LAST=0", (4529.0, 4527.5), (1534.1, 5204.9)))


def test_prompt_lengths_are_columns_of_their_own():
    runs = variants_summary.parse(PROMPTS_OUTPUT)["llama-3.2-1b-instruct"]
    assert runs["plain"]["prompt(3)", 0] == [2637.4] and runs["-DPREFILL_LAST=0"]["prompt(9)", 0] == [5204.9]
    assert ("prompt", 0) not in runs["plain"]  # 128 tokens only
    lines = variants_summary.table("llama-3.2-1b-instruct", runs).splitlines()
    assert lines[1] == "| variant | prompt(3) 0 | prompt(9) 0 | probe GB/s |"
    # 1534.1 against 2637.4: -41.8%
    assert lines[4] == "| `-DPREFILL_LAST=0` | 1534.1 (-41.8%) | 5204.9 (-0.7%) | 4527.5-4529.0 |"


# --bench-kernels' prompt batch tables (a real run's 1B numbers, depth 1; the stage
# rows cut to one), one round
def kernels_output(variant: str, graphs: tuple[float, float]) -> str:
    tables = [f"a prefill batch of {n} tokens at depth 1 (launched one by one, best of 20):\n"
              f"  stage                    launches     us/batch   MB/batch     GB/s\n"
              f"  prefill_qkv_rope               16        213.2     201.33      944\n"
              f"  total                         109       1228.1\n"
              f"  as its graph: {g} us/batch, the layers' weights at 2103 GB/s\n" for n, g in zip((16, 8), graphs)]
    return (f"== llama-3.2-1b-instruct, {variant}, round 1\n  read bandwidth probe: 4616.4 GB/s\n" + "".join(tables) +
            "  decode at depth 0: 16 tokens, 1476.6 tok/s, 677 us/token, 3650.0 GB/s = 79.1% of probe\n")


def test_batch_graph_times_are_columns_of_their_own():
    text = kernels_output("plain", (907.1, 873.6)) + kernels_output("fmma_tile=16", (880.0, 840.2))
    runs = variants_summary.parse(text)["llama-3.2-1b-instruct"]
    assert runs["plain"]["batch(16) us", 1] == [907.1] and runs["fmma_tile=16"]["batch(8) us", 1] == [840.2]
    lines = variants_summary.table("llama-3.2-1b-instruct", runs).splitlines()
    assert lines[1] == "| variant | batch(16) us 1 | batch(8) us 1 | decode 0 | probe GB/s |"
    # 840.2 against 873.6: -3.8%
    assert lines[4] == "| `fmma_tile=16` | 880.0 (-3.0%) | 840.2 (-3.8%) | 1476.6 (+0.0%) | 4616.4 |"
