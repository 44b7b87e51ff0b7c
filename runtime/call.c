/* Validation of calls: tensors, shapes, masks, dropout, layouts, and the
 * backward's own arguments. Every message names the argument and the reason. */
#include <math.h>
#include <stdlib.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "families/forward_call.h"
#include "families/fwd_decode.h"
#include "gen/spec.h"
#include "runtime/runtime.h"

/* Lengths up to 2^30 keep every index the kernel forms (i + offset, j - i)
 * inside 32 bits; so does a reach (forward_call_reach: lengths and
 * positions) up to MAX_REACH, and under a window, whose bounds add a side
 * to a distance, up to MAX_WINDOW_REACH. */
#define MAX_SEQLEN (1 << 30)
#define MAX_REACH (((int64_t)1 << 31) - 4096)
#define MAX_WINDOW_REACH ((1 << 30) - 1024)

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

/* A 4-byte array the kernels read or write: 4-byte aligned and, on a live
 * context, in memory of the context's device (a host array is the usual
 * mistake). */
static fg_status check_device_array(fg_context *ctx, const char *name, const void *x) {
    if ((uintptr_t)x % 4 != 0)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "%s: %p is not 4-byte aligned", name, (const void *)x);
    if (!ctx->live) return FG_OK;
    fg_status st = fg_make_current(ctx);
    if (st) return st;
    /* one driver call for both (a pointer unknown to CUDA reads as type 0) */
    unsigned int type = 0;
    int ordinal = -1;
    CUpointer_attribute asked[2] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
    void *answers[2] = {&type, &ordinal};
    if (ctx->cu->cuPointerGetAttributes(2, asked, answers, (CUdeviceptr)(uintptr_t)x) !=
            CUDA_SUCCESS ||
        type != CU_MEMORYTYPE_DEVICE)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                       "%s: %p is not device memory (the array must be on the GPU)", name,
                       (const void *)x);
    if (ordinal >= 0 && ordinal != (int)ctx->device) /* (< 0: not told) */
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "%s: on device %d, but the context runs on %d",
                       name, ordinal, (int)ctx->device);
    return FG_OK;
}

/* The values of a packed call's arrays, read back (the debug checks): each
 * cu_seqlens increasing from >= 0 to at most the tensor's rows, each length
 * within the longest the call names, seqused_k within its sequence. */
static fg_status check_packed_values(fg_context *ctx, const fg_forward_args *a) {
    const cuda_driver *cu = ctx->cu;
    size_t n = (size_t)a->batch + 1;
    int32_t *host = malloc(3 * n * sizeof *host);
    if (!host) return fg_fail(ctx, FG_ERR_OUT_OF_MEMORY, "debug checks: out of host memory");
    int32_t *cq = host, *ck = host + n, *used = host + 2 * n;
    CUresult r = cu->cuStreamSynchronize((CUstream)a->stream);
    if (r == CUDA_SUCCESS) r = cu->cuMemcpyDtoH(cq, (CUdeviceptr)(uintptr_t)a->cu_seqlens_q, n * 4);
    if (r == CUDA_SUCCESS) r = cu->cuMemcpyDtoH(ck, (CUdeviceptr)(uintptr_t)a->cu_seqlens_k, n * 4);
    if (r == CUDA_SUCCESS && a->seqused_k)
        r = cu->cuMemcpyDtoH(used, (CUdeviceptr)(uintptr_t)a->seqused_k, (n - 1) * 4);
    if (r != CUDA_SUCCESS) {
        free(host);
        return fg_cuda_check(ctx, r, "debug checks: reading cu_seqlens back");
    }
    fg_status st = FG_OK;
    const char *names[2] = {"cu_seqlens_q", "cu_seqlens_k"};
    const int32_t *cu_of[2] = {cq, ck};
    const int totals[2] = {a->total_q, a->total_k}, longest[2] = {a->seqlen_q, a->seqlen_k};
    const char *total_names[2] = {"total_q", "total_k"}, *longest_names[2] = {"seqlen_q", "seqlen_k"};
    for (int t = 0; t < 2 && !st; t++) {
        const int32_t *c = cu_of[t];
        if (c[0] < 0) st = fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "%s[0]: %d; must be >= 0", names[t], c[0]);
        for (int b = 0; b < a->batch && !st; b++) {
            if (c[b + 1] < c[b])
                st = fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "%s: decreases at %d (%d, then %d)",
                             names[t], b + 1, c[b], c[b + 1]);
            else if (c[b + 1] - c[b] > longest[t] && !(t == 1 && a->seqused_k))
                st = fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                             "%s: sequence %d has %d rows, more than %s (%d)", names[t], b,
                             c[b + 1] - c[b], longest_names[t], longest[t]);
        }
        if (!st && c[a->batch] > totals[t])
            st = fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "%s[%d]: %d, past %s (%d)", names[t], a->batch,
                         c[a->batch], total_names[t], totals[t]);
    }
    for (int b = 0; b < a->batch && !st && a->seqused_k; b++)
        if (used[b] < 0 || used[b] > ck[b + 1] - ck[b] || used[b] > a->seqlen_k)
            st = fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                         "seqused_k[%d]: %d; must be in 0..min(its sequence's %d rows, seqlen_k %d)",
                         b, used[b], ck[b + 1] - ck[b], a->seqlen_k);
    free(host);
    return st;
}

/* Packed sequences (spec.varlen): the arrays and the packed rows; without
 * them, none of their arguments. */
static fg_status check_packed_args(fg_context *ctx, const fg_spec *s, const fg_forward_args *a) {
    if (!s->varlen) {
        if (a->cu_seqlens_q || a->cu_seqlens_k || a->seqused_k)
            return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                           "cu_seqlens_q/cu_seqlens_k/seqused_k: given, but spec.varlen is 0");
        return FG_OK;
    }
    if (!a->cu_seqlens_q || !a->cu_seqlens_k)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                       "%s: NULL, but spec.varlen is 1 (packed sequences need both cu_seqlens)",
                       a->cu_seqlens_q ? "cu_seqlens_k" : "cu_seqlens_q");
    if (a->total_q < 0 || a->total_k < 0)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "total_q/total_k: %d/%d; must be >= 0",
                       a->total_q, a->total_k);
    fg_status st;
    if ((st = check_device_array(ctx, "cu_seqlens_q", a->cu_seqlens_q)) ||
        (st = check_device_array(ctx, "cu_seqlens_k", a->cu_seqlens_k)) ||
        (a->seqused_k && (st = check_device_array(ctx, "seqused_k", a->seqused_k))))
        return st;
    return ctx->live && ctx->debug_checks ? check_packed_values(ctx, a) : FG_OK;
}

/* A decoding step's arrays read back (the debug checks): each sequence's
 * keys within seqlen_k, the block table's entries for them within the
 * pool, and the split counters 0. */
static fg_status check_cache_values(fg_context *ctx, const fg_forward_args *a) {
    const cuda_driver *cu = ctx->cu;
    size_t n = (size_t)a->batch, table = a->block_table ? n * (size_t)a->block_table_stride : 0;
    size_t counters = a->split_counters ? n * a->heads_q * a->seqlen_q : 0;
    int32_t *host = malloc((n + table + counters) * sizeof *host);
    if (!host) return fg_fail(ctx, FG_ERR_OUT_OF_MEMORY, "debug checks: out of host memory");
    int32_t *lens = host, *pages = host + n, *turns = pages + table;
    CUresult r = cu->cuStreamSynchronize((CUstream)a->stream);
    if (r == CUDA_SUCCESS && a->cache_seqlens)
        r = cu->cuMemcpyDtoH(lens, (CUdeviceptr)(uintptr_t)a->cache_seqlens, n * 4);
    if (r == CUDA_SUCCESS && table)
        r = cu->cuMemcpyDtoH(pages, (CUdeviceptr)(uintptr_t)a->block_table, table * 4);
    if (r == CUDA_SUCCESS && counters)
        r = cu->cuMemcpyDtoH(turns, (CUdeviceptr)(uintptr_t)a->split_counters, counters * 4);
    if (r != CUDA_SUCCESS) {
        free(host);
        return fg_cuda_check(ctx, r, "debug checks: reading cache_seqlens, block_table and "
                             "split_counters back");
    }
    fg_status st = FG_OK;
    for (size_t i = 0; i < counters && !st; i++)
        if (turns[i] != 0)
            st = fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                         "split_counters[%zu]: %d; the counters must be 0 before a call (and "
                         "calls that run at once need counters of their own)", i, turns[i]);
    for (int b = 0; b < a->batch && !st; b++) {
        int cached = a->cache_seqlens ? lens[b] : a->seqlen_k - a->seqlen_new;
        if (a->cache_seqlens && (cached < 0 || (int64_t)cached + a->seqlen_new > a->seqlen_k))
            st = fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                         "cache_seqlens[%d]: %d; with seqlen_new %d it must stay within 0..seqlen_k "
                         "(%d)", b, cached, a->seqlen_new, a->seqlen_k);
        int used = table ? (cached + a->seqlen_new + a->page_size - 1) / a->page_size : 0;
        for (int i = 0; i < used && !st; i++) {
            int page = pages[(size_t)b * a->block_table_stride + i];
            if (page < 0 || page >= a->num_pages)
                st = fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                             "block_table[%d][%d]: page %d is outside the pool (num_pages %d)", b,
                             i, page, a->num_pages);
        }
    }
    free(host);
    return st;
}

/* One page of a pool: every row and head of it within its stride, so the
 * page size agrees with the pool's strides. */
static fg_status check_page(fg_context *ctx, const char *name, const fg_tensor *t,
                            const fg_forward_args *a, int head_dim) {
    if (a->num_pages == 1) return FG_OK; /* one page: its stride is never used */
    int64_t extent = (int64_t)(a->page_size - 1) * t->stride_seq +
                     (int64_t)(a->heads_kv - 1) * t->stride_head + head_dim;
    if (extent > t->stride_batch)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                       "page_size: %d rows do not fit %s's pages: its strides (page %lld, row %lld, "
                       "head %lld) put a page's last row past the next page's first",
                       a->page_size, name, (long long)t->stride_batch, (long long)t->stride_seq,
                       (long long)t->stride_head);
    return FG_OK;
}

/* A decoding step (spec.kv_cache): the cache's arrays, pages and new rows;
 * without it, none of its arguments. */
static fg_status check_cache_args(fg_context *ctx, const fg_spec *s, const fg_forward_args *a) {
    if (!s->kv_cache) {
        if (a->cache_seqlens || a->block_table || a->k_new.data || a->v_new.data || a->seqlen_new ||
            a->num_splits || a->split_counters)
            return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                           "cache_seqlens/block_table/k_new/v_new/seqlen_new/num_splits/"
                           "split_counters: given, but spec.kv_cache is 0");
        return FG_OK;
    }
    fg_status st;
    const int latent = s->kv_cache == FG_KV_LATENT; /* K alone: V its first columns */
    if (a->num_splits < 0 || a->num_splits > DECODE_MAX_SPLITS)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "num_splits: %d; must be in 0..%d (0: chosen)",
                       a->num_splits, DECODE_MAX_SPLITS);
    if (a->workspace && (uintptr_t)a->workspace % FAMILY_WORKSPACE_ALIGN != 0)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "workspace: %p is not %d-byte aligned",
                       a->workspace, FAMILY_WORKSPACE_ALIGN);
    if ((uintptr_t)a->split_counters % 4 != 0)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "split_counters: %p is not 4-byte aligned",
                       (const void *)a->split_counters);
    if (a->cache_seqlens && (st = check_device_array(ctx, "cache_seqlens", a->cache_seqlens)))
        return st;
    if (a->block_table) {
        if ((st = check_device_array(ctx, "block_table", a->block_table))) return st;
        if (a->page_size < 1 || a->num_pages < 1)
            return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "page_size/num_pages: %d/%d; must be >= 1",
                           a->page_size, a->num_pages);
        if (a->block_table_stride < 1 ||
            (int64_t)a->block_table_stride * a->page_size < a->seqlen_k)
            return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                           "block_table_stride: %d pages of %d rows hold fewer keys than seqlen_k "
                           "(%d)", a->block_table_stride, a->page_size, a->seqlen_k);
        if ((st = check_page(ctx, "k", &a->k, a, s->head_dim)) ||
            (!latent && (st = check_page(ctx, "v", &a->v, a, spec_head_dim_v(s)))))
            return st;
    } else if (a->page_size || a->num_pages || a->block_table_stride) {
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                       "page_size/num_pages/block_table_stride: given without a block_table");
    }
    if (latent && (a->v.data || a->v_new.data))
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                       "%s.data: given, but a latent cache (spec.kv_cache FG_KV_LATENT) is K "
                       "alone: V is its first %d columns (pass NULL)",
                       a->v.data ? "v" : "v_new", spec_head_dim_v(s));
    if (a->k_new.data || (!latent && a->v_new.data)) {
        if (!latent && (!a->k_new.data || !a->v_new.data))
            return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "%s.data: NULL, but %s is given (both or "
                           "neither)", a->k_new.data ? "v_new" : "k_new",
                           a->k_new.data ? "k_new" : "v_new");
        if (!a->cache_seqlens)
            return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                           "cache_seqlens: NULL, but k_new is given (new rows go after each "
                           "sequence's cached keys)");
        if (a->seqlen_new < 1 || a->seqlen_new > a->seqlen_k)
            return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "seqlen_new: %d; must be in 1..seqlen_k (%d)",
                           a->seqlen_new, a->seqlen_k);
        if ((st = check_tensor(ctx, "k_new", &a->k_new, s->head_dim)) ||
            (!latent && (st = check_tensor(ctx, "v_new", &a->v_new, spec_head_dim_v(s)))))
            return st;
    } else if (a->seqlen_new) {
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "seqlen_new: %d, but k_new is NULL", a->seqlen_new);
    }
    return ctx->live && ctx->debug_checks ? check_cache_values(ctx, a) : FG_OK;
}

/* A block of a longer call: dense only, positions that keep the diagonal in
 * an int and, with dropout, on the draws' tiles. */
static fg_status check_positions(fg_context *ctx, const fg_spec *s, const fg_forward_args *a) {
    if (!a->position_q && !a->position_k) return FG_OK;
    const char *kind = s->varlen ? "spec.varlen" : s->kv_cache ? "spec.kv_cache"
                       : s->sparsity != FG_SPARSE_NONE ? "a sparse spec" : NULL;
    if (kind)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                       "position_q/position_k: %lld/%lld; positions are for dense calls, not %s",
                       (long long)a->position_q, (long long)a->position_k, kind);
    if (a->position_q < 0 || a->position_k < 0 || a->position_q > INT32_MAX ||
        a->position_k > INT32_MAX)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                       "position_q/position_k: %lld/%lld; must be in 0..2^31-1",
                       (long long)a->position_q, (long long)a->position_k);
    /* a row's or key's position in the longer call (the expressions' q and
     * k), a tile past the ends included, is an int */
    if (a->position_q + a->seqlen_q > MAX_REACH || a->position_k + a->seqlen_k > MAX_REACH)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                       "position_q/position_k: %lld/%lld with seqlen_q/seqlen_k %d/%d; the rows' "
                       "and keys' positions must stay below 2^31 - 4096",
                       (long long)a->position_q, (long long)a->position_k, a->seqlen_q, a->seqlen_k);
    if (forward_call_reach(a) > MAX_REACH)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                       "position_q/position_k: %lld/%lld put keys up to %lld from a query's "
                       "diagonal; at most 2^31 - 4096", (long long)a->position_q,
                       (long long)a->position_k, (long long)forward_call_reach(a));
    if (s->dropout && (a->position_q % 16 || a->position_k % 32))
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                       "position_q/position_k: %lld/%lld; with dropout they must be multiples "
                       "of 16 and 32 (the tiles dropout draws for)",
                       (long long)a->position_q, (long long)a->position_k);
    return FG_OK;
}

/* The variants' values: given exactly when the spec has the variant. */
static fg_status check_variant_args(fg_context *ctx, const fg_spec *s, const fg_forward_args *a) {
    fg_status st;
    if (s->softcap && !(isfinite(a->softcap) && a->softcap > 0.f))
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                       "softcap: %g; spec.softcap needs a finite cap > 0", (double)a->softcap);
    if (!s->softcap && a->softcap != 0.f)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "softcap: %g given, but spec.softcap is 0",
                       (double)a->softcap);
    if (s->alibi) {
        if (!a->alibi_slopes)
            return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "alibi_slopes: NULL, but spec.alibi is 1");
        if (a->alibi_stride_batch < 0)
            return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                           "alibi_stride_batch: %lld; must be >= 0 (0: one slope per head)",
                           (long long)a->alibi_stride_batch);
        if ((st = check_device_array(ctx, "alibi_slopes", a->alibi_slopes))) return st;
    } else if (a->alibi_slopes || a->alibi_stride_batch) {
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                       "alibi_slopes/alibi_stride_batch: given, but spec.alibi is 0");
    }
    if (s->sinks) {
        if (!a->sinks)
            return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "sinks: NULL, but spec.sinks is 1");
        if ((st = check_device_array(ctx, "sinks", a->sinks))) return st;
    } else if (a->sinks) {
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "sinks: given, but spec.sinks is 0");
    }
    return FG_OK;
}

/* The expressions' tensors: each declared one on the device, its sizes and
 * strides usable; the rest absent. */
static fg_status check_aux_args(fg_context *ctx, const fg_spec *s, const fg_forward_args *a) {
    for (int t = 0; t < FG_MAX_AUX; t++) {
        const fg_aux_tensor *x = &a->aux[t];
        if (t >= s->aux_count) {
            if (x->data)
                return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                               "aux[%d]: given, but the spec declares %d aux tensor%s", t,
                               s->aux_count, s->aux_count == 1 ? "" : "s");
            continue;
        }
        const char *name = s->aux[t].name;
        if (!x->data)
            return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "aux[%d] (%s): NULL data", t, name);
        /* the kernels index in 32 bits: the last element's offset, and the
         * gradient's elements, below 2^31 */
        double span = 0.0, elements = 1.0;
        for (int d = 0; d < s->aux[t].rank; d++) {
            if (x->size[d] < 0 || x->size[d] > INT32_MAX || x->stride[d] < 0)
                return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                               "aux[%d] (%s): size %lld, stride %lld along dimension %d; sizes "
                               "are 0..2^31-1 and strides >= 0",
                               t, name, (long long)x->size[d], (long long)x->stride[d], d);
            if (x->size[d] > 0) span += (double)(x->size[d] - 1) * (double)x->stride[d];
            elements *= (double)x->size[d];
        }
        if (span > INT32_MAX || elements > INT32_MAX)
            return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                           "aux[%d] (%s): its elements span %.0f and number %.0f; the kernels "
                           "index tensors of fewer than 2^31",
                           t, name, span + 1, elements);
        char what[48];
        snprintf(what, sizeof what, "aux[%d] (%s)", t, name);
        fg_status st = check_device_array(ctx, what, x->data);
        if (st) return st;
    }
    return FG_OK;
}

/* Elements of aux tensor t: the product of its sizes. */
static size_t aux_elements(const fg_spec *s, const fg_aux_tensor *x, int t) {
    size_t n = 1;
    for (int d = 0; d < s->aux[t].rank; d++) n *= (size_t)x->size[d];
    return n;
}

fg_status clear_aux_gradients(fg_context *ctx, const fg_spec *s, const fg_backward_args *a) {
    for (int t = 0; t < s->aux_count; t++) {
        size_t n = aux_elements(s, &a->forward.aux[t], t);
        if (!a->d_aux[t] || n == 0) continue;
        fg_status st = fg_cuda_check(ctx,
                                     ctx->cu->cuMemsetD32Async((CUdeviceptr)(uintptr_t)a->d_aux[t], 0,
                                                               n, (CUstream)a->forward.stream),
                                     "cuMemsetD32Async(d_aux)");
        if (st) return st;
    }
    return FG_OK;
}

fg_status check_block_mask_args(fg_context *ctx, const fg_spec *s, const fg_forward_args *a) {
    if (a->batch < 1) return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "batch: %d; must be >= 1", a->batch);
    if (a->heads_q < 1)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "heads_q: %d; must be >= 1", a->heads_q);
    if (a->seqlen_q < 1 || a->seqlen_q > MAX_SEQLEN || a->seqlen_k < 1 || a->seqlen_k > MAX_SEQLEN)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                       "seqlen_q/seqlen_k: %d/%d; must be in 1..2^30", a->seqlen_q, a->seqlen_k);
    fg_status st = check_positions(ctx, s, a);
    return st ? st : check_aux_args(ctx, s, a);
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
    /* packed sequences may all be empty: their longest may be 0 */
    int least = s->varlen ? 0 : 1;
    if (a->seqlen_q < least || a->seqlen_q > MAX_SEQLEN)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "seqlen_q: %d; must be in %d..2^30", a->seqlen_q,
                       least);
    if (a->seqlen_k < least || a->seqlen_k > MAX_SEQLEN)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "seqlen_k: %d; must be in %d..2^30", a->seqlen_k,
                       least);
    fg_status st;
    if ((st = check_packed_args(ctx, s, a)) || (st = check_positions(ctx, s, a)) ||
        (st = check_variant_args(ctx, s, a)) || (st = check_aux_args(ctx, s, a)))
        return st;
    /* q and k rows are head_dim wide, v and o rows the value head dim */
    if ((st = check_tensor(ctx, "q", &a->q, s->head_dim)) ||
        (st = check_tensor(ctx, "k", &a->k, s->head_dim)) ||
        (s->kv_cache != FG_KV_LATENT && (st = check_tensor(ctx, "v", &a->v, spec_head_dim_v(s)))) ||
        (st = check_tensor(ctx, "o", &a->o, spec_head_dim_v(s))) || (st = check_cache_args(ctx, s, a)))
        return st;
    if (a->lse && (uintptr_t)a->lse % 4 != 0)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "lse: %p is not 4-byte aligned", (void *)a->lse);
    if (a->softmax_scale != 0.f && !(isfinite(a->softmax_scale) && a->softmax_scale > 0.f))
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                       "softmax_scale: %g; must be a finite positive number (0 for 1/sqrt(d))",
                       (double)a->softmax_scale);
    if (s->softcap) {
        /* the kernels take scale/cap and cap·log2(e) as floats
         * (forward_call_values): an infinite or flushed factor would turn
         * scores into NaN or 0 */
        const float scale = a->softmax_scale != 0.f ? a->softmax_scale : 1.f / sqrtf((float)s->head_dim);
        if (!isnormal(scale / a->softcap) || !isfinite(a->softcap * 1.4426950408889634f))
            return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                           "softcap: %g; with softmax_scale %g, scale/cap (%g) must be a normal float "
                           "and cap·log2(e) finite",
                           (double)a->softcap, (double)scale, (double)(scale / a->softcap));
    }
    if (a->align != FG_ALIGN_BOTTOM_RIGHT && a->align != FG_ALIGN_TOP_LEFT)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "align: %d is not a causal alignment", (int)a->align);
    if (s->mask == FG_MASK_WINDOW) {
        if (a->window_left < -1 || a->window_right < -1)
            return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                           "window_left/window_right: %d/%d; sizes are >= 0, or -1 for unbounded",
                           a->window_left, a->window_right);
        if (forward_call_reach(a) > MAX_WINDOW_REACH)
            return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                           "seqlen_q/seqlen_k: %d/%d (and the positions) put keys up to %lld from a "
                           "query's diagonal; under a window mask at most 2^30 - 1024",
                           a->seqlen_q, a->seqlen_k, (long long)forward_call_reach(a));
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
        if ((shape->batch != 1 && shape->batch != a->batch) ||
            (shape->heads != 1 && shape->heads != a->heads_q) || shape->blocks_q != bq ||
            shape->blocks_k != bk)
            return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                           "layout: shape (%d, %d, %d, %d) does not match (1 or batch=%d, 1 or "
                           "heads_q=%d, ceil(%d/%d)=%d, ceil(%d/%d)=%d)",
                           shape->batch, shape->heads, shape->blocks_q, shape->blocks_k, a->batch,
                           a->heads_q, a->seqlen_q, s->sparse_block_q, bq, a->seqlen_k,
                           s->sparse_block_k, bk);
        /* a block mask's full blocks skip the predicate: it must be the one
         * they were found for (canonical texts are interned) */
        if ((l->per_batch && shape->batch != a->batch) || (l->per_head && shape->heads != a->heads_q))
            return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                           "layout: a block mask built for batch %d and %d heads, whose predicate "
                           "reads %s; this call has batch %d and %d heads",
                           shape->batch, shape->heads,
                           l->per_batch && l->per_head ? "b and h" : l->per_batch ? "b" : "h",
                           a->batch, a->heads_q);
        if (l->mask_mod && l->mask_mod != s->mask_mod)
            return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                           "layout: a block mask built for the mask predicate \"%s\", but "
                           "spec.mask_mod is \"%s\"",
                           l->mask_mod, s->mask_mod ? s->mask_mod : "");
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
    if ((st = check_tensor(ctx, "d_o", &a->d_o, spec_head_dim_v(s))) ||
        (st = check_tensor(ctx, "d_q", &a->d_q, s->head_dim)) ||
        (st = check_tensor(ctx, "d_k", &a->d_k, s->head_dim)) ||
        (st = check_tensor(ctx, "d_v", &a->d_v, spec_head_dim_v(s))))
        return st;
    if (a->deterministic != 0 && a->deterministic != 1)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "deterministic: %d; must be 0 or 1",
                       a->deterministic);
    if (a->workspace && (uintptr_t)a->workspace % FAMILY_WORKSPACE_ALIGN != 0)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "workspace: %p is not %d-byte aligned",
                       a->workspace, FAMILY_WORKSPACE_ALIGN);
    if (a->d_sinks && !s->sinks)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "d_sinks: given, but spec.sinks is 0");
    if (a->d_sinks && (st = check_device_array(ctx, "d_sinks", a->d_sinks))) return st;
    for (int t = 0; t < FG_MAX_AUX; t++) {
        if (!a->d_aux[t]) continue;
        if (!s->score_mod || t >= s->aux_count || s->aux[t].type != FG_AUX_F32)
            return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                           "d_aux[%d]: given, but %s", t,
                           !s->score_mod          ? "the spec has no score_mod"
                           : t >= s->aux_count    ? "the spec declares fewer aux tensors"
                                                  : "that tensor holds int32 (no gradient)");
        char what[48];
        snprintf(what, sizeof what, "d_aux[%d] (%s)", t, s->aux[t].name);
        if ((st = check_device_array(ctx, what, a->d_aux[t]))) return st;
    }
    return FG_OK;
}
