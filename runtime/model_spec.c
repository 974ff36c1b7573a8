/* model_spec.c - config.json into a model_spec, line by line as codegen/spec.py does it.
 *
 * Same checks in the same order, so the first problem reported is the one spec.py reports, with
 * its words: values are quoted as Python's repr() prints them. Floating-point values are computed
 * in double with the operations in spec.py's order (the RoPE frequencies through libm's pow, as
 * CPython's ** does), then rounded once to float where the kernels want float. */
#include "model_spec.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "quant.h"

// ----------------------------------------------------------------------------------------------
// Values as Python's repr() prints them, for the messages

typedef struct {
    char *s;
    size_t len, cap;
} text;

static void put(text *t, const char *s, size_t n) {
    if (t->len + n + 1 > t->cap) n = t->cap > t->len + 1 ? t->cap - t->len - 1 : 0; /* truncate */
    memcpy(t->s + t->len, s, n);
    t->len += n;
    t->s[t->len] = '\0';
}
static void puts_(text *t, const char *s) { put(t, s, strlen(s)); }

/* repr(float): the shortest digits that read back as the same double; positional notation for
 * exponents -4..15, scientific otherwise ("1e-05", "10000.0", "1e+16"). */
static void repr_float(text *t, double x) {
    char buf[64];
    if (isnan(x)) { puts_(t, "nan"); return; }
    if (isinf(x)) { puts_(t, x < 0 ? "-inf" : "inf"); return; }
    int prec = 1;
    for (; prec < 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, x);
        if (strtod(buf, NULL) == x) break;
    }
    snprintf(buf, sizeof buf, "%.*e", prec - 1, x);
    /* buf: [-]d.ddde[+-]XX -> sign, digits, decimal exponent */
    const char *p = buf;
    char sign[2] = "";
    if (*p == '-') { sign[0] = '-'; p++; }
    char digits[32];
    int nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    digits[nd] = '\0';
    int exp10 = atoi(p + 1);
    puts_(t, sign);
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 < 0) {
            puts_(t, "0.");
            for (int i = -1; i > exp10; i--) puts_(t, "0");
            puts_(t, digits);
        } else {
            for (int i = 0; i <= exp10; i++) put(t, i < nd ? &digits[i] : "0", 1);
            puts_(t, ".");
            puts_(t, nd > exp10 + 1 ? digits + exp10 + 1 : "0");
        }
    } else {
        put(t, digits, 1);
        if (nd > 1) { puts_(t, "."); puts_(t, digits + 1); }
        snprintf(buf, sizeof buf, "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
        puts_(t, buf);
    }
}

static void repr(text *t, const json_value *v) {
    char buf[64];
    switch (v ? v->type : JSON_NULL) {
    case JSON_NULL: puts_(t, "None"); break;
    case JSON_TRUE: puts_(t, "True"); break;
    case JSON_FALSE: puts_(t, "False"); break;
    case JSON_NUMBER:
        if (v->n) { /* an integer literal */
            snprintf(buf, sizeof buf, "%.0f", v->num);
            puts_(t, buf);
        } else {
            repr_float(t, v->num);
        }
        break;
    case JSON_STRING: {
        /* single quotes unless the text holds ' and no " */
        char q = memchr(v->str, '\'', (size_t)v->n) && !memchr(v->str, '"', (size_t)v->n) ? '"' : '\'';
        put(t, &q, 1);
        for (int i = 0; i < v->n; i++) {
            unsigned char c = (unsigned char)v->str[i];
            if (c == '\\' || c == (unsigned char)q) { put(t, "\\", 1); put(t, (const char *)&c, 1); }
            else if (c == '\n') puts_(t, "\\n");
            else if (c == '\t') puts_(t, "\\t");
            else if (c == '\r') puts_(t, "\\r");
            else if (c < 0x20 || c == 0x7F) { snprintf(buf, sizeof buf, "\\x%02x", c); puts_(t, buf); }
            else put(t, (const char *)&c, 1);
        }
        put(t, &q, 1);
        break;
    }
    case JSON_ARRAY:
    case JSON_OBJECT: {
        int obj = v->type == JSON_OBJECT, first = 1;
        puts_(t, obj ? "{" : "[");
        json_for_each(c, v) {
            if (!first) puts_(t, ", ");
            first = 0;
            if (obj) {
                json_value key = {.type = JSON_STRING, .str = c->key, .n = c->key_len};
                repr(t, &key);
                puts_(t, ": ");
            }
            repr(t, c);
        }
        puts_(t, obj ? "}" : "]");
        break;
    }
    }
}

/* Characters of a value quoted in a message; longer ones end in "..." (spec.py REPR_MAX). */
#define REPR_MAX 200

/* The repr of v in a static buffer: for one message at a time. */
static const char *r(const json_value *v) {
    static _Thread_local char buf[REPR_MAX + 8];
    text t = {buf, 0, sizeof buf};
    buf[0] = '\0';
    repr(&t, v);
    if (t.len > REPR_MAX) memcpy(buf + REPR_MAX, "...", 4);
    return buf;
}

static const char *r_float(double x) {
    static _Thread_local char buf[64];
    text t = {buf, 0, sizeof buf};
    buf[0] = '\0';
    repr_float(&t, x);
    return buf;
}

/* Python's truth value of a JSON value (absent: false). */
static int truthy(const json_value *v) {
    if (!v) return 0;
    switch (v->type) {
    case JSON_NULL:
    case JSON_FALSE: return 0;
    case JSON_TRUE: return 1;
    case JSON_NUMBER: return v->num != 0.0;
    case JSON_STRING:
    case JSON_ARRAY:
    case JSON_OBJECT: return v->n > 0;
    }
    return 0;
}

static int is_null(const json_value *v) { return !v || v->type == JSON_NULL; }
static int is_number(const json_value *v) { return v && v->type == JSON_NUMBER; }
static int is_int(const json_value *v) { return is_number(v) && v->n; }
/* A string equal to s (a decoded string may hold NUL bytes: compared by length, as Python does). */
static int is_str(const json_value *v, const char *s) {
    return v && v->type == JSON_STRING && (size_t)v->n == strlen(s) && memcmp(v->str, s, (size_t)v->n) == 0;
}

// ----------------------------------------------------------------------------------------------
// spec.py's _get

typedef struct {
    const char *path; /* for messages */
    const json_value *cfg;
} reader;

static err_code refuse(const reader *rd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static err_code refuse(const reader *rd, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return err_set(ERR_CONFIG, "%s: %s", rd->path, msg);
}

enum { REQUIRED, OPTIONAL };

/* spec.py LIMITS: the largest value each integer key may take, far above every real model and low
 * enough that every size derived from them fits 64 bits (and q_dim, kv_dim an int) with room. */
static const struct {
    const char *key;
    long long max;
} LIMITS[] = {
    {"hidden_size", 1 << 16},         {"intermediate_size", 1 << 18}, {"num_hidden_layers", 1 << 10},
    {"num_attention_heads", 1 << 10}, {"num_key_value_heads", 1 << 10}, {"head_dim", 1 << 10},
    {"vocab_size", 1 << 22},          {"max_position_embeddings", 1 << 24},
};
#define MAX_ID 2147483647.0 /* token ids are ints */

static long long limit_of(const char *key) {
    for (size_t i = 0; i < sizeof LIMITS / sizeof *LIMITS; i++)
        if (strcmp(LIMITS[i].key, key) == 0) return LIMITS[i].max;
    return (long long)MAX_ID;
}

/* An integer key, positive, at most its limit; *out unchanged when absent and optional. */
static err_code get_int(const reader *rd, const char *key, int optional, int *out) {
    const json_value *v = json_get(rd->cfg, key);
    if (is_null(v)) return optional ? ERR_OK : refuse(rd, "missing key '%s'", key);
    if (!is_int(v)) return refuse(rd, "'%s' = %s, expected an integer", key, r(v));
    if (v->num <= 0) return refuse(rd, "'%s' = %s, expected a positive value", key, r(v));
    if (v->num > (double)limit_of(key)) return refuse(rd, "'%s' = %s, expected at most %lld", key, r(v), limit_of(key));
    *out = (int)v->num;
    return ERR_OK;
}

static err_code get_float(const reader *rd, const char *key, double *out) {
    const json_value *v = json_get(rd->cfg, key);
    if (is_null(v)) return ERR_OK; /* spec.py's only float key has a default */
    if (!is_number(v)) return refuse(rd, "'%s' = %s, expected a number", key, r(v));
    if (v->num <= 0) return refuse(rd, "'%s' = %s, expected a positive value", key, r(v));
    if (!isfinite(v->num)) return refuse(rd, "'%s' = %s, expected a finite value", key, r(v));
    *out = v->num;
    return ERR_OK;
}

static err_code get_bool(const reader *rd, const char *key, int *out) {
    const json_value *v = json_get(rd->cfg, key);
    if (is_null(v)) return ERR_OK;
    if (v->type != JSON_TRUE && v->type != JSON_FALSE) return refuse(rd, "'%s' = %s, expected true or false", key, r(v));
    *out = v->type == JSON_TRUE;
    return ERR_OK;
}

// ----------------------------------------------------------------------------------------------
// RoPE: spec.py's rope_inv_freq

/* A number member of a rope_scaling object for the given type, finite and positive. */
static err_code scaling_number(const reader *rd, const json_value *scaling, const char *kind, const char *key, double *out) {
    const json_value *v = json_get(scaling, key);
    if (!v) return refuse(rd, "rope_scaling (%s) lacks '%s'", kind, key);
    if (!is_number(v)) return refuse(rd, "rope_scaling (%s): '%s' = %s, expected a number", kind, key, r(v));
    if (!(v->num > 0 && isfinite(v->num)))
        return refuse(rd, "rope_scaling (%s): '%s' = %s, expected a positive finite value", kind, key, r(v));
    *out = v->num;
    return ERR_OK;
}

static err_code rope_inv_freq(const reader *rd, model_spec *s, const json_value *scaling) {
    int n = s->head_dim / 2;
    double *f = s->rope_inv_freq_f64;
    for (int i = 0; i < n; i++) f[i] = 1.0 / pow(s->rope_theta, (double)(2 * i) / s->head_dim);
    s->rope_scaling = "none";
    if (truthy(scaling)) {
        const json_value *kind = json_get(scaling, "rope_type");
        if (!kind) kind = json_get(scaling, "type");
        if (is_str(kind, "default")) {
        } else if (is_str(kind, "linear")) {
            double factor;
            err_code rc = scaling_number(rd, scaling, "linear", "factor", &factor);
            if (rc) return rc;
            for (int i = 0; i < n; i++) f[i] = f[i] / factor;
            s->rope_scaling = "linear";
        } else if (is_str(kind, "llama3")) {
            double factor, low, high, old_ctx;
            err_code rc;
            if ((rc = scaling_number(rd, scaling, "llama3", "factor", &factor)) ||
                (rc = scaling_number(rd, scaling, "llama3", "low_freq_factor", &low)) ||
                (rc = scaling_number(rd, scaling, "llama3", "high_freq_factor", &high)) ||
                (rc = scaling_number(rd, scaling, "llama3", "original_max_position_embeddings", &old_ctx)))
                return rc;
            if (high <= low) {
                char lo[REPR_MAX + 8];
                snprintf(lo, sizeof lo, "%s", r(json_get(scaling, "low_freq_factor")));
                return refuse(rd, "rope_scaling (llama3): 'high_freq_factor' = %s must be greater than 'low_freq_factor' = %s",
                              r(json_get(scaling, "high_freq_factor")), lo);
            }
            double low_wavelen = old_ctx / low, high_wavelen = old_ctx / high;
            for (int i = 0; i < n; i++) {
                double wavelen = 2 * M_PI / f[i];
                if (wavelen < high_wavelen) {
                } else if (wavelen > low_wavelen) {
                    f[i] = f[i] / factor;
                } else {
                    double smooth = (old_ctx / wavelen - low) / (high - low);
                    f[i] = (1 - smooth) * f[i] / factor + smooth * f[i];
                }
            }
            s->rope_scaling = "llama3";
        } else {
            return refuse(rd, "rope_scaling type %s is not supported (supported: default, linear, llama3)", r(kind));
        }
    }
    for (int i = 0; i < n; i++)
        if (!isfinite(f[i]) || isinf((float)f[i])) return refuse(rd, "'rope_theta' = %s gives RoPE frequencies that are not finite", r_float(s->rope_theta));
    for (int i = 0; i < n; i++) s->rope_inv_freq[i] = (float)f[i];
    return ERR_OK;
}

// ----------------------------------------------------------------------------------------------
// The tensor table: spec.py's Spec.tensors

/* Appends one tensor: its name (printf format, into storage at *used) and shape. */
static void add_tensor(model_spec *s, size_t *used, size_t cap, int ndim, long long rows, long long cols,
                       const char *fmt, int layer) {
    st_tensor_spec *t = &s->tensors[s->n_tensors++];
    char *name = s->storage + *used;
    int n = snprintf(name, cap - *used, fmt, layer);
    *used += (size_t)n + 1;
    t->name = name;
    t->dtype = s->dtype;
    t->ndim = ndim;
    t->shape[0] = rows;
    t->shape[1] = cols;
}

static err_code build_tensors(model_spec *s, const char *name) {
    const int per_layer = 9 + 3 * s->qkv_bias + s->o_bias;
    s->layer_tensors = per_layer;
    size_t max_tensors = 3 + (size_t)s->n_layers * per_layer;
    size_t cap = strlen(name) + 1 + max_tensors * 64; /* the longest name is 51 bytes with layer 2^31 */
    s->tensors = calloc(max_tensors, sizeof *s->tensors);
    s->storage = malloc(cap);
    if (!s->tensors || !s->storage) return err_set(ERR_NOMEM, "tensor table of %zu tensors", max_tensors);
    size_t used = 0;
    memcpy(s->storage, name, strlen(name) + 1);
    s->name = s->storage;
    used += strlen(name) + 1;
    const long long d = s->dim, q = s->q_dim, kv = s->kv_dim, h = s->hidden_dim, v = s->vocab_size;
    add_tensor(s, &used, cap, 2, v, d, "model.embed_tokens.weight", 0);
    for (int l = 0; l < s->n_layers; l++) {
        add_tensor(s, &used, cap, 1, d, 0, "model.layers.%d.input_layernorm.weight", l);
        add_tensor(s, &used, cap, 2, q, d, "model.layers.%d.self_attn.q_proj.weight", l);
        add_tensor(s, &used, cap, 2, kv, d, "model.layers.%d.self_attn.k_proj.weight", l);
        add_tensor(s, &used, cap, 2, kv, d, "model.layers.%d.self_attn.v_proj.weight", l);
        if (s->qkv_bias) {
            add_tensor(s, &used, cap, 1, q, 0, "model.layers.%d.self_attn.q_proj.bias", l);
            add_tensor(s, &used, cap, 1, kv, 0, "model.layers.%d.self_attn.k_proj.bias", l);
            add_tensor(s, &used, cap, 1, kv, 0, "model.layers.%d.self_attn.v_proj.bias", l);
        }
        add_tensor(s, &used, cap, 2, d, q, "model.layers.%d.self_attn.o_proj.weight", l);
        if (s->o_bias) add_tensor(s, &used, cap, 1, d, 0, "model.layers.%d.self_attn.o_proj.bias", l);
        add_tensor(s, &used, cap, 1, d, 0, "model.layers.%d.post_attention_layernorm.weight", l);
        add_tensor(s, &used, cap, 2, h, d, "model.layers.%d.mlp.gate_proj.weight", l);
        add_tensor(s, &used, cap, 2, h, d, "model.layers.%d.mlp.up_proj.weight", l);
        add_tensor(s, &used, cap, 2, d, h, "model.layers.%d.mlp.down_proj.weight", l);
    }
    add_tensor(s, &used, cap, 1, d, 0, "model.norm.weight", 0);
    if (!s->tied_embeddings) add_tensor(s, &used, cap, 2, v, d, "lm_head.weight", 0);

    return ERR_OK;
}

// ----------------------------------------------------------------------------------------------
// quantization_config: spec.py's quantization (/work/notes/quant_contract.md)

/* The block formats "formats" may name, in the order spec.py's message lists their names. */
static const int QUANT_TYPES[] = {QUANT_Q4_0, QUANT_Q4_1, QUANT_Q4_K, QUANT_Q5_K, QUANT_Q6_K, QUANT_Q8_0};
#define N_QUANT_TYPES (int)(sizeof QUANT_TYPES / sizeof QUANT_TYPES[0])

/* spec.py MATRIX_FIELDS: the fields that may be quantized, by the end of their tensors' names. */
enum { F_EMBED, F_WQ, F_WK, F_WV, F_WO, F_W_GATE, F_W_UP, F_W_DOWN, F_LM_HEAD, N_MATRIX_FIELDS };
static const char *const MATRIX_SUFFIX[N_MATRIX_FIELDS] = {
    "model.embed_tokens.weight", ".self_attn.q_proj.weight", ".self_attn.k_proj.weight",
    ".self_attn.v_proj.weight",  ".self_attn.o_proj.weight", ".mlp.gate_proj.weight",
    ".mlp.up_proj.weight",       ".mlp.down_proj.weight",    "lm_head.weight"};

/* The matrix field of a tensor of the table, or -1 for a norm or a bias. */
static int field_of(const char *name) {
    size_t n = strlen(name);
    for (int f = 0; f < N_MATRIX_FIELDS; f++) {
        size_t k = strlen(MATRIX_SUFFIX[f]);
        if (n >= k && strcmp(name + n - k, MATRIX_SUFFIX[f]) == 0) return f;
    }
    return -1;
}

static int dense_format(st_dtype dt) { return dt == DT_F32 ? QUANT_F32 : dt == DT_F16 ? QUANT_F16 : QUANT_BF16; }

static const char *format_name(int type) { return quant_format_of(type)->name; }

/* Reads quantization_config's "formats" into fmt (each tensor's format, dense unless named),
 * checking entry by entry in the file's order: name, matrix, type, row length. */
static err_code read_formats(const reader *rd, const model_spec *s, int *fmt) {
    const json_value *qc = json_get(rd->cfg, "quantization_config");
    if (is_null(qc)) return ERR_OK;
    if (qc->type != JSON_OBJECT) return refuse(rd, "'quantization_config' = %s, expected an object or null", r(qc));
    const json_value *method = json_get(qc, "quant_method");
    if (!is_str(method, "ingot")) return refuse(rd, "quantization_config 'quant_method' = %s, expected 'ingot'", r(method));
    const json_value *formats = json_get(qc, "formats");
    if (!formats || formats->type != JSON_OBJECT)
        return refuse(rd, "quantization_config 'formats' = %s, expected an object", r(formats));
    json_for_each(e, formats) {
        char name[REPR_MAX + 8];
        json_value key = {.type = JSON_STRING, .str = e->key, .n = e->key_len};
        snprintf(name, sizeof name, "%s", r(&key));
        int t = 0;
        while (t < s->n_tensors && !((size_t)e->key_len == strlen(s->tensors[t].name) &&
                                     memcmp(e->key, s->tensors[t].name, (size_t)e->key_len) == 0))
            t++;
        if (t == s->n_tensors) return refuse(rd, "quantization_config 'formats': %s is not a tensor of this model", name);
        const st_tensor_spec *ts = &s->tensors[t];
        if (field_of(ts->name) < 0)
            return refuse(rd, "quantization_config 'formats': %s is not a matrix; only matrices may be quantized", name);
        int type = -1;
        for (int i = 0; i < N_QUANT_TYPES; i++)
            if (is_str(e, format_name(QUANT_TYPES[i]))) type = QUANT_TYPES[i];
        if (type < 0)
            return refuse(rd, "quantization_config 'formats': %s = %s, expected one of ['Q4_0', 'Q4_1', 'Q4_K', 'Q5_K', 'Q6_K', 'Q8_0']",
                          name, r(e));
        int block = quant_format_of(type)->block;
        if (ts->shape[1] % block)
            return refuse(rd, "quantization_config 'formats': %s: row length %lld is not a multiple of %s's block of %d",
                          ts->name, (long long)ts->shape[1], format_name(type), block);
        fmt[t] = type;
    }
    return ERR_OK;
}

/* Where layer_formats keeps a layer field's format. */
static int *layer_format_of(model_layer_formats *lf, int field) {
    switch (field) {
    case F_WQ: return &lf->wq;
    case F_WK: return &lf->wk;
    case F_WV: return &lf->wv;
    case F_WO: return &lf->wo;
    case F_W_GATE: return &lf->w_gate;
    case F_W_UP: return &lf->w_up;
    case F_W_DOWN: return &lf->w_down;
    }
    return NULL;
}

/* Checks quantization_config against the tensor table (read_formats); then sets the format_*
 * fields (a layer field whose layers differ: QUANT_MIXED) and layer_formats, and turns each
 * quantized tensor's entry into its U8 bytes. */
static err_code quantization(const reader *rd, model_spec *s) {
    const int dense = dense_format(s->dtype);
    int *fmt = malloc((size_t)s->n_tensors * sizeof *fmt); /* each tensor's format */
    s->layer_formats = malloc((size_t)s->n_layers * sizeof *s->layer_formats);
    if (!fmt || !s->layer_formats) {
        free(fmt);
        return err_set(ERR_NOMEM, "formats of %d tensors", s->n_tensors);
    }
    for (int t = 0; t < s->n_tensors; t++) fmt[t] = dense;
    err_code rc = read_formats(rd, s, fmt);
    if (rc) {
        free(fmt);
        return rc;
    }
    int field_format[N_MATRIX_FIELDS], seen[N_MATRIX_FIELDS] = {0};
    s->quantized = 0;
    for (int t = 0; t < s->n_tensors; t++) {
        const int f = field_of(s->tensors[t].name);
        if (f < 0) continue;
        if (!seen[f]) field_format[f] = fmt[t];
        else if (field_format[f] != fmt[t]) field_format[f] = QUANT_MIXED;
        seen[f] = 1;
        if (f != F_EMBED && f != F_LM_HEAD) /* layer l's tensors follow the embedding, layer_tensors a layer */
            *layer_format_of(&s->layer_formats[(t - 1) / s->layer_tensors], f) = fmt[t];
        if (fmt[t] == dense) continue;
        s->quantized = 1;
        st_tensor_spec *ts = &s->tensors[t];
        size_t bytes;
        if ((rc = quant_row_bytes(fmt[t], ts->shape[1], &bytes))) break; /* checked by read_formats: cannot fail */
        ts->dtype = DT_U8;
        ts->shape[1] = (int64_t)bytes;
    }
    free(fmt);
    if (rc) return rc;
    if (s->tied_embeddings) field_format[F_LM_HEAD] = field_format[F_EMBED];
    int *out[N_MATRIX_FIELDS] = {&s->format_embed, &s->format_wq,     &s->format_wk,   &s->format_wv,     &s->format_wo,
                                 &s->format_w_gate, &s->format_w_up, &s->format_w_down, &s->format_lm_head};
    for (int f = 0; f < N_MATRIX_FIELDS; f++) *out[f] = field_format[f];

    /* weight_bytes: every tensor as stored but the embedding table, plus one row of it (all of it
     * when tied) */
    unsigned long long total = 0;
    for (int t = 0; t < s->n_tensors; t++) {
        const st_tensor_spec *ts = &s->tensors[t];
        unsigned long long rows = (unsigned long long)ts->shape[0];
        unsigned long long row = (ts->ndim == 2 ? (unsigned long long)ts->shape[1] : 1) * st_dtype_size(ts->dtype);
        total += t == 0 && !s->tied_embeddings ? row : rows * row;
    }
    s->weight_bytes = total;
    s->kv_bytes_per_pos = (unsigned long long)s->n_layers * 2 * s->kv_dim * 2;
    return ERR_OK;
}

// ----------------------------------------------------------------------------------------------
// spec.py's spec_from_config

static const char *const ARCHITECTURES[][2] = {
    {"LlamaForCausalLM", "llama"}, {"MistralForCausalLM", "mistral"}, {"Qwen2ForCausalLM", "qwen2"}};

static err_code from_config(const reader *rd, model_spec *s) {
    const json_value *cfg = rd->cfg;
    err_code rc;

    const json_value *archs = json_get(cfg, "architectures");
    json_value empty = {.type = JSON_ARRAY};
    if (!truthy(archs)) archs = &empty;
    int a = -1;
    if (archs->type == JSON_ARRAY && archs->n == 1)
        for (int i = 0; i < 3; i++)
            if (is_str(archs->child, ARCHITECTURES[i][0])) a = i;
    if (a < 0)
        return refuse(rd, "'architectures' = %s, expected one of ['LlamaForCausalLM', 'MistralForCausalLM', 'Qwen2ForCausalLM']",
                      r(archs));
    s->architecture = ARCHITECTURES[a][0];
    s->family = ARCHITECTURES[a][1];
    int qwen2 = strcmp(s->family, "qwen2") == 0;

    const json_value *act = json_get(cfg, "hidden_act");
    if (act && !is_str(act, "silu")) return refuse(rd, "'hidden_act' = %s, only 'silu' is supported", r(act));
    if (truthy(json_get(cfg, "mlp_bias"))) return refuse(rd, "'mlp_bias' = true is not supported");
    if (qwen2) {
        s->qkv_bias = 1;
        if (truthy(json_get(cfg, "use_sliding_window"))) return refuse(rd, "'use_sliding_window' = true is not supported");
    } else {
        s->qkv_bias = 0;
        if ((rc = get_bool(rd, "attention_bias", &s->qkv_bias))) return rc;
    }
    s->o_bias = s->qkv_bias && !qwen2;

    if ((rc = get_int(rd, "hidden_size", REQUIRED, &s->dim))) return rc;
    if ((rc = get_int(rd, "num_attention_heads", REQUIRED, &s->n_heads))) return rc;
    s->n_kv_heads = s->n_heads;
    if ((rc = get_int(rd, "num_key_value_heads", OPTIONAL, &s->n_kv_heads))) return rc;
    if (s->n_heads % s->n_kv_heads)
        return refuse(rd, "'num_attention_heads' = %d is not a multiple of 'num_key_value_heads' = %d", s->n_heads, s->n_kv_heads);
    if (!is_null(json_get(cfg, "head_dim"))) {
        if ((rc = get_int(rd, "head_dim", REQUIRED, &s->head_dim))) return rc;
    } else {
        if (s->dim % s->n_heads)
            return refuse(rd, "'hidden_size' = %d is not a multiple of 'num_attention_heads' = %d", s->dim, s->n_heads);
        s->head_dim = s->dim / s->n_heads;
    }
    if (s->head_dim % 2) return refuse(rd, "head dimension %d is odd; RoPE needs pairs", s->head_dim);
    if ((rc = get_int(rd, "max_position_embeddings", REQUIRED, &s->seq_len))) return rc;

    const json_value *window = json_get(cfg, "sliding_window");
    if (strcmp(s->family, "mistral") == 0 && !is_null(window)) {
        if (!is_number(window)) return refuse(rd, "'sliding_window' = %s, expected a number or null", r(window));
        if (window->num < s->seq_len)
            return refuse(rd, "'sliding_window' = %s is smaller than the context %d; sliding-window attention is not supported",
                          r(window), s->seq_len);
    }

    /* transformers >= 4.56 may keep theta and scaling under "rope_parameters" */
    const json_value *rope_params = json_get(cfg, "rope_parameters");
    if (!rope_params || rope_params->type != JSON_OBJECT) rope_params = NULL;
    const json_value *theta = rope_params ? json_get(rope_params, "rope_theta") : NULL;
    if (!theta) theta = json_get(cfg, "rope_theta");
    s->rope_theta = 10000.0;
    if (theta) {
        if (!is_number(theta)) return refuse(rd, "'rope_theta' = %s, expected a number", r(theta));
        s->rope_theta = theta->num;
    }
    if (s->rope_theta <= 0) return refuse(rd, "'rope_theta' = %s, expected a positive value", r_float(s->rope_theta));
    if (!isfinite(s->rope_theta)) return refuse(rd, "'rope_theta' = %s, expected a finite value", r_float(s->rope_theta));
    const json_value *scaling = json_get(cfg, "rope_scaling");
    if (!truthy(scaling)) {
        const json_value *kind = rope_params ? json_get(rope_params, "rope_type") : NULL;
        scaling = !is_null(kind) && !is_str(kind, "default") ? rope_params : NULL;
    }
    if (!is_null(scaling) && scaling->type != JSON_OBJECT)
        return refuse(rd, "'rope_scaling' = %s, expected an object or null", r(scaling));
    s->rope_inv_freq = malloc((size_t)(s->head_dim / 2) * sizeof *s->rope_inv_freq);
    s->rope_inv_freq_f64 = malloc((size_t)(s->head_dim / 2) * sizeof *s->rope_inv_freq_f64);
    if (!s->rope_inv_freq || !s->rope_inv_freq_f64) return err_set(ERR_NOMEM, "RoPE table of %d", s->head_dim / 2);
    if ((rc = rope_inv_freq(rd, s, is_null(scaling) ? NULL : scaling))) return rc;

    const json_value *torch_dtype = json_get(cfg, "torch_dtype");
    if (!torch_dtype) torch_dtype = json_get(cfg, "dtype");
    if (!torch_dtype) s->dtype = DT_BF16;
    else if (is_str(torch_dtype, "bfloat16")) s->dtype = DT_BF16;
    else if (is_str(torch_dtype, "float16")) s->dtype = DT_F16;
    else if (is_str(torch_dtype, "float32")) s->dtype = DT_F32;
    else return refuse(rd, "'torch_dtype' = %s, expected one of ['bfloat16', 'float16', 'float32']", r(torch_dtype));
    s->dtype_bytes = (int)st_dtype_size(s->dtype);

    const json_value *eos = json_get(cfg, "eos_token_id");
    int n_eos = is_null(eos) ? 0 : eos->type == JSON_ARRAY ? eos->n : 1;
    s->eos_ids = malloc((size_t)(n_eos ? n_eos : 1) * sizeof *s->eos_ids);
    if (!s->eos_ids) return err_set(ERR_NOMEM, "eos ids");
    s->n_eos = 0;
    if (!is_null(eos)) {
        const json_value *e = eos->type == JSON_ARRAY ? eos->child : eos;
        for (; e; e = eos->type == JSON_ARRAY ? e->next : NULL) {
            if (!is_int(e) || e->num < 0 || e->num > MAX_ID)
                return refuse(rd, "'eos_token_id' = %s, expected an id or a list of ids", r(eos));
            s->eos_ids[s->n_eos++] = (int)e->num;
        }
    }
    const json_value *bos = json_get(cfg, "bos_token_id");
    s->bos_id = is_int(bos) && bos->num >= 0 && bos->num <= MAX_ID ? (int)bos->num : -1;

    if ((rc = get_int(rd, "vocab_size", REQUIRED, &s->vocab_size))) return rc;
    if ((rc = get_int(rd, "intermediate_size", REQUIRED, &s->hidden_dim))) return rc;
    if ((rc = get_int(rd, "num_hidden_layers", REQUIRED, &s->n_layers))) return rc;
    s->norm_eps = 1e-6;
    if ((rc = get_float(rd, "rms_norm_eps", &s->norm_eps))) return rc;
    s->tied_embeddings = 0;
    if ((rc = get_bool(rd, "tie_word_embeddings", &s->tied_embeddings))) return rc;
    for (int i = 0; i < s->n_eos; i++)
        if (s->eos_ids[i] >= s->vocab_size)
            return refuse(rd, "'eos_token_id' %d is outside the vocabulary (%d)", s->eos_ids[i], s->vocab_size);

    s->q_dim = s->n_heads * s->head_dim;
    s->kv_dim = s->n_kv_heads * s->head_dim;
    s->kv_mul = s->n_heads / s->n_kv_heads;
    return ERR_OK;
}

static const char *basename_of(const char *dir, char *buf, size_t cap) {
    char *real = realpath(dir, NULL);
    const char *p = real ? real : dir;
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/') n--;
    size_t start = n;
    while (start > 0 && p[start - 1] != '/') start--;
    snprintf(buf, cap, "%.*s", (int)(n - start), p + start);
    free(real);
    return buf;
}

err_code model_config_parse(const char *dir, json_doc *doc, char *path, size_t path_cap) {
    snprintf(path, path_cap, "%s/config.json", dir);
    err_code rc = json_parse_file(path, doc);
    return rc == ERR_JSON ? ERR_CONFIG : rc; /* the detail names the file and the byte */
}

err_code model_spec_load(model_spec *s, const char *dir) {
    memset(s, 0, sizeof *s);
    char path[4096];
    json_doc doc;
    err_code rc = model_config_parse(dir, &doc, path, sizeof path);
    if (rc) return rc;
    reader rd = {path, doc.root};
    char name[1024];
    if (doc.root->type != JSON_OBJECT) rc = err_set(ERR_CONFIG, "%s: expected a JSON object", path);
    else rc = from_config(&rd, s);
    if (!rc) rc = build_tensors(s, basename_of(dir, name, sizeof name));
    if (!rc) rc = quantization(&rd, s);
    json_free(&doc);
    if (rc) model_spec_free(s);
    return rc;
}

void model_spec_free(model_spec *s) {
    free(s->eos_ids);
    free(s->rope_inv_freq);
    free(s->rope_inv_freq_f64);
    free(s->tensors);
    free(s->storage);
    free(s->layer_formats);
    memset(s, 0, sizeof *s);
}
