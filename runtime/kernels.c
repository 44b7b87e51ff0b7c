/* The kernel table: (family, canonical spec, tiling) -> plan -> source ->
 * cubin -> functions. A kernel is built once per context; later calls find
 * it here with no generation, hashing or I/O. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "families/block_mask.h"
#include "gen/plan.h"
#include "runtime/runtime.h"

/* Plan k (the derived plan under `budget`, or its named tiling) and
 * generate its source; k's plan, target, launches and plan info are set. */
static fg_status plan_and_generate(fg_context *ctx, fg_kernel *k, int budget, generated *g) {
    char err[8192];
    const kernel_family *f = k->family;
    static const family_tiling derived; /* all 0 */
    int named = memcmp(&k->tiling, &derived, sizeof derived) != 0;
    int rc = named ? f->plan_tiling(&k->spec, &ctx->profile, &k->tiling, &k->plan, err, sizeof err)
                   : f->plan(&k->spec, &ctx->profile, budget, &k->plan, err, sizeof err);
    if (rc != 0) return fg_fail(ctx, FG_ERR_UNSUPPORTED, "%s", err);
    k->target = family_target(f, &ctx->profile);
    if (f->generate(&k->spec, &k->plan, &k->target, g, err, sizeof err) != 0)
        return fg_fail(ctx, FG_ERR_TEMPLATE, "template: %s", err);
    f->describe(&k->plan, &k->info.plan);
    snprintf(k->info.plan.kernel_name, sizeof k->info.plan.kernel_name, "%s", g->kernel_name);
    memcpy(k->launch, g->launch, sizeof k->launch);
    k->launch_count = g->launch_count;
    return FG_OK;
}

/* Plan under `budget`, generate, and find the cubin or compile it. */
static fg_status build_step(fg_context *ctx, fg_kernel *k, int budget, void **owned,
                            const void **image) {
    generated g;
    fg_status st = plan_and_generate(ctx, k, budget, &g);
    if (st) return st;
    st = binary_get(ctx, k, &g, owned, image);
    generated_free(&g);
    return st;
}

/* Compile the derived plan; while ptxas spills, re-plan under the next
 * smaller register budget (smaller tiles) and compile again. A tiling named
 * by the tuner is kept as it is: the tuner drops it if it spills. */
static fg_status build(fg_context *ctx, fg_kernel *k, int load) {
    static const family_tiling derived;
    const kernel_family *f = k->family;
    void *owned = NULL;
    const void *image = NULL;
    double total_ms = 0;
    fg_status st = build_step(ctx, k, 0, &owned, &image);
    int accumulators, budget;
    f->registers(&k->plan, &accumulators, &budget);
    while (st == FG_OK && k->info.spill_bytes > 0 && !memcmp(&k->tiling, &derived, sizeof derived)) {
        fg_plan_info previous = k->info.plan;
        fg_kernel_info spilled = k->info;
        int previous_acc = accumulators;
        family_plan probe;
        int probe_budget;
        char err[512];
        /* the next budget that changes the tiles, if any; smaller budgets
         * only fit fewer tilings, so one that plans nothing ends the search */
        int planned = 0;
        do {
            budget = plan_next_budget(budget);
            planned = budget && f->plan(&k->spec, &ctx->profile, budget, &probe, err, sizeof err) == 0;
            if (planned) f->registers(&probe, &accumulators, &probe_budget);
        } while (planned && accumulators >= previous_acc);
        if (!planned) break; /* no smaller tiling: keep the spilling one */
        total_ms += spilled.compile_ms;
        free(owned);
        owned = NULL;
        st = build_step(ctx, k, budget, &owned, &image);
        if (st == FG_OK) {
            size_t n = strlen(k->info.plan.why);
            snprintf(k->info.plan.why + n, sizeof k->info.plan.why - n,
                     "Tiles %dx%d spilled %d bytes in ptxas: re-planned under a budget of %d.\n",
                     previous.block_m, previous.block_n, spilled.spill_bytes, budget);
        }
    }
    if (st == FG_OK) {
        k->info.compile_ms += total_ms;
        if (load) st = module_load(ctx, k, image);
    }
    free(owned);
    return st;
}

static int same_kernel(const fg_kernel *k, const kernel_family *family, const fg_spec *spec,
                       const family_tiling *tiling) {
    return k->family == family && memcmp(&k->spec, spec, sizeof *spec) == 0 &&
           memcmp(&k->tiling, tiling, sizeof *tiling) == 0;
}

fg_status kernels_get(fg_context *ctx, const kernel_family *family, const fg_spec *spec,
                      const family_tiling *tiling, int load, fg_kernel **out) {
    static const family_tiling derived;
    if (!tiling) tiling = &derived;
    for (int i = 0; i < ctx->kernel_count; i++) {
        fg_kernel *k = &ctx->kernels[i];
        if (!same_kernel(k, family, spec, tiling)) continue;
        if (load && !k->module) break; /* built offline-style; load below */
        k->info.from_cache = 2;
        k->info.compile_ms = 0;
        *out = k;
        return FG_OK;
    }
    fg_kernel *fresh = calloc(1, sizeof *fresh);
    if (!fresh) return fg_fail(ctx, FG_ERR_OUT_OF_MEMORY, "kernel table: out of memory");
    fresh->family = family;
    fresh->spec = *spec;
    fresh->tiling = *tiling;
    fg_status st = build(ctx, fresh, load);
    fg_kernel *slot = NULL;
    for (int i = 0; !st && i < ctx->kernel_count && !slot; i++)
        if (same_kernel(&ctx->kernels[i], family, spec, tiling))
            slot = &ctx->kernels[i]; /* replaces an entry that was not loaded */
    if (!st && !slot && ctx->kernel_count == ctx->kernel_capacity) {
        int cap = ctx->kernel_capacity ? 2 * ctx->kernel_capacity : 16;
        fg_kernel *grown = realloc(ctx->kernels, (size_t)cap * sizeof *grown);
        if (!grown) {
            st = fg_fail(ctx, FG_ERR_OUT_OF_MEMORY, "kernel table: out of memory");
        } else {
            ctx->kernels = grown;
            ctx->kernel_capacity = cap;
        }
    }
    if (st) {
        if (fresh->module) ctx->cu->cuModuleUnload(fresh->module);
        free(fresh);
        return st;
    }
    if (!slot) slot = &ctx->kernels[ctx->kernel_count++];
    *slot = *fresh;
    free(fresh);
    *out = slot;
    return FG_OK;
}

void kernels_release(fg_context *ctx) {
    for (int i = 0; i < ctx->kernel_count; i++)
        if (ctx->kernels[i].module && ctx->live) ctx->cu->cuModuleUnload(ctx->kernels[i].module);
    ctx->kernel_count = 0;
}

/* ---- public inspection calls ---- */

/* The derived plan of a pass and its source, for inspection (no compile). */
static fg_status inspect(fg_context *ctx, const fg_spec *spec, fg_pass pass, fg_kernel *k,
                         generated *g) {
    fg_status st = canonical_pass_spec(ctx, spec, pass, &k->spec);
    if (st || (st = family_of(ctx, &k->spec, pass, &k->family))) return st;
    return plan_and_generate(ctx, k, 0, g);
}

fg_status fg_plan(fg_context *ctx, const fg_spec *spec, fg_pass pass, fg_plan_info *out) {
    if (ctx && !out) return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "out: NULL");
    fg_kernel k;
    memset(&k, 0, sizeof k);
    generated g;
    fg_status st = inspect(ctx, spec, pass, &k, &g);
    if (st) return st;
    generated_free(&g);
    *out = k.info.plan;
    return FG_OK;
}

fg_status fg_source(fg_context *ctx, const fg_spec *spec, fg_pass pass, const char **source) {
    if (ctx && !source) return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "source: NULL");
    fg_kernel k;
    memset(&k, 0, sizeof k);
    generated g;
    fg_status st = inspect(ctx, spec, pass, &k, &g);
    if (st) return st;
    free(ctx->source);
    ctx->source = g.source;
    *source = g.source;
    return FG_OK;
}

fg_status fg_compile(fg_context *ctx, const fg_spec *spec, fg_pass pass, fg_kernel_info *out) {
    fg_spec s;
    const kernel_family *f;
    fg_status st = canonical_pass_spec(ctx, spec, pass, &s);
    if (st || (st = family_of(ctx, &s, pass, &f))) return st;
    fg_kernel *k;
    if ((st = kernels_get(ctx, f, &s, NULL, ctx->live, &k))) return st;
    if (out) *out = k->info;
    /* A bundle also holds the kernels of the families after f that take the
     * spec: a call f declines (fwd_sm90a: strides TMA cannot describe) runs
     * on them, where NVRTC may be absent. */
    const kernel_family *next[8];
    int n = ctx->bundles.building ? families_after(ctx, f, &s, next, 8) : 0;
    for (int i = 0; i < n && st == FG_OK; i++) {
        fg_kernel *fallback;
        st = kernels_get(ctx, next[i], &s, NULL, ctx->live, &fallback);
    }
    /* ... and, beside a forward that may take a block mask, the mask's build */
    fg_spec m;
    char err[256];
    if (st == FG_OK && ctx->bundles.building && pass == FG_PASS_FORWARD &&
        block_mask_spec(&s, &m, err, sizeof err) == 0 && !(st = canonical_spec(ctx, &m, &m)) &&
        !(st = family_of(ctx, &m, FG_PASS_BLOCK_MASK, &f))) {
        fg_kernel *build;
        st = kernels_get(ctx, f, &m, NULL, ctx->live, &build);
    }
    return st;
}
