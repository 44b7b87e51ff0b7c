/* Keeping a store to its size cap: the least recently used entries (oldest
 * mtime, see store.c) go first. Run by cache_store_save after each save.
 * Two evictions at once may together remove a little more than needed,
 * which only costs recompiles. */
#include "cache/internal.h"

#include <stdlib.h>
#include <string.h>

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

int cache_evict(const cache_store *s, uint64_t max_bytes, const char *keep_target,
                const char *keep_key, cache_removal *removed, uint64_t *remaining, char *msg,
                size_t msg_len) {
    cache_removal none;
    if (removed == NULL) removed = &none;
    memset(removed, 0, sizeof *removed);
    cache_walk w;
    if (cache_walk_store(s, NULL, 0, CACHE_TEMPS_STALE, removed, &w, msg, msg_len) != 0)
        return -1;
    uint64_t total = 0;
    for (size_t i = 0; i < w.count; i++) total += w.entries[i].bytes;
    if (max_bytes > 0 && total > max_bytes) {
        qsort(w.entries, w.count, sizeof *w.entries, by_oldest);
        for (size_t i = 0; i < w.count && total > max_bytes; i++) {
            const cache_entry_info *e = &w.entries[i];
            if (keep_key != NULL && keep_target != NULL && strcmp(e->target, keep_target) == 0 &&
                strcmp(e->key, keep_key) == 0)
                continue;
            if (!cache_remove_if_unchanged(s, e, 0, 0, 0)) continue;
            removed->files++;
            removed->bytes += e->bytes;
            total -= e->bytes;
        }
    }
    cache_walk_free(&w);
    if (remaining != NULL) *remaining = total;
    return 0;
}
