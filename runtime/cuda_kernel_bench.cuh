/* cuda_kernel_bench.cuh - --bench-kernels (each stage of a step and of a prompt batch timed
 * launch by launch, and what the boundary between two steps' graphs costs) and --bench's cache
 * fill (random values up to a depth, since decode speed depends on how much cache a step reads,
 * not on what it holds). Part of forward_cuda.cu's translation unit, after the step's API.
 */
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
        const double pf_bytes[PF_COUNT] = {b * MODEL_DIM * 2.0, 0.0, qkv, kv_pos * (b * (pos + 1.0) + b * (b - 1) / 2.0), o, gate_up, down, 0.0};
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
