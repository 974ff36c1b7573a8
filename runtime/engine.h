/* engine.h - one model ready to run: its mapped weights, its tokenizer, the decode step on the CPU
 * or the GPU, the tokens in its KV cache, and its chat template's text around each turn.
 *
 * The command line (main.c) and the HTTP server (server.c) drive the same engine. It is compiled
 * once per model, against that model's generated headers (or the generic build's); this header
 * names none of them, so callers need not be. One thread at a time may use an engine. */
#ifndef INGOT_ENGINE_H
#define INGOT_ENGINE_H

#include <stdio.h>

#include "errors.h"
#include "safetensors.h"
#include "sampler.h"
#include "tokenizer.h"

typedef struct model_cpu model_cpu;
typedef struct model_cuda model_cuda;

typedef struct {
    const char *model_dir;
    int ctx;         /* tokens of KV cache (1..MODEL_SEQ_LEN) */
    int n_threads;   /* CPU threads */
    int cuda;        /* run on the GPU (a build with INGOT_CUDA) */
    int host_logits; /* the GPU sends each step's logits to the host (perplexity, logits dumps) */
    int check_weights; /* scan the weights for NaN and infinity at load (--check-weights) */
    int kv_cache;      /* the KV cache's element type, a kv_cache_type (model.h): --kv-cache */
    int exact_prompt;  /* the GPU feeds several tokens a step each, not in its prompt path's batches */
} engine_config;

typedef struct {
    st_model *st;
    const void **weights; /* (n_tensors) each tensor's bytes in the mapping, in model_tensor_specs' order */
    tokenizer *tok;
    model_cpu *cpu;       /* one of cpu and gpu runs the model */
    model_cuda *gpu;
    int device_sampling;  /* the GPU picks the next token: only token ids cross to the host */
    int exact_prompt;     /* engine_config's */
    int ctx;
    int *tokens;          /* (ctx) ids in the KV cache, oldest first */
    int n_tokens;
    const float *logits;  /* (vocab) after the last token fed, unless device_sampling */
    int next;             /* the device's choice after the last token fed, if device_sampling */
    char *piece;          /* (piece_cap) the bytes of one decoded token */
    int piece_cap;
    int *stop_ids;        /* (n_stop) eos ids and the chat template's end-of-turn ids */
    int n_stop;
    float *scratch;       /* (vocab) the sampler's working copy of the logits */
} engine;

/* Maps and checks the weights, loads the tokenizer and starts the decode step. On error the engine
 * still needs engine_close. */
err_code engine_open(engine *e, const engine_config *c);
void engine_close(engine *e);

/* Runs ids[0..n) through the model after the n_tokens already cached (ERR_CONTEXT when they do
 * not fit); then e->logits (or e->next) belong to the last of them. Setting e->n_tokens lower
 * first drops the cache after that point: what is fed next overwrites it. On the GPU several
 * tokens go through the prompt path, its tensor cores taking bf16 (or fp16) inputs, so their sums
 * are not the CPU's (tests/test_gpu.py, GPU_PROMPT_TOLERANCE); with exact_prompt a step each. */
err_code engine_feed(engine *e, const int *ids, int n);

/* engine_feed, writing the logits after each of ids[0..n) to logits (n, vocab): perplexity's scored
 * positions. The CPU runs them in prefill batches; the GPU, whose prompt path keeps only the last
 * token's logits, one step a token. */
err_code engine_feed_logits(engine *e, const int *ids, int n, float *logits);

/* The prompt cache: keeps the longest run of cached tokens that starts ids (all of ids but the
 * last at most, whose logits are needed), feeds the rest, and says in *reused how many tokens it
 * kept. reuse 0 feeds every token from position 0. */
err_code engine_feed_prompt(engine *e, const int *ids, int n, int reuse, int *reused);

/* sampler_init, and on the GPU the same settings and seed for the device's draws. */
err_code engine_sampler_init(engine *e, sampler *s, const sampler_config *cfg);

/* Why generation ended. */
typedef enum {
    ENGINE_END_TURN,    /* the model chose an end-of-turn token (not emitted, not fed) */
    ENGINE_END_LIMIT,   /* max_new tokens emitted */
    ENGINE_END_CONTEXT, /* the context is full */
    ENGINE_END_CALLER,  /* emit asked to stop */
} engine_end;

/* Called with each chosen token and its text (len bytes, part of a UTF-8 character at times);
 * returns nonzero to stop after it. */
typedef int (*engine_emit_fn)(void *arg, int id, const char *piece, int len);

/* Samples up to max_new tokens (-1: no limit) after what was fed, handing each to emit (may be
 * NULL); *n_out (may be NULL) gets their count and *end why it stopped. Every emitted token but
 * the last is in the cache afterwards. */
err_code engine_run(engine *e, sampler *s, int max_new, engine_emit_fn emit, void *arg, int *n_out, engine_end *end);

/* engine_run streaming the text to out (may be NULL); *full is set when the context ran out. */
err_code engine_generate(engine *e, sampler *s, int max_new, FILE *out, int *n_out, int *full);

/* The tokens of a text; with add_special, the tokenizer's own special tokens around it (BOS). */
err_code engine_encode(const engine *e, const char *text, int add_special, int **ids, int *n);

// ----------------------------------------------------------------------------------------------
// Chat: the model's template around each turn (model_chat.h)

typedef enum { CHAT_SYSTEM, CHAT_USER, CHAT_ASSISTANT } chat_role;

typedef struct {
    chat_role role;
    const char *text;
    size_t len; /* bytes */
} chat_message;

/* Whether this model can chat (ERR_ARG saying why not), and take a system message. */
err_code engine_chat_check(int has_system);

/* The tokens of a conversation as the model's template writes it, ending where the assistant
 * speaks next: an optional system message first, then user and assistant messages, the last from
 * the user. The template's own text may hold special tokens; the messages' text is plain text
 * (a user cannot write "<|im_end|>" and close a turn) unless content_special. ERR_ARG names the
 * message that breaks the rules. */
err_code engine_chat_encode(const engine *e, const chat_message *m, int n, int content_special, int **ids, int *n_ids);

/* The tokens the command line's interactive chat feeds for one user turn: the first opens the
 * conversation (with the system message, if any), a later one closes the previous answer first. */
err_code engine_chat_turn(const engine *e, const char *system, const char *user, int first, int content_special,
                          int **ids, int *n_ids);

#endif
