/* Shared by the GPU tests: see gpu_common.h. */
#include "tests/gpu_common.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness/message.h"
#include "harness/timing.h"
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

static int shard_index = 0, shard_count = 1;

int gpu_parse_args(int argc, char **argv, int *quick, const char **filter) {
    *quick = 0;
    *filter = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) *quick = 1;
        else if (strcmp(argv[i], "--shard") == 0 && i + 1 < argc &&
                 sscanf(argv[i + 1], "%d/%d", &shard_index, &shard_count) == 2 &&
                 shard_count > 0 && shard_index >= 0 && shard_index < shard_count)
            i++;
        else if (argv[i][0] != '-') *filter = argv[i];
        else {
            fprintf(stderr, "usage: %s [--quick] [--shard I/N] [name-filter]\n", argv[0]);
            return 0;
        }
    }
    return 1;
}

int gpu_in_shard(int i) { return i % shard_count == shard_index; }

/* ---- the device ------------------------------------------------------------------ */

fgh_device gpu_dev;

int gpu_ok(int ok, const char *what) {
    GPU_CHECK(ok, "%s: %s", what, fgh_message());
    return ok;
}

fg_context *gpu_test_open(void) {
    fg_context *ctx = NULL;
    fg_status st = fg_context_create(&ctx, NULL);
    if (st == FG_ERR_NO_DEVICE) { /* as check_skip: ctest's SKIP_RETURN_CODE */
        printf("SKIPPED: no CUDA device: %s\n", fg_last_message());
        exit(77);
    }
    GPU_CHECK(st == FG_OK, "fg_context_create: %s: %s", fg_status_name(st), fg_last_message());
    if (st != FG_OK) return NULL;
    printf("device: %s\n", fg_context_target(ctx));
    if (!gpu_ok(fgh_device_open(&gpu_dev), "the device")) {
        fg_context_destroy(ctx);
        return NULL;
    }
    return ctx;
}

void gpu_test_close(fg_context *ctx) {
    fg_context_destroy(ctx);
    fgh_device_close(&gpu_dev);
}

int gpu_run_suite(int argc, char **argv, const gpu_suite *s) {
    int quick = 0;
    const char *filter = NULL;
    if (!gpu_parse_args(argc, argv, &quick, &filter)) return 0;
    fg_context *ctx = gpu_test_open();
    if (ctx) {
        double t0 = fgh_now_s();
        int ran = 0;
        for (int i = 0; i < s->count; i++) {
            if ((quick && !s->quick(i)) || (filter && !strstr(s->name(i), filter)) ||
                !gpu_in_shard(i))
                continue;
            s->run(ctx, i);
            ran++;
        }
        if (!quick && (!filter || strstr(s->last_name, filter)) && gpu_in_shard(0)) s->last(ctx);
        printf("%d cases in %.1f s\n", ran, fgh_now_s() - t0);
    }
    gpu_test_close(ctx);
    return 1;
}

fg_context *gpu_debug_context(void) {
    setenv("FLASHGEN_DEBUG", "1", 1);
    fg_context *dbg = NULL;
    GPU_CHECK(fg_context_create(&dbg, NULL) == FG_OK, "debug context: %s", fg_last_message());
    unsetenv("FLASHGEN_DEBUG");
    return dbg;
}

void gpu_expect_refused(fg_context *ctx, const fg_spec *spec, fg_forward_args a, const char *what,
                        const char *arg) {
    fg_status st = fg_forward(ctx, spec, &a);
    const char *msg = fg_context_message(ctx);
    GPU_CHECK(st == FG_ERR_INVALID_ARGUMENT && strstr(msg, arg) != NULL,
              "%s: %s (%s), expected a refusal naming %s", what, fg_status_name(st), msg, arg);
}

/* ---- device memory ------------------------------------------------------------- */

int gpu_take(fgh_tensor *x, double *dst, fg_dtype dt, const char *name) {
    fgh_written w;
    if (!gpu_ok(fgh_tensor_take(&gpu_dev, x, dst, dt, &w), name)) return 0;
    GPU_CHECK(w.nonfinite == 0, "%s: %zu output elements not finite or not written (first at %zu)",
              name, w.nonfinite, w.first_nonfinite);
    GPU_CHECK(w.stray == 0, "%s: %zu elements written outside the output (first at offset %lld)",
              name, w.stray, w.first_stray);
    return 1;
}

int gpu_unchanged(const fgh_buffer *b, const char *name) {
    size_t changed = 0, first = 0;
    if (!gpu_ok(fgh_buffer_changed(&gpu_dev, b, &changed, &first), name)) return 0;
    GPU_CHECK(changed == 0, "%s: %zu elements changed (first at offset %lld)", name, changed,
              (long long)first - (long long)b->lead);
    return 1;
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
