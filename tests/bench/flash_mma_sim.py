"""prefill_flash_mma_body (runtime/cuda_prefill.cuh) emulated in NumPy, lane by
lane, against plain causal attention: a block's 64 rows (token r / kv_mul, head r % kv_mul) in four
warps of 16; the tiles' keys and values and the block's queries in shared memory as the kernel
lays them out (rows of hd halves, 16-byte chunks swizzled by fmma_off); every ldmatrix (.trans for
the values) and mma.m16n8k16 on the registers the kernel builds (the PTX ISA's fragment layouts,
attention_mma_sim.mma); the scores' accumulators reused as the probabilities' A operand; each row's
max over its four lanes, its sum kept per lane until the end; the splits (at least min_chunk
positions) and the last block's combine in split order, exponents in base 2 (the queries' scale carries
log2 e). The scaled queries and the probabilities
rounded to fp16 as the kernel rounds them (keys and values fp16), sums in float64: the error is that
rounding's, 1e-4 to 3e-4 of the largest output, asserted below 2e-3 (an index wrong by one row,
position or split is of order one). It checks the algorithm and its index arithmetic, not the CUDA
code.
Run: python3 tests/bench/flash_mma_sim.py"""
import math

import numpy as np

from attention_mma_sim import mma
from flash_prefill_sim import block_bounds, causal

ROWS, WARPS, LANES = 64, 4, 32
LOG2E = 1.4426950408889634  # the queries' scale carries it: scores, maxima and exponents in log2 units


class Smem:
    """Rows of hd halves whose 16-byte chunks (8 values) lie at chunk c ^ (r & 7) (fmma_off)."""

    def __init__(self, rows, hd):
        self.a = np.zeros((rows, hd))
        self.ch = hd // 8

    def store(self, r, c, vals):
        p = c ^ (r & 7)
        assert 0 <= p < self.ch
        self.a[r, 8 * p:8 * p + 8] = vals

    def load(self, r, c):
        p = c ^ (r & 7)
        return self.a[r, 8 * p:8 * p + 8]


def ldsm_x4(sm, addr, trans=False):
    """ldmatrix.x4 (.trans): addr(lane) = (row, chunk) of the 8x8 matrices' rows, lanes 8i..8i+7
    giving matrix i's; lane (g, q) gets each matrix's (g, 2q), (g, 2q + 1), or transposed."""
    mats = []
    for i in range(4):
        m = np.array([sm.load(*addr(8 * i + j)) for j in range(8)])
        mats.append(m.T if trans else m)
    return [[(m[lane // 4, 2 * (lane % 4)], m[lane // 4, 2 * (lane % 4) + 1]) for m in mats] for lane in range(LANES)]


def pairs(c_lanes, e):
    """fp32 accumulators' values e, e + 1 of each lane as one register's two values"""
    return [(c_lanes[lane][e], c_lanes[lane][e + 1]) for lane in range(LANES)]


def block(q, k, v, first_new, count, kv_mul, B, row0, split_i, n_splits, min_splits, min_chunk, T, att_tile=1024):
    """One block: {row: (m, l, o)} (o unnormalized) and n_active, or None when it has nothing to do.
    q (B, kv_mul, hd) of the batch; k, v (positions, hd) of the KV head, fp16 values."""
    hd = q.shape[-1]
    CH, NS, NO = hd // 8, T // 8, hd // 8
    n_active, rows, start, length = block_bounds(first_new, count, kv_mul, B, row0, split_i, n_splits, min_splits,
                                                 min_chunk, att_tile)
    if split_i >= n_active or rows <= 0:
        return None, n_active
    qs = Smem(ROWS, hd)
    for r in range(ROWS):
        qv = q[(row0 + r) // kv_mul, (row0 + r) % kv_mul] * (LOG2E / math.sqrt(hd)) if r < rows else np.zeros(hd)
        qv = qv.astype(np.float16).astype(np.float64)
        for c in range(CH):
            qs.store(r, c, qv[8 * c:8 * c + 8])
    res = {}
    for wid in range(WARPS):
        wr = 16 * wid
        if wr >= rows:
            continue
        seen = [[first_new + (row0 + wr + lane // 4 + 8 * h) // kv_mul - start if wr + lane // 4 + 8 * h < rows else -1
                 for h in range(2)] for lane in range(LANES)]
        m = np.full((LANES, 2), -np.inf)
        l = np.zeros((LANES, 2))
        o = np.zeros((NO, LANES, 4))
        for it in range((length + T - 1) // T):
            ks, vs = Smem(T, hd), Smem(T, hd)
            for p in range(T):  # zeros past the split
                pos = it * T + p
                for c in range(CH):
                    ks.store(p, c, k[start + pos, 8 * c:8 * c + 8] if pos < length else np.zeros(8))
                    vs.store(p, c, v[start + pos, 8 * c:8 * c + 8] if pos < length else np.zeros(8))
            sc = np.zeros((NS, LANES, 4))
            for kk in range(hd // 16):
                qa = lambda lane: (wr + lane % 8 + 8 * (lane // 8 % 2), 2 * kk + lane // 16)
                a = ldsm_x4(qs, qa)
                for j in range(0, NS, 2):
                    b = ldsm_x4(ks, lambda lane: (8 * j + lane % 8 + 8 * (lane // 16), 2 * kk + lane // 8 % 2))
                    mma(sc[j], a, [x[0:2] for x in b])
                    mma(sc[j + 1], a, [x[2:4] for x in b])
            for h in range(2):  # sc[j][lane][2h + e]: row h's score at position it T + 8 j + 2 cq + e
                for lane in range(LANES):
                    for j in range(NS):
                        for e in range(2):
                            pos = it * T + 8 * j + 2 * (lane % 4) + e
                            if pos > seen[lane][h] or pos >= length:
                                sc[j][lane][2 * h + e] = -np.inf
                mx = np.array([sc[:, lane, 2 * h:2 * h + 2].max() for lane in range(LANES)])
                mx = np.array([mx[lane & ~3:(lane & ~3) + 4].max() for lane in range(LANES)])  # the quad's shuffles
                for lane in range(LANES):
                    m_new = max(m[lane, h], mx[lane])
                    shift = 0.0 if m_new == -np.inf else m_new
                    rescale = 1.0 if m_new == -np.inf else 2.0 ** (m[lane, h] - m_new)
                    p = np.exp2(sc[:, lane, 2 * h:2 * h + 2] - shift)
                    sc[:, lane, 2 * h:2 * h + 2] = p
                    l[lane, h] = l[lane, h] * rescale + p.sum()
                    m[lane, h] = m_new
                    o[:, lane, 2 * h:2 * h + 2] *= rescale
            for kk in range(T // 16):  # A: the scores of n-tiles 2 kk, 2 kk + 1 as rows g, g + 8
                regs = [pairs(sc[2 * kk], 0), pairs(sc[2 * kk], 2), pairs(sc[2 * kk + 1], 0), pairs(sc[2 * kk + 1], 2)]
                a = [[tuple(np.array(regs[i][lane]).astype(np.float16).astype(np.float64)) for i in range(4)]
                     for lane in range(LANES)]
                for t in range(0, NO, 2):
                    b = ldsm_x4(vs, lambda lane: (16 * kk + lane % 8 + 8 * (lane // 8 % 2), t + lane // 16), trans=True)
                    mma(o[t], a, [x[0:2] for x in b])
                    mma(o[t + 1], a, [x[2:4] for x in b])
        lsum = np.array([[l[lane & ~3:(lane & ~3) + 4, h].sum() for h in range(2)] for lane in range(LANES)])
        for lane in range(LANES):
            g, cq = lane // 4, lane % 4
            for h in range(2):
                r = wr + g + 8 * h
                if r >= rows:
                    continue
                key = row0 + r
                mm, ll, oo = res.setdefault(key, [m[lane, h], lsum[lane, h], np.full(hd, np.nan)])
                assert mm == m[lane, h] and ll == lsum[lane, h]  # the quad agrees
                for j in range(NO):
                    oo[8 * j + 2 * cq:8 * j + 2 * cq + 2] = o[j][lane][2 * h:2 * h + 2]
    return res, n_active


def batch_attention(q, k, v, first_new, count, kv_mul, B, n_splits, min_splits, min_chunk, T):
    """Every block of one KV head, then each row group's combine in split order: (count, kv_mul, hd)."""
    hd = q.shape[-1]
    out = np.full((B, kv_mul, hd), np.nan)
    parts, n_active = {}, None
    for z in range((B * kv_mul + ROWS - 1) // ROWS):
        for s in range(n_splits):
            res, n_active = block(q, k, v, first_new, count, kv_mul, B, z * ROWS, s, n_splits, min_splits, min_chunk, T)
            for r, (m, l, o) in (res or {}).items():
                assert not np.isnan(o).any()
                if n_active == 1:
                    out[r // kv_mul, r % kv_mul] = o / l
                else:
                    parts[(r, s)] = (m, l, o)
    if n_active > 1:
        for r in range(count * kv_mul):
            ms = np.array([parts[(r, s)][0] for s in range(n_active)])
            ls = np.array([parts[(r, s)][1] for s in range(n_active)])
            w = np.exp2(ms - ms.max())
            w = w / (w * ls).sum()
            out[r // kv_mul, r % kv_mul] = sum(w[s] * parts[(r, s)][2] for s in range(n_active))
    return out[:count]


def main():
    rng = np.random.default_rng(11)
    cases = 0
    for hd, kv_mul, B, count, first_new, n_splits, min_chunk, T in [
        (64, 4, 32, 32, 0, 33, 1024, 64),    # 1B shape, depth 0: one split, one tile
        (64, 4, 16, 13, 150, 33, 1024, 64),  # a partial batch, three tiles of a split
        (128, 4, 8, 8, 100, 8, 40, 64),      # 7B heads: splits of 40 positions, one tile each, combined
        (64, 3, 8, 7, 30, 33, 5, 16),        # a group of 3 (21 rows), splits of 5: rows that see none of a split
        (128, 4, 16, 16, 60, 8, 1024, 16),   # tiles of 16 positions, five a split
    ]:
        n = first_new + count
        q = rng.standard_normal((B, kv_mul, hd))
        k = rng.standard_normal((n, hd)).astype(np.float16).astype(np.float64)  # the cache is fp16
        v = rng.standard_normal((n, hd)).astype(np.float16).astype(np.float64)
        got = batch_attention(q, k, v, first_new, count, kv_mul, B, n_splits, 33, min_chunk, T)
        want = causal(q, k, v, first_new, count)
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err < 2e-3, (hd, kv_mul, B, count, first_new, err)
        cases += 1
        print(f"  hd {hd}, group {kv_mul}, {count} of {B} tokens at {first_new}, tiles of {T}: max error {err:.1e} of the largest")
    print(f"flash prefill attention on the tensor cores: {cases} cases agree with plain causal attention")


if __name__ == "__main__":
    main()
