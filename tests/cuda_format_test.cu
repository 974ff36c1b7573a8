/* cuda_format_test.cu - a weight format other than the model's through the decode step's matvec
 * core: GGUF's Q8_0 (w_q8_0, cuda_weights.cuh) in o_proj/down's body (matvec_residual_body), the
 * first quantized format of issue 59 on the core issue 58 made generic over the format.
 *
 *   cuda_format_test check OUTDIR SEED ROWS K   Q8_0 blocks as a GGUF file holds them (34 bytes
 *                                               each: fp16 scale, 32 int8), repacked as the upload
 *                                               will (values and scales apart), out = x0 + W . in;
 *                                               writes weights.bin (the GGUF bytes), in.bin, x0.bin,
 *                                               out.bin for tests/test_cuda_format.py to check
 *                                               against gguf's dequantizer and NumPy
 *   cuda_format_test bench ROWS K               GB/s the same body reads, Q8_0 against the model's
 *                                               16-bit format on matrices of the same shape (four
 *                                               of them in turn: past L2), and the read probe
 *
 * Compiled against a model's generated headers (the plan's MV_WARPS, MV_UNROLL, RES_LOT ...):
 * nvcc -I runtime -I generated/<model> tests/cuda_format_test.cu build/runtime/probe_cuda.o
 * build/runtime/errors.o (tests/test_cuda_format.py's rule). Exit 0, or 1 with one line naming
 * what failed. */
#include "model_config.h"
#include "model_plan.h"
#include "cuda_matvec.cuh"
#include "probe_cuda.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

#define FC(call)                                                                                                   \
    do {                                                                                                           \
        cudaError_t e_ = (call);                                                                                   \
        if (e_ != cudaSuccess) {                                                                                   \
            fprintf(stderr, "cuda_format_test: CUDA error: %s at line %d (%s)\n", cudaGetErrorString(e_), __LINE__, #call); \
            exit(1);                                                                                               \
        }                                                                                                          \
    } while (0)

/* out (rows) += W (rows, K) . in (K), a row a warp, as o_proj and down run it */
template <typename W>
static __global__ void __launch_bounds__(MV_THREADS, 2) residual_kernel(typename W::mat w, const float *in, float *out, int rows, int K) {
    matvec_residual_body<W>(w, NULL, in, out, rows, K, false, ST_DOWN, wait_pdl{});
}

static uint64_t rng_state;
static uint64_t next_u64(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
static double unit(void) { return (double)(next_u64() >> 11) * 0x1.0p-53; }

static uint16_t f32_to_f16_bits(float f) {
    const __half h = __float2half_rn(f);
    return *reinterpret_cast<const uint16_t *>(&h);
}

/* rows x K / 32 Q8_0 blocks as GGUF lays them out: scales of order 1/(127 sqrt(K)), values uniform in [-127, 127] */
static std::vector<uint8_t> q8_0_blocks(int rows, int K) {
    const size_t blocks = (size_t)rows * (K / 32);
    std::vector<uint8_t> b(blocks * 34);
    for (size_t i = 0; i < blocks; i++) {
        const uint16_t d = f32_to_f16_bits((float)((0.5 + unit()) / (127.0 * sqrt((double)K))));
        memcpy(&b[i * 34], &d, 2);
        for (int j = 0; j < 32; j++) b[i * 34 + 2 + j] = (uint8_t)(int8_t)((int)(unit() * 255.0) - 127);
    }
    return b;
}

/* The upload's repacking: values (rows, K) int8 and scales (rows, K / 32) fp16 apart, on the device */
static w_q8_0::mat upload_q8_0(const std::vector<uint8_t> &blocks, int rows, int K) {
    const size_t n = blocks.size() / 34;
    std::vector<int8_t> q(n * 32);
    std::vector<uint16_t> d(n);
    for (size_t i = 0; i < n; i++) {
        memcpy(&d[i], &blocks[i * 34], 2);
        memcpy(&q[i * 32], &blocks[i * 34 + 2], 32);
    }
    int8_t *dq = NULL;
    __half *dd = NULL;
    FC(cudaMalloc(&dq, q.size()));
    FC(cudaMalloc(&dd, d.size() * 2));
    FC(cudaMemcpy(dq, q.data(), q.size(), cudaMemcpyHostToDevice));
    FC(cudaMemcpy(dd, d.data(), d.size() * 2, cudaMemcpyHostToDevice));
    (void)rows, (void)K;
    return {dq, dd};
}

static float *upload_f32(const std::vector<float> &v) {
    float *p = NULL;
    FC(cudaMalloc(&p, v.size() * sizeof(float)));
    FC(cudaMemcpy(p, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
    return p;
}

static void write_file(const std::string &path, const void *p, size_t bytes) {
    FILE *f = fopen(path.c_str(), "wb");
    if (!f || fwrite(p, 1, bytes, f) != bytes || fclose(f) != 0) {
        fprintf(stderr, "cuda_format_test: %s: cannot write\n", path.c_str());
        exit(1);
    }
}

static int grid_for(const void *kernel, int rows, size_t smem) {
    int per_sm = 0, dev = 0;
    cudaDeviceProp prop;
    FC(cudaGetDevice(&dev));
    FC(cudaGetDeviceProperties(&prop, dev));
    FC(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, MV_THREADS, smem));
    const int need = (rows + MODEL_MV_WARPS - 1) / MODEL_MV_WARPS, wave = per_sm * prop.multiProcessorCount;
    return need < wave ? need : wave;
}

template <typename W>
static int prepare(int rows, int K) {
    const size_t smem = MV_SMEM_BYTES(K);
    FC(cudaFuncSetAttribute((const void *)residual_kernel<W>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    return grid_for((const void *)residual_kernel<W>, rows, smem);
}

static int check(const char *dir, uint64_t seed, int rows, int K) {
    rng_state = seed;
    const std::vector<uint8_t> blocks = q8_0_blocks(rows, K);
    std::vector<float> in(K), x0(rows);
    for (float &v : in) v = (float)(2.0 * unit() - 1.0);
    for (float &v : x0) v = (float)(2.0 * unit() - 1.0);
    const w_q8_0::mat w = upload_q8_0(blocks, rows, K);
    float *din = upload_f32(in), *dout = upload_f32(x0);
    const int grid = prepare<w_q8_0>(rows, K);
    residual_kernel<w_q8_0><<<grid, MV_THREADS, MV_SMEM_BYTES(K)>>>(w, din, dout, rows, K);
    FC(cudaGetLastError());
    FC(cudaDeviceSynchronize());
    std::vector<float> out(rows);
    FC(cudaMemcpy(out.data(), dout, rows * sizeof(float), cudaMemcpyDeviceToHost));
    const std::string d = dir;
    write_file(d + "/weights.bin", blocks.data(), blocks.size());
    write_file(d + "/in.bin", in.data(), in.size() * sizeof(float));
    write_file(d + "/x0.bin", x0.data(), x0.size() * sizeof(float));
    write_file(d + "/out.bin", out.data(), out.size() * sizeof(float));
    printf("check: %d x %d Q8_0, grid %d\n", rows, K, grid);
    return 0;
}

/* ms a launch of W's body over four matrices in turn (best of 5 passes of 20 launches) */
template <typename W>
static double time_body(const typename W::mat *mats, float *din, float *dout, int rows, int K) {
    const int grid = prepare<W>(rows, K);
    cudaEvent_t a, b;
    FC(cudaEventCreate(&a));
    FC(cudaEventCreate(&b));
    double best = 1e30;
    for (int pass = 0; pass < 5; pass++) {
        FC(cudaEventRecord(a));
        for (int i = 0; i < 20; i++) residual_kernel<W><<<grid, MV_THREADS, MV_SMEM_BYTES(K)>>>(mats[i % 4], din, dout, rows, K);
        FC(cudaEventRecord(b));
        FC(cudaEventSynchronize(b));
        float ms = 0;
        FC(cudaEventElapsedTime(&ms, a, b));
        if (ms / 20 < best) best = ms / 20;
    }
    FC(cudaGetLastError());
    return best;
}

static int bench(int rows, int K) {
    rng_state = 1;
    std::vector<float> in(K, 0.5f), x0(rows, 0.0f);
    float *din = upload_f32(in), *dout = upload_f32(x0);
    w_q8_0::mat q8[4];
    for (int i = 0; i < 4; i++) q8[i] = upload_q8_0(q8_0_blocks(rows, K), rows, K);
    model_w::mat w16[4];
    for (int i = 0; i < 4; i++) {
        uint16_t *p = NULL;
        FC(cudaMalloc(&p, (size_t)rows * K * 2));
        FC(cudaMemset(p, 0x3C, (size_t)rows * K * 2)); /* small finite values in bf16 and fp16 */
        w16[i] = p;
    }
    double probe = 0;
    char name[256] = "";
    if (probe_cuda_read_bandwidth((size_t)1 << 30, &probe, name, sizeof name) != ERR_OK) {
        fprintf(stderr, "cuda_format_test: the read probe failed\n");
        return 1;
    }
    const double q8_bytes = (double)rows * K * (1.0 + 2.0 / 32), w16_bytes = (double)rows * K * 2;
    const double t_q8 = time_body<w_q8_0>(q8, din, dout, rows, K), t_w16 = time_body<model_w>(w16, din, dout, rows, K);
    printf("bench: %s, %d x %d, read probe %.1f GB/s\n", name, rows, K, probe / 1e9);
    printf("  Q8_0: %.1f us, %.1f GB/s = %.1f%% of probe\n", t_q8 * 1e3, q8_bytes / (t_q8 * 1e-3) / 1e9, 100.0 * q8_bytes / (t_q8 * 1e-3) / probe);
    printf("  %s: %.1f us, %.1f GB/s = %.1f%% of probe\n", GPU_W_BF16 ? "bf16" : "fp16", t_w16 * 1e3, w16_bytes / (t_w16 * 1e-3) / 1e9,
           100.0 * w16_bytes / (t_w16 * 1e-3) / probe);
    printf("  Q8_0 / 16-bit time: %.3f (bytes: %.3f)\n", t_q8 / t_w16, q8_bytes / w16_bytes);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 6 && strcmp(argv[1], "check") == 0) {
        const int rows = atoi(argv[4]), K = atoi(argv[5]);
        if (rows < 1 || K < 32 || K % 32 || K > 65536) {
            fprintf(stderr, "cuda_format_test: ROWS >= 1, K a multiple of 32 up to 65536\n");
            return 2;
        }
        return check(argv[2], strtoull(argv[3], NULL, 10), rows, K);
    }
    if (argc == 4 && strcmp(argv[1], "bench") == 0) {
        const int rows = atoi(argv[2]), K = atoi(argv[3]);
        if (rows < 1 || K < 32 || K % 32 || K > 65536) {
            fprintf(stderr, "cuda_format_test: ROWS >= 1, K a multiple of 32 up to 65536\n");
            return 2;
        }
        return bench(rows, K);
    }
    fprintf(stderr, "usage: cuda_format_test check OUTDIR SEED ROWS K | bench ROWS K\n");
    return 2;
}
