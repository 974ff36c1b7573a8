/* cuda_sampler.cuh - the next token drawn on the GPU, as runtime/sampler.c draws it on the CPU.
 *
 * One block of SAMPLE_THREADS runs after the LM head: repetition penalty, then greedy argmax, or
 * temperature, top-k, top-p, min-p and a draw, with sampler.c's order and rules, so that only the
 * token id crosses to the host. One SM reads the whole vocabulary, so the block reads it as few
 * times as it can, every read coalesced (a float4 per lane), and works on a few candidates in
 * shared memory wherever it can:
 *
 * - Pass 1 applies the temperature (x = logit / T, NaN as -inf, written back) and finds each
 *   thread's best token and the top token: a few instructions per logit, as the block is bound by
 *   instructions more than by L2. Its eight float4 loads per thread keep 128 KiB in flight.
 * - Top-k with k <= SAMPLE_THREADS: at least k tokens reach the k-th best of the threads' best, so
 *   one pass gathers every token at or above a floor under it (two radix rounds over those 1024
 *   keys, 16 bits): for random order about k + k^2 / 2048 tokens.
 * - Up to 64 candidates: one warp ranks them, applies top-k, top-p (prefix sums in rank order) and
 *   min-p, and draws in id order, all in registers and shuffles. Up to SAMPLE_SORT_MAX: the same
 *   on the block, with sorts in shared memory.
 * - Top-p without top-k, and top-k whose candidates do not fit, run select passes: each counts and
 *   weighs the tokens above SAMPLE_SPLITS thresholds at once, and the next looks only inside the
 *   band that holds the k-th token or the top-p crossing, until everything above the crossing, or
 *   the band, fits in shared memory, or the band is a single value (ties, taken in id order).
 * - Min-p alone gathers the tokens with w >= min_p when they fit. Survivors that do not fit are
 *   drawn by one pass of per-chunk sums in id order and a walk of the one chunk that holds
 *   r = u * total.
 * - Passes test a float bound before anything else, so tokens that cannot be taken cost a compare
 *   per four; the draw's uniform is drawn at the start and its state stored only with a draw.
 *
 * Ranks are larger x first, then lower id, sampler.c's order (-0 ties with +0). Every stage keeps a
 * rank prefix, so survivors outside shared memory are described by a cut: the last token in rank
 * order that is in. Sums are in double (a float4's four weights first in float) with a fixed order
 * of additions, so a run repeats exactly.
 * The same seed and logits give the same token as sampler.c, except where a rounding difference
 * (CUDA's expf against libm's, sums in another order) moves a boundary across r or a top-p cut:
 * about 1e-7 of the draws. tests/cuda_sampler_test.cu checks this on many cases and prints times.
 *
 */
#ifndef INGOT_CUDA_SAMPLER_CUH
#define INGOT_CUDA_SAMPLER_CUH

#include "cuda_sample_block.cuh"      /* settings, keys, shared state, primitives */
#include "cuda_sample_candidates.cuh" /* candidates in shared memory */
#include "cuda_sample_passes.cuh"     /* passes over the vocabulary */

// ------------------------------------------------------------------------------------------------
// the sampler

/* logits (vocab) -> io[IO_NEXT]; logits are modified in place (penalty, then x = logit / T).
 * history holds the ids at positions 0..pos (fed by the host or chosen by earlier steps);
 * first_seen (vocab) is scratch that must hold 0x7F7F7F7F everywhere between calls; rng[0] the
 * xorshift state, rng[1] gets the state this call started from (a host that drops the step puts
 * it back). */
__device__ __forceinline__ void sample_body(float *logits, int vocab, const int *history, int *first_seen, int *io,
                                            const sample_params *params, unsigned long long *rng) {
    sample_shared &sh = sample_sh;
    pdl_wait();
    pdl_launch_dependents();
    const sample_params p = *params;
    const int tid = threadIdx.x;
    if (tid == 0) { /* the draw's uniform now, its state stored only if a draw happens */
        unsigned long long state = *rng;
        rng[1] = state;
        sh.u = sample_unit(&state);
        sh.rng_next = state;
    }

    /* Repetition penalty on each distinct id among the last repeat_last_n once: the first
     * occurrence in the window claims it (atomicMin of its index), then the marks are cleared. */
    const int n_hist = io[IO_POS] + 1;
    if (p.repeat_penalty != 1.0f && p.repeat_last_n > 0) {
        const int n = min(p.repeat_last_n, n_hist);
        const int *recent = history + n_hist - n;
        for (int i = tid; i < n; i += blockDim.x)
            if (recent[i] >= 0 && recent[i] < vocab) atomicMin(&first_seen[recent[i]], i);
        __syncthreads();
        for (int i = tid; i < n; i += blockDim.x) {
            int id = recent[i];
            if (id >= 0 && id < vocab && first_seen[id] == i) {
                float l = logits[id];
                logits[id] = l > 0 ? l / p.repeat_penalty : l * p.repeat_penalty;
            }
        }
        __syncthreads();
        for (int i = tid; i < n; i += blockDim.x)
            if (recent[i] >= 0 && recent[i] < vocab) first_seen[recent[i]] = 0x7F7F7F7F;
        __threadfence_block();
        __syncthreads();
    }

    /* Pass 1: temperature (x = logit / T, NaN as -inf; greedy keeps the logits) and each thread's
     * best token (its ids rise, so the first of equals stays), then the top token. */
    const bool scale = p.inv_temperature != 0.0f;
    float best = -INFINITY;
    int best_id = SAMPLE_NO_ID;
    {
        constexpr int U = 8; /* float4 loads in flight */
        const int full = (reinterpret_cast<uintptr_t>(logits) & 15) == 0 ? vocab / 4 : 0;
        const float inv_t = scale ? p.inv_temperature : 1.0f; /* greedy: 1 * l, and a NaN never wins either way */
        for (int g0 = tid; g0 < full; g0 += U * SAMPLE_THREADS) {
            float4 l[U];
#pragma unroll
            for (int u = 0; u < U; u++)
                l[u] = g0 + u * SAMPLE_THREADS < full ? reinterpret_cast<const float4 *>(logits)[g0 + u * SAMPLE_THREADS]
                                                      : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int g = g0 + u * SAMPLE_THREADS;
                if (g >= full) break;
                float4 v = l[u];
                v.x = fmaxf(v.x * inv_t, -INFINITY); /* fmaxf(NaN, -inf) = -inf */
                v.y = fmaxf(v.y * inv_t, -INFINITY);
                v.z = fmaxf(v.z * inv_t, -INFINITY);
                v.w = fmaxf(v.w * inv_t, -INFINITY);
                if (scale) reinterpret_cast<float4 *>(logits)[g] = v;
                const float m = fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w));
                if (m > best) {
                    best = m;
                    best_id = 4 * g + (v.x == m ? 0 : v.y == m ? 1 : v.z == m ? 2 : 3);
                }
            }
        }
        for (int i = 4 * full + tid; i < vocab; i += SAMPLE_THREADS) {
            const float v = fmaxf(logits[i] * inv_t, -INFINITY);
            if (scale) logits[i] = v;
            if (v > best) {
                best = v;
                best_id = i;
            }
        }
    }
    const uint32_t best_key = best_id == SAMPLE_NO_ID ? 0 : rank_key(best);
    float bv = best;
    int bi = best_id;
    block_argmax(&bv, &bi);
    const int top = bi == SAMPLE_NO_ID ? 0 : bi; /* nothing above -inf: id 0, as sampler.c */
    const float x_max = bv;
    if (!scale || x_max == -INFINITY || x_max == INFINITY) {
        if (tid == 0) io[IO_NEXT] = top;
        return;
    }
    const float *x = logits; /* pass 1's writes are visible: block_argmax ends with a barrier */
    const rank_cut all = {0, SAMPLE_NO_ID};

    /* The survivors so far: the candidates [0, n) when n > 0 (in rank order, or, when k_open > 0,
     * in any order and only their k_open best are in), else the tokens within cut. */
    int n = 0, k_open = 0;
    rank_cut cut = all;
    const int k = p.top_k > 0 && p.top_k < vocab ? p.top_k : 0;

    /* Top-k: every token at or above the floor of the threads' best (one pass), else select passes. */
    if (k > 0) {
        int m = SAMPLE_SORT_MAX + 1;
        if (k <= SAMPLE_THREADS) {
            const uint32_t floor_key = best_floor(best_key, k);
            m = gather(x, vocab, make_filter(floor_key ? floor_key - 1 : 0, 0xFFFFFFFFu, all, x_max, 0.0f, true));
        }
        if (m <= WARP_SIZE * 2) {
            n = m;
            k_open = k;
        } else if (m <= SAMPLE_SORT_MAX) {
            sort_candidates(m, false);
            n = k;
        } else {
            const select_result s = select_rank(x, vocab, x_max, top, cut, k, 1.0f, vocab, false);
            n = s.n;
            cut = s.cut;
        }
    }

    /* Top-p: z over the top-k candidates, or over the whole vocabulary. */
    if (p.top_p < 1.0f && k_open == 0) {
        if (n > 0) {
            n = smem_top_p(n, x_max, 0.0, -1.0, p.top_p);
        } else {
            const select_result s = select_rank(x, vocab, x_max, top, cut, 0, p.top_p, k > 0 ? k : vocab, true);
            n = s.n;
            cut = s.cut;
        }
    }

    /* Min-p (w >= min_p, w_top = 1) and the draw in id order: by one warp for a few candidates, by
     * the block for up to SAMPLE_SORT_MAX, else over the whole vocabulary. */
    const token_filter survivors = make_filter(0, 0xFFFFFFFFu, cut, x_max, p.min_p, false);
    if (n == 0 && p.min_p > 0.0f) {
        const int m = gather(x, vocab, survivors);
        if (m <= SAMPLE_SORT_MAX) n = m;
    }
    if (n > 0 && n <= WARP_SIZE * 2) {
        if (tid < WARP_SIZE) warp_finish(n, k_open, k_open ? p.top_p : 1.0f, p.min_p, x_max, top, io, rng);
    } else if (n > 0) {
        smem_draw(n, x_max, p.min_p, top, io, rng);
    } else {
        const int id = pick_in_id_order(x, vocab, survivors, 0.0, true);
        if (tid == 0) {
            io[IO_NEXT] = id >= 0 ? id : top;
            *rng = sh.rng_next;
        }
    }
}

#endif /* INGOT_CUDA_SAMPLER_CUH */
