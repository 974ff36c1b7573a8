/* test_sampler.c - checks sampler.c against what each stage must do: greedy picks the argmax
 * (lowest id on ties), top-k = 1 is greedy, seeds reproduce, temperature-1 frequencies match the
 * softmax, top-p and min-p keep exactly the tokens they should (the support of many draws), the
 * repetition penalty flips the argmax when it should, and sampler_init refuses bad configs.
 *
 * Prints one line per failed check and ends with "N passed, M failed". */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "sampler.h"


/* Everything off; tests switch on what they test. */
static sampler_config plain(float temperature, uint64_t seed) {
    return (sampler_config){.temperature = temperature, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f,
                            .repeat_penalty = 1.0f, .repeat_last_n = 64, .seed = seed};
}

/* The test's own generator for logits, independent of the sampler's. */
static uint64_t test_rng = 0x1234567887654321ULL;
static float test_uniform(void) {
    test_rng ^= test_rng << 13;
    test_rng ^= test_rng >> 7;
    test_rng ^= test_rng << 17;
    return (float)(test_rng >> 40) / (float)(1 << 24);
}

static int argmax_ref(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) {
        if (x[i] > x[best]) best = i;
    }
    return best;
}

/* One draw from a copy of logits (the sampler modifies them in place). */
static int draw(sampler *s, const float *logits, float *work, int V, const int *hist, int n_hist) {
    memcpy(work, logits, (size_t)V * sizeof *work);
    return sampler_sample(s, work, hist, n_hist);
}

/* counts[V] of n draws with cfg; returns 0 if init failed. */
static int histogram(const sampler_config *cfg, const float *logits, int V, int n, int *counts) {
    sampler s;
    err_code rc = sampler_init(&s, cfg, V);
    CHECK(rc == ERR_OK, "sampler_init: %s: %s", err_name(rc), err_detail());
    if (rc) return 0;
    float *work = malloc((size_t)V * sizeof *work);
    memset(counts, 0, (size_t)V * sizeof *counts);
    for (int i = 0; i < n; i++) {
        int t = draw(&s, logits, work, V, NULL, 0);
        if (t >= 0 && t < V) counts[t]++;
        else CHECK(0, "token %d out of range", t);
    }
    free(work);
    sampler_free(&s);
    return 1;
}

/* The support of counts[V] is exactly ids[0..k). */
static void check_support(const char *what, const int *counts, int V, const int *ids, int k) {
    int outside = 0, first_outside = -1;
    for (int i = 0; i < V; i++) {
        int in = 0;
        for (int j = 0; j < k; j++) in |= ids[j] == i;
        if (in) CHECK(counts[i] > 0, "%s: token %d never drawn", what, i);
        else if (counts[i] > 0) {
            outside += counts[i];
            if (first_outside < 0) first_outside = i;
        }
    }
    CHECK(outside == 0, "%s: %d draws outside the support, first token %d", what, outside,
          first_outside);
}

static void logits_from_probs(const double *p, int V, float *logits) {
    for (int i = 0; i < V; i++) logits[i] = (float)log(p[i]);
}

// ------------------------------------------------------------------------------------------------

static void test_greedy(void) {
    sampler s;
    sampler_config cfg = plain(0.0f, 7);
    CHECK(sampler_init(&s, &cfg, 5) == ERR_OK, "init greedy");
    float a[5] = {0.1f, -3.0f, 2.5f, 2.4f, 1.0f};
    CHECK(sampler_sample(&s, a, NULL, 0) == 2, "greedy: argmax of distinct logits");
    float ties[5] = {1.0f, 5.0f, -2.0f, 5.0f, 5.0f};
    CHECK(sampler_sample(&s, ties, NULL, 0) == 1, "greedy: ties go to the lowest id");
    float ninf[5] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    CHECK(sampler_sample(&s, ninf, NULL, 0) == 0, "greedy: all -inf gives 0");
    float nan_first[5] = {NAN, 1.0f, 3.0f, NAN, 2.0f};
    CHECK(sampler_sample(&s, nan_first, NULL, 0) == 2, "greedy: NaN logits are skipped");
    sampler_free(&s);

    /* Random logits over a large vocab, many times. */
    enum { V = 4096 };
    static float x[V], work[V];
    CHECK(sampler_init(&s, &cfg, V) == ERR_OK, "init greedy V");
    int wrong = 0;
    for (int trial = 0; trial < 50; trial++) {
        for (int i = 0; i < V; i++) x[i] = 10 * test_uniform() - 5;
        wrong += draw(&s, x, work, V, NULL, 0) != argmax_ref(x, V);
    }
    CHECK(wrong == 0, "greedy: %d of 50 random vectors not the argmax", wrong);
    sampler_free(&s);
}

static void test_temperature(void) {
    enum { V = 8, N = 2000 };
    float x[V] = {1.0f, 0.9f, 0.8f, 0.7f, 0.6f, 0.5f, 0.4f, 0.3f};
    int counts[V];
    sampler_config cfg = plain(0.0f, 99);
    histogram(&cfg, x, V, N, counts);
    CHECK(counts[0] == N, "temperature 0: argmax drawn %d of %d times", counts[0], N);

    cfg = plain(1.0f, 99);
    histogram(&cfg, x, V, N, counts);
    int distinct = 0;
    for (int i = 0; i < V; i++) distinct += counts[i] > 0;
    CHECK(distinct == V && counts[0] < N / 4,
          "temperature 1 on near-flat logits: %d distinct tokens, argmax %d of %d", distinct,
          counts[0], N);

    /* top_k = 1 is greedy whatever the temperature. */
    enum { VB = 1000 };
    static float y[VB], work[VB];
    sampler s;
    cfg = plain(1.5f, 5);
    cfg.top_k = 1;
    CHECK(sampler_init(&s, &cfg, VB) == ERR_OK, "init top_k 1");
    int wrong = 0;
    for (int trial = 0; trial < 200; trial++) {
        for (int i = 0; i < VB; i++) y[i] = 2 * test_uniform();
        wrong += draw(&s, y, work, VB, NULL, 0) != argmax_ref(y, VB);
    }
    CHECK(wrong == 0, "top_k 1: %d of 200 draws not the argmax", wrong);
    sampler_free(&s);
}

static void test_seeds(void) {
    enum { V = 50, N = 500 };
    float x[V], work[V];
    for (int i = 0; i < V; i++) x[i] = test_uniform();
    int seq[4][N];
    const uint64_t seeds[4] = {42, 42, 43, 0};
    for (int k = 0; k < 4; k++) {
        sampler s;
        sampler_config cfg = plain(1.0f, seeds[k]);
        CHECK(sampler_init(&s, &cfg, V) == ERR_OK, "init seed");
        for (int i = 0; i < N; i++) seq[k][i] = draw(&s, x, work, V, NULL, 0);
        sampler_free(&s);
    }
    CHECK(memcmp(seq[0], seq[1], sizeof seq[0]) == 0, "seed 42 twice: sequences differ");
    /* Two independent streams over ~50 near-equal tokens agree at ~1/50 of the positions. */
    int same = 0, same0 = 0, distinct0 = 0;
    int seen[V] = {0};
    for (int i = 0; i < N; i++) {
        same += seq[0][i] == seq[2][i];
        same0 += seq[0][i] == seq[3][i];
        distinct0 += !seen[seq[3][i]];
        seen[seq[3][i]] = 1;
    }
    CHECK(same < N / 10, "seeds 42 and 43 agree at %d of %d positions", same, N);
    CHECK(same0 < N / 10 && distinct0 > V / 2,
          "seed 0: agrees with seed 42 at %d of %d positions, %d distinct tokens", same0, N,
          distinct0);
}

/* Frequencies of N draws against the softmax. Each count is binomial(N, p), so the frequency has
 * standard deviation sqrt(p (1 - p) / N) <= 0.0011 at N = 200k; 5 sigma leaves a correct sampler a
 * 6e-7 chance per check of failing (and the seed is fixed, so it does not flake), while a wrong
 * temperature or an off-by-one token shifts some frequency by several percent. */
static void test_frequencies(void) {
    enum { V = 6, N = 200000 };
    const float x[V] = {0.0f, 0.5f, 1.0f, -1.0f, 2.0f, 0.25f};
    const float temps[2] = {1.0f, 2.0f};
    for (int k = 0; k < 2; k++) {
        double p[V], z = 0;
        for (int i = 0; i < V; i++) z += p[i] = exp(x[i] / temps[k]);
        int counts[V];
        sampler_config cfg = plain(temps[k], 2024);
        if (!histogram(&cfg, x, V, N, counts)) return;
        for (int i = 0; i < V; i++) {
            double pi = p[i] / z, f = (double)counts[i] / N, tol = 5 * sqrt(pi * (1 - pi) / N);
            CHECK(fabs(f - pi) <= tol, "T=%g token %d: frequency %.5f, softmax %.5f, tolerance %.5f",
                  temps[k], i, f, pi, tol);
        }
    }
}

static void test_top_p(void) {
    enum { V = 4, N = 20000 };
    /* Probabilities 0.4, 0.3, 0.2, 0.1 at ids 2, 0, 3, 1 (not in rank order). */
    const double p[V] = {0.3, 0.1, 0.4, 0.2};
    float x[V];
    logits_from_probs(p, V, x);
    int counts[V];
    sampler_config cfg = plain(1.0f, 11);

    /* Mass above each token in rank order: 0, 0.4, 0.7, 0.9. top_p keeps the tokens with mass
     * above them < top_p; the cuts sit 0.05 away from any boundary. */
    cfg.top_p = 0.65f;
    histogram(&cfg, x, V, N, counts);
    check_support("top_p 0.65", counts, V, (const int[]){2, 0}, 2);
    double f = (double)counts[2] / N;
    CHECK(fabs(f - 0.4 / 0.7) < 0.02, "top_p 0.65: renormalised frequency %.4f, expected %.4f", f,
          0.4 / 0.7);
    cfg.top_p = 0.75f;
    histogram(&cfg, x, V, N, counts);
    check_support("top_p 0.75", counts, V, (const int[]){2, 0, 3}, 3);
    cfg.top_p = 0.35f;
    histogram(&cfg, x, V, N, counts);
    check_support("top_p 0.35", counts, V, (const int[]){2}, 1);
    cfg.top_p = 0.0f;
    histogram(&cfg, x, V, N, counts);
    check_support("top_p 0", counts, V, (const int[]){2}, 1);
    cfg.top_p = 0.95f;
    histogram(&cfg, x, V, N, counts);
    check_support("top_p 0.95", counts, V, (const int[]){0, 1, 2, 3}, 4);

    /* After top-k the distribution is renormalised (HF order): over the top 2 it is 0.571,
     * 0.429, so top_p 0.55 keeps one token; on the full distribution it would keep two. */
    cfg.top_p = 0.55f;
    cfg.top_k = 2;
    histogram(&cfg, x, V, N, counts);
    check_support("top_k 2 + top_p 0.55", counts, V, (const int[]){2}, 1);
    cfg.top_k = 0;
    histogram(&cfg, x, V, N, counts);
    check_support("top_p 0.55", counts, V, (const int[]){2, 0}, 2);

    /* A large vocab takes the prefiltered path: 0.5, 0.3, 0.15 at scattered ids, the remaining
     * 0.05 spread over 19997 tokens. Mass above: 0, 0.5, 0.8, 0.95. */
    enum { VB = 20000, NB = 4000 };
    static double pb[VB];
    static float xb[VB];
    static int cb[VB];
    for (int i = 0; i < VB; i++) pb[i] = 0.05 / (VB - 3);
    pb[13337] = 0.5;
    pb[7] = 0.3;
    pb[VB - 1] = 0.15;
    logits_from_probs(pb, VB, xb);
    cfg = plain(1.0f, 3);
    cfg.top_p = 0.9f;
    histogram(&cfg, xb, VB, NB, cb);
    check_support("large vocab top_p 0.9", cb, VB, (const int[]){13337, 7, VB - 1}, 3);
    cfg.top_p = 0.75f;
    histogram(&cfg, xb, VB, NB, cb);
    check_support("large vocab top_p 0.75", cb, VB, (const int[]){13337, 7}, 2);
    /* top_p 0.99 reaches into the flat tail: about 0.04 / 0.05 of it, so the tail is drawn. */
    cfg.top_p = 0.99f;
    histogram(&cfg, xb, VB, NB, cb);
    int tail = NB - cb[13337] - cb[7] - cb[VB - 1];
    CHECK(tail > 0 && tail < NB / 10, "large vocab top_p 0.99: %d of %d draws from the tail", tail, NB);
}

static int cmp_desc(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x > y ? -1 : x < y;
}

/* Nuclei of tens of tokens in a vocab of 3000, against a reference that sorts: 40 tokens with
 * weights in [1, 2] at random ids, the rest at 1e-4. top_p is set halfway between two cumulative
 * sums of the sorted weights, far from any boundary rounding could move, so the nucleus is a
 * known set whose members each have probability >= 1/80 and all show up in 4000 draws. */
static void test_top_p_random(void) {
    enum { V = 3000, BIG = 40, N = 4000 };
    static float x[V];
    static int counts[V];
    for (int trial = 0; trial < 10; trial++) {
        double w[V], sorted[V];
        for (int i = 0; i < V; i++) w[i] = 1e-4;
        for (int j = 0; j < BIG; j++) w[(int)(test_uniform() * V)] = 1 + test_uniform();
        double z = 0;
        for (int i = 0; i < V; i++) z += w[i];
        for (int i = 0; i < V; i++) x[i] = (float)log(w[i]);
        memcpy(sorted, w, sizeof w);
        qsort(sorted, V, sizeof *sorted, cmp_desc);
        /* Nucleus of size k = 8 + 2 * trial: top_p between the mass above token k - 1 and above k. */
        int k = 8 + 2 * trial;
        double above = 0;
        for (int j = 0; j < k - 1; j++) above += sorted[j];
        double top_p = (above + sorted[k - 1] / 2) / z;
        int ids[V], n_ids = 0;
        for (int i = 0; i < V; i++) {
            if (w[i] >= sorted[k - 1]) ids[n_ids++] = i;
        }
        sampler_config cfg = plain(1.0f, 100 + trial);
        cfg.top_p = (float)top_p;
        char what[64];
        snprintf(what, sizeof what, "random top_p %.4f (nucleus of %d)", top_p, k);
        histogram(&cfg, x, V, N, counts);
        CHECK(n_ids == k, "%s: reference set has %d tokens", what, n_ids);
        check_support(what, counts, V, ids, n_ids);
    }
}

static void test_min_p(void) {
    enum { V = 4, N = 20000 };
    const double p[V] = {0.5, 0.25, 0.15, 0.1};
    float x[V];
    logits_from_probs(p, V, x);
    int counts[V];
    sampler_config cfg = plain(1.0f, 17);
    /* min_p keeps p >= min_p * 0.5: thresholds 0.125, 0.3, 0.095 and 0.5. */
    cfg.min_p = 0.25f;
    histogram(&cfg, x, V, N, counts);
    check_support("min_p 0.25", counts, V, (const int[]){0, 1, 2}, 3);
    cfg.min_p = 0.6f;
    histogram(&cfg, x, V, N, counts);
    check_support("min_p 0.6", counts, V, (const int[]){0}, 1);
    cfg.min_p = 0.19f;
    histogram(&cfg, x, V, N, counts);
    check_support("min_p 0.19", counts, V, (const int[]){0, 1, 2, 3}, 4);
    cfg.min_p = 1.0f;
    histogram(&cfg, x, V, N, counts);
    check_support("min_p 1", counts, V, (const int[]){0}, 1);
    /* Close to the edges: thresholds 0.105 (drops 0.1) and 0.145 / 0.155 (around 0.15). */
    cfg.min_p = 0.21f;
    histogram(&cfg, x, V, N, counts);
    check_support("min_p 0.21", counts, V, (const int[]){0, 1, 2}, 3);
    cfg.min_p = 0.29f;
    histogram(&cfg, x, V, N, counts);
    check_support("min_p 0.29", counts, V, (const int[]){0, 1, 2}, 3);
    cfg.min_p = 0.31f;
    histogram(&cfg, x, V, N, counts);
    check_support("min_p 0.31", counts, V, (const int[]){0, 1}, 2);

    enum { VB = 20000, NB = 4000 };
    static double pb[VB];
    static float xb[VB];
    static int cb[VB];
    for (int i = 0; i < VB; i++) pb[i] = 0.05 / (VB - 3);
    pb[13337] = 0.5;
    pb[7] = 0.3;
    pb[VB - 1] = 0.15;
    logits_from_probs(pb, VB, xb);
    cfg = plain(1.0f, 3);
    cfg.min_p = 0.2f; /* threshold 0.1 */
    histogram(&cfg, xb, VB, NB, cb);
    check_support("large vocab min_p 0.2", cb, VB, (const int[]){13337, 7, VB - 1}, 3);
}

static void test_top_k(void) {
    /* Top 5 of 20000 random logits: the support of many draws is exactly those 5. */
    enum { V = 20000, N = 4000, K = 5 };
    static float x[V];
    static int counts[V];
    for (int i = 0; i < V; i++) x[i] = 3 * test_uniform();
    int ids[K];
    float tmp[V];
    memcpy(tmp, x, sizeof tmp);
    for (int j = 0; j < K; j++) {
        ids[j] = argmax_ref(tmp, V);
        tmp[ids[j]] = -INFINITY;
    }
    sampler_config cfg = plain(1.0f, 8);
    cfg.top_k = K;
    histogram(&cfg, x, V, N, counts);
    check_support("top_k 5", counts, V, ids, K);

    /* Ties at the cut go to the lowest ids. */
    enum { VT = 10 };
    float flat[VT] = {0};
    int ct[VT];
    cfg.top_k = 3;
    histogram(&cfg, flat, VT, 3000, ct);
    check_support("top_k 3 on equal logits", ct, VT, (const int[]){0, 1, 2}, 3);

    /* top_k above the vocab size keeps everything. */
    cfg.top_k = 1000;
    histogram(&cfg, flat, VT, 3000, ct);
    check_support("top_k 1000 on 10 tokens", ct, VT, (const int[]){0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, 10);
}

static void test_penalty(void) {
    enum { V = 4 };
    sampler s;
    sampler_config cfg = plain(0.0f, 1);
    cfg.repeat_penalty = 1.1f;
    cfg.repeat_last_n = 2;
    CHECK(sampler_init(&s, &cfg, V) == ERR_OK, "init penalty");

    /* Positive logit: 2.0 / 1.1 = 1.818 < 1.9, so token 1 wins. */
    float a[V] = {2.0f, 1.9f, 0.0f, -1.0f};
    CHECK(sampler_sample(&s, a, (const int[]){0}, 1) == 1, "penalty: positive argmax not flipped");
    CHECK(fabsf(a[0] - 2.0f / 1.1f) < 1e-6f && a[1] == 1.9f, "penalty: logits %g %g after", a[0], a[1]);
    /* Negative logit: -1.0 * 1.1 = -1.1 < -1.05. */
    float b[V] = {-1.0f, -1.05f, -2.0f, -3.0f};
    CHECK(sampler_sample(&s, b, (const int[]){0}, 1) == 1, "penalty: negative argmax not flipped");
    /* Once per distinct token: 2.0 / 1.1 = 1.818 > 1.7 keeps token 0; three times (1.503) would not. */
    float c[V] = {2.0f, 1.7f, 0.0f, 0.0f};
    CHECK(sampler_sample(&s, c, (const int[]){0, 0}, 2) == 0, "penalty: repeated token penalised twice");
    /* Only the last repeat_last_n = 2 tokens: token 0 three back is not penalised. */
    float d[V] = {2.0f, 1.9f, 0.0f, 0.0f};
    CHECK(sampler_sample(&s, d, (const int[]){0, 2, 3}, 3) == 0, "penalty: reached past repeat_last_n");
    /* Ids outside the vocab in the history are ignored, not written. */
    float e[V] = {2.0f, 1.9f, 0.0f, 0.0f};
    CHECK(sampler_sample(&s, e, (const int[]){-1, 7}, 2) == 0 && e[0] == 2.0f,
          "penalty: out-of-range ids changed the logits");
    sampler_free(&s);

    cfg.repeat_penalty = 1.0f;
    CHECK(sampler_init(&s, &cfg, V) == ERR_OK, "init no penalty");
    float f[V] = {2.0f, 1.9f, 0.0f, 0.0f};
    CHECK(sampler_sample(&s, f, (const int[]){0}, 1) == 0, "penalty 1 changed the argmax");
    sampler_free(&s);
}

static void test_init_rejects(void) {
    struct {
        const char *field;
        sampler_config cfg;
        int vocab;
    } bad[] = {
        {"temperature", {-0.5f, 0, 1, 0, 1, 64, 0}, 10},
        {"temperature", {NAN, 0, 1, 0, 1, 64, 0}, 10},
        {"temperature", {INFINITY, 0, 1, 0, 1, 64, 0}, 10},
        {"top_k", {1, -1, 1, 0, 1, 64, 0}, 10},
        {"top_p", {1, 0, 1.5f, 0, 1, 64, 0}, 10},
        {"top_p", {1, 0, -0.1f, 0, 1, 64, 0}, 10},
        {"top_p", {1, 0, NAN, 0, 1, 64, 0}, 10},
        {"min_p", {1, 0, 1, 2.0f, 1, 64, 0}, 10},
        {"min_p", {1, 0, 1, -0.01f, 1, 64, 0}, 10},
        {"repeat_penalty", {1, 0, 1, 0, 0.0f, 64, 0}, 10},
        {"repeat_penalty", {1, 0, 1, 0, -1.1f, 64, 0}, 10},
        {"repeat_last_n", {1, 0, 1, 0, 1, -1, 0}, 10},
        {"vocab_size", {1, 0, 1, 0, 1, 64, 0}, 0},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sampler s;
        err_code rc = sampler_init(&s, &bad[i].cfg, bad[i].vocab);
        CHECK(rc == ERR_ARG && strstr(err_detail(), bad[i].field) && strstr(err_detail(), "must"),
              "bad %s (case %zu): got %s \"%s\"", bad[i].field, i, err_name(rc), err_detail());
        if (rc == ERR_OK) sampler_free(&s);
    }
    /* The edges of each range are accepted. */
    sampler_config edge[] = {
        {0, 0, 0, 0, 1, 0, 0},
        {100, 5, 1, 1, 0.5f, 0, UINT64_MAX},
    };
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++) {
        sampler s;
        err_code rc = sampler_init(&s, &edge[i], 1);
        CHECK(rc == ERR_OK, "edge config %zu refused: %s", i, err_detail());
        if (rc == ERR_OK) {
            float one = 3.0f;
            CHECK(sampler_sample(&s, &one, NULL, 0) == 0, "vocab of 1: not token 0");
            sampler_free(&s);
        }
    }
}

int main(void) {
    test_greedy();
    test_temperature();
    test_seeds();
    test_frequencies();
    test_top_p();
    test_top_p_random();
    test_min_p();
    test_top_k();
    test_penalty();
    test_init_rejects();
    return check_summary();
}
