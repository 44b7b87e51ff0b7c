/* The kernel cache: content-addressed keys and an on-disk store, one folder
 * per arch. Entries are written to a temporary file in the same folder and
 * renamed into place; readers never lock; a damaged entry reads as a miss. */
#ifndef FG_CACHE_H
#define FG_CACHE_H

#include <stddef.h>
#include <stdint.h>

#define CACHE_FORMAT_VERSION 1

/* ---- SHA-256 ---- */
typedef struct cache_sha256 {
    uint32_t state[8];
    uint64_t length;
    uint8_t buffer[64];
    size_t used;
} cache_sha256;
void cache_sha256_init(cache_sha256 *h);
void cache_sha256_update(cache_sha256 *h, const void *data, size_t len);
void cache_sha256_final(cache_sha256 *h, uint8_t digest[32]);
void cache_sha256_hex(const void *data, size_t len, char hex[65]);

/* ---- keys ----
 * Every field that changes the binary, each length-prefixed with its name so
 * no two field lists hash alike. */
typedef struct cache_key_input {
    const char *source;
    const char *options;        /* compile options, joined */
    int arch;                   /* 75, 80, 86, 89, 90 */
    int nvrtc_major, nvrtc_minor;
    const char *generator_version;
} cache_key_input;
void cache_key(const cache_key_input *in, char hex[65]);

/* ---- the store ---- */
typedef struct cache_store {
    char root[1024];  /* e.g. ~/.cache/flashgen */
    int writable;     /* 0 after the folder proved unwritable */
} cache_store;

/* Resolve the location: dir if non-NULL, else $FLASHGEN_CACHE_DIR, else
 * $XDG_CACHE_HOME/flashgen, else $HOME/.cache/flashgen. Creates the folder if
 * it can; an unwritable location leaves writable = 0 and returns 0 with a
 * note in warn (never a hard error). Returns 0, or -1 with the reason in warn
 * when no location can be named at all (no variable and no HOME, or a path
 * too long). */
int cache_store_open(cache_store *s, const char *dir, char *warn, size_t warn_len);

/* Path of an entry: <root>/sm_<arch>/<key>.fgc */
void cache_entry_path(const cache_store *s, int arch, const char *key_hex, char *path, size_t len);

/* Load an entry's payload (malloc'ed, caller frees). Returns 1 on a hit, 0 on
 * a miss, also when the file is truncated, has a bad magic, format, length or
 * checksum (a damaged entry is a miss; the caller rebuilds and saves over it). */
int cache_store_load(const cache_store *s, int arch, const char *key_hex, void **payload,
                     size_t *len);

/* Save a payload atomically (temp file in the same folder, fsync, rename).
 * Returns 0, or -1 with err set (the caller may go on without a cache). */
int cache_store_save(const cache_store *s, int arch, const char *key_hex, const void *payload,
                     size_t len, char *err, size_t err_len);

/* ---- payloads ----
 * An entry's payload: the compile report, then the cubin (payload.c). */
typedef struct cache_payload_info {
    int registers, spill_bytes, stack_bytes, smem_static;
    char kernel_name[160];
} cache_payload_info;

/* A malloc'ed payload (caller frees), or NULL when out of memory. */
void *cache_payload_pack(const cache_payload_info *info, const void *cubin, size_t cubin_len,
                         size_t *len);

/* The cubin inside a payload (and its length when cubin_len is non-NULL),
 * with the report in info; NULL when the payload is malformed. */
const void *cache_payload_unpack(const void *payload, size_t len, cache_payload_info *info,
                                 size_t *cubin_len);

#endif
