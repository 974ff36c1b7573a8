/* cuda_trace.cuh - the decode step's one trace hook: with -DINGOT_TRACE every block of a stage
 * kernel stamps the global timer at its start, its wait, its staged input and its end
 * (tests/bench/step_trace.py reads the records; tests/bench/gpu.sh trace); without it the stamps
 * compile to nothing. Also the step's stage names (ST_*), which the kernel benchmark shares. */
#ifndef INGOT_CUDA_TRACE_CUH
#define INGOT_CUDA_TRACE_CUH

#include "cuda_common.cuh"

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

#endif /* INGOT_CUDA_TRACE_CUH */
