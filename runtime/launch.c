/* Calls: fg_forward, fg_backward and the workspace size. A call is
 * validated, its family and kernel found (the tuned tiling when there is
 * one), and its launches run as the kernel's template described them: the
 * family fills the launch arguments, each grid is the product of the
 * template's factors over those arguments.
 * q (B,Sq,Hq,D), k/v (B,Sk,Hkv,D) -> o (B,Sq,Hq,D), lse (B,Hq,Sq); the
 * backward adds dO -> dq, dk, dv. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime.h"

family_call call_of(const fg_spec *spec, const fg_forward_args *forward,
                    const fg_backward_args *backward) {
    family_call c;
    memset(&c, 0, sizeof c);
    c.spec = spec;
    c.forward = forward;
    c.backward = backward;
    if (forward->layout) c.layout = forward->layout->lists;
    return c;
}

/* family_device.encode_map, through the driver's cuTensorMapEncodeTiled. */
static int encode_map(const family_device *dev, void *map, family_map_type type, int rank,
                      uint64_t address,
                      const uint64_t *dims, const uint64_t *strides, const uint32_t *box,
                      char *err, size_t err_len) {
    const cuda_driver *cu = dev->driver;
    cuuint64_t d[5], st[4];
    cuuint32_t b[5], ones[5] = {1, 1, 1, 1, 1};
    if (rank < 1 || rank > 5) {
        snprintf(err, err_len, "rank %d is not 1..5", rank);
        return -1;
    }
    for (int i = 0; i < rank; i++) {
        d[i] = dims[i], b[i] = box[i];
        if (i < rank - 1) st[i] = strides[i];
    }
    static const CUtensorMapDataType types[] = {
        [FAMILY_MAP_F16] = CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        [FAMILY_MAP_BF16] = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        [FAMILY_MAP_F32] = CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
    };
    CUresult r = cu->cuTensorMapEncodeTiled(
        (CUtensorMap *)map, types[type],
        (cuuint32_t)rank, (void *)(uintptr_t)address, d, st, b, ones,
        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
        CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r == CUDA_SUCCESS) return 0;
    cuda_error_text(cu, r, err, err_len);
    return -1;
}

static family_device device_of(const fg_context *ctx) {
    family_device d = {&ctx->profile, ctx->device_memory, NULL, ctx->cu};
    if (ctx->cu && ctx->cu->cuTensorMapEncodeTiled) d.encode_map = encode_map;
    return d;
}

size_t launch_workspace(fg_context *ctx, const fg_kernel *k, const family_call *call) {
    family_device dev = device_of(ctx);
    return k->family->workspace(&k->plan, call, &dev);
}

/* A buffer of the context's (its workspace, its turn counters) grown to
 * `bytes`; *grown: whether it is new. Growing waits for the device:
 * earlier calls may still be using the old one. */
static fg_status context_buffer(fg_context *ctx, const char *what, CUdeviceptr *buf, size_t *have,
                                size_t bytes, int *grown) {
    const cuda_driver *cu = ctx->cu;
    *grown = *have < bytes;
    if (!*grown) return FG_OK;
    if (*buf) {
        fg_status st = fg_cuda_check(ctx, cu->cuCtxSynchronize(), "cuCtxSynchronize");
        if (st) return st;
        cu->cuMemFree(*buf);
        *buf = 0;
        *have = 0;
    }
    if (cu->cuMemAlloc(buf, bytes) != CUDA_SUCCESS)
        return fg_fail(ctx, FG_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes of device memory",
                       what, bytes);
    *have = bytes;
    return FG_OK;
}

/* The context's turn counters, `count` of them (fg_forward_args
 * .split_counters), zeroed when made, in the order of the call's stream. */
static fg_status context_counters(fg_context *ctx, size_t count, CUstream stream, CUdeviceptr *out) {
    int grown;
    fg_status st = context_buffer(ctx, "counters", &ctx->counters, &ctx->counter_bytes, count * 4,
                                  &grown);
    if (!st && grown)
        st = fg_cuda_check(ctx, ctx->cu->cuMemsetD32Async(ctx->counters, 0, count, stream),
                           "counters: cuMemsetD32Async");
    *out = ctx->counters;
    return st;
}

/* The walk lists kernel k's family makes for a call (kernel_family.
 * walk_key), on the device: made and copied up the first time their key
 * comes, then kept. 0 (the call walks without them) where the family makes
 * none, WALK_LISTS_KEPT are kept already, the stream is being captured (a
 * copy may not run then; the graph walks without them), or memory for them
 * is short: they only speed the call up. */
static fg_status context_walk_lists(fg_context *ctx, const fg_kernel *k, const family_call *call,
                                    const family_device *dev, CUstream stream, uint64_t *out) {
    const kernel_family *f = k->family;
    uint64_t key[FAMILY_WALK_KEY_WORDS];
    int entries;
    *out = 0;
    if (!f->walk_key || !f->walk_key(&k->plan, call, dev, key, &entries)) return FG_OK;
    for (int i = 0; i < ctx->walk_lists_kept; i++)
        if (ctx->walk_lists[i].family == f && memcmp(ctx->walk_lists[i].key, key, sizeof key) == 0)
            return *out = ctx->walk_lists[i].lists, FG_OK;
    if (ctx->walk_lists_kept == WALK_LISTS_KEPT) return FG_OK;
    CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
    const cuda_driver *cu = ctx->cu;
    fg_status st;
    if ((st = fg_make_current(ctx)) ||
        (st = fg_cuda_check(ctx, cu->cuStreamIsCapturing(stream, &capture), "cuStreamIsCapturing")))
        return st;
    if (capture != CU_STREAM_CAPTURE_STATUS_NONE) return FG_OK;
    size_t bytes = (size_t)entries * sizeof(uint16_t);
    uint16_t *host = malloc(bytes);
    CUdeviceptr lists = 0;
    if (!host) return FG_OK;
    if (f->walk_lists(&k->plan, call, dev, host, entries) != entries) {
        free(host);
        return fg_fail(ctx, FG_ERR_INTERNAL, "%s: its walk lists are not the %d entries its key "
                       "said", f->name, entries);
    }
    if (cu->cuMemAlloc(&lists, bytes) != CUDA_SUCCESS) {
        free(host);
        return FG_OK;
    }
    /* on the call's stream, and waited for: a copy from pageable memory may
     * return before it lands, and calls on other streams share the lists */
    st = fg_cuda_check(ctx, cu->cuMemcpyHtoDAsync(lists, host, bytes, stream),
                       "walk lists: cuMemcpyHtoDAsync");
    if (!st) st = fg_cuda_check(ctx, cu->cuStreamSynchronize(stream), "walk lists: cuStreamSynchronize");
    free(host);
    if (st) {
        cu->cuMemFree(lists);
        return st;
    }
    int i = ctx->walk_lists_kept++;
    ctx->walk_lists[i].family = f;
    memcpy(ctx->walk_lists[i].key, key, sizeof key);
    ctx->walk_lists[i].lists = lists;
    *out = lists;
    return FG_OK;
}

/* Grid x of launch l: the product of its factors, each ceil(scale x the
 * product of its fields / per), read from the filled launch arguments. */
static int grid_of(const kernel_launch *l, const void *params, int64_t *out) {
    int64_t grid = 1;
    for (int f = 0; f < l->factor_count; f++) {
        const launch_factor *x = &l->factor[f];
        int64_t v = x->scale;
        for (int i = 0; i < x->field_count; i++) {
            int32_t field;
            memcpy(&field, (const char *)params + x->offset[i], sizeof field);
            if (field < 0 || __builtin_mul_overflow(v, (int64_t)field, &v)) return -1;
        }
        v = (v + x->per - 1) / x->per;
        if (__builtin_mul_overflow(grid, v, &grid)) return -1;
    }
    *out = grid;
    return grid <= INT32_MAX ? 0 : -1;
}

fg_status launch_one(fg_context *ctx, CUfunction f, const kernel_launch *l, int64_t grid,
                     CUstream stream, void **params, int programmatic) {
    const cuda_driver *cu = ctx->cu;
    char what[240]; /* named only on an error: a launch is on every call's path */
    CUresult r;
    if (l->cluster <= 1 && !programmatic) {
        r = cu->cuLaunchKernel(f, (unsigned)grid, 1, 1, (unsigned)l->threads, 1, 1,
                               (unsigned)l->smem_bytes, stream, params, NULL);
        if (r == CUDA_SUCCESS) return FG_OK;
        snprintf(what, sizeof what, "cuLaunchKernel(%s)", l->entry);
        return fg_cuda_check(ctx, r, what);
    }
    if (grid % l->cluster != 0)
        return fg_fail(ctx, FG_ERR_INTERNAL, "%s: a grid of %lld thread blocks is no whole number of "
                       "clusters of %d", l->entry, (long long)grid, l->cluster);
    if (!cu->cuLaunchKernelEx)
        return fg_fail(ctx, FG_ERR_CUDA, "%s needs thread block clusters: the CUDA driver lacks "
                       "cuLaunchKernelEx (CUDA 12 or newer)", l->entry);
    CUlaunchAttribute attr[2];
    unsigned n = 0;
    memset(attr, 0, sizeof attr);
    if (l->cluster > 1) {
        attr[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        attr[n].value.clusterDim.x = (unsigned)l->cluster;
        attr[n].value.clusterDim.y = attr[n].value.clusterDim.z = 1;
        n++;
    }
    if (programmatic) {
        attr[n].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr[n].value.programmaticStreamSerializationAllowed = 1;
        n++;
    }
    CUlaunchConfig config;
    memset(&config, 0, sizeof config);
    config.gridDimX = (unsigned)grid, config.gridDimY = config.gridDimZ = 1;
    config.blockDimX = (unsigned)l->threads, config.blockDimY = config.blockDimZ = 1;
    config.sharedMemBytes = (unsigned)l->smem_bytes;
    config.hStream = stream;
    config.attrs = attr;
    config.numAttrs = n;
    if ((r = cu->cuLaunchKernelEx(&config, f, params, NULL)) == CUDA_SUCCESS) return FG_OK;
    snprintf(what, sizeof what, "cuLaunchKernelEx(%s, cluster %d%s)", l->entry, l->cluster,
             programmatic ? ", programmatic" : "");
    return fg_cuda_check(ctx, r, what);
}

fg_status launch_call(fg_context *ctx, const fg_kernel *k, const fg_spec *canonical,
                      const family_call *given, void *workspace, size_t workspace_bytes) {
    const kernel_family *f = k->family;
    family_device dev = device_of(ctx);
    family_call call = *given;
    size_t need = f->workspace(&k->plan, &call, &dev);
    CUdeviceptr ws = 0;
    fg_status st;
    if (need > 0 && workspace) {
        if (workspace_bytes < need)
            return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                           "workspace_bytes: %zu; this call needs %zu (fg_%s_workspace_size)",
                           workspace_bytes, need, call.backward ? "backward" : "forward");
        ws = (CUdeviceptr)(uintptr_t)workspace;
    } else if (need > 0) {
        int grown;
        if ((st = fg_make_current(ctx)) ||
            (st = context_buffer(ctx, "workspace", &ctx->workspace, &ctx->workspace_bytes, need,
                                 &grown)))
            return st;
        ws = ctx->workspace;
    }
    const fg_forward_args *a = call.forward;
    if (need > 0 && canonical->kv_cache && !call.backward) {
        CUdeviceptr counters = (CUdeviceptr)(uintptr_t)a->split_counters;
        if (!counters && !workspace &&
            (st = context_counters(ctx, (size_t)a->batch * a->heads_q * a->seqlen_q,
                                   (CUstream)a->stream, &counters)))
            return st;
        call.split_counters = counters;
    }
    if ((st = context_walk_lists(ctx, k, &call, &dev, (CUstream)a->stream, &call.walk_lists)))
        return st;
    family_args args;
    char err[512];
    if (f->arguments(&k->plan, canonical, &call, &dev, (uint64_t)ws, &args, err, sizeof err) != 0)
        return fg_fail(ctx, FG_ERR_CUDA, "%s: %s", f->name, err);
    int64_t grid[LAUNCH_MAX];
    for (int i = 0; i < k->launch_count; i++)
        if (grid_of(&k->launch[i], args.params, &grid[i]) != 0)
            return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                           "batch %d, heads %d, seqlen %d: %s would need more than 2^31-1 "
                           "thread blocks",
                           call.forward->batch, call.forward->heads_q, call.forward->seqlen_q,
                           k->launch[i].entry);

    if ((st = fg_make_current(ctx))) return st;
    const cuda_driver *cu = ctx->cu;
    CUstream stream = (CUstream)call.forward->stream;
    if (args.clear_bytes > 0 &&
        (st = fg_cuda_check(ctx, cu->cuMemsetD32Async(ws + args.clear_offset, 0,
                                                      args.clear_bytes / 4, stream),
                            "cuMemsetD32Async(workspace)")))
        return st;
    void *params[] = {args.params};
    /* a launch of no thread blocks is one the call does not take (say, the
     * main kernel of the other schedule); a programmatic launch depends on
     * the last of the call's launches before it, only where one ran (else on
     * work of the caller's, whose writes it may read before any wait), and where the
     * driver cannot, runs in stream order (its waits then return at once) */
    for (int i = 0, ran = 0; i < k->launch_count; i++) {
        if (grid[i] == 0) continue;
        if ((st = launch_one(ctx, k->function[i], &k->launch[i], grid[i], stream, params,
                             k->launch[i].programmatic && ctx->programmatic && ran)))
            return st;
        ran = 1;
    }
    return FG_OK;
}

/* ---- the public calls ---- */

/* The first family after f that supports s and accepts the call, for a
 * call f cannot take (why); the compile log is told, unless it was just
 * told the same. */
static fg_status fallback(fg_context *ctx, const kernel_family *f, const fg_spec *s,
                          const family_call *call, const char *why, const kernel_family **out) {
    family_device dev = device_of(ctx);
    if (ctx->after_of != f || memcmp(&ctx->after_spec, s, sizeof *s) != 0) {
        ctx->after_count = families_after(ctx, f, s, ctx->after, 8);
        ctx->after_of = f, ctx->after_spec = *s;
    }
    char err[512], line[1024];
    *out = NULL;
    for (int i = 0; i < ctx->after_count && !*out; i++)
        if (!ctx->after[i]->accepts || ctx->after[i]->accepts(call, &dev, err, sizeof err) == 0)
            *out = ctx->after[i];
    if (!*out)
        return fg_fail(ctx, FG_ERR_UNSUPPORTED, "%s cannot take this call (%s) and no other "
                       "family can", f->name, why);
    if (ctx->compile_log &&
        (ctx->told_from != f || ctx->told_to != *out || strcmp(why, ctx->told_why) != 0)) {
        ctx->told_from = f, ctx->told_to = *out;
        snprintf(ctx->told_why, sizeof ctx->told_why, "%s", why);
        snprintf(line, sizeof line, "flashgen: %s cannot take this call (%s): it runs on %s",
                 f->name, why, (*out)->name);
        ctx->compile_log(line, ctx->compile_log_user);
    }
    return FG_OK;
}

/* The kernel for a validated call of a pass (live: loaded): the tuned
 * choice for this GPU and length when there is one, else the family's
 * tiling for the call's lengths, else its derived plan; the next family's
 * (its tiling for the call's lengths, else its derived plan) when the
 * chosen one cannot take the call. */
static fg_status kernel_for(fg_context *ctx, const kernel_family *f, const fg_spec *s,
                            const family_call *call, fg_kernel **k) {
    const tune_choice *tuned =
        ctx->live ? tune_lookup(ctx, f->pass, s, call->forward->seqlen_k) : NULL;
    if (tuned) f = tuned->family;
    char why[512];
    family_device dev = device_of(ctx);
    if (f->accepts && f->accepts(call, &dev, why, sizeof why) != 0) {
        fg_status st = fallback(ctx, f, s, call, why, &f);
        if (st) return st;
    } else if (tuned) {
        return kernels_get(ctx, f, s, &tuned->tiling, 1, k);
    }
    family_tiling by_length;
    if (f->tiling_for_call && f->tiling_for_call(s, &ctx->profile, call, &by_length))
        return kernels_get(ctx, f, s, &by_length, ctx->live, k);
    return kernels_get(ctx, f, s, NULL, ctx->live, k);
}

/* Validate a forward call and find (live: load) its kernel. */
static fg_status prepare_forward(fg_context *ctx, const fg_spec *spec, const fg_forward_args *a,
                                 fg_spec *s, fg_kernel **k) {
    if (!ctx) return fg_fail(NULL, FG_ERR_INVALID_ARGUMENT, "ctx: NULL context");
    if (!a) return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "args: NULL");
    const kernel_family *f;
    fg_status st = canonical_spec(ctx, spec, s);
    if (st || (st = check_forward_args(ctx, s, a)) ||
        (st = family_of(ctx, s, FG_PASS_FORWARD, &f)))
        return st;
    if (!ctx->live) return fg_make_current(ctx); /* offline: nothing to launch */
    family_call call = call_of(s, a, NULL);
    return kernel_for(ctx, f, s, &call, k);
}

fg_status fg_forward_workspace_size(fg_context *ctx, const fg_spec *spec,
                                    const fg_forward_args *args, size_t *bytes) {
    if (ctx && !bytes) return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "bytes: NULL");
    fg_spec s;
    fg_kernel *k = NULL;
    fg_status st = prepare_forward(ctx, spec, args, &s, &k);
    if (st) return st;
    family_call call = call_of(&s, args, NULL);
    *bytes = launch_workspace(ctx, k, &call);
    return FG_OK;
}

fg_status fg_forward(fg_context *ctx, const fg_spec *spec, const fg_forward_args *a) {
    fg_spec s;
    fg_kernel *k = NULL;
    fg_status st = prepare_forward(ctx, spec, a, &s, &k);
    if (st) return st;
    family_call call = call_of(&s, a, NULL);
    return launch_call(ctx, k, &s, &call, a->workspace, a->workspace_bytes);
}

/* Validate a backward call and find (live: load) its kernel. */
static fg_status prepare_backward(fg_context *ctx, const fg_spec *spec, const fg_backward_args *a,
                                  fg_spec *s, fg_kernel **k) {
    if (!ctx) return fg_fail(NULL, FG_ERR_INVALID_ARGUMENT, "ctx: NULL context");
    if (!a) return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "args: NULL");
    const kernel_family *f;
    fg_status st = canonical_spec(ctx, spec, s);
    if (st || (st = check_backward_args(ctx, s, a)) ||
        (st = family_of(ctx, s, FG_PASS_BACKWARD, &f)))
        return st;
    family_call call = call_of(s, &a->forward, a);
    return kernel_for(ctx, f, s, &call, k);
}

fg_status fg_backward_workspace_size(fg_context *ctx, const fg_spec *spec,
                                     const fg_backward_args *args, size_t *bytes) {
    if (ctx && !bytes) return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "bytes: NULL");
    fg_spec s;
    fg_kernel *k;
    fg_status st = prepare_backward(ctx, spec, args, &s, &k);
    if (st) return st;
    family_call call = call_of(&s, &args->forward, args);
    *bytes = launch_workspace(ctx, k, &call);
    return FG_OK;
}

fg_status fg_backward(fg_context *ctx, const fg_spec *spec, const fg_backward_args *a) {
    fg_spec s;
    fg_kernel *k = NULL;
    fg_status st = prepare_backward(ctx, spec, a, &s, &k);
    if (st) return st;
    if (!ctx->live) return fg_make_current(ctx); /* offline: built, never launched */
    family_call call = call_of(&s, &a->forward, a);
    if ((st = fg_make_current(ctx)) || (st = clear_aux_gradients(ctx, &s, a))) return st;
    return launch_call(ctx, k, &s, &call, a->workspace, a->workspace_bytes);
}
