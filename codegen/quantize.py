"""Build-time quantization: a bf16/fp16/fp32 model directory -> the same model with its matrices in
a GGUF block format.

    python -m codegen.quantize SRC_DIR OUT_DIR --type q8_0|q4_0|q4_1|q6_k|q4_k_m|q5_k_m

q8_0, q4_0, q4_1: the seven matrices of every layer (q, k, v, o, gate, up, down) are quantized to
TYPE; the embedding table and an untied lm_head to Q8_0 whatever TYPE is. Those two are the
model's input and output: every token's logits go through lm_head, and a tied table is the
lm_head. llama.cpp keeps its output layer at higher precision than the layers for the same reason.
q6_k: every one of those matrices in Q6_K, the embedding and lm_head too (llama.cpp's Q6_K).
q4_k_m, q5_k_m: llama.cpp's mixes of those names (k_mix_formats below: the layers in
Q4_K or Q5_K, v_proj and down_proj of some layers and the output in Q6_K). Norms and biases are
copied as they are.

The bytes are ggml's reference quantizers' (what llama-quantize writes without an importance
matrix): gguf.quants.quantize for Q8_0, Q4_0 and Q4_1 (quantize_row_q8_0_ref and friends;
tests/test_quantize.py checks it against a transcription of them), codegen/kquants.py for Q4_K,
Q5_K and Q6_K (quantize_row_q4_K_ref and friends; checked against ggml's own output). Output:
model.safetensors (quantized matrices as U8 [rows, row_bytes], the layout of
/work/notes/quant_contract.md), config.json (the source's, torch_dtype unchanged, plus
quantization_config) and the tokenizer and generation files copied. Deterministic, and each file is
replaced only when its bytes change, as codegen.gguf_import does.

Refused, naming the thing: a source that is already quantized (quantization_config), a matrix
whose row length does not divide into its format's blocks (32 weights; the K formats' super-blocks
256), a source tensor missing or of another dtype or shape than config.json says. llama.cpp gives
such a matrix another format (Q5_0 for Q4_K, Q5_1 for Q5_K, Q8_0 for Q6_K); the engine has no
Q5_0 or Q5_1, so here it is refused.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np

from .kquants import BLOCK_BYTES as K_FORMATS, quantize_k
from .spec import FORMATS, SpecError, load_spec

# --type's mixes of K formats, llama.cpp's names: the format of the layers that get no more bits
K_MIXES = {"q4_k_m": "Q4_K", "q5_k_m": "Q5_K"}
K_BLOCK = 256  # weights a K super-block

# --type: the layers' format (for a mix, its base format). The embedding and an untied lm_head are
# Q8_0 below Q6_K; q6_k puts them in Q6_K, the mixes as k_mix_formats says.
TYPES = {"q8_0": "Q8_0", "q4_0": "Q4_0", "q4_1": "Q4_1", "q6_k": "Q6_K", **K_MIXES}
EDGE_TYPE = "Q8_0"
LAYER_FIELDS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
# Files of a model directory that describe the tokenizer, the chat and generation: copied.
COPIED = ("generation_config.json", "special_tokens_map.json", "tokenizer.json", "tokenizer.model",
          "tokenizer_config.json", "vocab.json", "merges.txt")
WEIGHTS_PER_CHUNK = 1 << 20  # weights quantized at a time: bounds the float32 copy of a large matrix


class QuantizeError(Exception):
    """A source this quantizer refuses; the message is one line and names the thing."""


def use_more_bits(layer, n_layers):
    """llama.cpp's use_more_bits (llama-quant.cpp): the first and last eighth of the layers and
    every third one between them."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def k_mix_formats(spec, base):
    """{tensor name: format} of llama.cpp's Q4_K_M (base Q4_K) or Q5_K_M (base Q5_K) for a dense
    model (llama_tensor_get_type without its rules for 70B, mixture-of-experts and other
    architectures): v_proj and down_proj in Q6_K in the use_more_bits layers, every other layer
    matrix in base; the output (lm_head, or the embedding table when tied, which is then the
    output) in Q6_K; an untied embedding table in base. ValueError naming a matrix whose rows do
    not divide into blocks of 256."""
    more = {"wv", "w_down"}
    formats = {}
    for t in spec.tensors:
        if t.field in ("embed", "lm_head"):
            fmt = "Q6_K" if t.field == "lm_head" or spec.tied_embeddings else base
        elif t.field in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"):
            fmt = "Q6_K" if t.field in more and use_more_bits(t.layer, spec.n_layers) else base
        else:
            continue
        if t.shape[1] % K_BLOCK:
            raise ValueError(f"{t.name}: row length {t.shape[1]} is not a multiple of {fmt}'s block of 256")
        formats[t.name] = fmt
    return formats


def source_tensors(src: Path) -> dict:
    """{name: (file, dtype, shape, begin, end)} of model.safetensors or of the shards that
    model.safetensors.index.json names; begin/end are absolute byte offsets in the file."""
    index = src / "model.safetensors.index.json"
    files = (sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists()
             else ["model.safetensors"])
    out = {}
    for name in files:
        path = src / name
        try:
            with open(path, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(n))
        except (OSError, ValueError) as e:
            raise QuantizeError(f"{path}: not a readable safetensors file ({e})") from None
        for k, v in header.items():
            if k != "__metadata__":
                out[k] = (path, v["dtype"], list(v["shape"]), 8 + n + v["data_offsets"][0], 8 + n + v["data_offsets"][1])
    return out


def to_f32(raw: np.ndarray, dtype: str) -> np.ndarray:
    """Little-endian BF16/F16/F32 bytes -> float32, exactly."""
    if dtype == "BF16":
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    return raw.view("<f2" if dtype == "F16" else "<f4").astype(np.float32)


def quantize_rows(raw: np.ndarray, dtype: str, shape: list, fmt: str) -> bytes:
    """A dense matrix's bytes -> its rows in block format fmt, a chunk of rows at a time."""
    import gguf  # here, not at the top: plan() (synth --quant) runs where gguf is not installed
    from gguf.constants import GGMLQuantizationType
    rows, cols = shape
    x = raw.reshape(rows, -1)
    step = max(1, WEIGHTS_PER_CHUNK // cols)
    parts = []
    for r in range(0, rows, step):
        w = to_f32(np.ascontiguousarray(x[r:r + step]).reshape(-1), dtype).reshape(-1, cols)
        q = quantize_k(w, fmt) if fmt in K_FORMATS else gguf.quants.quantize(w, GGMLQuantizationType[fmt])
        parts.append(np.ascontiguousarray(q).tobytes())
    return b"".join(parts)


def plan(src: Path, qtype: str):
    """(spec of the source, {tensor name: format} to quantize) for --type qtype, or QuantizeError."""
    try:
        spec = load_spec(src / "config.json", name=src.resolve().name)
    except SpecError as e:
        raise QuantizeError(str(e).replace("config.json", str(src / "config.json"), 1)) from None
    if spec.quantized:
        raise QuantizeError(f"{src / 'config.json'}: already quantized (quantization_config); "
                            "quantize from the bf16/fp16 model")
    if qtype in K_MIXES:
        try:
            return spec, k_mix_formats(spec, K_MIXES[qtype])
        except ValueError as e:  # a row that is not whole super-blocks, named
            raise QuantizeError(f"{src}: {e}") from None
    layer = TYPES[qtype]
    edge = layer if layer == "Q6_K" else EDGE_TYPE
    formats = {}
    for t in spec.tensors:
        fmt = layer if t.field in LAYER_FIELDS else edge if t.field in ("embed", "lm_head") else None
        if fmt is None:
            continue
        block = FORMATS[fmt][1]
        if t.shape[1] % block:
            raise QuantizeError(f"{src}: {t.name}: row length {t.shape[1]} is not a multiple of {fmt}'s "
                                f"block of {block}")
        formats[t.name] = fmt
    return spec, formats


def quantize(src: str | Path, out: str | Path, qtype: str) -> list:
    """Writes the quantized model of src into out; returns the names of the files that changed."""
    from .gguf_import import replace_if_changed, write_json  # gguf_import imports gguf
    if qtype not in TYPES:
        raise QuantizeError(f"type {qtype!r} unsupported (supported: {', '.join(TYPES)})")
    src, out = Path(src), Path(out)
    spec, formats = plan(src, qtype)
    have = source_tensors(src)
    entries = []  # (name, stored dtype, stored shape, nbytes, source entry, format or None)
    for t in spec.tensors:
        if t.name not in have:
            raise QuantizeError(f"{src}: tensor {t.name} missing")
        path, dtype, shape, begin, end = have[t.name]
        if dtype != spec.dtype or tuple(shape) != t.shape:
            raise QuantizeError(f"{src}: {t.name}: dtype {dtype} shape {shape}, expected {spec.dtype} {list(t.shape)} "
                                "(config.json's torch_dtype and dimensions)")
        if end - begin != math.prod(shape) * spec.dtype_bytes:
            raise QuantizeError(f"{src}: {t.name}: {end - begin} bytes, expected {math.prod(shape) * spec.dtype_bytes}")
        fmt = formats.get(t.name)
        if fmt:
            _, block, nbytes = FORMATS[fmt]
            stored = [shape[0], shape[1] // block * nbytes]
            entries.append((t.name, "U8", stored, stored[0] * stored[1], have[t.name], fmt))
        else:
            entries.append((t.name, dtype, shape, end - begin, have[t.name], None))

    out.mkdir(parents=True, exist_ok=True)
    changed = []
    header = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape, n, _, _ in sorted(entries):
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    tmp = out / "model.safetensors.tmp"
    maps = {}
    with open(tmp, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for name, _, _, n, (path, dtype, shape, begin, end), fmt in sorted(entries):
            if path not in maps:
                maps[path] = np.memmap(path, dtype=np.uint8, mode="r")
            data = maps[path][begin:end]
            f.write(quantize_rows(data, dtype, shape, fmt) if fmt else data.tobytes())
    if replace_if_changed(tmp, out / "model.safetensors"):
        changed.append("model.safetensors")
    for stale in ("model.safetensors.index.json",):  # a sharded source's index would name absent files
        if (out / stale).exists():
            (out / stale).unlink()
            changed.append(stale)

    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = {"formats": dict(sorted(formats.items())), "quant_method": "ingot"}
    if write_json(out / "config.json", cfg):
        changed.append("config.json")
    for name in COPIED:
        if (src / name).exists():
            tmp = out / (name + ".tmp")
            shutil.copyfile(src / name, tmp)
            if replace_if_changed(tmp, out / name):
                changed.append(name)
    return changed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m codegen.quantize",
                                 description="Quantize a bf16/fp16/fp32 model directory's matrices to a GGUF block format.")
    ap.add_argument("src", help="the model directory (config.json, safetensors, tokenizer files)")
    ap.add_argument("out", help="output directory (created if missing)")
    ap.add_argument("--type", required=True, choices=sorted(TYPES),
                    help="the layers' format, or llama.cpp's mix (q4_k_m, q5_k_m); the embedding and an untied "
                         "lm_head are q8_0 below q6_k")
    args = ap.parse_args(argv)
    try:
        changed = quantize(args.src, args.out, args.type)
    except (QuantizeError, OSError) as e:
        print(f"quantize: {e}", file=sys.stderr)
        return 1
    print(f"quantize: {args.out}: " + (f"wrote {', '.join(changed)}" if changed else "up to date"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
