"""What the GPU prompt path's input terms cost in precision, GEMM by GEMM, in NumPy (no GPU).

The prompt's GEMMs take each fp32 input as PREFILL_TERMS values of the weights' 16-bit type that
sum to it (runtime/cuda_gemm.cuh): one (the default, D120) rounds it to the type, as llama.cpp's
and transformers' bf16 GEMMs do; two kept 16 bits of it. This emulates that on tests/reference.py's float64
model: the first FED tokens go through at once with the inputs of the chosen projections rounded
so (their keys and values enter the cache so), the rest of the text token by token exactly; the
error is compare_logits over the logits from position FED - 1 on (the first is the last prompt
token's, from the batch) against the exact model, and "argmax" counts the positions whose greedy
token differs. The decode steps are exact here (the GPU's are fp32 against the CPU's).

    python3 tests/bench/prefill_terms.py MODEL_DIR [--fed 140] [--tokens 200] [--terms-dtype bfloat16]

MODEL_DIR: a model directory with config.json, safetensors weights and tokenizer.json (the default
model's, or a tiny one's).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import reference  # noqa: E402

TEXT = ("The history of computing is a story of machines that read and write memory. Every step of a language "
        "model's decoding reads all of its weights once, so the speed of one stream is set by memory bandwidth. "
        "A prompt, by contrast, goes through in batches: each weight row is read once for many tokens, and the "
        "tensor cores multiply them. ")

# the projections whose inputs each variant rounds to one term (the others keep two)
VARIANTS = {
    "two terms": (),
    "one term (the default)": ("q", "k", "v", "o", "gate", "up", "down"),
    "one term: QKV": ("q", "k", "v"),
    "one term: o_proj": ("o",),
    "one term: gate/up": ("gate", "up"),
    "one term: down": ("down",),
    "one term: gate/up, down": ("gate", "up", "down"),
    "one term but down": ("q", "k", "v", "o", "gate", "up"),
}


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """x rounded to the nearest bf16 or fp16 value (ties to even), as float64"""
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float64)
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return bits.view(np.float32).astype(np.float64)


def terms(x: np.ndarray, n: int, dtype: str) -> np.ndarray:
    """the sum of x's n terms: each the rounding of what the ones before it left"""
    total = np.zeros_like(x)
    for _ in range(n):
        total = total + round_to(x - total, dtype)
    return total


def weight_dtype(model_dir: Path) -> str:
    """the 16-bit type the GPU's terms take: the weights' (config torch_dtype)"""
    dtype = json.loads((model_dir / "config.json").read_text()).get("torch_dtype", "bfloat16")
    return "float16" if dtype == "float16" else "bfloat16"


def measure(model: reference.Model, ids: list[int], fed: int, one_term: tuple[str, ...], dtype: str,
            largest: dict[str, float] | None = None) -> np.ndarray:
    """logits (len(ids) - fed + 1, vocab) from position fed - 1 on, the first fed tokens' projection
    inputs in terms; with largest, each projection's largest |input| over them (before the terms)"""
    names = {}
    for layer in model.layers:
        for name in ("q", "k", "v", "o", "gate", "up", "down"):
            names[id(layer[name][0])] = name
    exact = reference._linear
    active = [True]

    def linear(x, wb):
        if active[0]:
            name = names.get(id(wb[0]))
            if largest is not None:
                largest[name] = max(largest.get(name, 0.0), float(np.abs(x).max()))
            x = terms(x, 1 if name in one_term else 2, dtype)
        return exact(x, wb)

    reference._linear = linear
    try:
        cache = model.new_cache()
        first = model.step(ids[:fed], cache)[-1:]
        active[0] = False
        rest = model.step(ids[fed:], cache) if len(ids) > fed else first[:0]
    finally:
        reference._linear = exact
    return np.concatenate([first, rest])


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model_dir", type=Path)
    p.add_argument("--fed", type=int, default=140, help="prompt tokens fed at once (default 140)")
    p.add_argument("--tokens", type=int, default=200, help="tokens of the text in all (default 200)")
    p.add_argument("--terms-dtype", choices=("bfloat16", "float16"), help="the terms' type (default: the weights')")
    a = p.parse_args(argv[1:])
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(a.model_dir / "tokenizer.json")).encode(TEXT * 8).ids[:a.tokens]
    if not 1 <= a.fed <= len(ids):
        print(f"prefill_terms: --fed {a.fed}: the text is {len(ids)} tokens", file=sys.stderr)
        return 1
    model = reference.load_model(a.model_dir)
    dtype = a.terms_dtype or weight_dtype(a.model_dir)
    exact = model.forward(ids)[a.fed - 1:]
    print(f"{a.model_dir.name}: {a.fed} of {len(ids)} tokens fed at once, terms of {dtype}; logits from position {a.fed - 1}")
    print("| inputs | error (compare_logits) | argmax differs |")
    print("|---|---|---|")
    largest: dict[str, float] = {}
    for label, one_term in VARIANTS.items():
        got = measure(model, ids, a.fed, one_term, dtype, largest if not one_term else None)
        differs = int((got.argmax(-1) != exact.argmax(-1)).sum())
        print(f"| {label} | {reference.compare_logits(got, exact):.2e} | {differs} of {len(exact)} |", flush=True)
    # for scale: what the engine's fp16 KV cache alone costs against the exact model
    model.kv_dtype = np.float16
    got = model.forward(ids)[a.fed - 1:]
    differs = int((got.argmax(-1) != exact.argmax(-1)).sum())
    print(f"| (for scale: exact inputs, the fp16 KV cache) | {reference.compare_logits(got, exact):.2e} | {differs} of {len(exact)} |")
    # fp16 holds up to 65,504: how near each GEMM's inputs come
    print("largest |input| of the fed tokens: " + ", ".join(f"{n} {v:.4g}" for n, v in largest.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
