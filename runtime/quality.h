/* quality.h - a model's quality on a text, as llama.cpp's perplexity tool measures it: the negative
 * log-likelihood of each scored token, and against a base model's saved log-probabilities the KL
 * divergence, top-1 agreement and the perplexity ratio (docs/quality.md).
 *
 * Model-agnostic: everything here works on one position's logits (n_vocab floats) and on the base
 * file's bytes; main.c runs the model over the text's chunks and prints the figures.
 *
 * The KL base file, little-endian:
 *   header   char magic[8] "INGOTKLB", u32 version (1), u32 n_vocab, u32 n_ctx, u32 n_chunk,
 *            i32 tokens[n_chunk * n_ctx] (the text's tokens, before any BOS replaces a chunk's first)
 *   records  n_chunk * (n_ctx - 1 - n_ctx / 2) of KL_RECORD_BYTES(n_vocab), one a scored position:
 *            f32 scale, f32 min_log_prob, i32 top (the base's argmax), f32 nll (the base's negative
 *            log-likelihood of the next token, exact), u16 q[n_vocab]: log-prob = scale * q +
 *            min_log_prob, where q = 0 stands for every log-prob below the top's minus KL_RANGE.
 * As llama.cpp's base file does, 2 bytes a vocabulary entry (the 50k-token text at n_ctx 512 and
 * SmolLM2's 49,152 tokens: 2.5 GB, against 5 GB of float32 logits); the step of 16 / 65535 nats
 * moves the mean KL by less than 1e-5 (tests/test_quality.py). */
#ifndef INGOT_QUALITY_H
#define INGOT_QUALITY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "errors.h"

#define KL_MAGIC "INGOTKLB"
#define KL_VERSION 1
/* nats below the top log-probability that a base record resolves; KL terms of base log-probs below
 * -KL_RANGE are left out, as llama.cpp leaves them out */
#define KL_RANGE 16.0f
#define KL_RECORD_HEAD 16 /* bytes: scale, min_log_prob, top, nll */
#define KL_RECORD_BYTES(n_vocab) ((size_t)KL_RECORD_HEAD + 2 * (size_t)(n_vocab))

/* The negative log-likelihood of token target under logits (n_vocab), in nats; *top gets the argmax
 * (the first of equal ones). */
double quality_nll(const float *logits, int n_vocab, int target, int *top);

/* Encodes logits (n_vocab) and the next token into one base record of KL_RECORD_BYTES(n_vocab). */
void kl_record_encode(const float *logits, int n_vocab, int target, unsigned char *rec);

/* ERR_FORMAT when a record read back cannot be one that kl_record_encode wrote (a scale or
 * log-probability that is not finite, a top outside the vocabulary), naming path and its index. */
err_code kl_record_check(const unsigned char *rec, int n_vocab, const char *path, long index);

/* KL(base || model) at one position, in nats, from the base's record and the model's logits;
 * *base_top and *base_nll get the record's. */
double kl_record_compare(const unsigned char *rec, int n_vocab, const float *logits, int *base_top, double *base_nll);

/* Writes the header of a base file for the text's tokens (n_chunk * n_ctx of them). */
err_code kl_base_write_header(FILE *f, const char *path, int n_vocab, int n_ctx, int n_chunk, const int *tokens);

/* Opens a base file to compare this run against, refusing in one line one whose magic, version,
 * vocabulary, n_ctx, chunk count, tokens (another text or tokenizer) or size are not this run's.
 * *f is left at the first record. */
err_code kl_base_open(FILE **f, const char *path, int n_vocab, int n_ctx, int n_chunk, const int *tokens);

/* The mean of count values from their sum and sum of squares, and its standard error (0 for fewer
 * than two values or no spread), as llama.cpp's perplexity tool reports them. */
void quality_mean_err(double sum, double sum2, long count, double *mean, double *err);

#endif
