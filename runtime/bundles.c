/* A context's bundles: the read-only folders searched before the user's
 * cache (FLASHGEN_BUNDLE_PATH, fg_context_add_bundle), and the output of a
 * bundle build. The lookup itself is in compile_plan (kernels.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime.h"

static fg_status append_bundle(fg_context *ctx, const cache_store *s) {
    bundle_set *b = &ctx->bundles;
    cache_store *grown = realloc(b->dirs, (size_t)(b->count + 1) * sizeof *grown);
    if (!grown) return fg_fail(ctx, FG_ERR_OUT_OF_MEMORY, "bundles: out of memory");
    b->dirs = grown;
    b->dirs[b->count++] = *s;
    return FG_OK;
}

fg_status fg_context_add_bundle(fg_context *ctx, const char *dir) {
    char err[1200];
    cache_store s;
    if (!ctx) return fg_fail(NULL, FG_ERR_INVALID_ARGUMENT, "ctx: NULL context");
    if (!dir || !dir[0]) return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "dir: NULL or empty");
    if (bundle_open(&s, dir, err, sizeof err) != 0)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "dir: %s", err);
    return append_bundle(ctx, &s);
}

/* A search path lists folders that may or may not be there on a given
 * machine (like PATH), so one that is not a bundle is passed over rather than
 * failing the context; fg_context_add_bundle is the strict way in. */
fg_status bundles_from_env(fg_context *ctx) {
    const char *env = getenv("FLASHGEN_BUNDLE_PATH");
    if (!env || !env[0]) return FG_OK;
    char dir[1024], err[1200];
    for (const char *p = env; *p;) {
        size_t n = strcspn(p, ":");
        cache_store s;
        if (n > 0 && n < sizeof dir) {
            memcpy(dir, p, n);
            dir[n] = '\0';
            fg_status st = bundle_open(&s, dir, err, sizeof err) == 0 ? append_bundle(ctx, &s) : FG_OK;
            if (st) return st;
        }
        p += n;
        if (*p == ':') p++;
    }
    return FG_OK;
}

void bundles_release(fg_context *ctx) {
    free(ctx->bundles.dirs);
    memset(&ctx->bundles, 0, sizeof ctx->bundles);
}

fg_status bundles_build_into(fg_context *ctx, const char *dir, bundle_saved_fn saved,
                             void *user) {
    char err[1200];
    if (!ctx || !dir || !dir[0])
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "bundle build: no output folder");
    if (bundle_make_dir(dir, err, sizeof err) != 0)
        return fg_fail(ctx, FG_ERR_CACHE, "bundle build: %s", err);
    bundle_set *b = &ctx->bundles;
    /* Set up by hand, not with cache_store_open: that would give the store
     * the user cache's size cap, and eviction must never thin out a bundle. */
    memset(&b->out, 0, sizeof b->out);
    if (snprintf(b->out.root, sizeof b->out.root, "%s", dir) >= (int)sizeof b->out.root)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "bundle build: output path too long");
    b->out.writable = 1;
    b->building = 1;
    b->saved = saved;
    b->saved_user = user;
    return FG_OK;
}
