/* The kernel cache: content-addressed keys and an on-disk store, one folder
 * per target. Entries are written to a temporary file in the same folder and
 * renamed into place; readers never lock; a damaged entry reads as a miss.
 * Each section names the file that implements it (cache/internal.h has the
 * order in which they call each other). */
#ifndef FG_CACHE_H
#define FG_CACHE_H

#include <stddef.h>
#include <stdint.h>

#define CACHE_FORMAT_VERSION 1

/* ---- messages (io.c), shared by the cache's files ---- */
/* snprintf into buf (nothing when buf is NULL or len 0). */
void cache_set_msg(char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The text of errno value e, thread-safely. */
const char *cache_errtext(int e, char *buf, size_t len);

/* ---- targets (names.c) ----
 * A target is named as NVRTC spells it: "sm_75", "sm_90", "sm_90a". Names go
 * into keys and name the store's folders, so only "sm_", a number with no
 * leading zero and an optional suffix letter, 'a' (arch-specific) or 'f'
 * (family), is a name: nothing like "../x" can reach a path. An sm_90a
 * entry is its own target, never found by an sm_90 lookup. */
#define CACHE_TARGET_MAX 15
#define CACHE_TARGET_SIZE (CACHE_TARGET_MAX + 1)

/* 1 when name is a target name, else 0 (also for NULL). */
int cache_target_valid(const char *name);

/* "90", "sm_90", "90a" or "sm_90a" -> "sm_90a" in target. Returns 0, or -1
 * (target "") when text names no target. */
int cache_target_parse(const char *text, char target[CACHE_TARGET_SIZE]);

/* The SM number of a target name (90 for "sm_90a"), -1 when it is none. */
int cache_target_sm(const char *target);

/* By SM number, then suffix: sm_75 < sm_90 < sm_90a < sm_100. */
int cache_target_cmp(const char *a, const char *b);

/* ---- SHA-256 (sha256.c) ---- */
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

/* ---- keys (key.c) ----
 * Every field that changes the binary, each length-prefixed with its name so
 * no two field lists hash alike. */
typedef struct cache_key_input {
    const char *source;
    const char *options;        /* compile options, joined */
    const char *target;         /* "sm_80", "sm_90a" */
    int nvrtc_major, nvrtc_minor;
    const char *generator_version;
} cache_key_input;
void cache_key(const cache_key_input *in, char hex[65]);

/* ---- the store (store.c; names.c has the paths, entry.c the file format) ---- */
typedef struct cache_store {
    char root[1024];    /* e.g. ~/.cache/flashgen */
    int writable;       /* 0 after the folder proved unwritable */
    uint64_t max_bytes; /* cap on the entries' total size, 0 = none (FLASHGEN_CACHE_MAX_SIZE) */
} cache_store;

/* The cap when FLASHGEN_CACHE_MAX_SIZE is unset: a few thousand kernels. */
#define CACHE_DEFAULT_MAX_BYTES (4ull << 30)

/* Resolve the location: dir if non-NULL, else $FLASHGEN_CACHE_DIR, else
 * $XDG_CACHE_HOME/flashgen, else $HOME/.cache/flashgen. Creates the folder if
 * it can; an unwritable location leaves writable = 0 and returns 0 with a
 * note in warn (never a hard error). Returns 0, or -1 with the reason in warn
 * when no location can be named at all (no variable and no HOME, or a path
 * too long). max_bytes comes from $FLASHGEN_CACHE_MAX_SIZE (see
 * cache_parse_size), else CACHE_DEFAULT_MAX_BYTES; a malformed value adds a
 * note to warn and keeps the default. */
int cache_store_open(cache_store *s, const char *dir, char *warn, size_t warn_len);

/* Path of an entry: <root>/<target>/<key>.fgc. Returns 0, or -1 with path
 * "" when target or key is not a valid name or the path does not fit. */
int cache_entry_path(const cache_store *s, const char *target, const char *key_hex, char *path,
                     size_t len);

/* Load an entry's payload (malloc'ed, caller frees). Returns 1 on a hit, 0 on
 * a miss, also when the file is truncated, has a bad magic, format, length or
 * checksum (a damaged entry is a miss; the caller rebuilds and saves over it)
 * and when target or key is not a valid name. A writable store also records
 * the lookup in the target's statistics and, on a hit, sets the entry's
 * mtime to now: mtime is the last use, for eviction. */
int cache_store_load(const cache_store *s, const char *target, const char *key_hex,
                     void **payload, size_t *len);

/* Save a payload atomically (temp file in the same folder, fsync, rename).
 * Then, with a cap, evicts least-recently-used entries (never this one) until
 * the store fits (cache_evict, evict.c). Returns 0, or -1 with err set (the caller may
 * go on without a cache). */
int cache_store_save(const cache_store *s, const char *target, const char *key_hex,
                     const void *payload, size_t len, char *err, size_t err_len);

/* Read and check a whole entry from an open file (the checks of
 * cache_store_load, shared with cache_verify). Returns 1 with the payload
 * (malloc'ed) or 0 with the reason in why. */
int cache_entry_read_fd(int fd, void **payload, size_t *len, char *why, size_t why_len);

/* "4G", "512M", "100k", "12345": bytes, with an optional K, M or G suffix
 * (powers of 1024, either case); "0" means no cap. Returns 0, or -1 when the
 * text is not such a size or overflows. */
int cache_parse_size(const char *text, uint64_t *bytes);

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

/* ---- statistics (stats.c) ----
 * Per target, the store appends one byte per disk lookup of a writable store
 * to <root>/<target>/stats: 'h' a hit, 'm' a miss. O_APPEND writes of one byte
 * never interleave, so no count is lost without a lock. Once the file
 * reaches CACHE_STATS_FOLD_BYTES, the process whose byte took it there
 * renames it away, counts it and appends one record "#<hits> <misses>\n" to
 * a fresh file, so the file stays small however long the cache lives (a
 * count written to the old file by a process that opened it just before the
 * rename may be lost). */
#define CACHE_STATS_FILE "stats"
#define CACHE_STATS_FOLD_BYTES (1 << 20)

/* The hits and misses a statistics file holds (bytes and folded records);
 * a missing file holds none. */
void cache_stats_read(const char *path, uint64_t *hits, uint64_t *misses);

/* ---- what a scan of the store finds (walk.c) ---- */
typedef struct cache_entry_info {
    char target[CACHE_TARGET_SIZE];
    char key[129];
    uint64_t bytes;           /* the file's size, header included */
    int64_t used_sec;         /* mtime: last save or disk hit */
    long used_nsec;
    char kernel_name[160];    /* CACHE_LIST_NAMES: from the payload, "" if unreadable */
} cache_entry_info;

#define CACHE_LIST_NAMES 1    /* also read each entry's kernel name (one small read) */

typedef struct cache_removal {
    uint64_t files, bytes;
} cache_removal;

/* ---- eviction (evict.c) ---- */

/* Removes least-recently-used entries (oldest mtime first) until the entries
 * total at most max_bytes, never keep_target/keep_key (keep_key may be NULL),
 * and temporary files over an hour old (crashed writers). removed and
 * remaining (the bytes left) may be NULL. Returns 0, or -1 with msg. */
int cache_evict(const cache_store *s, uint64_t max_bytes, const char *keep_target,
                const char *keep_key, cache_removal *removed, uint64_t *remaining, char *msg,
                size_t msg_len);

/* ---- tools: list, statistics, verify, clear (manage.c) ----
 * Nothing here locks: other processes may add, replace or remove entries
 * meanwhile, and an entry that vanishes between listing and use is skipped,
 * not an error. A target of NULL or "" means every target; another name that
 * is not a target name is refused. Each returns 0, or -1 with the reason in
 * msg. */

/* Every entry, sorted by target (cache_target_cmp) and then most recently
 * used first. *entries is malloc'ed (caller frees; NULL when there are none). */
int cache_list(const cache_store *s, const char *target, int flags, cache_entry_info **entries,
               size_t *count, char *msg, size_t msg_len);

typedef struct cache_target_stats {
    char target[CACHE_TARGET_SIZE];
    uint64_t hits, misses;    /* disk lookups since the last clear */
    uint64_t entries, bytes;
} cache_target_stats;

/* One row per target folder, by target; *stats malloc'ed (caller frees). */
int cache_stats(const cache_store *s, const char *target, cache_target_stats **stats,
                size_t *count, char *msg, size_t msg_len);

/* Called for each damaged entry found by cache_verify; removed says whether
 * it is gone. */
typedef void (*cache_damaged_fn)(const cache_entry_info *entry, const char *why, int removed,
                                 void *user);

typedef struct cache_verify_result {
    uint64_t checked, damaged;
    cache_removal removed;
} cache_verify_result;

/* Reads every entry in full: header, length, checksum, and a payload that
 * unpacks. With remove, damaged entries are deleted (unless a writer has
 * replaced the file since it was read). */
int cache_verify(const cache_store *s, const char *target, int remove, cache_damaged_fn fn,
                 void *user, cache_verify_result *result, char *msg, size_t msg_len);

/* Removes the entries, the statistics and temporary files of one target or
 * of all; the folders stay. */
int cache_clear(const cache_store *s, const char *target, cache_removal *removed, char *msg,
                size_t msg_len);

#endif
