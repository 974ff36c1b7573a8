/* sampler.c - repetition penalty, greedy, temperature, top-k, top-p, min-p and a seeded draw
 * (see sampler.h for the order, which is Hugging Face's).
 *
 * It runs once per token over the whole vocabulary (up to ~152k), so every stage is O(V) or works
 * on a short candidate list: top-k keeps a size-k min-heap while scanning (O(V log k), and most
 * logits lose to the heap's minimum after one compare); top-p without top-k first drops every
 * token too unlikely to be in the nucleus, then finds the nucleus by quickselect on mass; min-p
 * and the draw are single passes. Probabilities are kept unnormalised as w = exp(x - x_max), so
 * the top token has w = 1 exactly and min-p is a plain comparison; sums are in double.
 *
 * Validation happens in sampler_init(); sampler_sample() has no error paths. Ids in the history
 * outside [0, vocab_size) are skipped, NaN logits count as -inf. */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    float w; /* logit / temperature, then exp(that - max) */
    int id;
} candidate;

typedef struct {
    candidate *cand;     /* (vocab_size) */
    unsigned char *seen; /* (vocab_size) marks for the penalty and the draw, all zero between calls */
} scratch;

// ------------------------------------------------------------------------------------------------
// random numbers: splitmix64 seeds an xorshift64* stream

static uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static uint64_t xorshift64s(uint64_t *state) {
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545f4914f6cdd1dULL;
}

/* Uniform in [0, 1) with 53 random bits. */
static double random_unit(uint64_t *state) { return (double)(xorshift64s(state) >> 11) * 0x1.0p-53; }

// ------------------------------------------------------------------------------------------------
// init and free

err_code sampler_init(sampler *s, const sampler_config *cfg, int vocab_size) {
    memset(s, 0, sizeof *s);
    /* Written as !(x in range) so that NaN fails too. */
    if (!(cfg->temperature >= 0 && isfinite(cfg->temperature))) {
        return err_set(ERR_ARG, "temperature %g: must be finite and >= 0 (0: greedy)",
                       cfg->temperature);
    }
    if (cfg->top_k < 0) return err_set(ERR_ARG, "top_k %d: must be >= 0 (0: off)", cfg->top_k);
    if (!(cfg->top_p >= 0 && cfg->top_p <= 1)) {
        return err_set(ERR_ARG, "top_p %g: must be in [0, 1] (1: off)", cfg->top_p);
    }
    if (!(cfg->min_p >= 0 && cfg->min_p <= 1)) {
        return err_set(ERR_ARG, "min_p %g: must be in [0, 1] (0: off)", cfg->min_p);
    }
    if (!(cfg->repeat_penalty > 0 && isfinite(cfg->repeat_penalty))) {
        return err_set(ERR_ARG, "repeat_penalty %g: must be finite and > 0 (1: off)",
                       cfg->repeat_penalty);
    }
    if (cfg->repeat_last_n < 0) {
        return err_set(ERR_ARG, "repeat_last_n %d: must be >= 0 (0: off)", cfg->repeat_last_n);
    }
    if (vocab_size < 1) return err_set(ERR_ARG, "vocab_size %d: must be >= 1", vocab_size);

    scratch *sc = malloc(sizeof *sc);
    candidate *cand = malloc((size_t)vocab_size * sizeof *cand);
    unsigned char *seen = calloc((size_t)vocab_size, 1);
    if (!sc || !cand || !seen) {
        free(sc);
        free(cand);
        free(seen);
        return err_set(ERR_NOMEM, "sampler: scratch for %d candidates", vocab_size);
    }
    sc->cand = cand;
    sc->seen = seen;
    s->cfg = *cfg;
    if (s->cfg.top_k > vocab_size) s->cfg.top_k = vocab_size; /* keeping all V is what was asked */
    s->vocab_size = vocab_size;
    s->rng_state = splitmix64(cfg->seed);
    if (s->rng_state == 0) s->rng_state = 0x9e3779b97f4a7c15ULL; /* xorshift's one fixed point */
    s->scratch = sc;
    return ERR_OK;
}

void sampler_free(sampler *s) {
    scratch *sc = s->scratch;
    if (sc) {
        free(sc->cand);
        free(sc->seen);
        free(sc);
    }
    s->scratch = NULL;
}

// ------------------------------------------------------------------------------------------------
// the stages

/* Each distinct token among the last n of history once: positive logits divided by p, negative
 * ones multiplied, so the token always becomes less likely. */
static void apply_penalty(const sampler *s, float *logits, const int *history, int n_history) {
    float p = s->cfg.repeat_penalty;
    int n = s->cfg.repeat_last_n < n_history ? s->cfg.repeat_last_n : n_history;
    if (p == 1.0f || n <= 0) return;
    unsigned char *seen = ((scratch *)s->scratch)->seen;
    const int *recent = history + n_history - n;
    for (int i = 0; i < n; i++) {
        int id = recent[i];
        if (id < 0 || id >= s->vocab_size || seen[id]) continue;
        seen[id] = 1;
        logits[id] = logits[id] > 0 ? logits[id] / p : logits[id] * p;
    }
    for (int i = 0; i < n; i++) {
        if (recent[i] >= 0 && recent[i] < s->vocab_size) seen[recent[i]] = 0;
    }
}

/* Lowest id among the largest logits; 0 if all are NaN or -inf. */
static int argmax(const float *logits, int n) {
    int best = 0;
    float best_l = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (logits[i] > best_l) {
            best_l = logits[i];
            best = i;
        }
    }
    return best;
}

/* a ranks above b: larger value, then lower id, so every order is total and deterministic. */
static int ranks_above(candidate a, candidate b) { return a.w > b.w || (a.w == b.w && a.id < b.id); }

static int cmp_rank(const void *pa, const void *pb) {
    const candidate *a = pa, *b = pb;
    return ranks_above(*a, *b) ? -1 : ranks_above(*b, *a) ? 1 : 0;
}

/* Restores the min-heap (root = lowest rank) below node i of heap[0..k). */
static void heap_sift_down(candidate *heap, int k, int i) {
    for (;;) {
        int lo = i, l = 2 * i + 1, r = l + 1;
        if (l < k && ranks_above(heap[lo], heap[l])) lo = l;
        if (r < k && ranks_above(heap[lo], heap[r])) lo = r;
        if (lo == i) return;
        candidate t = heap[i];
        heap[i] = heap[lo];
        heap[lo] = t;
        i = lo;
    }
}

/* The k best of x[0..n) into cand[0..k), best first. */
static void select_top_k(const float *x, int n, int k, candidate *cand) {
    for (int i = 0; i < k; i++) cand[i] = (candidate){x[i], i};
    for (int i = k / 2 - 1; i >= 0; i--) heap_sift_down(cand, k, i);
    for (int i = k; i < n; i++) {
        candidate c = {x[i], i};
        if (ranks_above(c, cand[0])) {
            cand[0] = c;
            heap_sift_down(cand, k, 0);
        }
    }
    qsort(cand, (size_t)k, sizeof *cand, cmp_rank);
}

static void swap(candidate *a, candidate *b) {
    candidate t = *a;
    *a = *b;
    *b = t;
}

/* Top-p on unsorted c[0..n): moves the tokens whose mass strictly above them (in rank order) is
 * < target to c[0..keep), in no particular order, and returns keep (at least 1). Quickselect on
 * mass: c[0..lo) are in, c[hi..n) are out, each round partitions [lo, hi) around a pivot and
 * decides the pivot with everything on one side of it. Expected O(n); a flat distribution with
 * top_p near 1 keeps most of a 152k vocab, which a full sort would pay O(n log n) for every token.
 * The pivot is drawn at random (from a generator of its own, so the draws do not depend on it):
 * median-of-three degenerates to O(n^2) on the orders this partition leaves behind. */
static int nucleus(candidate *c, int n, double target) {
    int lo = 0, hi = n;
    double above = 0; /* weight of c[0..lo) */
    uint64_t pick = 0x2545f4914f6cdd1dULL ^ (uint64_t)n;
    while (lo < hi) {
        int p = lo + (int)(xorshift64s(&pick) % (uint64_t)(hi - lo));
        swap(&c[p], &c[hi - 1]);
        candidate pivot = c[hi - 1];
        int m = lo;
        double mass = 0; /* of the tokens ranked above the pivot */
        for (int j = lo; j < hi - 1; j++) {
            if (ranks_above(c[j], pivot)) {
                mass += c[j].w;
                swap(&c[m++], &c[j]);
            }
        }
        swap(&c[m], &c[hi - 1]);
        if (above + mass < target) { /* the pivot is in, and so is everything above it */
            above += mass + c[m].w;
            lo = m + 1;
        } else {
            hi = m;
        }
    }
    if (lo == 0) { /* top_p = 0 or so: the top token alone */
        for (int j = 1; j < n; j++) {
            if (ranks_above(c[j], c[0])) swap(&c[j], &c[0]);
        }
        lo = 1;
    }
    return lo;
}

int sampler_sample(sampler *s, float *logits, const int *history, int n_history) {
    const sampler_config *cfg = &s->cfg;
    int V = s->vocab_size;
    candidate *cand = ((scratch *)s->scratch)->cand;
    apply_penalty(s, logits, history, n_history);
    if (cfg->temperature == 0) return argmax(logits, V);

    /* Temperature, in place: x = logit / T, NaN as -inf. */
    float inv_t = 1.0f / cfg->temperature;
    for (int i = 0; i < V; i++) logits[i] = logits[i] == logits[i] ? logits[i] * inv_t : -INFINITY;
    int top = argmax(logits, V);
    float x_max = logits[top];
    if (x_max == -INFINITY) return top;
    if (x_max == INFINITY) return top; /* a logit overflowed; the largest one wins */

    /* Candidates (n) as unnormalised probabilities w = exp(x - x_max); top has w = 1. With top-k
     * they come out sorted, best first. */
    int n, sorted = 0;
    if (cfg->top_k > 0 && cfg->top_k < V) {
        n = cfg->top_k;
        select_top_k(logits, V, n, cand);
        for (int j = 0; j < n; j++) cand[j].w = expf(cand[j].w - x_max);
        sorted = 1;
    } else {
        n = V;
        for (int i = 0; i < V; i++) cand[i] = (candidate){expf(logits[i] - x_max), i};
    }

    /* Top-p (nucleus): keep the tokens whose mass strictly above them is < top_p * mass, which
     * keeps the token that crosses top_p, as HF and llama.cpp do; at least one. */
    if (cfg->top_p < 1.0f) {
        double z = 0;
        for (int j = 0; j < n; j++) z += cand[j].w;
        double target = cfg->top_p * z;
        if (sorted) {
            double above = 0;
            int keep = 0;
            while (keep < n && (keep == 0 || above < target)) above += cand[keep++].w;
            n = keep;
        } else {
            /* A token below (1 - top_p) / (n - 1) of the mass can only be in the nucleus if it is
             * the top token: everything at or below it, at most n - 1 tokens, would weigh less
             * than 1 - top_p. Halving the bound absorbs rounding; it only keeps a few more. */
            double cut = 0.5 * (1.0 - cfg->top_p) / (double)(n > 1 ? n - 1 : 1) * z;
            int m = 0;
            for (int j = 0; j < n; j++) {
                if (cand[j].w >= cut || cand[j].id == top) cand[m++] = cand[j];
            }
            n = nucleus(cand, m, target);
        }
    }

    /* Min-p: keep w >= min_p * w_top, and w_top = 1. Keeps the order. */
    if (cfg->min_p > 0) {
        int m = 0;
        for (int j = 0; j < n; j++) {
            if (cand[j].w >= cfg->min_p) cand[m++] = cand[j];
        }
        n = m;
    }

    /* The draw walks the survivors in id order, whatever order the stages left them in: a
     * canonical order that the GPU's sampler (runtime/cuda_sampler.cuh) walks too, so the same seed
     * and logits give the same token on both. The weights are recomputed from x exactly as above. */
    unsigned char *kept = ((scratch *)s->scratch)->seen;
    for (int j = 0; j < n; j++) kept[cand[j].id] = 1;
    double total = 0;
    for (int i = 0; i < V; i++)
        if (kept[i]) total += expf(logits[i] - x_max);
    double r = random_unit(&s->rng_state) * total, acc = 0;
    int pick = -1, last = -1;
    for (int i = 0; i < V; i++) {
        if (!kept[i]) continue;
        kept[i] = 0;
        float w = expf(logits[i] - x_max);
        acc += w;
        if (w > 0) last = i;
        if (pick < 0 && r < acc) pick = i;
    }
    /* Rounding left r at the very top: the last survivor with weight. */
    return pick >= 0 ? pick : last >= 0 ? last : top;
}
