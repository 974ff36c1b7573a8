/* ggml's reference K quantizers as a filter: float32 rows on stdin -> their blocks on stdout.

   Built and run by tests/ggml_k_fixture.py against ggml-quants.c of a llama-cpp-python sdist, so
   that tests/data/ggml_k_quants.npz holds ggml's own bytes rather than a transcription's.

       ggml_k_ref q4_K|q5_K|q6_K < rows.f32 > blocks.bin

   The input is a whole number of 256-weight super-blocks (QK_K); the output is the blocks of
   quantize_row_q{4,5,6}_K_ref in order (144, 176 or 210 bytes each). ggml-quants.c names three
   functions of ggml.c (type sizes and names, for code paths the reference quantizers never take)
   and ggml_abort (GGML_ASSERT): defined here, each aborting, so that nothing of ggml.c is linked. */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-quants.h"

void ggml_abort(const char * file, int line, const char * fmt, ...) {
    (void) fmt;
    fprintf(stderr, "ggml_k_ref: ggml_abort at %s:%d\n", file, line);
    abort();
}
size_t ggml_row_size(enum ggml_type type, int64_t ne) { (void) type; (void) ne; abort(); }
size_t ggml_type_size(enum ggml_type type) { (void) type; abort(); }
const char * ggml_type_name(enum ggml_type type) { (void) type; abort(); }

int main(int argc, char ** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: ggml_k_ref q4_K|q5_K|q6_K < rows.f32 > blocks.bin\n");
        return 2;
    }
    size_t cap = 1 << 20, n = 0;  /* floats */
    float * x = malloc(cap * sizeof(float));
    size_t got;
    while (x && (got = fread(x + n, sizeof(float), cap - n, stdin)) > 0) {
        n += got;
        if (n == cap) {
            cap *= 2;
            x = realloc(x, cap * sizeof(float));
        }
    }
    if (!x || n % QK_K) {
        fprintf(stderr, "ggml_k_ref: %zu floats on stdin, expected a multiple of %d\n", n, QK_K);
        return 1;
    }
    size_t nb = n / QK_K, size;
    void * y;
    if (!strcmp(argv[1], "q4_K")) {
        y = malloc(nb * (size = sizeof(block_q4_K)));
        quantize_row_q4_K_ref(x, y, (int64_t) n);
    } else if (!strcmp(argv[1], "q5_K")) {
        y = malloc(nb * (size = sizeof(block_q5_K)));
        quantize_row_q5_K_ref(x, y, (int64_t) n);
    } else if (!strcmp(argv[1], "q6_K")) {
        y = malloc(nb * (size = sizeof(block_q6_K)));
        quantize_row_q6_K_ref(x, y, (int64_t) n);
    } else {
        fprintf(stderr, "ggml_k_ref: type %s, expected q4_K, q5_K or q6_K\n", argv[1]);
        return 2;
    }
    fwrite(y, size, nb, stdout);
    free(x);
    free(y);
    return 0;
}
