/* bwd_sm90a: the Hopper backward, for sm_90 (H100, H200) compiled as sm_90a.
 * One module of four kernels (templates/kernel_bwd_sm90a.lua): D =
 * rowsum(dO∘O), the main kernel of each schedule (a call launches one), and
 * dQ from its fp32 accumulator; the first and last are bwd_sm80's too.
 *
 * The main kernel: one thread block per key block (Bc = 64 per consumer
 * warpgroup) of one key/value head, K and V resident in shared memory, dK
 * and dV in registers; a producer warpgroup copies Q and dO of each query
 * block (Br = 64 rows, 128 where Q, K, V and dO are one 64-column box wide,
 * 80 where Q and K are two and there is no mask but causal, with dQ
 * computed transposed)
 * of each query head of the group with TMA into a ring
 * of stages; the consumers compute the transposed products (keys along
 * wgmma's M) and add dQ to the accumulator by bulk reductions, in the
 * deterministic schedule in a fixed order of key blocks per query block.
 *
 * Q and K rows are the head dim wide (boxes of 64 columns), V and dO rows
 * the value head dim (v_boxes). Above d = 128, or where dK and dV together
 * pass four boxes (DeepSeek's 192/128), the consumers split the work
 * instead of the keys: both see the same 64 keys, each computes Sᵀ and dPᵀ
 * for half of the step's queries, and they share Pᵀ and dSᵀ through shared
 * memory; each then holds dK, dV and dQ for half of the columns (`split`).
 *
 * It serves fp16 and bf16, head dims 1..256 (each of Q/K and V), causal and
 * window masks, GQA,
 * both schedules (with dropout the fast one), sparsity; the rest runs on bwd_sm80
 * (supports), as do tensors TMA cannot describe (accepts). */
#ifndef FG_BWD_SM90A_H
#define FG_BWD_SM90A_H

#include <stddef.h>

#include "families/family.h"
#include "flashgen.h"
#include "gen/profile.h"

/* The plan's figures, by these names in the template:
 *   block_m                Br: query rows per step (64; 128 where Q, K, V and
 *                          dO are one box wide, without dropout; 80 where
 *                          Q and K are two, causal or without a mask, without
 *                          dropout, sparsity, softcap or score_mod)
 *   block_n                Bc: keys per thread block, 64 * consumers (split: 64)
 *   consumers, stages, threads
 *   head_dim_padded        head dim rounded up to 16: the Sᵀ steps
 *   head_dim_v_padded      the value head dim's: the dPᵀ steps
 *   boxes                  64-column boxes per row of Q, K (ceil(padded / 64))
 *   v_boxes                and of V, dO
 *   split                  1 where the consumers split queries and columns
 *                          (boxes > consumers, or boxes + v_boxes >
 *                          2 * consumers), else 0
 *   s_cols                 queries of a consumer's Sᵀ and dPᵀ: block_m, or
 *                          block_m / consumers split
 *   k_cols                 dK's columns a consumer holds: 64 * boxes, or
 *                          32 * boxes split (then its dQ's too)
 *   v_cols                 dV's: 64 * v_boxes, or 32 * v_boxes split
 *   smem_bytes, fast_smem_bytes    the module's most, and the fast kernel's
 *                          (one set of dQ's staging)
 *   producer_registers, consumer_registers    setmaxnreg's figures (the fast
 *                          schedule's main kernel)
 *   det_producer_registers, det_consumer_registers    the deterministic one's:
 *                          its producer also issues the reductions
 *   accumulator_registers  per consumer thread: dK, dV, Sᵀ, dPᵀ (split: and
 *                          dQ, which outlives Sᵀ and dPᵀ)
 *   dq_rows                a consumer's rows of a step's dQ (64: every row
 *                          of a 64-row step, half of a 128-row one; 80:
 *                          every row, dQ transposed)
 *   dq_sets                dQ's staging sets: 2 at d <= 64 with 64 rows a
 *                          step, which the deterministic kernel's two
 *                          reduction threads take in turn; else 1
 *   det_dropout            1 with dropout where the module has a
 *                          deterministic kernel (its draws fit), else 0
 *   det_ordered            1 where the deterministic kernel is the fast one's
 *                          steps in the deterministic order, a reduction
 *                          thread adding their dQ in turn (not packed, unsplit,
 *                          no dropout, not 32 rows), else 0
 *   dq_planes              the deterministic kernel's dQ accumulators: 2 where
 *                          the consumers split the columns, except under a
 *                          mask (or sparsity or mask_mod) at one stage, each
 *                          added to in turn by every other key block (so a
 *                          query block's turns on each come two steps apart)
 *                          and summed by the post kernel; else 1
 *   fast_det               1 where a fast call without a mask takes the
 *                          deterministic schedule: split columns and one
 *                          stage of Q and dO, where its reductions on the
 *                          producer's threads into two planes beat the fast
 *                          kernel's, wrapped round or not (hopper-backward-
 *                          notes steps 60 and 61); else 0
 *   walk                   1 where the fast kernel's thread blocks walk
 *                          tiles, one an SM (dense, no dropout, unsplit,
 *                          64..128 rows a step, head dims multiples of 8:
 *                          dK and dV stored by boxes, staged where dS and
 *                          dQ are), else 0 */
#define BWD_SM90A_PLAN_FIGURES(X)                                                             \
    X(block_m) X(block_n) X(consumers) X(stages) X(threads) X(head_dim_padded) X(boxes)      \
    X(head_dim_v_padded) X(v_boxes) X(split) X(s_cols) X(k_cols) X(v_cols) X(smem_bytes)    \
    X(producer_registers) X(consumer_registers)                                              \
    X(det_producer_registers) X(det_consumer_registers) X(accumulator_registers) X(dq_sets)  \
    X(fast_smem_bytes) X(dq_rows) X(det_dropout) X(walk) X(det_ordered) X(dq_planes)          \
    X(fast_det)

typedef struct bwd_sm90a_plan {
#define BWD_SM90A_PLAN_FIELD(name) int name;
    BWD_SM90A_PLAN_FIGURES(BWD_SM90A_PLAN_FIELD)
#undef BWD_SM90A_PLAN_FIELD
    int register_budget; /* what the plan was made under (registers per consumer thread) */
    char why[512];
} bwd_sm90a_plan;

/* The tiling, as text "stages,block_m" (block_m 64, 80 or 128; 0 the derived
 * choice): all 0 names the derived plan. */
typedef struct bwd_sm90a_tiling {
    int stages, block_m;
} bwd_sm90a_tiling;

/* The plan under a register budget per consumer thread (0: the derived
 * plan's), or of tiling t (NULL: derived). */
int plan_bwd_sm90a(const fg_spec *spec, const fg_profile *prof, int budget, const bwd_sm90a_tiling *t,
                   bwd_sm90a_plan *plan, char *err, size_t err_len);

extern const kernel_family bwd_sm90a_family;

#endif
