/* cuda_sample_candidates.cuh - the GPU sampler's candidates in shared memory (sample_shared's key
 * and id, at most SAMPLE_SORT_MAX): sorted by rank or id, gathered by a filter, cut by top-p, drawn
 * in id order; up to 64 of them by one warp in registers (warp_finish). */
#ifndef INGOT_CUDA_SAMPLE_CANDIDATES_CUH
#define INGOT_CUDA_SAMPLE_CANDIDATES_CUH

#include "cuda_sample_block.cuh"

/* Sorts the candidates [0, n) by rank (key descending, then id) or by id; n <= SAMPLE_SORT_MAX.
 * Starts after a barrier that follows their writes and ends with one. Up to 128 by counting (a
 * candidate's place is how many come before it, counted by a group of lanes), else bitonic. */
static __device__ __noinline__ void sort_candidates(int n, bool by_id) {
    sample_shared &sh = sample_sh;
    const int tid = threadIdx.x;
    if (n <= 1) return;
    if (n <= 128) {
        int span = 1;
        while (span < n) span *= 2;
        const int per = min(WARP_SIZE, SAMPLE_THREADS / span); /* lanes per candidate, a power of two */
        const int e = tid / per, part = tid % per;
        uint32_t k = 0;
        int i = 0, place = 0;
        if (e < n) {
            k = sh.key[e];
            i = sh.id[e];
#pragma unroll 1
            for (int j = part; j < n; j += per) place += by_id ? sh.id[j] < i : ranks_above(sh.key[j], sh.id[j], k, i);
        }
        for (int o = per / 2; o > 0; o /= 2) place += __shfl_xor_sync(SAMPLE_ALL, place, o);
        constexpr int OUT = SAMPLE_SORT_MAX / 2;
        if (e < n && part == 0) {
            sh.key[OUT + place] = k;
            sh.id[OUT + place] = i;
        }
        __syncthreads();
        if (tid < n) {
            sh.key[tid] = sh.key[OUT + tid];
            sh.id[tid] = sh.id[OUT + tid];
        }
        __syncthreads();
        return;
    }
    int size = 256;
    while (size < n) size *= 2;
    for (int j = n + tid; j < size; j += SAMPLE_THREADS) {
        sh.key[j] = 0; /* ranks below every token, and its id after every id */
        sh.id[j] = SAMPLE_NO_ID;
    }
    __syncthreads();
#pragma unroll 1
    for (int len = 2; len <= size; len *= 2)
#pragma unroll 1
        for (int stride = len / 2; stride > 0; stride /= 2) {
#pragma unroll 1
            for (int q = tid; q < size / 2; q += SAMPLE_THREADS) {
                const int a = ((q & ~(stride - 1)) << 1) | (q & (stride - 1)), b = a + stride;
                const uint32_t ka = sh.key[a], kb = sh.key[b];
                const int ia = sh.id[a], ib = sh.id[b];
                const bool b_first = by_id ? ib < ia : ranks_above(kb, ib, ka, ia);
                if (b_first == ((a & len) == 0)) { /* runs alternate: earlier first, then later first */
                    sh.key[a] = kb;
                    sh.key[b] = ka;
                    sh.id[a] = ib;
                    sh.id[b] = ia;
                }
            }
            __syncthreads();
        }
}

/* The tokens f takes, into the candidates in no particular order; returns how many (only
 * SAMPLE_SORT_MAX are stored). One pass. */
static __device__ __noinline__ int gather(const float *x, int vocab, token_filter f) {
    if (threadIdx.x == 0) sample_sh.count = 0;
    __syncthreads();
    for_each_group<4>(x, vocab, [&](float4 v, int base, int n) {
        if (!__any_sync(SAMPLE_ALL, n > 0 && fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)) >= f.x_floor)) return;
#pragma unroll 1
        for (int e = 0; e < 4; e++) {
            const float xe = lane4(v, e);
            warp_append(e < n && filter_weight(f, xe, base + e) >= 0.0f, rank_key(xe), base + e);
        }
    });
    __syncthreads();
    const int n = sample_sh.count;
    __syncthreads();
    return n;
}

/* Top-p over the candidates [0, n) in rank order: how many stay, at least one. Candidate j stays
 * while above0 + (the weight of [0, j)) < target; target < 0: top_p times the candidates' own
 * weight (top-k's candidates: sampler.c's z). */
static __device__ __noinline__ int smem_top_p(int n, float x_max, double above0, double target, float top_p) {
    sample_shared &sh = sample_sh;
    constexpr int PER = SAMPLE_SORT_MAX / SAMPLE_THREADS;
    const int j0 = PER * (int)threadIdx.x;
    double local = 0;
#pragma unroll 1
    for (int j = j0; j < min(n, j0 + PER); j++) local += expf(key_value(sh.key[j]) - x_max);
    if (threadIdx.x == 0) sh.pick = n;
    double z;
    double part = block_exclusive_scan<double>(local, &z, sh.dslot);
    if (target < 0) target = (double)top_p * z;
#pragma unroll 1
    for (int j = j0; j < min(n, j0 + PER); j++) {
        if (j >= 1 && !(above0 + part < target)) {
            atomicMin(&sh.pick, j);
            break;
        }
        part += expf(key_value(sh.key[j]) - x_max);
    }
    __syncthreads();
    const int keep = sh.pick;
    __syncthreads();
    return keep;
}

/* The draw over the candidates [0, n) (any order) that min-p keeps, in id order, with sh.u:
 * io[IO_NEXT], and the generator's new state to rng. */
static __device__ __noinline__ void smem_draw(int n, float x_max, float min_p, int top, int *io, unsigned long long *rng) {
    sample_shared &sh = sample_sh;
    constexpr int PER = SAMPLE_SORT_MAX / SAMPLE_THREADS;
    const int j0 = PER * (int)threadIdx.x;
    if (min_p > 0.0f) { /* keep w >= min_p (w_top = 1), compacted in place */
        unsigned in = 0;
        int kept = 0;
#pragma unroll 1
        for (int r = 0; r < PER; r++)
            if (j0 + r < n && expf(key_value(sh.key[j0 + r]) - x_max) >= min_p) {
                in |= 1u << r;
                kept++;
            }
        uint32_t k[PER];
        int id[PER];
#pragma unroll
        for (int r = 0; r < PER; r++) {
            k[r] = sh.key[j0 + r];
            id[r] = sh.id[j0 + r];
        }
        int total;
        int at = block_exclusive_scan<int>(kept, &total, sh.islot); /* its barriers: every thread has read */
#pragma unroll
        for (int r = 0; r < PER; r++)
            if (in >> r & 1) {
                sh.key[at] = k[r];
                sh.id[at++] = id[r];
            }
        __syncthreads();
        n = total;
    }
    sort_candidates(n, true);
    double local = 0;
#pragma unroll 1
    for (int j = j0; j < min(n, j0 + PER); j++) local += expf(key_value(sh.key[j]) - x_max);
    if (threadIdx.x == 0) {
        sh.pick = SAMPLE_NO_ID;
        sh.pick_last = -1;
    }
    double total;
    double acc = block_exclusive_scan<double>(local, &total, sh.dslot);
    const double r = sh.u * total;
    int first = SAMPLE_NO_ID, last = -1;
#pragma unroll 1
    for (int j = j0; j < min(n, j0 + PER); j++) {
        const float w = expf(key_value(sh.key[j]) - x_max);
        acc += w;
        if (w > 0) {
            last = j;
            if (first == SAMPLE_NO_ID && r < acc) first = j;
        }
    }
    if (first != SAMPLE_NO_ID) atomicMin(&sh.pick, first);
    if (last >= 0) atomicMax(&sh.pick_last, last);
    __syncthreads();
    if (threadIdx.x == 0) { /* rounding left r at the very top: the last survivor with weight */
        const int j = sh.pick != SAMPLE_NO_ID ? sh.pick : sh.pick_last;
        io[IO_NEXT] = j >= 0 ? sh.id[j] : top;
        *rng = sh.rng_next;
    }
}

/* The first set bit of interleaved ballots (bit 2L + h of the pair is bit L of b[h]), or -1. */
__device__ __forceinline__ int first_of_pairs(unsigned b0, unsigned b1) {
    const int j0 = b0 ? 2 * (__ffs(b0) - 1) : 2 * WARP_SIZE, j1 = b1 ? 2 * (__ffs(b1) - 1) + 1 : 2 * WARP_SIZE;
    return min(j0, j1) < 2 * WARP_SIZE ? min(j0, j1) : -1;
}

/* For n <= 64 candidates [0, n) in any order, warp 0 alone does what the block-wide functions
 * do: k > 0 keeps their k best, top_p < 1 the nucleus of those (z over them), then min-p and the
 * draw in id order with sh.u, into io[IO_NEXT] and the generator's state to rng. Lane L holds
 * positions 2L and 2L + 1; ranks are counted, and the candidates reordered through shared memory
 * (past the first 64: rank order at RANKED, id order at DRAWN). */
static __device__ __noinline__ void warp_finish(int n, int k, float top_p, float min_p, float x_max, int top, int *io,
                                         unsigned long long *rng) {
    sample_shared &sh = sample_sh;
    constexpr int RANKED = SAMPLE_SORT_MAX / 2, DRAWN = RANKED + 2 * WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    uint32_t key[2];
    int id[2], place[2] = {0, 0};
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int j = 2 * lane + h;
        key[h] = j < n ? sh.key[j] : 0;
        id[h] = j < n ? sh.id[j] : SAMPLE_NO_ID;
    }
#pragma unroll 4
    for (int i = 0; i < n; i++) {
        const uint32_t ki = sh.key[i];
        const int ii = sh.id[i];
#pragma unroll
        for (int h = 0; h < 2; h++) place[h] += ranks_above(ki, ii, key[h], id[h]);
    }
    const int m = k > 0 ? min(k, n) : n; /* top-k: the first m in rank order */
#pragma unroll
    for (int h = 0; h < 2; h++)
        if (2 * lane + h < n && place[h] < m) {
            sh.key[RANKED + place[h]] = key[h];
            sh.id[RANKED + place[h]] = id[h];
        }
    __syncwarp();
    float w[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int j = 2 * lane + h;
        key[h] = j < m ? sh.key[RANKED + j] : 0;
        id[h] = j < m ? sh.id[RANKED + j] : SAMPLE_NO_ID;
        w[h] = j < m ? expf(key_value(key[h]) - x_max) : 0.0f;
    }
    int keep = m;
    if (top_p < 1.0f) { /* keep while the weight above stays < top_p * z, at least one */
        const double pair = (double)w[0] + (double)w[1], incl = warp_inclusive_scan(pair);
        const double before = __shfl_up_sync(SAMPLE_ALL, incl, 1), z = __shfl_sync(SAMPLE_ALL, incl, WARP_SIZE - 1);
        const double above0 = lane ? before : 0.0, above1 = above0 + (double)w[0], target = (double)top_p * z;
        const int out = first_of_pairs(__ballot_sync(SAMPLE_ALL, lane >= 1 && 2 * lane < m && !(above0 < target)),
                                       __ballot_sync(SAMPLE_ALL, 2 * lane + 1 < m && !(above1 < target)));
        if (out >= 0) keep = out;
    }
#pragma unroll
    for (int h = 0; h < 2; h++) /* the survivors keep their key, the others get 0 */
        if (2 * lane + h < m && !(2 * lane + h < keep && w[h] >= min_p)) sh.key[RANKED + 2 * lane + h] = 0;
    __syncwarp();
    place[0] = place[1] = 0; /* now: place among the survivors in id order */
    int ns = 0;
#pragma unroll 4
    for (int i = 0; i < keep; i++) {
        const bool alive = sh.key[RANKED + i] != 0;
        const int ii = sh.id[RANKED + i];
        ns += alive;
#pragma unroll
        for (int h = 0; h < 2; h++) place[h] += alive && ii < id[h];
    }
#pragma unroll
    for (int h = 0; h < 2; h++)
        if (2 * lane + h < keep && w[h] >= min_p) {
            sh.key[DRAWN + place[h]] = __float_as_uint(w[h]);
            sh.id[DRAWN + place[h]] = id[h];
        }
    __syncwarp();
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int j = 2 * lane + h;
        w[h] = j < ns ? __uint_as_float(sh.key[DRAWN + j]) : 0.0f;
        id[h] = j < ns ? sh.id[DRAWN + j] : -1;
    }
    const double pair = (double)w[0] + (double)w[1], incl = warp_inclusive_scan(pair);
    const double before = __shfl_up_sync(SAMPLE_ALL, incl, 1), total = __shfl_sync(SAMPLE_ALL, incl, WARP_SIZE - 1);
    const double acc0 = (lane ? before : 0.0) + (double)w[0], acc1 = acc0 + (double)w[1], r = sh.u * total;
    /* the first whose running weight passes r; rounding left r at the very top: the last with weight */
    int from = first_of_pairs(__ballot_sync(SAMPLE_ALL, w[0] > 0 && r < acc0), __ballot_sync(SAMPLE_ALL, w[1] > 0 && r < acc1));
    if (from < 0) {
        const unsigned p0 = __ballot_sync(SAMPLE_ALL, w[0] > 0), p1 = __ballot_sync(SAMPLE_ALL, w[1] > 0);
        from = max(p0 ? 2 * (WARP_SIZE - 1 - __clz(p0)) : -1, p1 ? 2 * (WARP_SIZE - 1 - __clz(p1)) + 1 : -1);
    }
    const int pick0 = __shfl_sync(SAMPLE_ALL, id[0], max(from, 0) / 2), pick1 = __shfl_sync(SAMPLE_ALL, id[1], max(from, 0) / 2);
    if (lane == 0) {
        io[IO_NEXT] = from < 0 ? top : from % 2 ? pick1 : pick0;
        *rng = sh.rng_next;
    }
}

#endif /* INGOT_CUDA_SAMPLE_CANDIDATES_CUH */
