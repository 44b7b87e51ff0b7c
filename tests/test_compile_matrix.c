/* NVRTC compiles the generated forward and backward kernels for all five
 * named targets over a matrix of specs (value head dims of their own among
 * them): every one must compile with zero
 * spills and shared memory within the target's limit, as must the Philox
 * benchmark's kernels on the sm_80+ targets. Also the pipeline-level cache
 * behaviour: keys per arch, a truncated entry rebuilt, and two processes
 * compiling one key at once. Compiles run in two processes (the CI machine
 * has two cores). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "flashgen.h"
#include "gen/generate.h"
#include "gen/profile.h"
#include "runtime/cuda_libs.h"
#include "tests/check.h"
#include "tests/workers.h"

typedef struct matrix_spec {
    int head_dim;
    fg_mask mask;
    int dropout;
    fg_sparsity sparsity;
    int varlen;
    int kv_cache; /* forward only */
    int variants; /* 1 softcap, 2 alibi, 4 sinks */
    int expr;     /* exprs[expr - 1]: score and mask expressions */
    int head_dim_v; /* 0: head_dim */
} matrix_spec;

/* Expressions over a float table (Hq, 2S) and int document ids (S). */
static const struct {
    const char *score, *mask;
} exprs[] = {
    {"s + bias[h, q - k + seqlen_k]", "doc[q] == doc[k]"},
    {NULL, "doc[q] == doc[k] || k < 4"},
    {"30.0 * tanh(s / 30.0) + where(q - k > 100, -inf, 0.0)", NULL},
    {"s * bias[h, k] - 0.1 * abs(q - k)", "k <= q + seqlen_k - seqlen_q"},
};

static const matrix_spec matrix[] = {
    {64, FG_MASK_NONE, 0, FG_SPARSE_NONE, 0, 0, 0, 0, 0},       {64, FG_MASK_CAUSAL, 1, FG_SPARSE_NONE, 0, 0, 0, 0, 0},
    {128, FG_MASK_NONE, 0, FG_SPARSE_NONE, 0, 0, 0, 0, 0},      {128, FG_MASK_CAUSAL, 1, FG_SPARSE_NONE, 0, 0, 0, 0, 0},
    {128, FG_MASK_WINDOW, 0, FG_SPARSE_NONE, 0, 0, 0, 0, 0},    {256, FG_MASK_NONE, 0, FG_SPARSE_NONE, 0, 0, 0, 0, 0},
    {256, FG_MASK_CAUSAL, 1, FG_SPARSE_NONE, 0, 0, 0, 0, 0},    {96, FG_MASK_WINDOW, 1, FG_SPARSE_NONE, 0, 0, 0, 0, 0},
    {72, FG_MASK_CAUSAL, 0, FG_SPARSE_NONE, 0, 0, 0, 0, 0},     {160, FG_MASK_NONE, 1, FG_SPARSE_NONE, 0, 0, 0, 0, 0},
    {192, FG_MASK_CAUSAL, 0, FG_SPARSE_NONE, 0, 0, 0, 0, 0},    {33, FG_MASK_CAUSAL, 1, FG_SPARSE_NONE, 0, 0, 0, 0, 0},
    {8, FG_MASK_NONE, 0, FG_SPARSE_NONE, 0, 0, 0, 0, 0},        {255, FG_MASK_WINDOW, 0, FG_SPARSE_NONE, 0, 0, 0, 0, 0},
    {64, FG_MASK_CAUSAL, 0, FG_SPARSE_LAYOUT, 0, 0, 0, 0, 0},   {128, FG_MASK_NONE, 1, FG_SPARSE_BUTTERFLY, 0, 0, 0, 0, 0},
    {64, FG_MASK_CAUSAL, 1, FG_SPARSE_BUTTERFLY, 0, 0, 0, 0, 0}, {100, FG_MASK_NONE, 0, FG_SPARSE_LAYOUT, 0, 0, 0, 0, 0},
    /* packed sequences */
    {64, FG_MASK_CAUSAL, 1, FG_SPARSE_NONE, 1, 0, 0, 0, 0},  {128, FG_MASK_WINDOW, 1, FG_SPARSE_NONE, 1, 0, 0, 0, 0},
    {33, FG_MASK_NONE, 1, FG_SPARSE_NONE, 1, 0, 0, 0, 0},    {256, FG_MASK_CAUSAL, 0, FG_SPARSE_NONE, 1, 0, 0, 0, 0},
    {128, FG_MASK_NONE, 0, FG_SPARSE_LAYOUT, 1, 0, 0, 0, 0},
    /* decoding steps */
    {64, FG_MASK_NONE, 0, FG_SPARSE_NONE, 0, 1, 0, 0, 0},    {128, FG_MASK_CAUSAL, 0, FG_SPARSE_NONE, 0, 1, 0, 0, 0},
    {128, FG_MASK_WINDOW, 0, FG_SPARSE_NONE, 0, 1, 0, 0, 0}, {256, FG_MASK_CAUSAL, 0, FG_SPARSE_NONE, 0, 1, 0, 0, 0},
    {96, FG_MASK_NONE, 0, FG_SPARSE_NONE, 0, 1, 0, 0, 0},
    /* the logits' variants */
    {128, FG_MASK_CAUSAL, 0, FG_SPARSE_NONE, 0, 0, 7, 0, 0}, {256, FG_MASK_NONE, 0, FG_SPARSE_NONE, 0, 0, 1, 0, 0},
    {64, FG_MASK_WINDOW, 1, FG_SPARSE_NONE, 0, 0, 3, 0, 0},  {96, FG_MASK_NONE, 0, FG_SPARSE_NONE, 1, 0, 5, 0, 0},
    {128, FG_MASK_WINDOW, 0, FG_SPARSE_NONE, 0, 1, 7, 0, 0}, {256, FG_MASK_CAUSAL, 1, FG_SPARSE_NONE, 0, 0, 4, 0, 0},
    {64, FG_MASK_NONE, 0, FG_SPARSE_LAYOUT, 0, 0, 6, 0, 0},
    /* expressions (the sm_90a backward at d128 spills with a tensor read: docs/logits-notes.md) */
    {64, FG_MASK_CAUSAL, 1, FG_SPARSE_NONE, 0, 0, 4, 1, 0}, {128, FG_MASK_NONE, 0, FG_SPARSE_NONE, 1, 0, 0, 3, 0},
    {256, FG_MASK_CAUSAL, 0, FG_SPARSE_NONE, 0, 0, 0, 3, 0}, {96, FG_MASK_NONE, 0, FG_SPARSE_NONE, 0, 0, 0, 4, 0},
    {128, FG_MASK_WINDOW, 0, FG_SPARSE_NONE, 0, 1, 4, 2, 0}, {64, FG_MASK_NONE, 0, FG_SPARSE_NONE, 1, 0, 0, 2, 0},
    /* block masks: the forward and backward over their lists, and their build */
    {128, FG_MASK_CAUSAL, 0, FG_SPARSE_LAYOUT, 0, 0, 0, 2, 0}, {64, FG_MASK_NONE, 1, FG_SPARSE_LAYOUT, 0, 0, 4, 1, 0},
    /* value head dims of their own (the mma.sync families on every target, the
     * sm_90a ones on h100; a tensor read in the score at d128 spills there, as
     * at one head dim, so the d128 pair's predicate reads one and its score not) */
    {192, FG_MASK_CAUSAL, 0, FG_SPARSE_NONE, 0, 0, 0, 0, 128}, {192, FG_MASK_NONE, 1, FG_SPARSE_NONE, 0, 0, 0, 0, 128},
    {128, FG_MASK_NONE, 0, FG_SPARSE_NONE, 0, 0, 0, 0, 64},    {96, FG_MASK_CAUSAL, 1, FG_SPARSE_NONE, 0, 0, 0, 0, 64},
    {256, FG_MASK_CAUSAL, 0, FG_SPARSE_NONE, 0, 0, 0, 0, 128}, {64, FG_MASK_NONE, 0, FG_SPARSE_NONE, 0, 0, 0, 0, 128},
    {64, FG_MASK_WINDOW, 1, FG_SPARSE_NONE, 0, 0, 0, 0, 256},  {33, FG_MASK_CAUSAL, 0, FG_SPARSE_NONE, 0, 0, 0, 0, 65},
    {192, FG_MASK_CAUSAL, 1, FG_SPARSE_NONE, 1, 0, 4, 0, 128}, {128, FG_MASK_NONE, 0, FG_SPARSE_LAYOUT, 0, 0, 4, 2, 72},
    {64, FG_MASK_NONE, 0, FG_SPARSE_LAYOUT, 0, 0, 4, 1, 40},   {192, FG_MASK_CAUSAL, 0, FG_SPARSE_NONE, 1, 0, 0, 0, 128},
};
#define MATRIX_COUNT ((int)(sizeof matrix / sizeof matrix[0]))

static fg_spec spec_of(const matrix_spec *m, int arch, int index) {
    /* bf16 on every other spec where the arch has it */
    fg_spec s = fg_spec_default(m->head_dim, arch >= 80 && index % 2 ? FG_BF16 : FG_FP16);
    s.mask = m->mask, s.dropout = m->dropout, s.sparsity = m->sparsity, s.varlen = m->varlen;
    s.kv_cache = m->kv_cache;
    s.head_dim_v = m->head_dim_v;
    s.softcap = m->variants & 1, s.alibi = (m->variants >> 1) & 1, s.sinks = (m->variants >> 2) & 1;
    s.sparse_block_q = s.sparse_block_k = 128;
    s.butterfly_factors = 3;
    if (m->expr) {
        s.score_mod = exprs[m->expr - 1].score;
        s.mask_mod = exprs[m->expr - 1].mask;
        s.aux_count = 2;
        s.aux[0] = (fg_aux_decl){"bias", FG_AUX_F32, 2};
        s.aux[1] = (fg_aux_decl){"doc", FG_AUX_I32, 1};
    }
    return s;
}

/* Whether the matrix compiles a spec's block mask build: layout specs with a
 * predicate. */
static int has_block_mask(const matrix_spec *m) {
    return m->sparsity == FG_SPARSE_LAYOUT && m->expr && exprs[m->expr - 1].mask && !m->varlen;
}

/* Compile every (target, spec, pass) whose index % workers == worker; print
 * one line each; return the number of failures. */
static int compile_share(int worker, int workers) {
    int failures = 0, n = 0;
    for (int t = 0; t < profile_named_count(); t++) {
        const fg_profile *prof = profile_named_at(t);
        fg_context *ctx;
        if (fg_context_create(&ctx, prof->name) != FG_OK) return 1;
        for (int i = 0; i < 3 * MATRIX_COUNT; i++, n++) {
            if (n % workers != worker) continue;
            fg_pass pass = (fg_pass)(i / MATRIX_COUNT);
            if (pass == FG_PASS_BACKWARD && matrix[i % MATRIX_COUNT].kv_cache) continue;
            if (pass == FG_PASS_BLOCK_MASK && !has_block_mask(&matrix[i % MATRIX_COUNT])) continue;
            fg_spec s = spec_of(&matrix[i % MATRIX_COUNT], prof->arch, i % MATRIX_COUNT);
            fg_kernel_info info;
            fg_status st = fg_compile(ctx, &s, pass, &info);
            int ok = st == FG_OK && info.spill_bytes == 0 && info.stack_bytes == 0 &&
                     info.plan.smem_bytes + info.smem_static <= prof->smem_per_block &&
                     info.registers > 0 && info.registers <= 255;
            printf("%-8s %-60s regs %3d spill %3d stack %3d smem %6d %6.0f ms %s\n", prof->name,
                   st == FG_OK ? info.plan.kernel_name : fg_context_message(ctx), info.registers,
                   info.spill_bytes, info.stack_bytes, info.plan.smem_bytes, info.compile_ms,
                   ok ? "ok" : "FAIL");
            fflush(stdout);
            failures += !ok;
        }
        fg_context_destroy(ctx);
    }
    return failures;
}

static void test_matrix(void) { check_in_workers(compile_share, 2); }

/* The kernels of `flashgen bench --philox` compile for every sm_80+ target
 * without spills; sm_75 is refused by name. */
static void test_philox_bench(void) {
    for (int t = 0; t < profile_named_count(); t++) {
        const fg_profile *prof = profile_named_at(t);
        char *log = NULL, err[512] = "", target[16];
        void *cubin = NULL;
        size_t cubin_len = 0;
        nvrtc_resources res;
        memset(&res, 0, sizeof res);
        kernel_target kt = {prof->arch, 0};
        target_name(&kt, target, sizeof target);
        generated g;
        int rc = generate_philox_bench(&kt, 64, &g, err, sizeof err);
        if (prof->arch < 80) {
            CHECK(rc != 0 && strstr(err, "sm_80"), "%s: Philox benchmark not refused: %s",
                  prof->name, err);
            continue;
        }
        CHECK(rc == 0, "%s: Philox benchmark generation: %s", prof->name, err);
        if (rc != 0) continue;
        rc = nvrtc_compile_cubin(g.source, g.kernel_name, target, NULL, 0, &cubin, &cubin_len, &log,
                                 &res, err, sizeof err);
        CHECK(rc == 0 && cubin_len > 0 && res.spill_stores == 0 && res.spill_loads == 0,
              "%s: Philox benchmark compile: %s (spills %d/%d)", prof->name, err, res.spill_stores,
              res.spill_loads);
        generated_free(&g), free(log), free(cubin);
    }
}

/* ---- cache through the pipeline ---- */

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".fgc")) n++;
    closedir(d);
    return n;
}

/* rm -rf for the test's own cache folder */
static void remove_tree(const char *path) {
    DIR *d = opendir(path);
    if (!d) {
        unlink(path);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char child[2048];
        snprintf(child, sizeof child, "%s/%s", path, e->d_name);
        remove_tree(child);
    }
    closedir(d);
    rmdir(path);
}

static int log_lines;
static char last_log[512];
static void count_log(const char *line, void *user) {
    (void)user;
    log_lines++;
    snprintf(last_log, sizeof last_log, "%s", line);
}

static void test_cache_pipeline(void) {
    char dir[] = "/tmp/fg-matrix-XXXXXX", saved[1024] = "";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    const char *old = getenv("FLASHGEN_CACHE_DIR");
    if (old) snprintf(saved, sizeof saved, "%s", old);
    setenv("FLASHGEN_CACHE_DIR", dir, 1);
    fg_spec s = fg_spec_default(64, FG_FP16);
    fg_kernel_info a, b, c;
    fg_context *ctx;

    /* two processes compile the same key at once: both succeed, one entry */
    pid_t kids[2];
    for (int i = 0; i < 2; i++) {
        kids[i] = fork();
        if (kids[i] == 0) {
            fg_context *x;
            fg_kernel_info info;
            int ok = fg_context_create(&x, "a100") == FG_OK && fg_compile(x, &s, FG_PASS_FORWARD, &info) == FG_OK &&
                     info.spill_bytes == 0;
            _exit(ok ? 0 : 1);
        }
    }
    for (int i = 0; i < 2; i++) {
        int status = 0;
        waitpid(kids[i], &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "concurrent compile %d", i);
    }
    char sm80[1100];
    snprintf(sm80, sizeof sm80, "%s/sm_80", dir);
    CHECK(count_entries(sm80) == 1, "one intact entry after concurrent compiles (%d)", count_entries(sm80));

    /* the entry is now a disk hit, then a memory hit */
    fg_context_create(&ctx, "a100");
    CHECK(fg_compile(ctx, &s, FG_PASS_FORWARD, &a) == FG_OK && a.from_cache == 1, "disk hit (from %d)", a.from_cache);
    CHECK(fg_compile(ctx, &s, FG_PASS_FORWARD, &b) == FG_OK && b.from_cache == 2, "memory hit (from %d)", b.from_cache);
    CHECK(a.registers == b.registers && a.registers > 0, "report survives the cache");
    fg_context_destroy(ctx);

    /* the arch is in the key: l4 gets its own entry */
    fg_context_create(&ctx, "l4");
    CHECK(fg_compile(ctx, &s, FG_PASS_FORWARD, &c) == FG_OK && c.from_cache == 0, "another arch compiles");
    CHECK(strcmp(c.cache_path, a.cache_path) != 0, "different entries per arch");
    fg_context_destroy(ctx);

    /* a truncated entry is a miss and is rebuilt */
    CHECK(truncate(a.cache_path, 100) == 0, "truncate");
    fg_context_create(&ctx, "a100");
    CHECK(fg_compile(ctx, &s, FG_PASS_FORWARD, &b) == FG_OK && b.from_cache == 0, "truncated entry recompiled");
    fg_context_destroy(ctx);
    struct stat st;
    CHECK(stat(a.cache_path, &st) == 0 && st.st_size > 1000, "entry rebuilt");
    fg_context_create(&ctx, "a100");
    CHECK(fg_compile(ctx, &s, FG_PASS_FORWARD, &b) == FG_OK && b.from_cache == 1, "rebuilt entry hits");
    fg_context_destroy(ctx);

    /* one log line per NVRTC compile, none for cache hits */
    log_lines = 0;
    fg_context_create(&ctx, "a100");
    fg_context_set_compile_log(ctx, count_log, NULL);
    fg_spec s3 = s;
    s3.head_dim = 40;
    CHECK(fg_compile(ctx, &s3, FG_PASS_FORWARD, &c) == FG_OK && c.from_cache == 0, "fresh compile");
    CHECK(log_lines == 1 && strstr(last_log, c.plan.kernel_name) && strstr(last_log, " for sm_80 in ") &&
              strstr(last_log, " ms"),
          "compile logged once: %d \"%s\"", log_lines, last_log);
    CHECK(fg_compile(ctx, &s3, FG_PASS_FORWARD, &c) == FG_OK && c.from_cache == 2 && log_lines == 1,
          "memory hit not logged");
    CHECK(fg_compile(ctx, &s, FG_PASS_FORWARD, &c) == FG_OK && c.from_cache == 1 && log_lines == 1,
          "disk hit not logged");
    fg_context_set_compile_log(ctx, NULL, NULL);
    fg_context_destroy(ctx);

    /* a different spec (different source) is a different key */
    fg_spec s2 = s;
    s2.mask = FG_MASK_CAUSAL;
    fg_context_create(&ctx, "a100");
    CHECK(fg_compile(ctx, &s2, FG_PASS_FORWARD, &c) == FG_OK && strcmp(c.cache_path, a.cache_path) != 0, "source in key");
    fg_context_destroy(ctx);
    /* the matrix below uses the cache the test was given */
    if (old) setenv("FLASHGEN_CACHE_DIR", saved, 1);
    else unsetenv("FLASHGEN_CACHE_DIR");
    remove_tree(dir);
}

int main(void) {
    test_cache_pipeline();
    test_philox_bench();
    test_matrix();
    return check_summary("test_compile_matrix");
}
