"""The run-time spec of the generic build (runtime/model_spec.c) against the generator's
(codegen/spec.py): every config the project knows and variants of them, field by field, and every
refusal with the same message. Driven through build/tests/spec_cli, which prints the C spec as JSON.

Tolerance: the RoPE frequencies are computed in double in both, with the same operations in the
same order and the same libm pow; we allow 1e-7 relative (float32 rounding is 6e-8), and require
the float32 values the kernels use to be equal, since a generic build must give the specialized
build's logits."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from codegen.spec import LAYER_MATRIX_FIELDS, MIXED, SpecError, load_spec
from conftest import REPO, make

SPEC_CLI = REPO / "build" / "tests" / "spec_cli"
CONFIGS = sorted(REPO.glob("models/*/config.json")) + sorted(REPO.glob("tests/models/*/config.json"))


@pytest.fixture(scope="module")
def spec_cli():
    make("build/tests/spec_cli")
    return SPEC_CLI


def c_spec(spec_cli, model_dir: Path):
    """(the C spec as a dict, None) or (None, its one-line error)."""
    r = subprocess.run([str(spec_cli), str(model_dir)], capture_output=True, text=True, timeout=60)
    if r.returncode == 0:
        return json.loads(r.stdout), None
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    return None, r.stderr.strip()


def assert_same(c: dict, py) -> None:
    for field in ("name", "architecture", "family", "dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "head_dim",
                  "q_dim", "kv_dim", "kv_mul", "vocab_size", "seq_len", "rope_scaling", "qkv_bias", "o_bias",
                  "tied_embeddings", "dtype", "dtype_bytes", "bos_id", "weight_bytes", "kv_bytes_per_pos"):
        assert c[field] == getattr(py, field), f"{field}: C {c[field]!r}, spec.py {getattr(py, field)!r}"
    assert c["norm_eps"] == py.norm_eps and c["rope_theta"] == py.rope_theta
    assert tuple(c["eos_ids"]) == py.eos_ids
    want = np.array(py.rope_inv_freq)
    got = np.array(c["rope_inv_freq"])
    assert got.shape == want.shape and np.all(np.abs(got - want) <= 1e-7 * np.abs(want))
    assert np.array_equal(np.array(c["rope_inv_freq_f32"], dtype=np.float32), want.astype(np.float32))
    assert c["layer_tensors"] == len(py.layer_fields)
    assert [(n, dt, tuple(s)) for n, dt, s in c["tensors"]] == [(t.name, t.stored_dtype, t.stored_shape)
                                                                 for t in py.tensors]
    assert c["formats"] == list(py.formats.values()) and c["quantized"] == py.quantized
    assert c["layer_formats"] == [[py.layer_formats[f][l] for f in LAYER_MATRIX_FIELDS] for l in range(py.n_layers)]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.parent.name)
def test_known_configs_match_spec_py(spec_cli, config):
    c, err = c_spec(spec_cli, config.parent)
    assert err is None, err
    assert_same(c, load_spec(config, name=config.parent.name))


def base():
    return json.loads((REPO / "tests" / "models" / "tiny-llama" / "config.json").read_text())


def llama_1b():
    return json.loads((REPO / "models" / "llama-3.2-1b-instruct" / "config.json").read_text())


def with_(cfg, **changes):
    cfg = copy.deepcopy(cfg)
    for k, v in changes.items():
        if v is ...:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    return cfg


# Configs both must accept, with the same spec: what the known ones do not cover.
VARIANTS = {
    "linear-rope": with_(base(), rope_scaling={"type": "linear", "factor": 4.0}),
    "default-rope-type": with_(base(), rope_scaling={"rope_type": "default"}),
    "rope-parameters": with_(base(), rope_theta=..., rope_parameters={"rope_theta": 500000.0, "rope_type": "llama3",
                                                                      "factor": 8.0, "low_freq_factor": 1.0,
                                                                      "high_freq_factor": 4.0,
                                                                      "original_max_position_embeddings": 64}),
    "no-head-dim-no-kv-heads": with_(base(), head_dim=..., num_key_value_heads=...),
    "head-dim-null": with_(base(), head_dim=None),
    "eos-list-no-bos": with_(base(), eos_token_id=[2, 1], bos_token_id=None),
    "eos-null": with_(base(), eos_token_id=None),
    "attention-bias": with_(base(), attention_bias=True),
    "fp16": with_(base(), torch_dtype="float16"),
    "fp32-dtype-key": with_(base(), torch_dtype=..., dtype="float32"),
    "no-eps-no-theta-no-act": with_(base(), rms_norm_eps=..., rope_theta=..., hidden_act=...),
    "mistral-window-null": with_(base(), architectures=["MistralForCausalLM"], sliding_window=None),
    "mistral-window-large": with_(base(), architectures=["MistralForCausalLM"], sliding_window=4096),
    "llama3-1b": llama_1b(),
    "integer-theta-and-eps": with_(base(), rope_theta=10000, rms_norm_eps=1),
    "empty-rope-scaling": with_(base(), rope_scaling={}),
}

def quantized(cfg, formats, method="ingot", **qc):
    """cfg with quantization_config {"quant_method": method, "formats": formats, **qc}; formats as
    {name: TYPE}, or {field: TYPE} with the field's HF name (layer {l}) for every layer."""
    layer_names = {"wq": "self_attn.q_proj", "wk": "self_attn.k_proj", "wv": "self_attn.v_proj",
                   "wo": "self_attn.o_proj", "w_gate": "mlp.gate_proj", "w_up": "mlp.up_proj",
                   "w_down": "mlp.down_proj"}
    out = {}
    for k, v in formats.items() if isinstance(formats, dict) else ():
        if k in layer_names:
            for l in range(cfg["num_hidden_layers"]):
                out[f"model.layers.{l}.{layer_names[k]}.weight"] = v
        else:
            out[k] = v
    return with_(cfg, quantization_config={"quant_method": method, "formats": out if isinstance(formats, dict) else formats, **qc})


# A llama whose every row length divides into 256-weight blocks: 64-wide heads, hidden 256, FFN 512.
def q_base():
    return with_(base(), hidden_size=256, intermediate_size=512, head_dim=64, tie_word_embeddings=False)


QUANT_VARIANTS = {
    "q-all-formats": quantized(q_base(), {"model.embed_tokens.weight": "Q8_0", "lm_head.weight": "Q6_K", "wq": "Q8_0",
                                          "wk": "Q4_0", "wv": "Q4_1", "wo": "Q4_K", "w_gate": "Q5_K", "w_up": "Q6_K",
                                          "w_down": "Q4_K"}),
    "q-layers-only-fp16": with_(quantized(q_base(), {f: "Q4_1" for f in ("wq", "wk", "wv", "wo", "w_gate", "w_up",
                                                                            "w_down")}), torch_dtype="float16"),
    "q-tied-embed": quantized(with_(q_base(), tie_word_embeddings=True), {"model.embed_tokens.weight": "Q8_0"}),
    "q-empty-formats": quantized(base(), {}),
    "q-null": with_(base(), quantization_config=None),
    "q-extra-keys": quantized(base(), {"wq": "Q8_0"}, bits=8),
    "q-qwen2": quantized(json.loads((REPO / "tests" / "models" / "tiny-qwen2" / "config.json").read_text()),
                         {"wq": "Q8_0", "wk": "Q8_0", "wv": "Q8_0"}),
    "q-f32-down-dense": with_(quantized(q_base(), {"wq": "Q4_0"}), torch_dtype="float32"),
    # fields whose layers differ in format
    "q-mixed-layers": quantized(q_base(), {"model.layers.0.mlp.down_proj.weight": "Q4_K",
                                           "model.layers.1.mlp.down_proj.weight": "Q6_K"}),
    "q-one-layer-dense": quantized(q_base(), {"model.layers.1.self_attn.v_proj.weight": "Q8_0"}),
    "q-k-m": quantized(q_base(), {"model.embed_tokens.weight": "Q4_K", "lm_head.weight": "Q6_K", "wq": "Q4_K", "wk": "Q4_K",
                                  "wo": "Q4_K", "w_gate": "Q4_K", "w_up": "Q4_K",
                                  "model.layers.0.self_attn.v_proj.weight": "Q6_K",
                                  "model.layers.1.self_attn.v_proj.weight": "Q4_K",
                                  "model.layers.0.mlp.down_proj.weight": "Q4_K",
                                  "model.layers.1.mlp.down_proj.weight": "Q5_K"}),
    "q-mixed-tied-fp16": with_(quantized(with_(q_base(), tie_word_embeddings=True),
                                         {"model.embed_tokens.weight": "Q6_K", "model.layers.1.mlp.gate_proj.weight": "Q4_0",
                                          "model.layers.0.mlp.up_proj.weight": "Q8_0"}), torch_dtype="float16"),
}

# Configs both must refuse, with spec.py's message.
REFUSALS = {
    "architectures": with_(base(), architectures=["GPT2LMHeadModel"]),
    "architectures-missing": with_(base(), architectures=...),
    "architectures-two": with_(base(), architectures=["LlamaForCausalLM", "MistralForCausalLM"]),
    "architectures-string": with_(base(), architectures="LlamaForCausalLM"),
    "hidden-act": with_(base(), hidden_act="gelu"),
    "hidden-act-null": with_(base(), hidden_act=None),
    "mlp-bias": with_(base(), mlp_bias=True),
    "qwen2-sliding": with_(base(), architectures=["Qwen2ForCausalLM"], use_sliding_window=True),
    "attention-bias-string": with_(base(), attention_bias="yes"),
    "hidden-size-string": with_(base(), hidden_size="64"),
    "hidden-size-float": with_(base(), hidden_size=64.0),
    "hidden-size-bool": with_(base(), hidden_size=True),
    "hidden-size-missing": with_(base(), hidden_size=...),
    "heads-zero": with_(base(), num_attention_heads=0),
    "kv-heads-negative": with_(base(), num_key_value_heads=-2),
    "kv-heads-not-divisor": with_(base(), num_key_value_heads=3),
    "hidden-not-multiple": with_(base(), head_dim=..., hidden_size=66),
    "head-dim-odd": with_(base(), head_dim=15),
    "context-missing": with_(base(), max_position_embeddings=None),
    "mistral-window": with_(base(), architectures=["MistralForCausalLM"], sliding_window=128),
    "theta-negative": with_(base(), rope_theta=-1.5),
    "theta-zero-in-parameters": with_(base(), rope_parameters={"rope_theta": 0}),
    "rope-scaling-list": with_(base(), rope_scaling=[1, 2]),
    "rope-yarn": with_(base(), rope_scaling={"rope_type": "yarn", "factor": 4.0}),
    "rope-type-missing": with_(base(), rope_scaling={"factor": 4.0}),
    "linear-no-factor": with_(base(), rope_scaling={"type": "linear"}),
    "llama3-no-low": with_(llama_1b(), rope_scaling={"rope_type": "llama3", "factor": 8.0}),
    "llama3-no-original": with_(llama_1b(), rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                          "high_freq_factor": 4.0}),
    "dtype-int8": with_(base(), torch_dtype="int8"),
    "dtype-null": with_(base(), torch_dtype=None),
    "eos-negative": with_(base(), eos_token_id=[2, -1]),
    "eos-string": with_(base(), eos_token_id="2"),
    "eos-outside-vocab": with_(base(), eos_token_id=100000),
    "vocab-missing": with_(base(), vocab_size=...),
    "intermediate-float": with_(base(), intermediate_size=160.5),
    "layers-zero": with_(base(), num_hidden_layers=0),
    "eps-zero": with_(base(), rms_norm_eps=0.0),
    "eps-string": with_(base(), rms_norm_eps="1e-5"),
    "eps-tiny-negative": with_(base(), rms_norm_eps=-1e-5),
    "eps-large-negative": with_(base(), rms_norm_eps=-1e20),
    "tied-string": with_(base(), tie_word_embeddings="true"),
    # quantization_config: every refusal of the contract
    "q-config-list": with_(base(), quantization_config=["ingot"]),
    "q-config-string": with_(base(), quantization_config="Q4_0"),
    "q-method-gptq": quantized(base(), {"wq": "Q8_0"}, method="gptq"),
    "q-method-missing": with_(base(), quantization_config={"formats": {}}),
    "q-formats-list": quantized(base(), ["Q8_0"]),
    "q-formats-missing": with_(base(), quantization_config={"quant_method": "ingot"}),
    "q-not-a-tensor": quantized(base(), {"model.layers.9.self_attn.q_proj.weight": "Q8_0"}),
    "q-bias-of-llama": quantized(base(), {"model.layers.0.self_attn.q_proj.bias": "Q8_0"}),
    "q-lm-head-tied": quantized(with_(base(), tie_word_embeddings=True), {"lm_head.weight": "Q8_0"}),
    "q-norm": quantized(base(), {"model.norm.weight": "Q8_0"}),
    "q-bias-qwen2": quantized(json.loads((REPO / "tests" / "models" / "tiny-qwen2" / "config.json").read_text()),
                              {"model.layers.0.self_attn.k_proj.bias": "Q8_0"}),
    "q-type-unknown": quantized(base(), {"wq": "Q5_0"}),
    "q-type-lowercase": quantized(base(), {"wq": "q8_0"}),
    "q-type-dense": quantized(base(), {"wq": "BF16"}),
    "q-type-number": quantized(base(), {"wq": 8}),
    "q-type-null": quantized(base(), {"wq": None}),
    "q-row-32": quantized(with_(base(), intermediate_size=176), {"w_down": "Q8_0"}),  # rows of 176
    "q-row-256": quantized(base(), {"wq": "Q4_K"}),  # rows of hidden_size 64
    "q-mixed-unknown-in-one-layer": quantized(q_base(), {"w_down": "Q4_K", "model.layers.1.mlp.down_proj.weight": "Q3_K"}),
    "q-mixed-rows-in-one-layer": quantized(with_(q_base(), intermediate_size=288),
                                           {"w_gate": "Q4_K", "model.layers.1.mlp.down_proj.weight": "Q4_K"}),
    "q-first-entry-bad-wins": quantized(q_base(), {"model.layers.0.mlp.up_proj.weight": "Q4_K",
                                                   "model.layers.0.self_attn.q_proj.weight": "IQ4_XS"}),
}


def write_config(tmp_path, name, cfg) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_layers_of_a_field_may_differ_in_format(tmp_path):
    """q-k-m (two layers, hidden 256, FFN 512, q_dim = kv_dim = 256, vocab 400): v_proj Q6_K then
    Q4_K, down_proj Q4_K then Q5_K. Each tensor keeps its format, the field is MIXED, the bytes a
    step reads are each layer's own."""
    d = write_config(tmp_path, "q-k-m", QUANT_VARIANTS["q-k-m"])
    spec = load_spec(d / "config.json")
    assert spec.layer_formats["wv"] == ("Q6_K", "Q4_K") and spec.layer_formats["w_down"] == ("Q4_K", "Q5_K")
    assert spec.layer_formats["wq"] == ("Q4_K", "Q4_K") and spec.layer_formats["lm_head"] == ("Q6_K",)
    assert spec.formats == {"embed": "Q4_K", "wq": "Q4_K", "wk": "Q4_K", "wv": MIXED, "wo": "Q4_K", "w_gate": "Q4_K",
                            "w_up": "Q4_K", "w_down": MIXED, "lm_head": "Q6_K"}
    assert [row for row in spec.layer_format_constants if row[2]] == [("WV", "wv", (14, 12), ("Q6_K", "Q4_K")),
                                                                      ("W_DOWN", "w_down", (12, 13), ("Q4_K", "Q5_K"))]
    assert [c[2] for c in spec.format_constants] == [12, 12, 12, -1, 12, 12, 12, -1, 14]
    q4k, q5k, q6k = 144, 176, 210  # bytes of a block of 256
    norms, q_k_o_gate_up = 2 * 256 * 2, 256 * q4k * 3 + 512 * q4k * 2
    layer0 = norms + q_k_o_gate_up + 256 * q6k + 256 * 2 * q4k
    layer1 = norms + q_k_o_gate_up + 256 * q4k + 256 * 2 * q5k
    assert spec.weight_bytes == q4k + layer0 + layer1 + 256 * 2 + 400 * q6k  # one embedding row, ..., final norm, lm_head


@pytest.mark.parametrize("name", sorted(VARIANTS) + sorted(QUANT_VARIANTS))
def test_variants_match_spec_py(spec_cli, tmp_path, name):
    d = write_config(tmp_path, name, {**VARIANTS, **QUANT_VARIANTS}[name])
    c, err = c_spec(spec_cli, d)
    assert err is None, err
    assert_same(c, load_spec(d / "config.json", name=name))


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_refusals_match_spec_py(spec_cli, tmp_path, name):
    d = write_config(tmp_path, name, REFUSALS[name])
    with pytest.raises(SpecError) as e:
        load_spec(d / "config.json")
    py = str(e.value)
    assert py.startswith("config.json: ")
    c, err = c_spec(spec_cli, d)
    assert c is None, f"C accepted what spec.py refuses: {py}"
    assert err == f"config does not match this binary: {d}/config.json: {py[len('config.json: '):]}"


def test_unreadable_and_malformed(spec_cli, tmp_path):
    _, err = c_spec(spec_cli, tmp_path / "nowhere")
    assert err.startswith("cannot read file: ") and "nowhere/config.json" in err
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text('{"hidden_size": 64,')
    _, err = c_spec(spec_cli, d)
    assert f"{d}/config.json: at byte" in err
    (d / "config.json").write_text("[1, 2]")
    _, err = c_spec(spec_cli, d)
    assert err.endswith(f"{d}/config.json: expected a JSON object")


# ---------------------------------------------------------------------------------------------
# Differential fuzzing: random configs, mutated from the known ones with values of every kind a
# config may hold (wrong types, zero, negative, huge, non-finite, escapes, nested), through both
# specs. Same verdict and the same message, and spec.py never fails with anything but SpecError.
# Values outside the comparison: strings with Unicode characters Python's repr escapes beyond
# ASCII controls (C quotes their bytes); integers beyond 2^53 (C reads a double: shown as one).

FUZZ_KEYS = ("architectures", "hidden_act", "mlp_bias", "use_sliding_window", "attention_bias", "hidden_size",
             "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings", "sliding_window",
             "rope_parameters", "rope_theta", "rope_scaling", "torch_dtype", "dtype", "eos_token_id", "bos_token_id",
             "vocab_size", "intermediate_size", "num_hidden_layers", "rms_norm_eps", "tie_word_embeddings",
             "quantization_config")
INF = "@@INF@@"  # written as 1e400, which both parsers read as infinity
NUMBERS = (0, 1, 2, 3, -1, 7, 16, 32, 64, 100, 128, 255, 256, 1024, 1025, 65536, 65537, 262145, 1 << 22, (1 << 22) + 1, 2**53 + 1, 10**400,
           1 << 24, (1 << 24) + 1, 2**31 - 1, 2**31, 2**53, 0.0, 0.5, 1.0, 1.5, 4.0, 8.0, 64.0, 1e-5, -1e-5, 1e-300,
           5e-324, 1e308, -1e308, 10000.0, 500000.0, INF)
OTHERS = (None, True, False, "", "silu", "gelu", "64", "bfloat16", "float16", "int8", "LlamaForCausalLM",
          "a\nb", "x'y", 'x"y', "x'y\"z", "\x1b[31m", "tab\there", "\x7f", "é", "llama3", "linear", "default", "yarn",
          [], [1], [2, -1], [True], ["LlamaForCausalLM"], ["Qwen2ForCausalLM"], ["MistralForCausalLM"],
          ["LlamaForCausalLM", "x"], [["LlamaForCausalLM"]], [{}], {}, {"a": 1}, {"rope_theta": 10.0},
          "x" * 300, list(range(100)))
SCALING_KEYS = ("rope_type", "type", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


QUANT_NAMES = ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight", "model.layers.0.self_attn.q_proj.weight",
               "model.layers.1.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.bias",
               "model.layers.0.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight",
               "model.layers.0.mlp.up_proj.weight", "model.layers.1.mlp.up_proj.weight", "model.layers.15.mlp.up_proj.weight",
               "x", "")
QUANT_TYPE_VALUES = ("Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K", "Q5_0", "BF16", "q8_0", None, 8, "")


def fuzz_value(rng, key):
    if key == "quantization_config" and rng.random() < 0.8:
        formats = {n: rng.choice(QUANT_TYPE_VALUES) if rng.random() < 0.2 else rng.choice(QUANT_TYPE_VALUES[:6])
                   for n in rng.sample(QUANT_NAMES, rng.randint(0, 5))}
        if rng.random() < 0.3:  # a whole field in one format, or two by layer as llama.cpp's _M files have it
            field = rng.choice(("self_attn.q_proj", "mlp.up_proj", "mlp.down_proj"))
            t = rng.sample(QUANT_TYPE_VALUES[:6], 2) if rng.random() < 0.5 else [rng.choice(QUANT_TYPE_VALUES[:6])] * 2
            formats.update({f"model.layers.{l}.{field}.weight": t[l % 3 == 2] for l in range(16)})
        qc = {"quant_method": "ingot" if rng.random() < 0.9 else rng.choice(OTHERS),
              "formats": formats if rng.random() < 0.95 else rng.choice(OTHERS)}
        return qc
    if key in ("rope_scaling", "rope_parameters") and rng.random() < 0.7:
        d = {}
        if rng.random() < 0.8:
            d[rng.choice(("rope_type", "type"))] = rng.choice(("linear", "llama3", "default", "yarn", None, 1))
        for k in SCALING_KEYS[2:]:
            if rng.random() < 0.8:
                d[k] = rng.choice(NUMBERS + (None, "4.0", True))
        if key == "rope_parameters" and rng.random() < 0.5:
            d["rope_theta"] = rng.choice(NUMBERS + (None, "1e4"))
        return d
    return rng.choice(NUMBERS) if rng.random() < 0.6 else copy.deepcopy(rng.choice(OTHERS))


def fuzz_configs(n, seed):
    import random
    rng = random.Random(seed)
    bases = [base(), llama_1b(), json.loads((REPO / "tests" / "models" / "tiny-qwen2" / "config.json").read_text()),
             with_(base(), architectures=["MistralForCausalLM"], sliding_window=None)]
    for _ in range(n):
        cfg = copy.deepcopy(rng.choice(bases))
        for _ in range(rng.randint(1, 3)):
            key = rng.choice(FUZZ_KEYS)
            if rng.random() < 0.15:
                cfg.pop(key, None)
            else:
                cfg[key] = fuzz_value(rng, key)
        yield json.dumps(cfg).replace(f'"{INF}"', "1e400")


def differential(spec_cli, tmp_path, texts) -> dict:
    """Runs every config text through both specs: same verdict, same spec or the same message."""
    dirs = []
    for i, text in enumerate(texts):
        d = tmp_path / f"c{i}"
        d.mkdir()
        (d / "config.json").write_text(text)
        dirs.append(d)
    r = subprocess.run([str(spec_cli), *map(str, dirs)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == len(dirs)
    verdicts = {"accepted": 0, "refused": 0, "quantized": 0}
    for d, text, line in zip(dirs, texts, lines):
        try:
            py, py_err = load_spec(d / "config.json", name=d.name), None
        except SpecError as e:
            py, py_err = None, str(e)
        except Exception as e:  # the generator must refuse, never crash
            pytest.fail(f"spec.py raised {type(e).__name__}: {e} on {text}")
        if py_err is None:
            assert not line.startswith("!"), f"C refused what spec.py accepts: {line} on {text}"
            assert_same(json.loads(line), py)
            verdicts["accepted"] += 1
            verdicts["quantized"] += py.quantized
        else:
            assert line.startswith("!"), f"C accepted what spec.py refuses ({py_err}) on {text}"
            assert line == f"!config does not match this binary: {d}/config.json: {py_err[len('config.json: '):]}", text
            verdicts["refused"] += 1
    return verdicts


def test_differential_fuzz(spec_cli, tmp_path):
    verdicts = differential(spec_cli, tmp_path, list(fuzz_configs(3000, seed=61)))
    assert verdicts["accepted"] > 100 and verdicts["refused"] > 1000, verdicts  # both sides exercised


def quant_fuzz_configs(n, seed):
    """Quantized configs: each matrix field in one random format (or dense), then now and then one
    entry changed (another format, a dense dtype, a tensor of no model, a layer out of range), on
    bases whose rows divide into 32 or 256 weights or not."""
    import random
    rng = random.Random(seed)
    bases = [q_base(), base(), with_(q_base(), tie_word_embeddings=True), with_(base(), intermediate_size=176),
             json.loads((REPO / "tests" / "models" / "tiny-qwen2" / "config.json").read_text())]
    for _ in range(n):
        cfg = copy.deepcopy(rng.choice(bases))
        fields = {}
        for f in ("model.embed_tokens.weight", "lm_head.weight", "wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"):
            if rng.random() < 0.5:
                fields[f] = rng.choice(QUANT_TYPE_VALUES[:6])
        cfg = quantized(cfg, fields)
        formats = cfg["quantization_config"]["formats"]
        if rng.random() < 0.3 and formats:
            formats[rng.choice(sorted(formats))] = rng.choice(QUANT_TYPE_VALUES)
        if rng.random() < 0.1:
            formats[rng.choice(QUANT_NAMES)] = rng.choice(QUANT_TYPE_VALUES[:6])
        yield json.dumps(cfg)


def test_differential_fuzz_quantized(spec_cli, tmp_path):
    verdicts = differential(spec_cli, tmp_path, list(quant_fuzz_configs(600, seed=59)))
    assert verdicts["quantized"] > 100 and verdicts["refused"] > 100, verdicts


@pytest.mark.parametrize("text, message", [
    ('{"hidden_size": 64, "hidden_size": 128}', "duplicate key"),
    ('{"rope_theta": NaN}', "not valid JSON"),
    ('{"rope_theta": Infinity}', "not valid JSON"),
    ("[" * 200 + "]" * 200, "nested"),
])
def test_json_refused_by_both(spec_cli, tmp_path, text, message):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(text)
    with pytest.raises(SpecError) as e:
        load_spec(d / "config.json")
    assert message in str(e.value)
    c, err = c_spec(spec_cli, d)
    assert c is None and err.startswith(f"config does not match this binary: {d}/config.json: at byte"), err
