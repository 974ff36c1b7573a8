/* cuda_prefill.cuh - the CUDA prompt path's stage bodies: a batch of prompt tokens through every
 * stage at once (prefill), so that each weight row is read once for the whole batch.
 *
 * The batch's sizes, the RMSNorm that adds the split GEMMs' sums and splits its output into the
 * GEMMs' 16-bit terms, the embedding, and QKV (+ bias, RoPE, KV cache), o_proj, gate/up (+ SiLU)
 * and down on the GEMM cores of cuda_gemm.cuh; the attention is cuda_prefill_attention.cuh's.
 * Written, as the decode step's headers, against the MODEL_* constants of model_config.h and
 * model_plan.h, and included by runtime/forward_cuda.cu. */
#ifndef INGOT_CUDA_PREFILL_CUH
#define INGOT_CUDA_PREFILL_CUH

#include "cuda_gemm.cuh"
#include "cuda_matvec.cuh" /* qkv_pair, silu */
#include "cuda_prefill_attention.cuh"

// ---------------------------------------------------------------------------------------------
// Prefill: a batch of B prompt tokens (8 to 256) at positions io[IO_POS] on through every stage at
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

/* Prompt tokens a prefill batch takes, at most: batches of PREFILL_BATCH, PREFILL_BATCH / 2, ...
 * down to 8 (PREFILL_SIZES sizes, a graph each): full ones, then the smallest that covers the
 * tokens left (prefill_from in the generated code). A batch of 16 costs ~1.7 of one of 8 and one of 32 ~1.65 of
 * one of 16 (1B and 7B shapes; 32 against 16: 1B prompt +21%, 7B +22%: docs/performance.md, D80). 64
 * against 32 with every matvec a GEMM (D88): 1B +28%, 7B +23%; with the matvecs of prefill_pairs_body
 * it lost (their time doubles with the tokens). 128 against 64 on wgmma (D94; its GEMMs 256 columns
 * wide in two terms, one block an SM): 1B prompt
 * +29%, 7B +10%; a batch of 128 costs 1.33 (1B) to 1.63 (7B) of one of 64. 256 against 128 on
 * wgmma at one term (D122; the same 256 GEMM columns, half the weight reads a token): 512-token
 * prompt 1B +45%, 7B +50%, 4096 tokens +56%, +45% (H100). So 256 where the GEMMs run on wgmma, 64
 * on mma.sync (its fragments for 256 columns would take 128 registers a lane more; the plan
 * refuses more there). Each a multiple of the mma's n, 8; tests build 16, 32, 64 and 128. */
#define PREFILL_BATCH MODEL_PREFILL_BATCH /* the plan's: 256 on wgmma, else 64 */
#define PREFILL_SMALL 8
#define PREFILL_SIZES                                                                                                     \
    (PREFILL_BATCH == 256 ? 6 : PREFILL_BATCH == 128 ? 5 : PREFILL_BATCH == 64 ? 4 : PREFILL_BATCH == 32 ? 3 : PREFILL_BATCH == 16 ? 2 : 1)
static_assert(PREFILL_BATCH == 8 || PREFILL_BATCH == 16 || PREFILL_BATCH == 32 || PREFILL_BATCH == 64 || PREFILL_BATCH == 128 ||
                  PREFILL_BATCH == 256,
              "prefill batches: 8, 16, 32, 64, 128 or 256 tokens");
/* a GEMM's columns, the batch's terms: at most wgmma's n and a TMA box's rows, 256 */
static_assert(PREFILL_TERMS * PREFILL_BATCH <= 256, "prefill batches: at most 256 columns of terms");
/* Partial sums of o_proj's or down's splits the RMSNorm kernel after them loads a round
 * (prefill_rms_terms_body) */
#define PREFILL_SPLITS 4

/* the most splits of o_proj's or down's partial sums (prefill_part_x) */
#define PREFILL_MAX_X_PARTS (PREFILL_GEMM_MAX_SPLITS > PREFILL_SPLITS ? PREFILL_GEMM_MAX_SPLITS : PREFILL_SPLITS)

static_assert(!GEMM_TMA || (TMA_SMEM_BYTES(PREFILL_BATCH, TMA_STAGES(PREFILL_BATCH, 1), 1) <= 232448 &&
                             TMA_SMEM_BYTES(PREFILL_BATCH, TMA_STAGES(PREFILL_BATCH, 2), 2) <= 232448),
              "GEMM_TMA: the TMA body's stages over a block's 227 KB of shared memory");

/* the most splits of QKV's partial sums (prefill_part_qkv) */
#define PREFILL_MAX_QKV_PARTS PREFILL_GEMM_MAX_SPLITS

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
template <typename W, int THREADS, int V>
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
        store_terms4<W>(terms + (size_t)b * DIM + 4 * j, stride,
                     make_float4(v[u].x * (scale * n[u].x), v[u].y * (scale * n[u].y), v[u].z * (scale * n[u].z),
                                 v[u].w * (scale * n[u].w)));
    }
}

/* The attention's output att (B, n) as the PREFILL_TERMS terms of o_proj's input (PREFILL_TERMS, B, n):
 * float4 blockIdx.x * blockDim.x + threadIdx.x of token blockIdx.y. */
template <typename W>
__device__ __forceinline__ void prefill_att_terms_body(const float *__restrict__ att, uint16_t *__restrict__ terms, int n) {
    pdl_wait();
    pdl_launch_dependents();
    const int i = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (i >= n / 4) return;
    /* from one term's (B, n) to the next: gridDim.y * n */
    store_terms4<W>(terms + (size_t)t * n + 4 * i, (size_t)gridDim.y * n, __ldcg(reinterpret_cast<const float4 *>(att + (size_t)t * n) + i));
}

/* x[b] = embed[history[pos + b]], block (i, b), in the embedding's format W (embed_row); the rows
 * past the batch's tokens repeat its last (their results are never stored in the cache or read). */
template <typename W>
__device__ __forceinline__ void prefill_embed_body(typename W::mat embed, const int *io, float *x, const int *history, int dim) {
    pdl_wait();
    pdl_launch_dependents();
    const int b = blockIdx.y;
    embed_row<W>(embed, history[io[IO_POS] + min(b, io[IO_COUNT] - 1)], x + (size_t)b * dim, dim, blockIdx.x * blockDim.x + threadIdx.x,
                 gridDim.x * blockDim.x);
}

/* q/k/v pair p's sums a, b over K for token t of the batch (+ bias, RoPE at position io[IO_POS] + t)
 * into q (t, q_dim), or the key or value cache (kv_put) for tokens of the batch's count. */
template <typename KV>
__device__ __forceinline__ void prefill_qkv_store(int p, int t, float a, float b, const uint16_t *bq, const uint16_t *bk,
                                                  const uint16_t *bv, float *q, const kv_view<KV> &cache, const int *io,
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
        kv_put(cache, kind, t, pos0 + t, ra, a, kv_dim, head_dim, ctx);
        kv_put(cache, kind, t, pos0 + t, rb, b, kv_dim, head_dim, ctx);
    }
}

/* q/k/v for a batch of B as a GEMM on input_layernorm's output as terms (prefill_rms_terms_body):
 * the pairs of qkv_pair, over split blockIdx.y of gridDim.y's parts of K, pair p's sums for token t
 * to part[s][t][p] (float2s of a and b), which prefill_qkv_finish_body adds and stores (+ bias,
 * RoPE, the KV cache). */
template <typename W, int B>
__device__ __forceinline__ void prefill_qkv_gemm_body(typename W::mat wq, typename W::mat wk, typename W::mat wv,
                                                      const uint16_t *x_terms, float2 *part, int dim, int q_dim, int kv_dim,
                                                      int head_dim) {
    const int q_pairs = q_dim / 2, k_pairs = kv_dim / 2, pairs = q_pairs + k_pairs + kv_dim / 2;
    const int s = blockIdx.y;
    auto pair = [&](int p, typename W::row_t *a, typename W::row_t *b) {
        int ra, rb, kind;
        qkv_pair(p, q_pairs, k_pairs, head_dim, &ra, &rb, &kind);
        typename W::mat wm = kind == 0 ? wq : kind == 1 ? wk : wv;
        *a = W::row(wm, ra, dim);
        *b = W::row(wm, rb, dim);
    };
    auto store = [&](int p, int t, float a, float b) { part[((size_t)s * B + t) * pairs + p] = make_float2(a, b); };
    prefill_split_body<W, B>(pairs, dim, x_terms, pair, store);
}

/* QKV's splits added in order, for pair blockIdx.x * blockDim.x + threadIdx.x and token blockIdx.y
 * of a batch of B, then stored (prefill_qkv_store) */
template <int B, typename KV>
__device__ __forceinline__ void prefill_qkv_finish_body(const float2 *part, int splits, const uint16_t *bq, const uint16_t *bk,
                                                        const uint16_t *bv, float *q, const kv_view<KV> &cache, const int *io,
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
    prefill_qkv_store(p, t, v.x, v.y, bq, bk, bv, q, cache, io, inv_freq, q_dim, kv_dim, head_dim, ctx);
}

/* part[s] (B, rows) = W (rows, K) . in over split s = blockIdx.y of gridDim.y's parts of K [+ bias,
 * in split 0]: rows (i, i + rows / 2) a pair (rows even); in: the terms, as a GEMM (prefill_gemm_body
 * over K's tiles). The next RMSNorm kernel adds the splits to the residual stream
 * (prefill_rms_terms_body). */
template <typename W, int B>
__device__ __forceinline__ void prefill_residual_body(typename W::mat w, const uint16_t *bias, const uint16_t *in, float *part,
                                                      int rows, int K) {
    const int half = rows / 2, s = blockIdx.y;
    float *out = part + (size_t)s * B * rows;
    if (s != 0) bias = NULL;
    auto pair = [&](int p, typename W::row_t *a, typename W::row_t *b) {
        *a = W::row(w, p, K);
        *b = W::row(w, p + half, K);
    };
    auto store = [&](int p, int t, float a, float b) {
        out[(size_t)t * rows + p] = a + (bias ? w_to_f32(bias[p]) : 0.0f);
        out[(size_t)t * rows + p + half] = b + (bias ? w_to_f32(bias[p + half]) : 0.0f);
    };
    prefill_split_body<W, B>(half, K, in, pair, store);
}

/* gate/up's store(p, t, a, b): SiLU(gate) * up of pair p for token t into down's input terms
 * hb_terms (PREFILL_TERMS, B, hidden) */
template <typename W, int B>
__device__ __forceinline__ auto prefill_gate_up_store(uint16_t *hb_terms, int hidden) {
    return [=](int p, int t, float a, float b) { store_terms<W>(hb_terms + (size_t)t * hidden + p, (size_t)B * hidden, silu(a) * b); };
}


/* gate and up + SiLU on post_attention_layernorm's output as terms (prefill_rms_terms_body):
 * hb = silu(gate . x) * (up . x), stored as down's input terms, (PREFILL_TERMS, B, hidden); as a
 * GEMM (prefill_gemm_body) or by prefill_pairs_body. */
template <typename W, int B, bool GEMM>
__device__ __forceinline__ void prefill_gate_up_silu_body(typename W::mat wg, typename W::mat wu, const uint16_t *x_terms,
                                                          uint16_t *hb_terms, int dim, int hidden) {
    auto pair = [&](int p, typename W::row_t *a, typename W::row_t *b) {
        *a = W::row(wg, p, dim);
        *b = W::row(wu, p, dim);
    };
    auto store = prefill_gate_up_store<W, B>(hb_terms, hidden);
    if constexpr (GEMM)
        prefill_gemm_body<W, B, GATE_UP_GEMM_STAGES, GATE_UP_GEMM_WAIT1>(hidden, dim, 0, gemm_k_tiles(dim), x_terms, pair, store);
    else prefill_pairs_body<W, B>(hidden, dim, 0, (dim + 31) / 32, x_terms, pair, store);
}

#if GEMM_TMA
/* gate/up + SiLU as prefill_gate_up_silu_body's GEMM with its tiles copied by TMA
 * (prefill_gemm_tma_body): gate and up, tensor maps of the (hidden, dim) matrices; x_terms, of
 * the input terms */
template <typename W, int B, int S, bool W1, int WGS>
__device__ __forceinline__ void prefill_gate_up_tma_body(const CUtensorMap *gate, const CUtensorMap *up, const CUtensorMap *x_terms,
                                                         uint16_t *hb_terms, int dim, int hidden) {
    prefill_gemm_tma_body<W, B, S, W1, WGS>(gate, up, x_terms, hidden, dim, prefill_gate_up_store<W, B>(hb_terms, hidden));
}
#endif

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

#endif /* INGOT_CUDA_PREFILL_CUH */
