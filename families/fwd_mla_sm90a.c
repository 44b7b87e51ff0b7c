/* fwd_mla_sm90a: planning (see fwd_mla_sm90a.h), generation and launch
 * arguments. */
#include "families/fwd_mla_sm90a.h"

#include <stdio.h>
#include <string.h>

#include "families/sm90a.h"
#include "gen/spec.h"

#define MLA_SM90A_ROWS 64
#define MLA_SM90A_NARROW 16 /* the narrow kernel's rows */
#define MLA_SM90A_BLOCK_N 64 /* P's 128-byte rows: a box */
#define MLA_SM90A_SLOTS 2
#define MLA_SM90A_WARPS 8

_Static_assert(sizeof(fwd_mla_sm90a_plan) <= sizeof(family_plan), "plan outgrew family_plan");
_Static_assert(sizeof(fg_decode_tma_params) <= FAMILY_PARAMS_MAX, "params outgrew family_args");
_Static_assert(sizeof(fwd_mla_sm90a_tiling) <= sizeof(family_tiling),
               "tiling outgrew family_tiling");

static const fwd_mla_sm90a_plan *plan_of(const family_plan *p) {
    return (const fwd_mla_sm90a_plan *)p->bytes;
}

static int supports(const fg_spec *spec, const fg_profile *prof, char *err, size_t err_len) {
    (void)prof;
    const int dv = spec_head_dim_v(spec);
    if (spec->kv_cache != FG_KV_LATENT)
        return snprintf(err, err_len, "fwd_mla_sm90a runs decoding steps over a latent cache only "
                        "(spec.kv_cache FG_KV_LATENT)"), -1;
    if (spec->head_dim % 64 || dv % 128 || spec->head_dim <= dv)
        return snprintf(err, err_len, "fwd_mla_sm90a takes a head dim that is a multiple of 64 "
                        "and past a value head dim that is a multiple of 128 (here %d and %d): "
                        "P takes a box of K's columns past V's", spec->head_dim, dv), -1;
    return 0;
}

/* Q (64 rows) and the two slots of 64 keys in 64-column boxes, the rows'
 * factors of O per slot and their sums, three barriers per slot and two
 * more (Q in, the last tile's rows past the keys cleared); 1024 for
 * aligning the swizzled boxes. */
static int fill(fwd_mla_sm90a_plan *plan, const fg_spec *spec, const fg_profile *prof, char *err,
                size_t err_len) {
    memset(plan, 0, sizeof *plan);
    const int boxes = spec->head_dim / 64;
    const int smem = 1024 + MLA_SM90A_ROWS * 128 * boxes +
                     MLA_SM90A_SLOTS * MLA_SM90A_BLOCK_N * 128 * boxes +
                     (MLA_SM90A_SLOTS + 1) * MLA_SM90A_ROWS * 4 + (3 * MLA_SM90A_SLOTS + 2) * 8;
    if (smem > prof->smem_per_block)
        return snprintf(err, err_len, "plan: latent decoding of head dim %d with warpgroup MMAs "
                        "needs %d bytes of shared memory (over %d on %s)", spec->head_dim, smem,
                        prof->smem_per_block, prof->name), -1;
    plan->block_n = MLA_SM90A_BLOCK_N;
    plan->rows = MLA_SM90A_ROWS;
    plan->stages = MLA_SM90A_SLOTS;
    plan->warps = MLA_SM90A_WARPS;
    plan->threads = 32 * MLA_SM90A_WARPS;
    plan->boxes = boxes;
    plan->half_boxes = spec_head_dim_v(spec) / 128;
    plan->smem_bytes = smem;
    plan->narrow = MLA_SM90A_NARROW;
    /* Q (16 rows), the slots, P (16 rows of a tile's keys), the warps' row
     * maxima and sums, two barriers per slot and two more, then (16-byte
     * aligned) the rows' places in lse and o (two int64 a row) and what a
     * pair's second block hands over (a float per accumulator of O and 8
     * more, the rows' maxima and sums, per MMA thread). Within the 64-row
     * kernel's, checked above: its Q's 48 more rows, 6 KB a box, outweigh
     * the hand-over */
    plan->narrow_smem_bytes = 1024 + MLA_SM90A_NARROW * 128 * boxes +
                              MLA_SM90A_SLOTS * MLA_SM90A_BLOCK_N * 128 * boxes +
                              MLA_SM90A_NARROW * 128 + 2 * 4 * MLA_SM90A_NARROW * 4 +
                              (2 * MLA_SM90A_SLOTS + 2) * 8 + 15 + MLA_SM90A_NARROW * 16 +
                              128 * (spec_head_dim_v(spec) / 8 + 8) * 4;
    plan->max_splits = DECODE_MAX_SPLITS;
    plan->combine_threads = COMBINE_THREADS;
    plan->combine_warp_splits = COMBINE_WARP_SPLITS;
    snprintf(plan->why, sizeof plan->why,
             "Latent decoding with warpgroup MMAs: 64 query rows per thread block, tiles of 64 "
             "keys in two slots; an S warpgroup (scores, softmax, P into the slot) and a V "
             "warpgroup (the copies), each %d of O's %d columns: %d bytes of shared memory of "
             "%d. The KV length is split over thread blocks until they fill the GPU.\n",
             spec_head_dim_v(spec) / 2, spec_head_dim_v(spec), smem, prof->smem_per_block);
    return 0;
}

static int plan(const fg_spec *spec, const fg_profile *prof, int budget, family_plan *out,
                char *err, size_t err_len) {
    (void)budget; /* one tiling */
    return fill((fwd_mla_sm90a_plan *)out->bytes, spec, prof, err, err_len);
}

static int plan_tiling(const fg_spec *spec, const fg_profile *prof, const family_tiling *t,
                       family_plan *out, char *err, size_t err_len) {
    fwd_mla_sm90a_tiling x;
    family_tiling_unpack(t, &x, sizeof x);
    if (x.rows != MLA_SM90A_ROWS)
        return snprintf(err, err_len, "plan: fwd_mla_sm90a takes %d rows a thread block, not %d",
                        MLA_SM90A_ROWS, x.rows), -1;
    return fill((fwd_mla_sm90a_plan *)out->bytes, spec, prof, err, err_len);
}

static int candidates(const fg_spec *spec, const fg_profile *prof, family_tiling *out, int max) {
    fwd_mla_sm90a_plan p;
    char err[256];
    fwd_mla_sm90a_tiling x = {MLA_SM90A_ROWS};
    if (max < 1 || fill(&p, spec, prof, err, sizeof err) != 0) return 0;
    family_tiling_pack(&out[0], &x, sizeof x);
    return 1;
}

static void tiling_of(const family_plan *p, family_tiling *t) {
    fwd_mla_sm90a_tiling x = {plan_of(p)->rows};
    family_tiling_pack(t, &x, sizeof x);
}

static void registers(const family_plan *p, int *accumulators, int *budget) {
    const fwd_mla_sm90a_plan *x = plan_of(p); /* a warpgroup's half of O and its S */
    *accumulators = x->rows ? x->half_boxes * 64 / 2 + x->block_n / 2 : 0;
    *budget = 0;
}

static void describe(const family_plan *p, fg_plan_info *out) {
    const fwd_mla_sm90a_plan *x = plan_of(p);
    family_plan_info(out, x->rows, x->block_n, x->warps, x->stages, x->boxes * 64, x->smem_bytes,
                     x->threads, x->why);
}

static int generate(const fg_spec *spec, const family_plan *p, const kernel_target *target,
                    generated *out, char *err, size_t err_len) {
    const fwd_mla_sm90a_plan *plan = plan_of(p);
#define MLA_SM90A_FIGURE(name) {#name, plan->name},
    const plan_figure figures[] = {MLA_SM90A_PLAN_FIGURES(MLA_SM90A_FIGURE)};
#undef MLA_SM90A_FIGURE
    return generate_kernel("kernel_fwd_mla_sm90a.lua", spec, target, figures,
                           (int)(sizeof figures / sizeof figures[0]), &decode_tma_params_layout, out,
                           err, err_len);
}

/* Whether a call takes the narrow kernel: at most its rows a KV head. */
static int narrow(const fwd_mla_sm90a_plan *plan, const fg_forward_args *a) {
    return (long long)a->seqlen_q * (a->heads_q / a->heads_kv) <= plan->narrow;
}

static kv_cache_shape shape_of(const fwd_mla_sm90a_plan *plan, const fg_forward_args *a) {
    const int rows = a->seqlen_q * (a->heads_q / a->heads_kv);
    const int block_rows = narrow(plan, a) ? plan->narrow : plan->rows;
    /* 16-bit latent rows (64-column boxes), one block an SM */
    kv_cache_shape x = {plan->block_n, 2 * 64 * plan->boxes, 1, DECODE_SM_GB_PER_S,
                        DECODE_SM_GB_PER_S, plan->half_boxes * 128, block_rows / 16,
                        (rows + block_rows - 1) / block_rows, 0, 0, 0};
    return x;
}

/* Whether a call runs the narrow kernel in pairs: two splits, added in the
 * cluster's shared memory (no parts in the workspace, no combine kernel). */
static int paired(const fwd_mla_sm90a_plan *plan, const kv_cache_shape *shape,
                  const fg_forward_args *a, const fg_profile *prof) {
    return narrow(plan, a) && kv_cache_splits(shape, a, prof) == 2;
}

static size_t workspace(const family_plan *p, const family_call *call, const family_device *dev) {
    kv_cache_shape shape = shape_of(plan_of(p), call->forward);
    if (paired(plan_of(p), &shape, call->forward, dev->profile)) return 0;
    return kv_cache_workspace(&shape, call->forward, dev->profile);
}

/* Rows of each bulk copy of the cache through a map: a tile's over a
 * contiguous cache, the rows a page and a tile share over pages (a multiple
 * of 8, whole 1024-byte swizzle patterns); 0 where there is no map (pages
 * of other sizes, a cache TMA cannot describe, a driver without
 * cuTensorMapEncodeTiled): the kernel copies with cp.async. */
static int box_rows(const fwd_mla_sm90a_plan *plan, const fg_forward_args *a,
                    const sm90a_map_rows *m, const family_device *dev) {
    char why[256];
    int rows = plan->block_n;
    for (int x = a->block_table ? a->page_size : 0; x > 0;) {
        int r = rows % x;
        rows = x, x = r;
    }
    if (rows % 8 || !dev->encode_map ||
        sm90a_tensor_mappable("k", &a->k, m->k_units, m->k, a->heads_kv, why, sizeof why))
        return 0;
    return rows;
}

/* q (B,Sq,Hq,D) and the cache k (B,capacity,Hkv,D) or its pages
 * (P,page,Hkv,D), V its first Dv columns -> o (B,Sq,Hq,Dv), lse (B,Hq,Sq) */
static int arguments(const family_plan *p, const fg_spec *spec, const family_call *call,
                     const family_device *dev, uint64_t ws, family_args *out, char *err,
                     size_t err_len) {
    const fwd_mla_sm90a_plan *plan = plan_of(p);
    const fg_forward_args *a = call->forward;
    kv_cache_shape shape = shape_of(plan, a);
    kv_cache_arguments(&shape, spec, call, dev->profile, ws, out);
    fg_decode_tma_params *x = (fg_decode_tma_params *)out->params;
    const sm90a_map_rows m = sm90a_map_rows_of(spec, a);
    if (paired(plan, &shape, a, dev->profile)) { /* in pairs: nothing to combine */
        x->pair_blocks = x->key_blocks;
        x->key_blocks = x->combine_blocks = 0;
        x->lse_part = x->o_part = 0;
    } else if (narrow(plan, a)) { /* the narrow kernel's blocks, the other's none */
        x->narrow_blocks = x->key_blocks;
        x->key_blocks = 0;
    }
    x->kv_box_rows = box_rows(plan, a, &m, dev);
    if (x->kv_box_rows && sm90a_encode(dev, &x->kv_map, "k", spec, &a->k, spec->head_dim,
                                       m.k_units, m.k, a->heads_kv, x->kv_box_rows, err, err_len))
        return -1;
    return 0;
}

const kernel_family fwd_mla_sm90a_family = {
    .name = "fwd_mla_sm90a",
    .pass = FG_PASS_FORWARD,
    .min_cc = 90,
    .max_cc = 90,
    .arch_specific = 1,
    .params = &decode_tma_params_layout,
    .writes = FAMILY_WRITES_O,
    .tuning_rel_tolerance = 0.f,
    .supports = supports,
    .plan = plan,
    .plan_tiling = plan_tiling,
    .candidates = candidates,
    .tiling_of = tiling_of,
    .registers = registers,
    .describe = describe,
    .tiling_ints = (int)(sizeof(fwd_mla_sm90a_tiling) / sizeof(int)),
    .generate = generate,
    .workspace = workspace,
    .arguments = arguments,
};
