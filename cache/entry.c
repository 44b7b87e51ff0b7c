/* The entry file, one per key:
 *
 *   offset  size  field
 *        0     8  magic "FGCACHE\0"
 *        8     4  format, CACHE_FORMAT_VERSION, little-endian
 *       12     4  reserved, 0
 *       16     8  payload length in bytes, little-endian
 *       24    32  SHA-256 of the payload
 *       56     n  payload
 *
 * Anything that does not check out on reading (short file, bad header,
 * wrong checksum) is damage: the store treats it as a miss, verify names it. */
#include "cache/internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const uint8_t MAGIC[8] = {'F', 'G', 'C', 'A', 'C', 'H', 'E', '\0'};

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

int cache_entry_write(int fd, const void *payload, size_t len) {
    uint8_t hdr[CACHE_ENTRY_HEADER_SIZE];
    memcpy(hdr, MAGIC, sizeof MAGIC);
    put_u32(hdr + 8, CACHE_FORMAT_VERSION);
    put_u32(hdr + 12, 0);
    put_u64(hdr + 16, (uint64_t)len);
    cache_sha256 h;
    cache_sha256_init(&h);
    cache_sha256_update(&h, payload, len);
    cache_sha256_final(&h, hdr + 24);
    if (cache_write_full(fd, hdr, sizeof hdr) != 0) return -1;
    return cache_write_full(fd, payload, len);
}

/* The checks every reader applies; why says which failed (verify prints it). */
int cache_entry_read_fd(int fd, void **payload, size_t *len, char *why, size_t why_len) {
    *payload = NULL;
    *len = 0;
    uint8_t *buf = NULL;
    uint8_t hdr[CACHE_ENTRY_HEADER_SIZE];
    struct stat st;
    const char *bad;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        bad = "not a regular file";
        goto damaged;
    }
    if (st.st_size < CACHE_ENTRY_HEADER_SIZE ||
        cache_read_full(fd, hdr, sizeof hdr) != (ssize_t)sizeof hdr) {
        bad = "shorter than the header";
        goto damaged;
    }
    if (memcmp(hdr, MAGIC, sizeof MAGIC) != 0) {
        bad = "bad magic";
        goto damaged;
    }
    if (get_u32(hdr + 8) != CACHE_FORMAT_VERSION || get_u32(hdr + 12) != 0) {
        bad = "another format version";
        goto damaged;
    }
    /* The length must match the file exactly: this catches truncation and
     * stray trailing bytes before anything is allocated. */
    uint64_t plen = get_u64(hdr + 16);
    if (plen != (uint64_t)st.st_size - CACHE_ENTRY_HEADER_SIZE || plen > (uint64_t)SIZE_MAX - 1) {
        bad = "length field does not match the file size";
        goto damaged;
    }

    buf = malloc(plen > 0 ? (size_t)plen : 1);
    if (buf == NULL) {
        bad = "out of memory";
        goto damaged;
    }
    uint8_t extra;
    if (cache_read_full(fd, buf, (size_t)plen) != (ssize_t)plen ||
        cache_read_full(fd, &extra, 1) != 0) {
        bad = "changed size while being read"; /* not ours: written in place */
        goto damaged;
    }

    cache_sha256 h;
    uint8_t digest[32];
    cache_sha256_init(&h);
    cache_sha256_update(&h, buf, (size_t)plen);
    cache_sha256_final(&h, digest);
    if (memcmp(digest, hdr + 24, sizeof digest) != 0) {
        bad = "checksum mismatch";
        goto damaged;
    }
    *payload = buf;
    *len = (size_t)plen;
    return 1;

damaged:
    free(buf);
    cache_set_msg(why, why_len, "%s", bad);
    return 0;
}
