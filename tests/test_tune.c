/* The tuner without a GPU: the selection rule against scripted timers, the
 * sequence-length buckets, the candidate tilings on every named target, and
 * the kept choices (tuning.tsv) as a context reads them. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "flashgen.h"
#include "families/bwd_sm80.h"
#include "families/fwd_sm80.h"
#include "families/fwd_sm90a.h"
#include "gen/plan.h"
#include "gen/spec.h"
#include "runtime/runtime.h"
#include "tests/check.h"

/* ---- scripted timers ---- */

typedef struct script {
    double base[TUNE_MAX_CANDIDATES]; /* ms; < 0: the candidate fails */
    double noise;                     /* relative, uniform in +-noise */
    uint64_t state;
    int calls[TUNE_MAX_CANDIDATES];
    int order[512], n_order;          /* candidates in call order */
} script;

static double scripted(void *user, int i) {
    script *s = user;
    s->calls[i]++;
    if (s->n_order < 512) s->order[s->n_order++] = i;
    if (s->base[i] < 0) return -1.0;
    s->state = s->state * 6364136223846793005ull + 1442695040888963407ull;
    double u = (double)(s->state >> 11) / 9007199254740992.0; /* [0, 1) */
    return s->base[i] * (1.0 + s->noise * (2.0 * u - 1.0));
}

static int run_script(const double *base, int n, double noise, uint64_t seed, tune_outcome *out) {
    script s;
    memset(&s, 0, sizeof s);
    memcpy(s.base, base, sizeof(double) * (size_t)n);
    s.noise = noise;
    s.state = seed;
    if (tune_measure(n, scripted, &s, 3, 15, out) != 0) return -1;
    return out->chosen;
}

static void test_selection(void) {
    tune_outcome o;
    /* all alike within the noise: the derived plan, every time */
    const double alike[] = {1.0, 1.004, 0.997, 1.002};
    for (uint64_t seed = 1; seed <= 50; seed++)
        CHECK(run_script(alike, 4, 0.01, seed, &o) == 0, "seed %llu: noise picked %d",
              (unsigned long long)seed, o.chosen);
    /* one clearly faster: that one, every time */
    const double one[] = {1.0, 1.1, 0.9, 1.2};
    for (uint64_t seed = 1; seed <= 50; seed++)
        CHECK(run_script(one, 4, 0.01, seed, &o) == 2, "seed %llu: picked %d",
              (unsigned long long)seed, o.chosen);
    CHECK(o.median[2] < o.median[0] * (1 - o.spread), "the winner beats the spread");
    /* two equally fast: the earlier in the fixed order, whatever the noise */
    const double two[] = {1.0, 0.85, 1.05, 0.849};
    for (uint64_t seed = 1; seed <= 50; seed++)
        CHECK(run_script(two, 4, 0.01, seed, &o) == 1, "seed %llu: picked %d",
              (unsigned long long)seed, o.chosen);
    /* faster by less than the spread: a tie, so the derived plan */
    const double near[] = {1.0, 0.99};
    for (uint64_t seed = 1; seed <= 50; seed++)
        CHECK(run_script(near, 2, 0.04, seed, &o) == 0, "seed %llu: picked %d within the spread",
              (unsigned long long)seed, o.chosen);
    /* no noise at all: any real gain counts */
    CHECK(run_script(near, 2, 0.0, 1, &o) == 1 && o.spread == 0.0, "noiseless: %d", o.chosen);
    /* a failing candidate is never chosen, even if "fast" before failing */
    const double fails[] = {1.0, -1.0, 0.95};
    CHECK(run_script(fails, 3, 0.0, 1, &o) == 2 && o.failed[1] && !o.failed[2], "failure");
    /* the derived plan failing is an error */
    const double broken[] = {-1.0, 0.5};
    CHECK(run_script(broken, 2, 0.0, 1, &o) == -1, "a failing derived plan must fail the tuning");
    CHECK(tune_measure(0, scripted, NULL, 1, 1, &o) == -1, "no candidates");
    CHECK(tune_measure(TUNE_MAX_CANDIDATES + 1, scripted, NULL, 1, 1, &o) == -1, "too many");

    /* warm-up then interleaved rounds: 0,1,2,0,1,2,... */
    script s;
    memset(&s, 0, sizeof s);
    s.base[0] = s.base[1] = s.base[2] = 1.0;
    CHECK(tune_measure(3, scripted, &s, 2, 5, &o) == 0, "measure");
    CHECK(s.calls[0] == 7 && s.calls[1] == 7 && s.calls[2] == 7, "calls %d %d %d", s.calls[0],
          s.calls[1], s.calls[2]);
    int interleaved = 1;
    for (int k = 0; k < s.n_order; k++) interleaved &= s.order[k] == k % 3;
    CHECK(interleaved, "runs are not interleaved round by round");

    /* the rule alone */
    const double med[] = {1.0, 0.95, 0.90, 0.899};
    const int none_failed[4] = {0, 0, 0, 0}, two_failed[4] = {0, 0, 1, 0};
    CHECK(tune_select(4, med, none_failed, 0.02) == 2, "earliest within spread of the best");
    CHECK(tune_select(4, med, none_failed, 0.0) == 3, "no spread: the fastest");
    CHECK(tune_select(4, med, two_failed, 0.02) == 3, "failed ones skipped");
    CHECK(tune_select(4, med, none_failed, 0.2) == 0, "nothing beats a 20%% spread");
}

static void test_buckets(void) {
    static const int len[] = {1, 511, 512, 513, 1024, 1025, 16384, 16385, 1 << 30};
    static const int want[] = {512, 512, 512, 1024, 1024, 2048, 16384, 32768, 32768};
    for (size_t i = 0; i < sizeof len / sizeof len[0]; i++)
        CHECK(tune_bucket(len[i]) == want[i], "bucket of %d: %d", len[i], tune_bucket(len[i]));
}

/* The backward's candidates: the derived tiling first, each one plans as
 * itself and fits, sparse blocks divided. */
static void check_backward_candidates(const fg_spec *s, const fg_profile *prof, int sparse) {
    bwd_tiling a[TUNE_MAX_CANDIDATES];
    fg_bwd_plan derived, p;
    char err[256];
    int n = plan_backward_candidates(s, prof, a, TUNE_MAX_CANDIDATES - 1);
    CHECK(plan_backward(s, prof, &derived, err, sizeof err) == 0, "%s", err);
    bwd_tiling d;
    plan_backward_tiling_of(&derived, &d);
    CHECK(n >= 1 && memcmp(&a[0], &d, sizeof d) == 0, "%s d%d: derived tiling not first (%d)",
          prof->name, s->head_dim, n);
    for (int i = 0; i < n; i++) {
        int ok = plan_backward_tiling(s, prof, &a[i], &p, err, sizeof err) == 0;
        CHECK(ok && p.smem_bytes <= prof->smem_per_block && p.block_m == a[i].block_m &&
                  p.block_n == a[i].block_n && p.warps == a[i].warps && p.stages == a[i].stages &&
                  p.col_splits == a[i].col_splits,
              "%s d%d backward candidate %d: %s", prof->name, s->head_dim, i, ok ? "figures" : err);
        for (int j = 0; j < i; j++)
            CHECK(memcmp(&a[i], &a[j], sizeof a[i]) != 0, "%s: candidate %d repeats", prof->name, i);
        if (sparse)
            CHECK(64 % p.block_m == 0 && 32 % p.block_n == 0, "%s: backward tiles %dx%d", prof->name,
                  p.block_m, p.block_n);
    }
}

/* Every candidate plans and fits its target; the list is fixed; tilings
 * that do not divide sparse blocks are left out. */
/* fwd_sm90a's candidates on h100: a fixed list, each planned as named, the
 * derived tiling among them where it is a listed shape, and their text
 * ("fwd_sm90a:2,176,0") read back as the same tiling. */
static void check_sm90a_candidates(void) {
    const fg_profile *h100 = profile_named("h100");
    static const int dims[] = {8, 64, 96, 128, 200, 256};
    for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
        for (int variant = 0; variant < 3; variant++) {
            fg_spec in = fg_spec_default(dims[d], FG_BF16), s;
            char err[256];
            if (variant == 1) in.mask = FG_MASK_CAUSAL, in.dropout = 1;
            if (variant == 2) {
                in.sparsity = FG_SPARSE_BUTTERFLY, in.butterfly_factors = 2;
                in.sparse_block_q = in.sparse_block_k = 128;
            }
            CHECK(spec_canonicalize(&in, &s, err, sizeof err) == 0, "%s", err);
            family_tiling a[TUNE_MAX_CANDIDATES], b[TUNE_MAX_CANDIDATES];
            int n = fwd_sm90a_family.candidates(&s, h100, a, TUNE_MAX_CANDIDATES - 1);
            int m = fwd_sm90a_family.candidates(&s, h100, b, TUNE_MAX_CANDIDATES - 1);
            CHECK(n >= 1 && n == m && memcmp(a, b, sizeof(a[0]) * (size_t)n) == 0,
                  "sm90a d%d: %d candidates, not a fixed list", dims[d], n);
            for (int i = 0; i < n; i++) {
                family_plan p;
                family_tiling back;
                const kernel_family *f = NULL;
                char text[64];
                int ok = fwd_sm90a_family.plan_tiling(&s, h100, &a[i], &p, err, sizeof err) == 0;
                fwd_sm90a_family.tiling_of(&p, &back);
                CHECK(ok && memcmp(&back, &a[i], sizeof back) == 0, "sm90a d%d candidate %d: %s",
                      dims[d], i, ok ? "tiling_of differs" : err);
                family_choice_format(&fwd_sm90a_family, &a[i], text, sizeof text);
                CHECK(strncmp(text, "fwd_sm90a:", 10) == 0 &&
                          family_choice_parse(text, &f, &back) == 0 && f == &fwd_sm90a_family &&
                          memcmp(&back, &a[i], sizeof back) == 0,
                      "sm90a tiling text %s", text);
                const fwd_sm90a_plan *x = (const fwd_sm90a_plan *)p.bytes;
                if (variant == 2)
                    CHECK(128 % x->block_m == 0 && 128 % x->block_n == 0, "sm90a tiles %dx%d",
                          x->block_m, x->block_n);
            }
        }
    family_tiling t;
    const kernel_family *f;
    CHECK(family_choice_parse("fwd_sm90a:2,128", &f, &t) != 0, "three numbers");
    fwd_sm90a_tiling odd = {2, 120, 0};
    family_tiling_pack(&t, &odd, sizeof odd);
    family_plan p;
    char err[256] = "";
    fg_spec s = fg_spec_default(128, FG_BF16);
    CHECK(fwd_sm90a_family.plan_tiling(&s, h100, &t, &p, err, sizeof err) != 0 &&
              strstr(err, "steps of 16"),
          "Bc 120 refused: %s", err);
}

static void test_candidates(void) {
    char err0[256] = "";
    static const int dims[] = {8, 64, 96, 128, 256};
    for (int t = 0; t < profile_named_count(); t++) {
        const fg_profile *prof = profile_named_at(t);
        for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
            for (int variant = 0; variant < 3; variant++) {
                fg_spec in = fg_spec_default(dims[d], FG_FP16), s;
                char err[256];
                if (variant == 1) in.mask = FG_MASK_CAUSAL, in.dropout = 1;
                if (variant == 2) {
                    in.sparsity = FG_SPARSE_LAYOUT;
                    in.sparse_block_q = 64, in.sparse_block_k = 32;
                }
                CHECK(spec_canonicalize(&in, &s, err, sizeof err) == 0, "%s", err);
                check_backward_candidates(&s, prof, variant == 2);
                fwd_tiling a[TUNE_MAX_CANDIDATES], b[TUNE_MAX_CANDIDATES];
                int n = plan_forward_candidates(&s, prof, a, TUNE_MAX_CANDIDATES - 1);
                int m = plan_forward_candidates(&s, prof, b, TUNE_MAX_CANDIDATES - 1);
                CHECK(n >= 1 && n == m && memcmp(a, b, sizeof(a[0]) * (size_t)n) == 0,
                      "%s d%d: %d candidates, not a fixed list", prof->name, dims[d], n);
                for (int i = 0; i < n; i++) {
                    fg_fwd_plan p;
                    int ok = plan_forward_tiling(&s, prof, &a[i], &p, err, sizeof err) == 0;
                    CHECK(ok && p.smem_bytes <= prof->smem_per_block &&
                              p.block_m == 16 * a[i].m_tiles * a[i].warps &&
                              p.block_n == a[i].block_n,
                          "%s d%d candidate %d: %s", prof->name, dims[d], i, ok ? "figures" : err);
                    if (variant == 2)
                        CHECK(64 % p.block_m == 0 && 32 % p.block_n == 0,
                              "%s: tiles %dx%d do not divide 64x32", prof->name, p.block_m,
                              p.block_n);
                }
            }
    }
    check_sm90a_candidates();
    /* and a tiling that cannot fit is refused with a reason */
    fg_spec s = fg_spec_default(256, FG_FP16);
    fg_bwd_plan bp;
    bwd_tiling huge = {128, 128, 1, 2, 1};
    CHECK(plan_backward_tiling(&s, profile_named("t4"), &huge, &bp, err0, sizeof err0) == -1 &&
              strstr(err0, "does not fit"),
          "oversized backward tiling: %s", err0);
    fwd_tiling big = {2, 8, 128};
    fg_fwd_plan p;
    char err[256] = "";
    CHECK(plan_forward_tiling(&s, profile_named("t4"), &big, &p, err, sizeof err) == -1 &&
              strstr(err, "tiles"),
          "oversized tiling: %s", err);
}

/* ---- kept choices ---- */

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void test_kept_choices(const char *dir) {
    char path[1024], nvrtc[32] = "none", text[2048];
    int major = 0, minor = 0;
    char err[256];
    if (nvrtc_lib_load(err, sizeof err) == 0 && nvrtc_lib_version(&major, &minor) == 0)
        snprintf(nvrtc, sizeof nvrtc, "%d.%d", major, minor);
    /* an offline context is GPU "h100", arch 90, driver 0; choices are
     * "family:tiling" in the family's own format */
    snprintf(text, sizeof text,
             "h100\t90\t0\t%s\tforward\tbf16_d128\t4096\tfwd_sm80:2,4,32\tfwd_sm80:1,8,128\t1.5\t1.2\t0.01\n"
             "h100\t90\t0\t%s\tforward\tbf16_d128\t8192\tfwd_sm80:1,8,128\tfwd_sm80:1,8,128\t3.0\t3.0\t0.01\n"
             "A100-SXM4-80GB\t80\t12040\t%s\tforward\tbf16_d128\t2048\tfwd_sm80:1,8,64\tfwd_sm80:2,4,64\t1\t0.5\t0\n"
             "h100\t90\t0\t0.0\tforward\tbf16_d128\t2048\tfwd_sm80:1,8,64\tfwd_sm80:2,4,64\t1\t0.5\t0\n"
             "h100\t90\t0\t%s\tforward\tbf16_d128\tbroken line\n"
             "h100\t90\t0\t%s\tforward\tbf16_d64\t1024\tfwd_sm80:1,4,32\tfwd_sm80:2,4,64\t1\t0.8\t0.02\textra\n"
             "h100\t90\t0\t%s\t0\tbf16_d64\t2048\t1,4,32\t2,4,64\t1\t0.8\t0.02\n"
             "h100\t90\t0\t%s\tforward\tbf16_d64\t8192\tnope_sm80:1,4,32\tfwd_sm80:2,4,64\t1\t0.8\t0.02\n"
             "h100\t90\t0\t%s\tbackward\tbf16_d128\t4096\tbwd_sm80:64,64,4,2,1\tbwd_sm80:64,128,8,2,1\t2.0\t1.6\t0.01\n"
             "h100\t90\t0\t%s\tbackward\tbf16_d64\t4096\tbwd_sm80:2,4,32\tbwd_sm80:64,128,8,2,1\t2.0\t1.6\t0.01\n"
             "h100\t90\t0\t%s\tbackward\tbf16_d64\t1024\tfwd_sm80:2,4,32\tbwd_sm80:64,128,8,2,1\t2.0\t1.6\t0.01\n",
             nvrtc, nvrtc, nvrtc, nvrtc, nvrtc, nvrtc, nvrtc, nvrtc, nvrtc, nvrtc);
    snprintf(path, sizeof path, "%s/tuning.tsv", dir);
    write_file(path, text);

    fg_context *ctx = NULL;
    CHECK(fg_context_create(&ctx, "h100") == FG_OK, "context: %s", fg_last_message());
    if (!ctx) return;
    fg_spec s = fg_spec_default(128, FG_BF16);
    fg_tune_report r;
    int found = -1;
    CHECK(fg_tuned(ctx, &s, FG_PASS_FORWARD, 3000, &r, &found) == FG_OK && found == 1,
          "the 4096 bucket: %s", fg_context_message(ctx));
    CHECK(r.seqlen_bucket == 4096 && !r.chosen_is_derived && r.chosen.block_m == 128 &&
              r.chosen.block_n == 32 && r.chosen.warps == 4 && r.derived.block_m == 128 &&
              r.derived.block_n == 128 && r.derived.warps == 8 && r.derived_ms == 1.5 &&
              r.chosen_ms == 1.2,
          "report: chosen %dx%d w%d", r.chosen.block_m, r.chosen.block_n, r.chosen.warps);
    fg_spec canon;
    spec_canonicalize(&s, &canon, err, sizeof err);
    const tune_choice *t = tune_lookup(ctx, FG_PASS_FORWARD, &canon, 4096);
    fwd_tiling ft = {0, 0, 0};
    if (t) memcpy(&ft, &t->tiling, sizeof ft);
    CHECK(t && t->family == &fwd_sm80_family && ft.m_tiles == 2 && ft.warps == 4 &&
              ft.block_n == 32,
          "lookup in the bucket");
    CHECK(tune_lookup(ctx, FG_PASS_FORWARD, &canon, 8000) == NULL, "a derived choice means the derived plan");
    CHECK(tune_lookup(ctx, FG_PASS_FORWARD, &canon, 2048) == NULL, "other GPUs' and NVRTCs' lines are not read");
    CHECK(fg_tuned(ctx, &s, FG_PASS_FORWARD, 2000, &r, &found) == FG_OK && found == 0,
          "nothing tuned for 2048 on this GPU");
    fg_spec d64 = fg_spec_default(64, FG_BF16);
    CHECK(fg_tuned(ctx, &d64, FG_PASS_FORWARD, 1024, &r, &found) == FG_OK && found == 0,
          "a line with an extra field is not read");
    CHECK(fg_tuned(ctx, &d64, FG_PASS_FORWARD, 2048, &r, &found) == FG_OK && found == 0,
          "a line of the earlier format (pass as a number, bare tilings) is not read");
    CHECK(fg_tuned(ctx, &d64, FG_PASS_FORWARD, 8192, &r, &found) == FG_OK && found == 0,
          "a line naming an unknown family is not read");
    fg_context_set_tuning(ctx, 0);
    CHECK(tune_lookup(ctx, FG_PASS_FORWARD, &canon, 4096) == NULL, "tuning off: the derived plan");
    fg_context_set_tuning(ctx, 1);
    CHECK(tune_lookup(ctx, FG_PASS_FORWARD, &canon, 4096) != NULL, "tuning back on");

    /* the backward's lines: their own tiling format, per pass */
    CHECK(fg_tuned(ctx, &s, FG_PASS_BACKWARD, 4096, &r, &found) == FG_OK && found == 1,
          "the backward's 4096 bucket: %s", fg_context_message(ctx));
    CHECK(!r.chosen_is_derived && r.chosen.block_m == 64 && r.chosen.block_n == 64 &&
              r.chosen.warps == 4 && r.chosen.stages == 2 && r.derived.block_n == 128 &&
              r.derived.warps == 8 && r.chosen_ms == 1.6,
          "backward report: chosen %dx%d w%d", r.chosen.block_m, r.chosen.block_n, r.chosen.warps);
    t = tune_lookup(ctx, FG_PASS_BACKWARD, &canon, 4096);
    bwd_tiling bt = {0, 0, 0, 0, 0};
    if (t) memcpy(&bt, &t->tiling, sizeof bt);
    CHECK(t && t->family == &bwd_sm80_family && bt.block_m == 64 && bt.block_n == 64 &&
              bt.warps == 4 && bt.stages == 2 && bt.col_splits == 1,
          "backward lookup");
    CHECK(fg_tuned(ctx, &d64, FG_PASS_BACKWARD, 4096, &r, &found) == FG_OK && found == 0,
          "a backward line with a forward tiling is not read");
    CHECK(fg_tuned(ctx, &d64, FG_PASS_BACKWARD, 1024, &r, &found) == FG_OK && found == 0,
          "a backward line choosing a forward family is not read");

    /* the API's refusals */
    CHECK(fg_tune(ctx, &s, FG_PASS_FORWARD, 1024, &r) == FG_ERR_NO_DEVICE, "offline: %s",
          fg_context_message(ctx));
    CHECK(fg_tune(ctx, &s, FG_PASS_BACKWARD, 1024, &r) == FG_ERR_NO_DEVICE, "backward offline: %s",
          fg_context_message(ctx));
    CHECK(fg_tune(ctx, &s, (fg_pass)7, 1024, &r) == FG_ERR_INVALID_ARGUMENT &&
              strstr(fg_context_message(ctx), "pass"),
          "bad pass: %s", fg_context_message(ctx));
    CHECK(fg_tuned(ctx, &s, FG_PASS_FORWARD, 1024, NULL, &found) == FG_ERR_INVALID_ARGUMENT,
          "NULL report");
    CHECK(fg_tune(NULL, &s, FG_PASS_FORWARD, 1024, &r) == FG_ERR_INVALID_ARGUMENT, "NULL ctx");
    fg_context_destroy(ctx);

    /* FLASHGEN_TUNING=off at creation */
    setenv("FLASHGEN_TUNING", "off", 1);
    CHECK(fg_context_create(&ctx, "h100") == FG_OK, "context");
    CHECK(ctx && tune_lookup(ctx, FG_PASS_FORWARD, &canon, 4096) == NULL, "FLASHGEN_TUNING=off");
    CHECK(ctx && fg_tuned(ctx, &s, FG_PASS_FORWARD, 3000, &r, &found) == FG_OK && found == 1,
          "the choice is still shown");
    fg_context_destroy(ctx);
    unsetenv("FLASHGEN_TUNING");
}

int main(void) {
    test_selection();
    test_buckets();
    test_candidates();
    char dir[] = "/tmp/flashgen-tune-XXXXXX";
    if (mkdtemp(dir)) {
        setenv("FLASHGEN_CACHE_DIR", dir, 1);
        test_kept_choices(dir);
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        CHECK(system(cmd) == 0, "cleanup");
    } else {
        CHECK(0, "mkdtemp failed");
    }
    return check_summary("test_tune");
}
