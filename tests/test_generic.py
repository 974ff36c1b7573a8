"""What only the generic build does: find the chat strings of a model at run time (from the table of
templates it was generated with), refuse at run time what a specialized build refuses at build
time, and run models that no build was generated for. Its numbers and command line are checked
with the specialized build's everywhere else (BUILDS in conftest.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, TINY_TOKENIZER, Binary, binary_for, build_generic, build_model, run, tiny_model_dir

FIXTURES = REPO / "tests" / "fixtures" / "chat"


def fails_with(binary, *args, message):
    r = run(binary, *args, check=False)
    err = r.stderr.decode()
    assert r.returncode == 1 and err.count("\n") == 1 and err.startswith("ingot: "), err
    assert message in err, f"{message!r} not in {err!r}"


def chat_ids(binary, *args):
    return run(binary, "--chat", "--tokenize", *args).stdout.split()


TURNS = [("-p", "Hi there! What is 2 + 2?"), ("--system", "Be brief.", "-p", "Hi there! What is 2 + 2?")]


@pytest.mark.parametrize("turn", TURNS, ids=["user", "system+user"])
def test_smollm2_chat_turn_equals_specialized(default_model, turn):
    """SmolLM2's template (a default system prompt) from the generic build's table: the token ids
    of the turn --chat feeds are the specialized build's."""
    want = chat_ids(binary_for(default_model, "specialized"), *turn)
    assert len(want) > 10
    assert chat_ids(binary_for(default_model, "generic"), *turn) == want


def model_with_template(tmp_path, name, template, **tokens):
    """tiny-llama with tokenizer_config.json's chat_template and special tokens replaced."""
    d = tmp_path / name
    shutil.copytree(tiny_model_dir("tiny-llama"), d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    for k in ("bos_token", "eos_token", "unk_token", "pad_token"):
        cfg.pop(k, None)
    cfg.update(tokens, chat_template=template)
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


# Published templates kept as fixtures, with special tokens the tiny tokenizer has. Each needs a
# specialized build of its own (without CUDA, to keep it short); the tiny tokenizer's own template
# (plain ChatML) runs with tiny-llama itself.
TEMPLATES = {
    "tiny-tokenizer": None,
    "llama-3.2": {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"},
    "llama-2": {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"},
    "mistral-v0.2": {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"},
}


@pytest.mark.parametrize("name", TEMPLATES)
def test_fixture_chat_turns_equal_specialized(tmp_path, name):
    """Templates with a BOS written first (Llama-3.2), a BOS and the system block inside the first
    user turn (Llama-2) and no system role (Mistral): the generic build pastes the model's tokens
    into its table's placeholders and feeds the ids the specialized build feeds."""
    if TEMPLATES[name] is None:
        d = tiny_model_dir("tiny-llama")
        specialized = binary_for(d, "specialized")
    else:
        d = model_with_template(tmp_path, f"chat-{name}", (FIXTURES / f"{name}.jinja").read_text(), **TEMPLATES[name])
        specialized = Binary(build_model(d, "NVCC="), d, False)
    generic = binary_for(d, "generic")
    for turn in TURNS:
        if name == "mistral-v0.2" and "--system" in turn:
            for b in (specialized, generic):
                fails_with(b, "--chat", "--tokenize", *turn, message="this model's chat template has no system role")
            continue
        assert chat_ids(generic, *turn) == chat_ids(specialized, *turn), (name, turn)
    if TEMPLATES[name] is not None:
        shutil.rmtree(REPO / "build" / d.name, ignore_errors=True)
        shutil.rmtree(REPO / "generated" / d.name, ignore_errors=True)


def test_unknown_template_refuses_chat_only(tmp_path):
    """A template the generic build was not generated with: --chat says so, completion works."""
    d = model_with_template(tmp_path, "odd", "{% for m in messages %}<<{{ m.role }}>>{{ m.content }}{% endfor %}",
                            eos_token="<|im_end|>")
    generic = binary_for(d, "generic")
    fails_with(generic, "--chat", "-p", "Hi", message="has a chat template this generic build does not know")
    assert run(generic, "-p", "Hi", "-n", "3", "--temp", "0").stdout.startswith(b"Hi")


def test_missing_required_token_refuses_chat(tmp_path):
    """Llama-2's template writes bos_token + ...: without a bos_token the generator cannot render it,
    and the generic build refuses --chat, naming the token."""
    d = model_with_template(tmp_path, "no-bos", (FIXTURES / "llama-2.jinja").read_text(), eos_token="<|im_end|>")
    fails_with(binary_for(d, "generic"), "--chat", "-p", "Hi", message="needs bos_token")


def test_no_template(tmp_path):
    d = tmp_path / "no-template"
    shutil.copytree(tiny_model_dir("tiny-llama"), d)
    (d / "tokenizer_config.json").unlink()
    fails_with(binary_for(d, "generic"), "--chat", "-p", "Hi", message="has no chat template")


def synth(tmp_path, name, **changes):
    """A tiny-llama variant with random weights."""
    d = tmp_path / name
    d.mkdir()
    cfg = json.loads((REPO / "tests" / "models" / "tiny-llama" / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))
    subprocess.run([sys.executable, "-m", "codegen.synth", str(d), "--seed", "2", "--tokenizer", str(TINY_TOKENIZER)],
                   cwd=REPO, check=True, capture_output=True)
    return d


def test_unsupported_config_refused_naming_the_key(tmp_path):
    """What the generator refuses, the generic binary refuses with the same words."""
    d = tmp_path / "gelu"
    shutil.copytree(tiny_model_dir("tiny-llama"), d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["hidden_act"] = "gelu"
    (d / "config.json").write_text(json.dumps(cfg))
    fails_with(Binary(build_generic(), d, True), "-p", "x", message="config.json: 'hidden_act' = 'gelu', only 'silu' is supported")
    fails_with(Binary(build_generic(), tmp_path / "nowhere", True), "-p", "x", message="nowhere/config.json")


def test_kernel_requirement_checked_at_run_time(tmp_path):
    """head_dim 18 is even (the spec accepts it) but the CPU decode step works on quads of rows: a
    specialized build stops at compile time (a static assertion), the generic binary when it
    starts, with the same reason."""
    d = synth(tmp_path, "head18", hidden_size=72, head_dim=18)
    fails_with(Binary(build_generic(), d, True), "-p", "x", "--device", "cpu", message="needs head_dim % 4 == 0")
    r = subprocess.run(["make", "-s", f"MODEL={d}", "NVCC="], cwd=REPO, capture_output=True, text=True)
    assert r.returncode != 0 and "needs head_dim % 4 == 0" in r.stderr
    shutil.rmtree(REPO / "generated" / d.name, ignore_errors=True)
    shutil.rmtree(REPO / "build" / d.name, ignore_errors=True)


def test_too_many_layers_for_generic(tmp_path):
    d = tmp_path / "deep"
    d.mkdir()
    cfg = json.loads((REPO / "tests" / "models" / "tiny-llama" / "config.json").read_text())
    cfg["num_hidden_layers"] = 300
    (d / "config.json").write_text(json.dumps(cfg))
    fails_with(Binary(build_generic(), d, True), "-p", "x", message="'num_hidden_layers' = 300: the generic build holds at most 256")


def test_runs_a_model_no_build_was_generated_for(tmp_path):
    """A new shape (GQA group 3, head_dim 8, 5 layers, untied): the generic binary runs it as built,
    its logits within test_numerics' tolerance of the NumPy reference."""
    import numpy as np
    from tokenizers import Tokenizer

    from reference import compare_logits, load_model
    from test_numerics import TINY_PROMPT, TOLERANCE

    d = synth(tmp_path, "new-shape", hidden_size=48, num_attention_heads=6, num_key_value_heads=2, head_dim=8,
              num_hidden_layers=5, intermediate_size=96, tie_word_embeddings=False)
    ref = load_model(d, kv_dtype=np.float16)
    ids = Tokenizer.from_file(str(d / "tokenizer.json")).encode(TINY_PROMPT).ids
    run(Binary(build_generic(), d, True), "--dump-logits", str(tmp_path / "l.bin"), "-p", TINY_PROMPT, "--device", "cpu")
    got = np.fromfile(tmp_path / "l.bin", dtype=np.float32).reshape(len(ids), -1)
    err = compare_logits(got, ref.forward(ids))
    assert err < TOLERANCE, f"max relative logit error {err:.2e}"
