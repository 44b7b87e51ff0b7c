/* flashgen check --kv-cache: a decoding step over a KV cache on the live
 * GPU, paged or contiguous, each sequence against its own fp64 reference,
 * and the appended rows in the cache (harness/paged.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "harness/message.h"
#include "harness/paged.h"

/* The keys each sequence holds before the step: those listed, or drawn
 * from 0..what leaves room for the new rows. */
static void cached_of(const cli_problem *pb, int *cached) {
    const fgh_shape *s = &pb->shape;
    if (pb->cached_count) {
        memcpy(cached, pb->cached, (size_t)s->batch * sizeof *cached);
        return;
    }
    fgh_rng rng;
    cli_lengths_rng(pb, &rng);
    fgh_random_lengths(&rng, cached, s->batch, 0, s->seqlen_k - pb->seqlen_new);
}

static void describe(fg_context *ctx, const fgh_paged *k, int splits) {
    enum { SHOWN = 16 };
    const fgh_shape *s = &k->p.shape;
    char cache[64];
    if (k->page_size)
        snprintf(cache, sizeof cache, "%d pages of %d rows, shuffled", k->num_pages, k->page_size);
    else
        snprintf(cache, sizeof cache, "contiguous");
    printf("check %s: a decoding step, %d sequences of %d queries over a cache of %d rows each "
           "(%s), %d new rows each, splits %d%s; keys cached:",
           fg_context_target(ctx), s->batch, s->seqlen_q, s->seqlen_k, cache, k->seqlen_new, splits,
           splits ? "" : " (chosen)");
    for (int b = 0; b < s->batch && b < SHOWN; b++) printf(" %d", k->cached[b]);
    printf("%s\n", s->batch > SHOWN ? " ..." : "");
}

/* The step: each sequence's O and lse, then the appended rows. 1 when all
 * pass. */
static int check_step(fg_context *ctx, const fgh_device *d, fgh_paged *k, int splits) {
    const fg_spec *spec = &k->p.spec;
    fg_forward_args a = fgh_paged_forward_args(k, splits);
    double *o = malloc((k->p.no ? k->p.no : 1) * sizeof *o); /* (B, Hq, Sq, Dv) */
    fgh_written w;
    int ok = cli_check_ran(ctx, d, fg_forward(ctx, spec, &a), "kernel failed") &&
             (o || cli_check_failed("out of memory"));
    ok = ok && ((fgh_tensor_take(d, &k->p.o, o, spec->dtype, &w) && fgh_buffer_pull(d, &k->p.lse)) ||
                cli_check_failed(fgh_message()));
    const float *lse = fgh_buffer_at(&k->p.lse, k->p.lse.lead); /* (B, Hq, Sq) */
    cli_sequences seqs = {.worst_sequence = -1};
    for (int b = 0; ok && b < k->p.shape.batch; b++) {
        fgh_forward_check r;
        char label[96];
        if (!fgh_paged_check_forward(k, b, o, lse, &r)) {
            ok = cli_check_failed(fgh_message());
            break;
        }
        snprintf(label, sizeof label, "sequence %d (%d keys)", b, fgh_paged_keys(k, b));
        cli_sequence_result(&seqs, b, label, &r, spec->dtype);
    }
    free(o);
    ok = ok && cli_sequences_end(&seqs, spec->dtype);
    size_t differ = 0;
    if (k->seqlen_new && (fgh_paged_appended(d, k, &differ) || cli_check_failed(fgh_message()))) {
        printf("check: the appended rows in the cache: %zu values differ from the new rows: %s\n",
               differ, differ ? "FAIL" : "PASS");
        ok &= differ == 0;
    }
    return ok;
}

int cli_check_paged(fg_context *ctx, const fgh_device *d, const cli_options *o) {
    const cli_problem *pb = &o->problem;
    int *cached = malloc((size_t)pb->shape.batch * sizeof *cached);
    fgh_paged k;
    memset(&k, 0, sizeof k);
    int ok = cached || cli_check_failed("out of memory");
    if (ok) {
        cached_of(pb, cached);
        fgh_placement pl = {pb->bhsd ? FGH_BHSD : FGH_BSHD, 0, 0, 0};
        ok = fgh_paged_init(&k, &o->spec, &pb->shape, cached, pb->seqlen_new, pb->page_size, &pl) ||
             cli_check_failed(fgh_message());
    }
    fgh_rng pages;
    fgh_rng_seed(&pages, pb->shape.seed ^ 0x9a6e5u);
    ok = ok && cli_problem_fill(ctx, &o->spec, pb, 0, &k.p) == 0 &&
         (fgh_paged_upload(d, &k, &pages) || cli_check_failed(fgh_message()));
    if (ok) {
        describe(ctx, &k, pb->splits);
        ok = check_step(ctx, d, &k, pb->splits);
    }
    fgh_paged_free(d, &k);
    free(cached);
    return ok ? 0 : 1;
}
