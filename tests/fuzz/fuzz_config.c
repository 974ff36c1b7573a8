/* fuzz_config.c - libFuzzer target: an arbitrary config.json through runtime/model_spec.c (the
 * generic build's twin of codegen/spec.py). An accepted spec must hold the invariants the kernels
 * rely on; tests/test_model_spec.py checks the verdicts against spec.py. */
#include <math.h>

#include "fuzz_common.h"
#include "model_spec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_write("config.json", data, size);
    model_spec s;
    err_code rc = model_spec_load(&s, fuzz_dir());
    if (rc) {
        fuzz_check_detail(err_detail());
        return 0;
    }
    if (s.dim <= 0 || s.n_heads <= 0 || s.n_kv_heads <= 0 || s.n_heads % s.n_kv_heads || s.head_dim % 2 ||
        s.q_dim != s.n_heads * s.head_dim || s.kv_dim != s.n_kv_heads * s.head_dim || s.vocab_size <= 0 ||
        s.seq_len <= 0 || s.n_layers <= 0 || !(s.norm_eps > 0) || !isfinite(s.norm_eps))
        abort();
    for (int i = 0; i < s.head_dim / 2; i++)
        if (!isfinite(s.rope_inv_freq[i])) abort();
    for (int i = 0; i < s.n_eos; i++)
        if (s.eos_ids[i] < 0 || s.eos_ids[i] >= s.vocab_size) abort();
    model_spec_free(&s);
    return 0;
}
