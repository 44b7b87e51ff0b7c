#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen/spec.h"
#include "families/block_mask.h"
#include "runtime/runtime.h"

static _Thread_local char last_message[8192];

const char *fg_last_message(void) { return last_message; }

const char *fg_version(void) { return FG_GENERATOR_VERSION; }

const char *fg_status_name(fg_status status) {
    switch (status) {
    case FG_OK: return "ok";
    case FG_ERR_INVALID_ARGUMENT: return "invalid argument";
    case FG_ERR_UNSUPPORTED: return "unsupported";
    case FG_ERR_NO_DEVICE: return "no CUDA device";
    case FG_ERR_CUDA: return "CUDA error";
    case FG_ERR_COMPILE: return "compile error";
    case FG_ERR_TEMPLATE: return "template error";
    case FG_ERR_CACHE: return "cache error";
    case FG_ERR_OUT_OF_MEMORY: return "out of memory";
    case FG_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

fg_status fg_fail(fg_context *ctx, fg_status status, const char *fmt, ...) {
    char *buf = ctx ? ctx->message : last_message;
    size_t len = ctx ? sizeof ctx->message : sizeof last_message;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, len, fmt, ap);
    va_end(ap);
    if (ctx) snprintf(last_message, sizeof last_message, "%s", ctx->message);
    return status;
}

fg_status fg_cuda_check(fg_context *ctx, CUresult r, const char *what) {
    if (r == CUDA_SUCCESS) return FG_OK;
    char text[512];
    cuda_error_text(ctx->cu, r, text, sizeof text);
    return fg_fail(ctx, r == CUDA_ERROR_OUT_OF_MEMORY ? FG_ERR_OUT_OF_MEMORY : FG_ERR_CUDA,
                   "%s: %s", what, text);
}

fg_status fg_make_current(fg_context *ctx) {
    if (!ctx->live)
        return fg_fail(ctx, FG_ERR_NO_DEVICE,
                       "no CUDA device: this context targets %s offline (plan, generate and "
                       "compile only)",
                       ctx->profile.name);
    return fg_cuda_check(ctx, ctx->cu->cuCtxSetCurrent(ctx->cu_context), "cuCtxSetCurrent");
}

static int attribute(fg_context *ctx, CUdevice_attribute a) {
    int v = 0;
    ctx->cu->cuDeviceGetAttribute(&v, a, ctx->device);
    return v;
}

/* ordinal_from names where the ordinal came from, for the message. */
static fg_status open_live(fg_context *ctx, int ordinal, const char *ordinal_from) {
    char err[512];
    ctx->cu = cuda_driver_load(err, sizeof err);
    if (!ctx->cu) return fg_fail(ctx, FG_ERR_NO_DEVICE, "%s", err);
    int count = 0;
    fg_status st = fg_cuda_check(ctx, ctx->cu->cuDeviceGetCount(&count), "cuDeviceGetCount");
    if (st) return st;
    if (ordinal < 0 || ordinal >= count)
        return fg_fail(ctx, FG_ERR_NO_DEVICE, "%s: device %d, but there are %d CUDA device(s)",
                       ordinal_from, ordinal, count);
    if ((st = fg_cuda_check(ctx, ctx->cu->cuDeviceGet(&ctx->device, ordinal), "cuDeviceGet")))
        return st;
    if ((st = fg_cuda_check(ctx, ctx->cu->cuDevicePrimaryCtxRetain(&ctx->cu_context, ctx->device),
                            "cuDevicePrimaryCtxRetain")))
        return st;
    ctx->live = 1;
    int driver = 0;
    ctx->programmatic = ctx->cu->cuLaunchKernelEx &&
                        ctx->cu->cuDriverGetVersion(&driver) == CUDA_SUCCESS && driver >= 12030;
    fg_profile *p = &ctx->profile;
    ctx->cu->cuDeviceGetName(p->name, sizeof p->name, ctx->device);
    int major = attribute(ctx, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    int minor = attribute(ctx, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    p->arch = major * 10 + minor;
    p->sm_count = attribute(ctx, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    p->smem_per_block = attribute(ctx, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
    p->smem_per_sm = attribute(ctx, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
    p->regs_per_sm = attribute(ctx, CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR);
    p->regs_per_block = attribute(ctx, CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK);
    p->max_threads_per_sm = attribute(ctx, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR);
    /* two transfers a memory clock (kHz) over the bus (bits) */
    long long clock_khz = attribute(ctx, CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE);
    p->dram_gb_per_s = (int)(clock_khz * 2 * attribute(ctx, CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH) / 8 /
                             1000000);
    if (ctx->cu->cuDeviceTotalMem(&ctx->device_memory, ctx->device) != CUDA_SUCCESS)
        ctx->device_memory = 0; /* the deterministic backward then keeps its 1 GiB floor */
    if (p->arch < 75)
        return fg_fail(ctx, FG_ERR_UNSUPPORTED,
                       "%s is sm_%d: flashgen needs tensor cores with ldmatrix (sm_75 or newer)",
                       p->name, p->arch);
    /* Newer GPUs run the newest kernel family we emit, built for their own arch. */
    return FG_OK;
}

/* FLASHGEN_FAMILIES=fwd_sm80,bwd_sm80: the families calls keep to (per
 * pass, where it names one of that pass). Unknown names are warned about. */
static void families_from_env(fg_context *ctx) {
    const char *env = getenv("FLASHGEN_FAMILIES");
    if (!env) return;
    char names[256];
    snprintf(names, sizeof names, "%s", env);
    for (char *save = NULL, *name = strtok_r(names, ",", &save); name;
         name = strtok_r(NULL, ",", &save)) {
        const kernel_family *f = family_named(name);
        size_t n = strlen(ctx->cache_warning);
        char all[256];
        if (!f)
            snprintf(ctx->cache_warning + n, sizeof ctx->cache_warning - n,
                     "%sFLASHGEN_FAMILIES: no family '%.64s' (%s): ignored", n ? "; " : "", name,
                     family_names(all, sizeof all));
        else if (ctx->families_named_count < 8)
            ctx->families_named[ctx->families_named_count++] = f;
    }
}

/* A device ordinal written as a number, or -1. */
static int device_ordinal(const char *text) {
    char *end = NULL;
    long n = strtol(text, &end, 10);
    return end == text || *end || n < 0 || n > 4096 ? -1 : (int)n;
}

fg_status fg_context_create(fg_context **out, const char *target) {
    if (!out) return fg_fail(NULL, FG_ERR_INVALID_ARGUMENT, "fg_context_create: out is NULL");
    *out = NULL;
    fg_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return fg_fail(NULL, FG_ERR_OUT_OF_MEMORY, "fg_context_create: out of memory");
    fg_status st = FG_OK;
    const char *env = getenv("FLASHGEN_DEVICE");
    if (target && strncmp(target, "cuda:", 5) == 0) {
        int ordinal = device_ordinal(target + 5);
        st = ordinal < 0 ? fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                                   "target: '%s'; a device is named cuda:N, N its ordinal", target)
                         : open_live(ctx, ordinal, target);
    } else if (target && *target) {
        const fg_profile *p = profile_named(target);
        if (!p) {
            st = fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                         "target: unknown '%s' (named targets: t4, a100, rtx3090, l4, h100)",
                         target);
        } else {
            ctx->profile = *p;
        }
    } else if (env && *env) {
        int ordinal = device_ordinal(env);
        st = ordinal < 0 ? fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                                   "FLASHGEN_DEVICE=%s; it must be a device ordinal (0, 1, ...)", env)
                         : open_live(ctx, ordinal, "FLASHGEN_DEVICE");
    } else {
        st = open_live(ctx, 0, "the default device");
    }
    if (st == FG_OK) {
        char warn[512] = "";
        const char *off = getenv("FLASHGEN_CACHE");
        ctx->cache_disabled = off && strcmp(off, "off") == 0;
        const char *tuning = getenv("FLASHGEN_TUNING");
        ctx->tuning.disabled = tuning && strcmp(tuning, "off") == 0;
        const char *debug = getenv("FLASHGEN_DEBUG");
        ctx->debug_checks = debug && strcmp(debug, "1") == 0;
        if (!ctx->cache_disabled && cache_store_open(&ctx->store, NULL, warn, sizeof warn) != 0)
            ctx->cache_disabled = 1;
        snprintf(ctx->cache_warning, sizeof ctx->cache_warning, "%s", warn);
        /* Only "off" means anything. Another value ("0", "no") was most likely
         * meant to turn the feature off: say that it did not. */
        const char *const names[] = {"FLASHGEN_CACHE", "FLASHGEN_TUNING"}, *values[] = {off, tuning};
        const char *const still[] = {"the kernel cache stays on", "tuned choices stay in use"};
        for (int i = 0; i < 2; i++) {
            size_t n = strlen(ctx->cache_warning);
            if (values[i] && values[i][0] && strcmp(values[i], "off") != 0)
                snprintf(ctx->cache_warning + n, sizeof ctx->cache_warning - n,
                         "%s%s=%.64s is not understood (only 'off' is): %s", n ? "; " : "",
                         names[i], values[i], still[i]);
        }
        families_from_env(ctx);
        st = bundles_from_env(ctx); /* searched before the store, even with FLASHGEN_CACHE=off */
    }
    if (st == FG_OK) {
        snprintf(ctx->target, sizeof ctx->target, "%s (sm_%d, %d SMs, %d KiB shared memory/block)%s",
                 ctx->profile.name, ctx->profile.arch, ctx->profile.sm_count,
                 ctx->profile.smem_per_block / 1024, ctx->live ? "" : ", offline");
    }
    if (st != FG_OK) {
        fg_fail(NULL, st, "%s", ctx->message);
        fg_context_destroy(ctx);
        return st;
    }
    *out = ctx;
    return FG_OK;
}

void fg_context_destroy(fg_context *ctx) {
    if (!ctx) return;
    kernels_release(ctx);
    tune_release(ctx);
    if (ctx->live && (ctx->workspace || ctx->counters || ctx->walk_lists_kept) &&
        fg_make_current(ctx) == FG_OK) {
        if (ctx->workspace) ctx->cu->cuMemFree(ctx->workspace);
        if (ctx->counters) ctx->cu->cuMemFree(ctx->counters);
        for (int i = 0; i < ctx->walk_lists_kept; i++) ctx->cu->cuMemFree(ctx->walk_lists[i].lists);
    }
    if (ctx->live) ctx->cu->cuDevicePrimaryCtxRelease(ctx->device);
    free(ctx->kernels);
    free(ctx->source);
    bundles_release(ctx);
    free(ctx);
}

const char *fg_context_message(const fg_context *ctx) { return ctx ? ctx->message : last_message; }
const char *fg_context_target(const fg_context *ctx) { return ctx ? ctx->target : ""; }
int fg_context_arch(const fg_context *ctx) { return ctx ? ctx->profile.arch : 0; }

void fg_context_set_compile_log(fg_context *ctx, fg_compile_log_fn fn, void *user) {
    if (!ctx) return;
    ctx->compile_log = fn;
    ctx->compile_log_user = user;
    /* The library never prints, so a cache that could not be used as asked
     * (unwritable folder, bad FLASHGEN_CACHE_MAX_SIZE) is told to the first
     * log installed, once: every compile would otherwise pay for it unseen. */
    if (fn && ctx->cache_warning[0]) {
        char line[sizeof ctx->cache_warning + 32];
        snprintf(line, sizeof line, "flashgen: warning: %s", ctx->cache_warning);
        ctx->cache_warning[0] = '\0';
        fn(line, user);
    }
}

fg_status canonical_spec(fg_context *ctx, const fg_spec *spec, fg_spec *canonical) {
    char err[512];
    if (!ctx) return fg_fail(NULL, FG_ERR_INVALID_ARGUMENT, "ctx: NULL context");
    if (spec_canonicalize(spec, canonical, err, sizeof err) != 0)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "%s", err);
    return FG_OK;
}

fg_status canonical_pass_spec(fg_context *ctx, const fg_spec *spec, fg_pass pass,
                             fg_spec *canonical) {
    fg_status st = canonical_spec(ctx, spec, canonical);
    if (st || pass != FG_PASS_BLOCK_MASK) return st;
    fg_spec m;
    char err[256];
    if (block_mask_spec(canonical, &m, err, sizeof err) != 0)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "%s", err);
    return canonical_spec(ctx, &m, canonical);
}

int context_families(const fg_context *ctx, fg_pass pass, const kernel_family **out, int max) {
    const kernel_family *all[8];
    int n = families_for(pass, &ctx->profile, all, 8), narrowed = 0, count = 0;
    for (int i = 0; i < ctx->families_named_count; i++)
        narrowed |= ctx->families_named[i]->pass == pass;
    for (int i = 0; i < n && count < max; i++) {
        int named = !narrowed;
        for (int j = 0; j < ctx->families_named_count && !named; j++)
            named = ctx->families_named[j] == all[i];
        if (named) out[count++] = all[i];
    }
    return count;
}

int families_after(const fg_context *ctx, const kernel_family *f, const fg_spec *canonical,
                   const kernel_family **out, int max) {
    const kernel_family *all[8];
    char err[512];
    int n = context_families(ctx, f->pass, all, 8), after = 0, count = 0;
    for (int i = 0; i < n && count < max; i++) {
        if (all[i] == f) after = 1;
        else if (after && all[i]->supports(canonical, &ctx->profile, err, sizeof err) == 0)
            out[count++] = all[i];
    }
    return count;
}

const char *pass_name(fg_pass pass) {
    return pass == FG_PASS_BACKWARD ? "backward" : pass == FG_PASS_BLOCK_MASK ? "block_mask"
                                                                              : "forward";
}

fg_status family_of(fg_context *ctx, const fg_spec *canonical, fg_pass pass,
                    const kernel_family **family) {
    char err[512] = "";
    if (pass != FG_PASS_FORWARD && pass != FG_PASS_BACKWARD && pass != FG_PASS_BLOCK_MASK)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                       "pass: %d is not FG_PASS_FORWARD, FG_PASS_BACKWARD or FG_PASS_BLOCK_MASK",
                       (int)pass);
    if (pass == FG_PASS_BACKWARD && canonical->kv_cache)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                       "spec.kv_cache: a decoding step has no backward (train with a dense or "
                       "varlen spec)");
    const kernel_family *f[8];
    int n = context_families(ctx, pass, f, 8);
    if (n == 0)
        return fg_fail(ctx, FG_ERR_UNSUPPORTED, "no kernel family runs the %s pass on %s (sm_%d)%s",
                       pass_name(pass), ctx->profile.name,
                       ctx->profile.arch,
                       ctx->families_named_count ? " among those FLASHGEN_FAMILIES names" : "");
    /* the first that supports the spec (a plan each: remembered for the last
     * few specs, as every call asks); else the last one's reason */
    for (int i = 0; i < FAMILY_MEMO; i++)
        if (ctx->family_memo[i].family && ctx->family_memo[i].pass == pass &&
            memcmp(&ctx->family_memo[i].spec, canonical, sizeof *canonical) == 0) {
            *family = ctx->family_memo[i].family;
            return FG_OK;
        }
    for (int i = 0; i < n; i++)
        if (f[i]->supports(canonical, &ctx->profile, err, sizeof err) == 0) {
            family_memo *m = &ctx->family_memo[ctx->family_memo_next++ % FAMILY_MEMO];
            m->pass = pass, m->spec = *canonical, m->family = *family = f[i];
            return FG_OK;
        }
    return fg_fail(ctx, FG_ERR_UNSUPPORTED, "%s", err);
}
