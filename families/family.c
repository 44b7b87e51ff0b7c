/* What every family's file shares: its own types in and out of the
 * interface's, and tilings as text. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "families/family.h"

#include "gen/spec.h"

void family_tiling_pack(family_tiling *t, const void *own, size_t size) {
    memset(t, 0, sizeof *t);
    memcpy(t, own, size < sizeof *t ? size : sizeof *t);
}

void family_tiling_unpack(const family_tiling *t, void *own, size_t size) {
    memcpy(own, t, size < sizeof *t ? size : sizeof *t);
}

void family_plan_info(fg_plan_info *out, int block_m, int block_n, int warps, int stages,
                      int head_dim_padded, int smem_bytes, int threads, const char *why) {
    memset(out, 0, sizeof *out);
    out->block_m = block_m, out->block_n = block_n, out->warps = warps, out->stages = stages;
    out->head_dim_padded = head_dim_padded, out->smem_bytes = smem_bytes, out->threads = threads;
    snprintf(out->why, sizeof out->why, "%s", why);
}

void family_choice_format(const kernel_family *f, const family_tiling *t, char *buf, size_t len) {
    size_t n = (size_t)snprintf(buf, len, "%s:", f->name);
    for (int i = 0; i < f->tiling_ints && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%d", i ? "," : "", t->v[i]);
}

int family_choice_parse(const char *text, const kernel_family **f, family_tiling *t) {
    char name[64];
    const char *colon = strchr(text, ':');
    if (!colon || (size_t)(colon - text) >= sizeof name) return -1;
    memcpy(name, text, (size_t)(colon - text));
    name[colon - text] = '\0';
    memset(t, 0, sizeof *t);
    *f = family_named(name);
    if (!*f) return -1;
    /* exactly tiling_ints numbers, comma-separated */
    const char *at = colon + 1;
    for (int i = 0; i < (*f)->tiling_ints; i++) {
        char *end;
        long v = strtol(at, &end, 10);
        if (end == at || v < INT_MIN || v > INT_MAX) return -1;
        t->v[i] = (int)v;
        if (*end != (i + 1 < (*f)->tiling_ints ? ',' : '\0')) return -1;
        at = end + 1;
    }
    return 0;
}
