/* A decoding step over a KV cache and its sequences: see paged.h. */
#include "harness/paged.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness/message.h"

int fgh_paged_keys(const fgh_paged *k, int b) { return k->cached[b] + k->seqlen_new; }

/* Sequence b's row j of head h in the problem's host keys (host.k: dim the
 * head dim) or values (host.v: dim the value head dim). */
static size_t key_index(const fgh_paged *k, int b, int h, int j, int dim) {
    const fgh_shape *s = &k->p.shape;
    return (((size_t)b * s->heads_kv + h) * s->seqlen_k + j) * dim;
}

/* Element e of row `row` of head h of a page in a pool's mirror of rows dim
 * wide. */
static size_t pool_index(const fgh_paged *k, int page, int row, int h, int e, int dim) {
    return k->pool_k.lead + (((size_t)page * k->page_size + row) * k->p.shape.heads_kv + h) * dim + e;
}

int fgh_paged_init(fgh_paged *k, const fg_spec *spec, const fgh_shape *shape, const int *cached,
                   int seqlen_new, int page_size, const fgh_placement *place) {
    memset(k, 0, sizeof *k);
    k->seqlen_new = seqlen_new, k->page_size = page_size;
    k->cached = malloc((size_t)(shape->batch ? shape->batch : 1) * sizeof *k->cached);
    if (!k->cached) return fgh_fail("out of host memory");
    memcpy(k->cached, cached, (size_t)shape->batch * sizeof *k->cached);
    fg_spec s = *spec;
    s.kv_cache = spec->kv_cache ? spec->kv_cache : 1;
    return fgh_problem_init(&k->p, &s, shape, place, 0);
}

int fgh_page_table(fgh_rng *rng, int batch, const int *keys, int page_size, int pages_per_seq,
                   int spare, int *table) {
    int num_pages = spare;
    for (int b = 0; b < batch; b++) num_pages += (keys[b] + page_size - 1) / page_size;
    int *order = malloc((size_t)(num_pages ? num_pages : 1) * sizeof *order);
    if (!order) {
        fgh_fail("out of host memory (%d pages)", num_pages);
        return -1;
    }
    for (int i = 0; i < num_pages; i++) order[i] = i;
    for (int i = num_pages - 1; i > 0; i--) { /* shuffled */
        int j = (int)(fgh_rng_next(rng) % (uint64_t)(i + 1)), t = order[i];
        order[i] = order[j], order[j] = t;
    }
    int next = 0;
    for (int b = 0; b < batch; b++)
        for (int i = 0; i < pages_per_seq; i++)
            table[(size_t)b * pages_per_seq + i] =
                (int64_t)i * page_size < keys[b] ? order[next++] : num_pages + 1000 + i;
    free(order);
    return num_pages;
}

/* A contiguous cache: p's k and v with the rows past each sequence's cached
 * keys NaN. */
static int contiguous_cache(const fgh_device *d, fgh_paged *k) {
    const fgh_shape *s = &k->p.shape;
    fg_dtype dt = k->p.spec.dtype;
    const int dim = k->p.spec.head_dim, dim_v = k->p.head_dim_v;
    float *kc = malloc((k->p.nk ? k->p.nk : 1) * sizeof *kc);
    float *vc = malloc((k->p.nv ? k->p.nv : 1) * sizeof *vc);
    int ok = kc && vc ? 1 : fgh_fail("out of host memory");
    if (ok) {
        memcpy(kc, k->p.host.k, k->p.nk * sizeof *kc);
        memcpy(vc, k->p.host.v, k->p.nv * sizeof *vc);
        for (int b = 0; b < s->batch; b++)
            for (int h = 0; h < s->heads_kv; h++) {
                for (size_t i = key_index(k, b, h, k->cached[b], dim); i < key_index(k, b, h, s->seqlen_k, dim); i++)
                    kc[i] = NAN;
                for (size_t i = key_index(k, b, h, k->cached[b], dim_v);
                     i < key_index(k, b, h, s->seqlen_k, dim_v); i++)
                    vc[i] = NAN;
            }
        ok = fgh_tensor_upload(d, &k->p.k, kc, dt) && fgh_tensor_upload(d, &k->p.v, vc, dt);
    }
    free(kc), free(vc);
    return ok;
}

/* A paged cache: the cached keys in pages handed out shuffled, three pages
 * no sequence holds, everything else NaN (the pool's poison). */
static int paged_cache(const fgh_device *d, fgh_paged *k, fgh_rng *rng) {
    const fgh_shape *s = &k->p.shape;
    const int hkv = s->heads_kv, dim = k->p.spec.head_dim, dim_v = k->p.head_dim_v;
    fg_dtype dt = k->p.spec.dtype;
    k->pages_per_seq = (s->seqlen_k + k->page_size - 1) / k->page_size;
    int *keys = malloc((size_t)(s->batch ? s->batch : 1) * sizeof *keys);
    k->table = malloc(((size_t)s->batch * k->pages_per_seq + 1) * sizeof *k->table);
    if (!keys || !k->table) {
        free(keys);
        return fgh_fail("out of host memory");
    }
    for (int b = 0; b < s->batch; b++) keys[b] = fgh_paged_keys(k, b);
    k->num_pages = fgh_page_table(rng, s->batch, keys, k->page_size, k->pages_per_seq, 3, k->table);
    free(keys);
    if (k->num_pages < 0) return 0;
    size_t lead = (size_t)k->p.place.lead, guard = (size_t)k->p.place.guard;
    size_t rows = (size_t)k->num_pages * k->page_size * hkv;
    if (!fgh_buffer_alloc(d, &k->pool_k, 2, lead, rows * dim, guard) ||
        !fgh_buffer_alloc(d, &k->pool_v, 2, lead, rows * dim_v, guard))
        return 0;
    for (int b = 0; b < s->batch; b++)
        for (int j = 0; j < k->cached[b]; j++) {
            int page = k->table[(size_t)b * k->pages_per_seq + j / k->page_size], row = j % k->page_size;
            for (int h = 0; h < hkv; h++) {
                for (int e = 0; e < dim; e++)
                    ((uint16_t *)k->pool_k.host)[pool_index(k, page, row, h, e, dim)] =
                        fgh_to_storage(k->p.host.k[key_index(k, b, h, j, dim) + e], dt);
                for (int e = 0; e < dim_v; e++)
                    ((uint16_t *)k->pool_v.host)[pool_index(k, page, row, h, e, dim_v)] =
                        fgh_to_storage(k->p.host.v[key_index(k, b, h, j, dim_v) + e], dt);
            }
        }
    return fgh_buffer_push(d, &k->pool_k) && fgh_buffer_push(d, &k->pool_v) &&
           fgh_buffer_ints(d, &k->d_table, k->table, s->batch * k->pages_per_seq, lead, guard);
}

/* k_new, v_new: each sequence's rows after its cached keys. */
static int new_rows(const fgh_device *d, fgh_paged *k) {
    const fgh_shape *s = &k->p.shape;
    const int hkv = s->heads_kv, dim = k->p.spec.head_dim, dim_v = k->p.head_dim_v, m = k->seqlen_new;
    if (m == 0) return 1;
    size_t rows = (size_t)s->batch * hkv * m;
    float *kn = malloc(rows * dim * sizeof *kn), *vn = malloc(rows * dim_v * sizeof *vn);
    int ok = (kn && vn ? 1 : fgh_fail("out of host memory")) &&
             fgh_tensor_alloc(d, &k->k_new, &k->p.place, s->batch, m, hkv, dim) &&
             fgh_tensor_alloc(d, &k->v_new, &k->p.place, s->batch, m, hkv, dim_v);
    if (ok) {
        for (int b = 0; b < s->batch; b++)
            for (int h = 0; h < hkv; h++)
                for (int i = 0; i < m; i++) {
                    size_t to = ((size_t)b * hkv + h) * m + i;
                    memcpy(kn + to * dim, k->p.host.k + key_index(k, b, h, k->cached[b] + i, dim),
                           dim * sizeof *kn);
                    memcpy(vn + to * dim_v, k->p.host.v + key_index(k, b, h, k->cached[b] + i, dim_v),
                           dim_v * sizeof *vn);
                }
        ok = fgh_tensor_upload(d, &k->k_new, kn, k->p.spec.dtype) &&
             fgh_tensor_upload(d, &k->v_new, vn, k->p.spec.dtype);
    }
    free(kn), free(vn);
    return ok;
}

static int latent(const fgh_paged *k) { return k->p.spec.kv_cache == FG_KV_LATENT; }

/* A latent cache's values are its keys' first columns. */
static void latent_values(fgh_paged *k) {
    const fgh_shape *s = &k->p.shape;
    const int dim = k->p.spec.head_dim, dim_v = k->p.head_dim_v;
    for (int b = 0; b < s->batch; b++)
        for (int h = 0; h < s->heads_kv; h++)
            for (int j = 0; j < s->seqlen_k; j++)
                memcpy(k->p.host.v + key_index(k, b, h, j, dim_v),
                       k->p.host.k + key_index(k, b, h, j, dim), dim_v * sizeof(float));
}

int fgh_paged_upload(const fgh_device *d, fgh_paged *k, fgh_rng *rng) {
    size_t lead = (size_t)k->p.place.lead, guard = (size_t)k->p.place.guard;
    if (latent(k)) latent_values(k);
    return fgh_problem_upload(d, &k->p) &&
           (k->page_size ? paged_cache(d, k, rng) : contiguous_cache(d, k)) && new_rows(d, k) &&
           fgh_buffer_ints(d, &k->d_cached, k->cached, k->p.shape.batch, lead, guard);
}

void fgh_paged_free(const fgh_device *d, fgh_paged *k) {
    fgh_problem_free(d, &k->p);
    fgh_buffer_free(d, &k->pool_k);
    fgh_buffer_free(d, &k->pool_v);
    fgh_buffer_free(d, &k->d_table);
    fgh_buffer_free(d, &k->d_cached);
    fgh_tensor_free(d, &k->k_new);
    fgh_tensor_free(d, &k->v_new);
    free(k->cached), free(k->table);
    memset(k, 0, sizeof *k);
}

fg_forward_args fgh_paged_forward_args(const fgh_paged *k, int splits) {
    fg_forward_args a = fgh_forward_args(&k->p, 1);
    a.cache_seqlens = (const int32_t *)(uintptr_t)k->d_cached.data;
    if (k->page_size) { /* the pools: (num_pages, page_size, Hkv, D) and (..., Dv) */
        const int64_t hkv = k->p.shape.heads_kv, dim = k->p.spec.head_dim, dim_v = k->p.head_dim_v;
        a.k = (fg_tensor){(void *)(uintptr_t)k->pool_k.data, k->page_size * hkv * dim, hkv * dim,
                          dim, 1};
        a.v = (fg_tensor){(void *)(uintptr_t)k->pool_v.data, k->page_size * hkv * dim_v,
                          hkv * dim_v, dim_v, 1};
        a.block_table = (const int32_t *)(uintptr_t)k->d_table.data;
        a.block_table_stride = k->pages_per_seq;
        a.page_size = k->page_size;
        a.num_pages = k->num_pages;
    }
    if (k->seqlen_new) {
        a.k_new = k->k_new.t, a.v_new = k->v_new.t;
        a.seqlen_new = k->seqlen_new;
    }
    if (latent(k)) /* K alone */
        a.v = a.v_new = (fg_tensor){0};
    a.num_splits = splits;
    return a;
}

int fgh_paged_check_forward(const fgh_paged *k, int b, const double *o, const float *lse,
                            fgh_forward_check *r) {
    const fgh_shape *s = &k->p.shape;
    const int dim = k->p.spec.head_dim, dim_v = k->p.head_dim_v, nk = fgh_paged_keys(k, b);
    fg_spec spec = k->p.spec;
    spec.kv_cache = 0;
    fgh_shape sh = *s;
    sh.batch = 1, sh.seqlen_k = nk, sh.batch0 = b; /* batch0: ALiBi's row of the sequence */
    fgh_placement pl = {0};
    fgh_problem sp;
    int ok = fgh_problem_init(&sp, &spec, &sh, &pl, 0);
    free(sp.host.alibi_slopes), free(sp.host.sinks); /* the step's, borrowed */
    sp.host.alibi_slopes = k->p.host.alibi_slopes, sp.alibi_rows = k->p.alibi_rows;
    sp.host.sinks = k->p.host.sinks;
    if (ok) {
        size_t rows = (size_t)s->heads_q * s->seqlen_q;
        memcpy(sp.host.q, k->p.host.q + b * rows * dim, rows * dim * sizeof *sp.host.q);
        for (int h = 0; h < s->heads_kv; h++) {
            memcpy(sp.host.k + (size_t)h * nk * dim, k->p.host.k + key_index(k, b, h, 0, dim),
                   (size_t)nk * dim * sizeof(float));
            memcpy(sp.host.v + (size_t)h * nk * dim_v, k->p.host.v + key_index(k, b, h, 0, dim_v),
                   (size_t)nk * dim_v * sizeof(float));
        }
        ok = fgh_check_forward(&sp, o + b * rows * dim_v, lse + b * rows, r);
    }
    sp.host.alibi_slopes = sp.host.sinks = NULL;
    fgh_problem_free(NULL, &sp); /* host memory only */
    return ok;
}

int fgh_paged_appended(const fgh_device *d, fgh_paged *k, size_t *differ) {
    const fgh_shape *s = &k->p.shape;
    const int dim = k->p.spec.head_dim, dim_v = k->p.head_dim_v;
    fg_dtype dt = k->p.spec.dtype;
    *differ = 0;
    if (!k->seqlen_new) return 1;
    fgh_buffer *kb = k->page_size ? &k->pool_k : &k->p.k.mem;
    fgh_buffer *vb = k->page_size ? &k->pool_v : &k->p.v.mem;
    if (!fgh_buffer_pull(d, kb) || !fgh_buffer_pull(d, vb)) return 0;
    for (int b = 0; b < s->batch; b++)
        for (int i = 0; i < k->seqlen_new; i++) {
            int j = k->cached[b] + i;
            int page = k->page_size ? k->table[(size_t)b * k->pages_per_seq + j / k->page_size] : 0;
            for (int h = 0; h < s->heads_kv; h++) {
                for (int e = 0; e < dim; e++) {
                    size_t at = k->page_size ? pool_index(k, page, j % k->page_size, h, e, dim)
                                             : fgh_tensor_index(&k->p.k, b, j, h, e);
                    *differ += ((uint16_t *)kb->host)[at] !=
                               fgh_to_storage(k->p.host.k[key_index(k, b, h, j, dim) + e], dt);
                }
                for (int e = 0; e < dim_v && !latent(k); e++) {
                    size_t at = k->page_size ? pool_index(k, page, j % k->page_size, h, e, dim_v)
                                             : fgh_tensor_index(&k->p.v, b, j, h, e);
                    *differ += ((uint16_t *)vb->host)[at] !=
                               fgh_to_storage(k->p.host.v[key_index(k, b, h, j, dim_v) + e], dt);
                }
            }
        }
    return 1;
}
