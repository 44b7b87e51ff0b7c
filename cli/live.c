/* What the GPU commands (check, bench, tune, demo) start from: the live GPU
 * and the options' problem on it. */
#include <stdio.h>

#include "cli/cli.h"
#include "harness/message.h"
#include "harness/random.h"

int cli_live_context(fg_context **ctx, const char *command) {
    if (cli_context_create(ctx, NULL) == FG_OK) return 0;
    char valid[128];
    cli_error("%s needs a CUDA GPU, and none could be used here: %s", command, fg_last_message());
    cli_error("without a GPU, plan, source, compile and bundle work: name a target (%s), "
              "e.g. 'flashgen compile -d 128 --target h100'",
              cli_target_list(valid, sizeof valid));
    return -1;
}

int cli_open_live(fg_context **ctx, fgh_device *d, const char *command) {
    if (cli_live_context(ctx, command) != 0) return -1;
    if (!fgh_device_open(d)) {
        cli_error("%s", fgh_message());
        fgh_device_close(d);
        fg_context_destroy(*ctx);
        return -1;
    }
    return 0;
}

void cli_close_live(fg_context *ctx, fgh_device *d) {
    fg_context_destroy(ctx);
    fgh_device_close(d);
}

int cli_problem_fill(fg_context *ctx, const fg_spec *spec, const cli_problem *pb, int grads,
                     fgh_problem *p) {
    const fgh_shape *s = &pb->shape;
    fgh_rng rng;
    fgh_rng_seed(&rng, s->seed);
    if (spec->sparsity == FG_SPARSE_LAYOUT && spec->mask_mod && spec->mask_mod[0]) {
        /* a predicate's layout is its block mask, built at the upload */
        if (!fgh_problem_use_block_mask(p, ctx)) {
            cli_error("%s", fgh_message());
            return -1;
        }
    } else if (spec->sparsity == FG_SPARSE_LAYOUT) {
        uint8_t *mask =
            fgh_random_layout(&rng, s->heads_q, p->blocks_q, p->blocks_k, pb->layout_density);
        if (!mask || !fgh_problem_set_layout(p, ctx, mask, s->heads_q)) {
            cli_error("%s", fgh_message());
            return -1;
        }
    }
    fgh_fill_uniform(&rng, p->host.q, p->nq, spec->dtype);
    fgh_fill_uniform(&rng, p->host.k, p->nk, spec->dtype);
    fgh_fill_uniform(&rng, p->host.v, p->nv, spec->dtype); /* (value head dim) */
    cli_aux_fill(&rng, p);
    if (grads) {
        fgh_rng_seed(&rng, s->seed ^ 0x5bd1e995u);
        fgh_fill_uniform(&rng, p->host.d_o, p->no, spec->dtype);
    }
    return 0;
}

void cli_lengths_rng(const cli_problem *pb, fgh_rng *rng) {
    fgh_rng_seed(rng, pb->shape.seed ^ 0x1e9f7c3bu);
}

int cli_problem_setup(fg_context *ctx, const fgh_device *d, const fg_spec *spec,
                      const cli_problem *pb, int grads, fgh_problem *p) {
    fgh_placement place = {pb->bhsd ? FGH_BHSD : FGH_BSHD, 0, 0, 0};
    if (!fgh_problem_init(p, spec, &pb->shape, &place, grads)) {
        cli_error("%s", fgh_message());
    } else if (cli_problem_fill(ctx, spec, pb, grads, p) == 0) {
        if (fgh_problem_upload(d, p)) return 0;
        cli_error("%s", fgh_message());
    }
    fgh_problem_free(d, p);
    return -1;
}
