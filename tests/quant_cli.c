/* quant_cli.c - a command-line driver of runtime/quant.c for tests/test_quant.py, which checks it
 * against the gguf package's NumPy dequantizer. Built once per kernel path (Makefile:
 * build/tests/quant_cli_{scalar,avx2,avx512}; the plain build/tests/quant_cli takes this machine's).
 *
 *   quant_cli info                       the path quant_dot takes, then one line per type:
 *                                        "ID NAME BLOCK BYTES"
 *   quant_cli rowbytes TYPE N            the bytes of a row of N weights of TYPE (a ggml_type id)
 *   quant_cli dequant TYPE N IN OUT      IN: rows of N weights of TYPE as GGUF stores them;
 *                                        OUT: the rows dequantized, fp32
 *   quant_cli input N X OUT              X: N fp32; OUT: quant_input's x16 (N int16, in order), dx
 *                                        (N / 32 fp32) and s = dx * S (N / 32 fp32)
 *   quant_cli dot TYPE N IN X OUT        X: N fp32; OUT: per row of IN, quant_dot_ref and quant_dot
 *                                        (two fp32); each row's quant_dot_x4 (x and three tokens
 *                                        made from it), and both again with the tokens quantized
 *                                        once (quant_input, quant_dot_q, quant_dot_x4_q; block
 *                                        formats), checked to give quant_dot's bits (two NaNs
 *                                        count as the same), or an error
 *
 * Errors print one line, "<err_name>: <detail>", on stderr and exit 1. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/quant.h"

/* The whole of path in a fresh buffer (*len bytes). */
static err_code read_file(const char *path, void **data, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return err_set(ERR_IO, "%s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *data = malloc(n > 0 ? (size_t)n : 1);
    if (!*data) {
        fclose(f);
        return err_set(ERR_NOMEM, "%s: %ld bytes", path, n);
    }
    *len = fread(*data, 1, (size_t)n, f);
    fclose(f);
    return *len == (size_t)n ? ERR_OK : err_set(ERR_IO, "%s: short read", path);
}

static err_code write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return err_set(ERR_IO, "%s: %s", path, strerror(errno));
    size_t w = fwrite(data, 1, len, f);
    return fclose(f) == 0 && w == len ? ERR_OK : err_set(ERR_IO, "%s: short write", path);
}

/* The same bits, or both NaN (a NaN's payload is whichever operand an instruction passes on) */
static int same(float a, float b) { return !memcmp(&a, &b, sizeof a) || (a != a && b != b); }

/* The rows of IN as n weights of type each: *rows of *row_bytes. */
static err_code load_rows(int type, int n, const char *path, void **data, size_t *rows, size_t *row_bytes) {
    err_code rc = quant_row_bytes(type, n, row_bytes);
    if (rc) return rc;
    size_t len;
    if ((rc = read_file(path, data, &len))) return rc;
    if (len % *row_bytes)
        return err_set(ERR_QUANT, "%s: %zu bytes, expected a multiple of the row's %zu", path, len, *row_bytes);
    *rows = len / *row_bytes;
    return ERR_OK;
}

static err_code run(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "info")) {
        printf("%s\n", quant_dot_isa());
        for (int t = 0; t < 64; t++) {
            const quant_format *f = quant_format_of(t);
            if (f) printf("%d %s %d %d\n", t, f->name, f->block, f->bytes);
        }
        return ERR_OK;
    }
    if (argc < 4) return err_set(ERR_ARG, "usage: quant_cli info | rowbytes TYPE N | dequant TYPE N IN OUT | dot TYPE N IN X OUT");
    const int type = atoi(argv[2]);
    const long long n = atoll(argv[3]);
    if (!strcmp(argv[1], "rowbytes") && argc == 4) {
        size_t bytes;
        err_code rc = quant_row_bytes(type, n, &bytes);
        if (!rc) printf("%zu\n", bytes);
        return rc;
    }
    if (!strcmp(argv[1], "input") && argc == 5) { /* argv[2] is N here */
        const int m = atoi(argv[2]);
        void *xin = NULL;
        size_t xlen;
        err_code rc = read_file(argv[3], &xin, &xlen);
        if (!rc && (m <= 0 || m % 32 || xlen != (size_t)m * sizeof(float)))
            rc = err_set(ERR_ARG, "%s: %zu bytes, expected N = %d fp32, N a positive multiple of 32", argv[3], xlen, m);
        int16_t *xq = rc ? NULL : aligned_alloc(64, QUANT_INPUT_BYTES(m));
        const size_t ob = (size_t)m * 4 + (size_t)m / 32 * 16; /* x16, dx, dx * S; lo, hi, S, the sum of hi */
        uint8_t *o = rc ? NULL : malloc(ob);
        if (!rc && (!xq || !o)) rc = err_set(ERR_NOMEM, "input");
        if (!rc) {
            quant_input(xin, m, xq);
            const size_t nb8 = (size_t)(m / 32 + 7) / 8 * 8;
            const float *d = (const float *)(xq + nb8 * 32), *s = d + nb8;
            for (int b = 0; b < m / 32; b++) /* the layout quant.c describes: blocks in pairs, halves of 16 */
                for (int i = 0; i < 32; i++)
                    memcpy(o + 2 * (32 * (size_t)b + i), xq + 64 * (b / 2) + 32 * (i / 16) + 16 * (b % 2) + i % 16, 2);
            memcpy(o + (size_t)m * 2, d, (size_t)m / 32 * 4);
            memcpy(o + (size_t)m * 2 + (size_t)m / 32 * 4, s, (size_t)m / 32 * 4);
            /* the bytes (blocks in order) and the integer sums, each array whole blocks from its start */
            const uint8_t *lo = (const uint8_t *)(s + nb8), *hi = lo + nb8 * 32, *sums = hi + nb8 * 32;
            uint8_t *p = o + (size_t)m * 2 + (size_t)m / 32 * 8;
            memcpy(p, lo, (size_t)m), p += m;
            memcpy(p, hi, (size_t)m), p += m;
            memcpy(p, sums, (size_t)m / 32 * 4), p += (size_t)m / 32 * 4;
            memcpy(p, sums + nb8 * 4, (size_t)m / 32 * 4);
            rc = write_file(argv[4], o, ob);
        }
        free(xin);
        free(xq);
        free(o);
        return rc;
    }
    void *w = NULL, *x = NULL;
    float *out = NULL;
    size_t rows, row_bytes, xlen;
    err_code rc;
    if (!strcmp(argv[1], "dequant") && argc == 6) {
        if (!(rc = load_rows(type, (int)n, argv[4], &w, &rows, &row_bytes))) {
            out = malloc(rows * n * sizeof *out + 1);
            for (size_t r = 0; r < rows; r++) quant_dequantize_row(type, (char *)w + r * row_bytes, out + r * n, (int)n);
            rc = write_file(argv[5], out, rows * n * sizeof *out);
        }
    } else if (!strcmp(argv[1], "dot") && argc == 7) {
        if (!(rc = load_rows(type, (int)n, argv[4], &w, &rows, &row_bytes)) && !(rc = read_file(argv[5], &x, &xlen))) {
            if (xlen != n * sizeof(float)) {
                rc = err_set(ERR_ARG, "%s: %zu bytes, expected %lld fp32", argv[5], xlen, n);
            } else {
                out = malloc(2 * rows * sizeof *out + 1);
                float *x4 = malloc(4 * (size_t)n * sizeof *x4 + 1); /* four tokens: x, -x / 2, x reversed, x + 1 */
                const int blocks = quant_format_of(type)->block > 1;
                const size_t qb = QUANT_INPUT_BYTES(n); /* the four tokens quantized, 64-byte aligned */
                uint8_t *xq = aligned_alloc(64, 4 * qb);
                if (!out || !x4 || !xq) rc = err_set(ERR_NOMEM, "dot");
                for (long long i = 0; !rc && i < n; i++) {
                    const float v = ((const float *)x)[i];
                    x4[i] = v;
                    x4[n + i] = -0.5f * v;
                    x4[2 * n + (n - 1 - i)] = v;
                    x4[3 * n + i] = v + 1.0f;
                }
                for (int t = 0; !rc && blocks && t < 4; t++) quant_input(x4 + (size_t)t * n, (int)n, xq + t * qb);
                for (size_t r = 0; !rc && r < rows; r++) {
                    const void *row = (char *)w + r * row_bytes;
                    out[2 * r] = quant_dot_ref(type, row, x, (int)n);
                    out[2 * r + 1] = quant_dot(type, row, x, (int)n);
                    if (blocks && !same(out[2 * r + 1], out[2 * r])) /* the block formats: the twin's bits */
                        rc = err_set(ERR_QUANT, "quant_dot: type %d row %zu: %a, quant_dot_ref %a", type, r, out[2 * r + 1], out[2 * r]);
                    float o[4], oq[4]; /* quant_dot_x4 (_q): each token's sum quant_dot's, bit for bit */
                    quant_dot_x4(type, row, x4, (size_t)n, (int)n, o);
                    if (blocks) quant_dot_x4_q(type, row, xq, qb, (int)n, oq);
                    for (int t = 0; t < 4 && !rc; t++) {
                        const float want = quant_dot(type, row, x4 + (size_t)t * n, (int)n);
                        const float one_q = blocks ? quant_dot_q(type, row, xq + t * qb, (int)n) : want;
                        if (!same(o[t], want))
                            rc = err_set(ERR_QUANT, "quant_dot_x4: type %d row %zu token %d: %a, quant_dot %a", type, r, t, o[t], want);
                        else if (blocks && !same(oq[t], want))
                            rc = err_set(ERR_QUANT, "quant_dot_x4_q: type %d row %zu token %d: %a, quant_dot %a", type, r, t, oq[t], want);
                        else if (!same(one_q, want))
                            rc = err_set(ERR_QUANT, "quant_dot_q: type %d row %zu token %d: %a, quant_dot %a", type, r, t, one_q, want);
                    }
                }
                free(x4);
                free(xq);
                if (!rc) rc = write_file(argv[6], out, 2 * rows * sizeof *out);
            }
        }
    } else {
        rc = err_set(ERR_ARG, "unknown command or wrong arguments: %s", argv[1]);
    }
    free(w);
    free(x);
    free(out);
    return rc;
}

int main(int argc, char **argv) {
    err_code rc = run(argc, argv);
    if (rc) {
        fprintf(stderr, "%s: %s\n", err_name(rc), err_detail());
        return 1;
    }
    return 0;
}
