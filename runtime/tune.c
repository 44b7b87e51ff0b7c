/* Auto-tuning of forward and backward tilings on the live GPU, and the
 * choices kept.
 *
 * tuning.tsv, in the kernel cache folder, one choice per line, tab-separated:
 *   gpu name, arch, driver version, NVRTC version, pass, spec, bucket,
 *   chosen tiling, derived tiling (forward "m_tiles,warps,block_n", backward
 *   "block_m,block_n,warps,stages,col_splits"),
 *   derived ms, chosen ms, spread
 * A context reads the lines of its own GPU, driver and NVRTC once, on the
 * first call that asks. Saving rewrites the file under a temporary name and
 * renames it into place, so readers never see half a file; two processes
 * tuning at once may lose one of their lines (the last rename wins), which
 * costs a re-tune, never a wrong plan. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gen/spec.h"
#include "runtime/runtime.h"

#define TUNE_WARMUP 3
#define TUNE_ROUNDS 15
#define TUNE_TOKENS 16384
#define TUNE_HIDDEN 2048
#define FIELDS 12

int tune_bucket(int seqlen) {
    int b = 512;
    while (b < seqlen && b < 32768) b *= 2;
    return b;
}

/* ---- the file ---- */

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

static int parse_tiling(int pass, const char *s, plan_tiling *t) {
    memset(t, 0, sizeof *t);
    if (pass == FG_PASS_BACKWARD)
        return sscanf(s, "%d,%d,%d,%d,%d", &t->block_m, &t->block_n, &t->warps, &t->stages,
                      &t->col_splits) == 5 ? 0 : -1;
    return sscanf(s, "%d,%d,%d", &t->m_tiles, &t->warps, &t->block_n) == 3 ? 0 : -1;
}

static void format_tiling(int pass, const plan_tiling *t, char *out, size_t len) {
    if (pass == FG_PASS_BACKWARD)
        snprintf(out, len, "%d,%d,%d,%d,%d", t->block_m, t->block_n, t->warps, t->stages,
                 t->col_splits);
    else
        snprintf(out, len, "%d,%d,%d", t->m_tiles, t->warps, t->block_n);
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
    snprintf(e->spec, sizeof e->spec, "%s", f[5]);
    e->pass = atoi(f[4]);
    e->bucket = atoi(f[6]);
    if (parse_tiling(e->pass, f[7], &e->chosen) || parse_tiling(e->pass, f[8], &e->derived))
        return -1;
    e->derived_ms = atof(f[9]), e->chosen_ms = atof(f[10]), e->spread = atof(f[11]);
    return e->bucket > 0 ? 0 : -1;
}

static tune_entry *find_entry(tune_table *t, const char *spec, int pass, int bucket) {
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
    snprintf(id + n, sizeof id - n, "\t%s\t%d\t%s\t%d\t", nvrtc, e->pass, e->spec, e->bucket);
    FILE *in = fopen(path, "r");
    while (in && fgets(line, sizeof line, in))
        if (strncmp(line, id, strlen(id)) != 0 && strchr(line, '\n')) fputs(line, out);
    if (in) fclose(in);
    char chosen[64], derived[64];
    format_tiling(e->pass, &e->chosen, chosen, sizeof chosen);
    format_tiling(e->pass, &e->derived, derived, sizeof derived);
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

const plan_tiling *tune_lookup(fg_context *ctx, fg_pass pass, const fg_spec *s, int seqlen) {
    tune_table *t = &ctx->tuning;
    if (t->disabled) return NULL;
    if (!t->loaded) tune_load(ctx);
    if (t->count == 0) return NULL;
    char name[96];
    spec_name(s, name, sizeof name);
    const tune_entry *e = find_entry(t, name, pass, tune_bucket(seqlen));
    if (!e || memcmp(&e->chosen, &e->derived, sizeof e->chosen) == 0) return NULL;
    return &e->chosen;
}

void tune_release(fg_context *ctx) {
    free(ctx->tuning.entries);
    memset(&ctx->tuning, 0, sizeof ctx->tuning);
}

void fg_context_set_tuning(fg_context *ctx, int on) {
    if (ctx) ctx->tuning.disabled = !on;
}

/* ---- timing on the GPU ---- */

typedef struct tune_run {
    fg_context *ctx;
    const fg_spec *spec;
    fg_pass pass;
    fg_backward_args args; /* the forward's in args.forward */
    const fg_kernel *kernels[TUNE_MAX_CANDIDATES];
    CUevent start, stop;
} tune_run;

static fg_status launch(tune_run *r, const fg_kernel *k) {
    return r->pass == FG_PASS_BACKWARD ? backward_launch(r->ctx, r->spec, &r->args, k)
                                       : forward_launch(r->ctx, r->spec, &r->args.forward, k);
}

static double time_one(void *user, int i) {
    tune_run *r = user;
    const cuda_driver *cu = r->ctx->cu;
    float ms = -1.f;
    if (cu->cuEventRecord(r->start, NULL) || launch(r, r->kernels[i]) ||
        cu->cuEventRecord(r->stop, NULL) || cu->cuEventSynchronize(r->stop) ||
        cu->cuEventElapsedTime(&ms, r->start, r->stop))
        return -1.0;
    return ms;
}

/* Random 16-bit floats in ±[0.25, 1): sign, one of two exponents, mantissa. */
static void random_fill(uint16_t *h, size_t n, fg_dtype dtype, uint64_t *state) {
    for (size_t i = 0; i < n; i++) {
        *state = *state * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t r = (uint32_t)(*state >> 33);
        h[i] = dtype == FG_BF16
                   ? (uint16_t)((r & 0x8000u) | (uint32_t)(125 + (r >> 16 & 1)) << 7 | (r & 0x7fu))
                   : (uint16_t)((r & 0x8000u) | (uint32_t)(13 + (r >> 16 & 1)) << 10 | (r & 0x3ffu));
    }
}

static float half_value(uint16_t h, fg_dtype dtype) {
    if (dtype == FG_BF16) {
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, sizeof f);
        return f;
    }
    int e = (h >> 10) & 31, m = h & 1023;
    float f = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY)
                                                       : ldexpf((float)(m | 1024), e - 25);
    return h & 0x8000 ? -f : f;
}

/* Outputs of two tilings differ only in the order of fp32 sums and the last
 * rounding: a few units in the last place. The forward's values are below 1;
 * gradients may be larger, so theirs are compared relative to their size
 * too (rel 1/32: four units in the last place of bf16). */
static int same_output(const uint16_t *a, const uint16_t *b, size_t n, fg_dtype dtype, float rel) {
    for (size_t i = 0; i < n; i++) {
        float x = half_value(a[i], dtype), y = half_value(b[i], dtype);
        if (!(fabsf(x - y) <= 1.f / 32 + rel * fabsf(x))) return 0;
    }
    return 1;
}

static void fill_info(fg_context *ctx, const fg_spec *s, int pass, const plan_tiling *t,
                      fg_plan_info *out) {
    char err[256];
    memset(out, 0, sizeof *out);
    if (pass == FG_PASS_BACKWARD) {
        fg_bwd_plan p;
        if (plan_backward_tiling(s, &ctx->profile, t, &p, err, sizeof err) != 0) return;
        out->block_m = p.block_m, out->block_n = p.block_n, out->warps = p.warps;
        out->stages = p.stages, out->head_dim_padded = p.head_dim_padded;
        out->smem_bytes = p.smem_bytes, out->threads = p.threads;
        return;
    }
    fg_fwd_plan p;
    if (plan_forward_tiling(s, &ctx->profile, t, &p, err, sizeof err) != 0) return;
    out->block_m = p.block_m, out->block_n = p.block_n, out->warps = p.warps;
    out->stages = p.stages, out->head_dim_padded = p.head_dim_padded;
    out->smem_bytes = p.smem_bytes, out->threads = p.threads;
}

static void report_of(fg_context *ctx, const fg_spec *s, const tune_entry *e, fg_tune_report *out) {
    memset(out, 0, sizeof *out);
    out->seqlen_bucket = e->bucket;
    out->chosen_is_derived = memcmp(&e->chosen, &e->derived, sizeof e->chosen) == 0;
    fill_info(ctx, s, e->pass, &e->derived, &out->derived);
    fill_info(ctx, s, e->pass, &e->chosen, &out->chosen);
    out->derived_ms = e->derived_ms, out->chosen_ms = e->chosen_ms, out->spread = e->spread;
}

static fg_status tune_args(fg_context *ctx, fg_spec *s, const fg_spec *spec, fg_pass pass,
                           void *out) {
    char err[512];
    if (!ctx) return fg_fail(NULL, FG_ERR_INVALID_ARGUMENT, "ctx: NULL context");
    if (!out) return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "out: NULL");
    if (!spec) return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "spec: NULL");
    if (spec_canonicalize(spec, s, err, sizeof err) != 0)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "%s", err);
    if (pass != FG_PASS_FORWARD && pass != FG_PASS_BACKWARD)
        return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT,
                       "pass: %d is not FG_PASS_FORWARD or FG_PASS_BACKWARD", (int)pass);
    return check_spec_for_target(ctx, s);
}

fg_status fg_tuned(fg_context *ctx, const fg_spec *spec, fg_pass pass, int seqlen,
                   fg_tune_report *out, int *found) {
    fg_spec s;
    fg_status st = tune_args(ctx, &s, spec, pass, out);
    if (st) return st;
    if (!found) return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "found: NULL");
    if (!ctx->tuning.loaded) tune_load(ctx);
    char name[96];
    spec_name(&s, name, sizeof name);
    const tune_entry *e = find_entry(&ctx->tuning, name, pass, tune_bucket(seqlen));
    *found = e != NULL;
    if (e) report_of(ctx, &s, e, out);
    return FG_OK;
}

/* Device buffers of one tuning problem. */
typedef struct tune_buffers {
    CUdeviceptr q, k, v, o, lse;
    CUdeviceptr d_o, grad[3]; /* backward: dO in; dQ, dK, dV out */
    fg_layout *layout;
} tune_buffers;

static void free_buffers(fg_context *ctx, tune_buffers *b) {
    CUdeviceptr *all[] = {&b->q, &b->k, &b->v, &b->o, &b->lse,
                          &b->d_o, &b->grad[0], &b->grad[1], &b->grad[2]};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (*all[i]) ctx->cu->cuMemFree(*all[i]);
    fg_layout_destroy(b->layout);
}

/* The problem a bucket is timed on: seqlen = the bucket, batch filling 16k
 * tokens, hidden size 2048, dropout 0.1, a 256-key window, a random layout
 * keeping half the blocks (and the diagonal). The backward's adds a random
 * dO, and O and the log-sum-exp from one forward call. */
static fg_status setup_problem(fg_context *ctx, const fg_spec *s, fg_pass pass, int bucket,
                               tune_buffers *b, fg_backward_args *ba, uint16_t **host,
                               size_t *elems) {
    fg_forward_args *a = &ba->forward;
    const cuda_driver *cu = ctx->cu;
    int seqlen = bucket, batch = bucket >= TUNE_TOKENS ? 1 : TUNE_TOKENS / bucket;
    int heads = TUNE_HIDDEN / s->head_dim > 0 ? TUNE_HIDDEN / s->head_dim : 1;
    size_t n = (size_t)batch * seqlen * heads * s->head_dim;
    *elems = n;
    *a = fg_forward_args_default();
    a->batch = batch, a->heads_q = a->heads_kv = heads, a->seqlen_q = a->seqlen_k = seqlen;
    if (s->dropout) a->dropout_p = 0.1f, a->seed = 1234, a->offset = 0;
    if (s->mask == FG_MASK_WINDOW) a->window_left = 256, a->window_right = 0;
    fg_status st;
    CUdeviceptr *t[] = {&b->q, &b->k, &b->v, &b->o};
    for (int i = 0; i < 4; i++)
        if ((st = fg_cuda_check(ctx, cu->cuMemAlloc(t[i], n * 2), "cuMemAlloc(tuning inputs)")))
            return st;
    if ((st = fg_cuda_check(ctx, cu->cuMemAlloc(&b->lse, (size_t)batch * heads * seqlen * 4),
                            "cuMemAlloc(tuning lse)")))
        return st;
    *host = malloc(n * 2 * (pass == FG_PASS_BACKWARD ? 3 : 1)); /* inputs, then outputs */
    if (!*host) return fg_fail(ctx, FG_ERR_OUT_OF_MEMORY, "tuning: out of host memory");
    uint64_t state = 0x9e3779b97f4a7c15ull ^ (uint64_t)bucket;
    for (int i = 0; i < 3; i++) { /* fresh inputs: q, k, v */
        random_fill(*host, n, s->dtype, &state);
        if ((st = fg_cuda_check(ctx, cu->cuMemcpyHtoD(*t[i], *host, n * 2), "cuMemcpyHtoD(tuning)")))
            return st;
    }
    if (s->sparsity == FG_SPARSE_LAYOUT) {
        int bq = (seqlen + s->sparse_block_q - 1) / s->sparse_block_q;
        int bk = (seqlen + s->sparse_block_k - 1) / s->sparse_block_k;
        uint8_t *mask = malloc((size_t)bq * bk);
        if (!mask) return fg_fail(ctx, FG_ERR_OUT_OF_MEMORY, "tuning: out of host memory");
        for (int i = 0; i < bq * bk; i++) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            mask[i] = (state >> 40 & 1) || i / bk == i % bk;
        }
        st = fg_layout_create(ctx, mask, 1, bq, bk, &b->layout);
        free(mask);
        if (st) return st;
        a->layout = b->layout;
    }
    a->q = fg_tensor_bshd((void *)(uintptr_t)b->q, seqlen, heads, s->head_dim);
    a->k = fg_tensor_bshd((void *)(uintptr_t)b->k, seqlen, heads, s->head_dim);
    a->v = fg_tensor_bshd((void *)(uintptr_t)b->v, seqlen, heads, s->head_dim);
    a->o = fg_tensor_bshd((void *)(uintptr_t)b->o, seqlen, heads, s->head_dim);
    a->lse = (float *)(uintptr_t)b->lse;
    if ((st = check_forward_args(ctx, s, a)) || pass != FG_PASS_BACKWARD) return st;

    if ((st = fg_forward(ctx, s, a))) return st;
    CUdeviceptr *g[] = {&b->d_o, &b->grad[0], &b->grad[1], &b->grad[2]};
    for (int i = 0; i < 4; i++)
        if ((st = fg_cuda_check(ctx, cu->cuMemAlloc(g[i], n * 2), "cuMemAlloc(tuning gradients)")))
            return st;
    random_fill(*host, n, s->dtype, &state);
    if ((st = fg_cuda_check(ctx, cu->cuMemcpyHtoD(b->d_o, *host, n * 2), "cuMemcpyHtoD(tuning)")))
        return st;
    ba->d_o = fg_tensor_bshd((void *)(uintptr_t)b->d_o, seqlen, heads, s->head_dim);
    ba->d_q = fg_tensor_bshd((void *)(uintptr_t)b->grad[0], seqlen, heads, s->head_dim);
    ba->d_k = fg_tensor_bshd((void *)(uintptr_t)b->grad[1], seqlen, heads, s->head_dim);
    ba->d_v = fg_tensor_bshd((void *)(uintptr_t)b->grad[2], seqlen, heads, s->head_dim);
    return FG_OK;
}

/* Copy the outputs a candidate produced: O, or dQ, dK and dV one after the
 * other (elems each). */
static fg_status read_outputs(fg_context *ctx, fg_pass pass, const tune_buffers *b, size_t elems,
                              uint16_t *out) {
    const CUdeviceptr *src = pass == FG_PASS_BACKWARD ? b->grad : &b->o;
    for (int i = 0; i < (pass == FG_PASS_BACKWARD ? 3 : 1); i++) {
        fg_status st = fg_cuda_check(ctx, ctx->cu->cuMemcpyDtoH(out + i * elems, src[i], elems * 2),
                                     "cuMemcpyDtoH(tuning output)");
        if (st) return st;
    }
    return FG_OK;
}

/* The tilings to time: the derived one first, then the candidates that
 * compile without spills, in the planner's fixed order. */
static fg_status collect_tilings(fg_context *ctx, fg_pass pass, const fg_spec *s,
                                 plan_tiling *tilings, int *count) {
    fg_kernel *k;
    fg_status st = kernels_get(ctx, pass, s, NULL, 1, &k);
    if (st) return st;
    plan_tiling cand[TUNE_MAX_CANDIDATES];
    int m;
    if (pass == FG_PASS_BACKWARD) {
        plan_backward_tiling_of(&k->bwd_plan, &tilings[0]);
        m = plan_backward_candidates(s, &ctx->profile, cand, TUNE_MAX_CANDIDATES - 1);
    } else {
        plan_forward_tiling_of(&k->plan, &tilings[0]);
        m = plan_forward_candidates(s, &ctx->profile, cand, TUNE_MAX_CANDIDATES - 1);
    }
    int n = 1;
    for (int i = 0; i < m; i++) {
        if (memcmp(&cand[i], &tilings[0], sizeof cand[i]) == 0) continue;
        if (kernels_get(ctx, pass, s, &cand[i], 1, &k) != FG_OK) continue;
        if (k->info.spill_bytes > 0) continue;
        tilings[n++] = cand[i];
    }
    *count = n;
    return FG_OK;
}

fg_status fg_tune(fg_context *ctx, const fg_spec *spec, fg_pass pass, int seqlen,
                  fg_tune_report *out) {
    fg_spec s;
    fg_status st = tune_args(ctx, &s, spec, pass, out);
    if (st) return st;
    if (seqlen < 1) return fg_fail(ctx, FG_ERR_INVALID_ARGUMENT, "seqlen: %d; must be >= 1", seqlen);
    if ((st = fg_make_current(ctx))) return st;
    memset(out, 0, sizeof *out);
    int bucket = tune_bucket(seqlen);

    plan_tiling tilings[TUNE_MAX_CANDIDATES];
    int n = 0;
    if ((st = collect_tilings(ctx, pass, &s, tilings, &n))) return st;

    tune_run run;
    memset(&run, 0, sizeof run);
    run.ctx = ctx, run.spec = &s, run.pass = pass;
    tune_buffers buf;
    memset(&buf, 0, sizeof buf);
    uint16_t *host = NULL, *first = NULL;
    size_t elems = 0;
    st = setup_problem(ctx, &s, pass, bucket, &buf, &run.args, &host, &elems);
    size_t outputs = pass == FG_PASS_BACKWARD ? 3 * elems : elems;
    if (!st) first = malloc(outputs * 2);
    if (!st && !first) st = fg_fail(ctx, FG_ERR_OUT_OF_MEMORY, "tuning: out of host memory");
    if (!st) st = fg_cuda_check(ctx, ctx->cu->cuEventCreate(&run.start, 0), "cuEventCreate");
    if (!st) st = fg_cuda_check(ctx, ctx->cu->cuEventCreate(&run.stop, 0), "cuEventCreate");

    /* the table no longer grows: its pointers stay valid from here on; each
     * candidate must reproduce the derived plan's output before it is timed */
    int kept = 0;
    plan_tiling timed[TUNE_MAX_CANDIDATES];
    for (int i = 0; i < n && !st; i++) {
        fg_kernel *k;
        if ((st = kernels_get(ctx, pass, &s, i ? &tilings[i] : NULL, 1, &k))) break;
        st = launch(&run, k);
        if (!st) st = fg_cuda_check(ctx, ctx->cu->cuCtxSynchronize(), "tuning run");
        if (!st) st = read_outputs(ctx, pass, &buf, elems, i ? host : first);
        if (st) {
            if (i == 0) break;
            st = FG_OK; /* a candidate that does not run is not timed */
            continue;
        }
        if (i > 0 && !same_output(first, host, outputs, s.dtype,
                                  pass == FG_PASS_BACKWARD ? 1.f / 32 : 0.f))
            continue;
        run.kernels[kept] = k;
        timed[kept++] = tilings[i];
    }
    tune_outcome oc;
    if (!st && tune_measure(kept, time_one, &run, TUNE_WARMUP, TUNE_ROUNDS, &oc) != 0)
        st = fg_fail(ctx, FG_ERR_CUDA, "tuning: the derived plan failed to run");

    if (!st) {
        tune_entry e;
        memset(&e, 0, sizeof e);
        spec_name(&s, e.spec, sizeof e.spec);
        e.pass = pass, e.bucket = bucket;
        e.derived = timed[0], e.chosen = timed[oc.chosen];
        e.derived_ms = oc.median[0], e.chosen_ms = oc.median[oc.chosen], e.spread = oc.spread;
        if (!ctx->tuning.loaded) tune_load(ctx);
        if (put_entry(&ctx->tuning, &e) != 0)
            st = fg_fail(ctx, FG_ERR_OUT_OF_MEMORY, "tuning table: out of memory");
        report_of(ctx, &s, &e, out);
        out->candidates = kept;
        out->persisted = !st && tune_save(ctx, &e) == 0;
    }
    if (run.start) ctx->cu->cuEventDestroy(run.start);
    if (run.stop) ctx->cu->cuEventDestroy(run.stop);
    free_buffers(ctx, &buf);
    free(host);
    free(first);
    return st;
}
