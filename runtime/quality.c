/* quality.c - perplexity and KL-divergence figures of one position's logits, and the KL base file
 * (quality.h). The formulas are llama.cpp's (tools/perplexity/perplexity.cpp), so that the figures
 * compare with its published ones: log-softmax with a float32 max and a double sum of exponentials,
 * base log-probabilities kept 16 nats below the top and resolved in 65535 steps, KL terms of base
 * log-probabilities below -16 left out. Bad base files are refused with ERR_IO: a file that cannot
 * be read as what it claims to be. */
#include "quality.h"

#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>

/* The max and argmax of logits, and log(sum(exp(logits - max))). */
static void log_sum_exp(const float *logits, int n_vocab, float *max, int *top, double *lse) {
    float m = logits[0];
    int t = 0;
    for (int i = 1; i < n_vocab; i++)
        if (logits[i] > m) { m = logits[i]; t = i; }
    double sum = 0.0;
    for (int i = 0; i < n_vocab; i++) sum += expf(logits[i] - m);
    *max = m;
    *top = t;
    *lse = log(sum);
}

double quality_nll(const float *logits, int n_vocab, int target, int *top) {
    float max;
    double lse;
    log_sum_exp(logits, n_vocab, &max, top, &lse);
    return (double)max + lse - (double)logits[target];
}

// ----------------------------------------------------------------------------------------------
// Records

typedef struct {
    float scale, min_log_prob;
    int32_t top;
    float nll;
} kl_record_head;
_Static_assert(sizeof(kl_record_head) == KL_RECORD_HEAD, "a record's head is four 32-bit fields");

void kl_record_encode(const float *logits, int n_vocab, int target, unsigned char *rec) {
    float max;
    int top;
    double lse;
    log_sum_exp(logits, n_vocab, &max, &top, &lse);
    float min = logits[0];
    for (int i = 1; i < n_vocab; i++) min = logits[i] < min ? logits[i] : min;
    if (min < max - KL_RANGE) min = max - KL_RANGE;
    kl_record_head h = {.scale = (max - min) / 65535.0f, .min_log_prob = (float)((double)min - max - lse), .top = top,
                        .nll = (float)((double)max + lse - (double)logits[target])};
    memcpy(rec, &h, sizeof h);
    uint16_t *q = (uint16_t *)(rec + KL_RECORD_HEAD); /* 2-byte aligned: records are of even size in malloc'd buffers */
    const float inv = h.scale > 0.0f ? 1.0f / h.scale : 0.0f;
    for (int i = 0; i < n_vocab; i++) {
        float v = logits[i] > min ? nearbyintf(inv * (logits[i] - min)) : 0.0f;
        q[i] = (uint16_t)(v > 65535.0f ? 65535.0f : v);
    }
}

err_code kl_record_check(const unsigned char *rec, int n_vocab, const char *path, long index) {
    kl_record_head h;
    memcpy(&h, rec, sizeof h);
    if (!isfinite(h.scale) || h.scale < 0.0f || h.scale > KL_RANGE / 65535.0f * 1.001f || !isfinite(h.min_log_prob) ||
        h.min_log_prob > 0.0f)
        return err_set(ERR_IO, "%s: record %ld: scale %g and min log-prob %g, expected a finite scale in 0..%g and a log-prob <= 0",
                       path, index, h.scale, h.min_log_prob, KL_RANGE / 65535.0f);
    if (h.top < 0 || h.top >= n_vocab)
        return err_set(ERR_IO, "%s: record %ld: top token %d, expected 0..%d", path, index, (int)h.top, n_vocab - 1);
    if (!isfinite(h.nll) || h.nll < 0.0f)
        return err_set(ERR_IO, "%s: record %ld: negative log-likelihood %g, expected a finite value >= 0", path, index, h.nll);
    return ERR_OK;
}

double kl_record_compare(const unsigned char *rec, int n_vocab, const float *logits, int *base_top, double *base_nll) {
    kl_record_head h;
    memcpy(&h, rec, sizeof h);
    const uint16_t *q = (const uint16_t *)(rec + KL_RECORD_HEAD);
    float max;
    int top;
    double lse;
    log_sum_exp(logits, n_vocab, &max, &top, &lse);
    const double norm = (double)max + lse; /* the model's log-prob of i: logits[i] - norm */
    double kl = 0.0;
    for (int i = 0; i < n_vocab; i++) {
        const float lp_base = h.scale * q[i] + h.min_log_prob;
        if (lp_base > -KL_RANGE) kl += expf(lp_base) * ((double)lp_base - ((double)logits[i] - norm));
    }
    *base_top = h.top;
    *base_nll = h.nll;
    return kl;
}

// ----------------------------------------------------------------------------------------------
// The base file

typedef struct {
    char magic[8];
    uint32_t version, n_vocab, n_ctx, n_chunk;
} kl_file_head;
_Static_assert(sizeof(kl_file_head) == 24, "the file's head is 24 bytes");

err_code kl_base_write_header(FILE *f, const char *path, int n_vocab, int n_ctx, int n_chunk, const int *tokens) {
    kl_file_head h = {.version = KL_VERSION, .n_vocab = (uint32_t)n_vocab, .n_ctx = (uint32_t)n_ctx, .n_chunk = (uint32_t)n_chunk};
    memcpy(h.magic, KL_MAGIC, 8);
    size_t n = (size_t)n_chunk * n_ctx;
    if (fwrite(&h, sizeof h, 1, f) != 1 || fwrite(tokens, sizeof(int32_t), n, f) != n)
        return err_set(ERR_IO, "%s: write failed", path);
    return ERR_OK;
}

err_code kl_base_open(FILE **out, const char *path, int n_vocab, int n_ctx, int n_chunk, const int *tokens) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return err_set(ERR_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    kl_file_head h;
    err_code rc = ERR_OK;
    if (fstat(fileno(f), &st) || !S_ISREG(st.st_mode)) rc = err_set(ERR_IO, "%s: not a regular file", path);
    else if (fread(&h, sizeof h, 1, f) != 1 || memcmp(h.magic, KL_MAGIC, 8) != 0)
        rc = err_set(ERR_IO, "%s: not a KL base file (no \"%s\" at its start; write one with --kl-base)", path, KL_MAGIC);
    else if (h.version != KL_VERSION) rc = err_set(ERR_IO, "%s: KL base file version %u, expected %d", path, h.version, KL_VERSION);
    else if (h.n_vocab != (uint32_t)n_vocab)
        rc = err_set(ERR_IO, "%s: a vocabulary of %u tokens, this model's is %d (another model family)", path, h.n_vocab, n_vocab);
    else if (h.n_ctx != (uint32_t)n_ctx) rc = err_set(ERR_IO, "%s: written with --ctx %u, this run has --ctx %d", path, h.n_ctx, n_ctx);
    else if (h.n_chunk != (uint32_t)n_chunk)
        rc = err_set(ERR_IO, "%s: %u chunks of %d tokens, the text here has %d (another text or tokenizer)", path, h.n_chunk, n_ctx, n_chunk);
    if (rc) { fclose(f); return rc; }
    const long long n_scored = (long long)n_chunk * (n_ctx - 1 - n_ctx / 2);
    const long long want = (long long)sizeof h + 4LL * n_chunk * n_ctx + n_scored * (long long)KL_RECORD_BYTES(n_vocab);
    if ((long long)st.st_size != want) {
        fclose(f);
        return err_set(ERR_IO, "%s: %lld bytes, expected %lld for %d chunks of %d tokens and a vocabulary of %d (truncated or extended)",
                       path, (long long)st.st_size, want, n_chunk, n_ctx, n_vocab);
    }
    enum { BLOCK = 4096 };
    int32_t buf[BLOCK];
    for (long long i = 0, n = (long long)n_chunk * n_ctx; i < n;) {
        size_t k = n - i < BLOCK ? (size_t)(n - i) : BLOCK;
        if (fread(buf, sizeof *buf, k, f) != k) { fclose(f); return err_set(ERR_IO, "%s: read error", path); }
        for (size_t j = 0; j < k; j++, i++)
            if (buf[j] != tokens[i]) {
                fclose(f);
                return err_set(ERR_IO, "%s: token %lld is %d, the text here has %d (another text or tokenizer)", path, i, (int)buf[j], tokens[i]);
            }
    }
    *out = f;
    return ERR_OK;
}

void quality_mean_err(double sum, double sum2, long count, double *mean, double *err) {
    *mean = count > 0 ? sum / count : 0.0;
    double var = count > 0 ? sum2 / count - *mean * *mean : 0.0;
    *err = count > 1 && var > 0.0 ? sqrt(var / (count - 1)) : 0.0;
}
