/* The on-disk kernel store. One folder per target; one file per key:
 *
 *   offset  size  field
 *        0     8  magic "FGCACHE\0"
 *        8     4  format, CACHE_FORMAT_VERSION, little-endian
 *       12     4  reserved, 0
 *       16     8  payload length in bytes, little-endian
 *       24    32  SHA-256 of the payload
 *       56     n  payload
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
 * (manage.c, run after each save when there is a cap) removes the oldest
 * mtimes first. Unlinking needs no lock either: a reader that has the file
 * open reads it to the end, one that opens it later gets a miss and
 * recompiles. */
#include "cache/cache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define HEADER_SIZE 56
#define PATH_BUF 4096
#define DIR_MODE 0755  /* shared caches are read by other users */
#define FILE_MODE 0644 /* same reason; the umask still applies */

static const uint8_t MAGIC[8] = {'F', 'G', 'C', 'A', 'C', 'H', 'E', '\0'};

/* Makes temporary names unique between threads of one process; the pid and
 * the clock separate processes (pids can repeat across containers sharing a
 * folder, hence the clock as well). */
static atomic_uint temp_counter;

void cache_set_msg(char *buf, size_t len, const char *fmt, ...) {
    if (buf == NULL || len == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, len, fmt, ap);
    va_end(ap);
}

/* strerror is not thread-safe; this is the POSIX strerror_r. */
const char *cache_errtext(int e, char *buf, size_t len) {
    if (strerror_r(e, buf, len) != 0) snprintf(buf, len, "error %d", e);
    return buf;
}

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

/* Reads up to n bytes, going on after short reads and signals. Returns the
 * count read (less than n only at end of file) or -1. */
static ssize_t read_full(int fd, void *buf, size_t n) {
    size_t done = 0;
    while (done < n) {
        ssize_t r = read(fd, (char *)buf + done, n - done);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (r == 0) break;
        done += (size_t)r;
    }
    return (ssize_t)done;
}

static int write_full(int fd, const void *buf, size_t n) {
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(fd, (const char *)buf + done, n - done);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        done += (size_t)w;
    }
    return 0;
}

/* mkdir -p. Another process creating the same folder at the same moment is
 * fine (EEXIST); a regular file in the way is not. */
static int make_dirs(const char *path) {
    char buf[PATH_BUF];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0') continue;
        if (buf[i - 1] == '/') continue; /* repeated slash */
        char saved = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, DIR_MODE) != 0 && errno != EEXIST) return -1;
        buf[i] = saved;
    }
    struct stat st;
    if (stat(path, &st) != 0) return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

/* Keys name files, so only hex digits: nothing like "../" reaches a path. */
static int valid_key(const char *key) {
    if (key == NULL) return 0;
    size_t n = 0;
    for (; key[n] != '\0'; n++) {
        char c = key[n];
        int hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
        if (!hex || n >= 128) return 0;
    }
    return n > 0;
}

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

static int open_unique(const char *folder, const char *tag, char *path, size_t path_len) {
    for (int attempt = 0; attempt < 16; attempt++) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        unsigned n = atomic_fetch_add(&temp_counter, 1u);
        int w = snprintf(path, path_len, "%s/.tmp.%s.%ld.%u.%lx", folder, tag, (long)getpid(), n,
                         (unsigned long)ts.tv_nsec);
        if (w < 0 || (size_t)w >= path_len) {
            errno = ENAMETOOLONG;
            return -1;
        }
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, FILE_MODE);
        if (fd >= 0 || errno != EEXIST) return fd;
    }
    errno = EEXIST;
    return -1;
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
    if (make_dirs(s->root) != 0) {
        cache_set_msg(warn, warn_len,
                "kernel cache folder %s cannot be created (%s); compiled kernels are kept in "
                "memory only",
                s->root, cache_errtext(errno, eb, sizeof eb));
        return 0;
    }
    /* The folder may exist and still refuse writes (read-only mount,
     * someone else's folder): find out now, once, instead of on every save. */
    char probe[PATH_BUF];
    int fd = open_unique(s->root, "probe", probe, sizeof probe);
    if (fd < 0) {
        cache_set_msg(warn, warn_len,
                "kernel cache folder %s is not writable (%s); compiled kernels are kept in "
                "memory only",
                s->root, cache_errtext(errno, eb, sizeof eb));
        return 0;
    }
    int ok = write_full(fd, "x", 1) == 0;
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

int cache_entry_path(const cache_store *s, const char *target, const char *key_hex, char *path,
                     size_t len) {
    if (path == NULL || len == 0) return -1;
    path[0] = '\0';
    if (!cache_target_valid(target) || !valid_key(key_hex)) return -1;
    int n = snprintf(path, len, "%s/%s/%s.fgc", s->root, target, key_hex);
    if (n < 0 || (size_t)n >= len) {
        path[0] = '\0';
        return -1;
    }
    return 0;
}

/* The checks every reader applies; why says which failed (verify prints it). */
int cache_entry_read_fd(int fd, void **payload, size_t *len, char *why, size_t why_len) {
    *payload = NULL;
    *len = 0;
    uint8_t *buf = NULL;
    uint8_t hdr[HEADER_SIZE];
    struct stat st;
    const char *bad;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        bad = "not a regular file";
        goto damaged;
    }
    if (st.st_size < HEADER_SIZE || read_full(fd, hdr, sizeof hdr) != (ssize_t)sizeof hdr) {
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
    if (plen != (uint64_t)st.st_size - HEADER_SIZE || plen > (uint64_t)SIZE_MAX - 1) {
        bad = "length field does not match the file size";
        goto damaged;
    }

    buf = malloc(plen > 0 ? (size_t)plen : 1);
    if (buf == NULL) {
        bad = "out of memory";
        goto damaged;
    }
    uint8_t extra;
    if (read_full(fd, buf, (size_t)plen) != (ssize_t)plen || read_full(fd, &extra, 1) != 0) {
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
    char old[PATH_BUF + 64], rec[64];
    snprintf(old, sizeof old, "%s/.tmp.stats.%ld", folder, (long)getpid());
    if (rename(path, old) != 0) return;
    uint64_t hits = 0, misses = 0;
    cache_stats_read(old, &hits, &misses);
    int n = snprintf(rec, sizeof rec, "#%llu %llu\n", (unsigned long long)hits,
                     (unsigned long long)misses);
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, FILE_MODE);
    if (fd >= 0) {
        (void)write_full(fd, rec, (size_t)n);
        close(fd);
    }
    unlink(old);
}

/* Appends one byte, 'h' or 'm', to the target's statistics. O_APPEND makes each
 * one-byte write land at the end whoever else is writing, so concurrent
 * processes lose no counts and need no lock. Failures only lose a count. */
static void record_lookup(const cache_store *s, const char *target, char what) {
    char folder[PATH_BUF], path[PATH_BUF + 32];
    int n = snprintf(folder, sizeof folder, "%s/%s", s->root, target);
    if (n < 0 || (size_t)n >= sizeof folder) return;
    snprintf(path, sizeof path, "%s/" CACHE_STATS_FILE, folder);
    int flags = O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC;
    int fd = open(path, flags, FILE_MODE);
    if (fd < 0 && errno == ENOENT) {
        /* The first lookup for a target is a miss before any save has made
         * its folder; the compile that follows would make it anyway. */
        if (make_dirs(folder) == 0) fd = open(path, flags, FILE_MODE);
    }
    if (fd < 0) return;
    struct stat st;
    int full = write_full(fd, &what, 1) == 0 && fstat(fd, &st) == 0 &&
               st.st_size >= CACHE_STATS_FOLD_BYTES;
    close(fd);
    if (full) fold_stats(folder, path);
}

int cache_store_load(const cache_store *s, const char *target, const char *key_hex,
                     void **payload, size_t *len) {
    *payload = NULL;
    *len = 0;
    char path[PATH_BUF];
    if (s->root[0] == '\0' || cache_entry_path(s, target, key_hex, path, sizeof path) != 0)
        return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    int hit = fd >= 0 && cache_entry_read_fd(fd, payload, len, NULL, 0);
    /* Last use = now, for eviction. Ignored when it fails (someone else's
     * file); a read-only store neither touches nor counts. */
    if (hit && s->writable) futimens(fd, NULL);
    if (fd >= 0) close(fd);
    if (s->writable) record_lookup(s, target, hit ? 'h' : 'm');
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
    if (!valid_key(key_hex)) {
        cache_set_msg(err, err_len, "cache save: the key must be 1 to 128 hex digits");
        return -1;
    }
    if (payload == NULL && len > 0) {
        cache_set_msg(err, err_len, "cache save: payload is NULL");
        return -1;
    }

    char folder[PATH_BUF], path[PATH_BUF], tmp[PATH_BUF];
    snprintf(folder, sizeof folder, "%s/%s", s->root, target);
    cache_entry_path(s, target, key_hex, path, sizeof path);
    if (make_dirs(folder) != 0) {
        cache_set_msg(err, err_len, "cannot create cache folder %s: %s", folder,
                cache_errtext(errno, eb, sizeof eb));
        return -1;
    }

    uint8_t hdr[HEADER_SIZE];
    memcpy(hdr, MAGIC, sizeof MAGIC);
    put_u32(hdr + 8, CACHE_FORMAT_VERSION);
    put_u32(hdr + 12, 0);
    put_u64(hdr + 16, (uint64_t)len);
    cache_sha256 h;
    cache_sha256_init(&h);
    cache_sha256_update(&h, payload, len);
    cache_sha256_final(&h, hdr + 24);

    int fd = open_unique(folder, key_hex, tmp, sizeof tmp);
    if (fd < 0) {
        cache_set_msg(err, err_len, "cannot create a temporary file in %s: %s", folder,
                cache_errtext(errno, eb, sizeof eb));
        return -1;
    }
    const char *step;
    if (write_full(fd, hdr, sizeof hdr) != 0 || write_full(fd, payload, len) != 0) {
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
