/* cuda_prefill.cuh - the CUDA prompt path's kernel bodies: a batch of prompt tokens through every
 * stage at once (prefill), so that each weight row is read once for the whole batch.
 *
 * The matvecs on the tensor cores (prefill_gemm_body: tiled GEMMs through shared memory, on wgmma
 * or mma.sync, QKV, o_proj and down over splits of K; prefill_pairs_body: mma row tiles, where a
 * GEMM's tiles would leave SMs idle or a build turns the GEMMs off), the RMSNorm that adds the
 * splits' sums and splits its output into 16-bit terms, and the
 * attention with every query row of a KV head's group in a block (prefill_flash_mma_body, on the
 * tensor cores). Written, as the decode step's headers, against the MODEL_*
 * constants of the generated model_config.h, and included after it by the generated forward_cuda.cu;
 * it uses that header's helpers (pdl_wait, kv_at, att_split_len, split_h2, ...). */
#ifndef INGOT_CUDA_PREFILL_CUH
#define INGOT_CUDA_PREFILL_CUH

#include <cuda.h> /* CUtensorMap (GEMM_TMA) */

#include "cuda_attention.cuh"

// ---------------------------------------------------------------------------------------------
// Prefill: a batch of B prompt tokens (8 to 128) at positions io[IO_POS] on through every stage at
// once, so each weight row is read once for all of them; io[IO_COUNT] of them are the prompt's.
// Activations are (B, n) row-major. prefill_pairs_body, the matvec form (the GEMMs below are the
// default for QKV, o_proj and down, and for gate/up where its tiles fill the GPU), runs on the
// tensor cores (mma.m16n8k16: 16 weight rows against 8 tokens, each 8-token tile of the batch in
// an mma of its own, fp32 sums): a block
// takes 8 pairs of rows (as the decode kernels' pairs: RoPE partners, gate and up, or two rows of
// o_proj / down), the pair's rows in the tile's rows g and g + 8, and its warps split K. Each
// input, after the norm, goes in as PREFILL_TERMS values of the weights' dtype (bf16 or fp16) that
// sum to it. Grids are as many blocks as the pairs need (several waves): the prompt is not
// latency-bound.

/* MODEL_GEMM_WGMMA: Hopper's warpgroup MMA (wgmma.mma_async, sm_90a) reads both tiles from shared memory
 * itself, once for the block's four warps, instead of each warp's ldmatrix and mma.sync: a warp's
 * 16 rows against the batch's 2 B columns read 16 B fragments for each A fragment from shared
 * memory, which at batches of 64 bounds the mma.sync loop by shared memory's bandwidth, not the
 * tensor cores. Its tiles are the same: 128-byte rows, chunks swizzled as gemm_swz does, which is
 * wgmma's 128-byte swizzle when a tile starts on 1024 bytes. The generated code's default on sm_90
 * (the plan's gemm_wgmma; the Makefile builds sm_90a). At batches of 64 with every matvec a GEMM
 * (docs/performance.md, D89): prompt 1B +17%, 7B +24% against mma.sync; at batches of 32 with
 * gate/up the only GEMM it lost (1B -0.9%, 7B -6%). */

/* Prompt tokens a prefill batch takes, at most: batches of PREFILL_BATCH, PREFILL_BATCH / 2, ...
 * down to 8 (PREFILL_SIZES sizes, a graph each): full ones, then the smallest that covers the
 * tokens left (prefill_from in the generated code). A batch of 16 costs ~1.7 of one of 8 and one of 32 ~1.65 of
 * one of 16 (1B and 7B shapes; 32 against 16: 1B prompt +21%, 7B +22%: docs/performance.md, D80). 64
 * against 32 with every matvec a GEMM (D88): 1B +28%, 7B +23%; with the matvecs of prefill_pairs_body
 * it lost (their time doubles with the tokens). 128 against 64 on wgmma (D94; its GEMMs 256 columns
 * wide in two terms, one block an SM): 1B prompt
 * +29%, 7B +10%; a batch of 128 costs 1.33 (1B) to 1.63 (7B) of one of 64. So 128 where the GEMMs
 * run on wgmma, 64 on mma.sync (its fragments for 256 columns would take 128 registers a lane
 * more). Each a multiple of the mma's n, 8; tests build 16, 32 and 64. */
#ifndef PREFILL_BATCH
#define PREFILL_BATCH (MODEL_GEMM_WGMMA ? 128 : 64)
#endif
#define PREFILL_SMALL 8
#define PREFILL_SIZES (PREFILL_BATCH == 128 ? 5 : PREFILL_BATCH == 64 ? 4 : PREFILL_BATCH == 32 ? 3 : PREFILL_BATCH == 16 ? 2 : 1)
static_assert(PREFILL_BATCH == 8 || PREFILL_BATCH == 16 || PREFILL_BATCH == 32 || PREFILL_BATCH == 64 || PREFILL_BATCH == 128,
              "prefill batches: 8, 16, 32, 64 or 128 tokens");
/* 16-row tiles a warp multiplies with each input it loads: a block reads its inputs from L2 once for
 * 32 rows (1B prompt +26%, 7B +33% against one tile; docs/performance.md, D80) */
#define PREFILL_ROW_TILES 2
#define PREFILL_BLOCK_PAIRS (8 * PREFILL_ROW_TILES) /* pairs of rows a block takes: 8 a tile of the mma's 16 rows */
/* 32-value chunks of K a warp holds in flight (4 at 16 spills: -16%; 32 takes 1 for its registers) */
#define PREFILL_UNROLL(B) ((B) == 8 ? 4 : (B) == 16 ? 2 : 1)

/* Partial sums of o_proj's or down's splits the RMSNorm kernel after them loads a round
 * (prefill_rms_terms_body) */
#define PREFILL_SPLITS 4

/* QKV, o_proj and down as GEMMs (prefill_gemm_body, as gate/up's) with K split over blocks, each
 * split's sums to a buffer of its own, added in order by the kernel after them
 * (prefill_qkv_finish_body, the RMSNorm's prefill_rms_terms_body), so that no block waits for
 * another's. Against prefill_pairs_body at batches of 32 (docs/performance.md, D88): 1B prompt +17%, 7B
 * +21%; o_proj's input, the attention's fp32 output, is split into terms first by a kernel of its
 * own (prefill_att_terms_body). Splits: as many as the GEMM's blocks resident an SM (the occupancy
 * of each batch size's own kernel) fill in one wave, rounded down (gemm_splits), at most
 * PREFILL_GEMM_MAX_SPLITS and K's tiles: against every size split as a full batch a batch's graph
 * 7B -21% to -23%, 1B -10% to -11% (D99). */
#define PREFILL_GEMM_MAX_SPLITS 8 /* the most splits of K of a prefill GEMM */
/* the most splits of o_proj's or down's partial sums (prefill_part_x) */
#define PREFILL_MAX_X_PARTS (PREFILL_GEMM_MAX_SPLITS > PREFILL_SPLITS ? PREFILL_GEMM_MAX_SPLITS : PREFILL_SPLITS)

/* Terms of the weights' type (bf16 or fp16: GPU_W_BF16) an fp32 input is split into for the tensor
 * cores: x = t0 + t1, each the rounding of what the previous left, so W.x keeps 16 bits of x with
 * bf16 terms (8 + 8; fp16 22), a relative error of at most 2^-17 an input against the decode
 * kernels' fp32 products. Against 3 terms: 1B prompt +7%, 7B +12% (docs/performance.md, D80); one
 * term (x rounded to bf16) gives up the prompt's agreement with the CPU path (kept off: D98). */
#define PREFILL_TERMS 2

/* A value of the terms' 16-bit type, round to nearest; *rest gets what the rounding left out. */
__device__ __forceinline__ uint16_t w_split(float *rest) {
#if GPU_W_BF16
    const __nv_bfloat16 v = __float2bfloat16_rn(*rest);
    *rest -= __bfloat162float(v);
    return __bfloat16_as_ushort(v);
#else
    const __half v = __float2half_rn(*rest);
    *rest -= __half2float(v);
    return __half_as_ushort(v);
#endif
}

/* v as PREFILL_TERMS terms, at terms[t * stride] (the layout the prefill matvecs read: (term, B, K)) */
__device__ __forceinline__ void store_terms(uint16_t *terms, size_t stride, float v) {
#pragma unroll
    for (int t = 0; t < PREFILL_TERMS; t++) terms[t * stride] = w_split(&v);
}

/* four consecutive values v as their terms, 8 bytes a term at terms[t * stride] (terms 8-byte aligned) */
__device__ __forceinline__ void store_terms4(uint16_t *terms, size_t stride, float4 v) {
    float y[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int t = 0; t < PREFILL_TERMS; t++) {
        const uint16_t a = w_split(&y[0]), b = w_split(&y[1]), c = w_split(&y[2]), d = w_split(&y[3]);
        *reinterpret_cast<uint2 *>(terms + t * stride) = make_uint2(a | (uint32_t)b << 16, c | (uint32_t)d << 16);
    }
}

#define RMS_THREADS 512 /* prefill_rms_terms_body's block */
/* float4s of a row a thread holds: the model's, or in the generic build (dims known at run time)
 * up to 4, rows of at most RMS_MAX_DIM values (model_cuda_create refuses wider ones) */
#if MODEL_GENERIC
#define RMS_VALS 4
#else
#define RMS_VALS ((MODEL_DIM / 4 + RMS_THREADS - 1) / RMS_THREADS)
#endif
#define RMS_MAX_DIM (4 * RMS_VALS * RMS_THREADS)
/* Token b = blockIdx.x of the batch: x[b] += the `parts` partial sums part[s][b] (s in order, rows
 * of DIM, at most RMS_MAX_DIM; none for the first layer's); then RMSNorm's input, x[b] * (1 /
 * sqrt(mean(x[b]^2) + eps) * norm_w), as the PREFILL_TERMS terms of a prefill matvec's input:
 * terms (PREFILL_TERMS, B, DIM). A thread takes float4s tid, tid + THREADS, ... of the row (V of
 * them at most): its loads of x and of the first
 * PREFILL_SPLITS parts are issued before any is used (one L2 round trip; more parts, a round each
 * PREFILL_SPLITS), the norm's weights before the PDL wait, and the terms are written from the
 * registers. Against loops of 4 values a thread, which read the row twice: 1B 5.4 to 4.8 us a
 * launch, 7B 7.5 to 5.4 (launched one by one; prompt +1%: docs/performance.md, D87). A cluster of
 * blocks a token: +1-2% at depth 0, even at 4096, failing launched as a programmatic dependent;
 * removed (D100). */
template <int THREADS, int V>
__device__ __forceinline__ void prefill_rms_terms_body(float *__restrict__ x, const float *__restrict__ part, int parts,
                                                       const uint16_t *__restrict__ norm_w, uint16_t *__restrict__ terms,
                                                       int DIM, float eps) {
    constexpr int WARPS = THREADS / WARP_SIZE, P = PREFILL_SPLITS;
    const int N4 = DIM / 4; /* DIM: a multiple of 4 (model_cuda_create) */
    const int b = (int)blockIdx.x, B = (int)gridDim.x;
    __shared__ float partial[WARPS];
    const int tid = threadIdx.x;
    float4 n[V];
#pragma unroll
    for (int u = 0; u < V; u++) {
        const int j = tid + u * THREADS, i = 4 * j; /* the weights may lie on 2 bytes: loaded one by one */
        n[u] = j < N4 ? make_float4(w_to_f32(norm_w[i]), w_to_f32(norm_w[i + 1]), w_to_f32(norm_w[i + 2]), w_to_f32(norm_w[i + 3]))
                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    pdl_wait();
    pdl_launch_dependents();
    float4 *__restrict__ xb = reinterpret_cast<float4 *>(x + (size_t)b * DIM);
    const float4 *__restrict__ pb = reinterpret_cast<const float4 *>(part + (size_t)b * DIM);
    const size_t split = (size_t)B * N4; /* float4s from one split's (B, DIM) to the next */
    float4 v[V], p[V][P];
    auto load_parts = [&](int s0) { /* parts s0 .. s0 + P - 1, zeros past the last */
#pragma unroll
        for (int u = 0; u < V; u++) {
            const int j = tid + u * THREADS;
#pragma unroll
            for (int k = 0; k < P; k++)
                p[u][k] = s0 + k < parts && j < N4 ? __ldcg(pb + (s0 + k) * split + j) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    };
#pragma unroll
    for (int u = 0; u < V; u++) {
        const int j = tid + u * THREADS;
        v[u] = j < N4 ? xb[j] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    load_parts(0);
    for (int s0 = 0;;) {
#pragma unroll
        for (int u = 0; u < V; u++)
#pragma unroll
            for (int k = 0; k < P; k++) {
                v[u].x += p[u][k].x;
                v[u].y += p[u][k].y;
                v[u].z += p[u][k].z;
                v[u].w += p[u][k].w;
            }
        s0 += P;
        if (PREFILL_MAX_X_PARTS <= P || s0 >= parts) break; /* a round of P parts, two at most */
        load_parts(s0);
    }
    float ss = 0.0f;
#pragma unroll
    for (int u = 0; u < V; u++) ss += v[u].x * v[u].x + v[u].y * v[u].y + v[u].z * v[u].z + v[u].w * v[u].w;
    ss = warp_sum(ss);
    if (tid % WARP_SIZE == 0) partial[tid / WARP_SIZE] = ss;
    __syncthreads();
    float total = 0.0f; /* every thread adds the warps' sums, in warp order */
#pragma unroll
    for (int w = 0; w < WARPS; w++) total += partial[w];
    const float scale = rsqrtf(total / (float)DIM + eps);
    const size_t stride = (size_t)B * DIM; /* from one term's (B, DIM) to the next */
#pragma unroll
    for (int u = 0; u < V; u++) {
        const int j = tid + u * THREADS;
        if (j >= N4) continue;
        if (parts) xb[j] = v[u];
        store_terms4(terms + (size_t)b * DIM + 4 * j, stride,
                     make_float4(v[u].x * (scale * n[u].x), v[u].y * (scale * n[u].y), v[u].z * (scale * n[u].z),
                                 v[u].w * (scale * n[u].w)));
    }
}

/* The attention's output att (B, n) as the PREFILL_TERMS terms of o_proj's input (PREFILL_TERMS, B, n):
 * float4 blockIdx.x * blockDim.x + threadIdx.x of token blockIdx.y. */
__device__ __forceinline__ void prefill_att_terms_body(const float *__restrict__ att, uint16_t *__restrict__ terms, int n) {
    pdl_wait();
    pdl_launch_dependents();
    const int i = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (i >= n / 4) return;
    /* from one term's (B, n) to the next: gridDim.y * n */
    store_terms4(terms + (size_t)t * n + 4 * i, (size_t)gridDim.y * n, __ldcg(reinterpret_cast<const float4 *>(att + (size_t)t * n) + i));
}

/* x[b] = embed[history[pos + b]], block (i, b); the rows past the batch's tokens repeat its last
 * (their results are never stored in the cache or read). */
__device__ __forceinline__ void prefill_embed_body(const uint16_t *embed, const int *io, float *x, const int *history, int dim) {
    pdl_wait();
    pdl_launch_dependents();
    const int b = blockIdx.y;
    const uint16_t *row = embed + (size_t)history[io[IO_POS] + min(b, io[IO_COUNT] - 1)] * dim;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < dim; i += gridDim.x * blockDim.x)
        x[(size_t)b * dim + i] = w_to_f32(row[i]);
}

/* Two fp32 values as the terms' 16-bit type, packed low then high (an mma operand register);
 * *rest_lo and *rest_hi get what the rounding left out. */
__device__ __forceinline__ uint32_t pack_w2(float *rest_lo, float *rest_hi) {
#if GPU_W_BF16
    const __nv_bfloat162 v = __floats2bfloat162_rn(*rest_lo, *rest_hi);
    const float2 back = __bfloat1622float2(v);
#else
    const __half2 v = __floats2half2_rn(*rest_lo, *rest_hi);
    const float2 back = __half22float2(v);
#endif
    *rest_lo -= back.x;
    *rest_hi -= back.y;
    return *reinterpret_cast<const uint32_t *>(&v);
}

/* two consecutive values a, b as their terms, 4 bytes a term at terms[t * stride] (terms 4-byte aligned) */
__device__ __forceinline__ void store_terms2(uint16_t *terms, size_t stride, float a, float b) {
#pragma unroll
    for (int t = 0; t < PREFILL_TERMS; t++) *reinterpret_cast<uint32_t *>(terms + t * stride) = pack_w2(&a, &b);
}

/* FLASH_WRITES_TERMS 1: the flash attention kernels write o_proj's input terms themselves, as
 * prefill_att_terms_body would from their fp32 output (the same bits), and its launch, one a layer,
 * is left out where they run (attention_body's prompt, past FLASH_MAX_SPLITS, still
 * takes it). Measured (GPU tests passed), a batch's graph at depth 1: 1B
 * -0.6% to -2.9% at 8-128 tokens (the 512-token prompt +1.2%); Mistral-7B shape +0.8% to +2.9% at
 * 8-64, -0.9% at 128: its flash kernel (heads of 128) ~3 us a launch slower at batches of 8-32,
 * o_proj ~1 us faster. Not o_proj's GEMM launched early beside it (launched without programmatic
 * serialization, commit c2d40ff's FLASH_TERMS_O_PDL, the same); registers the same (254, no
 * spills). Not explained; off. */
#ifndef FLASH_WRITES_TERMS
#define FLASH_WRITES_TERMS 0
#endif

/* Where the prefill attention's output goes: att (B, q_dim) in fp32, or, with terms set, o_proj's
 * input terms (PREFILL_TERMS, B, q_dim), term_stride (B q_dim) values apart. i: the value's index
 * in a (B, q_dim) row-major matrix (put2: even, put4: a multiple of 4). Without FLASH_WRITES_TERMS
 * the terms are never written (the compiler leaves them out). */
struct att_out {
    float *att;
    uint16_t *terms;
    size_t term_stride;
    __device__ __forceinline__ void put(size_t i, float v) const {
        if (FLASH_WRITES_TERMS && terms) store_terms(terms + i, term_stride, v);
        else att[i] = v;
    }
    __device__ __forceinline__ void put2(size_t i, float a, float b) const {
        if (FLASH_WRITES_TERMS && terms) store_terms2(terms + i, term_stride, a, b);
        else *reinterpret_cast<float2 *>(att + i) = make_float2(a, b);
    }
    __device__ __forceinline__ void put4(size_t i, float4 v) const {
        if (FLASH_WRITES_TERMS && terms) store_terms4(terms + i, term_stride, v);
        else *reinterpret_cast<float4 *>(att + i) = v;
    }
};


/* c (16 x 8, fp32) += a (16 x 16, row-major) . b (16 x 8, column-major), in the terms' type. */
__device__ __forceinline__ void mma_16x8x16(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                            uint32_t b1) {
#if GPU_W_BF16
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

/* A 16-row tile's sums s[j] (rows g: pair p's a, g + 8: its b, at tokens 8 j + 2q and 8 j + 2q + 1,
 * the mma's C fragments) stored by the lanes that hold them: store(p, t, a, b) for each of a lane's
 * tokens, each store instruction four tokens' values. Against gathering a pair's values into one
 * lane of four by shuffles first (docs/performance.md, D93; batches of 64, µs a batch): 1B gate/up 442
 * to 389, the prompt +10%; 7B gate/up 2,374 to 2,230, +6%; and a batch of 128 would have needed 256
 * registers a lane for the gathered values. */
template <int B, typename Store>
__device__ __forceinline__ void prefill_store_tile(const float (&s)[B / 8][4], int lane, int p, int n_pairs, Store store) {
    if (p >= n_pairs) return;
#pragma unroll
    for (int j = 0; j < B / 8; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) store(p, 8 * j + 2 * (lane % 4) + e, s[j][e], s[j][2 + e]);
}

/* The pairs of a prefill matvec: pair(p, &ra, &rb) gives pair p's two weight rows (K values each),
 * store(p, t, a, b) gets their products with input t of the B over K's 32-value chunks [c0, c1). The
 * inputs: their terms, (PREFILL_TERMS, B, K) in the weights' type, split once by the kernel that
 * wrote them (prefill_rms_terms_body).
 *
 * The mma's fragments (PTX ISA, m16n8k16, 16-bit types): lane (g = lane / 4, q = lane % 4) holds
 * A's rows g and g + 8 at columns 2q, 2q + 1, 2q + 8, 2q + 9, B's column (token) g at the same
 * rows, and C's rows g, g + 8 at tokens 2q, 2q + 1. The sum over K does not care which 16 values
 * of K a step takes as long as A and B agree, so step s of a 32-value chunk gives lane q's four
 * columns the values 8q + 4s .. 8q + 4s + 3: a lane reads 16 contiguous bytes of each of its two
 * rows (pair g's) and 8 inputs of its token, for two steps; with several tiles of 8 tokens, the
 * same weights meet each tile's token g + 8 j in a tile's own mma. */
template <int B, int BS = B, typename Pair, typename Store>
__device__ __forceinline__ void prefill_pairs_body(int n_pairs, int K, int c0, int c1, const uint16_t *in, Pair pair, Store store,
                                                   int t0 = 0);
/* ... tokens t0 .. t0 + B - 1 of a batch of BS (BS > B: the batch's inputs in (PREFILL_TERMS, BS, K)) */
template <int B, int BS, typename Pair, typename Store>
__device__ __forceinline__ void prefill_pairs_part(int n_pairs, int K, int c0, int c1, const uint16_t *in, Pair pair, Store store,
                                                   int t0) {
    constexpr int tiles = B / 8, unroll = PREFILL_UNROLL(B), R = PREFILL_ROW_TILES;
    constexpr int in_regs = PREFILL_TERMS; /* uint4s of a token's 8 inputs: its terms */
    static_assert(R <= MODEL_MV_WARPS, "a warp a row tile for the sums' gathering");
    /* row tiles gathered a pass: all of them (32 KB at 32 tokens), or one at a time past that (the
     * static shared memory's 48 KB) */
    constexpr int RP = B > 32 ? 1 : R;
    __shared__ float red[MODEL_MV_WARPS][WARP_SIZE][4 * tiles * RP]; /* the warps' parts of K, summed in warp order */
    const int lane = threadIdx.x % WARP_SIZE, wid = threadIdx.x / WARP_SIZE, g = lane / 4, q = lane % 4;
    const uint4 *ra[R], *rb[R];
#pragma unroll
    for (int rt = 0; rt < R; rt++) /* past the last pair: its rows again, not stored */
        pair(min((int)blockIdx.x * PREFILL_BLOCK_PAIRS + 8 * rt + g, n_pairs - 1), &ra[rt], &rb[rt]);
    float c[R][tiles][4];
#pragma unroll
    for (int rt = 0; rt < R; rt++)
#pragma unroll
        for (int j = 0; j < tiles; j++) c[rt][j][0] = c[rt][j][1] = c[rt][j][2] = c[rt][j][3] = 0.0f;
    pdl_wait();
    pdl_launch_dependents();
    for (int i0 = c0 + wid; i0 < c1; i0 += MODEL_MV_WARPS * unroll) {
        uint4 wa[unroll][R], wb[unroll][R], xv[unroll][tiles][in_regs];
#pragma unroll
        for (int u = 0; u < unroll; u++) {
            const int k = (i0 + u * MODEL_MV_WARPS) * 32 + 8 * q;
            const bool in_k = i0 + u * MODEL_MV_WARPS < c1 && k < K;
#pragma unroll
            for (int rt = 0; rt < R; rt++) {
                wa[u][rt] = in_k ? ld_stream(ra[rt] + k / 8) : make_uint4(0, 0, 0, 0);
                wb[u][rt] = in_k ? ld_stream(rb[rt] + k / 8) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int j = 0; j < tiles; j++)
#pragma unroll
                for (int r = 0; r < in_regs; r++) {
                    const int t = t0 + g + 8 * j; /* tile j's token for this lane */
                    const uint4 *x = reinterpret_cast<const uint4 *>(in + ((size_t)r * BS + t) * K + k);
                    xv[u][j][r] = in_k ? __ldcg(x) : make_uint4(0, 0, 0, 0);
                }
        }
#pragma unroll
        for (int u = 0; u < unroll; u++)
#pragma unroll
            for (int j = 0; j < tiles; j++) {
#pragma unroll
                for (int t = 0; t < PREFILL_TERMS; t++)
#pragma unroll
                    for (int rt = 0; rt < R; rt++) {
                        const uint4 a = wa[u][rt], b = wb[u][rt], x = xv[u][j][t];
                        mma_16x8x16(c[rt][j], a.x, b.x, a.y, b.y, x.x, x.y);
                        mma_16x8x16(c[rt][j], a.z, b.z, a.w, b.w, x.z, x.w);
                    }
            }
    }
#pragma unroll
    for (int r0 = 0; r0 < R; r0 += RP) {
        if (r0 > 0) __syncthreads(); /* the last pass's sums are read */
#pragma unroll
        for (int rt = 0; rt < RP; rt++)
#pragma unroll
            for (int j = 0; j < tiles; j++)
#pragma unroll
                for (int i = 0; i < 4; i++) red[wid][lane][4 * (tiles * rt + j) + i] = c[r0 + rt][j][i];
        __syncthreads();
        if (wid < RP) {
            const int rt = wid; /* warp rt gathers row tile r0 + rt's sums */
            const int p = (int)blockIdx.x * PREFILL_BLOCK_PAIRS + 8 * (r0 + rt) + g;
            float s[tiles][4];
#pragma unroll
            for (int j = 0; j < tiles; j++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    s[j][i] = 0.0f;
                    for (int w = 0; w < MODEL_MV_WARPS; w++) s[j][i] += red[w][lane][4 * (tiles * rt + j) + i];
                }
            prefill_store_tile<B>(s, lane, p, n_pairs, [&](int p, int t, float a, float b) { store(p, t0 + t, a, b); });
        }
    }
}

/* Batches of up to 64 in one pass; of 128 (the sums' gathering would take 64 KB of shared memory
 * and a lane's 128 sums) in two of 64, the block's weights read twice (the second time mostly from
 * L2). */
template <int B, int BS, typename Pair, typename Store>
__device__ __forceinline__ void prefill_pairs_body(int n_pairs, int K, int c0, int c1, const uint16_t *in, Pair pair, Store store,
                                                   int t0) {
    if constexpr (B > 64) {
        prefill_pairs_part<64, B>(n_pairs, K, c0, c1, in, pair, store, 0);
        __syncthreads(); /* the first half's sums gathered before the second's reuse their shared memory */
        prefill_pairs_part<64, B>(n_pairs, K, c0, c1, in, pair, store, 64);
    } else prefill_pairs_part<B, BS>(n_pairs, K, c0, c1, in, pair, store, t0);
}

// ---------------------------------------------------------------------------------------------
// The prefill's tiled GEMM (prefill_gemm_body): gate/up where its rows fill the GPU's SMs
// (gate_up_gemm in the generated code), and QKV, o_proj and down over splits of K: a block takes GEMM_PAIRS pairs of rows (a warp a 16-row tile of 8 pairs,
// as prefill_pairs_body's) over its K tiles against the whole batch. Weights and inputs go
// through shared memory on cp.async, GEMM_KT values of K a stage, GEMM_STAGES stages in flight, and
// every warp reads the stage's inputs from shared memory (ldmatrix): a block reads its inputs from
// L2 once for 64 rows, not for 32, and keeps its later stages' weights in flight whatever its
// registers. The input's terms are columns of the GEMM: column t * B + b is token b's term t, as
// the terms lie in memory (term, B, K), and each token's terms are added after the sums.
// Measured against prefill_pairs_body (docs/performance.md, D86): the prompt +10% on the 1B shape
// and +17% on the 7B; QKV, o_proj and down, whose few rows need K split over blocks, were slower as
// GEMMs while each tile's last split block added the splits' sums (each split to a buffer of its
// own, as they are now, won: D88). ncu (mma.sync, batches of
// 32): bound by latency (a quarter of the issue slots and of the tensor pipe busy), not by a unit.

#define GEMM_WARPS 4 /* 8 (64 pairs a block): 1B prompt -6%, 7B even */
#define GEMM_THREADS (GEMM_WARPS * WARP_SIZE)
#define GEMM_PAIRS (8 * GEMM_WARPS) /* pairs of rows a block: 8 a warp */
#define GEMM_KT 64    /* K values a stage: 128 bytes a row */
#define GEMM_STAGES 3 /* the split GEMMs' stages (4, three blocks an SM: 1B even, 7B -4%) */
#define GEMM_A_BYTES (2 * GEMM_PAIRS * GEMM_KT * 2)
#define GEMM_B_BYTES(B) (PREFILL_TERMS * (B) * GEMM_KT * 2)
#define GEMM_STAGE_BYTES(B) (GEMM_A_BYTES + GEMM_B_BYTES(B))
/* W1 (prefill_gemm_body's): a stage's wgmma left running while the block goes on to the next
 * stage's copies and wgmma (wgmma.wait_group 1, not 0), so that the tensor cores are not idle while
 * the warps wait; the copies then go to the stage two back, which the wait has freed, and the
 * prefetch distance is S - 2 tiles. gate/up's GEMM on wgmma: 4 stages with W1 (it runs one block a
 * tile of rows, not split): against 3 stages without, 7B gate/up -8%, prompt +4.4%, 1B +0.2%
 * (docs/performance.md, D91). The split GEMMs (QKV, o_proj, down) keep 3 stages without (at 4 two
 * blocks an SM, not three: the prompt +1% to -4.7%), but at 256 columns (batches of 128 in two terms,
 * one block an SM anyway) take 4 with W1: 7B QKV -10%, prompt +1.4% / +5.3% at depths 0 / 4096, 1B
 * +0.2% / -0.4% (D95). */
#define GATE_UP_GEMM_STAGES (MODEL_GEMM_WGMMA ? 4 : GEMM_STAGES)
#define GATE_UP_GEMM_WAIT1 MODEL_GEMM_WGMMA
#define SPLIT_WIDE_W1(B) (MODEL_GEMM_WGMMA && PREFILL_TERMS * (B) > 128)
/* the split GEMMs' stages and wait at batches of B */
#define SPLIT_STAGES(B) (SPLIT_WIDE_W1(B) ? 4 : GEMM_STAGES)
#define SPLIT_WAIT1(B) SPLIT_WIDE_W1(B)
#if MODEL_GEMM_WGMMA && defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "MODEL_GEMM_WGMMA needs sm_90a: make CUDA_ARCH=90 (builds sm_90a), or PLAN=gemm_wgmma=0"
#endif
/* a GEMM block's dynamic shared memory at S stages; a stage's tiles start on 1024 bytes under
 * MODEL_GEMM_WGMMA (the dynamic shared memory aligned up) */
#define GEMM_SMEM_BYTES_AT(B, S) ((S) * GEMM_STAGE_BYTES(B) + (MODEL_GEMM_WGMMA ? 1024 : 0))
#define GEMM_SMEM_BYTES(B) GEMM_SMEM_BYTES_AT(B, SPLIT_STAGES(B)) /* the split GEMMs' */

/* Byte offset of 16-byte chunk c of row r in a tile of 128-byte rows: the chunks XOR-swizzled by the
 * row, so that ldmatrix's eight rows at one chunk hit eight different bank groups. */
__device__ __forceinline__ uint32_t gemm_swz(int r, int c) { return (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4)); }

/* cp_async16 to a shared-memory address */
__device__ __forceinline__ void cp_async16_s(uint32_t dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait_group(void) { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2(uint32_t addr, uint32_t &r0, uint32_t &r1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(addr));
}

#if MODEL_GEMM_WGMMA
/* wgmma's shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format") for a K-major tile
 * of 128-byte rows in the 128-byte swizzle: start address >> 4, leading byte offset 16 (unused when
 * swizzled), stride byte offset 1024 (from 8 rows to the next 8), swizzle mode 1 (bits 62-63). A
 * step of 16 values of K within the rows is 32 bytes more on the start address. */
__device__ __forceinline__ uint64_t gemm_desc(uint32_t addr) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)(16 >> 4) << 16) | ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}
#if GPU_W_BF16
#define WG_TYPE "bf16"
#else
#define WG_TYPE "f16"
#endif
#define WG_C4(n) "+f"(c[n][0]), "+f"(c[n][1]), "+f"(c[n][2]), "+f"(c[n][3])
/* c (64 x NT * 8, this thread's part as mma_16x8x16's C in each 8-column tile n) += A . B over 16
 * values of K, A (64 rows) and B (NT * 8 rows) K-major in shared memory (descriptors); the block's
 * four warps issue it together (a warpgroup), between wgmma_fence and wgmma_commit_wait. */
template <int NT>
__device__ __forceinline__ void wgmma_k16(float (&c)[NT][4], uint64_t a, uint64_t b);
/* a specialization of wgmma_k16 for NT tiles of 8 columns (the shape's N): D its accumulators'
 * operands, A, B and P the operand numbers of the descriptors and of scale-d's predicate (set: add) */
#define WGMMA_K16(NT, N, D, A, B, P, ...)                                                                     \
    template <>                                                                                               \
    __device__ __forceinline__ void wgmma_k16<NT>(float (&c)[NT][4], uint64_t a, uint64_t b) {                 \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #P ", 0;\n"                                          \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." WG_TYPE "." WG_TYPE " {" D "}, %" #A ", %" #B \
                     ", p, 1, 1, 0, 0;\n}\n"                                                                    \
                     : __VA_ARGS__                                                                             \
                     : "l"(a), "l"(b), "r"(1));                                                               \
    }
WGMMA_K16(1, 8, "%0,%1,%2,%3", 4, 5, 6, WG_C4(0))
WGMMA_K16(2, 16, "%0,%1,%2,%3,%4,%5,%6,%7", 8, 9, 10, WG_C4(0), WG_C4(1))
WGMMA_K16(4, 32, "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15", 16, 17, 18, WG_C4(0), WG_C4(1), WG_C4(2), WG_C4(3))
WGMMA_K16(8, 64,
          "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,"
          "%29,%30,%31",
          32, 33, 34, WG_C4(0), WG_C4(1), WG_C4(2), WG_C4(3), WG_C4(4), WG_C4(5), WG_C4(6), WG_C4(7))
WGMMA_K16(16, 128,
          "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
          "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63",
          64, 65, 66, WG_C4(0), WG_C4(1), WG_C4(2), WG_C4(3), WG_C4(4), WG_C4(5), WG_C4(6), WG_C4(7), WG_C4(8), WG_C4(9),
          WG_C4(10), WG_C4(11), WG_C4(12), WG_C4(13), WG_C4(14), WG_C4(15))
WGMMA_K16(32, 256,
          "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,"
          "%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,"
          "%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,"
          "%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,"
          "%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127",
          128, 129, 130, WG_C4(0), WG_C4(1), WG_C4(2), WG_C4(3), WG_C4(4), WG_C4(5), WG_C4(6), WG_C4(7), WG_C4(8), WG_C4(9),
          WG_C4(10), WG_C4(11), WG_C4(12), WG_C4(13), WG_C4(14), WG_C4(15), WG_C4(16), WG_C4(17), WG_C4(18), WG_C4(19), WG_C4(20),
          WG_C4(21), WG_C4(22), WG_C4(23), WG_C4(24), WG_C4(25), WG_C4(26), WG_C4(27), WG_C4(28), WG_C4(29), WG_C4(30), WG_C4(31))
#undef WGMMA_K16
#undef WG_C4
__device__ __forceinline__ void wgmma_fence(void) { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
/* the warp's wgmmas issued since the last commit as a group; then wait until at most N groups are
 * still running */
template <int N>
__device__ __forceinline__ void wgmma_commit_wait(void) {
    asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ void wgmma_wait_all(void) { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
/* this thread's cp.async writes, landed, made visible to the async proxy that wgmma reads through */
__device__ __forceinline__ void fence_proxy_async_shared(void) { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
#endif

/* GEMM_TMA: gate/up's GEMM (prefill_gate_up_tma_body) with its tiles copied by the Tensor Memory
 * Accelerator (cp.async.bulk.tensor through tensor maps the host makes, a stage's arrival counted
 * on an mbarrier) instead of 12 cp.async a thread a stage: one thread issues a stage's 9 copies
 * (8 boxes of 8 weight rows, the inputs' tile). Why (ncu on gate/up's cp.async form):
 * a third of the warps' time in issuing the copies and waiting at the stage's barrier, gate/up's
 * weights read at 2.1-2.4 TB/s, half the probe. In specialized builds on wgmma (sm_90a); its
 * stages and wait follow gate/up's (GATE_UP_GEMM_STAGES, GATE_UP_GEMM_WAIT1). Against cp.async at
 * 4 stages with WAIT1: 1B prompt +1.5%, 7B +2.9% at depth 0 (docs/performance.md, D91). */
#define GEMM_TMA (MODEL_GEMM_WGMMA && !MODEL_GENERIC)
/* GATE_UP_TMA_WIDE: gate/up's TMA body at two warpgroups a block (prefill_gate_up_tma_body's WGS),
 * each its own 64 rows against the stage's one input tile, at 3 stages without WAIT1 (at 256
 * columns: 4 with, below), so that two blocks fit an SM: 16 warps an SM, not 8. 1: where its blocks (64 pairs) are
 * one wave of two an SM, at least as many as the SMs and at most twice (on an H200 the 7B and 8B
 * shapes' 224; not the 1B's 128, one block an SM, nor the Qwen2.5-7B shape's 296, 1.12 waves),
 * 2: always (a test knob: the tiny models' blocks are fewer than the SMs). Measured (docs/performance.md,
 * D92; µs a batch of 64, two rounds):
 * Mistral-7B shape gate/up 2,334-2,358 against 2,577-2,587, prompt +2.9% / +2.3% at depths 0 /
 * 4096; Qwen2.5-7B shape 3,302-3,349 against 2,888-2,915, prompt -6.0% / -4.8%; the 1B (forced)
 * 536 against 439, prompt -8%. A block of two warpgroups at one block an SM lost everywhere (7B
 * 3,050 against 2,590 at 4 or 6 stages; 1B 458-484 against 439), also with a warp of its own
 * copying and each stage handed back through an mbarrier instead of the block barrier (7B
 * 3,094-3,199, 1B 484-492; removed, commit 5ad1b2b). ncu (7B, one launch): DRAM read 2.94 TB/s
 * at 7.4 warps an SM (one warpgroup), 3.27 at 13.7 (wide), 2.30 at 9.0 (one wide block an SM): the
 * weights' reads want warps in flight, not staged bytes. At batches of 128 in two terms (256
 * columns, 128 sums a thread) either form fits one block an SM; the Mistral-7B shape's two
 * warpgroups there: gate/up 4,075 against 4,222 µs a batch, prompt +1.9% (D92, D94). */
#ifndef GATE_UP_TMA_WIDE
#define GATE_UP_TMA_WIDE 1
#endif
static_assert(GATE_UP_TMA_WIDE == 1 || GATE_UP_TMA_WIDE == 2, "GATE_UP_TMA_WIDE: 1 (the rule) or 2 (always)");
/* Where a block of two warpgroups is alone on its SM anyway (256 columns: batches of 128 in two
 * terms), 4 stages with a stage's wgmma left running (as GATE_UP_GEMM_WAIT1) instead of 3 without:
 * Mistral-7B shape gate/up 3,183 against 4,034 µs a batch of 128, prompt +7.5% (docs/performance.md,
 * D95). A warp of its own copying there (warp-specialized, empty mbarriers) was written but never run
 * on a GPU: removed. */
#define TMA_WIDE_W1(B) (PREFILL_TERMS * (B) > 128)
/* the TMA body's threads: WGS warpgroups */
#define TMA_THREADS(B, WGS) (GEMM_THREADS * (WGS))
/* the TMA body's stages and wait at batches of B and WGS warpgroups a block, and its blocks (64 WGS
 * pairs) over `pairs` */
#define TMA_STAGES(B, WGS) ((WGS) == 1 ? GATE_UP_GEMM_STAGES : TMA_WIDE_W1(B) ? 4 : 3)
#define TMA_WAIT1(B, WGS) ((WGS) == 1 ? GATE_UP_GEMM_WAIT1 : TMA_WIDE_W1(B))
#define TMA_BLOCKS(pairs, WGS) (((pairs) + GEMM_PAIRS * (WGS) - 1) / (GEMM_PAIRS * (WGS)))
#define TMA_STAGE_BYTES(B, WGS) ((WGS) * GEMM_A_BYTES + GEMM_B_BYTES(B))
#define TMA_SMEM_BYTES(B, S, WGS) ((S) * TMA_STAGE_BYTES(B, WGS) + 1024)
static_assert(!GEMM_TMA || (TMA_SMEM_BYTES(PREFILL_BATCH, TMA_STAGES(PREFILL_BATCH, 1), 1) <= 232448 &&
                             TMA_SMEM_BYTES(PREFILL_BATCH, TMA_STAGES(PREFILL_BATCH, 2), 2) <= 232448),
              "GEMM_TMA: the TMA body's stages over a block's 227 KB of shared memory");
#if GEMM_TMA
/* mbar_init, mbar_arrive_expect_tx, mbar_arrive, mbar_wait: cuda_common.cuh */
/* the box of `map` at (c0: the inner dimension, c1) into shared memory at dst, counted on bar */
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}
#endif

/* A GEMM block's sums c (its warp's 16 rows, as mma_16x8x16's C in each 8-column tile) stored:
 * each token's terms added, s[j] rows g, g + 8 at tokens 8 j + 2q, 8 j + 2q + 1; a block of P pairs,
 * warp w's from pair P blockIdx.x + 8 w */
template <int B, int P = GEMM_PAIRS, int NT, typename Store>
__device__ __forceinline__ void prefill_gemm_store(const float (&c)[NT][4], int n_pairs, Store store) {
    constexpr int T = PREFILL_TERMS, J = B / 8;
    const int lane = threadIdx.x % WARP_SIZE, wid = threadIdx.x / WARP_SIZE, g = lane / 4;
    float s[J][4];
#pragma unroll
    for (int j = 0; j < J; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            s[j][e] = c[j][e];
#pragma unroll
            for (int t = 1; t < T; t++) s[j][e] += c[t * J + j][e];
        }
    prefill_store_tile<B>(s, lane, (int)blockIdx.x * P + 8 * wid + g, n_pairs, store);
}

/* pair(p, &ra, &rb) and store(p, t, a, b) as prefill_pairs_body's, over K's GEMM_KT-value tiles
 * [kt0, kt1) (all of K: gemm_k_tiles(K)); in: the terms (PREFILL_TERMS, B, K). A block of
 * GEMM_THREADS a GEMM_PAIRS pairs, dynamic shared memory GEMM_SMEM_BYTES_AT(B, S): S stages, W1
 * a stage's wgmma left running (GATE_UP_GEMM_WAIT1). */
template <int B, int S, bool W1, typename Pair, typename Store>
__device__ __forceinline__ void prefill_gemm_body(int n_pairs, int K, int kt0, int kt1, const uint16_t *__restrict__ in, Pair pair,
                                                  Store store) {
    constexpr int T = PREFILL_TERMS, J = B / 8, NT = T * J; /* 8-token tiles; n8 tiles of the GEMM's columns */
    static_assert(S >= 2, "prefill_gemm_body: at least 2 stages");
    static_assert(!W1 || (MODEL_GEMM_WGMMA && S >= 3), "W1: wgmma and at least 3 stages");
    constexpr int PREFETCH = W1 ? S - 2 : S - 1; /* K tiles a block copies ahead of the one it multiplies */
    static_assert(!MODEL_GEMM_WGMMA || NT == 1 || NT == 2 || NT == 4 || NT == 8 || NT == 16 || NT == 32, "MODEL_GEMM_WGMMA: wgmma_k16's shapes, N 8 to 256");
    extern __shared__ __align__(128) unsigned char gemm_smem[];
    const int tid = threadIdx.x;
    const int n_kt = kt1 - kt0; /* this block's K tiles: i of them at kt0 + i */
    const uint32_t smem = ((uint32_t)__cvta_generic_to_shared(gemm_smem) + (MODEL_GEMM_WGMMA ? 1023u : 0u)) & (MODEL_GEMM_WGMMA ? ~1023u : ~0u);

    /* This thread's copies: chunk tid % 8 (8 values of K) of tile rows tid / 8 + ROWS j, for 4 rows
     * of weights and T B * 8 / GEMM_THREADS rows of inputs a stage. Row r of the weights' tile is
     * pair 8 (r / 16) + r % 8's a (r % 16 < 8) or b. The pointers and shared-memory offsets are
     * worked out once: rows ROWS apart keep r % 8, so their swizzled chunks lie ROWS 128 bytes apart,
     * and a stage's copies are one address add each (a loop over the copies with a stride from tid
     * cost ~10 instructions a copy, and its issue half of the GEMM's warps' time: ncu). */
    constexpr int ROWS = GEMM_THREADS / 8, B_COPIES = (T * B + ROWS - 1) / ROWS; /* the last may be part of ROWS rows */
    static_assert(4 * ROWS == 2 * GEMM_PAIRS, "prefill_gemm_body: the weights' tile is 4 copies of ROWS rows");
    const int c8 = 8 * (tid % 8);
    const uint32_t row_off = gemm_swz(tid / 8, tid % 8); /* + ROWS 128 j for row tid / 8 + ROWS j */
    const uint16_t *arow[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int r = tid / 8 + ROWS * i;
        const uint4 *ra, *rb;
        pair(min((int)blockIdx.x * GEMM_PAIRS + 8 * (r / 16) + r % 8, n_pairs - 1), &ra, &rb);
        arow[i] = reinterpret_cast<const uint16_t *>(r % 16 < 8 ? ra : rb) + c8;
    }
    const uint16_t *brow = in + (size_t)(tid / 8) * K + c8;
    auto load_a = [&](int st, int kt) { /* the block's K tile kt into stage st */
        const uint32_t dst = smem + st * GEMM_STAGE_BYTES(B) + row_off;
        const int k = (kt0 + kt) * GEMM_KT;
        const bool valid = k + c8 < K;
#pragma unroll
        for (int i = 0; i < 4; i++) cp_async16_s(dst + ROWS * 128 * i, arow[i] + (valid ? k : 0), valid);
    };
    auto load_b = [&](int st, int kt) {
        const uint32_t dst = smem + st * GEMM_STAGE_BYTES(B) + GEMM_A_BYTES + row_off;
        const int k = (kt0 + kt) * GEMM_KT;
        const bool valid = k + c8 < K;
        const uint16_t *src = brow + (valid ? k : 0);
#pragma unroll
        for (int j = 0; j < B_COPIES; j++)
            if (ROWS * (j + 1) <= T * B || tid / 8 + ROWS * j < T * B) /* the first known at compile time */
                cp_async16_s(dst + ROWS * 128 * j, src + (size_t)ROWS * K * j, valid);
    };

    float c[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.0f;
    /* the weights of the first stages before the wait (they do not depend on the kernel before),
     * the inputs after it; a group a stage's part, so that stage 0 waits for its own two */
#pragma unroll
    for (int s = 0; s < PREFETCH; s++) {
        if (s < n_kt) load_a(s, s);
        cp_async_commit();
    }
    pdl_wait();
    pdl_launch_dependents();
#pragma unroll
    for (int s = 0; s < PREFETCH; s++) {
        if (s < n_kt) load_b(s, s);
        cp_async_commit();
    }
    for (int i = 0; i < n_kt; i++) {
        cp_async_wait_group<PREFETCH - 1>();
#if MODEL_GEMM_WGMMA
        fence_proxy_async_shared();
#endif
        /* stage i is in, and every warp is done with the stage the next copies overwrite (under
         * W1 each warp's wait after the last stage's wgmma saw the one before end) */
        __syncthreads();
        if (i + PREFETCH < n_kt) {
            load_a((i + PREFETCH) % S, i + PREFETCH);
            load_b((i + PREFETCH) % S, i + PREFETCH);
        }
        cp_async_commit();
        const uint32_t a_base = smem + (i % S) * GEMM_STAGE_BYTES(B), b_base = a_base + GEMM_A_BYTES;
#if MODEL_GEMM_WGMMA
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < GEMM_KT / 16; kk++) wgmma_k16<NT>(c, gemm_desc(a_base + 32 * kk), gemm_desc(b_base + 32 * kk));
        /* done with this stage (WAIT1: with the last one) before the next iteration's copies overwrite it */
        wgmma_commit_wait<W1 ? 1 : 0>();
#else
        const int lane = tid % WARP_SIZE, wid = tid / WARP_SIZE;
#pragma unroll
        for (int kk = 0; kk < GEMM_KT / 16; kk++) {
            uint32_t a0, a1, a2, a3; /* rows g, g + 8 at k 2q.. and 2q + 8.. (mma_16x8x16's order) */
            ldsm_x4(a_base + gemm_swz(16 * wid + (lane / 8 % 2) * 8 + lane % 8, 2 * kk + lane / 16), a0, a1, a2, a3);
#pragma unroll
            for (int n = 0; n + 1 < NT; n += 2) { /* columns 8n.. and 8n + 8.. at k 2q.. and 2q + 8.. */
                uint32_t b0, b1, b2, b3;
                ldsm_x4(b_base + gemm_swz(8 * n + (lane / 16) * 8 + lane % 8, 2 * kk + lane / 8 % 2), b0, b1, b2, b3);
                mma_16x8x16(c[n], a0, a1, a2, a3, b0, b1);
                mma_16x8x16(c[n + 1], a0, a1, a2, a3, b2, b3);
            }
            if constexpr (NT % 2) {
                uint32_t b0, b1;
                ldsm_x2(b_base + gemm_swz(8 * (NT - 1) + lane % 8, 2 * kk + lane / 8 % 2), b0, b1);
                mma_16x8x16(c[NT - 1], a0, a1, a2, a3, b0, b1);
            }
        }
#endif
    }
    cp_async_wait_group<0>();
#if MODEL_GEMM_WGMMA
    if constexpr (W1) wgmma_wait_all(); /* the last stage's sums */
#endif
    prefill_gemm_store<B>(c, n_pairs, store);
}

/* Pair tiles of a prefill GEMM of `pairs` pairs */
static inline int gemm_tiles(int pairs) { return (pairs + GEMM_PAIRS - 1) / GEMM_PAIRS; }
/* K's GEMM_KT-value tiles */
__host__ __device__ inline int gemm_k_tiles(int K) { return (K + GEMM_KT - 1) / GEMM_KT; }

/* the most splits of QKV's partial sums (prefill_part_qkv) */
#define PREFILL_MAX_QKV_PARTS PREFILL_GEMM_MAX_SPLITS

/* splits of K over a GEMM's `tiles` pair tiles on `sms` SMs where `resident` of its blocks fit an SM:
 * as many as fill one wave, rounded down (N blocks an SM rounded up instead left a second wave of a
 * third of the blocks or more where 3 were resident: one wave +4.8-5.2%, docs/performance.md, D90) */
static inline int gemm_splits(int tiles, int K, int sms, int resident) {
    int splits = resident * sms / tiles;
    if (splits < 1) splits = 1;
    if (splits > PREFILL_GEMM_MAX_SPLITS) splits = PREFILL_GEMM_MAX_SPLITS;
    if (splits > gemm_k_tiles(K)) splits = gemm_k_tiles(K);
    return splits;
}

/* q/k/v pair p's sums a, b over K for token t of the batch (+ bias, RoPE at position io[IO_POS] + t)
 * into q (t, q_dim), or the key or value cache for tokens of the batch's count. */
__device__ __forceinline__ void prefill_qkv_store(int p, int t, float a, float b, const uint16_t *bq, const uint16_t *bk,
                                                  const uint16_t *bv, float *q, uint16_t *kc, uint16_t *vc, const int *io,
                                                  const float *inv_freq, int q_dim, int kv_dim, int head_dim, int ctx) {
    const int q_pairs = q_dim / 2, k_pairs = kv_dim / 2;
    int ra, rb, kind;
    qkv_pair(p, q_pairs, k_pairs, head_dim, &ra, &rb, &kind);
    const int pos0 = io[IO_POS];
    if (kind != 0 && t >= io[IO_COUNT]) return; /* past the batch's tokens: nothing into the cache */
    const uint16_t *bias = kind == 0 ? bq : kind == 1 ? bk : bv;
    if (bias) {
        a += w_to_f32(bias[ra]);
        b += w_to_f32(bias[rb]);
    }
    if (kind < 2) {
        float sn, cs;
        __sincosf((float)(pos0 + t) * inv_freq[ra % head_dim], &sn, &cs);
        const float ta = a * cs - b * sn, tb = b * cs + a * sn;
        a = ta;
        b = tb;
    }
    if (kind == 0) {
        q[(size_t)t * q_dim + ra] = a;
        q[(size_t)t * q_dim + rb] = b;
    } else {
        uint16_t *cache = kind == 1 ? kc : vc;
        cache[kv_at(pos0 + t, ra / head_dim, ctx, head_dim) + ra % head_dim] = __half_as_ushort(__float2half_rn(a));
        cache[kv_at(pos0 + t, rb / head_dim, ctx, head_dim) + rb % head_dim] = __half_as_ushort(__float2half_rn(b));
    }
}

/* n_pairs pairs over split blockIdx.y of gridDim.y's parts of K as a GEMM over K's tiles (in: the
 * terms); pair and store as prefill_gemm_body's */
template <int B, typename Pair, typename Store>
__device__ __forceinline__ void prefill_split_body(int n_pairs, int K, const uint16_t *in, Pair pair, Store store) {
    const int s = blockIdx.y, splits = gridDim.y;
    const int n_kt = gemm_k_tiles(K);
    prefill_gemm_body<B, SPLIT_STAGES(B), SPLIT_WAIT1(B)>(n_pairs, K, n_kt * s / splits, n_kt * (s + 1) / splits, in, pair, store);
}

/* q/k/v for a batch of B as a GEMM on input_layernorm's output as terms (prefill_rms_terms_body):
 * the pairs of qkv_pair, over split blockIdx.y of gridDim.y's parts of K, pair p's sums for token t
 * to part[s][t][p] (float2s of a and b), which prefill_qkv_finish_body adds and stores (+ bias,
 * RoPE, the KV cache). */
template <int B>
__device__ __forceinline__ void prefill_qkv_gemm_body(const uint16_t *wq, const uint16_t *wk, const uint16_t *wv,
                                                      const uint16_t *x_terms, float2 *part, int dim, int q_dim, int kv_dim,
                                                      int head_dim) {
    const int q_pairs = q_dim / 2, k_pairs = kv_dim / 2, pairs = q_pairs + k_pairs + kv_dim / 2;
    const int s = blockIdx.y;
    auto pair = [&](int p, const uint4 **a, const uint4 **b) {
        int ra, rb, kind;
        qkv_pair(p, q_pairs, k_pairs, head_dim, &ra, &rb, &kind);
        const uint16_t *wm = kind == 0 ? wq : kind == 1 ? wk : wv;
        *a = reinterpret_cast<const uint4 *>(wm + (size_t)ra * dim);
        *b = reinterpret_cast<const uint4 *>(wm + (size_t)rb * dim);
    };
    auto store = [&](int p, int t, float a, float b) { part[((size_t)s * B + t) * pairs + p] = make_float2(a, b); };
    prefill_split_body<B>(pairs, dim, x_terms, pair, store);
}

/* QKV's splits added in order, for pair blockIdx.x * blockDim.x + threadIdx.x and token blockIdx.y
 * of a batch of B, then stored (prefill_qkv_store) */
template <int B>
__device__ __forceinline__ void prefill_qkv_finish_body(const float2 *part, int splits, const uint16_t *bq, const uint16_t *bk,
                                                        const uint16_t *bv, float *q, uint16_t *kc, uint16_t *vc, const int *io,
                                                        const float *inv_freq, int q_dim, int kv_dim, int head_dim, int ctx) {
    const int pairs = q_dim / 2 + kv_dim, p = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    pdl_wait();
    pdl_launch_dependents();
    if (p >= pairs) return;
    float2 v = __ldcg(part + (size_t)t * pairs + p);
    for (int s = 1; s < splits; s++) {
        const float2 w = __ldcg(part + ((size_t)s * B + t) * pairs + p);
        v.x += w.x;
        v.y += w.y;
    }
    prefill_qkv_store(p, t, v.x, v.y, bq, bk, bv, q, kc, vc, io, inv_freq, q_dim, kv_dim, head_dim, ctx);
}

/* part[s] (B, rows) = W (rows, K) . in over split s = blockIdx.y of gridDim.y's parts of K [+ bias,
 * in split 0]: rows (i, i + rows / 2) a pair (rows even); in: the terms, as a GEMM (prefill_gemm_body
 * over K's tiles). The next RMSNorm kernel adds the splits to the residual stream
 * (prefill_rms_terms_body). */
template <int B>
__device__ __forceinline__ void prefill_residual_body(const uint16_t *w, const uint16_t *bias, const uint16_t *in, float *part,
                                                      int rows, int K) {
    const int half = rows / 2, s = blockIdx.y;
    float *out = part + (size_t)s * B * rows;
    if (s != 0) bias = NULL;
    auto pair = [&](int p, const uint4 **a, const uint4 **b) {
        *a = reinterpret_cast<const uint4 *>(w + (size_t)p * K);
        *b = reinterpret_cast<const uint4 *>(w + (size_t)(p + half) * K);
    };
    auto store = [&](int p, int t, float a, float b) {
        out[(size_t)t * rows + p] = a + (bias ? w_to_f32(bias[p]) : 0.0f);
        out[(size_t)t * rows + p + half] = b + (bias ? w_to_f32(bias[p + half]) : 0.0f);
    };
    prefill_split_body<B>(half, K, in, pair, store);
}

/* gate/up's store(p, t, a, b): SiLU(gate) * up of pair p for token t into down's input terms
 * hb_terms (PREFILL_TERMS, B, hidden) */
template <int B>
__device__ __forceinline__ auto prefill_gate_up_store(uint16_t *hb_terms, int hidden) {
    return [=](int p, int t, float a, float b) { store_terms(hb_terms + (size_t)t * hidden + p, (size_t)B * hidden, silu(a) * b); };
}

#if GEMM_TMA
/* gate/up as prefill_gemm_body's GEMM (S stages, W1 its wait) with its tiles copied by TMA, a block
 * of WGS warpgroups and GEMM_PAIRS WGS pairs (TMA_THREADS(B, WGS) threads, dynamic shared memory
 * TMA_SMEM_BYTES(B, S, WGS)): gate and up, tensor maps of the (hidden, dim) matrices in boxes of
 * GEMM_KT values by 8 rows, in: of the input terms (PREFILL_TERMS B, dim) in one box of
 * PREFILL_TERMS B rows; both swizzled 128 bytes, which puts each 8-row box as gemm_swz lays out a
 * tile's rows (a box starts on 1024 bytes). A stage: each warpgroup's 64-row weight tile, then the
 * inputs' tile, which every warpgroup's wgmma reads; the warps wait for its `full` mbarrier's phase.
 * Thread 0 copies stage i + PREFETCH after the block's barrier at stage i (every warp's wgmma on
 * the stage it overwrites waited for: under W1 the one two stages back, so PREFETCH is S - 2). */
template <int B, int S, bool W1, int WGS>
__device__ __forceinline__ void prefill_gate_up_tma_body(const CUtensorMap *gate, const CUtensorMap *up, const CUtensorMap *in,
                                                         uint16_t *hb_terms, int dim, int hidden) {
    static_assert(S >= 2 && (!W1 || S >= 3), "prefill_gate_up_tma_body: at least 2 stages, 3 with W1");
    constexpr int T = PREFILL_TERMS, NT = T * B / 8, P = GEMM_PAIRS * WGS;
    constexpr int PREFETCH = W1 ? S - 2 : S - 1;
    constexpr int STAGE = TMA_STAGE_BYTES(B, WGS), A_BYTES = WGS * GEMM_A_BYTES;
    static_assert(GEMM_A_BYTES == 2 * GEMM_WARPS * 1024, "prefill_gate_up_tma_body: a tile is GEMM_WARPS pairs of 8-row boxes");
    extern __shared__ __align__(128) unsigned char gemm_smem[];
    __shared__ __align__(8) uint64_t mbars[S]; /* each stage's `full` */
    const int tid = threadIdx.x, n_kt = gemm_k_tiles(dim), row0 = (int)blockIdx.x * P;
    const uint32_t smem = ((uint32_t)__cvta_generic_to_shared(gemm_smem) + 1023u) & ~1023u;
    const uint32_t bars = (uint32_t)__cvta_generic_to_shared(mbars);
    const uint32_t a_wg = (uint32_t)(tid / GEMM_THREADS) * GEMM_A_BYTES; /* this warpgroup's weight tile in a stage */
    if (tid == 0) {
        for (int s = 0; s < S; s++) mbar_init(bars + 8 * s, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); /* the inits, seen by the async proxy */
    }
    __syncthreads();
    /* thread 0's: the weights' boxes of K tile kt into stage st, its arrival expecting the stage's
     * bytes (the weights' and the inputs'); rows 16 j .. 16 j + 7 of the stage's weights gate's rows
     * row0 + 8 j.., the next 8 up's, as prefill_gemm_body's pairs (warpgroup w's tile: j from 4 w) */
    auto load_a = [&](int st, int kt) {
        const uint32_t a = smem + st * STAGE, bar = bars + 8 * st;
        mbar_arrive_expect_tx(bar, STAGE);
#pragma unroll
        for (int j = 0; j < WGS * GEMM_WARPS; j++) {
            tma_load_2d(a + 2048 * j, gate, kt * GEMM_KT, row0 + 8 * j, bar);
            tma_load_2d(a + 2048 * j + 1024, up, kt * GEMM_KT, row0 + 8 * j, bar);
        }
    };
    auto load_b = [&](int st, int kt) { tma_load_2d(smem + st * STAGE + A_BYTES, in, kt * GEMM_KT, 0, bars + 8 * st); };

    /* the weights of the first stages before the wait (they do not depend on the kernel before) */
    if (tid == 0)
        for (int s = 0; s < PREFETCH && s < n_kt; s++) load_a(s, s);
    pdl_wait();
    pdl_launch_dependents();
    if (tid == 0)
        for (int s = 0; s < PREFETCH && s < n_kt; s++) load_b(s, s);

    float c[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.0f;
    for (int i = 0; i < n_kt; i++) {
        __syncthreads(); /* every warp done with stage i - 1, which the next copies overwrite */
        if (tid == 0 && i + PREFETCH < n_kt) {
            load_a((i + PREFETCH) % S, i + PREFETCH);
            load_b((i + PREFETCH) % S, i + PREFETCH);
        }
        mbar_wait(bars + 8 * (i % S), (uint32_t)(i / S) & 1u); /* stage i's copies landed */
        const uint32_t stage = smem + (i % S) * STAGE, a_base = stage + a_wg, b_base = stage + A_BYTES;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < GEMM_KT / 16; kk++) wgmma_k16<NT>(c, gemm_desc(a_base + 32 * kk), gemm_desc(b_base + 32 * kk));
        wgmma_commit_wait<W1 ? 1 : 0>();
    }
    if constexpr (W1) wgmma_wait_all(); /* the last stage's sums */
    prefill_gemm_store<B, P>(c, hidden, prefill_gate_up_store<B>(hb_terms, hidden));
}
#endif

/* gate and up + SiLU on post_attention_layernorm's output as terms (prefill_rms_terms_body):
 * hb = silu(gate . x) * (up . x), stored as down's input terms, (PREFILL_TERMS, B, hidden); as a
 * GEMM (prefill_gemm_body) or by prefill_pairs_body. */
template <int B, bool GEMM>
__device__ __forceinline__ void prefill_gate_up_silu_body(const uint16_t *wg, const uint16_t *wu, const uint16_t *x_terms,
                                                          uint16_t *hb_terms, int dim, int hidden) {
    auto pair = [&](int p, const uint4 **a, const uint4 **b) {
        *a = reinterpret_cast<const uint4 *>(wg + (size_t)p * dim);
        *b = reinterpret_cast<const uint4 *>(wu + (size_t)p * dim);
    };
    auto store = prefill_gate_up_store<B>(hb_terms, hidden);
    if constexpr (GEMM)
        prefill_gemm_body<B, GATE_UP_GEMM_STAGES, GATE_UP_GEMM_WAIT1>(hidden, dim, 0, gemm_k_tiles(dim), x_terms, pair, store);
    else prefill_pairs_body<B>(hidden, dim, 0, (dim + 31) / 32, x_terms, pair, store);
}

// ---------------------------------------------------------------------------------------------
// Prefill attention, every query row of a batch in one block (MODEL_PREFILL_FLASH, a plan choice). A block
// takes one KV head, one split of the positions (as the decode attention's splits, counted from
// the batch's last position) and FLASH_ROWS query rows (row r: token r / KV_MUL, head r % KV_MUL
// of the group), on the tensor cores (prefill_flash_mma_body, below). attention_body reads each key
// and value once for MODEL_PREFILL_ATT_TOKENS tokens; at depth 4096 on the 1B shape a 32-token
// batch's attention took ~137 us a layer that way, in 4224 blocks each paying the whole latency
// chain. The flash form, in fp32: 1B prompt at depth 4096 +72%, 16384 +109% (docs/performance.md,
// D82); on the tensor cores against fp32 (D83, 128-token prompt): 1B +8.6% / +12.4% / +66% at depths
// 0 / 4096 / 16384, 7B +8.7% / +14.0% / +70%.

#define FLASH_ROWS 64     /* query rows a block */
#define FLASH_WARP_ROWS 8 /* a warp's rows */
/* Most splits the combining block takes: 192 at either head size, the shared memory of the fp32
 * flash kernel's queries and probabilities (rows of FLASH_WARP_ROWS, tiles of FLASH_TILE positions)
 * that it was first written for. Contexts with more splits (past 196608 positions) take
 * attention_body's prefill. */
#define FLASH_TILE(hd) ((hd) <= 64 ? 128 : 64)
#define FLASH_MAX_SPLITS(hd) \
    ((int)(((size_t)FLASH_ROWS * (hd) + (size_t)(MODEL_ATT_THREADS / WARP_SIZE) * FLASH_WARP_ROWS * FLASH_TILE(hd)) / FLASH_ROWS))

#define FLASH_COMBINE_LOADS 8 /* splits' partial sums a thread of prefill_flash_combine loads at once */
/* A prefill flash block of a context with n_active > 1 splits, after its rows' partial sums (part_acc,
 * unnormalized) and (max, sum) (part_ml) are stored: it counts itself in, and the last of its KV head's
 * and row group's splits weighs them all into out, in split order. w: shared memory for the weights,
 * (rows, n_active) floats; THREADS: the block's. */
template <int HD, int KV_MUL, int THREADS>
__device__ __forceinline__ void prefill_flash_combine(float *w, const float *part_acc, const float *part_ml, unsigned *counters,
                                                      att_out out, int q_dim, int n_kv_heads, int row0, int rows, int n_active,
                                                      int n_splits) {
    __shared__ bool last;
    const int tid = threadIdx.x, kvh = blockIdx.x;
    const size_t parts = (size_t)n_kv_heads * KV_MUL * n_splits;
    auto token_of = [](int r) { return r / KV_MUL; };
    auto head_of = [&](int r) { return kvh * KV_MUL + r % KV_MUL; };
    __threadfence();
    __syncthreads();
    unsigned *counter = &counters[blockIdx.z * n_kv_heads + kvh];
    if (tid == 0) last = atomicAdd(counter, 1u) == (unsigned)n_active - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    /* each row's weights of the splits (a thread a row, the loads FLASH_COMBINE_LOADS splits at a
     * time, so that a thread waits for L2 once a round, not once a split), then each (row, dim)
     * output, the sums in split order */
    constexpr int U = FLASH_COMBINE_LOADS;
    for (int r = tid; r < rows; r += THREADS) {
        const int t = token_of(row0 + r), h = head_of(row0 + r);
        const float2 *ml = reinterpret_cast<const float2 *>(part_ml + (size_t)t * parts * 2 + (size_t)h * n_splits * 2);
        float *wr = w + r * n_active;
        float M = -INFINITY, den = 0.0f;
        for (int s0 = 0; s0 < n_active; s0 += U) {
            float v[U];
#pragma unroll
            for (int u = 0; u < U; u++) v[u] = s0 + u < n_active ? __ldcg(&ml[s0 + u].x) : -INFINITY;
#pragma unroll
            for (int u = 0; u < U; u++) M = fmaxf(M, v[u]);
        }
        for (int s0 = 0; s0 < n_active; s0 += U) { /* again (from L2): the sums need the max */
            float2 v[U];
#pragma unroll
            for (int u = 0; u < U; u++) v[u] = s0 + u < n_active ? __ldcg(&ml[s0 + u]) : make_float2(-INFINITY, 0.0f);
#pragma unroll
            for (int u = 0; u < U; u++)
                if (s0 + u < n_active) {
                    wr[s0 + u] = __expf(v[u].x - M);
                    den += wr[s0 + u] * v[u].y;
                }
        }
        for (int s2 = 0; s2 < n_active; s2++) wr[s2] /= den;
    }
    __syncthreads();
    /* a thread's outputs: float4s tid + THREADS u of the rows' (rows, HD / 4), all of them in flight
     * at each split */
    constexpr int V4 = HD / 4, PER = (FLASH_ROWS * V4 + THREADS - 1) / THREADS;
    float4 num[PER];
#pragma unroll
    for (int u = 0; u < PER; u++) num[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int s2 = 0; s2 < n_active; s2++) {
#pragma unroll
        for (int u = 0; u < PER; u++) {
            const int i = tid + THREADS * u, r = i / V4;
            if (r >= rows) break;
            const int t = token_of(row0 + r), h = head_of(row0 + r);
            const float4 a = __ldcg(reinterpret_cast<const float4 *>(part_acc + (size_t)t * parts * HD + ((size_t)h * n_splits + s2) * HD) + i % V4);
            const float wt = w[r * n_active + s2];
            num[u].x += wt * a.x, num[u].y += wt * a.y, num[u].z += wt * a.z, num[u].w += wt * a.w;
        }
    }
#pragma unroll
    for (int u = 0; u < PER; u++) {
        const int i = tid + THREADS * u, r = i / V4;
        if (r >= rows) break;
        const int t = token_of(row0 + r), h = head_of(row0 + r);
        out.put4((size_t)t * q_dim + h * HD + 4 * (i % V4), num[u]);
    }
    if (tid == 0) *counter = 0;
}

// ---------------------------------------------------------------------------------------------
// Prefill attention on the tensor cores: blocks of a KV head, a split and FLASH_ROWS query rows,
// the combine above, splits of at least FMMA_MIN_CHUNK positions, with
// four warps of 16 query rows. fp16 mma.m16n8k16 with fp32 sums, as the decode step's tensor-core
// attention (attention_body with MMA_HD): the fp32 queries (scaled) and probabilities go in as two
// fp16 terms each (hi + lo), the cached keys and values are fp16 already. A tile of FMMA_TILE
// positions' keys and values is staged in shared memory (cp.async, two stages) and read by every
// warp through ldmatrix:
// - scores S = Q K^T: A the warp's queries (16 rows x 16 dims a k-step, from shared memory), B the
//   keys as stored, (position, dim) rows, 8 positions an n-tile;
// - each row's running max and sum over the tiles (FlashAttention-2: the sums and outputs rescaled
//   when the max grows), in the four lanes that hold the row;
// - outputs O += P V: A the probabilities, straight from the scores' accumulators (two n-tiles of
//   scores are one k-step of positions), B the values through ldmatrix.trans.
// Shared memory rows are hd halves with their 16-byte chunks XOR-swizzled by the row (fmma_off), so
// that ldmatrix's eight rows at one chunk fall in eight bank groups. tests/bench/flash_mma_sim.py
// checks the fragments' index arithmetic lane by lane in NumPy (CI runs it).

/* Fewest positions a split of prefill_flash_mma_body takes (above the prompt's splits, att_split_len).
 * Its blocks are short and each split adds to the last block's combine: splits of 1024 against the
 * prompt's 256-512 measured faster by 22% at depth 4096 and 29-51% at 16384 in the kernel alone
 * (1B, 7B; docs/performance.md, D83). Tests build 5 (many splits, the combine). */
#ifndef FMMA_MIN_CHUNK
#define FMMA_MIN_CHUNK ATT_TILE
#endif
#define FMMA_WARPS (FLASH_ROWS / 16)
#define FMMA_THREADS (FMMA_WARPS * WARP_SIZE)
#ifndef FMMA_TILE
#define FMMA_TILE 64 /* positions a tile: a multiple of 16 */
#endif
static_assert(FMMA_TILE % 16 == 0, "FMMA_TILE: whole k-steps of 16 positions");
/* Dynamic shared memory: two stages of a tile's keys and values, then the block's queries' hi and lo
 * terms, all fp16 rows of hd */
#define FMMA_STAGE_BYTES(hd) ((size_t)(2 * 2 * FMMA_TILE + 2 * FLASH_ROWS) * (hd) * 2)
/* ... or the combine's weights, (FLASH_ROWS, FLASH_MAX_SPLITS) floats, if more (tiles of fewer positions) */
#define FMMA_COMBINE_BYTES(hd) ((size_t)FLASH_ROWS * FLASH_MAX_SPLITS(hd) * 4)
#define FMMA_SMEM_BYTES(hd) (FMMA_STAGE_BYTES(hd) > FMMA_COMBINE_BYTES(hd) ? FMMA_STAGE_BYTES(hd) : FMMA_COMBINE_BYTES(hd))

__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

/* Byte offset of 16-byte chunk c of row r in rows of HD halves, the chunks swizzled */
template <int HD>
__device__ __forceinline__ uint32_t fmma_off(int r, int c) {
    return (uint32_t)(r * HD * 2 + ((c ^ (r & 7)) << 4));
}

template <int B, int HD, int KV_MUL>
__device__ __forceinline__ void prefill_flash_mma_body(const float *q, const uint16_t *kc, const uint16_t *vc, const int *io,
                                                       float *part_acc, float *part_ml, unsigned *counters, att_out out,
                                                       int q_dim, int n_kv_heads, int ctx, int n_splits, int min_splits) {
    static_assert(HD == 64 || HD == 128, "prefill attention on the tensor cores: heads of 64 or 128");
    constexpr int T = FMMA_TILE, CH = HD / 8 /* chunks a row */, NS = T / 8 /* score n-tiles */, NO = HD / 8 /* output n-tiles */;
    constexpr int ROWS = B * KV_MUL, TILE_BYTES = T * HD * 2;
    extern __shared__ __align__(128) unsigned char fmma_smem[];
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(fmma_smem);
    const uint32_t q_hi = 4 * TILE_BYTES, q_lo = q_hi + FLASH_ROWS * HD * 2; /* offsets; stage s: keys at 2 s TILE_BYTES */
    const int kvh = blockIdx.x, split = blockIdx.y, row0 = blockIdx.z * FLASH_ROWS;
    const int tid = threadIdx.x, lane = tid % WARP_SIZE, wid = tid / WARP_SIZE, g = lane / 4, cq = lane % 4;
    pdl_wait();
    pdl_launch_dependents();
    const int first_new = __ldcg(&io[IO_POS]), count = __ldcg(&io[IO_COUNT]), n = first_new + count;
    const int chunk = max(att_split_len(n, n_splits, min_splits, true), FMMA_MIN_CHUNK), n_active = (n + chunk - 1) / chunk;
    const int rows = min(FLASH_ROWS, min(ROWS, count * KV_MUL) - row0); /* this block's rows that are the batch's */
    if (split >= n_active || rows <= 0) return;
    const int start = split * chunk, len = min(n, start + chunk) - start, n_tiles = (len + T - 1) / T;
    const size_t parts = (size_t)n_kv_heads * KV_MUL * n_splits;
    auto token_of = [](int r) { return r / KV_MUL; };
    auto head_of = [&](int r) { return kvh * KV_MUL + r % KV_MUL; };

    const uint16_t *kg = kc + kv_at(start, kvh, ctx, HD), *vg = vc + kv_at(start, kvh, ctx, HD);
    auto load_tile = [&](int it) {
        const uint32_t ks = sbase + (it % 2) * 2 * TILE_BYTES, vs = ks + TILE_BYTES;
        for (int i = tid; i < T * CH; i += FMMA_THREADS) {
            const int p = i / CH, c = i % CH, pos = it * T + p;
            const size_t at = pos < len ? (size_t)pos * HD + 8 * c : 0;
            cp_async16_s(ks + fmma_off<HD>(p, c), kg + at, pos < len); /* zeros past the split */
            cp_async16_s(vs + fmma_off<HD>(p, c), vg + at, pos < len);
        }
    };
    load_tile(0);
    cp_async_commit();
    /* the block's queries, scaled, as hi and lo fp16 terms (0 past its rows) */
    const float scale = rsqrtf((float)HD);
    for (int i = tid; i < FLASH_ROWS * CH; i += FMMA_THREADS) {
        const int r = i / CH, c = i % CH;
        float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f), b = a;
        if (r < rows) {
            const float4 *qg = reinterpret_cast<const float4 *>(q + (size_t)token_of(row0 + r) * q_dim + head_of(row0 + r) * HD + 8 * c);
            a = __ldcg(qg), b = __ldcg(qg + 1);
        }
        uint4 hi, lo;
        split_h2(a.x * scale, a.y * scale, &hi.x, &lo.x);
        split_h2(a.z * scale, a.w * scale, &hi.y, &lo.y);
        split_h2(b.x * scale, b.y * scale, &hi.z, &lo.z);
        split_h2(b.z * scale, b.w * scale, &hi.w, &lo.w);
        *reinterpret_cast<uint4 *>(fmma_smem + q_hi + fmma_off<HD>(r, c)) = hi;
        *reinterpret_cast<uint4 *>(fmma_smem + q_lo + fmma_off<HD>(r, c)) = lo;
    }

    /* this warp's rows wr + g (h = 0) and wr + g + 8 (h = 1) of the block: the last position of the
     * split each sees (its token's; -1 past the block's rows), running max m and sum l (this lane's
     * part of the row until the end) */
    const int wr = 16 * wid;
    const bool live = wr < rows;
    int seen[2];
    float m[2], l[2], o[NO][4];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = wr + g + 8 * h;
        seen[h] = r < rows ? first_new + token_of(row0 + r) - start : -1;
        m[h] = -INFINITY, l[h] = 0.0f;
    }
#pragma unroll
    for (int t = 0; t < NO; t++) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;

    for (int it = 0; it < n_tiles; it++) {
        cp_async_wait_group<0>();
        __syncthreads(); /* tile it is in (and the queries), every warp done with the stage the next copies overwrite */
        if (it + 1 < n_tiles) load_tile(it + 1);
        cp_async_commit();
        if (!live) continue;
        const uint32_t ks = sbase + (it % 2) * 2 * TILE_BYTES, vs = ks + TILE_BYTES;
        float sc[NS][4];
#pragma unroll
        for (int j = 0; j < NS; j++) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            uint32_t ah[4], al[4]; /* rows g, g + 8 at dims 16 kk + 2 cq.. and + 8.. */
            const uint32_t qa = fmma_off<HD>(wr + lane % 8 + 8 * (lane / 8 % 2), 2 * kk + lane / 16);
            ldsm_x4(sbase + q_hi + qa, ah[0], ah[1], ah[2], ah[3]);
            ldsm_x4(sbase + q_lo + qa, al[0], al[1], al[2], al[3]);
#pragma unroll
            for (int j = 0; j < NS; j += 2) { /* positions 8 j.. and 8 j + 8.. */
                uint32_t b0, b1, b2, b3;
                ldsm_x4(ks + fmma_off<HD>(8 * j + lane % 8 + 8 * (lane / 16), 2 * kk + lane / 8 % 2), b0, b1, b2, b3);
                mma_f16_16x8x16(sc[j], ah[0], ah[1], ah[2], ah[3], b0, b1);
                mma_f16_16x8x16(sc[j], al[0], al[1], al[2], al[3], b0, b1);
                mma_f16_16x8x16(sc[j + 1], ah[0], ah[1], ah[2], ah[3], b2, b3);
                mma_f16_16x8x16(sc[j + 1], al[0], al[1], al[2], al[3], b2, b3);
            }
        }
        /* sc[j][2 h + e]: row h's score at position it T + 8 j + 2 cq + e; masked past what it sees */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < NS; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int pos = it * T + 8 * j + 2 * cq + e;
                    if (pos > seen[h] || pos >= len) sc[j][2 * h + e] = -INFINITY;
                    mx = fmaxf(mx, sc[j][2 * h + e]);
                }
            mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 2));
            const float m_new = fmaxf(m[h], mx);
            /* nothing seen yet: no shift, every probability 0 */
            const float shift = m_new == -INFINITY ? 0.0f : m_new, rescale = m_new == -INFINITY ? 1.0f : __expf(m[h] - m_new);
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < NS; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    sc[j][2 * h + e] = __expf(sc[j][2 * h + e] - shift);
                    sum += sc[j][2 * h + e];
                }
            l[h] = l[h] * rescale + sum;
            m[h] = m_new;
#pragma unroll
            for (int t = 0; t < NO; t++) o[t][2 * h] *= rescale, o[t][2 * h + 1] *= rescale;
        }
        /* O += P V, 16 positions a k-step */
#pragma unroll
        for (int kk = 0; kk < T / 16; kk++) {
            uint32_t ph[4], pl[4]; /* A: rows g, g + 8 at positions 16 kk + 2 cq.. and + 8.. */
            split_h2(sc[2 * kk][0], sc[2 * kk][1], &ph[0], &pl[0]);
            split_h2(sc[2 * kk][2], sc[2 * kk][3], &ph[1], &pl[1]);
            split_h2(sc[2 * kk + 1][0], sc[2 * kk + 1][1], &ph[2], &pl[2]);
            split_h2(sc[2 * kk + 1][2], sc[2 * kk + 1][3], &ph[3], &pl[3]);
#pragma unroll
            for (int t = 0; t < NO; t += 2) { /* dims 8 t.. and 8 t + 8.. */
                uint32_t b0, b1, b2, b3;
                ldsm_x4_trans(vs + fmma_off<HD>(16 * kk + lane % 8 + 8 * (lane / 8 % 2), t + lane / 16), b0, b1, b2, b3);
                mma_f16_16x8x16(o[t], ph[0], ph[1], ph[2], ph[3], b0, b1);
                mma_f16_16x8x16(o[t], pl[0], pl[1], pl[2], pl[3], b0, b1);
                mma_f16_16x8x16(o[t + 1], ph[0], ph[1], ph[2], ph[3], b2, b3);
                mma_f16_16x8x16(o[t + 1], pl[0], pl[1], pl[2], pl[3], b2, b3);
            }
        }
    }
    cp_async_wait_group<0>();

    /* the warp's rows: done (one split), or this split's partial sums for the last block to combine */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        l[h] += __shfl_xor_sync(0xFFFFFFFFu, l[h], 1);
        l[h] += __shfl_xor_sync(0xFFFFFFFFu, l[h], 2);
        const int r = wr + g + 8 * h;
        if (!live || r >= rows) continue;
        const int t = token_of(row0 + r), head = head_of(row0 + r);
#pragma unroll
        for (int j = 0; j < NO; j++) {
            const int d = 8 * j + 2 * cq;
            if (n_active == 1)
                out.put2((size_t)t * q_dim + head * HD + d, o[j][2 * h] / l[h], o[j][2 * h + 1] / l[h]);
            else
                *reinterpret_cast<float2 *>(&part_acc[(size_t)t * parts * HD + ((size_t)head * n_splits + split) * HD + d]) =
                    make_float2(o[j][2 * h], o[j][2 * h + 1]);
        }
        if (n_active > 1 && cq == 0)
            *reinterpret_cast<float2 *>(&part_ml[(size_t)t * parts * 2 + ((size_t)head * n_splits + split) * 2]) = make_float2(m[h], l[h]);
    }
    if (n_active > 1)
        prefill_flash_combine<HD, KV_MUL, FMMA_THREADS>(reinterpret_cast<float *>(fmma_smem), part_acc, part_ml, counters, out,
                                                        q_dim, n_kv_heads, row0, rows, n_active, n_splits);
}

/* The last token's residual row of a batch of B whose last layer ran through (a batch that ends a
 * prompt whose last token's logits or choice are wanted): row io[IO_COUNT] - 1 of x with the last
 * layer's `parts` partial sums of down added, in prefill_rms_terms_body's order, into x's first row,
 * where the decode step's LM head reads it. Rows past the first are only read. */
template <int B>
__device__ __forceinline__ void prefill_last_row_body(float *__restrict__ x, const float *__restrict__ part, int parts,
                                                      const int *io, int dim) {
    pdl_wait();
    const int t = __ldcg(&io[IO_COUNT]) - 1;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < dim; i += gridDim.x * blockDim.x) {
        float v = x[(size_t)t * dim + i];
        for (int s = 0; s < parts; s++) v += __ldcg(&part[((size_t)s * B + t) * dim + i]);
        x[i] = v;
    }
}

/* The batch's end: the position past its tokens, or with keep_last at its last token, whose step's
 * end (after the LM head) advances it once more. */
__device__ __forceinline__ void prefill_end_body(int *io, int keep_last) {
    pdl_wait();
    if (blockIdx.x == 0 && threadIdx.x == 0) io[IO_POS] += io[IO_COUNT] - keep_last;
}

#endif
