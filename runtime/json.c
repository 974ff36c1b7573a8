/* json.c - recursive-descent JSON parser into an arena of json_value (see json.h).
 *
 * Nodes are appended to a growable array and linked by index while parsing (the array moves when
 * it grows); one pass at the end turns the indices into pointers. Nesting depth is bounded so a
 * hostile header cannot overflow the stack. */
#include "json.h"

#include "files.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bundle.h"

#define JSON_MAX_DEPTH 128
/* Values a document may hold: real tokenizer.json files have about a million (Llama 3: vocab and
 * merges); the cap keeps a hostile file's tree under ~400 MB (96 bytes a value). */
#define JSON_MAX_VALUES ((size_t)1 << 22)

typedef struct {
    const char *s;
    size_t len, pos;
    json_value *nodes;
    size_t n_nodes, cap_nodes;
    size_t *child_idx, *next_idx; /* parallel to nodes: index + 1, 0 for none */
    size_t *key_off, *str_off;    /* offsets into strings, resolved at the end */
    size_t *key_pos;              /* byte of the source where each member's key starts */
    char *strings;
    size_t n_strings;
} parser;

static err_code fail(const parser *p, const char *what) {
    return err_set(ERR_JSON, "at byte %zu: expected %s", p->pos, what);
}

static void skip_ws(parser *p) {
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static err_code new_node(parser *p, json_type type, size_t *out) {
    if (p->n_nodes == JSON_MAX_VALUES) return fail(p, "at most 4194304 values in a document");
    if (p->n_nodes == p->cap_nodes) {
        size_t cap = p->cap_nodes ? p->cap_nodes * 2 : 256;
        json_value *nodes = realloc(p->nodes, cap * sizeof *nodes);
        size_t *ci = realloc(p->child_idx, cap * sizeof *ci);
        if (ci) p->child_idx = ci;
        size_t *ni = realloc(p->next_idx, cap * sizeof *ni);
        if (ni) p->next_idx = ni;
        size_t *ko = realloc(p->key_off, cap * sizeof *ko);
        if (ko) p->key_off = ko;
        size_t *so = realloc(p->str_off, cap * sizeof *so);
        if (so) p->str_off = so;
        size_t *kp = realloc(p->key_pos, cap * sizeof *kp);
        if (kp) p->key_pos = kp;
        if (nodes) p->nodes = nodes;
        if (!nodes || !ci || !ni || !ko || !so || !kp) return err_set(ERR_NOMEM, "JSON: %zu values", cap);
        p->cap_nodes = cap;
    }
    size_t i = p->n_nodes++;
    memset(&p->nodes[i], 0, sizeof p->nodes[i]);
    p->nodes[i].type = type;
    p->child_idx[i] = p->next_idx[i] = 0;
    p->key_off[i] = p->str_off[i] = SIZE_MAX;
    p->key_pos[i] = 0;
    *out = i;
    return ERR_OK;
}

static int hex4(const char *s, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return 0;
    }
    *out = v;
    return 1;
}

static size_t put_utf8(char *d, unsigned cp) {
    if (cp < 0x80) { d[0] = (char)cp; return 1; }
    if (cp < 0x800) { d[0] = (char)(0xC0 | (cp >> 6)); d[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        d[0] = (char)(0xE0 | (cp >> 12)); d[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        d[2] = (char)(0x80 | (cp & 0x3F)); return 3;
    }
    d[0] = (char)(0xF0 | (cp >> 18)); d[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    d[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); d[3] = (char)(0x80 | (cp & 0x3F)); return 4;
}

/* Decodes the string starting at the opening quote into p->strings; returns offset and length. */
static err_code parse_string(parser *p, size_t *off, int *n) {
    p->pos++; /* opening quote */
    size_t start = p->n_strings;
    char *d = p->strings + start;
    size_t k = 0;
    for (;;) {
        if (p->pos >= p->len) return fail(p, "closing '\"'");
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c == '"') { p->pos++; break; }
        if (c < 0x20) return fail(p, "no control character inside a string");
        if (c >= 0x80) {
            int n = utf8_valid_len(p->s + p->pos, p->len - p->pos);
            if (!n) return fail(p, "valid UTF-8");
            memcpy(d + k, p->s + p->pos, (size_t)n);
            k += (size_t)n;
            p->pos += (size_t)n;
            continue;
        }
        if (c != '\\') { d[k++] = (char)c; p->pos++; continue; }
        if (p->pos + 1 >= p->len) return fail(p, "escape character");
        char e = p->s[p->pos + 1];
        p->pos += 2;
        switch (e) {
        case '"': d[k++] = '"'; break;
        case '\\': d[k++] = '\\'; break;
        case '/': d[k++] = '/'; break;
        case 'b': d[k++] = '\b'; break;
        case 'f': d[k++] = '\f'; break;
        case 'n': d[k++] = '\n'; break;
        case 'r': d[k++] = '\r'; break;
        case 't': d[k++] = '\t'; break;
        case 'u': {
            unsigned cp;
            if (p->pos + 4 > p->len || !hex4(p->s + p->pos, &cp)) return fail(p, "4 hex digits after \\u");
            p->pos += 4;
            if (cp >= 0xD800 && cp < 0xDC00) {
                unsigned lo;
                if (p->pos + 6 <= p->len && p->s[p->pos] == '\\' && p->s[p->pos + 1] == 'u' &&
                    hex4(p->s + p->pos + 2, &lo) && lo >= 0xDC00 && lo < 0xE000) {
                    p->pos += 6;
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                } else {
                    cp = 0xFFFD; /* lone high surrogate: what Python and serde_json produce too */
                }
            } else if (cp >= 0xDC00 && cp < 0xE000) {
                cp = 0xFFFD;
            }
            k += put_utf8(d + k, cp);
            break;
        }
        default: return fail(p, "a valid escape");
        }
    }
    d[k] = '\0';
    p->n_strings = start + k + 1;
    *off = start;
    *n = (int)k;
    return ERR_OK;
}

static err_code parse_value(parser *p, size_t *out, int depth);

static err_code parse_container(parser *p, size_t self, int depth, int is_object) {
    char close = is_object ? '}' : ']';
    p->pos++;
    skip_ws(p);
    size_t prev = 0; /* index + 1 of the previous child */
    int count = 0;
    if (p->pos < p->len && p->s[p->pos] == close) { p->pos++; p->nodes[self].n = 0; return ERR_OK; }
    for (;;) {
        size_t key_off = SIZE_MAX, key_pos = 0;
        int key_len = 0;
        err_code rc;
        if (is_object) {
            skip_ws(p);
            if (p->pos >= p->len || p->s[p->pos] != '"') return fail(p, "a string key");
            key_pos = p->pos;
            if ((rc = parse_string(p, &key_off, &key_len))) return rc;
            skip_ws(p);
            if (p->pos >= p->len || p->s[p->pos] != ':') return fail(p, "':'");
            p->pos++;
        }
        size_t child;
        if ((rc = parse_value(p, &child, depth + 1))) return rc;
        p->key_off[child] = key_off;
        p->key_pos[child] = key_pos;
        p->nodes[child].key_len = key_len;
        if (prev) p->next_idx[prev - 1] = child + 1;
        else p->child_idx[self] = child + 1;
        prev = child + 1;
        count++;
        skip_ws(p);
        if (p->pos < p->len && p->s[p->pos] == ',') { p->pos++; continue; }
        if (p->pos < p->len && p->s[p->pos] == close) { p->pos++; break; }
        return fail(p, is_object ? "',' or '}'" : "',' or ']'");
    }
    p->nodes[self].n = count;
    return ERR_OK;
}

static err_code parse_number(parser *p, size_t self) {
    size_t i = p->pos;
    if (i < p->len && p->s[i] == '-') i++;
    if (i >= p->len || p->s[i] < '0' || p->s[i] > '9') return fail(p, "a digit");
    if (p->s[i] == '0') i++;
    else while (i < p->len && p->s[i] >= '0' && p->s[i] <= '9') i++;
    if (i < p->len && p->s[i] == '.') {
        i++;
        if (i >= p->len || p->s[i] < '0' || p->s[i] > '9') return fail(p, "a digit after '.'");
        while (i < p->len && p->s[i] >= '0' && p->s[i] <= '9') i++;
    }
    if (i < p->len && (p->s[i] == 'e' || p->s[i] == 'E')) {
        i++;
        if (i < p->len && (p->s[i] == '+' || p->s[i] == '-')) i++;
        if (i >= p->len || p->s[i] < '0' || p->s[i] > '9') return fail(p, "a digit in the exponent");
        while (i < p->len && p->s[i] >= '0' && p->s[i] <= '9') i++;
    }
    /* strtod wants a terminated copy: on the stack, or for a long literal (Python reads integers
     * of up to 4300 digits) on the heap */
    char small[64], *buf = small;
    size_t n = i - p->pos;
    if (n > 4096) return fail(p, "a number of at most 4096 characters");
    if (n >= sizeof small && !(buf = malloc(n + 1))) return err_set(ERR_NOMEM, "JSON: a number of %zu characters", n);
    memcpy(buf, p->s + p->pos, n);
    buf[n] = '\0';
    p->nodes[self].num = strtod(buf, NULL);
    p->nodes[self].n = memchr(buf, '.', n) == NULL && memchr(buf, 'e', n) == NULL && memchr(buf, 'E', n) == NULL;
    if (buf != small) free(buf);
    p->pos = i;
    return ERR_OK;
}

static int match_word(parser *p, const char *w) {
    size_t n = strlen(w);
    if (p->pos + n > p->len || memcmp(p->s + p->pos, w, n) != 0) return 0;
    p->pos += n;
    return 1;
}

static err_code parse_value(parser *p, size_t *out, int depth) {
    if (depth > JSON_MAX_DEPTH) return fail(p, "nesting depth at most 128");
    skip_ws(p);
    if (p->pos >= p->len) return fail(p, "a value");
    char c = p->s[p->pos];
    err_code rc;
    size_t self;
    switch (c) {
    case '{':
    case '[':
        if ((rc = new_node(p, c == '{' ? JSON_OBJECT : JSON_ARRAY, &self))) return rc;
        if ((rc = parse_container(p, self, depth, c == '{'))) return rc;
        break;
    case '"': {
        if ((rc = new_node(p, JSON_STRING, &self))) return rc;
        size_t off;
        int n;
        if ((rc = parse_string(p, &off, &n))) return rc;
        p->str_off[self] = off;
        p->nodes[self].n = n;
        break;
    }
    case 't':
    case 'f':
    case 'n': {
        json_type t = c == 't' ? JSON_TRUE : c == 'f' ? JSON_FALSE : JSON_NULL;
        if (!match_word(p, c == 't' ? "true" : c == 'f' ? "false" : "null")) return fail(p, "a value");
        if ((rc = new_node(p, t, &self))) return rc;
        break;
    }
    default:
        if ((rc = new_node(p, JSON_NUMBER, &self))) return rc;
        if ((rc = parse_number(p, self))) return rc;
    }
    *out = self;
    return ERR_OK;
}

static void parser_release(parser *p) {
    free(p->child_idx);
    free(p->next_idx);
    free(p->key_off);
    free(p->str_off);
    free(p->key_pos);
}

static int member_cmp(const void *a, const void *b) {
    const json_value *x = *(const json_value *const *)a, *y = *(const json_value *const *)b;
    if (x->key_len != y->key_len) return x->key_len < y->key_len ? -1 : 1;
    int c = memcmp(x->key, y->key, (size_t)x->key_len);
    if (c) return c;
    return x < y ? -1 : x > y; /* document order: the error names the second */
}

/* Refuses an object that names a key twice, naming the second occurrence: O(n log n) a object. */
static err_code check_duplicate_keys(const parser *p) {
    const json_value **members = NULL;
    size_t cap = 0;
    err_code rc = ERR_OK;
    for (size_t i = 0; i < p->n_nodes && !rc; i++) {
        const json_value *obj = &p->nodes[i];
        if (obj->type != JSON_OBJECT || obj->n < 2) continue;
        if ((size_t)obj->n > cap) {
            const json_value **m = realloc(members, (size_t)obj->n * sizeof *m);
            if (!m) { rc = err_set(ERR_NOMEM, "JSON: an object of %d members", obj->n); break; }
            members = m;
            cap = (size_t)obj->n;
        }
        size_t n = 0;
        json_for_each(c, obj) members[n++] = c;
        qsort(members, n, sizeof *members, member_cmp);
        for (size_t k = 1; k < n && !rc; k++) {
            const json_value *a = members[k - 1], *b = members[k];
            if (a->key_len == b->key_len && memcmp(a->key, b->key, (size_t)a->key_len) == 0)
                rc = err_set(ERR_JSON, "at byte %zu: duplicate key \"%.64s\" in an object", p->key_pos[b - p->nodes],
                             b->key);
        }
    }
    free(members);
    return rc;
}

err_code json_parse(const char *text, size_t len, json_doc *doc) {
    memset(doc, 0, sizeof *doc);
    parser p = {.s = text, .len = len};
    /* Decoded strings never outgrow their source text, so one buffer of len + 1 bytes suffices. */
    p.strings = malloc(len + 1);
    if (!p.strings) return err_set(ERR_NOMEM, "JSON: %zu bytes", len);
    size_t root;
    err_code rc = parse_value(&p, &root, 0);
    if (!rc) {
        skip_ws(&p);
        if (p.pos != p.len) rc = fail(&p, "end of input");
    }
    if (rc) {
        parser_release(&p);
        free(p.nodes);
        free(p.strings);
        return rc;
    }
    for (size_t i = 0; i < p.n_nodes; i++) {
        json_value *v = &p.nodes[i];
        v->child = p.child_idx[i] ? &p.nodes[p.child_idx[i] - 1] : NULL;
        v->next = p.next_idx[i] ? &p.nodes[p.next_idx[i] - 1] : NULL;
        v->key = p.key_off[i] != SIZE_MAX ? p.strings + p.key_off[i] : NULL;
        v->str = p.str_off[i] != SIZE_MAX ? p.strings + p.str_off[i] : NULL;
    }
    if ((rc = check_duplicate_keys(&p))) {
        parser_release(&p);
        free(p.nodes);
        free(p.strings);
        return rc;
    }
    parser_release(&p);
    doc->nodes = p.nodes;
    doc->n_nodes = p.n_nodes;
    doc->strings = p.strings;
    doc->root = &p.nodes[root];
    return ERR_OK;
}

err_code json_parse_file(const char *path, json_doc *doc) {
    memset(doc, 0, sizeof *doc);
    const void *bundled;
    size_t bundled_size;
    int in_bundle = bundle_find(path, &bundled, &bundled_size); /* an appliance's own file */
    if (in_bundle < 0) return err_set(ERR_IO, "%s: %s", path, strerror(ENOENT));
    if (in_bundle) {
        err_code rc = json_parse(bundled, bundled_size, doc);
        if (rc == ERR_JSON) {
            char why[256];
            snprintf(why, sizeof why, "%s", err_detail());
            return err_set(rc, "%s: %s", path, why);
        }
        return rc;
    }
    char *buf;
    size_t len;
    err_code rc = file_read_regular(path, FILE_JSON_MAX, &buf, &len);
    if (rc) return rc;
    rc = json_parse(buf, len, doc);
    free(buf);
    if (rc == ERR_JSON) {
        char why[256]; /* err_set writes the buffer err_detail() reads: copy it first */
        snprintf(why, sizeof why, "%s", err_detail());
        return err_set(rc, "%s: %s", path, why);
    }
    return rc;
}

void json_free(json_doc *doc) {
    free(doc->nodes);
    free(doc->strings);
    memset(doc, 0, sizeof *doc);
}

const json_value *json_get(const json_value *obj, const char *key) {
    if (!obj || obj->type != JSON_OBJECT) return NULL;
    size_t n = strlen(key);
    json_for_each(c, obj) {
        if ((size_t)c->key_len == n && memcmp(c->key, key, n) == 0) return c;
    }
    return NULL;
}

int json_is_int(const json_value *v) {
    return v && v->type == JSON_NUMBER && v->num == floor(v->num) && fabs(v->num) < 9007199254740992.0;
}
