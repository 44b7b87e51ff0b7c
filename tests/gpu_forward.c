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
 * Then a tuning run: a few cases' specs are tuned for their sequence-length
 * bucket (fg_tune) and those cases run again, now with the tuned plans.
 *
 * usage: gpu_forward [--quick] [name-filter]
 * --quick runs about a dozen representative cases (for compute-sanitizer). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "flashgen.h"
#include "reference/reference.h"
#include "tests/check.h"
#include "tests/gpu_cases.h"
#include "tests/gpu_common.h"

#define ABS_FLOOR 1e-6
#define LSE_TOL 1e-3

/* ---- checks ------------------------------------------------------------------- */

struct lse_stats {
    size_t bad, bad_inf, zero_rows_bad;
    double worst;
};

/* LSE against the fp64 one, and O exactly 0 on rows with no visible key. */
static struct lse_stats compare_lse(const struct gpu_case *c, const float *lse, const double *ref_lse,
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
    double p = threshold / 256.0, rate = total ? (double)dropped / total : 0.0;
    double sigma = sqrt(p * (1.0 - p) / (double)(total ? total : 1));
    CHECK(total > 0 && fabs(rate - p) <= 5.0 * sigma,
          "%s: drop rate %.5f over %zu draws, expected %.5f +- 5 x %.5f", name, rate, total, p,
          sigma);
}

/* With probe inputs: O[i][d] != 0 exactly when the visible key j == d (mod D)
 * is kept by the CPU Philox stream, and then equals scale / (visible keys). */
static void check_dropout_probe(const struct gpu_case *c, const ref_problem *p, const double *o) {
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
    size_t bytes = (LEAD + rows + GUARD) * sizeof(float);
    if (!cu_ok(gpu_cu->cuMemcpyDtoH(host, dev, bytes), "download lse")) return 0;
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
static int launch_case(fg_context *ctx, const struct gpu_case *c, const struct inputs *in,
                       const fg_layout *layout, struct case_outputs *out) {
    struct dev_tensor q = {0}, k = {0}, v = {0}, o = {0};
    CUdeviceptr lse = 0;
    size_t rows = (size_t)c->batch * c->hq * c->sq;
    size_t lse_bytes = (LEAD + rows + GUARD) * sizeof(float);
    int ok = case_tensor_alloc(&q, c, c->sq, c->hq) && case_tensor_alloc(&k, c, c->sk, c->hkv) &&
             case_tensor_alloc(&v, c, c->sk, c->hkv) && case_tensor_alloc(&o, c, c->sq, c->hq) &&
             cu_ok(gpu_cu->cuMemAlloc(&lse, lse_bytes), "cuMemAlloc lse") &&
             dev_tensor_upload(&q, in->q, c->dtype) && dev_tensor_upload(&k, in->k, c->dtype) &&
             dev_tensor_upload(&v, in->v, c->dtype) &&
             dev_tensor_poison(&o, "poison o") &&
             cu_ok(gpu_cu->cuMemsetD8(lse, 0xFF, lse_bytes), "poison lse");
    if (ok) {
        fg_spec spec = case_spec(c);
        float *lse_arg = c->no_lse ? NULL : (float *)(uintptr_t)(lse + LEAD * sizeof(float));
        fg_forward_args a = case_forward_args(c, q.t, k.t, v.t, o.t, lse_arg, layout);
        fg_status st = fg_forward(ctx, &spec, &a);
        CHECK(st == FG_OK, "%s: fg_forward: %s: %s", c->name, fg_status_name(st),
              fg_context_message(ctx));
        ok = st == FG_OK && cu_ok(gpu_cu->cuCtxSynchronize(), "kernel") &&
             dev_tensor_take(&o, out->o, c->dtype, c->name) &&
             take_lse(lse, out->lse, rows, !c->no_lse, c->name);
    }
    dev_tensor_free(&q);
    dev_tensor_free(&k);
    dev_tensor_free(&v);
    dev_tensor_free(&o);
    if (lse) gpu_cu->cuMemFree(lse);
    return ok;
}

static void print_result(const struct gpu_case *c, double err, double bound,
                         const struct lse_stats *ls, double seconds, int pass) {
    printf("%-26s %s d%-3d B%d H%d/%d Sq%-5d Sk%-5d %s err %.3e bound %.3e lse %.1e %5.1fs %s\n",
           c->name, c->dtype == FG_BF16 ? "bf16" : "fp16", c->d, c->batch, c->hq, c->hkv, c->sq,
           c->sk, c->order == ORDER_BSHD ? "bshd" : "bhsd", err, bound, ls->worst, seconds,
           pass ? "PASS" : "FAIL");
    fflush(stdout);
}

static void run_case(fg_context *ctx, const struct gpu_case *c, uint64_t seed) {
    int failed_before = check_failed_count;
    double t0 = now_s();
    rng_seed(seed);
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

/* ---- tuning --------------------------------------------------------------------------- */

static void tune_and_rerun(fg_context *ctx) {
    static const char *const names[] = {"len 1000x1000", "len 255x1000", "dropout 0.1 causal tl",
                                        "butterfly 2 causal"};
    for (size_t n = 0; n < sizeof names / sizeof names[0]; n++) {
        const int i = gpu_tune_case(ctx, names[n], FG_PASS_FORWARD);
        if (i >= 0) run_case(ctx, &gpu_cases[i], case_seed(i) + 1);
    }
}

/* ---- main --------------------------------------------------------------------------- */

int main(int argc, char **argv) {
    gpu_checks_attach(&check_passed_count, &check_failed_count);
    int quick = 0;
    const char *filter = NULL;
    if (!gpu_parse_args(argc, argv, &quick, &filter)) return 2;
    CUdevice dev = 0;
    CUcontext cuctx = NULL;
    fg_context *ctx = gpu_test_open(&dev, &cuctx);
    if (ctx) {
        build_cases();
        double t0 = now_s();
        int ran = 0;
        for (int i = 0; i < gpu_case_count; i++) {
            if (!case_selected(&gpu_cases[i], quick, filter)) continue;
            run_case(ctx, &gpu_cases[i], case_seed(i));
            ran++;
        }
        if (!quick && (!filter || strcmp(filter, "tune") == 0)) tune_and_rerun(ctx);
        if (dropout_probe_total)
            check_drop_rate("all dropout probes", dropout_probe_dropped, dropout_probe_total,
                            ref_dropout_threshold((double)0.3f));
        printf("%d cases in %.1f s\n", ran, now_s() - t0);
    }
    gpu_test_close(ctx, dev, cuctx);
    return check_summary("gpu_forward");
}
