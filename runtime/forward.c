/* fg_forward: validate a call, find its kernel, launch it.
 * q (B,Sq,Hq,D), k/v (B,Sk,Hkv,D) by strides -> o (B,Sq,Hq,D), lse (B,Hq,Sq) */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "gen/spec.h"
#include "runtime/kernel_params.h"
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
        if ((l->heads != 1 && l->heads != a->heads_q) || l->blocks_q != bq || l->blocks_k != bk)
            return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                           "layout: shape (%d, %d, %d) does not match (1 or heads_q=%d, "
                           "ceil(%d/%d)=%d, ceil(%d/%d)=%d)",
                           l->heads, l->blocks_q, l->blocks_k, a->heads_q, a->seqlen_q,
                           s->sparse_block_q, bq, a->seqlen_k, s->sparse_block_k, bk);
    } else if (a->layout) {
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "layout: given, but spec.sparsity is not layout");
    }
    return FG_OK;
}

void launch_values_of(const fg_spec *s, const fg_forward_args *a, launch_values *out) {
    memset(out, 0, sizeof *out);
    out->diag_offset = a->align == FG_ALIGN_TOP_LEFT ? 0 : a->seqlen_k - a->seqlen_q;
    float scale = a->softmax_scale != 0.f ? a->softmax_scale : 1.f / sqrtf((float)s->head_dim);
    out->softmax_scale = scale;
    out->scale_log2 = scale * 1.4426950408889634f;
    /* keep iff an 8-bit draw >= threshold; the kept scale matches the
     * threshold actually used, so E[output] is exact */
    uint32_t threshold = s->dropout ? (uint32_t)lround((double)a->dropout_p * 256.0) : 0;
    if (threshold > 256) threshold = 256;
    /* the kernels compare four draws at once against the threshold in every
     * byte; p = 1 clamps to 255, which still keeps draws of 255, and
     * out_scale 0 zeroes those */
    out->drop_threshold4 = (threshold >= 256 ? 255u : threshold) * 0x01010101u;
    out->out_scale = threshold >= 256 ? 0.f : (float)(256.0 / (256.0 - threshold));
    if (s->dropout) {
        /* Philox4x32-10's key schedule: key (seed_lo, seed_hi ^ offset_hi),
         * bumped by the Weyl constants each round */
        uint32_t k0 = (uint32_t)a->seed, k1 = (uint32_t)(a->seed >> 32) ^ (uint32_t)(a->offset >> 32);
        for (int r = 0; r < 10; r++, k0 += 0x9E3779B9u, k1 += 0xBB67AE85u) {
            out->philox_keys[2 * r] = k0;
            out->philox_keys[2 * r + 1] = k1;
        }
    }
}

fg_status fg_forward(fg_context *ctx, const fg_spec *spec, const fg_forward_args *a) {
    if (!ctx) return fg_fail(NULL, FG_ERR_INVALID_ARGUMENT, "ctx: NULL context");
    if (!a) return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "args: NULL");
    fg_spec s;
    char err[512];
    if (spec_canonicalize(spec, &s, err, sizeof err) != 0)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "%s", err);
    fg_status st = check_forward_args(ctx, &s, a);
    if (st) return st;
    if ((st = check_spec_for_target(ctx, &s))) return st;
    if (!ctx->live) return fg_make_current(ctx);

    fg_kernel *k;
    const plan_tiling *tuned = tune_lookup(ctx, FG_PASS_FORWARD, &s, a->seqlen_k);
    if ((st = kernels_get(ctx, FG_PASS_FORWARD, &s, tuned, 1, &k))) return st;
    return forward_launch(ctx, &s, a, k);
}

fg_status forward_launch(fg_context *ctx, const fg_spec *s, const fg_forward_args *a,
                         const fg_kernel *k) {
    fg_status st;
    const fg_fwd_plan *plan = &k->plan;
    int64_t m_blocks = (a->seqlen_q + plan->block_m - 1) / plan->block_m;
    int64_t blocks = m_blocks * a->heads_q * a->batch;
    if (blocks > INT32_MAX)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                       "batch*heads_q*ceil(seqlen_q/%d) = %lld thread blocks exceeds 2^31-1",
                       plan->block_m, (long long)blocks);

    fg_fwd_params p;
    memset(&p, 0, sizeof p);
    launch_values lv;
    launch_values_of(s, a, &lv);
    SET_FORWARD_CALL_PARAMS(p, a, lv);
    if (a->layout) {
        p.block_count = (uint64_t)a->layout->counts;
        p.block_index = (uint64_t)a->layout->indices;
    }
    p.num_m_blocks = (int32_t)m_blocks;
    if ((st = fg_make_current(ctx))) return st;
    void *params[] = {&p};
    return fg_cuda_check(ctx,
                         ctx->cu->cuLaunchKernel(k->function, (unsigned)blocks, 1, 1,
                                                 (unsigned)plan->threads, 1, 1,
                                                 (unsigned)plan->smem_bytes, (CUstream)a->stream,
                                                 params, NULL),
                         "cuLaunchKernel(forward)");
}
