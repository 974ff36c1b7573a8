/* fuzz_common.h - what the libFuzzer targets under tests/fuzz/ share: a private scratch directory
 * (the parsers under test read model directories, so each input is written to a file there). */
#ifndef INGOT_FUZZ_COMMON_H
#define INGOT_FUZZ_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char fuzz_dir_path[64];

/* Removes the scratch directory and the files the targets write there, at exit. */
static void fuzz_cleanup(void) {
    static const char *const names[] = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                                        "generation_config.json"};
    char path[256];
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        snprintf(path, sizeof path, "%s/%s", fuzz_dir_path, names[i]);
        unlink(path);
    }
    rmdir(fuzz_dir_path);
}

/* The scratch directory, made once per process. */
static const char *fuzz_dir(void) {
    char *dir = fuzz_dir_path;
    if (!dir[0]) {
        /* /dev/shm: a file write per input, in memory (an order of magnitude more inputs a second) */
        snprintf(dir, sizeof fuzz_dir_path, "%s/ingot_fuzz_XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
        if (!mkdtemp(dir)) abort();
        atexit(fuzz_cleanup);
    }
    return dir;
}

/* Writes bytes to fuzz_dir()/name. */
static void fuzz_write(const char *name, const uint8_t *data, size_t size) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", fuzz_dir(), name);
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) abort();
}

/* The part of data[0..size) before the first "\n@@\n", and the rest after it (or empty). */
static void fuzz_split(const uint8_t *data, size_t size, size_t *first, const uint8_t **rest, size_t *rest_size) {
    for (size_t i = 0; i + 4 <= size; i++)
        if (memcmp(data + i, "\n@@\n", 4) == 0) {
            *first = i;
            *rest = data + i + 4;
            *rest_size = size - i - 4;
            return;
        }
    *first = size;
    *rest = data + size;
    *rest_size = 0;
}

/* Every error message must be one printable line (errors.c escapes what it quotes). */
static void fuzz_check_detail(const char *detail) {
    for (const unsigned char *p = (const unsigned char *)detail; *p; p++)
        if (*p < 0x20 || *p == 0x7F) abort();
}

#endif
