/* tok_cli.c - a command-line driver of the tokenizer, for the tests (tests/test_tokenizer.py).
 *
 *   tok_cli TOKENIZER_JSON encode [--no-special] < text   prints the ids, space-separated, on one line
 *   tok_cli TOKENIZER_JSON encode --plain < text          ... special tokens' text as plain text
 *                                                         (tok_encode_marked, nothing marked)
 *   tok_cli TOKENIZER_JSON decode ID...                    prints the concatenated pieces
 *
 * Errors print one line, "<err_name>: <detail>", on stderr and exit 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/tokenizer.h"

static int die(err_code rc) {
    fprintf(stderr, "%s: %s\n", err_name(rc), err_detail());
    return 1;
}

static err_code read_stdin(char **text, size_t *len) {
    size_t cap = 1 << 16;
    *len = 0;
    *text = malloc(cap);
    if (!*text) return err_set(ERR_NOMEM, "stdin: %zu bytes", cap);
    size_t got;
    while ((got = fread(*text + *len, 1, cap - *len, stdin)) > 0) {
        *len += got;
        if (*len == cap) {
            char *p = realloc(*text, cap *= 2);
            if (!p) return err_set(ERR_NOMEM, "stdin: %zu bytes", cap);
            *text = p;
        }
    }
    if (ferror(stdin)) return err_set(ERR_IO, "stdin: read error");
    return ERR_OK;
}

static int encode(const tokenizer *t, int add_special, int plain) {
    char *text;
    size_t len;
    err_code rc = read_stdin(&text, &len);
    if (rc) return die(rc);
    int *ids, n;
    unsigned char *control = plain ? calloc(len + 1, 1) : NULL; /* nothing marked: no control text */
    if (plain && !control) return die(err_set(ERR_NOMEM, "control flags"));
    rc = tok_encode_marked(t, text, len, control, add_special, &ids, &n);
    free(control);
    free(text);
    if (rc) return die(rc);
    for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
    free(ids);
    return 0;
}

static int decode(const tokenizer *t, int argc, char **argv) {
    char *piece = malloc((size_t)tok_max_piece_bytes(t) + 1);
    if (!piece) return die(err_set(ERR_NOMEM, "decode buffer"));
    int prev = -1;
    for (int i = 0; i < argc; i++) {
        char *end;
        long id = strtol(argv[i], &end, 10);
        int n = (*end || end == argv[i] || id < 0 || id > 0x7fffffff)
                    ? -1
                    : tok_decode_piece(t, prev, (int)id, piece, (size_t)tok_max_piece_bytes(t));
        if (n < 0) {
            free(piece);
            return die(err_set(ERR_ARG, "token id \"%s\" is not in [0, %d)", argv[i], tok_vocab_size(t)));
        }
        fwrite(piece, 1, (size_t)n, stdout);
        prev = (int)id;
    }
    free(piece);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3 || (strcmp(argv[2], "encode") && strcmp(argv[2], "decode")) ||
        (!strcmp(argv[2], "encode") && (argc > 4 || (argc == 4 && strcmp(argv[3], "--no-special") && strcmp(argv[3], "--plain"))))) {
        return die(err_set(ERR_ARG, "usage: %s TOKENIZER_JSON encode [--no-special|--plain] < text | "
                                    "%s TOKENIZER_JSON decode ID...", argv[0], argv[0]));
    }
    tokenizer *t;
    err_code rc = tok_load(&t, argv[1], 1 << 22); /* the largest vocab_size a config may give (spec.py LIMITS) */
    if (rc) return die(rc);
    int status = !strcmp(argv[2], "encode") ? encode(t, argc == 3 || !strcmp(argv[3], "--plain"), argc == 4 && !strcmp(argv[3], "--plain")) : decode(t, argc - 3, argv + 3);
    tok_free(t);
    return status;
}
