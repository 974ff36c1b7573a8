"""The C tokenizer (runtime/tokenizer.c) against the Hugging Face `tokenizers` library: exact ids.

Each tokenizer below is built here with the library (a small BPE trained on TRAIN_TEXT, or a
vocab assembled from one), saved as tokenizer.json, and driven through build/tests/tok_cli. The
library is the reference: every corpus string must give the same ids, and decoding the library's
ids must give the library's text.

    .venv/bin/python -m pytest tests/test_tokenizer.py -q
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from conftest import make

REPO = Path(__file__).resolve().parent.parent
TOK_CLI = REPO / "build" / "tests" / "tok_cli"
SMOLLM2_JSON = REPO / "models" / "smollm2-135m-instruct" / "tokenizer.json"

GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
             r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = LLAMA3_RE.replace(r"\p{N}{1,3}", r"\p{N}")

CHAT_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

LONG_PARAGRAPH = (
    "The history of computing is longer than the history of computing hardware and modern computing "
    "technology and includes the history of methods intended for pen and paper or for chalk and slate, "
    "with or without the aid of tables. Digital computing is intimately tied to the representation of "
    "numbers. But long before abstractions like the number arose, there were mathematical concepts to "
    "serve the purposes of civilization. These concepts are implicit in concrete practices such as "
    "one-to-one correspondence, the basis of counting. In 1837, Charles Babbage first described his "
    "Analytical Engine, which is accepted as the first design for a modern computer; it'd have had "
    "1,000 numbers of 40 decimal digits each (about 16.6 kB). Isn't that remarkable? We'll see...  "
) * 3

TRAIN_TEXT = [
    LONG_PARAGRAPH,
    "Hello world! Hello, world. hello there, how are you doing today? I'm fine, thanks; you're kind.",
    "We've been there. They'd know. I'll go. He's here. It's 3:45pm on 2024-05-17 and 12,345 people came.",
    "def main(argv):\n    for i in range(10):\n        print(f\"{i} squared is {i ** 2}\")\n    return 0\n",
    "int main(void) {\n\tint x = 42;\n\tif (x != 0 && y <= 3) { return x; }\n\treturn -1;\n}\n",
    "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX! the the the and and of of to to",
    "café naïve résumé Zürich façade déjà vu Ångström crème brûlée piñata",
    "日本語のテキストです。東京は日本の首都です。中文文本。这是一个测试。한국어 텍스트입니다.",
    "Привет мир, как дела? Γειά σου κόσμε. مرحبا بالعالم. שלום עולם.",
    "emoji 🍕🎉👍 are fun 😀😀 and 👨‍👩‍👧‍👦 families",
    "numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000 10000 3.14159 2.71828 1e-9 0x1F",
    "   indented\n\n\n\ttabbed\t\tline   \r\n  trailing   \n",
]

CORPUS = [
    "",
    " ",
    "\n",
    "Hello world",
    "Hello, world! How are you doing today?",
    "hello",
    " hello",
    "  hello",
    "def foo(x):\n    return x**2 + 1  # comment\n\tif a != b:\n\t\tpass\n",
    "int main(void) {\n\treturn 0;\n}\n",
    "   leading spaces",
    "trailing spaces   ",
    "trailing newline\n",
    "tabs\t\tand\nnewlines\n\n\nend",
    "\r\n windows\r\nline\r\n",
    "  \n  \n",
    "a  b   c    d     e",
    "x \t\n y",
    "1234567890",
    "pi is 3.14159265358979 and e is 2.718",
    "year 2024, 12,345,678 and 007",
    "9" * 41,
    "I'm you're he's we've they'd I'll can't",
    "I'M YOU'RE HE'S WE'VE THEY'D I'LL CAN'T",
    "it'S iT'lL 'tis ''quoted'' 's",
    "it\u017f it'\u017f it'\u017ft IT'Sx it'LLama x'dd",
    "café naïve résumé Zürich façade",
    "cafe\u0301 Ange\u0301lique \u212bngstr\u00f6m \u1100\u1161\u11a8 a\u0328\u0301 a\u0346\u0301 \u0301x",
    "日本語のテキストです。中文文本。한국어 텍스트",
    "I love 🍕 and 🎉!!",
    "👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag, 👍🏽 thumbs",
    "Привет мир; Γειά σου; مرحبا; שלום",
    "a\u00a0b\u2003c\u3000d\u2028e\u0085f",
    "a\x1cb\x1fc\u180ed\u200be\u00b2f\u3007g\u2160h\u0660\u0669i\ufe0f\x00j\x7f k\x0b\x0c l",
    "!!!???...,,,;;; --- *** ###",
    "hello123world456 ３４５ Ⅻ ½¾",
    "supercalifragilisticexpialidocious",
    "a" * 300,
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "a<|endoftext|>b",
    " <|endoftext|> ",
    "<|im_start|><|im_end|>",
    "<s>Hello</s> <s> world",
    "<unk> and <0x41>",
    "<|end <|endo <|endoftext|>",
    "a <mask> b<mask>  c   <mask>",
    "say hello world, yell ell bell x  ell",
    LONG_PARAGRAPH,
]


# ---------------------------------------------------------------------------- the driver

@pytest.fixture(scope="session")
def tok_cli() -> Path:
    make("build/tests/tok_cli")
    return TOK_CLI


def c_encode(cli: Path, path: Path, text: str | bytes, add_special: bool = True) -> list[int]:
    data = text.encode("utf-8") if isinstance(text, str) else text
    args = [str(cli), str(path), "encode"] + ([] if add_special else ["--no-special"])
    r = subprocess.run(args, input=data, capture_output=True)
    assert r.returncode == 0, f"tok_cli failed on {text!r}: {r.stderr.decode()}"
    return [int(x) for x in r.stdout.split()]


def c_decode(cli: Path, path: Path, ids: list[int]) -> bytes:
    r = subprocess.run([str(cli), str(path), "decode", *map(str, ids)], capture_output=True)
    assert r.returncode == 0, f"tok_cli decode failed on {ids}: {r.stderr.decode()}"
    return r.stdout


def c_error(cli: Path, path: Path, *args: str, stdin: bytes = b"") -> str:
    r = subprocess.run([str(cli), str(path), *args], input=stdin, capture_output=True)
    assert r.returncode == 1, f"expected failure, got {r.returncode}: {r.stdout!r}"
    lines = r.stderr.decode().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def check_corpus(cli: Path, path: Path, corpus=CORPUS) -> None:
    hf = Tokenizer.from_file(str(path))
    for text in corpus:
        for add_special in (True, False):
            want = hf.encode(text, add_special_tokens=add_special).ids
            got = c_encode(cli, path, text, add_special)
            assert got == want, f"{path.name}: {text[:80]!r} add_special={add_special}"


def check_decode(cli: Path, path: Path, corpus=CORPUS) -> None:
    hf = Tokenizer.from_file(str(path))
    for text in corpus:
        for add_special in (True, False):  # without: the text's first token starts the decode
            ids = hf.encode(text, add_special_tokens=add_special).ids
            want = hf.decode(ids, skip_special_tokens=False)
            assert c_decode(cli, path, ids).decode("utf-8") == want, f"{path.name}: {text[:80]!r} ids {ids[:20]}"


# ---------------------------------------------------------------------------- the tokenizers

def train(tok: Tokenizer, vocab_size: int, specials: list[str], byte_level: bool = True,
          text: list[str] = TRAIN_TEXT) -> Tokenizer:
    """Trains tok in place. Deterministic: no limit_alphabet, whose ties the trainer breaks at random."""
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet() if byte_level else [])
    tok.train_from_iterator(text, trainer=trainer)
    return tok


def save(tok: Tokenizer, path: Path, edit=None) -> Path:
    """Saves tok; edit(d) may change the JSON first (for options the Python API does not set)."""
    if edit is not None:
        d = json.loads(tok.to_str())
        edit(d)
        tok = Tokenizer.from_str(json.dumps(d))
    tok.save(str(path))
    return path


def byte_level_tokenizer(pre, specials=CHAT_SPECIALS, vocab_size=1200) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    return train(tok, vocab_size, specials)


@pytest.fixture(scope="session")
def tokdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tokenizers")


@pytest.fixture(scope="session")
def smollm2_style(tokdir) -> Path:
    """SmolLM2: Digits(individual) + ByteLevel with the GPT-2 regex, merges as "a b" strings."""
    tok = byte_level_tokenizer(pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]))
    tok.post_processor = processors.ByteLevel(trim_offsets=False)

    def legacy_merges(d):
        d["model"]["merges"] = [" ".join(m) for m in d["model"]["merges"]]
    return save(tok, tokdir / "smollm2_style.json", legacy_merges)


@pytest.fixture(scope="session")
def gpt2_style(tokdir) -> Path:
    """GPT-2: ByteLevel alone with add_prefix_space, which puts a space before every split; added
    tokens that overlap (leftmost-longest wins), strip white space, or are normalized."""
    tok = byte_level_tokenizer(pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True),
                               specials=["<|endoftext|>", "<|end"])
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=True, special=True, normalized=False)])
    tok.add_tokens([AddedToken("hello world", normalized=True), AddedToken("<|endo", normalized=False)])
    return save(tok, tokdir / "gpt2_style.json")


LLAMA3_WORDS = ["Ġsupercalifragilisticexpialidocious", "Ġhistory", "ĠCharles", "aaaaaaaaaa"]


@pytest.fixture(scope="session")
def llama3_style(tokdir) -> Path:
    """Llama-3: Split(Llama-3 regex) + ByteLevel(use_regex=false), ignore_merges, BOS template, and
    whole words in the vocab that the merges would not produce (so ignore_merges matters)."""
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tok = byte_level_tokenizer(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), specials=specials)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)])])

    def edit(d):
        d["model"]["ignore_merges"] = True
        vocab = d["model"]["vocab"]
        for w in LLAMA3_WORDS:
            if w not in vocab:
                vocab[w] = max(max(vocab.values()), max(a["id"] for a in d["added_tokens"])) + 1
    return save(tok, tokdir / "llama3_style.json", edit)


@pytest.fixture(scope="session")
def qwen2_style(tokdir) -> Path:
    """Qwen2: NFC, Split(Qwen2 regex: single digits) + ByteLevel(use_regex=false)."""
    tok = byte_level_tokenizer(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]))
    tok.normalizer = normalizers.NFC()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return save(tok, tokdir / "qwen2_style.json")


def sentencepiece_tokenizer(byte_fallback: bool = True) -> Tokenizer:
    """A Llama-2-style vocab: <unk> <s> </s>, the 256 byte tokens, then a BPE trained on the Latin
    letters of the text only, so that CJK, Cyrillic, emoji... need byte fallback (or <unk>)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    latin = ["".join(c for c in s if ord(c) < 0x250) for s in TRAIN_TEXT]
    train(tok, 700, [], byte_level=False, text=latin)
    trained = json.loads(tok.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    if byte_fallback:
        vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for t, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(t, len(vocab))
    merges = [tuple(m) for m in trained["merges"]]
    sp = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True,
                              byte_fallback=byte_fallback))
    sp.add_special_tokens(["<unk>", "<s>", "</s>"])
    sp.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                    decoders.Strip(" ", 1, 0)])
    sp.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                      special_tokens=[("<s>", 1)])
    return sp


@pytest.fixture(scope="session")
def llama2_style(tokdir) -> Path:
    """Llama-2 (legacy): normalizer Prepend("▁") + Replace(" ", "▁"), no pre-tokenizer."""
    tok = sentencepiece_tokenizer()
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.add_tokens([AddedToken(" ell", normalized=True)])  # matched as "▁▁ell" in the normalized text
    return save(tok, tokdir / "llama2_style.json")


@pytest.fixture(scope="session")
def mistral_style(tokdir) -> Path:
    """Mistral / newer Llama-2: Metaspace(prepend_scheme first, split false), no normalizer."""
    tok = sentencepiece_tokenizer()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    return save(tok, tokdir / "mistral_style.json")


@pytest.fixture(scope="session")
def metaspace_split(tokdir) -> Path:
    """Metaspace(always, split) with the Metaspace decoder, and no byte fallback: unknown
    characters become one fused <unk>."""
    tok = sentencepiece_tokenizer(byte_fallback=False)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    return save(tok, tokdir / "metaspace_split.json")


ALL_STYLES = ["smollm2_style", "gpt2_style", "llama3_style", "qwen2_style", "llama2_style", "mistral_style",
              "metaspace_split"]


# ---------------------------------------------------------------------------- the tests

@pytest.mark.parametrize("style", ALL_STYLES)
def test_encode_matches_library(tok_cli, style, request):
    check_corpus(tok_cli, request.getfixturevalue(style))


@pytest.mark.parametrize("style", ALL_STYLES)
def test_plain_specials_match_library(tok_cli, style, request):
    """tok_encode_marked with nothing marked: special tokens' text is plain text, as the library's
    encode_special_tokens (split_special_tokens) makes it; what a chat message's content gets."""
    path = request.getfixturevalue(style)
    hf = Tokenizer.from_file(str(path))
    hf.encode_special_tokens = True
    with_specials = [t for t in CORPUS if "<" in t]
    assert len(with_specials) >= 5
    for text in with_specials:
        want = hf.encode(text, add_special_tokens=True).ids
        r = subprocess.run([str(tok_cli), str(path), "encode", "--plain"], input=text.encode(), capture_output=True)
        assert r.returncode == 0, r.stderr.decode()
        assert [int(x) for x in r.stdout.split()] == want, f"{path.name}: {text[:80]!r}"
    # and it differs from the ordinary encoding where the text holds a special token
    assert c_encode(tok_cli, path, "<|im_start|>user") != hf.encode("<|im_start|>user").ids or \
        hf.token_to_id("<|im_start|>") is None


@pytest.mark.parametrize("style", ALL_STYLES)
def test_decode_matches_library(tok_cli, style, request):
    check_decode(tok_cli, request.getfixturevalue(style))


def test_known_ids(tok_cli, llama3_style, llama2_style, smollm2_style):
    """Spot checks that do not depend on the library agreeing with itself."""
    hf = Tokenizer.from_file(str(llama3_style))
    bos = hf.token_to_id("<|begin_of_text|>")
    ids = c_encode(tok_cli, llama3_style, " supercalifragilisticexpialidocious")
    assert ids == [bos, hf.token_to_id("Ġsupercalifragilisticexpialidocious")]  # ignore_merges
    assert c_encode(tok_cli, llama3_style, "", add_special=True) == [bos]
    # Llama-2: <s>, then byte fallback for a character outside the small alphabet (U+1F355 pizza)
    ids = c_encode(tok_cli, llama2_style, "🍕")
    hf2 = Tokenizer.from_file(str(llama2_style))
    assert ids[0] == 1 and ids[-4:] == [hf2.token_to_id(f"<0x{b:02X}>") for b in "🍕".encode()]
    # SmolLM2: every digit alone
    hf3 = Tokenizer.from_file(str(smollm2_style))
    assert c_encode(tok_cli, smollm2_style, "2024") == [hf3.token_to_id(d) for d in "2024"]


def test_chat_special_tokens(tok_cli, smollm2_style):
    hf = Tokenizer.from_file(str(smollm2_style))
    ids = c_encode(tok_cli, smollm2_style, "<|im_start|>user\nHi<|im_end|>")
    assert ids[0] == hf.token_to_id("<|im_start|>") and ids[-1] == hf.token_to_id("<|im_end|>")


def test_invalid_utf8(tok_cli, smollm2_style):
    for data, offset in [(b"abc\xff", 3), (b"ab\xe6\x97", 2), (b"\xc0\xaf", 0), (b"x\xed\xa0\x80", 1),
                         (b"ok \xf4\x90\x80\x80", 3), (b"\x80", 0)]:
        line = c_error(tok_cli, smollm2_style, "encode", stdin=data)
        assert line.startswith("invalid UTF-8: ") and f"byte {offset} " in line, line


def refuse(tok_cli, tokdir, name, tok_or_edit, base=None) -> str:
    if base is not None:
        d = json.loads(base.read_text())
        tok_or_edit(d)
        path = tokdir / name
        path.write_text(json.dumps(d))
    else:
        path = save(tok_or_edit, tokdir / name)
    return c_error(tok_cli, path, "encode", stdin=b"hello")


def test_refuses_unsupported(tok_cli, tokdir, smollm2_style):
    tok = byte_level_tokenizer(pre_tokenizers.Whitespace(), vocab_size=300)
    line = refuse(tok_cli, tokdir, "whitespace.json", tok)
    assert line.startswith("tokenizer: ") and '"Whitespace" is not supported' in line and "pre_tokenizer" in line

    def other_regex(d):
        d["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": r"\w+"}, "behavior": "Isolated", "invert": False}
    line = refuse(tok_cli, tokdir, "regex.json", other_regex, smollm2_style)
    assert line.startswith("tokenizer: ") and r'"\w+"' in line

    def wordpiece(d):
        d["model"]["type"] = "WordPiece"
    assert 'model.type: "WordPiece" is not supported' in refuse(tok_cli, tokdir, "wp.json", wordpiece, smollm2_style)

    def lowercase(d):
        d["normalizer"] = {"type": "Lowercase"}
    assert '"Lowercase" is not supported' in refuse(tok_cli, tokdir, "lc.json", lowercase, smollm2_style)

    def bad_merge(d):
        d["model"]["merges"].append("zzq qqz")
    assert "model.merges" in refuse(tok_cli, tokdir, "merge.json", bad_merge, smollm2_style)


def test_decode_out_of_range(tok_cli, smollm2_style):
    n = Tokenizer.from_file(str(smollm2_style)).get_vocab_size()
    assert "not in [0, " in c_error(tok_cli, smollm2_style, "decode", "1", str(n + 5))


def test_real_smollm2(tok_cli):
    if not SMOLLM2_JSON.exists():
        pytest.skip(f"{SMOLLM2_JSON.relative_to(REPO)} is absent: the model importer has not run")
    check_corpus(tok_cli, SMOLLM2_JSON)
    check_decode(tok_cli, SMOLLM2_JSON)


def test_unicode_tables_current():
    """runtime/unicode_data.c is what codegen/unicode_tables.py generates from this Python."""
    r = subprocess.run([sys.executable, "-m", "codegen.unicode_tables", "--check"], cwd=REPO, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
