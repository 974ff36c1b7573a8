/* stream_chain.cu - can the stage boundaries of a decode step be hidden by streaming the weights
 * ahead of them? A question for the design, asked without arithmetic (the loaded words are XORed).
 *
 * A decode step reads one model's weights as a chain of stages (per layer QKV, attention, o_proj,
 * gate/up, down; then the LM head), and every stage needs the previous one's output before it can
 * use its weights, but not before it can read them. ingot runs a kernel per stage (programmatic
 * dependent launch: a stage's first weight loads go out before its wait); each boundary costs
 * ~2-4 us of a partly idle memory system (PERFORMANCE.md), 35% of the Llama-3.2-1B shape's step.
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
 * Two grid barriers: "generation" (each block's thread 0 fences, adds to a count and spins on a
 * generation word that the last block writes after its own fence) and "counting" (a release add
 * to a count that only grows, polled with acquire loads until it reaches the barrier's multiple
 * of the grid: two L2 trips, no generation word).
 * Measured (PERFORMANCE.md, thirteenth session): the 16 KB ring streams at 93-97% of the probe
 * without barriers; the generation barrier costs 2.3 us, more than a PDL kernel boundary (~1.45
 * us), the counting one 1.6 us. With counting barriers and claims the ring passes the launches on
 * the 7B shape (89.4% against 86.5%), not on the 1B (74% against 80%).
 * Attention at depth 0 reads next to nothing: it is a stage of 0 bytes (a boundary).
 *
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 tests/bench/stream_chain.cu -o build/stream_chain
 *   build/stream_chain             (on the GPU machine; one table per model shape) */
#include "bench_common.cuh"

#define MAX_STAGES 256
#define CONSUMERS 8 /* consumer warps a stream block */
#define CLAIM 2      /* pieces a claim takes (claims mode) */

// ---------------------------------------------------------------------------------------------
// stream: a producer warp and CONSUMERS consumer warps a block, one block an SM

struct chain {
    int n;                        /* stages */
    size_t offset[MAX_STAGES];    /* each stage's bytes in the buffer, 16-byte aligned */
    size_t bytes[MAX_STAGES];
};

/* Block b's share of stage st: [lo, hi) bytes from the stage's start, whole 16-byte words. */
__device__ __forceinline__ void share(const chain &c, int st, size_t *lo, size_t *hi) {
    const size_t words = c.bytes[st] / 16, per = (words + gridDim.x - 1) / gridDim.x;
    *lo = min(words, per * blockIdx.x) * 16;
    *hi = min(words, per * (blockIdx.x + 1)) * 16;
}

/* The consumers of every block meet here: a counter of arrivals and a generation, as a grid
 * barrier (all blocks resident: one an SM). Thread 0 of the consumers arrives for its block. */
/* The counting barrier: sync[2] only grows (zeroed before each launch); barrier b (from 0) returns
 * once every block has added its 1 for it, (b + 1) x blocks in all. */
__device__ void grid_barrier_counting(unsigned *count, unsigned b) {
    asm volatile("bar.sync 1, %0;" ::"r"(CONSUMERS * 32) : "memory");
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
    asm volatile("bar.sync 1, %0;" ::"r"(CONSUMERS * 32) : "memory");
}

__device__ void grid_barrier(unsigned *count, volatile unsigned *gen) {
    asm volatile("bar.sync 1, %0;" ::"r"(CONSUMERS * 32) : "memory");
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
    asm volatile("bar.sync 1, %0;" ::"r"(CONSUMERS * 32) : "memory");
}

__global__ void __launch_bounds__((CONSUMERS + 1) * 32, 1) stream_kernel(const char *buf, chain c, int slots, int piece,
                                                                         int barriers, int claims, unsigned *claimed,
                                                                         unsigned *sync, unsigned *words, unsigned *sink) {
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char *ring = smem;
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + (size_t)slots * piece), *empty = full + slots;
    unsigned *len_of = reinterpret_cast<unsigned *>(empty + slots); /* claims: a slot's bytes, 0 at a stage's end */
    const int lane = threadIdx.x % 32, wid = threadIdx.x / 32;
    if (threadIdx.x == 0) {
        for (int s = 0; s < slots; s++) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(&full[s])) : "memory");
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(&empty[s])) : "memory");
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (wid == CONSUMERS) {
        /* the producer: every stage's share in order, piece k into slot k % slots once piece
         * k - slots has been read */
        if (lane != 0) return;
        long k = 0;
        if (claims) {
            auto take = [&](int st) { return st < c.n ? atomicAdd(&claimed[st], 1u) : 0u; };
            unsigned unit = take(0);
            for (int st = 0; st < c.n; st++) {
                while ((size_t)unit * CLAIM * piece < c.bytes[st]) {
                    const size_t lo = (size_t)unit * CLAIM * piece, hi = min(c.bytes[st], lo + (size_t)CLAIM * piece);
                    unit = take(st); /* the next claim on its way during this one's copies */
                    for (size_t at = lo; at < hi; at += piece, k++) {
                        const int s = (int)(k % slots);
                        if (k >= slots) bar_wait(&empty[s], (uint32_t)((k / slots - 1) & 1));
                        const uint32_t n = (uint32_t)min((size_t)piece, hi - at);
                        len_of[s] = n;
                        bulk_copy(ring + (size_t)s * piece, buf + c.offset[st] + at, n, &full[s]);
                    }
                }
                for (int w = 0; w < CONSUMERS; w++, k++) { /* the stage's end, one for each consumer */
                    const int s = (int)(k % slots);
                    if (k >= slots) bar_wait(&empty[s], (uint32_t)((k / slots - 1) & 1));
                    len_of[s] = 0;
                    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(saddr(&full[s])) : "memory");
                }
                unit = take(st + 1); /* (the last claim of st, past its end, is dropped) */
            }
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
        if (claims) { /* this warp's slots in turn, up to the stage's end */
            for (;; k += CONSUMERS) {
                const int s = (int)(k % slots);
                bar_wait(&full[s], (uint32_t)((k / slots) & 1));
                const int n = (int)(len_of[s] / 16);
                const uint4 *w = reinterpret_cast<const uint4 *>(ring + (size_t)s * piece);
                for (int i = lane; i < n; i += 32) acc ^= fold(w[i]);
                __syncwarp();
                if (lane == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(saddr(&empty[s])) : "memory");
                if (n == 0) {
                    k += CONSUMERS;
                    break;
                }
            }
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
// Harness

struct shape {
    const char *name;
    long dim, q_dim, kv_dim, hidden, vocab, layers;
};

/* The step's stages: per layer QKV, attention (0 bytes at depth 0), o_proj, gate/up, down; the LM head. */
static chain chain_of(const shape &m) {
    chain c = {};
    size_t at = 0;
    auto add = [&](size_t bytes) {
        c.offset[c.n] = at;
        c.bytes[c.n++] = bytes;
        at += (bytes + 4095) / 4096 * 4096;
    };
    for (long l = 0; l < m.layers; l++) {
        add((size_t)(m.q_dim + 2 * m.kv_dim) * m.dim * 2);
        add(0);
        add((size_t)m.dim * m.q_dim * 2);
        add((size_t)2 * m.hidden * m.dim * 2);
        add((size_t)m.dim * m.hidden * 2);
    }
    add((size_t)m.vocab * m.dim * 2);
    return c;
}

static size_t total(const chain &c) {
    size_t t = 0;
    for (int i = 0; i < c.n; i++) t += c.bytes[i];
    return t;
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
    fill_kernel<<<sms * 8, 256>>>(reinterpret_cast<uint4 *>(buf), buf_bytes / 16);
    CHECK(cudaDeviceSynchronize());
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CHECK(cudaFuncSetAttribute(stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));

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
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < c.n; i++) {
            cudaLaunchConfig_t cfg = {};
            cudaLaunchAttribute attr;
            attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
            attr.val.programmaticStreamSerializationAllowed = 1;
            const int rows = (int)(c.bytes[i] / ROW_BYTES);
            cfg.gridDim = dim3(rows ? sms * 2 : 1);
            cfg.blockDim = dim3(256);
            cfg.stream = st;
            cfg.attrs = &attr;
            cfg.numAttrs = 1;
            CHECK(cudaLaunchKernelEx(&cfg, rows_kernel<2, 256>, reinterpret_cast<const uint4 *>(buf + c.offset[i]), rows, sink, 1));
        }
        CHECK(cudaStreamEndCapture(st, &graph));
        CHECK(cudaGraphInstantiate(&exec, graph, 0));
        report("launches (a kernel a stage, PDL)", best_ms(st, [&] { CHECK(cudaGraphLaunch(exec, st)); }));
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);

        /* ring variants: static shares without barriers, with each barrier, then claims with each */
        const int pieces[] = {8192, 16384};
        const char *barrier_name[] = {"", ", barriers", ", counting barriers"};
        for (int piece : pieces)
            for (int mode = 0; mode < 5; mode++) {
                const int slots = 192 * 1024 / piece / CONSUMERS * CONSUMERS; /* 24, 8 */
                const size_t smem = (size_t)slots * piece + 2 * slots * sizeof(uint64_t) + slots * sizeof(unsigned);
                const int barriers = mode == 0 ? 0 : 1 + (mode - 1) % 2, claims = mode >= 3;
                char what[64];
                snprintf(what, sizeof what, "stream, %2d x %2d KB%s%s", slots, piece / 1024, claims ? ", claims" : "",
                         barrier_name[barriers]);
                report(what, best_ms(st, [&] {
                           CHECK(cudaMemsetAsync(claimed, 0, MAX_STAGES * sizeof(unsigned), st));
                           CHECK(cudaMemsetAsync(sync + 2, 0, sizeof(unsigned), st));
                           stream_kernel<<<sms, (CONSUMERS + 1) * 32, smem, st>>>(buf, c, slots, piece, barriers, claims, claimed,
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
    }
    return 0;
}
