/* Hit and miss counts: per target, one byte per disk lookup appended to
 * <root>/<target>/stats, folded into a record when the file is full (see
 * CACHE_STATS_FILE in cache.h). */
#include "cache/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

void cache_stats_read(const char *path, uint64_t *hits, uint64_t *misses) {
    char buf[65536];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    int in_record = 0, field = 0;
    uint64_t value[2] = {0, 0};
    for (;;) {
        ssize_t r = read(fd, buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        for (ssize_t i = 0; i < r; i++) {
            char c = buf[i];
            if (!in_record) {
                *hits += c == 'h';
                *misses += c == 'm';
                if (c == '#') in_record = 1, field = 0, value[0] = value[1] = 0;
            } else if (c >= '0' && c <= '9') {
                value[field] = value[field] * 10 + (uint64_t)(c - '0');
            } else if (c == ' ') {
                field = 1;
            } else { /* '\n' ends the record; anything else too */
                *hits += value[0], *misses += value[1];
                in_record = 0;
            }
        }
    }
    close(fd);
}

/* Folds a statistics file that reached CACHE_STATS_FOLD_BYTES into one
 * record: only the process whose rename succeeds does it. */
static void fold_stats(const char *folder, const char *path) {
    char old[CACHE_PATH_BUF + 64], rec[64];
    snprintf(old, sizeof old, "%s/" CACHE_TEMP_PREFIX "stats.%ld", folder, (long)getpid());
    if (rename(path, old) != 0) return;
    uint64_t hits = 0, misses = 0;
    cache_stats_read(old, &hits, &misses);
    int n = snprintf(rec, sizeof rec, "#%llu %llu\n", (unsigned long long)hits,
                     (unsigned long long)misses);
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, CACHE_FILE_MODE);
    if (fd >= 0) {
        (void)cache_write_full(fd, rec, (size_t)n);
        close(fd);
    }
    unlink(old);
}

/* O_APPEND makes each one-byte write land at the end whoever else is
 * writing, so concurrent processes lose no counts and need no lock. */
void cache_stats_record(const cache_store *s, const char *target, char what) {
    char folder[CACHE_PATH_BUF], path[CACHE_PATH_BUF + 32];
    int n = snprintf(folder, sizeof folder, "%s/%s", s->root, target);
    if (n < 0 || (size_t)n >= sizeof folder) return;
    snprintf(path, sizeof path, "%s/" CACHE_STATS_FILE, folder);
    int flags = O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC;
    int fd = open(path, flags, CACHE_FILE_MODE);
    if (fd < 0 && errno == ENOENT) {
        /* The first lookup for a target is a miss before any save has made
         * its folder; the compile that follows would make it anyway. */
        if (cache_make_dirs(folder) == 0) fd = open(path, flags, CACHE_FILE_MODE);
    }
    if (fd < 0) return;
    struct stat st;
    int full = cache_write_full(fd, &what, 1) == 0 && fstat(fd, &st) == 0 &&
               st.st_size >= CACHE_STATS_FOLD_BYTES;
    close(fd);
    if (full) fold_stats(folder, path);
}
