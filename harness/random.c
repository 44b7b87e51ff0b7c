/* Seeded random inputs: see random.h. */
#include "harness/random.h"

#include <math.h>
#include <stdlib.h>

#include "harness/message.h"
#include "reference/reference.h"

void fgh_rng_seed(fgh_rng *r, uint64_t seed) { r->state = seed; }

uint64_t fgh_rng_next(fgh_rng *r) {
    uint64_t z = (r->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double fgh_rng_unit(fgh_rng *r) { return (double)((fgh_rng_next(r) >> 11) + 1) * 0x1p-53; }

float fgh_rng_uniform(fgh_rng *r) {
    return (float)((double)(fgh_rng_next(r) >> 40) * (2.0 / 16777216.0) - 1.0);
}

float fgh_rng_normal(fgh_rng *r) {
    double u1 = fgh_rng_unit(r), u2 = fgh_rng_unit(r); /* in this order: seeds reproduce */
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void fgh_fill_normal(fgh_rng *r, float *x, size_t n, fg_dtype dt) {
    for (size_t i = 0; i < n; i++) x[i] = ref_round(fgh_rng_normal(r), (int)dt);
}

void fgh_fill_uniform(fgh_rng *r, float *x, size_t n, fg_dtype dt) {
    for (size_t i = 0; i < n; i++) x[i] = ref_round(fgh_rng_uniform(r), (int)dt);
}

void fgh_random_lengths(fgh_rng *r, int *x, int n, int lo, int hi) {
    uint64_t span = (uint64_t)((int64_t)hi - lo + 1);
    for (int i = 0; i < n; i++) x[i] = lo + (int)(fgh_rng_next(r) % span);
}

uint8_t *fgh_random_layout(fgh_rng *r, int heads, int blocks_q, int blocks_k, double density) {
    size_t n = (size_t)heads * (size_t)blocks_q * (size_t)blocks_k;
    uint8_t *m = malloc(n ? n : 1);
    if (!m) {
        fgh_fail("out of host memory (a %zu-block layout)", n);
        return NULL;
    }
    /* a block is kept when its draw lands in the top `density` of [0, 1) */
    for (size_t t = 0; t < n; t++)
        m[t] = (double)(fgh_rng_next(r) >> 11) * 0x1p-53 >= 1.0 - density;
    return m;
}
