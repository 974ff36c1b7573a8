/* cuda_kernels.cuh - the CUDA decode step's kernel bodies (the prompt's: cuda_prefill.cuh).
 *
 * Written against the MODEL_* constants of the generated model_config.h and included by the
 * generated forward_cuda.cu, which launches them with exact grids. Dimensions reach the device
 * functions as int parameters that are literals at every call, so after inlining every loop has a
 * constant trip count and the register arrays have constant indices; a generic build would pass
 * run-time values to the same code.
 *
 * The shape of every matvec: a warp per output row (a block of MODEL_MV_WARPS warps, rows striding over
 * the grid), 16-byte weight loads (8 bf16/fp16 values), all of a lane's loads for a row issued
 * before the first is used, fp32 accumulation, a warp shuffle reduction. Weights do not depend on
 * the previous kernel, so each warp loads its first row before waiting for the previous kernel to
 * finish (programmatic dependent launch, sm_90): the next kernel's weight stream overlaps the tail
 * of the current one. */
#ifndef INGOT_CUDA_KERNELS_CUH
#define INGOT_CUDA_KERNELS_CUH

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <type_traits>

#include "cuda_sync.cuh"

/* GPU_W_BF16: the weights on the device are bf16 (uploaded in their own dtype; converting bf16 to
 * fp16 on upload lost the 1B's decode 1.5% at depth 0, thirty-sixth session) */
#if defined(MODEL_WEIGHT_DTYPE_BF16)
#define GPU_W_BF16 1
#else
#define GPU_W_BF16 0
#endif

#define MV_THREADS (MODEL_MV_WARPS * WARP_SIZE)
/* The same in the paired norm'd kernels (QKV, gate/up: two rows a warp). The generated code sets it
 * from the plan (codegen/plan.py, _pair_unroll: 4 up to a hidden size of 2048, where fewer bytes in
 * flight when the previous kernel ends let its completion and this kernel's input through sooner). */
/* Of a paired kernel's first step, the chunks a lane loads before the wait; the rest go out after
 * the wait, behind the input's loads. The loads in flight when the previous kernel ends delay its
 * completion and the input's round trip (PERFORMANCE.md, fifteenth session). The generated code
 * sets it from the plan (codegen/plan.py, _pair_early: half on the 7B shapes). */
static_assert(MODEL_PAIR_EARLY >= 1 && MODEL_PAIR_EARLY <= MODEL_PAIR_UNROLL, "MODEL_PAIR_EARLY: 1 .. MODEL_PAIR_UNROLL");
/* The early loads before a kernel's programmatic-dependent-launch wait in lots, each issued once the
 * last is in (load_lots), as the joined grid's o_proj paces its own (MV_RES_PACE): chunks a lot in
 * QKV and gate/up (MODEL_PAIR_LOT, of their MODEL_PAIR_EARLY) and in o_proj and down launched on their
 * own (MODEL_RES_LOT, of MODEL_MV_UNROLL). Bytes in flight at a kernel boundary delay the previous kernel's
 * completion and this one's input behind them; lots keep memory busy without that queue. The
 * generated code sets them from the plan (codegen/plan.py, _pair_lot and _res_lot: two and four
 * lots where rows fill a step); one lot, the whole at once, otherwise. */
static_assert(MODEL_PAIR_LOT >= 1 && MODEL_PAIR_LOT <= MODEL_PAIR_EARLY, "MODEL_PAIR_LOT: 1 .. MODEL_PAIR_EARLY");
static_assert(MODEL_RES_LOT >= 1 && MODEL_RES_LOT <= MODEL_MV_UNROLL, "MODEL_RES_LOT: 1 .. MODEL_MV_UNROLL");
/* Of QKV's row steps after the first, how many go to shared memory on cp.async (0: none).
 * Registers hold one step of both rows, so a warp's pair is a chain of round trips, one a step; the
 * copies put the later steps in flight at once, issued when the input is staged, beside the first
 * step's loads. The generated code sets it from the plan (codegen/plan.py, _qkv_async: where QKV's
 * pairs are one round, as on the 1B; PERFORMANCE.md, seventeenth session). The same copies lost in
 * gate/up on both shapes measured (seventeenth), and in o_proj and down, all of the 7B's o_proj in
 * flight before attention ends, -0.4% / -0.7% at depths 0 / 4096, or issued once attention's values
 * were out, even (eighteenth): removed. */
static_assert(MODEL_QKV_ASYNC >= 0, "MODEL_QKV_ASYNC: 0 or more steps");
/* In the joined grid, o_proj's first step loaded before its wait MV_RES_PACE chunks a lane at a
 * time, each lot only once the last is in, until attention's outputs are counted (0: the whole step
 * at once). Bytes in flight at a boundary delay every L2 round trip behind them: with QKV's last
 * round split (QKV_SPLIT_LAST) the joined grid lands at QKV's end, and its 17 MB of o_proj loads
 * held the 7B's attention chain back ~2 µs a layer. In two lots of 4 chunks, 7B +0.7% / +0.5% /
 * +0.1% at depths 0 / 4096 / 16384; lots of 2 +0.5% / +0.2%, of 1 -0.3% / -0.5% (PERFORMANCE.md,
 * eighteenth session). */
#define MV_RES_PACE (MODEL_MV_UNROLL / 2)
static_assert(MV_RES_PACE >= 0 && MV_RES_PACE <= MODEL_MV_UNROLL && (MV_RES_PACE == 0 || MODEL_MV_UNROLL % (MV_RES_PACE ? MV_RES_PACE : 1) == 0),
              "MV_RES_PACE: 0, or a divisor of MODEL_MV_UNROLL");
/* QKV's last round of pairs split by K between the two warps of a warp pair (1) or not (0), where
 * its pairs take more than one round of the grid's warps and the last round's pairs are at most half
 * of them (the kernel checks, from its grid). On the 7B shapes 960 pairs are left for 2,112 warps
 * after a round; whole, they took two steps each on 960 warps of 82 SMs while the others idled.
 * Split, each of 1,920 warps on every SM takes one step, the halves meeting in shared memory: +0.4%
 * at depths 0 and 4096 (PERFORMANCE.md, eighteenth session). */
#define QKV_SPLIT_LAST 1
#define ATT_TILE 1024                   /* most positions one attention block scores at once */
#ifndef ATT_MIN_CHUNK
/* Fewest positions an attention block takes (a test builds 5: many splits, odd bounds). 256 against
 * 32: up to depth 8448 (33 splits of 256 on the 1B and 7B shapes) fewer, longer splits and a shorter
 * combine: decode 1B +2.8% at depth 1024 and +0.7% at 4096, 7B +0.6% at 4096; the 128-token prompt
 * +16-18% (1B) and +7-12% (7B) at 1024 and 4096; even at 0 and 16384 (PERFORMANCE.md, thirteenth
 * session) */
#define ATT_MIN_CHUNK 256
#endif
/* The same for the prompt's attention (the flash kernels, attention_body with TOKENS > 1): 512
 * measured +8-9% at depth 8192 where the decode lost, at 1024-4096 it lost 12-20% (PERFORMANCE.md,
 * thirteenth session) */
#define PREFILL_MIN_CHUNK ATT_MIN_CHUNK
/* A prompt's split grows with the context n: n / PREFILL_CHUNK_SPLITS positions rounded down to a
 * power of two, between PREFILL_MIN_CHUNK and twice it. 512 measured +8-9% for
 * the prompt at depth 8192, 256 better at 1024-4096 (by 12-20%), and n / 16 as such (264 at 4096)
 * -4% there; this rule: prompt +9.1% / +7.8% (1B) and +7.8% / +3.0% (7B) at 8192 / 16384, even
 * below (PERFORMANCE.md, fourteenth session). */
#define PREFILL_CHUNK_SPLITS 16
__device__ __forceinline__ int prefill_min_chunk(int n) {
    const int want = n / PREFILL_CHUNK_SPLITS, pow2 = want > 0 ? 1 << (31 - __clz(want)) : 1;
    return min(max(pow2, PREFILL_MIN_CHUNK), min(2 * PREFILL_MIN_CHUNK, ATT_TILE));
}
/* A decode split's positions rounded up to a multiple of ATT_CHUNK_ALIGN: 64 where the smallest
 * split is a multiple of it (so only deep contexts change: 497 positions a split at depth 16384
 * become 512), +0.4% on the 1B and 7B shapes at 16384; a test's 5-position splits stay as they are. */
#define ATT_CHUNK_ALIGN (ATT_MIN_CHUNK % 64 == 0 ? 64 : 1)
#define ATT_CHUNK_STEP (ATT_CHUNK_ALIGN > 0 ? ATT_CHUNK_ALIGN : 1)
static_assert(ATT_TILE % ATT_CHUNK_STEP == 0, "ATT_CHUNK_ALIGN: a divisor of ATT_TILE");
/* Positions a split of attention takes when the context is n: min_splits blocks per KV head (a wave
 * of the GPU), more only when a split would pass a tile (splits sized by the context allocated left
 * short contexts many tiny blocks in several waves: 1B shape, 131072 allocated, depth 4096: 1000
 * blocks of 33 positions; PERFORMANCE.md). A prompt's splits take at least prefill_min_chunk(n)
 * positions and are not aligned. The splits with positions: (n + chunk - 1) / chunk. */
__device__ __forceinline__ int att_split_len(int n, int n_splits, int min_splits, bool prompt) {
    const int splits = min(n_splits, max(min_splits, (n + ATT_TILE - 1) / ATT_TILE));
    const int chunk = max((n + splits - 1) / splits, prompt ? prefill_min_chunk(n) : ATT_MIN_CHUNK);
    return prompt ? chunk : (chunk + ATT_CHUNK_STEP - 1) / ATT_CHUNK_STEP * ATT_CHUNK_STEP;
}
static_assert(ATT_MIN_CHUNK >= 1 && ATT_MIN_CHUNK <= ATT_TILE && PREFILL_MIN_CHUNK >= 1 && PREFILL_MIN_CHUNK <= ATT_TILE,
              "ATT_MIN_CHUNK, PREFILL_MIN_CHUNK: 1 to ATT_TILE positions (a block scores at most a tile)");
#define ATT_COMBINE_VEC 16              /* splits' partial sums the combining block loads at once */
/* The combine's float4 form (below, in attention_body), ATT_COMBINE_LOADS loads a thread at once:
 * -1 where the plain form would give a thread more than one output (a KV group's heads times the
 * head width past MODEL_ATT_THREADS: the 7B shape, +1.2% at depths 4096 and 16384; on the 1B shape, one
 * output a thread, it measured even), 1 everywhere, 0 nowhere (PERFORMANCE.md, thirteenth session) */
#define ATT_COMBINE_WIDE -1
#define ATT_COMBINE_LOADS 9 /* 33 splits (two waves of blocks over 8 KV heads) in two rounds on the 7B shape */
/* MODEL_ATT_COMBINE_EARLY=N (the generated code's plan sets it; 0, off): where the combine's plain form
 * gives a thread one output, it loads that output's first N splits' partial sums before the splits'
 * (max, sum), so both are in flight at once: one L2 round trip fewer on the combine's chain */
#define ATT_UNROLL 4                    /* key or value rows an attention thread holds in flight (8: even) */

// ---------------------------------------------------------------------------------------------
// Tracing, only in a build with EXTRA_NVCCFLAGS=-DINGOT_TRACE (tests/bench/gpu.sh trace): each block
// of a stage kernel stamps the global timer when it starts, when its wait returns, when its input
// is staged and when its last warp is done, into trace_buf[stage][n-th block of that stage to
// start]. A stage's kernels run one after another, so the n-th block belongs to layer n / (blocks
// a layer). The host resets the counts before each step and writes the last step's records out
// (tests/bench/step_trace.py reads them).

/* The step's stages, in launch order; ST_MLP, the fused MLP (MODEL_MLP_FUSED), takes gate/up's and down's
 * place in a layer. */
enum { ST_EMBED, ST_QKV, ST_ATT, ST_O, ST_GATE_UP, ST_DOWN, ST_LM_HEAD, ST_MLP, ST_COUNT };

#define TRACE_STAGES ST_COUNT
#define TRACE_BLOCKS 65536 /* records kept per stage and step */
/* READY: the block's work before its wait is done (first loads issued, norm weights staged) */
enum { TRACE_ENTERED, TRACE_WAITED, TRACE_STAGED, TRACE_DONE, TRACE_READY, TRACE_STAMPS };
struct trace_block {
    unsigned long long t[TRACE_STAMPS];
};
#if defined(INGOT_TRACE)
static __device__ unsigned trace_count[TRACE_STAGES];
static __device__ trace_block trace_buf[TRACE_STAGES][TRACE_BLOCKS];

__device__ __forceinline__ unsigned long long global_ns(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* The block's record, in shared memory */
__device__ __forceinline__ trace_block **trace_slot(void) {
    __shared__ trace_block *rec;
    return &rec;
}
/* Thread 0 takes the block's record and stamps its start; every thread gets the record through
 * shared memory after the body's first barrier. */
__device__ __forceinline__ trace_block **trace_begin(int stage) {
    trace_block **rec = trace_slot();
    if (threadIdx.x == 0) {
        const unsigned n = atomicAdd(&trace_count[stage], 1u);
        *rec = n < TRACE_BLOCKS ? &trace_buf[stage][n] : NULL;
        if (*rec) (*rec)->t[TRACE_ENTERED] = (*rec)->t[TRACE_READY] = global_ns(), (*rec)->t[TRACE_DONE] = 0;
    }
    return rec;
}
#define TRACE_BEGIN(stage) trace_block **trace_rec_ = trace_begin(stage)
/* The record TRACE_BEGIN took, in a function that the body calls after it */
#define TRACE_RESUME() [[maybe_unused]] trace_block **trace_rec_ = trace_slot()
#define TRACE_AT(i) \
    do { if (threadIdx.x == 0 && *trace_rec_) (*trace_rec_)->t[i] = global_ns(); } while (0)
#define TRACE_END() \
    do { if (threadIdx.x % WARP_SIZE == 0 && *trace_rec_) atomicMax(&(*trace_rec_)->t[TRACE_DONE], global_ns()); } while (0)
#else
#define TRACE_BEGIN(stage) do { } while (0)
#define TRACE_RESUME() do { } while (0)
#define TRACE_AT(i) do { } while (0)
#define TRACE_END() do { } while (0)
#endif

// ---------------------------------------------------------------------------------------------
// The KV cache of a layer: (kv head, position, head_dim), so that an attention block's keys and
// values are one contiguous run (position-major put a head's 128 or 256 bytes of each position
// kv_dim * 2 bytes apart; head-major measured +1.5% on the 1B shape at every depth, +0.5% on 7B).
// The element where position pos of KV head kvh starts:

__host__ __device__ __forceinline__ size_t kv_at(int pos, int kvh, int ctx, int head_dim) {
    return ((size_t)kvh * ctx + pos) * head_dim;
}

// ---------------------------------------------------------------------------------------------
// Weights: 8 values of the storage dtype in a uint4, to fp32

/* 8 fp16 values (the KV cache) in a uint4, to fp32 */
__device__ __forceinline__ void h8_to_f32(uint4 u, float f[8]) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 v = __half22float2(*reinterpret_cast<const __half2 *>(&w[i]));
        f[2 * i] = v.x;
        f[2 * i + 1] = v.y;
    }
}

__device__ __forceinline__ void w8_to_f32(uint4 u, float f[8]) {
#if !GPU_W_BF16
    h8_to_f32(u, f);
#else
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
    }
#endif
}

__device__ __forceinline__ float w_to_f32(uint16_t u) {
#if GPU_W_BF16
    return __uint_as_float((uint32_t)u << 16);
#else
    return __half2float(__ushort_as_half(u));
#endif
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    return v;
}

/* Streaming loads: each weight is read once per step, keep it out of L1. */
__device__ __forceinline__ uint4 ld_stream(const uint4 *p) { return __ldcs(p); }

/* 16 bytes from global to shared memory, asynchronously and past L1; 16 zeros where !valid */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all(void) { asm volatile("cp.async.wait_all;" ::: "memory"); }

// ---------------------------------------------------------------------------------------------
// The matvec core. A block first stages its input vector in shared memory (for the norm'd inputs
// as x * norm_w / rms(x): every block computes the same sum of squares, from L2), then each warp
// takes one weight row at a time: lane l reads 16-byte chunks l, l + 32, ... (8 weights each),
// MODEL_MV_UNROLL chunks in flight per step, and the warp's partial sums meet in a shuffle reduction.

/* A lane's U chunks of one step of a row: U = MODEL_MV_UNROLL, or MODEL_PAIR_UNROLL in the paired norm'd
 * kernels (QKV, gate/up), whose warps hold two rows. */
template <int U = MODEL_MV_UNROLL>
struct row_chunks {
    uint4 v[U];
};

/* Steps of U chunks per lane that a row of K needs. */
template <int U>
__host__ __device__ constexpr int mv_steps(int K) { return (K / 8 + U * WARP_SIZE - 1) / (U * WARP_SIZE); }

/* Chunks u0 .. u1 - 1 of a step (load_step: all U). */
template <int U>
__device__ __forceinline__ void load_chunks(row_chunks<U> *r, const uint4 *row, int K, int step, int lane, int u0, int u1) {
#pragma unroll
    for (int u = u0; u < u1; u++) {
        int c = (step * U + u) * WARP_SIZE + lane;
        if (c < K / 8) r->v[u] = ld_stream(row + c);
    }
}

/* Chunks from .. U - 1 of a step, from known only at run time (static register indices). */
template <int U>
__device__ __forceinline__ void load_chunks_from(row_chunks<U> *r, const uint4 *row, int K, int step, int lane, int from) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        int c = (step * U + u) * WARP_SIZE + lane;
        if (u >= from && c < K / 8) r->v[u] = ld_stream(row + c);
    }
}

/* load_lots' stop conditions: none (a kernel whose wait is griddepcontrol.wait), or a count in
 * global memory reaching a target (the joined grid's count of attention's outputs), read by lane 0
 * with each lot's loads and told to the warp once the lot is in. */
struct never_stop {
    static constexpr bool waits_last = false; /* the last lot goes on without waiting */
    __device__ __forceinline__ unsigned issue() const { return 0; }
    __device__ __forceinline__ bool done(unsigned) const { return false; }
};
struct stop_at_count {
    static constexpr bool waits_last = true; /* the last lot in, and the count read, before going on */
    const unsigned *count;
    unsigned target;
    __device__ __forceinline__ unsigned issue() const {
        unsigned v = 0;
        if (threadIdx.x % WARP_SIZE == 0) asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(count) : "memory");
        return v;
    }
    __device__ __forceinline__ bool done(unsigned v) const { return __shfl_sync(0xFFFFFFFFu, v, 0) >= target; }
};

/* Chunks 0 .. u_end - 1 of step 0 of row ra (and rb, given b) in lots of LOT chunks, each lot issued
 * once the last is in (the loop's exit reads the lot's data: an impossible bf16 pair only ends it
 * sooner), until stop says so; returns the chunks loaded. One lot (LOT >= u_end): all at once. */
template <int LOT, int U, typename Stop>
__device__ __forceinline__ int load_lots(row_chunks<U> *a, row_chunks<U> *b, const uint4 *ra, const uint4 *rb, int K, int lane,
                                         int u_end, Stop stop) {
    int loaded = 0;
#pragma unroll
    for (int u = 0; u < U; u += LOT) {
        if (u >= u_end) break;
        const unsigned seen = stop.issue();
        load_chunks(a, ra, K, 0, lane, u, min(u + LOT, u_end));
        if (b) load_chunks(b, rb, K, 0, lane, u, min(u + LOT, u_end));
        loaded = min(u + LOT, u_end);
        if (loaded >= u_end && !Stop::waits_last) break;
        const bool odd = (b ? b->v[u].x : a->v[u].x) == 0x7FC00001u;
        if (stop.done(seen) || __any_sync(0xFFFFFFFFu, odd)) break;
    }
    return loaded;
}

/* A paired kernel's early loads, before its wait: the first MODEL_PAIR_EARLY chunks of rows ra and rb's
 * first step, in lots of MODEL_PAIR_LOT where the plan takes them, else at once. */
template <int U>
__device__ __forceinline__ void pair_early_loads(row_chunks<U> *a, row_chunks<U> *b, const uint4 *ra, const uint4 *rb, int K, int lane) {
    if (MODEL_PAIR_LOT < MODEL_PAIR_EARLY) {
        load_lots<MODEL_PAIR_LOT>(a, b, ra, rb, K, lane, MODEL_PAIR_EARLY, never_stop{});
    } else {
        load_chunks(a, ra, K, 0, lane, 0, MODEL_PAIR_EARLY);
        load_chunks(b, rb, K, 0, lane, 0, MODEL_PAIR_EARLY);
    }
}

template <int U>
__device__ __forceinline__ void load_step(row_chunks<U> *r, const uint4 *row, int K, int step, int lane) {
    load_chunks(r, row, K, step, lane, 0, U);
}

template <int U>
__device__ __forceinline__ float dot_step(const row_chunks<U> *r, const float *sx, int K, int step, int lane) {
    float acc = 0.0f;
#pragma unroll
    for (int u = 0; u < U; u++) {
        int c = (step * U + u) * WARP_SIZE + lane;
        if (c < K / 8) {
            float w[8];
            w8_to_f32(r->v[u], w);
            float4 a = reinterpret_cast<const float4 *>(sx)[c];
            float4 b = reinterpret_cast<const float4 *>(sx)[K / 8 + c];
            acc += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
        }
    }
    return acc;
}

/* row (K) . sx (K, shared memory), the first step already in *first; the warp's sum in every lane.
 * Later steps load and then multiply: other warps on the SM keep memory busy meanwhile (double
 * buffering the steps doubled the registers and halved the resident warps). */
template <int U>
__device__ __forceinline__ float row_dot(row_chunks<U> *first, const uint4 *row, const float *sx, int K, int lane) {
    float acc = dot_step(first, sx, K, 0, lane);
#pragma unroll 1
    for (int step = 1; step < mv_steps<U>(K); step++) {
        load_step(first, row, K, step, lane);
        acc += dot_step(first, sx, K, step, lane);
    }
    return warp_sum(acc);
}

/* QKV's steps of a row past the first that go through shared memory: at most MODEL_QKV_ASYNC. */
template <int U>
__host__ __device__ constexpr int pair_async_steps(int K) {
    return MODEL_QKV_ASYNC < mv_steps<U>(K) - 1 ? MODEL_QKV_ASYNC : mv_steps<U>(K) - 1;
}

/* Shared memory QKV's block needs for them, past its staged input: each warp's steps
 * 1 .. pair_async_steps of both rows, a lane's chunks where it alone reads them. */
template <int U>
__host__ __device__ constexpr size_t pair_async_bytes(int K) {
    return (size_t)pair_async_steps<U>(K) * 2 * U * WARP_SIZE * MODEL_MV_WARPS * sizeof(uint4);
}

/* Dynamic shared memory of QKV's block, whose input has K values. */
#define QKV_SMEM_BYTES(K) (MV_SMEM_BYTES(K) + pair_async_bytes<MODEL_PAIR_UNROLL>(K))

/* This warp's slots for the async steps: after the block's staged input of K floats (K % 8 == 0, so
 * 16-byte aligned). Slot (s, row, u) holds lane l's chunk at [((s * 2 + row) * U + u) * WARP_SIZE + l]. */
template <int U>
__device__ __forceinline__ uint4 *pair_async_slots(float *sx, int K) {
    return reinterpret_cast<uint4 *>(sx + K) + (size_t)(threadIdx.x / WARP_SIZE) * pair_async_steps<U>(K) * 2 * U * WARP_SIZE;
}

/* Steps 1 .. steps of rows ra and rb into this warp's slots on cp.async: each lane copies only the
 * chunks it will read, so cp.async.wait_all in the same lane is all the reading needs. */
template <int U>
__device__ __forceinline__ void pair_async_issue(uint4 *slots, const uint4 *ra, const uint4 *rb, int K, int lane, int steps) {
#pragma unroll
    for (int s = 1; s <= steps; s++) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = (s * U + u) * WARP_SIZE + lane;
            if (c < K / 8) {
                cp_async16(slots + (((s - 1) * 2 + 0) * U + u) * WARP_SIZE + lane, ra + c, true);
                cp_async16(slots + (((s - 1) * 2 + 1) * U + u) * WARP_SIZE + lane, rb + c, true);
            }
        }
    }
}

/* Step s of row `row` (0 or 1) from the slots into *r. The slot is free for the next pair's copy once
 * the dot product that uses *r has run: later instructions issue in order behind it. */
template <int U>
__device__ __forceinline__ void pair_async_read(row_chunks<U> *r, const uint4 *slots, int K, int s, int row, int lane) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int c = (s * U + u) * WARP_SIZE + lane;
        if (c < K / 8) r->v[u] = slots[(((s - 1) * 2 + row) * U + u) * WARP_SIZE + lane];
    }
}

/* Steps s0 .. s1 - 1 of rows ra and rb, loaded one step at a time into *fa and *fb, dotted with sx
 * and added to this lane's *acc_a and *acc_b. */
template <int U>
__device__ __forceinline__ void pair_steps_add(row_chunks<U> *fa, row_chunks<U> *fb, const uint4 *ra, const uint4 *rb, const float *sx,
                                               int K, int lane, int s0, int s1, float *acc_a, float *acc_b) {
#pragma unroll 1
    for (int step = s0; step < s1; step++) {
        load_step(fa, ra, K, step, lane);
        load_step(fb, rb, K, step, lane);
        *acc_a += dot_step(fa, sx, K, step, lane);
        *acc_b += dot_step(fb, sx, K, step, lane);
    }
}

/* Two rows (a, b) of K dotted with sx at once, both rows' loads in flight together, the first
 * steps already in *fa and *fb and the next `async` steps on their way into slots (pair_async_issue):
 * the paired kernels' core (a pair on one warp needs no barrier to meet its other half). */
template <int U>
__device__ __forceinline__ float2 row_dot2(row_chunks<U> *fa, row_chunks<U> *fb, const uint4 *ra, const uint4 *rb, const float *sx,
                                           int K, int lane, const uint4 *slots = nullptr, int async = 0) {
    float acc_a = dot_step(fa, sx, K, 0, lane), acc_b = dot_step(fb, sx, K, 0, lane);
    if (async > 0) cp_async_wait_all();
#pragma unroll
    for (int step = 1; step <= async; step++) {
        pair_async_read(fa, slots, K, step, 0, lane);
        pair_async_read(fb, slots, K, step, 1, lane);
        acc_a += dot_step(fa, sx, K, step, lane);
        acc_b += dot_step(fb, sx, K, step, lane);
    }
    pair_steps_add(fa, fb, ra, rb, sx, K, lane, 1 + async, mv_steps<U>(K), &acc_a, &acc_b);
    return make_float2(warp_sum(acc_a), warp_sum(acc_b));
}

/* Steps s0 .. s1 - 1 of rows ra and rb dotted with sx, loaded here one step at a time: a split
 * pair's half (QKV_SPLIT_LAST); the warp's two sums in every lane. */
template <int U>
__device__ __forceinline__ float2 pair_steps(row_chunks<U> *fa, row_chunks<U> *fb, const uint4 *ra, const uint4 *rb, const float *sx,
                                             int K, int lane, int s0, int s1) {
    float acc_a = 0.0f, acc_b = 0.0f;
    pair_steps_add(fa, fb, ra, rb, sx, K, lane, s0, s1, &acc_a, &acc_b);
    return make_float2(warp_sum(acc_a), warp_sum(acc_b));
}

/* A paired kernel's round: rows ra and rb dotted with sx, their first steps loaded here (and the
 * async steps issued) unless this is the warp's first round (loaded around the wait, the copies
 * issued once the input is staged). */
template <int U>
__device__ __forceinline__ float2 pair_round(bool first, row_chunks<U> *fa, row_chunks<U> *fb, const uint4 *ra, const uint4 *rb,
                                             const float *sx, int K, int lane, uint4 *slots = nullptr, int async = 0) {
    if (!first) {
        load_step(fa, ra, K, 0, lane);
        load_step(fb, rb, K, 0, lane);
        pair_async_issue<U>(slots, ra, rb, K, lane, async);
    }
    return row_dot2(fa, fb, ra, rb, sx, K, lane, slots, async);
}

/* row . sx as row_dot, with the next step's loads in flight while this one multiplies (double
 * buffering): for the single-row kernels (o_proj, down), whose registers allow it. */
template <int U>
__device__ __forceinline__ float row_dot_buffered(const row_chunks<U> *first, const uint4 *row, const float *x, int K, int lane) {
    float acc;
    if (mv_steps<U>(K) == 1) {
        acc = dot_step(first, x, K, 0, lane);
    } else {
        acc = 0.0f;
        row_chunks<U> cur = *first;
#pragma unroll 1
        for (int step = 0; step < mv_steps<U>(K); step++) {
            row_chunks<U> nxt;
            if (step + 1 < mv_steps<U>(K)) load_step(&nxt, row, K, step + 1, lane);
            acc += dot_step(&cur, x, K, step, lane);
            cur = nxt;
        }
    }
    return warp_sum(acc);
}

// ---------------------------------------------------------------------------------------------
// Staging the input vector in shared memory. Each of the block's MV_THREADS threads owns the
// float4 groups g = tid, tid + MV_THREADS, ... and touches only those until the final barrier.
// The loads come STAGE_VEC groups at a time, all in flight together: the step's weight traffic
// queues ahead of them, so a loop of one load per round trip cost ~5 us per kernel on the 7B shape
// (PERFORMANCE.md).
//
// The staged vector is split in halves: chunk c's inputs x[8c..8c+3] are float4 c, x[8c+4..8c+7]
// float4 K/8 + c. A warp's lanes, reading chunks c..c+31, then read consecutive float4s: no two
// lanes of a quarter-warp in one bank (the plain layout put lanes 32 bytes apart, two wavefronts
// per read).

/* The float4 of the split layout that holds x's float4 group g (x[4g..4g+3]). */
__device__ __forceinline__ int sx_group(int g, int K) { return (g % 2) * (K / 8) + g / 2; }

#define STAGE_VEC 4 /* float4 groups a thread loads at once (8: -1% on the 7B shape) */
#define STAGE_ROUNDS(K) (((K) / 4 + STAGE_VEC * MV_THREADS - 1) / (STAGE_VEC * MV_THREADS))

/* A hook that does nothing (for_each_group's and stage_input's default). */
struct no_hook {
    __device__ __forceinline__ void operator()() const {}
};

/* f(g, src[g]) for each of this thread's float4 groups g of a K-vector, STAGE_VEC loads in flight
 * at a time. issued() runs once, after the first round's loads are issued: stage_input's callers
 * queue weight loads behind the input's there. */
template <typename T, typename F, typename H = no_hook>
__device__ __forceinline__ void for_each_group(const T *src, int K, F f, H issued = H{}) {
#pragma unroll 1
    for (int round = 0; round < STAGE_ROUNDS(K); round++) {
        T v[STAGE_VEC];
#pragma unroll
        for (int j = 0; j < STAGE_VEC; j++) {
            int g = (round * STAGE_VEC + j) * MV_THREADS + threadIdx.x;
            if (g < K / 4) v[j] = src[g];
        }
        if (round == 0) issued();
#pragma unroll
        for (int j = 0; j < STAGE_VEC; j++) {
            int g = (round * STAGE_VEC + j) * MV_THREADS + threadIdx.x;
            if (g < K / 4) f(g, v[j]);
        }
    }
}

/* sx (K, shared) = norm_w as fp32: before the wait, since norm weights do not depend on the previous
 * kernel; stage_input multiplies the input into it. */
__device__ __forceinline__ void stage_norm(float *sx, const uint16_t *norm_w, int K) {
    float4 *s4 = reinterpret_cast<float4 *>(sx);
    for_each_group(reinterpret_cast<const uint2 *>(norm_w), K, [&](int g, uint2 w) {
        s4[sx_group(g, K)] = make_float4(w_to_f32(w.x & 0xFFFF), w_to_f32(w.x >> 16), w_to_f32(w.y & 0xFFFF), w_to_f32(w.y >> 16));
    });
}

/* f(g, x4[g]) for each of this thread's float4 groups g of a K-vector whose words read ATT_POLL_WORD
 * until written (MODEL_ATT_O_POLL, MODEL_DOWN_POLL), as each is written: POLL_VEC loads in flight
 * at once, the float4s still unwritten polled again together, 32 ns apart, until every word is (a
 * late input costs one round trip after its last write lands, not one a float4). At most
 * POLL_MAX_FLOATS values (a bit a float4 of the thread's; the model's init checks). issued() as
 * for_each_group's. */
#ifndef POLL_VEC
#define POLL_VEC 8 /* a test builds 2: rounds of them */
#endif
#define POLL_MAX_FLOATS (64 * 4 * MV_THREADS)
template <typename F, typename H>
__device__ __forceinline__ void poll_each_group(const float4 *x4, int K, F f, H issued) {
    const int n4 = K / 4, rounds = (n4 + POLL_VEC * MV_THREADS - 1) / (POLL_VEC * MV_THREADS);
    unsigned long long pending = 0, t0 = 0; /* bit round * POLL_VEC + j: that float4 unwritten */
    for (bool first = true; first || pending; first = false) {
        if (!first) {
            unsigned long long t;
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
            if (t0 == 0) t0 = t;
            if (t - t0 > WAIT_COUNT_LIMIT_NS) {
                printf("ingot: a block waited %llu ns for a polled input (poll_each_group): stopping\n", t - t0);
                __trap();
            }
            __nanosleep(32);
        }
#pragma unroll 1
        for (int round = 0; round < rounds; round++) {
            float4 v[POLL_VEC];
#pragma unroll
            for (int j = 0; j < POLL_VEC; j++) {
                const int g = (round * POLL_VEC + j) * MV_THREADS + (int)threadIdx.x;
                if (g < n4 && (first || (pending >> (round * POLL_VEC + j) & 1))) v[j] = ld_poll(x4 + g);
            }
            if (first && round == 0) issued();
#pragma unroll
            for (int j = 0; j < POLL_VEC; j++) {
                const int g = (round * POLL_VEC + j) * MV_THREADS + (int)threadIdx.x;
                const unsigned long long bit = 1ull << (round * POLL_VEC + j);
                if (g >= n4 || !(first || (pending & bit))) continue;
                if (unwritten(v[j])) {
                    pending |= bit;
                } else {
                    f(g, v[j]);
                    pending &= ~bit;
                }
            }
        }
    }
}

/* sx (K, shared) = x, or x * norm when stage_norm staged the norm weights there in the same threads;
 * returns RMSNorm's scale 1 / sqrt(mean(x^2) + eps) (1 without a norm), which the caller applies to
 * each dot product: HF's (x * scale) * norm up to rounding, with one barrier and one pass (the sum
 * of squares meets at the barrier staging needs anyway). Called by the whole block after its wait.
 * POLLED: x's words read ATT_POLL_WORD until written (poll_each_group). */
template <bool POLLED = false, typename H = no_hook>
__device__ __forceinline__ float stage_input(float *sx, const float *x, bool norm, int K, float eps, H issued = H{}) {
    __shared__ float partial[MODEL_MV_WARPS];
    float4 *s4 = reinterpret_cast<float4 *>(sx);
    float ss = 0.0f;
    auto stage = [&](int g, float4 v) {
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        if (norm) {
            const float4 n = s4[sx_group(g, K)];
            v = make_float4(v.x * n.x, v.y * n.y, v.z * n.z, v.w * n.w);
        }
        s4[sx_group(g, K)] = v;
    };
    if constexpr (POLLED)
        poll_each_group(reinterpret_cast<const float4 *>(x), K, stage, issued);
    else
        for_each_group(reinterpret_cast<const float4 *>(x), K, stage, issued);
    if (norm) {
        ss = warp_sum(ss);
        if (threadIdx.x % WARP_SIZE == 0) partial[threadIdx.x / WARP_SIZE] = ss;
    }
    __syncthreads();
    if (!norm) return 1.0f;
    ss = 0.0f;
#pragma unroll
    for (int w = 0; w < MODEL_MV_WARPS; w++) ss += partial[w];
    return rsqrtf(ss / (float)K + eps);
}

/* Dynamic shared memory of a matvec kernel whose input has K values. */
#define MV_SMEM_BYTES(K) ((size_t)(K) * sizeof(float))

__device__ __forceinline__ float silu(float x) { return x / (1.0f + __expf(-x)); }

/* This warp's index in the grid and the number of warps in it. */
__device__ __forceinline__ int grid_warp(void) { return (int)(blockIdx.x * (blockDim.x / WARP_SIZE) + threadIdx.x / WARP_SIZE); }
__device__ __forceinline__ int grid_warps(void) { return (int)(gridDim.x * (blockDim.x / WARP_SIZE)); }

// ---------------------------------------------------------------------------------------------
// Stage bodies. The generated forward_cuda.cu wraps each in a __global__ kernel that passes the
// model's constants. io: {position, chosen token, batch} in device memory: the position of the
// step's token, which the host sets when it feeds tokens and each step's end advances; the token
// the argmax or the sampler chose; and how many of a prefill batch's tokens (16 or 8) are the
// prompt's (the host sets it before each batch). history holds the token at each position: the
// host uploads fed tokens there, and each step's end writes its choice after its own position, so
// a step needs nothing from the host to run on the previous step's choice.


/* x (dim) = embed[history[pos]] */
template <typename Wait>
__device__ __forceinline__ void embed_body(const uint16_t *embed, const int *io, float *x, const int *history, int dim, Wait wait) {
    wait();
    const uint16_t *row = embed + (size_t)history[io[IO_POS]] * dim;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < dim; i += gridDim.x * blockDim.x) x[i] = w_to_f32(row[i]);
}

/* The step's end, after every stage that reads the position: with emit, the chosen token into the
 * host's chosen[pos] (mapped host memory) and into history[pos + 1], the next step's input; then
 * the position advanced. A step queued after this one runs on the choice without the host. */
template <typename Wait>
__device__ __forceinline__ void step_end_body(int *io, int *history, int *chosen, int ctx, int emit, Wait wait) {
    wait();
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        const int pos = io[IO_POS];
        if (emit) {
            const int next = io[IO_NEXT];
            chosen[pos] = next;
            if (pos + 1 < ctx) history[pos + 1] = next;
        }
        io[IO_POS] = pos + 1;
    }
}

/* The paired kernels (q/k/v with RoPE, gate/up with SiLU) put both rows of a pair on one warp,
 * their loads in flight together: 4.5% faster end to end than a pair on two warps meeting at a
 * block barrier every round (PERFORMANCE.md). */

/* The rows of q/k/v pair p: (i, i + head_dim/2) of one Q or K head, rotated together, or V rows
 * (2i, 2i + 1); kind 0 Q, 1 K, 2 V. */
__device__ __forceinline__ void qkv_pair(int p, int q_pairs, int k_pairs, int head_dim, int *row_a, int *row_b, int *kind) {
    const int half = head_dim / 2;
    *kind = p < q_pairs ? 0 : p < q_pairs + k_pairs ? 1 : 2;
    if (*kind == 2) {
        *row_a = 2 * (p - q_pairs - k_pairs);
        *row_b = *row_a + 1;
    } else {
        p -= *kind ? q_pairs : 0;
        *row_a = (p / half) * head_dim + p % half;
        *row_b = *row_a + half;
    }
}

/* input_layernorm + q/k/v projections (+ bias) + RoPE + KV-cache store, a pair per warp. */
template <typename Wait>
__device__ __forceinline__ void rmsnorm_qkv_rope_body(const uint16_t *norm_w, const uint16_t *wq, const uint16_t *wk,
                                                      const uint16_t *wv, const uint16_t *bq, const uint16_t *bk,
                                                      const uint16_t *bv, const float *x, float *q, uint16_t *kc,
                                                      uint16_t *vc, const int *io, const float *inv_freq, int dim,
                                                      int q_dim, int kv_dim, int head_dim, int ctx, float eps, Wait wait) {
    extern __shared__ float sx[];
    const int q_pairs = q_dim / 2, k_pairs = kv_dim / 2, pairs = q_pairs + k_pairs + kv_dim / 2;
    const int lane = threadIdx.x % WARP_SIZE;
    int p = grid_warp(), ra = 0, rb = 0, kind = 0;
    TRACE_BEGIN(ST_QKV);
    row_chunks<MODEL_PAIR_UNROLL> a, b;
    if (p < pairs) {
        qkv_pair(p, q_pairs, k_pairs, head_dim, &ra, &rb, &kind);
        const uint16_t *wm = kind == 0 ? wq : kind == 1 ? wk : wv;
        pair_early_loads(&a, &b, reinterpret_cast<const uint4 *>(wm + (size_t)ra * dim),
                         reinterpret_cast<const uint4 *>(wm + (size_t)rb * dim), dim, lane);
    }
    stage_norm(sx, norm_w, dim);
    TRACE_AT(TRACE_READY);
    wait();
    TRACE_AT(TRACE_WAITED);
    /* the async steps, where this build has them (MODEL_QKV_ASYNC): issued once the input is staged (in
     * stage_input's hook, right behind the input's loads: 7B -1.1%, 1B 0.3 points less gain) */
    const int async = pair_async_steps<MODEL_PAIR_UNROLL>(dim);
    uint4 *slots = pair_async_slots<MODEL_PAIR_UNROLL>(sx, dim);
    const float scale = stage_input(sx, x, true, dim, eps, [&] {
        if (MODEL_PAIR_EARLY == MODEL_PAIR_UNROLL || p >= pairs) return;
        const uint16_t *wm = kind == 0 ? wq : kind == 1 ? wk : wv;
        load_chunks(&a, reinterpret_cast<const uint4 *>(wm + (size_t)ra * dim), dim, 0, lane, MODEL_PAIR_EARLY, MODEL_PAIR_UNROLL);
        load_chunks(&b, reinterpret_cast<const uint4 *>(wm + (size_t)rb * dim), dim, 0, lane, MODEL_PAIR_EARLY, MODEL_PAIR_UNROLL);
    });
    TRACE_AT(TRACE_STAGED);
    if (async > 0 && p < pairs) {
        const uint16_t *wm = kind == 0 ? wq : kind == 1 ? wk : wv;
        pair_async_issue<MODEL_PAIR_UNROLL>(slots, reinterpret_cast<const uint4 *>(wm + (size_t)ra * dim),
                                         reinterpret_cast<const uint4 *>(wm + (size_t)rb * dim), dim, lane, async);
    }
    const int pos = io[IO_POS];
    /* lane 0 finishes pair (ra, rb) from its two dot products: scale, bias, RoPE, then q or the cache */
    auto finish = [&](int ra, int rb, int kind, float2 v) {
        const uint16_t *bias = kind == 0 ? bq : kind == 1 ? bk : bv;
        float va = v.x * scale + (bias ? w_to_f32(bias[ra]) : 0.0f), vb = v.y * scale + (bias ? w_to_f32(bias[rb]) : 0.0f);
        if (kind < 2) {
            float sn, cs;
            __sincosf((float)pos * inv_freq[ra % head_dim], &sn, &cs);
            float ta = va * cs - vb * sn, tb = vb * cs + va * sn;
            va = ta;
            vb = tb;
        }
        if (kind == 0) {
            q[ra] = va;
            q[rb] = vb;
        } else {
            uint16_t *cache = kind == 1 ? kc : vc;
            cache[kv_at(pos, ra / head_dim, ctx, head_dim) + ra % head_dim] = __half_as_ushort(__float2half_rn(va));
            cache[kv_at(pos, rb / head_dim, ctx, head_dim) + rb % head_dim] = __half_as_ushort(__float2half_rn(vb));
        }
    };
    /* the last round split by K (QKV_SPLIT_LAST) where the pairs fill a round and what is left of
     * them fits half the warps; the full rounds before it as usual */
    const int full = pairs / grid_warps() * grid_warps(), left = pairs - full, steps = mv_steps<MODEL_PAIR_UNROLL>(dim);
    const bool split = QKV_SPLIT_LAST && full > 0 && left > 0 && 2 * left <= grid_warps() && steps >= 2;
    for (bool first = true; p < (split ? full : pairs); p += grid_warps(), first = false) {
        qkv_pair(p, q_pairs, k_pairs, head_dim, &ra, &rb, &kind);
        const uint16_t *wm = kind == 0 ? wq : kind == 1 ? wk : wv;
        float2 v = pair_round(first, &a, &b, reinterpret_cast<const uint4 *>(wm + (size_t)ra * dim),
                              reinterpret_cast<const uint4 *>(wm + (size_t)rb * dim), sx, dim, lane, slots, async);
        if (lane == 0) finish(ra, rb, kind, v);
    }
    if (split) {
        /* warp pair j (warps 2j, 2j + 1 of a block) of block b takes left-over pair (j * blocks + b): the
         * blocks in turn, so every SM gets its share. Warp 2j + h takes steps [h * steps / 2, (h + 1) *
         * steps / 2); the odd warp's sums meet the even's in shared memory at a barrier of the two. */
        __shared__ float2 halves[MODEL_MV_WARPS / 2];
        const int wid = threadIdx.x / WARP_SIZE, h = wid % 2, k = (wid / 2) * (int)gridDim.x + (int)blockIdx.x;
        if (k < left) {
            qkv_pair(full + k, q_pairs, k_pairs, head_dim, &ra, &rb, &kind);
            const uint16_t *wm = kind == 0 ? wq : kind == 1 ? wk : wv;
            float2 v = pair_steps(&a, &b, reinterpret_cast<const uint4 *>(wm + (size_t)ra * dim),
                                  reinterpret_cast<const uint4 *>(wm + (size_t)rb * dim), sx, dim, lane, h * steps / 2,
                                  (h + 1) * steps / 2);
            if (h == 1 && lane == 0) halves[wid / 2] = v;
            asm volatile("bar.sync %0, %1;" ::"r"(1 + wid / 2), "r"(2 * WARP_SIZE) : "memory");
            if (h == 0 && lane == 0) {
                const float2 o = halves[wid / 2];
                finish(ra, rb, kind, make_float2(v.x + o.x, v.y + o.y));
            }
        }
    }
    TRACE_END();
}

/* out (rows) += W (rows, K) . in (K) [+ bias]: o_proj and down_proj with the residual add. The input
 * is staged in shared memory like the norm'd kernels' (measured against reading it from L1 chunk by
 * chunk: +4.1% on the 7B shape, +0.7% on the 1B). One row a warp, double-buffered; or, with pairs
 * (a constant of the build: codegen/plan.py's residual_pairs), rows p and p + rows / 2 (rows even)
 * on one warp, both rows' loads in flight together. */
template <typename Wait>
__device__ __forceinline__ void matvec_residual_body(const uint16_t *w, const uint16_t *bias, const float *in, float *out,
                                                     int rows, int K, bool pairs, int stage, Wait wait,
                                                     int block = (int)blockIdx.x, int blocks = (int)gridDim.x,
                                                     const unsigned *go = nullptr, unsigned go_count = 0) {
    const int lane = threadIdx.x % WARP_SIZE, half = rows / 2, n = pairs ? half : rows;
    const int warps = blocks * MODEL_MV_WARPS; /* the grid's, or the part of it this stage has */
    int row = block * MODEL_MV_WARPS + (int)threadIdx.x / WARP_SIZE;
    TRACE_BEGIN(stage);
    (void)stage;
    row_chunks<> a, b;
    extern __shared__ float sx[];
    /* the first step's chunks loaded before the wait (load_lots): in the joined grid given go, lots
     * of MV_RES_PACE polling *go until it reaches go_count; launched on its own, lots of MODEL_RES_LOT */
    int early = MODEL_MV_UNROLL;
    if (row < n) {
        constexpr int PACE_LOT = MV_RES_PACE > 0 ? MV_RES_PACE : MODEL_MV_UNROLL;
        if (MV_RES_PACE > 0 && go) {
            early = load_lots<PACE_LOT>(&a, pairs ? &b : nullptr, reinterpret_cast<const uint4 *>(w + (size_t)row * K),
                                        reinterpret_cast<const uint4 *>(w + (size_t)(row + half) * K), K, lane, MODEL_MV_UNROLL,
                                        stop_at_count{go, go_count});
        } else if (MODEL_RES_LOT < MODEL_MV_UNROLL) {
            early = load_lots<MODEL_RES_LOT>(&a, pairs ? &b : nullptr, reinterpret_cast<const uint4 *>(w + (size_t)row * K),
                                          reinterpret_cast<const uint4 *>(w + (size_t)(row + half) * K), K, lane, MODEL_MV_UNROLL,
                                          never_stop{});
        } else {
            load_step(&a, reinterpret_cast<const uint4 *>(w + (size_t)row * K), K, 0, lane);
            if (pairs) load_step(&b, reinterpret_cast<const uint4 *>(w + (size_t)(row + half) * K), K, 0, lane);
        }
    }
    TRACE_AT(TRACE_READY);
    wait();
    TRACE_AT(TRACE_WAITED);
    /* the first step's chunks a paced start left (MV_RES_PACE), behind the input's loads */
    auto rest = [&] {
        if (early >= MODEL_MV_UNROLL || row >= n) return;
        load_chunks_from(&a, reinterpret_cast<const uint4 *>(w + (size_t)row * K), K, 0, lane, early);
        if (pairs) load_chunks_from(&b, reinterpret_cast<const uint4 *>(w + (size_t)(row + half) * K), K, 0, lane, early);
    };
    stage_input<polls_input<Wait>::value>(sx, in, false, K, 0.0f, rest); /* polled: wait_poll */
    TRACE_AT(TRACE_STAGED);
    for (bool first = true; row < n; row += warps, first = false) {
        const uint4 *r = reinterpret_cast<const uint4 *>(w + (size_t)row * K);
        /* The residual's old values, loaded before the row's dot product so that the add at its end
         * waits on no L2 round trip (the compiler keeps `out +=` after the dot product: out may alias
         * for all it knows): SmolLM2 +3.7%, 7B +0.4%, 1B -0.3% (PERFORMANCE.md, tenth session).
         * Nothing else writes these rows in this stage. */
        float res_a = 0.0f, res_b = 0.0f;
        if (lane == 0) {
            res_a = __ldcg(out + row);
            if (pairs) res_b = __ldcg(out + row + half);
        }
        if (pairs) {
            const float2 v = pair_round(first, &a, &b, r, reinterpret_cast<const uint4 *>(w + (size_t)(row + half) * K), sx, K, lane);
            if (lane == 0) {
                out[row] = res_a + (v.x + (bias ? w_to_f32(bias[row]) : 0.0f));
                out[row + half] = res_b + (v.y + (bias ? w_to_f32(bias[row + half]) : 0.0f));
            }
        } else {
            if (!first) load_step(&a, r, K, 0, lane);
            const float v = row_dot_buffered(&a, r, sx, K, lane);
            if (lane == 0) {
                out[row] = res_a + (v + (bias ? w_to_f32(bias[row]) : 0.0f));
            }
        }
    }
    TRACE_END();
}

/* post_attention_layernorm + gate_proj and up_proj + SiLU: hb[i] = silu(gate_i . xn) * (up_i . xn),
 * both rows of i on one warp. */
template <typename Wait>
__device__ __forceinline__ void rmsnorm_gate_up_silu_body(const uint16_t *norm_w, const uint16_t *wg, const uint16_t *wu,
                                                          const float *x, float *hb, int dim, int hidden, float eps,
                                                          Wait wait) {
    extern __shared__ float sx[];
    const int lane = threadIdx.x % WARP_SIZE;
    int i = grid_warp();
    TRACE_BEGIN(ST_GATE_UP);
    row_chunks<MODEL_PAIR_UNROLL> a, b;
    if (i < hidden) {
        pair_early_loads(&a, &b, reinterpret_cast<const uint4 *>(wg + (size_t)i * dim),
                         reinterpret_cast<const uint4 *>(wu + (size_t)i * dim), dim, lane);
    }
    stage_norm(sx, norm_w, dim);
    TRACE_AT(TRACE_READY);
    wait();
    TRACE_AT(TRACE_WAITED);
    const float scale = stage_input<polls_input<Wait>::value>(sx, x, true, dim, eps, [&] {
        if (MODEL_PAIR_EARLY == MODEL_PAIR_UNROLL || i >= hidden) return;
        load_chunks(&a, reinterpret_cast<const uint4 *>(wg + (size_t)i * dim), dim, 0, lane, MODEL_PAIR_EARLY, MODEL_PAIR_UNROLL);
        load_chunks(&b, reinterpret_cast<const uint4 *>(wu + (size_t)i * dim), dim, 0, lane, MODEL_PAIR_EARLY, MODEL_PAIR_UNROLL);
    });
    TRACE_AT(TRACE_STAGED);
    for (bool first = true; i < hidden; i += grid_warps(), first = false) {
        float2 v = pair_round(first, &a, &b, reinterpret_cast<const uint4 *>(wg + (size_t)i * dim),
                              reinterpret_cast<const uint4 *>(wu + (size_t)i * dim), sx, dim, lane);
        if (lane == 0) hb[i] = silu(v.x * scale) * (v.y * scale);
    }
    TRACE_END();
}

// ---------------------------------------------------------------------------------------------
// The MLP in one kernel (MODEL_MLP_FUSED, where the hidden size is 2048 or 4096 on sm_90; the default
// there): gate/up, SiLU and down without the boundary between gate/up and down, which costs the
// Llama-3.2-1B shape ~2.5 us a layer beyond down's bytes. One block of MLP_WARPS warps an SM takes a range of hidden
// units [u0, u1), in batches of MLP_UNITS(dim) (a unit to MLP_ROW_WARPS(dim) warps: rows of 8 chunks
// of 16 bytes a lane). For each batch:
// - each warp dots its part of its unit's gate and up rows with the staged, normed input (as the
//   decode gate/up does), then loads the next batch's rows at once, so that they are in flight under
//   this batch's down phase; the unit's warps' sums make silu(g) * u in shared memory;
// - the batch's rows of down's transpose (MLP_UNITS x dim, contiguous: the runtime keeps a copy of
//   down_proj transposed) land in shared memory on the bulk-copy engine, MLP_SLOTS batches ahead,
//   counted on the slot's mbarrier (the first before the wait, the rest after it);
// - past a block barrier each warp multiplies its dim / MLP_WARPS output columns (4 or 8 a lane) by
//   the batch's hidden values.
// The block ends with a partial sum of every output, added into `out` in L2 (red.global.add.v4.f32;
// block 0 adds the residual x too): out must be zero before, so each layer's kernel zeroes the
// buffer the next layer adds into (`zero`, the last layer's input, dead past this kernel's wait).
// The reductions' order is not fixed: a build with MODEL_MLP_FUSED is not reproducible to the last bit
// from run to run (the fp32 rounding of 132 partial sums an output). Measured alone first
// (tests/bench/fused_mlp.cu, forty-second session, PERFORMANCE.md): 16 chained 1B-shaped MLPs in
// 24.2 us a layer against 26.6 for the two kernels, the reductions 0.3 of it; clusters summing their
// blocks' partials in distributed shared memory first held fewer SMs and lost, fixed-point
// reductions (reproducible) cost 5 us more (four times the atomic operations). In the 1B's step it
// lost 0.3-0.7% at depth 0 (+0.3-1.0% at 4096): traced, the MLP itself ends 1.8 us a layer sooner
// than gate/up and down, but its one block an SM (55K registers, 136 KB) lands only once o_proj's
// blocks have left, and QKV's blocks only once it has, its wait 0.5 us later (the reductions).

#define MLP_WARPS 16
#define MLP_THREADS (MLP_WARPS * WARP_SIZE)
#define MLP_SLOTS 2       /* down's tiles in flight (3 lost 1.3 us a layer alone) */
#define MLP_EARLY_TILES 1 /* of them, issued before the wait (2: -0.7 us a layer alone; 0, all after x's copy: -0.2% on the 1B) */
#define MLP_EARLY_ROWS 1 /* 1: the first batch's gate and up rows loaded before the wait; 0: once the input is staged */
/* The input x lands in shared memory by one bulk copy after the wait, not by the threads' loads,
 * which queue behind the block's 192 KB of first weight loads when the block lands at its
 * producer's end (traced: staged median 6.5 us after o_proj's end); on the 1B +0.6%. The matvecs'
 * bulk input, the same for every stage, lost 11%: their blocks land before their producer ends. */
/* The warps that take a hidden unit's gate and up rows (8 chunks of 16 bytes a lane of each), and
 * the hidden units of a batch: 1 and 16 at a hidden size of 2048, 2 and 8 at 4096 */
#define MLP_ROW_WARPS(dim) ((dim) / 2048)
#define MLP_UNITS(dim) (MLP_WARPS / MLP_ROW_WARPS(dim))
/* Dynamic shared memory of mlp_fused_body: the tiles of down's transpose (64 KB each), then the
 * staged input and the copy of x it is made from */
#define MLP_SMEM_BYTES(dim) ((size_t)MLP_SLOTS * MLP_UNITS(dim) * (dim) * sizeof(uint16_t) + (size_t)(dim) * sizeof(float) * 2)

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
/* a shared-memory mbarrier (its shared address) for `count` arrivals */
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
/* this thread's arrival, and `bytes` more that the phase waits for (complete_tx of the copies) */
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
/* this thread's arrival */
__device__ __forceinline__ void mbar_arrive(uint32_t bar) { asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory"); }
/* until the phase of parity `parity` has completed */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done = 0;
    while (!done)
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
}
/* bytes (a multiple of 16) from global src to shared dst on the bulk-copy engine, the phase of bar
 * waiting for them (the calling thread's arrival) */
__device__ __forceinline__ void bulk_copy_shared(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
    mbar_arrive_expect_tx(bar, bytes);
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst), "l"(src),
                 "r"(bytes), "r"(bar)
                 : "memory");
}

/* 4 weights (a uint2) to fp32 */
__device__ __forceinline__ void w4_to_f32(uint2 u, float f[4]) {
#if GPU_W_BF16
    f[0] = __uint_as_float(u.x << 16), f[1] = __uint_as_float(u.x & 0xFFFF0000u);
    f[2] = __uint_as_float(u.y << 16), f[3] = __uint_as_float(u.y & 0xFFFF0000u);
#else
    const float2 a = __half22float2(*reinterpret_cast<const __half2 *>(&u.x)), b = __half22float2(*reinterpret_cast<const __half2 *>(&u.y));
    f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y;
#endif
}

template <int DIM, int HIDDEN, typename Wait>
__device__ __forceinline__ void mlp_fused_body(const uint16_t *norm_w, const uint16_t *wg, const uint16_t *wu, const uint16_t *down_t,
                                               const float *x, float *out, float *zero, float eps, Wait wait) {
    /* RW warps a unit, each LCH chunks a lane of its rows (its part of them: RCH chunks); NB units a
     * batch; CPL output columns a lane */
    constexpr int DCH = DIM / 8, RW = MLP_ROW_WARPS(DIM), NB = MLP_UNITS(DIM), RCH = DCH / RW, LCH = RCH / WARP_SIZE,
                  CPL = DIM / MLP_WARPS / WARP_SIZE;
    static_assert((DIM == 2048 || DIM == 4096) && LCH == 8 && (CPL == 4 || CPL == 8) && DCH <= MLP_THREADS,
                  "mlp_fused_body: a hidden size of 2048 or 4096 (8 chunks a lane a row part, 4 or 8 columns a lane)");
    static_assert(MLP_EARLY_TILES >= 0 && MLP_EARLY_TILES <= MLP_SLOTS, "MLP_EARLY_TILES: 0 .. MLP_SLOTS");
    extern __shared__ __align__(16) float smem[];
    uint16_t *tiles = reinterpret_cast<uint16_t *>(smem);      /* (MLP_SLOTS, NB, DIM) */
    float4 *sx4 = reinterpret_cast<float4 *>(smem + MLP_SLOTS * NB * DIM / 2); /* the input, in halves as stage_input's */
    __shared__ float partial[MLP_WARPS], hs[NB], g_part[RW > 1 ? MLP_WARPS : 1], u_part[RW > 1 ? MLP_WARPS : 1];
    __shared__ __align__(8) uint64_t bars[MLP_SLOTS + 1]; /* the tiles' slots, then x's copy */
    const float4 *x_raw = reinterpret_cast<const float4 *>(sx4 + 2 * DCH);  /* x as it is */
    const int tid = threadIdx.x, lane = tid % WARP_SIZE, w = tid / WARP_SIZE, G = gridDim.x, b = blockIdx.x;
    const int unit = w / RW, part = w % RW; /* this warp's unit of a batch, and its part of the unit's rows */
    const int u0 = (int)((long long)b * HIDDEN / G), n = (int)((long long)(b + 1) * HIDDEN / G) - u0, nb = (n + NB - 1) / NB;
    const uint32_t bar0 = (uint32_t)__cvta_generic_to_shared(bars), tiles0 = (uint32_t)__cvta_generic_to_shared(tiles);
    auto rows_of = [&](int k) { return min(NB, n - k * NB); };
    auto issue_tile = [&](int k) {
        bulk_copy_shared(tiles0 + (uint32_t)((k % MLP_SLOTS) * NB * DIM * sizeof(uint16_t)), down_t + (size_t)(u0 + k * NB) * DIM,
                         (uint32_t)(rows_of(k) * DIM * sizeof(uint16_t)), bar0 + 8 * (k % MLP_SLOTS));
    };
    auto load_row = [&](uint4 r[LCH], const uint16_t *row) {
#pragma unroll
        for (int j = 0; j < LCH; j++) r[j] = ld_stream(reinterpret_cast<const uint4 *>(row) + part * RCH + j * WARP_SIZE + lane);
    };
    TRACE_BEGIN(ST_MLP);
    /* the norm weights first, into registers: a load that waits behind the block's weight loads
     * held every block's staging ~5 us (traced, forty-second session) */
    const uint4 nw = tid < DCH ? __ldg(reinterpret_cast<const uint4 *>(norm_w) + tid) : make_uint4(0, 0, 0, 0);
    if (tid == 0) {
        for (int i = 0; i < MLP_SLOTS + 1; i++) mbar_init(bar0 + 8 * i, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); /* the inits, seen by the async proxy */
        for (int k = 0; k < MLP_EARLY_TILES && k < nb; k++) issue_tile(k);
    }
    uint4 ga[LCH], ua[LCH]; /* this warp's gate and up rows of the batch */
    auto load_first_rows = [&] {
        if (unit < rows_of(0)) {
            load_row(ga, wg + (size_t)(u0 + unit) * DIM);
            load_row(ua, wu + (size_t)(u0 + unit) * DIM);
        }
    };
    if (MLP_EARLY_ROWS) load_first_rows();
    TRACE_AT(TRACE_READY);
    wait();
    TRACE_AT(TRACE_WAITED);
    if (tid == 0) {
        asm volatile("fence.proxy.async.global;" ::: "memory"); /* the producer's x, for the async proxy */
        bulk_copy_shared((uint32_t)__cvta_generic_to_shared(x_raw), x, DIM * sizeof(float), bar0 + 8 * MLP_SLOTS);
        for (int k = MLP_EARLY_TILES; k < MLP_SLOTS && k < nb; k++) issue_tile(k);
    }
    for (int i = b * MLP_THREADS + tid; i < DIM; i += G * MLP_THREADS) zero[i] = 0.0f;
    float ss = 0.0f;
    __syncthreads(); /* the mbarriers' inits, seen by every thread before its wait */
    mbar_wait(bar0 + 8 * MLP_SLOTS, 0);
    if (tid < DCH) { /* x * norm, and x's sum of squares */
        const float4 p = x_raw[2 * tid], q = x_raw[2 * tid + 1];
        float f[8];
        w8_to_f32(nw, f);
        ss = p.x * p.x + p.y * p.y + p.z * p.z + p.w * p.w + q.x * q.x + q.y * q.y + q.z * q.z + q.w * q.w;
        sx4[tid] = make_float4(p.x * f[0], p.y * f[1], p.z * f[2], p.w * f[3]);
        sx4[DCH + tid] = make_float4(q.x * f[4], q.y * f[5], q.z * f[6], q.w * f[7]);
    }
    if (!MLP_EARLY_ROWS) load_first_rows();
    ss = warp_sum(ss);
    if (lane == 0) partial[w] = ss;
    __syncthreads(); /* the input staged; also the mbarriers' inits seen by every thread */
    ss = 0.0f;
#pragma unroll
    for (int i = 0; i < MLP_WARPS; i++) ss += partial[i];
    const float scale = rsqrtf(ss / (float)DIM + eps);
    TRACE_AT(TRACE_STAGED);
    const int col = w * (DIM / MLP_WARPS) + lane * CPL;
    float acc[CPL] = {};
    for (int k = 0; k < nb; k++) {
        const int rows = rows_of(k);
        float hv = 0.0f; /* RW 1: the unit's hidden value */
        if (unit < rows) {
            float sg = 0.0f, su = 0.0f;
#pragma unroll
            for (int j = 0; j < LCH; j++) { /* each staged float4 read once for both rows */
                const int c = part * RCH + j * WARP_SIZE + lane;
                const float4 p = sx4[c], q = sx4[DCH + c];
                float fg[8], fu[8];
                w8_to_f32(ga[j], fg);
                w8_to_f32(ua[j], fu);
                sg += fg[0] * p.x + fg[1] * p.y + fg[2] * p.z + fg[3] * p.w + fg[4] * q.x + fg[5] * q.y + fg[6] * q.z + fg[7] * q.w;
                su += fu[0] * p.x + fu[1] * p.y + fu[2] * p.z + fu[3] * p.w + fu[4] * q.x + fu[5] * q.y + fu[6] * q.z + fu[7] * q.w;
            }
            if (RW == 1) {
                hv = silu(warp_sum(sg) * scale) * (warp_sum(su) * scale);
            } else { /* this warp's part of the unit's sums */
                sg = warp_sum(sg), su = warp_sum(su);
                if (lane == 0) g_part[w] = sg, u_part[w] = su;
            }
        }
        if (k + 1 < nb && unit < rows_of(k + 1)) { /* the next batch's rows, in flight under this one's down phase */
            load_row(ga, wg + (size_t)(u0 + (k + 1) * NB + unit) * DIM);
            load_row(ua, wu + (size_t)(u0 + (k + 1) * NB + unit) * DIM);
        }
        if (RW == 1) {
            if (lane == 0) hs[w] = hv;
        } else if (unit < rows) { /* the unit's warps' parts: named barrier 1 + unit, the unit's warps only */
            asm volatile("bar.sync %0, %1;" ::"r"(1 + unit), "r"(RW * WARP_SIZE) : "memory");
            if (part == 0 && lane == 0) {
                float sg = 0.0f, su = 0.0f;
#pragma unroll
                for (int p = 0; p < RW; p++) sg += g_part[unit * RW + p], su += u_part[unit * RW + p];
                hs[unit] = silu(sg * scale) * (su * scale);
            }
        }
        __syncthreads(); /* the batch's hidden values */
        mbar_wait(bar0 + 8 * (k % MLP_SLOTS), (uint32_t)(k / MLP_SLOTS) & 1u);
        const uint16_t *t = tiles + (size_t)(k % MLP_SLOTS) * NB * DIM + col;
#pragma unroll 4
        for (int r = 0; r < rows; r++) {
            float f[CPL];
            if constexpr (CPL == 4)
                w4_to_f32(*reinterpret_cast<const uint2 *>(t + (size_t)r * DIM), f);
            else
                w8_to_f32(*reinterpret_cast<const uint4 *>(t + (size_t)r * DIM), f);
            const float h = hs[r];
#pragma unroll
            for (int e = 0; e < CPL; e++) acc[e] += h * f[e];
        }
        __syncthreads(); /* the slot and hs are free */
        if (tid == 0 && k + MLP_SLOTS < nb) {
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* the slot's reads before the copy's writes */
            issue_tile(k + MLP_SLOTS);
        }
    }
#pragma unroll
    for (int e = 0; e < CPL; e += 4) {
        float4 v = make_float4(acc[e], acc[e + 1], acc[e + 2], acc[e + 3]);
        if (b == 0) { /* the residual, once */
            const float4 r = __ldcg(reinterpret_cast<const float4 *>(x + col + e));
            v.x += r.x, v.y += r.y, v.z += r.z, v.w += r.w;
        }
        asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(out + col + e), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
                     : "memory");
    }
    TRACE_END();
}
#endif

/* Each warp's best (value, id) in lane 0, folded into thread 0's (bv, bi): larger value, lower id
 * on ties, as the CPU sampler chooses. Called by the whole block (one barrier). */
__device__ __forceinline__ void block_best_to_thread0(float *best_v, int *best_i, float *bv, int *bi) {
    if (threadIdx.x % WARP_SIZE == 0) {
        best_v[threadIdx.x / WARP_SIZE] = *bv;
        best_i[threadIdx.x / WARP_SIZE] = *bi;
    }
    __syncthreads();
    if (threadIdx.x == 0)
        for (int i = 1; i < MODEL_MV_WARPS; i++)
            if (best_v[i] > *bv || (best_v[i] == *bv && best_i[i] < *bi)) {
                *bv = best_v[i];
                *bi = best_i[i];
            }
}

/* model.norm + LM head: logits (vocab) = W . xn, and the greedy choice: each block keeps its best
 * (value, lowest id), the last block to finish reduces them into io[IO_NEXT]. */
template <typename Wait>
__device__ __forceinline__ void rmsnorm_lm_head_argmax_body(const uint16_t *norm_w, const uint16_t *w, const float *x,
                                                            float *logits, float2 *block_best, unsigned *counter,
                                                            int *io, int dim, int vocab, float eps, Wait wait) {
    extern __shared__ float sx[];
    __shared__ float best_v[MODEL_MV_WARPS];
    __shared__ int best_i[MODEL_MV_WARPS];
    __shared__ bool last;
    const int lane = threadIdx.x % WARP_SIZE;
    int row = grid_warp();
    TRACE_BEGIN(ST_LM_HEAD);
    row_chunks<> a;
    if (row < vocab) load_step(&a, reinterpret_cast<const uint4 *>(w + (size_t)row * dim), dim, 0, lane);
    stage_norm(sx, norm_w, dim);
    TRACE_AT(TRACE_READY);
    wait();
    TRACE_AT(TRACE_WAITED);
    const float scale = stage_input(sx, x, true, dim, eps);
    TRACE_AT(TRACE_STAGED);
    float bv = -INFINITY;
    int bi = 0x7FFFFFFF;
    for (bool first = true; row < vocab; row += grid_warps(), first = false) {
        const uint4 *r = reinterpret_cast<const uint4 *>(w + (size_t)row * dim);
        if (!first) load_step(&a, r, dim, 0, lane);
        float v = row_dot(&a, r, sx, dim, lane) * scale;
        if (lane == 0) logits[row] = v;
        if (v > bv || (v == bv && row < bi)) { bv = v; bi = row; }
    }
    TRACE_END();
    block_best_to_thread0(best_v, best_i, &bv, &bi);
    if (threadIdx.x == 0) {
        block_best[blockIdx.x] = make_float2(bv, __int_as_float(bi));
        __threadfence();
        last = atomicAdd(counter, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    /* The last block: reduce every block's best, lowest id on ties, as the CPU sampler does. */
    __threadfence();
    bv = -INFINITY;
    bi = 0x7FFFFFFF;
    for (int i = threadIdx.x; i < (int)gridDim.x; i += blockDim.x) {
        float2 p = __ldcg(&block_best[i]);
        int pi = __float_as_int(p.y);
        if (p.x > bv || (p.x == bv && pi < bi)) { bv = p.x; bi = pi; }
    }
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o /= 2) {
        float ov = __shfl_xor_sync(0xFFFFFFFFu, bv, o);
        int oi = __shfl_xor_sync(0xFFFFFFFFu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
    }
    block_best_to_thread0(best_v, best_i, &bv, &bi);
    if (threadIdx.x == 0) {
        io[IO_NEXT] = bi;
        *counter = 0;
    }
}

// ---------------------------------------------------------------------------------------------
// Attention: split-K flash decoding. Block (kv head, split) scores its slice of the positions
// for all kv_mul query heads of the group, so each KV head is read once per group; the last block
// of a KV head to finish combines the splits' partial softmax sums in split order (deterministic).
// The block that writes a KV group's output (its only split, or the combining block) adds 1 to
// *ready when given one: the joined attention/o_proj grid's o_proj blocks wait on that count.

/* The tensor-core path's query operands (hi and lo terms of every lane's 8 dims of each 32-dim chunk),
 * in shared memory after the (max, sum) pairs: 32-bit words. */
#define ATT_QFRAG_WORDS(head_dim) ((head_dim) / 32 * 8 * WARP_SIZE)

/* Floats of the scores, which the warps' sums reuse. The sums' stores fall on 4 banks where a group
 * has 4 heads (4-way conflicts, ~0.57 us of the 7B's attention at depth 0); neither a swizzle (XOR)
 * nor padded rows paid (PERFORMANCE.md, twenty-first and twenty-second sessions). */
#define ATT_SC_FLOATS(rows, hd) ((size_t)(rows) * ATT_TILE)

/* Dynamic shared memory of attention_body, in bytes. */
#define ATT_SMEM_BYTES(kv_mul, head_dim) \
    ((ATT_SC_FLOATS(kv_mul, head_dim) + 2 * (size_t)(kv_mul) + ATT_QFRAG_WORDS(head_dim)) * sizeof(float))

/* This block's outputs are written: one more to *done (NULL: nobody counts), for wait_count. */
__device__ __forceinline__ void signal_done(unsigned *done) {
    if (!done) return;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) atomicAdd(done, 1u);
}

/* The decode step's attention on the tensor cores (attention_body with MMA_HD, the head width: 64
 * or 128, one token): fp16 mma.m16n8k16 with fp32 sums, where the fp32 path spends ~5 instructions
 * per byte of keys in shuffles and conversions and lands at ~1.6 TB/s alone at depth 16384 on the 1B
 * shape (ncu, twelfth session). A warp takes tiles of 16 positions, ATT_MMA_TILES of them a round,
 * and where pipelined the next round's loads go out before this round's products.
 * - Scores as S^T = K Q^T: A is the tile's keys (16 positions x 16 dims a k-step), B the group's
 *   query rows (n = 8 >= kv_mul). The dot product does not care which dims a k-step takes as long
 *   as A and B agree, so lane (g, c) holds dims 32 ch + 8 c .. + 7 of positions g and g + 8 of the
 *   tile for each 32-dim chunk ch (a 16-byte load each, and a warp's loads cover whole 64-byte
 *   pieces of 8 keys), as the prefill's pairs do with weight rows.
 * - Values as O^T = V^T P^T: A is V^T (16 dims x 16 positions), B the probabilities (positions x
 *   rows). Lane (g, c) loads positions 4c .. 4c + 3 of the tile at its dims (the uint4s 8u + g of
 *   each value row: dims d' = 8u + e at (8u + g) * 8 + e), and pairs two positions' halves of one
 *   dim into an operand register (a byte permute). m-tile t takes d' = t (rows g) and t + HD/16
 *   (rows g + 8).
 * - The fp32 queries and probabilities go in as two fp16 terms each (hi + lo, 22 bits), the
 *   keys and values are fp16 already: outputs within ~3e-7 of the largest against float64
 *   (tests/bench/attention_mma_sim.py, which checks this index arithmetic).
 * The knobs below are plain numbers, so that a variant build can set them (-DATT_MMA_PIPE_KEYS=1). */
#define ATT_MMA_TILES 0 /* tiles of 16 positions a warp loads at once (a round); 0: 2 on heads of 64, 1 on 128 */
/* 1: the next round's keys (values) loaded before this round's products, 0: a round at a time; -1:
 * the measured choice: keys pipelined at every head width, values on heads of 64 only. At 128 two
 * rounds of values spill 52 bytes in the 7B shape's joined attention/o_proj grid, and there the
 * pipelined build measured -1% against one round at a time; keys alone fit (125 registers in the
 * joined grid) and gained 0.6% at depth 16384 (PERFORMANCE.md, twelfth and thirteenth sessions).
 * Since the twentieth session the 7B runs attention_kernel alone, where values pipelined on heads of
 * 128 take 128 registers and spill nothing: not yet measured. */
#define ATT_MMA_PIPE_KEYS -1
#define ATT_MMA_PIPE_VALUES -1
__host__ __device__ constexpr int att_mma_tiles(int hd) { return ATT_MMA_TILES > 0 ? ATT_MMA_TILES : hd <= 64 ? 2 : 1; }
/* Each warp's first round of values copied into shared memory (cp.async) with its keys, the cached
 * positions' before the wait and this step's after it (2: all of them after it), instead of loaded
 * after the softmax: one L2 or DRAM round trip off the split's chain. A split of up to 256 positions
 * (heads of 64) or 128 (heads of 128) is one round. Only where the context has at most
 * ATT_STAGE_MAX_SPLITS splits: where attention's blocks are few, its chain is latency; in a full wave
 * of them (33 splits from depth 8448) it is bandwidth, and the early values only crowd the keys. The
 * round's rows are stored with their 16-byte chunks permuted (stage_chunk) so that the value pass's
 * reads, 4 positions x 2 chunks a quarter-warp, fall in 8 bank groups. Measured on the 1B shape
 * (PERFORMANCE.md, fourteenth session): +1.3-1.4% at depths 0 / 1024 / 4096, even at 8192 / 16384
 * with the limit (-1.3% / -2.0% without it); 2 lost 0.8% at 1024. On the 7B shape (heads of 128) the
 * joined grid spills 52 bytes with it and lost 0.7-2.3% at every depth (attention_kernel alone, as
 * the 7B runs it since the twentieth session: 136 registers, or 128 and 12 bytes spilled with
 * -DATT_MIN_BLOCKS=2; not yet measured); the SmolLM2 shape lost 2.8% at depth 0. A plan choice
 * (codegen/plan.py, _att_stage_values); 0 here: off. */
#define ATT_STAGE_MAX_SPLITS 17 /* to depth 4352 in splits of 256 */
/* Bytes of shared memory the staged values take */
__host__ __device__ constexpr size_t att_value_stage_bytes(int hd) {
    return MODEL_ATT_STAGE_VALUES ? 16 + (size_t)(MODEL_ATT_THREADS / WARP_SIZE) * att_mma_tiles(hd) * 16 * hd * 2 : 0; /* 16: alignment */
}
/* Where chunk ch of position p of a tile goes in the staged round: the chunk's low bits XOR 2 (p / 4 % 4),
 * so a quarter-warp's 8 reads (g = 2q, 2q + 1; positions 4 cq + i) fall in 8 different 16-byte bank groups */
__device__ __forceinline__ int stage_chunk(int ch, int p) { return ch ^ (2 * ((p >> 2) & 3)); }

/* The staged values' place in attention_body's shared memory: after the query operands, 16-byte aligned */
template <int HD>
__device__ __forceinline__ uint4 *att_value_stage(float *sml, int rows) {
    const uint32_t *qf = reinterpret_cast<const uint32_t *>(sml + 2 * rows) + ATT_QFRAG_WORDS(HD);
    return reinterpret_cast<uint4 *>((reinterpret_cast<uintptr_t>(qf) + 15) & ~(uintptr_t)15);
}

__host__ __device__ constexpr bool att_mma_pipe_keys(void) { return ATT_MMA_PIPE_KEYS != 0; }
__host__ __device__ constexpr bool att_mma_pipe_values(int hd) { return ATT_MMA_PIPE_VALUES >= 0 ? ATT_MMA_PIPE_VALUES != 0 : hd <= 64; }

/* c (16 x 8, fp32) += a (16 x 16, row-major) . b (16 x 8, column-major), fp16 operands */
__device__ __forceinline__ void mma_f16_16x8x16(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                                uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* An fp32 pair as two fp16 pairs that sum to it, each packed low then high (mma operands). */
__device__ __forceinline__ void split_h2(float x, float y, uint32_t *hi, uint32_t *lo) {
    const __half2 h = __floats2half2_rn(x, y);
    const float2 b = __half22float2(h);
    const __half2 l = __floats2half2_rn(x - b.x, y - b.y);
    *hi = *reinterpret_cast<const uint32_t *>(&h);
    *lo = *reinterpret_cast<const uint32_t *>(&l);
}

/* fp16 value e (0..7) of x low, of y high: one operand register from two positions' values */
__device__ __forceinline__ uint32_t half_pair(uint4 x, uint4 y, int e) {
    const uint32_t wx = (&x.x)[e / 2], wy = (&y.x)[e / 2];
    return __byte_perm(wx, wy, e % 2 ? 0x7632 : 0x5410);
}

/* The dim of value d' (0 .. HD/8 - 1) of lane group g in the value pass (the uint4 8u + g of a row). */
__device__ __forceinline__ int mma_value_dim(int d, int g) { return (8 * (d / 8) + g) * 8 + d % 8; }

/* Warp ch's part of the query operands in qf (attention_body): the group's row g's dims 32 ch + 8 cq ..
 * + 7 (q's rows row0 + g; 0 past rows) as hi and lo fp16 pairs, word w of the chunk of each lane at
 * qf[(8 ch + w) * 32 + lane], read by every warp's same lane */
template <int HD>
__device__ __forceinline__ void mma_query_operands(uint32_t *qf, const float *q, int row0, int rows, int ch, int lane) {
    const int g = lane / 4, cq = lane % 4;
    float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f), b = a;
    if (g < rows) {
        const float4 *qg = reinterpret_cast<const float4 *>(q + (size_t)(row0 + g) * HD + 32 * ch + 8 * cq);
        a = qg[0], b = qg[1];
    }
    uint32_t *f = qf + 8 * ch * WARP_SIZE + lane;
    split_h2(a.x, a.y, &f[0 * WARP_SIZE], &f[4 * WARP_SIZE]);
    split_h2(a.z, a.w, &f[1 * WARP_SIZE], &f[5 * WARP_SIZE]);
    split_h2(b.x, b.y, &f[2 * WARP_SIZE], &f[6 * WARP_SIZE]);
    split_h2(b.z, b.w, &f[3 * WARP_SIZE], &f[7 * WARP_SIZE]);
}

/* One tile's scores S^T = K Q^T (16 positions x 8 query rows) into s: lane (g, cq) gives its keys of
 * positions g (k0) and g + 8 (k1), its uint4 of each 32-dim chunk, and gets (position g, rows 2 cq,
 * 2 cq + 1), (g + 8, the same) in s[0..3]; the queries' hi and lo terms from qf (attention_body). */
template <int KCH>
__device__ __forceinline__ void mma_score_tile(float s[4], const uint4 (&k0)[KCH], const uint4 (&k1)[KCH], const uint32_t *qf,
                                               int lane) {
#pragma unroll
    for (int ch = 0; ch < KCH; ch++) {
        const uint4 a = k0[ch], b = k1[ch];
        const uint32_t *f = qf + 8 * ch * WARP_SIZE + lane;
        mma_f16_16x8x16(s, a.x, b.x, a.y, b.y, f[0 * WARP_SIZE], f[1 * WARP_SIZE]); /* hi */
        mma_f16_16x8x16(s, a.x, b.x, a.y, b.y, f[4 * WARP_SIZE], f[5 * WARP_SIZE]); /* lo */
        mma_f16_16x8x16(s, a.z, b.z, a.w, b.w, f[2 * WARP_SIZE], f[3 * WARP_SIZE]);
        mma_f16_16x8x16(s, a.z, b.z, a.w, b.w, f[6 * WARP_SIZE], f[7 * WARP_SIZE]);
    }
}

/* One tile's weighted values O^T += V^T P^T into o (m-tile t: dims d' = t and t + MT, query rows
 * 2 cq, 2 cq + 1): lane (g, cq) gives its uint4s 8 u + g of positions 4 cq .. 4 cq + 3 (v) and row
 * g's probabilities at those positions (p, 0 past the group or the positions). */
template <int HD>
__device__ __forceinline__ void mma_value_tile(float (&o)[HD / 16][4], const uint4 (&v)[4][HD / 64], float4 p) {
    constexpr int MT = HD / 16;
    uint32_t ph0, pl0, ph1, pl1;
    split_h2(p.x, p.y, &ph0, &pl0);
    split_h2(p.z, p.w, &ph1, &pl1);
#pragma unroll
    for (int t = 0; t < MT; t++) {
        const int d0 = t, d1 = t + MT; /* rows g and g + 8 of m-tile t */
        const uint32_t a0 = half_pair(v[0][d0 / 8], v[1][d0 / 8], d0 % 8);
        const uint32_t a1 = half_pair(v[0][d1 / 8], v[1][d1 / 8], d1 % 8);
        const uint32_t a2 = half_pair(v[2][d0 / 8], v[3][d0 / 8], d0 % 8);
        const uint32_t a3 = half_pair(v[2][d1 / 8], v[3][d1 / 8], d1 % 8);
        mma_f16_16x8x16(o[t], a0, a1, a2, a3, ph0, ph1);
        mma_f16_16x8x16(o[t], a0, a1, a2, a3, pl0, pl1);
    }
}

/* A split's block after its partial sums (part_acc, unnormalized) and (max, sum) (part_ml) are stored:
 * it counts itself in, and the last of the KV head's n_active splits weighs them all into out.
 * sc: shared memory for the splits' (max, sum), 2 rows n_active floats. Rows, tokens, q_stride and
 * parts as attention_body's. */
template <int TOKENS>
__device__ __forceinline__ void attention_combine(float *sc, const float *part_acc, const float *part_ml, unsigned *counters,
                                                  float *out, int head_dim, int kv_mul, int n_splits, int n_active, int kvh,
                                                  unsigned *ready, int q_stride, size_t parts) {
    __shared__ bool last;
    const int rows = TOKENS * kv_mul, tid = threadIdx.x, lane = tid % WARP_SIZE, wid = tid / WARP_SIZE;
    auto token_of = [&](int r) { return TOKENS == 1 ? 0 : r / kv_mul; };
    auto head_of = [&](int r) { return TOKENS == 1 ? r : r % kv_mul; };
    TRACE_RESUME();
    __threadfence();
    __syncthreads();
    if (tid == 0) last = atomicAdd(&counters[kvh], 1u) == (unsigned)n_active - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    {
        /* The last block of this KV head: every split's (max, sum) of each head loaded at once into
         * shared memory, turned into the splits' weights by warp h for head h, then each thread one
         * (head, dim) output from the splits' partial sums, ATT_COMBINE_VEC loads in flight: a chain
         * of one load per split cost ~12 us a layer at depth 4096 on the 1B shape (PERFORMANCE.md). */
        const bool wide = ATT_COMBINE_WIDE > 0 || (ATT_COMBINE_WIDE < 0 && rows * head_dim > MODEL_ATT_THREADS);
        /* MODEL_ATT_COMBINE_EARLY: thread tid's output (head tid / head_dim), its first splits' sums */
        const bool early = MODEL_ATT_COMBINE_EARLY > 0 && !wide && rows * head_dim <= (int)blockDim.x;
        const float *acc_e = part_acc + (size_t)token_of(tid / head_dim) * parts * head_dim +
                             (size_t)(kvh * kv_mul + head_of(tid / head_dim)) * n_splits * head_dim + tid % head_dim;
        float pre[MODEL_ATT_COMBINE_EARLY > 0 ? MODEL_ATT_COMBINE_EARLY : 1];
        if (early && tid < rows * head_dim)
#pragma unroll
            for (int k = 0; k < MODEL_ATT_COMBINE_EARLY; k++)
                if (k < n_active) pre[k] = __ldcg(&acc_e[(size_t)k * head_dim]);
        float *sm = sc, *sl = sc + rows * n_active;
        for (int i = tid; i < rows * n_active; i += blockDim.x) {
            const int r = i / n_active;
            const float *ml = part_ml + (size_t)token_of(r) * parts * 2 +
                              ((size_t)(kvh * kv_mul + head_of(r)) * n_splits + i % n_active) * 2;
            const float2 v = __ldcg(reinterpret_cast<const float2 *>(ml));
            sm[i] = v.x;
            sl[i] = v.y;
        }
        __syncthreads();
        if (wid < rows) {
            float M = -INFINITY, den = 0.0f;
            for (int s2 = lane; s2 < n_active; s2 += WARP_SIZE) M = fmaxf(M, sm[wid * n_active + s2]);
#pragma unroll
            for (int o = WARP_SIZE / 2; o > 0; o /= 2) M = fmaxf(M, __shfl_xor_sync(0xFFFFFFFFu, M, o));
            for (int s2 = lane; s2 < n_active; s2 += WARP_SIZE) den += __expf(sm[wid * n_active + s2] - M) * sl[wid * n_active + s2];
            den = warp_sum(den);
            __syncwarp();
            for (int s2 = lane; s2 < n_active; s2 += WARP_SIZE) sm[wid * n_active + s2] = __expf(sm[wid * n_active + s2] - M) / den;
        }
        __syncthreads();
        if (early) {
            if (tid < rows * head_dim) {
                const int hl = tid / head_dim;
                float num = 0.0f;
#pragma unroll
                for (int k = 0; k < MODEL_ATT_COMBINE_EARLY; k++)
                    if (k < n_active) num += sm[hl * n_active + k] * pre[k];
                for (int s2 = MODEL_ATT_COMBINE_EARLY; s2 < n_active; s2++) num += sm[hl * n_active + s2] * __ldcg(&acc_e[(size_t)s2 * head_dim]);
                out[token_of(hl) * q_stride + (kvh * kv_mul + head_of(hl)) * head_dim + tid % head_dim] = num;
            }
        } else if (wide) {
            /* 4 dims a thread (float4 loads), a group's splits shared by `per` adjacent lanes (a power of
             * two up to the threads a group leaves), each loading its splits ATT_COMBINE_LOADS at a time,
             * the lanes' sums added by shuffles in a fixed order: on the 7B shape at depth two rounds of
             * loads a thread instead of six */
            const int groups = rows * head_dim / 4;
            int per = 1;
            while (per * 2 * groups <= (int)blockDim.x && per * 2 <= WARP_SIZE) per *= 2;
            for (int base = 0; base < groups * per; base += blockDim.x) { /* the same trips in every thread */
                const int gi = (base + tid) / per, part = (base + tid) % per;
                const bool active = gi < groups;
                const int hl = active ? gi / (head_dim / 4) : 0, d4 = gi % (head_dim / 4);
                const int t = token_of(hl), h = kvh * kv_mul + head_of(hl);
                const float4 *acc_h = reinterpret_cast<const float4 *>(part_acc + (size_t)t * parts * head_dim +
                                                                       (size_t)h * n_splits * head_dim) + d4;
                float4 num = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                for (int s0 = part; s0 < n_active; s0 += per * ATT_COMBINE_LOADS) {
                    float4 a[ATT_COMBINE_LOADS];
#pragma unroll
                    for (int k = 0; k < ATT_COMBINE_LOADS; k++)
                        if (active && s0 + k * per < n_active) a[k] = __ldcg(acc_h + (size_t)(s0 + k * per) * (head_dim / 4));
#pragma unroll
                    for (int k = 0; k < ATT_COMBINE_LOADS; k++)
                        if (active && s0 + k * per < n_active) {
                            const float w = sm[hl * n_active + s0 + k * per];
                            num.x += w * a[k].x, num.y += w * a[k].y, num.z += w * a[k].z, num.w += w * a[k].w;
                        }
                }
                for (int o = 1; o < per; o *= 2) {
                    num.x += __shfl_xor_sync(0xFFFFFFFFu, num.x, o);
                    num.y += __shfl_xor_sync(0xFFFFFFFFu, num.y, o);
                    num.z += __shfl_xor_sync(0xFFFFFFFFu, num.z, o);
                    num.w += __shfl_xor_sync(0xFFFFFFFFu, num.w, o);
                }
                if (active && part == 0) *reinterpret_cast<float4 *>(out + t * q_stride + h * head_dim + 4 * d4) = num;
            }
        } else {
            for (int i = tid; i < rows * head_dim; i += blockDim.x) {
                const int hl = i / head_dim, t = token_of(hl), h = kvh * kv_mul + head_of(hl), dd = i % head_dim;
                const float *acc_h = part_acc + (size_t)t * parts * head_dim + (size_t)h * n_splits * head_dim + dd;
                float num = 0.0f;
                for (int s0 = 0; s0 < n_active; s0 += ATT_COMBINE_VEC) {
                    float a[ATT_COMBINE_VEC];
#pragma unroll
                    for (int k = 0; k < ATT_COMBINE_VEC; k++)
                        if (s0 + k < n_active) a[k] = __ldcg(&acc_h[(size_t)(s0 + k) * head_dim]);
#pragma unroll
                    for (int k = 0; k < ATT_COMBINE_VEC; k++)
                        if (s0 + k < n_active) num += sm[hl * n_active + s0 + k] * a[k];
                }
                out[t * q_stride + h * head_dim + dd] = num;
            }
        }
    }
    if (tid == 0) counters[kvh] = 0;
    signal_done(ready);
}

/* A warp's sums of the values' products (mma_value_tile's o) into red, (warps, rows, HD): lane
 * (g, cq) holds rows 2 cq + i % 2 at dims mma_value_dim(t + MT (i / 2), g). */
template <int HD>
__device__ __forceinline__ void mma_store_sums(float *red, const float (&o)[HD / 16][4], int wid, int rows, int g, int cq) {
    constexpr int MT = HD / 16;
#pragma unroll
    for (int t = 0; t < MT; t++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = 2 * cq + i % 2, dim = mma_value_dim(t + MT * (i / 2), g);
            if (r < rows) red[(wid * rows + r) * HD + dim] = o[t][i];
        }
}

/* TOKENS > 1 (a prefill batch): the block takes TOKENS tokens of the batch, from token `ahead` on
 * (io[IO_COUNT] of them are the batch's), over the same positions, as TOKENS * kv_mul rows of
 * queries (row r: token r / kv_mul, query head r % kv_mul of the group), so the keys and values
 * are read once for all of them. A row scores the positions past its token's as -inf. A token's
 * query, output and partial sums are q_stride floats and `parts` (n_heads * n_splits) splits
 * after the previous token's; one counter for the group's KV head. */
template <int TOKENS, typename Wait, int MMA_HD = 0>
__device__ __forceinline__ void attention_body(const float *q, const uint16_t *kc, const uint16_t *vc, const int *io,
                                               int ahead, float *part_acc, float *part_ml, unsigned *counters, float *out,
                                               int head_dim, int kv_mul, int ctx, int n_splits,
                                               int min_splits, int kvh, int split, unsigned *ready, Wait wait,
                                               int q_stride = 0, size_t parts = 0) {
    static_assert(TOKENS >= 1 && TOKENS <= MODEL_ATT_MAX_GROUP, "attention rows: TOKENS * kv_mul <= MODEL_ATT_MAX_GROUP");
    extern __shared__ float smem[];
    const int rows = TOKENS * kv_mul;             /* rows of queries; TOKENS == 1: the group's heads */
    float *sc = smem;                             /* (rows, ATT_TILE) scores, then probabilities */
    float *sml = sc + ATT_SC_FLOATS(rows, head_dim); /* (rows, 2) max and sum */
    const int tid = threadIdx.x, lane = tid % WARP_SIZE, wid = tid / WARP_SIZE;
    /* row r's token (from `ahead`) and query head in the group */
    auto token_of = [&](int r) { return TOKENS == 1 ? 0 : r / kv_mul; };
    auto head_of = [&](int r) { return TOKENS == 1 ? r : r % kv_mul; };
    /* Positions [0, n) in chunks of at least ATT_MIN_CHUNK (a prompt's: PREFILL_MIN_CHUNK): a short
     * context keeps few blocks busy and the combine short; blocks past the last chunk have nothing
     * to do. The position is read before the wait, from L2: the previous step wrote it, or the host
     * before this step began. This block's query is `ahead` positions after it (a prefill batch's
     * later tokens; 0 in decode), and positions from io[IO_POS] on are written in this step. */
    int tokens = 1; /* the block's tokens that are the batch's: positions up to the last one's are written */
    if constexpr (TOKENS > 1) tokens = min(TOKENS, __ldcg(&io[IO_COUNT]) - ahead);
    const int first_new = __ldcg(&io[IO_POS]), n = first_new + ahead + tokens;
    const int chunk = att_split_len(n, n_splits, min_splits, TOKENS > 1), n_active = (n + chunk - 1) / chunk;
    if (split >= n_active) return;
    const int start = split * chunk, len = min(n, start + chunk) - start;
    const float scale = rsqrtf((float)head_dim);
    TRACE_BEGIN(ST_ATT);
    /* the fp32 path: thread (c, slice) takes chunk c (8 dims) of positions slice, slice + slices, ... */
    const int chunks = head_dim / 8, slices = blockDim.x / chunks, c = tid % chunks, slice = tid / chunks;
    const size_t vstride = head_dim / 8; /* uint4s from one position to the next */
    const uint4 *kbase = reinterpret_cast<const uint4 *>(kc + kv_at(start, kvh, ctx, head_dim)) + c;
    const uint4 *vbase = reinterpret_cast<const uint4 *>(vc + kv_at(start, kvh, ctx, head_dim)) + c;
    float *red = sc; /* (warps, rows, head_dim): the warps' sums of the weighted values, after them */
    if constexpr (TOKENS == 1 && MMA_HD > 0) {
        static_assert(MMA_HD == 64 || MMA_HD == 128, "attention on the tensor cores: heads of 64 or 128");
        constexpr int HD = MMA_HD, KCH = HD / 32, U = att_mma_tiles(MMA_HD), WARPS = MODEL_ATT_THREADS / WARP_SIZE;
        const int g = lane / 4, cq = lane % 4, n_tiles = (len + 15) / 16;
        const uint4 *kb = reinterpret_cast<const uint4 *>(kc + kv_at(start, kvh, ctx, HD));
        const uint4 *vb = reinterpret_cast<const uint4 *>(vc + kv_at(start, kvh, ctx, HD));
        /* keys of positions 16 tile + g + 8 h, this lane's uint4 of chunk ch: uint4 4 ch + cq of the row */
        typedef uint4 key_regs[U][2][KCH];
        auto load_keys = [&](key_regs &kr, int round, bool before_wait) {
#pragma unroll
            for (int k = 0; k < U; k++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int j = 16 * (wid + WARPS * (round * U + k)) + g + 8 * h;
                    /* before the wait: the cached positions; after it, in round 0, the ones this step wrote */
                    const bool want = j < len && (round > 0 || (start + j < first_new) == before_wait);
#pragma unroll
                    for (int ch = 0; ch < KCH; ch++)
                        if (want) kr[k][h][ch] = __ldcg(kb + (size_t)j * (HD / 8) + 4 * ch + cq);
                        else if (round > 0 || before_wait) kr[k][h][ch] = make_uint4(0, 0, 0, 0);
                }
        };
        /* query row g's dims 32 ch + 8 cq .. + 7 as hi and lo fp16 pairs (rows past the group's: 0),
         * word w of chunk ch of each lane at qf[(8 ch + w) * 32 + lane]: written by warp ch, read by
         * every warp's same lane (in registers they took the 7B shape past 128) */
        uint32_t *qf = reinterpret_cast<uint32_t *>(sml + 2 * rows);
        uint4 *vs = att_value_stage<HD>(sml, rows) + (size_t)wid * U * 16 * (HD / 8); /* this warp's staged tiles */
        auto stage_values = [&](bool before_wait) {
#pragma unroll
            for (int k = 0; k < U; k++) {
                const int tile = wid + WARPS * k;
                if (tile >= n_tiles) break;
#pragma unroll
                for (int m = 0; m < 16 * (HD / 8) / WARP_SIZE; m++) {
                    const int e = lane + WARP_SIZE * m, p = e / (HD / 8), ch = e % (HD / 8), j = 16 * tile + p;
                    /* zeros past len, before the wait; the cached positions before it (mode 2: after
                     * it too), this step's after */
                    if (j < len ? (MODEL_ATT_STAGE_VALUES == 1 && start + j < first_new) == before_wait : before_wait)
                        cp_async16(vs + (k * 16 + p) * (HD / 8) + stage_chunk(ch, p), vb + (size_t)min(j, len - 1) * (HD / 8) + ch,
                                   j < len);
                }
            }
        };
        key_regs ka, kn; /* this round's keys, the next round's where pipelined */
        load_keys(ka, 0, true);
        const bool staged = MODEL_ATT_STAGE_VALUES && n_active <= ATT_STAGE_MAX_SPLITS;
        if (staged) stage_values(true);
        TRACE_AT(TRACE_READY);
        wait();
        TRACE_AT(TRACE_WAITED);
        load_keys(ka, 0, false);
        if (staged) stage_values(false);
        if (wid < KCH) mma_query_operands<HD>(qf, q, kvh * kv_mul, rows, wid, lane);
        __syncthreads();
        auto has_round = [&](int round) { return wid + WARPS * round * U < n_tiles; }; /* the warp's */
        auto score_round = [&](const key_regs &kr, int round) {
#pragma unroll
            for (int k = 0; k < U; k++) {
                const int tile = wid + WARPS * (round * U + k);
                if (tile >= n_tiles) break;
                float s[4] = {0.0f, 0.0f, 0.0f, 0.0f}; /* (position g, rows 2 cq, 2 cq + 1), (g + 8, ...) */
                mma_score_tile<KCH>(s, kr[k][0], kr[k][1], qf, lane);
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int j = 16 * tile + g + 8 * (i / 2), r = 2 * cq + i % 2;
                    if (r < rows && j < len) sc[r * ATT_TILE + j] = s[i] * scale;
                }
            }
        };
        if constexpr (att_mma_pipe_keys()) {
            /* two rounds a trip: the next round's loads in flight while this one multiplies */
            for (int round = 0; has_round(round); round += 2) {
                if (has_round(round + 1)) load_keys(kn, round + 1, false);
                score_round(ka, round);
                if (!has_round(round + 1)) break;
                if (has_round(round + 2)) load_keys(ka, round + 2, false);
                score_round(kn, round + 1);
            }
        } else {
            for (int round = 0; has_round(round); round++) {
                if (round > 0) load_keys(ka, round, false);
                score_round(ka, round);
            }
        }
    } else {
        /* Thread (c, slice)'s first round of keys (positions slice + k * slices) before the wait: every
         * position before first_new is in the cache already; the ones the QKV kernel writes in this step
         * are read after the wait. Every cache load bypasses L1 (ld.cg), so a line
         * read before the wait never answers a read after it. (Values too before the wait: +0.8% at
         * depth 0, -0.6% at 16384, on both shapes.) */
        uint4 k0[ATT_UNROLL];
    #pragma unroll
        for (int k = 0; k < ATT_UNROLL; k++) {
            const int j = slice + k * slices;
            k0[k] = j < len && start + j < first_new ? __ldcg(kbase + (size_t)j * vstride) : make_uint4(0, 0, 0, 0);
        }
        TRACE_AT(TRACE_READY);
        wait();
        TRACE_AT(TRACE_WAITED);
    #pragma unroll
        for (int k = 0; k < ATT_UNROLL; k++) {
            const int j = slice + k * slices;
            if (j < len && start + j >= first_new) k0[k] = __ldcg(kbase + (size_t)j * vstride);
        }

        /* scores: thread (c, slice) takes chunk c (8 dims) of the keys of positions slice, slice +
         * slices, ..., as the value pass below, its query chunks in registers: a warp's loads cover
         * whole lines (against a thread per position, 32 lines a load: +1.6% on the 7B shape at depth
         * 16384, PERFORMANCE.md). A position's `chunks` lanes meet in a shuffle; the loop runs the same
         * trips in every lane, so the shuffles are whole-warp. */
        {
            float qc[MODEL_ATT_MAX_GROUP][8];
    #pragma unroll
            for (int h = 0; h < MODEL_ATT_MAX_GROUP; h++)
                if (h < rows) {
                    const float4 *qh = reinterpret_cast<const float4 *>(q + (size_t)token_of(h) * q_stride +
                                                                        (kvh * kv_mul + head_of(h)) * head_dim + 8 * c);
                    const float4 a = qh[0], b = qh[1];
                    qc[h][0] = a.x, qc[h][1] = a.y, qc[h][2] = a.z, qc[h][3] = a.w;
                    qc[h][4] = b.x, qc[h][5] = b.y, qc[h][6] = b.z, qc[h][7] = b.w;
                }
            for (int jb = 0; jb < len; jb += ATT_UNROLL * slices) {
                uint4 u[ATT_UNROLL];
    #pragma unroll
                for (int k = 0; k < ATT_UNROLL; k++) {
                    const int j = jb + slice + k * slices;
                    u[k] = jb == 0 ? k0[k] : j < len ? __ldcg(kbase + (size_t)j * vstride) : make_uint4(0, 0, 0, 0);
                }
    #pragma unroll
                for (int k = 0; k < ATT_UNROLL; k++) {
                    const int j = jb + slice + k * slices;
                    float kf[8];
                    h8_to_f32(u[k], kf);
    #pragma unroll
                    for (int h = 0; h < MODEL_ATT_MAX_GROUP; h++)
                        if (h < rows) {
                            float d = 0.0f;
    #pragma unroll
                            for (int i = 0; i < 8; i++) d += kf[i] * qc[h][i];
                            for (int o = 1; o < chunks; o *= 2) d += __shfl_xor_sync(0xFFFFFFFFu, d, o);
                            /* a row sees the positions up to its token's own */
                            const bool seen = TOKENS == 1 || start + j <= first_new + ahead + token_of(h);
                            if (c == 0 && j < len) sc[h * ATT_TILE + j] = seen ? d * scale : -INFINITY;
                        }
                }
            }
        }
    }
    __syncthreads();
    TRACE_AT(TRACE_STAGED); /* the scores */

    /* softmax pieces per row: warp h finds the max, exponentiates, sums (a row that sees none of
     * these positions, TOKENS > 1 only: max -inf, probabilities and sum 0, weight 0 in the combine) */
    if (wid < rows) {
        float *row = sc + wid * ATT_TILE, m = -INFINITY, l = 0.0f;
        for (int j = lane; j < len; j += WARP_SIZE) m = fmaxf(m, row[j]);
#pragma unroll
        for (int o = WARP_SIZE / 2; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
        const float shift = TOKENS > 1 && m == -INFINITY ? 0.0f : m;
        for (int j = lane; j < len; j += WARP_SIZE) {
            float p = __expf(row[j] - shift);
            row[j] = p;
            l += p;
        }
        l = warp_sum(l);
        if (lane == 0) { sml[2 * wid] = m; sml[2 * wid + 1] = l; }
    }
    __syncthreads();

    if constexpr (TOKENS == 1 && MMA_HD > 0) {
        constexpr int HD = MMA_HD, MT = HD / 16, VU = HD / 64, U = att_mma_tiles(MMA_HD), WARPS = MODEL_ATT_THREADS / WARP_SIZE;
        const int g = lane / 4, cq = lane % 4, n_tiles = (len + 15) / 16;
        const uint4 *vb = reinterpret_cast<const uint4 *>(vc + kv_at(start, kvh, ctx, HD));
        /* O^T for this lane: m-tile t's rows g (d' = t) and g + 8 (d' = t + MT), query rows 2 cq, 2 cq + 1 */
        float o[MT][4];
#pragma unroll
        for (int t = 0; t < MT; t++) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
        /* positions 16 tile + 4 cq + i, this lane's uint4s 8 u + g of each value row */
        typedef uint4 value_regs[U][4][VU];
        const uint4 *vs = att_value_stage<HD>(sml, rows) + (size_t)wid * U * 16 * (HD / 8); /* round 0's, if staged */
        auto load_values = [&](value_regs &vr, int round) {
            if (MODEL_ATT_STAGE_VALUES && n_active <= ATT_STAGE_MAX_SPLITS && round == 0) { /* staged with the keys */
                cp_async_wait_all();
                __syncwarp();
#pragma unroll
                for (int k = 0; k < U; k++)
#pragma unroll
                    for (int i = 0; i < 4; i++)
#pragma unroll
                        for (int u = 0; u < VU; u++) {
                            const int p = 4 * cq + i;
                            vr[k][i][u] = vs[(k * 16 + p) * (HD / 8) + stage_chunk(8 * u + g, p)];
                        }
                return;
            }
#pragma unroll
            for (int k = 0; k < U; k++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int j = 16 * (wid + WARPS * (round * U + k)) + 4 * cq + i;
#pragma unroll
                    for (int u = 0; u < VU; u++)
                        vr[k][i][u] = j < len ? __ldcg(vb + (size_t)j * (HD / 8) + 8 * u + g) : make_uint4(0, 0, 0, 0);
                }
        };
        auto value_round = [&](const value_regs &vr, int round) {
#pragma unroll
            for (int k = 0; k < U; k++) {
                const int tile = wid + WARPS * (round * U + k);
                if (tile >= n_tiles) break;
                /* B: query row g's probabilities at the lane's 4 positions (0 past len and past the group) */
                const int j = 16 * tile + 4 * cq;
                float4 p = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (g < rows) p = *reinterpret_cast<const float4 *>(sc + g * ATT_TILE + j);
                if (j + 0 >= len) p.x = 0.0f;
                if (j + 1 >= len) p.y = 0.0f;
                if (j + 2 >= len) p.z = 0.0f;
                if (j + 3 >= len) p.w = 0.0f;
                mma_value_tile<HD>(o, vr[k], p);
            }
        };
        auto has_round = [&](int round) { return wid + WARPS * round * U < n_tiles; };
        value_regs va, vn;
        if constexpr (att_mma_pipe_values(MMA_HD)) {
            if (has_round(0)) load_values(va, 0);
            for (int round = 0; has_round(round); round += 2) {
                if (has_round(round + 1)) load_values(vn, round + 1);
                value_round(va, round);
                if (!has_round(round + 1)) break;
                if (has_round(round + 2)) load_values(va, round + 2);
                value_round(vn, round + 1);
            }
        } else {
            for (int round = 0; has_round(round); round++) {
                load_values(va, round);
                value_round(va, round);
            }
        }
        TRACE_END(); /* its loads are in; the combine comes after */
#if defined(INGOT_TRACE) && TRACE_ATT == 6 /* the products done: their sums an input of the stamp's asm */
#pragma unroll
        for (int t = 0; t < MT; t++) asm volatile("" ::"f"(o[t][0]), "f"(o[t][1]), "f"(o[t][2]), "f"(o[t][3]));
#endif
        __syncthreads(); /* sc is reused below for the warps' sums */
        mma_store_sums<HD>(red, o, wid, rows, g, cq);
    } else {
        /* weighted values: thread (c, slice) takes 8 dims (chunk c of a value row) of positions slice,
         * slice + slices, ..., ATT_UNROLL positions' loads in flight at once. The slices' sums are
         * reduced in a fixed order (shuffles within a warp, then warps in order), so results do not vary
         * run to run. */
        float acc[MODEL_ATT_MAX_GROUP][8];
    #pragma unroll
        for (int h = 0; h < MODEL_ATT_MAX_GROUP; h++)
    #pragma unroll
            for (int i = 0; i < 8; i++) acc[h][i] = 0.0f;
        for (int j0 = slice; j0 < len; j0 += ATT_UNROLL * slices) {
            uint4 u[ATT_UNROLL];
    #pragma unroll
            for (int k = 0; k < ATT_UNROLL; k++)
                if (j0 + k * slices < len) u[k] = __ldcg(vbase + (size_t)(j0 + k * slices) * vstride);
    #pragma unroll
            for (int k = 0; k < ATT_UNROLL; k++) {
                int j = j0 + k * slices;
                if (j < len) {
                    float v[8];
                    h8_to_f32(u[k], v);
    #pragma unroll
                    for (int h = 0; h < MODEL_ATT_MAX_GROUP; h++)
                        if (h < rows) {
                            float p = sc[h * ATT_TILE + j];
    #pragma unroll
                            for (int i = 0; i < 8; i++) acc[h][i] += p * v[i];
                        }
                }
            }
        }
        TRACE_END(); /* its loads are in; the combine comes after */
        __syncthreads(); /* sc is reused below for the warps' sums */
    #pragma unroll
        for (int h = 0; h < MODEL_ATT_MAX_GROUP; h++)
            if (h < rows)
    #pragma unroll
                for (int i = 0; i < 8; i++) {
                    float v = acc[h][i];
                    for (int o = chunks; o < WARP_SIZE; o *= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
                    if (lane < chunks) red[(wid * rows + h) * head_dim + 8 * c + i] = v;
                }
    }
    __syncthreads();
    for (int i = tid; i < rows * head_dim; i += blockDim.x) {
        float v = 0.0f;
        for (int w = 0; w < (int)blockDim.x / WARP_SIZE; w++) v += red[w * rows * head_dim + i];
        const int r = i / head_dim, t = token_of(r), h = kvh * kv_mul + head_of(r);
        if (n_active == 1) /* one split: done */
            out[t * q_stride + h * head_dim + i % head_dim] = v / sml[2 * r + 1];
        else
            part_acc[(size_t)t * parts * head_dim + ((size_t)h * n_splits + split) * head_dim + i % head_dim] = v;
    }
    if (n_active == 1) {
        signal_done(ready);
        return;
    }
    if (tid < rows) {
        const int h = kvh * kv_mul + head_of(tid);
        float *ml = part_ml + (size_t)token_of(tid) * parts * 2 + ((size_t)h * n_splits + split) * 2;
        ml[0] = sml[2 * tid];
        ml[1] = sml[2 * tid + 1];
    }
    attention_combine<TOKENS>(sc, part_acc, part_ml, counters, out, head_dim, kv_mul, n_splits, n_active, kvh, ready, q_stride,
                              parts);
}

// ---------------------------------------------------------------------------------------------
// The decode attention at a short context (MODEL_ATT_SHORT, the plan's where the tensor-core path runs):
// one block a (KV head, split) of at most att_short_max(HD) positions (one round of tiles a warp:
// 128 on heads of 128, 256 on heads of 64), flash-decoding within the block. The splits are
// attention_body's (att_split_len); where there is more than one, each stores its partial sums and
// the last combines them (attention_combine). The block that writes a KV group's outputs adds 1 to
// *ready when given one (the joined attention/o_proj grid, MODEL_ATT_O_SHORT). The host launches it in one split up to att_short_max(HD) positions, and on heads
// of 64, whose 256 is ATT_MIN_CHUNK, in MODEL_ATT_MIN_SPLITS up to 33 x 256 (forward_cuda.cu,
// short_kernel_splits). At depth 0 attention_body's chain after its wait is 4.2 us on the 7B shape
// for almost no work: five block barriers, the softmax through shared memory a row a warp, the
// values loaded after it (one more L2 round trip), the sums' stores in 4-way bank conflicts
// (PERFORMANCE.md, twenty-first session). Here:
// - each warp loads its tiles' keys and values together, the cached positions' before the wait;
// - scores as attention_body's (S^T = K Q^T on the tensor cores), then each warp's softmax in its
//   registers: a row's max and sum over the warp's positions in 3 shuffles each;
// - the probabilities through the warp's own columns of shared memory (a warp barrier) into the
//   values' products, O^T = V^T P^T as attention_body's;
// - the warps that took a tile store their (max, sum) and unscaled sums, one block barrier, and
//   each output weighs those warps' sums by exp(their max - the largest).
// So two round trips fewer for nothing but the values, and four block barriers. Against
// attention_body: 1B +2.2%, 7B +1.1%, SmolLM2 +11.6% at depth 0; the 1B +1.8% at 1024 and +0.4% at
// 4096, where the splits' combine takes most of what they save (PERFORMANCE.md, twenty-second
// session).
__host__ __device__ constexpr int att_short_max(int hd) { return MODEL_ATT_THREADS / WARP_SIZE * att_mma_tiles(hd) * 16; }
/* Shared memory of attention_short_body: the probabilities, the warps' sums, each warp's (max, sum),
 * the query operands */
#define ATT_SHORT_SMEM_BYTES(kv_mul, hd) \
    (((size_t)(kv_mul) * (att_short_max(hd) + (MODEL_ATT_THREADS / WARP_SIZE) * ((hd) + 2)) + ATT_QFRAG_WORDS(hd)) * sizeof(float))

template <int HD, typename Wait>
__device__ __forceinline__ void attention_short_body(const float *q, const uint16_t *kc, const uint16_t *vc, const int *io,
                                                     float *part_acc, float *part_ml, unsigned *counters, float *out,
                                                     int kv_mul, int ctx, int n_splits, int min_splits, int kvh, int split,
                                                     Wait wait, unsigned *ready = nullptr) {
    constexpr int KCH = HD / 32, MT = HD / 16, VU = HD / 64, U = att_mma_tiles(HD), WARPS = MODEL_ATT_THREADS / WARP_SIZE;
    extern __shared__ float smem[];
    const int rows = kv_mul;
    constexpr int SP = att_short_max(HD);
    float *sp = smem;                                  /* (rows, SP): probabilities */
    float *red = sp + rows * SP;                       /* (WARPS, rows, HD): the warps' sums */
    float *wml = red + WARPS * rows * HD;              /* (WARPS, rows, 2): each warp's max and sum */
    uint32_t *qf = reinterpret_cast<uint32_t *>(wml + WARPS * rows * 2); /* query operands, as attention_body's */
    const int tid = threadIdx.x, lane = tid % WARP_SIZE, wid = tid / WARP_SIZE, g = lane / 4, cq = lane % 4;
    /* positions [start, start + len) of n, split as attention_body's: the host launches this kernel
     * only where a split takes at most SP positions */
    const int first_new = __ldcg(&io[IO_POS]), n = first_new + 1;
    const int chunk = att_split_len(n, n_splits, min_splits, false), n_active = (n + chunk - 1) / chunk;
    if (split >= n_active) return;
    const int start = split * chunk, len = min(n, start + chunk) - start, n_tiles = (len + 15) / 16;
    if (len > SP) __trap();
    TRACE_BEGIN(ST_ATT);
    const uint4 *kb = reinterpret_cast<const uint4 *>(kc + kv_at(start, kvh, ctx, HD));
    const uint4 *vb = reinterpret_cast<const uint4 *>(vc + kv_at(start, kvh, ctx, HD));
    /* tile wid + WARPS k: keys of positions 16 tile + g + 8 h (uint4 4 ch + cq of each), values of
     * 16 tile + 4 cq + i (uint4s 8 u + g); zeros past len */
    uint4 kr[U][2][KCH], vr[U][4][VU];
    auto load = [&](bool before_wait) { /* before the wait the cached positions, after it this step's */
#pragma unroll
        for (int k = 0; k < U; k++) {
            const int tile = wid + WARPS * k;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int j = 16 * tile + g + 8 * h;
                const bool want = j < len && (start + j < first_new) == before_wait;
#pragma unroll
                for (int ch = 0; ch < KCH; ch++)
                    if (want) kr[k][h][ch] = __ldcg(kb + (size_t)j * (HD / 8) + 4 * ch + cq);
                    else if (before_wait) kr[k][h][ch] = make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int j = 16 * tile + 4 * cq + i;
                const bool want = j < len && (start + j < first_new) == before_wait;
#pragma unroll
                for (int u = 0; u < VU; u++)
                    if (want) vr[k][i][u] = __ldcg(vb + (size_t)j * (HD / 8) + 8 * u + g);
                    else if (before_wait) vr[k][i][u] = make_uint4(0, 0, 0, 0);
            }
        }
    };
    load(true);
    TRACE_AT(TRACE_READY);
    wait();
    TRACE_AT(TRACE_WAITED);
    load(false);
    if (wid < KCH) mma_query_operands<HD>(qf, q, kvh * kv_mul, rows, wid, lane);
    __syncthreads();
    /* scores: s[k] holds (position g, rows 2 cq, 2 cq + 1), (g + 8, the same) of tile k; -inf past n.
     * m[e], l[e]: row 2 cq + e's max and sum over the warp's positions */
    const float scale = rsqrtf((float)HD);
    float s[U][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < U; k++) {
        const int tile = wid + WARPS * k;
        s[k][0] = s[k][1] = s[k][2] = s[k][3] = 0.0f;
        if (tile < n_tiles) mma_score_tile<KCH>(s[k], kr[k][0], kr[k][1], qf, lane);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int j = 16 * tile + g + 8 * (i / 2);
            s[k][i] = j < len ? s[k][i] * scale : -INFINITY;
            m[i % 2] = fmaxf(m[i % 2], s[k][i]);
        }
    }
#pragma unroll
    for (int o = 4; o < WARP_SIZE; o *= 2) { /* over g: the lanes of a cq */
        m[0] = fmaxf(m[0], __shfl_xor_sync(0xFFFFFFFFu, m[0], o));
        m[1] = fmaxf(m[1], __shfl_xor_sync(0xFFFFFFFFu, m[1], o));
    }
#pragma unroll
    for (int k = 0; k < U; k++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float p = s[k][i] == -INFINITY ? 0.0f : __expf(s[k][i] - m[i % 2]);
            l[i % 2] += p;
            const int tile = wid + WARPS * k, j = 16 * tile + g + 8 * (i / 2), r = 2 * cq + i % 2;
            if (r < rows && tile < n_tiles) sp[r * SP + j] = p; /* the warp's own columns; 0 past len */
        }
#pragma unroll
    for (int o = 4; o < WARP_SIZE; o *= 2) {
        l[0] += __shfl_xor_sync(0xFFFFFFFFu, l[0], o);
        l[1] += __shfl_xor_sync(0xFFFFFFFFu, l[1], o);
    }
    TRACE_AT(TRACE_STAGED);
    __syncwarp();
    float o[MT][4];
#pragma unroll
    for (int t = 0; t < MT; t++) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
#pragma unroll
    for (int k = 0; k < U; k++) {
        const int tile = wid + WARPS * k;
        if (tile >= n_tiles) break;
        float4 p = make_float4(0.0f, 0.0f, 0.0f, 0.0f); /* row g's probabilities at positions 4 cq .. + 3 */
        if (g < rows) p = *reinterpret_cast<const float4 *>(sp + g * SP + 16 * tile + 4 * cq);
        mma_value_tile<HD>(o, vr[k], p);
    }
    /* the warps that took a tile: their (max, sum) and unscaled sums, each in its own space, so one
     * barrier; then each output weighs those warps' sums by exp(m - M), M their max */
    const int warps = min(WARPS, n_tiles);
    if (wid < warps) {
        if (g == 0)
#pragma unroll
            for (int e = 0; e < 2; e++)
                if (2 * cq + e < rows) {
                    wml[(wid * rows + 2 * cq + e) * 2] = m[e];
                    wml[(wid * rows + 2 * cq + e) * 2 + 1] = l[e];
                }
        mma_store_sums<HD>(red, o, wid, rows, g, cq);
    }
    TRACE_END();
    __syncthreads();
    for (int i = tid; i < rows * HD; i += MODEL_ATT_THREADS) {
        const int r = i / HD;
        float M = -INFINITY, L = 0.0f, v = 0.0f;
#pragma unroll
        for (int u = 0; u < WARPS; u++)
            if (u < warps) M = fmaxf(M, wml[(u * rows + r) * 2]);
#pragma unroll
        for (int u = 0; u < WARPS; u++)
            if (u < warps) { /* every such warp saw a position: its max is finite */
                const float e = __expf(wml[(u * rows + r) * 2] - M);
                L += wml[(u * rows + r) * 2 + 1] * e;
                v += red[u * rows * HD + i] * e;
            }
        const int h = kvh * kv_mul + r;
        if (n_active == 1) {
            out[(size_t)h * HD + i % HD] = v / L;
        } else { /* the split's partial sums and (max, sum), as attention_body's */
            part_acc[((size_t)h * n_splits + split) * HD + i % HD] = v;
            if (i % HD == 0) *reinterpret_cast<float2 *>(part_ml + ((size_t)h * n_splits + split) * 2) = make_float2(M, L);
        }
    }
    if (n_active > 1)
        attention_combine<1>(sp, part_acc, part_ml, counters, out, HD, kv_mul, n_splits, n_active, kvh, ready, 0, 0);
    if (ready && n_active == 1) signal_done(ready); /* the joined grid's o_proj counts the outputs written */
}

#endif
