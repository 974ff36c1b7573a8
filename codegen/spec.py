"""HF config.json -> Spec: every dimension and variant flag a generated model needs.

The spec is the single place where raw Hugging Face keys are read and arithmetic on them is done;
templates only print its fields. A config the engine cannot run exactly is refused with a
SpecError naming the key and its value, never approximated.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from dataclasses import dataclass, replace
from pathlib import Path

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}

# torch_dtype -> (safetensors dtype, bytes per element)
WEIGHT_DTYPES = {"bfloat16": ("BF16", 2), "float16": ("F16", 2), "float32": ("F32", 4)}

# Weight formats, GGUF's names and ggml_type ids (runtime/quant.h): (id, weights per block, bytes per
# block). The dense ones are the safetensors dtypes; the block ones are what quantization_config's
# "formats" may name (/work/notes/quant_contract.md), stored as U8 rows of blocks.
FORMATS = {
    "F32": (0, 1, 4), "F16": (1, 1, 2), "BF16": (30, 1, 2),
    "Q4_0": (2, 32, 18), "Q4_1": (3, 32, 20), "Q8_0": (8, 32, 34),
    "Q4_K": (12, 256, 144), "Q5_K": (13, 256, 176), "Q6_K": (14, 256, 210),
}
QUANT_FORMATS = ("Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K", "Q8_0")  # sorted, as messages list them
# The format of a matrix field whose layers differ (llama.cpp's Q4_K_M: some layers' v_proj and
# down_proj in Q6_K, the others in Q4_K), and its id, runtime/quant.h's QUANT_MIXED: not a ggml_type.
MIXED, MIXED_ID = "MIXED", -1
# The spec fields that may be quantized, every matrix, with the HF tensors each holds. Norms and
# biases stay dense.
MATRIX_TENSORS = {
    "embed": "model.embed_tokens.weight",
    "wq": "model.layers.*.self_attn.q_proj.weight",
    "wk": "model.layers.*.self_attn.k_proj.weight",
    "wv": "model.layers.*.self_attn.v_proj.weight",
    "wo": "model.layers.*.self_attn.o_proj.weight",
    "w_gate": "model.layers.*.mlp.gate_proj.weight",
    "w_up": "model.layers.*.mlp.up_proj.weight",
    "w_down": "model.layers.*.mlp.down_proj.weight",
    "lm_head": "lm_head.weight",
}
MATRIX_FIELDS = tuple(MATRIX_TENSORS)
LAYER_MATRIX_FIELDS = MATRIX_FIELDS[1:-1]  # the matrices of every layer, which may differ in format by layer


def row_bytes(fmt: str, n: int) -> int:
    """Bytes of a row of n weights of format fmt (n a multiple of its block)."""
    _, block, nbytes = FORMATS[fmt]
    return n // block * nbytes


class SpecError(ValueError):
    """A config.json the generator refuses; the message names the key and value."""


@dataclass(frozen=True)
class Tensor:
    name: str  # HF tensor name, e.g. "model.layers.0.self_attn.q_proj.weight"
    shape: tuple[int, ...]
    field: str  # where the generated code keeps it: "embed", "wq", ... (per layer for layer >= 0)
    layer: int  # -1 for tensors outside the layer stack
    format: str  # a block format of FORMATS ("Q4_1") or the dense dtype ("BF16", "F16", "F32")

    @property
    def quantized(self) -> bool:
        return self.format in QUANT_FORMATS

    @property
    def stored_dtype(self) -> str:
        """The safetensors dtype of the stored tensor: U8 bytes for a block format."""
        return "U8" if self.quantized else self.format

    @property
    def stored_shape(self) -> tuple[int, ...]:
        """The stored shape: [rows, row_bytes] for a block format, the HF shape otherwise."""
        return (self.shape[0], row_bytes(self.format, self.shape[1])) if self.quantized else self.shape

    @property
    def nbytes(self) -> int:
        return math.prod(self.stored_shape) * (1 if self.quantized else FORMATS[self.format][2])


@dataclass(frozen=True)
class Spec:
    name: str  # short model name: the model directory's basename
    config_path: str  # as given to the generator (relative to the repo root when inside it)
    config_sha256: str
    architecture: str  # "LlamaForCausalLM", ...
    family: str  # "llama", "mistral", "qwen2"
    dim: int  # hidden_size
    hidden_dim: int  # intermediate_size
    n_layers: int  # num_hidden_layers
    n_heads: int  # num_attention_heads
    n_kv_heads: int  # num_key_value_heads
    head_dim: int  # head_dim, or hidden_size / num_attention_heads
    vocab_size: int  # vocab_size
    seq_len: int  # max_position_embeddings
    norm_eps: float  # rms_norm_eps
    rope_theta: float  # rope_theta
    rope_scaling: str  # "none", "linear" or "llama3"
    rope_inv_freq: tuple[float, ...]  # (head_dim / 2) per-pair frequencies, scaling applied
    qkv_bias: bool  # Qwen2 always; Llama's attention_bias
    o_bias: bool  # Llama's attention_bias also biases o_proj (LlamaAttention); Qwen2's o_proj has none
    tied_embeddings: bool  # tie_word_embeddings
    dtype: str  # safetensors dtype of every weight: "BF16", "F16", "F32"
    dtype_bytes: int
    bos_id: int  # bos_token_id, -1 if none
    eos_ids: tuple[int, ...]  # eos_token_id (int or list)
    # quantization_config's formats: (HF tensor name, TYPE) of each matrix in a block format, in
    # table order; the tensors absent are dense. Read them through Tensor.format, `layer_formats`
    # and `formats`.
    quant_formats: tuple[tuple[str, str], ...] = ()

    @property
    def layer_formats(self) -> dict[str, tuple[str, ...]]:
        """The formats of each matrix field's tensors, MATRIX_FIELDS' order: a layer field's one per
        layer, embed's and lm_head's one (lm_head's embed's when tied). A block format or the dense
        dtype."""
        out = {f: [] for f in MATRIX_FIELDS}
        for t in self.tensors:
            if t.field in out:
                out[t.field].append(t.format)
        if self.tied_embeddings:
            out["lm_head"] = out["embed"]
        return {f: tuple(v) for f, v in out.items()}

    @property
    def formats(self) -> dict[str, str]:
        """The format of each matrix field, MATRIX_FIELDS' order: the one its tensors share, or
        MIXED where its layers differ."""
        return {f: v[0] if len(set(v)) == 1 else MIXED for f, v in self.layer_formats.items()}

    @property
    def quantized(self) -> bool:
        """Whether any matrix is stored in a block format."""
        return bool(self.quant_formats)

    @property
    def format_constants(self) -> tuple[tuple[str, str, int, str, str], ...]:
        """One row per matrix field for model_config.h's MODEL_FORMAT_<NAME>: (NAME, field, format
        id, format name, the HF tensors it covers); a field whose layers differ has MIXED_ID."""
        fmt = self.formats
        return tuple((field.upper(), field, MIXED_ID if fmt[field] == MIXED else FORMATS[fmt[field]][0], fmt[field],
                      MATRIX_TENSORS[field] + (" (tied: model.embed_tokens.weight)"
                                               if field == "lm_head" and self.tied_embeddings else ""))
                     for field in MATRIX_FIELDS)

    @property
    def layer_format_constants(self) -> tuple[tuple[str, str, tuple[int, ...], tuple[str, ...]], ...]:
        """One row per layer field for model_config.h's MODEL_FORMAT_<NAME>_AT(l): (NAME, field,
        each layer's format id, each layer's format name) where its layers differ, else (NAME,
        field, (), ())."""
        layers, fmt = self.layer_formats, self.formats
        return tuple((field.upper(), field, tuple(FORMATS[f][0] for f in layers[field]), layers[field])
                     if fmt[field] == MIXED else (field.upper(), field, (), ()) for field in LAYER_MATRIX_FIELDS)

    @property
    def q_dim(self) -> int:
        """n_heads * head_dim: rows of q_proj (equals dim for most models, not all)."""
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """n_kv_heads * head_dim: rows of k_proj and v_proj."""
        return self.n_kv_heads * self.head_dim

    @property
    def kv_mul(self) -> int:
        """Query heads per KV head (GQA group size)."""
        return self.n_heads // self.n_kv_heads

    @property
    def tensors(self) -> tuple[Tensor, ...]:
        """Every tensor of the model in the order the generated tables list them."""
        fmt = dict(self.quant_formats)
        out = []

        def add(name, shape, field, layer):
            out.append(Tensor(name, shape, field, layer, fmt.get(name, self.dtype)))

        add("model.embed_tokens.weight", (self.vocab_size, self.dim), "embed", -1)
        for l in range(self.n_layers):
            p = f"model.layers.{l}."
            add(p + "input_layernorm.weight", (self.dim,), "attn_norm", l)
            add(p + "self_attn.q_proj.weight", (self.q_dim, self.dim), "wq", l)
            add(p + "self_attn.k_proj.weight", (self.kv_dim, self.dim), "wk", l)
            add(p + "self_attn.v_proj.weight", (self.kv_dim, self.dim), "wv", l)
            if self.qkv_bias:
                add(p + "self_attn.q_proj.bias", (self.q_dim,), "bq", l)
                add(p + "self_attn.k_proj.bias", (self.kv_dim,), "bk", l)
                add(p + "self_attn.v_proj.bias", (self.kv_dim,), "bv", l)
            add(p + "self_attn.o_proj.weight", (self.dim, self.q_dim), "wo", l)
            if self.o_bias:
                add(p + "self_attn.o_proj.bias", (self.dim,), "bo", l)
            add(p + "post_attention_layernorm.weight", (self.dim,), "ffn_norm", l)
            add(p + "mlp.gate_proj.weight", (self.hidden_dim, self.dim), "w_gate", l)
            add(p + "mlp.up_proj.weight", (self.hidden_dim, self.dim), "w_up", l)
            add(p + "mlp.down_proj.weight", (self.dim, self.hidden_dim), "w_down", l)
        add("model.norm.weight", (self.dim,), "final_norm", -1)
        if not self.tied_embeddings:
            add("lm_head.weight", (self.vocab_size, self.dim), "lm_head", -1)
        return tuple(out)

    @property
    def layer_fields(self) -> tuple[str, ...]:
        """The per-layer tensor fields, in table order."""
        return tuple(t.field for t in self.tensors if t.layer == 0)

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one decode step reads, as stored (a block format's scales included):
        all but the embedding table, of which it reads one row (and all of it when the LM head is
        tied to it)."""
        n = 0
        for t in self.tensors:
            if t.field != "embed":
                n += t.nbytes
            else:
                n += t.nbytes if self.tied_embeddings else t.nbytes // t.shape[0]
        return n

    @property
    def kv_bytes_per_pos(self) -> int:
        """Bytes of fp16 KV cache per position across layers: n_layers * 2 * kv_dim * 2."""
        return self.n_layers * 2 * self.kv_dim * 2


# The largest value each integer key may take: far above every real model (Llama-3.1-405B: hidden
# 16384, FFN 53248, 126 layers, 128 heads; vocabularies up to 262144; contexts up to 10M), low
# enough that every size derived from them fits 64 bits with room and that a hostile config is
# refused before anything is allocated. runtime/model_spec.c holds the same table.
LIMITS = {
    "hidden_size": 1 << 16,
    "intermediate_size": 1 << 18,
    "num_hidden_layers": 1 << 10,
    "num_attention_heads": 1 << 10,
    "num_key_value_heads": 1 << 10,
    "head_dim": 1 << 10,
    "vocab_size": 1 << 22,
    "max_position_embeddings": 1 << 24,
}
MAX_ID = 2**31 - 1  # token ids are C ints
REPR_MAX = 200  # characters of a value quoted in a message; longer ones end in "..."


def show(v) -> str:
    """A config value as messages quote it: repr(), as runtime/model_spec.c writes it too (integers
    beyond 2^53, which C reads as doubles, as the integer the double holds; long values cut at
    REPR_MAX)."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) > 2**53:
        try:
            v = int(float(v))
        except OverflowError:
            return "inf" if v > 0 else "-inf"
    r = repr(v)
    return r if len(r) <= REPR_MAX else r[:REPR_MAX] + "..."


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _float(v) -> float:
    """float(v), an integer too large for a double being infinite (as C's strtod reads it)."""
    try:
        return float(v)
    except OverflowError:
        return math.inf if v > 0 else -math.inf


def _get(cfg: dict, key: str, kind, default=None, required=True):
    if key not in cfg or cfg[key] is None:
        if default is not None or not required:
            return default
        raise SpecError(f"config.json: missing key '{key}'")
    v = cfg[key]
    if kind is int and not _is_int(v):
        raise SpecError(f"config.json: '{key}' = {show(v)}, expected an integer")
    if kind is float and not _is_number(v):
        raise SpecError(f"config.json: '{key}' = {show(v)}, expected a number")
    if kind is bool and not isinstance(v, bool):
        raise SpecError(f"config.json: '{key}' = {show(v)}, expected true or false")
    if kind in (int, float) and v <= 0:
        raise SpecError(f"config.json: '{key}' = {show(v)}, expected a positive value")
    if kind is float and not math.isfinite(_float(v)):
        raise SpecError(f"config.json: '{key}' = {show(v)}, expected a finite value")
    if kind is int and v > LIMITS.get(key, MAX_ID):
        raise SpecError(f"config.json: '{key}' = {show(v)}, expected at most {LIMITS.get(key, MAX_ID)}")
    return _float(v) if kind is float else kind(v)


def _positive(where: str, key: str, v) -> float:
    """A number of rope_scaling or rope_theta: finite and positive."""
    if not _is_number(v):
        raise SpecError(f"config.json: {where}'{key}' = {show(v)}, expected a number")
    if not (v > 0 and math.isfinite(_float(v))):
        raise SpecError(f"config.json: {where}'{key}' = {show(v)}, expected a positive finite value")
    return _float(v)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> tuple[str, tuple[float, ...]]:
    """Per-pair inverse frequencies theta^(-2i/d), with HF's rope scaling applied.

    Mirrors transformers' _compute_default_rope_parameters, _compute_linear_scaling_rope_parameters
    and _compute_llama3_parameters; computed in float64 and rounded once to float32 by the C
    literal, where HF computes in float32 (differences of one float32 ulp).
    """
    base = [1.0 / theta ** (2 * i / head_dim) for i in range(head_dim // 2)]
    kind = scaling.get("rope_type", scaling.get("type")) if scaling else None
    if not scaling or kind == "default":
        return "none", tuple(base)
    if kind == "linear":
        if "factor" not in scaling:
            raise SpecError("config.json: rope_scaling (linear) lacks 'factor'")
        factor = _positive("rope_scaling (linear): ", "factor", scaling["factor"])
        return "linear", tuple(f / factor for f in base)
    if kind == "llama3":
        values = {}
        for key in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            if key not in scaling:
                raise SpecError(f"config.json: rope_scaling (llama3) lacks '{key}'")
            values[key] = _positive("rope_scaling (llama3): ", key, scaling[key])
        factor, low, high, old_ctx = values.values()
        if high <= low:
            raise SpecError(
                f"config.json: rope_scaling (llama3): 'high_freq_factor' = {show(scaling['high_freq_factor'])} "
                f"must be greater than 'low_freq_factor' = {show(scaling['low_freq_factor'])}"
            )
        low_wavelen = old_ctx / low
        high_wavelen = old_ctx / high
        out = []
        for f in base:
            wavelen = 2 * math.pi / f
            if wavelen < high_wavelen:
                out.append(f)
            elif wavelen > low_wavelen:
                out.append(f / factor)
            else:
                smooth = (old_ctx / wavelen - low) / (high - low)
                out.append((1 - smooth) * f / factor + smooth * f)
        return "llama3", tuple(out)
    raise SpecError(f"config.json: rope_scaling type {show(kind)} is not supported (supported: default, linear, llama3)")


def _float32_finite(x: float) -> bool:
    """x stays finite when rounded to float32, as the kernels use it."""
    try:
        struct.pack("<f", x)
    except OverflowError:
        return False
    return math.isfinite(x)


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _no_duplicates(pairs):
    seen = {}
    for k, v in pairs:
        if k in seen:
            raise ValueError(f"duplicate key {k!r} in an object")
        seen[k] = v
    return seen


JSON_MAX_DEPTH = 128  # runtime/json.c: values nested deeper are refused


def _depth_ok(v, depth: int = 0) -> bool:
    if depth > JSON_MAX_DEPTH:
        return False
    children = v.values() if isinstance(v, dict) else v if isinstance(v, list) else ()
    return all(_depth_ok(c, depth + 1) for c in children)


def parse_json(raw: bytes):
    """JSON as the runtime's parser (runtime/json.c) reads it: UTF-8, no NaN or Infinity, no key
    twice in an object (parsers disagree on which value counts), nesting at most 128 deep.
    ValueError otherwise."""
    v = json.loads(raw.decode("utf-8"), parse_constant=_no_constant, object_pairs_hook=_no_duplicates)
    if not _depth_ok(v):
        raise ValueError(f"values nested more than {JSON_MAX_DEPTH} deep")
    return v


def load_spec(config_path: str | Path, name: str | None = None) -> Spec:
    """Reads an HF config.json and derives the spec, or raises SpecError naming the key."""
    path = Path(config_path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise SpecError(f"{path}: cannot read ({e.strerror})") from None
    try:
        cfg = parse_json(raw)
    except (ValueError, RecursionError) as e:
        raise SpecError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise SpecError(f"{path}: expected a JSON object")
    return spec_from_config(cfg, raw, str(path), name or path.parent.name)


def spec_from_config(cfg: dict, raw: bytes, config_path: str, name: str) -> Spec:
    archs = cfg.get("architectures") or []
    if (not isinstance(archs, list) or len(archs) != 1 or not isinstance(archs[0], str)
            or archs[0] not in SUPPORTED_ARCHITECTURES):
        raise SpecError(
            f"config.json: 'architectures' = {show(archs)}, expected one of {sorted(SUPPORTED_ARCHITECTURES)}"
        )
    arch = archs[0]
    family = SUPPORTED_ARCHITECTURES[arch]

    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise SpecError(f"config.json: 'hidden_act' = {show(act)}, only 'silu' is supported")
    if cfg.get("mlp_bias", False):
        raise SpecError("config.json: 'mlp_bias' = true is not supported")
    if family == "qwen2":
        qkv_bias = True
        if cfg.get("use_sliding_window", False):
            raise SpecError("config.json: 'use_sliding_window' = true is not supported")
    else:
        qkv_bias = _get(cfg, "attention_bias", bool, required=False) or False
    o_bias = qkv_bias and family != "qwen2"

    dim = _get(cfg, "hidden_size", int)
    n_heads = _get(cfg, "num_attention_heads", int)
    n_kv_heads = _get(cfg, "num_key_value_heads", int, default=n_heads)
    if n_heads % n_kv_heads:
        raise SpecError(
            f"config.json: 'num_attention_heads' = {n_heads} is not a multiple of 'num_key_value_heads' = {n_kv_heads}"
        )
    if "head_dim" in cfg and cfg["head_dim"] is not None:
        head_dim = _get(cfg, "head_dim", int)
    else:
        if dim % n_heads:
            raise SpecError(f"config.json: 'hidden_size' = {dim} is not a multiple of 'num_attention_heads' = {n_heads}")
        head_dim = dim // n_heads
    if head_dim % 2:
        raise SpecError(f"config.json: head dimension {head_dim} is odd; RoPE needs pairs")
    seq_len = _get(cfg, "max_position_embeddings", int)

    window = cfg.get("sliding_window")
    if family == "mistral" and window is not None and not _is_number(window):
        raise SpecError(f"config.json: 'sliding_window' = {show(window)}, expected a number or null")
    if family == "mistral" and window is not None and window < seq_len:
        raise SpecError(
            f"config.json: 'sliding_window' = {show(window)} is smaller than the context {seq_len}; sliding-window attention is not supported"
        )

    # transformers >= 4.56 may keep theta and scaling under "rope_parameters".
    rope_params = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    theta = rope_params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    if not _is_number(theta):
        raise SpecError(f"config.json: 'rope_theta' = {show(theta)}, expected a number")
    theta = _float(theta)
    if theta <= 0:
        raise SpecError(f"config.json: 'rope_theta' = {show(theta)}, expected a positive value")
    if not math.isfinite(theta):
        raise SpecError(f"config.json: 'rope_theta' = {show(theta)}, expected a finite value")
    scaling = cfg.get("rope_scaling") or (rope_params if rope_params.get("rope_type") not in (None, "default") else None)
    if scaling is not None and not isinstance(scaling, dict):
        raise SpecError(f"config.json: 'rope_scaling' = {show(scaling)}, expected an object or null")
    rope_kind, inv_freq = rope_inv_freq(head_dim, theta, scaling)
    if not all(_float32_finite(f) for f in inv_freq):
        raise SpecError(f"config.json: 'rope_theta' = {show(theta)} gives RoPE frequencies that are not finite")

    torch_dtype = cfg.get("torch_dtype", cfg.get("dtype", "bfloat16"))
    if not isinstance(torch_dtype, str) or torch_dtype not in WEIGHT_DTYPES:
        raise SpecError(f"config.json: 'torch_dtype' = {show(torch_dtype)}, expected one of {sorted(WEIGHT_DTYPES)}")
    dtype, dtype_bytes = WEIGHT_DTYPES[torch_dtype]

    eos = cfg.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
    if not all(_is_int(e) and 0 <= e <= MAX_ID for e in eos_ids):
        raise SpecError(f"config.json: 'eos_token_id' = {show(eos)}, expected an id or a list of ids")
    bos = cfg.get("bos_token_id")
    bos_id = bos if _is_int(bos) and 0 <= bos <= MAX_ID else -1

    vocab = _get(cfg, "vocab_size", int)
    hidden_dim = _get(cfg, "intermediate_size", int)
    n_layers = _get(cfg, "num_hidden_layers", int)
    norm_eps = _get(cfg, "rms_norm_eps", float, default=1e-6)
    tied = _get(cfg, "tie_word_embeddings", bool, required=False)
    tied = bool(tied) if tied is not None else False
    for e in eos_ids:
        if e >= vocab:
            raise SpecError(f"config.json: 'eos_token_id' {e} is outside the vocabulary ({vocab})")

    spec = Spec(
        name=name,
        config_path=config_path,
        config_sha256=hashlib.sha256(raw).hexdigest(),
        architecture=arch,
        family=family,
        dim=dim,
        hidden_dim=hidden_dim,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        vocab_size=vocab,
        seq_len=seq_len,
        norm_eps=norm_eps,
        rope_theta=theta,
        rope_scaling=rope_kind,
        rope_inv_freq=inv_freq,
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        tied_embeddings=tied,
        dtype=dtype,
        dtype_bytes=dtype_bytes,
        bos_id=bos_id,
        eos_ids=eos_ids,
    )
    return replace(spec, quant_formats=quantization(cfg, spec))


def quantization(cfg: dict, spec: Spec) -> tuple[tuple[str, str], ...]:
    """quantization_config (quant_contract.md): {"quant_method": "ingot", "formats": {"<HF tensor
    name>": "<TYPE>"}} -> ((HF tensor name, TYPE), ...) in table order. Checked entry by entry in
    the file's order (name, matrix, type, row length). Each tensor has its own format: the layers of
    a field may differ (the generated code reads each layer's)."""
    qc = cfg.get("quantization_config")
    if qc is None:
        return ()
    if not isinstance(qc, dict):
        raise SpecError(f"config.json: 'quantization_config' = {show(qc)}, expected an object or null")
    method = qc.get("quant_method")
    if method != "ingot":
        raise SpecError(f"config.json: quantization_config 'quant_method' = {show(method)}, expected 'ingot'")
    formats = qc.get("formats")
    if not isinstance(formats, dict):
        raise SpecError(f"config.json: quantization_config 'formats' = {show(formats)}, expected an object")
    tensors = {t.name: t for t in spec.tensors}
    where = "config.json: quantization_config 'formats': "
    for name, fmt in formats.items():
        t = tensors.get(name)
        if t is None:
            raise SpecError(f"{where}{show(name)} is not a tensor of this model")
        if t.field not in MATRIX_FIELDS:
            raise SpecError(f"{where}{show(name)} is not a matrix; only matrices may be quantized")
        if not isinstance(fmt, str) or fmt not in QUANT_FORMATS:
            raise SpecError(f"{where}{show(name)} = {show(fmt)}, expected one of {list(QUANT_FORMATS)}")
        block = FORMATS[fmt][1]
        if t.shape[1] % block:
            raise SpecError(f"{where}{name}: row length {t.shape[1]} is not a multiple of {fmt}'s block of {block}")
    return tuple((t.name, formats[t.name]) for t in spec.tensors if t.name in formats)
