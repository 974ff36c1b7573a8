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
#include <string.h>

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

#else
/* The generic build (runtime/model_generic.c). model_generic_load reads dir/config.json into
 * model_rt, refusing what it cannot run with a message naming the key; model_generic_load_chat
 * finds the model's chat strings (model_chat.h), tok resolving its stop tokens. */
struct tokenizer;
err_code model_generic_load(const char *dir);
err_code model_generic_load_chat(const char *dir, const struct tokenizer *tok);
void model_generic_free(void);
#endif

/* The format (a GGUF type: quant.h; a dense matrix's is the model's dtype) of the matrix named name
 * in the tensor table: its field's, or its layer's where the field's layers differ
 * (MODEL_FORMAT_<F>_AT); -1 for a tensor that is not a matrix. */
static inline int model_tensor_format(const char *name) {
    int l = 0; /* the layer of a layer's tensor */
    sscanf(name, "model.layers.%d.", &l);
    const struct { const char *suffix; int format; } fields[] = {
        {"embed_tokens.weight", MODEL_FORMAT_EMBED},    {"q_proj.weight", MODEL_FORMAT_WQ_AT(l)},
        {"k_proj.weight", MODEL_FORMAT_WK_AT(l)},       {"v_proj.weight", MODEL_FORMAT_WV_AT(l)},
        {"o_proj.weight", MODEL_FORMAT_WO_AT(l)},       {"gate_proj.weight", MODEL_FORMAT_W_GATE_AT(l)},
        {"up_proj.weight", MODEL_FORMAT_W_UP_AT(l)},    {"down_proj.weight", MODEL_FORMAT_W_DOWN_AT(l)},
        {"lm_head.weight", MODEL_FORMAT_LM_HEAD},
    };
    const size_t n = strlen(name);
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        const size_t k = strlen(fields[i].suffix);
        if (n >= k && strcmp(name + n - k, fields[i].suffix) == 0) return fields[i].format;
    }
    return -1;
}

/* ---------------------------------------------------------------------------------------------
 * The KV cache's element type (--kv-cache). KV_Q8: each position's key and value vector of a KV
 * head as int8 with one fp32 scale, d = max|x| / 127 and x_i ~ d * rint(x_i * (127 / max|x|)): half
 * the bytes of fp16 for long contexts (docs/architecture.md, "The KV cache"). */
typedef enum { KV_F16, KV_Q8 } kv_cache_type;

/* ---------------------------------------------------------------------------------------------
 * The CPU decode step (forward_cpu.c) */
typedef struct model_cpu model_cpu;

/* data[i]: model_tensor_specs[i]'s bytes (the mapped files); ctx: tokens of KV cache
 * (1..MODEL_SEQ_LEN); n_threads: OpenMP threads (>= 1); kv: the cache's element type. */
err_code model_cpu_init(model_cpu **out, const void *const *data, int ctx, int n_threads, kv_cache_type kv);

/* Runs token at position pos (0 <= pos < ctx) through the model, appending its keys and values to
 * the cache, and returns the logits (vocab) for the next token, valid until the next call. */
const float *model_cpu_forward(model_cpu *m, int token, int pos);

/* The same for tokens[0..n) at positions pos0 .. pos0 + n - 1 (n >= 1), several at a time: the
 * logits after the last one, and the same cache as n calls of model_cpu_forward. */
const float *model_cpu_prefill(model_cpu *m, const int *tokens, int n, int pos0);

/* The same, writing the logits after each of the n tokens to logits (n, vocab): every position of a
 * perplexity chunk scored in batches, the LM head's rows read once a batch. */
void model_cpu_prefill_logits(model_cpu *m, const int *tokens, int n, int pos0, float *logits);

/* Times each stage of a decode step at position pos (thread 0's clock at the step's barriers, best
 * of reps) and prints a table to out, as model_cuda_kernel_bench does: --bench-kernels on the CPU. */
err_code model_cpu_stage_bench(model_cpu *m, int pos, int reps, FILE *out);

void model_cpu_free(model_cpu *m);

/* ---------------------------------------------------------------------------------------------
 * The CUDA decode step (forward_cuda.cu), in builds with INGOT_CUDA */
typedef struct model_cuda model_cuda;

/* Uploads the weights (data[i]: model_tensor_specs[i]'s bytes on the host) and allocates a KV cache
 * of ctx tokens on device 0; refuses with ERR_DEVICE when there is no device or they do not fit.
 * Each decode step then runs as a CUDA graph of a kernel per stage. */
err_code model_cuda_init(model_cuda **out, const void *const *data, int ctx, kv_cache_type kv);

/* The GPU decode steps run in a queue on the device: the host queues steps without waiting and
 * takes the chosen tokens in order, so the device never waits on the host between steps. A step
 * runs on the token at its position in the device's history: fed by the host, or chosen by the
 * step before it. Only the token id crosses back, unless logits are asked for. */
enum { CUDA_OUT_NONE, CUDA_OUT_TOKEN, CUDA_OUT_LOGITS };

/* Queues tokens[0..n) at positions pos .. pos + n - 1 (n >= 1, every step taken), after which the
 * cache holds pos + n tokens. out says what the last step leaves: nothing but the cache
 * (CUDA_OUT_NONE), the token chosen on the device (CUDA_OUT_TOKEN; see model_cuda_set_sampler), or
 * that and the logits (CUDA_OUT_LOGITS). The tokens before the last need no LM head: they go
 * through the prefill kernels 8 at a time, the last batch as few as are left (one or two left go
 * one at a time, which is faster). */
err_code model_cuda_feed(model_cuda *m, const int *tokens, int n, int pos, int out);

/* Queues a step on the token that the last queued step chose, at the position after it, before
 * the host knows the token: a step ahead of the host. At most 4 steps queued and not taken. */
err_code model_cuda_feed_choice(model_cuda *m);

/* Waits for the oldest queued step whose token was not taken, and returns it in *next; *logits
 * (if not NULL) gets the logits on the host when that step was fed with CUDA_OUT_LOGITS, else
 * NULL, valid until the next step. */
err_code model_cuda_take(model_cuda *m, int *next, const float **logits);

/* Drops the newest queued step, not taken (a step queued ahead on a token the host will not feed,
 * such as an end-of-turn): waits for it and puts the device's position and sampler state back as
 * they were before it. Its cache entry is overwritten by whatever is fed next. One step only: the
 * next step must be fed. */
err_code model_cuda_unqueue(model_cuda *m);

/* The sampler whose settings and generator state (as sampler_init left them) later steps use to
 * draw tokens on the device (runtime/cuda_sampler.cuh); until it is called, steps choose the argmax.
 * Greedy without a repetition penalty keeps the LM head's argmax. Steps that choose no token
 * (prompt tokens) neither draw nor advance the generator, as on the CPU. */
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
