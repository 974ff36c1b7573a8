/* quant.h - GGUF's weight block formats: their sizes, a row's bytes, a scalar dequantizer and the
 * dot product of a quantized row with an fp32 vector (the CPU matvec's inner kernel).
 *
 * The layouts are ggml's, byte for byte (block_q8_0, block_q4_0, ... in ggml-common.h), so a GGUF
 * tensor's bytes are used as they lie in the file: a row of n weights is n / block blocks of
 * `bytes` bytes each, little-endian, unaligned. Types are GGUF's ggml_type ids.
 *
 *   type  id  block  bytes  one block
 *   F32    0      1      4  float
 *   F16    1      1      2  IEEE half
 *   Q4_0   2     32     18  fp16 d; qs[16]: w = d * (nibble - 8); low nibbles elements 0..15, high 16..31
 *   Q4_1   3     32     20  fp16 d, m; qs[16]: w = d * nibble + m
 *   Q8_0   8     32     34  fp16 d; int8 qs[32]: w = d * q
 *   Q4_K  12    256    144  fp16 d, dmin; scales[12] (8 x 6-bit scale and min); qs[128]:
 *                           sub-block s of 32: w = (d * sc[s]) * nibble - dmin * m[s]
 *   Q5_K  13    256    176  as Q4_K plus qh[32], the 5th bit: qs[32], then 16 * bit s of qh[l]
 *   Q6_K  14    256    210  ql[128], qh[64], int8 scales[16], fp16 d: w = (d * sc[i / 16]) * (q - 32)
 *   BF16  30      1      2  bfloat16
 *
 * The dequantizer rounds exactly as the `gguf` package's NumPy dequantizer (and ggml's C) does, so
 * its floats are the same bits (tests/test_quant.py). The block formats' dot products take the input
 * quantized to 16-bit integers (below); their tolerance against an exact fp32 sum is in
 * tests/test_quant.py. Which SIMD path quant_dot takes is fixed at compile time by -march:
 * AVX-512 (F + BW; with VNNI where the target has it), else AVX2 + FMA + F16C, else the scalar
 * twin. */
#ifndef INGOT_QUANT_H
#define INGOT_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "errors.h"

/* GGUF's ggml_type ids of the formats this file knows. */
typedef enum {
    QUANT_F32 = 0,
    QUANT_F16 = 1,
    QUANT_Q4_0 = 2,
    QUANT_Q4_1 = 3,
    QUANT_Q8_0 = 8,
    QUANT_Q4_K = 12,
    QUANT_Q5_K = 13,
    QUANT_Q6_K = 14,
    QUANT_BF16 = 30,
    /* Not a format: a matrix field whose layers differ (llama.cpp's Q4_K_M keeps some layers'
     * v_proj and down_proj in Q6_K, the rest in Q4_K), as model_config.h's MODEL_FORMAT_* gives it;
     * MODEL_FORMAT_*_AT(l) then names each layer's. Negative, so no ggml_type id (GGUF stores them
     * unsigned, numbered from 0) is ever taken for it; quant_format_of and quant_type_name know no
     * such type. */
    QUANT_MIXED = -1,
} quant_type;

/* Weights per super-block of the K formats (ggml's QK_K). */
#define QUANT_K 256

typedef struct {
    const char *name; /* GGUF's name: "Q4_K" */
    int block;        /* weights per block */
    int bytes;        /* bytes per block */
} quant_format;

#ifdef __cplusplus
extern "C" {
#endif

/* The bytes of a row of n weights of type (a type of the table, n a multiple of its block): the
 * table's sizes as a switch, so that a constant type folds to a constant (the CPU forward's row
 * strides); quant_row_bytes is the checked form. */
static inline size_t quant_row_size(int type, size_t n) {
    switch (type) {
    case QUANT_F32: return 4 * n;
    case QUANT_F16: case QUANT_BF16: return 2 * n;
    case QUANT_Q4_0: return n / 32 * 18;
    case QUANT_Q4_1: return n / 32 * 20;
    case QUANT_Q8_0: return n / 32 * 34;
    case QUANT_Q4_K: return n / QUANT_K * 144;
    case QUANT_Q5_K: return n / QUANT_K * 176;
    case QUANT_Q6_K: return n / QUANT_K * 210;
    }
    return 0;
}

/* The format of a GGUF type id, or NULL when this file does not implement it. */
const quant_format *quant_format_of(int type);

/* GGUF's name for any ggml_type id it defines ("Q5_0", "IQ2_XXS"), implemented or not, for
 * messages; NULL for an id GGUF does not define. */
const char *quant_type_name(int type);

/* *bytes = the bytes of a row of n weights of type. ERR_QUANT (with the detail naming the type and
 * n) for a type not implemented here, n <= 0, or n not a multiple of the block. */
err_code quant_row_bytes(int type, int64_t n, size_t *bytes);

/* The first of the blocks of type (a block format; bytes of them at blocks) whose fp16 scale or
 * minimum is NaN (*is_nan 1) or infinite, or the count of blocks: --check-weights' scan of a
 * quantized matrix, whose integers are all valid. */
size_t quant_first_nonfinite_block(int type, const void *blocks, size_t bytes, int *is_nan);

/* y[0..n) = the weights of row (n weights of type), in fp32, bit for bit as the gguf package's
 * dequantizer. n must have passed quant_row_bytes: the hot path has no error checks. */
void quant_dequantize_row(int type, const void *row, float *y, int n);

/* The dot products of a row of a block format with an input vector x (n), on x quantized to 16 bits
 * (issue 59; the GPU takes the same inputs): each block of 32 consecutive inputs x[32 b .. 32 b + 32)
 * becomes 32 integers x16 and one fp32 scale dx,
 *   amax = max |x_i| (NaN if any x_i is NaN);
 *   amax NaN or infinite: dx = NaN, x16 = 0 (the product is NaN, as an fp32 sum's would be);
 *   amax < 2^-100 (0 included): dx = 0, x16 = 0;
 *   else inv = 32767 / amax and dx = amax / 32767 (fp32 divisions), x16_i = x_i * inv rounded
 *   (the exact product) to the nearest integer, ties to even; |x16_i| <= 32767.
 * Each block's product with the row's integer weights q is then exact in int32 (|q| <= 127, 32
 * terms), scaled once: c * dx * I for the block's scale c and I = sum q x16 (Q4_0's q - 8, Q6_K's
 * q - 32, each 16 of Q6_K with its own scale), plus the offset o (Q4_1's m, the K formats' -dmin *
 * min) times dx * S, S = sum of the block's x16. The order of those fp32 operations is quant.c's
 * (block_terms), the same on every path. Against fp32 inputs this adds an error of at most
 * sum_i |w_i| dx_b(i) / 2 (about 2e-5 of the sum's size for activations of a normal spread).
 *
 * quant_dot_ref: the scalar twin from fp32 x (dense types: each weight in fp32 times x, summed in
 * order). quant_dot: the fastest path this build has (quant_dot_isa names it), the input quantized
 * inside. Dense types keep x in fp32 (cpu_kernels.h's dot_f32, dot_f16, dot_bf16). */
float quant_dot_ref(int type, const void *row, const float *x, int n);
float quant_dot(int type, const void *row, const float *x, int n);

/* o[t] = quant_dot(type, row, x + t xs, n) for four tokens' inputs, bit for bit, the row's blocks
 * unpacked once for the four (a prompt batch's matrix products). */
void quant_dot_x4(int type, const void *row, const float *x, size_t xs, int n, float o[4]);

/* Bytes of one input of n (a multiple of 32) quantized: x16 of n / 32 blocks rounded up to a
 * multiple of 8 (the rest zeros), each block's dx and dx * S, and x16 again as two bytes a value
 * with two integer sums a block (quant.c); a multiple of 64. */
#define QUANT_INPUT_BYTES(n) ((size_t)(((n) / 32 + 7) / 8) * 1152)

/* xq (QUANT_INPUT_BYTES(n), 64-byte aligned for speed) = x (n) quantized as above: what a matrix
 * product computes once per input vector and every row's product reads. */
void quant_input(const float *x, int n, void *xq);

/* quant_dot and quant_dot_x4 (type a block format) with the input quantized already (quant_input;
 * token t's at xq + t xqs bytes): the same bits, without quantizing again for every row. */
float quant_dot_q(int type, const void *row, const void *xq, int n);
void quant_dot_x4_q(int type, const void *row, const void *xq, size_t xqs, int n, float o[4]);

/* "avx512vnni", "avx512", "avx2" or "scalar": the path quant_dot was compiled with. */
const char *quant_dot_isa(void);

#ifdef __cplusplus
}
#endif

#endif
