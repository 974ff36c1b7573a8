/* cuda_sample_passes.cuh - the GPU sampler's passes over the whole vocabulary: the draw in id order
 * over chunk sums (pick_in_id_order), and the select passes that narrow a band of keys to the k-th
 * token or the top-p crossing (select_rank), with the floor under the k best of the threads' best. */
#ifndef INGOT_CUDA_SAMPLE_PASSES_CUH
#define INGOT_CUDA_SAMPLE_PASSES_CUH

#include "cuda_sample_candidates.cuh"

/* The first id in id order at which the running weight (filter_weight, where > 0) exceeds r;
 * draw: r = sh.u * total. -1 if no token has weight. One pass: warp w sums chunks w, w +
 * SAMPLE_WARPS, ... of `span` ids, lane L reading ids [4L, 4L + 4) of every 128 (coalesced), a
 * float4's weights summed in float, then in double; a block scan places the chunks; warp 0 walks
 * the chunk that holds r in id order, in double. When rounding leaves r past that chunk's end: its
 * last token with weight, which for r >= total is the last of all, as in sampler.c. */
static __device__ __noinline__ int pick_in_id_order(const float *x, int vocab, token_filter f, double r, bool draw) {
    sample_shared &sh = sample_sh;
    const int tid = threadIdx.x, lane = tid % WARP_SIZE, wid = tid / WARP_SIZE;
    const int span = SAMPLE_CHUNK * ((vocab + SAMPLE_CHUNK * SAMPLE_THREADS - 1) / (SAMPLE_CHUNK * SAMPLE_THREADS));
    const int chunks = (vocab + span - 1) / span, rows = span / (4 * WARP_SIZE);
    const bool vec = (reinterpret_cast<uintptr_t>(x) & 15) == 0;
    constexpr int U = 4; /* rows in flight */
    static_assert(SAMPLE_CHUNK % (U * 4 * WARP_SIZE) == 0, "whole rows in flight");
    for (int c = wid; c < chunks; c += SAMPLE_WARPS) {
        double s = 0;
        for (int row = 0; row < rows; row += U) {
            float4 v[U];
#pragma unroll
            for (int u = 0; u < U; u++) v[u] = load4(x, c * span + (row + u) * 4 * WARP_SIZE + 4 * lane, vocab, vec);
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int i = c * span + (row + u) * 4 * WARP_SIZE + 4 * lane;
                if (fmaxf(fmaxf(v[u].x, v[u].y), fmaxf(v[u].z, v[u].w)) < f.x_floor) continue;
                float s4 = 0.0f;
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float w = i + e < vocab ? filter_weight(f, lane4(v[u], e), i + e) : -1.0f;
                    if (w > 0) s4 += w;
                }
                s += s4;
            }
        }
        s = warp_sum(s);
        if (lane == 0) sh.chunk[c] = s;
    }
    __syncthreads();
    const double mine = tid < chunks ? sh.chunk[tid] : 0.0;
    double total;
    const double start = block_exclusive_scan<double>(mine, &total, sh.dslot);
    if (draw) r = sh.u * total;
    const int c = block_max(mine > 0 && start <= r ? tid : -1); /* the last chunk starting at or below r */
    if (c < 0) return -1;
    if (tid == c) sh.start = start;
    __syncthreads();
    if (wid == 0) {
        for (int row = 0; row < rows; row++) /* the walk's loads, in flight at once */
            asm volatile("prefetch.global.L1 [%0];" ::"l"(x + min(vocab - 1, c * span + row * 4 * WARP_SIZE + 4 * lane)));
        double acc = sh.start;
        int hit = -1, chunk_last = -1;
        for (int row = 0; row < rows && hit < 0; row++) {
            const int i = c * span + row * 4 * WARP_SIZE + 4 * lane;
            const float4 v = load4(x, i, vocab, vec);
            double mine4 = 0;
#pragma unroll 1
            for (int e = 0; e < 4; e++) {
                const float w = i + e < vocab ? filter_weight(f, lane4(v, e), i + e) : -1.0f;
                if (w > 0) mine4 += w;
            }
            const double incl = warp_inclusive_scan(mine4), lanes_before = __shfl_up_sync(SAMPLE_ALL, incl, 1);
            double a = acc + (lane ? lanes_before : 0.0);
            int h = -1;
#pragma unroll 1
            for (int e = 0; e < 4; e++) {
                const float w = i + e < vocab ? filter_weight(f, lane4(v, e), i + e) : -1.0f;
                if (w > 0) {
                    a += w;
                    chunk_last = i + e;
                    if (h < 0 && r < a) h = i + e;
                }
            }
            const unsigned found = __ballot_sync(SAMPLE_ALL, h >= 0);
            if (found) hit = __shfl_sync(SAMPLE_ALL, h, __ffs(found) - 1);
            acc += __shfl_sync(SAMPLE_ALL, incl, WARP_SIZE - 1);
        }
        chunk_last = warp_max(chunk_last);
        if (lane == 0) sh.pick = hit >= 0 ? hit : chunk_last;
    }
    __syncthreads();
    const int id = sh.pick;
    __syncthreads();
    return id;
}

/* A floor for the k-th best of the threads' best tokens (key: this thread's, 0 if it has none): at
 * least k of them have a key >= it, so at least k tokens do. 16 bits of the key, by two 8-bit
 * radix rounds; 0 when fewer than k threads have a token. */
__device__ __forceinline__ uint32_t best_floor(uint32_t key, int k) {
    sample_shared &sh = sample_sh;
    const int lane = threadIdx.x % WARP_SIZE;
    if (threadIdx.x == 0) {
        sh.prefix = 0;
        sh.rem = k;
    }
#pragma unroll 1
    for (int round = 0; round < 2; round++) {
        const int shift = 24 - 8 * round;
        if (threadIdx.x < 256) sh.hist[threadIdx.x] = 0;
        __syncthreads();
        const uint32_t prefix = sh.prefix;
        const int rem = sh.rem;
        if (rem <= 0) break;
        const bool in = key != 0 && (round == 0 || (key >> 24) == (prefix >> 24));
        const unsigned bin = in ? (key >> shift) & 255u : 256u;
        const unsigned same = __match_any_sync(SAMPLE_ALL, bin); /* one atomic per bin per warp */
        if (in && lane == __ffs(same) - 1) atomicAdd(&sh.hist[bin], __popc(same));
        __syncthreads();
        if (threadIdx.x < WARP_SIZE) { /* lane L: bins 255 - 8L down to 248 - 8L */
            int s = 0;
#pragma unroll 1
            for (int q = 0; q < 8; q++) s += sh.hist[255 - 8 * lane - q];
            const int incl = warp_inclusive_scan(s);
            const unsigned reach = __ballot_sync(SAMPLE_ALL, incl >= rem);
            if (!reach) {
                if (lane == 0) sh.rem = 0;
            } else if (lane == __ffs(reach) - 1) {
                int above = incl - s, q = 0;
                while (above + sh.hist[255 - 8 * lane - q] < rem) above += sh.hist[255 - 8 * lane - q++];
                sh.prefix = prefix | ((uint32_t)(255 - 8 * lane - q) << shift);
                sh.rem = rem - above;
            }
        }
        __syncthreads();
    }
    const uint32_t result = sh.rem > 0 ? sh.prefix : 0;
    __syncthreads();
    return result;
}

/* SAMPLE_SPLITS thresholds t[0] > t[1] > ... inside the band of keys (lo, hi]: geometric below
 * x_max (1/8, 1/4, ... apart), else evenly spaced in x, or in key space where floats are too close. */
__device__ __forceinline__ void split_band(uint32_t *t, uint32_t lo, uint32_t hi, float x_max, bool geometric) {
    constexpr int S = SAMPLE_SPLITS;
    if (geometric) {
#pragma unroll
        for (int j = 0; j < S; j++) t[j] = rank_key(x_max - 0.125f * (float)(1 << j));
        return;
    }
    const float xl = key_value(lo), xh = key_value(hi), d = xh - xl;
    bool ok = isfinite(xl) && isfinite(xh) && isfinite(d);
#pragma unroll
    for (int j = 0; j < S; j++) {
        t[j] = rank_key(xh - d * (float)(j + 1) / (float)(S + 1));
        ok = ok && t[j] > lo && t[j] < hi && (j == 0 || t[j] < t[j - 1]);
    }
    if (ok) return;
#pragma unroll
    for (int j = 0; j < S; j++) t[j] = hi - (uint32_t)((uint64_t)(hi - lo) * (uint64_t)(j + 1) / (S + 1));
}

struct select_result {
    int n;        /* > 0: the survivors are the candidates [0, n), in rank order */
    rank_cut cut; /* else: the survivors are the tokens within cut */
};

/* Among the tokens within c: !mass, the k best (top-k); mass, the tokens whose mass strictly above
 * them is < top_p times the mass of those within c (top-p over n_in tokens, at least the top one).
 * Each pass sums the quantity (1 or w) above each of SAMPLE_SPLITS thresholds inside the band
 * (lo, hi] that holds the crossing, and the next pass looks inside the split that holds it, until
 * everything above the crossing or the band fits in shared memory, or the band is one value
 * (ties: the crossing is in id order among them). */
static __device__ __noinline__ select_result select_rank(const float *x, int vocab, float x_max, int top, rank_cut c, int k,
                                                  float top_p, int n_in, bool mass) {
    sample_shared &sh = sample_sh;
    constexpr int S = SAMPLE_SPLITS;
    const int lane = threadIdx.x % WARP_SIZE, wid = threadIdx.x / WARP_SIZE;
    uint32_t hi = rank_key(x_max), lo = 0;
    double above = 0, target = k; /* mass: set by the first pass */
    int n_above = 0;
    bool first = true;
    if (mass && fabsf(x_max) < 1e4f) {
        /* sampler.c's cut: below w = (1 - top_p) / (2 (n - 1)) (z >= 1), a token cannot be in the
         * nucleus; one more unit of x absorbs every rounding. */
        lo = rank_key(x_max + logf(0.5f * (1.0f - top_p) / (float)max(n_in - 1, 1)) - 1.0f);
    }
    for (;;) {
        uint32_t t[S];
        split_band(t, lo, hi, x_max, first && !mass);
        double m[S], mb = 0, z = 0;
        uint32_t cn[S / 2], nb = 0; /* counts above t[2i] and t[2i + 1], in the low and high halves */
        uint32_t bmin = 0xFFFFFFFFu, bmax = 0;
#pragma unroll
        for (int j = 0; j < S; j++) m[j] = 0;
#pragma unroll
        for (int j = 0; j < S / 2; j++) cn[j] = 0;
        for_each_group<2>(x, vocab, [&](float4 v, int base, int n) {
#pragma unroll 1
            for (int e = 0; e < n; e++) {
                const float xi = lane4(v, e);
                const uint32_t key = rank_key(xi);
                if (!within(key, base + e, c)) continue;
                const bool in_band = key > lo && key <= hi;
                double w = 1.0;
                if (mass && (first || in_band)) {
                    w = expf(xi - x_max);
                    if (first) z += w;
                }
                if (in_band) {
                    bmin = min(bmin, key);
                    bmax = max(bmax, key);
#pragma unroll
                    for (int j = 0; j < S; j++)
                        if (key > t[j]) m[j] += w;
#pragma unroll
                    for (int j = 0; j < S / 2; j++) cn[j] += (uint32_t)(key > t[2 * j]) | ((uint32_t)(key > t[2 * j + 1]) << 16);
                    mb += w;
                    nb++;
                }
            }
        });
#pragma unroll
        for (int j = 0; j < S; j++) {
            const double ms = warp_sum(m[j]);
            const int ns = warp_sum((int)((cn[j / 2] >> (16 * (j % 2))) & 0xFFFFu)); /* a thread counts < 2^16 */
            if (lane == 0) {
                sh.dpart[wid][j] = ms;
                sh.ipart[wid][j] = ns;
            }
        }
        mb = warp_sum(mb);
        z = warp_sum(z);
        const int nbs = warp_sum((int)nb);
        bmin = warp_min(bmin);
        bmax = warp_max(bmax);
        if (lane == 0) {
            sh.dpart[wid][S] = mb;
            sh.dpart[wid][S + 1] = z;
            sh.ipart[wid][S] = nbs;
            sh.ipart[wid][S + 1] = (int)bmin;
            sh.ipart[wid][S + 2] = (int)bmax;
        }
        __syncthreads();
        if (wid < S + 2) { /* one warp per column, the warps in order */
            const double s = warp_sum(sh.dpart[lane][wid]);
            if (lane == 0) sh.dtotal[wid] = s;
        } else if (wid >= SAMPLE_WARPS / 2 && wid < SAMPLE_WARPS / 2 + S + 3) {
            const int col = wid - SAMPLE_WARPS / 2, v = sh.ipart[lane][col];
            const int s = col <= S ? warp_sum(v) : col == S + 1 ? (int)warp_min((uint32_t)v) : (int)warp_max((uint32_t)v);
            if (lane == 0) sh.itotal[col] = s;
        }
        __syncthreads();
        int cnt[S];
#pragma unroll
        for (int j = 0; j < S; j++) {
            cnt[j] = sh.itotal[j];
            m[j] = sh.dtotal[j];
        }
        const int nband = sh.itotal[S];
        bmin = (uint32_t)sh.itotal[S + 1];
        bmax = (uint32_t)sh.itotal[S + 2];
        if (mass && first) {
            target = (double)top_p * sh.dtotal[S + 1];
            if (!(target > 0)) { /* top_p = 0: the top token alone */
                if (threadIdx.x == 0) {
                    sh.key[0] = rank_key(x_max);
                    sh.id[0] = top;
                }
                __syncthreads();
                return select_result{1, c};
            }
        }
        first = false;
        if (nband == 0) return select_result{0, rank_cut{lo, -1}}; /* rounding: everything above the band */

        /* The split that holds the crossing: (bottom, upper], with a_sub and n_sub above it. */
        uint32_t bottom = lo, upper = hi;
        double a_sub = above;
        int n_sub = n_above, n_all = n_above + nband;
        bool found = bmin == bmax; /* one value: ties */
#pragma unroll
        for (int j = 0; j < S; j++) {
            if (found) continue;
            if (target <= above + m[j]) {
                found = true;
                bottom = t[j];
                n_all = n_above + cnt[j];
            } else {
                upper = t[j];
                a_sub = above + m[j];
                n_sub = n_above + cnt[j];
            }
        }
        if (bmin != bmax && n_all <= SAMPLE_SORT_MAX) { /* everything above the crossing fits */
            const int n = min(SAMPLE_SORT_MAX, gather(x, vocab, make_filter(bottom, 0xFFFFFFFFu, c, x_max, 0.0f, true)));
            sort_candidates(n, false);
            return select_result{mass ? smem_top_p(n, x_max, 0.0, target, top_p) : k, c};
        }
        lo = max(bottom, bmin - 1);
        hi = min(upper, bmax);
        above = a_sub;
        n_above = n_sub;
        const int band = n_all - n_sub;
        if (band <= SAMPLE_SORT_MAX) { /* the band fits: the crossing by a scan in rank order */
            const int n = min(SAMPLE_SORT_MAX, gather(x, vocab, make_filter(lo, hi, c, x_max, 0.0f, true)));
            sort_candidates(n, false);
            const int j = mass ? smem_top_p(n, x_max, above, target, top_p) - 1 : min(n, k - n_above) - 1;
            const rank_cut cut = {sh.key[j], sh.id[j]};
            __syncthreads();
            return select_result{0, cut};
        }
        if (hi - lo <= 1) { /* ties at key hi: the first `take` of them in id order are in */
            int take = k - n_above;
            if (mass) {
                const double w = expf(key_value(hi) - x_max); /* every tie weighs the same */
                take = w > 0 ? (int)fmin((double)band, ceil((target - above) / w)) : band;
            }
            take = max(1, min(take, band));
            const int id = pick_in_id_order(x, vocab, make_filter(hi - 1, hi, c, x_max, 0.0f, true), take - 1.0, false);
            return select_result{0, rank_cut{hi, id}};
        }
    }
}

#endif /* INGOT_CUDA_SAMPLE_PASSES_CUH */
