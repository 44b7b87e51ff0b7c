/* Bundles: the manifest, and verification of a bundle folder (bundle.h).
 * Entries themselves are plain store files read and written by store.c. */
#include "cache/bundle.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define PATH_BUF 4096
#define FIELD_COUNT 11
#define MANIFEST_COLUMNS \
    "# pass\tspec\tkernel\tplan\ttarget\tkey\tsha256\tgenerator\tnvrtc\tformat\tstep"
#define MAGIC_PREFIX "#flashgen-bundle "

/* ---- manifest lines ---- */

static int clean_field(const char *s) { return strpbrk(s, "\t\n\r") == NULL; }

int bundle_entry_format(const bundle_entry *e, char *line, size_t len) {
    const char *text[] = {e->pass,   e->spec,      e->kernel, e->plan, e->key,
                          e->sha256, e->generator, e->nvrtc,  e->step};
    for (size_t i = 0; i < sizeof text / sizeof text[0]; i++)
        if (!clean_field(text[i])) return -1;
    if (!cache_target_valid(e->target)) return -1;
    int n = snprintf(line, len, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s", e->pass, e->spec,
                     e->kernel, e->plan, e->target, e->key, e->sha256, e->generator, e->nvrtc,
                     e->format, e->step);
    return n < 0 || (size_t)n >= len ? -1 : 0;
}

static int is_hex64(const char *s) {
    size_t n = 0;
    for (; s[n]; n++)
        if (!((s[n] >= '0' && s[n] <= '9') || (s[n] >= 'a' && s[n] <= 'f'))) return 0;
    return n == 64;
}

static int parse_small_int(const char *s, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < 0 || v > 1000000) return -1;
    *out = (int)v;
    return 0;
}

int bundle_entry_parse(const char *line, bundle_entry *e, char *why, size_t why_len) {
    char buf[2048];
    size_t n = strcspn(line, "\r\n");
    if (n >= sizeof buf) {
        cache_set_msg(why, why_len, "line longer than %zu bytes", sizeof buf - 1);
        return -1;
    }
    memcpy(buf, line, n);
    buf[n] = '\0';
    char *field[FIELD_COUNT];
    int count = 0;
    for (char *p = buf;; p++) {
        if (count < FIELD_COUNT) field[count] = p;
        count++;
        p = strchr(p, '\t');
        if (!p) break;
        *p = '\0';
    }
    if (count != FIELD_COUNT) {
        cache_set_msg(why, why_len, "%d fields, %d expected", count, FIELD_COUNT);
        return -1;
    }
    memset(e, 0, sizeof *e);
    struct {
        char *dst;
        size_t size;
        int index;
        const char *name;
    } text[] = {
        {e->pass, sizeof e->pass, 0, "pass"},
        {e->spec, sizeof e->spec, 1, "spec"},
        {e->kernel, sizeof e->kernel, 2, "kernel"},
        {e->plan, sizeof e->plan, 3, "plan"},
        {e->key, sizeof e->key, 5, "key"},
        {e->sha256, sizeof e->sha256, 6, "sha256"},
        {e->generator, sizeof e->generator, 7, "generator"},
        {e->nvrtc, sizeof e->nvrtc, 8, "nvrtc"},
        {e->step, sizeof e->step, 10, "step"},
    };
    for (size_t i = 0; i < sizeof text / sizeof text[0]; i++) {
        const char *v = field[text[i].index];
        if (v[0] == '\0' || strlen(v) >= text[i].size) {
            cache_set_msg(why, why_len, "%s: empty or longer than %zu characters", text[i].name,
                    text[i].size - 1);
            return -1;
        }
        memcpy(text[i].dst, v, strlen(v) + 1);
    }
    /* The target names a folder: only a target name reaches a path. */
    if (!cache_target_valid(field[4])) {
        cache_set_msg(why, why_len, "target: '%.32s' is not a target name such as sm_90 or sm_90a",
                      field[4]);
        return -1;
    }
    memcpy(e->target, field[4], strlen(field[4]) + 1);
    if (parse_small_int(field[9], &e->format) != 0) {
        cache_set_msg(why, why_len, "format: '%s' is not a number", field[9]);
        return -1;
    }
    if (strcmp(e->pass, "forward") != 0 && strcmp(e->pass, "backward") != 0) {
        cache_set_msg(why, why_len, "pass: '%s' is not forward or backward", e->pass);
        return -1;
    }
    /* The key names a file: only hex, so nothing like "../" reaches a path. */
    if (!is_hex64(e->key) || !is_hex64(e->sha256)) {
        cache_set_msg(why, why_len, "key and sha256 must be 64 lowercase hex digits");
        return -1;
    }
    return 0;
}

/* ---- files ---- */

int bundle_file_sha256(const char *path, char hex[65], char *err, size_t err_len) {
    static const char digits[] = "0123456789abcdef";
    char eb[128];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        cache_set_msg(err, err_len, "%s: %s", path, cache_errtext(errno, eb, sizeof eb));
        return -1;
    }
    cache_sha256 h;
    cache_sha256_init(&h);
    unsigned char buf[65536];
    for (;;) {
        ssize_t r = read(fd, buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            cache_set_msg(err, err_len, "%s: %s", path, cache_errtext(errno, eb, sizeof eb));
            close(fd);
            return -1;
        }
        if (r == 0) break;
        cache_sha256_update(&h, buf, (size_t)r);
    }
    close(fd);
    uint8_t d[32];
    cache_sha256_final(&h, d);
    for (int i = 0; i < 32; i++) {
        hex[2 * i] = digits[d[i] >> 4];
        hex[2 * i + 1] = digits[d[i] & 15];
    }
    hex[64] = '\0';
    return 0;
}

int bundle_make_dir(const char *dir, char *err, size_t err_len) {
    char buf[PATH_BUF], eb[128];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof buf) {
        cache_set_msg(err, err_len, "bundle folder: empty or longer than %zu bytes", sizeof buf - 1);
        return -1;
    }
    memcpy(buf, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0') continue;
        char saved = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
            cache_set_msg(err, err_len, "cannot create %s: %s", buf, cache_errtext(errno, eb, sizeof eb));
            return -1;
        }
        buf[i] = saved;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        cache_set_msg(err, err_len, "%s is not a folder", dir);
        return -1;
    }
    return 0;
}

static int write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int bundle_manifest_write(const char *dir, const bundle_entry *entries, size_t count, char *err,
                          size_t err_len) {
    char path[PATH_BUF], tmp[PATH_BUF], eb[128], line[2048];
    if (snprintf(path, sizeof path, "%s/%s", dir, BUNDLE_MANIFEST) >= (int)sizeof path ||
        snprintf(tmp, sizeof tmp, "%s/.%s.tmp.%ld", dir, BUNDLE_MANIFEST, (long)getpid()) >=
            (int)sizeof tmp) {
        cache_set_msg(err, err_len, "bundle folder path too long");
        return -1;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        cache_set_msg(err, err_len, "cannot create %s: %s", tmp, cache_errtext(errno, eb, sizeof eb));
        return -1;
    }
    int ok = write_all(fd, BUNDLE_MANIFEST_MAGIC "\n" MANIFEST_COLUMNS "\n",
                       strlen(BUNDLE_MANIFEST_MAGIC "\n" MANIFEST_COLUMNS "\n")) == 0;
    for (size_t i = 0; ok && i < count; i++) {
        if (bundle_entry_format(&entries[i], line, sizeof line - 1) != 0) {
            cache_set_msg(err, err_len, "manifest entry %zu (%s) has a field with a tab or newline",
                    i, entries[i].kernel);
            close(fd);
            unlink(tmp);
            return -1;
        }
        strcat(line, "\n");
        ok = write_all(fd, line, strlen(line)) == 0;
    }
    /* On disk before the name points at it: a crash leaves the old manifest
     * or the new one, never half of one. */
    if (ok) ok = fsync(fd) == 0;
    int e = errno;
    if (close(fd) != 0 && ok) ok = 0, e = errno;
    if (ok && rename(tmp, path) != 0) ok = 0, e = errno;
    if (!ok) {
        unlink(tmp);
        cache_set_msg(err, err_len, "cannot write %s: %s", path, cache_errtext(e, eb, sizeof eb));
        return -1;
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return 0;
}

/* The whole manifest as text (malloc'ed), or NULL with err. */
static char *read_manifest_text(const char *dir, char *err, size_t err_len) {
    char path[PATH_BUF], eb[128];
    snprintf(path, sizeof path, "%s/%s", dir, BUNDLE_MANIFEST);
    FILE *f = fopen(path, "rb");
    if (!f) {
        cache_set_msg(err, err_len, "%s: %s", path, cache_errtext(errno, eb, sizeof eb));
        return NULL;
    }
    size_t cap = 65536, len = 0;
    char *text = malloc(cap);
    while (text) {
        size_t r = fread(text + len, 1, cap - len - 1, f);
        len += r;
        if (len < cap - 1) break;
        char *grown = realloc(text, cap * 2);
        if (!grown) {
            free(text);
            text = NULL;
            break;
        }
        text = grown, cap *= 2;
    }
    int failed = ferror(f);
    fclose(f);
    if (!text || failed) {
        free(text);
        cache_set_msg(err, err_len, "%s: %s", path, failed ? "read error" : "out of memory");
        return NULL;
    }
    text[len] = '\0';
    size_t magic = strlen(BUNDLE_MANIFEST_MAGIC);
    if (strncmp(text, BUNDLE_MANIFEST_MAGIC, magic) == 0 &&
        (text[magic] == '\n' || text[magic] == '\r'))
        return text;
    /* Another version's columns mean other things (version 1's arch column
     * was a number): say which way the versions differ. */
    char *end = NULL;
    long version = -1;
    if (strncmp(text, MAGIC_PREFIX, strlen(MAGIC_PREFIX)) == 0) {
        const char *v = text + strlen(MAGIC_PREFIX);
        if (*v >= '0' && *v <= '9') version = strtol(v, &end, 10);
        if (version >= 0 && *end != '\n' && *end != '\r' && *end != '\0') version = -1;
    }
    long ours = strtol(&BUNDLE_MANIFEST_MAGIC[strlen(MAGIC_PREFIX)], NULL, 10);
    if (version >= 0 && version < ours)
        cache_set_msg(err, err_len,
                      "%s is a version %ld manifest, made by an older flashgen: rebuild the bundle "
                      "with this one (flashgen bundle build), which writes version %ld",
                      path, version, ours);
    else if (version > ours)
        cache_set_msg(err, err_len,
                      "%s is a version %ld manifest, made by a newer flashgen; this one reads "
                      "version %ld",
                      path, version, ours);
    else
        cache_set_msg(err, err_len,
                      "%s is not a flashgen bundle manifest (the first line is not '%s')", path,
                      BUNDLE_MANIFEST_MAGIC);
    free(text);
    return NULL;
}

/* Calls fn for each entry line (not comments or blank lines) with its number. */
static void each_line(char *text, void (*fn)(char *line, int number, void *user), void *user) {
    int number = 0;
    for (char *line = text; *line;) {
        char *end = strchr(line, '\n');
        if (end) *end = '\0';
        number++;
        if (line[0] != '#' && line[strspn(line, " \r")] != '\0') fn(line, number, user);
        if (!end) break;
        line = end + 1;
    }
}

typedef struct read_state {
    bundle_entry *entries;
    size_t count, cap;
    char *err;
    size_t err_len;
    int failed;
} read_state;

static void read_one(char *line, int number, void *user) {
    read_state *r = user;
    if (r->failed) return;
    char why[256];
    bundle_entry e;
    if (bundle_entry_parse(line, &e, why, sizeof why) != 0) {
        cache_set_msg(r->err, r->err_len, "%s line %d: %s", BUNDLE_MANIFEST, number, why);
        r->failed = 1;
        return;
    }
    if (r->count == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 64;
        bundle_entry *grown = realloc(r->entries, cap * sizeof *grown);
        if (!grown) {
            cache_set_msg(r->err, r->err_len, "reading %s: out of memory", BUNDLE_MANIFEST);
            r->failed = 1;
            return;
        }
        r->entries = grown, r->cap = cap;
    }
    r->entries[r->count++] = e;
}

int bundle_manifest_read(const char *dir, bundle_entry **entries, size_t *count, char *err,
                         size_t err_len) {
    *entries = NULL;
    *count = 0;
    char *text = read_manifest_text(dir, err, err_len);
    if (!text) return -1;
    read_state r = {NULL, 0, 0, err, err_len, 0};
    each_line(text, read_one, &r);
    free(text);
    if (r.failed) {
        free(r.entries);
        return -1;
    }
    *entries = r.entries;
    *count = r.count;
    return 0;
}

/* Checks one line for bundle_open; the first bad one ends the check. */
static void check_one(char *line, int number, void *user) {
    read_state *r = user;
    if (r->failed) return;
    char why[256];
    bundle_entry e;
    if (bundle_entry_parse(line, &e, why, sizeof why) != 0) {
        cache_set_msg(r->err, r->err_len, "%s line %d: %s", BUNDLE_MANIFEST, number, why);
        r->failed = 1;
    }
}

int bundle_open(cache_store *s, const char *dir, char *err, size_t err_len) {
    struct stat st;
    char manifest[PATH_BUF], why[1024];
    memset(s, 0, sizeof *s); /* writable 0: loads leave no statistics or mtimes behind */
    if (!dir || !dir[0]) {
        cache_set_msg(err, err_len, "bundle folder: empty name");
        return -1;
    }
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    if (n >= sizeof s->root) {
        cache_set_msg(err, err_len, "bundle folder %s: path longer than %zu bytes", dir,
                sizeof s->root - 1);
        return -1;
    }
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        cache_set_msg(err, err_len, "bundle folder %s: not a folder", dir);
        return -1;
    }
    snprintf(manifest, sizeof manifest, "%.*s/%s", (int)n, dir, BUNDLE_MANIFEST);
    if (stat(manifest, &st) != 0 || !S_ISREG(st.st_mode)) {
        cache_set_msg(err, err_len,
                "bundle folder %s has no %s: not a bundle, or its build did not finish", dir,
                BUNDLE_MANIFEST);
        return -1;
    }
    memcpy(s->root, dir, n);
    s->root[n] = '\0';
    char *text = read_manifest_text(s->root, err, err_len);
    if (!text) return -1;
    read_state r = {NULL, 0, 0, why, sizeof why, 0};
    each_line(text, check_one, &r);
    free(text);
    if (r.failed) {
        cache_set_msg(err, err_len, "bundle folder %s: %s", s->root, why);
        return -1;
    }
    return 0;
}

/* ---- verification ---- */

/* The SM a cubin was built for, -1 when its header does not say in a way we
 * know, or -2 when it is no CUDA ELF. EF_CUDA_SM sits in bits 0-7 of e_flags
 * up to ELF ABI version 7 (0x00500550 for sm_80) and in bits 8-15 from
 * version 8 (NVRTC 13 writes 0x06005604 for sm_86). */
static int cubin_arch(const unsigned char *b, size_t len) {
    if (len < 64 || memcmp(b, "\177ELF", 4) != 0 || b[4] != 2) return -2;
    if ((b[18] | b[19] << 8) != 190) return -2; /* EM_CUDA */
    uint32_t flags = (uint32_t)b[48] | (uint32_t)b[49] << 8 | (uint32_t)b[50] << 16 |
                     (uint32_t)b[51] << 24;
    int abi = b[8];
    if (abi <= 7) return (int)(flags & 0xff);
    if (abi == 8) return (int)((flags >> 8) & 0xff);
    return -1;
}

/* What the file at (target, key) holds. Returns 1 when it checks out, else 0
 * with why; kernel receives the payload's kernel name when it unpacks. */
static int check_file(const cache_store *bundle, const char *target, const char *key,
                      char *kernel, size_t kernel_len, char *why, size_t why_len) {
    void *payload = NULL;
    size_t len = 0;
    kernel[0] = '\0';
    if (!cache_store_load(bundle, target, key, &payload, &len)) {
        cache_set_msg(why, why_len, "the store rejects it: bad header, length or checksum");
        return 0;
    }
    cache_payload_info info;
    size_t cubin_len = 0;
    const unsigned char *cubin = cache_payload_unpack(payload, len, &info, &cubin_len);
    int ok = 0;
    /* Kernel names carry the target without its underscore: _sm90a_ for
     * sm_90a. The cubin header has the SM number only (an sm_90a cubin's
     * e_flags are sm_90's), so the name is what tells the two apart. */
    char tag[32];
    snprintf(tag, sizeof tag, "_sm%s_", target + 3);
    int sm = cache_target_sm(target);
    if (!cubin) {
        cache_set_msg(why, why_len, "its payload is malformed");
    } else {
        snprintf(kernel, kernel_len, "%s", info.kernel_name);
        int built_for = cubin_arch(cubin, cubin_len);
        if (strstr(info.kernel_name, tag) == NULL)
            cache_set_msg(why, why_len, "it holds %s, not a kernel for %s", info.kernel_name,
                          target);
        else if (built_for == -2)
            cache_set_msg(why, why_len, "its binary is not a CUDA cubin");
        else if (built_for >= 0 && built_for != sm)
            cache_set_msg(why, why_len, "its cubin is for SM %d, not %s", built_for, target);
        else
            ok = 1;
    }
    free(payload);
    return ok;
}

typedef struct listed {
    char target[CACHE_TARGET_SIZE];
    char key[65];
} listed;

static int listed_cmp(const void *a, const void *b) {
    const listed *x = a, *y = b;
    int c = strcmp(x->target, y->target);
    return c != 0 ? c : strcmp(x->key, y->key);
}

typedef struct verify_state {
    const char *dir;
    const cache_store *bundle;
    const char *generator;   /* the version whose keys are looked up */
    const char *only_target; /* NULL: every target */
    bundle_check_fn fn;
    void *user;
    bundle_verify_result *result;
    listed *seen;
    size_t seen_count, seen_cap;
    int out_of_memory;
} verify_state;

static void report(verify_state *v, const bundle_entry *e, int line, bundle_verdict verdict,
                   const char *note) {
    if (verdict == BUNDLE_ENTRY_OK) v->result->ok++;
    if (verdict == BUNDLE_ENTRY_SKIPPED) v->result->skipped++;
    if (verdict == BUNDLE_ENTRY_REJECTED) v->result->rejected++;
    if (v->fn) v->fn(e, line, verdict, note, v->user);
}

static void remember(verify_state *v, const char *target, const char *key) {
    if (v->seen_count == v->seen_cap) {
        size_t cap = v->seen_cap ? 2 * v->seen_cap : 256;
        listed *grown = realloc(v->seen, cap * sizeof *grown);
        if (!grown) {
            v->out_of_memory = 1;
            return;
        }
        v->seen = grown, v->seen_cap = cap;
    }
    snprintf(v->seen[v->seen_count].target, sizeof v->seen[0].target, "%s", target);
    snprintf(v->seen[v->seen_count].key, sizeof v->seen[0].key, "%s", key);
    v->seen_count++;
}

static void verify_line(char *line, int number, void *user) {
    verify_state *v = user;
    bundle_entry e;
    char why[512], path[PATH_BUF], sha[65], kernel[160], note[1024];
    if (bundle_entry_parse(line, &e, why, sizeof why) != 0) {
        memset(&e, 0, sizeof e);
        snprintf(note, sizeof note, "malformed line: %s", why);
        report(v, &e, number, BUNDLE_ENTRY_REJECTED, note);
        return;
    }
    remember(v, e.target, e.key); /* a listed file is not reported again as unlisted */
    if (e.format != CACHE_FORMAT_VERSION) {
        snprintf(note, sizeof note,
                 "format %d: this flashgen reads format %d, so the entry is never looked up",
                 e.format, CACHE_FORMAT_VERSION);
        report(v, &e, number, BUNDLE_ENTRY_SKIPPED, note);
        return;
    }
    if (strcmp(e.generator, v->generator) != 0) {
        snprintf(note, sizeof note,
                 "generator %s: this is %s, whose keys never name this entry", e.generator,
                 v->generator);
        report(v, &e, number, BUNDLE_ENTRY_SKIPPED, note);
        return;
    }
    if (v->only_target && strcmp(e.target, v->only_target) != 0) {
        snprintf(note, sizeof note, "for %s, not %s", e.target, v->only_target);
        report(v, &e, number, BUNDLE_ENTRY_SKIPPED, note);
        return;
    }
    cache_entry_path(v->bundle, e.target, e.key, path, sizeof path);
    if (bundle_file_sha256(path, sha, why, sizeof why) != 0) {
        snprintf(note, sizeof note, "missing or unreadable: %s", why);
        report(v, &e, number, BUNDLE_ENTRY_REJECTED, note);
        return;
    }
    if (strcmp(sha, e.sha256) != 0) {
        snprintf(note, sizeof note,
                 "damaged or replaced: the file's sha256 is %.16s..., the manifest's %.16s...",
                 sha, e.sha256);
        report(v, &e, number, BUNDLE_ENTRY_REJECTED, note);
        return;
    }
    if (!check_file(v->bundle, e.target, e.key, kernel, sizeof kernel, why, sizeof why)) {
        report(v, &e, number, BUNDLE_ENTRY_REJECTED, why);
        return;
    }
    if (strcmp(kernel, e.kernel) != 0) {
        snprintf(note, sizeof note, "the file holds %s, the manifest says %s", kernel, e.kernel);
        report(v, &e, number, BUNDLE_ENTRY_REJECTED, note);
        return;
    }
    report(v, &e, number, BUNDLE_ENTRY_OK, "");
}

/* .fgc files in target folders that no line lists. */
static void verify_unlisted(verify_state *v) {
    DIR *top = opendir(v->dir);
    if (!top) return;
    qsort(v->seen, v->seen_count, sizeof *v->seen, listed_cmp);
    struct dirent *d;
    while ((d = readdir(top)) != NULL) {
        if (!cache_target_valid(d->d_name)) continue;
        const char *target = d->d_name;
        char folder[PATH_BUF];
        snprintf(folder, sizeof folder, "%s/%s", v->dir, d->d_name);
        DIR *sub = opendir(folder);
        if (!sub) continue;
        struct dirent *f;
        while ((f = readdir(sub)) != NULL) {
            size_t n = strlen(f->d_name);
            if (n != 64 + 4 || strcmp(f->d_name + 64, ".fgc") != 0) continue;
            listed probe;
            snprintf(probe.target, sizeof probe.target, "%.*s", CACHE_TARGET_MAX, target);
            memcpy(probe.key, f->d_name, 64);
            probe.key[64] = '\0';
            if (!is_hex64(probe.key)) continue;
            if (bsearch(&probe, v->seen, v->seen_count, sizeof *v->seen, listed_cmp)) continue;
            bundle_entry e;
            memset(&e, 0, sizeof e);
            snprintf(e.target, sizeof e.target, "%.*s", CACHE_TARGET_MAX, target);
            memcpy(e.key, probe.key, sizeof e.key);
            char why[512], note[1024];
            v->result->unlisted++;
            if (v->only_target && strcmp(target, v->only_target) != 0) {
                snprintf(note, sizeof note, "not in the manifest; for %s, not %s", target,
                         v->only_target);
                report(v, &e, 0, BUNDLE_ENTRY_SKIPPED, note);
            } else if (!check_file(v->bundle, target, probe.key, e.kernel, sizeof e.kernel, why,
                                   sizeof why)) {
                snprintf(note, sizeof note, "not in the manifest, and %s", why);
                report(v, &e, 0, BUNDLE_ENTRY_REJECTED, note);
            } else {
                report(v, &e, 0, BUNDLE_ENTRY_SKIPPED,
                       "not in the manifest (left by a failed or interrupted build?)");
            }
        }
        closedir(sub);
    }
    closedir(top);
}

int bundle_verify(const char *dir, const char *generator, const char *only_target,
                  bundle_check_fn fn, void *user, bundle_verify_result *result, char *err,
                  size_t err_len) {
    memset(result, 0, sizeof *result);
    /* Which entries a program would look up depends on its generator: the
     * caller says which, so this file needs nothing from the generator. */
    if (!generator || !generator[0]) {
        cache_set_msg(err, err_len, "bundle verify: no generator version given");
        return -1;
    }
    if (only_target && !only_target[0]) only_target = NULL;
    if (only_target && !cache_target_valid(only_target)) {
        cache_set_msg(err, err_len, "'%.32s' is not a target name such as sm_90 or sm_90a",
                      only_target);
        return -1;
    }
    cache_store bundle;
    if (bundle_open(&bundle, dir, err, err_len) != 0) return -1;
    char *text = read_manifest_text(bundle.root, err, err_len);
    if (!text) return -1;
    verify_state v = {bundle.root, &bundle, generator, only_target, fn, user, result,
                      NULL, 0, 0, 0};
    each_line(text, verify_line, &v);
    free(text);
    if (!v.out_of_memory) verify_unlisted(&v);
    free(v.seen);
    if (v.out_of_memory) {
        cache_set_msg(err, err_len, "verifying %s: out of memory", dir);
        return -1;
    }
    return 0;
}
