"""An independent NumPy forward pass for Llama-family Hugging Face models.

This is the slow twin of the whole engine: it follows transformers' modeling_llama.py,
modeling_mistral.py and modeling_qwen2.py line by line (embedding, RMSNorm, q/k/v projections
with optional bias, RoPE in the rotate_half layout with default / linear / llama3 frequency
scaling, grouped-query attention, causal softmax, o_proj, SwiGLU MLP, final norm, LM head or tied
embeddings) and shares no code with codegen/ or runtime/. The integrator checks it against
transformers on the GPU machine; tests/test_numerics.py checks the compiled binary against it.

Precision: weights are upcast to float64 and all arithmetic is float64 (pass dtype=np.float32 to
halve memory for models above ~1B). The weights on disk are bf16/fp16, which float64 (and
float32) hold exactly, so the reference computes the exact-arithmetic answer for those weights to
~1e-15; every difference from it that a test measures then belongs to the implementation under
test. float64 matmuls cost about 2x float32 in NumPy, which SmolLM2-135M (1.1 GB in float64)
still runs in seconds. RoPE angles are also float64, where transformers uses float32
inv_freq * position (a 1e-7 relative angle difference, ~3e-5 rad at position 256: far below any
tolerance used here).

API:
    model = load_model(model_dir)            # config.json + *.safetensors
    logits = model.forward(token_ids)        # (n_tokens, vocab), causal, positions 0..n-1
    ids = model.greedy(prompt_ids, n)        # the n greedily generated ids (prompt excluded)
    compare_logits(test, ref)                # max over positions of max|a-b| / max|b|
"""

import json
import math
from pathlib import Path

import numpy as np
import safetensors

ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
                 "Qwen2ForCausalLM": "qwen2"}


# --- weights ---------------------------------------------------------------------------------

def _decode(t, dtype, fmt=None):
    """One safetensors entry {dtype, shape, data} -> ndarray of `dtype`. A U8 entry is a quantized
    matrix of rows of blocks of format fmt (config.json's quantization_config), dequantized by the
    `gguf` package's NumPy dequantizer to float32 first: the reference of a quantized model is the
    dequantized model."""
    st = t["dtype"]
    if st == "U8":
        if fmt is None:
            raise ValueError("safetensors dtype U8 for a tensor config.json's quantization_config does not name")
        import gguf  # only quantized models need it
        rows = np.frombuffer(t["data"], dtype=np.uint8).reshape(t["shape"])
        return gguf.quants.dequantize(rows, gguf.GGMLQuantizationType[fmt]).astype(dtype)
    if st == "BF16":
        # bf16 is the top half of a float32: widen the bits, exact.
        bits = np.frombuffer(t["data"], dtype="<u2").astype(np.uint32) << 16
        a = bits.view(np.float32)
    elif st == "F16":
        a = np.frombuffer(t["data"], dtype="<f2")
    elif st == "F32":
        a = np.frombuffer(t["data"], dtype="<f4")
    else:
        raise ValueError(f"safetensors dtype {st}, expected BF16, F16, F32 or U8")
    return a.astype(dtype).reshape(t["shape"])


def load_tensors(model_dir, dtype=np.float64):
    """{name: ndarray} from model.safetensors or the shards named by model.safetensors.index.json.

    safetensors' numpy backend cannot return bf16, so files go through safetensors.deserialize
    (the package's own parser and validation) and the raw bytes are widened here."""
    model_dir = Path(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    formats = (config.get("quantization_config") or {}).get("formats", {})
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for name in files:
        for key, t in safetensors.deserialize((model_dir / name).read_bytes()):
            tensors[key] = _decode(t, dtype, formats.get(key))
    return tensors


# --- the pieces ------------------------------------------------------------------------------

def rope_inv_freq(config):
    """(head_dim/2,) float64 RoPE inverse frequencies, after config["rope_scaling"].

    Base: inv_freq[i] = 1 / theta^(2i / head_dim) (_compute_default_rope_parameters).
    "linear": inv_freq / factor. "llama3": _compute_llama3_parameters, reproduced below."""
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if config.get("partial_rotary_factor", 1.0) != 1.0:
        raise NotImplementedError("config.json: partial_rotary_factor != 1")
    theta = config.get("rope_theta", 10000.0)
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    scaling = config.get("rope_scaling")
    rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / scaling["factor"]
    if rope_type != "llama3":
        raise NotImplementedError(f"config.json: rope_scaling.rope_type {rope_type!r}")
    factor = scaling["factor"]
    low_freq_factor = scaling["low_freq_factor"]
    high_freq_factor = scaling["high_freq_factor"]
    old_context_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # wavelen < high_freq_wavelen: keep; wavelen > low_freq_wavelen: divide by factor
    inv_freq_llama = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    # in between: interpolate between the two by the smooth factor
    smooth_factor = ((old_context_len / wavelen - low_freq_factor)
                     / (high_freq_factor - low_freq_factor))
    smoothed = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(is_medium, smoothed, inv_freq_llama)


def rotate_half(x):
    """HF layout: the rotated pairs are (x[i], x[i + d/2]), not adjacent elements."""
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply_rope(x, positions, inv_freq):
    """x (n, heads, head_dim) at `positions` (n,) -> rotated x, same shape."""
    freqs = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]  # (n, d/2)
    emb = np.concatenate([freqs, freqs], axis=-1)[:, None, :]                    # (n, 1, d)
    return x * np.cos(emb).astype(x.dtype) + rotate_half(x) * np.sin(emb).astype(x.dtype)


def rmsnorm(x, weight, eps):
    """x (n, dim): x * rsqrt(mean(x^2) + eps) * weight."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def silu(x):
    # x * sigmoid(x) with sigmoid written through tanh: no overflow for large |x|
    return x * (0.5 * (1.0 + np.tanh(0.5 * x)))


def softmax(x):
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


# --- the model -------------------------------------------------------------------------------

class Model:
    """The transformer for one HF config and its tensors, in `dtype` arithmetic.

    kv_dtype (e.g. np.float16) rounds K and V through that type before they enter the cache, to
    emulate an implementation with a reduced-precision KV cache and measure what that alone costs.
    kv_dtype="q8" keeps the 8-bit cache of --kv-cache q8 instead (quantize_q8): integer vectors
    and a scale each, the key's scale applied to the score, the value's to the probability.
    x16=True rounds the input of every matrix stored in a block format as the engine's quantized
    products do (quantize_x16: 16-bit integers and a scale a block of 32), to measure what that
    alone costs or to take it out of a comparison.
    """

    def __init__(self, config, tensors, dtype=np.float64, kv_dtype=None, x16=False):
        arch = (config.get("architectures") or ["LlamaForCausalLM"])[0]
        if arch not in ARCHITECTURES:
            raise NotImplementedError(f"config.json: architectures {arch!r}")
        self.model_type = ARCHITECTURES[arch]
        if config.get("hidden_act", "silu") != "silu":
            raise NotImplementedError(f"config.json: hidden_act {config['hidden_act']!r}")
        if config.get("use_sliding_window"):
            raise NotImplementedError("config.json: use_sliding_window (Qwen2)")
        self.config = config
        self.dtype = dtype
        self.kv_dtype = kv_dtype
        self.dim = config["hidden_size"]
        self.n_layers = config["num_hidden_layers"]
        self.n_heads = config["num_attention_heads"]
        self.n_kv_heads = config.get("num_key_value_heads") or self.n_heads
        self.head_dim = config.get("head_dim") or self.dim // self.n_heads
        self.vocab = config["vocab_size"]
        self.eps = config["rms_norm_eps"]
        self.inv_freq = rope_inv_freq(config)
        # Mistral masks keys more than sliding_window - 1 positions back
        self.window = config.get("sliding_window") if self.model_type == "mistral" else None
        if self.model_type == "qwen2":
            qkv_bias, o_bias, mlp_bias = True, False, False
        elif self.model_type == "llama":
            qkv_bias = o_bias = bool(config.get("attention_bias", False))
            mlp_bias = bool(config.get("mlp_bias", False))
        else:
            qkv_bias = o_bias = mlp_bias = False

        def get(name, shape):
            if name not in tensors:
                raise KeyError(f"weights: {name}: missing")
            t = tensors[name]
            if tuple(t.shape) != tuple(shape):
                raise ValueError(f"weights: {name}: shape {list(t.shape)}, expected {list(shape)}")
            return t.astype(dtype, copy=False)

        formats = (config.get("quantization_config") or {}).get("formats", {})
        blocks = {n for n, f in formats.items() if f not in ("F32", "F16", "BF16")} if x16 else set()

        def linear(name, n_out, n_in, bias):
            w = get(f"{name}.weight", (n_out, n_in))
            b = get(f"{name}.bias", (n_out,)) if bias else None
            return (w, b, True) if f"{name}.weight" in blocks else (w, b)

        dim, hd = self.dim, self.head_dim
        hidden = config["intermediate_size"]
        self.embed = get("model.embed_tokens.weight", (self.vocab, dim))  # (vocab, dim)
        self.layers = []
        for l in range(self.n_layers):
            p = f"model.layers.{l}"
            self.layers.append({
                "ln1": get(f"{p}.input_layernorm.weight", (dim,)),
                "q": linear(f"{p}.self_attn.q_proj", self.n_heads * hd, dim, qkv_bias),
                "k": linear(f"{p}.self_attn.k_proj", self.n_kv_heads * hd, dim, qkv_bias),
                "v": linear(f"{p}.self_attn.v_proj", self.n_kv_heads * hd, dim, qkv_bias),
                "o": linear(f"{p}.self_attn.o_proj", dim, self.n_heads * hd, o_bias),
                "ln2": get(f"{p}.post_attention_layernorm.weight", (dim,)),
                "gate": linear(f"{p}.mlp.gate_proj", hidden, dim, mlp_bias),
                "up": linear(f"{p}.mlp.up_proj", hidden, dim, mlp_bias),
                "down": linear(f"{p}.mlp.down_proj", dim, hidden, mlp_bias),
            })
        self.norm = get("model.norm.weight", (dim,))
        if config.get("tie_word_embeddings", False):
            self.lm_head = self.embed
        else:
            self.lm_head = get("lm_head.weight", (self.vocab, dim))      # (vocab, dim)
        head = "model.embed_tokens.weight" if config.get("tie_word_embeddings", False) else "lm_head.weight"
        self.lm_head_x16 = head in blocks

    def new_cache(self):
        """Per layer [key_cache, value_cache, key_scale, value_scale], the caches (t, n_kv_heads,
        head_dim), the scales (t, n_kv_heads), t = 0. The scales are 1 except with kv_dtype="q8"."""
        empty = np.zeros((0, self.n_kv_heads, self.head_dim), dtype=self.dtype)
        no_scales = np.zeros((0, self.n_kv_heads), dtype=self.dtype)
        return [[empty, empty, no_scales, no_scales] for _ in range(self.n_layers)]

    def step(self, token_ids, cache):
        """Run token_ids at the positions that follow what `cache` holds; extend the cache.
        Returns logits (len(token_ids), vocab)."""
        token_ids = np.asarray(token_ids, dtype=np.int64)
        n = len(token_ids)
        pos0 = cache[0][0].shape[0]
        positions = np.arange(pos0, pos0 + n)
        H, KV, hd = self.n_heads, self.n_kv_heads, self.head_dim
        n_rep = H // KV

        # mask (n, t_total): query i at pos0+i sees keys at positions <= pos0+i
        key_pos = np.arange(pos0 + n)
        allowed = key_pos[None, :] <= positions[:, None]
        if self.window is not None:
            allowed &= positions[:, None] - key_pos[None, :] < self.window

        x = self.embed[token_ids]                                   # (n, dim)
        for l, L in enumerate(self.layers):
            xb = rmsnorm(x, L["ln1"], self.eps)
            q = _linear(xb, L["q"]).reshape(n, H, hd)
            k = _linear(xb, L["k"]).reshape(n, KV, hd)
            v = _linear(xb, L["v"]).reshape(n, KV, hd)
            q = apply_rope(q, positions, self.inv_freq)
            k = apply_rope(k, positions, self.inv_freq)
            k_scale = v_scale = np.ones((n, KV), dtype=self.dtype)
            if self.kv_dtype == "q8":
                k, k_scale = (a.astype(self.dtype) for a in quantize_q8(k))
                v, v_scale = (a.astype(self.dtype) for a in quantize_q8(v))
            elif self.kv_dtype is not None:
                k = k.astype(self.kv_dtype).astype(self.dtype)
                v = v.astype(self.kv_dtype).astype(self.dtype)
            key_cache = cache[l][0] = np.concatenate([cache[l][0], k])  # (t, KV, hd)
            value_cache = cache[l][1] = np.concatenate([cache[l][1], v])
            key_scale = cache[l][2] = np.concatenate([cache[l][2], k_scale])    # (t, KV)
            value_scale = cache[l][3] = np.concatenate([cache[l][3], v_scale])
            # repeat_kv: query head h reads kv head h // n_rep
            keys = np.repeat(key_cache, n_rep, axis=1).transpose(1, 2, 0)     # (H, hd, t)
            values = np.repeat(value_cache, n_rep, axis=1).transpose(1, 0, 2)  # (H, t, hd)
            k_scales = np.repeat(key_scale, n_rep, axis=1).T[:, None, :]      # (H, 1, t)
            v_scales = np.repeat(value_scale, n_rep, axis=1).T[:, None, :]
            att = (q.transpose(1, 0, 2) @ keys) * k_scales / math.sqrt(hd)   # (H, n, t)
            att = softmax(np.where(allowed[None], att, -np.inf))
            # the value's scale on the probability; a masked position's 0 stays 0 whatever its scale
            att = np.where(allowed[None], att * v_scales, 0.0)
            xb = (att @ values).transpose(1, 0, 2).reshape(n, H * hd)        # (n, H*hd)
            x = x + _linear(xb, L["o"])
            xb = rmsnorm(x, L["ln2"], self.eps)
            hb = silu(_linear(xb, L["gate"])) * _linear(xb, L["up"])          # (n, hidden)
            x = x + _linear(hb, L["down"])
        x = rmsnorm(x, self.norm, self.eps)
        return (quantize_x16(x) if self.lm_head_x16 else x) @ self.lm_head.T  # (n, vocab)

    def forward(self, token_ids):
        """logits (n, vocab) for token_ids at positions 0..n-1, causal."""
        return self.step(token_ids, self.new_cache())

    def greedy(self, prompt_ids, n):
        """The n ids that argmax decoding appends to prompt_ids (prompt not included; no stop
        on EOS). The prompt is prefilled at once, then one token per step on the KV cache."""
        cache = self.new_cache()
        logits = self.step(prompt_ids, cache)
        out = []
        for i in range(n):
            out.append(int(np.argmax(logits[-1])))
            if i + 1 < n:
                logits = self.step([out[-1]], cache)
        return out


def quantize_q8(x):
    """The 8-bit KV cache's quantizer (docs/architecture.md, "The KV cache"), vector by vector over the last axis:
    x (..., head_dim) as the float32 values an fp16 cache would round -> (q (..., head_dim) int8,
    d (...) float32) with x ~ d * q. In float32 throughout, as the engine computes it:
        m = max|x_i| (NaN if any x_i is NaN)
        m NaN or infinite: d = NaN, q = 0;  m < 2^-100 (0 too): d = 0, q = 0 (127 / m would overflow)
        else: id = 127 / m, d = m / 127, q_i = rint(x_i * id) (ties to even)"""
    x = np.asarray(x, dtype=np.float32)
    m = np.max(np.abs(x), axis=-1)  # NumPy's max returns NaN where any element is NaN
    tiny = m < np.float32(2.0**-100)
    ok = (m <= np.finfo(np.float32).max) & ~tiny
    m_ok = np.where(ok, m, np.float32(1.0)).astype(np.float32)
    inv = (np.float32(127.0) / m_ok)[..., None]
    with np.errstate(invalid="ignore"):
        q = np.where(ok[..., None], np.rint(x * inv), np.float32(0.0)).astype(np.int8)
    d = np.where(ok, m_ok / np.float32(127.0), np.where(tiny, np.float32(0.0), np.float32(np.nan)))
    return q, d.astype(np.float32)


def quantize_x16(x):
    """The block formats' input quantizer (runtime/quant.h), block by block of 32 over the last
    axis, returned as the values dx * x16 it stands for, in x's dtype:
        amax = max|x_i| (NaN if any x_i is NaN)
        amax NaN or infinite: dx = NaN, x16 = 0;  amax < 2^-100 (0 too): dx = 0, x16 = 0
        else: inv = 32767 / amax, dx = amax / 32767 (float32), x16_i = rint(x_i * inv), the exact
        product (float64) rounded half to even"""
    x32 = np.asarray(x, dtype=np.float32)
    xb = x32.reshape(*x32.shape[:-1], -1, 32)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        m = np.max(np.abs(xb), axis=-1)
        tiny = m < np.float32(2.0**-100)
        ok = (m <= np.finfo(np.float32).max) & ~tiny
        m_ok = np.where(ok, m, np.float32(1.0)).astype(np.float32)
        inv = (np.float32(32767.0) / m_ok).astype(np.float64)[..., None]
        q = np.where(ok[..., None], np.rint(xb.astype(np.float64) * inv), 0.0)
        d = np.where(ok, m_ok / np.float32(32767.0), np.where(tiny, np.float32(0.0), np.float32(np.nan))).astype(np.float32)
    return (q * d.astype(np.float64)[..., None]).reshape(x32.shape).astype(np.asarray(x).dtype)


def _linear(x, wb):
    w, b = wb[:2]
    if len(wb) == 3:  # a block format's matrix, its input as the engine quantizes it (Model's x16)
        x = quantize_x16(x)
    y = x @ w.T
    return y if b is None else y + b


def load_model(model_dir, dtype=np.float64, kv_dtype=None, x16=False):
    """Model for model_dir/config.json and its safetensors weights."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return Model(config, load_tensors(model_dir, dtype), dtype, kv_dtype, x16)


# --- comparing -------------------------------------------------------------------------------

TOL_FP32 = 1e-5             # fp32 activations and KV cache, vs the exact reference
TOL_FP16_KV = 5e-3          # fp16 KV cache, vs the exact reference
TOL_FP16_KV_EMULATED = 1e-3  # fp16 KV cache, vs the reference with kv_dtype=np.float16


def compare_logits(a, b):
    """max over positions of max_v |a - b| / max_v |b|, with b the reference (n, vocab).

    Normalising by the largest reference logit of the position, not element-wise, keeps logits
    near zero from blowing the ratio up; per position, so that a late position with small logits
    is not hidden behind an early one with large logits.

    Tolerance reasoning for the compiled binary against this reference: bf16/fp16 weights are
    exact in both, so the only differences are (1) fp32 arithmetic with a different accumulation
    order (relative ~1e-7 per op, growing slowly through dot products of length dim/hidden and
    the layers) and (2) an fp16 KV cache, which rounds every K and V to 11 significant bits
    (relative <= 2^-12 ~ 2.4e-4 per element) before attention; that error passes through the
    softmax and every later layer. Model(dtype=np.float32) reproduces (1) and
    Model(kv_dtype=np.float16) reproduces (2), so both were measured rather than guessed, over
    128 random tokens, 4 seeds, on the tiny models and a SmolLM2-135M-shaped synth model:
        fp32 arithmetic vs float64:                                    1.1e-6 .. 2.0e-6
        fp16 KV cache vs exact:                                        6.4e-4 .. 1.1e-3
        fp32 + fp16 KV vs float64 + fp16 KV (rounding flips only):     1.8e-5 .. 2.3e-4
    Hence TOL_FP32, TOL_FP16_KV and TOL_FP16_KV_EMULATED below: ~5x over the worst measured
    value. Real bugs land far above them: a missing bias in one layer 1e-3..1e-1, llama3 RoPE
    scaling ignored > 1e-2, a wrong GQA head mapping > 1e-2. Compare an fp16-KV binary against
    load_model(..., kv_dtype=np.float16), where the tolerance is tightest.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"logits shape {a.shape}, expected {b.shape}")
    b2 = b.reshape(-1, b.shape[-1])
    err = np.max(np.abs(a.reshape(b2.shape) - b2), axis=-1) / np.max(np.abs(b2), axis=-1)
    return float(np.max(err))
