/* The on-disk kernel store: one folder per target, one entry file per key
 * (entry.c has the format).
 *
 * Writers build the whole file under a unique temporary name in the same
 * folder, fsync it and rename it over the entry, so a reader sees either the
 * old file or the new one, never a mix; nobody locks. Anything that does not
 * check out on load (short file, bad header, wrong checksum) is a miss, and
 * the caller's next save replaces it.
 *
 * Least recently used without access times (often off: noatime, relatime):
 * an entry's file is never changed in place, so its mtime is its last save,
 * and a disk hit sets it to now (futimens on the open file). Eviction
 * (evict.c, run after each save when there is a cap) removes the oldest
 * mtimes first. Unlinking needs no lock either: a reader that has the file
 * open reads it to the end, one that opens it later gets a miss and
 * recompiles. */
#include "cache/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Picks the root folder. Empty variables count as unset; a relative
 * XDG_CACHE_HOME is ignored, as the XDG base-directory rules say. */
static int resolve_root(const char *dir, char *out, size_t out_len, char *msg, size_t msg_len) {
    const char *env;
    int n;
    if (dir != NULL && dir[0] != '\0') {
        n = snprintf(out, out_len, "%s", dir);
    } else if ((env = getenv("FLASHGEN_CACHE_DIR")) != NULL && env[0] != '\0') {
        n = snprintf(out, out_len, "%s", env);
    } else if ((env = getenv("XDG_CACHE_HOME")) != NULL && env[0] == '/') {
        n = snprintf(out, out_len, "%s/flashgen", env);
    } else if ((env = getenv("HOME")) != NULL && env[0] != '\0') {
        n = snprintf(out, out_len, "%s/.cache/flashgen", env);
    } else {
        cache_set_msg(msg, msg_len,
                "no kernel cache location: none given and FLASHGEN_CACHE_DIR, XDG_CACHE_HOME "
                "and HOME are all unset");
        return -1;
    }
    if (n < 0 || (size_t)n >= out_len) {
        cache_set_msg(msg, msg_len, "kernel cache path is longer than %zu bytes", out_len - 1);
        return -1;
    }
    /* "a/b/" and "a/b" name one folder; keep entry paths tidy. */
    size_t len = (size_t)n;
    while (len > 1 && out[len - 1] == '/') out[--len] = '\0';
    return 0;
}

int cache_parse_size(const char *text, uint64_t *bytes) {
    if (text == NULL || text[0] < '0' || text[0] > '9') return -1;
    uint64_t v = 0;
    const char *p = text;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > (UINT64_MAX - (uint64_t)(*p - '0')) / 10) return -1;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    int shift = 0;
    switch (*p) {
    case '\0': break;
    case 'k': case 'K': shift = 10; p++; break;
    case 'm': case 'M': shift = 20; p++; break;
    case 'g': case 'G': shift = 30; p++; break;
    default: return -1;
    }
    if (*p != '\0') return -1;
    if (shift > 0 && v > (UINT64_MAX >> shift)) return -1;
    *bytes = v << shift;
    return 0;
}

static int open_root(cache_store *s, const char *dir, char *warn, size_t warn_len);

int cache_store_open(cache_store *s, const char *dir, char *warn, size_t warn_len) {
    /* A bad cap is not worth failing over: say so and keep the default. */
    char note[256] = "";
    uint64_t cap = CACHE_DEFAULT_MAX_BYTES;
    const char *env = getenv("FLASHGEN_CACHE_MAX_SIZE");
    if (env != NULL && env[0] != '\0' && cache_parse_size(env, &cap) != 0) {
        cap = CACHE_DEFAULT_MAX_BYTES;
        snprintf(note, sizeof note,
                 "FLASHGEN_CACHE_MAX_SIZE=%.64s is not a size (bytes, optional K, M or G "
                 "suffix, 0 for no cap); the cache keeps to %llu GiB",
                 env, (unsigned long long)(CACHE_DEFAULT_MAX_BYTES >> 30));
    }
    int rc = open_root(s, dir, warn, warn_len);
    s->max_bytes = cap;
    if (note[0] != '\0' && warn != NULL && warn_len > 0) {
        size_t n = strlen(warn);
        snprintf(warn + n, warn_len - n, "%s%s", n > 0 ? "; " : "", note);
    }
    return rc;
}

static int open_root(cache_store *s, const char *dir, char *warn, size_t warn_len) {
    char eb[128];
    memset(s, 0, sizeof *s);
    if (warn != NULL && warn_len > 0) warn[0] = '\0';
    if (resolve_root(dir, s->root, sizeof s->root, warn, warn_len) != 0) {
        s->root[0] = '\0';
        return -1;
    }
    if (cache_make_dirs(s->root) != 0) {
        cache_set_msg(warn, warn_len,
                "kernel cache folder %s cannot be created (%s); compiled kernels are kept in "
                "memory only",
                s->root, cache_errtext(errno, eb, sizeof eb));
        return 0;
    }
    /* The folder may exist and still refuse writes (read-only mount,
     * someone else's folder): find out now, once, instead of on every save. */
    char probe[CACHE_PATH_BUF];
    int fd = cache_open_temp(s->root, "probe", probe, sizeof probe);
    if (fd < 0) {
        cache_set_msg(warn, warn_len,
                "kernel cache folder %s is not writable (%s); compiled kernels are kept in "
                "memory only",
                s->root, cache_errtext(errno, eb, sizeof eb));
        return 0;
    }
    int ok = cache_write_full(fd, "x", 1) == 0;
    int e = errno;
    if (close(fd) != 0 && ok) {
        ok = 0;
        e = errno;
    }
    unlink(probe);
    if (!ok) {
        cache_set_msg(warn, warn_len,
                "kernel cache folder %s is not writable (%s); compiled kernels are kept in "
                "memory only",
                s->root, cache_errtext(e, eb, sizeof eb));
        return 0;
    }
    s->writable = 1;
    return 0;
}

int cache_store_load(const cache_store *s, const char *target, const char *key_hex,
                     void **payload, size_t *len) {
    *payload = NULL;
    *len = 0;
    char path[CACHE_PATH_BUF];
    if (s->root[0] == '\0' || cache_entry_path(s, target, key_hex, path, sizeof path) != 0)
        return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    int hit = fd >= 0 && cache_entry_read_fd(fd, payload, len, NULL, 0);
    /* Last use = now, for eviction. Ignored when it fails (someone else's
     * file); a read-only store neither touches nor counts. */
    if (hit && s->writable) futimens(fd, NULL);
    if (fd >= 0) close(fd);
    if (s->writable) cache_stats_record(s, target, hit ? 'h' : 'm');
    return hit;
}

int cache_store_save(const cache_store *s, const char *target, const char *key_hex,
                     const void *payload, size_t len, char *err, size_t err_len) {
    char eb[128];
    if (err != NULL && err_len > 0) err[0] = '\0';
    if (!s->writable) {
        cache_set_msg(err, err_len, "kernel cache folder %s is not writable",
                s->root[0] ? s->root : "(none)");
        return -1;
    }
    if (!cache_target_valid(target)) {
        cache_set_msg(err, err_len,
                      "cache save: '%.32s' is not a target name (sm_<number>, optionally with "
                      "a suffix a or f)",
                      target ? target : "(null)");
        return -1;
    }
    if (!cache_key_valid(key_hex)) {
        cache_set_msg(err, err_len, "cache save: the key must be 1 to 128 hex digits");
        return -1;
    }
    if (payload == NULL && len > 0) {
        cache_set_msg(err, err_len, "cache save: payload is NULL");
        return -1;
    }

    char folder[CACHE_PATH_BUF], path[CACHE_PATH_BUF], tmp[CACHE_PATH_BUF];
    snprintf(folder, sizeof folder, "%s/%s", s->root, target);
    cache_entry_path(s, target, key_hex, path, sizeof path);
    if (cache_make_dirs(folder) != 0) {
        cache_set_msg(err, err_len, "cannot create cache folder %s: %s", folder,
                cache_errtext(errno, eb, sizeof eb));
        return -1;
    }

    int fd = cache_open_temp(folder, key_hex, tmp, sizeof tmp);
    if (fd < 0) {
        cache_set_msg(err, err_len, "cannot create a temporary file in %s: %s", folder,
                cache_errtext(errno, eb, sizeof eb));
        return -1;
    }
    const char *step;
    if (cache_entry_write(fd, payload, len) != 0) {
        step = "write";
        goto fail_open;
    }
    /* Data on disk before the name points at it, so a crash cannot leave a
     * complete-looking name over missing data. */
    if (fsync(fd) != 0) {
        step = "fsync";
        goto fail_open;
    }
    if (close(fd) != 0) {
        step = "close";
        goto fail_closed;
    }
    if (rename(tmp, path) != 0) {
        step = "rename";
        goto fail_closed;
    }
    /* Make the rename itself durable; a failure here loses nothing that
     * the next load would not detect, so it is not an error. */
    int dfd = open(folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    /* Keep to the cap. The entry is saved either way, so a failed scan is
     * not this save's failure; the next save scans again. */
    if (s->max_bytes > 0) cache_evict(s, s->max_bytes, target, key_hex, NULL, NULL, NULL, 0);
    return 0;

fail_open: {
    int e = errno;
    close(fd);
    errno = e;
}
fail_closed: {
    int e = errno;
    unlink(tmp);
    cache_set_msg(err, err_len, "cache save %s (%s): %s", path, step, cache_errtext(e, eb, sizeof eb));
    return -1;
}
}
