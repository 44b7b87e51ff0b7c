/* Runtime block layouts: a 0/1 block matrix becomes, per query block, the
 * ascending list of kept key blocks (the forward's view) and, per key block,
 * the ascending list of query blocks that keep it (the backward's), uploaded
 * once and reused by every call. A block mask's lists are built on the
 * device from a mask predicate instead (block_mask family). */
#include <stdlib.h>
#include <string.h>

#include "gen/spec.h"
#include "runtime/runtime.h"

static fg_status upload(fg_context *ctx, uint64_t *dst, const int32_t *src, size_t count) {
    const cuda_driver *cu = ctx->cu;
    CUdeviceptr p = 0;
    fg_status st = fg_cuda_check(ctx, cu->cuMemAlloc(&p, count * sizeof *src), "layout: cuMemAlloc");
    if (st) return st;
    *dst = p;
    return fg_cuda_check(ctx, cu->cuMemcpyHtoD(p, src, count * sizeof *src), "layout: upload");
}

fg_status fg_layout_create(fg_context *ctx, const uint8_t *mask, int heads, int blocks_q,
                           int blocks_k, fg_layout **out) {
    if (!ctx) return fg_fail(NULL, FG_ERR_INVALID_ARGUMENT, "ctx: NULL context");
    if (!out) return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "layout: out is NULL");
    *out = NULL;
    if (!mask) return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "layout: mask is NULL");
    if (heads < 1 || blocks_q < 1 || blocks_k < 1)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                       "layout: shape (%d, %d, %d) must be positive in every dimension", heads,
                       blocks_q, blocks_k);
    if ((int64_t)heads * blocks_q * blocks_k > (int64_t)1 << 30)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "layout: shape (%d, %d, %d) is too large",
                       heads, blocks_q, blocks_k);
    for (int64_t n = 0; n < (int64_t)heads * blocks_q * blocks_k; n++)
        if (mask[n] > 1)
            return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                           "layout: mask[%lld] = %d; entries must be 0 or 1", (long long)n,
                           mask[n]);
    fg_status st = FG_OK;
    size_t lists = (size_t)heads * blocks_q, key_lists = (size_t)heads * blocks_k;
    size_t cells = lists * (size_t)blocks_k;
    int32_t *counts = calloc(lists, sizeof *counts);
    int32_t *indices = calloc(cells, sizeof *indices);
    int32_t *counts_by_key = calloc(key_lists, sizeof *counts_by_key);
    int32_t *indices_by_key = calloc(cells, sizeof *indices_by_key);
    fg_layout *layout = calloc(1, sizeof *layout);
    if (!counts || !indices || !counts_by_key || !indices_by_key || !layout) {
        st = fg_fail(ctx, FG_ERR_OUT_OF_MEMORY, "layout: out of memory");
        goto fail;
    }
    for (size_t l = 0; l < lists; l++) {
        const uint8_t *row = mask + l * (size_t)blocks_k;
        int32_t *list = indices + l * (size_t)blocks_k;
        for (int j = 0; j < blocks_k; j++)
            if (row[j]) list[counts[l]++] = j;
    }
    for (int h = 0; h < heads; h++)
        for (int j = 0; j < blocks_k; j++) {
            size_t l = (size_t)h * blocks_k + j;
            int32_t *list = indices_by_key + l * (size_t)blocks_q;
            for (int i = 0; i < blocks_q; i++)
                if (mask[((size_t)h * blocks_q + i) * blocks_k + j]) list[counts_by_key[l]++] = i;
        }
    layout->ctx = ctx;
    layout->lists.batch = 1;
    layout->lists.heads = heads;
    layout->lists.blocks_q = blocks_q;
    layout->lists.blocks_k = blocks_k;
    /* an offline context keeps only the shape: its calls never launch */
    if (ctx->live) {
        st = fg_make_current(ctx);
        if (!st) st = upload(ctx, &layout->lists.counts, counts, lists);
        if (!st) st = upload(ctx, &layout->lists.indices, indices, cells);
        if (!st) st = upload(ctx, &layout->lists.counts_by_key, counts_by_key, key_lists);
        if (!st) st = upload(ctx, &layout->lists.indices_by_key, indices_by_key, cells);
        /* a copy from pageable memory may return before it lands; calls on
         * streams that do not wait for the default one would race it */
        if (!st) st = fg_cuda_check(ctx, ctx->cu->cuCtxSynchronize(), "layout: upload");
    }
fail:
    free(counts);
    free(indices);
    free(counts_by_key);
    free(indices_by_key);
    if (st == FG_OK) {
        *out = layout;
        return FG_OK;
    }
    fg_layout_destroy(layout);
    return st;
}

void fg_layout_destroy(fg_layout *layout) {
    if (!layout) return;
    if (layout->ctx && layout->ctx->live && fg_make_current(layout->ctx) == FG_OK) {
        const family_layout *l = &layout->lists;
        uint64_t lists[] = {l->counts, l->indices, l->counts_by_key, l->indices_by_key, l->states};
        for (int i = 0; i < 5; i++)
            if (lists[i]) layout->ctx->cu->cuMemFree(lists[i]);
    }
    free(layout);
}

/* Whether the spec's mask predicate reads b and h: a list set per batch row
 * (per head) only where it does. */
static fg_status mask_reads(fg_context *ctx, const fg_spec *s, int *reads_b, int *reads_h) {
    expr_tree *trees = malloc(2 * sizeof *trees);
    char err[512];
    if (!trees) return fg_fail(ctx, FG_ERR_OUT_OF_MEMORY, "block mask: out of memory");
    fg_status st = FG_OK;
    if (spec_expr_trees(s, &trees[0], &trees[1], err, sizeof err) != 0) {
        st = fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "%s", err);
    } else {
        *reads_b = expr_uses_var(&trees[1], EXPR_VAR_B);
        *reads_h = expr_uses_var(&trees[1], EXPR_VAR_H);
    }
    free(trees);
    return st;
}

static fg_status alloc_list(fg_context *ctx, uint64_t *dst, size_t bytes) {
    CUdeviceptr p = 0;
    fg_status st = fg_cuda_check(ctx, ctx->cu->cuMemAlloc(&p, bytes ? bytes : 1),
                                 "block mask: cuMemAlloc");
    *dst = p;
    return st;
}

fg_status fg_block_mask_create(fg_context *ctx, const fg_spec *spec, const fg_forward_args *args,
                               fg_layout **out) {
    if (!ctx) return fg_fail(NULL, FG_ERR_INVALID_ARGUMENT, "ctx: NULL context");
    if (!out) return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "block mask: out is NULL");
    *out = NULL;
    if (!spec) return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "spec: NULL");
    if (!args) return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "args: NULL");
    fg_spec s;
    const kernel_family *f;
    fg_status st;
    int reads_b = 0, reads_h = 0;
    if ((st = canonical_pass_spec(ctx, spec, FG_PASS_BLOCK_MASK, &s)) ||
        (st = family_of(ctx, &s, FG_PASS_BLOCK_MASK, &f)) ||
        (st = check_block_mask_args(ctx, &s, args)) ||
        (st = mask_reads(ctx, &s, &reads_b, &reads_h)))
        return st;
    family_layout l;
    memset(&l, 0, sizeof l);
    l.batch = reads_b ? args->batch : 1;
    l.heads = reads_h ? args->heads_q : 1;
    l.blocks_q = (args->seqlen_q + s.sparse_block_q - 1) / s.sparse_block_q;
    l.blocks_k = (args->seqlen_k + s.sparse_block_k - 1) / s.sparse_block_k;
    size_t sets = (size_t)l.batch * (size_t)l.heads;
    size_t cells = sets * (size_t)l.blocks_q * (size_t)l.blocks_k;
    if (cells > (size_t)1 << 30)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                       "block mask: (%d, %d, %d, %d) blocks (batch, heads, query and key "
                       "blocks; a batch row or head only where the predicate reads b or h) "
                       "exceed 2^30: take larger blocks",
                       l.batch, l.heads, l.blocks_q, l.blocks_k);
    fg_layout *layout = calloc(1, sizeof *layout);
    if (!layout) return fg_fail(ctx, FG_ERR_OUT_OF_MEMORY, "block mask: out of memory");
    layout->ctx = ctx;
    layout->mask_mod = s.mask_mod;
    layout->per_batch = reads_b, layout->per_head = reads_h;
    fg_kernel *k = NULL;
    /* an offline context keeps only the shape: its calls never launch */
    if (!ctx->live) {
        layout->lists = l;
    } else if (!(st = kernels_get(ctx, f, &s, NULL, 1, &k)) && !(st = fg_make_current(ctx)) &&
               !(st = alloc_list(ctx, &l.states, cells)) &&
               !(st = alloc_list(ctx, &l.counts, sets * l.blocks_q * 4)) &&
               !(st = alloc_list(ctx, &l.indices, cells * 4)) &&
               !(st = alloc_list(ctx, &l.counts_by_key, sets * l.blocks_k * 4)) &&
               !(st = alloc_list(ctx, &l.indices_by_key, cells * 4))) {
        family_call call = call_of(&s, args, NULL);
        call.layout = l;
        layout->lists = l;
        st = launch_call(ctx, k, &s, &call, NULL, 0);
    } else {
        layout->lists = l; /* what was allocated, for destroy */
    }
    if (st) {
        fg_layout_destroy(layout);
        return st;
    }
    *out = layout;
    return FG_OK;
}
