/* cuda_format_test.cu - the quantized weight formats through the decode step's matvec core: GGUF's
 * Q8_0, Q4_0, Q4_1, Q4_K, Q5_K and Q6_K (w_q8_0 ... w_q6_k: cuda_weights.cuh) in o_proj/down's body
 * (matvec_residual_body, its inputs staged as 16-bit integers: stage_xq), each against the gguf
 * package's dequantizer (the slow twin) and against the model's 16-bit format for speed.
 *
 *   cuda_format_test check FORMAT OUTDIR SEED ROWS K   FORMAT's blocks as a GGUF file holds them,
 *                                               repacked by the upload's kernel; out = x0 + W . in
 *                                               and W's weights by W::to_f32 (the embedding's
 *                                               lookup); writes weights.bin (the GGUF bytes),
 *                                               in.bin, x0.bin, out.bin, dequant.bin for
 *                                               tests/test_cuda_format.py to check against gguf's
 *                                               dequantizer and NumPy
 *   cuda_format_test bench FORMAT ROWS K        GB/s the same body reads, FORMAT against the
 *                                               model's 16-bit format on matrices of the same shape
 *                                               (four of them in turn: past L2), and the read probe
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
#include <type_traits>
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

/* w (rows, K) in fp32, a chunk a thread, as embed_body reads a row */
template <typename W>
static __global__ void dequant_kernel(typename W::mat w, float *out, int rows, int K) {
    const int chunks = K / W::VALS;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)rows * chunks; i += (size_t)gridDim.x * blockDim.x) {
        const int r = (int)(i / chunks), c = (int)(i % chunks);
        float f[W::VALS];
        W::to_f32(W::load(W::row(w, r, K), c), f);
        for (int j = 0; j < W::VALS; j++) out[(size_t)r * K + (size_t)c * W::VALS + j] = f[j];
    }
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

/* Where a format's fp16 scales lie in its GGUF block, and the size of its integers times its
 * block scale: GGUF's layouts (quant.h) */
struct block_scales {
    int d, dmin; /* byte offsets of d and of the minimum (-1: none) */
    double range; /* |q| times the largest sub-block scale the random bytes give */
};
template <typename W> static block_scales scales_of() {
    if constexpr (std::is_same_v<W, w_q8_0>) return {0, -1, 127.0};
    else if constexpr (std::is_same_v<W, w_q4_0>) return {0, -1, 8.0};
    else if constexpr (std::is_same_v<W, w_q4_1>) return {0, 2, 8.0};
    else if constexpr (std::is_same_v<W, w_q6_k>) return {208, -1, 32.0 * 127.0};
    else return {0, 2, (std::is_same_v<W, w_q5_k> ? 31.0 : 15.0) * 63.0};
}

/* rows x K / W::BLOCK blocks of format W as GGUF lays them out: random bytes (every integer and
 * sub-block scale the format holds), fp16 scales of order 1/(range sqrt(K)) and minimums of order
 * -8 (Q4_1) or 8 (K formats, subtracted) of them */
template <typename W>
static std::vector<uint8_t> gguf_blocks(int rows, int K) {
    const block_scales bs = scales_of<W>();
    const size_t blocks = (size_t)rows * (K / W::BLOCK);
    std::vector<uint8_t> b(blocks * W::BLOCK_BYTES);
    for (size_t i = 0; i < blocks; i++) {
        uint8_t *blk = &b[i * W::BLOCK_BYTES];
        for (int j = 0; j < W::BLOCK_BYTES; j++) blk[j] = (uint8_t)(next_u64() >> 56);
        const float d = (float)((0.5 + unit()) / (bs.range * sqrt((double)K)));
        const uint16_t dh = f32_to_f16_bits(d), mh = f32_to_f16_bits((W::BLOCK == 32 ? -8.0f : 8.0f) * d * (float)unit());
        memcpy(blk + bs.d, &dh, 2);
        if (bs.dmin >= 0) memcpy(blk + bs.dmin, &mh, 2);
    }
    return b;
}

/* The GGUF blocks on the device, repacked by the upload's own kernel (cuda_weights.cuh's repack) */
template <typename W>
static typename W::mat upload_blocks(const std::vector<uint8_t> &blocks, int rows, int K) {
    uint8_t *raw = NULL, *p = NULL;
    FC(cudaMalloc(&raw, blocks.size()));
    FC(cudaMalloc(&p, blocks.size()));
    FC(cudaMemcpy(raw, blocks.data(), blocks.size(), cudaMemcpyHostToDevice));
    FC(repack<W>(raw, p, blocks.size(), 0));
    FC(cudaDeviceSynchronize());
    FC(cudaFree(raw));
    return W::at(p, rows, K);
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

template <typename W>
static int check(const char *format, const char *dir, uint64_t seed, int rows, int K) {
    rng_state = seed;
    const std::vector<uint8_t> blocks = gguf_blocks<W>(rows, K);
    std::vector<float> in(K), x0(rows);
    /* inputs in blocks of 32 of magnitudes 1e-3 .. 10 (the blocks' integer scales differ), the first
     * block zero (stage_xq's dx = 0) */
    for (int b = 0; b < K / 32; b++) {
        const double mag = b == 0 ? 0.0 : pow(10.0, 4.0 * unit() - 3.0);
        for (int i = 0; i < 32; i++) in[32 * b + i] = (float)(mag * (2.0 * unit() - 1.0));
    }
    for (float &v : x0) v = (float)(2.0 * unit() - 1.0);
    const typename W::mat w = upload_blocks<W>(blocks, rows, K);
    float *din = upload_f32(in), *dout = upload_f32(x0);
    const int grid = prepare<W>(rows, K);
    residual_kernel<W><<<grid, MV_THREADS, MV_SMEM_BYTES(K)>>>(w, din, dout, rows, K);
    FC(cudaGetLastError());
    FC(cudaDeviceSynchronize());
    std::vector<float> out(rows), deq((size_t)rows * K);
    FC(cudaMemcpy(out.data(), dout, rows * sizeof(float), cudaMemcpyDeviceToHost));
    float *ddeq = NULL;
    FC(cudaMalloc(&ddeq, deq.size() * sizeof(float)));
    dequant_kernel<W><<<256, 256>>>(w, ddeq, rows, K);
    FC(cudaGetLastError());
    FC(cudaMemcpy(deq.data(), ddeq, deq.size() * sizeof(float), cudaMemcpyDeviceToHost));
    const std::string d = dir;
    write_file(d + "/weights.bin", blocks.data(), blocks.size());
    write_file(d + "/in.bin", in.data(), in.size() * sizeof(float));
    write_file(d + "/x0.bin", x0.data(), x0.size() * sizeof(float));
    write_file(d + "/out.bin", out.data(), out.size() * sizeof(float));
    write_file(d + "/dequant.bin", deq.data(), deq.size() * sizeof(float));
    printf("check: %d x %d %s, grid %d\n", rows, K, format, grid);
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

template <typename W>
static int bench(const char *format, int rows, int K) {
    rng_state = 1;
    std::vector<float> in(K, 0.5f), x0(rows, 0.0f);
    float *din = upload_f32(in), *dout = upload_f32(x0);
    typename W::mat q[4];
    for (int i = 0; i < 4; i++) q[i] = upload_blocks<W>(gguf_blocks<W>(rows, K), rows, K);
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
    const double q_bytes = (double)rows * (K / W::BLOCK) * W::BLOCK_BYTES, w16_bytes = (double)rows * K * 2;
    const double t_q = time_body<W>(q, din, dout, rows, K), t_w16 = time_body<model_w>(w16, din, dout, rows, K);
    printf("bench: %s, %d x %d, read probe %.1f GB/s\n", name, rows, K, probe / 1e9);
    printf("  %s: %.1f us, %.1f GB/s = %.1f%% of probe\n", format, t_q * 1e3, q_bytes / (t_q * 1e-3) / 1e9,
           100.0 * q_bytes / (t_q * 1e-3) / probe);
    printf("  %s: %.1f us, %.1f GB/s = %.1f%% of probe\n", GPU_W_BF16 ? "bf16" : "fp16", t_w16 * 1e3, w16_bytes / (t_w16 * 1e-3) / 1e9,
           100.0 * w16_bytes / (t_w16 * 1e-3) / probe);
    printf("  %s / 16-bit time: %.3f (bytes: %.3f)\n", format, t_q / t_w16, q_bytes / w16_bytes);
    return 0;
}

/* mode(format) for the format named */
template <typename F>
static int for_format(const char *format, F mode) {
    if (strcmp(format, "Q8_0") == 0) return mode(w_q8_0{});
    if (strcmp(format, "Q4_0") == 0) return mode(w_q4_0{});
    if (strcmp(format, "Q4_1") == 0) return mode(w_q4_1{});
    if (strcmp(format, "Q4_K") == 0) return mode(w_q4_k{});
    if (strcmp(format, "Q5_K") == 0) return mode(w_q5_k{});
    if (strcmp(format, "Q6_K") == 0) return mode(w_q6_k{});
    fprintf(stderr, "cuda_format_test: format %s: expected Q8_0, Q4_0, Q4_1, Q4_K, Q5_K or Q6_K\n", format);
    return 2;
}

static bool shape_ok(int rows, int K, int block) {
    if (rows >= 1 && K >= block && K % block == 0 && K <= 65536) return true;
    fprintf(stderr, "cuda_format_test: ROWS >= 1, K a multiple of the format's block (%d) up to 65536\n", block);
    return false;
}

int main(int argc, char **argv) {
    if (argc == 7 && strcmp(argv[1], "check") == 0) {
        const int rows = atoi(argv[5]), K = atoi(argv[6]);
        return for_format(argv[2], [&](auto w) {
            using W = decltype(w);
            return shape_ok(rows, K, W::BLOCK) ? check<W>(argv[2], argv[3], strtoull(argv[4], NULL, 10), rows, K) : 2;
        });
    }
    if (argc == 5 && strcmp(argv[1], "bench") == 0) {
        const int rows = atoi(argv[3]), K = atoi(argv[4]);
        return for_format(argv[2], [&](auto w) {
            using W = decltype(w);
            return shape_ok(rows, K, W::BLOCK) ? bench<W>(argv[2], rows, K) : 2;
        });
    }
    fprintf(stderr, "usage: cuda_format_test check FORMAT OUTDIR SEED ROWS K | bench FORMAT ROWS K\n");
    return 2;
}
