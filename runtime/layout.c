/* Runtime block layouts: a 0/1 block matrix becomes, per query block, the
 * ascending list of kept key blocks, uploaded once and reused by every call. */
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime.h"

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
    size_t lists = (size_t)heads * blocks_q;
    int32_t *counts = calloc(lists, sizeof *counts);
    int32_t *indices = calloc(lists * (size_t)blocks_k, sizeof *indices);
    fg_layout *layout = calloc(1, sizeof *layout);
    if (!counts || !indices || !layout) {
        st = fg_fail(ctx, FG_ERR_OUT_OF_MEMORY, "layout: out of memory");
        goto fail;
    }
    for (size_t l = 0; l < lists; l++) {
        const uint8_t *row = mask + l * (size_t)blocks_k;
        int32_t *list = indices + l * (size_t)blocks_k;
        for (int j = 0; j < blocks_k; j++)
            if (row[j]) list[counts[l]++] = j;
    }
    const cuda_driver *cu = ctx->cu;
    layout->ctx = ctx;
    layout->heads = heads;
    layout->blocks_q = blocks_q;
    layout->blocks_k = blocks_k;
    /* an offline context keeps only the shape: its calls never launch */
    if (ctx->live && ((st = fg_make_current(ctx)) ||
        (st = fg_cuda_check(ctx, cu->cuMemAlloc(&layout->counts, lists * sizeof *counts),
                            "layout: cuMemAlloc")) ||
        (st = fg_cuda_check(ctx,
                            cu->cuMemAlloc(&layout->indices,
                                           lists * (size_t)blocks_k * sizeof *indices),
                            "layout: cuMemAlloc")) ||
        (st = fg_cuda_check(ctx, cu->cuMemcpyHtoD(layout->counts, counts, lists * sizeof *counts),
                            "layout: upload")) ||
        (st = fg_cuda_check(ctx,
                            cu->cuMemcpyHtoD(layout->indices, indices,
                                             lists * (size_t)blocks_k * sizeof *indices),
                            "layout: upload"))))
        goto fail;
    free(counts);
    free(indices);
    *out = layout;
    return FG_OK;
fail:
    free(counts);
    free(indices);
    fg_layout_destroy(layout);
    return st;
}

void fg_layout_destroy(fg_layout *layout) {
    if (!layout) return;
    if (layout->ctx && layout->ctx->live && fg_make_current(layout->ctx) == FG_OK) {
        if (layout->counts) layout->ctx->cu->cuMemFree(layout->counts);
        if (layout->indices) layout->ctx->cu->cuMemFree(layout->indices);
    }
    free(layout);
}
