/* Cache keys: SHA-256 over every field that changes the compiled binary.
 * Each field goes in as <name length><name><value length><value>, lengths as
 * 64-bit little-endian numbers, so moving bytes from one field into the next
 * always changes the key, and the key is the same on every host (shipped
 * caches are built on one machine and read on another). */
#include "cache/cache.h"

#include <stdio.h>
#include <string.h>

static void put_u64(cache_sha256 *h, uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
    cache_sha256_update(h, b, sizeof b);
}

static void put_field(cache_sha256 *h, const char *name, const char *value, size_t len) {
    size_t name_len = strlen(name);
    put_u64(h, (uint64_t)name_len);
    cache_sha256_update(h, name, name_len);
    put_u64(h, (uint64_t)len);
    cache_sha256_update(h, value, len);
}

static void put_text(cache_sha256 *h, const char *name, const char *value) {
    /* A missing string hashes as an empty one. */
    if (value == NULL) value = "";
    put_field(h, name, value, strlen(value));
}

void cache_key(const cache_key_input *in, char hex[65]) {
    static const char digits[] = "0123456789abcdef";
    char num[64];
    cache_sha256 h;
    uint8_t d[32];

    cache_sha256_init(&h);
    /* The format goes first: a new entry layout must never find old keys. */
    snprintf(num, sizeof num, "%d", CACHE_FORMAT_VERSION);
    put_text(&h, "format", num);
    put_text(&h, "source", in->source);
    put_text(&h, "options", in->options);
    /* The name, not a number: sm_90a and sm_90 are different binaries. */
    put_text(&h, "target", in->target);
    snprintf(num, sizeof num, "%d.%d", in->nvrtc_major, in->nvrtc_minor);
    put_text(&h, "nvrtc", num);
    put_text(&h, "generator", in->generator_version);
    cache_sha256_final(&h, d);

    for (int i = 0; i < 32; i++) {
        hex[2 * i] = digits[d[i] >> 4];
        hex[2 * i + 1] = digits[d[i] & 15];
    }
    hex[64] = '\0';
}
