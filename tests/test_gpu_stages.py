"""Each decode stage kernel, and the prompt path's GEMM stages, alone on random inputs against NumPy in float64: the slow twins of the
fast kernels (issue 58, item 4), so that a failure names the stage, not the model.

tests/cuda_stage_test.cu includes runtime/forward_cuda.cu and launches one stage kernel of a tiny
variant's build with the grid, block, shared memory and attributes the runtime gives it, on inputs it
draws from a seed; it writes inputs and outputs as raw arrays with a manifest. Here each (variant,
stage) is one test: it runs the program for that stage, fails on any output left NaN (every output
is poisoned before the launch), and checks each output against an independent float64
implementation written here with tests/reference.py's pieces (HF's RMSNorm order, rotate_half RoPE
with the config's inv_freq, SiLU, softmax). Runs on a machine with a CUDA GPU (`make test-gpu` does
not run it: `.venv/bin/python -m pytest -q tests/test_gpu_stages.py`); elsewhere every test here
skips, and tests/test_cuda_build.py compiles the program instead.

Tolerances. Every bound is per element, |gpu - ref| <= bound, and the failure names the stage, the
array, the worst element and its ratio to the bound:
- Matvecs (QKV, o_proj, gate/up, down, the fused MLP, the LM head): fp32 sums of products of bf16
  weights and fp32 inputs, in another order than NumPy's. Each lane's chain of K/32 products, a
  5-step shuffle tree, the norm's rsqrtf and x * norm_w products: at K = 4352 at worst ~(136 + 8) *
  2^-24 ~ 8.6e-6 of the terms' magnitude sum_k |w_k u_k| (typically ~30x less: the errors are not
  all of one sign). RTOL_DOT = 2e-5 of that magnitude, not of the result, which may cancel. A real
  bug is far above it: one chunk of 8 terms of 4352 missing is ~6e-4 of the magnitude (random
  signs; 1.8e-3 if they share one).
- RoPE: the angle pos * inv_freq in fp32 (inv_freq a float32 table, the product rounded) and
  __sincosf, whose range reduction multiplies by 1/(2 pi) in fp32: an angle error up to about
  4 * 2^-24 * angle + 2^-21 rad, times the pair's length (at position 2000, 5e-4 of it on the
  fastest pair; the slow pairs stay near RTOL_DOT).
- The fp16 KV cache store: the fp32 value rounded to fp16, at most half an fp16 ulp: 2^-11 of the
  value (2^-25 absolute among the subnormals) on top of the value's own bound.
- SiLU: x / (1 + __expf(-x)): a few ulp (SILU_RTOL = 4e-6 of silu(g) * u) on top of the gate's and
  up's bounds carried through silu'(g) and u. The fused MLP carries the hidden values' bounds
  through down_proj as a root sum of squares, times MLP_RSS = 4 (their errors are independent
  roundings, not of one sign; the linear sum would let a dropped batch of 16 hidden units through
  at 4352 of them), plus RTOL_DOT of down's own terms (its 132 blocks' partial sums meet in
  red.global.add in no fixed order).
- Attention, per element against max |v| over the KV head's positions: the fp32 path (heads of 16)
  sums fp32 products of fp16 keys and the query, __expf, and a split combine: ATT_RTOL_FP32 = 5e-5.
  The tensor-core path (heads of 64 and 128) takes the query and the probabilities as two fp16
  terms each (hi + lo: 22 bits, the lo term's absolute floor 2^-25 among fp16 subnormals) with fp32
  sums: ATT_RTOL_MMA = 2e-4 (tests/bench/attention_mma_sim.py measures ~3e-7 of the largest output
  for the index arithmetic alone). Both well below what one position dropped or read twice costs at
  the depths drawn (~1/n of the output's spread, n <= 2048: >= 5e-4), and far below a wrong split,
  head or scale (order 1).
- The prompt's attention (prefill_attention_*: a batch's tokens over the cache before them): the
  flash form takes the scaled queries and the probabilities rounded to fp16 (a relative 2^-11 each,
  signs at random; the queries' rounding emulated in the reference): ATT_RTOL_FLASH = 2e-4 of the
  head's largest |value|, 2.4x under what one position dropped costs at a depth of 2048;
  attention_body's prefill form the decode attention's bounds. ATT_RTOL_FLASH is predicted, not
  yet measured on a GPU.
- The prompt path's GEMMs (tests/cuda_stage_test.cu's prefill_* stages, batches of PREFILL_SMALL
  and PREFILL_BATCH tokens): the same fp32 sums (RTOL_DOT of the magnitude) of the weights and the
  input terms as the kernel got them (their sum, exact in float64); each split GEMM's splits added
  here. Outputs written as terms (the RMSNorm's, o_proj's input, gate/up's hidden values) must sum
  to the value within TERMS_RTOL of it on top of the value's own bound.
- Exact: the embedding row, down_proj's transpose, every cache element but the one written, the
  counters and polled words the kernels put back, the argmax (the lowest index of the largest GPU
  logit, and within the bounds of the reference's largest).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO
from reference import apply_rope, rmsnorm, rope_inv_freq, silu
from test_gpu import gpu_present

pytestmark = pytest.mark.skipif(not gpu_present(), reason="no CUDA GPU here (nvidia-smi finds none): run "
                                "`.venv/bin/python -m pytest -q tests/test_gpu_stages.py` on the GPU machine")

# tiny-gqa: heads of 16 (the fp32 attention); tiny-qwen2: the QKV biases; tiny-group3: heads of 64 in
# groups of 3 (the tensor-core attention, the short context's kernel in splits); tiny-wide: heads of
# 128, rows of several steps; tiny-d2048: the fused MLP (sm_90) and staged attention values.
VARIANTS = ("tiny-gqa", "tiny-qwen2", "tiny-group3", "tiny-wide", "tiny-d2048")
# Every stage the program may have; a build without one (cuda_stage_test --list) skips it.
STAGES = ("embed", "rmsnorm_qkv_rope", "attention", "attention_one_split", "attention_short", "attention_short_one_split",
          "o_proj_residual", "o_proj_residual_shortest", "rmsnorm_gate_up_silu", "down_residual", "transpose_down",
          "mlp_fused", "rmsnorm_lm_head_argmax") + tuple(
              f"prefill_{stage}_{batch}" for batch in ("small", "full")
              for stage in ("rms", "qkv", "attention", "o_proj", "gate_up_pairs", "gate_up_gemm", "gate_up_tma", "gate_up_tma_wide",
                            "down"))
SEED = 58

RTOL_DOT = 2e-5
SILU_RTOL = 4e-6
MLP_RSS = 4.0
ATT_RTOL_FP32 = 5e-5
ATT_RTOL_MMA = 2e-4
ATT_RTOL_FLASH = 2e-4
F16_HALF_ULP = 2.0 ** -11
F16_SUBNORMAL_HALF_ULP = 2.0 ** -25
POISON_F32 = 0x7FC00000
# A value v as 16-bit terms (t0 = v rounded, t1 = the rest rounded, ...), by the build's count of
# terms: one is within half an ulp, 2^-8 of v in bf16 (8 significant bits), 2^-11 in fp16; two
# within half an ulp of half an ulp, 2^-18 in bf16, 2^-22 in fp16. The bounds take twice that.
TERMS_RTOL = {1: {"bf16": 2.0 ** -7, "f16": 2.0 ** -10}, 2: {"bf16": 2.0 ** -17, "f16": 2.0 ** -21}}


# ---------------------------------------------------------------------------------------------
# Building and running the program

def stage_model_dir(variant: str) -> Path:
    """build/test-models/<variant>-stages: the variant's config alone (the program draws its own
    weights), a build directory and generated headers of its own."""
    d = REPO / "build" / "test-models" / f"{variant}-stages"
    src = REPO / "tests" / "models" / variant / "config.json"
    d.mkdir(parents=True, exist_ok=True)
    if not (d / "config.json").exists() or (d / "config.json").read_bytes() != src.read_bytes():
        shutil.copyfile(src, d / "config.json")
    return d


def build_stage_test(variant: str) -> Path:
    """make stage-test for the variant; returns build/<variant>-stages/cuda_stage_test."""
    d = stage_model_dir(variant)
    r = subprocess.run(["make", "-s", f"MODEL={d}", "stage-test"], cwd=REPO, capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"make stage-test MODEL={d} failed:\n{r.stdout}\n{r.stderr[-5000:]}")
    return REPO / "build" / d.name / "cuda_stage_test"


@pytest.fixture(scope="session", autouse=True)
def stage_builds_side_by_side(request):
    """The selected variants' programs, made side by side before the first test (one nvcc process
    each, as tests/test_gpu.py's builds_side_by_side); a build that fails is left to its test."""
    variants = sorted({item.callspec.params["variant"] for item in request.session.items
                       if item.module.__name__ == __name__ and hasattr(item, "callspec") and "variant" in item.callspec.params})
    if not variants or not gpu_present():
        return

    def build(v):
        try:
            build_stage_test(v)
        except AssertionError:
            pass

    with ThreadPoolExecutor(max_workers=max(1, min(len(variants), (os.cpu_count() or 2) // 2))) as pool:
        list(pool.map(build, variants))


_programs: dict[str, tuple[Path, list[str]]] = {}


def program(variant: str) -> tuple[Path, list[str]]:
    """(the variant's cuda_stage_test, the stages its build has)"""
    if variant not in _programs:
        binary = build_stage_test(variant)
        r = subprocess.run([str(binary), "--list"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        _programs[variant] = binary, r.stdout.split()
    return _programs[variant]


def decode(raw: bytes, dtype: str, shape) -> np.ndarray:
    """A raw little-endian array as float64 (bf16, f16, f32) or its integers (i32, u32)."""
    if dtype == "bf16":
        a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    elif dtype == "f16":
        a = np.frombuffer(raw, dtype="<f2").astype(np.float64)
    elif dtype == "f32":
        a = np.frombuffer(raw, dtype="<f4").astype(np.float64)
    elif dtype == "i32":
        a = np.frombuffer(raw, dtype="<i4").astype(np.int64)
    elif dtype == "u32":
        a = np.frombuffer(raw, dtype="<u4").copy()
    else:
        raise ValueError(f"manifest: dtype {dtype!r}")
    return a.reshape(shape)


class Run:
    """One stage's run: its manifest entry, arrays (float64 or integers; raw 16-bit words in .bits)
    and the model's config."""

    def __init__(self, variant: str, stage: str, out: Path):
        self.variant, self.stage = variant, stage
        self.manifest = json.loads((out / "manifest.json").read_text())
        self.rec = self.manifest["stages"][stage]
        self.params = self.rec["params"]
        self.model = self.manifest["model"]
        self.plan = self.manifest["plan"]
        self.config = json.loads((REPO / "tests" / "models" / variant / "config.json").read_text())
        self.a, self.bits, self.outputs = {}, {}, []
        for name, spec in self.rec["arrays"].items():
            raw = (out / spec["file"]).read_bytes()
            self.a[name] = decode(raw, spec["dtype"], spec["shape"])
            if spec["dtype"] in ("bf16", "f16"):
                self.bits[name] = np.frombuffer(raw, dtype="<u2").reshape(spec["shape"])
            if spec["output"]:
                self.outputs.append(name)
        self.eps = float(self.config["rms_norm_eps"])

    def where(self) -> str:
        r = self.rec
        return (f"stage {self.stage} ({self.variant}: {r['kernel']}, grid {r['grid']}, block {r['block']}, "
                f"smem {r['smem']}, params {r['params']}, seed {self.manifest['seed']})")

    def close(self, name: str, got, want, bound, what: str) -> None:
        """|got - want| <= bound element by element, or a failure naming the stage and the worst element"""
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        bound = np.broadcast_to(np.asarray(bound, np.float64), want.shape)
        assert got.shape == want.shape, f"{self.where()}: {name}: shape {got.shape}, expected {want.shape}"
        diff = np.abs(got - want)
        bad = ~(diff <= bound)  # NaN fails too
        if bad.any():
            ratio = np.where(bound > 0, diff / np.where(bound > 0, bound, 1), np.where(diff > 0, np.inf, 0))
            ratio = np.where(np.isnan(ratio), np.inf, ratio)
            i = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
            raise AssertionError(
                f"{self.where()}: {name}: {int(bad.sum())} of {bad.size} elements past the bound ({what}); worst at "
                f"{tuple(int(v) for v in i)}: gpu {got[i]!r}, reference {want[i]!r}, |diff| {diff[i]:.3g} > bound "
                f"{bound[i]:.3g} ({ratio[i]:.3g} times)")

    def equal(self, name: str, got, want, what: str) -> None:
        got, want = np.asarray(got), np.asarray(want)
        assert got.shape == want.shape, f"{self.where()}: {name}: shape {got.shape}, expected {want.shape}"
        bad = got != want
        if bad.any():
            i = np.unravel_index(int(np.argmax(bad)), bad.shape)
            raise AssertionError(f"{self.where()}: {name}: {int(bad.sum())} of {bad.size} elements differ ({what}); "
                                 f"first at {tuple(int(v) for v in i)}: gpu {got[i]!r}, expected {want[i]!r}")


def no_nan_left(run: Run) -> None:
    """Every float output written: none left at the poison (or any other NaN)."""
    for name in run.outputs:
        a = run.a[name]
        if a.dtype == np.float64:
            n = int(np.isnan(a).sum())
            assert n == 0, f"{run.where()}: output {name}: {n} of {a.size} elements NaN (left unwritten, or computed NaN)"


# ---------------------------------------------------------------------------------------------
# The float64 twins and their bounds

def matvec(w, u):
    """(W u, sum_k |W_k u_k|): the result and its terms' magnitude, per row"""
    return w @ u, np.abs(w) @ np.abs(u)


def normed(run: Run, x, norm_w):
    """HF's RMSNorm, x * rsqrt(mean(x^2) + eps) * w, in float64"""
    return rmsnorm(x[None, :], norm_w, run.eps)[0]


def dsilu(g):
    s = 0.5 * (1.0 + np.tanh(0.5 * g))
    return s * (1.0 + g * (1.0 - s))


def gate_up_twin(run: Run, x, ffn_norm, w_gate, w_up):
    """(hb, its bound): silu(gate . xn) * (up . xn)"""
    xn = normed(run, x, ffn_norm)
    g, mg = matvec(w_gate, xn)
    u, mu = matvec(w_up, xn)
    h = silu(g) * u
    bound = RTOL_DOT * (np.abs(dsilu(g)) * np.abs(u) * mg + np.abs(silu(g)) * mu) + SILU_RTOL * np.abs(h)
    return h, bound


def check_embed(run: Run):
    token, a = run.params["token"], run.a
    assert a["history"][run.params["pos"]] == token
    run.equal("x", a["x"], a["embed"][token], "the embedding row, bf16 to fp32: exact")
    if run.plan["mlp_fused"]:
        run.equal("zero", a["zero"], np.zeros_like(a["zero"]), "the fused MLP's first buffer, zeroed")


def check_qkv(run: Run):
    a, m, pos = run.a, run.model, run.params["pos"]
    hd, H, KV = m["head_dim"], m["n_heads"], m["n_kv_heads"]
    inv = rope_inv_freq(run.config)
    run.close("rope_inv_freq", a["rope_inv_freq"], inv, 2.0 ** -23 * inv, "the uploaded table: float32 of the config's")
    xn = normed(run, a["x"], a["attn_norm"])
    outs = {}
    for name, heads in (("q", H), ("k", KV), ("v", KV)):
        y, mag = matvec(a[f"w{name}"], xn)
        if m["qkv_bias"]:
            y = y + a[f"b{name}"]
            mag = mag + np.abs(a[f"b{name}"])
        bound = RTOL_DOT * mag
        y, bound = y.reshape(heads, hd), bound.reshape(heads, hd)
        if name != "v":
            # rotate_half pairs (i, i + hd/2): each rotated value's error is both values' bounds
            # plus the angle's error times the pair's length
            half = hd // 2
            angle = pos * inv
            dtheta = 4 * 2.0 ** -24 * angle + 2.0 ** -21
            length = np.hypot(y[:, :half], y[:, half:])
            pair = bound[:, :half] + bound[:, half:] + dtheta * length
            bound = np.concatenate([pair, pair], axis=-1)
            y = apply_rope(y[None], [pos], inv)[0]
        outs[name] = (y, bound)
    run.close("q", a["q"].reshape(H, hd), *outs["q"], "fp32 dot products, then RoPE in fp32")
    for name, cache in (("k", "key_cache"), ("v", "value_cache")):
        y, bound = outs[name]
        got = a[f"{cache}_out"][:, pos, :]
        run.close(f"{cache}_out[:, {pos}]", got, y, bound + F16_HALF_ULP * (np.abs(y) + bound) + F16_SUBNORMAL_HALF_ULP,
                  "the fp32 value's bound and fp16 rounding")
        before, after = run.bits[cache].copy(), run.bits[f"{cache}_out"].copy()
        before[:, pos, :] = after[:, pos, :] = 0
        run.equal(f"{cache}_out (other positions)", after, before, "the kernel writes position pos only")
    want = run.plan["att_poll_word"] if run.plan["down_poll"] and not run.plan["mlp_fused"] else 0
    run.equal("hb_poll", a["hb_poll"], np.full_like(a["hb_poll"], want),
              "down's polled buffer put back to ATT_POLL_WORD (MODEL_DOWN_POLL), else untouched")


def check_attention(run: Run):
    a, m, pos = run.a, run.model, run.params["pos"]
    hd, H, KV = m["head_dim"], m["n_heads"], m["n_kv_heads"]
    rep = H // KV
    q = a["q"].reshape(H, hd)
    kc, vc = a["key_cache"][:, : pos + 1, :], a["value_cache"][:, : pos + 1, :]
    keys = np.repeat(kc, rep, axis=0)    # (H, n, hd): query head h reads KV head h // rep
    values = np.repeat(vc, rep, axis=0)
    scores = np.einsum("hd,hnd->hn", q, keys) / np.sqrt(hd)
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    want = np.einsum("hn,hnd->hd", p, values)
    rtol = ATT_RTOL_MMA if run.plan["att_mma_hd"] else ATT_RTOL_FP32
    bound = rtol * np.abs(values).max(axis=(1, 2))[:, None]
    path = "tensor cores, two fp16 terms" if run.plan["att_mma_hd"] else "fp32"
    run.close("att", a["att"].reshape(H, hd), want, bound, f"softmax attention over positions 0..{pos}, {path}")
    run.equal("counters", a["counters"], np.zeros_like(a["counters"]), "the KV heads' split counts put back to 0")


def check_prefill_attention(run: Run):
    """Each of the batch's count tokens (at pos + t) against softmax attention over positions
    0..pos + t of its KV head, per element within rtol of the head's largest |value|. The flash
    form rounds the scaled queries to fp16 (emulated here) and the probabilities too (not: their
    running max is the kernel's), a relative 2^-11 each with signs at random, so its error sits far
    under ATT_RTOL_FLASH; attention_body's prefill has the decode attention's bounds."""
    a, m, p = run.a, run.model, run.params
    hd, H, KV = m["head_dim"], m["n_heads"], m["n_kv_heads"]
    rep, pos, count = H // KV, p["pos"], p["count"]
    q = a["q"].reshape(-1, H, hd)[:count] / np.sqrt(hd)
    if p["flash"]:
        q = q.astype(np.float16).astype(np.float64)
    keys = np.repeat(a["key_cache"], rep, axis=0)    # (H, ctx, hd): query head h reads KV head h // rep
    values = np.repeat(a["value_cache"], rep, axis=0)
    want = np.empty((count, H, hd))
    for t in range(count):
        n = pos + t + 1
        scores = np.einsum("hd,hnd->hn", q[t], keys[:, :n])
        w = np.exp(scores - scores.max(axis=-1, keepdims=True))
        want[t] = np.einsum("hn,hnd->hd", w / w.sum(axis=-1, keepdims=True), values[:, :n])
    rtol = ATT_RTOL_FLASH if p["flash"] else ATT_RTOL_MMA if run.plan["att_mma_hd"] else ATT_RTOL_FP32
    bound = np.broadcast_to(rtol * np.abs(values[:, :pos + count]).max(axis=(1, 2))[None, :, None], want.shape)
    path = "flash, fp16 queries and probabilities" if p["flash"] else "attention_body's prefill"
    run.close("att", a["att"].reshape(count, H, hd), want, bound, f"{count} tokens at {pos} on, causal softmax attention, {path}")
    run.equal("counters", a["counters"], np.zeros_like(a["counters"]), "the split counts put back to 0")


def check_o_proj(run: Run):
    a, m = run.a, run.model
    y, mag = matvec(a["wo"], a["att"])
    if m["o_bias"]:
        y, mag = y + a["bo"], mag + np.abs(a["bo"])
    run.close("x_out", a["x_out"], a["x"] + y, RTOL_DOT * (mag + np.abs(a["x"])), "residual + fp32 dot products")


def check_signals(run: Run):
    a = run.a
    run.equal("att_done", a["att_done"], np.zeros_like(a["att_done"]), "the joined grid's count put back to 0")
    want = run.plan["att_poll_word"] if run.plan["att_o_poll"] and run.plan["att_o_short"] else 0
    run.equal("att_poll", a["att_poll"], np.full_like(a["att_poll"], want),
              "att_poll put back to ATT_POLL_WORD (MODEL_ATT_O_POLL), else untouched")


def check_gate_up(run: Run):
    a = run.a
    h, bound = gate_up_twin(run, a["x"], a["ffn_norm"], a["w_gate"], a["w_up"])
    run.close("hb", a["hb"], h, bound, "silu(gate . xn) * (up . xn), fp32")
    check_signals(run)


def check_down(run: Run):
    a = run.a
    y, mag = matvec(a["w_down"], a["hb"])
    run.close("x_out", a["x_out"], a["x"] + y, RTOL_DOT * (mag + np.abs(a["x"])), "residual + fp32 dot products")


def check_transpose(run: Run):
    run.equal("down_t", run.a["down_t"], run.a["w_down"].T, "down_proj transposed: exact")


def check_mlp_fused(run: Run):
    a = run.a
    h, hbound = gate_up_twin(run, a["x"], a["ffn_norm"], a["w_gate"], a["w_up"])
    y, mag = matvec(a["w_down"], h)
    carried = np.minimum(MLP_RSS * np.sqrt(a["w_down"] ** 2 @ hbound ** 2), np.abs(a["w_down"]) @ hbound)
    bound = carried + RTOL_DOT * (mag + np.abs(a["x"]))
    run.close("out", a["out"], a["x"] + y, bound, "x + down(silu(gate . xn) * (up . xn)), added into zeros")
    run.equal("zero", a["zero"], np.zeros_like(a["zero"]), "the next layer's buffer, zeroed")
    check_signals(run)


def check_lm_head(run: Run):
    a = run.a
    xn = normed(run, a["x"], a["final_norm"])
    want, mag = matvec(a["lm_head"], xn)
    bound = RTOL_DOT * mag
    run.close("logits", a["logits"], want, bound, "fp32 dot products")
    got_next = int(a["io"][1])  # IO_NEXT
    first_max = int(np.argmax(a["logits"]))
    assert got_next == first_max, (f"{run.where()}: io[IO_NEXT] = {got_next}, the GPU logits' largest is first at {first_max} "
                                   "(the argmax takes the lowest id on ties)")
    best = int(np.argmax(want))
    assert want[got_next] >= want[best] - bound[got_next] - bound[best], (
        f"{run.where()}: argmax {got_next} (reference logit {want[got_next]!r}), the reference's is {best} ({want[best]!r}): "
        "farther apart than their bounds")
    run.equal("counter", a["counter"], np.zeros_like(a["counter"]), "the argmax's block count put back to 0")


def terms_sum(run: Run, name: str):
    """a terms array (PREFILL_TERMS, B, K) as the values it holds: the terms' sum, exact in float64"""
    t = run.a[name]
    assert t.shape[0] == run.plan["prefill_terms"], f"{run.where()}: {name}: {t.shape[0]} terms, the build's {run.plan['prefill_terms']}"
    return t.sum(axis=0)


def terms_close(run: Run, name: str, want, bound, what: str):
    rtol = TERMS_RTOL[run.plan["prefill_terms"]][run.manifest["weight_dtype"]]
    run.close(name, terms_sum(run, name), want, bound + rtol * (np.abs(want) + bound), f"{what}, as {run.plan['prefill_terms']} terms")


def check_prefill_rms(run: Run):
    a = run.a
    want_x = a["x"] + a["part"].sum(axis=0)
    xbound = 4 * 2.0 ** -24 * (np.abs(a["x"]) + np.abs(a["part"]).sum(axis=0))
    run.close("x_out", a["x_out"], want_x, xbound, "x + the splits' partial sums, in fp32")
    xn = rmsnorm(want_x, a["norm"], run.eps)
    # the sum's rounding carried through the norm (it may cancel), and the norm's own
    scale = np.abs(a["norm"]) / np.sqrt(np.mean(want_x * want_x, axis=-1, keepdims=True) + run.eps)
    terms_close(run, "terms", xn, RTOL_DOT * np.abs(xn) + xbound * scale, "RMSNorm of each token's row")


def check_prefill_qkv(run: Run):
    a, m, pos, count = run.a, run.model, run.params["pos"], run.params["count"]
    hd, H, KV, B = m["head_dim"], m["n_heads"], m["n_kv_heads"], run.params["batch"]
    inv = rope_inv_freq(run.config)
    u = terms_sum(run, "x_terms")  # (B, dim)
    positions = pos + np.arange(B)
    outs = {}
    for name, heads in (("q", H), ("k", KV), ("v", KV)):
        w = a[f"w{name}"]
        y, mag = u @ w.T, np.abs(u) @ np.abs(w).T
        if m["qkv_bias"]:
            y, mag = y + a[f"b{name}"], mag + np.abs(a[f"b{name}"])
        bound = RTOL_DOT * mag
        y, bound = y.reshape(B, heads, hd), bound.reshape(B, heads, hd)
        if name != "v":
            half = hd // 2
            angle = positions[:, None, None] * inv[None, None, :]
            dtheta = 4 * 2.0 ** -24 * angle + 2.0 ** -21
            length = np.hypot(y[..., :half], y[..., half:])
            pair = bound[..., :half] + bound[..., half:] + dtheta * length
            bound = np.concatenate([pair, pair], axis=-1)
            y = apply_rope(y, list(positions), inv)
        outs[name] = (y, bound)
    run.close("q", a["q"].reshape(B, H, hd), *outs["q"], "the GEMM's fp32 sums over the terms, then RoPE at each token's position")
    for name, cache in (("k", "key_cache"), ("v", "value_cache")):
        y, bound = outs[name]
        got = a[f"{cache}_out"][:, pos: pos + count, :].transpose(1, 0, 2)
        y, bound = y[:count], bound[:count]
        run.close(f"{cache}_out[:, {pos}:{pos + count}]", got, y,
                  bound + F16_HALF_ULP * (np.abs(y) + bound) + F16_SUBNORMAL_HALF_ULP, "the fp32 value's bound and fp16 rounding")
        before, after = run.bits[cache].copy(), run.bits[f"{cache}_out"].copy()
        before[:, pos: pos + count, :] = after[:, pos: pos + count, :] = 0
        run.equal(f"{cache}_out (other positions)", after, before, "the batch's tokens only, none past its count")


def check_prefill_o(run: Run):
    a, m = run.a, run.model
    terms_close(run, "att_terms", a["att"], np.zeros_like(a["att"]), "the attention's output")
    u = terms_sum(run, "att_terms")
    y, mag = u @ a["wo"].T, np.abs(u) @ np.abs(a["wo"]).T
    if m["o_bias"]:
        y, mag = y + a["bo"], mag + np.abs(a["bo"])
    run.close("part (its splits added)", a["part"].sum(axis=0), y, RTOL_DOT * mag, "the split GEMM's fp32 sums over the terms (+ bias)")


def check_prefill_gate_up(run: Run):
    a = run.a
    u = terms_sum(run, "x_terms")
    g, mg = u @ a["w_gate"].T, np.abs(u) @ np.abs(a["w_gate"]).T
    v, mu = u @ a["w_up"].T, np.abs(u) @ np.abs(a["w_up"]).T
    h = silu(g) * v
    bound = RTOL_DOT * (np.abs(dsilu(g)) * np.abs(v) * mg + np.abs(silu(g)) * mu) + SILU_RTOL * np.abs(h)
    terms_close(run, "hb_terms", h, bound, "silu(gate . x) * (up . x), fp32")


def check_prefill_down(run: Run):
    a = run.a
    u = terms_sum(run, "hb_terms")
    y, mag = u @ a["w_down"].T, np.abs(u) @ np.abs(a["w_down"]).T
    run.close("part (its splits added)", a["part"].sum(axis=0), y, RTOL_DOT * mag, "the split GEMM's fp32 sums over the terms")


CHECKS = {
    "embed": check_embed,
    "rmsnorm_qkv_rope": check_qkv,
    "attention": check_attention,
    "attention_one_split": check_attention,
    "attention_short": check_attention,
    "attention_short_one_split": check_attention,
    "o_proj_residual": check_o_proj,
    "o_proj_residual_shortest": check_o_proj,
    "rmsnorm_gate_up_silu": check_gate_up,
    "down_residual": check_down,
    "transpose_down": check_transpose,
    "mlp_fused": check_mlp_fused,
    "rmsnorm_lm_head_argmax": check_lm_head,
}
for _batch in ("small", "full"):
    CHECKS.update({f"prefill_rms_{_batch}": check_prefill_rms, f"prefill_qkv_{_batch}": check_prefill_qkv,
                   f"prefill_attention_{_batch}": check_prefill_attention,
                   f"prefill_o_proj_{_batch}": check_prefill_o, f"prefill_down_{_batch}": check_prefill_down,
                   **{f"prefill_{form}_{_batch}": check_prefill_gate_up
                      for form in ("gate_up_pairs", "gate_up_gemm", "gate_up_tma", "gate_up_tma_wide")}})
assert set(CHECKS) == set(STAGES)


def check_manifest_model(run: Run) -> None:
    """The build's dimensions are the config's (the reference reads the config, not the build)."""
    c, m = run.config, run.model
    heads = c["num_attention_heads"]
    hd = c.get("head_dim") or c["hidden_size"] // heads
    want = {"dim": c["hidden_size"], "hidden_dim": c["intermediate_size"], "n_heads": heads,
            "n_kv_heads": c.get("num_key_value_heads") or heads, "head_dim": hd, "vocab_size": c["vocab_size"]}
    got = {k: m[k] for k in want}
    assert got == want, f"{run.where()}: the build's dimensions {got}, the config's {want}"
    assert abs(m["norm_eps"] - run.eps) <= 1e-7 * run.eps, f"{run.where()}: norm_eps {m['norm_eps']}, config {run.eps}"


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_stage_matches_numpy(variant, stage, tmp_path):
    binary, has = program(variant)
    if stage not in has:
        pytest.skip(f"{variant}'s build has no {stage} stage (its plan: cuda_stage_test --list)")
    r = subprocess.run([str(binary), str(tmp_path), str(SEED), "--stage", stage], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"stage {stage} ({variant}): cuda_stage_test exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    run = Run(variant, stage, tmp_path)
    check_manifest_model(run)
    no_nan_left(run)
    CHECKS[stage](run)
