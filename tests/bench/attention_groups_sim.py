"""attention_body's split and combine for a prefill block's group of tokens (TOKENS > 1), emulated
in NumPy against plain causal attention: the chunking from the group's last token, the -inf scores
past a row's token, a row that sees none of a chunk (max -inf: probabilities and sum 0, weight 0 in
the combine), the splits' combine. It checks the algorithm, not the CUDA code.
Run: python3 tests/bench/attention_groups_sim.py"""
import math

import numpy as np

MASKED = [0]  # rows that saw none of a chunk's positions


def kernel(q, k, v, first_new, ahead, tokens_total, TOKENS, kv_mul, min_splits, n_splits, min_chunk, tile=1024):
    """q (TOKENS, kv_mul, hd) of tokens ahead.. of the batch; k, v (positions, hd): the group's outputs."""
    tokens = min(TOKENS, tokens_total - ahead)
    n = first_new + ahead + tokens
    splits = min(n_splits, max(min_splits, (n + tile - 1) // tile))
    chunk = max((n + splits - 1) // splits, min_chunk)
    n_active = (n + chunk - 1) // chunk
    hd = q.shape[-1]
    rows = TOKENS * kv_mul
    ml, acc = np.zeros((n_active, rows, 2)), np.zeros((n_active, rows, hd))
    for split in range(n_active):
        start = split * chunk
        length = min(n, start + chunk) - start
        for r in range(rows):
            t, h = r // kv_mul, r % kv_mul
            s = np.array([q[t, h] @ k[start + j] / math.sqrt(hd) if start + j <= first_new + ahead + t else -np.inf
                          for j in range(length)])
            m = s.max()
            MASKED[0] += m == -np.inf
            shift = 0.0 if m == -np.inf else m
            p = np.exp(s - shift)
            ml[split, r] = (m, p.sum())
            acc[split, r] = p @ v[start:start + length]
    out = np.zeros((rows, hd))
    for r in range(rows):
        if n_active == 1:
            out[r] = acc[0, r] / ml[0, r, 1]
            continue
        M = ml[:, r, 0].max()
        den = sum(math.exp(ml[s, r, 0] - M) * ml[s, r, 1] for s in range(n_active))
        w = [math.exp(ml[s, r, 0] - M) / den for s in range(n_active)]
        out[r] = sum(w[s] * acc[s, r] for s in range(n_active))
    return out.reshape(TOKENS, kv_mul, hd), tokens


def reference(q, k, v, pos):
    s = q @ k[:pos + 1].T / math.sqrt(q.shape[-1])
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v[:pos + 1]


def main():
    rng = np.random.default_rng(1)
    hd, cases = 16, 0
    for first_new in (0, 1, 5, 63, 64, 200, 1500):
        for B, count in ((16, 16), (16, 13), (8, 3)):
            for TOKENS, kv_mul in ((2, 4), (4, 2), (8, 1), (2, 3)):
                for min_splits, min_chunk in ((8, 32), (132, 5), (3, 7)):
                    n_splits = max(min_splits, 4)
                    k = rng.standard_normal((first_new + B, hd))
                    v = rng.standard_normal((first_new + B, hd))
                    qb = rng.standard_normal((B, kv_mul, hd))
                    for t0 in range(0, count, TOKENS):
                        out, tokens = kernel(qb[t0:t0 + TOKENS], k, v, first_new, t0, count, TOKENS, kv_mul, min_splits,
                                             n_splits, min_chunk)
                        for t in range(tokens):
                            ref = reference(qb[t0 + t], k, v, first_new + t0 + t)
                            assert np.allclose(out[t], ref, atol=1e-12, rtol=1e-9), (first_new, B, count, TOKENS, t0, t)
                        cases += 1
    assert MASKED[0] > 0, "no row saw a chunk with none of its positions: the -inf path went untried"
    print(f"attention groups: {cases} blocks' outputs equal plain causal attention "
          f"({MASKED[0]} rows saw none of a chunk's positions)")


if __name__ == "__main__":
    main()
