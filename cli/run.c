/* The GPU commands: check (against the fp64 reference), bench and demo. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "gen/profile.h"
#include "reference/reference.h"
#include "runtime/cuda_libs.h"

/* ---- device buffers ---- */

typedef struct gpu {
    const cuda_driver *cu;
    CUdevice device;
    CUcontext context;
} gpu;

static int gpu_open(gpu *g) {
    char err[512];
    g->cu = cuda_driver_load(err, sizeof err);
    if (!g->cu) {
        fprintf(stderr, "flashgen: %s\n", err);
        return -1;
    }
    const char *env = getenv("FLASHGEN_DEVICE");
    if (g->cu->cuDeviceGet(&g->device, env && *env ? atoi(env) : 0) ||
        g->cu->cuDevicePrimaryCtxRetain(&g->context, g->device) ||
        g->cu->cuCtxSetCurrent(g->context)) {
        fprintf(stderr, "flashgen: cannot open the CUDA device\n");
        return -1;
    }
    return 0;
}

static void gpu_close(gpu *g) { g->cu->cuDevicePrimaryCtxRelease(g->device); }

static CUdeviceptr gpu_alloc(gpu *g, size_t bytes) {
    CUdeviceptr p = 0;
    if (g->cu->cuMemAlloc(&p, bytes ? bytes : 16) != CUDA_SUCCESS) return 0;
    return p;
}

/* ---- random inputs ---- */

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float rng_uniform(uint64_t *s) { return (float)((rng_next(s) >> 40) * (2.0 / 16777216.0) - 1.0); }

/* Fill n values uniformly in [-1, 1], rounded to the dtype: bits for the
 * device, floats for the reference. */
static void random_tensor(uint64_t *seed, size_t n, int dtype, uint16_t *bits, float *values) {
    for (size_t i = 0; i < n; i++) {
        float x = rng_uniform(seed);
        bits[i] = dtype ? ref_float_to_bf16(x) : ref_float_to_half(x);
        if (values) values[i] = dtype ? ref_bf16_to_float(bits[i]) : ref_half_to_float(bits[i]);
    }
}

/* ---- one problem on the device ---- */

typedef struct problem_run {
    fg_forward_args args;
    CUdeviceptr q, k, v, o, lse;
    size_t nq, nk, no;
    fg_layout *layout;
    uint8_t *layout_mask;
    int layout_heads, blocks_q, blocks_k;
} problem_run;

/* Element (b, h, s, d) offset for a layout. */
static size_t offset_of(const fg_tensor *t, int b, int h, int s, int d) {
    return (size_t)(b * t->stride_batch + h * t->stride_head + (int64_t)s * t->stride_seq + d);
}

static fg_tensor make_tensor(int bhsd, CUdeviceptr p, int s, int h, int d) {
    return bhsd ? fg_tensor_bhsd((void *)p, s, h, d) : fg_tensor_bshd((void *)p, s, h, d);
}

static int problem_setup(fg_context *ctx, gpu *g, const fg_spec *spec, const cli_problem *pb,
                         problem_run *r, uint16_t **host_bits) {
    memset(r, 0, sizeof *r);
    int d = spec->head_dim;
    r->nq = (size_t)pb->batch * pb->seqlen_q * pb->heads_q * d;
    r->nk = (size_t)pb->batch * pb->seqlen_k * pb->heads_kv * d;
    r->no = r->nq;
    r->q = gpu_alloc(g, r->nq * 2);
    r->k = gpu_alloc(g, r->nk * 2);
    r->v = gpu_alloc(g, r->nk * 2);
    r->o = gpu_alloc(g, r->no * 2);
    r->lse = gpu_alloc(g, (size_t)pb->batch * pb->heads_q * pb->seqlen_q * 4);
    if (!r->q || !r->k || !r->v || !r->o || !r->lse) {
        fprintf(stderr, "flashgen: device allocation failed\n");
        return -1;
    }
    fg_forward_args *a = &r->args;
    *a = fg_forward_args_default();
    a->q = make_tensor(pb->bhsd, r->q, pb->seqlen_q, pb->heads_q, d);
    a->k = make_tensor(pb->bhsd, r->k, pb->seqlen_k, pb->heads_kv, d);
    a->v = make_tensor(pb->bhsd, r->v, pb->seqlen_k, pb->heads_kv, d);
    a->o = make_tensor(pb->bhsd, r->o, pb->seqlen_q, pb->heads_q, d);
    a->lse = (float *)r->lse;
    a->batch = pb->batch, a->heads_q = pb->heads_q, a->heads_kv = pb->heads_kv;
    a->seqlen_q = pb->seqlen_q, a->seqlen_k = pb->seqlen_k;
    a->softmax_scale = pb->scale;
    a->align = pb->align;
    a->window_left = pb->window_left, a->window_right = pb->window_right;
    a->dropout_p = pb->dropout_p;
    a->seed = pb->seed, a->offset = 0;
    uint64_t seed = pb->seed;
    if (spec->sparsity == FG_SPARSE_LAYOUT) {
        r->layout_heads = pb->heads_q;
        r->blocks_q = (pb->seqlen_q + spec->sparse_block_q - 1) / spec->sparse_block_q;
        r->blocks_k = (pb->seqlen_k + spec->sparse_block_k - 1) / spec->sparse_block_k;
        size_t n = (size_t)r->layout_heads * r->blocks_q * r->blocks_k;
        r->layout_mask = malloc(n);
        for (size_t i = 0; i < n; i++)
            r->layout_mask[i] = (rng_next(&seed) >> 11) * (1.0 / 9007199254740992.0) < pb->layout_density;
        if (fg_layout_create(ctx, r->layout_mask, r->layout_heads, r->blocks_q, r->blocks_k,
                             &r->layout) != FG_OK) {
            fprintf(stderr, "flashgen: %s\n", fg_context_message(ctx));
            return -1;
        }
        a->layout = r->layout;
    }
    /* host_bits: q, k, v concatenated, for the reference */
    uint16_t *bits = malloc((r->nq + 2 * r->nk) * 2);
    random_tensor(&seed, r->nq + 2 * r->nk, spec->dtype, bits, NULL);
    g->cu->cuMemcpyHtoD(r->q, bits, r->nq * 2);
    g->cu->cuMemcpyHtoD(r->k, bits + r->nq, r->nk * 2);
    g->cu->cuMemcpyHtoD(r->v, bits + r->nq + r->nk, r->nk * 2);
    if (host_bits) *host_bits = bits;
    else free(bits);
    return 0;
}

static void problem_free(gpu *g, problem_run *r) {
    g->cu->cuMemFree(r->q), g->cu->cuMemFree(r->k), g->cu->cuMemFree(r->v);
    g->cu->cuMemFree(r->o), g->cu->cuMemFree(r->lse);
    fg_layout_destroy(r->layout);
    free(r->layout_mask);
}

/* Milliseconds per call of `call` (one launch sequence on the default
 * stream): device events around `repeats` calls after a warm-up, median of 5.
 * Negative when the warm-up call fails. */
typedef fg_status (*timed_call)(fg_context *ctx, const fg_spec *spec, void *args);

static double time_calls(fg_context *ctx, gpu *g, const fg_spec *spec, timed_call call, void *args,
                         int repeats) {
    CUevent e0, e1;
    if (call(ctx, spec, args) != FG_OK) return -1;
    g->cu->cuEventCreate(&e0, 0), g->cu->cuEventCreate(&e1, 0);
    double samples[5];
    for (int s = 0; s < 5; s++) {
        g->cu->cuEventRecord(e0, NULL);
        for (int i = 0; i < repeats; i++) call(ctx, spec, args);
        g->cu->cuEventRecord(e1, NULL);
        g->cu->cuEventSynchronize(e1);
        float ms;
        g->cu->cuEventElapsedTime(&ms, e0, e1);
        samples[s] = ms / repeats;
    }
    g->cu->cuEventDestroy(e0), g->cu->cuEventDestroy(e1);
    for (int i = 0; i < 5; i++)
        for (int j = i + 1; j < 5; j++)
            if (samples[j] < samples[i]) {
                double t = samples[i];
                samples[i] = samples[j], samples[j] = t;
            }
    return samples[2];
}

/* A forward call with a fresh dropout offset each time. */
static fg_status forward_call(fg_context *ctx, const fg_spec *spec, void *args) {
    fg_forward_args *a = args;
    a->offset += 1;
    return fg_forward(ctx, spec, a);
}

static fg_status backward_call(fg_context *ctx, const fg_spec *spec, void *args) {
    return fg_backward(ctx, spec, args);
}

static double time_forward(fg_context *ctx, gpu *g, const fg_spec *spec, fg_forward_args *a,
                           int repeats) {
    return time_calls(ctx, g, spec, forward_call, a, repeats);
}

static double time_backward(fg_context *ctx, gpu *g, const fg_spec *spec, fg_backward_args *b,
                            int repeats) {
    return time_calls(ctx, g, spec, backward_call, b, repeats);
}

/* 4·b·h·Sq·Sk·d, halved for causal: the convention the tables use. */
static double attention_flops(const fg_spec *s, const cli_problem *p) {
    double f = 4.0 * p->batch * p->heads_q * (double)p->seqlen_q * p->seqlen_k * s->head_dim;
    return s->mask == FG_MASK_CAUSAL ? f / 2 : f;
}

/* ---- check ---- */

static void to_bhsd_floats(const uint16_t *bits, const fg_tensor *t, int dtype, int B, int H,
                           int S, int D, float *out) {
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int s = 0; s < S; s++)
                for (int d = 0; d < D; d++) {
                    uint16_t x = bits[offset_of(t, b, h, s, d)];
                    out[(((size_t)b * H + h) * S + s) * D + d] =
                        dtype ? ref_bf16_to_float(x) : ref_half_to_float(x);
                }
}

/* The backward of a problem whose forward ran: random dO, fg_backward, and
 * dQ, dK, dV against the fp64 gradients (bound: 3x the naive input-precision
 * error). The deterministic schedule also runs twice and must match bit for
 * bit. q, k, v are the inputs as (B,H,S,D) floats. */
static int check_backward(fg_context *ctx, gpu *g, const fg_spec *spec, const cli_problem *pb,
                          problem_run *r, const ref_problem *rp, const float *q, const float *k,
                          const float *v, int deterministic, int print) {
    int B = pb->batch, Hq = pb->heads_q, Hk = pb->heads_kv, Sq = pb->seqlen_q, Sk = pb->seqlen_k;
    int D = spec->head_dim;
    const cuda_driver *cu = g->cu;
    CUdeviceptr d_o = gpu_alloc(g, r->no * 2), dq = gpu_alloc(g, r->nq * 2);
    CUdeviceptr dk = gpu_alloc(g, r->nk * 2), dv = gpu_alloc(g, r->nk * 2);
    uint16_t *dobits = malloc(r->no * 2), *out = malloc((r->nq + 2 * r->nk) * 2 * 2);
    float *dof = malloc(r->no * 4), *got = malloc((r->nq + 2 * r->nk) * 4);
    float *naive = malloc((r->nq + 2 * r->nk) * 4);
    double *ref = malloc((r->nq + 2 * r->nk) * 8);
    int ok = d_o && dq && dk && dv && dobits && out && dof && got && naive && ref;
    if (!ok) fprintf(stderr, "flashgen check: out of memory\n");
    fg_backward_args b;
    memset(&b, 0, sizeof b);
    b.forward = r->args;
    b.d_o = make_tensor(pb->bhsd, d_o, Sq, Hq, D);
    b.d_q = make_tensor(pb->bhsd, dq, Sq, Hq, D);
    b.d_k = make_tensor(pb->bhsd, dk, Sk, Hk, D);
    b.d_v = make_tensor(pb->bhsd, dv, Sk, Hk, D);
    b.deterministic = deterministic;
    uint16_t *runs[2] = {out, out + r->nq + 2 * r->nk};
    for (int run = 0; ok && run < 1 + deterministic; run++) {
        if (run == 0) {
            uint64_t seed = pb->seed ^ 0x5bd1e995u;
            random_tensor(&seed, r->no, spec->dtype, dobits, NULL);
            cu->cuMemcpyHtoD(d_o, dobits, r->no * 2);
        }
        cu->cuMemsetD8(dq, 0xff, r->nq * 2), cu->cuMemsetD8(dk, 0xff, r->nk * 2);
        cu->cuMemsetD8(dv, 0xff, r->nk * 2);
        fg_status st = fg_backward(ctx, spec, &b);
        if (st != FG_OK || cu->cuCtxSynchronize() != CUDA_SUCCESS) {
            fprintf(stderr, "flashgen check: %s\n", st ? fg_context_message(ctx) : "backward kernel failed");
            ok = 0;
            break;
        }
        cu->cuMemcpyDtoH(runs[run], dq, r->nq * 2);
        cu->cuMemcpyDtoH(runs[run] + r->nq, dk, r->nk * 2);
        cu->cuMemcpyDtoH(runs[run] + r->nq + r->nk, dv, r->nk * 2);
    }
    int same = 1;
    if (ok && deterministic) same = memcmp(runs[0], runs[1], (r->nq + 2 * r->nk) * 2) == 0;
    if (ok) {
        to_bhsd_floats(dobits, &b.d_o, spec->dtype, B, Hq, Sq, D, dof);
        to_bhsd_floats(out, &b.d_q, spec->dtype, B, Hq, Sq, D, got);
        to_bhsd_floats(out + r->nq, &b.d_k, spec->dtype, B, Hk, Sk, D, got + r->nq);
        to_bhsd_floats(out + r->nq + r->nk, &b.d_v, spec->dtype, B, Hk, Sk, D, got + r->nq + r->nk);
        ref_attention_backward_fp64(rp, q, k, v, dof, ref, ref + r->nq, ref + r->nq + r->nk);
        ref_attention_backward_lowp(rp, spec->dtype, q, k, v, dof, naive, naive + r->nq,
                                    naive + r->nq + r->nk);
        static const char *const names[] = {"dQ", "dK", "dV"};
        size_t at[3] = {0, r->nq, r->nq + r->nk}, len[3] = {r->nq, r->nk, r->nk};
        for (int t = 0; t < 3; t++) {
            double err = ref_rel_error_f(got + at[t], ref + at[t], len[t]);
            double nerr = ref_rel_error_f(naive + at[t], ref + at[t], len[t]);
            double bound = 3 * nerr + 1e-6;
            ok &= err <= bound;
            if (print)
                printf("check backward %s: |%s-ref|/|ref| = %.3g (naive %.3g, bound %.3g)\n",
                       deterministic ? "(deterministic)" : "(fast)", names[t], err, nerr, bound);
        }
        if (deterministic && print)
            printf("check backward: two deterministic runs %s\n", same ? "bitwise identical" : "DIFFER");
        ok &= same;
        if (print) printf("check backward: %s\n", ok ? "PASS" : "FAIL");
    }
    cu->cuMemFree(d_o), cu->cuMemFree(dq), cu->cuMemFree(dk), cu->cuMemFree(dv);
    free(dobits), free(out), free(dof), free(got), free(naive), free(ref);
    return ok ? 0 : 1;
}

static int check_problem(fg_context *ctx, gpu *g, const fg_spec *spec, const cli_problem *pb,
                         fg_pass pass, int deterministic, int print) {
    problem_run r;
    uint16_t *bits = NULL;
    if (problem_setup(ctx, g, spec, pb, &r, &bits) != 0) return 1;
    const fg_forward_args *a = &r.args;
    int B = pb->batch, Hq = pb->heads_q, Hk = pb->heads_kv, Sq = pb->seqlen_q, Sk = pb->seqlen_k;
    int D = spec->head_dim;
    g->cu->cuMemsetD8(r.o, 0xff, r.no * 2); /* poison: NaN everywhere */
    g->cu->cuMemsetD8(r.lse, 0xff, (size_t)B * Hq * Sq * 4);
    fg_status st = fg_forward(ctx, spec, a);
    if (st != FG_OK || g->cu->cuCtxSynchronize() != CUDA_SUCCESS) {
        fprintf(stderr, "flashgen check: %s\n", st ? fg_context_message(ctx) : "kernel failed");
        problem_free(g, &r);
        free(bits);
        return 1;
    }
    uint16_t *obits = malloc(r.no * 2);
    float *lse = malloc((size_t)B * Hq * Sq * 4);
    g->cu->cuMemcpyDtoH(obits, r.o, r.no * 2);
    g->cu->cuMemcpyDtoH(lse, r.lse, (size_t)B * Hq * Sq * 4);

    float *q = malloc(r.nq * 4), *k = malloc(r.nk * 4), *v = malloc(r.nk * 4), *o = malloc(r.no * 4);
    float *naive = malloc(r.no * 4);
    double *ref = malloc(r.no * 8), *ref_lse = malloc((size_t)B * Hq * Sq * 8);
    to_bhsd_floats(bits, &a->q, spec->dtype, B, Hq, Sq, D, q);
    to_bhsd_floats(bits + r.nq, &a->k, spec->dtype, B, Hk, Sk, D, k);
    to_bhsd_floats(bits + r.nq + r.nk, &a->v, spec->dtype, B, Hk, Sk, D, v);
    to_bhsd_floats(obits, &a->o, spec->dtype, B, Hq, Sq, D, o);

    ref_problem rp;
    memset(&rp, 0, sizeof rp);
    rp.batch = B, rp.heads_q = Hq, rp.heads_kv = Hk, rp.seqlen_q = Sq, rp.seqlen_k = Sk;
    rp.head_dim = D;
    rp.scale = pb->scale != 0.f ? pb->scale : 1.0 / sqrt((double)D);
    rp.mask = spec->mask;
    rp.diag_offset = pb->align == FG_ALIGN_TOP_LEFT ? 0 : (int64_t)Sk - Sq;
    rp.window_left = spec->mask == FG_MASK_CAUSAL ? -1 : pb->window_left;
    rp.window_right = spec->mask == FG_MASK_CAUSAL ? 0 : pb->window_right;
    rp.dropout_p = pb->dropout_p;
    rp.seed = pb->seed, rp.offset = 0;
    rp.sparsity = spec->sparsity;
    rp.block_q = spec->sparse_block_q, rp.block_k = spec->sparse_block_k;
    rp.layout = r.layout_mask, rp.layout_heads = r.layout_heads;
    rp.butterfly_factors = spec->butterfly_factors;
    ref_attention_fp64(&rp, q, k, v, ref, ref_lse);
    ref_attention_lowp(&rp, spec->dtype, q, k, v, naive);
    double err = ref_rel_error_f(o, ref, r.no), naive_err = ref_rel_error_f(naive, ref, r.no);
    double lse_err = 0;
    int lse_bad = 0;
    for (size_t i = 0; i < (size_t)B * Hq * Sq; i++) {
        if (isinf(ref_lse[i])) lse_bad += !(isinf(lse[i]) && lse[i] < 0);
        else lse_err = fmax(lse_err, fabs(lse[i] - ref_lse[i]) / fmax(1.0, fabs(ref_lse[i])));
    }
    double bound = 2 * naive_err + 1e-6;
    int ok = err <= bound && lse_err <= 1e-3 && lse_bad == 0;
    if (print)
        printf("check %s: |O-ref|/|ref| = %.3g (naive %s: %.3g, bound %.3g), lse max err %.2g%s: %s\n",
               fg_context_target(ctx), err, spec->dtype ? "bf16" : "fp16", naive_err, bound,
               lse_err, lse_bad ? ", lse -inf mismatch" : "", ok ? "PASS" : "FAIL");
    if (pass == FG_PASS_BACKWARD)
        ok &= check_backward(ctx, g, spec, pb, &r, &rp, q, k, v, deterministic, print) == 0;
    free(obits), free(lse), free(q), free(k), free(v), free(o), free(naive), free(ref), free(ref_lse);
    free(bits);
    problem_free(g, &r);
    return ok ? 0 : 1;
}

static int open_live(fg_context **ctx, gpu *g) {
    if (cli_context_create(ctx, NULL) != FG_OK) {
        fprintf(stderr, "flashgen: %s\n", fg_last_message());
        return -1;
    }
    if (gpu_open(g) != 0) {
        fg_context_destroy(*ctx);
        return -1;
    }
    return 0;
}

int cli_check(const cli_options *o) {
    fg_context *ctx;
    gpu g;
    if (open_live(&ctx, &g) != 0) return 1;
    int rc = check_problem(ctx, &g, &o->spec, &o->problem, o->pass, o->deterministic, 1);
    fg_context_destroy(ctx);
    gpu_close(&g);
    return rc;
}

/* ---- bench ---- */

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static void bench_compile_times(const cli_options *o) {
    /* cold: a private empty cache folder; disk: a new context on the same
     * folder; memory: the same context again */
    char dir[] = "/tmp/flashgen-bench-XXXXXX", saved[1024] = "";
    if (!mkdtemp(dir)) return;
    const char *old = getenv("FLASHGEN_CACHE_DIR");
    if (old) snprintf(saved, sizeof saved, "%s", old);
    setenv("FLASHGEN_CACHE_DIR", dir, 1);
    fg_spec spec = fg_spec_default(128, FG_BF16);
    spec.mask = FG_MASK_CAUSAL;
    fg_kernel_info cold, disk, mem;
    fg_context *ctx;
    if (cli_context_create(&ctx, NULL) != FG_OK) return;
    double t0 = now_us();
    fg_compile(ctx, &spec, FG_PASS_FORWARD, &cold);
    double t_cold = now_us() - t0;
    fg_context_destroy(ctx);
    cli_context_create(&ctx, NULL);
    t0 = now_us();
    fg_compile(ctx, &spec, FG_PASS_FORWARD, &disk);
    double t_disk = now_us() - t0;
    t0 = now_us();
    fg_compile(ctx, &spec, FG_PASS_FORWARD, &mem);
    double t_mem = now_us() - t0;
    fg_context_destroy(ctx);
    if (o->csv) printf("compile,%s,%.1f,%.1f,%.3f\n", cold.plan.kernel_name, t_cold / 1e3, t_disk / 1e3, t_mem / 1e3);
    else
        printf("\ncompile %s: cold %.0f ms (NVRTC %.0f ms), warm from disk %.1f ms, warm from memory %.3f ms\n",
               cold.plan.kernel_name, t_cold / 1e3, cold.compile_ms, t_disk / 1e3, t_mem / 1e3);
    if (old) setenv("FLASHGEN_CACHE_DIR", saved, 1);
    else unsetenv("FLASHGEN_CACHE_DIR");
}

/* Host time of a warm fg_forward call against a bare launch of the same
 * problem: the calls only queue work, so host time is what is measured. */
static void bench_host_overhead(fg_context *ctx, gpu *g) {
    fg_spec spec = fg_spec_default(64, FG_FP16);
    cli_problem pb = {1, 1, 1, 16, 16, 0, FG_ALIGN_BOTTOM_RIGHT, -1, -1, 0, 0, 1, 0.5};
    problem_run r;
    if (problem_setup(ctx, g, &spec, &pb, &r, NULL) != 0) return;
    fg_forward(ctx, &spec, &r.args);
    g->cu->cuCtxSynchronize();
    const int n = 2000;
    double t0 = now_us();
    for (int i = 0; i < n; i++) fg_forward(ctx, &spec, &r.args);
    double per_call = (now_us() - t0) / n;
    g->cu->cuCtxSynchronize();
    printf("host time per warm fg_forward call (tiny problem, launches queued): %.2f us\n", per_call);
    problem_free(g, &r);
}

/* --tuned: tune the pass for the shape's bucket, time the tuned plan (the
 * backward: fast schedule), and print it beside the derived plan's ms. args:
 * the pass's fg_forward_args or fg_backward_args. */
static void bench_tuned(fg_context *ctx, gpu *g, const cli_options *o, const fg_spec *spec,
                        const cli_problem *pb, fg_pass pass, void *args, double ms) {
    int bwd = pass == FG_PASS_BACKWARD;
    fg_tune_report rep;
    if (fg_tune(ctx, spec, pass, pb->seqlen_k, &rep) != FG_OK) {
        fprintf(stderr, "flashgen bench: tune: %s\n", fg_context_message(ctx));
        return;
    }
    fg_context_set_tuning(ctx, 1);
    double tuned = bwd ? time_backward(ctx, g, spec, args, o->repeats)
                       : time_forward(ctx, g, spec, args, o->repeats);
    fg_context_set_tuning(ctx, 0);
    if (tuned < 0) return;
    double tf = (bwd ? 2.5 : 1.0) * attention_flops(spec, pb) / (tuned * 1e-3) / 1e12;
    char plan[48];
    snprintf(plan, sizeof plan, "%dx%d w%d", rep.chosen.block_m, rep.chosen.block_n,
             rep.chosen.warps);
    if (o->csv)
        printf("%s,%d,%d,%d,%d,%d,%.1f,%.4f,%.1f,%s,%.4f\n", bwd ? "flashgen_bwd_tuned" : "flashgen_tuned",
               spec->head_dim, pb->seqlen_k, pb->batch, pb->heads_q, spec->mask == FG_MASK_CAUSAL,
               pb->dropout_p, tuned, tf, plan, ms);
    else
        printf("%40s %s %-11s %9.3f %8.1f  (%+.1f%% time vs derived%s)\n", "",
               bwd ? "tuned backward" : "tuned", plan, tuned, tf, 100.0 * (tuned - ms) / ms,
               rep.chosen_is_derived ? ", derived kept" : "");
}

/* One forward+backward row: fast and deterministic backward after the
 * forward measured in fwd_ms. FLOPs: 2.5x the forward's for the backward,
 * 3.5x for both. */
static void bench_backward_row(fg_context *ctx, gpu *g, const cli_options *o, const fg_spec *spec,
                               const cli_problem *pb, problem_run *r, double fwd_ms) {
    int D = spec->head_dim;
    CUdeviceptr d_o = gpu_alloc(g, r->no * 2), dq = gpu_alloc(g, r->nq * 2);
    CUdeviceptr dk = gpu_alloc(g, r->nk * 2), dv = gpu_alloc(g, r->nk * 2);
    if (!d_o || !dq || !dk || !dv) {
        fprintf(stderr, "flashgen bench: device allocation failed\n");
    } else {
        uint16_t *bits = malloc(r->no * 2);
        uint64_t seed = pb->seed ^ 0x5bd1e995u;
        random_tensor(&seed, r->no, spec->dtype, bits, NULL);
        g->cu->cuMemcpyHtoD(d_o, bits, r->no * 2);
        free(bits);
        fg_forward(ctx, spec, &r->args); /* o and lse of these inputs */
        fg_backward_args b;
        memset(&b, 0, sizeof b);
        b.forward = r->args;
        b.d_o = make_tensor(pb->bhsd, d_o, pb->seqlen_q, pb->heads_q, D);
        b.d_q = make_tensor(pb->bhsd, dq, pb->seqlen_q, pb->heads_q, D);
        b.d_k = make_tensor(pb->bhsd, dk, pb->seqlen_k, pb->heads_kv, D);
        b.d_v = make_tensor(pb->bhsd, dv, pb->seqlen_k, pb->heads_kv, D);
        double fast = time_backward(ctx, g, spec, &b, o->repeats);
        if (fast >= 0 && o->tuned) bench_tuned(ctx, g, o, spec, pb, FG_PASS_BACKWARD, &b, fast);
        b.deterministic = 1;
        double det = fast < 0 ? -1 : time_backward(ctx, g, spec, &b, o->repeats);
        if (fast < 0 || det < 0) {
            fprintf(stderr, "flashgen bench: %s\n", fg_context_message(ctx));
        } else {
            double f = attention_flops(spec, pb);
            double tf_bwd = 2.5 * f / (fast * 1e-3) / 1e12, tf_det = 2.5 * f / (det * 1e-3) / 1e12;
            double tf_all = 3.5 * f / ((fwd_ms + fast) * 1e-3) / 1e12;
            double tf_all_det = 3.5 * f / ((fwd_ms + det) * 1e-3) / 1e12;
            if (o->csv)
                printf("flashgen_bwd,%d,%d,%d,%d,%d,%.1f,%.4f,%.4f,%.4f,%.1f,%.1f,%.1f,%.1f\n", D,
                       pb->seqlen_q, pb->batch, pb->heads_q, spec->mask == FG_MASK_CAUSAL,
                       pb->dropout_p, fwd_ms, fast, det, tf_bwd, tf_det, tf_all, tf_all_det);
            else
                printf("%4d %6d %5d %5d %7s %8.1f %9.3f %9.3f %9.3f %8.1f %8.1f %8.1f %8.1f\n", D,
                       pb->seqlen_q, pb->batch, pb->heads_q,
                       spec->mask == FG_MASK_CAUSAL ? "yes" : "no", pb->dropout_p, fwd_ms, fast,
                       det, tf_bwd, tf_det, tf_all, tf_all_det);
        }
    }
    g->cu->cuMemFree(d_o), g->cu->cuMemFree(dq), g->cu->cuMemFree(dk), g->cu->cuMemFree(dv);
}

/* A shape of the benchmark's table: bf16, 16k tokens, hidden 2048, (B,S,H,D). */
static void standard_shape(int d, int len, int causal, int drop, const cli_problem *base,
                           fg_spec *spec, cli_problem *pb) {
    *spec = fg_spec_default(d, FG_BF16);
    spec->mask = causal ? FG_MASK_CAUSAL : FG_MASK_NONE;
    spec->dropout = drop;
    *pb = *base;
    pb->seqlen_q = pb->seqlen_k = len;
    pb->batch = 16384 / len;
    pb->heads_q = pb->heads_kv = 2048 / d;
    pb->bhsd = 0, pb->dropout_p = drop ? 0.1f : 0.f;
    pb->window_left = pb->window_right = -1;
}

/* --philox: the overlap of Philox calls and MMAs, then per shape dropout's
 * measured cost beside the time its Philox calls take alone (its cost if
 * they overlapped nothing). A causal shape counts only its visible draws. */
static void bench_philox(fg_context *ctx, gpu *g, const cli_options *o, const int *dims, int nd,
                         const int *lens, int nl) {
    printf("%s\nPhilox4x32-10 beside the tensor cores: per warp and key tile, the forward's "
           "2d m16n8k16 MMAs and 4 Philox calls per thread, 8 warps per SM\n"
           "%4s %10s %10s %10s %20s %22s\n",
           fg_context_target(ctx), "d", "MMAs ms", "Philox ms", "both ms", "Philox time hidden",
           "Philox calls/clock/SM");
    double calls_per_ms = 0;
    for (int di = 0; di < nd; di++) {
        philox_overlap r;
        char err[512];
        if (philox_overlap_measure(g->cu, g->device, dims[di], &r, err, sizeof err) != 0) {
            fprintf(stderr, "flashgen bench: %s\n", err);
            return;
        }
        calls_per_ms = r.calls_per_ms;
        printf("%4d %10.3f %10.3f %10.3f %19.0f%% %22.2f\n", dims[di], r.mma_ms, r.rng_ms,
               r.both_ms, 100.0 * (r.mma_ms + r.rng_ms - r.both_ms) / r.rng_ms,
               r.calls_per_clock_sm);
    }
    printf("\nbf16 forward, 16k tokens, hidden 2048, dropout 0.1 against none\n"
           "%4s %6s %7s %10s %10s %7s %10s %7s\n",
           "d", "seq", "causal", "none ms", "drop ms", "cost", "Philox ms", "floor");
    for (int di = 0; di < nd; di++)
        for (int li = 0; li < nl; li++)
            for (int causal = 0; causal < 2; causal++) {
                double ms[2] = {-1, -1};
                fg_spec spec;
                cli_problem pb;
                for (int drop = 0; drop < 2; drop++) {
                    standard_shape(dims[di], lens[li], causal, drop, &o->problem, &spec, &pb);
                    problem_run r;
                    if (problem_setup(ctx, g, &spec, &pb, &r, NULL) != 0) continue;
                    ms[drop] = time_forward(ctx, g, &spec, &r.args, o->repeats);
                    problem_free(g, &r);
                }
                if (ms[0] < 0 || ms[1] < 0) {
                    fprintf(stderr, "flashgen bench: %s\n", fg_context_message(ctx));
                    continue;
                }
                double s = lens[li], visible = causal ? s * (s + 1) / 2 : s * s;
                double philox_ms = pb.batch * pb.heads_q * visible / 16 / calls_per_ms;
                printf("%4d %6d %7s %10.3f %10.3f %+6.1f%% %10.3f %+6.1f%%\n", dims[di], lens[li],
                       causal ? "yes" : "no", ms[0], ms[1], 100.0 * (ms[1] - ms[0]) / ms[0],
                       philox_ms, 100.0 * philox_ms / ms[0]);
                fflush(stdout);
            }
}

int cli_bench(const cli_options *o) {
    fg_context *ctx;
    gpu g;
    if (open_live(&ctx, &g) != 0) return 1;
    /* the table times the derived plans; --tuned adds the tuned ones */
    fg_context_set_tuning(ctx, 0);
    static const int dims_all[] = {64, 128, 256}, dims_quick[] = {128};
    static const int lens_all[] = {512, 1024, 2048, 4096, 8192, 16384}, lens_quick[] = {2048, 8192};
    const int *dims = o->quick ? dims_quick : dims_all, *lens = o->quick ? lens_quick : lens_all;
    int nd = o->quick ? 1 : 3, nl = o->quick ? 2 : 6;
    if (o->head_dim_given) dims = &o->spec.head_dim, nd = 1;
    if (o->seqlen_given) lens = &o->problem.seqlen_q, nl = 1;
    if (o->philox) {
        bench_philox(ctx, &g, o, dims, nd, lens, nl);
        fg_context_destroy(ctx);
        gpu_close(&g);
        return 0;
    }
    if (o->pass == FG_PASS_BACKWARD) {
        if (o->csv)
            printf("kind,head_dim,seqlen,batch,heads,causal,dropout,fwd_ms,bwd_ms,det_ms,"
                   "bwd_tflops,det_tflops,all_tflops,all_det_tflops\n");
        else
            printf("%s\nbf16 backward (2.5x forward FLOPs) and forward+backward (3.5x), 16k "
                   "tokens, hidden 2048; det = deterministic schedule\n"
                   "%4s %6s %5s %5s %7s %8s %9s %9s %9s %8s %8s %8s %8s\n",
                   fg_context_target(ctx), "d", "seq", "batch", "heads", "causal", "dropout",
                   "fwd ms", "bwd ms", "det ms", "bwd TF", "det TF", "f+b TF", "f+b det");
    } else if (o->csv) {
        printf("kind,head_dim,seqlen,batch,heads,causal,dropout,ms,tflops\n");
    } else {
        printf("%s\nbf16 forward, 16k tokens, hidden 2048\n%4s %6s %5s %5s %7s %8s %9s %8s\n",
               fg_context_target(ctx), "d", "seq", "batch", "heads", "causal", "dropout", "ms",
               "TFLOP/s");
    }
    for (int di = 0; di < nd; di++)
        for (int li = 0; li < nl; li++)
            for (int causal = 0; causal < 2; causal++)
                for (int drop = 0; drop < 2; drop++) {
                    fg_spec spec;
                    cli_problem pb;
                    standard_shape(dims[di], lens[li], causal, drop, &o->problem, &spec, &pb);
                    problem_run r;
                    if (problem_setup(ctx, &g, &spec, &pb, &r, NULL) != 0) continue;
                    double ms = time_forward(ctx, &g, &spec, &r.args, o->repeats);
                    if (ms >= 0 && o->pass == FG_PASS_BACKWARD) {
                        bench_backward_row(ctx, &g, o, &spec, &pb, &r, ms);
                    } else if (ms < 0) {
                        fprintf(stderr, "flashgen bench: %s\n", fg_context_message(ctx));
                    } else {
                        double tf = attention_flops(&spec, &pb) / (ms * 1e-3) / 1e12;
                        if (o->csv)
                            printf("flashgen,%d,%d,%d,%d,%d,%.1f,%.4f,%.1f\n", dims[di], lens[li],
                                   pb.batch, pb.heads_q, causal, pb.dropout_p, ms, tf);
                        else
                            printf("%4d %6d %5d %5d %7s %8.1f %9.3f %8.1f\n", dims[di], lens[li],
                                   pb.batch, pb.heads_q, causal ? "yes" : "no", pb.dropout_p, ms, tf);
                        if (o->tuned) bench_tuned(ctx, &g, o, &spec, &pb, FG_PASS_FORWARD, &r.args, ms);
                    }
                    fflush(stdout);
                    problem_free(&g, &r);
                }
    if (o->pass == FG_PASS_FORWARD) bench_host_overhead(ctx, &g);
    fg_context_destroy(ctx);
    gpu_close(&g);
    if (o->pass == FG_PASS_FORWARD) bench_compile_times(o);
    return 0;
}

/* ---- demo ---- */

static int demo_offline(void) {
    printf("No CUDA device (%s).\nPlanning and compiling for every named target instead.\n\n",
           fg_last_message());
    static const int dims[] = {64, 128, 256, 72};
    int rc = 0;
    for (int t = 0; t < profile_named_count(); t++) {
        const fg_profile *prof = profile_named_at(t);
        fg_context *ctx;
        if (cli_context_create(&ctx, prof->name) != FG_OK) return 1;
        printf("== %s\n", fg_context_target(ctx));
        printf("  %-58s %5s %5s %5s %7s %5s %6s %8s\n", "kernel", "Br", "Bc", "warps", "smem",
               "regs", "spill", "compile");
        for (int i = 0; i < 4; i++)
            for (int causal = 0; causal < 2; causal++) {
                fg_spec s = fg_spec_default(dims[i], prof->arch >= 80 ? FG_BF16 : FG_FP16);
                s.mask = causal ? FG_MASK_CAUSAL : FG_MASK_NONE;
                s.dropout = causal;
                fg_kernel_info info;
                if (fg_compile(ctx, &s, FG_PASS_FORWARD, &info) != FG_OK) {
                    printf("  FAILED: %s\n", fg_context_message(ctx));
                    rc = 1;
                    continue;
                }
                printf("  %-58s %5d %5d %5d %7d %5d %6d %6.0fms\n", info.plan.kernel_name,
                       info.plan.block_m, info.plan.block_n, info.plan.warps, info.plan.smem_bytes,
                       info.registers, info.spill_bytes, info.compile_ms);
                rc |= info.spill_bytes != 0;
            }
        fg_context_destroy(ctx);
    }
    return rc;
}

int cli_demo(const cli_options *o) {
    fg_context *ctx;
    if (cli_context_create(&ctx, NULL) != FG_OK) return demo_offline();
    fg_context_destroy(ctx);
    gpu g;
    if (open_live(&ctx, &g) != 0) return 1;
    /* a default problem unless the user gave spec options */
    fg_spec spec = o->spec;
    cli_problem pb = o->problem;
    if (spec.head_dim == 64 && spec.dtype == FG_FP16 && spec.mask == FG_MASK_NONE) {
        spec = fg_spec_default(128, FG_BF16);
        spec.mask = FG_MASK_CAUSAL;
        pb.batch = 4, pb.heads_q = pb.heads_kv = 16, pb.seqlen_q = pb.seqlen_k = 2048;
    }
    printf("%s\n", fg_context_target(ctx));
    fg_kernel_info info;
    if (fg_compile(ctx, &spec, FG_PASS_FORWARD, &info) != FG_OK) {
        fprintf(stderr, "flashgen demo: %s\n", fg_context_message(ctx));
        return 1;
    }
    printf("kernel %s: Br=%d Bc=%d warps=%d, %d registers, %d spill bytes, compile %.0f ms%s\n",
           info.plan.kernel_name, info.plan.block_m, info.plan.block_n, info.plan.warps,
           info.registers, info.spill_bytes, info.compile_ms, info.from_cache ? " (cached)" : "");
    int rc = check_problem(ctx, &g, &spec, &pb, FG_PASS_FORWARD, 0, 1);
    problem_run r;
    if (problem_setup(ctx, &g, &spec, &pb, &r, NULL) == 0) {
        double ms = time_forward(ctx, &g, &spec, &r.args, o->repeats);
        printf("speed: batch %d, heads %d, seqlen %d, d %d: %.3f ms, %.1f TFLOP/s\n", pb.batch,
               pb.heads_q, pb.seqlen_q, spec.head_dim, ms,
               attention_flops(&spec, &pb) / (ms * 1e-3) / 1e12);
        problem_free(&g, &r);
    }
    fg_context_destroy(ctx);
    gpu_close(&g);
    return rc;
}
