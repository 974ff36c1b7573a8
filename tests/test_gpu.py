"""The CUDA decode step against the CPU path and against Hugging Face transformers.

Runs on a machine with a CUDA GPU (the GPU machine: `make test-gpu`); everywhere else every test
here skips, saying so. Tolerances, as max|a - b| / max|b| per position (reference.compare_logits):
- GPU against CPU, same weights, both fp32 arithmetic with an fp16 KV cache: they differ only in
  summation order and in the rare K/V element rounded to the other neighbouring fp16: 1e-3, as
  CPU against the fp16-KV NumPy reference (tests/test_numerics.py).
- GPU against transformers in float32 (weights upcast exactly, exact KV): the GPU's fp16 KV cache
  alone moves logits by up to 1.1e-3 on these models (measured in tests/test_reference.py's
  emulation); we allow 5e-3, still far below the order-1 errors of a wrong index or RoPE pair.
- The prompt path (several tokens fed at once: the tensor cores' GEMMs) against either:
  GPU_PROMPT_TOLERANCE, below. Its inputs are rounded to 16 bits, so its text may part from the
  CPU's at a near tie: the greedy-text tests feed their prompts a step a token (--exact-prompt)
  and test the prompt path by its logits.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from tokenizers import Tokenizer

from conftest import BUILDS, DEFAULT_MODEL, REPO, TINY_VARIANTS, binary_for, build_generic, run, split_flags, tiny_model_dir
from reference import compare_logits
from test_numerics import TINY_PROMPT


def gpu_present() -> bool:
    if not shutil.which("nvidia-smi"):
        return False
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return r.returncode == 0 and "GPU" in r.stdout


pytestmark = pytest.mark.skipif(not gpu_present(), reason="no CUDA GPU here (nvidia-smi finds none): run `make test-gpu` on the GPU machine")

GPU_CPU_TOLERANCE = 1e-3
GPU_HF_TOLERANCE = 5e-3
# The prompt path takes each projection's input rounded to bf16 (fp16 in a model with quantized
# matrices), with fp32 sums, as transformers' and llama.cpp's 16-bit GEMMs do (runtime/cuda_gemm.cuh,
# PREFILL_TERMS). Emulated in NumPy on the six tiny variants (tests/bench/prefill_terms.py, TINY_PROMPT's
# first 140 tokens at once, the rest a step a token), that rounding moves the logits by 4.8e-3 to
# 6.4e-3 against exact inputs. A second implementation of the same rounding is no nearer: where the
# two sums differ in the last bit, a value can round to the other bf16 neighbour (2^-8 of itself),
# which the next layers spread, so the differences grow to the rounding's own size within a few
# layers (the NumPy emulation against the CPU's prefill rounding the same way, tried: 1.7e-3 to
# 5.2e-3). So against the CPU's exact path and against transformers alike: 2e-2, three times the
# largest emulated, with the fp16 KV cache's 1.1e-3 beside it; a wrong tile or a lost split of K moves
# logits by far more (a sixteenth of K's products missing: ~25%).
GPU_PROMPT_TOLERANCE = 2e-2
# TINY_PROMPT's tokens fed at once: in one batch of 256 (a build of at most 128: batches of 128 and
# 16 holding 12 tokens), the last of which runs through the last layer and chooses (prefill_last)
PREFILL_DUMP_FROM = 140

# nvcc flags the tests build tiny models with (flags_build), besides the ones in their parameters
RES_PAIRS = "residual_pairs=1"  # o_proj and down a pair of rows a warp
NO_SHORT = "att_short=0"  # the decode attention's split kernel at short contexts too
ATT_O_SHORT = "att_o_short=1 att_o_poll=0"  # the short context's attention and o_proj in one grid, o_proj counting
ATT_O_POLL = "att_o_short=1"  # ... o_proj polling attention's outputs
ATT_CHUNK5 = "att_min_chunk=5"  # the decode attention in splits of 5 positions
COMBINE_EARLY = "att_min_chunk=5 att_combine_early=16"
GATE_UP_GEMM = "prefill_gate_up_gemm=2"  # gate/up as a GEMM on every model (the tiny models' tiles are too few for the rule)
MMA_SYNC = "gemm_wgmma=0"  # the prefill GEMMs on mma.sync (the default on sm_90: wgmma)
CHUNK5 = "att_min_chunk=5 fmma_min_chunk=5"
TMA_WIDE = "prefill_gate_up_gemm=2 gate_up_tma_wide=2"  # gate/up's TMA body two warpgroups a block, on every model


def split_last_flags(blocks, unroll):
    return f"grid_qkv={blocks} pair_unroll={unroll}"


def staged_flags(chunk):
    return f"att_stage_values=1 att_short=0{chunk}"


def flags_build(variant, flags):
    """(model dir, specialized binary) of a tiny variant built with plan settings and nvcc flags
    (split_flags): a model directory (and so a build directory) of its own for each set of flags."""
    d = tiny_model_dir(variant, name=f"{variant}-{hashlib.sha1(flags.encode()).hexdigest()[:10]}")
    sets, nvcc = split_flags(flags)
    return d, binary_for(d, "specialized", f"EXTRA_NVCCFLAGS={' '.join(nvcc)}", f"PLAN={' '.join(sets)}")


# What each test builds, from an item's parameters: ("flags", variant, flags) a flags_build,
# ("plain", variant, build) binary_for(tiny_model_dir(variant), build). The default model's build is
# make test-gpu's own.
TEST_BUILDS = {
    "test_tiny_gpu_matches_cpu": lambda p: [("plain", *p["tiny_gpu"])],
    "test_tiny_gpu_matches_transformers": lambda p: [("plain", *p["tiny_gpu"])],
    "test_generic_gpu_logits_equal_specialized": lambda p: [("plain", p["variant"], b) for b in BUILDS],
    "test_gpu_sampling_end_to_end": lambda p: [("plain", "tiny-gqa", p["build"])],
    "test_tiny_gpu_greedy_equals_cpu": lambda p: [("plain", p["variant"], "specialized")],
    "test_tiny_gpu_residual_pairs_equal_cpu": lambda p: [("flags", p["variant"], RES_PAIRS)],
    "test_tiny_gpu_fused_mlp_equal_cpu": lambda p: [("flags", FUSED_MLP_MODEL, p["flags"])],
    "test_fused_mlp_memcheck_clean": lambda p: [("flags", p["model"], p["flags"])],
    "test_tiny_gpu_fused_mlp_at_4096_equal_cpu": lambda p: [("flags", FUSED_MLP_4096, p["flags"]) if p["flags"]
                                                            else ("plain", FUSED_MLP_4096, "specialized")],
    "test_tiny_gpu_fused_mlp_past_one_split_equal_cpu": lambda p: [("flags", FUSED_MLP_MODEL, p["flags"]) if p["flags"]
                                                                   else ("plain", FUSED_MLP_MODEL, "specialized")],
    "test_tiny_gpu_early_lots_equal_cpu": lambda p: [("flags", p["variant"], p["flags"])],
    "test_tiny_gpu_pair_async_equal_cpu": lambda p: [("flags", "tiny-wide", p["flags"])],
    "test_tiny_gpu_qkv_split_last_equal_cpu": lambda p: [("flags", "tiny-wide", split_last_flags(p["blocks"], p["unroll"]))],
    "test_tiny_gpu_staged_values_equal_cpu": lambda p: [("flags", p["variant"], staged_flags(p["chunk"]))],
    "test_tiny_gpu_split_attention_at_short_context_equals_cpu": lambda p: [("flags", p["variant"], NO_SHORT)],
    "test_tiny_gpu_short_attention_splits_equal_cpu": lambda p: [("plain", "tiny-group3-long", "specialized")],
    "test_tiny_gpu_short_attention_joined_with_o_proj_equal_cpu": lambda p: [("flags", p["variant"], ATT_O_SHORT)],
    "test_tiny_gpu_joined_o_proj_polls_outputs_equal_cpu": lambda p: [("flags", p["variant"], ATT_O_POLL)],
    "test_tiny_gpu_down_polls_gate_up_equal_cpu": lambda p: [("flags", p["variant"], p["flags"])],
    "test_tiny_gpu_prefill_builds_near_cpu": lambda p: [("flags", p["variant"], p["flags"])],
    "test_tiny_gpu_prefill_logits_match_cpu": lambda p: [("flags", p["variant"], p["flags"]) if p["flags"]
                                                         else ("plain", p["variant"], "specialized")],
    "test_tiny_gpu_attention_odd_chunks_equal_cpu": lambda p: [("flags", p["variant"], ATT_CHUNK5)],
    "test_tiny_gpu_combine_early_equal_cpu": lambda p: [("flags", p["variant"], COMBINE_EARLY)],
    "test_tiny_gpu_flash_prefill_odd_chunks_near_cpu": lambda p: [("flags", p["variant"], CHUNK5)],
    "test_tiny_gpu_short_attention_graphs_equal_cpu": lambda p: [("plain", "tiny-long-context", "specialized")],
    "test_gpu_bench_kernels_times_decode_and_prefill": lambda p: [("plain", "tiny-llama", "specialized")],
    "test_prefill_builds_memcheck_clean": lambda p: [("flags", p["variant"], p["flags"])],
    "test_memcheck_clean": lambda p: [("plain", p["variant"], p["build"])],
    "test_racecheck_clean": lambda p: [("plain", p["variant"], p["build"])],
    "test_tiny_gpu_quantized_matches_cpu": lambda p: [("plain", p["variant"], "specialized")],
    "test_generic_gpu_refuses_quantized": lambda p: [("plain", None, "generic")],
    "test_gpu_refuses_formats_mixed_by_layer_outside_the_k_formats": lambda p: [("plain", "tiny-mixed-q4_1-q8_0", "specialized")],
    "test_tiny_gpu_kv_q8_near_f16": lambda p: [("flags", p["variant"], p["flags"]) if p["flags"]
                                                else ("plain", p["variant"], "specialized")],
    "test_tiny_gpu_kv_q8_matches_cpu": lambda p: [("flags", p["variant"], p["flags"]) if p["flags"]
                                                  else ("plain", p["variant"], "specialized")],
    # its model is a tiny one with bytes planted (lot_word_model): built in the test, alone
    "test_tiny_gpu_lots_ended_by_a_q8_0_word_equal_cpu": lambda p: [],
}


def selected_builds(items) -> list[tuple]:
    """The builds the selected items need (TEST_BUILDS), each once; the generic build (one for
    every model) as ("plain", None, "generic")."""
    specs = set()
    for item in items:
        name = getattr(item, "originalname", None)
        if name in TEST_BUILDS:
            for spec in TEST_BUILDS[name](item.callspec.params if hasattr(item, "callspec") else {}):
                specs.add(("plain", None, "generic") if spec[2] == "generic" else spec)
    return sorted(specs, key=str)


@pytest.fixture(scope="session", autouse=True)
def builds_side_by_side(request):
    """The selected tests' builds, made side by side before the first test runs: each is one nvcc
    process (~15 s on the GPU machine; the generic build three), and one after another they took
    most of a `make test-gpu` (over 600 s measured). A specialized build goes first,
    alone, so that the runtime's shared objects (build/runtime) are up to date before the others
    link them. A build that fails here is left to its test, which builds it again and reports
    make's output."""
    specs = selected_builds(request.session.items)
    if not specs or not gpu_present():
        return

    def build(spec):
        kind, variant, arg = spec
        try:
            if kind == "flags":
                flags_build(variant, arg)
            elif arg == "generic":
                build_generic()
            else:
                binary_for(tiny_model_dir(variant), arg)
        except (AssertionError, subprocess.CalledProcessError):
            pass

    first = next((s for s in specs if s[2] != "generic"), specs[0])
    build(first)
    with ThreadPoolExecutor(max_workers=max(1, (os.cpu_count() or 2) // 2)) as pool:
        list(pool.map(build, [s for s in specs if s != first]))


def logits_of(binary, model_dir, device, prompt, tmp_path, vocab):
    out = tmp_path / f"logits-{device}.bin"
    run(binary, "-m", str(model_dir), "--device", device, "--dump-logits", str(out), "-p", prompt, "--threads", "4")
    return np.fromfile(out, dtype=np.float32).reshape(-1, vocab)


def prompt_logits(binary, model_dir, tmp_path, vocab, fed=PREFILL_DUMP_FROM, prompt=TINY_PROMPT, *args):
    """--dump-prefill fed on the GPU: the prompt's first fed tokens through the prompt path, the rest a
    step a token; the logits of positions fed - 1 on"""
    out = tmp_path / f"prompt-{fed}.bin"
    run(binary, "-m", str(model_dir), "--device", "cuda", "--dump-logits", str(out), "--dump-prefill", str(fed), "-p", prompt,
        *args)
    return np.fromfile(out, dtype=np.float32).reshape(-1, vocab)


def assert_prompt_path_near_cpu(binary, d, tmp_path, fed=PREFILL_DUMP_FROM, prompt=TINY_PROMPT):
    """The GPU's prompt path (prompt_logits) against the CPU's logits a step a token: GPU_PROMPT_TOLERANCE"""
    vocab = json.loads((d / "config.json").read_text())["vocab_size"]
    gpu = prompt_logits(binary, d, tmp_path, vocab, fed, prompt)
    cpu = logits_of(binary, d, "cpu", prompt, tmp_path, vocab)[fed - 1:]
    assert gpu.shape == cpu.shape
    err = compare_logits(gpu, cpu)
    print(f"{d.name}: the prompt path ({fed} tokens) against the CPU {err:.2e}")
    assert err < GPU_PROMPT_TOLERANCE, f"{d.name}: the prompt path's logits ({fed} tokens at once) against the CPU's {err:.2e}"


def greedy_args(d, prompt=TINY_PROMPT, *more):
    """48 greedy tokens after prompt, the prompt fed a step a token on the GPU (--exact-prompt): the
    text the CPU's decode gives"""
    return ["-m", str(d), "-p", prompt, "-n", "48", "--temp", "0", "--threads", "4", "--exact-prompt", *more]


# tiny-d2048: the hidden size of Llama-3.2-1B (2048), where the decode MLP is one kernel by default
# (MLP_FUSED; codegen/plan.py, _mlp_fused_fits); its 4352 hidden units give 132 blocks 32 or 33
# each, so a block's last batch of 16 holds one unit and its tiles' slots are reused; its context
# of 2048 lets a prompt cross from the one-split graphs into the others at 256 positions, as the
# 1B's. Not in TINY_VARIANTS: its 150 MB of weights would slow every CPU test.
SPLIT_MLP = "mlp_fused=0"
FUSED_MLP_MODEL = "tiny-d2048"
# tiny-d4096: the hidden size of the Mistral-7B and Llama-3.1-8B shapes (4096), where the fused MLP
# gives a hidden unit's gate and up rows to two warps and takes 8 units a batch; its 2272 hidden
# units give 132 blocks 17 or 18 each, so a block's last batch holds 1 or 2 units, in its first
# tiles' slot again; 8 heads of 128 over 2 KV heads, the 7B's group of 4.
FUSED_MLP_4096 = "tiny-d4096"


@pytest.fixture(scope="module", params=[(v, b) for v in TINY_VARIANTS for b in BUILDS]
                + [(FUSED_MLP_MODEL, "specialized"), (FUSED_MLP_4096, "specialized")], ids=lambda p: f"{p[0]}-{p[1]}")
def tiny_gpu(request):
    """(model dir, binary) for each tiny variant and each build (specialized, generic), and the fused
    MLP's models (the 1B's and the 7B's hidden sizes) in their specialized builds."""
    variant, build = request.param
    d = tiny_model_dir(variant)
    return d, binary_for(d, build)


def gpu_cpu_error(binary, d, tmp_path) -> float:
    """compare_logits of binary's GPU logits against its CPU logits over TINY_PROMPT, model d"""
    vocab = json.loads((d / "config.json").read_text())["vocab_size"]
    return compare_logits(logits_of(binary, d, "cuda", TINY_PROMPT, tmp_path, vocab),
                          logits_of(binary, d, "cpu", TINY_PROMPT, tmp_path, vocab))


def test_tiny_gpu_matches_cpu(tiny_gpu, tmp_path):
    d, binary = tiny_gpu
    vocab = json.loads((d / "config.json").read_text())["vocab_size"]
    gpu = logits_of(binary, d, "cuda", TINY_PROMPT, tmp_path, vocab)
    cpu = logits_of(binary, d, "cpu", TINY_PROMPT, tmp_path, vocab)
    err = compare_logits(gpu, cpu)
    assert err < GPU_CPU_TOLERANCE, f"{d.name}: GPU against CPU {err:.2e}"


# Quantized tiny models (GGUF block formats kept on the device: runtime/cuda_weights.cuh): Q4_1
# layers with a Q8_0 embedding (the default model's mix), Qwen2's biases on Q4_0, an untied Q8_0 LM
# head, the 1B's hidden size with Q4_0 attention and a Q4_1 MLP (rows of many chunks a lane), the
# same shape in the K formats (Q5_K attention, Q4_K o_proj and gate/up, Q6_K down and embedding), and
# llama.cpp's Q4_K_M mix (v_proj and down_proj Q6_K in some layers, Q4_K in the others: w_kany), and
# Q4_0 with o_proj left in bf16 (a dense matrix of a quantized model: w_as_f16 in the prompt's GEMM).
# tiny-q4_1's down_proj has K = 160, a last K tile of the GEMM half past K. Specialized builds only:
# the generic build refuses quantized weights on the GPU.
QUANTIZED_VARIANTS = ("tiny-q4_1", "tiny-q4_0", "tiny-q8_0", "tiny-d2048-q4", "tiny-d2048-k", "tiny-q4_k_m", "tiny-q4_0-o-bf16")


@pytest.mark.parametrize("variant", QUANTIZED_VARIANTS)
def test_tiny_gpu_quantized_matches_cpu(variant, tmp_path):
    """The quantized decode step (each matrix read in its block format) against the CPU's, which
    tests/test_numerics.py checks against NumPy on the dequantized weights, a token at a time. Same
    tolerance as the dense models: the blocks' products are exact on both, and the GPU's inputs as
    16-bit integers a block of 32 (stage_xq) move a dot product by ~2e-5 of its magnitude at most
    (tests/test_cuda_format.py bounds it). Then the prompt path (PREFILL_DUMP_FROM tokens at once:
    the GEMMs' tiles dequantized to fp16 in shared memory, gemm_q_tiles) against the CPU's steps."""
    d = tiny_model_dir(variant)
    binary = binary_for(d, "specialized")
    err = gpu_cpu_error(binary, d, tmp_path)
    assert err < GPU_CPU_TOLERANCE, f"{variant}: quantized GPU against CPU {err:.2e}"
    assert_prompt_path_near_cpu(binary, d, tmp_path)


def lot_word_model() -> "Path":
    """tiny-d4096 in Q8_0 (its plan loads the paired kernels' early chunks in lots: pair_lot 2 of
    pair_early 4) with int8 values 1, 0, -64, 127 (the word 0x7FC00001 that ends the lots early)
    first in the blocks that the first lot of QKV's first pair (q_proj row head_dim / 2) and of
    gate/up's first row (up_proj row 0) read."""
    import struct
    import sys
    d = REPO / "build" / "test-models" / "tiny-d4096-q8_0-lot-word"
    if not (d / "model.safetensors").exists():
        d.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / "tests" / "models" / "tiny-d4096" / "config.json", d / "config.json")
        subprocess.run([sys.executable, "-m", "codegen.synth", str(d), "--quant", "q8_0", "--seed", "5", "--tokenizer",
                        str(REPO / "tests" / "models" / "tiny-tokenizer")], cwd=REPO, check=True, capture_output=True)
        cfg = json.loads((d / "config.json").read_text())
        row_bytes = cfg["hidden_size"] // 32 * 34
        path = d / "model.safetensors"
        raw = bytearray(path.read_bytes())
        n = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8:8 + n])
        for name, row in (("model.layers.0.self_attn.q_proj.weight", cfg["head_dim"] // 2), ("model.layers.0.mlp.up_proj.weight", 0)):
            at = 8 + n + header[name]["data_offsets"][0] + row * row_bytes + 2  # block 0's values, past its fp16 scale
            raw[at:at + 4] = bytes([0x01, 0x00, 0xC0, 0x7F])
        path.write_bytes(bytes(raw))
    return d


def test_tiny_gpu_lots_ended_by_a_q8_0_word_equal_cpu(tmp_path):
    """The early lots of QKV and gate/up end at a chunk whose first word is 0x7FC00001 (load_lots):
    an impossible bf16 pair, but int8 values Q8_0 can hold. The chunks after it must still be
    loaded (pair_early_loads); left unset they gave the Mistral-7B shape NaN logits (H100)."""
    d = lot_word_model()
    err = gpu_cpu_error(binary_for(d, "specialized"), d, tmp_path)
    assert err < GPU_CPU_TOLERANCE, f"Q8_0 with the lots' stop word: GPU against CPU {err:.2e}"


def test_generic_gpu_refuses_quantized(tmp_path):
    """The generic build has no quantized GPU kernels: it says so in one line instead of running."""
    d = tiny_model_dir("tiny-q4_1")
    r = run(binary_for(d, "generic"), "-m", str(d), "--device", "cuda", "-p", "hi", "-n", "1", check=False)
    err = r.stderr.decode()
    assert r.returncode != 0 and "quantized" in err and len(err.strip().splitlines()) == 1, err


def test_gpu_refuses_formats_mixed_by_layer_outside_the_k_formats():
    """tiny-mixed-q4_1-q8_0's down_proj is Q8_0 in its last layer, Q4_1 in the others: one kernel
    reads a field's every layer, and mixes only the K formats (w_kany), so the GPU refuses it in one
    line naming the field and its formats (the CPU runs it: tests/test_numerics.py)."""
    d = tiny_model_dir("tiny-mixed-q4_1-q8_0")
    r = run(binary_for(d, "specialized"), "--device", "cuda", "-p", "hi", "-n", "1", check=False)
    err = r.stderr.decode()
    assert r.returncode != 0 and len(err.strip().splitlines()) == 1, err
    assert ("--device cuda: mlp.down_proj mix Q4_1 and Q8_0; one kernel reads them, and mixes only the K formats (Q4_K, Q5_K, "
            "Q6_K); --device cpu runs it") in err, err


@pytest.mark.parametrize("variant", TINY_VARIANTS)
def test_generic_gpu_logits_equal_specialized(variant, tmp_path):
    """The generic build's GPU step against the specialized build's: the same kernel bodies with
    run-time dimensions, so the same sums in the same order; printed: whether bit for bit."""
    d = tiny_model_dir(variant)
    vocab = json.loads((d / "config.json").read_text())["vocab_size"]
    got = {b: logits_of(binary_for(d, b), d, "cuda", TINY_PROMPT, tmp_path, vocab) for b in BUILDS}
    diff = np.abs(got["generic"] - got["specialized"]).max()
    print(f"{variant}: generic against specialized on the GPU, max |diff| {diff:.3e}, bitwise equal: {diff == 0}")
    err = compare_logits(got["generic"], got["specialized"])
    assert err < GPU_CPU_TOLERANCE, f"{variant}: generic against specialized GPU logits {err:.2e}"


def test_gpu_sampler_draws_what_the_cpu_sampler_draws():
    """runtime/cuda_sampler.cuh against runtime/sampler.c on the same logits and seeds, every path
    (tests/cuda_sampler_test.cu): the same token on every draw."""
    subprocess.run(["make", "-s", "build/tests/cuda_sampler_test"], cwd=REPO, check=True)
    r = subprocess.run([str(REPO / "build/tests/cuda_sampler_test")], capture_output=True, text=True, timeout=600)
    print(r.stdout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert " 0 mismatches" in r.stdout


@pytest.mark.parametrize("build", BUILDS)
def test_gpu_sampling_end_to_end(build):
    """Sampling on the device: the same seed gives the same text, another seed other text; top-k 1
    is greedy."""
    d = tiny_model_dir("tiny-gqa")
    binary = binary_for(d, build)
    args = ["-m", str(d), "--device", "cuda", "-p", "Hello there", "-n", "48", "--temp", "1.5", "--top-p", "1", "--min-p", "0"]
    first = run(binary, *args, "--seed", "5").stdout
    assert run(binary, *args, "--seed", "5").stdout == first
    assert run(binary, *args, "--seed", "6").stdout != first
    greedy = run(binary, *args[:-6], "--temp", "0").stdout
    assert run(binary, *args[:-6], "--temp", "1", "--top-k", "1").stdout == greedy


@pytest.mark.parametrize("variant", TINY_VARIANTS)
def test_tiny_gpu_greedy_equals_cpu(variant, tmp_path):
    """Greedy text on the device, each step queued before the host has read the token it runs on,
    against the CPU's (the prompt a step a token); the same after the prompt path (TINY_PROMPT's ~150
    tokens in batches, the last partial) runs to its end and chooses, where the texts may part at a
    near tie: its last position's logits against the CPU's."""
    d = tiny_model_dir(variant)
    binary = binary_for(d, "specialized")
    args = greedy_args(d)
    assert run(binary, *args, "--device", "cuda").stdout == run(binary, *args, "--device", "cpu").stdout
    n = len(Tokenizer.from_file(str(d / "tokenizer.json")).encode(TINY_PROMPT).ids)
    assert_prompt_path_near_cpu(binary, d, tmp_path, fed=n)


def skip_without_sanitizer():
    if not shutil.which("compute-sanitizer"):
        pytest.skip("compute-sanitizer not installed")


def assert_sanitizer_clean(tool, binary, d, *args):
    """binary on model d on the GPU with args under compute-sanitizer's tool: memcheck (no invalid
    access, no leak of a launch's error) or racecheck (no shared-memory hazard, error or warning)."""
    r = subprocess.run(["compute-sanitizer", "--tool", tool, "--error-exitcode", "3", *binary.argv("-m", str(d)),
                        "--device", "cuda", *args], capture_output=True, timeout=900)
    out = (r.stdout + r.stderr).decode(errors="replace")  # sampled text of a random model: any bytes
    clean = {"memcheck": "ERROR SUMMARY: 0 errors", "racecheck": "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"}
    assert r.returncode == 0 and clean[tool] in out, out[-6000:]


def assert_memcheck_clean(binary, d, *args):
    assert_sanitizer_clean("memcheck", binary, d, *args)


def assert_logits_and_text_equal_cpu(binary, d, tmp_path, prompt=TINY_PROMPT):
    """A build's GPU path against its CPU path on the prompt: every decode step's logits within
    GPU_CPU_TOLERANCE, and 48 greedy tokens' text equal (greedy_args)."""
    vocab = json.loads((d / "config.json").read_text())["vocab_size"]
    cpu = logits_of(binary, d, "cpu", prompt, tmp_path, vocab)
    err = compare_logits(logits_of(binary, d, "cuda", prompt, tmp_path, vocab), cpu)
    assert err < GPU_CPU_TOLERANCE, f"{d.name}: GPU against CPU {err:.2e}"
    args = greedy_args(d, prompt)
    assert run(binary, *args, "--device", "cuda").stdout == run(binary, *args, "--device", "cpu").stdout


@pytest.mark.parametrize("flags", [SPLIT_MLP, "smem_carveout=-1", "att_o_short=1",
                                   "att_trigger_early=3", "o_proj_trigger_shortest=0"])
def test_tiny_gpu_fused_mlp_equal_cpu(flags, tmp_path):
    """tiny-d2048, where the decode MLP is one kernel by default (that build runs in tiny_gpu's
    tests), with the plan's other paths: gate/up and down instead, the fused MLP with the driver's
    carveouts, after the short context's joined attention/o_proj grid, with both attention kernels letting o_proj
    launch as they start, and with o_proj letting the MLP launch only after its wait: logits and
    greedy text against the CPU's."""
    d, binary = flags_build(FUSED_MLP_MODEL, flags)
    fused = 0 if "mlp_fused=0" in flags else 1
    assert f"#define MODEL_MLP_FUSED {fused} " in (REPO / "generated" / d.name / "model_plan.h").read_text()
    assert_logits_and_text_equal_cpu(binary, d, tmp_path)


@pytest.mark.parametrize("flags", ["", "o_proj_trigger_shortest=0"])
def test_tiny_gpu_fused_mlp_past_one_split_equal_cpu(flags, tmp_path):
    """tiny-d2048's fused MLP across 256 positions, where the default's o_proj stops letting the
    MLP launch before its wait (MODEL_O_PROJ_TRIGGER_SHORTEST), and with o_proj never doing so.
    Three times TINY_PROMPT (441 tokens, its logits a position at a time) and 48 more cross from
    the one-split graphs at 256. Logits of every step and greedy text against the CPU's."""
    if flags:
        d, binary = flags_build(FUSED_MLP_MODEL, flags)
    else:
        d = tiny_model_dir(FUSED_MLP_MODEL)
        binary = binary_for(d, "specialized")
    assert_logits_and_text_equal_cpu(binary, d, tmp_path, prompt=" ".join([TINY_PROMPT] * 3))


@pytest.mark.parametrize("flags", ["", "smem_carveout=-1", SPLIT_MLP])
def test_tiny_gpu_fused_mlp_at_4096_equal_cpu(flags, tmp_path):
    """tiny-d4096's fused MLP (a hidden unit's rows to two warps, 8 units a batch, 8 output columns a
    lane): the default, with the driver's carveouts,
    and the split build. Three times TINY_PROMPT (441 tokens) and 48 more cross from the one-split
    graphs at 256: logits of every step and greedy text against the CPU's."""
    if flags:
        d, binary = flags_build(FUSED_MLP_4096, flags)
    else:
        d = tiny_model_dir(FUSED_MLP_4096)
        binary = binary_for(d, "specialized")
    fused = 0 if "mlp_fused=0" in flags else 1
    assert f"#define MODEL_MLP_FUSED {fused} " in (REPO / "generated" / d.name / "model_plan.h").read_text()
    assert_logits_and_text_equal_cpu(binary, d, tmp_path, prompt=" ".join([TINY_PROMPT] * 3))


@pytest.mark.parametrize("model,flags", [(FUSED_MLP_MODEL, ""), (FUSED_MLP_4096, "")])
def test_fused_mlp_memcheck_clean(model, flags):
    """The fused MLP (bulk copies onto mbarriers, its input's among them, reductions into the
    residual stream's buffers), with its input by the threads' loads, and at a hidden size of 4096
    (a unit's rows to two warps), under compute-sanitizer's memcheck: a prompt that crosses 256
    positions."""
    skip_without_sanitizer()
    d, binary = flags_build(model, flags)
    assert_memcheck_clean(binary, d, "-p", " ".join([TINY_PROMPT] * 3), "-n", "8", "--temp", "0")


@pytest.mark.parametrize("variant", ["tiny-gqa", "tiny-qwen2"])
def test_tiny_gpu_residual_pairs_equal_cpu(variant, tmp_path):
    """o_proj and down with a pair of rows a warp (the plan takes them where the rows pass a wave's
    warps, as on the 7B shapes, never on a tiny model), forced with residual_pairs=1 in a build of
    its own: logits and greedy text against the CPU's."""
    d, binary = flags_build(variant, RES_PAIRS)
    assert_logits_and_text_equal_cpu(binary, d, tmp_path)


@pytest.mark.parametrize("variant,flags", [("tiny-wide", "pair_lot=0 res_lot=0"),
                                           ("tiny-wide", "pair_lot=1 res_lot=1 residual_pairs=1"),
                                           ("tiny-gqa", "pair_lot=1 res_lot=2")])
def test_tiny_gpu_early_lots_equal_cpu(variant, flags, tmp_path):
    """The early loads before the programmatic-dependent-launch wait, in other lots than the
    plan's (codegen/plan.py, _pair_lot and _res_lot: two lots of QKV's and gate/up's MODEL_PAIR_EARLY
    chunks and four of o_proj's and down's MV_UNROLL where the rows fill them, as tiny-wide's do, so
    the other GPU tests on tiny-wide run those): tiny-wide's all at once (one lot, what the lots were
    measured against: docs/performance.md, D53), lots of one chunk with pairs of rows, and tiny-gqa's
    short rows in lots.
    Logits and greedy text against the CPU's."""
    d, binary = flags_build(variant, flags)
    assert_logits_and_text_equal_cpu(binary, d, tmp_path)


@pytest.mark.parametrize("flags", ["pair_unroll=4", "qkv_async=2 pair_unroll=4"])
def test_tiny_gpu_pair_async_equal_cpu(flags, tmp_path):
    """QKV's later row steps copied into shared memory on cp.async (qkv_async: the plan has one
    async step of 8 chunks a lane on tiny-wide, as on the 1B, which every other tiny-wide test
    runs), on tiny-wide (rows of 2176: 272 chunks, so the last step is partial), in builds of their
    own: one async step of 4 and a third step from registers; two of 4, the second partial. Logits
    and greedy text against the CPU's."""
    d, binary = flags_build("tiny-wide", flags)
    assert_logits_and_text_equal_cpu(binary, d, tmp_path)


@pytest.mark.parametrize("blocks,unroll", [(136, 8), (80, 4)])
def test_tiny_gpu_qkv_split_last_equal_cpu(blocks, unroll, tmp_path):
    """QKV's last round of pairs split by K between two warps (QKV_SPLIT_LAST) on tiny-wide, its
    1536 pairs on fewer blocks (GRID_QKV) so that they take rounds: 136 blocks (1088 warps) leave 448
    pairs after one round, 3 or 4 warp pairs a block, each row's 272 chunks in two steps of 8 (the
    second partial), after a first round on the plan's cp.async copies; 80 blocks (640 warps) leave
    256 after two rounds, in three steps of 4, split one and two. Logits
    and greedy text against the CPU's."""
    pairs, warps = (2048 + 2 * 512) // 2, blocks * 8
    assert pairs > warps and 0 < 2 * (pairs % warps) <= warps, "the grid must leave a split last round"
    d, binary = flags_build("tiny-wide", split_last_flags(blocks, unroll))
    assert_logits_and_text_equal_cpu(binary, d, tmp_path)


@pytest.mark.parametrize("variant", ["tiny-group3", "tiny-wide"])
@pytest.mark.parametrize("chunk", ["", " att_min_chunk=5"])
def test_tiny_gpu_staged_values_equal_cpu(variant, chunk, tmp_path):
    """Decode attention's first round of values staged in shared memory with the keys (the plan's
    choice on the 1B shape; att_stage_values=1 in a build of its own here): heads of 64 in
    groups of 3 (the staged rows' 16-byte alignment after an odd group's sums) and of 128 (splits
    past one round: later rounds from registers), in one split of the whole context and in splits of
    5 positions (a tile's rows past the split zero-filled); without the short context's kernel
    (att_short=0), which would take every step of tiny-group3's. Logits and greedy text against the
    CPU's."""
    d, binary = flags_build(variant, staged_flags(chunk))
    assert_logits_and_text_equal_cpu(binary, d, tmp_path)


@pytest.mark.parametrize("variant", ["tiny-group3", "tiny-wide"])
def test_tiny_gpu_split_attention_at_short_context_equals_cpu(variant, tmp_path):
    """The decode attention's split kernel (attention_body) at the short contexts that the plan gives
    to attention_short_body (ATT_SHORT; the other tests on these two variants run that kernel up to
    256 positions on heads of 64, every step of tiny-group3's, and 128 on heads of 128): here
    att_short=0, a build of its own. Logits and greedy text against the CPU's."""
    d, binary = flags_build(variant, NO_SHORT)
    assert_logits_and_text_equal_cpu(binary, d, tmp_path)


def test_tiny_gpu_short_attention_splits_equal_cpu(tmp_path):
    """tiny-group3 with a context of 2048 (tests/models/tiny-group3-long): on heads of 64 a split of
    ATT_MIN_CHUNK (256) positions is one round of tiles a warp, so the short context's kernel takes
    the steps in splits of 256 a KV head, combined by the last (attention_combine), up to
    short_kernel_positions; the steps that read at most 256 positions take the graphs that launch
    it in one split (model_cuda's graphs[3]). Three times TINY_PROMPT (441 tokens, its logits a
    position at a time) and 48 more cross 256 twice. Logits of every step and greedy text against
    the CPU's."""
    d = tiny_model_dir("tiny-group3-long")
    assert_logits_and_text_equal_cpu(binary_for(d, "specialized"), d, tmp_path, prompt=" ".join([TINY_PROMPT] * 3))


@pytest.mark.parametrize("variant", ["tiny-group3-long", "tiny-wide"])
def test_tiny_gpu_short_attention_joined_with_o_proj_equal_cpu(variant, tmp_path):
    """The short context's attention and o_proj in one grid (ATT_O_SHORT: the plan's on the 7B-like
    shapes, none of the tiny models; here forced on) with o_proj's blocks waiting on the count of
    KV groups whose outputs attention_short_body has written (att_o_poll=0; the plan's polling is
    the next test's). On
    tiny-group3-long (heads of 64 in groups of 3) three times TINY_PROMPT crosses its splits of 256,
    so the count comes from the combining block; on tiny-wide (heads of 128) from the one split,
    the steps past 128 positions in the separate kernels. Logits and greedy text against the CPU's."""
    prompt = " ".join([TINY_PROMPT] * 3) if variant == "tiny-group3-long" else TINY_PROMPT
    d, binary = flags_build(variant, ATT_O_SHORT)
    assert_logits_and_text_equal_cpu(binary, d, tmp_path, prompt=prompt)


@pytest.mark.parametrize("variant", ["tiny-group3-long", "tiny-wide"])
def test_tiny_gpu_joined_o_proj_polls_outputs_equal_cpu(variant, tmp_path):
    """ATT_O_POLL, the joined short grid's default: there (forced on) o_proj's blocks poll attention's outputs
    themselves (words that read ATT_POLL_WORD until written, put back by the gate/up kernel)
    instead of waiting on attention's count. tiny-group3-long: the outputs from the combining
    block (three times TINY_PROMPT crosses its splits of 256); tiny-wide: from the one split.
    Logits and greedy text against the CPU's."""
    prompt = " ".join([TINY_PROMPT] * 3) if variant == "tiny-group3-long" else TINY_PROMPT
    d, binary = flags_build(variant, ATT_O_POLL)
    assert_logits_and_text_equal_cpu(binary, d, tmp_path, prompt=prompt)


@pytest.mark.parametrize("variant,flags", [("tiny-gqa", "down_poll=1"),
                                           ("tiny-wide", "down_poll=1 poll_vec=2"),
                                           ("tiny-group3", "down_poll=1")])
def test_tiny_gpu_down_polls_gate_up_equal_cpu(variant, flags, tmp_path):
    """Down's blocks poll gate/up's outputs (DOWN_POLL, the plan's on the 1B and 7B shapes, none of
    the tiny models; here forced on: words that read ATT_POLL_WORD until written, put back by the
    next layer's QKV kernel) instead of waiting for gate/up's grid to end, polling as they stage it;
    POLL_VEC=2: a thread's five float4s of tiny-wide's input in three rounds of polls; tiny-group3:
    SmolLM2's attention shape. Logits and greedy text against the CPU's."""
    d, binary = flags_build(variant, flags)
    assert_logits_and_text_equal_cpu(binary, d, tmp_path)


@pytest.mark.parametrize("variant,flags", [("tiny-gqa", "prefill_batch=16"), ("tiny-wide", "prefill_batch=16"),
                                           ("tiny-gqa", "prefill_batch=32"),
                                           ("tiny-group3", MMA_SYNC), ("tiny-gqa", GATE_UP_GEMM),
                                           ("tiny-wide", GATE_UP_GEMM),
                                           ("tiny-group3", f"{GATE_UP_GEMM} {MMA_SYNC}"),
                                           ("tiny-gqa", f"{GATE_UP_GEMM} {MMA_SYNC}"), ("tiny-wide", f"{GATE_UP_GEMM} {MMA_SYNC}"),
                                           ("tiny-wide", f"prefill_batch=32 {GATE_UP_GEMM} {MMA_SYNC}"),
                                           ("tiny-llama3", MMA_SYNC),
                                           ("tiny-group3", "fmma_tile=16"),
                                           ("tiny-gqa", TMA_WIDE), ("tiny-wide", TMA_WIDE), ("tiny-group3", TMA_WIDE),
                                           ("tiny-gqa", "prefill_batch=64"), ("tiny-wide", f"prefill_batch=64 {TMA_WIDE}"),
                                           ("tiny-gqa", "prefill_batch=128"), ("tiny-wide", "prefill_batch=128"),
                                           ("tiny-group3", f"prefill_batch=128 {TMA_WIDE}"),
                                           ("tiny-q4_1", MMA_SYNC), ("tiny-q4_k_m", MMA_SYNC),
                                           ("tiny-q8_0", "prefill_batch=32")])
def test_tiny_gpu_prefill_builds_near_cpu(variant, flags, tmp_path):
    """The prefill's builds other than the default, each in a build of its own: batches of at most
    16 or 32 (two 8-token tiles in each mma row tile, two chunks of K in flight a warp), gate/up as
    a GEMM on every model (by default only where its tiles fill the GPU, which no tiny model's do):
    K of one stage and a partial tile (tiny-gqa), 34 stages (tiny-wide); the GEMMs on mma.sync
    instead of Hopper's wgmma (gemm_wgmma=0), with o_proj's and QKV's biases (tiny-llama3); the
    tensor cores' flash attention in tiles of 16 positions (ten a split: the running max and sum
    across tiles); gate/up's GEMM on wgmma (its tiles copied by TMA: tiny-gqa one K tile, rows past
    the matrix zero-filled; tiny-wide 34) at two warpgroups a block (TMA_WIDE: tiny-gqa's three
    blocks, the last half past the matrix; tiny-wide; tiny-group3); batches of at most 64 (64, 64,
    16 of TINY_PROMPT's tokens), there with gate/up's two warpgroups a block; batches of at most 128
    (128 and 32 of TINY_PROMPT's tokens, there with two warpgroups on tiny-group3); the block formats'
    GEMMs (tiles dequantized by the threads, gemm_q_tiles) on mma.sync, and Q8_0's at batches of 32.
    The prompt path's logits against the CPU's (assert_prompt_path_near_cpu): the whole prompt at
    once, its last position, and its first PREFILL_DUMP_FROM tokens, the rest a step a token on the
    keys and values it wrote. (The default build: batches of 256 with every matvec a GEMM over
    splits of K, as many as K's tiles allow on tiny models, on wgmma, 256 columns; TINY_PROMPT's 148
    tokens go as one batch of 256, the smallest that covers them, run through its last layer for
    the last token's choice; the prefill_batch=32 builds run its kernels at 32.)"""
    d, binary = flags_build(variant, flags)
    n = len(Tokenizer.from_file(str(d / "tokenizer.json")).encode(TINY_PROMPT).ids)
    for fed in (n, PREFILL_DUMP_FROM):
        assert_prompt_path_near_cpu(binary, d, tmp_path, fed)


@pytest.mark.parametrize("variant,flags,fed", [("tiny-gqa", None, PREFILL_DUMP_FROM), ("tiny-wide", None, PREFILL_DUMP_FROM),
                                               ("tiny-group3", None, PREFILL_DUMP_FROM), ("tiny-qwen2", None, PREFILL_DUMP_FROM),
                                               ("tiny-llama3", None, PREFILL_DUMP_FROM), ("tiny-gqa", "prefill_batch=128", 130),
                                               ("tiny-gqa", "prefill_batch=128", 129),
                                               ("tiny-group3", None, 3), ("tiny-wide", TMA_WIDE, PREFILL_DUMP_FROM),
                                               ("tiny-gqa", "prefill_batch=64", PREFILL_DUMP_FROM),
                                               ("tiny-gqa", None, 2)])
def test_tiny_gpu_prefill_logits_match_cpu(variant, flags, fed, tmp_path):
    """--dump-prefill: TINY_PROMPT's first `fed` tokens fed at once, then one at a time; the GPU's
    logits from position fed - 1 on (every one after keys and values the prompt path wrote) against
    the CPU's token by token (GPU_PROMPT_TOLERANCE): the default build (batches of 256; the first
    logits from the last batch's last token: the last layer run through, its row to the LM head),
    in a build of batches of 128 a batch of 128 and then a batch of 8 holding 2 tokens (130), or a
    step (129: one token left goes as a step), a batch of 8 holding 3 tokens (3) and 2 (2), gate/up's two warpgroups forced,
    batches of at most 64."""
    if flags is None:
        d = tiny_model_dir(variant)
        binary = binary_for(d, "specialized")
    else:
        d, binary = flags_build(variant, flags)
    assert_prompt_path_near_cpu(binary, d, tmp_path, fed)


@pytest.mark.parametrize("variant", ["tiny-gqa", "tiny-wide", "tiny-group3"])
def test_tiny_gpu_attention_odd_chunks_equal_cpu(variant, tmp_path):
    """Attention chunks of 5 positions (att_min_chunk=5, in a build of its own): a decode step's
    attention in many splits, combined (tiny-gqa: attention_body, one output a thread; tiny-wide and
    tiny-group3: the short context's kernel, heads of 128 and 64, the float4 form and the plain one,
    ~39 splits in rounds of loads); and on tiny-gqa a prefill attention block's group of
    tokens (4 here: 2 query heads a KV head, 8 rows) straddling the bounds of the chunks, so a row
    can see none of a chunk's positions (max -inf, weight 0 in the combine). Greedy text against the
    CPU's, and the prompt path's logits."""
    d, binary = flags_build(variant, ATT_CHUNK5)
    args = greedy_args(d)
    assert run(binary, *args, "--device", "cuda").stdout == run(binary, *args, "--device", "cpu").stdout
    assert_prompt_path_near_cpu(binary, d, tmp_path)


@pytest.mark.parametrize("variant", ["tiny-gqa", "tiny-group3"])
def test_tiny_gpu_combine_early_equal_cpu(variant, tmp_path):
    """The combine's partial sums loaded with the splits' (max, sum) (ATT_COMBINE_EARLY: the plan's
    64 on these shapes, here 16) with chunks of 5 positions (att_min_chunk=5: ~39 splits, so past
    the 16 loaded early too), in builds of their own: tiny-gqa's attention_body (decode, and prefill groups whose rows
    can see none of a split) and tiny-group3's short context's kernel. Logits and greedy text
    against the CPU's."""
    d, binary = flags_build(variant, COMBINE_EARLY)
    assert_logits_and_text_equal_cpu(binary, d, tmp_path)


@pytest.mark.parametrize("variant", ["tiny-group3", "tiny-wide"])
def test_tiny_gpu_flash_prefill_odd_chunks_near_cpu(variant, tmp_path):
    """The prefill attention with every query row of a batch in a block (prefill_flash_mma_body:
    heads of 64 and 128, groups of 3 and 4) with chunks of 5 positions (CHUNK5): many splits, a
    tile's positions past its split, rows that see none of a split, the last block's combine; the
    prompt's first batch (32 positions, at most PREFILL_FEW_SPLITS x 5) in the graphs with 8 splits,
    the later ones in those with all the context's splits. The prompt path's logits against the
    CPU's, the whole prompt at once and its first PREFILL_DUMP_FROM tokens."""
    d, binary = flags_build(variant, CHUNK5)
    n = len(Tokenizer.from_file(str(d / "tokenizer.json")).encode(TINY_PROMPT).ids)
    for fed in (n, PREFILL_DUMP_FROM):
        assert_prompt_path_near_cpu(binary, d, tmp_path, fed)


def test_tiny_gpu_short_attention_graphs_equal_cpu(tmp_path):
    """tiny-gqa with a context of 262144 (tests/models/tiny-long-context): past ATT_MIN_SPLITS tiles
    (2 KV heads: 132 splits of 1024 positions), so the binary launches a second set of graphs, with
    132 attention splits instead of 256, for the steps and prefill batches that read fewer positions
    (all of these). Greedy text against the CPU's, and the prompt path's logits."""
    d = tiny_model_dir("tiny-long-context")
    binary = binary_for(d, "specialized")
    args = greedy_args(d)
    assert run(binary, *args, "--device", "cuda").stdout == run(binary, *args, "--device", "cpu").stdout
    assert_prompt_path_near_cpu(binary, d, tmp_path)


# --kv-cache q8 (runtime/cuda_kv.cuh): the GPU and the CPU store the same int8 elements and scales
# (runtime/model.h's contract) and both fold the scales into the scores and probabilities, the GPU
# reading the elements as exact fp16 integers. What they differ by is a key or value element that
# the two QKVs' summation orders put on either side of a rounding boundary: an fp16 cache moves it
# by 2^-11 of itself, a q8 cache by one int8 step, 1/127 of its vector's largest element, about 16
# times as far; so GPU_CPU_Q8_TOLERANCE is 16 times GPU_CPU_TOLERANCE (1e-3 failed on 6 of the 8
# cases on an H100, one by 1.9e-3; at 10 times, tiny-q4_k_m's prompt path measured 1.01e-2 on an
# H100 at b350378, where every case had measured 7.4e-3 or less at 8f6a3af). The
# cases take every kernel that reads or writes the cache: tiny-gqa (heads of 16) attention_body's
# fp32 path in decode and its prefill blocks of tokens, in splits of 5 too; tiny-group3 (64) and
# tiny-wide (128) the tensor-core decode attention, the short context's kernel and the flash prefill,
# in splits of 5 (many splits, tiles past a split, the combine) and with the short kernel joined to
# o_proj; a quantized model (tiny-q4_k_m). Against the same binary's fp16 cache, the int8 rounding
# (at most 1/254 of a vector's largest element) moves these logits by less than KV_Q8_FROM_F16.
KV_Q8_CASES = [("tiny-gqa", None), ("tiny-gqa", ATT_CHUNK5), ("tiny-group3", None), ("tiny-group3", CHUNK5),
               ("tiny-wide", None), ("tiny-wide", CHUNK5), ("tiny-wide", ATT_O_SHORT), ("tiny-q4_k_m", None)]
KV_Q8_FROM_F16 = 3e-2
GPU_CPU_Q8_TOLERANCE = 16 * GPU_CPU_TOLERANCE


def kv_case(variant, flags):
    if flags is None:
        d = tiny_model_dir(variant)
        return d, binary_for(d, "specialized")
    return flags_build(variant, flags)


def kv_logits(binary, d, device, kv, tmp_path, fed=None):
    """TINY_PROMPT's logits with --kv-cache kv: a step a token, or (fed) its first fed tokens through
    the prompt path and the rest a step a token"""
    vocab = json.loads((d / "config.json").read_text())["vocab_size"]
    out = tmp_path / f"kv-{device}-{kv}-{fed}.bin"
    extra = ["--dump-prefill", str(fed)] if fed else []
    run(binary, "-m", str(d), "--device", device, "--kv-cache", kv, "--dump-logits", str(out), *extra, "-p", TINY_PROMPT,
        "--threads", "4")
    return np.fromfile(out, dtype=np.float32).reshape(-1, vocab)


@pytest.mark.parametrize("variant,flags", KV_Q8_CASES)
def test_tiny_gpu_kv_q8_near_f16(variant, flags, tmp_path):
    """The GPU's q8 cache against its fp16 cache: the decode steps' logits and the prompt path's
    (PREFILL_DUMP_FROM tokens at once, whose 16-bit inputs spread any difference to their own
    rounding's size: GPU_PROMPT_TOLERANCE beside), within the int8 rounding's reach and not equal"""
    d, binary = kv_case(variant, flags)
    for fed in (None, PREFILL_DUMP_FROM):
        q8, f16 = kv_logits(binary, d, "cuda", "q8", tmp_path, fed), kv_logits(binary, d, "cuda", "f16", tmp_path, fed)
        err = compare_logits(q8, f16)
        print(f"{variant} {flags or ''} fed {fed}: q8 cache against fp16 {err:.2e}")
        bound = KV_Q8_FROM_F16 + (GPU_PROMPT_TOLERANCE if fed else 0)
        assert 0 < err < bound, f"{variant} {flags or ''} fed {fed}: q8 cache against fp16 {err:.2e}"


@pytest.mark.parametrize("variant,flags", KV_Q8_CASES)
def test_tiny_gpu_kv_q8_matches_cpu(variant, flags, tmp_path):
    """The GPU's q8 cache against the CPU's: the decode steps' logits, the prompt path's (with its
    rounding's GPU_PROMPT_TOLERANCE beside), and greedy text"""
    d, binary = kv_case(variant, flags)
    for fed in (None, PREFILL_DUMP_FROM):
        gpu = kv_logits(binary, d, "cuda", "q8", tmp_path, fed)
        cpu = kv_logits(binary, d, "cpu", "q8", tmp_path)[(fed or 1) - 1:]
        err = compare_logits(gpu, cpu)
        print(f"{variant} {flags or ''} fed {fed}: GPU q8 against CPU q8 {err:.2e}")
        tolerance = GPU_CPU_Q8_TOLERANCE + (GPU_PROMPT_TOLERANCE if fed else 0)
        assert err < tolerance, f"{variant} {flags or ''} fed {fed}: GPU q8 against CPU q8 {err:.2e}"
    args = greedy_args(d, TINY_PROMPT, "--kv-cache", "q8")
    assert run(binary, *args, "--device", "cuda").stdout == run(binary, *args, "--device", "cpu").stdout


def test_gpu_bench_kernels_times_decode_and_prefill():
    """--bench-kernels on the GPU: per depth, the decode step's table (as make compare reads it), the
    steps' time in one graph and a graph a step, and for each prefill batch size, full, its splits of K and a table,
    every stage launched as the batch runs them, and the batch's time as its graph; the decode that
    follows still runs."""
    import re
    import sys

    sys.path.insert(0, str(REPO / "tests" / "bench"))
    import compare

    d = tiny_model_dir("tiny-llama")
    binary = binary_for(d, "specialized")
    out = run(binary, "-m", str(d), "--device", "cuda", "--bench", "--bench-kernels", "--bench-depths", "0,32", "-n", "8").stdout
    out = out.decode() if isinstance(out, bytes) else out
    assert sorted(compare.parse_kernel_tables(out)) == [1, 33]
    assert len(re.findall(r"decode at depth \d+: 8 tokens", out)) == 2, out
    steps = re.findall(r"steps at depth (\d+), 8 greedy steps \(best of \d+\): in one graph ([\d.]+) us/token, "
                       r"a graph a step ([\d.]+) us/token", out)
    assert steps and all(float(one) > 0 and float(each) > 0 for _, one, each in steps), out
    full = re.search(r"a prefill batch of (\d+) tokens at depth 1 ", out)
    assert full, out
    sizes = [int(full[1]) >> s for s in range(int(full[1]).bit_length() - 3)]  # down to 8
    assert sizes[-1] == 8, sizes
    for depth in (1, 33):
        for size in sizes:
            head = f"a prefill batch of {size} tokens at depth {depth} "
            assert head in out, out
            lines = out.split(head, 1)[1].splitlines()
            splits = re.fullmatch(r"\(launched one by one, best of \d+; K in (\d+), (\d+), (\d+) splits for QKV, o_proj, down\):",
                                  lines[0])
            assert splits and all(int(n) >= 1 for n in splits.groups()), lines[0]
            rows = lines[2:11]  # after the header and the column names
            launches = {r.split()[0]: int(r.split()[1]) for r in rows}
            # tiny-llama, 2 layers: the last layer's scales and QKV only
            assert launches == {"prefill_embed": 1, "prefill_rms_terms": 3, "prefill_qkv_rope": 2, "prefill_attention": 1,
                                "prefill_o_proj": 1, "prefill_gate_up_silu": 1, "prefill_down": 1, "prefill_end": 1,
                                "total": 11}, rows
            assert all(float(r.split()[2]) > 0 for r in rows), rows
            graph = re.fullmatch(r"  as its graph: ([\d.]+) us/batch, the layers' weights at (\d+) GB/s", lines[11])
            assert graph and float(graph[1]) > 0, lines[11]


def test_tiny_gpu_matches_transformers(tiny_gpu, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    d, binary = tiny_gpu
    model = transformers.AutoModelForCausalLM.from_pretrained(str(d), torch_dtype=torch.float32).eval()
    ids = Tokenizer.from_file(str(d / "tokenizer.json")).encode(TINY_PROMPT).ids
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0].double().numpy()
    got = logits_of(binary, d, "cuda", TINY_PROMPT, tmp_path, want.shape[-1])
    err = compare_logits(got, want)
    assert err < GPU_HF_TOLERANCE, f"{d.name}: GPU against transformers {err:.2e}"
    # the prompt path: the first PREFILL_DUMP_FROM tokens at once, the rest a step a token
    err = compare_logits(prompt_logits(binary, d, tmp_path, want.shape[-1]), want[PREFILL_DUMP_FROM - 1:])
    print(f"{d.name}: the prompt path against transformers {err:.2e}")
    assert err < GPU_PROMPT_TOLERANCE, f"{d.name}: the prompt path against transformers {err:.2e}"


@pytest.fixture(scope="module")
def default_gpu():
    """The default model's own build: its Q4_1 / Q8_0 matrices on the device (the generic build
    refuses quantized weights on the GPU: test_generic_gpu_refuses_quantized)."""
    if not (DEFAULT_MODEL / "model.safetensors").exists():
        pytest.skip("default model not on this machine: stage it (README.md, 'GPU') to run these")
    return binary_for(DEFAULT_MODEL, "specialized")


def test_default_model_gpu_matches_cpu(default_gpu, tmp_path):
    """The decode step's logits against the CPU's, and the prompt path's (TINY_PROMPT's first 40
    tokens at once, in fp16: the model's quantized matrices are dequantized so for the tensor cores)"""
    prompt = "The history of the Roman Empire"
    gpu = logits_of(default_gpu, DEFAULT_MODEL, "cuda", prompt, tmp_path, 49152)
    cpu = logits_of(default_gpu, DEFAULT_MODEL, "cpu", prompt, tmp_path, 49152)
    err = compare_logits(gpu, cpu)
    assert err < GPU_CPU_TOLERANCE, f"SmolLM2: GPU against CPU {err:.2e}"
    assert_prompt_path_near_cpu(default_gpu, DEFAULT_MODEL, tmp_path, 40)


@pytest.mark.parametrize("prompt", ["The history of the Roman Empire", "def fibonacci(n):"])
def test_default_model_greedy_64_tokens_equal_cpu(default_gpu, prompt):
    args = ["-p", prompt, "-n", "64", "--temp", "0", "--threads", "8", "--exact-prompt"]
    gpu = run(default_gpu, *args, "--device", "cuda").stdout
    cpu = run(default_gpu, *args, "--device", "cpu").stdout
    assert gpu == cpu


@pytest.mark.parametrize("prompt", ["Once upon a time", "def fibonacci(n):"])
def test_default_model_penalty_greedy_equals_cpu(default_gpu, prompt):
    """The repetition penalty applied on the device, greedy: the same 64 tokens as the CPU. Not every
    prompt can show it: after "The history of the Roman Empire" the 36th choice is a near tie on the
    CPU ('8' 26.89411 against '1' 26.89338 after the penalty, 3e-5 apart), below the GPU's rounding
    differences (1e-4), and the two paths part there (measured on the H200)."""
    args = ["-p", prompt, "-n", "64", "--temp", "0", "--repeat-penalty", "1.3", "--threads", "8", "--exact-prompt"]
    assert run(default_gpu, *args, "--device", "cuda").stdout == run(default_gpu, *args, "--device", "cpu").stdout


def test_default_model_chat_on_gpu(default_gpu):
    r = run(default_gpu, "--device", "cuda", "--chat", "-p", "What is the capital of France?", "--temp", "0")
    assert "Paris" in r.stdout.decode()


@pytest.mark.parametrize("variant,flags", [("tiny-wide", GATE_UP_GEMM), ("tiny-wide", CHUNK5), ("tiny-group3", CHUNK5),
                                           ("tiny-wide", f"{GATE_UP_GEMM} {MMA_SYNC}"), ("tiny-wide", TMA_WIDE)])
def test_prefill_builds_memcheck_clean(variant, flags):
    """Prefill kernels under compute-sanitizer's memcheck: the gate/up GEMM (forced on, tiny-wide:
    34 stages), on wgmma (its tiles copied by TMA) and on mma.sync, and the attention on the tensor
    cores (splits of 5 positions: tiles mostly past their split's end, and the combine); the TMA
    body at two warpgroups a block. The default build's (QKV, o_proj and down as GEMMs over
    splits of K) run under test_memcheck_clean."""
    skip_without_sanitizer()
    d, binary = flags_build(variant, flags)
    assert_memcheck_clean(binary, d, "-p", TINY_PROMPT, "-n", "4", "--temp", "0")


@pytest.mark.parametrize("variant, build", [("tiny-gqa", b) for b in BUILDS] + [("tiny-group3", "specialized"),
                                                                              ("tiny-wide", "specialized"),
                                                                              ("tiny-q4_1", "specialized"),
                                                                              ("tiny-q4_k_m", "specialized")])
def test_memcheck_clean(tmp_path, variant, build):
    """tiny-gqa (heads of 16) runs the fp32 attention and the grouped prefill; tiny-group3 and
    tiny-wide (heads of 64 and 128) the specialized build's tensor-core decode attention and flash
    prefill (codegen/plan.py: _att_mma, _prefill_flash); tiny-q4_1 and tiny-q4_k_m the block
    formats' decode matvecs and prompt GEMMs (a K tile half past K; w_kany's mixed rows); the fused
    MLP: test_fused_mlp_memcheck_clean."""
    skip_without_sanitizer()
    d = tiny_model_dir(variant)
    assert_memcheck_clean(binary_for(d, build), d, "-p", TINY_PROMPT, "-n", "8", "--temp", "0.8",
                          "--repeat-penalty", "1.2")


@pytest.mark.parametrize("variant, build", [("tiny-gqa", b) for b in BUILDS] + [("tiny-group3", "specialized"),
                                                                              ("tiny-wide", "specialized"),
                                                                              (FUSED_MLP_MODEL, "specialized")])
def test_racecheck_clean(variant, build):
    """A prompt batch's kernels, the decode steps' and the sampler's under compute-sanitizer's
    racecheck: no shared-memory hazard. The variants are test_memcheck_clean's (the fp32 and
    tensor-core attentions, the grouped and flash prefills, the GEMMs) and tiny-d2048's fused MLP."""
    skip_without_sanitizer()
    d = tiny_model_dir(variant)
    assert_sanitizer_clean("racecheck", binary_for(d, build), d, "-p", TINY_PROMPT, "-n", "4", "--temp", "0.8",
                           "--repeat-penalty", "1.2")
