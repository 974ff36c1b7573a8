/* model.h - where hand-written runtime code meets the generated code of one model.
 *
 * generated/<model>/model_config.h defines the MODEL_* constants and the weights struct; the
 * generated .c files define the symbols declared here. Everything the generator emits starts with
 * model_ / MODEL_, so `grep model_ runtime/` shows every contact point. */
#ifndef INGOT_MODEL_H
#define INGOT_MODEL_H

#include "errors.h"
#include "model_config.h"
#include "safetensors.h"

/* The tensors the model needs, in table order: HF name, dtype, shape (model_tensors.c). */
extern const st_tensor_spec model_tensor_specs[MODEL_N_TENSORS];

/* config.json keys and the values this binary was built for, re-checked when a model directory is
 * opened so that weights of another model are refused with the key named. */
typedef struct {
    const char *key;
    long long value;
} model_config_check;
extern const model_config_check model_config_checks[MODEL_N_CONFIG_CHECKS];

/* Fills w from the tensor data pointers, data[i] being model_tensor_specs[i]'s bytes. */
void model_weights_bind(model_weights *w, const void *const data[MODEL_N_TENSORS]);

/* ---------------------------------------------------------------------------------------------
 * The CPU decode step (forward_cpu.c) */
typedef struct model_cpu model_cpu;

/* ctx: tokens of KV cache (1..MODEL_SEQ_LEN); n_threads: OpenMP threads (>= 1). */
err_code model_cpu_init(model_cpu **out, const model_weights *w, int ctx, int n_threads);

/* Runs token at position pos (0 <= pos < ctx) through the model, appending its keys and values to
 * the cache, and returns the logits (vocab) for the next token, valid until the next call. */
const float *model_cpu_forward(model_cpu *m, int token, int pos);

void model_cpu_free(model_cpu *m);

#endif
