/* One scan over a store: its target folders and their entries, for
 * eviction and for the tools (manage.c).
 *
 * It works from directory listings that other processes may change at any
 * moment, and nothing locks. What makes that safe:
 *   - entries are only ever created by rename and removed by unlink, so a
 *     file we open is a whole entry, and stays readable after an unlink;
 *   - before removing a file chosen from a listing we look at it again and
 *     leave it if it is no longer the file we judged (replaced by a writer,
 *     or used since: its mtime moved). The gap between that look and the
 *     unlink is tiny, and losing the race only costs one recompile. */
#include "cache/internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define STALE_TEMP_SECONDS 3600 /* no writer holds a temporary file this long */

static int push_entry(cache_walk *w, const cache_entry_info *e) {
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
    char buf[CACHE_ENTRY_HEADER_SIZE + 512];
    size_t got = 0;
    while (got < sizeof buf) {
        ssize_t r = read(fd, buf + got, sizeof buf - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    cache_payload_info info;
    if (got > CACHE_ENTRY_HEADER_SIZE &&
        cache_payload_unpack(buf + CACHE_ENTRY_HEADER_SIZE, got - CACHE_ENTRY_HEADER_SIZE, &info,
                             NULL))
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

int cache_walk_store(const cache_store *s, const char *target, int flags, int temps,
                     cache_removal *temp_removed, cache_walk *w, char *msg, size_t msg_len) {
    char eb[128], path[CACHE_PATH_BUF];
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
        if (temps != CACHE_TEMPS_KEEP && cache_is_temp(d->d_name)) { /* the open probe's */
            remove_temp(dirfd(root), d->d_name, temps == CACHE_TEMPS_STALE, temp_removed);
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
            if (temps != CACHE_TEMPS_KEEP && cache_is_temp(f->d_name)) {
                remove_temp(dirfd(sub), f->d_name, temps == CACHE_TEMPS_STALE, temp_removed);
                continue;
            }
            cache_entry_info e;
            memset(&e, 0, sizeof e);
            if (!cache_key_of_file(f->d_name, e.key)) continue;
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
    if (rc != 0) cache_walk_free(w);
    return rc;
}

void cache_walk_free(cache_walk *w) {
    free(w->entries);
    w->entries = NULL;
    w->count = w->capacity = 0;
}

int cache_remove_if_unchanged(const cache_store *s, const cache_entry_info *e, dev_t dev,
                              ino_t ino, int check_inode) {
    char path[CACHE_PATH_BUF];
    if (cache_entry_path(s, e->target, e->key, path, sizeof path) != 0) return 0;
    struct stat st;
    if (lstat(path, &st) != 0) return 0; /* someone else removed it */
    if (check_inode && (st.st_dev != dev || st.st_ino != ino)) return 0;
    if ((int64_t)st.st_mtim.tv_sec != e->used_sec || st.st_mtim.tv_nsec != e->used_nsec)
        return 0; /* replaced or used since it was judged */
    return unlink(path) == 0;
}
