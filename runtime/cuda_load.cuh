/* cuda_load.cuh - what model_cuda_init builds on: graph capture, the weights' upload into one
 * arena, the kernels' attributes (carveouts, one-wave grids, the KV cache type's kernels), the
 * matrices bound to their formats and the formats the GPU refuses. Part of forward_cuda.cu's
 * translation unit, after cuda_enqueue.cuh.
 */
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
