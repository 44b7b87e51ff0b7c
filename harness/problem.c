/* One attention problem: see problem.h. */
#include "harness/problem.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gen/spec.h"
#include "harness/message.h"

/* a·b·c·d, or 0 when any is negative: the library refuses such a shape
 * with its own message, which is worth more than a failed allocation. */
static size_t elems(int a, int b, int c, int d) {
    if (a < 0 || b < 0 || c < 0 || d < 0) return 0;
    return (size_t)a * (size_t)b * (size_t)c * (size_t)d;
}

static int blocks(int len, int block) { return block > 0 ? (len + block - 1) / block : 0; }

float fgh_default_slope(int b, int h, int heads_q) {
    return (float)(exp2(-8.0 * (h + 1) / (heads_q > 0 ? heads_q : 1)) * (1.0 + b / 4.0));
}

float fgh_default_sink(int h) { return 0.5f + (float)(h % 4); }

static int heads_of(const fgh_problem *p) { return p->shape.heads_q > 0 ? p->shape.heads_q : 0; }

int fgh_problem_alibi_rows(fgh_problem *p, int rows) {
    const int hq = heads_of(p);
    rows = rows > 0 ? rows : 0;
    size_t n = (size_t)rows * (size_t)hq;
    free(p->host.alibi_slopes);
    p->alibi_rows = rows;
    p->host.alibi_slopes = malloc((n ? n : 1) * sizeof(float));
    if (!p->host.alibi_slopes) return fgh_fail("out of host memory (%zu ALiBi slopes)", n);
    for (int b = 0; b < rows; b++)
        for (int h = 0; h < hq; h++)
            p->host.alibi_slopes[(size_t)b * hq + h] =
                fgh_default_slope(p->shape.alibi_per_batch ? b : 0, h, hq);
    return 1;
}

/* The expressions' trees (for the reference) and zeroed host aux tensors. */
static int init_exprs(fgh_problem *p) {
    const fg_spec *spec = &p->spec;
    if (!spec_has_expr(spec->score_mod) && !spec_has_expr(spec->mask_mod)) return 1;
    char err[512];
    p->exprs = malloc(2 * sizeof *p->exprs);
    if (!p->exprs) return fgh_fail("out of host memory (expression trees)");
    if (spec_expr_trees(spec, &p->exprs[0], &p->exprs[1], err, sizeof err) != 0 ||
        spec_expr_aux(spec, p->expr_decl, err, sizeof err) != 0)
        return fgh_fail("%s", err);
    for (int t = 0; t < spec->aux_count && t < FG_MAX_AUX; t++) {
        size_t n = 1;
        for (int d = 0; d < spec->aux[t].rank; d++) {
            if (p->shape.aux_size[t][d] < 0) return fgh_fail("aux[%d]: a negative size", t);
            n *= (size_t)p->shape.aux_size[t][d];
        }
        p->aux_elems[t] = n;
        p->host.aux[t] = calloc(n ? n : 1, 4); /* float or int32 */
        if (!p->host.aux[t]) return fgh_fail("out of host memory (aux[%d]: %zu elements)", t, n);
        ref_aux *r = &p->aux_ref[t];
        r->data = p->host.aux[t];
        int64_t stride = 1;
        for (int d = spec->aux[t].rank - 1; d >= 0; d--) {
            r->size[d] = p->shape.aux_size[t][d];
            r->stride[d] = stride;
            stride *= p->shape.aux_size[t][d];
        }
    }
    return 1;
}

int fgh_problem_init(fgh_problem *p, const fg_spec *spec, const fgh_shape *shape,
                     const fgh_placement *place, int grads) {
    memset(p, 0, sizeof *p);
    p->spec = *spec, p->shape = *shape, p->place = *place, p->grads = grads;
    const fgh_shape *s = shape;
    p->head_dim_v = spec->head_dim_v > 0 ? spec->head_dim_v : spec->head_dim;
    p->nq = elems(s->batch, s->heads_q, s->seqlen_q, spec->head_dim);
    p->nk = elems(s->batch, s->heads_kv, s->seqlen_k, spec->head_dim);
    p->no = elems(s->batch, s->heads_q, s->seqlen_q, p->head_dim_v);
    p->nv = elems(s->batch, s->heads_kv, s->seqlen_k, p->head_dim_v);
    p->rows = elems(s->batch, s->heads_q, s->seqlen_q, 1);
    if (spec->sparsity != FG_SPARSE_NONE) {
        p->blocks_q = blocks(s->seqlen_q, spec->sparse_block_q);
        p->blocks_k = blocks(s->seqlen_k, spec->sparse_block_k);
    }
    size_t nq = p->nq ? p->nq : 1, nk = p->nk ? p->nk : 1;
    size_t no = p->no ? p->no : 1, nv = p->nv ? p->nv : 1;
    p->host.q = malloc(nq * sizeof(float));
    p->host.k = malloc(nk * sizeof(float));
    p->host.v = malloc(nv * sizeof(float));
    if (grads) p->host.d_o = malloc(no * sizeof(float));
    if (!p->host.q || !p->host.k || !p->host.v || (grads && !p->host.d_o))
        return fgh_fail("out of host memory (inputs of %zu, %zu and %zu elements)", p->nq, p->nk,
                        p->nv);
    if (spec->alibi && !fgh_problem_alibi_rows(p, s->alibi_per_batch ? s->batch : 1)) return 0;
    if (spec->sinks) {
        const int hq = heads_of(p);
        p->host.sinks = malloc((size_t)(hq ? hq : 1) * sizeof(float));
        if (!p->host.sinks) return fgh_fail("out of host memory (%d sinks)", hq);
        for (int h = 0; h < hq; h++) p->host.sinks[h] = fgh_default_sink(h);
    }
    return init_exprs(p);
}

int fgh_problem_set_layout(fgh_problem *p, fg_context *ctx, uint8_t *mask, int heads) {
    p->layout_mask = mask;
    p->layout_heads = heads;
    if (fg_layout_create(ctx, mask, heads, p->blocks_q, p->blocks_k, &p->layout) != FG_OK) {
        p->layout = NULL;
        return fgh_fail("%s", fg_context_message(ctx));
    }
    return 1;
}

int fgh_problem_use_block_mask(fgh_problem *p, fg_context *ctx) {
    size_t n = (size_t)p->blocks_q * (size_t)p->blocks_k;
    p->layout_mask = malloc(n ? n : 1);
    if (!p->layout_mask) return fgh_fail("out of host memory (a %zu-block layout)", n);
    memset(p->layout_mask, 1, n);
    p->layout_heads = 1;
    p->block_mask_ctx = ctx;
    return 1;
}

/* n fp32 values between `lead` and `guard` poisoned elements, uploaded. */
static int floats_buffer(const fgh_device *d, fgh_buffer *b, const float *x, size_t n, size_t lead,
                         size_t guard) {
    if (!fgh_buffer_alloc(d, b, sizeof(float), lead, n, guard)) return 0;
    if (n) memcpy(fgh_buffer_at(b, lead), x, n * sizeof(float));
    return fgh_buffer_push(d, b);
}

int fgh_problem_upload(const fgh_device *d, fgh_problem *p) {
    const fgh_shape *s = &p->shape;
    const fgh_placement *pl = &p->place;
    int dim = p->spec.head_dim, dim_v = p->head_dim_v;
    fg_dtype dt = p->spec.dtype;
    int ok = fgh_tensor_alloc(d, &p->q, pl, s->batch, s->seqlen_q, s->heads_q, dim) &&
             fgh_tensor_alloc(d, &p->k, pl, s->batch, s->seqlen_k, s->heads_kv, dim) &&
             fgh_tensor_alloc(d, &p->v, pl, s->batch, s->seqlen_k, s->heads_kv, dim_v) &&
             fgh_tensor_alloc(d, &p->o, pl, s->batch, s->seqlen_q, s->heads_q, dim_v) &&
             fgh_buffer_alloc(d, &p->lse, sizeof(float), (size_t)pl->lead, p->rows,
                              (size_t)pl->guard) &&
             fgh_tensor_upload(d, &p->q, p->host.q, dt) &&
             fgh_tensor_upload(d, &p->k, p->host.k, dt) &&
             fgh_tensor_upload(d, &p->v, p->host.v, dt);
    if (ok && p->grads)
        ok = fgh_tensor_alloc(d, &p->d_o, pl, s->batch, s->seqlen_q, s->heads_q, dim_v) &&
             fgh_tensor_alloc(d, &p->d_q, pl, s->batch, s->seqlen_q, s->heads_q, dim) &&
             fgh_tensor_alloc(d, &p->d_k, pl, s->batch, s->seqlen_k, s->heads_kv, dim) &&
             fgh_tensor_alloc(d, &p->d_v, pl, s->batch, s->seqlen_k, s->heads_kv, dim_v) &&
             fgh_tensor_upload(d, &p->d_o, p->host.d_o, dt);
    const size_t hq = (size_t)heads_of(p), lead = (size_t)pl->lead, guard = (size_t)pl->guard;
    if (ok && p->spec.alibi)
        ok = floats_buffer(d, &p->alibi_slopes, p->host.alibi_slopes, (size_t)p->alibi_rows * hq,
                           lead, guard);
    if (ok && p->spec.sinks) ok = floats_buffer(d, &p->sinks, p->host.sinks, hq, lead, guard);
    if (ok && p->spec.sinks && p->grads)
        ok = fgh_buffer_alloc(d, &p->d_sinks, sizeof(float), lead, hq, guard);
    for (int t = 0; ok && t < p->spec.aux_count; t++) {
        /* float and int32 alike: four bytes each, copied as they are */
        ok = floats_buffer(d, &p->aux[t], p->host.aux[t], p->aux_elems[t], lead, guard);
        if (ok && p->grads && spec_has_expr(p->spec.score_mod) && p->spec.aux[t].type == FG_AUX_F32)
            ok = fgh_buffer_alloc(d, &p->d_aux[t], sizeof(float), lead, p->aux_elems[t], guard);
    }
    if (ok && p->block_mask_ctx && !p->layout) {
        fg_forward_args a = fgh_forward_args(p, 0);
        if (fg_block_mask_create(p->block_mask_ctx, &p->spec, &a, &p->layout) != FG_OK) {
            p->layout = NULL;
            return fgh_fail("fg_block_mask_create: %s", fg_context_message(p->block_mask_ctx));
        }
    }
    return ok;
}

static int poison_d_aux(const fgh_device *d, fgh_problem *p) {
    for (int t = 0; t < FG_MAX_AUX; t++)
        if (p->d_aux[t].base && !fgh_buffer_poison(d, &p->d_aux[t])) return 0;
    return 1;
}

int fgh_problem_poison_grads(const fgh_device *d, fgh_problem *p) {
    return fgh_buffer_poison(d, &p->d_q.mem) && fgh_buffer_poison(d, &p->d_k.mem) &&
           fgh_buffer_poison(d, &p->d_v.mem) &&
           (!p->d_sinks.base || fgh_buffer_poison(d, &p->d_sinks)) && poison_d_aux(d, p);
}

int fgh_problem_take_d_sinks(const fgh_device *d, fgh_problem *p, double *out) {
    fgh_buffer *b = &p->d_sinks;
    if (!b->base) return fgh_fail("d_sinks: the problem has none (spec.sinks with gradients)");
    if (!fgh_buffer_pull(d, b)) return 0;
    /* a write outside the (Hq) values is a fault of its own, not a value */
    size_t stray = fgh_buffer_zones_unpoisoned(b, 0);
    if (stray) return fgh_fail("d_sinks: %zu values around it lost the poison", stray);
    for (size_t h = 0; h < b->count; h++) {
        float x;
        memcpy(&x, fgh_buffer_at(b, b->lead + h), sizeof x);
        out[h] = (double)x;
    }
    return 1;
}

int fgh_problem_take_d_aux(const fgh_device *d, fgh_problem *p, int t, double *out) {
    fgh_buffer *b = t >= 0 && t < FG_MAX_AUX ? &p->d_aux[t] : NULL;
    if (!b || !b->base) return fgh_fail("d_aux[%d]: the problem has none (a float tensor of a "
                                        "score_mod, with gradients)", t);
    if (!fgh_buffer_pull(d, b)) return 0;
    size_t stray = fgh_buffer_zones_unpoisoned(b, 0);
    if (stray) return fgh_fail("d_aux[%d]: %zu values around it lost the poison", t, stray);
    for (size_t i = 0; i < b->count; i++) {
        float x;
        memcpy(&x, fgh_buffer_at(b, b->lead + i), sizeof x);
        out[i] = (double)x;
    }
    return 1;
}

int fgh_problem_take_grads(const fgh_device *d, fgh_problem *p, double *const x[3],
                           fgh_written w[3]) {
    fg_dtype dt = p->spec.dtype;
    return fgh_tensor_take(d, &p->d_q, x[0], dt, &w[0]) &&
           fgh_tensor_take(d, &p->d_k, x[1], dt, &w[1]) &&
           fgh_tensor_take(d, &p->d_v, x[2], dt, &w[2]);
}

void fgh_problem_free(const fgh_device *d, fgh_problem *p) {
    fgh_tensor *t[] = {&p->q, &p->k, &p->v, &p->o, &p->d_o, &p->d_q, &p->d_k, &p->d_v};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) fgh_tensor_free(d, t[i]);
    fgh_buffer_free(d, &p->lse);
    fgh_buffer_free(d, &p->alibi_slopes);
    fgh_buffer_free(d, &p->sinks);
    fgh_buffer_free(d, &p->d_sinks);
    for (int t = 0; t < FG_MAX_AUX; t++) {
        fgh_buffer_free(d, &p->aux[t]);
        fgh_buffer_free(d, &p->d_aux[t]);
        free(p->host.aux[t]);
    }
    free(p->exprs);
    fg_layout_destroy(p->layout);
    free(p->layout_mask);
    free(p->host.q), free(p->host.k), free(p->host.v), free(p->host.d_o);
    free(p->host.alibi_slopes), free(p->host.sinks);
    memset(p, 0, sizeof *p);
}

fg_forward_args fgh_forward_args(const fgh_problem *p, int with_lse) {
    const fgh_shape *s = &p->shape;
    fg_forward_args a = fg_forward_args_default();
    a.q = p->q.t, a.k = p->k.t, a.v = p->v.t, a.o = p->o.t;
    a.lse = with_lse ? (float *)(uintptr_t)p->lse.data : NULL;
    a.batch = s->batch, a.heads_q = s->heads_q, a.heads_kv = s->heads_kv;
    a.seqlen_q = s->seqlen_q, a.seqlen_k = s->seqlen_k;
    a.softmax_scale = s->scale;
    a.align = s->align;
    a.window_left = s->window_left, a.window_right = s->window_right;
    a.dropout_p = s->dropout_p;
    a.seed = s->seed, a.offset = s->offset;
    a.position_q = s->position_q, a.position_k = s->position_k;
    a.layout = p->layout;
    if (p->spec.softcap) a.softcap = s->softcap;
    if (p->spec.alibi) {
        a.alibi_slopes = (const float *)(uintptr_t)p->alibi_slopes.data;
        a.alibi_stride_batch = s->alibi_per_batch ? s->heads_q : 0;
    }
    if (p->spec.sinks) a.sinks = (const float *)(uintptr_t)p->sinks.data;
    for (int t = 0; t < p->spec.aux_count; t++) {
        /* contiguous: the last index's stride 1 */
        fg_aux_tensor *x = &a.aux[t];
        int64_t stride = 1;
        x->data = (const void *)(uintptr_t)p->aux[t].data;
        for (int d = p->spec.aux[t].rank - 1; d >= 0; d--) {
            x->size[d] = s->aux_size[t][d];
            x->stride[d] = stride;
            stride *= s->aux_size[t][d];
        }
    }
    return a;
}

fg_backward_args fgh_backward_args(const fgh_problem *p, int deterministic) {
    fg_backward_args b;
    memset(&b, 0, sizeof b);
    b.forward = fgh_forward_args(p, 1);
    b.d_o = p->d_o.t, b.d_q = p->d_q.t, b.d_k = p->d_k.t, b.d_v = p->d_v.t;
    b.deterministic = deterministic;
    if (p->spec.sinks) b.d_sinks = (float *)(uintptr_t)p->d_sinks.data;
    for (int t = 0; t < FG_MAX_AUX; t++) b.d_aux[t] = (float *)(uintptr_t)p->d_aux[t].data;
    return b;
}

ref_problem fgh_reference_problem(const fgh_problem *p) {
    const fgh_shape *s = &p->shape;
    const fg_spec *spec = &p->spec;
    ref_problem r;
    memset(&r, 0, sizeof r);
    r.batch = s->batch, r.heads_q = s->heads_q, r.heads_kv = s->heads_kv;
    r.seqlen_q = s->seqlen_q, r.seqlen_k = s->seqlen_k, r.head_dim = spec->head_dim;
    r.head_dim_v = p->head_dim_v;
    /* the exact float the library uses, so both sides scale identically */
    r.scale = s->scale != 0.f ? (double)s->scale : (double)(1.0f / sqrtf((float)spec->head_dim));
    r.mask = (int)spec->mask;
    r.diag_offset = (s->align == FG_ALIGN_TOP_LEFT ? 0 : (int64_t)s->seqlen_k - s->seqlen_q) +
                    s->position_q - s->position_k;
    r.window_left = spec->mask == FG_MASK_CAUSAL ? -1 : s->window_left;
    r.window_right = spec->mask == FG_MASK_CAUSAL ? 0 : s->window_right;
    r.dropout_p = (double)s->dropout_p;
    r.seed = s->seed, r.offset = s->offset;
    r.sparsity = (int)spec->sparsity;
    r.block_q = spec->sparse_block_q, r.block_k = spec->sparse_block_k;
    r.layout = p->layout_mask, r.layout_heads = p->layout_heads;
    r.layout_blocks_q = p->blocks_q, r.layout_blocks_k = p->blocks_k;
    r.butterfly_factors = spec->butterfly_factors;
    r.batch0 = s->batch0;
    r.position_q = s->position_q, r.position_k = s->position_k;
    r.softcap = spec->softcap ? (double)s->softcap : 0.0;
    if (spec->alibi) {
        r.alibi_slopes = p->host.alibi_slopes;
        r.alibi_stride_batch = s->alibi_per_batch ? s->heads_q : 0;
    }
    r.sinks = spec->sinks ? p->host.sinks : NULL;
    if (p->exprs) {
        r.score_mod = spec_has_expr(spec->score_mod) ? &p->exprs[0] : NULL;
        r.mask_mod = spec_has_expr(spec->mask_mod) ? &p->exprs[1] : NULL;
        r.aux_decl = p->expr_decl;
        r.aux = p->aux_ref;
        r.aux_count = spec->aux_count;
    }
    return r;
}

double fgh_problem_flops(const fgh_problem *p) {
    const fgh_shape *s = &p->shape;
    double f = 2.0 * s->batch * s->heads_q * (double)s->seqlen_q * s->seqlen_k *
               (p->spec.head_dim + p->head_dim_v);
    return p->spec.mask == FG_MASK_CAUSAL ? f / 2 : f;
}
