/* tokenizer.c - Hugging Face `tokenizers` BPE encoding and decoding from tokenizer.json, in plain
 * C11 (tokenizer.h says what is supported).
 *
 * The ids must be identical to the library's, so the text goes through the library's pipeline in
 * the library's order and every step copies the library's rules, quirks included:
 *   1. added tokens that are not `normalized` are split out of the raw text (leftmost-longest,
 *      as its Aho-Corasick automaton does), honouring lstrip / rstrip;
 *   2. every other piece is normalized (Prepend, Replace, NFC) and the `normalized` added tokens
 *      are split out of the result;
 *   3. the pre-tokenizer steps split the pieces further: hand-written matchers for the regexes
 *      real models use (GPT-2, Llama-3, Qwen2; no regex engine), Digits, Metaspace, and ByteLevel,
 *      which also maps every byte to a printable character;
 *   4. BPE on each piece: characters (or byte-fallback tokens, or unk) merged lowest rank first,
 *      leftmost on ties, with the library's priority queue and its stale-entry rule;
 *   5. the post-processor's template adds its special tokens around the sequence.
 * Decoding runs the decoder chain on each token once at load; tok_decode_piece copies the result.
 *
 * Everything the library would refuse or that is not implemented here is refused at load with
 * ERR_TOKENIZER naming the JSON key and value, so encoding has no error path but bad UTF-8. */
#include "tokenizer.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "unicode_data.h"

// ----------------------------------------------------------------------------
// Unicode: character classes, UTF-8, NFC

static unsigned range_lookup(const unicode_range *r, int n, uint32_t cp) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < r[mid].first) hi = mid - 1;
        else if (cp > r[mid].last) lo = mid + 1;
        else return r[mid].value;
    }
    return 0;
}

/* enum unicode_class of cp: what \p{L}, \p{N} and \s say about it. */
static int char_class(uint32_t cp) {
    if (cp < 0x80) {
        if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return UNICODE_LETTER;
        if (cp >= '0' && cp <= '9') return UNICODE_NUMBER;
        if (cp == ' ' || (cp >= '\t' && cp <= '\r')) return UNICODE_SPACE;
        return UNICODE_OTHER;
    }
    return (int)range_lookup(unicode_class_ranges, unicode_n_class_ranges, cp);
}

/* Offset of the first byte of s[0..n) that does not start a valid UTF-8 character (overlong
 * forms, surrogates and code points above U+10FFFF are invalid, as in Rust), or n. */
static size_t utf8_invalid_at(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) { i++; continue; }
        int len;
        unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
        if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else return i;
        if (i + (size_t)len > n || s[i + 1] < lo || s[i + 1] > hi) return i;
        for (int k = 2; k < len; k++)
            if ((s[i + k] & 0xC0) != 0x80) return i;
        i += (size_t)len;
    }
    return n;
}

/* Decodes the character at s (valid UTF-8); returns its length in bytes. */
static int utf8_decode(const unsigned char *s, uint32_t *cp) {
    if (s[0] < 0x80) { *cp = s[0]; return 1; }
    if (s[0] < 0xE0) { *cp = (uint32_t)(s[0] & 0x1F) << 6 | (s[1] & 0x3F); return 2; }
    if (s[0] < 0xF0) { *cp = (uint32_t)(s[0] & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F); return 3; }
    *cp = (uint32_t)(s[0] & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 | (uint32_t)(s[2] & 0x3F) << 6 | (s[3] & 0x3F);
    return 4;
}

/* utf8_decode for bytes that may not be valid UTF-8 (a decoder step's output: ByteLevel and
 * ByteFallback give raw bytes): never reads past s[n - 1]; a byte that does not start a valid
 * character is one character U+FFFD. */
static int utf8_decode_n(const unsigned char *s, size_t n, uint32_t *cp) {
    size_t valid = utf8_invalid_at(s, n < 4 ? n : 4);
    if (s[0] >= 0x80 && valid == 0) {
        *cp = 0xFFFD;
        return 1;
    }
    return utf8_decode(s, cp);
}

static int utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12);
        out[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18);
    out[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Hangul syllables are composed and decomposed by arithmetic (Unicode ch. 3.12). */
enum {
    HANGUL_S = 0xAC00, HANGUL_L = 0x1100, HANGUL_V = 0x1161, HANGUL_T = 0x11A7,
    HANGUL_L_N = 19, HANGUL_V_N = 21, HANGUL_T_N = 28, HANGUL_N = 11172
};

static unsigned combining_class(uint32_t cp) {
    return cp < 0x300 ? 0 : range_lookup(unicode_ccc_ranges, unicode_n_ccc_ranges, cp);
}

/* Writes the full canonical decomposition of cp to out (UNICODE_DECOMP_MAX code points at most);
 * returns how many. */
static int decompose(uint32_t cp, uint32_t *out) {
    if (cp >= HANGUL_S && cp < HANGUL_S + HANGUL_N) {
        uint32_t s = cp - HANGUL_S;
        out[0] = HANGUL_L + s / (HANGUL_V_N * HANGUL_T_N);
        out[1] = HANGUL_V + s % (HANGUL_V_N * HANGUL_T_N) / HANGUL_T_N;
        if (s % HANGUL_T_N == 0) return 2;
        out[2] = HANGUL_T + s % HANGUL_T_N;
        return 3;
    }
    int lo = 0, hi = unicode_n_decomps - 1;
    while (cp >= 0xC0 && lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < unicode_decomps[mid].cp) hi = mid - 1;
        else if (cp > unicode_decomps[mid].cp) lo = mid + 1;
        else {
            const unicode_decomp *d = &unicode_decomps[mid];
            for (unsigned k = 0; k < d->len; k++) out[k] = unicode_decomp_cps[d->start + k];
            return (int)d->len;
        }
    }
    out[0] = cp;
    return 1;
}

/* The primary composite of a + b, or 0. */
static uint32_t compose(uint32_t a, uint32_t b) {
    if (a >= HANGUL_L && a < HANGUL_L + HANGUL_L_N && b >= HANGUL_V && b < HANGUL_V + HANGUL_V_N)
        return HANGUL_S + ((a - HANGUL_L) * HANGUL_V_N + (b - HANGUL_V)) * HANGUL_T_N;
    if (a >= HANGUL_S && a < HANGUL_S + HANGUL_N && (a - HANGUL_S) % HANGUL_T_N == 0 && b > HANGUL_T &&
        b < HANGUL_T + HANGUL_T_N)
        return a + (b - HANGUL_T);
    int lo = 0, hi = unicode_n_compositions - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const unicode_pair *p = &unicode_compositions[mid];
        if (a < p->first || (a == p->first && b < p->second)) hi = mid - 1;
        else if (a > p->first || b > p->second) lo = mid + 1;
        else return p->composite;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// Growable buffers with a sticky out-of-memory flag, so that the encoder checks once per stage

typedef struct {
    char *b;
    size_t len, cap;
    int oom;
} buf;

static int buf_reserve(buf *b, size_t extra) {
    if (b->oom) return 0;
    if (b->len + extra <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra) cap *= 2;
    char *p = realloc(b->b, cap);
    if (!p) return b->oom = 1, 0;
    b->b = p;
    b->cap = cap;
    return 1;
}

static void buf_put(buf *b, const void *s, size_t n) {
    if (n && buf_reserve(b, n)) {
        memcpy(b->b + b->len, s, n);
        b->len += n;
    }
}

static void buf_put_char(buf *b, uint32_t cp) {
    char tmp[4];
    buf_put(b, tmp, (size_t)utf8_encode(cp, tmp));
}

static void buf_replace_all(buf *out, const char *s, size_t n, const char *pat, size_t pat_len, const char *with,
                            size_t with_len) {
    size_t i = 0, from = 0;
    while (pat_len && i + pat_len <= n) {
        if (memcmp(s + i, pat, pat_len) == 0) {
            buf_put(out, s + from, i - from);
            buf_put(out, with, with_len);
            i += pat_len;
            from = i;
        } else {
            i++;
        }
    }
    buf_put(out, s + from, n - from);
}

/* Strings that live as long as the tokenizer, allocated from a list of chunks. */
typedef struct pool_chunk {
    struct pool_chunk *next;
    size_t used, cap;
    char data[];
} pool_chunk;

static char *pool_dup(pool_chunk **pool, const char *s, size_t n) {
    pool_chunk *c = *pool;
    if (!c || c->cap - c->used < n + 1) {
        size_t cap = n + 1 > 65536 ? n + 1 : 65536;
        c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->next = *pool;
        c->used = 0;
        c->cap = cap;
        *pool = c;
    }
    char *p = c->data + c->used;
    memcpy(p, s, n);
    p[n] = 0;
    c->used += n + 1;
    return p;
}

// ----------------------------------------------------------------------------
// The tokenizer

typedef struct {
    const char *s; /* NUL-terminated; NULL for an id no token has */
    int len;       /* bytes */
} tok_str;

typedef struct {
    tok_str content; /* as written in tokenizer.json */
    tok_str match;   /* what is searched for in the text: content, normalized if `normalized` */
    int id;
    int lstrip, rstrip, normalized, special;
} added_token;

/* The added tokens of one split pass, bucketed by first byte of what they match. */
typedef struct {
    int *idx;       /* indices into tokenizer.added, grouped by first byte */
    int start[257]; /* idx[start[c] .. start[c + 1]) match texts starting with byte c */
} token_index;

enum norm_kind { NORM_PREPEND, NORM_REPLACE, NORM_NFC };
typedef struct {
    enum norm_kind kind;
    tok_str a, b; /* Prepend: a = the prefix; Replace: a -> b */
} norm_step;

enum pre_kind { PRE_BYTELEVEL, PRE_SPLIT, PRE_DIGITS, PRE_METASPACE };
enum split_pattern { PATTERN_GPT2, PATTERN_LLAMA3, PATTERN_QWEN2 };
enum prepend_scheme { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER };
typedef struct {
    enum pre_kind kind;
    int add_prefix_space, use_regex; /* ByteLevel */
    enum split_pattern pattern;      /* Split; ByteLevel's regex is PATTERN_GPT2 */
    int individual_digits;           /* Digits */
    uint32_t replacement;            /* Metaspace */
    enum prepend_scheme prepend;     /* Metaspace */
    int split;                       /* Metaspace */
} pre_step;

enum dec_kind { DEC_BYTELEVEL, DEC_REPLACE, DEC_BYTE_FALLBACK, DEC_FUSE, DEC_STRIP, DEC_METASPACE };
typedef struct {
    enum dec_kind kind;
    tok_str pattern, content;    /* Replace */
    uint32_t ch;                 /* Strip: the character stripped; Metaspace: the replacement */
    int start, stop;             /* Strip: how many characters at most, at each end */
    enum prepend_scheme prepend; /* Metaspace */
} dec_step;

#define MAX_STEPS 16
#define BYTE_CHAR_END 0x144 /* every ByteLevel character is below this code point */

typedef struct {
    uint64_t key; /* (left id << 32 | right id) */
    int rank;     /* -1: empty slot */
    int new_id;
} merge_slot;

struct tokenizer {
    pool_chunk *pool; /* every string below */

    /* the BPE model */
    tok_str *vocab; /* (n_vocab) model token of each id */
    int n_vocab;
    int *vocab_slots; /* (vocab_mask + 1) open addressing over vocab, -1 empty */
    uint32_t vocab_mask;
    merge_slot *merges; /* (merge_mask + 1) open addressing */
    uint32_t merge_mask;
    int unk_id;      /* -1: none */
    int fuse_unk, byte_fallback, ignore_merges;
    int byte_ids[256]; /* byte fallback: id of <0xXX>, -1 if absent */
    char byte_utf8[256][2];         /* ByteLevel: the UTF-8 of each byte's character */
    unsigned char byte_utf8_len[256];
    short char_byte[BYTE_CHAR_END]; /* ByteLevel decoder: the byte of each character, -1 if none */

    /* added tokens */
    added_token *added;
    int n_added;
    token_index raw_index, norm_index; /* not normalized / normalized */

    norm_step norm[MAX_STEPS];
    int n_norm;
    pre_step pre[MAX_STEPS];
    int n_pre;
    int *prefix, n_prefix; /* post-processor: ids before and after the sequence */
    int *suffix, n_suffix;
    dec_step dec[MAX_STEPS];
    int n_dec;
    int dec_join_space; /* no decoder: the library joins the tokens with spaces */

    /* decoding, precomputed for every id */
    int n_ids;         /* largest id + 1 */
    tok_str *piece;    /* (n_ids) decoded bytes of each id after another token */
    tok_str *first;    /* (n_ids) decoded bytes of each id at the start of the text */
    int max_piece;     /* bytes */
};

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static uint64_t hash_pair(uint64_t x) {
    x ^= x >> 33; /* the murmur3 finalizer */
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* Id of the model token s[0..n), or -1. */
static int vocab_find(const tokenizer *t, const char *s, size_t n) {
    if (!t->vocab_slots) return -1;
    for (uint32_t h = (uint32_t)hash_bytes(s, n) & t->vocab_mask;; h = (h + 1) & t->vocab_mask) {
        int id = t->vocab_slots[h];
        if (id < 0) return -1;
        if ((size_t)t->vocab[id].len == n && memcmp(t->vocab[id].s, s, n) == 0) return id;
    }
}

static const merge_slot *merge_find(const tokenizer *t, int a, int b) {
    if (!t->merges) return NULL;
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (uint32_t h = (uint32_t)hash_pair(key) & t->merge_mask;; h = (h + 1) & t->merge_mask) {
        const merge_slot *m = &t->merges[h];
        if (m->rank < 0) return NULL;
        if (m->key == key) return m;
    }
}

/* The printable character ByteLevel puts in place of each byte (GPT-2's bytes_to_unicode):
 * printable Latin-1 stands for itself, the others are numbered from U+0100 in byte order. */
static uint32_t byte_char(int b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) return (uint32_t)b;
    int n = 0;
    for (int c = 0; c < b; c++)
        if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF))) n++;
    return 0x100 + (uint32_t)n;
}


// ----------------------------------------------------------------------------
// Normalizers

/* Appends the NFC form of s[0..n) (valid UTF-8) to out: canonical decomposition, canonical
 * ordering of combining marks, canonical composition (UAX #15). */
static void nfc(const char *s, size_t n, buf *out) {
    size_t i = 0;
    while (i < n && (unsigned char)s[i] < 0xCC) i++; /* text below U+0300 is already NFC */
    if (i == n) {
        buf_put(out, s, n);
        return;
    }
    uint32_t *cps = malloc((n * UNICODE_DECOMP_MAX + 1) * sizeof *cps); /* (chars decomposed) */
    if (!cps) {
        out->oom = 1;
        return;
    }
    int m = 0;
    for (i = 0; i < n;) {
        uint32_t cp;
        i += (size_t)utf8_decode((const unsigned char *)s + i, &cp);
        m += decompose(cp, cps + m);
    }
    for (int j = 1; j < m; j++) { /* a stable insertion sort of each run of non-starters */
        unsigned c = combining_class(cps[j]);
        for (int q = j; c && q > 0 && combining_class(cps[q - 1]) > c; q--) {
            uint32_t x = cps[q];
            cps[q] = cps[q - 1];
            cps[q - 1] = x;
        }
    }
    /* last: class of the last character kept, 0 when that is the starter itself, 256 before any
     * starter; a character composes with the starter unless a character between them blocks it */
    int w = 1, starter = 0;
    unsigned last = combining_class(cps[0]) ? 256 : 0;
    for (int j = 1; j < m; j++) {
        unsigned c = combining_class(cps[j]);
        uint32_t comp = (last < c || last == 0) ? compose(cps[starter], cps[j]) : 0;
        if (comp) {
            cps[starter] = comp;
            continue;
        }
        if (c == 0) starter = w;
        last = c;
        cps[w++] = cps[j];
    }
    for (int j = 0; j < w; j++) buf_put_char(out, cps[j]);
    free(cps);
}

/* Appends the normalized s[0..n) to out; a and b are scratch for the steps in between. */
static void normalize(const tokenizer *t, const char *s, size_t n, buf *out, buf *a, buf *b) {
    const char *cs = s;
    size_t cn = n;
    for (int k = 0; k < t->n_norm; k++) {
        const norm_step *st = &t->norm[k];
        buf *dst = k == t->n_norm - 1 ? out : (k % 2 ? b : a);
        size_t mark = dst == out ? out->len : (dst->len = 0);
        if (st->kind == NORM_PREPEND) {
            if (cn) buf_put(dst, st->a.s, (size_t)st->a.len);
            buf_put(dst, cs, cn);
        } else if (st->kind == NORM_REPLACE) {
            buf_replace_all(dst, cs, cn, st->a.s, (size_t)st->a.len, st->b.s, (size_t)st->b.len);
        } else {
            nfc(cs, cn, dst);
        }
        cs = dst->b ? dst->b + mark : "";
        cn = dst->len - mark;
    }
    if (t->n_norm == 0) buf_put(out, s, n);
    if (a->oom || b->oom) out->oom = 1;
}

// ----------------------------------------------------------------------------
// Pieces: the text as it goes through the pipeline

typedef struct {
    size_t off;   /* into encoder.text */
    int len;      /* bytes */
    int id;       /* >= 0: an added token, final */
    int at_start; /* starts at offset 0 of the original text (Metaspace prepend_scheme "first") */
} piece;

typedef struct {
    piece *v;
    int n, cap;
} piece_list;

typedef struct {
    int rank, pos, new_id;
} merge_entry;

typedef struct {
    int id, prev, next, len; /* len: bytes; 0 once merged into the symbol on its left */
} symbol;

typedef struct {
    buf text; /* every string a piece points into */
    buf norm, tmp, tmp2; /* normalization */
    piece_list cur, next;
    uint32_t *cps; /* (cap_chars) the piece being split, one code point each */
    unsigned char *cls;
    int *offs;     /* (cap_chars + 1) byte offset of each character in its piece */
    int cap_chars;
    symbol *sym;   /* (cap_sym) BPE */
    merge_entry *heap;
    int cap_sym, cap_heap;
    int *ids;
    int n_ids, cap_ids;
    int oom;
} encoder;

static int grow(encoder *e, void **p, int *cap, int need, size_t elem) {
    if (need <= *cap) return 1;
    int c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q) return e->oom = 1, 0;
    *p = q;
    *cap = c;
    return 1;
}

/* Appends a piece; empty text pieces are dropped, as the library drops empty splits. */
static void push_piece(encoder *e, piece_list *l, size_t off, int len, int id, int at_start) {
    if (id < 0 && len == 0) return;
    if (!grow(e, (void **)&l->v, &l->cap, l->n + 1, sizeof *l->v)) return;
    l->v[l->n++] = (piece){off, len, id, at_start};
}

/* Makes next the current list. */
static void swap_lists(encoder *e) {
    piece_list x = e->cur;
    e->cur = e->next;
    e->next = x;
    e->next.n = 0;
}

static void push_id(encoder *e, int id) {
    if (grow(e, (void **)&e->ids, &e->cap_ids, e->n_ids + 1, sizeof *e->ids)) e->ids[e->n_ids++] = id;
}

// ----------------------------------------------------------------------------
// Added tokens

static int all_set(const unsigned char *control, int n) {
    for (int i = 0; i < n; i++)
        if (!control[i]) return 0;
    return 1;
}

/* Splits the text piece p at the added tokens of ix, pushing to e->next. Follows the library's
 * AddedVocabulary::find_matches: leftmost-longest matches, scanned from where the previous match
 * ended (before rstrip); lstrip / rstrip widen the token over white space around it. Special
 * tokens are tokens only where specials is set and, when control is not NULL, where every byte of
 * the match is marked in control (one flag a byte of p's text): elsewhere their text is plain
 * text. */
static void split_added(const tokenizer *t, encoder *e, const token_index *ix, const piece *p,
                        const unsigned char *control, int specials) {
    const char *s = e->text.b + p->off;
    int n = p->len, from = 0, pos = 0;
    while (pos < n) {
        int c = (unsigned char)s[pos], best = -1, best_len = 0;
        for (int k = ix->start[c]; k < ix->start[c + 1]; k++) {
            const added_token *a = &t->added[ix->idx[k]];
            if (a->match.len > best_len && a->match.len <= n - pos &&
                memcmp(s + pos, a->match.s, (size_t)a->match.len) == 0) {
                best = ix->idx[k];
                best_len = a->match.len;
            }
        }
        if (best < 0) {
            pos++;
            continue;
        }
        const added_token *a = &t->added[best];
        if (a->special && (!specials || (control && !all_set(control + pos, best_len)))) {
            /* a special token where it may not be one stays in the text around it, and no added
             * token matches inside it: the library's find_matches with encode_special_tokens */
            pos += best_len;
            continue;
        }
        int start = pos, stop = pos + best_len;
        if (a->lstrip) {
            int q = start;
            while (q > 0) {
                int b = q - 1;
                while (b > 0 && ((unsigned char)s[b] & 0xC0) == 0x80) b--;
                uint32_t cp;
                utf8_decode((const unsigned char *)s + b, &cp);
                if (char_class(cp) != UNICODE_SPACE) break;
                q = b;
            }
            start = q > from ? q : from;
        }
        if (a->rstrip) {
            while (stop < n) {
                uint32_t cp;
                int l = utf8_decode((const unsigned char *)s + stop, &cp);
                if (char_class(cp) != UNICODE_SPACE) break;
                stop += l;
            }
        }
        if (from < start) push_piece(e, &e->next, p->off + (size_t)from, start - from, -1, p->at_start && from == 0);
        push_piece(e, &e->next, p->off + (size_t)start, stop - start, a->id, 0);
        from = stop;
        pos += best_len;
    }
    if (from < n) push_piece(e, &e->next, p->off + (size_t)from, n - from, -1, p->at_start && from == 0);
}

// ----------------------------------------------------------------------------
// Pre-tokenizers
//
// The Split regexes, as tokenizer.json spells them. Each alternative is matched by hand below,
// with the regex's leftmost-first, greedy-with-backtracking semantics; every character matches
// some alternative, so the matches tile the piece.

static const char PATTERN_GPT2_RE[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char PATTERN_LLAMA3_RE[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char PATTERN_QWEN2_RE[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* Decodes piece p into e->cps / cls / offs; returns its length in characters, -1 on OOM. */
static int load_chars(encoder *e, const piece *p) {
    if (p->len + 1 > e->cap_chars) {
        int cap = e->cap_chars ? e->cap_chars : 64;
        while (cap < p->len + 1) cap *= 2;
        uint32_t *cps = realloc(e->cps, (size_t)cap * sizeof *cps);
        if (cps) e->cps = cps;
        unsigned char *cls = realloc(e->cls, (size_t)cap);
        if (cls) e->cls = cls;
        int *offs = realloc(e->offs, ((size_t)cap + 1) * sizeof *offs);
        if (offs) e->offs = offs;
        if (!cps || !cls || !offs) return e->oom = 1, -1;
        e->cap_chars = cap;
    }
    const unsigned char *s = (const unsigned char *)e->text.b + p->off;
    int n = 0;
    for (int i = 0; i < p->len; n++) {
        e->offs[n] = i;
        i += utf8_decode(s + i, &e->cps[n]);
        e->cls[n] = (unsigned char)char_class(e->cps[n]);
    }
    e->offs[n] = p->len;
    return n;
}

static int run_of(const unsigned char *cls, int i, int n, int c) {
    while (i < n && cls[i] == c) i++;
    return i;
}

/* 's 't 're 've 'm 'll 'd at i (case-insensitive: ASCII, and U+017F which folds to s); returns
 * the end of the match or -1. */
static int match_contraction(const uint32_t *cp, int i, int n, int fold) {
    if (cp[i] != '\'' || i + 1 >= n) return -1;
    uint32_t a = cp[i + 1], b = i + 2 < n ? cp[i + 2] : 0;
    if (fold) {
        if (a == 0x17F) a = 's';
        if (a < 0x80) a |= 0x20;
        if (b < 0x80 && b >= 'A') b |= 0x20;
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    return -1;
}

/* `\s+(?!\S)|\s+` at a white-space character i: the run, less its last character when a
 * non-space follows and the run is longer than one. */
static int match_spaces(const unsigned char *cls, int i, int n) {
    int e = run_of(cls, i, n, UNICODE_SPACE);
    return (e < n && e - i >= 2) ? e - 1 : e;
}

/* End of the match at i for GPT-2's regex. */
static int match_gpt2(const uint32_t *cp, const unsigned char *cls, int i, int n) {
    int e = match_contraction(cp, i, n, 0);
    if (e >= 0) return e;
    /* ` ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+` */
    int j = (cp[i] == ' ' && i + 1 < n && cls[i + 1] != UNICODE_SPACE) ? i + 1 : i;
    if (cls[j] != UNICODE_SPACE) return run_of(cls, j, n, cls[j]);
    return match_spaces(cls, i, n);
}

/* End of the match at i for the Llama-3 regex (max_digits 3) or Qwen2's (max_digits 1). */
static int match_llama3(const uint32_t *cp, const unsigned char *cls, int i, int n, int max_digits) {
    int e = match_contraction(cp, i, n, 1);
    if (e >= 0) return e;
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (cls[i] == UNICODE_LETTER) return run_of(cls, i, n, UNICODE_LETTER);
    if (cp[i] != '\r' && cp[i] != '\n' && cls[i] != UNICODE_NUMBER && i + 1 < n && cls[i + 1] == UNICODE_LETTER)
        return run_of(cls, i + 1, n, UNICODE_LETTER);
    /* \p{N}{1,3} */
    if (cls[i] == UNICODE_NUMBER) {
        e = i + 1;
        while (e < n && e - i < max_digits && cls[e] == UNICODE_NUMBER) e++;
        return e;
    }
    /* ` ?[^\s\p{L}\p{N}]+[\r\n]*` */
    int j = (cp[i] == ' ' && i + 1 < n && cls[i + 1] == UNICODE_OTHER) ? i + 1 : i;
    if (cls[j] == UNICODE_OTHER) {
        e = run_of(cls, j, n, UNICODE_OTHER);
        while (e < n && (cp[e] == '\r' || cp[e] == '\n')) e++;
        return e;
    }
    /* \s*[\r\n]+ : the white space up to and including its last line break */
    e = run_of(cls, i, n, UNICODE_SPACE);
    for (int k = e - 1; k >= i; k--)
        if (cp[k] == '\r' || cp[k] == '\n') return k + 1;
    return match_spaces(cls, i, n);
}

/* Splits p by pattern into its matches (the library's Split with behavior Isolated). */
static void split_regex(encoder *e, enum split_pattern pattern, const piece *p) {
    int n = load_chars(e, p);
    for (int i = 0; i < n;) {
        int j = pattern == PATTERN_GPT2 ? match_gpt2(e->cps, e->cls, i, n)
                                        : match_llama3(e->cps, e->cls, i, n, pattern == PATTERN_LLAMA3 ? 3 : 1);
        push_piece(e, &e->next, p->off + (size_t)e->offs[i], e->offs[j] - e->offs[i], -1, p->at_start && i == 0);
        i = j;
    }
}

/* Digits: every digit alone (individual) or each run of digits together, the rest in between. */
static void split_digits(encoder *e, int individual, const piece *p) {
    int n = load_chars(e, p);
    for (int i = 0; i < n;) {
        int j = i + 1;
        if (e->cls[i] != UNICODE_NUMBER) {
            while (j < n && e->cls[j] != UNICODE_NUMBER) j++;
        } else if (!individual) {
            j = run_of(e->cls, i, n, UNICODE_NUMBER);
        }
        push_piece(e, &e->next, p->off + (size_t)e->offs[i], e->offs[j] - e->offs[i], -1, p->at_start && i == 0);
        i = j;
    }
}

/* Metaspace: spaces become the replacement, which is prepended per the scheme; with split, the
 * piece splits before each replacement character that a non-replacement follows (the library's
 * MergedWithNext: a replacement that another one follows stays alone). */
static void pre_metaspace(encoder *e, const pre_step *st, const piece *p) {
    char rep[4];
    int rep_len = utf8_encode(st->replacement, rep);
    size_t off = e->text.len;
    const char *s = e->text.b + p->off;
    int starts_with = p->len >= rep_len && memcmp(s, rep, (size_t)rep_len) == 0;
    int starts_with_space = s[0] == ' '; /* becomes the replacement below */
    if (!starts_with && !starts_with_space &&
        (st->prepend == PREPEND_ALWAYS || (st->prepend == PREPEND_FIRST && p->at_start)))
        buf_put(&e->text, rep, (size_t)rep_len);
    if (!buf_reserve(&e->text, (size_t)p->len * (size_t)rep_len)) return;
    s = e->text.b + p->off; /* the buffer may have moved */
    for (int i = 0; i < p->len; i++) {
        if (s[i] == ' ') buf_put(&e->text, rep, (size_t)rep_len);
        else buf_put(&e->text, s + i, 1);
    }
    piece q = {off, (int)(e->text.len - off), -1, p->at_start};
    if (!st->split) {
        push_piece(e, &e->next, q.off, q.len, -1, q.at_start);
        return;
    }
    const char *t = e->text.b + q.off;
    int i = 0;
    while (i < q.len) {
        int j;
        if (q.len - i >= rep_len && memcmp(t + i, rep, (size_t)rep_len) == 0) {
            j = i + rep_len;
            if (!(q.len - j >= rep_len && memcmp(t + j, rep, (size_t)rep_len) == 0)) {
                while (j < q.len && !(q.len - j >= rep_len && memcmp(t + j, rep, (size_t)rep_len) == 0)) j++;
            }
        } else {
            j = i;
            while (j < q.len && !(q.len - j >= rep_len && memcmp(t + j, rep, (size_t)rep_len) == 0)) j++;
        }
        push_piece(e, &e->next, q.off + (size_t)i, j - i, -1, q.at_start && i == 0);
        i = j;
    }
}

/* ByteLevel: an optional leading space, the GPT-2 split, then every byte as its character. */
static void pre_bytelevel(const tokenizer *t, encoder *e, const pre_step *st, const piece *p) {
    piece q = *p;
    if (st->add_prefix_space && e->text.b[p->off] != ' ') {
        q.off = e->text.len;
        buf_put(&e->text, " ", 1);
        if (!buf_reserve(&e->text, (size_t)p->len)) return;
        buf_put(&e->text, e->text.b + p->off, (size_t)p->len);
        q.len = p->len + 1;
    }
    int first = e->next.n;
    if (st->use_regex) split_regex(e, PATTERN_GPT2, &q);
    else push_piece(e, &e->next, q.off, q.len, -1, q.at_start);
    for (int k = first; k < e->next.n && !e->text.oom; k++) {
        piece *r = &e->next.v[k];
        size_t off = e->text.len;
        if (!buf_reserve(&e->text, (size_t)r->len * 2)) return;
        for (int i = 0; i < r->len; i++) {
            int b = (unsigned char)e->text.b[r->off + (size_t)i];
            buf_put(&e->text, t->byte_utf8[b], t->byte_utf8_len[b]);
        }
        r->off = off;
        r->len = (int)(e->text.len - off);
    }
}

// ----------------------------------------------------------------------------
// BPE

static int heap_less(const merge_entry *a, const merge_entry *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(encoder *e, int *n, merge_entry m) {
    if (!grow(e, (void **)&e->heap, &e->cap_heap, *n + 1, sizeof *e->heap)) return;
    int i = (*n)++;
    while (i > 0 && heap_less(&m, &e->heap[(i - 1) / 2])) {
        e->heap[i] = e->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    e->heap[i] = m;
}

static merge_entry heap_pop(encoder *e, int *n) {
    merge_entry top = e->heap[0], last = e->heap[--(*n)];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(&e->heap[c + 1], &e->heap[c])) c++;
        if (!heap_less(&e->heap[c], &last)) break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (*n) e->heap[i] = last;
    return top;
}

static void add_symbol(encoder *e, int *n, int id, int len) {
    if (!grow(e, (void **)&e->sym, &e->cap_sym, *n + 1, sizeof *e->sym)) return;
    if (*n) e->sym[*n - 1].next = *n;
    e->sym[*n] = (symbol){id, *n - 1, -1, len};
    (*n)++;
}

/* The library's BPE::merge_word and Word::merge_all on s[0..n), appending the ids. */
static void bpe_word(const tokenizer *t, encoder *e, const char *s, int n) {
    if (t->ignore_merges) {
        int id = vocab_find(t, s, (size_t)n);
        if (id >= 0) {
            push_id(e, id);
            return;
        }
    }
    int n_sym = 0, unk_len = 0; /* unk_len > 0: an unknown run waits to be added */
    for (int i = 0; i < n;) {
        uint32_t cp;
        int l = utf8_decode((const unsigned char *)s + i, &cp);
        int id = vocab_find(t, s + i, (size_t)l);
        if (id >= 0) {
            if (unk_len) add_symbol(e, &n_sym, t->unk_id, unk_len);
            unk_len = 0;
            add_symbol(e, &n_sym, id, l);
        } else {
            int fallback = t->byte_fallback;
            for (int k = 0; fallback && k < l; k++) fallback = t->byte_ids[(unsigned char)s[i + k]] >= 0;
            if (fallback) { /* the library does not flush a waiting unk here: it lands later */
                for (int k = 0; k < l; k++) add_symbol(e, &n_sym, t->byte_ids[(unsigned char)s[i + k]], 1);
            } else if (t->unk_id >= 0) {
                if (unk_len && !t->fuse_unk) {
                    add_symbol(e, &n_sym, t->unk_id, unk_len);
                    unk_len = 0;
                }
                unk_len += l;
            } /* no unk token: the library drops the character */
        }
        i += l;
    }
    if (unk_len) add_symbol(e, &n_sym, t->unk_id, unk_len);
    if (e->oom) return;

    int n_heap = 0;
    for (int i = 0; i + 1 < n_sym; i++) {
        const merge_slot *m = merge_find(t, e->sym[i].id, e->sym[i + 1].id);
        if (m) heap_push(e, &n_heap, (merge_entry){m->rank, i, m->new_id});
    }
    symbol *sym = e->sym;
    while (n_heap && !e->oom) {
        merge_entry top = heap_pop(e, &n_heap);
        symbol *cur = &sym[top.pos];
        if (cur->len == 0 || cur->next < 0) continue;
        symbol right = sym[cur->next];
        const merge_slot *m = merge_find(t, cur->id, right.id);
        if (!m || m->new_id != top.new_id) continue; /* stale: the pair has changed since */
        int right_pos = cur->next;
        cur->id = top.new_id;
        cur->len += right.len;
        cur->next = right.next;
        sym[right_pos].len = 0;
        if (right.next >= 0) sym[right.next].prev = top.pos;
        if (cur->prev >= 0 && (m = merge_find(t, sym[cur->prev].id, cur->id)))
            heap_push(e, &n_heap, (merge_entry){m->rank, cur->prev, m->new_id});
        if (cur->next >= 0 && (m = merge_find(t, cur->id, sym[cur->next].id)))
            heap_push(e, &n_heap, (merge_entry){m->rank, top.pos, m->new_id});
    }
    for (int i = 0; i < n_sym; i = sym[i].next >= 0 ? sym[i].next : n_sym) push_id(e, sym[i].id);
}

// ----------------------------------------------------------------------------
// Encoding

static void encoder_free(encoder *e) {
    free(e->text.b);
    free(e->norm.b);
    free(e->tmp.b);
    free(e->tmp2.b);
    free(e->cur.v);
    free(e->next.v);
    free(e->cps);
    free(e->cls);
    free(e->offs);
    free(e->sym);
    free(e->heap);
    free(e->ids);
}

static int encoder_oom(const encoder *e) { return e->oom || e->text.oom || e->norm.oom; }

err_code tok_encode(const tokenizer *t, const char *text, size_t len, int add_special, int **ids, int *n_ids) {
    return tok_encode_marked(t, text, len, NULL, add_special, ids, n_ids);
}

err_code tok_encode_marked(const tokenizer *t, const char *text, size_t len, const unsigned char *control,
                           int add_special, int **ids, int *n_ids) {
    *ids = NULL;
    *n_ids = 0;
    size_t bad = utf8_invalid_at((const unsigned char *)text, len);
    if (bad < len)
        return err_set(ERR_UTF8, "byte %zu (0x%02X) of %zu does not start a valid UTF-8 character", bad,
                       (unsigned char)text[bad], len);
    if (len > (size_t)INT32_MAX / 8) return err_set(ERR_ARG, "tok_encode: text of %zu bytes is too long", len);

    encoder e = {0};
    buf_reserve(&e.text, len + 1); /* never NULL, even for empty text */
    buf_put(&e.text, text, len);
    if (add_special)
        for (int k = 0; k < t->n_prefix; k++) push_id(&e, t->prefix[k]);

    /* 1-2: added tokens around normalization */
    piece whole = {0, (int)len, -1, 1};
    split_added(t, &e, &t->raw_index, &whole, control, 1);
    swap_lists(&e);
    for (int k = 0; k < e.cur.n && !encoder_oom(&e); k++) {
        piece p = e.cur.v[k];
        /* a normalized special token matches in a piece that is control text throughout */
        int specials = !control || all_set(control + p.off, p.len);
        if (p.id >= 0 || t->n_norm == 0) {
            if (p.id >= 0) push_piece(&e, &e.next, p.off, p.len, p.id, 0);
            else split_added(t, &e, &t->norm_index, &p, control ? control + p.off : NULL, specials);
            continue;
        }
        e.norm.len = 0;
        normalize(t, e.text.b + p.off, (size_t)p.len, &e.norm, &e.tmp, &e.tmp2);
        piece q = {e.text.len, (int)e.norm.len, -1, p.at_start};
        buf_put(&e.text, e.norm.b, e.norm.len);
        if (q.len && !e.text.oom) split_added(t, &e, &t->norm_index, &q, NULL, specials);
    }
    swap_lists(&e);

    /* 3: pre-tokenizers */
    for (int s = 0; s < t->n_pre && !encoder_oom(&e); s++) {
        const pre_step *st = &t->pre[s];
        for (int k = 0; k < e.cur.n && !encoder_oom(&e); k++) {
            piece p = e.cur.v[k];
            if (p.id >= 0) push_piece(&e, &e.next, p.off, p.len, p.id, 0);
            else if (st->kind == PRE_SPLIT) split_regex(&e, st->pattern, &p);
            else if (st->kind == PRE_DIGITS) split_digits(&e, st->individual_digits, &p);
            else if (st->kind == PRE_METASPACE) pre_metaspace(&e, st, &p);
            else pre_bytelevel(t, &e, st, &p);
        }
        swap_lists(&e);
    }

    /* 4: the model */
    for (int k = 0; k < e.cur.n && !encoder_oom(&e); k++) {
        const piece *p = &e.cur.v[k];
        if (p->id >= 0) push_id(&e, p->id);
        else bpe_word(t, &e, e.text.b + p->off, p->len);
    }

    /* 5: the post-processor */
    if (add_special)
        for (int k = 0; k < t->n_suffix; k++) push_id(&e, t->suffix[k]);

    if (encoder_oom(&e)) {
        encoder_free(&e);
        return err_set(ERR_NOMEM, "tok_encode: text of %zu bytes", len);
    }
    *ids = e.ids;
    *n_ids = e.n_ids;
    e.ids = NULL;
    if (!*ids) *ids = malloc(sizeof **ids); /* a valid pointer for an empty result */
    encoder_free(&e);
    if (!*ids) return err_set(ERR_NOMEM, "tok_encode: result");
    return ERR_OK;
}

// ----------------------------------------------------------------------------
// Decoding

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') return (c | 0x20) - 'a' + 10;
    return -1;
}

/* Runs the decoder chain on one token into out (reset first); first: the token starts the text. */
static void decode_token(const tokenizer *t, const tok_str *tok, int first, buf *out, buf *tmp) {
    out->len = 0;
    if (t->dec_join_space && !first) buf_put(out, " ", 1);
    buf_put(out, tok->s, (size_t)tok->len);
    int fused = 0;
    for (int k = 0; k < t->n_dec; k++) {
        const dec_step *st = &t->dec[k];
        const char *s = out->b;
        size_t n = out->len;
        tmp->len = 0;
        if (st->kind == DEC_BYTELEVEL) { /* a token with a character outside the map stays as is */
            int all = 1;
            for (size_t i = 0; i < n && all;) {
                uint32_t cp;
                i += (size_t)utf8_decode_n((const unsigned char *)s + i, n - i, &cp);
                int b = cp < BYTE_CHAR_END ? t->char_byte[cp] : -1;
                if (b < 0) all = 0;
                else buf_put(tmp, &(char){(char)b}, 1);
            }
            if (!all) {
                tmp->len = 0;
                buf_put(tmp, s, n);
            }
        } else if (st->kind == DEC_REPLACE) {
            buf_replace_all(tmp, s, n, st->pattern.s, (size_t)st->pattern.len, st->content.s, (size_t)st->content.len);
        } else if (st->kind == DEC_BYTE_FALLBACK) {
            int hi = n == 6 ? hex_digit(s[3]) : -1, lo = n == 6 ? hex_digit(s[4]) : -1;
            if (n == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>' && hi >= 0 && lo >= 0)
                buf_put(tmp, &(char){(char)(hi << 4 | lo)}, 1);
            else
                buf_put(tmp, s, n);
        } else if (st->kind == DEC_FUSE) {
            fused = 1;
            continue;
        } else if (st->kind == DEC_STRIP) { /* after Fuse it strips the start of the whole text */
            size_t i = 0;
            for (int c = 0; c < st->start && i < n && (!fused || first); c++) {
                uint32_t cp;
                int l = utf8_decode_n((const unsigned char *)s + i, n - i, &cp);
                if (cp != st->ch) break;
                i += (size_t)l;
            }
            size_t end = n;
            for (int c = 0; c < st->stop && end > i && !fused; c++) {
                size_t b = end - 1;
                while (b > i && ((unsigned char)s[b] & 0xC0) == 0x80) b--;
                uint32_t cp;
                utf8_decode_n((const unsigned char *)s + b, end - b, &cp);
                if (cp != st->ch) break;
                end = b;
            }
            buf_put(tmp, s + i, end - i);
        } else { /* Metaspace: the replacement becomes a space, and disappears from the first token */
            for (size_t i = 0; i < n;) {
                uint32_t cp;
                int l = utf8_decode_n((const unsigned char *)s + i, n - i, &cp);
                if (cp != st->ch) buf_put(tmp, s + i, (size_t)l);
                else if (!(first && st->prepend != PREPEND_NEVER)) buf_put(tmp, " ", 1);
                i += (size_t)l;
            }
        }
        buf x = *out;
        *out = *tmp;
        *tmp = x;
    }
}

int tok_decode_piece(const tokenizer *t, int prev, int id, char *out, size_t cap) {
    if (id < 0 || id >= t->n_ids) return -1;
    const tok_str *p = prev < 0 ? &t->first[id] : &t->piece[id];
    if ((size_t)p->len > cap) return -1;
    if (p->len) memcpy(out, p->s, (size_t)p->len);
    return p->len;
}

int tok_max_piece_bytes(const tokenizer *t) { return t->max_piece; }

int tok_vocab_size(const tokenizer *t) { return t->n_ids; }

int tok_find_added(const tokenizer *t, const char *s, size_t n) {
    for (int k = 0; k < t->n_added; k++)
        if ((size_t)t->added[k].content.len == n && memcmp(t->added[k].content.s, s, n) == 0) return t->added[k].id;
    return -1;
}

int tok_is_added(const tokenizer *t, int id) {
    for (int k = 0; k < t->n_added; k++)
        if (t->added[k].id == id) return 1;
    return 0;
}

int tok_find(const tokenizer *t, const char *str) {
    size_t n = strlen(str);
    int id = tok_find_added(t, str, n);
    return id >= 0 ? id : vocab_find(t, str, n);
}

// ----------------------------------------------------------------------------
// Loading tokenizer.json

typedef struct {
    tokenizer *t;
    const char *path;
    int max_ids; /* every id must be below: the model's vocab_size */
} loader;

static err_code fail(const loader *L, const char *where, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static err_code fail(const loader *L, const char *where, const char *fmt, ...) {
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return err_set(ERR_TOKENIZER, "%s: %s: %s", L->path, where, msg);
}

/* A string member, or NULL if absent or null; ERR_TOKENIZER if it is something else. */
static err_code get_str(const loader *L, const json_value *obj, const char *where, const char *key,
                        const json_value **out) {
    const json_value *v = json_get(obj, key);
    *out = NULL;
    if (!v || v->type == JSON_NULL) return ERR_OK;
    if (v->type != JSON_STRING) return fail(L, where, "\"%s\" must be a string", key);
    *out = v;
    return ERR_OK;
}

static err_code get_bool(const loader *L, const json_value *obj, const char *where, const char *key, int dflt,
                         int *out) {
    const json_value *v = json_get(obj, key);
    *out = dflt;
    if (!v || v->type == JSON_NULL) return ERR_OK;
    if (v->type != JSON_TRUE && v->type != JSON_FALSE) return fail(L, where, "\"%s\" must be true or false", key);
    *out = v->type == JSON_TRUE;
    return ERR_OK;
}

static err_code get_int(const loader *L, const json_value *obj, const char *where, const char *key, int dflt,
                        int *out) {
    const json_value *v = json_get(obj, key);
    *out = dflt;
    if (!v || v->type == JSON_NULL) return ERR_OK;
    if (!json_is_int(v) || v->num < 0 || v->num > INT32_MAX)
        return fail(L, where, "\"%s\" must be a non-negative integer", key);
    *out = (int)v->num;
    return ERR_OK;
}

/* The "type" of a component, which must be a string. */
static err_code get_type(const loader *L, const json_value *obj, const char *where, const char **type) {
    if (!obj || obj->type != JSON_OBJECT) return fail(L, where, "must be an object or null");
    const json_value *v;
    err_code rc = get_str(L, obj, where, "type", &v);
    if (rc) return rc;
    if (!v) return fail(L, where, "has no \"type\"");
    *type = v->str;
    return ERR_OK;
}

static err_code keep(const loader *L, const json_value *v, tok_str *out) {
    char *s = pool_dup(&L->t->pool, v->str, (size_t)v->n);
    if (!s) return err_set(ERR_NOMEM, "%s: %d bytes", L->path, v->n);
    *out = (tok_str){s, v->n};
    return ERR_OK;
}

/* A single character given as a JSON string (Metaspace replacement, Strip content). */
static err_code get_char(const loader *L, const json_value *obj, const char *where, const char *key, uint32_t *out) {
    const json_value *v;
    err_code rc = get_str(L, obj, where, key, &v);
    if (rc) return rc;
    if (!v || v->n == 0 || utf8_invalid_at((const unsigned char *)v->str, (size_t)v->n) != (size_t)v->n ||
        utf8_decode((const unsigned char *)v->str, out) != v->n)
        return fail(L, where, "\"%s\" must be one character", key);
    return ERR_OK;
}

/* A {"String": s} pattern (Replace); a Regex pattern is refused. */
static err_code get_string_pattern(const loader *L, const json_value *obj, const char *where, tok_str *out) {
    const json_value *pat = json_get(obj, "pattern"), *s = json_get(pat, "String");
    if (json_get(pat, "Regex")) return fail(L, where, "Regex patterns are not supported, only {\"String\": ...}");
    if (!s || s->type != JSON_STRING || s->n == 0) return fail(L, where, "\"pattern\" must be {\"String\": non-empty}");
    return keep(L, s, out);
}

static err_code get_prepend_scheme(const loader *L, const json_value *obj, const char *where,
                                   enum prepend_scheme *out) {
    const json_value *v;
    err_code rc = get_str(L, obj, where, "prepend_scheme", &v);
    if (rc) return rc;
    if (!v) { /* older files: add_prefix_space, true by default */
        int add;
        if ((rc = get_bool(L, obj, where, "add_prefix_space", 1, &add))) return rc;
        *out = add ? PREPEND_ALWAYS : PREPEND_NEVER;
    } else if (!strcmp(v->str, "always")) *out = PREPEND_ALWAYS;
    else if (!strcmp(v->str, "first")) *out = PREPEND_FIRST;
    else if (!strcmp(v->str, "never")) *out = PREPEND_NEVER;
    else return fail(L, where, "prepend_scheme \"%s\" is not one of always, first, never", v->str);
    return ERR_OK;
}

static err_code load_model(const loader *L, const json_value *model) {
    tokenizer *t = L->t;
    const char *type = "BPE";
    err_code rc;
    if (!model || model->type != JSON_OBJECT) return fail(L, "model", "must be an object");
    if (json_get(model, "type") && (rc = get_type(L, model, "model", &type))) return rc;
    if (strcmp(type, "BPE")) return fail(L, "model.type", "\"%s\" is not supported (only BPE)", type);
    const json_value *dropout = json_get(model, "dropout"), *v;
    if (dropout && dropout->type != JSON_NULL && !(dropout->type == JSON_NUMBER && dropout->num == 0))
        return fail(L, "model.dropout", "must be null: BPE dropout is random");
    const char *unset[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int k = 0; k < 2; k++) {
        if ((rc = get_str(L, model, "model", unset[k], &v))) return rc;
        if (v && v->n) return fail(L, "model", "%s \"%s\" is not supported", unset[k], v->str);
    }
    if ((rc = get_bool(L, model, "model", "fuse_unk", 0, &t->fuse_unk)) ||
        (rc = get_bool(L, model, "model", "byte_fallback", 0, &t->byte_fallback)) ||
        (rc = get_bool(L, model, "model", "ignore_merges", 0, &t->ignore_merges)))
        return rc;

    /* vocab: {token: id} */
    const json_value *vocab = json_get(model, "vocab");
    if (!vocab || vocab->type != JSON_OBJECT) return fail(L, "model.vocab", "must be an object");
    json_for_each(it, vocab) {
        if (!json_is_int(it) || it->num < 0)
            return fail(L, "model.vocab", "\"%s\": id must be a non-negative integer", it->key);
        if (it->num >= L->max_ids)
            return fail(L, "model.vocab", "\"%s\": id %.0f is outside the model's vocabulary (vocab_size %d)", it->key,
                        it->num, L->max_ids);
        if ((int)it->num + 1 > t->n_vocab) t->n_vocab = (int)it->num + 1;
    }
    uint32_t slots = 16;
    while (slots < 2u * (uint32_t)vocab->n) slots *= 2;
    t->vocab = calloc((size_t)t->n_vocab + 1, sizeof *t->vocab);
    t->vocab_slots = malloc(slots * sizeof *t->vocab_slots);
    if (!t->vocab || !t->vocab_slots) return err_set(ERR_NOMEM, "%s: vocab of %d", L->path, vocab->n);
    memset(t->vocab_slots, 0xFF, slots * sizeof *t->vocab_slots);
    t->vocab_mask = slots - 1;
    json_for_each(it, vocab) {
        int id = (int)it->num;
        if (vocab_find(t, it->key, (size_t)it->key_len) >= 0)
            return fail(L, "model.vocab", "token \"%s\" appears twice", it->key);
        if (t->vocab[id].s)
            return fail(L, "model.vocab", "id %d is given to both \"%s\" and \"%s\"", id, t->vocab[id].s, it->key);
        char *s = pool_dup(&t->pool, it->key, (size_t)it->key_len);
        if (!s) return err_set(ERR_NOMEM, "%s: vocab strings", L->path);
        t->vocab[id] = (tok_str){s, it->key_len};
        uint32_t h = (uint32_t)hash_bytes(s, (size_t)it->key_len) & t->vocab_mask;
        while (t->vocab_slots[h] >= 0) h = (h + 1) & t->vocab_mask;
        t->vocab_slots[h] = id;
    }

    memset(t->char_byte, 0xFF, sizeof t->char_byte);
    for (int b = 0; b < 256; b++) {
        uint32_t cp = byte_char(b);
        t->byte_utf8_len[b] = (unsigned char)utf8_encode(cp, t->byte_utf8[b]);
        t->char_byte[cp] = (short)b;
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_ids[b] = vocab_find(t, name, 6);
    }
    t->unk_id = -1;
    if ((rc = get_str(L, model, "model", "unk_token", &v))) return rc;
    if (v && (t->unk_id = vocab_find(t, v->str, (size_t)v->n)) < 0)
        return fail(L, "model.unk_token", "\"%s\" is not in the vocab", v->str);

    /* merges: ["a b", ...] or [["a", "b"], ...]; rank = position, "#version" lines skipped */
    const json_value *merges = json_get(model, "merges");
    if (merges && merges->type != JSON_ARRAY) return fail(L, "model.merges", "must be an array");
    int n_merges = merges ? merges->n : 0;
    slots = 16;
    while (slots < 2u * (uint32_t)n_merges) slots *= 2;
    t->merges = malloc(slots * sizeof *t->merges);
    if (!t->merges) return err_set(ERR_NOMEM, "%s: %d merges", L->path, n_merges);
    for (uint32_t h = 0; h < slots; h++) t->merges[h].rank = -1;
    t->merge_mask = slots - 1;
    int rank = 0;
    json_for_each(m, merges) {
        const char *a, *b;
        int a_len, b_len;
        if (m->type == JSON_STRING) {
            if (!strncmp(m->str, "#version", 8)) continue;
            const char *sp = memchr(m->str, ' ', (size_t)m->n);
            if (!sp || memchr(sp + 1, ' ', (size_t)(m->str + m->n - sp - 1)))
                return fail(L, "model.merges", "[%d] \"%s\" is not two tokens separated by one space", rank, m->str);
            a = m->str;
            a_len = (int)(sp - m->str);
            b = sp + 1;
            b_len = m->n - a_len - 1;
        } else if (m->type == JSON_ARRAY && m->n == 2 && m->child->type == JSON_STRING &&
                   m->child->next->type == JSON_STRING) {
            a = m->child->str;
            a_len = m->child->n;
            b = m->child->next->str;
            b_len = m->child->next->n;
        } else {
            return fail(L, "model.merges", "[%d] must be \"a b\" or [\"a\", \"b\"]", rank);
        }
        char joined[1024];
        if (a_len + b_len >= (int)sizeof joined) return fail(L, "model.merges", "[%d] is too long", rank);
        memcpy(joined, a, (size_t)a_len);
        memcpy(joined + a_len, b, (size_t)b_len);
        int ia = vocab_find(t, a, (size_t)a_len), ib = vocab_find(t, b, (size_t)b_len);
        int inew = vocab_find(t, joined, (size_t)(a_len + b_len));
        if (ia < 0 || ib < 0 || inew < 0) {
            joined[a_len + b_len] = 0;
            const char *missing = ia < 0 ? a : ib < 0 ? b : joined;
            int missing_len = ia < 0 ? a_len : ib < 0 ? b_len : a_len + b_len;
            return fail(L, "model.merges", "[%d] \"%.*s\" + \"%.*s\": \"%.*s\" is not in the vocab", rank, a_len, a,
                        b_len, b, missing_len, missing);
        }
        uint64_t key = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
        uint32_t h = (uint32_t)hash_pair(key) & t->merge_mask;
        while (t->merges[h].rank >= 0 && t->merges[h].key != key) h = (h + 1) & t->merge_mask;
        t->merges[h] = (merge_slot){key, rank, inew}; /* a repeated pair takes its last rank, as in the library */
        rank++;
    }
    return ERR_OK;
}

static err_code build_index(const loader *L, token_index *ix, int normalized) {
    tokenizer *t = L->t;
    ix->idx = malloc(((size_t)t->n_added + 1) * sizeof *ix->idx);
    if (!ix->idx) return err_set(ERR_NOMEM, "%s: added tokens", L->path);
    int n = 0;
    for (int c = 0; c < 256; c++) {
        ix->start[c] = n;
        for (int k = 0; k < t->n_added; k++) {
            const added_token *a = &t->added[k];
            if (a->normalized == normalized && a->match.len && (unsigned char)a->match.s[0] == c) ix->idx[n++] = k;
        }
    }
    ix->start[256] = n;
    return ERR_OK;
}

static err_code load_added(const loader *L, const json_value *added) {
    tokenizer *t = L->t;
    err_code rc;
    if (!added || added->type == JSON_NULL) return ERR_OK;
    if (added->type != JSON_ARRAY) return fail(L, "added_tokens", "must be an array");
    t->added = calloc((size_t)added->n + 1, sizeof *t->added);
    if (!t->added) return err_set(ERR_NOMEM, "%s: added tokens", L->path);
    int k = 0;
    json_for_each(a, added) {
        char where[64];
        snprintf(where, sizeof where, "added_tokens[%d]", k++);
        const json_value *content;
        int id, single_word;
        added_token *tok = &t->added[t->n_added];
        if ((rc = get_str(L, a, where, "content", &content)) || (rc = get_int(L, a, where, "id", -1, &id)) ||
            (rc = get_bool(L, a, where, "single_word", 0, &single_word)) ||
            (rc = get_bool(L, a, where, "lstrip", 0, &tok->lstrip)) ||
            (rc = get_bool(L, a, where, "rstrip", 0, &tok->rstrip)) ||
            (rc = get_bool(L, a, where, "special", 0, &tok->special)) ||
            (rc = get_bool(L, a, where, "normalized", !tok->special, &tok->normalized)))
            return rc;
        if (!content || id < 0) return fail(L, where, "needs \"content\" and an \"id\"");
        if (id >= L->max_ids)
            return fail(L, where, "\"%s\": id %d is outside the model's vocabulary (vocab_size %d)", content->str, id,
                        L->max_ids);
        if (single_word) return fail(L, where, "\"%s\": single_word true is not supported", content->str);
        if (content->n == 0) continue; /* the library skips empty tokens */
        int dup = 0;
        for (int j = 0; j < t->n_added; j++)
            dup |= t->added[j].content.len == content->n &&
                   !memcmp(t->added[j].content.s, content->str, (size_t)content->n);
        if (dup) continue;
        if ((rc = keep(L, content, &tok->content))) return rc;
        int in_vocab = vocab_find(t, content->str, (size_t)content->n);
        tok->id = in_vocab >= 0 ? in_vocab : id; /* the library gives a token of the vocab its vocab id */
        tok->match = tok->content;
        if (tok->normalized && t->n_norm) {
            buf out = {0}, a = {0}, b = {0};
            normalize(t, content->str, (size_t)content->n, &out, &a, &b);
            char *s = out.oom ? NULL : pool_dup(&t->pool, out.b ? out.b : "", out.len);
            free(out.b);
            free(a.b);
            free(b.b);
            if (!s) return err_set(ERR_NOMEM, "%s: added tokens", L->path);
            tok->match = (tok_str){s, (int)strlen(s)};
        }
        t->n_added++;
    }
    return ERR_OK;
}

/* A "Sequence" component: each entry of its array `key`, loaded in order by load_one with a path
 * like "pre_tokenizer.pretokenizers[2]" for error messages. */
typedef err_code (*component_loader)(const loader *L, const json_value *v, const char *where);
static err_code load_sequence(const loader *L, const json_value *v, const char *where, const char *key,
                              component_loader load_one) {
    const json_value *list = json_get(v, key);
    if (!list || list->type != JSON_ARRAY) return fail(L, where, "Sequence needs a \"%s\" array", key);
    int k = 0;
    json_for_each(it, list) {
        char sub[96];
        snprintf(sub, sizeof sub, "%s.%s[%d]", where, key, k++);
        err_code rc = load_one(L, it, sub);
        if (rc) return rc;
    }
    return ERR_OK;
}

static err_code load_normalizer(const loader *L, const json_value *n, const char *where) {
    tokenizer *t = L->t;
    const char *type = NULL;
    err_code rc;
    if (!n || n->type == JSON_NULL) return ERR_OK;
    if ((rc = get_type(L, n, where, &type))) return rc;
    if (!strcmp(type, "Sequence")) return load_sequence(L, n, where, "normalizers", load_normalizer);
    if (t->n_norm == MAX_STEPS) return fail(L, where, "more than %d normalizers", MAX_STEPS);
    norm_step *st = &t->norm[t->n_norm];
    if (!strcmp(type, "Prepend")) {
        const json_value *v;
        if ((rc = get_str(L, n, where, "prepend", &v))) return rc;
        if (!v) return fail(L, where, "Prepend needs \"prepend\"");
        if ((rc = keep(L, v, &st->a))) return rc;
        st->kind = NORM_PREPEND;
    } else if (!strcmp(type, "Replace")) {
        const json_value *v;
        if ((rc = get_string_pattern(L, n, where, &st->a)) || (rc = get_str(L, n, where, "content", &v))) return rc;
        if (!v) return fail(L, where, "Replace needs \"content\"");
        if ((rc = keep(L, v, &st->b))) return rc;
        st->kind = NORM_REPLACE;
    } else if (!strcmp(type, "NFC")) {
        st->kind = NORM_NFC;
    } else {
        return fail(L, where, "normalizer \"%s\" is not supported (supported: Sequence, Prepend, Replace, NFC)", type);
    }
    t->n_norm++;
    return ERR_OK;
}

static err_code load_pre_tokenizer(const loader *L, const json_value *p, const char *where) {
    tokenizer *t = L->t;
    const char *type = NULL;
    err_code rc;
    if (!p || p->type == JSON_NULL) return ERR_OK;
    if ((rc = get_type(L, p, where, &type))) return rc;
    if (!strcmp(type, "Sequence")) return load_sequence(L, p, where, "pretokenizers", load_pre_tokenizer);
    if (t->n_pre == MAX_STEPS) return fail(L, where, "more than %d pre-tokenizers", MAX_STEPS);
    pre_step *st = &t->pre[t->n_pre];
    if (!strcmp(type, "ByteLevel")) {
        st->kind = PRE_BYTELEVEL;
        st->pattern = PATTERN_GPT2;
        if ((rc = get_bool(L, p, where, "add_prefix_space", 1, &st->add_prefix_space)) ||
            (rc = get_bool(L, p, where, "use_regex", 1, &st->use_regex)))
            return rc;
    } else if (!strcmp(type, "Split")) {
        const json_value *pat = json_get(p, "pattern"), *re = json_get(pat, "Regex"), *behavior;
        int invert;
        if (!re || re->type != JSON_STRING) return fail(L, where, "Split needs {\"Regex\": ...} as its pattern");
        if (!strcmp(re->str, PATTERN_GPT2_RE)) st->pattern = PATTERN_GPT2;
        else if (!strcmp(re->str, PATTERN_LLAMA3_RE)) st->pattern = PATTERN_LLAMA3;
        else if (!strcmp(re->str, PATTERN_QWEN2_RE)) st->pattern = PATTERN_QWEN2;
        else
            return fail(L, where, "Split regex \"%s\" is not supported (only the GPT-2, Llama-3 and Qwen2 patterns)",
                        re->str);
        if ((rc = get_str(L, p, where, "behavior", &behavior)) || (rc = get_bool(L, p, where, "invert", 0, &invert)))
            return rc;
        if (!behavior || strcmp(behavior->str, "Isolated") || invert)
            return fail(L, where, "Split behavior \"%s\" invert %s is not supported (only Isolated, false)",
                        behavior ? behavior->str : "(none)", invert ? "true" : "false");
        st->kind = PRE_SPLIT;
    } else if (!strcmp(type, "Digits")) {
        st->kind = PRE_DIGITS;
        if ((rc = get_bool(L, p, where, "individual_digits", 0, &st->individual_digits))) return rc;
    } else if (!strcmp(type, "Metaspace")) {
        st->kind = PRE_METASPACE;
        if ((rc = get_char(L, p, where, "replacement", &st->replacement)) ||
            (rc = get_prepend_scheme(L, p, where, &st->prepend)) ||
            (rc = get_bool(L, p, where, "split", 1, &st->split)))
            return rc;
    } else {
        return fail(L, where,
                    "pre-tokenizer \"%s\" is not supported (supported: Sequence, ByteLevel, Split, Digits, Metaspace)",
                    type);
    }
    t->n_pre++;
    return ERR_OK;
}

/* Appends the ids of the special token named name (from TemplateProcessing's special_tokens). */
static err_code template_ids(const loader *L, const json_value *specials, const char *name, int **ids, int *n) {
    const json_value *sp = json_get(specials, name), *list = json_get(sp, "ids");
    if (!list || list->type != JSON_ARRAY) return fail(L, "post_processor.special_tokens", "no ids for \"%s\"", name);
    int *p = realloc(*ids, ((size_t)*n + (size_t)list->n + 1) * sizeof *p);
    if (!p) return err_set(ERR_NOMEM, "%s: post_processor", L->path);
    *ids = p;
    json_for_each(it, list) {
        if (!json_is_int(it) || it->num < 0)
            return fail(L, "post_processor.special_tokens", "\"%s\": ids must be non-negative integers", name);
        if (it->num >= L->max_ids)
            return fail(L, "post_processor.special_tokens", "\"%s\": id %.0f is outside the model's vocabulary "
                        "(vocab_size %d)", name, it->num, L->max_ids);
        p[(*n)++] = (int)it->num;
    }
    return ERR_OK;
}

static err_code load_post_processor(const loader *L, const json_value *p, const char *where) {
    tokenizer *t = L->t;
    const char *type = NULL;
    err_code rc;
    if (!p || p->type == JSON_NULL) return ERR_OK;
    if ((rc = get_type(L, p, where, &type))) return rc;
    if (!strcmp(type, "Sequence")) return load_sequence(L, p, where, "processors", load_post_processor);
    if (!strcmp(type, "ByteLevel")) return ERR_OK; /* it only trims offsets */
    if (!strcmp(type, "TemplateProcessing")) {
        if (t->n_prefix || t->n_suffix) return fail(L, where, "a second template is not supported");
        const json_value *single = json_get(p, "single"), *specials = json_get(p, "special_tokens");
        if (!single || single->type != JSON_ARRAY) return fail(L, where, "TemplateProcessing needs a \"single\" array");
        int seen = 0;
        json_for_each(it, single) {
            const json_value *sp = json_get(json_get(it, "SpecialToken"), "id");
            const json_value *seq = json_get(json_get(it, "Sequence"), "id");
            if (sp && sp->type == JSON_STRING) {
                if ((rc = seen ? template_ids(L, specials, sp->str, &t->suffix, &t->n_suffix)
                               : template_ids(L, specials, sp->str, &t->prefix, &t->n_prefix)))
                    return rc;
            } else if (seq && seq->type == JSON_STRING && !strcmp(seq->str, "A") && !seen) {
                seen = 1;
            } else {
                return fail(L, where, "single: each item must be a SpecialToken or the Sequence A, once");
            }
        }
        if (!seen) return fail(L, where, "single: has no Sequence A");
        return ERR_OK;
    }
    if (!strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing")) { /* single: cls A sep */
        const json_value *cls = json_get(p, "cls"), *sep = json_get(p, "sep");
        if (t->n_prefix || t->n_suffix) return fail(L, where, "a second template is not supported");
        const json_value *cls_id = cls && cls->type == JSON_ARRAY && cls->n == 2 ? cls->child->next : NULL;
        const json_value *sep_id = sep && sep->type == JSON_ARRAY && sep->n == 2 ? sep->child->next : NULL;
        if (!json_is_int(cls_id) || cls_id->num < 0 || !json_is_int(sep_id) || sep_id->num < 0)
            return fail(L, where, "%s needs \"cls\" and \"sep\" as [token, id]", type);
        if (cls_id->num >= L->max_ids || sep_id->num >= L->max_ids)
            return fail(L, where, "%s: id %.0f is outside the model's vocabulary (vocab_size %d)", type,
                        cls_id->num >= L->max_ids ? cls_id->num : sep_id->num, L->max_ids);
        t->prefix = malloc(sizeof *t->prefix);
        t->suffix = malloc(sizeof *t->suffix);
        if (!t->prefix || !t->suffix) return err_set(ERR_NOMEM, "%s: post_processor", L->path);
        t->prefix[t->n_prefix++] = (int)cls_id->num;
        t->suffix[t->n_suffix++] = (int)sep_id->num;
        return ERR_OK;
    }
    return fail(L, where,
                "post-processor \"%s\" is not supported (supported: TemplateProcessing, BertProcessing, "
                "RobertaProcessing, ByteLevel, Sequence)",
                type);
}

static err_code load_decoder(const loader *L, const json_value *d, const char *where) {
    tokenizer *t = L->t;
    const char *type = NULL;
    err_code rc;
    if (!d || d->type == JSON_NULL) return ERR_OK;
    if ((rc = get_type(L, d, where, &type))) return rc;
    if (!strcmp(type, "Sequence")) return load_sequence(L, d, where, "decoders", load_decoder);
    if (t->n_dec == MAX_STEPS) return fail(L, where, "more than %d decoders", MAX_STEPS);
    dec_step *st = &t->dec[t->n_dec];
    if (!strcmp(type, "ByteLevel")) {
        st->kind = DEC_BYTELEVEL;
    } else if (!strcmp(type, "Replace")) {
        const json_value *v;
        if ((rc = get_string_pattern(L, d, where, &st->pattern)) || (rc = get_str(L, d, where, "content", &v)))
            return rc;
        if (!v) return fail(L, where, "Replace needs \"content\"");
        if ((rc = keep(L, v, &st->content))) return rc;
        st->kind = DEC_REPLACE;
    } else if (!strcmp(type, "ByteFallback")) {
        st->kind = DEC_BYTE_FALLBACK;
    } else if (!strcmp(type, "Fuse")) {
        st->kind = DEC_FUSE;
    } else if (!strcmp(type, "Strip")) {
        st->kind = DEC_STRIP;
        if ((rc = get_char(L, d, where, "content", &st->ch)) || (rc = get_int(L, d, where, "start", 0, &st->start)) ||
            (rc = get_int(L, d, where, "stop", 0, &st->stop)))
            return rc;
        int fused = 0;
        for (int k = 0; k < t->n_dec; k++) fused |= t->dec[k].kind == DEC_FUSE;
        if (fused && st->stop)
            return fail(L, where, "Strip with stop %d after Fuse is not supported: pieces are decoded one by one",
                        st->stop);
    } else if (!strcmp(type, "Metaspace")) {
        st->kind = DEC_METASPACE;
        if ((rc = get_char(L, d, where, "replacement", &st->ch)) ||
            (rc = get_prepend_scheme(L, d, where, &st->prepend)))
            return rc;
    } else {
        return fail(L, where,
                    "decoder \"%s\" is not supported "
                    "(supported: Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace)",
                    type);
    }
    t->n_dec++;
    return ERR_OK;
}

/* Decodes every id once, for tok_decode_piece. */
static err_code build_pieces(const loader *L) {
    tokenizer *t = L->t;
    t->n_ids = t->n_vocab;
    for (int k = 0; k < t->n_added; k++)
        if (t->added[k].id + 1 > t->n_ids) t->n_ids = t->added[k].id + 1;
    t->piece = calloc((size_t)t->n_ids + 1, sizeof *t->piece);
    t->first = calloc((size_t)t->n_ids + 1, sizeof *t->first);
    if (!t->piece || !t->first) return err_set(ERR_NOMEM, "%s: %d ids", L->path, t->n_ids);
    tok_str *content = calloc((size_t)t->n_ids + 1, sizeof *content);
    if (!content) return err_set(ERR_NOMEM, "%s: %d ids", L->path, t->n_ids);
    memcpy(content, t->vocab, (size_t)t->n_vocab * sizeof *content);
    /* the library decodes a normalized added token from its normalized form (" ell" as "▁▁ell") */
    for (int k = 0; k < t->n_added; k++) content[t->added[k].id] = t->added[k].match;
    err_code rc = ERR_OK;
    for (int k = 0; k < t->n_prefix + t->n_suffix && !rc; k++) {
        int id = k < t->n_prefix ? t->prefix[k] : t->suffix[k - t->n_prefix];
        if (id >= t->n_ids || !content[id].s)
            rc = fail(L, "post_processor", "special token id %d is not a token of the vocabulary or the added tokens", id);
    }
    if (rc) {
        free(content);
        return rc;
    }
    buf out = {0}, tmp = {0};
    for (int id = 0; id < t->n_ids && !rc; id++) {
        if (!content[id].s) { /* the library skips ids it does not know */
            t->piece[id] = t->first[id] = (tok_str){"", 0};
            continue;
        }
        for (int first = 0; first < 2; first++) {
            decode_token(t, &content[id], first, &out, &tmp);
            tok_str *dst = first ? &t->first[id] : &t->piece[id];
            if (first && out.len == (size_t)t->piece[id].len && !memcmp(out.b, t->piece[id].s, out.len)) {
                *dst = t->piece[id];
                continue;
            }
            char *s = out.oom || tmp.oom ? NULL : pool_dup(&t->pool, out.b ? out.b : "", out.len);
            if (!s) {
                rc = err_set(ERR_NOMEM, "%s: decoded pieces", L->path);
                break;
            }
            *dst = (tok_str){s, (int)out.len};
            if ((int)out.len > t->max_piece) t->max_piece = (int)out.len;
        }
    }
    free(out.b);
    free(tmp.b);
    free(content);
    return rc;
}

static err_code load_root(const loader *L, const json_value *root) {
    err_code rc;
    if (!root || root->type != JSON_OBJECT) return fail(L, "(root)", "must be an object");
    const char *unset[] = {"truncation", "padding"};
    for (int k = 0; k < 2; k++) {
        const json_value *v = json_get(root, unset[k]);
        if (v && v->type != JSON_NULL) return fail(L, unset[k], "must be null: %s is not supported", unset[k]);
    }
    /* the normalizer first: the added tokens that are normalized are matched normalized */
    if ((rc = load_model(L, json_get(root, "model"))) ||
        (rc = load_normalizer(L, json_get(root, "normalizer"), "normalizer")) ||
        (rc = load_added(L, json_get(root, "added_tokens"))) ||
        (rc = load_pre_tokenizer(L, json_get(root, "pre_tokenizer"), "pre_tokenizer")) ||
        (rc = load_post_processor(L, json_get(root, "post_processor"), "post_processor")) ||
        (rc = load_decoder(L, json_get(root, "decoder"), "decoder")))
        return rc;
    const json_value *dec = json_get(root, "decoder");
    L->t->dec_join_space = !dec || dec->type == JSON_NULL;
    if ((rc = build_index(L, &L->t->raw_index, 0)) || (rc = build_index(L, &L->t->norm_index, 1))) return rc;
    return build_pieces(L);
}

err_code tok_load(tokenizer **out, const char *path, int max_ids) {
    *out = NULL;
    json_doc doc;
    err_code rc = json_parse_file(path, &doc);
    if (rc) return rc;
    tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        json_free(&doc);
        return err_set(ERR_NOMEM, "%s: tokenizer", path);
    }
    loader L = {t, path, max_ids};
    rc = load_root(&L, doc.root);
    json_free(&doc);
    if (rc) {
        tok_free(t);
        return rc;
    }
    *out = t;
    return ERR_OK;
}

void tok_free(tokenizer *t) {
    if (!t) return;
    while (t->pool) {
        pool_chunk *next = t->pool->next;
        free(t->pool);
        t->pool = next;
    }
    free(t->vocab);
    free(t->vocab_slots);
    free(t->merges);
    free(t->added);
    free(t->raw_index.idx);
    free(t->norm_index.idx);
    free(t->prefix);
    free(t->suffix);
    free(t->piece);
    free(t->first);
    free(t);
}
