/* The tools' operations on a store: list, statistics, verify, clear. They
 * call down to the scan (walk.c), the entry format (entry.c) and the
 * statistics file (stats.c), never into the store's load and save.
 *
 * Other processes may add, replace or remove entries meanwhile; an entry
 * that vanishes between the scan and its use is skipped. Removal goes
 * through cache_remove_if_unchanged (walk.c), so a file replaced since it
 * was judged stays. The library never prints: results come back as data,
 * reasons in msg. */
#include "cache/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* By target, then the most recently used first. */
static int by_target_then_recent(const void *pa, const void *pb) {
    const cache_entry_info *a = pa, *b = pb;
    int c = cache_target_cmp(a->target, b->target);
    if (c != 0) return c;
    if (a->used_sec != b->used_sec) return a->used_sec > b->used_sec ? -1 : 1;
    if (a->used_nsec != b->used_nsec) return a->used_nsec > b->used_nsec ? -1 : 1;
    return strcmp(a->key, b->key);
}

static int by_target(const void *pa, const void *pb) { return cache_target_cmp(pa, pb); }

/* ---- list and statistics --------------------------------------------------- */

int cache_list(const cache_store *s, const char *target, int flags, cache_entry_info **entries,
               size_t *count, char *msg, size_t msg_len) {
    cache_walk w;
    *entries = NULL;
    *count = 0;
    if (cache_walk_store(s, target, flags, CACHE_TEMPS_KEEP, NULL, &w, msg, msg_len) != 0)
        return -1;
    if (w.count > 1) qsort(w.entries, w.count, sizeof *w.entries, by_target_then_recent);
    *entries = w.entries;
    *count = w.count;
    return 0;
}

static void read_counts(const cache_store *s, const char *target, uint64_t *hits,
                        uint64_t *misses) {
    char path[CACHE_PATH_BUF];
    snprintf(path, sizeof path, "%s/%s/" CACHE_STATS_FILE, s->root, target);
    cache_stats_read(path, hits, misses);
}

int cache_stats(const cache_store *s, const char *target, cache_target_stats **stats,
                size_t *count, char *msg, size_t msg_len) {
    cache_walk w;
    *stats = NULL;
    *count = 0;
    if (cache_walk_store(s, target, 0, CACHE_TEMPS_KEEP, NULL, &w, msg, msg_len) != 0)
        return -1;
    qsort(w.targets, w.target_count, sizeof w.targets[0], by_target);
    cache_target_stats *rows = calloc(w.target_count ? w.target_count : 1, sizeof *rows);
    if (rows == NULL) {
        cache_walk_free(&w);
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
    cache_walk_free(&w);
    *stats = rows;
    *count = w.target_count;
    return 0;
}

/* ---- clear ------------------------------------------------------------------- */

int cache_clear(const cache_store *s, const char *target, cache_removal *removed, char *msg,
                size_t msg_len) {
    char eb[128], path[CACHE_PATH_BUF];
    cache_removal none;
    if (removed == NULL) removed = &none;
    memset(removed, 0, sizeof *removed);
    /* A writer mid-save whose temporary file goes here fails its rename and
     * carries on without the cache: clearing wins. */
    cache_walk w;
    if (cache_walk_store(s, target, 0, CACHE_TEMPS_ALL, removed, &w, msg, msg_len) != 0)
        return -1;
    int rc = 0;
    for (size_t i = 0; i < w.count; i++) {
        cache_entry_path(s, w.entries[i].target, w.entries[i].key, path, sizeof path);
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
    cache_walk_free(&w);
    return rc;
}

/* ---- verify -------------------------------------------------------------------- */

int cache_verify(const cache_store *s, const char *target, int remove, cache_damaged_fn fn,
                 void *user, cache_verify_result *result, char *msg, size_t msg_len) {
    char path[CACHE_PATH_BUF], why[160];
    cache_verify_result none;
    if (result == NULL) result = &none;
    memset(result, 0, sizeof *result);
    cache_walk w;
    if (cache_walk_store(s, target, CACHE_LIST_NAMES, CACHE_TEMPS_KEEP, NULL, &w, msg,
                         msg_len) != 0)
        return -1;
    if (w.count > 1) qsort(w.entries, w.count, sizeof *w.entries, by_target_then_recent);
    for (size_t i = 0; i < w.count; i++) {
        cache_entry_info *e = &w.entries[i];
        cache_entry_path(s, e->target, e->key, path, sizeof path);
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
            gone = cache_remove_if_unchanged(s, e, st.st_dev, st.st_ino, 1);
            if (gone) {
                result->removed.files++;
                result->removed.bytes += (uint64_t)st.st_size;
            }
        }
        if (fn != NULL) fn(e, why, gone, user);
    }
    cache_walk_free(&w);
    return 0;
}
