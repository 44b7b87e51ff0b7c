/* fg_backward: validate a call, size its workspace, launch the three kernels.
 * q, dO (B,Sq,Hq,D), k/v (B,Sk,Hkv,D), o (B,Sq,Hq,D), lse (B,Hq,Sq)
 *   -> dq (B,Sq,Hq,D), dk/dv (B,Sk,Hkv,D)
 * Workspace: delta (B,Hq,Sq) fp32, then the dQ accumulator
 * (slices, B, Hq, Sq, head dim padded) fp32. */
#include <stdint.h>
#include <string.h>

#include "gen/spec.h"
#include "runtime/kernel_params.h"
#include "runtime/runtime.h"

#define WORKSPACE_ALIGN 256
/* The deterministic schedule's accumulator slices beyond the first take at
 * most 1/32 of the device's memory, and at least 1 GiB may always be used;
 * with less, fewer thread blocks share the work. */
#define DETERMINISTIC_EXTRA_MIN ((size_t)1 << 30)
#define DETERMINISTIC_EXTRA_SHARE 32

static size_t deterministic_extra_bytes(const fg_context *ctx) {
    size_t share = ctx->device_memory / DETERMINISTIC_EXTRA_SHARE;
    return share > DETERMINISTIC_EXTRA_MIN ? share : DETERMINISTIC_EXTRA_MIN;
}

static size_t align_up(size_t x) { return (x + WORKSPACE_ALIGN - 1) / WORKSPACE_ALIGN * WORKSPACE_ALIGN; }

/* How the key blocks are spread over thread blocks. */
typedef struct schedule {
    int n_blocks;      /* key blocks of Bc keys */
    int n_groups;      /* thread blocks per (batch, kv head) */
    int slices;        /* dQ accumulator slices */
    size_t delta_bytes, slice_bytes, total_bytes;
} schedule;

static void schedule_of(const fg_context *ctx, const fg_bwd_plan *plan, const fg_forward_args *a,
                        int deterministic, schedule *s) {
    memset(s, 0, sizeof *s);
    s->n_blocks = (a->seqlen_k + plan->block_n - 1) / plan->block_n;
    size_t rows = (size_t)a->batch * a->heads_q * a->seqlen_q;
    s->delta_bytes = align_up(rows * sizeof(float));
    s->slice_bytes = align_up(rows * plan->head_dim_padded * sizeof(float));
    if (!deterministic) {
        s->n_groups = s->n_blocks; /* one key block each, dQ added atomically */
        s->slices = 1;
    } else {
        /* Each thread block walks one key block of each round of n_groups
         * (rounds alternate direction, which balances causal work) into a
         * slice of its own. Time goes as (waves of thread blocks) x (key
         * blocks per thread block); take the fewest groups (slices to clear
         * and sum) that reach the least of it, within the memory cap. */
        int64_t blocks_per_group = (int64_t)plan->col_splits * a->batch * a->heads_kv;
        int64_t sms = ctx->profile.sm_count > 0 ? ctx->profile.sm_count : 1;
        int64_t by_memory = 1 + (int64_t)(deterministic_extra_bytes(ctx) / s->slice_bytes);
        int64_t best = 1, best_cost = INT64_MAX;
        for (int64_t g = 1; g <= s->n_blocks && g <= by_memory; g++) {
            int64_t waves = (blocks_per_group * g + sms - 1) / sms;
            int64_t cost = waves * ((s->n_blocks + g - 1) / g);
            if (cost < best_cost) best = g, best_cost = cost;
        }
        s->n_groups = (int)best;
        s->slices = s->n_groups;
    }
    s->total_bytes = s->delta_bytes + (size_t)s->slices * s->slice_bytes;
}

static fg_status check_backward_args(fg_context *ctx, const fg_spec *s, const fg_backward_args *a) {
    fg_status st = check_forward_args(ctx, s, &a->forward);
    if (st) return st;
    if (!a->forward.lse)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                       "forward.lse: NULL; the backward needs the forward's log-sum-exp");
    if ((st = check_tensor(ctx, "d_o", &a->d_o, s->head_dim)) ||
        (st = check_tensor(ctx, "d_q", &a->d_q, s->head_dim)) ||
        (st = check_tensor(ctx, "d_k", &a->d_k, s->head_dim)) ||
        (st = check_tensor(ctx, "d_v", &a->d_v, s->head_dim)))
        return st;
    if (a->deterministic != 0 && a->deterministic != 1)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "deterministic: %d; must be 0 or 1",
                       a->deterministic);
    if (a->workspace && (uintptr_t)a->workspace % WORKSPACE_ALIGN != 0)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "workspace: %p is not %d-byte aligned",
                       a->workspace, WORKSPACE_ALIGN);
    return FG_OK;
}

/* Validate, and find (live: load) the backward kernel: the tuned tiling for
 * this GPU and length when there is one, else the derived plan. */
static fg_status prepare(fg_context *ctx, const fg_spec *spec, const fg_backward_args *a,
                         fg_spec *s, fg_kernel **k) {
    if (!ctx) return fg_fail(NULL, FG_ERR_INVALID_ARGUMENT, "ctx: NULL context");
    if (!a) return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "args: NULL");
    char err[512];
    if (spec_canonicalize(spec, s, err, sizeof err) != 0)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "%s", err);
    fg_status st = check_backward_args(ctx, s, a);
    if (st || (st = check_spec_for_target(ctx, s))) return st;
    const plan_tiling *tuned = ctx->live ? tune_lookup(ctx, FG_PASS_BACKWARD, s, a->forward.seqlen_k) : NULL;
    return kernels_get(ctx, FG_PASS_BACKWARD, s, tuned, ctx->live, k);
}

fg_status fg_backward_workspace_size(fg_context *ctx, const fg_spec *spec,
                                     const fg_backward_args *args, size_t *bytes) {
    if (ctx && !bytes) return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "bytes: NULL");
    fg_spec s;
    fg_kernel *k;
    fg_status st = prepare(ctx, spec, args, &s, &k);
    if (st) return st;
    schedule sched;
    schedule_of(ctx, &k->bwd_plan, &args->forward, args->deterministic, &sched);
    *bytes = sched.total_bytes;
    return FG_OK;
}

/* The context's own workspace, grown to `bytes`. Growing waits for the
 * device: earlier calls may still be using the old one. */
static fg_status context_workspace(fg_context *ctx, size_t bytes, CUdeviceptr *out) {
    const cuda_driver *cu = ctx->cu;
    if (ctx->workspace_bytes < bytes) {
        fg_status st;
        if (ctx->workspace) {
            if ((st = fg_cuda_check(ctx, cu->cuCtxSynchronize(), "workspace: cuCtxSynchronize")))
                return st;
            cu->cuMemFree(ctx->workspace);
            ctx->workspace = 0;
            ctx->workspace_bytes = 0;
        }
        if (cu->cuMemAlloc(&ctx->workspace, bytes) != CUDA_SUCCESS)
            return fg_fail(ctx, FG_ERR_OUT_OF_MEMORY,
                           "workspace: cannot allocate %zu bytes of device memory", bytes);
        ctx->workspace_bytes = bytes;
    }
    *out = ctx->workspace;
    return FG_OK;
}

fg_status fg_backward(fg_context *ctx, const fg_spec *spec, const fg_backward_args *a) {
    fg_spec s;
    fg_kernel *k = NULL;
    fg_status st = prepare(ctx, spec, a, &s, &k);
    if (st) return st;
    if (!ctx->live) return fg_make_current(ctx); /* offline: built, never launched */
    return backward_launch(ctx, &s, a, k);
}

fg_status backward_launch(fg_context *ctx, const fg_spec *s, const fg_backward_args *a,
                          const fg_kernel *k) {
    fg_status st;
    schedule sched;
    schedule_of(ctx, &k->bwd_plan, &a->forward, a->deterministic, &sched);
    const fg_bwd_plan *plan = &k->bwd_plan;
    const fg_forward_args *f = &a->forward;
    int64_t rows = (int64_t)f->batch * f->heads_q * f->seqlen_q;
    int64_t main_blocks = (int64_t)plan->col_splits * sched.n_groups * f->heads_kv * f->batch;
    int64_t pre_blocks = (rows + 31) / 32;
    int64_t post_blocks = (rows * (plan->head_dim_padded / 2) + 255) / 256;
    if (main_blocks > INT32_MAX || pre_blocks > INT32_MAX || post_blocks > INT32_MAX)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                       "batch*heads*seqlen: %lld query rows need more than 2^31-1 thread blocks",
                       (long long)rows);

    CUdeviceptr ws = 0;
    if (a->workspace) {
        if (a->workspace_bytes < sched.total_bytes)
            return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                           "workspace_bytes: %zu; this call needs %zu "
                           "(fg_backward_workspace_size)",
                           a->workspace_bytes, sched.total_bytes);
        ws = (CUdeviceptr)(uintptr_t)a->workspace;
    } else if ((st = fg_make_current(ctx)) || (st = context_workspace(ctx, sched.total_bytes, &ws))) {
        return st;
    }

    fg_bwd_params p;
    memset(&p, 0, sizeof p);
    p.d_o = (uint64_t)(uintptr_t)a->d_o.data;
    p.dq = (uint64_t)(uintptr_t)a->d_q.data;
    p.dk = (uint64_t)(uintptr_t)a->d_k.data;
    p.dv = (uint64_t)(uintptr_t)a->d_v.data;
    p.delta = (uint64_t)ws;
    p.dq_accum = (uint64_t)ws + sched.delta_bytes;
    tensor_strides(&a->d_o, &p.do_sb, &p.do_ss, &p.do_sh);
    tensor_strides(&a->d_q, &p.dq_sb, &p.dq_ss, &p.dq_sh);
    tensor_strides(&a->d_k, &p.dk_sb, &p.dk_ss, &p.dk_sh);
    tensor_strides(&a->d_v, &p.dv_sb, &p.dv_ss, &p.dv_sh);
    p.dq_slice = (int64_t)(sched.slice_bytes / sizeof(float));
    launch_values lv;
    launch_values_of(s, f, &lv);
    SET_FORWARD_CALL_PARAMS(p, f, lv);
    if (f->layout) {
        p.query_count = (uint64_t)f->layout->counts_by_key;
        p.query_index = (uint64_t)f->layout->indices_by_key;
    }
    p.num_n_blocks = sched.n_blocks;
    p.n_groups = sched.n_groups;
    p.dq_slices = sched.slices;

    if ((st = fg_make_current(ctx))) return st;
    const cuda_driver *cu = ctx->cu;
    CUstream stream = (CUstream)f->stream;
    void *params[] = {&p};
    size_t accum_words = (size_t)sched.slices * sched.slice_bytes / sizeof(float);
    if ((st = fg_cuda_check(ctx, cu->cuMemsetD32Async((CUdeviceptr)p.dq_accum, 0, accum_words, stream),
                            "cuMemsetD32Async(dQ accumulator)")) ||
        (st = fg_cuda_check(ctx, cu->cuLaunchKernel(k->pre, (unsigned)pre_blocks, 1, 1, 256, 1, 1, 0,
                                                    stream, params, NULL),
                            "cuLaunchKernel(backward rows)")) ||
        (st = fg_cuda_check(ctx, cu->cuLaunchKernel(k->function, (unsigned)main_blocks, 1, 1,
                                                    (unsigned)plan->threads, 1, 1,
                                                    (unsigned)plan->smem_bytes, stream, params, NULL),
                            "cuLaunchKernel(backward)")))
        return st;
    return fg_cuda_check(ctx, cu->cuLaunchKernel(k->post, (unsigned)post_blocks, 1, 1, 256, 1, 1, 0,
                                                 stream, params, NULL),
                         "cuLaunchKernel(backward dQ)");
}
