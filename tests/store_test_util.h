/* What the cache tests (test_cache, test_cache_manage) share: their
 * temporary folder, rm -rf for it (read-only folders included), and small
 * file and store helpers. Include after tests/check.h. */
#ifndef FG_TESTS_STORE_TEST_UTIL_H
#define FG_TESTS_STORE_TEST_UTIL_H

#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache/cache.h"

static char base[1024]; /* the test's own temporary folder */

static inline void remove_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return;
    if (S_ISDIR(st.st_mode)) {
        chmod(path, 0755); /* a folder a test made read-only */
        DIR *d = opendir(path);
        if (d != NULL) {
            struct dirent *e;
            while ((e = readdir(d)) != NULL) {
                if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
                char child[2048];
                int n = snprintf(child, sizeof child, "%s/%s", path, e->d_name);
                if (n > 0 && (size_t)n < sizeof child) remove_tree(child);
            }
            closedir(d);
        }
        rmdir(path);
    } else {
        unlink(path);
    }
}


static inline void path_in(char *out, size_t len, const char *rel) {
    int n = snprintf(out, len, "%s/%s", base, rel);
    CHECK(n > 0 && (size_t)n < len, "path %s/%s too long", base, rel);
}

/* Deterministic bytes from a seed. */
static inline void fill(uint8_t *p, size_t n, uint64_t seed) {
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 0x1234567u;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (uint8_t)(x >> 32);
    }
}

/* Flips the low bit of one byte of a file; 0 when done. */
static inline int flip_byte(const char *path, long offset) {
    int fd = open(path, O_RDWR);
    if (fd < 0) return -1;
    uint8_t b;
    int ok = pread(fd, &b, 1, offset) == 1;
    b ^= 1;
    ok = ok && pwrite(fd, &b, 1, offset) == 1;
    close(fd);
    return ok ? 0 : -1;
}

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Waits at most `seconds` for the n child processes in pids: a hung child
 * fails a test instead of hanging it. status[i] gets child i's wait status,
 * or -1 if it was still running and got killed. Returns how many were. */
static inline int wait_children(const pid_t *pids, int n, double seconds, int *status) {
    double deadline = now_s() + seconds;
    int left = n;
    for (int i = 0; i < n; i++) status[i] = -1;
    while (left > 0 && now_s() < deadline) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid <= 0) {
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
            continue;
        }
        for (int i = 0; i < n; i++)
            if (pids[i] == pid && status[i] == -1) status[i] = st, left--;
    }
    for (int i = 0; i < n; i++)
        if (status[i] == -1) {
            kill(pids[i], SIGKILL);
            waitpid(pids[i], NULL, 0);
        }
    return left;
}

/* Opens the store in base/rel; it must come out writable, with no warning. */
static inline int open_at(cache_store *s, const char *rel) {
    char dir[1100], warn[512];
    path_in(dir, sizeof dir, rel);
    int rc = cache_store_open(s, dir, warn, sizeof warn);
    CHECK(rc == 0 && s->writable == 1 && warn[0] == '\0', "open %s: rc %d writable %d warn '%s'",
          dir, rc, s->writable, warn);
    return rc;
}

#endif
