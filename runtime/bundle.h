/* bundle.h - the model files an appliance carries inside its own executable (`make appliance`,
 * written by codegen/appliance.py).
 *
 * The files follow the program in the executable, each at an offset that is a multiple of 4096
 * (so the weights have the alignment a mapping of their own file would give them), then a table
 * of BUNDLE_ENTRY_BYTES a file and the trailer, the last BUNDLE_TRAILER_BYTES of the executable:
 *
 *   trailer: "INGOTAPP" | version u32 | n_files u32 | table offset u64 | table hash u64 | 32 bytes 0
 *   entry:   name, NUL-padded (64 bytes) | offset u64 | size u64 | hash u64 | 8 bytes 0
 *
 * (integers little-endian, offsets from the start of the executable). bundle_open maps the
 * executable and checks all of it: the trailer, the table, every file inside the executable and
 * its hash (bundle_hash), so a truncated or damaged copy is refused at start naming the file. The
 * files then appear under a directory named after the executable ("/path/to/app/config.json"):
 * the file readers (json_parse_file, st_model_open) ask bundle_find before the file system. */
#ifndef INGOT_BUNDLE_H
#define INGOT_BUNDLE_H

#include <stddef.h>
#include <stdint.h>

#include "errors.h"

#define BUNDLE_MAGIC "INGOTAPP"
#define BUNDLE_VERSION 1
#define BUNDLE_TRAILER_BYTES 64
#define BUNDLE_ENTRY_BYTES 96
#define BUNDLE_NAME_BYTES 64
#define BUNDLE_MAX_FILES 256

/* Looks for a bundle at the end of the executable (/proc/self/exe, else exe_path): *found = 0
 * when it carries none; else 1, the bundle mapped and checked. ERR_IO names what is wrong with a
 * bundle that is there but damaged. */
err_code bundle_open(const char *exe_path, int *found);

/* The directory the bundled files appear in (the executable's path), or NULL without a bundle. */
const char *bundle_dir(void);

/* 1 and the bytes of the bundled file path names ("<bundle_dir>/<name>"); -1 when path is in
 * the bundle's directory but no such file is bundled (ENOENT); 0 when path is not the bundle's. */
int bundle_find(const char *path, const void **data, size_t *size);

/* The files' check: sum over the 8-byte little-endian words w_i of the bytes (the last one padded
 * with zeros) of (w_i ^ i * 0x9E3779B97F4A7C15) * 0xBF58476D1CE4E5B9, modulo 2^64, xor the length.
 * Order-sensitive and one pass at memory speed; it catches damage, not tampering. */
uint64_t bundle_hash(const void *data, size_t size);

#endif
