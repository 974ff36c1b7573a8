/* files.c - model-directory files opened without blocking, checked and size-capped (files.h). */
#include "files.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *file_kind(mode_t mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a regular file";
}

err_code file_open_regular(const char *path, uint64_t max, int *fd, size_t *size) {
    *fd = -1;
    *size = 0;
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer */
    int f = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (f < 0) {
        int e = errno;
        err_set(ERR_IO, "%s: %s", path, strerror(e));
        errno = e; /* callers tell a missing file (ENOENT) from others */
        return ERR_IO;
    }
    struct stat st;
    if (fstat(f, &st) != 0) {
        int e = errno;
        close(f);
        return err_set(ERR_IO, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(f);
        return err_set(ERR_IO, "%s: is %s, expected a regular file", path, file_kind(st.st_mode));
    }
    if (st.st_size < 0 || (uint64_t)st.st_size > max || (uint64_t)st.st_size > SIZE_MAX / 2) {
        close(f);
        return err_set(ERR_IO, "%s: %lld bytes, more than the %llu-byte limit", path, (long long)st.st_size,
                       (unsigned long long)max);
    }
    *fd = f;
    *size = (size_t)st.st_size;
    return ERR_OK;
}

err_code file_read_regular(const char *path, uint64_t max, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    int fd;
    size_t size;
    err_code rc = file_open_regular(path, max, &fd, &size);
    if (rc) return rc;
    char *buf = malloc(size + 1);
    if (!buf) {
        close(fd);
        return err_set(ERR_NOMEM, "%s: %zu bytes", path, size);
    }
    size_t n = 0;
    while (n < size) {
        ssize_t got = read(fd, buf + n, size - n);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            rc = err_set(ERR_IO, "%s: %s", path, got ? strerror(errno) : "file shrank while read");
            break;
        }
        n += (size_t)got;
    }
    close(fd);
    if (rc) {
        free(buf);
        return rc;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return ERR_OK;
}
