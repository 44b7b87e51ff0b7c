/* What the fuzz targets share: each defines LLVMFuzzerTestOneInput (the
 * libFuzzer entry point) and checks its properties with FUZZ_CHECK, which
 * reports and aborts, so that a fuzzer keeps the input that broke one. */
#ifndef FG_TESTS_FUZZ_H
#define FG_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define FUZZ_CHECK(cond, ...)                                                  \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                    \
            fprintf(stderr, __VA_ARGS__);                                      \
            fprintf(stderr, "\n");                                             \
            abort();                                                           \
        }                                                                      \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Each target's seed inputs, where the mutations of replay.c start (a
 * libFuzzer run starts from a corpus folder instead). */
typedef struct fuzz_seed {
    const uint8_t *data;
    size_t size;
} fuzz_seed;
#define FUZZ_SEED(text) {(const uint8_t *)(text), sizeof(text) - 1}
extern const fuzz_seed fuzz_seeds[];
extern const int fuzz_seed_count;

#endif
