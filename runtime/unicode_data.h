/* unicode_data.h - the Unicode tables the tokenizer needs, generated into unicode_data.c by
 * codegen/unicode_tables.py from Python's unicodedata (regenerate with
 * `.venv/bin/python -m codegen.unicode_tables`).
 *
 * Every table is sorted by code point so that lookups are binary searches; the lookup functions
 * (with an ASCII fast path) live in tokenizer.c, their only user. */
#ifndef INGOT_UNICODE_DATA_H
#define INGOT_UNICODE_DATA_H

/* Bumped with FORMAT in codegen/unicode_tables.py whenever the layout below changes; a stale
 * unicode_data.c then refuses to compile. */
#define UNICODE_DATA_FORMAT 1

/* The classes the pre-tokenizer regexes ask about. */
enum unicode_class {
    UNICODE_OTHER = 0,
    UNICODE_LETTER = 1, /* \p{L}: general category L* */
    UNICODE_NUMBER = 2, /* \p{N}: general category N* (also Rust's char::is_numeric) */
    UNICODE_SPACE = 3,  /* \s: the White_Space property (also Rust's char::is_whitespace) */
};

#define UNICODE_DECOMP_MAX 4 /* code points in the longest full canonical decomposition */

typedef struct { unsigned first, last, value; } unicode_range;
typedef struct { unsigned cp, start, len; } unicode_decomp;
typedef struct { unsigned first, second, composite; } unicode_pair;

extern const char unicode_data_version[];                       /* e.g. "14.0.0" */
extern const unicode_range unicode_class_ranges[];              /* value: enum unicode_class */
extern const int unicode_n_class_ranges;
extern const unicode_range unicode_ccc_ranges[];                /* value: combining class */
extern const int unicode_n_ccc_ranges;
extern const unicode_decomp unicode_decomps[];                  /* sorted by cp */
extern const int unicode_n_decomps;
extern const unsigned unicode_decomp_cps[];
extern const unicode_pair unicode_compositions[];               /* sorted by (first, second) */
extern const int unicode_n_compositions;

#endif
