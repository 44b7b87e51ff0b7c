/* fwd_sm80: planning (see fwd_sm80.h), generation and launch arguments. */
#include "families/fwd_sm80.h"

#include <stdio.h>
#include <string.h>

#include "families/forward_call.h"
#include "families/mma_sync.h"
#include "gen/plan.h"
#include "gen/spec.h"
static int pow2_floor(int x) {
    int p = 1;
    while (p * 2 <= x) p *= 2;
    return p;
}

static int clamp(int x, int lo, int hi) { return x < lo ? lo : x > hi ? hi : x; }

int plan_forward_smem(int block_m, int block_n, int stages, int head_dim_padded,
                      int head_dim_v_padded) {
    int row_bytes = (head_dim_padded + PLAN_SMEM_ROW_PAD) * 2;
    int v_row_bytes = (head_dim_v_padded + PLAN_SMEM_ROW_PAD) * 2;
    return (block_m + stages * block_n) * row_bytes + stages * block_n * v_row_bytes;
}

/* O is the value head dim wide (dvpad), S Bc */
static int accumulators(int m_tiles, int dvpad, int bn) { return m_tiles * (dvpad / 2 + bn / 2); }

static int fill_forward(fg_fwd_plan *plan, const fg_profile *prof, int bm, int bn, int warps,
                        int m_tiles, int dpad, int dvpad, int budget, char *err, size_t err_len);


int plan_forward(const fg_spec *spec, const fg_profile *prof, fg_fwd_plan *plan, char *err,
                 size_t err_len) {
    return plan_forward_budget(spec, prof, 0, plan, err, err_len);
}

int plan_forward_budget(const fg_spec *spec, const fg_profile *prof, int budget,
                        fg_fwd_plan *plan, char *err, size_t err_len) {
    memset(plan, 0, sizeof *plan);
    if (budget <= 0)
        budget = PLAN_ACCUMULATOR_REGISTERS;
    const int d = spec->head_dim, dv = spec_head_dim_v(spec);
    const int dpad = spec_head_dim_padded(spec), dvpad = spec_head_dim_v_padded(spec);
    const int m_elems = prof->smem_per_block / 2;
    char *why = plan->why;
    size_t wl = sizeof plan->why;
    int n = 0;

    /* 1. the paper's rule: Q, K, V and O of d columns each, 4d per row; with
     * a value head dim of its own, Q and K of d and V and O of dv */
    int bc_paper = (m_elems + 2 * (d + dv) - 1) / (2 * (d + dv));
    int br_paper = bc_paper < d ? bc_paper : d;
    int bn = clamp(pow2_floor(bc_paper), 16, 128);
    if (dv == d)
        n += snprintf(why + n, wl - n,
                      "M = %d elements of shared memory: paper Bc = ceil(M/4d) = %d, Br = min(Bc,d) "
                      "= %d; Bc rounded to a power of two in 16..128: %d.\n",
                      m_elems, bc_paper, br_paper, bn);
    else
        n += snprintf(why + n, wl - n,
                      "M = %d elements of shared memory, head dim %d, value head dim %d: paper Bc "
                      "= ceil(M/(2d + 2dv)) = %d, Br = min(Bc,d) = %d; Bc rounded to a power of "
                      "two in 16..128: %d.\n",
                      m_elems, d, dv, bc_paper, br_paper, bn);

    /* 2. registers: two 16-row tiles per warp (each K/V fragment feeds two
     * MMAs) while O and S fit with Bc >= 32, else one */
    int m_tiles = 2;
    while (accumulators(m_tiles, dvpad, bn) > budget) {
        if (bn > 32) bn /= 2;
        else if (m_tiles > 1) m_tiles = 1;
        else if (bn > 16) bn /= 2;
        else break;
    }
    /* one tile per warp frees registers: take back the longest key tile that fits */
    while (m_tiles == 1 && bn < 128 && accumulators(1, dvpad, 2 * bn) <= budget) bn *= 2;
    int warps = m_tiles == 2 ? 4 : 8;
    int bm = 16 * m_tiles * warps;
    n += snprintf(why + n, wl - n,
                  "Registers: O and S take %d fp32 per thread with %d row tile(s) per warp and "
                  "Bc = %d (budget %d); %d warps give Br = %d (O lives in registers, so the "
                  "paper's Br <= d bound on SRAM does not apply).\n",
                  accumulators(m_tiles, dvpad, bn), m_tiles, bn, budget, warps,
                  bm);

    /* 3. sparsity: tiles inside sparse blocks */
    if (spec->sparsity != FG_SPARSE_NONE) {
        while (spec->sparse_block_q % bm != 0) {
            if (warps > 1) warps /= 2;
            else m_tiles = 1, warps = 1;
            bm = 16 * m_tiles * warps;
            if (bm == 16) break;
        }
        while (spec->sparse_block_k % bn != 0 && bn > 16) bn /= 2;
        n += snprintf(why + n, wl - n, "Sparse blocks %dx%d: Br = %d and Bc = %d divide them.\n",
                      spec->sparse_block_q, spec->sparse_block_k, bm, bn);
    }

    /* 4. shared memory: shrink the larger tile until Q, K and V fit */
    int stages = 1;
    while (plan_forward_smem(bm, bn, stages, dpad, dvpad) > prof->smem_per_block) {
        if (bn >= bm && bn > 16) {
            bn /= 2;
        } else if (bm > 16) {
            /* fewer rows: drop a row tile per warp first (fewer registers), then warps */
            if (m_tiles > 1) m_tiles = 1;
            else warps /= 2;
            bm = 16 * m_tiles * warps;
        } else {
            if (dv == d)
                snprintf(err, err_len,
                         "plan: no tiling of head dim %d fits %d bytes of shared memory on %s", d,
                         prof->smem_per_block, prof->name);
            else
                snprintf(err, err_len,
                         "plan: no tiling of head dim %d with value head dim %d fits %d bytes of "
                         "shared memory on %s",
                         d, dv, prof->smem_per_block, prof->name);
            return -1;
        }
    }
    int smem = plan_forward_smem(bm, bn, stages, dpad, dvpad);
    int per_sm = prof->smem_per_sm / smem;
    if (dvpad == dpad)
        n += snprintf(why + n, wl - n,
                      "Shared memory: (Br + 2*%d*Bc) rows x (%d + %d) x 2 bytes = %d of %d per "
                      "block; %d block(s) per SM by shared memory.\n",
                      stages, dpad, PLAN_SMEM_ROW_PAD, smem, prof->smem_per_block, per_sm);
    else
        n += snprintf(why + n, wl - n,
                      "Shared memory: (Br + %d*Bc) rows x (%d + %d) and %d*Bc rows x (%d + %d), "
                      "x 2 bytes = %d of %d per block; %d block(s) per SM by shared memory.\n",
                      stages, dpad, PLAN_SMEM_ROW_PAD, stages, dvpad, PLAN_SMEM_ROW_PAD, smem,
                      prof->smem_per_block, per_sm);
    return fill_forward(plan, prof, bm, bn, warps, m_tiles, dpad, dvpad, budget, err, err_len);
}

/* The figures of a tiling, once chosen. */
static int fill_forward(fg_fwd_plan *plan, const fg_profile *prof, int bm, int bn, int warps,
                        int m_tiles, int dpad, int dvpad, int budget, char *err, size_t err_len) {
    const int stages = 1;
    int smem = plan_forward_smem(bm, bn, stages, dpad, dvpad);
    int per_sm = prof->smem_per_sm / smem;
    plan->block_m = bm;
    plan->block_n = bn;
    plan->warps = warps;
    plan->m_tiles = m_tiles;
    plan->stages = stages;
    plan->head_dim_padded = dpad;
    plan->smem_row = dpad + PLAN_SMEM_ROW_PAD;
    plan->head_dim_v_padded = dvpad;
    plan->smem_row_v = dvpad + PLAN_SMEM_ROW_PAD;
    plan->smem_bytes = smem;
    plan->threads = 32 * warps;
    plan->accumulator_registers = accumulators(m_tiles, dvpad, bn);
    plan->register_budget = budget;
    plan->blocks_per_sm = per_sm;
    if (per_sm < 1) {
        snprintf(err, err_len, "plan: %d bytes exceed the %d per SM of %s", smem,
                 prof->smem_per_sm, prof->name);
        return -1;
    }
    return 0;
}

/* ---- explicit tilings, for the tuner ---- */

int plan_forward_tiling(const fg_spec *spec, const fg_profile *prof, const fwd_tiling *t,
                        fg_fwd_plan *plan, char *err, size_t err_len) {
    memset(plan, 0, sizeof *plan);
    const int dpad = spec_head_dim_padded(spec), dvpad = spec_head_dim_v_padded(spec);
    int bm = 16 * t->m_tiles * t->warps, bn = t->block_n;
    if (t->m_tiles < 1 || t->m_tiles > 2 || t->warps < 1 || t->warps > 8 || bn < 16 || bn > 128 ||
        bn % 16 != 0) {
        snprintf(err, err_len, "plan: tiling %d row tile(s) x %d warps, Bc %d is not supported",
                 t->m_tiles, t->warps, bn);
        return -1;
    }
    if (spec->sparsity != FG_SPARSE_NONE &&
        (spec->sparse_block_q % bm != 0 || spec->sparse_block_k % bn != 0)) {
        snprintf(err, err_len, "plan: tiles %dx%d do not divide sparse blocks %dx%d", bm, bn,
                 spec->sparse_block_q, spec->sparse_block_k);
        return -1;
    }
    int acc = accumulators(t->m_tiles, dvpad, bn);
    if (acc > PLAN_ACCUMULATOR_REGISTERS) {
        snprintf(err, err_len, "plan: tiles %dx%d need %d accumulator registers (over %d)", bm, bn,
                 acc, PLAN_ACCUMULATOR_REGISTERS);
        return -1;
    }
    if (plan_forward_smem(bm, bn, 1, dpad, dvpad) > prof->smem_per_block) {
        snprintf(err, err_len, "plan: tiles %dx%d need %d bytes of shared memory (over %d)", bm,
                 bn, plan_forward_smem(bm, bn, 1, dpad, dvpad), prof->smem_per_block);
        return -1;
    }
    snprintf(plan->why, sizeof plan->why,
             "Tuned tiling: %d row tile(s) per warp x %d warps (Br = %d), Bc = %d; %d accumulator "
             "registers.\n",
             t->m_tiles, t->warps, bm, bn, acc);
    return fill_forward(plan, prof, bm, bn, t->warps, t->m_tiles, dpad, dvpad, acc, err, err_len);
}

int plan_forward_candidates(const fg_spec *spec, const fg_profile *prof, fwd_tiling *out,
                            int max) {
    static const int block_ns[] = {32, 64, 128};
    /* m_tiles, warps: Br 128 two ways, 64 two ways, 32 for small shared memories */
    static const int shapes[][2] = {{2, 4}, {1, 8}, {1, 4}, {2, 2}, {1, 2}};
    int n = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t b = 0; b < sizeof block_ns / sizeof block_ns[0]; b++) {
            fwd_tiling t = {shapes[s][0], shapes[s][1], block_ns[b]};
            fg_fwd_plan p;
            char err[256];
            if (n < max && plan_forward_tiling(spec, prof, &t, &p, err, sizeof err) == 0)
                out[n++] = t;
        }
    return n;
}

void plan_forward_tiling_of(const fg_fwd_plan *plan, fwd_tiling *t) {
    memset(t, 0, sizeof *t);
    t->m_tiles = plan->m_tiles, t->warps = plan->warps, t->block_n = plan->block_n;
}

/* ---- the family interface ---- */

_Static_assert(sizeof(fg_fwd_plan) <= sizeof(family_plan), "fg_fwd_plan outgrew family_plan");
_Static_assert(sizeof(fwd_tiling) <= sizeof(family_tiling), "fwd_tiling outgrew family_tiling");
_Static_assert(sizeof(fg_fwd_params) <= FAMILY_PARAMS_MAX, "fg_fwd_params outgrew family_args");

static const fg_fwd_plan *plan_of(const family_plan *p) { return (const fg_fwd_plan *)p->bytes; }

static int plan(const fg_spec *spec, const fg_profile *prof, int budget, family_plan *out,
                char *err, size_t err_len) {
    return plan_forward_budget(spec, prof, budget, (fg_fwd_plan *)out->bytes, err, err_len);
}

static int plan_tiling(const fg_spec *spec, const fg_profile *prof, const family_tiling *t,
                       family_plan *out, char *err, size_t err_len) {
    fwd_tiling f;
    family_tiling_unpack(t, &f, sizeof f);
    return plan_forward_tiling(spec, prof, &f, (fg_fwd_plan *)out->bytes, err, err_len);
}

static int candidates(const fg_spec *spec, const fg_profile *prof, family_tiling *out, int max) {
    fwd_tiling c[32];
    int n = plan_forward_candidates(spec, prof, c, max < 32 ? max : 32);
    for (int i = 0; i < n; i++) family_tiling_pack(&out[i], &c[i], sizeof c[i]);
    return n;
}

static void tiling_of(const family_plan *p, family_tiling *t) {
    fwd_tiling f;
    plan_forward_tiling_of(plan_of(p), &f);
    family_tiling_pack(t, &f, sizeof f);
}

static void registers(const family_plan *p, int *accumulators, int *budget) {
    *accumulators = plan_of(p)->accumulator_registers;
    *budget = plan_of(p)->register_budget;
}

static void describe(const family_plan *p, fg_plan_info *out) {
    const fg_fwd_plan *x = plan_of(p);
    family_plan_info(out, x->block_m, x->block_n, x->warps, x->stages, x->head_dim_padded,
                     x->smem_bytes, x->threads, x->why);
}

static int generate(const fg_spec *spec, const family_plan *p, const kernel_target *target,
                    generated *out, char *err, size_t err_len) {
    const fg_fwd_plan *plan = plan_of(p);
#define FWD_FIGURE(name) {#name, plan->name},
    const plan_figure figures[] = {FWD_PLAN_FIGURES(FWD_FIGURE)};
#undef FWD_FIGURE
    return generate_kernel("kernel_fwd_sm80.lua", spec, target, figures,
                           (int)(sizeof figures / sizeof figures[0]), &fwd_params_layout, out, err,
                           err_len);
}

static size_t workspace(const family_plan *p, const family_call *call, const family_device *dev) {
    (void)p, (void)call, (void)dev;
    return 0;
}

static int supports(const fg_spec *spec, const fg_profile *prof, char *err, size_t err_len) {
    if (spec->kv_cache) {
        snprintf(err, err_len, "fwd_sm80 does not take calls over a KV cache (kv_cache): "
                 "fwd_decode, fwd_sm90a (many queries, sm_90), fwd_mla_sm90a and fwd_mla do");
        return -1;
    }
    return mma_sync_supports(spec, prof, err, err_len);
}

/* q (B,Sq,Hq,D), k (B,Sk,Hkv,D), v (B,Sk,Hkv,Dv) by strides -> o (B,Sq,Hq,Dv), lse (B,Hq,Sq) */
static int arguments(const family_plan *p, const fg_spec *spec, const family_call *call,
                     const family_device *dev, uint64_t ws, family_args *out, char *err,
                     size_t err_len) {
    (void)dev, (void)ws, (void)err, (void)err_len;
    memset(out, 0, sizeof *out);
    SET_FORWARD_PARAMS(*(fg_fwd_params *)out->params, spec, call, plan_of(p)->block_m);
    return 0;
}

const kernel_family fwd_sm80_family = {
    .name = "fwd_sm80",
    .pass = FG_PASS_FORWARD,
    .min_cc = 75,
    .max_cc = 0,
    .arch_specific = 0,
    .params = &fwd_params_layout,
    .writes = FAMILY_WRITES_O,
    /* the forward's values are below 1: the absolute 1/32 alone */
    .tuning_rel_tolerance = 0.f,
    .supports = supports,
    .plan = plan,
    .plan_tiling = plan_tiling,
    .candidates = candidates,
    .tiling_of = tiling_of,
    .registers = registers,
    .describe = describe,
    .tiling_ints = (int)(sizeof(fwd_tiling) / sizeof(int)),
    .generate = generate,
    .workspace = workspace,
    .arguments = arguments,
};
