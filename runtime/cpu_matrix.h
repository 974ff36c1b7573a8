/* cpu_matrix.h - the CPU forward's view of a weight matrix: rows of n weights in one format, the
 * model's dense dtype (model_weight_t) or a GGUF block format (runtime/quant.h), and the dot
 * products of rows with fp32 vectors in either.
 *
 * A format is a GGUF type id (QUANT_*); model_config.h gives each layer's of each matrix field as
 * MODEL_FORMAT_*_AT(l) (a field's layers may differ: llama.cpp's Q4_K_M). In a specialized build
 * whose field has one format it is a constant, so every `if (MAT_DENSE(f))` below folds away and a
 * dense model compiles to exactly the dense kernels of cpu_kernels.h; where the layers differ, or
 * in a generic build, it is read from a table and the branch is one compare per row (of hundreds
 * of weights or more).
 *
 * Dense rows keep cpu_kernels.h's four-stream and several-token kernels. Quantized rows go through
 * quant_dot_q a row at a time, and in a prompt batch through quant_dot_x4_q, a row against four
 * tokens with its blocks unpacked once for the four (each sum quant_dot's bits). They read their
 * input quantized to 16 bits (quant_input; token t's QUANT_INPUT_BYTES(n) after token t - 1's),
 * which a matrix product computes once per input (mat_quantize), not once a row; dense rows read x
 * in fp32 and ignore xq. Include after model.h and cpu_kernels.h. */
#ifndef INGOT_CPU_MATRIX_H
#define INGOT_CPU_MATRIX_H

#include <stddef.h>
#include <stdint.h>

#include "quant.h"

/* Whether format f is one of the dense dtypes, whose rows are model_weight_t. A dense matrix is
 * always in the model's dtype (codegen/spec.py: only the dense tensors take torch_dtype). */
#define MAT_DENSE(f) ((f) == QUANT_F32 || (f) == QUANT_F16 || (f) == QUANT_BF16)

/* xq = nb inputs x (x_stride floats apart) of n each quantized (quant_input), QUANT_INPUT_BYTES(n)
 * a token, where format f reads them (the block formats); nothing otherwise. */
KERNEL void mat_quantize(int f, const float *x, size_t x_stride, int nb, int n, uint8_t *xq) {
    if (!MAT_DENSE(f))
        for (int b = 0; b < nb; b++) quant_input(x + (size_t)b * x_stride, n, xq + (size_t)b * QUANT_INPUT_BYTES(n));
}

/* Row r of matrix w, whose rows hold n weights of format f. */
KERNEL const void *mat_row(const void *w, int f, int n, size_t r) {
    return (const uint8_t *)w + r * quant_row_size(f, (size_t)n);
}

/* The n weights of row in fp32 (the embedding lookup). */
KERNEL void mat_row_to_f32(int f, const void *row, float *y, int n) {
    if (MAT_DENSE(f)) {
        const model_weight_t *w = row;
        for (int i = 0; i < n; i++) y[i] = w_to_f32(w[i]);
    } else
        quant_dequantize_row(f, row, y, n);
}

/* row . x over n (xq: x quantized) */
KERNEL float mat_dot(int f, const void *row, const float *x, const uint8_t *xq, int n) {
    return MAT_DENSE(f) ? dot_w((const model_weight_t *)row, x, n) : quant_dot_q(f, row, xq, n);
}

/* o[r] = rows[r] . x for four rows */
KERNEL void mat_dot4(int f, const void *const rows[4], const float *x, const uint8_t *xq, int n, float o[4]) {
    if (MAT_DENSE(f)) {
        const model_weight_t *const ws[4] = {rows[0], rows[1], rows[2], rows[3]};
        dot4_w(ws, x, n, o);
    } else
        for (int r = 0; r < 4; r++) o[r] = quant_dot_q(f, rows[r], xq, n);
}

/* o[t][r] = rows[r] . x[t] for four rows and two tokens' inputs (xs floats apart) */
KERNEL void mat_dot4_x2(int f, const void *const rows[4], const float *x, size_t xs, const uint8_t *xq, int n, float o[2][4]) {
    if (MAT_DENSE(f)) {
        const model_weight_t *const ws[4] = {rows[0], rows[1], rows[2], rows[3]};
        dot4_x2_w(ws, x, xs, n, o);
    } else
        for (int t = 0; t < 2; t++) mat_dot4(f, rows, x + (size_t)t * xs, xq + (size_t)t * QUANT_INPUT_BYTES(n), n, o[t]);
}

/* o[t] = row . x[t] for one row and four tokens' inputs (xs floats apart) */
KERNEL void mat_dot_x4(int f, const void *row, const float *x, size_t xs, const uint8_t *xq, int n, float o[4]) {
    if (MAT_DENSE(f)) dot_x4_w((const model_weight_t *)row, x, xs, n, o);
    else quant_dot_x4_q(f, row, xq, QUANT_INPUT_BYTES(n), n, o);
}

#endif
