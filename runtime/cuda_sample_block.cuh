/* cuda_sample_block.cuh - what the GPU sampler (cuda_sampler.cuh) builds on: its settings on the
 * device, rank keys and cuts, the draw's generator, the block's shared state, the filter a pass over
 * the vocabulary applies, warp and block reductions and scans (every order of additions fixed),
 * and reading the vocabulary a float4 a lane. */
#ifndef INGOT_CUDA_SAMPLE_BLOCK_CUH
#define INGOT_CUDA_SAMPLE_BLOCK_CUH

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

#endif /* INGOT_CUDA_SAMPLE_BLOCK_CUH */
