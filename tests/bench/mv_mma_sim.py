"""mv_mma.cu's tensor-core matvec (GGUF Q4_0 and Q8_0, batch 1) emulated in NumPy lane by lane,
against a float64 matvec over gguf's dequantized weights (d * (q - 8), d * q, each exact in fp32).

It mirrors the CUDA program's index arithmetic, not an idea of it: the repack of GGUF's blocks into
tiles (repack_kernel: one thread a block), the B fragments of x (prep_kernel: hi and lo fp16 terms of
x * 2^e in fragment order, the zero area the other lanes read), each warp's tiles (the balanced
contiguous split of the tile sequence, U tiles a step, the tail), each lane's 16-byte loads, the
nibbles and bytes turned into fp16 integers bit by bit (lop3 into 0x6400, hsub2 / hfma2; byte_perm),
every mma.m16n8k16 on the matrices its registers stand for (the PTX ISA's fragment layout, as
attention_mma_sim.mma), the per-block scale on the accumulators, the quad shuffles, and the row
tiles split between warps summed by the last one in (partials in global memory, a count per row
tile). Along the way it asserts what the kernel relies on: every tile computed once, every load in
bounds, each warp load one aligned 512-byte piece, the B loads free of bank conflicts.

Arithmetic model: products exact (fp16 x fp16), the mma's sums rounded to fp32 after each
instruction (the tensor cores truncate instead; the CUDA program measures that), the scale an fp32
fma. Run: python3 tests/bench/mv_mma_sim.py"""

from __future__ import annotations

import numpy as np

LANES, ROWS_T, COLS_T, BLK = 32, 16, 128, 32
FMT = {  # value bytes of a GGUF block, the tile's bytes of values (16 rows x 4 blocks)
    "Q4_0": dict(vb=16, tile=1024),
    "Q8_0": dict(vb=32, tile=2048),
}

f16 = np.float16
f32 = np.float32
PATHS = set()  # the split paths the cases took (main asserts that all were)


def h2(w):
    """a 32-bit register as its two fp16 values (low, high)"""
    w = np.asarray(w, dtype=np.uint32)
    lo = (w & 0xFFFF).astype(np.uint16).view(f16)
    hi = (w >> 16).astype(np.uint16).view(f16)
    return lo, hi


def pack_h2(lo, hi):
    lo = np.asarray(lo, dtype=f16).view(np.uint16).astype(np.uint32)
    hi = np.asarray(hi, dtype=f16).view(np.uint16).astype(np.uint32)
    return lo | (hi << 16)


def mma(c, a, b):
    """c (32 lanes, 4) += A . B, mma.m16n8k16.row.col.f32.f16.f16.f32: a (32, 4) and b (32, 2)
    registers of fp16 pairs; products exact, the sum rounded to fp32 once"""
    A = np.zeros((16, 16))
    B = np.zeros((16, 8))
    for lane in range(LANES):
        g, q = lane // 4, lane % 4
        v = [np.array(h2(a[lane, i]), dtype=np.float64) for i in range(4)]
        A[g, 2 * q:2 * q + 2] = v[0]
        A[g + 8, 2 * q:2 * q + 2] = v[1]
        A[g, 2 * q + 8:2 * q + 10] = v[2]
        A[g + 8, 2 * q + 8:2 * q + 10] = v[3]
        u = [np.array(h2(b[lane, i]), dtype=np.float64) for i in range(2)]
        B[2 * q:2 * q + 2, g] = u[0]
        B[2 * q + 8:2 * q + 10, g] = u[1]
    C = A @ B
    for lane in range(LANES):
        g, q = lane // 4, lane % 4
        add = np.array([C[g, 2 * q], C[g, 2 * q + 1], C[g + 8, 2 * q], C[g + 8, 2 * q + 1]])
        c[lane] = (c[lane].astype(np.float64) + add).astype(f32)


# ---------------------------------------------------------------------------------------------
# GGUF blocks and the reference


def gguf_blocks(rng, fmt, M, K):
    """(M, K / 32, 2 + vb) uint8: fp16 d then the values, as a GGUF file holds them"""
    vb = FMT[fmt]["vb"]
    nb = K // BLK
    d = (rng.choice([-1, 1], (M, nb)) * 2.0 ** rng.uniform(-12, -2, (M, nb))).astype(f16)
    out = np.zeros((M, nb, 2 + vb), dtype=np.uint8)
    out[:, :, 0:2] = d.view(np.uint8).reshape(M, nb, 2)
    out[:, :, 2:] = rng.integers(0, 256, (M, nb, vb), dtype=np.uint8)
    return out


def dequant(fmt, blocks):
    """gguf's dequantization: (M, K) fp32 weights"""
    M, nb, _ = blocks.shape
    d = blocks[:, :, 0:2].copy().view(f16).astype(f32)  # (M, nb, 1)
    qs = blocks[:, :, 2:]
    if fmt == "Q4_0":
        q = np.concatenate([qs & 15, qs >> 4], axis=2).astype(f32) - 8  # byte j: weight j low, j + 16 high
    else:
        q = qs.view(np.int8).astype(f32)
    return (d * q).reshape(M, nb * BLK)


# ---------------------------------------------------------------------------------------------
# The device code's arithmetic (mv_mma.cu), function for function


def repack(fmt, blocks, M, K):
    """repack_kernel: GGUF block bi = r * (K / 32) + b of row r to the tiles. Tile t = R * KT + T
    (rows 16 R .., columns 128 T ..): its values' parts p = h * (vb / 16) + j of 512 bytes, lane
    l = 4 g + c's 16 bytes at 16 l: bytes 16 j .. of block 4 T + c of row 16 R + 8 h + g; its 64
    scales at t * 64 + 2 l + h"""
    vb, tile = FMT[fmt]["vb"], FMT[fmt]["tile"]
    KB, KT = K // BLK, K // COLS_T
    NT = (M // ROWS_T) * KT
    q = np.full(NT * tile, 0xEE, dtype=np.uint8)
    sc = np.full(NT * 64 * 2, 0xEE, dtype=np.uint8)
    written = np.zeros(NT * tile, dtype=np.int32)
    for bi in range(M * KB):
        r, b = bi // KB, bi % KB
        R, rr = r // ROWS_T, r % ROWS_T
        g, h = rr % 8, rr // 8
        T, c = b // 4, b % 4
        lane = 4 * g + c
        t = R * KT + T
        src = blocks[r, b]
        for j in range(vb // 16):
            o = t * tile + (h * (vb // 16) + j) * 512 + 16 * lane
            q[o:o + 16] = src[2 + 16 * j:2 + 16 * j + 16]
            written[o:o + 16] += 1
        o = (t * 64 + 2 * lane + h) * 2
        sc[o:o + 2] = src[0:2]
    assert (written == 1).all(), "the repack writes every byte of the tiles once"
    return q, sc


def frag_index(fmt, s, r):
    """The block's weights (i0, i1) in register r (0: a0 / b0, 1: a2 / b1) of k-step s (0..7):
    Q4_0: s = 2 w + o takes word w of the 16 bytes, shifted by 8 o: low nibbles of bytes 4w + o,
    4w + o + 2 (weights 4w + o, 4w + o + 2), high nibbles (those + 16); Q8_0: word s, bytes 0, 2
    and 1, 3"""
    if fmt == "Q4_0":
        w, o = s // 2, s % 2
        base = 4 * w + o + 16 * r
        return base, base + 2
    return 4 * s + r, 4 * s + r + 2


def x_exponent(x):
    """e with max |x| 2^e in [2^14, 2^15) (0 for a zero vector)"""
    amax = float(np.max(np.abs(x)))
    if amax == 0.0:
        return 0
    _, ex = np.frexp(np.float32(amax))  # amax = m 2^ex, m in [0.5, 1)
    return 15 - int(ex)


def prep(fmt, x):
    """prep_kernel: B's fragments (K words): block kb's 32 words at 32 kb, term t's 16 at + 16 t,
    word 2 s + r = (X_t[i0], X_t[i1]) of frag_index(s, r), X_0 = fp16(x 2^e), X_1 = fp16(x 2^e - X_0)"""
    K = x.size
    e = x_exponent(x)
    xs = np.ldexp(x.astype(f32), e).astype(f32)
    hi = xs.astype(f16)
    lo = (xs - hi.astype(f32)).astype(f16)
    words = np.zeros(K, dtype=np.uint32)
    for kb in range(K // BLK):
        for t, X in enumerate((hi, lo)):
            for j2 in range(16):
                i0, i1 = frag_index(fmt, j2 // 2, j2 % 2)
                words[kb * 32 + t * 16 + j2] = pack_h2(X[32 * kb + i0], X[32 * kb + i1])
    return words, e


def smem_stage(words, K):
    """the block's shared memory as uint32 words: the fragments, 8 words of pad, 16 zero words"""
    sm = np.full(K + 8 + 16, 0xDEADBEEF, dtype=np.uint32)
    sm[:K] = words
    sm[K + 8:K + 24] = 0
    return sm


def zoff(K):
    """the zero area as a uint4 index (K / 4 + 2: 32 bytes past the fragments, bank 8)"""
    return K // 4 + 2


def nib_lo(w):
    """(w & 0x000F000F) | 0x64006400 as fp16 pairs 1024 + n, minus 1032 (hsub2): n - 8"""
    v = (w & 0x000F000F) | 0x64006400
    lo, hi = h2(v)
    return pack_h2(lo - f16(1032), hi - f16(1032))


def nib_hi(w):
    """(w & 0x00F000F0) | 0x64006400: 1024 + 16 n, times 1/16 minus 72 (hfma2, one rounding): n - 8"""
    v = (w & 0x00F000F0) | 0x64006400
    lo, hi = h2(v)
    f = lambda h: (h.astype(np.float64) * 0.0625 - 72.0).astype(f16)
    return pack_h2(f(lo), f(hi))


def byte_perm(x, y, s):
    """__byte_perm: result byte i is byte (s >> 4 i) & 7 of {y, x} (x bytes 0-3, y 4-7)"""
    x = np.asarray(x, dtype=np.uint64)
    y = np.asarray(y, dtype=np.uint64)
    v = x | (y << 32)
    out = np.zeros_like(x)
    for i in range(4):
        sel = (s >> (4 * i)) & 7
        out |= ((v >> (8 * sel)) & 0xFF) << (8 * i)
    return out.astype(np.uint32)


def q8_pair(w, sel):
    """bytes of w ^ 0x80808080 (q + 128) into fp16 1024 + u (byte_perm with 0x64), minus 1152: q"""
    v = byte_perm(w ^ np.uint32(0x80808080), np.uint32(0x64646464), sel)
    lo, hi = h2(v)
    return pack_h2(lo - f16(1152), hi - f16(1152))


def tile_a(fmt, v, s):
    """A's registers (32 lanes, 4) of k-step s from the lanes' loads v (32, parts, 4 words)"""
    a = np.zeros((LANES, 4), dtype=np.uint32)
    if fmt == "Q4_0":
        w, o = s // 2, s % 2
        wg = v[:, 0, w] >> np.uint32(8 * o)
        wg8 = v[:, 1, w] >> np.uint32(8 * o)
        a[:, 0], a[:, 1], a[:, 2], a[:, 3] = nib_lo(wg), nib_lo(wg8), nib_hi(wg), nib_hi(wg8)
    else:
        wg = v[:, s // 4, s % 4]
        wg8 = v[:, 2 + s // 4, s % 4]
        a[:, 0], a[:, 1] = q8_pair(wg, 0x4240), q8_pair(wg8, 0x4240)
        a[:, 2], a[:, 3] = q8_pair(wg, 0x4341), q8_pair(wg8, 0x4341)
    return a


def check_banks(addrs):
    """one LDS.128 of the warp (uint4 indices a lane): each quarter-warp's distinct addresses in
    distinct 16-byte bank groups (broadcasts of one address are free)"""
    for qw in range(4):
        uniq = sorted(set(int(x) for x in addrs[8 * qw:8 * qw + 8]))
        groups = [u % 8 for u in uniq]
        assert len(set(groups)) == len(groups), f"bank conflict: {uniq}"


class Grid:
    """The kernel's grid: G warps over NT tiles, each a contiguous range (start(i) .. start(i + 1))"""

    def __init__(self, G, NT):
        assert G <= NT, "the host keeps G <= NT: every warp has a tile, so a row tile's writers are owner(first) .. owner(last)"
        self.G, self.NT = G, NT

    def start(self, i):
        return i * self.NT // self.G

    def owner(self, t):
        """the warp whose range holds tile t: the largest i with start(i) <= t"""
        return ((t + 1) * self.G - 1) // self.NT


def run(fmt, q, sc, words, e, M, K, G, U, pipe):
    """The kernel over the whole grid, warp by warp in an order that puts each row tile's last
    writer anywhere: returns y (M,), fp32"""
    tile = FMT[fmt]["tile"]
    parts = tile // 512
    KT = K // COLS_T
    NT = (M // ROWS_T) * KT
    grid = Grid(G, NT)
    sm = smem_stage(words, K)
    sm4 = sm[:(len(sm) // 4) * 4].reshape(-1, 4)  # as uint4s
    qw = q.view(np.uint32).reshape(-1, 4)  # the tiles as uint4s
    scw = sc.view(np.uint32)  # a lane's two scales a word
    xinv = f32(np.ldexp(1.0, -e))
    y = np.full(M, np.nan, dtype=f32)
    part = np.full((G, 2, 16), np.nan, dtype=f32)
    count = np.zeros(M // ROWS_T, dtype=np.int64)
    done = np.zeros(NT, dtype=np.int32)
    lane = np.arange(LANES)
    g, c = lane // 4, lane % 4
    active = (g >> 1) == c
    tt = g & 1

    def quad_sums(acc_g, acc_g8):
        """the quad's sums (__shfl_xor_sync 1, 2): lanes c = 0 hold rows g, g + 8; the accumulators cleared"""
        s_g, s_g8 = acc_g.copy(), acc_g8.copy()
        for m in (1, 2):
            s_g = (s_g + s_g[lane ^ m]).astype(f32)
            s_g8 = (s_g8 + s_g8[lane ^ m]).astype(f32)
        acc_g[:] = 0
        acc_g8[:] = 0
        return s_g, s_g8

    def write_y(R, s_g, s_g8):
        for l in range(0, LANES, 4):
            y[16 * R + g[l]] = s_g[l] * xinv
            y[16 * R + g[l] + 8] = s_g8[l] * xinv

    def write_part(i, slot, s_g, s_g8):
        for l in range(0, LANES, 4):
            part[i, slot, g[l]] = s_g[l]
            part[i, slot, g[l] + 8] = s_g8[l]

    def count_in(i, P):
        """the warp's partial of row tile P counted in; the last of P's warps sums them in warp order"""
        first, last = grid.owner(P * KT), grid.owner((P + 1) * KT - 1)
        assert first <= i <= last
        old = count[P]
        count[P] += 1
        if old == last - first:
            PATHS.add("reduce over 3+ warps" if last - first >= 2 else "reduce over 2 warps")
            for r in range(16):
                s = f32(0)
                for j in range(first, last + 1):
                    sj = 0 if P == grid.start(j) // KT else 1
                    v = part[j, sj, r]
                    assert not np.isnan(v), "a partial read before its warp wrote it"
                    s = f32(s + v)
                y[16 * P + r] = s * xinv
            count[P] = 0

    def load(t):
        """a lane's loads of tile t: parts uint4s and its scale word; each warp load one 512-byte piece"""
        v = np.zeros((LANES, parts, 4), dtype=np.uint32)
        for p in range(parts):
            idx = t * (tile // 16) + p * 32 + lane
            assert idx.max() < len(qw)
            assert (idx * 16)[0] % 512 == 0 and (np.diff(idx) == 1).all()
            v[:, p] = qw[idx]
        sidx = t * 32 + lane
        assert sidx.max() < len(scw)
        return v, scw[sidx]

    def compute(t, v, s32, T, acc_g, acc_g8):
        assert 0 <= T < KT
        done[t] += 1
        bb = np.where(active, T * 32 + c * 8 + tt * 4, zoff(K))
        C = np.zeros((LANES, 4), dtype=f32)
        for j in range(4):
            check_banks(bb + j)
            bq = sm4[bb + j]
            for o in range(2):
                s = 2 * j + o
                mma(C, tile_a(fmt, v, s), bq[:, 2 * o:2 * o + 2])
        d_g, d_g8 = h2(s32)
        d_g, d_g8 = d_g.astype(np.float64), d_g8.astype(np.float64)
        acc_g[:] = (d_g * (C[:, 0] + C[:, 1]).astype(np.float64) + acc_g).astype(f32)
        acc_g8[:] = (d_g8 * (C[:, 2] + C[:, 3]).astype(np.float64) + acc_g8).astype(f32)

    # warps in a scrambled order: the reduction must not care who finishes last
    order = np.random.default_rng(G * 7 + U).permutation(G)
    for i in order:
        a, b = grid.start(i), grid.start(i + 1)
        if a >= b:
            continue
        acc_g = np.zeros(LANES, dtype=f32)
        acc_g8 = np.zeros(LANES, dtype=f32)
        R0 = a // KT
        st = {"R": R0, "T": a % KT, "first": None}

        def flush():
            """a row tile ends inside the range: written whole, or kept when it is the first, begun before a"""
            R = st["R"]
            s_g, s_g8 = quad_sums(acc_g, acc_g8)
            assert (R + 1) * KT <= b
            if a <= R * KT:
                PATHS.add("whole row tile inside the loop")
                write_y(R, s_g, s_g8)
            else:
                PATHS.add("first row tile partial")
                assert R == R0
                st["first"] = (s_g, s_g8)

        def step(t0, regs):
            for u in range(U):
                t = t0 + u
                if t >= b:
                    break
                if st["T"] == KT:
                    flush()
                    st["R"] += 1
                    st["T"] = 0
                compute(t, regs[u][0], regs[u][1], st["T"], acc_g, acc_g8)
                st["T"] += 1

        def loads(t0):
            return [load(t0 + u) if t0 + u < b else None for u in range(U)]

        # the kernel's loop shapes: one register set (load, compute) or two (the next step's loads
        # before this step's products); the order of loads does not change the arithmetic, the
        # tail's predication and the step sequence are what this checks
        if not pipe:
            t = a
            while t < b:
                step(t, loads(t))
                t += U
        else:
            v0 = loads(a)
            t = a
            while t < b:
                v1 = loads(t + U) if t + U < b else None
                step(t, v0)
                if t + 2 * U < b:
                    v0 = loads(t + 2 * U)
                if t + U < b:
                    step(t + U, v1)
                t += 2 * U
        # the end: the last row tile R whole, or a partial (slot 1, 0 when the range lies inside R);
        # the first, R0, a partial in slot 0 when begun before a and not R
        R = st["R"]
        s_g, s_g8 = quad_sums(acc_g, acc_g8)
        last_whole = a <= R * KT and (R + 1) * KT <= b
        first_part = R0 != R and a > R0 * KT
        assert first_part == (st["first"] is not None)
        PATHS.add("last whole" if last_whole else "last partial, slot 0" if R == R0 else "last partial, slot 1")
        if last_whole:
            write_y(R, s_g, s_g8)
        else:
            write_part(i, 0 if R == R0 else 1, s_g, s_g8)
        if first_part:
            write_part(i, 0, *st["first"])
        for k in range(2):
            P = R0 if k == 0 else R
            if (not first_part) if k == 0 else last_whole:
                continue
            count_in(i, P)
    assert (done == 1).all(), "every tile computed once"
    assert (count == 0).all(), "every count reset by its row tile's last writer"
    return y


def case(rng, fmt, M, K, G, U, pipe, x_spread=4.0):
    blocks = gguf_blocks(rng, fmt, M, K)
    w = dequant(fmt, blocks).astype(np.float64)
    x = (rng.standard_normal(K) * 2.0 ** rng.uniform(-x_spread, x_spread, K)).astype(f32)
    ref = w @ x.astype(np.float64)
    mag = np.abs(w) @ np.abs(x.astype(np.float64))
    q, sc = repack(fmt, blocks, M, K)
    words, e = prep(fmt, x)
    y = run(fmt, q, sc, words, e, M, K, G, U, pipe)
    assert not np.isnan(y).any(), "a row never written"
    err = float(np.max(np.abs(y.astype(np.float64) - ref) / mag))
    return err


def main():
    rng = np.random.default_rng(1)
    # (format, rows, K, warps, unroll, pipelined): warps spanning several row tiles, row tiles split
    # among up to 9 warps, a tile a warp (G = tiles), a step's tail, one warp doing everything
    cases = [
        ("Q4_0", 32, 512, 3, 2, False),
        ("Q4_0", 48, 640, 7, 4, True),
        ("Q4_0", 16, 1152, 9, 4, False),
        ("Q4_0", 32, 256, 4, 2, True),
        ("Q4_0", 16, 128, 1, 4, True),
        ("Q4_0", 64, 384, 5, 3, True),
        ("Q8_0", 32, 512, 3, 2, True),
        ("Q8_0", 48, 640, 7, 4, False),
        ("Q8_0", 16, 1152, 9, 2, True),
        ("Q8_0", 32, 256, 4, 2, False),
        ("Q4_0", 80, 256, 2, 2, True),  # warp 1: first row tile partial, a whole one, the last whole
        ("Q8_0", 112, 384, 3, 4, False),  # warp 1: partial, whole, partial
    ]
    worst = 0.0
    for fmt, M, K, G, U, pipe in cases:
        err = case(rng, fmt, M, K, G, U, pipe)
        worst = max(worst, err)
        print(f"{fmt} {M} x {K}, {G} warps, unroll {U}, {'pipelined' if pipe else 'one set'}: "
              f"max error {err:.2e} of sum |w x|")
        assert err < 1e-6, err
    # a vector with no spread and one at fp32's edges of the scaling
    for fmt in ("Q4_0", "Q8_0"):
        err = case(rng, fmt, 32, 512, 5, 2, True, x_spread=0.0)
        print(f"{fmt} 32 x 512, x of one scale: max error {err:.2e}")
        assert err < 1e-6, err
        worst = max(worst, err)
    want = {"reduce over 2 warps", "reduce over 3+ warps", "whole row tile inside the loop", "first row tile partial",
            "last whole", "last partial, slot 0", "last partial, slot 1"}
    assert PATHS == want, want - PATHS
    print(f"every split path taken ({len(PATHS)})")
    print(f"all cases agree: worst {worst:.2e} of sum |w x| (the kernel's bound is 1e-5; see mv_mma.cu)")


if __name__ == "__main__":
    main()
