"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/) from the project's own
files and a few hand-made variants that reach each feature of a parser. Run from the repo root:
    .venv/bin/python tests/fuzz/make_corpus.py
Inputs kept from fuzzing as regression seeds (crash-*, timeout-*) are not touched."""

from __future__ import annotations

import copy
import json
import struct
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
OUT = REPO / "tests" / "fuzz" / "corpus"
SEP = b"\n@@\n"  # fuzz_common.h fuzz_split: a second input after the first


def write(target: str, name: str, data: bytes) -> None:
    d = OUT / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


def safetensors(tensors: dict, pad: int = 8) -> bytes:
    """A safetensors file of {name: (dtype, shape, bytes)}."""
    header, data = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % pad)
    return struct.pack("<Q", len(h)) + h + data


def main() -> None:
    # config.json: every known config
    for p in sorted(REPO.glob("models/*/config.json")) + sorted(REPO.glob("tests/models/*/config.json")):
        write("fuzz_config", p.parent.name + ".json", p.read_bytes())
        write("fuzz_json", "config-" + p.parent.name + ".json", p.read_bytes())

    # safetensors: the table fuzz_safetensors.c binds (w F32 [2, 2], b BF16 [4], h F16 [3])
    good = {"w": ("F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)), "b": ("BF16", [4], b"\x80\x3f" * 4),
            "h": ("F16", [3], b"\x00\x3c" * 3)}
    write("fuzz_safetensors", "good.safetensors", safetensors(good))
    with_inv = dict(good, **{"model.rotary_emb.inv_freq": ("F32", [1], struct.pack("<f", 1))})
    write("fuzz_safetensors", "ignored.safetensors", safetensors(with_inv))
    write("fuzz_safetensors", "nan.safetensors",
          safetensors(dict(good, w=("F32", [2, 2], struct.pack("<4f", 1, float("nan"), 3, 4)))))
    write("fuzz_safetensors", "i64.safetensors", safetensors(dict(good, pos=("I64", [2], b"\0" * 16))))
    write("fuzz_json", "safetensors-header.json", safetensors(good)[8:].rstrip())

    # tokenizer.json: the tiny test tokenizer and variants with each supported component
    tiny = json.loads((REPO / "tests" / "models" / "tiny-tokenizer" / "tokenizer.json").read_text())
    texts = [b"", SEP + b"Hello world", SEP + "h\u00e9llo 123 <|im_start|>x".encode()]
    variants = {
        "bytelevel": tiny,
        "metaspace": dict(tiny, pre_tokenizer={"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                                               "split": True},
                          decoder={"type": "Sequence", "decoders": [
                              {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                              {"type": "ByteFallback"}, {"type": "Fuse"},
                              {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}),
        "normalizer": dict(tiny, normalizer={"type": "Sequence", "normalizers": [
                               {"type": "Prepend", "prepend": "\u2581"},
                               {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}, {"type": "NFC"}]},
                           pre_tokenizer=None),
        "template": dict(tiny, post_processor={"type": "TemplateProcessing",
                                               "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                                                          {"Sequence": {"id": "A", "type_id": 0}}],
                                               "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [1],
                                                                                   "tokens": ["<|im_start|>"]}}}),
        "split-digits": dict(tiny, pre_tokenizer={"type": "Sequence", "pretokenizers": [
                                 {"type": "Digits", "individual_digits": True},
                                 {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}]}),
    }
    for name, tok in variants.items():
        for k, text in enumerate(texts):
            write("fuzz_tokenizer", f"{name}-{k}.json", json.dumps(tok).encode() + text)

    # chat data: tokenizer_config.json files, with and without a generation_config.json after SEP
    configs = [REPO / "tests" / "models" / "tiny-tokenizer" / "tokenizer_config.json",
               REPO / "models" / "smollm2-135m-instruct" / "tokenizer_config.json"]
    chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    bos = "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}"
    for p in configs:
        write("fuzz_chat", p.parent.name + ".json", p.read_bytes())
    write("fuzz_chat", "chatml.json", json.dumps({"chat_template": chatml}).encode() +
          SEP + json.dumps({"eos_token_id": [2, 0]}).encode())
    write("fuzz_chat", "bos.json", json.dumps({"chat_template": [{"name": "default", "template": bos}],
                                               "bos_token": {"content": "<|im_start|>"}, "eos_token": "<|im_end|>"}
                                              ).encode())
    for p in configs[:1]:
        write("fuzz_json", "tokenizer-config.json", p.read_bytes())
    # the command line: arguments separated by NUL bytes (fuzz_cli.c), each mode once
    argvs = {
        "complete": ["-p", "Hello", "-n", "4"],
        "chat": ["--chat", "-p", "Hi", "--temp", "0", "-n", "6"],
        "chat-system": ["--chat", "--system", "be brief", "-p", "hi", "-n", "3"],
        "tokenize": ["--tokenize", "-p", "h\u00e9llo <|im_start|>"],
        "tokenize-chat": ["--tokenize", "--chat", "-f", "p"],
        "perplexity": ["--perplexity", "p", "--ctx", "8"],
        "logits": ["-f", "p", "--dump-logits", "out", "--dump-prefill", "2"],
        "sampling": ["--top-k", "5", "--top-p", "0.5", "--min-p", "0.1", "--repeat-penalty", "1.3", "--seed", "7",
                     "--temp", "1.5", "-p", "x", "-n", "8"],
        "context": ["--ctx", "4", "-p", "a long prompt that does not fit"],
        "device": ["--device", "cpu", "-n", "0", "-p", "x", "--check-weights"],
    }
    for name, argv in argvs.items():
        write("fuzz_cli", name, b"\0".join(a.encode() for a in argv))
    # the server: the URL, a newline, the body (fuzz_server.c), each request field once
    chat = {"model": "tiny-llama", "messages": [{"role": "system", "content": "be brief"},
                                                 {"role": "user", "content": "h\u00e9llo"}]}
    requests = {
        "chat": ("/v1/chat/completions", chat),
        "chat-parts": ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}),
        "chat-sampling": ("/v1/chat/completions", {**chat, "temperature": 0.7, "top_p": 0.9, "top_k": 5, "min_p": 0.1,
                                                   "seed": 3, "max_tokens": 4, "max_completion_tokens": 4, "stop": ["\n", "x"],
                                                   "stream": True, "stream_options": {"include_usage": True},
                                                   "repeat_penalty": 1.1, "n": 1}),
        "completion": ("/v1/completions", {"prompt": "Once upon", "max_tokens": 3, "stop": "."}),
        "completion-long": ("/v1/completions", {"prompt": "a " * 300}),
        "health": ("/health", None),
        "models": ("/v1/models", None),
    }
    for name, (url, body) in requests.items():
        write("fuzz_server", name, url.encode() + b"\n" + (json.dumps(body).encode() if body is not None else b""))
    write("fuzz_server", "text-bytes", b"/v1/chat/completions\n\xff\xfe\xc3\x28 \xe2\x82 \x00\x1b[1m \"quoted\" \\ \xf0\x9f\x98\x80")
    write("fuzz_json", "escapes.json", b'{"a": "\\u00e9\\ud83d\\ude00\\n", "b": [1, -2.5e3, true, false, null, {}]}')


if __name__ == "__main__":
    main()
