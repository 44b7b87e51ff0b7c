/* Validation of calls: tensors, shapes, masks, dropout, layouts, and the
 * backward's own arguments. Every message names the argument and the reason. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "gen/spec.h"
#include "runtime/runtime.h"

/* Lengths up to 2^30 keep every index the kernel forms (i + offset, j - i)
 * inside 32 bits. */
#define MAX_SEQLEN (1 << 30)

fg_tensor fg_tensor_bshd(void *data, int seqlen, int heads, int head_dim) {
    fg_tensor t = {data, (int64_t)seqlen * heads * head_dim, (int64_t)heads * head_dim, head_dim, 1};
    return t;
}

fg_tensor fg_tensor_bhsd(void *data, int seqlen, int heads, int head_dim) {
    fg_tensor t = {data, (int64_t)seqlen * heads * head_dim, head_dim, (int64_t)seqlen * head_dim, 1};
    return t;
}

fg_forward_args fg_forward_args_default(void) {
    fg_forward_args a;
    memset(&a, 0, sizeof a);
    a.align = FG_ALIGN_BOTTOM_RIGHT;
    a.window_left = -1;
    a.window_right = -1;
    return a;
}

/* Pointers and strides of one tensor: 16-byte alignment for the vector path
 * (head dims that are multiples of 8), 2 bytes otherwise. */
fg_status check_tensor(fg_context *ctx, const char *name, const fg_tensor *t, int head_dim) {
    if (!t->data) return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "%s.data: NULL pointer", name);
    if (t->stride_dim != 1)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                       "%s.stride_dim: %lld; the head dim must be contiguous (stride 1)", name,
                       (long long)t->stride_dim);
    if (t->stride_batch < 0 || t->stride_seq < 0 || t->stride_head < 0)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                       "%s: negative stride (batch %lld, seq %lld, head %lld)", name,
                       (long long)t->stride_batch, (long long)t->stride_seq,
                       (long long)t->stride_head);
    int vec = head_dim % 8 == 0;
    uintptr_t align = vec ? 16 : 2;
    if ((uintptr_t)t->data % align != 0)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                       "%s.data: %p is not %d-byte aligned (needed for head dim %d)", name, t->data,
                       (int)align, head_dim);
    if (vec && (t->stride_batch % 8 || t->stride_seq % 8 || t->stride_head % 8))
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                       "%s: strides (batch %lld, seq %lld, head %lld) must be multiples of 8 "
                       "elements so rows stay 16-byte aligned",
                       name, (long long)t->stride_batch, (long long)t->stride_seq,
                       (long long)t->stride_head);
    return FG_OK;
}

fg_status check_forward_args(fg_context *ctx, const fg_spec *s, const fg_forward_args *a) {
    if (a->batch < 1) return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "batch: %d; must be >= 1", a->batch);
    if (a->heads_q < 1 || a->heads_kv < 1)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "heads_q/heads_kv: %d/%d; must be >= 1",
                       a->heads_q, a->heads_kv);
    if (a->heads_q % a->heads_kv != 0)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                       "heads_kv: heads_q (%d) is not a multiple of heads_kv (%d)", a->heads_q,
                       a->heads_kv);
    if (a->seqlen_q < 1 || a->seqlen_q > MAX_SEQLEN)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "seqlen_q: %d; must be in 1..2^30", a->seqlen_q);
    if (a->seqlen_k < 1 || a->seqlen_k > MAX_SEQLEN)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "seqlen_k: %d; must be in 1..2^30", a->seqlen_k);
    fg_status st;
    if ((st = check_tensor(ctx, "q", &a->q, s->head_dim)) ||
        (st = check_tensor(ctx, "k", &a->k, s->head_dim)) ||
        (st = check_tensor(ctx, "v", &a->v, s->head_dim)) ||
        (st = check_tensor(ctx, "o", &a->o, s->head_dim)))
        return st;
    if (a->lse && (uintptr_t)a->lse % 4 != 0)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "lse: %p is not 4-byte aligned", (void *)a->lse);
    if (a->softmax_scale != 0.f && !(isfinite(a->softmax_scale) && a->softmax_scale > 0.f))
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                       "softmax_scale: %g; must be a finite positive number (0 for 1/sqrt(d))",
                       (double)a->softmax_scale);
    if (a->align != FG_ALIGN_BOTTOM_RIGHT && a->align != FG_ALIGN_TOP_LEFT)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "align: %d is not a causal alignment", (int)a->align);
    if (s->mask == FG_MASK_WINDOW) {
        if (a->window_left < -1 || a->window_right < -1)
            return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                           "window_left/window_right: %d/%d; sizes are >= 0, or -1 for unbounded",
                           a->window_left, a->window_right);
    } else if (a->window_left != -1 || a->window_right != -1) {
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                       "window_left/window_right: %d/%d set, but spec.mask is %s (use "
                       "FG_MASK_WINDOW, or -1 for both)",
                       a->window_left, a->window_right, spec_mask_name(s->mask));
    }
    if (!(a->dropout_p >= 0.f && a->dropout_p <= 1.f))
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "dropout_p: %g; must be in [0, 1]",
                       (double)a->dropout_p);
    if (a->dropout_p > 0.f && !s->dropout)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                       "dropout_p: %g > 0 but spec.dropout is 0", (double)a->dropout_p);
    if (s->dropout && (a->batch > 65536 || a->heads_q > 65536))
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                       "batch/heads_q: %d/%d; dropout's counter holds batch and head in 16 bits "
                       "each (at most 65536)",
                       a->batch, a->heads_q);
    if (s->sparsity == FG_SPARSE_LAYOUT) {
        const fg_layout *l = a->layout;
        if (!l) return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "layout: NULL, but spec.sparsity is layout");
        int bq = (a->seqlen_q + s->sparse_block_q - 1) / s->sparse_block_q;
        int bk = (a->seqlen_k + s->sparse_block_k - 1) / s->sparse_block_k;
        if (l->ctx != ctx)
            return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "layout: created on another context");
        const family_layout *shape = &l->lists;
        if ((shape->heads != 1 && shape->heads != a->heads_q) || shape->blocks_q != bq ||
            shape->blocks_k != bk)
            return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                           "layout: shape (%d, %d, %d) does not match (1 or heads_q=%d, "
                           "ceil(%d/%d)=%d, ceil(%d/%d)=%d)",
                           shape->heads, shape->blocks_q, shape->blocks_k, a->heads_q, a->seqlen_q,
                           s->sparse_block_q, bq, a->seqlen_k, s->sparse_block_k, bk);
    } else if (a->layout) {
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "layout: given, but spec.sparsity is not layout");
    }
    return FG_OK;
}

fg_status check_backward_args(fg_context *ctx, const fg_spec *s, const fg_backward_args *a) {
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
    if (a->workspace && (uintptr_t)a->workspace % FAMILY_WORKSPACE_ALIGN != 0)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "workspace: %p is not %d-byte aligned",
                       a->workspace, FAMILY_WORKSPACE_ALIGN);
    return FG_OK;
}
