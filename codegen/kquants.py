"""ggml's reference K quantizers in NumPy: float32 rows -> Q4_K, Q5_K and Q6_K super-blocks, the
bytes ggml-quants.c's quantize_row_q4_K_ref, quantize_row_q5_K_ref and quantize_row_q6_K_ref write
(what llama-quantize gives without an importance matrix).

Transcribed step for step and vectorized over sub-blocks: every float operation is the C's in
float32 and in the C's order, so that the bytes are ggml's and not merely close to them. Three
things make that hold:

- Sums run element by element, as the C loops do (seq_sum), never NumPy's pairwise sum: a search
  that compares two errors flips on the last bit of either.
- nearest_int is ggml's trick, the float32 sum with 1.5 * 2^23 read as an integer, not np.rint:
  the same for |v| < 2^22, and the same garbage beyond (a near-zero range gives an infinite
  scale; the C clamps whatever comes out, and so does this).
- A sub-block whose stored 6-bit (Q6_K: 8-bit) scale rounds to 0 keeps the levels of the scale
  search, as the C's `if (!d) continue;` leaves them.

tests/test_quantize.py compares these bytes with ggml's own (tests/data/ggml_k_quants.npz, written
by tests/ggml_k_fixture.py from a llama-cpp-python sdist) and dequantizes them through the gguf
package. One core quantizes SmolLM2-135M's 134.5M matrix weights in 34 s of CPU to Q4_K, 26 s to
Q6_K (the 2-core development machine, loaded).
"""

from __future__ import annotations

import numpy as np

f32 = np.float32
QK_K = 256  # weights a super-block
BLOCK_BYTES = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}
GROUP_MAX_EPS = f32(1e-15)  # ggml-quants.c: below this a group's largest |x| counts as zero
# Super-blocks quantized at a time: the search's dozen temporaries of 256K weights stay near the
# caches. On the 2-core development machine, 4M normal weights to Q4_K took 1.3 s in passes of
# 64K or 256K weights, 1.7 s of 1M, 2.1 s of 4M.
BLOCKS_PER_PASS = 1024


def nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's nearest_int: float32 v + 12582912 (1.5 * 2^23), its low 23 bits less 2^22 as int32.
    Round half to even for |v| < 2^22."""
    s = (v.astype(f32) + f32(12582912.0)).view(np.int32)
    return (s & 0x007FFFFF) - 0x00400000


def seq_sum(terms: np.ndarray, first: np.ndarray | None = None) -> np.ndarray:
    """Sum over axis 0 one row at a time in float32, from 0 (or from `first`, the C's
    `float s = a[0]` before a loop from 1): a C loop's `s += term` order."""
    acc = np.zeros(terms.shape[1:], f32) if first is None else first.astype(f32)
    for t in terms:
        acc += t
    return acc


def fp16_bytes(v: np.ndarray) -> np.ndarray:
    """(n,) float32 -> (n, 2) uint8 of GGML_FP32_TO_FP16 (round to nearest even, as NumPy's cast)."""
    return v.astype(np.float16).view(np.uint8).reshape(len(v), 2)


# ---------------------------------------------------------------------------------------------
# The scale searches, over the columns of (elements, groups) arrays

def make_qkx2_quants(x, w, nmax, rmin, rdelta, nstep):
    """make_qkx2_quants for each column of x (n, m) with weights w (n, m): levels L (n, m) in
    [0, nmax], scale (m,) and the_min (m,) with x ~ scale * L - the_min. A least-squares fit of
    scale and min to the levels of nstep + 1 trial scales (nmax + rmin + rdelta * is over the
    range), each kept when its weighted squared error is smaller; the min never above 0."""
    lo = np.minimum(x.min(axis=0), f32(0))  # min = min(x), then `if (min > 0) min = 0`
    hi = x.max(axis=0)
    flat = hi == lo
    sum_w = seq_sum(w[1:], w[0])
    sum_x = seq_sum(w[1:] * x[1:], w[0] * x[0])
    iscale = f32(nmax) / (hi - lo)
    scale = f32(1) / iscale
    L = np.clip(nearest_int(iscale * (x - lo)), 0, nmax)
    diff = scale * L.astype(f32) + lo - x
    best = seq_sum(w * (diff * diff))
    for step in range(nstep + 1):
        iscale = (f32(rmin) + f32(rdelta) * f32(step) + f32(nmax)) / (hi - lo)
        laux = np.clip(nearest_int(iscale * (x - lo)), 0, nmax)
        lf = laux.astype(f32)
        wl = w * lf
        sum_l, sum_l2, sum_xl = seq_sum(wl), seq_sum(wl * lf), seq_sum(wl * x)
        D = sum_w * sum_l2 - sum_l * sum_l
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
        pos = this_min > 0
        this_min = np.where(pos, f32(0), this_min)
        this_scale = np.where(pos, sum_xl / sum_l2, this_scale)
        diff = this_scale * lf + this_min - x
        cur = seq_sum(w * (diff * diff))
        better = (D > 0) & (cur < best)
        L = np.where(better, laux, L)
        best = np.where(better, cur, best)
        scale = np.where(better, this_scale, scale)
        lo = np.where(better, this_min, lo)  # the C's `min`: later trials measure from it
    L = np.where(flat, 0, L)
    return L, np.where(flat, f32(0), scale), -lo


def make_qx_quants(x, nmax):
    """make_qx_quants with rmse_type 1 (weights x^2) for each column of x (n, m): levels L (n, m)
    in [0, 2 nmax) and scale (m,) with x ~ scale * (L - nmax), the scale signed as the column's
    value of largest magnitude. Nineteen trial scales (nmax + 0.1 is) / max, is in -9..9; a
    trial is kept when it explains more of the weighted x."""
    cols = np.arange(x.shape[1])
    mx = x[np.abs(x).argmax(axis=0), cols]  # the first value of largest |x|, with its sign
    zero = np.abs(mx) < GROUP_MAX_EPS
    w = x * x

    def trial(iscale):
        l = np.clip(nearest_int(iscale * x), -nmax, nmax - 1)
        lf = l.astype(f32)
        return l + nmax, seq_sum(w * x * lf), seq_sum(w * lf * lf)

    L, sumlx, suml2 = trial(f32(-nmax) / mx)
    scale = np.where(suml2 != 0, sumlx / suml2, f32(0))
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        laux, sumlx, suml2 = trial(-(f32(nmax) + f32(0.1) * f32(step)) / mx)
        better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        L = np.where(better, laux, L)
        scale = np.where(better, sumlx / suml2, scale)
        best = np.where(better, scale * sumlx, best)
    return np.where(zero, 0, L), np.where(zero, f32(0), scale)


# ---------------------------------------------------------------------------------------------
# The super-blocks

def pack_k_scales(sc, mn):
    """Q4_K/Q5_K's 12 bytes of eight 6-bit scales sc and mins mn (n, 8) a super-block: bytes 0-3
    scales 0-3 with the top two bits of scales 4-7, bytes 4-7 mins 0-3 with the top two bits of
    mins 4-7, bytes 8-11 the low nibbles of scales 4-7 and mins 4-7 (ggml's get_scale_min_k4)."""
    sc, mn = sc.astype(np.uint8), mn.astype(np.uint8)
    out = np.empty((len(sc), 12), np.uint8)
    out[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    return out


def quantize_q45_k(b, fmt):
    """quantize_row_q4_K_ref / quantize_row_q5_K_ref: super-blocks b (n, 256) -> (n, 144 | 176)."""
    nmax, rmin, rdelta, nstep = (15, -1.0, 0.1, 20) if fmt == "Q4_K" else (31, -0.5, 0.1, 15)
    n = len(b)
    x = np.ascontiguousarray(b.reshape(n * 8, 32).T)  # (32, n * 8): column j of block i is 8i + j
    av_x = np.sqrt(seq_sum(x * x) / f32(32))
    L, scales, mins = make_qkx2_quants(x, av_x + np.abs(x), nmax, rmin, rdelta, nstep)
    scales, mins = scales.reshape(n, 8), mins.reshape(n, 8)
    top_scale, top_min = scales.max(axis=1), mins.max(axis=1)
    max_scale = np.where(top_scale > 0, top_scale, f32(0))  # from 0, raised by larger ones only
    max_min = np.where(top_min > 0, top_min, f32(0))
    inv_scale = np.where(max_scale > 0, f32(63) / max_scale, f32(0))
    inv_min = np.where(max_min > 0, f32(63) / max_min, f32(0))
    # uint8_t ls = nearest_int(...): a negative int wraps modulo 256 before MIN(63, ls)
    ls = np.minimum(63, nearest_int(inv_scale[:, None] * scales) & 0xFF)
    lm = np.minimum(63, nearest_int(inv_min[:, None] * mins) & 0xFF)
    d, dmin = max_scale / f32(63), max_min / f32(63)
    step = (d.astype(np.float16).astype(f32)[:, None] * ls.astype(f32)).reshape(-1)  # (n * 8,)
    offset = (dmin.astype(np.float16).astype(f32)[:, None] * lm.astype(f32)).reshape(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        requant = np.clip(nearest_int((x + offset) / step), 0, nmax)
    L = np.where(step != 0, requant, L).astype(np.uint8).T.reshape(n, 8, 32)
    # sub-blocks 2j and 2j + 1 share qs[32j .. 32j + 32): the low nibbles and the high ones
    qs = ((L[:, 0::2] & 0x0F) | ((L[:, 1::2] & 0x0F) << 4)).reshape(n, 128)
    head = [fp16_bytes(d), fp16_bytes(dmin), pack_k_scales(ls, lm)]
    if fmt == "Q4_K":
        return np.concatenate(head + [qs], axis=1)
    qh = np.zeros((n, 32), np.uint8)  # the fifth bit of sub-block s's weight i: bit s of qh[i]
    for s in range(8):
        qh |= (L[:, s] >> 4) << s
    return np.concatenate(head + [qh, qs], axis=1)


def quantize_q6_k(b):
    """quantize_row_q6_K_ref: super-blocks b (n, 256) -> (n, 210)."""
    n = len(b)
    x = np.ascontiguousarray(b.reshape(n * 16, 16).T)  # (16, n * 16): column j of block i is 16i + j
    L, scales = make_qx_quants(x, 32)
    scales = scales.reshape(n, 16)
    rows = np.arange(n)
    max_scale = scales[rows, np.abs(scales).argmax(axis=1)]  # the first of largest |scale|, signed
    zero = np.abs(max_scale) < GROUP_MAX_EPS
    iscale = f32(-128) / np.where(zero, f32(1), max_scale)
    d = f32(1) / iscale
    sc = np.minimum(127, nearest_int(iscale[:, None] * scales)).astype(np.int8)
    step = (d.astype(np.float16).astype(f32)[:, None] * sc.astype(f32)).reshape(-1)  # (n * 16,)
    with np.errstate(divide="ignore", invalid="ignore"):
        requant = np.clip(nearest_int(x / step), -32, 31) + 32
    q = np.where(step != 0, requant, L).astype(np.uint8).T.reshape(n, 2, 128)
    # weight h*128 + k*64 + i: low nibble in ql[h*64 + i] (k = 0) or its high nibble (k = 1);
    # weight h*128 + j*32 + i: its top two bits at bits 2j of qh[h*32 + i]
    ql = (q[:, :, :64] & 0x0F) | ((q[:, :, 64:] & 0x0F) << 4)
    hi = (q >> 4).reshape(n, 2, 4, 32)
    qh = hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)
    out = np.concatenate([ql.reshape(n, 128), qh.reshape(n, 64), sc.view(np.uint8), fp16_bytes(d)], axis=1)
    out[zero] = 0  # memset(&y[i], 0, ...): an all-zero super-block is zero bytes
    return out


def quantize_k(x: np.ndarray, fmt: str) -> np.ndarray:
    """float32 values, a whole number of 256-weight super-blocks in each row of x (rows, cols) ->
    (rows, cols / 256 * block bytes) uint8 of fmt (Q4_K, Q5_K, Q6_K), ggml's reference bytes."""
    rows = x.shape[0] if x.ndim > 1 else 1
    b = np.asarray(x, f32).reshape(-1, QK_K)
    out = np.empty((len(b), BLOCK_BYTES[fmt]), np.uint8)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        for i in range(0, len(b), BLOCKS_PER_PASS):
            part = b[i:i + BLOCKS_PER_PASS]
            out[i:i + BLOCKS_PER_PASS] = quantize_q6_k(part) if fmt == "Q6_K" else quantize_q45_k(part, fmt)
    return out.reshape(rows, -1)
