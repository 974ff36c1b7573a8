/* cuda_transpose.cuh - a (rows, cols) matrix of 16-bit words transposed on the GPU: down_proj's
 * copy for the fused decode MLP (forward_cuda.cu, MODEL_MLP_FUSED), made once at load, and the same
 * for tests/bench/fused_mlp.cu. Included only where it is launched (an unused static kernel is a
 * warning, and the builds treat warnings as errors). */
#ifndef INGOT_CUDA_TRANSPOSE_CUH
#define INGOT_CUDA_TRANSPOSE_CUH

#include <stdint.h>

/* out (cols, rows) = in (rows, cols); rows and cols multiples of 32; blocks of (32, 8) threads,
 * grid (cols / 32, rows / 32) */
static __global__ void __launch_bounds__(256) transpose_words_kernel(const uint16_t *in, uint16_t *out, int rows, int cols) {
    __shared__ uint16_t t[32][33];
    const int c = blockIdx.x * 32 + threadIdx.x, r0 = blockIdx.y * 32;
    for (int i = threadIdx.y; i < 32; i += blockDim.y) t[i][threadIdx.x] = in[(size_t)(r0 + i) * cols + c];
    __syncthreads();
    const int r = r0 + threadIdx.x, c0 = blockIdx.x * 32;
    for (int i = threadIdx.y; i < 32; i += blockDim.y) out[(size_t)(c0 + i) * rows + r] = t[threadIdx.x][i];
}

#endif
