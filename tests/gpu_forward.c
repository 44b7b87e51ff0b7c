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
 * usage: gpu_forward [--quick] [--shard I/N] [name-filter]
 * --quick runs about a dozen representative cases (for compute-sanitizer). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "flashgen.h"
#include "harness/compare.h"
#include "harness/problem.h"
#include "harness/random.h"
#include "harness/timing.h"
#include "reference/reference.h"
#include "tests/check.h"
#include "tests/gpu_cases.h"
#include "tests/gpu_common.h"

/* ---- checks ------------------------------------------------------------------- */

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
                        kept = ref_dropout_keep(p->seed, p->offset, b, h, i + p->position_q,
                                                j + p->position_k, thr);
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

/* Uploads, launches and takes O into o (B,Hq,Sq,D) and lse into the problem's
 * mirror, checking that nothing around them (all of lse, when the call had
 * none) lost the poison. Returns 0 when the run itself failed. */
static int launch_case(fg_context *ctx, const struct gpu_case *c, fgh_problem *p, double *o) {
    if (!gpu_ok(fgh_problem_upload(&gpu_dev, p), c->name)) return 0;
    fg_forward_args a = fgh_forward_args(p, !c->no_lse);
    fg_status st = fg_forward(ctx, &p->spec, &a);
    CHECK(st == FG_OK, "%s: fg_forward: %s: %s", c->name, fg_status_name(st),
          fg_context_message(ctx));
    int ok = st == FG_OK && gpu_ok(fgh_cu(&gpu_dev, gpu_dev.cu->cuCtxSynchronize(), "kernel"),
                                   c->name) &&
             gpu_take(&p->o, o, c->dtype, c->name) &&
             gpu_ok(fgh_buffer_pull(&gpu_dev, &p->lse), "lse");
    if (ok) {
        size_t stray = fgh_buffer_zones_unpoisoned(&p->lse, c->no_lse);
        CHECK(stray == 0, "%s: %zu floats written outside lse", c->name, stray);
    }
    return ok;
}

static void print_result(const struct gpu_case *c, const fgh_forward_check *r, double seconds,
                         int pass) {
    printf("%-26s %s d%-3d dv%-3d B%d H%d/%d Sq%-5d Sk%-5d %s err %.3e bound %.3e lse %.1e %5.1fs %s\n",
           c->name, c->dtype == FG_BF16 ? "bf16" : "fp16", c->d, c->dv ? c->dv : c->d, c->batch, c->hq, c->hkv, c->sq,
           c->sk, c->order == FGH_BSHD ? "bshd" : "bhsd", r->err, r->bound, r->lse_worst, seconds,
           pass ? "PASS" : "FAIL");
    fflush(stdout);
}

static void run_case(fg_context *ctx, const struct gpu_case *c, uint64_t seed) {
    int failed_before = check_failed_count;
    double t0 = fgh_now_s();
    fgh_rng rng;
    fgh_rng_seed(&rng, seed);
    fgh_problem p;
    fgh_forward_check r = {.err = NAN, .bound = NAN, .lse_worst = NAN};
    double *o = NULL;
    int ok = case_problem_make(ctx, c, &rng, 0, &p);
    if (ok) {
        o = malloc(p.no * sizeof *o); /* o (B,Hq,Sq,Dv) */
        CHECK(o != NULL, "out of host memory");
        ok = o && launch_case(ctx, c, &p, o);
    }
    if (ok && gpu_ok(fgh_check_forward(&p, o, c->no_lse ? NULL : fgh_buffer_at(&p.lse, LEAD), &r),
                     c->name)) {
        CHECK(r.err <= r.bound, "%s: relative error %.3e exceeds %.3e", c->name, r.err, r.bound);
        CHECK(r.lse_bad == 0, "%s: %zu lse values off by more than %g (worst %g)", c->name,
              r.lse_bad, FGH_LSE_TOL, r.lse_worst);
        CHECK(r.lse_bad_inf == 0, "%s: %zu rows with no visible key have lse != -inf", c->name,
              r.lse_bad_inf);
        CHECK(r.zero_rows_bad == 0, "%s: %zu rows with no visible key have O != 0", c->name,
              r.zero_rows_bad);
        if (c->probe) {
            ref_problem rp = fgh_reference_problem(&p);
            check_dropout_probe(c, &rp, o);
        }
    }
    print_result(c, &r, fgh_now_s() - t0, ok && check_failed_count == failed_before);
    free(o);
    fgh_problem_free(&gpu_dev, &p);
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

/* The compile log, counted by family: which kernels ran (with a fresh cache,
 * every one compiles) and the calls a family handed to the next. */
static int compiled_sm90a, compiled_mma_sync, fallbacks;
static void count_compiles(const char *line, void *user) {
    (void)user;
    int sm90a = strstr(line, "compiled fg_fwd_sm90a_") != NULL;
    compiled_sm90a += sm90a;
    compiled_mma_sync += !sm90a && strstr(line, "compiled fg_fwd_") != NULL;
    if (strstr(line, "cannot take this call")) {
        fallbacks++;
        printf("  %s\n", line);
    }
}

int main(int argc, char **argv) {
    gpu_checks_attach(&check_passed_count, &check_failed_count);
    int quick = 0;
    const char *filter = NULL;
    if (!gpu_parse_args(argc, argv, &quick, &filter)) return 2;
    fg_context *ctx = gpu_test_open();
    if (ctx) {
        fg_context_set_compile_log(ctx, count_compiles, NULL);
        build_cases();
        double t0 = fgh_now_s();
        int ran = 0;
        for (int i = 0; i < gpu_case_count; i++) {
            if (!case_selected(&gpu_cases[i], quick, filter) || !gpu_in_shard(i)) continue;
            run_case(ctx, &gpu_cases[i], case_seed(i));
            ran++;
        }
        if (!quick && (!filter || strcmp(filter, "tune") == 0) && gpu_in_shard(0))
            tune_and_rerun(ctx);
        if (dropout_probe_total)
            check_drop_rate("all dropout probes", dropout_probe_dropped, dropout_probe_total,
                            ref_dropout_threshold((double)0.3f));
        printf("%d cases in %.1f s; forward kernels compiled: %d fwd_sm90a, %d fwd_sm80; %d "
               "fallback reasons\n", ran, fgh_now_s() - t0, compiled_sm90a, compiled_mma_sync,
               fallbacks);
    }
    gpu_test_close(ctx);
    return check_summary("gpu_forward");
}
