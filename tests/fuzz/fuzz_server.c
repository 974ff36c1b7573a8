/* fuzz_server.c - libFuzzer target: the server's handling of a request past libmicrohttpd's HTTP
 * parser (runtime/server.c, included to reach its static functions) on the tiny-llama test model,
 * CPU. The input's first line is the URL, the rest the body:
 *   - the route (route_of); a generation route's body through job_from_body: the JSON, the OpenAI
 *     fields, the messages through the chat template and the tokenizer, the context's bound. A job
 *     must hold ids in the vocabulary and fewer than the context, a refusal a status the server
 *     answers with and a one-line message;
 *   - the body's bytes as generated text through the answers' JSON (final_json and a stream's
 *     chunk_json: invalid UTF-8 replaced, controls escaped), which must parse as JSON. */
#include "../../runtime/server.c"
#include "fuzz_common.h"

static engine eng;
static server srv;
static server_config cfg = {.model_name = "tiny-llama", .max_tokens = -1}; /* as --serve without -n */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const engine_config o = {.model_dir = INGOT_MODEL_DIR, .ctx = 256, .n_threads = 1};
    if (engine_open(&eng, &o)) {
        fprintf(stderr, "fuzz_server: %s\n", err_detail());
        abort();
    }
    srv.e = &eng;
    srv.cfg = &cfg;
    pthread_mutex_init(&srv.lock, NULL);
    return 0;
}

/* b holds one JSON document (a stream's chunk: after "data: ", before the blank line) */
static void must_parse(const sbuf *b, size_t skip, size_t trim) {
    json_doc doc;
    if (b->len < skip + trim || json_parse(b->b + skip, b->len - skip - trim, &doc)) abort();
    json_free(&doc);
}

static job *answer_job(int kind, const char *text, size_t len) {
    job *j = calloc(1, sizeof *j);
    if (!j) abort();
    pthread_cond_init(&j->changed, NULL);
    j->kind = kind;
    j->finish = "stop";
    strcpy(j->id, "chatcmpl-1");
    sb_put(&j->text, text, len);
    return j;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nl = memchr(data, '\n', size);
    const size_t url_len = nl ? (size_t)(nl - data) : size;
    char url[256];
    if (url_len >= sizeof url) return 0;
    memcpy(url, data, url_len);
    url[url_len] = '\0';
    const char *body = nl ? (const char *)nl + 1 : "";
    const size_t len = nl ? size - url_len - 1 : 0;

    const int route = route_of(url);
    if (route < 0 || route >= N_ROUTES) abort();
    if (route == ROUTE_CHAT || route == ROUTE_COMPLETIONS) {
        req_error err = {0};
        job *j = job_from_body(&srv, route == ROUTE_CHAT ? KIND_CHAT : KIND_COMPLETION, body, len, &err);
        if (j) {
            if (j->n_ids < 1 || j->n_ids >= eng.ctx || j->max_tokens < 1) abort();
            for (int i = 0; i < j->n_ids; i++)
                if (j->ids[i] < 0 || j->ids[i] >= tok_vocab_size(eng.tok)) abort();
            job_free(j);
        } else {
            int known = 0;
            for (int i = 0; i < N_STATUS; i++) known |= status_codes[i] == err.status;
            if (!known || err.status == 200 || !err.message[0] || strchr(err.message, '\n')) abort();
            sbuf b = {0};
            error_json(&b, &err);
            must_parse(&b, 0, 0);
            sb_free(&b);
        }
    }
    for (int kind = KIND_CHAT; kind <= KIND_COMPLETION; kind++) {
        job *j = answer_job(kind, body, len);
        sbuf b = {0};
        final_json(&b, &srv, j);
        must_parse(&b, 0, 0);
        sb_free(&b);
        chunk_json(&b, &srv, j, body, len, 1, NULL);
        must_parse(&b, 6, 2); /* "data: " ... "\n\n" */
        sb_free(&b);
        job_free(j);
    }
    return 0;
}
