/* cuda_mlp_fused.cuh - the decode step's MLP as one kernel (MODEL_MLP_FUSED): RMSNorm, gate/up,
 * SiLU and down without a kernel boundary between gate/up and down, down read as its transpose in
 * bulk-copied tiles, the blocks' partial sums added into the residual stream in L2. */
#ifndef INGOT_CUDA_MLP_FUSED_CUH
#define INGOT_CUDA_MLP_FUSED_CUH

#include "cuda_matvec.cuh"

// ---------------------------------------------------------------------------------------------
// The MLP in one kernel (MODEL_MLP_FUSED, where the hidden size is 2048 or 4096 on sm_90; the default
// there): gate/up, SiLU and down without the boundary between gate/up and down, which costs the
// Llama-3.2-1B shape ~2.5 us a layer beyond down's bytes. One block of MLP_WARPS warps an SM takes a range of hidden
// units [u0, u1), in batches of MLP_UNITS(dim) (a unit to MLP_ROW_WARPS(dim) warps: rows of 8 chunks
// of 16 bytes a lane). For each batch:
// - each warp dots its part of its unit's gate and up rows with the staged, normed input (as the
//   decode gate/up does), then loads the next batch's rows at once, so that they are in flight under
//   this batch's down phase; the unit's warps' sums make silu(g) * u in shared memory;
// - the batch's rows of down's transpose (MLP_UNITS x dim, contiguous: the runtime keeps a copy of
//   down_proj transposed) land in shared memory on the bulk-copy engine, MLP_SLOTS batches ahead,
//   counted on the slot's mbarrier (the first before the wait, the rest after it);
// - past a block barrier each warp multiplies its dim / MLP_WARPS output columns (4 or 8 a lane) by
//   the batch's hidden values.
// The block ends with a partial sum of every output, added into `out` in L2 (red.global.add.v4.f32;
// block 0 adds the residual x too): out must be zero before, so each layer's kernel zeroes the
// buffer the next layer adds into (`zero`, the last layer's input, dead past this kernel's wait).
// The reductions' order is not fixed: a build with MODEL_MLP_FUSED is not reproducible to the last bit
// from run to run (the fp32 rounding of 132 partial sums an output). Measured alone
// (tests/bench/fused_mlp.cu; docs/performance.md, D64): 16 chained 1B-shaped MLPs in
// 24.2 us a layer against 26.6 for the two kernels, the reductions 0.3 of it; clusters summing their
// blocks' partials in distributed shared memory first held fewer SMs and lost, fixed-point
// reductions (reproducible) cost 5 us more (four times the atomic operations). In the 1B's step,
// without the bulk-copied input and the uniform carveout, it lost 0.3-0.7% at depth 0 (+0.3-1.0% at
// 4096): traced, the MLP itself ends 1.8 us a layer sooner than gate/up and down, but its one block
// an SM (55K registers, 136 KB) lands only once o_proj's blocks have left, and QKV's blocks only once
// it has, its wait 0.5 us later (the reductions). With them: +0.2% at 0, +1.9% at 4096 (D64, D65).

#define MLP_WARPS 16
#define MLP_THREADS (MLP_WARPS * WARP_SIZE)
#define MLP_SLOTS 2       /* down's tiles in flight (3 lost 1.3 us a layer alone) */
#define MLP_EARLY_TILES 1 /* of them, issued before the wait (2: -0.7 us a layer alone; 0, all after x's copy: -0.2% on the 1B) */
#define MLP_EARLY_ROWS 1 /* 1: the first batch's gate and up rows loaded before the wait; 0: once the input is staged */
/* The input x lands in shared memory by one bulk copy after the wait, not by the threads' loads,
 * which queue behind the block's 192 KB of first weight loads when the block lands at its
 * producer's end (traced: staged median 6.5 us after o_proj's end); on the 1B +0.6%. The matvecs'
 * bulk input, the same for every stage, lost 11%: their blocks land before their producer ends. */
/* The warps that take a hidden unit's gate and up rows (8 chunks of 16 bytes a lane of each), and
 * the hidden units of a batch: 1 and 16 at a hidden size of 2048, 2 and 8 at 4096 */
#define MLP_ROW_WARPS(dim) ((dim) / 2048)
#define MLP_UNITS(dim) (MLP_WARPS / MLP_ROW_WARPS(dim))
/* Dynamic shared memory of mlp_fused_body: the tiles of down's transpose (64 KB each), then the
 * staged input and the copy of x it is made from */
#define MLP_SMEM_BYTES(dim) ((size_t)MLP_SLOTS * MLP_UNITS(dim) * (dim) * sizeof(uint16_t) + (size_t)(dim) * sizeof(float) * 2)

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
/* 4 weights of the dense 16-bit format W (a uint2) to fp32 */
template <typename W>
__device__ __forceinline__ void w4_to_f32(uint2 u, float f[4]) {
    if constexpr (W::BF16) {
        f[0] = __uint_as_float(u.x << 16), f[1] = __uint_as_float(u.x & 0xFFFF0000u);
        f[2] = __uint_as_float(u.y << 16), f[3] = __uint_as_float(u.y & 0xFFFF0000u);
    } else {
        const float2 a = __half22float2(*reinterpret_cast<const __half2 *>(&u.x)), b = __half22float2(*reinterpret_cast<const __half2 *>(&u.y));
        f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y;
    }
}

/* W: a dense 16-bit format (down's transpose goes through shared memory as its values; the norm
 * weights, in the model's 16-bit dtype, are read as one of its chunks). */
template <typename W, int DIM, int HIDDEN, typename Wait>
__device__ __forceinline__ void mlp_fused_body(const uint16_t *norm_w, typename W::mat wg, typename W::mat wu, typename W::mat down_t,
                                               const float *x, float *out, float *zero, float eps, Wait wait) {
    static_assert(W::DENSE16, "mlp_fused_body: dense 16-bit weights");
    /* RW warps a unit, each LCH chunks a lane of its rows (its part of them: RCH chunks); NB units a
     * batch; CPL output columns a lane */
    constexpr int DCH = DIM / 8, RW = MLP_ROW_WARPS(DIM), NB = MLP_UNITS(DIM), RCH = DCH / RW, LCH = RCH / WARP_SIZE,
                  CPL = DIM / MLP_WARPS / WARP_SIZE;
    static_assert((DIM == 2048 || DIM == 4096) && LCH == 8 && (CPL == 4 || CPL == 8) && DCH <= MLP_THREADS,
                  "mlp_fused_body: a hidden size of 2048 or 4096 (8 chunks a lane a row part, 4 or 8 columns a lane)");
    static_assert(MLP_EARLY_TILES >= 0 && MLP_EARLY_TILES <= MLP_SLOTS, "MLP_EARLY_TILES: 0 .. MLP_SLOTS");
    extern __shared__ __align__(16) float smem[];
    uint16_t *tiles = reinterpret_cast<uint16_t *>(smem);      /* (MLP_SLOTS, NB, DIM) */
    float4 *sx4 = reinterpret_cast<float4 *>(smem + MLP_SLOTS * NB * DIM / 2); /* the input, in halves as stage_input's */
    __shared__ float partial[MLP_WARPS], hs[NB], g_part[RW > 1 ? MLP_WARPS : 1], u_part[RW > 1 ? MLP_WARPS : 1];
    __shared__ __align__(8) uint64_t bars[MLP_SLOTS + 1]; /* the tiles' slots, then x's copy */
    const float4 *x_raw = reinterpret_cast<const float4 *>(sx4 + 2 * DCH);  /* x as it is */
    const int tid = threadIdx.x, lane = tid % WARP_SIZE, w = tid / WARP_SIZE, G = gridDim.x, b = blockIdx.x;
    const int unit = w / RW, part = w % RW; /* this warp's unit of a batch, and its part of the unit's rows */
    const int u0 = (int)((long long)b * HIDDEN / G), n = (int)((long long)(b + 1) * HIDDEN / G) - u0, nb = (n + NB - 1) / NB;
    const uint32_t bar0 = (uint32_t)__cvta_generic_to_shared(bars), tiles0 = (uint32_t)__cvta_generic_to_shared(tiles);
    auto rows_of = [&](int k) { return min(NB, n - k * NB); };
    auto issue_tile = [&](int k) {
        bulk_copy_shared(tiles0 + (uint32_t)((k % MLP_SLOTS) * NB * DIM * sizeof(uint16_t)), down_t + (size_t)(u0 + k * NB) * DIM,
                         (uint32_t)(rows_of(k) * DIM * sizeof(uint16_t)), bar0 + 8 * (k % MLP_SLOTS));
    };
    auto load_row = [&](uint4 r[LCH], typename W::row_t row) {
#pragma unroll
        for (int j = 0; j < LCH; j++) r[j] = W::load(row, part * RCH + j * WARP_SIZE + lane);
    };
    TRACE_BEGIN(ST_MLP);
    /* the norm weights first, into registers: a load that waits behind the block's weight loads
     * held every block's staging ~5 us (traced; docs/performance.md, D64) */
    const uint4 nw = tid < DCH ? __ldg(reinterpret_cast<const uint4 *>(norm_w) + tid) : make_uint4(0, 0, 0, 0);
    if (tid == 0) {
        for (int i = 0; i < MLP_SLOTS + 1; i++) mbar_init(bar0 + 8 * i, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); /* the inits, seen by the async proxy */
        for (int k = 0; k < MLP_EARLY_TILES && k < nb; k++) issue_tile(k);
    }
    uint4 ga[LCH], ua[LCH]; /* this warp's gate and up rows of the batch */
    auto load_first_rows = [&] {
        if (unit < rows_of(0)) {
            load_row(ga, W::row(wg, u0 + unit, DIM));
            load_row(ua, W::row(wu, u0 + unit, DIM));
        }
    };
    if (MLP_EARLY_ROWS) load_first_rows();
    TRACE_AT(TRACE_READY);
    wait();
    TRACE_AT(TRACE_WAITED);
    if (tid == 0) {
        asm volatile("fence.proxy.async.global;" ::: "memory"); /* the producer's x, for the async proxy */
        bulk_copy_shared((uint32_t)__cvta_generic_to_shared(x_raw), x, DIM * sizeof(float), bar0 + 8 * MLP_SLOTS);
        for (int k = MLP_EARLY_TILES; k < MLP_SLOTS && k < nb; k++) issue_tile(k);
    }
    for (int i = b * MLP_THREADS + tid; i < DIM; i += G * MLP_THREADS) zero[i] = 0.0f;
    float ss = 0.0f;
    __syncthreads(); /* the mbarriers' inits, seen by every thread before its wait */
    mbar_wait(bar0 + 8 * MLP_SLOTS, 0);
    if (tid < DCH) { /* x * norm, and x's sum of squares */
        const float4 p = x_raw[2 * tid], q = x_raw[2 * tid + 1];
        float f[8];
        W::to_f32(nw, f);
        ss = p.x * p.x + p.y * p.y + p.z * p.z + p.w * p.w + q.x * q.x + q.y * q.y + q.z * q.z + q.w * q.w;
        sx4[tid] = make_float4(p.x * f[0], p.y * f[1], p.z * f[2], p.w * f[3]);
        sx4[DCH + tid] = make_float4(q.x * f[4], q.y * f[5], q.z * f[6], q.w * f[7]);
    }
    if (!MLP_EARLY_ROWS) load_first_rows();
    ss = warp_sum(ss);
    if (lane == 0) partial[w] = ss;
    __syncthreads(); /* the input staged; also the mbarriers' inits seen by every thread */
    ss = 0.0f;
#pragma unroll
    for (int i = 0; i < MLP_WARPS; i++) ss += partial[i];
    const float scale = rsqrtf(ss / (float)DIM + eps);
    TRACE_AT(TRACE_STAGED);
    const int col = w * (DIM / MLP_WARPS) + lane * CPL;
    float acc[CPL] = {};
    for (int k = 0; k < nb; k++) {
        const int rows = rows_of(k);
        float hv = 0.0f; /* RW 1: the unit's hidden value */
        if (unit < rows) {
            float sg = 0.0f, su = 0.0f;
#pragma unroll
            for (int j = 0; j < LCH; j++) { /* each staged float4 read once for both rows */
                const int c = part * RCH + j * WARP_SIZE + lane;
                const float4 p = sx4[c], q = sx4[DCH + c];
                float fg[8], fu[8];
                W::to_f32(ga[j], fg);
                W::to_f32(ua[j], fu);
                sg += fg[0] * p.x + fg[1] * p.y + fg[2] * p.z + fg[3] * p.w + fg[4] * q.x + fg[5] * q.y + fg[6] * q.z + fg[7] * q.w;
                su += fu[0] * p.x + fu[1] * p.y + fu[2] * p.z + fu[3] * p.w + fu[4] * q.x + fu[5] * q.y + fu[6] * q.z + fu[7] * q.w;
            }
            if (RW == 1) {
                hv = silu(warp_sum(sg) * scale) * (warp_sum(su) * scale);
            } else { /* this warp's part of the unit's sums */
                sg = warp_sum(sg), su = warp_sum(su);
                if (lane == 0) g_part[w] = sg, u_part[w] = su;
            }
        }
        if (k + 1 < nb && unit < rows_of(k + 1)) { /* the next batch's rows, in flight under this one's down phase */
            load_row(ga, W::row(wg, u0 + (k + 1) * NB + unit, DIM));
            load_row(ua, W::row(wu, u0 + (k + 1) * NB + unit, DIM));
        }
        if (RW == 1) {
            if (lane == 0) hs[w] = hv;
        } else if (unit < rows) { /* the unit's warps' parts: named barrier 1 + unit, the unit's warps only */
            asm volatile("bar.sync %0, %1;" ::"r"(1 + unit), "r"(RW * WARP_SIZE) : "memory");
            if (part == 0 && lane == 0) {
                float sg = 0.0f, su = 0.0f;
#pragma unroll
                for (int p = 0; p < RW; p++) sg += g_part[unit * RW + p], su += u_part[unit * RW + p];
                hs[unit] = silu(sg * scale) * (su * scale);
            }
        }
        __syncthreads(); /* the batch's hidden values */
        mbar_wait(bar0 + 8 * (k % MLP_SLOTS), (uint32_t)(k / MLP_SLOTS) & 1u);
        const uint16_t *t = tiles + (size_t)(k % MLP_SLOTS) * NB * DIM + col;
#pragma unroll 4
        for (int r = 0; r < rows; r++) {
            float f[CPL];
            if constexpr (CPL == 4)
                w4_to_f32<W>(*reinterpret_cast<const uint2 *>(t + (size_t)r * DIM), f);
            else
                W::to_f32(*reinterpret_cast<const uint4 *>(t + (size_t)r * DIM), f);
            const float h = hs[r];
#pragma unroll
            for (int e = 0; e < CPL; e++) acc[e] += h * f[e];
        }
        __syncthreads(); /* the slot and hs are free */
        if (tid == 0 && k + MLP_SLOTS < nb) {
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); /* the slot's reads before the copy's writes */
            issue_tile(k + MLP_SLOTS);
        }
    }
#pragma unroll
    for (int e = 0; e < CPL; e += 4) {
        float4 v = make_float4(acc[e], acc[e + 1], acc[e + 2], acc[e + 3]);
        if (b == 0) { /* the residual, once */
            const float4 r = __ldcg(reinterpret_cast<const float4 *>(x + col + e));
            v.x += r.x, v.y += r.y, v.z += r.z, v.w += r.w;
        }
        asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(out + col + e), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
                     : "memory");
    }
    TRACE_END();
}
#endif

#endif /* INGOT_CUDA_MLP_FUSED_CUH */
