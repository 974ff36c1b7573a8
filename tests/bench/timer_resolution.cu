/* timer_resolution.cu - the step of the GPU's global timer, which the decode step's trace stamps.
 *
 * A trace build (-DINGOT_TRACE, tests/bench/step_trace.py) stamps %globaltimer at points of every
 * block's work and reads differences of a fraction of a microsecond. Those mean what they say only
 * if the timer moves in steps well under that. Here one thread reads %globaltimer back to back and
 * records each change it sees: the nanoseconds it moved and the SM cycles (%clock64) since the last
 * change. A step of 32 ns shows as 32/~63 at 1.98 GHz; a timer that moves once a microsecond as
 * 1000/~1980.
 *
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 tests/bench/timer_resolution.cu -o build/timer_resolution
 *   build/timer_resolution         (on the GPU machine; prints the changes) */
#include <cstdio>
#include <cuda_runtime.h>

#define CHANGES 64       /* changes recorded */
#define READS 2000000    /* reads at most */

__global__ void timer_changes(unsigned long long *ns, unsigned long long *cycles, int *seen) {
    unsigned long long t0, c0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    c0 = clock64();
    int k = 0;
    for (int i = 0; i < READS && k < CHANGES; i++) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t != t0) {
            const unsigned long long c = clock64();
            ns[k] = t - t0, cycles[k] = c - c0, k++;
            t0 = t, c0 = c;
        }
    }
    *seen = k;
}

int main(void) {
    unsigned long long *ns, *cycles;
    int *seen;
    if (cudaMallocManaged(&ns, CHANGES * sizeof *ns) != cudaSuccess || cudaMallocManaged(&cycles, CHANGES * sizeof *cycles) != cudaSuccess ||
        cudaMallocManaged(&seen, sizeof *seen) != cudaSuccess) {
        fprintf(stderr, "timer_resolution: no GPU memory\n");
        return 1;
    }
    timer_changes<<<1, 1>>>(ns, cycles, seen);
    const cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        fprintf(stderr, "timer_resolution: %s\n", cudaGetErrorString(e));
        return 1;
    }
    /* the first change ends a partial step: left out */
    printf("%%globaltimer: %d changes in at most %d reads; ns moved / SM cycles between changes:\n", *seen, READS);
    for (int i = 1; i < *seen; i++) printf("%llu/%llu%s", ns[i], cycles[i], i % 8 == 0 || i == *seen - 1 ? "\n" : "  ");
    return 0;
}
