/* test_quant.c - runtime/quant.c on its own: the table and quant_row_bytes' refusals, and this
 * build's quant_dot against its scalar twin quant_dot_ref on random blocks. The formats against the
 * gguf package, bit for bit, and each kernel path forced are in tests/test_quant.py.
 *
 * The block formats: quant_dot must give quant_dot_ref's bits (both take the input quantized to 16
 * bits and sum the block results in one order, quant.c's block_terms). The dense types: both are
 * fp32 sums of the same n products in different orders, each within gamma(n + 16) * S of the exact
 * sum (S = sum of |terms|, the bound tests/test_quant.py derives), so they differ by at most twice
 * that. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "quant.h"

static uint64_t rng = 88172645463325252u;
static uint64_t next(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

/* A random fp16 of modest size (2^-10 .. 2^-3, either sign) at p. */
static void put_scale(uint8_t *p) {
    const uint16_t h = (uint16_t)(((next() & 1) << 15) | ((5 + next() % 8) << 10) | (next() & 0x3FF));
    memcpy(p, &h, 2);
}

static void test_table(void) {
    static const struct { int type, block, bytes; } want[] = {
        {QUANT_F32, 1, 4}, {QUANT_F16, 1, 2}, {QUANT_BF16, 1, 2}, {QUANT_Q8_0, 32, 34}, {QUANT_Q4_0, 32, 18},
        {QUANT_Q4_1, 32, 20}, {QUANT_Q4_K, 256, 144}, {QUANT_Q5_K, 256, 176}, {QUANT_Q6_K, 256, 210},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const quant_format *f = quant_format_of(want[i].type);
        CHECK(f && f->block == want[i].block && f->bytes == want[i].bytes, "type %d", want[i].type);
        size_t bytes = 0;
        CHECK(quant_row_size(want[i].type, 3 * (size_t)want[i].block) == 3u * want[i].bytes, "quant_row_size, type %d", want[i].type);
        CHECK(quant_row_bytes(want[i].type, 3 * want[i].block, &bytes) == ERR_OK && bytes == 3u * want[i].bytes, "type %d: %zu",
              want[i].type, bytes);
        if (want[i].block > 1)
            CHECK(quant_row_bytes(want[i].type, want[i].block + 1, &bytes) == ERR_QUANT, "type %d: n not a multiple", want[i].type);
        CHECK(quant_row_bytes(want[i].type, 0, &bytes) == ERR_QUANT, "type %d: n = 0", want[i].type);
    }
    size_t bytes;
    CHECK(quant_row_bytes(6, 64, &bytes) == ERR_QUANT && strstr(err_detail(), "Q5_0"), "%s", err_detail());
    CHECK(quant_format_of(6) == NULL && quant_format_of(-1) == NULL && quant_format_of(1000) == NULL, "unknown types");
    CHECK(quant_type_name(16) && !strcmp(quant_type_name(16), "IQ2_XXS") && quant_type_name(5) == NULL, "names");
}

static void test_dot_against_ref(int type, int n) {
    const quant_format *f = quant_format_of(type);
    size_t row_bytes;
    CHECK(quant_row_bytes(type, n, &row_bytes) == ERR_OK, "%s n=%d", f->name, n);
    uint8_t *w = malloc(row_bytes), *w0 = malloc(row_bytes);
    float *x = malloc(sizeof(float) * (size_t)n), *wf = malloc(sizeof(float) * (size_t)n), *of = malloc(sizeof(float) * (size_t)n);
    for (int rep = 0; rep < 8; rep++) {
        for (size_t i = 0; i < row_bytes; i++) w[i] = (uint8_t)next();
        for (int b = 0; b < n / f->block; b++) {
            uint8_t *p = w + (size_t)b * f->bytes;
            switch (type) {
            case QUANT_F32: { const float v = (float)((int)(next() % 2001) - 1000) / 512.0f; memcpy(p, &v, 4); break; }
            case QUANT_F16: case QUANT_BF16: case QUANT_Q8_0: case QUANT_Q4_0: put_scale(p); break;
            case QUANT_Q4_1: case QUANT_Q4_K: case QUANT_Q5_K: put_scale(p); put_scale(p + 2); break;
            case QUANT_Q6_K: put_scale(p + 208); break;
            }
        }
        for (int i = 0; i < n; i++) x[i] = (float)((int)(next() % 2001) - 1000) / 1000.0f;
        /* S = sum (|w - o| + |o|) |x|, o the offsets the kernels sum apart (Q4_1's m, the K formats'
         * dmin * min): the row dequantized with d = 0. */
        memcpy(w0, w, row_bytes);
        const int offsets = type == QUANT_Q4_1 || type == QUANT_Q4_K || type == QUANT_Q5_K;
        for (int b = 0; offsets && b < n / f->block; b++) memset(w0 + (size_t)b * f->bytes, 0, 2);
        quant_dequantize_row(type, w, wf, n);
        quant_dequantize_row(type, w0, of, n);
        double s = 0;
        for (int i = 0; i < n; i++) {
            const double o = offsets ? of[i] : 0.0;
            s += (fabs((double)wf[i] - o) + fabs(o)) * fabs((double)x[i]);
        }
        const double k = n + 16, u = ldexp(1.0, -24), tol = 2.0 * k * u / (1 - k * u) * s;
        const float ref = quant_dot_ref(type, w, x, n), got = quant_dot(type, w, x, n);
        if (f->block > 1)
            CHECK(!memcmp(&got, &ref, sizeof got), "%s n=%d (%s): quant_dot %a, quant_dot_ref %a", f->name, n, quant_dot_isa(), got, ref);
        else
            CHECK(fabs((double)got - ref) <= tol, "%s n=%d (%s): quant_dot %.9g, quant_dot_ref %.9g, tolerance %.3g", f->name, n,
                  quant_dot_isa(), got, ref, tol);
    }
    free(w);
    free(w0);
    free(x);
    free(wf);
    free(of);
}

int main(void) {
    test_table();
    static const int types[] = {QUANT_F32, QUANT_F16, QUANT_BF16, QUANT_Q8_0, QUANT_Q4_0, QUANT_Q4_1, QUANT_Q4_K, QUANT_Q5_K, QUANT_Q6_K};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        for (int n = 256; n <= 4096; n *= 4) test_dot_against_ref(types[t], n);
    return check_summary();
}
