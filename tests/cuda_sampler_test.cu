/* cuda_sampler_test.cu - the GPU sampler (runtime/cuda_sampler.cuh) against the CPU sampler
 * (runtime/sampler.c) on the same logits, history and seed: the same token, draw after draw.
 *
 * Cases cross vocabulary sizes (5 to 151936), logit shapes (peaked, flat, heavy ties, NaN and
 * -inf, and striped: logits that repeat every 4096 ids, so that each GPU thread reads near-equal
 * values and the floor from the threads' best lets many tokens through) and settings that take
 * every path: greedy with a penalty, the CLI's defaults (top-k 40, top-p 0.95, min-p 0.05), top-k
 * alone (gathered above the floor, a tie group larger than SAMPLE_SORT_MAX, more than
 * SAMPLE_SORT_MAX), top-p alone (select passes), top-p 0, min-p alone (gathered, or drawn over the
 * whole vocabulary when flat). Each seed draws
 * three times in a row, so the generator's state must carry over. Prints mismatches, then the
 * kernel's time per setting and vocabulary (best of 20, peaked logits unless named); exits 1 on
 * any mismatch. `--time` only times. Built by `make build/tests/cuda_sampler_test`; run by
 * tests/test_gpu.py. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "cuda_sampler.cuh"
#include "sampler.h"

#define CHECK_CUDA(call)                                                                    \
    do {                                                                                    \
        cudaError_t e_ = (call);                                                            \
        if (e_ != cudaSuccess) {                                                            \
            fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
            exit(2);                                                                        \
        }                                                                                   \
    } while (0)

__global__ void __launch_bounds__(SAMPLE_THREADS) sample_kernel(float *logits, int vocab, const int *history,
                                                                int *first_seen, int *io, const sample_params *params,
                                                                unsigned long long *rng) {
    sample_body(logits, vocab, history, first_seen, io, params, rng);
}

/* The test's own generator, independent of both samplers'. */
static uint64_t lcg = 88172645463325252ULL;
static double unit(void) {
    lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(lcg >> 11) * 0x1.0p-53;
}
static double normal(void) { return sqrt(-2.0 * log(unit() + 1e-300)) * cos(6.283185307179586 * unit()); }

enum { PEAKED, FLAT, TIES, SPECIALS, STRIPED, N_SHAPES };
static const char *const shape_names[N_SHAPES] = {"peaked", "flat", "ties", "specials", "striped"};

static void make_logits(float *l, int V, int shape) {
    static float stripe[4096];
    for (int i = 0; i < 4096; i++) stripe[i] = (float)(3.0 * normal());
    for (int i = 0; i < V; i++) {
        double g = normal();
        l[i] = shape == PEAKED ? (float)(3.0 * g) : shape == FLAT ? (float)(0.05 * g) : shape == TIES ? (float)round(2.0 * g)
             : shape == STRIPED ? stripe[i % 4096] + (float)(0.01 * g) : (float)g;
    }
    if (shape == SPECIALS)
        for (int i = 0; i < V; i += 7) l[i] = i % 3 == 0 ? NAN : -INFINITY;
}

struct setting {
    const char *name;
    sampler_config cfg;
};

int main(int argc, char **argv) {
    const int time_only = argc > 1 && strcmp(argv[1], "--time") == 0;
    const int vocabs[] = {5, 1000, 49152, 151936};
    const setting settings[] = {
        {"greedy+penalty", {0.0f, 0, 1.0f, 0.0f, 1.3f, 64, 0}},
        {"defaults", {0.7f, 40, 0.95f, 0.05f, 1.0f, 64, 0}},
        {"defaults+penalty", {0.7f, 40, 0.95f, 0.05f, 1.2f, 64, 0}},
        {"temperature", {1.0f, 0, 1.0f, 0.0f, 1.0f, 64, 0}},
        {"top-k 1", {1.0f, 1, 1.0f, 0.0f, 1.0f, 64, 0}},
        {"top-p 0.5", {1.0f, 0, 0.5f, 0.0f, 1.0f, 64, 0}},
        {"top-p 0", {1.0f, 0, 0.0f, 0.0f, 1.0f, 64, 0}},
        {"top-k 5000 top-p 0.9", {0.8f, 5000, 0.9f, 0.0f, 1.0f, 64, 0}},
        {"top-k 2000 top-p 0.99", {1.0f, 2000, 0.99f, 0.0f, 1.0f, 64, 0}},
        {"min-p 0.1", {1.5f, 0, 1.0f, 0.1f, 1.0f, 64, 0}},
        {"top-k 200 top-p 0.9", {1.2f, 200, 0.9f, 0.0f, 1.0f, 64, 0}},
        {"top-k 3000", {1.0f, 3000, 1.0f, 0.0f, 1.0f, 64, 0}},
        {"top-k 20000 min-p 0.02", {1.0f, 20000, 1.0f, 0.02f, 1.0f, 64, 0}},
        {"top-p 0.95 min-p 0.02", {0.9f, 0, 0.95f, 0.02f, 1.0f, 64, 0}},
    };
    const int n_seeds = 12, draws = 3, n_hist = 200;
    const int vmax = vocabs[sizeof vocabs / sizeof *vocabs - 1];

    float *logits = (float *)malloc(vmax * sizeof(float)), *work = (float *)malloc(vmax * sizeof(float));
    int history[n_hist];
    float *d_logits;
    int *d_history, *d_first_seen, *d_io;
    sample_params *d_params;
    unsigned long long *d_rng;
    CHECK_CUDA(cudaMalloc(&d_logits, vmax * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&d_history, n_hist * sizeof(int)));
    CHECK_CUDA(cudaMalloc(&d_first_seen, vmax * sizeof(int)));
    CHECK_CUDA(cudaMemset(d_first_seen, 0x7F, vmax * sizeof(int)));
    CHECK_CUDA(cudaMalloc(&d_io, IO_INTS * sizeof(int)));
    CHECK_CUDA(cudaMalloc(&d_params, sizeof(sample_params)));
    CHECK_CUDA(cudaMalloc(&d_rng, 2 * sizeof(unsigned long long))); /* the state, the state before the draw */

    int cases = 0, mismatches = 0;
    for (size_t vi = 0; vi < (time_only ? 0 : sizeof vocabs / sizeof *vocabs); vi++) {
        const int V = vocabs[vi];
        for (int shape = 0; shape < N_SHAPES; shape++) {
            make_logits(logits, V, shape);
            for (int i = 0; i < n_hist; i++) history[i] = (int)(unit() * V * 0.01); /* repeats, low ids */
            CHECK_CUDA(cudaMemcpy(d_history, history, sizeof history, cudaMemcpyHostToDevice));
            for (size_t si = 0; si < sizeof settings / sizeof *settings; si++) {
                for (int seed = 1; seed <= n_seeds; seed++) {
                    sampler_config cfg = settings[si].cfg;
                    cfg.seed = (uint64_t)seed * 7919;
                    sampler s;
                    if (sampler_init(&s, &cfg, V) != ERR_OK) { fprintf(stderr, "sampler_init failed\n"); return 2; }
                    sample_params p = {cfg.temperature > 0 ? 1.0f / cfg.temperature : 0.0f, s.cfg.top_k, cfg.top_p,
                                       cfg.min_p, cfg.repeat_penalty, cfg.repeat_last_n};
                    unsigned long long rng = s.rng_state;
                    CHECK_CUDA(cudaMemcpy(d_params, &p, sizeof p, cudaMemcpyHostToDevice));
                    CHECK_CUDA(cudaMemcpy(d_rng, &rng, sizeof rng, cudaMemcpyHostToDevice));
                    for (int d = 0; d < draws; d++) {
                        int pos = n_hist - 1 - d * 50, io[IO_INTS];
                        io[IO_POS] = pos, io[IO_NEXT] = -1;
                        memcpy(work, logits, V * sizeof(float));
                        int want = sampler_sample(&s, work, history, pos + 1);
                        CHECK_CUDA(cudaMemcpy(d_logits, logits, V * sizeof(float), cudaMemcpyHostToDevice));
                        CHECK_CUDA(cudaMemcpy(d_io, io, sizeof io, cudaMemcpyHostToDevice));
                        sample_kernel<<<1, SAMPLE_THREADS>>>(d_logits, V, d_history, d_first_seen, d_io, d_params, d_rng);
                        CHECK_CUDA(cudaGetLastError());
                        CHECK_CUDA(cudaMemcpy(io, d_io, sizeof io, cudaMemcpyDeviceToHost));
                        cases++;
                        if (io[IO_NEXT] != want) {
                            if (mismatches++ < 20)
                                printf("mismatch: V %d, %s logits, %s, seed %d, draw %d: GPU %d, CPU %d\n", V, shape_names[shape],
                                       settings[si].name, seed, d, io[IO_NEXT], want);
                        }
                    }
                    sampler_free(&s);
                }
            }
        }
    }

    /* The kernel's time per setting and vocabulary: logits fresh in L2 (just copied), best of 20. */
    struct timed {
        const char *name;
        int shape;
        sample_params p;
    };
    const timed timings[] = {
        {"defaults", PEAKED, {1.0f / 0.7f, 40, 0.95f, 0.05f, 1.0f, 64}},
        {"top-k 40", PEAKED, {1.0f, 40, 1.0f, 0.0f, 1.0f, 64}},
        {"top-p 0.9", PEAKED, {1.0f, 0, 0.9f, 0.0f, 1.0f, 64}},
        {"min-p 0.05", PEAKED, {1.0f, 0, 1.0f, 0.05f, 1.0f, 64}},
        {"temperature", PEAKED, {1.0f, 0, 1.0f, 0.0f, 1.0f, 64}},
        {"greedy", PEAKED, {0.0f, 0, 1.0f, 0.0f, 1.0f, 64}},
        {"defaults, striped", STRIPED, {1.0f / 0.7f, 40, 0.95f, 0.05f, 1.0f, 64}},
        {"top-p 0.9, flat", FLAT, {1.0f, 0, 0.9f, 0.0f, 1.0f, 64}},
        {"min-p 0.05, flat", FLAT, {1.0f, 0, 1.0f, 0.05f, 1.0f, 64}},
    };
    const unsigned long long rng0 = 0x9e3779b97f4a7c15ULL;
    CHECK_CUDA(cudaMemcpy(d_rng, &rng0, sizeof rng0, cudaMemcpyHostToDevice));
    cudaEvent_t a, b;
    CHECK_CUDA(cudaEventCreate(&a));
    CHECK_CUDA(cudaEventCreate(&b));
    printf("%-20s %10s %10s %10s   (us)\n", "sample kernel", "1000", "49152", "151936");
    for (size_t ti = 0; ti < sizeof timings / sizeof *timings; ti++) {
        printf("%-20s", timings[ti].name);
        for (size_t vi = 1; vi < sizeof vocabs / sizeof *vocabs; vi++) {
            const int V = vocabs[vi];
            make_logits(logits, V, timings[ti].shape);
            int io[IO_INTS];
            io[IO_POS] = n_hist - 1, io[IO_NEXT] = -1;
            CHECK_CUDA(cudaMemcpy(d_params, &timings[ti].p, sizeof(sample_params), cudaMemcpyHostToDevice));
            CHECK_CUDA(cudaMemcpy(d_io, io, sizeof io, cudaMemcpyHostToDevice));
            float best = 1e30f;
            for (int r = 0; r < 20; r++) {
                CHECK_CUDA(cudaMemcpy(d_logits, logits, V * sizeof(float), cudaMemcpyHostToDevice));
                CHECK_CUDA(cudaEventRecord(a));
                sample_kernel<<<1, SAMPLE_THREADS>>>(d_logits, V, d_history, d_first_seen, d_io, d_params, d_rng);
                CHECK_CUDA(cudaEventRecord(b));
                CHECK_CUDA(cudaEventSynchronize(b));
                float ms;
                CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
                best = ms < best ? ms : best;
            }
            printf(" %10.1f", best * 1e3);
        }
        printf("\n");
    }
    printf("%d draws, %d mismatches\n", cases, mismatches);
    return mismatches ? 1 : 0;
}
