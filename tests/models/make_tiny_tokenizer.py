"""Train the tiny tokenizer shared by the tiny test models (tests/models/tiny-*).

    .venv/bin/python tests/models/make_tiny_tokenizer.py     # rewrites tiny-tokenizer/

A byte-level BPE like GPT-2's / SmolLM2's (GPT-2 pretokenizer regex, byte-to-unicode alphabet,
ByteLevel decoder) with VOCAB_SIZE = 400 entries: 3 special tokens, the 256 byte symbols and 141
merges learned from the fixed corpus below. Small enough that a test model's embedding table is
tiny, big enough that encoding exercises real merges, multi-byte UTF-8 and special tokens.
Deterministic: the same corpus and trainer settings give the same bytes (tests check that the
checked-in tokenizer.json matches what this script produces).
"""

import json
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

VOCAB_SIZE = 400
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
OUT_DIR = Path(__file__).resolve().parent / "tiny-tokenizer"

CORPUS = """\
The quick brown fox jumps over the lazy dog. The dog sleeps in the sun.
Once upon a time there was a little model that wanted to learn how to speak.
It read the same sentences again and again, and every time it read them it learned a bit more.
The weights of the model live in a file, and the program maps the file into memory.
Every token reads all of the weights once, so the speed depends on the memory bandwidth.
What is the capital of France? The capital of France is Paris.
How many legs does a spider have? A spider has eight legs.
Please write a short poem about the sea and the stars.
The sea is wide, the stars are bright, the ship sails on into the night.
int main(void) { return 0; }
for (int i = 0; i < n; i++) { sum += x[i] * w[i]; }
def forward(self, x): return self.norm(x) + x
print("hello, world")
1 2 3 4 5 6 7 8 9 10 11 12 100 1000 2024 3.14159 2.71828
user: hello! assistant: Hello! How can I help you today?
system: You are a helpful assistant.
Caf\u00e9, na\u00efve, r\u00e9sum\u00e9, \u00fcber, stra\u00dfe, \u00e5ngstr\u00f6m.
\u65e5\u672c\u8a9e\u306e\u6587\u7ae0\u3002 \u4e2d\u6587\u53e5\u5b50\u3002 \u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!
Emoji: \U0001f600 \U0001f680 \u2764\ufe0f
"""


def train():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Several copies so that frequent pairs clearly outrank once-seen ones.
    tok.train_from_iterator(CORPUS.splitlines() * 4, trainer)
    return tok


def tokenizer_config():
    added = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True}
             for i, t in enumerate(SPECIAL_TOKENS)}
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": "<|endoftext|>",
        "chat_template": (
            "{% for message in messages %}"
            "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
            "{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"),
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "model_max_length": 256,
        "pad_token": "<|endoftext|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "<|endoftext|>",
    }


def main(out_dir=OUT_DIR):
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = train()
    if tok.get_vocab_size() != VOCAB_SIZE:
        print(f"make_tiny_tokenizer: vocab {tok.get_vocab_size()}, expected {VOCAB_SIZE}: "
              f"grow the corpus", file=sys.stderr)
        return 1
    tok.save(str(out_dir / "tokenizer.json"), pretty=True)
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(), indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
