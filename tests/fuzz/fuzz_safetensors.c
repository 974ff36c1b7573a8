/* fuzz_safetensors.c - libFuzzer target: runtime/safetensors.c on an arbitrary model.safetensors
 * (header and data), bound against a small tensor table and scanned for non-finite values. */
#include "fuzz_common.h"
#include "safetensors.h"

static const st_tensor_spec SPECS[] = {
    {"w", DT_F32, 2, {2, 2}},
    {"b", DT_BF16, 1, {4}},
    {"h", DT_F16, 1, {3}},
};

static int ignore(const char *name) { return strstr(name, "inv_freq") != NULL; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_write("model.safetensors", data, size);
    st_model *m;
    err_code rc = st_model_open(&m, fuzz_dir());
    if (rc) {
        fuzz_check_detail(err_detail());
        return 0;
    }
    const void *ptrs[3];
    rc = st_model_bind(m, SPECS, 3, ptrs, ignore);
    if (!rc) rc = st_check_finite(SPECS, ptrs, 3);
    if (rc) fuzz_check_detail(err_detail());
    (void)st_model_data_bytes(m);
    st_model_close(m);
    return 0;
}
