/* stream_chain.cu - can the stage boundaries of a decode step be hidden by streaming the weights
 * ahead of them? A question for the design, asked without arithmetic (the loaded words are XORed).
 *
 * A decode step reads one model's weights as a chain of stages (per layer QKV, attention, o_proj,
 * gate/up, down; then the LM head), and every stage needs the previous one's output before it can
 * use its weights, but not before it can read them. ingot runs a kernel per stage (programmatic
 * dependent launch: a stage's first weight loads go out before its wait); each boundary costs
 * ~2-4 us of a partly idle memory system (traced), 35% of the Llama-3.2-1B shape's step.
 * This compares, over the byte sizes of a real step:
 *   launches  a kernel per stage, a warp per 8 KB row, 2 rows at a time and 8 words a lane in
 *             flight, the first loads before griddepcontrol.wait (rows_kernel<2, 256>, read_patterns'
 *             "rows R2 2x256", the decode matvecs' pattern), in a CUDA graph;
 *   stream    one persistent kernel, one block an SM: a producer warp streams the block's share of
 *             every stage, in order, through a ring of shared-memory slots on the bulk-copy engine
 *             (cp.async.bulk), never waiting on a stage boundary; 8 consumer warps read the slots,
 *             and between stages they meet at a grid barrier (the dependency) and each reads a word
 *             another block wrote before it (an L2 round trip, as a stage's staged input). The
 *             producer runs up to the ring's size ahead, across the barriers.
 *   stream, no barrier: the same without the barriers (what the ring itself reaches).
 *   stream, claims: the producer takes its block's pieces of each stage from a counter of the stage
 *             (CLAIM pieces an atomic, the next claim asked for before this one's copies), so a
 *             block that streams faster takes more: static shares make every barrier wait for the
 *             slowest block of that stage. After a stage's last claim it puts one empty piece in
 *             each consumer's next slot (the stage's end).
 *   barriers alone: the chain with no bytes, what the grid barriers cost by themselves.
 *   matvecs: the launches and the stream (claims, counting barriers) with the arithmetic: each
 *             stage's input staged in shared memory after its boundary (the previous stage's
 *             output, from L2), each piece's rows dotted with it, the sums added to the output.
 * Two grid barriers: "generation" (each block's thread 0 fences, adds to a count and spins on a
 * generation word that the last block writes after its own fence) and "counting" (a release add
 * to a count that only grows, polled with acquire loads until it reaches the barrier's multiple
 * of the grid: two L2 trips, no generation word).
 * Measured (docs/performance.md, D5, D6: the route left the product): the 16 KB ring streams at 93-97% of the probe
 * without barriers; the generation barrier costs 2.3 us, more than a PDL kernel boundary (~1.45
 * us), the counting one 1.6 us. With counting barriers and claims the ring passes the launches on
 * the 7B shape (89-92% against 87%), not on the 1B (74-76% against 80-82%). With the matvecs'
 * arithmetic it falls behind on both (49% / 63% against 67% / 80%): 8 consumer warps reading
 * weights and input from shared memory do not keep up.
 * Attention at depth 0 reads next to nothing: it is a stage of 0 bytes (a boundary).
 *
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 tests/bench/stream_chain.cu -o build/stream_chain
 *   build/stream_chain             (on the GPU machine; one table per model shape) */
#include "bench_common.cuh"

#define MAX_STAGES 256
#define CONSUMERS 8 /* consumer warps a stream block (the matvec form also runs 16: every function takes
                      * the block's warps but the last as its consumers) */
#define MAX_WARPS 17
#define CLAIM 2      /* pieces a claim takes (claims mode) */

// ---------------------------------------------------------------------------------------------
// stream: a producer warp (the block's last) and consumer warps, one block an SM

struct chain {
    int n;                        /* stages */
    size_t offset[MAX_STAGES];    /* each stage's bytes in the buffer, 16-byte aligned */
    size_t bytes[MAX_STAGES];
    int piece[MAX_STAGES];        /* bytes a piece of the stage (claims): whole rows, or an equal part of one */
    int k[MAX_STAGES];            /* the stage's row length in bf16 (its input's size); 0: no rows */
    int rows[MAX_STAGES];
};

/* Block b's share of stage st: [lo, hi) bytes from the stage's start, whole 16-byte words. */
__device__ __forceinline__ void share(const chain &c, int st, size_t *lo, size_t *hi) {
    const size_t words = c.bytes[st] / 16, per = (words + gridDim.x - 1) / gridDim.x;
    *lo = min(words, per * blockIdx.x) * 16;
    *hi = min(words, per * (blockIdx.x + 1)) * 16;
}

/* The counting barrier: sync[2] only grows (zeroed before each launch); barrier b (from 0) returns
 * once every block has added its 1 for it, (b + 1) x blocks in all. */
__device__ void grid_barrier_counting(unsigned *count, unsigned b) {
    asm volatile("bar.sync 1, %0;" ::"r"(blockDim.x - 32) : "memory");
    if (threadIdx.x == 0) {
        const unsigned target = (b + 1) * gridDim.x;
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count) : "memory");
        unsigned v;
        unsigned long long spins = 0;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(count) : "memory");
            if (++spins == SPIN_LIMIT) __trap();
        } while (v < target);
    }
    asm volatile("bar.sync 1, %0;" ::"r"(blockDim.x - 32) : "memory");
}

/* The consumers of every block meet here: a counter of arrivals and a generation, as a grid
 * barrier (all blocks resident: one an SM). Thread 0 of the consumers arrives for its block. */
__device__ void grid_barrier(unsigned *count, volatile unsigned *gen) {
    asm volatile("bar.sync 1, %0;" ::"r"(blockDim.x - 32) : "memory");
    if (threadIdx.x == 0) {
        const unsigned g = *gen;
        __threadfence();
        if (atomicAdd(count, 1u) == gridDim.x - 1) {
            *count = 0;
            __threadfence();
            *gen = g + 1;
        } else {
            unsigned long long spins = 0;
            while (*gen == g)
                if (++spins == SPIN_LIMIT) __trap();
        }
        __threadfence();
    }
    asm volatile("bar.sync 1, %0;" ::"r"(blockDim.x - 32) : "memory");
}

/* shared memory of a ring of slots, its barriers and its pieces' lengths and offsets, to a 16-byte bound */
__host__ __device__ constexpr size_t ring_meta_bytes(int slots, int slot_bytes) {
    return ((size_t)slots * slot_bytes + (size_t)slots * (2 * sizeof(uint64_t) + 2 * sizeof(unsigned)) + 15) / 16 * 16;
}

/* The ring's layout in shared memory (slots of slot_bytes, then a full and an empty mbarrier a
 * slot, then a slot's piece length and offset), its barriers initialized; the block synced. */
__device__ void ring_init(unsigned char *smem, int slots, int slot_bytes, unsigned char **ring, uint64_t **full,
                          uint64_t **empty, unsigned **len_of, unsigned **at_of) {
    *ring = smem;
    *full = reinterpret_cast<uint64_t *>(smem + (size_t)slots * slot_bytes);
    *empty = *full + slots;
    *len_of = reinterpret_cast<unsigned *>(*empty + slots);
    *at_of = *len_of + slots;
    if (threadIdx.x == 0) {
        for (int s = 0; s < slots; s++) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(&(*full)[s])) : "memory");
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(&(*empty)[s])) : "memory");
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
}

/* Claims, the producer's side: stage by stage, CLAIM pieces of c.piece[st] bytes a claim from the
 * stage's counter (the next claim asked for during this one's copies, so a block that streams
 * faster takes more), each piece into the next slot with its length and offset in the stage;
 * after the stage's last claim one empty piece for each consumer warp (the stage's end). */
__device__ void produce_claims(const char *buf, const chain &c, unsigned char *ring, int slots, int slot_bytes,
                               uint64_t *full, uint64_t *empty, unsigned *len_of, unsigned *at_of, unsigned *claimed) {
    auto take = [&](int st) { return st < c.n ? atomicAdd(&claimed[st], 1u) : 0u; };
    long k = 0;
    unsigned unit = take(0);
    for (int st = 0; st < c.n; st++) {
        const size_t claim = (size_t)CLAIM * c.piece[st];
        while ((size_t)unit * claim < c.bytes[st]) {
            const size_t lo = (size_t)unit * claim, hi = min(c.bytes[st], lo + claim);
            unit = take(st);
            for (size_t at = lo; at < hi; at += c.piece[st], k++) {
                const int s = (int)(k % slots);
                if (k >= slots) bar_wait(&empty[s], (uint32_t)((k / slots - 1) & 1));
                const uint32_t n = (uint32_t)min((size_t)c.piece[st], hi - at);
                len_of[s] = n;
                at_of[s] = (unsigned)at;
                bulk_copy(ring + (size_t)s * slot_bytes, buf + c.offset[st] + at, n, &full[s]);
            }
        }
        for (int w = 0; w < (int)blockDim.x / 32 - 1; w++, k++) {
            const int s = (int)(k % slots);
            if (k >= slots) bar_wait(&empty[s], (uint32_t)((k / slots - 1) & 1));
            len_of[s] = 0;
            asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(saddr(&full[s])) : "memory");
        }
        unit = take(st + 1); /* (the last claim of st, past its end, is dropped) */
    }
}

/* Claims, a consumer warp's side: its slots in turn (k, k + consumers, ...), use(piece, bytes,
 * offset in the stage) on each, up to the stage's end; returns its next k. */
template <typename Use>
__device__ long consume_claims(unsigned char *ring, int slots, int slot_bytes, uint64_t *full, uint64_t *empty,
                               const unsigned *len_of, long k, int lane, Use use) {
    const unsigned *at_of = len_of + slots;
    const int consumers = blockDim.x / 32 - 1;
    for (;; k += consumers) {
        const int s = (int)(k % slots);
        bar_wait(&full[s], (uint32_t)((k / slots) & 1));
        const int n = (int)len_of[s];
        if (n) use(reinterpret_cast<const uint4 *>(ring + (size_t)s * slot_bytes), n, at_of[s]);
        __syncwarp();
        if (lane == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(saddr(&empty[s])) : "memory");
        if (n == 0) return k + consumers;
    }
}

__global__ void __launch_bounds__((CONSUMERS + 1) * 32, 1) stream_kernel(const char *buf, chain c, int slots, int piece,
                                                                         int barriers, int claims, unsigned *claimed,
                                                                         unsigned *sync, unsigned *words, unsigned *sink) {
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char *ring;
    uint64_t *full, *empty;
    unsigned *len_of, *at_of; /* claims */
    ring_init(smem, slots, piece, &ring, &full, &empty, &len_of, &at_of);
    const int lane = threadIdx.x % 32, wid = threadIdx.x / 32;
    if (wid == CONSUMERS) {
        /* the producer: every stage's share in order, piece k into slot k % slots once piece
         * k - slots has been read */
        if (lane != 0) return;
        long k = 0;
        if (claims) {
            produce_claims(buf, c, ring, slots, piece, full, empty, len_of, at_of, claimed);
            return;
        }
        for (int st = 0; st < c.n; st++) {
            size_t lo, hi;
            share(c, st, &lo, &hi);
            for (size_t at = lo; at < hi; at += piece, k++) {
                const int s = (int)(k % slots);
                if (k >= slots) bar_wait(&empty[s], (uint32_t)((k / slots - 1) & 1));
                bulk_copy(ring + (size_t)s * piece, buf + c.offset[st] + at, (uint32_t)min((size_t)piece, hi - at), &full[s]);
            }
        }
        return;
    }
    /* the consumers: piece k by warp k % CONSUMERS, the stage's boundary a grid barrier. Slot s's
     * pieces (s, s + slots, ...) must all be one warp's, taken in order (slots a multiple of
     * CONSUMERS): a warp a phase ahead of the slot's would pass try_wait.parity at once on the
     * phase before, read the slot before its data and arrive on `empty` out of turn (16 KB slots,
     * 12 of them, ended in a launch failure) */
    unsigned acc = 0;
    long k = claims ? wid : 0;
    for (int st = 0; st < c.n; st++) {
        if (barriers && st > 0) { /* 1: the generation barrier, 2: the counting one */
            if (barriers == 1) grid_barrier(sync, sync + 1);
            else grid_barrier_counting(sync + 2, (unsigned)st - 1);
            /* the stage's input, written by another block before the barrier: an L2 round trip */
            acc ^= __ldcg(&words[(blockIdx.x + 1) % gridDim.x]);
        }
        if (claims) {
            k = consume_claims(ring, slots, piece, full, empty, len_of, k, lane, [&](const uint4 *w, int bytes, unsigned) {
                for (int i = lane; i < bytes / 16; i += 32) acc ^= fold(w[i]);
            });
            if (lane == 0 && wid == 0) words[blockIdx.x] = acc | 1u;
            continue;
        }
        size_t lo, hi;
        share(c, st, &lo, &hi);
        for (size_t at = lo; at < hi; at += piece, k++) {
            if (k % CONSUMERS != wid) continue;
            const int s = (int)(k % slots);
            bar_wait(&full[s], (uint32_t)((k / slots) & 1));
            const uint4 *w = reinterpret_cast<const uint4 *>(ring + (size_t)s * piece);
            const int n = (int)(min((size_t)piece, hi - at) / 16);
            for (int i = lane; i < n; i += 32) acc ^= fold(w[i]);
            __syncwarp();
            if (lane == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(saddr(&empty[s])) : "memory");
        }
        if (lane == 0 && wid == 0) words[blockIdx.x] = acc | 1u; /* this stage's output */
    }
    if (acc == MAGIC) *sink = acc;
}

// ---------------------------------------------------------------------------------------------
// The same two forms with the matvecs' arithmetic: each piece's rows (or part of a row) against the
// stage's input, staged in shared memory after the stage's boundary from the previous stage's
// output (K floats from L2), the warp's sums added to the stage's output (red.add: a row may be
// split over pieces). Outputs go round three buffers: stage st reads (st + 2) % 3, adds into
// st % 3 and zeroes its share of (st + 1) % 3 for the next stage (read two boundaries ago).

__device__ __forceinline__ float dot8(uint4 w, float4 a, float4 b) {
    auto lo = [](unsigned u) { return __uint_as_float(u << 16); };
    auto hi = [](unsigned u) { return __uint_as_float(u & 0xFFFF0000u); };
    return lo(w.x) * a.x + hi(w.x) * a.y + lo(w.y) * a.z + hi(w.y) * a.w + lo(w.z) * b.x + hi(w.z) * b.y + lo(w.w) * b.z +
           hi(w.w) * b.w;
}

/* A piece of `bytes` at byte `at` of a stage with rows of k bf16: lane takes word lane + 32 t; the
 * piece is whole rows, or one part of a row (per_lane words a lane a row). MAXW: words a lane at most. */
template <int MAXW, typename Get>
__device__ __forceinline__ void piece_dot(Get get, int bytes, unsigned at, int k, const float4 *x4, float *y, int lane) {
    const int el = bytes / 2, seg = min(k, el), per_lane = seg / 256, n = el / 256;
    const int row0 = (int)((at / 2) / k), col0 = (int)((at / 2) % k);
    float sum = 0.0f;
    int r = 0, j = 0;
#pragma unroll
    for (int t = 0; t < MAXW; t++)
        if (t < n) {
            const int col = col0 + 8 * (lane + 32 * j);
            sum += dot8(get(t), x4[col / 4], x4[col / 4 + 1]);
            if (++j == per_lane) {
#pragma unroll
                for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
                if (lane == 0) atomicAdd(y + row0 + r, sum);
                sum = 0.0f, j = 0, r++;
            }
        }
}

/* stage st's boundary work for threads [0, threads): zero this block's share of the next stage's
 * output, then stage the input in x4 (the caller syncs) */
__device__ __forceinline__ void stage_input(const chain &c, int st, float *act, size_t act_stride, float4 *x4, int tid,
                                            int threads, int block, int blocks) {
    if (st + 1 < c.n) {
        float *next = act + (size_t)((st + 1) % 3) * act_stride;
        const int per = (c.rows[st + 1] + blocks - 1) / blocks;
        for (int i = block * per + tid; i < min(c.rows[st + 1], (block + 1) * per); i += threads) next[i] = 0.0f;
    }
    const float4 *in = reinterpret_cast<const float4 *>(act + (size_t)((st + 2) % 3) * act_stride);
    for (int i = tid; i < c.k[st] / 4; i += threads) x4[i] = __ldcg(in + i);
}

/* the persistent form with claims and counting barriers; shared memory: the ring, its barriers and
 * pieces' lengths and offsets, then the input (the largest k floats) */
__global__ void __launch_bounds__(MAX_WARPS * 32, 1) stream_matvec_kernel(const char *buf, chain c, int slots,
                                                                                int slot_bytes, unsigned *claimed,
                                                                                unsigned *count, float *act,
                                                                                size_t act_stride) {
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char *ring;
    uint64_t *full, *empty;
    unsigned *len_of, *at_of;
    ring_init(smem, slots, slot_bytes, &ring, &full, &empty, &len_of, &at_of);
    float4 *x4 = reinterpret_cast<float4 *>(smem + ring_meta_bytes(slots, slot_bytes));
    const int lane = threadIdx.x % 32, wid = threadIdx.x / 32;
    if (wid == (int)blockDim.x / 32 - 1) {
        if (lane == 0) produce_claims(buf, c, ring, slots, slot_bytes, full, empty, len_of, at_of, claimed);
        return;
    }
    long k = wid;
    for (int st = 0; st < c.n; st++) {
        if (st > 0) grid_barrier_counting(count, (unsigned)st - 1);
        stage_input(c, st, act, act_stride, x4, threadIdx.x, blockDim.x - 32, blockIdx.x, gridDim.x);
        asm volatile("bar.sync 1, %0;" ::"r"(blockDim.x - 32) : "memory");
        float *y = act + (size_t)(st % 3) * act_stride;
        const int kk = c.k[st];
        k = consume_claims(ring, slots, slot_bytes, full, empty, len_of, k, lane, [&](const uint4 *w, int bytes, unsigned at) {
            piece_dot<32>([&](int t) { return w[lane + 32 * t]; }, bytes, at, kk, x4, y, lane);
        });
    }
}

/* the launch form: a kernel a stage, 8 warps a block, a warp a piece of at most 8 KB at a time in
 * registers, the first piece loaded before the wait */
__global__ void __launch_bounds__(256) rows_matvec_kernel(const char *buf, chain c, int st, float *act, size_t act_stride) {
    extern __shared__ __align__(16) float4 xs[];
    const int lane = threadIdx.x % 32, G = gridDim.x * 8, pieces = (int)(c.bytes[st] / max(c.piece[st], 1));
    int p = blockIdx.x * 8 + threadIdx.x / 32;
    const uint4 *w = reinterpret_cast<const uint4 *>(buf + c.offset[st]);
    uint4 v[16];
    auto load = [&](int q) {
        const uint4 *src = w + (size_t)q * (c.piece[st] / 16);
#pragma unroll
        for (int t = 0; t < 16; t++)
            if (t < c.piece[st] / 512) v[t] = __ldcs(src + lane + 32 * t);
    };
    if (p < pieces) load(p);
    pdl_wait();
    pdl_trigger();
    stage_input(c, st, act, act_stride, xs, threadIdx.x, blockDim.x, blockIdx.x, gridDim.x);
    __syncthreads();
    float *y = act + (size_t)(st % 3) * act_stride;
    for (bool first = true; p < pieces; p += G, first = false) {
        if (!first) load(p);
        piece_dot<16>([&](int t) { return v[t]; }, c.piece[st], (unsigned)((size_t)p * c.piece[st]), c.k[st], xs, y, lane);
    }
}

// ---------------------------------------------------------------------------------------------
// Harness

struct shape {
    const char *name;
    long dim, q_dim, kv_dim, hidden, vocab, layers;
};

/* The step's stages: per layer QKV, attention (0 bytes at depth 0), o_proj, gate/up, down; the LM head. */
static chain chain_of(const shape &m) {
    chain c = {};
    size_t at = 0;
    auto add = [&](long rows, long k) {
        c.offset[c.n] = at;
        c.rows[c.n] = (int)rows;
        c.k[c.n] = (int)k;
        c.bytes[c.n++] = (size_t)rows * k * 2;
        at += (rows * k * 2 + 4095) / 4096 * 4096;
    };
    for (long l = 0; l < m.layers; l++) {
        add(m.q_dim + 2 * m.kv_dim, m.dim);
        add(0, 0);
        add(m.dim, m.q_dim);
        add(2 * m.hidden, m.dim);
        add(m.dim, m.hidden);
    }
    add(m.vocab, m.dim);
    return c;
}

/* c with pieces of at most max_bytes a stage: whole rows, or a row in equal parts; each a whole
 * number of 16-byte words a lane (piece_dot) */
static chain with_pieces(chain c, int max_bytes) {
    for (int i = 0; i < c.n; i++) {
        if (!c.k[i]) continue;
        const int row = 2 * c.k[i];
        c.piece[i] = row <= max_bytes ? max_bytes / row * row : row / ((row + max_bytes - 1) / max_bytes);
        if (c.bytes[i] % c.piece[i] || c.piece[i] % 512 || (row > c.piece[i] && row % c.piece[i])) {
            fprintf(stderr, "stream_chain: stage %d (%d rows of %d) does not split into pieces of at most %d bytes\n", i,
                    c.rows[i], c.k[i], max_bytes);
            exit(1);
        }
    }
    return c;
}

static size_t total(const chain &c) {
    size_t t = 0;
    for (int i = 0; i < c.n; i++) t += c.bytes[i];
    return t;
}

/* kernel<<<grid, 256, smem, st>>>(args...) with programmatic dependent launch allowed */
template <typename... P, typename... A>
static void launch_pdl(cudaStream_t st, int grid, size_t smem, void (*kernel)(P...), A... args) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(256);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    CHECK(cudaLaunchKernelEx(&cfg, kernel, (P)args...));
}

/* best_ms of a graph of what capture enqueues, before() enqueued ahead of each replay */
template <typename F, typename G>
static float graph_ms(cudaStream_t st, F capture, G before) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    capture();
    CHECK(cudaStreamEndCapture(st, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    const float ms = best_ms(st, [&] {
        before();
        CHECK(cudaGraphLaunch(exec, st));
    });
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    return ms;
}

int main(void) {
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    const int sms = prop.multiProcessorCount;
    const shape shapes[] = {
        {"Llama-3.2-1B", 2048, 2048, 512, 8192, 128256, 16},
        {"Mistral-7B", 4096, 4096, 1024, 14336, 32000, 32},
    };
    size_t buf_bytes = 0;
    for (const shape &m : shapes) {
        const chain c = chain_of(m);
        const size_t end = c.offset[c.n - 1] + c.bytes[c.n - 1];
        if (end > buf_bytes) buf_bytes = end;
    }
    char *buf;
    unsigned *sink, *sync, *words, *claimed;
    CHECK(cudaMalloc(&buf, buf_bytes));
    CHECK(cudaMalloc(&sink, sizeof(unsigned)));
    CHECK(cudaMalloc(&sync, 3 * sizeof(unsigned)));
    CHECK(cudaMemset(sync, 0, 3 * sizeof(unsigned)));
    CHECK(cudaMalloc(&words, (size_t)sms * sizeof(unsigned)));
    CHECK(cudaMalloc(&claimed, MAX_STAGES * sizeof(unsigned)));
    size_t act_stride = 0; /* the matvec forms' outputs: three buffers of the most rows a stage has */
    for (const shape &m : shapes) act_stride = max(act_stride, (size_t)(m.vocab + 3) / 4 * 4);
    float *act;
    CHECK(cudaMalloc(&act, 3 * act_stride * sizeof(float)));
    fill_kernel<<<sms * 8, 256>>>(reinterpret_cast<uint4 *>(buf), buf_bytes / 16);
    CHECK(cudaDeviceSynchronize());
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CHECK(cudaFuncSetAttribute(stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
    CHECK(cudaFuncSetAttribute(stream_matvec_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
    CHECK(cudaFuncSetAttribute(rows_matvec_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024));

    const float probe_ms = best_ms(st, [&] { probe_kernel<<<sms * 4, 512, 0, st>>>(reinterpret_cast<const uint4 *>(buf), buf_bytes / 16, sink, 0); });
    const double probe = (double)buf_bytes / (probe_ms * 1e-3) / 1e9;
    printf("%s, %d SMs; read probe over %.1f GB: %.0f GB/s\n", prop.name, sms, buf_bytes / 1e9, probe);

    for (const shape &m : shapes) {
        const chain c = chain_of(m);
        const double bytes = (double)total(c);
        printf("\n%s shape: %d stages, %.1f MB a step; us a step, GB/s, share of the probe\n", m.name, c.n, bytes / 1e6);
        auto report = [&](const char *what, float ms) {
            const double gbs = bytes / (ms * 1e-3) / 1e9;
            printf("  %-36s %8.1f us %7.0f GB/s %5.1f%%\n", what, ms * 1e3, gbs, 100 * gbs / probe);
        };

        /* launches: a graph of one rows_kernel per stage (an empty stage: a grid of one block) */
        report("launches (a kernel a stage, PDL)", graph_ms(st, [&] {
                   for (int i = 0; i < c.n; i++) {
                       const int rows = (int)(c.bytes[i] / ROW_BYTES);
                       launch_pdl(st, rows ? sms * 2 : 1, 0, rows_kernel<2, 256>, reinterpret_cast<const uint4 *>(buf + c.offset[i]),
                                  rows, sink, 1);
                   }
               }, [] {}));

        /* ring variants: static shares without barriers, with each barrier, then claims with each */
        const int pieces[] = {16384}; /* (8 KB pieces: bound by the one producer thread, 61-69%) */
        const char *barrier_name[] = {"", ", barriers", ", counting barriers"};
        for (int piece : pieces)
            for (int mode = 0; mode < 5; mode++) {
                const int slots = 192 * 1024 / piece / CONSUMERS * CONSUMERS; /* 8 */
                const size_t smem = ring_meta_bytes(slots, piece);
                const int barriers = mode == 0 ? 0 : 1 + (mode - 1) % 2, claims = mode >= 3;
                char what[64];
                snprintf(what, sizeof what, "stream, %2d x %2d KB%s%s", slots, piece / 1024, claims ? ", claims" : "",
                         barrier_name[barriers]);
                chain cp = c;
                for (int i = 0; i < cp.n; i++) cp.piece[i] = piece;
                report(what, best_ms(st, [&] {
                           CHECK(cudaMemsetAsync(claimed, 0, MAX_STAGES * sizeof(unsigned), st));
                           CHECK(cudaMemsetAsync(sync + 2, 0, sizeof(unsigned), st));
                           stream_kernel<<<sms, (CONSUMERS + 1) * 32, smem, st>>>(buf, cp, slots, piece, barriers, claims, claimed,
                                                                                  sync, words, sink);
                       }));
            }
        chain none = c; /* the same stages with no bytes: the barriers alone */
        for (int i = 0; i < none.n; i++) none.bytes[i] = 0;
        for (int barriers = 1; barriers <= 2; barriers++) {
            const float ms = best_ms(st, [&] {
                CHECK(cudaMemsetAsync(sync + 2, 0, sizeof(unsigned), st));
                stream_kernel<<<sms, (CONSUMERS + 1) * 32, 4096, st>>>(buf, none, 8, 256, barriers, 0, claimed, sync, words, sink);
            });
            printf("  %-36s %8.1f us, %.2f us a barrier\n", barriers == 1 ? "generation barriers alone" : "counting barriers alone",
                   ms * 1e3, ms * 1e3 / (c.n - 1));
        }

        /* with the matvecs' arithmetic: a kernel a stage (8 KB pieces in registers) against the
         * persistent ring (16 KB pieces, claims, counting barriers) */
        int max_k = 0;
        for (int i = 0; i < c.n; i++) max_k = max(max_k, c.k[i]);
        const chain c8 = with_pieces(c, 8192), c16 = with_pieces(c, 16384);
        report("launches, matvecs", graph_ms(st, [&] {
                   for (int i = 0; i < c.n; i++)
                       launch_pdl(st, sms * 2, (size_t)c.k[i] * sizeof(float), rows_matvec_kernel, (const char *)buf, c8, i, act,
                                  act_stride);
               }, [&] { CHECK(cudaMemsetAsync(act, 0, 3 * act_stride * sizeof(float), st)); }));
        /* 8 consumer warps on 8 x 16 KB, 16 on 16 x 8 KB (a slot's pieces all one warp's) */
        for (int consumers = 8; consumers <= 16; consumers += 8) {
            const int slot_bytes = consumers == 8 ? 16384 : 8192;
            const size_t msmem = ring_meta_bytes(consumers, slot_bytes) + (size_t)max_k * sizeof(float);
            char what[64];
            snprintf(what, sizeof what, "stream, matvecs, %d warps x %d KB", consumers, slot_bytes / 1024);
            report(what, best_ms(st, [&] {
                       CHECK(cudaMemsetAsync(act, 0, 3 * act_stride * sizeof(float), st));
                       CHECK(cudaMemsetAsync(claimed, 0, MAX_STAGES * sizeof(unsigned), st));
                       CHECK(cudaMemsetAsync(sync + 2, 0, sizeof(unsigned), st));
                       stream_matvec_kernel<<<sms, (consumers + 1) * 32, msmem, st>>>(buf, consumers == 8 ? c16 : c8, consumers,
                                                                                      slot_bytes, claimed, sync + 2, act,
                                                                                      act_stride);
                   }));
        }
    }
    return 0;
}
