"""Tests for tests/reference.py, the NumPy forward pass every other implementation is judged by.

Each piece is checked against a formulation written differently (complex rotation for RoPE,
hand-derived numbers for llama3 scaling and RMSNorm), and whole-model properties that hold
exactly in exact arithmetic (causality, GQA = MHA with repeated K/V heads, tied = untied with a
copied head, KV-cache decoding = full re-run) are checked to float64 round-off (1e-9 relative
or tighter; the same float64 operations in a different order differ by ~1e-15)."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from codegen import synth  # noqa: E402
import reference as ref  # noqa: E402

MODELS = ROOT / "tests" / "models"
TINY = ["tiny-llama", "tiny-gqa", "tiny-qwen2", "tiny-llama3"]


def config_of(name, **overrides):
    config = json.loads((MODELS / name / "config.json").read_text())
    config.update(overrides)
    return config


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """name -> {tensor name: float64 array}, synthesized once per module (seed 0)."""
    out = {}
    for name in TINY:
        d = tmp_path_factory.mktemp(name)
        (d / "config.json").write_text((MODELS / name / "config.json").read_text())
        synth.synthesize(d, seed=0)
        out[name] = ref.load_tensors(d)
    return out


def tokens(n, seed=0):
    return np.random.default_rng(seed).integers(0, 400, n).tolist()


def rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


# --- pieces ----------------------------------------------------------------------------------

def test_rope_matches_complex_rotation():
    # HF pairs element i with element i + d/2: as a complex number x[i] + j x[i + d/2], RoPE
    # multiplies it by exp(j * pos * inv_freq[i]).
    rng = np.random.default_rng(1)
    d = 16
    x = rng.standard_normal((7, 3, d))
    positions = np.array([0, 1, 2, 5, 31, 100, 255])
    inv_freq = ref.rope_inv_freq({"hidden_size": 48, "num_attention_heads": 3,
                                  "rope_theta": 10000.0})
    z = (x[..., : d // 2] + 1j * x[..., d // 2:]) * np.exp(
        1j * positions[:, None, None] * inv_freq[None, None, :])
    expect = np.concatenate([z.real, z.imag], axis=-1)
    got = ref.apply_rope(x, positions, inv_freq)
    np.testing.assert_allclose(got, expect, rtol=0, atol=1e-12)
    # position 0 is the identity; the rotation keeps each pair's norm
    np.testing.assert_array_equal(got[0], x[0])


def test_rope_default_inv_freq():
    inv = ref.rope_inv_freq(config_of("tiny-llama"))  # head_dim 16, theta 1e4
    assert inv.shape == (8,)
    assert inv[0] == 1.0
    assert inv[1] == pytest.approx(10000 ** (-2 / 16), rel=1e-15)
    assert inv[7] == pytest.approx(10000 ** (-14 / 16), rel=1e-15)
    # Qwen2 has no head_dim key: hidden_size / num_attention_heads
    assert len(ref.rope_inv_freq(config_of("tiny-qwen2"))) == 8


def test_llama3_inv_freq_by_hand():
    # tiny-llama3: theta 5e5, head_dim 16, factor 8, low 1, high 4, original context 64.
    # Wavelengths 2 pi / inv_freq: i=0: 6.28 (< 64/4 = 16, kept), i=1: 32.4 (between 16 and
    # 64: smoothed), i>=2: 167, 862, ... (> 64/1: divided by 8).
    config = config_of("tiny-llama3")
    scaled = ref.rope_inv_freq(config)
    plain = ref.rope_inv_freq(dict(config, rope_scaling=None))
    inv1 = 500000 ** (-1 / 8)                        # 0.193922744748...
    s = (64 * inv1 / (2 * math.pi) - 1) / (4 - 1)    # smooth factor, 0.325094...
    assert scaled[0] == plain[0] == 1.0
    assert scaled[1] == pytest.approx(inv1 * (1 / 8 + 7 / 8 * s), rel=1e-12)
    assert scaled[1] == pytest.approx(0.0794030091792, rel=1e-10)
    assert scaled[2] == pytest.approx(500000 ** (-2 / 8) / 8, rel=1e-12)
    np.testing.assert_allclose(scaled[2:], plain[2:] / 8, rtol=1e-14)
    # the scaling changes frequencies the tiny model uses within its 256 positions: at
    # position 255, pair 2 turns by 9.6 rad unscaled and 1.2 rad scaled
    assert 255 * plain[2] - 255 * scaled[2] > 8


def test_linear_inv_freq():
    config = config_of("tiny-llama")
    plain = ref.rope_inv_freq(config)
    scaled = ref.rope_inv_freq(dict(config, rope_scaling={"type": "linear", "factor": 4.0}))
    np.testing.assert_allclose(scaled, plain / 4, rtol=1e-15)
    with pytest.raises(NotImplementedError, match="yarn"):
        ref.rope_inv_freq(dict(config, rope_scaling={"rope_type": "yarn", "factor": 4.0}))


def test_rmsnorm_by_hand():
    x = np.array([[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 0.0, 0.5]])
    w = np.array([1.0, 0.5, 2.0, -1.0])
    # row 0: mean(x^2) = 30 / 4 = 7.5; row 1: 0.25 / 4 = 0.0625
    got = ref.rmsnorm(x, w, 1e-5)
    expect0 = np.array([1.0, 1.0, 6.0, -4.0]) / math.sqrt(7.5 + 1e-5)
    expect1 = np.array([0.0, 0.0, 0.0, -0.5]) / math.sqrt(0.0625 + 1e-5)
    np.testing.assert_allclose(got, [expect0, expect1], rtol=1e-15)


def test_silu_and_softmax_edges():
    x = np.array([-1000.0, -1.0, 0.0, 1.0, 1000.0])
    np.testing.assert_allclose(ref.silu(x), x / (1 + np.exp(-np.clip(x, -700, 700))),
                               rtol=1e-12, atol=1e-300)
    p = ref.softmax(np.array([[0.0, -np.inf, 1000.0], [1.0, 2.0, 3.0]]))
    np.testing.assert_allclose(p[0], [0, 0, 1])
    assert p[1].sum() == pytest.approx(1.0) and p[1, 2] > p[1, 1] > p[1, 0]


# --- whole model -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", TINY)
def test_logits_are_not_degenerate(weights, name):
    logits = ref.Model(config_of(name), weights[name]).forward(tokens(24))
    assert logits.shape == (24, 400) and np.all(np.isfinite(logits))
    assert np.all((logits.std(axis=-1) > 0.3) & (logits.std(axis=-1) < 5))
    # different positions prefer different tokens
    assert len(set(logits.argmax(axis=-1).tolist())) > 5


@pytest.mark.parametrize("name", TINY)
def test_causality(weights, name):
    model = ref.Model(config_of(name), weights[name])
    ids = tokens(20)
    a = model.forward(ids)
    ids[15] = (ids[15] + 1) % 400
    b = model.forward(ids)
    np.testing.assert_array_equal(a[:15], b[:15])
    assert np.all(np.max(np.abs(a[15:] - b[15:]), axis=-1) > 1e-3)


def test_gqa_equals_mha_with_repeated_kv(weights):
    config = config_of("tiny-gqa")               # 4 query heads, 2 kv heads, head_dim 16
    gqa = ref.Model(config, weights["tiny-gqa"])
    # HF repeat_kv: query head h reads kv head h // 2, so the MHA k/v weights hold each kv
    # head's 16 rows twice, adjacent: kv0, kv0, kv1, kv1
    t = dict(weights["tiny-gqa"])
    for l in range(3):
        for m in "kv":
            name = f"model.layers.{l}.self_attn.{m}_proj.weight"
            t[name] = np.repeat(t[name].reshape(2, 16, 64), 2, axis=0).reshape(64, 64)
    mha = ref.Model(dict(config, num_key_value_heads=4), t)
    ids = tokens(30)
    assert rel(mha.forward(ids), gqa.forward(ids)) < 1e-12
    # the other plausible mapping (h % 2, i.e. kv0, kv1, kv0, kv1) is not the same model
    for l in range(3):
        for m in "kv":
            name = f"model.layers.{l}.self_attn.{m}_proj.weight"
            w = weights["tiny-gqa"][name].reshape(1, 2, 16, 64)
            t[name] = np.repeat(w, 2, axis=0).reshape(64, 64)
    assert rel(ref.Model(dict(config, num_key_value_heads=4), t).forward(ids),
               gqa.forward(ids)) > 1e-2


def test_tied_equals_untied_with_copied_head(weights):
    config = config_of("tiny-gqa")               # tied
    tied = ref.Model(config, weights["tiny-gqa"])
    t = dict(weights["tiny-gqa"])
    t["lm_head.weight"] = t["model.embed_tokens.weight"].copy()
    untied = ref.Model(dict(config, tie_word_embeddings=False), t)
    ids = tokens(12)
    np.testing.assert_array_equal(untied.forward(ids), tied.forward(ids))
    # and a model whose config says untied really reads lm_head
    t["lm_head.weight"] = weights["tiny-llama"]["lm_head.weight"]
    assert rel(ref.Model(dict(config, tie_word_embeddings=False), t).forward(ids),
               tied.forward(ids)) > 0.5
    with pytest.raises(KeyError, match="lm_head.weight"):
        ref.Model(dict(config, tie_word_embeddings=False), weights["tiny-gqa"])


def test_qwen2_bias_is_applied(weights):
    config = config_of("tiny-qwen2")
    ids = tokens(16)
    base = ref.Model(config, weights["tiny-qwen2"]).forward(ids)
    for m in "qkv":
        t = dict(weights["tiny-qwen2"])
        t[f"model.layers.1.self_attn.{m}_proj.bias"] = np.zeros(64 if m == "q" else 32)
        assert rel(ref.Model(config, t).forward(ids), base) > 1e-3, m
    with pytest.raises(KeyError, match="q_proj.bias"):
        t = {k: v for k, v in weights["tiny-qwen2"].items() if not k.endswith(".bias")}
        ref.Model(config, t)


def test_llama3_scaling_changes_logits(weights):
    config = config_of("tiny-llama3")
    ids = tokens(64)
    scaled = ref.Model(config, weights["tiny-llama3"]).forward(ids)
    plain = ref.Model(dict(config, rope_scaling=None), weights["tiny-llama3"]).forward(ids)
    np.testing.assert_array_equal(scaled[0], plain[0])   # position 0: no rotation at all
    assert ref.compare_logits(scaled[32:], plain[32:]) > 1e-2


@pytest.mark.parametrize("name", TINY)
def test_kv_cache_matches_full_forward(weights, name):
    model = ref.Model(config_of(name), weights[name])
    prompt = tokens(9)
    out = model.greedy(prompt, 12)
    full = model.forward(prompt + out[:-1])
    assert full[8:].argmax(axis=-1).tolist() == out
    # chunked prefill through the cache gives the same logits as one pass
    cache = model.new_cache()
    parts = [model.step(prompt[:4], cache), model.step(prompt[4:5], cache),
             model.step(prompt[5:], cache)]
    assert rel(np.concatenate(parts), model.forward(prompt)) < 1e-12


def test_sliding_window_mistral(weights):
    # Mistral: query at position p sees keys p - window + 1 .. p
    config = config_of("tiny-gqa", architectures=["MistralForCausalLM"], model_type="mistral",
                       sliding_window=4)
    windowed = ref.Model(config, weights["tiny-gqa"])
    full = ref.Model(config_of("tiny-gqa"), weights["tiny-gqa"])
    ids = tokens(10)
    a = windowed.forward(ids)
    b = full.forward(ids)
    np.testing.assert_array_equal(a[:4], b[:4])
    assert rel(a[4:], b[4:]) > 1e-3
    # with 3 layers, information moves back up to 3 * 3 = 9 positions: token 0 still reaches
    # position 9, but in a single-layer model it reaches only positions 0..3
    one = dict(config, num_hidden_layers=1)
    m1 = ref.Model(one, weights["tiny-gqa"])
    ids2 = [ids[0] + 1] + ids[1:]
    np.testing.assert_array_equal(m1.forward(ids)[4:], m1.forward(ids2)[4:])
    assert rel(m1.forward(ids)[3], m1.forward(ids2)[3]) > 1e-4


# --- comparing -------------------------------------------------------------------------------

def test_compare_logits_definition():
    b = np.array([[1.0, -4.0, 2.0], [0.5, 0.25, -0.5]])
    a = b + np.array([[0.4, 0.0, 0.0], [0.0, 0.0, 0.1]])
    # per position, max|a - b| / max|b|: 0.4 / 4 = 0.1 and 0.1 / 0.5 = 0.2 (a global
    # normalisation would give 0.1 / 4 for the second)
    assert ref.compare_logits(a, b) == pytest.approx(0.2)
    assert ref.compare_logits(b, b) == 0.0
    with pytest.raises(ValueError):
        ref.compare_logits(a[:1], b)


@pytest.mark.parametrize("name", TINY)
def test_fp16_kv_cache_error_is_small(weights, name):
    # What an fp16 KV cache alone costs on the tiny models over 128 positions (measured
    # 6e-4 .. 1.1e-3), and what fp32 arithmetic alone costs (1e-6 .. 2e-6): the numbers behind
    # reference.TOL_*. Neither is zero (the emulation does something) and both sit under the
    # tolerances the numerics test uses.
    config = config_of(name)
    ids = tokens(128, seed=3)
    exact = ref.Model(config, weights[name]).forward(ids)
    rounded = ref.Model(config, weights[name], kv_dtype=np.float16).forward(ids)
    assert 1e-4 < ref.compare_logits(rounded, exact) < ref.TOL_FP16_KV
    single = ref.Model(config, weights[name], dtype=np.float32).forward(ids)
    assert 1e-8 < ref.compare_logits(single, exact) < ref.TOL_FP32
    both = ref.Model(config, weights[name], dtype=np.float32, kv_dtype=np.float16).forward(ids)
    assert ref.compare_logits(both, rounded) < ref.TOL_FP16_KV_EMULATED


# --- the tiny models' files ------------------------------------------------------------------

def test_tiny_tokenizer_is_reproducible(tmp_path):
    r = subprocess.run([sys.executable, str(MODELS / "make_tiny_tokenizer.py"), str(tmp_path)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for f in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / f).read_bytes() == (MODELS / "tiny-tokenizer" / f).read_bytes(), f


@pytest.mark.parametrize("name", TINY)
def test_tiny_configs_match_tokenizer(name):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(MODELS / "tiny-tokenizer" / "tokenizer.json"))
    tc = json.loads((MODELS / "tiny-tokenizer" / "tokenizer_config.json").read_text())
    config = config_of(name)
    assert config["vocab_size"] == tok.get_vocab_size() == 400
    assert config["bos_token_id"] == tok.token_to_id(tc["bos_token"])
    assert config["eos_token_id"] == tok.token_to_id(tc["eos_token"])
    assert config["max_position_embeddings"] == 256
