/* The forward kernels on a live GPU against the fp64 reference.
 *
 * Every case: fresh random inputs rounded to the dtype, uploaded in (B,S,H,D)
 * or (B,H,S,D) order (optionally with gaps between rows), outputs poisoned
 * with NaN, one fg_forward, then
 *   - O: relative error <= 2 x that of the naive computation in the input
 *     precision (ref_attention_lowp) + 1e-6 (an absolute floor for cases
 *     where the naive path is exact, e.g. one visible key per row);
 *   - every O element finite; rows with no visible key exactly 0;
 *   - nothing written outside O and LSE (gaps, and guards before and after,
 *     keep the poison);
 *   - LSE within 1e-3 * max(1, |ref|), and -inf exactly where ref is -inf.
 * Dropout cases with probe inputs also check the keep pattern bit for bit
 * against the CPU Philox stream, the kept values and the drop rate.
 *
 * usage: gpu_forward [--quick] [name-filter]
 * --quick runs about a dozen representative cases (for compute-sanitizer). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flashgen.h"
#include "reference/reference.h"
#include "runtime/cuda_libs.h"
#include "tests/check.h"

enum { ORDER_BSHD = 0, ORDER_BHSD = 1 };
/* Poisoned elements before and after each device tensor (64 keeps the data
 * 16-byte aligned). */
enum { LEAD = 64, GUARD = 512 };
#define ABS_FLOOR 1e-6
#define LSE_TOL 1e-3
#define POISON16 0xFFFFu
#define POISON32 0xFFFFFFFFu

struct fwd_case {
    const char *name;
    fg_dtype dtype;
    int d, batch, hq, hkv, sq, sk; /* hkv 0 means hq */
    int order;                     /* ORDER_BSHD or ORDER_BHSD */
    int pad;                       /* extra elements after each row: strides with gaps */
    fg_mask mask;
    fg_causal_align align;
    int wl, wr;                    /* window sizes, FG_MASK_WINDOW only */
    float scale;                   /* 0: 1/sqrt(d) */
    float dropout_p;
    uint64_t seed, offset;
    int probe;                     /* dropout keep-pattern inputs instead of random ones */
    fg_sparsity sparsity;
    int block_q, block_k;
    int factors;                   /* butterfly */
    int per_head_layout;           /* layout: one per query head, else shared */
    int no_lse;                    /* pass lse = NULL */
    int quick;                     /* part of --quick */
};

static const cuda_driver *cu;

/* ---- small utilities ------------------------------------------------------- */

static uint64_t rng_state;

static uint64_t rng_next(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_unit(void) { return (double)((rng_next() >> 11) + 1) * 0x1p-53; } /* (0, 1] */

static float rng_normal(void) { /* Box-Muller */
    return (float)(sqrt(-2.0 * log(rng_unit())) * cos(6.283185307179586 * rng_unit()));
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint16_t to_storage(float x, fg_dtype dt) {
    return dt == FG_BF16 ? ref_float_to_bf16(x) : ref_float_to_half(x);
}

static float from_storage(uint16_t x, fg_dtype dt) {
    return dt == FG_BF16 ? ref_bf16_to_float(x) : ref_half_to_float(x);
}

static int cu_ok(CUresult r, const char *what) {
    const char *text = NULL;
    if (r != CUDA_SUCCESS) cu->cuGetErrorString(r, &text);
    CHECK(r == CUDA_SUCCESS, "%s: %s", what, text ? text : "unknown CUDA error");
    return r == CUDA_SUCCESS;
}

/* ---- device tensors ---------------------------------------------------------- */

/* A tensor as the kernel sees it plus its allocation: LEAD poisoned elements,
 * the strided extent, GUARD poisoned elements. host mirrors the allocation. */
struct dev_tensor {
    fg_tensor t;
    int batch, seq, heads, dim;
    CUdeviceptr base;
    size_t elems;   /* allocated elements, lead and guard included */
    uint16_t *host;
};

static fg_tensor make_strides(int order, int pad, int seq, int heads, int dim) {
    if (pad == 0) return order == ORDER_BSHD ? fg_tensor_bshd(NULL, seq, heads, dim)
                                             : fg_tensor_bhsd(NULL, seq, heads, dim);
    fg_tensor t = {NULL, 0, 0, 0, 1};
    if (order == ORDER_BSHD) {
        t.stride_seq = (int64_t)heads * dim + pad;
        t.stride_head = dim;
        t.stride_batch = t.stride_seq * seq;
    } else {
        t.stride_seq = dim + pad;
        t.stride_head = t.stride_seq * seq;
        t.stride_batch = t.stride_head * heads;
    }
    return t;
}

static size_t tensor_index(const struct dev_tensor *x, int b, int s, int h, int d) {
    return (size_t)(LEAD + b * x->t.stride_batch + s * x->t.stride_seq + h * x->t.stride_head + d);
}

/* Allocates the tensor on the device and fills the host mirror with poison. */
static int dev_tensor_alloc(struct dev_tensor *x, const struct fwd_case *c, int seq, int heads) {
    memset(x, 0, sizeof *x);
    x->t = make_strides(c->order, c->pad, seq, heads, c->d);
    x->batch = c->batch, x->seq = seq, x->heads = heads, x->dim = c->d;
    x->elems = tensor_index(x, c->batch - 1, seq - 1, heads - 1, c->d - 1) + 1 + GUARD;
    x->host = malloc(x->elems * sizeof *x->host);
    CHECK(x->host != NULL, "out of host memory");
    if (!x->host || !cu_ok(cu->cuMemAlloc(&x->base, x->elems * 2), "cuMemAlloc")) return 0;
    x->t.data = (void *)(uintptr_t)(x->base + LEAD * 2);
    for (size_t n = 0; n < x->elems; n++) x->host[n] = POISON16;
    return 1;
}

static void dev_tensor_free(struct dev_tensor *x) {
    if (x->base) cu->cuMemFree(x->base);
    free(x->host);
    memset(x, 0, sizeof *x);
}

/* Scatters a (B,H,S,D) contiguous float array into the tensor and uploads it;
 * gaps, lead and guard stay NaN so that reading them would show. */
static int dev_tensor_upload(struct dev_tensor *x, const float *src, fg_dtype dt) {
    size_t n = 0;
    for (int b = 0; b < x->batch; b++)
        for (int h = 0; h < x->heads; h++)
            for (int s = 0; s < x->seq; s++)
                for (int d = 0; d < x->dim; d++)
                    x->host[tensor_index(x, b, s, h, d)] = to_storage(src[n++], dt);
    return cu_ok(cu->cuMemcpyHtoD(x->base, x->host, x->elems * 2), "upload");
}

/* Downloads the tensor, gathers it into (B,H,S,D) doubles and checks that
 * every element is finite and every other element of the allocation still
 * holds the poison. */
static int dev_tensor_take(struct dev_tensor *x, double *dst, fg_dtype dt, const char *name) {
    if (!cu_ok(cu->cuMemcpyDtoH(x->host, x->base, x->elems * 2), "download")) return 0;
    size_t n = 0, nonfinite = 0, first_bad = 0, stray = 0, first_stray = 0;
    for (int b = 0; b < x->batch; b++)
        for (int h = 0; h < x->heads; h++)
            for (int s = 0; s < x->seq; s++)
                for (int d = 0; d < x->dim; d++, n++) {
                    uint16_t *e = &x->host[tensor_index(x, b, s, h, d)];
                    dst[n] = from_storage(*e, dt);
                    if (!isfinite(dst[n]) && nonfinite++ == 0) first_bad = n;
                    *e = POISON16; /* what is left must be untouched poison */
                }
    for (size_t k = 0; k < x->elems; k++)
        if (x->host[k] != POISON16 && stray++ == 0) first_stray = k;
    CHECK(nonfinite == 0, "%s: %zu output elements not finite or not written (first at %zu)",
          name, nonfinite, first_bad);
    CHECK(stray == 0, "%s: %zu elements written outside the output (first at offset %lld)", name,
          stray, (long long)first_stray - LEAD);
    return 1;
}

/* ---- inputs ----------------------------------------------------------------- */

struct inputs {
    float *q, *k, *v;             /* (B,H,S,D) contiguous, rounded to the dtype */
    size_t nq, nk;
};

static void random_fill(float *x, size_t n, fg_dtype dt) {
    for (size_t i = 0; i < n; i++) x[i] = ref_round(rng_normal(), dt);
}

/* Q = 0 makes every visible key equally likely; V[j][d] = 1 iff d == j mod D,
 * so O[i][d] is nonzero iff the one visible key j == d (mod D) was kept. */
static void probe_fill(const struct fwd_case *c, struct inputs *in) {
    memset(in->q, 0, in->nq * sizeof *in->q);
    random_fill(in->k, in->nk, c->dtype);
    for (size_t row = 0; row < in->nk / (size_t)c->d; row++) {
        int j = (int)(row % (size_t)c->sk);
        for (int d = 0; d < c->d; d++) in->v[row * c->d + d] = d == j % c->d ? 1.0f : 0.0f;
    }
}

static int inputs_make(const struct fwd_case *c, struct inputs *in) {
    in->nq = (size_t)c->batch * c->hq * c->sq * c->d;
    in->nk = (size_t)c->batch * c->hkv * c->sk * c->d;
    in->q = malloc(in->nq * sizeof(float));
    in->k = malloc(in->nk * sizeof(float));
    in->v = malloc(in->nk * sizeof(float));
    CHECK(in->q && in->k && in->v, "out of host memory");
    if (!in->q || !in->k || !in->v) return 0;
    if (c->probe) {
        probe_fill(c, in);
    } else {
        random_fill(in->q, in->nq, c->dtype);
        random_fill(in->k, in->nk, c->dtype);
        random_fill(in->v, in->nk, c->dtype);
    }
    return 1;
}

static void inputs_free(struct inputs *in) {
    free(in->q);
    free(in->k);
    free(in->v);
}

/* ---- spec, arguments, reference problem ----------------------------------- */

static fg_spec case_spec(const struct fwd_case *c) {
    fg_spec s = fg_spec_default(c->d, c->dtype);
    s.mask = c->mask;
    s.dropout = c->dropout_p > 0.f;
    s.sparsity = c->sparsity;
    if (c->sparsity != FG_SPARSE_NONE) {
        s.sparse_block_q = c->block_q;
        s.sparse_block_k = c->block_k;
    }
    s.butterfly_factors = c->factors;
    return s;
}

static int blocks_q(const struct fwd_case *c) { return (c->sq + c->block_q - 1) / c->block_q; }
static int blocks_k(const struct fwd_case *c) { return (c->sk + c->block_k - 1) / c->block_k; }
static int layout_heads(const struct fwd_case *c) { return c->per_head_layout ? c->hq : 1; }

/* A random 0/1 block layout in which query block 1 of head 0 (0 when there
 * is only one) keeps no key block: its rows must come out 0 with lse -inf. */
static uint8_t *random_layout(const struct fwd_case *c) {
    size_t nbq = (size_t)blocks_q(c), nbk = (size_t)blocks_k(c);
    size_t n = (size_t)layout_heads(c) * nbq * nbk;
    uint8_t *m = malloc(n);
    if (!m) return NULL;
    for (size_t t = 0; t < n; t++) m[t] = (uint8_t)(rng_next() >> 63);
    size_t empty = nbq > 1 ? 1 : 0;
    memset(m + empty * nbk, 0, nbk);
    return m;
}

static ref_problem case_problem(const struct fwd_case *c, const uint8_t *layout) {
    ref_problem p;
    memset(&p, 0, sizeof p);
    p.batch = c->batch, p.heads_q = c->hq, p.heads_kv = c->hkv;
    p.seqlen_q = c->sq, p.seqlen_k = c->sk, p.head_dim = c->d;
    /* the exact float the library uses, so both sides scale identically */
    p.scale = c->scale != 0.f ? (double)c->scale : (double)(1.0f / sqrtf((float)c->d));
    p.mask = (int)c->mask;
    p.diag_offset = c->align == FG_ALIGN_TOP_LEFT ? 0 : (int64_t)c->sk - c->sq;
    p.window_left = c->mask == FG_MASK_WINDOW ? c->wl : -1;
    p.window_right = c->mask == FG_MASK_WINDOW ? c->wr : c->mask == FG_MASK_CAUSAL ? 0 : -1;
    p.dropout_p = (double)c->dropout_p;
    p.seed = c->seed, p.offset = c->offset;
    p.sparsity = (int)c->sparsity;
    p.block_q = c->block_q, p.block_k = c->block_k;
    p.layout = layout;
    p.layout_heads = layout_heads(c);
    p.butterfly_factors = c->factors;
    return p;
}

/* ---- checks ------------------------------------------------------------------- */

struct lse_stats {
    size_t bad, bad_inf, zero_rows_bad;
    double worst;
};

/* LSE against the fp64 one, and O exactly 0 on rows with no visible key. */
static struct lse_stats compare_lse(const struct fwd_case *c, const float *lse, const double *ref_lse,
                                    const double *o) {
    struct lse_stats st = {0, 0, 0, 0.0};
    size_t rows = (size_t)c->batch * c->hq * c->sq;
    for (size_t r = 0; r < rows; r++) {
        if (isinf(ref_lse[r]) && ref_lse[r] < 0) {
            for (int d = 0; d < c->d; d++)
                if (o[r * c->d + d] != 0.0) {
                    st.zero_rows_bad++;
                    break;
                }
            if (lse && !(isinf(lse[r]) && lse[r] < 0)) st.bad_inf++;
            continue;
        }
        if (!lse) continue;
        double err = fabs((double)lse[r] - ref_lse[r]);
        if (!(err <= LSE_TOL * fmax(1.0, fabs(ref_lse[r])))) st.bad++;
        if (!isnan(st.worst) && !(err <= st.worst)) st.worst = err; /* a NaN sticks */
    }
    return st;
}

static size_t dropout_probe_total, dropout_probe_dropped;

static void check_drop_rate(const char *name, size_t dropped, size_t total, uint32_t threshold) {
    double p = threshold / 65536.0, rate = total ? (double)dropped / total : 0.0;
    double sigma = sqrt(p * (1.0 - p) / (double)(total ? total : 1));
    CHECK(total > 0 && fabs(rate - p) <= 5.0 * sigma,
          "%s: drop rate %.5f over %zu draws, expected %.5f +- 5 x %.5f", name, rate, total, p,
          sigma);
}

/* With probe inputs: O[i][d] != 0 exactly when the visible key j == d (mod D)
 * is kept by the CPU Philox stream, and then equals scale / (visible keys). */
static void check_dropout_probe(const struct fwd_case *c, const ref_problem *p, const double *o) {
    const uint32_t thr = ref_dropout_threshold(p->dropout_p);
    const double keep_scale = ref_dropout_scale(thr);
    const double tol = c->dtype == FG_BF16 ? 0x1p-7 : 0x1p-10; /* one ulp of the dtype */
    size_t mismatch = 0, bad_value = 0, total = 0, dropped = 0;
    for (int b = 0; b < c->batch; b++)
        for (int h = 0; h < c->hq; h++)
            for (int64_t i = 0; i < c->sq; i++) {
                int64_t lo = i + p->diag_offset - c->wl, hi = i + p->diag_offset + c->wr;
                if (lo < 0) lo = 0;
                if (hi > c->sk - 1) hi = c->sk - 1;
                const double *row = o + (((size_t)b * c->hq + h) * c->sq + (size_t)i) * c->d;
                for (int d = 0; d < c->d; d++) {
                    int64_t j = lo + ((d - lo % c->d) + c->d) % c->d; /* the key == d mod D */
                    int kept = 0;
                    if (j <= hi) {
                        kept = ref_dropout_keep(p->seed, p->offset, b, h, i, j, thr);
                        total++;
                        dropped += !kept;
                    }
                    if ((row[d] != 0.0) != kept) {
                        if (mismatch++ < 5)
                            fprintf(stderr, "  %s: b%d h%d i%lld d%d key %lld: O = %g, CPU keep %d\n",
                                    c->name, b, h, (long long)i, d, (long long)j, row[d], kept);
                    } else if (kept) {
                        double want = keep_scale / (double)(hi - lo + 1);
                        if (!(fabs(row[d] - want) <= tol * want)) bad_value++;
                    }
                }
            }
    CHECK(mismatch == 0, "%s: %zu of %zu keep decisions differ from the CPU Philox stream",
          c->name, mismatch, total);
    CHECK(bad_value == 0, "%s: %zu kept values differ from scale/visible by more than an ulp",
          c->name, bad_value);
    check_drop_rate(c->name, dropped, total, thr);
    dropout_probe_total += total;
    dropout_probe_dropped += dropped;
}

/* ---- one case -------------------------------------------------------------------- */

struct case_outputs {
    double *o, *ref_o, *ref_lse;
    float *low_o, *lse;
};

static int outputs_alloc(struct case_outputs *r, size_t no, size_t rows) {
    r->o = malloc(no * sizeof(double));
    r->ref_o = malloc(no * sizeof(double));
    r->low_o = malloc(no * sizeof(float));
    r->ref_lse = malloc(rows * sizeof(double));
    r->lse = malloc((LEAD + rows + GUARD) * sizeof(float));
    CHECK(r->o && r->ref_o && r->low_o && r->ref_lse && r->lse, "out of host memory");
    return r->o && r->ref_o && r->low_o && r->ref_lse && r->lse;
}

static void outputs_free(struct case_outputs *r) {
    free(r->o);
    free(r->ref_o);
    free(r->low_o);
    free(r->ref_lse);
    free(r->lse);
}

/* Downloads LSE and checks that its lead and guard (everything, when the
 * call had no lse) kept the poison. */
static int take_lse(CUdeviceptr dev, float *host, size_t rows, int passed, const char *name) {
    if (!cu_ok(cu->cuMemcpyDtoH(host, dev, (LEAD + rows + GUARD) * sizeof(float)), "download lse"))
        return 0;
    size_t stray = 0;
    for (size_t n = 0; n < LEAD + rows + GUARD; n++) {
        uint32_t bits;
        memcpy(&bits, &host[n], sizeof bits);
        if ((!passed || n < LEAD || n >= LEAD + rows) && bits != POISON32) stray++;
    }
    CHECK(stray == 0, "%s: %zu floats written outside lse", name, stray);
    return 1;
}

/* Uploads, poisons, launches and downloads; fills out->o and out->lse (at
 * out->lse + LEAD). Returns 0 when the run itself failed. */
static int launch_case(fg_context *ctx, const struct fwd_case *c, const struct inputs *in,
                       const fg_layout *layout, struct case_outputs *out) {
    struct dev_tensor q = {0}, k = {0}, v = {0}, o = {0};
    CUdeviceptr lse = 0;
    size_t rows = (size_t)c->batch * c->hq * c->sq;
    int ok = dev_tensor_alloc(&q, c, c->sq, c->hq) && dev_tensor_alloc(&k, c, c->sk, c->hkv) &&
             dev_tensor_alloc(&v, c, c->sk, c->hkv) && dev_tensor_alloc(&o, c, c->sq, c->hq) &&
             cu_ok(cu->cuMemAlloc(&lse, (LEAD + rows + GUARD) * sizeof(float)), "cuMemAlloc lse") &&
             dev_tensor_upload(&q, in->q, c->dtype) && dev_tensor_upload(&k, in->k, c->dtype) &&
             dev_tensor_upload(&v, in->v, c->dtype) &&
             cu_ok(cu->cuMemsetD8(o.base, 0xFF, o.elems * 2), "poison o") &&
             cu_ok(cu->cuMemsetD8(lse, 0xFF, (LEAD + rows + GUARD) * sizeof(float)), "poison lse");
    if (ok) {
        fg_spec spec = case_spec(c);
        fg_forward_args a = fg_forward_args_default();
        a.q = q.t, a.k = k.t, a.v = v.t, a.o = o.t;
        a.lse = c->no_lse ? NULL : (float *)(uintptr_t)(lse + LEAD * sizeof(float));
        a.batch = c->batch, a.heads_q = c->hq, a.heads_kv = c->hkv;
        a.seqlen_q = c->sq, a.seqlen_k = c->sk;
        a.softmax_scale = c->scale;
        a.align = c->align;
        if (c->mask == FG_MASK_WINDOW) a.window_left = c->wl, a.window_right = c->wr;
        a.dropout_p = c->dropout_p;
        a.seed = c->seed, a.offset = c->offset;
        a.layout = layout;
        fg_status st = fg_forward(ctx, &spec, &a);
        CHECK(st == FG_OK, "%s: fg_forward: %s: %s", c->name, fg_status_name(st),
              fg_context_message(ctx));
        ok = st == FG_OK && cu_ok(cu->cuCtxSynchronize(), "kernel") &&
             dev_tensor_take(&o, out->o, c->dtype, c->name) &&
             take_lse(lse, out->lse, rows, !c->no_lse, c->name);
    }
    dev_tensor_free(&q);
    dev_tensor_free(&k);
    dev_tensor_free(&v);
    dev_tensor_free(&o);
    if (lse) cu->cuMemFree(lse);
    return ok;
}

static void print_result(const struct fwd_case *c, double err, double bound,
                         const struct lse_stats *ls, double seconds, int pass) {
    printf("%-26s %s d%-3d B%d H%d/%d Sq%-5d Sk%-5d %s err %.3e bound %.3e lse %.1e %5.1fs %s\n",
           c->name, c->dtype == FG_BF16 ? "bf16" : "fp16", c->d, c->batch, c->hq, c->hkv, c->sq,
           c->sk, c->order == ORDER_BSHD ? "bshd" : "bhsd", err, bound, ls->worst, seconds,
           pass ? "PASS" : "FAIL");
    fflush(stdout);
}

static void run_case(fg_context *ctx, const struct fwd_case *c, uint64_t case_seed) {
    int failed_before = check_failed_count;
    double t0 = now_s();
    rng_state = case_seed;
    struct inputs in = {0};
    struct case_outputs out = {0};
    uint8_t *mask = NULL;
    fg_layout *layout = NULL;
    size_t no = (size_t)c->batch * c->hq * c->sq * c->d, rows = (size_t)c->batch * c->hq * c->sq;
    double err = NAN, bound = NAN;
    struct lse_stats ls = {0, 0, 0, NAN};

    int ok = inputs_make(c, &in) && outputs_alloc(&out, no, rows);
    if (ok && c->sparsity == FG_SPARSE_LAYOUT) {
        fg_status st = FG_ERR_OUT_OF_MEMORY;
        if ((mask = random_layout(c)))
            st = fg_layout_create(ctx, mask, layout_heads(c), blocks_q(c), blocks_k(c), &layout);
        CHECK(st == FG_OK, "%s: fg_layout_create: %s", c->name, fg_context_message(ctx));
        ok = st == FG_OK;
    }
    ok = ok && launch_case(ctx, c, &in, layout, &out);
    if (ok) {
        ref_problem p = case_problem(c, mask);
        CHECK(ref_attention_fp64(&p, in.q, in.k, in.v, out.ref_o, out.ref_lse) == 0 &&
                  ref_attention_lowp(&p, c->dtype, in.q, in.k, in.v, out.low_o) == 0,
              "%s: reference out of memory", c->name);
        err = ref_rel_error(out.o, out.ref_o, no);
        bound = 2.0 * ref_rel_error_f(out.low_o, out.ref_o, no) + ABS_FLOOR;
        CHECK(err <= bound, "%s: relative error %.3e exceeds %.3e", c->name, err, bound);
        ls = compare_lse(c, c->no_lse ? NULL : out.lse + LEAD, out.ref_lse, out.o);
        CHECK(ls.bad == 0, "%s: %zu lse values off by more than %g (worst %g)", c->name, ls.bad,
              LSE_TOL, ls.worst);
        CHECK(ls.bad_inf == 0, "%s: %zu rows with no visible key have lse != -inf", c->name,
              ls.bad_inf);
        CHECK(ls.zero_rows_bad == 0, "%s: %zu rows with no visible key have O != 0", c->name,
              ls.zero_rows_bad);
        if (c->probe) check_dropout_probe(c, &p, out.o);
    }
    print_result(c, err, bound, &ls, now_s() - t0, ok && check_failed_count == failed_before);
    fg_layout_destroy(layout);
    free(mask);
    inputs_free(&in);
    outputs_free(&out);
}

/* ---- the case matrix ----------------------------------------------------------- */

#define MAX_CASES 256
static struct fwd_case cases[MAX_CASES];
static int case_count;
static char head_dim_names[2][64][24];

static void add(struct fwd_case c) {
    if (c.batch == 0) c.batch = 1;
    if (c.hkv == 0) c.hkv = c.hq;
    CHECK(case_count < MAX_CASES, "more than %d cases: raise MAX_CASES", MAX_CASES);
    if (case_count < MAX_CASES) cases[case_count++] = c;
}

/* Every head dim 8..256 step 8 plus odd ones, fp16; a subset in bf16. */
static void add_head_dim_cases(void) {
    static const int odd[] = {1, 3, 33, 65, 100, 129, 200, 255};
    static const int bf16[] = {8, 33, 64, 100, 128, 256};
    int dims[64], n = 0;
    for (int d = 8; d <= 256; d += 8) dims[n++] = d;
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) dims[n++] = odd[i];
    for (int i = 0; i < n; i++) {
        snprintf(head_dim_names[0][i], sizeof head_dim_names[0][i], "head_dim %d", dims[i]);
        add((struct fwd_case){.name = head_dim_names[0][i], .d = dims[i], .hq = 2, .sq = 67,
                              .sk = 131, .order = i % 2,
                              .quick = dims[i] == 64 || dims[i] == 255});
    }
    for (size_t i = 0; i < sizeof bf16 / sizeof bf16[0]; i++) {
        snprintf(head_dim_names[1][i], sizeof head_dim_names[1][i], "head_dim %d bf16", bf16[i]);
        add((struct fwd_case){.name = head_dim_names[1][i], .dtype = FG_BF16, .d = bf16[i],
                              .hq = 2, .sq = 67, .sk = 131, .order = (int)i % 2});
    }
}

/* Lengths 1, 17, 255, 1000, 4097 on both sides, head dims 64 and 128. The
 * reference is single-threaded: the long ones use one head and stay near
 * 1e9 multiply-adds. */
static const struct fwd_case length_cases[] = {
    {.name = "len 1x1", .d = 64, .hq = 2, .sq = 1, .sk = 1},
    {.name = "len 1x17", .d = 128, .hq = 2, .sq = 1, .sk = 17, .order = ORDER_BHSD},
    {.name = "len 17x1", .d = 64, .hq = 2, .sq = 17, .sk = 1},
    {.name = "len 1x4097", .d = 64, .hq = 2, .sq = 1, .sk = 4097},
    {.name = "len 4097x1", .d = 128, .hq = 2, .sq = 4097, .sk = 1, .order = ORDER_BHSD},
    {.name = "len 17x255", .d = 128, .hq = 2, .sq = 17, .sk = 255},
    {.name = "len 255x17", .d = 128, .hq = 2, .sq = 255, .sk = 17, .quick = 1},
    {.name = "len 255x255", .d = 64, .batch = 2, .hq = 2, .sq = 255, .sk = 255, .order = ORDER_BHSD},
    {.name = "len 1000x1000", .d = 128, .hq = 1, .sq = 1000, .sk = 1000},
    {.name = "len 255x1000", .d = 64, .hq = 2, .sq = 255, .sk = 1000, .order = ORDER_BHSD},
    {.name = "len 1000x255", .d = 128, .hq = 2, .sq = 1000, .sk = 255},
    {.name = "len 17x4097", .d = 128, .hq = 2, .sq = 17, .sk = 4097},
    {.name = "len 4097x17", .d = 64, .hq = 2, .sq = 4097, .sk = 17, .order = ORDER_BHSD},
    {.name = "len 1000x4097", .d = 64, .hq = 1, .sq = 1000, .sk = 4097},
    {.name = "len 4097x1000", .d = 128, .hq = 1, .sq = 4097, .sk = 1000, .order = ORDER_BHSD},
    {.name = "len 4097x2000", .d = 64, .hq = 1, .sq = 4097, .sk = 2000},
    /* scores with a spread of ~8: the running max must keep exp in range */
    {.name = "sharp softmax", .d = 64, .hq = 2, .sq = 300, .sk = 300, .scale = 1.0f},
    {.name = "gapped rows d64", .d = 64, .batch = 2, .hq = 3, .sq = 100, .sk = 150, .pad = 8},
    {.name = "gapped rows d33", .d = 33, .batch = 2, .hq = 2, .sq = 100, .sk = 77, .pad = 3,
     .order = ORDER_BHSD, .quick = 1},
    {.name = "gapped rows d1", .d = 1, .hq = 3, .sq = 50, .sk = 70, .pad = 5},
    {.name = "gapped rows d100 bf16", .dtype = FG_BF16, .d = 100, .hq = 2, .sq = 90, .sk = 130,
     .pad = 4, .order = ORDER_BHSD},
    {.name = "no lse", .d = 64, .hq = 2, .sq = 100, .sk = 100, .no_lse = 1},
};

static const struct fwd_case gqa_cases[] = {
    {.name = "gqa 8/2 d64", .d = 64, .batch = 2, .hq = 8, .hkv = 2, .sq = 200, .sk = 333, .quick = 1},
    {.name = "gqa 8/2 d128", .d = 128, .batch = 2, .hq = 8, .hkv = 2, .sq = 200, .sk = 333,
     .order = ORDER_BHSD},
    {.name = "mqa 8/1 d128", .d = 128, .batch = 2, .hq = 8, .hkv = 1, .sq = 150, .sk = 257},
    {.name = "mqa 8/1 d64", .d = 64, .batch = 2, .hq = 8, .hkv = 1, .sq = 257, .sk = 150,
     .order = ORDER_BHSD},
    {.name = "gqa 8/2 causal", .d = 64, .batch = 2, .hq = 8, .hkv = 2, .sq = 200, .sk = 333,
     .mask = FG_MASK_CAUSAL},
    {.name = "mqa 8/1 window", .d = 128, .hq = 8, .hkv = 1, .sq = 300, .sk = 300,
     .order = ORDER_BHSD, .mask = FG_MASK_WINDOW, .wl = 40, .wr = 8},
    {.name = "gqa 8/2 bf16", .dtype = FG_BF16, .d = 64, .batch = 2, .hq = 8, .hkv = 2, .sq = 129,
     .sk = 200},
};

/* Causal, both alignments, Sq < Sk, Sq > Sk (bottom-right masks whole rows)
 * and Sq == Sk, head dims 64 and 128, layouts alternating. */
static void add_causal_cases(void) {
    static const int lens[3][2] = {{100, 300}, {300, 100}, {257, 257}};
    static char names[12][40];
    int n = 0;
    for (int d = 64; d <= 128; d *= 2)
        for (int al = 0; al < 2; al++)
            for (int l = 0; l < 3; l++, n++) {
                snprintf(names[n], sizeof names[n], "causal %s %dx%d d%d", al ? "tl" : "br",
                         lens[l][0], lens[l][1], d);
                add((struct fwd_case){.name = names[n], .d = d, .batch = 2, .hq = 2,
                                      .sq = lens[l][0], .sk = lens[l][1], .order = n % 2,
                                      .mask = FG_MASK_CAUSAL, .align = (fg_causal_align)al,
                                      .quick = n == 1});
            }
    add((struct fwd_case){.name = "causal br 300x100 bf16", .dtype = FG_BF16, .d = 64, .batch = 2,
                          .hq = 2, .sq = 300, .sk = 100, .mask = FG_MASK_CAUSAL, .quick = 1});
    add((struct fwd_case){.name = "causal tl 100x300 bf16", .dtype = FG_BF16, .d = 64, .hq = 2,
                          .sq = 100, .sk = 300, .order = ORDER_BHSD, .mask = FG_MASK_CAUSAL,
                          .align = FG_ALIGN_TOP_LEFT});
}

#define WINDOW(nm, dd, q, k, al, l, r)                                                        \
    {.name = nm, .d = dd, .batch = 2, .hq = 2, .sq = q, .sk = k, .mask = FG_MASK_WINDOW,        \
     .align = al, .wl = l, .wr = r}
static const struct fwd_case window_cases[] = {
    WINDOW("window 32/0", 64, 300, 300, FG_ALIGN_BOTTOM_RIGHT, 32, 0),
    WINDOW("window 0/32 tl", 128, 300, 300, FG_ALIGN_TOP_LEFT, 0, 32),
    WINDOW("window -1/16", 64, 200, 500, FG_ALIGN_BOTTOM_RIGHT, -1, 16),
    WINDOW("window 16/-1", 128, 500, 200, FG_ALIGN_BOTTOM_RIGHT, 16, -1),
    WINDOW("window 0/0 tl", 64, 129, 129, FG_ALIGN_TOP_LEFT, 0, 0),
    /* rows i < 150 see no key */
    WINDOW("window 100/50 empty rows", 64, 300, 100, FG_ALIGN_BOTTOM_RIGHT, 100, 50),
    WINDOW("window -1/-1 tl", 128, 100, 300, FG_ALIGN_TOP_LEFT, -1, -1),
    /* rows i > 206 see no key */
    WINDOW("window 7/3 tl empty rows", 64, 500, 200, FG_ALIGN_TOP_LEFT, 7, 3),
    {.name = "window 128/128 long", .d = 64, .hq = 2, .sq = 4097, .sk = 4097,
     .mask = FG_MASK_WINDOW, .wl = 128, .wr = 128, .quick = 1},
    {.name = "window 64/0 tl bf16", .dtype = FG_BF16, .d = 128, .hq = 2, .sq = 300, .sk = 300,
     .order = ORDER_BHSD, .mask = FG_MASK_WINDOW, .align = FG_ALIGN_TOP_LEFT, .wl = 64, .wr = 0},
};

/* (a) probe inputs: window [i, i+D-1] so each d sees at most one key;
 * (c) random inputs with p = 0.1 against the reference with the same stream. */
#define PROBE(nm, dt, s, off, q)                                                                \
    {.name = nm, .dtype = dt, .d = 64, .batch = 2, .hq = 3, .sq = 300, .sk = 300,                \
     .mask = FG_MASK_WINDOW, .wl = 0, .wr = 63, .dropout_p = 0.3f, .seed = s, .offset = off,     \
     .probe = 1, .quick = q}
static const struct fwd_case dropout_cases[] = {
    PROBE("dropout keep 1", FG_FP16, 0x1234u, 0, 1),
    PROBE("dropout keep 2", FG_FP16, 0xdeadbeefcafef00dull, 0x100000007ull, 0),
    PROBE("dropout keep 3", FG_FP16, 42, 0xffffffff00000010ull, 0),
    PROBE("dropout keep bf16", FG_BF16, 7, 12345, 0),
    {.name = "dropout 0.1", .d = 64, .batch = 2, .hq = 2, .sq = 200, .sk = 300,
     .dropout_p = 0.1f, .seed = 99, .offset = 5, .quick = 1},
    {.name = "dropout 0.1 causal tl", .d = 128, .hq = 2, .sq = 300, .sk = 300, .order = ORDER_BHSD,
     .mask = FG_MASK_CAUSAL, .align = FG_ALIGN_TOP_LEFT, .dropout_p = 0.1f, .seed = 3,
     .offset = 1ull << 40},
    {.name = "dropout 0.1 gqa", .d = 64, .batch = 2, .hq = 4, .hkv = 2, .sq = 150, .sk = 200,
     .dropout_p = 0.1f, .seed = 11, .offset = 77},
    {.name = "dropout 0.1 window", .d = 64, .hq = 2, .sq = 300, .sk = 400, .mask = FG_MASK_WINDOW,
     .wl = 50, .wr = 10, .dropout_p = 0.1f, .seed = 5, .offset = 9},
    {.name = "dropout 0.1 bf16", .dtype = FG_BF16, .d = 64, .hq = 2, .sq = 200, .sk = 200,
     .order = ORDER_BHSD, .dropout_p = 0.1f, .seed = 1, .offset = 2},
};

#define LAYOUT(nm, dd, bq, bk, per_head)                                                        \
    .name = nm, .d = dd, .sparsity = FG_SPARSE_LAYOUT, .block_q = bq, .block_k = bk,             \
    .per_head_layout = per_head
#define BUTTERFLY(nm, f)                                                                        \
    .name = nm, .d = 64, .sparsity = FG_SPARSE_BUTTERFLY, .block_q = 64, .block_k = 64,          \
    .factors = f
static const struct fwd_case sparse_cases[] = {
    {LAYOUT("layout 64 per head", 64, 64, 64, 1), .batch = 2, .hq = 2, .sq = 300, .sk = 300,
     .quick = 1},
    {LAYOUT("layout 64 shared gqa", 64, 64, 64, 0), .hq = 4, .hkv = 2, .sq = 200, .sk = 400,
     .order = ORDER_BHSD},
    {LAYOUT("layout 128 per head", 64, 128, 128, 1), .hq = 3, .sq = 300, .sk = 500},
    {LAYOUT("layout 128 shared", 128, 128, 128, 0), .batch = 2, .hq = 2, .sq = 400, .sk = 257,
     .order = ORDER_BHSD},
    {LAYOUT("layout 64x128", 64, 64, 128, 1), .hq = 2, .sq = 250, .sk = 600},
    {LAYOUT("layout 64 causal", 64, 64, 64, 1), .hq = 2, .sq = 300, .sk = 300,
     .mask = FG_MASK_CAUSAL},
    {BUTTERFLY("butterfly 0", 0), .hq = 2, .sq = 520, .sk = 520},
    {BUTTERFLY("butterfly 2", 2), .batch = 2, .hq = 2, .sq = 520, .sk = 520, .order = ORDER_BHSD},
    {BUTTERFLY("butterfly 3", 3), .hq = 2, .sq = 300, .sk = 520},
    {BUTTERFLY("butterfly 2 causal", 2), .hq = 2, .sq = 520, .sk = 520, .mask = FG_MASK_CAUSAL,
     .quick = 1},
    {BUTTERFLY("butterfly 3 causal tl", 3), .hq = 2, .sq = 520, .sk = 300,
     .mask = FG_MASK_CAUSAL, .align = FG_ALIGN_TOP_LEFT},
};

static void add_table(const struct fwd_case *t, size_t n) {
    for (size_t i = 0; i < n; i++) add(t[i]);
}
#define ADD_TABLE(t) add_table(t, sizeof t / sizeof t[0])

static void build_cases(void) {
    add_head_dim_cases();
    ADD_TABLE(length_cases);
    ADD_TABLE(gqa_cases);
    add_causal_cases();
    ADD_TABLE(window_cases);
    ADD_TABLE(dropout_cases);
    ADD_TABLE(sparse_cases);
}

/* ---- main --------------------------------------------------------------------------- */

/* The library retains the device's primary context; the test allocates in
 * the same one. */
static int open_device(CUdevice *dev, CUcontext *cuctx) {
    char err[256];
    cu = cuda_driver_load(err, sizeof err);
    CHECK(cu != NULL, "cuda_driver_load: %s", err);
    if (!cu) return 0;
    const char *env = getenv("FLASHGEN_DEVICE");
    int ordinal = env && *env ? atoi(env) : 0;
    return cu_ok(cu->cuDeviceGet(dev, ordinal), "cuDeviceGet") &&
           cu_ok(cu->cuDevicePrimaryCtxRetain(cuctx, *dev), "cuDevicePrimaryCtxRetain") &&
           cu_ok(cu->cuCtxSetCurrent(*cuctx), "cuCtxSetCurrent");
}

int main(int argc, char **argv) {
    int quick = 0;
    const char *filter = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) quick = 1;
        else if (argv[i][0] != '-') filter = argv[i];
        else {
            fprintf(stderr, "usage: %s [--quick] [name-filter]\n", argv[0]);
            return 2;
        }
    }
    fg_context *ctx = NULL;
    fg_status st = fg_context_create(&ctx, NULL);
    if (st == FG_ERR_NO_DEVICE) {
        char why[1024];
        snprintf(why, sizeof why, "no CUDA device: %s", fg_last_message());
        check_skip(why);
    }
    CHECK(st == FG_OK, "fg_context_create: %s: %s", fg_status_name(st), fg_last_message());
    if (st != FG_OK) return check_summary("gpu_forward");
    printf("device: %s\n", fg_context_target(ctx));

    CUdevice dev = 0;
    CUcontext cuctx = NULL;
    int opened = open_device(&dev, &cuctx);
    if (opened) {
        build_cases();
        double t0 = now_s();
        int ran = 0;
        for (int i = 0; i < case_count; i++) {
            if ((quick && !cases[i].quick) || (filter && !strstr(cases[i].name, filter))) continue;
            run_case(ctx, &cases[i], 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1));
            ran++;
        }
        if (dropout_probe_total)
            check_drop_rate("all dropout probes", dropout_probe_dropped, dropout_probe_total,
                            ref_dropout_threshold((double)0.3f));
        printf("%d cases in %.1f s\n", ran, now_s() - t0);
    }
    fg_context_destroy(ctx);
    if (cuctx) cu->cuDevicePrimaryCtxRelease(dev);
    return check_summary("gpu_forward");
}
