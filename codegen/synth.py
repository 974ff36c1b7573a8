"""Random weights for a Llama-family Hugging Face config, written as safetensors.

    python -m codegen.synth MODEL_DIR [--dtype bf16|f16|f32] [--quant q8_0|q4_0|q4_1|q6_k|q4_k_m|q5_k_m] [--seed N] [--tokenizer PATH]

Reads MODEL_DIR/config.json and writes every tensor the HF model of that config has (the names,
shapes and optional biases of modeling_llama.py / modeling_mistral.py / modeling_qwen2.py) into
MODEL_DIR/model.safetensors, or, above MAX_SHARD_BYTES, into model-0000K-of-0000N.safetensors
shards plus model.safetensors.index.json, the way `save_pretrained` lays them out.

It exists so that every architecture variant can be built, run and compared against the NumPy
reference (tests/reference.py) and against transformers without downloading weights, at full 1B-8B
shapes as well as tiny ones. Two properties matter:

- Fast and memory-lean. The safetensors file is written by hand, tensor by tensor, chunk by chunk,
  so at most a few chunks per worker thread are ever in memory. Values come from a 16-bit uniform
  index into a 65536-entry table of exact standard-normal quantiles (scaled and cast to the target
  dtype once per tensor): one integer draw and one table lookup per element, several times faster
  than a ziggurat draw plus a float->bf16 cast, and indistinguishable from a normal sample at
  bf16/fp16 precision (8 or 11 mantissa bits; the table has 65536 levels, tails cut at 4.3 sigma).
  NumPy releases the GIL in both steps, so worker threads scale with cores.
- Deterministic. Chunk c of tensor `name` is drawn from default_rng([seed, crc32(name), c]); the
  output bytes depend on the seed and the config only, not on the thread count or on which other
  tensors exist.

Scales (activations stay O(1) through every layer, so logits are neither flat nor saturated):
linear weights and embeddings N(0, 1/fan_in) with fan_in the input width (hidden_size for the
embedding table, which doubles as the LM head when tied); at hidden_size 2048-4096 this is the
usual 0.02-ish initializer_range, at tiny widths it keeps q.k and logit spreads near 1 instead of
near 0.1. Norm weights 1 + N(0, 0.1^2). Biases N(0, 0.05^2).

Quantized models: a config whose quantization_config (codegen/spec.py) names a tensor's GGUF block
format gets that tensor as the format's blocks (dtype U8, shape [rows, row bytes]): the same values
drawn, then quantized as ggml's reference quantizers do: Q8_0, Q4_0 and Q4_1 here (Q8_0: d =
max|x| / 127; Q4_0: d = the signed value of largest magnitude / -8; Q4_1: d = (max - min) / 15,
m = min), the K formats (Q4_K, Q5_K, Q6_K) by codegen/kquants.py, which codegen/quantize.py
quantizes real weights with: ggml's bytes, scale search included (about 0.3 us a weight on a core:
an 8B Q4_K_M model takes minutes on a dozen threads). --quant TYPE first writes that
quantization_config into config.json, with the formats `codegen.quantize --type TYPE` would choose
(q8_0, q4_0, q4_1: the layers in TYPE, the embedding and an untied lm_head in Q8_0; q6_k all in
Q6_K; q4_k_m and q5_k_m llama.cpp's mix of those names, quantize.k_mix_formats, whose v_proj and down_proj
differ in format from layer to layer): the random quantized model of a shape.
"""

import argparse
import json
import os
import re
import shutil
import sys
import zlib
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist

import numpy as np

from codegen.kquants import quantize_k

MAX_SHARD_BYTES = 4 * 10**9  # decimal, like save_pretrained's max_shard_size="5GB"
CHUNK_ELEMS = 1 << 22        # elements per generated chunk (8 MiB of bf16)
NORM_STD = 0.1
BIAS_STD = 0.05

DTYPES = {
    # cli name: (safetensors dtype, bytes per element)
    "bf16": ("BF16", 2),
    "f16": ("F16", 2),
    "f32": ("F32", 4),
}
TORCH_DTYPES = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}
ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
WEIGHT_FILE_RE = re.compile(r"^model(-\d{5}-of-\d{5})?\.safetensors(\.index\.json)?$")


# GGUF block formats synth can write: (weights a block, bytes a block)
QUANT_BLOCKS = {"Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_1": (32, 20),
                "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210)}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple
    mean: float
    std: float
    format: str = ""  # a QUANT_BLOCKS key for a quantized tensor, else "" (the dtype)

    @property
    def numel(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    def nbytes(self, dtype):
        if self.format:
            block, size = QUANT_BLOCKS[self.format]
            return self.numel // block * size
        return self.numel * DTYPES[dtype][1]

    def stored_shape(self):
        """The shape in the file: a quantized matrix is [rows, row bytes] of U8."""
        if self.format:
            block, size = QUANT_BLOCKS[self.format]
            return [self.shape[0], self.shape[1] // block * size]
        return list(self.shape)


# --- the tensor list -------------------------------------------------------------------------

def tensor_specs(config):
    """Every tensor of the HF model for `config` (a dict), in state_dict order."""
    arch = (config.get("architectures") or ["LlamaForCausalLM"])[0]
    if arch not in ARCHITECTURES:
        raise ValueError(f"config.json: architectures[0] = {arch!r}, expected one of "
                         f"{', '.join(ARCHITECTURES)}")
    dim = config["hidden_size"]
    hidden = config["intermediate_size"]
    n_layers = config["num_hidden_layers"]
    n_heads = config["num_attention_heads"]
    n_kv_heads = config.get("num_key_value_heads") or n_heads
    head_dim = config.get("head_dim") or dim // n_heads
    vocab = config["vocab_size"]
    if arch == "Qwen2ForCausalLM":
        qkv_bias, o_bias, mlp_bias = True, False, False
    elif arch == "LlamaForCausalLM":
        # LlamaAttention: q/k/v/o_proj all take bias=config.attention_bias; LlamaMLP mlp_bias.
        qkv_bias = o_bias = bool(config.get("attention_bias", False))
        mlp_bias = bool(config.get("mlp_bias", False))
    else:
        qkv_bias = o_bias = mlp_bias = False

    def linear(name, n_out, n_in, bias):
        specs = [TensorSpec(f"{name}.weight", (n_out, n_in), 0.0, n_in ** -0.5)]
        if bias:
            specs.append(TensorSpec(f"{name}.bias", (n_out,), 0.0, BIAS_STD))
        return specs

    def norm(name):
        return [TensorSpec(f"{name}.weight", (dim,), 1.0, NORM_STD)]

    specs = [TensorSpec("model.embed_tokens.weight", (vocab, dim), 0.0, dim ** -0.5)]
    for l in range(n_layers):
        p = f"model.layers.{l}"
        specs += norm(f"{p}.input_layernorm")
        specs += linear(f"{p}.self_attn.q_proj", n_heads * head_dim, dim, qkv_bias)
        specs += linear(f"{p}.self_attn.k_proj", n_kv_heads * head_dim, dim, qkv_bias)
        specs += linear(f"{p}.self_attn.v_proj", n_kv_heads * head_dim, dim, qkv_bias)
        specs += linear(f"{p}.self_attn.o_proj", dim, n_heads * head_dim, o_bias)
        specs += norm(f"{p}.post_attention_layernorm")
        specs += linear(f"{p}.mlp.gate_proj", hidden, dim, mlp_bias)
        specs += linear(f"{p}.mlp.up_proj", hidden, dim, mlp_bias)
        specs += linear(f"{p}.mlp.down_proj", dim, hidden, mlp_bias)
    specs += norm("model.norm")
    if not config.get("tie_word_embeddings", False):
        specs += linear("lm_head", vocab, dim, False)
    formats = (config.get("quantization_config") or {}).get("formats") or {}
    for name, fmt in formats.items():
        if fmt not in QUANT_BLOCKS:
            raise ValueError(f"quantization_config: {name}: format {fmt!r}, synth writes {', '.join(QUANT_BLOCKS)}")
    out = []
    for s in specs:
        if s.name in formats:
            if len(s.shape) != 2 or s.shape[1] % QUANT_BLOCKS[formats[s.name]][0]:
                raise ValueError(f"quantization_config: {s.name} {s.shape} is not a matrix of whole blocks")
            s = TensorSpec(s.name, s.shape, s.mean, s.std, formats[s.name])
        out.append(s)
    return out


def quantize_blocks(x, fmt):
    """float32 values (a multiple of the block) -> the bytes of GGUF blocks of fmt: as ggml's
    reference quantizers compute them (quantize_row_q8_0_ref, _q4_0_ref, _q4_1_ref; the K formats
    codegen/kquants.py)."""
    if fmt in ("Q4_K", "Q5_K", "Q6_K"):
        return quantize_k(x.reshape(-1, 256), fmt).tobytes()
    b = x.reshape(-1, 32).astype(np.float32)
    n = len(b)
    if fmt == "Q8_0":
        d = np.abs(b).max(axis=1) / 127.0
        inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1.0), 0.0).astype(np.float32)
        q = np.round(b * inv[:, None]).astype(np.int8)
        out = np.empty((n, 34), np.uint8)
        out[:, :2] = d.astype(np.float16).view(np.uint8).reshape(n, 2)
        out[:, 2:] = q.view(np.uint8)
        return out.tobytes()
    if fmt == "Q4_0":
        idx = np.abs(b).argmax(axis=1)
        mx = b[np.arange(n), idx]
        d = mx / -8.0
        inv = np.where(d != 0, 1.0 / np.where(d != 0, d, 1.0), 0.0).astype(np.float32)
        q = np.minimum(15, np.trunc(b * inv[:, None] + 8.5)).astype(np.uint8)
        dh = d.astype(np.float16).view(np.uint8).reshape(n, 2)
        return np.concatenate([dh, q[:, :16] | (q[:, 16:] << 4)], axis=1).tobytes()
    lo, hi = b.min(axis=1), b.max(axis=1)  # Q4_1
    d = (hi - lo) / 15.0
    inv = np.where(d != 0, 1.0 / np.where(d != 0, d, 1.0), 0.0).astype(np.float32)
    q = np.minimum(15, np.trunc((b - lo[:, None]) * inv[:, None] + 0.5)).astype(np.uint8)
    dm = np.stack([d, lo], axis=1).astype(np.float16).view(np.uint8).reshape(n, 4)
    return np.concatenate([dm, q[:, :16] | (q[:, 16:] << 4)], axis=1).tobytes()


# --- values ----------------------------------------------------------------------------------

_QUANTILES = None


def normal_quantiles():
    """(65536,) float64: the standard normal at the midpoints of 65536 equal-probability bins."""
    global _QUANTILES
    if _QUANTILES is None:
        nd = NormalDist()
        _QUANTILES = np.array([nd.inv_cdf((i + 0.5) / 65536) for i in range(65536)])
    return _QUANTILES


def f32_to_bf16_bits(x):
    """float32 array -> uint16 bf16 bit patterns, round to nearest even (NaN not expected)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)


def value_table(spec, dtype):
    """(65536,) array of the raw element type for `dtype`: mean + std * quantile, cast (float32
    for a quantized tensor, which chunk_bytes quantizes)."""
    v = (spec.mean + spec.std * normal_quantiles()).astype(np.float32)
    if spec.format:
        return v
    if dtype == "bf16":
        return f32_to_bf16_bits(v)
    if dtype == "f16":
        return v.astype(np.float16).view(np.uint16)
    return v


def chunk_bytes(spec, table, seed, c):
    """Raw bytes of elements [c * CHUNK_ELEMS, ...) of tensor `spec` (a whole number of blocks of a
    quantized one: rows are whole blocks, and CHUNK_ELEMS is a multiple of 256)."""
    n = min(CHUNK_ELEMS, spec.numel - c * CHUNK_ELEMS)
    rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode()), c])
    idx = rng.integers(0, 1 << 32, (n + 1) // 2, dtype=np.uint32).view(np.uint16)[:n]
    if spec.format:
        return quantize_blocks(table[idx], spec.format)
    return table[idx].tobytes()


# --- the file format -------------------------------------------------------------------------

def plan_shards(specs, dtype, max_shard_bytes):
    """Split `specs` in order into lists whose data fits max_shard_bytes (a lone bigger tensor
    gets a shard of its own)."""
    shards, cur, cur_bytes = [], [], 0
    for s in specs:
        b = s.nbytes(dtype)
        if cur and cur_bytes + b > max_shard_bytes:
            shards.append(cur)
            cur, cur_bytes = [], 0
        cur.append(s)
        cur_bytes += b
    if cur:
        shards.append(cur)
    return shards


def safetensors_header(specs, dtype):
    """The 8-byte little-endian length followed by the JSON header, padded with spaces to a
    multiple of 8 so that the data (and with it every tensor) starts 8-byte aligned."""
    st_dtype = DTYPES[dtype][0]
    header = {"__metadata__": {"format": "pt"}}
    offset = 0
    for s in specs:
        end = offset + s.nbytes(dtype)
        header[s.name] = {"dtype": "U8" if s.format else st_dtype, "shape": s.stored_shape(), "data_offsets": [offset, end]}
        offset = end
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text


def write_shard(path, specs, dtype, seed, pool, depth):
    """Write one safetensors file; chunks are generated by `pool`, at most `depth` in flight."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(safetensors_header(specs, dtype))
        pending = deque()
        for s in specs:
            table = value_table(s, dtype)
            for c in range((s.numel + CHUNK_ELEMS - 1) // CHUNK_ELEMS):
                pending.append(pool.submit(chunk_bytes, s, table, seed, c))
                if len(pending) >= depth:
                    f.write(pending.popleft().result())
        while pending:
            f.write(pending.popleft().result())
    os.replace(tmp, path)


# --- entry points ----------------------------------------------------------------------------

def synthesize(model_dir, dtype=None, seed=0, tokenizer=None, max_shard_bytes=MAX_SHARD_BYTES,
               threads=None, quant=None):
    """Write random weights for model_dir/config.json into model_dir; return the written paths.
    quant (a `codegen.quantize --type`): first quantize the config with the formats
    codegen/quantize.py chooses for that type."""
    model_dir = Path(model_dir)
    if quant is not None:
        from codegen.quantize import TYPES, QuantizeError, plan  # plan needs no gguf (the GPU machine has none)
        if quant not in TYPES:
            raise ValueError(f"--quant {quant!r}, expected one of {', '.join(TYPES)}")
        try:
            _, formats = plan(model_dir, quant)
        except QuantizeError as e:
            raise ValueError(str(e)) from None
        config = json.loads((model_dir / "config.json").read_text())
        config["quantization_config"] = {"formats": dict(sorted(formats.items())), "quant_method": "ingot"}
        (model_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    config = json.loads((model_dir / "config.json").read_text())
    if dtype is None:
        dtype = TORCH_DTYPES.get(config.get("torch_dtype"), "bf16")
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}, expected one of {', '.join(DTYPES)}")
    specs = tensor_specs(config)
    shards = plan_shards(specs, dtype, max_shard_bytes)

    # Stale weights from an earlier run with another layout would shadow or confuse the new ones.
    for p in model_dir.iterdir():
        if WEIGHT_FILE_RE.match(p.name):
            p.unlink()

    threads = threads or os.cpu_count() or 1
    n = len(shards)
    names = (["model.safetensors"] if n == 1 else
             [f"model-{k + 1:05d}-of-{n:05d}.safetensors" for k in range(n)])
    written = []
    with ThreadPoolExecutor(threads) as pool:
        for name, shard in zip(names, shards):
            write_shard(model_dir / name, shard, dtype, seed, pool, 2 * threads)
            written.append(model_dir / name)
    if n > 1:
        index = {
            "metadata": {"total_size": sum(s.nbytes(dtype) for s in specs)},
            "weight_map": {s.name: name for name, shard in zip(names, shards) for s in shard},
        }
        path = model_dir / "model.safetensors.index.json"
        path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        written.append(path)

    if tokenizer is not None:
        tokenizer = Path(tokenizer)
        src_dir = tokenizer.parent if tokenizer.is_file() else tokenizer
        src = tokenizer if tokenizer.is_file() else tokenizer / "tokenizer.json"
        if not src.is_file():
            raise FileNotFoundError(f"--tokenizer: {src}: no such file")
        for s in (src, src_dir / "tokenizer_config.json"):
            if s.is_file() and s.resolve() != (model_dir / s.name).resolve():
                shutil.copyfile(s, model_dir / s.name)
                written.append(model_dir / s.name)
    return written


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m codegen.synth", description=__doc__.split("\n")[0])
    ap.add_argument("model_dir", help="directory holding config.json; weights are written there")
    ap.add_argument("--dtype", choices=sorted(DTYPES),
                    help="weight dtype (default: config torch_dtype, else bf16)")
    ap.add_argument("--quant", help="q8_0, q4_0, q4_1, q6_k, q4_k_m or q5_k_m: a quantized model (the config's "
                                    "quantization_config written first)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer", help="tokenizer.json (or a directory holding it) to copy in, "
                                        "with tokenizer_config.json from the same directory")
    ap.add_argument("--threads", type=int, help="worker threads (default: all cores)")
    args = ap.parse_args(argv)
    try:
        for p in synthesize(args.model_dir, args.dtype, args.seed, args.tokenizer,
                            threads=args.threads, quant=args.quant):
            print(p)
    except (OSError, ValueError, KeyError) as e:
        msg = f"missing config key {e}" if isinstance(e, KeyError) else str(e)
        print(f"synth: {args.model_dir}: {msg}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
