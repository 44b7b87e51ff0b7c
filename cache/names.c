/* What may name a folder or a file in a store, and the paths built from
 * those names.
 *
 * Targets are named as NVRTC spells them ("sm_75", "sm_90", "sm_90a"). A
 * name becomes a folder's name and goes into the key, so the grammar is
 * narrow: "sm_", a number with no leading zero, and at most one suffix
 * letter, 'a' (arch-specific) or 'f' (family). The scan accepts exactly what
 * a save accepts, so every entry written is also seen by eviction, listing
 * and clearing. Keys are hex digits only. */
#include "cache/internal.h"

#include <stdio.h>
#include <string.h>

/* The digits after "sm_" and their count; 0 when name is no target name. */
static size_t target_digits(const char *name, const char **digits) {
    if (name == NULL || strncmp(name, "sm_", 3) != 0) return 0;
    const char *p = name + 3;
    size_t n = strspn(p, "0123456789");
    if (n == 0 || p[0] == '0') return 0;
    const char *rest = p + n;
    if (rest[0] != '\0' && !((rest[0] == 'a' || rest[0] == 'f') && rest[1] == '\0')) return 0;
    if (strlen(name) > CACHE_TARGET_MAX) return 0;
    *digits = p;
    return n;
}

int cache_target_valid(const char *name) {
    const char *d;
    return target_digits(name, &d) > 0;
}

int cache_target_parse(const char *text, char target[CACHE_TARGET_SIZE]) {
    char buf[CACHE_TARGET_SIZE + 3];
    target[0] = '\0';
    if (text == NULL) return -1;
    if (strncmp(text, "sm_", 3) == 0) text += 3;
    int n = snprintf(buf, sizeof buf, "sm_%s", text);
    if (n < 0 || (size_t)n >= sizeof buf || !cache_target_valid(buf)) return -1;
    memcpy(target, buf, (size_t)n + 1);
    return 0;
}

int cache_target_sm(const char *target) {
    const char *d;
    size_t n = target_digits(target, &d);
    if (n == 0 || n > 6) return -1;
    int v = 0;
    for (size_t i = 0; i < n; i++) v = v * 10 + (d[i] - '0');
    return v;
}

int cache_target_cmp(const char *a, const char *b) {
    const char *da, *db;
    size_t na = target_digits(a, &da), nb = target_digits(b, &db);
    if (na == 0 || nb == 0) { /* not names: after the names, in byte order */
        if (na != nb) return na == 0 ? 1 : -1;
        int c = strcmp(a ? a : "", b ? b : "");
        return (c > 0) - (c < 0);
    }
    /* No leading zeros: more digits is a larger number. */
    if (na != nb) return na < nb ? -1 : 1;
    int c = strncmp(da, db, na);
    if (c != 0) return c < 0 ? -1 : 1;
    c = strcmp(da + na, db + nb); /* "" < "a" < "f" */
    return (c > 0) - (c < 0);
}

int cache_key_valid(const char *key) {
    if (key == NULL) return 0;
    size_t n = 0;
    for (; key[n] != '\0'; n++) {
        char c = key[n];
        int hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
        if (!hex || n >= 128) return 0;
    }
    return n > 0;
}

int cache_key_of_file(const char *name, char key[129]) {
    size_t n = strlen(name), s = strlen(CACHE_ENTRY_SUFFIX);
    if (n <= s || n - s > 128 || strcmp(name + n - s, CACHE_ENTRY_SUFFIX) != 0) return 0;
    for (size_t i = 0; i < n - s; i++) {
        char c = name[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')))
            return 0;
    }
    memcpy(key, name, n - s);
    key[n - s] = '\0';
    return 1;
}

int cache_entry_path(const cache_store *s, const char *target, const char *key_hex, char *path,
                     size_t len) {
    if (path == NULL || len == 0) return -1;
    path[0] = '\0';
    if (!cache_target_valid(target) || !cache_key_valid(key_hex)) return -1;
    int n = snprintf(path, len, "%s/%s/%s" CACHE_ENTRY_SUFFIX, s->root, target, key_hex);
    if (n < 0 || (size_t)n >= len) {
        path[0] = '\0';
        return -1;
    }
    return 0;
}
