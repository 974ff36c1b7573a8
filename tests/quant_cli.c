/* quant_cli.c - a command-line driver of runtime/quant.c for tests/test_quant.py, which checks it
 * against the gguf package's NumPy dequantizer. Built once per kernel path (Makefile:
 * build/tests/quant_cli_{scalar,avx2,avx512}; the plain build/tests/quant_cli takes this machine's).
 *
 *   quant_cli info                       the path quant_dot takes, then one line per type:
 *                                        "ID NAME BLOCK BYTES"
 *   quant_cli rowbytes TYPE N            the bytes of a row of N weights of TYPE (a ggml_type id)
 *   quant_cli dequant TYPE N IN OUT      IN: rows of N weights of TYPE as GGUF stores them;
 *                                        OUT: the rows dequantized, fp32
 *   quant_cli dot TYPE N IN X OUT        X: N fp32; OUT: per row of IN, quant_dot_ref and quant_dot
 *                                        (two fp32); each row's quant_dot_x4 (x and three tokens
 *                                        made from it), and both again with the tokens' block sums
 *                                        given (quant_dot_s, quant_dot_x4_s), checked to give
 *                                        quant_dot's bits, or an error
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
                float *sums = malloc(4 * (size_t)(n / 32) * sizeof *sums + 1); /* their block sums */
                if (!out || !x4 || !sums) rc = err_set(ERR_NOMEM, "dot");
                for (long long i = 0; !rc && i < n; i++) {
                    const float v = ((const float *)x)[i];
                    x4[i] = v;
                    x4[n + i] = -0.5f * v;
                    x4[2 * n + (n - 1 - i)] = v;
                    x4[3 * n + i] = v + 1.0f;
                }
                for (int t = 0; !rc && t < 4; t++) quant_block_sums(x4 + (size_t)t * n, (int)n, sums + (size_t)t * (n / 32));
                for (size_t r = 0; !rc && r < rows; r++) {
                    const void *row = (char *)w + r * row_bytes;
                    out[2 * r] = quant_dot_ref(type, row, x, (int)n);
                    out[2 * r + 1] = quant_dot(type, row, x, (int)n);
                    float o[4], os[4]; /* quant_dot_x4 (_s): each token's sum quant_dot's, bit for bit */
                    quant_dot_x4(type, row, x4, (size_t)n, (int)n, o);
                    quant_dot_x4_s(type, row, x4, (size_t)n, sums, (size_t)(n / 32), (int)n, os);
                    for (int t = 0; t < 4 && !rc; t++) {
                        const float *xt = x4 + (size_t)t * n, *st = sums + (size_t)t * (n / 32);
                        const float want = quant_dot(type, row, xt, (int)n), one_s = quant_dot_s(type, row, xt, st, (int)n);
                        if (memcmp(&o[t], &want, sizeof want))
                            rc = err_set(ERR_QUANT, "quant_dot_x4: type %d row %zu token %d: %a, quant_dot %a", type, r, t, o[t], want);
                        else if (memcmp(&os[t], &want, sizeof want))
                            rc = err_set(ERR_QUANT, "quant_dot_x4_s: type %d row %zu token %d: %a, quant_dot %a", type, r, t, os[t], want);
                        else if (memcmp(&one_s, &want, sizeof want))
                            rc = err_set(ERR_QUANT, "quant_dot_s: type %d row %zu token %d: %a, quant_dot %a", type, r, t, one_s, want);
                    }
                }
                free(x4);
                free(sums);
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
