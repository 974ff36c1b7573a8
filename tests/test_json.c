/* test_json.c - the ground layer's defences against hostile bytes: err_set keeps every message one
 * printable line, json_parse refuses invalid UTF-8, duplicate keys, deep nesting and overlong
 * numbers, and file_read_regular refuses what is not a regular file without blocking. Prints one
 * line per failed check and ends with "N passed, M failed". */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "files.h"
#include "json.h"

static void test_err_set_escapes(void) {
    err_set(ERR_IO, "a\nb\x1b[31mc\x7f\xc3\xa9\xff\xc2\x9b!");
    CHECK(strcmp(err_detail(), "a\\x0Ab\\x1B[31mc\\x7F\xc3\xa9\\xFF\\xC2\\x9B!") == 0, "escaped: %s", err_detail());
    err_set(ERR_IO, "%s", err_detail()); /* escaping twice changes nothing */
    CHECK(strcmp(err_detail(), "a\\x0Ab\\x1B[31mc\\x7F\xc3\xa9\\xFF\\xC2\\x9B!") == 0, "twice: %s", err_detail());
    char long_text[2000];
    memset(long_text, '\n', sizeof long_text - 1);
    long_text[sizeof long_text - 1] = '\0';
    err_set(ERR_IO, "%s", long_text);
    CHECK(strlen(err_detail()) < 512 && strchr(err_detail(), '\n') == NULL, "long: %zu bytes", strlen(err_detail()));
}

/* Whether text parses; on refusal, the detail must hold want. */
static void expect_json(const char *text, size_t len, int ok, const char *want) {
    json_doc doc;
    err_code rc = json_parse(text, len, &doc);
    CHECK((rc == ERR_OK) == ok, "%.40s: %s", text, rc ? err_detail() : "accepted");
    if (!rc) json_free(&doc);
    else if (want) CHECK(strstr(err_detail(), want) != NULL, "%.40s: %s lacks %s", text, err_detail(), want);
}
#define JSON_OK(s) expect_json(s, sizeof s - 1, 1, NULL)
#define JSON_BAD(s, want) expect_json(s, sizeof s - 1, 0, want)

static void test_json(void) {
    JSON_OK("\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"");
    JSON_BAD("\"\x80\"", "valid UTF-8");            /* a continuation byte alone */
    JSON_BAD("\"\xc0\xaf\"", "valid UTF-8");        /* overlong '/' */
    JSON_BAD("\"\xed\xa0\x80\"", "valid UTF-8");    /* a surrogate */
    JSON_BAD("\"\xf5\x80\x80\x80\"", "valid UTF-8"); /* above U+10FFFF */
    JSON_BAD("\"\xe2\x82\"", "valid UTF-8");        /* cut short */
    JSON_BAD("{\"\xff\": 1}", "valid UTF-8");       /* in a key */
    JSON_BAD("{\"a\": 1, \"b\": 2, \"a\": 3}", "at byte 17: duplicate key \"a\"");
    JSON_BAD("[{\"x\": {\"k\": 1, \"k\": 1}}]", "duplicate key \"k\"");
    JSON_OK("{\"a\\u0000b\": 1, \"a\\u0000c\": 2}"); /* keys differ after a NUL */
    JSON_BAD("{\"a\\u0000b\": 1, \"a\\u0000b\": 2}", "duplicate key");
    char deep[400];
    memset(deep, '[', 128);
    memset(deep + 128, ']', 128);
    expect_json(deep, 256, 1, NULL); /* 128 arrays: the innermost at depth 127 */
    memset(deep, '[', 200);
    memset(deep + 200, ']', 200);
    expect_json(deep, 400, 0, "nesting depth");
    char num[5000];
    memset(num, '1', sizeof num);
    expect_json(num, 4096, 1, NULL);
    expect_json(num, 4097, 0, "at most 4096 characters");
    JSON_BAD("NaN", "at byte 0");
}

static void test_files(const char *dir) {
    char path[256], *buf;
    size_t len;
    snprintf(path, sizeof path, "%s/fifo", dir);
    CHECK(mkfifo(path, 0600) == 0, "mkfifo %s", path);
    CHECK(file_read_regular(path, 1 << 20, &buf, &len) == ERR_IO && strstr(err_detail(), "is a FIFO"), "fifo: %s",
          err_detail()); /* returns at once: no writer is waited for */
    unlink(path);
    CHECK(file_read_regular("/dev/zero", 1 << 20, &buf, &len) == ERR_IO && strstr(err_detail(), "character device"),
          "/dev/zero: %s", err_detail());
    CHECK(file_read_regular(dir, 1 << 20, &buf, &len) == ERR_IO && strstr(err_detail(), "is a directory"), "dir: %s",
          err_detail());
    snprintf(path, sizeof path, "%s/big", dir);
    int fd = open(path, O_CREAT | O_WRONLY, 0600);
    CHECK(fd >= 0 && ftruncate(fd, 4096) == 0, "create %s", path);
    close(fd);
    CHECK(file_read_regular(path, 4095, &buf, &len) == ERR_IO && strstr(err_detail(), "4096 bytes, more than the 4095-byte limit"),
          "cap: %s", err_detail());
    CHECK(file_read_regular(path, 4096, &buf, &len) == ERR_OK && len == 4096 && buf[4096] == '\0', "read: %s", err_detail());
    free(buf);
    unlink(path);
}

int main(void) {
    char dir[] = "/tmp/ingot_test_json_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    test_err_set_escapes();
    test_json();
    test_files(dir);
    rmdir(dir);
    return check_summary();
}
