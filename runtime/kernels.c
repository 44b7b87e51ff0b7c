/* The kernel table: canonical spec -> plan -> source -> cubin -> function.
 *
 * Lookup order: the context's table (no generation, hashing or I/O), then
 * the context's bundles (portable key, no NVRTC), then the disk cache (key
 * over source, options, arch, NVRTC and generator versions), then NVRTC. A
 * cache entry's payload is a small text header with the compile report
 * followed by the cubin. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gen/generate.h"
#include "gen/spec.h"
#include "runtime/runtime.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ---- the two passes behind one interface ---- */

static int plan_kernel(fg_kernel *k, const fg_profile *prof, int budget, char *err,
                       size_t err_len) {
    if (k->pass == FG_PASS_BACKWARD)
        return k->tiling.warps
                   ? plan_backward_tiling(&k->spec, prof, &k->tiling, &k->bwd_plan, err, err_len)
                   : plan_backward_budget(&k->spec, prof, budget, &k->bwd_plan, err, err_len);
    if (k->tiling.warps)
        return plan_forward_tiling(&k->spec, prof, &k->tiling, &k->plan, err, err_len);
    return plan_forward_budget(&k->spec, prof, budget, &k->plan, err, err_len);
}

static int generate_kernel(const fg_kernel *k, int arch, char **source, char *name,
                           size_t name_len, char *err, size_t err_len) {
    if (k->pass == FG_PASS_BACKWARD)
        return generate_backward(&k->spec, &k->bwd_plan, arch, source, name, name_len, err,
                                 err_len);
    return generate_forward(&k->spec, &k->plan, arch, source, name, name_len, err, err_len);
}

static int accumulators_of(const fg_kernel *k) {
    return k->pass == FG_PASS_BACKWARD ? k->bwd_plan.accumulator_registers
                                       : k->plan.accumulator_registers;
}

static int budget_of(const fg_kernel *k) {
    return k->pass == FG_PASS_BACKWARD ? k->bwd_plan.register_budget : k->plan.register_budget;
}

static int smem_of(const fg_kernel *k) {
    return k->pass == FG_PASS_BACKWARD ? k->bwd_plan.smem_bytes : k->plan.smem_bytes;
}

static void fill_plan_info(const fg_kernel *k, const char *name, fg_plan_info *out) {
    memset(out, 0, sizeof *out);
    if (k->pass == FG_PASS_BACKWARD) {
        const fg_bwd_plan *b = &k->bwd_plan;
        out->block_m = b->block_m, out->block_n = b->block_n, out->warps = b->warps;
        out->stages = b->stages, out->head_dim_padded = b->head_dim_padded;
        out->smem_bytes = b->smem_bytes, out->threads = b->threads;
        snprintf(out->why, sizeof out->why, "%s", b->why);
    } else {
        const fg_fwd_plan *f = &k->plan;
        out->block_m = f->block_m, out->block_n = f->block_n, out->warps = f->warps;
        out->stages = f->stages, out->head_dim_padded = f->head_dim_padded;
        out->smem_bytes = f->smem_bytes, out->threads = f->threads;
        snprintf(out->why, sizeof out->why, "%s", f->why);
    }
    snprintf(out->kernel_name, sizeof out->kernel_name, "%s", name);
}

static void *pack_payload(const fg_kernel_info *info, const void *cubin, size_t cubin_len,
                          size_t *len) {
    cache_payload_info p = {info->registers, info->spill_bytes, info->stack_bytes,
                            info->smem_static, ""};
    snprintf(p.kernel_name, sizeof p.kernel_name, "%s", info->plan.kernel_name);
    return cache_payload_pack(&p, cubin, cubin_len, len);
}

/* The cubin inside a payload, or NULL if it is malformed or holds another
 * kernel than the one planned. */
static const void *unpack_payload(const void *payload, size_t len, fg_kernel_info *info) {
    cache_payload_info p;
    const void *cubin = cache_payload_unpack(payload, len, &p, NULL);
    if (!cubin || strcmp(p.kernel_name, info->plan.kernel_name) != 0) return NULL;
    info->registers = p.registers, info->spill_bytes = p.spill_bytes;
    info->stack_bytes = p.stack_bytes, info->smem_static = p.smem_static;
    return cubin;
}

static fg_status load_module(fg_context *ctx, fg_kernel *k, const void *cubin) {
    fg_status st = fg_make_current(ctx);
    if (st) return st;
    const cuda_driver *cu = ctx->cu;
    if ((st = fg_cuda_check(ctx, cu->cuModuleLoadData(&k->module, cubin), "cuModuleLoadData")))
        return st;
    const char *name = k->info.plan.kernel_name;
    if ((st = fg_cuda_check(ctx, cu->cuModuleGetFunction(&k->function, k->module, name),
                            "cuModuleGetFunction")))
        return st;
    if (k->pass == FG_PASS_BACKWARD) {
        char pre[160], post[160];
        snprintf(pre, sizeof pre, "%s_pre", name);
        snprintf(post, sizeof post, "%s_post", name);
        if ((st = fg_cuda_check(ctx, cu->cuModuleGetFunction(&k->pre, k->module, pre),
                                "cuModuleGetFunction(pre)")) ||
            (st = fg_cuda_check(ctx, cu->cuModuleGetFunction(&k->post, k->module, post),
                                "cuModuleGetFunction(post)")))
            return st;
    }
    return fg_cuda_check(ctx,
                         cu->cuFuncSetAttribute(k->function,
                                                CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                smem_of(k)),
                         "cuFuncSetAttribute(shared memory)");
}

/* The portable key: cache_key() with the NVRTC version left at 0.0 and
 * options that do not depend on it, so it is computed without loading NVRTC.
 * Bundles file entries under it; the user's store keeps the NVRTC version in
 * its key (a new NVRTC must not reuse its predecessor's cubins silently),
 * while a bundle is one fixed set of binaries whose NVRTC its manifest names. */
static void portable_key(const char *source, int arch, const char *target, char key[65]) {
    char options[512];
    nvrtc_portable_options(arch, options, sizeof options);
    cache_key_input in = {source, options, target, 0, 0, FG_GENERATOR_VERSION};
    cache_key(&in, key);
}

/* The name the cache files the context's kernels under, as NVRTC spells the
 * target ("sm_86"). */
static const char *target_name(const fg_context *ctx, char target[CACHE_TARGET_SIZE]) {
    snprintf(target, CACHE_TARGET_SIZE, "sm_%d", ctx->profile.arch);
    return target;
}

/* The first bundle holding the planned kernel under `key`. An entry that is
 * damaged (the store's checksum) or holds another kernel (a file copied in
 * from another arch's folder) is passed over, so it is never loaded. */
static const void *bundle_lookup(fg_context *ctx, fg_kernel *k, const char *key, void **owned) {
    char target[CACHE_TARGET_SIZE];
    target_name(ctx, target);
    for (int i = 0; i < ctx->bundles.count; i++) {
        const cache_store *b = &ctx->bundles.dirs[i];
        void *payload = NULL;
        size_t len = 0;
        if (!cache_store_load(b, target, key, &payload, &len)) continue;
        const void *image = unpack_payload(payload, len, &k->info);
        if (!image) {
            free(payload);
            continue;
        }
        k->info.from_cache = 3;
        k->info.compile_ms = 0;
        cache_entry_path(b, target, key, k->info.cache_path, sizeof k->info.cache_path);
        *owned = payload;
        return image;
    }
    return NULL;
}

/* Bundle builds: save a step's payload in the output bundle under its
 * portable key and report it. A failure fails the build of this kernel: a
 * bundle that silently lacks it would send its users to NVRTC. */
static fg_status bundle_save(fg_context *ctx, const fg_kernel *k, const char *key,
                             const void *payload, size_t len) {
    bundle_set *b = &ctx->bundles;
    char target[CACHE_TARGET_SIZE], err[1200], path[1200];
    target_name(ctx, target);
    if (cache_store_save(&b->out, target, key, payload, len, err, sizeof err) != 0)
        return fg_fail(ctx, FG_ERR_CACHE, "bundle build: %s", err);
    bundle_entry e;
    memset(&e, 0, sizeof e);
    cache_entry_path(&b->out, target, key, path, sizeof path);
    if (bundle_file_sha256(path, e.sha256, err, sizeof err) != 0)
        return fg_fail(ctx, FG_ERR_CACHE, "bundle build: %s", err);
    const fg_plan_info *p = &k->info.plan;
    int major = 0, minor = 0;
    nvrtc_lib_version(&major, &minor);
    snprintf(e.pass, sizeof e.pass, "%s", k->pass == FG_PASS_BACKWARD ? "backward" : "forward");
    spec_name(&k->spec, e.spec, sizeof e.spec);
    snprintf(e.kernel, sizeof e.kernel, "%s", p->kernel_name);
    snprintf(e.plan, sizeof e.plan, "Br=%d,Bc=%d,warps=%d,stages=%d", p->block_m, p->block_n,
             p->warps, p->stages);
    snprintf(e.target, sizeof e.target, "%s", target);
    snprintf(e.key, sizeof e.key, "%s", key);
    snprintf(e.generator, sizeof e.generator, "%s", FG_GENERATOR_VERSION);
    snprintf(e.nvrtc, sizeof e.nvrtc, "%d.%d", major, minor);
    e.format = CACHE_FORMAT_VERSION;
    if (b->saved) b->saved(&e, b->saved_user);
    return FG_OK;
}

/* Plan under `budget`, generate, and find the cubin or compile it. On
 * success *image points into *owned (free it) and k->info holds the report.
 *
 * Lookup order: the context's bundles (portable key, no NVRTC), then the
 * user's store (its key needs the NVRTC version, so NVRTC is loaded only
 * now), then NVRTC. A bundle build skips the bundles and saves every step it
 * gets from the store or NVRTC into its output bundle as well. */
static fg_status compile_plan(fg_context *ctx, fg_kernel *k, int budget, void **owned,
                              const void **image) {
    char err[8192], target[CACHE_TARGET_SIZE];
    int arch = ctx->profile.arch;
    target_name(ctx, target);
    *owned = NULL;
    *image = NULL;
    k->info.cache_path[0] = '\0'; /* not a previous step's */
    if (plan_kernel(k, &ctx->profile, budget, err, sizeof err) != 0)
        return fg_fail(ctx, FG_ERR_UNSUPPORTED, "%s", err);
    char *source = NULL, name[128];
    if (generate_kernel(k, arch, &source, name, sizeof name, err, sizeof err))
        return fg_fail(ctx, FG_ERR_TEMPLATE, "template: %s", err);
    fill_plan_info(k, name, &k->info.plan);

    char pkey[65];
    int building = ctx->bundles.building;
    if (ctx->bundles.count > 0 || building) portable_key(source, arch, target, pkey);
    if (ctx->bundles.count > 0 && !building && (*image = bundle_lookup(ctx, k, pkey, owned))) {
        free(source);
        return FG_OK;
    }

    if (nvrtc_lib_load(err, sizeof err) != 0) {
        free(source);
        if (ctx->bundles.count == 0 || building) return fg_fail(ctx, FG_ERR_COMPILE, "%s", err);
        char more[32] = "";
        if (ctx->bundles.count > 1)
            snprintf(more, sizeof more, " and %d more", ctx->bundles.count - 1);
        return fg_fail(ctx, FG_ERR_COMPILE,
                       "%s for sm_%d is in no bundle (searched %s%s) and NVRTC could not be "
                       "loaded to compile it: %s",
                       name, arch, ctx->bundles.dirs[0].root, more, err);
    }
    char options[512], key[65];
    int major = 0, minor = 0;
    nvrtc_base_options(arch, options, sizeof options);
    nvrtc_lib_version(&major, &minor);
    cache_key_input in = {source, options, target, major, minor, FG_GENERATOR_VERSION};
    cache_key(&in, key);
    if (!ctx->cache_disabled)
        cache_entry_path(&ctx->store, target, key, k->info.cache_path, sizeof k->info.cache_path);

    void *payload = NULL;
    size_t payload_len = 0;
    if (!ctx->cache_disabled &&
        cache_store_load(&ctx->store, target, key, &payload, &payload_len)) {
        *image = unpack_payload(payload, payload_len, &k->info);
        if (*image) {
            k->info.from_cache = 1;
            k->info.compile_ms = 0;
            free(source);
            fg_status st = building ? bundle_save(ctx, k, pkey, payload, payload_len) : FG_OK;
            if (st) {
                free(payload);
                *image = NULL;
                return st;
            }
            *owned = payload;
            return FG_OK;
        }
        free(payload); /* malformed: compile and save over it */
    }
    char *log = NULL;
    nvrtc_resources res;
    void *cubin = NULL;
    size_t cubin_len = 0;
    double t0 = now_ms();
    int rc = nvrtc_compile_cubin(source, name, arch, NULL, 0, &cubin, &cubin_len, &log, &res, err,
                                 sizeof err);
    free(source);
    if (rc != 0) {
        fg_status st = fg_fail(ctx, FG_ERR_COMPILE, "%s\n%s", err, log ? log : "");
        free(log);
        return st;
    }
    free(log);
    k->info.compile_ms = now_ms() - t0;
    k->info.registers = res.registers;
    k->info.spill_bytes = res.spill_stores + res.spill_loads;
    if (ctx->compile_log) {
        char line[512];
        snprintf(line, sizeof line,
                 "flashgen: compiled %s for sm_%d in %.0f ms (%d registers, %d bytes spilled)", name,
                 arch, k->info.compile_ms, k->info.registers, k->info.spill_bytes);
        ctx->compile_log(line, ctx->compile_log_user);
    }
    k->info.stack_bytes = res.stack_bytes;
    k->info.smem_static = res.smem_static;
    k->info.from_cache = 0;
    int to_store = !ctx->cache_disabled && ctx->store.writable;
    if (to_store || building) {
        size_t len = 0;
        void *packed = pack_payload(&k->info, cubin, cubin_len, &len);
        /* a failed save to the user's store only costs a later recompile */
        if (packed && to_store)
            cache_store_save(&ctx->store, target, key, packed, len, err, sizeof err);
        fg_status st = FG_OK;
        if (building)
            st = packed ? bundle_save(ctx, k, pkey, packed, len)
                        : fg_fail(ctx, FG_ERR_OUT_OF_MEMORY, "bundle build: out of memory");
        free(packed);
        if (st) {
            free(cubin);
            return st;
        }
    }
    *owned = cubin;
    *image = cubin;
    return FG_OK;
}

/* Compile the derived plan; while ptxas spills, re-plan under the next
 * smaller register budget (smaller tiles) and compile again. */
static fg_status build(fg_context *ctx, fg_kernel *k, int load) {
    void *owned = NULL;
    const void *image = NULL;
    double total_ms = 0;
    fg_status st = compile_plan(ctx, k, 0, &owned, &image);
    int budget = budget_of(k);
    /* a tiling named by the tuner is kept as it is: the tuner drops it if it spills */
    while (st == FG_OK && k->info.spill_bytes > 0 && !k->tiling.warps) {
        fg_plan_info previous = k->info.plan;
        int previous_acc = accumulators_of(k);
        fg_kernel_info spilled = k->info;
        fg_kernel probe = *k;
        char err[512];
        /* the next budget that changes the tiles, if any; smaller budgets
         * only fit fewer tilings, so one that plans nothing ends the search */
        int planned = 0;
        do {
            budget = plan_next_budget(budget);
            planned = budget && plan_kernel(&probe, &ctx->profile, budget, err, sizeof err) == 0;
        } while (planned && accumulators_of(&probe) >= previous_acc);
        if (!planned) break; /* no smaller tiling: keep the spilling one */
        total_ms += spilled.compile_ms;
        free(owned);
        st = compile_plan(ctx, k, budget, &owned, &image);
        if (st == FG_OK) {
            size_t n = strlen(k->info.plan.why);
            snprintf(k->info.plan.why + n, sizeof k->info.plan.why - n,
                     "Tiles %dx%d spilled %d bytes in ptxas: re-planned under a budget of %d.\n",
                     previous.block_m, previous.block_n, spilled.spill_bytes, budget);
        }
    }
    if (st == FG_OK) {
        k->info.compile_ms += total_ms;
        if (load) st = load_module(ctx, k, image);
    }
    free(owned);
    return st;
}

static int same_kernel(const fg_kernel *k, fg_pass pass, const fg_spec *spec,
                       const plan_tiling *tiling) {
    return k->pass == pass && memcmp(&k->spec, spec, sizeof *spec) == 0 &&
           memcmp(&k->tiling, tiling, sizeof *tiling) == 0;
}

fg_status kernels_get(fg_context *ctx, fg_pass pass, const fg_spec *spec,
                      const plan_tiling *tiling, int load, fg_kernel **out) {
    plan_tiling derived;
    memset(&derived, 0, sizeof derived);
    if (!tiling) tiling = &derived;
    for (int i = 0; i < ctx->kernel_count; i++) {
        fg_kernel *k = &ctx->kernels[i];
        if (!same_kernel(k, pass, spec, tiling)) continue;
        if (load && !k->function) break; /* built offline-style; load below */
        k->info.from_cache = 2;
        k->info.compile_ms = 0;
        *out = k;
        return FG_OK;
    }
    fg_status st = check_spec_for_target(ctx, spec);
    if (st) return st;
    fg_kernel fresh;
    memset(&fresh, 0, sizeof fresh);
    fresh.pass = pass;
    fresh.spec = *spec;
    fresh.tiling = *tiling;
    if ((st = build(ctx, &fresh, load))) {
        if (fresh.module) ctx->cu->cuModuleUnload(fresh.module);
        return st;
    }
    for (int i = 0; i < ctx->kernel_count; i++) {
        if (same_kernel(&ctx->kernels[i], pass, spec, tiling)) {
            ctx->kernels[i] = fresh; /* replaces an entry that was not loaded */
            *out = &ctx->kernels[i];
            return FG_OK;
        }
    }
    if (ctx->kernel_count == ctx->kernel_capacity) {
        int cap = ctx->kernel_capacity ? 2 * ctx->kernel_capacity : 16;
        fg_kernel *grown = realloc(ctx->kernels, (size_t)cap * sizeof *grown);
        if (!grown) {
            if (fresh.module) ctx->cu->cuModuleUnload(fresh.module);
            return fg_fail(ctx, FG_ERR_OUT_OF_MEMORY, "kernel table: out of memory");
        }
        ctx->kernels = grown;
        ctx->kernel_capacity = cap;
    }
    ctx->kernels[ctx->kernel_count] = fresh;
    *out = &ctx->kernels[ctx->kernel_count++];
    return FG_OK;
}

void kernels_release(fg_context *ctx) {
    for (int i = 0; i < ctx->kernel_count; i++)
        if (ctx->kernels[i].module && ctx->live) ctx->cu->cuModuleUnload(ctx->kernels[i].module);
    ctx->kernel_count = 0;
}

/* ---- public inspection calls ---- */

static fg_status canonical(fg_context *ctx, const fg_spec *spec, fg_spec *out) {
    char err[512];
    if (!ctx) return fg_fail(NULL, FG_ERR_INVALID_ARGUMENT, "ctx: NULL context");
    if (spec_canonicalize(spec, out, err, sizeof err) != 0)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "%s", err);
    return check_spec_for_target(ctx, out);
}

static fg_status check_pass(fg_context *ctx, fg_pass pass) {
    if (pass != FG_PASS_FORWARD && pass != FG_PASS_BACKWARD)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "pass: %d is not FG_PASS_FORWARD or FG_PASS_BACKWARD",
                       (int)pass);
    return FG_OK;
}

/* The derived plan and its source, for inspection (no compile). */
static fg_status plan_and_generate(fg_context *ctx, const fg_spec *spec, fg_pass pass,
                                   fg_kernel *k, char **source, char *name, size_t name_len) {
    fg_status st = canonical(ctx, spec, &k->spec);
    if (st || (st = check_pass(ctx, pass))) return st;
    k->pass = pass;
    char err[8192];
    if (plan_kernel(k, &ctx->profile, 0, err, sizeof err) != 0)
        return fg_fail(ctx, FG_ERR_UNSUPPORTED, "%s", err);
    if (generate_kernel(k, ctx->profile.arch, source, name, name_len, err, sizeof err))
        return fg_fail(ctx, FG_ERR_TEMPLATE, "template: %s", err);
    return FG_OK;
}

fg_status fg_plan(fg_context *ctx, const fg_spec *spec, fg_pass pass, fg_plan_info *out) {
    if (ctx && !out) return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "out: NULL");
    fg_kernel k;
    memset(&k, 0, sizeof k);
    char *source = NULL, name[128];
    /* the name comes from the templates, which own it */
    fg_status st = plan_and_generate(ctx, spec, pass, &k, &source, name, sizeof name);
    if (st) return st;
    free(source);
    fill_plan_info(&k, name, out);
    return FG_OK;
}

fg_status fg_source(fg_context *ctx, const fg_spec *spec, fg_pass pass, const char **source) {
    if (ctx && !source) return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "source: NULL");
    fg_kernel k;
    memset(&k, 0, sizeof k);
    char *text = NULL, name[128];
    fg_status st = plan_and_generate(ctx, spec, pass, &k, &text, name, sizeof name);
    if (st) return st;
    free(ctx->source);
    ctx->source = text;
    *source = text;
    return FG_OK;
}

fg_status fg_compile(fg_context *ctx, const fg_spec *spec, fg_pass pass, fg_kernel_info *out) {
    fg_spec s;
    fg_status st = canonical(ctx, spec, &s);
    if (st || (st = check_pass(ctx, pass))) return st;
    fg_kernel *k;
    if ((st = kernels_get(ctx, pass, &s, NULL, ctx->live, &k))) return st;
    if (out) *out = k->info;
    return FG_OK;
}
