"""One executable carrying its model: a built ingot binary with the model directory's files appended
(`make appliance MODEL=...`). The layout and the hash are runtime/bundle.h's; the binary finds the
files in itself at start, checks them and runs as if given -m with that directory.

    python -m codegen.appliance build/<name>/ingot models/<name> build/appliance/<name>
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
from pathlib import Path

import numpy as np

MAGIC = b"INGOTAPP"
# bundle.c's mark, turned on in the appliance: without its trailer it refuses to start
MARK_OFF, MARK_ON = b"INGOT-BUNDLE-EXPECTED:0", b"INGOT-BUNDLE-EXPECTED:1"
VERSION = 1
TRAILER_BYTES = 64
ENTRY_BYTES = 96
NAME_BYTES = 64
ALIGN = 4096
MUL_INDEX = np.uint64(0x9E3779B97F4A7C15)
MUL_WORD = np.uint64(0xBF58476D1CE4E5B9)
CHUNK = 64 << 20  # bytes hashed at once: a multiple of 8

# What the runtime reads from a model directory; the weights are added after these.
MODEL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json")


class Hasher:
    """bundle_hash over bytes given in pieces (each but the last a multiple of 8 bytes long)."""

    def __init__(self) -> None:
        self.h = np.uint64(0)
        self.words = 0
        self.size = 0

    def update(self, data: bytes) -> None:
        assert self.size % 8 == 0, "only the last piece may end inside a word"
        self.size += len(data)
        if len(data) % 8:
            data = data + bytes(8 - len(data) % 8)
        w = np.frombuffer(data, dtype="<u8")
        i = np.arange(self.words, self.words + len(w), dtype=np.uint64)
        with np.errstate(over="ignore"):
            self.h = np.uint64(self.h + np.sum((w ^ (i * MUL_INDEX)) * MUL_WORD, dtype=np.uint64))
        self.words += len(w)

    def digest(self) -> int:
        return int(self.h) ^ self.size


def bundle_hash(data: bytes) -> int:
    h = Hasher()
    h.update(data)
    return h.digest()


def model_files(model_dir: Path) -> list[Path]:
    """The files of model_dir an appliance needs: config, tokenizer, chat template, the weights
    (model.safetensors, or the index and every shard it names)."""
    files = [model_dir / n for n in MODEL_FILES if (model_dir / n).exists()]
    for needed in ("config.json", "tokenizer.json"):
        if not (model_dir / needed).exists():
            raise SystemExit(f"appliance: {model_dir / needed} is missing")
    if (model_dir / "model.safetensors").exists():
        files.append(model_dir / "model.safetensors")
    elif (model_dir / "model.safetensors.index.json").exists():
        index = model_dir / "model.safetensors.index.json"
        files.append(index)
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files += [model_dir / s for s in shards]
    else:
        raise SystemExit(f"appliance: {model_dir} has no model.safetensors nor model.safetensors.index.json")
    for f in files:
        if len(f.name.encode()) > NAME_BYTES or "/" in f.name:
            raise SystemExit(f"appliance: {f}: a name longer than {NAME_BYTES} bytes cannot be bundled")
    return files


def write_appliance(binary: Path, model_dir: Path, out: Path) -> None:
    program = binary.read_bytes()
    if program[-TRAILER_BYTES:][:8] == MAGIC:
        raise SystemExit(f"appliance: {binary} already carries a model")
    if program.count(MARK_OFF) != 1:
        raise SystemExit(f"appliance: {binary} does not hold bundle.c's mark once: not an ingot binary of this version")
    program = program.replace(MARK_OFF, MARK_ON)
    files = model_files(model_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    entries = []
    with open(tmp, "wb") as w:
        w.write(program)
        for f in files:
            w.write(bytes(-w.tell() % ALIGN))
            offset = w.tell()
            h = Hasher()
            with open(f, "rb") as r:
                while chunk := r.read(CHUNK):
                    h.update(chunk)
                    w.write(chunk)
            entries.append((f.name, offset, h.size, h.digest()))
        table = b"".join(
            struct.pack("<64sQQQ8x", name.encode(), offset, size, digest) for name, offset, size, digest in entries
        )
        assert len(table) == ENTRY_BYTES * len(entries)
        table_offset = w.tell()
        w.write(table)
        w.write(struct.pack("<8sIIQQ32x", MAGIC, VERSION, len(entries), table_offset, bundle_hash(table)))
    os.chmod(tmp, 0o755)
    os.replace(tmp, out)
    total = sum(e[2] for e in entries)
    print(f"appliance: {out} ({(len(program) + total) / 1e6:.1f} MB): {binary.name} with "
          + ", ".join(e[0] for e in entries))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("binary", type=Path, help="the ingot binary built for the model")
    p.add_argument("model_dir", type=Path, help="the model directory it was built for")
    p.add_argument("out", type=Path, help="the appliance to write")
    a = p.parse_args(argv)
    write_appliance(a.binary, a.model_dir, a.out)


if __name__ == "__main__":
    main(sys.argv[1:])
