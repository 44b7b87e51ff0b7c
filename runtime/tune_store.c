/* Tuned choices: the context's table and tuning.tsv, in the kernel cache
 * folder, one choice per line, tab-separated:
 *   gpu name, arch, driver version, NVRTC version, pass ("forward" or
 *   "backward"), spec, bucket, chosen, derived ("family:tiling", the tiling
 *   as its family writes it, e.g. "fwd_sm80:2,4,64"),
 *   derived ms, chosen ms, spread
 * A context reads the lines of its own GPU, driver and NVRTC once, on the
 * first call that asks; lines naming a family or tiling this build does not
 * know are passed over (they are re-tuned). Saving rewrites the file under a
 * temporary name and renames it into place, so readers never see half a
 * file; two processes tuning at once may lose one of their lines (the last
 * rename wins), which costs a re-tune, never a wrong plan. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gen/spec.h"
#include "runtime/runtime.h"

#define FIELDS 12

int tune_bucket(int seqlen) {
    int b = 512;
    while (b < seqlen && b < 32768) b *= 2;
    return b;
}

/* "name\tarch\tdriver": the part of a line's identity known without NVRTC. */
static void device_identity(fg_context *ctx, char *out, size_t len) {
    char name[sizeof ctx->profile.name];
    snprintf(name, sizeof name, "%s", ctx->profile.name);
    for (char *c = name; *c; c++)
        if (*c == '\t' || *c == '\n') *c = ' ';
    int driver = 0;
    if (ctx->cu) ctx->cu->cuDriverGetVersion(&driver);
    snprintf(out, len, "%s\t%d\t%d", name, ctx->profile.arch, driver);
}

static void nvrtc_identity(char *out, size_t len) {
    char err[512];
    int major = 0, minor = 0;
    if (nvrtc_lib_load(err, sizeof err) != 0 || nvrtc_lib_version(&major, &minor) != 0)
        snprintf(out, len, "none");
    else
        snprintf(out, len, "%d.%d", major, minor);
}

static int tuning_path(const fg_context *ctx, char *path, size_t len) {
    if (ctx->cache_disabled || !ctx->store.root[0]) return -1;
    int n = snprintf(path, len, "%s/tuning.tsv", ctx->store.root);
    return n > 0 && (size_t)n < len ? 0 : -1;
}

/* "family:tiling" -> a choice of a family that runs `pass`. */
static int parse_choice(fg_pass pass, const char *text, tune_choice *c) {
    return family_choice_parse(text, &c->family, &c->tiling) == 0 && c->family->pass == pass ? 0
                                                                                            : -1;
}

/* Split a line at tabs in place; returns the number of fields. */
static int split(char *line, char **field, int max) {
    int n = 0;
    char *p = line;
    while (n < max) {
        field[n++] = p;
        p = strchr(p, '\t');
        if (!p) break;
        *p++ = '\0';
    }
    return p ? -1 : n; /* more fields than max: not ours */
}

static int parse_entry(char **f, tune_entry *e) {
    memset(e, 0, sizeof *e);
    if (strcmp(f[4], "forward") == 0) e->pass = FG_PASS_FORWARD;
    else if (strcmp(f[4], "backward") == 0) e->pass = FG_PASS_BACKWARD;
    else return -1;
    snprintf(e->spec, sizeof e->spec, "%s", f[5]);
    e->bucket = atoi(f[6]);
    if (parse_choice(e->pass, f[7], &e->chosen) || parse_choice(e->pass, f[8], &e->derived))
        return -1;
    e->derived_ms = atof(f[9]), e->chosen_ms = atof(f[10]), e->spread = atof(f[11]);
    return e->bucket > 0 ? 0 : -1;
}

static tune_entry *find_entry(tune_table *t, const char *spec, fg_pass pass, int bucket) {
    for (int i = 0; i < t->count; i++) {
        tune_entry *e = &t->entries[i];
        if (e->pass == pass && e->bucket == bucket && strcmp(e->spec, spec) == 0) return e;
    }
    return NULL;
}

static int put_entry(tune_table *t, const tune_entry *e) {
    tune_entry *old = find_entry(t, e->spec, e->pass, e->bucket);
    if (old) {
        *old = *e;
        return 0;
    }
    if (t->count == t->capacity) {
        int cap = t->capacity ? 2 * t->capacity : 16;
        tune_entry *grown = realloc(t->entries, (size_t)cap * sizeof *grown);
        if (!grown) return -1;
        t->entries = grown;
        t->capacity = cap;
    }
    t->entries[t->count++] = *e;
    return 0;
}

static void tune_load(fg_context *ctx) {
    tune_table *t = &ctx->tuning;
    t->loaded = 1;
    char path[1100];
    if (tuning_path(ctx, path, sizeof path)) return;
    FILE *f = fopen(path, "r");
    if (!f) return;
    char device[256], nvrtc[32] = "", line[1024];
    device_identity(ctx, device, sizeof device);
    size_t dlen = strlen(device);
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        if (strncmp(line, device, dlen) != 0 || line[dlen] != '\t') continue;
        char *field[FIELDS];
        if (split(line, field, FIELDS) != FIELDS) continue;
        if (!nvrtc[0]) nvrtc_identity(nvrtc, sizeof nvrtc); /* only once a line is this GPU's */
        tune_entry e;
        if (strcmp(field[3], nvrtc) != 0 || parse_entry(field, &e)) continue;
        put_entry(t, &e);
    }
    fclose(f);
}

/* Rewrite the file with e in place of any line for the same GPU, driver,
 * NVRTC, pass, spec and bucket. Returns 0 when saved. */
static int tune_save(fg_context *ctx, const tune_entry *e) {
    char path[1100], tmp[1200];
    if (tuning_path(ctx, path, sizeof path) || !ctx->store.writable) return -1;
    static atomic_uint counter; /* contexts on several threads may save at once */
    snprintf(tmp, sizeof tmp, "%s/.tmp.tuning.%ld.%u", ctx->store.root, (long)getpid(),
             atomic_fetch_add(&counter, 1u));
    FILE *out = fopen(tmp, "w");
    if (!out) return -1;
    char id[400], nvrtc[32], line[1024];
    device_identity(ctx, id, sizeof id);
    nvrtc_identity(nvrtc, sizeof nvrtc);
    size_t n = strlen(id);
    snprintf(id + n, sizeof id - n, "\t%s\t%s\t%s\t%d\t", nvrtc, pass_name(e->pass), e->spec,
             e->bucket);
    FILE *in = fopen(path, "r");
    while (in && fgets(line, sizeof line, in))
        if (strncmp(line, id, strlen(id)) != 0 && strchr(line, '\n')) fputs(line, out);
    if (in) fclose(in);
    char chosen[128], derived[128];
    family_choice_format(e->chosen.family, &e->chosen.tiling, chosen, sizeof chosen);
    family_choice_format(e->derived.family, &e->derived.tiling, derived, sizeof derived);
    fprintf(out, "%s%s\t%s\t%.6f\t%.6f\t%.6f\n", id, chosen, derived, e->derived_ms,
            e->chosen_ms, e->spread);
    int ok = fflush(out) == 0 && fsync(fileno(out)) == 0;
    ok = fclose(out) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

static int same_choice(const tune_choice *a, const tune_choice *b) {
    return a->family == b->family && memcmp(&a->tiling, &b->tiling, sizeof a->tiling) == 0;
}

const tune_choice *tune_lookup(fg_context *ctx, fg_pass pass, const fg_spec *s, int seqlen) {
    tune_table *t = &ctx->tuning;
    if (t->disabled) return NULL;
    if (!t->loaded) tune_load(ctx);
    if (t->count == 0) return NULL;
    char name[96];
    spec_name(s, name, sizeof name);
    const tune_entry *e = find_entry(t, name, pass, tune_bucket(seqlen));
    if (!e || same_choice(&e->chosen, &e->derived)) return NULL;
    return &e->chosen;
}

fg_status tune_keep(fg_context *ctx, const tune_entry *e, int *persisted) {
    *persisted = 0;
    if (!ctx->tuning.loaded) tune_load(ctx);
    if (put_entry(&ctx->tuning, e) != 0)
        return fg_fail(ctx, FG_ERR_OUT_OF_MEMORY, "tuning table: out of memory");
    *persisted = tune_save(ctx, e) == 0;
    return FG_OK;
}

void tune_release(fg_context *ctx) {
    free(ctx->tuning.entries);
    memset(&ctx->tuning, 0, sizeof ctx->tuning);
}

void fg_context_set_tuning(fg_context *ctx, int on) {
    if (ctx) ctx->tuning.disabled = !on;
}

/* The figures of a choice, planned again by its family. */
static void info_of(fg_context *ctx, const fg_spec *s, const tune_choice *c, fg_plan_info *out) {
    char err[256];
    family_plan p;
    memset(out, 0, sizeof *out);
    if (c->family->plan_tiling(s, &ctx->profile, &c->tiling, &p, err, sizeof err) == 0)
        c->family->describe(&p, out);
    out->why[0] = '\0';
}

void tune_report_of(fg_context *ctx, const fg_spec *s, const tune_entry *e, fg_tune_report *out) {
    memset(out, 0, sizeof *out);
    out->seqlen_bucket = e->bucket;
    out->chosen_is_derived = same_choice(&e->chosen, &e->derived);
    info_of(ctx, s, &e->derived, &out->derived);
    info_of(ctx, s, &e->chosen, &out->chosen);
    out->derived_ms = e->derived_ms, out->chosen_ms = e->chosen_ms, out->spread = e->spread;
}

fg_status tune_args(fg_context *ctx, const fg_spec *spec, fg_pass pass, const void *out,
                    fg_spec *s, const kernel_family **family) {
    if (!ctx) return fg_fail(NULL, FG_ERR_INVALID_ARGUMENT, "ctx: NULL context");
    if (!out) return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "out: NULL");
    if (!spec) return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "spec: NULL");
    if (pass == FG_PASS_BLOCK_MASK)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "pass: a block mask's build has no tilings to tune");
    fg_status st = canonical_spec(ctx, spec, s);
    return st ? st : family_of(ctx, s, pass, family);
}

fg_status fg_tuned(fg_context *ctx, const fg_spec *spec, fg_pass pass, int seqlen,
                   fg_tune_report *out, int *found) {
    fg_spec s;
    const kernel_family *f;
    fg_status st = tune_args(ctx, spec, pass, out, &s, &f);
    if (st) return st;
    if (!found) return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "found: NULL");
    if (!ctx->tuning.loaded) tune_load(ctx);
    char name[96];
    spec_name(&s, name, sizeof name);
    const tune_entry *e = find_entry(&ctx->tuning, name, pass, tune_bucket(seqlen));
    *found = e != NULL;
    if (e) tune_report_of(ctx, &s, e, out);
    return FG_OK;
}
