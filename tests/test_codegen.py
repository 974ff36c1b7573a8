"""The generator: spec derivation, refusal of what it cannot build, deterministic output checked
against a golden copy, and the version lock between generated code and runtime."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from codegen.render import GENERATOR_VERSION, c_float, c_string
from codegen.spec import SpecError, load_spec, spec_from_config
from conftest import REPO

GOLDEN = REPO / "tests" / "golden" / "tiny-gqa"
LLAMA_1B = REPO / "models" / "llama-3.2-1b-instruct" / "config.json"


def load(path):
    return json.loads(path.read_text())


def spec_of(cfg):
    return spec_from_config(cfg, json.dumps(cfg).encode(), "config.json", "m")


def base_config():
    return load(REPO / "tests" / "models" / "tiny-llama" / "config.json")


def test_spec_derives_dimensions():
    s = spec_of(load(REPO / "tests" / "models" / "tiny-gqa" / "config.json"))
    assert (s.dim, s.n_heads, s.n_kv_heads, s.head_dim) == (64, 4, 2, 16)
    assert (s.q_dim, s.kv_dim, s.kv_mul) == (64, 32, 2)
    assert s.tied_embeddings and not s.qkv_bias and s.dtype == "BF16"
    assert "lm_head.weight" not in [t.name for t in s.tensors]
    # weights read per token: every matrix and norm once, one embedding row... but tied: all of it
    per_layer = 64 + 64 * 64 + 2 * 32 * 64 + 64 * 64 + 64 + 3 * 160 * 64
    assert s.weight_bytes == 2 * (3 * per_layer + 64 + 400 * 64)
    assert s.kv_bytes_per_pos == 3 * 2 * 32 * 2


def test_spec_qwen2_has_qkv_bias():
    s = spec_of(load(REPO / "tests" / "models" / "tiny-qwen2" / "config.json"))
    assert s.qkv_bias
    assert [t.field for t in s.tensors if t.layer == 0][4:7] == ["bq", "bk", "bv"]


def test_llama3_rope_scaling_matches_hf_formula():
    cfg = load(LLAMA_1B)
    s = spec_of(cfg)
    assert s.rope_scaling == "llama3" and s.head_dim == 64 and s.tied_embeddings
    theta, d = cfg["rope_theta"], 64
    sc = cfg["rope_scaling"]
    base = [theta ** (-2 * i / d) for i in range(d // 2)]
    # high frequencies (short wavelengths) are kept, low ones divided by factor
    assert s.rope_inv_freq[0] == base[0]
    assert math.isclose(s.rope_inv_freq[-1], base[-1] / sc["factor"], rel_tol=1e-12)
    # one in the smoothed band, computed by hand from _compute_llama3_parameters
    for i, f in enumerate(base):
        wavelen = 2 * math.pi / f
        lo, hi = sc["original_max_position_embeddings"] / sc["low_freq_factor"], sc["original_max_position_embeddings"] / sc["high_freq_factor"]
        if hi <= wavelen <= lo:
            smooth = (sc["original_max_position_embeddings"] / wavelen - sc["low_freq_factor"]) / (sc["high_freq_factor"] - sc["low_freq_factor"])
            assert math.isclose(s.rope_inv_freq[i], (1 - smooth) * f / sc["factor"] + smooth * f, rel_tol=1e-12)
            break
    else:
        pytest.fail("no frequency in the smoothed band")


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("architectures", ["GPT2LMHeadModel"], "'architectures'"),
        ("hidden_act", "gelu", "'hidden_act' = 'gelu'"),
        ("num_key_value_heads", 3, "not a multiple of 'num_key_value_heads' = 3"),
        ("hidden_size", "64", "'hidden_size' = '64', expected an integer"),
        ("num_hidden_layers", 0, "'num_hidden_layers' = 0, expected a positive value"),
        ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}, "rope_scaling type 'yarn' is not supported"),
        ("torch_dtype", "int8", "'torch_dtype' = 'int8'"),
        ("mlp_bias", True, "'mlp_bias' = true"),
        ("eos_token_id", 100000, "'eos_token_id' 100000 is outside the vocabulary"),
    ],
)
def test_spec_refuses_naming_the_key(key, value, message):
    cfg = base_config()
    cfg[key] = value
    with pytest.raises(SpecError, match=re.escape(message)):
        spec_of(cfg)


def test_spec_refuses_missing_key_and_sliding_window():
    cfg = base_config()
    del cfg["intermediate_size"]
    with pytest.raises(SpecError, match="missing key 'intermediate_size'"):
        spec_of(cfg)
    cfg = copy.deepcopy(base_config())
    cfg["architectures"] = ["MistralForCausalLM"]
    cfg["sliding_window"] = 128
    with pytest.raises(SpecError, match="'sliding_window' = 128"):
        spec_of(cfg)


def test_plan_streams_follow_model_size():
    from codegen.plan import make_plan

    assert make_plan(spec_of(load(REPO / "models" / "smollm2-135m-instruct" / "config.json"))).cpu_streams == 1
    assert make_plan(spec_of(load(REPO / "models" / "mistral-7b-instruct-v0.2" / "config.json"))).cpu_streams == 4


def test_plan_pairs_residual_rows_past_one_wave():
    """o_proj and down take pairs of rows where the model's dim passes a wave's warps (2 blocks of 8
    on each of the H200's 132 SMs: 2112): the 7-8B shapes, not the 1B or SmolLM2."""
    from codegen.plan import make_plan

    pairs = {m: make_plan(spec_of(load(REPO / "models" / m / "config.json"))).residual_pairs
             for m in ("smollm2-135m-instruct", "llama-3.2-1b-instruct", "mistral-7b-instruct-v0.2",
                       "llama-3.1-8b-instruct", "qwen2.5-7b-instruct")}
    assert pairs == {"smollm2-135m-instruct": 0, "llama-3.2-1b-instruct": 0, "mistral-7b-instruct-v0.2": 1,
                     "llama-3.1-8b-instruct": 1, "qwen2.5-7b-instruct": 1}


def test_plan_fits_the_fused_decode_mlp_at_hidden_sizes_of_2048_and_4096_on_sm_90():
    """The decode MLP in one kernel (mlp_fused=1; mlp_fused_body: 8 chunks a lane a row part, a
    unit's rows to one warp at 2048 and two at 4096, bulk copies on mbarriers) fits the
    Llama-3.2-1B, Mistral-7B and Llama-3.1-8B shapes and the tiny models made for it, on sm_90 only;
    not Qwen2.5-7B's 3584 nor SmolLM2's 576; never the generic build."""
    from codegen.plan import make_generic_plan, make_plan

    fused = {m: make_plan(spec_of(load(REPO / "models" / m / "config.json"))).mlp_fused
             for m in ("smollm2-135m-instruct", "llama-3.2-1b-instruct", "mistral-7b-instruct-v0.2", "llama-3.1-8b-instruct",
                       "qwen2.5-7b-instruct")}
    assert fused == {"smollm2-135m-instruct": 0, "llama-3.2-1b-instruct": 1, "mistral-7b-instruct-v0.2": 1,
                     "llama-3.1-8b-instruct": 1, "qwen2.5-7b-instruct": 0}
    for name in ("tiny-d2048", "tiny-d4096"):
        tiny = spec_of(load(REPO / "tests" / "models" / name / "config.json"))
        assert make_plan(tiny).mlp_fused == 1
        assert make_plan(tiny, cuda_arch="89").mlp_fused == 0 and make_plan(tiny, cuda_arch="80").mlp_fused == 0
    assert make_generic_plan().mlp_fused == 0


def test_plan_groups_prefill_attention_tokens_on_64_wide_heads():
    """A prefill attention block takes 8 / kv_mul tokens where heads are 64 wide (measured faster on
    the 1B shape), one where they are 128 wide (slower on the 7B shape) and in the generic build."""
    from codegen.plan import make_generic_plan, make_plan

    tokens = {m: make_plan(spec_of(load(REPO / "models" / m / "config.json"))).prefill_att_tokens
              for m in ("smollm2-135m-instruct", "llama-3.2-1b-instruct", "mistral-7b-instruct-v0.2", "qwen2.5-7b-instruct")}
    assert tokens == {"smollm2-135m-instruct": 2, "llama-3.2-1b-instruct": 2, "mistral-7b-instruct-v0.2": 1,
                      "qwen2.5-7b-instruct": 1}
    assert make_generic_plan().prefill_att_tokens == 1


def test_plan_takes_flash_prefill_attention_on_64_and_128_wide_heads():
    """prefill_flash_body is written for heads of 64 and 128 (measured faster at depth on the 1B and
    7B shapes); the generic build takes the same rule over the head width it reads."""
    from codegen.plan import make_generic_plan, make_plan

    flash = {m: make_plan(spec_of(load(REPO / "models" / m / "config.json"))).prefill_flash
             for m in ("smollm2-135m-instruct", "llama-3.2-1b-instruct", "mistral-7b-instruct-v0.2")}
    assert flash == {"smollm2-135m-instruct": 1, "llama-3.2-1b-instruct": 1, "mistral-7b-instruct-v0.2": 1}
    tiny = {m: make_plan(spec_of(load(REPO / "tests" / "models" / m / "config.json"))).prefill_flash
            for m in ("tiny-gqa", "tiny-group3", "tiny-wide")}
    assert tiny == {"tiny-gqa": 0, "tiny-group3": 1, "tiny-wide": 1}  # heads of 16, 64, 128
    assert str(make_generic_plan().prefill_flash) == "(MODEL_HEAD_DIM == 64 || MODEL_HEAD_DIM == 128)"


def test_plan_takes_tensor_core_decode_attention_on_64_and_128_wide_heads():
    """attention_body's tensor-core path is written for heads of 64 and 128 with a KV group of at
    most 8 query heads (the mma's columns); heads of other widths keep fp32. The generic build takes
    the same rule at run time (its model_plan.h: the rule as a C expression over the dimensions)."""
    from codegen.plan import _att_mma, make_generic_plan, make_plan

    mma = {m: make_plan(spec_of(load(REPO / "models" / m / "config.json"))).att_mma
           for m in ("smollm2-135m-instruct", "llama-3.2-1b-instruct", "mistral-7b-instruct-v0.2", "qwen2.5-7b-instruct")}
    assert mma == {"smollm2-135m-instruct": 1, "llama-3.2-1b-instruct": 1, "mistral-7b-instruct-v0.2": 1,
                   "qwen2.5-7b-instruct": 1}
    tiny = {m: make_plan(spec_of(load(REPO / "tests" / "models" / m / "config.json"))).att_mma
            for m in ("tiny-gqa", "tiny-group3", "tiny-wide")}
    assert tiny == {"tiny-gqa": 0, "tiny-group3": 1, "tiny-wide": 1}  # heads of 16, 64, 128
    assert _att_mma(128, 9) == 0  # a group wider than the mma's 8 columns
    generic = make_generic_plan()
    assert str(generic.att_mma) == "((MODEL_HEAD_DIM == 64 || MODEL_HEAD_DIM == 128) && MODEL_KV_MUL <= 8)"
    assert str(generic.att_short) == str(generic.att_mma)


def test_plan_stages_values_on_heads_of_64_from_the_1b_shape():
    """Staged values (att_stage_values) where they measured a gain: heads of 64 in a model no
    smaller than Llama-3.2-1B; not the SmolLM2 shape (lost at depth 0), not heads of 128 (spills)."""
    from codegen.plan import make_generic_plan, make_plan

    staged = {m: make_plan(spec_of(load(REPO / "models" / m / "config.json"))).att_stage_values
              for m in ("smollm2-135m-instruct", "llama-3.2-1b-instruct", "mistral-7b-instruct-v0.2")}
    assert staged == {"smollm2-135m-instruct": 0, "llama-3.2-1b-instruct": 1, "mistral-7b-instruct-v0.2": 0}
    assert make_generic_plan().att_stage_values == 0


def test_plan_loads_combine_sums_early_where_a_thread_takes_one_output():
    """The combine's first ATT_MIN_SPLITS partial sums loaded with the splits' (max, sum) where a
    KV group's heads times the head width fit the attention block's 256 threads (the 1B: 4 x 64; the
    SmolLM2 shape: 3 x 64, its 88 capped at 64 registers' worth); 0 where the combine takes its
    float4 form (the 7B: 4 x 128) and in the generic build (a register array's size)."""
    from codegen.plan import make_generic_plan, make_plan

    early = {m: make_plan(spec_of(load(REPO / "models" / m / "config.json"))).att_combine_early
             for m in ("smollm2-135m-instruct", "llama-3.2-1b-instruct", "mistral-7b-instruct-v0.2")}
    assert early == {"smollm2-135m-instruct": 64, "llama-3.2-1b-instruct": 33, "mistral-7b-instruct-v0.2": 0}
    assert make_generic_plan().att_combine_early == 0


def test_plan_joins_short_attention_and_o_proj_where_o_proj_takes_two_blocks_an_sm():
    """A short context's attention in one grid with o_proj (ATT_O_SHORT) where the short kernel runs
    and o_proj's rows take more than one step (2 blocks an SM, the joined grid's): the 7B-like
    shapes (gained); not the 1B or SmolLM2 shapes (o_proj at 4 blocks an SM: the 1B lost), not the
    generic build (no short kernel)."""
    from codegen.plan import make_generic_plan, make_plan

    joined = {m: make_plan(spec_of(load(REPO / "models" / m / "config.json"))).att_o_short
              for m in ("smollm2-135m-instruct", "llama-3.2-1b-instruct", "mistral-7b-instruct-v0.2",
                        "llama-3.1-8b-instruct", "qwen2.5-7b-instruct")}
    assert joined == {"smollm2-135m-instruct": 0, "llama-3.2-1b-instruct": 0, "mistral-7b-instruct-v0.2": 1,
                      "llama-3.1-8b-instruct": 1, "qwen2.5-7b-instruct": 1}
    assert make_generic_plan().att_o_short == 0


def test_plan_pair_steps_by_hidden_size():
    """The paired kernels' 4 chunks a step up to a hidden size of 2048 (the 1B shape gained), 8 with
    half the first step after the wait past it (Mistral-7B lost with 4, gained with the half)."""
    from codegen.plan import make_generic_plan, make_plan

    plans = {m: make_plan(spec_of(load(REPO / "models" / m / "config.json")))
             for m in ("smollm2-135m-instruct", "llama-3.2-1b-instruct", "mistral-7b-instruct-v0.2")}
    assert {m: (p.pair_unroll, p.pair_early) for m, p in plans.items()} == {
        "smollm2-135m-instruct": (4, 0), "llama-3.2-1b-instruct": (4, 0), "mistral-7b-instruct-v0.2": (8, 4)}
    assert (make_generic_plan().pair_unroll, make_generic_plan().pair_early) == (8, 0)


def test_plan_early_loads_in_lots_where_rows_fill_a_step():
    """The early loads before the wait in lots (two of the paired kernels' early chunks, four of
    o_proj's and down's 8) where the rows fill them: the 1B and 7B shapes (gained), not the SmolLM2
    shape (rows of 576: lost 5%), not the generic build (a lot is a template argument); tiny-wide
    (rows of 2176) takes them, so the GPU tests run them."""
    from codegen.plan import make_generic_plan, make_plan

    lots = {m: (lambda p: (p.pair_lot, p.res_lot))(make_plan(spec_of(load(REPO / "models" / m / "config.json"))))
            for m in ("smollm2-135m-instruct", "llama-3.2-1b-instruct", "mistral-7b-instruct-v0.2")}
    assert lots == {"smollm2-135m-instruct": (0, 0), "llama-3.2-1b-instruct": (2, 2), "mistral-7b-instruct-v0.2": (2, 2)}
    wide = make_plan(spec_of(load(REPO / "tests" / "models" / "tiny-wide" / "config.json")))
    assert (wide.pair_lot, wide.res_lot) == (2, 2)
    assert (make_generic_plan().pair_lot, make_generic_plan().res_lot) == (0, 0)


def test_down_polls_where_measured():
    """DOWN_POLL (codegen/plan.py, _down_poll): down polls gate/up's outputs on the 1B and 7B shapes
    (intermediate sizes 8192 and 14336, where it was measured), not on the SmolLM2 shape (1536) nor
    in the generic build."""
    from codegen.plan import make_generic_plan, make_plan

    polls = {m: make_plan(spec_of(load(REPO / "models" / m / "config.json"))).down_poll
             for m in ("smollm2-135m-instruct", "llama-3.2-1b-instruct", "mistral-7b-instruct-v0.2")}
    assert polls == {"smollm2-135m-instruct": 0, "llama-3.2-1b-instruct": 1, "mistral-7b-instruct-v0.2": 1}
    assert make_generic_plan().down_poll == 0


def test_plan_qkv_async_where_its_pairs_are_one_round():
    """QKV's later row steps on cp.async where its pairs fit one round of a wave's warps and a row
    takes more than one step: the 1B shape (gained), not Mistral-7B (1.45 rounds: lost), not the
    SmolLM2 shape (rows of one step: nothing to copy), not the generic build."""
    from codegen.plan import make_generic_plan, make_plan

    plans = {m: make_plan(spec_of(load(REPO / "models" / m / "config.json")))
             for m in ("smollm2-135m-instruct", "llama-3.2-1b-instruct", "mistral-7b-instruct-v0.2",
                       "qwen2.5-7b-instruct")}
    assert {m: p.qkv_async for m, p in plans.items()} == {
        "smollm2-135m-instruct": 0, "llama-3.2-1b-instruct": 1, "mistral-7b-instruct-v0.2": 0, "qwen2.5-7b-instruct": 0}
    assert make_generic_plan().qkv_async == 0


def test_c_literals():
    assert c_string('a"b\\\n\t\x01é') == '"a\\"b\\\\\\n\\t\\001\\303\\251"'
    assert c_string("??=") == '"\\077\\077="'
    assert float(c_float(1e-5)[:-1]) == pytest.approx(1e-5, rel=1e-7)


def test_generated_sources_match_golden(tmp_path):
    """Same input, same bytes: the tiny model's sources against tests/golden/tiny-gqa. After an
    intended generator change, refresh with:
        .venv/bin/python -m codegen tests/models/tiny-gqa --out tests/golden/tiny-gqa"""
    r = subprocess.run([sys.executable, "-m", "codegen", "tests/models/tiny-gqa", "--out", str(tmp_path)],
                       cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    produced = sorted(p.name for p in tmp_path.iterdir())
    assert produced == sorted(p.name for p in GOLDEN.iterdir())
    for name in produced:
        assert (tmp_path / name).read_text() == (GOLDEN / name).read_text(), f"{name} differs from the golden copy"
    # a second run changes nothing and writes nothing
    r = subprocess.run([sys.executable, "-m", "codegen", "tests/models/tiny-gqa", "--out", str(tmp_path)],
                       cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == ""


GOLDEN_QUANT = REPO / "tests" / "golden" / "tiny-q4_1"


def test_quantized_sources_match_golden(tmp_path):
    """A quantized model's (tiny-gqa with its layers in Q4_1 and its embedding in Q8_0, as
    codegen.quantize --type q4_1 writes it): the two files the formats change, model_config.h
    (MODEL_FORMAT_*, MODEL_QUANTIZED, the bytes read) and model_tensors.c (U8 rows of blocks), against
    tests/golden/tiny-q4_1; the table compiles. Refresh after an intended change with:
        .venv/bin/python -m codegen tests/models/tiny-q4_1 --out /tmp/q && cp /tmp/q/model_config.h /tmp/q/model_tensors.c tests/golden/tiny-q4_1/"""
    r = subprocess.run([sys.executable, "-m", "codegen", "tests/models/tiny-q4_1", "--out", str(tmp_path)],
                       cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for name in sorted(p.name for p in GOLDEN_QUANT.iterdir()):
        assert (tmp_path / name).read_text() == (GOLDEN_QUANT / name).read_text(), f"{name} differs from the golden copy"
    ok = subprocess.run(["gcc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", "-Iruntime", f"-I{tmp_path}",
                         str(tmp_path / "model_tensors.c")], cwd=REPO, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    spec = load_spec(REPO / "tests" / "models" / "tiny-q4_1" / "config.json")
    # Q8_0: 34 bytes a 32 weights, Q4_1: 20; the norms bf16; the tied embedding read whole
    layer = 20 * (64 * 64 * 2 + 32 * 64 * 2 + 160 * 64 * 3) // 32 + 2 * 64 * 2
    assert spec.weight_bytes == 3 * layer + 2 * 64 + 34 * 400 * 64 // 32
    assert spec.formats == {"embed": "Q8_0", "lm_head": "Q8_0", **{f: "Q4_1" for f in ("wq", "wk", "wv", "wo", "w_gate",
                                                                                        "w_up", "w_down")}}


def test_generator_refuses_bad_config_with_one_line(tmp_path):
    cfg = base_config()
    cfg["hidden_act"] = "relu"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    r = subprocess.run([sys.executable, "-m", "codegen", str(tmp_path), "--out", str(tmp_path / "gen")],
                       cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "'hidden_act' = 'relu'" in r.stderr


def test_version_lock(tmp_path):
    """The generator and runtime versions agree, and a mismatch stops compilation with the fix."""
    header = (REPO / "runtime" / "ingot_version.h").read_text()
    assert f"#define INGOT_GENERATOR_VERSION {GENERATOR_VERSION}\n" in header
    ok = subprocess.run(["gcc", "-fsyntax-only", "-Iruntime", str(GOLDEN / "model_config.h")],
                        cwd=REPO, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    (tmp_path / "ingot_version.h").write_text(f"#define INGOT_GENERATOR_VERSION {GENERATOR_VERSION + 1}\n")
    r = subprocess.run(["gcc", "-fsyntax-only", f"-I{tmp_path}", str(GOLDEN / "model_config.h")],
                       cwd=REPO, capture_output=True, text=True)
    assert r.returncode != 0 and "make generate MODEL=tests/models/tiny-gqa" in r.stderr


def test_generic_plan_is_the_plan_at_run_time():
    """The generic build's plan (C expressions over MODEL_*) gives every known model the numbers
    make_plan gives it: the two builds launch the same grids."""
    import glob

    from codegen.plan import make_generic_plan, make_plan

    for arch in ("80", "90"):
        generic = make_generic_plan(arch)
        for path in sorted(glob.glob(str(REPO / "models/*/config.json"))) + sorted(glob.glob(str(REPO / "tests/models/*/config.json"))):
            spec = spec_of(load(Path(path)))
            plan = make_plan(spec, arch)
            for field in ("grid_qkv", "grid_o", "grid_gate_up", "grid_down", "grid_lm_head", "att_min_splits"):
                expr = re.sub(r"MODEL_([A-Z_]+)", lambda m: str(getattr(spec, m.group(1).lower())), getattr(generic, field))
                assert eval(expr.replace("/", "//")) == getattr(plan, field), (path, arch, field, expr)
            cpu = getattr(generic, "cpu_streams").replace("MODEL_WEIGHT_BYTES_PER_TOKEN", str(spec.weight_bytes))
            cond, four_one = cpu.strip("()").replace("ULL", "").split("?")
            assert (4 if eval(cond) else 1) == plan.cpu_streams and four_one.strip() == "4 : 1"


def test_plan_header_is_the_cuda_sources_one_interface(tmp_path):
    """model_plan.h names every decision of the plan, and the hand-written CUDA sources read each
    of them: none is emitted for nothing, and none is missing a use (a dead constant means a
    decision the code no longer takes). Each line carries its rule in a comment."""
    r = subprocess.run([sys.executable, "-m", "codegen", "tests/models/tiny-gqa", "--out", str(tmp_path)],
                       cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    names = re.findall(r"^#define (MODEL_\w+) \S+ /\* .+ \*/$", (tmp_path / "model_plan.h").read_text(), re.M)
    assert len(names) > 30
    cuda = "".join(p.read_text() for p in sorted((REPO / "runtime").glob("*.cu*")))
    cpu = (REPO / "templates" / "forward_cpu.c.j2").read_text()
    unused = [n for n in names if not re.search(rf"\b{n}\b", cuda + cpu)]
    assert unused == []


def test_plan_settings_build_the_other_path_and_refuse_what_cannot_run(tmp_path):
    """codegen --set: a decision set by hand lands in model_plan.h with the ones that follow from
    it derived again (the fused MLP's carveout and triggers); a field the plan does not have, a
    value that is not a number, and a setting the model or target cannot take are refused in one
    line naming it."""
    def gen(*sets, model="tiny-d2048", arch="90"):
        args = [a for s in sets for a in ("--set", s)]
        return subprocess.run([sys.executable, "-m", "codegen", f"tests/models/{model}", "--out", str(tmp_path / "g"),
                               "--cuda-arch", arch, *args], cwd=REPO, capture_output=True, text=True)

    r = gen()
    plan = (tmp_path / "g" / "model_plan.h").read_text()
    assert r.returncode == 0 and "#define MODEL_MLP_FUSED 1 " in plan and "#define MODEL_SMEM_CARVEOUT 72 " in plan
    r = gen("mlp_fused=0")
    plan = (tmp_path / "g" / "model_plan.h").read_text()
    assert r.returncode == 0 and "#define MODEL_MLP_FUSED 0 " in plan and "#define MODEL_SMEM_CARVEOUT -1 " in plan
    assert "Set by hand (codegen --set): mlp_fused=0" in plan and "PLAN='mlp_fused=0'" in plan
    for sets, message in [(("no_such=1",), "--set no_such=1: expected generic or FIELD=N"),
                          (("mlp_fused=yes",), "'yes' is not a whole number"),
                          (("att_o_short=1", "att_short=0"), "the short context's kernel")]:
        r = gen(*sets)
        assert r.returncode == 1 and message in r.stderr and r.stderr.count("\n") == 1, r.stderr
    r = gen("mlp_fused=1", arch="80")
    assert r.returncode == 1 and "does not fit the fused MLP" in r.stderr


def test_generic_plan_for_a_specialized_build_takes_the_generic_builds_decisions(tmp_path):
    """--set generic: a specialized build with the generic build's decisions (make compare's middle
    build, which isolates what the constants alone buy): every decision the generic plan fixes to a
    number, while the grids, the same formulas in both, keep this model's values."""
    from codegen.plan import Plan, generic_plan_sets, make_generic_plan

    r = subprocess.run([sys.executable, "-m", "codegen", "tests/models/tiny-d2048", "--out", str(tmp_path), "--set", "generic"],
                       cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    header = (tmp_path / "model_plan.h").read_text()
    sets = generic_plan_sets()
    # the rules the generic build takes at run time (att_mma, att_short) keep the model's values too
    assert sets["mlp_fused"] == 0 and "att_mma" not in sets and "att_short" not in sets and "grid_qkv" not in sets
    assert "#define MODEL_MLP_FUSED 0 " in header and "#define MODEL_ATT_MMA_HD 64 " in header
    assert "#define MODEL_GRID_QKV 192 " in header  # tiny-d2048's own: (2048 + 2 * 512) / 2 / 8
    generic = make_generic_plan()
    assert all(getattr(generic, k) == v for k, v in sets.items()) and set(sets) < {f.name for f in dataclasses.fields(Plan)}


def test_test_knobs_are_plan_settings_refused_out_of_range(tmp_path):
    """The values tests set otherwise to reach a path the tiny models would not take (the attention's
    least split, the prompt's batch, gate/up's GEMM forms, the polls' width) go through the plan like
    every decision: written into model_plan.h, and refused in one line where a kernel cannot take them."""
    def gen(*sets):
        args = [a for s in sets for a in ("--set", s)]
        return subprocess.run([sys.executable, "-m", "codegen", "tests/models/tiny-gqa", "--out", str(tmp_path), *args],
                              cwd=REPO, capture_output=True, text=True)

    r = gen("att_min_chunk=5", "fmma_min_chunk=5", "fmma_tile=16", "poll_vec=2", "prefill_batch=32", "prefill_gate_up_gemm=2",
            "gate_up_tma_wide=2")
    assert r.returncode == 0, r.stderr
    header = (tmp_path / "model_plan.h").read_text()
    for name, value in (("ATT_MIN_CHUNK", 5), ("FMMA_MIN_CHUNK", 5), ("FMMA_TILE", 16), ("POLL_VEC", 2), ("PREFILL_BATCH", 32),
                        ("PREFILL_GATE_UP_GEMM", 2), ("GATE_UP_TMA_WIDE", 2)):
        assert f"#define MODEL_{name} {value} " in header, name
    r = gen()
    assert "#define MODEL_PREFILL_BATCH 256 " in (tmp_path / "model_plan.h").read_text()  # sm_90: wgmma, batches of 256
    for bad in ("att_min_chunk=0", "fmma_tile=24", "poll_vec=9", "prefill_batch=12", "prefill_gate_up_gemm=3", "gate_up_tma_wide=0"):
        r = gen(bad)
        assert r.returncode == 1 and f"--set {bad}: expected" in r.stderr and r.stderr.count("\n") == 1, (bad, r.stderr)
    r = gen("gemm_wgmma=0", "prefill_batch=128")  # batches over 64 only on wgmma
    assert r.returncode == 1 and "--set prefill_batch=128: batches over 64" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    r = gen("gemm_wgmma=0")  # the rule's 64 on mma.sync
    assert r.returncode == 0 and "#define MODEL_PREFILL_BATCH 64 " in (tmp_path / "model_plan.h").read_text(), r.stderr
