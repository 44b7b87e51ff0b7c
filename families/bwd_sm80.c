/* bwd_sm80: planning (see bwd_sm80.h), generation, the schedule of key
 * blocks over thread blocks, the workspace and the launch arguments. */
#include "families/bwd_sm80.h"

#include <stdio.h>
#include <string.h>

#include "families/forward_call.h"
#include "families/mma_sync.h"
#include "gen/plan.h"
#include "gen/spec.h"
static int round_up(int x, int m) { return (x + m - 1) / m * m; }
static int min_int(int a, int b) { return a < b ? a : b; }
static int max_int(int a, int b) { return a > b ? a : b; }

/* K and Q rows of dpad, V and dO rows of dvpad (each padded), P and dS of Bc */
static int smem_bytes(int bm, int bn, int stages, int dpad, int dvpad) {
    int row = (dpad + PLAN_SMEM_ROW_PAD) * 2, v_row = (dvpad + PLAN_SMEM_ROW_PAD) * 2;
    int ds_row = (bn + PLAN_SMEM_ROW_PAD) * 2;
    return bn * (row + v_row) + stages * bm * (row + v_row) + 2 * bm * ds_row;
}

/* The paper's bound on the key block: K, V, Q and dO rows of 4d elements,
 * 2d + 2dv with a value head dim of its own. */
static int paper_bc(const fg_spec *spec, int m_elems) {
    int row = 2 * (spec->head_dim + spec_head_dim_v(spec));
    return (m_elems + row - 1) / row;
}

/* Fill the warp grids of a candidate; 0 if the warps cannot be laid out.
 * dK and dQ split the head dim's columns over their warps and the column
 * splits, dV the value head dim's. */
static int lay_out_warps(fg_bwd_plan *c, int head_dim, int head_dim_v) {
    int bm = c->block_m, bn = c->block_n, w = c->warps;
    c->s_warps_m = min_int(bm / 16, w);
    c->s_warps_n = w / c->s_warps_m;
    if (bn / c->s_warps_n < 16) return 0; /* a warp's S tile is at least 16 keys wide */
    c->kv_warps_n = min_int(bn / 16, w);
    c->kv_warps_d = w / c->kv_warps_n;
    c->q_warps_m = min_int(bm / 16, w);
    c->q_warps_d = w / c->q_warps_m;
    int col_warps = max_int(c->kv_warps_d, c->q_warps_d);
    c->head_dim_padded = round_up(head_dim, 16 * col_warps * c->col_splits);
    c->head_dim_v_padded = head_dim_v == head_dim
                               ? c->head_dim_padded
                               : round_up(head_dim_v, 16 * c->kv_warps_d * c->col_splits);
    return 1;
}

static int accumulators(const fg_bwd_plan *c) {
    int w = c->warps, cols = c->head_dim_padded / c->col_splits;
    int v_cols = c->head_dim_v_padded / c->col_splits;
    int dkdv = c->block_n * (cols + v_cols) / (32 * w);
    int sdp = c->block_m * c->block_n / (16 * w);
    int dq_cols = min_int(cols / c->q_warps_d, PLAN_DQ_CHUNK);
    int dq = (c->block_m / (16 * c->q_warps_m)) * dq_cols / 2;
    return dkdv + max_int(sdp, dq);
}

/* Is a better than b? */
static int better(const fg_bwd_plan *a, const fg_bwd_plan *b) {
    /* splits repeat phase 1 (2 of the 5 products): only when nothing else fits */
    if (a->col_splits != b->col_splits) return a->col_splits < b->col_splits;
    /* useful work per step: Br x Bc, discounted by the padded head-dim columns */
    long long work_a = (long long)a->block_m * a->block_n *
                       (b->head_dim_padded + b->head_dim_v_padded);
    long long work_b = (long long)b->block_m * b->block_n *
                       (a->head_dim_padded + a->head_dim_v_padded);
    if (work_a != work_b) return work_a > work_b;
    if (a->block_n != b->block_n) return a->block_n > b->block_n;
    if (a->warps != b->warps) return a->warps > b->warps;
    return a->stages > b->stages;
}

/* Fill c for one tiling; 1 if it fits the budget, the shared memory, the
 * sparse blocks and the warp grids. */
static int fit(const fg_spec *spec, const fg_profile *prof, int budget, const bwd_tiling *t,
               fg_bwd_plan *c) {
    memset(c, 0, sizeof *c);
    c->block_m = t->block_m, c->block_n = t->block_n, c->warps = t->warps;
    c->stages = t->stages, c->col_splits = t->col_splits;
    if (spec->sparsity != FG_SPARSE_NONE &&
        (spec->sparse_block_k % c->block_n || spec->sparse_block_q % c->block_m))
        return 0;
    if (!lay_out_warps(c, spec->head_dim, spec_head_dim_v(spec))) return 0;
    c->accumulator_registers = accumulators(c);
    if (c->accumulator_registers > budget) return 0;
    c->smem_bytes =
        smem_bytes(c->block_m, c->block_n, c->stages, c->head_dim_padded, c->head_dim_v_padded);
    return c->smem_bytes <= prof->smem_per_block;
}

/* Every tiling that fits, best first; returns the count (at most max). */
static int fitting(const fg_spec *spec, const fg_profile *prof, int budget, fg_bwd_plan *out,
                   int max) {
    const int bc_paper = paper_bc(spec, prof->smem_per_block / 2);
    int n = 0;
    for (int bn = 16; bn <= 128 && bn <= max_int(bc_paper, 16); bn *= 2)
        for (int bm = 16; bm <= 128; bm *= 2)
            for (int warps = 1; warps <= 8; warps *= 2)
                for (int cs = 0; cs < 3 * 2; cs++) {
                    bwd_tiling t = {bm, bn, warps, 1 + cs % 2, 1 << (cs / 2)};
                    fg_bwd_plan c;
                    if (!fit(spec, prof, budget, &t, &c)) continue;
                    int at = n;
                    if (n == max) { /* full: c may only take the last place */
                        if (!better(&c, &out[max - 1])) continue;
                        at = max - 1;
                    } else {
                        n++;
                    }
                    while (at > 0 && better(&c, &out[at - 1])) out[at] = out[at - 1], at--;
                    out[at] = c;
                }
    return n;
}

/* Fill in the derived figures and the explanation. */
static void finish(const fg_spec *spec, const fg_profile *prof, int budget, int named,
                   fg_bwd_plan *plan) {
    const int m_elems = prof->smem_per_block / 2;
    const int bc_paper = paper_bc(spec, m_elems);
    const int same = spec_head_dim_v(spec) == spec->head_dim;
    plan->threads = 32 * plan->warps;
    plan->dq_chunk = PLAN_DQ_CHUNK;
    plan->smem_row = plan->head_dim_padded + PLAN_SMEM_ROW_PAD;
    plan->smem_row_v = plan->head_dim_v_padded + PLAN_SMEM_ROW_PAD;
    plan->ds_row = plan->block_n + PLAN_SMEM_ROW_PAD;
    plan->register_budget = budget;
    plan->blocks_per_sm = prof->smem_per_sm / plan->smem_bytes;
    int n = named ? snprintf(plan->why, sizeof plan->why, "Tiling named by the tuner.\n")
            : same ? snprintf(plan->why, sizeof plan->why,
                              "M = %d elements of shared memory: paper Bc <= ceil(M/4d) = %d.\n"
                              "Chosen among Br, Bc in 16..128, 1..8 warps and 1, 2 or 4 column "
                              "splits: the fewest splits, the largest Br x Bc x d/dpad, then Bc, "
                              "warps, Q/dO buffers.\n",
                              m_elems, bc_paper)
                   : snprintf(plan->why, sizeof plan->why,
                              "M = %d elements of shared memory, head dim %d, value head dim %d: "
                              "paper Bc <= ceil(M/(2d + 2dv)) = %d.\n"
                              "Chosen among Br, Bc in 16..128, 1..8 warps and 1, 2 or 4 column "
                              "splits: the fewest splits, the largest Br x Bc x (d + dv)/(dpad + "
                              "dvpad), then Bc, warps, Q/dO buffers.\n",
                              m_elems, spec->head_dim, spec_head_dim_v(spec), bc_paper);
    if (same)
        n += snprintf(plan->why + n, sizeof plan->why - n,
                      "Registers: dK and dV (%d x %d) plus S and dP or a dQ chunk take %d fp32 per "
                      "thread with %d warps (budget %d).\n",
                      plan->block_n, plan->head_dim_padded, plan->accumulator_registers,
                      plan->warps, budget);
    else
        n += snprintf(plan->why + n, sizeof plan->why - n,
                      "Registers: dK (%d x %d) and dV (%d x %d) plus S and dP or a dQ chunk take "
                      "%d fp32 per thread with %d warps (budget %d).\n",
                      plan->block_n, plan->head_dim_padded, plan->block_n,
                      plan->head_dim_v_padded, plan->accumulator_registers, plan->warps, budget);
    n += snprintf(plan->why + n, sizeof plan->why - n,
                  "Warp grids: S/dP %dx%d, dK/dV %dx%d, dQ %dx%d (rows x columns).\n",
                  plan->s_warps_m, plan->s_warps_n, plan->kv_warps_n, plan->kv_warps_d,
                  plan->q_warps_m, plan->q_warps_d);
    if (plan->col_splits > 1 && same)
        n += snprintf(plan->why + n, sizeof plan->why - n,
                      "Column splits: %d thread blocks per key block, %d columns each (phase 1 "
                      "is recomputed by each).\n",
                      plan->col_splits, plan->head_dim_padded / plan->col_splits);
    else if (plan->col_splits > 1)
        n += snprintf(plan->why + n, sizeof plan->why - n,
                      "Column splits: %d thread blocks per key block, %d columns of dK and dQ "
                      "and %d of dV each (phase 1 is recomputed by each).\n",
                      plan->col_splits, plan->head_dim_padded / plan->col_splits,
                      plan->head_dim_v_padded / plan->col_splits);
    if (spec->sparsity != FG_SPARSE_NONE)
        n += snprintf(plan->why + n, sizeof plan->why - n,
                      "Sparse blocks %dx%d: Br = %d and Bc = %d divide them.\n",
                      spec->sparse_block_q, spec->sparse_block_k, plan->block_m, plan->block_n);
    snprintf(plan->why + n, sizeof plan->why - n,
             "Shared memory: K, V (%d rows), %d x Q, dO (%d rows), P, dS (%d x %d) = %d of %d "
             "bytes per block; %d block(s) per SM by shared memory.\n",
             plan->block_n, plan->stages, plan->block_m, plan->block_m, plan->ds_row,
             plan->smem_bytes, prof->smem_per_block, plan->blocks_per_sm);
}

int plan_backward(const fg_spec *spec, const fg_profile *prof, fg_bwd_plan *plan, char *err,
                  size_t err_len) {
    return plan_backward_budget(spec, prof, 0, plan, err, err_len);
}

int plan_backward_budget(const fg_spec *spec, const fg_profile *prof, int budget,
                         fg_bwd_plan *plan, char *err, size_t err_len) {
    if (budget <= 0) budget = PLAN_BACKWARD_REGISTERS;
    if (fitting(spec, prof, budget, plan, 1) == 0) {
        if (spec_head_dim_v(spec) == spec->head_dim)
            snprintf(err, err_len,
                     "plan: no backward tiling of head dim %d fits %d bytes of shared memory and "
                     "a budget of %d accumulator registers on %s",
                     spec->head_dim, prof->smem_per_block, budget, prof->name);
        else
            snprintf(err, err_len,
                     "plan: no backward tiling of head dim %d with value head dim %d fits %d "
                     "bytes of shared memory and a budget of %d accumulator registers on %s",
                     spec->head_dim, spec_head_dim_v(spec), prof->smem_per_block, budget,
                     prof->name);
        return -1;
    }
    finish(spec, prof, budget, 0, plan);
    return 0;
}

int plan_backward_tiling(const fg_spec *spec, const fg_profile *prof, const bwd_tiling *t,
                         fg_bwd_plan *plan, char *err, size_t err_len) {
    if (t->block_m < 16 || t->block_m > 128 || t->block_n < 16 || t->block_n > 128 ||
        t->block_m & (t->block_m - 1) || t->block_n & (t->block_n - 1) || t->warps < 1 ||
        t->warps > 8 || t->warps & (t->warps - 1) || t->stages < 1 || t->stages > 2 ||
        (t->col_splits != 1 && t->col_splits != 2 && t->col_splits != 4)) {
        snprintf(err, err_len, "plan: backward tiling Br %d Bc %d, %d warps, %d stages, %d splits "
                 "is outside Br, Bc in 16..128 (powers of 2), 1..8 warps, 1-2 stages, 1, 2 or 4 splits",
                 t->block_m, t->block_n, t->warps, t->stages, t->col_splits);
        return -1;
    }
    if (!fit(spec, prof, PLAN_BACKWARD_REGISTERS, t, plan)) {
        snprintf(err, err_len,
                 "plan: backward tiling %dx%d with %d warps does not fit %s (shared memory, "
                 "registers, sparse blocks or warp grids)",
                 t->block_m, t->block_n, t->warps, prof->name);
        return -1;
    }
    finish(spec, prof, PLAN_BACKWARD_REGISTERS, 1, plan);
    return 0;
}

int plan_backward_candidates(const fg_spec *spec, const fg_profile *prof, bwd_tiling *out,
                             int max) {
    fg_bwd_plan best[PLAN_BACKWARD_MAX_CANDIDATES];
    if (max > PLAN_BACKWARD_MAX_CANDIDATES) max = PLAN_BACKWARD_MAX_CANDIDATES;
    int n = max > 0 ? fitting(spec, prof, PLAN_BACKWARD_REGISTERS, best, max) : 0;
    for (int i = 0; i < n; i++) plan_backward_tiling_of(&best[i], &out[i]);
    return n;
}

void plan_backward_tiling_of(const fg_bwd_plan *plan, bwd_tiling *t) {
    memset(t, 0, sizeof *t);
    t->block_m = plan->block_m, t->block_n = plan->block_n, t->warps = plan->warps;
    t->stages = plan->stages, t->col_splits = plan->col_splits;
}

/* ---- the schedule and the workspace ---- */

/* The deterministic schedule's accumulator slices beyond the first take at
 * most 1/32 of the device's memory, and at least 1 GiB may always be used;
 * with less, fewer thread blocks share the work. */
#define DETERMINISTIC_EXTRA_MIN ((size_t)1 << 30)
#define DETERMINISTIC_EXTRA_SHARE 32

static size_t deterministic_extra_bytes(const family_device *dev) {
    size_t share = dev->memory / DETERMINISTIC_EXTRA_SHARE;
    return share > DETERMINISTIC_EXTRA_MIN ? share : DETERMINISTIC_EXTRA_MIN;
}

static size_t align_up(size_t x) {
    return (x + FAMILY_WORKSPACE_ALIGN - 1) / FAMILY_WORKSPACE_ALIGN * FAMILY_WORKSPACE_ALIGN;
}

/* How the key blocks are spread over thread blocks. Workspace: delta
 * (B,Hq,Sq) fp32, then the dQ accumulator (slices, B, Hq, Sq, head dim
 * padded) fp32; (Hq, total_q) for (B, Hq, Sq) with packed sequences. */
typedef struct schedule {
    int n_blocks;      /* key blocks of Bc keys */
    int n_groups;      /* thread blocks per (batch, kv head) */
    int slices;        /* dQ accumulator slices */
    size_t delta_bytes, slice_bytes, total_bytes;
} schedule;

static void schedule_of(const family_device *dev, const fg_bwd_plan *plan, const family_call *call,
                        schedule *s) {
    const fg_forward_args *a = call->forward;
    int deterministic = call->backward->deterministic;
    memset(s, 0, sizeof *s);
    s->n_blocks = (a->seqlen_k + plan->block_n - 1) / plan->block_n;
    /* packed: at least one, which zeroes dK and dV where no sequence has keys */
    if (call->spec->varlen && s->n_blocks < 1) s->n_blocks = 1;
    size_t rows = forward_call_rows(call->spec, a);
    s->delta_bytes = align_up(rows * sizeof(float));
    s->slice_bytes = align_up(rows * plan->head_dim_padded * sizeof(float));
    if (!deterministic) {
        s->n_groups = s->n_blocks; /* one key block each, dQ added atomically */
        s->slices = 1;
    } else {
        /* Each thread block walks one key block of each round of n_groups
         * (rounds alternate direction, which balances causal work) into a
         * slice of its own. Time goes as (waves of thread blocks) x (key
         * blocks per thread block); take the fewest groups (slices to clear
         * and sum) that reach the least of it, within the memory cap. */
        int64_t blocks_per_group = (int64_t)plan->col_splits * a->batch * a->heads_kv;
        int64_t sms = dev->profile->sm_count > 0 ? dev->profile->sm_count : 1;
        /* no query rows (packed sequences of none): slices of nothing */
        int64_t by_memory = s->slice_bytes
                                ? 1 + (int64_t)(deterministic_extra_bytes(dev) / s->slice_bytes)
                                : s->n_blocks;
        int64_t best = 1, best_cost = INT64_MAX;
        for (int64_t g = 1; g <= s->n_blocks && g <= by_memory; g++) {
            int64_t waves = (blocks_per_group * g + sms - 1) / sms;
            int64_t cost = waves * ((s->n_blocks + g - 1) / g);
            if (cost < best_cost) best = g, best_cost = cost;
        }
        s->n_groups = (int)best;
        s->slices = s->n_groups;
    }
    s->total_bytes = s->delta_bytes + (size_t)s->slices * s->slice_bytes;
}

/* ---- the family interface ---- */

_Static_assert(sizeof(fg_bwd_plan) <= sizeof(family_plan), "fg_bwd_plan outgrew family_plan");
_Static_assert(sizeof(bwd_tiling) <= sizeof(family_tiling), "bwd_tiling outgrew family_tiling");
_Static_assert(sizeof(fg_bwd_params) <= FAMILY_PARAMS_MAX, "fg_bwd_params outgrew family_args");

static const fg_bwd_plan *plan_of(const family_plan *p) { return (const fg_bwd_plan *)p->bytes; }

static int plan(const fg_spec *spec, const fg_profile *prof, int budget, family_plan *out,
                char *err, size_t err_len) {
    return plan_backward_budget(spec, prof, budget, (fg_bwd_plan *)out->bytes, err, err_len);
}

static int plan_tiling(const fg_spec *spec, const fg_profile *prof, const family_tiling *t,
                       family_plan *out, char *err, size_t err_len) {
    bwd_tiling b;
    family_tiling_unpack(t, &b, sizeof b);
    return plan_backward_tiling(spec, prof, &b, (fg_bwd_plan *)out->bytes, err, err_len);
}

static int candidates(const fg_spec *spec, const fg_profile *prof, family_tiling *out, int max) {
    bwd_tiling c[PLAN_BACKWARD_MAX_CANDIDATES];
    int n = plan_backward_candidates(spec, prof, c, max);
    for (int i = 0; i < n; i++) family_tiling_pack(&out[i], &c[i], sizeof c[i]);
    return n;
}

static void tiling_of(const family_plan *p, family_tiling *t) {
    bwd_tiling b;
    plan_backward_tiling_of(plan_of(p), &b);
    family_tiling_pack(t, &b, sizeof b);
}

static void registers(const family_plan *p, int *accumulators, int *budget) {
    *accumulators = plan_of(p)->accumulator_registers;
    *budget = plan_of(p)->register_budget;
}

static void describe(const family_plan *p, fg_plan_info *out) {
    const fg_bwd_plan *x = plan_of(p);
    family_plan_info(out, x->block_m, x->block_n, x->warps, x->stages, x->head_dim_padded,
                     x->smem_bytes, x->threads, x->why);
}

static int generate(const fg_spec *spec, const family_plan *p, const kernel_target *target,
                    generated *out, char *err, size_t err_len) {
    const fg_bwd_plan *plan = plan_of(p);
#define BWD_FIGURE(name) {#name, plan->name},
    const plan_figure figures[] = {BWD_PLAN_FIGURES(BWD_FIGURE)};
#undef BWD_FIGURE
    return generate_kernel("kernel_bwd_sm80.lua", spec, target, figures,
                           (int)(sizeof figures / sizeof figures[0]), &bwd_params_layout, out, err,
                           err_len);
}

static size_t workspace(const family_plan *p, const family_call *call, const family_device *dev) {
    schedule s;
    schedule_of(dev, plan_of(p), call, &s);
    return s.total_bytes;
}

/* q (B,Sq,Hq,D), dO and o (B,Sq,Hq,Dv), k (B,Sk,Hkv,D), v (B,Sk,Hkv,Dv), lse (B,Hq,Sq)
 *   -> dq (B,Sq,Hq,D), dk (B,Sk,Hkv,D), dv (B,Sk,Hkv,Dv); the dQ accumulator
 *   (D wide) is cleared first */
static int arguments(const family_plan *p, const fg_spec *spec, const family_call *call,
                     const family_device *dev, uint64_t ws, family_args *out, char *err,
                     size_t err_len) {
    (void)err, (void)err_len;
    fg_bwd_params *params = (fg_bwd_params *)out->params;
    memset(out, 0, sizeof *out);
    schedule s;
    schedule_of(dev, plan_of(p), call, &s);
    SET_BACKWARD_PARAMS(*params, spec, call, ws, ws + s.delta_bytes);
    params->dq_slice = (int64_t)(s.slice_bytes / sizeof(float));
    params->query_count = call->layout.counts_by_key;
    params->query_index = call->layout.indices_by_key;
    params->num_n_blocks = s.n_blocks;
    params->n_groups = s.n_groups;
    params->dq_slices = s.slices;
    out->clear_offset = s.delta_bytes;
    out->clear_bytes = (size_t)s.slices * s.slice_bytes;
    return 0;
}

const kernel_family bwd_sm80_family = {
    .name = "bwd_sm80",
    .pass = FG_PASS_BACKWARD,
    .min_cc = 75,
    .max_cc = 0,
    .arch_specific = 0,
    .params = &bwd_params_layout,
    .writes = FAMILY_WRITES_GRADIENTS,
    /* gradients may be larger than 1: also relative to their size (1/32:
     * four units in the last place of bf16) */
    .tuning_rel_tolerance = 1.f / 32,
    .supports = mma_sync_supports,
    .plan = plan,
    .plan_tiling = plan_tiling,
    .candidates = candidates,
    .tiling_of = tiling_of,
    .registers = registers,
    .describe = describe,
    .tiling_ints = (int)(sizeof(bwd_tiling) / sizeof(int)),
    .generate = generate,
    .workspace = workspace,
    .arguments = arguments,
};
