/* fused_mlp.cu - can the MLP of a Llama-3.2-1B-shaped layer stream as one kernel, with no boundary
 * between gate/up and down? A question for the design, asked on the GPU machine before any change to
 * the generated step.
 *
 * The decode step runs gate/up (+ SiLU) and down (+ residual) as two kernels: down needs every hidden
 * value before its first product, so its grid waits for gate/up's (programmatic dependent launch),
 * stages the 8,192 values and only then multiplies. On the 1B that boundary costs ~2.5 us a layer
 * beyond down's bytes (traced; docs/performance.md, D64). Here the MLP is one
 * kernel: a block takes a range of hidden units; for a batch of them its warps compute the hidden
 * values (a warp a unit: its gate and up rows, as the decode gate/up does) while the rows of down's
 * transpose for the same units land in shared memory on the bulk-copy engine; then each warp
 * multiplies a slice of the output columns by the batch's hidden values. A block ends with a partial
 * sum of every output, and the blocks' partials meet in L2 (red.global.add.v4.f32; a form that put
 * down inside the gate/up kernel lost ~2 us a layer to 264 reductions an address, and loaded down's
 * rows only after its hidden values: docs/performance.md, D29). Measured (D64): the partials
 * summed in a thread-block cluster through distributed shared memory before L2 lost, because
 * clusters of 8 (16) held only 120 (112) of the 132 SMs; so the blocks here reduce directly.
 * Compared in one program, 16 layers of distinct random bf16 weights chained (each layer's input is
 * the last one's output, launched with programmatic dependent launch in a CUDA graph):
 *   probe     the read probe of runtime/probe_cuda.cu (grid-stride, 4 x 512 threads an SM);
 *   split     gate/up then down, two kernels a layer in the decode step's pattern (a warp a pair of
 *             rows / a row, its first loads before griddepcontrol.wait, the input staged in shared
 *             memory after it; down's steps double-buffered), simpler than the generated kernels
 *             (which add cp.async steps, lots and polling);
 *   fused     the kernel above, by block size, slots and tiles issued before the wait, with the
 *             reductions or plain stores in their place ("stores": wrong outputs, what the
 *             reductions cost);
 *   layer     a layer without attention, QKV (pairs of rows, as gate/up) and o_proj (as down, rows
 *             of 2048) before the MLP, split or fused: the MLP beside the decode step's neighbours.
 *             Measured: fused gains 2.4 us a layer here too, so these chains do not show what cost
 *             it in the step (attention's boundary, and its block's landing at o_proj's end, which
 *             the bulk-copied input and the uniform carveout answered: docs/performance.md, D64, D65);
 *   smem      fused, its gate and up rows through shared memory too (bulk copies, as down's), so
 *             that a block holds <= 64 registers a thread and one of QKV's blocks fits beside it.
 *             Measured: it loses alone, ~0.5 us a stage beyond its bytes (bulk copies do not
 *             stream as the registers' loads do).
 * Checked: layer 0 of both forms against a double-precision host reference, and the 16 layers'
 * outputs of the two forms against each other (relative error printed; the reductions' order is not
 * fixed, so the fused outputs differ between runs in their last bits).
 *
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a tests/bench/fused_mlp.cu -o build/fused_mlp
 *   build/fused_mlp             (on the GPU machine) */
#include "bench_common.cuh"
#include "../../runtime/cuda_transpose.cuh" /* transpose_words_kernel: down_proj's transpose */

#include <math.h>
#include <string.h>

#include <vector>

constexpr int D = 2048, H = 8192, L = 16;
constexpr int DCH = D / 8;    /* 16-byte chunks of a row of D */
constexpr int LCH = DCH / 32; /* chunks of a row of D a lane holds */
constexpr float EPS = 1e-5f;
constexpr size_t MAT = (size_t)H * D; /* elements of one layer's matrix */

__device__ __forceinline__ float bf_lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf_hi(uint32_t u) { return __uint_as_float(u & 0xFFFF0000u); }
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    return v;
}
__device__ __forceinline__ float silu(float v) { return v / (1.0f + __expf(-v)); }

__device__ __forceinline__ uint32_t hash32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x846CA68Bu;
    x ^= x >> 16;
    return x;
}

/* bf16 values uniform in [-scale, scale) (truncated from fp32) */
__global__ void fill_bf16_kernel(uint16_t *p, size_t n, uint32_t seed, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float v = ((float)(hash32((uint32_t)i * 2654435761u ^ seed) >> 8) * (1.0f / 16777216.0f) - 0.5f) * 2.0f * scale;
        p[i] = (uint16_t)(__float_as_uint(v) >> 16);
    }
}

// ---------------------------------------------------------------------------------------------
// Shared by both forms: the input staged in shared memory in halves (chunk c's x[8c..8c+3] at
// float4 c, x[8c+4..8c+7] at DCH + c: a warp's lanes read consecutive float4s), and its RMS scale.

/* fixed point (FIXED): a value v as the int64 v * 2^32, which adds exactly in any order */
#define FIX_ONE 4294967296.0f
__device__ __forceinline__ float4 fix4_ld(const long long *p) {
    const longlong2 a = __ldcg(reinterpret_cast<const longlong2 *>(p)), b = __ldcg(reinterpret_cast<const longlong2 *>(p) + 1);
    return make_float4(__ll2float_rn(a.x) / FIX_ONE, __ll2float_rn(a.y) / FIX_ONE, __ll2float_rn(b.x) / FIX_ONE,
                       __ll2float_rn(b.y) / FIX_ONE);
}
template <bool FIXED = false>
__device__ __forceinline__ float4 x4_ld(const float *x, int i4) {
    if constexpr (FIXED) return fix4_ld(reinterpret_cast<const long long *>(x) + 4 * i4);
    else return __ldcg(reinterpret_cast<const float4 *>(x) + i4);
}

template <bool FIXED = false>
__device__ float stage_x(float4 *sx4, float *red, const float *x) {
    float ss = 0.0f;
    for (int c = threadIdx.x; c < DCH; c += blockDim.x) {
        const float4 a = x4_ld<FIXED>(x, 2 * c), b = x4_ld<FIXED>(x, 2 * c + 1);
        sx4[c] = a;
        sx4[DCH + c] = b;
        ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w + b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
    }
    ss = warp_sum(ss);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = ss;
    __syncthreads();
    float t = 0.0f;
    for (int i = 0; i < (int)blockDim.x / 32; i++) t += red[i];
    return rsqrtf(t / D + EPS);
}

__device__ __forceinline__ void load_row(uint4 w[LCH], const uint16_t *row, int lane) {
#pragma unroll
    for (int j = 0; j < LCH; j++) w[j] = __ldcs(reinterpret_cast<const uint4 *>(row) + j * 32 + lane);
}

/* a lane's parts of two rows . x at once: each staged float4 read once for both */
__device__ __forceinline__ float2 dot_pair(const uint4 a[LCH], const uint4 b[LCH], const float4 *sx4, int lane) {
    float sa = 0.0f, sb = 0.0f;
#pragma unroll
    for (int j = 0; j < LCH; j++) {
        const int c = j * 32 + lane;
        const float4 p = sx4[c], q = sx4[DCH + c];
        sa += bf_lo(a[j].x) * p.x + bf_hi(a[j].x) * p.y + bf_lo(a[j].y) * p.z + bf_hi(a[j].y) * p.w + bf_lo(a[j].z) * q.x +
              bf_hi(a[j].z) * q.y + bf_lo(a[j].w) * q.z + bf_hi(a[j].w) * q.w;
        sb += bf_lo(b[j].x) * p.x + bf_hi(b[j].x) * p.y + bf_lo(b[j].y) * p.z + bf_hi(b[j].y) * p.w + bf_lo(b[j].z) * q.x +
              bf_hi(b[j].z) * q.y + bf_lo(b[j].w) * q.z + bf_hi(b[j].w) * q.w;
    }
    return make_float2(sa, sb);
}

// ---------------------------------------------------------------------------------------------
// split: gate/up (a warp a pair of rows), then down (a warp a row of H, 4 steps of 8 chunks a lane,
// double-buffered), two blocks of 256 threads an SM each. The same two kernels are the layer
// chains' QKV (pairs of adjacent rows, no SiLU) and o_proj (rows of D, one step).

/* pairs [0, pairs) of rows wa + p stride, wb + p stride dotted with the staged, normed x: SILU,
 * out[p] = silu(a) * b (gate/up); else out[2p], out[2p + 1] = a, b (QKV's rows) */
template <bool SILU>
__global__ void __launch_bounds__(256, 2) pair_kernel(const uint16_t *wa, const uint16_t *wb, size_t stride, int pairs, const float *x,
                                                      float *out) {
    __shared__ float4 sx4[2 * DCH];
    __shared__ float red[32];
    const int lane = threadIdx.x % 32, G = gridDim.x * (blockDim.x / 32);
    int p = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    uint4 a[LCH], b[LCH];
    if (p < pairs) {
        load_row(a, wa + (size_t)p * stride, lane);
        load_row(b, wb + (size_t)p * stride, lane);
    }
    pdl_wait();
    const float scale = stage_x(sx4, red, x);
    pdl_trigger();
    for (bool first = true; p < pairs; p += G, first = false) {
        if (!first) {
            load_row(a, wa + (size_t)p * stride, lane);
            load_row(b, wb + (size_t)p * stride, lane);
        }
        const float2 d = dot_pair(a, b, sx4, lane);
        const float g = warp_sum(d.x) * scale, u = warp_sum(d.y) * scale;
        if (lane == 0) {
            if (SILU) out[p] = silu(g) * u;
            else out[2 * p] = g, out[2 * p + 1] = u;
        }
    }
}

__device__ __forceinline__ void load_step8(uint4 w[8], const uint16_t *row, int step, int lane) {
#pragma unroll
    for (int j = 0; j < 8; j++) w[j] = __ldcs(reinterpret_cast<const uint4 *>(row) + (step * 8 + j) * 32 + lane);
}

/* x_out[r] = x_in[r] + w[r] . in for the D rows of K (down: K = H; o_proj: K = D), in place where
 * x_out is x_in (a row's warp reads its residual before it writes it); o_proj at <= 64 registers
 * (its one step fits), as the engine's, so that what fits beside its blocks is what would there */
template <int K>
__global__ void __launch_bounds__(256, K == D ? 4 : 2) res_kernel(const uint16_t *w, const float *in, const float *x_in, float *x_out) {
    constexpr int KCH = K / 8, STEPS = KCH / (32 * 8); /* steps of 8 chunks a lane */
    static_assert(STEPS >= 1 && KCH % (32 * 8) == 0, "rows of whole steps");
    __shared__ float4 sh4[2 * KCH];
    const int lane = threadIdx.x % 32, G = gridDim.x * (blockDim.x / 32);
    int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    uint4 buf[2][8]; /* steps s and s + 1 in flight: the dot of one, the loads of the other */
    auto first_loads = [&](const uint16_t *row) {
        load_step8(buf[0], row, 0, lane);
        if (STEPS > 1) load_step8(buf[1], row, 1, lane);
    };
    if (r < D) first_loads(w + (size_t)r * K);
    pdl_wait();
    for (int c = threadIdx.x; c < KCH; c += blockDim.x) {
        sh4[c] = __ldcg(reinterpret_cast<const float4 *>(in) + 2 * c);
        sh4[KCH + c] = __ldcg(reinterpret_cast<const float4 *>(in) + 2 * c + 1);
    }
    __syncthreads();
    pdl_trigger();
    for (bool first = true; r < D; r += G, first = false) {
        const uint16_t *row = w + (size_t)r * K;
        if (!first) first_loads(row);
        float acc = 0.0f;
#pragma unroll
        for (int s = 0; s < STEPS; s++) {
            const uint4 *q = buf[s % 2];
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int c = (s * 8 + j) * 32 + lane;
                const float4 a = sh4[c], b = sh4[KCH + c];
                acc += bf_lo(q[j].x) * a.x + bf_hi(q[j].x) * a.y + bf_lo(q[j].y) * a.z + bf_hi(q[j].y) * a.w + bf_lo(q[j].z) * b.x +
                       bf_hi(q[j].z) * b.y + bf_lo(q[j].w) * b.z + bf_hi(q[j].w) * b.w;
            }
            if (s + 2 < STEPS) load_step8(buf[s % 2], row, s + 2, lane);
        }
        acc = warp_sum(acc);
        if (lane == 0) x_out[r] = x_in[r] + acc;
    }
}

// ---------------------------------------------------------------------------------------------
// fused: blocks of WARPS warps (16: one an SM; 8: two). Block b takes hidden units [u0, u1), in
// batches of WARPS (a unit a warp); batch k's rows of down's transpose (WARPS x D bf16, contiguous)
// land in slot k % SLOTS of shared memory on the bulk-copy engine, SLOTS batches ahead (PRE of them
// issued before the wait, the rest after it). A warp's gate and up rows of batch k + 1 are loaded as
// soon as it has multiplied batch k's, so they are in flight under the batch's down phase, where
// each warp multiplies D / WARPS output columns (4 or 8 a lane) by the batch's hidden values.

template <int WARPS>
constexpr size_t tile_bytes() { return (size_t)WARPS * D * 2; }

__device__ __forceinline__ void red_add4(float *p, float4 v) {
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
}

template <bool REDUCE, int SLOTS, int WARPS, int PRE = SLOTS, bool FIXED = false>
__global__ void __launch_bounds__(WARPS * 32, 16 / WARPS)
    fused_mlp_kernel(const uint16_t *wg, const uint16_t *wu, const uint16_t *wdt, const float *x_in, float *x_out, float *zero) {
    constexpr int NB = WARPS, THREADS = WARPS * 32, CPL = D / WARPS / 32; /* output columns a lane owns */
    static_assert(CPL == 4 || CPL == 8, "a lane owns 4 or 8 output columns");
    static_assert(PRE >= 1 && PRE <= SLOTS, "PRE: 1 .. SLOTS tiles before the wait");
    extern __shared__ __align__(128) uint8_t smem[];
    uint16_t *tiles = reinterpret_cast<uint16_t *>(smem);
    __shared__ float4 sx4[2 * DCH];
    __shared__ float red[32], hs[NB];
    __shared__ __align__(8) uint64_t bar[SLOTS];
    const int tid = threadIdx.x, lane = tid % 32, w = tid / 32, G = gridDim.x, b = blockIdx.x;
    const int u0 = (int)((long)b * H / G), n = (int)((long)(b + 1) * H / G) - u0, nb = (n + NB - 1) / NB;
    auto rows_of = [&](int k) { return min(NB, n - k * NB); };
    auto issue_tile = [&](int k) {
        bulk_copy(tiles + (size_t)(k % SLOTS) * NB * D, wdt + (size_t)(u0 + k * NB) * D, (uint32_t)rows_of(k) * D * 2, &bar[k % SLOTS]);
    };
    if (tid == 0) {
        for (int i = 0; i < SLOTS; i++) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(&bar[i])) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        for (int k = 0; k < PRE && k < nb; k++) issue_tile(k);
    }
    uint4 a[LCH], c[LCH];
    if (w < rows_of(0)) {
        load_row(a, wg + (size_t)(u0 + w) * D, lane);
        load_row(c, wu + (size_t)(u0 + w) * D, lane);
    }
    pdl_wait();
    if (tid == 0)
        for (int k = PRE; k < SLOTS && k < nb; k++) issue_tile(k);
    /* the buffer the next layer adds into: the last layer's input, read by nobody past this wait */
    for (int i = b * THREADS + tid; i < D; i += G * THREADS) {
        if (FIXED) reinterpret_cast<long long *>(zero)[i] = 0;
        else zero[i] = 0.0f;
    }
    const float scale = stage_x<FIXED>(sx4, red, x_in); /* its barrier also publishes the mbarriers' init */
    pdl_trigger();
    const int col = w * (D / WARPS) + lane * CPL;
    float acc[CPL];
#pragma unroll
    for (int e = 0; e < CPL; e++) acc[e] = 0.0f;
    for (int k = 0; k < nb; k++) {
        const int rows = rows_of(k);
        float hv = 0.0f;
        if (w < rows) {
            const float2 d = dot_pair(a, c, sx4, lane);
            const float g = warp_sum(d.x), u = warp_sum(d.y);
            hv = silu(g * scale) * (u * scale);
        }
        if (k + 1 < nb && w < rows_of(k + 1)) {
            load_row(a, wg + (size_t)(u0 + (k + 1) * NB + w) * D, lane);
            load_row(c, wu + (size_t)(u0 + (k + 1) * NB + w) * D, lane);
        }
        if (lane == 0) hs[w] = hv;
        __syncthreads(); /* the batch's hidden values */
        bar_wait(&bar[k % SLOTS], (uint32_t)(k / SLOTS) % 2);
        const uint16_t *t = tiles + (size_t)(k % SLOTS) * NB * D + col;
#pragma unroll 4
        for (int r = 0; r < rows; r++) {
            const float hr = hs[r];
            uint32_t v[CPL / 2];
            if constexpr (CPL == 4) {
                const uint2 q = *reinterpret_cast<const uint2 *>(t + (size_t)r * D);
                v[0] = q.x, v[1] = q.y;
            } else {
                const uint4 q = *reinterpret_cast<const uint4 *>(t + (size_t)r * D);
                v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
            }
#pragma unroll
            for (int e = 0; e < CPL / 2; e++) {
                acc[2 * e] += hr * bf_lo(v[e]);
                acc[2 * e + 1] += hr * bf_hi(v[e]);
            }
        }
        __syncthreads(); /* the slot and hs are free */
        if (tid == 0 && k + SLOTS < nb) {
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            issue_tile(k + SLOTS);
        }
    }
#pragma unroll
    for (int e = 0; e < CPL; e += 4) {
        if constexpr (FIXED) { /* exact sums: the result does not depend on the reductions' order */
            long long *xo = reinterpret_cast<long long *>(x_out) + col + e;
            const long long *xi = reinterpret_cast<const long long *>(x_in) + col + e;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                unsigned long long q = (unsigned long long)__float2ll_rn(acc[e + i] * FIX_ONE);
                if (b == 0) q += (unsigned long long)__ldcg(xi + i); /* the residual, once, as it is */
                if (REDUCE) atomicAdd(reinterpret_cast<unsigned long long *>(xo + i), q);
                else xo[i] = (long long)q;
            }
        } else {
            float4 v = make_float4(acc[e], acc[e + 1], acc[e + 2], acc[e + 3]);
            if (b == 0) { /* the residual, once */
                const float4 r = __ldcg(reinterpret_cast<const float4 *>(x_in + col + e));
                v.x += r.x, v.y += r.y, v.z += r.z, v.w += r.w;
            }
            if (REDUCE) red_add4(x_out + col + e, v);
            else *reinterpret_cast<float4 *>(x_out + col + e) = v;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// fused, every row through shared memory ("smem"): one block of 16 warps an SM that leaves room
// beside it for a QKV block (<= 64 registers a thread: __launch_bounds__(512, 2); 3 x NB x D x 2
// bytes a slot). Stage k is NB hidden units: their gate, up and down-transpose rows (each NB x D
// bf16, contiguous) land in slot k % SLOTS by three bulk copies (gate and up on one mbarrier, down
// on another), SLOTS stages ahead, PRE of them issued before the wait. A unit's gate and up dots are
// split over WPU = 16 / NB warps, each a fixed range of the row whose normed input it holds in
// registers (staged once); their partial sums meet in shared memory, and past one block barrier a
// stage every thread multiplies its 4 output columns by the stage's NB hidden values. The barrier
// also frees the slot of stage k - 1 (its down rows were read before it), which takes stage
// k - 1 + SLOTS.

template <int NB, int SLOTS, int PRE>
__global__ void __launch_bounds__(512, 2)
    smem_mlp_kernel(const uint16_t *wg, const uint16_t *wu, const uint16_t *wdt, const float *x_in, float *x_out, float *zero) {
    constexpr int WARPS = 16, THREADS = WARPS * 32, WPU = WARPS / NB; /* warps a unit */
    constexpr int QCH = DCH / WPU, LQ = QCH / 32;                     /* chunks of a row a warp, a lane dots */
    constexpr int ROWS = NB * D;                                      /* elements of a stage's rows of one matrix */
    static_assert(WARPS % NB == 0 && LQ >= 1 && QCH % 32 == 0, "NB: 1, 2, 4 or 8 units a stage");
    static_assert(PRE >= 1 && PRE <= SLOTS && SLOTS >= 2, "PRE: 1 .. SLOTS stages before the wait");
    static_assert(D == 4 * THREADS, "a thread owns 4 output columns");
    extern __shared__ __align__(128) uint8_t smem[];
    uint16_t *slots = reinterpret_cast<uint16_t *>(smem);
    __shared__ float4 sx4[2 * DCH];
    __shared__ float red[32];
    __shared__ float2 part[2][NB][WPU];
    __shared__ __align__(8) uint64_t bar_gu[SLOTS], bar_d[SLOTS];
    const int tid = threadIdx.x, lane = tid % 32, w = tid / 32, G = gridDim.x, b = blockIdx.x;
    const int j = w / WPU, q = w % WPU; /* this warp's unit of a stage, its range of the rows */
    const int u0 = (int)((long)b * H / G), n = (int)((long)(b + 1) * H / G) - u0, ns = (n + NB - 1) / NB;
    auto rows_of = [&](int k) { return min(NB, n - k * NB); };
    auto issue = [&](int k) {
        uint16_t *s = slots + (size_t)(k % SLOTS) * 3 * ROWS;
        const size_t at = (size_t)(u0 + k * NB) * D;
        const uint32_t bytes = (uint32_t)rows_of(k) * D * 2;
        bulk_copy(s, wg + at, bytes, &bar_gu[k % SLOTS]);
        bulk_copy(s + ROWS, wu + at, bytes, &bar_gu[k % SLOTS]);
        bulk_copy(s + 2 * ROWS, wdt + at, bytes, &bar_d[k % SLOTS]);
    };
    if (tid == 0) {
        for (int i = 0; i < SLOTS; i++) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 2;" ::"r"(saddr(&bar_gu[i])) : "memory");
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(&bar_d[i])) : "memory");
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        for (int k = 0; k < PRE && k < ns; k++) issue(k);
    }
    pdl_wait();
    if (tid == 0)
        for (int k = PRE; k < SLOTS && k < ns; k++) issue(k);
    for (int i = b * THREADS + tid; i < D; i += G * THREADS) zero[i] = 0.0f; /* the buffer the next layer adds into */
    const float scale = stage_x(sx4, red, x_in); /* its barrier also publishes the mbarriers' init */
    pdl_trigger();
    float4 xr[LQ][2]; /* the input of this warp's range, chunk c's 8 values */
#pragma unroll
    for (int i = 0; i < LQ; i++) {
        const int c = q * QCH + i * 32 + lane;
        xr[i][0] = sx4[c], xr[i][1] = sx4[DCH + c];
    }
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int k = 0; k < ns; k++) {
        const int rows = rows_of(k);
        const uint16_t *s = slots + (size_t)(k % SLOTS) * 3 * ROWS;
        const uint32_t parity = (uint32_t)(k / SLOTS) % 2;
        if (j < rows) {
            bar_wait(&bar_gu[k % SLOTS], parity);
            const uint4 *gr = reinterpret_cast<const uint4 *>(s + (size_t)j * D), *ur = reinterpret_cast<const uint4 *>(s + ROWS + (size_t)j * D);
            float sg = 0.0f, su = 0.0f;
#pragma unroll
            for (int i = 0; i < LQ; i++) {
                const int c = q * QCH + i * 32 + lane;
                const uint4 a = gr[c], e = ur[c];
                const float4 p = xr[i][0], r = xr[i][1];
                sg += bf_lo(a.x) * p.x + bf_hi(a.x) * p.y + bf_lo(a.y) * p.z + bf_hi(a.y) * p.w + bf_lo(a.z) * r.x + bf_hi(a.z) * r.y +
                      bf_lo(a.w) * r.z + bf_hi(a.w) * r.w;
                su += bf_lo(e.x) * p.x + bf_hi(e.x) * p.y + bf_lo(e.y) * p.z + bf_hi(e.y) * p.w + bf_lo(e.z) * r.x + bf_hi(e.z) * r.y +
                      bf_lo(e.w) * r.z + bf_hi(e.w) * r.w;
            }
            sg = warp_sum(sg), su = warp_sum(su);
            if (lane == 0) part[k % 2][j][q] = make_float2(sg, su);
        }
        __syncthreads(); /* the stage's partial sums; stage k - 1's slot is free */
        if (tid == 0 && k >= 1 && k - 1 + SLOTS < ns) {
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            issue(k - 1 + SLOTS);
        }
        float hv[NB];
#pragma unroll
        for (int r = 0; r < NB; r++) {
            float g = 0.0f, u = 0.0f;
#pragma unroll
            for (int t = 0; t < WPU; t++) g += part[k % 2][r][t].x, u += part[k % 2][r][t].y;
            hv[r] = r < rows ? silu(g * scale) * (u * scale) : 0.0f;
        }
        bar_wait(&bar_d[k % SLOTS], parity);
        const uint16_t *dr = s + 2 * ROWS + 4 * tid;
#pragma unroll
        for (int r = 0; r < NB; r++) {
            if (r < rows) {
                const uint2 v = *reinterpret_cast<const uint2 *>(dr + (size_t)r * D);
                acc[0] += hv[r] * bf_lo(v.x), acc[1] += hv[r] * bf_hi(v.x), acc[2] += hv[r] * bf_lo(v.y), acc[3] += hv[r] * bf_hi(v.y);
            }
        }
    }
    const int col = 4 * tid;
    float4 v = make_float4(acc[0], acc[1], acc[2], acc[3]);
    if (b == 0) { /* the residual, once */
        const float4 r = __ldcg(reinterpret_cast<const float4 *>(x_in + col));
        v.x += r.x, v.y += r.y, v.z += r.z, v.w += r.w;
    }
    red_add4(x_out + col, v);
}

// ---------------------------------------------------------------------------------------------
// host

constexpr int QKV_ROWS = 3072;                  /* the 1B's q, k and v rows */
constexpr size_t QKV_MAT = (size_t)QKV_ROWS * D, O_MAT = (size_t)D * D;
/* dynamic shared memory the layer chains' QKV blocks hold unused, so that with the 8 KB of their
 * staged input they hold the engine's 40 KB (its input and one step of cp.async copies a warp):
 * what lands beside an MLP block here is what would in the step */
constexpr size_t QKV_PAD = 32 * 1024;

struct weights {
    uint16_t *g, *u, *dt, *d; /* (L, H, D) gate, up, down's transpose; (L, D, H) down */
    uint16_t *qkv, *o;        /* the layer chains': (L, QKV_ROWS, D), (L, D, D) */
};

/* a launch as the decode step's: a programmatic dependent of the one before it */
template <typename K, typename... Args>
static void launch(K kernel, int grid, int threads, size_t smem, cudaStream_t st, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &at;
    cfg.numAttrs = 1;
    CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

/* kinds: the MLP alone, split or fused; a layer without attention (QKV, o_proj, then the MLP), split
 * or fused, so that the MLP has the decode step's neighbours: QKV's blocks after it, o_proj's before */
enum { MLP_SPLIT, MLP_FUSED, LAYER_SPLIT, LAYER_FUSED };

struct variant {
    const char *name;
    int kind;
    void (*fused)(const uint16_t *, const uint16_t *, const uint16_t *, const float *, float *, float *);
    int grid;   /* blocks */
    int threads;
    size_t smem;
    bool fixed; /* the chain's vectors in fixed point */
};

static int sms;
static float *xbuf, *hbuf, *qbuf; /* xbuf: 3 rotating vectors of D, floats or (fixed) int64 */

static float *vec(const variant &v, int i) { return xbuf + (size_t)(i % 3) * D * (v.fixed ? 2 : 1); }

static void upload(const variant &v, int i, const std::vector<float> &x) {
    if (!v.fixed) {
        CHECK(cudaMemcpy(vec(v, i), x.data(), D * sizeof(float), cudaMemcpyHostToDevice));
        return;
    }
    std::vector<long long> q(D);
    for (int k = 0; k < D; k++) q[k] = llrint((double)x[k] * 4294967296.0);
    CHECK(cudaMemcpy(vec(v, i), q.data(), D * sizeof(long long), cudaMemcpyHostToDevice));
}

static std::vector<float> download(const variant &v, int i) {
    std::vector<float> x(D);
    if (!v.fixed) {
        CHECK(cudaMemcpy(x.data(), vec(v, i), D * sizeof(float), cudaMemcpyDeviceToHost));
        return x;
    }
    std::vector<long long> q(D);
    CHECK(cudaMemcpy(q.data(), vec(v, i), D * sizeof(long long), cudaMemcpyDeviceToHost));
    for (int k = 0; k < D; k++) x[k] = (float)((double)q[k] / 4294967296.0);
    return x;
}

/* where the chain's vector is after n layers: the split layers update one buffer in place */
static int out_index(const variant &v, int n) { return v.kind == LAYER_SPLIT ? 0 : n; }

/* layers 0 .. n - 1 of the chain */
static void enqueue(const variant &v, const weights &w, cudaStream_t st, int n = L) {
    for (int l = 0; l < n; l++) {
        float *in = vec(v, l), *out = vec(v, l + 1), *zero = vec(v, l + 2);
        const size_t o = (size_t)l * MAT;
        if (v.kind == LAYER_SPLIT) in = out = vec(v, 0);
        if (v.kind == LAYER_SPLIT || v.kind == LAYER_FUSED) { /* QKV, then o_proj on its first D outputs, in place */
            const uint16_t *wq = w.qkv + (size_t)l * QKV_MAT;
            launch(pair_kernel<false>, 2 * sms, 256, QKV_PAD, st, wq, wq + D, (size_t)2 * D, QKV_ROWS / 2, (const float *)in, qbuf);
            launch(res_kernel<D>, 2 * sms, 256, 0, st, (const uint16_t *)(w.o + (size_t)l * O_MAT), (const float *)qbuf,
                   (const float *)in, in);
        }
        if (v.kind == MLP_SPLIT || v.kind == LAYER_SPLIT) {
            launch(pair_kernel<true>, 2 * sms, 256, 0, st, (const uint16_t *)(w.g + o), (const uint16_t *)(w.u + o), (size_t)D, H,
                   (const float *)in, hbuf);
            launch(res_kernel<H>, 2 * sms, 256, 0, st, (const uint16_t *)(w.d + o), (const float *)hbuf, (const float *)in, out);
        } else {
            launch(v.fused, v.grid, v.threads, v.smem, st, (const uint16_t *)(w.g + o), (const uint16_t *)(w.u + o),
                   (const uint16_t *)(w.dt + o), (const float *)in, out, zero);
        }
    }
}

/* the chain's 16 outputs from x0 (the first layer's target zeroed first) */
static std::vector<float> run_once(const variant &v, const weights &w, const std::vector<float> &x0, cudaStream_t st, int n) {
    upload(v, 0, x0);
    CHECK(cudaMemset(vec(v, 1), 0, D * (v.fixed ? 8 : 4)));
    enqueue(v, w, st, n);
    CHECK(cudaStreamSynchronize(st));
    CHECK(cudaGetLastError());
    return download(v, out_index(v, n));
}

static double rel_err(const std::vector<float> &a, const std::vector<double> &ref) {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        num += (a[i] - ref[i]) * (a[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / den);
}

static float bf2f(uint16_t u) {
    uint32_t v = (uint32_t)u << 16;
    float f;
    memcpy(&f, &v, 4);
    return f;
}

/* layer 0 on the host in double precision */
static std::vector<double> reference_layer0(const weights &w, const std::vector<float> &x0) {
    std::vector<uint16_t> g(MAT), u(MAT), dt(MAT);
    CHECK(cudaMemcpy(g.data(), w.g, MAT * 2, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(u.data(), w.u, MAT * 2, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(dt.data(), w.dt, MAT * 2, cudaMemcpyDeviceToHost));
    double ss = 0;
    for (float v : x0) ss += (double)v * v;
    const double scale = 1.0 / sqrt(ss / D + EPS);
    std::vector<double> out(x0.begin(), x0.end());
    for (int i = 0; i < H; i++) {
        double gs = 0, us = 0;
        for (int k = 0; k < D; k++) {
            gs += bf2f(g[(size_t)i * D + k]) * (double)x0[k];
            us += bf2f(u[(size_t)i * D + k]) * (double)x0[k];
        }
        gs *= scale;
        us *= scale;
        const double hv = gs / (1.0 + exp(-gs)) * us;
        for (int k = 0; k < D; k++) out[k] += hv * bf2f(dt[(size_t)i * D + k]);
    }
    return out;
}

int main(void) {
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    sms = prop.multiProcessorCount;
    const size_t bytes = 4 * (size_t)L * MAT * 2;
    uint16_t *all;
    CHECK(cudaMalloc(&all, bytes));
    weights w = {all, all + L * MAT, all + 2 * L * MAT, all + 3 * L * MAT};
    fill_bf16_kernel<<<sms * 8, 256>>>(w.g, 2 * L * MAT, 1u, 0.02f);
    fill_bf16_kernel<<<sms * 8, 256>>>(w.dt, L * MAT, 2u, 0.01f);
    for (int l = 0; l < L; l++) transpose_words_kernel<<<dim3(D / 32, H / 32), dim3(32, 8)>>>(w.dt + l * MAT, w.d + l * MAT, H, D);
    CHECK(cudaMalloc(&xbuf, 3 * D * sizeof(long long)));
    CHECK(cudaMalloc(&hbuf, H * sizeof(float)));
    CHECK(cudaMalloc(&qbuf, QKV_ROWS * sizeof(float)));
    CHECK(cudaMalloc(&w.qkv, (size_t)L * (QKV_MAT + O_MAT) * 2));
    w.o = w.qkv + (size_t)L * QKV_MAT;
    fill_bf16_kernel<<<sms * 8, 256>>>(w.qkv, (size_t)L * (QKV_MAT + O_MAT), 3u, 0.02f);
    unsigned *sink;
    CHECK(cudaMalloc(&sink, sizeof(unsigned)));
    CHECK(cudaDeviceSynchronize());
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

#define FUSED(REDUCE, SLOTS, WARPS, PRE, FIXED) \
    fused_mlp_kernel<REDUCE, SLOTS, WARPS, PRE, FIXED>, sms * 16 / WARPS, WARPS * 32, SLOTS * tile_bytes<WARPS>(), FIXED
#define SMEM(NB, SLOTS, PRE) smem_mlp_kernel<NB, SLOTS, PRE>, sms, 512, (size_t)(SLOTS) * 3 * (NB) * D * 2, false
    std::vector<variant> vs = {
        {"split (gate/up, down)", MLP_SPLIT, nullptr, 0, 0, 0, false},
        {"fused 16 warps, 2 slots", 1, FUSED(true, 2, 16, 2, false)},
        {"fused 16 warps, 2 slots, stores", 1, FUSED(false, 2, 16, 2, false)},
        {"fused 16 warps, 2 slots, 1 early", 1, FUSED(true, 2, 16, 1, false)},
        {"fused 16 warps, 2 slots, fixed", 1, FUSED(true, 2, 16, 2, true)},
        {"fused 16 warps, 2 slots, fixed, st", 1, FUSED(false, 2, 16, 2, true)},
        {"fused 8 warps, 2 slots", 1, FUSED(true, 2, 8, 2, false)},
        {"fused 8 warps, 2 slots, stores", 1, FUSED(false, 2, 8, 2, false)},
        {"fused 8 warps, 2 slots, 1 early", 1, FUSED(true, 2, 8, 1, false)},
        {"fused 8 warps, 2 slots, fixed", 1, FUSED(true, 2, 8, 2, true)},
        {"fused 8 warps, 3 slots", 1, FUSED(true, 3, 8, 3, false)},
        {"fused 8 warps, 3 slots, 1 early", 1, FUSED(true, 3, 8, 1, false)},
        {"smem 4 units x 3 slots, 1 early", 1, SMEM(4, 3, 1)},
        {"smem 4 units x 3 slots, 2 early", 1, SMEM(4, 3, 2)},
        {"smem 2 units x 6 slots, 2 early", 1, SMEM(2, 6, 2)},
        {"smem 2 units x 6 slots, 4 early", 1, SMEM(2, 6, 4)},
        {"smem 8 units x 2 slots, 1 early", 1, SMEM(8, 2, 1)},
        {"layer: QKV, o_proj, split MLP", LAYER_SPLIT, nullptr, 0, 0, 0, false},
        {"layer: QKV, o_proj, fused MLP", LAYER_FUSED, FUSED(true, 2, 16, 1, false)},
        {"layer: smem MLP 4 x 3, 1 early", LAYER_FUSED, SMEM(4, 3, 1)},
        {"layer: smem MLP 2 x 6, 2 early", LAYER_FUSED, SMEM(2, 6, 2)},
    };
    printf("%s, %d SMs; %d layers of a %d x %d MLP (bf16), %.1f MB a layer\n", prop.name, sms, L, D, H, 3.0 * MAT * 2 / 1e6);
    for (variant &v : vs) {
        if (!v.fused) continue;
        CHECK(cudaFuncSetAttribute(v.fused, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)v.smem));
        cudaFuncAttributes fa;
        CHECK(cudaFuncGetAttributes(&fa, v.fused));
        int per_sm = 0;
        CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, v.fused, v.threads, v.smem));
        printf("  %-34s %d registers, %zu B spilled, %zu + %zu B shared, %d block(s)/SM, grid %d\n", v.name, fa.numRegs,
               (size_t)fa.localSizeBytes, (size_t)fa.sharedSizeBytes, v.smem, per_sm, v.grid);
        if (per_sm * sms < v.grid) {
            fprintf(stderr, "%s: its grid is more than one wave\n", v.name);
            return 1;
        }
    }
    cudaFuncAttributes fa;
    CHECK(cudaFuncGetAttributes(&fa, pair_kernel<true>));
    printf("  gate/up %d registers, %zu B spilled; ", fa.numRegs, (size_t)fa.localSizeBytes);
    CHECK(cudaFuncGetAttributes(&fa, res_kernel<H>));
    printf("down %d registers, %zu B spilled; ", fa.numRegs, (size_t)fa.localSizeBytes);
    CHECK(cudaFuncGetAttributes(&fa, res_kernel<D>));
    printf("o_proj %d registers, %zu B spilled\n", fa.numRegs, (size_t)fa.localSizeBytes);

    /* correctness */
    std::vector<float> x0(D);
    for (int i = 0; i < D; i++) x0[i] = (float)((i * 37 % 101) - 50) / 25.0f;
    {
        std::vector<double> ref = reference_layer0(w, x0);
        const std::vector<float> split_out = run_once(vs[0], w, x0, st, L);
        const std::vector<double> split_ref(split_out.begin(), split_out.end());
        std::vector<double> layer_ref; /* the split layer chain's 16 layers */
        for (const variant &v : vs) {
            if (strstr(v.name, "stores") || strstr(v.name, ", st")) continue;
            const bool layer = v.kind == LAYER_SPLIT || v.kind == LAYER_FUSED;
            const std::vector<float> all_out = run_once(v, w, x0, st, L);
            const bool same = run_once(v, w, x0, st, L) == all_out;
            if (v.kind == LAYER_SPLIT) layer_ref.assign(all_out.begin(), all_out.end());
            if (layer) {
                printf("  %-34s 16 layers against the split layers: %.2e; a second run %s\n", v.name,
                       rel_err(all_out, layer_ref), same ? "equal" : "differs");
                continue;
            }
            const std::vector<float> l0 = run_once(v, w, x0, st, 1);
            printf("  %-34s layer 0 against the host: rel. error %.2e; 16 layers against split: %.2e; a second run %s\n", v.name,
                   rel_err(l0, ref), rel_err(all_out, split_ref), same ? "equal" : "differs");
        }
    }

    /* the probe */
    {
        const size_t n = bytes / 16;
        const float ms = best_ms(st, [&] { probe_kernel<<<sms * 4, 512, 0, st>>>(reinterpret_cast<const uint4 *>(all), n, sink, 0); });
        const double probe = (double)bytes / (ms * 1e-3) / 1e9;
        const double mlp_bytes = 3.0 * MAT * 2, layer_bytes = mlp_bytes + (QKV_MAT + O_MAT) * 2.0;
        printf("probe %.0f GB/s; an MLP's bytes take %.2f us at it, a layer's (QKV, o_proj, MLP) %.2f\n", probe,
               mlp_bytes / (probe * 1e3), layer_bytes / (probe * 1e3));
        printf("%-34s %10s %10s %8s %9s\n", "variant", "us/layer", "GB/s", "share", "over(us)");
        for (int round = 0; round < 2; round++)
            for (const variant &v : vs) {
                cudaGraph_t graph;
                cudaGraphExec_t exec;
                CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
                enqueue(v, w, st);
                CHECK(cudaStreamEndCapture(st, &graph));
                CHECK(cudaGraphInstantiate(&exec, graph, 0));
                float best = 1e30f;
                for (int rep = 0; rep < 3; rep++) best = fminf(best, best_ms(st, [&] { CHECK(cudaGraphLaunch(exec, st)); }));
                cudaGraphExecDestroy(exec);
                cudaGraphDestroy(graph);
                const double b = v.kind == LAYER_SPLIT || v.kind == LAYER_FUSED ? layer_bytes : mlp_bytes;
                const double us = best * 1e3 / L, gbs = b / (us * 1e3);
                printf("%-34s %10.2f %10.0f %7.1f%% %9.2f\n", v.name, us, gbs, 100 * gbs / probe, us - b / (probe * 1e3));
                fflush(stdout);
            }
    }
    CHECK(cudaGetLastError());
    return 0;
}
