/* cuda_matvec.cuh - the decode step's matrix-vector stages: the matvec core, the staging of a
 * stage's input in shared memory, and the stage bodies built on them (embedding, RMSNorm + QKV +
 * RoPE + KV-cache store, o_proj and down with the residual add, RMSNorm + gate/up + SiLU, final
 * norm + LM head + greedy choice, the step's end).
 *
 * The shape of every matvec: a warp per output row (a block of MODEL_MV_WARPS warps, rows striding
 * over the grid), 16-byte weight loads (a chunk of W::VALS weights of the format W, cuda_weights.cuh:
 * 8 bf16/fp16 values), all of a lane's loads for a row issued
 * before the first is used, fp32 accumulation, a warp shuffle reduction. Weights do not depend on
 * the previous kernel, so each warp loads its first row before waiting for the previous kernel to
 * finish (programmatic dependent launch, sm_90): the next kernel's weight stream overlaps the tail
 * of the current one. Dimensions reach the bodies as int parameters that are literals at every call
 * in a specialized build, so after inlining every loop has a constant trip count and the register
 * arrays have constant indices; the generic build passes run-time values to the same code. The core
 * and the bodies take the weight format as their first template parameter; forward_cuda.cu passes
 * the model's (model_w). */
#ifndef INGOT_CUDA_MATVEC_CUH
#define INGOT_CUDA_MATVEC_CUH

#include "cuda_common.cuh"
#include "cuda_trace.cuh"
#include "cuda_weights.cuh"

#define MV_THREADS (MODEL_MV_WARPS * WARP_SIZE)
/* The same in the paired norm'd kernels (QKV, gate/up: two rows a warp). The generated code sets it
 * from the plan (codegen/plan.py, _pair_unroll: 4 up to a hidden size of 2048, where fewer bytes in
 * flight when the previous kernel ends let its completion and this kernel's input through sooner). */
/* Of a paired kernel's first step, the chunks a lane loads before the wait; the rest go out after
 * the wait, behind the input's loads. The loads in flight when the previous kernel ends delay its
 * completion and the input's round trip (docs/performance.md, D46). The generated code
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
 * pairs are one round, as on the 1B; docs/performance.md, D50). The same copies lost in gate/up on
 * both shapes (-0.7% to -1.8%, D50), and in o_proj and down, all of the 7B's o_proj in flight before
 * attention ends, -0.4% / -0.7% at depths 0 / 4096, or issued once attention's values were out,
 * even: removed. */
static_assert(MODEL_QKV_ASYNC >= 0, "MODEL_QKV_ASYNC: 0 or more steps");
/* In the joined grid, o_proj's first step loaded before its wait MV_RES_PACE chunks a lane at a
 * time, each lot only once the last is in, until attention's outputs are counted (0: the whole step
 * at once). Bytes in flight at a boundary delay every L2 round trip behind them: with QKV's last
 * round split (QKV_SPLIT_LAST) the joined grid lands at QKV's end, and its 17 MB of o_proj loads
 * held the 7B's attention chain back ~2 µs a layer. In two lots of 4 chunks, 7B +0.7% / +0.5% /
 * +0.1% at depths 0 / 4096 / 16384; lots of 2 +0.5% / +0.2%, of 1 -0.3% / -0.5% (docs/performance.md,
 * D52). */
#define MV_RES_PACE (MODEL_MV_UNROLL / 2)
static_assert(MV_RES_PACE >= 0 && MV_RES_PACE <= MODEL_MV_UNROLL && (MV_RES_PACE == 0 || MODEL_MV_UNROLL % (MV_RES_PACE ? MV_RES_PACE : 1) == 0),
              "MV_RES_PACE: 0, or a divisor of MODEL_MV_UNROLL");
/* QKV's last round of pairs split by K between the two warps of a warp pair (1) or not (0), where
 * its pairs take more than one round of the grid's warps and the last round's pairs are at most half
 * of them (the kernel checks, from its grid). On the 7B shapes 960 pairs are left for 2,112 warps
 * after a round; whole, they took two steps each on 960 warps of 82 SMs while the others idled.
 * Split, each of 1,920 warps on every SM takes one step, the halves meeting in shared memory: +0.4%
 * at depths 0 and 4096 (docs/performance.md, D51). */
#define QKV_SPLIT_LAST 1
/* The chunks a lane holds in flight a row step, and the lots above, by format: the plan's for the
 * dense formats' 16-byte chunks of 8 weights; for a block format, whose chunk holds its scales beside
 * 16 bytes of values and unpacks to 16 (Q8_0) or 32 weights, at most its W::IN_FLIGHT (the most that
 * compiles without spills in the residual matvec and with a row pair a warp: cuda_weights.cuh). */
template <typename W, int PLAN>
constexpr int format_unroll_of() {
    if constexpr (W::DENSE16)
        return PLAN;
    else
        return PLAN < W::IN_FLIGHT ? PLAN : W::IN_FLIGHT;
}
template <typename W, int PLAN>
constexpr int format_unroll = format_unroll_of<W, PLAN>();
template <typename W> constexpr int mv_unroll = format_unroll<W, MODEL_MV_UNROLL>;
template <typename W> constexpr int pair_unroll = format_unroll<W, MODEL_PAIR_UNROLL>;
template <typename W> constexpr int pair_early = MODEL_PAIR_EARLY < pair_unroll<W> ? MODEL_PAIR_EARLY : pair_unroll<W>;
template <typename W> constexpr int pair_lot = MODEL_PAIR_LOT < pair_early<W> ? MODEL_PAIR_LOT : pair_early<W>;
template <typename W> constexpr int res_lot = MODEL_RES_LOT < mv_unroll<W> ? MODEL_RES_LOT : mv_unroll<W>;
template <typename W> constexpr int res_pace = MV_RES_PACE ? mv_unroll<W> / 2 : 0; /* MV_RES_PACE's */

// ---------------------------------------------------------------------------------------------
// The matvec core. A block first stages its input vector in shared memory (for the norm'd inputs
// as x * norm_w / rms(x): every block computes the same sum of squares, from L2), then each warp
// takes one weight row at a time: lane l reads 16-byte chunks l, l + 32, ... (W::VALS weights each),
// mv_unroll<W> chunks in flight per step, and the warp's partial sums meet in a shuffle reduction.

/* A lane's U chunks of one step of a row: U = mv_unroll<W>, or pair_unroll<W> in the paired norm'd
 * kernels (QKV, gate/up), whose warps hold two rows. */
template <typename W, int U = mv_unroll<W>>
struct row_chunks {
    typename W::chunk v[U];
};

/* Steps of U chunks per lane that a row of K needs. */
template <typename W, int U>
__host__ __device__ constexpr int mv_steps(int K) { return (K / W::VALS + U * WARP_SIZE - 1) / (U * WARP_SIZE); }

/* Chunks u0 .. u1 - 1 of a step (load_step: all U). */
template <typename W, int U>
__device__ __forceinline__ void load_chunks(row_chunks<W, U> *r, typename W::row_t row, int K, int step, int lane, int u0, int u1) {
#pragma unroll
    for (int u = u0; u < u1; u++) {
        int c = (step * U + u) * WARP_SIZE + lane;
        if (c < K / W::VALS) r->v[u] = W::load(row, c);
    }
}

/* Chunks from .. U - 1 of a step, from known only at run time (static register indices). */
template <typename W, int U>
__device__ __forceinline__ void load_chunks_from(row_chunks<W, U> *r, typename W::row_t row, int K, int step, int lane, int from) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        int c = (step * U + u) * WARP_SIZE + lane;
        if (u >= from && c < K / W::VALS) r->v[u] = W::load(row, c);
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
 * once the last is in (the loop's exit reads the lot's data: a word 0x7FC00001 ends it sooner, an
 * impossible bf16 or fp16 pair but a possible word of a block format's values), until stop says
 * so; returns the chunks loaded, which the caller must take as what is loaded: the rest is not.
 * One lot (LOT >= u_end): all at once. */
template <int LOT, typename W, int U, typename Stop>
__device__ __forceinline__ int load_lots(row_chunks<W, U> *a, row_chunks<W, U> *b, typename W::row_t ra, typename W::row_t rb, int K, int lane,
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
        const bool odd = W::word(b ? b->v[u] : a->v[u]) == 0x7FC00001u;
        if (stop.done(seen) || __any_sync(0xFFFFFFFFu, odd)) break;
    }
    return loaded;
}

/* A paired kernel's early loads, before its wait: the first pair_early<W> chunks of rows ra and rb's
 * first step, in lots of pair_lot<W> where the plan takes them, else at once. Lots that end early
 * (load_lots) leave the rest of the early chunks to load here, at once: Q8_0's values hold the word
 * that ends them (int8 1, 0, -64, 127). Left unset, they gave the Mistral-7B shape in Q8_0 NaN logits
 * on the GPU (its first 2 layers, or 32 layers in Q4_0, were right; H100); loaded, it decodes. */
template <typename W, int U>
__device__ __forceinline__ void pair_early_loads(row_chunks<W, U> *a, row_chunks<W, U> *b, typename W::row_t ra, typename W::row_t rb, int K, int lane) {
    if (pair_lot<W> < pair_early<W>) {
        const int loaded = load_lots<pair_lot<W>>(a, b, ra, rb, K, lane, pair_early<W>, never_stop{});
#pragma unroll
        for (int u = 0; u < pair_early<W>; u++) /* static register indices; none where every lot went out */
            if (u >= loaded && u * WARP_SIZE + lane < K / W::VALS) {
                a->v[u] = W::load(ra, u * WARP_SIZE + lane);
                b->v[u] = W::load(rb, u * WARP_SIZE + lane);
            }
    } else {
        load_chunks(a, ra, K, 0, lane, 0, pair_early<W>);
        load_chunks(b, rb, K, 0, lane, 0, pair_early<W>);
    }
}

template <typename W, int U>
__device__ __forceinline__ void load_step(row_chunks<W, U> *r, typename W::row_t row, int K, int step, int lane) {
    load_chunks(r, row, K, step, lane, 0, U);
}

template <typename W, int U>
__device__ __forceinline__ float dot_step(const row_chunks<W, U> *r, const float *sx, int K, int step, int lane) {
    float acc = 0.0f;
#pragma unroll
    for (int u = 0; u < U; u++) {
        int c = (step * U + u) * WARP_SIZE + lane;
        if (c < K / W::VALS) {
            if constexpr (W::XQ) /* the chunk's inputs as stage_xq left them */
                acc += W::dot(r->v[u], xq_chunk<W::VALS>{reinterpret_cast<const uint4 *>(sx), K / W::VALS, c});
            else /* the chunk's inputs: float4 c of each plane of the staged input (sx_group) */
                acc += W::dot(r->v[u], [sx, K, c](int p) { return reinterpret_cast<const float4 *>(sx)[p * (K / W::VALS) + c]; });
        }
    }
    return acc;
}

/* row (K) . sx (K, shared memory), the first step already in *first; the warp's sum in every lane.
 * Later steps load and then multiply: other warps on the SM keep memory busy meanwhile (double
 * buffering the steps doubled the registers and halved the resident warps). */
template <typename W, int U>
__device__ __forceinline__ float row_dot(row_chunks<W, U> *first, typename W::row_t row, const float *sx, int K, int lane) {
    float acc = dot_step(first, sx, K, 0, lane);
#pragma unroll 1
    for (int step = 1; step < mv_steps<W, U>(K); step++) {
        load_step(first, row, K, step, lane);
        acc += dot_step(first, sx, K, step, lane);
    }
    return warp_sum(acc);
}

/* Whether QKV's async steps can take format W: its chunks are 16-byte copies of the row as it lies
 * (the dense formats; a format with scales apart would need its scales copied too). */
template <typename W>
inline constexpr bool pair_async_copies = std::is_same_v<typename W::chunk, uint4> && std::is_same_v<typename W::row_t, const uint4 *>;

/* QKV's steps of a row past the first that go through shared memory: at most MODEL_QKV_ASYNC, none
 * in a format whose chunks are not plain copies (codegen/plan.py sets none for quantized models). */
template <typename W, int U>
__host__ __device__ constexpr int pair_async_steps(int K) {
    if (!pair_async_copies<W>) return 0;
    return MODEL_QKV_ASYNC < mv_steps<W, U>(K) - 1 ? MODEL_QKV_ASYNC : mv_steps<W, U>(K) - 1;
}

/* Shared memory QKV's block needs for them, past its staged input: each warp's steps
 * 1 .. pair_async_steps of both rows, a lane's chunks where it alone reads them. */
template <typename W, int U>
__host__ __device__ constexpr size_t pair_async_bytes(int K) {
    if (!pair_async_copies<W>) return 0;
    return (size_t)pair_async_steps<W, U>(K) * 2 * U * WARP_SIZE * MODEL_MV_WARPS * sizeof(uint4);
}

/* Dynamic shared memory of QKV's block, whose input has K values. */
#define QKV_SMEM_BYTES(W, K) (MV_SMEM_BYTES(K) + pair_async_bytes<W, pair_unroll<W>>(K))

/* This warp's slots for the async steps: after the block's staged input of K floats (K % 8 == 0, so
 * 16-byte aligned). Slot (s, row, u) holds lane l's chunk at [((s * 2 + row) * U + u) * WARP_SIZE + l]. */
template <typename W, int U>
__device__ __forceinline__ uint4 *pair_async_slots(float *sx, int K) {
    return reinterpret_cast<uint4 *>(sx + K) + (size_t)(threadIdx.x / WARP_SIZE) * pair_async_steps<W, U>(K) * 2 * U * WARP_SIZE;
}

/* Steps 1 .. steps of rows ra and rb into this warp's slots on cp.async: each lane copies only the
 * chunks it will read, so cp.async.wait_all in the same lane is all the reading needs. */
template <typename W, int U>
__device__ __forceinline__ void pair_async_issue(uint4 *slots, typename W::row_t ra, typename W::row_t rb, int K, int lane, int steps) {
    if constexpr (pair_async_copies<W>) {
#pragma unroll
        for (int s = 1; s <= steps; s++) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = (s * U + u) * WARP_SIZE + lane;
                if (c < K / W::VALS) {
                    cp_async16(slots + (((s - 1) * 2 + 0) * U + u) * WARP_SIZE + lane, ra + c, true);
                    cp_async16(slots + (((s - 1) * 2 + 1) * U + u) * WARP_SIZE + lane, rb + c, true);
                }
            }
        }
    }
}

/* Step s of row `row` (0 or 1) from the slots into *r. The slot is free for the next pair's copy once
 * the dot product that uses *r has run: later instructions issue in order behind it. */
template <typename W, int U>
__device__ __forceinline__ void pair_async_read(row_chunks<W, U> *r, const uint4 *slots, int K, int s, int row, int lane) {
    if constexpr (pair_async_copies<W>) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = (s * U + u) * WARP_SIZE + lane;
            if (c < K / W::VALS) r->v[u] = slots[(((s - 1) * 2 + row) * U + u) * WARP_SIZE + lane];
        }
    }
}

/* Steps s0 .. s1 - 1 of rows ra and rb, loaded one step at a time into *fa and *fb, dotted with sx
 * and added to this lane's *acc_a and *acc_b. */
template <typename W, int U>
__device__ __forceinline__ void pair_steps_add(row_chunks<W, U> *fa, row_chunks<W, U> *fb, typename W::row_t ra, typename W::row_t rb, const float *sx,
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
template <typename W, int U>
__device__ __forceinline__ float2 row_dot2(row_chunks<W, U> *fa, row_chunks<W, U> *fb, typename W::row_t ra, typename W::row_t rb, const float *sx,
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
    pair_steps_add(fa, fb, ra, rb, sx, K, lane, 1 + async, mv_steps<W, U>(K), &acc_a, &acc_b);
    return make_float2(warp_sum(acc_a), warp_sum(acc_b));
}

/* Steps s0 .. s1 - 1 of rows ra and rb dotted with sx, loaded here one step at a time: a split
 * pair's half (QKV_SPLIT_LAST); the warp's two sums in every lane. */
template <typename W, int U>
__device__ __forceinline__ float2 pair_steps(row_chunks<W, U> *fa, row_chunks<W, U> *fb, typename W::row_t ra, typename W::row_t rb, const float *sx,
                                             int K, int lane, int s0, int s1) {
    float acc_a = 0.0f, acc_b = 0.0f;
    pair_steps_add(fa, fb, ra, rb, sx, K, lane, s0, s1, &acc_a, &acc_b);
    return make_float2(warp_sum(acc_a), warp_sum(acc_b));
}

/* A paired kernel's round: rows ra and rb dotted with sx, their first steps loaded here (and the
 * async steps issued) unless this is the warp's first round (loaded around the wait, the copies
 * issued once the input is staged). */
template <typename W, int U>
__device__ __forceinline__ float2 pair_round(bool first, row_chunks<W, U> *fa, row_chunks<W, U> *fb, typename W::row_t ra, typename W::row_t rb,
                                             const float *sx, int K, int lane, uint4 *slots = nullptr, int async = 0) {
    if (!first) {
        load_step(fa, ra, K, 0, lane);
        load_step(fb, rb, K, 0, lane);
        pair_async_issue<W, U>(slots, ra, rb, K, lane, async);
    }
    return row_dot2(fa, fb, ra, rb, sx, K, lane, slots, async);
}

/* row . sx as row_dot, with the next step's loads in flight while this one multiplies (double
 * buffering): for the single-row kernels (o_proj, down), whose registers allow it. */
template <typename W, int U>
__device__ __forceinline__ float row_dot_buffered(const row_chunks<W, U> *first, typename W::row_t row, const float *x, int K, int lane) {
    float acc;
    if (mv_steps<W, U>(K) == 1) {
        acc = dot_step(first, x, K, 0, lane);
    } else {
        acc = 0.0f;
        row_chunks<W, U> cur = *first;
#pragma unroll 1
        for (int step = 0; step < mv_steps<W, U>(K); step++) {
            row_chunks<W, U> nxt;
            if (step + 1 < mv_steps<W, U>(K)) load_step(&nxt, row, K, step + 1, lane);
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
// (docs/performance.md, D11).
//
// The staged vector is split in planes, one a float4 of a weight chunk (two for 8 values): chunk
// c's inputs x[8c..8c+3] are float4 c, x[8c+4..8c+7] float4 K/8 + c. A warp's lanes, reading chunks
// c..c+31, then read consecutive float4s: no two lanes of a quarter-warp in one bank (the plain
// layout put lanes 32 bytes apart, two wavefronts per read).

/* The float4 of the split layout that holds x's float4 group g (x[4g..4g+3]). */
template <typename W>
__device__ __forceinline__ int sx_group(int g, int K) {
    constexpr int planes = W::VALS / 4;
    return (g % planes) * (K / W::VALS) + g / planes;
}

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
template <typename W>
__device__ __forceinline__ void stage_norm(float *sx, const uint16_t *norm_w, int K) {
    float4 *s4 = reinterpret_cast<float4 *>(sx);
    for_each_group(reinterpret_cast<const uint2 *>(norm_w), K, [&](int g, uint2 w) {
        s4[sx_group<W>(g, K)] = make_float4(w_to_f32(w.x & 0xFFFF), w_to_f32(w.x >> 16), w_to_f32(w.y & 0xFFFF), w_to_f32(w.y >> 16));
    });
}

/* f(g, x4[g]) for each of this thread's float4 groups g of a K-vector whose words read ATT_POLL_WORD
 * until written (MODEL_ATT_O_POLL, MODEL_DOWN_POLL), as each is written: POLL_VEC loads in flight
 * at once, the float4s still unwritten polled again together, 32 ns apart, until every word is (a
 * late input costs one round trip after its last write lands, not one a float4). At most
 * POLL_MAX_FLOATS values (a bit a float4 of the thread's; the model's init checks). issued() as
 * for_each_group's. */
#define POLL_VEC MODEL_POLL_VEC /* the plan's: 8; a test builds 2, rounds of them */
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

/* The staged fp32 inputs of a block format (sx, K, in sx_group's planes) as its dot products take
 * them (xq_chunk, cuda_weights.cuh: x16 and a scale a block of 32), in place: a thread a chunk,
 * whose uint4 slots hold its own float4s before, so no thread overwrites another's inputs; a chunk
 * of 16 (Q8_0) meets its block's other half in the next lane. Called by the whole block after the
 * staging's barrier; the caller's barrier follows. */
template <typename W>
__device__ __forceinline__ void stage_xq(float *sx, int K) {
    constexpr int PLANES = W::VALS / 4, QPLANES = W::VALS / 8;
    static_assert(W::VALS == 16 || W::VALS == 32, "stage_xq: chunks of 16 or 32 inputs");
    const float4 *s4 = reinterpret_cast<const float4 *>(sx);
    uint4 *q4 = reinterpret_cast<uint4 *>(sx);
    const int chunks = K / W::VALS;
#pragma unroll 1
    for (int c0 = 0; c0 < chunks; c0 += MV_THREADS) {
        const int c = c0 + (int)threadIdx.x;
        const bool mine = c < chunks;
        float v[W::VALS];
        float amax = 0.0f;
#pragma unroll
        for (int p = 0; p < PLANES; p++) {
            const float4 f = mine ? s4[p * chunks + c] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            v[4 * p] = f.x, v[4 * p + 1] = f.y, v[4 * p + 2] = f.z, v[4 * p + 3] = f.w;
        }
#pragma unroll
        for (int i = 0; i < W::VALS; i++) {
            const float a = fabsf(v[i]);
            amax = (a > amax || a != a) ? a : amax; /* a NaN stays */
        }
        if constexpr (W::VALS == 16) { /* the block's other half: the neighbouring lane's chunk */
            const float o = __shfl_xor_sync(0xFFFFFFFFu, amax, 1);
            amax = (o > amax || o != o) ? o : amax;
        }
        if (!mine) continue;
        const bool finite = amax <= 3.402823466e38f, tiny = amax < XQ_TINY;
        const float inv = finite && !tiny ? XQ_MAX / amax : 0.0f;
        const float dx = !finite ? __int_as_float(0x7FC00000) : tiny ? 0.0f : amax / XQ_MAX;
        /* x16 in the low bits of fma(x, inv, 1.5 * 2^23): the exact product rounded once, ties to even */
        uint32_t bits[W::VALS];
        int sum[2] = {0, 0};
#pragma unroll
        for (int i = 0; i < W::VALS; i++) {
            bits[i] = __float_as_uint(__fmaf_rn(finite ? v[i] : 0.0f, inv, 12582912.0f));
            sum[i / 16] += (int)(bits[i] - 0x4B400000u);
        }
#pragma unroll
        for (int p = 0; p < QPLANES; p++)
            q4[p * chunks + c] = make_uint4(__byte_perm(bits[8 * p], bits[8 * p + 1], 0x5410), __byte_perm(bits[8 * p + 2], bits[8 * p + 3], 0x5410),
                                            __byte_perm(bits[8 * p + 4], bits[8 * p + 5], 0x5410), __byte_perm(bits[8 * p + 6], bits[8 * p + 7], 0x5410));
        q4[QPLANES * chunks + c] = make_uint4(__float_as_uint(dx), (uint32_t)sum[0], (uint32_t)sum[1], 0u);
    }
}

/* sx (K, shared) = x, or x * norm when stage_norm staged the norm weights there in the same threads;
 * returns RMSNorm's scale 1 / sqrt(mean(x^2) + eps) (1 without a norm), which the caller applies to
 * each dot product: HF's (x * scale) * norm up to rounding, with one barrier and one pass (the sum
 * of squares meets at the barrier staging needs anyway). Called by the whole block after its wait.
 * POLLED: x's words read ATT_POLL_WORD until written (poll_each_group). */
template <typename W, bool POLLED = false, typename H = no_hook>
__device__ __forceinline__ float stage_input(float *sx, const float *x, bool norm, int K, float eps, H issued = H{}) {
    __shared__ float partial[MODEL_MV_WARPS];
    float4 *s4 = reinterpret_cast<float4 *>(sx);
    float ss = 0.0f;
    auto stage = [&](int g, float4 v) {
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        if (norm) {
            const float4 n = s4[sx_group<W>(g, K)];
            v = make_float4(v.x * n.x, v.y * n.y, v.z * n.z, v.w * n.w);
        }
        s4[sx_group<W>(g, K)] = v;
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
    if constexpr (W::XQ) {
        stage_xq<W>(sx, K);
        __syncthreads();
    }
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


/* x (dim) = embed[history[pos]]: a value a thread in the dense formats, a chunk a thread in the
 * others. A token outside the vocabulary (the argmax of logits that are not finite chooses none:
 * 0x7FFFFFFF) makes x NaN, not a read out of bounds; model_cuda_take reports the step's. */
/* x[i] = the embedding row of token for i = first, first + stride, ... < dim: a value at a time in
 * the dense formats, a chunk of W::VALS values in the others */
template <typename W>
__device__ __forceinline__ void embed_row(typename W::mat embed, int token, float *x, int dim, int first, int stride) {
    if constexpr (W::DENSE16) {
        const uint16_t *row = embed + (size_t)token * dim;
        for (int i = first; i < dim; i += stride) x[i] = w_to_f32(row[i]);
    } else {
        const typename W::row_t row = W::row(embed, token, dim);
        for (int c = first; c < dim / W::VALS; c += stride) {
            float f[W::VALS];
            W::to_f32(W::load(row, c), f);
#pragma unroll
            for (int j = 0; j < W::VALS; j++) x[c * W::VALS + j] = f[j];
        }
    }
}

/* x (dim) = embed[history[pos]], a value or a chunk a thread (embed_row). A token outside the
 * vocabulary (the argmax of logits that are not finite chooses none: 0x7FFFFFFF) makes x NaN, not a
 * read out of bounds; model_cuda_take reports the step's. */
template <typename W, typename Wait>
__device__ __forceinline__ void embed_body(typename W::mat embed, const int *io, float *x, const int *history, int dim, int vocab,
                                           Wait wait) {
    wait();
    const int token = history[io[IO_POS]];
    if ((unsigned)token >= (unsigned)vocab) {
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < dim; i += gridDim.x * blockDim.x) x[i] = __int_as_float(0x7FC00000);
        return;
    }
    embed_row<W>(embed, token, x, dim, blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x);
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
 * block barrier every round (docs/performance.md, D7). */

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

/* input_layernorm + q/k/v projections (+ bias) + RoPE + KV-cache store (kv_put), a pair per warp. */
template <typename W, typename KV, typename Wait>
__device__ __forceinline__ void rmsnorm_qkv_rope_body(const uint16_t *norm_w, typename W::mat wq, typename W::mat wk,
                                                      typename W::mat wv, const uint16_t *bq, const uint16_t *bk,
                                                      const uint16_t *bv, const float *x, float *q, kv_view<KV> cache,
                                                      const int *io, const float *inv_freq, int dim,
                                                      int q_dim, int kv_dim, int head_dim, int ctx, float eps, Wait wait) {
    extern __shared__ float sx[];
    const int q_pairs = q_dim / 2, k_pairs = kv_dim / 2, pairs = q_pairs + k_pairs + kv_dim / 2;
    const int lane = threadIdx.x % WARP_SIZE;
    int p = grid_warp(), ra = 0, rb = 0, kind = 0;
    TRACE_BEGIN(ST_QKV);
    row_chunks<W, pair_unroll<W>> a, b;
    if (p < pairs) {
        qkv_pair(p, q_pairs, k_pairs, head_dim, &ra, &rb, &kind);
        typename W::mat wm = kind == 0 ? wq : kind == 1 ? wk : wv;
        pair_early_loads(&a, &b, W::row(wm, ra, dim),
                         W::row(wm, rb, dim), dim, lane);
    }
    stage_norm<W>(sx, norm_w, dim);
    TRACE_AT(TRACE_READY);
    wait();
    TRACE_AT(TRACE_WAITED);
    /* the async steps, where this build has them (MODEL_QKV_ASYNC): issued once the input is staged (in
     * stage_input's hook, right behind the input's loads: 7B -1.1%, 1B 0.3 points less gain) */
    const int async = pair_async_steps<W, pair_unroll<W>>(dim);
    uint4 *slots = pair_async_slots<W, pair_unroll<W>>(sx, dim);
    const float scale = stage_input<W>(sx, x, true, dim, eps, [&] {
        if (pair_early<W> == pair_unroll<W> || p >= pairs) return;
        typename W::mat wm = kind == 0 ? wq : kind == 1 ? wk : wv;
        load_chunks(&a, W::row(wm, ra, dim), dim, 0, lane, pair_early<W>, pair_unroll<W>);
        load_chunks(&b, W::row(wm, rb, dim), dim, 0, lane, pair_early<W>, pair_unroll<W>);
    });
    TRACE_AT(TRACE_STAGED);
    if (async > 0 && p < pairs) {
        typename W::mat wm = kind == 0 ? wq : kind == 1 ? wk : wv;
        pair_async_issue<W, pair_unroll<W>>(slots, W::row(wm, ra, dim),
                                         W::row(wm, rb, dim), dim, lane, async);
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
            kv_put(cache, kind, 0, pos, ra, va, kv_dim, head_dim, ctx);
            kv_put(cache, kind, 0, pos, rb, vb, kv_dim, head_dim, ctx);
        }
    };
    /* the last round split by K (QKV_SPLIT_LAST) where the pairs fill a round and what is left of
     * them fits half the warps; the full rounds before it as usual */
    const int full = pairs / grid_warps() * grid_warps(), left = pairs - full, steps = mv_steps<W, pair_unroll<W>>(dim);
    const bool split = QKV_SPLIT_LAST && full > 0 && left > 0 && 2 * left <= grid_warps() && steps >= 2;
    for (bool first = true; p < (split ? full : pairs); p += grid_warps(), first = false) {
        qkv_pair(p, q_pairs, k_pairs, head_dim, &ra, &rb, &kind);
        typename W::mat wm = kind == 0 ? wq : kind == 1 ? wk : wv;
        float2 v = pair_round(first, &a, &b, W::row(wm, ra, dim),
                              W::row(wm, rb, dim), sx, dim, lane, slots, async);
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
            typename W::mat wm = kind == 0 ? wq : kind == 1 ? wk : wv;
            float2 v = pair_steps(&a, &b, W::row(wm, ra, dim),
                                  W::row(wm, rb, dim), sx, dim, lane, h * steps / 2,
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
template <typename W, typename Wait>
__device__ __forceinline__ void matvec_residual_body(typename W::mat w, const uint16_t *bias, const float *in, float *out,
                                                     int rows, int K, bool pairs, int stage, Wait wait,
                                                     int block = (int)blockIdx.x, int blocks = (int)gridDim.x,
                                                     const unsigned *go = nullptr, unsigned go_count = 0) {
    const int lane = threadIdx.x % WARP_SIZE, half = rows / 2, n = pairs ? half : rows;
    const int warps = blocks * MODEL_MV_WARPS; /* the grid's, or the part of it this stage has */
    int row = block * MODEL_MV_WARPS + (int)threadIdx.x / WARP_SIZE;
    TRACE_BEGIN(stage);
    (void)stage;
    row_chunks<W> a, b;
    extern __shared__ float sx[];
    /* the first step's chunks loaded before the wait (load_lots): in the joined grid given go, lots
     * of res_pace<W> polling *go until it reaches go_count; launched on its own, lots of res_lot<W> */
    constexpr int U = mv_unroll<W>;
    int early = U;
    if (row < n) {
        constexpr int PACE_LOT = res_pace<W> > 0 ? res_pace<W> : U;
        if (res_pace<W> > 0 && go) {
            early = load_lots<PACE_LOT>(&a, pairs ? &b : nullptr, W::row(w, row, K),
                                        W::row(w, row + half, K), K, lane, U,
                                        stop_at_count{go, go_count});
        } else if (res_lot<W> < U) {
            early = load_lots<res_lot<W>>(&a, pairs ? &b : nullptr, W::row(w, row, K),
                                          W::row(w, row + half, K), K, lane, U,
                                          never_stop{});
        } else {
            load_step(&a, W::row(w, row, K), K, 0, lane);
            if (pairs) load_step(&b, W::row(w, row + half, K), K, 0, lane);
        }
    }
    TRACE_AT(TRACE_READY);
    wait();
    TRACE_AT(TRACE_WAITED);
    /* the first step's chunks a paced start left (res_pace), behind the input's loads */
    auto rest = [&] {
        if (early >= U || row >= n) return;
        load_chunks_from(&a, W::row(w, row, K), K, 0, lane, early);
        if (pairs) load_chunks_from(&b, W::row(w, row + half, K), K, 0, lane, early);
    };
    stage_input<W, polls_input<Wait>::value>(sx, in, false, K, 0.0f, rest); /* polled: wait_poll */
    TRACE_AT(TRACE_STAGED);
    for (bool first = true; row < n; row += warps, first = false) {
        const typename W::row_t r = W::row(w, row, K);
        /* The residual's old values, loaded before the row's dot product so that the add at its end
         * waits on no L2 round trip (the compiler keeps `out +=` after the dot product: out may alias
         * for all it knows): SmolLM2 +3.7%, 7B +0.4%, 1B -0.3% (docs/performance.md, D36).
         * Nothing else writes these rows in this stage. */
        float res_a = 0.0f, res_b = 0.0f;
        if (lane == 0) {
            res_a = __ldcg(out + row);
            if (pairs) res_b = __ldcg(out + row + half);
        }
        if (pairs) {
            const float2 v = pair_round(first, &a, &b, r, W::row(w, row + half, K), sx, K, lane);
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
template <typename W, typename Wait>
__device__ __forceinline__ void rmsnorm_gate_up_silu_body(const uint16_t *norm_w, typename W::mat wg, typename W::mat wu,
                                                          const float *x, float *hb, int dim, int hidden, float eps,
                                                          Wait wait) {
    extern __shared__ float sx[];
    const int lane = threadIdx.x % WARP_SIZE;
    int i = grid_warp();
    TRACE_BEGIN(ST_GATE_UP);
    row_chunks<W, pair_unroll<W>> a, b;
    if (i < hidden) {
        pair_early_loads(&a, &b, W::row(wg, i, dim),
                         W::row(wu, i, dim), dim, lane);
    }
    stage_norm<W>(sx, norm_w, dim);
    TRACE_AT(TRACE_READY);
    wait();
    TRACE_AT(TRACE_WAITED);
    const float scale = stage_input<W, polls_input<Wait>::value>(sx, x, true, dim, eps, [&] {
        if (pair_early<W> == pair_unroll<W> || i >= hidden) return;
        load_chunks(&a, W::row(wg, i, dim), dim, 0, lane, pair_early<W>, pair_unroll<W>);
        load_chunks(&b, W::row(wu, i, dim), dim, 0, lane, pair_early<W>, pair_unroll<W>);
    });
    TRACE_AT(TRACE_STAGED);
    for (bool first = true; i < hidden; i += grid_warps(), first = false) {
        float2 v = pair_round(first, &a, &b, W::row(wg, i, dim),
                              W::row(wu, i, dim), sx, dim, lane);
        if (lane == 0) hb[i] = silu(v.x * scale) * (v.y * scale);
    }
    TRACE_END();
}

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
template <typename W, typename Wait>
__device__ __forceinline__ void rmsnorm_lm_head_argmax_body(const uint16_t *norm_w, typename W::mat w, const float *x,
                                                            float *logits, float2 *block_best, unsigned *counter,
                                                            int *io, int dim, int vocab, float eps, Wait wait) {
    extern __shared__ float sx[];
    __shared__ float best_v[MODEL_MV_WARPS];
    __shared__ int best_i[MODEL_MV_WARPS];
    __shared__ bool last;
    const int lane = threadIdx.x % WARP_SIZE;
    int row = grid_warp();
    TRACE_BEGIN(ST_LM_HEAD);
    row_chunks<W> a;
    if (row < vocab) load_step(&a, W::row(w, row, dim), dim, 0, lane);
    stage_norm<W>(sx, norm_w, dim);
    TRACE_AT(TRACE_READY);
    wait();
    TRACE_AT(TRACE_WAITED);
    const float scale = stage_input<W>(sx, x, true, dim, eps);
    TRACE_AT(TRACE_STAGED);
    float bv = -INFINITY;
    int bi = 0x7FFFFFFF;
    for (bool first = true; row < vocab; row += grid_warps(), first = false) {
        const typename W::row_t r = W::row(w, row, dim);
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

#endif /* INGOT_CUDA_MATVEC_CUH */
