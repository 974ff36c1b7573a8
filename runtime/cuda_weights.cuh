/* cuda_weights.cuh - the weight formats: how a matrix is stored on the device and how the matvec
 * and GEMM cores read it. The cores take the format as a template parameter (W), so a new format
 * (8-bit, 4-bit with block scales) adds a type here, its upload and the plan's rules for it, not a
 * pass over every kernel.
 *
 * A format W gives:
 *   W::mat                 a matrix as the kernels take it (for a dense format a pointer to its
 *                          values; a format with scales holds their pointer beside the values')
 *   W::row_t, W::row(m, r, K)  where row r of a matrix of K columns starts
 *   W::chunk, W::VALS      what a lane loads of a row at once, and the weights in it: one 16-byte
 *                          load of values (and whatever scale they need), so that a warp's 32
 *                          lanes read 512 contiguous bytes
 *   W::IN_FLIGHT           (block formats) the most chunks a lane holds in flight a row step
 *   W::load(row, c)        chunk c of a row, streamed past L1 (each weight is read once a step)
 *   W::to_f32(chunk, f)    its VALS weights as fp32, in the order of the row
 *   W::XQ                  whether the matvec stages the format's inputs as 16-bit integers (the
 *                          block formats: xq_chunk below) instead of fp32 (the dense formats)
 *   W::dot(chunk, x)       its weights dotted with their VALS inputs, fp32: the matvec core's inner
 *                          product, where a format folds its scale in once a chunk. x is the chunk's
 *                          staged inputs: the dense formats' x(p), the p-th float4 of them (p <
 *                          VALS / 4); the block formats' xq_chunk, their integers and scale
 *   W::word(chunk)         one 32-bit word of it (load_lots' exit test reads the lot's data)
 *   W::BF16                the tensor cores' input type of the prompt's GEMMs (bf16, else fp16):
 *                          the GEMM cores take dense 16-bit formats only (W::DENSE16); a quantized
 *                          format reaches them as tiles dequantized to one of these.
 *
 * The matvec's staged input is laid out for the chunk (stage_input, sx_group): chunk c's VALS
 * inputs are the float4s c, K / VALS + c, ... (VALS / 4 planes), so that a warp's lanes read
 * consecutive float4s of each plane, no two lanes of a quarter-warp in one bank. The block formats
 * then take them as 16-bit integers a block of 32 (stage_xq): integer products on the dp2a units,
 * where unpacking each weight to fp32 bound the 4-bit matvec to 46-48% of the read probe
 * (docs/performance.md, D114, D135).
 *
 * Vectors (norm weights, biases) stay in the model's 16-bit dtype whatever the matrices' format:
 * they are a fraction of a percent of the bytes (w_to_f32). The formats: the dense w_bf16 and w_f16,
 * and GGUF's Q8_0, Q4_0 and Q4_1 (w_q8_0, w_q4_0, w_q4_1), each matrix field of a model in its own
 * (format_w of model_config.h's MODEL_FORMAT_*). */
#ifndef INGOT_CUDA_WEIGHTS_CUH
#define INGOT_CUDA_WEIGHTS_CUH

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <algorithm>
#include <type_traits>

#include "quant.h"

/* GPU_W_BF16: the weights on the device are bf16 (uploaded in their own dtype; converting bf16 to
 * fp16 on upload lost the 1B's decode 1.5% at depth 0: docs/performance.md, D98) */
#if defined(MODEL_WEIGHT_DTYPE_BF16)
#define GPU_W_BF16 1
#else
#define GPU_W_BF16 0
#endif

/* Streaming loads: each weight is read once per step, keep it out of L1. */
__device__ __forceinline__ uint4 ld_stream(const uint4 *p) { return __ldcs(p); }

/* 8 fp16 values (the KV cache, fp16 weights) in a uint4, to fp32 */
__device__ __forceinline__ void h8_to_f32(uint4 u, float f[8]) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 v = __half22float2(*reinterpret_cast<const __half2 *>(&w[i]));
        f[2 * i] = v.x;
        f[2 * i + 1] = v.y;
    }
}

/* 8 bf16 values in a uint4, to fp32: a bf16 is the high half of its fp32 */
__device__ __forceinline__ void b8_to_f32(uint4 u, float f[8]) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
    }
}

/* Dense 16-bit weights, bf16 (IS_BF16) or fp16: rows of K values, 8 a chunk. */
template <bool IS_BF16>
struct w16 {
    static constexpr bool DENSE16 = true;
    static constexpr bool XQ = false;
    static constexpr bool BF16 = IS_BF16;
    static constexpr int VALS = 8;
    using mat = const uint16_t *;
    using row_t = const uint4 *;
    using chunk = uint4;
    __host__ __device__ __forceinline__ static row_t row(mat m, int r, int K) { return reinterpret_cast<row_t>(m + (size_t)r * K); }
    static mat at(const void *p, size_t, int) { return static_cast<mat>(p); }
    __device__ __forceinline__ static chunk load(row_t row, int c) { return ld_stream(row + c); }
    __device__ __forceinline__ static void to_f32(chunk u, float f[VALS]) {
        if constexpr (IS_BF16)
            b8_to_f32(u, f);
        else
            h8_to_f32(u, f);
    }
    template <typename X>
    __device__ __forceinline__ static float dot(chunk u, X x) {
        float w[VALS];
        to_f32(u, w);
        const float4 a = x(0), b = x(1);
        return w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
    }
    __device__ __forceinline__ static uint32_t word(chunk u) { return u.x; }
};
using w_bf16 = w16<true>;
using w_f16 = w16<false>;

/* The four bytes of w, each as an fp32 integer minus k: byte b put into the low mantissa byte of
 * 2^23 (exact) and 2^23 + k taken off: one byte permute and one add a value, where I2F runs at a
 * quarter of the FMA rate. */
__device__ __forceinline__ float4 bytes_to_f32(uint32_t w, float k) {
    const float off = 8388608.0f + k;
    return make_float4(__int_as_float(__byte_perm(w, 0x4B000000u, 0x7440)) - off, __int_as_float(__byte_perm(w, 0x4B000000u, 0x7441)) - off,
                       __int_as_float(__byte_perm(w, 0x4B000000u, 0x7442)) - off, __int_as_float(__byte_perm(w, 0x4B000000u, 0x7443)) - off);
}

/* The block formats' inputs, as the matvec stages them (stage_xq, cuda_matvec.cuh): each block of
 * 32 consecutive inputs x as 16-bit integers x16 and one fp32 scale dx, x ~ dx * x16:
 *   amax = max |x| over the block (a NaN kept); inv = 32767 / amax and dx = amax / 32767 in fp32;
 *   x16 = the exact product x * inv rounded to the nearest integer, ties to even (|x16| <= 32767);
 *   a block whose amax is not finite: dx = NaN and x16 = 0 (its products NaN, as fp32 sums give);
 *   one under XQ_TINY (0 included): dx = 0 and x16 = 0.
 * Each x differs from dx * x16 by at most dx / 2: about 2e-5 of a dot product of normal activations,
 * finer than the fp16 inputs of the prompt's GEMMs. Products of the weights' integers with x16 are
 * exact in int32 (|q| <= 127, 32 terms of |x16| <= 32767) and scaled once a chunk: the same
 * numbers whatever the order of the sum, two dp2a a word of four weights. The CPU quantizes its
 * inputs by the same rule (runtime/quant.c's quant_input, D136). */
#define XQ_MAX 32767.0f
#define XQ_TINY 0x1p-100f

/* A chunk's staged inputs: its VALS inputs' x16, 8 a uint4 (x16(p): inputs 8p .. 8p + 7, two a word,
 * the lower in the low half), and meta(): (dx as bits, S_lo, S_hi, 0) with S_lo and S_hi the sums of
 * the x16 of its block's first and second 16 inputs (a chunk of 16 (Q8_0): its own sum and 0).
 * uint4 slot p * chunks + c holds plane p of chunk c, slot (VALS / 8) chunks + c its meta: a warp's
 * lanes read consecutive uint4s (stage_xq). */
template <int VALS>
struct xq_chunk {
    const uint4 *s;
    int chunks, c;
    __device__ __forceinline__ uint4 x16(int p) const { return s[p * chunks + c]; }
    __device__ __forceinline__ uint4 meta() const { return s[VALS / 8 * chunks + c]; }
};

/* sum over 4 weights' integers b (bytes of b, signed, weights 4i .. 4i + 3) times their x16 (the two
 * words xa, xb: inputs 4i, 4i + 1 and 4i + 2, 4i + 3), added to acc */
__device__ __forceinline__ int dot4_x16(uint32_t b, uint32_t xa, uint32_t xb, int acc) {
    return __dp2a_hi((int)xb, (int)b, __dp2a_lo((int)xa, (int)b, acc));
}

/* Block b (of blocks) of a format whose GGUF block is SCALE bytes of scales, then VALUES of values,
 * into the layout its cores read: every block's values, then every block's scales. */
template <int SCALE, int VALUES>
__device__ __forceinline__ void split_block(const uint8_t *in, uint8_t *dst, size_t b, size_t blocks) {
    for (int i = 0; i < VALUES; i++) dst[b * VALUES + i] = in[SCALE + i];
    for (int i = 0; i < SCALE; i++) dst[blocks * VALUES + b * SCALE + i] = in[i];
}

/* GGUF's Q8_0 (blocks of 32 int8 values q and an fp16 scale d; a weight is d * q in fp32, as
 * gguf's dequantizer and ggml compute it), repacked on upload for 16-byte loads: a matrix's values
 * as int8 (rows, K) and its scales as fp16 (rows, K / 32), apart. A chunk is half a block: 16
 * values and their block's scale, which two lanes read (1.0625 bytes a weight). K a multiple of 32. */
struct w_q8_0 {
    static constexpr bool DENSE16 = false;
    static constexpr bool XQ = true;
    static constexpr int IN_FLIGHT = 4; /* 64 weights: 73% of the probe alone, 8 spill (D114) */
    static constexpr bool BF16 = false;
    static constexpr int VALS = 16;
    static constexpr int BLOCK = 32;
    static constexpr int SCALE_BYTES = 2, VALUE_BYTES = 32; /* of a block; GGUF's block is the two in that order */
    static constexpr int BLOCK_BYTES = SCALE_BYTES + VALUE_BYTES;
    __device__ static void repack(const uint8_t *in, uint8_t *dst, size_t b, size_t blocks) {
        split_block<SCALE_BYTES, VALUE_BYTES>(in, dst, b, blocks);
    }
    struct mat {
        const int8_t *q;
        const __half *d;
    };
    /* the matrix of rows (K) repacked at p: values, then scales */
    static mat at(const void *p, size_t rows, int K) {
        return {static_cast<const int8_t *>(p), reinterpret_cast<const __half *>(static_cast<const uint8_t *>(p) + rows * (K / BLOCK) * VALUE_BYTES)};
    }
    struct row_t {
        const uint4 *q;
        const unsigned short *d;
    };
    struct chunk {
        uint4 q;
        unsigned short d;
    };
    __host__ __device__ __forceinline__ static row_t row(mat m, int r, int K) {
        return {reinterpret_cast<const uint4 *>(m.q + (size_t)r * K), reinterpret_cast<const unsigned short *>(m.d) + (size_t)r * (K / BLOCK)};
    }
    __device__ __forceinline__ static chunk load(row_t row, int c) { return {ld_stream(row.q + c), __ldcs(row.d + c / 2)}; }
    __device__ __forceinline__ static void to_f32(chunk u, float f[VALS]) {
        const float d = __half2float(__ushort_as_half(u.d));
        const uint32_t w[4] = {u.q.x, u.q.y, u.q.z, u.q.w};
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int b = 0; b < 4; b++) f[4 * i + b] = d * (float)(int8_t)(w[i] >> (8 * b));
    }
    /* d dx sum(q x16): the sum exact in int32, rounded once to fp32 */
    __device__ __forceinline__ static float dot(chunk u, xq_chunk<VALS> x) {
        const uint4 a = x.x16(0), b = x.x16(1);
        int s = dot4_x16(u.q.x, a.x, a.y, 0);
        s = dot4_x16(u.q.y, a.z, a.w, s);
        s = dot4_x16(u.q.z, b.x, b.y, s);
        s = dot4_x16(u.q.w, b.z, b.w, s);
        return (__half2float(__ushort_as_half(u.d)) * __uint_as_float(x.meta().x)) * (float)s;
    }
    __device__ __forceinline__ static uint32_t word(chunk u) { return u.q.x; }
};

/* A chunk of 32 weights stored as nibbles, as the 4-bit formats' chunks are (16 bytes, byte i: weight i
 * in its low nibble, weight i + 16 in its high), each weight q = nibble + high(i, half) (the bits
 * above the nibble, spliced in place by the K formats; 0 for Q4_0 and Q4_1) minus k, as fp32. nibbles
 * gives word i's low (weights 4i..4i+3) or high (16 + 4i..) half, with its high bits. */
template <typename H>
__device__ __forceinline__ float4 nibbles(uint32_t w, int i, int half, float k, H high) {
    return bytes_to_f32(((half ? w >> 4 : w) & 0x0F0F0F0Fu) | high(i, half), k);
}

/* The chunk's integer sums over its first and second 16 weights of q * x16, q = nibble + high(i,
 * half) (no offset: the formats take k times the inputs' sums off, from meta()): (lo, hi). */
template <typename H>
__device__ __forceinline__ int2 nibble_sums(uint4 q, H high, xq_chunk<32> x) {
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
    const uint4 x0 = x.x16(0), x1 = x.x16(1), x2 = x.x16(2), x3 = x.x16(3);
    const uint32_t xl[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w}, xh[8] = {x2.x, x2.y, x2.z, x2.w, x3.x, x3.y, x3.z, x3.w};
    int lo = 0, hi = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        lo = dot4_x16((w[i] & 0x0F0F0F0Fu) | high(i, 0), xl[2 * i], xl[2 * i + 1], lo);
        hi = dot4_x16(((w[i] >> 4) & 0x0F0F0F0Fu) | high(i, 1), xh[2 * i], xh[2 * i + 1], hi);
    }
    return make_int2(lo, hi);
}

/* The chunk's 32 weights as fp32: weight j (of the row's order) is scale(j < 16) * q_j + offset(j < 16),
 * one rounding (each product is exact: quant.c), as gguf's dequantizer computes it. */
template <typename H, typename S>
__device__ __forceinline__ void nibbles_to_f32(uint4 q, float k, H high, S scale_offset, float f[32]) {
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
    const float2 a = scale_offset(0), b = scale_offset(1);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float4 lo = nibbles(w[i], i, 0, k, high), hi = nibbles(w[i], i, 1, k, high);
        const float l[4] = {lo.x, lo.y, lo.z, lo.w}, h[4] = {hi.x, hi.y, hi.z, hi.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            f[4 * i + j] = __fmaf_rn(a.x, l[j], a.y);
            f[16 + 4 * i + j] = __fmaf_rn(b.x, h[j], b.y);
        }
    }
}

/* no bits above the nibbles */
struct no_high {
    __device__ __forceinline__ uint32_t operator()(int, int) const { return 0; }
};

/* GGUF's 4-bit formats with blocks of 32 (Q4_0: fp16 d, w = d * (q - 8); Q4_1: fp16 d and m,
 * w = d * q + m; q the nibbles, byte j holding weight j in its low nibble and j + 16 in its high),
 * repacked on upload as w_q8_0 is: the nibbles (rows, K / 2) and the scales (rows, K / 32: d, or
 * d and m as a half2) apart. A chunk is a whole block: 16 bytes of nibbles, 32 weights, and its
 * scales (0.5625 / 0.625 bytes a weight). The weights come out as gguf computes them: d times the
 * integer, plus m, in fp32 (each product exact: quant.c). The dot product sums q * x over the block
 * and scales it once: d * sum(q x) - 8 d * sum(x) (Q4_0, folded as sum((q - 8) x)), or
 * d * sum(q x) + m * sum(x) (Q4_1). K a multiple of 32. */
template <bool MIN>
struct w_q4 {
    static constexpr bool DENSE16 = false;
    static constexpr bool XQ = true;
    static constexpr int IN_FLIGHT = 4;
    static constexpr bool BF16 = false;
    static constexpr int VALS = 32;
    static constexpr int BLOCK = 32;
    using scale_t = std::conditional_t<MIN, uint32_t, unsigned short>; /* d, or (d, m) */
    static constexpr int SCALE_BYTES = sizeof(scale_t), VALUE_BYTES = 16; /* of a block; GGUF's block is the two in that order */
    static constexpr int BLOCK_BYTES = SCALE_BYTES + VALUE_BYTES;
    __device__ static void repack(const uint8_t *in, uint8_t *dst, size_t b, size_t blocks) {
        split_block<SCALE_BYTES, VALUE_BYTES>(in, dst, b, blocks);
    }
    struct mat {
        const uint8_t *q;
        const scale_t *d;
    };
    /* the matrix of rows (K) repacked at p: values, then scales */
    static mat at(const void *p, size_t rows, int K) {
        return {static_cast<const uint8_t *>(p), reinterpret_cast<const scale_t *>(static_cast<const uint8_t *>(p) + rows * (K / BLOCK) * VALUE_BYTES)};
    }
    struct row_t {
        const uint4 *q;
        const scale_t *d;
    };
    struct chunk {
        uint4 q;
        scale_t d;
    };
    __host__ __device__ __forceinline__ static row_t row(mat m, int r, int K) {
        return {reinterpret_cast<const uint4 *>(m.q + (size_t)r * (K / 2)), m.d + (size_t)r * (K / BLOCK)};
    }
    __device__ __forceinline__ static chunk load(row_t row, int c) { return {ld_stream(row.q + c), __ldcs(row.d + c)}; }
    __device__ __forceinline__ static float2 scales(scale_t d) {
        if constexpr (MIN)
            return __half22float2(*reinterpret_cast<const __half2 *>(&d));
        else
            return make_float2(__half2float(__ushort_as_half(d)), -0.0f); /* d * q + -0 is d * q, its zero's sign kept */
    }
    __device__ __forceinline__ static void to_f32(chunk u, float f[VALS]) {
        const float2 dm = scales(u.d);
        nibbles_to_f32(u.q, MIN ? 0.0f : 8.0f, no_high{}, [dm](int) { return dm; }, f);
    }
    /* d dx sum((q - 8) x16) (Q4_0), or d dx sum(q x16) + m dx sum(x16) (Q4_1): each sum exact */
    __device__ __forceinline__ static float dot(chunk u, xq_chunk<VALS> x) {
        const int2 s = nibble_sums(u.q, no_high{}, x);
        const uint4 m = x.meta();
        const float dx = __uint_as_float(m.x);
        const int sx = (int)(m.y + m.z);
        const float2 dm = scales(u.d);
        if constexpr (MIN)
            return (dm.x * dx) * (float)(s.x + s.y) + (dm.y * dx) * (float)sx;
        else
            return (dm.x * dx) * (float)(s.x + s.y - 8 * sx);
    }
    __device__ __forceinline__ static uint32_t word(chunk u) { return u.q.x; }
};
using w_q4_0 = w_q4<false>;
using w_q4_1 = w_q4<true>;

/* GGUF's K formats: super-blocks of 256 weights, 8 sub-blocks of 32 (quant.h's layouts):
 *   Q4_K, Q5_K  w = (d sc) q - (dmin m): q of 4 or 5 bits; a 6-bit scale sc and minimum m a
 *               sub-block, packed in 12 bytes behind the fp16 d and dmin (a 16-byte header)
 *   Q6_K        w = (d sc) (q - 32): q of 6 bits; an int8 scale sc per 16 weights, fp16 d
 * Repacked on upload into the same bytes, rearranged so that a chunk is one sub-block of 32 weights
 * laid out as w_q4's: 16 bytes of low nibbles (byte i: weight i, weight i + 16), then the bits
 * above them in one word (Q5_K) or two (Q6_K) placed for a shift and a mask (repack below), and the
 * scales: Q4_K and Q5_K's header, which the 8 lanes of a super-block load together, or Q6_K's two
 * int8 scales and d. The weights come out as gguf's dequantizer computes them ((d sc) exact, one
 * rounding of its product with q and the minimum); the dot product scales each sub-block's sum once.
 * K a multiple of 256. A matrix of S sub-blocks (rows K / 32), repacked at p:
 *   Q4_K  nibbles (16 S), headers (2 S)
 *   Q5_K  nibbles (16 S), high bits (4 S), headers (2 S)
 *   Q6_K  nibbles (16 S), high bits (8 S), scales (2 S), d (S / 4) */
template <int F>
struct w_qk {
    static constexpr bool DENSE16 = false;
    static constexpr bool XQ = true;
    static constexpr int IN_FLIGHT = F == QUANT_Q6_K ? 4 : 2;
    static constexpr bool BF16 = false;
    static constexpr int VALS = 32;
    static constexpr int BLOCK = QUANT_K;
    static constexpr bool Q6 = F == QUANT_Q6_K;
    static constexpr int HIGH_BYTES = F == QUANT_Q4_K ? 0 : F == QUANT_Q5_K ? 4 : 8; /* of a chunk */
    static constexpr int BLOCK_BYTES = F == QUANT_Q4_K ? 144 : F == QUANT_Q5_K ? 176 : 210;
    static_assert(F == QUANT_Q4_K || F == QUANT_Q5_K || F == QUANT_Q6_K, "a K format");
    using high_t = std::conditional_t<Q6, uint2, uint32_t>;
    using scale_t = std::conditional_t<Q6, unsigned short, uint4>; /* a chunk's: Q6_K's two int8, else its super-block's header */
    struct mat {
        const uint4 *q;
        const high_t *qh;
        const scale_t *sc;
        const unsigned short *d; /* Q6_K */
    };
    static mat at(const void *p, size_t rows, int K) {
        const size_t chunks = rows * (size_t)(K / VALS);
        const uint8_t *b = static_cast<const uint8_t *>(p), *qh = b + 16 * chunks, *sc = qh + HIGH_BYTES * chunks;
        return {reinterpret_cast<const uint4 *>(b), reinterpret_cast<const high_t *>(qh), reinterpret_cast<const scale_t *>(sc),
                reinterpret_cast<const unsigned short *>(sc + 2 * chunks)};
    }
    using row_t = mat;
    struct chunk {
        uint4 q;
        high_t qh;
        scale_t sc;
        unsigned short d;
        int j; /* the sub-block within its super-block */
    };
    __host__ __device__ __forceinline__ static row_t row(mat m, int r, int K) {
        const size_t c = (size_t)r * (K / VALS);
        return {m.q + c, HIGH_BYTES ? m.qh + c : m.qh, m.sc + (Q6 ? c : c / 8), m.d + c / 8};
    }
    __device__ __forceinline__ static chunk load(row_t row, int c) {
        chunk u;
        u.q = ld_stream(row.q + c);
        if constexpr (HIGH_BYTES == 4) u.qh = __ldcs(row.qh + c);
        else if constexpr (HIGH_BYTES == 8) u.qh = __ldcs(row.qh + c);
        else u.qh = 0;
        if constexpr (Q6) {
            u.sc = __ldcs(row.sc + c);
            u.d = __ldcs(row.d + c / 8);
        } else {
            u.sc = __ldcs(row.sc + c / 8);
            u.d = 0;
        }
        u.j = c & 7;
        return u;
    }
    /* the bits above word i's nibbles (half 0: weights 4i.., 1: 16 + 4i..), at bit 4 of each byte */
    struct high {
        high_t h;
        __device__ __forceinline__ uint32_t operator()(int i, int half) const {
            if constexpr (F == QUANT_Q4_K) return 0;
            else if constexpr (F == QUANT_Q5_K) return ((h >> (4 * half + i)) & 0x01010101u) << 4;
            else return (((half ? h.y : h.x) >> (2 * i)) & 0x03030303u) << 4;
        }
    };
    /* (d sc, -(dmin m)) of Q4_K / Q5_K's sub-block j, from its super-block's header: sc_j and m_j
     * are the low 6 bits of bytes j and 4 + j for j < 4; for j = 4 + k, the nibbles of byte 8 + k
     * below the top 2 bits of bytes k and 4 + k */
    __device__ __forceinline__ static float2 scale_min(uint4 h, int j) {
        const float2 dm = __half22float2(*reinterpret_cast<const __half2 *>(&h.x));
        const int s = 8 * (j & 3);
        const uint32_t a = (h.y >> s) & 0xFFu, b = (h.z >> s) & 0xFFu, e = (h.w >> s) & 0xFFu;
        const uint32_t sc = j < 4 ? a & 63u : (e & 15u) | (a >> 6) << 4, m = j < 4 ? b & 63u : (e >> 4) | (b >> 6) << 4;
        return make_float2(dm.x * (float)sc, -(dm.y * (float)m));
    }
    /* d sc of Q6_K's half h of a chunk (its 16 weights' int8 scale) */
    __device__ __forceinline__ static float scale6(chunk u, int h) {
        return __half2float(__ushort_as_half(u.d)) * (float)(int8_t)(u.sc >> (8 * h));
    }
    __device__ __forceinline__ static void to_f32(chunk u, float f[VALS]) {
        if constexpr (Q6)
            nibbles_to_f32(u.q, 32.0f, high{u.qh}, [u](int h) { return make_float2(scale6(u, h), -0.0f); }, f);
        else {
            const float2 sm = scale_min(u.sc, u.j);
            nibbles_to_f32(u.q, 0.0f, high{u.qh}, [sm](int) { return sm; }, f);
        }
    }
    /* Q6_K: dx ((d sc_lo) sum_lo((q - 32) x16) + (d sc_hi) sum_hi((q - 32) x16)); Q4_K, Q5_K:
     * (d sc) dx sum(q x16) - (dmin m) dx sum(x16); each sum exact */
    __device__ __forceinline__ static float dot(chunk u, xq_chunk<VALS> x) {
        const int2 s = nibble_sums(u.q, high{u.qh}, x);
        const uint4 m = x.meta();
        const float dx = __uint_as_float(m.x);
        if constexpr (Q6) {
            return dx * (scale6(u, 0) * (float)(s.x - 32 * (int)m.y) + scale6(u, 1) * (float)(s.y - 32 * (int)m.z));
        } else {
            const float2 sm = scale_min(u.sc, u.j);
            return (sm.x * dx) * (float)(s.x + s.y) + (sm.y * dx) * (float)(int)(m.y + m.z);
        }
    }
    __device__ __forceinline__ static uint32_t word(chunk u) { return u.q.x; }

    /* GGUF's super-block b (of blocks) at in, into the layout above at dst. Sub-block s's weight l
     * (of 32): Q4_K / Q5_K: the nibble (s odd: high) of byte 32 (s / 2) + l of qs, Q5_K's fifth bit
     * bit s of qh[l]; Q6_K (s = 4 n + g): the nibble (g >= 2: high) of ql[64 n + 32 (g & 1) + l], its
     * two bits above at bit 2 g of qh[32 n + l]. Rearranged: the nibble bytes as w_q4's; the bits
     * above weight 4 i + b (i < 4, b < 4) at bit i (Q5_K) or 2 i (Q6_K, in the first word) of byte
     * b, those above weight 16 + 4 i + b at bit 4 + i (Q5_K) or 2 i of the second word (Q6_K). */
    __device__ static void repack(const uint8_t *in, uint8_t *dst, size_t b, size_t blocks) {
        const size_t chunks = 8 * blocks;
        uint8_t *q = dst, *qh = q + 16 * chunks, *sc = qh + HIGH_BYTES * chunks, *d = sc + 2 * chunks;
        const uint8_t *qs = in + (F == QUANT_Q4_K ? 16 : F == QUANT_Q5_K ? 48 : 0), *hb = in + (Q6 ? 128 : 16);
        for (int s = 0; s < 8; s++) {
            uint8_t lo[32], hi[32];
            for (int l = 0; l < 32; l++) {
                if constexpr (Q6) {
                    const int n = s / 4, g = s % 4;
                    lo[l] = (qs[64 * n + 32 * (g & 1) + l] >> (4 * (g >> 1))) & 15;
                    hi[l] = (hb[32 * n + l] >> (2 * g)) & 3;
                } else {
                    lo[l] = (qs[32 * (s / 2) + l] >> (4 * (s & 1))) & 15;
                    hi[l] = F == QUANT_Q5_K ? (hb[l] >> s) & 1 : 0;
                }
            }
            const size_t c = 8 * b + s;
            for (int i = 0; i < 16; i++) q[16 * c + i] = lo[i] | lo[i + 16] << 4;
            uint8_t h[8] = {0};
            for (int i = 0; i < 4; i++)
                for (int k = 0; k < 4; k++) {
                    if constexpr (Q6) {
                        h[k] |= hi[4 * i + k] << (2 * i);
                        h[4 + k] |= hi[16 + 4 * i + k] << (2 * i);
                    } else {
                        h[k] |= hi[4 * i + k] << i | hi[16 + 4 * i + k] << (4 + i);
                    }
                }
            for (int i = 0; i < HIGH_BYTES; i++) qh[HIGH_BYTES * c + i] = h[i];
        }
        if constexpr (Q6) {
            for (int i = 0; i < 16; i++) sc[16 * b + i] = in[192 + i];
            d[2 * b] = in[208];
            d[2 * b + 1] = in[209];
        } else
            for (int i = 0; i < 16; i++) sc[16 * b + i] = in[i];
    }
};
using w_q4_k = w_qk<QUANT_Q4_K>;
using w_q5_k = w_qk<QUANT_Q5_K>;
using w_q6_k = w_qk<QUANT_Q6_K>;

/* Any of the K formats, chosen per matrix at run time: the kernel of a field whose layers differ,
 * or of q, k and v in different formats (llama.cpp's Q4_K_M keeps v_proj and down_proj in Q6_K in
 * some layers, Q4_K in the others). Each matrix holds its format; a chunk branches on it, the same
 * way in every lane of a warp (a warp's row is of one matrix), to w_qk's code. A chunk holds the
 * largest of the three's fields. */
struct w_kany {
    static constexpr bool DENSE16 = false;
    static constexpr bool XQ = true;
    static constexpr int IN_FLIGHT = 2; /* w_qk's */
    static constexpr bool BF16 = false;
    static constexpr int VALS = 32;
    static constexpr int BLOCK = QUANT_K;
    struct mat {
        const uint8_t *q, *qh, *sc, *d; /* w_qk<f>::mat's, untyped */
        int f;
    };
    template <int F>
    static mat of(typename w_qk<F>::mat m) {
        return {reinterpret_cast<const uint8_t *>(m.q), reinterpret_cast<const uint8_t *>(m.qh), reinterpret_cast<const uint8_t *>(m.sc),
                reinterpret_cast<const uint8_t *>(m.d), F};
    }
    /* the matrix of rows (K) of format f repacked at p */
    static mat at(const void *p, size_t rows, int K, int f) {
        return f == QUANT_Q4_K ? of<QUANT_Q4_K>(w_q4_k::at(p, rows, K))
             : f == QUANT_Q5_K ? of<QUANT_Q5_K>(w_q5_k::at(p, rows, K))
                               : of<QUANT_Q6_K>(w_q6_k::at(p, rows, K));
    }
    using row_t = mat;
    struct chunk {
        uint4 q;
        uint2 qh;
        uint4 sc;
        unsigned short d;
        int j, f;
    };
    template <int F>
    __host__ __device__ __forceinline__ static typename w_qk<F>::mat typed(mat m) {
        using T = w_qk<F>;
        return {reinterpret_cast<const uint4 *>(m.q), reinterpret_cast<const typename T::high_t *>(m.qh),
                reinterpret_cast<const typename T::scale_t *>(m.sc), reinterpret_cast<const unsigned short *>(m.d)};
    }
    __host__ __device__ __forceinline__ static row_t row(mat m, int r, int K) {
        return m.f == QUANT_Q4_K ? of_row<QUANT_Q4_K>(m, r, K) : m.f == QUANT_Q5_K ? of_row<QUANT_Q5_K>(m, r, K) : of_row<QUANT_Q6_K>(m, r, K);
    }
    template <int F>
    __host__ __device__ __forceinline__ static row_t of_row(mat m, int r, int K) {
        const typename w_qk<F>::mat t = w_qk<F>::row(typed<F>(m), r, K);
        return {reinterpret_cast<const uint8_t *>(t.q), reinterpret_cast<const uint8_t *>(t.qh), reinterpret_cast<const uint8_t *>(t.sc),
                reinterpret_cast<const uint8_t *>(t.d), F};
    }
    template <int F>
    __device__ __forceinline__ static chunk load_as(row_t row, int c) {
        const typename w_qk<F>::chunk u = w_qk<F>::load(typed<F>(row), c);
        chunk k;
        k.q = u.q;
        if constexpr (F == QUANT_Q6_K) {
            k.qh = u.qh;
            k.sc = make_uint4(u.sc, 0, 0, 0);
        } else {
            k.qh = make_uint2(u.qh, 0);
            k.sc = u.sc;
        }
        k.d = u.d;
        k.j = u.j;
        k.f = F;
        return k;
    }
    __device__ __forceinline__ static chunk load(row_t row, int c) {
        return row.f == QUANT_Q4_K ? load_as<QUANT_Q4_K>(row, c) : row.f == QUANT_Q5_K ? load_as<QUANT_Q5_K>(row, c) : load_as<QUANT_Q6_K>(row, c);
    }
    template <int F>
    __device__ __forceinline__ static typename w_qk<F>::chunk as(chunk k) {
        typename w_qk<F>::chunk u;
        u.q = k.q;
        if constexpr (F == QUANT_Q6_K) {
            u.qh = k.qh;
            u.sc = (unsigned short)k.sc.x;
        } else {
            u.qh = k.qh.x;
            u.sc = k.sc;
        }
        u.d = k.d;
        u.j = k.j;
        return u;
    }
    __device__ __forceinline__ static void to_f32(chunk k, float f[VALS]) {
        if (k.f == QUANT_Q4_K) w_q4_k::to_f32(as<QUANT_Q4_K>(k), f);
        else if (k.f == QUANT_Q5_K) w_q5_k::to_f32(as<QUANT_Q5_K>(k), f);
        else w_q6_k::to_f32(as<QUANT_Q6_K>(k), f);
    }
    __device__ __forceinline__ static float dot(chunk k, xq_chunk<VALS> x) {
        return k.f == QUANT_Q4_K ? w_q4_k::dot(as<QUANT_Q4_K>(k), x)
             : k.f == QUANT_Q5_K ? w_q5_k::dot(as<QUANT_Q5_K>(k), x)
                                 : w_q6_k::dot(as<QUANT_Q6_K>(k), x);
    }
    __device__ __forceinline__ static uint32_t word(chunk k) { return k.q.x; }
};

/* The matrix at p of rows (K) in format f (GGUF type) as format W takes it: w_kany holds the format */
template <typename W>
typename W::mat format_at(const void *p, size_t rows, int K, int f) {
    if constexpr (std::is_same_v<W, w_kany>)
        return W::at(p, rows, K, f);
    else
        return W::at(p, rows, K);
}
constexpr bool format_k(int f) { return f == QUANT_Q4_K || f == QUANT_Q5_K || f == QUANT_Q6_K; }

/* The model's dense dtype as a format: its vectors' and its unquantized matrices'. */
using model_w = std::conditional_t<GPU_W_BF16, w_bf16, w_f16>;

/* The format of a matrix stored as GGUF type F (model_config.h's MODEL_FORMAT_*): a dense matrix
 * is in the model's dtype; format_on_gpu says which types have kernels (the others are refused by
 * model_cuda_init and map to model_w only so that the code compiles). */
template <int F> struct format_type { using type = model_w; };
template <> struct format_type<QUANT_Q8_0> { using type = w_q8_0; };
template <> struct format_type<QUANT_Q4_0> { using type = w_q4_0; };
template <> struct format_type<QUANT_Q4_1> { using type = w_q4_1; };
template <> struct format_type<QUANT_Q4_K> { using type = w_q4_k; };
template <> struct format_type<QUANT_Q5_K> { using type = w_q5_k; };
template <> struct format_type<QUANT_Q6_K> { using type = w_q6_k; };
template <int F> using format_w = typename format_type<F>::type;

/* A dense matrix of a quantized model as the prompt's GEMMs read it: its tiles converted to fp16 as
 * a block format's are (prefill_gemm_body's gemm_q_tiles), since the GEMMs' inputs are fp16 there */
template <typename W>
struct w_as_f16 : W {
    static_assert(W::DENSE16, "w_as_f16: a dense 16-bit format");
    static constexpr bool DENSE16 = false;
    static constexpr bool BF16 = false;
};
constexpr bool format_on_gpu(int f) {
    return f == QUANT_F16 || f == QUANT_BF16 || f == QUANT_Q8_0 || f == QUANT_Q4_0 || f == QUANT_Q4_1 || f == QUANT_Q4_K ||
           f == QUANT_Q5_K || f == QUANT_Q6_K;
}

/* GGUF's blocks of format W (bytes of them at src, as the file holds them) to the layout W's cores
 * read (W::at), at dst: the upload's last step, and the format test's. */
template <typename W>
__global__ void repack_kernel(const uint8_t *src, uint8_t *dst, size_t blocks) {
    for (size_t b = blockIdx.x * (size_t)blockDim.x + threadIdx.x; b < blocks; b += (size_t)gridDim.x * blockDim.x)
        W::repack(src + b * W::BLOCK_BYTES, dst, b, blocks);
}
template <typename W>
inline cudaError_t repack(const uint8_t *src, uint8_t *dst, size_t bytes, cudaStream_t stream) {
    const size_t blocks = bytes / W::BLOCK_BYTES;
    repack_kernel<W><<<(unsigned)std::min<size_t>((blocks + 255) / 256, 65535), 256, 0, stream>>>(src, dst, blocks);
    return cudaGetLastError();
}
/* repack for the format of GGUF type f (one of format_on_gpu's block formats) */
inline cudaError_t repack_format(int f, const uint8_t *src, uint8_t *dst, size_t bytes, cudaStream_t stream) {
    switch (f) {
    case QUANT_Q8_0: return repack<w_q8_0>(src, dst, bytes, stream);
    case QUANT_Q4_0: return repack<w_q4_0>(src, dst, bytes, stream);
    case QUANT_Q4_1: return repack<w_q4_1>(src, dst, bytes, stream);
    case QUANT_Q4_K: return repack<w_q4_k>(src, dst, bytes, stream);
    case QUANT_Q5_K: return repack<w_q5_k>(src, dst, bytes, stream);
    case QUANT_Q6_K: return repack<w_q6_k>(src, dst, bytes, stream);
    default: return cudaErrorInvalidValue;
    }
}

/* One value of the model's 16-bit dtype (vectors: norm weights, biases, embedding rows), to fp32 */
__device__ __forceinline__ float w_to_f32(uint16_t u) {
#if GPU_W_BF16
    return __uint_as_float((uint32_t)u << 16);
#else
    return __half2float(__ushort_as_half(u));
#endif
}

#endif /* INGOT_CUDA_WEIGHTS_CUH */
