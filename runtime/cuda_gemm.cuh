/* cuda_gemm.cuh - the prompt path's matrix products on the tensor cores: a batch of B prompt
 * tokens against a weight matrix, so that each weight row is read once for the whole batch.
 *
 * Two forms, both fed the same way: each input, after the norm, as PREFILL_TERMS values of the
 * weights' 16-bit type that sum to it (the terms, (PREFILL_TERMS, B, K)), fp32 sums, a pair of
 * weight rows (RoPE partners, gate and up, or two rows of o_proj / down) in rows g and g + 8 of a
 * 16-row tile; the caller says which rows a pair has (pair(p, &ra, &rb)) and where its sums go
 * (store(p, t, a, b)):
 * - prefill_gemm_body: a tiled GEMM through shared memory on wgmma (sm_90a) or mma.sync, over all
 *   of K or a split of it (prefill_split_body); on TMA-copied tiles in prefill_gemm_tma_body;
 * - prefill_pairs_body: mma row tiles straight from global memory, where a GEMM's tiles would
 *   leave SMs idle.
 * The weight format W (cuda_weights.cuh) is a template parameter of every core: its tensor-core
 * type (W::BF16) is the terms' and the mma's. prefill_gemm_body takes every format: a block format's
 * weight tiles are dequantized to fp16 into its shared memory (gemm_q_tiles); prefill_pairs_body and
 * prefill_gemm_tma_body take dense 16-bit formats (W::DENSE16).
 *
 * The stages that use them (QKV, o_proj, gate/up, down) are in cuda_prefill.cuh. */
#ifndef INGOT_CUDA_GEMM_CUH
#define INGOT_CUDA_GEMM_CUH

#include <cuda.h> /* CUtensorMap (GEMM_TMA) */

#include "cuda_common.cuh"

/* MODEL_GEMM_WGMMA: Hopper's warpgroup MMA (wgmma.mma_async, sm_90a) reads both tiles from shared memory
 * itself, once for the block's four warps, instead of each warp's ldmatrix and mma.sync: a warp's
 * 16 rows against the batch's 2 B columns read 16 B fragments for each A fragment from shared
 * memory, which at batches of 64 bounds the mma.sync loop by shared memory's bandwidth, not the
 * tensor cores. Its tiles are the same: 128-byte rows, chunks swizzled as gemm_swz does, which is
 * wgmma's 128-byte swizzle when a tile starts on 1024 bytes. The generated code's default on sm_90
 * (the plan's gemm_wgmma; the Makefile builds sm_90a). At batches of 64 with every matvec a GEMM
 * (docs/performance.md, D89): prompt 1B +17%, 7B +24% against mma.sync; at batches of 32 with
 * gate/up the only GEMM it lost (1B -0.9%, 7B -6%). */


/* 16-row tiles a warp multiplies with each input it loads: a block reads its inputs from L2 once for
 * 32 rows (1B prompt +26%, 7B +33% against one tile; docs/performance.md, D80) */
#define PREFILL_ROW_TILES 2
#define PREFILL_BLOCK_PAIRS (8 * PREFILL_ROW_TILES) /* pairs of rows a block takes: 8 a tile of the mma's 16 rows */
/* 32-value chunks of K a warp holds in flight (4 at 16 spills: -16%; 32 takes 1 for its registers) */
#define PREFILL_UNROLL(B) ((B) == 8 ? 4 : (B) == 16 ? 2 : 1)

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

/* Terms of the weights' tensor-core type (bf16 or fp16: W::BF16) an fp32 input is split into for the tensor
 * cores: x = t0 + t1 + ..., each the rounding of what the previous left. One: each input rounded to
 * the type, as transformers', llama.cpp's and TensorRT-LLM's 16-bit GEMMs take it, with fp32 sums.
 * The prompt's logits then move ~6e-3 from exact inputs on the tiny models (tests/bench/
 * prefill_terms.py), within tests/test_gpu.py's GPU_PROMPT_TOLERANCE of the CPU's, and a greedy text
 * can part from the CPU's at a near tie (--exact-prompt feeds a prompt a step a token). Two terms
 * (16 bits of each input, 2^-17 from the decode kernels' fp32 products) kept the CPU's text and
 * cost the prompt's tensor-core work twice: one measured 7B +43.5%, 1B +19.4% (docs/performance.md,
 * D98, D120). The cores keep the count as a parameter: every layout is (PREFILL_TERMS, B, K). */
#define PREFILL_TERMS 1

/* A value of the terms' 16-bit type, round to nearest; *rest gets what the rounding left out. */
template <typename W>
__device__ __forceinline__ uint16_t w_split(float *rest) {
    if constexpr (W::BF16) {
        const __nv_bfloat16 v = __float2bfloat16_rn(*rest);
        *rest -= __bfloat162float(v);
        return __bfloat16_as_ushort(v);
    } else {
        const __half v = __float2half_rn(*rest);
        *rest -= __half2float(v);
        return __half_as_ushort(v);
    }
}

/* v as PREFILL_TERMS terms, at terms[t * stride] (the layout the prefill matvecs read: (term, B, K)) */
template <typename W>
__device__ __forceinline__ void store_terms(uint16_t *terms, size_t stride, float v) {
#pragma unroll
    for (int t = 0; t < PREFILL_TERMS; t++) terms[t * stride] = w_split<W>(&v);
}

/* four consecutive values v as their terms, 8 bytes a term at terms[t * stride] (terms 8-byte aligned) */
template <typename W>
__device__ __forceinline__ void store_terms4(uint16_t *terms, size_t stride, float4 v) {
    float y[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int t = 0; t < PREFILL_TERMS; t++) {
        const uint16_t a = w_split<W>(&y[0]), b = w_split<W>(&y[1]), c = w_split<W>(&y[2]), d = w_split<W>(&y[3]);
        *reinterpret_cast<uint2 *>(terms + t * stride) = make_uint2(a | (uint32_t)b << 16, c | (uint32_t)d << 16);
    }
}

/* Two fp32 values as the terms' 16-bit type, packed low then high (an mma operand register);
 * *rest_lo and *rest_hi get what the rounding left out. */
template <typename W>
__device__ __forceinline__ uint32_t pack_w2(float *rest_lo, float *rest_hi) {
    if constexpr (W::BF16) {
        const __nv_bfloat162 v = __floats2bfloat162_rn(*rest_lo, *rest_hi);
        const float2 back = __bfloat1622float2(v);
        *rest_lo -= back.x;
        *rest_hi -= back.y;
        return *reinterpret_cast<const uint32_t *>(&v);
    } else {
        const __half2 v = __floats2half2_rn(*rest_lo, *rest_hi);
        const float2 back = __half22float2(v);
        *rest_lo -= back.x;
        *rest_hi -= back.y;
        return *reinterpret_cast<const uint32_t *>(&v);
    }
}

/* two consecutive values a, b as their terms, 4 bytes a term at terms[t * stride] (terms 4-byte aligned) */
template <typename W>
__device__ __forceinline__ void store_terms2(uint16_t *terms, size_t stride, float a, float b) {
#pragma unroll
    for (int t = 0; t < PREFILL_TERMS; t++) *reinterpret_cast<uint32_t *>(terms + t * stride) = pack_w2<W>(&a, &b);
}

/* c (16 x 8, fp32) += a (16 x 16, row-major) . b (16 x 8, column-major), in the terms' type. */
template <typename W>
__device__ __forceinline__ void mma_16x8x16(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                            uint32_t b1) {
    if constexpr (W::BF16)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
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
template <typename W, int B, int BS = B, typename Pair, typename Store>
__device__ __forceinline__ void prefill_pairs_body(int n_pairs, int K, int c0, int c1, const uint16_t *in, Pair pair, Store store,
                                                   int t0 = 0);
/* ... tokens t0 .. t0 + B - 1 of a batch of BS (BS > B: the batch's inputs in (PREFILL_TERMS, BS, K)) */
template <typename W, int B, int BS, typename Pair, typename Store>
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
    static_assert(W::DENSE16, "prefill_pairs_body: dense 16-bit weights, 16-byte chunks of 8");
    typename W::row_t ra[R], rb[R];
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
                wa[u][rt] = in_k ? W::load(ra[rt], k / 8) : make_uint4(0, 0, 0, 0);
                wb[u][rt] = in_k ? W::load(rb[rt], k / 8) : make_uint4(0, 0, 0, 0);
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
                        mma_16x8x16<W>(c[rt][j], a.x, b.x, a.y, b.y, x.x, x.y);
                        mma_16x8x16<W>(c[rt][j], a.z, b.z, a.w, b.w, x.z, x.w);
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

/* Batches of up to 64 in one pass; of 128 or 256 (the sums' gathering would take 64 KB of shared
 * memory and a lane's 128 sums) in passes of 64, B / 64 of them, the block's weights read B / 64
 * times (after the first mostly from L2). */
template <typename W, int B, int BS, typename Pair, typename Store>
__device__ __forceinline__ void prefill_pairs_body(int n_pairs, int K, int c0, int c1, const uint16_t *in, Pair pair, Store store,
                                                   int t0) {
    if constexpr (B > 64) {
        static_assert(B % 64 == 0, "prefill_pairs_body: batches past 64 in whole passes of 64");
#pragma unroll
        for (int p = 0; p < B / 64; p++) {
            if (p > 0) __syncthreads(); /* the last pass's sums gathered before the next one's reuse their shared memory */
            prefill_pairs_part<W, 64, B>(n_pairs, K, c0, c1, in, pair, store, 64 * p);
        }
    } else prefill_pairs_part<W, B, BS>(n_pairs, K, c0, c1, in, pair, store, t0);
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

#if MODEL_GEMM_WGMMA
/* wgmma's shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format") for a K-major tile
 * of 128-byte rows in the 128-byte swizzle: start address >> 4, leading byte offset 16 (unused when
 * swizzled), stride byte offset 1024 (from 8 rows to the next 8), swizzle mode 1 (bits 62-63). A
 * step of 16 values of K within the rows is 32 bytes more on the start address. */
__device__ __forceinline__ uint64_t gemm_desc(uint32_t addr) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)(16 >> 4) << 16) | ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}
#define WG_C4(n) "+f"(c[n][0]), "+f"(c[n][1]), "+f"(c[n][2]), "+f"(c[n][3])
/* c (64 x NT * 8, this thread's part as mma_16x8x16's C in each 8-column tile n) += A . B over 16
 * values of K, A (64 rows) and B (NT * 8 rows) K-major in shared memory (descriptors); the block's
 * four warps issue it together (a warpgroup), between wgmma_fence and wgmma_commit_wait. */
template <bool BF16, int NT>
__device__ __forceinline__ void wgmma_k16(float (&c)[NT][4], uint64_t a, uint64_t b);
/* a specialization of wgmma_k16 for NT tiles of 8 columns (the shape's N) of type WG_TYPE (BF16): D
 * its accumulators' operands, A, B and P the operand numbers of the descriptors and of scale-d's
 * predicate (set: add) */
#define WGMMA_K16(NT, N, D, A, B, P, ...)                                                                     \
    template <>                                                                                               \
    __device__ __forceinline__ void wgmma_k16<WG_BF16, NT>(float (&c)[NT][4], uint64_t a, uint64_t b) {        \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #P ", 0;\n"                                          \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." WG_TYPE "." WG_TYPE " {" D "}, %" #A ", %" #B \
                     ", p, 1, 1, 0, 0;\n}\n"                                                                    \
                     : __VA_ARGS__                                                                             \
                     : "l"(a), "l"(b), "r"(1));                                                               \
    }
/* the shapes, N 8 to 256, of one input type */
#define WGMMA_K16_SHAPES \
WGMMA_K16(1, 8, "%0,%1,%2,%3", 4, 5, 6, WG_C4(0)) \
WGMMA_K16(2, 16, "%0,%1,%2,%3,%4,%5,%6,%7", 8, 9, 10, WG_C4(0), WG_C4(1)) \
WGMMA_K16(4, 32, "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15", 16, 17, 18, WG_C4(0), WG_C4(1), WG_C4(2), WG_C4(3)) \
WGMMA_K16(8, 64, \
          "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28," \
          "%29,%30,%31", \
          32, 33, 34, WG_C4(0), WG_C4(1), WG_C4(2), WG_C4(3), WG_C4(4), WG_C4(5), WG_C4(6), WG_C4(7)) \
WGMMA_K16(16, 128, \
          "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31," \
          "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63", \
          64, 65, 66, WG_C4(0), WG_C4(1), WG_C4(2), WG_C4(3), WG_C4(4), WG_C4(5), WG_C4(6), WG_C4(7), WG_C4(8), WG_C4(9), \
          WG_C4(10), WG_C4(11), WG_C4(12), WG_C4(13), WG_C4(14), WG_C4(15)) \
WGMMA_K16(32, 256, \
          "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30," \
          "%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59," \
          "%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88," \
          "%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113," \
          "%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127", \
          128, 129, 130, WG_C4(0), WG_C4(1), WG_C4(2), WG_C4(3), WG_C4(4), WG_C4(5), WG_C4(6), WG_C4(7), WG_C4(8), WG_C4(9), \
          WG_C4(10), WG_C4(11), WG_C4(12), WG_C4(13), WG_C4(14), WG_C4(15), WG_C4(16), WG_C4(17), WG_C4(18), WG_C4(19), WG_C4(20), \
          WG_C4(21), WG_C4(22), WG_C4(23), WG_C4(24), WG_C4(25), WG_C4(26), WG_C4(27), WG_C4(28), WG_C4(29), WG_C4(30), WG_C4(31))
#define WG_BF16 true
#define WG_TYPE "bf16"
WGMMA_K16_SHAPES
#undef WG_BF16
#undef WG_TYPE
#define WG_BF16 false
#define WG_TYPE "f16"
WGMMA_K16_SHAPES
#undef WG_BF16
#undef WG_TYPE
#undef WGMMA_K16_SHAPES
#undef WGMMA_K16
#undef WG_C4
__device__ __forceinline__ void wgmma_fence(void) { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
/* the warp's wgmmas issued since the last commit as a group; then wait until at most N groups are
 * still running */
template <int N>
__device__ __forceinline__ void wgmma_commit_wait(void) {
    asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
/* the same in two steps, so that a block format's next tile is written between them (prefill_gemm_body) */
__device__ __forceinline__ void wgmma_commit(void) { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait(void) { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }
/* wait until no wgmma of the warp runs, then pass the sums c through an empty asm that claims to
 * change them, so that no instruction reading c is scheduled above the wait: a read of an
 * accumulator while its wgmma runs makes ptxas serialize every wgmma of the kernel (C7514). The
 * residual GEMMs' stores at 256 columns had theirs (the bias's + 0.0f) hoisted there: four wgmmas a
 * stage one after another, each waited for (docs/performance.md, D129). */
template <int NT>
__device__ __forceinline__ void wgmma_wait_all(float (&c)[NT][4]) {
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
    for (int n = 0; n < NT; n++) asm volatile("" : "+f"(c[n][0]), "+f"(c[n][1]), "+f"(c[n][2]), "+f"(c[n][3])::"memory");
}
/* this thread's cp.async writes, landed, made visible to the async proxy that wgmma reads through */
__device__ __forceinline__ void fence_proxy_async_shared(void) { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
#endif

/* GEMM_TMA: gate/up's GEMM (prefill_gemm_tma_body) with its tiles copied by the Tensor Memory
 * Accelerator (cp.async.bulk.tensor through tensor maps the host makes, a stage's arrival counted
 * on an mbarrier) instead of 12 cp.async a thread a stage: one thread issues a stage's 9 copies
 * (8 boxes of 8 weight rows, the inputs' tile). Why (ncu on gate/up's cp.async form):
 * a third of the warps' time in issuing the copies and waiting at the stage's barrier, gate/up's
 * weights read at 2.1-2.4 TB/s, half the probe. In specialized builds on wgmma (sm_90a); its
 * stages and wait follow gate/up's (GATE_UP_GEMM_STAGES, GATE_UP_GEMM_WAIT1). Against cp.async at
 * 4 stages with WAIT1: 1B prompt +1.5%, 7B +2.9% at depth 0 (docs/performance.md, D91). */
#if MODEL_GEMM_WGMMA && !MODEL_GENERIC
#define GEMM_TMA (!MODEL_QUANTIZED) /* its boxes are rows of 16-bit weights: a quantized model's gate/up is prefill_gemm_body's */
#else
#define GEMM_TMA 0
#endif
/* GATE_UP_TMA_WIDE: gate/up's TMA body at two warpgroups a block (prefill_gemm_tma_body's WGS),
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
#define GATE_UP_TMA_WIDE MODEL_GATE_UP_TMA_WIDE /* the plan's */
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

/* one 16-byte store of four words to shared memory at addr */
__device__ __forceinline__ void st_shared_v4(uint32_t addr, const uint32_t (&w)[4]) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]) : "memory");
}

/* Bytes of a block format's loaded chunks a GEMM thread holds in flight in registers (gemm_q_tiles'
 * ring): they are the block's only weight bytes in flight, where a dense format's cp.async stages
 * hold theirs. K tiles of them: as many as fit, 1 to 4 (Q4_0 and Q4_1 4; Q8_0 and the K formats 2). */
#define GEMM_Q_RING_BYTES 96
template <typename W>
__host__ __device__ constexpr int gemm_q_ahead(void) {
    constexpr int tile = (int)sizeof(typename W::chunk) * (32 / W::VALS), n = GEMM_Q_RING_BYTES / tile;
    return n < 1 ? 1 : n > 4 ? 4 : n;
}

/* A block format's weight tiles for prefill_gemm_body (W: cuda_weights.cuh), dequantized into its
 * stages by the block's threads instead of copied: thread tid takes tile row r = tid / 2 (the
 * dense tiles' row r: pair 8 (r / 16) + r % 8's a, or b where r % 16 >= 8) and the 32 values
 * 32 (tid % 2) .. of each K tile, CPT chunks of the format. It loads them (W::load, streamed) L
 * tiles before the stage it writes, into a ring of registers (raw), and writes them as fp16
 * (W::to_f32, then each weight rounded once to fp16: the values a kernel of its own wrote into a
 * 16-bit copy of the layer before, D138) into four 16-byte chunks of the row, swizzled as gemm_swz
 * lays the dense tiles out, so the GEMM's loop and sums are the dense path's. Values past K are
 * zeros. */
template <typename W, int L>
struct gemm_q_tiles {
    static constexpr int CPT = 32 / W::VALS; /* chunks of a thread's 32 values */
    static_assert(W::VALS == 8 || W::VALS == 16 || W::VALS == 32, "gemm_q_tiles: chunks of 8, 16 or 32 values");
    using chunk = typename W::chunk;
    typename W::row_t row;
    int k0;     /* the thread's first value of K tile 0 */
    int K;
    uint32_t r; /* its tile row */
    uint32_t h; /* its half of the row's K tile */
    chunk raw[L][CPT];

    template <typename Pair>
    __device__ __forceinline__ void init(Pair pair, int n_pairs, int kt0, int k_len) {
        const int tid = threadIdx.x;
        r = (uint32_t)tid / 2;
        h = (uint32_t)tid % 2;
        typename W::row_t ra, rb;
        pair(min((int)blockIdx.x * GEMM_PAIRS + 8 * ((int)r / 16) + (int)r % 8, n_pairs - 1), &ra, &rb);
        row = r % 16 < 8 ? ra : rb;
        K = k_len;
        k0 = kt0 * GEMM_KT + 32 * (int)h;
    }
    /* whether chunk j of the thread's values in K tile kt lies in K (a block format's rows are whole
     * blocks, so its chunks are in or out together with the block; a dense matrix's are 8 values) */
    __device__ __forceinline__ bool valid(int kt, int j) const { return k0 + kt * GEMM_KT + j * W::VALS < K; }
    /* K tile kt's chunks into u (chunk 0's instead of one past K: read, never used) */
    __device__ __forceinline__ void fetch(chunk (&u)[CPT], int kt) const {
        const int c = (k0 + kt * GEMM_KT) / W::VALS;
#pragma unroll
        for (int j = 0; j < CPT; j++) u[j] = W::load(row, valid(kt, j) ? c + j : 0);
    }
    /* u, K tile kt's, as fp16 into the stage's weight tile at `tile` (zeros past K) */
    __device__ __forceinline__ void put(const chunk (&u)[CPT], uint32_t tile, int kt) const {
        float f[32];
#pragma unroll
        for (int j = 0; j < CPT; j++) W::to_f32(u[j], f + j * W::VALS);
#pragma unroll
        for (int v = 0; v < 4; v++) {
            const bool in_k = valid(kt, 8 * v / W::VALS);
            uint32_t w[4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const __half2 p = __floats2half2_rn(f[8 * v + 2 * k], f[8 * v + 2 * k + 1]);
                w[k] = in_k ? *reinterpret_cast<const uint32_t *>(&p) : 0u;
            }
            st_shared_v4(tile + gemm_swz((int)r, 4 * (int)h + v), w);
        }
    }
};

struct gemm_no_q_tiles {}; /* a dense format's: its tiles are copied */

/* pair(p, &ra, &rb) and store(p, t, a, b) as prefill_pairs_body's, over K's GEMM_KT-value tiles
 * [kt0, kt1) (all of K: gemm_k_tiles(K)); in: the terms (PREFILL_TERMS, B, K). A block of
 * GEMM_THREADS a GEMM_PAIRS pairs, dynamic shared memory GEMM_SMEM_BYTES_AT(B, S): S stages, W1
 * a stage's wgmma left running (GATE_UP_GEMM_WAIT1). A dense 16-bit format's weight tiles are
 * copied into the stages with the inputs' (cp.async); a block format's are dequantized into them
 * by the threads (gemm_q_tiles), each stage's after the wgmma of the stage before is issued. A
 * quantized layer was dequantized whole into fp16 by a kernel of its own before each batch's GEMMs,
 * a write and a read of the layer in 16 bits a batch (docs/performance.md, D116, D138). */
template <typename W, int B, int S, bool W1, typename Pair, typename Store>
__device__ __forceinline__ void prefill_gemm_body(int n_pairs, int K, int kt0, int kt1, const uint16_t *__restrict__ in, Pair pair,
                                                  Store store) {
    constexpr int T = PREFILL_TERMS, J = B / 8, NT = T * J; /* 8-token tiles; n8 tiles of the GEMM's columns */
    constexpr bool DENSE = W::DENSE16;
    constexpr int L = DENSE ? 1 : gemm_q_ahead<W>(); /* the loop unrolled over the ring of a block format's tiles */
    static_assert(DENSE || !W::BF16, "prefill_gemm_body: a block format's tiles are fp16");
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
    static_assert(DENSE || GEMM_THREADS == 4 * GEMM_PAIRS, "gemm_q_tiles: two threads a row of the weights' tile");
    const int c8 = 8 * (tid % 8);
    const uint32_t row_off = gemm_swz(tid / 8, tid % 8); /* + ROWS 128 j for row tid / 8 + ROWS j */
    const uint16_t *arow[4];
    std::conditional_t<DENSE, gemm_no_q_tiles, gemm_q_tiles<W, L>> qa;
    if constexpr (DENSE) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = tid / 8 + ROWS * i;
            typename W::row_t ra, rb;
            pair(min((int)blockIdx.x * GEMM_PAIRS + 8 * (r / 16) + r % 8, n_pairs - 1), &ra, &rb);
            arow[i] = reinterpret_cast<const uint16_t *>(r % 16 < 8 ? ra : rb) + c8;
        }
    } else qa.init(pair, n_pairs, kt0, K);
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
    /* a block format's K tile next into its stage from ring slot u, and tile next + L loaded there */
    auto refill = [&](int u, int next) {
        if constexpr (!DENSE) {
            if (next < n_kt) qa.put(qa.raw[u], smem + (next % S) * GEMM_STAGE_BYTES(B), next);
            if (next + L < n_kt) qa.fetch(qa.raw[u], next + L);
        }
    };

    float c[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.0f;
    /* the weights of the first stages before the wait (they do not depend on the kernel before),
     * the inputs after it; a group a stage's part, so that stage 0 waits for its own two. A block
     * format's first stages are written, and its ring loaded, there too. */
    if constexpr (DENSE) {
#pragma unroll
        for (int s = 0; s < PREFETCH; s++) {
            if (s < n_kt) load_a(s, s);
            cp_async_commit();
        }
    } else {
        typename W::chunk first[PREFETCH][gemm_q_tiles<W, L>::CPT];
#pragma unroll
        for (int s = 0; s < PREFETCH; s++)
            if (s < n_kt) qa.fetch(first[s], s);
#pragma unroll
        for (int u = 0; u < L; u++)
            if (PREFETCH + u < n_kt) qa.fetch(qa.raw[u], PREFETCH + u);
#pragma unroll
        for (int s = 0; s < PREFETCH; s++)
            if (s < n_kt) qa.put(first[s], smem + s * GEMM_STAGE_BYTES(B), s);
    }
    pdl_wait();
    pdl_launch_dependents();
#pragma unroll
    for (int s = 0; s < PREFETCH; s++) {
        if (s < n_kt) load_b(s, s);
        cp_async_commit();
    }
    for (int i0 = 0; i0 < n_kt; i0 += L) {
#pragma unroll
        for (int u = 0; u < L; u++) { /* ring slot u holds tile i + PREFETCH */
            const int i = i0 + u;
            if (i >= n_kt) break;
            cp_async_wait_group<PREFETCH - 1>();
#if MODEL_GEMM_WGMMA
            fence_proxy_async_shared(); /* this thread's cp.async and stores, seen by wgmma */
#endif
            /* stage i is in, and every warp is done with the stage the next copies overwrite (under
             * W1 each warp's wait after the last stage's wgmma saw the one before end) */
            __syncthreads();
            const int next = i + PREFETCH;
            if (next < n_kt) {
                if constexpr (DENSE) load_a(next % S, next);
                load_b(next % S, next);
            }
            cp_async_commit();
            const uint32_t a_base = smem + (i % S) * GEMM_STAGE_BYTES(B), b_base = a_base + GEMM_A_BYTES;
#if MODEL_GEMM_WGMMA
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < GEMM_KT / 16; kk++) wgmma_k16<W::BF16, NT>(c, gemm_desc(a_base + 32 * kk), gemm_desc(b_base + 32 * kk));
            /* done with this stage (WAIT1: with the last one) before the next iteration's copies
             * overwrite it; a block format's next tile is written while it runs */
            if constexpr (DENSE) wgmma_commit_wait<W1 ? 1 : 0>();
            else {
                wgmma_commit();
                refill(u, next);
                wgmma_wait<W1 ? 1 : 0>();
            }
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
                    mma_16x8x16<W>(c[n], a0, a1, a2, a3, b0, b1);
                    mma_16x8x16<W>(c[n + 1], a0, a1, a2, a3, b2, b3);
                }
                if constexpr (NT % 2) {
                    uint32_t b0, b1;
                    ldsm_x2(b_base + gemm_swz(8 * (NT - 1) + lane % 8, 2 * kk + lane / 8 % 2), b0, b1);
                    mma_16x8x16<W>(c[NT - 1], a0, a1, a2, a3, b0, b1);
                }
            }
            refill(u, next);
#endif
        }
    }
    cp_async_wait_group<0>();
#if MODEL_GEMM_WGMMA
    wgmma_wait_all(c); /* the last stage's sums (W1), and no read of them above the wait */
#endif
    prefill_gemm_store<B>(c, n_pairs, store);
}

/* Pair tiles of a prefill GEMM of `pairs` pairs */
static inline int gemm_tiles(int pairs) { return (pairs + GEMM_PAIRS - 1) / GEMM_PAIRS; }
/* K's GEMM_KT-value tiles */
__host__ __device__ inline int gemm_k_tiles(int K) { return (K + GEMM_KT - 1) / GEMM_KT; }

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

/* n_pairs pairs over split blockIdx.y of gridDim.y's parts of K as a GEMM over K's tiles (in: the
 * terms); pair and store as prefill_gemm_body's */
template <typename W, int B, typename Pair, typename Store>
__device__ __forceinline__ void prefill_split_body(int n_pairs, int K, const uint16_t *in, Pair pair, Store store) {
    const int s = blockIdx.y, splits = gridDim.y;
    const int n_kt = gemm_k_tiles(K);
    prefill_gemm_body<W, B, SPLIT_STAGES(B), SPLIT_WAIT1(B)>(n_pairs, K, n_kt * s / splits, n_kt * (s + 1) / splits, in, pair, store);
}

#if GEMM_TMA
/* prefill_gemm_body's GEMM (S stages, W1 its wait) with its tiles copied by TMA, a block of WGS
 * warpgroups and GEMM_PAIRS WGS pairs (TMA_THREADS(B, WGS) threads, dynamic shared memory
 * TMA_SMEM_BYTES(B, S, WGS)), pair p row p of two matrices (gate/up's: gate's and up's): rows_a
 * and rows_b, tensor maps of the (n_pairs, dim) matrices in boxes of
 * GEMM_KT values by 8 rows, in: of the input terms (PREFILL_TERMS B, dim) in one box of
 * PREFILL_TERMS B rows; both swizzled 128 bytes, which puts each 8-row box as gemm_swz lays out a
 * tile's rows (a box starts on 1024 bytes). A stage: each warpgroup's 64-row weight tile, then the
 * inputs' tile, which every warpgroup's wgmma reads; the warps wait for its `full` mbarrier's phase.
 * Thread 0 copies stage i + PREFETCH after the block's barrier at stage i (every warp's wgmma on
 * the stage it overwrites waited for: under W1 the one two stages back, so PREFETCH is S - 2). */
template <typename W, int B, int S, bool W1, int WGS, typename Store>
__device__ __forceinline__ void prefill_gemm_tma_body(const CUtensorMap *rows_a, const CUtensorMap *rows_b, const CUtensorMap *in,
                                                      int n_pairs, int dim, Store store) {
    static_assert(W::DENSE16, "prefill_gemm_tma_body: dense 16-bit weights");
    static_assert(S >= 2 && (!W1 || S >= 3), "prefill_gemm_tma_body: at least 2 stages, 3 with W1");
    constexpr int T = PREFILL_TERMS, NT = T * B / 8, P = GEMM_PAIRS * WGS;
    constexpr int PREFETCH = W1 ? S - 2 : S - 1;
    constexpr int STAGE = TMA_STAGE_BYTES(B, WGS), A_BYTES = WGS * GEMM_A_BYTES;
    static_assert(GEMM_A_BYTES == 2 * GEMM_WARPS * 1024, "prefill_gemm_tma_body: a tile is GEMM_WARPS pairs of 8-row boxes");
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
     * bytes (the weights' and the inputs'); rows 16 j .. 16 j + 7 of the stage's weights rows_a's rows
     * row0 + 8 j.., the next 8 rows_b's, as prefill_gemm_body's pairs (warpgroup w's tile: j from 4 w) */
    auto load_a = [&](int st, int kt) {
        const uint32_t a = smem + st * STAGE, bar = bars + 8 * st;
        mbar_arrive_expect_tx(bar, STAGE);
#pragma unroll
        for (int j = 0; j < WGS * GEMM_WARPS; j++) {
            tma_load_2d(a + 2048 * j, rows_a, kt * GEMM_KT, row0 + 8 * j, bar);
            tma_load_2d(a + 2048 * j + 1024, rows_b, kt * GEMM_KT, row0 + 8 * j, bar);
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
        for (int kk = 0; kk < GEMM_KT / 16; kk++) wgmma_k16<W::BF16, NT>(c, gemm_desc(a_base + 32 * kk), gemm_desc(b_base + 32 * kk));
        wgmma_commit_wait<W1 ? 1 : 0>();
    }
    wgmma_wait_all(c); /* the last stage's sums (W1), and no read of them above the wait */
    prefill_gemm_store<B, P>(c, n_pairs, store);
}
#endif
#endif /* INGOT_CUDA_GEMM_CUH */
