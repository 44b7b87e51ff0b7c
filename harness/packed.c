/* A packed batch and its sequences: see packed.h. */
#include "harness/packed.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness/message.h"

static int max_of(const int *x, int n) {
    int m = 0;
    for (int i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

static int blocks(int len, int block) { return block > 0 ? (len + block - 1) / block : 0; }

int fgh_packed_init(fgh_packed *k, const fg_spec *spec, const fgh_shape *shape,
                    const fgh_lengths *lengths, const fgh_placement *place, int grads) {
    memset(k, 0, sizeof *k);
    const int n = lengths->batch;
    k->batch = n;
    k->cu_q = malloc((size_t)(n + 1) * sizeof *k->cu_q);
    k->cu_k = malloc((size_t)(n + 1) * sizeof *k->cu_k);
    k->used = malloc((size_t)(n ? n : 1) * sizeof *k->used);
    if (!k->cu_q || !k->cu_k || !k->used) return fgh_fail("out of host memory (%d sequences)", n);
    k->cu_q[0] = k->cu_k[0] = 0;
    for (int b = 0; b < n; b++) {
        k->cu_q[b + 1] = k->cu_q[b] + lengths->len_q[b];
        k->cu_k[b + 1] = k->cu_k[b] + lengths->len_k[b];
        k->used[b] = lengths->used_k ? lengths->used_k[b] : lengths->len_k[b];
    }
    k->has_used = lengths->used_k != NULL;
    k->total_q = k->cu_q[n] + lengths->tail_q;
    k->total_k = k->cu_k[n] + lengths->tail_k;
    k->max_q = max_of(lengths->len_q, n);
    k->max_k = max_of(lengths->len_k, n);
    fg_spec s = *spec;
    s.varlen = 1;
    fgh_shape sh = *shape;
    sh.batch = 1, sh.seqlen_q = k->total_q, sh.seqlen_k = k->total_k, sh.batch0 = 0;
    if (!fgh_problem_init(&k->p, &s, &sh, place, grads)) return 0;
    /* ALiBi's slopes per batch are per sequence: (batch, Hq) */
    if (s.alibi && sh.alibi_per_batch && !fgh_problem_alibi_rows(&k->p, n)) return 0;
    if (s.sparsity != FG_SPARSE_NONE) { /* blocks of the longest sequences */
        k->p.blocks_q = blocks(k->max_q, s.sparse_block_q);
        k->p.blocks_k = blocks(k->max_k, s.sparse_block_k);
    }
    return 1;
}

/* Rows [r0, r1) of every head of a (1, H, total, D) array set to NaN. */
static void poison_rows(float *x, int heads, int total, int r0, int r1, int d) {
    for (int h = 0; h < heads; h++)
        for (size_t i = ((size_t)h * total + r0) * d; i < ((size_t)h * total + r1) * d; i++)
            x[i] = NAN;
}

int fgh_packed_upload(const fgh_device *d, fgh_packed *k) {
    const fgh_problem *p = &k->p;
    const int hq = p->shape.heads_q, hkv = p->shape.heads_kv, dim = p->spec.head_dim, n = k->batch;
    const int dim_v = p->head_dim_v;
    for (int b = 0; b <= n; b++) { /* keys no query sees */
        int r0 = b < n ? k->cu_k[b] + k->used[b] : k->cu_k[n];
        int r1 = b < n ? k->cu_k[b + 1] : k->total_k;
        poison_rows(p->host.k, hkv, k->total_k, r0, r1, dim);
        poison_rows(p->host.v, hkv, k->total_k, r0, r1, dim_v);
    }
    poison_rows(p->host.q, hq, k->total_q, k->cu_q[n], k->total_q, dim);
    if (p->grads) poison_rows(p->host.d_o, hq, k->total_q, k->cu_q[n], k->total_q, dim_v);
    size_t lead = (size_t)p->place.lead, guard = (size_t)p->place.guard;
    return fgh_problem_upload(d, &k->p) &&
           fgh_buffer_ints(d, &k->d_cu_q, k->cu_q, k->batch + 1, lead, guard) &&
           fgh_buffer_ints(d, &k->d_cu_k, k->cu_k, k->batch + 1, lead, guard) &&
           (!k->has_used || fgh_buffer_ints(d, &k->d_used, k->used, k->batch, lead, guard));
}

void fgh_packed_free(const fgh_device *d, fgh_packed *k) {
    fgh_problem_free(d, &k->p);
    fgh_buffer_free(d, &k->d_cu_q);
    fgh_buffer_free(d, &k->d_cu_k);
    fgh_buffer_free(d, &k->d_used);
    free(k->cu_q), free(k->cu_k), free(k->used);
    memset(k, 0, sizeof *k);
}

fg_forward_args fgh_packed_forward_args(const fgh_packed *k) {
    fg_forward_args a = fgh_forward_args(&k->p, 1);
    a.batch = k->batch;
    a.seqlen_q = k->max_q, a.seqlen_k = k->max_k;
    a.cu_seqlens_q = (const int32_t *)(uintptr_t)k->d_cu_q.data;
    a.cu_seqlens_k = (const int32_t *)(uintptr_t)k->d_cu_k.data;
    a.seqused_k = k->has_used ? (const int32_t *)(uintptr_t)k->d_used.data : NULL;
    a.total_q = k->total_q, a.total_k = k->total_k;
    return a;
}

fg_backward_args fgh_packed_backward_args(const fgh_packed *k, int deterministic) {
    fg_backward_args b = fgh_backward_args(&k->p, deterministic);
    b.forward = fgh_packed_forward_args(k);
    return b;
}

/* Rows [r0, r0 + n) of every head of a packed (1, H, total, D) array into
 * dst (1, H, n, D). */
static void rows_of(double *dst, const double *src, int heads, int total, int r0, int n, int d) {
    for (int h = 0; h < heads; h++)
        memcpy(dst + (size_t)h * n * d, src + ((size_t)h * total + r0) * d, (size_t)n * d * sizeof *dst);
}
static void rows_of_f(float *dst, const float *src, int heads, int total, int r0, int n, int d) {
    for (int h = 0; h < heads; h++)
        memcpy(dst + (size_t)h * n * d, src + ((size_t)h * total + r0) * d, (size_t)n * d * sizeof *dst);
}

static int rows_q(const fgh_packed *k, int b) { return k->cu_q[b + 1] - k->cu_q[b]; }

/* Sequence b as a problem of its own on the host: its rows of the packed
 * inputs, its queries and the keys it sees, dropout's batch index b, the
 * call's layout, ALiBi's slopes (row b through batch0 = b) and sinks
 * (borrowed: sequence_free drops them). */
static int sequence_problem(const fgh_packed *k, int b, fgh_problem *sp) {
    const fgh_problem *p = &k->p;
    fg_spec s = p->spec;
    s.varlen = 0;
    fgh_shape sh = p->shape;
    sh.seqlen_q = rows_q(k, b), sh.seqlen_k = k->used[b], sh.batch0 = b;
    fgh_placement pl = {0};
    int ok = fgh_problem_init(sp, &s, &sh, &pl, p->grads);
    free(sp->host.alibi_slopes), free(sp->host.sinks); /* the call's, borrowed */
    sp->host.alibi_slopes = p->host.alibi_slopes, sp->alibi_rows = p->alibi_rows;
    sp->host.sinks = p->host.sinks;
    if (!ok) return 0;
    for (int t = 0; t < s.aux_count; t++) /* the call's tensors: the same sizes */
        memcpy(sp->host.aux[t], p->host.aux[t], p->aux_elems[t] * 4);
    const int hq = sh.heads_q, hkv = sh.heads_kv, d = s.head_dim, nq = sh.seqlen_q, nk = sh.seqlen_k;
    const int dv = p->head_dim_v;
    rows_of_f(sp->host.q, p->host.q, hq, k->total_q, k->cu_q[b], nq, d);
    if (p->grads) rows_of_f(sp->host.d_o, p->host.d_o, hq, k->total_q, k->cu_q[b], nq, dv);
    rows_of_f(sp->host.k, p->host.k, hkv, k->total_k, k->cu_k[b], nk, d);
    rows_of_f(sp->host.v, p->host.v, hkv, k->total_k, k->cu_k[b], nk, dv);
    sp->layout_mask = p->layout_mask;
    sp->layout_heads = p->layout_heads;
    sp->blocks_q = p->blocks_q, sp->blocks_k = p->blocks_k;
    return 1;
}

static void sequence_free(fgh_problem *sp) {
    sp->layout_mask = NULL;
    sp->host.alibi_slopes = sp->host.sinks = NULL;
    fgh_problem_free(NULL, sp); /* host memory only */
}

int fgh_packed_check_forward(const fgh_packed *k, int b, const double *o, const float *lse,
                             fgh_forward_check *r) {
    const int hq = k->p.shape.heads_q, d = k->p.head_dim_v, n = rows_q(k, b); /* O's rows */
    double *ob = malloc(((size_t)hq * n * d + 1) * sizeof *ob);
    float *lb = malloc(((size_t)hq * n + 1) * sizeof *lb);
    fgh_problem sp;
    int ok = ob && lb ? sequence_problem(k, b, &sp) : fgh_fail("out of host memory");
    if (ok) {
        rows_of(ob, o, hq, k->total_q, k->cu_q[b], n, d);
        rows_of_f(lb, lse, hq, k->total_q, k->cu_q[b], n, 1);
        ok = fgh_check_forward(&sp, ob, lb, r);
    }
    if (ob && lb) sequence_free(&sp);
    free(ob), free(lb);
    return ok;
}

int fgh_packed_expect_backward(const fgh_packed *k, fgh_packed_expect *x) {
    memset(x, 0, sizeof *x);
    x->batch = k->batch;
    x->have = calloc((size_t)(k->batch ? k->batch : 1), sizeof *x->have);
    x->e = calloc((size_t)(k->batch ? k->batch : 1), sizeof *x->e);
    if (!x->have || !x->e) return fgh_fail("out of host memory");
    for (int b = 0; b < k->batch; b++) {
        if (rows_q(k, b) == 0 || k->used[b] == 0) continue; /* no gradient but zeros */
        fgh_problem sp;
        int ok = sequence_problem(k, b, &sp) && fgh_expect_backward(&sp, &x->e[b]);
        sequence_free(&sp);
        x->have[b] = 1; /* freed either way */
        if (!ok) return fgh_fail("sequence %d: %s", b, fgh_message());
    }
    return 1;
}

int fgh_packed_expect_sinks(const fgh_packed *k, const double *o, const float *lse,
                            fgh_sinks_expect *e) {
    const int hq = k->p.shape.heads_q, d = k->p.head_dim_v, own = o && lse; /* O's rows */
    if (!fgh_sinks_expect_init(e, hq)) return 0;
    for (int b = 0; b < k->batch; b++) {
        const int n = rows_q(k, b);
        if (n == 0) continue; /* no rows: no terms */
        double *ob = own ? malloc(((size_t)hq * n * d + 1) * sizeof *ob) : NULL;
        float *lb = own ? malloc(((size_t)hq * n + 1) * sizeof *lb) : NULL;
        if (own && (!ob || !lb)) {
            free(ob), free(lb);
            return fgh_fail("out of host memory");
        }
        if (own) { /* sequence b's rows of the call's outputs */
            rows_of(ob, o, hq, k->total_q, k->cu_q[b], n, d);
            rows_of_f(lb, lse, hq, k->total_q, k->cu_q[b], n, 1);
        }
        fgh_problem sp;
        int ok = sequence_problem(k, b, &sp) && fgh_expect_sinks_add(&sp, ob, lb, e);
        sequence_free(&sp);
        free(ob), free(lb);
        if (!ok) return fgh_fail("sequence %d: %s", b, fgh_message());
    }
    return 1;
}

void fgh_packed_expect_free(fgh_packed_expect *x) {
    for (int b = 0; x->have && b < x->batch; b++)
        if (x->have[b]) fgh_expect_free(&x->e[b]);
    free(x->have), free(x->e);
    memset(x, 0, sizeof *x);
}

/* Elements of rows [r0, r1) of every head of a (1, H, total, D) array that
 * are not 0. */
static size_t nonzero_rows(const double *x, int heads, int total, int r0, int r1, int d) {
    size_t n = 0;
    for (int h = 0; h < heads; h++)
        for (size_t i = ((size_t)h * total + r0) * d; i < ((size_t)h * total + r1) * d; i++)
            n += x[i] != 0.0;
    return n;
}

size_t fgh_packed_unseen_nonzero(const fgh_packed *k, double *const g[FGH_GRADS]) {
    const int hq = k->p.shape.heads_q, hkv = k->p.shape.heads_kv, d = k->p.spec.head_dim;
    const int n = k->batch;
    size_t bad = nonzero_rows(g[FGH_DQ], hq, k->total_q, k->cu_q[n], k->total_q, d);
    for (int t = FGH_DK; t <= FGH_DV; t++) {
        const int w = t == FGH_DV ? k->p.head_dim_v : d; /* dV's rows are Dv wide */
        bad += nonzero_rows(g[t], hkv, k->total_k, k->cu_k[n], k->total_k, w);
        for (int b = 0; b < n; b++) {
            int from = rows_q(k, b) == 0 ? 0 : k->used[b];
            bad += nonzero_rows(g[t], hkv, k->total_k, k->cu_k[b] + from, k->cu_k[b + 1], w);
        }
    }
    for (int b = 0; b < n; b++)
        if (k->used[b] == 0)
            bad += nonzero_rows(g[FGH_DQ], hq, k->total_q, k->cu_q[b], k->cu_q[b + 1], d);
    return bad;
}

int fgh_packed_check_backward(const fgh_packed *k, const fgh_packed_expect *x, int b,
                              double *const g[FGH_GRADS], double err[FGH_GRADS], int *pass) {
    err[0] = err[1] = err[2] = 0.0;
    *pass = 1;
    if (!x->have[b]) return 1;
    const int hq = k->p.shape.heads_q, hkv = k->p.shape.heads_kv, d = k->p.spec.head_dim;
    const int dv = k->p.head_dim_v, nq = rows_q(k, b), nk = k->used[b];
    double *s[FGH_GRADS] = {malloc((size_t)hq * nq * d * sizeof(double)),
                            malloc((size_t)hkv * nk * d * sizeof(double)),
                            malloc((size_t)hkv * nk * dv * sizeof(double))};
    int ok = s[0] && s[1] && s[2];
    if (ok) {
        rows_of(s[FGH_DQ], g[FGH_DQ], hq, k->total_q, k->cu_q[b], nq, d);
        rows_of(s[FGH_DK], g[FGH_DK], hkv, k->total_k, k->cu_k[b], nk, d);
        rows_of(s[FGH_DV], g[FGH_DV], hkv, k->total_k, k->cu_k[b], nk, dv);
        *pass = fgh_check_backward(&x->e[b], s, err);
    }
    free(s[0]), free(s[1]), free(s[2]);
    return ok || fgh_fail("out of host memory");
}
