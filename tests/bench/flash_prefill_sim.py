"""prefill_flash_body (runtime/cuda_prefill.cuh) emulated in NumPy against plain causal attention:
a block's rows (token r / kv_mul, head r % kv_mul) from row0 on, the splits counted from the
batch's last position, positions staged a tile at a time, each warp's 8 rows keeping their softmax
running over the tiles (a row that has seen nothing yet: shift 0, rescale 1), the -inf scores past
a row's token and past the tile, the partial sums written per split and combined in split order by
the last block, and the rows past a partial batch's count left alone. It checks the algorithm and
its index arithmetic, not the CUDA code (staging, conversions, shuffles).
Run: python3 tests/bench/flash_prefill_sim.py"""
import math

import numpy as np

ROWS, WARP_ROWS, WARPS, LANES = 64, 8, 8, 32


def tile_of(hd):
    return 128 if hd <= 64 else 64


def block_bounds(first_new, count, kv_mul, B, row0, split, n_splits, min_splits, min_chunk, att_tile, rows_max=ROWS):
    """A block's splits with positions (n_active), its rows of the batch, and its split's first
    position and length: the splits counted from the batch's last position, as att_split_len."""
    n = first_new + count
    splits = min(n_splits, max(min_splits, (n + att_tile - 1) // att_tile))
    chunk = max((n + splits - 1) // splits, min_chunk)
    start = split * chunk
    return (n + chunk - 1) // chunk, min(rows_max, min(B * kv_mul, count * kv_mul) - row0), start, min(n, start + chunk) - start


def block(q, k, v, first_new, count, kv_mul, B, row0, split, n_splits, min_splits, min_chunk, att_tile=1024):
    """One block's work: {row: (m, l, o)} for its rows (o unnormalized), and n_active, or None when the
    block has nothing to do. q (B, kv_mul, hd) of the batch; k, v (positions, hd) of the KV head."""
    hd = q.shape[-1]
    T, PPL = tile_of(hd), tile_of(hd) // LANES
    n_active, rows, start, length = block_bounds(first_new, count, kv_mul, B, row0, split, n_splits, min_splits,
                                                 min_chunk, att_tile)
    if split >= n_active or rows <= 0:
        return None, n_active
    qs = np.zeros((ROWS, hd))
    for i in range(ROWS):
        r = row0 + i
        if r < row0 + rows:
            qs[i] = q[r // kv_mul, r % kv_mul] / math.sqrt(hd)
    res = {}
    for w in range(WARPS):
        wr0 = row0 + w * WARP_ROWS
        m, l, o = np.full(WARP_ROWS, -np.inf), np.zeros(WARP_ROWS), np.zeros((WARP_ROWS, hd))
        for ts in range(0, length, T):
            tlen = min(T, length - ts)
            kt = np.zeros((T, hd))  # staged, zeros past tlen
            vs = np.zeros((T, hd))
            kt[:tlen], vs[:tlen] = k[start + ts:start + ts + tlen], v[start + ts:start + ts + tlen]
            if wr0 >= row0 + rows:
                continue
            for i in range(WARP_ROWS):
                r = wr0 + i
                sc = qs[w * WARP_ROWS + i] @ kt.T  # (T,), lane * PPL + k = j
                seen = first_new + r // kv_mul - (start + ts)
                for j in range(T):
                    assert j == (j // PPL) * PPL + j % PPL
                    if j >= tlen or j > seen or r >= row0 + rows:
                        sc[j] = -np.inf
                mx = sc.max()
                m_new = max(m[i], mx)
                shift = 0.0 if m_new == -np.inf else m_new
                rescale = 1.0 if m_new == -np.inf else math.exp(m[i] - m_new)
                p = np.exp(sc - shift)
                l[i] = l[i] * rescale + p.sum()
                m[i] = m_new
                o[i] = o[i] * rescale + p @ vs
        for i in range(WARP_ROWS):
            r = wr0 + i
            if r >= row0 + rows:
                break
            res[r] = (m[i], l[i], o[i])
    return res, n_active


def batch_attention(q, k, v, first_new, count, kv_mul, B, n_splits, min_splits, min_chunk):
    """Every block of one KV head, then the combine: (count, kv_mul, hd)."""
    hd = q.shape[-1]
    out = np.full((B, kv_mul, hd), np.nan)
    parts = {}
    n_active = None
    for z in range((B * kv_mul + ROWS - 1) // ROWS):
        for split in range(n_splits):
            res, n_active = block(q, k, v, first_new, count, kv_mul, B, z * ROWS, split, n_splits, min_splits, min_chunk)
            if res is None:
                continue
            for r, (m, l, o) in res.items():
                if n_active == 1:
                    out[r // kv_mul, r % kv_mul] = o / l
                else:
                    parts[(r, split)] = (m, l, o)
    if n_active > 1:  # each z's last block combines its own rows: every row once
        combined = set()
        for z in range((B * kv_mul + ROWS - 1) // ROWS):
            rows = min(ROWS, min(B * kv_mul, count * kv_mul) - z * ROWS)
            for r in range(z * ROWS, z * ROWS + max(rows, 0)):
                assert r not in combined
                combined.add(r)
        assert combined == set(range(count * kv_mul))
        for r in range(count * kv_mul):
            ms = np.array([parts[(r, s)][0] for s in range(n_active)])
            ls = np.array([parts[(r, s)][1] for s in range(n_active)])
            M = ms.max()
            w = np.exp(ms - M)
            w = w / (w * ls).sum()
            out[r // kv_mul, r % kv_mul] = sum(w[s] * parts[(r, s)][2] for s in range(n_active))
    return out[:count]


def causal(q, k, v, first_new, count):
    hd = q.shape[-1]
    out = np.zeros(q[:count].shape)
    for t in range(count):
        n = first_new + t + 1
        s = q[t] @ k[:n].T / math.sqrt(hd)  # (kv_mul, n)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        out[t] = (p / p.sum(axis=1, keepdims=True)) @ v[:n]
    return out


def main():
    rng = np.random.default_rng(7)
    cases = 0
    for hd, kv_mul, B, count, first_new, n_splits, min_splits, min_chunk in [
        (64, 4, 32, 32, 0, 33, 33, 32),      # 1B shape, depth 0: one split
        (64, 4, 32, 32, 300, 33, 33, 32),    # several splits of 32
        (64, 4, 32, 27, 4096, 33, 33, 32),   # depth 4096, a partial batch: chunks of 125, one tile
        (64, 3, 16, 16, 9000, 33, 33, 32),   # SmolLM2's group of 3: 48 rows; chunks of 273, three tiles
        (128, 4, 32, 32, 5000, 33, 33, 32),  # 7B heads: tiles of 64
        (64, 2, 8, 5, 40, 40, 33, 5),        # chunks of 5: a tile's rows straddling splits
        (128, 8, 16, 16, 700, 33, 33, 32),   # 128 rows: two blocks
    ]:
        n = first_new + count
        q = rng.standard_normal((B, kv_mul, hd))
        k, v = rng.standard_normal((n, hd)), rng.standard_normal((n, hd))
        got = batch_attention(q, k, v, first_new, count, kv_mul, B, n_splits, min_splits, min_chunk)
        want = causal(q, k, v, first_new, count)
        err = np.abs(got - want).max()
        assert err < 1e-9, (hd, kv_mul, B, count, first_new, err)
        cases += 1
    print(f"flash prefill attention: {cases} cases equal plain causal attention")


if __name__ == "__main__":
    main()
