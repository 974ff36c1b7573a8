/* safetensors.c - maps safetensors files and validates them completely at load (see safetensors.h).
 *
 * A file is: 8 bytes little-endian header length N, N bytes of JSON, then the data section. The
 * JSON maps each tensor name to {dtype, shape, data_offsets: [begin, end]}, offsets relative to
 * the data section. As the reference implementation (huggingface/safetensors) requires, the
 * tensors must tile the data section exactly: sorted by offset they start at 0, each begins where
 * the previous ends, and the last ends at the end of the file. That rules out overlaps, holes and
 * trailing bytes, and makes truncation easy to tell apart from corruption: a well-formed layout
 * that runs past the end of the file is a short file (ERR_ST_TRUNCATED); anything else wrong with
 * the offsets is ERR_ST_OFFSETS.
 *
 * Every tensor of every file lands in one array sorted by name, so st_model_bind() finds each
 * spec by binary search and the extra-tensor check is one pass: O(n log n) for n tensors. Names
 * point into each file's parsed header, which lives as long as the model. */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bundle.h"
#include "files.h"
#include "json.h"

#define ST_HEADER_MAX ((uint64_t)100 << 20) /* bytes; real headers are at most a few MB */
#define ST_FILE_MAX_DIMS 8                  /* what a file may hold; specs use ST_MAX_DIMS */
#define ST_INDEX_NAME "model.safetensors.index.json"
#define ST_SINGLE_NAME "model.safetensors"

// ------------------------------------------------------------------------------------------------
// dtypes

/* Every fixed-width dtype safetensors defines. Those ingot cannot use still get their size, so a
 * file holding, say, an I64 position_ids buffer validates, and bind names the dtype if the model
 * needs that tensor (ERR_ST_DTYPE) or does not (ERR_ST_EXTRA, unless ignored). */
typedef struct {
    const char *name;
    size_t size; /* bytes per element */
    int dt;      /* the st_dtype, or -1 if ingot cannot use it */
} dtype_info;

static const dtype_info dtypes[] = {
    {"F32", 4, DT_F32},   {"F16", 2, DT_F16},  {"BF16", 2, DT_BF16}, {"F64", 8, -1},
    {"I64", 8, -1},       {"U64", 8, -1},      {"I32", 4, -1},       {"U32", 4, -1},
    {"I16", 2, -1},       {"U16", 2, -1},      {"I8", 1, -1},        {"U8", 1, DT_U8},
    {"BOOL", 1, -1},      {"F8_E4M3", 1, -1},  {"F8_E5M2", 1, -1},   {"F8_E8M0", 1, -1},
};

const char *st_dtype_name(st_dtype dt) {
    switch (dt) {
    case DT_F32: return "F32";
    case DT_F16: return "F16";
    case DT_BF16: return "BF16";
    case DT_U8: return "U8";
    }
    return "?";
}

size_t st_dtype_size(st_dtype dt) {
    switch (dt) {
    case DT_F32: return 4;
    case DT_F16: return 2;
    case DT_BF16: return 2;
    case DT_U8: return 1;
    }
    return 0;
}

static const dtype_info *dtype_find(const char *name) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++) {
        if (strcmp(dtypes[i].name, name) == 0) return &dtypes[i];
    }
    return NULL;
}

// ------------------------------------------------------------------------------------------------
// the model

typedef struct {
    char *path;                /* dir/name, as errors print it */
    const char *name;          /* the file name within dir, as the index names it */
    unsigned char *map;        /* the whole file, read-only */
    int bundled;               /* map is inside the executable (an appliance's, bundle.h): not unmapped */
    size_t size;               /* bytes */
    uint64_t header_len;       /* N: bytes of JSON after the 8-byte length */
    const unsigned char *data; /* map + 8 + N */
    size_t data_size;          /* bytes after the header */
    json_doc doc;              /* the header; tensor names point into it */
} st_file;

typedef struct {
    const char *name;
    const dtype_info *dtype;
    int ndim;
    int64_t shape[ST_FILE_MAX_DIMS];
    uint64_t begin, end; /* bytes, relative to the data section */
    int file;            /* index into st_model.files */
} st_entry;

struct st_model {
    char *source; /* the file that lists the tensors: model.safetensors or the index */
    st_file files[ST_MAX_SHARDS];
    int n_files;
    st_entry *entries; /* (n_entries), sorted by name once every file is read */
    int n_entries, cap_entries;
    size_t data_bytes;
};

static char *path_join(const char *dir, const char *name) {
    size_t nd = strlen(dir), nn = strlen(name);
    while (nd > 1 && dir[nd - 1] == '/') nd--;
    char *p = malloc(nd + 1 + nn + 1);
    if (!p) return NULL;
    memcpy(p, dir, nd);
    p[nd] = '/';
    memcpy(p + nd + 1, name, nn + 1);
    return p;
}

static void fmt_shape(char *buf, size_t cap, const int64_t *shape, int ndim) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && n < cap; d++) {
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", d ? ", " : "", (long long)shape[d]);
    }
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

static int entry_cmp_name(const void *a, const void *b) {
    return strcmp(((const st_entry *)a)->name, ((const st_entry *)b)->name);
}

static int entry_cmp_offset(const void *a, const void *b) {
    const st_entry *x = *(const st_entry *const *)a, *y = *(const st_entry *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static const st_entry *entry_find(const st_model *m, const char *name) {
    if (m->n_entries == 0) return NULL;
    st_entry key = {.name = name};
    return bsearch(&key, m->entries, (size_t)m->n_entries, sizeof key, entry_cmp_name);
}

// ------------------------------------------------------------------------------------------------
// one file: map, parse the header, check every entry and the layout of the data section

/* A JSON number that is an integer in [0, 2^53): exact as a double, and every size we can map. */
static int json_uint(const json_value *v, uint64_t *out) {
    if (!json_is_int(v) || v->num < 0) return 0;
    *out = (uint64_t)v->num;
    return 1;
}

static err_code parse_entry(st_model *m, int fi, const json_value *t) {
    const st_file *f = &m->files[fi];
    const char *name = t->key;
    if ((size_t)t->key_len != strlen(name) || t->key_len == 0) {
        return err_set(ERR_ST_HEADER, "%s: a tensor name is empty or holds a NUL byte", f->path);
    }
    if (t->type != JSON_OBJECT) {
        return err_set(ERR_ST_HEADER, "%s: tensor %s: entry is not an object", f->path, name);
    }
    const json_value *dtype = json_get(t, "dtype"), *shape = json_get(t, "shape");
    const json_value *offsets = json_get(t, "data_offsets");
    if (!dtype || dtype->type != JSON_STRING) {
        return err_set(ERR_ST_HEADER, "%s: tensor %s: \"dtype\" missing or not a string", f->path, name);
    }
    if (!shape || shape->type != JSON_ARRAY) {
        return err_set(ERR_ST_HEADER, "%s: tensor %s: \"shape\" missing or not an array", f->path, name);
    }
    if (!offsets || offsets->type != JSON_ARRAY || offsets->n != 2) {
        return err_set(ERR_ST_HEADER, "%s: tensor %s: \"data_offsets\" missing or not [begin, end]",
                       f->path, name);
    }

    st_entry e = {.name = name, .file = fi};
    e.dtype = dtype_find(dtype->str);
    if (!e.dtype) {
        return err_set(ERR_ST_HEADER, "%s: tensor %s: unknown dtype \"%s\"", f->path, name, dtype->str);
    }
    if (shape->n > ST_FILE_MAX_DIMS) {
        return err_set(ERR_ST_HEADER, "%s: tensor %s: %d dimensions, at most %d supported", f->path,
                       name, shape->n, ST_FILE_MAX_DIMS);
    }
    /* Element count, refusing overflow: every dim < 2^53 and the product checked step by step. */
    uint64_t numel = 1;
    int overflow = 0;
    json_for_each(d, shape) {
        uint64_t dim;
        if (!json_uint(d, &dim)) {
            return err_set(ERR_ST_HEADER, "%s: tensor %s: shape holds a value that is not a "
                           "non-negative integer", f->path, name);
        }
        e.shape[e.ndim++] = (int64_t)dim;
        if (dim && numel > UINT64_MAX / dim) overflow = 1;
        else numel *= dim;
    }
    if (overflow || numel > UINT64_MAX / e.dtype->size) {
        return err_set(ERR_ST_HEADER, "%s: tensor %s: shape too large", f->path, name);
    }
    uint64_t nbytes = numel * e.dtype->size;

    const json_value *b = offsets->child, *en = b->next;
    if (!json_is_int(b) || !json_is_int(en)) {
        return err_set(ERR_ST_HEADER, "%s: tensor %s: data_offsets are not integers", f->path, name);
    }
    if (b->num < 0 || en->num < 0 || b->num > en->num) {
        return err_set(ERR_ST_OFFSETS, "%s: tensor %s: data_offsets [%.0f, %.0f] out of range "
                       "(need 0 <= begin <= end)", f->path, name, b->num, en->num);
    }
    json_uint(b, &e.begin);
    json_uint(en, &e.end);
    if (e.end - e.begin != nbytes) {
        char s[128];
        fmt_shape(s, sizeof s, e.shape, e.ndim);
        return err_set(ERR_ST_OFFSETS, "%s: tensor %s: data_offsets [%llu, %llu] span %llu bytes, "
                       "but dtype %s shape %s needs %llu", f->path, name,
                       (unsigned long long)e.begin, (unsigned long long)e.end,
                       (unsigned long long)(e.end - e.begin), e.dtype->name, s,
                       (unsigned long long)nbytes);
    }

    if (m->n_entries == m->cap_entries) {
        int cap = m->cap_entries ? 2 * m->cap_entries : 512;
        st_entry *p = realloc(m->entries, (size_t)cap * sizeof *p);
        if (!p) return err_set(ERR_NOMEM, "%s: %d tensor entries", f->path, cap);
        m->entries = p;
        m->cap_entries = cap;
    }
    m->entries[m->n_entries++] = e;
    return ERR_OK;
}

/* The entries [first, m->n_entries) of file fi must tile its data section exactly. */
static err_code check_layout(st_model *m, int fi, int first) {
    const st_file *f = &m->files[fi];
    int n = m->n_entries - first;
    const st_entry **order = malloc((size_t)(n ? n : 1) * sizeof *order);
    if (!order) return err_set(ERR_NOMEM, "%s: %d tensors", f->path, n);
    for (int i = 0; i < n; i++) order[i] = &m->entries[first + i];
    if (n) qsort(order, (size_t)n, sizeof *order, entry_cmp_offset);

    err_code rc = ERR_OK;
    uint64_t pos = 0; /* bytes of the data section described so far */
    for (int i = 0; i < n && !rc; i++) {
        const st_entry *e = order[i];
        if (e->begin < pos) {
            rc = err_set(ERR_ST_OFFSETS, "%s: tensor %s: data_offsets [%llu, %llu] overlap tensor "
                         "%s, which ends at byte %llu", f->path, e->name,
                         (unsigned long long)e->begin, (unsigned long long)e->end,
                         order[i - 1]->name, (unsigned long long)pos);
        } else if (e->begin > pos) {
            rc = err_set(ERR_ST_OFFSETS, "%s: tensor %s: data_offsets [%llu, %llu] out of range: "
                         "bytes [%llu, %llu) of the data section (%zu bytes) belong to no tensor",
                         f->path, e->name, (unsigned long long)e->begin,
                         (unsigned long long)e->end, (unsigned long long)pos,
                         (unsigned long long)e->begin, f->data_size);
        }
        pos = e->end;
    }
    if (!rc && pos > f->data_size) {
        const st_entry *cut = NULL;
        for (int i = 0; i < n && !cut; i++) {
            if (order[i]->end > f->data_size) cut = order[i];
        }
        rc = err_set(ERR_ST_TRUNCATED, "%s: tensor %s ends at data byte %llu, but the file holds "
                     "only %zu bytes of data (%llu bytes missing)", f->path, cut->name,
                     (unsigned long long)cut->end, f->data_size,
                     (unsigned long long)(pos - f->data_size));
    } else if (!rc && pos < f->data_size) {
        rc = err_set(ERR_ST_OFFSETS, "%s: %llu bytes after the last tensor belong to no tensor "
                     "(header describes %llu bytes of data, file holds %zu)", f->path,
                     (unsigned long long)(f->data_size - pos), (unsigned long long)pos,
                     f->data_size);
    }
    free(order);
    return rc;
}

static err_code file_open(st_model *m, const char *dir, const char *name) {
    if (m->n_files == ST_MAX_SHARDS) {
        return err_set(ERR_ST_HEADER, "%s: more than %d shards", dir, ST_MAX_SHARDS);
    }
    st_file *f = &m->files[m->n_files];
    memset(f, 0, sizeof *f);
    f->path = path_join(dir, name);
    if (!f->path) return err_set(ERR_NOMEM, "%s/%s: path", dir, name);
    f->name = f->path + strlen(f->path) - strlen(name);
    m->n_files++; /* from here on st_model_close() releases f */

    const void *bundled;
    int in_bundle = bundle_find(f->path, &bundled, &f->size);
    if (in_bundle < 0) return err_set(ERR_IO, "%s: %s", f->path, strerror(ENOENT));
    if (in_bundle) {
        f->map = (unsigned char *)bundled;
        f->bundled = 1;
        if (f->size < 8) return err_set(ERR_ST_TRUNCATED, "%s: %zu bytes, shorter than the 8-byte header length", f->path, f->size);
    } else {
        int fd;
        err_code orc = file_open_regular(f->path, UINT64_MAX, &fd, &f->size);
        if (orc) return orc;
        if (f->size < 8) {
            close(fd);
            return err_set(ERR_ST_TRUNCATED, "%s: %zu bytes, shorter than the 8-byte header length",
                           f->path, f->size);
        }
        void *map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        int map_errno = errno;
        close(fd); /* the mapping keeps the file */
        if (map == MAP_FAILED) return err_set(ERR_IO, "%s: mmap: %s", f->path, strerror(map_errno));
        f->map = map;
        madvise(f->map, f->size, MADV_WILLNEED); /* a hint: readahead while the header is checked */
    }

    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | f->map[i]; /* little-endian on every host */
    f->header_len = n;
    if (n > ST_HEADER_MAX) {
        return err_set(ERR_ST_HEADER, "%s: header length %llu bytes exceeds the %llu-byte limit "
                       "(not a safetensors file?)", f->path, (unsigned long long)n,
                       (unsigned long long)ST_HEADER_MAX);
    }
    if (n > f->size - 8) {
        return err_set(ERR_ST_TRUNCATED, "%s: header length %llu bytes, but only %zu bytes follow "
                       "the length", f->path, (unsigned long long)n, f->size - 8);
    }
    f->data = f->map + 8 + n;
    f->data_size = f->size - 8 - (size_t)n;

    if (json_parse((const char *)f->map + 8, (size_t)n, &f->doc) != ERR_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", err_detail()); /* err_set overwrites the detail */
        return err_set(ERR_ST_HEADER, "%s: header is not valid JSON: %s", f->path, why);
    }
    const json_value *root = f->doc.root;
    if (root->type != JSON_OBJECT) {
        return err_set(ERR_ST_HEADER, "%s: header is not a JSON object", f->path);
    }
    int first = m->n_entries;
    json_for_each(t, root) {
        if (strcmp(t->key, "__metadata__") == 0) {
            if (t->type != JSON_OBJECT) {
                return err_set(ERR_ST_HEADER, "%s: __metadata__ is not an object", f->path);
            }
            json_for_each(v, t) {
                if (v->type != JSON_STRING) {
                    return err_set(ERR_ST_HEADER, "%s: __metadata__.%s is not a string", f->path,
                                   v->key);
                }
            }
            continue;
        }
        err_code rc = parse_entry(m, m->n_files - 1, t);
        if (rc) return rc;
    }
    err_code rc = check_layout(m, m->n_files - 1, first);
    if (rc) return rc;
    m->data_bytes += f->data_size;
    return ERR_OK;
}

/* Sorts every file's entries into one table by name; a name may appear once across all files. */
static err_code index_entries(st_model *m) {
    if (m->n_entries == 0) return ERR_OK;
    qsort(m->entries, (size_t)m->n_entries, sizeof *m->entries, entry_cmp_name);
    for (int i = 1; i < m->n_entries; i++) {
        const st_entry *a = &m->entries[i - 1], *b = &m->entries[i];
        if (strcmp(a->name, b->name) != 0) continue;
        if (a->file == b->file) {
            return err_set(ERR_ST_HEADER, "%s: tensor %s appears twice in the header",
                           m->files[a->file].path, a->name);
        }
        return err_set(ERR_ST_HEADER, "%s: tensor %s is also in %s", m->files[b->file].path,
                       b->name, m->files[a->file].path);
    }
    return ERR_OK;
}

// ------------------------------------------------------------------------------------------------
// sharded models: model.safetensors.index.json

typedef struct {
    const char *tensor, *shard;
} index_item;

static int item_cmp_tensor(const void *a, const void *b) {
    return strcmp(((const index_item *)a)->tensor, ((const index_item *)b)->tensor);
}

static int str_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Reads a small file (the index: tens of KB) whole into a malloc'd buffer: an appliance's own, or a
 * regular file of at most ST_HEADER_MAX bytes. */
static err_code read_whole(const char *path, char **out, size_t *len) {
    const void *bundled;
    size_t bundled_size;
    int in_bundle = bundle_find(path, &bundled, &bundled_size);
    if (in_bundle < 0) return err_set(ERR_IO, "%s: %s", path, strerror(ENOENT));
    if (in_bundle) {
        if (bundled_size > ST_HEADER_MAX)
            return err_set(ERR_ST_HEADER, "%s: %zu bytes, more than the %llu-byte limit", path, bundled_size, (unsigned long long)ST_HEADER_MAX);
        if (!(*out = malloc(bundled_size + 1))) return err_set(ERR_NOMEM, "%s: %zu bytes", path, bundled_size);
        memcpy(*out, bundled, bundled_size);
        (*out)[bundled_size] = 0;
        *len = bundled_size;
        return ERR_OK;
    }
    return file_read_regular(path, ST_HEADER_MAX, out, len);
}

/* Opens every shard the index names and checks that the index and the shards agree exactly:
 * each tensor sits in the shard the index says, and each indexed tensor exists. */
static err_code open_sharded(st_model *m, const char *dir) {
    char *text = NULL;
    size_t len = 0;
    json_doc doc = {0};
    index_item *items = NULL;
    const char **shards = NULL;
    err_code rc = read_whole(m->source, &text, &len);
    if (rc) return rc;
    if (json_parse(text, len, &doc) != ERR_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", err_detail());
        free(text);
        return err_set(ERR_ST_HEADER, "%s: not valid JSON: %s", m->source, why);
    }
    free(text);
    const json_value *map = json_get(doc.root, "weight_map");
    int n = map && map->type == JSON_OBJECT ? map->n : 0;
    if (!map || map->type != JSON_OBJECT) {
        rc = err_set(ERR_ST_HEADER, "%s: \"weight_map\" missing or not an object", m->source);
        goto done;
    }
    items = malloc((size_t)(n ? n : 1) * sizeof *items);
    shards = malloc((size_t)(n ? n : 1) * sizeof *shards);
    if (!items || !shards) { rc = err_set(ERR_NOMEM, "%s: %d entries", m->source, n); goto done; }
    int i = 0;
    json_for_each(v, map) {
        if (v->type != JSON_STRING || v->n == 0 || (size_t)v->n != strlen(v->str) ||
            strchr(v->str, '/') || strcmp(v->str, ".") == 0 || strcmp(v->str, "..") == 0) {
            rc = err_set(ERR_ST_HEADER, "%s: weight_map.%s is not a file name in %s", m->source,
                         v->key, dir);
            goto done;
        }
        items[i] = (index_item){v->key, v->str};
        shards[i++] = v->str;
    }
    if (n) qsort(items, (size_t)n, sizeof *items, item_cmp_tensor);
    for (i = 1; i < n; i++) {
        if (strcmp(items[i - 1].tensor, items[i].tensor) == 0) {
            rc = err_set(ERR_ST_HEADER, "%s: weight_map lists %s twice", m->source, items[i].tensor);
            goto done;
        }
    }
    if (n) qsort(shards, (size_t)n, sizeof *shards, str_cmp);
    for (i = 0; i < n; i++) {
        if (i > 0 && strcmp(shards[i - 1], shards[i]) == 0) continue;
        if ((rc = file_open(m, dir, shards[i]))) {
            if (rc == ERR_IO) {
                char why[256];
                snprintf(why, sizeof why, "%s", err_detail());
                rc = err_set(ERR_IO, "%s (a shard listed in %s)", why, m->source);
            }
            goto done;
        }
    }

    if ((rc = index_entries(m))) goto done;
    for (i = 0; i < m->n_entries; i++) {
        const st_entry *e = &m->entries[i];
        const char *file = m->files[e->file].path;
        index_item key = {.tensor = e->name};
        const index_item *it = n ? bsearch(&key, items, (size_t)n, sizeof key, item_cmp_tensor) : NULL;
        if (!it) {
            rc = err_set(ERR_ST_HEADER, "%s: tensor %s is not listed in %s", file, e->name, m->source);
            goto done;
        }
        if (strcmp(it->shard, m->files[e->file].name) != 0) {
            rc = err_set(ERR_ST_HEADER, "%s: tensor %s is in this shard, but %s puts it in %s", file,
                         e->name, m->source, it->shard);
            goto done;
        }
    }
    for (i = 0; i < n; i++) {
        if (!entry_find(m, items[i].tensor)) {
            rc = err_set(ERR_ST_MISSING, "%s: lists tensor %s in %s, which does not hold it",
                         m->source, items[i].tensor, items[i].shard);
            goto done;
        }
    }
done:
    free(items);
    free(shards);
    json_free(&doc);
    return rc;
}

// ------------------------------------------------------------------------------------------------
// the interface

/* On disk, or in the executable's bundle. */
static int file_exists(const char *path) {
    const void *data;
    size_t size;
    int in_bundle = bundle_find(path, &data, &size);
    return in_bundle ? in_bundle > 0 : access(path, F_OK) == 0;
}

err_code st_model_open(st_model **out, const char *dir) {
    *out = NULL;
    st_model *m = calloc(1, sizeof *m);
    if (!m) return err_set(ERR_NOMEM, "st_model");
    err_code rc = ERR_OK;
    char *single = path_join(dir, ST_SINGLE_NAME);
    m->source = path_join(dir, ST_INDEX_NAME);
    if (!single || !m->source) {
        rc = err_set(ERR_NOMEM, "%s: path", dir);
    } else if (file_exists(single) || !file_exists(m->source)) {
        /* model.safetensors wins when both exist, as in transformers; when neither does, opening
         * it gives the error that names the file people expect. */
        free(m->source);
        m->source = single;
        single = NULL;
        rc = file_open(m, dir, ST_SINGLE_NAME);
        if (!rc) rc = index_entries(m);
    } else {
        rc = open_sharded(m, dir);
    }
    free(single);
    if (rc) {
        st_model_close(m);
        return rc;
    }
    *out = m;
    return ERR_OK;
}

err_code st_model_bind(const st_model *m, const st_tensor_spec *specs, int n, const void **data,
                       int (*ignore)(const char *name)) {
    unsigned char *used = calloc((size_t)(m->n_entries ? m->n_entries : 1), 1);
    if (!used) return err_set(ERR_NOMEM, "%s: %d tensors", m->source, m->n_entries);
    err_code rc = ERR_OK;
    for (int i = 0; i < n && !rc; i++) {
        const st_tensor_spec *s = &specs[i];
        if (s->ndim < 0 || s->ndim > ST_MAX_DIMS || st_dtype_size(s->dtype) == 0) {
            rc = err_set(ERR_ARG, "tensor spec %s: ndim %d (0..%d) or dtype %d invalid", s->name,
                         s->ndim, ST_MAX_DIMS, (int)s->dtype);
            break;
        }
        const st_entry *e = entry_find(m, s->name);
        if (!e) {
            rc = err_set(ERR_ST_MISSING, "%s: %s: not found", m->source, s->name);
            break;
        }
        const st_file *f = &m->files[e->file];
        char got[160], want[160];
        fmt_shape(got, sizeof got, e->shape, e->ndim);
        fmt_shape(want, sizeof want, s->shape, s->ndim);
        int shape_ok = e->ndim == s->ndim &&
                       memcmp(e->shape, s->shape, (size_t)s->ndim * sizeof *s->shape) == 0;
        if (e->dtype->dt != (int)s->dtype) {
            rc = err_set(ERR_ST_DTYPE, "%s: %s: dtype %s, expected %s%s%s%s%s", f->path, s->name,
                         e->dtype->name, st_dtype_name(s->dtype), shape_ok ? "" : "; also shape ",
                         shape_ok ? "" : got, shape_ok ? "" : ", expected ", shape_ok ? "" : want);
            break;
        }
        if (!shape_ok) {
            rc = err_set(ERR_ST_SHAPE, "%s: %s: shape %s, expected %s", f->path, s->name, got, want);
            break;
        }
        /* The mapping is page-aligned, so a pointer's alignment is its file offset's. Safetensors
         * writers pad the header to 8 bytes and order tensors by alignment; a file that does not
         * would make the kernels' wide loads fault or slow down. */
        uint64_t at = 8 + f->header_len + e->begin;
        if (at % e->dtype->size) {
            rc = err_set(ERR_ST_OFFSETS, "%s: %s: data at file byte %llu is not %zu-byte aligned "
                         "as %s needs (header length %llu)", f->path, s->name,
                         (unsigned long long)at, e->dtype->size, e->dtype->name,
                         (unsigned long long)f->header_len);
            break;
        }
        data[i] = f->data + e->begin;
        used[e - m->entries] = 1;
    }
    for (int i = 0; i < m->n_entries && !rc; i++) {
        const st_entry *e = &m->entries[i];
        if (used[i] || (ignore && ignore(e->name))) continue;
        int more = 0;
        for (int j = i + 1; j < m->n_entries; j++) {
            more += !used[j] && !(ignore && ignore(m->entries[j].name));
        }
        char tail[48] = "";
        if (more) snprintf(tail, sizeof tail, " (and %d more)", more);
        rc = err_set(ERR_ST_EXTRA, "%s: %s (dtype %s): not a tensor of this model%s",
                     m->files[e->file].path, e->name, e->dtype->name, tail);
    }
    free(used);
    return rc;
}

/* Index of the first element of x[0..n) whose exponent bits are all ones (NaN or infinity), or n:
 * exp_mask is the dtype's exponent field. */
static size_t first_nonfinite16(const uint16_t *x, size_t n, uint16_t exp_mask) {
    for (size_t i = 0; i < n; i += 4096) { /* a block at a time: the loop the compiler vectorizes */
        size_t end = i + 4096 < n ? i + 4096 : n;
        int bad = 0;
        for (size_t k = i; k < end; k++) bad |= (x[k] & exp_mask) == exp_mask;
        if (bad)
            for (size_t k = i; k < end; k++)
                if ((x[k] & exp_mask) == exp_mask) return k;
    }
    return n;
}

static size_t first_nonfinite32(const uint32_t *x, size_t n) {
    for (size_t i = 0; i < n; i += 4096) {
        size_t end = i + 4096 < n ? i + 4096 : n;
        int bad = 0;
        for (size_t k = i; k < end; k++) bad |= (x[k] & 0x7F800000u) == 0x7F800000u;
        if (bad)
            for (size_t k = i; k < end; k++)
                if ((x[k] & 0x7F800000u) == 0x7F800000u) return k;
    }
    return n;
}

err_code st_check_finite(const st_tensor_spec *specs, const void *const *data, int n) {
    for (int t = 0; t < n; t++) {
        const st_tensor_spec *s = &specs[t];
        if (s->dtype == DT_U8) continue;
        size_t numel = 1;
        for (int d = 0; d < s->ndim; d++) numel *= (size_t)s->shape[d];
        size_t bad;
        int is_nan;
        if (s->dtype == DT_F32) {
            const uint32_t *x = data[t];
            bad = first_nonfinite32(x, numel);
            is_nan = bad < numel && (x[bad] & 0x007FFFFFu);
        } else {
            const uint16_t *x = data[t];
            uint16_t exp = s->dtype == DT_BF16 ? 0x7F80 : 0x7C00;
            bad = first_nonfinite16(x, numel, exp);
            is_nan = bad < numel && (x[bad] & (uint16_t)~(exp | 0x8000));
        }
        if (bad < numel) {
            char where[96];
            fmt_shape(where, sizeof where, s->shape, s->ndim);
            return err_set(ERR_ST_NONFINITE, "%s (%s %s): element %zu is %s", s->name, st_dtype_name(s->dtype), where, bad,
                           is_nan ? "NaN" : "infinite");
        }
    }
    return ERR_OK;
}

size_t st_model_data_bytes(const st_model *m) { return m->data_bytes; }

void st_model_close(st_model *m) {
    if (!m) return;
    for (int i = 0; i < m->n_files; i++) {
        st_file *f = &m->files[i];
        if (f->map && !f->bundled) munmap(f->map, f->size);
        json_free(&f->doc);
        free(f->path);
    }
    free(m->entries);
    free(m->source);
    free(m);
}
