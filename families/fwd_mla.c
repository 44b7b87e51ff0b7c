/* fwd_mla: planning (see fwd_mla.h), generation and launch arguments. */
#include "families/fwd_mla.h"

#include <stdio.h>
#include <string.h>

#include "families/mma_sync.h"
#include "gen/plan.h"
#include "gen/spec.h"

#define MLA_WARPS 8
#define MLA_SMEM_RESERVED 1024 /* what the driver keeps of an SM's shared memory per block */

/* rows 32 or 64 a thread block: the eight warps split into rows / 16 row
 * groups, each group's warps 16 keys apiece of a tile of Bc = 16 x 128 /
 * rows keys and a share of O's columns. */
static int fill(fwd_mla_plan *plan, const fg_spec *spec, const fg_profile *prof, int rows,
                int stages, char *err, size_t err_len) {
    memset(plan, 0, sizeof *plan);
    if ((rows != 32 && rows != 64) || stages < 2 || stages > 4) {
        snprintf(err, err_len, "plan: latent decoding of %d rows with %d stages is not supported "
                 "(rows 32 or 64, 2..4 stages)", rows, stages);
        return -1;
    }
    const int block_n = 16 * MLA_WARPS * 16 / rows, warps_n = MLA_WARPS * 16 / rows;
    const int dpad = spec_head_dim_padded(spec), row = dpad + PLAN_SMEM_ROW_PAD;
    const int p_row = block_n + PLAN_SMEM_ROW_PAD;
    if (spec_head_dim_v_padded(spec) % (16 * warps_n)) {
        snprintf(err, err_len, "plan: latent decoding of %d rows splits O's %d columns %d ways, "
                 "not in 16s", rows, spec_head_dim_v_padded(spec), warps_n);
        return -1;
    }
    int smem = (rows * row + stages * block_n * row + rows * p_row) * 2 + warps_n * rows * 4 +
               stages * block_n * 4;
    if (smem > prof->smem_per_block) {
        snprintf(err, err_len, "plan: latent decoding of head dim %d, %d rows and %d stages needs "
                 "%d bytes of shared memory (over %d on %s)", spec->head_dim, rows, stages, smem,
                 prof->smem_per_block, prof->name);
        return -1;
    }
    plan->block_n = block_n;
    plan->rows = rows;
    plan->stages = stages;
    plan->warps = MLA_WARPS;
    plan->threads = 32 * MLA_WARPS;
    plan->head_dim_padded = dpad;
    plan->smem_row = row;
    plan->head_dim_v_padded = spec_head_dim_v_padded(spec);
    plan->p_row = p_row;
    plan->smem_bytes = smem;
    plan->blocks_per_sm = prof->smem_per_sm / (smem + MLA_SMEM_RESERVED);
    plan->max_splits = DECODE_MAX_SPLITS;
    plan->combine_threads = COMBINE_THREADS;
    plan->combine_warp_splits = COMBINE_WARP_SPLITS;
    return 0;
}

/* 32 rows first (with 16 query heads, one row group busy: four warps on
 * four schedulers, each with a 64-key tile's 16 keys), else 64; the most
 * stages that leave room for two thread blocks per SM, else the most that
 * fit once. */
static int plan_derived(const fg_spec *spec, const fg_profile *prof, fwd_mla_plan *plan, char *err,
                        size_t err_len) {
    static const int rows[] = {32, 64};
    for (int r = 0; r < 2; r++)
        for (int want = 2; want >= 1; want--)
            for (int stages = 4; stages >= 2; stages--) {
                char why[256];
                if (fill(plan, spec, prof, rows[r], stages, why, sizeof why) != 0 ||
                    plan->blocks_per_sm < want)
                    continue;
                const int warps_n = MLA_WARPS * 16 / rows[r];
                snprintf(plan->why, sizeof plan->why,
                         "Latent decoding: %d query rows per thread block; 8 warps, %d per 16 "
                         "rows, each with 16 keys of every tile of Bc = %d and %d of O's %d "
                         "columns; %d stages of K (V its first columns) in flight: %d bytes of "
                         "shared memory of %d, %d block(s) per SM. The KV length is split over "
                         "thread blocks until they fill the GPU.\n",
                         rows[r], warps_n, plan->block_n, plan->head_dim_v_padded / warps_n,
                         plan->head_dim_v_padded, stages, plan->smem_bytes, prof->smem_per_block,
                         plan->blocks_per_sm);
                return 0;
            }
    return fill(plan, spec, prof, 64, 2, err, err_len);
}

_Static_assert(sizeof(fwd_mla_plan) <= sizeof(family_plan), "fwd_mla_plan outgrew family_plan");
_Static_assert(sizeof(fwd_mla_tiling) <= sizeof(family_tiling), "tiling outgrew family_tiling");

static const fwd_mla_plan *plan_of(const family_plan *p) { return (const fwd_mla_plan *)p->bytes; }

/* The shape the shared call code reads: 64 rows a block. */
static kv_cache_shape shape_of(const fwd_mla_plan *plan, const fg_forward_args *a) {
    int rows = a->seqlen_q * (a->heads_q / a->heads_kv);
    /* 16-bit latent rows, V their first columns; the SM's rate takes all
     * the blocks it holds */
    kv_cache_shape x = {plan->block_n, 2 * plan->head_dim_padded, plan->blocks_per_sm,
                        DECODE_SM_GB_PER_S / plan->blocks_per_sm, DECODE_SM_GB_PER_S,
                        plan->head_dim_v_padded, plan->rows / 16,
                        (rows + plan->rows - 1) / plan->rows, 0, 0, 0};
    return x;
}

static int supports(const fg_spec *spec, const fg_profile *prof, char *err, size_t err_len) {
    if (spec->kv_cache != FG_KV_LATENT) {
        snprintf(err, err_len, "fwd_mla runs decoding steps over a latent cache only "
                 "(spec.kv_cache FG_KV_LATENT)");
        return -1;
    }
    return mma_sync_supports(spec, prof, err, err_len);
}

static int plan(const fg_spec *spec, const fg_profile *prof, int budget, family_plan *out,
                char *err, size_t err_len) {
    (void)budget; /* O is split between a row group's warps: nothing to shrink */
    return plan_derived(spec, prof, (fwd_mla_plan *)out->bytes, err, err_len);
}

static int plan_tiling(const fg_spec *spec, const fg_profile *prof, const family_tiling *t,
                       family_plan *out, char *err, size_t err_len) {
    fwd_mla_tiling x;
    family_tiling_unpack(t, &x, sizeof x);
    fwd_mla_plan *p = (fwd_mla_plan *)out->bytes;
    if (fill(p, spec, prof, x.rows, x.stages, err, err_len) != 0) return -1;
    snprintf(p->why, sizeof p->why, "Tuned latent decoding tiling: %d rows, %d stages.\n", x.rows,
             x.stages);
    return 0;
}

static int candidates(const fg_spec *spec, const fg_profile *prof, family_tiling *out, int max) {
    int n = 0;
    for (int rows = 32; rows <= 64; rows *= 2)
        for (int stages = 2; stages <= 4 && n < max; stages++) {
            fwd_mla_plan p;
            char err[256];
            fwd_mla_tiling x = {rows, stages};
            if (fill(&p, spec, prof, rows, stages, err, sizeof err) == 0)
                family_tiling_pack(&out[n++], &x, sizeof x);
        }
    return n;
}

static void tiling_of(const family_plan *p, family_tiling *t) {
    fwd_mla_tiling x = {plan_of(p)->rows, plan_of(p)->stages};
    family_tiling_pack(t, &x, sizeof x);
}

static void registers(const family_plan *p, int *accumulators, int *budget) {
    const fwd_mla_plan *x = plan_of(p); /* a warp's share of O and its S (0: no plan) */
    *accumulators = x->rows ? x->head_dim_v_padded / (MLA_WARPS * 16 / x->rows) / 2 + 16 : 0;
    *budget = 0;
}

static void describe(const family_plan *p, fg_plan_info *out) {
    const fwd_mla_plan *x = plan_of(p);
    family_plan_info(out, x->rows, x->block_n, x->warps, x->stages, x->head_dim_padded,
                     x->smem_bytes, x->threads, x->why);
}

static int generate(const fg_spec *spec, const family_plan *p, const kernel_target *target,
                    generated *out, char *err, size_t err_len) {
    const fwd_mla_plan *plan = plan_of(p);
#define MLA_FIGURE(name) {#name, plan->name},
    const plan_figure figures[] = {MLA_PLAN_FIGURES(MLA_FIGURE)};
#undef MLA_FIGURE
    return generate_kernel("kernel_fwd_mla.lua", spec, target, figures,
                           (int)(sizeof figures / sizeof figures[0]), &decode_params_layout, out,
                           err, err_len);
}

static size_t workspace(const family_plan *p, const family_call *call, const family_device *dev) {
    kv_cache_shape shape = shape_of(plan_of(p), call->forward);
    return kv_cache_workspace(&shape, call->forward, dev->profile);
}

static int arguments(const family_plan *p, const fg_spec *spec, const family_call *call,
                     const family_device *dev, uint64_t ws, family_args *out, char *err,
                     size_t err_len) {
    (void)err, (void)err_len;
    kv_cache_shape shape = shape_of(plan_of(p), call->forward);
    kv_cache_arguments(&shape, spec, call, dev->profile, ws, out);
    return 0;
}

const kernel_family fwd_mla_family = {
    .name = "fwd_mla",
    .pass = FG_PASS_FORWARD,
    .min_cc = 75,
    .max_cc = 0,
    .arch_specific = 0,
    .params = &decode_params_layout,
    .writes = FAMILY_WRITES_O,
    .tuning_rel_tolerance = 0.f,
    .supports = supports,
    .plan = plan,
    .plan_tiling = plan_tiling,
    .candidates = candidates,
    .tiling_of = tiling_of,
    .registers = registers,
    .describe = describe,
    .tiling_ints = (int)(sizeof(fwd_mla_tiling) / sizeof(int)),
    .generate = generate,
    .workspace = workspace,
    .arguments = arguments,
};
