/* flashgen bench --varlen: packed sequences of random lengths, TFLOP/s over
 * the real work, beside the dense kernel on as many sequences of the mean
 * length (the definitions of bench/varlen.py). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "harness/bulk.h"
#include "harness/message.h"
#include "harness/timing.h"

#define HEADS 16

/* The tensors of a call, each (rows, H, D) bf16, v, o, dO and dV (rows, H,
 * Dv) (lse (H, rows) fp32): packed rows, or a dense batch (B, S, H, D) of
 * B·S rows. */
typedef struct call_memory {
    CUdeviceptr q, k, v, o, lse, d_o, d_q, d_k, d_v;
} call_memory;

static int memory_alloc(const fgh_device *d, size_t rows, int dim, int dim_v, int grads,
                        fgh_rng *rng, call_memory *m) {
    memset(m, 0, sizeof *m);
    size_t n = rows * HEADS * dim, bytes = n * 2;
    size_t nv = rows * HEADS * dim_v, bytes_v = nv * 2;
    int ok = fgh_bulk_alloc(d, &m->q, bytes) && fgh_bulk_alloc(d, &m->k, bytes) &&
             fgh_bulk_alloc(d, &m->v, bytes_v) && fgh_bulk_alloc(d, &m->o, bytes_v) &&
             fgh_bulk_alloc(d, &m->lse, rows * HEADS * sizeof(float)) &&
             fgh_bulk_random(d, m->q, n, FG_BF16, rng) && fgh_bulk_random(d, m->k, n, FG_BF16, rng) &&
             fgh_bulk_random(d, m->v, nv, FG_BF16, rng);
    if (ok && grads)
        ok = fgh_bulk_alloc(d, &m->d_o, bytes_v) && fgh_bulk_alloc(d, &m->d_q, bytes) &&
             fgh_bulk_alloc(d, &m->d_k, bytes) && fgh_bulk_alloc(d, &m->d_v, bytes_v) &&
             fgh_bulk_random(d, m->d_o, nv, FG_BF16, rng);
    return ok;
}

static void memory_free(const fgh_device *d, call_memory *m) {
    CUdeviceptr *all[] = {&m->q, &m->k, &m->v, &m->o, &m->lse, &m->d_o, &m->d_q, &m->d_k, &m->d_v};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) fgh_bulk_free(d, all[i]);
}

/* A call on m's tensors seen as (B, S, H, D), v and o (B, S, H, Dv). */
static fg_forward_args call_args(const call_memory *m, int batch, int seqlen, int dim, int dim_v) {
    fg_forward_args a = fg_forward_args_default();
    a.q = fg_tensor_bshd((void *)(uintptr_t)m->q, seqlen, HEADS, dim);
    a.k = fg_tensor_bshd((void *)(uintptr_t)m->k, seqlen, HEADS, dim);
    a.v = fg_tensor_bshd((void *)(uintptr_t)m->v, seqlen, HEADS, dim_v);
    a.o = fg_tensor_bshd((void *)(uintptr_t)m->o, seqlen, HEADS, dim_v);
    a.lse = (float *)(uintptr_t)m->lse;
    a.batch = batch, a.heads_q = a.heads_kv = HEADS;
    a.seqlen_q = a.seqlen_k = seqlen;
    return a;
}

/* Milliseconds of the forward a into ms[0] and, with grads, of its
 * backward (fast schedule) into ms[1]; 1, or 0 after the error was printed. */
static int time_call(fg_context *ctx, const fgh_device *d, const cli_options *o, const fg_spec *spec,
                     const call_memory *m, fg_forward_args a, int grads, double ms[2]) {
    ms[0] = fgh_time_forward(d, ctx, spec, &a, o->repeats);
    if (ms[0] >= 0 && grads) {
        fg_backward_args b;
        memset(&b, 0, sizeof b);
        b.forward = a; /* o and lse as its last call wrote them */
        b.d_q = a.q, b.d_k = a.q, b.d_o = a.o, b.d_v = a.o; /* shapes: dO and dV of Dv */
        b.d_o.data = (void *)(uintptr_t)m->d_o, b.d_q.data = (void *)(uintptr_t)m->d_q;
        b.d_k.data = (void *)(uintptr_t)m->d_k, b.d_v.data = (void *)(uintptr_t)m->d_v;
        ms[1] = fgh_time_backward(d, ctx, spec, &b, o->repeats);
    }
    if (ms[0] >= 0 && (!grads || ms[1] >= 0)) return 1;
    cli_error("bench: %s", fg_context_message(ctx));
    return 0;
}

int cli_bench_varlen(fg_context *ctx, const fgh_device *d, const cli_options *o) {
    const int count = o->quick ? 16 : 64, dim = o->head_dim_given ? o->spec.head_dim : 128;
    const int dim_v = o->spec.head_dim_v ? o->spec.head_dim_v : dim;
    const int hi = o->seqlen_given ? o->problem.shape.seqlen_q : 8192, lo = hi < 128 ? hi : 128;
    const int grads = o->pass == FG_PASS_BACKWARD;
    int lens[64], cu[65] = {0}, longest = 0;
    fgh_rng rng;
    fgh_rng_seed(&rng, 0);
    fgh_random_lengths(&rng, lens, count, lo, hi);
    for (int b = 0; b < count; b++) {
        cu[b + 1] = cu[b] + lens[b];
        longest = lens[b] > longest ? lens[b] : longest;
    }
    const int total = cu[count], mean = total / count;
    char dims[24];
    printf("%s\nbf16 packed sequences: %d of lengths %d..%d (mean %d, %d tokens), %d heads, d %s; "
           "TFLOP/s over the real work\n(%s per sequence, halved for causal); dense: the "
           "dense kernel on %d sequences of %d\n%-8s %6s %10s %8s %10s %8s %13s\n",
           fg_context_target(ctx), count, lo, hi, mean, total, HEADS,
           cli_bench_dim(o, dim, dims, sizeof dims), o->spec.head_dim_v ? "2*L*L*H*(d + dv)" : "4*L*L*H*d",
           count, mean, "pass", "causal", "varlen ms", "TFLOP/s", "dense ms", "TFLOP/s",
           "varlen/dense");
    call_memory packed, dense;
    CUdeviceptr d_cu = 0;
    int ok = memory_alloc(d, (size_t)total, dim, dim_v, grads, &rng, &packed) &&
             memory_alloc(d, (size_t)count * mean, dim, dim_v, grads, &rng, &dense) &&
             fgh_bulk_ints(d, &d_cu, cu, (size_t)count + 1);
    if (!ok) cli_error("bench: %s", fgh_message());
    fflush(stdout);
    cli_progress progress;
    cli_progress_start(&progress, "bench", 2);
    for (int causal = 0; ok && causal < 2; causal++) {
        cli_progress_step(&progress, causal, causal ? "causal" : "no mask");
        fg_spec spec = fg_spec_default(dim, FG_BF16);
        spec.head_dim_v = o->spec.head_dim_v;
        fg_spec dense_spec = spec;
        spec.varlen = 1;
        spec.mask = dense_spec.mask = causal ? FG_MASK_CAUSAL : FG_MASK_NONE;
        /* Q·Kᵀ over d, P·V over dv */
        const double per = 2.0 * HEADS * (dim + dim_v);
        double work = 0, dense_work = per * count * mean * (double)mean;
        for (int b = 0; b < count; b++) work += per * lens[b] * (double)lens[b];
        if (causal) work /= 2, dense_work /= 2;
        fg_forward_args a = call_args(&packed, count, longest, dim, dim_v);
        a.cu_seqlens_q = a.cu_seqlens_k = (const int32_t *)(uintptr_t)d_cu;
        a.total_q = a.total_k = total;
        double ms[2], dense_ms[2];
        if (!time_call(ctx, d, o, &spec, &packed, a, grads, ms) ||
            !time_call(ctx, d, o, &dense_spec, &dense, call_args(&dense, count, mean, dim, dim_v),
                       grads, dense_ms)) {
            ok = 0;
            break;
        }
        cli_progress_hide(&progress);
        for (int pass = 0; pass <= grads; pass++) {
            /* forward+backward: 3.5x the forward's FLOPs */
            double t = pass ? ms[0] + ms[1] : ms[0], dt = pass ? dense_ms[0] + dense_ms[1] : dense_ms[0];
            double f = pass ? 3.5 : 1.0, tf = f * work / (t * 1e-3) / 1e12;
            double dense_tf = f * dense_work / (dt * 1e-3) / 1e12;
            printf("%-8s %6s %10.3f %8.1f %10.3f %8.1f %13.2f\n", pass ? "fwd+bwd" : "forward",
                   causal ? "yes" : "no", t, tf, dt, dense_tf, tf / dense_tf);
        }
        fflush(stdout);
    }
    cli_progress_end(&progress);
    memory_free(d, &packed);
    memory_free(d, &dense);
    fgh_bulk_free(d, &d_cu);
    return ok ? 0 : 1;
}
