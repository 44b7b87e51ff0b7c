/* Philox4x32-10 (Salmon et al., SC'11) and the dropout stream built on it.
 * This is the CPU twin of the generated kernels' dropout: the element ->
 * (counter, key, lane) mapping below must stay identical to the templates'. */
#include "reference/reference.h"

#include <math.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void ref_philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        if (round > 0) { /* the key schedule advances between rounds */
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        uint32_t n3 = (uint32_t)p0;
        c0 = n0;
        c1 = n1;
        c2 = n2;
        c3 = n3;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

uint32_t ref_dropout_threshold(double p) {
    if (!(p > 0.0))
        return 0; /* also catches NaN */
    if (p >= 1.0)
        return 256u;
    double t = round(p * 256.0);
    return t >= 256.0 ? 256u : (uint32_t)t;
}

double ref_dropout_scale(uint32_t threshold) {
    if (threshold >= 256u)
        return 0.0;
    return 256.0 / (double)(256u - threshold);
}

int ref_dropout_keep(uint64_t seed, uint64_t offset, int b, int h, int64_t i, int64_t j,
                     uint32_t threshold) {
    uint32_t key[2], ctr[4], out[4];
    key[0] = (uint32_t)(seed & 0xffffffffu);
    key[1] = (uint32_t)((seed >> 32) ^ (offset >> 32));
    ctr[0] = (uint32_t)((j / 32) * 4 + (j % 8) / 2);
    ctr[1] = (uint32_t)((i / 16) * 8 + i % 8);
    ctr[2] = ((uint32_t)b << 16) | ((uint32_t)h & 0xffffu);
    ctr[3] = (uint32_t)(offset & 0xffffffffu);
    ref_philox4x32_10(ctr, key, out);
    int v = (int)(((i / 8) % 2) * 8 + ((j / 8) % 4) * 2 + j % 2);
    uint32_t r = (out[v / 4] >> (8 * (v % 4))) & 0xffu;
    return r >= threshold;
}
