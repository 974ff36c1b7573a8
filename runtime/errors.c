/* errors.c - the message table and the thread-local detail line behind errors.h.
 *
 * A detail line often quotes input (a file name, a JSON key, a token): err_set escapes what could
 * break the line or the terminal, so every message stays one printable line whatever it quotes. */
#include "errors.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

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
    [ERR_ST_NONFINITE] = "safetensors: weights not finite",
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

int utf8_valid_len(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    unsigned c = s[0], lo = 0x80, hi = 0xBF;
    int len;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    else return 0;
    if ((size_t)len > n || s[1] < lo || s[1] > hi) return 0;
    for (int k = 2; k < len; k++)
        if ((s[k] & 0xC0) != 0x80) return 0;
    return len;
}

/* Length of the valid UTF-8 character at s[0..n) that is not a C1 control (U+0080..U+009F), or 0. */
static int printable_utf8(const unsigned char *s, size_t n) {
    const int len = utf8_valid_len((const char *)s, n);
    if (len == 2 && s[0] == 0xC2 && s[1] < 0xA0) return 0; /* C1 controls: CSI (U+009B) starts escape sequences too */
    return len;
}

err_code err_set(err_code code, const char *fmt, ...) {
    char raw[sizeof detail];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof raw ? (size_t)n : sizeof raw - 1;
    /* control characters, DEL and bytes that are not UTF-8 become \xNN; the rest is copied */
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        const unsigned char *s = (const unsigned char *)raw + i;
        int l = *s >= 0x20 && *s < 0x7F ? 1 : *s >= 0x80 ? printable_utf8(s, len - i) : 0;
        if (o + (l ? (size_t)l : 4) + 1 > sizeof detail) break;
        if (l) {
            memcpy(detail + o, s, (size_t)l);
            o += (size_t)l;
            i += (size_t)l;
        } else {
            snprintf(detail + o, 5, "\\x%02X", *s);
            o += 4;
            i++;
        }
    }
    detail[o] = '\0';
    return code;
}

const char *err_detail(void) { return detail; }
