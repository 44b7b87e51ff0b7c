/* Managing the on-disk store: list, statistics, verify, clear, evict.
 *
 * All of it works from directory listings that other processes may change
 * at any moment, and none of it locks. What makes that safe:
 *   - entries are only ever created by rename and removed by unlink, so a
 *     file we open is a whole entry, and stays readable after an unlink;
 *   - before removing a file chosen from a listing we look at it again and
 *     leave it if it is no longer the file we judged (replaced by a writer,
 *     or used since: its mtime moved). The gap between that look and the
 *     unlink is tiny, and losing the race only costs one recompile;
 *   - two evictions at once may together remove a little more than needed,
 *     which again only costs recompiles.
 * The library never prints: results come back as data, reasons in msg. */
#include "cache/cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define PATH_BUF 4096
#define ENTRY_SUFFIX ".fgc"
#define TEMP_PREFIX ".tmp."
#define STALE_TEMP_SECONDS 3600 /* no writer holds a temporary file this long */
#define ENTRY_HEADER_SIZE 56    /* store.c's header, before the payload */

/* "<hex>.fgc" -> the key; 0 for anything else (stats, temporary files). */
static int key_of_file(const char *name, char key[129]) {
    size_t n = strlen(name), s = strlen(ENTRY_SUFFIX);
    if (n <= s || n - s > 128 || strcmp(name + n - s, ENTRY_SUFFIX) != 0) return 0;
    for (size_t i = 0; i < n - s; i++) {
        char c = name[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')))
            return 0;
    }
    memcpy(key, name, n - s);
    key[n - s] = '\0';
    return 1;
}

static int is_temp(const char *name) { return strncmp(name, TEMP_PREFIX, strlen(TEMP_PREFIX)) == 0; }

/* ---- the walk ---------------------------------------------------------------- */

/* What one walk over the store found: entries (a growable array), and the
 * target folders. */
typedef struct walk {
    cache_entry_info *entries;
    size_t count, capacity;
    char targets[512][CACHE_TARGET_SIZE];
    size_t target_count;
} walk;

static int push_entry(walk *w, const cache_entry_info *e) {
    if (w->count == w->capacity) {
        size_t cap = w->capacity ? 2 * w->capacity : 64;
        cache_entry_info *p = realloc(w->entries, cap * sizeof *p);
        if (p == NULL) return -1;
        w->entries = p;
        w->capacity = cap;
    }
    w->entries[w->count++] = *e;
    return 0;
}

/* The kernel name from the payload's first line: one small read, no
 * checksum (verify does that). */
static void read_kernel_name(int dir_fd, const char *name, char out[160]) {
    out[0] = '\0';
    int fd = openat(dir_fd, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    char buf[ENTRY_HEADER_SIZE + 512];
    size_t got = 0;
    while (got < sizeof buf) {
        ssize_t r = read(fd, buf + got, sizeof buf - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    cache_payload_info info;
    if (got > ENTRY_HEADER_SIZE &&
        cache_payload_unpack(buf + ENTRY_HEADER_SIZE, got - ENTRY_HEADER_SIZE, &info, NULL))
        snprintf(out, 160, "%s", info.kernel_name);
}

/* Removes a temporary file when it is older than an hour (stale_only) or at
 * all; counts it in removed. */
static void remove_temp(int dir_fd, const char *name, int stale_only, cache_removal *removed) {
    struct stat st;
    if (fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) return;
    if (stale_only && time(NULL) - st.st_mtim.tv_sec < STALE_TEMP_SECONDS) return;
    if (unlinkat(dir_fd, name, 0) == 0 && removed != NULL) {
        removed->files++;
        removed->bytes += (uint64_t)st.st_size;
    }
}

/* Temporary-file handling during a walk. */
enum { TEMPS_KEEP, TEMPS_STALE, TEMPS_ALL };

/* Lists the entries of one target (NULL or "": all). A store whose folder
 * does not exist yet is empty, not an error; nor is a folder that vanishes
 * meanwhile. */
static int walk_store(const cache_store *s, const char *target, int flags, int temps,
                      cache_removal *temp_removed, walk *w, char *msg, size_t msg_len) {
    char eb[128], path[PATH_BUF];
    memset(w, 0, sizeof *w);
    int all = target == NULL || target[0] == '\0';
    if (!all && !cache_target_valid(target)) {
        cache_set_msg(msg, msg_len,
                      "'%.32s' is not a target name (sm_<number>, optionally with a suffix a "
                      "or f)",
                      target);
        return -1;
    }
    if (s->root[0] == '\0') {
        cache_set_msg(msg, msg_len, "no kernel cache folder");
        return -1;
    }
    DIR *root = opendir(s->root);
    if (root == NULL) {
        if (errno == ENOENT) return 0;
        cache_set_msg(msg, msg_len, "cannot read the kernel cache folder %s: %s", s->root,
                cache_errtext(errno, eb, sizeof eb));
        return -1;
    }
    int rc = 0;
    struct dirent *d;
    while (rc == 0 && (d = readdir(root)) != NULL) {
        if (temps != TEMPS_KEEP && is_temp(d->d_name)) { /* the open probe's */
            remove_temp(dirfd(root), d->d_name, temps == TEMPS_STALE, temp_removed);
            continue;
        }
        if (!cache_target_valid(d->d_name) || (!all && strcmp(d->d_name, target) != 0))
            continue;
        snprintf(path, sizeof path, "%s/%s", s->root, d->d_name);
        DIR *sub = opendir(path);
        if (sub == NULL) {
            if (errno == ENOENT || errno == ENOTDIR) continue;
            cache_set_msg(msg, msg_len, "cannot read %s: %s", path, cache_errtext(errno, eb, sizeof eb));
            rc = -1;
            break;
        }
        if (w->target_count < sizeof w->targets / sizeof w->targets[0])
            snprintf(w->targets[w->target_count++], CACHE_TARGET_SIZE, "%.*s", CACHE_TARGET_MAX,
                     d->d_name);
        struct dirent *f;
        while ((f = readdir(sub)) != NULL) {
            if (temps != TEMPS_KEEP && is_temp(f->d_name)) {
                remove_temp(dirfd(sub), f->d_name, temps == TEMPS_STALE, temp_removed);
                continue;
            }
            cache_entry_info e;
            memset(&e, 0, sizeof e);
            if (!key_of_file(f->d_name, e.key)) continue;
            struct stat st;
            if (fstatat(dirfd(sub), f->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
                !S_ISREG(st.st_mode))
                continue; /* gone since readdir, or not an entry */
            snprintf(e.target, sizeof e.target, "%.*s", CACHE_TARGET_MAX, d->d_name);
            e.bytes = (uint64_t)st.st_size;
            e.used_sec = (int64_t)st.st_mtim.tv_sec;
            e.used_nsec = st.st_mtim.tv_nsec;
            if (flags & CACHE_LIST_NAMES) read_kernel_name(dirfd(sub), f->d_name, e.kernel_name);
            if (push_entry(w, &e) != 0) {
                cache_set_msg(msg, msg_len, "out of memory listing the kernel cache");
                rc = -1;
                break;
            }
        }
        closedir(sub);
    }
    closedir(root);
    if (rc != 0) {
        free(w->entries);
        w->entries = NULL;
        w->count = 0;
    }
    return rc;
}

static void entry_path(const cache_store *s, const cache_entry_info *e, char *path, size_t len) {
    snprintf(path, len, "%s/%s/%s" ENTRY_SUFFIX, s->root, e->target, e->key);
}

static int by_target_then_recent(const void *pa, const void *pb) {
    const cache_entry_info *a = pa, *b = pb;
    int c = cache_target_cmp(a->target, b->target);
    if (c != 0) return c;
    if (a->used_sec != b->used_sec) return a->used_sec > b->used_sec ? -1 : 1;
    if (a->used_nsec != b->used_nsec) return a->used_nsec > b->used_nsec ? -1 : 1;
    return strcmp(a->key, b->key);
}

/* Least recently used first; ties (coarse timestamps) by target and key so
 * the order is the same in every process. */
static int by_oldest(const void *pa, const void *pb) {
    const cache_entry_info *a = pa, *b = pb;
    if (a->used_sec != b->used_sec) return a->used_sec < b->used_sec ? -1 : 1;
    if (a->used_nsec != b->used_nsec) return a->used_nsec < b->used_nsec ? -1 : 1;
    int c = cache_target_cmp(a->target, b->target);
    if (c != 0) return c;
    return strcmp(a->key, b->key);
}

static int by_target(const void *pa, const void *pb) { return cache_target_cmp(pa, pb); }

/* ---- list and statistics --------------------------------------------------- */

int cache_list(const cache_store *s, const char *target, int flags, cache_entry_info **entries,
               size_t *count, char *msg, size_t msg_len) {
    walk w;
    *entries = NULL;
    *count = 0;
    if (walk_store(s, target, flags, TEMPS_KEEP, NULL, &w, msg, msg_len) != 0) return -1;
    if (w.count > 1) qsort(w.entries, w.count, sizeof *w.entries, by_target_then_recent);
    *entries = w.entries;
    *count = w.count;
    return 0;
}

static void read_counts(const cache_store *s, const char *target, uint64_t *hits,
                        uint64_t *misses) {
    char path[PATH_BUF];
    snprintf(path, sizeof path, "%s/%s/" CACHE_STATS_FILE, s->root, target);
    cache_stats_read(path, hits, misses);
}

int cache_stats(const cache_store *s, const char *target, cache_target_stats **stats,
                size_t *count, char *msg, size_t msg_len) {
    walk w;
    *stats = NULL;
    *count = 0;
    if (walk_store(s, target, 0, TEMPS_KEEP, NULL, &w, msg, msg_len) != 0) return -1;
    qsort(w.targets, w.target_count, sizeof w.targets[0], by_target);
    cache_target_stats *rows = calloc(w.target_count ? w.target_count : 1, sizeof *rows);
    if (rows == NULL) {
        free(w.entries);
        cache_set_msg(msg, msg_len, "out of memory reading the kernel cache statistics");
        return -1;
    }
    for (size_t i = 0; i < w.target_count; i++) {
        snprintf(rows[i].target, sizeof rows[i].target, "%s", w.targets[i]);
        read_counts(s, w.targets[i], &rows[i].hits, &rows[i].misses);
        for (size_t j = 0; j < w.count; j++) {
            if (strcmp(w.entries[j].target, w.targets[i]) != 0) continue;
            rows[i].entries++;
            rows[i].bytes += w.entries[j].bytes;
        }
    }
    free(w.entries);
    *stats = rows;
    *count = w.target_count;
    return 0;
}

/* ---- removal ------------------------------------------------------------------ */

/* Unlinks an entry chosen from a listing if the file at its name is still
 * the one listed (same inode, same mtime); 1 removed, 0 left alone. */
static int remove_if_unchanged(const cache_store *s, const cache_entry_info *e, dev_t dev,
                               ino_t ino, int check_inode) {
    char path[PATH_BUF];
    entry_path(s, e, path, sizeof path);
    struct stat st;
    if (lstat(path, &st) != 0) return 0; /* someone else removed it */
    if (check_inode && (st.st_dev != dev || st.st_ino != ino)) return 0;
    if ((int64_t)st.st_mtim.tv_sec != e->used_sec || st.st_mtim.tv_nsec != e->used_nsec)
        return 0; /* replaced or used since it was judged */
    return unlink(path) == 0;
}

int cache_evict(const cache_store *s, uint64_t max_bytes, const char *keep_target,
                const char *keep_key, cache_removal *removed, uint64_t *remaining, char *msg,
                size_t msg_len) {
    cache_removal none;
    if (removed == NULL) removed = &none;
    memset(removed, 0, sizeof *removed);
    walk w;
    if (walk_store(s, NULL, 0, TEMPS_STALE, removed, &w, msg, msg_len) != 0) return -1;
    uint64_t total = 0;
    for (size_t i = 0; i < w.count; i++) total += w.entries[i].bytes;
    if (max_bytes > 0 && total > max_bytes) {
        qsort(w.entries, w.count, sizeof *w.entries, by_oldest);
        for (size_t i = 0; i < w.count && total > max_bytes; i++) {
            const cache_entry_info *e = &w.entries[i];
            if (keep_key != NULL && keep_target != NULL && strcmp(e->target, keep_target) == 0 &&
                strcmp(e->key, keep_key) == 0)
                continue;
            if (!remove_if_unchanged(s, e, 0, 0, 0)) continue;
            removed->files++;
            removed->bytes += e->bytes;
            total -= e->bytes;
        }
    }
    free(w.entries);
    if (remaining != NULL) *remaining = total;
    return 0;
}

int cache_clear(const cache_store *s, const char *target, cache_removal *removed, char *msg,
                size_t msg_len) {
    char eb[128], path[PATH_BUF];
    cache_removal none;
    if (removed == NULL) removed = &none;
    memset(removed, 0, sizeof *removed);
    /* A writer mid-save whose temporary file goes here fails its rename and
     * carries on without the cache: clearing wins. */
    walk w;
    if (walk_store(s, target, 0, TEMPS_ALL, removed, &w, msg, msg_len) != 0) return -1;
    int rc = 0;
    for (size_t i = 0; i < w.count; i++) {
        entry_path(s, &w.entries[i], path, sizeof path);
        if (unlink(path) == 0) {
            removed->files++;
            removed->bytes += w.entries[i].bytes;
        } else if (errno != ENOENT && rc == 0) {
            cache_set_msg(msg, msg_len, "cannot remove %s: %s", path, cache_errtext(errno, eb, sizeof eb));
            rc = -1;
        }
    }
    for (size_t i = 0; i < w.target_count; i++) {
        snprintf(path, sizeof path, "%s/%s/" CACHE_STATS_FILE, s->root, w.targets[i]);
        struct stat st;
        if (lstat(path, &st) != 0) continue;
        if (unlink(path) == 0) {
            removed->files++;
            removed->bytes += (uint64_t)st.st_size;
        } else if (errno != ENOENT && rc == 0) {
            cache_set_msg(msg, msg_len, "cannot remove %s: %s", path, cache_errtext(errno, eb, sizeof eb));
            rc = -1;
        }
    }
    free(w.entries);
    return rc;
}

/* ---- verify -------------------------------------------------------------------- */

int cache_verify(const cache_store *s, const char *target, int remove, cache_damaged_fn fn,
                 void *user, cache_verify_result *result, char *msg, size_t msg_len) {
    char path[PATH_BUF], why[160];
    cache_verify_result none;
    if (result == NULL) result = &none;
    memset(result, 0, sizeof *result);
    walk w;
    if (walk_store(s, target, CACHE_LIST_NAMES, TEMPS_KEEP, NULL, &w, msg, msg_len) != 0)
        return -1;
    if (w.count > 1) qsort(w.entries, w.count, sizeof *w.entries, by_target_then_recent);
    for (size_t i = 0; i < w.count; i++) {
        cache_entry_info *e = &w.entries[i];
        entry_path(s, e, path, sizeof path);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue; /* evicted or cleared since the listing */
        struct stat st;
        int have_stat = fstat(fd, &st) == 0;
        void *payload = NULL;
        size_t len = 0;
        int ok = cache_entry_read_fd(fd, &payload, &len, why, sizeof why);
        close(fd);
        cache_payload_info info;
        if (ok && cache_payload_unpack(payload, len, &info, NULL) == NULL) {
            ok = 0;
            snprintf(why, sizeof why, "payload is not a flashgen kernel");
        }
        free(payload);
        result->checked++;
        if (ok) continue;
        result->damaged++;
        int gone = 0;
        if (remove && have_stat) {
            /* Judge the file just read, not the one listed earlier. */
            e->used_sec = (int64_t)st.st_mtim.tv_sec;
            e->used_nsec = st.st_mtim.tv_nsec;
            gone = remove_if_unchanged(s, e, st.st_dev, st.st_ino, 1);
            if (gone) {
                result->removed.files++;
                result->removed.bytes += (uint64_t)st.st_size;
            }
        }
        if (fn != NULL) fn(e, why, gone, user);
    }
    free(w.entries);
    return 0;
}
