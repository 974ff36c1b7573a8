"""The quality table of docs/quality.md: each build of a model against the unquantized base.

    python tests/bench/quality_table.py BASE_BINARY BASE_MODEL [LABEL=BINARY:MODEL ...]
        [--text FILE] [--ctx 512] [--threads N] [--base-file FILE] [--device cpu|cuda]

Runs BASE_BINARY on BASE_MODEL over the quality text with --kl-base (skipped when --base-file
already exists: the base is the slow half and is the same for every row), then each LABEL's binary
with --kl against it, and prints the table's rows in Markdown: format, size (bytes of the model's
weight files: *.safetensors in a directory, or the .gguf), ppl ± error, ppl ratio ± error, mean KL
± error, top-1 agreement ± error. The base's own row is the base compared against itself (KL of
the 16-bit rounding of the base file only). Each run's full report goes to stderr.
"""
import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quality_text import DEFAULT_OUT, TextError, write_text  # noqa: E402


def weight_bytes(model: Path) -> int:
    if model.is_file():
        return model.stat().st_size
    return sum(p.stat().st_size for p in model.glob("*.safetensors"))


def perplexity_cmd(binary: str, model: Path, args, mode: str, base_file: Path) -> list:
    """binary's --perplexity run of model over the text, with mode (--kl or --kl-base) base_file"""
    cmd = [binary, "-m", str(model), "--perplexity", str(args.text), "--ctx", str(args.ctx), mode, str(base_file)]
    cmd += ["--threads", str(args.threads)] if args.threads else []
    cmd += ["--device", args.device] if args.device else []
    return cmd


def kl_row(label: str, binary: str, model: Path, args, base_file: Path) -> str:
    cmd = perplexity_cmd(binary, model, args, "--kl", base_file)
    r = subprocess.run(cmd, capture_output=True, text=True)
    sys.stderr.write(f"== {label}: {' '.join(cmd)}\n{r.stdout}{r.stderr}")
    if r.returncode != 0:
        sys.exit(f"quality_table: {label}: {r.stderr.strip() or 'exit ' + str(r.returncode)}")
    fig = {}
    for line in r.stdout.splitlines()[2:]:
        name, rest = line[:25].strip(), line[25:].split()
        fig[name] = (rest[0], rest[2] if len(rest) > 2 and rest[1] == "±" else "")
    size = weight_bytes(model) / 1e6

    def pm(name, unit=""):
        v, e = fig[name]
        return f"{v} ± {e}{unit}"
    return (f"| {label} | {size:.1f} MB | {pm('ppl(Q)')} | {pm('ppl(Q)/ppl(base)')} | {pm('mean KL')} | "
            f"{pm('same top', ' %')} | |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base_binary")
    ap.add_argument("base_model", type=Path)
    ap.add_argument("rows", nargs="*", help="LABEL=BINARY:MODEL")
    ap.add_argument("--text", type=Path, default=None, help="default: tests/bench/quality_text.py's")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--device", choices=["cpu", "cuda"])
    ap.add_argument("--base-file", type=Path, default=Path("build/quality/base.klbase"))
    ap.add_argument("--no-base-row", action="store_true", help="skip the base against itself (a run as long as the base's)")
    args = ap.parse_args()
    if args.text is None:
        try:
            args.text = write_text(DEFAULT_OUT)
        except TextError as e:
            sys.exit(f"quality_table: {e}")
    if not args.base_file.exists():
        args.base_file.parent.mkdir(parents=True, exist_ok=True)
        cmd = perplexity_cmd(args.base_binary, args.base_model, args, "--kl-base", args.base_file)
        r = subprocess.run(cmd, capture_output=True, text=True)
        sys.stderr.write(f"== base: {' '.join(cmd)}\n{r.stdout}{r.stderr}")
        if r.returncode != 0:
            sys.exit(f"quality_table: base: {r.stderr.strip()}")
    print("| format | size | ppl | ppl ratio | mean KL | top-1 agreement | llama.cpp (Llama 3 8B) |")
    print("|---|---|---|---|---|---|---|")
    if not args.no_base_row:
        print(kl_row("base", args.base_binary, args.base_model, args, args.base_file))
    for row in args.rows:
        label, _, rest = row.partition("=")
        binary, _, model = rest.partition(":")
        if not (label and binary and model):
            sys.exit(f"quality_table: {row!r}: expected LABEL=BINARY:MODEL")
        print(kl_row(label, binary, Path(model), args, args.base_file))
    return 0


if __name__ == "__main__":
    sys.exit(main())
