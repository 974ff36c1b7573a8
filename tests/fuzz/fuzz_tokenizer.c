/* fuzz_tokenizer.c - libFuzzer target: runtime/tokenizer.c on an arbitrary tokenizer.json, then,
 * when it loads, encoding the text after "\n@@\n" in the input (or a fixed one) and decoding
 * every id. Ids must stay below the limit given at load. */
#include "fuzz_common.h"
#include "tokenizer.h"

#define MAX_IDS 4096

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t json_size, text_size;
    const uint8_t *text;
    fuzz_split(data, size, &json_size, &text, &text_size);
    fuzz_write("tokenizer.json", data, json_size);
    char path[256];
    snprintf(path, sizeof path, "%s/tokenizer.json", fuzz_dir());
    tokenizer *t;
    err_code rc = tok_load(&t, path, MAX_IDS);
    if (rc) {
        fuzz_check_detail(err_detail());
        return 0;
    }
    if (tok_vocab_size(t) > MAX_IDS) abort();
    static const char fixed[] = "Hello world! 12345 héllo  \t\n<s> 'll ";
    if (!text_size) {
        text = (const uint8_t *)fixed;
        text_size = sizeof fixed - 1;
    }
    int *ids, n;
    for (int special = 0; special < 2; special++) {
        rc = tok_encode(t, (const char *)text, text_size, special, &ids, &n);
        if (rc) {
            fuzz_check_detail(err_detail());
            continue;
        }
        char *piece = malloc((size_t)tok_max_piece_bytes(t) + 1);
        int prev = -1;
        for (int i = 0; i < n; i++) {
            if (ids[i] < 0 || ids[i] >= tok_vocab_size(t)) abort();
            if (tok_decode_piece(t, prev, ids[i], piece, (size_t)tok_max_piece_bytes(t)) < 0) abort();
            prev = ids[i];
        }
        free(piece);
        free(ids);
    }
    char *piece = malloc((size_t)tok_max_piece_bytes(t) + 1);
    for (int id = 0; id < tok_vocab_size(t); id++)
        if (tok_decode_piece(t, id ? id - 1 : -1, id, piece, (size_t)tok_max_piece_bytes(t)) < 0) abort();
    free(piece);
    tok_free(t);
    return 0;
}
