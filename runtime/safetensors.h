/* safetensors.h - maps a model's safetensors weights and checks them against what the binary was
 * built for.
 *
 * A model directory holds either model.safetensors or model.safetensors.index.json plus the shards
 * it names. st_model_open() maps every file read-only and validates each header completely: the
 * 8-byte header length against the file size, the JSON, every entry's dtype, shape and
 * data_offsets (inside the data section, consistent with dtype x shape, not overlapping).
 * st_model_bind() then looks up the tensors the generated code needs (its table of
 * st_tensor_spec), checks dtype and shape, and refuses any tensor the model does not have, so
 * weights of another model are never silently used. Errors name the file, the tensor, what was
 * expected and what was found. */
#ifndef INGOT_SAFETENSORS_H
#define INGOT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "errors.h"

/* DT_U8: bytes, as a quantized matrix is stored: shape [rows, row_bytes], each row a GGUF block
 * format's blocks (the format is config.json's quantization_config; runtime/quant.h). */
typedef enum { DT_F32, DT_F16, DT_BF16, DT_U8 } st_dtype;

#define ST_MAX_DIMS 4
#define ST_MAX_SHARDS 64

/* One tensor the generated code expects. */
typedef struct {
    const char *name;          /* HF name, e.g. "model.layers.0.self_attn.q_proj.weight" */
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS]; /* row-major, as in the file */
} st_tensor_spec;

#ifdef __cplusplus
extern "C" {
#endif

typedef struct st_model st_model;

/* Maps dir/model.safetensors, or the shards listed by dir/model.safetensors.index.json. */
err_code st_model_open(st_model **out, const char *dir);

/* For each of specs[0..n) sets data[i] to its bytes in the mapping. Every tensor in the files must
 * be in specs, except names for which ignore(name) returns nonzero (may be NULL), e.g.
 * "model.layers.N.self_attn.rotary_emb.inv_freq" that some exporters write. */
err_code st_model_bind(const st_model *m, const st_tensor_spec *specs, int n, const void **data,
                       int (*ignore)(const char *name));

/* Scans tensors[0..n) (specs[i]'s bytes at data[i], as st_model_bind gave them) for NaN and
 * infinity: ERR_ST_NONFINITE naming the first tensor that holds one, the element and its value.
 * U8 tensors are skipped: bytes are never NaN, and their blocks' scales need the format to find. */
err_code st_check_finite(const st_tensor_spec *specs, const void *const *data, int n);

/* Total bytes of tensor data across all files. */
size_t st_model_data_bytes(const st_model *m);

void st_model_close(st_model *m);

const char *st_dtype_name(st_dtype dt); /* "F32", "F16", "BF16", "U8" */
size_t st_dtype_size(st_dtype dt);

#ifdef __cplusplus
}
#endif

#endif
