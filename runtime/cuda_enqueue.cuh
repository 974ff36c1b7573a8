/* cuda_enqueue.cuh - what a decode step and a prompt batch launch, in stream order: the launch
 * helpers (programmatic dependent launch, the kernel benchmark's marks), each step's kernels with
 * their grids (enqueue_step), the prompt's batches (enqueue_prefill) with their tensor maps and
 * split counts, and the tiers of graphs by context length. Part of forward_cuda.cu's translation
 * unit, after struct model_cuda.
 */
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
enum { PF_EMBED, PF_SCALES, PF_QKV, PF_ATT, PF_O, PF_GATE_UP, PF_DOWN, PF_END, PF_COUNT };
static const char *const prefill_stage_names[PF_COUNT] = {"prefill_embed", "prefill_rms_terms", "prefill_qkv_rope", "prefill_attention",
                                                          "prefill_o_proj", "prefill_gate_up_silu", "prefill_down", "prefill_end"};
#define PREFILL_LAUNCHES (7 * MODEL_N_LAYERS - 3)

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
template <int B, typename KV>
static void enqueue_prefill(model_cuda *m, int n_splits, bool last, cudaEvent_t *marks, int *stage_of) {
    constexpr int size = prefill_size_index(B);
    const int qkv_splits = m->qkv_splits[size], o_splits = m->o_splits[size], down_splits = m->down_splits[size];
    launch_marks mark = {marks, stage_of, m->stream, 0};
    mark.begin();
    launch(prefill_embed_kernel, (MODEL_DIM + 255) / 256, B, 256, 0, m->stream, m->dw.embed, m->io, m->x, m->history);
    mark(PF_EMBED);
    for (int l = 0; l < MODEL_N_LAYERS; l++) {
        const cuda_layer *lw = &m->dw.layers[l];
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
#if PREFILL_FLASH_BUILT
        if (MODEL_PREFILL_FLASH && m->n_splits <= FLASH_MAX_SPLITS(MODEL_HEAD_DIM)) {
            const size_t flash_smem = FMMA_SMEM_BYTES(MODEL_HEAD_DIM);
            const prefill_flash_kernel_fn<B, KV> flash = prefill_flash<B, KV>();
            CUDA_CHECK(cudaFuncSetAttribute((const void *)flash, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)flash_smem));
            launch_grid(flash, flash_grid<B>(n_splits), FMMA_THREADS, flash_smem, m->stream, m->q, cache, m->io, m->prefill_part_acc,
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
#if !CUDA_QUANTIZED
        else
            launch(prefill_gate_up_silu_kernel<B>, PREFILL_GRID(MODEL_HIDDEN_DIM), 1, MV_THREADS, 0, m->stream, *lw, /* static shared memory */
                   m->prefill_x_terms, m->prefill_hb_terms);
#endif
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
