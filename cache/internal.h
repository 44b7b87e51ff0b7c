/* What the cache's files share among themselves; nothing outside cache/
 * includes this. Calls go one way, down this list; no file calls one above
 * it, so nothing in cache/ calls back into its caller:
 *
 *   manage.c   list, stats, verify, clear: tools     -> walk, entry, stats, payload, names, io
 *   bundle.c   manifests and bundle verification     -> store, payload, names, sha256, io
 *   store.c    open, load, save                      -> evict, entry, stats, names, io
 *   evict.c    least recently used, to the size cap  -> walk, names
 *   walk.c     the scan over the target folders      -> payload, names, io
 *   stats.c    the hit and miss counts               -> io
 *   entry.c    the entry file's format               -> sha256, io
 *   key.c      keys                                  -> sha256
 *   payload.c, names.c, io.c, sha256.c               -> nothing in cache/
 */
#ifndef FG_CACHE_INTERNAL_H
#define FG_CACHE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "cache/cache.h"

#define CACHE_PATH_BUF 4096
#define CACHE_DIR_MODE 0755  /* shared caches are read by other users */
#define CACHE_FILE_MODE 0644 /* same reason; the umask still applies */
#define CACHE_ENTRY_SUFFIX ".fgc"
#define CACHE_TEMP_PREFIX ".tmp."

/* ---- io.c: whole reads and writes, folders, temporary files ---- */

/* Reads up to n bytes, going on after short reads and signals. Returns the
 * count read (less than n only at end of file) or -1. */
ssize_t cache_read_full(int fd, void *buf, size_t n);

/* Writes all n bytes. Returns 0, or -1 with errno. */
int cache_write_full(int fd, const void *buf, size_t n);

/* mkdir -p with CACHE_DIR_MODE. Returns 0, or -1 with errno. */
int cache_make_dirs(const char *path);

/* Creates and opens (write only) a file named
 * <folder>/.tmp.<tag>.<pid>.<counter>.<clock>, unique between threads and
 * processes. Returns the descriptor with its name in path, or -1 with errno. */
int cache_open_temp(const char *folder, const char *tag, char *path, size_t path_len);

/* 1 when a folder entry is a temporary file (CACHE_TEMP_PREFIX). */
int cache_is_temp(const char *name);

/* ---- names.c: keys as file names ---- */

/* 1 to 128 hex digits: keys name files, so nothing like "../" gets in. */
int cache_key_valid(const char *key);

/* "<key>.fgc" -> the key; 0 for anything else (stats, temporary files). */
int cache_key_of_file(const char *name, char key[129]);

/* ---- entry.c: the entry file ---- */

#define CACHE_ENTRY_HEADER_SIZE 56

/* Writes an entry's header and payload to fd. Returns 0, or -1 with errno. */
int cache_entry_write(int fd, const void *payload, size_t len);

/* ---- stats.c: recording lookups ---- */

/* Appends 'h' or 'm' to <root>/<target>/stats (making the folder if
 * needed) and folds the file when it is full. Failures only lose a count. */
void cache_stats_record(const cache_store *s, const char *target, char what);

/* ---- walk.c: one scan over a store's target folders ---- */

typedef struct cache_walk {
    cache_entry_info *entries; /* malloc'ed, growable */
    size_t count, capacity;
    char targets[512][CACHE_TARGET_SIZE]; /* the target folders seen */
    size_t target_count;
} cache_walk;

/* What a walk does with the temporary files it meets. */
enum { CACHE_TEMPS_KEEP, CACHE_TEMPS_STALE, CACHE_TEMPS_ALL };

/* Lists the entries of one target (NULL or "": all; another name that is
 * not a target name is refused), with CACHE_LIST_NAMES in flags reading
 * their kernel names. Temporary files are kept, removed when stale (over an
 * hour old: crashed writers), or all removed, counted in temp_removed (may
 * be NULL). A store whose folder does not exist yet is empty, not an error;
 * nor is a folder that vanishes meanwhile. Returns 0 (free with
 * cache_walk_free), or -1 with msg. */
int cache_walk_store(const cache_store *s, const char *target, int flags, int temps,
                     cache_removal *temp_removed, cache_walk *w, char *msg, size_t msg_len);

void cache_walk_free(cache_walk *w);

/* Unlinks an entry chosen from a listing if the file at its name is still
 * the one listed (same mtime and, with check_inode, the same inode);
 * 1 removed, 0 left alone. */
int cache_remove_if_unchanged(const cache_store *s, const cache_entry_info *e, dev_t dev,
                              ino_t ino, int check_inode);

#endif
