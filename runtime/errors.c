/* errors.c - the message table and the thread-local detail line behind errors.h. */
#include "errors.h"

#include <stdarg.h>
#include <stdio.h>

static const char *const err_names[ERR_COUNT] = {
    [ERR_OK] = "ok",
    [ERR_ARG] = "invalid argument",
    [ERR_IO] = "cannot read file",
    [ERR_NOMEM] = "out of memory",
    [ERR_JSON] = "malformed JSON",
    [ERR_CONFIG] = "config does not match this binary",
    [ERR_ST_HEADER] = "safetensors: bad header",
    [ERR_ST_TRUNCATED] = "safetensors: file truncated",
    [ERR_ST_OFFSETS] = "safetensors: bad data offsets",
    [ERR_ST_DTYPE] = "safetensors: wrong dtype",
    [ERR_ST_SHAPE] = "safetensors: wrong shape",
    [ERR_ST_MISSING] = "safetensors: missing tensor",
    [ERR_ST_EXTRA] = "safetensors: unexpected tensor",
    [ERR_TOKENIZER] = "tokenizer",
    [ERR_UTF8] = "invalid UTF-8",
    [ERR_CONTEXT] = "context length exceeded",
    [ERR_DEVICE] = "device unavailable",
    [ERR_QUANT] = "quantized weights",
};

static _Thread_local char detail[512];

const char *err_name(err_code code) {
    if (code < 0 || code >= ERR_COUNT || !err_names[code]) return "unknown error";
    return err_names[code];
}

err_code err_set(err_code code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    return code;
}

const char *err_detail(void) { return detail; }
