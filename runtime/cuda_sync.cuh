/* cuda_sync.cuh - how the GPU code's kernels meet: programmatic dependent launch and the waits a
 * stage body takes (the previous grid's end, a count, polled words, a grid barrier), the step's io
 * words in device memory, and the warp width.
 *
 * Every stage body takes its wait as a parameter (a Wait functor below), so one body serves the
 * step's kernels, which wait for the previous kernel (wait_pdl), and the joined grids, which wait
 * for a count or for their input's words (wait_count, wait_poll). A kernel issues its first weight
 * loads, which depend on nothing before it, and only then waits. */
#ifndef INGOT_CUDA_SYNC_CUH
#define INGOT_CUDA_SYNC_CUH

#include <stdint.h>
#include <stdio.h> /* printf: a wait past its limit says so before it traps */

#define WARP_SIZE 32

/* io: {position, chosen token, batch} in device memory: the position of the step's token, which the
 * host sets when it feeds tokens and each step's end advances; the token the argmax or the sampler
 * chose; and how many of a prefill batch's tokens are the prompt's (the host sets it before each
 * batch). */
#define IO_POS 0
#define IO_NEXT 1
#define IO_COUNT 2
#define IO_INTS 3

/* A stage may wait for its input's words themselves instead of the previous grid's end (the joined
 * short grid's o_proj, MODEL_ATT_O_POLL; down, MODEL_DOWN_POLL: forward_cuda.cu): the previous stage writes
 * them into a buffer whose words read ATT_POLL_WORD until written; the waiting blocks poll a few
 * float4s of it (wait_poll) and then stage the input polling any float4 still unwritten
 * (stage_input). A later kernel puts the words back (unwrite_words). */
#define ATT_POLL_WORD 0xFFFFFFFFu /* a polled word not yet written: a NaN that no arithmetic makes */

// ---------------------------------------------------------------------------------------------
// Programmatic dependent launch: the next kernel may start before this one ends; it must wait
// before it reads anything this one writes.

__device__ __forceinline__ void pdl_wait(void) {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents(void) {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* How a stage body waits for the previous stage, after issuing the loads that do not depend on
 * it. Each matvec body calls its wait exactly once, in every block, whether the block has rows or
 * not (a grid barrier needs every block); attention, never given a barrier, leaves before its wait
 * when its block has no positions. */

/* In the step's graph, one kernel per stage: programmatic dependent launch. The next kernel may
 * launch once every block of this one is past its wait (letting it launch before the wait lost 1%
 * on the 1B shape and 9% on SmolLM2: docs/performance.md, D13; attention letting o_proj launch only
 * after its loads: 1B at depth 4096 -2.4%, depth 0 +0.7%: D22). A block that leaves early counts as
 * past it.
 * The one exception: with the fused MLP the short attention lets o_proj launch before its wait
 * (MODEL_ATT_TRIGGER_EARLY, forward_cuda.cu); the second launch_dependents is then a no-op. */
struct wait_pdl {
    __device__ __forceinline__ void operator()() const {
        pdl_wait();
        pdl_launch_dependents();
    }
};

/* The same, but the next kernel may launch once every block has issued its early loads, before
 * the wait (o_proj in the one-split graphs, MODEL_O_PROJ_TRIGGER_SHORTEST). */
struct trigger_then_wait_pdl {
    __device__ __forceinline__ void operator()() const {
        pdl_launch_dependents();
        pdl_wait();
    }
};

/* In a kernel whose blocks do two stages (attention and o_proj, MODEL_ATT_O_SHORT): the later stage's
 * blocks wait until *done reaches target (each earlier block that finishes adds 1 after a fence),
 * then let the next kernel launch, as wait_pdl. They never call griddepcontrol.wait: the earlier
 * blocks did, and their count orders everything before them. The acquire load makes their writes
 * visible to this block's loads after the barrier. */
#define WAIT_COUNT_LIMIT_NS 2000000000ULL /* 2 s: a decode stage takes microseconds */
/* The calling thread spins (acquire loads, 20 ns apart) until *count reaches target. */
__device__ __forceinline__ void spin_until(const unsigned *count, unsigned target) {
    unsigned v;
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    for (;;) {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(count) : "memory");
        if (v >= target) break;
        __nanosleep(20);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t - t0 > WAIT_COUNT_LIMIT_NS) { /* a count that never comes: an error, not a hang */
            printf("ingot: a block waited %llu ns for %u of %u (spin_until): stopping\n", t - t0, v, target);
            __trap();
        }
    }
}
struct wait_count {
    const unsigned *done;
    unsigned target;
    __device__ __forceinline__ void operator()() const {
        if (threadIdx.x == 0) spin_until(done, target);
        __syncthreads();
        pdl_launch_dependents();
    }
};

/* A float4 of att_poll (MODEL_ATT_O_POLL) as it is in L2 now: a relaxed load at GPU scope, never L1's copy. */
__device__ __forceinline__ float4 ld_poll(const float4 *p) {
    float4 v;
    asm volatile("ld.relaxed.gpu.global.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ bool unwritten(float4 v) {
    return __float_as_uint(v.x) == ATT_POLL_WORD || __float_as_uint(v.y) == ATT_POLL_WORD ||
           __float_as_uint(v.z) == ATT_POLL_WORD || __float_as_uint(v.w) == ATT_POLL_WORD;
}
/* *p once every word of it is written (polls sleep ns apart; an error after WAIT_COUNT_LIMIT_NS) */
__device__ __forceinline__ float4 poll_written(const float4 *p, unsigned ns) {
    float4 v = ld_poll(p);
    if (!unwritten(v)) return v;
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        __nanosleep(ns);
        v = ld_poll(p);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t - t0 > WAIT_COUNT_LIMIT_NS) {
            printf("ingot: a block waited %llu ns for a polled input (poll_written): stopping\n", t - t0);
            __trap();
        }
    } while (unwritten(v));
    return v;
}
/* A stage whose input (n floats, n a multiple of 4) is polled (MODEL_ATT_O_POLL, MODEL_DOWN_POLL): thread g <
 * groups polls the last float4 of the g-th of groups equal parts of it (o_proj: a KV group's
 * outputs), then the next kernel may launch as after wait_pdl. The input's staging
 * (stage_input<true>) makes sure of the rest. */
struct wait_poll {
    const float *in;
    int groups, n;
    __device__ __forceinline__ void operator()() const {
        if ((int)threadIdx.x < groups)
            poll_written(reinterpret_cast<const float4 *>(in) + ((int)threadIdx.x + 1) * (n / 4) / groups - 1, 20);
        __syncthreads();
        pdl_launch_dependents();
    }
};
template <typename W>
struct polls_input {
    static constexpr bool value = false;
};
template <>
struct polls_input<wait_poll> {
    static constexpr bool value = true;
};

/* p's n words (n a multiple of 4) read ATT_POLL_WORD again, for the next stage that polls them: a
 * float4 a thread over the grid's threads. */
__device__ __forceinline__ void unwrite_words(float *p, int n) {
    const float u = __uint_as_float(ATT_POLL_WORD);
    for (int i = (int)(blockIdx.x * blockDim.x + threadIdx.x); i < n / 4; i += (int)(gridDim.x * blockDim.x))
        reinterpret_cast<float4 *>(p)[i] = make_float4(u, u, u, u);
}



#endif /* INGOT_CUDA_SYNC_CUH */
