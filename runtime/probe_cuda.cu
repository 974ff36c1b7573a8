/* probe_cuda.cu - see probe_cuda.h. The probe reads like the matvecs do (16-byte streaming loads,
 * eight in flight per thread) so that the share of it that decode reaches says how close the
 * kernels come to what this GPU gives a reader, not to a datasheet number. */
#include <stdio.h>
#include <string.h>

#include <cuda_runtime.h>

#include "probe_cuda.h"

extern "C" int cuda_device_count(void) {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

__global__ void read_kernel(const uint4 *p, size_t n, unsigned *sink) {
    unsigned acc = 0;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    for (; i + 7 * stride < n; i += 8 * stride) {
        uint4 v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) v[u] = __ldcs(p + i + u * stride);
#pragma unroll
        for (int u = 0; u < 8; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n; i += stride) {
        uint4 v = __ldcs(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9E3779B9u) *sink = acc; /* keeps the loads; practically never true */
}

__global__ void fill_kernel(uint4 *p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = make_uint4((unsigned)i, (unsigned)i * 3u, (unsigned)i * 5u, (unsigned)i * 7u);
}

#define TRY(call, what)                                                                    \
    do {                                                                                   \
        cudaError_t e_ = (call);                                                           \
        if (e_ != cudaSuccess) {                                                           \
            rc = err_set(ERR_DEVICE, "bandwidth probe: %s: %s", what, cudaGetErrorString(e_)); \
            goto out;                                                                      \
        }                                                                                  \
    } while (0)

extern "C" err_code probe_cuda_read_bandwidth(size_t bytes, double *bytes_per_s, char *name, size_t name_cap) {
    err_code rc = ERR_OK;
    uint4 *buf = NULL;
    unsigned *sink = NULL;
    cudaEvent_t t0 = NULL, t1 = NULL;
    cudaDeviceProp prop;
    size_t n = bytes / sizeof(uint4);
    double best = 0.0;
    TRY(cudaGetDeviceProperties(&prop, 0), "device properties");
    snprintf(name, name_cap, "%s", prop.name);
    TRY(cudaMalloc(&buf, n * sizeof(uint4)), "allocation");
    TRY(cudaMalloc(&sink, sizeof(unsigned)), "allocation");
    TRY(cudaEventCreate(&t0), "events");
    TRY(cudaEventCreate(&t1), "events");
    fill_kernel<<<prop.multiProcessorCount * 8, 256>>>(buf, n); /* real data, not zeros */
    TRY(cudaGetLastError(), "fill");
    for (int pass = 0; pass < 10; pass++) {
        TRY(cudaEventRecord(t0), "timing");
        read_kernel<<<prop.multiProcessorCount * 4, 512>>>(buf, n, sink);
        TRY(cudaEventRecord(t1), "timing");
        TRY(cudaEventSynchronize(t1), "read kernel");
        float ms;
        TRY(cudaEventElapsedTime(&ms, t0, t1), "timing");
        if (pass > 0 && (double)bytes / (ms * 1e-3) > best) best = (double)bytes / (ms * 1e-3); /* pass 0 warms up */
    }
    *bytes_per_s = best;
out:
    if (t0) cudaEventDestroy(t0);
    if (t1) cudaEventDestroy(t1);
    cudaFree(buf);
    cudaFree(sink);
    return rc;
}
