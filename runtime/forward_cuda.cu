/* forward_cuda.cu - the CUDA decode step and prompt path of one model, behind model.h's model_cuda_*
 * API: the device state (struct model_cuda), model_cuda_init (buffers, the step's and the prompt's
 * CUDA graphs), and feeding tokens and taking choices (a step queued before the host reads the
 * token it follows).
 *
 * One translation unit, in four more files included where they stand: cuda_step_kernels.cuh (the
 * __global__ kernels bound to this model), cuda_enqueue.cuh (what a step and a prompt batch
 * launch), cuda_load.cuh (upload, capture, kernel attributes, formats) and cuda_kernel_bench.cuh
 * (--bench-kernels, the cache fill). Everything in it is static: a generic build links one copy
 * per weight dtype.
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

#include "cuda_step_kernels.cuh"
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

#include "cuda_enqueue.cuh" /* cuda_fail, the launch helpers, enqueue_step, enqueue_prefill, the tiers */
#include "cuda_load.cuh"    /* capture, upload, kernel attributes, formats */

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
    m->gate_up_gemm = CUDA_QUANTIZED || PREFILL_GATE_UP_GEMM == 2 || 4 * gemm_tiles(MODEL_HIDDEN_DIM) >= 3 * sms;
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
            const model_layer_weights &w = m->w.layers[l];
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
    const int least_chunk = MODEL_PREFILL_FLASH && m->n_splits <= FLASH_MAX_SPLITS(MODEL_HEAD_DIM) && FMMA_MIN_CHUNK > PREFILL_MIN_CHUNK
                                ? FMMA_MIN_CHUNK : PREFILL_MIN_CHUNK;
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

#include "cuda_kernel_bench.cuh" /* model_cuda_kernel_bench, model_cuda_fill_cache */

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
                   m->down_t, m->x_mlp[0], m->x_mlp[1]};
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
