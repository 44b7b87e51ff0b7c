/* fwd_sm90a: the Hopper forward, for sm_90 (H100, H200) compiled as sm_90a.
 * One thread block per Br query rows of one head: a producer warpgroup
 * copies Q, K and V with TMA through a ring of shared-memory stages, and
 * CONSUMERS warpgroups of 64 rows each run S = Q·Kᵀ and O += P·V as wgmma
 * (templates/kernel_fwd_sm90a.lua).
 *
 * Planning, per consumer thread and thread block:
 *   registers   setmaxnreg moves them: the producer keeps 24 and the
 *               consumers share the rest (240 each for two, 160 for
 *               three); O (V_COLS / 2 fp32, the value head dim's boxes),
 *               S (Bc / 2) and P (Bc / 4) must
 *               fit the budget, 32 under that, left for addresses, the
 *               softmax and dropout's draws (made 32 keys at a time);
 *   consumers   three (Br 192) where the head dims are one box and the
 *               registers allow, else two (Br 128), one only when sparse
 *               blocks of 64 rows ask for it;
 *   Bc          the largest multiple of 16 up to 256 that fits; with
 *               dropout up to 128 and 16 or a multiple of 32 (its 32-key
 *               stretches); a divisor of the sparse block's columns;
 *   shared mem  Q (Br x 64 columns per box, as many boxes as the wider of Q
 *               and O: O is staged there for its store) and at least two
 *               stages of K and V; more stages (up to SM90A_MAX_STAGES)
 *               while they fit. */
#ifndef FG_FWD_SM90A_H
#define FG_FWD_SM90A_H

#include <stddef.h>

#include "families/family.h"
#include "flashgen.h"
#include "gen/profile.h"

/* Stages of K and V at most. */
#define SM90A_MAX_STAGES 6
/* Registers per consumer thread the accumulators may not take. */
#define SM90A_REGISTER_RESERVE 32

/* The plan's figures, by these names in the template:
 *   block_m                Br = 64 * consumers
 *   block_n                Bc: keys per stage
 *   consumers, stages, threads
 *   turns                  1: the consumers take turns at issuing their wgmmas
 *   head_dim_padded        head dim rounded up to 16: the QK steps
 *   boxes                  64-column boxes per Q and K row (ceil(padded / 64))
 *   head_dim_v_padded      the value head dim rounded up to 16
 *   v_boxes                64-column boxes per V and O row
 *   o_boxes                Q's shared memory in boxes, where O is staged for
 *                          its store: the more of boxes and v_boxes
 *   v_cols                 O's columns, 64 * v_boxes
 *   smem_bytes
 *   producer_registers, consumer_registers    setmaxnreg's figures
 *   accumulator_registers  per consumer thread: O, S and P
 *   register_budget        the budget it was planned under
 *   walk                   1: O is staged in shared memory of its own and
 *                          a thread block may walk several query blocks
 *                          (fwd_sm90a.c: walks); 0: O is staged in Q's,
 *                          a thread block a query block */
#define SM90A_PLAN_FIGURES(X)                                                                \
    X(block_m) X(block_n) X(consumers) X(turns) X(stages) X(threads) X(head_dim_padded)      \
    X(boxes) X(head_dim_v_padded) X(v_boxes) X(o_boxes) X(v_cols) X(smem_bytes)              \
    X(producer_registers) X(consumer_registers)                                               \
    X(accumulator_registers) X(register_budget) X(walk)

typedef struct fwd_sm90a_plan {
#define SM90A_PLAN_FIELD(name) int name;
    SM90A_PLAN_FIGURES(SM90A_PLAN_FIELD)
#undef SM90A_PLAN_FIELD
    char why[1024];
} fwd_sm90a_plan;

/* A tiling named explicitly; all 0 names the derived plan. Text
 * "consumers,block_n,turns". */
typedef struct fwd_sm90a_tiling {
    int consumers, block_n, turns;
} fwd_sm90a_tiling;

/* The derived plan under an accumulator budget (0: the default). Returns 0,
 * or -1 with err. */
int plan_fwd_sm90a(const fg_spec *spec, const fg_profile *profile, int budget,
                   fwd_sm90a_plan *plan, char *err, size_t err_len);
/* A named tiling, checked against registers, shared memory, dropout and
 * sparse blocks. Returns 0, or -1 with err. */
int plan_fwd_sm90a_tiling(const fg_spec *spec, const fg_profile *profile,
                          const fwd_sm90a_tiling *t, fwd_sm90a_plan *plan, char *err,
                          size_t err_len);

extern const kernel_family fwd_sm90a_family;

#endif
