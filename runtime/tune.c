/* fg_tune: time a pass's tilings on the live GPU and keep the choice
 * (tune_store.c). The candidates are the derived plan first, then every
 * family that runs the pass here offers its own (in the table's order),
 * each compiled without spills and checked against the derived plan's
 * outputs before it is timed (tune_select.c measures and chooses). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen/spec.h"
#include "reference/halfconv.h"
#include "runtime/runtime.h"

#define TUNE_WARMUP 3
#define TUNE_ROUNDS 15
#define TUNE_TOKENS 16384
#define TUNE_HIDDEN 2048

/* Device buffers of one tuning problem: the backward's, which hold the
 * forward's too. */
typedef struct tune_buffers {
    CUdeviceptr q, k, v, o, lse;
    CUdeviceptr d_o, grad[3]; /* dO in; dQ, dK, dV out */
    fg_layout *layout;
    size_t elems;             /* of each tensor: (B,S,H,max(D,Dv)) */
} tune_buffers;

typedef struct tune_run {
    fg_context *ctx;
    const fg_spec *spec;
    fg_forward_args forward;
    fg_backward_args backward;
    family_call call;
    const fg_kernel *kernels[TUNE_MAX_CANDIDATES];
    CUevent start, stop;
} tune_run;

static double time_one(void *user, int i) {
    tune_run *r = user;
    const cuda_driver *cu = r->ctx->cu;
    float ms = -1.f;
    if (cu->cuEventRecord(r->start, NULL) ||
        launch_call(r->ctx, r->kernels[i], r->spec, &r->call, NULL, 0) ||
        cu->cuEventRecord(r->stop, NULL) || cu->cuEventSynchronize(r->stop) ||
        cu->cuEventElapsedTime(&ms, r->start, r->stop))
        return -1.0;
    return ms;
}

/* Random 16-bit floats in ±[0.25, 1): sign, one of two exponents, mantissa. */
static void random_fill(uint16_t *h, size_t n, fg_dtype dtype, uint64_t *state) {
    for (size_t i = 0; i < n; i++) {
        *state = *state * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t r = (uint32_t)(*state >> 33);
        h[i] = dtype == FG_BF16
                   ? (uint16_t)((r & 0x8000u) | (uint32_t)(125 + (r >> 16 & 1)) << 7 | (r & 0x7fu))
                   : (uint16_t)((r & 0x8000u) | (uint32_t)(13 + (r >> 16 & 1)) << 10 | (r & 0x3ffu));
    }
}

/* Outputs of two tilings differ only in the order of fp32 sums and the last
 * rounding: a few units in the last place, within 1/32 plus rel of their
 * size (the family's tolerance). */
static int same_output(const uint16_t *a, const uint16_t *b, size_t n, fg_dtype dtype, float rel) {
    for (size_t i = 0; i < n; i++) {
        float x = dtype == FG_BF16 ? ref_bf16_to_float(a[i]) : ref_half_to_float(a[i]);
        float y = dtype == FG_BF16 ? ref_bf16_to_float(b[i]) : ref_half_to_float(b[i]);
        if (!(fabsf(x - y) <= 1.f / 32 + rel * fabsf(x))) return 0;
    }
    return 1;
}

static void free_buffers(fg_context *ctx, tune_buffers *b) {
    CUdeviceptr *all[] = {&b->q, &b->k, &b->v, &b->o, &b->lse,
                          &b->d_o, &b->grad[0], &b->grad[1], &b->grad[2]};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (*all[i]) ctx->cu->cuMemFree(*all[i]);
    fg_layout_destroy(b->layout);
}

static fg_tensor tensor(CUdeviceptr p, int seqlen, int heads, int head_dim) {
    return fg_tensor_bshd((void *)(uintptr_t)p, seqlen, heads, head_dim);
}

/* The problem a bucket is timed on: seqlen = the bucket, batch filling 16k
 * tokens, hidden size 2048, dropout 0.1, a 256-key window, a random layout
 * keeping half the blocks (and the diagonal), and a random dO. O and the
 * log-sum-exp come from one forward call with the derived plan, so a
 * backward's inputs are those of a real call. */
static fg_status setup_problem(fg_context *ctx, const fg_spec *s, int bucket, tune_buffers *b,
                               tune_run *r, uint16_t **host) {
    fg_forward_args *a = &r->forward;
    const cuda_driver *cu = ctx->cu;
    int seqlen = bucket, batch = bucket >= TUNE_TOKENS ? 1 : TUNE_TOKENS / bucket;
    int heads = TUNE_HIDDEN / s->head_dim > 0 ? TUNE_HIDDEN / s->head_dim : 1;
    /* q, k, dQ, dK rows are D wide, v, o, dO, dV rows Dv: each buffer holds
     * the wider, the outputs zeroed so that what a narrower one leaves is
     * alike for every candidate */
    const int d = s->head_dim, dv = spec_head_dim_v(s), widest = d > dv ? d : dv;
    size_t n = (size_t)batch * seqlen * heads * widest;
    b->elems = n;
    *a = fg_forward_args_default();
    a->batch = batch, a->heads_q = a->heads_kv = heads, a->seqlen_q = a->seqlen_k = seqlen;
    if (s->dropout) a->dropout_p = 0.1f, a->seed = 1234, a->offset = 0;
    if (s->mask == FG_MASK_WINDOW) a->window_left = 256, a->window_right = 0;
    fg_status st;
    CUdeviceptr *t[] = {&b->q, &b->k, &b->v, &b->o, &b->d_o, &b->grad[0], &b->grad[1], &b->grad[2]};
    for (int i = 0; i < 8; i++)
        if ((st = fg_cuda_check(ctx, cu->cuMemAlloc(t[i], n * 2), "cuMemAlloc(tuning tensors)")) ||
            (st = fg_cuda_check(ctx, cu->cuMemsetD8(*t[i], 0, n * 2), "cuMemsetD8(tuning tensors)")))
            return st;
    if ((st = fg_cuda_check(ctx, cu->cuMemAlloc(&b->lse, (size_t)batch * heads * seqlen * 4),
                            "cuMemAlloc(tuning lse)")))
        return st;
    *host = malloc(n * 2 * 3); /* inputs, then up to three outputs */
    if (!*host) return fg_fail(ctx, FG_ERR_OUT_OF_MEMORY, "tuning: out of host memory");
    uint64_t state = 0x9e3779b97f4a7c15ull ^ (uint64_t)bucket;
    for (int i = 0; i < 3; i++) { /* fresh inputs: q, k, v */
        random_fill(*host, n, s->dtype, &state);
        if ((st = fg_cuda_check(ctx, cu->cuMemcpyHtoD(*t[i], *host, n * 2), "cuMemcpyHtoD(tuning)")))
            return st;
    }
    if (s->sparsity == FG_SPARSE_LAYOUT) {
        int bq = (seqlen + s->sparse_block_q - 1) / s->sparse_block_q;
        int bk = (seqlen + s->sparse_block_k - 1) / s->sparse_block_k;
        uint8_t *mask = malloc((size_t)bq * bk);
        if (!mask) return fg_fail(ctx, FG_ERR_OUT_OF_MEMORY, "tuning: out of host memory");
        for (int i = 0; i < bq * bk; i++) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            mask[i] = (state >> 40 & 1) || i / bk == i % bk;
        }
        st = fg_layout_create(ctx, mask, 1, bq, bk, &b->layout);
        free(mask);
        if (st) return st;
        a->layout = b->layout;
    }
    a->q = tensor(b->q, seqlen, heads, d);
    a->k = tensor(b->k, seqlen, heads, d);
    a->v = tensor(b->v, seqlen, heads, dv);
    a->o = tensor(b->o, seqlen, heads, dv);
    a->lse = (float *)(uintptr_t)b->lse;
    random_fill(*host, n, s->dtype, &state);
    if ((st = fg_cuda_check(ctx, cu->cuMemcpyHtoD(b->d_o, *host, n * 2), "cuMemcpyHtoD(tuning)")))
        return st;
    memset(&r->backward, 0, sizeof r->backward);
    r->backward.forward = *a;
    r->backward.d_o = tensor(b->d_o, seqlen, heads, dv);
    r->backward.d_q = tensor(b->grad[0], seqlen, heads, d);
    r->backward.d_k = tensor(b->grad[1], seqlen, heads, d);
    r->backward.d_v = tensor(b->grad[2], seqlen, heads, dv);
    if ((st = check_backward_args(ctx, s, &r->backward))) return st;
    r->call = call_of(s, &r->backward.forward, &r->backward);
    return fg_forward(ctx, s, a);
}

/* Copy the outputs a candidate of family f wrote: O, or dQ, dK and dV one
 * after the other. *count is the number of elements. */
static fg_status read_outputs(fg_context *ctx, const kernel_family *f, const tune_buffers *b,
                              uint16_t *out, size_t *count) {
    const CUdeviceptr *src = f->writes == FAMILY_WRITES_GRADIENTS ? b->grad : &b->o;
    int tensors = f->writes == FAMILY_WRITES_GRADIENTS ? 3 : 1;
    for (int i = 0; i < tensors; i++) {
        fg_status st = fg_cuda_check(ctx, ctx->cu->cuMemcpyDtoH(out + i * b->elems, src[i],
                                                                b->elems * 2),
                                     "cuMemcpyDtoH(tuning output)");
        if (st) return st;
    }
    *count = tensors * b->elems;
    return FG_OK;
}

/* The choices to time: the derived plan of the pass's family first, then
 * each family's candidates that compile without spills. */
static fg_status collect_choices(fg_context *ctx, const kernel_family *derived_family,
                                 const fg_spec *s, tune_choice *choices, int *count) {
    fg_kernel *k;
    fg_status st = kernels_get(ctx, derived_family, s, NULL, 1, &k);
    if (st) return st;
    choices[0].family = derived_family;
    derived_family->tiling_of(&k->plan, &choices[0].tiling);
    int n = 1;
    const kernel_family *families[8];
    int nf = context_families(ctx, derived_family->pass, families, 8);
    for (int i = 0; i < nf; i++) {
        const kernel_family *f = families[i];
        char err[256];
        if (f->supports(s, &ctx->profile, err, sizeof err) != 0) continue;
        family_tiling cand[TUNE_MAX_CANDIDATES];
        int m = f->candidates(s, &ctx->profile, cand, TUNE_MAX_CANDIDATES - 1);
        for (int c = 0; c < m && n < TUNE_MAX_CANDIDATES; c++) {
            tune_choice x = {f, cand[c]};
            if (x.family == choices[0].family &&
                memcmp(&x.tiling, &choices[0].tiling, sizeof x.tiling) == 0)
                continue;
            if (kernels_get(ctx, f, s, &x.tiling, 1, &k) != FG_OK || k->info.spill_bytes > 0)
                continue;
            choices[n++] = x;
        }
    }
    *count = n;
    return FG_OK;
}

fg_status fg_tune(fg_context *ctx, const fg_spec *spec, fg_pass pass, int seqlen,
                  fg_tune_report *out) {
    fg_spec s;
    const kernel_family *family;
    fg_status st = tune_args(ctx, spec, pass, out, &s, &family);
    if (st) return st;
    if (seqlen < 1) return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "seqlen: %d; must be >= 1", seqlen);
    if ((st = fg_make_current(ctx))) return st;
    memset(out, 0, sizeof *out);
    int bucket = tune_bucket(seqlen);

    tune_choice choices[TUNE_MAX_CANDIDATES];
    int n = 0;
    if ((st = collect_choices(ctx, family, &s, choices, &n))) return st;

    tune_run run;
    memset(&run, 0, sizeof run);
    run.ctx = ctx, run.spec = &s;
    tune_buffers buf;
    memset(&buf, 0, sizeof buf);
    uint16_t *host = NULL, *first = NULL;
    st = setup_problem(ctx, &s, bucket, &buf, &run, &host);
    if (!st) first = malloc(buf.elems * 2 * 3);
    if (!st && !first) st = fg_fail(ctx, FG_ERR_OUT_OF_MEMORY, "tuning: out of host memory");
    if (!st) st = fg_cuda_check(ctx, ctx->cu->cuEventCreate(&run.start, 0), "cuEventCreate");
    if (!st) st = fg_cuda_check(ctx, ctx->cu->cuEventCreate(&run.stop, 0), "cuEventCreate");

    /* the table no longer grows: its pointers stay valid from here on; each
     * candidate must reproduce the derived plan's outputs before it is timed */
    int kept = 0;
    size_t outputs = 0, got = 0;
    tune_choice timed[TUNE_MAX_CANDIDATES];
    for (int i = 0; i < n && !st; i++) {
        fg_kernel *k;
        if ((st = kernels_get(ctx, choices[i].family, &s, i ? &choices[i].tiling : NULL, 1, &k)))
            break;
        st = launch_call(ctx, k, &s, &run.call, NULL, 0);
        if (!st) st = fg_cuda_check(ctx, ctx->cu->cuCtxSynchronize(), "tuning run");
        if (!st) st = read_outputs(ctx, k->family, &buf, i ? host : first, i ? &got : &outputs);
        if (st) {
            if (i == 0) break;
            st = FG_OK; /* a candidate that does not run is not timed */
            continue;
        }
        if (i > 0 && (got != outputs || !same_output(first, host, outputs, s.dtype,
                                                     k->family->tuning_rel_tolerance)))
            continue;
        run.kernels[kept] = k;
        timed[kept++] = choices[i];
    }
    tune_outcome oc;
    if (!st && tune_measure(kept, time_one, &run, TUNE_WARMUP, TUNE_ROUNDS, &oc) != 0)
        st = fg_fail(ctx, FG_ERR_CUDA, "tuning: the derived plan failed to run");

    if (!st) {
        tune_entry e;
        memset(&e, 0, sizeof e);
        spec_name(&s, e.spec, sizeof e.spec);
        e.pass = pass, e.bucket = bucket;
        e.derived = timed[0], e.chosen = timed[oc.chosen];
        e.derived_ms = oc.median[0], e.chosen_ms = oc.median[oc.chosen], e.spread = oc.spread;
        int persisted = 0;
        st = tune_keep(ctx, &e, &persisted);
        tune_report_of(ctx, &s, &e, out);
        out->candidates = kept;
        out->persisted = persisted;
    }
    if (run.start) ctx->cu->cuEventDestroy(run.start);
    if (run.stop) ctx->cu->cuEventDestroy(run.stop);
    free_buffers(ctx, &buf);
    free(host);
    free(first);
    return st;
}
