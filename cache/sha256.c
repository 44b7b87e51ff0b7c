/* SHA-256 as specified in FIPS 180-4 (sections 4.1.2, 4.2.2, 5.1.1, 5.3.3,
 * 6.2). Incremental: init, any number of updates, final. */
#include "cache/cache.h"

#include <string.h>

/* First 32 bits of the fractional parts of the cube roots of the first 64
 * primes (FIPS 180-4, 4.2.2). */
static const uint32_t K[64] = {
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u,
    0xab1c5ed5u, 0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu,
    0x9bdc06a7u, 0xc19bf174u, 0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu,
    0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau, 0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u,
    0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u, 0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu,
    0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u, 0xa2bfe8a1u, 0xa81a664bu,
    0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u, 0x19a4c116u,
    0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
    0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u,
    0xc67178f2u,
};

static uint32_t rotr(uint32_t x, unsigned n) { return (x >> n) | (x << (32u - n)); }

/* Logical functions of section 4.1.2. */
static uint32_t ch(uint32_t x, uint32_t y, uint32_t z) { return (x & y) ^ (~x & z); }
static uint32_t maj(uint32_t x, uint32_t y, uint32_t z) { return (x & y) ^ (x & z) ^ (y & z); }
static uint32_t big_sigma0(uint32_t x) { return rotr(x, 2) ^ rotr(x, 13) ^ rotr(x, 22); }
static uint32_t big_sigma1(uint32_t x) { return rotr(x, 6) ^ rotr(x, 11) ^ rotr(x, 25); }
static uint32_t small_sigma0(uint32_t x) { return rotr(x, 7) ^ rotr(x, 18) ^ (x >> 3); }
static uint32_t small_sigma1(uint32_t x) { return rotr(x, 17) ^ rotr(x, 19) ^ (x >> 10); }

/* One 512-bit block (section 6.2.2). The message words are big-endian
 * regardless of the host. */
static void compress(uint32_t state[8], const uint8_t block[64]) {
    uint32_t w[64];
    for (int t = 0; t < 16; t++) {
        w[t] = (uint32_t)block[4 * t] << 24 | (uint32_t)block[4 * t + 1] << 16 |
               (uint32_t)block[4 * t + 2] << 8 | (uint32_t)block[4 * t + 3];
    }
    for (int t = 16; t < 64; t++) {
        w[t] = small_sigma1(w[t - 2]) + w[t - 7] + small_sigma0(w[t - 15]) + w[t - 16];
    }
    uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
    uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
    for (int t = 0; t < 64; t++) {
        uint32_t t1 = h + big_sigma1(e) + ch(e, f, g) + K[t] + w[t];
        uint32_t t2 = big_sigma0(a) + maj(a, b, c);
        h = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    state[0] += a;
    state[1] += b;
    state[2] += c;
    state[3] += d;
    state[4] += e;
    state[5] += f;
    state[6] += g;
    state[7] += h;
}

void cache_sha256_init(cache_sha256 *h) {
    /* Initial hash value, section 5.3.3. */
    static const uint32_t H0[8] = {0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au,
                                   0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u};
    memcpy(h->state, H0, sizeof H0);
    h->length = 0;
    h->used = 0;
    memset(h->buffer, 0, sizeof h->buffer);
}

void cache_sha256_update(cache_sha256 *h, const void *data, size_t len) {
    const uint8_t *p = data;
    if (len == 0) return; /* data may be NULL then */
    h->length += (uint64_t)len;
    /* Top up a partly filled block first, then hash whole blocks straight
     * from the input, then keep the tail. */
    if (h->used > 0) {
        size_t take = 64 - h->used;
        if (take > len) take = len;
        memcpy(h->buffer + h->used, p, take);
        h->used += take;
        p += take;
        len -= take;
        if (h->used < 64) return;
        compress(h->state, h->buffer);
        h->used = 0;
    }
    while (len >= 64) {
        compress(h->state, p);
        p += 64;
        len -= 64;
    }
    if (len > 0) {
        memcpy(h->buffer, p, len);
        h->used = len;
    }
}

void cache_sha256_final(cache_sha256 *h, uint8_t digest[32]) {
    /* Padding (section 5.1.1): a 1 bit, zeros up to 56 mod 64 bytes, then
     * the message length in bits as a 64-bit big-endian number. */
    uint64_t bits = h->length * 8u;
    h->buffer[h->used++] = 0x80;
    if (h->used > 56) {
        memset(h->buffer + h->used, 0, 64 - h->used);
        compress(h->state, h->buffer);
        h->used = 0;
    }
    memset(h->buffer + h->used, 0, 56 - h->used);
    for (int i = 0; i < 8; i++) h->buffer[56 + i] = (uint8_t)(bits >> (56 - 8 * i));
    compress(h->state, h->buffer);
    h->used = 0;
    for (int i = 0; i < 8; i++) {
        digest[4 * i] = (uint8_t)(h->state[i] >> 24);
        digest[4 * i + 1] = (uint8_t)(h->state[i] >> 16);
        digest[4 * i + 2] = (uint8_t)(h->state[i] >> 8);
        digest[4 * i + 3] = (uint8_t)h->state[i];
    }
}

void cache_sha256_hex(const void *data, size_t len, char hex[65]) {
    static const char digits[] = "0123456789abcdef";
    cache_sha256 h;
    uint8_t d[32];
    cache_sha256_init(&h);
    cache_sha256_update(&h, data, len);
    cache_sha256_final(&h, d);
    for (int i = 0; i < 32; i++) {
        hex[2 * i] = digits[d[i] >> 4];
        hex[2 * i + 1] = digits[d[i] & 15];
    }
    hex[64] = '\0';
}
