/* block_mask: the family interface over kernel_block_mask.lua; its plan has
 * nothing to choose. */
#include "families/block_mask.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "families/forward_call.h"

int block_mask_spec(const fg_spec *spec, fg_spec *out, char *err, size_t err_len) {
    if (!spec->mask_mod || !spec->mask_mod[0] || spec->sparsity != FG_SPARSE_LAYOUT) {
        snprintf(err, err_len, "a block mask needs spec.mask_mod and spec.sparsity "
                 "FG_SPARSE_LAYOUT (its block sizes)");
        return -1;
    }
    if (spec->varlen || spec->kv_cache) {
        snprintf(err, err_len, "block masks are for dense batches: spec.%s tests the mask "
                 "predicate on every tile", spec->varlen ? "varlen" : "kv_cache");
        return -1;
    }
    fg_spec s = fg_spec_default(64, FG_FP16);
    s.sparsity = FG_SPARSE_LAYOUT;
    s.sparse_block_q = spec->sparse_block_q;
    s.sparse_block_k = spec->sparse_block_k;
    s.mask_mod = spec->mask_mod;
    s.aux_count = spec->aux_count;
    memcpy(s.aux, spec->aux, sizeof s.aux);
    *out = s;
    return 0;
}

_Static_assert(sizeof(fg_block_mask_params) <= FAMILY_PARAMS_MAX,
               "fg_block_mask_params outgrew family_args");

static int supports(const fg_spec *spec, const fg_profile *prof, char *err, size_t err_len) {
    fg_spec s;
    (void)prof;
    return block_mask_spec(spec, &s, err, err_len);
}

static int plan(const fg_spec *spec, const fg_profile *prof, int budget, family_plan *out,
                char *err, size_t err_len) {
    (void)budget;
    memset(out, 0, sizeof *out);
    return supports(spec, prof, err, err_len);
}

static int plan_tiling(const fg_spec *spec, const fg_profile *prof, const family_tiling *t,
                       family_plan *out, char *err, size_t err_len) {
    (void)t;
    return plan(spec, prof, 0, out, err, err_len);
}

static int candidates(const fg_spec *spec, const fg_profile *prof, family_tiling *out, int max) {
    (void)spec, (void)prof, (void)out, (void)max;
    return 0;
}

static void tiling_of(const family_plan *p, family_tiling *t) {
    (void)p;
    memset(t, 0, sizeof *t);
}

static void registers(const family_plan *p, int *accumulators, int *budget) {
    (void)p;
    *accumulators = 0, *budget = 0;
}

static void describe(const family_plan *p, fg_plan_info *out) {
    (void)p;
    family_plan_info(out, 0, 0, 8, 1, 0, 0, 256,
                     "A block mask's build: one thread block of 256 per block of the layout, "
                     "a thread per list.\n");
}

static int generate(const fg_spec *spec, const family_plan *p, const kernel_target *target,
                    generated *out, char *err, size_t err_len) {
    (void)p;
    return generate_kernel("kernel_block_mask.lua", spec, target, NULL, 0,
                           &block_mask_params_layout, out, err, err_len);
}

static size_t workspace(const family_plan *p, const family_call *call, const family_device *dev) {
    (void)p, (void)call, (void)dev;
    return 0;
}

/* The layout's buffers come with the call (call->layout); its shape sizes
 * the grids. */
static int arguments(const family_plan *p, const fg_spec *spec, const family_call *call,
                     const family_device *dev, uint64_t ws, family_args *out, char *err,
                     size_t err_len) {
    (void)p, (void)spec, (void)dev, (void)ws;
    memset(out, 0, sizeof *out);
    fg_block_mask_params *x = (fg_block_mask_params *)out->params;
    const fg_forward_args *a = call->forward;
    const family_layout *l = &call->layout;
    int64_t lists = (int64_t)l->batch * l->heads * l->blocks_q;
    int64_t key_lists = (int64_t)l->batch * l->heads * l->blocks_k;
    if (lists * l->blocks_k > INT32_MAX) {
        snprintf(err, err_len, "a block mask of %lld blocks: at most 2^31-1",
                 (long long)(lists * l->blocks_k));
        return -1;
    }
    x->states = l->states;
    x->block_count = l->counts, x->block_index = l->indices;
    x->query_count = l->counts_by_key, x->query_index = l->indices_by_key;
    x->batch = a->batch, x->heads_q = a->heads_q;
    x->seqlen_q = a->seqlen_q, x->seqlen_k = a->seqlen_k;
    x->layout_batch = l->batch, x->layout_heads = l->heads;
    x->layout_blocks_q = l->blocks_q, x->layout_blocks_k = l->blocks_k;
    x->layout_lists = (int32_t)lists, x->layout_key_lists = (int32_t)key_lists;
    set_aux_params(a, x->aux_data, x->aux_stride, x->aux_size);
    x->pos_q = (int32_t)a->position_q, x->pos_k = (int32_t)a->position_k;
    return 0;
}

const kernel_family block_mask_family = {
    .name = "block_mask",
    .pass = FG_PASS_BLOCK_MASK,
    .min_cc = 75,
    .max_cc = 0,
    .arch_specific = 0,
    .params = &block_mask_params_layout,
    .writes = 0,
    .tuning_rel_tolerance = 0.f,
    .supports = supports,
    .plan = plan,
    .plan_tiling = plan_tiling,
    .candidates = candidates,
    .tiling_of = tiling_of,
    .registers = registers,
    .describe = describe,
    .tiling_ints = 1,
    .generate = generate,
    .workspace = workspace,
    .arguments = arguments,
};
