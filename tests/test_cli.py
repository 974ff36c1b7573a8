"""The binary's command line: every bad input ends in one line on stderr naming the problem and a
non-zero exit; good input behaves as --help says. Runs on the tiny-llama model (fast to build), with
both builds: the generic one gets -m first, so a test's own -m overrides it."""

from __future__ import annotations

import re
import shutil

import pytest
from tokenizers import Tokenizer

from conftest import BUILDS, GENERIC_CPU_STREAMS4, binary_for, run, tiny_model_dir


@pytest.fixture(scope="module", params=BUILDS)
def tiny_llama(request):
    d = tiny_model_dir("tiny-llama")
    return d, binary_for(d, request.param)


def fails_with(binary, *args, message, input=None):
    r = run(binary, *args, input=input, check=False)
    err = r.stderr.decode()
    assert r.returncode == 1, f"exit {r.returncode}, stderr {err!r}"
    assert err.count("\n") == 1 and err.startswith("ingot: "), f"not one line: {err!r}"
    assert message in err, f"{message!r} not in {err!r}"
    return err


def copy_model(src, dst):
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize(
    "args, message",
    [
        (["--bogus"], "unknown option '--bogus'"),
        (["-p", "x", "--top-p", "2"], "--top-p 2: expected a number in 0..1"),
        (["-p", "x", "-n", "abc"], "-n abc: expected an integer"),
        (["-p", "x", "--temp", "-1"], "--temp -1: expected a number"),
        (["-p", "x", "--ctx", "100000"], "--ctx 100000: expected an integer in 1..256"),
        (["-p", "x", "--threads", "0"], "--threads 0"),
        (["-p"], "-p needs a value"),
        (["-p", "x", "--device", "tpu"], "--device tpu: expected cpu or cuda"),
        (["-p", "x", "--kv-cache", "q9"], "--kv-cache q9: expected f16 or q8"),
        (["-p", "x", "--kv-cache", "Q8"], "--kv-cache Q8: expected f16 or q8"),
        (["-p", "x", "--kv-cache"], "--kv-cache needs a value"),
        (["-p", "x", "--device", "cuda"], "device unavailable"),
        (["-p", "x", "-f", "y"], "-p and -f both given"),
        (["-p", "x", "--system", "s"], "--system needs --chat"),
        (["-p", "x", "--dump-prefill", "2"], "--dump-prefill needs --dump-logits"),
        (["--bench-prompt", "64"], "--bench-prompt needs --bench"),
        (["--bench", "--bench-prompt", "0"], "--bench-prompt 0: expected an integer in 1.."),
        (["--bench", "--bench-prompt", "250"], "--bench needs at least 314 tokens of context, --ctx is 256"),
        (["-p", "x", "--dump-logits", "/dev/null", "--dump-prefill", "0"], "--dump-prefill 0: expected an integer in 1.."),
        (["-p", "x", "--dump-logits", "/dev/null", "--dump-prefill", "9"], "--dump-prefill 9: the prompt is 1 token"),
        (["-p", "x", "--dump-logits", "/dev/null", "--dump-prefill", "2", "--exact-prompt"],
         "--dump-prefill and --exact-prompt exclude each other"),
    ],
)
def test_bad_flags(tiny_llama, args, message):
    fails_with(tiny_llama[1], *args, message=message)


def test_help(tiny_llama):
    r = run(tiny_llama[1], "--help")
    built_for = b"generic build: any supported model directory" if tiny_llama[1].generic else b"built for tiny-llama"
    assert b"--perplexity FILE" in r.stdout and built_for in r.stdout


def test_prompt_longer_than_context(tiny_llama):
    fails_with(tiny_llama[1], "-p", "many words " * 50, "--ctx", "16", message="context length exceeded: the prompt is")


def test_invalid_utf8(tiny_llama, tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"hello \xff\xfe world")
    fails_with(tiny_llama[1], "-f", str(tmp_path / "bad.txt"), message="invalid UTF-8")
    fails_with(tiny_llama[1], input=b"ok \xc3", message="invalid UTF-8")


def test_missing_weights(tiny_llama, tmp_path):
    d = copy_model(tiny_llama[0], tmp_path / "m")
    (d / "model.safetensors").unlink()
    fails_with(tiny_llama[1], "-m", str(d), "-p", "x", message="model.safetensors")
    fails_with(tiny_llama[1], "-m", str(tmp_path / "nowhere"), "-p", "x", message="config.json")


def test_truncated_weights(tiny_llama, tmp_path):
    d = copy_model(tiny_llama[0], tmp_path / "m")
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) - 1000])
    fails_with(tiny_llama[1], "-m", str(d), "-p", "x", message="truncated")


def test_corrupt_header(tiny_llama, tmp_path):
    d = copy_model(tiny_llama[0], tmp_path / "m")
    data = bytearray((d / "model.safetensors").read_bytes())
    data[8:12] = b"XXXX"  # the header's JSON no longer parses
    (d / "model.safetensors").write_bytes(bytes(data))
    fails_with(tiny_llama[1], "-m", str(d), "-p", "x", message="bad header")


def test_config_of_another_model(tiny_llama):
    """A specialized binary refuses another model's directory; the generic one runs it."""
    if tiny_llama[1].generic:
        r = run(tiny_llama[1], "-m", str(tiny_model_dir("tiny-gqa")), "-p", "x", "-n", "2", "--temp", "0")
        assert r.stdout.startswith(b"x")
    else:
        fails_with(tiny_llama[1], "-m", str(tiny_model_dir("tiny-gqa")), "-p", "x",
                   message="'num_hidden_layers' is 3, this binary was built for 2")


def test_weights_of_another_model(tiny_llama, tmp_path):
    """The config says tiny-llama but the weights are tiny-gqa's: the first wrong tensor is named."""
    d = copy_model(tiny_model_dir("tiny-gqa"), tmp_path / "m")
    shutil.copyfile(tiny_llama[0] / "config.json", d / "config.json")
    fails_with(tiny_llama[1], "-m", str(d), "-p", "x", message="model.layers.0.self_attn.k_proj.weight")


def test_tokenize_matches_tokenizers(tiny_llama):
    text = "Hello world, 12345 tokens!"
    r = run(tiny_llama[1], "--tokenize", "-p", text)
    want = Tokenizer.from_file(str(tiny_llama[0] / "tokenizer.json")).encode(text).ids
    assert [int(t) for t in r.stdout.split()] == want


def test_seed_reproducible(tiny_llama):
    args = ["-p", "Once upon", "-n", "24", "--temp", "1.0", "--top-k", "0", "--top-p", "1", "--min-p", "0"]
    a = run(tiny_llama[1], *args, "--seed", "42").stdout
    b = run(tiny_llama[1], *args, "--seed", "42").stdout
    c = run(tiny_llama[1], *args, "--seed", "43").stdout
    assert a == b and a != c


def test_stdin_prompt_and_n_tokens(tiny_llama):
    r = run(tiny_llama[1], "-n", "5", "--temp", "0", input=b"Hello")
    assert r.stdout.startswith(b"Hello") and len(r.stdout) > len(b"Hello\n")


@pytest.mark.parametrize("kv", ["f16", "q8"])
def test_perplexity(tiny_llama, tmp_path, kv):
    (tmp_path / "t.txt").write_text("the quick brown fox jumps over the lazy dog. " * 4)
    r = run(tiny_llama[1], "--perplexity", str(tmp_path / "t.txt"), "--ctx", "8", "--kv-cache", kv)
    ppl = float(r.stdout.split()[1])
    # random weights: perplexity near the vocabulary size (400), certainly not below 10 or NaN
    assert 10 < ppl < 10000


def test_q8_cache_takes_half_the_memory(tmp_path):
    """The caches' address space, under a limit on it (RLIMIT_AS): tiny-gqa with a context of 2^24
    tokens (the generic build, which takes max_position_embeddings from config.json) needs 2 x 3 GiB
    of fp16 cache, 2 x 1.5 GiB of int8 and 2 x 384 MiB of scales (a 4-byte scale a 16-element
    vector) with --kv-cache q8. Under 5.5 GB the fp16 cache is refused in one line saying its size
    and the q8 one runs; under 3 GB the q8 cache is refused too, its line saying the int8 bytes are
    half the fp16 ones."""
    import json
    import resource
    import subprocess

    src = tiny_model_dir("tiny-gqa")
    d = tmp_path / "tiny-gqa-long"
    d.mkdir()
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (d / name).symlink_to(src / name)
    cfg = json.loads((src / "config.json").read_text())
    ctx = cfg["max_position_embeddings"] = 1 << 24
    (d / "config.json").write_text(json.dumps(cfg))
    binary = binary_for(src, "generic")
    f16_bytes = cfg["num_hidden_layers"] * ctx * cfg["num_key_value_heads"] * cfg["head_dim"] * 2
    scale_bytes = cfg["num_hidden_layers"] * ctx * cfg["num_key_value_heads"] * 4

    def under(limit, kv):
        def set_limit():
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        argv = [str(binary.path), "-m", str(d), "--ctx", str(ctx), "--kv-cache", kv, "--threads", "1", "-p", "Hello", "-n", "2",
                "--temp", "0", "--device", "cpu"]
        r = subprocess.run(argv, capture_output=True, timeout=300, preexec_fn=set_limit)
        return r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")

    rc, out, err = under(5_500_000_000, "f16")
    assert rc == 1 and err == f"ingot: out of memory: KV cache (f16) for {ctx} tokens: 2 x {f16_bytes} bytes\n", err
    rc, out, err = under(5_500_000_000, "q8")
    assert rc == 0 and out.startswith("Hello"), err
    rc, out, err = under(3_000_000_000, "q8")
    assert rc == 1 and err == (f"ingot: out of memory: KV cache (q8) for {ctx} tokens: 2 x {f16_bytes // 2} bytes of int8 and "
                               f"2 x {scale_bytes} bytes of scales\n"), err


@pytest.mark.parametrize("build", BUILDS)
def test_build_without_cuda(build):
    """A machine without nvcc builds a CPU-only binary, which says so when asked for the GPU."""
    d = tiny_model_dir("tiny-llama", name="tiny-llama-nocuda")
    make_vars = ("NVCC=",) if build == "specialized" else ("EXTRA_CFLAGS=-DCPU_STREAMS=4", "NVCC=")
    binary = binary_for(d, build, *make_vars, out=GENERIC_CPU_STREAMS4)
    assert not list(binary.path.parent.glob("forward_cuda*.o"))
    assert run(binary, "-p", "Hello", "-n", "4", "--temp", "0").stdout.startswith(b"Hello")
    fails_with(binary, "-p", "x", "--device", "cuda", message="built without CUDA")


def test_malformed_config(tiny_llama, tmp_path):
    d = copy_model(tiny_llama[0], tmp_path / "m")
    (d / "config.json").write_text('{"hidden_size": 64,')
    fails_with(tiny_llama[1], "-m", str(d), "-p", "x", message="config.json: at byte")


def test_bench_times_the_prompt_at_each_depth(tiny_llama):
    """--bench: the 128-token prompt at depth 0 (the top-level prompt_tok_s) and again after each
    deeper depth's tokens, in the text and in each JSON decode entry; a depth whose prompt would not
    fit the context gets null (tiny-llama: 256 positions)."""
    import json

    r = run(tiny_llama[1], "--bench", "--bench-depths", "0,32", "-n", "8", "--threads", "1")
    out = r.stdout.decode()
    probe = re.search(r"^  FMA probe: ([0-9.]+) TFLOP/s \(fp32\)$", out, re.M)
    assert probe and float(probe.group(1)) > 0, out
    shares = re.findall(r"^  prompt(?: at depth 32)?: 128 tokens, [0-9.]+ tok/s, [0-9.]+ TFLOP/s = [0-9.]+% of the FMA probe$",
                        out, re.M)
    assert len(shares) == 2, out
    assert "prompt at depth 0" not in out
    r = run(tiny_llama[1], "--bench", "--json", "--bench-depths", "0,32,160", "-n", "8", "--threads", "1")
    result = json.loads(r.stdout.decode().strip().splitlines()[-1])
    entries = {d["depth"]: d for d in result["decode"]}
    assert entries[0]["prompt_tok_s"] == result["prompt_tok_s"]
    # tiny-llama's arithmetic a prompt token at depth 0 (prompt_flops): over the time, the rate
    c = json.loads((tiny_llama[0] / "config.json").read_text())
    d, hid, layers, heads = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["num_attention_heads"]
    hd = c.get("head_dim") or d // heads
    qd, kvd = heads * hd, (c.get("num_key_value_heads") or heads) * hd
    flops = layers * (2 * 128 * (d * (2 * qd + 2 * kvd) + 3 * d * hid) + 4 * qd * 128 * 129 / 2)
    assert result["prompt_tflop_s"] == pytest.approx(flops * result["prompt_tok_s"] / 128 / 1e12, rel=1e-3, abs=1e-4)
    assert result["fma_probe_tflop_s"] > 0
    assert entries[32]["prompt_tok_s"] > 0
    assert entries[160]["prompt_tok_s"] is None  # 160 + 128 > 256
    r = run(tiny_llama[1], "--bench", "--json", "--bench-prompt", "40", "--bench-depths", "0,160", "-n", "8", "--threads", "1")
    result = json.loads(r.stdout.decode().strip().splitlines()[-1])
    assert result["prompt_tokens"] == 40
    assert result["decode"][1]["prompt_tok_s"] > 0  # 160 + 40 fit


def test_bench_kernels_on_cpu(tiny_llama):
    """--bench-kernels on the CPU: per depth, a table of the decode step's stages in the format the
    GPU prints and make compare reads (tests/bench/compare.py), launches as the step runs them, every
    stage timed; the JSON line stays the last line starting with '{'."""
    import json
    import sys

    from conftest import REPO

    sys.path.insert(0, str(REPO / "tests" / "bench"))
    import compare

    r = run(tiny_llama[1], "--bench", "--json", "--bench-kernels", "--bench-depths", "0,32", "-n", "8", "--threads", "1")
    out = r.stdout.decode()
    result = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    assert [d["depth"] for d in result["decode"]] == [0, 32]
    tables = compare.parse_kernel_tables(out)
    assert sorted(tables) == [1, 33]  # the position of the first decoded token at each depth
    for t in tables.values():
        stages = {s["stage"]: s for s in t["stages"]}
        assert list(stages) == ["embed", "rmsnorm_qkv_rope", "attention", "o_proj_residual", "rmsnorm_gate_up_silu",
                                "down_residual", "rmsnorm_lm_head"]
        assert [s["launches"] for s in t["stages"]] == [1, 2, 2, 2, 2, 2, 1]  # tiny-llama: 2 layers
        assert all(s["us_per_token"] > 0 for s in t["stages"] if s["stage"] != "embed")  # embed: 64 values, < 0.05 us
        assert t["total"]["launches"] == 12
        assert t["total"]["us_per_token"] == pytest.approx(sum(s["us_per_token"] for s in t["stages"]), rel=0.01, abs=0.3)
    assert tables[33]["stages"][2]["mb_per_token"] > tables[1]["stages"][2]["mb_per_token"]  # attention reads more cache
    # then a prompt batch's stages from the same position (64 tokens: PREFILL_BATCH), with their
    # arithmetic: tiny-llama's dim 64, 4 heads of 16 (q, k and v 64 rows each), hidden 160, 2 layers
    batches = re.findall(r"a prompt batch of (\d+) tokens at depth (\d+) .*\n.*stage +launches +us/batch +GFLOP/batch +GFLOP/s\n"
                         r"((?:  .*\n)+?)  total +(\d+) +([\d.]+) +([\d.]+)", out)
    assert [(b[0], b[1], b[3]) for b in batches] == [("64", "1", "11"), ("64", "33", "11")], out
    for nb, depth, rows, _, total_us, _ in batches:
        stages = {line.split()[0]: [float(v) for v in line.split()[1:]] for line in rows.splitlines()}
        assert list(stages) == ["embed", "rmsnorm_qkv_rope", "attention", "o_proj_residual", "rmsnorm_gate_up_silu",
                                "down_residual"]
        assert all(v[1] > 0 for name, v in stages.items() if name != "embed")
        assert float(total_us) == pytest.approx(sum(v[1] for v in stages.values()), rel=0.01, abs=0.5)
        positions = 64 * (int(depth) + 1) + 64 * 63 / 2  # token b reads depth + b + 1 positions
        expect = {"rmsnorm_qkv_rope": 2 * 2 * 64 * 192 * 64, "attention": 2 * 4 * 64 * positions,
                  "o_proj_residual": 2 * 2 * 64 * 64 * 64, "rmsnorm_gate_up_silu": 2 * 4 * 64 * 160 * 64,
                  "down_residual": 2 * 2 * 64 * 64 * 160}
        for name, flops in expect.items():
            assert stages[name][2] == pytest.approx(flops / 1e9, abs=6e-4), name
