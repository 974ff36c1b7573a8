/* model_check.h - a specialized binary's check that a model directory holds the model it was built
 * for, compiled into engine.c against the generated model_config.h.
 *
 * The directory's config.json goes through the same rules as the generator's (runtime/model_spec.c,
 * the C twin of codegen/spec.py), so a config the generator would refuse is refused here with the
 * generator's message; then every value the compiled code depends on is compared with the one the
 * binary was built from, and the first that differs is named with its config.json key: another
 * model's rope_theta, rms_norm_eps, context length, vocabulary, special tokens or RoPE scaling
 * never runs silently. (A generic binary reads the config instead: model_generic_load.) */
#ifndef INGOT_MODEL_CHECK_H
#define INGOT_MODEL_CHECK_H

#include <stdio.h>
#include <string.h>

#include "model.h"
#include "model_spec.h"
#include "quant.h"

#if !MODEL_GENERIC
/* The first value of s that differs from the built-in one: its key and both values as text. */
static int model_check_differs(const model_spec *s, const char **key, char *got, char *want, size_t cap) {
#define MODEL_CHECK_INT(k, field, built)                                                   \
    if (s->field != (built)) {                                                             \
        *key = k;                                                                          \
        snprintf(got, cap, "%lld", (long long)s->field);                                   \
        snprintf(want, cap, "%lld", (long long)(built));                                   \
        return 1;                                                                          \
    }
    if (strcmp(s->architecture, MODEL_ARCHITECTURE) != 0) {
        *key = "architectures";
        snprintf(got, cap, "%s", s->architecture);
        snprintf(want, cap, "%s", MODEL_ARCHITECTURE);
        return 1;
    }
    MODEL_CHECK_INT("hidden_size", dim, MODEL_DIM)
    MODEL_CHECK_INT("intermediate_size", hidden_dim, MODEL_HIDDEN_DIM)
    MODEL_CHECK_INT("num_hidden_layers", n_layers, MODEL_N_LAYERS)
    MODEL_CHECK_INT("num_attention_heads", n_heads, MODEL_N_HEADS)
    MODEL_CHECK_INT("num_key_value_heads", n_kv_heads, MODEL_N_KV_HEADS)
    MODEL_CHECK_INT("head_dim", head_dim, MODEL_HEAD_DIM)
    MODEL_CHECK_INT("vocab_size", vocab_size, MODEL_VOCAB_SIZE)
    MODEL_CHECK_INT("max_position_embeddings", seq_len, MODEL_SEQ_LEN)
    MODEL_CHECK_INT("attention_bias", qkv_bias, MODEL_QKV_BIAS)
    MODEL_CHECK_INT("attention_bias", o_bias, MODEL_O_BIAS)
    MODEL_CHECK_INT("tie_word_embeddings", tied_embeddings, MODEL_TIED_EMBEDDINGS)
    MODEL_CHECK_INT("bos_token_id", bos_id, MODEL_BOS_ID)
#undef MODEL_CHECK_INT
    if (s->dtype != MODEL_WEIGHT_DTYPE) {
        *key = "torch_dtype";
        snprintf(got, cap, "%s", st_dtype_name(s->dtype));
        snprintf(want, cap, "%s", st_dtype_name(MODEL_WEIGHT_DTYPE));
        return 1;
    }
    /* each matrix's format, layer by layer: Q4_0 and Q4_K rows of the same length have the same
     * bytes, so the tensor table alone would not tell them apart */
#define MODEL_CHECK_FORMAT(got_format, built, ...)                                         \
    if ((got_format) != (built)) {                                                         \
        *key = "quantization_config";                                                      \
        int n_ = snprintf(got, cap, "%s for ", quant_format_of(got_format)->name);         \
        snprintf(got + n_, cap - (size_t)n_, __VA_ARGS__);                                 \
        snprintf(want, cap, "%s", quant_format_of(built)->name);                           \
        return 1;                                                                          \
    }
    MODEL_CHECK_FORMAT(s->format_embed, MODEL_FORMAT_EMBED, "model.embed_tokens")
    for (int l = 0; l < MODEL_N_LAYERS; l++) {
        const model_layer_formats *f = &s->layer_formats[l];
        MODEL_CHECK_FORMAT(f->wq, MODEL_FORMAT_WQ_AT(l), "model.layers.%d.self_attn.q_proj", l)
        MODEL_CHECK_FORMAT(f->wk, MODEL_FORMAT_WK_AT(l), "model.layers.%d.self_attn.k_proj", l)
        MODEL_CHECK_FORMAT(f->wv, MODEL_FORMAT_WV_AT(l), "model.layers.%d.self_attn.v_proj", l)
        MODEL_CHECK_FORMAT(f->wo, MODEL_FORMAT_WO_AT(l), "model.layers.%d.self_attn.o_proj", l)
        MODEL_CHECK_FORMAT(f->w_gate, MODEL_FORMAT_W_GATE_AT(l), "model.layers.%d.mlp.gate_proj", l)
        MODEL_CHECK_FORMAT(f->w_up, MODEL_FORMAT_W_UP_AT(l), "model.layers.%d.mlp.up_proj", l)
        MODEL_CHECK_FORMAT(f->w_down, MODEL_FORMAT_W_DOWN_AT(l), "model.layers.%d.mlp.down_proj", l)
    }
    MODEL_CHECK_FORMAT(s->format_lm_head, MODEL_FORMAT_LM_HEAD, "lm_head")
#undef MODEL_CHECK_FORMAT
    /* the kernels use the float32 epsilon */
    if ((float)s->norm_eps != MODEL_NORM_EPS) {
        *key = "rms_norm_eps";
        snprintf(got, cap, "%g", s->norm_eps);
        snprintf(want, cap, "%g", (double)MODEL_NORM_EPS);
        return 1;
    }
    if (s->rope_theta != MODEL_ROPE_THETA) {
        *key = "rope_theta";
        snprintf(got, cap, "%.17g", s->rope_theta);
        snprintf(want, cap, "%.17g", MODEL_ROPE_THETA);
        return 1;
    }
    int scaling_differs = strcmp(s->rope_scaling, MODEL_ROPE_SCALING) != 0;
    for (int i = 0; i < MODEL_HEAD_DIM / 2; i++) scaling_differs |= s->rope_inv_freq[i] != model_rope_inv_freq[i];
    if (scaling_differs) {
        *key = "rope_scaling";
        snprintf(got, cap, "%s scaling", s->rope_scaling);
        snprintf(want, cap, "%s scaling%s", MODEL_ROPE_SCALING,
                 strcmp(s->rope_scaling, MODEL_ROPE_SCALING) == 0 ? " with other factors" : "");
        return 1;
    }
    int eos_differs = s->n_eos != MODEL_N_EOS;
    for (int i = 0; i < s->n_eos && !eos_differs; i++) eos_differs = s->eos_ids[i] != model_eos_ids[i];
    if (eos_differs) {
        *key = "eos_token_id";
        size_t n = 0;
        for (int i = 0; i < s->n_eos && n < cap; i++) n += (size_t)snprintf(got + n, cap - n, "%s%d", i ? "," : "", s->eos_ids[i]);
        if (!s->n_eos) snprintf(got, cap, "none");
        n = 0;
        for (int i = 0; i < MODEL_N_EOS && n < cap; i++) n += (size_t)snprintf(want + n, cap - n, "%s%d", i ? "," : "", model_eos_ids[i]);
        if (!MODEL_N_EOS) snprintf(want, cap, "none");
        return 1;
    }
    return 0;
}

/* dir/config.json must pass the generator's rules and describe the model this binary was built
 * for; ERR_CONFIG naming the first key that differs otherwise. */
static err_code model_check_config(const char *dir) {
    model_spec s;
    err_code rc = model_spec_load(&s, dir);
    if (rc) return rc;
    const char *key = NULL;
    char got[96], want[96];
    if (model_check_differs(&s, &key, got, want, sizeof got))
        rc = err_set(ERR_CONFIG, "%s/config.json: '%s' is %s, this binary was built for %s (build one for this model: make MODEL=%s)",
                     dir, key, got, want, dir);
    model_spec_free(&s);
    return rc;
}
#endif

#endif
