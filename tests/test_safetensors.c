/* test_safetensors.c - writes good and broken safetensors files into a temporary directory and
 * checks that st_model_open()/st_model_bind() accept the good ones, hand out pointers to exactly
 * the bytes written, and refuse each defect with its own error code and a detail line naming the
 * file and the tensor.
 *
 * Each case gets its own directory under one mkdtemp() root, removed at the end. Prints one line
 * per failed check and ends with "N passed, M failed". */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "safetensors.h"


// ------------------------------------------------------------------------------------------------
// scratch files: every path created is remembered and removed at exit, newest first

static char root[64];
static char *created[256];
static int n_created;

static const char *remember(const char *path) {
    if (n_created < (int)(sizeof created / sizeof created[0])) created[n_created++] = strdup(path);
    return created[n_created - 1];
}

static void cleanup(void) {
    for (int i = n_created - 1; i >= 0; i--) {
        if (remove(created[i]) != 0) printf("warning: cannot remove %s\n", created[i]);
        free(created[i]);
    }
    rmdir(root);
}

/* A fresh directory for one case: root/name. */
static const char *case_dir(const char *name) {
    char p[256];
    snprintf(p, sizeof p, "%s/%s", root, name);
    if (mkdir(p, 0700) != 0) {
        printf("cannot create %s\n", p);
        exit(1);
    }
    return remember(p);
}

static void write_bytes(const char *dir, const char *name, const void *bytes, size_t len) {
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(bytes, 1, len, f) != len || fclose(f) != 0) {
        printf("cannot write %s\n", p);
        exit(1);
    }
    remember(p);
}

/* Writes length field, header and data as given: the header is not padded, len_field need not
 * match it. */
static void write_st_raw(const char *dir, const char *name, uint64_t len_field, const char *header,
                         const void *data, size_t data_len) {
    size_t hl = strlen(header);
    unsigned char *buf = malloc(8 + hl + data_len + 1);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(len_field >> (8 * i));
    memcpy(buf + 8, header, hl);
    if (data_len) memcpy(buf + 8 + hl, data, data_len);
    write_bytes(dir, name, buf, 8 + hl + data_len);
    free(buf);
}

/* A well-formed file: header padded with spaces to a multiple of 8 bytes, as writers do. */
static void write_st(const char *dir, const char *name, const char *header, const void *data,
                     size_t data_len) {
    char padded[4096];
    snprintf(padded, sizeof padded, "%s", header);
    size_t hl = strlen(padded);
    while (hl % 8) padded[hl++] = ' ';
    padded[hl] = '\0';
    write_st_raw(dir, name, hl, padded, data, data_len);
}

static int contains(const char *s, const char *sub) { return strstr(s, sub) != NULL; }

/* Opens dir and expects code, with a detail naming dir and each of the NULL-terminated strings. */
static void expect_open(const char *dir, err_code code, ...) {
    st_model *m = NULL;
    err_code rc = st_model_open(&m, dir);
    const char *d = err_detail();
    CHECK(rc == code, "open %s: got %s (%s), expected %s", dir, err_name(rc), rc ? d : "",
          err_name(code));
    if (rc == ERR_OK) {
        CHECK(m != NULL, "open %s: ok but no model", dir);
        st_model_close(m);
        return;
    }
    CHECK(m == NULL, "open %s: failed but returned a model", dir);
    CHECK(contains(d, dir), "open %s: detail does not name the file: %s", dir, d);
    va_list ap;
    va_start(ap, code);
    for (const char *s; (s = va_arg(ap, const char *));) {
        CHECK(contains(d, s), "open %s: detail lacks \"%s\": %s", dir, s, d);
    }
    va_end(ap);
}

// ------------------------------------------------------------------------------------------------
// the good model: three tensors of the three dtypes, bytes that differ everywhere

/* a: F32 (2, 3) = 24 bytes at [0, 24); b: BF16 (4) = 8 bytes at [24, 32); c: F16 (2, 2) at [32, 40) */
#define GOOD_BYTES 40
static unsigned char good_data[GOOD_BYTES];
static const char *good_header =
    "{\"__metadata__\":{\"format\":\"pt\"},"
    "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
    "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
    "\"c\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[32,40]}}";

static const st_tensor_spec good_specs[3] = {
    {"a", DT_F32, 2, {2, 3}},
    {"b", DT_BF16, 1, {4}},
    {"c", DT_F16, 2, {2, 2}},
};
static const size_t good_off[3] = {0, 24, 32}, good_len[3] = {24, 8, 8};

static int ignore_c(const char *name) { return strcmp(name, "c") == 0; }
static int ignore_none(const char *name) { (void)name; return 0; }

/* Opens dir (which must open) and binds specs, expecting code and a detail naming each string. */
static void expect_bind(const char *dir, const st_tensor_spec *specs, int n,
                        int (*ignore)(const char *), err_code code, ...) {
    st_model *m = NULL;
    err_code rc = st_model_open(&m, dir);
    CHECK(rc == ERR_OK, "open %s: %s: %s", dir, err_name(rc), err_detail());
    if (rc) return;
    const void *data[8] = {0};
    rc = st_model_bind(m, specs, n, data, ignore);
    const char *d = err_detail();
    CHECK(rc == code, "bind %s: got %s (%s), expected %s", dir, err_name(rc), rc ? d : "",
          err_name(code));
    if (rc != ERR_OK) {
        CHECK(contains(d, dir), "bind %s: detail does not name the file: %s", dir, d);
        va_list ap;
        va_start(ap, code);
        for (const char *s; (s = va_arg(ap, const char *));) {
            CHECK(contains(d, s), "bind %s: detail lacks \"%s\": %s", dir, s, d);
        }
        va_end(ap);
    }
    st_model_close(m);
}

static void test_good(void) {
    const char *dir = case_dir("good");
    write_st(dir, "model.safetensors", good_header, good_data, GOOD_BYTES);
    st_model *m = NULL;
    err_code rc = st_model_open(&m, dir);
    CHECK(rc == ERR_OK, "good: open: %s: %s", err_name(rc), err_detail());
    if (rc) return;
    CHECK(st_model_data_bytes(m) == GOOD_BYTES, "good: data bytes %zu, expected %d",
          st_model_data_bytes(m), GOOD_BYTES);
    const void *data[3] = {0};
    rc = st_model_bind(m, good_specs, 3, data, NULL);
    CHECK(rc == ERR_OK, "good: bind: %s: %s", err_name(rc), err_detail());
    for (int i = 0; i < 3 && rc == ERR_OK; i++) {
        CHECK(data[i] && memcmp(data[i], good_data + good_off[i], good_len[i]) == 0,
              "good: tensor %s does not read back the bytes written", good_specs[i].name);
        CHECK((uintptr_t)data[i] % st_dtype_size(good_specs[i].dtype) == 0,
              "good: tensor %s misaligned", good_specs[i].name);
    }
    /* Specs in another order than the file bind the same pointers. */
    const st_tensor_spec rev[3] = {good_specs[2], good_specs[0], good_specs[1]};
    const void *data2[3] = {0};
    rc = st_model_bind(m, rev, 3, data2, NULL);
    CHECK(rc == ERR_OK && data2[0] == data[2] && data2[1] == data[0] && data2[2] == data[1],
          "good: binding in another order gives other pointers");
    st_model_close(m);

    CHECK(strcmp(st_dtype_name(DT_BF16), "BF16") == 0 && st_dtype_size(DT_BF16) == 2 &&
          st_dtype_size(DT_F32) == 4 && strcmp(st_dtype_name(DT_F16), "F16") == 0,
          "dtype name/size table wrong");
}

// ------------------------------------------------------------------------------------------------
// defects of one file, found at open

static void test_file_defects(void) {
    const char *dir = case_dir("no_file");
    expect_open(dir, ERR_IO, "model.safetensors", "No such file", NULL);

    dir = case_dir("empty");
    write_bytes(dir, "model.safetensors", "", 0);
    expect_open(dir, ERR_ST_TRUNCATED, "0 bytes", NULL);

    dir = case_dir("len_huge");
    write_st_raw(dir, "model.safetensors", (uint64_t)1 << 40, "{}      ", NULL, 0);
    expect_open(dir, ERR_ST_HEADER, "1099511627776", "limit", NULL);

    /* A length that fits the cap but not the file: the file was cut inside its header. */
    dir = case_dir("len_past_eof");
    write_st_raw(dir, "model.safetensors", 4096, "{\"a\":{\"dtype\":\"F32\",", NULL, 0);
    expect_open(dir, ERR_ST_TRUNCATED, "4096", NULL);

    dir = case_dir("not_json");
    write_st(dir, "model.safetensors", "{\"a\": nope}", NULL, 0);
    expect_open(dir, ERR_ST_HEADER, "not valid JSON", NULL);

    dir = case_dir("not_object");
    write_st(dir, "model.safetensors", "[1, 2, 3]", NULL, 0);
    expect_open(dir, ERR_ST_HEADER, "not a JSON object", NULL);

    dir = case_dir("metadata_not_string");
    write_st(dir, "model.safetensors", "{\"__metadata__\":{\"format\":1}}", NULL, 0);
    expect_open(dir, ERR_ST_HEADER, "__metadata__", NULL);

    dir = case_dir("entry_not_object");
    write_st(dir, "model.safetensors", "{\"w\":[1]}", NULL, 0);
    expect_open(dir, ERR_ST_HEADER, "tensor w", NULL);

    dir = case_dir("bad_dtype");
    write_st(dir, "model.safetensors",
             "{\"w\":{\"dtype\":\"Q4_K\",\"shape\":[2],\"data_offsets\":[0,2]}}", "xx", 2);
    expect_open(dir, ERR_ST_HEADER, "tensor w", "Q4_K", NULL);

    dir = case_dir("dtype_not_string");
    write_st(dir, "model.safetensors",
             "{\"w\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", "xxxx", 4);
    expect_open(dir, ERR_ST_HEADER, "tensor w", "dtype", NULL);

    dir = case_dir("shape_negative");
    write_st(dir, "model.safetensors",
             "{\"w\":{\"dtype\":\"F32\",\"shape\":[-1,2],\"data_offsets\":[0,8]}}", "12345678", 8);
    expect_open(dir, ERR_ST_HEADER, "tensor w", "shape", NULL);

    dir = case_dir("shape_fraction");
    write_st(dir, "model.safetensors",
             "{\"w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", "1234", 4);
    expect_open(dir, ERR_ST_HEADER, "tensor w", "shape", NULL);

    dir = case_dir("shape_string");
    write_st(dir, "model.safetensors",
             "{\"w\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", "12345678", 8);
    expect_open(dir, ERR_ST_HEADER, "tensor w", "shape", NULL);

    dir = case_dir("shape_overflow");
    write_st(dir, "model.safetensors",
             "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}",
             "1234", 4);
    expect_open(dir, ERR_ST_HEADER, "tensor w", "too large", NULL);

    dir = case_dir("offsets_reversed");
    write_st(dir, "model.safetensors",
             "{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}", "12345678", 8);
    expect_open(dir, ERR_ST_OFFSETS, "tensor w", "out of range", NULL);

    /* Offsets far past the data, leaving the data before them undescribed: corruption, not a short
     * file, since a short file keeps a layout that starts at 0 without holes. */
    dir = case_dir("offsets_past_end");
    write_st(dir, "model.safetensors",
             "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[1024,1032]}}", "12345678", 8);
    expect_open(dir, ERR_ST_OFFSETS, "tensor w", "out of range", "1024", NULL);

    dir = case_dir("offsets_vs_shape");
    write_st(dir, "model.safetensors",
             "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,8]}}", "12345678", 8);
    expect_open(dir, ERR_ST_OFFSETS, "tensor w", "8 bytes", "needs 12", "[2, 3]", NULL);

    dir = case_dir("overlap");
    write_st(dir, "model.safetensors",
             "{\"x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
             "\"y\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
             "0123456789abcdefghijklmn", 24);
    expect_open(dir, ERR_ST_OFFSETS, "tensor y", "overlap", "tensor x", NULL);

    /* Header says 40 bytes of data, the file holds 36: cut inside tensor c. */
    dir = case_dir("truncated");
    write_st(dir, "model.safetensors", good_header, good_data, 36);
    expect_open(dir, ERR_ST_TRUNCATED, "tensor c", "ends at data byte 40", "only 36 bytes",
                "4 bytes missing", NULL);

    /* Cut before tensor c even begins: still truncation, still naming c. */
    dir = case_dir("truncated_whole_tensor");
    write_st(dir, "model.safetensors", good_header, good_data, 24);
    expect_open(dir, ERR_ST_TRUNCATED, "tensor b", "16 bytes missing", NULL);

    dir = case_dir("trailing_bytes");
    unsigned char more[GOOD_BYTES + 5] = {0};
    write_st(dir, "model.safetensors", good_header, more, sizeof more);
    expect_open(dir, ERR_ST_OFFSETS, "5 bytes after the last tensor", NULL);

    dir = case_dir("duplicate_name");
    write_st(dir, "model.safetensors",
             "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
             "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", "12345678", 8);
    expect_open(dir, ERR_ST_HEADER, "duplicate key \"w\"", NULL);

    /* Edge cases that are valid: an empty header, a scalar, a zero-sized tensor. */
    dir = case_dir("empty_header");
    write_st(dir, "model.safetensors", "{}", NULL, 0);
    expect_open(dir, ERR_OK, NULL);

    dir = case_dir("scalar_and_empty");
    write_st(dir, "model.safetensors",
             "{\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
             "\"z\":{\"dtype\":\"F32\",\"shape\":[0,7],\"data_offsets\":[4,4]}}", "1234", 4);
    expect_open(dir, ERR_OK, NULL);
}

// ------------------------------------------------------------------------------------------------
// defects found at bind: the file is fine, it is not the model the binary expects

static void test_bind_defects(void) {
    const char *dir = case_dir("bind");
    write_st(dir, "model.safetensors", good_header, good_data, GOOD_BYTES);

    expect_bind(dir, good_specs, 3, NULL, ERR_OK, NULL);

    st_tensor_spec s[4];
    memcpy(s, good_specs, sizeof good_specs);
    s[3] = (st_tensor_spec){"model.layers.3.mlp.up_proj.weight", DT_BF16, 2, {1536, 576}};
    expect_bind(dir, s, 4, NULL, ERR_ST_MISSING, "model.layers.3.mlp.up_proj.weight", "not found",
                NULL);

    memcpy(s, good_specs, sizeof good_specs);
    s[0].dtype = DT_BF16;
    expect_bind(dir, s, 3, NULL, ERR_ST_DTYPE, "a: dtype F32, expected BF16", NULL);

    memcpy(s, good_specs, sizeof good_specs);
    s[0].shape[0] = 3;
    s[0].shape[1] = 2;
    expect_bind(dir, s, 3, NULL, ERR_ST_SHAPE, "a: shape [2, 3], expected [3, 2]", NULL);

    memcpy(s, good_specs, sizeof good_specs);
    s[1].ndim = 2;
    s[1].shape[0] = 1;
    s[1].shape[1] = 4;
    expect_bind(dir, s, 3, NULL, ERR_ST_SHAPE, "b: shape [4], expected [1, 4]", NULL);

    expect_bind(dir, good_specs, 2, NULL, ERR_ST_EXTRA, "c", "not a tensor of this model", NULL);
    expect_bind(dir, good_specs, 2, ignore_none, ERR_ST_EXTRA, "c", NULL);
    expect_bind(dir, good_specs, 2, ignore_c, ERR_OK, NULL);
    expect_bind(dir, good_specs, 1, ignore_c, ERR_ST_EXTRA, "b (dtype BF16)", NULL);
    expect_bind(dir, good_specs, 1, NULL, ERR_ST_EXTRA, "b", "and 1 more", NULL);

    /* A dtype ingot cannot use is fine in the file, named when the model needs that tensor,
     * and an extra tensor like any other when it does not. */
    dir = case_dir("bind_i64");
    write_st(dir, "model.safetensors",
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"pos\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[8,24]}}",
             "0123456789abcdefghijklmn", 24);
    const st_tensor_spec a = {"a", DT_F32, 1, {2}};
    const st_tensor_spec both[2] = {a, {"pos", DT_F32, 1, {2}}};
    expect_bind(dir, both, 2, NULL, ERR_ST_DTYPE, "pos: dtype I64, expected F32", NULL);
    expect_bind(dir, &a, 1, NULL, ERR_ST_EXTRA, "pos (dtype I64)", NULL);

    /* Header of 55 bytes, not padded: data starts at file byte 63, odd, so an F16 tensor there is
     * misaligned. */
    dir = case_dir("misaligned");
    const char *h = "{\"h\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}} ";
    CHECK(strlen(h) == 55, "misaligned: header is %zu bytes, the case needs 55", strlen(h));
    write_st_raw(dir, "model.safetensors", strlen(h), h, "1234", 4);
    const st_tensor_spec hs = {"h", DT_F16, 1, {2}};
    expect_bind(dir, &hs, 1, NULL, ERR_ST_OFFSETS, "h", "aligned", NULL);
}

// ------------------------------------------------------------------------------------------------
// sharded models

/* Shard 1 holds a, shard 2 holds b and c; the bytes are those of the good file. */
static const char *shard1 = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}";
static const char *shard2 =
    "{\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]},"
    "\"c\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[8,16]}}";
#define S1 "model-00001-of-00002.safetensors"
#define S2 "model-00002-of-00002.safetensors"

static void write_shards(const char *dir) {
    write_st(dir, S1, shard1, good_data, 24);
    write_st(dir, S2, shard2, good_data + 24, 16);
}

static void write_index(const char *dir, const char *weight_map) {
    char buf[1024];
    snprintf(buf, sizeof buf, "{\"metadata\":{\"total_size\":40},\"weight_map\":{%s}}", weight_map);
    write_bytes(dir, "model.safetensors.index.json", buf, strlen(buf));
}

static void test_sharded(void) {
    const char *dir = case_dir("sharded");
    write_shards(dir);
    write_index(dir, "\"a\":\"" S1 "\",\"b\":\"" S2 "\",\"c\":\"" S2 "\"");
    st_model *m = NULL;
    err_code rc = st_model_open(&m, dir);
    CHECK(rc == ERR_OK, "sharded: open: %s: %s", err_name(rc), err_detail());
    if (rc == ERR_OK) {
        CHECK(st_model_data_bytes(m) == GOOD_BYTES, "sharded: data bytes %zu, expected %d",
              st_model_data_bytes(m), GOOD_BYTES);
        const void *data[3] = {0};
        rc = st_model_bind(m, good_specs, 3, data, NULL);
        CHECK(rc == ERR_OK, "sharded: bind: %s: %s", err_name(rc), err_detail());
        for (int i = 0; i < 3 && rc == ERR_OK; i++) {
            CHECK(data[i] && memcmp(data[i], good_data + good_off[i], good_len[i]) == 0,
                  "sharded: tensor %s does not read back the bytes written", good_specs[i].name);
        }
        st_model_close(m);
    }
    /* Errors at bind name the file that holds the tensor. */
    st_tensor_spec s[3];
    memcpy(s, good_specs, sizeof good_specs);
    s[2].dtype = DT_F32;
    expect_bind(dir, s, 3, NULL, ERR_ST_DTYPE, S2, "c: dtype F16, expected F32", NULL);
    expect_bind(dir, good_specs, 2, NULL, ERR_ST_EXTRA, S2, NULL);

    dir = case_dir("shard_missing");
    write_st(dir, S1, shard1, good_data, 24);
    write_index(dir, "\"a\":\"" S1 "\",\"b\":\"" S2 "\",\"c\":\"" S2 "\"");
    expect_open(dir, ERR_IO, S2, "model.safetensors.index.json", NULL);

    dir = case_dir("shard_wrong");
    write_shards(dir);
    write_index(dir, "\"a\":\"" S1 "\",\"b\":\"" S1 "\",\"c\":\"" S2 "\"");
    expect_open(dir, ERR_ST_HEADER, "tensor b", S2, "puts it in " S1, NULL);

    dir = case_dir("shard_duplicate");
    write_st(dir, S1, shard1, good_data, 24);
    write_st(dir, S2,
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", good_data, 24);
    write_index(dir, "\"a\":\"" S1 "\",\"z\":\"" S2 "\"");
    expect_open(dir, ERR_ST_HEADER, "tensor a", S1, S2, NULL);

    dir = case_dir("shard_unindexed");
    write_shards(dir);
    write_index(dir, "\"a\":\"" S1 "\",\"b\":\"" S2 "\"");
    expect_open(dir, ERR_ST_HEADER, "tensor c", "not listed", NULL);

    dir = case_dir("shard_lacks_indexed");
    write_shards(dir);
    write_index(dir, "\"a\":\"" S1 "\",\"b\":\"" S2 "\",\"c\":\"" S2 "\",\"d\":\"" S2 "\"");
    expect_open(dir, ERR_ST_MISSING, "tensor d", S2, NULL);

    dir = case_dir("index_not_json");
    write_shards(dir);
    write_bytes(dir, "model.safetensors.index.json", "{\"weight_map\":", 14);
    expect_open(dir, ERR_ST_HEADER, "model.safetensors.index.json", "not valid JSON", NULL);

    dir = case_dir("index_no_map");
    write_shards(dir);
    write_bytes(dir, "model.safetensors.index.json", "{\"metadata\":{}}", 15);
    expect_open(dir, ERR_ST_HEADER, "weight_map", NULL);

    dir = case_dir("index_path_escape");
    write_shards(dir);
    write_index(dir, "\"a\":\"../" S1 "\"");
    expect_open(dir, ERR_ST_HEADER, "weight_map.a", NULL);

    /* A broken shard reports as itself. */
    dir = case_dir("shard_truncated");
    write_st(dir, S1, shard1, good_data, 24);
    write_st(dir, S2, shard2, good_data + 24, 10);
    write_index(dir, "\"a\":\"" S1 "\",\"b\":\"" S2 "\",\"c\":\"" S2 "\"");
    expect_open(dir, ERR_ST_TRUNCATED, S2, "tensor c", "6 bytes missing", NULL);
}

// ------------------------------------------------------------------------------------------------
// U8: a quantized matrix's bytes, [rows, row_bytes], bound like the others

static void test_u8(void) {
    const char *dir = case_dir("u8");
    /* q: U8 (2, 20) = two Q4_1 rows of 32 weights; n: F16 (4) */
    static unsigned char data[48];
    for (int i = 0; i < 48; i++) data[i] = (unsigned char)(0xF0 + i); /* F16 0x7CFx would be NaN */
    write_st(dir, "model.safetensors",
             "{\"q\":{\"dtype\":\"U8\",\"shape\":[2,20],\"data_offsets\":[0,40]},"
             "\"n\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[40,48]}}",
             data, 48);
    const st_tensor_spec specs[2] = {{"q", DT_U8, 2, {2, 20}}, {"n", DT_F16, 1, {4}}};
    st_model *m = NULL;
    err_code rc = st_model_open(&m, dir);
    CHECK(rc == ERR_OK, "u8: open: %s: %s", err_name(rc), err_detail());
    if (rc) return;
    const void *ptrs[2] = {0};
    rc = st_model_bind(m, specs, 2, ptrs, NULL);
    CHECK(rc == ERR_OK && ptrs[0] && memcmp(ptrs[0], data, 40) == 0, "u8: bind: %s: %s", err_name(rc), err_detail());
    /* bytes are never NaN: the U8 tensor is skipped, the F16 one (0x1F18...) is finite */
    rc = st_check_finite(specs, ptrs, 2);
    CHECK(rc == ERR_OK, "u8: check_finite: %s: %s", err_name(rc), err_detail());
    st_model_close(m);
    CHECK(strcmp(st_dtype_name(DT_U8), "U8") == 0 && st_dtype_size(DT_U8) == 1, "u8: name/size");
    /* a quantized spec against a dense file, and a row of other bytes, are named */
    const st_tensor_spec want_u8[2] = {{"q", DT_U8, 2, {2, 20}}, {"n", DT_U8, 2, {4, 2}}};
    expect_bind(dir, want_u8, 2, NULL, ERR_ST_DTYPE, "n", "dtype F16, expected U8", NULL);
    const st_tensor_spec other_rows[2] = {{"q", DT_U8, 2, {2, 34}}, {"n", DT_F16, 1, {4}}};
    expect_bind(dir, other_rows, 2, NULL, ERR_ST_SHAPE, "q", "[2, 34]", NULL);
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/ingot_test_st_XXXXXX");
    if (!mkdtemp(root)) {
        printf("mkdtemp failed\n");
        return 1;
    }
    for (int i = 0; i < GOOD_BYTES; i++) good_data[i] = (unsigned char)(37 * i + 11);

    test_good();
    test_file_defects();
    test_bind_defects();
    test_sharded();
    test_u8();

    cleanup();
    return check_summary();
}
