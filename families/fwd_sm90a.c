/* fwd_sm90a: planning (see fwd_sm90a.h), the calls TMA can describe, the
 * tensor maps and launch arguments. */
#include "families/fwd_sm90a.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "families/forward_call.h"
#include "families/kv_cache_call.h"
#include "families/sm90a.h"
#include "gen/spec.h"

/* The derived plan's consumers take turns at the tensor cores (one's
 * softmax runs beside the other's GEMMs). Measured on an H100 (bf16, 16k
 * tokens): three consumers (d = 64) 7% faster at 8k; two at d = 128 9-14%
 * faster from 1k to 4k keys, 4-5% at 8k, 3-7% causal, 10-16% with dropout;
 * d = 256 alike. */
#define SM90A_DERIVED_TURNS 1

/* Over a KV cache, the query rows (batch x query heads x queries) per wave
 * of thread blocks above which a call runs faster here than on fwd_decode.
 * Measured on an H100 (bf16, d 128, 32/8 heads, 16..256 queries over 2k..32k
 * keys, decode-notes "Chunked prefill"): a thread block here streams a tile
 * of 128 keys in about 1.85 us whatever its rows (up to 128), a wave of
 * blocks at a time, while fwd_decode computes every row at about 100
 * TFLOP/s; the keys cancel, and the two meet near 2800 rows a wave (of
 * blocks of 128 rows). */
#define SM90A_CACHE_ROWS_PER_WAVE 2800

/* Accumulator registers per consumer thread the derived plan first allows
 * (240 for two consumer warpgroups, less the reserve); a plan that spills
 * is re-planned under smaller budgets. */
#define SM90A_DEFAULT_BUDGET (240 - SM90A_REGISTER_RESERVE)

/* 64-column boxes per row: TMA's 128-byte swizzle takes 64 16-bit values.
 * Q and K rows are the head dim wide, V and O rows the value head dim. */
typedef struct sm90a_boxes {
    int qk, v;
} sm90a_boxes;

static sm90a_boxes boxes_of(const fg_spec *spec) {
    return (sm90a_boxes){(spec_head_dim_padded(spec) + 63) / 64,
                         (spec_head_dim_v_padded(spec) + 63) / 64};
}

/* Q's shared memory in boxes: O is staged there for its store where the
 * plan does not walk. */
static int o_boxes(sm90a_boxes b) { return b.qk > b.v ? b.qk : b.v; }

static int smem_bytes(int block_m, int block_n, sm90a_boxes b, int stages, int walk) {
    /* 1024 for aligning the swizzled boxes; O apart from Q when walking;
     * barriers: q full and empty, then K and V full and empty per stage */
    return 1024 + o_boxes(b) * block_m * 128 + (walk ? b.v * block_m * 128 : 0) +
           stages * (b.qk + b.v) * block_n * 128 + 8 * (2 + 4 * stages);
}

/* The most stages of the tiles that fit, at most SM90A_MAX_STAGES. */
static int stages_of(const fg_profile *prof, int block_m, int block_n, sm90a_boxes b, int walk) {
    int stages = 2;
    while (stages < SM90A_MAX_STAGES &&
           smem_bytes(block_m, block_n, b, stages + 1, walk) <= prof->smem_per_block)
        stages++;
    return stages;
}

/* Whether a plan's thread blocks may walk query blocks (lib_sparse.
 * forward_block): where the host knows what query blocks cost (no packed
 * sequences, cache or sparsity), without dropout (d 64 at 8k ran 8% slower
 * walking), the head dims are at most 128 (measured there), and O's own
 * shared memory fits beside the tiles with as many stages, or three (d
 * 128: Bc 160 walks, the derived 192 does not), or two under a mask, whose
 * short blocks gain more from the walk than from a third stage (d 128: a
 * window's Bc 128, causal 1024 keys). */
static int walks(const fg_spec *spec, const fg_profile *prof, int block_m, int block_n) {
    sm90a_boxes b = boxes_of(spec);
    if (spec->varlen || spec->kv_cache || spec->sparsity != FG_SPARSE_NONE || spec->dropout ||
        b.qk > 2 || b.v > 2)
        return 0;
    int alone = stages_of(prof, block_m, block_n, b, 0), most = spec->mask == FG_MASK_NONE ? 3 : 2;
    return smem_bytes(block_m, block_n, b, alone < most ? alone : most, 1) <= prof->smem_per_block;
}

/* Registers the expressions take beside the tiles, as ptxas showed them
 * (32-bit offsets into the tensors): 12 for any (a predicate with no
 * tensor spilled at d128 Bc = 192, not at 176), and the loads of a tile in
 * flight: a sixth of a register per score for a read indexed by q and k (a
 * relative bias: d64 spilled at Bc 96, not 80; d128 at 160, not 144; d256
 * at 80, not 64), an eighth per score for one indexed by k only (a document
 * mask's doc[k], whose loads for every element of a tile are in flight at
 * once: beside a relative bias, d128 spilled at Bc 128, not 112; alone not
 * at 144), and CALL_REGISTERS for each
 * accurate exp, log, tanh or sqrt (a tanh alone spilled at d256 Bc 80),
 * and 8 more beside dropout's draws (a tanh and a predicate with dropout
 * spilled at d64 Bc 96, not 80). */
#define CALL_REGISTERS 8
static int expr_registers(const fg_spec *spec, int block_n) {
    if (!spec_has_expr(spec->score_mod) && !spec_has_expr(spec->mask_mod)) return 0;
    int both, k_only, calls;
    spec_expr_reads(spec, &both, &k_only, &calls);
    return 12 + both * block_n / 6 + k_only * block_n / 8 + CALL_REGISTERS * calls +
           (spec->dropout ? 8 : 0);
}

/* Registers a rewrite of the scores (lib_logits) holds beside the tiles,
 * as ptxas showed them: the cap's 4 (12 bytes spilled at d = 128, Bc = 192,
 * whose tiles take the whole budget), ALiBi's slope and distances 6 per
 * 64-column box of O (d = 256 spilled at Bc = 80 and not at 64, d = 128 not
 * at 176). */
static int logits_registers(const fg_spec *spec, int v_boxes, int block_n) {
    return (spec->softcap ? 4 : 0) + (spec->alibi ? 6 * v_boxes : 0) +
           expr_registers(spec, block_n);
}

/* O (the value head dim's boxes), S and P per consumer thread (dropout's
 * draws are made a stretch at a time as P is packed, within the reserve),
 * and a rewrite of the scores. */
static int accumulators(const fg_spec *spec, sm90a_boxes b, int block_n) {
    return 64 * b.v / 2 + block_n / 2 + block_n / 4 + logits_registers(spec, b.v, block_n);
}

/* 0 when a tiling can run spec here, the registers aside; else -1 with why. */
static int tiling_fits(const fg_spec *spec, const fg_profile *prof, int consumers, int block_n,
                       char *why, size_t len) {
    sm90a_boxes boxes = boxes_of(spec);
    int block_m = 64 * consumers;
    if (consumers < 1 || consumers > 3 || block_n < 16 || block_n > 256 || block_n % 16)
        return snprintf(why, len, "%d consumer warpgroups, Bc %d: consumers 1..3, Bc 16..256 "
                        "in steps of 16", consumers, block_n), -1;
    if (spec->dropout && block_n % 32 && block_n != 16)
        return snprintf(why, len, "Bc %d: dropout draws 32-key stretches (16 or a multiple of "
                        "32)", block_n), -1;
    if (spec->sparsity != FG_SPARSE_NONE &&
        (spec->sparse_block_q % block_m || spec->sparse_block_k % block_n))
        return snprintf(why, len, "tiles %dx%d do not divide sparse blocks %dx%d", block_m,
                        block_n, spec->sparse_block_q, spec->sparse_block_k), -1;
    if (smem_bytes(block_m, block_n, boxes, 2, 0) > prof->smem_per_block)
        return snprintf(why, len, "tiles %dx%d with two stages need %d bytes of shared memory "
                        "(over %d)", block_m, block_n, smem_bytes(block_m, block_n, boxes, 2, 0),
                        prof->smem_per_block), -1;
    return 0;
}

static int fill(fwd_sm90a_plan *plan, const fg_spec *spec, const fg_profile *prof, int consumers,
                int block_n, int turns, int budget) {
    sm90a_boxes boxes = boxes_of(spec);
    int block_m = 64 * consumers, walk = walks(spec, prof, block_m, block_n);
    int stages = stages_of(prof, block_m, block_n, boxes, walk);
    plan->block_m = block_m;
    plan->block_n = block_n;
    plan->consumers = consumers;
    plan->turns = consumers > 1 && turns;
    plan->stages = stages;
    plan->threads = 128 * (consumers + 1);
    plan->head_dim_padded = spec_head_dim_padded(spec);
    plan->boxes = boxes.qk;
    plan->head_dim_v_padded = spec_head_dim_v_padded(spec);
    plan->v_boxes = boxes.v;
    plan->o_boxes = o_boxes(boxes);
    plan->v_cols = 64 * boxes.v;
    plan->smem_bytes = smem_bytes(block_m, block_n, boxes, stages, walk);
    plan->producer_registers = sm90a_producer_registers(consumers, SM90A_PRODUCER_REGISTERS);
    plan->consumer_registers = sm90a_consumer_registers(consumers, SM90A_PRODUCER_REGISTERS);
    plan->accumulator_registers = accumulators(spec, boxes, block_n);
    plan->register_budget = budget;
    plan->walk = walk;
    size_t n = strlen(plan->why);
    snprintf(plan->why + n, sizeof plan->why - n,
             "Br = %d (%d consumer warpgroups of 64 rows, %d registers each%s; the producer "
             "keeps %d), Bc = %d: O, S, P take %d registers per consumer thread. %d stages of "
             "K and V: %d bytes of shared memory with Q (%d box%s of 64 columns per row)%s.\n",
             block_m, consumers, plan->consumer_registers,
             plan->turns ? ", taking turns at the tensor cores" : "", plan->producer_registers,
             block_n, plan->accumulator_registers,
             stages, plan->smem_bytes, boxes.qk, boxes.qk > 1 ? "es" : "",
             walk ? " and O apart: a thread block may walk several query blocks" : "");
    return 0;
}

static int allowed(int consumers, int budget) {
    int cap = sm90a_consumer_registers(consumers, SM90A_PRODUCER_REGISTERS) - SM90A_REGISTER_RESERVE;
    return budget < cap ? budget : cap;
}

/* The derived plan's consumers and Bc under a budget: 0, or -1 with why
 * (the last tiling's refusal, if any). */
static int derived_tiles(const fg_spec *spec, const fg_profile *prof, int budget, int *consumers_out,
                         int *block_n, char *why, size_t why_len) {
    sm90a_boxes boxes = boxes_of(spec);
    /* three consumers only where O is one box; then the longest key tile
     * that fits (two stages of it: K and V are refilled apart, K once S is
     * computed, which hides the copies; measured on an H100 at seqlen 8k,
     * d = 256 runs at 787 TFLOP/s with Bc 80 and two stages, 648 with Bc 48
     * and three); with dropout at most 128 (d = 128 with dropout: 483
     * TFLOP/s with Bc 128 and three stages, 441-451 with Bc 192 and two) */
    for (int consumers = o_boxes(boxes) == 1 ? 3 : 2; consumers >= 1; consumers--)
        for (int bn = spec->dropout ? 128 : 256; bn >= 16; bn -= 16) {
            if (accumulators(spec, boxes, bn) > allowed(consumers, budget)) continue;
            if (tiling_fits(spec, prof, consumers, bn, why, why_len) != 0) continue;
            if (consumers == 1 && spec->sparsity == FG_SPARSE_NONE) continue;
            *consumers_out = consumers, *block_n = bn;
            return 0;
        }
    return -1;
}

int plan_fwd_sm90a(const fg_spec *spec, const fg_profile *prof, int budget, fwd_sm90a_plan *plan,
                   char *err, size_t err_len) {
    memset(plan, 0, sizeof *plan);
    if (budget <= 0) budget = SM90A_DEFAULT_BUDGET;
    char why[256] = "";
    int consumers, bn;
    if (derived_tiles(spec, prof, budget, &consumers, &bn, why, sizeof why) != 0) {
        snprintf(err, err_len, "plan: no fwd_sm90a tiling of %s fits a budget of %d registers%s%s",
                 prof->name, budget, why[0] ? ": " : "", why);
        return -1;
    }
    char value_dim[32] = "";
    if (spec_head_dim_v(spec) != spec->head_dim)
        snprintf(value_dim, sizeof value_dim, ", value head dim %d", spec_head_dim_v(spec));
    snprintf(plan->why, sizeof plan->why, "Head dim %d%s: QK in %d steps of 16, O in %d columns. ",
             spec->head_dim, value_dim, spec_head_dim_padded(spec) / 16, 64 * boxes_of(spec).v);
    return fill(plan, spec, prof, consumers, bn, SM90A_DERIVED_TURNS, budget);
}

int plan_fwd_sm90a_tiling(const fg_spec *spec, const fg_profile *prof, const fwd_sm90a_tiling *t,
                          fwd_sm90a_plan *plan, char *err, size_t err_len) {
    memset(plan, 0, sizeof *plan);
    char why[256];
    if (t->turns != 0 && t->turns != 1) {
        snprintf(err, err_len, "plan: turns %d is not 0 or 1", t->turns);
        return -1;
    }
    if (tiling_fits(spec, prof, t->consumers, t->block_n, why, sizeof why) != 0) {
        snprintf(err, err_len, "plan: %.200s", why);
        return -1;
    }
    sm90a_boxes boxes = boxes_of(spec);
    int acc = accumulators(spec, boxes, t->block_n), cap = allowed(t->consumers, 1 << 30);
    if (acc > cap) {
        snprintf(err, err_len, "plan: %d consumers and Bc %d need %d accumulator registers (over "
                 "%d)", t->consumers, t->block_n, acc, cap);
        return -1;
    }
    snprintf(plan->why, sizeof plan->why, "Tuned tiling: ");
    return fill(plan, spec, prof, t->consumers, t->block_n, t->turns, acc);
}

/* ---- the family interface ---- */

_Static_assert(sizeof(fwd_sm90a_plan) <= sizeof(family_plan), "fwd_sm90a_plan outgrew family_plan");
_Static_assert(sizeof(fwd_sm90a_tiling) <= sizeof(family_tiling), "tiling outgrew family_tiling");
_Static_assert(sizeof(fg_fwd_tma_params) <= FAMILY_PARAMS_MAX, "params outgrew family_args");

static const fwd_sm90a_plan *plan_of(const family_plan *p) {
    return (const fwd_sm90a_plan *)p->bytes;
}

static int supports(const fg_spec *spec, const fg_profile *prof, char *err, size_t err_len) {
    fwd_sm90a_plan p;
    if (prof->arch != 90) {
        snprintf(err, err_len, "fwd_sm90a runs on sm_90 only; %s is sm_%d", prof->name, prof->arch);
        return -1;
    }
    if (spec->kv_cache == FG_KV_LATENT) {
        snprintf(err, err_len, "fwd_sm90a does not take latent caches (kv_cache FG_KV_LATENT): "
                 "fwd_mla_sm90a and fwd_mla do");
        return -1;
    }
    return plan_fwd_sm90a(spec, prof, 0, &p, err, err_len);
}

static int plan(const fg_spec *spec, const fg_profile *prof, int budget, family_plan *out,
                char *err, size_t err_len) {
    return plan_fwd_sm90a(spec, prof, budget, (fwd_sm90a_plan *)out->bytes, err, err_len);
}

static int plan_tiling(const fg_spec *spec, const fg_profile *prof, const family_tiling *t,
                       family_plan *out, char *err, size_t err_len) {
    fwd_sm90a_tiling x;
    family_tiling_unpack(t, &x, sizeof x);
    return plan_fwd_sm90a_tiling(spec, prof, &x, (fwd_sm90a_plan *)out->bytes, err, err_len);
}

static int candidates(const fg_spec *spec, const fg_profile *prof, family_tiling *out, int max) {
    static const int shapes[][2] = {{2, 192}, {2, 176}, {2, 160}, {2, 128}, {2, 96}, {2, 80},
                                    {2, 64}, {3, 128}, {3, 96}, {3, 64}};
    int n = 0;
    for (int turns = 1; turns >= 0; turns--)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0] && n < max; i++) {
            fwd_sm90a_tiling t = {shapes[i][0], shapes[i][1], turns};
            fwd_sm90a_plan p;
            char err[256];
            if (plan_fwd_sm90a_tiling(spec, prof, &t, &p, err, sizeof err) == 0)
                family_tiling_pack(&out[n++], &t, sizeof t);
        }
    return n;
}

static void tiling_of(const family_plan *p, family_tiling *t) {
    fwd_sm90a_tiling x = {plan_of(p)->consumers, plan_of(p)->block_n, plan_of(p)->turns};
    family_tiling_pack(t, &x, sizeof x);
}

/* Key tiles by a call's length where the derived plan's are longer: where a
 * query block sees few tiles, the diagonal's masked share of a tile
 * (causal) and the last tile's keys past the end weigh more, and so does a
 * thread block's start, which tiles narrow enough to walk save (walks()).
 * Measured on an H100 (bf16, 16k tokens): at d = 128, against the derived
 * Bc 192, causal 1024 keys Bc 128 (6% faster than 160, itself 3-4% faster
 * than 192), 2048 Bc 160 (3-4%; walking, 2.5% more), without a mask 1024
 * keys Bc 176 (4-5%), 2048 Bc 160 walking (2.5-3%); at d = 64 (head dim
 * padded to 64, derived Bc 128) causal 2048 keys Bc 96 (3-3.5%, two runs);
 * 512 keys and from 4096 on the derived plan. With dropout the derived plan
 * (Bc 128 at d <= 128; d = 64 causal 2048 keys with Bc 96 ran 1.5%
 * slower). The first entry of the call's mask, head dim (0: any) and length
 * decides. */
static const struct {
    int causal, head_dim_padded, keys_min, keys_max, block_n;
} by_length[] = {{1, 64, 1025, 2048, 96},
                 {1, 0, 513, 1024, 128},
                 {1, 0, 1025, 2048, 160},
                 {0, 0, 513, 1024, 176},
                 {0, 0, 1025, 2048, 160}};

/* Under a window, key tiles of the widest power of two that divides Br and
 * is narrower than the derived ones: each of the window's edges is Br keys
 * wide across a block's rows, so with window sizes of powers of two (or
 * one less) it masks exactly Br keys' tiles, where a wider tile masks 1.7
 * on average (Bc 192, Br 128), and the block's keys reach less far past
 * the window. Measured on an H200 (bf16, 16k tokens, 2k and 8k keys; left,
 * right sizes): d = 128, Bc = Br = 128 against the derived 192: 30% faster
 * at (255, 0), 16-17% at (1023, 0) and (512, 511), 4-7% at (4095, 0); d =
 * 64, Br 192, Bc 64 against 128: 13% faster at (255, 0), 0-3% at (1023, 0)
 * and (512, 511), 9% slower at (4095, 0); d = 256, Bc 64 against 80: 4-6%
 * faster at (1023, 0) and (512, 511). With each row's bounds made once a
 * tile (lib_mask), narrower tiles than Br cost more than they save on
 * wider spans: at d = 64 (8k; Bc 64 against the derived 128) 3% faster at
 * (255, 0), 3.5% slower at (511, 0), 8% at (1023, 0) and (512, 511), alike
 * at (2047, 0); at d = 128 (Bc = Br) still 25-33% faster at (255, 0) and
 * (511, 0), 11-12% at (1023, 0) and (512, 511), 3% at (2047, 0); at d =
 * 256 2-9% faster up to (1023, 0). So spans of up to 4096 keys where Bc =
 * Br, 1024 where Bc is Br / 2 (d = 256), 256 where it is Br / 3 (d = 64). */
static int window_tiling(const fg_spec *spec, const fg_profile *prof, const fg_forward_args *a,
                         family_tiling *out) {
    char why[256];
    int consumers, bn;
    if (a->window_left < 0 || a->window_right < 0 ||
        derived_tiles(spec, prof, SM90A_DEFAULT_BUDGET, &consumers, &bn, why, sizeof why) != 0)
        return 0;
    const int block_m = 64 * consumers;
    int block_n = block_m & -block_m;
    while (block_n >= bn) block_n /= 2; /* narrower than the derived (d 256: 64, derived 80) */
    const int64_t span = (int64_t)a->window_left + a->window_right + 1;
    const int64_t widest = block_n == block_m ? 4096 : 3 * block_n == block_m ? 256 : 1024;
    if (block_n < 16 || span > widest ||
        tiling_fits(spec, prof, consumers, block_n, why, sizeof why) != 0)
        return 0;
    fwd_sm90a_tiling t = {consumers, block_n, SM90A_DERIVED_TURNS};
    family_tiling_pack(out, &t, sizeof t);
    return 1;
}

static int tiling_for_call(const fg_spec *spec, const fg_profile *prof, const family_call *call,
                           family_tiling *out) {
    char why[256];
    int consumers, bn, keys = call->forward->seqlen_k, causal = spec->mask == FG_MASK_CAUSAL;
    if (spec->kv_cache || spec->dropout) return 0;
    if (spec->mask == FG_MASK_WINDOW) return window_tiling(spec, prof, call->forward, out);
    if (!causal && spec->mask != FG_MASK_NONE) return 0;
    for (size_t i = 0; i < sizeof by_length / sizeof by_length[0]; i++) {
        if (by_length[i].causal != causal || keys < by_length[i].keys_min ||
            keys > by_length[i].keys_max ||
            (by_length[i].head_dim_padded &&
             by_length[i].head_dim_padded != spec_head_dim_padded(spec)))
            continue;
        /* on every such call: the derived tiles without the plan's text, and
         * the shorter ones checked as a named tiling would be (fewer registers) */
        if (derived_tiles(spec, prof, SM90A_DEFAULT_BUDGET, &consumers, &bn, why, sizeof why) != 0 ||
            bn <= by_length[i].block_n ||
            tiling_fits(spec, prof, consumers, by_length[i].block_n, why, sizeof why) != 0)
            return 0;
        fwd_sm90a_tiling t = {consumers, by_length[i].block_n, SM90A_DERIVED_TURNS};
        family_tiling_pack(out, &t, sizeof t);
        return 1;
    }
    return 0;
}

static void registers(const family_plan *p, int *acc, int *budget) {
    *acc = plan_of(p)->accumulator_registers;
    *budget = plan_of(p)->register_budget;
}

static void describe(const family_plan *p, fg_plan_info *out) {
    const fwd_sm90a_plan *x = plan_of(p);
    family_plan_info(out, x->block_m, x->block_n, 4 * x->consumers + 4, x->stages,
                     x->head_dim_padded, x->smem_bytes, x->threads, x->why);
}

static int generate(const fg_spec *spec, const family_plan *p, const kernel_target *target,
                    generated *out, char *err, size_t err_len) {
    const fwd_sm90a_plan *plan = plan_of(p);
#define SM90A_FIGURE(name) {#name, plan->name},
    const plan_figure figures[] = {SM90A_PLAN_FIGURES(SM90A_FIGURE)};
#undef SM90A_FIGURE
    return generate_kernel("kernel_fwd_sm90a.lua", spec, target, figures,
                           (int)(sizeof figures / sizeof figures[0]), &fwd_tma_params_layout, out,
                           err, err_len);
}

/* ---- calls: what TMA can describe, and the tensor maps ---- */

/* A call over a KV cache takes the decoding family where it is faster there
 * (few queries: its blocks split the keys and hold every query head of a
 * KV head), splits were asked for, or pages are not whole swizzle periods
 * (a multiple of 8 rows: the producer loads a tile's rows in runs that
 * start 1024-byte aligned). */
static int accepts_cache(const fg_forward_args *a, const fg_profile *prof, char *why, size_t len) {
    const int64_t rows = (int64_t)a->batch * a->heads_q * a->seqlen_q;
    const int64_t blocks = (int64_t)a->batch * a->heads_q * ((a->seqlen_q + 127) / 128);
    const int64_t waves = (blocks + prof->sm_count - 1) / prof->sm_count;
    if (rows <= waves * SM90A_CACHE_ROWS_PER_WAVE)
        return snprintf(why, len, "a step of few queries runs faster on the decoding family"), -1;
    if (a->num_splits > 1)
        return snprintf(why, len, "num_splits %d: it does not split the keys", a->num_splits), -1;
    if (a->block_table && a->page_size % 8)
        return snprintf(why, len, "pages of %d rows (it reads multiples of 8)", a->page_size), -1;
    return 0;
}

static int accepts(const family_call *call, const family_device *dev, char *why, size_t len) {
    const fg_forward_args *a = call->forward;
    const sm90a_map_rows m = sm90a_map_rows_of(call->spec, a);
    if (!dev->encode_map)
        return snprintf(why, len, "the CUDA driver has no cuTensorMapEncodeTiled"), -1;
    if (call->spec->kv_cache && accepts_cache(a, dev->profile, why, len)) return -1;
    if (sm90a_tensor_mappable("q", &a->q, m.batch, m.q, a->heads_q, why, len) ||
        sm90a_tensor_mappable("k", &a->k, m.k_units, m.k, a->heads_kv, why, len) ||
        sm90a_tensor_mappable("v", &a->v, m.k_units, m.k, a->heads_kv, why, len) ||
        sm90a_tensor_mappable("o", &a->o, m.batch, m.q, a->heads_q, why, len))
        return -1;
    return 0;
}

static size_t workspace(const family_plan *p, const family_call *call, const family_device *dev) {
    (void)p, (void)call, (void)dev;
    return 0;
}

/* Heads whose query blocks are ordered together, the longest first: under
 * a causal mask, as many as keep their K and V (shared by a group of query
 * heads) in L2; otherwise 1 (one head's blocks after another's share its K
 * and V best). */
static int section_heads(const fg_spec *spec, const fg_forward_args *a) {
    if (spec->mask != FG_MASK_CAUSAL) return 1;
    int64_t group = a->heads_q / a->heads_kv;
    int64_t head_bytes =
        (int64_t)a->seqlen_k * (spec->head_dim + spec_head_dim_v(spec)) * 2 / group + 1;
    return sm90a_section_heads(head_bytes, (int64_t)a->heads_q * a->batch);
}

/* The units the thread blocks walk (lib_sparse.forward_block) and the
 * thread blocks launched. A thread block holds its SM (the consumers take
 * the whole register file), so where the plan walks and query blocks
 * outnumber the SMs, one thread block a SM walks every sm_count-th unit:
 * its next block's copies go out while it finishes the last, where a thread
 * block of its own would start from nothing (about 4 us at a 2k block's 20
 * to 40). Causal blocks differ in length, so there a unit is the pair of
 * blocks M-1-i and i of a head, whose keys add up alike, or where the
 * call has walk lists (below) single blocks from them; pairs walk only up
 * to WALK_PAIRS_BLOCKS blocks a head: past that the start is a few percent
 * of a block, and the last round of pairs, where some SMs have none, costs
 * as much (d 64 at 8k: 3% slower). A window's blocks walk from lists
 * only: its first blocks are short, and taken every SM-th where a head's
 * blocks divide the SMs (2k keys, Br 192: 11 into 132), each thread block
 * would take the same block of every head, some only short ones. Elsewhere
 * a thread block a query block, in the order the hardware hands them out.
 * -1 where the units overflow an int. */
#define WALK_PAIRS_BLOCKS 16
static int walk_of(const fwd_sm90a_plan *plan, const fg_spec *spec, const fg_forward_args *a,
                   const fg_profile *prof, uint64_t lists, fg_fwd_tma_params *params) {
    const int64_t heads = (int64_t)a->heads_q * a->batch, m = params->num_m_blocks;
    const int64_t sms = prof->sm_count > 0 ? prof->sm_count : 1;
    const int causal = spec->mask == FG_MASK_CAUSAL;
    const int walk = plan->walk && m * heads > sms &&
                     (lists || spec->mask == FG_MASK_NONE || (causal && m <= WALK_PAIRS_BLOCKS));
    params->walk_lists = walk ? lists : 0;
    params->unit_blocks = walk && causal && !lists ? 2 : 1;
    params->units_per_head = (int)((m + params->unit_blocks - 1) / params->unit_blocks);
    const int64_t units = params->units_per_head * heads;
    if (units > INT32_MAX) return -1;
    params->units = (int)units;
    params->blocks = (int)(walk && units > sms ? sms : units);
    return 0;
}

/* The lists a walk's thread blocks take their query blocks from under a
 * mask, whose blocks differ in length. Causal, walk_of pairs them
 * otherwise: the pairs add up alike in keys, not in key tiles (Br 128, Bc
 * 160: 14 or 15 a pair), and taken every SM-th they leave the last round's
 * SMs idle (at 2k keys, 128 heads and 132 SMs, 0.93 of the even share in a
 * model of a block's time as its tiles and one more for its start). The lists (sm90a_walk_lists) give each thread block single
 * blocks, each to whichever has the least work so far, in the units' order:
 * sections of heads, in each the last query blocks first. So the walk ends
 * with short blocks (0.97 of the even share in the model), and the heads in
 * flight stay a section's, whose keys stay in L2 (all blocks taken longest
 * first mixed every head: 14% slower at d 128 2k; only the last two
 * sections so, 1% slower). And so longer calls walk too: the last round no
 * longer costs what the starts save. Under a window (one head a section),
 * the first blocks are short. */
typedef struct walk_shape {
    int64_t m, heads, units;
    int section_heads, blocks, diag;
} walk_shape;

static int walk_listed(const family_plan *p, const family_call *call, const family_device *dev,
                       walk_shape *w) {
    const fwd_sm90a_plan *plan = plan_of(p);
    const fg_spec *spec = call->spec;
    const fg_forward_args *a = call->forward;
    const int64_t sms = dev->profile->sm_count > 0 ? dev->profile->sm_count : 1;
    w->m = (a->seqlen_q + plan->block_m - 1) / plan->block_m;
    w->heads = (int64_t)a->heads_q * a->batch;
    w->units = w->m * w->heads;
    if (!plan->walk || spec->mask == FG_MASK_NONE || w->units <= sms || w->units > UINT16_MAX)
        return 0;
    w->section_heads = section_heads(spec, a);
    w->blocks = (int)sms;
    w->diag = forward_call_diag_offset(a);
    return 1;
}

static int walk_key(const family_plan *p, const family_call *call, const family_device *dev,
                    uint64_t key[FAMILY_WALK_KEY_WORDS], int *entries) {
    walk_shape w;
    if (!walk_listed(p, call, dev, &w)) return 0;
    const fg_forward_args *a = call->forward;
    key[0] = (uint64_t)w.m | (uint64_t)w.heads << 32;
    key[1] = (uint64_t)(uint32_t)w.section_heads | (uint64_t)(uint32_t)w.blocks << 32;
    key[2] = (uint64_t)plan_of(p)->block_m | (uint64_t)plan_of(p)->block_n << 16 |
             (uint64_t)(uint32_t)a->seqlen_q << 32;
    key[3] = (uint64_t)(uint32_t)a->seqlen_k | (uint64_t)(uint32_t)w.diag << 32;
    key[4] = call->spec->mask != FG_MASK_WINDOW ? 0
             : (uint64_t)(uint32_t)a->window_left | (uint64_t)(uint32_t)a->window_right << 32;
    *entries = w.blocks + 1 + (int)w.units;
    return 1;
}

static int walk_lists(const family_plan *p, const family_call *call, const family_device *dev,
                      uint16_t *out, int cap) {
    walk_shape w;
    if (!walk_listed(p, call, dev, &w)) return -1;
    const fg_forward_args *a = call->forward;
    const int64_t bm = plan_of(p)->block_m, bn = plan_of(p)->block_n;
    int *weights = malloc((size_t)w.units * sizeof *weights);
    if (!weights) return -1;
    for (int64_t u = 0; u < w.units; u++) {
        /* lib_sparse.forward_block's order, one query block a unit */
        const int64_t section = w.section_heads * w.m, head0 = u / section * w.section_heads;
        const int64_t in_section = u % section;
        const int64_t heads = w.heads - head0 < w.section_heads ? w.heads - head0 : w.section_heads;
        const int64_t block = w.m - 1 - in_section / heads, row0 = block * bm;
        const int64_t rows = a->seqlen_q - row0 < bm ? a->seqlen_q - row0 : bm;
        /* lib_mask.key_range's keys: causal [0, hi), a window [lo, hi) */
        int64_t lo = 0, hi = row0 + rows + w.diag;
        if (call->spec->mask == FG_MASK_WINDOW) {
            lo = a->window_left < 0 ? 0 : row0 + w.diag - a->window_left;
            hi = a->window_right < 0 ? a->seqlen_k : row0 + rows + w.diag + a->window_right;
        }
        lo = lo > 0 ? lo : 0;
        hi = hi < a->seqlen_k ? hi : a->seqlen_k;
        weights[u] = (int)(hi > lo ? (hi + bn - 1) / bn - lo / bn : 0) + 1; /* and its start */
    }
    int n = sm90a_walk_lists(weights, (int)w.units, w.blocks, out, cap);
    free(weights);
    return n;
}

/* q (B,Sq,Hq,D), k (B,Sk,Hkv,D), v (B,Sk,Hkv,Dv) by strides -> o (B,Sq,Hq,Dv),
 * lse (B,Hq,Sq); packed: q (total_q,Hq,D), o (total_q,Hq,Dv), k (total_k,Hkv,D),
 * v (total_k,Hkv,Dv), lse (Hq,total_q); a paged KV cache: k (P,page,Hkv,D),
 * v (P,page,Hkv,Dv), read gcd(page, Bc) rows a load */
static int arguments(const family_plan *p, const fg_spec *spec, const family_call *call,
                     const family_device *dev, uint64_t ws, family_args *out, char *err,
                     size_t err_len) {
    (void)ws;
    const fg_forward_args *a = call->forward;
    const fwd_sm90a_plan *plan = plan_of(p);
    const sm90a_map_rows m = sm90a_map_rows_of(spec, a);
    fg_fwd_tma_params *params = (fg_fwd_tma_params *)out->params;
    memset(out, 0, sizeof *out);
    SET_FORWARD_PARAMS(*params, spec, call, plan->block_m);
    params->section_heads = section_heads(spec, a);
    if (walk_of(plan, spec, a, dev->profile, call->walk_lists, params) != 0) {
        snprintf(err, err_len, "batch %d x heads %d x %d query blocks: more than 2^31-1 thread "
                 "blocks", a->batch, a->heads_q, params->num_m_blocks);
        return -1;
    }
    if (spec->kv_cache) SET_KV_CACHE_PARAMS(*params, a);
    const int d = spec->head_dim, dv = spec_head_dim_v(spec);
    /* a paged cache's boxes: the rows a page and a tile have in common */
    int kv_rows = plan->block_n;
    for (int x = a->block_table ? a->page_size : 0; x > 0;) {
        int r = kv_rows % x;
        kv_rows = x, x = r;
    }
    params->kv_box_rows = kv_rows;
    if (sm90a_encode(dev, &params->q_map, "q", spec, &a->q, d, m.batch, m.q, a->heads_q,
                     plan->block_m, err, err_len) ||
        sm90a_encode(dev, &params->k_map, "k", spec, &a->k, d, m.k_units, m.k, a->heads_kv,
                     kv_rows, err, err_len) ||
        sm90a_encode(dev, &params->v_map, "v", spec, &a->v, dv, m.k_units, m.k, a->heads_kv,
                     kv_rows, err, err_len) ||
        /* o by the rows of one consumer warpgroup */
        sm90a_encode(dev, &params->o_map, "o", spec, &a->o, dv, m.batch, m.q, a->heads_q,
                     64, err, err_len))
        return -1;
    return 0;
}

const kernel_family fwd_sm90a_family = {
    .name = "fwd_sm90a",
    .pass = FG_PASS_FORWARD,
    .min_cc = 90,
    .max_cc = 90,
    .arch_specific = 1,
    .params = &fwd_tma_params_layout,
    .writes = FAMILY_WRITES_O,
    .tuning_rel_tolerance = 0.f,
    .supports = supports,
    .plan = plan,
    .plan_tiling = plan_tiling,
    .candidates = candidates,
    .tiling_of = tiling_of,
    .tiling_for_call = tiling_for_call,
    .registers = registers,
    .describe = describe,
    .tiling_ints = (int)(sizeof(fwd_sm90a_tiling) / sizeof(int)),
    .generate = generate,
    .accepts = accepts,
    .walk_key = walk_key,
    .walk_lists = walk_lists,
    .workspace = workspace,
    .arguments = arguments,
};
