/* engine.c - one model ready to run (engine.h): opening and checking it, feeding tokens, the
 * generation loop on the CPU and the GPU, the prompt cache, and the chat template's text around
 * each turn, with the template's text marked so that only it may hold control tokens.
 *
 * Compiled once per model against generated/<model>/ (model_config.h, model_chat.h), or once
 * against generated/generic/, where the MODEL_* values are read at run time. */
#include "engine.h"

#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "model.h"
#include "model_chat.h"
#include "model_spec.h"
#include "model_check.h"
#include "quant.h"


/* Exporters sometimes leave RoPE buffers in the weights; they are derived, never read. */
static int ignore_tensor(const char *name) { return strstr(name, "rotary_emb.inv_freq") != NULL; }

/* --check-weights for the quantized matrices: every block's fp16 scales finite (their integers are
 * all valid values) */
static err_code check_blocks_finite(const void *const *data) {
    for (int t = 0; t < (int)MODEL_N_TENSORS; t++) {
        const st_tensor_spec *s = &model_tensor_specs[t];
        if (s->dtype != DT_U8) continue;
        const quant_format *f = quant_format_of(model_tensor_format(s->name));
        const size_t bytes = (size_t)s->shape[0] * (size_t)s->shape[1];
        int is_nan = 0;
        const size_t bad = quant_first_nonfinite_block(model_tensor_format(s->name), data[t], bytes, &is_nan);
        if (bad < bytes / (size_t)f->bytes)
            return err_set(ERR_ST_NONFINITE, "%s (%s blocks): block %zu's scale is %s", s->name, f->name, bad, is_nan ? "NaN" : "infinite");
    }
    return ERR_OK;
}

err_code engine_open(engine *e, const engine_config *o) {
    memset(e, 0, sizeof *e);
    err_code rc = ERR_OK;
#if !MODEL_GENERIC
    if ((rc = model_check_config(o->model_dir))) return rc; /* the model this binary was built for */
#endif
    if ((rc = st_model_open(&e->st, o->model_dir))) return rc;
    const void **data = e->weights = malloc((size_t)MODEL_N_TENSORS * sizeof *data); /* not on the stack: a generic
                                                                                        * build's count is the config's */
    if (!data) return err_set(ERR_NOMEM, "%d tensor pointers", (int)MODEL_N_TENSORS);
    if ((rc = st_model_bind(e->st, model_tensor_specs, MODEL_N_TENSORS, data, ignore_tensor))) return rc;
    if (o->check_weights && ((rc = st_check_finite(model_tensor_specs, data, MODEL_N_TENSORS)) || (rc = check_blocks_finite(data))))
        return rc;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", o->model_dir);
    if ((rc = tok_load(&e->tok, path, MODEL_VOCAB_SIZE))) return rc; /* every id below vocab_size */
    e->piece_cap = tok_max_piece_bytes(e->tok);
    e->piece = malloc((size_t)e->piece_cap);
    if (!e->piece) return err_set(ERR_NOMEM, "token text buffer");
#if MODEL_GENERIC
    if ((rc = model_generic_load_chat(o->model_dir, e->tok))) return rc; /* the chat strings, found at run time */
#endif
    e->stop_ids = malloc((size_t)(MODEL_N_EOS + MODEL_CHAT_N_STOP + 1) * sizeof *e->stop_ids);
    e->scratch = malloc((size_t)MODEL_VOCAB_SIZE * sizeof *e->scratch);
    if (!e->stop_ids || !e->scratch) return err_set(ERR_NOMEM, "stop ids and sampler scratch");
    for (int i = 0; i < MODEL_N_EOS; i++) e->stop_ids[e->n_stop++] = model_eos_ids[i];
    for (int i = 0; i < MODEL_CHAT_N_STOP; i++) e->stop_ids[e->n_stop++] = model_chat_stop_ids[i];
    e->ctx = o->ctx;
    e->exact_prompt = o->exact_prompt;
    e->tokens = malloc((size_t)e->ctx * sizeof(int));
    if (!e->tokens) return err_set(ERR_NOMEM, "token history for %d tokens", e->ctx);
    if (o->cuda) {
#ifdef INGOT_CUDA
        e->device_sampling = !o->host_logits;
        return model_cuda_init(&e->gpu, data, e->ctx, (kv_cache_type)o->kv_cache);
#else
        return err_set(ERR_DEVICE, "this binary was built without CUDA");
#endif
    }
    return model_cpu_init(&e->cpu, data, e->ctx, o->n_threads, (kv_cache_type)o->kv_cache);
}

void engine_close(engine *e) {
    model_cpu_free(e->cpu);
#ifdef INGOT_CUDA
    model_cuda_free(e->gpu);
#endif
    tok_free(e->tok);
    st_model_close(e->st);
    free(e->tokens);
    free(e->piece);
    free(e->stop_ids);
    free(e->scratch);
    free(e->weights);
}

static int is_stop(const engine *e, int id) {
    for (int i = 0; i < e->n_stop; i++)
        if (e->stop_ids[i] == id) return 1;
    return 0;
}

err_code engine_feed(engine *e, const int *ids, int n) {
    if (e->n_tokens + n > e->ctx)
        return err_set(ERR_CONTEXT, "%d tokens do not fit: %d already in a context of %d (raise --ctx, at most %d)",
                       n, e->n_tokens, e->ctx, MODEL_SEQ_LEN);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= MODEL_VOCAB_SIZE) return err_set(ERR_ARG, "token id %d is outside the vocabulary", ids[i]);
    if (n == 0) return ERR_OK;
#ifdef INGOT_CUDA
    if (e->gpu) {
        /* queued on the device at once; only the last token's choice or logits come back */
        err_code rc;
        for (; e->exact_prompt && n > 1; n--) { /* a step a token; all but the last leave only their keys and values */
            if ((rc = model_cuda_feed(e->gpu, ids, 1, e->n_tokens, CUDA_OUT_NONE))) return rc;
            e->tokens[e->n_tokens++] = *ids++;
        }
        rc = model_cuda_feed(e->gpu, ids, n, e->n_tokens, e->device_sampling ? CUDA_OUT_TOKEN : CUDA_OUT_LOGITS);
        if (!rc) rc = model_cuda_take(e->gpu, &e->next, e->device_sampling ? NULL : &e->logits);
        if (rc) return rc;
        memcpy(e->tokens + e->n_tokens, ids, (size_t)n * sizeof(int));
        e->n_tokens += n;
        return ERR_OK;
    }
#endif
    e->logits = n == 1 ? model_cpu_forward(e->cpu, ids[0], e->n_tokens) : model_cpu_prefill(e->cpu, ids, n, e->n_tokens);
    memcpy(e->tokens + e->n_tokens, ids, (size_t)n * sizeof(int));
    e->n_tokens += n;
    return ERR_OK;
}

err_code engine_feed_logits(engine *e, const int *ids, int n, float *logits) {
    if (e->n_tokens + n > e->ctx)
        return err_set(ERR_CONTEXT, "%d tokens do not fit: %d already in a context of %d (raise --ctx, at most %d)",
                       n, e->n_tokens, e->ctx, MODEL_SEQ_LEN);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= MODEL_VOCAB_SIZE) return err_set(ERR_ARG, "token id %d is outside the vocabulary", ids[i]);
#ifdef INGOT_CUDA
    if (e->gpu) {
        if (e->device_sampling) return err_set(ERR_ARG, "engine_feed_logits: the engine was opened without host_logits");
        for (int i = 0; i < n; i++) {
            err_code rc = engine_feed(e, ids + i, 1);
            if (rc) return rc;
            memcpy(logits + (size_t)i * MODEL_VOCAB_SIZE, e->logits, (size_t)MODEL_VOCAB_SIZE * sizeof(float));
        }
        return ERR_OK;
    }
#endif
    if (n == 0) return ERR_OK;
    model_cpu_prefill_logits(e->cpu, ids, n, e->n_tokens, logits);
    memcpy(e->tokens + e->n_tokens, ids, (size_t)n * sizeof(int));
    e->n_tokens += n;
    e->logits = logits + (size_t)(n - 1) * MODEL_VOCAB_SIZE;
    return ERR_OK;
}

err_code engine_sampler_init(engine *e, sampler *s, const sampler_config *cfg) {
    err_code rc = sampler_init(s, cfg, MODEL_VOCAB_SIZE);
#ifdef INGOT_CUDA
    if (!rc && e->gpu && (rc = model_cuda_set_sampler(e->gpu, s))) sampler_free(s);
#else
    (void)e;
#endif
    return rc;
}

err_code engine_feed_prompt(engine *e, const int *ids, int n, int reuse, int *reused) {
    int keep = 0;
    if (reuse)
        while (keep < e->n_tokens && keep < n - 1 && e->tokens[keep] == ids[keep]) keep++;
    *reused = keep;
    e->n_tokens = keep;
    return engine_feed(e, ids + keep, n - keep);
}

err_code engine_encode(const engine *e, const char *text, int add_special, int **ids, int *n) {
    return tok_encode(e->tok, text, strlen(text), add_special, ids, n);
}

/* A chosen token: 0 when it ends the turn, else its text handed to emit (-1: emit asks to stop). */
static int engine_emit(engine *e, int id, int *prev, engine_emit_fn emit, void *arg, int *produced) {
    if (is_stop(e, id)) return 0;
    int len = tok_decode_piece(e->tok, *prev, id, e->piece, (size_t)e->piece_cap);
    *prev = id;
    (*produced)++;
    if (emit && emit(arg, id, e->piece, len > 0 ? len : 0)) return -1;
    return 1;
}

/* engine_run when the GPU chooses the tokens: the step on each token is queued before the host
 * has read that token, so the device runs on while the host hands it out; a step queued on a
 * token that is not fed (an end-of-turn, one emit stopped on) is dropped. */
#ifdef INGOT_CUDA
static err_code engine_run_gpu(engine *e, int max_new, engine_emit_fn emit, void *arg, int *n_out, engine_end *end) {
    int produced = 0, prev = e->n_tokens ? e->tokens[e->n_tokens - 1] : -1, id = e->next, ahead = 0;
    err_code rc = ERR_OK;
    *end = ENGINE_END_LIMIT;
    while (!rc && (max_new < 0 || produced < max_new)) {
        int r = engine_emit(e, id, &prev, emit, arg, &produced);
        if (r <= 0) { *end = r ? ENGINE_END_CALLER : ENGINE_END_TURN; break; }
        if (e->n_tokens == e->ctx) { *end = ENGINE_END_CONTEXT; break; }
        if (!ahead && (rc = model_cuda_feed(e->gpu, &id, 1, e->n_tokens, CUDA_OUT_TOKEN))) break; /* its step */
        e->tokens[e->n_tokens++] = id;
        /* the step on id's successor, queued before the host knows it, where that token would be fed */
        ahead = (max_new < 0 || produced < max_new) && e->n_tokens < e->ctx;
        if (ahead && (rc = model_cuda_feed_choice(e->gpu))) break;
        rc = model_cuda_take(e->gpu, &id, NULL);
    }
    if (!rc && ahead) rc = model_cuda_unqueue(e->gpu); /* queued on a token not fed */
    e->next = id;
    if (n_out) *n_out = produced;
    return rc;
}
#endif

err_code engine_run(engine *e, sampler *s, int max_new, engine_emit_fn emit, void *arg, int *n_out, engine_end *end) {
#ifdef INGOT_CUDA
    if (e->device_sampling) return engine_run_gpu(e, max_new, emit, arg, n_out, end);
#endif
    int produced = 0, prev = e->n_tokens ? e->tokens[e->n_tokens - 1] : -1;
    err_code rc = ERR_OK;
    *end = ENGINE_END_LIMIT;
    while (max_new < 0 || produced < max_new) {
        memcpy(e->scratch, e->logits, (size_t)MODEL_VOCAB_SIZE * sizeof *e->scratch);
        int id = sampler_sample(s, e->scratch, e->tokens, e->n_tokens);
        int r = engine_emit(e, id, &prev, emit, arg, &produced);
        if (r <= 0) { *end = r ? ENGINE_END_CALLER : ENGINE_END_TURN; break; }
        if (e->n_tokens == e->ctx) { *end = ENGINE_END_CONTEXT; break; }
        if ((rc = engine_feed(e, &id, 1))) break;
    }
    if (n_out) *n_out = produced;
    return rc;
}

static int emit_to_file(void *file, int id, const char *piece, int len) {
    (void)id;
    if (file && len > 0) {
        fwrite(piece, 1, (size_t)len, (FILE *)file);
        fflush((FILE *)file);
    }
    return 0;
}

err_code engine_generate(engine *e, sampler *s, int max_new, FILE *out, int *n_out, int *full) {
    engine_end end;
    err_code rc = engine_run(e, s, max_new, out ? emit_to_file : NULL, out, n_out, &end);
    *full = end == ENGINE_END_CONTEXT;
    return rc;
}

// ----------------------------------------------------------------------------------------------
// Chat

/* A conversation's text and, a byte each, whether the template wrote it (control text, where
 * special tokens are tokens). */
typedef struct {
    char *text;
    unsigned char *control;
    size_t len, cap;
    int oom;
} chat_text;

static void chat_put(chat_text *c, const char *s, size_t n, int control) {
    if (c->oom) return;
    if (c->len + n + 1 > c->cap) {
        size_t cap = (c->len + n + 1) * 2;
        char *t = realloc(c->text, cap);
        if (t) c->text = t;
        unsigned char *m = realloc(c->control, cap);
        if (m) c->control = m;
        if (!t || !m) { c->oom = 1; return; }
        c->cap = cap;
    }
    memcpy(c->text + c->len, s, n);
    memset(c->control + c->len, control, n);
    c->len += n;
    c->text[c->len] = '\0';
}

static void chat_put_template(chat_text *c, const char *s) { chat_put(c, s, strlen(s), 1); }

/* The tokens of the text; content_special marks it all control. */
static err_code chat_text_encode(const engine *e, chat_text *c, int content_special, int **ids, int *n_ids) {
    err_code rc;
    if (c->oom || !c->text) rc = err_set(ERR_NOMEM, "chat text of %zu bytes", c->len);
    else rc = tok_encode_marked(e->tok, c->text, c->len, content_special ? NULL : c->control, 0, ids, n_ids);
    free(c->text);
    free(c->control);
    return rc;
}

err_code engine_chat_check(int has_system) {
    if (!MODEL_CHAT_AVAILABLE) return err_set(ERR_ARG, "%s %s", MODEL_NAME, MODEL_CHAT_REFUSAL);
    if (has_system && !MODEL_CHAT_HAS_SYSTEM) return err_set(ERR_ARG, "this model's chat template has no system role");
    return ERR_OK;
}

err_code engine_chat_encode(const engine *e, const chat_message *m, int n, int content_special, int **ids, int *n_ids) {
    int has_system = n > 0 && m[0].role == CHAT_SYSTEM;
    err_code rc = engine_chat_check(has_system);
    if (rc) return rc;
    if (n == has_system) return err_set(ERR_ARG, "messages: no user message");
    for (int i = has_system; i < n; i++)
        if (m[i].role == CHAT_SYSTEM) return err_set(ERR_ARG, "messages[%d]: a system message can only come first", i);
    if (m[n - 1].role != CHAT_USER) return err_set(ERR_ARG, "messages[%d]: the last message must be the user's", n - 1);

    chat_text c = {0};
    chat_put_template(&c, MODEL_CHAT_BOS);
    if (has_system) {
        chat_put_template(&c, MODEL_CHAT_SYSTEM_PREFIX);
        chat_put(&c, m[0].text, m[0].len, 0);
        chat_put_template(&c, MODEL_CHAT_SYSTEM_SUFFIX);
    } else {
        chat_put_template(&c, MODEL_CHAT_NO_SYSTEM_PREFIX);
    }
    for (int i = has_system; i < n; i++) {
        if (m[i].role == CHAT_USER) {
            /* a system message inside the first user turn takes that turn's opening */
            if (!(i == 1 && has_system && MODEL_CHAT_SYSTEM_IN_FIRST_USER)) chat_put_template(&c, MODEL_CHAT_USER_PREFIX);
            chat_put(&c, m[i].text, m[i].len, 0);
            chat_put_template(&c, MODEL_CHAT_USER_SUFFIX);
        } else {
            chat_put_template(&c, MODEL_CHAT_ASSISTANT_PREFIX);
            chat_put(&c, m[i].text, m[i].len, 0);
            chat_put_template(&c, MODEL_CHAT_ASSISTANT_SUFFIX);
        }
    }
    chat_put_template(&c, MODEL_CHAT_ASSISTANT_PREFIX);
    return chat_text_encode(e, &c, content_special, ids, n_ids);
}

err_code engine_chat_turn(const engine *e, const char *system, const char *user, int first, int content_special,
                          int **ids, int *n_ids) {
    chat_text c = {0};
    const char *user_prefix = MODEL_CHAT_USER_PREFIX;
    chat_put_template(&c, first ? MODEL_CHAT_BOS : MODEL_CHAT_ASSISTANT_SUFFIX);
    if (first && system) {
        chat_put_template(&c, MODEL_CHAT_SYSTEM_PREFIX);
        chat_put(&c, system, strlen(system), 0);
        chat_put_template(&c, MODEL_CHAT_SYSTEM_SUFFIX);
        if (MODEL_CHAT_SYSTEM_IN_FIRST_USER) user_prefix = "";
    } else if (first) {
        chat_put_template(&c, MODEL_CHAT_NO_SYSTEM_PREFIX);
    }
    chat_put_template(&c, user_prefix);
    chat_put(&c, user, strlen(user), 0);
    chat_put_template(&c, MODEL_CHAT_USER_SUFFIX);
    chat_put_template(&c, MODEL_CHAT_ASSISTANT_PREFIX);
    return chat_text_encode(e, &c, content_special, ids, n_ids);
}
