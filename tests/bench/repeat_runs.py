"""Whether a binary's GPU decode repeats itself: the same prompt's logits and greedy text, RUNS
times, against the first run. A build whose sums' order is not fixed (the fused MLP's reductions in
L2, MLP_FUSED) may differ in the last bits of its logits from run to run; this says by how much,
and whether the greedy tokens part.

    python tests/bench/repeat_runs.py BINARY MODEL_DIR [--runs 5] [-n 128] [-p PROMPT]

Prints one line: the runs, how many logits dumps were bit-equal to the first, the largest absolute
difference of any logit against the first run's, and how many greedy texts equal the first."""
import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

PROMPT = "The quick brown fox jumps over the lazy dog, and then it runs far into the hills."


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("binary")
    ap.add_argument("model_dir")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("-n", type=int, default=128, help="greedy tokens a run")
    ap.add_argument("-p", "--prompt", default=PROMPT)
    args = ap.parse_args()
    if args.runs < 2:
        sys.exit("repeat_runs.py: --runs must be at least 2")

    def run(*extra: str) -> bytes:
        """the run's standard output, as bytes (a random-weight model's text need not be UTF-8)"""
        r = subprocess.run([args.binary, "-m", args.model_dir, "--device", "cuda", "-p", args.prompt, *extra],
                           capture_output=True)
        if r.returncode != 0:
            sys.exit(f"repeat_runs.py: {args.binary} failed: {r.stderr.decode(errors='replace').strip()[-300:]}")
        return r.stdout

    with tempfile.TemporaryDirectory() as tmp:
        logits = []
        for i in range(args.runs):
            out = Path(tmp) / f"logits{i}.bin"
            run("--dump-logits", str(out))
            logits.append(np.fromfile(out, dtype=np.float32))
    texts = [run("-n", str(args.n), "--temp", "0") for _ in range(args.runs)]
    first = logits[0]
    equal = sum(bool(np.array_equal(first, x)) for x in logits[1:])
    diff = max(float(np.max(np.abs(first - x))) for x in logits[1:])
    same_text = sum(t == texts[0] for t in texts[1:])
    print(f"{args.binary}: {args.runs} runs; logits bit-equal to the first: {equal}/{args.runs - 1}, "
          f"largest difference {diff:.3g} (of {first.size} logits, max |logit| {float(np.max(np.abs(first))):.3g}); "
          f"greedy texts of {args.n} tokens equal to the first: {same_text}/{args.runs - 1}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
