/* cuda_attention_short.cuh - the decode attention at a short context (MODEL_ATT_SHORT): one block a
 * (KV head, split) of at most one round of tiles a warp, on the tensor cores, launched by the steps
 * that read at most short_kernel_positions. */
#ifndef INGOT_CUDA_ATTENTION_SHORT_CUH
#define INGOT_CUDA_ATTENTION_SHORT_CUH

#include "cuda_attention.cuh"

// ---------------------------------------------------------------------------------------------
// The decode attention at a short context (MODEL_ATT_SHORT, the plan's where the tensor-core path runs):
// one block a (KV head, split) of at most att_short_max(HD) positions (one round of tiles a warp:
// 128 on heads of 128, 256 on heads of 64), flash-decoding within the block. The splits are
// attention_body's (att_split_len); where there is more than one, each stores its partial sums and
// the last combines them (attention_combine). The block that writes a KV group's outputs adds 1 to
// *ready when given one (the joined attention/o_proj grid, MODEL_ATT_O_SHORT). The host launches it in one split up to att_short_max(HD) positions, and on heads
// of 64, whose 256 is ATT_MIN_CHUNK, in MODEL_ATT_MIN_SPLITS up to 33 x 256 (forward_cuda.cu,
// short_kernel_splits). At depth 0 attention_body's chain after its wait is 4.2 us on the 7B shape
// for almost no work: five block barriers, the softmax through shared memory a row a warp, the
// values loaded after it (one more L2 round trip), the sums' stores in 4-way bank conflicts
// (traced; docs/performance.md, D55). Here:
// - each warp loads its tiles' keys and values together, the cached positions' before the wait;
// - scores as attention_body's (S^T = K Q^T on the tensor cores), then each warp's softmax in its
//   registers: a row's max and sum over the warp's positions in 3 shuffles each;
// - the probabilities through the warp's own columns of shared memory (a warp barrier) into the
//   values' products, O^T = V^T P^T as attention_body's;
// - the warps that took a tile store their (max, sum) and unscaled sums, one block barrier, and
//   each output weighs those warps' sums by exp(their max - the largest).
// So two round trips fewer for nothing but the values, and four block barriers. Against
// attention_body: 1B +2.2%, 7B +1.1%, SmolLM2 +11.6% at depth 0; the 1B +1.8% at 1024 and +0.4% at
// 4096, where the splits' combine takes most of what they save (docs/performance.md, D55, D56).
__host__ __device__ constexpr int att_short_max(int hd) { return MODEL_ATT_THREADS / WARP_SIZE * att_mma_tiles(hd) * 16; }
/* Shared memory of attention_short_body: the probabilities, the warps' sums, each warp's (max, sum),
 * the query operands */
#define ATT_SHORT_SMEM_BYTES(kv_mul, hd) \
    (((size_t)(kv_mul) * (att_short_max(hd) + (MODEL_ATT_THREADS / WARP_SIZE) * ((hd) + 2)) + ATT_QFRAG_WORDS(hd)) * sizeof(float))

template <int HD, typename KV, typename Wait>
__device__ __forceinline__ void attention_short_body(const float *q, const kv_view<KV> &cache, const int *io,
                                                     float *part_acc, float *part_ml, unsigned *counters, float *out,
                                                     int kv_mul, int ctx, int n_splits, int min_splits, int kvh, int split,
                                                     Wait wait, unsigned *ready = nullptr) {
    constexpr int KCH = HD / 32, MT = HD / 16, VU = HD / 64, U = att_mma_tiles(HD), WARPS = MODEL_ATT_THREADS / WARP_SIZE;
    extern __shared__ float smem[];
    const int rows = kv_mul;
    constexpr int SP = att_short_max(HD);
    float *sp = smem;                                  /* (rows, SP): probabilities */
    float *red = sp + rows * SP;                       /* (WARPS, rows, HD): the warps' sums */
    float *wml = red + WARPS * rows * HD;              /* (WARPS, rows, 2): each warp's max and sum */
    uint32_t *qf = reinterpret_cast<uint32_t *>(wml + WARPS * rows * 2); /* query operands, as attention_body's */
    const int tid = threadIdx.x, lane = tid % WARP_SIZE, wid = tid / WARP_SIZE, g = lane / 4, cq = lane % 4;
    /* positions [start, start + len) of n, split as attention_body's: the host launches this kernel
     * only where a split takes at most SP positions */
    const int first_new = __ldcg(&io[IO_POS]), n = first_new + 1;
    const int chunk = att_split_len(n, n_splits, min_splits, false), n_active = (n + chunk - 1) / chunk;
    if (split >= n_active) return;
    const int start = split * chunk, len = min(n, start + chunk) - start, n_tiles = (len + 15) / 16;
    if (len > SP) __trap();
    TRACE_BEGIN(ST_ATT);
    const typename KV::elem *kb = cache.k + kv_at(start, kvh, ctx, HD), *vb = cache.v + kv_at(start, kvh, ctx, HD);
    /* tile wid + WARPS k: keys of positions 16 tile + g + 8 h (8-element chunk 4 ch + cq of each),
     * values of 16 tile + 4 cq + i (chunks 8 u + g), as loaded (KV::raw); zeros past len */
    typename KV::raw kr[U][2][KCH], vr[U][4][VU];
    auto load = [&](bool before_wait) { /* before the wait the cached positions, after it this step's */
#pragma unroll
        for (int k = 0; k < U; k++) {
            const int tile = wid + WARPS * k;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int j = 16 * tile + g + 8 * h;
                const bool want = j < len && (start + j < first_new) == before_wait;
#pragma unroll
                for (int ch = 0; ch < KCH; ch++)
                    if (want) kr[k][h][ch] = KV::load(kb + (size_t)j * HD + 8 * cq + 32 * ch);
                    else if (before_wait) kr[k][h][ch] = KV::zero();
            }
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int j = 16 * tile + 4 * cq + i;
                const bool want = j < len && (start + j < first_new) == before_wait;
#pragma unroll
                for (int u = 0; u < VU; u++)
                    if (want) vr[k][i][u] = KV::load(vb + (size_t)j * HD + 8 * g + 64 * u);
                    else if (before_wait) vr[k][i][u] = KV::zero();
            }
        }
    };
    load(true);
    TRACE_AT(TRACE_READY);
    wait();
    TRACE_AT(TRACE_WAITED);
    load(false);
    if (wid < KCH) mma_query_operands<HD>(qf, q, kvh * kv_mul, rows, wid, lane);
    __syncthreads();
    /* scores: s[k] holds (position g, rows 2 cq, 2 cq + 1), (g + 8, the same) of tile k; -inf past n.
     * m[e], l[e]: row 2 cq + e's max and sum over the warp's positions */
    const float scale = rsqrtf((float)HD);
    float s[U][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < U; k++) {
        const int tile = wid + WARPS * k;
        s[k][0] = s[k][1] = s[k][2] = s[k][3] = 0.0f;
        if (tile < n_tiles) mma_score_tile<KCH, KV>(s[k], kr[k][0], kr[k][1], qf, lane);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int j = 16 * tile + g + 8 * (i / 2);
            s[k][i] = j < len ? s[k][i] * scale * kv_key_scale(cache, kvh, ctx, start + j) : -INFINITY;
            m[i % 2] = fmaxf(m[i % 2], s[k][i]);
        }
    }
#pragma unroll
    for (int o = 4; o < WARP_SIZE; o *= 2) { /* over g: the lanes of a cq */
        m[0] = fmaxf(m[0], __shfl_xor_sync(0xFFFFFFFFu, m[0], o));
        m[1] = fmaxf(m[1], __shfl_xor_sync(0xFFFFFFFFu, m[1], o));
    }
#pragma unroll
    for (int k = 0; k < U; k++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float p = s[k][i] == -INFINITY ? 0.0f : __expf(s[k][i] - m[i % 2]);
            l[i % 2] += p;
            const int tile = wid + WARPS * k, j = 16 * tile + g + 8 * (i / 2), r = 2 * cq + i % 2;
            /* the warp's own columns; 0 past len; q8's weighed by the values' scales */
            if (r < rows && tile < n_tiles) sp[r * SP + j] = j < len ? p * kv_value_scale(cache, kvh, ctx, start + j) : 0.0f;
        }
#pragma unroll
    for (int o = 4; o < WARP_SIZE; o *= 2) {
        l[0] += __shfl_xor_sync(0xFFFFFFFFu, l[0], o);
        l[1] += __shfl_xor_sync(0xFFFFFFFFu, l[1], o);
    }
    TRACE_AT(TRACE_STAGED);
    __syncwarp();
    float o[MT][4];
#pragma unroll
    for (int t = 0; t < MT; t++) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
#pragma unroll
    for (int k = 0; k < U; k++) {
        const int tile = wid + WARPS * k;
        if (tile >= n_tiles) break;
        float4 p = make_float4(0.0f, 0.0f, 0.0f, 0.0f); /* row g's probabilities at positions 4 cq .. + 3 */
        if (g < rows) p = *reinterpret_cast<const float4 *>(sp + g * SP + 16 * tile + 4 * cq);
        mma_value_tile<HD, KV>(o, vr[k], p);
    }
    /* the warps that took a tile: their (max, sum) and unscaled sums, each in its own space, so one
     * barrier; then each output weighs those warps' sums by exp(m - M), M their max */
    const int warps = min(WARPS, n_tiles);
    if (wid < warps) {
        if (g == 0)
#pragma unroll
            for (int e = 0; e < 2; e++)
                if (2 * cq + e < rows) {
                    wml[(wid * rows + 2 * cq + e) * 2] = m[e];
                    wml[(wid * rows + 2 * cq + e) * 2 + 1] = l[e];
                }
        mma_store_sums<HD>(red, o, wid, rows, g, cq);
    }
    TRACE_END();
    __syncthreads();
    for (int i = tid; i < rows * HD; i += MODEL_ATT_THREADS) {
        const int r = i / HD;
        float M = -INFINITY, L = 0.0f, v = 0.0f;
#pragma unroll
        for (int u = 0; u < WARPS; u++)
            if (u < warps) M = fmaxf(M, wml[(u * rows + r) * 2]);
#pragma unroll
        for (int u = 0; u < WARPS; u++)
            if (u < warps) { /* every such warp saw a position: its max is finite */
                const float e = __expf(wml[(u * rows + r) * 2] - M);
                L += wml[(u * rows + r) * 2 + 1] * e;
                v += red[u * rows * HD + i] * e;
            }
        const int h = kvh * kv_mul + r;
        if (n_active == 1) {
            out[(size_t)h * HD + i % HD] = v / L;
        } else { /* the split's partial sums and (max, sum), as attention_body's */
            part_acc[((size_t)h * n_splits + split) * HD + i % HD] = v;
            if (i % HD == 0) *reinterpret_cast<float2 *>(part_ml + ((size_t)h * n_splits + split) * 2) = make_float2(M, L);
        }
    }
    if (n_active > 1)
        attention_combine<1>(sp, part_acc, part_ml, counters, out, HD, kv_mul, n_splits, n_active, kvh, ready, 0, 0);
    if (ready && n_active == 1) signal_done(ready); /* the joined grid's o_proj counts the outputs written */
}

#endif /* INGOT_CUDA_ATTENTION_SHORT_CUH */
