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

#include <stdint.h>

#include "cuda_sync.cuh"

#define SAMPLE_THREADS 1024
#define SAMPLE_WARPS (SAMPLE_THREADS / WARP_SIZE)
#define SAMPLE_SORT_MAX 4096 /* most candidates sorted in shared memory */
#define SAMPLE_SPLITS 6      /* thresholds a select pass counts at once */
#define SAMPLE_CHUNK 1024    /* ids per chunk of a draw pass, times what keeps the chunks <= SAMPLE_THREADS */
#define SAMPLE_NO_ID 0x7FFFFFFF
#define SAMPLE_ALL 0xFFFFFFFFu /* every lane of a warp */

static_assert(SAMPLE_WARPS == WARP_SIZE, "block reductions: one warp reduces the per-warp slots");
static_assert(SAMPLE_SORT_MAX == 4 * SAMPLE_THREADS, "scans over the candidates: four per thread");
static_assert(SAMPLE_SPLITS % 2 == 0 && SAMPLE_SPLITS + 3 <= SAMPLE_WARPS / 2, "a select pass: counts in pairs, a warp per column");

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
 * id <= c.id. {0, SAMPLE_NO_ID} holds every token. */
struct rank_cut {
    uint32_t key;
    int id;
};

/* Order-preserving 32-bit key of a float (no NaN here: they became -inf); -0 and +0 share a key,
 * as they compare equal in sampler.c. Every token's key is >= rank_key(-inf) > 0. */
__device__ __forceinline__ uint32_t rank_key(float x) {
    uint32_t u = __float_as_uint(x);
    if (u == 0x80000000u) u = 0;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* The float whose rank_key is key. */
__device__ __forceinline__ float key_value(uint32_t key) {
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key);
}

__device__ __forceinline__ bool within(uint32_t key, int id, rank_cut c) { return key > c.key || (key == c.key && id <= c.id); }

/* (ka, ia) ranks strictly above (kb, ib). */
__device__ __forceinline__ bool ranks_above(uint32_t ka, int ia, uint32_t kb, int ib) {
    return ka > kb || (ka == kb && ia < ib);
}

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
        uint32_t key[SAMPLE_SORT_MAX]; /* candidates (key[j], id[j]), in rank or id order */
        double chunk[SAMPLE_THREADS];  /* a draw pass: the weight of each chunk of ids */
    };
    int id[SAMPLE_SORT_MAX];
    double dpart[SAMPLE_WARPS][SAMPLE_SPLITS + 2]; /* a select pass: per-warp sums, */
    int ipart[SAMPLE_WARPS][SAMPLE_SPLITS + 3];    /* counts and key range, */
    double dtotal[SAMPLE_SPLITS + 2];              /* and their block totals */
    int itotal[SAMPLE_SPLITS + 3];
    double dslot[SAMPLE_WARPS]; /* block reductions and scans */
    int islot[SAMPLE_WARPS];
    float fslot[SAMPLE_WARPS];
    int hist[256]; /* radix rounds over the threads' best */
    int count, pick, pick_last, rem;
    uint32_t prefix;
    double u, start;             /* the draw's uniform; the start of the chunk that holds r */
    unsigned long long rng_next; /* the generator's state after u */
};

/* One per block; the functions below are not inlined into each other, so they name it directly
 * (a pointer would lose that it lives in shared memory). */
static __shared__ sample_shared sample_sh;

/* Which tokens a pass takes: key in (lo, hi], within cut and, when min_p > 0, w >= min_p. */
struct token_filter {
    uint32_t lo, hi;
    rank_cut cut;
    float x_max;
    float min_log; /* x - x_max below it: w < min_p, no expf needed; -inf when min_p is off */
    float min_p;
    float x_floor; /* every token taken has x >= x_floor: a float test that skips most of them */
    bool all;      /* every key and id: no key test */
    bool unit;     /* weigh each token 1 (counting), not w */
};

__device__ __forceinline__ token_filter make_filter(uint32_t lo, uint32_t hi, rank_cut cut, float x_max, float min_p, bool unit) {
    token_filter f;
    f.lo = lo;
    f.hi = hi;
    f.cut = cut;
    f.x_max = x_max;
    f.min_p = min_p;
    f.min_log = min_p > 0.0f ? logf(min_p) - 1e-3f : -INFINITY; /* the margin covers expf's and logf's rounding */
    f.all = lo == 0 && hi == 0xFFFFFFFFu && cut.key == 0;
    f.unit = unit;
    const uint32_t least = max(lo + 1, cut.key); /* the lowest key taken */
    f.x_floor = least > rank_key(-INFINITY) ? key_value(least) : -INFINITY;
    if (min_p > 0.0f) f.x_floor = fmaxf(f.x_floor, x_max + f.min_log - (fabsf(x_max) + 1.0f) * 1e-6f);
    return f;
}

/* The weight of token (x, id) in a pass: w = exp(x - x_max), or 1 if unit, when f takes it; else -1. */
__device__ __forceinline__ float filter_weight(const token_filter &f, float x, int id) {
    if (!f.all) {
        const uint32_t key = rank_key(x);
        if (key <= f.lo || key > f.hi || !within(key, id, f.cut)) return -1.0f;
    }
    if (f.unit) return 1.0f;
    const float a = x - f.x_max;
    if (a < f.min_log) return -1.0f;
    const float w = expf(a);
    return w >= f.min_p ? w : -1.0f;
}

// ------------------------------------------------------------------------------------------------
// warp and block primitives; every order of additions is fixed

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o /= 2) v += __shfl_xor_sync(SAMPLE_ALL, v, o);
    return v;
}

template <typename T>
__device__ __forceinline__ T warp_max(T v) {
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o /= 2) v = max(v, __shfl_xor_sync(SAMPLE_ALL, v, o));
    return v;
}

template <typename T>
__device__ __forceinline__ T warp_min(T v) {
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o /= 2) v = min(v, __shfl_xor_sync(SAMPLE_ALL, v, o));
    return v;
}

template <typename T>
__device__ __forceinline__ T warp_inclusive_scan(T v) {
    const int lane = threadIdx.x % WARP_SIZE;
#pragma unroll
    for (int o = 1; o < WARP_SIZE; o *= 2) {
        T n = __shfl_up_sync(SAMPLE_ALL, v, o);
        if (lane >= o) v += n;
    }
    return v;
}

__device__ __forceinline__ int block_max(int v) {
    v = warp_max(v);
    if (threadIdx.x % WARP_SIZE == 0) sample_sh.islot[threadIdx.x / WARP_SIZE] = v;
    __syncthreads();
    v = warp_max(sample_sh.islot[threadIdx.x % WARP_SIZE]);
    __syncthreads();
    return v;
}

/* Exclusive prefix of v over the threads in order, and the total, in every thread. */
template <typename T>
__device__ __forceinline__ T block_exclusive_scan(T v, T *total, T *slots) {
    const int lane = threadIdx.x % WARP_SIZE, wid = threadIdx.x / WARP_SIZE;
    const T incl = warp_inclusive_scan(v);
    if (lane == WARP_SIZE - 1) slots[wid] = incl;
    __syncthreads();
    const T s = warp_inclusive_scan(slots[lane]);
    const T warps_before = __shfl_sync(SAMPLE_ALL, s, (wid + WARP_SIZE - 1) % WARP_SIZE);
    *total = __shfl_sync(SAMPLE_ALL, s, WARP_SIZE - 1);
    const T lanes_before = __shfl_up_sync(SAMPLE_ALL, incl, 1);
    __syncthreads();
    return (wid ? warps_before : T(0)) + (lane ? lanes_before : T(0));
}

/* Lowest id among the largest values, over the block: (value, id) in every thread. */
__device__ __forceinline__ void block_argmax(float *bv, int *bi) {
    const int lane = threadIdx.x % WARP_SIZE;
    float v = *bv;
    int i = *bi;
#pragma unroll 1
    for (int round = 0; round < 2; round++) {
#pragma unroll
        for (int o = WARP_SIZE / 2; o > 0; o /= 2) {
            float ov = __shfl_xor_sync(SAMPLE_ALL, v, o);
            int oi = __shfl_xor_sync(SAMPLE_ALL, i, o);
            if (ov > v || (ov == v && oi < i)) {
                v = ov;
                i = oi;
            }
        }
        if (round == 1) break;
        if (lane == 0) {
            sample_sh.fslot[threadIdx.x / WARP_SIZE] = v;
            sample_sh.islot[threadIdx.x / WARP_SIZE] = i;
        }
        __syncthreads();
        v = sample_sh.fslot[lane];
        i = sample_sh.islot[lane];
    }
    __syncthreads();
    *bv = v;
    *bi = i;
}

/* Adds (key, id) to the candidates where p holds, for the lanes of a warp at once; all lanes call. */
__device__ __forceinline__ void warp_append(bool p, uint32_t key, int id) {
    const int lane = threadIdx.x % WARP_SIZE;
    const unsigned ballot = __ballot_sync(SAMPLE_ALL, p);
    if (!ballot) return;
    int base = 0;
    if (lane == 0) base = atomicAdd(&sample_sh.count, __popc(ballot));
    base = __shfl_sync(SAMPLE_ALL, base, 0);
    const int slot = base + __popc(ballot & ((1u << lane) - 1u));
    if (p && slot < SAMPLE_SORT_MAX) {
        sample_sh.key[slot] = key;
        sample_sh.id[slot] = id;
    }
}

// ------------------------------------------------------------------------------------------------
// reading the vocabulary: float4 groups of ids [4g, 4g + 4)

__device__ __forceinline__ float4 load4(const float *x, int i, int vocab, bool vec) {
    if (vec && i + 4 <= vocab) return *reinterpret_cast<const float4 *>(x + i);
    float4 v;
    v.x = i < vocab ? x[i] : 0.0f;
    v.y = i + 1 < vocab ? x[i + 1] : 0.0f;
    v.z = i + 2 < vocab ? x[i + 2] : 0.0f;
    v.w = i + 3 < vocab ? x[i + 3] : 0.0f;
    return v;
}

__device__ __forceinline__ float lane4(float4 v, int e) { return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w; }

/* f(v, first id, ids in v) for each group, thread t taking groups t, t + SAMPLE_THREADS, ...
 * (coalesced), U groups in flight; then the ids past the last whole group (all of them when x is
 * not 16-byte aligned) one at a time. Every thread calls f equally often (0 ids where it has none),
 * so f may use warp collectives. */
template <int U, typename F>
__device__ __forceinline__ void for_each_group(const float *x, int vocab, F f) {
    const int full = (reinterpret_cast<uintptr_t>(x) & 15) == 0 ? vocab / 4 : 0;
    for (int g0 = 0; g0 < full; g0 += U * SAMPLE_THREADS) {
        float4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int g = g0 + u * SAMPLE_THREADS + (int)threadIdx.x;
            v[u] = g < full ? reinterpret_cast<const float4 *>(x)[g] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int g = g0 + u * SAMPLE_THREADS + (int)threadIdx.x;
            f(v[u], 4 * g, g < full ? 4 : 0);
        }
    }
    for (int i0 = 4 * full; i0 < vocab; i0 += SAMPLE_THREADS) {
        const int i = i0 + (int)threadIdx.x;
        f(make_float4(i < vocab ? x[i] : 0.0f, 0.0f, 0.0f, 0.0f), i, i < vocab ? 1 : 0);
    }
}

// ------------------------------------------------------------------------------------------------
// candidates in shared memory

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

// ------------------------------------------------------------------------------------------------
// passes over the whole vocabulary

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

#endif
