/* sampler.h - turns a step's logits into the next token id.
 *
 * Order of operations, as llama.cpp and Hugging Face apply them: repetition penalty over the
 * recent tokens (logit / p if positive, * p if negative), then greedy argmax if temperature == 0,
 * else temperature, top-k, top-p (nucleus), min-p (relative to the top probability) and a draw
 * from the remaining distribution with a seeded xorshift generator: the same seed and logits
 * give the same tokens on every machine. */
#ifndef INGOT_SAMPLER_H
#define INGOT_SAMPLER_H

#include <stdint.h>

#include "errors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    float temperature;    /* 0: greedy */
    int top_k;            /* 0: off */
    float top_p;          /* 1: off */
    float min_p;          /* 0: off */
    float repeat_penalty; /* 1: off */
    int repeat_last_n;    /* how many recent tokens the penalty looks at */
    uint64_t seed;
} sampler_config;

typedef struct {
    sampler_config cfg;
    int vocab_size;
    uint64_t rng_state;
    void *scratch; /* (vocab_size) candidates, sorted by the top-k/top-p stages */
} sampler;

/* Checks the config (temperature >= 0, 0 <= top_p <= 1, ...; ERR_ARG naming the field) and
 * allocates scratch for vocab_size candidates. */
err_code sampler_init(sampler *s, const sampler_config *cfg, int vocab_size);

/* Picks the next token. logits (vocab_size) is modified in place. history holds the ids seen so
 * far (prompt and generated), oldest first; only the last repeat_last_n are penalised. */
int sampler_sample(sampler *s, float *logits, const int *history, int n_history);

void sampler_free(sampler *s);

#ifdef __cplusplus
}
#endif

#endif
