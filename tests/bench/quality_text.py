"""Writes the fixed text that ingot's quality figures (perplexity, KL divergence) are measured on.

    python tests/bench/quality_text.py [OUT]      (default downloads/quality_text.txt)

The text is the license collection of Debian's base-files package (/usr/share/common-licenses):
the 14 license texts below, in this order, each followed by one empty line. base-files is
Essential, so every Debian machine has it without installing anything; the texts are English prose
that does not change (a GPL is never edited), 235 kB and 52,188 tokens of SmolLM2's tokenizer, more
than the 50k the measurement asks for. Each file and the whole text are pinned by sha256: a machine
whose copy differs (another distribution, another base-files) is refused, naming the file, rather
than measured on another text. Where the directory is missing, copy the text from a machine that has
it: its sha256 is what makes it the same text.

Prints the path of the text on success; one line on stderr and exit 1 otherwise.
"""

import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
DEFAULT_OUT = ROOT / "downloads" / "quality_text.txt"
LICENSES = Path("/usr/share/common-licenses")

# Debian 12 base-files 12.4+deb12u11; the symlinks (GPL, LGPL, GFDL) are left out: they repeat a file
FILES = [
    ("Apache-2.0", "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"),
    ("Artistic", "b7fd9b73ea99602016a326e0b62e6646060d18febdd065ceca8bb482208c3d88"),
    ("BSD", "5d588eb3b157d52112afea935c88a7ff9efddc1e2d95a42c25d3b96ad9055008"),
    ("CC0-1.0", "a2010f343487d3f7618affe54f789f5487602331c0a8d03f49e9a7c547cf0499"),
    ("GFDL-1.2", "d8e94ae5fdb5433fcae2961aeb1a8cf17174d6f4a0465d24bf37dd8a038bd439"),
    ("GFDL-1.3", "110535522396708cea37c72a802c5e7e81391139f5f7985631c93ef242b206a4"),
    ("GPL-1", "d77d235e41d54594865151f4751e835c5a82322b0e87ace266567c3391a4b912"),
    ("GPL-2", "8177f97513213526df2cf6184d8ff986c675afb514d4e68a404010521b880643"),
    ("GPL-3", "3972dc9744f6499f0f9b2dbf76696f2ae7ad8af9b23dde66d6af86c9dfb36986"),
    ("LGPL-2", "681e386e44a19d7d0674b4320272c90e66b6610b741e7e6305f8219c42e85366"),
    ("LGPL-2.1", "dc626520dcd53a22f727af3ee42c770e56c97a64fe3adb063799d8ab032fe551"),
    ("LGPL-3", "e3a994d82e644b03a792a930f574002658412f62407f5fee083f2555c5f23118"),
    ("MPL-1.1", "f849fc26a7a99981611a3a370e83078deb617d12a45776d6c4cada4d338be469"),
    ("MPL-2.0", "fab3dd6bdab226f1c08630b1dd917e11fcb4ec5e1e020e2c16f83a0a13863e85"),
]
TEXT_SHA256 = "8a6ce98354e15bb10b6281453015c78a3a527bf86d1d6d0d57b2b9bf3387e854"


class TextError(Exception):
    """The text cannot be made; the message is one line."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def build_text(licenses: Path = LICENSES) -> bytes:
    parts = []
    for name, want in FILES:
        path = licenses / name
        try:
            data = path.read_bytes()
        except OSError as e:
            raise TextError(f"{path}: {e.strerror} (Debian's base-files package provides it)") from None
        got = sha256(data)
        if got != want:
            raise TextError(f"{path}: sha256 {got}, expected {want} (another base-files version)")
        parts.append(data + b"\n")
    return b"".join(parts)


def write_text(out: Path = DEFAULT_OUT, licenses: Path = LICENSES) -> Path:
    """The text at out, written when missing; refuses a copy of another sha256."""
    if out.exists():
        data = out.read_bytes()
    else:
        data = build_text(licenses)
    got = sha256(data)
    if got != TEXT_SHA256:
        raise TextError(f"{out if out.exists() else licenses}: text sha256 {got}, expected {TEXT_SHA256}"
                        + (" (delete it to write it again)" if out.exists() else ""))
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(out)
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) > 1 or (argv and argv[0].startswith("-")):
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 1
    try:
        out = write_text(Path(argv[0]) if argv else DEFAULT_OUT)
    except TextError as e:
        print(f"quality_text: {e}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
