"""Build-time quantization (codegen/quantize.py): the `gguf` package's quantizer against ggml's
reference quantizer, codegen/kquants.py's K quantizer against ggml's own bytes, the quantized
directory's bytes and config, every refusal, and a binary built for one format refusing another.

The reference quantizer of Q8_0, Q4_0 and Q4_1 is transcribed here from ggml-quants.c
(quantize_row_q8_0_ref, quantize_row_q4_0_ref, quantize_row_q4_1_ref), one weight at a time in
float32 as the C does, so that gguf.quants.quantize is checked against it bit for bit rather than
trusted. The K formats' reference is ggml itself: tests/data/ggml_k_quants.npz holds rows and the
blocks ggml-quants.c (llama-cpp-python 0.3.16) made of them, written by tests/ggml_k_fixture.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import gguf
import numpy as np
import pytest
import safetensors.numpy
from gguf.constants import GGMLQuantizationType as Q

from codegen.kquants import quantize_k
from codegen.quantize import QuantizeError, main as quantize_main, quantize
from codegen.spec import load_spec
from conftest import REPO, make

sys.path.insert(0, str(REPO / "tests"))
import reference  # noqa: E402

f32 = np.float32


def roundf(x: np.float32) -> int:
    """C's roundf: halves away from zero."""
    return int(np.sign(x) * np.floor(abs(x) + f32(0.5)))


def ref_q8_0(block: np.ndarray) -> bytes:
    amax = f32(max(abs(v) for v in block))
    d = f32(amax / f32(127))
    idv = f32(f32(1) / d) if d else f32(0)
    qs = [roundf(f32(v * idv)) for v in block]
    return np.float16(d).tobytes() + np.array(qs, dtype=np.int8).tobytes()


def ref_q4_0(block: np.ndarray) -> bytes:
    amax, mx = f32(0), f32(0)
    for v in block:  # the value of largest magnitude, the first of equals, with its sign
        if abs(v) > amax:
            amax, mx = f32(abs(v)), v
    d = f32(mx / f32(-8))
    idv = f32(f32(1) / d) if d else f32(0)
    q = [min(15, int(np.int8(np.trunc(f32(f32(v * idv) + f32(8.5)))))) for v in block]
    packed = bytes(q[j] | q[j + 16] << 4 for j in range(16))
    return np.float16(d).tobytes() + packed


def ref_q4_1(block: np.ndarray) -> bytes:
    mn, mx = f32(np.inf), f32(-np.inf)
    for v in block:
        mn, mx = min(mn, v), max(mx, v)
    d = f32(f32(mx - mn) / f32(15))
    idv = f32(f32(1) / d) if d else f32(0)
    q = [min(15, int(np.int8(np.trunc(f32(f32(f32(v - mn) * idv) + f32(0.5)))))) for v in block]
    packed = bytes(q[j] | q[j + 16] << 4 for j in range(16))
    return np.float16(d).tobytes() + np.float16(mn).tobytes() + packed


REFERENCE = {Q.Q8_0: ref_q8_0, Q.Q4_0: ref_q4_0, Q.Q4_1: ref_q4_1}


def edge_blocks(rng) -> np.ndarray:
    """Random blocks of several scales, and the blocks where rounding decides: all zero, one value,
    constant, exact halves of the step, a negative extreme, subnormal and large values."""
    blocks = [rng.standard_normal(32) * s for s in (1e-3, 0.02, 1.0, 30.0)]
    blocks += [np.zeros(32), np.eye(32)[5] * 0.7, np.full(32, -0.25), np.arange(32) - 16.0,
               (np.arange(32) - 15.5) / 127 * 8, -np.abs(rng.standard_normal(32)), rng.standard_normal(32) * 1e-6,
               np.linspace(-1, 1, 32), rng.standard_normal(32) * 3e3]
    return np.array(blocks, dtype=np.float32)


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1], ids=lambda t: t.name)
def test_gguf_quantizer_is_ggml_reference(qtype):
    rng = np.random.default_rng(59)
    blocks = np.concatenate([edge_blocks(rng), rng.standard_normal((48, 32)).astype(np.float32)])
    got = gguf.quants.quantize(blocks, qtype)
    for i, b in enumerate(blocks):
        assert got[i].tobytes() == REFERENCE[qtype](b), f"block {i}: {b[:4]}..."


# ---------------------------------------------------------------------------------------------
# The K formats against ggml's own bytes

K_FORMATS = ("Q4_K", "Q5_K", "Q6_K")
K_BLOCK_BYTES = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}
# Relative RMS error of the dequantized values (through the gguf package) for normal weights: a
# wrong bit or nibble layout gives errors of order one. Measured on the fixture's five spreads of
# 24 normal rows, the worst of the five: Q4_K 0.0725, Q5_K 0.0369, Q6_K 0.0199; the bounds leave a
# tenth above that.
K_RMS_BOUNDS = {"Q4_K": 0.08, "Q5_K": 0.041, "Q6_K": 0.022}


@pytest.fixture(scope="module")
def ggml_k():
    return dict(np.load(REPO / "tests" / "data" / "ggml_k_quants.npz"))


@pytest.mark.parametrize("fmt", K_FORMATS)
def test_k_quantizer_is_ggml(ggml_k, fmt, monkeypatch):
    """Every row of the fixture (random rows of five spreads, heavy-tailed and skewed ones, rows
    whose small sub-blocks' scales round to 0, zeros, constants, outliers, one-signed, tiny,
    subnormal and large values) quantizes to ggml's bytes, in one pass and as one matrix of two
    rows in passes of 7 super-blocks (kquants.BLOCKS_PER_PASS; a pass's seam inside a row)."""
    rows, want = ggml_k["rows"], ggml_k[fmt]
    assert rows.shape == (194, 256) and want.shape == (194, K_BLOCK_BYTES[fmt])
    got = quantize_k(rows, fmt)
    bad = np.nonzero((got != want).any(axis=1))[0]
    assert not len(bad), f"{fmt}: {len(bad)} rows differ from ggml's, the first row {bad[0]}: {rows[bad[0], :4]}..."
    monkeypatch.setattr("codegen.kquants.BLOCKS_PER_PASS", 7)
    assert np.array_equal(quantize_k(rows.reshape(2, -1), fmt).reshape(194, -1), want)


@pytest.mark.parametrize("fmt", K_FORMATS)
def test_k_blocks_dequantize_to_the_rows(ggml_k, fmt):
    """ggml's blocks of the fixture's normal rows dequantize (gguf package) within K_RMS_BOUNDS;
    a super-block of zeros comes back zeros."""
    rows = ggml_k["rows"]
    y = gguf.quants.dequantize(ggml_k[fmt], Q[fmt])
    for i in range(0, 120, 24):  # five spreads of 24 normal rows each
        x = rows[i:i + 24]
        assert np.sqrt(np.mean((y[i:i + 24] - x) ** 2)) < K_RMS_BOUNDS[fmt] * np.sqrt(np.mean(x ** 2)), (fmt, i)
    zero = np.nonzero(~rows.any(axis=1))[0]
    assert len(zero) and not y[zero].any()


# ---------------------------------------------------------------------------------------------
# The quantized directory

# Rows of whole K super-blocks (hidden 256, FFN 512) and eight layers, of which llama.cpp's
# use_more_bits picks 0, 3, 6 and 7.
K_SHAPE = {"hidden_size": 256, "intermediate_size": 512, "head_dim": 64, "num_hidden_layers": 8}
K_MORE_BITS = {0, 3, 6, 7}


@pytest.fixture(scope="module")
def tiny_src(tmp_path_factory):
    """tiny-gqa (tied embedding) and tiny-llama (untied lm_head) with random bf16 weights, and both
    at K_SHAPE (tiny-gqa-k, tiny-llama-k)."""
    root = tmp_path_factory.mktemp("quantize-src")
    out = {}
    for name in ("tiny-gqa", "tiny-llama", "tiny-gqa-k", "tiny-llama-k"):
        d = root / name
        d.mkdir()
        cfg = json.loads((REPO / "tests" / "models" / name.removesuffix("-k") / "config.json").read_text())
        (d / "config.json").write_text(json.dumps(dict(cfg, **K_SHAPE) if name.endswith("-k") else cfg))
        subprocess.run([sys.executable, "-m", "codegen.synth", str(d), "--seed", "3", "--tokenizer",
                        str(REPO / "tests" / "models" / "tiny-tokenizer")], cwd=REPO, check=True, capture_output=True)
        out[name] = d
    return out


def raw_tensors(d):
    """{name: (dtype, shape, bytes)} of d/model.safetensors."""
    return {k: (t["dtype"], list(t["shape"]), bytes(t["data"]))
            for k, t in safetensors.deserialize((d / "model.safetensors").read_bytes())}


def expected_formats(spec, qtype):
    """{tensor: format} that --type qtype should give, written out from llama.cpp's rules."""
    out = {}
    for t in spec.tensors:
        if t.field not in ("embed", "lm_head", "wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"):
            continue
        if qtype in ("q4_k_m", "q5_k_m"):  # the output Q6_K, so a tied table; some v and down Q6_K
            base = qtype[:2].upper() + "_K"
            output = t.field == "lm_head" or (t.field == "embed" and spec.tied_embeddings)
            more = t.field in ("wv", "w_down") and t.layer in K_MORE_BITS
            out[t.name] = "Q6_K" if output or more else base
        elif qtype == "q6_k":
            out[t.name] = "Q6_K"
        else:
            out[t.name] = qtype.upper() if t.field.startswith("w") else "Q8_0"
    return out


@pytest.mark.parametrize("qtype,model", [(q, m) for q in ("q8_0", "q4_0", "q4_1") for m in ("tiny-gqa", "tiny-llama")]
                         + [(q, m) for q in ("q6_k", "q4_k_m", "q5_k_m") for m in ("tiny-gqa-k", "tiny-llama-k")])
def test_quantize_writes_blocks_config_and_copies(tiny_src, tmp_path, monkeypatch, qtype, model):
    src = tiny_src[model]
    out = tmp_path / "q"
    monkeypatch.setattr("codegen.quantize.WEIGHTS_PER_CHUNK", 3000)  # chunks of a few rows: their seams
    changed = quantize(src, out, qtype)
    assert sorted(changed) == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    cfg, src_cfg = json.loads((out / "config.json").read_text()), json.loads((src / "config.json").read_text())
    formats = cfg.pop("quantization_config")
    assert cfg == src_cfg  # torch_dtype and everything else the source's
    spec = load_spec(out / "config.json")
    want = expected_formats(spec, qtype)
    assert formats == {"quant_method": "ingot", "formats": want}
    assert ("lm_head.weight" in want) == model.startswith("tiny-llama")
    if qtype.endswith("_k_m"):
        assert set(want.values()) == {"Q6_K", qtype[:2].upper() + "_K"}
    got, have = raw_tensors(out), raw_tensors(src)
    assert {k: (dt, shape) for k, (dt, shape, _) in got.items()} == {
        t.name: (t.stored_dtype, list(t.stored_shape)) for t in spec.tensors}
    for name, (dt, shape, data) in got.items():
        if name not in want:
            assert (dt, shape, data) == have[name], name  # norms copied as they are
            continue
        w = reference.load_tensors(src, np.float32)[name]
        fmt = want[name]
        blocks = quantize_k(w, fmt) if fmt in K_FORMATS else gguf.quants.quantize(w, Q[fmt])
        assert data == blocks.tobytes(), name
    assert (out / "tokenizer.json").read_bytes() == (src / "tokenizer.json").read_bytes()
    # the reference forward reads the quantized model as its dequantized weights: through the gguf
    # package, close to the source's (a K row's layout wrong would be errors of order one)
    deq, dense = reference.load_tensors(out, np.float32), reference.load_tensors(src, np.float32)
    for name in ("model.layers.1.mlp.down_proj.weight", "model.layers.0.self_attn.v_proj.weight"):
        fmt = want[name]
        assert np.array_equal(deq[name], gguf.quants.dequantize(np.frombuffer(got[name][2], np.uint8).reshape(got[name][1]),
                                                                Q[fmt]))
        if fmt in K_FORMATS:
            rms = np.sqrt(np.mean((deq[name] - dense[name]) ** 2) / np.mean(dense[name] ** 2))
            assert rms < K_RMS_BOUNDS[fmt], (name, fmt, rms)
    # deterministic, and nothing is rewritten when nothing changed
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    assert quantize(src, out, qtype) == []
    assert (out / "model.safetensors").stat().st_mtime_ns == mtime


def test_q4_1_of_tiny_gqa_is_the_golden_config(tiny_src, tmp_path):
    """tests/models/tiny-q4_1 (the golden quantized sources' model) is what quantize writes."""
    quantize(tiny_src["tiny-gqa"], tmp_path / "q", "q4_1")
    assert (json.loads((tmp_path / "q" / "config.json").read_text())
            == json.loads((REPO / "tests" / "models" / "tiny-q4_1" / "config.json").read_text()))


def one_line_error(capsys, argv):
    assert quantize_main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("quantize: ")
    return err


def test_refusals(tiny_src, tmp_path, capsys):
    src = tiny_src["tiny-gqa"]
    quantize(src, tmp_path / "q", "q8_0")
    err = one_line_error(capsys, [str(tmp_path / "q"), str(tmp_path / "qq"), "--type", "q4_0"])
    assert "already quantized" in err and f"{tmp_path / 'q'}/config.json" in err
    assert not (tmp_path / "qq").exists()

    odd = tmp_path / "odd"  # FFN rows of 176 weights: not whole 32-weight blocks
    odd.mkdir()
    cfg = json.loads((src / "config.json").read_text())
    (odd / "config.json").write_text(json.dumps(dict(cfg, intermediate_size=176)))
    err = one_line_error(capsys, [str(odd), str(tmp_path / "o"), "--type", "q4_1"])
    assert "model.layers.0.mlp.down_proj.weight: row length 176 is not a multiple of Q4_1's block of 32" in err

    fp16 = tmp_path / "fp16"  # the weights are bf16, the config says float16
    shutil.copytree(src, fp16)
    (fp16 / "config.json").write_text(json.dumps(dict(cfg, torch_dtype="float16")))
    err = one_line_error(capsys, [str(fp16), str(tmp_path / "f"), "--type", "q8_0"])
    assert "model.embed_tokens.weight: dtype BF16 shape [400, 64], expected F16 [400, 64]" in err

    short = tmp_path / "short"  # a layer fewer in the weights than in the config
    shutil.copytree(src, short)
    (short / "config.json").write_text(json.dumps(dict(cfg, num_hidden_layers=4)))
    err = one_line_error(capsys, [str(short), str(tmp_path / "s"), "--type", "q8_0"])
    assert "tensor model.layers.3.input_layernorm.weight missing" in err

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps(dict(cfg, hidden_act="gelu")))
    err = one_line_error(capsys, [str(bad), str(tmp_path / "b"), "--type", "q8_0"])
    assert f"{bad}/config.json: 'hidden_act' = 'gelu'" in err
    with pytest.raises(QuantizeError, match="type 'q5_k' unsupported"):
        quantize(src, tmp_path / "k", "q5_k")

    # the K formats: rows of 64 weights (tiny-gqa's) are not 256-weight super-blocks, named by the
    # first matrix that fails, in the format it would have had
    for qtype in ("q6_k", "q4_k_m", "q5_k_m"):
        err = one_line_error(capsys, [str(src), str(tmp_path / qtype), "--type", qtype])
        assert f"{src}: model.embed_tokens.weight: row length 64 is not a multiple of Q6_K's block of 256" in err
        assert not (tmp_path / qtype).exists()
    ffn = tmp_path / "ffn320"  # K_SHAPE but FFN rows of 320: down_proj alone fails
    ffn.mkdir()
    (ffn / "config.json").write_text(json.dumps({**cfg, **K_SHAPE, "intermediate_size": 320, "tie_word_embeddings": False}))
    err = one_line_error(capsys, [str(ffn), str(tmp_path / "f5"), "--type", "q5_k_m"])
    assert "model.layers.0.mlp.down_proj.weight: row length 320 is not a multiple of Q6_K's block of 256" in err
    err = one_line_error(capsys, [str(ffn), str(tmp_path / "f6"), "--type", "q6_k"])
    assert "model.layers.0.mlp.down_proj.weight: row length 320 is not a multiple of Q6_K's block of 256" in err


def test_binary_refuses_another_format(tiny_src, tmp_path):
    """A binary built for the Q4_1 model runs it and refuses the Q8_0 one of the same shape by the
    key that differs (Q4_0 and Q4_K rows of equal length have equal bytes: the tensor table alone
    cannot tell formats apart)."""
    q4 = tmp_path / "tiny-gqa-q4_1"
    q8 = tmp_path / "tiny-gqa-q8_0"
    quantize(tiny_src["tiny-gqa"], q4, "q4_1")
    quantize(tiny_src["tiny-gqa"], q8, "q8_0")
    make(f"MODEL={q4}", "NVCC=", f"build/{q4.name}/ingot")
    binary = REPO / "build" / q4.name / "ingot"
    ok = subprocess.run([str(binary), "-m", str(q4), "--check-weights", "-p", "a", "-n", "1", "--temp", "0"],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and ok.stdout.startswith("a"), ok.stderr
    r = subprocess.run([str(binary), "-m", str(q8), "-p", "a", "-n", "1"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and r.stderr.count("\n") == 1
    assert "'quantization_config' is Q8_0 for model.layers.0.self_attn.q_proj, this binary was built for Q4_1" in r.stderr, r.stderr
