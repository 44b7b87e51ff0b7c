/* A small assertion harness for the C tests: CHECK records a failure with
 * file:line and a message and goes on; check_summary prints the counts and
 * gives the exit code. A test that needs a GPU and finds none calls
 * check_skip, which exits with 77 (ctest's SKIP_RETURN_CODE). */
#ifndef FG_TESTS_CHECK_H
#define FG_TESTS_CHECK_H

#include <stdio.h>
#include <stdlib.h>

static int check_passed_count;
static int check_failed_count;

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (cond) {                                                             \
            check_passed_count++;                                               \
        } else {                                                                \
            check_failed_count++;                                               \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);     \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
        }                                                                       \
    } while (0)

static inline int check_summary(const char *suite) {
    printf("%s: %d passed, %d failed\n", suite, check_passed_count, check_failed_count);
    return check_failed_count == 0 && check_passed_count > 0 ? 0 : 1;
}

static inline void check_skip(const char *why) {
    printf("SKIPPED: %s\n", why);
    exit(77);
}

#endif
