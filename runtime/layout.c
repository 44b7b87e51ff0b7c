/* Runtime block layouts: a 0/1 block matrix becomes, per query block, the
 * ascending list of kept key blocks (the forward's view) and, per key block,
 * the ascending list of query blocks that keep it (the backward's), uploaded
 * once and reused by every call. */
#include <stdlib.h>
#include <string.h>

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
        uint64_t lists[] = {l->counts, l->indices, l->counts_by_key, l->indices_by_key};
        for (int i = 0; i < 4; i++)
            if (lists[i]) layout->ctx->cu->cuMemFree(lists[i]);
    }
    free(layout);
}
