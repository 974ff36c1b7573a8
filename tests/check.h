/* check.h - the one assertion macro of the C unit tests: counts passes and failures, prints each
 * failure with its line; every test program ends with check_summary(), whose last line
 * "N passed, M failed" is what tests/test_c_units.py reads. */
#ifndef INGOT_TEST_CHECK_H
#define INGOT_TEST_CHECK_H

#include <stdio.h>

static int n_pass, n_fail;

#define CHECK(cond, ...)                                \
    do {                                                \
        if (cond) {                                     \
            n_pass++;                                   \
        } else {                                        \
            n_fail++;                                   \
            printf("FAIL %s:%d: ", __FILE__, __LINE__); \
            printf(__VA_ARGS__);                        \
            printf("\n");                               \
        }                                               \
    } while (0)

/* Prints the closing line and returns the exit status. */
static inline int check_summary(void) {
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}

#endif
