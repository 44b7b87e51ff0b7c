/* Seeded random inputs: a splitmix64 stream, values rounded to the storage
 * precision, and random block layouts. */
#ifndef FG_HARNESS_RANDOM_H
#define FG_HARNESS_RANDOM_H

#include <stddef.h>
#include <stdint.h>

#include "flashgen.h"

typedef struct fgh_rng {
    uint64_t state;
} fgh_rng;

void fgh_rng_seed(fgh_rng *r, uint64_t seed);
uint64_t fgh_rng_next(fgh_rng *r); /* splitmix64 */
double fgh_rng_unit(fgh_rng *r);   /* (0, 1], 53 bits */
float fgh_rng_uniform(fgh_rng *r); /* [-1, 1), 24 bits */
float fgh_rng_normal(fgh_rng *r);  /* Box-Muller */

/* n values, rounded to dt: standard normal, or uniform in [-1, 1). */
void fgh_fill_normal(fgh_rng *r, float *x, size_t n, fg_dtype dt);
void fgh_fill_uniform(fgh_rng *r, float *x, size_t n, fg_dtype dt);

/* n whole numbers drawn uniformly from lo..hi (sequence lengths). */
void fgh_random_lengths(fgh_rng *r, int *x, int n, int lo, int hi);

/* A 0/1 block layout (heads, blocks_q, blocks_k), row-major, that keeps
 * each block with probability `density`. malloc'ed; NULL with the message
 * when out of memory. */
uint8_t *fgh_random_layout(fgh_rng *r, int heads, int blocks_q, int blocks_k, double density);

#endif
