/* forward_cuda.cu - the CUDA decode step and prompt path of one model: its kernels with exact grids,
 * the weights' upload, the step's CUDA graphs and the prefill's enqueue.
 *
 * Hand-written and compiled once per model against two generated headers: model_config.h (every
 * dimension a MODEL_* constant, or in a generic build a value read at run time) and model_plan.h
 * (every launch decision the plan took, codegen/plan.py). Nothing here is generated; a decision
 * that depends on the model is a MODEL_* name from the plan, never a default defined here.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>

#include <cuda_runtime.h>
#include <cudaTypedefs.h> /* PFN_cuTensorMapEncodeTiled (GEMM_TMA) */

#include "model.h"
#include "model_plan.h"
#include "cuda_matvec.cuh"
#include "cuda_mlp_fused.cuh"
#include "cuda_attention.cuh"
#include "cuda_attention_short.cuh"
#include "cuda_prefill.cuh"
#include "cuda_sampler.cuh"

#if !defined(MODEL_WEIGHT_DTYPE_F32)
/* The matvecs' grids (MODEL_GRID_*, model_plan.h) are the blocks each needs; model_cuda_init caps
 * them at one wave. */
/* The step's counters (model_cuda.counters): attention's last-block count per KV head, the LM head's,
 * and attention_o_proj_kernel's KV groups done. */
#define CTR_ARGMAX MODEL_N_KV_HEADS
#define CTR_ATT_DONE (MODEL_N_KV_HEADS + 1)
#define CTR_ARRIVED (MODEL_N_KV_HEADS + 2) /* attention_o_proj_kernel's blocks started */
#define CTR_COUNT (MODEL_N_KV_HEADS + 3)
#if MODEL_RESIDUAL_PAIRS
static_assert(MODEL_DIM % 2 == 0, "MODEL_RESIDUAL_PAIRS: a warp pairs rows p and p + MODEL_DIM / 2");
#endif

#define CUDA_CHECK(call)                                                                               \
    do {                                                                                               \
        cudaError_t e_ = (call);                                                                       \
        if (e_ != cudaSuccess) {                                                                       \
            fprintf(stderr, "ingot: CUDA error: %s at %s:%d (%s)\n", cudaGetErrorString(e_), __FILE__, \
                    __LINE__, #call);                                                                  \
            exit(1);                                                                                   \
        }                                                                                              \
    } while (0)

static __constant__ float rope_inv_freq[MODEL_MAX_HEAD_DIM / 2];

// ---------------------------------------------------------------------------------------------
// The matrices' formats: each field's (model_config.h's MODEL_FORMAT_*) as the cores take it
// (cuda_weights.cuh's format_w). q, k and v share one kernel, as do gate and up: one format there,
// or several K formats (w_kany), which a field's layers may mix too (group_w); model_cuda_init
// refuses other mixes and formats with no kernels here (formats_refused). The generic
// build reads dense matrices only (it refuses quantized ones). The prompt path's GEMMs take dense
// 16-bit matrices (w_prompt below).
#if MODEL_GENERIC
#define CUDA_QUANTIZED 0
using w_embed = model_w;
using w_qkv = model_w;
using w_o = model_w;
using w_gate_up = model_w;
using w_down = model_w;
using w_lm = model_w;
#else
#define CUDA_QUANTIZED MODEL_QUANTIZED
/* A kernel reading matrices of several formats (q, k and v; gate and up; a field whose layers differ,
 * QUANT_MIXED) takes w_kany, the K formats chosen per matrix; formats_refused refuses other mixes. */
template <int A, int B = A, int C = A>
using group_w = std::conditional_t<A == B && B == C && A != QUANT_MIXED, format_w<A>, w_kany>;
using w_embed = format_w<MODEL_FORMAT_EMBED>;
using w_qkv = group_w<MODEL_FORMAT_WQ, MODEL_FORMAT_WK, MODEL_FORMAT_WV>;
using w_o = group_w<MODEL_FORMAT_WO>;
using w_gate_up = group_w<MODEL_FORMAT_W_GATE, MODEL_FORMAT_W_UP>;
using w_down = group_w<MODEL_FORMAT_W_DOWN>;
using w_lm = format_w<MODEL_FORMAT_LM_HEAD>;
#endif
/* The prompt's GEMMs read dense 16-bit matrices. A quantized model's layer is dequantized into fp16
 * (prompt_dequant_kernel, m->prompt_w) before its GEMMs in each prompt batch: one more write and
 * read of the layer in 16 bits a batch, against reading it a token at a time. fp16 rather than the
 * model's bf16, so that a weight d * q keeps 11 significant bits: bf16's 8 would put a relative error
 * of 2^-9 on each weight, near the GPU/CPU tolerance (tests/test_gpu.py); the GEMMs' input terms are
 * fp16 then too. */
#if CUDA_QUANTIZED
using w_prompt = w_f16;
#else
using w_prompt = model_w;
#endif
#if CUDA_QUANTIZED && MODEL_MLP_FUSED
#error "MODEL_MLP_FUSED: dense matrices only (codegen/plan.py turns it off for quantized models)"
#endif

/* The decode step's weights on the device, each matrix in its format (the generated model_weights
 * holds the same pointers untyped; the prompt path's kernels, dense only, take that). */
struct cuda_layer {
    const uint16_t *attn_norm, *bq, *bk, *bv, *bo, *ffn_norm; /* vectors: the model's dtype */
    w_qkv::mat wq, wk, wv;
    w_o::mat wo;
    w_gate_up::mat w_gate, w_up;
    w_down::mat w_down;
};
struct cuda_weights {
    w_embed::mat embed;
    cuda_layer layers[MODEL_MAX_LAYERS];
    const uint16_t *final_norm;
    w_lm::mat lm_head;
};

// ---------------------------------------------------------------------------------------------
// The kernels: each stage body with this model's constants and its weight format (model_w,
// cuda_weights.cuh). Everything here is static: a generic build links one copy of this file per
// weight dtype.

/* zero: the buffer the first layer's fused MLP adds into (MODEL_MLP_FUSED), or NULL */
static __global__ void __launch_bounds__(256) embed_kernel(w_embed::mat embed, const int *io, float *x, const int *history, float *zero) {
    embed_body<w_embed>(embed, io, x, history, MODEL_DIM, MODEL_VOCAB_SIZE, wait_pdl{});
    if (zero)
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < MODEL_DIM; i += gridDim.x * blockDim.x) zero[i] = 0.0f;
}

/* MODEL_DOWN_POLL: down waits for gate/up's outputs themselves instead of gate/up's grid's end:
 * gate/up writes them into hb_poll, whose words read ATT_POLL_WORD until written, down's blocks
 * stage them polling (stage_input<true>), and the next layer's QKV kernel, past its wait (down has
 * ended), puts the words back. Gate/up and down joined in one grid lost (-0.3% to -1.4% on the 1B,
 * H200): its last blocks end as late, those whose gate/up rows ended last.
 *
 * MODEL_MLP_FUSED: the decode step's MLP in one kernel (mlp_fused_body) instead of gate/up and down.
 * Its reductions' order is not fixed: its decode is not reproducible to the last bit
 * (tests/bench/repeat_runs.py); the split build is. */
#if MODEL_MLP_FUSED && defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "MODEL_MLP_FUSED: sm_90 (bulk copies onto mbarriers)"
#endif

/* model.layers.{l}.input_layernorm, self_attn.{q,k,v}_proj, RoPE, KV-cache store (kv_q8: its stage,
 * for kv_quantize_kernel) */
template <typename KV>
static __global__ void __launch_bounds__(MV_THREADS, 2) rmsnorm_qkv_rope_kernel(cuda_layer w, const float *x, float *q,
                                                                     kv_view<KV> cache, const int *io, int ctx,
                                                                     float *hb_poll) {
    rmsnorm_qkv_rope_body<w_qkv>(w.attn_norm, w.wq, w.wk, w.wv,
                          MODEL_QKV_BIAS ? w.bq : NULL, MODEL_QKV_BIAS ? w.bk : NULL, MODEL_QKV_BIAS ? w.bv : NULL,
                          x, q, cache, io, rope_inv_freq, MODEL_DIM, MODEL_Q_DIM, MODEL_KV_DIM, MODEL_HEAD_DIM, ctx,
                          MODEL_NORM_EPS, wait_pdl{});
    /* past the wait: the last layer's down has ended, and this layer's gate/up writes after its own */
    if (MODEL_DOWN_POLL && !MODEL_MLP_FUSED) unwrite_words(hb_poll, MODEL_HIDDEN_DIM);
}

/* kv_q8: the keys and values QKV staged, of one token (a decode step) or of the batch's, into the
 * cache (kv_quantize_body), between QKV and attention; warps of (token, kind, KV head) */
#define KV_QUANTIZE_THREADS 256
static __global__ void __launch_bounds__(KV_QUANTIZE_THREADS) kv_quantize_kernel(kv_view<kv_q8> cache, const int *io, int ctx,
                                                                                 int batch) {
    pdl_launch_dependents();
    pdl_wait();
    kv_quantize_body(cache, io, batch != 0, MODEL_N_KV_HEADS, MODEL_HEAD_DIM, ctx);
}
/* its blocks for tokens */
static int kv_quantize_blocks(int tokens) {
    return (tokens * 2 * MODEL_N_KV_HEADS + KV_QUANTIZE_THREADS / WARP_SIZE - 1) / (KV_QUANTIZE_THREADS / WARP_SIZE);
}

/* MODEL_ATT_O_SHORT: the short context's steps with attention and o_proj in one grid, so that o_proj
 * is QKV's dependent and launches with attention instead of after it; with MODEL_ATT_O_POLL its
 * blocks wait for attention's outputs themselves (wait_poll, stage_input<true>): attention writes
 * them into att_poll, whose words read ATT_POLL_WORD until written and which the gate/up kernel
 * puts back after o_proj. */
static_assert(!MODEL_ATT_O_SHORT || MODEL_ATT_SHORT, "MODEL_ATT_O_SHORT: the short context's kernel (MODEL_ATT_SHORT)");

/* MODEL_ATT_TRIGGER_EARLY=K: the decode attention lets the next kernel (o_proj) launch as its blocks
 * start, before their wait, so that o_proj's blocks land and issue their first rows under attention
 * (o_proj still waits for attention's grid to end: griddepcontrol.wait); 1: attention_short_kernel,
 * 2: attention_kernel, 3: both, 0: after their wait. */
/* MODEL_O_PROJ_TRIGGER_SHORTEST: in the one-split graphs (the steps of at most 256 positions) o_proj
 * lets the fused MLP, whose block an SM lands only as o_proj's blocks leave, launch once its blocks
 * have issued their early loads, before their wait. The same in every step lost at depth: the
 * MLP's first loads then go out beside attention's (docs/performance.md). */
/* split-K attention over the cache, one block per (KV head, split); MMA_HD: the tensor cores' head
 * width (MODEL_ATT_MMA_HD: 64 or 128), 0 for the fp32 path */
template <int MMA_HD, typename KV>
static __global__ void __launch_bounds__(MODEL_ATT_THREADS) attention_kernel(const float *q, kv_view<KV> cache,
                                                                const int *io, float *part_acc, float *part_ml,
                                                                unsigned *counters, float *att, int ctx, int n_splits) {
    if (MODEL_ATT_TRIGGER_EARLY & 2) pdl_launch_dependents();
    attention_body<1, KV, wait_pdl, MMA_HD>(q, cache, io, 0, part_acc, part_ml, counters, att, MODEL_HEAD_DIM, MODEL_KV_MUL, ctx,
                      n_splits, MODEL_ATT_MIN_SPLITS, blockIdx.x, blockIdx.y, NULL, wait_pdl{});
}

/* The decode attention's plan decisions are literals in a specialized build and run-time values in
 * the generic one (model_plan.h: the same rules over the dimensions it reads), which compiles the
 * kernels for every head width the tensor cores take and picks the model's at start: the same
 * algorithm as a specialized build of that model. ATT_SHORT_BUILT: the short context's kernel is
 * compiled (a specialized build's MODEL_ATT_SHORT; always in the generic build). */
#if MODEL_GENERIC
#define ATT_SHORT_BUILT 1
#else
#define ATT_SHORT_BUILT MODEL_ATT_SHORT
#if MODEL_ATT_SHORT && !MODEL_ATT_MMA_HD
#error "MODEL_ATT_SHORT: the decode attention on the tensor cores (MODEL_ATT_MMA_HD)"
#endif
#endif

template <typename KV>
using attention_kernel_fn = void (*)(const float *, kv_view<KV>, const int *, float *, float *, unsigned *, float *, int, int);

/* the model's attention_kernel */
template <typename KV>
static attention_kernel_fn<KV> decode_attention_kernel(void) {
#if MODEL_GENERIC
    return MODEL_ATT_MMA_HD == 64 ? attention_kernel<64, KV> : MODEL_ATT_MMA_HD == 128 ? attention_kernel<128, KV> : attention_kernel<0, KV>;
#else
    return attention_kernel<MODEL_ATT_MMA_HD, KV>;
#endif
}

#if ATT_SHORT_BUILT
/* the decode attention of a short context, one block a (KV head, split) of at most
 * att_short_max(MODEL_HEAD_DIM) positions (attention_short_body): the steps that read at most
 * short_kernel_positions launch it, in the [2] graphs */
template <int MMA_HD, typename KV>
static __global__ void __launch_bounds__(MODEL_ATT_THREADS) attention_short_kernel(const float *q, kv_view<KV> cache,
                                                                        const int *io, float *part_acc, float *part_ml,
                                                                        unsigned *counters, float *att, int ctx, int n_splits) {
    if (MODEL_ATT_TRIGGER_EARLY & 1) pdl_launch_dependents();
    attention_short_body<MMA_HD>(q, cache, io, part_acc, part_ml, counters, att, MODEL_KV_MUL, ctx, n_splits, MODEL_ATT_MIN_SPLITS,
                                 blockIdx.x, blockIdx.y, wait_pdl{});
}

/* the model's attention_short_kernel (where MODEL_ATT_SHORT) */
template <typename KV>
static attention_kernel_fn<KV> short_attention_kernel(void) {
#if MODEL_GENERIC
    return MODEL_ATT_MMA_HD == 128 ? attention_short_kernel<128, KV> : attention_short_kernel<64, KV>;
#else
    return attention_short_kernel<MODEL_ATT_MMA_HD, KV>;
#endif
}
#endif

/* self_attn.o_proj (+ bias) + residual; registers for MODEL_O_PROJ_MIN_BLOCKS blocks an SM */
/* SHORTEST: the one-split graphs' launch, which lets the next kernel launch before its wait where
 * MODEL_O_PROJ_TRIGGER_SHORTEST says so */
template <bool SHORTEST>
static __global__ void __launch_bounds__(MV_THREADS, MODEL_O_PROJ_MIN_BLOCKS) o_proj_residual_kernel(cuda_layer w, const float *att, float *x) {
    if constexpr (SHORTEST && MODEL_O_PROJ_TRIGGER_SHORTEST)
        matvec_residual_body<w_o>(w.wo, MODEL_O_BIAS ? w.bo : NULL, att, x, MODEL_DIM, MODEL_Q_DIM, MODEL_RESIDUAL_PAIRS, ST_O,
                             trigger_then_wait_pdl{});
    else
        matvec_residual_body<w_o>(w.wo, MODEL_O_BIAS ? w.bo : NULL, att, x, MODEL_DIM, MODEL_Q_DIM, MODEL_RESIDUAL_PAIRS, ST_O, wait_pdl{});
}


#if MODEL_ATT_O_SHORT
static_assert(MODEL_ATT_THREADS == MV_THREADS, "attention_o_proj_kernel: one block size for both stages");
static_assert(MODEL_ATT_SHORT, "MODEL_ATT_O_SHORT: the short context's attention (MODEL_ATT_SHORT)");

/* A short context's attention and o_proj in one grid, each block one of them, by the order blocks
 * arrive (an atomic count; the last to arrive puts it back to 0 for the next layer): the first
 * n_kv_heads * n_splits are attention_short_kernel's (kv head, split); the rest take o_proj's rows,
 * whose first loads they issue before waiting for the n_kv_heads KV groups' outputs (with
 * MODEL_ATT_O_POLL the outputs themselves, else their count in counters[CTR_ATT_DONE], which the
 * gate/up kernel resets). So o_proj's blocks land with attention's, under QKV's tail, instead of
 * after attention lets them launch (~2 us a layer, traced). Roles by arrival, not by block index,
 * because CUDA promises no dispatch order: every attention role is held by a block already running,
 * so a waiting o_proj block never waits on one without a slot. */
template <typename KV>
static __global__ void __launch_bounds__(MV_THREADS, 2)
    attention_o_proj_kernel(cuda_layer w, const float *q, kv_view<KV> cache, const int *io,
                            float *part_acc, float *part_ml, unsigned *counters, float *att, float *x, int ctx, int n_splits) {
    const int att_blocks = MODEL_N_KV_HEADS * n_splits;
    __shared__ int arrived;
    if (threadIdx.x == 0) {
        arrived = (int)atomicAdd(counters + CTR_ARRIVED, 1u);
        if (arrived == (int)gridDim.x - 1) counters[CTR_ARRIVED] = 0;
    }
    __syncthreads();
    const int b = arrived;
    if (b < att_blocks) {
        attention_short_body<MODEL_ATT_MMA_HD>(q, cache, io, part_acc, part_ml, counters, att, MODEL_KV_MUL, ctx, n_splits,
                                               MODEL_ATT_MIN_SPLITS, b % MODEL_N_KV_HEADS, b / MODEL_N_KV_HEADS, wait_pdl{},
                                               counters + CTR_ATT_DONE);
        return;
    }
    const unsigned *go = res_pace<w_o> ? counters + CTR_ATT_DONE : NULL;
    if constexpr (MODEL_ATT_O_POLL) /* att is att_poll: o_proj polls the outputs themselves */
        matvec_residual_body<w_o>(w.wo, MODEL_O_BIAS ? w.bo : NULL, att, x, MODEL_DIM, MODEL_Q_DIM, MODEL_RESIDUAL_PAIRS, ST_O,
                             wait_poll{att, MODEL_N_KV_HEADS, MODEL_Q_DIM}, b - att_blocks,
                             (int)gridDim.x - att_blocks, go, (unsigned)MODEL_N_KV_HEADS);
    else
        matvec_residual_body<w_o>(w.wo, MODEL_O_BIAS ? w.bo : NULL, att, x, MODEL_DIM, MODEL_Q_DIM, MODEL_RESIDUAL_PAIRS, ST_O,
                             wait_count{counters + CTR_ATT_DONE, (unsigned)MODEL_N_KV_HEADS}, b - att_blocks,
                             (int)gridDim.x - att_blocks, go, (unsigned)MODEL_N_KV_HEADS);
}
#endif

/* post_attention_layernorm, mlp.gate_proj and mlp.up_proj, SiLU */
/* Past gate/up's wait, attention_o_proj_kernel has ended: nobody reads its counts until the next
 * layer's, nor att_poll, whose words read "unwritten" again for the next layer's (MODEL_ATT_O_POLL). */
__device__ __forceinline__ void reset_att_signals(unsigned *att_done, float *att_poll) {
    if (blockIdx.x == 0 && threadIdx.x == 0) att_done[0] = 0;
    if (MODEL_ATT_O_POLL && MODEL_ATT_O_SHORT && blockIdx.x == gridDim.x - 1)
        for (int i = threadIdx.x; i < MODEL_Q_DIM; i += blockDim.x) att_poll[i] = __uint_as_float(ATT_POLL_WORD);
}

static __global__ void __launch_bounds__(MV_THREADS, 2) rmsnorm_gate_up_silu_kernel(cuda_layer w, const float *x, float *hb,
                                                                                  unsigned *att_done, float *att_poll) {
    rmsnorm_gate_up_silu_body<w_gate_up>(w.ffn_norm, w.w_gate, w.w_up, x, hb, MODEL_DIM, MODEL_HIDDEN_DIM, MODEL_NORM_EPS, wait_pdl{});
    reset_att_signals(att_done, att_poll);
}


/* mlp.down_proj + residual */
static __global__ void __launch_bounds__(MV_THREADS, 2) down_residual_kernel(cuda_layer w, const float *hb, float *x) {
    if constexpr (MODEL_DOWN_POLL != 0) { /* hb is hb_poll */
        matvec_residual_body<w_down>(w.w_down, NULL, hb, x, MODEL_DIM, MODEL_HIDDEN_DIM, MODEL_RESIDUAL_PAIRS, ST_DOWN,
                             wait_poll{hb, 0, MODEL_HIDDEN_DIM});
        pdl_wait(); /* gate/up's grid ends before this one does */
    } else {
        matvec_residual_body<w_down>(w.w_down, NULL, hb, x, MODEL_DIM, MODEL_HIDDEN_DIM, MODEL_RESIDUAL_PAIRS, ST_DOWN, wait_pdl{});
    }
}

#if MODEL_MLP_FUSED
/* post_attention_layernorm, mlp.gate_proj, mlp.up_proj, SiLU, mlp.down_proj + residual: x's next
 * value added into out (zero before), and zero zeroed for the next layer's. At most 96 registers a
 * thread, so that a block fits beside one of o_proj's, lost 0.4% on the 1B (docs/performance.md). */
static __global__ void __launch_bounds__(MLP_THREADS, 1) mlp_fused_kernel(cuda_layer w, const uint16_t *down_t, const float *x,
                                                                        float *out, float *zero, unsigned *att_done, float *att_poll) {
    mlp_fused_body<model_w, MODEL_DIM, MODEL_HIDDEN_DIM>(w.ffn_norm, w.w_gate, w.w_up, down_t, x, out, zero, MODEL_NORM_EPS, wait_pdl{});
    reset_att_signals(att_done, att_poll);
}

#include "cuda_transpose.cuh" /* transpose_words_kernel: down_proj's transpose, made once at load */
#endif

/* model.norm, the LM head and the greedy choice */
static __global__ void __launch_bounds__(MV_THREADS) rmsnorm_lm_head_argmax_kernel(const uint16_t *norm_w, w_lm::mat w,
                                                                           const float *x, float *logits,
                                                                           float2 *block_best, unsigned *counter, int *io) {
    rmsnorm_lm_head_argmax_body<w_lm>(norm_w, w, x, logits, block_best, counter, io, MODEL_DIM, MODEL_VOCAB_SIZE,
                                MODEL_NORM_EPS, wait_pdl{});
}

/* the chosen token to the host and to the next step's input; the position advanced */
static __global__ void __launch_bounds__(WARP_SIZE) step_end_kernel(int *io, int *history, int *chosen, int ctx, int emit) {
    step_end_body(io, history, chosen, ctx, emit, wait_pdl{});
}

/* the next token from the logits, with the sampler's settings (cuda_sampler.cuh) */
static __global__ void __launch_bounds__(SAMPLE_THREADS) sample_kernel(float *logits, const int *history, int *first_seen, int *io,
                                                                const sample_params *params, unsigned long long *rng) {
    sample_body(logits, MODEL_VOCAB_SIZE, history, first_seen, io, params, rng);
}

// ---------------------------------------------------------------------------------------------
// Prefill: a batch of B prompt tokens (PREFILL_BATCH, halved down to 8) through each stage at once
// (cuda_prefill.cuh), a kernel per stage as in the step. Each RMSNorm is a kernel of its own: it
// adds o_proj's or down's split partial sums to the residual stream and writes the norm's output as
// the bf16/fp16 terms the next matvec's tensor cores take; gate/up writes down's input as terms.
// The matvecs' launch bounds say 1 block an SM explicitly: ptxas then schedules more of a warp's
// loads ahead of their use (more registers: 96 against 48-58 without the 1).

static __global__ void __launch_bounds__(256) prefill_embed_kernel(w_embed::mat embed, const int *io, float *x,
                                                                   const int *history) {
    prefill_embed_body<w_embed>(embed, io, x, history, MODEL_DIM);
}

#if CUDA_QUANTIZED
/* A layer's matrices in fp16 for the prompt's GEMMs (w_prompt), at out in prompt_layer's order */
#define PROMPT_Q 0
#define PROMPT_K (PROMPT_Q + (size_t)MODEL_Q_DIM * MODEL_DIM)
#define PROMPT_V (PROMPT_K + (size_t)MODEL_KV_DIM * MODEL_DIM)
#define PROMPT_O (PROMPT_V + (size_t)MODEL_KV_DIM * MODEL_DIM)
#define PROMPT_GATE (PROMPT_O + (size_t)MODEL_DIM * MODEL_Q_DIM)
#define PROMPT_UP (PROMPT_GATE + (size_t)MODEL_HIDDEN_DIM * MODEL_DIM)
#define PROMPT_DOWN (PROMPT_UP + (size_t)MODEL_HIDDEN_DIM * MODEL_DIM)
#define PROMPT_LAYER (PROMPT_DOWN + (size_t)MODEL_DIM * MODEL_HIDDEN_DIM)
/* waits before its first write: the previous layer's GEMMs read out */
static __global__ void __launch_bounds__(DEQUANT_THREADS) prompt_dequant_kernel(cuda_layer w, uint16_t *out) {
    pdl_wait();
    pdl_launch_dependents();
    dequant_rows<w_qkv>(w.wq, MODEL_Q_DIM, MODEL_DIM, out + PROMPT_Q);
    dequant_rows<w_qkv>(w.wk, MODEL_KV_DIM, MODEL_DIM, out + PROMPT_K);
    dequant_rows<w_qkv>(w.wv, MODEL_KV_DIM, MODEL_DIM, out + PROMPT_V);
    dequant_rows<w_o>(w.wo, MODEL_DIM, MODEL_Q_DIM, out + PROMPT_O);
    dequant_rows<w_gate_up>(w.w_gate, MODEL_HIDDEN_DIM, MODEL_DIM, out + PROMPT_GATE);
    dequant_rows<w_gate_up>(w.w_up, MODEL_HIDDEN_DIM, MODEL_DIM, out + PROMPT_UP);
    dequant_rows<w_down>(w.w_down, MODEL_DIM, MODEL_HIDDEN_DIM, out + PROMPT_DOWN);
}
#endif

static __global__ void __launch_bounds__(RMS_THREADS) prefill_rms_terms_kernel(float *x, const float *part, int parts,
                                                                              const uint16_t *norm_w, uint16_t *terms) {
    prefill_rms_terms_body<w_prompt, RMS_THREADS, RMS_VALS>(x, part, parts, norm_w, terms, MODEL_DIM, MODEL_NORM_EPS);
}

template <int B, typename KV>
static __global__ void __launch_bounds__(256) prefill_qkv_finish_kernel(model_layer_weights w, const float2 *part, int splits,
                                                                        float *q, kv_view<KV> cache, const int *io, int ctx) {
    prefill_qkv_finish_body<B>(part, splits, MODEL_QKV_BIAS ? w.bq : NULL, MODEL_QKV_BIAS ? w.bk : NULL,
                               MODEL_QKV_BIAS ? w.bv : NULL, q, cache, io, rope_inv_freq, MODEL_Q_DIM, MODEL_KV_DIM,
                               MODEL_HEAD_DIM, ctx);
}

/* MODEL_PREFILL_ATT_TOKENS: tokens of a prefill batch an attention block takes; their queries are
 * rows of the block beside the group's heads, so each key and value is read once for all of them
 * (attention_body). */
static_assert(PREFILL_SMALL % MODEL_PREFILL_ATT_TOKENS == 0, "prefill attention: whole groups of tokens in a batch");

/* MODEL_PREFILL_FLASH 1: a prefill batch's attention with 64 of its query rows of a KV head in a block
 * (prefill_flash_mma_body, on the tensor cores), where the
 * context's splits fit its combine; 0: attention_body's prefill, MODEL_PREFILL_ATT_TOKENS tokens a
 * block. */
#if MODEL_PREFILL_FLASH
template <int B, typename KV>
static __global__ void __launch_bounds__(FMMA_THREADS) prefill_flash_kernel(const float *q, kv_view<KV> cache,
                                                                        const int *io, float *part_acc, float *part_ml,
                                                                        unsigned *counters, float *att, int ctx, int n_splits) {
    prefill_flash_mma_body<B, MODEL_HEAD_DIM, MODEL_KV_MUL>(q, cache, io, part_acc, part_ml, counters, att, MODEL_Q_DIM,
                                                            MODEL_N_KV_HEADS, ctx, n_splits, MODEL_ATT_MIN_SPLITS);
}
#endif

/* tokens [t0, t0 + MODEL_PREFILL_ATT_TOKENS) of the batch, t0 = blockIdx.z * MODEL_PREFILL_ATT_TOKENS, at
 * io[IO_POS] + t0 on, their partial sums and counters those of token t0 on; none past the batch's
 * tokens (io, set before the graph, is read before the wait) */
template <typename KV>
static __global__ void __launch_bounds__(MODEL_ATT_THREADS) prefill_attention_kernel(const float *q, kv_view<KV> cache,
                                                                           const int *io, float *part_acc,
                                                                           float *part_ml, unsigned *counters, float *att,
                                                                           int ctx, int n_splits) {
    const int t = blockIdx.z * MODEL_PREFILL_ATT_TOKENS;
    if (t >= __ldcg(&io[IO_COUNT])) return;
    const size_t parts = (size_t)MODEL_N_HEADS * n_splits;
    attention_body<MODEL_PREFILL_ATT_TOKENS, KV>(q + (size_t)t * MODEL_Q_DIM, cache, io, t, part_acc + t * parts * MODEL_HEAD_DIM,
                                       part_ml + t * parts * 2, counters + t * MODEL_N_KV_HEADS, att + (size_t)t * MODEL_Q_DIM,
                                       MODEL_HEAD_DIM, MODEL_KV_MUL, ctx, n_splits, MODEL_ATT_MIN_SPLITS, blockIdx.x, blockIdx.y,
                                       NULL, wait_pdl{}, MODEL_Q_DIM, parts);
}

template <int B>
static __global__ void __launch_bounds__(MV_THREADS, 1) prefill_gate_up_silu_kernel(model_layer_weights w,
                                                                                              const uint16_t *x_terms,
                                                                                              uint16_t *hb_terms) {
    prefill_gate_up_silu_body<w_prompt, B, false>(w.w_gate, w.w_up, x_terms, hb_terms, MODEL_DIM, MODEL_HIDDEN_DIM);
}

/* The same as a GEMM (prefill_gemm_body). Where it runs: PREFILL_GATE_UP_GEMM 1 where its pair
 * tiles number at least 3/4 of the SMs (the 1B and 7-8B shapes on an H200: prompt +10% and +17%;
 * with fewer tiles SMs would idle: the SmolLM2 shape's 48 keep prefill_pairs_body, unmeasured as a
 * GEMM), 2 always (a test knob: the tiny models' tiles are fewer). */
#define PREFILL_GATE_UP_GEMM MODEL_PREFILL_GATE_UP_GEMM /* the plan's */
static_assert(PREFILL_GATE_UP_GEMM == 1 || PREFILL_GATE_UP_GEMM == 2, "PREFILL_GATE_UP_GEMM: 1 (the rule) or 2 (always)");
/* Blocks an SM the GEMMs' launch bounds ask for: four (of GEMM_STAGES 3, their shared memory); at
 * batches of 64 three (their stages take 72 KB; at four blocks' 128 registers they spill); at 256
 * columns (batches of 128 in two terms: 128 sums a thread, stages of 40 KB) one */
#define GEMM_BLOCKS_SM_AT(B) (PREFILL_TERMS * (B) > 128 ? 1 : (B) > 32 ? 3 : 4)
template <int B>
static __global__ void __launch_bounds__(GEMM_THREADS, GEMM_BLOCKS_SM_AT(B)) prefill_gate_up_gemm_kernel(model_layer_weights w,
                                                                                     const uint16_t *x_terms,
                                                                                     uint16_t *hb_terms) {
    prefill_gate_up_silu_body<w_prompt, B, true>(w.w_gate, w.w_up, x_terms, hb_terms, MODEL_DIM, MODEL_HIDDEN_DIM);
}
#if GEMM_TMA
/* ... its tiles copied by TMA (GEMM_TMA): the layer's gate and up and the batch's input terms as
 * tensor maps (tensor_map_2d); WGS warpgroups a block (2: GATE_UP_TMA_WIDE, two blocks an SM) */
template <int B, int WGS>
static __global__ void __launch_bounds__(TMA_THREADS(B, WGS), WGS == 1 ? GEMM_BLOCKS_SM_AT(B) : PREFILL_TERMS * (B) > 128 ? 1 : 2)
    prefill_gate_up_tma_kernel(const __grid_constant__ CUtensorMap gate, const __grid_constant__ CUtensorMap up,
                               const __grid_constant__ CUtensorMap x_terms, uint16_t *hb_terms) {
    prefill_gate_up_tma_body<w_prompt, B, TMA_STAGES(B, WGS), TMA_WAIT1(B, WGS), WGS>(&gate, &up, &x_terms, hb_terms, MODEL_DIM,
                                                                             MODEL_HIDDEN_DIM);
}
#endif

/* QKV and down as GEMMs with K split over blocks */
template <int B>
static __global__ void __launch_bounds__(GEMM_THREADS, GEMM_BLOCKS_SM_AT(B)) prefill_qkv_gemm_kernel(model_layer_weights w,
                                                                                 const uint16_t *x_terms, float2 *part) {
    prefill_qkv_gemm_body<w_prompt, B>(w.wq, w.wk, w.wv, x_terms, part, MODEL_DIM, MODEL_Q_DIM, MODEL_KV_DIM, MODEL_HEAD_DIM);
}

template <int B>
static __global__ void __launch_bounds__(GEMM_THREADS, GEMM_BLOCKS_SM_AT(B)) prefill_down_gemm_kernel(model_layer_weights w,
                                                                                  const uint16_t *hb_terms, float *part) {
    prefill_residual_body<w_prompt, B>(w.w_down, NULL, hb_terms, part, MODEL_DIM, MODEL_HIDDEN_DIM);
}

/* o_proj as a GEMM: the attention's output split into terms, then
 * the GEMM over splits of K */
static __global__ void __launch_bounds__(256) prefill_att_terms_kernel(const float *att, uint16_t *terms) {
    prefill_att_terms_body<w_prompt>(att, terms, MODEL_Q_DIM);
}

template <int B>
static __global__ void __launch_bounds__(GEMM_THREADS, GEMM_BLOCKS_SM_AT(B)) prefill_o_gemm_kernel(model_layer_weights w,
                                                                               const uint16_t *att_terms, float *part) {
    prefill_residual_body<w_prompt, B>(w.wo, MODEL_O_BIAS ? w.bo : NULL, att_terms, part, MODEL_DIM, MODEL_Q_DIM);
}

/* A batch that ends a prompt whose last token's logits or choice are wanted: that token's residual
 * row into x's first row, for the LM head (prefill_last_row_body) */
template <int B>
static __global__ void __launch_bounds__(256) prefill_last_row_kernel(float *x, const float *part, int parts, const int *io) {
    prefill_last_row_body<B>(x, part, parts, io, MODEL_DIM);
}

static __global__ void __launch_bounds__(WARP_SIZE) prefill_end_kernel(int *io, int keep_last) { prefill_end_body(io, keep_last); }

/* Random keys and values in [-1, 1) for positions [0, n_pos) of every layer: --bench at a context
 * depth without prefilling it token by token (decode speed depends on how much cache is read, not
 * on what it holds). kv_q8: integers of -127..127 (n elements) and their scales 1 / 127 (n_scales). */
__device__ __forceinline__ float fill_value(size_t i, uint32_t seed) {
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    return (float)(h & 0xFFFF) / 32768.0f - 1.0f;
}
template <typename KV>
static __global__ void fill_cache_kernel(typename KV::elem *cache, float *scales, size_t n, size_t n_scales, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        if constexpr (KV::Q8) cache[i] = (int8_t)__float2int_rn(127.0f * fill_value(i, seed));
        else cache[i] = __half_as_ushort(__float2half_rn(fill_value(i, seed)));
        if (KV::Q8 && i < n_scales) scales[i] = 1.0f / 127.0f;
    }
}
#endif /* !MODEL_WEIGHT_DTYPE_F32 */

// ---------------------------------------------------------------------------------------------
// State

/* What a step leaves: the cache only (a prompt token; no LM head), the argmax, the argmax and the
 * logits on the host, or the sampler's draw. */
enum { STEP_PROMPT, STEP_ARGMAX, STEP_LOGITS, STEP_SAMPLE, STEP_KINDS };
#define STEP_RING 4 /* choosing steps queued at once, at most (model_cuda_take drains the oldest) */
/* Fewest prompt tokens worth a prefill batch of their own; fewer go as steps. A batch of 8 with
 * the last token in it costs about 1.7 steps (1B shape: 1.14 ms against 0.69), so 2 tokens pay:
 * a 2-token prompt 1B +21.5%, 7B +21.2% against 3; 1 does not (docs/performance.md, D97). */
#define PREFILL_MIN_TAIL 2

#define PREFILL_TIERS 3 /* model_cuda's prefill and prefill_last: [0], [1], [2] */
#define DECODE_TIERS 4  /* its graphs: those and [3] */

struct model_cuda {
    int ctx, n_splits;
    int grid_qkv, grid_o, grid_gate_up, grid_down, grid_lm_head; /* blocks: needed, at most one wave */
    int grid_att_o_short;     /* attention_o_proj_kernel's o_proj blocks, after its attention blocks (MODEL_ATT_O_SHORT) */
    void *arena;              /* every weight, in table order */
    model_weights w;          /* device pointers into arena */
#if !defined(MODEL_WEIGHT_DTYPE_F32)
    cuda_weights dw;          /* the same, each matrix in its format: the decode step's */
#endif
    float *x;                 /* (dim) residual stream */
    /* MODEL_MLP_FUSED: the residual stream's other two buffers, (dim) each: layer l reads the stream from
     * buffer l % 3 of {x, x_mlp[0], x_mlp[1]} (residual_at) and its MLP adds the next into l + 1 */
    float *x_mlp[2];
    uint16_t *down_t;         /* MODEL_MLP_FUSED: (n_layers, hidden_dim, dim) down_proj transposed */
    int grid_mlp;             /* mlp_fused_kernel's blocks: one an SM */
    float *q;                 /* (q_dim) */
    float *att;               /* (q_dim) attention output */
    float *att_poll;          /* (q_dim) the joined short grid's (MODEL_ATT_O_POLL): ATT_POLL_WORD words until written */
    float *hb;                /* (hidden_dim) */
    float *hb_poll;           /* (hidden_dim) gate/up's outputs where down polls them (MODEL_DOWN_POLL): ATT_POLL_WORD words until written */
    float *logits;            /* (vocab) */
    kv_cache_type kv;         /* the cache's elements (--kv-cache; cuda_kv.cuh) */
    void *key_cache;          /* (n_layers, n_kv_heads, ctx, head_dim) fp16 or int8 (cuda_kv.cuh: kv_at) */
    void *value_cache;        /* (n_layers, n_kv_heads, ctx, head_dim) */
    float *key_scales;        /* kv_q8: (n_layers, n_kv_heads, ctx) */
    float *value_scales;
    float *kv_stage;          /* kv_q8: (PREFILL_BATCH, 2, kv_dim) QKV's keys and values for kv_quantize_kernel */
    float *part_acc;          /* (n_heads, n_splits, head_dim) attention partial sums */
    float *part_ml;           /* (n_heads, n_splits, 2) their max and sum */
    unsigned *counters;       /* (CTR_COUNT) blocks done: attention per KV head, argmax, KV groups' attention outputs */
    float2 *block_best;       /* (grid_lm_head) each LM-head block's best logit and id */
    int *io;                  /* {pos, next} on the device (cuda_sync.cuh: IO_*) */
    int *history;             /* (ctx) the token at each position: fed by the host, or chosen by a step */
    int *first_seen;          /* (vocab) the sampler's scratch, 0x7F7F7F7F between steps */
    sample_params *params;    /* the sampler's settings */
    unsigned long long *rng;  /* its generator's state, and the state before the last draw */
    int sampling;             /* steps that return a token use STEP_SAMPLE */
    int *chosen;              /* (ctx) mapped host memory: chosen[pos] is the token the step at pos chose */
    int *chosen_dev;          /* the same, as the device addresses it */
    float *logits_host;       /* (vocab) pinned */
    cudaStream_t stream;
    /* [0]: attention launched with n_splits blocks a KV head; [1]: with MODEL_ATT_MIN_SPLITS, for steps
     * and batches that read at most short_positions (short_att); [2]: batches with PREFILL_FEW_SPLITS,
     * for those that read at most few_positions (prefill_tier), and steps with attention_short_kernel
     * (MODEL_ATT_SHORT builds) in short_kernel_splits, for those that read at most short_kernel_positions
     * (decode_tier); [3] (decode only): steps with attention_short_kernel in one split, for those that
     * read at most one_split_positions */
    cudaGraphExec_t graphs[DECODE_TIERS][STEP_KINDS]; /* one decode step of each kind */
    cudaGraphExec_t prefill[PREFILL_TIERS][PREFILL_SIZES]; /* [s]: a batch of PREFILL_BATCH >> s prompt tokens */
    /* The same with its last layer run through and its last token's residual row kept for the LM
     * head, and at the position of that token: a batch that ends a prompt whose last token chooses */
    cudaGraphExec_t prefill_last[PREFILL_TIERS][PREFILL_SIZES];
    cudaGraphExec_t choose[STEP_KINDS]; /* after one of those: a step's LM head and choice, of each kind but STEP_PROMPT */
    int short_positions;      /* MODEL_ATT_MIN_SPLITS tiles where n_splits is more, else 0 (no [1] graphs) */
    int few_positions;        /* PREFILL_FEW_SPLITS * the least split where n_splits is more, else 0 (no [2]) */
    int short_kernel_positions; /* short_kernel_splits * att_short_max(head_dim) in MODEL_ATT_SHORT builds, else 0 (no [2] steps) */
    int short_kernel_splits;  /* attention_short_kernel's splits a KV head */
    int one_split_positions;  /* att_short_max(head_dim) where short_kernel_splits is more than 1, else 0 (no [3] steps) */
    uint16_t *prefill_x_terms;  /* (PREFILL_TERMS, PREFILL_BATCH, dim) an RMSNorm's output, QKV's or gate/up's input */
    uint16_t *prefill_hb_terms; /* (PREFILL_TERMS, PREFILL_BATCH, hidden_dim) down's input */
    float *prefill_part_x;    /* (PREFILL_MAX_X_PARTS, PREFILL_BATCH, dim) o_proj's and down's partial sums */
    float2 *prefill_part_qkv; /* (qkv_splits B at most, QKV_PAIRS) QKV's partial sums, where split */
    /* splits of K in a prefill batch of PREFILL_BATCH >> s tokens, [s] (prefill_split_counts) */
    int qkv_splits[PREFILL_SIZES];  /* QKV's GEMM's */
    int down_splits[PREFILL_SIZES]; /* down's */
    int o_splits[PREFILL_SIZES];    /* o_proj's */
    uint16_t *prefill_att_terms; /* (PREFILL_TERMS, PREFILL_BATCH, q_dim) o_proj's input */
    float *prefill_part_acc;  /* (PREFILL_BATCH, n_heads, n_splits, head_dim) the batch's attention partial sums */
    float *prefill_part_ml;   /* (PREFILL_BATCH, n_heads, n_splits, 2) */
    unsigned *prefill_counters; /* (PREFILL_BATCH, n_kv_heads) */
    int gate_up_gemm;           /* the prefill's gate/up as a GEMM (PREFILL_GATE_UP_GEMM) */
    uint16_t *prompt_w;         /* a quantized model's: one layer's matrices in fp16 (PROMPT_LAYER), its prompt's GEMMs' */
    int dequant_blocks;         /* prompt_dequant_kernel's grid */
    int gate_up_wide;           /* ... its TMA body at two warpgroups a block (GATE_UP_TMA_WIDE) */
#if GEMM_TMA
    /* (2 MODEL_N_LAYERS + PREFILL_SIZES) aligned to 64 bytes: layer l's gate and up at 2 l, 2 l + 1,
     * then prefill_x_terms at batches of PREFILL_BATCH >> s */
    CUtensorMap *tma_maps;
#endif
    /* The steps queued and not yet taken (model_cuda_take): positions [taken, queued) of the steps
     * that choose a token, each with its kind and an event recorded after it. */
    int queued, taken;
    int chose_last;           /* the last step queued chose a token, so a step can follow on it */
    int kind_at[STEP_RING];
    cudaEvent_t done[STEP_RING];
};

#if defined(MODEL_WEIGHT_DTYPE_F32)
extern "C" err_code model_cuda_init(model_cuda **out, const void *const *data, int ctx, kv_cache_type kv) {
    (void)out, (void)data, (void)ctx, (void)kv;
    return err_set(ERR_DEVICE, "--device cuda: fp32 weights are not supported on the GPU; convert the model to bf16 or fp16");
}
extern "C" err_code model_cuda_feed(model_cuda *, const int *, int, int, int) { return ERR_DEVICE; }
extern "C" err_code model_cuda_feed_choice(model_cuda *) { return ERR_DEVICE; }
extern "C" err_code model_cuda_take(model_cuda *, int *, const float **) { return ERR_DEVICE; }
extern "C" err_code model_cuda_unqueue(model_cuda *) { return ERR_DEVICE; }
extern "C" err_code model_cuda_set_sampler(model_cuda *, const sampler *) { return ERR_DEVICE; }
extern "C" err_code model_cuda_fill_cache(model_cuda *, int) { return ERR_DEVICE; }
extern "C" err_code model_cuda_kernel_bench(model_cuda *, int, int, FILE *) { return ERR_DEVICE; }
extern "C" void model_cuda_free(model_cuda *) {}
#else

static err_code cuda_fail(cudaError_t e, const char *what) {
    return err_set(ERR_DEVICE, "%s: %s", what, cudaGetErrorString(e));
}

/* One launch with one launch attribute. */
template <typename... Params, typename... Args>
static void launch_with(cudaLaunchAttribute attr, void (*kernel)(Params...), dim3 grid, int block, size_t smem,
                        cudaStream_t stream, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(block);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...));
}

/* Launches with programmatic stream serialization: the kernel may start while the previous one
 * finishes, and waits (griddepcontrol.wait) before touching its results. */
template <typename... Params, typename... Args>
static void launch_grid(void (*kernel)(Params...), dim3 grid, int block, size_t smem, cudaStream_t stream, Args... args) {
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    launch_with(attr, kernel, grid, block, smem, stream, args...);
}
template <typename... Params, typename... Args>
static void launch(void (*kernel)(Params...), int grid_x, int grid_y, int block, size_t smem, cudaStream_t stream,
                   Args... args) {
    launch_grid(kernel, dim3(grid_x, grid_y), block, smem, stream, args...);
}

/* As launch, with programmatic serialization only where pdl (without it the kernel starts after
 * the previous one ends) */
template <typename... Params, typename... Args>
static void launch_pdl(bool pdl, void (*kernel)(Params...), int grid_x, int grid_y, int block, size_t smem, cudaStream_t stream,
                       Args... args) {
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = pdl;
    launch_with(attr, kernel, dim3(grid_x, grid_y), block, smem, stream, args...);
}


/* Dynamic shared memory of the decode step's attention: its scores and query operands, and the
 * staged values where MODEL_ATT_STAGE_VALUES is on. */
#define ATT_DECODE_SMEM_BYTES (ATT_SMEM_BYTES(MODEL_KV_MUL, MODEL_HEAD_DIM) + (MODEL_ATT_MMA_HD ? att_value_stage_bytes(MODEL_ATT_MMA_HD) : 0))

/* Dynamic shared memory of attention_o_proj_kernel: attention's or o_proj's staged input. */
#define ATT_O_SHORT_SMEM_BYTES std::max<size_t>(MV_SMEM_BYTES(MODEL_Q_DIM), ATT_SHORT_SMEM_BYTES(MODEL_KV_MUL, MODEL_HEAD_DIM))

/* Stages of a step, for the kernel benchmark: its events are recorded after each launch. */
static const char *const stage_names[ST_COUNT] = {"embed", "rmsnorm_qkv_rope", "attention", "o_proj_residual",
                                                  "rmsnorm_gate_up_silu", "down_residual", "rmsnorm_lm_head_argmax", "mlp_fused"};

/* For the kernel benchmark (outside a graph): events[0] before the first launch and events[k + 1]
 * after launch k, and the stage launch k closed. events NULL: nothing recorded (a captured graph). */
struct launch_marks {
    cudaEvent_t *events;
    int *stage_of;
    cudaStream_t stream;
    int n;
    void begin() {
        if (events) CUDA_CHECK(cudaEventRecord(events[0], stream));
    }
    void operator()(int stage) {
        if (!events) return;
        CUDA_CHECK(cudaEventRecord(events[n + 1], stream));
        stage_of[n++] = stage;
    }
};

/* A step's end, of the given kind, after its layers, at the position io[IO_POS]: the final norm and
 * LM head on x's first row; the choice; the position advanced; the logits to the host. x: the
 * residual stream after the layers (m->x, or residual_at(m, MODEL_N_LAYERS) after fused MLPs). */
static void enqueue_choice(model_cuda *m, int kind, launch_marks &mark, const float *x) {
    if (kind != STEP_PROMPT) {
        launch(rmsnorm_lm_head_argmax_kernel, m->grid_lm_head, 1, MV_THREADS, MV_SMEM_BYTES(MODEL_DIM), m->stream, m->dw.final_norm,
               m->dw.lm_head, x, m->logits, m->block_best, m->counters + CTR_ARGMAX, m->io);
        mark(ST_LM_HEAD);
    }
    if (kind == STEP_SAMPLE)
        launch(sample_kernel, 1, 1, SAMPLE_THREADS, 0, m->stream, m->logits, m->history, m->first_seen, m->io, m->params, m->rng);
    launch(step_end_kernel, 1, 1, WARP_SIZE, 0, m->stream, m->io, m->history, m->chosen_dev, m->ctx, (int)(kind != STEP_PROMPT));
    if (kind == STEP_LOGITS)
        CUDA_CHECK(cudaMemcpyAsync(m->logits_host, m->logits, MODEL_VOCAB_SIZE * sizeof(float), cudaMemcpyDeviceToHost,
                                   m->stream));
}

/* The buffer that holds the residual stream at layer l's start: x, unless the fused MLPs move it
 * round three buffers (MODEL_MLP_FUSED: each adds the next into a buffer it cannot be reading) */
static float *residual_at(model_cuda *m, int l) {
    if (!MODEL_MLP_FUSED || l % 3 == 0) return m->x;
    return m->x_mlp[l % 3 - 1];
}

/* Layer l's cache, as the kernels of KV take it */
template <typename KV>
static kv_view<KV> kv_layer(const model_cuda *m, int l) {
    const size_t at = (size_t)l * m->ctx * MODEL_KV_DIM, scale_at = (size_t)l * m->ctx * MODEL_N_KV_HEADS;
    kv_view<KV> c;
    c.k = (typename KV::elem *)m->key_cache + at;
    c.v = (typename KV::elem *)m->value_cache + at;
    c.ks = KV::Q8 ? m->key_scales + scale_at : NULL;
    c.vs = KV::Q8 ? m->value_scales + scale_at : NULL;
    c.stage = m->kv_stage;
    return c;
}

/* The decode step's launches, in order: on the token at history[pos], pos read from io on the
 * device. With marks (kernel benchmark, outside a graph) an event is recorded after each launch and
 * *stage_of says which stage it closed. */
template <typename KV>
static void enqueue_step_kv(model_cuda *m, int kind, int n_splits, bool short_kernel, cudaEvent_t *marks, int *stage_of) {
    launch_marks mark = {marks, stage_of, m->stream, 0};
    mark.begin();
    {
        launch(embed_kernel, (MODEL_DIM + 255) / 256, 1, 256, 0, m->stream, m->dw.embed, m->io, m->x, m->history,
               MODEL_MLP_FUSED ? residual_at(m, 1) : (float *)NULL);
        mark(ST_EMBED);
        for (int l = 0; l < MODEL_N_LAYERS; l++) {
            const cuda_layer *lw = &m->dw.layers[l];
            float *x = residual_at(m, l);
            const kv_view<KV> cache = kv_layer<KV>(m, l);
            launch(rmsnorm_qkv_rope_kernel<KV>, m->grid_qkv, 1, MV_THREADS, QKV_SMEM_BYTES(w_qkv, MODEL_DIM), m->stream, *lw,
                   x, m->q, cache, m->io, m->ctx, m->hb_poll);
            if constexpr (KV::Q8)
                launch(kv_quantize_kernel, kv_quantize_blocks(1), 1, KV_QUANTIZE_THREADS, 0, m->stream, cache, m->io, m->ctx, 0);
            mark(ST_QKV);
            /* A prompt token needs the last layer's keys and values only: what follows feeds the LM head. */
            if (kind == STEP_PROMPT && l == MODEL_N_LAYERS - 1) break;
#if MODEL_ATT_O_SHORT
            if (!marks && short_kernel) { /* the kernel benchmark times the two stages apart */
                launch(attention_o_proj_kernel<KV>, MODEL_N_KV_HEADS * n_splits + m->grid_att_o_short, 1, MV_THREADS,
                       ATT_O_SHORT_SMEM_BYTES, m->stream, *lw, m->q, cache, m->io, m->part_acc, m->part_ml, m->counters,
                       MODEL_ATT_O_POLL ? m->att_poll : m->att, x, m->ctx, n_splits);
            } else
#endif
            {
#if ATT_SHORT_BUILT
                if (short_kernel)
                    launch(short_attention_kernel<KV>(), MODEL_N_KV_HEADS, n_splits, MODEL_ATT_THREADS, ATT_SHORT_SMEM_BYTES(MODEL_KV_MUL, MODEL_HEAD_DIM),
                           m->stream, m->q, cache, m->io, m->part_acc, m->part_ml, m->counters, m->att, m->ctx, n_splits);
                else
#endif
                    launch(decode_attention_kernel<KV>(), MODEL_N_KV_HEADS, n_splits, MODEL_ATT_THREADS, ATT_DECODE_SMEM_BYTES,
                           m->stream, m->q, cache, m->io, m->part_acc, m->part_ml, m->counters, m->att, m->ctx, n_splits);
                mark(ST_ATT);
                if (short_kernel && n_splits == 1) /* the one-split graphs (or heads of 128's short steps) */
                    launch(o_proj_residual_kernel<true>, m->grid_o, 1, MV_THREADS, MV_SMEM_BYTES(MODEL_Q_DIM), m->stream,
                           *lw, m->att, x);
                else
                    launch(o_proj_residual_kernel<false>, m->grid_o, 1, MV_THREADS, MV_SMEM_BYTES(MODEL_Q_DIM), m->stream,
                           *lw, m->att, x);
                mark(ST_O);
            }
#if MODEL_MLP_FUSED
            launch(mlp_fused_kernel, m->grid_mlp, 1, MLP_THREADS, MLP_SMEM_BYTES(MODEL_DIM), m->stream, *lw,
                   m->down_t + (size_t)l * MODEL_HIDDEN_DIM * MODEL_DIM, x, residual_at(m, l + 1), residual_at(m, l + 2),
                   m->counters + CTR_ATT_DONE, m->att_poll);
            mark(ST_MLP);
            continue;
#endif
            launch(rmsnorm_gate_up_silu_kernel, m->grid_gate_up, 1, MV_THREADS, MV_SMEM_BYTES(MODEL_DIM),
                   m->stream, *lw, x, MODEL_DOWN_POLL ? m->hb_poll : m->hb, m->counters + CTR_ATT_DONE, m->att_poll);
            mark(ST_GATE_UP);
            launch(down_residual_kernel, m->grid_down, 1, MV_THREADS, MV_SMEM_BYTES(MODEL_HIDDEN_DIM), m->stream, *lw,
                   MODEL_DOWN_POLL ? m->hb_poll : m->hb, x);
            mark(ST_DOWN);
        }
    }
    enqueue_choice(m, kind, mark, residual_at(m, MODEL_N_LAYERS));
}
static void enqueue_step(model_cuda *m, int kind, int n_splits, bool short_kernel, cudaEvent_t *marks, int *stage_of) {
    if (m->kv == KV_Q8) enqueue_step_kv<kv_q8>(m, kind, n_splits, short_kernel, marks, stage_of);
    else enqueue_step_kv<kv_f16>(m, kind, n_splits, short_kernel, marks, stage_of);
}

#define STEP_LAUNCHES (2 + (MODEL_MLP_FUSED ? 4 : 5) * MODEL_N_LAYERS)

/* Blocks of a prefill matvec: PREFILL_BLOCK_PAIRS pairs of rows a block. */
#define QKV_PAIRS ((MODEL_Q_DIM + 2 * MODEL_KV_DIM) / 2)
#define PREFILL_GRID(pairs) (((pairs) + PREFILL_BLOCK_PAIRS - 1) / PREFILL_BLOCK_PAIRS)

/* A prefill batch's stages, for the kernel benchmark, and its launches: the last layer's norm and
 * QKV only. */
enum { PF_EMBED, PF_DEQUANT, PF_SCALES, PF_QKV, PF_ATT, PF_O, PF_GATE_UP, PF_DOWN, PF_END, PF_COUNT };
static const char *const prefill_stage_names[PF_COUNT] = {"prefill_embed", "prefill_dequant", "prefill_rms_terms", "prefill_qkv_rope",
                                                          "prefill_attention", "prefill_o_proj", "prefill_gate_up_silu",
                                                          "prefill_down", "prefill_end"};
#define PREFILL_LAUNCHES ((7 + CUDA_QUANTIZED) * MODEL_N_LAYERS - 3) /* a quantized layer's dequantization first */

/* s of a batch of B = PREFILL_BATCH >> s tokens (the prefill graphs', splits' and tensor maps' index) */
static constexpr int prefill_size_index(int b) { return b >= PREFILL_BATCH ? 0 : 1 + prefill_size_index(2 * b); }

#if GEMM_TMA

/* A tensor map of a row-major (rows, cols) matrix of the weights' 16-bit type at base: boxes of
 * GEMM_KT values by box_rows rows, swizzled 128 bytes, zeros past the edges (prefill_gate_up_tma_body);
 * the encoder is the driver's, found through the runtime (no -lcuda) */
static CUtensorMap tensor_map_2d(const void *base, int rows, int cols, int box_rows) {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = NULL;
    if (!encode) {
        cudaDriverEntryPointQueryResult found;
        CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&encode, 12000, cudaEnableDefault, &found));
        if (found != cudaDriverEntryPointSuccess) {
            fprintf(stderr, "ingot: GEMM_TMA: the CUDA driver has no cuTensorMapEncodeTiled\n");
            exit(1);
        }
    }
    const CUtensorMapDataType type = w_prompt::BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    CUtensorMap map;
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)cols * sizeof(uint16_t)};
    const cuuint32_t box[2] = {GEMM_KT, (cuuint32_t)box_rows}, steps[2] = {1, 1};
    const CUresult r = encode(&map, type, 2, const_cast<void *>(base), dims, strides, box, steps, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "ingot: GEMM_TMA: cuTensorMapEncodeTiled failed (CUresult %d) for a (%d, %d) matrix\n", (int)r, rows, cols);
        exit(1);
    }
    return map;
}
#endif

/* io[IO_COUNT] prompt tokens (at most B) at positions io[IO_POS] on, then the position past them.
 * As a prompt step, the last layer stops after its keys and values; with last, it runs through, the
 * last token's residual row goes where the LM head reads it and the position stays at that token
 * (its choice, enqueue_choice, advances it). With marks: as enqueue_step. */
#if CUDA_QUANTIZED
/* Layer l's weights for the prompt's kernels: its vectors, and its matrices at m->prompt_w, where
 * prompt_dequant_kernel puts them before the layer's GEMMs */
static model_layer_weights prompt_layer(const model_cuda *m, int l) {
    model_layer_weights w = m->w.layers[l];
    w.wq = m->prompt_w + PROMPT_Q;
    w.wk = m->prompt_w + PROMPT_K;
    w.wv = m->prompt_w + PROMPT_V;
    w.wo = m->prompt_w + PROMPT_O;
    w.w_gate = m->prompt_w + PROMPT_GATE;
    w.w_up = m->prompt_w + PROMPT_UP;
    w.w_down = m->prompt_w + PROMPT_DOWN;
    return w;
}
#endif

template <int B, typename KV>
static void enqueue_prefill(model_cuda *m, int n_splits, bool last, cudaEvent_t *marks, int *stage_of) {
    const size_t smem = 0; /* gate/up's matvec's shared memory is static */
    constexpr int size = prefill_size_index(B);
    const int qkv_splits = m->qkv_splits[size], o_splits = m->o_splits[size], down_splits = m->down_splits[size];
    launch_marks mark = {marks, stage_of, m->stream, 0};
    mark.begin();
    launch(prefill_embed_kernel, (MODEL_DIM + 255) / 256, B, 256, 0, m->stream, m->dw.embed, m->io, m->x, m->history);
    mark(PF_EMBED);
    for (int l = 0; l < MODEL_N_LAYERS; l++) {
#if CUDA_QUANTIZED
        launch(prompt_dequant_kernel, m->dequant_blocks, 1, DEQUANT_THREADS, 0, m->stream, m->dw.layers[l], m->prompt_w);
        mark(PF_DEQUANT);
        const model_layer_weights prompt = prompt_layer(m, l), *lw = &prompt;
#else
        const model_layer_weights *lw = &m->w.layers[l];
#endif
        const kv_view<KV> cache = kv_layer<KV>(m, l);
        launch(prefill_rms_terms_kernel, B, 1, RMS_THREADS, 0, m->stream, m->x, m->prefill_part_x, l > 0 ? down_splits : 0,
               lw->attn_norm, m->prefill_x_terms);
        mark(PF_SCALES);
        launch(prefill_qkv_gemm_kernel<B>, gemm_tiles(QKV_PAIRS), qkv_splits, GEMM_THREADS, GEMM_SMEM_BYTES(B), m->stream, *lw,
               m->prefill_x_terms, m->prefill_part_qkv);
        launch(prefill_qkv_finish_kernel<B, KV>, (QKV_PAIRS + 255) / 256, B, 256, 0, m->stream, *lw, m->prefill_part_qkv, qkv_splits,
               m->q, cache, m->io, m->ctx);
        if constexpr (KV::Q8)
            launch(kv_quantize_kernel, kv_quantize_blocks(B), 1, KV_QUANTIZE_THREADS, 0, m->stream, cache, m->io, m->ctx, 1);
        mark(PF_QKV);
        if (l == MODEL_N_LAYERS - 1 && !last) break;
#if MODEL_PREFILL_FLASH
        if (m->n_splits <= FLASH_MAX_SPLITS(MODEL_HEAD_DIM)) {
            const size_t flash_smem = FMMA_SMEM_BYTES(MODEL_HEAD_DIM);
            CUDA_CHECK(cudaFuncSetAttribute((const void *)prefill_flash_kernel<B, KV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)flash_smem));
            launch_grid(prefill_flash_kernel<B, KV>, dim3(MODEL_N_KV_HEADS, n_splits, (B * MODEL_KV_MUL + FLASH_ROWS - 1) / FLASH_ROWS),
                        FMMA_THREADS, flash_smem, m->stream, m->q, cache, m->io, m->prefill_part_acc,
                        m->prefill_part_ml, m->prefill_counters, m->att, m->ctx, n_splits);
        } else
#endif
        launch_grid(prefill_attention_kernel<KV>, dim3(MODEL_N_KV_HEADS, n_splits, B / MODEL_PREFILL_ATT_TOKENS), MODEL_ATT_THREADS,
                    ATT_SMEM_BYTES(MODEL_KV_MUL * MODEL_PREFILL_ATT_TOKENS, MODEL_HEAD_DIM), m->stream, m->q, cache, m->io, m->prefill_part_acc,
                    m->prefill_part_ml, m->prefill_counters, m->att, m->ctx, n_splits);
        mark(PF_ATT);
        launch(prefill_att_terms_kernel, (MODEL_Q_DIM / 4 + 255) / 256, B, 256, 0, m->stream, m->att, m->prefill_att_terms);
        launch(prefill_o_gemm_kernel<B>, gemm_tiles(MODEL_DIM / 2), o_splits, GEMM_THREADS, GEMM_SMEM_BYTES(B), m->stream, *lw,
               m->prefill_att_terms, m->prefill_part_x);
        mark(PF_O);
        launch(prefill_rms_terms_kernel, B, 1, RMS_THREADS, 0, m->stream, m->x, m->prefill_part_x, o_splits, lw->ffn_norm,
               m->prefill_x_terms);
        mark(PF_SCALES);
#if GEMM_TMA
        if (m->gate_up_gemm) {
            const int wgs = m->gate_up_wide ? 2 : 1;
            launch(wgs == 2 ? prefill_gate_up_tma_kernel<B, 2> : prefill_gate_up_tma_kernel<B, 1>, TMA_BLOCKS(MODEL_HIDDEN_DIM, wgs), 1,
                   wgs == 2 ? TMA_THREADS(B, 2) : TMA_THREADS(B, 1), TMA_SMEM_BYTES(B, TMA_STAGES(B, wgs), wgs), m->stream,
                   m->tma_maps[2 * l], m->tma_maps[2 * l + 1], m->tma_maps[2 * MODEL_N_LAYERS + prefill_size_index(B)],
                   m->prefill_hb_terms);
        }
        else
#endif
        if (m->gate_up_gemm)
            launch(prefill_gate_up_gemm_kernel<B>, gemm_tiles(MODEL_HIDDEN_DIM), 1, GEMM_THREADS,
                   GEMM_SMEM_BYTES_AT(B, GATE_UP_GEMM_STAGES), m->stream, *lw, m->prefill_x_terms, m->prefill_hb_terms);
        else
            launch(prefill_gate_up_silu_kernel<B>, PREFILL_GRID(MODEL_HIDDEN_DIM), 1, MV_THREADS, smem, m->stream, *lw,
                   m->prefill_x_terms, m->prefill_hb_terms);
        mark(PF_GATE_UP);
        launch(prefill_down_gemm_kernel<B>, gemm_tiles(MODEL_DIM / 2), down_splits, GEMM_THREADS, GEMM_SMEM_BYTES(B), m->stream,
               *lw, m->prefill_hb_terms, m->prefill_part_x);
        mark(PF_DOWN);
    }
    if (last)
        launch(prefill_last_row_kernel<B>, (MODEL_DIM + 255) / 256, 1, 256, 0, m->stream, m->x, m->prefill_part_x, down_splits,
               m->io);
    launch(prefill_end_kernel, 1, 1, WARP_SIZE, 0, m->stream, m->io, (int)last);
    mark(PF_END);
}

/* the prefill GEMMs' shared memory, for batches of B, B / 2, ... 8 */
template <int B>
static void prefill_gemm_smem(void) {
    const void *kernels[] = {(const void *)prefill_qkv_gemm_kernel<B>, (const void *)prefill_down_gemm_kernel<B>,
                             (const void *)prefill_o_gemm_kernel<B>};
    for (const void *k : kernels) CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)GEMM_SMEM_BYTES(B)));
    CUDA_CHECK(cudaFuncSetAttribute((const void *)prefill_gate_up_gemm_kernel<B>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)GEMM_SMEM_BYTES_AT(B, GATE_UP_GEMM_STAGES)));
#if GEMM_TMA
    CUDA_CHECK(cudaFuncSetAttribute((const void *)prefill_gate_up_tma_kernel<B, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)TMA_SMEM_BYTES(B, TMA_STAGES(B, 1), 1)));
    CUDA_CHECK(cudaFuncSetAttribute((const void *)prefill_gate_up_tma_kernel<B, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)TMA_SMEM_BYTES(B, TMA_STAGES(B, 2), 2)));
#endif
    if constexpr (B > PREFILL_SMALL) prefill_gemm_smem<B / 2>();
}

/* blocks of a prefill GEMM kernel for batches of b resident an SM (after prefill_gemm_smem) */
static int gemm_resident(const void *kernel, int b) {
    int n = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, GEMM_THREADS, GEMM_SMEM_BYTES(b)));
    return n;
}

/* The split GEMMs' splits of K for batches of B, B / 2, ... PREFILL_SMALL (after prefill_gemm_smem):
 * gemm_splits on the occupancy of each size's own kernel */
template <int B>
static void prefill_split_counts(model_cuda *m, int sms) {
    constexpr int s = prefill_size_index(B);
    m->qkv_splits[s] = gemm_splits(gemm_tiles(QKV_PAIRS), MODEL_DIM, sms, gemm_resident((const void *)prefill_qkv_gemm_kernel<B>, B));
    m->down_splits[s] = gemm_splits(gemm_tiles(MODEL_DIM / 2), MODEL_HIDDEN_DIM, sms,
                                    gemm_resident((const void *)prefill_down_gemm_kernel<B>, B));
    m->o_splits[s] = gemm_splits(gemm_tiles(MODEL_DIM / 2), MODEL_Q_DIM, sms, gemm_resident((const void *)prefill_o_gemm_kernel<B>, B));
    if constexpr (B > PREFILL_SMALL) prefill_split_counts<B / 2>(m, sms);
}

/* A prefill batch of B >> s tokens (s < PREFILL_SIZES): one instance of enqueue_prefill a size. */
template <int B>
static void enqueue_prefill_size(model_cuda *m, int s, int n_splits, bool last, cudaEvent_t *marks = NULL, int *stage_of = NULL) {
    if (s == 0) {
        if (m->kv == KV_Q8) enqueue_prefill<B, kv_q8>(m, n_splits, last, marks, stage_of);
        else enqueue_prefill<B, kv_f16>(m, n_splits, last, marks, stage_of);
    }
    else if constexpr (B > PREFILL_SMALL) enqueue_prefill_size<B / 2>(m, s - 1, n_splits, last, marks, stage_of);
}

/* Splits a KV head of the prefill batches that read at most PREFILL_FEW_SPLITS * PREFILL_MIN_CHUNK
 * positions, or FMMA_MIN_CHUNK where the tensor cores' flash kernel runs (the [2] graphs). A
 * prompt's split takes at least that many positions (prefill_min_chunk, FMMA_MIN_CHUNK), so for
 * those batches any split count from this one up cuts the positions alike, into at most this many: the [1] graphs' MODEL_ATT_MIN_SPLITS (33 on the 1B and 7B shapes) only
 * add blocks that find no positions and leave, 25 or more of 33 a KV head and group of rows. 1B
 * shape, a 128-token prompt: +5.6% at depth 0, +0.3% at 1024 against the [1] graphs; 1 split instead
 * of 8 even at 0 and -1.5% at 1024 (docs/performance.md, D84). */
#define PREFILL_FEW_SPLITS 8

/* Splits a KV head that the graphs of tier s launch (m->graphs[s], m->prefill[s]) */
static int tier_splits(const model_cuda *m, int s, bool prefill) {
    return s == 0 ? m->n_splits : s == 1 ? MODEL_ATT_MIN_SPLITS : s == 3 ? 1 : prefill ? PREFILL_FEW_SPLITS : m->short_kernel_splits;
}
/* Whether a decode step of tier s launches attention_short_kernel */
static bool tier_short_kernel(int s) { return s >= 2; }

/* *exec: a graph of what enqueue() queues on m->stream */
template <typename Enqueue>
static err_code capture(model_cuda *m, cudaGraphExec_t *exec, Enqueue enqueue) {
    cudaGraph_t graph;
    cudaError_t e = cudaStreamBeginCapture(m->stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) return cuda_fail(e, "CUDA graph capture");
    enqueue();
    if ((e = cudaStreamEndCapture(m->stream, &graph)) != cudaSuccess) return cuda_fail(e, "CUDA graph capture");
    e = cudaGraphInstantiate(exec, graph, 0);
    cudaGraphDestroy(graph);
    return e == cudaSuccess ? ERR_OK : cuda_fail(e, "CUDA graph instantiation");
}

/* Bytes of model_tensor_specs[t]. */
static size_t tensor_bytes(int t) {
    const st_tensor_spec *s = &model_tensor_specs[t];
    size_t bytes = s->dtype == DT_U8 ? 1 : sizeof(model_weight_t); /* a quantized matrix's rows of blocks, or the dtype's values */
    for (int d = 0; d < s->ndim; d++) bytes *= (size_t)s->shape[d];
    return bytes;
}

/* The format of tensor t, a quantized one (dtype U8: codegen/spec.py), by its field's name. */

/* A block's scale and value bytes in GGUF's layout (scales first) of a format with GPU kernels */
/* Copies every tensor into the arena through two pinned staging buffers, so the copy of one chunk
 * overlaps the reading of the next from the mapped file. A bar on a terminal for large models. */
/* A quantized tensor goes to a raw buffer on the device first, then its format's repack
 * (cuda_weights.cuh) puts it in its place in the arena. */
static err_code upload(model_cuda *m, const void *const *data, const size_t *offsets, size_t total) {
    const size_t chunk = (size_t)64 << 20;
    void *stage[2];
    cudaEvent_t done[2];
    cudaError_t e;
    size_t raw_bytes = 0;
    for (int t = 0; t < MODEL_N_TENSORS; t++)
        if (model_tensor_specs[t].dtype == DT_U8) raw_bytes = std::max(raw_bytes, tensor_bytes(t));
    uint8_t *raw = NULL;
    if (raw_bytes && (e = cudaMalloc(&raw, raw_bytes)) != cudaSuccess) return cuda_fail(e, "the quantized weights' upload buffer");
    if ((e = cudaHostAlloc(&stage[0], 2 * chunk, cudaHostAllocDefault)) != cudaSuccess) {
        cudaFree(raw);
        return cuda_fail(e, "pinned staging buffer");
    }
    stage[1] = (char *)stage[0] + chunk;
    CUDA_CHECK(cudaEventCreateWithFlags(&done[0], cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&done[1], cudaEventDisableTiming));
    int bar = isatty(STDERR_FILENO) && total > ((size_t)1 << 30), slot = 0, shown = -1;
    size_t sent = 0;
    for (int t = 0; t < MODEL_N_TENSORS; t++) {
        size_t bytes = tensor_bytes(t);
        const bool quantized = model_tensor_specs[t].dtype == DT_U8;
        uint8_t *dst = quantized ? raw : (uint8_t *)m->arena + offsets[t];
        for (size_t off = 0; off < bytes; off += chunk, slot ^= 1) {
            size_t n = bytes - off < chunk ? bytes - off : chunk;
            CUDA_CHECK(cudaEventSynchronize(done[slot])); /* the buffer's previous copy is finished */
            memcpy(stage[slot], (const char *)data[t] + off, n);
            CUDA_CHECK(cudaMemcpyAsync(dst + off, stage[slot], n, cudaMemcpyHostToDevice, m->stream));
            CUDA_CHECK(cudaEventRecord(done[slot], m->stream));
            sent += n;
            if (bar && (int)(100 * sent / total) != shown) {
                shown = (int)(100 * sent / total);
                fprintf(stderr, "\ruploading weights: %3d%% of %.1f GB", shown, total / 1e9);
            }
        }
        if (quantized) /* stream order: the next tensor's copies into raw wait for this */
            CUDA_CHECK(repack_format(model_tensor_format(model_tensor_specs[t].name), raw, (uint8_t *)m->arena + offsets[t], bytes, m->stream));
    }
    CUDA_CHECK(cudaStreamSynchronize(m->stream));
    if (bar) fprintf(stderr, "\n");
    cudaEventDestroy(done[0]);
    cudaEventDestroy(done[1]);
    cudaFreeHost(stage[0]);
    cudaFree(raw);
    return ERR_OK;
}

/* Needed blocks of a matvec kernel with smem bytes of staged input, capped at what the GPU holds
 * resident at once; also lifts the kernel's dynamic shared-memory limit past the default 48 KB. */
static int one_wave(const void *kernel, int needed, size_t smem, int sms) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int per_sm = 1;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, MV_THREADS, smem));
    /* A full wave: half of one, leaving room for the next kernel's blocks, measured 20% slower
     * (docs/performance.md, D3); the fewest blocks for the same rounds of rows (every warp as many rows
     * as any other, or one fewer) measured even or slower (D47). */
    int wave = (per_sm > 0 ? per_sm : 1) * sms;
    return needed < wave ? needed : wave;
}

/* Every decode kernel's preferred split of L1 and shared memory set alike (MODEL_SMEM_CARVEOUT, the
 * plan's), so that no SM drains to change its split between two stages; -1 leaves the driver's. */
static void set_decode_carveout(void) {
#if MODEL_SMEM_CARVEOUT >= 0
    const void *decode_kernels[] = {(const void *)embed_kernel,
#if MODEL_MLP_FUSED
                                    (const void *)mlp_fused_kernel,
#endif
                                    (const void *)o_proj_residual_kernel<false>, (const void *)o_proj_residual_kernel<true>,
                                    (const void *)rmsnorm_gate_up_silu_kernel,
                                    (const void *)down_residual_kernel, (const void *)rmsnorm_lm_head_argmax_kernel,
                                    (const void *)sample_kernel, (const void *)step_end_kernel};
    for (const void *k : decode_kernels)
        CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, MODEL_SMEM_CARVEOUT));
#endif
}

/* The decode kernels that read or write the cache, of its type KV: their carveout (as
 * set_decode_carveout's), shared memory and grids */
template <typename KV>
static void set_kv_kernels(model_cuda *m, int sms) {
    const void *kernels[] = {(const void *)rmsnorm_qkv_rope_kernel<KV>, (const void *)decode_attention_kernel<KV>(),
#if ATT_SHORT_BUILT
                             (const void *)short_attention_kernel<KV>(),
#endif
#if MODEL_ATT_O_SHORT
                             (const void *)attention_o_proj_kernel<KV>,
#endif
                             (const void *)kv_quantize_kernel};
    (void)kernels;
#if MODEL_SMEM_CARVEOUT >= 0
    for (const void *k : kernels) CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, MODEL_SMEM_CARVEOUT));
#endif
    m->grid_qkv = one_wave((const void *)rmsnorm_qkv_rope_kernel<KV>, MODEL_GRID_QKV, QKV_SMEM_BYTES(w_qkv, MODEL_DIM), sms);
#if MODEL_ATT_O_SHORT
    m->grid_att_o_short = one_wave((const void *)attention_o_proj_kernel<KV>, MODEL_GRID_O, ATT_O_SHORT_SMEM_BYTES, sms);
#endif
    CUDA_CHECK(cudaFuncSetAttribute((const void *)decode_attention_kernel<KV>(), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)ATT_DECODE_SMEM_BYTES));
#if ATT_SHORT_BUILT
    if (MODEL_ATT_SHORT)
        CUDA_CHECK(cudaFuncSetAttribute((const void *)short_attention_kernel<KV>(), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)ATT_SHORT_SMEM_BYTES(MODEL_KV_MUL, MODEL_HEAD_DIM)));
#endif
}

/* The decode step's view of the weights bound in w: each matrix as its format takes it. */
static void bind_formats(cuda_weights *dw, const model_weights *w) {
    dw->embed = w_embed::at(w->embed, MODEL_VOCAB_SIZE, MODEL_DIM);
    for (int l = 0; l < MODEL_N_LAYERS; l++) {
        const model_layer_weights *s = &w->layers[l];
        cuda_layer *d = &dw->layers[l];
        d->attn_norm = s->attn_norm;
        d->bq = s->bq;
        d->bk = s->bk;
        d->bv = s->bv;
        d->bo = s->bo;
        d->ffn_norm = s->ffn_norm;
        d->wq = format_at<w_qkv>(s->wq, MODEL_Q_DIM, MODEL_DIM, MODEL_FORMAT_WQ_AT(l));
        d->wk = format_at<w_qkv>(s->wk, MODEL_KV_DIM, MODEL_DIM, MODEL_FORMAT_WK_AT(l));
        d->wv = format_at<w_qkv>(s->wv, MODEL_KV_DIM, MODEL_DIM, MODEL_FORMAT_WV_AT(l));
        d->wo = format_at<w_o>(s->wo, MODEL_DIM, MODEL_Q_DIM, MODEL_FORMAT_WO_AT(l));
        d->w_gate = format_at<w_gate_up>(s->w_gate, MODEL_HIDDEN_DIM, MODEL_DIM, MODEL_FORMAT_W_GATE_AT(l));
        d->w_up = format_at<w_gate_up>(s->w_up, MODEL_HIDDEN_DIM, MODEL_DIM, MODEL_FORMAT_W_UP_AT(l));
        d->w_down = format_at<w_down>(s->w_down, MODEL_DIM, MODEL_HIDDEN_DIM, MODEL_FORMAT_W_DOWN_AT(l));
    }
    dw->final_norm = w->final_norm;
    dw->lm_head = w_lm::at(w->lm_head, MODEL_VOCAB_SIZE, MODEL_DIM);
}

/* NULL when the matrices' formats have kernels here, else why not */
static const char *formats_refused(void) {
#if MODEL_GENERIC
    return MODEL_QUANTIZED ? "the generic build runs quantized weights on the CPU only (build the model itself: make MODEL=...)" : NULL;
#else
    static char why[240];
    static const struct { const char *field; int format; } fields[] = {
        {"model.embed_tokens", MODEL_FORMAT_EMBED}, {"lm_head", MODEL_FORMAT_LM_HEAD},
    };
    for (const auto &f : fields)
        if (!format_on_gpu(f.format)) {
            snprintf(why, sizeof why, "%s is %s, which has no GPU kernels (F16, BF16 and the block formats Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, "
                     "Q6_K have; --device cpu runs it)", f.field, quant_type_name(f.format));
            return why;
        }
    /* each kernel's matrices over the layers: one format, or only K formats (w_kany) */
    static const char *const groups[4] = {"self_attn.q_proj, k_proj and v_proj", "self_attn.o_proj", "mlp.gate_proj and up_proj",
                                          "mlp.down_proj"};
    for (int g = 0; g < 4; g++) {
        int formats[8], n = 0;
        bool all_k = true;
        for (int l = 0; l < MODEL_N_LAYERS; l++) {
            const int at[4][3] = {{MODEL_FORMAT_WQ_AT(l), MODEL_FORMAT_WK_AT(l), MODEL_FORMAT_WV_AT(l)},
                                  {MODEL_FORMAT_WO_AT(l), MODEL_FORMAT_WO_AT(l), MODEL_FORMAT_WO_AT(l)},
                                  {MODEL_FORMAT_W_GATE_AT(l), MODEL_FORMAT_W_UP_AT(l), MODEL_FORMAT_W_UP_AT(l)},
                                  {MODEL_FORMAT_W_DOWN_AT(l), MODEL_FORMAT_W_DOWN_AT(l), MODEL_FORMAT_W_DOWN_AT(l)}};
            for (int k = 0; k < 3; k++) {
                const int f = at[g][k];
                if (!format_on_gpu(f)) {
                    snprintf(why, sizeof why, "%s of layer %d is %s, which has no GPU kernels (F16, BF16 and the block formats Q8_0, "
                             "Q4_0, Q4_1, Q4_K, Q5_K, Q6_K have; --device cpu runs it)", groups[g], l, quant_type_name(f));
                    return why;
                }
                all_k = all_k && format_k(f);
                int i = 0;
                while (i < n && formats[i] != f) i++;
                if (i == n && n < 8) formats[n++] = f;
            }
        }
        if (n < 2 || all_k) continue;
        int len = snprintf(why, sizeof why, "%s mix %s", groups[g], quant_type_name(formats[0]));
        for (int i = 1; i < n; i++)
            len += snprintf(why + len, sizeof why - len, "%s%s", i == n - 1 ? " and " : ", ", quant_type_name(formats[i]));
        snprintf(why + len, sizeof why - len, "; one kernel reads them, and mixes only the K formats (Q4_K, Q5_K, Q6_K); --device cpu runs it");
        return why;
    }
    return NULL;
#endif
}

extern "C" err_code model_cuda_init(model_cuda **out, const void *const *data, int ctx, kv_cache_type kv) {
    if (const char *why = formats_refused()) return err_set(ERR_DEVICE, "--device cuda: %s", why);
    MODEL_REQUIRE(MODEL_DIM % 8 == 0 && MODEL_HIDDEN_DIM % 8 == 0 && MODEL_Q_DIM % 8 == 0, ERR_DEVICE,
                  "--device cuda: needs hidden_size, intermediate_size and q_dim multiples of 8 (matvec rows are read in "
                  "16-byte chunks of 8 weights)");
    MODEL_REQUIRE(MODEL_HEAD_DIM >= 16 && MODEL_HEAD_DIM <= 128 && (MODEL_HEAD_DIM & (MODEL_HEAD_DIM - 1)) == 0, ERR_DEVICE,
                  "--device cuda: needs head_dim a power of two in 16..128 (attention: 8-value chunks of a head, a power "
                  "of two of them within a warp, the warps' sums in the score tile)");
    MODEL_REQUIRE(MODEL_KV_MUL <= MODEL_ATT_MAX_GROUP && MODEL_KV_MUL <= MODEL_ATT_THREADS / WARP_SIZE, ERR_DEVICE,
                  "--device cuda: needs at most 8 query heads per KV head (a GQA group's heads fit one attention block)");
    MODEL_REQUIRE(MV_SMEM_BYTES(MODEL_DIM) <= 200 * 1024, ERR_DEVICE,
                  "--device cuda: needs hidden_size at most 51200 (the norm'd matvecs stage their input in shared memory)");
    MODEL_REQUIRE(QKV_SMEM_BYTES(w_qkv, MODEL_DIM) <= 227 * 1024, ERR_DEVICE,
                  "--device cuda: QKV's staged input and cp.async row steps need more than 227 KB of shared memory a "
                  "block (build with make PLAN=qkv_async=0)");
    MODEL_REQUIRE(MV_SMEM_BYTES(MODEL_Q_DIM) <= 227 * 1024, ERR_DEVICE,
                  "--device cuda: needs num_attention_heads * head_dim at most 58112 (o_proj stages its input in shared "
                  "memory)");
    MODEL_REQUIRE(MV_SMEM_BYTES(MODEL_HIDDEN_DIM) <= 200 * 1024, ERR_DEVICE,
                  "--device cuda: needs intermediate_size at most 51200 (down_proj stages its input in shared memory)");
    MODEL_REQUIRE(!(MODEL_ATT_O_POLL && MODEL_Q_DIM > POLL_MAX_FLOATS) && !(MODEL_DOWN_POLL && MODEL_HIDDEN_DIM > POLL_MAX_FLOATS), ERR_DEVICE,
                  "--device cuda: a polled input (MODEL_ATT_O_POLL, MODEL_DOWN_POLL) of more than 65536 values; build with "
                  "them off (-D...=0)");
    int n_dev = 0;
    cudaError_t e = cudaGetDeviceCount(&n_dev);
    if (e != cudaSuccess || n_dev == 0)
        return err_set(ERR_DEVICE, "--device cuda: no CUDA device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    if (prop.major * 10 + prop.minor < MODEL_CUDA_ARCH)
        return err_set(ERR_DEVICE, "--device cuda: %s is compute capability %d.%d; this binary was built for sm_%d (make CUDA_ARCH=...)",
                       prop.name, prop.major, prop.minor, MODEL_CUDA_ARCH);
    if (MODEL_DIM % 4 || MODEL_DIM > RMS_MAX_DIM) /* the prompt's RMSNorm: whole float4s a thread holds (generic build) */
        return err_set(ERR_DEVICE, "--device cuda: a hidden size of %d; the prompt's RMSNorm takes multiples of 4 up to %d",
                       MODEL_DIM, RMS_MAX_DIM);
    model_cuda *m = (model_cuda *)calloc(1, sizeof *m);
    if (!m) return err_set(ERR_NOMEM, "CUDA state");
    m->ctx = ctx;
    m->kv = kv;
    const int sms = prop.multiProcessorCount;
    set_decode_carveout(); /* before the occupancy queries below, which count with it */
    if (kv == KV_Q8) set_kv_kernels<kv_q8>(m, sms);
    else set_kv_kernels<kv_f16>(m, sms);
    m->grid_o = one_wave((const void *)o_proj_residual_kernel<false>, MODEL_GRID_O, MV_SMEM_BYTES(MODEL_Q_DIM), sms);
    CUDA_CHECK(cudaFuncSetAttribute((const void *)o_proj_residual_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)MV_SMEM_BYTES(MODEL_Q_DIM)));
    m->grid_gate_up = one_wave((const void *)rmsnorm_gate_up_silu_kernel, MODEL_GRID_GATE_UP,
                               MV_SMEM_BYTES(MODEL_DIM), sms);
    m->grid_down = one_wave((const void *)down_residual_kernel, MODEL_GRID_DOWN, MV_SMEM_BYTES(MODEL_HIDDEN_DIM), sms);
    m->grid_lm_head = one_wave((const void *)rmsnorm_lm_head_argmax_kernel, MODEL_GRID_LM_HEAD, MV_SMEM_BYTES(MODEL_DIM), sms);
#if MODEL_MLP_FUSED
    { /* one block an SM: its units are the SM's share of the hidden size */
        CUDA_CHECK(cudaFuncSetAttribute((const void *)mlp_fused_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)MLP_SMEM_BYTES(MODEL_DIM)));
        int per_sm = 0;
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, (const void *)mlp_fused_kernel, MLP_THREADS, MLP_SMEM_BYTES(MODEL_DIM)));
        if (per_sm < 1) {
            free(m);
            return err_set(ERR_DEVICE, "--device cuda: the fused MLP kernel (%zu bytes of shared memory) does not fit an SM of %s; build with make PLAN=mlp_fused=0",
                           (size_t)MLP_SMEM_BYTES(MODEL_DIM), prop.name);
        }
        m->grid_mlp = sms < MODEL_HIDDEN_DIM ? sms : MODEL_HIDDEN_DIM;
    }
#endif
    /* splits: enough blocks to fill the GPU, and no split longer than one attention tile */
    m->n_splits = MODEL_ATT_MIN_SPLITS > (ctx + ATT_TILE - 1) / ATT_TILE ? MODEL_ATT_MIN_SPLITS : (ctx + ATT_TILE - 1) / ATT_TILE;
    if (m->n_splits > ATT_TILE / 2) { /* the combining block keeps two floats a split and head in its score tile */
        const int splits = m->n_splits;
        free(m);
        return err_set(ERR_DEVICE, "--device cuda: a context of %d tokens needs %d attention splits, at most %d fit (--ctx %d at most)",
                       ctx, splits, ATT_TILE / 2, ATT_TILE / 2 * ATT_TILE);
    }

    size_t offsets[MODEL_N_TENSORS], total = 0;
    for (int t = 0; t < MODEL_N_TENSORS; t++) {
        size_t bytes = tensor_bytes(t);
        offsets[t] = total;
        total += (bytes + 255) / 256 * 256; /* every tensor 256-byte aligned: 16-byte loads everywhere */
    }
    /* each of the keys and the values: kv_q8's int8 elements and fp32 scales, or fp16 elements */
    const size_t cache_elems = (size_t)MODEL_N_LAYERS * ctx * MODEL_KV_DIM, cache_scales = (size_t)MODEL_N_LAYERS * ctx * MODEL_N_KV_HEADS;
    const size_t cache = kv == KV_Q8 ? cache_elems + cache_scales * sizeof(float) : cache_elems * sizeof(uint16_t);
    const size_t kv_stage = kv == KV_Q8 ? (size_t)PREFILL_BATCH * 2 * MODEL_KV_DIM * sizeof(float) : 0;
    size_t scratch = (size_t)(PREFILL_BATCH * (MODEL_DIM + 2 * MODEL_Q_DIM + MODEL_HIDDEN_DIM) + MODEL_VOCAB_SIZE) * sizeof(float) +
                     (size_t)(1 + PREFILL_BATCH) * MODEL_N_HEADS * m->n_splits * (MODEL_HEAD_DIM + 2) * sizeof(float) + m->grid_lm_head * sizeof(float2) +
                     (size_t)PREFILL_MAX_QKV_PARTS * PREFILL_BATCH * QKV_PAIRS * sizeof(float2) +
                     (size_t)PREFILL_MAX_X_PARTS * PREFILL_BATCH * MODEL_DIM * sizeof(float) +
                     (size_t)PREFILL_TERMS * PREFILL_BATCH * MODEL_Q_DIM * sizeof(uint16_t);
    size_t free_b, total_b;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    const size_t down_t = MODEL_MLP_FUSED ? (size_t)MODEL_N_LAYERS * MODEL_HIDDEN_DIM * MODEL_DIM * sizeof(uint16_t) : 0;
    scratch += MODEL_MLP_FUSED ? 2 * MODEL_DIM * sizeof(float) : 0;
    size_t need = total + down_t + 2 * cache + kv_stage + scratch + ((size_t)256 << 20); /* and room for the graphs and the runtime */
    if (need > free_b) {
        free(m);
        return err_set(ERR_DEVICE, "--device cuda: weights (%.2f GB) and a KV cache of %d tokens (%.2f GB) need %.2f GB, %s has %.2f GB free (lower --ctx)",
                       (total + down_t) / 1e9, ctx, 2 * cache / 1e9, need / 1e9, prop.name, free_b / 1e9);
    }
    CUDA_CHECK(cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaMalloc(&m->arena, total));
    err_code rc = upload(m, data, offsets, total);
    if (rc) { model_cuda_free(m); return rc; }
    const void *dev[MODEL_N_TENSORS];
    for (int t = 0; t < MODEL_N_TENSORS; t++) dev[t] = (const char *)m->arena + offsets[t];
    model_weights_bind(&m->w, dev);
    bind_formats(&m->dw, &m->w);
#if MODEL_MLP_FUSED
    CUDA_CHECK(cudaMalloc(&m->down_t, down_t));
    for (int l = 0; l < MODEL_N_LAYERS; l++)
        transpose_words_kernel<<<dim3(MODEL_HIDDEN_DIM / 32, MODEL_DIM / 32), dim3(32, 8), 0, m->stream>>>(
            m->w.layers[l].w_down, m->down_t + (size_t)l * MODEL_HIDDEN_DIM * MODEL_DIM, MODEL_DIM, MODEL_HIDDEN_DIM);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaStreamSynchronize(m->stream));
    for (int i = 0; i < 2; i++) {
        CUDA_CHECK(cudaMalloc(&m->x_mlp[i], MODEL_DIM * sizeof(float)));
        CUDA_CHECK(cudaMemset(m->x_mlp[i], 0, MODEL_DIM * sizeof(float)));
    }
#endif

    /* PREFILL_BATCH rows each for a prefill batch; a decode step uses the first */
    CUDA_CHECK(cudaMalloc(&m->x, (size_t)PREFILL_BATCH * MODEL_DIM * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&m->q, (size_t)PREFILL_BATCH * MODEL_Q_DIM * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&m->att, (size_t)PREFILL_BATCH * MODEL_Q_DIM * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&m->att_poll, MODEL_Q_DIM * sizeof(float)));
    CUDA_CHECK(cudaMemset(m->att_poll, 0xFF, MODEL_Q_DIM * sizeof(float))); /* ATT_POLL_WORD */
    CUDA_CHECK(cudaMalloc(&m->hb, (size_t)PREFILL_BATCH * MODEL_HIDDEN_DIM * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&m->hb_poll, MODEL_HIDDEN_DIM * sizeof(float)));
    CUDA_CHECK(cudaMemset(m->hb_poll, 0xFF, MODEL_HIDDEN_DIM * sizeof(float))); /* ATT_POLL_WORD */
    CUDA_CHECK(cudaMalloc(&m->prefill_x_terms, (size_t)PREFILL_TERMS * PREFILL_BATCH * MODEL_DIM * sizeof(uint16_t)));
    CUDA_CHECK(cudaMalloc(&m->prefill_hb_terms, (size_t)PREFILL_TERMS * PREFILL_BATCH * MODEL_HIDDEN_DIM * sizeof(uint16_t)));
    CUDA_CHECK(cudaMalloc(&m->prefill_part_x, (size_t)PREFILL_MAX_X_PARTS * PREFILL_BATCH * MODEL_DIM * sizeof(float)));
    m->gate_up_gemm = PREFILL_GATE_UP_GEMM == 2 || 4 * gemm_tiles(MODEL_HIDDEN_DIM) >= 3 * sms;
#if CUDA_QUANTIZED
    CUDA_CHECK(cudaMalloc(&m->prompt_w, PROMPT_LAYER * sizeof(uint16_t)));
    m->dequant_blocks = 8 * sms; /* 8 blocks of DEQUANT_THREADS: an SM's 2048 threads */
#endif
    prefill_gemm_smem<PREFILL_BATCH>();
#if GEMM_TMA
    const int wide_blocks = TMA_BLOCKS(MODEL_HIDDEN_DIM, 2);
    m->gate_up_wide = GATE_UP_TMA_WIDE == 2 || (wide_blocks >= sms && wide_blocks <= 2 * sms);
    if (m->gate_up_gemm) { /* the maps only where gate/up runs as a GEMM */
        m->tma_maps = (CUtensorMap *)aligned_alloc(64, (2 * MODEL_N_LAYERS + PREFILL_SIZES) * sizeof(CUtensorMap));
        if (!m->tma_maps) {
            model_cuda_free(m);
            return err_set(ERR_NOMEM, "--device cuda: out of memory for the tensor maps");
        }
        for (int l = 0; l < MODEL_N_LAYERS; l++) {
#if CUDA_QUANTIZED
            const model_layer_weights w = prompt_layer(m, l); /* every layer's at the same place */
#else
            const model_layer_weights &w = m->w.layers[l];
#endif
            m->tma_maps[2 * l] = tensor_map_2d(w.w_gate, MODEL_HIDDEN_DIM, MODEL_DIM, 8);
            m->tma_maps[2 * l + 1] = tensor_map_2d(w.w_up, MODEL_HIDDEN_DIM, MODEL_DIM, 8);
        }
        for (int s = 0; s < PREFILL_SIZES; s++) /* the input terms (PREFILL_TERMS, B, dim) as one matrix */
            m->tma_maps[2 * MODEL_N_LAYERS + s] = tensor_map_2d(m->prefill_x_terms, PREFILL_TERMS * (PREFILL_BATCH >> s),
                                                                MODEL_DIM, PREFILL_TERMS * (PREFILL_BATCH >> s));
    }
#endif
    prefill_split_counts<PREFILL_BATCH>(m, sms);
    int qkv_rows = 0; /* rows of QKV's partial sums: splits B at most */
    for (int s = 0; s < PREFILL_SIZES; s++) qkv_rows = std::max(qkv_rows, m->qkv_splits[s] * (PREFILL_BATCH >> s));
    /* o_proj's input as terms */
    CUDA_CHECK(cudaMalloc(&m->prefill_att_terms, (size_t)PREFILL_TERMS * PREFILL_BATCH * MODEL_Q_DIM * sizeof(uint16_t)));
    CUDA_CHECK(cudaMalloc(&m->prefill_part_qkv, (size_t)qkv_rows * QKV_PAIRS * sizeof(float2)));
    CUDA_CHECK(cudaMalloc(&m->prefill_part_acc, (size_t)PREFILL_BATCH * MODEL_N_HEADS * m->n_splits * MODEL_HEAD_DIM * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&m->prefill_part_ml, (size_t)PREFILL_BATCH * MODEL_N_HEADS * m->n_splits * 2 * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&m->prefill_counters, (size_t)PREFILL_BATCH * MODEL_N_KV_HEADS * sizeof(unsigned)));
    CUDA_CHECK(cudaMemset(m->prefill_counters, 0, (size_t)PREFILL_BATCH * MODEL_N_KV_HEADS * sizeof(unsigned)));
    CUDA_CHECK(cudaMalloc(&m->logits, MODEL_VOCAB_SIZE * sizeof(float)));
    if (kv == KV_Q8) {
        CUDA_CHECK(cudaMalloc(&m->key_cache, cache_elems));
        CUDA_CHECK(cudaMalloc(&m->value_cache, cache_elems));
        CUDA_CHECK(cudaMalloc(&m->key_scales, cache_scales * sizeof(float)));
        CUDA_CHECK(cudaMalloc(&m->value_scales, cache_scales * sizeof(float)));
        CUDA_CHECK(cudaMalloc(&m->kv_stage, kv_stage));
    } else {
        CUDA_CHECK(cudaMalloc(&m->key_cache, cache_elems * sizeof(uint16_t)));
        CUDA_CHECK(cudaMalloc(&m->value_cache, cache_elems * sizeof(uint16_t)));
    }
    CUDA_CHECK(cudaMalloc(&m->part_acc, (size_t)MODEL_N_HEADS * m->n_splits * MODEL_HEAD_DIM * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&m->part_ml, (size_t)MODEL_N_HEADS * m->n_splits * 2 * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&m->counters, CTR_COUNT * sizeof(unsigned)));
    CUDA_CHECK(cudaMemset(m->counters, 0, CTR_COUNT * sizeof(unsigned)));
    CUDA_CHECK(cudaMalloc(&m->block_best, m->grid_lm_head * sizeof(float2)));
    CUDA_CHECK(cudaMalloc(&m->io, IO_INTS * sizeof(int)));
    CUDA_CHECK(cudaMemset(m->io, 0, IO_INTS * sizeof(int)));
    CUDA_CHECK(cudaMalloc(&m->history, (size_t)ctx * sizeof(int)));
    CUDA_CHECK(cudaMemset(m->history, 0, (size_t)ctx * sizeof(int)));
    CUDA_CHECK(cudaHostAlloc(&m->chosen, (size_t)ctx * sizeof(int), cudaHostAllocMapped));
    CUDA_CHECK(cudaHostGetDevicePointer(&m->chosen_dev, m->chosen, 0));
    for (int i = 0; i < STEP_RING; i++) CUDA_CHECK(cudaEventCreateWithFlags(&m->done[i], cudaEventDisableTiming));
    CUDA_CHECK(cudaMalloc(&m->first_seen, MODEL_VOCAB_SIZE * sizeof(int)));
    CUDA_CHECK(cudaMemset(m->first_seen, 0x7F, MODEL_VOCAB_SIZE * sizeof(int)));
    CUDA_CHECK(cudaMalloc(&m->params, sizeof(sample_params)));
    CUDA_CHECK(cudaMalloc(&m->rng, 2 * sizeof(unsigned long long)));
    CUDA_CHECK(cudaMemset(m->rng, 0, 2 * sizeof(unsigned long long)));
    CUDA_CHECK(cudaHostAlloc(&m->logits_host, MODEL_VOCAB_SIZE * sizeof(float), cudaHostAllocDefault));
    CUDA_CHECK(cudaMemcpyToSymbol(rope_inv_freq, model_rope_inv_freq, MODEL_HEAD_DIM / 2 * sizeof(float)));
#if MODEL_GENERIC
    CUDA_CHECK(cudaMemcpyToSymbol(model_dev, &model_rt, sizeof model_rt)); /* the dimensions, for device code */
#endif
    /* Where the context allows more than MODEL_ATT_MIN_SPLITS splits, a second set of graphs launches only
     * MODEL_ATT_MIN_SPLITS a KV head for steps and batches that read at most MODEL_ATT_MIN_SPLITS tiles: the
     * attention body takes no more for them anyway, and the rest of the blocks (1B shape: 1016 of
     * 1024 a layer at depth 0) would each read the position and leave, between QKV and o_proj. 1B:
     * prompt +16%, decode even (docs/performance.md, D32). */
    m->short_positions = m->n_splits > MODEL_ATT_MIN_SPLITS ? MODEL_ATT_MIN_SPLITS * ATT_TILE : 0;
    /* the prompt's least split: the tensor cores' flash kernel takes at least FMMA_MIN_CHUNK */
#if MODEL_PREFILL_FLASH
    const int least_chunk = m->n_splits <= FLASH_MAX_SPLITS(MODEL_HEAD_DIM) && FMMA_MIN_CHUNK > PREFILL_MIN_CHUNK
                                ? FMMA_MIN_CHUNK : PREFILL_MIN_CHUNK;
#else
    const int least_chunk = PREFILL_MIN_CHUNK;
#endif
    m->few_positions = m->n_splits > PREFILL_FEW_SPLITS ? PREFILL_FEW_SPLITS * least_chunk : 0;
#if ATT_SHORT_BUILT
    if (MODEL_ATT_SHORT) {
    /* The short context's kernel takes a split of at most att_short_max positions. Where that is no
     * less than a split's least (ATT_MIN_CHUNK: heads of 64), it runs in MODEL_ATT_MIN_SPLITS splits (no
     * more than its shared memory holds the (max, sum) of in the combine) up to where their length
     * passes it, as attention_body's rule cuts them (att_split_len: while a split's length is
     * MODEL_ATT_MIN_SPLITS' share); else in one, up to att_short_max positions. */
    m->short_kernel_splits = 1;
    if (ATT_MIN_CHUNK <= att_short_max(MODEL_HEAD_DIM))
        m->short_kernel_splits = std::min({m->n_splits, MODEL_ATT_MIN_SPLITS, att_short_max(MODEL_HEAD_DIM) / 2});
    m->short_kernel_positions = m->short_kernel_splits * att_short_max(MODEL_HEAD_DIM);
    /* The steps that one split holds launch it in one: the other splits' blocks (256 of 264 on the
     * 1B at depth 0) would find no positions and leave, yet still take their launch's time and the
     * SMs' slots as o_proj's blocks land (1B +0.2-0.3% at depth 0; docs/performance.md, D68) */
    m->one_split_positions = m->short_kernel_splits > 1 ? att_short_max(MODEL_HEAD_DIM) : 0;
    }
#endif
    /* the graphs of each tier (model_cuda's graphs, prefill, prefill_last), then the choices */
    for (int s = 0; s < DECODE_TIERS && !rc; s++) {
        if ((s == 1 && !m->short_positions) || (s == 3 && !m->one_split_positions)) continue;
        for (int kind = 0; kind < STEP_KINDS && !rc; kind++)
            if (s != 2 || m->short_kernel_positions)
                rc = capture(m, &m->graphs[s][kind],
                             [&] { enqueue_step(m, kind, tier_splits(m, s, false), tier_short_kernel(s), NULL, NULL); });
        for (int b = 0; b < 2 * PREFILL_SIZES && s < PREFILL_TIERS && !rc; b++)
            if (s != 2 || m->few_positions)
                rc = capture(m, b < PREFILL_SIZES ? &m->prefill[s][b] : &m->prefill_last[s][b - PREFILL_SIZES], [&] {
                    enqueue_prefill_size<PREFILL_BATCH>(m, b % PREFILL_SIZES, tier_splits(m, s, true), b >= PREFILL_SIZES);
                });
    }
    for (int kind = STEP_PROMPT + 1; kind < STEP_KINDS && !rc; kind++)
        rc = capture(m, &m->choose[kind], [&] {
            launch_marks none = {NULL, NULL, m->stream, 0};
            enqueue_choice(m, kind, none, m->x); /* prefill_last put the last token's row in x */
        });
    if (rc) {
        model_cuda_free(m);
        return rc;
    }
    *out = m;
    return ERR_OK;
}

extern "C" err_code model_cuda_set_sampler(model_cuda *m, const sampler *s) {
    const sampler_config *c = &s->cfg;
    m->sampling = !(c->temperature == 0.0f && c->repeat_penalty == 1.0f); /* else the LM head's argmax is the answer */
    sample_params p = {c->temperature > 0 ? 1.0f / c->temperature : 0.0f, c->top_k, c->top_p, c->min_p, c->repeat_penalty,
                       c->repeat_last_n};
    unsigned long long rng = s->rng_state;
    CUDA_CHECK(cudaMemcpy(m->params, &p, sizeof p, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(m->rng, &rng, sizeof rng, cudaMemcpyHostToDevice));
    return ERR_OK;
}

#if defined(INGOT_TRACE)
/* The last step's trace records into $INGOT_TRACE_FILE: int32 n_layers, ST_COUNT, the stages' block
 * counts, then each stage's records (4 uint64 ns each; tests/bench/step_trace.py). */
static void trace_write(void) {
    const char *path = getenv("INGOT_TRACE_FILE");
    unsigned count[TRACE_STAGES];
    if (!path || cudaMemcpyFromSymbol(count, trace_count, sizeof count) != cudaSuccess) return;
    FILE *f = fopen(path, "wb");
    if (!f) { fprintf(stderr, "ingot: %s: cannot write the trace\n", path); return; }
    const int head[3] = {MODEL_N_LAYERS, TRACE_STAGES, TRACE_STAMPS};
    fwrite(head, sizeof head, 1, f);
    fwrite(count, sizeof count, 1, f);
    static trace_block recs[TRACE_BLOCKS];
    for (int st = 0; st < TRACE_STAGES; st++) {
        unsigned n = count[st] < TRACE_BLOCKS ? count[st] : TRACE_BLOCKS;
        CUDA_CHECK(cudaMemcpyFromSymbol(recs, trace_buf, n * sizeof(trace_block), (size_t)st * TRACE_BLOCKS * sizeof(trace_block)));
        fwrite(recs, sizeof(trace_block), n, f);
    }
    fclose(f);
}
#endif

/* 1 where a step or batch whose attention reads at most `positions` takes the [1] graphs */
static int short_att(const model_cuda *m, int positions) { return positions <= m->short_positions; }

/* The graphs a prefill batch whose attention reads at most `positions` takes: [2], [1] or [0] */
static int prefill_tier(const model_cuda *m, int positions) {
    return positions <= m->few_positions ? 2 : short_att(m, positions);
}

/* The same for a decode step */
static int decode_tier(const model_cuda *m, int positions) {
    return positions <= m->one_split_positions ? 3 : positions <= m->short_kernel_positions ? 2 : short_att(m, positions);
}

/* Queues one step of the given kind at position m->queued (the device's io[IO_POS] by then): the
 * whole step, or with `chosen` only its choice (m->choose), after a batch that ended with its token
 * (m->prefill_last). */
static void queue_step(model_cuda *m, int kind, bool chosen = false) {
#if defined(INGOT_TRACE)
    static const unsigned zero[TRACE_STAGES] = {0};
    if (!chosen) CUDA_CHECK(cudaMemcpyToSymbolAsync(trace_count, zero, sizeof zero, 0, cudaMemcpyHostToDevice, m->stream));
#endif
    CUDA_CHECK(cudaGraphLaunch(chosen ? m->choose[kind] : m->graphs[decode_tier(m, m->queued + 1)][kind], m->stream));
    if (kind != STEP_PROMPT) {
        m->kind_at[m->queued % STEP_RING] = kind;
        CUDA_CHECK(cudaEventRecord(m->done[m->queued % STEP_RING], m->stream));
    }
    m->chose_last = kind != STEP_PROMPT;
    m->queued++;
}

/* Callers' mistakes in the queue's use: a one-line error, nothing queued. */
#define QUEUE_REQUIRE(cond, code, ...) \
    do { if (!(cond)) return err_set(code, __VA_ARGS__); } while (0)

extern "C" err_code model_cuda_feed(model_cuda *m, const int *tokens, int n, int pos, int out) {
    QUEUE_REQUIRE(m->taken == m->queued, ERR_ARG, "model_cuda_feed: %d queued steps not taken", m->queued - m->taken);
    QUEUE_REQUIRE(n >= 1 && pos >= 0 && pos + n <= m->ctx, ERR_CONTEXT, "model_cuda_feed: %d tokens at position %d do not fit a context of %d",
                  n, pos, m->ctx);
    /* from pageable memory: both copies have read their source when the calls return */
    CUDA_CHECK(cudaMemcpyAsync(m->history + pos, tokens, (size_t)n * sizeof(int), cudaMemcpyHostToDevice, m->stream));
    CUDA_CHECK(cudaMemcpyAsync(m->io + IO_POS, &pos, sizeof pos, cudaMemcpyHostToDevice, m->stream));
    m->queued = pos;
    const int kind = out == CUDA_OUT_LOGITS ? STEP_LOGITS : out == CUDA_OUT_TOKEN ? (m->sampling ? STEP_SAMPLE : STEP_ARGMAX) : STEP_PROMPT;
    /* Full batches while more than PREFILL_BATCH tokens are left, then one batch of the smallest
     * size that covers the rest (PREFILL_BATCH >> s, at least PREFILL_MIN_TAIL tokens; fewer go as
     * steps). A batch streams every weight once, so below the full size its cost hardly grows with
     * its tokens: on the 1B shape 1.15-1.37 ms from 8 to 64 with the last token in it. Covering the
     * rest in one batch beat the thresholds before it (batches of the largest size the tokens left
     * reached: 9 as 8 + a step, 17-24 as 16 + 8, 40 as 32 + 8, 65 as 64 + a step, 80 as 64 + 16) at
     * every prompt length measured: 1B +13% to +74%, 7B +23% to +83% (docs/performance.md, D97). A
     * batch that takes the last token runs its last layer through when that token chooses
     * (prefill_last), and its choice follows: the LM head on its row. */
    auto prefill_from = [](int size) { return size > PREFILL_SMALL ? size / 2 + 1 : PREFILL_MIN_TAIL; };
    int i = 0;
    bool chosen = false; /* the last batch took the last token, which chooses */
    for (int count; n - i >= PREFILL_MIN_TAIL; i += count) {
        const int left = n - i;
        int s = 0;
        while (left < prefill_from(PREFILL_BATCH >> s)) s++; /* ends at 8, whose threshold is PREFILL_MIN_TAIL */
        const int b = PREFILL_BATCH >> s;
        count = left < b ? left : b;
        chosen = count == left && kind != STEP_PROMPT;
        CUDA_CHECK(cudaMemcpyAsync(m->io + IO_COUNT, &count, sizeof count, cudaMemcpyHostToDevice, m->stream));
        CUDA_CHECK(cudaGraphLaunch((chosen ? m->prefill_last : m->prefill)[prefill_tier(m, m->queued + b)][s], m->stream));
        m->queued += chosen ? count - 1 : count;
    }
    for (; i < n - 1; i++) queue_step(m, STEP_PROMPT);
    m->taken = m->queued; /* only the last step can have a token to take */
    if (chosen) queue_step(m, kind, true);
    else if (i < n) queue_step(m, kind);
    if (kind == STEP_PROMPT) m->taken = m->queued;
    return ERR_OK;
}

extern "C" err_code model_cuda_feed_choice(model_cuda *m) {
    QUEUE_REQUIRE(m->chose_last, ERR_ARG, "model_cuda_feed_choice: the last step queued chose no token");
    QUEUE_REQUIRE(m->queued - m->taken < STEP_RING, ERR_ARG, "model_cuda_feed_choice: %d steps queued, at most %d",
                  m->queued - m->taken, STEP_RING);
    QUEUE_REQUIRE(m->queued < m->ctx, ERR_CONTEXT, "model_cuda_feed_choice: the context of %d is full", m->ctx);
    queue_step(m, m->sampling ? STEP_SAMPLE : STEP_ARGMAX);
    return ERR_OK;
}

extern "C" err_code model_cuda_take(model_cuda *m, int *next, const float **logits) {
    QUEUE_REQUIRE(m->taken < m->queued, ERR_ARG, "model_cuda_take: no step queued");
    const int pos = m->taken++;
    CUDA_CHECK(cudaEventSynchronize(m->done[pos % STEP_RING]));
    *next = ((volatile int *)m->chosen)[pos];
    if (logits) *logits = m->kind_at[pos % STEP_RING] == STEP_LOGITS ? m->logits_host : NULL;
    if (*next < 0 || *next >= MODEL_VOCAB_SIZE)
        return err_set(ERR_DEVICE, "--device cuda: the step at position %d chose no token (%d): its logits are not finite", pos, *next);
    return ERR_OK;
}

extern "C" err_code model_cuda_unqueue(model_cuda *m) {
    QUEUE_REQUIRE(m->taken < m->queued, ERR_ARG, "model_cuda_unqueue: no step queued");
    /* the sampler keeps one earlier state: only a step that chose, and the newest, can be dropped */
    QUEUE_REQUIRE(m->chose_last, ERR_ARG, "model_cuda_unqueue: the newest step chose no token or was dropped already");
    const int pos = --m->queued;
    CUDA_CHECK(cudaStreamSynchronize(m->stream));
    if (m->kind_at[pos % STEP_RING] == STEP_SAMPLE) /* its draw never happened: the generator as before it */
        CUDA_CHECK(cudaMemcpy(m->rng, m->rng + 1, sizeof *m->rng, cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaMemcpy(m->io + IO_POS, &pos, sizeof pos, cudaMemcpyHostToDevice));
    m->chose_last = 0; /* the next step needs its token fed */
    return ERR_OK;
}

/* Times every stage of the step at position pos, launch by launch with events between them (so no
 * overlap between kernels, unlike the graph), best of reps per launch, and prints per stage: launches,
 * microseconds per token, bytes read and GB/s. */
/* enqueue(events, stage_of) reps times, each launch's best time kept, then a table of the stages'
 * sums: launches, µs, MB (bytes[stage] a launch) and GB/s, "per" what one run of enqueue is. */
template <typename Enqueue>
static void stage_table(model_cuda *m, int reps, int n_launches, int n_stages, const char *const *names,
                        const double *bytes, const char *per, FILE *out, Enqueue enqueue) {
    cudaEvent_t *events = (cudaEvent_t *)malloc((size_t)(n_launches + 1) * sizeof *events);
    int *stage_of = (int *)malloc((size_t)n_launches * sizeof *stage_of);
    float *best = (float *)malloc((size_t)n_launches * sizeof *best);
    double *us = (double *)calloc((size_t)n_stages, sizeof *us);
    int *calls = (int *)calloc((size_t)n_stages, sizeof *calls);
    if (!events || !stage_of || !best || !us || !calls) {
        fprintf(stderr, "ingot: kernel benchmark: out of memory\n");
        exit(1);
    }
    for (int i = 0; i <= n_launches; i++) CUDA_CHECK(cudaEventCreate(&events[i]));
    for (int i = 0; i < n_launches; i++) best[i] = 1e30f;
    for (int r = 0; r < reps; r++) {
        enqueue(events, stage_of);
        CUDA_CHECK(cudaStreamSynchronize(m->stream));
        for (int i = 0; i < n_launches; i++) {
            float ms;
            CUDA_CHECK(cudaEventElapsedTime(&ms, events[i], events[i + 1]));
            if (ms < best[i]) best[i] = ms;
        }
    }
    double total = 0;
    for (int i = 0; i < n_launches; i++) {
        us[stage_of[i]] += best[i] * 1e3;
        calls[stage_of[i]]++;
        total += best[i] * 1e3;
    }
    char us_per[32], mb_per[32];
    snprintf(us_per, sizeof us_per, "us/%s", per);
    snprintf(mb_per, sizeof mb_per, "MB/%s", per);
    fprintf(out, "  %-24s %8s %12s %10s %8s\n", "stage", "launches", us_per, mb_per, "GB/s");
    for (int st = 0; st < n_stages; st++) {
        if (!calls[st]) continue; /* a one-layer model's prefill has no attention launch */
        const double b = bytes[st] * calls[st];
        fprintf(out, "  %-24s %8d %12.1f %10.2f %8.0f\n", names[st], calls[st], us[st], b / 1e6, b / (us[st] * 1e3));
    }
    fprintf(out, "  %-24s %8d %12.1f\n", "total", n_launches, total);
    for (int i = 0; i <= n_launches; i++) cudaEventDestroy(events[i]);
    free(events), free(stage_of), free(best), free(us), free(calls);
}

/* What the boundary between two steps' graphs costs: BOUNDARY_STEPS greedy steps from pos captured
 * in one graph (each step's launches chained to the last step's by programmatic dependent launch,
 * as a step's stages are) against as many launches of the one-step graph back to back, best of reps
 * each, in µs a token. Where the steps would cross into another graph tier, nothing. */
#define BOUNDARY_STEPS 8
static void graph_boundary_bench(model_cuda *m, int pos, int reps, FILE *out) {
    const int tier = decode_tier(m, pos + 1);
    if (pos + BOUNDARY_STEPS + 1 > m->ctx || decode_tier(m, pos + BOUNDARY_STEPS) != tier) return;
    cudaGraph_t graph;
    cudaGraphExec_t steps;
    CUDA_CHECK(cudaStreamBeginCapture(m->stream, cudaStreamCaptureModeThreadLocal));
    for (int k = 0; k < BOUNDARY_STEPS; k++)
        enqueue_step(m, STEP_ARGMAX, tier_splits(m, tier, false), tier_short_kernel(tier), NULL, NULL);
    CUDA_CHECK(cudaStreamEndCapture(m->stream, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&steps, graph, 0));
    cudaGraphDestroy(graph);
    cudaEvent_t t0, t1;
    CUDA_CHECK(cudaEventCreate(&t0));
    CUDA_CHECK(cudaEventCreate(&t1));
    float best[2] = {1e30f, 1e30f}; /* [0]: one graph of the steps, [1]: a graph a step */
    for (int r = 0; r < reps; r++)
        for (int form = 0; form < 2; form++) {
            CUDA_CHECK(cudaMemcpy(m->io + IO_POS, &pos, sizeof pos, cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaEventRecord(t0, m->stream));
            if (form == 0) CUDA_CHECK(cudaGraphLaunch(steps, m->stream));
            else
                for (int k = 0; k < BOUNDARY_STEPS; k++) CUDA_CHECK(cudaGraphLaunch(m->graphs[tier][STEP_ARGMAX], m->stream));
            CUDA_CHECK(cudaEventRecord(t1, m->stream));
            CUDA_CHECK(cudaEventSynchronize(t1));
            float ms;
            CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
            if (ms < best[form]) best[form] = ms;
        }
    fprintf(out, "steps at depth %d, %d greedy steps (best of %d): in one graph %.1f us/token, a graph a step %.1f us/token\n",
            pos, BOUNDARY_STEPS, reps, best[0] * 1e3 / BOUNDARY_STEPS, best[1] * 1e3 / BOUNDARY_STEPS);
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    cudaGraphExecDestroy(steps);
}

extern "C" err_code model_cuda_kernel_bench(model_cuda *m, int pos, int reps, FILE *out) {
#define ROWS_BYTES(rows, f, n) ((double)(rows) * quant_row_size(f, n)) /* of rows rows of n weights of format f */
    const double qkv = ROWS_BYTES(MODEL_Q_DIM, MODEL_FORMAT_WQ, MODEL_DIM) + ROWS_BYTES(2 * MODEL_KV_DIM, MODEL_FORMAT_WK, MODEL_DIM),
                 o = ROWS_BYTES(MODEL_DIM, MODEL_FORMAT_WO, MODEL_Q_DIM), gate_up = ROWS_BYTES(2 * MODEL_HIDDEN_DIM, MODEL_FORMAT_W_GATE, MODEL_DIM),
                 down = ROWS_BYTES(MODEL_DIM, MODEL_FORMAT_W_DOWN, MODEL_HIDDEN_DIM);
    const double kv_pos = 2.0 * MODEL_KV_DIM * 2.0; /* a position's keys and values, one layer */
    /* the prompt's GEMMs read 16-bit matrices (a quantized model's dequantized a layer a batch: w_prompt) */
    const double prompt_qkv = CUDA_QUANTIZED ? 2.0 * (MODEL_Q_DIM + 2 * MODEL_KV_DIM) * MODEL_DIM : qkv,
                 prompt_o = CUDA_QUANTIZED ? 2.0 * MODEL_DIM * MODEL_Q_DIM : o,
                 prompt_gate_up = CUDA_QUANTIZED ? 2.0 * 2 * MODEL_HIDDEN_DIM * MODEL_DIM : gate_up,
                 prompt_down = CUDA_QUANTIZED ? 2.0 * MODEL_DIM * MODEL_HIDDEN_DIM : down,
                 prompt_layer_weights = ((double)MODEL_Q_DIM + 2 * MODEL_KV_DIM) * MODEL_DIM + (double)MODEL_DIM * MODEL_Q_DIM +
                                        3.0 * MODEL_HIDDEN_DIM * MODEL_DIM;
    const double bytes[ST_COUNT] = {ROWS_BYTES(1, MODEL_FORMAT_EMBED, MODEL_DIM), qkv, kv_pos * (pos + 1), o, gate_up, down,
                                    ROWS_BYTES(MODEL_VOCAB_SIZE, MODEL_FORMAT_LM_HEAD, MODEL_DIM), gate_up + down};
#undef ROWS_BYTES
    const int token = 1;
    CUDA_CHECK(cudaMemcpy(m->history + pos, &token, sizeof token, cudaMemcpyHostToDevice));
    fprintf(out, "kernels at depth %d (launched one by one, best of %d):\n", pos, reps);
    stage_table(m, reps, STEP_LAUNCHES, ST_COUNT, stage_names, bytes, "token", out, [&](cudaEvent_t *ev, int *stage_of) {
        CUDA_CHECK(cudaMemcpy(m->io + IO_POS, &pos, sizeof pos, cudaMemcpyHostToDevice)); /* each step advances it */
        const int tier = decode_tier(m, pos + 1);
        enqueue_step(m, STEP_ARGMAX, tier_splits(m, tier, false), tier_short_kernel(tier), ev, stage_of);
    });
    graph_boundary_bench(m, pos, reps, out);
    /* A prefill batch of each size, full, at positions pos on where the context has room, launched
     * one by one and then as its graph (the prompt's batches' graphs: programmatic dependent
     * launches); the device's io is put back as it was. Attention reads, for the batch's tokens,
     * pos + 1 .. pos + b positions. */
    const int room = std::min(PREFILL_BATCH, m->ctx - pos);
    if (room < PREFILL_SMALL) return ERR_OK;
    int io_saved[IO_INTS], tokens[PREFILL_BATCH];
    for (int i = 0; i < PREFILL_BATCH; i++) tokens[i] = token;
    CUDA_CHECK(cudaMemcpy(io_saved, m->io, sizeof io_saved, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(m->history + pos, tokens, (size_t)room * sizeof(int), cudaMemcpyHostToDevice));
    cudaEvent_t t0, t1;
    CUDA_CHECK(cudaEventCreate(&t0));
    CUDA_CHECK(cudaEventCreate(&t1));
    for (int s = 0; s < PREFILL_SIZES; s++) {
        const int b = PREFILL_BATCH >> s, tier = prefill_tier(m, pos + b);
        if (pos + b > m->ctx) continue;
        auto start = [&]() { /* the batch's end advances the position by b */
            CUDA_CHECK(cudaMemcpy(m->io + IO_POS, &pos, sizeof pos, cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaMemcpy(m->io + IO_COUNT, &b, sizeof b, cudaMemcpyHostToDevice));
        };
        const double pf_bytes[PF_COUNT] = {b * MODEL_DIM * 2.0, CUDA_QUANTIZED ? qkv + o + gate_up + down + 2.0 * prompt_layer_weights : 0.0,
                                           0.0, prompt_qkv, kv_pos * (b * (pos + 1.0) + b * (b - 1) / 2.0), prompt_o, prompt_gate_up,
                                           prompt_down, 0.0};
        fprintf(out, "a prefill batch of %d tokens at depth %d (launched one by one, best of %d; K in %d, %d, %d splits for QKV, o_proj, down):\n",
                b, pos, reps, m->qkv_splits[s], m->o_splits[s], m->down_splits[s]);
        stage_table(m, reps, PREFILL_LAUNCHES, PF_COUNT, prefill_stage_names, pf_bytes, "batch", out,
                    [&](cudaEvent_t *ev, int *stage_of) {
                        start();
                        enqueue_prefill_size<PREFILL_BATCH>(m, s, tier_splits(m, tier, true), false, ev, stage_of);
                    });
        float best = 1e30f;
        for (int r = 0; r < reps; r++) {
            start();
            CUDA_CHECK(cudaEventRecord(t0, m->stream));
            CUDA_CHECK(cudaGraphLaunch(m->prefill[tier][s], m->stream));
            CUDA_CHECK(cudaEventRecord(t1, m->stream));
            CUDA_CHECK(cudaEventSynchronize(t1));
            float ms;
            CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
            best = std::min(best, ms);
        }
        const double weights = (qkv + o + gate_up + down) * (MODEL_N_LAYERS - 1) + qkv; /* the last layer's QKV only */
        fprintf(out, "  as its graph: %.1f us/batch, the layers' weights at %.0f GB/s\n", best * 1e3, weights / (best * 1e6));
    }
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    CUDA_CHECK(cudaMemcpy(m->io, io_saved, sizeof io_saved, cudaMemcpyHostToDevice));
    return ERR_OK;
}

template <typename KV>
static void fill_cache(model_cuda *m, int n_pos) {
    /* positions [0, n_pos) are one run per KV head of a layer */
    const size_t n = (size_t)n_pos * MODEL_HEAD_DIM;
    for (int l = 0; l < MODEL_N_LAYERS; l++)
        for (int h = 0; h < MODEL_N_KV_HEADS; h++) {
            const kv_view<KV> c = kv_layer<KV>(m, l);
            const size_t off = kv_at(0, h, m->ctx, MODEL_HEAD_DIM), s = kv_at(0, h, m->ctx, 1);
            const uint32_t seed = 2 * (l * MODEL_N_KV_HEADS + h);
            fill_cache_kernel<KV><<<1024, 256, 0, m->stream>>>(c.k + off, KV::Q8 ? c.ks + s : NULL, n, n_pos, seed + 1);
            fill_cache_kernel<KV><<<1024, 256, 0, m->stream>>>(c.v + off, KV::Q8 ? c.vs + s : NULL, n, n_pos, seed + 2);
        }
}

extern "C" err_code model_cuda_fill_cache(model_cuda *m, int n_pos) {
    if (m->kv == KV_Q8) fill_cache<kv_q8>(m, n_pos);
    else fill_cache<kv_f16>(m, n_pos);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaStreamSynchronize(m->stream));
    return ERR_OK;
}

extern "C" void model_cuda_free(model_cuda *m) {
    if (!m) return;
#if defined(INGOT_TRACE)
    trace_write();
#endif
    for (int s = 0; s < DECODE_TIERS; s++) {
        for (int kind = 0; kind < STEP_KINDS; kind++)
            if (m->graphs[s][kind]) cudaGraphExecDestroy(m->graphs[s][kind]);
        for (int b = 0; b < PREFILL_SIZES && s < PREFILL_TIERS; b++) {
            if (m->prefill[s][b]) cudaGraphExecDestroy(m->prefill[s][b]);
            if (m->prefill_last[s][b]) cudaGraphExecDestroy(m->prefill_last[s][b]);
        }
    }
    for (int kind = 0; kind < STEP_KINDS; kind++)
        if (m->choose[kind]) cudaGraphExecDestroy(m->choose[kind]);
    for (int i = 0; i < STEP_RING; i++)
        if (m->done[i]) cudaEventDestroy(m->done[i]);
    void *dev[] = {m->arena, m->x, m->q, m->att, m->att_poll, m->hb, m->hb_poll, m->logits, m->key_cache, m->value_cache, m->key_scales, m->value_scales, m->kv_stage, m->part_acc,
                   m->part_ml, m->counters, m->block_best, m->io, m->history, m->first_seen, m->params, m->rng,
                   m->prefill_x_terms, m->prefill_hb_terms, m->prefill_part_x, m->prefill_part_qkv, m->prefill_att_terms, m->prefill_part_acc, m->prefill_part_ml, m->prefill_counters,
                   m->down_t, m->x_mlp[0], m->x_mlp[1], m->prompt_w};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cudaFree(dev[i]);
    cudaFreeHost(m->chosen);
    cudaFreeHost(m->logits_host);
    if (m->stream) cudaStreamDestroy(m->stream);
#if GEMM_TMA
    free(m->tma_maps);
#endif
    free(m);
}
#endif
