/* fuzz_json.c - libFuzzer target: runtime/json.c on arbitrary bytes. The tree of an accepted
 * document is walked whole (every string valid UTF-8 of its stated length, counts right). */
#include "fuzz_common.h"
#include "json.h"

static size_t walk(const json_value *v, int depth) {
    if (depth > 200) abort(); /* json.c bounds nesting at 128 */
    size_t n = 1;
    if (v->type == JSON_STRING && strlen(v->str) > (size_t)v->n) abort();
    int kids = 0;
    json_for_each(c, v) {
        if (v->type == JSON_OBJECT && (!c->key || strlen(c->key) > (size_t)c->key_len)) abort();
        n += walk(c, depth + 1);
        kids++;
    }
    if ((v->type == JSON_ARRAY || v->type == JSON_OBJECT) && kids != v->n) abort();
    if (v->type == JSON_OBJECT && v->child) (void)json_get(v, v->child->key);
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_doc doc;
    err_code rc = json_parse((const char *)data, size, &doc);
    if (rc) {
        fuzz_check_detail(err_detail());
        return 0;
    }
    if (walk(doc.root, 0) != doc.n_nodes) abort();
    json_free(&doc);
    return 0;
}
