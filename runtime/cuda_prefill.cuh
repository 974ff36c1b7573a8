/* cuda_prefill.cuh - the CUDA prompt path's kernel bodies: a batch of prompt tokens through every
 * stage at once (prefill), so that each weight row is read once for the whole batch.
 *
 * The matvecs on the tensor cores (prefill_gemm_body: tiled GEMMs through shared memory, on wgmma
 * or mma.sync, QKV, o_proj and down over splits of K; prefill_pairs_body: mma row tiles, where a
 * GEMM's tiles would leave SMs idle or a build turns the GEMMs off), the RMSNorm that adds the
 * splits' sums and splits its output into 16-bit terms, and the
 * attention with every query row of a KV head's group in a block (prefill_flash_body in fp32,
 * prefill_flash_mma_body on the tensor cores). Written, as cuda_kernels.cuh, against the MODEL_*
 * constants of the generated model_config.h, and included after it by the generated forward_cuda.cu;
 * it uses that header's helpers (pdl_wait, kv_at, att_split_len, split_h2, ...). */
#ifndef INGOT_CUDA_PREFILL_CUH
#define INGOT_CUDA_PREFILL_CUH

#include <cuda.h> /* CUtensorMap (GEMM_TMA) */

#include "cuda_kernels.cuh"

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
 * (thirtieth session): prompt 1B +17%, 7B +24% against mma.sync; at batches of 32 with gate/up the
 * only GEMM it had lost (twenty-eighth: 1B -0.9%, 7B -6%). */

/* Prompt tokens a prefill batch takes, at most: batches of PREFILL_BATCH, PREFILL_BATCH / 2, ...
 * down to 8 (PREFILL_SIZES sizes, a graph each): full ones, then the smallest that covers the
 * tokens left (prefill_from in the generated code). A batch of 16 costs ~1.7 of one of 8 and one of 32 ~1.65 of
 * one of 16 (1B and 7B shapes; 32 against 16: 1B prompt +21%, 7B +22%, PERFORMANCE.md). 64 against
 * 32 with every matvec a GEMM (thirtieth session): 1B +28%, 7B +23%; with the matvecs of
 * prefill_pairs_body it lost (twenty-ninth: their time doubles with the tokens). 128 against 64 on
 * wgmma (thirty-fourth session; its GEMMs 256 columns wide in two terms, one block an SM): 1B prompt
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
 * 32 rows (1B prompt +26%, 7B +33% against one tile; PERFORMANCE.md, tenth session) */
#define PREFILL_ROW_TILES 2
#define PREFILL_BLOCK_PAIRS (8 * PREFILL_ROW_TILES) /* pairs of rows a block takes: 8 a tile of the mma's 16 rows */
/* 32-value chunks of K a warp holds in flight (4 at 16 spills: -16%; 32 takes 1 for its registers) */
#define PREFILL_UNROLL(B) ((B) == 8 ? 4 : (B) == 16 ? 2 : 1)

/* Splits of K in o_proj's and down's prefill grids: each block (pairs, split) writes its partial
 * products to a buffer of its own, and the RMSNorm kernel after them adds the splits to the residual
 * stream in split order (the same sums every run). Without them the two take a block a 16 rows,
 * 128 blocks on the 1B shape, under one an SM (ncu: 11% occupancy, down 0.6 TB/s). */
#ifndef PREFILL_SPLITS
#define PREFILL_SPLITS 4
#endif

/* QKV and down as GEMMs (prefill_gemm_body, as gate/up's) with K split over blocks, each split's
 * sums to a buffer of its own, added in order by the kernel after them (prefill_qkv_finish_body,
 * the RMSNorm's prefill_rms_terms_body), so that no block waits for another's: the twenty-seventh
 * session's GEMMs for these stages lost with a split's last block adding the tile's sums (a serial
 * tail). prefill_pairs_body's blocks read the batch's inputs from L2 for 32 rows, a GEMM block for
 * 64. Splits: as GEMM_SPLIT_FILL says (one wave of the resident blocks), at most
 * PREFILL_GEMM_MAX_SPLITS and K's tiles. Against prefill_pairs_body at batches of 32 (thirtieth
 * session, the three together): 1B prompt +17%, 7B +21%; and they are what makes batches of 64 pay.
 * 0: prefill_pairs_body. */
#ifndef PREFILL_QKV_GEMM
#define PREFILL_QKV_GEMM 1
#endif
#ifndef PREFILL_DOWN_GEMM
#define PREFILL_DOWN_GEMM 1
#endif
/* o_proj too: its input, the attention's fp32 output, split into terms first by a kernel of its own
 * (prefill_att_terms_body), since the GEMM stages terms (alone on top of the other two: 1B +4%, 7B
 * +6%) */
#ifndef PREFILL_O_GEMM
#define PREFILL_O_GEMM 1
#endif
/* 0: as many splits as the GEMM's blocks resident an SM (the occupancy the compiled kernel
 * allows: 3 at batches of 64 on wgmma) fill in one wave, rounded down (gemm_splits). N: N blocks an
 * SM, rounded up, the thirtieth session's rule (4 against 2 there: 1B even at depth 0 and +8% at
 * 4096, 7B even, SmolLM2 +1%), which at 3 resident left a second wave of a third of the blocks or
 * more (1B QKV 528 blocks for 396 places, 7B 576). */
#ifndef GEMM_SPLIT_FILL
#define GEMM_SPLIT_FILL 0
#endif
/* GEMM_SPLITS_BY_SIZE 1: each prompt batch size's split GEMMs split K by the occupancy of their own
 * kernel, not all of them by that of the batches of PREFILL_BATCH (0), and at most
 * PREFILL_GEMM_MAX_SPLITS. At batches of 128 a block's 4 stages take 161 KB, one an SM, so the 7B
 * shape's QKV ran at every size as 96 blocks (one split) on 132 SMs, o_proj and down as 128; a
 * batch of 8's 3 stages take 31 KB, 7 an SM: 8 splits each (1B: 48-96 blocks, 2-4 splits, to 8).
 * Against 0 (and at most 16), a batch's graph at depth 1 (thirty-seventh session): Mistral-7B
 * shape 8 tokens 5,194 to 4,109 us (-21%), 16 -23%, 32 -23%, 64 -22%; Qwen2.5-7B -32%, -21%, -21%,
 * -19%; 1B -11%, -10%, -11%, -10%; SmolLM2 -3% to -4%, 128 too (o_proj and down 8 splits, not 9
 * and 14); 128 otherwise unchanged (the same splits). Prompts of 9-40 tokens: 7B +25% to +29%, 1B
 * +9% to +10%. At most 16 instead of 8: the 7B the same, the 1B -7% to -4% instead (its 8-token
 * batch at 16 splits of K's 32 tiles, two tiles a block). */
#ifndef GEMM_SPLITS_BY_SIZE
#define GEMM_SPLITS_BY_SIZE 1
#endif
#ifndef PREFILL_GEMM_MAX_SPLITS
#define PREFILL_GEMM_MAX_SPLITS 8 /* the most splits of K of a prefill GEMM */
#endif
/* the most splits of o_proj's or down's partial sums (prefill_part_x) */
#define PREFILL_MAX_X_PARTS \
    ((PREFILL_DOWN_GEMM || PREFILL_O_GEMM) && PREFILL_GEMM_MAX_SPLITS > PREFILL_SPLITS ? PREFILL_GEMM_MAX_SPLITS : PREFILL_SPLITS)

/* Terms of the weights' type an fp32 input is split into for the tensor cores: x = t0 + t1 (+ t2),
 * each the rounding of what the previous left, so W.x keeps 16 bits of x with bf16 terms (8 + 8; fp16
 * 22), a relative error of at most 2^-17 an input against the decode kernels' fp32 products. One
 * term (x rounded to bf16, as llama.cpp's and transformers' bf16 GEMMs take activations) let
 * tiny-group3's greedy text part from the CPU's. Against 3 terms (fp32's 24 bits): 1B prompt +7%,
 * 7B +12% (PERFORMANCE.md, tenth session); tests build 3 (mma.sync) and 1. One term against two
 * (thirty-fourth session): at batches of 64 the prompt +5% (1B, 7B: the GEMMs stream weights, half
 * the columns saves little); at batches of 128, where two terms make the GEMMs 256 columns wide and
 * bound by the tensor cores, 1B +14%, 7B +37%. A build option, not the default: it gives up the
 * prompt's agreement with the CPU path. */
#ifndef PREFILL_TERMS
#define PREFILL_TERMS 2
#endif
/* PREFILL_F16_TERMS 1 (bf16 weights): the terms in fp16, 11 bits each instead of bf16's 8, and the
 * prompt's tensor-core products in fp16, each weight converted from bf16 on the way (exactly, down
 * to fp16's least normal 2^-14; below it fp16's subnormals keep multiples of 2^-24): in shared
 * memory once a stage has landed, each thread the chunks it copied (prefill_gemm_body) or each
 * warpgroup its tile (prefill_gate_up_tma_body), in registers in prefill_pairs_body. With one term
 * (PREFILL_TERMS=1) the inputs keep 11 bits, as the fp16 KV cache keeps keys and values: in NumPy
 * (tests/bench/prefill_terms.py, thirty-fifth session) one fp16 term costs the logits 5.4e-4 to
 * 8.4e-4 against the exact model, the fp16 KV cache alone 4.7e-4 to 1.0e-3, one bf16 term 4.9e-3
 * to 9.7e-3. Inputs past fp16's range are clamped to +-65,504: the RMSNorm's outputs are bounded by
 * sqrt(dim) times its weights and the attention's by the fp16 values, but down's input (SiLU(gate)
 * * up) is not. Off: a build option. Measured with one term (thirty-sixth session, 512-token prompt):
 * 1B +14.6%, 7B +27.0% against two bf16 terms, but 4.5% and 11.5% behind one bf16 term, the
 * conversion on every K tile's path; GPU_WEIGHTS_F16 with one term runs at one bf16 term's speed
 * (its decode on fp16 weights: 1B -1.5% at depth 0). */
#ifndef PREFILL_F16_TERMS
#define PREFILL_F16_TERMS 0
#endif
#if PREFILL_F16_TERMS && !GPU_W_BF16
#error "PREFILL_F16_TERMS: for bf16 weights on the device (fp16 weights take fp16 terms already)"
#endif
/* the terms' type, and the prompt's products': bf16 where the weights are, unless PREFILL_F16_TERMS */
#if GPU_W_BF16 && !PREFILL_F16_TERMS
#define TERMS_BF16 1
#else
#define TERMS_BF16 0
#endif

/* A value of the terms' 16-bit type, round to nearest; *rest gets what the rounding left out. */
__device__ __forceinline__ uint16_t w_split(float *rest) {
#if PREFILL_F16_TERMS
    const __half v = __float2half_rn(fminf(fmaxf(*rest, -65504.0f), 65504.0f));
    *rest -= __half2float(v);
    return __half_as_ushort(v);
#elif TERMS_BF16
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
/* PREFILL_RMS_CLUSTER C > 1: a token's row over a cluster of C blocks of RMS_CLUSTER_THREADS, each
 * adding the parts of its DIM / C values and the blocks' sums of squares added in rank order
 * through distributed shared memory. The lead (thirty-first session): 64 blocks, one a token of a
 * batch, for 132 SMs, each loading its row and up to 12 parts of it (104 KB on the 1B) in rounds of
 * PREFILL_SPLITS; 1B 198 µs a batch of 64 over 31 launches (12% of it), 7B 445. Measured (thirty-
 * second session, H200): launched as a programmatic dependent (starting while the kernel before it
 * runs) every cluster build of the 1B and 7B ended in "unspecified launch failure", also with the
 * next kernel's trigger after the cluster's last barrier, while compute-sanitizer's serialized run
 * passed; so the cluster kernel is launched without programmatic serialization (launch_rms), and
 * then C = 2 and 4 passed on every tiny model and ran the 1B's and 7B's prompts: +2.1% and +1.3%
 * at depth 0, -0.4% and +0.4% at 4096 (two rounds). C = 8 failed the same way in every form on
 * tiny-wide and tiny-group3: not allowed. The causes were not found. Off. */
#ifndef PREFILL_RMS_CLUSTER
#define PREFILL_RMS_CLUSTER 0
#endif
#if PREFILL_RMS_CLUSTER > 1
static_assert(!MODEL_GENERIC && MODEL_DIM % (4 * PREFILL_RMS_CLUSTER) == 0 && PREFILL_RMS_CLUSTER <= 4,
              "PREFILL_RMS_CLUSTER: a specialized build whose rows split into whole float4s, at most 4 blocks (8 failed on the H200)");
#define RMS_CLUSTER PREFILL_RMS_CLUSTER
#define RMS_CLUSTER_THREADS 128
#define RMS_BLOCK_THREADS RMS_CLUSTER_THREADS
#define RMS_BLOCK_VALS ((MODEL_DIM / 4 / RMS_CLUSTER + RMS_CLUSTER_THREADS - 1) / RMS_CLUSTER_THREADS)
#else
#define RMS_CLUSTER 1 /* blocks a token's row */
#define RMS_BLOCK_THREADS RMS_THREADS
#define RMS_BLOCK_VALS RMS_VALS
#endif

/* A thread block cluster's barrier (PTX barrier.cluster): arrive releasing this thread's writes, or
 * relaxed (nothing to publish); wait, acquiring the others' */
__device__ __forceinline__ void cluster_arrive_release(void) { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_arrive_relaxed(void) { asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait(void) { asm volatile("barrier.cluster.wait.aligned;" ::: "memory"); }
/* *p in the shared memory of the cluster's block `rank` (p: this block's copy of the variable) */
__device__ __forceinline__ float ld_cluster_f32(const float *p, int rank) {
    uint32_t addr;
    float v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(addr) : "r"((uint32_t)__cvta_generic_to_shared(p)), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(addr) : "memory");
    return v;
}

/* Token b of the batch (blocks b C .. b C + C - 1 of gridDim.x, C = RMS_CLUSTER, a cluster where
 * C > 1): x[b] += the `parts` partial sums part[s][b] (s in order, rows of DIM, at most RMS_MAX_DIM;
 * none for the first layer's); then RMSNorm's input, x[b] * (1 / sqrt(mean(x[b]^2) + eps) *
 * norm_w), as the PREFILL_TERMS terms of a prefill matvec's input: terms (PREFILL_TERMS, B, DIM).
 * The cluster's block of rank r takes float4s r N4 / C .. (r + 1) N4 / C - 1 of the row, a thread
 * float4s tid, tid + THREADS, ... of those (V of them at most): its loads of x and of the first
 * PREFILL_SPLITS parts are issued before any is used (one L2 round trip; more parts, a round each
 * PREFILL_SPLITS), the norm's weights before the PDL wait, and the terms are written from the
 * registers. Against the earlier form's loops of 4 values a thread, which read the row twice: 1B
 * 5.4 to 4.8 us a launch, 7B 7.5 to 5.4 (launched one by one; prompt +1%). */
template <int C, int THREADS, int V>
__device__ __forceinline__ void prefill_rms_terms_body(float *__restrict__ x, const float *__restrict__ part, int parts,
                                                       const uint16_t *__restrict__ norm_w, uint16_t *__restrict__ terms,
                                                       int DIM, float eps) {
    constexpr int WARPS = THREADS / WARP_SIZE, P = PREFILL_SPLITS;
    const int N4 = DIM / 4, Q = N4 / C; /* DIM: a multiple of 4 (model_cuda_create), of 4 C (C > 1) */
    const int b = (int)blockIdx.x / C, rank = (int)blockIdx.x % C, B = (int)gridDim.x / C, base = rank * Q;
    __shared__ float partial[WARPS];
    const int tid = threadIdx.x;
    float4 n[V];
#pragma unroll
    for (int u = 0; u < V; u++) {
        const int j = tid + u * THREADS, i = 4 * (base + j); /* the weights may lie on 2 bytes: loaded one by one */
        n[u] = j < Q ? make_float4(w_to_f32(norm_w[i]), w_to_f32(norm_w[i + 1]), w_to_f32(norm_w[i + 2]), w_to_f32(norm_w[i + 3]))
                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    pdl_wait();
    pdl_launch_dependents();
    float4 *__restrict__ xb = reinterpret_cast<float4 *>(x + (size_t)b * DIM) + base;
    const float4 *__restrict__ pb = reinterpret_cast<const float4 *>(part + (size_t)b * DIM) + base;
    const size_t split = (size_t)B * N4; /* float4s from one split's (B, DIM) to the next */
    float4 v[V], p[V][P];
    auto load_parts = [&](int s0) { /* parts s0 .. s0 + P - 1, zeros past the last */
#pragma unroll
        for (int u = 0; u < V; u++) {
            const int j = tid + u * THREADS;
#pragma unroll
            for (int k = 0; k < P; k++)
                p[u][k] = s0 + k < parts && j < Q ? __ldcg(pb + (s0 + k) * split + j) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    };
#pragma unroll
    for (int u = 0; u < V; u++) {
        const int j = tid + u * THREADS;
        v[u] = j < Q ? xb[j] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
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
        if (PREFILL_MAX_X_PARTS <= P || s0 >= parts) break; /* the first round is all but where down is a GEMM */
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
    if constexpr (C > 1) { /* then the cluster's blocks' sums, in rank order, from their shared memory; */
        __shared__ float block_ss; /* no global stores yet, so that the release waits for none */
        if (tid == 0) block_ss = total;
        cluster_arrive_release();
        cluster_wait(); /* every block's sum written */
        total = 0.0f;
#pragma unroll
        for (int r = 0; r < C; r++) total += ld_cluster_f32(&block_ss, r);
        cluster_arrive_relaxed(); /* done reading the others' (waited for at the end) */
    }
    const float scale = rsqrtf(total / (float)DIM + eps);
    const size_t stride = (size_t)B * DIM; /* from one term's (B, DIM) to the next */
#pragma unroll
    for (int u = 0; u < V; u++) {
        const int j = tid + u * THREADS, i = base + j;
        if (j >= Q) continue;
        if (parts) xb[j] = v[u];
        store_terms4(terms + (size_t)b * DIM + 4 * i, stride,
                     make_float4(v[u].x * (scale * n[u].x), v[u].y * (scale * n[u].y), v[u].z * (scale * n[u].z),
                                 v[u].w * (scale * n[u].w)));
    }
    if constexpr (C > 1) cluster_wait(); /* no block leaves while another may still read its sum */
}

/* The attention's output att (B, n) as the PREFILL_TERMS terms of o_proj's input (PREFILL_TERMS, B, n):
 * float4 blockIdx.x * blockDim.x + threadIdx.x of token blockIdx.y (PREFILL_O_GEMM). */
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
#if TERMS_BF16
    const __nv_bfloat162 v = __floats2bfloat162_rn(*rest_lo, *rest_hi);
    const float2 back = __bfloat1622float2(v);
#elif PREFILL_F16_TERMS
    const __half2 v = __floats2half2_rn(fminf(fmaxf(*rest_lo, -65504.0f), 65504.0f), fminf(fmaxf(*rest_hi, -65504.0f), 65504.0f));
    const float2 back = __half22float2(v);
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
 * is left out where they run (PREFILL_O_GEMM; attention_body's prompt, past FLASH_MAX_SPLITS, still
 * takes it). Measured (thirty-seventh session, GPU tests passed), a batch's graph at depth 1: 1B
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


/* Two bf16 weights as fp16 (PREFILL_F16_TERMS), packed as they were: exact down to 2^-14 */
__device__ __forceinline__ uint32_t bf16x2_to_f16x2(uint32_t w) {
    const __half2 h = __floats2half2_rn(__uint_as_float(w << 16), __uint_as_float(w & 0xFFFF0000u));
    return *reinterpret_cast<const uint32_t *>(&h);
}
/* four registers of weights as the products take them: as they are, or as fp16 (PREFILL_F16_TERMS) */
__device__ __forceinline__ uint4 w_for_mma(uint4 w) {
#if PREFILL_F16_TERMS
    return make_uint4(bf16x2_to_f16x2(w.x), bf16x2_to_f16x2(w.y), bf16x2_to_f16x2(w.z), bf16x2_to_f16x2(w.w));
#else
    return w;
#endif
}
/* 16 bytes of bf16 weights in shared memory at addr as fp16, in place (PREFILL_F16_TERMS) */
__device__ __forceinline__ void smem_w_to_f16(uint32_t addr) {
    uint4 w;
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(w.x), "=r"(w.y), "=r"(w.z), "=r"(w.w) : "r"(addr));
    w = make_uint4(bf16x2_to_f16x2(w.x), bf16x2_to_f16x2(w.y), bf16x2_to_f16x2(w.z), bf16x2_to_f16x2(w.w));
    asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};" ::"r"(addr), "r"(w.x), "r"(w.y), "r"(w.z), "r"(w.w) : "memory");
}

/* c (16 x 8, fp32) += a (16 x 16, row-major) . b (16 x 8, column-major), in the terms' type. */
__device__ __forceinline__ void mma_16x8x16(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                            uint32_t b1) {
#if TERMS_BF16
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
 * lane of four by shuffles first (thirty-fourth session, batches of 64, µs a batch): 1B gate/up 442
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
 * inputs: fp32 values in (B, K), split into PREFILL_TERMS terms here, in every block; or the terms
 * themselves, (PREFILL_TERMS, B, K) in the weights' type, split once by the kernel that wrote them
 * (prefill_rms_terms_body, the gate/up store): the same sums, without the conversions in each of
 * the grid's blocks.
 *
 * The mma's fragments (PTX ISA, m16n8k16, 16-bit types): lane (g = lane / 4, q = lane % 4) holds
 * A's rows g and g + 8 at columns 2q, 2q + 1, 2q + 8, 2q + 9, B's column (token) g at the same
 * rows, and C's rows g, g + 8 at tokens 2q, 2q + 1. The sum over K does not care which 16 values
 * of K a step takes as long as A and B agree, so step s of a 32-value chunk gives lane q's four
 * columns the values 8q + 4s .. 8q + 4s + 3: a lane reads 16 contiguous bytes of each of its two
 * rows (pair g's) and 8 inputs of its token, for two steps; with several tiles of 8 tokens, the
 * same weights meet each tile's token g + 8 j in a tile's own mma. */
template <int B, int BS = B, typename In, typename Pair, typename Store>
__device__ __forceinline__ void prefill_pairs_body(int n_pairs, int K, int c0, int c1, const In *in, Pair pair, Store store,
                                                   int t0 = 0);
/* ... tokens t0 .. t0 + B - 1 of a batch of BS (BS > B: the batch's inputs in (PREFILL_TERMS, BS, K)) */
template <int B, int BS, typename In, typename Pair, typename Store>
__device__ __forceinline__ void prefill_pairs_part(int n_pairs, int K, int c0, int c1, const In *in, Pair pair, Store store, int t0) {
    constexpr bool terms_in = std::is_same<In, uint16_t>::value;
    static_assert(terms_in || std::is_same<In, float>::value, "prefill inputs: fp32 values or their 16-bit terms");
    constexpr int tiles = B / 8, unroll = PREFILL_UNROLL(B), R = PREFILL_ROW_TILES;
    constexpr int in_regs = terms_in ? PREFILL_TERMS : 2; /* uint4s of a token's 8 inputs: its terms, or 8 floats */
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
                    const uint4 *x = terms_in ? reinterpret_cast<const uint4 *>(in + ((size_t)r * BS + t) * K + k)
                                              : reinterpret_cast<const uint4 *>(in + (size_t)t * K + k) + r;
                    xv[u][j][r] = in_k ? __ldcg(x) : make_uint4(0, 0, 0, 0);
                }
        }
#pragma unroll
        for (int u = 0; u < unroll; u++)
#pragma unroll
            for (int j = 0; j < tiles; j++) {
                if constexpr (terms_in) {
#pragma unroll
                    for (int t = 0; t < PREFILL_TERMS; t++)
#pragma unroll
                        for (int rt = 0; rt < R; rt++) {
                            const uint4 a = w_for_mma(wa[u][rt]), b = w_for_mma(wb[u][rt]), x = xv[u][j][t];
                            mma_16x8x16(c[rt][j], a.x, b.x, a.y, b.y, x.x, x.y);
                            mma_16x8x16(c[rt][j], a.z, b.z, a.w, b.w, x.z, x.w);
                        }
                } else {
                    const uint4 x0 = xv[u][j][0], x1 = xv[u][j][in_regs - 1];
                    float xf[8] = {__uint_as_float(x0.x), __uint_as_float(x0.y), __uint_as_float(x0.z), __uint_as_float(x0.w),
                                   __uint_as_float(x1.x), __uint_as_float(x1.y), __uint_as_float(x1.z), __uint_as_float(x1.w)};
#pragma unroll
                    for (int t = 0; t < PREFILL_TERMS; t++) {
                        const uint32_t b00 = pack_w2(&xf[0], &xf[1]), b01 = pack_w2(&xf[2], &xf[3]);
                        const uint32_t b10 = pack_w2(&xf[4], &xf[5]), b11 = pack_w2(&xf[6], &xf[7]);
#pragma unroll
                        for (int rt = 0; rt < R; rt++) {
                            const uint4 a = w_for_mma(wa[u][rt]), b = w_for_mma(wb[u][rt]);
                            mma_16x8x16(c[rt][j], a.x, b.x, a.y, b.y, b00, b01);
                            mma_16x8x16(c[rt][j], a.z, b.z, a.w, b.w, b10, b11);
                        }
                    }
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
template <int B, int BS, typename In, typename Pair, typename Store>
__device__ __forceinline__ void prefill_pairs_body(int n_pairs, int K, int c0, int c1, const In *in, Pair pair, Store store,
                                                   int t0) {
    if constexpr (B > 64) {
        prefill_pairs_part<64, B>(n_pairs, K, c0, c1, in, pair, store, 0);
        __syncthreads(); /* the first half's sums gathered before the second's reuse their shared memory */
        prefill_pairs_part<64, B>(n_pairs, K, c0, c1, in, pair, store, 64);
    } else prefill_pairs_part<B, BS>(n_pairs, K, c0, c1, in, pair, store, t0);
}

// ---------------------------------------------------------------------------------------------
// The prefill's tiled GEMM (prefill_gemm_body): gate/up where its rows fill the GPU's SMs
// (gate_up_gemm in the generated code), and QKV, o_proj and down over splits of K (PREFILL_QKV_GEMM
// and the others below): a block takes GEMM_PAIRS pairs of rows (a warp a 16-row tile of 8 pairs,
// as prefill_pairs_body's) over its K tiles against the whole batch. Weights and inputs go
// through shared memory on cp.async, GEMM_KT values of K a stage, GEMM_STAGES stages in flight, and
// every warp reads the stage's inputs from shared memory (ldmatrix): a block reads its inputs from
// L2 once for 64 rows, not for 32, and keeps its later stages' weights in flight whatever its
// registers. The input's terms are columns of the GEMM: column t * B + b is token b's term t, as
// the terms lie in memory (term, B, K), and each token's terms are added after the sums.
// Measured against prefill_pairs_body (PERFORMANCE.md, twenty-seventh session): the prompt +10% on
// the 1B shape and +17% on the 7B; QKV, o_proj and down, whose few rows need K split over blocks,
// were slower as GEMMs while each tile's last split block added the splits' sums (the thirtieth
// session's, each split to a buffer of its own, won: PREFILL_QKV_GEMM). ncu (mma.sync, batches of
// 32): bound by latency (a quarter of the issue slots and of the tensor pipe busy), not by a unit.

#ifndef GEMM_WARPS
#define GEMM_WARPS 4 /* 8 (64 pairs a block): 1B prompt -6%, 7B even */
#endif
#define GEMM_THREADS (GEMM_WARPS * WARP_SIZE)
#define GEMM_PAIRS (8 * GEMM_WARPS) /* pairs of rows a block: 8 a warp */
#define GEMM_KT 64    /* K values a stage: 128 bytes a row */
#ifndef GEMM_STAGES
#define GEMM_STAGES 3 /* 4 (three blocks an SM): 1B even, 7B -4% */
#endif
static_assert(GEMM_STAGES >= 2, "GEMM_STAGES: at least 2");
#define GEMM_A_BYTES (2 * GEMM_PAIRS * GEMM_KT * 2)
#define GEMM_B_BYTES(B) (PREFILL_TERMS * (B) * GEMM_KT * 2)
#define GEMM_STAGE_BYTES(B) (GEMM_A_BYTES + GEMM_B_BYTES(B))
/* GEMM_WGMMA_WAIT1: a stage's wgmma left running while the block goes on to the next stage's copies
 * and wgmma (wgmma.wait_group 1, not 0), so that the tensor cores are not idle while the warps wait;
 * the copies then go to the stage two back, which the wait has freed, and the prefetch distance is
 * GEMM_STAGES - 2 tiles (4 stages: 2). Measured (thirty-first session, with 4 stages, µs a batch):
 * the 7B's gate/up -10%, but QKV, o_proj and down +10-15% (two blocks an SM at 4 stages, not
 * three), the prompt +1% (7B) and even (1B); with the splits in one wave of the resident blocks,
 * +6.7% / +5.7% at depth 0 but the 1B -4.7% at 4096 (one round): off. */
#ifndef GEMM_WGMMA_WAIT1
#define GEMM_WGMMA_WAIT1 0
#endif
/* gate/up's GEMM alone (prefill_gemm_body's S and W1 there; the split GEMMs keep GEMM_STAGES and
 * GEMM_WGMMA_WAIT1): on wgmma, 4 stages with WAIT1 by default. The split GEMMs lose at 4 stages
 * (two blocks an SM, not three, and their splits follow the resident blocks), gate/up does not:
 * it runs one block a tile of rows, not split. Measured against 3 stages without WAIT1 (thirty-
 * second session, one call, µs a batch of 64 and prompt tok/s at depths 0 / 4096): 7B gate/up
 * 2,987 to 2,755, prompt +4.4% / +3.6%; 1B gate/up 483 to 476, prompt +0.2% / +0.6%; decode the
 * same. The thirty-first session's WAIT1 with 4 stages everywhere had the 7B's gate/up at 2,685-
 * 2,714 too. */
#ifndef GATE_UP_GEMM_STAGES
#define GATE_UP_GEMM_STAGES (MODEL_GEMM_WGMMA ? 4 : GEMM_STAGES)
#endif
#ifndef GATE_UP_GEMM_WAIT1
#define GATE_UP_GEMM_WAIT1 (MODEL_GEMM_WGMMA ? 1 : GEMM_WGMMA_WAIT1)
#endif
/* GEMM_WIDE_WAIT1 1: the split GEMMs (QKV, o_proj, down) at 256 columns (batches of 128 in two
 * terms: one block an SM at 3 stages or 4) at 4 stages with WAIT1, their other batch sizes as
 * GEMM_STAGES and GEMM_WGMMA_WAIT1 say. Measured as GEMM_WGMMA_WAIT1=1 GEMM_STAGES=4 for every
 * batch size (thirty-fourth session, one round, µs a batch of 128): 7B QKV 1,438 to 1,306, o_proj
 * 753 to 723, down 2,070 to 2,038, prompt +1.1%; 1B QKV 299 to 283, o_proj 167 to 161, down 353 to
 * 348, prompt -0.7%. This form (thirty-fifth session, one round, against 0): 7B QKV 1,457 to 1,313,
 * o_proj 758 to 720, down 2,087 to 2,061, prompt +1.4% / +5.3% (depths 0 / 4096); 1B QKV 299 to
 * 280, o_proj 165 to 160, down 355 to 346, the batch's kernels 1,831 to 1,800 µs, prompt +0.2% /
 * -0.4%. The default; 0 keeps 3 stages without WAIT1. */
#ifndef GEMM_WIDE_WAIT1
#define GEMM_WIDE_WAIT1 1
#endif
#define SPLIT_WIDE_W1(B) (GEMM_WIDE_WAIT1 && MODEL_GEMM_WGMMA && PREFILL_TERMS * (B) > 128)
/* the split GEMMs' stages and wait at batches of B */
#define SPLIT_STAGES(B) (SPLIT_WIDE_W1(B) ? 4 : GEMM_STAGES)
#define SPLIT_WAIT1(B) (SPLIT_WIDE_W1(B) || GEMM_WGMMA_WAIT1)
#if MODEL_GEMM_WGMMA && defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "MODEL_GEMM_WGMMA needs sm_90a: EXTRA_NVCCFLAGS='-DGEMM_WGMMA=1 -gencode=arch=compute_90a,code=sm_90a'"
#endif
static_assert(!MODEL_GEMM_WGMMA || (GEMM_WARPS == 4 && PREFILL_TERMS <= 2), "MODEL_GEMM_WGMMA: a block is one warpgroup (64 rows), one or two terms");
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
#if TERMS_BF16
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
 * (8 boxes of 8 weight rows, the inputs' tile). The lead (thirty-first session, ncu on gate/up):
 * a third of the warps' time in issuing the copies and waiting at the stage's barrier, gate/up's
 * weights read at 2.1-2.4 TB/s, half the probe. On by default in specialized sm_90a builds; its
 * stages and wait follow gate/up's (GATE_UP_GEMM_STAGES, GATE_UP_GEMM_WAIT1). Measured
 * (thirty-third session, two rounds, µs a batch of 64 against cp.async at 4 stages with WAIT1):
 * 1B gate/up 439 against 477, prompt +1.5% / +0.9% at depths 0 / 4096; 7B 2,560 against 2,751,
 * prompt +2.9% / +1.7%; decode unchanged. At 3 stages without WAIT1 TMA loses on the 7B (gate/up
 * 3,340 against 2,989). 0: cp.async. */
#ifndef GEMM_TMA
#define GEMM_TMA (MODEL_GEMM_WGMMA && !MODEL_GENERIC)
#endif
/* GATE_UP_TMA_WIDE: gate/up's TMA body at two warpgroups a block (prefill_gate_up_tma_body's WGS),
 * each its own 64 rows against the stage's one input tile, at GATE_UP_WIDE_STAGES stages without
 * WAIT1, so that two blocks fit an SM: 16 warps an SM, not 8. 1: where its blocks (64 pairs) are
 * one wave of two an SM, at least as many as the SMs and at most twice (on an H200 the 7B and 8B
 * shapes' 224; not the 1B's 128, one block an SM, nor the Qwen2.5-7B shape's 296, 1.12 waves),
 * 2: always (tests), 0: never. Measured (thirty-third session, µs a batch of 64, two rounds):
 * Mistral-7B shape gate/up 2,334-2,358 against 2,577-2,587, prompt +2.9% / +2.3% at depths 0 /
 * 4096; Qwen2.5-7B shape 3,302-3,349 against 2,888-2,915, prompt -6.0% / -4.8%; the 1B (forced)
 * 536 against 439, prompt -8%. A block of two warpgroups at one block an SM lost everywhere (7B
 * 3,050 against 2,590 at 4 or 6 stages; 1B 458-484 against 439), also with a warp of its own
 * copying and each stage handed back through an mbarrier instead of the block barrier (7B
 * 3,094-3,199, 1B 484-492; removed, commit 5ad1b2b). ncu (7B, one launch): DRAM read 2.94 TB/s
 * at 7.4 warps an SM (one warpgroup), 3.27 at 13.7 (wide), 2.30 at 9.0 (one wide block an SM): the
 * weights' reads want warps in flight, not staged bytes. At batches of 128 in two terms (256
 * columns, 128 sums a thread) either form fits one block an SM; the Mistral-7B shape's two
 * warpgroups there: gate/up 4,075 against 4,222 µs a batch, prompt +1.9% (thirty-fourth session). */
#ifndef GATE_UP_TMA_WIDE
#define GATE_UP_TMA_WIDE 1
#endif
#ifndef GATE_UP_WIDE_STAGES
#define GATE_UP_WIDE_STAGES 3
#endif
/* GATE_UP_WIDE_WAIT1 1: where a block of two warpgroups is alone on its SM anyway (256 columns:
 * batches of 128 in two terms), 4 stages with a stage's wgmma left running (as GATE_UP_GEMM_WAIT1)
 * instead of GATE_UP_WIDE_STAGES without. Measured (thirty-fourth session, one round, µs a batch of
 * 128): Mistral-7B shape gate/up 3,183 against 4,034 (604 TFLOP/s counting both terms), prompt
 * +7.5%; tiny-wide and tiny-gqa greedy text forced on, equal to the CPU's. 0: never. */
#ifndef GATE_UP_WIDE_WAIT1
#define GATE_UP_WIDE_WAIT1 1
#endif
#define TMA_WIDE_W1(B) (GATE_UP_WIDE_WAIT1 && PREFILL_TERMS * (B) > 128)
/* GATE_UP_TMA_WS 1: where the two warpgroups run at 256 columns (TMA_WIDE_W1), warp-specialized: a
 * warp of its own issues the copies, each stage's slot handed back by the consumer warps through an
 * `empty` mbarrier, no block barrier a stage, S stages ahead (not S - 2). At 256 columns gate/up is
 * bound by the tensor cores (604 TFLOP/s, thirty-fourth session), where this is the usual form; at
 * 128 columns (batches of 64, memory-bound) it lost (thirty-third session, 7B gate/up 3,094-3,199
 * against 2,590; commit 5ad1b2b). Prepared, not run on a GPU: off. */
#ifndef GATE_UP_TMA_WS
#define GATE_UP_TMA_WS 0
#endif
#define TMA_WS(B, WGS) (GATE_UP_TMA_WS && (WGS) == 2 && TMA_WIDE_W1(B))
/* the TMA body's threads: WGS warpgroups, and the copying warp under WS */
#define TMA_THREADS(B, WGS) (GEMM_THREADS * (WGS) + (TMA_WS(B, WGS) ? WARP_SIZE : 0))
/* the TMA body's stages and wait at batches of B and WGS warpgroups a block, and its blocks (64 WGS
 * pairs) over `pairs` */
#define TMA_STAGES(B, WGS) ((WGS) == 1 ? GATE_UP_GEMM_STAGES : TMA_WIDE_W1(B) ? 4 : GATE_UP_WIDE_STAGES)
#define TMA_WAIT1(B, WGS) ((WGS) == 1 ? GATE_UP_GEMM_WAIT1 : TMA_WIDE_W1(B))
#define TMA_BLOCKS(pairs, WGS) (((pairs) + GEMM_PAIRS * (WGS) - 1) / (GEMM_PAIRS * (WGS)))
#define TMA_STAGE_BYTES(B, WGS) ((WGS) * GEMM_A_BYTES + GEMM_B_BYTES(B))
#define TMA_SMEM_BYTES(B, S, WGS) ((S) * TMA_STAGE_BYTES(B, WGS) + 1024)
static_assert(!GEMM_TMA || (MODEL_GEMM_WGMMA && !MODEL_GENERIC), "GEMM_TMA: wgmma (sm_90a) and a specialized build");
static_assert(!GEMM_TMA || (TMA_SMEM_BYTES(PREFILL_BATCH, TMA_STAGES(PREFILL_BATCH, 1), 1) <= 232448 &&
                             TMA_SMEM_BYTES(PREFILL_BATCH, TMA_STAGES(PREFILL_BATCH, 2), 2) <= 232448),
              "GEMM_TMA: the TMA body's stages over a block's 227 KB of shared memory");
#if GEMM_TMA
/* mbar_init, mbar_arrive_expect_tx, mbar_arrive, mbar_wait: cuda_kernels.cuh */
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
 * as GEMM_WGMMA_WAIT1 (the defaults: those knobs). */
template <int B, int S = GEMM_STAGES, bool W1 = GEMM_WGMMA_WAIT1, typename Pair, typename Store>
__device__ __forceinline__ void prefill_gemm_body(int n_pairs, int K, int kt0, int kt1, const uint16_t *__restrict__ in, Pair pair,
                                                  Store store) {
    constexpr int T = PREFILL_TERMS, J = B / 8, NT = T * J; /* 8-token tiles; n8 tiles of the GEMM's columns */
    static_assert(S >= 2, "prefill_gemm_body: at least 2 stages");
    static_assert(!W1 || (MODEL_GEMM_WGMMA && S >= 3), "GEMM_WGMMA_WAIT1: wgmma and at least 3 stages");
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
     * cost ~10 instructions a copy, and its issue half of the GEMM's warps' time: ncu, thirty-first
     * session). */
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
#if PREFILL_F16_TERMS
#pragma unroll
        for (int j = 0; j < 4; j++) smem_w_to_f16(smem + (i % S) * GEMM_STAGE_BYTES(B) + row_off + ROWS * 128 * j); /* load_a's */
#endif
#if MODEL_GEMM_WGMMA
        fence_proxy_async_shared();
#endif
        /* stage i is in, and every warp is done with the stage the next copies overwrite (under
         * GEMM_WGMMA_WAIT1 each warp's wait after the last stage's wgmma saw the one before end) */
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

/* Splits of K in QKV's prefill grid (gridDim.y): where its pair blocks are few against the SMs
 * (the 1B shape's 96 on an H200's 132), each split writes its partial sums to a buffer of its own
 * and prefill_qkv_finish_body adds them in split order before the bias, RoPE and stores. 0: as many
 * as fill two blocks an SM, at most PREFILL_QKV_MAX_SPLITS (the plan's runtime choice,
 * qkv_splits in the generated code); N: N always (1: none, QKV stores its sums itself). Against
 * none (twenty-ninth session): QKV's launches 1B 374 to 351 us a batch (3 splits), 7B 1,417 to
 * 1,355 (2), the finishing kernel's included; prompt +2%. */
#ifndef PREFILL_QKV_SPLITS
#define PREFILL_QKV_SPLITS 0
#endif
#define PREFILL_QKV_MAX_SPLITS 4
static_assert(PREFILL_QKV_SPLITS >= 0 && PREFILL_QKV_SPLITS <= PREFILL_QKV_MAX_SPLITS, "PREFILL_QKV_SPLITS: 0 to 4");
/* the most splits of QKV's partial sums (prefill_part_qkv) */
#define PREFILL_MAX_QKV_PARTS (PREFILL_QKV_GEMM ? PREFILL_GEMM_MAX_SPLITS : PREFILL_QKV_MAX_SPLITS)

/* splits of K over a GEMM's `tiles` pair tiles on `sms` SMs where `resident` of its blocks fit an SM
 * (GEMM_SPLIT_FILL) */
static inline int gemm_splits(int tiles, int K, int sms, int resident) {
    int splits = GEMM_SPLIT_FILL ? (GEMM_SPLIT_FILL * sms + tiles - 1) / tiles : resident * sms / tiles;
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

/* n_pairs pairs over split blockIdx.y of gridDim.y's parts of K: as a GEMM over K's tiles (in: the
 * terms) or by prefill_pairs_body over its 32-value chunks; pair and store as theirs */
template <int B, bool GEMM, typename In, typename Pair, typename Store>
__device__ __forceinline__ void prefill_split_body(int n_pairs, int K, const In *in, Pair pair, Store store) {
    const int s = blockIdx.y, splits = gridDim.y;
    if constexpr (GEMM) {
        static_assert(std::is_same<In, uint16_t>::value, "a prefill GEMM's input: its terms");
        const int n_kt = gemm_k_tiles(K);
        prefill_gemm_body<B, SPLIT_STAGES(B), SPLIT_WAIT1(B)>(n_pairs, K, n_kt * s / splits, n_kt * (s + 1) / splits, in, pair,
                                                                store);
    } else {
        const int chunks = (K + 31) / 32;
        prefill_pairs_body<B>(n_pairs, K, chunks * s / splits, chunks * (s + 1) / splits, in, pair, store);
    }
}

/* q/k/v (+ bias) + RoPE + KV-cache store for a batch of B, on input_layernorm's output as terms
 * (prefill_rms_terms_body): the pairs of qkv_pair, over split blockIdx.y of gridDim.y's parts of K;
 * by prefill_pairs_body, or as a GEMM (prefill_gemm_body, PREFILL_QKV_GEMM). One split of
 * prefill_pairs_body: stored here (prefill_qkv_store). Several, or the GEMM: pair p's sums for
 * token t to part[s][t][p] (float2s of a and b), which prefill_qkv_finish_body adds and stores. */
template <int B, bool GEMM>
__device__ __forceinline__ void prefill_qkv_rope_body(const uint16_t *wq, const uint16_t *wk, const uint16_t *wv,
                                                      const uint16_t *bq, const uint16_t *bk, const uint16_t *bv,
                                                      const uint16_t *x_terms, float *q, uint16_t *kc, uint16_t *vc,
                                                      float2 *part, const int *io, const float *inv_freq, int dim, int q_dim,
                                                      int kv_dim, int head_dim, int ctx) {
    const int q_pairs = q_dim / 2, k_pairs = kv_dim / 2, pairs = q_pairs + k_pairs + kv_dim / 2;
    const int s = blockIdx.y, splits = gridDim.y;
    auto pair = [&](int p, const uint4 **a, const uint4 **b) {
        int ra, rb, kind;
        qkv_pair(p, q_pairs, k_pairs, head_dim, &ra, &rb, &kind);
        const uint16_t *wm = kind == 0 ? wq : kind == 1 ? wk : wv;
        *a = reinterpret_cast<const uint4 *>(wm + (size_t)ra * dim);
        *b = reinterpret_cast<const uint4 *>(wm + (size_t)rb * dim);
    };
    auto store = [&](int p, int t, float a, float b) {
        if (GEMM || splits > 1) part[((size_t)s * B + t) * pairs + p] = make_float2(a, b);
        else prefill_qkv_store(p, t, a, b, bq, bk, bv, q, kc, vc, io, inv_freq, q_dim, kv_dim, head_dim, ctx);
    };
    prefill_split_body<B, GEMM>(pairs, dim, x_terms, pair, store);
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
 * in split 0]: rows (i, i + rows / 2) a pair (rows even); in as prefill_pairs_body takes it, or the
 * terms as a GEMM (prefill_gemm_body over K's tiles, PREFILL_DOWN_GEMM). The next RMSNorm kernel
 * adds the splits to the residual stream (prefill_rms_terms_body). */
template <int B, bool GEMM, typename In>
__device__ __forceinline__ void prefill_residual_body(const uint16_t *w, const uint16_t *bias, const In *in, float *part,
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
    prefill_split_body<B, GEMM>(half, K, in, pair, store);
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
 * Without WS thread 0 copies stage i + PREFETCH after the block's barrier at stage i (every warp's
 * wgmma on the stage it overwrites waited for: under W1 the one two stages back, so PREFETCH is
 * S - 2). With WS (GATE_UP_TMA_WS) the block's last warp copies, each stage once its `empty`
 * mbarrier has every consumer warp's arrival (after the wait that saw its wgmma on that stage
 * end): S stages ahead. */
template <int B, int S, bool W1, int WGS, bool WS>
__device__ __forceinline__ void prefill_gate_up_tma_body(const CUtensorMap *gate, const CUtensorMap *up, const CUtensorMap *in,
                                                         uint16_t *hb_terms, int dim, int hidden) {
    static_assert(S >= 2 && (!W1 || S >= 3), "prefill_gate_up_tma_body: at least 2 stages, 3 with W1");
    constexpr int T = PREFILL_TERMS, NT = T * B / 8, P = GEMM_PAIRS * WGS, CONSUMERS = GEMM_THREADS * WGS;
    constexpr int PREFETCH = WS ? S : W1 ? S - 2 : S - 1;
    constexpr int STAGE = TMA_STAGE_BYTES(B, WGS), A_BYTES = WGS * GEMM_A_BYTES;
    static_assert(GEMM_A_BYTES == 2 * GEMM_WARPS * 1024, "prefill_gate_up_tma_body: a tile is GEMM_WARPS pairs of 8-row boxes");
    extern __shared__ __align__(128) unsigned char gemm_smem[];
    __shared__ __align__(8) uint64_t mbars[WS ? 2 * S : S]; /* S `full`, then under WS S `empty` */
    const int tid = threadIdx.x, n_kt = gemm_k_tiles(dim), row0 = (int)blockIdx.x * P;
    const uint32_t smem = ((uint32_t)__cvta_generic_to_shared(gemm_smem) + 1023u) & ~1023u;
    const uint32_t bars = (uint32_t)__cvta_generic_to_shared(mbars), empties = bars + 8 * S;
    const uint32_t a_wg = (uint32_t)(tid / GEMM_THREADS) * GEMM_A_BYTES; /* this warpgroup's weight tile in a stage */
    const int copier = WS ? CONSUMERS : 0;                                 /* the thread that copies */
    if (tid == 0) {
        for (int s = 0; s < S; s++) {
            mbar_init(bars + 8 * s, 1);
            if (WS) mbar_init(empties + 8 * s, CONSUMERS / WARP_SIZE);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); /* the inits, seen by the async proxy */
    }
    __syncthreads();
    /* the copier's: the weights' boxes of K tile kt into stage st, its arrival expecting the stage's
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
    if (tid == copier)
        for (int s = 0; s < PREFETCH && s < n_kt; s++) load_a(s, s);
    pdl_wait();
    pdl_launch_dependents();
    if (tid == copier)
        for (int s = 0; s < PREFETCH && s < n_kt; s++) load_b(s, s);
    if constexpr (WS)
        if (tid >= CONSUMERS) { /* the copier's warp: stage kt's slot once tile kt - S is done with */
            if (tid == copier)
                for (int kt = S; kt < n_kt; kt++) {
                    mbar_wait(empties + 8 * (kt % S), (uint32_t)(kt / S - 1) & 1u);
                    load_a(kt % S, kt);
                    load_b(kt % S, kt);
                }
            return;
        }

    float c[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.0f;
    for (int i = 0; i < n_kt; i++) {
        if constexpr (!WS) {
            __syncthreads(); /* every warp done with stage i - 1, which the next copies overwrite */
            if (tid == 0 && i + PREFETCH < n_kt) {
                load_a((i + PREFETCH) % S, i + PREFETCH);
                load_b((i + PREFETCH) % S, i + PREFETCH);
            }
        }
        mbar_wait(bars + 8 * (i % S), (uint32_t)(i / S) & 1u); /* stage i's copies landed */
        const uint32_t stage = smem + (i % S) * STAGE, a_base = stage + a_wg, b_base = stage + A_BYTES;
#if PREFILL_F16_TERMS
        { /* the warpgroup's weight tile as fp16, seen by its wgmma (the async proxy) */
            const int wt = tid % GEMM_THREADS;
#pragma unroll
            for (int j = 0; j < GEMM_A_BYTES / 16 / GEMM_THREADS; j++) smem_w_to_f16(a_base + 16 * (wt + GEMM_THREADS * j));
            fence_proxy_async_shared();
            asm volatile("bar.sync %0, %1;" ::"r"(1 + tid / GEMM_THREADS), "n"(GEMM_THREADS) : "memory");
        }
#endif
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < GEMM_KT / 16; kk++) wgmma_k16<NT>(c, gemm_desc(a_base + 32 * kk), gemm_desc(b_base + 32 * kk));
        wgmma_commit_wait<W1 ? 1 : 0>();
        if constexpr (WS) { /* this warp done with stage i - 1 (W1: its wgmma has ended) or i */
            const int done = W1 ? i - 1 : i;
            if (tid % WARP_SIZE == 0 && done >= 0) mbar_arrive(empties + 8 * (done % S));
        }
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
// of the group). The split's keys and values are staged in shared memory a tile of FLASH_TILE
// positions at a time, read once for all rows; each warp takes 8 rows and keeps their softmax
// running over the tiles (max, sum, and the weighted values' sums rescaled when the max grows).
// fp32 throughout, as the decode kernels: the same sums up to their order. attention_body reads
// each key and value once for MODEL_PREFILL_ATT_TOKENS tokens; at depth 4096 on the 1B shape a 32-token
// batch's attention took ~137 us a layer that way, in 4224 blocks each paying the whole latency
// chain (PERFORMANCE.md, tenth session). This one: 1B prompt at depth 4096 +72%, 16384 +109%
// (eleventh session).

#define FLASH_ROWS 64     /* query rows a block: 8 warps of 8 */
#define FLASH_WARP_ROWS 8 /* a warp's rows */
/* positions a tile: 32 lanes of 4 (64-wide heads) or 2 (128), so that a tile's keys and values take
 * 32 KB of shared memory */
#define FLASH_TILE(hd) ((hd) <= 64 ? 128 : 64)
/* Dynamic shared memory: the tile's keys transposed (hd, tile) and values (tile, hd) as fp16, the
 * block's queries (rows, hd) and each warp's probabilities (8, tile) as fp32. */
#define FLASH_SMEM_BYTES(hd) \
    ((size_t)2 * FLASH_TILE(hd) * (hd) * 2 + (size_t)FLASH_ROWS * (hd) * 4 + (size_t)(MODEL_ATT_THREADS / WARP_SIZE) * FLASH_WARP_ROWS * FLASH_TILE(hd) * 4)
/* Most splits the combining block takes: their weights, (rows, splits) floats, reuse the queries'
 * and probabilities' shared memory (192 at either head size). Contexts with more splits (past
 * 196608 positions) take attention_body's prefill. */
#define FLASH_MAX_SPLITS(hd) \
    ((int)(((size_t)FLASH_ROWS * (hd) + (size_t)(MODEL_ATT_THREADS / WARP_SIZE) * FLASH_WARP_ROWS * FLASH_TILE(hd)) / FLASH_ROWS))

/* N fp16 values (N = 2 or 4, 4- or 8-byte aligned) at p as floats. */
template <int N>
__device__ __forceinline__ void halves_to_f32(const uint16_t *p, float *f) {
    static_assert(N == 2 || N == 4, "halves_to_f32: 2 or 4 values");
    if constexpr (N == 2) {
        const float2 a = __half22float2(*reinterpret_cast<const __half2 *>(p));
        f[0] = a.x, f[1] = a.y;
    } else {
        const uint2 u = *reinterpret_cast<const uint2 *>(p);
        const float2 a = __half22float2(*reinterpret_cast<const __half2 *>(&u.x)), b = __half22float2(*reinterpret_cast<const __half2 *>(&u.y));
        f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y;
    }
}

#ifndef FLASH_COMBINE_LOADS
#define FLASH_COMBINE_LOADS 8 /* splits' partial sums a thread of prefill_flash_combine loads at once */
#endif
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

template <int B, int HD, int KV_MUL>
__device__ __forceinline__ void prefill_flash_body(const float *q, const uint16_t *kc, const uint16_t *vc, const int *io,
                                                   float *part_acc, float *part_ml, unsigned *counters, att_out out,
                                                   int q_dim, int n_kv_heads, int ctx, int n_splits, int min_splits) {
    static_assert(HD == 64 || HD == 128, "flash prefill attention: heads of 64 or 128");
    constexpr int T = FLASH_TILE(HD), PPL = T / WARP_SIZE, DPL = HD / WARP_SIZE, WR = FLASH_WARP_ROWS;
    constexpr int ROWS = B * KV_MUL;
    extern __shared__ float smem[];
    uint16_t *kt = reinterpret_cast<uint16_t *>(smem); /* (HD, T) keys, transposed */
    uint16_t *vs = kt + HD * T;                       /* (T, HD) values */
    float *qs = reinterpret_cast<float *>(vs + T * HD); /* (FLASH_ROWS, HD) queries, times 1/sqrt(HD) */
    float *ps = qs + FLASH_ROWS * HD;                  /* (WARPS, WR, T) probabilities */
    const int kvh = blockIdx.x, split = blockIdx.y, row0 = blockIdx.z * FLASH_ROWS;
    const int tid = threadIdx.x, lane = tid % WARP_SIZE, wid = tid / WARP_SIZE;
    pdl_wait();
    pdl_launch_dependents();
    const int first_new = __ldcg(&io[IO_POS]), count = __ldcg(&io[IO_COUNT]), n = first_new + count;
    /* the splits of attention_body, from the batch's last position: every row's split bounds alike */
    const int chunk = att_split_len(n, n_splits, min_splits, true), n_active = (n + chunk - 1) / chunk;
    const int rows = min(FLASH_ROWS, min(ROWS, count * KV_MUL) - row0); /* this block's rows that are the batch's */
    if (split >= n_active || rows <= 0) return;
    const int start = split * chunk, len = min(n, start + chunk) - start;
    const size_t parts = (size_t)n_kv_heads * KV_MUL * n_splits;
    auto token_of = [](int r) { return r / KV_MUL; };
    auto head_of = [&](int r) { return kvh * KV_MUL + r % KV_MUL; };

    /* the block's queries, scaled */
    const float scale = rsqrtf((float)HD);
    for (int i = tid; i < FLASH_ROWS * HD; i += MODEL_ATT_THREADS) {
        const int r = row0 + i / HD;
        qs[i] = r < row0 + rows ? __ldcg(&q[(size_t)token_of(r) * q_dim + head_of(r) * HD + i % HD]) * scale : 0.0f;
    }
    /* warp wid's rows: row0 + wid * WR + i, i < WR; m, l, o as every lane of the warp holds them */
    const int wr0 = row0 + wid * WR;
    float m[WR], l[WR], o[WR][DPL];
#pragma unroll
    for (int i = 0; i < WR; i++) {
        m[i] = -INFINITY, l[i] = 0.0f;
#pragma unroll
        for (int d = 0; d < DPL; d++) o[i][d] = 0.0f;
    }
    float *pw = ps + wid * WR * T;
    for (int ts = 0; ts < len; ts += T) {
        const int tlen = min(T, len - ts);
        __syncthreads(); /* the previous tile's keys and values are read */
        /* stage positions start + ts .. + tlen, 8 halves a load: values as they are; keys transposed,
         * a warp's threads on consecutive positions so that their stores meet no bank twice */
        const uint4 *kg = reinterpret_cast<const uint4 *>(kc + kv_at(start + ts, kvh, ctx, HD));
        const uint4 *vg = reinterpret_cast<const uint4 *>(vc + kv_at(start + ts, kvh, ctx, HD));
        for (int i = tid; i < T * HD / 8; i += MODEL_ATT_THREADS) {
            reinterpret_cast<uint4 *>(vs)[i] = i / (HD / 8) < tlen ? __ldcg(vg + i) : make_uint4(0, 0, 0, 0);
            const int j = i % T, d0 = 8 * (i / T);
            const uint4 k = j < tlen ? __ldcg(kg + (size_t)j * (HD / 8) + d0 / 8) : make_uint4(0, 0, 0, 0);
            const uint16_t *kh = reinterpret_cast<const uint16_t *>(&k);
#pragma unroll
            for (int e = 0; e < 8; e++) kt[(d0 + e) * T + j] = kh[e];
        }
        __syncthreads();
        if (wr0 >= row0 + rows) continue; /* a warp past the batch's rows (barriers above: all warps) */
        /* scores: lane takes positions lane * PPL .. + PPL of the tile, against the warp's 8 rows */
        float sc[WR][PPL];
#pragma unroll
        for (int i = 0; i < WR; i++)
#pragma unroll
            for (int k = 0; k < PPL; k++) sc[i][k] = 0.0f;
        for (int d = 0; d < HD; d += 4) {
            float kf[4][PPL];
#pragma unroll
            for (int e = 0; e < 4; e++) halves_to_f32<PPL>(kt + (d + e) * T + lane * PPL, kf[e]);
#pragma unroll
            for (int i = 0; i < WR; i++) {
                const float4 qv = *reinterpret_cast<const float4 *>(&qs[(wid * WR + i) * HD + d]);
#pragma unroll
                for (int k = 0; k < PPL; k++) sc[i][k] += qv.x * kf[0][k] + qv.y * kf[1][k] + qv.z * kf[2][k] + qv.w * kf[3][k];
            }
        }
        /* the softmax's running max and sum, row by row; a row sees positions up to its token's */
#pragma unroll
        for (int i = 0; i < WR; i++) {
            const int r = wr0 + i, seen = first_new + token_of(r) - (start + ts); /* last tile index it sees */
            float mx = -INFINITY;
#pragma unroll
            for (int k = 0; k < PPL; k++) {
                const int j = lane * PPL + k;
                if (j >= tlen || j > seen || r >= row0 + rows) sc[i][k] = -INFINITY;
                mx = fmaxf(mx, sc[i][k]);
            }
#pragma unroll
            for (int off = WARP_SIZE / 2; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, off));
            const float m_new = fmaxf(m[i], mx);
            /* nothing seen yet: no shift, every probability 0 */
            const float shift = m_new == -INFINITY ? 0.0f : m_new, rescale = m_new == -INFINITY ? 1.0f : __expf(m[i] - m_new);
            float sum = 0.0f;
#pragma unroll
            for (int k = 0; k < PPL; k++) {
                const float p = __expf(sc[i][k] - shift);
                pw[i * T + lane * PPL + k] = p;
                sum += p;
            }
            l[i] = l[i] * rescale + warp_sum(sum);
            m[i] = m_new;
#pragma unroll
            for (int d = 0; d < DPL; d++) o[i][d] *= rescale;
        }
        __syncwarp();
        /* weighted values: lane takes dims lane * DPL .. + DPL, four positions a step */
        for (int j = 0; j < tlen; j += 4) {
            float vf[4][DPL]; /* rows past tlen are staged as zeros, and their probabilities are 0 */
#pragma unroll
            for (int e = 0; e < 4; e++) halves_to_f32<DPL>(vs + (j + e) * HD + lane * DPL, vf[e]);
#pragma unroll
            for (int i = 0; i < WR; i++) {
                const float4 p = *reinterpret_cast<const float4 *>(&pw[i * T + j]); /* 0 past tlen */
#pragma unroll
                for (int d = 0; d < DPL; d++) o[i][d] += p.x * vf[0][d] + p.y * vf[1][d] + p.z * vf[2][d] + p.w * vf[3][d];
            }
        }
        __syncwarp(); /* pw is rewritten by the next tile */
    }

    /* the warp's rows: done (one split), or this split's partial sums for the last block to combine */
#pragma unroll
    for (int i = 0; i < WR; i++) {
        const int r = wr0 + i;
        if (r >= row0 + rows) break;
        const int t = token_of(r), h = head_of(r);
#pragma unroll
        for (int d = 0; d < DPL; d++) {
            const int dd = lane * DPL + d;
            if (n_active == 1) out.put((size_t)t * q_dim + h * HD + dd, o[i][d] / l[i]);
            else part_acc[(size_t)t * parts * HD + ((size_t)h * n_splits + split) * HD + dd] = o[i][d];
        }
        if (n_active > 1 && lane == 0)
            *reinterpret_cast<float2 *>(&part_ml[(size_t)t * parts * 2 + ((size_t)h * n_splits + split) * 2]) = make_float2(m[i], l[i]);
    }
    if (n_active > 1)
        prefill_flash_combine<HD, KV_MUL, MODEL_ATT_THREADS>(qs, part_acc, part_ml, counters, out, q_dim, n_kv_heads, row0, rows,
                                                       n_active, n_splits);
}

// ---------------------------------------------------------------------------------------------
// Prefill attention on the tensor cores (PREFILL_FLASH_MMA): prefill_flash_body's blocks (a KV head,
// a split, FLASH_ROWS query rows) and combine, splits of at least FMMA_MIN_CHUNK positions, with
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

/* 1: prefill_flash_mma_body instead of prefill_flash_body. H200, 128-token prompt, against the fp32
 * kernel: Llama-3.2-1B +8.6% / +12.4% / +66% at depths 0 / 4096 / 16384, Mistral-7B +8.7% / +14.0% /
 * +70% (PERFORMANCE.md, twenty-eighth session). */
#ifndef PREFILL_FLASH_MMA
#define PREFILL_FLASH_MMA 1
#endif
/* Fewest positions a split of prefill_flash_mma_body takes (above the prompt's splits, att_split_len).
 * Its blocks are short and each split adds to the last block's combine: splits of 1024 against the
 * prompt's 256-512 measured faster by 22% at depth 4096 and 29-51% at 16384 in the kernel alone
 * (1B, 7B; twenty-eighth session). Tests build 5 (many splits, the combine). */
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
