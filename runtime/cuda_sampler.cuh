/* cuda_sampler.cuh - the next token drawn on the GPU, as runtime/sampler.c draws it on the CPU.
 *
 * One block of SAMPLE_THREADS runs after the LM head: repetition penalty, then greedy argmax, or
 * temperature, top-k, top-p, min-p and a draw, with sampler.c's order and rules, so that only the
 * token id crosses to the host. Every stage keeps a prefix of the vocabulary in rank order (larger
 * x = logit / T first, then lower id), so the survivors are described by a cut: the last token in
 * rank order that is in. Top-k finds its cut by radix select (four 8-bit passes over the 32-bit
 * order-preserving key of x); top-p sorts the survivors in shared memory when there are at most
 * SAMPLE_SORT_MAX of them (top-k's usual few dozen), and otherwise bisects on the key with mass
 * sums over the whole vocabulary (32 passes: slow, for top-p without top-k over a flat
 * distribution); min-p is a threshold on w = exp(x - x_max). The draw walks the survivors in id
 * order, as sampler.c does: each thread sums a contiguous chunk of ids, a block scan places the
 * chunks, and the thread whose chunk holds r = u * total walks it.
 *
 * The same seed and the same logits give the same token as sampler.c, except where a rounding
 * difference (CUDA's expf against libm's, sums in another order) moves a boundary across r or a
 * top-p cut: about 1e-7 of the draws. tests/cuda_sampler_test.cu checks this on many cases.
 *
 * Needs cuda_kernels.cuh (WARP_SIZE, IO_*, pdl_wait). */
#ifndef INGOT_CUDA_SAMPLER_CUH
#define INGOT_CUDA_SAMPLER_CUH

#include <stdint.h>

#define SAMPLE_THREADS 1024
#define SAMPLE_WARPS (SAMPLE_THREADS / WARP_SIZE)
#define SAMPLE_SORT_MAX 4096 /* top-p sorts at most this many survivors in shared memory */

/* The sampler's settings on the device, as sampler_config says them (validated on the host). */
struct sample_params {
    float inv_temperature; /* 1 / temperature; 0: greedy */
    int top_k;             /* 0 or >= vocab: off */
    float top_p;           /* 1: off */
    float min_p;           /* 0: off */
    float repeat_penalty;  /* 1: off */
    int repeat_last_n;
};

/* The last token of a rank prefix: token (key, id) is in when key > c.key, or key == c.key and
 * id <= c.id. */
struct rank_cut {
    uint32_t key;
    int id;
};

/* Order-preserving 32-bit key of a float (no NaN here: they became -inf). */
__device__ __forceinline__ uint32_t rank_key(float x) {
    uint32_t u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* The float whose rank_key is key. */
__device__ __forceinline__ float key_value(uint32_t key) {
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key);
}

__device__ __forceinline__ bool within(uint32_t key, int id, rank_cut c) { return key > c.key || (key == c.key && id <= c.id); }

/* xorshift64* and the 53-bit uniform of sampler.c. */
__device__ __forceinline__ double sample_unit(unsigned long long *state) {
    unsigned long long x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return (double)((x * 0x2545f4914f6cdd1dULL) >> 11) * 0x1.0p-53;
}

struct sample_shared {
    union {
        int hist[256];          /* radix select */
        double dsum[SAMPLE_WARPS]; /* block sums */
    };
    long long isum[SAMPLE_WARPS];
    uint32_t sort_key[SAMPLE_SORT_MAX];
    int sort_id[SAMPLE_SORT_MAX];
    int count;
    int pick;
    rank_cut cut;
    uint32_t prefix;
    int remaining;
    double u;
    float best_v[SAMPLE_WARPS];
    int best_i[SAMPLE_WARPS];
};

/* Sum over the block, in every thread; ends with the shared slots free again. */
__device__ __forceinline__ double block_sum(double v, sample_shared *sh) {
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    if (threadIdx.x % WARP_SIZE == 0) sh->dsum[threadIdx.x / WARP_SIZE] = v;
    __syncthreads();
    double s = 0;
    for (int w = 0; w < SAMPLE_WARPS; w++) s += sh->dsum[w];
    __syncthreads();
    return s;
}

/* Exclusive prefix of v over the threads in order, and the total; a fixed order of additions. */
template <typename T>
__device__ __forceinline__ T block_exclusive_scan(T v, T *total, T *slots) {
    const int lane = threadIdx.x % WARP_SIZE, wid = threadIdx.x / WARP_SIZE;
    T incl = v;
#pragma unroll
    for (int o = 1; o < WARP_SIZE; o *= 2) {
        T n = __shfl_up_sync(0xFFFFFFFFu, incl, o);
        if (lane >= o) incl += n;
    }
    if (lane == WARP_SIZE - 1) slots[wid] = incl;
    __syncthreads();
    T before = 0, all = 0;
    for (int w = 0; w < SAMPLE_WARPS; w++) {
        if (w < wid) before += slots[w];
        all += slots[w];
    }
    __syncthreads();
    *total = all;
    return before + incl - v;
}

/* Lowest id among the largest values, over the block: (value, id) in every thread. */
__device__ __forceinline__ void block_argmax(float *bv, int *bi, sample_shared *sh) {
    float v = *bv;
    int i = *bi;
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o /= 2) {
        float ov = __shfl_xor_sync(0xFFFFFFFFu, v, o);
        int oi = __shfl_xor_sync(0xFFFFFFFFu, i, o);
        if (ov > v || (ov == v && oi < i)) { v = ov; i = oi; }
    }
    if (threadIdx.x % WARP_SIZE == 0) { sh->best_v[threadIdx.x / WARP_SIZE] = v; sh->best_i[threadIdx.x / WARP_SIZE] = i; }
    __syncthreads();
    v = sh->best_v[0];
    i = sh->best_i[0];
    for (int w = 1; w < SAMPLE_WARPS; w++)
        if (sh->best_v[w] > v || (sh->best_v[w] == v && sh->best_i[w] < i)) { v = sh->best_v[w]; i = sh->best_i[w]; }
    __syncthreads();
    *bv = v;
    *bi = i;
}

/* This thread's contiguous chunk [lo, hi) of the vocabulary, for the passes in id order. */
__device__ __forceinline__ void id_chunk(int vocab, int *lo, int *hi) {
    int per = (vocab + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
    *lo = min(vocab, (int)threadIdx.x * per);
    *hi = min(vocab, *lo + per);
}

/* The id of the n-th (1-based) token in id order with key == key inside cut. */
__device__ __forceinline__ int nth_tie(const float *x, int vocab, uint32_t key, rank_cut cut, int n, sample_shared *sh) {
    int lo, hi, c = 0;
    id_chunk(vocab, &lo, &hi);
    for (int i = lo; i < hi; i++) {
        uint32_t k = rank_key(x[i]);
        c += k == key && within(k, i, cut);
    }
    long long total;
    long long before = block_exclusive_scan<long long>(c, &total, sh->isum);
    if (before < n && n <= before + c) {
        int seen = (int)before;
        for (int i = lo; i < hi; i++) {
            uint32_t k = rank_key(x[i]);
            if (k == key && within(k, i, cut) && ++seen == n) { sh->pick = i; break; }
        }
    }
    __syncthreads();
    int id = sh->pick;
    __syncthreads();
    return id;
}

/* Top-k: the k-th token in rank order (0 < k < vocab), by radix select on the key. */
__device__ __forceinline__ rank_cut top_k_cut(const float *x, int vocab, int k, sample_shared *sh) {
    const int lane = threadIdx.x % WARP_SIZE;
    if (threadIdx.x == 0) { sh->prefix = 0; sh->remaining = k; }
    uint32_t mask = 0;
    int ties = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += blockDim.x) sh->hist[b] = 0;
        __syncthreads();
        const uint32_t prefix = sh->prefix;
        for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
            uint32_t key = rank_key(x[i]);
            if ((key & mask) == prefix) {
                unsigned bin = (key >> shift) & 255u;
                unsigned same = __match_any_sync(__activemask(), bin); /* one atomic per bin per warp */
                if (lane == __ffs(same) - 1) atomicAdd(&sh->hist[bin], __popc(same));
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int above = 0, b = 255;
            for (; b > 0 && above + sh->hist[b] < sh->remaining; b--) above += sh->hist[b];
            sh->remaining -= above;
            sh->prefix |= (uint32_t)b << shift;
            sh->count = sh->hist[b];
        }
        __syncthreads();
        mask |= 255u << shift;
        ties = sh->count;
    }
    rank_cut cut = {sh->prefix, vocab - 1};
    const int take = sh->remaining; /* of the ties at the cut's key, lowest ids first */
    __syncthreads();
    if (take < ties) cut.id = nth_tie(x, vocab, cut.key, cut, take, sh);
    return cut;
}

/* Sum of w = exp(x - x_max) over the tokens inside cut with key > above. */
__device__ __forceinline__ double mass_above(const float *x, int vocab, float x_max, rank_cut cut, uint32_t above,
                                             sample_shared *sh) {
    double s = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float xi = x[i];
        uint32_t k = rank_key(xi);
        if (k > above && within(k, i, cut)) s += expf(xi - x_max);
    }
    return block_sum(s, sh);
}

/* Top-p inside cut (n_in tokens): the last token in rank order whose mass strictly above it is
 * < top_p * (mass of the cut), at least the top one. */
__device__ __forceinline__ rank_cut top_p_cut(const float *x, int vocab, float x_max, int top, float top_p, rank_cut cut,
                                              int n_in, sample_shared *sh) {
    if (n_in <= SAMPLE_SORT_MAX) {
        /* Gather, sort by rank (bitonic, padded to a power of two), scan the masses in rank order. */
        if (threadIdx.x == 0) sh->count = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
            uint32_t k = rank_key(x[i]);
            if (within(k, i, cut)) {
                int slot = atomicAdd(&sh->count, 1);
                sh->sort_key[slot] = k;
                sh->sort_id[slot] = i;
            }
        }
        __syncthreads();
        int n = sh->count, size = 1;
        while (size < n) size *= 2;
        for (int j = n + threadIdx.x; j < size; j += blockDim.x) { sh->sort_key[j] = 0; sh->sort_id[j] = 0x7FFFFFFF; }
        __syncthreads();
        for (int len = 2; len <= size; len *= 2)
            for (int stride = len / 2; stride > 0; stride /= 2) {
                for (int j = threadIdx.x; j < size; j += blockDim.x) {
                    int partner = j ^ stride;
                    if (partner > j) {
                        uint32_t ka = sh->sort_key[j], kb = sh->sort_key[partner];
                        int ia = sh->sort_id[j], ib = sh->sort_id[partner];
                        bool b_above = kb > ka || (kb == ka && ib < ia); /* partner ranks above j */
                        bool descending = (j & len) == 0;                /* best first in this run */
                        if (b_above == descending) {
                            sh->sort_key[j] = kb; sh->sort_key[partner] = ka;
                            sh->sort_id[j] = ib; sh->sort_id[partner] = ia;
                        }
                    }
                }
                __syncthreads();
            }
        /* Thread t holds ranks [4t, 4t + 4): its masses, their place in the whole. */
        constexpr int PER = SAMPLE_SORT_MAX / SAMPLE_THREADS;
        double w[PER], local = 0;
#pragma unroll
        for (int r = 0; r < PER; r++) {
            int j = PER * threadIdx.x + r;
            w[r] = j < n ? (double)expf(x[sh->sort_id[j]] - x_max) : 0.0;
            local += w[r];
        }
        double z;
        double above = block_exclusive_scan<double>(local, &z, sh->dsum);
        const double target = (double)top_p * z;
        if (threadIdx.x == 0) sh->pick = 0;
        __syncthreads();
#pragma unroll
        for (int r = 0; r < PER; r++) {
            int j = PER * threadIdx.x + r;
            if (j < n && (j == 0 || above < target)) atomicMax(&sh->pick, j); /* the kept ranks are a prefix */
            above += w[r];
        }
        __syncthreads();
        rank_cut c = {sh->sort_key[sh->pick], sh->sort_id[sh->pick]};
        __syncthreads();
        return c;
    }
    /* Many survivors: the smallest key K whose mass above is < target, by bisection, then the
     * lowest survivor key at or above it, then how many of its ties the target admits. */
    const double z = mass_above(x, vocab, x_max, cut, 0, sh), target = (double)top_p * z;
    if (!(target > 0)) return rank_cut{rank_key(x_max), top};
    uint32_t lo = 0, hi = 0xFFFFFFFFu;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (mass_above(x, vocab, x_max, cut, mid, sh) < target) hi = mid;
        else lo = mid + 1;
    }
    uint32_t kmin = 0xFFFFFFFFu;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        uint32_t k = rank_key(x[i]);
        if (k >= lo && within(k, i, cut)) kmin = min(kmin, k);
    }
    if (threadIdx.x == 0) sh->prefix = 0xFFFFFFFFu;
    __syncthreads();
    atomicMin(&sh->prefix, kmin);
    __syncthreads();
    const uint32_t key = sh->prefix;
    __syncthreads();
    const double above = mass_above(x, vocab, x_max, cut, key, sh);
    int ties = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) ties += rank_key(x[i]) == key && within(key, i, cut);
    long long total;
    block_exclusive_scan<long long>(ties, &total, sh->isum);
    const double wk = expf(key_value(key) - x_max); /* every tie weighs the same */
    long long take = total; /* ties j = 0, 1, ... are in while above + j * wk < target */
    if (wk > 0) take = min(total, (long long)ceil((target - above) / wk));
    if (take < 1) take = 1;
    rank_cut c = {key, cut.key == key ? cut.id : vocab - 1};
    if (take < total) c.id = nth_tie(x, vocab, key, cut, (int)take, sh);
    return c;
}

/* logits (vocab) -> io[IO_NEXT]; logits are modified in place (penalty, then x = logit / T).
 * history holds the ids at positions 0..pos (the embed step writes them); first_seen (vocab) is
 * scratch that must hold 0x7F7F7F7F everywhere between calls; rng the xorshift state. */
__device__ __forceinline__ void sample_body(float *logits, int vocab, const int *history, int *first_seen, int *io,
                                            const sample_params *params, unsigned long long *rng) {
    __shared__ sample_shared sh;
    pdl_wait();
    pdl_launch_dependents();
    const sample_params p = *params;
    const int tid = threadIdx.x;

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

    /* Temperature (x = logit / T, NaN as -inf; greedy keeps the logits) and the top token. */
    float bv = -INFINITY;
    int bi = 0x7FFFFFFF;
    for (int i = tid; i < vocab; i += blockDim.x) {
        float l = logits[i];
        if (p.inv_temperature != 0.0f) logits[i] = l = l == l ? l * p.inv_temperature : -INFINITY;
        if (l > bv) { bv = l; bi = i; } /* ids rise within a thread: the first max is the lowest */
    }
    block_argmax(&bv, &bi, &sh);
    const int top = bi == 0x7FFFFFFF ? 0 : bi; /* nothing above -inf: id 0, as sampler.c */
    const float x_max = bv;
    if (p.inv_temperature == 0.0f || x_max == -INFINITY || x_max == INFINITY) {
        if (tid == 0) io[IO_NEXT] = top;
        return;
    }
    const float *x = logits;

    /* The survivors: a rank prefix from top-k, shortened by top-p. */
    rank_cut cut = {0, vocab - 1};
    int n_in = vocab;
    if (p.top_k > 0 && p.top_k < vocab) {
        cut = top_k_cut(x, vocab, p.top_k, &sh);
        n_in = p.top_k;
    }
    if (p.top_p < 1.0f) cut = top_p_cut(x, vocab, x_max, top, p.top_p, cut, n_in, &sh);

    /* The draw, in id order over the survivors with w >= min_p (w_top = 1). */
    int lo, hi;
    id_chunk(vocab, &lo, &hi);
    double s = 0;
    int last = -1;
    for (int i = lo; i < hi; i++) {
        float xi = x[i];
        float w = expf(xi - x_max);
        if (within(rank_key(xi), i, cut) && (p.min_p <= 0.0f || w >= p.min_p)) {
            s += w;
            if (w > 0) last = i;
        }
    }
    double total;
    double before = block_exclusive_scan<double>(s, &total, sh.dsum);
    if (tid == 0) {
        sh.u = sample_unit(rng);
        sh.pick = 0x7FFFFFFF;
    }
    __syncthreads();
    const double r = sh.u * total;
    if (s > 0 && before <= r && r < before + s) {
        double acc = before;
        for (int i = lo; i < hi; i++) {
            float xi = x[i];
            float w = expf(xi - x_max);
            if (within(rank_key(xi), i, cut) && (p.min_p <= 0.0f || w >= p.min_p)) {
                acc += w;
                if (r < acc) { atomicMin(&sh.pick, i); break; }
            }
        }
    }
    __syncthreads();
    if (sh.pick == 0x7FFFFFFF) { /* rounding left r at the very top: the last survivor with weight */
        bv = (float)last;
        bi = last;
        block_argmax(&bv, &bi, &sh);
        if (tid == 0) io[IO_NEXT] = bi >= 0 ? bi : top;
    } else if (tid == 0) {
        io[IO_NEXT] = sh.pick;
    }
}

#endif
