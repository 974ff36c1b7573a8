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
 *   W::load(row, c)        chunk c of a row, streamed past L1 (each weight is read once a step)
 *   W::to_f32(chunk, f)    its VALS weights as fp32, in the order of the row
 *   W::dot(chunk, x)       its weights dotted with their VALS inputs, fp32 (x(p): the p-th float4
 *                          of them, p < VALS / 4, loaded when the format asks): the matvec core's
 *                          inner product, where a format folds its scale in once a chunk
 *   W::word(chunk)         one 32-bit word of it (load_lots' exit test reads the lot's data)
 *   W::BF16                the tensor cores' input type of the prompt's GEMMs (bf16, else fp16):
 *                          the GEMM cores take dense 16-bit formats only (W::DENSE16); a quantized
 *                          format reaches them as tiles dequantized to one of these.
 *
 * The matvec's staged input is laid out for the chunk (stage_input, sx_group): chunk c's VALS
 * inputs are the float4s c, K / VALS + c, ... (VALS / 4 planes), so that a warp's lanes read
 * consecutive float4s of each plane, no two lanes of a quarter-warp in one bank.
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

__device__ __forceinline__ float dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }

/* GGUF's Q8_0 (blocks of 32 int8 values q and an fp16 scale d; a weight is d * q in fp32, as
 * gguf's dequantizer and ggml compute it), repacked on upload for 16-byte loads: a matrix's values
 * as int8 (rows, K) and its scales as fp16 (rows, K / 32), apart. A chunk is half a block: 16
 * values and their block's scale, which two lanes read (1.0625 bytes a weight). K a multiple of 32. */
struct w_q8_0 {
    static constexpr bool DENSE16 = false;
    static constexpr bool BF16 = false;
    static constexpr int VALS = 16;
    static constexpr int BLOCK = 32;
    static constexpr int SCALE_BYTES = 2, VALUE_BYTES = 32; /* of a block; GGUF's block is the two in that order */
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
    /* sum_i q_i x_i in fp32, then times d once: q_i as fp32 by bytes_to_f32 (q_i + 128, flipped
     * into the byte's unsigned range, minus 128) */
    template <typename X>
    __device__ __forceinline__ static float dot(chunk u, X x) {
        const uint32_t w[4] = {u.q.x ^ 0x80808080u, u.q.y ^ 0x80808080u, u.q.z ^ 0x80808080u, u.q.w ^ 0x80808080u};
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) s += dot4(bytes_to_f32(w[i], 128.0f), x(i));
        return __half2float(__ushort_as_half(u.d)) * s;
    }
    __device__ __forceinline__ static uint32_t word(chunk u) { return u.q.x; }
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
    static constexpr bool BF16 = false;
    static constexpr int VALS = 32;
    static constexpr int BLOCK = 32;
    using scale_t = std::conditional_t<MIN, uint32_t, unsigned short>; /* d, or (d, m) */
    static constexpr int SCALE_BYTES = sizeof(scale_t), VALUE_BYTES = 16; /* of a block; GGUF's block is the two in that order */
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
            return make_float2(__half2float(__ushort_as_half(d)), 0.0f);
    }
    __device__ __forceinline__ static void to_f32(chunk u, float f[VALS]) {
        const float2 dm = scales(u.d);
        const uint32_t w[4] = {u.q.x, u.q.y, u.q.z, u.q.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float4 lo = bytes_to_f32(w[i] & 0x0F0F0F0Fu, MIN ? 0.0f : 8.0f), hi = bytes_to_f32((w[i] >> 4) & 0x0F0F0F0Fu, MIN ? 0.0f : 8.0f);
            const float l[4] = {lo.x, lo.y, lo.z, lo.w}, h[4] = {hi.x, hi.y, hi.z, hi.w};
#pragma unroll
            for (int b = 0; b < 4; b++) {
                f[4 * i + b] = MIN ? __fmaf_rn(dm.x, l[b], dm.y) : dm.x * l[b];
                f[16 + 4 * i + b] = MIN ? __fmaf_rn(dm.x, h[b], dm.y) : dm.x * h[b];
            }
        }
    }
    template <typename X>
    __device__ __forceinline__ static float dot(chunk u, X x) {
        const uint32_t w[4] = {u.q.x, u.q.y, u.q.z, u.q.w};
        float s = 0.0f, sx = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float4 xl = x(i), xh = x(4 + i);
            s += dot4(bytes_to_f32(w[i] & 0x0F0F0F0Fu, MIN ? 0.0f : 8.0f), xl);
            s += dot4(bytes_to_f32((w[i] >> 4) & 0x0F0F0F0Fu, MIN ? 0.0f : 8.0f), xh);
            if constexpr (MIN) sx += (xl.x + xl.y) + (xl.z + xl.w) + (xh.x + xh.y) + (xh.z + xh.w);
        }
        const float2 dm = scales(u.d);
        return MIN ? dm.x * s + dm.y * sx : dm.x * s;
    }
    __device__ __forceinline__ static uint32_t word(chunk u) { return u.q.x; }
};
using w_q4_0 = w_q4<false>;
using w_q4_1 = w_q4<true>;

/* The model's dense dtype as a format: its vectors' and its unquantized matrices'. */
using model_w = std::conditional_t<GPU_W_BF16, w_bf16, w_f16>;

/* The format of a matrix stored as GGUF type F (model_config.h's MODEL_FORMAT_*): a dense matrix
 * is in the model's dtype; format_on_gpu says which types have kernels (the others are refused by
 * model_cuda_init and map to model_w only so that the code compiles). */
template <int F> struct format_type { using type = model_w; };
template <> struct format_type<QUANT_Q8_0> { using type = w_q8_0; };
template <> struct format_type<QUANT_Q4_0> { using type = w_q4_0; };
template <> struct format_type<QUANT_Q4_1> { using type = w_q4_1; };
template <int F> using format_w = typename format_type<F>::type;
constexpr bool format_on_gpu(int f) {
    return f == QUANT_F16 || f == QUANT_BF16 || f == QUANT_Q8_0 || f == QUANT_Q4_0 || f == QUANT_Q4_1;
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
