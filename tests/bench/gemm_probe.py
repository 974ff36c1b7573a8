"""The bf16 tensor-core rate a plain GEMM reaches on this GPU: torch.matmul (cuBLAS, fp32 sums) of
two n x n bf16 matrices, best of 20 after 3 warm-ups, for n = 4096 and 8192. The prompt's share of
the tensor cores is `--bench`'s prompt TFLOP/s (runtime/main.c, prompt_flops) over the larger of
these, measured in the same run (tests/bench/ab.sh prints both). Needs torch with CUDA (the GPU
machine's python3).

    python3 tests/bench/gemm_probe.py
"""

import sys
import time


def main() -> int:
    try:
        import torch
    except ImportError:
        print("gemm_probe.py: torch is not installed here (the GPU machine's python3 has it)", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("gemm_probe.py: no CUDA device", file=sys.stderr)
        return 1
    for n in (4096, 8192):
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            a @ b
        best = float("inf")
        for _ in range(20):
            torch.cuda.synchronize()
            t = time.perf_counter()
            a @ b
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t)
        print(f"gemm probe: bf16 {n} x {n} x {n}: {2 * n ** 3 / best / 1e12:.1f} TFLOP/s ({torch.cuda.get_device_name()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
