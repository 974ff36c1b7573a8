/* model.h - where hand-written runtime code meets the generated code of one model.
 *
 * generated/<model>/model_config.h defines the MODEL_* constants and the weights struct; the
 * generated .c files define the symbols declared here. Everything the generator emits starts with
 * model_ / MODEL_, so `grep model_ runtime/` shows every contact point. In a generic build
 * (generated/generic/, MODEL_GENERIC 1) the constants are values read at run time, the tensor table
 * is built at run time (runtime/model_spec.c), and the entry points below dispatch to the forward
 * code compiled for the model's weight dtype (runtime/model_generic.c). */
#ifndef INGOT_MODEL_H
#define INGOT_MODEL_H

#include <stdio.h>

#include "errors.h"
#include "model_config.h"
#include "safetensors.h"
#include "sampler.h"

#ifdef __cplusplus
extern "C" {
#endif

#if !MODEL_GENERIC
/* The tensors the model needs, in table order: HF name, dtype, shape (model_tensors.c). */
extern const st_tensor_spec model_tensor_specs[MODEL_N_TENSORS];

/* config.json keys and the values this binary was built for, re-checked when a model directory is
 * opened so that weights of another model are refused with the key named. */
typedef struct {
    const char *key;
    long long value;
} model_config_check;
extern const model_config_check model_config_checks[MODEL_N_CONFIG_CHECKS];
#else
/* The generic build (runtime/model_generic.c). model_generic_load reads dir/config.json into
 * model_rt, refusing what it cannot run with a message naming the key; model_generic_load_chat
 * finds the model's chat strings (model_chat.h), tok resolving its stop tokens. */
struct tokenizer;
err_code model_generic_load(const char *dir);
err_code model_generic_load_chat(const char *dir, const struct tokenizer *tok);
void model_generic_free(void);
#endif

/* ---------------------------------------------------------------------------------------------
 * The CPU decode step (forward_cpu.c) */
typedef struct model_cpu model_cpu;

/* data[i]: model_tensor_specs[i]'s bytes (the mapped files); ctx: tokens of KV cache
 * (1..MODEL_SEQ_LEN); n_threads: OpenMP threads (>= 1). */
err_code model_cpu_init(model_cpu **out, const void *const *data, int ctx, int n_threads);

/* Runs token at position pos (0 <= pos < ctx) through the model, appending its keys and values to
 * the cache, and returns the logits (vocab) for the next token, valid until the next call. */
const float *model_cpu_forward(model_cpu *m, int token, int pos);

/* The same for tokens[0..n) at positions pos0 .. pos0 + n - 1 (n >= 1), several at a time: the
 * logits after the last one, and the same cache as n calls of model_cpu_forward. */
const float *model_cpu_prefill(model_cpu *m, const int *tokens, int n, int pos0);

/* Times each stage of a decode step at position pos (thread 0's clock at the step's barriers, best
 * of reps) and prints a table to out, as model_cuda_kernel_bench does: --bench-kernels on the CPU. */
err_code model_cpu_stage_bench(model_cpu *m, int pos, int reps, FILE *out);

void model_cpu_free(model_cpu *m);

/* ---------------------------------------------------------------------------------------------
 * The CUDA decode step (forward_cuda.cu), in builds with INGOT_CUDA */
typedef struct model_cuda model_cuda;

/* Uploads the weights (data[i]: model_tensor_specs[i]'s bytes on the host) and allocates a KV cache
 * of ctx tokens on device 0; refuses with ERR_DEVICE when there is no device or they do not fit.
 * persistent: run each step as one persistent kernel with grid barriers between its stages, instead
 * of a CUDA graph of a kernel per stage (--gpu-step). */
err_code model_cuda_init(model_cuda **out, const void *const *data, int ctx, int persistent);

/* One decode step on the GPU: token at position pos. *next (if not NULL) gets the token chosen
 * on the device (see model_cuda_set_sampler); *logits (if not NULL) the logits copied to the host, valid until the next
 * step. Only the token id crosses back when logits is NULL. With next == NULL and logits == NULL
 * the step only extends the cache (a prompt token). */
err_code model_cuda_step(model_cuda *m, int token, int pos, int *next, const float **logits);

/* The sampler whose settings and generator state (as sampler_init left them) later steps use to
 * draw *next on the device (runtime/cuda_sampler.cuh); until it is called, *next is the argmax.
 * Greedy without a repetition penalty keeps the LM head's argmax. Steps with next == NULL (prompt
 * tokens) neither draw nor advance the generator, as on the CPU. */
err_code model_cuda_set_sampler(model_cuda *m, const sampler *s);

/* Random keys and values for positions [0, n_pos): benchmarks at a context depth. */
err_code model_cuda_fill_cache(model_cuda *m, int n_pos);

/* Times each stage of a step at position pos (kernels launched one by one, best of reps) and prints
 * a table to out: the kernel benchmark behind --bench-kernels. */
err_code model_cuda_kernel_bench(model_cuda *m, int pos, int reps, FILE *out);

void model_cuda_free(model_cuda *m);

#ifdef __cplusplus
}
#endif

#endif
