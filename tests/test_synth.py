"""Tests for codegen/synth.py: the files it writes are valid safetensors (read back with the
safetensors package), hold exactly the tensors the HF model has, at the intended scales, and
are byte-for-byte reproducible."""

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import safetensors
from safetensors import safe_open

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from codegen import synth  # noqa: E402
import reference  # noqa: E402

MODELS = ROOT / "tests" / "models"
TINY = ["tiny-llama", "tiny-gqa", "tiny-qwen2", "tiny-llama3"]


def model_dir(parent, name, **overrides):
    """parent/name holding the checked-in config of tiny model `name`, with overrides."""
    d = parent / name
    d.mkdir(parents=True)
    config = json.loads((MODELS / name / "config.json").read_text())
    config.update(overrides)
    (d / "config.json").write_text(json.dumps(config))
    return d


def expected_names(config):
    """The state_dict keys of the HF model, written out independently of synth.tensor_specs."""
    qwen2 = config["architectures"][0] == "Qwen2ForCausalLM"
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    for l in range(config["num_hidden_layers"]):
        p = f"model.layers.{l}."
        names |= {p + "input_layernorm.weight", p + "post_attention_layernorm.weight"}
        names |= {p + f"self_attn.{m}_proj.weight" for m in "qkvo"}
        names |= {p + f"mlp.{m}_proj.weight" for m in ("gate", "up", "down")}
        if qwen2:
            names |= {p + f"self_attn.{m}_proj.bias" for m in "qkv"}
        elif config.get("attention_bias"):  # LlamaAttention biases o_proj too
            names |= {p + f"self_attn.{m}_proj.bias" for m in "qkvo"}
    if not config["tie_word_embeddings"]:
        names.add("lm_head.weight")
    return names


@pytest.mark.parametrize("name", TINY)
def test_tiny_model_loads_with_safetensors(tmp_path, name):
    d = model_dir(tmp_path, name)
    synth.synthesize(d, seed=1)
    config = json.loads((d / "config.json").read_text())
    path = d / "model.safetensors"
    with safe_open(str(path), "numpy") as f:
        names = set(f.keys())
        assert names == expected_names(config)
        assert f.metadata() == {"format": "pt"}
        kv = config["num_key_value_heads"] * 16
        assert f.get_slice("model.embed_tokens.weight").get_shape() == [400, 64]
        assert f.get_slice("model.layers.1.self_attn.k_proj.weight").get_shape() == [kv, 64]
        assert f.get_slice("model.layers.1.mlp.down_proj.weight").get_shape() == [64, 160]
        assert {f.get_slice(n).get_dtype() for n in names} == {"BF16"}
    data = path.read_bytes()
    header_len = int.from_bytes(data[:8], "little")
    assert header_len % 8 == 0
    n_params = sum(t["data"].__len__() for _, t in safetensors.deserialize(data)) // 2
    assert len(data) == 8 + header_len + 2 * n_params


def test_scales(tmp_path):
    d = model_dir(tmp_path, "tiny-qwen2", num_hidden_layers=1, intermediate_size=4096)
    synth.synthesize(d, seed=3)
    t = reference.load_tensors(d)
    # bf16 keeps 8 significant bits: 0.5% off per value at most, the sample std a few % off
    up = t["model.layers.0.mlp.up_proj.weight"]           # (4096, 64): fan_in 64
    assert abs(up.mean()) < 0.01 * 64 ** -0.5
    assert up.std() == pytest.approx(64 ** -0.5, rel=0.02)
    down = t["model.layers.0.mlp.down_proj.weight"]       # (64, 4096): fan_in 4096
    assert down.std() == pytest.approx(4096 ** -0.5, rel=0.02)
    norm = t["model.layers.0.input_layernorm.weight"]
    assert abs(norm.mean() - 1.0) < 0.05 and 0.05 < norm.std() < 0.15
    bias = t["model.layers.0.self_attn.q_proj.bias"]
    assert 0.03 < bias.std() < 0.07
    # a normal sample, not a uniform one: kurtosis 3 (uniform: 1.8)
    z = up.ravel() / up.std()
    assert np.mean(z ** 4) == pytest.approx(3.0, abs=0.1)


def test_deterministic_and_thread_independent(tmp_path):
    a = model_dir(tmp_path, "tiny-gqa")
    synth.synthesize(a, seed=7, threads=1)
    b = model_dir(tmp_path / "b", "tiny-gqa")
    synth.synthesize(b, seed=7, threads=3)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    synth.synthesize(b, seed=8)
    ta, tb = reference.load_tensors(a), reference.load_tensors(b)
    assert not np.array_equal(ta["model.layers.0.self_attn.q_proj.weight"],
                              tb["model.layers.0.self_attn.q_proj.weight"])


def test_multi_chunk_tensor(tmp_path, monkeypatch):
    # tensors that span several generation chunks come out whole and not periodic
    monkeypatch.setattr(synth, "CHUNK_ELEMS", 1000)
    d = model_dir(tmp_path, "tiny-llama")
    synth.synthesize(d, seed=0)
    w = reference.load_tensors(d)["model.embed_tokens.weight"].ravel()  # 25600 elements
    assert not np.array_equal(w[:1000], w[1000:2000])
    assert w[-1000:].std() == pytest.approx(64 ** -0.5, rel=0.1)


def test_sharding(tmp_path):
    one = model_dir(tmp_path, "tiny-llama3")
    synth.synthesize(one, seed=5)
    sharded = model_dir(tmp_path / "sharded", "tiny-llama3")
    (sharded / "model.safetensors").write_bytes(b"stale")
    synth.synthesize(sharded, seed=5, max_shard_bytes=60_000)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    n = len(files)
    assert n > 2
    assert files == [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)]
    assert not (sharded / "model.safetensors").exists()
    sizes = 0
    for name in files:
        with safe_open(str(sharded / name), "numpy") as f:
            assert set(f.keys()) == {k for k, v in index["weight_map"].items() if v == name}
            for k in f.keys():
                sizes += 2 * math.prod(f.get_slice(k).get_shape())
        assert (sharded / name).stat().st_size < 60_000 + 4096
    assert index["metadata"]["total_size"] == sizes
    ta, tb = reference.load_tensors(one), reference.load_tensors(sharded)
    assert ta.keys() == tb.keys()
    assert all(np.array_equal(ta[k], tb[k]) for k in ta)


def test_bf16_rounding():
    x = np.array([1.0, -1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, 3.0e38, 0.0],
                 dtype=np.float32)
    # ties go to the even bf16 (mantissa 7 bits: ulp at 1.0 is 2^-7)
    expect = [0x3F80, 0xBF80, 0x3F80, 0x3F82, 0x3F81, 0x7F62, 0x0000]
    assert synth.f32_to_bf16_bits(x).tolist() == expect


def test_cli_f16_and_tokenizer(tmp_path):
    d = model_dir(tmp_path, "tiny-llama")
    (d / "model-00001-of-00002.safetensors").write_bytes(b"stale")
    r = subprocess.run([sys.executable, "-m", "codegen.synth", str(d), "--dtype", "f16",
                        "--seed", "2", "--tokenizer",
                        str(MODELS / "tiny-tokenizer" / "tokenizer.json")],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in d.iterdir()) == [
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    with safe_open(str(d / "model.safetensors"), "numpy") as f:
        w = f.get_tensor("lm_head.weight")  # f16 loads natively
        assert w.dtype == np.float16 and w.shape == (400, 64)
    assert ((d / "tokenizer.json").read_bytes()
            == (MODELS / "tiny-tokenizer" / "tokenizer.json").read_bytes())


def test_cli_rejects_unknown_architecture(tmp_path):
    d = model_dir(tmp_path, "tiny-llama", architectures=["GPT2LMHeadModel"])
    r = subprocess.run([sys.executable, "-m", "codegen.synth", str(d)],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 1
    assert "GPT2LMHeadModel" in r.stderr and not list(d.glob("*.safetensors"))


def test_llama_bias_flags(tmp_path):
    d = model_dir(tmp_path, "tiny-llama", attention_bias=True, mlp_bias=True)
    synth.synthesize(d)
    with safe_open(str(d / "model.safetensors"), "numpy") as f:
        biases = {k for k in f.keys() if k.endswith(".bias")}
    # LlamaAttention gives o_proj the bias too; LlamaMLP all three projections
    per_layer = {f"self_attn.{m}_proj.bias" for m in "qkvo"} | {
        f"mlp.{m}_proj.bias" for m in ("gate", "up", "down")}
    assert biases == {f"model.layers.{l}.{b}" for l in range(2) for b in per_layer}


# The K formats as synth writes them (codegen/kquants.py, ggml's quantizer; its bytes are checked
# against ggml's in tests/test_quantize.py): read back by the gguf package's dequantizer, normal
# values come back within these RMS errors relative to the values' RMS (a wrong bit or nibble
# layout gives errors of order one). Measured on 64 rows of 512: Q4_K 0.071, Q5_K 0.036, Q6_K
# 0.018; the bounds leave a quarter above that.
K_RMS_BOUNDS = {"Q4_K": 0.09, "Q5_K": 0.045, "Q6_K": 0.022}


@pytest.mark.parametrize("fmt", sorted(K_RMS_BOUNDS))
def test_k_blocks_dequantize_close_to_the_values(fmt):
    import gguf

    rng = np.random.default_rng(5)
    x = (rng.standard_normal((64, 512)) * 0.05).astype(np.float32)
    x[3, :256] = 0  # a super-block of zeros: scales 0, values 0
    x[4] = np.abs(x[4])  # no negative value: a sub-block min of 0
    blocks = np.frombuffer(synth.quantize_blocks(x, fmt), np.uint8).reshape(64, -1)
    assert blocks.shape[1] == 512 // 256 * synth.QUANT_BLOCKS[fmt][1]
    y = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[fmt])
    assert np.sqrt(np.mean((y - x) ** 2)) < K_RMS_BOUNDS[fmt] * np.sqrt(np.mean(x ** 2))
    assert np.all(y[3, :256] == 0)


def test_quant_q4_k_m_follows_llama_cpp(tmp_path):
    """--quant q4_k_m: llama.cpp's Q4_K_M for 32 layers (its use_more_bits: layers 0-3, 28-31 and
    every third from 6), written into config.json, the weights in those formats."""
    d = model_dir(tmp_path, "tiny-llama", hidden_size=256, intermediate_size=512, head_dim=64, num_hidden_layers=32)
    synth.synthesize(d, seed=1, quant="q4_k_m")
    formats = json.loads((d / "config.json").read_text())["quantization_config"]["formats"]
    more = {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31}
    for l in range(32):
        for m, more_bits in (("self_attn.q_proj", False), ("self_attn.v_proj", True), ("mlp.down_proj", True), ("mlp.up_proj", False)):
            assert formats[f"model.layers.{l}.{m}.weight"] == ("Q6_K" if more_bits and l in more else "Q4_K"), (l, m)
    assert (formats["model.embed_tokens.weight"], formats["lm_head.weight"]) == ("Q4_K", "Q6_K")
    with safe_open(str(d / "model.safetensors"), "numpy") as f:
        assert f.get_slice("model.layers.6.mlp.down_proj.weight").get_shape() == [256, 2 * 210]
        assert f.get_slice("model.layers.7.mlp.down_proj.weight").get_shape() == [256, 2 * 144]
    tied = model_dir(tmp_path / "tied", "tiny-llama", hidden_size=256, intermediate_size=512, head_dim=64,
                     tie_word_embeddings=True)
    synth.synthesize(tied, seed=1, quant="q5_k_m")
    formats = json.loads((tied / "config.json").read_text())["quantization_config"]["formats"]
    assert formats["model.embed_tokens.weight"] == "Q6_K" and formats["model.layers.0.mlp.up_proj.weight"] == "Q5_K"
    with pytest.raises(ValueError, match="row length 64 is not a multiple of Q4_K's block of 256"):
        synth.synthesize(model_dir(tmp_path / "small", "tiny-llama"), quant="q4_k_m")


def test_quant_needs_no_gguf(tmp_path):
    """--quant where the gguf package is not installed (the GPU machine): the formats are planned
    and the blocks quantized without it (a test model of test_gpu.py is made so there)."""
    d = model_dir(tmp_path, "tiny-llama")
    code = ("import sys; sys.modules['gguf'] = None; from codegen import synth; "
            f"synth.main([{str(d)!r}, '--quant', 'q8_0', '--seed', '5'])")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    formats = json.loads((d / "config.json").read_text())["quantization_config"]["formats"]
    assert set(formats.values()) == {"Q8_0"}
