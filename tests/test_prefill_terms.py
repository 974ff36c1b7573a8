"""tests/bench/prefill_terms.py, the NumPy emulation of the GPU prompt path's input terms, on
tiny-gqa: two terms of bf16 keep the logits within 1e-4 of the exact model, one term (the
default) costs more than 1e-3 in bf16 and several times less in fp16, and a too long --fed is
refused."""

from __future__ import annotations

import re
import subprocess
import sys

from conftest import REPO, tiny_model_dir

SCRIPT = REPO / "tests" / "bench" / "prefill_terms.py"


def errors(*args: str) -> dict[str, float]:
    r = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^\| ([^|]+?) \| ([\d.e+-]+) \|", r.stdout, re.M)}


def test_terms_errors_order_as_their_bits():
    d = str(tiny_model_dir("tiny-gqa"))
    bf16 = errors(d, "--fed", "40", "--tokens", "60", "--terms-dtype", "bfloat16")
    fp16 = errors(d, "--fed", "40", "--tokens", "60", "--terms-dtype", "float16")
    assert bf16["two terms"] < 1e-4
    assert bf16["one term (the default)"] > 1e-3
    assert fp16["one term (the default)"] < bf16["one term (the default)"] / 3
    assert set(bf16) >= {"one term: QKV", "one term: o_proj", "one term: gate/up", "one term: down",
                         "(for scale: exact inputs, the fp16 KV cache)"}


def test_fed_past_the_text_is_refused():
    r = subprocess.run([sys.executable, str(SCRIPT), str(tiny_model_dir("tiny-gqa")), "--fed", "500", "--tokens", "60"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "--fed 500: the text is 60 tokens" in r.stderr
