/* cuda_prefill_attention.cuh - the prompt's attention: every query row of a batch's KV-head
 * group in a block, on the tensor cores (prefill_flash_mma_body, MODEL_PREFILL_FLASH), its splits
 * of the context combined by the last block to finish (prefill_flash_combine). Contexts past
 * FLASH_MAX_SPLITS take the decode attention's prompt form (attention_body, cuda_attention.cuh). */
#ifndef INGOT_CUDA_PREFILL_ATTENTION_CUH
#define INGOT_CUDA_PREFILL_ATTENTION_CUH

#include "cuda_attention.cuh"

// ---------------------------------------------------------------------------------------------
// Prefill attention, every query row of a batch in one block (MODEL_PREFILL_FLASH, a plan choice). A block
// takes one KV head, one split of the positions (as the decode attention's splits, counted from
// the batch's last position) and FLASH_ROWS query rows (row r: token r / kv_mul, head r % kv_mul
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

/* The flash kernel's grid for a batch of B tokens: x the row group (FLASH_ROWS query rows), y the
 * split of the context, z the KV head. Row groups vary fastest, so the blocks that read one split's
 * keys and values are dispatched side by side and all but the first find them in L2; with the KV
 * head fastest, each wave of blocks read every head's whole context from DRAM again
 * (docs/performance.md, D130). */
template <int B>
static inline dim3 flash_grid(int n_splits) {
    return dim3((B * MODEL_KV_MUL + FLASH_ROWS - 1) / FLASH_ROWS, n_splits, MODEL_N_KV_HEADS);
}

/* 2^x, the MUFU's approximation (what __expf runs after its multiply by log2 e) */
__device__ __forceinline__ float ex2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

#define FLASH_COMBINE_LOADS 8 /* splits' partial sums a thread of prefill_flash_combine loads at once */
/* A prefill flash block of a context with n_active > 1 splits, after its rows' partial sums (part_acc,
 * unnormalized) and (max, sum) (part_ml) are stored: it counts itself in, and the last of its KV head's
 * and row group's splits weighs them all into att (B, q_dim), in split order. w: shared memory for the weights,
 * (rows, n_active) floats; THREADS: the block's. */
template <int HD, int THREADS>
__device__ __forceinline__ void prefill_flash_combine(float *w, const float *part_acc, const float *part_ml, unsigned *counters,
                                                      float *att, int kv_mul, int q_dim, int n_kv_heads, int row0, int rows,
                                                      int n_active, int n_splits) {
    __shared__ bool last;
    const int tid = threadIdx.x, kvh = blockIdx.z; /* flash_grid's */
    const size_t parts = (size_t)n_kv_heads * kv_mul * n_splits;
    auto token_of = [&](int r) { return r / kv_mul; };
    auto head_of = [&](int r) { return kvh * kv_mul + r % kv_mul; };
    __threadfence();
    __syncthreads();
    unsigned *counter = &counters[blockIdx.x * n_kv_heads + kvh];
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
                    wr[s0 + u] = ex2_approx(v[u].x - M); /* m in log2 units (prefill_flash_mma_body) */
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
        *reinterpret_cast<float4 *>(att + (size_t)t * q_dim + h * HD + 4 * (i % V4)) = num[u];
    }
    if (tid == 0) *counter = 0;
}

// ---------------------------------------------------------------------------------------------
// Prefill attention on the tensor cores: blocks of a KV head, a split and FLASH_ROWS query rows,
// the combine above, splits of at least FMMA_MIN_CHUNK positions, with
// four warps of 16 query rows. fp16 mma.m16n8k16 with fp32 sums: the fp32 queries (scaled) and
// probabilities go in rounded to fp16, as FlashAttention's do: half the mma work of the two fp16
// terms each that the decode step's tensor-core attention (attention_body with MMA_HD) takes
// (docs/performance.md, D121); the cached keys and values are fp16 already. A tile of FMMA_TILE
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
#define FMMA_MIN_CHUNK MODEL_FMMA_MIN_CHUNK /* the plan's: ATT_TILE */
#define FMMA_WARPS (FLASH_ROWS / 16)
#define FMMA_THREADS (FMMA_WARPS * WARP_SIZE)
#define FMMA_TILE MODEL_FMMA_TILE /* positions a tile (the plan's: 64): a multiple of 16 */
static_assert(FMMA_TILE % 16 == 0, "FMMA_TILE: whole k-steps of 16 positions");
/* Dynamic shared memory: two stages of a tile's keys and values, then the block's queries, all fp16
 * rows of hd */
#define FMMA_STAGE_BYTES(hd) ((size_t)(2 * 2 * FMMA_TILE + FLASH_ROWS) * (hd) * 2)
/* ... or the combine's weights, (FLASH_ROWS, FLASH_MAX_SPLITS) floats, if more (tiles of fewer positions) */
#define FMMA_COMBINE_BYTES(hd) ((size_t)FLASH_ROWS * FLASH_MAX_SPLITS(hd) * 4)
#define FMMA_SMEM_BYTES(hd) (FMMA_STAGE_BYTES(hd) > FMMA_COMBINE_BYTES(hd) ? FMMA_STAGE_BYTES(hd) : FMMA_COMBINE_BYTES(hd))

__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

/* x and y rounded to fp16, packed low then high (an mma operand register) */
__device__ __forceinline__ uint32_t h2_bits(float x, float y) {
    const __half2 v = __floats2half2_rn(x, y);
    return *reinterpret_cast<const uint32_t *>(&v);
}

/* Byte offset of 16-byte chunk c of row r in rows of HD halves, the chunks swizzled */
template <int HD>
__device__ __forceinline__ uint32_t fmma_off(int r, int c) {
    return (uint32_t)(r * HD * 2 + ((c ^ (r & 7)) << 4));
}

/* kv_mul: the query heads of a KV head, a literal in a specialized build (the body is inlined, so
 * it folds as a template argument would) and read at run time in the generic one. */
template <int B, int HD, typename KV>
__device__ __forceinline__ void prefill_flash_mma_body(const float *q, const kv_view<KV> &cache, const int *io,
                                                       float *part_acc, float *part_ml, unsigned *counters, float *att,
                                                       int kv_mul, int q_dim, int n_kv_heads, int ctx, int n_splits,
                                                       int min_splits) {
    static_assert(HD == 64 || HD == 128, "prefill attention on the tensor cores: heads of 64 or 128");
    constexpr int T = FMMA_TILE, CH = HD / 8 /* chunks a row */, NS = T / 8 /* score n-tiles */, NO = HD / 8 /* output n-tiles */;
    constexpr int TILE_BYTES = T * HD * 2;
    const int batch_rows = B * kv_mul;
    extern __shared__ __align__(128) unsigned char fmma_smem[];
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(fmma_smem);
    const uint32_t q_at = 4 * TILE_BYTES; /* the queries' offset; stage s: keys at 2 s TILE_BYTES */
    const int kvh = blockIdx.z, split = blockIdx.y, row0 = blockIdx.x * FLASH_ROWS; /* flash_grid's */
    const int tid = threadIdx.x, lane = tid % WARP_SIZE, wid = tid / WARP_SIZE, g = lane / 4, cq = lane % 4;
    pdl_wait();
    pdl_launch_dependents();
    const int first_new = __ldcg(&io[IO_POS]), count = __ldcg(&io[IO_COUNT]), n = first_new + count;
    const int chunk = max(att_split_len(n, n_splits, min_splits, true), FMMA_MIN_CHUNK), n_active = (n + chunk - 1) / chunk;
    const int rows = min(FLASH_ROWS, min(batch_rows, count * kv_mul) - row0); /* this block's rows that are the batch's */
    if (split >= n_active || rows <= 0) return;
    const int start = split * chunk, len = min(n, start + chunk) - start, n_tiles = (len + T - 1) / T;
    const size_t parts = (size_t)n_kv_heads * kv_mul * n_splits;
    auto token_of = [&](int r) { return r / kv_mul; };
    auto head_of = [&](int r) { return kvh * kv_mul + r % kv_mul; };

    const typename KV::elem *kg = cache.k + kv_at(start, kvh, ctx, HD), *vg = cache.v + kv_at(start, kvh, ctx, HD);
    /* kv_q8: tile it's int8 rows (HD bytes) in raw stage it % 2, after the fp16 stage (which then has
     * one stage: to_f16 fills it for each tile) */
    constexpr uint32_t RAW = 2 * TILE_BYTES;
    auto load_tile = [&](int it) {
        if constexpr (KV::Q8) {
            const uint32_t ks = sbase + RAW + (it % 2) * TILE_BYTES, vs = ks + TILE_BYTES / 2;
            for (int i = tid; i < T * HD / 16; i += FMMA_THREADS) {
                const int p = i / (HD / 16), c = i % (HD / 16), pos = it * T + p;
                const size_t at = pos < len ? (size_t)pos * HD + 16 * c : 0;
                cp_async16_s(ks + p * HD + 16 * c, kg + at, pos < len); /* zeros past the split */
                cp_async16_s(vs + p * HD + 16 * c, vg + at, pos < len);
            }
        } else {
            const uint32_t ks = sbase + (it % 2) * 2 * TILE_BYTES, vs = ks + TILE_BYTES;
            for (int i = tid; i < T * CH; i += FMMA_THREADS) {
                const int p = i / CH, c = i % CH, pos = it * T + p;
                const size_t at = pos < len ? (size_t)pos * HD + 8 * c : 0;
                cp_async16_s(ks + fmma_off<HD>(p, c), kg + at, pos < len); /* zeros past the split */
                cp_async16_s(vs + fmma_off<HD>(p, c), vg + at, pos < len);
            }
        }
    };
    /* kv_q8: tile it's raw rows into the fp16 stage as exact integers (the scales go on the scores
     * and probabilities below) */
    auto to_f16 = [&](int it) {
        const unsigned char *raw = fmma_smem + RAW + (it % 2) * TILE_BYTES;
        for (int i = tid; i < T * CH; i += FMMA_THREADS) {
            const int p = i / CH, c = i % CH;
            *reinterpret_cast<uint4 *>(fmma_smem + fmma_off<HD>(p, c)) =
                kv_q8::convert8(*reinterpret_cast<const uint2 *>(raw + p * HD + 8 * c));
            *reinterpret_cast<uint4 *>(fmma_smem + TILE_BYTES + fmma_off<HD>(p, c)) =
                kv_q8::convert8(*reinterpret_cast<const uint2 *>(raw + TILE_BYTES / 2 + p * HD + 8 * c));
        }
    };
    load_tile(0);
    cp_async_commit();
    /* the block's queries, scaled by log2(e) / sqrt(HD), in fp16 (0 past its rows): the scores come
     * out in log2 units, so that each probability is one subtraction and one ex2 (FlashAttention's
     * way), the running max m too */
    const float scale = rsqrtf((float)HD) * 1.44269504088896341f;
    for (int i = tid; i < FLASH_ROWS * CH; i += FMMA_THREADS) {
        const int r = i / CH, c = i % CH;
        float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f), b = a;
        if (r < rows) {
            const float4 *qg = reinterpret_cast<const float4 *>(q + (size_t)token_of(row0 + r) * q_dim + head_of(row0 + r) * HD + 8 * c);
            a = __ldcg(qg), b = __ldcg(qg + 1);
        }
        *reinterpret_cast<uint4 *>(fmma_smem + q_at + fmma_off<HD>(r, c)) =
            make_uint4(h2_bits(a.x * scale, a.y * scale), h2_bits(a.z * scale, a.w * scale), h2_bits(b.x * scale, b.y * scale),
                       h2_bits(b.z * scale, b.w * scale));
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
        if constexpr (KV::Q8) {
            to_f16(it);
            __syncthreads();
        }
        if (!live) continue;
        const uint32_t ks = sbase + (KV::Q8 ? 0 : (it % 2) * 2 * TILE_BYTES), vs = ks + TILE_BYTES;
        float sc[NS][4];
#pragma unroll
        for (int j = 0; j < NS; j++) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            uint32_t a[4]; /* rows g, g + 8 at dims 16 kk + 2 cq.. and + 8.. */
            ldsm_x4(sbase + q_at + fmma_off<HD>(wr + lane % 8 + 8 * (lane / 8 % 2), 2 * kk + lane / 16), a[0], a[1], a[2], a[3]);
#pragma unroll
            for (int j = 0; j < NS; j += 2) { /* positions 8 j.. and 8 j + 8.. */
                uint32_t b0, b1, b2, b3;
                ldsm_x4(ks + fmma_off<HD>(8 * j + lane % 8 + 8 * (lane / 16), 2 * kk + lane / 8 % 2), b0, b1, b2, b3);
                mma_f16_16x8x16(sc[j], a[0], a[1], a[2], a[3], b0, b1);
                mma_f16_16x8x16(sc[j + 1], a[0], a[1], a[2], a[3], b2, b3);
            }
        }
        /* kv_q8: each position's column of sc (both rows) times that position's scale, `past` past the split */
        auto scale_columns = [&](const float *scales, float past) {
#pragma unroll
            for (int j = 0; j < NS; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int pos = it * T + 8 * j + 2 * cq + e;
                    const float d = pos < len ? __ldcg(scales + kv_at(start + pos, kvh, ctx, 1)) : past;
                    sc[j][e] *= d, sc[j][2 + e] *= d;
                }
        };
        /* sc[j][2 h + e]: row h's score at position it T + 8 j + 2 cq + e (q8: times its key's scale);
         * masked past what it sees, on the tiles that reach past it (at long contexts nearly every
         * tile is whole: the tests a score were the kernel's largest share of ALU work) */
        if constexpr (KV::Q8) scale_columns(cache.ks, 1.0f);
        const int tile_end = it * T + T;
        if (tile_end > len || tile_end > seen[0] + 1 || tile_end > seen[1] + 1) {
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int j = 0; j < NS; j++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int pos = it * T + 8 * j + 2 * cq + e;
                        if (pos > seen[h] || pos >= len) sc[j][2 * h + e] = -INFINITY;
                    }
        }
        float rescale[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < NS; j++) mx = fmaxf(mx, fmaxf(sc[j][2 * h], sc[j][2 * h + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, 2));
            const float m_new = fmaxf(m[h], mx);
            /* nothing seen yet: no shift, every probability 0 */
            const float shift = m_new == -INFINITY ? 0.0f : m_new;
            rescale[h] = m_new == -INFINITY ? 1.0f : ex2_approx(m[h] - m_new);
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < NS; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    sc[j][2 * h + e] = ex2_approx(sc[j][2 * h + e] - shift);
                    sum += sc[j][2 * h + e];
                }
            l[h] = l[h] * rescale[h] + sum;
            m[h] = m_new;
        }
        /* the outputs rescaled where a row's max grew (past the first tiles, seldom: a multiply by
         * 1 changes nothing, so the warp skips it when no lane's rescale differs from 1) */
        if (__any_sync(0xFFFFFFFFu, rescale[0] != 1.0f || rescale[1] != 1.0f)) {
#pragma unroll
            for (int t = 0; t < NO; t++) o[t][0] *= rescale[0], o[t][1] *= rescale[0], o[t][2] *= rescale[1], o[t][3] *= rescale[1];
        }
        if constexpr (KV::Q8) scale_columns(cache.vs, 0.0f); /* the probabilities, summed, weighed by the values' scales */
        /* O += P V, 16 positions a k-step */
#pragma unroll
        for (int kk = 0; kk < T / 16; kk++) {
            /* A: rows g, g + 8 at positions 16 kk + 2 cq.. and + 8.. */
            const uint32_t p[4] = {h2_bits(sc[2 * kk][0], sc[2 * kk][1]), h2_bits(sc[2 * kk][2], sc[2 * kk][3]),
                                   h2_bits(sc[2 * kk + 1][0], sc[2 * kk + 1][1]), h2_bits(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
            for (int t = 0; t < NO; t += 2) { /* dims 8 t.. and 8 t + 8.. */
                uint32_t b0, b1, b2, b3;
                ldsm_x4_trans(vs + fmma_off<HD>(16 * kk + lane % 8 + 8 * (lane / 8 % 2), t + lane / 16), b0, b1, b2, b3);
                mma_f16_16x8x16(o[t], p[0], p[1], p[2], p[3], b0, b1);
                mma_f16_16x8x16(o[t + 1], p[0], p[1], p[2], p[3], b2, b3);
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
                *reinterpret_cast<float2 *>(att + (size_t)t * q_dim + head * HD + d) = make_float2(o[j][2 * h] / l[h], o[j][2 * h + 1] / l[h]);
            else
                *reinterpret_cast<float2 *>(&part_acc[(size_t)t * parts * HD + ((size_t)head * n_splits + split) * HD + d]) =
                    make_float2(o[j][2 * h], o[j][2 * h + 1]);
        }
        if (n_active > 1 && cq == 0)
            *reinterpret_cast<float2 *>(&part_ml[(size_t)t * parts * 2 + ((size_t)head * n_splits + split) * 2]) = make_float2(m[h], l[h]);
    }
    if (n_active > 1)
        prefill_flash_combine<HD, FMMA_THREADS>(reinterpret_cast<float *>(fmma_smem), part_acc, part_ml, counters, att, kv_mul,
                                                q_dim, n_kv_heads, row0, rows, n_active, n_splits);
}


#endif /* INGOT_CUDA_PREFILL_ATTENTION_CUH */
