/* model_spec.h - a Hugging Face config.json read at run time: the C twin of codegen/spec.py.
 *
 * The generic build (make GENERIC=1) does at run time what the generator does at build time: it
 * reads config.json into the same fields, with the same derived values (q_dim, RoPE frequencies
 * with Llama-3 or linear scaling, bytes read per token, the tensor table), and refuses what the
 * engine cannot run with the same one-line message, naming the key. tests/test_model_spec.py keeps
 * the two in step on every config the project knows and on every refusal. Field names are
 * spec.py's, so the generated code's MODEL_DIM is `(model_rt.dim)` in a generic build.
 *
 * This header is also compiled as CUDA C++ (a generic build's forward_cuda.cu copies the struct
 * into __constant__ memory for its kernels). */
#ifndef INGOT_MODEL_SPEC_H
#define INGOT_MODEL_SPEC_H

#include <stddef.h>

#include "errors.h"
#include "json.h"
#include "safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The formats of one layer's matrices, GGUF type ids as model_spec's format_* fields hold them. */
typedef struct {
    int wq, wk, wv, wo, w_gate, w_up, w_down;
} model_layer_formats;

typedef struct {
    int dim;              /* hidden_size */
    int hidden_dim;       /* intermediate_size */
    int n_layers;         /* num_hidden_layers */
    int n_heads;          /* num_attention_heads */
    int n_kv_heads;       /* num_key_value_heads */
    int head_dim;         /* head_dim, or hidden_size / num_attention_heads */
    int q_dim;            /* n_heads * head_dim */
    int kv_dim;           /* n_kv_heads * head_dim */
    int kv_mul;           /* n_heads / n_kv_heads */
    int vocab_size;       /* vocab_size */
    int seq_len;          /* max_position_embeddings */
    double norm_eps;      /* rms_norm_eps */
    double rope_theta;    /* rope_theta */
    int qkv_bias;         /* Qwen2 always; Llama's attention_bias */
    int o_bias;           /* Llama's attention_bias also biases o_proj */
    int tied_embeddings;  /* tie_word_embeddings */
    st_dtype dtype;       /* of every weight, from torch_dtype */
    int dtype_bytes;
    int bos_id;           /* bos_token_id, -1 if none */
    int n_eos;
    int *eos_ids;         /* (n_eos) eos_token_id */
    /* Each matrix field's format, GGUF's ggml_type id (runtime/quant.h): a block format named by
     * quantization_config's "formats", or the dense dtype's (BF16 30, F16 1, F32 0); lm_head is
     * embed's when tied; QUANT_MIXED for a layer field whose layers differ. spec.py's Spec.formats. */
    int format_embed, format_wq, format_wk, format_wv, format_wo, format_w_gate, format_w_up, format_w_down,
        format_lm_head;
    model_layer_formats *layer_formats; /* (n_layers) each layer's formats (spec.py's Spec.layer_formats);
                                           host memory: the GPU, which takes one format a field, never reads it */
    int quantized;                       /* 1 when any matrix is in a block format */
    unsigned long long weight_bytes;     /* bytes of weights one decode step reads, as stored (spec.py weight_bytes) */
    unsigned long long kv_bytes_per_pos; /* fp16 KV cache per position: n_layers * 2 * kv_dim * 2 */
    float *rope_inv_freq;        /* (head_dim / 2) the kernels' frequencies: rope_inv_freq_f64 rounded */
    double *rope_inv_freq_f64;   /* (head_dim / 2) theta^(-2i/head_dim), scaling applied */
    int n_tensors;               /* in tensors */
    int layer_tensors;           /* tensors per layer */
    st_tensor_spec *tensors;     /* (n_tensors) every weight, in spec.py's order; a quantized one is
                                    {name, DT_U8, 2, {rows, row_bytes}} */
    const char *name;            /* the model directory's basename */
    const char *architecture;    /* "LlamaForCausalLM", ... */
    const char *family;          /* "llama", "mistral", "qwen2" */
    const char *rope_scaling;    /* "none", "linear" or "llama3" */
    char *storage;               /* name and tensor names */
} model_spec;

/* Reads dir/config.json into *s. On a config the engine cannot run, returns ERR_CONFIG with
 * codegen/spec.py's message after the file's path ("models/x/config.json: missing key
 * 'hidden_size'"); a file that is not JSON gives ERR_JSON's detail the same way. *s needs
 * model_spec_free only after success. */
err_code model_spec_load(model_spec *s, const char *dir);

void model_spec_free(model_spec *s);

/* dir/config.json parsed into *doc, its path written to path (path_cap bytes): ERR_IO when it
 * cannot be read, ERR_CONFIG naming the byte where it is not JSON. */
err_code model_config_parse(const char *dir, json_doc *doc, char *path, size_t path_cap);

#ifdef __cplusplus
}
#endif

#endif
