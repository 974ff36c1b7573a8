/* model_generic.c - the generic build's glue: the model it runs, read at run time, and the entry
 * points of model.h, each passing the call to the forward code compiled for the model's weights.
 *
 * Compiled only into the generic binary (make GENERIC=1), against generated/generic/. The forward
 * code there is the specialized build's, instantiated three times, once per weight dtype
 * (build/generic/forward_cpu_bf16.o, ...; model_config.h renames each copy's entry points); the
 * dtype is fixed once the model is loaded, so the choice is made once per call, not per weight. */
#include <string.h>

#include "model.h"
#include "model_chat.h"

model_spec model_rt;
chat_strings model_chat_rt;

err_code model_generic_load(const char *dir) {
    err_code rc = model_spec_load(&model_rt, dir);
    if (rc) return rc;
    if (model_rt.n_layers > MODEL_MAX_LAYERS)
        return err_set(ERR_CONFIG, "%s/config.json: 'num_hidden_layers' = %d: the generic build holds at most %d layers (a "
                       "specialized build has no limit: make MODEL=%s)", dir, model_rt.n_layers, MODEL_MAX_LAYERS, dir);
    return ERR_OK;
}

err_code model_generic_load_chat(const char *dir, const tokenizer *tok) {
    return chat_strings_load(&model_chat_rt, dir, tok, model_rt.eos_ids, model_rt.n_eos, model_chat_known, MODEL_CHAT_N_KNOWN);
}

void model_generic_free(void) {
    chat_strings_free(&model_chat_rt);
    model_spec_free(&model_rt);
}

/* The copy of fn for the model's weight dtype. */
#define BY_DTYPE(fn, ...)                                                                            \
    (model_rt.dtype == DT_BF16  ? fn##_bf16(__VA_ARGS__)                                             \
     : model_rt.dtype == DT_F16 ? fn##_f16(__VA_ARGS__)                                              \
                                : fn##_f32(__VA_ARGS__))

#define DECLARE_CPU(dt)                                                                              \
    err_code model_cpu_init_##dt(model_cpu **out, const void *const *data, int ctx, int n_threads, kv_cache_type kv); \
    const float *model_cpu_forward_##dt(model_cpu *m, int token, int pos);                          \
    const float *model_cpu_prefill_##dt(model_cpu *m, const int *tokens, int n, int pos0);          \
    void model_cpu_prefill_logits_##dt(model_cpu *m, const int *tokens, int n, int pos0, float *logits); \
    err_code model_cpu_stage_bench_##dt(model_cpu *m, int pos, int reps, FILE *out);                \
    void model_cpu_free_##dt(model_cpu *m);
DECLARE_CPU(bf16)
DECLARE_CPU(f16)
DECLARE_CPU(f32)

err_code model_cpu_init(model_cpu **out, const void *const *data, int ctx, int n_threads, kv_cache_type kv) {
    return BY_DTYPE(model_cpu_init, out, data, ctx, n_threads, kv);
}
const float *model_cpu_forward(model_cpu *m, int token, int pos) { return BY_DTYPE(model_cpu_forward, m, token, pos); }
const float *model_cpu_prefill(model_cpu *m, const int *tokens, int n, int pos0) {
    return BY_DTYPE(model_cpu_prefill, m, tokens, n, pos0);
}
void model_cpu_prefill_logits(model_cpu *m, const int *tokens, int n, int pos0, float *logits) {
    BY_DTYPE(model_cpu_prefill_logits, m, tokens, n, pos0, logits);
}
err_code model_cpu_stage_bench(model_cpu *m, int pos, int reps, FILE *out) {
    return BY_DTYPE(model_cpu_stage_bench, m, pos, reps, out);
}
void model_cpu_free(model_cpu *m) { BY_DTYPE(model_cpu_free, m); }

#ifdef INGOT_CUDA
#define DECLARE_CUDA(dt)                                                                             \
    err_code model_cuda_init_##dt(model_cuda **out, const void *const *data, int ctx, kv_cache_type kv); \
    err_code model_cuda_feed_##dt(model_cuda *m, const int *tokens, int n, int pos, int out);       \
    err_code model_cuda_feed_choice_##dt(model_cuda *m);                                            \
    err_code model_cuda_take_##dt(model_cuda *m, int *next, const float **logits);                  \
    err_code model_cuda_unqueue_##dt(model_cuda *m);                                                \
    err_code model_cuda_set_sampler_##dt(model_cuda *m, const sampler *s);                          \
    err_code model_cuda_fill_cache_##dt(model_cuda *m, int n_pos);                                  \
    err_code model_cuda_kernel_bench_##dt(model_cuda *m, int pos, int reps, FILE *out);             \
    void model_cuda_free_##dt(model_cuda *m);
DECLARE_CUDA(bf16)
DECLARE_CUDA(f16)
DECLARE_CUDA(f32)

err_code model_cuda_init(model_cuda **out, const void *const *data, int ctx, kv_cache_type kv) {
    return BY_DTYPE(model_cuda_init, out, data, ctx, kv);
}
err_code model_cuda_feed(model_cuda *m, const int *tokens, int n, int pos, int out) {
    return BY_DTYPE(model_cuda_feed, m, tokens, n, pos, out);
}
err_code model_cuda_feed_choice(model_cuda *m) { return BY_DTYPE(model_cuda_feed_choice, m); }
err_code model_cuda_take(model_cuda *m, int *next, const float **logits) { return BY_DTYPE(model_cuda_take, m, next, logits); }
err_code model_cuda_unqueue(model_cuda *m) { return BY_DTYPE(model_cuda_unqueue, m); }
err_code model_cuda_set_sampler(model_cuda *m, const sampler *s) { return BY_DTYPE(model_cuda_set_sampler, m, s); }
err_code model_cuda_fill_cache(model_cuda *m, int n_pos) { return BY_DTYPE(model_cuda_fill_cache, m, n_pos); }
err_code model_cuda_kernel_bench(model_cuda *m, int pos, int reps, FILE *out) {
    return BY_DTYPE(model_cuda_kernel_bench, m, pos, reps, out);
}
void model_cuda_free(model_cuda *m) { BY_DTYPE(model_cuda_free, m); }
#endif
