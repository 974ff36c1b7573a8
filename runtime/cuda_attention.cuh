/* cuda_attention.cuh - the decode step's attention (and the prompt's on heads the flash kernels do
 * not take): split-K flash decoding over the KV cache (fp16 or q8: cuda_kv.cuh), each KV head read once for its GQA
 * group, the splits' partial sums combined by the last block of the head; on heads of 64 and 128
 * the scores and weighted values on the tensor cores (MODEL_ATT_MMA_HD). */
#ifndef INGOT_CUDA_ATTENTION_CUH
#define INGOT_CUDA_ATTENTION_CUH

#include "cuda_matvec.cuh"

#define ATT_TILE 1024                   /* most positions one attention block scores at once */
/* Fewest positions an attention block takes (the plan's; a test builds 5: many splits, odd bounds). 256 against
 * 32: up to depth 8448 (33 splits of 256 on the 1B and 7B shapes) fewer, longer splits and a shorter
 * combine: decode 1B +2.8% at depth 1024 and +0.7% at 4096, 7B +0.6% at 4096; the 128-token prompt
 * +16-18% (1B) and +7-12% (7B) at 1024 and 4096; even at 0 and 16384 (docs/performance.md, D41) */
#define ATT_MIN_CHUNK MODEL_ATT_MIN_CHUNK
/* The same for the prompt's attention (the flash kernels, attention_body with TOKENS > 1): 512
 * measured +8-9% at depth 8192 where the decode lost, at 1024-4096 it lost 12-20%; the prompt's
 * splits grow with the context instead (below; docs/performance.md, D41, D85) */
#define PREFILL_MIN_CHUNK ATT_MIN_CHUNK
/* A prompt's split grows with the context n: n / PREFILL_CHUNK_SPLITS positions rounded down to a
 * power of two, between PREFILL_MIN_CHUNK and twice it. 512 measured +8-9% for
 * the prompt at depth 8192, 256 better at 1024-4096 (by 12-20%), and n / 16 as such (264 at 4096)
 * -4% there; this rule: prompt +9.1% / +7.8% (1B) and +7.8% / +3.0% (7B) at 8192 / 16384, even
 * below (docs/performance.md, D85). */
#define PREFILL_CHUNK_SPLITS 16
__device__ __forceinline__ int prefill_min_chunk(int n) {
    const int want = n / PREFILL_CHUNK_SPLITS, pow2 = want > 0 ? 1 << (31 - __clz(want)) : 1;
    return min(max(pow2, PREFILL_MIN_CHUNK), min(2 * PREFILL_MIN_CHUNK, ATT_TILE));
}
/* A decode split's positions rounded up to a multiple of ATT_CHUNK_ALIGN: 64 where the smallest
 * split is a multiple of it (so only deep contexts change: 497 positions a split at depth 16384
 * become 512), +0.4% on the 1B and 7B shapes at 16384 (docs/performance.md, D42); a test's 5-position
 * splits stay as they are. */
#define ATT_CHUNK_ALIGN (ATT_MIN_CHUNK % 64 == 0 ? 64 : 1)
#define ATT_CHUNK_STEP (ATT_CHUNK_ALIGN > 0 ? ATT_CHUNK_ALIGN : 1)
static_assert(ATT_TILE % ATT_CHUNK_STEP == 0, "ATT_CHUNK_ALIGN: a divisor of ATT_TILE");
/* Positions a split of attention takes when the context is n: min_splits blocks per KV head (a wave
 * of the GPU), more only when a split would pass a tile (splits sized by the context allocated left
 * short contexts many tiny blocks in several waves: 1B shape, 131072 allocated, depth 4096: 1000
 * blocks of 33 positions; docs/performance.md, D20). A prompt's splits take at least prefill_min_chunk(n)
 * positions and are not aligned. The splits with positions: (n + chunk - 1) / chunk. */
__device__ __forceinline__ int att_split_len(int n, int n_splits, int min_splits, bool prompt) {
    const int splits = min(n_splits, max(min_splits, (n + ATT_TILE - 1) / ATT_TILE));
    const int chunk = max((n + splits - 1) / splits, prompt ? prefill_min_chunk(n) : ATT_MIN_CHUNK);
    return prompt ? chunk : (chunk + ATT_CHUNK_STEP - 1) / ATT_CHUNK_STEP * ATT_CHUNK_STEP;
}
static_assert(ATT_MIN_CHUNK >= 1 && ATT_MIN_CHUNK <= ATT_TILE && PREFILL_MIN_CHUNK >= 1 && PREFILL_MIN_CHUNK <= ATT_TILE,
              "ATT_MIN_CHUNK, PREFILL_MIN_CHUNK: 1 to ATT_TILE positions (a block scores at most a tile)");
#define ATT_COMBINE_VEC 16              /* splits' partial sums the combining block loads at once */
/* The combine's float4 form (below, in attention_body), ATT_COMBINE_LOADS loads a thread at once:
 * -1 where the plain form would give a thread more than one output (a KV group's heads times the
 * head width past MODEL_ATT_THREADS: the 7B shape, +1.2% at depths 4096 and 16384; on the 1B shape, one
 * output a thread, it measured even), 1 everywhere, 0 nowhere (docs/performance.md, D40) */
#define ATT_COMBINE_WIDE -1
#define ATT_COMBINE_LOADS 9 /* 33 splits (two waves of blocks over 8 KV heads) in two rounds on the 7B shape */
/* MODEL_ATT_COMBINE_EARLY=N (the generated code's plan sets it; 0, off): where the combine's plain form
 * gives a thread one output, it loads that output's first N splits' partial sums before the splits'
 * (max, sum), so both are in flight at once: one L2 round trip fewer on the combine's chain */
#define ATT_UNROLL 4                    /* key or value rows an attention thread holds in flight (8: even) */

// ---------------------------------------------------------------------------------------------
// Attention: split-K flash decoding. Block (kv head, split) scores its slice of the positions
// for all kv_mul query heads of the group, so each KV head is read once per group; the last block
// of a KV head to finish combines the splits' partial softmax sums in split order (deterministic).
// The block that writes a KV group's output (its only split, or the combining block) adds 1 to
// *ready when given one: the joined attention/o_proj grid's o_proj blocks wait on that count.

/* The tensor-core path's query operands (hi and lo terms of every lane's 8 dims of each 32-dim chunk),
 * in shared memory after the (max, sum) pairs: 32-bit words. */
#define ATT_QFRAG_WORDS(head_dim) ((head_dim) / 32 * 8 * WARP_SIZE)

/* Floats of the scores, which the warps' sums reuse. The sums' stores fall on 4 banks where a group
 * has 4 heads (4-way conflicts, ~0.57 us of the 7B's attention at depth 0). The sums swizzled (XOR:
 * no conflicts) measured -0.3% to -0.8% on the 1B and 7B at depths 0 to 16384, its ~200 instructions
 * of address arithmetic slower than the conflicts (traced); padded rows lost 0.6% on the 1B at 0 / 4096. */
#define ATT_SC_FLOATS(rows, hd) ((size_t)(rows) * ATT_TILE)

/* Dynamic shared memory of attention_body, in bytes. */
#define ATT_SMEM_BYTES(kv_mul, head_dim) \
    ((ATT_SC_FLOATS(kv_mul, head_dim) + 2 * (size_t)(kv_mul) + ATT_QFRAG_WORDS(head_dim)) * sizeof(float))

/* This block's outputs are written: one more to *done (NULL: nobody counts), for wait_count. */
__device__ __forceinline__ void signal_done(unsigned *done) {
    if (!done) return;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) atomicAdd(done, 1u);
}

/* The decode step's attention on the tensor cores (attention_body with MMA_HD, the head width: 64
 * or 128, one token): fp16 mma.m16n8k16 with fp32 sums, where the fp32 path spends ~5 instructions
 * per byte of keys in shuffles and conversions and lands at ~1.6 TB/s alone at depth 16384 on the 1B
 * shape (ncu; docs/performance.md, D39). A warp takes tiles of 16 positions, ATT_MMA_TILES of them a round,
 * and where pipelined the next round's loads go out before this round's products.
 * - Scores as S^T = K Q^T: A is the tile's keys (16 positions x 16 dims a k-step), B the group's
 *   query rows (n = 8 >= kv_mul). The dot product does not care which dims a k-step takes as long
 *   as A and B agree, so lane (g, c) holds dims 32 ch + 8 c .. + 7 of positions g and g + 8 of the
 *   tile for each 32-dim chunk ch (a 16-byte load each, and a warp's loads cover whole 64-byte
 *   pieces of 8 keys), as the prefill's pairs do with weight rows.
 * - Values as O^T = V^T P^T: A is V^T (16 dims x 16 positions), B the probabilities (positions x
 *   rows). Lane (g, c) loads positions 4c .. 4c + 3 of the tile at its dims (the uint4s 8u + g of
 *   each value row: dims d' = 8u + e at (8u + g) * 8 + e), and pairs two positions' halves of one
 *   dim into an operand register (a byte permute). m-tile t takes d' = t (rows g) and t + HD/16
 *   (rows g + 8).
 * - The fp32 queries and probabilities go in as two fp16 terms each (hi + lo, 22 bits), the
 *   keys and values are fp16 already: outputs within ~3e-7 of the largest against float64
 *   (tests/bench/attention_mma_sim.py, which checks this index arithmetic).
 * The constants below are the measured choices; the others are in docs/performance.md. */
#define ATT_MMA_TILES 0 /* tiles of 16 positions a warp loads at once (a round); 0: 2 on heads of 64, 1 on 128 */
/* 1: the next round's keys (values) loaded before this round's products, 0: a round at a time; -1:
 * the measured choice: keys pipelined at every head width, values on heads of 64 only. At 128 two
 * rounds of values spill 52 bytes in the 7B shape's joined attention/o_proj grid, and there the
 * pipelined build measured -1% against one round at a time; keys alone fit (125 registers in the
 * joined grid) and gained 0.6% at depth 16384 (docs/performance.md, D39, D40). The 7B runs
 * attention_kernel alone (the joined grid left its steps: D30), where values pipelined on heads of 128
 * take 128 registers and spill nothing, and measured -0.1% / -0.7% / -0.4% at depths 0 / 4096 / 16384:
 * still off there. */
#define ATT_MMA_PIPE_KEYS -1
#define ATT_MMA_PIPE_VALUES -1
__host__ __device__ constexpr int att_mma_tiles(int hd) { return ATT_MMA_TILES > 0 ? ATT_MMA_TILES : hd <= 64 ? 2 : 1; }
/* Each warp's first round of values copied into shared memory (cp.async) with its keys, the cached
 * positions' before the wait and this step's after it (2: all of them after it), instead of loaded
 * after the softmax: one L2 or DRAM round trip off the split's chain. A split of up to 256 positions
 * (heads of 64) or 128 (heads of 128) is one round. Only where the context has at most
 * ATT_STAGE_MAX_SPLITS splits: where attention's blocks are few, its chain is latency; in a full wave
 * of them (33 splits from depth 8448) it is bandwidth, and the early values only crowd the keys. The
 * round's rows are stored with their 16-byte chunks permuted (stage_chunk) so that the value pass's
 * reads, 4 positions x 2 chunks a quarter-warp, fall in 8 bank groups. Measured on the 1B shape
 * (docs/performance.md, D43): +1.3-1.4% at depths 0 / 1024 / 4096, even at 8192 / 16384
 * with the limit (-1.3% / -2.0% without it); 2 lost 0.8% at 1024. On the 7B shape (heads of 128) the
 * joined grid spills 52 bytes with it and lost 0.7-2.3% at every depth; attention_kernel alone, as
 * the 7B runs it (D30), takes 136 registers, one block an SM, and lost 0.3% / 1.9% / 5.9% at
 * depths 0 / 4096 / 16384 (at two blocks an SM, 128 registers and 12 bytes spilled: +0.2% / -0.8% /
 * -1.3%); the SmolLM2 shape lost 2.8% at depth 0. A plan choice (codegen/plan.py, _att_stage_values);
 * 0 here: off. */
#define ATT_STAGE_MAX_SPLITS 17 /* to depth 4352 in splits of 256 */
/* Bytes of shared memory the staged values take */
__host__ __device__ constexpr size_t att_value_stage_bytes(int hd) {
    return MODEL_ATT_STAGE_VALUES ? 16 + (size_t)(MODEL_ATT_THREADS / WARP_SIZE) * att_mma_tiles(hd) * 16 * hd * 2 : 0; /* 16: alignment */
}
/* Where chunk ch of position p of a tile goes in the staged round: the chunk's low bits XOR 2 (p / 4 % 4),
 * so a quarter-warp's 8 reads (g = 2q, 2q + 1; positions 4 cq + i) fall in 8 different 16-byte bank groups */
__device__ __forceinline__ int stage_chunk(int ch, int p) { return ch ^ (2 * ((p >> 2) & 3)); }

/* The staged values' place in attention_body's shared memory: after the query operands, 16-byte aligned */
template <int HD>
__device__ __forceinline__ uint4 *att_value_stage(float *sml, int rows) {
    const uint32_t *qf = reinterpret_cast<const uint32_t *>(sml + 2 * rows) + ATT_QFRAG_WORDS(HD);
    return reinterpret_cast<uint4 *>((reinterpret_cast<uintptr_t>(qf) + 15) & ~(uintptr_t)15);
}

__host__ __device__ constexpr bool att_mma_pipe_keys(void) { return ATT_MMA_PIPE_KEYS != 0; }
__host__ __device__ constexpr bool att_mma_pipe_values(int hd) { return ATT_MMA_PIPE_VALUES >= 0 ? ATT_MMA_PIPE_VALUES != 0 : hd <= 64; }

/* c (16 x 8, fp32) += a (16 x 16, row-major) . b (16 x 8, column-major), fp16 operands */
__device__ __forceinline__ void mma_f16_16x8x16(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                                uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* An fp32 pair as two fp16 pairs that sum to it, each packed low then high (mma operands). */
__device__ __forceinline__ void split_h2(float x, float y, uint32_t *hi, uint32_t *lo) {
    const __half2 h = __floats2half2_rn(x, y);
    const float2 b = __half22float2(h);
    const __half2 l = __floats2half2_rn(x - b.x, y - b.y);
    *hi = *reinterpret_cast<const uint32_t *>(&h);
    *lo = *reinterpret_cast<const uint32_t *>(&l);
}

/* fp16 value e (0..7) of x low, of y high: one operand register from two positions' values */
__device__ __forceinline__ uint32_t half_pair(uint4 x, uint4 y, int e) {
    const uint32_t wx = (&x.x)[e / 2], wy = (&y.x)[e / 2];
    return __byte_perm(wx, wy, e % 2 ? 0x7632 : 0x5410);
}

/* The dim of value d' (0 .. HD/8 - 1) of lane group g in the value pass (the uint4 8u + g of a row). */
__device__ __forceinline__ int mma_value_dim(int d, int g) { return (8 * (d / 8) + g) * 8 + d % 8; }

/* Warp ch's part of the query operands in qf (attention_body): the group's row g's dims 32 ch + 8 cq ..
 * + 7 (q's rows row0 + g; 0 past rows) as hi and lo fp16 pairs, word w of the chunk of each lane at
 * qf[(8 ch + w) * 32 + lane], read by every warp's same lane */
template <int HD>
__device__ __forceinline__ void mma_query_operands(uint32_t *qf, const float *q, int row0, int rows, int ch, int lane) {
    const int g = lane / 4, cq = lane % 4;
    float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f), b = a;
    if (g < rows) {
        const float4 *qg = reinterpret_cast<const float4 *>(q + (size_t)(row0 + g) * HD + 32 * ch + 8 * cq);
        a = qg[0], b = qg[1];
    }
    uint32_t *f = qf + 8 * ch * WARP_SIZE + lane;
    split_h2(a.x, a.y, &f[0 * WARP_SIZE], &f[4 * WARP_SIZE]);
    split_h2(a.z, a.w, &f[1 * WARP_SIZE], &f[5 * WARP_SIZE]);
    split_h2(b.x, b.y, &f[2 * WARP_SIZE], &f[6 * WARP_SIZE]);
    split_h2(b.z, b.w, &f[3 * WARP_SIZE], &f[7 * WARP_SIZE]);
}

/* One tile's scores S^T = K Q^T (16 positions x 8 query rows) into s: lane (g, cq) gives its keys of
 * positions g (k0) and g + 8 (k1), its 8 elements of each 32-dim chunk as loaded (KV::raw), and gets
 * (position g, rows 2 cq, 2 cq + 1), (g + 8, the same) in s[0..3]; the queries' hi and lo terms from
 * qf (attention_body). */
template <int KCH, typename KV>
__device__ __forceinline__ void mma_score_tile(float s[4], const typename KV::raw (&k0)[KCH], const typename KV::raw (&k1)[KCH],
                                               const uint32_t *qf, int lane) {
#pragma unroll
    for (int ch = 0; ch < KCH; ch++) {
        const uint4 a = KV::h8(k0[ch]), b = KV::h8(k1[ch]);
        const uint32_t *f = qf + 8 * ch * WARP_SIZE + lane;
        mma_f16_16x8x16(s, a.x, b.x, a.y, b.y, f[0 * WARP_SIZE], f[1 * WARP_SIZE]); /* hi */
        mma_f16_16x8x16(s, a.x, b.x, a.y, b.y, f[4 * WARP_SIZE], f[5 * WARP_SIZE]); /* lo */
        mma_f16_16x8x16(s, a.z, b.z, a.w, b.w, f[2 * WARP_SIZE], f[3 * WARP_SIZE]);
        mma_f16_16x8x16(s, a.z, b.z, a.w, b.w, f[6 * WARP_SIZE], f[7 * WARP_SIZE]);
    }
}

/* One tile's weighted values O^T += V^T P^T into o (m-tile t: dims d' = t and t + MT, query rows
 * 2 cq, 2 cq + 1): lane (g, cq) gives its 8-element chunks 8 u + g of positions 4 cq .. 4 cq + 3 as
 * loaded (vr) and row g's probabilities at those positions (p, 0 past the group or the positions). */
template <int HD, typename KV>
__device__ __forceinline__ void mma_value_tile(float (&o)[HD / 16][4], const typename KV::raw (&vr)[4][HD / 64], float4 p) {
    constexpr int MT = HD / 16;
    uint4 v[4][HD / 64];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int u = 0; u < HD / 64; u++) v[i][u] = KV::h8(vr[i][u]);
    uint32_t ph0, pl0, ph1, pl1;
    split_h2(p.x, p.y, &ph0, &pl0);
    split_h2(p.z, p.w, &ph1, &pl1);
#pragma unroll
    for (int t = 0; t < MT; t++) {
        const int d0 = t, d1 = t + MT; /* rows g and g + 8 of m-tile t */
        const uint32_t a0 = half_pair(v[0][d0 / 8], v[1][d0 / 8], d0 % 8);
        const uint32_t a1 = half_pair(v[0][d1 / 8], v[1][d1 / 8], d1 % 8);
        const uint32_t a2 = half_pair(v[2][d0 / 8], v[3][d0 / 8], d0 % 8);
        const uint32_t a3 = half_pair(v[2][d1 / 8], v[3][d1 / 8], d1 % 8);
        mma_f16_16x8x16(o[t], a0, a1, a2, a3, ph0, ph1);
        mma_f16_16x8x16(o[t], a0, a1, a2, a3, pl0, pl1);
    }
}

/* A split's block after its partial sums (part_acc, unnormalized) and (max, sum) (part_ml) are stored:
 * it counts itself in, and the last of the KV head's n_active splits weighs them all into out.
 * sc: shared memory for the splits' (max, sum), 2 rows n_active floats. Rows, tokens, q_stride and
 * parts as attention_body's. */
template <int TOKENS>
__device__ __forceinline__ void attention_combine(float *sc, const float *part_acc, const float *part_ml, unsigned *counters,
                                                  float *out, int head_dim, int kv_mul, int n_splits, int n_active, int kvh,
                                                  unsigned *ready, int q_stride, size_t parts) {
    __shared__ bool last;
    const int rows = TOKENS * kv_mul, tid = threadIdx.x, lane = tid % WARP_SIZE, wid = tid / WARP_SIZE;
    auto token_of = [&](int r) { return TOKENS == 1 ? 0 : r / kv_mul; };
    auto head_of = [&](int r) { return TOKENS == 1 ? r : r % kv_mul; };
    TRACE_RESUME();
    __threadfence();
    __syncthreads();
    if (tid == 0) last = atomicAdd(&counters[kvh], 1u) == (unsigned)n_active - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    {
        /* The last block of this KV head: every split's (max, sum) of each head loaded at once into
         * shared memory, turned into the splits' weights by warp h for head h, then each thread one
         * (head, dim) output from the splits' partial sums, ATT_COMBINE_VEC loads in flight: a chain
         * of one load per split cost ~12 us a layer at depth 4096 on the 1B shape (docs/performance.md,
         * D19). */
        const bool wide = ATT_COMBINE_WIDE > 0 || (ATT_COMBINE_WIDE < 0 && rows * head_dim > MODEL_ATT_THREADS);
        /* MODEL_ATT_COMBINE_EARLY: thread tid's output (head tid / head_dim), its first splits' sums */
        const bool early = MODEL_ATT_COMBINE_EARLY > 0 && !wide && rows * head_dim <= (int)blockDim.x;
        const float *acc_e = part_acc + (size_t)token_of(tid / head_dim) * parts * head_dim +
                             (size_t)(kvh * kv_mul + head_of(tid / head_dim)) * n_splits * head_dim + tid % head_dim;
        float pre[MODEL_ATT_COMBINE_EARLY > 0 ? MODEL_ATT_COMBINE_EARLY : 1];
        if (early && tid < rows * head_dim)
#pragma unroll
            for (int k = 0; k < MODEL_ATT_COMBINE_EARLY; k++)
                if (k < n_active) pre[k] = __ldcg(&acc_e[(size_t)k * head_dim]);
        float *sm = sc, *sl = sc + rows * n_active;
        for (int i = tid; i < rows * n_active; i += blockDim.x) {
            const int r = i / n_active;
            const float *ml = part_ml + (size_t)token_of(r) * parts * 2 +
                              ((size_t)(kvh * kv_mul + head_of(r)) * n_splits + i % n_active) * 2;
            const float2 v = __ldcg(reinterpret_cast<const float2 *>(ml));
            sm[i] = v.x;
            sl[i] = v.y;
        }
        __syncthreads();
        if (wid < rows) {
            float M = -INFINITY, den = 0.0f;
            for (int s2 = lane; s2 < n_active; s2 += WARP_SIZE) M = fmaxf(M, sm[wid * n_active + s2]);
#pragma unroll
            for (int o = WARP_SIZE / 2; o > 0; o /= 2) M = fmaxf(M, __shfl_xor_sync(0xFFFFFFFFu, M, o));
            for (int s2 = lane; s2 < n_active; s2 += WARP_SIZE) den += __expf(sm[wid * n_active + s2] - M) * sl[wid * n_active + s2];
            den = warp_sum(den);
            __syncwarp();
            for (int s2 = lane; s2 < n_active; s2 += WARP_SIZE) sm[wid * n_active + s2] = __expf(sm[wid * n_active + s2] - M) / den;
        }
        __syncthreads();
        if (early) {
            if (tid < rows * head_dim) {
                const int hl = tid / head_dim;
                float num = 0.0f;
#pragma unroll
                for (int k = 0; k < MODEL_ATT_COMBINE_EARLY; k++)
                    if (k < n_active) num += sm[hl * n_active + k] * pre[k];
                for (int s2 = MODEL_ATT_COMBINE_EARLY; s2 < n_active; s2++) num += sm[hl * n_active + s2] * __ldcg(&acc_e[(size_t)s2 * head_dim]);
                out[token_of(hl) * q_stride + (kvh * kv_mul + head_of(hl)) * head_dim + tid % head_dim] = num;
            }
        } else if (wide) {
            /* 4 dims a thread (float4 loads), a group's splits shared by `per` adjacent lanes (a power of
             * two up to the threads a group leaves), each loading its splits ATT_COMBINE_LOADS at a time,
             * the lanes' sums added by shuffles in a fixed order: on the 7B shape at depth two rounds of
             * loads a thread instead of six */
            const int groups = rows * head_dim / 4;
            int per = 1;
            while (per * 2 * groups <= (int)blockDim.x && per * 2 <= WARP_SIZE) per *= 2;
            for (int base = 0; base < groups * per; base += blockDim.x) { /* the same trips in every thread */
                const int gi = (base + tid) / per, part = (base + tid) % per;
                const bool active = gi < groups;
                const int hl = active ? gi / (head_dim / 4) : 0, d4 = gi % (head_dim / 4);
                const int t = token_of(hl), h = kvh * kv_mul + head_of(hl);
                const float4 *acc_h = reinterpret_cast<const float4 *>(part_acc + (size_t)t * parts * head_dim +
                                                                       (size_t)h * n_splits * head_dim) + d4;
                float4 num = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                for (int s0 = part; s0 < n_active; s0 += per * ATT_COMBINE_LOADS) {
                    float4 a[ATT_COMBINE_LOADS];
#pragma unroll
                    for (int k = 0; k < ATT_COMBINE_LOADS; k++)
                        if (active && s0 + k * per < n_active) a[k] = __ldcg(acc_h + (size_t)(s0 + k * per) * (head_dim / 4));
#pragma unroll
                    for (int k = 0; k < ATT_COMBINE_LOADS; k++)
                        if (active && s0 + k * per < n_active) {
                            const float w = sm[hl * n_active + s0 + k * per];
                            num.x += w * a[k].x, num.y += w * a[k].y, num.z += w * a[k].z, num.w += w * a[k].w;
                        }
                }
                for (int o = 1; o < per; o *= 2) {
                    num.x += __shfl_xor_sync(0xFFFFFFFFu, num.x, o);
                    num.y += __shfl_xor_sync(0xFFFFFFFFu, num.y, o);
                    num.z += __shfl_xor_sync(0xFFFFFFFFu, num.z, o);
                    num.w += __shfl_xor_sync(0xFFFFFFFFu, num.w, o);
                }
                if (active && part == 0) *reinterpret_cast<float4 *>(out + t * q_stride + h * head_dim + 4 * d4) = num;
            }
        } else {
            for (int i = tid; i < rows * head_dim; i += blockDim.x) {
                const int hl = i / head_dim, t = token_of(hl), h = kvh * kv_mul + head_of(hl), dd = i % head_dim;
                const float *acc_h = part_acc + (size_t)t * parts * head_dim + (size_t)h * n_splits * head_dim + dd;
                float num = 0.0f;
                for (int s0 = 0; s0 < n_active; s0 += ATT_COMBINE_VEC) {
                    float a[ATT_COMBINE_VEC];
#pragma unroll
                    for (int k = 0; k < ATT_COMBINE_VEC; k++)
                        if (s0 + k < n_active) a[k] = __ldcg(&acc_h[(size_t)(s0 + k) * head_dim]);
#pragma unroll
                    for (int k = 0; k < ATT_COMBINE_VEC; k++)
                        if (s0 + k < n_active) num += sm[hl * n_active + s0 + k] * a[k];
                }
                out[t * q_stride + h * head_dim + dd] = num;
            }
        }
    }
    if (tid == 0) counters[kvh] = 0;
    signal_done(ready);
}

/* A warp's sums of the values' products (mma_value_tile's o) into red, (warps, rows, HD): lane
 * (g, cq) holds rows 2 cq + i % 2 at dims mma_value_dim(t + MT (i / 2), g). */
template <int HD>
__device__ __forceinline__ void mma_store_sums(float *red, const float (&o)[HD / 16][4], int wid, int rows, int g, int cq) {
    constexpr int MT = HD / 16;
#pragma unroll
    for (int t = 0; t < MT; t++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = 2 * cq + i % 2, dim = mma_value_dim(t + MT * (i / 2), g);
            if (r < rows) red[(wid * rows + r) * HD + dim] = o[t][i];
        }
}

/* TOKENS > 1 (a prefill batch): the block takes TOKENS tokens of the batch, from token `ahead` on
 * (io[IO_COUNT] of them are the batch's), over the same positions, as TOKENS * kv_mul rows of
 * queries (row r: token r / kv_mul, query head r % kv_mul of the group), so the keys and values
 * are read once for all of them. A row scores the positions past its token's as -inf. A token's
 * query, output and partial sums are q_stride floats and `parts` (n_heads * n_splits) splits
 * after the previous token's; one counter for the group's KV head. */
template <int TOKENS, typename KV, typename Wait, int MMA_HD = 0>
__device__ __forceinline__ void attention_body(const float *q, const kv_view<KV> &cache, const int *io,
                                               int ahead, float *part_acc, float *part_ml, unsigned *counters, float *out,
                                               int head_dim, int kv_mul, int ctx, int n_splits,
                                               int min_splits, int kvh, int split, unsigned *ready, Wait wait,
                                               int q_stride = 0, size_t parts = 0) {
    static_assert(TOKENS >= 1 && TOKENS <= MODEL_ATT_MAX_GROUP, "attention rows: TOKENS * kv_mul <= MODEL_ATT_MAX_GROUP");
    extern __shared__ float smem[];
    const int rows = TOKENS * kv_mul;             /* rows of queries; TOKENS == 1: the group's heads */
    float *sc = smem;                             /* (rows, ATT_TILE) scores, then probabilities */
    float *sml = sc + ATT_SC_FLOATS(rows, head_dim); /* (rows, 2) max and sum */
    const int tid = threadIdx.x, lane = tid % WARP_SIZE, wid = tid / WARP_SIZE;
    /* row r's token (from `ahead`) and query head in the group */
    auto token_of = [&](int r) { return TOKENS == 1 ? 0 : r / kv_mul; };
    auto head_of = [&](int r) { return TOKENS == 1 ? r : r % kv_mul; };
    /* Positions [0, n) in chunks of at least ATT_MIN_CHUNK (a prompt's: PREFILL_MIN_CHUNK): a short
     * context keeps few blocks busy and the combine short; blocks past the last chunk have nothing
     * to do. The position is read before the wait, from L2: the previous step wrote it, or the host
     * before this step began. This block's query is `ahead` positions after it (a prefill batch's
     * later tokens; 0 in decode), and positions from io[IO_POS] on are written in this step. */
    int tokens = 1; /* the block's tokens that are the batch's: positions up to the last one's are written */
    if constexpr (TOKENS > 1) tokens = min(TOKENS, __ldcg(&io[IO_COUNT]) - ahead);
    const int first_new = __ldcg(&io[IO_POS]), n = first_new + ahead + tokens;
    const int chunk = att_split_len(n, n_splits, min_splits, TOKENS > 1), n_active = (n + chunk - 1) / chunk;
    if (split >= n_active) return;
    const int start = split * chunk, len = min(n, start + chunk) - start;
    const float scale = rsqrtf((float)head_dim);
    TRACE_BEGIN(ST_ATT);
    /* the fp32 path: thread (c, slice) takes chunk c (8 dims) of positions slice, slice + slices, ... */
    const int chunks = head_dim / 8, slices = blockDim.x / chunks, c = tid % chunks, slice = tid / chunks;
    const typename KV::elem *kbase = cache.k + kv_at(start, kvh, ctx, head_dim) + 8 * c;
    const typename KV::elem *vbase = cache.v + kv_at(start, kvh, ctx, head_dim) + 8 * c;
    float *red = sc; /* (warps, rows, head_dim): the warps' sums of the weighted values, after them */
    if constexpr (TOKENS == 1 && MMA_HD > 0) {
        static_assert(MMA_HD == 64 || MMA_HD == 128, "attention on the tensor cores: heads of 64 or 128");
        constexpr int HD = MMA_HD, KCH = HD / 32, U = att_mma_tiles(MMA_HD), WARPS = MODEL_ATT_THREADS / WARP_SIZE;
        const int g = lane / 4, cq = lane % 4, n_tiles = (len + 15) / 16;
        const typename KV::elem *kb = cache.k + kv_at(start, kvh, ctx, HD);
        /* keys of positions 16 tile + g + 8 h, this lane's 8 elements of chunk ch: the row's 4 ch + cq'th
         * (as loaded: KV::raw) */
        typedef typename KV::raw key_regs[U][2][KCH];
        auto load_keys = [&](key_regs &kr, int round, bool before_wait) {
#pragma unroll
            for (int k = 0; k < U; k++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int j = 16 * (wid + WARPS * (round * U + k)) + g + 8 * h;
                    /* before the wait: the cached positions; after it, in round 0, the ones this step wrote */
                    const bool want = j < len && (round > 0 || (start + j < first_new) == before_wait);
#pragma unroll
                    for (int ch = 0; ch < KCH; ch++)
                        if (want) kr[k][h][ch] = KV::load(kb + (size_t)j * HD + 8 * cq + 32 * ch);
                        else if (round > 0 || before_wait) kr[k][h][ch] = KV::zero();
                }
        };
        /* query row g's dims 32 ch + 8 cq .. + 7 as hi and lo fp16 pairs (rows past the group's: 0),
         * word w of chunk ch of each lane at qf[(8 ch + w) * 32 + lane]: written by warp ch, read by
         * every warp's same lane (in registers they took the 7B shape past 128) */
        uint32_t *qf = reinterpret_cast<uint32_t *>(sml + 2 * rows);
        uint4 *vs = att_value_stage<HD>(sml, rows) + (size_t)wid * U * 16 * (HD / 8); /* this warp's staged tiles */
        auto stage_values = [&](bool before_wait) { /* kv_f16's only (staged: below) */
            const uint4 *vb = reinterpret_cast<const uint4 *>(cache.v + kv_at(start, kvh, ctx, HD));
#pragma unroll
            for (int k = 0; k < U; k++) {
                const int tile = wid + WARPS * k;
                if (tile >= n_tiles) break;
#pragma unroll
                for (int m = 0; m < 16 * (HD / 8) / WARP_SIZE; m++) {
                    const int e = lane + WARP_SIZE * m, p = e / (HD / 8), ch = e % (HD / 8), j = 16 * tile + p;
                    /* zeros past len, before the wait; the cached positions before it (mode 2: after
                     * it too), this step's after */
                    if (j < len ? (MODEL_ATT_STAGE_VALUES == 1 && start + j < first_new) == before_wait : before_wait)
                        cp_async16(vs + (k * 16 + p) * (HD / 8) + stage_chunk(ch, p), vb + (size_t)min(j, len - 1) * (HD / 8) + ch,
                                   j < len);
                }
            }
        };
        key_regs ka, kn; /* this round's keys, the next round's where pipelined */
        load_keys(ka, 0, true);
        const bool staged = !KV::Q8 && MODEL_ATT_STAGE_VALUES && n_active <= ATT_STAGE_MAX_SPLITS;
        if (staged) stage_values(true);
        TRACE_AT(TRACE_READY);
        wait();
        TRACE_AT(TRACE_WAITED);
        load_keys(ka, 0, false);
        if (staged) stage_values(false);
        if (wid < KCH) mma_query_operands<HD>(qf, q, kvh * kv_mul, rows, wid, lane);
        __syncthreads();
        auto has_round = [&](int round) { return wid + WARPS * round * U < n_tiles; }; /* the warp's */
        auto score_round = [&](const key_regs &kr, int round) {
#pragma unroll
            for (int k = 0; k < U; k++) {
                const int tile = wid + WARPS * (round * U + k);
                if (tile >= n_tiles) break;
                float s[4] = {0.0f, 0.0f, 0.0f, 0.0f}; /* (position g, rows 2 cq, 2 cq + 1), (g + 8, ...) */
                mma_score_tile<KCH, KV>(s, kr[k][0], kr[k][1], qf, lane);
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int j = 16 * tile + g + 8 * (i / 2), r = 2 * cq + i % 2;
                    if (r < rows && j < len) sc[r * ATT_TILE + j] = s[i] * scale * kv_key_scale(cache, kvh, ctx, start + j);
                }
            }
        };
        if constexpr (att_mma_pipe_keys()) {
            /* two rounds a trip: the next round's loads in flight while this one multiplies */
            for (int round = 0; has_round(round); round += 2) {
                if (has_round(round + 1)) load_keys(kn, round + 1, false);
                score_round(ka, round);
                if (!has_round(round + 1)) break;
                if (has_round(round + 2)) load_keys(ka, round + 2, false);
                score_round(kn, round + 1);
            }
        } else {
            for (int round = 0; has_round(round); round++) {
                if (round > 0) load_keys(ka, round, false);
                score_round(ka, round);
            }
        }
    } else {
        /* Thread (c, slice)'s first round of keys (positions slice + k * slices) before the wait: every
         * position before first_new is in the cache already; the ones the QKV kernel writes in this step
         * are read after the wait. Every cache load bypasses L1 (ld.cg), so a line
         * read before the wait never answers a read after it. (Values too before the wait: +0.8% at
         * depth 0, -0.6% at 16384, on both shapes.) */
        typename KV::raw k0[ATT_UNROLL];
    #pragma unroll
        for (int k = 0; k < ATT_UNROLL; k++) {
            const int j = slice + k * slices;
            k0[k] = j < len && start + j < first_new ? KV::load(kbase + (size_t)j * head_dim) : KV::zero();
        }
        TRACE_AT(TRACE_READY);
        wait();
        TRACE_AT(TRACE_WAITED);
    #pragma unroll
        for (int k = 0; k < ATT_UNROLL; k++) {
            const int j = slice + k * slices;
            if (j < len && start + j >= first_new) k0[k] = KV::load(kbase + (size_t)j * head_dim);
        }

        /* scores: thread (c, slice) takes chunk c (8 dims) of the keys of positions slice, slice +
         * slices, ..., as the value pass below, its query chunks in registers: a warp's loads cover
         * whole lines (against a thread per position, 32 lines a load: +1.6% on the 7B shape at depth
         * 16384; docs/performance.md, D21). A position's `chunks` lanes meet in a shuffle; the loop runs the same
         * trips in every lane, so the shuffles are whole-warp. */
        {
            float qc[MODEL_ATT_MAX_GROUP][8];
    #pragma unroll
            for (int h = 0; h < MODEL_ATT_MAX_GROUP; h++)
                if (h < rows) {
                    const float4 *qh = reinterpret_cast<const float4 *>(q + (size_t)token_of(h) * q_stride +
                                                                        (kvh * kv_mul + head_of(h)) * head_dim + 8 * c);
                    const float4 a = qh[0], b = qh[1];
                    qc[h][0] = a.x, qc[h][1] = a.y, qc[h][2] = a.z, qc[h][3] = a.w;
                    qc[h][4] = b.x, qc[h][5] = b.y, qc[h][6] = b.z, qc[h][7] = b.w;
                }
            for (int jb = 0; jb < len; jb += ATT_UNROLL * slices) {
                typename KV::raw u[ATT_UNROLL];
    #pragma unroll
                for (int k = 0; k < ATT_UNROLL; k++) {
                    const int j = jb + slice + k * slices;
                    u[k] = jb == 0 ? k0[k] : j < len ? KV::load(kbase + (size_t)j * head_dim) : KV::zero();
                }
    #pragma unroll
                for (int k = 0; k < ATT_UNROLL; k++) {
                    const int j = jb + slice + k * slices;
                    float kf[8];
                    h8_to_f32(KV::h8(u[k]), kf);
    #pragma unroll
                    for (int h = 0; h < MODEL_ATT_MAX_GROUP; h++)
                        if (h < rows) {
                            float d = 0.0f;
    #pragma unroll
                            for (int i = 0; i < 8; i++) d += kf[i] * qc[h][i];
                            for (int o = 1; o < chunks; o *= 2) d += __shfl_xor_sync(0xFFFFFFFFu, d, o);
                            /* a row sees the positions up to its token's own */
                            const bool seen = TOKENS == 1 || start + j <= first_new + ahead + token_of(h);
                            if (c == 0 && j < len) sc[h * ATT_TILE + j] = seen ? d * scale * kv_key_scale(cache, kvh, ctx, start + j) : -INFINITY;
                        }
                }
            }
        }
    }
    __syncthreads();
    TRACE_AT(TRACE_STAGED); /* the scores */

    /* softmax pieces per row: warp h finds the max, exponentiates, sums (a row that sees none of
     * these positions, TOKENS > 1 only: max -inf, probabilities and sum 0, weight 0 in the combine) */
    if (wid < rows) {
        float *row = sc + wid * ATT_TILE, m = -INFINITY, l = 0.0f;
        for (int j = lane; j < len; j += WARP_SIZE) m = fmaxf(m, row[j]);
#pragma unroll
        for (int o = WARP_SIZE / 2; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
        const float shift = TOKENS > 1 && m == -INFINITY ? 0.0f : m;
        for (int j = lane; j < len; j += WARP_SIZE) { /* the sum of p; q8's values weighed by their scales */
            float p = __expf(row[j] - shift);
            row[j] = p * kv_value_scale(cache, kvh, ctx, start + j);
            l += p;
        }
        l = warp_sum(l);
        if (lane == 0) { sml[2 * wid] = m; sml[2 * wid + 1] = l; }
    }
    __syncthreads();

    if constexpr (TOKENS == 1 && MMA_HD > 0) {
        constexpr int HD = MMA_HD, MT = HD / 16, VU = HD / 64, U = att_mma_tiles(MMA_HD), WARPS = MODEL_ATT_THREADS / WARP_SIZE;
        const int g = lane / 4, cq = lane % 4, n_tiles = (len + 15) / 16;
        const typename KV::elem *vb = cache.v + kv_at(start, kvh, ctx, HD);
        /* O^T for this lane: m-tile t's rows g (d' = t) and g + 8 (d' = t + MT), query rows 2 cq, 2 cq + 1 */
        float o[MT][4];
#pragma unroll
        for (int t = 0; t < MT; t++) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.0f;
        /* positions 16 tile + 4 cq + i, this lane's uint4s 8 u + g of each value row */
        typedef typename KV::raw value_regs[U][4][VU];
        const uint4 *vs = att_value_stage<HD>(sml, rows) + (size_t)wid * U * 16 * (HD / 8); /* round 0's, if staged */
        auto load_values = [&](value_regs &vr, int round) {
            if constexpr (!KV::Q8)
                if (MODEL_ATT_STAGE_VALUES && n_active <= ATT_STAGE_MAX_SPLITS && round == 0) { /* staged with the keys */
                    cp_async_wait_all();
                    __syncwarp();
#pragma unroll
                    for (int k = 0; k < U; k++)
#pragma unroll
                        for (int i = 0; i < 4; i++)
#pragma unroll
                            for (int u = 0; u < VU; u++) {
                                const int p = 4 * cq + i;
                                vr[k][i][u] = vs[(k * 16 + p) * (HD / 8) + stage_chunk(8 * u + g, p)];
                            }
                    return;
                }
#pragma unroll
            for (int k = 0; k < U; k++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int j = 16 * (wid + WARPS * (round * U + k)) + 4 * cq + i;
#pragma unroll
                    for (int u = 0; u < VU; u++)
                        vr[k][i][u] = j < len ? KV::load(vb + (size_t)j * HD + 8 * g + 64 * u) : KV::zero();
                }
        };
        auto value_round = [&](const value_regs &vr, int round) {
#pragma unroll
            for (int k = 0; k < U; k++) {
                const int tile = wid + WARPS * (round * U + k);
                if (tile >= n_tiles) break;
                /* B: query row g's probabilities at the lane's 4 positions (0 past len and past the group) */
                const int j = 16 * tile + 4 * cq;
                float4 p = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (g < rows) p = *reinterpret_cast<const float4 *>(sc + g * ATT_TILE + j);
                if (j + 0 >= len) p.x = 0.0f;
                if (j + 1 >= len) p.y = 0.0f;
                if (j + 2 >= len) p.z = 0.0f;
                if (j + 3 >= len) p.w = 0.0f;
                mma_value_tile<HD, KV>(o, vr[k], p);
            }
        };
        auto has_round = [&](int round) { return wid + WARPS * round * U < n_tiles; };
        value_regs va, vn;
        if constexpr (att_mma_pipe_values(MMA_HD)) {
            if (has_round(0)) load_values(va, 0);
            for (int round = 0; has_round(round); round += 2) {
                if (has_round(round + 1)) load_values(vn, round + 1);
                value_round(va, round);
                if (!has_round(round + 1)) break;
                if (has_round(round + 2)) load_values(va, round + 2);
                value_round(vn, round + 1);
            }
        } else {
            for (int round = 0; has_round(round); round++) {
                load_values(va, round);
                value_round(va, round);
            }
        }
        TRACE_END(); /* its loads are in; the combine comes after */
        __syncthreads(); /* sc is reused below for the warps' sums */
        mma_store_sums<HD>(red, o, wid, rows, g, cq);
    } else {
        /* weighted values: thread (c, slice) takes 8 dims (chunk c of a value row) of positions slice,
         * slice + slices, ..., ATT_UNROLL positions' loads in flight at once. The slices' sums are
         * reduced in a fixed order (shuffles within a warp, then warps in order), so results do not vary
         * run to run. */
        float acc[MODEL_ATT_MAX_GROUP][8];
    #pragma unroll
        for (int h = 0; h < MODEL_ATT_MAX_GROUP; h++)
    #pragma unroll
            for (int i = 0; i < 8; i++) acc[h][i] = 0.0f;
        for (int j0 = slice; j0 < len; j0 += ATT_UNROLL * slices) {
            typename KV::raw u[ATT_UNROLL];
    #pragma unroll
            for (int k = 0; k < ATT_UNROLL; k++)
                if (j0 + k * slices < len) u[k] = KV::load(vbase + (size_t)(j0 + k * slices) * head_dim);
    #pragma unroll
            for (int k = 0; k < ATT_UNROLL; k++) {
                int j = j0 + k * slices;
                if (j < len) {
                    float v[8];
                    h8_to_f32(KV::h8(u[k]), v);
    #pragma unroll
                    for (int h = 0; h < MODEL_ATT_MAX_GROUP; h++)
                        if (h < rows) {
                            float p = sc[h * ATT_TILE + j];
    #pragma unroll
                            for (int i = 0; i < 8; i++) acc[h][i] += p * v[i];
                        }
                }
            }
        }
        TRACE_END(); /* its loads are in; the combine comes after */
        __syncthreads(); /* sc is reused below for the warps' sums */
    #pragma unroll
        for (int h = 0; h < MODEL_ATT_MAX_GROUP; h++)
            if (h < rows)
    #pragma unroll
                for (int i = 0; i < 8; i++) {
                    float v = acc[h][i];
                    for (int o = chunks; o < WARP_SIZE; o *= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
                    if (lane < chunks) red[(wid * rows + h) * head_dim + 8 * c + i] = v;
                }
    }
    __syncthreads();
    for (int i = tid; i < rows * head_dim; i += blockDim.x) {
        float v = 0.0f;
        for (int w = 0; w < (int)blockDim.x / WARP_SIZE; w++) v += red[w * rows * head_dim + i];
        const int r = i / head_dim, t = token_of(r), h = kvh * kv_mul + head_of(r);
        if (n_active == 1) /* one split: done */
            out[t * q_stride + h * head_dim + i % head_dim] = v / sml[2 * r + 1];
        else
            part_acc[(size_t)t * parts * head_dim + ((size_t)h * n_splits + split) * head_dim + i % head_dim] = v;
    }
    if (n_active == 1) {
        signal_done(ready);
        return;
    }
    if (tid < rows) {
        const int h = kvh * kv_mul + head_of(tid);
        float *ml = part_ml + (size_t)token_of(tid) * parts * 2 + ((size_t)h * n_splits + split) * 2;
        ml[0] = sml[2 * tid];
        ml[1] = sml[2 * tid + 1];
    }
    attention_combine<TOKENS>(sc, part_acc, part_ml, counters, out, head_dim, kv_mul, n_splits, n_active, kvh, ready, q_stride,
                              parts);
}

#endif /* INGOT_CUDA_ATTENTION_CUH */
