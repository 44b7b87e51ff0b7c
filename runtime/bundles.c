/* A context's bundles: the read-only folders searched before the user's
 * cache (FLASHGEN_BUNDLE_PATH, fg_context_add_bundle), lookups in them, and
 * the output of a bundle build. The lookup order is binary.c's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen/spec.h"
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
 * machine (like PATH), so one that is not a bundle (bundle_open: what
 * `flashgen bundle verify` refuses too) is passed over rather than
 * failing the context, with a warning for the compile log (a misspelt entry
 * would otherwise only show as slow compiles); fg_context_add_bundle is the
 * strict way in. */
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
            if (bundle_open(&s, dir, err, sizeof err) == 0) {
                fg_status st = append_bundle(ctx, &s);
                if (st) return st;
            } else {
                size_t used = strlen(ctx->cache_warning);
                snprintf(ctx->cache_warning + used, sizeof ctx->cache_warning - used,
                         "%sFLASHGEN_BUNDLE_PATH: %s (passed over)", used ? "; " : "", err);
            }
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

fg_status tools_bundle_build_into(fg_context *ctx, const char *dir, bundle_saved_fn saved,
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

/* The portable key: cache_key() with the NVRTC version left at 0.0 and
 * options that do not depend on it, so it is computed without loading NVRTC.
 * Bundles file entries under it; the user's store keeps the NVRTC version in
 * its key (a new NVRTC must not reuse its predecessor's cubins silently),
 * while a bundle is one fixed set of binaries whose NVRTC its manifest names. */
void bundles_key(const char *source, const kernel_target *target, char key[65]) {
    char options[512], name[16];
    target_name(target, name, sizeof name);
    nvrtc_portable_options(name, options, sizeof options);
    cache_key_input in = {source, options, name, 0, 0, FG_GENERATOR_VERSION};
    cache_key(&in, key);
}

void bundles_lookup(fg_context *ctx, fg_kernel *k, const char *key, void **owned,
                    const void **image) {
    char target[16];
    target_name(&k->target, target, sizeof target);
    *image = NULL;
    for (int i = 0; i < ctx->bundles.count; i++) {
        const cache_store *b = &ctx->bundles.dirs[i];
        void *payload = NULL;
        size_t len = 0;
        if (!cache_store_load(b, target, key, &payload, &len)) continue;
        *image = binary_unpack(payload, len, &k->info);
        if (!*image) { /* damaged, or another kernel (copied in from another arch) */
            free(payload);
            continue;
        }
        k->info.from_cache = 3;
        k->info.compile_ms = 0;
        cache_entry_path(b, target, key, k->info.cache_path, sizeof k->info.cache_path);
        *owned = payload;
        return;
    }
}

/* A failure fails the build of this kernel: a bundle that silently lacks it
 * would send its users to NVRTC. */
fg_status bundles_save(fg_context *ctx, const fg_kernel *k, const char *key, const void *payload,
                       size_t len) {
    bundle_set *b = &ctx->bundles;
    char err[1200], path[1200], target[16];
    target_name(&k->target, target, sizeof target);
    if (cache_store_save(&b->out, target, key, payload, len, err, sizeof err) != 0)
        return fg_fail(ctx, FG_ERR_CACHE, "bundle build: %s", err);
    bundle_entry e;
    memset(&e, 0, sizeof e);
    cache_entry_path(&b->out, target, key, path, sizeof path);
    if (bundle_file_sha256(path, e.sha256, err, sizeof err) != 0)
        return fg_fail(ctx, FG_ERR_CACHE, "bundle build: %s", err);
    int major = 0, minor = 0;
    nvrtc_lib_version(&major, &minor);
    family_tiling t;
    k->family->tiling_of(&k->plan, &t);
    snprintf(e.pass, sizeof e.pass, "%s", pass_name(k->family->pass));
    spec_name(&k->spec, e.spec, sizeof e.spec);
    snprintf(e.kernel, sizeof e.kernel, "%s", k->info.plan.kernel_name);
    family_choice_format(k->family, &t, e.plan, sizeof e.plan);
    snprintf(e.target, sizeof e.target, "%s", target);
    snprintf(e.key, sizeof e.key, "%s", key);
    snprintf(e.generator, sizeof e.generator, "%s", FG_GENERATOR_VERSION);
    snprintf(e.nvrtc, sizeof e.nvrtc, "%d.%d", major, minor);
    e.format = CACHE_FORMAT_VERSION;
    if (b->saved) b->saved(&e, b->saved_user);
    return FG_OK;
}
