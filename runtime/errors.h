/* errors.h - the one table of error codes for ingot's library code.
 *
 * Library functions never print or exit: they return an err_code and record a detail line with
 * err_set() (the thing that failed and what was expected). Only main() prints, as
 * "<err_name(code)>: <err_detail()>", and exits non-zero. The detail buffer is thread-local so
 * that helpers on worker threads cannot garble each other's messages. */
#ifndef INGOT_ERRORS_H
#define INGOT_ERRORS_H

#include <stddef.h>

typedef enum {
    ERR_OK = 0,
    ERR_ARG,          /* bad command-line flag or value */
    ERR_IO,           /* a file cannot be opened, read or mapped */
    ERR_NOMEM,        /* an allocation failed */
    ERR_JSON,         /* malformed JSON */
    ERR_CONFIG,       /* config.json does not match the model this binary was built for */
    ERR_ST_HEADER,    /* safetensors header: length, JSON or entry malformed */
    ERR_ST_TRUNCATED, /* safetensors data shorter than the header says */
    ERR_ST_OFFSETS,   /* safetensors offsets out of bounds or overlapping */
    ERR_ST_DTYPE,     /* a tensor's dtype is not what the model needs */
    ERR_ST_SHAPE,     /* a tensor's shape is not what the model needs */
    ERR_ST_MISSING,   /* a tensor the model needs is not in the files */
    ERR_ST_EXTRA,     /* a tensor in the files that the model does not have */
    ERR_ST_NONFINITE, /* a weight is NaN or infinite (--check-weights) */
    ERR_TOKENIZER,    /* tokenizer.json is malformed or uses an unsupported feature */
    ERR_UTF8,         /* text input is not valid UTF-8 */
    ERR_CONTEXT,      /* the tokens do not fit in the context */
    ERR_DEVICE,       /* the requested device is not available in this build or machine */
    ERR_QUANT,        /* a quantized type or row length the block formats cannot honour */
    ERR_COUNT
} err_code;

#ifdef __cplusplus
extern "C" {
#endif

/* A fixed message for each code, e.g. "safetensors: tensor shape mismatch". */
const char *err_name(err_code code);

/* Records the detail line (printf format) and returns code, so callers can write
 * `return err_set(ERR_IO, "%s: %s", path, strerror(errno));`. */
err_code err_set(err_code code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The detail line of the last err_set() on this thread ("" if none). */
const char *err_detail(void);

#ifdef __cplusplus
}
#endif

/* Length of the valid UTF-8 character at s[0..n) whose first byte is >= 0x80 (overlong forms,
 * surrogates and code points above U+10FFFF are invalid), or 0. */
int utf8_valid_len(const char *s, size_t n);

#endif
