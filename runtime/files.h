/* files.h - opening the files of a model directory as untrusted input.
 *
 * Everything ingot reads from a model directory goes through here: the file is opened without
 * blocking (a FIFO in place of config.json must not hang the program), checked to be a regular file
 * (not a FIFO, a device such as /dev/zero behind a link, a directory or a socket), and its size
 * checked against a limit before a byte is read or allocated. Errors are ERR_IO naming the path
 * and what it is instead. */
#ifndef INGOT_FILES_H
#define INGOT_FILES_H

#include <stddef.h>
#include <stdint.h>

#include "errors.h"

/* The most bytes a JSON file of a model directory may hold (config.json, tokenizer.json, ...): the
 * largest real tokenizer.json is tens of MB. */
#define FILE_JSON_MAX ((uint64_t)128 << 20)

/* Opens path read-only for a regular file of at most max bytes: *fd and its size in *size. */
err_code file_open_regular(const char *path, uint64_t max, int *fd, size_t *size);

/* The whole regular file at path (at most max bytes) in a malloc'd buffer with a NUL after its
 * *len bytes. */
err_code file_read_regular(const char *path, uint64_t max, char **out, size_t *len);

#endif
