/* cuda_step_kernels.cuh - the kernels of the decode step and the prompt path, bound to one model:
 * each stage body (cuda_matvec.cuh, cuda_attention*.cuh, cuda_mlp_fused.cuh, cuda_prefill*.cuh,
 * cuda_sampler.cuh) as a __global__ with this model's constants, its weight formats and its launch
 * bounds. Part of forward_cuda.cu's one translation unit (included once, where it stands there):
 * everything is static, since a generic build links one copy of that file per weight dtype.
 */
// ---------------------------------------------------------------------------------------------
// The matrices' formats: each field's (model_config.h's MODEL_FORMAT_*) as the cores take it
// (cuda_weights.cuh's format_w). q, k and v share one kernel, as do gate and up: one format there,
// or several K formats (w_kany), which a field's layers may mix too (group_w); model_cuda_init
// refuses other mixes and formats with no kernels here (formats_refused). The generic
// build reads dense matrices only (it refuses quantized ones). The prompt path's GEMMs take every
// format (prompt_w below).
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
/* The prompt's GEMMs' tensor-core type (their inputs' terms, w_prompt) and each matrix's format
 * there (prompt_w): a dense model's own; in a quantized model fp16, the block formats' tiles
 * dequantized to it inside the GEMMs (prefill_gemm_body's gemm_q_tiles) and a dense matrix's
 * converted to it (w_as_f16). fp16 rather than bf16, so that a weight d * q keeps 11 significant
 * bits: bf16's 8 would put a relative error of 2^-9 on each weight, near the GPU/CPU tolerance
 * (tests/test_gpu.py). */
#if CUDA_QUANTIZED
using w_prompt = w_f16;
template <typename W>
using prompt_w = std::conditional_t<W::DENSE16, w_as_f16<W>, W>;
#else
using w_prompt = model_w;
template <typename W>
using prompt_w = W;
#endif
#if CUDA_QUANTIZED && MODEL_MLP_FUSED
#error "MODEL_MLP_FUSED: dense matrices only (codegen/plan.py turns it off for quantized models)"
#endif

/* The decode step's and the prompt's weights on the device, each matrix in its format (the
 * generated model_weights holds the same pointers untyped). */
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

static __global__ void __launch_bounds__(RMS_THREADS) prefill_rms_terms_kernel(float *x, const float *part, int parts,
                                                                              const uint16_t *norm_w, uint16_t *terms) {
    prefill_rms_terms_body<w_prompt, RMS_THREADS, RMS_VALS>(x, part, parts, norm_w, terms, MODEL_DIM, MODEL_NORM_EPS);
}

template <int B, typename KV>
static __global__ void __launch_bounds__(256) prefill_qkv_finish_kernel(cuda_layer w, const float2 *part, int splits,
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
 * block. The generic build compiles it for both head widths it takes and picks the model's at run
 * time (MODEL_PREFILL_FLASH is then the plan's rule over the head width it reads), as it does the
 * decode attention. */
#if MODEL_GENERIC
#define PREFILL_FLASH_BUILT 1
#else
#define PREFILL_FLASH_BUILT MODEL_PREFILL_FLASH
#endif
#if PREFILL_FLASH_BUILT
template <int B, int HD, typename KV>
static __global__ void __launch_bounds__(FMMA_THREADS) prefill_flash_kernel(const float *q, kv_view<KV> cache,
                                                                        const int *io, float *part_acc, float *part_ml,
                                                                        unsigned *counters, float *att, int ctx, int n_splits) {
    prefill_flash_mma_body<B, HD>(q, cache, io, part_acc, part_ml, counters, att, MODEL_KV_MUL, MODEL_Q_DIM, MODEL_N_KV_HEADS, ctx,
                                  n_splits, MODEL_ATT_MIN_SPLITS);
}

template <int B, typename KV>
using prefill_flash_kernel_fn = void (*)(const float *, kv_view<KV>, const int *, float *, float *, unsigned *, float *, int, int);

/* the model's prefill_flash_kernel */
template <int B, typename KV>
static prefill_flash_kernel_fn<B, KV> prefill_flash(void) {
#if MODEL_GENERIC
    return MODEL_HEAD_DIM == 128 ? prefill_flash_kernel<B, 128, KV> : prefill_flash_kernel<B, 64, KV>;
#else
    return prefill_flash_kernel<B, MODEL_HEAD_DIM, KV>;
#endif
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

#if !CUDA_QUANTIZED /* prefill_pairs_body reads dense rows: a quantized model's gate/up is a GEMM always */
template <int B>
static __global__ void __launch_bounds__(MV_THREADS, 1) prefill_gate_up_silu_kernel(cuda_layer w,
                                                                                              const uint16_t *x_terms,
                                                                                              uint16_t *hb_terms) {
    prefill_gate_up_silu_body<prompt_w<w_gate_up>, B, false>(w.w_gate, w.w_up, x_terms, hb_terms, MODEL_DIM, MODEL_HIDDEN_DIM);
}
#endif

/* The same as a GEMM (prefill_gemm_body). Where it runs: PREFILL_GATE_UP_GEMM 1 where its pair
 * tiles number at least 3/4 of the SMs (the 1B and 7-8B shapes on an H200: prompt +10% and +17%;
 * with fewer tiles SMs would idle: the SmolLM2 shape's 48 keep prefill_pairs_body, unmeasured as a
 * GEMM), 2 always (a test knob: the tiny models' tiles are fewer). A quantized model's runs as a GEMM
 * whatever its tiles (forward_cuda.cu): prefill_pairs_body reads dense rows. */
#define PREFILL_GATE_UP_GEMM MODEL_PREFILL_GATE_UP_GEMM /* the plan's */
static_assert(PREFILL_GATE_UP_GEMM == 1 || PREFILL_GATE_UP_GEMM == 2, "PREFILL_GATE_UP_GEMM: 1 (the rule) or 2 (always)");
/* Blocks an SM the GEMMs' launch bounds ask for, by the GEMM's columns (PREFILL_TERMS B): four (of
 * GEMM_STAGES 3, their shared memory); at 128 columns three (their stages take 72 KB; at four
 * blocks' 128 registers they spill); at 256 (128 sums a thread, stages of 40 KB) one. Measured at
 * two terms, batches of 32, 64 and 128. */
#define GEMM_BLOCKS_SM_AT(B) (PREFILL_TERMS * (B) > 128 ? 1 : PREFILL_TERMS * (B) > 64 ? 3 : 4)
template <int B>
static __global__ void __launch_bounds__(GEMM_THREADS, GEMM_BLOCKS_SM_AT(B)) prefill_gate_up_gemm_kernel(cuda_layer w,
                                                                                     const uint16_t *x_terms,
                                                                                     uint16_t *hb_terms) {
    prefill_gate_up_silu_body<prompt_w<w_gate_up>, B, true>(w.w_gate, w.w_up, x_terms, hb_terms, MODEL_DIM, MODEL_HIDDEN_DIM);
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
static __global__ void __launch_bounds__(GEMM_THREADS, GEMM_BLOCKS_SM_AT(B)) prefill_qkv_gemm_kernel(cuda_layer w,
                                                                                 const uint16_t *x_terms, float2 *part) {
    prefill_qkv_gemm_body<prompt_w<w_qkv>, B>(w.wq, w.wk, w.wv, x_terms, part, MODEL_DIM, MODEL_Q_DIM, MODEL_KV_DIM, MODEL_HEAD_DIM);
}

template <int B>
static __global__ void __launch_bounds__(GEMM_THREADS, GEMM_BLOCKS_SM_AT(B)) prefill_down_gemm_kernel(cuda_layer w,
                                                                                  const uint16_t *hb_terms, float *part) {
    prefill_residual_body<prompt_w<w_down>, B>(w.w_down, NULL, hb_terms, part, MODEL_DIM, MODEL_HIDDEN_DIM);
}

/* o_proj as a GEMM: the attention's output split into terms, then
 * the GEMM over splits of K */
static __global__ void __launch_bounds__(256) prefill_att_terms_kernel(const float *att, uint16_t *terms) {
    prefill_att_terms_body<w_prompt>(att, terms, MODEL_Q_DIM);
}

template <int B>
static __global__ void __launch_bounds__(GEMM_THREADS, GEMM_BLOCKS_SM_AT(B)) prefill_o_gemm_kernel(cuda_layer w,
                                                                               const uint16_t *att_terms, float *part) {
    prefill_residual_body<prompt_w<w_o>, B>(w.wo, MODEL_O_BIAS ? w.bo : NULL, att_terms, part, MODEL_DIM, MODEL_Q_DIM);
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
