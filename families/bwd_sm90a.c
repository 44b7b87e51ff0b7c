/* bwd_sm90a: planning (see bwd_sm90a.h), the calls it takes, the workspace,
 * the tensor maps and launch arguments. */
#include "families/bwd_sm90a.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "families/forward_call.h"
#include "families/sm90a.h"
#include "gen/spec.h"

#define BWD_SM90A_CONSUMERS 2
/* A consumer's dQ of a step: 64 query rows (of 64 a step, or half of 128);
 * at 80 rows a step all of them (dQ transposed) */
#define BWD_SM90A_DQ_ROWS 64
/* The derived plan's register budget per consumer thread (all it can
 * have), and what it keeps beside the accumulators (dK, dV, Sᵀ, dPᵀ) for
 * addresses, the loop and the packed Pᵀ and dSᵀ */
#define BWD_SM90A_BUDGET 240
#define BWD_SM90A_RESERVE 48
/* A producer with work beyond its loads (the deterministic kernel's turns
 * and reductions, dropout's draws) keeps this many: at 24 registers it
 * would spill */
#define BWD_SM90A_BUSY_PRODUCER_REGISTERS 32
/* The deterministic producer that also draws dropout's keep words */
#define BWD_SM90A_DRAWING_PRODUCER_REGISTERS 56

static int smem_bytes(int block_m, int block_n, int boxes, int v_boxes, int split, int stages,
                      int dq_sets, int dropout, int tail_bytes) {
  /* dS and dQ's staging hold a unit of query rows: a step's, or at 32 rows
   * a step a pair of steps' (dQ once for both) */
  int unit = block_m == 32 ? 2 * block_m : block_m;
  /* 1024 for aligning the swizzled boxes; K and V (boxes and v_boxes);
   * per stage Q and dO;
   * two dS tiles (block_n x unit), split two P tiles too; dQ staged
   * in fp32, dq_sets sets (unit x boxes x 64 each, shared by the
   * consumers); per stage a float of lse and of D per row, and with dropout
   * a keep bit per (key, query); barriers: K and V, full and empty per
   * stage, dQ staged and free per consumer and set; the steps' bounds;
   * tail_bytes: packed, the sequence's lengths and first rows (lib_seq's
   * Seq, 7 ints, 32 bytes), where blocks walk tiles their barriers and
   * slots (48), packed and a sequence a slot (48 + 64), or the ordered
   * deterministic kernel's barriers for handing dQ over (32) */
  return 1024 + (boxes + v_boxes) * block_n * 128 + stages * (boxes + v_boxes) * block_m * 128 +
         (split ? 4 : 2) * block_n * 2 * unit + dq_sets * boxes * unit * 256 +
         stages * (8 * block_m + (dropout ? block_n * block_m / 8 : 0)) +
         8 * (1 + 2 * stages + 2 * dq_sets * BWD_SM90A_CONSUMERS) + 8 + tail_bytes;
}

/* Past a box of dQ per consumer, or where dK and dV of 64 keys per
 * consumer would take more registers than a consumer has (272 at d = 192),
 * the consumers share the keys and split the columns. */
static int splits_columns(const fg_spec *spec) {
  int boxes = (spec_head_dim_padded(spec) + 63) / 64;
  int v_boxes = (spec_head_dim_v_padded(spec) + 63) / 64;
  return boxes > BWD_SM90A_CONSUMERS || boxes + v_boxes > 2 * BWD_SM90A_CONSUMERS;
}

/* Q, K, V and dO a box wide, unsplit */
static int box_wide(const fg_spec *spec) {
  return spec_head_dim_padded(spec) <= 64 && spec_head_dim_v_padded(spec) <= 64;
}

/* Every key block meets every query block: no mask, sparsity or mask_mod */
static int unmasked(const fg_spec *spec) {
  return spec->mask == FG_MASK_NONE && spec->sparsity == FG_SPARSE_NONE &&
         !(spec->mask_mod && spec->mask_mod[0]);
}

/* Whether the deterministic kernel takes dropout: where its 64 load threads
 * draw a step's keep words without spilling (ptxas, every mask, variant,
 * expression and layout): split (64 tasks a step, one each); unsplit (128,
 * two each) a box wide, but a mask beside a layout (4 bytes); unsplit two
 * boxes wide (d = 65..128, the producer at 40 registers, as the consumers
 * need 232) without a layout, and under a mask (the consumers then read
 * their steps' bounds from shared memory) without an expression: with a
 * layout 12-36 bytes, an expression under a mask 24-48. */
static int det_takes_dropout(const fg_spec *spec) {
  if (splits_columns(spec)) return 1;
  int expr = (spec->score_mod && *spec->score_mod) || (spec->mask_mod && *spec->mask_mod);
  int masked = spec->mask != FG_MASK_NONE || (spec->mask_mod && *spec->mask_mod);
  if (box_wide(spec)) return !(masked && spec->sparsity != FG_SPARSE_NONE);
  return spec->sparsity == FG_SPARSE_NONE && !(masked && expr);
}

int plan_bwd_sm90a(const fg_spec *spec, const fg_profile *prof, int budget,
                   const bwd_sm90a_tiling *t, bwd_sm90a_plan *plan, char *err,
                   size_t err_len) {
  memset(plan, 0, sizeof *plan);
  int padded = spec_head_dim_padded(spec), boxes = (padded + 63) / 64;
  int padded_v = spec_head_dim_v_padded(spec), v_boxes = (padded_v + 63) / 64;
  int consumers = BWD_SM90A_CONSUMERS;
  if (budget <= 0) budget = BWD_SM90A_BUDGET;
  /* 32 query rows a step where Q and K are three boxes wide and V and dO at
   * most two (d = 129..192 with a value head dim up to 128, DeepSeek's
   * 192/128), without dropout or sparsity: each consumer keeps 64 keys of
   * its own (dK and dV 160 registers, Sᵀ and dPᵀ of 32 queries 32), 128 a
   * block, which halves dQ's additions in L2 against the split kernel's 64
   * (they bind it: hopper-backward-notes step 25). dQ once a pair of steps
   * (query blocks 2u and 2u + 1, 64 rows), each consumer 96 columns: half
   * the reads of shared memory of a transposed dQ every step (step 27).
   * Only under the whole budget (a kernel that spills is re-planned split)
   * and where no other row count is named. */
  int rows_32 = boxes == 3 && v_boxes <= 2 && !spec->dropout && spec->sparsity == FG_SPARSE_NONE &&
                budget >= BWD_SM90A_BUDGET && !(t && t->block_m && t->block_m != 32);
  int split = splits_columns(spec) && !rows_32;
  int block_n = split ? 64 : 64 * consumers;
  /* 128 query rows a step where Q, K, V and dO are a box wide: each step's
   * products read K and V once for twice the rows of Q and dO (d = 64,
   * 8k: backward 1.08x, the deterministic one 1.22x). Sᵀ and dPᵀ of 128
   * queries beside dK and dV take 192 registers per consumer thread, which
   * the whole budget holds; a kernel that spills with them (some of the
   * logits' variants) is re-planned under a smaller budget, with 64 rows.
   * Not with dropout (its keep words are laid out for 64 rows), nor where
   * sparse blocks are not whole steps. */
  int rows_128 = !split && boxes + v_boxes == 2 && !spec->dropout &&
                 (spec->sparsity == FG_SPARSE_NONE || spec->sparse_block_q % 128 == 0);
  int dkv_128 = 64 * (boxes + v_boxes) / 2; /* dK and dV beside Sᵀ and dPᵀ of 128 queries */
  /* 80 query rows a step where Q and K are two boxes wide (d = 65..128) and
   * V and dO one or two, without dropout or sparsity, causal or not
   * (FlashAttention 3's and 4's tiling without a mask): 25% more work a
   * step for its fixed share (barriers, waits, dQ's staging and
   * reductions). 80 is not a multiple of wgmma's 64 rows, so each consumer
   * computes dQ transposed, its 64 columns by 80 queries. Sᵀ and dPᵀ of 80
   * queries beside dK and dV take 208 registers per consumer thread at
   * d = 128, so only under the whole budget; a kernel that spills is
   * re-planned with 64 rows, and the score modifiers with a derivative
   * (softcap, score_mod) spill with 80. Causal measured +2-5% at 8k, alike
   * at 2k (hopper-backward-notes step 17); windows measured alike or 1-3%
   * slower, so they keep 64, as mask predicates do. */
  int rows_80 = !split && boxes == consumers && v_boxes <= consumers && !spec->dropout &&
                (spec->mask == FG_MASK_NONE || spec->mask == FG_MASK_CAUSAL) &&
                spec->sparsity == FG_SPARSE_NONE && !spec->softcap &&
                !(spec->score_mod && *spec->score_mod) && !(spec->mask_mod && *spec->mask_mod);
  int block_m = rows_32                                                    ? 32
                : rows_128 && dkv_128 + 128 + BWD_SM90A_RESERVE <= budget ? 128
                : rows_80 && budget >= BWD_SM90A_BUDGET                 ? 80
                                                                        : 64;
  if (t && t->block_m) {
    if (t->block_m != 64 && !(t->block_m == 128 && rows_128) && !(t->block_m == 80 && rows_80) &&
        !(t->block_m == 32 && rows_32)) {
      snprintf(err, err_len,
               "plan: bwd_sm90a does not take %d query rows a step here; it takes 64, 128 (Q, K, "
               "V and dO one box wide, no dropout, sparse blocks of whole steps), 80 (Q and K two "
               "boxes wide, no window, mask predicate, dropout, sparsity, softcap or score_mod) or "
               "32 (Q and K three boxes wide, V at most two, no dropout or sparsity)",
               t->block_m);
      return -1;
    }
    block_m = t->block_m;
  }
  int derived = !(t && t->stages), stages = derived ? 2 : t->stages;
  if (stages < 1 || stages > 4) {
    snprintf(err, err_len, "plan: bwd_sm90a stages %d is not 1..4", stages);
    return -1;
  }
  if (spec->sparsity != FG_SPARSE_NONE &&
      (spec->sparse_block_q % block_m || spec->sparse_block_k % block_n)) {
    snprintf(err, err_len,
             "plan: bwd_sm90a's tiles %dx%d do not divide sparse blocks %dx%d",
             block_m, block_n, spec->sparse_block_q, spec->sparse_block_k);
    return -1;
  }
  /* the deterministic kernel as the fast one's steps, their dQ handed to a
   * reduction thread that adds it in turn (not packed, unsplit, a step's
   * dQ a step, without dropout: 0.88-0.92 of the fast kernel against
   * 0.82-0.90, hopper-backward-notes step 55): one staging set, and two
   * barriers a consumer for the hand-over beside the fast kernel's (32
   * bytes, with the steps' bounds in the 8 before them) */
  int ordered = !spec->dropout && !spec->varlen && !split && block_m != 32;
  /* the other deterministic kernel stages dQ in two sets taken in turn at
   * d <= 64, where its steps are short enough for the turns to hold the
   * consumers up (above, a second set measured 1-2% slower at 8k); with
   * dropout one */
  int dq_sets = ordered || spec->dropout || boxes > 1 || block_m > 64 ? 1 : 2;
  int tail = spec->varlen || ordered ? 32 : 0;
  int smem =
      smem_bytes(block_m, block_n, boxes, v_boxes, split, stages, dq_sets, spec->dropout, tail);
  if (derived && smem > prof->smem_per_block) /* d = 256: one stage */
    smem = smem_bytes(block_m, block_n, boxes, v_boxes, split, --stages, dq_sets, spec->dropout,
                      tail);
  if (smem > prof->smem_per_block) {
    snprintf(err, err_len,
             "plan: bwd_sm90a with %d stages needs %d bytes of shared memory "
             "(over %d)",
             stages, smem, prof->smem_per_block);
    return -1;
  }
  plan->block_m = block_m;
  plan->block_n = block_n;
  plan->consumers = consumers;
  plan->stages = stages;
  plan->threads = 128 * (consumers + 1);
  plan->head_dim_padded = padded;
  plan->boxes = boxes;
  plan->head_dim_v_padded = padded_v;
  plan->v_boxes = v_boxes;
  plan->split = split;
  plan->s_cols = split ? block_m / consumers : block_m;
  plan->dq_rows = block_m == 32 ? 2 * block_m : block_m % 64 ? block_m : BWD_SM90A_DQ_ROWS;
  plan->register_budget = budget;
  plan->k_cols = split ? 64 * boxes / consumers : 64 * boxes;
  plan->v_cols = split ? 64 * v_boxes / consumers : 64 * v_boxes;
  plan->smem_bytes = smem;
  plan->dq_sets = dq_sets;
  plan->det_ordered = ordered;
  /* two planes of dQ's accumulator for the deterministic kernel where the
   * consumers split the columns (d > 128, 64 rows a step), so that a query
   * block's turns on each come two steps apart (hopper-backward-notes step
   * 57), except under a mask at one stage (there the second plane cost
   * 1-4% at d = 224 and 256, while at two stages, d = 192, one plane cost
   * 4%: step 62); elsewhere the second plane's clearing and reading cost
   * more than the turns */
  plan->dq_planes = split && (unmasked(spec) || stages > 1) ? 2 : 1;
  /* there the deterministic kernel's reductions, on the producer's threads
   * into two planes, beat the fast kernel's (step 60) */
  plan->fast_det = split && stages == 1;
  plan->fast_smem_bytes =
      smem_bytes(block_m, block_n, boxes, v_boxes, split, stages, 1, spec->dropout,
                 spec->varlen ? 32 : 0);
  /* the fast kernel's blocks walk tiles where dK and dV are stored by
   * boxes, staged where a step's dS tiles and dQ's one staging set are
   * (hopper-backward-notes step 49), or packed, from registers; beside a
   * barrier for K and V, two slots of a tile's index and two barriers
   * each, and packed a sequence a slot */
  int walk_smem = smem_bytes(block_m, block_n, boxes, v_boxes, split, stages, 1, 0,
                             spec->varlen ? 48 + 2 * 32 : 48);
  plan->walk = !spec->dropout && !split && block_m != 32 && spec->head_dim % 8 == 0 &&
               spec_head_dim_v(spec) % 8 == 0 &&
               (spec->varlen || (boxes + v_boxes) * block_n * 128 <=
                                    2 * block_n * 2 * block_m + boxes * block_m * 256) &&
               walk_smem <= prof->smem_per_block;
  if (plan->walk) plan->fast_smem_bytes = walk_smem;
  int fast_min = spec->dropout ? BWD_SM90A_BUSY_PRODUCER_REGISTERS : SM90A_PRODUCER_REGISTERS;
  plan->producer_registers = sm90a_producer_registers(consumers, fast_min);
  plan->consumer_registers = sm90a_consumer_registers(consumers, fast_min);
  /* dK and dV, k_cols / 2 and v_cols / 2; Sᵀ and dPᵀ, s_cols / 2 each;
   * split, dQ's k_cols / 2 beside them (it outlives Sᵀ and dPᵀ, not their
   * packed P and dS: the larger of the two) */
  int dkv = (plan->k_cols + plan->v_cols) / 2;
  plan->accumulator_registers = dkv + plan->s_cols;
  if (split)
    plan->accumulator_registers =
        dkv + (plan->k_cols / 2 > 3 * plan->s_cols / 2 ? plan->k_cols / 2 : 3 * plan->s_cols / 2);
  /* at 128 and 80 rows a step the deterministic kernel's consumers need
   * all 240, and its producer, with one thread issuing the reductions,
   * fits in the fast kernel's (ordered at 128 rows, its load threads'
   * four floats a step spilled 4-8 bytes there, so it keeps 40 and the
   * consumers 232, unless a derivative of the scores (softcap, score_mod)
   * needs their 240; where those spill at 128 rows, as the older kernel
   * did, the module is re-planned with 64); at 32 (dQ once a pair of steps, whose
   * reductions wait for two blocks' turns) the producer spilled 8 bytes at
   * 24 and the consumers fit in 232. With dropout its 64 load
   * threads also draw, beside two rows' lse and D each: at 40 registers
   * that spilled 4-36 bytes under masks and with layouts, so the producer
   * keeps 56 and the consumers 224, unless their accumulators and an
   * expression's terms need 232 (d = 256). */
  int det_expr = (spec->score_mod && *spec->score_mod) || (spec->mask_mod && *spec->mask_mod);
  int derivative = spec->softcap || (spec->score_mod && *spec->score_mod);
  int det_min = block_m == 32 || (ordered && block_m == 128 && !derivative)
                    ? BWD_SM90A_BUSY_PRODUCER_REGISTERS
                : block_m != 64 ? SM90A_PRODUCER_REGISTERS
                : spec->dropout && (split || box_wide(spec)) &&
                        !(det_expr && plan->accumulator_registers + BWD_SM90A_RESERVE > 224)
                    ? BWD_SM90A_DRAWING_PRODUCER_REGISTERS
                    : BWD_SM90A_BUSY_PRODUCER_REGISTERS;
  plan->det_producer_registers = sm90a_producer_registers(consumers, det_min);
  plan->det_consumer_registers = sm90a_consumer_registers(consumers, det_min);
  plan->det_dropout = spec->dropout && det_takes_dropout(spec);
  if (split)
    snprintf(plan->why, sizeof plan->why,
             "Bc = %d keys shared by %d consumer warpgroups (%d registers each; the producer "
             "keeps %d), Br = %d query rows a step, %d a consumer for Sᵀ and dPᵀ, Pᵀ and dSᵀ "
             "shared in shared memory; each consumer holds dK, dV and dQ for its share of the head "
             "dims' columns (%d of dK and dQ, %d of dV): %d registers per consumer thread. %d "
             "stage%s of Q and dO: %d bytes of shared memory with K, V, P, dS and dQ staged "
             "(%d and %d boxes of 64 columns per row).\n",
             block_n, consumers, plan->consumer_registers, plan->producer_registers, block_m,
             plan->s_cols, plan->k_cols, plan->v_cols, plan->accumulator_registers, stages,
             stages > 1 ? "s" : "", plan->smem_bytes, boxes, v_boxes);
  else
    snprintf(plan->why, sizeof plan->why,
             "Bc = %d (%d consumer warpgroups of 64 keys, %d registers each; the "
             "producer keeps "
             "%d), Br = %d query rows a step: dK, dV, Sᵀ and dPᵀ take %d "
             "registers per consumer "
             "thread. %d stages of Q and dO: %d bytes of shared memory with K, "
             "V, dS and dQ staged (%d "
             "box%s of 64 columns per row).\n",
             block_n, consumers, plan->consumer_registers,
             plan->producer_registers, block_m, plan->accumulator_registers,
             stages, plan->smem_bytes, boxes, boxes > 1 ? "es" : "");
  return 0;
}

/* ---- the family interface ---- */

_Static_assert(sizeof(bwd_sm90a_plan) <= sizeof(family_plan),
               "bwd_sm90a_plan outgrew family_plan");
_Static_assert(sizeof(fg_bwd_tma_params) <= FAMILY_PARAMS_MAX,
               "params outgrew family_args");

static const bwd_sm90a_plan *plan_of(const family_plan *p) {
  return (const bwd_sm90a_plan *)p->bytes;
}

static int supports(const fg_spec *spec, const fg_profile *prof, char *err,
                    size_t err_len) {
  if (prof->arch != 90)
    return snprintf(err, err_len, "bwd_sm90a runs on sm_90 only; %s is sm_%d",
                    prof->name, prof->arch),
           -1;
  bwd_sm90a_plan p;
  return plan_bwd_sm90a(spec, prof, 0, NULL, &p, err, err_len);
}

static int plan(const fg_spec *spec, const fg_profile *prof, int budget,
                family_plan *out, char *err, size_t err_len) {
  return plan_bwd_sm90a(spec, prof, budget, NULL, (bwd_sm90a_plan *)out->bytes, err,
                        err_len);
}

static int plan_tiling(const fg_spec *spec, const fg_profile *prof,
                       const family_tiling *t, family_plan *out, char *err,
                       size_t err_len) {
  bwd_sm90a_tiling x;
  family_tiling_unpack(t, &x, sizeof x);
  return plan_bwd_sm90a(spec, prof, 0, &x, (bwd_sm90a_plan *)out->bytes, err,
                        err_len);
}

static int candidates(const fg_spec *spec, const fg_profile *prof,
                      family_tiling *out, int max) {
  int n = 0;
  static const int rows[] = {128, 80, 64, 32};
  for (int r = 0; r < 4; r++)
    for (int stages = 2; stages >= 1 && n < max; stages--) {
      bwd_sm90a_tiling t = {stages, rows[r]};
      bwd_sm90a_plan p;
      char err[256];
      if (plan_bwd_sm90a(spec, prof, 0, &t, &p, err, sizeof err) == 0)
        family_tiling_pack(&out[n++], &t, sizeof t);
    }
  return n;
}

static void tiling_of(const family_plan *p, family_tiling *t) {
  bwd_sm90a_tiling x = {plan_of(p)->stages, plan_of(p)->block_m};
  family_tiling_pack(t, &x, sizeof x);
}

static void registers(const family_plan *p, int *acc, int *budget) {
  *acc = plan_of(p)->accumulator_registers;
  *budget = plan_of(p)->register_budget;
}

static void describe(const family_plan *p, fg_plan_info *out) {
  const bwd_sm90a_plan *x = plan_of(p);
  family_plan_info(out, x->block_m, x->block_n, 4 * x->consumers + 4, x->stages,
                   x->head_dim_padded, x->smem_bytes, x->threads, x->why);
}

static int generate(const fg_spec *spec, const family_plan *p,
                    const kernel_target *target, generated *out, char *err,
                    size_t err_len) {
  const bwd_sm90a_plan *plan = plan_of(p);
#define BWD_SM90A_FIGURE(name) {#name, plan->name},
  const plan_figure figures[] = {BWD_SM90A_PLAN_FIGURES(BWD_SM90A_FIGURE)};
#undef BWD_SM90A_FIGURE
  return generate_kernel("kernel_bwd_sm90a.lua", spec, target, figures,
                         (int)(sizeof figures / sizeof figures[0]),
                         &bwd_tma_params_layout, out, err, err_len);
}

static int accepts(const family_call *call, const family_device *dev, char *why,
                   size_t len) {
  const fg_forward_args *f = call->forward;
  const fg_backward_args *a = call->backward;
  if (!dev->encode_map)
    return snprintf(why, len, "the CUDA driver has no cuTensorMapEncodeTiled"),
           -1;
  if (a->deterministic && call->spec->dropout && !det_takes_dropout(call->spec))
    return snprintf(why, len,
                    "the deterministic schedule takes dropout above d = 128, at d <= 64 without "
                    "a mask beside block sparsity, and at d = 65..128 without block sparsity "
                    "or a score or mask expression under a mask"),
           -1;
  const sm90a_map_rows m = sm90a_map_rows_of(call->spec, f);
  if (sm90a_tensor_mappable("q", &f->q, m.batch, m.q, f->heads_q, why, len) ||
      sm90a_tensor_mappable("k", &f->k, m.k_units, m.k, f->heads_kv, why, len) ||
      sm90a_tensor_mappable("v", &f->v, m.k_units, m.k, f->heads_kv, why, len) ||
      sm90a_tensor_mappable("d_o", &a->d_o, m.batch, m.q, f->heads_q, why, len) ||
      sm90a_tensor_mappable("d_k", &a->d_k, m.k_units, m.k, f->heads_kv, why, len) ||
      sm90a_tensor_mappable("d_v", &a->d_v, m.k_units, m.k, f->heads_kv, why, len))
    return -1;
  return 0;
}

static size_t align_up(size_t x) {
  return (x + FAMILY_WORKSPACE_ALIGN - 1) / FAMILY_WORKSPACE_ALIGN *
         FAMILY_WORKSPACE_ALIGN;
}

/* The fast schedule's sections: under a causal mask, as many (key/value
 * head, sequence) pairs as keep their Q, dO (a group of query heads each)
 * and fp32 dQ accumulator in L2, their key blocks ordered longest first
 * across the section; otherwise 1 (one pair's blocks after another's share
 * its Q and dO best). Packed, a divisor of the key/value heads: a section
 * holds one sequence's pairs (a walking block skips the rest of a section
 * once past its sequence's keys). */
static int section_heads(const fg_spec *spec, const fg_forward_args *a) {
  if (spec->mask != FG_MASK_CAUSAL) return 1;
  int64_t group = a->heads_q / a->heads_kv;
  int64_t row_bytes = (int64_t)(spec->head_dim + spec_head_dim_v(spec)) * 2 + spec->head_dim * 4;
  int64_t head_bytes = group * a->seqlen_q * row_bytes;
  int64_t pairs = (int64_t)a->heads_kv * (a->batch + (spec->varlen ? 1 : 0));
  int heads = sm90a_section_heads(head_bytes, pairs);
  while (spec->varlen && a->heads_kv % heads) heads--;
  return heads;
}

/* Whether the fast kernel's last thread block of each (key/value head,
 * sequence) pair converts the pair's dQ, its accumulator rows still in L2,
 * rather than a kernel after the main one, which reads them from DRAM:
 * without dropout, where the pairs end one after another (no sections) and
 * each holds at most CONVERT_IN_BLOCK_MAX_BYTES of them. Measured
 * (hopper-backward-notes step 34), d = 128: 2-7% faster at 512 to 2k
 * tokens a sequence without a mask; 4 MB pairs (8k), dropout, and sections'
 * pairs ending together (causal at 1k and below) 2-5% slower. */
#define CONVERT_IN_BLOCK_MAX_BYTES ((size_t)1 << 20)
static int converts_in_blocks(const bwd_sm90a_plan *plan, const family_call *call) {
  const fg_forward_args *f = call->forward;
  size_t pair_bytes = (size_t)(f->heads_q / f->heads_kv) * f->seqlen_q * plan->head_dim_padded *
                      sizeof(float);
  return !call->spec->dropout && !plan->walk && section_heads(call->spec, f) == 1 &&
         pair_bytes <= CONVERT_IN_BLOCK_MAX_BYTES;
}

/* The deterministic schedule's key blocks wrap round their query blocks
 * where unmasked, a sequence's key blocks are resident together (one block
 * an SM: the waits go both ways among them) and its 32-bit arithmetic holds
 * (hopper-backward-notes step 19). */
static int wraps(const bwd_sm90a_plan *plan, const fg_spec *spec, const fg_forward_args *f,
                 const family_device *dev) {
  int64_t n_blocks = ((int64_t)f->seqlen_k + plan->block_n - 1) / plan->block_n;
  int64_t m_blocks = ((int64_t)f->seqlen_q + plan->block_m - 1) / plan->block_m;
  return unmasked(spec) && n_blocks <= dev->profile->sm_count &&
         (m_blocks + 1) * n_blocks < ((int64_t)1 << 32);
}

/* The deterministic schedule: asked for, or a fast call's where the plan
 * says it is the faster (fast_det) and the call is unmasked, its key blocks
 * wrapped round or not (hopper-backward-notes steps 60 and 61) */
static int deterministic_schedule(const bwd_sm90a_plan *plan, const family_call *call) {
  const fg_spec *spec = call->spec;
  return call->backward->deterministic ||
         (plan->fast_det && unmasked(spec) && (!spec->dropout || plan->det_dropout));
}

/* Workspace: D (B,Hq,Sq) fp32, then the dQ accumulator (B,Hq,Sq, head dim
 * padded) fp32 (both (Hq,total_q) rows packed; the deterministic schedule
 * has dq_planes of them, one after another), then in the deterministic
 * schedule the counters that order the reductions, u32 (B, Hq, query
 * blocks of the longest sequence, dq_planes), or in the fast one, where its blocks
 * convert dQ, the blocks done per (key/value head, sequence) pair, u32
 * (sequences, Hkv); then, where its blocks walk tiles, the counter of the
 * tiles taken, u32. */
static void workspace_parts(const family_plan *p, const family_call *call, size_t *delta,
                            size_t *accum, size_t *turns, size_t *done, size_t *tile_next,
                            int *planes) {
  const fg_forward_args *f = call->forward;
  const bwd_sm90a_plan *plan = plan_of(p);
  size_t rows = forward_call_rows(call->spec, f);
  size_t m_blocks = (size_t)(f->seqlen_q + plan->block_m - 1) / plan->block_m;
  size_t sequences = (size_t)f->batch + (call->spec->varlen ? 1 : 0);
  int deterministic = deterministic_schedule(plan, call);
  *delta = align_up(rows * sizeof(float));
  *planes = deterministic ? plan->dq_planes : 1;
  *accum = align_up(*planes * rows * plan->head_dim_padded * sizeof(float));
  *turns = deterministic
               ? align_up((size_t)f->batch * f->heads_q * m_blocks * *planes * sizeof(uint32_t))
               : 0;
  /* the schedule is the fast one where there are no turns to take (all
   * sequences empty, say) */
  *done = !*turns && converts_in_blocks(plan, call)
              ? align_up(sequences * f->heads_kv * sizeof(uint32_t))
              : 0;
  *tile_next = !*turns && plan->walk ? align_up(sizeof(uint32_t)) : 0;
}

static size_t workspace(const family_plan *p, const family_call *call,
                        const family_device *dev) {
  (void)dev;
  size_t delta, accum, turns, done, tile_next;
  int planes;
  workspace_parts(p, call, &delta, &accum, &turns, &done, &tile_next, &planes);
  return delta + accum + turns + done + tile_next;
}

/* q, dO (B,Sq,Hq,D), k/v (B,Sk,Hkv,D), o (B,Sq,Hq,D), lse (B,Hq,Sq)
 *   -> dq (B,Sq,Hq,D), dk/dv (B,Sk,Hkv,D); packed: (total_q,Hq,D),
 * (total_k,Hkv,D), lse (Hq,total_q). The dQ accumulator and the counters
 * are cleared first */
static int arguments(const family_plan *p, const fg_spec *spec,
                     const family_call *call, const family_device *dev,
                     uint64_t ws, family_args *out, char *err, size_t err_len) {
  const fg_backward_args *a = call->backward;
  const fg_forward_args *f = call->forward;
  const bwd_sm90a_plan *plan = plan_of(p);
  fg_bwd_tma_params *params = (fg_bwd_tma_params *)out->params;
  memset(out, 0, sizeof *out);
  const sm90a_map_rows m = sm90a_map_rows_of(spec, f);
  size_t delta, accum, turns, done, tile_next;
  int planes;
  workspace_parts(p, call, &delta, &accum, &turns, &done, &tile_next, &planes);
  SET_BACKWARD_PARAMS(*params, spec, call, ws, ws + delta);
  params->dq_turns = turns ? ws + delta + accum : 0;
  params->dq_done = done ? ws + delta + accum : 0;
  params->tile_next = tile_next ? ws + delta + accum + turns + done : 0;
  params->dq_post = done ? 0 : 1;
  /* the deterministic schedule's planes: the accumulator's map takes them
   * as batch rows m.batch.. (packed: 1..), the post kernel sums them */
  params->dq_slice = (int64_t)forward_call_rows(spec, f) * plan->head_dim_padded;
  params->dq_slices = planes;
  params->query_count = call->layout.counts_by_key;
  params->query_index = call->layout.indices_by_key;
  params->block_count = call->layout.counts;
  params->block_index = call->layout.indices;
  params->num_n_blocks = (f->seqlen_k + plan->block_n - 1) / plan->block_n;
  /* packed: at least one, which zeroes dK and dV where no sequence has keys */
  if (spec->varlen && params->num_n_blocks < 1) params->num_n_blocks = 1;
  params->fast_n_blocks = turns ? 0 : params->num_n_blocks;
  params->det_n_blocks = turns ? params->num_n_blocks : 0;
  params->section_heads = turns ? 1 : section_heads(spec, f);
  /* walking tiles: a block an SM (the plan takes all but a block's share
   * of shared memory), at most one a tile */
  int64_t tiles = (int64_t)params->fast_n_blocks * f->heads_kv * params->sequences;
  if (tiles > INT32_MAX)
    return snprintf(err, err_len, "%lld key blocks are more thread blocks than a launch takes",
                    (long long)tiles), -1;
  params->fast_tiles = (uint32_t)tiles;
  params->fast_grid =
      (int)(tile_next && tiles > dev->profile->sm_count ? dev->profile->sm_count : tiles);
  params->wrap = turns && wraps(plan, spec, f, dev);
  out->clear_offset = delta;
  out->clear_bytes = accum + turns + done + tile_next;
  if (sm90a_encode(dev, &params->q_map, "q", spec, &f->q, spec->head_dim, m.batch, m.q,
                   f->heads_q, plan->block_m, err, err_len) ||
      sm90a_encode(dev, &params->k_map, "k", spec, &f->k, spec->head_dim, m.k_units, m.k,
                   f->heads_kv, plan->block_n, err, err_len) ||
      sm90a_encode(dev, &params->v_map, "v", spec, &f->v, spec_head_dim_v(spec), m.k_units,
                   m.k, f->heads_kv, plan->block_n, err, err_len) ||
      sm90a_encode(dev, &params->do_map, "d_o", spec, &a->d_o, spec_head_dim_v(spec), m.batch,
                   m.q, f->heads_q, plan->block_m, err, err_len) ||
      sm90a_encode_accumulator(dev, &params->dq_map, "dq_accum",
                               params->dq_accum, m.batch * planes, f->heads_q, m.q,
                               plan->head_dim_padded, plan->dq_rows, err,
                               err_len) ||
      /* dK and dV by the keys of one consumer warpgroup */
      sm90a_encode(dev, &params->dk_map, "d_k", spec, &a->d_k, spec->head_dim, m.k_units, m.k,
                   f->heads_kv, 64, err, err_len) ||
      sm90a_encode(dev, &params->dv_map, "d_v", spec, &a->d_v, spec_head_dim_v(spec), m.k_units,
                   m.k, f->heads_kv, 64, err, err_len))
    return -1;
  return 0;
}

const kernel_family bwd_sm90a_family = {
    .name = "bwd_sm90a",
    .pass = FG_PASS_BACKWARD,
    .min_cc = 90,
    .max_cc = 90,
    .arch_specific = 1,
    .params = &bwd_tma_params_layout,
    .writes = FAMILY_WRITES_GRADIENTS,
    .tuning_rel_tolerance = 1.f / 32,
    .supports = supports,
    .plan = plan,
    .plan_tiling = plan_tiling,
    .candidates = candidates,
    .tiling_of = tiling_of,
    .registers = registers,
    .describe = describe,
    .tiling_ints = (int)(sizeof(bwd_sm90a_tiling) / sizeof(int)),
    .generate = generate,
    .accepts = accepts,
    .workspace = workspace,
    .arguments = arguments,
};
