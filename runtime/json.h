/* json.h - a small strict JSON parser (RFC 8259) for config.json, safetensors headers and
 * tokenizer.json.
 *
 * json_parse() builds a tree in one arena owned by the json_doc. Strings (values and keys) are
 * decoded (escapes, \uXXXX with surrogate pairs) into NUL-terminated UTF-8 with an explicit byte
 * length, since a decoded string may hold "\u0000". Strings must be valid UTF-8 (as RFC 8259 and
 * Python's json require), so every string a caller gets is. An object may not name a key twice:
 * parsers disagree on which of two values counts (Python takes the last, others the first), so
 * the document is refused; codegen/spec.py refuses it too. Numbers are doubles; integers up to 2^53
 * are exact, which covers every safetensors offset we can map. */
#ifndef INGOT_JSON_H
#define INGOT_JSON_H

#include <stddef.h>

#include "errors.h"

typedef enum { JSON_NULL, JSON_FALSE, JSON_TRUE, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } json_type;

typedef struct json_value {
    json_type type;
    int n;                   /* STRING: decoded byte length; ARRAY/OBJECT: number of children;
                              * NUMBER: 1 when written as an integer (no fraction, no exponent) */
    const char *str;         /* STRING: decoded text, NUL-terminated */
    double num;              /* NUMBER */
    const char *key;         /* member of an OBJECT: its decoded key, NUL-terminated */
    int key_len;             /* bytes in key */
    struct json_value *child; /* ARRAY/OBJECT: first child, in document order */
    struct json_value *next;  /* next sibling */
} json_value;

typedef struct {
    json_value *root;
    json_value *nodes; /* the arena: every value of the document */
    size_t n_nodes;
    char *strings;     /* decoded strings and keys */
} json_doc;

/* Parses text[0..len). On error returns ERR_JSON with a detail naming the byte offset and what
 * was expected; doc is then empty and needs no json_free. */
err_code json_parse(const char *text, size_t len, json_doc *doc);
void json_free(json_doc *doc);

/* Reads the file at path and parses it: ERR_IO naming the path when it cannot be read or is not a
 * regular file of at most FILE_JSON_MAX bytes (files.h; errno is left as a failed open set it, so
 * ENOENT tells a missing file), else json_parse's result, its detail after the path
 * ("config.json: at byte 12: expected ..."). */
err_code json_parse_file(const char *path, json_doc *doc);

/* The member of obj named key, or NULL if obj is not an object or has no such member.
 * Linear in the number of members: index large objects once instead of calling this in a loop. */
const json_value *json_get(const json_value *obj, const char *key);

/* Convenience for optional members: true if v is a number holding an integer (|x| < 2^53). */
int json_is_int(const json_value *v);

#define json_for_each(it, parent) \
    for (const json_value *it = (parent) ? (parent)->child : NULL; it; it = it->next)

#endif
