"""Checks the index arithmetic of attention_body's tensor-core path (runtime/cuda_attention.cuh,
MMA_HD) against plain attention in NumPy: every lane's operand registers built as the kernel builds
them, each mma.m16n8k16 done on the matrices those registers stand for (the PTX ISA's fragment
layout, as prefill_pairs_body uses it on the GPU), and the lanes' results put where the kernel puts
them. One block: a KV head's group of `rows` query heads over `length` positions, the warps' sums
through shared memory as the kernel lays them out. The same for attention_short_body (ATT_SHORT).

    python3 tests/bench/attention_mma_sim.py
"""

from __future__ import annotations

import numpy as np

WARPS, TILE = 8, 1024


def mma(c_lanes, a_lanes, b_lanes):
    """c += a . b for one warp: a_lanes[lane] = 4 registers of 2 values, b_lanes[lane] = 2, c 4."""
    A = np.zeros((16, 16)); B = np.zeros((16, 8))
    for lane in range(32):
        g, q = lane // 4, lane % 4
        a = a_lanes[lane]
        A[g, 2 * q:2 * q + 2] = a[0]; A[g + 8, 2 * q:2 * q + 2] = a[1]
        A[g, 2 * q + 8:2 * q + 10] = a[2]; A[g + 8, 2 * q + 8:2 * q + 10] = a[3]
        b = b_lanes[lane]
        B[2 * q:2 * q + 2, g] = b[0]; B[2 * q + 8:2 * q + 10, g] = b[1]
    C = A @ B
    for lane in range(32):
        g, q = lane // 4, lane % 4
        c_lanes[lane] += np.array([C[g, 2 * q], C[g, 2 * q + 1], C[g + 8, 2 * q], C[g + 8, 2 * q + 1]])


def warp_tiles(wid, U, n_tiles):
    """The tiles warp wid takes, in order: U a round, rounds striding over the block's warps."""
    rnd = 0
    while wid + WARPS * rnd * U < n_tiles:
        for k in range(U):
            tile = wid + WARPS * (rnd * U + k)
            if tile >= n_tiles:
                break
            yield tile
        rnd += 1


def split(v):
    hi = v.astype(np.float16).astype(np.float64)
    return hi, (v - hi).astype(np.float16).astype(np.float64)


def red_at(wid, r, dim, rows, hd):
    """Where warp wid's sum of (row r, dim) goes in shared memory."""
    return (wid * rows + r) * hd + dim


def query_terms(Q, hd):
    """The group's query rows padded to 8, as hi and lo fp16 terms."""
    qpad = np.zeros((8, hd)); qpad[:Q.shape[0]] = Q
    return split(qpad)


def tile_scores(K, qh, ql, tile, length):
    """mma_score_tile: each lane's s[4], (position g, rows 2 cq, 2 cq + 1), (g + 8, the same)."""
    hd = K.shape[1]
    s = [np.zeros(4) for _ in range(32)]
    for ch in range(hd // 32):
        for step in range(2):  # (a.x, a.y) then (a.z, a.w)
            for qq in (qh, ql):
                a_l, b_l = [], []
                for lane in range(32):
                    g, cq = lane // 4, lane % 4
                    def kw(h, w):  # word w of the lane's uint4 of chunk ch, position g + 8h
                        j = 16 * tile + g + 8 * h
                        if j >= length:
                            return np.zeros(2)
                        base = (4 * ch + cq) * 8 + 2 * w
                        return K[j, base:base + 2]
                    w0, w1 = 2 * step, 2 * step + 1
                    a_l.append([kw(0, w0), kw(1, w0), kw(0, w1), kw(1, w1)])
                    qb = 32 * ch + 8 * cq + 4 * step
                    b_l.append([qq[g, qb:qb + 2], qq[g, qb + 2:qb + 4]])
                mma(s, a_l, b_l)
    return s


def tile_values(V, prob, tile, length, o):
    """mma_value_tile into each lane's o: prob(g, j) is row g's probability at position j."""
    hd = V.shape[1]
    mt = hd // 16
    bh, bl, a_t = [], [], [[] for _ in range(mt)]
    for lane in range(32):
        g, cq = lane // 4, lane % 4
        j = 16 * tile + 4 * cq
        pv = np.array([prob(g, j + i) for i in range(4)])
        ph, pl = split(pv)
        bh.append([ph[0:2], ph[2:4]]); bl.append([pl[0:2], pl[2:4]])

        def val(i, d):  # value d' of the lane's uint4s at position 4 cq + i
            jj = j + i
            if jj >= length:
                return 0.0
            return V[jj, (8 * (d // 8) + g) * 8 + d % 8]
        for t in range(mt):
            d0, d1 = t, t + mt
            a_t[t].append([np.array([val(0, d0), val(1, d0)]), np.array([val(0, d1), val(1, d1)]),
                           np.array([val(2, d0), val(3, d0)]), np.array([val(2, d1), val(3, d1)])])
    for t in range(mt):
        ot = [o[lane][t] for lane in range(32)]
        mma(ot, a_t[t], bh)
        mma(ot, a_t[t], bl)


def store_sums(red, wid, o, rows, hd):
    """Warp wid's lanes' sums o[lane][t][i] (rows 2 cq + i % 2, dims mma_value_dim) into red."""
    mt = hd // 16
    for lane in range(32):
        g, cq = lane // 4, lane % 4
        for t in range(mt):
            for i in range(4):
                r, d = 2 * cq + i % 2, t + mt * (i // 2)
                if r < rows:
                    red[red_at(wid, r, (8 * (d // 8) + g) * 8 + d % 8, rows, hd)] = o[lane][t][i]


def block(K, V, Q, U):
    """attention_body's arithmetic for one block: K, V (length, hd) fp16 values, Q (rows, hd)."""
    length, hd = K.shape
    rows = Q.shape[0]
    mt = hd // 16
    n_tiles = (length + 15) // 16
    sc = np.full((rows, TILE), np.nan)
    scale = 1 / np.sqrt(hd)
    qh, ql = query_terms(Q, hd)
    for wid in range(WARPS):
        for tile in warp_tiles(wid, U, n_tiles):
            s = tile_scores(K, qh, ql, tile, length)
            for lane in range(32):
                g, cq = lane // 4, lane % 4
                for i in range(4):
                    j, r = 16 * tile + g + 8 * (i // 2), 2 * cq + i % 2
                    if r < rows and j < length:
                        sc[r, j] = s[lane][i] * scale
    assert not np.isnan(sc[:, :length]).any()
    m = sc[:, :length].max(axis=1, keepdims=True)
    p = np.exp(sc[:, :length] - m)
    l = p.sum(axis=1)
    sc[:, :length] = p
    red = np.full(WARPS * rows * hd, np.nan)  # shared memory, in floats
    for wid in range(WARPS):
        o = [[np.zeros(4) for _ in range(mt)] for _ in range(32)]
        for tile in warp_tiles(wid, U, n_tiles):
            tile_values(V, lambda g, j: sc[g, j] if g < rows and j < length else 0.0, tile, length, o)
        store_sums(red, wid, o, rows, hd)
    out = np.zeros((rows, hd))
    for e in range(rows * hd):
        out[e // hd, e % hd] = sum(red[red_at(w, e // hd, e % hd, rows, hd)] for w in range(WARPS))
    assert not np.isnan(out).any(), "a sum read where no warp stored"
    return out / l[:, None]


def short_block(K, V, Q, U):
    """attention_short_body's arithmetic (ATT_SHORT): one round of tiles a warp, each warp's softmax
    in its registers (a row's max and sum over the lanes of a cq), its probabilities through its own
    columns of shared memory into the values' products; the warps that took a tile store their (max,
    sum) and unscaled sums, and each output weighs those by exp(max - their largest max)."""
    length, hd = K.shape
    rows = Q.shape[0]
    mt = hd // 16
    n_tiles = (length + 15) // 16
    assert n_tiles <= WARPS * U, "one round a warp"
    warps = min(WARPS, n_tiles)
    scale = 1 / np.sqrt(hd)
    qh, ql = query_terms(Q, hd)
    sp = np.full((rows, WARPS * U * 16), np.nan)
    wm, wl = np.full((WARPS, rows), np.nan), np.full((WARPS, rows), np.nan)
    red = np.full(WARPS * rows * hd, np.nan)
    for wid in range(warps):
        tiles = [wid + WARPS * k for k in range(U) if wid + WARPS * k < n_tiles]
        s = {t: tile_scores(K, qh, ql, t, length) for t in tiles}
        m = np.full((4, 2), -np.inf)  # [cq][e]: row 2 cq + e, after the shuffles over g
        for t in tiles:
            for lane in range(32):
                g, cq = lane // 4, lane % 4
                for i in range(4):
                    j = 16 * t + g + 8 * (i // 2)
                    s[t][lane][i] = s[t][lane][i] * scale if j < length else -np.inf
                    m[cq, i % 2] = max(m[cq, i % 2], s[t][lane][i])
        l = np.zeros((4, 2))
        for t in tiles:
            for lane in range(32):
                g, cq = lane // 4, lane % 4
                for i in range(4):
                    p = 0.0 if s[t][lane][i] == -np.inf else np.exp(s[t][lane][i] - m[cq, i % 2])
                    l[cq, i % 2] += p
                    r, j = 2 * cq + i % 2, 16 * t + g + 8 * (i // 2)
                    if r < rows:
                        sp[r, j] = p
        o = [[np.zeros(4) for _ in range(mt)] for _ in range(32)]
        for t in tiles:
            tile_values(V, lambda g, j: sp[g, j] if g < rows else 0.0, t, length, o)
        for r in range(rows):
            wm[wid, r], wl[wid, r] = m[r // 2, r % 2], l[r // 2, r % 2]
        store_sums(red, wid, o, rows, hd)
    out = np.zeros((rows, hd))
    for r in range(rows):
        assert np.isfinite(wm[:warps, r]).all(), "a warp that took a tile saw no position"
        M = wm[:warps, r].max()
        e = np.exp(wm[:warps, r] - M)
        L = (wl[:warps, r] * e).sum()
        for dim in range(hd):
            out[r, dim] = sum(red[red_at(w, r, dim, rows, hd)] * e[w] for w in range(warps)) / L
    assert not np.isnan(out).any(), "a sum read where no warp stored"
    return out


def case(rng, hd, rows, length):
    """Random fp16 keys and values, queries, and attention over them in float64."""
    K = rng.standard_normal((length, hd)).astype(np.float16).astype(np.float64)
    V = rng.standard_normal((length, hd)).astype(np.float16).astype(np.float64)
    Q = rng.standard_normal((rows, hd)) * 3
    s = Q @ K.T / np.sqrt(hd)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return K, V, Q, (p / p.sum(axis=1, keepdims=True)) @ V


def main():
    rng = np.random.default_rng(0)
    for hd, rows, length, U in ((64, 4, 497, 2), (64, 3, 37, 2), (128, 4, 200, 1), (128, 7, 16, 1), (64, 8, 1, 2)):
        K, V, Q, ref = case(rng, hd, rows, length)
        got = block(K, V, Q, U)
        err = np.abs(got - ref).max() / np.abs(ref).max()
        print(f"head {hd}, rows {rows}, {length} positions, unroll {U}: max error {err:.2e} of the largest output")
        assert err < 1e-5, err
    for hd, rows, length, U in ((64, 4, 256, 2), (64, 3, 37, 2), (128, 4, 128, 1), (128, 4, 100, 1), (128, 7, 16, 1),
                                (64, 8, 1, 2), (64, 4, 17, 2)):
        K, V, Q, ref = case(rng, hd, rows, length)
        got = short_block(K, V, Q, U)
        err = np.abs(got - ref).max() / np.abs(ref).max()
        print(f"short context: head {hd}, rows {rows}, {length} positions, unroll {U}: max error {err:.2e} of the largest output")
        assert err < 1e-5, err


if __name__ == "__main__":
    main()
