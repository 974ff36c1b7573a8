/* read_patterns.cu - how fast the GPU reads weights laid out as the decode step reads them.
 *
 * The decode step is a chain of matvecs, each reading a weight matrix once. This measures, with no
 * arithmetic in the way (the loaded words are XORed), how the read pattern and the bytes in flight
 * per SM bound that:
 *   probe   every thread reads 16-byte words grid-stride, 8 in flight (the --bench probe);
 *   rows    a warp per row of 8 KB (4096 bf16), 8 words per lane in flight per row (16 in the 768-
 *           thread blocks), R rows at a time, rows striding over the grid's warps (the matvec
 *           kernels' pattern);
 *   tma     a warp per row too, through a ring of S 4 KB slots per warp in shared memory filled by
 *           the bulk-copy engine (cp.async.bulk, completing on mbarriers).
 *   alt     launches alternating between a bulk-copy kernel and a register-heavy row kernel, sized
 *           so that an SM can hold one of each but never two of one kind.
 * Two sizes: one launch over 4 GiB (steady state), and a CUDA graph of 40 launches that each read
 * a region the size of one matvec (different regions, so L2 holds none), with and without
 * programmatic dependent launch (the first loads issued before griddepcontrol.wait, as the decode
 * kernels do): what each kernel boundary costs.
 *
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 tests/bench/read_patterns.cu -o build/read_patterns
 *   build/read_patterns            (on the GPU machine; prints one table) */
#include "bench_common.cuh"

// ---------------------------------------------------------------------------------------------
// tma: a warp per row, through a ring of slots 4 KB pieces per warp filled by the copy engine

#define PIECE 4096

__device__ __forceinline__ void bulk(void *dst, const void *src, uint64_t *bar) {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    bulk_copy(dst, src, PIECE, bar);
}

__global__ void __launch_bounds__(256) tma_kernel(const char *p, int rows, int slots, unsigned *sink, int pdl) {
    extern __shared__ __align__(128) unsigned char smem[];
    const int lane = threadIdx.x % 32, wib = threadIdx.x / 32, G = gridDim.x * (blockDim.x / 32);
    unsigned char *ring = smem + (size_t)wib * slots * PIECE;
    uint64_t *bar = reinterpret_cast<uint64_t *>(smem + (size_t)(blockDim.x / 32) * slots * PIECE) + wib * slots;
    const int g = blockIdx.x * (blockDim.x / 32) + wib, per_row = ROW_BYTES / PIECE;
    const int pieces = g < rows ? (rows - g + G - 1) / G * per_row : 0;
    auto src = [&](int k) { return p + (size_t)(g + (k / per_row) * G) * ROW_BYTES + (k % per_row) * PIECE; };
    if (lane == 0) {
        for (int s = 0; s < slots; s++) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(&bar[s])) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        for (int k = 0; k < slots && k < pieces; k++) bulk(ring + (size_t)k * PIECE, src(k), &bar[k]);
    }
    __syncwarp();
    if (pdl) {
        pdl_wait();
        pdl_trigger();
    }
    unsigned acc = 0;
    for (int k = 0; k < pieces; k++) {
        int s = k % slots;
        bar_wait(&bar[s], (k / slots) & 1);
        const uint4 *w = reinterpret_cast<const uint4 *>(ring + (size_t)s * PIECE);
#pragma unroll
        for (int u = 0; u < PIECE / 16 / 32; u++) acc ^= fold(w[u * 32 + lane]);
        __syncwarp();
        if (lane == 0 && k + slots < pieces) bulk(ring + (size_t)s * PIECE, src(k + slots), &bar[s]);
    }
    if (acc == MAGIC) *sink = acc;
}

// ---------------------------------------------------------------------------------------------
// Harness

struct pattern {
    const char *name;
    int kind;          /* 0 probe, 1 rows R=1, 2 rows R=2, 3 tma, 4 rows R=1 in blocks of 768 threads */
    int blocks_per_sm; /* grid: this times the SMs */
    int threads;
    int slots;         /* tma */
    int alt;           /* >= 0: every other launch of the graphs is patterns[alt] instead (index) */
};

static unsigned *sink;
static int sms;

static size_t smem_of(const pattern &pt) { return pt.kind == 3 ? (size_t)(pt.threads / 32) * pt.slots * (PIECE + 8) : 0; }

static void launch(const pattern &pt, const char *base, size_t bytes, int pdl, cudaStream_t st) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.gridDim = dim3(sms * pt.blocks_per_sm);
    cfg.blockDim = dim3(pt.threads);
    cfg.dynamicSmemBytes = smem_of(pt);
    cfg.stream = st;
    cfg.attrs = pdl ? &attr : NULL;
    cfg.numAttrs = pdl ? 1 : 0;
    int rows = (int)(bytes / ROW_BYTES);
    const uint4 *p4 = reinterpret_cast<const uint4 *>(base);
    switch (pt.kind) {
    case 0: CHECK(cudaLaunchKernelEx(&cfg, probe_kernel, p4, bytes / 16, sink, pdl)); break;
    case 1: CHECK(cudaLaunchKernelEx(&cfg, rows_kernel<1, 256>, p4, rows, sink, pdl)); break;
    case 2: CHECK(cudaLaunchKernelEx(&cfg, rows_kernel<2, 256>, p4, rows, sink, pdl)); break;
    case 4: CHECK(cudaLaunchKernelEx(&cfg, rows_kernel<1, 768, 16>, p4, rows, sink, pdl)); break;
    default: CHECK(cudaLaunchKernelEx(&cfg, tma_kernel, base, rows, pt.slots, sink, pdl)); break;
    }
}

/* GB/s of n launches over consecutive regions of bytes each (wrapping in the buffer), captured in
 * a graph, best of 5 replays; every other launch is alt's when it is given. */
static double measure(const pattern &pt, const pattern *alt, const char *buf, size_t buf_bytes, size_t bytes, int n, int pdl,
                      cudaStream_t st) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < n; i++)
        launch(alt && i % 2 ? *alt : pt, buf + ((size_t)i * bytes) % (buf_bytes - bytes + 1) / ROW_BYTES * ROW_BYTES, bytes, pdl,
               st);
    CHECK(cudaStreamEndCapture(st, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    const float best = best_ms(st, [&] { CHECK(cudaGraphLaunch(exec, st)); });
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    return (double)bytes * n / (best * 1e-3) / 1e9;
}

int main(void) {
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    sms = prop.multiProcessorCount;
    const size_t buf_bytes = (size_t)4 << 30;
    char *buf;
    CHECK(cudaMalloc(&buf, buf_bytes));
    CHECK(cudaMalloc(&sink, sizeof(unsigned)));
    fill_kernel<<<sms * 8, 256>>>(reinterpret_cast<uint4 *>(buf), buf_bytes / 16);
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaFuncSetAttribute(tma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

    const pattern patterns[] = {
        {"probe 4x512", 0, 4, 512, 0, -1},  {"probe 2x256", 0, 2, 256, 0, -1},  {"probe 1x256", 0, 1, 256, 0, -1},
        {"rows R1 2x256", 1, 2, 256, 0, -1}, {"rows R1 4x256", 1, 4, 256, 0, -1}, {"rows R1 8x256", 1, 8, 256, 0, -1},
        {"rows R2 1x256", 2, 1, 256, 0, -1}, {"rows R2 2x256", 2, 2, 256, 0, -1}, {"rows R2 4x256", 2, 4, 256, 0, -1},
        {"tma 1x256 S3", 3, 1, 256, 3, -1},  {"tma 1x256 S6", 3, 1, 256, 6, -1},  {"tma 2x256 S3", 3, 2, 256, 3, -1},
        {"tma 1x256 S2", 3, 1, 256, 2, -1},
        /* Alternating kernels that can share an SM but never hold two blocks of one kind: the bulk-copy
         * kernel takes more than half the shared memory, the 768-thread row kernel more than half the
         * registers (both printed below). Then the next kernel's blocks, launched early by PDL, land
         * one per SM beside the running kernel's, and prefetch there. */
        {"tma 1x256 S4", 3, 1, 256, 4, -1},      {"rows R1 1x768 U16", 4, 1, 768, 0, -1},
        {"alt S4 / R1x768", 3, 1, 256, 4, 14},
    };
    /* region sizes: Llama-3.2-1B o_proj, Mistral-7B QKV, Mistral-7B gate+up */
    const size_t sizes[] = {(size_t)2048 * 2048 * 2, (size_t)6144 * 4096 * 2, (size_t)2 * 14336 * 4096 * 2};
    printf("%s, %d SMs; GB/s (a share of the best 4 GiB number in brackets)\n", prop.name, sms);
    printf("%-16s %9s %10s", "pattern", "KB/SM", "4 GiB");
    for (size_t s : sizes) printf(" %9.1fMB %9s", s / 1e6, "+PDL");
    printf("\n");
    cudaFuncAttributes fa;
    CHECK(cudaFuncGetAttributes(&fa, tma_kernel));
    int per_sm;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, tma_kernel, 256, 8 * 4 * (PIECE + 8)));
    printf("tma S4: %d registers, %zu B shared, %d block(s)/SM alone; ", fa.numRegs, (size_t)8 * 4 * (PIECE + 8), per_sm);
    CHECK(cudaFuncGetAttributes(&fa, rows_kernel<1, 768, 16>));
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, rows_kernel<1, 768, 16>, 768, 0));
    printf("rows 768: %d registers (%d per block of 65536), %d block(s)/SM alone\n", fa.numRegs, fa.numRegs * 768, per_sm);
    double top = 0;
    for (const pattern &pt : patterns) {
        const pattern *alt = pt.alt >= 0 ? &patterns[pt.alt] : NULL;
        double inflight = pt.kind == 0   ? pt.blocks_per_sm * pt.threads * 8 * 16
                          : pt.kind == 3 ? pt.blocks_per_sm * (pt.threads / 32) * pt.slots * PIECE
                                         : pt.blocks_per_sm * pt.threads * (pt.kind == 4 ? 16 : 8) * 16 * (pt.kind == 2 ? 2 : 1);
        double big = measure(pt, NULL, buf, buf_bytes, buf_bytes, 1, 0, st);
        if (big > top) top = big;
        printf("%-16s %9.0f %10.0f", pt.name, inflight / 1024, big);
        for (size_t s : sizes) {
            double a = measure(pt, alt, buf, buf_bytes, s, 40, 0, st), b = measure(pt, alt, buf, buf_bytes, s, 40, 1, st);
            printf(" %7.0f(%2.0f) %6.0f(%2.0f)", a, 100 * a / top, b, 100 * b / top);
        }
        printf("\n");
        fflush(stdout);
    }
    CHECK(cudaGetLastError());
    return 0;
}
