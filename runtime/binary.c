/* A kernel's cubin. Lookup order: the context's bundles (portable key, no
 * NVRTC), then the user's store (its key needs the NVRTC version, so NVRTC
 * is loaded only now), then NVRTC, saving into the store. A bundle build
 * skips the bundles and saves every step it gets from the store or NVRTC
 * into its output bundle as well.
 *
 * An entry's payload is a small text header with the compile report
 * followed by the cubin (cache/payload.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime.h"

void *binary_pack(const fg_kernel_info *info, const void *cubin, size_t cubin_len, size_t *len) {
    cache_payload_info p = {info->registers, info->spill_bytes, info->stack_bytes,
                            info->smem_static, ""};
    snprintf(p.kernel_name, sizeof p.kernel_name, "%s", info->plan.kernel_name);
    return cache_payload_pack(&p, cubin, cubin_len, len);
}

const void *binary_unpack(const void *payload, size_t len, fg_kernel_info *info) {
    cache_payload_info p;
    const void *cubin = cache_payload_unpack(payload, len, &p, NULL);
    if (!cubin || strcmp(p.kernel_name, info->plan.kernel_name) != 0) return NULL;
    info->registers = p.registers, info->spill_bytes = p.spill_bytes;
    info->stack_bytes = p.stack_bytes, info->smem_static = p.smem_static;
    return cubin;
}

/* The user's store: a hit fills k->info's report (and, in a bundle build,
 * goes into the bundle too). 1 on a hit. */
static int store_lookup(fg_context *ctx, fg_kernel *k, const char *target, const char *key,
                        const char *pkey, void **owned, const void **image, fg_status *st) {
    void *payload = NULL;
    size_t len = 0;
    if (!cache_store_load(&ctx->store, target, key, &payload, &len)) return 0;
    *image = binary_unpack(payload, len, &k->info);
    if (!*image) {
        free(payload); /* malformed: compile and save over it */
        return 0;
    }
    k->info.from_cache = 1;
    k->info.compile_ms = 0;
    *st = ctx->bundles.building ? bundles_save(ctx, k, pkey, payload, len) : FG_OK;
    if (*st) {
        free(payload);
        *image = NULL;
    } else {
        *owned = payload;
    }
    return 1;
}

/* A fresh cubin into the store (a failed save only costs a later
 * recompile) and, in a bundle build, into the bundle. */
static fg_status save(fg_context *ctx, const fg_kernel *k, const char *target, const char *key,
                      const char *pkey, const void *cubin, size_t cubin_len) {
    int to_store = !ctx->cache_disabled && ctx->store.writable;
    if (!to_store && !ctx->bundles.building) return FG_OK;
    size_t len = 0;
    void *packed = binary_pack(&k->info, cubin, cubin_len, &len);
    char err[1200];
    if (packed && to_store) cache_store_save(&ctx->store, target, key, packed, len, err, sizeof err);
    fg_status st = FG_OK;
    if (ctx->bundles.building)
        st = packed ? bundles_save(ctx, k, pkey, packed, len)
                    : fg_fail(ctx, FG_ERR_OUT_OF_MEMORY, "bundle build: out of memory");
    free(packed);
    return st;
}

fg_status binary_get(fg_context *ctx, fg_kernel *k, const generated *g, void **owned,
                     const void **image) {
    char err[8192], target[16];
    *owned = NULL;
    *image = NULL;
    k->info.cache_path[0] = '\0'; /* not a previous step's */
    target_name(&k->target, target, sizeof target);
    char pkey[65];
    int building = ctx->bundles.building;
    if (ctx->bundles.count > 0 || building) bundles_key(g->source, &k->target, pkey);
    if (ctx->bundles.count > 0 && !building) {
        bundles_lookup(ctx, k, pkey, owned, image);
        if (*image) return FG_OK;
    }

    if (nvrtc_lib_load(err, sizeof err) != 0) {
        if (ctx->bundles.count == 0 || building) return fg_fail(ctx, FG_ERR_COMPILE, "%s", err);
        char more[32] = "";
        if (ctx->bundles.count > 1)
            snprintf(more, sizeof more, " and %d more", ctx->bundles.count - 1);
        return fg_fail(ctx, FG_ERR_COMPILE,
                       "%s for %s is in no bundle (searched %s%s) and NVRTC could not be loaded "
                       "to compile it: %s",
                       g->kernel_name, target, ctx->bundles.dirs[0].root, more, err);
    }
    char options[512], key[65];
    int major = 0, minor = 0;
    nvrtc_base_options(target, options, sizeof options);
    nvrtc_lib_version(&major, &minor);
    cache_key_input in = {g->source, options, target, major, minor, FG_GENERATOR_VERSION};
    cache_key(&in, key);
    fg_status st = FG_OK;
    if (!ctx->cache_disabled) {
        cache_entry_path(&ctx->store, target, key, k->info.cache_path, sizeof k->info.cache_path);
        if (store_lookup(ctx, k, target, key, pkey, owned, image, &st)) return st;
    }
    void *cubin = NULL;
    size_t cubin_len = 0;
    if ((st = compile_cubin(ctx, k, g, &cubin, &cubin_len))) return st;
    if ((st = save(ctx, k, target, key, pkey, cubin, cubin_len))) {
        free(cubin);
        return st;
    }
    *owned = cubin;
    *image = cubin;
    return FG_OK;
}
