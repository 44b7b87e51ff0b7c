/* Messages and the file handling every part of the cache shares: whole
 * reads and writes, folders, and uniquely named temporary files. */
#include "cache/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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

ssize_t cache_read_full(int fd, void *buf, size_t n) {
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

int cache_write_full(int fd, const void *buf, size_t n) {
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

/* Another process creating the same folder at the same moment is fine
 * (EEXIST); a regular file in the way is not. */
int cache_make_dirs(const char *path) {
    char buf[CACHE_PATH_BUF];
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
        if (mkdir(buf, CACHE_DIR_MODE) != 0 && errno != EEXIST) return -1;
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

int cache_open_temp(const char *folder, const char *tag, char *path, size_t path_len) {
    for (int attempt = 0; attempt < 16; attempt++) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        unsigned n = atomic_fetch_add(&temp_counter, 1u);
        int w = snprintf(path, path_len, "%s/" CACHE_TEMP_PREFIX "%s.%ld.%u.%lx", folder, tag,
                         (long)getpid(), n, (unsigned long)ts.tv_nsec);
        if (w < 0 || (size_t)w >= path_len) {
            errno = ENAMETOOLONG;
            return -1;
        }
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, CACHE_FILE_MODE);
        if (fd >= 0 || errno != EEXIST) return fd;
    }
    errno = EEXIST;
    return -1;
}

int cache_is_temp(const char *name) {
    return strncmp(name, CACHE_TEMP_PREFIX, strlen(CACHE_TEMP_PREFIX)) == 0;
}
