/* bundle.c - an appliance's files, mapped from its own executable and checked (bundle.h). */
#include "bundle.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define HASH_MUL_INDEX 0x9E3779B97F4A7C15ull
#define HASH_MUL_WORD 0xBF58476D1CE4E5B9ull

typedef struct {
    char name[BUNDLE_NAME_BYTES + 1];
    const unsigned char *data;
    size_t size;
} bundle_file;

static struct {
    char dir[4096];
    size_t dir_len;
    const unsigned char *map; /* the whole executable */
    size_t map_size;
    bundle_file files[BUNDLE_MAX_FILES];
    int n_files;
} B;

/* codegen/appliance.py turns the 0 into a 1 in the appliance it writes: an appliance whose trailer
 * is gone (a truncated copy) is refused instead of looking for its model on the disk. */
static volatile const char bundle_mark[] = "INGOT-BUNDLE-EXPECTED:0";

static uint64_t le64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static uint32_t le32(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

uint64_t bundle_hash(const void *data, size_t size) {
    const unsigned char *p = data;
    size_t n_words = size / 8;
    uint64_t h = 0;
#pragma omp parallel for reduction(+ : h) schedule(static)
    for (size_t i = 0; i < n_words; i++) h += (le64(p + 8 * i) ^ (uint64_t)i * HASH_MUL_INDEX) * HASH_MUL_WORD;
    if (size % 8) {
        unsigned char last[8] = {0};
        memcpy(last, p + 8 * n_words, size % 8);
        h += (le64(last) ^ (uint64_t)n_words * HASH_MUL_INDEX) * HASH_MUL_WORD;
    }
    return h ^ (uint64_t)size;
}

static err_code damaged(const char *what) {
    return err_set(ERR_IO, "%s: the model it carries is damaged: %s (copy the whole file again, or rebuild it with make appliance)",
                   B.dir, what);
}

/* Checks the trailer, table and files of the mapped executable. */
static err_code check(void) {
    const unsigned char *t = B.map + B.map_size - BUNDLE_TRAILER_BYTES;
    uint32_t version = le32(t + 8), n = le32(t + 12);
    uint64_t table = le64(t + 16), table_hash = le64(t + 24);
    char what[256];
    if (version != BUNDLE_VERSION) {
        snprintf(what, sizeof what, "bundle version %u, this program reads %d", version, BUNDLE_VERSION);
        return damaged(what);
    }
    uint64_t table_bytes = (uint64_t)n * BUNDLE_ENTRY_BYTES, end = B.map_size - BUNDLE_TRAILER_BYTES;
    if (n == 0 || n > BUNDLE_MAX_FILES || table > end || end - table != table_bytes) return damaged("its table of files is out of bounds");
    if (bundle_hash(B.map + table, table_bytes) != table_hash) return damaged("its table of files does not match its hash");
    for (uint32_t i = 0; i < n; i++) {
        const unsigned char *e = B.map + table + (size_t)i * BUNDLE_ENTRY_BYTES;
        bundle_file *f = &B.files[i];
        memcpy(f->name, e, BUNDLE_NAME_BYTES);
        f->name[BUNDLE_NAME_BYTES] = '\0';
        uint64_t off = le64(e + 64), size = le64(e + 72), hash = le64(e + 80);
        if (!f->name[0] || strchr(f->name, '/')) return damaged("a file name in its table is empty or holds '/'");
        if (off % 4096 || off > table || size > table - off) {
            snprintf(what, sizeof what, "%s lies outside the executable", f->name);
            return damaged(what);
        }
        f->data = B.map + off;
        f->size = (size_t)size;
        if (bundle_hash(f->data, f->size) != hash) {
            snprintf(what, sizeof what, "%s (%llu bytes) does not match its hash", f->name, (unsigned long long)size);
            return damaged(what);
        }
    }
    B.n_files = (int)n;
    return ERR_OK;
}

err_code bundle_open(const char *exe_path, int *found) {
    *found = 0;
    char path[4096];
    ssize_t len = readlink("/proc/self/exe", path, sizeof path - 1);
    if (len > 0) path[len] = '\0';
    else snprintf(path, sizeof path, "%s", exe_path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ERR_OK; /* cannot read itself: no bundle to find, the files must be given */
    struct stat st;
    unsigned char tail[BUNDLE_TRAILER_BYTES];
    if (fstat(fd, &st) != 0 || st.st_size < BUNDLE_TRAILER_BYTES ||
        pread(fd, tail, sizeof tail, st.st_size - BUNDLE_TRAILER_BYTES) != (ssize_t)sizeof tail ||
        memcmp(tail, BUNDLE_MAGIC, 8) != 0) {
        close(fd);
        if (bundle_mark[sizeof bundle_mark - 2] == '1')
            return err_set(ERR_IO, "%s: an appliance without the model it should carry at its end (a truncated copy?); "
                                   "copy the whole file again, or rebuild it with make appliance", path);
        return ERR_OK;
    }
    snprintf(B.dir, sizeof B.dir, "%s", path);
    B.dir_len = strlen(B.dir);
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return err_set(ERR_IO, "%s: mmap: %s", path, strerror(e));
    B.map = map;
    B.map_size = (size_t)st.st_size;
    err_code rc = check();
    if (rc) {
        munmap(map, B.map_size);
        B.map = NULL;
        return rc;
    }
    *found = 1;
    return ERR_OK;
}

const char *bundle_dir(void) { return B.map ? B.dir : NULL; }

int bundle_find(const char *path, const void **data, size_t *size) {
    if (!B.map || strncmp(path, B.dir, B.dir_len) != 0 || path[B.dir_len] != '/') return 0;
    const char *name = path + B.dir_len + 1;
    for (int i = 0; i < B.n_files; i++)
        if (strcmp(B.files[i].name, name) == 0) {
            *data = B.files[i].data;
            *size = B.files[i].size;
            return 1;
        }
    errno = ENOENT;
    return -1;
}
