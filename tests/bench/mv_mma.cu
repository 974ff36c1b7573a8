/* mv_mma.cu - can batch-1 decode's matvec y = W x read GGUF Q4_0 (and Q8_0) weights at the memory
 * bandwidth on the tensor cores, x kept at fp32 precision? A standalone prototype, asked on the GPU
 * machine before any change to runtime/.
 *
 * Why: the SIMT matvec (runtime/cuda_matvec.cuh) reads bf16 at 86-87% of the read probe but Q4_0 at
 * 46.5% and Q8_0 at 73% (tests/cuda_format_test.cu bench, 4096 x 14336, H100): each weight costs
 * ~3-4 SIMT instructions (nibble extract, byte permute, subtract, FMA). llama.cpp's dp4a path
 * quantizes x to int8; here x stays fp32 (two fp16 terms, as attention's tensor-core path does).
 *
 * -- Design ------------------------------------------------------------------------------------
 * mma.m16n8k16 (fp16 in, fp32 sums): A = 16 rows of W x 16 k, exact small integers in fp16; B = x.
 * - Columns of B: pair n = 2j, 2j + 1 holds block j's (of 4 GGUF blocks) x terms hi and lo
 *   (hi = fp16(x 2^e), lo = fp16(x 2^e - hi), e a power of 2 putting max |x| in [2^14, 2^15): no
 *   overflow, and lo keeps ~22 bits), nonzero only at the 4 k of a k-step that belong to block j.
 *   A k-step's k = 2c, 2c + 1, 2c + 8, 2c + 9 are block c's, which are exactly A's elements of lane
 *   (g, c) (PTX fragment: a0 = A[g][2c..], a1 = A[g + 8][2c..], a2 = A[g][2c + 8..], a3 = row g + 8).
 *   So lane (g, c) feeds block c of rows g and g + 8 only, 8 k-steps take its 32 weights, and after
 *   them the accumulators C[g][2c], C[g][2c + 1] (lane (g, c)'s c0, c1) are block c's hi and lo sums
 *   for row g (c2, c3 row g + 8). The lane scales them by its own two d: acc += d (c0 + c1). Every
 *   lane does useful scale work; B is 3/4 zeros (the tensor cores have time to spare).
 * - A tile is 16 rows x 128 columns (4 blocks): lane (g, c) loads block c of row g and of row g + 8,
 *   GGUF's own 16 nibble bytes each (Q8_0: 32 bytes, two loads each), no reordering inside a block:
 *   k-step s = 2w + o takes word w shifted by 8 o; (word & 0x000F000F) | 0x64006400 (one lop3) is
 *   fp16 1024 + n of weights 4w + o, 4w + o + 2 (a0), one hsub2 by 1032 makes n - 8; & 0x00F000F0
 *   gives 1024 + 16 n of weights + 16, + 18 (a2), hfma2 by 1/16 and -72 makes n - 8. 9 instructions
 *   for 8 weights (shr, 4 lop3, 2 hsub2, 2 hfma2). Q8_0: word s, byte_perm with 0x64 of (w ^ 0x80..)
 *   gives 1024 + q + 128 of bytes 0, 2 (a0) and 1, 3 (a2), hsub2 by 1152: 5 for 4 weights.
 *   B's fragments are ordered to match (prep_kernel), so the dot product pairs the right x.
 * - Repack (repack_kernel, on upload): tile t = R KT + T (rows 16 R .., columns 128 T .., KT = K /
 *   128) is 1024 bytes (Q8_0 2048): 512-byte parts p, lane l = 4 g + c's 16 bytes at 16 l; p = h (or
 *   2 h + j for Q8_0's two halves), h: row g or g + 8. Every warp load is one aligned 512-byte piece
 *   and a warp's tiles are consecutive: one contiguous stream. Scales apart: tile t's 64 fp16 at
 *   64 t, lane l's (d of row g, of row g + 8) a 32-bit word at 32 t + l.
 * - The grid: persistent, G warps; warp i takes tiles [i NT / G, (i + 1) NT / G) of the NT tiles in
 *   order (balanced to one tile whatever the shape), U tiles a step (PIPE: the next step's loads
 *   issued before this step's products, two register sets). A row tile covered by one warp is
 *   written directly; one split between warps: each writes its partial (16 floats) to global memory
 *   and counts itself in; the last one sums the partials in warp order (deterministic) and resets
 *   the count. B's fragments (4 bytes per k, as the fp32 x the SIMT path stages) are copied into
 *   shared memory by each block after its first step's loads are issued; the lanes that feed zeros
 *   read a 64-byte zero area placed so that no quarter-warp's LDS.128 conflicts.
 *
 * -- Prediction ---------------------------------------------------------------------------------
 * Per tile and warp, Q4_0 (2,048 weights, 1,152 bytes with the scales), from the SASS (nvcc 13.0,
 * u4): 32 LOP3 + 8 SHF (INT pipe), 16 HADD2 + 16 HFMA2, 8 HMMA.16816.F32, 4 LDS.128, 2 LDG.128 +
 * 1 LDG.32, ~14 for the scales, the loop and the B pointer: ~100 warp instructions, 0.09 a byte.
 * (Written in C, (w & mask) | magic took two LOP3s, one immediate each: 13 instructions per 8
 * weights instead of 9; and_or below keeps it to one.) Q8_0 (2,176 bytes a tile): 32 PRMT + 16 LOP3,
 * 34 HADD2, 8 HMMA, 4 LDS, 5 LDG, ~12 more: ~105, 0.05 a byte.
 * An H100 SM issues 4 warp instructions a clock and the probe gives it ~12 bytes a clock (132 SMs,
 * ~3 TB/s): 0.33 instructions a byte before arithmetic is the limit. Q4_0 uses ~27% of issue, ~26%
 * of the half-rate INT pipe (~50 INT ops x 2 cycles per 384 SMSP-cycles a tile's bytes take),
 * ~17% of the tensor pipe (mma.sync at ~half the wgmma rate: ~2 SM-clocks an HMMA), ~10% of FP16;
 * Q8_0 about half that. For comparison the SIMT path spends ~110 instructions (estimated from its
 * source: a PRMT, FADD and FFMA a weight, the nibble masks, 8 LDS.128 of x) on one chunk of 32 Q4_0
 * weights a lane, 576 bytes a warp: 0.19 a byte, ~60% of issue and ~40% of the INT pipe before
 * any stall; it measures 46.5%.
 * mma.sync, not wgmma: the tensor pipe is not the limit, and HMMA takes A from the registers the
 * lanes load, in the fragment layout above, with no shared-memory pass for W.
 * So neither format should be bound by arithmetic any more: both should read as the bf16 SIMT
 * matvec does, 85-90% of the probe at 4096 x 14336 and 14336 x 4096, within a few percent of this
 * program's "loads" variant (the same kernel with the products replaced by an XOR of the loaded
 * words: the access pattern's own ceiling). Smaller matrices (2048 x 8192 Q4_0: 9.4 MB, ~3 us a
 * launch) lose a fixed ~1-2 us to ramp-up, staging and the tail: expect 60-75% there, the loads
 * variant alike. Bytes in flight: u4 holds 4 tiles = 4.6 KB a warp (Q4_0), 24 warps an SM (76
 * registers, 3 blocks of 8 warps): ~110 KB an SM issued a round, well past the ~40 KB HBM3 needs.
 * Staging: each block copies B's K x 4 bytes from L2 (57 KB at K = 14336, as the SIMT path stages
 * fp32 x), behind its first step's loads.
 *
 * -- Numerics and the bound --------------------------------------------------------------------
 * Products are exact (fp16 x fp16 into fp32); x = (hi + lo) 2^-e to ~2^-22 relative; the tensor
 * cores sum 8 k-steps of a block in fp32 (truncating: <= ~2^-23 of the largest term a step), the
 * lane's fp32 fma chain has K / 128 terms, then 4 lanes and the split partials. Expected max error
 * ~1e-7..1e-6 of sum_k |w_k x_k| (tests/bench/mv_mma_sim.py models it at <1e-7 with round-to-
 * nearest sums). Bound: 1e-5 of sum |w x| per row. A kernel that lost the lo term shows ~7e-5
 * (the simulation, dropping it), any index error O(1); fp32 SIMT sums over K = 14336 have a worst
 * case ~K/1024 2^-24 ~ 1e-6. So 1e-5 passes fp32-class arithmetic and fails fp16-class.
 *
 * Build and run (on the GPU machine): bash tests/bench/mv_mma.sh, or
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a tests/bench/mv_mma.cu -o build/mv_mma
 *   build/mv_mma 4096 14336 14336 4096 2048 8192      (pairs of ROWS K; exit 1 if any check fails)
 * Prints the probe, then per shape and format one line (the best variant's GB/s, its share of the
 * probe, the max error over all variants, PASS/FAIL) and one line of every variant. */
#include "bench_common.cuh"

#include <cuda_fp16.h>
#include <math.h>
#include <string.h>

#include <algorithm>
#include <cmath>
#include <vector>

#define F_Q4_0 0
#define F_Q8_0 1
#define ERR_BOUND 1e-5 /* of sum_k |w_k x_k| a row: see the top of the file */

/* A format's sizes: GGUF's block (fp16 d, then VB bytes of values), a tile's bytes of values (16 rows
 * x 4 blocks) and the 16-byte loads a lane makes of it */
template <int F>
struct fmt {
    static constexpr int VB = F == F_Q4_0 ? 16 : 32;
    static constexpr int GGUF_BYTES = 2 + VB;
    static constexpr int TILE = 64 * VB;
    static constexpr int PARTS = TILE / 512;
    static constexpr const char *NAME = F == F_Q4_0 ? "Q4_0" : "Q8_0";
};

// ---------------------------------------------------------------------------------------------
// Device code: the repack, B's fragments, the matvec

__device__ __forceinline__ __half2 as_h2(uint32_t u) { return *reinterpret_cast<const __half2 *>(&u); }
__device__ __forceinline__ uint32_t as_u32(__half2 h) { return *reinterpret_cast<const uint32_t *>(&h); }

/* c (16 x 8, fp32) += a (16 x 16, row-major) . b (16 x 8, column-major), fp16 operands */
__device__ __forceinline__ void mma_f16_16x8x16(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                                uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* GGUF block bi = r (K / 32) + b (row r, block b) into the tiles: tile t = R KT + T, lane 4 g + c,
 * part h (VB / 16) + j, h = row's half of its 16; its d at halves 64 t + 2 lane + h */
template <int F>
__global__ void repack_kernel(const uint8_t *src, uint8_t *q, uint16_t *sc, int M, int K) {
    using FM = fmt<F>;
    const int KB = K / 32, KT = K / 128;
    for (size_t bi = blockIdx.x * (size_t)blockDim.x + threadIdx.x; bi < (size_t)M * KB; bi += (size_t)gridDim.x * blockDim.x) {
        const int r = (int)(bi / KB), b = (int)(bi % KB);
        const int R = r / 16, g = r % 8, h = (r % 16) / 8, T = b / 4, c = b % 4, lane = 4 * g + c;
        const size_t t = (size_t)R * KT + T;
        const uint8_t *in = src + bi * FM::GGUF_BYTES;
        for (int j = 0; j < FM::VB / 16; j++) {
            uint8_t *o = q + t * FM::TILE + (size_t)(h * (FM::VB / 16) + j) * 512 + 16 * lane;
            for (int i = 0; i < 16; i++) o[i] = in[2 + 16 * j + i];
        }
        sc[t * 64 + 2 * lane + h] = (uint16_t)(in[0] | in[1] << 8);
    }
}

/* The block's weights (i0, i1) in register r (0: a0 / b0, 1: a2 / b1) of k-step s (0..7) */
template <int F>
__device__ __forceinline__ int2 frag_index(int s, int r) {
    if (F == F_Q4_0) {
        const int base = 4 * (s / 2) + s % 2 + 16 * r;
        return make_int2(base, base + 2);
    }
    return make_int2(4 * s + r, 4 * s + r + 2);
}

/* B's fragments of x (K floats) into words (K): block kb's term t (0 hi, 1 lo) of k-step s, register r
 * at word 32 kb + 16 t + 2 s + r, and e (max |x| 2^e in [2^14, 2^15)). One block of 1024 threads:
 * x is read once a step by a different kernel in the engine; here it is built once, untimed. */
template <int F>
__global__ void __launch_bounds__(1024) prep_kernel(const float *x, uint32_t *words, int *e_out, int K) {
    __shared__ float red[32];
    __shared__ int e_sh;
    float m = 0.0f;
    for (int k = threadIdx.x; k < K; k += blockDim.x) m = fmaxf(m, fabsf(x[k]));
    for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
        float a = 0.0f;
        for (int w = 0; w < (int)blockDim.x / 32; w++) a = fmaxf(a, red[w]);
        int ex = 0;
        if (a > 0.0f) frexpf(a, &ex); /* a = m 2^ex, m in [0.5, 1) */
        e_sh = a > 0.0f ? 15 - ex : 0;
        *e_out = e_sh;
    }
    __syncthreads();
    const int e = e_sh;
    for (int idx = threadIdx.x; idx < K; idx += blockDim.x) {
        const int kb = idx / 32, t = (idx / 16) % 2, s = (idx % 16) / 2, r = idx % 2;
        const int2 i = frag_index<F>(s, r);
        const float x0 = ldexpf(x[32 * kb + i.x], e), x1 = ldexpf(x[32 * kb + i.y], e);
        const __half h0 = __float2half_rn(x0), h1 = __float2half_rn(x1);
        const __half l0 = __float2half_rn(x0 - __half2float(h0)), l1 = __float2half_rn(x1 - __half2float(h1));
        words[idx] = as_u32(t ? __halves2half2(l0, l1) : __halves2half2(h0, h1));
    }
}

/* A lane's loads of one tile: PARTS 16-byte pieces of values, its word of two scales */
template <int F>
struct tile_regs {
    uint4 v[fmt<F>::PARTS];
    uint32_t s;
};

template <int F>
__device__ __forceinline__ void load_tile(tile_regs<F> &r, const uint4 *q, const uint32_t *sc, int t, int lane) {
    const uint4 *p = q + (size_t)t * (fmt<F>::TILE / 16) + lane;
#pragma unroll
    for (int i = 0; i < fmt<F>::PARTS; i++) r.v[i] = __ldcs(p + 32 * i);
    r.s = __ldcs(sc + (size_t)t * 32 + lane);
}

__device__ __forceinline__ uint32_t word(uint4 u, int i) { return i == 0 ? u.x : i == 1 ? u.y : i == 2 ? u.z : u.w; }

/* (w & mask) | magic in one lop3: written in C, the compiler splits it into two, as one LOP3 holds
 * one immediate; here the magic comes in a register */
template <uint32_t MASK>
__device__ __forceinline__ uint32_t and_or(uint32_t w, uint32_t magic) {
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(w), "n"(MASK), "r"(magic)); /* 0xEA: (a & b) | c */
    return r;
}
/* nibbles at bits 0-3 and 16-19 as fp16 n - 8: 1024 + n (lop3 into 0x6400), minus 1032 */
__device__ __forceinline__ uint32_t nib_lo(uint32_t w, uint32_t magic) {
    return as_u32(__hsub2(as_h2(and_or<0x000F000Fu>(w, magic)), as_h2(0x64086408u)));
}
/* nibbles at bits 4-7 and 20-23 as fp16 n - 8: 1024 + 16 n, times 1/16 minus 72 (exact) */
__device__ __forceinline__ uint32_t nib_hi(uint32_t w, uint32_t magic) {
    return as_u32(__hfma2(as_h2(and_or<0x00F000F0u>(w, magic)), as_h2(0x2C002C00u), as_h2(0xD480D480u)));
}
/* bytes sel of xw (= w ^ 0x80808080: q + 128) as fp16 1024 + q + 128 (byte_perm with 0x64), minus 1152 */
__device__ __forceinline__ uint32_t q8_pair(uint32_t xw, uint32_t magic, uint32_t sel) {
    return as_u32(__hsub2(as_h2(__byte_perm(xw, magic, sel)), as_h2(0x64806480u)));
}

/* A's registers of k-step s (0..7) from the lane's loads of a tile; magic: 0x64006400 in a register
 * (Q4_0), 0x64646464 (Q8_0) */
template <int F>
__device__ __forceinline__ void a_operands(const tile_regs<F> &r, int s, uint32_t a[4], uint32_t magic) {
    if constexpr (F == F_Q4_0) {
        const uint32_t wg = word(r.v[0], s / 2) >> (8 * (s % 2)), wg8 = word(r.v[1], s / 2) >> (8 * (s % 2));
        a[0] = nib_lo(wg, magic), a[1] = nib_lo(wg8, magic), a[2] = nib_hi(wg, magic), a[3] = nib_hi(wg8, magic);
    } else {
        const uint32_t xg = word(r.v[s / 4], s % 4) ^ 0x80808080u, xg8 = word(r.v[2 + s / 4], s % 4) ^ 0x80808080u;
        a[0] = q8_pair(xg, magic, 0x4240), a[1] = q8_pair(xg8, magic, 0x4240), a[2] = q8_pair(xg, magic, 0x4341),
        a[3] = q8_pair(xg8, magic, 0x4341);
    }
}

/* One tile's products: 8 k-steps into fresh accumulators, then block c's sums of rows g and g + 8
 * scaled by their d into acc_g, acc_g8. sb: the lane's B uint4s of this tile in shared memory. */
template <int F>
__device__ __forceinline__ void tile_products(const tile_regs<F> &r, const uint4 *sb, uint32_t magic, float &acc_g, float &acc_g8) {
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const uint4 b = sb[j];
        uint32_t a[4];
        a_operands<F>(r, 2 * j, a, magic);
        mma_f16_16x8x16(c, a[0], a[1], a[2], a[3], b.x, b.y);
        a_operands<F>(r, 2 * j + 1, a, magic);
        mma_f16_16x8x16(c, a[0], a[1], a[2], a[3], b.z, b.w);
    }
    const float2 d = __half22float2(as_h2(r.s));
    acc_g = fmaf(d.x, c[0] + c[1], acc_g);
    acc_g8 = fmaf(d.y, c[2] + c[3], acc_g8);
}

/* The matvec: y (M) = W (M x K, repacked at q, sc) . x (B's fragments at frags, e at e_p). WARPS warps
 * a block, U tiles a step, PIPE: two register sets. MATH false: the same loads and staging, the
 * arithmetic replaced by an XOR of the loaded words (the pattern's ceiling). part: 2 x 16 floats a
 * warp; count: one a row tile, zero between launches. Needs G <= NT (the host's grid). */
template <int F, int U, bool PIPE, bool MATH, int WARPS, int MINB>
__global__ void __launch_bounds__(WARPS * 32, MINB)
    mv_kernel(const uint4 *__restrict__ q, const uint32_t *__restrict__ sc, const uint4 *__restrict__ frags, const int *__restrict__ e_p,
              float *__restrict__ y, float *__restrict__ part, unsigned *__restrict__ count, unsigned *sink, int M, int K) {
    extern __shared__ uint4 sm[]; /* (K / 4 + 6): the fragments, 2 pad, 4 zero */
    const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const int G = gridDim.x * WARPS, i = blockIdx.x * WARPS + threadIdx.x / 32;
    const int KT = K / 128, NT = M / 16 * KT;
    /* (NT + 1) G < 2^32 (the host checks): 32-bit divisions, inline */
    auto start = [&](int w) { return (int)((unsigned)w * (unsigned)NT / (unsigned)G); };
    auto owner = [&](int t) { return (int)(((unsigned)(t + 1) * (unsigned)G - 1u) / (unsigned)NT); }; /* the warp whose range holds tile t */
    const int a = start(i), b = start(i + 1);
    /* B: lane (g, c) feeds term g % 2 of block c of the tile when g / 2 == c, else zeros */
    const bool active = g / 2 == c;
    const int bstride = active ? 32 : 0, boff = active ? 8 * c + 4 * (g % 2) : K / 4 + 2;

    tile_regs<F> v0[U], v1[PIPE ? U : 1];
    auto load_step = [&](tile_regs<F>(&v)[U], int t0) {
#pragma unroll
        for (int u = 0; u < U; u++)
            if (t0 + u < b) load_tile<F>(v[u], q, sc, t0 + u, lane);
    };
    load_step(v0, a);

    for (int k = threadIdx.x; k < K / 4; k += blockDim.x) sm[k] = __ldg(frags + k);
    if (threadIdx.x < 6) sm[K / 4 + threadIdx.x] = make_uint4(0, 0, 0, 0);
    __syncthreads();
    const float xinv = ldexpf(1.0f, -*e_p);

    const int R0 = a / KT; /* the first row tile; the warp's last is R at the end */
    int R = R0, T = a % KT;
    const uint4 *sb = sm + T * bstride + boff; /* the lane's B of tile T */
    /* the magic as a value the compiler cannot fold into the instructions (lop3 / prmt take one
     * immediate); M >= 16 always */
    const uint32_t magic = (F == F_Q4_0 ? 0x64006400u : 0x64646464u) | (uint32_t)(M >> 30);
    float acc_g = 0.0f, acc_g8 = 0.0f, first_g = 0.0f, first_g8 = 0.0f;
    unsigned fold_acc = 0;
    /* the quad's sums of row tile R (lanes c = 0: rows g, g + 8), the accumulators cleared */
    auto quad_sums = [&](float &s_g, float &s_g8) {
        s_g = acc_g + __shfl_xor_sync(0xFFFFFFFFu, acc_g, 1);
        s_g8 = acc_g8 + __shfl_xor_sync(0xFFFFFFFFu, acc_g8, 1);
        s_g += __shfl_xor_sync(0xFFFFFFFFu, s_g, 2);
        s_g8 += __shfl_xor_sync(0xFFFFFFFFu, s_g8, 2);
        acc_g = acc_g8 = 0.0f;
    };
    /* a row tile ends inside the range: whole (written) unless it is the first, begun before a
     * (kept for after the loop) */
    auto flush = [&]() {
        float s_g, s_g8;
        quad_sums(s_g, s_g8);
        if (a <= R * KT) {
            if (c == 0) {
                y[16 * R + g] = s_g * xinv;
                y[16 * R + g + 8] = s_g8 * xinv;
            }
        } else {
            first_g = s_g, first_g8 = s_g8;
        }
    };
    auto step = [&](const tile_regs<F>(&v)[U], int t0) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (t0 + u < b) {
                if constexpr (MATH) {
                    if (T == KT) {
                        flush();
                        R++;
                        T = 0;
                        sb = sm + boff;
                    }
                    tile_products<F>(v[u], sb, magic, acc_g, acc_g8);
                    T++;
                    sb += bstride;
                } else {
#pragma unroll
                    for (int p = 0; p < fmt<F>::PARTS; p++) fold_acc ^= fold(v[u].v[p]);
                    fold_acc ^= v[u].s;
                }
            }
        }
    };

    if constexpr (PIPE) {
        for (int t = a; t < b; t += 2 * U) {
            if (t + U < b) load_step(v1, t + U);
            step(v0, t);
            if (t + 2 * U < b) load_step(v0, t + 2 * U);
            if (t + U < b) step(v1, t + U);
        }
    } else {
        for (int t = a; t < b; t += U) {
            if (t != a) load_step(v0, t);
            step(v0, t);
        }
    }
    if constexpr (MATH) {
        /* the last row tile R: whole, or a partial (slot 1, or 0 when the range lies inside R); the
         * first, R0, if begun before a and not R, a partial in slot 0. Each partial is counted in;
         * the last of a row tile's warps to count in sums its partials in warp order. */
        float s_g, s_g8;
        quad_sums(s_g, s_g8);
        const bool last_whole = a <= R * KT && (R + 1) * KT <= b, first_part = R0 != R && a > R0 * KT;
        if (last_whole && c == 0) {
            y[16 * R + g] = s_g * xinv;
            y[16 * R + g + 8] = s_g8 * xinv;
        }
        if (c == 0) {
            if (!last_whole) {
                float *pp = part + ((size_t)i * 2 + (R == R0 ? 0 : 1)) * 16;
                pp[g] = s_g, pp[g + 8] = s_g8;
            }
            if (first_part) {
                float *pp = part + (size_t)i * 2 * 16;
                pp[g] = first_g, pp[g + 8] = first_g8;
            }
        }
        __threadfence();
        __syncwarp();
#pragma unroll 1
        for (int k = 0; k < 2; k++) {
            const int P = k == 0 ? R0 : R;
            if (k == 0 ? !first_part : last_whole) continue;
            const int first = owner(P * KT), last = owner((P + 1) * KT - 1);
            unsigned old = 0;
            if (lane == 0) old = atomicAdd(&count[P], 1u);
            old = __shfl_sync(0xFFFFFFFFu, old, 0);
            if (old == (unsigned)(last - first)) {
                __threadfence();
                if (lane < 16) {
                    float s = 0.0f;
                    for (int j = first; j <= last; j++) {
                        const int sj = P == start(j) / KT ? 0 : 1;
                        s += __ldcg(part + ((size_t)j * 2 + sj) * 16 + lane);
                    }
                    y[16 * P + lane] = s * xinv;
                }
                if (lane == 0) count[P] = 0;
            }
        }
    } else if (fold_acc == MAGIC) {
        *sink = fold_acc;
    }
}

// ---------------------------------------------------------------------------------------------
// Host: GGUF blocks, the float64 reference, the variants, timing

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}
static double unit(void) { return (double)(rnd() >> 11) * (1.0 / 9007199254740992.0); }

/* M x K/32 GGUF blocks: d = +-2^u, u uniform in [-12, -2] (as fp16), values random bytes */
template <int F>
static std::vector<uint8_t> gguf_blocks(int M, int K) {
    using FM = fmt<F>;
    std::vector<uint8_t> out((size_t)M * (K / 32) * FM::GGUF_BYTES);
    for (size_t b = 0; b < out.size() / FM::GGUF_BYTES; b++) {
        uint8_t *p = &out[b * FM::GGUF_BYTES];
        const float d = (float)((rnd() & 1 ? -1.0 : 1.0) * exp2(-12.0 + 10.0 * unit()));
        const __half h = __float2half_rn(d);
        uint16_t bits;
        memcpy(&bits, &h, 2);
        p[0] = (uint8_t)bits, p[1] = (uint8_t)(bits >> 8);
        for (int i = 0; i < FM::VB; i++) p[2 + i] = (uint8_t)rnd();
    }
    return out;
}

/* y = W x in float64 over gguf's weights (d * (q - 8) or d * q, exact in fp32), and sum |w x| a row */
template <int F>
static void reference(const std::vector<uint8_t> &blocks, const std::vector<float> &x, int M, int K, std::vector<double> &ref,
                      std::vector<double> &mag) {
    using FM = fmt<F>;
    ref.assign(M, 0.0);
    mag.assign(M, 0.0);
    for (int r = 0; r < M; r++) {
        double s = 0.0, m = 0.0;
        for (int b = 0; b < K / 32; b++) {
            const uint8_t *p = &blocks[((size_t)r * (K / 32) + b) * FM::GGUF_BYTES];
            __half h;
            const uint16_t bits = (uint16_t)(p[0] | p[1] << 8);
            memcpy(&h, &bits, 2);
            const float d = __half2float(h);
            for (int i = 0; i < 32; i++) {
                int qv;
                if (F == F_Q4_0)
                    qv = (i < 16 ? p[2 + i] & 15 : p[2 + i - 16] >> 4) - 8;
                else
                    qv = (int8_t)p[2 + i];
                const float w = d * (float)qv;
                const double t = (double)w * (double)x[32 * b + i];
                s += t;
                m += fabs(t);
            }
        }
        ref[r] = s;
        mag[r] = m;
    }
}

struct variant {
    const char *name;
    const void *fn;
    int warps;
    bool math;
};

template <int F, int U, bool PIPE, bool MATH, int WARPS, int MINB>
static variant make_variant(const char *name) {
    return {name, (const void *)mv_kernel<F, U, PIPE, MATH, WARPS, MINB>, WARPS, MATH};
}

/* the variants a format runs: the unroll, one or two register sets, block size; the last is loads only */
template <int F>
static std::vector<variant> variants(void) {
    if constexpr (F == F_Q4_0)
        return {make_variant<F, 4, false, true, 8, 3>("u4"), make_variant<F, 2, true, true, 8, 3>("u2p"),
                make_variant<F, 4, true, true, 8, 2>("u4p"), make_variant<F, 4, true, true, 16, 1>("u4p/16w"),
                make_variant<F, 4, true, false, 8, 2>("loads")};
    else
        return {make_variant<F, 2, false, true, 8, 3>("u2"), make_variant<F, 4, false, true, 8, 2>("u4"),
                make_variant<F, 2, true, true, 8, 2>("u2p"), make_variant<F, 2, true, true, 16, 1>("u2p/16w"),
                make_variant<F, 2, true, false, 8, 2>("loads")};
}

struct device_bufs {
    unsigned *sink;
    float *part;
    unsigned *count;
    float *y;
    uint32_t *frags;
    int *e;
};

static cudaDeviceProp prop;

/* one launch of variant v on the matrix (q, sc) */
static void launch(const variant &v, int grid, size_t smem, const uint8_t *q, const uint16_t *sc, const device_bufs &d, int M, int K) {
    const uint4 *qa = reinterpret_cast<const uint4 *>(q);
    const uint32_t *sa = reinterpret_cast<const uint32_t *>(sc);
    const uint4 *fa = reinterpret_cast<const uint4 *>(d.frags);
    void *args[] = {(void *)&qa, (void *)&sa, (void *)&fa, (void *)&d.e, (void *)&d.y, (void *)&d.part, (void *)&d.count, (void *)&d.sink,
                    (void *)&M, (void *)&K};
    CHECK(cudaLaunchKernel(v.fn, dim3(grid), dim3(v.warps * 32), args, smem, 0));
}

/* bytes a second of the read probe (runtime/probe_cuda.cu's: 1 GiB, 4 x 512 threads an SM, best of 9) */
static double probe(void) {
    const size_t bytes = (size_t)1 << 30, n = bytes / 16;
    uint4 *buf;
    unsigned *sink;
    CHECK(cudaMalloc(&buf, bytes));
    CHECK(cudaMalloc(&sink, 4));
    fill_kernel<<<prop.multiProcessorCount * 8, 256>>>(buf, n);
    CHECK(cudaGetLastError());
    cudaEvent_t t0, t1;
    CHECK(cudaEventCreate(&t0));
    CHECK(cudaEventCreate(&t1));
    double best = 0.0;
    for (int pass = 0; pass < 10; pass++) {
        CHECK(cudaEventRecord(t0));
        probe_kernel<<<prop.multiProcessorCount * 4, 512>>>(buf, n, sink, 0);
        CHECK(cudaEventRecord(t1));
        CHECK(cudaEventSynchronize(t1));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, t0, t1));
        if (pass > 0 && bytes / (ms * 1e-3) > best) best = bytes / (ms * 1e-3);
    }
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    CHECK(cudaFree(buf));
    CHECK(cudaFree(sink));
    return best;
}

/* one format on one shape: returns 0, or 1 when a variant's error passes the bound */
template <int F>
static int run_format(int M, int K, double probe_bps, device_bufs &d) {
    using FM = fmt<F>;
    const int NT = M / 16 * (K / 128);
    const size_t tiles_bytes = (size_t)NT * FM::TILE, sc_bytes = (size_t)NT * 128;
    const double weight_bytes = (double)M * (K / 32) * FM::GGUF_BYTES;
    const std::vector<uint8_t> blocks = gguf_blocks<F>(M, K);
    std::vector<float> x(K);
    for (float &v : x) { /* normal, times 2^u with u uniform in [-2, 2]: a spread of magnitudes */
        const double u1 = unit() + 1e-300, u2 = unit();
        v = (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2) * exp2(-2.0 + 4.0 * unit()));
    }
    std::vector<double> ref, mag;
    reference<F>(blocks, x, M, K, ref, mag);

    /* copies of the repacked matrix, together past 4x L2, launched in turn so that L2 holds none */
    const int copies = std::max(2, (int)((4.0 * prop.l2CacheSize) / (double)(tiles_bytes + sc_bytes)) + 1);
    std::vector<uint8_t *> qs(copies);
    std::vector<uint16_t *> scs(copies);
    uint8_t *src;
    CHECK(cudaMalloc(&src, blocks.size()));
    CHECK(cudaMemcpy(src, blocks.data(), blocks.size(), cudaMemcpyHostToDevice));
    for (int k = 0; k < copies; k++) {
        CHECK(cudaMalloc(&qs[k], tiles_bytes));
        CHECK(cudaMalloc(&scs[k], sc_bytes));
        if (k == 0) {
            CHECK(cudaMemset(qs[0], 0xEE, tiles_bytes));
            CHECK(cudaMemset(scs[0], 0xEE, sc_bytes));
            repack_kernel<F><<<prop.multiProcessorCount * 8, 256>>>(src, qs[0], scs[0], M, K);
            CHECK(cudaGetLastError());
        } else {
            CHECK(cudaMemcpy(qs[k], qs[0], tiles_bytes, cudaMemcpyDeviceToDevice));
            CHECK(cudaMemcpy(scs[k], scs[0], sc_bytes, cudaMemcpyDeviceToDevice));
        }
    }
    CHECK(cudaFree(src));
    float *dx;
    CHECK(cudaMalloc(&dx, K * sizeof(float)));
    CHECK(cudaMemcpy(dx, x.data(), K * sizeof(float), cudaMemcpyHostToDevice));
    prep_kernel<F><<<1, 1024>>>(dx, d.frags, d.e, K);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaFree(dx));

    const size_t smem = ((size_t)K / 4 + 6) * 16;
    const std::vector<variant> vs = variants<F>();
    double worst_err = 0.0, best_bps = 0.0;
    const char *best_name = "";
    double best_us = 0.0;
    char detail[1024] = "";
    size_t dl = 0;
    std::vector<float> y(M);
    for (const variant &v : vs) {
        CHECK(cudaFuncSetAttribute(v.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        int per_sm = 0;
        CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, v.fn, v.warps * 32, smem));
        cudaFuncAttributes fa;
        CHECK(cudaFuncGetAttributes(&fa, v.fn));
        if (per_sm < 1) {
            dl += snprintf(detail + dl, sizeof detail - dl, " | %s: does not fit", v.name);
            continue;
        }
        const int grid = std::max(1, std::min(per_sm * prop.multiProcessorCount, NT / v.warps)); /* G <= NT */
        if ((double)(NT + 1) * grid * v.warps >= 4294967296.0) {
            fprintf(stderr, "mv_mma: %d x %d: (tiles + 1) x warps past 2^32 (the kernel's 32-bit divisions)\n", M, K);
            exit(2);
        }
        double err = 0.0;
        /* y from one launch on copy k against the reference; y filled with NaN first, so that a row
         * never written (a row tile's count not reset by the last launch, say) fails */
        auto check = [&](int k) {
            CHECK(cudaMemset(d.y, 0xFF, M * sizeof(float)));
            launch(v, grid, smem, qs[k], scs[k], d, M, K);
            CHECK(cudaDeviceSynchronize());
            CHECK(cudaMemcpy(y.data(), d.y, M * sizeof(float), cudaMemcpyDeviceToHost));
            for (int r = 0; r < M; r++) {
                const double e = fabs((double)y[r] - ref[r]) / (mag[r] > 0 ? mag[r] : 1.0);
                err = std::isfinite(e) ? std::max(err, e) : INFINITY;
            }
            worst_err = std::max(worst_err, err);
        };
        if (v.math) check(0);
        cudaEvent_t t0, t1;
        CHECK(cudaEventCreate(&t0));
        CHECK(cudaEventCreate(&t1));
        const int launches = 40;
        double best_ms = 1e30;
        for (int pass = 0; pass < 6; pass++) {
            CHECK(cudaEventRecord(t0));
            for (int l = 0; l < launches; l++) launch(v, grid, smem, qs[l % copies], scs[l % copies], d, M, K);
            CHECK(cudaEventRecord(t1));
            CHECK(cudaEventSynchronize(t1));
            float ms;
            CHECK(cudaEventElapsedTime(&ms, t0, t1));
            if (pass > 0) best_ms = std::min(best_ms, (double)ms / launches);
        }
        CHECK(cudaGetLastError());
        cudaEventDestroy(t0);
        cudaEventDestroy(t1);
        if (v.math) check(copies - 1); /* again after the 240 timed launches, on the last copy */
        const double bps = weight_bytes / (best_ms * 1e-3);
        if (v.math && bps > best_bps) best_bps = bps, best_name = v.name, best_us = best_ms * 1e3;
        dl += snprintf(detail + dl, sizeof detail - dl, "%s %s %.0f GB/s %.1f%% %.1f us, %d regs%s, %dx%d warps/SM", dl ? " |" : "", v.name,
                       bps / 1e9, 100.0 * bps / probe_bps, best_ms * 1e3, fa.numRegs, fa.localSizeBytes ? " SPILLS" : "", per_sm, v.warps);
        if (v.math) dl += snprintf(detail + dl, sizeof detail - dl, ", err %.1e", err);
    }
    const bool pass = worst_err <= ERR_BOUND;
    printf("mv_mma %d x %d %s: %.0f GB/s = %.1f%% of probe (%s, %.1f us, %.1f MB, %d copies), max error %.2e of sum|w x| (bound %.0e): %s\n",
           M, K, FM::NAME, best_bps / 1e9, 100.0 * best_bps / probe_bps, best_name, best_us, weight_bytes / 1e6, copies, worst_err, ERR_BOUND,
           pass ? "PASS" : "FAIL");
    printf("    %s\n", detail);
    fflush(stdout);
    for (int k = 0; k < copies; k++) {
        CHECK(cudaFree(qs[k]));
        CHECK(cudaFree(scs[k]));
    }
    return pass ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc < 3 || argc % 2 == 0) {
        fprintf(stderr, "usage: mv_mma ROWS K [ROWS K ...]   (ROWS a multiple of 16, K of 128, K <= 32768)\n");
        return 2;
    }
    int dev = 0;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaGetDeviceProperties(&prop, dev));
    const double probe_bps = probe();
    printf("%s, %d SMs, L2 %d MB: read probe %.1f GB/s\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, probe_bps / 1e9);
    int kmax = 0;
    for (int a = 1; a + 1 < argc; a += 2) kmax = std::max(kmax, atoi(argv[a + 1]));
    device_bufs d;
    const size_t max_warps = (size_t)prop.multiProcessorCount * 64;
    CHECK(cudaMalloc(&d.sink, 4));
    CHECK(cudaMalloc(&d.part, max_warps * 32 * sizeof(float)));
    CHECK(cudaMalloc(&d.frags, (size_t)std::max(kmax, 128) * 4));
    CHECK(cudaMalloc(&d.e, sizeof(int)));
    int fails = 0;
    for (int a = 1; a + 1 < argc; a += 2) {
        const int M = atoi(argv[a]), K = atoi(argv[a + 1]);
        if (M < 16 || M % 16 || K < 128 || K % 128 || K > 32768 || (long long)M / 16 * (K / 128) < 16) {
            fprintf(stderr, "mv_mma: %d x %d: ROWS a multiple of 16, K a multiple of 128 up to 32768 (B's fragments in shared memory)\n", M, K);
            return 2;
        }
        CHECK(cudaMalloc(&d.y, M * sizeof(float)));
        CHECK(cudaMalloc(&d.count, M / 16 * sizeof(unsigned)));
        CHECK(cudaMemset(d.count, 0, M / 16 * sizeof(unsigned)));
        fails += run_format<F_Q4_0>(M, K, probe_bps, d);
        fails += run_format<F_Q8_0>(M, K, probe_bps, d);
        CHECK(cudaFree(d.y));
        CHECK(cudaFree(d.count));
    }
    return fails ? 1 : 0;
}
