/* A fuzz target without libFuzzer, as ctest runs it: the target's seeds
 * (FUZZ_SEEDS), any files named on the command line, then `count` inputs
 * made from the seeds by a fixed sequence of mutations (bits flipped, bytes
 * set, inserted, removed, pieces copied or spliced from another seed), so a
 * run tests the same inputs every time.
 * usage: fuzz_<target> [count] [file ...] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/fuzz/fuzz.h"

#define MAX_INPUT 4096

static uint64_t state = 0x9e3779b97f4a7c15ull;
static uint32_t next_random(void) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return (uint32_t)(state >> 16);
}

static size_t mutate(uint8_t *buf, size_t len, const fuzz_seed *other) {
    static const uint8_t interesting[] = {0, 1, 0x7f, 0x80, 0xff, '(', ')', '[', ']', '-', '!', '?',
                                          ':', ',', '9', '.', 'e', 's', 'q', '\t', '\n'};
    const int steps = 1 + (int)(next_random() % 4);
    for (int i = 0; i < steps; i++) {
        const uint32_t r = next_random();
        const size_t at = len ? next_random() % len : 0;
        switch (r % 6) {
        case 0:
            if (len) buf[at] ^= (uint8_t)(1u << (r >> 8) % 8);
            break;
        case 1:
            if (len) buf[at] = interesting[(r >> 8) % sizeof interesting];
            break;
        case 2:
            if (len < MAX_INPUT) {
                memmove(buf + at + 1, buf + at, len - at);
                buf[at] = (uint8_t)(r >> 8);
                len++;
            }
            break;
        case 3:
            if (len) {
                memmove(buf + at, buf + at + 1, len - at - 1);
                len--;
            }
            break;
        case 4: { /* a piece of this input copied over another place */
            if (!len) break;
            const size_t from = next_random() % len, n = 1 + next_random() % (len - from);
            const size_t room = MAX_INPUT - at < n ? MAX_INPUT - at : n;
            memmove(buf + at, buf + from, room);
            if (at + room > len) len = at + room;
            break;
        }
        default: { /* the rest from another seed */
            const size_t from = other->size ? next_random() % other->size : 0;
            const size_t n = other->size - from < MAX_INPUT - at ? other->size - from : MAX_INPUT - at;
            memcpy(buf + at, other->data + from, n);
            len = at + n;
            break;
        }
        }
    }
    return len;
}

static int run_file(const char *path) {
    static uint8_t buf[1 << 20];
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: cannot open\n", path);
        return -1;
    }
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    LLVMFuzzerTestOneInput(buf, n);
    return 0;
}

int main(int argc, char **argv) {
    long count = argc > 1 ? strtol(argv[1], NULL, 10) : 10000;
    for (int i = 2; i < argc; i++)
        if (run_file(argv[i]) != 0) return 1;
    for (int i = 0; i < fuzz_seed_count; i++) LLVMFuzzerTestOneInput(fuzz_seeds[i].data, fuzz_seeds[i].size);
    static uint8_t buf[MAX_INPUT];
    for (long i = 0; i < count; i++) {
        const fuzz_seed *s = &fuzz_seeds[next_random() % (uint32_t)fuzz_seed_count];
        size_t len = s->size < MAX_INPUT ? s->size : MAX_INPUT;
        memcpy(buf, s->data, len);
        len = mutate(buf, len, &fuzz_seeds[next_random() % (uint32_t)fuzz_seed_count]);
        LLVMFuzzerTestOneInput(buf, len);
    }
    printf("%s: %d seeds and %ld mutated inputs, no failure\n", argv[0], fuzz_seed_count, count);
    return 0;
}
