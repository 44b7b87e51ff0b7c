/* Shared by the GPU tests: see gpu_common.h. */
#include "tests/gpu_common.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "reference/reference.h"
#include "tests/gpu_cases.h"

/* ---- checks ------------------------------------------------------------------ */

static int own_passed, own_failed; /* until a test attaches its counters */
static int *passed_count = &own_passed, *failed_count = &own_failed;

void gpu_checks_attach(int *passed, int *failed) {
    passed_count = passed;
    failed_count = failed;
}

void gpu_check_pass(void) { (*passed_count)++; }

void gpu_check_fail(const char *file, int line, const char *cond, const char *fmt, ...) {
    (*failed_count)++;
    fprintf(stderr, "FAIL %s:%d: %s: ", file, line, cond);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* ---- small utilities ---------------------------------------------------------- */

static uint64_t rng_state;

void rng_seed(uint64_t seed) { rng_state = seed; }

uint64_t rng_next(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double rng_unit(void) { return (double)((rng_next() >> 11) + 1) * 0x1p-53; } /* (0, 1] */

float rng_normal(void) { /* Box-Muller */
    return (float)(sqrt(-2.0 * log(rng_unit())) * cos(6.283185307179586 * rng_unit()));
}

double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

uint16_t to_storage(float x, fg_dtype dt) {
    return dt == FG_BF16 ? ref_float_to_bf16(x) : ref_float_to_half(x);
}

float from_storage(uint16_t x, fg_dtype dt) {
    return dt == FG_BF16 ? ref_bf16_to_float(x) : ref_half_to_float(x);
}

int gpu_parse_args(int argc, char **argv, int *quick, const char **filter) {
    *quick = 0;
    *filter = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) *quick = 1;
        else if (argv[i][0] != '-') *filter = argv[i];
        else {
            fprintf(stderr, "usage: %s [--quick] [name-filter]\n", argv[0]);
            return 0;
        }
    }
    return 1;
}

/* ---- the device ------------------------------------------------------------------ */

const cuda_driver *gpu_cu;

int cu_ok(CUresult r, const char *what) {
    const char *text = NULL;
    if (r != CUDA_SUCCESS) gpu_cu->cuGetErrorString(r, &text);
    GPU_CHECK(r == CUDA_SUCCESS, "%s: %s", what, text ? text : "unknown CUDA error");
    return r == CUDA_SUCCESS;
}

int open_device(CUdevice *dev, CUcontext *cuctx) {
    char err[256];
    gpu_cu = cuda_driver_load(err, sizeof err);
    GPU_CHECK(gpu_cu != NULL, "cuda_driver_load: %s", err);
    if (!gpu_cu) return 0;
    const char *env = getenv("FLASHGEN_DEVICE");
    int ordinal = env && *env ? atoi(env) : 0;
    return cu_ok(gpu_cu->cuDeviceGet(dev, ordinal), "cuDeviceGet") &&
           cu_ok(gpu_cu->cuDevicePrimaryCtxRetain(cuctx, *dev), "cuDevicePrimaryCtxRetain") &&
           cu_ok(gpu_cu->cuCtxSetCurrent(*cuctx), "cuCtxSetCurrent");
}

fg_context *gpu_test_open(CUdevice *dev, CUcontext *cuctx) {
    fg_context *ctx = NULL;
    fg_status st = fg_context_create(&ctx, NULL);
    if (st == FG_ERR_NO_DEVICE) { /* as check_skip: ctest's SKIP_RETURN_CODE */
        printf("SKIPPED: no CUDA device: %s\n", fg_last_message());
        exit(77);
    }
    GPU_CHECK(st == FG_OK, "fg_context_create: %s: %s", fg_status_name(st), fg_last_message());
    if (st != FG_OK) return NULL;
    printf("device: %s\n", fg_context_target(ctx));
    if (!open_device(dev, cuctx)) {
        fg_context_destroy(ctx);
        return NULL;
    }
    return ctx;
}

void gpu_test_close(fg_context *ctx, CUdevice dev, CUcontext cuctx) {
    fg_context_destroy(ctx);
    if (cuctx) gpu_cu->cuDevicePrimaryCtxRelease(dev);
}

/* ---- device tensors -------------------------------------------------------------- */

fg_tensor make_strides(int order, int pad, int seq, int heads, int dim) {
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

size_t tensor_index(const struct dev_tensor *x, int b, int s, int h, int d) {
    return (size_t)(LEAD + b * x->t.stride_batch + s * x->t.stride_seq + h * x->t.stride_head + d);
}

int dev_tensor_alloc(struct dev_tensor *x, int order, int pad, int batch, int seq, int heads,
                     int dim) {
    memset(x, 0, sizeof *x);
    x->t = make_strides(order, pad, seq, heads, dim);
    x->batch = batch, x->seq = seq, x->heads = heads, x->dim = dim;
    x->elems = tensor_index(x, batch - 1, seq - 1, heads - 1, dim - 1) + 1 + GUARD;
    x->host = malloc(x->elems * sizeof *x->host);
    GPU_CHECK(x->host != NULL, "out of host memory");
    if (!x->host || !cu_ok(gpu_cu->cuMemAlloc(&x->base, x->elems * 2), "cuMemAlloc")) return 0;
    x->t.data = (void *)(uintptr_t)(x->base + LEAD * 2);
    for (size_t n = 0; n < x->elems; n++) x->host[n] = POISON16;
    return 1;
}

void dev_tensor_free(struct dev_tensor *x) {
    if (x->base) gpu_cu->cuMemFree(x->base);
    free(x->host);
    memset(x, 0, sizeof *x);
}

int dev_tensor_poison(struct dev_tensor *x, const char *what) {
    return cu_ok(gpu_cu->cuMemsetD8(x->base, 0xFF, x->elems * 2), what);
}

int dev_tensor_upload(struct dev_tensor *x, const float *src, fg_dtype dt) {
    size_t n = 0;
    for (int b = 0; b < x->batch; b++)
        for (int h = 0; h < x->heads; h++)
            for (int s = 0; s < x->seq; s++)
                for (int d = 0; d < x->dim; d++)
                    x->host[tensor_index(x, b, s, h, d)] = to_storage(src[n++], dt);
    return cu_ok(gpu_cu->cuMemcpyHtoD(x->base, x->host, x->elems * 2), "upload");
}

int dev_tensor_take(struct dev_tensor *x, double *dst, fg_dtype dt, const char *name) {
    if (!cu_ok(gpu_cu->cuMemcpyDtoH(x->host, x->base, x->elems * 2), "download")) return 0;
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
    GPU_CHECK(nonfinite == 0, "%s: %zu output elements not finite or not written (first at %zu)",
              name, nonfinite, first_bad);
    GPU_CHECK(stray == 0, "%s: %zu elements written outside the output (first at offset %lld)",
              name, stray, (long long)first_stray - LEAD);
    return 1;
}

int dev_tensor_pull(struct dev_tensor *x, const char *what) {
    return cu_ok(gpu_cu->cuMemcpyDtoH(x->host, x->base, x->elems * 2), what);
}

int dev_tensor_unchanged(const struct dev_tensor *x, const char *name) {
    uint16_t *now = malloc(x->elems * sizeof *now);
    GPU_CHECK(now != NULL, "out of host memory");
    if (!now) return 0;
    int ok = cu_ok(gpu_cu->cuMemcpyDtoH(now, x->base, x->elems * 2), "download");
    if (ok) {
        size_t changed = 0, first = 0;
        for (size_t k = 0; k < x->elems; k++)
            if (now[k] != x->host[k] && changed++ == 0) first = k;
        GPU_CHECK(changed == 0, "%s: %zu elements changed (first at offset %lld)", name, changed,
                  (long long)first - LEAD);
    }
    free(now);
    return ok;
}

/* ---- inputs ---------------------------------------------------------------------- */

void random_fill(float *x, size_t n, fg_dtype dt) {
    for (size_t i = 0; i < n; i++) x[i] = ref_round(rng_normal(), dt);
}

/* Q = 0 makes every visible key equally likely; V[j][d] = 1 iff d == j mod D,
 * so O[i][d] is nonzero iff the one visible key j == d (mod D) was kept. */
static void probe_fill(const struct gpu_case *c, struct inputs *in) {
    memset(in->q, 0, in->nq * sizeof *in->q);
    random_fill(in->k, in->nk, c->dtype);
    for (size_t row = 0; row < in->nk / (size_t)c->d; row++) {
        int j = (int)(row % (size_t)c->sk);
        for (int d = 0; d < c->d; d++) in->v[row * c->d + d] = d == j % c->d ? 1.0f : 0.0f;
    }
}

int inputs_make(const struct gpu_case *c, struct inputs *in) {
    memset(in, 0, sizeof *in);
    in->nq = (size_t)c->batch * c->hq * c->sq * c->d;
    in->nk = (size_t)c->batch * c->hkv * c->sk * c->d;
    in->q = malloc(in->nq * sizeof(float));
    in->k = malloc(in->nk * sizeof(float));
    in->v = malloc(in->nk * sizeof(float));
    GPU_CHECK(in->q && in->k && in->v, "out of host memory");
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

int inputs_add_d_o(const struct gpu_case *c, struct inputs *in) {
    in->d_o = malloc(in->nq * sizeof(float));
    GPU_CHECK(in->d_o != NULL, "out of host memory");
    if (!in->d_o) return 0;
    random_fill(in->d_o, in->nq, c->dtype);
    return 1;
}

void inputs_free(struct inputs *in) {
    free(in->q);
    free(in->k);
    free(in->v);
    free(in->d_o);
    memset(in, 0, sizeof *in);
}

/* ---- tuning ------------------------------------------------------------------------ */

int gpu_tune_case(fg_context *ctx, const char *name, fg_pass pass) {
    const int i = case_index(name);
    GPU_CHECK(i >= 0, "no case named %s to tune", name);
    if (i < 0) return -1;
    const fg_spec s = case_spec(&gpu_cases[i]);
    const int seqlen = gpu_cases[i].sk;
    fg_tune_report r, kept;
    int found = 0;
    fg_status st = fg_tune(ctx, &s, pass, seqlen, &r);
    GPU_CHECK(st == FG_OK, "%s: fg_tune: %s", name, fg_context_message(ctx));
    if (st != FG_OK) return -1;
    printf("tuned %-9s %-24s bucket %5d: derived %dx%d w%d %.3f ms, chosen %dx%d w%d %.3f ms, "
           "spread %.2f%%, %d timed\n",
           pass == FG_PASS_BACKWARD ? "backward" : "forward", name, r.seqlen_bucket,
           r.derived.block_m, r.derived.block_n, r.derived.warps, r.derived_ms, r.chosen.block_m,
           r.chosen.block_n, r.chosen.warps, r.chosen_ms, 100 * r.spread, r.candidates);
    GPU_CHECK(r.candidates >= 1 && r.derived_ms > 0 && r.chosen_ms > 0, "%s: report", name);
    GPU_CHECK(r.chosen_is_derived || r.chosen_ms < r.derived_ms * (1 - r.spread),
              "%s: a tiling was chosen without beating the derived plan by the spread", name);
    GPU_CHECK(fg_tuned(ctx, &s, pass, seqlen, &kept, &found) == FG_OK && found &&
                  kept.chosen.block_m == r.chosen.block_m &&
                  kept.chosen.block_n == r.chosen.block_n && kept.chosen.warps == r.chosen.warps,
              "%s: the choice is not kept", name);
    return i;
}
