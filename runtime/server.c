/* server.c - `ingot --serve` (server.h): requests parsed and checked on their connection's thread,
 * queued for the one worker thread that runs the engine, answered as one JSON body or as
 * server-sent events.
 *
 * Threads: libmicrohttpd's listener and one thread per connection (MHD_USE_THREAD_PER_CONNECTION:
 * a handler may block), and the worker. Everything they share is guarded by server.lock: the
 * queue, each job's progress and the metrics. A job is shared by its connection and the worker
 * and freed by whichever lets go of it last (refs). */
#include "server.h"

#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "json.h"
#include "probe.h"

// ----------------------------------------------------------------------------------------------
// Limits

#define SERVER_MAX_BODY ((size_t)4 << 20)  /* bytes of a request body; more gets 413 */
#define SERVER_MAX_STOPS 16                /* stop strings a request may give */
#define SERVER_MAX_STOP_BYTES 512          /* bytes of one stop string */
#define SERVER_MAX_CONNECTIONS 512
#define SERVER_CHAT_MAX_TOKENS 1024        /* a chat answer without max_tokens: until the end of the turn, at most */
#define SERVER_COMPLETION_MAX_TOKENS 16    /* a completion without max_tokens, as OpenAI's default */
#define SERVER_STREAM_BLOCK 16384          /* bytes libmicrohttpd takes from a stream at once */

/* The chat page (runtime/chat_page.html), in the binary: the build compiles this file from the
 * repository root, where .incbin finds it. */
__asm__(".section .rodata\n"
        ".global ingot_chat_page\n"
        "ingot_chat_page:\n"
        ".incbin \"runtime/chat_page.html\"\n"
        ".global ingot_chat_page_end\n"
        "ingot_chat_page_end:\n"
        ".previous\n");
extern const char ingot_chat_page[], ingot_chat_page_end[];

// ----------------------------------------------------------------------------------------------
// A growing byte buffer, and JSON text written into it

typedef struct {
    char *b;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *s, const void *p, size_t n) {
    if (s->oom) return;
    if (s->len + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 256;
        while (cap < s->len + n + 1) cap *= 2;
        char *b = realloc(s->b, cap);
        if (!b) { s->oom = 1; return; }
        s->b = b;
        s->cap = cap;
    }
    memcpy(s->b + s->len, p, n);
    s->len += n;
    s->b[s->len] = '\0';
}

static void sb_puts(sbuf *s, const char *p) { sb_put(s, p, strlen(p)); }

static void sb_printf(sbuf *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *s, const char *fmt, ...) {
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof small) { sb_put(s, small, (size_t)n); return; }
    char *big = malloc((size_t)n + 1);
    if (!big) { s->oom = 1; return; }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb_put(s, big, (size_t)n);
    free(big);
}

static void sb_free(sbuf *s) {
    free(s->b);
    memset(s, 0, sizeof *s);
}

/* Bytes of the valid UTF-8 character at s[0..n) (RFC 3629: no overlong forms, no surrogates, at
 * most U+10FFFF), or 0. */
static int utf8_char_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    int len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (!len || (size_t)len > n) return 0;
    uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

/* Bytes at the end of s[0..n) that start a UTF-8 character the next bytes may complete. */
static size_t utf8_incomplete_tail(const char *s, size_t n) {
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        unsigned c = (unsigned char)s[n - k];
        if ((c & 0xC0) == 0x80) continue; /* a continuation byte: look further back */
        int want = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
        return (size_t)want > k ? k : 0;
    }
    return 0;
}

/* s[0..n) as a JSON string, quoted; bytes that are not valid UTF-8 become U+FFFD, as a decoder
 * that replaces errors shows them. */
static void sb_json_str(sbuf *b, const char *s, size_t n) {
    sb_put(b, "\"", 1);
    size_t i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') { char e[2] = {'\\', (char)c}; sb_put(b, e, 2); i++; }
        else if (c == '\n') { sb_put(b, "\\n", 2); i++; }
        else if (c == '\r') { sb_put(b, "\\r", 2); i++; }
        else if (c == '\t') { sb_put(b, "\\t", 2); i++; }
        else if (c < 0x20 || c == 0x7F) { sb_printf(b, "\\u%04x", c); i++; }
        else if (c < 0x80) { sb_put(b, s + i, 1); i++; }
        else {
            int len = utf8_char_len((const unsigned char *)s + i, n - i);
            if (len) { sb_put(b, s + i, (size_t)len); i += (size_t)len; }
            else { sb_put(b, "\xEF\xBF\xBD", 3); i++; }
        }
    }
    sb_put(b, "\"", 1);
}

static void sb_json_cstr(sbuf *b, const char *s) { sb_json_str(b, s, strlen(s)); }

// ----------------------------------------------------------------------------------------------
// Jobs: one request for the model

enum { JOB_QUEUED, JOB_RUNNING, JOB_DONE };
enum { KIND_CHAT, KIND_COMPLETION };

typedef struct job {
    struct job *next; /* in the queue */
    int refs;         /* the connection, the stream, the worker */
    pthread_cond_t changed;

    /* the request, fixed once queued */
    int kind, stream, include_usage;
    int *ids, n_ids;
    int max_tokens;
    sampler_config sampling;
    char *stop[SERVER_MAX_STOPS];
    size_t stop_len[SERVER_MAX_STOPS];
    int n_stop;
    char id[48];
    long long created; /* unix seconds */

    /* where it stands, under the server's lock */
    int state;
    int fd;           /* the client's socket, -1 once the connection is gone */
    int cancelled;    /* the client went away: stop */
    sbuf text;        /* generated text, cut where a stop string starts */
    size_t released;  /* text[0..released) can be sent: no stop string can start in it, whole characters */
    int n_generated;  /* tokens */
    int n_reused;     /* prompt tokens the cache already held */
    const char *finish; /* "stop" or "length" */
    int error_status;   /* nonzero: the request failed, with this HTTP status and message */
    char error[256];
    double t_queued, t_start, t_first, t_end; /* seconds (time_now) */
    double prompt_s;  /* feeding the prompt's tokens that the cache did not hold */
} job;

typedef struct server server;

static void job_free(job *j) {
    free(j->ids);
    for (int i = 0; i < j->n_stop; i++) free(j->stop[i]);
    sb_free(&j->text);
    pthread_cond_destroy(&j->changed);
    free(j);
}

// ----------------------------------------------------------------------------------------------
// The server

enum { ROUTE_PAGE, ROUTE_HEALTH, ROUTE_MODELS, ROUTE_METRICS, ROUTE_CHAT, ROUTE_COMPLETIONS, ROUTE_OTHER, N_ROUTES };
static const char *const route_path[N_ROUTES] = {"/", "/health", "/v1/models", "/metrics", "/v1/chat/completions",
                                                 "/v1/completions", "other"};
static const int route_post[N_ROUTES] = {0, 0, 0, 0, 1, 1, 0};
static const int status_codes[] = {200, 400, 404, 405, 413, 500, 503};
#define N_STATUS ((int)(sizeof status_codes / sizeof *status_codes))

struct server {
    engine *e;
    const server_config *cfg;
    pthread_mutex_t lock;
    pthread_cond_t work; /* the worker waits here for a job */
    job *head, *tail;    /* queued, oldest first */
    int n_waiting;
    job *running;
    int stopping;
    uint64_t n_ids_made; /* response ids and default seeds */

    /* metrics */
    unsigned long long requests[N_ROUTES][N_STATUS];
    unsigned long long prompt_tokens, cached_tokens, completion_tokens, cancelled, rejected;
    double busy_seconds, prompt_seconds, decode_seconds;
    unsigned long long decode_tokens;
    double last_decode_tok_s, last_ttft_s, mean_job_s;
};

static void job_unref(job *j) { /* under the lock */
    if (--j->refs == 0) job_free(j);
}

static int status_index(int status) {
    for (int i = 0; i < N_STATUS; i++)
        if (status_codes[i] == status) return i;
    return N_STATUS - 1;
}

// ----------------------------------------------------------------------------------------------
// The worker: one job at a time through the engine

/* Under the lock: the job's text grew by piece; cuts it at a stop string (returns 1) and moves
 * released up to what can no longer be the start of one, or half a character. */
static int job_take_piece(job *j, const char *piece, int len) {
    size_t old = j->text.len;
    sb_put(&j->text, piece, (size_t)len);
    if (j->text.oom) return 1;
    const char *t = j->text.b;
    size_t n = j->text.len, cut = SIZE_MAX;
    for (int k = 0; k < j->n_stop; k++) {
        size_t sl = j->stop_len[k], from = old >= sl - 1 ? old - (sl - 1) : 0;
        if (n < sl) continue;
        for (size_t p = from; p + sl <= n && p < cut; p++)
            if (memcmp(t + p, j->stop[k], sl) == 0) { cut = p; break; }
    }
    if (cut != SIZE_MAX) {
        j->text.len = cut < j->released ? j->released : cut; /* cannot happen: released never holds a stop's start */
        j->text.b[j->text.len] = '\0';
        j->released = j->text.len;
        return 1;
    }
    size_t hold = utf8_incomplete_tail(t, n);
    for (int k = 0; k < j->n_stop; k++)
        for (size_t h = j->stop_len[k] - 1 < n ? j->stop_len[k] - 1 : n; h > hold; h--)
            if (memcmp(t + n - h, j->stop[k], h) == 0) { hold = h; break; }
    if (n - hold > j->released) j->released = n - hold;
    return 0;
}

typedef struct {
    server *s;
    job *j;
} emit_ctx;

/* engine_run's emit: the token's text into the job; stops on a stop string or a client gone. */
static int job_emit(void *arg, int id, const char *piece, int len) {
    (void)id;
    emit_ctx *c = arg;
    server *s = c->s;
    job *j = c->j;
    pthread_mutex_lock(&s->lock);
    if (j->n_generated++ == 0) j->t_first = time_now();
    int stop = job_take_piece(j, piece, len);
    if (!stop && j->fd >= 0) {
        /* the client hung up: the socket reads end of file (or is reset); checked each token */
        struct pollfd p = {.fd = j->fd, .events = POLLRDHUP};
        if (poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) j->cancelled = 1;
    }
    stop |= j->cancelled || s->stopping;
    if (j->stream) pthread_cond_broadcast(&j->changed); /* a whole answer's connection waits for the end alone */
    pthread_mutex_unlock(&s->lock);
    return stop;
}

static void run_job(server *s, job *j) {
    engine *e = s->e;
    int reused = 0, produced = 0;
    engine_end end = ENGINE_END_LIMIT;
    double t_prompt = 0.0;
    sampler smp;
    /* the sampler first: on the GPU the step on the prompt's last token draws the first token */
    err_code rc = engine_sampler_init(e, &smp, &j->sampling);
    if (!rc) {
        double t0 = time_now();
        rc = engine_feed_prompt(e, j->ids, j->n_ids, s->cfg->prompt_cache, &reused);
        t_prompt = time_now() - t0;
        emit_ctx c = {s, j};
        if (!rc) rc = engine_run(e, &smp, j->max_tokens, job_emit, &c, &produced, &end);
        sampler_free(&smp);
    }
    pthread_mutex_lock(&s->lock);
    j->n_reused = reused;
    j->prompt_s = t_prompt;
    j->t_end = time_now();
    if (rc) {
        j->error_status = 500;
        snprintf(j->error, sizeof j->error, "%s: %s", err_name(rc), err_detail());
    }
    int cut = end == ENGINE_END_CALLER && !j->cancelled && !s->stopping && j->n_stop > 0;
    j->finish = end == ENGINE_END_TURN || cut ? "stop" : "length";
    j->released = j->text.len;
    s->prompt_tokens += (unsigned long long)j->n_ids;
    s->cached_tokens += (unsigned long long)reused;
    s->completion_tokens += (unsigned long long)j->n_generated;
    s->cancelled += (unsigned long long)j->cancelled;
    s->prompt_seconds += t_prompt;
    s->busy_seconds += j->t_end - j->t_start;
    s->mean_job_s = s->mean_job_s > 0 ? 0.8 * s->mean_job_s + 0.2 * (j->t_end - j->t_start) : j->t_end - j->t_start;
    if (j->n_generated > 0) s->last_ttft_s = j->t_first - j->t_start;
    if (j->n_generated > 1) {
        double dt = j->t_end - j->t_first;
        s->decode_seconds += dt;
        s->decode_tokens += (unsigned long long)(j->n_generated - 1);
        s->last_decode_tok_s = (j->n_generated - 1) / dt;
    }
    pthread_mutex_unlock(&s->lock);
}

static void *worker_main(void *arg) {
    server *s = arg;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (!s->head && !s->stopping) pthread_cond_wait(&s->work, &s->lock);
        if (s->stopping) break;
        job *j = s->head;
        s->head = j->next;
        if (!s->head) s->tail = NULL;
        s->n_waiting--;
        j->next = NULL;
        j->state = JOB_RUNNING;
        j->t_start = time_now();
        s->running = j;
        if (!j->cancelled) {
            pthread_mutex_unlock(&s->lock);
            run_job(s, j);
            pthread_mutex_lock(&s->lock);
        } else {
            j->t_end = j->t_start;
            j->finish = "stop";
        }
        s->running = NULL;
        j->state = JOB_DONE;
        pthread_cond_broadcast(&j->changed);
        job_unref(j);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

// ----------------------------------------------------------------------------------------------
// Requests: JSON in, a job out, or an OpenAI-shaped error

typedef struct {
    int status;
    char message[320];
    const char *param; /* the field at fault, or NULL */
    const char *type;  /* "invalid_request_error", ... */
    const char *code;  /* OpenAI's code, or NULL */
} req_error;

static int req_fail(req_error *err, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int req_fail(req_error *err, int status, const char *param, const char *code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    err->status = status;
    err->param = param;
    err->code = code;
    err->type = status == 503 ? "server_error" : status >= 500 ? "server_error" : "invalid_request_error";
    return -1;
}

/* An optional member: 0 absent (or null), 1 present and of type, -1 wrong type (err set). */
static int field(const json_value *root, const char *key, json_type type, const json_value **out, req_error *err) {
    const json_value *v = json_get(root, key);
    *out = v;
    if (!v || v->type == JSON_NULL) return 0;
    int ok = v->type == type || (type == JSON_TRUE && v->type == JSON_FALSE);
    if (!ok) {
        static const char *const names[] = {"null", "a boolean", "a boolean", "a number", "a string", "an array", "an object"};
        return req_fail(err, 400, key, NULL, "'%s' must be %s", key, names[type]);
    }
    return 1;
}

static int number_field(const json_value *root, const char *key, double lo, double hi, float *out, req_error *err) {
    const json_value *v;
    int r = field(root, key, JSON_NUMBER, &v, err);
    if (r <= 0) return r;
    if (!(v->num >= lo && v->num <= hi)) return req_fail(err, 400, key, NULL, "'%s' is %g, expected %g to %g", key, v->num, lo, hi);
    *out = (float)v->num;
    return 1;
}

static int int_field(const json_value *root, const char *key, long long lo, long long hi, long long *out, req_error *err) {
    const json_value *v;
    int r = field(root, key, JSON_NUMBER, &v, err);
    if (r <= 0) return r;
    if (!json_is_int(v) || v->num < (double)lo || v->num > (double)hi)
        return req_fail(err, 400, key, NULL, "'%s' must be an integer from %lld to %lld", key, lo, hi);
    *out = (long long)v->num;
    return 1;
}

static int bool_field(const json_value *root, const char *key, int *out, req_error *err) {
    const json_value *v;
    int r = field(root, key, JSON_TRUE, &v, err);
    if (r > 0) *out = v->type == JSON_TRUE;
    return r;
}

/* The settings both endpoints share: sampling, max_tokens, stop, stream, n. */
static int parse_common(server *s, const json_value *root, job *j, req_error *err) {
    const server_config *cfg = s->cfg;
    j->sampling = cfg->sampling;
    long long n;
    const json_value *v;
    if (int_field(root, "n", 1, 1, &n, err) < 0) return req_fail(err, 400, "n", NULL, "'n' must be 1: this server makes one choice a request");
    if (int_field(root, "best_of", 1, 1, &n, err) < 0) return req_fail(err, 400, "best_of", NULL, "'best_of' must be 1");
    if (bool_field(root, "stream", &j->stream, err) < 0) return -1;
    if (field(root, "stream_options", JSON_OBJECT, &v, err) < 0) return -1;
    if (v && v->type == JSON_OBJECT && bool_field(v, "include_usage", &j->include_usage, err) < 0) return -1;

    long long max = -1;
    int r1 = int_field(root, "max_tokens", 1, INT32_MAX, &max, err);
    if (r1 < 0) return -1;
    int r2 = int_field(root, "max_completion_tokens", 1, INT32_MAX, &max, err);
    if (r2 < 0) return -1;
    j->max_tokens = (int)max;
    if (max < 0) j->max_tokens = cfg->max_tokens >= 0 ? cfg->max_tokens
                                 : j->kind == KIND_CHAT ? SERVER_CHAT_MAX_TOKENS : SERVER_COMPLETION_MAX_TOKENS;

    if (number_field(root, "temperature", 0.0, 100.0, &j->sampling.temperature, err) < 0) return -1;
    if (number_field(root, "top_p", 0.0, 1.0, &j->sampling.top_p, err) < 0) return -1;
    if (number_field(root, "min_p", 0.0, 1.0, &j->sampling.min_p, err) < 0) return -1;
    int r = int_field(root, "top_k", 0, tok_vocab_size(s->e->tok), &n, err);
    if (r < 0) return -1;
    if (r > 0) j->sampling.top_k = (int)n;
    if (number_field(root, "repetition_penalty", 0.01, 100.0, &j->sampling.repeat_penalty, err) < 0) return -1;
    if (number_field(root, "repeat_penalty", 0.01, 100.0, &j->sampling.repeat_penalty, err) < 0) return -1;
    float pen = 0.0f;
    const char *const penalties[] = {"frequency_penalty", "presence_penalty"};
    for (int i = 0; i < 2; i++) {
        if (number_field(root, penalties[i], -2.0, 2.0, &pen, err) < 0) return -1;
        if (pen != 0.0f)
            return req_fail(err, 400, penalties[i], NULL,
                            "'%s' is not supported: use 'repetition_penalty' (ingot's, 1 = off: logits of the "
                            "last 64 tokens divided by it)", penalties[i]);
    }
    long long seed;
    r = int_field(root, "seed", INT64_MIN / 2, INT64_MAX / 2, &seed, err);
    if (r < 0) return -1;
    if (r > 0) j->sampling.seed = (uint64_t)seed;
    else if (!cfg->seed_given) j->sampling.seed = (uint64_t)(time_now() * 1e6) ^ ((uint64_t)(uintptr_t)j * 0x9E3779B97F4A7C15ull);

    const json_value *stop = json_get(root, "stop");
    if (stop && stop->type != JSON_NULL) {
        if (stop->type != JSON_STRING && stop->type != JSON_ARRAY)
            return req_fail(err, 400, "stop", NULL, "'stop' must be a string or an array of strings");
        if (stop->type == JSON_ARRAY && stop->n > SERVER_MAX_STOPS)
            return req_fail(err, 400, "stop", NULL, "'stop' holds %d strings, at most %d", stop->n, SERVER_MAX_STOPS);
        const json_value *one = stop->type == JSON_STRING ? stop : stop->child;
        for (; one; one = stop->type == JSON_STRING ? NULL : one->next) {
            if (one->type != JSON_STRING) return req_fail(err, 400, "stop", NULL, "'stop' must be a string or an array of strings");
            if (one->n == 0) continue;
            if (one->n > SERVER_MAX_STOP_BYTES)
                return req_fail(err, 400, "stop", NULL, "a stop string of %d bytes, at most %d", one->n, SERVER_MAX_STOP_BYTES);
            j->stop[j->n_stop] = malloc((size_t)one->n);
            if (!j->stop[j->n_stop]) return req_fail(err, 500, NULL, NULL, "out of memory");
            memcpy(j->stop[j->n_stop], one->str, (size_t)one->n);
            j->stop_len[j->n_stop++] = (size_t)one->n;
        }
    }
    if (field(root, "logprobs", JSON_TRUE, &v, err) < 0 && field(root, "logprobs", JSON_NUMBER, &v, err) < 0) return -1;
    if (v && v->type != JSON_NULL && v->type != JSON_FALSE)
        return req_fail(err, 400, "logprobs", NULL, "'logprobs' is not supported");
    if (field(root, "tools", JSON_ARRAY, &v, err) < 0) return -1;
    if (v && v->n > 0) return req_fail(err, 400, "tools", NULL, "'tools' is not supported");
    if (field(root, "response_format", JSON_OBJECT, &v, err) < 0) return -1;
    if (v) {
        const json_value *t = json_get(v, "type");
        if (!t || t->type != JSON_STRING || strcmp(t->str, "text") != 0)
            return req_fail(err, 400, "response_format", NULL, "'response_format' other than {\"type\": \"text\"} is not supported");
    }
    return 0;
}

/* One message's text: a string, or an array of {"type": "text", "text": ...} parts, joined. */
static int message_text(const json_value *content, int i, sbuf *out, req_error *err) {
    if (!content || content->type == JSON_NULL) return 0;
    if (content->type == JSON_STRING) { sb_put(out, content->str, (size_t)content->n); return 0; }
    if (content->type != JSON_ARRAY)
        return req_fail(err, 400, "messages", NULL, "messages[%d].content must be a string or an array of text parts", i);
    int k = 0;
    json_for_each(part, content) {
        const json_value *type = json_get(part, "type"), *text = json_get(part, "text");
        if (part->type != JSON_OBJECT || !type || type->type != JSON_STRING || strcmp(type->str, "text") != 0 || !text ||
            text->type != JSON_STRING)
            return req_fail(err, 400, "messages", NULL, "messages[%d].content[%d]: only {\"type\": \"text\", \"text\": \"...\"} parts are supported", i, k);
        sb_put(out, text->str, (size_t)text->n);
        k++;
    }
    return 0;
}

static int parse_chat(server *s, const json_value *root, job *j, req_error *err) {
    const json_value *msgs;
    int r = field(root, "messages", JSON_ARRAY, &msgs, err);
    if (r < 0) return -1;
    if (r == 0 || msgs->n == 0) return req_fail(err, 400, "messages", NULL, "'messages' must be a non-empty array");
    chat_message *m = calloc((size_t)msgs->n, sizeof *m);
    sbuf *texts = calloc((size_t)msgs->n, sizeof *texts);
    int n = 0, rc = 0;
    if (!m || !texts) rc = req_fail(err, 500, NULL, NULL, "out of memory");
    json_for_each(msg, msgs) {
        if (rc) break;
        const json_value *role = json_get(msg, "role");
        if (msg->type != JSON_OBJECT || !role || role->type != JSON_STRING) {
            rc = req_fail(err, 400, "messages", NULL, "messages[%d] must be an object with a 'role' string", n);
            break;
        }
        if (!strcmp(role->str, "system") || !strcmp(role->str, "developer")) m[n].role = CHAT_SYSTEM;
        else if (!strcmp(role->str, "user")) m[n].role = CHAT_USER;
        else if (!strcmp(role->str, "assistant")) m[n].role = CHAT_ASSISTANT;
        else {
            rc = req_fail(err, 400, "messages", NULL, "messages[%d].role '%.40s' is not supported: system, user or assistant", n, role->str);
            break;
        }
        if ((rc = message_text(json_get(msg, "content"), n, &texts[n], err))) break;
        if (texts[n].oom) { rc = req_fail(err, 500, NULL, NULL, "out of memory"); break; }
        m[n].text = texts[n].b ? texts[n].b : "";
        m[n].len = texts[n].len;
        n++;
    }
    if (!rc) {
        err_code ec = engine_chat_encode(s->e, m, n, 0, &j->ids, &j->n_ids);
        if (ec == ERR_UTF8) rc = req_fail(err, 400, "messages", NULL, "messages: %s", err_detail());
        else if (ec == ERR_ARG) rc = req_fail(err, 400, "messages", NULL, "%s", err_detail());
        else if (ec) rc = req_fail(err, 500, NULL, NULL, "%s: %s", err_name(ec), err_detail());
    }
    for (int i = 0; texts && i < msgs->n; i++) sb_free(&texts[i]);
    free(texts);
    free(m);
    return rc;
}

static int parse_completion(server *s, const json_value *root, job *j, req_error *err) {
    const json_value *p = json_get(root, "prompt"), *v;
    if (field(root, "echo", JSON_TRUE, &v, err) < 0) return -1;
    if (v && v->type == JSON_TRUE) return req_fail(err, 400, "echo", NULL, "'echo' is not supported");
    if (field(root, "suffix", JSON_STRING, &v, err) < 0) return -1;
    if (v && v->n > 0) return req_fail(err, 400, "suffix", NULL, "'suffix' is not supported");
    if (p && p->type == JSON_ARRAY && p->n == 1 && p->child->type == JSON_STRING) p = p->child;
    if (p && p->type == JSON_STRING) {
        err_code ec = tok_encode(s->e->tok, p->str, (size_t)p->n, 1, &j->ids, &j->n_ids);
        if (ec == ERR_UTF8) return req_fail(err, 400, "prompt", NULL, "prompt: %s", err_detail());
        if (ec) return req_fail(err, 500, NULL, NULL, "%s: %s", err_name(ec), err_detail());
    } else if (p && p->type == JSON_ARRAY && p->n > 0 && p->child->type == JSON_NUMBER) {
        /* token ids */
        j->ids = malloc((size_t)p->n * sizeof *j->ids);
        if (!j->ids) return req_fail(err, 500, NULL, NULL, "out of memory");
        int vocab = tok_vocab_size(s->e->tok);
        json_for_each(t, p) {
            if (!json_is_int(t) || t->num < 0 || t->num >= vocab)
                return req_fail(err, 400, "prompt", NULL, "prompt[%d]: expected a token id from 0 to %d", j->n_ids, vocab - 1);
            j->ids[j->n_ids++] = (int)t->num;
        }
    } else if (p && p->type == JSON_ARRAY && p->n > 1) {
        return req_fail(err, 400, "prompt", NULL, "'prompt' holds %d prompts: this server takes one a request", p->n);
    } else {
        return req_fail(err, 400, "prompt", NULL, "'prompt' must be a string, an array of one string or an array of token ids");
    }
    if (j->n_ids == 0) return req_fail(err, 400, "prompt", NULL, "the prompt is empty");
    return 0;
}

/* The job for a request body, or NULL and err. */
static job *job_from_body(server *s, int kind, const char *body, size_t len, req_error *err) {
    json_doc doc;
    if (json_parse(body, len, &doc)) {
        req_fail(err, 400, NULL, NULL, "the body is not valid JSON: %s", err_detail());
        return NULL;
    }
    job *j = calloc(1, sizeof *j);
    if (!j) {
        json_free(&doc);
        req_fail(err, 500, NULL, NULL, "out of memory");
        return NULL;
    }
    pthread_cond_init(&j->changed, NULL);
    j->kind = kind;
    j->fd = -1;
    int rc = doc.root->type != JSON_OBJECT ? req_fail(err, 400, NULL, NULL, "the body must be a JSON object") : 0;
    if (!rc) rc = parse_common(s, doc.root, j, err);
    if (!rc) rc = kind == KIND_CHAT ? parse_chat(s, doc.root, j, err) : parse_completion(s, doc.root, j, err);
    json_free(&doc);
    if (!rc && j->n_ids >= s->e->ctx)
        rc = req_fail(err, 400, kind == KIND_CHAT ? "messages" : "prompt", "context_length_exceeded",
                      "This model's maximum context length is %d tokens. However, your %s resulted in %d tokens, "
                      "leaving none to generate.", s->e->ctx, kind == KIND_CHAT ? "messages" : "prompt", j->n_ids);
    if (rc) {
        job_free(j);
        return NULL;
    }
    return j;
}

// ----------------------------------------------------------------------------------------------
// Responses

static enum MHD_Result respond(server *s, struct MHD_Connection *c, int route, int status, const char *type,
                               const char *body, size_t len, int copy) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, copy ? MHD_RESPMEM_MUST_COPY : MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (status == 503) {
        pthread_mutex_lock(&s->lock);
        int wait_s = (int)ceil(s->mean_job_s * (s->n_waiting + 1));
        pthread_mutex_unlock(&s->lock);
        char retry[32];
        snprintf(retry, sizeof retry, "%d", wait_s < 1 ? 1 : wait_s > 600 ? 600 : wait_s);
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, retry);
    }
    if (status == 405) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, route_post[route] ? "POST" : "GET, HEAD");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    pthread_mutex_lock(&s->lock);
    s->requests[route][status_index(status)]++;
    pthread_mutex_unlock(&s->lock);
    return ret;
}

static enum MHD_Result respond_json(server *s, struct MHD_Connection *c, int route, int status, sbuf *b) {
    if (b->oom) { sb_free(b); return MHD_NO; }
    enum MHD_Result r = respond(s, c, route, status, "application/json", b->b ? b->b : "", b->len, 1);
    sb_free(b);
    return r;
}

static void error_json(sbuf *b, const req_error *err) {
    sb_puts(b, "{\"error\": {\"message\": ");
    sb_json_cstr(b, err->message);
    sb_printf(b, ", \"type\": \"%s\", \"param\": ", err->type);
    if (err->param) sb_json_cstr(b, err->param);
    else sb_puts(b, "null");
    sb_puts(b, ", \"code\": ");
    if (err->code) sb_json_cstr(b, err->code);
    else sb_puts(b, "null");
    sb_puts(b, "}}");
}

static enum MHD_Result respond_error(server *s, struct MHD_Connection *c, int route, const req_error *err) {
    sbuf b = {0};
    error_json(&b, err);
    return respond_json(s, c, route, err->status, &b);
}

static void usage_json(sbuf *b, const job *j) {
    sb_printf(b, "\"usage\": {\"prompt_tokens\": %d, \"completion_tokens\": %d, \"total_tokens\": %d, "
                 "\"prompt_tokens_details\": {\"cached_tokens\": %d}}",
              j->n_ids, j->n_generated, j->n_ids + j->n_generated, j->n_reused);
}

/* ingot's own: where the time went (milliseconds), as llama.cpp's server reports it. */
static void timings_json(sbuf *b, const job *j) {
    double queued = j->t_start - j->t_queued, first = j->n_generated ? j->t_first - j->t_start : j->t_end - j->t_start;
    double decode = j->n_generated > 1 ? j->t_end - j->t_first : 0.0;
    sb_printf(b, "\"timings\": {\"queued_ms\": %.3f, \"first_token_ms\": %.3f, \"prompt_tokens_fed\": %d, "
                 "\"prompt_ms\": %.3f, \"decode_ms\": %.3f, \"decode_tok_s\": %.3f}",
              1e3 * queued, 1e3 * first, j->n_ids - j->n_reused, 1e3 * j->prompt_s, 1e3 * decode,
              decode > 0 ? (j->n_generated - 1) / decode : 0.0);
}

static void job_head_json(sbuf *b, const server *s, const job *j, const char *object) {
    sb_printf(b, "{\"id\": \"%s\", \"object\": \"%s\", \"created\": %lld, \"model\": ", j->id, object, j->created);
    sb_json_cstr(b, s->cfg->model_name);
    sb_puts(b, ", \"system_fingerprint\": \"ingot\"");
}

/* The whole answer of a finished job (under the lock). */
static void final_json(sbuf *b, const server *s, const job *j) {
    int chat = j->kind == KIND_CHAT;
    job_head_json(b, s, j, chat ? "chat.completion" : "text_completion");
    sb_puts(b, ", \"choices\": [{\"index\": 0, ");
    if (chat) sb_puts(b, "\"message\": {\"role\": \"assistant\", \"content\": ");
    else sb_puts(b, "\"text\": ");
    sb_json_str(b, j->text.b ? j->text.b : "", j->text.len);
    sb_printf(b, "%s, \"logprobs\": null, \"finish_reason\": \"%s\"}], ", chat ? "}" : "", j->finish);
    usage_json(b, j);
    sb_puts(b, ", ");
    timings_json(b, j);
    sb_puts(b, "}");
}

/* One server-sent event of a stream: text (may be empty), the role on the first chat chunk, the
 * finish reason on the last. */
static void chunk_json(sbuf *b, const server *s, const job *j, const char *text, size_t len, int first, const char *finish) {
    int chat = j->kind == KIND_CHAT;
    sb_puts(b, "data: ");
    job_head_json(b, s, j, chat ? "chat.completion.chunk" : "text_completion");
    sb_puts(b, ", \"choices\": [{\"index\": 0, ");
    if (chat) {
        int content = len || !finish; /* the last chunk's delta is empty */
        sb_puts(b, "\"delta\": {");
        if (first) sb_puts(b, content ? "\"role\": \"assistant\", " : "\"role\": \"assistant\"");
        if (content) {
            sb_puts(b, "\"content\": ");
            sb_json_str(b, text, len);
        }
        sb_puts(b, "}, ");
    } else {
        sb_puts(b, "\"text\": ");
        sb_json_str(b, text, len);
        sb_puts(b, ", ");
    }
    sb_puts(b, "\"logprobs\": null, \"finish_reason\": ");
    if (finish) sb_printf(b, "\"%s\"", finish);
    else sb_puts(b, "null");
    sb_puts(b, "}]");
    if (finish) {
        sb_puts(b, ", ");
        timings_json(b, j);
    }
    sb_puts(b, "}\n\n");
}

// ----------------------------------------------------------------------------------------------
// Streams

typedef struct {
    server *s;
    job *j;
    sbuf out;       /* events formatted, not yet handed to libmicrohttpd */
    size_t out_pos;
    size_t sent;    /* bytes of j->text in events so far */
    int started, ended;
} stream;

/* libmicrohttpd's content reader: blocks (this connection's thread) until the worker has more.
 * libmicrohttpd closes a connection that sent nothing for --timeout seconds, so a stream waiting
 * for the model (in the queue, feeding a long prompt) sends an SSE comment, which clients skip,
 * every half of it. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream *st = cls;
    server *s = st->s;
    job *j = st->j;
    const double keep_alive_s = s->cfg->timeout_s / 2.0;
    for (;;) {
        if (st->out_pos < st->out.len) {
            size_t n = st->out.len - st->out_pos < max ? st->out.len - st->out_pos : max;
            memcpy(buf, st->out.b + st->out_pos, n);
            st->out_pos += n;
            return (ssize_t)n;
        }
        if (st->out.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
        st->out.len = st->out_pos = 0;
        if (st->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        pthread_mutex_lock(&s->lock);
        double since = time_now();
        int quiet = 0; /* waited keep_alive_s with nothing to send */
        while (j->released == st->sent && j->state != JOB_DONE && !s->stopping && st->started) {
            double left = keep_alive_s - (time_now() - since);
            if (left <= 0) { quiet = 1; break; }
            if (left > 1.0) left = 1.0;
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            long long ns = until.tv_nsec + (long long)(left * 1e9);
            until.tv_sec += (time_t)(ns / 1000000000);
            until.tv_nsec = (long)(ns % 1000000000);
            pthread_cond_timedwait(&j->changed, &s->lock, &until);
        }
        if (quiet) {
            sb_puts(&st->out, ": waiting for the model\n\n");
            pthread_mutex_unlock(&s->lock);
            continue;
        }
        int chat = j->kind == KIND_CHAT;
        if (!st->started) {
            if (chat) chunk_json(&st->out, s, j, "", 0, 1, NULL); /* the role first, as OpenAI sends it */
            st->started = 1;
        }
        if (j->released > st->sent) {
            chunk_json(&st->out, s, j, j->text.b + st->sent, j->released - st->sent, 0, NULL);
            st->sent = j->released;
        }
        if (j->state == JOB_DONE || (s->stopping && j->state != JOB_RUNNING)) {
            if (j->error_status || j->state != JOB_DONE) {
                req_error err;
                if (j->error_status) req_fail(&err, j->error_status, NULL, NULL, "%s", j->error);
                else req_fail(&err, 503, NULL, NULL, "the server is shutting down");
                sb_puts(&st->out, "data: ");
                error_json(&st->out, &err);
                sb_puts(&st->out, "\n\n");
            } else {
                chunk_json(&st->out, s, j, "", 0, 0, j->finish);
                if (j->include_usage) {
                    sb_puts(&st->out, "data: ");
                    job_head_json(&st->out, s, j, chat ? "chat.completion.chunk" : "text_completion");
                    sb_puts(&st->out, ", \"choices\": [], ");
                    usage_json(&st->out, j);
                    sb_puts(&st->out, "}\n\n");
                }
            }
            sb_puts(&st->out, "data: [DONE]\n\n");
            st->ended = 1;
        }
        pthread_mutex_unlock(&s->lock);
    }
}

static void stream_free(void *cls) {
    stream *st = cls;
    pthread_mutex_lock(&st->s->lock);
    if (!st->ended) st->j->cancelled = 1; /* the response ended early: the client is gone */
    job_unref(st->j);
    pthread_mutex_unlock(&st->s->lock);
    sb_free(&st->out);
    free(st);
}

// ----------------------------------------------------------------------------------------------
// HTTP

typedef struct {
    int route;
    sbuf body;
    int too_large;
    job *j; /* the connection's reference, once queued */
} request;

static int route_of(const char *url) {
    for (int r = 0; r < ROUTE_OTHER; r++)
        if (strcmp(url, route_path[r]) == 0) return r;
    return ROUTE_OTHER;
}

static void metrics_text(server *s, sbuf *b) {
    pthread_mutex_lock(&s->lock);
    sb_puts(b, "# HELP ingot_requests_total HTTP requests answered, by path and status.\n"
               "# TYPE ingot_requests_total counter\n");
    for (int r = 0; r < N_ROUTES; r++)
        for (int k = 0; k < N_STATUS; k++)
            if (s->requests[r][k])
                sb_printf(b, "ingot_requests_total{path=\"%s\",code=\"%d\"} %llu\n", route_path[r], status_codes[k], s->requests[r][k]);
    sb_printf(b,
              "# HELP ingot_prompt_tokens_total Prompt tokens of finished generations.\n"
              "# TYPE ingot_prompt_tokens_total counter\n"
              "ingot_prompt_tokens_total %llu\n"
              "# HELP ingot_prompt_tokens_cached_total Prompt tokens the KV cache already held (not fed again).\n"
              "# TYPE ingot_prompt_tokens_cached_total counter\n"
              "ingot_prompt_tokens_cached_total %llu\n"
              "# HELP ingot_completion_tokens_total Tokens generated.\n"
              "# TYPE ingot_completion_tokens_total counter\n"
              "ingot_completion_tokens_total %llu\n"
              "# HELP ingot_generations_cancelled_total Generations stopped because their client went away.\n"
              "# TYPE ingot_generations_cancelled_total counter\n"
              "ingot_generations_cancelled_total %llu\n"
              "# HELP ingot_requests_rejected_total Requests answered 503 because the queue was full.\n"
              "# TYPE ingot_requests_rejected_total counter\n"
              "ingot_requests_rejected_total %llu\n"
              "# HELP ingot_busy_seconds_total Seconds the model spent on requests.\n"
              "# TYPE ingot_busy_seconds_total counter\n"
              "ingot_busy_seconds_total %.6f\n"
              "# HELP ingot_prompt_seconds_total Seconds spent feeding prompts.\n"
              "# TYPE ingot_prompt_seconds_total counter\n"
              "ingot_prompt_seconds_total %.6f\n"
              "# HELP ingot_decode_tokens_per_second Decode speed over every generation so far (tokens after the first).\n"
              "# TYPE ingot_decode_tokens_per_second gauge\n"
              "ingot_decode_tokens_per_second %.3f\n"
              "# HELP ingot_last_decode_tokens_per_second Decode speed of the last generation.\n"
              "# TYPE ingot_last_decode_tokens_per_second gauge\n"
              "ingot_last_decode_tokens_per_second %.3f\n"
              "# HELP ingot_last_time_to_first_token_seconds From the start of the last generation to its first token.\n"
              "# TYPE ingot_last_time_to_first_token_seconds gauge\n"
              "ingot_last_time_to_first_token_seconds %.6f\n"
              "# HELP ingot_queue_length Requests waiting for the model.\n"
              "# TYPE ingot_queue_length gauge\n"
              "ingot_queue_length %d\n"
              "# HELP ingot_queue_capacity Requests that may wait (--queue).\n"
              "# TYPE ingot_queue_capacity gauge\n"
              "ingot_queue_capacity %d\n"
              "# HELP ingot_busy Whether the model is generating (1) or idle (0).\n"
              "# TYPE ingot_busy gauge\n"
              "ingot_busy %d\n",
              s->prompt_tokens, s->cached_tokens, s->completion_tokens, s->cancelled, s->rejected, s->busy_seconds,
              s->prompt_seconds, s->decode_seconds > 0 ? s->decode_tokens / s->decode_seconds : 0.0, s->last_decode_tok_s,
              s->last_ttft_s, s->n_waiting, s->cfg->queue, s->running != NULL);
    pthread_mutex_unlock(&s->lock);
}

/* A complete POST to a model endpoint: parse, queue, and answer or start the stream. */
static enum MHD_Result serve_generation(server *s, struct MHD_Connection *c, request *rq) {
    req_error err = {0};
    job *j = job_from_body(s, rq->route == ROUTE_CHAT ? KIND_CHAT : KIND_COMPLETION, rq->body.b ? rq->body.b : "",
                           rq->body.len, &err);
    if (!j) return respond_error(s, c, rq->route, &err);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);

    pthread_mutex_lock(&s->lock);
    if (s->stopping || s->n_waiting >= s->cfg->queue + (s->running ? 0 : 1)) {
        if (!s->stopping) s->rejected++;
        pthread_mutex_unlock(&s->lock);
        job_free(j);
        req_fail(&err, 503, NULL, NULL, s->stopping ? "the server is shutting down"
                                                    : "the server is busy: %d requests are waiting; retry later",
                 s->cfg->queue);
        return respond_error(s, c, rq->route, &err);
    }
    uint64_t n = ++s->n_ids_made;
    j->created = (long long)time(NULL);
    snprintf(j->id, sizeof j->id, "%s-%llx%08llx", j->kind == KIND_CHAT ? "chatcmpl" : "cmpl", (unsigned long long)j->created,
             (unsigned long long)n);
    j->fd = ci ? ci->connect_fd : -1;
    j->t_queued = time_now();
    j->refs = 2; /* the connection and the worker */
    if (s->tail) s->tail->next = j;
    else s->head = j;
    s->tail = j;
    s->n_waiting++;
    rq->j = j;
    pthread_cond_signal(&s->work);

    if (j->stream) {
        stream *st = calloc(1, sizeof *st);
        if (!st) { pthread_mutex_unlock(&s->lock); return MHD_NO; }
        st->s = s;
        st->j = j;
        j->refs++;
        pthread_mutex_unlock(&s->lock);
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, SERVER_STREAM_BLOCK, stream_read, st, stream_free);
        if (!r) { stream_free(st); return MHD_NO; }
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
        MHD_destroy_response(r);
        pthread_mutex_lock(&s->lock);
        s->requests[rq->route][status_index(200)]++;
        pthread_mutex_unlock(&s->lock);
        return ret;
    }

    /* one body: wait for the worker (a client that hangs up meanwhile stops it) */
    while (j->state != JOB_DONE && !(s->stopping && j->state == JOB_QUEUED)) pthread_cond_wait(&j->changed, &s->lock);
    sbuf b = {0};
    int status = 200;
    if (j->state != JOB_DONE || j->error_status) {
        req_fail(&err, j->error_status ? j->error_status : 503, NULL, NULL, "%s", j->error_status ? j->error : "the server is shutting down");
        error_json(&b, &err);
        status = err.status;
    } else {
        final_json(&b, s, j);
    }
    pthread_mutex_unlock(&s->lock);
    return respond_json(s, c, rq->route, status, &b);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size, void **con_cls) {
    (void)version;
    server *s = cls;
    request *rq = *con_cls;
    if (!rq) {
        rq = calloc(1, sizeof *rq);
        if (!rq) return MHD_NO;
        rq->route = route_of(url);
        *con_cls = rq;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > SERVER_MAX_BODY) rq->too_large = 1;
        if (!rq->too_large) return MHD_YES; /* the body, if any, comes in the next calls */
    }
    req_error err = {0};
    if (*upload_data_size) {
        if (!rq->too_large && rq->body.len + *upload_data_size > SERVER_MAX_BODY) {
            rq->too_large = 1;
            sb_free(&rq->body);
        }
        if (!rq->too_large) sb_put(&rq->body, upload_data, *upload_data_size);
        *upload_data_size = 0;
        if (!rq->too_large) return MHD_YES;
    }
    if (rq->too_large) {
        req_fail(&err, 413, NULL, NULL, "the request body is larger than %zu bytes", SERVER_MAX_BODY);
        return respond_error(s, c, rq->route, &err);
    }
    if (rq->body.oom) {
        req_fail(&err, 500, NULL, NULL, "out of memory for the request body");
        return respond_error(s, c, rq->route, &err);
    }
    int get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    if (rq->route == ROUTE_OTHER) {
        req_fail(&err, 404, NULL, NULL, "no such path: %.200s (try /v1/chat/completions, /v1/completions, /v1/models, /health, /metrics or /)", url);
        return respond_error(s, c, rq->route, &err);
    }
    if (route_post[rq->route] ? !post : !get) {
        req_fail(&err, 405, NULL, NULL, "%.200s takes %s, not %.20s", url, route_post[rq->route] ? "POST" : "GET", method);
        return respond_error(s, c, rq->route, &err);
    }
    sbuf b = {0};
    switch (rq->route) {
    case ROUTE_PAGE:
        return respond(s, c, rq->route, 200, "text/html; charset=utf-8", ingot_chat_page,
                       (size_t)(ingot_chat_page_end - ingot_chat_page), 0);
    case ROUTE_HEALTH:
        sb_puts(&b, "{\"status\": \"ok\", \"model\": ");
        sb_json_cstr(&b, s->cfg->model_name);
        sb_printf(&b, ", \"device\": \"%s\"}", s->e->gpu ? "cuda" : "cpu");
        return respond_json(s, c, rq->route, 200, &b);
    case ROUTE_MODELS:
        sb_puts(&b, "{\"object\": \"list\", \"data\": [{\"id\": ");
        sb_json_cstr(&b, s->cfg->model_name);
        sb_printf(&b, ", \"object\": \"model\", \"created\": 0, \"owned_by\": \"ingot\", \"context_length\": %d}]}", s->e->ctx);
        return respond_json(s, c, rq->route, 200, &b);
    case ROUTE_METRICS: {
        metrics_text(s, &b);
        if (b.oom) { sb_free(&b); return MHD_NO; }
        enum MHD_Result r = respond(s, c, rq->route, 200, "text/plain; version=0.0.4", b.b, b.len, 1);
        sb_free(&b);
        return r;
    }
    default:
        return serve_generation(s, c, rq);
    }
}

/* The connection is done with its request: drop its job (a queued job whose client left never
 * runs; a running one stops at its next token). */
static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)c;
    server *s = cls;
    request *rq = *con_cls;
    if (!rq) return;
    if (rq->j) {
        job *j = rq->j;
        pthread_mutex_lock(&s->lock);
        j->fd = -1; /* the socket closes after this: never poll it again */
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && j->state != JOB_DONE) j->cancelled = 1;
        if (j->cancelled && j->state == JOB_QUEUED) { /* out of the queue */
            job **p = &s->head, *prev = NULL;
            while (*p && *p != j) { prev = *p; p = &(*p)->next; }
            if (*p) {
                *p = j->next;
                if (s->tail == j) s->tail = prev;
                s->n_waiting--;
                j->state = JOB_DONE;
                s->cancelled++;
                pthread_cond_broadcast(&j->changed);
                j->refs--; /* the worker's reference: the connection's is still held */
            }
        }
        job_unref(j);
        pthread_mutex_unlock(&s->lock);
    }
    sb_free(&rq->body);
    free(rq);
    *con_cls = NULL;
}

// ----------------------------------------------------------------------------------------------
// Running

static err_code listen_address(const server_config *cfg, struct sockaddr_storage *addr, int *v6) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res;
    char port[16];
    snprintf(port, sizeof port, "%d", cfg->port);
    int rc = getaddrinfo(cfg->host, port, &hints, &res);
    if (rc) return err_set(ERR_ARG, "--host %s: %s", cfg->host, gai_strerror(rc));
    memcpy(addr, res->ai_addr, res->ai_addrlen);
    *v6 = res->ai_family == AF_INET6;
    freeaddrinfo(res);
    return ERR_OK;
}

err_code server_run(engine *e, const server_config *cfg) {
    server s = {.e = e, .cfg = cfg};
    struct sockaddr_storage addr;
    int v6 = 0;
    err_code rc = listen_address(cfg, &addr, &v6);
    if (rc) return rc;

    /* SIGINT and SIGTERM go to sigwait below, not to the threads started from here */
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
    signal(SIGPIPE, SIG_IGN);

    pthread_mutex_init(&s.lock, NULL);
    pthread_cond_init(&s.work, NULL);
    pthread_t worker;
    if (pthread_create(&worker, NULL, worker_main, &s)) return err_set(ERR_NOMEM, "the worker thread");

    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | (v6 ? MHD_USE_IPv6 : 0);
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)cfg->port, NULL, NULL, on_request, &s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, &s, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->timeout_s,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)SERVER_MAX_CONNECTIONS, MHD_OPTION_END);
    if (!d) {
        int why = errno;
        rc = err_set(ERR_IO, "cannot listen on %s port %d: %s", cfg->host, cfg->port, why ? strerror(why) : "libmicrohttpd refused");
    } else {
        const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
        int port = di ? di->port : cfg->port;
        fprintf(stderr, "ingot: serving %s on http://%s%s%s:%d/ (context %d tokens, queue %d%s)\n", cfg->model_name,
                v6 ? "[" : "", cfg->host, v6 ? "]" : "", port, e->ctx, cfg->queue, cfg->prompt_cache ? "" : ", no prompt cache");
        int sig;
        sigwait(&stop_signals, &sig);
        fprintf(stderr, "ingot: stopping (%s)\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    }

    /* stop: the worker ends its job at the next token, waiting connections answer 503 */
    pthread_mutex_lock(&s.lock);
    s.stopping = 1;
    pthread_cond_broadcast(&s.work);
    for (job *j = s.head; j; j = j->next) pthread_cond_broadcast(&j->changed);
    if (s.running) pthread_cond_broadcast(&s.running->changed);
    pthread_mutex_unlock(&s.lock);
    pthread_join(worker, NULL);
    pthread_mutex_lock(&s.lock);
    for (job *j = s.head, *next; j; j = next) { /* the jobs the worker never took */
        next = j->next;
        j->next = NULL;
        pthread_cond_broadcast(&j->changed);
        job_unref(j);
    }
    s.head = s.tail = NULL;
    pthread_mutex_unlock(&s.lock);
    if (d) MHD_stop_daemon(d);
    pthread_cond_destroy(&s.work);
    pthread_mutex_destroy(&s.lock);
    return rc;
}
