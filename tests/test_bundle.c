/* Bundles end to end, on the CPU: `flashgen bundle build` makes a small
 * bundle (two targets, forward and backward, fp16 and bf16, one spec with a
 * spilled step); an h100 bundle holding the Hopper forward and the mma.sync
 * one beside it (for the calls the first declines); fresh processes with
 * NVRTC made unavailable
 * (FLASHGEN_NVRTC=/nonexistent) and an empty user cache then get every
 * bundled kernel from it, and a clear error for one it lacks. A damaged entry
 * and an entry copied in from another arch are rejected by verify and never
 * loaded: offline they are misses, with NVRTC the kernel is compiled instead.
 *
 * usage: test_bundle PATH-TO-flashgen   (the children re-run this binary
 * through /proc/self/exe: NVRTC is loaded at most once per process, so each
 * environment needs a process of its own) */
#define _DEFAULT_SOURCE /* syscall */
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cache/bundle.h"
#include "families/family.h"
#include "flashgen.h"
#include "runtime/cuda_libs.h"
#include "tests/check.h"

/* What the test bundle holds: d=96 causal, no dropout, for these. On rtx3090
 * the fp16 forward's first plan spills in ptxas and is re-planned, so its
 * bundle has a "replayed" step too. */
typedef struct bundle_case {
    const char *profile;
    const char *target; /* the bundle's folder */
    fg_pass pass;
    fg_dtype dtype;
} bundle_case;

static const bundle_case cases[] = {
    {"rtx3090", "sm_86", FG_PASS_FORWARD, FG_FP16},
    {"rtx3090", "sm_86", FG_PASS_FORWARD, FG_BF16},
    {"rtx3090", "sm_86", FG_PASS_BACKWARD, FG_FP16},
    {"rtx3090", "sm_86", FG_PASS_BACKWARD, FG_BF16},
    {"t4", "sm_75", FG_PASS_FORWARD, FG_FP16},
    {"t4", "sm_75", FG_PASS_BACKWARD, FG_FP16},
};
#define CASE_COUNT ((int)(sizeof cases / sizeof cases[0]))
#define DAMAGED_CASE 2   /* rtx3090 backward fp16: a byte flipped */
#define WRONG_ARCH_CASE 4 /* t4 forward fp16: replaced by the rtx3090 one */

static const char *build_args =
    "bundle build --target rtx3090 --target t4 --head-dims 96 --dtypes fp16,bf16 --masks causal "
    "--dropout off --passes forward,backward -j 2";

static fg_spec spec_of(const bundle_case *c) {
    fg_spec s = fg_spec_default(96, c->dtype);
    s.mask = FG_MASK_CAUSAL;
    return s;
}

static const char *pass_name(fg_pass p) { return p == FG_PASS_BACKWARD ? "backward" : "forward"; }

/* The manifest's kept entry of a case, or NULL. */
static const bundle_entry *kept_entry(const bundle_entry *e, size_t n, const bundle_case *c) {
    char spec[32];
    snprintf(spec, sizeof spec, "%s_d96_causal", c->dtype == FG_BF16 ? "bf16" : "fp16");
    for (size_t i = 0; i < n; i++)
        if (strcmp(e[i].target, c->target) == 0 && strcmp(e[i].pass, pass_name(c->pass)) == 0 &&
            strcmp(e[i].spec, spec) == 0 && strcmp(e[i].step, "kept") == 0)
            return &e[i];
    return NULL;
}

static int run_command(const char *cmd, char *out, size_t out_len) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t used = 0;
    out[0] = '\0';
    char buf[4096];
    while (fgets(buf, sizeof buf, p)) {
        fputs(buf, stdout);
        size_t n = strlen(buf);
        if (used + n < out_len) memcpy(out + used, buf, n + 1), used += n;
    }
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Re-runs this binary as `--child MODE BUNDLE` with environment changes
 * ("NAME=value", or "NAME" to unset). Returns its exit code. */
static int run_child(const char *mode, const char *bundle, const char *const *env) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        for (int i = 0; env[i]; i++) {
            char name[256];
            const char *eq = strchr(env[i], '=');
            if (eq) {
                snprintf(name, sizeof name, "%.*s", (int)(eq - env[i]), env[i]);
                setenv(name, eq + 1, 1);
            } else {
                unsetenv(env[i]);
            }
        }
        char *argv[] = {"test_bundle", "--child", (char *)mode, (char *)bundle, NULL};
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
    return WEXITSTATUS(status);
}

static int count_files(const char *dir) {
    char cmd[1200], out[64] = "";
    snprintf(cmd, sizeof cmd, "find '%s' -name '*.fgc' 2>/dev/null | wc -l", dir);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    if (!fgets(out, sizeof out, p)) out[0] = '\0';
    pclose(p);
    return atoi(out);
}

/* ---- children ---- */

/* The sparse build's kernels: rtx3090, fp16, d=64, each pass, layouts of
 * blocks 64x64 and 64x32, butterflies of 1 and 2 factors on both. */
static const char *sparse_build_args =
    "bundle build --target rtx3090 --head-dims 64 --dtypes fp16 --masks none --dropout off "
    "--passes forward,backward --sparsity layout,butterfly --sparse-blocks 64x64,64x32 "
    "--butterfly-factors 1,2 -j 2";
#define SPARSE_KERNELS 12

/* NVRTC absent: every sparse kernel of the build loads from its bundle. */
static int child_sparse(void) {
    fg_context *ctx = NULL;
    CHECK(fg_context_create(&ctx, "rtx3090") == FG_OK, "%s", fg_last_message());
    if (!ctx) return check_summary("sparse child");
    static const int blocks[][2] = {{64, 64}, {64, 32}};
    int loaded = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int b = 0; b < 2; b++)
            for (int kind = 0; kind < 3; kind++) { /* layout, butterfly 1, butterfly 2 */
                fg_spec s = fg_spec_default(64, FG_FP16);
                s.sparsity = kind == 0 ? FG_SPARSE_LAYOUT : FG_SPARSE_BUTTERFLY;
                s.sparse_block_q = blocks[b][0], s.sparse_block_k = blocks[b][1];
                s.butterfly_factors = kind;
                fg_kernel_info info;
                fg_status st = fg_compile(ctx, &s, pass ? FG_PASS_BACKWARD : FG_PASS_FORWARD, &info);
                CHECK(st == FG_OK && info.from_cache == 3, "pass %d blocks %dx%d kind %d: %s", pass,
                      blocks[b][0], blocks[b][1], kind, st ? fg_context_message(ctx) : "not from the bundle");
                loaded += st == FG_OK && info.from_cache == 3;
            }
    CHECK(loaded == SPARSE_KERNELS, "%d sparse kernels from the bundle", loaded);
    fg_context_destroy(ctx);
    return check_summary("sparse child");
}

/* The compile log's lines: how many, and the last. */
static int log_count;
static char log_last[4096];
static void count_log(const char *line, void *user) {
    (void)user;
    log_count++;
    snprintf(log_last, sizeof log_last, "%s", line);
}

static int compile_case(fg_context **ctxs, int index, fg_kernel_info *info) {
    const bundle_case *c = &cases[index];
    fg_spec s = spec_of(c);
    fg_context *ctx = ctxs[strcmp(c->profile, "t4") == 0];
    memset(info, 0, sizeof *info);
    fg_status st = fg_compile(ctx, &s, c->pass, info);
    if (st != FG_OK)
        snprintf(info->plan.why, sizeof info->plan.why, "%s", fg_context_message(ctx));
    return st;
}

static void open_both(fg_context **ctxs) {
    ctxs[0] = ctxs[1] = NULL;
    CHECK(fg_context_create(&ctxs[0], "rtx3090") == FG_OK, "%s", fg_last_message());
    CHECK(fg_context_create(&ctxs[1], "t4") == FG_OK, "%s", fg_last_message());
}

/* NVRTC absent, bundle on FLASHGEN_BUNDLE_PATH, empty user cache: every case
 * loads from the bundle, with the kept kernel of the manifest; a spec the
 * bundle lacks fails naming both reasons. */
static int child_offline(const char *bundle) {
    bundle_entry *entries = NULL;
    size_t n = 0;
    char err[512];
    CHECK(bundle_manifest_read(bundle, &entries, &n, err, sizeof err) == 0, "%s", err);
    fg_context *ctx[2];
    open_both(ctx);
    if (!ctx[0] || !ctx[1]) return check_summary("offline child");
    for (int i = 0; i < CASE_COUNT; i++) {
        fg_kernel_info info;
        fg_status st = compile_case(ctx, i, &info);
        const bundle_entry *want = kept_entry(entries, n, &cases[i]);
        CHECK(st == FG_OK, "case %d from the bundle: %s", i, info.plan.why);
        CHECK(info.from_cache == 3, "case %d: from_cache %d, want 3 (bundle)", i, info.from_cache);
        CHECK(info.compile_ms == 0, "case %d: compile_ms %f", i, info.compile_ms);
        CHECK(strncmp(info.cache_path, bundle, strlen(bundle)) == 0, "case %d: path %s", i,
              info.cache_path);
        CHECK(want && strcmp(info.plan.kernel_name, want->kernel) == 0,
              "case %d: kernel %s, manifest %s", i, info.plan.kernel_name, want ? want->kernel : "none");
        CHECK(info.registers > 0 && info.spill_bytes == 0, "case %d: registers %d, spills %d", i,
              info.registers, info.spill_bytes);
    }
    /* The spilling plan was replayed from the bundle too, with no NVRTC. */
    fg_kernel_info info;
    compile_case(ctx, 0, &info);
    CHECK(strstr(info.plan.why, "re-planned") != NULL, "rtx3090 fp16 forward not re-planned: %s",
          info.plan.why);

    fg_spec absent = fg_spec_default(64, FG_FP16);
    CHECK(fg_compile(ctx[0], &absent, FG_PASS_FORWARD, &info) == FG_ERR_COMPILE,
          "a spec not in the bundle compiled");
    const char *msg = fg_context_message(ctx[0]);
    CHECK(strstr(msg, "fg_fwd_sm86_fp16_d64") && strstr(msg, "is in no bundle") &&
              strstr(msg, "NVRTC could not be loaded") && strstr(msg, "FLASHGEN_NVRTC"),
          "unclear message: %s", msg);
    CHECK(nvrtc_lib_load(err, sizeof err) != 0, "NVRTC loaded although FLASHGEN_NVRTC is bad");
    fg_context_destroy(ctx[0]);
    fg_context_destroy(ctx[1]);

    /* fg_context_add_bundle: the search path read at creation, then added. */
    unsetenv("FLASHGEN_BUNDLE_PATH");
    fg_context *plain;
    CHECK(fg_context_create(&plain, "t4") == FG_OK, "%s", fg_last_message());
    fg_spec s = spec_of(&cases[5]);
    CHECK(fg_compile(plain, &s, FG_PASS_BACKWARD, &info) == FG_ERR_COMPILE &&
              strstr(fg_context_message(plain), "no bundle") == NULL,
          "no bundles, no NVRTC: %s", fg_context_message(plain));
    CHECK(fg_context_add_bundle(plain, "/nonexistent/bundle") == FG_ERR_INVALID_ARGUMENT,
          "a missing folder accepted");
    CHECK(fg_context_add_bundle(plain, "/tmp") == FG_ERR_INVALID_ARGUMENT &&
              strstr(fg_context_message(plain), "manifest.tsv"),
          "a folder without a manifest: %s", fg_context_message(plain));
    CHECK(fg_context_add_bundle(plain, NULL) == FG_ERR_INVALID_ARGUMENT, "NULL accepted");
    CHECK(fg_context_add_bundle(plain, bundle) == FG_OK, "%s", fg_context_message(plain));
    CHECK(fg_compile(plain, &s, FG_PASS_BACKWARD, &info) == FG_OK && info.from_cache == 3,
          "after fg_context_add_bundle: %s (from %d)", fg_context_message(plain), info.from_cache);
    fg_context_destroy(plain);

    /* Search-path entries that are not bundles are passed over, with one
     * warning naming them for the first compile log. */
    char path[2048];
    snprintf(path, sizeof path, "/nonexistent::/tmp:%s", bundle);
    setenv("FLASHGEN_BUNDLE_PATH", path, 1);
    CHECK(fg_context_create(&plain, "t4") == FG_OK, "%s", fg_last_message());
    if (plain) {
        fg_context_set_compile_log(plain, count_log, NULL);
        CHECK(log_count == 1 && strncmp(log_last, "flashgen: warning: ", 19) == 0 &&
                  strstr(log_last, "FLASHGEN_BUNDLE_PATH: bundle folder /nonexistent") &&
                  strstr(log_last, "/tmp has no manifest.tsv") && !strstr(log_last, bundle),
              "%d lines: %s", log_count, log_last);
        fg_context_set_compile_log(plain, count_log, NULL);
        CHECK(log_count == 1, "the warning told twice");
        CHECK(fg_compile(plain, &s, FG_PASS_BACKWARD, &info) == FG_OK && info.from_cache == 3,
              "bundle third on the path: %s", fg_context_message(plain));
        fg_context_destroy(plain);
    }
    free(entries);
    return check_summary("offline child");
}

/* After the damage: offline, the damaged and the wrong-arch cases are misses
 * (never loaded) while the rest still load from the bundle. */
static int child_offline_damaged(const char *bundle) {
    (void)bundle;
    fg_context *ctx[2];
    open_both(ctx);
    if (!ctx[0] || !ctx[1]) return check_summary("offline damaged child");
    for (int i = 0; i < CASE_COUNT; i++) {
        fg_kernel_info info;
        fg_status st = compile_case(ctx, i, &info);
        if (i == DAMAGED_CASE || i == WRONG_ARCH_CASE) {
            CHECK(st == FG_ERR_COMPILE && strstr(info.plan.why, "is in no bundle"),
                  "case %d was loaded from a bad entry (status %d, from %d): %s", i, st,
                  info.from_cache, info.plan.why);
        } else {
            CHECK(st == FG_OK && info.from_cache == 3, "case %d: status %d from %d: %s", i, st,
                  info.from_cache, info.plan.why);
        }
    }
    fg_context_destroy(ctx[0]);
    fg_context_destroy(ctx[1]);
    return check_summary("offline damaged child");
}

/* With NVRTC, the bad entries fall through to a compile of the right kernel. */
static int child_online_damaged(const char *bundle) {
    (void)bundle;
    fg_context *ctx[2];
    open_both(ctx);
    if (!ctx[0] || !ctx[1]) return check_summary("online damaged child");
    const int bad[] = {DAMAGED_CASE, WRONG_ARCH_CASE};
    for (int b = 0; b < 2; b++) {
        fg_kernel_info info;
        fg_status st = compile_case(ctx, bad[b], &info);
        char tag[16];
        snprintf(tag, sizeof tag, "_sm%s_", cases[bad[b]].target + 3);
        CHECK(st == FG_OK && info.from_cache == 0, "case %d: status %d, from %d: %s", bad[b], st,
              info.from_cache, info.plan.why);
        CHECK(strstr(info.plan.kernel_name, tag) != NULL, "case %d compiled %s", bad[b],
              info.plan.kernel_name);
    }
    fg_kernel_info info;
    CHECK(compile_case(ctx, 3, &info) == FG_OK && info.from_cache == 3,
          "a good entry next to them: from %d", info.from_cache);
    fg_context_destroy(ctx[0]);
    fg_context_destroy(ctx[1]);
    return check_summary("online damaged child");
}

/* ---- the parent ---- */

typedef struct verdicts {
    int ok, skipped, rejected;
    char notes[8192];
} verdicts;

static void collect(const bundle_entry *e, int line, bundle_verdict v, const char *note,
                    void *user) {
    verdicts *r = user;
    if (v == BUNDLE_ENTRY_OK) r->ok++;
    if (v == BUNDLE_ENTRY_SKIPPED) r->skipped++;
    if (v == BUNDLE_ENTRY_REJECTED) r->rejected++;
    size_t used = strlen(r->notes);
    snprintf(r->notes + used, sizeof r->notes - used, "%d %d %s %s: %s\n", (int)v, line,
             e->kernel, e->key, note);
}

static int verify(const char *bundle, const char *only_target, verdicts *r) {
    bundle_verify_result res;
    char err[512];
    memset(r, 0, sizeof *r);
    int rc = bundle_verify(bundle, FLASHGEN_VERSION, only_target, collect, r, &res, err,
                           sizeof err);
    CHECK(rc == 0, "bundle_verify: %s", err);
    CHECK(res.ok == (size_t)r->ok && res.skipped == (size_t)r->skipped &&
              res.rejected == (size_t)r->rejected,
          "counts disagree with the callbacks");
    return rc;
}

static int copy_file(const char *from, const char *to) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", from, to);
    return system(cmd);
}

static void entry_path(const char *bundle, const bundle_entry *e, char *path, size_t len) {
    snprintf(path, len, "%s/%s/%s.fgc", bundle, e->target, e->key);
}

static void test_manifest_lines(void) {
    bundle_entry e, back;
    memset(&e, 0, sizeof e);
    snprintf(e.pass, sizeof e.pass, "forward");
    snprintf(e.spec, sizeof e.spec, "fp16_d64");
    snprintf(e.kernel, sizeof e.kernel, "fg_fwd_sm80_fp16_d64_m128n64w4");
    snprintf(e.plan, sizeof e.plan, "Br=128,Bc=64,warps=4,stages=2");
    snprintf(e.target, sizeof e.target, "sm_80");
    memset(e.key, 'a', 64);
    memset(e.sha256, '0', 64);
    snprintf(e.generator, sizeof e.generator, "0.1.0");
    snprintf(e.nvrtc, sizeof e.nvrtc, "13.0");
    e.format = 1;
    snprintf(e.step, sizeof e.step, "kept");
    char line[2048], why[256];
    CHECK(bundle_entry_format(&e, line, sizeof line) == 0, "format");
    CHECK(bundle_entry_parse(line, &back, why, sizeof why) == 0 && memcmp(&e, &back, sizeof e) == 0,
          "round trip: %s", why);
    char bad[2100];
    snprintf(bad, sizeof bad, "%s\textra", line);
    CHECK(bundle_entry_parse(bad, &back, why, sizeof why) != 0, "12 fields accepted");
    bundle_entry evil = e;
    snprintf(evil.key, sizeof evil.key, "../../../../etc/passwd");
    CHECK(bundle_entry_format(&evil, line, sizeof line) == 0 &&
              bundle_entry_parse(line, &back, why, sizeof why) != 0,
          "a key that is a path accepted");
    snprintf(evil.kernel, sizeof evil.kernel, "a\tb");
    CHECK(bundle_entry_format(&evil, line, sizeof line) != 0, "a tab inside a field written");

    /* The target column is the target's name; an arch-specific one round
     * trips, anything that is not a name (a path, version 1's bare number)
     * is neither written nor read. */
    bundle_entry specific = e;
    snprintf(specific.target, sizeof specific.target, "sm_90a");
    CHECK(bundle_entry_format(&specific, line, sizeof line) == 0 && strstr(line, "\tsm_90a\t") &&
              bundle_entry_parse(line, &back, why, sizeof why) == 0 &&
              strcmp(back.target, "sm_90a") == 0,
          "sm_90a round trip: %s", why);
    const char *bad_targets[] = {"80", "../x", "sm_90b", "", "sm_80/.."};
    for (size_t i = 0; i < sizeof bad_targets / sizeof bad_targets[0]; i++) {
        bundle_entry t = e;
        snprintf(t.target, sizeof t.target, "%s", bad_targets[i]);
        CHECK(bundle_entry_format(&t, line, sizeof line) != 0, "target '%s' written",
              bad_targets[i]);
        char forged[2100];
        snprintf(forged, sizeof forged,
                 "forward\tfp16_d64\tk\tBr=1\t%s\t%064d\t%064d\t0.1.0\t13.0\t1\tkept",
                 bad_targets[i], 0, 0);
        CHECK(bundle_entry_parse(forged, &back, why, sizeof why) != 0 && strstr(why, "target"),
              "target '%s' read: %s", bad_targets[i], why);
    }
}

/* Writes text as path's whole content. */
static int write_text(const char *path, const char *text, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = fwrite(text, 1, len, f) == len;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* `flashgen compile` of case 1 (rtx3090 bf16 forward) with NVRTC absent and
 * dir on FLASHGEN_BUNDLE_PATH; its exit code and output in out. */
static int compile_from(const char *cli, const char *dir, char *out, size_t out_len) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "FLASHGEN_NVRTC=/nonexistent FLASHGEN_CACHE=off FLASHGEN_BUNDLE_PATH='%s' '%s' "
             "compile --target rtx3090 --dtype bf16 -d 96 --mask causal 2>&1",
             dir, cli);
    return run_command(cmd, out, out_len);
}

/* A bundle whose manifest is garbage, empty, cut off inside an entry's line
 * or unreadable is no bundle, to the runtime as to verify: fg_context_add_bundle
 * refuses it and FLASHGEN_BUNDLE_PATH passes it over with a warning, so
 * nothing is loaded from it (offline, the kernel is not found). */
static const struct {
    const char *what, *text, *why; /* why: in the message */
} bad_manifests[] = {{"garbage", "hello, world\n", "not a flashgen bundle manifest"},
                     {"empty", "", "not a flashgen bundle manifest"},
                     {"truncated", NULL, "manifest.tsv line 3"},
                     {"unreadable", NULL, "Permission denied"}};

/* Root reads every file: without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH, in
 * this process and the programs it runs (the bounding set), it reads a mode 0
 * file no more than another user does. 0 once they are gone. */
static int drop_read_override(void) {
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3];
    if (syscall(SYS_capget, &header, data) != 0) return -1;
    const int caps[] = {CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH};
    for (size_t i = 0; i < sizeof caps / sizeof caps[0]; i++) {
        if (prctl(PR_CAPBSET_DROP, caps[i], 0, 0, 0) != 0) return -1;
        int w = CAP_TO_INDEX(caps[i]);
        unsigned mask = ~(unsigned)CAP_TO_MASK(caps[i]);
        data[w].effective &= mask, data[w].permitted &= mask, data[w].inheritable &= mask;
    }
    return syscall(SYS_capset, &header, data) == 0 ? 0 : -1;
}

static void bad_manifest_case(const char *cli, const char *bad, size_t i) {
    char out[16384], err[1200], verr[1200];
    cache_store s;
    CHECK(bundle_open(&s, bad, err, sizeof err) == -1 && strstr(err, bad_manifests[i].why),
          "%s manifest opened: %s", bad_manifests[i].what, err);
    bundle_verify_result r;
    CHECK(bundle_verify(bad, FLASHGEN_VERSION, NULL, NULL, NULL, &r, verr, sizeof verr) == -1 &&
              strcmp(err, verr) == 0,
          "%s manifest: verify says '%s', the runtime '%s'", bad_manifests[i].what, verr, err);
    fg_context *ctx = NULL;
    CHECK(fg_context_create(&ctx, "rtx3090") == FG_OK, "%s", fg_last_message());
    CHECK(ctx && fg_context_add_bundle(ctx, bad) == FG_ERR_INVALID_ARGUMENT &&
              strstr(fg_context_message(ctx), bad_manifests[i].why),
          "%s manifest added: %s", bad_manifests[i].what, ctx ? fg_context_message(ctx) : "");
    fg_context_destroy(ctx);
    int rc = compile_from(cli, bad, out, sizeof out);
    CHECK(rc == 1 && strstr(out, "warning: FLASHGEN_BUNDLE_PATH") && strstr(out, "passed over") &&
              strstr(out, "NVRTC not found"),
          "%s manifest on FLASHGEN_BUNDLE_PATH: exit %d\n%s", bad_manifests[i].what, rc, out);
}

/* The unreadable case as root: in a child that has given up reading what its
 * mode forbids. Returns its failures, or -1 where it cannot give that up. */
static int unreadable_as_root(const char *cli, const char *bad, const char *path, size_t i) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        if (drop_read_override() != 0) _exit(100);
        FILE *f = fopen(path, "rb");
        if (f) fclose(f);
        if (f || errno != EACCES) _exit(100);
        bad_manifest_case(cli, bad, i);
        fflush(stdout);
        fflush(stderr);
        _exit(check_failed_count > 99 ? 99 : check_failed_count);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return 1;
    return WEXITSTATUS(status) == 100 ? -1 : WEXITSTATUS(status);
}

static void test_bad_manifests(const char *cli, const char *bundle, const char *root) {
    char bad[512], cmd[2048], out[16384], path[600];
    snprintf(bad, sizeof bad, "%s/bad-manifest", root);
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", bundle, bad);
    CHECK(system(cmd) == 0, "copy the bundle");
    snprintf(path, sizeof path, "%s/manifest.tsv", bad);
    static char good[1 << 20];
    FILE *f = fopen(path, "rb");
    size_t len = f ? fread(good, 1, sizeof good - 1, f) : 0;
    if (f) fclose(f);
    good[len] = '\0';
    CHECK(len > 0 && len < sizeof good - 1, "read %s", path);
    CHECK(compile_from(cli, bad, out, sizeof out) == 0 && strstr(out, "bundle") &&
              !strstr(out, "warning"),
          "the intact copy: %s", out);
    /* cut in the middle of the first entry's line (after the two header lines) */
    const char *first = strchr(good, '\n');
    first = first ? strchr(first + 1, '\n') : NULL;
    size_t cut = first ? (size_t)(first + 1 - good) + strcspn(first + 1, "\n") / 2 : len / 2;
    for (size_t i = 0; i < sizeof bad_manifests / sizeof bad_manifests[0]; i++) {
        if (strcmp(bad_manifests[i].what, "unreadable") == 0) {
            /* the intact text: only its mode keeps it from being a bundle */
            CHECK(write_text(path, good, len) == 0 && chmod(path, 0) == 0, "chmod %s", path);
            if (geteuid() != 0) {
                bad_manifest_case(cli, bad, i);
            } else {
                int failed = unreadable_as_root(cli, bad, path, i);
                if (failed < 0)
                    printf("note: unreadable manifest not tried: root here cannot give up "
                           "reading every file\n");
                else
                    CHECK(failed == 0, "unreadable manifest, as root without "
                                       "CAP_DAC_OVERRIDE: %d failures", failed);
            }
            chmod(path, 0644);
            continue;
        }
        if (bad_manifests[i].text)
            CHECK(write_text(path, bad_manifests[i].text, strlen(bad_manifests[i].text)) == 0,
                  "write %s", path);
        else
            CHECK(write_text(path, good, cut) == 0, "write %s", path);
        bad_manifest_case(cli, bad, i);
    }
    CHECK(write_text(path, good, len) == 0, "restore %s", path);
    CHECK(compile_from(cli, bad, out, sizeof out) == 0 && strstr(out, "bundle"),
          "the restored copy: %s", out);
}

/* A bundle whose manifest has the version 1 magic (an arch number where the
 * target's name now is): verify, manifest reads and the runtime refuse it,
 * saying it must be rebuilt. */
static void test_old_manifest(const char *cli, const char *bundle, const char *root) {
    char old[512], cmd[2048], out[8192], err[512], path[600];
    snprintf(old, sizeof old, "%s/old", root);
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", bundle, old);
    CHECK(system(cmd) == 0, "copy the bundle");
    snprintf(path, sizeof path, "%s/manifest.tsv", old);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "rewrite %s", path);
    if (!f) return;
    fputs("#flashgen-bundle 1\n", f);
    fputs("forward\tfp16_d96_causal\tfg_fwd_sm75_x\tBr=64,Bc=64,warps=4,stages=1\t75\t", f);
    for (int i = 0; i < 2; i++) fprintf(f, "%064d\t", 0);
    fputs("0.1.0\t13.0\t1\tkept\n", f);
    fclose(f);
    bundle_verify_result r;
    int rc = bundle_verify(old, FLASHGEN_VERSION, NULL, NULL, NULL, &r, err, sizeof err);
    CHECK(rc == -1 && strstr(err, "older flashgen") && strstr(err, "rebuild"),
          "old manifest: rc %d %s", rc, err);
    bundle_entry *e = NULL;
    size_t n = 0;
    CHECK(bundle_manifest_read(old, &e, &n, err, sizeof err) == -1 && e == NULL &&
              strstr(err, "older flashgen"),
          "old manifest read: %s", err);
    snprintf(cmd, sizeof cmd, "'%s' bundle verify '%s' 2>&1", cli, old);
    CHECK(run_command(cmd, out, sizeof out) == 1 && strstr(out, "older flashgen"),
          "flashgen bundle verify of an old bundle: %s", out);
    cache_store s;
    CHECK(bundle_open(&s, old, err, sizeof err) == -1 && strstr(err, "older flashgen"),
          "bundle_open of an old bundle: %s", err);

    /* A newer version, and no magic at all, are refused too. */
    f = fopen(path, "w");
    if (f) {
        fputs("#flashgen-bundle 9\n", f);
        fclose(f);
    }
    CHECK(bundle_verify(old, FLASHGEN_VERSION, NULL, NULL, NULL, &r, err, sizeof err) == -1 &&
              strstr(err, "newer flashgen"),
          "newer manifest: %s", err);
    f = fopen(path, "w");
    if (f) {
        fputs("pass\tspec\n", f);
        fclose(f);
    }
    CHECK(bundle_verify(old, FLASHGEN_VERSION, NULL, NULL, NULL, &r, err, sizeof err) == -1 &&
              strstr(err, "not a flashgen bundle manifest"),
          "no magic: %s", err);
}

/* The test's folder, removed at exit however the test ends (children are
 * exec'd, so they never run this); FLASHGEN_TEST_KEEP=1 keeps it. */
static char root[] = "/tmp/fg_bundle_test.XXXXXX";

static void remove_root(void) {
    const char *keep = getenv("FLASHGEN_TEST_KEEP");
    if (keep && strcmp(keep, "1") == 0) {
        fprintf(stderr, "kept %s (FLASHGEN_TEST_KEEP=1)\n", root);
        return;
    }
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "--child") == 0) {
        if (strcmp(argv[2], "offline") == 0) return child_offline(argv[3]);
        if (strcmp(argv[2], "sparse") == 0) return child_sparse();
        if (strcmp(argv[2], "offline-damaged") == 0) return child_offline_damaged(argv[3]);
        if (strcmp(argv[2], "online-damaged") == 0) return child_online_damaged(argv[3]);
        return 2;
    }
    if (argc != 2) {
        fprintf(stderr, "usage: test_bundle PATH-TO-flashgen\n");
        return 2;
    }
    const char *cli = argv[1];
    test_manifest_lines();

    char err[512];
    if (nvrtc_lib_load(err, sizeof err) != 0) {
        /* Building a bundle needs NVRTC; the CPU machines have it. */
        fprintf(stderr, "NVRTC: %s\n", err);
        return 1;
    }
    int major = 0, minor = 0;
    nvrtc_lib_version(&major, &minor);
    char nvrtc_text[16];
    snprintf(nvrtc_text, sizeof nvrtc_text, "%d.%d", major, minor);

    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    atexit(remove_root);
    char bundle[256], cache1[256], cache2[256], cmd[2048], out[65536];
    snprintf(bundle, sizeof bundle, "%s/bundle", root);
    snprintf(cache1, sizeof cache1, "%s/cache-offline", root);
    snprintf(cache2, sizeof cache2, "%s/cache-online", root);

    /* ---- build ---- */
    snprintf(cmd, sizeof cmd, "'%s' %s --out '%s' 2>&1", cli, build_args, bundle);
    int rc = run_command(cmd, out, sizeof out);
    CHECK(rc == 0, "bundle build exited %d", rc);
    CHECK(strstr(out, "combinations skipped on t4: --dtypes: bf16 needs sm_80") != NULL,
          "no note on bf16 and t4");
    CHECK(strstr(out, "[6/6] ") != NULL, "no progress up to 6 of 6");
    CHECK(strstr(out, "FAILED") == NULL, "a kernel failed");

    bundle_entry *entries = NULL;
    size_t n = 0;
    CHECK(bundle_manifest_read(bundle, &entries, &n, err, sizeof err) == 0, "%s", err);
    int kept = 0, replayed = 0;
    for (size_t i = 0; i < n; i++) {
        char path[1024], sha[65];
        entry_path(bundle, &entries[i], path, sizeof path);
        CHECK(bundle_file_sha256(path, sha, err, sizeof err) == 0 &&
                  strcmp(sha, entries[i].sha256) == 0,
              "%s: sha256 differs from the manifest", path);
        CHECK(strcmp(entries[i].nvrtc, nvrtc_text) == 0, "nvrtc %s", entries[i].nvrtc);
        CHECK(strcmp(entries[i].target, "sm_86") == 0 || strcmp(entries[i].target, "sm_75") == 0,
              "target %s", entries[i].target);
        /* the plan column is its family's tiling, as tuning.tsv writes it */
        const kernel_family *family = NULL;
        family_tiling tiling;
        CHECK(family_choice_parse(entries[i].plan, &family, &tiling) == 0 &&
                  strcmp(pass_name(family->pass), entries[i].pass) == 0,
              "plan %s of a %s entry", entries[i].plan, entries[i].pass);
        kept += strcmp(entries[i].step, "kept") == 0;
        replayed += strcmp(entries[i].step, "replayed") == 0;
    }
    CHECK(kept == CASE_COUNT, "%d kept entries, want %d", kept, CASE_COUNT);
    /* If the planner changes so nothing spills, pick a spec that does: the
     * replay of spilled steps without NVRTC is what this covers. */
    CHECK(replayed >= 1, "no replayed (spilled) step in the bundle");
    CHECK(count_files(bundle) == (int)n, "%d files for %zu manifest lines", count_files(bundle), n);
    for (int i = 0; i < CASE_COUNT; i++)
        CHECK(kept_entry(entries, n, &cases[i]) != NULL, "case %d not in the manifest", i);
    CHECK(count_files(bundle) > 0 && access(bundle, W_OK) == 0, "bundle folder");

    verdicts v;
    verify(bundle, NULL, &v);
    CHECK(v.ok == (int)n && v.rejected == 0 && v.skipped == 0, "pristine: %s", v.notes);
    int sm75 = 0;
    for (size_t i = 0; i < n; i++) sm75 += strcmp(entries[i].target, "sm_75") == 0;
    verify(bundle, "sm_75", &v);
    CHECK(sm75 >= 2 && v.ok == sm75 && v.skipped == (int)n - sm75 &&
              strstr(v.notes, "for sm_86, not sm_75"),
          "only sm_75: %s", v.notes);
    snprintf(cmd, sizeof cmd, "'%s' bundle verify '%s' 2>&1", cli, bundle);
    CHECK(run_command(cmd, out, sizeof out) == 0, "verify of a good bundle failed");
    snprintf(cmd, sizeof cmd, "'%s' bundle verify '%s' --target t4 --verbose 2>&1", cli, bundle);
    CHECK(run_command(cmd, out, sizeof out) == 0 && strstr(out, "ok       line") &&
              strstr(out, " sm_75 fg_") && strstr(out, "for sm_86, not sm_75"),
          "verify --target t4: %s", out);
    /* sm_90a is a target of its own: none of these entries are for it */
    verify(bundle, "sm_90a", &v);
    CHECK(v.ok == 0 && v.skipped == (int)n && v.rejected == 0, "only sm_90a: %s", v.notes);
    bundle_verify_result vr;
    CHECK(bundle_verify(bundle, FLASHGEN_VERSION, "../sm_75", NULL, NULL, &vr, err,
                        sizeof err) == -1 &&
              strstr(err, "not a target name"),
          "a path as only_target: %s", err);
    /* The generator version is the caller's: for another one, nothing is
     * looked up and everything is skipped. */
    memset(&v, 0, sizeof v);
    CHECK(bundle_verify(bundle, "9.9.9", NULL, collect, &v, &vr, err, sizeof err) == 0 &&
              vr.ok == 0 && vr.rejected == 0 && vr.skipped == n &&
              strstr(v.notes, "this is 9.9.9"),
          "another generator: %zu ok %zu skipped\n%s", vr.ok, vr.skipped, v.notes);
    CHECK(bundle_verify(bundle, "", NULL, NULL, NULL, &vr, err, sizeof err) == -1 &&
              bundle_verify(bundle, NULL, NULL, NULL, NULL, &vr, err, sizeof err) == -1,
          "no generator version accepted");

    /* ---- offline round trip ---- */
    char env_bundle[512], env_cache1[512], env_cache2[512];
    snprintf(env_bundle, sizeof env_bundle, "FLASHGEN_BUNDLE_PATH=%s", bundle);
    snprintf(env_cache1, sizeof env_cache1, "FLASHGEN_CACHE_DIR=%s", cache1);
    snprintf(env_cache2, sizeof env_cache2, "FLASHGEN_CACHE_DIR=%s", cache2);
    const char *offline[] = {"FLASHGEN_NVRTC=/nonexistent", env_bundle, env_cache1, "FLASHGEN_CACHE",
                             NULL};
    CHECK(run_child("offline", bundle, offline) == 0, "offline round trip");
    CHECK(count_files(cache1) == 0, "the offline run wrote to the user cache");
    test_bad_manifests(cli, bundle, root);

    /* ---- sparse kinds: built on request, loaded without NVRTC ---- */
    char sparse[256], env_sparse[512], env_cache3[512];
    snprintf(sparse, sizeof sparse, "%s/sparse", root);
    snprintf(env_sparse, sizeof env_sparse, "FLASHGEN_BUNDLE_PATH=%s", sparse);
    snprintf(env_cache3, sizeof env_cache3, "FLASHGEN_CACHE_DIR=%s/cache-sparse", root);
    snprintf(cmd, sizeof cmd, "'%s' %s --out '%s' 2>&1", cli, sparse_build_args, sparse);
    CHECK(run_command(cmd, out, sizeof out) == 0 && strstr(out, "[12/12] "), "sparse build: %s", out);
    const char *sparse_env[] = {"FLASHGEN_NVRTC=/nonexistent", env_sparse, env_cache3, "FLASHGEN_CACHE",
                                NULL};
    CHECK(run_child("sparse", sparse, sparse_env) == 0, "sparse kernels from the bundle");
    /* ---- h100: the Hopper forward, and the family a call it declines runs on ---- */
    char hopper[300];
    snprintf(hopper, sizeof hopper, "%s/hopper", root);
    snprintf(cmd, sizeof cmd,
             "'%s' bundle build --target h100 --head-dims 64 --dtypes bf16 --masks causal "
             "--dropout off --passes forward --out '%s' 2>&1",
             cli, hopper);
    CHECK(run_command(cmd, out, sizeof out) == 0 && strstr(out, "[1/1] fg_fwd_sm90a_") &&
              strstr(out, " + fg_fwd_sm90_"),
          "h100 build: %s", out);
    bundle_entry *hop = NULL;
    size_t hop_n = 0;
    int sm90a = 0, sm80 = 0;
    CHECK(bundle_manifest_read(hopper, &hop, &hop_n, err, sizeof err) == 0, "%s", err);
    for (size_t i = 0; i < hop_n; i++) {
        CHECK(strcmp(hop[i].step, "kept") == 0 && strcmp(hop[i].spec, "bf16_d64_causal") == 0,
              "h100 entry %s %s", hop[i].kernel, hop[i].step);
        sm90a += strcmp(hop[i].target, "sm_90a") == 0 && strncmp(hop[i].plan, "fwd_sm90a:", 10) == 0;
        sm80 += strcmp(hop[i].target, "sm_90") == 0 && strncmp(hop[i].plan, "fwd_sm80:", 9) == 0;
    }
    CHECK(hop_n == 2 && sm90a == 1 && sm80 == 1, "h100 bundle: %zu entries, %d sm_90a, %d sm_90",
          hop_n, sm90a, sm80);
    free(hop);

    snprintf(cmd, sizeof cmd, "'%s' bundle build --out '%s' --sparsity layout --sparse-blocks 40x64 2>&1",
             cli, sparse);
    CHECK(run_command(cmd, out, sizeof out) != 0 && strstr(out, "40 x 64"),
          "a bad sparse block was not refused: %s", out);

    /* ---- damage one entry, put another arch's kernel in place of a second ---- */
    const bundle_entry *damaged = kept_entry(entries, n, &cases[DAMAGED_CASE]);
    const bundle_entry *victim = kept_entry(entries, n, &cases[WRONG_ARCH_CASE]);
    bundle_case donor_case = cases[WRONG_ARCH_CASE];
    donor_case.profile = "rtx3090", donor_case.target = "sm_86";
    const bundle_entry *donor = kept_entry(entries, n, &donor_case);
    CHECK(damaged && victim && donor, "entries to damage");
    if (!damaged || !victim || !donor) return check_summary("test_bundle");
    char path[1024], victim_path[1024], donor_path[1024], stray[1024];
    entry_path(bundle, damaged, path, sizeof path);
    int fd = open(path, O_RDWR);
    struct stat st;
    CHECK(fd >= 0 && fstat(fd, &st) == 0, "open %s", path);
    unsigned char byte = 0;
    off_t at = st.st_size / 2; /* inside the cubin */
    CHECK(pread(fd, &byte, 1, at) == 1, "read");
    byte ^= 0x01;
    CHECK(pwrite(fd, &byte, 1, at) == 1, "write");
    close(fd);

    entry_path(bundle, victim, victim_path, sizeof victim_path);
    entry_path(bundle, donor, donor_path, sizeof donor_path);
    CHECK(copy_file(donor_path, victim_path) == 0, "copy over");
    /* and one copied in under its own key: a file no sm_75 key names */
    snprintf(stray, sizeof stray, "%s/sm_75/%s.fgc", bundle, donor->key);
    CHECK(copy_file(donor_path, stray) == 0, "copy in");

    verify(bundle, NULL, &v);
    CHECK(v.rejected == 3 && v.ok == (int)n - 2, "after damage: %d ok %d rejected\n%s", v.ok,
          v.rejected, v.notes);
    CHECK(strstr(v.notes, damaged->key) && strstr(v.notes, "damaged or replaced"),
          "damaged entry not named: %s", v.notes);
    CHECK(strstr(v.notes, "not in the manifest, and it holds fg_fwd_sm86"),
          "stray sm_86 kernel in sm_75 not rejected: %s", v.notes);
    snprintf(cmd, sizeof cmd, "'%s' bundle verify '%s' 2>&1", cli, bundle);
    CHECK(run_command(cmd, out, sizeof out) == 1 && strstr(out, "REJECTED"),
          "verify of a damaged bundle did not fail");

    /* A manifest that vouches for the swapped file (its true sha256) still
     * does not make an sm_86 kernel acceptable in sm_75. */
    bundle_entry *forged = malloc((n + 2) * sizeof *forged);
    CHECK(forged != NULL, "malloc");
    if (!forged) return check_summary("test_bundle");
    memcpy(forged, entries, n * sizeof *forged);
    for (size_t i = 0; i < n; i++)
        if (strcmp(forged[i].key, victim->key) == 0)
            bundle_file_sha256(victim_path, forged[i].sha256, err, sizeof err);
    /* and entries from another generator and format: skipped, not rejected */
    forged[n] = entries[0];
    snprintf(forged[n].generator, sizeof forged[n].generator, "0.0.1-old");
    forged[n + 1] = entries[0];
    forged[n + 1].format = 99;
    CHECK(bundle_manifest_write(bundle, forged, n + 2, err, sizeof err) == 0, "%s", err);
    verify(bundle, NULL, &v);
    CHECK(v.rejected == 3 && v.skipped == 2, "forged manifest: %d rejected %d skipped\n%s",
          v.rejected, v.skipped, v.notes);
    CHECK(strstr(v.notes, "not a kernel for sm_75") && strstr(v.notes, "generator 0.0.1-old") &&
              strstr(v.notes, "format 99"),
          "notes: %s", v.notes);
    free(forged);

    CHECK(run_child("offline-damaged", bundle, offline) == 0, "bad entries loaded offline");
    const char *online[] = {"FLASHGEN_NVRTC", env_bundle, env_cache2, "FLASHGEN_CACHE", NULL};
    CHECK(run_child("online-damaged", bundle, online) == 0, "bad entries with NVRTC");
    /* the bundle is read-only to its users: the damage is still there */
    char sha[65];
    CHECK(bundle_file_sha256(path, sha, err, sizeof err) == 0 && strcmp(sha, damaged->sha256) != 0,
          "the damaged entry was rewritten");

    test_old_manifest(cli, bundle, root);

    free(entries);
    int result = check_summary("test_bundle");
    if (result != 0) fprintf(stderr, "FLASHGEN_TEST_KEEP=1 keeps the test's folder for inspection\n");
    return result;
}
