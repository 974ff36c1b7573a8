"""Crafted bad input, by class, against every build: each must end in exit status 1 and exactly one
line on stderr naming the problem, within a time limit (no hang), never a crash.

The classes are those of issue 61: files that are not regular files (a FIFO would block forever, a
link to /dev/zero would be read until memory runs out), malformed JSON, configs past a limit or not
finite, another model's config under a specialized binary, token ids outside the vocabulary,
messages that quote hostile text (newlines, terminal escapes), weights that are not finite, sizes
that overflow. Every case runs on tiny-llama with four binaries: the specialized and the generic
build, and both again built with AddressSanitizer and UndefinedBehaviorSanitizer (build/asan/, CPU
only: the GPU tests run under compute-sanitizer), so
a memory error that the release build survives still fails here. The sanitizer builds also run
the ordinary modes once (completion, chat, tokenize, perplexity, logits)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys

import pytest

from conftest import REPO, TINY_TOKENIZER, Binary, binary_for, make, tiny_model_dir

HARDENING_BUILDS = ("specialized", "generic", "specialized-asan", "generic-asan")
SANITIZE = "-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
# Leaks at exit are not what these tests look for; a sanitizer report must not pass for exit 1.
SANITIZER_ENV = {"ASAN_OPTIONS": "detect_leaks=0:exitcode=86", "UBSAN_OPTIONS": "halt_on_error=1:exitcode=87"}
TIMEOUT = 60  # seconds: every refusal here takes well under one


@pytest.fixture(scope="module", params=HARDENING_BUILDS)
def hbin(request) -> Binary:
    d = tiny_model_dir("tiny-llama")
    build = request.param
    generic = build.startswith("generic")
    if build.endswith("-asan"):
        out = f"build/asan/{'generic' if generic else d.name}"
        make(*(["GENERIC=1"] if generic else [f"MODEL={d}"]), f"OUT={out}", "RUNTIME_BUILD=build/asan/runtime",
             f"EXTRA_CFLAGS={SANITIZE}", "NVCC=")
        path = REPO / out / "ingot"
        return Binary(path, d, generic)
    return binary_for(d, build)  # the release builds the other tests use (with CUDA where nvcc is)


def ingot(binary: Binary, *args: str, input: bytes | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(binary.argv("--check-weights", *args), input=input, capture_output=True, timeout=TIMEOUT,
                              env={**os.environ, **SANITIZER_ENV})
    except subprocess.TimeoutExpired:
        pytest.fail(f"hung for {TIMEOUT} s: {binary.argv(*args)}")


def refuses(binary: Binary, *args: str, message: str, input: bytes | None = None) -> str:
    r = ingot(binary, *args, input=input)
    err = r.stderr.decode(errors="replace")
    assert r.returncode == 1, f"exit {r.returncode}, stderr {err[:3000]!r}"
    assert err.count("\n") == 1 and err.endswith("\n") and err.startswith("ingot: "), f"not one line: {err[:3000]!r}"
    assert all(c >= " " and c != "\x7f" for c in err[:-1]), f"control character in {err!r}"
    assert message in err, f"{message!r} not in {err!r}"
    return err


def copy_model(binary: Binary, tmp_path, name="m"):
    d = tmp_path / name
    shutil.copytree(binary.model_dir, d)
    return d


def edit_json(path, **changes):
    cfg = json.loads(path.read_text())
    for k, v in changes.items():
        if v is ...:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    path.write_text(json.dumps(cfg))


def safetensors_parts(path):
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8 + n:]


def write_safetensors(path, header, body):
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + body)


# ---------------------------------------------------------------------------------------------
# The cases: name -> (class, builds it applies to, function(binary, model dir) -> (args, message)).
# A function prepares the copy of the model directory it is given.

CASES = {}


def case(cls, name, builds=("specialized", "generic")):
    def register(fn):
        CASES[name] = (cls, builds, fn)
        return fn
    return register


def not_regular(kind, target):
    """Replaces the file target with a FIFO, a link to /dev/zero or a directory."""
    if target.exists() or target.is_symlink():
        target.unlink()
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "devzero":
        target.symlink_to("/dev/zero")
    else:
        target.mkdir()


FILE_KINDS = {"fifo": "is a FIFO, expected a regular file", "devzero": "is a character device, expected a regular file",
              "dir": "is a directory, expected a regular file"}
for _file in ("config.json", "tokenizer.json", "model.safetensors"):
    for _kind, _message in FILE_KINDS.items():
        @case("files", f"{_file}-{_kind}")
        def _(b, d, file=_file, kind=_kind, message=_message):
            not_regular(kind, d / file)
            return ["-p", "x"], f"{file}: {message}"
for _kind in ("fifo", "devzero"):
    @case("files", f"tokenizer_config.json-{_kind}", builds=("generic",))  # a specialized build has its chat built in
    def _(b, d, kind=_kind):
        not_regular(kind, d / "tokenizer_config.json")
        return ["-p", "x"], "tokenizer_config.json: " + FILE_KINDS[kind]

    @case("files", f"generation_config.json-{_kind}", builds=("generic",))
    def _(b, d, kind=_kind):
        not_regular(kind, d / "generation_config.json")
        return ["-p", "x"], "generation_config.json: " + FILE_KINDS[kind]

    @case("files", f"index-{_kind}")
    def _(b, d, kind=_kind):
        (d / "model.safetensors").unlink()
        not_regular(kind, d / "model.safetensors.index.json")
        return ["-p", "x"], "model.safetensors.index.json: " + FILE_KINDS[kind]

    @case("files", f"shard-{_kind}")
    def _(b, d, kind=_kind):
        header, _ = safetensors_parts(d / "model.safetensors")
        (d / "model.safetensors").rename(d / "real.safetensors")
        weight_map = {name: "shard.safetensors" for name in header if name != "__metadata__"}
        (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
        not_regular(kind, d / "shard.safetensors")
        return ["-p", "x"], "shard.safetensors: " + FILE_KINDS[kind]


@case("files", "config.json-sparse-200MB")
def _(b, d):
    with open(d / "config.json", "r+b") as f:
        f.truncate(200 << 20)
    return ["-p", "x"], "config.json: 209715200 bytes, more than the 134217728-byte limit"


@case("files", "prompt-devzero")
def _(b, d):
    return ["-f", "/dev/zero"], "/dev/zero: more than 16777216 bytes of text"


@case("json", "config-duplicate-key")
def _(b, d):
    text = (d / "config.json").read_text().rstrip().rstrip("}")
    (d / "config.json").write_text(text + ', "rope_theta": 500000.0}')
    return ["-p", "x"], 'duplicate key "rope_theta"'


@case("json", "config-invalid-utf8")
def _(b, d):
    text = (d / "config.json").read_bytes().replace(b'"silu"', b'"sil\xff"')
    (d / "config.json").write_bytes(text)
    return ["-p", "x"], "expected valid UTF-8"


@case("json", "config-nan")
def _(b, d):
    (d / "config.json").write_text((d / "config.json").read_text().replace("10000.0", "NaN"))
    return ["-p", "x"], "config.json: at byte"


@case("json", "tokenizer-duplicate-vocab-key")
def _(b, d):
    text = (d / "tokenizer.json").read_text().replace('"vocab": {', '"vocab": {"hello": 5, "hello": 6, ', 1)
    (d / "tokenizer.json").write_text(text)
    return ["-p", "x"], 'duplicate key "hello"'


@case("json", "tokenizer-invalid-utf8-vocab")
def _(b, d):
    text = (d / "tokenizer.json").read_bytes().replace(b'"vocab": {', b'"vocab": {"\xf0\x9f": 399, ', 1)
    (d / "tokenizer.json").write_bytes(text)
    return ["-p", "x"], "expected valid UTF-8"


@case("json", "tokenizer-nesting")
def _(b, d):
    (d / "tokenizer.json").write_text('{"model": ' + "[" * 100000 + "]" * 100000 + "}")
    return ["-p", "x"], "nesting depth at most 128"


@case("json", "tokenizer-5M-values")
def _(b, d):
    (d / "tokenizer.json").write_text('{"added_tokens": [' + "0," * 5000000 + "0]}")
    return ["-p", "x"], "at most 4194304 values"


@case("json", "number-5000-digits")
def _(b, d):
    edit_json(d / "config.json", rope_theta="@")
    (d / "config.json").write_text((d / "config.json").read_text().replace('"@"', "1" * 5000))
    return ["-p", "x"], "a number of at most 4096 characters"


CONFIG_LIMITS = {
    "num_hidden_layers": (2147483647, "'num_hidden_layers' = 2147483647, expected at most 1024"),
    "num_attention_heads": (65536, "'num_attention_heads' = 65536, expected at most 1024"),
    "hidden_size": (1 << 40, "'hidden_size' = 1099511627776, expected at most 65536"),
    "head_dim": (1 << 20, "'head_dim' = 1048576, expected at most 1024"),
    "intermediate_size": (1 << 31, "'intermediate_size' = 2147483648, expected at most 262144"),
    "vocab_size": (2147483647, "'vocab_size' = 2147483647, expected at most 4194304"),
    "max_position_embeddings": (1 << 30, "'max_position_embeddings' = 1073741824, expected at most 16777216"),
    "num_key_value_heads": (4096, "'num_key_value_heads' = 4096, expected at most 1024"),
}
for _key, (_value, _message) in CONFIG_LIMITS.items():
    @case("config limits", f"limit-{_key}")
    def _(b, d, key=_key, value=_value, message=_message):
        edit_json(d / "config.json", **{key: value})
        return ["-p", "x"], message

@case("config limits", "heads-times-head-dim-wraps")
def _(b, d):
    """65536 heads of 65536 (one KV head): q_dim = 2^32 wrapped to 0 in int, so weights with empty
    q_proj and o_proj passed every check and attention ran past its buffers (a segfault)."""
    edit_json(d / "config.json", num_attention_heads=65536, num_key_value_heads=1, head_dim=65536)
    header, body = safetensors_parts(d / "model.safetensors")
    out, tensors = b"", {k: v for k, v in header.items() if k == "__metadata__"}
    entries = [(name, e) for name, e in header.items() if name != "__metadata__"]
    for name, e in sorted(entries, key=lambda kv: kv[1]["data_offsets"][0]):
        raw = body[e["data_offsets"][0]:e["data_offsets"][1]]
        if "q_proj" in name or "o_proj" in name:
            e, raw = dict(e, shape=[0, 64] if "q_proj" in name else [64, 0]), b""
        elif "k_proj" in name or "v_proj" in name:
            e, raw = dict(e, shape=[65536, 64]), bytes(65536 * 64 * 2)
        tensors[name] = dict(e, data_offsets=[len(out), len(out) + len(raw)])
        out += raw
    write_safetensors(d / "model.safetensors", tensors, out)
    return ["-p", "x"], "'num_attention_heads' = 65536, expected at most 1024"


@case("token ids", "template-suffix-id-perplexity")
def _(b, d):
    """An id after the sequence is never fed in --perplexity, only looked up in the logits."""
    tokenizer_edit(d, lambda t: t.update(post_processor={
        "type": "TemplateProcessing", "single": [{"Sequence": {"id": "A"}}, {"SpecialToken": {"id": "</s>"}}],
        "special_tokens": {"</s>": {"id": "</s>", "ids": [1 << 28], "tokens": ["</s>"]}}}))
    (d / "t.txt").write_text("the quick brown fox jumps over the lazy dog")
    return ["--perplexity", str(d / "t.txt")], "\"</s>\": id 268435456 is outside the model's vocabulary"


CONFIG_VALUES = {
    "eps-infinite": ({"rms_norm_eps": "@1e400"}, "'rms_norm_eps' = inf, expected a finite value"),
    "theta-denormal": ({"rope_theta": 5e-324}, "'rope_theta' = 5e-324 gives RoPE frequencies that are not finite"),
    "linear-factor-zero": ({"rope_scaling": {"type": "linear", "factor": 0}},
                           "rope_scaling (linear): 'factor' = 0, expected a positive finite value"),
    "llama3-low-equals-high": ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                 "high_freq_factor": 1.0, "original_max_position_embeddings": 64}},
                               "'high_freq_factor' = 1.0 must be greater than 'low_freq_factor' = 1.0"),
    "llama3-factor-string": ({"rope_scaling": {"rope_type": "llama3", "factor": "8"}},
                             "rope_scaling (llama3): 'factor' = '8', expected a number"),
    "architectures-nested": ({"architectures": [[1]]}, "'architectures' = [[1]], expected one of"),
    "torch-dtype-list": ({"torch_dtype": ["bfloat16"]}, "'torch_dtype' = ['bfloat16'], expected one of"),
    "sliding-window-string": ({"architectures": ["MistralForCausalLM"], "sliding_window": "4096"},
                              "'sliding_window' = '4096', expected a number or null"),
    "eos-huge": ({"eos_token_id": [2, 1 << 40]}, "'eos_token_id' = [2, 1099511627776], expected an id or a list of ids"),
    "hidden-act-escapes": ({"hidden_act": "a\nb\x1b[31m\u009bc"}, "'hidden_act' = 'a\\nb\\x1b[31m"),
}
for _name, (_changes, _message) in CONFIG_VALUES.items():
    @case("config values", f"config-{_name}")
    def _(b, d, changes=_changes, message=_message):
        edit_json(d / "config.json", **{k: (k if isinstance(v, str) and v.startswith("@") else v) for k, v in changes.items()})
        text = (d / "config.json").read_text()
        for k, v in changes.items():
            if isinstance(v, str) and v.startswith("@"):
                text = text.replace(json.dumps(k) + ": " + json.dumps(k), json.dumps(k) + ": " + v[1:])
        (d / "config.json").write_text(text)
        return ["-p", "x"], message

# Another model's values under the binary built for tiny-llama: refused by the specialized build,
# naming the key; the generic build runs whatever the config says (its weights must fit it).
CONFIG_DIFFERS = {
    "rope_theta": ({"rope_theta": 500000.0}, "'rope_theta' is 500000, this binary was built for 10000"),
    "rms_norm_eps": ({"rms_norm_eps": 1e-6}, "'rms_norm_eps' is 1e-06, this binary was built for 1e-05"),
    "max_position_embeddings": ({"max_position_embeddings": 512}, "'max_position_embeddings' is 512, this binary was built for 256"),
    "eos_token_id": ({"eos_token_id": [2, 1]}, "'eos_token_id' is 2,1, this binary was built for 2"),
    "bos_token_id": ({"bos_token_id": 1}, "'bos_token_id' is 1, this binary was built for 0"),
    "rope_scaling": ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "'rope_scaling' is linear scaling, this binary was built for none"),
    "torch_dtype": ({"torch_dtype": "float16"}, "'torch_dtype' is F16, this binary was built for BF16"),
    "vocab_size": ({"vocab_size": 512}, "'vocab_size' is 512, this binary was built for 400"),
    "tie_word_embeddings": ({"tie_word_embeddings": True}, "'tie_word_embeddings' is 1, this binary was built for 0"),
    "architectures": ({"architectures": ["MistralForCausalLM"]}, "'architectures' is MistralForCausalLM, this binary was built for LlamaForCausalLM"),
}
for _key, (_changes, _message) in CONFIG_DIFFERS.items():
    @case("config of another model", f"differs-{_key}", builds=("specialized",))
    def _(b, d, changes=_changes, message=_message):
        edit_json(d / "config.json", **changes)
        return ["-p", "x"], message


def tokenizer_edit(d, fn):
    tok = json.loads((d / "tokenizer.json").read_text())
    fn(tok)
    (d / "tokenizer.json").write_text(json.dumps(tok))


@case("token ids", "vocab-id-huge")
def _(b, d):
    tokenizer_edit(d, lambda t: t["model"]["vocab"].update({"zzz": 1073741823}))
    return ["-p", "x"], "\"zzz\": id 1073741823 is outside the model's vocabulary (vocab_size 400)"


@case("token ids", "added-token-id")
def _(b, d):
    tokenizer_edit(d, lambda t: t["added_tokens"].append({"id": 400, "content": "<new>", "special": True}))
    return ["-p", "x"], "\"<new>\": id 400 is outside the model's vocabulary (vocab_size 400)"


@case("token ids", "template-id")
def _(b, d):
    tokenizer_edit(d, lambda t: t.update(post_processor={
        "type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [100000], "tokens": ["<s>"]}}}))
    return ["-p", "x"], "\"<s>\": id 100000 is outside the model's vocabulary (vocab_size 400)"


@case("token ids", "bert-id")
def _(b, d):
    tokenizer_edit(d, lambda t: t.update(post_processor={"type": "BertProcessing", "cls": ["[CLS]", 5], "sep": ["[SEP]", 1 << 40]}))
    return ["-p", "x"], "BertProcessing: id 1099511627776 is outside the model's vocabulary"


@case("escaping", "tensor-name-escapes")
def _(b, d):
    header, body = safetensors_parts(d / "model.safetensors")
    header["evil\n\x1b[2J\u009bname"] = {"dtype": "F32", "shape": [1], "data_offsets": [len(body), len(body) + 4]}
    write_safetensors(d / "model.safetensors", header, body + b"\0\0\0\0")
    return ["-p", "x"], "evil\\x0A\\x1B[2J\\xC2\\x9Bname (dtype F32): not a tensor of this model"


@case("escaping", "tokenizer-type-escapes")
def _(b, d):
    tokenizer_edit(d, lambda t: t["model"].update(type="X\n\x1b]0;title\x07"))
    return ["-p", "x"], "model.type: \"X\\x0A\\x1B]0;title\\x07\" is not supported"


@case("escaping", "directory-name-escapes")
def _(b, d):
    odd = d.parent / "odd\ndir\x1b[1m"
    d.rename(odd)
    (odd / "config.json").unlink()
    return ["-m", str(odd), "-p", "x"], "odd\\x0Adir\\x1B[1m/config.json: No such file or directory"


@case("sizes", "model-path-4000-bytes")
def _(b, d):
    return ["-m", "/" + "x/" * 2000, "-p", "x"], "-m: a path of 4001 bytes, at most 3072"


def poison(d, tensor, value: bytes):
    header, body = safetensors_parts(d / "model.safetensors")
    start = header[tensor]["data_offsets"][0] + 2 * 5  # element 5 (BF16)
    body = body[:start] + value + body[start + 2:]
    write_safetensors(d / "model.safetensors", header, body)


@case("weights", "weight-nan")
def _(b, d):
    poison(d, "model.layers.1.mlp.up_proj.weight", struct.pack("<H", 0x7FC0))
    return ["-p", "x"], "weights not finite: model.layers.1.mlp.up_proj.weight (BF16 [160, 64]): element 5 is NaN"


@case("weights", "weight-inf")
def _(b, d):
    poison(d, "model.embed_tokens.weight", struct.pack("<H", 0xFF80))
    return ["-p", "x"], "model.embed_tokens.weight (BF16 [400, 64]): element 5 is infinite"


@case("sizes", "bench-overflow")
def _(b, d):
    return ["--bench", "-n", "2147483647", "--bench-prompt", "2147483647"], \
        "--bench needs at least 4294967294 tokens of context, --ctx is 256"


@case("sizes", "bench-depth-huge")
def _(b, d):
    return ["--bench", "--bench-depths", "99999999999999999999"], "expected comma-separated integers in 0..2147483647"


@case("sizes", "bench-17-depths")
def _(b, d):
    return ["--bench", "--bench-depths", ",".join(["0"] * 17)], "at most 16 depths"


@case("chat data", "tokenizer_config-not-object", builds=("generic",))
def _(b, d):
    (d / "tokenizer_config.json").write_text("[]")
    return ["-p", "x"], "tokenizer_config.json: expected a JSON object"


@case("chat data", "generation_config-duplicate", builds=("generic",))
def _(b, d):
    (d / "generation_config.json").write_text('{"eos_token_id": 2, "eos_token_id": 3}')
    return ["-p", "x"], 'duplicate key "eos_token_id"'


@pytest.mark.parametrize("name", sorted(CASES))
def test_crafted(hbin, tmp_path, name):
    cls, builds, prepare = CASES[name]
    if hbin.build not in builds:
        pytest.skip(f"{name}: not an error for the {hbin.build} build")
    d = copy_model(hbin, tmp_path)
    args, message = prepare(hbin, d)
    if "-m" not in args:
        args = ["-m", str(d), *args]
    refuses(hbin, *args, message=message)


FUZZ_CORPUS = REPO / "tests" / "fuzz" / "corpus"


@pytest.mark.parametrize("name", sorted(p.name for p in (FUZZ_CORPUS / "fuzz_cli").glob("timeout-*")))
def test_fuzz_cli_timeouts(hbin, name):
    """Inputs on which the command-line fuzz target ran past its time limit, kept: the whole program
    on them ends, quickly, as designed (a chat answer that fills the context: 0.2 s in a release
    build, 11-15 s under the fuzzer's sanitizers on a loaded machine)."""
    args = [a.decode("utf-8", "surrogateescape") for a in (FUZZ_CORPUS / "fuzz_cli" / name).read_bytes().split(b"\0")]
    r = ingot(hbin, "-m", str(hbin.model_dir), *args)
    err = r.stderr.decode(errors="replace")
    assert r.returncode in (0, 1) and err.count("\n") <= 1, err[:3000]


def test_weights_check_is_what_refuses(hbin, tmp_path):
    """Without --check-weights the NaN weight is not looked for (the scan is opt-in, the tests
    always pass it): the case above fails for the right reason."""
    d = copy_model(hbin, tmp_path)
    poison(d, "model.layers.1.mlp.up_proj.weight", struct.pack("<H", 0x7FC0))
    r = subprocess.run(hbin.argv("-m", str(d), "-p", "x", "-n", "2", "--temp", "0"), capture_output=True,
                       timeout=TIMEOUT, env={**os.environ, **SANITIZER_ENV})
    assert r.returncode == 0, r.stderr


def test_sanitized_modes(hbin, tmp_path):
    """The ordinary modes, once each: under the sanitizer builds they are the memory checks of the
    forward pass, the tokenizer, the sampler and the chat path."""
    if not hbin.path.parent.parent.name == "asan":
        pytest.skip("the sanitizer builds run the ordinary modes here; the others in test_cli.py")
    ok = lambda *a, input=None: ingot(hbin, "-m", str(hbin.model_dir), *a, input=input)  # noqa: E731
    for r in (ok("-p", "Hello world", "-n", "12", "--temp", "0.8", "--seed", "1", "--repeat-penalty", "1.2"),
              ok("--chat", "-p", "Hi there", "-n", "8", "--temp", "0"),
              ok("--tokenize", "-p", "héllo <|im_start|> 123"),
              ok("-n", "4", input=b"from stdin")):
        assert r.returncode == 0, r.stderr.decode(errors="replace")[:3000]
    (tmp_path / "t.txt").write_text("the quick brown fox jumps over the lazy dog. " * 3)
    r = ok("--perplexity", str(tmp_path / "t.txt"), "--ctx", "8")
    assert r.returncode == 0 and b"perplexity" in r.stdout, r.stderr.decode(errors="replace")[:3000]
    r = ok("-p", "Hello world again", "--dump-logits", str(tmp_path / "l.bin"), "--dump-prefill", "3")
    assert r.returncode == 0, r.stderr.decode(errors="replace")[:3000]


def test_generator_chat_data_refused_never_crashes(tmp_path):
    """The generator's reading of the chat data (codegen/chat.py) on 300 mutated tokenizer_config.json,
    tokenizer.json, generation_config.json and config.json files: ChatError or a result, never
    another exception (config.json itself: tests/test_model_spec.py's differential fuzzing)."""
    import copy
    import random

    from codegen.chat import ChatError, load_chat_strings

    rng = random.Random(61)
    base_tc = json.loads((TINY_TOKENIZER / "tokenizer_config.json").read_text())
    base_tok = json.loads((TINY_TOKENIZER / "tokenizer.json").read_text())
    values = [None, True, 0, -1, 2, 2**40, 1.5, "", "x", "<|im_end|>", [], [1], [None], [{}], {}, {"content": 5},
              {"content": "<|im_end|>"}, [{"name": "default", "template": 5}], [{"name": "default"}], [5],
              "{{ 1/0 }}", "{{ 'a' + 1 }}", "{{ messages[9] }}", "{% for m in messages %}{{ m.content }}{% endfor %}",
              {"1": {"content": "a"}}, {"x": 1}]
    outcomes = {"refused": 0, "read": 0}
    for i in range(300):
        d = tmp_path / f"m{i}"
        d.mkdir()
        tc, tok = copy.deepcopy(base_tc), copy.deepcopy(base_tok)
        for _ in range(rng.randint(1, 3)):
            which = rng.random()
            if which < 0.5:
                key = rng.choice(["chat_template", "bos_token", "eos_token", "unk_token", "pad_token",
                                  "added_tokens_decoder"])
                tc[key] = copy.deepcopy(rng.choice(values))
            elif which < 0.8:
                extra = [copy.deepcopy(rng.choice(values))]
                tok["added_tokens"] = extra[0] if rng.random() < 0.5 else base_tok["added_tokens"] + extra
            else:
                (d / "generation_config.json").write_text(json.dumps({"eos_token_id": rng.choice(values)}))
        (d / "tokenizer_config.json").write_text(json.dumps(tc))
        (d / "tokenizer.json").write_text(json.dumps(tok))
        (d / "config.json").write_text(json.dumps({"eos_token_id": rng.choice(values)}))
        try:
            load_chat_strings(d)
            outcomes["read"] += 1
        except ChatError:
            outcomes["refused"] += 1
    assert outcomes["refused"] >= 10 and outcomes["read"] >= 100, outcomes  # both paths exercised


HOSTILE_TEMPLATES = {
    "nested loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "a doubled string": "{% set ns = namespace(x='ab') %}{% for i in range(64) %}{% set ns.x = ns.x ~ ns.x %}{% endfor %}",
    "a multiplied string": "{{ 'x' * 10**10 }}",
    "endless recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "a huge fixed text": "{{ 'x' * 100000 }}",
}


@pytest.mark.parametrize("kind", HOSTILE_TEMPLATES)
def test_generator_hostile_chat_template_refused_in_one_line(tmp_path, kind):
    """A chat template is code from the model directory: one that loops for ever, fills memory,
    recurses or writes more fixed text than a binary should carry is refused in one line (codegen/chat.py's decompose_isolated: a forked child with a
    deadline and an address-space cap), within its limits. The generator itself, for the one that
    fills memory fastest; the others through decompose_isolated with a 3 s deadline."""
    import time

    from codegen.chat import ChatError, decompose_isolated

    tail = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}"
    template = HOSTILE_TEMPLATES[kind] + tail
    if kind == "a multiplied string":
        d = tmp_path / "m"
        shutil.copytree(REPO / "tests" / "models" / "tiny-llama", d)
        tc = json.loads((TINY_TOKENIZER / "tokenizer_config.json").read_text())
        (d / "tokenizer_config.json").write_text(json.dumps({**tc, "chat_template": template}))
        shutil.copyfile(TINY_TOKENIZER / "tokenizer.json", d / "tokenizer.json")
        r = subprocess.run([sys.executable, "-m", "codegen", str(d), "--out", str(tmp_path / "gen")], cwd=REPO,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and r.stderr.count("\n") == 1 and "MiB to render" in r.stderr, r.stderr[-2000:]
        return
    t0 = time.monotonic()
    with pytest.raises(ChatError) as e:
        decompose_isolated(template, kind, {}, seconds=3)
    assert time.monotonic() - t0 < 10 and "\n" not in str(e.value)
    assert {"nested loops": "more than 3 s", "a doubled string": "MiB to render", "endless recursion": "RecursionError",
            "a huge fixed text": "bytes of fixed text"}[kind] in str(e.value) or "more than 3 s" in str(e.value), str(e.value)


@pytest.mark.parametrize("shape", [(72, 161, 6, 2, 12), (16, 1, 1, 1, 4), (20, 5, 5, 5, 4), (66, 7, 1, 1, 66)],
                         ids=lambda s: "x".join(map(str, s)))
def test_generic_odd_shapes(hbin, shape):
    """Shapes no real model has, which the generator accepts (dims not multiples of the kernels'
    vector widths, an odd FFN, one head, GQA 3:1): the generic build runs them (under the sanitizers
    too) or refuses with one line what its CPU step cannot do (head_dim % 4)."""
    if not hbin.generic:
        pytest.skip("a specialized build of such a shape is its own binary")
    dim, ffn, heads, kv_heads, head_dim = shape
    cfg = json.loads((hbin.model_dir / "config.json").read_text())
    cfg.update(hidden_size=dim, intermediate_size=ffn, num_attention_heads=heads, num_key_value_heads=kv_heads,
               head_dim=head_dim, num_hidden_layers=1, max_position_embeddings=64)
    d = REPO / "build" / "test-models" / ("odd-" + "x".join(map(str, shape)))
    if not (d / "model.safetensors").exists():
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(cfg))
        subprocess.run([sys.executable, "-m", "codegen.synth", str(d), "--seed", "1", "--tokenizer", str(TINY_TOKENIZER)],
                       cwd=REPO, check=True, capture_output=True)
    args = ["-m", str(d), "-p", "Hello world, a prompt long enough for a prefill batch of tokens", "-n", "6", "--temp", "0"]
    if head_dim % 4:
        refuses(hbin, *args, message="the CPU decode step needs head_dim % 4 == 0")
    else:
        r = ingot(hbin, *args)
        assert r.returncode == 0, r.stderr.decode(errors="replace")[:3000]


def test_fuzz_server_seed_corpus():
    """The server's request handling (tests/fuzz/fuzz_server.c: libFuzzer with AddressSanitizer and
    UBSan) on its seed corpus, which holds every input kept from fuzzing it: no crash, and every
    property the target checks holds (a job's ids in the vocabulary and the context, a refusal's
    status and one-line message, the answers' JSON parsing for any bytes of text)."""
    if not shutil.which("clang"):
        pytest.skip("clang is not installed here: the fuzz targets build with it (make fuzz)")
    subprocess.run(["make", "-s", "build/fuzz/fuzz_server"], cwd=REPO, check=True, capture_output=True)
    inputs = sorted(str(p) for p in (FUZZ_CORPUS / "fuzz_server").iterdir())
    r = subprocess.run([str(REPO / "build" / "fuzz" / "fuzz_server"), *inputs], capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr.decode(errors="replace")[-3000:]
