/* flashgen bench --kv-cache: decoding steps over paged and contiguous
 * caches, KV bytes read per second against a device-to-device copy's
 * bandwidth measured in the same run (the definitions of bench/decode.py). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "harness/bulk.h"
#include "harness/message.h"
#include "harness/paged.h"
#include "harness/timing.h"

#define HQ 32 /* a KV cache's heads; a latent cache's are 16 on 1 (DeepSeek's decoding) */
#define HKV 8
#define LATENT_HQ 16
#define MAX_TOKENS (1 << 22) /* batch x context: 16 GiB of K and V at d 128 */
#define COPY_BYTES ((size_t)4 << 30)

/* One step's memory: the cache (contiguous (B, context, Hkv, D|Dv) or
 * pages (B·context / page, page, Hkv, D|Dv)), q (B, 1, Hq, D) and o (B, 1,
 * Hq, Dv), the arrays. */
typedef struct step_memory {
    CUdeviceptr k, v, q, o, lens, table;
} step_memory;

static void step_free(const fgh_device *d, step_memory *m) {
    CUdeviceptr *all[] = {&m->k, &m->v, &m->q, &m->o, &m->lens, &m->table};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) fgh_bulk_free(d, all[i]);
}

/* The step's memory with random K, V and q, every sequence holding
 * `context` keys, pages handed out shuffled; its call in *a. 1, or 0 with
 * the message. */
static int step_make(const fgh_device *d, const fg_spec *spec, int batch, int context, int page,
                     int splits, fgh_rng *rng, step_memory *m, fg_forward_args *a) {
    memset(m, 0, sizeof *m);
    const int latent = spec->kv_cache == FG_KV_LATENT, hq = latent ? LATENT_HQ : HQ;
    const int hkv = latent ? 1 : HKV, dim = spec->head_dim, dim_v = spec->head_dim_v;
    const size_t tokens = (size_t)batch * context, row = (size_t)hkv * dim, row_v = (size_t)hkv * dim_v;
    const size_t n = tokens * row, nv = latent ? 0 : tokens * row_v, nq = (size_t)batch * hq * dim;
    const size_t no = (size_t)batch * hq * dim_v;
    int *lens = malloc((size_t)batch * sizeof *lens);
    int *table = malloc((page ? tokens / page : 1) * sizeof *table);
    int ok = lens && table ? 1 : fgh_fail("out of host memory");
    for (int b = 0; ok && b < batch; b++) lens[b] = context;
    ok = ok && fgh_bulk_alloc(d, &m->k, n * 2) && (latent || fgh_bulk_alloc(d, &m->v, nv * 2)) &&
         fgh_bulk_alloc(d, &m->q, nq * 2) && fgh_bulk_alloc(d, &m->o, no * 2) &&
         fgh_bulk_random(d, m->k, n, FG_BF16, rng) &&
         (latent || fgh_bulk_random(d, m->v, nv, FG_BF16, rng)) &&
         fgh_bulk_random(d, m->q, nq, FG_BF16, rng) &&
         fgh_bulk_ints(d, &m->lens, lens, (size_t)batch);
    int pages = page ? context / page : 0;
    ok = ok && (!page || (fgh_page_table(rng, batch, lens, page, pages, 0, table) >= 0 &&
                          fgh_bulk_ints(d, &m->table, table, tokens / page)));
    free(lens), free(table);
    *a = fg_forward_args_default();
    a->q = fg_tensor_bshd((void *)(uintptr_t)m->q, 1, hq, dim);
    a->o = fg_tensor_bshd((void *)(uintptr_t)m->o, 1, hq, dim_v);
    a->k = fg_tensor_bshd((void *)(uintptr_t)m->k, context, hkv, dim);
    a->v = fg_tensor_bshd((void *)(uintptr_t)m->v, context, hkv, dim_v); /* latent: none */
    if (page) { /* the pools: (pages, page, Hkv, D) and (..., Dv) */
        a->k = (fg_tensor){(void *)(uintptr_t)m->k, (int64_t)(page * row), (int64_t)row, dim, 1};
        if (!latent)
            a->v = (fg_tensor){(void *)(uintptr_t)m->v, (int64_t)(page * row_v), (int64_t)row_v, dim_v, 1};
        a->block_table = (const int32_t *)(uintptr_t)m->table;
        a->block_table_stride = pages;
        a->page_size = page;
        a->num_pages = (int)(tokens / page);
    }
    a->batch = batch, a->heads_q = hq, a->heads_kv = hkv;
    a->seqlen_q = 1, a->seqlen_k = context;
    a->cache_seqlens = (const int32_t *)(uintptr_t)m->lens;
    a->num_splits = splits;
    return ok;
}

static void page_name(int page, char *buf, size_t len) {
    if (page) snprintf(buf, len, "%d", page);
    else snprintf(buf, len, "contiguous");
}

int cli_bench_decode(fg_context *ctx, const fgh_device *d, const cli_options *o) {
    static const int pages_all[] = {16, 256, 1, 0};
    static const int batches_all[] = {1, 4, 16, 64}, batches_quick[] = {1, 8, 64};
    static const int contexts_all[] = {1024, 4096, 16384, 32768, 131072},
                     contexts_quick[] = {4096, 131072};
    const int *pages = o->page_size_given ? &o->problem.page_size : pages_all;
    const int *batches = o->quick ? batches_quick : batches_all;
    const int *contexts = o->seqlen_given ? &o->problem.shape.seqlen_q
                          : o->quick      ? contexts_quick
                                          : contexts_all;
    const int np = o->page_size_given ? 1 : 4, nb = o->quick ? 3 : 4;
    const int nc = o->seqlen_given ? 1 : o->quick ? 2 : 5;
    const int latent = o->spec.kv_cache == FG_KV_LATENT;
    const int dim = o->head_dim_given || latent ? o->spec.head_dim : 128;
    const int dim_v = o->spec.head_dim_v ? o->spec.head_dim_v : dim;
    const int hq = latent ? LATENT_HQ : HQ, hkv = latent ? 1 : HKV;
    size_t memory = 0, copy_bytes = COPY_BYTES;
    d->cu->cuDeviceTotalMem(&memory, d->device);
    if (memory && copy_bytes > memory / 8) copy_bytes = memory / 8; /* two buffers, room left */
    double copy;
    if (!fgh_copy_bandwidth(d, copy_bytes, &copy)) {
        cli_error("bench: %s", fgh_message());
        return 1;
    }
    printf("%s\ndevice-to-device copy: %.0f GB/s (read + write)\n"
           "bf16, d %d, value head dim %d%s, %d/%d heads, 1 query per sequence; KV bytes read per "
           "second (K and V of every sequence once) and their share of the copy's\n",
           fg_context_target(ctx), copy / 1e9, dim, dim_v, latent ? " (a latent cache)" : "", hq,
           hkv);
    fg_spec spec = fg_spec_default(dim, FG_BF16);
    spec.head_dim_v = dim_v;
    spec.kv_cache = o->spec.kv_cache;
    fgh_rng rng;
    fgh_rng_seed(&rng, 0);
    int ok = 1, steps = 0, started = 0;
    for (int pi = 0; pi < np; pi++) /* the steps timed, for the progress */
        for (int bi = 0; bi < nb; bi++)
            for (int ci = 0; ci < nc; ci++)
                steps += (double)batches[bi] * contexts[ci] <= MAX_TOKENS &&
                         !(pages[pi] && contexts[ci] % pages[pi]);
    fflush(stdout);
    cli_progress progress;
    cli_progress_start(&progress, "bench", steps);
    for (int pi = 0; pi < np; pi++) {
        const int page = pages[pi];
        char name[16];
        page_name(page, name, sizeof name);
        double worst = 2, best = 0;
        for (int bi = 0; bi < nb; bi++)
            for (int ci = 0; ci < nc; ci++) {
                const int batch = batches[bi], context = contexts[ci];
                const double tokens = (double)batch * context;
                if (tokens > MAX_TOKENS || (page && context % page)) continue;
                char now[64];
                snprintf(now, sizeof now, "page %s batch %d context %d", name, batch, context);
                cli_progress_step(&progress, started++ > 0, now);
                step_memory m;
                fg_forward_args a;
                double ms = -1;
                if (step_make(d, &spec, batch, context, page, o->problem.splits, &rng, &m, &a)) {
                    ms = fgh_time_forward(d, ctx, &spec, &a, o->repeats);
                    if (ms < 0) cli_error("bench: %s", fg_context_message(ctx));
                } else {
                    cli_error("bench: batch %d, context %d: %s", batch, context, fgh_message());
                }
                step_free(d, &m);
                if (ms < 0) {
                    ok = 0;
                    continue;
                }
                double kv_bytes = tokens * hkv * (dim + (latent ? 0 : dim_v)) * 2, share = kv_bytes / (ms * 1e-3) / copy;
                cli_progress_hide(&progress);
                printf("page %10s batch %3d context %6d: %8.1f us %6.0f GB/s %5.2f of copy\n", name,
                       batch, context, ms * 1e3, kv_bytes / (ms * 1e-3) / 1e9, share);
                fflush(stdout);
                if (tokens >= 65536) {
                    worst = share < worst ? share : worst;
                    best = share > best ? share : best;
                }
            }
        cli_progress_hide(&progress);
        if (best > 0)
            printf("page %s: from 64k tokens, worst %.2f and best %.2f of the copy bandwidth\n",
                   name, worst, best);
    }
    cli_progress_end(&progress);
    return ok ? 0 : 1;
}
