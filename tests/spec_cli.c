/* spec_cli.c - a command-line driver of the run-time spec, for the tests (tests/test_model_spec.py).
 *
 *   spec_cli MODEL_DIR         prints MODEL_DIR/config.json's model_spec as one JSON object; an
 *                              error prints one line, "<err_name>: <detail>", on stderr and exits 1
 *   spec_cli DIR1 DIR2 ...     one line on stdout for each: the JSON object, or "!" and the error
 *                              line (the differential test runs thousands of configs at once) */
#include <stdio.h>

#include "../runtime/model_spec.h"
#include "../runtime/quant.h"

static void print_ints(const char *key, const int *v, int n) {
    printf("\"%s\": [", key);
    for (int i = 0; i < n; i++) printf("%s%d", i ? ", " : "", v[i]);
    printf("], ");
}

/* A format's name as spec.py's Spec.formats writes it: MIXED for a field whose layers differ. */
static const char *format_name(int type) { return type == QUANT_MIXED ? "MIXED" : quant_format_of(type)->name; }

static void print_spec(const model_spec *ps) {
    const model_spec s = *ps;
    printf("{\"name\": \"%s\", \"architecture\": \"%s\", \"family\": \"%s\", ", s.name, s.architecture, s.family);
    printf("\"dim\": %d, \"hidden_dim\": %d, \"n_layers\": %d, \"n_heads\": %d, \"n_kv_heads\": %d, \"head_dim\": %d, ",
           s.dim, s.hidden_dim, s.n_layers, s.n_heads, s.n_kv_heads, s.head_dim);
    printf("\"q_dim\": %d, \"kv_dim\": %d, \"kv_mul\": %d, \"vocab_size\": %d, \"seq_len\": %d, ", s.q_dim, s.kv_dim,
           s.kv_mul, s.vocab_size, s.seq_len);
    printf("\"norm_eps\": %.17g, \"rope_theta\": %.17g, \"rope_scaling\": \"%s\", ", s.norm_eps, s.rope_theta, s.rope_scaling);
    printf("\"qkv_bias\": %s, \"o_bias\": %s, \"tied_embeddings\": %s, ", s.qkv_bias ? "true" : "false",
           s.o_bias ? "true" : "false", s.tied_embeddings ? "true" : "false");
    printf("\"dtype\": \"%s\", \"dtype_bytes\": %d, \"bos_id\": %d, ", st_dtype_name(s.dtype), s.dtype_bytes, s.bos_id);
    print_ints("eos_ids", s.eos_ids, s.n_eos);
    const int formats[] = {s.format_embed, s.format_wq,     s.format_wk,   s.format_wv,     s.format_wo,
                           s.format_w_gate, s.format_w_up, s.format_w_down, s.format_lm_head};
    printf("\"formats\": [");
    for (int i = 0; i < 9; i++) printf("%s\"%s\"", i ? ", " : "", format_name(formats[i]));
    printf("], \"layer_formats\": [");
    for (int l = 0; l < s.n_layers; l++) {
        const model_layer_formats *f = &s.layer_formats[l];
        printf("%s[\"%s\", \"%s\", \"%s\", \"%s\", \"%s\", \"%s\", \"%s\"]", l ? ", " : "", format_name(f->wq),
               format_name(f->wk), format_name(f->wv), format_name(f->wo), format_name(f->w_gate), format_name(f->w_up),
               format_name(f->w_down));
    }
    printf("], \"quantized\": %s, ", s.quantized ? "true" : "false");
    printf("\"weight_bytes\": %llu, \"kv_bytes_per_pos\": %llu, ", s.weight_bytes, s.kv_bytes_per_pos);
    printf("\"rope_inv_freq\": [");
    for (int i = 0; i < s.head_dim / 2; i++) printf("%s%.17g", i ? ", " : "", s.rope_inv_freq_f64[i]);
    printf("], \"rope_inv_freq_f32\": [");
    for (int i = 0; i < s.head_dim / 2; i++) printf("%s%.9e", i ? ", " : "", (double)s.rope_inv_freq[i]);
    printf("], \"layer_tensors\": %d, \"tensors\": [", s.layer_tensors);
    for (int t = 0; t < s.n_tensors; t++) {
        const st_tensor_spec *ts = &s.tensors[t];
        printf("%s[\"%s\", \"%s\", [", t ? ", " : "", ts->name, st_dtype_name(ts->dtype));
        for (int d = 0; d < ts->ndim; d++) printf("%s%lld", d ? ", " : "", (long long)ts->shape[d]);
        printf("]]");
    }
    printf("]}\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: spec_cli MODEL_DIR...\n");
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        model_spec s;
        err_code rc = model_spec_load(&s, argv[i]);
        if (rc && argc == 2) {
            fprintf(stderr, "%s: %s\n", err_name(rc), err_detail());
            return 1;
        }
        if (rc) {
            printf("!%s: %s\n", err_name(rc), err_detail());
            continue;
        }
        print_spec(&s);
        model_spec_free(&s);
    }
    return 0;
}
