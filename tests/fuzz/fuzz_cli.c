/* fuzz_cli.c - libFuzzer target: ingot's whole command line (runtime/main.c, compiled in with its
 * main renamed) on the tiny-llama test model, arguments taken from the input split at NUL bytes.
 *
 * The run happens in a scratch directory holding one text file, "p" (for -f and --perplexity);
 * arguments that name other places (a '/' or ".."), and --help (which exits), --bench (a 1 GB
 * bandwidth probe per input) and --threads are dropped (every run gets --threads 1, last):
 * tests/test_hardening.py covers --bench's sizes. stdin is /dev/null; run with -close_fd_mask=3. */
#define main ingot_main
#include "../../runtime/main.c"
#undef main

#include "fuzz_common.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    static const uint8_t text[] = "The quick brown fox jumps over the lazy dog. <|im_start|>user\nhéllo 123";
    fuzz_write("p", text, sizeof text - 1);
    if (chdir(fuzz_dir()) != 0 || !freopen("/dev/null", "r", stdin)) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char buf[4096], *args[20] = {"ingot"};
    int n = 1;
    size = size < sizeof buf - 1 ? size : sizeof buf - 1;
    memcpy(buf, data, size);
    buf[size] = '\0';
    for (char *p = buf; p < buf + size && n < 17; p += strlen(p) + 1) {
        if (!strcmp(p, "-h") || !strcmp(p, "--help") || !strcmp(p, "--bench") || !strcmp(p, "--threads") ||
            strchr(p, '/') || strstr(p, ".."))
            continue;
        args[n++] = p;
    }
    /* one thread: two OpenMP threads on a loaded machine spin at each barrier (a chat answer of
     * 0.06 s took 8 s) */
    args[n++] = "--threads";
    args[n++] = "1";
    args[n] = NULL;
    ingot_main(n, args);
    return 0;
}
