"""GGUF -> Hugging Face model directory.

    python -m codegen.gguf_import GGUF OUTDIR [--dtype f16|bf16] [--dequantize]

Reads a llama-architecture (or qwen2) GGUF file and writes the directory that `save_pretrained`
would have written for the original model: config.json, model.safetensors (HF tensor names),
tokenizer.json (a real `tokenizers` file), tokenizer_config.json (with the chat template),
generation_config.json.

Weights: each matrix in a block format ingot runs (KEPT_TYPES: Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K)
is kept as it is, its GGUF blocks stored as a U8 tensor [rows, row_bytes] and named in
config.json's quantization_config (/work/notes/quant_contract.md), each tensor in its own: the
layers of a field may differ (llama.cpp's Q4_K_M keeps some layers' attn_v and ffn_down in Q6_K,
the others in Q4_K), and the generated code reads each layer's. F16/BF16/F32 matrices, norms and
biases are written in the dense dtype (--dtype). Another block type (Q5_0, Q2_K, IQ4_XS, ...) is
refused naming the tensor and its type. --dequantize inflates every tensor to the dense dtype
instead (the unquantized baseline of a quality measurement, and what the default model used before
its forward ran quantized).

It exists so that a GGUF file (the default model is a Q4_1 GGUF shipped inside a PyPI wheel) can be
used with no model hub: ingot itself only ever reads HF directories.

Three things GGUF does differently from HF, undone here:
- Shapes: GGUF lists dims fastest-first (ne0 = row length), so a [576, 1536] GGUF tensor is the HF
  (1536, 576) weight. The reader's numpy view is already row-major (ne1, ne0) = HF (out, in).
- Q/K rows: llama.cpp's convert_hf_to_gguf.py permutes q_proj/k_proj rows per head from HF's
  rotate-half RoPE layout (first half / second half of a head) to its interleaved pair layout
  (qk_permute below); qk_unpermute is the inverse. qwen2 GGUFs are not permuted. A row of a block
  format is its own blocks, contiguous, so un-permuting the rows of the byte matrix is exact.
- Tokenizer: vocab, merges and token types are flat arrays plus a "pre" name standing for the
  pre-tokenizer regex; tokenizer_json rebuilds the normalizer / pre-tokenizer / decoder that the
  HF tokenizer.json of that family has.

Output is deterministic (sorted keys, fixed tensor order) and each file is replaced only when its
bytes change, so re-running is cheap for the build and does not touch timestamps.
"""

import argparse
import filecmp
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf.constants import GGMLQuantizationType, TokenType

from codegen.spec import SpecError, spec_from_config


class GGUFImportError(Exception):
    """A GGUF file this importer cannot turn into an HF directory; the message is one line."""


# Why f16 is the default: Q4_1 weights are d*q + m with fp16 scale d, fp16 min m and q in 0..15;
# Q8_0 (SmolLM2's embedding table) is d*q with fp16 d and int8 q. Those products need more bits
# than either 16-bit format holds, but fp16 keeps 11 significant bits to bf16's 8, and every value
# sits well inside fp16's range (|w| <= 9.25 here; fp16 is normal down to 6.1e-5 and subnormal
# steps of 6e-8 below). Measured on SmolLM2-135M-Instruct.Q4_1.gguf (106M Q4_1 + 28M Q8_0 values):
#   Q4_1: exact in fp16 68.3%, in bf16 25.4%; RMS error / RMS weight 1.9e-4 (fp16) vs 1.3e-3 (bf16)
#   Q8_0: exact in fp16 21.4%, in bf16  3.3%; RMS error / RMS weight 2.1e-4 (fp16) vs 1.4e-3 (bf16)
# so fp16 is ~7x closer to the dequantized values. bf16 stays available for engines that want it.
DTYPES = {"f16": ("F16", "float16"), "bf16": ("BF16", "bfloat16")}  # --dtype: (safetensors, torch)

# Block formats kept as they are (runtime/quant.h implements them); matrices in a dense GGUF type
# are converted to the dense dtype like the norms.
KEPT_TYPES = {GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1,
              GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q5_K, GGMLQuantizationType.Q6_K}
DENSE_TYPES = {GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16}

ARCHITECTURES = {
    # GGUF general.architecture: (HF architectures[0], HF model_type, Q/K rows permuted by llama.cpp)
    "llama": ("LlamaForCausalLM", "llama", True),
    "qwen2": ("Qwen2ForCausalLM", "qwen2", False),
}

# GGUF per-layer tensor name -> HF module under model.layers.N.
LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

# Pre-tokenizer regexes of the HF tokenizer.json files these GGUF "pre" names stand for.
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
BPE_PRE_TYPES = ("gpt2", "smollm", "llama-bpe", "qwen2")

SPM_SPACE = "\u2581"  # SentencePiece's visible space


# ------------------------------------------------------------------------------------------------
# Q/K row permutation

def qk_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: HF rotate-half rows -> GGUF interleaved rows.

    w is (n_head * head_dim, ...) (a weight (out, in) or a bias (out,)); within each head, row i of
    the first half and row i of the second half become rows 2i and 2i+1.
    """
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2)
            .reshape(w.shape))


def qk_unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of qk_permute: GGUF interleaved rows -> HF rotate-half rows."""
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2)
            .reshape(w.shape))


# ------------------------------------------------------------------------------------------------
# GGUF metadata

class Metadata:
    """Typed access to a GGUFReader's key/value fields; missing required keys fail by name."""

    def __init__(self, reader: gguf.GGUFReader, path: str):
        self.reader = reader
        self.path = path

    def has(self, key: str) -> bool:
        return key in self.reader.fields

    def get(self, key: str, default=None):
        f = self.reader.fields.get(key)
        return default if f is None else self._contents(key, f)

    def need(self, key: str):
        if key not in self.reader.fields:
            raise GGUFImportError(f"{self.path}: metadata key {key} missing")
        return self._contents(key, self.reader.fields[key])

    def _contents(self, key: str, field):
        try:
            return field.contents()
        except Exception as e:  # noqa: BLE001 - decoded lazily from untrusted bytes: bad UTF-8, a bad type id
            raise GGUFImportError(f"{self.path}: metadata key {key} unreadable ({type(e).__name__}: {one_line(e)})") from None


def f32_repr(x: float) -> float:
    """The shortest decimal that round-trips a float32 (GGUF stores 1e-5 as 9.99999974738e-06)."""
    return float(str(np.float32(x)))


# ------------------------------------------------------------------------------------------------
# config.json

def llama3_rope_scaling(factors: np.ndarray, head_dim: int, theta: float) -> dict:
    """Recover HF's llama3 rope_scaling from the rope_freqs.weight tensor llama.cpp computes from it.

    factors (head_dim/2,) are the per-frequency divisors; factor is their maximum, and the other
    three parameters are found among the values Meta's configs use by recomputing the tensor the way
    convert_hf_to_gguf.py does and comparing.
    """
    freqs = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    factor = float(factors.max())
    for old_ctx in (8192, 4096, 16384, 32768, 2048):
        for low in (1.0, 2.0, 0.5):
            for high in (4.0, 8.0, 2.0, 1.0):
                if high <= low:
                    continue
                wavelen = 2 * math.pi / freqs
                smooth = (old_ctx / wavelen - low) / (high - low)
                want = np.where(wavelen < old_ctx / high, 1.0,
                                np.where(wavelen > old_ctx / low, factor,
                                         1.0 / ((1 - smooth) / factor + smooth)))
                if np.allclose(want, factors, rtol=1e-4, atol=0):
                    return {"factor": factor, "high_freq_factor": high, "low_freq_factor": low,
                            "original_max_position_embeddings": old_ctx, "rope_type": "llama3"}
    raise GGUFImportError("rope_freqs.weight: does not match any llama3 rope_scaling "
                          "(factor, low/high_freq_factor, original_max_position_embeddings)")


def build_config(md: Metadata, tensors: dict, dtype: str) -> dict:
    """config.json without quantization_config (import_gguf adds it from the tensor plan)."""
    arch = md.need("general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFImportError(f"{md.path}: architecture {arch!r} unsupported "
                              f"(supported: {', '.join(sorted(ARCHITECTURES))})")
    hf_arch, model_type, _ = ARCHITECTURES[arch]
    if md.get(f"{arch}.expert_count", 0):
        raise GGUFImportError(f"{md.path}: {arch}.expert_count = {md.get(f'{arch}.expert_count')}: "
                              "mixture-of-experts models are unsupported")
    dim = int(md.need(f"{arch}.embedding_length"))
    n_heads = int(md.need(f"{arch}.attention.head_count"))
    n_kv_heads = int(md.get(f"{arch}.attention.head_count_kv", n_heads))
    head_dim = int(md.get(f"{arch}.attention.key_length", dim // n_heads))
    if int(md.get(f"{arch}.attention.value_length", head_dim)) != head_dim:
        raise GGUFImportError(f"{md.path}: {arch}.attention.value_length differs from key_length "
                              f"{head_dim}: unsupported")
    rot = int(md.get(f"{arch}.rope.dimension_count", head_dim))
    if rot != head_dim:
        raise GGUFImportError(f"{md.path}: {arch}.rope.dimension_count {rot} != head_dim "
                              f"{head_dim}: partial rotary embeddings are unsupported")
    theta = f32_repr(md.get(f"{arch}.rope.freq_base", 10000.0))
    vocab_size = int(tensors["token_embd.weight"].data.shape[0])
    ctx = int(md.need(f"{arch}.context_length"))

    rope_scaling = None
    scaling_type = md.get(f"{arch}.rope.scaling.type", "none")
    if scaling_type == "linear":
        rope_scaling = {"factor": f32_repr(md.need(f"{arch}.rope.scaling.factor")),
                        "rope_type": "linear"}
    elif scaling_type == "yarn":
        rope_scaling = {"factor": f32_repr(md.need(f"{arch}.rope.scaling.factor")),
                        "original_max_position_embeddings":
                            int(md.need(f"{arch}.rope.scaling.original_context_length")),
                        "rope_type": "yarn"}
    elif scaling_type != "none":
        raise GGUFImportError(f"{md.path}: {arch}.rope.scaling.type {scaling_type!r} unsupported")
    if "rope_freqs.weight" in tensors:
        if rope_scaling is not None:
            raise GGUFImportError(f"{md.path}: both rope_freqs.weight and "
                                  f"{arch}.rope.scaling.type {scaling_type!r}")
        factors = gguf.quants.dequantize(tensors["rope_freqs.weight"].data,
                                         tensors["rope_freqs.weight"].tensor_type)
        rope_scaling = llama3_rope_scaling(factors.astype(np.float64), head_dim, theta)

    cfg = {
        "architectures": [hf_arch],
        "attention_dropout": 0.0,
        "bos_token_id": md.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": md.get("tokenizer.ggml.eos_token_id"),
        "hidden_act": "silu",
        "hidden_size": dim,
        "initializer_range": 0.02,
        "intermediate_size": int(md.need(f"{arch}.feed_forward_length")),
        "max_position_embeddings": ctx,
        "model_type": model_type,
        "num_attention_heads": n_heads,
        "num_hidden_layers": int(md.need(f"{arch}.block_count")),
        "num_key_value_heads": n_kv_heads,
        "rms_norm_eps": f32_repr(md.need(f"{arch}.attention.layer_norm_rms_epsilon")),
        "rope_scaling": rope_scaling,
        "rope_theta": theta,
        "tie_word_embeddings": "output.weight" not in tensors,
        "torch_dtype": DTYPES[dtype][1],
        "use_cache": True,
        "vocab_size": vocab_size,
    }
    if md.has("tokenizer.ggml.padding_token_id"):
        cfg["pad_token_id"] = md.get("tokenizer.ggml.padding_token_id")
    if model_type == "llama":
        cfg.update(attention_bias=False, head_dim=head_dim, mlp_bias=False, pretraining_tp=1)
    else:  # qwen2: q/k/v biases are implied by the architecture; head_dim is dim / n_heads
        if head_dim * n_heads != dim:
            raise GGUFImportError(f"{md.path}: qwen2 with head_dim {head_dim} != "
                                  f"hidden_size / num_attention_heads: unsupported")
        cfg.update(max_window_layers=cfg["num_hidden_layers"], sliding_window=ctx,
                   use_sliding_window=False)
    return cfg


# ------------------------------------------------------------------------------------------------
# model.safetensors

def tensor_plan(md: Metadata, tensors: dict, cfg: dict, dequantize: bool = True) -> list:
    """[(hf_name, gguf_tensor, hf_shape, permute_heads or 0, kept)] in HF's sorted-name order;
    kept: the GGUF type's name when the matrix stays in its block format, else None (dense).

    Every GGUF tensor must map to an HF one (or be rope_freqs, folded into config.json) and every
    tensor the config implies must be present: anything else names the tensor and stops. Without
    dequantize, a matrix in a block format ingot does not run is refused, naming it.
    """
    arch = md.need("general.architecture")
    permuted = ARCHITECTURES[arch][2]
    n_layers = cfg["num_hidden_layers"]
    plan = []
    for name, t in tensors.items():
        if name == "rope_freqs.weight":
            continue
        if name in GLOBAL_TENSORS:
            hf = GLOBAL_TENSORS[name]
            heads = 0
        else:
            parts = name.split(".", 2)
            if (len(parts) != 3 or parts[0] != "blk" or not parts[1].isdigit()
                    or parts[2] not in LAYER_TENSORS or int(parts[1]) >= n_layers):
                raise GGUFImportError(f"{md.path}: tensor {name} has no Hugging Face {arch} "
                                      "counterpart: unsupported")
            if parts[2].endswith(".bias") and arch == "llama":
                raise GGUFImportError(f"{md.path}: tensor {name}: llama attention biases "
                                      "are unsupported")
            hf = f"model.layers.{parts[1]}.{LAYER_TENSORS[parts[2]]}"
            heads = 0
            if permuted and parts[2].startswith("attn_q."):
                heads = cfg["num_attention_heads"]
            elif permuted and parts[2].startswith("attn_k."):
                heads = cfg["num_key_value_heads"]
        if (t.tensor_type not in (GGMLQuantizationType.F32, GGMLQuantizationType.F16)
                and t.tensor_type not in gguf.quants._type_traits):
            raise GGUFImportError(f"{md.path}: tensor {name}: type {t.tensor_type.name} "
                                  "cannot be dequantized by gguf")
        shape = [int(d) for d in reversed(t.shape.tolist())]  # ne0 is the fastest dim
        kept = None
        if not dequantize and len(shape) == 2 and t.tensor_type not in DENSE_TYPES:
            if t.tensor_type not in KEPT_TYPES:
                raise GGUFImportError(f"{md.path}: tensor {name}: type {t.tensor_type.name} is not supported "
                                      f"(kept: {', '.join(sorted(k.name for k in KEPT_TYPES))}; "
                                      "--dequantize converts every tensor to f16)")
            kept = t.tensor_type.name
        plan.append((hf, t, shape, heads, kept))

    want = {"model.embed_tokens.weight", "model.norm.weight"}
    for layer in range(n_layers):
        for hf in LAYER_TENSORS.values():
            if not hf.endswith(".bias"):
                want.add(f"model.layers.{layer}.{hf}")
            elif arch == "qwen2":
                want.add(f"model.layers.{layer}.{hf}")
    missing = sorted(want - {p[0] for p in plan})
    if missing:
        raise GGUFImportError(f"{md.path}: tensor for {missing[0]} missing "
                              f"({len(missing)} missing in all)")
    plan.sort(key=lambda p: p[0])
    return plan


def quantization_config(plan: list) -> dict | None:
    """config.json's quantization_config for the matrices kept in their block format."""
    formats = {hf: kept for hf, _, _, _, kept in plan if kept}
    return {"formats": formats, "quant_method": "ingot"} if formats else None


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), round to nearest even; NaN stays NaN."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), rounded)


def tensor_bytes(t, shape: list, heads: int, dtype: str, kept: str | None = None) -> bytes:
    """A tensor's bytes as model.safetensors holds them: a kept block format's rows of blocks,
    as they lie in the GGUF ([rows, row_bytes] U8, Q/K rows un-permuted), else dense."""
    if kept:
        rows = np.asarray(t.data, dtype=np.uint8).reshape(shape[0], -1)
        return np.ascontiguousarray(qk_unpermute(rows, heads) if heads else rows).tobytes()
    w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
    if heads:
        w = qk_unpermute(w, heads)
    bad = ~np.isfinite(w) | (np.abs(w) > F16_MAX if dtype == "f16" else False)
    if bad.any():
        i = int(np.argmax(bad.ravel()))
        raise GGUFImportError(f"tensor {t.name}: value {w.ravel()[i]!r} at element {i} "
                              + ("is not finite" if not np.isfinite(w.ravel()[i]) else "does not fit f16 (--dtype bf16 holds it)"))
    if dtype == "f16":
        return np.ascontiguousarray(w.astype("<f2")).tobytes()
    return np.ascontiguousarray(f32_to_bf16(w).astype("<u2")).tobytes()


F16_MAX = 65504.0  # the largest finite fp16


def write_safetensors(path: Path, plan: list, dtype: str) -> None:
    """Streams the tensors of plan into a safetensors file, one dequantized tensor in memory at a
    time: header (u64 little-endian length, JSON padded with spaces to 8 bytes), then the data."""
    header = {"__metadata__": {"format": "pt"}}
    offset = 0
    for hf, t, shape, _, kept in plan:
        if kept:
            stored = [shape[0], int(t.n_bytes) // shape[0]]
            n = int(t.n_bytes)
        else:
            stored = shape
            n = 2 * math.prod(shape)
        header[hf] = {"dtype": "U8" if kept else DTYPES[dtype][0], "shape": stored, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for hf, t, shape, heads, kept in plan:
            f.write(tensor_bytes(t, shape, heads, dtype, kept))


# ------------------------------------------------------------------------------------------------
# tokenizer.json

def added_token(i: int, content: str, special: bool) -> dict:
    return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": special}


def byte_level(add_prefix_space: bool, trim_offsets: bool, use_regex: bool) -> dict:
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space,
            "trim_offsets": trim_offsets, "use_regex": use_regex}


def template_processing(tokens: list, bos: int | None, eos: int | None, add_bos: bool,
                        add_eos: bool) -> dict | None:
    """The post-processor that adds BOS / EOS around every encoded sequence, as HF's Llama files."""
    pre = [tokens[bos]] if add_bos and bos is not None else []
    post = [tokens[eos]] if add_eos and eos is not None else []
    if not pre and not post:
        return None

    def seq(type_id, ids):
        return ([{"SpecialToken": {"id": s, "type_id": type_id}} for s in pre]
                + [{"Sequence": {"id": ids, "type_id": type_id}}]
                + [{"SpecialToken": {"id": s, "type_id": type_id}} for s in post])

    special = {s: {"id": s, "ids": [tokens.index(s)], "tokens": [s]} for s in pre + post}
    return {"type": "TemplateProcessing", "single": seq(0, "A"), "pair": seq(0, "A") + seq(1, "B"),
            "special_tokens": special}


def bpe_model(vocab: dict, merges: list, *, unk: str | None, byte_fallback: bool,
              ignore_merges: bool, fuse_unk: bool) -> dict:
    return {"type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": fuse_unk, "byte_fallback": byte_fallback,
            "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges}


def spm_merges(tokens: list, scores: list) -> list:
    """BPE merges for a SentencePiece-BPE vocab, the way transformers' SentencePieceExtractor derives
    them: every split of a piece into two pieces of the vocab is a merge, ranked by the merged
    piece's score (highest first), ties by the lengths of the left then right part."""
    vocab = {t: i for i, t in enumerate(tokens)}
    by_score = sorted(range(len(tokens)), key=lambda i: -scores[i])  # stable: equal scores by id
    merges = []
    for i in by_score:
        piece = tokens[i]
        local = [(piece[:k], piece[k:], scores[i]) for k in range(1, len(piece))
                 if piece[:k] in vocab and piece[k:] in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [[left, right] for left, right, _ in merges]


def tokenizer_json(md: Metadata) -> dict:
    """Rebuilds the HF tokenizer.json that a GGUF's tokenizer.ggml.* metadata was converted from."""
    kind = md.need("tokenizer.ggml.model")
    tokens = list(md.need("tokenizer.ggml.tokens"))
    types = [int(t) for t in md.get("tokenizer.ggml.token_type", [TokenType.NORMAL] * len(tokens))]
    vocab = {}
    for i, t in enumerate(tokens):
        if t in vocab:
            raise GGUFImportError(f"{md.path}: tokenizer.ggml.tokens: {t!r} appears at ids "
                                  f"{vocab[t]} and {i}")
        vocab[t] = i
    bos = md.get("tokenizer.ggml.bos_token_id")
    eos = md.get("tokenizer.ggml.eos_token_id")
    added = [added_token(i, tokens[i], types[i] in (TokenType.CONTROL, TokenType.UNKNOWN))
             for i in range(len(tokens))
             if types[i] in (TokenType.CONTROL, TokenType.UNKNOWN, TokenType.USER_DEFINED)]
    out = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added}

    if kind == "gpt2":
        pre = md.get("tokenizer.ggml.pre", "gpt2")
        if pre not in BPE_PRE_TYPES:
            raise GGUFImportError(f"{md.path}: tokenizer.ggml.pre {pre!r} unsupported "
                                  f"(supported: {', '.join(BPE_PRE_TYPES)})")
        merges = []
        for m in md.need("tokenizer.ggml.merges"):
            pair = m.split(" ")
            if len(pair) != 2:
                raise GGUFImportError(f"{md.path}: tokenizer.ggml.merges: {m!r} is not 'left right'")
            merges.append(pair)
        add_bos = bool(md.get("tokenizer.ggml.add_bos_token", False))
        add_eos = bool(md.get("tokenizer.ggml.add_eos_token", False))
        if pre == "qwen2":
            out["normalizer"] = {"type": "NFC"}
            out["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": QWEN2_REGEX}, "behavior": "Isolated",
                 "invert": False},
                byte_level(False, False, False)]}
            post = byte_level(False, False, False)
            out["decoder"] = byte_level(False, False, False)
        else:
            out["normalizer"] = None
            if pre == "llama-bpe":
                out["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
                    {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX}, "behavior": "Isolated",
                     "invert": False},
                    byte_level(False, True, False)]}
            elif pre == "smollm":
                out["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
                    {"type": "Digits", "individual_digits": True},
                    byte_level(False, True, True)]}
            else:  # gpt2
                out["pre_tokenizer"] = byte_level(False, True, True)
            post = byte_level(True, False, True)
            out["decoder"] = byte_level(True, True, True)
        template = template_processing(tokens, bos, eos, add_bos, add_eos)
        out["post_processor"] = (post if template is None
                                 else {"type": "Sequence", "processors": [post, template]})
        out["model"] = bpe_model(vocab, merges, unk=None, byte_fallback=False,
                                 ignore_merges=(pre == "llama-bpe"), fuse_unk=False)
    elif kind == "llama":
        scores = [float(s) for s in md.need("tokenizer.ggml.scores")]
        unk_id = md.get("tokenizer.ggml.unknown_token_id", 0)
        add_bos = bool(md.get("tokenizer.ggml.add_bos_token", True))
        add_eos = bool(md.get("tokenizer.ggml.add_eos_token", False))
        replace = {"type": "Replace", "pattern": {"String": " "}, "content": SPM_SPACE}
        if md.get("tokenizer.ggml.add_space_prefix", True):
            out["normalizer"] = {"type": "Sequence", "normalizers": [
                {"type": "Prepend", "prepend": SPM_SPACE}, replace]}
            strip = [{"type": "Strip", "content": " ", "start": 1, "stop": 0}]
        else:
            out["normalizer"] = replace
            strip = []
        out["pre_tokenizer"] = None
        out["post_processor"] = template_processing(tokens, bos, eos, add_bos, add_eos)
        out["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": SPM_SPACE}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}] + strip}
        out["model"] = bpe_model(vocab, spm_merges(tokens, scores), unk=tokens[unk_id],
                                 byte_fallback=True, ignore_merges=False, fuse_unk=True)
    else:
        raise GGUFImportError(f"{md.path}: tokenizer.ggml.model {kind!r} unsupported "
                              "(supported: gpt2, llama)")
    return out


def token_name(md: Metadata, key: str) -> str | None:
    i = md.get(f"tokenizer.ggml.{key}_token_id")
    return None if i is None else md.need("tokenizer.ggml.tokens")[i]


def tokenizer_config_json(md: Metadata, tok: dict, cfg: dict) -> dict:
    kind = md.need("tokenizer.ggml.model")
    out = {
        "add_bos_token": bool(md.get("tokenizer.ggml.add_bos_token", kind == "llama")),
        "add_eos_token": bool(md.get("tokenizer.ggml.add_eos_token", False)),
        "added_tokens_decoder": {str(a["id"]): {k: a[k] for k in ("content", "lstrip", "normalized",
                                                                  "rstrip", "single_word", "special")}
                                 for a in tok["added_tokens"]},
        "bos_token": token_name(md, "bos"),
        "clean_up_tokenization_spaces": False,
        "eos_token": token_name(md, "eos"),
        "model_max_length": cfg["max_position_embeddings"],
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    if kind == "gpt2":
        out["add_prefix_space"] = False
    for key in ("pad", "unk"):
        if md.has(f"tokenizer.ggml.{key}_token_id"):
            out[f"{key}_token"] = token_name(md, key)
    if md.has("tokenizer.chat_template"):
        out["chat_template"] = md.get("tokenizer.chat_template")
    return out


def generation_config_json(md: Metadata) -> dict:
    """eos_token_id lists every id that ends generation: EOS plus llama.cpp's end-of-turn and
    end-of-message ids when the GGUF names them (Llama-3.1's <|eot_id|>, <|eom_id|>)."""
    stops = []
    for key in ("eos", "eot", "eom"):
        i = md.get(f"tokenizer.ggml.{key}_token_id")
        if i is not None and i not in stops:
            stops.append(int(i))
    out = {"bos_token_id": md.get("tokenizer.ggml.bos_token_id")}
    if stops:
        out["eos_token_id"] = stops[0] if len(stops) == 1 else stops
    if md.has("tokenizer.ggml.padding_token_id"):
        out["pad_token_id"] = md.get("tokenizer.ggml.padding_token_id")
    return out


# ------------------------------------------------------------------------------------------------
# The directory

def replace_if_changed(tmp: Path, dst: Path) -> bool:
    """Moves tmp over dst unless dst already has the same bytes; True when dst changed."""
    if dst.exists() and filecmp.cmp(tmp, dst, shallow=False):
        tmp.unlink()
        return False
    os.replace(tmp, dst)
    return True


def write_json(path: Path, obj: dict) -> bool:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n",
                   encoding="utf-8")
    return replace_if_changed(tmp, path)


def interpret(reader: gguf.GGUFReader, path: str, dtype: str, dequantize: bool):
    """(config, tensor plan, tokenizer.json, the JSON files by name) of a GGUF, checked: the config
    as codegen/spec.py would take it (refused naming the key), every tensor the shape the config
    gives, the tokenizer's arrays and ids consistent."""
    md = Metadata(reader, path)
    tensors = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in tensors:
        raise GGUFImportError(f"{path}: tensor token_embd.weight missing")
    cfg = build_config(md, tensors, dtype)
    plan = tensor_plan(md, tensors, cfg, dequantize)
    qc = quantization_config(plan)
    if qc:
        cfg["quantization_config"] = qc
    try:
        spec = spec_from_config(cfg, json.dumps(cfg).encode(), path, Path(path).stem)
    except SpecError as e:
        raise GGUFImportError(f"{path}: its metadata gives a config ingot refuses: {one_line(e)}") from None
    want = {t.name: list(t.shape) for t in spec.tensors}
    for hf, t, shape, _, kept in plan:
        if hf in want and shape != want[hf]:
            raise GGUFImportError(f"{path}: tensor {t.name}: shape {shape} (HF order), the metadata gives {want[hf]}")
        n = math.prod(shape)
        if t.data.size * t.data.itemsize != int(t.n_bytes) or int(t.n_elements) != n:
            raise GGUFImportError(f"{path}: tensor {t.name}: {int(t.n_elements)} elements in {int(t.n_bytes)} bytes, "
                                  f"its shape {shape} and type {t.tensor_type.name} disagree")
    tokens = md.need("tokenizer.ggml.tokens")
    if len(tokens) > cfg["vocab_size"]:
        raise GGUFImportError(f"{path}: {len(tokens)} tokens but token_embd.weight has {cfg['vocab_size']} rows")
    for key in ("scores", "token_type"):
        if md.has(f"tokenizer.ggml.{key}") and len(md.get(f"tokenizer.ggml.{key}")) != len(tokens):
            raise GGUFImportError(f"{path}: tokenizer.ggml.{key} has {len(md.get(f'tokenizer.ggml.{key}'))} entries, "
                                  f"tokenizer.ggml.tokens {len(tokens)}")
    for key in ("bos", "eos", "pad", "unk"):
        i = md.get(f"tokenizer.ggml.{key}_token_id")
        if i is not None and not (isinstance(i, int) and 0 <= i < len(tokens)):
            raise GGUFImportError(f"{path}: tokenizer.ggml.{key}_token_id = {i!r}, expected an id below {len(tokens)}")
    tok = tokenizer_json(md)
    files = {"config.json": cfg, "generation_config.json": generation_config_json(md),
             "tokenizer.json": tok, "tokenizer_config.json": tokenizer_config_json(md, tok, cfg)}
    return cfg, plan, tok, files


def one_line(e: Exception) -> str:
    """An exception's message on one line, at most 200 characters."""
    text = " ".join(str(e).split())
    return text if len(text) <= 200 else text[:200] + "..."


def import_gguf(gguf_path: str | Path, outdir: str | Path, dtype: str = "f16",
                weights: bool = True, dequantize: bool = False) -> list:
    """Writes the HF directory for gguf_path into outdir; returns the names of the files that
    changed. weights=False writes only the JSON files (config, tokenizer, generation).
    dequantize: every tensor in dtype, block formats inflated; else matrices keep theirs."""
    if dtype not in DTYPES:
        raise GGUFImportError(f"dtype {dtype!r} unsupported (supported: {', '.join(DTYPES)})")
    path = str(gguf_path)
    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # noqa: BLE001 - the gguf package's parser, on untrusted bytes, raises
        # whatever numpy or struct does when a count or length is wrong (IndexError, OverflowError,
        # KeyError, UnicodeDecodeError, ...): all mean the same to the user
        raise GGUFImportError(f"{path}: not a readable GGUF file ({type(e).__name__}: {one_line(e)})") from None
    try:
        cfg, plan, tok, files = interpret(reader, path, dtype, dequantize)
    except (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError, OverflowError, AttributeError) as e:
        # What the checks in interpret() do not name: values the gguf package read that do not fit
        # together (a count, a length or an id from untrusted bytes)
        raise GGUFImportError(f"{path}: inconsistent GGUF ({type(e).__name__}: {one_line(e)})") from None

    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    changed = []
    for name, obj in files.items():
        if write_json(out / name, obj):
            changed.append(name)
    if weights:
        tmp = out / "model.safetensors.tmp"
        try:
            write_safetensors(tmp, plan, dtype)
        except GGUFImportError as e:
            tmp.unlink(missing_ok=True)
            raise GGUFImportError(f"{path}: {e}") from None
        if replace_if_changed(tmp, out / "model.safetensors"):
            changed.append("model.safetensors")
    return changed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m codegen.gguf_import",
                                 description="Convert a llama-architecture GGUF into a Hugging "
                                             "Face model directory.")
    ap.add_argument("gguf", help="input .gguf file")
    ap.add_argument("outdir", help="output directory (created if missing)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="f16",
                    help="dtype of the dense tensors in model.safetensors (default f16)")
    ap.add_argument("--dequantize", action="store_true",
                    help="inflate every tensor to --dtype instead of keeping block formats")
    args = ap.parse_args(argv)
    try:
        changed = import_gguf(args.gguf, args.outdir, args.dtype, dequantize=args.dequantize)
    except GGUFImportError as e:
        print(f"gguf_import: {e}", file=sys.stderr)
        return 1
    print(f"gguf_import: {args.outdir}: " + (f"wrote {', '.join(changed)}" if changed
                                              else "up to date"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
